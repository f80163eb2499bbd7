//! A latest channel in memory: one value per topic, and a marker for each
//! deletion so a resuming consumer learns what went. The retained store is the same structure without markers.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use saguin_format::model::{Record, UnixNanos};

use super::positions::PositionBook;
use super::{read, write, Shared, Version};
use crate::storage::contract::{
    check_record, forgets_deletion, LatestStore, OffsetStore, Position, Reader, Removed, Result,
    StorageError, FIRST_OFFSET, RETAINED_STORE_NAME,
};
use crate::topic::{filter_matches, literal_prefix};

/// A value in the topic index, ordered and looked up by its record's own
/// topic: the index keeps no copy of the topic beside the record's.
#[derive(Clone, Debug)]
struct ByTopic(Arc<Record>);

impl Borrow<str> for ByTopic {
    fn borrow(&self) -> &str {
        &self.0.topic
    }
}

impl PartialEq for ByTopic {
    fn eq(&self, other: &Self) -> bool {
        self.0.topic == other.0.topic
    }
}

impl Eq for ByTopic {}

impl PartialOrd for ByTopic {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByTopic {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.topic.cmp(&other.0.topic)
    }
}

/// Each value and marker is one shared record, indexed twice: by topic and
/// by offset. (Keyed by copies of its topic, a retained message of 64 bytes
/// held its topic three times.)
#[derive(Debug)]
struct LatestState {
    /// The current value of each topic; an empty payload is a deletion
    /// marker. Kept in topic order, so a filter reads only the topics under
    /// its literal prefix.
    values: BTreeSet<ByTopic>,
    /// Every value and marker by its offset, for reads in offset order.
    by_offset: BTreeMap<u64, Arc<Record>>,
    next: u64,
    floor: u64,
    /// Sum of `accounted_size` over values and markers.
    bytes: u64,
    /// Each deletion marker's offset and timestamp, oldest first: what a
    /// retention sweep walks, without passing over the values between.
    deletions: BTreeMap<u64, UnixNanos>,
}

impl LatestState {
    /// Up to `max` changes from offset `since` on whose topic matches
    /// `filter`, in offset order, a deletion as its marker.
    fn changes_since(&self, filter: &str, since: u64, max: usize) -> Vec<Record> {
        self.by_offset
            .range(since..)
            .map(|(_, r)| r)
            .filter(|r| filter_matches(filter, &r.topic))
            .take(max)
            .map(|r| (**r).clone())
            .collect()
    }
}

#[derive(Debug)]
pub struct MemoryLatest {
    name: String,
    shared: Arc<Shared>,
    /// Deletions leave a marker (a latest channel) or nothing (the retained
    /// store, which no consumer resumes on).
    keep_markers: bool,
    state: RwLock<LatestState>,
    positions: PositionBook,
    /// Its values, markers, counters and positions' changes.
    version: Version,
}

/// A latest channel's state copied under its lock for a snapshot.
#[derive(Clone, Debug)]
pub struct LatestCopy {
    /// The store's version when it was copied.
    pub version: u64,
    pub name: String,
    pub next: u64,
    pub floor: u64,
    pub bytes: u64,
    /// Values and deletion markers in offset order.
    pub records: Vec<Arc<Record>>,
    pub positions: Vec<Position>,
}

impl MemoryLatest {
    pub(crate) fn new(name: &str, shared: Arc<Shared>) -> MemoryLatest {
        MemoryLatest {
            name: name.to_owned(),
            shared,
            keep_markers: name != RETAINED_STORE_NAME,
            state: RwLock::new(LatestState {
                values: BTreeSet::new(),
                by_offset: BTreeMap::new(),
                next: FIRST_OFFSET,
                floor: FIRST_OFFSET,
                bytes: 0,
                deletions: BTreeMap::new(),
            }),
            positions: PositionBook::default(),
            version: Version::default(),
        }
    }

