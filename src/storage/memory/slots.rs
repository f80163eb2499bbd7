//! A log of records in memory that removes from the front without shuffling.
//!
//! Slots hold the record's offset and the record itself. A removed record is
//! cleared where it stands - its payload stops being reachable at the moment
//! it stops being counted - and `head` says how far the dead prefix reaches.
//! A record let go from the middle (the broadcast log) is cleared the same
//! way and keeps only its offset; every read skips cleared slots. The slice
//! is compacted once the cleared slots reach half of it, and reallocated
//! rather than shifted in place when its capacity has grown far past what is
//! left, so one removal costs what went rather than what survives.

use saguin_format::model::UnixNanos;

use crate::storage::kept::{Kept, KeptRecord};

/// A record as a log holds it, kept compact (an append channel's, held for
/// as long as retention says, and the broadcast log's).
pub(crate) trait Logged {
    fn offset(&self) -> u64;
    fn timestamp(&self) -> UnixNanos;
    fn accounted_size(&self) -> u64;
}

impl Logged for Kept {
    fn offset(&self) -> u64 {
        self.offset
    }

    fn timestamp(&self) -> UnixNanos {
        self.timestamp
    }

    fn accounted_size(&self) -> u64 {
        KeptRecord::accounted_size(self)
    }
}

/// One place in the log. `record` is `None` once the record was removed.
#[derive(Clone, Debug)]
pub(crate) struct Slot<T> {
    pub offset: u64,
    pub record: Option<T>,
}

/// Below this many slots a compaction is not worth its own bookkeeping.
const MIN_COMPACT_SLOTS: usize = 64;
/// Capacity more than this many times the live length is given back.
const SHRINK_FACTOR: usize = 4;

#[derive(Debug)]
pub(crate) struct SlotLog<T> {
    slots: Vec<Slot<T>>,
    /// Every slot before `head` is cleared.
    head: usize,
    /// Cleared slots at or after `head` (let go from the middle).
    holes: usize,
    /// Records held (slots with a record).
    live: u64,
    /// Sum of `accounted_size` over the records held.
    bytes: u64,
}

/// What a front removal took.
#[derive(Debug)]
pub(crate) struct FrontRemoval<T> {
    pub records: u64,
    pub bytes: u64,
    /// The offset after the last record removed, when any was.
    pub past_last: Option<u64>,
    /// The removed records' last handles, already out of the log: the
    /// caller drops them once it has let go of the channel's lock, so
    /// freeing a large removal does not stall a publisher.
    pub released: Vec<T>,
}

impl<T> Default for FrontRemoval<T> {
    fn default() -> Self {
        FrontRemoval {
            records: 0,
            bytes: 0,
            past_last: None,
            released: Vec::new(),
        }
    }
}

impl<T: Logged + Clone> SlotLog<T> {
    pub fn new() -> SlotLog<T> {
        SlotLog {
            slots: Vec::new(),
            head: 0,
            holes: 0,
            live: 0,
            bytes: 0,
        }
    }

    /// Appends a record whose offset is above every offset held. The caller
    /// guarantees ascending offsets (it assigns them, or a loader validated
    /// them).
    pub fn push(&mut self, record: T, size: u64) {
        self.slots.push(Slot {
            offset: record.offset(),
            record: Some(record),
        });
        self.live += 1;
        self.bytes += size;
    }

    pub fn live(&self) -> u64 {
        self.live
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The slots from the dead prefix on (cleared middle slots included).
    pub fn live_slots(&self) -> &[Slot<T>] {
        self.slots.get(self.head..).unwrap_or(&[])
    }

    /// The offset of the oldest record held.
    pub fn first_offset(&self) -> Option<u64> {
        self.live_slots()
            .iter()
            .find(|s| s.record.is_some())
            .map(|s| s.offset)
    }

    /// The index into `slots` of the first slot at or after `offset`.
    fn index_of(&self, offset: u64) -> usize {
        let live = self.live_slots();
        // Offsets are contiguous on an append channel, so the direct guess
        // is right; the binary search covers gaps a loaded file may hold.
        if let Some(first) = live.first() {
            if offset >= first.offset {
                let guess = (offset - first.offset) as usize;
                if live.get(guess).is_some_and(|s| s.offset == offset) {
                    return self.head + guess;
                }
            }
        }
        self.head + live.partition_point(|s| s.offset < offset)
    }

    /// [`SlotLog::read_from`], the records shared rather than copied.
    pub fn read_shared(&self, offset: u64, max: usize) -> Vec<T> {
        self.held_from(offset)
            .filter_map(|s| s.record.clone())
            .take(max)
            .collect()
    }

    fn held_from(&self, offset: u64) -> std::slice::Iter<'_, Slot<T>> {
        let start = self.index_of(offset);
        self.slots.get(start..).unwrap_or(&[]).iter()
    }

    /// Every record held, shared rather than copied (what a snapshot takes
    /// under the lock).
    pub fn shared_records(&self) -> Vec<T> {
        self.live_slots()
            .iter()
            .filter_map(|s| s.record.clone())
            .collect()
    }

    /// The earliest offset whose timestamp is set and at or after `at`,
    /// looking at every record in offset order (no bisection: receipt times
    /// may run backwards).
    pub fn first_at_or_after(&self, at: UnixNanos) -> Option<u64> {
        self.live_slots()
            .iter()
            .filter_map(|s| s.record.as_ref())
            .find(|r| r.timestamp() != 0 && r.timestamp() >= at)
            .map(|r| r.offset())
    }

