//! An append channel in memory.

use std::sync::{Arc, RwLock};

use saguin_format::model::{Record, UnixNanos};

use super::kept::KeptRecords;
use super::positions::PositionBook;
use super::slots::SlotLog;
use super::{admit, read, write, Shared, Version};
use crate::storage::contract::{
    check_record, AppendStore, LentRecord, OffsetStore, Position, Reader, Removed, Result,
    StorageError, FIRST_OFFSET,
};
use crate::storage::kept::Kept;

#[derive(Debug)]
struct AppendState {
    log: SlotLog<Kept>,
    /// Stored, never derived (invariant 9).
    next: u64,
    /// Stored, raised only by a removal in the same operation.
    floor: u64,
    max_bytes: Option<u64>,
}

/// An append channel in memory: its records, its two counters, its byte
/// count and its readers' positions.
#[derive(Debug)]
pub struct MemoryAppend {
    name: String,
    shared: Arc<Shared>,
    /// A queue's `.dlq` channel: written in its queue's file.
    dead_letter: bool,
    state: RwLock<AppendState>,
    positions: PositionBook,
    /// Its records, counters and positions' changes.
    version: Version,
}

/// An append channel's state copied under its lock for a snapshot: the
/// records are shared, not copied.
#[derive(Clone, Debug)]
pub struct AppendCopy {
    /// The store's version when it was copied: the copy holds at least
    /// every change it counts.
    pub version: u64,
    /// `records` are those at or after this offset (and the floor): the
    /// ones before it are an earlier copy's. 0: every record.
    pub from: u64,
    pub name: String,
    pub next: u64,
    pub floor: u64,
    pub bytes: u64,
    pub records: KeptRecords,
    pub positions: Vec<Position>,
}

impl MemoryAppend {
    pub(crate) fn new(name: &str, shared: Arc<Shared>) -> MemoryAppend {
        MemoryAppend::with_state(name, shared, false, FIRST_OFFSET, FIRST_OFFSET)
    }

    pub(crate) fn new_dead_letter(name: &str, shared: Arc<Shared>) -> MemoryAppend {
        MemoryAppend::with_state(name, shared, true, FIRST_OFFSET, FIRST_OFFSET)
    }

    fn with_state(
        name: &str,
        shared: Arc<Shared>,
        dead_letter: bool,
        next: u64,
        floor: u64,
    ) -> MemoryAppend {
        MemoryAppend {
            name: name.to_owned(),
            shared,
            dead_letter,
            state: RwLock::new(AppendState {
                log: SlotLog::new(),
                next,
                floor,
                max_bytes: None,
            }),
            positions: PositionBook::default(),
            version: Version::default(),
        }
    }

    /// A store rebuilt from validated stored state. The records are charged
    /// to the provider's counter whatever it holds: they are in memory
    /// whether or not anything counted them.
    pub(crate) fn restore(
        name: &str,
        shared: Arc<Shared>,
        dead_letter: bool,
        next: u64,
        floor: u64,
        records: Vec<Kept>,
        positions: Vec<Position>,
    ) -> MemoryAppend {
        let store = MemoryAppend::with_state(name, shared, dead_letter, next, floor);
        {
            let mut st = write(&store.state);
            for kept in records {
                let size = kept.accounted_size();
                st.log.push(kept, size);
            }
            store.shared.budget.charge_relief(st.log.bytes());
        }
        MemoryAppend {
            positions: PositionBook::restored(positions),
            ..store
        }
    }