    /// A store rebuilt from validated stored state (one record per topic,
    /// offsets below `next`, markers at or above `floor`), its bytes
    /// charged to the provider.
    pub(crate) fn restore(
        name: &str,
        shared: Arc<Shared>,
        next: u64,
        floor: u64,
        records: Vec<Record>,
        positions: Vec<Position>,
    ) -> Result<MemoryLatest> {
        let store = MemoryLatest::new(name, shared);
        store.fill(next, floor, records)?;
        Ok(MemoryLatest {
            positions: PositionBook::restored(positions),
            ..store
        })
    }

    /// Fills an empty store with validated stored values and charges their
    /// bytes to the provider. Each index is built whole from its values
    /// sorted, not a value at a time: a restart's million retained
    /// messages come in offset order and their topics in none, and one
    /// insertion each into the topic index was most of the store's load.
    pub(crate) fn fill(&self, next: u64, floor: u64, records: Vec<Record>) -> Result<()> {
        let mut st = write(&self.state);
        if !st.values.is_empty() {
            return Err(StorageError::Invalid {
                what: format!("channel {}", self.name),
                detail: "loaded into a store that already holds values".into(),
            });
        }
        let mut by_topic = Vec::with_capacity(records.len());
        let mut by_offset = Vec::with_capacity(records.len());
        let mut deletions = BTreeMap::new();
        let mut bytes = 0;
        for r in records {
            bytes += r.accounted_size();
            if r.payload.is_empty() {
                deletions.insert(r.offset, r.timestamp);
            }
            let shared = Arc::new(r);
            by_offset.push((shared.offset, shared.clone()));
            by_topic.push(ByTopic(shared));
        }
        by_topic.sort_unstable();
        by_offset.sort_unstable_by_key(|(offset, _)| *offset);
        let second = by_topic
            .windows(2)
            .find(|pair| pair[0] == pair[1])
            .map(|pair| &pair[1].0)
            .or_else(|| {
                by_offset
                    .windows(2)
                    .find(|pair| pair[0].0 == pair[1].0)
                    .map(|pair| &pair[1].1)
            });
        if let Some(r) = second {
            return Err(StorageError::Corrupt {
                what: format!("channel {}", self.name),
                detail: format!(
                    "topic {:?} at offset {} holds a second value",
                    r.topic, r.offset
                ),
            });
        }
        // Collecting sorted input builds each tree in one pass.
        st.values = by_topic.into_iter().collect();
        st.by_offset = by_offset.into_iter().collect();
        st.deletions = deletions;
        st.bytes = bytes;
        st.next = next;
        st.floor = floor;
        self.shared.budget.charge_relief(bytes);
        Ok(())
    }

    /// How many times what its file holds has changed.
    pub fn version(&self) -> u64 {
        self.version.get()
    }

    /// Counts a change made elsewhere to what its file holds (a held
    /// publish for it).
    pub(crate) fn touch(&self) {
        self.version.bump(&self.shared);
    }

    pub fn copy_state(&self) -> LatestCopy {
        let version = self.version.get();
        let st = read(&self.state);
        let records = st.by_offset.values().cloned().collect();
        LatestCopy {
            version,
            name: self.name.clone(),
            next: st.next,
            floor: st.floor,
            bytes: st.bytes,
            records,
            positions: self.positions.copy(),
        }
    }

