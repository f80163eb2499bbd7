//! A latest channel in memory: one value per topic, and a marker for each
//! deletion so a resuming consumer learns what went. The retained store is
//! the same structure without markers, and without the index by offset
//! that only a channel's readers need.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use saguin_format::model::{Record, UnixNanos};

use super::positions::PositionBook;
use super::{read, write, Shared, Version};
use crate::storage::contract::{
    check_record, forgets_deletion, LatestStore, OffsetStore, Position, Reader, RecordParts,
    Removed, Result, ServedValue, StorageError, FIRST_OFFSET, RETAINED_STORE_NAME,
};
use crate::storage::kept::Kept;
use crate::topic::{filter_matches, literal_prefix};

/// A latest store's values as a load makes them, one record at a time:
/// each record is let go once its value is made, so a start does not hold
/// the records decoded from a file beside the store built from them.
#[derive(Debug, Default)]
pub(crate) struct LatestLoad {
    values: Vec<ByTopic>,
    deletions: BTreeMap<u64, UnixNanos>,
    /// Sum of `accounted_size` over values and markers.
    bytes: u64,
}

impl LatestLoad {
    fn with_capacity(records: usize) -> LatestLoad {
        LatestLoad {
            values: Vec::with_capacity(records),
            ..LatestLoad::default()
        }
    }

    /// A channel's values, made compact as its file was decoded, in the
    /// file's order.
    pub(crate) fn of_kept(values: Vec<Kept>) -> LatestLoad {
        let mut load = LatestLoad::with_capacity(values.len());
        for kept in values {
            load.push_kept(kept);
        }
        load
    }

    /// How many values and markers it holds.
    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }

    /// Room for `more` values, known before they are decoded.
    pub(crate) fn reserve(&mut self, more: usize) {
        self.values.reserve_exact(more);
    }

    /// A retained value, numbered after those before it: the retained
    /// store's offsets only order its values, so they are numbered afresh
    /// in the file's order (a file may come from another writer, or an
    /// older one).
    pub(crate) fn push_retained(&mut self, record: Record) {
        let offset = self.values.len() as u64 + 1;
        self.push(Record { offset, ..record });
    }

    fn push(&mut self, record: Record) {
        self.push_kept(Kept::new(&record));
    }

    fn push_kept(&mut self, kept: Kept) {
        self.bytes += kept.accounted_size();
        if kept.is_marker() {
            self.deletions.insert(kept.offset, kept.timestamp);
        }
        self.values.push(ByTopic(kept));
    }
}

/// A value in the topic index, ordered and looked up by its topic.
#[derive(Clone, Debug)]
struct ByTopic(Kept);

impl Borrow<str> for ByTopic {
    fn borrow(&self) -> &str {
        self.0.topic()
    }
}

impl PartialEq for ByTopic {
    fn eq(&self, other: &Self) -> bool {
        self.0.topic() == other.0.topic()
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
        self.0.topic().cmp(other.0.topic())
    }
}

/// Values in offset order: sorted here unless they already are (a copy of
/// a channel is taken in that order; one of the retained store is not).
/// Each offset is read once, beside its handle: a sort that read it
/// through the handle at every comparison went to memory for most of them.
fn in_offset_order<'a>(values: impl Iterator<Item = &'a Kept>) -> Vec<&'a Kept> {
    let mut values: Vec<(u64, &Kept)> = values.map(|v| (v.offset, v)).collect();
    if !values.is_sorted_by_key(|(offset, _)| *offset) {
        values.sort_unstable_by_key(|(offset, _)| *offset);
    }
    values.into_iter().map(|(_, v)| v).collect()
}

/// Each value and marker is one shared [`Kept`], in the topic index and, in
/// a channel, in the index by offset.
#[derive(Debug)]
struct LatestState {
    /// The current value of each topic; an empty payload is a deletion
    /// marker. Kept in topic order, so a filter reads only the topics under
    /// its literal prefix.
    values: BTreeSet<ByTopic>,
    /// A channel's values and markers by offset, for its readers' changes
    /// in offset order. `None` in the retained store: no consumer reads
    /// its changes, and its few reads in offset order (a snapshot's, a
    /// restart's, a subscription's) sort what they read instead of every
    /// value carrying a second index entry.
    by_offset: Option<BTreeMap<u64, Kept>>,
    next: u64,
    floor: u64,
    /// Sum of `accounted_size` over values and markers.
    bytes: u64,
    /// Each deletion marker's offset and timestamp, oldest first: what a
    /// retention sweep walks, without passing over the values between.
    deletions: BTreeMap<u64, UnixNanos>,
}

