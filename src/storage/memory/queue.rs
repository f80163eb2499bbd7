//! A queue channel in memory. Its items are the unresolved records and what
//! survives about each (attempts, first and last delivery); who holds one,
//! under which delivery id, until when and at which epoch is volatile and
//! never written anywhere (invariant 15).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use saguin_format::model::{Record, UnixNanos};

use super::append::{AppendCopy, MemoryAppend};
use super::{admit, read, write, Shared, Version};
use crate::storage::contract::{
    after_failed_delivery, attempts_spent, check_record, dead_letter_record, AfterFailure,
    AppendStore, ExpiredLease, Lease, QueueItem, QueueStore, Released, Removed, Result,
    StorageError, DEFAULT_MAX_ATTEMPTS, FIRST_OFFSET,
};
use crate::storage::kept::Kept;
use crate::storage::offers::OfferCursor;

/// Who holds an item now. Volatile.
#[derive(Clone, Debug)]
struct Holding {
    delivery_id: u64,
    holder: String,
    lease_until: UnixNanos,
}

/// A queue item as a start decodes it: its record made compact, and what
/// its file says of its deliveries.
#[derive(Debug)]
pub(crate) struct RestoredItem {
    pub(crate) record: Kept,
    pub(crate) attempts: u32,
    pub(crate) first_delivered: UnixNanos,
    pub(crate) last_delivered: UnixNanos,
}

#[derive(Clone, Debug)]
struct Item {
    /// Kept compact, as an append channel's records are: a queue's
    /// backlog grows while its workers are away.
    record: Kept,
    /// What its deliveries left: `None` until its first, as most of a
    /// backlog is. One pointer of every item, where the fields inline were
    /// 80 bytes of each, in an ordered map's nodes half of whose room a
    /// growing queue leaves empty.
    delivered: Option<Box<Delivered>>,
}

/// An item's deliveries so far.
#[derive(Clone, Debug, Default)]
struct Delivered {
    attempts: u32,
    first_delivered: UnixNanos,
    last_delivered: UnixNanos,
    /// Not offered before this moment (the backoff gap). Volatile.
    not_before: UnixNanos,
    /// The per-record epoch: bumped by every lease, so a resolution by a
    /// superseded delivery is refused. Volatile.
    epoch: u64,
    held: Option<Holding>,
}

impl Item {
    /// An item with what its file says of its deliveries (all 0: never
    /// delivered).
    fn new(
        record: Kept,
        attempts: u32,
        first_delivered: UnixNanos,
        last_delivered: UnixNanos,
    ) -> Item {
        let delivered = (attempts, first_delivered, last_delivered) != (0, 0, 0);
        Item {
            record,
            delivered: delivered.then(|| {
                Box::new(Delivered {
                    attempts,
                    first_delivered,
                    last_delivered,
                    ..Delivered::default()
                })
            }),
        }
    }

    fn attempts(&self) -> u32 {
        self.delivered.as_ref().map_or(0, |d| d.attempts)
    }

    /// Its attempts and its first and last delivery: what its file keeps.
    fn kept_deliveries(&self) -> (u32, UnixNanos, UnixNanos) {
        self.delivered.as_ref().map_or((0, 0, 0), |d| {
            (d.attempts, d.first_delivered, d.last_delivered)
        })
    }

    fn not_before(&self) -> UnixNanos {
        self.delivered.as_ref().map_or(0, |d| d.not_before)
    }

    fn epoch(&self) -> u64 {
        self.delivered.as_ref().map_or(0, |d| d.epoch)
    }

    fn held(&self) -> Option<&Holding> {
        self.delivered.as_ref().and_then(|d| d.held.as_ref())
    }

    fn delivered_mut(&mut self) -> &mut Delivered {
        self.delivered.get_or_insert_with(Box::default)
    }

    fn to_queue_item(&self) -> QueueItem {
        let (attempts, first_delivered, last_delivered) = self.kept_deliveries();
        QueueItem {
            record: self.record.record_sharing(),
            attempts,
            first_delivered,
            last_delivered,
        }
    }
}