    /// Replaces (or, with an empty payload, deletes) a topic's value.
    /// `relief` charges the provider rather than asking it (a held
    /// publish's release).
    pub(crate) fn set_inner(&self, mut record: Record, relief: bool) -> Result<Option<Record>> {
        self.shared.check_open()?;
        check_record(&self.name, &record, false)?;
        let mut st = write(&self.state);
        let old = st.values.get(record.topic.as_str()).map(|v| v.0.clone());
        let deleting = record.payload.is_empty();
        if deleting && old.as_ref().is_none_or(|o| o.payload.is_empty()) {
            // Nothing to delete: no offset is taken.
            return Ok(None);
        }
        let old_size = old.as_ref().map_or(0, |o| o.accounted_size());
        let new_size = if deleting && !self.keep_markers {
            0
        } else {
            record.accounted_size()
        };
        // The value being replaced is already in hand, so only the
        // difference is charged (or given back).
        if new_size > old_size {
            if relief {
                self.shared.budget.charge_relief(new_size - old_size);
            } else {
                self.shared.budget.charge_publish(new_size - old_size)?;
            }
        } else {
            self.shared.budget.give_back(old_size - new_size);
        }
        st.bytes = st.bytes - old_size + new_size;
        if let Some(o) = &old {
            st.by_offset.remove(&o.offset);
            st.deletions.remove(&o.offset);
        }
        record.offset = st.next;
        st.next += 1;
        self.version.bump(&self.shared);
        if deleting && !self.keep_markers {
            st.values.remove(record.topic.as_str());
            // Nothing is left at the offset the deletion took, so the floor
            // may pass it: reads never see it.
            return Ok(Some(record));
        }
        if deleting {
            st.deletions.insert(record.offset, record.timestamp);
        }
        let shared = Arc::new(record);
        st.by_offset.insert(shared.offset, shared.clone());
        // `replace`, not `insert`: an equal key (the old value) is kept by
        // `insert`.
        st.values.replace(ByTopic(shared.clone()));
        drop(st);
        Ok(Some(Arc::unwrap_or_clone(shared)))
    }

    /// Forgets every marker below `bound` and raises the floor to it (never
    /// lowering it), under the lock already held.
    fn forget_below(&self, st: &mut LatestState, bound: u64) -> Removed {
        let bound = bound.min(st.next);
        let mut removed = Removed::default();
        let stale: Vec<u64> = st.deletions.range(..bound).map(|(o, _)| *o).collect();
        for offset in stale {
            st.deletions.remove(&offset);
            let Some(marker) = st.by_offset.remove(&offset) else {
                continue;
            };
            if st.values.remove(marker.topic.as_str()) {
                let size = marker.accounted_size();
                st.bytes -= size;
                removed.records += 1;
                removed.bytes += size;
            }
        }
        if removed.records > 0 || bound > st.floor {
            self.version.bump(&self.shared);
        }
        st.floor = st.floor.max(bound);
        self.shared.budget.give_back(removed.bytes);
        removed
    }

    fn check_since(&self, st: &LatestState, since: u64) -> Result<()> {
        if since < st.floor {
            return Err(StorageError::BelowFloor {
                channel: self.name.clone(),
                offset: since,
                floor: st.floor,
            });
        }
        if since > st.next {
            return Err(StorageError::PastNext {
                channel: self.name.clone(),
                offset: since,
                next: st.next,
            });
        }
        Ok(())
    }
}

impl MemoryLatest {
    /// The current values (deletions left out) whose topic `keep` accepts,
    /// ordered by offset.
    fn live(&self, keep: impl Fn(&str) -> bool) -> Vec<Record> {
        let st = read(&self.state);
        st.by_offset
            .values()
            .filter(|r| keep(&r.topic) && !r.payload.is_empty())
            .map(|r| (**r).clone())
            .collect()
    }
}

impl LatestStore for MemoryLatest {
    fn set(&self, record: Record) -> Result<Record> {
        let topic = record.topic.clone();
        match self.set_inner(record, false)? {
            Some(r) => Ok(r),
            // An empty payload for a topic with no value: nothing changed.
            None => Ok(Record {
                offset: 0,
                ..Record::new(topic, bytes::Bytes::new())
            }),
        }
    }

    fn get(&self, topic: &str) -> Result<Option<Record>> {
        let st = read(&self.state);
        Ok(st
            .values
            .get(topic)
            .filter(|v| !v.0.payload.is_empty())
            .map(|v| (*v.0).clone()))
    }

