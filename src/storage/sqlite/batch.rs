//! Group commit: one transaction, several publishes.
//!
//! A publish that finds no transaction committing leads one of its own at
//! once; the publishes that arrive while it commits are stored together in
//! the next, up to `publish_commit_max_records`, which starts the moment the
//! previous one ends: its leader goes on to lead it (up to `LEAD_TURNS`
//! batches in a row), so the writer never waits for a sleeping publisher
//! to be scheduled, and then hands the lead to the first publisher queued. With a `publish_commit_interval`
//! the leader waits for company - holding nothing, not even the writer -
//! until the batch fills or the interval since it began runs out.
//!
//! The three properties the code is arranged around:
//! 1. Offsets are taken in transaction order: they are assigned while the
//!    writer is held, from the committed counters, and only a commit moves
//!    the counters in memory - so a failed batch hands back exactly what it
//!    took (nothing was published) and none is reused or skipped.
//! 2. Each channel's counter row is written once per batch, carrying the
//!    totals of every record in it.
//! 3. A refusal is one record's: a channel's `max_bytes` is checked before
//!    the transaction opens, and the records beside a refused one still
//!    commit. A failure is the batch's: what can fail inside is the provider
//!    being full or the file unwritable, and each publish in the batch is
//!    answered with what it would have been answered alone.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use saguin_format::model::Record;

use super::append::AppendChannel;
use super::latest::{LatestChannel, LatestEntry};
use super::queue::QueueChannel;
use super::row::Encoded;
use super::schema::record_columns;
use super::Shared;
use crate::storage::contract::{self, StorageError};

/// Where a publish goes.
#[derive(Clone)]
pub(crate) enum Target {
    Append(Arc<AppendChannel>),
    Latest(Arc<LatestChannel>),
    Queue(Arc<QueueChannel>),
}

impl Target {
    fn name(&self) -> &str {
        match self {
            Target::Append(c) => c.name_str(),
            Target::Latest(c) => c.name_str(),
            Target::Queue(c) => c.name_str(),
        }
    }
}

/// One publish path: a record appended, a value replaced (or deleted), a
/// job enqueued.
#[allow(clippy::large_enum_variant)] // Put is the common case; boxing it would cost an allocation per publish.
pub(crate) enum Job {
    Put(Target, Record),
    /// A latest channel's topic deleted.
    Delete(Arc<LatestChannel>, Record),
}

/// What a publish is answered with: the record as stored, or `None` for a
/// deletion of a topic that held nothing (no offset taken).
pub(crate) type Outcome = contract::Result<Option<Record>>;

/// What a waiting publisher is told: lead the next batch, or its answer.
#[allow(clippy::large_enum_variant)] // one per publish, never boxed: the answer moves out once.
enum Turn {
    Waiting,
    Lead,
    Done(Outcome),
}

/// One publisher's place: it sleeps on its own condition variable, so a
/// batch ending wakes exactly the publishers in it and the next leader,
/// not every waiter.
struct Slot {
    turn: Mutex<Turn>,
    woken: Condvar,
}

impl Slot {
    fn tell(&self, turn: Turn) {
        *self.turn.lock().unwrap_or_else(|e| e.into_inner()) = turn;
        self.woken.notify_one();
    }
}

struct Waiting {
    slot: Arc<Slot>,
    job: Job,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Waiting>,
    /// A batch is being collected or committed; its leader hands the next
    /// one to the publisher at the front of the queue.
    leading: bool,
}

/// How many batches in a row one publisher leads before handing the lead
/// on. Handing it on after every batch left the writer idle until the woken
/// publisher was scheduled, and on a 2-vCPU machine under load that kept
/// batches at 1.5 publishes with eight publishers; leading on while anything
/// is queued brought them to about five. The bound keeps the leader's own
/// answer from being held back for more than this many commits.
const LEAD_TURNS: usize = 32;

pub(crate) struct Batcher {
    interval: Option<Duration>,
    max_records: usize,
    state: Mutex<State>,
    /// Wakes a leader waiting out the interval when its batch has filled.
    arrived: Condvar,
}

impl Batcher {
    pub fn new(interval: Option<Duration>, max_records: usize) -> Batcher {
        Batcher {
            interval,
            max_records: max_records.max(1),
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
        }
    }

