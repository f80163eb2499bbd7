//! A queue on sqlite: `queue_items` holds the unresolved records and what
//! survives about each - attempts, first and last delivery. Who holds one,
//! under which delivery id, until when and at which epoch lives in memory
//! only (invariant 15), so `offer` is a bounded read, `expired_leases`
//! touches no database, and `lease` is one UPDATE of the attempt count (the
//! one thing a restart must know).
//!
//! The queue's byte total and depth are summed at open and kept in memory:
//! its table is a bounded working set, and storing them would put a second
//! statement on the resolution path.
//!
//! Epochs are minted from one counter rather than kept per record: an epoch
//! is compared only after its delivery id was found, and the table of live
//! deliveries is empty at every start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};
use saguin_format::model::{ChannelKind, Record, UnixNanos};

use super::append::AppendChannel;
use super::batch::Job;
use super::channel::{
    publish_counters, target_of, write_counter_rows, ChannelCounters, Pending, RowPerRecord, Target,
};
use super::row::{record_at, size_at};
use super::schema::record_columns;
use super::Shared;
use crate::storage::contract::{
    self, AppendStore, ExpiredLease, Lease, LeaseRequest, QueueItem, QueueStore, Released, Removed,
    StorageError,
};
use crate::storage::offers::OfferCursor;

const SQL_ITEMS: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    ", attempts, first_delivered, last_delivered FROM queue_items WHERE channel = ?1 ORDER BY offset"
);
/// The records from an offer's start ([`OfferCursor::start`]).
const SQL_ITEMS_FROM: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    ", attempts, first_delivered, last_delivered FROM queue_items WHERE channel = ?1 AND offset >= ?2 ORDER BY offset"
);
const SQL_INSERT: &str = concat!(
    "INSERT INTO queue_items (channel, offset, ",
    record_columns!(),
    ", attempts, first_delivered, last_delivered)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, 0, 0, 0)"
);
/// The records whose attempts are spent (`attempts >= max_attempts`,
/// [`contract::attempts_spent`]): what a restart finds a crash left leased
/// for the last time. Filtered here, not by the caller: a backlog of
/// millions of jobs is never held (reading them all held about 400 bytes
/// a job at every start), and not read at all while no record has had
/// that many attempts ([`Volatile::highest_attempts`]).
const SQL_SPENT: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    ", attempts, first_delivered, last_delivered FROM queue_items WHERE channel = ?1 AND attempts >= ?2 ORDER BY offset"
);
const SQL_TOTALS: &str = "SELECT count(*), coalesce(sum(size), 0), coalesce(max(attempts), 0) FROM queue_items WHERE channel = ?1";

pub(crate) fn read_statements() -> Vec<String> {
    vec![
        SQL_ITEMS.to_string(),
        SQL_ITEMS_FROM.to_string(),
        SQL_SPENT.to_string(),
        SQL_TOTALS.to_string(),
    ]
}

/// One record out with a worker. Volatile.
struct Delivery {
    delivery_id: u64,
    epoch: u64,
    holder: String,
    until: UnixNanos,
    attempts: u32,
    first_delivered: UnixNanos,
    last_delivered: UnixNanos,
    size: u64,
    record: Record,
}

#[derive(Default)]
struct Volatile {
    /// By offset.
    held: HashMap<u64, Delivery>,
    by_id: HashMap<u64, u64>,
    /// Backoff: not offered before this moment. Forgotten at a restart,
    /// like every other piece of delivery state.
    not_before: HashMap<u64, UnixNanos>,
    /// Where offers start reading.
    offers: OfferCursor,
    next_delivery_id: u64,
    next_epoch: u64,
    backoff: Vec<Duration>,
    /// The most attempts any record has had: read at open with the
    /// totals, raised by every lease. Below `max_attempts`, no record's
    /// attempts are spent, and a start looks for none.
    highest_attempts: u32,
}

pub struct QueueChannel {
    me: Weak<QueueChannel>,
    shared: Arc<Shared>,
    name: String,
    dlq: Arc<AppendChannel>,
    /// `count` is the depth; a queue has no floor.
    counters: ChannelCounters,
    max_attempts: AtomicU32,
    volatile: Mutex<Volatile>,
}