    fn delete(&self, topic: &str) -> Result<Option<Record>> {
        self.set_inner(Record::new(topic, bytes::Bytes::new()), false)
    }

    fn match_filter(&self, filter: &str) -> Result<Vec<Record>> {
        // The levels before the first wildcard name one topic (`#` matches
        // it too) and the topics under it: those are read, not every
        // sibling the bare prefix begins (`devices/site-7` begins
        // `devices/site-70`).
        let prefix = literal_prefix(filter);
        let st = read(&self.state);
        let under = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        let mut found: Vec<&Arc<Record>> = Vec::new();
        if !prefix.is_empty() {
            found.extend(st.values.get(prefix).map(|v| &v.0));
        }
        if prefix != filter {
            found.extend(
                st.values
                    .range::<str, _>((
                        std::ops::Bound::Included(under.as_str()),
                        std::ops::Bound::Unbounded,
                    ))
                    .map(|v| &v.0)
                    .take_while(|r| r.topic.starts_with(&under)),
            );
        }
        let mut out: Vec<Record> = found
            .into_iter()
            .filter(|r| !r.payload.is_empty() && filter_matches(filter, &r.topic))
            .map(|r| (**r).clone())
            .collect();
        out.sort_by_key(|r| r.offset);
        Ok(out)
    }

    fn values(&self) -> Result<Vec<Record>> {
        Ok(self.live(|_| true))
    }

    fn values_shared(&self) -> Result<Vec<Arc<Record>>> {
        let st = read(&self.state);
        Ok(st
            .by_offset
            .values()
            .filter(|r| !r.payload.is_empty())
            .cloned()
            .collect())
    }

    fn match_with_deletions(&self, filter: &str, since: u64) -> Result<Vec<Record>> {
        self.match_with_deletions_n(filter, since, usize::MAX)
    }

    fn match_with_deletions_n(&self, filter: &str, since: u64, max: usize) -> Result<Vec<Record>> {
        let st = read(&self.state);
        self.check_since(&st, since)?;
        Ok(st.changes_since(filter, since, max))
    }

    fn rows_from_n(&self, filter: &str, since: u64, max: usize) -> Result<(u64, Vec<Record>)> {
        let st = read(&self.state);
        Ok((st.floor, st.changes_since(filter, since, max)))
    }

    fn trim(&self, before: u64) -> Result<Removed> {
        self.shared.check_open()?;
        let mut st = write(&self.state);
        Ok(self.forget_below(&mut st, before))
    }

    fn deletions(&self) -> u64 {
        read(&self.state).deletions.len() as u64
    }

    fn forget_deletions(&self, keep: Option<u64>, cutoff: Option<UnixNanos>) -> Result<Removed> {
        self.shared.check_open()?;
        let mut st = write(&self.state);
        let mut held = st.deletions.len() as u64;
        let mut bound = None;
        for (&offset, &timestamp) in &st.deletions {
            if !forgets_deletion(held, keep, timestamp, cutoff) {
                break;
            }
            held -= 1;
            bound = Some(offset + 1);
        }
        Ok(match bound {
            Some(bound) => self.forget_below(&mut st, bound),
            None => Removed::default(),
        })
    }
}

impl OffsetStore for MemoryLatest {
    fn name(&self) -> &str {
        &self.name
    }

    fn next(&self) -> u64 {
        read(&self.state).next
    }

    fn floor(&self) -> u64 {
        read(&self.state).floor
    }

    fn bytes(&self) -> u64 {
        read(&self.state).bytes
    }

    fn record_count(&self) -> u64 {
        let st = read(&self.state);
        st.values.len() as u64 - st.deletions.len() as u64
    }

    fn position(&self, reader: &Reader) -> Result<Option<Position>> {
        self.positions.get(reader)
    }

    fn save_position(&self, position: Position) -> Result<()> {
        self.positions.save(
            &self.shared,
            &self.version,
            &self.name,
            position,
            self.next(),
        )
    }