impl LatestState {
    /// Every value and marker in offset order.
    fn in_offset_order(&self) -> Vec<&Kept> {
        match &self.by_offset {
            Some(by_offset) => by_offset.values().collect(),
            None => in_offset_order(self.values.iter().map(|v| &v.0)),
        }
    }

    /// Up to `max` changes from offset `since` on whose topic matches
    /// `filter`, in offset order, a deletion as its marker.
    fn changes_since(&self, filter: &str, since: u64, max: usize) -> Vec<Record> {
        let matches = |k: &&Kept| filter_matches(filter, k.topic());
        match &self.by_offset {
            Some(by_offset) => by_offset
                .range(since..)
                .map(|(_, k)| k)
                .filter(matches)
                .take(max)
                .map(|k| k.record_sharing())
                .collect(),
            None => in_offset_order(
                self.values
                    .iter()
                    .map(|v| &v.0)
                    .filter(|k| k.offset >= since)
                    .filter(matches),
            )
            .into_iter()
            .take(max)
            .map(|k| k.record_sharing())
            .collect(),
        }
    }
}

/// A latest store's values and markers as a copy holds them: shared
/// handles on what the store keeps, so a copy costs a walk of pointers
/// where it is taken, and the records are rebuilt, in offset order, where
/// they are written.
#[derive(Clone, Debug, Default)]
pub struct LatestRecords(Vec<Kept>);

impl LatestRecords {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each record's parts, lent, in offset order.
    pub fn parts(&self) -> impl Iterator<Item = RecordParts<'_>> {
        in_offset_order(self.0.iter())
            .into_iter()
            .map(|k| k.parts())
    }

    /// Every record, in offset order.
    pub fn to_vec(&self) -> Vec<Record> {
        in_offset_order(self.0.iter())
            .into_iter()
            .map(|k| k.record())
            .collect()
    }

    /// Each record's parts, lent, in topic order: how the retained store's
    /// file lists them, so that a restart finds them in the order its
    /// topic index keeps (FORMAT.md §2.6). A copy of the retained store is
    /// taken in that order and is not sorted again.
    pub fn parts_by_topic(&self) -> impl Iterator<Item = RecordParts<'_>> {
        let mut values: Vec<&Kept> = self.0.iter().collect();
        if !values.is_sorted_by(|a, b| a.topic() <= b.topic()) {
            values.sort_unstable_by(|a, b| a.topic().cmp(b.topic()));
        }
        values.into_iter().map(|k| k.parts())
    }
}