    pub(crate) fn is_dead_letter(&self) -> bool {
        self.dead_letter
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

    /// Copies the channel's state under its lock (the first phase of a
    /// snapshot): counters, shared record handles and positions.
    pub fn copy_state(&self) -> AppendCopy {
        let version = self.version.get();
        let st = read(&self.state);
        let positions = self.positions.copy();
        AppendCopy {
            version,
            from: 0,
            name: self.name.clone(),
            next: st.next,
            floor: st.floor,
            bytes: st.log.bytes(),
            records: st.log.shared_records().into(),
            positions,
        }
    }

    /// [`Self::copy_state`] with only the records at or after `from` (and
    /// the floor): what a snapshot generation needs of a channel whose
    /// earlier records it already holds from the generation before. Its
    /// cost is the records appended since, not the channel's length.
    pub fn copy_since(&self, from: u64) -> AppendCopy {
        let version = self.version.get();
        let st = read(&self.state);
        let positions = self.positions.copy();
        AppendCopy {
            version,
            from,
            name: self.name.clone(),
            next: st.next,
            floor: st.floor,
            bytes: st.log.bytes(),
            records: st.log.read_shared(from.max(st.floor), usize::MAX).into(),
            positions,
        }
    }

    /// Stores a record for a relief operation (the dead-letter move, a held
    /// publish's release): the provider's counter is charged, not asked,
    /// and the channel's own bound is not applied.
    pub(crate) fn append_relief(&self, record: Record) -> Result<Record> {
        self.append_inner(record, true)
    }

    fn append_inner(&self, mut record: Record, relief: bool) -> Result<Record> {
        self.shared.check_open()?;
        check_record(&self.name, &record, false)?;
        let size = record.accounted_size();
        // Made compact before the lock, which only numbers it: a copy of a
        // large payload does not hold up the channel's readers.
        let mut kept = Kept::new(&record);
        let mut st = write(&self.state);
        admit(
            &self.shared,
            &self.name,
            st.log.bytes(),
            st.max_bytes,
            size,
            relief,
        )?;
        // The offset is taken and the record made visible under one lock, so
        // offsets become readable in the order they were assigned (`docs/design.md`
        // storage rule 2).
        record.offset = st.next;
        kept.set_offset(st.next);
        st.next += 1;
        // Kept compact, in one allocation of its own: the record handed
        // back (to the broker, which keeps recent records for a while)
        // does not hold it.
        st.log.push(kept, size);
        self.version.bump(&self.shared);
        drop(st);
        Ok(record)
    }

    fn check_read(&self, st: &AppendState, offset: u64) -> Result<()> {
        if offset < st.floor {
            return Err(StorageError::BelowFloor {
                channel: self.name.clone(),
                offset,
                floor: st.floor,
            });
        }
        if offset > st.next {
            return Err(StorageError::PastNext {
                channel: self.name.clone(),
                offset,
                next: st.next,
            });
        }
        Ok(())
    }

    /// Handles on at most `max` records from `offset`, with the bounds of
    /// `read_from`, taken under the channel's lock and nothing more.
    fn held_from(&self, offset: u64, max: usize) -> Result<Vec<Kept>> {
        let st = read(&self.state);
        self.check_read(&st, offset)?;
        Ok(st.log.read_shared(offset, max))
    }

    /// Removes from the front while `remove` says so, raising the floor and
    /// giving the bytes back in the same operation, under the channel's
    /// lock. The removed records are freed after the lock is let go.
    fn remove_front(&self, before: u64, remove: impl FnMut(&Kept, u64) -> bool) -> Result<Removed> {
        self.shared.check_open()?;
        let mut st = write(&self.state);
        let out = st.log.remove_front_while(remove);
        let mut floor = st.floor.max(before.min(st.next));
        if let Some(past) = out.past_last {
            floor = floor.max(past);
        }
        let changed = floor != st.floor || out.records > 0;
        st.floor = floor;
        self.shared.budget.give_back(out.bytes);
        if changed {
            self.version.bump(&self.shared);
        }
        drop(st);
        drop(out.released);
        Ok(Removed {
            records: out.records,
            bytes: out.bytes,
        })
    }
}

impl AppendStore for MemoryAppend {
    fn append(&self, record: Record) -> Result<Record> {
        self.append_inner(record, false)
    }

    fn read_from(&self, offset: u64) -> Result<Vec<Record>> {
        self.read_from_n(offset, usize::MAX)
    }

    fn read_from_n(&self, offset: u64, max: usize) -> Result<Vec<Record>> {
        // Rebuilt once the lock is let go: a long read does not hold up
        // the appends.
        let held = self.held_from(offset, max)?;
        Ok(held.iter().map(Kept::record_sharing).collect())
    }

    fn lend_from_n(&self, offset: u64, max: usize) -> Result<Vec<LentRecord>> {
        let held = self.held_from(offset, max)?;
        Ok(held.into_iter().map(LentRecord::Kept).collect())
    }

    fn lowest_position(&self) -> u64 {
        let lowest = self.positions.lowest();
        lowest.unwrap_or_else(|| self.next())
    }

    fn first_at_or_after(&self, at: UnixNanos) -> Result<Option<u64>> {
        Ok(read(&self.state).log.first_at_or_after(at))
    }

    fn set_max_bytes(&self, max_bytes: Option<u64>) {
        write(&self.state).max_bytes = max_bytes;
    }

    fn max_bytes(&self) -> Option<u64> {
        read(&self.state).max_bytes
    }

    fn trim(&self, before: u64, max_bytes: Option<u64>) -> Result<Removed> {
        let limit = max_bytes.unwrap_or(u64::MAX);
        self.remove_front(before, |r, held| r.offset < before || held > limit)
    }

    fn trim_older_than(&self, cutoff: UnixNanos) -> Result<Removed> {
        // A record with timestamp 0 is never too old, and it stops the walk.
        self.remove_front(0, |r, _| r.timestamp != 0 && r.timestamp < cutoff)
    }
}

impl OffsetStore for MemoryAppend {
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
        read(&self.state).log.bytes()
    }

    fn record_count(&self) -> u64 {
        read(&self.state).log.live()
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
    use crate::storage::memory::MemoryProvider;

    /// A record appended is kept compact: its fields and one allocation of
    /// its topic, client id and payload, held by the log alone. As the
    /// shared `Record` the broker is handed back, it took about twice the
    /// memory, for as long as retention kept it.
    #[test]
    fn an_appended_record_is_kept_compact_and_apart_from_the_one_handed_back() {
        let provider = MemoryProvider::unbounded();
        let store = MemoryAppend::new("events", provider.shared().clone());
        let handed = store
            .append(Record {
                client_id: "dev-1".into(),
                ..Record::new("site/1", "21.5")
            })
            .unwrap();
        let st = read(&store.state);
        let kept = st.log.live_slots()[0].record.as_ref().unwrap();
        assert_eq!(Kept::count(kept), 1, "the log's alone");
        assert_eq!(&kept.bytes[..], b"site/1dev-121.5", "one allocation");
        assert!(kept.rare.is_none());
        assert_eq!(kept.record(), handed);
        drop(st);
        assert_eq!(store.read_from(1).unwrap(), vec![handed]);
    }
}