    fn drop_position(&self, reader: &Reader) -> Result<bool> {
        self.positions
            .drop_reader(&self.shared, &self.version, reader)
    }

    fn positions(&self) -> Result<Vec<Position>> {
        self.positions.all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::{MemoryConfig, MemoryProvider};

    fn retained_store() -> MemoryLatest {
        let provider = MemoryProvider::new(MemoryConfig {
            name: "mem".into(),
            max_bytes: None,
            reserve: 0,
        })
        .unwrap();
        MemoryLatest::new(RETAINED_STORE_NAME, provider.shared().clone())
    }

    /// Each value is one record, its topic held once: both indexes share
    /// the record rather than keeping copies of its topic.
    #[test]
    fn a_value_and_its_topic_are_held_once() {
        let store = retained_store();
        for (topic, payload) in [("a/1", "x"), ("a/2", "y"), ("a/1", "z")] {
            store.set(Record::new(topic, payload)).unwrap();
        }
        let st = read(&store.state);
        assert_eq!(st.values.len(), 2);
        assert_eq!(st.by_offset.len(), 2);
        for (offset, record) in &st.by_offset {
            assert_eq!(record.offset, *offset);
            let by_topic = &st.values.get(record.topic.as_str()).unwrap().0;
            assert!(Arc::ptr_eq(by_topic, record));
            // The two indexes and nothing else.
            assert_eq!(Arc::strong_count(record), 2);
        }
        assert_eq!(store.get("a/1").unwrap().unwrap().payload, "z");
        drop(st);

        // A deletion of the retained store leaves nothing behind.
        store.delete("a/1").unwrap();
        let st = read(&store.state);
        assert_eq!(st.values.len(), 1);
        assert_eq!(st.by_offset.len(), 1);
        assert_eq!(st.bytes, Record::new("a/2", "y").accounted_size());
    }

    fn at(offset: u64, topic: &str, payload: &'static str) -> Record {
        Record {
            offset,
            ..Record::new(topic, payload)
        }
    }

    #[test]
    fn a_fill_builds_both_indexes_and_refuses_a_second_value() {
        let provider = MemoryProvider::new(MemoryConfig {
            name: "mem".into(),
            max_bytes: None,
            reserve: 0,
        })
        .unwrap();
        let latest = || MemoryLatest::new("devices", provider.shared().clone());
        // Offsets ascending, topics in no order, one deletion marker.
        let store = latest();
        let records = vec![at(3, "d/9", "a"), at(4, "d/1", "b"), at(6, "d/5", "")];
        let bytes: u64 = records.iter().map(Record::accounted_size).sum();
        store.fill(7, 2, records).unwrap();
        assert_eq!(store.get("d/1").unwrap().unwrap().offset, 4);
        assert_eq!(store.get("d/5").unwrap(), None, "a marker is no value");
        assert_eq!(store.deletions(), 1);
        assert_eq!(OffsetStore::bytes(&store), bytes);
        assert_eq!((store.next(), store.floor()), (7, 2));
        let order: Vec<u64> = store
            .copy_state()
            .records
            .iter()
            .map(|r| r.offset)
            .collect();
        assert_eq!(order, [3, 4, 6]);
        let topics: Vec<String> = store
            .match_filter("d/#")
            .unwrap()
            .into_iter()
            .map(|r| r.topic)
            .collect();
        assert_eq!(topics, ["d/9", "d/1"], "values, in offset order");

        for records in [
            vec![at(1, "d/1", "a"), at(2, "d/2", "b"), at(3, "d/1", "c")],
            vec![at(1, "d/1", "a"), at(1, "d/2", "b")],
        ] {
            let store = latest();
            let e = store.fill(4, 1, records).unwrap_err();
            assert!(
                matches!(&e, StorageError::Corrupt { detail, .. } if detail.contains("holds a second value")),
                "{e}"
            );
            assert_eq!(store.record_count(), 0, "nothing of a refused fill is kept");
        }
    }
}
