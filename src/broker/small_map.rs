//! A map that is a sorted vector while it is small and a B-tree past that.
//!
//! A `BTreeMap` allocates room for eleven entries with its first: over a
//! kilobyte for a subscription index level or a session's subscription. A
//! broker holds one of each for every device subscribed to its own command
//! topic (`cmd/<id>/#`: the level under `cmd/<id>` has one child; the
//! session has one subscription), so most of them hold one entry, and a
//! few (the level of every device id) hold thousands, where a vector's
//! inserts would move every entry after them. Both are in key order, so a
//! walk reads the same either way.

use std::borrow::Borrow;
use std::collections::BTreeMap;

/// Entries kept in the vector before the map becomes a B-tree: a sorted
/// insert moves at most this many.
const FEW: usize = 16;

#[derive(Debug, Clone)]
pub enum SmallMap<K, V> {
    /// Sorted by key, grown one entry at a time to a power of two: one
    /// entry holds room for one.
    Few(Vec<(K, V)>),
    Many(Box<BTreeMap<K, V>>),
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        SmallMap::Few(Vec::new())
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    /// Holds no memory until its first entry.
    pub const fn new() -> Self {
        SmallMap::Few(Vec::new())
    }

    pub fn len(&self) -> usize {
        match self {
            SmallMap::Few(few) => few.len(),
            SmallMap::Many(many) => many.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self {
            SmallMap::Few(few) => find(few, key).ok().map(|i| &few[i].1),
            SmallMap::Many(many) => many.get(key),
        }
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self {
            SmallMap::Few(few) => find(few, key).ok().map(|i| &mut few[i].1),
            SmallMap::Many(many) => many.get_mut(key),
        }
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Sets `key` to `value`; what it held before, if anything.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self {
            SmallMap::Few(few) => match find(few, key.borrow()) {
                Ok(i) => Some(std::mem::replace(&mut few[i].1, value)),
                Err(i) => {
                    self.insert_new(i, key, value);
                    None
                }
            },
            SmallMap::Many(many) => many.insert(key, value),
        }
    }

    /// The value of `key`, made by `make` (its key by `own`) when there is
    /// none: the key is made only when it is new.
    pub fn get_or_insert_with<Q>(
        &mut self,
        key: &Q,
        own: impl FnOnce() -> K,
        make: impl FnOnce() -> V,
    ) -> &mut V
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        // A new key in the B-tree is searched for twice, not three times:
        // once to learn it is new, once by `entry`, which takes the owned
        // key (made only when new). A restart's subscriptions are nearly
        // all new keys at the level of the device ids.
        if matches!(self, SmallMap::Many(many) if !many.contains_key(key)) {
            let SmallMap::Many(many) = self else {
                unreachable!("matched above");
            };
            return many.entry(own()).or_insert_with(make);
        }
        // Looked up again after an insert in the vector: a few entries.
        if !self.contains_key(key) {
            self.insert(own(), make());
        }
        self.get_mut(key).expect("present or inserted above")
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self {
            SmallMap::Few(few) => {
                let i = find(few, key).ok()?;
                let (_, value) = few.remove(i);
                if few.is_empty() {
                    *few = Vec::new();
                }
                Some(value)
            }
            SmallMap::Many(many) => many.remove(key),
        }
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        let (few, many) = match self {
            SmallMap::Few(few) => (Some(few.iter().map(|(k, v)| (k, v))), None),
            SmallMap::Many(many) => (None, Some(many.iter())),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    /// Values in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Values in key order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        let (few, many) = match self {
            SmallMap::Few(few) => (Some(few.iter_mut().map(|(_, v)| v)), None),
            SmallMap::Many(many) => (None, Some(many.values_mut())),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    /// A new key at `i` of the vector, or in the B-tree once the vector
    /// holds [`FEW`].
    fn insert_new(&mut self, i: usize, key: K, value: V) {
        let SmallMap::Few(few) = self else {
            unreachable!("called on the vector only");
        };
        if few.len() < FEW {
            reserve_one(few);
            few.insert(i, (key, value));
            return;
        }
        let mut many: BTreeMap<K, V> = std::mem::take(few).into_iter().collect();
        many.insert(key, value);
        *self = SmallMap::Many(Box::new(many));
    }
}

/// Room for one more in `list`: one at its first, then doubling. A first
/// push would make room for four, and most lists this broker keeps per
/// client hold one.
pub fn reserve_one<T>(list: &mut Vec<T>) {
    if list.len() == list.capacity() {
        list.reserve_exact(list.len().max(1));
    }
}

fn find<K: Borrow<Q>, Q: Ord + ?Sized, V>(few: &[(K, V)], key: &Q) -> Result<usize, usize> {
    few.binary_search_by(|(k, _)| k.borrow().cmp(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The map answers as a `BTreeMap` would, through its change from a
    /// vector to a B-tree: the same values, the same order.
    #[test]
    fn it_answers_as_a_btree_map_would() {
        let mut small: SmallMap<String, u32> = SmallMap::new();
        let mut model = BTreeMap::new();
        // A fixed scramble of 0..64, inserted, replaced and removed.
        let keys: Vec<String> = (0..64u32).map(|i| format!("k{}", (i * 37) % 64)).collect();
        for (n, key) in keys.iter().enumerate() {
            assert_eq!(
                small.insert(key.clone(), n as u32),
                model.insert(key.clone(), n as u32)
            );
            assert_eq!(small.len(), model.len());
            assert!(small.iter().eq(model.iter()), "after inserting {key}");
        }
        assert!(matches!(small, SmallMap::Many(_)));
        for key in keys.iter().step_by(3) {
            assert_eq!(small.insert(key.clone(), 0), model.insert(key.clone(), 0));
            assert_eq!(small.remove(key.as_str()), model.remove(key.as_str()));
            assert_eq!(small.remove(key.as_str()), None);
        }
        assert!(small.iter().eq(model.iter()));
        assert!(small.values().eq(model.values()));
        for key in &keys {
            assert_eq!(small.get(key.as_str()), model.get(key.as_str()));
            assert_eq!(
                small.contains_key(key.as_str()),
                model.contains_key(key.as_str())
            );
        }
    }

    /// One entry holds room for one, and a map emptied holds nothing.
    #[test]
    fn one_entry_holds_room_for_one() {
        let mut small: SmallMap<Box<str>, u64> = SmallMap::new();
        *small.get_or_insert_with("#", || "#".into(), || 0) += 1;
        *small.get_or_insert_with("#", || unreachable!("known"), || 0) += 1;
        let SmallMap::Few(few) = &small else {
            panic!("one entry is a vector");
        };
        assert_eq!(few.capacity(), 1);
        assert_eq!(small.get("#"), Some(&2));
        assert_eq!(small.remove("#"), Some(2));
        let SmallMap::Few(few) = &small else {
            panic!("still a vector");
        };
        assert_eq!(few.capacity(), 0);
    }

    /// Past [`FEW`] entries, `get_or_insert_with` goes on in the B-tree.
    #[test]
    fn get_or_insert_with_grows_into_a_btree() {
        let mut small: SmallMap<Box<str>, usize> = SmallMap::new();
        for i in (0..40).rev() {
            let key = format!("level-{i:02}");
            *small.get_or_insert_with(key.as_str(), || key.as_str().into(), || i) += 1;
        }
        assert!(matches!(small, SmallMap::Many(_)));
        let values: Vec<usize> = small.values().copied().collect();
        assert_eq!(values, (1..41).collect::<Vec<_>>());
        for v in small.values_mut() {
            *v = 0;
        }
        assert!(small.values().all(|v| *v == 0));
    }
}