#[derive(Debug)]
struct QueueState {
    items: BTreeMap<u64, Item>,
    /// Live deliveries: delivery id to offset.
    deliveries: HashMap<u64, u64>,
    next: u64,
    /// Raised as the oldest items go; below it nothing is held.
    floor: u64,
    bytes: u64,
    max_bytes: Option<u64>,
    backoff: Vec<Duration>,
    max_attempts: u32,
    next_delivery_id: u64,
    /// Where offers start reading.
    offers: OfferCursor,
}

#[derive(Debug)]
pub struct MemoryQueue {
    name: String,
    shared: Arc<Shared>,
    dead_letter: Arc<MemoryAppend>,
    state: RwLock<QueueState>,
    /// Changes to what its file keeps (items, attempts, delivery times,
    /// counters); a lease's holder and deadline are not kept and not
    /// counted. Its dead-letter channel counts its own.
    version: Version,
}

/// A queue's state copied under its lock for a snapshot. Items carry what
/// survives only: no holder, no delivery id, no lease, no epoch.
#[derive(Clone, Debug)]
pub struct QueueCopy {
    /// The queue's version plus its dead-letter channel's when copied:
    /// the two are one file.
    pub version: u64,
    pub name: String,
    pub next: u64,
    pub floor: u64,
    pub bytes: u64,
    pub items: Vec<(Kept, u32, UnixNanos, UnixNanos)>,
}

impl MemoryQueue {
    pub(crate) fn new(name: &str, shared: Arc<Shared>, dead_letter: Arc<MemoryAppend>) -> Self {
        MemoryQueue {
            name: name.to_owned(),
            shared,
            dead_letter,
            state: RwLock::new(QueueState {
                items: BTreeMap::new(),
                deliveries: HashMap::new(),
                next: FIRST_OFFSET,
                floor: FIRST_OFFSET,
                bytes: 0,
                max_bytes: None,
                backoff: Vec::new(),
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                next_delivery_id: 1,
                offers: OfferCursor::default(),
            }),
            version: Version::default(),
        }
    }

    /// A queue rebuilt from stored items. Every item comes back available
    /// with no holder, no delivery id, no deadline and no epoch, whatever
    /// the caller passes: that rule is enforced here, where the queue is
    /// rebuilt, rather than in any decoder.
    pub(crate) fn restore(
        name: &str,
        shared: Arc<Shared>,
        dead_letter: Arc<MemoryAppend>,
        next: u64,
        floor: u64,
        items: Vec<RestoredItem>,
    ) -> MemoryQueue {
        let q = MemoryQueue::new(name, shared, dead_letter);
        {
            let mut st = write(&q.state);
            st.next = next;
            st.floor = floor;
            st.bytes = items.iter().map(|it| it.record.accounted_size()).sum();
            // Built at once from the items in their order, the map's nodes
            // are full, where inserting one at a time leaves them half
            // empty.
            st.items = items
                .into_iter()
                .map(|it| {
                    let offset = it.record.offset;
                    let item = Item::new(
                        it.record,
                        it.attempts,
                        it.first_delivered,
                        it.last_delivered,
                    );
                    (offset, item)
                })
                .collect();
            q.shared.budget.charge_relief(st.bytes);
        }
        q
    }

    pub fn dead_letter_store(&self) -> &Arc<MemoryAppend> {
        &self.dead_letter
    }

    /// How many times what its file holds (its own and its dead-letter
    /// channel's state) has changed.
    pub fn version(&self) -> u64 {
        self.version.get() + self.dead_letter.version()
    }

    /// Counts a change made elsewhere to what its file holds (a held
    /// publish for it).
    pub(crate) fn touch(&self) {
        self.version.bump(&self.shared);
    }

    /// Copies the queue and its dead-letter channel together, under the
    /// queue's lock (taken before the dead-letter channel's, as the move
    /// takes them), so a record being dead-lettered is in exactly one.
    pub fn copy_with_dead_letter(&self) -> (QueueCopy, AppendCopy) {
        let version = self.version();
        let st = read(&self.state);
        let dead_letter = self.dead_letter.copy_state();
        (self.copy_locked(&st, version), dead_letter)
    }

    pub fn copy_state(&self) -> QueueCopy {
        let version = self.version();
        let st = read(&self.state);
        self.copy_locked(&st, version)
    }