    /// Stores one publish and returns when the transaction holding it has
    /// committed (or failed): invariant 18's "answered only after".
    pub fn submit(&self, shared: &Shared, job: Job) -> Outcome {
        let slot = Arc::new(Slot {
            turn: Mutex::new(Turn::Waiting),
            woken: Condvar::new(),
        });
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.queue.push_back(Waiting {
                slot: Arc::clone(&slot),
                job,
            });
            if st.leading {
                // A leader waiting out an interval is woken only when the
                // batch has filled: it wakes at the interval's end anyway,
                // and waking it on every arrival costs a context switch
                // each. A leader that does not wait has nobody to wake.
                if self.interval.is_some() && st.queue.len() >= self.max_records {
                    self.arrived.notify_one();
                }
            } else {
                st.leading = true;
                *slot.turn.lock().unwrap_or_else(|e| e.into_inner()) = Turn::Lead;
            }
        }
        {
            let mut turn = slot.turn.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                match std::mem::replace(&mut *turn, Turn::Waiting) {
                    Turn::Done(outcome) => return outcome,
                    Turn::Lead => break,
                    Turn::Waiting => {
                        turn = slot.woken.wait(turn).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
        }
        self.lead(shared, &slot)
    }

    /// Stores several publishes of one caller, in order, sharing
    /// transactions with each other (and with other publishers): one
    /// answer per job, each returned after the commit holding it.
    pub fn submit_many(&self, shared: &Shared, jobs: Vec<Job>) -> Vec<Outcome> {
        let slots: Vec<Arc<Slot>> = jobs
            .iter()
            .map(|_| {
                Arc::new(Slot {
                    turn: Mutex::new(Turn::Waiting),
                    woken: Condvar::new(),
                })
            })
            .collect();
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            for (slot, job) in slots.iter().zip(jobs) {
                st.queue.push_back(Waiting {
                    slot: Arc::clone(slot),
                    job,
                });
            }
            if st.leading {
                if self.interval.is_some() && st.queue.len() >= self.max_records {
                    self.arrived.notify_one();
                }
            } else if let Some(first) = slots.first() {
                st.leading = true;
                *first.turn.lock().unwrap_or_else(|e| e.into_inner()) = Turn::Lead;
            }
        }
        slots
            .iter()
            .map(|slot| {
                let mut turn = slot.turn.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    match std::mem::replace(&mut *turn, Turn::Waiting) {
                        Turn::Done(outcome) => return outcome,
                        Turn::Lead => {
                            drop(turn);
                            return self.lead(shared, slot);
                        }
                        Turn::Waiting => {
                            turn = slot.woken.wait(turn).unwrap_or_else(|e| e.into_inner());
                        }
                    }
                }
            })
            .collect()
    }

    /// Collects, commits and answers batches - this publisher's own job is
    /// at the front of the queue when it starts - then hands the lead on.
    ///
    /// After a commit the leader goes on to lead the next batch itself while
    /// one is ready without waiting for company (anything queued with no
    /// interval; a full batch with one), up to [`LEAD_TURNS`] batches: handing
    /// the lead to a sleeping publisher leaves the writer idle until the
    /// scheduler runs it, which on a busy machine is longer than a commit.
    /// Its own answer is already decided by then; it is returned when the
    /// lead is handed on, which is still after its commit (invariant 18).
    fn lead(&self, shared: &Shared, me: &Arc<Slot>) -> Outcome {
        let mut mine = None;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(interval) = self.interval {
            // The leader waits for company holding nothing but this queue:
            // the writer is free for reads meanwhile.
            let opened = Instant::now();
            while st.queue.len() < self.max_records {
                let left = interval.saturating_sub(opened.elapsed());
                if left.is_zero() {
                    break;
                }
                st = self
                    .arrived
                    .wait_timeout(st, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        for turn in 1.. {
            let take = st.queue.len().min(self.max_records);
            let batch: Vec<Waiting> = st.queue.drain(..take).collect();
            drop(st);
            let (slots, jobs): (Vec<Arc<Slot>>, Vec<Job>) =
                batch.into_iter().map(|w| (w.slot, w.job)).unzip();
            let outcomes = run_batch(shared, jobs);
            for (slot, outcome) in slots.into_iter().zip(outcomes) {
                if Arc::ptr_eq(&slot, me) {
                    mine = Some(outcome);
                } else {
                    slot.tell(Turn::Done(outcome));
                }
            }
            st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let ready = match self.interval {
                None => !st.queue.is_empty(),
                Some(_) => st.queue.len() >= self.max_records,
            };
            if !ready || turn >= LEAD_TURNS {
                break;
            }
        }
        match st.queue.front() {
            Some(next) => next.slot.tell(Turn::Lead),
            None => st.leading = false,
        }
        drop(st);
        mine.unwrap_or_else(|| {
            Err(StorageError::Write {
                context: format!("storage {}", shared.path.display()),
                detail: "the publish was not in the batch its publisher led".into(),
            })
        })
    }
}

/// A channel's counters as the batch moves them, before they are committed.
pub(crate) struct Pending {
    pub next: u64,
    pub bytes: u64,
    pub count: u64,
    /// Latest channels: topic -> the size it now holds (None = deleted).
    pub topics: HashMap<String, Option<LatestEntry>>,
}

pub(crate) fn counters_of(target: &Target) -> Pending {
    let (next, bytes, count) = match target {
        Target::Append(c) => (c.next_value(), c.bytes_value(), c.count_value()),
        Target::Latest(c) => (c.next_value(), c.bytes_value(), c.count_value()),
        Target::Queue(c) => (c.next_value(), c.bytes_value(), c.count_value()),
    };
    Pending {
        next,
        bytes,
        count,
        topics: HashMap::new(),
    }
}

fn max_bytes_of(target: &Target) -> Option<u64> {
    match target {
        Target::Append(c) => c.max_bytes_value(),
        Target::Queue(c) => c.max_bytes_value(),
        Target::Latest(_) => None,
    }
}

// Constant statement texts: the cache is keyed by the text, so building it
// per call would cost an allocation and a hash of it on every publish.
const SQL_INSERT_RECORD: &str = concat!(
    "INSERT INTO records (channel, offset, ",
    record_columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
);
const SQL_INSERT_QUEUE_ITEM: &str = concat!(
    "INSERT INTO queue_items (channel, offset, ",
    record_columns!(),
    ", attempts, first_delivered, last_delivered)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, 0, 0, 0)"
);
const SQL_UPSERT_LATEST: &str = concat!(
    "INSERT INTO latest_values (channel, offset, deleted, ",
    record_columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
     ON CONFLICT (channel, topic) DO UPDATE SET offset = excluded.offset, deleted = excluded.deleted,
         message_id = excluded.message_id, timestamp = excluded.timestamp,
         headers = excluded.headers, payload = excluded.payload, props = excluded.props,
         retain = excluded.retain, bridge = excluded.bridge, client_id = excluded.client_id,
         qos = excluded.qos, shared_copy = excluded.shared_copy, owed_to = excluded.owed_to,
         size = excluded.size"
);

/// Writes one publish into the open transaction at the channel's pending
/// next offset, and returns that offset. Used by group commit, a held
/// publish's release and the dead-letter move.
pub(crate) fn stage(
    conn: &Connection,
    target: &Target,
    pending: &mut Pending,
    record: &Record,
) -> rusqlite::Result<u64> {
    let offset = pending.next;
    let encoded = Encoded::new(record);
    let name = target.name();
    match target {
        Target::Append(_) => {
            let mut stmt = conn.prepare_cached(SQL_INSERT_RECORD)?;
            let p = encoded.params();
            stmt.execute(rusqlite::params![
                name, offset, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10],
                p[11], p[12]
            ])?;
            pending.bytes += encoded.size;
            pending.count += 1;
        }
        Target::Queue(_) => {
            let mut stmt = conn.prepare_cached(SQL_INSERT_QUEUE_ITEM)?;
            let p = encoded.params();
            stmt.execute(rusqlite::params![
                name, offset, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10],
                p[11], p[12]
            ])?;
            pending.bytes += encoded.size;
            pending.count += 1;
        }
        Target::Latest(channel) => {
            upsert_latest(conn, name, offset, &encoded, false)?;
            let before = current(channel, pending, &record.topic);
            match before {
                Some(LatestEntry { size, marker }) => {
                    pending.bytes = pending.bytes.saturating_sub(size);
                    if marker {
                        pending.count += 1;
                    }
                }
                None => pending.count += 1,
            }
            pending.bytes += encoded.size;
            pending.topics.insert(
                record.topic.clone(),
                Some(LatestEntry {
                    size: encoded.size,
                    marker: false,
                }),
            );
        }
    }
    pending.next += 1;
    Ok(offset)
}

