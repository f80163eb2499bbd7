//! Group commit (RFC 0004 "Group commit: one transaction, several
//! publishes").
//!
//! A publish that finds no transaction committing leads one of its own at
//! once; the publishes that arrive while it commits are stored together in
//! the next, up to `publish_commit_max_records`, which the first of them
//! leads the moment the previous one ends. With a `publish_commit_interval`
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
use super::latest::LatestChannel;
use super::queue::QueueChannel;
use super::row::Encoded;
use super::schema::RECORD_COLUMNS;
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
    Delete(Arc<LatestChannel>, String),
}

/// What a publish is answered with: the record as stored, or `None` for a
/// deletion of a topic that held nothing (no offset taken).
pub(crate) type Outcome = contract::Result<Option<Record>>;

struct Waiting {
    ticket: u64,
    job: Job,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Waiting>,
    done: HashMap<u64, Outcome>,
    /// The ticket whose caller leads the next batch.
    leader: Option<u64>,
    next_ticket: u64,
}

pub(crate) struct Batcher {
    interval: Option<Duration>,
    max_records: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Batcher {
    pub fn new(interval: Option<Duration>, max_records: usize) -> Batcher {
        Batcher {
            interval,
            max_records: max_records.max(1),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// Stores one publish and returns when the transaction holding it has
    /// committed (or failed): invariant 18's "answered only after".
    pub fn submit(&self, shared: &Shared, job: Job) -> Outcome {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.queue.push_back(Waiting { ticket, job });
        if st.leader.is_none() {
            st.leader = Some(ticket);
        } else {
            // A leader waiting out an interval counts its company.
            self.changed.notify_all();
        }
        loop {
            if let Some(outcome) = st.done.remove(&ticket) {
                return outcome;
            }
            if st.leader == Some(ticket) {
                if let Some(interval) = self.interval {
                    let opened = Instant::now();
                    while st.queue.len() < self.max_records {
                        let left = interval.saturating_sub(opened.elapsed());
                        if left.is_zero() {
                            break;
                        }
                        st = self
                            .changed
                            .wait_timeout(st, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
                let take = st.queue.len().min(self.max_records);
                let batch: Vec<Waiting> = st.queue.drain(..take).collect();
                drop(st);
                let outcomes = run_batch(shared, batch);
                st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                st.done.extend(outcomes);
                st.leader = st.queue.front().map(|w| w.ticket);
                self.changed.notify_all();
                continue;
            }
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A channel's counters as the batch moves them, before they are committed.
pub(crate) struct Pending {
    pub next: u64,
    pub bytes: u64,
    pub count: u64,
    /// Latest channels: topic -> the size it now holds (None = deleted).
    pub topics: HashMap<String, Option<u64>>,
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

/// Writes one publish into the open transaction at the channel's pending
/// next offset. Used by group commit and by a held publish's release.
pub(crate) fn stage(
    conn: &Connection,
    target: &Target,
    pending: &mut Pending,
    record: Record,
) -> rusqlite::Result<Record> {
    let mut record = record;
    record.offset = pending.next;
    let encoded = Encoded::new(&record);
    let name = target.name();
    match target {
        Target::Append(_) => {
            let mut stmt = conn.prepare_cached(&format!(
                "INSERT INTO records (channel, offset, {RECORD_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ))?;
            let p = encoded.params();
            stmt.execute(rusqlite::params![
                name,
                record.offset,
                p[0],
                p[1],
                p[2],
                p[3],
                p[4],
                p[5],
                p[6],
                p[7],
                p[8],
                p[9],
                p[10],
                p[11],
                p[12]
            ])?;
            pending.bytes += encoded.size;
            pending.count += 1;
        }
        Target::Queue(_) => {
            let mut stmt = conn.prepare_cached(&format!(
                "INSERT INTO queue_items (channel, offset, {RECORD_COLUMNS}, attempts, first_delivered, last_delivered)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, 0, 0, 0)"
            ))?;
            let p = encoded.params();
            stmt.execute(rusqlite::params![
                name,
                record.offset,
                p[0],
                p[1],
                p[2],
                p[3],
                p[4],
                p[5],
                p[6],
                p[7],
                p[8],
                p[9],
                p[10],
                p[11],
                p[12]
            ])?;
            pending.bytes += encoded.size;
            pending.count += 1;
        }
        Target::Latest(channel) => {
            let mut stmt = conn.prepare_cached(&format!(
                "INSERT INTO latest_values (channel, offset, deleted, {RECORD_COLUMNS})
                 VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
                 ON CONFLICT (channel, topic) DO UPDATE SET offset = excluded.offset, deleted = 0,
                     message_id = excluded.message_id, timestamp = excluded.timestamp,
                     headers = excluded.headers, payload = excluded.payload, props = excluded.props,
                     retain = excluded.retain, bridge = excluded.bridge, client_id = excluded.client_id,
                     qos = excluded.qos, shared_copy = excluded.shared_copy, owed_to = excluded.owed_to,
                     size = excluded.size"
            ))?;
            let p = encoded.params();
            stmt.execute(rusqlite::params![
                name,
                record.offset,
                p[0],
                p[1],
                p[2],
                p[3],
                p[4],
                p[5],
                p[6],
                p[7],
                p[8],
                p[9],
                p[10],
                p[11],
                p[12]
            ])?;
            let before = current_size(channel, pending, &record.topic);
            match before {
                Some(old) => pending.bytes = pending.bytes.saturating_sub(old),
                None => pending.count += 1,
            }
            pending.bytes += encoded.size;
            pending
                .topics
                .insert(record.topic.clone(), Some(encoded.size));
        }
    }
    pending.next += 1;
    Ok(record)
}

/// The size a latest topic holds as the batch sees it.
fn current_size(channel: &LatestChannel, pending: &Pending, topic: &str) -> Option<u64> {
    match pending.topics.get(topic) {
        Some(size) => *size,
        None => channel.topic_size(topic),
    }
}

/// Deletes a latest topic inside the open transaction, taking an offset
/// only when the topic held a value. The row stays as the deletion's marker
/// so a resuming consumer learns of it.
pub(crate) fn stage_delete(
    conn: &Connection,
    channel: &LatestChannel,
    pending: &mut Pending,
    topic: &str,
) -> rusqlite::Result<Option<Record>> {
    let Some(old) = current_size(channel, pending, topic) else {
        return Ok(None);
    };
    let offset = pending.next;
    conn.prepare_cached(
        "UPDATE latest_values SET offset = ?3, deleted = 1, payload = X'', headers = NULL, props = NULL,
             size = 0 WHERE channel = ?1 AND topic = ?2",
    )?
    .execute(rusqlite::params![channel.name_str(), topic, offset])?;
    pending.bytes = pending.bytes.saturating_sub(old);
    pending.count = pending.count.saturating_sub(1);
    pending.topics.insert(topic.to_string(), None);
    pending.next += 1;
    let mut marker = Record::new(topic, bytes::Bytes::new());
    marker.offset = offset;
    Ok(Some(marker))
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

fn run_batch(shared: &Shared, batch: Vec<Waiting>) -> Vec<(u64, Outcome)> {
    let mut outcomes: Vec<(u64, Outcome)> = Vec::with_capacity(batch.len());
    let mut writer = match shared.writer() {
        Ok(w) => w,
        Err(_) => {
            return batch
                .into_iter()
                .map(|w| {
                    (
                        w.ticket,
                        Err(StorageError::Closed {
                            provider: shared.name.clone(),
                        }),
                    )
                })
                .collect()
        }
    };
    // Property 3: a channel's own bound refuses one record, before the
    // transaction, counting what this batch already accepted for it.
    let mut touched: Vec<(Target, Pending)> = Vec::new();
    let mut index_of: HashMap<String, usize> = HashMap::new();
    let mut accepted: Vec<(u64, Job, u64)> = Vec::with_capacity(batch.len());
    for Waiting { ticket, job } in batch {
        let target = match &job {
            Job::Put(t, _) => t.clone(),
            Job::Delete(c, _) => Target::Latest(Arc::clone(c)),
        };
        let idx = *index_of
            .entry(target.name().to_string())
            .or_insert_with(|| {
                touched.push((target.clone(), counters_of(&target)));
                touched.len() - 1
            });
        let size = match &job {
            Job::Put(_, r) => r.accounted_size(),
            Job::Delete(..) => 0,
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
        return outcomes;
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
                    let idx = index_of[target.name()];
                    let (t, pending) = &mut touched[idx];
                    Some(stage(conn, t, pending, record.clone())?)
                }
                Job::Delete(channel, topic) => {
                    let idx = index_of[channel.name_str()];
                    stage_delete(conn, channel, &mut touched[idx].1, topic)?
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
            drop(writer);
            for ((ticket, _, _), record) in accepted.into_iter().zip(stored) {
                outcomes.push((ticket, Ok(record)));
            }
        }
        Err(e) => {
            // Property 1: nothing moved in memory, so every offset the batch
            // took is handed back by construction.
            let conn = writer.conn();
            for (ticket, job, size) in accepted {
                let context = match &job {
                    Job::Put(t, _) => format!("channel {}: storing a publish", t.name()),
                    Job::Delete(c, topic) => format!("channel {}: deleting {topic}", c.name_str()),
                };
                outcomes.push((
                    ticket,
                    Err(shared.write_error(Some(conn), context, size, &e)),
                ));
            }
        }
    }
    outcomes
}