    fn copy_locked(&self, st: &QueueState, version: u64) -> QueueCopy {
        QueueCopy {
            version,
            name: self.name.clone(),
            next: st.next,
            floor: st.floor,
            bytes: st.bytes,
            items: st
                .items
                .values()
                .map(|i| {
                    let (attempts, first_delivered, last_delivered) = i.kept_deliveries();
                    (i.record.clone(), attempts, first_delivered, last_delivered)
                })
                .collect(),
        }
    }

    /// Who holds the record at `offset` (for the broker's catalogue).
    pub fn holder(&self, offset: u64) -> Option<String> {
        read(&self.state)
            .items
            .get(&offset)
            .and_then(|i| i.held().map(|h| h.holder.clone()))
    }

    pub(crate) fn enqueue_inner(&self, mut record: Record, relief: bool) -> Result<Record> {
        self.shared.check_open()?;
        check_record(&self.name, &record, false)?;
        let size = record.accounted_size();
        // Made compact before the lock, which only numbers it.
        let mut kept = Kept::new(&record);
        let mut st = write(&self.state);
        admit(
            &self.shared,
            &self.name,
            st.bytes,
            st.max_bytes,
            size,
            relief,
        )?;
        record.offset = st.next;
        kept.set_offset(st.next);
        st.next += 1;
        st.bytes += size;
        st.items.insert(record.offset, Item::new(kept, 0, 0, 0));
        self.version.bump(&self.shared);
        drop(st);
        Ok(record)
    }

    /// Removes an item whole, giving its bytes back and raising the floor
    /// past it when it was the oldest.
    fn remove_item(&self, st: &mut QueueState, offset: u64) -> Option<Item> {
        let item = st.items.remove(&offset)?;
        if let Some(h) = item.held() {
            st.deliveries.remove(&h.delivery_id);
        }
        let size = item.record.accounted_size();
        st.bytes = st.bytes.saturating_sub(size);
        self.shared.budget.give_back(size);
        st.floor = st
            .items
            .keys()
            .next()
            .copied()
            .unwrap_or(st.next)
            .max(st.floor);
        self.version.bump(&self.shared);
        Some(item)
    }

    /// Moves the item at `offset` to the dead-letter channel with its
    /// headers, under the queue's lock (taken before the dead-letter
    /// channel's, never after). If the append fails nothing changed: the
    /// item stays with the attempts it had.
    fn dead_letter_item(
        &self,
        st: &mut QueueState,
        offset: u64,
        now: UnixNanos,
        reason: &str,
    ) -> Result<u64> {
        let Some(item) = st.items.get(&offset) else {
            return Err(StorageError::Invalid {
                what: format!("queue {}", self.name),
                detail: format!("no record at offset {offset}"),
            });
        };
        let (attempts, first_delivered, last_delivered) = item.kept_deliveries();
        let record = dead_letter_record(
            item.record.record_sharing(),
            attempts,
            first_delivered,
            last_delivered,
            now,
            reason,
        );
        let stored = self.dead_letter.append_relief(record)?;
        self.remove_item(st, offset);
        Ok(stored.offset)
    }
}