impl From<Vec<Record>> for LatestRecords {
    fn from(records: Vec<Record>) -> Self {
        LatestRecords(super::kept::kept_all(records))
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
    /// Values and deletion markers, read in offset order.
    pub records: LatestRecords,
    pub positions: Vec<Position>,
}

impl MemoryLatest {
    pub(crate) fn new(name: &str, shared: Arc<Shared>) -> MemoryLatest {
        let keep_markers = name != RETAINED_STORE_NAME;
        MemoryLatest {
            name: name.to_owned(),
            shared,
            keep_markers,
            state: RwLock::new(LatestState {
                values: BTreeSet::new(),
                by_offset: keep_markers.then(BTreeMap::new),
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
        values: LatestLoad,
        positions: Vec<Position>,
    ) -> Result<MemoryLatest> {
        let store = MemoryLatest::new(name, shared);
        store.fill_loaded(next, floor, values)?;
        Ok(MemoryLatest {
            positions: PositionBook::restored(positions),
            ..store
        })
    }

    /// [`MemoryLatest::fill_loaded`] with the records whole.
    #[cfg(test)]
    pub(crate) fn fill(&self, next: u64, floor: u64, records: Vec<Record>) -> Result<()> {
        let mut load = LatestLoad::with_capacity(records.len());
        for record in records {
            load.push(record);
        }
        self.fill_loaded(next, floor, load)
    }

    /// Fills an empty store with validated stored values, made compact as
    /// they were decoded, and charges their bytes to the provider. Each
    /// index is built whole from its values sorted, not a value at a time:
    /// one insertion each into the topic index was most of a restart of a
    /// million retained messages. The retained store's file lists them in
    /// topic order (FORMAT.md §2.6), so its sort only finds them in order;
    /// a file written by offset, as a channel's and older retained files
    /// are, is sorted here.
    pub(crate) fn fill_loaded(&self, next: u64, floor: u64, load: LatestLoad) -> Result<()> {
        let mut st = write(&self.state);
        if !st.values.is_empty() {
            return Err(StorageError::Invalid {
                what: format!("channel {}", self.name),
                detail: "loaded into a store that already holds values".into(),
            });
        }
        let LatestLoad {
            values: mut by_topic,
            deletions,
            bytes,
        } = load;
        // Sorted by offset as well as by topic: a store without the index
        // by offset refuses two values at one offset all the same.
        let by_offset: Vec<Kept> = in_offset_order(by_topic.iter().map(|v| &v.0))
            .into_iter()
            .cloned()
            .collect();
        by_topic.sort_unstable();
        let second = by_topic
            .windows(2)
            .find(|pair| pair[0] == pair[1])
            .map(|pair| &pair[1].0)
            .or_else(|| {
                by_offset
                    .windows(2)
                    .find(|pair| pair[0].offset == pair[1].offset)
                    .map(|pair| &pair[1])
            });
        if let Some(k) = second {
            return Err(StorageError::Corrupt {
                what: format!("channel {}", self.name),
                detail: format!(
                    "topic {:?} at offset {} holds a second value",
                    k.topic(),
                    k.offset
                ),
            });
        }
        // Collecting sorted input builds each tree in one pass.
        if let Some(index) = st.by_offset.as_mut() {
            *index = by_offset.into_iter().map(|k| (k.offset, k)).collect();
        }
        st.values = by_topic.into_iter().collect();
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

    /// Its state as a snapshot writes it: handles on its values, in offset
    /// order where the store has that order at hand (a channel), put in it
    /// by the writer otherwise (the retained store: not on the broker's
    /// loop, where a copy is taken).
    pub fn copy_state(&self) -> LatestCopy {
        let version = self.version.get();
        let st = read(&self.state);
        let records = match &st.by_offset {
            Some(by_offset) => by_offset.values().cloned().collect(),
            None => st.values.iter().map(|v| v.0.clone()).collect(),
        };
        LatestCopy {
            version,
            name: self.name.clone(),
            next: st.next,
            floor: st.floor,
            bytes: st.bytes,
            records: LatestRecords(records),
            positions: self.positions.copy(),
        }
    }

    /// Replaces (or, with an empty payload, deletes) a topic's value.
    /// `relief` charges the provider rather than asking it (a held
    /// publish's release).
    pub(crate) fn set_inner(&self, record: Record, relief: bool) -> Result<Option<Record>> {
        Ok(self.set_kept(record, relief)?.map(|(record, _)| record))
    }

    /// [`MemoryLatest::set_inner`], with the handle on the value or marker
    /// it now holds (`None` for the retained store's deletion, which
    /// leaves nothing).
    fn set_kept(&self, mut record: Record, relief: bool) -> Result<Option<(Record, Option<Kept>)>> {
        self.shared.check_open()?;
        check_record(&self.name, &record, false)?;
        let mut st = write(&self.state);
        let old = st.values.get(record.topic.as_str()).map(|v| v.0.clone());
        let deleting = record.payload.is_empty();
        if deleting && old.as_ref().is_none_or(|o| o.is_marker()) {
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
            if let Some(by_offset) = st.by_offset.as_mut() {
                by_offset.remove(&o.offset);
            }
            st.deletions.remove(&o.offset);
        }
        record.offset = st.next;
        st.next += 1;
        self.version.bump(&self.shared);
        if deleting && !self.keep_markers {
            st.values.remove(record.topic.as_str());
            // Nothing is left at the offset the deletion took, so the floor
            // may pass it: reads never see it.
            return Ok(Some((record, None)));
        }
        if deleting {
            st.deletions.insert(record.offset, record.timestamp);
        }
        let kept = Kept::new(&record);
        if let Some(by_offset) = st.by_offset.as_mut() {
            by_offset.insert(kept.offset, kept.clone());
        }
        // `replace`, not `insert`: an equal key (the old value) is kept by
        // `insert`.
        st.values.replace(ByTopic(kept.clone()));
        Ok(Some((record, Some(kept))))
    }

    /// Forgets every marker below `bound` and raises the floor to it (never
    /// lowering it), under the lock already held.
    fn forget_below(&self, st: &mut LatestState, bound: u64) -> Removed {
        let bound = bound.min(st.next);
        let mut removed = Removed::default();
        let stale: Vec<u64> = st.deletions.range(..bound).map(|(o, _)| *o).collect();
        for offset in stale {
            st.deletions.remove(&offset);
            // Only a channel keeps markers, and a channel has the index.
            let Some(marker) = st.by_offset.as_mut().and_then(|b| b.remove(&offset)) else {
                continue;
            };
            if st.values.remove(marker.topic()) {
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
    /// Handles to the current values, ordered by offset, taken under the
    /// lock: a value is then made or lent from one without holding it.
    fn live_handles(&self) -> Vec<Kept> {
        read(&self.state)
            .in_offset_order()
            .into_iter()
            .filter(|k| !k.is_marker())
            .cloned()
            .collect()
    }
}

impl LatestStore for MemoryLatest {
    fn set(&self, record: Record) -> Result<Record> {
        self.set_sharing(record).map(|(record, _)| record)
    }

    /// The handle on a value, not a marker's: a deletion shares nothing.
    fn set_sharing(&self, record: Record) -> Result<(Record, Option<Kept>)> {
        let topic = record.topic.clone();
        match self.set_kept(record, false)? {
            Some((record, kept)) => Ok((record, kept.filter(|k| !k.is_marker()))),
            // An empty payload for a topic with no value: nothing changed.
            None => Ok((
                Record {
                    offset: 0,
                    ..Record::new(topic, bytes::Bytes::new())
                },
                None,
            )),
        }
    }

    fn get(&self, topic: &str) -> Result<Option<Record>> {
        let st = read(&self.state);
        Ok(st
            .values
            .get(topic)
            .filter(|v| !v.0.is_marker())
            .map(|v| v.0.record_sharing()))
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
        let mut found: Vec<&Kept> = Vec::new();
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
                    .take_while(|k| k.topic().starts_with(&under)),
            );
        }
        Ok(in_offset_order(
            found
                .into_iter()
                .filter(|k| !k.is_marker() && filter_matches(filter, k.topic())),
        )
        .into_iter()
        .map(|k| k.record_sharing())
        .collect())
    }

    fn values(&self) -> Result<Vec<Record>> {
        Ok(self
            .live_handles()
            .iter()
            .map(Kept::record_sharing)
            .collect())
    }

    /// Each value rebuilt as it is handed over, from handles taken under
    /// the lock: one record is made at a time, so a restart of a million
    /// retained messages never holds them all as records at once.
    fn for_each_value(&self, each: &mut dyn FnMut(Record)) -> Result<()> {
        self.live_handles()
            .into_iter()
            .for_each(|kept| each(kept.record()));
        Ok(())
    }

    /// Each value lent from what the store keeps, from handles taken
    /// under the lock: nothing is made for one.
    fn for_each_served_value(&self, each: &mut dyn FnMut(ServedValue<'_>)) -> Result<()> {
        self.live_handles()
            .into_iter()
            .for_each(|kept| each(kept.served()));
        Ok(())
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
    use crate::storage::kept::KeptRecord;
    use crate::storage::memory::MemoryProvider;
    use bytes::Bytes;

    fn retained_store() -> MemoryLatest {
        let provider = MemoryProvider::unbounded();
        MemoryLatest::new(RETAINED_STORE_NAME, provider.shared().clone())
    }

    /// The retained store keeps each value once, in its topic index only,
    /// and a record's head (its fields, count and length) in 56 bytes, in
    /// one allocation with its topic, client id and payload; as a shared `Record`
    /// indexed twice a value was 216 bytes, its topic and client id apart,
    /// and two index entries.
    #[test]
    fn a_retained_value_is_kept_small_and_once() {
        assert_eq!(std::mem::size_of::<Kept>(), 8, "one pointer");
        assert_eq!(std::mem::size_of::<KeptRecord<[u8; 0]>>(), 56);
        let store = retained_store();
        for (topic, payload) in [("a/1", "x"), ("a/2", "y"), ("a/1", "z")] {
            store
                .set(Record {
                    client_id: "publisher".into(),
                    ..Record::new(topic, payload)
                })
                .unwrap();
        }
        let st = read(&store.state);
        assert!(st.by_offset.is_none(), "no index by offset");
        assert_eq!(st.values.len(), 2);
        for v in &st.values {
            // The topic index and nothing else.
            assert_eq!(Kept::count(&v.0), 1);
            assert!(v.0.rare.is_none(), "nothing out of line");
            assert_eq!(v.0.client_id(), "publisher");
            let text = format!("{}publisher", v.0.topic());
            assert_eq!(&v.0.bytes[..text.len()], text.as_bytes(), "one allocation");
        }
        drop(st);
        assert_eq!(store.get("a/1").unwrap().unwrap().payload, "z");

        // A deletion of the retained store leaves nothing behind.
        store.delete("a/1").unwrap();
        let st = read(&store.state);
        assert_eq!(st.values.len(), 1);
        assert_eq!(
            st.bytes,
            Record::new("a/2", "y").accounted_size(),
            "the values' sizes"
        );
    }

    /// A value set is answered with the store's own handle on it, which
    /// the broker's retained index holds instead of a copy; a deletion,
    /// and an empty payload for a topic with none, share nothing.
    #[test]
    fn a_value_set_is_answered_with_the_stores_own_handle() {
        let store = retained_store();
        let (record, kept) = store.set_sharing(Record::new("a/1", "x")).unwrap();
        let kept = kept.expect("a memory store shares its handle");
        assert_eq!((record.offset, kept.offset), (1, 1));
        let st = read(&store.state);
        let held = &st.values.get("a/1").unwrap().0;
        assert!(Kept::ptr_eq(held, &kept), "the very handle the store holds");
        drop(st);
        assert_eq!(Kept::count(&kept), 2);
        let (replaced, _) = store.set_sharing(Record::new("a/1", "y")).unwrap();
        assert_eq!(replaced.offset, 2);
        assert_eq!(Kept::count(&kept), 1, "the store let go of it");
        let (deleted, none) = store.set_sharing(Record::new("a/1", "")).unwrap();
        assert!(none.is_none() && deleted.offset == 3);
        let (nothing, none) = store.set_sharing(Record::new("a/2", "")).unwrap();
        assert!(none.is_none() && nothing.offset == 0);
        // A restart's read lends the same handles.
        store.set(Record::new("b/1", "z")).unwrap();
        let mut lent = Vec::new();
        store
            .for_each_served_value(&mut |v| lent.push(v.kept.cloned()))
            .unwrap();
        let [Some(handle)] = lent.as_slice() else {
            panic!("{lent:?}");
        };
        let st = read(&store.state);
        assert!(Kept::ptr_eq(handle, &st.values.get("b/1").unwrap().0));
    }

    /// A channel's two indexes share each value.
    #[test]
    fn a_channel_value_is_shared_by_its_two_indexes() {
        let provider = MemoryProvider::unbounded();
        let store = MemoryLatest::new("devices", provider.shared().clone());
        for (topic, payload) in [("a/1", "x"), ("a/2", "y"), ("a/1", "z"), ("a/2", "")] {
            store.set(Record::new(topic, payload)).unwrap();
        }
        let st = read(&store.state);
        let by_offset = st.by_offset.as_ref().unwrap();
        assert_eq!(st.values.len(), 2);
        assert_eq!(by_offset.len(), 2);
        for (offset, kept) in by_offset {
            assert_eq!(kept.offset, *offset);
            let by_topic = &st.values.get(kept.topic()).unwrap().0;
            assert!(Kept::ptr_eq(by_topic, kept));
            assert_eq!(Kept::count(kept), 2);
        }
    }

    /// A value does not keep what its payload was read from: a restart's
    /// file, a connection's read of many packets.
    #[test]
    fn a_kept_value_lets_go_of_what_its_payload_was_read_from() {
        let read = Bytes::from(b"....site/1/device/7....0123456789....".to_vec());
        let store = retained_store();
        store
            .set(Record::new("site/1/device/7", read.slice(23..33)))
            .unwrap();
        assert!(read.is_unique(), "the store still holds the buffer read");
        let kept = store.get("site/1/device/7").unwrap().unwrap();
        assert_eq!(kept.payload, "0123456789");
        let st = super::read(&store.state);
        assert_eq!(st.values.first().unwrap().0.payload(), b"0123456789");
    }

    /// Nor what its correlation data was read from.
    #[test]
    fn a_kept_value_lets_go_of_what_its_correlation_data_was_read_from() {
        let read = Bytes::from(b"....request-17....".to_vec());
        let mut record = Record::new("site/1/reply", "x");
        record.props.correlation_data = Some(read.slice(4..14));
        let store = retained_store();
        store.set(record).unwrap();
        assert!(read.is_unique(), "the store still holds the buffer read");
        let kept = store.get("site/1/reply").unwrap().unwrap();
        assert_eq!(
            kept.props.correlation_data.as_deref(),
            Some(&b"request-17"[..])
        );
    }

    /// A restart's read of every retained value hands each over once, in
    /// offset order, rebuilt whole, and keeps up with changes.
    #[test]
    fn every_value_is_handed_over_once_in_offset_order() {
        let records = vec![at(1, "d/9", "a"), at(2, "d/1", "b"), at(3, "d/5", "c")];
        let store = retained_store();
        store.fill(4, 1, records.clone()).unwrap();
        let mut handed = Vec::new();
        store
            .for_each_value(&mut |record| handed.push(record))
            .unwrap();
        assert_eq!(handed, records);
        assert_eq!(store.values().unwrap(), records);

        store.set(Record::new("d/1", "new")).unwrap();
        store.delete("d/5").unwrap();
        let mut topics: Vec<(String, bytes::Bytes)> = Vec::new();
        store
            .for_each_value(&mut |r| topics.push((r.topic.clone(), r.payload.clone())))
            .unwrap();
        assert_eq!(
            topics,
            [("d/9".into(), "a".into()), ("d/1".into(), "new".into())]
        );
    }

    /// The retained store reads in offset order without an index for it:
    /// a snapshot's copy, a restart's values and a filter's matches.
    #[test]
    fn the_retained_store_reads_in_offset_order() {
        let store = retained_store();
        // Topics in the reverse of their offsets' order, one replaced.
        for topic in ["t/9", "t/5", "t/1", "t/5"] {
            store.set(Record::new(topic, "v")).unwrap();
        }
        let offsets_topics = |records: Vec<Record>| -> Vec<(u64, String)> {
            records.into_iter().map(|r| (r.offset, r.topic)).collect()
        };
        let expected = vec![(1, "t/9".into()), (3, "t/1".into()), (4, "t/5".into())];
        assert_eq!(
            offsets_topics(store.copy_state().records.to_vec()),
            expected
        );
        assert_eq!(offsets_topics(store.values().unwrap()), expected);
        assert_eq!(offsets_topics(store.match_filter("t/+").unwrap()), expected);
        let mut handed = Vec::new();
        store.for_each_value(&mut |r| handed.push(r)).unwrap();
        assert_eq!(offsets_topics(handed), expected);
        assert_eq!(
            offsets_topics(store.match_with_deletions_n("#", 2, 1).unwrap()),
            [(3, "t/1".into())]
        );
    }

    fn at(offset: u64, topic: &str, payload: &'static str) -> Record {
        Record {
            offset,
            ..Record::new(topic, payload)
        }
    }

    #[test]
    fn a_fill_builds_both_indexes_and_refuses_a_second_value() {
        let provider = MemoryProvider::unbounded();
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
            .parts()
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

        // The retained store, without an index by offset, refuses them too.
        let retained = retained_store();
        let e = retained
            .fill(3, 1, vec![at(1, "d/1", "a"), at(1, "d/2", "b")])
            .unwrap_err();
        assert!(
            matches!(&e, StorageError::Corrupt { detail, .. } if detail.contains("holds a second value")),
            "{e}"
        );
        assert_eq!(retained.record_count(), 0);
    }
}