/// A latest topic's row as the batch sees it: `None` when there is none.
fn current(channel: &LatestChannel, pending: &Pending, topic: &str) -> Option<LatestEntry> {
    match pending.topics.get(topic) {
        Some(entry) => *entry,
        None => channel.entry(topic),
    }
}

fn upsert_latest(
    conn: &Connection,
    channel: &str,
    offset: u64,
    encoded: &Encoded<'_>,
    deleted: bool,
) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(SQL_UPSERT_LATEST)?;
    let p = encoded.params();
    stmt.execute(rusqlite::params![
        channel, offset, deleted, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9],
        p[10], p[11], p[12]
    ])?;
    Ok(())
}

/// Deletes a latest topic inside the open transaction, taking an offset
/// only when the topic holds a value. The deletion (the record with the
/// empty payload, as the publisher sent it) stays as the topic's marker so
/// a resuming consumer learns of it, and counts its size as the memory
/// provider's does; the retained store keeps no markers.
pub(crate) fn stage_delete(
    conn: &Connection,
    channel: &LatestChannel,
    pending: &mut Pending,
    record: &Record,
) -> rusqlite::Result<Option<u64>> {
    let Some(LatestEntry {
        size: old,
        marker: false,
    }) = current(channel, pending, &record.topic)
    else {
        return Ok(None);
    };
    let offset = pending.next;
    pending.bytes = pending.bytes.saturating_sub(old);
    pending.count = pending.count.saturating_sub(1);
    if channel.keeps_markers() {
        let encoded = Encoded::new(record);
        upsert_latest(conn, channel.name_str(), offset, &encoded, true)?;
        pending.bytes += encoded.size;
        pending.topics.insert(
            record.topic.clone(),
            Some(LatestEntry {
                size: encoded.size,
                marker: true,
            }),
        );
    } else {
        conn.prepare_cached("DELETE FROM latest_values WHERE channel = ?1 AND topic = ?2")?
            .execute(rusqlite::params![channel.name_str(), record.topic])?;
        pending.topics.insert(record.topic.clone(), None);
    }
    pending.next += 1;
    Ok(Some(offset))
}