impl QueueStore for MemoryQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn enqueue(&self, record: Record) -> Result<Record> {
        self.enqueue_inner(record, false)
    }

    fn set_max_bytes(&self, max_bytes: Option<u64>) {
        write(&self.state).max_bytes = max_bytes;
    }

    fn max_bytes(&self) -> Option<u64> {
        read(&self.state).max_bytes
    }

    fn bytes(&self) -> u64 {
        read(&self.state).bytes
    }

    fn depth(&self) -> u64 {
        read(&self.state).items.len() as u64
    }

    fn next(&self) -> u64 {
        read(&self.state).next
    }

    fn set_backoff(&self, gaps: Vec<Duration>) {
        write(&self.state).backoff = gaps;
    }

    fn set_max_attempts(&self, max_attempts: u32) {
        write(&self.state).max_attempts = max_attempts.max(1);
    }

    fn offer(&self, max: usize, now: UnixNanos) -> Result<Vec<QueueItem>> {
        let mut st = write(&self.state);
        let st = &mut *st;
        let mut scan = st.offers.start(now);
        let mut out = Vec::new();
        for (&offset, item) in st.items.range(scan.from..) {
            if out.len() >= max {
                break;
            }
            if item.held().is_some() || item.not_before() > now {
                scan.waiting(offset);
                continue;
            }
            scan.free();
            if !attempts_spent(item.attempts(), st.max_attempts) {
                out.push(item.to_queue_item());
            }
        }
        st.offers.finish(scan);
        Ok(out)
    }

    fn lease(
        &self,
        offset: u64,
        holder: &str,
        lease_until: UnixNanos,
        now: UnixNanos,
    ) -> Result<Lease> {
        self.shared.check_open()?;
        let mut st = write(&self.state);
        let delivery_id = st.next_delivery_id;
        let max_attempts = st.max_attempts;
        let unavailable = |why: &str| StorageError::Invalid {
            what: format!("queue {}: lease of offset {offset}", self.name),
            detail: why.to_owned(),
        };
        let Some(item) = st.items.get_mut(&offset) else {
            return Err(unavailable("no unresolved record there"));
        };
        if let Some(h) = item.held() {
            return Err(unavailable(&format!("held by {}", h.holder)));
        }
        if item.not_before() > now {
            return Err(unavailable("waiting out its backoff"));
        }
        if attempts_spent(item.attempts(), max_attempts) {
            return Err(unavailable("its attempts are spent"));
        }
        let record = item.record.record_sharing();
        let d = item.delivered_mut();
        d.attempts += 1;
        if d.first_delivered == 0 {
            d.first_delivered = now;
        }
        d.last_delivered = now;
        d.epoch += 1;
        d.held = Some(Holding {
            delivery_id,
            holder: holder.to_owned(),
            lease_until,
        });
        let lease = Lease {
            delivery_id,
            epoch: d.epoch,
            attempts: d.attempts,
            offset,
            record,
        };
        st.next_delivery_id += 1;
        st.deliveries.insert(delivery_id, offset);
        // The attempt and the delivery times are kept; the holder is not.
        self.version.bump(&self.shared);
        Ok(lease)
    }

    fn resolve(&self, delivery_id: u64, epoch: u64) -> Result<bool> {
        let mut st = write(&self.state);
        let Some(&offset) = st.deliveries.get(&delivery_id) else {
            return Ok(false);
        };
        let current = st.items.get(&offset).is_some_and(|i| {
            i.epoch() == epoch && i.held().is_some_and(|h| h.delivery_id == delivery_id)
        });
        if !current {
            return Ok(false);
        }
        self.remove_item(&mut st, offset);
        Ok(true)
    }

    fn release(
        &self,
        delivery_id: u64,
        epoch: u64,
        now: UnixNanos,
        reason: &str,
    ) -> Result<Released> {
        let mut st = write(&self.state);
        let Some(&offset) = st.deliveries.get(&delivery_id) else {
            return Ok(Released::Stale);
        };
        let max_attempts = st.max_attempts;
        let Some(item) = st.items.get(&offset) else {
            st.deliveries.remove(&delivery_id);
            return Ok(Released::Stale);
        };
        let current =
            item.epoch() == epoch && item.held().is_some_and(|h| h.delivery_id == delivery_id);
        if !current {
            return Ok(Released::Stale);
        }
        let not_before =
            match after_failed_delivery(item.attempts(), max_attempts, &st.backoff, now) {
                AfterFailure::RetryAt(not_before) => not_before,
                AfterFailure::DeadLetter => {
                    // On failure the record is still held, with the attempts it had.
                    let dlq_offset = self.dead_letter_item(&mut st, offset, now, reason)?;
                    return Ok(Released::DeadLettered { offset, dlq_offset });
                }
            };
        st.deliveries.remove(&delivery_id);
        if let Some(item) = st.items.get_mut(&offset) {
            let d = item.delivered_mut();
            d.held = None;
            d.not_before = not_before;
        }
        st.offers.backoff(offset, not_before);
        Ok(Released::Retry { offset, not_before })
    }

    fn expired_leases(&self, now: UnixNanos) -> Vec<ExpiredLease> {
        let st = read(&self.state);
        let mut out: Vec<ExpiredLease> = st
            .deliveries
            .iter()
            .filter_map(|(&delivery_id, offset)| {
                let item = st.items.get(offset)?;
                let h = item.held()?;
                (h.lease_until <= now).then(|| ExpiredLease {
                    delivery_id,
                    epoch: item.epoch(),
                    offset: *offset,
                    holder: h.holder.clone(),
                })
            })
            .collect();
        out.sort_by_key(|e| e.offset);
        out
    }

    fn expire_older_than(&self, cutoff: UnixNanos) -> Result<Removed> {
        self.shared.check_open()?;
        let mut st = write(&self.state);
        let mut removed = Removed::default();
        // Walk from the oldest; held items are skipped (their worker still
        // has them), the first free one that stays ends the walk, and a
        // record with timestamp 0 is never too old.
        let mut doomed = Vec::new();
        for (offset, item) in &st.items {
            if item.held().is_some() {
                continue;
            }
            let ts = item.record.timestamp;
            if ts == 0 || ts >= cutoff {
                break;
            }
            doomed.push(*offset);
        }
        for offset in doomed {
            if let Some(item) = self.remove_item(&mut st, offset) {
                removed.records += 1;
                removed.bytes += item.record.accounted_size();
            }
        }
        Ok(removed)
    }

    fn dead_letter_spent(&self, now: UnixNanos) -> Result<u64> {
        self.shared.check_open()?;
        let mut st = write(&self.state);
        let spent: Vec<u64> = st
            .items
            .iter()
            .filter(|(_, i)| i.held().is_none() && attempts_spent(i.attempts(), st.max_attempts))
            .map(|(o, _)| *o)
            .collect();
        let mut moved = 0;
        for offset in spent {
            self.dead_letter_item(&mut st, offset, now, "attempts spent before a restart")?;
            moved += 1;
        }
        Ok(moved)
    }

    fn dead_letter(&self) -> Arc<dyn AppendStore> {
        self.dead_letter.clone()
    }

    fn items(&self) -> Result<Vec<QueueItem>> {
        Ok(read(&self.state)
            .items
            .values()
            .map(Item::to_queue_item)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::MemoryProvider;

    /// An item of a backlog is its record's handle and one pointer to
    /// what its deliveries left, unallocated until its first.
    #[test]
    fn an_undelivered_item_is_two_pointers() {
        assert_eq!(std::mem::size_of::<Item>(), 16);
        let provider = MemoryProvider::unbounded();
        let shared = provider.shared().clone();
        let dead_letter = Arc::new(MemoryAppend::new_dead_letter("jobs.dlq", shared.clone()));
        let queue = MemoryQueue::new("jobs", shared, dead_letter);
        let stored = queue.enqueue(Record::new("jobs/1", "a")).unwrap();
        assert!(read(&queue.state).items[&stored.offset].delivered.is_none());
        let lease = queue.lease(stored.offset, "worker-1", 10, 1).unwrap();
        let released = queue
            .release(lease.delivery_id, lease.epoch, 2, "nack")
            .unwrap();
        assert!(matches!(released, Released::Retry { .. }));
        let st = read(&queue.state);
        let item = &st.items[&stored.offset];
        assert_eq!(item.kept_deliveries(), (1, 1, 1), "its attempt is kept");
        assert!(item.held().is_none());
    }

    /// A queue's backlog is kept compact, as an append channel's records
    /// are, and a lease and a copy for a snapshot hand each record back
    /// whole.
    #[test]
    fn a_queued_record_is_kept_compact_and_leased_whole() {
        let provider = MemoryProvider::unbounded();
        let shared = provider.shared().clone();
        let dead_letter = Arc::new(MemoryAppend::new_dead_letter("jobs.dlq", shared.clone()));
        let queue = MemoryQueue::new("jobs", shared, dead_letter);
        let stored = queue
            .enqueue(Record {
                client_id: "planner".into(),
                ..Record::new("jobs/7", "resize")
            })
            .unwrap();
        {
            let st = read(&queue.state);
            let kept = &st.items[&stored.offset].record;
            assert_eq!(Kept::count(kept), 1, "the queue's alone");
            assert_eq!(&kept.bytes[..], b"jobs/7plannerresize", "one allocation");
        }
        let (copy, _) = queue.copy_with_dead_letter();
        assert_eq!(copy.items[0].0.record(), stored);
        let lease = queue.lease(stored.offset, "worker-1", 10, 1).unwrap();
        assert_eq!(lease.record, stored);
    }
}