fn item_at(row: &rusqlite::Row<'_>) -> rusqlite::Result<(QueueItem, u64)> {
    let offset: u64 = row.get(0)?;
    let record = record_at(row, 1, offset)?;
    let size = size_at(row, 1)?;
    Ok((
        QueueItem {
            record,
            attempts: row.get(14)?,
            first_delivered: row.get(15)?,
            last_delivered: row.get(16)?,
        },
        size,
    ))
}

impl QueueChannel {
    pub(crate) fn open(
        shared: Arc<Shared>,
        name: &str,
        dlq: Arc<AppendChannel>,
    ) -> contract::Result<Arc<QueueChannel>> {
        let (next, floor, _) = shared.channel_row(name, ChannelKind::Queue)?;
        let (depth, bytes, highest_attempts): (u64, u64, u32) = shared.read(
            || format!("queue {name}: summing its records"),
            |conn| {
                conn.prepare_cached(SQL_TOTALS)?
                    .query_row([name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            },
        )?;
        Ok(Arc::new_cyclic(|me| QueueChannel {
            me: me.clone(),
            shared,
            name: name.to_string(),
            dlq,
            counters: ChannelCounters::new(name, (next, floor, bytes), depth, false),
            max_attempts: AtomicU32::new(contract::DEFAULT_MAX_ATTEMPTS),
            volatile: Mutex::new(Volatile {
                next_delivery_id: 1,
                next_epoch: 1,
                highest_attempts,
                ..Volatile::default()
            }),
        }))
    }

    fn gone(&self, size: u64) {
        self.counters.removed(1, size);
    }

    fn volatile(&self) -> std::sync::MutexGuard<'_, Volatile> {
        self.volatile.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A lease that committed, as the volatile half records it.
    fn held_now(
        &self,
        v: &mut Volatile,
        asked: &LeaseRequest,
        item: QueueItem,
        size: u64,
    ) -> Lease {
        let delivery_id = v.next_delivery_id;
        v.next_delivery_id += 1;
        let epoch = v.next_epoch;
        v.next_epoch += 1;
        v.not_before.remove(&asked.offset);
        v.highest_attempts = v.highest_attempts.max(item.attempts);
        v.by_id.insert(delivery_id, asked.offset);
        v.held.insert(
            asked.offset,
            Delivery {
                delivery_id,
                epoch,
                holder: asked.holder.clone(),
                until: asked.lease_until,
                attempts: item.attempts,
                first_delivered: item.first_delivered,
                last_delivered: item.last_delivered,
                size,
                record: item.record.clone(),
            },
        );
        Lease {
            delivery_id,
            epoch,
            attempts: item.attempts,
            offset: asked.offset,
            record: item.record,
        }
    }

    /// Moves records to the dead-letter channel and removes them from the
    /// queue in ONE relief transaction. On failure neither half happened and
    /// the dead-letter offsets taken are handed back (the counters move only
    /// after the commit). Returns each moved record's dlq offset.
    fn move_to_dead_letter(&self, moves: Vec<(u64, Record)>) -> contract::Result<Vec<u64>> {
        let target = self.dlq.target()?;
        let mut w = self.shared.writer()?;
        let mut pending = vec![(Arc::clone(&target), Pending::of(&*target))];
        let result = w.txn(true, |conn| {
            let mut dlq_offsets = Vec::with_capacity(moves.len());
            for (offset, record) in &moves {
                let stored = target
                    .stage(conn, &mut pending[0].1, record)?
                    .ok_or(rusqlite::Error::InvalidQuery)?;
                dlq_offsets.push(stored);
                delete_item(conn, &self.name, *offset)?;
            }
            write_counter_rows(conn, &pending)?;
            Ok(dlq_offsets)
        });
        match result {
            Ok(offsets) => {
                publish_counters(pending);
                Ok(offsets)
            }
            Err(e) => Err(self.shared.write_error(
                Some(w.conn()),
                format!("queue {}: moving to {}", self.name, target.name()),
                0,
                &e,
            )),
        }
    }

    /// The offset delivery `delivery_id` holds when `epoch` is still its
    /// current one; a stale id is forgotten.
    fn current(v: &mut Volatile, delivery_id: u64, epoch: u64) -> Option<u64> {
        let offset = *v.by_id.get(&delivery_id)?;
        let Some(d) = v.held.get(&offset) else {
            v.by_id.remove(&delivery_id);
            return None;
        };
        (d.epoch == epoch && d.delivery_id == delivery_id).then_some(offset)
    }

    /// A resolution committed: the delivery and its record are gone.
    fn resolved_now(&self, v: &mut Volatile, offset: u64, delivery_id: u64) {
        if let Some(d) = v.held.remove(&offset) {
            self.gone(d.size);
        }
        v.by_id.remove(&delivery_id);
        self.shared.set_publishes_full(false);
    }

    /// One resolution in a transaction of its own.
    fn resolve_in(&self, v: &mut Volatile, delivery_id: u64, epoch: u64) -> contract::Result<bool> {
        let Some(offset) = Self::current(v, delivery_id, epoch) else {
            return Ok(false);
        };
        let mut w = self.shared.writer()?;
        match w.txn(true, |conn| delete_item(conn, &self.name, offset)) {
            Ok(_) => {
                drop(w);
                self.resolved_now(v, offset, delivery_id);
                Ok(true)
            }
            Err(e) => Err(self.shared.write_error(
                Some(w.conn()),
                format!("queue {}: resolving offset {offset}", self.name),
                0,
                &e,
            )),
        }
    }

    fn read_items(&self) -> contract::Result<Vec<(QueueItem, u64)>> {
        self.shared.read(
            || format!("queue {}: reading its records", self.name),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_ITEMS)?;
                let rows = stmt.query_map([&self.name], item_at)?;
                rows.collect()
            },
        )
    }
}