/// Writes each touched channel's counter row once: next, and bytes where
/// the channel stores them (an append channel; a latest channel and a queue
/// keep theirs in memory).
pub(crate) fn write_counter_rows(
    conn: &Connection,
    touched: &[(Target, Pending)],
) -> rusqlite::Result<()> {
    for (target, pending) in touched {
        match target {
            Target::Append(_) => conn
                .prepare_cached("UPDATE channels SET next = ?2, bytes = ?3 WHERE name = ?1")?
                .execute(rusqlite::params![
                    target.name(),
                    pending.next,
                    pending.bytes
                ])?,
            Target::Latest(_) | Target::Queue(_) => conn
                .prepare_cached("UPDATE channels SET next = ?2 WHERE name = ?1")?
                .execute(rusqlite::params![target.name(), pending.next])?,
        };
    }
    Ok(())
}

/// Moves the in-memory counters to what committed. Called with the writer
/// still held, so nothing reads a counter between the commit and this.
pub(crate) fn publish_counters(touched: Vec<(Target, Pending)>) {
    for (target, pending) in touched {
        match target {
            Target::Append(c) => c.committed(pending.next, pending.bytes, pending.count),
            Target::Queue(c) => c.committed(pending.next, pending.bytes, pending.count),
            Target::Latest(c) => {
                c.committed(pending.next, pending.bytes, pending.count, pending.topics)
            }
        }
    }
}