    /// Removes records from the oldest while `remove(record, bytes held)`
    /// says so, stopping at the first that stays. Each removed slot is
    /// cleared as it goes.
    pub fn remove_front_while(
        &mut self,
        mut remove: impl FnMut(&T, u64) -> bool,
    ) -> FrontRemoval<T> {
        let mut out = FrontRemoval::default();
        while let Some(slot) = self.slots.get_mut(self.head) {
            match &slot.record {
                None => {
                    // A hole let go from the middle, now at the front.
                    self.holes = self.holes.saturating_sub(1);
                    self.head += 1;
                }
                Some(record) => {
                    if !remove(record, self.bytes) {
                        break;
                    }
                    let size = record.accounted_size();
                    out.past_last = Some(slot.offset + 1);
                    if let Some(r) = slot.record.take() {
                        out.released.push(r);
                    }
                    self.head += 1;
                    self.live -= 1;
                    self.bytes = self.bytes.saturating_sub(size);
                    out.records += 1;
                    out.bytes += size;
                }
            }
        }
        self.maybe_compact();
        out
    }

    /// Lets the record at `offset` go where it stands; returns its size.
    pub fn clear_at(&mut self, offset: u64) -> Option<u64> {
        let i = self.index_of(offset);
        let slot = self.slots.get_mut(i).filter(|s| s.offset == offset)?;
        let record = slot.record.take()?;
        let size = record.accounted_size();
        self.live -= 1;
        self.bytes = self.bytes.saturating_sub(size);
        if i == self.head {
            self.head += 1;
            // Leading holes become dead prefix.
            while let Some(s) = self.slots.get(self.head) {
                if s.record.is_some() {
                    break;
                }
                self.head += 1;
                self.holes = self.holes.saturating_sub(1);
            }
        } else {
            self.holes += 1;
        }
        self.maybe_compact();
        Some(size)
    }

    /// Compacts once cleared slots reach half of the slice.
    fn maybe_compact(&mut self) {
        let dead = self.head + self.holes;
        if self.slots.len() < MIN_COMPACT_SLOTS || dead * 2 < self.slots.len() {
            return;
        }
        let keep = self.slots.len() - self.head;
        if self.holes > 0 || self.slots.capacity() > SHRINK_FACTOR * keep.max(MIN_COMPACT_SLOTS) {
            // Rebuild into a right-sized array: holes go, and the capacity
            // the channel grew into is given back.
            let mut fresh = Vec::with_capacity((keep - self.holes).max(MIN_COMPACT_SLOTS) * 2);
            fresh.extend(self.slots.drain(self.head..).filter(|s| s.record.is_some()));
            self.slots = fresh;
            self.holes = 0;
        } else {
            self.slots.drain(..self.head);
        }
        self.head = 0;
    }

    #[cfg(test)]
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saguin_format::model::Record;

    fn log(n: u64) -> SlotLog<Kept> {
        let mut l = SlotLog::new();
        for o in 1..=n {
            let mut r = Record::new("t", vec![0u8; 10]);
            r.offset = o;
            r.timestamp = o as i64;
            l.push(Kept::new(&r), 11);
        }
        l
    }

    #[test]
    fn front_removal_clears_and_compacts_at_half() {
        let mut l = log(200);
        let r = l.remove_front_while(|rec, _| rec.offset < 50);
        assert_eq!(r.records, 49);
        assert_eq!(r.past_last, Some(50));
        assert_eq!(l.slot_count(), 200, "below half: no compaction");
        l.remove_front_while(|rec, _| rec.offset < 101);
        assert_eq!(l.slot_count(), 100, "at half: compacted");
        assert_eq!(l.first_offset(), Some(101));
        assert_eq!(
            l.read_shared(150, 2)
                .iter()
                .map(|r| r.offset)
                .collect::<Vec<_>>(),
            [150, 151]
        );
        assert_eq!(l.bytes(), 100 * 11);
    }

    #[test]
    fn middle_release_skips_and_counts_towards_half() {
        let mut l = log(100);
        for o in (2..=100).step_by(2) {
            l.clear_at(o);
        }
        assert_eq!(l.live(), 50);
        assert_eq!(
            l.slot_count(),
            50,
            "holes reached half: rebuilt without them"
        );
        let got: Vec<u64> = l.read_shared(1, 3).iter().map(|r| r.offset).collect();
        assert_eq!(got, [1, 3, 5]);
        assert_eq!(l.read_shared(2, 1)[0].offset, 3);
        l.clear_at(1);
        assert_eq!(l.first_offset(), Some(3));
    }

    #[test]
    fn first_at_or_after_looks_at_every_record() {
        let mut l = SlotLog::<Kept>::new();
        for (o, ts) in [(1, 0), (2, 50), (3, 10), (4, 60)] {
            let mut r = Record::new("t", Vec::new());
            r.offset = o;
            r.timestamp = ts;
            l.push(Kept::new(&r), 1);
        }
        assert_eq!(l.first_at_or_after(40), Some(2));
        assert_eq!(l.first_at_or_after(55), Some(4));
        assert_eq!(l.first_at_or_after(5), Some(2));
        assert_eq!(l.first_at_or_after(61), None);
    }
}