fn delete_item(conn: &Connection, channel: &str, offset: u64) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM queue_items WHERE channel = ?1 AND offset = ?2")?
        .execute(rusqlite::params![channel, offset])
}

impl QueueChannel {
    pub(crate) fn target(&self) -> contract::Result<Target> {
        target_of(&self.me, &self.shared.name)
    }
}

impl QueueStore for QueueChannel {
    fn name(&self) -> &str {
        &self.name
    }

    fn enqueue(&self, record: Record) -> contract::Result<Record> {
        contract::check_record(&self.name, &record, false)?;
        let target = self.target()?;
        match self
            .shared
            .batcher
            .submit(&self.shared, Job { target, record })?
        {
            Some(stored) => Ok(stored),
            None => Err(StorageError::Write {
                context: format!("queue {}", self.name),
                detail: "the job was not stored".into(),
            }),
        }
    }

    fn enqueue_many(&self, records: Vec<Record>) -> Vec<contract::Result<Record>> {
        let Ok(target) = self.target() else {
            return records
                .iter()
                .map(|_| {
                    Err(StorageError::Closed {
                        provider: self.shared.name.clone(),
                    })
                })
                .collect();
        };
        // A refused job is answered alone; the rest share transactions.
        self.shared.batcher.submit_checked(
            &self.shared,
            &target,
            records,
            |record| contract::check_record(&self.name, record, false),
            || StorageError::Write {
                context: format!("queue {}", self.name),
                detail: "the job was not stored".into(),
            },
        )
    }

    fn set_max_bytes(&self, max_bytes: Option<u64>) {
        self.counters.set_max_bytes(max_bytes);
    }

    fn max_bytes(&self) -> Option<u64> {
        self.counters.max_bytes()
    }

    fn bytes(&self) -> u64 {
        self.counters.bytes()
    }

    fn depth(&self) -> u64 {
        self.counters.count()
    }

    fn next(&self) -> u64 {
        self.counters.next()
    }

    fn set_backoff(&self, gaps: Vec<Duration>) {
        self.volatile().backoff = gaps;
    }

    fn set_max_attempts(&self, max_attempts: u32) {
        self.max_attempts
            .store(max_attempts.max(1), Ordering::Release);
    }