fn run_batch(shared: &Shared, batch: Vec<Job>) -> Vec<Outcome> {
    let mut outcomes: Vec<(u64, Outcome)> = Vec::with_capacity(batch.len());
    let mut writer = match shared.writer() {
        Ok(w) => w,
        Err(_) => {
            return batch
                .iter()
                .map(|_| {
                    Err(StorageError::Closed {
                        provider: shared.name.clone(),
                    })
                })
                .collect()
        }
    };
    // Property 3: a channel's own bound refuses one record, before the
    // transaction, counting what this batch already accepted for it.
    let mut touched: Vec<(Target, Pending)> = Vec::new();
    let mut accepted: Vec<(u64, Job, u64)> = Vec::with_capacity(batch.len());
    for (ticket, job) in (0u64..).zip(batch) {
        let target = match &job {
            Job::Put(t, _) => t.clone(),
            Job::Delete(c, _) => Target::Latest(Arc::clone(c)),
        };
        // A batch touches few channels: a scan beats hashing every name.
        let idx = match touched.iter().position(|(t, _)| t.name() == target.name()) {
            Some(idx) => idx,
            None => {
                touched.push((target.clone(), counters_of(&target)));
                touched.len() - 1
            }
        };
        let size = match &job {
            Job::Put(_, r) => r.accounted_size(),
            Job::Delete(_, r) => r.accounted_size(),
        };
        if let (Some(max), Job::Put(..)) = (max_bytes_of(&target), &job) {
            let held = touched[idx].1.bytes;
            if held.saturating_add(size) > max {
                outcomes.push((
                    ticket,
                    Err(StorageError::ChannelFull {
                        channel: target.name().to_string(),
                        held,
                        size,
                        max_bytes: max,
                    }),
                ));
                continue;
            }
            // Reserve the room for the rest of this pre-check.
            touched[idx].1.bytes += size;
        }
        accepted.push((ticket, job, size));
    }
    if accepted.is_empty() {
        return in_order(outcomes);
    }
    // The pre-check borrowed the pending bytes; start the transaction from
    // the committed counters again.
    for (target, pending) in touched.iter_mut() {
        *pending = counters_of(target);
    }
    let result = writer.txn(false, |conn| {
        let mut stored = Vec::with_capacity(accepted.len());
        for (_, job, _) in &accepted {
            let out = match job {
                Job::Put(target, record) => {
                    // Every accepted job's channel was entered in `touched`.
                    let (t, pending) = touched
                        .iter_mut()
                        .find(|(t, _)| t.name() == target.name())
                        .ok_or(rusqlite::Error::InvalidQuery)?;
                    Some(stage(conn, t, pending, record)?)
                }
                Job::Delete(channel, record) => {
                    let (_, pending) = touched
                        .iter_mut()
                        .find(|(t, _)| t.name() == channel.name_str())
                        .ok_or(rusqlite::Error::InvalidQuery)?;
                    stage_delete(conn, channel, pending, record)?
                }
            };
            stored.push(out);
        }
        write_counter_rows(conn, &touched)?;
        Ok(stored)
    });
    match result {
        Ok(stored) => {
            publish_counters(touched);
            shared
                .counters
                .publish_batches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            shared
                .counters
                .batched_publishes
                .fetch_add(stored.len() as u64, std::sync::atomic::Ordering::Relaxed);
            shared.set_publishes_full(false);
            drop(writer);
            for ((ticket, job, _), offset) in accepted.into_iter().zip(stored) {
                let answer = match (job, offset) {
                    (Job::Put(_, mut record), Some(offset))
                    | (Job::Delete(_, mut record), Some(offset)) => {
                        record.offset = offset;
                        Some(record)
                    }
                    (_, None) => None,
                };
                outcomes.push((ticket, Ok(answer)));
            }
        }
        Err(e) => {
            // Property 1: nothing moved in memory, so every offset the batch
            // took is handed back by construction.
            if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
                shared.set_publishes_full(true);
            }
            let conn = writer.conn();
            for (ticket, job, size) in accepted {
                let context = match &job {
                    Job::Put(t, _) => format!("channel {}: storing a publish", t.name()),
                    Job::Delete(c, r) => format!("channel {}: deleting {}", c.name_str(), r.topic),
                };
                outcomes.push((
                    ticket,
                    Err(shared.write_error(Some(conn), context, size, &e)),
                ));
            }
        }
    }
    in_order(outcomes)
}

/// The answers in the order the publishes came in the batch.
fn in_order(mut outcomes: Vec<(u64, Outcome)>) -> Vec<Outcome> {
    outcomes.sort_by_key(|(index, _)| *index);
    outcomes.into_iter().map(|(_, outcome)| outcome).collect()
}