    fn offer(&self, max: usize, now: UnixNanos) -> contract::Result<Vec<QueueItem>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // Records out with a worker or waiting out a backoff live in memory,
        // not in the table: the query reads on past them and they are
        // skipped here, under the lock (what a copy of them cost grew with
        // every record waiting), from where the last offer found the first
        // it could hand out.
        let max_attempts = self.max_attempts.load(Ordering::Acquire);
        let mut v = self.volatile();
        let v = &mut *v;
        let mut scan = v.offers.start(now);
        let out = self.shared.read(
            || format!("queue {}: offering", self.name),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_ITEMS_FROM)?;
                let mut rows = stmt.query(rusqlite::params![self.name, scan.from])?;
                let mut out = Vec::new();
                while let Some(row) = rows.next()? {
                    let offset: u64 = row.get(0)?;
                    let attempts: u32 = row.get(14)?;
                    if v.held.contains_key(&offset)
                        || v.not_before.get(&offset).is_some_and(|&t| t > now)
                    {
                        scan.waiting(offset);
                        continue;
                    }
                    scan.free();
                    if contract::attempts_spent(attempts, max_attempts) {
                        continue;
                    }
                    out.push(item_at(row)?.0);
                    if out.len() >= max {
                        break;
                    }
                }
                Ok(out)
            },
        );
        v.offers.finish(scan);
        out
    }

    fn lease(
        &self,
        offset: u64,
        holder: &str,
        lease_until: UnixNanos,
        now: UnixNanos,
    ) -> contract::Result<Lease> {
        let asked = LeaseRequest {
            offset,
            holder: holder.to_owned(),
            lease_until,
            now,
        };
        self.lease_many(vec![asked]).pop().unwrap_or_else(|| {
            Err(StorageError::Invalid {
                what: format!("queue {}: lease of offset {offset}", self.name),
                detail: "no answer".into(),
            })
        })
    }

    fn lease_many(&self, asked: Vec<LeaseRequest>) -> Vec<contract::Result<Lease>> {
        let max_attempts = self.max_attempts.load(Ordering::Acquire);
        let unavailable = |offset: u64, why: String| StorageError::Invalid {
            what: format!("queue {}: lease of offset {offset}", self.name),
            detail: why,
        };
        let mut v = self.volatile();
        let mut answers: Vec<Option<contract::Result<Lease>>> = Vec::with_capacity(asked.len());
        let mut todo = Vec::new();
        for (i, a) in asked.iter().enumerate() {
            if let Some(d) = v.held.get(&a.offset) {
                answers.push(Some(Err(unavailable(
                    a.offset,
                    format!("held by {}", d.holder),
                ))));
            } else if v.not_before.get(&a.offset).is_some_and(|&t| t > a.now) {
                answers.push(Some(Err(unavailable(
                    a.offset,
                    "waiting out its backoff".into(),
                ))));
            } else {
                answers.push(None);
                todo.push(i);
            }
        }
        if !todo.is_empty() {
            let mut w = match self.shared.writer() {
                Ok(w) => w,
                Err(e) => {
                    let detail = e.to_string();
                    for &i in &todo {
                        answers[i] = Some(Err(StorageError::Write {
                            context: format!(
                                "queue {}: leasing offset {}",
                                self.name, asked[i].offset
                            ),
                            detail: detail.clone(),
                        }));
                    }
                    return answers.into_iter().flatten().collect();
                }
            };
            // The one write a lease makes: the attempt count. A relief
            // write; the leases of one call share the transaction.
            let rows = w.txn(true, |conn| {
                let mut stmt = conn.prepare_cached(concat!(
                    "UPDATE queue_items SET attempts = attempts + 1,
                         first_delivered = CASE WHEN first_delivered = 0 THEN ?3 ELSE first_delivered END,
                         last_delivered = ?3
                     WHERE channel = ?1 AND offset = ?2 AND attempts < ?4 -- attempts not spent (contract::attempts_spent)
                     RETURNING offset, ",
                    record_columns!(),
                    ", attempts, first_delivered, last_delivered"
                ))?;
                todo.iter()
                    .map(|&i| {
                        let a = &asked[i];
                        stmt.query_row(
                            rusqlite::params![self.name, a.offset, a.now, max_attempts],
                            item_at,
                        )
                        .optional()
                    })
                    .collect::<rusqlite::Result<Vec<_>>>()
            });
            match rows {
                Ok(rows) => {
                    drop(w);
                    for (&i, row) in todo.iter().zip(rows) {
                        let a = &asked[i];
                        answers[i] = Some(match row {
                            Some((item, size)) => Ok(self.held_now(&mut v, a, item, size)),
                            None => Err(unavailable(
                                a.offset,
                                "no unresolved record there, or its attempts are spent".into(),
                            )),
                        });
                    }
                }
                Err(e) => {
                    for &i in &todo {
                        answers[i] = Some(Err(self.shared.write_error(
                            Some(w.conn()),
                            format!("queue {}: leasing offset {}", self.name, asked[i].offset),
                            0,
                            &e,
                        )));
                    }
                }
            }
        }
        answers.into_iter().flatten().collect()
    }

    fn resolve(&self, delivery_id: u64, epoch: u64) -> contract::Result<bool> {
        let mut v = self.volatile();
        self.resolve_in(&mut v, delivery_id, epoch)
    }

    fn resolve_many(&self, asked: Vec<(u64, u64)>) -> Vec<contract::Result<bool>> {
        let mut v = self.volatile();
        if asked.len() == 1 {
            let (delivery_id, epoch) = asked[0];
            return vec![self.resolve_in(&mut v, delivery_id, epoch)];
        }
        // The deliveries still current, each once: a second resolution of
        // one delivery answers false, as it would after the first alone.
        let mut answers: Vec<Option<contract::Result<bool>>> = Vec::with_capacity(asked.len());
        let mut todo: Vec<(usize, u64)> = Vec::new();
        for (i, &(delivery_id, epoch)) in asked.iter().enumerate() {
            match Self::current(&mut v, delivery_id, epoch) {
                Some(offset) if !todo.iter().any(|&(_, o)| o == offset) => {
                    answers.push(None);
                    todo.push((i, offset));
                }
                _ => answers.push(Some(Ok(false))),
            }
        }
        if todo.is_empty() {
            return answers.into_iter().flatten().collect();
        }
        let result = match self.shared.writer() {
            Ok(mut w) => w
                .txn(true, |conn| {
                    for &(_, offset) in &todo {
                        delete_item(conn, &self.name, offset)?;
                    }
                    Ok(())
                })
                .is_ok(),
            Err(_) => false,
        };
        if result {
            for &(i, offset) in &todo {
                self.resolved_now(&mut v, offset, asked[i].0);
                answers[i] = Some(Ok(true));
            }
        } else {
            // Nothing of the shared transaction was kept: each alone, with
            // the answer it would have had alone.
            for &(i, _) in &todo {
                let (delivery_id, epoch) = asked[i];
                answers[i] = Some(self.resolve_in(&mut v, delivery_id, epoch));
            }
        }
        answers.into_iter().flatten().collect()
    }

    fn release(
        &self,
        delivery_id: u64,
        epoch: u64,
        now: UnixNanos,
        reason: &str,
    ) -> contract::Result<Released> {
        let max_attempts = self.max_attempts.load(Ordering::Acquire);
        let mut v = self.volatile();
        let Some(&offset) = v.by_id.get(&delivery_id) else {
            return Ok(Released::Stale);
        };
        let Some(d) = v.held.get(&offset) else {
            v.by_id.remove(&delivery_id);
            return Ok(Released::Stale);
        };
        if d.epoch != epoch || d.delivery_id != delivery_id {
            return Ok(Released::Stale);
        }
        let after = contract::after_failed_delivery(d.attempts, max_attempts, &v.backoff, now);
        let not_before = match after {
            contract::AfterFailure::RetryAt(not_before) => not_before,
            contract::AfterFailure::DeadLetter => {
                let record = contract::dead_letter_record(
                    d.record.clone(),
                    d.attempts,
                    d.first_delivered,
                    d.last_delivered,
                    now,
                    reason,
                );
                let size = d.size;
                // On failure the record is still held, with the attempts it had.
                let dlq_offsets = self.move_to_dead_letter(vec![(offset, record)])?;
                v.held.remove(&offset);
                v.by_id.remove(&delivery_id);
                self.gone(size);
                let dlq_offset = dlq_offsets.first().copied().unwrap_or(0);
                return Ok(Released::DeadLettered { offset, dlq_offset });
            }
        };
        v.held.remove(&offset);
        v.by_id.remove(&delivery_id);
        v.not_before.insert(offset, not_before);
        v.offers.backoff(offset, not_before);
        Ok(Released::Retry { offset, not_before })
    }

    fn expired_leases(&self, now: UnixNanos) -> Vec<ExpiredLease> {
        let v = self.volatile();
        let mut out: Vec<ExpiredLease> = v
            .held
            .iter()
            .filter(|(_, d)| d.until <= now)
            .map(|(&offset, d)| ExpiredLease {
                delivery_id: d.delivery_id,
                epoch: d.epoch,
                offset,
                holder: d.holder.clone(),
            })
            .collect();
        out.sort_by_key(|e| e.offset);
        out
    }

    fn expire_older_than(&self, cutoff: UnixNanos) -> contract::Result<Removed> {
        let mut v = self.volatile();
        let mut w = self.shared.writer()?;
        // Walk from the oldest: held records are skipped (a worker has them),
        // the first free one that stays ends the walk, and a timestamp of 0
        // is never too old.
        let held: std::collections::HashSet<u64> = v.held.keys().copied().collect();
        let result = w.txn(false, |conn| {
            let mut doomed = Vec::new();
            {
                let mut stmt = conn.prepare_cached(
                    "SELECT offset, timestamp, size FROM queue_items WHERE channel = ?1 ORDER BY offset",
                )?;
                let mut rows = stmt.query([&self.name])?;
                while let Some(row) = rows.next()? {
                    let offset: u64 = row.get(0)?;
                    if held.contains(&offset) {
                        continue;
                    }
                    let ts: i64 = row.get(1)?;
                    if ts == 0 || ts >= cutoff {
                        break;
                    }
                    doomed.push((offset, row.get::<_, u64>(2)?));
                }
            }
            for (offset, _) in &doomed {
                delete_item(conn, &self.name, *offset)?;
            }
            Ok(doomed)
        });
        match result {
            Ok(doomed) => {
                drop(w);
                let mut removed = Removed::default();
                self.shared.set_publishes_full(false);
                for (offset, size) in doomed {
                    v.not_before.remove(&offset);
                    self.gone(size);
                    removed.records += 1;
                    removed.bytes += size;
                }
                Ok(removed)
            }
            Err(e) => Err(self.shared.write_error(
                Some(w.conn()),
                format!("queue {}: expiring records", self.name),
                0,
                &e,
            )),
        }
    }

    fn dead_letter_spent(&self, now: UnixNanos) -> contract::Result<u64> {
        let max_attempts = self.max_attempts.load(Ordering::Acquire);
        let mut v = self.volatile();
        if !contract::attempts_spent(v.highest_attempts, max_attempts) {
            return Ok(0);
        }
        let spent: Vec<(QueueItem, u64)> = self
            .shared
            .read(
                || format!("queue {}: reading its spent records", self.name),
                |conn| {
                    let mut stmt = conn.prepare_cached(SQL_SPENT)?;
                    let rows =
                        stmt.query_map(rusqlite::params![self.name, max_attempts], item_at)?;
                    rows.collect::<rusqlite::Result<Vec<_>>>()
                },
            )?
            .into_iter()
            .filter(|(item, _)| {
                debug_assert!(contract::attempts_spent(item.attempts, max_attempts));
                !v.held.contains_key(&item.record.offset)
            })
            .collect();
        if spent.is_empty() {
            return Ok(0);
        }
        let moves: Vec<(u64, Record)> = spent
            .iter()
            .map(|(item, _)| {
                (
                    item.record.offset,
                    contract::dead_letter_record(
                        item.record.clone(),
                        item.attempts,
                        item.first_delivered,
                        item.last_delivered,
                        now,
                        "attempts spent before a restart",
                    ),
                )
            })
            .collect();
        let moved = self.move_to_dead_letter(moves)?;
        for (item, size) in &spent {
            v.not_before.remove(&item.record.offset);
            self.gone(*size);
        }
        Ok(moved.len() as u64)
    }

    fn dead_letter(&self) -> Arc<dyn AppendStore> {
        Arc::clone(&self.dlq) as Arc<dyn AppendStore>
    }

    fn items(&self) -> contract::Result<Vec<QueueItem>> {
        Ok(self
            .read_items()?
            .into_iter()
            .map(|(item, _)| item)
            .collect())
    }
}

impl RowPerRecord for QueueChannel {
    const INSERT_ROW: &'static str = SQL_INSERT;
    fn row_counters(&self) -> &ChannelCounters {
        &self.counters
    }
}
