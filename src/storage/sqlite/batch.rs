//! Group commit: one transaction, several publishes, each answered only
//! once it committed (`docs/design.md` storage rule 4).
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

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use saguin_format::model::Record;

use super::channel::{publish_counters, write_counter_rows, Pending, Target};
use super::Shared;
use crate::storage::contract::{self, StorageError};

/// One publish: a record appended, a value replaced (or deleted: an empty
/// payload on a latest channel), a job enqueued.
pub(crate) struct Job {
    pub target: Target,
    pub record: Record,
}

/// What a publish is answered with: the record as stored, or `None` for a
/// deletion of a topic that held nothing (no offset taken).
pub(crate) type Outcome = contract::Result<Option<Record>>;

/// One channel's part of [`Batcher::submit_runs`]: its store, and how
/// that store checks and answers a publish.
pub(crate) struct Run<'a> {
    pub target: Target,
    pub name: &'a str,
    /// An append channel that keeps no record count checks none.
    pub gapped: bool,
    /// A latest channel: an empty payload deletes its topic.
    pub latest: bool,
}

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

    /// Several records of one channel (`target`), in order: each checked
    /// first by `check`, a refused one answered alone, the rest sharing
    /// transactions ([`Batcher::submit_many`]); a job that stored nothing
    /// is answered `nothing()`.
    pub fn submit_checked(
        &self,
        shared: &Shared,
        target: &Target,
        records: Vec<Record>,
        check: impl Fn(&Record) -> contract::Result<()>,
        nothing: impl Fn() -> StorageError,
    ) -> Vec<contract::Result<Record>> {
        let mut answers: Vec<Option<contract::Result<Record>>> = Vec::with_capacity(records.len());
        let mut jobs = Vec::with_capacity(records.len());
        for record in records {
            match check(&record) {
                Ok(()) => {
                    answers.push(None);
                    jobs.push(Job {
                        target: Arc::clone(target),
                        record,
                    });
                }
                Err(e) => answers.push(Some(Err(e))),
            }
        }
        let mut stored = self.submit_many(shared, jobs).into_iter();
        answers
            .into_iter()
            .map(|a| match a {
                Some(refused) => refused,
                None => match stored.next() {
                    Some(Ok(Some(record))) => Ok(record),
                    Some(Ok(None)) | None => Err(nothing()),
                    Some(Err(e)) => Err(e),
                },
            })
            .collect()
    }

    /// Publishes to several channels of this provider, each run's records
    /// in order: each checked as its store checks it, a refused one
    /// answered alone, the rest sharing transactions
    /// ([`Batcher::submit_many`]). A latest channel's deletion of a topic
    /// that held nothing is answered with an empty record, as
    /// `LatestStore::set` answers it.
    pub fn submit_runs(
        &self,
        shared: &Shared,
        runs: Vec<(Run<'_>, Vec<Record>)>,
    ) -> Vec<Vec<contract::Result<Record>>> {
        let mut jobs = Vec::new();
        let mut kept = Vec::with_capacity(runs.len());
        for (run, records) in runs {
            let mut answers = Vec::with_capacity(records.len());
            for record in records {
                match contract::check_record(run.name, &record, run.gapped) {
                    Ok(()) => {
                        // What an empty answer means, kept beside the job.
                        answers
                            .push(Ok((run.latest && record.payload.is_empty())
                                .then(|| record.topic.clone())));
                        jobs.push(Job {
                            target: Arc::clone(&run.target),
                            record,
                        });
                    }
                    Err(e) => answers.push(Err(e)),
                }
            }
            kept.push((run.name, answers));
        }
        let mut stored = self.submit_many(shared, jobs).into_iter();
        kept.into_iter()
            .map(|(name, answers)| {
                answers
                    .into_iter()
                    .map(|answer| {
                        let deletes = answer?;
                        match (stored.next(), deletes) {
                            (Some(Ok(Some(record))), _) => Ok(record),
                            (Some(Ok(None)), Some(topic)) => {
                                Ok(Record::new(topic, bytes::Bytes::new()))
                            }
                            (Some(Err(e)), _) => Err(e),
                            (Some(Ok(None)), None) | (None, _) => Err(StorageError::Write {
                                context: format!("channel {name}"),
                                detail: "the publish stored nothing".into(),
                            }),
                        }
                    })
                    .collect()
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
    // Each job accepted, with its channel's place in `touched`.
    let mut accepted: Vec<(u64, Job, u64, usize)> = Vec::with_capacity(batch.len());
    let mut places = Places::default();
    for (ticket, job) in (0u64..).zip(batch) {
        let name = job.target.name();
        let idx = places.of(name, || {
            touched.push((Arc::clone(&job.target), Pending::of(&*job.target)));
            touched.len() - 1
        });
        let size = job.record.accounted_size();
        let max_bytes = job.target.counters().max_bytes();
        if let Err(full) = contract::check_room(name, touched[idx].1.bytes, max_bytes, size) {
            outcomes.push((ticket, Err(full)));
            continue;
        }
        if max_bytes.is_some() {
            // Reserve the room for the rest of this pre-check.
            touched[idx].1.bytes += size;
        }
        accepted.push((ticket, job, size, idx));
    }
    if accepted.is_empty() {
        return in_order(outcomes);
    }
    // The pre-check borrowed the pending bytes; start the transaction from
    // the committed counters again.
    for (target, pending) in touched.iter_mut() {
        *pending = Pending::of(&**target);
    }
    let result = writer.txn(false, |conn| {
        let mut stored = Vec::with_capacity(accepted.len());
        for (_, job, _, idx) in &accepted {
            // Every accepted job's channel was entered in `touched`.
            let (t, pending) = touched.get_mut(*idx).ok_or(rusqlite::Error::InvalidQuery)?;
            stored.push(t.stage(conn, pending, &job.record)?);
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
            shared.room_again();
            drop(writer);
            for ((ticket, job, _, _), offset) in accepted.into_iter().zip(stored) {
                let answer = offset.map(|offset| {
                    let mut record = job.record;
                    record.offset = offset;
                    record
                });
                outcomes.push((ticket, Ok(answer)));
            }
        }
        Err(e) => {
            // Property 1: nothing moved in memory, so every offset the batch
            // took is handed back by construction.
            // Classified once for the batch: the cause is the statement's.
            let cause = shared.cause_of(&e);
            if matches!(cause, super::Cause::Bound) {
                shared.set_publishes_full(true);
            }
            let conn = writer.conn();
            for (ticket, job, size, _) in accepted {
                let context = job.target.describe(&job.record);
                outcomes.push((
                    ticket,
                    Err(shared.error_for(&cause, Some(conn), context, size, &e)),
                ));
            }
        }
    }
    in_order(outcomes)
}

/// Where each channel a batch touches is in its list: by a scan while they
/// are few (most batches are one channel's), by its name's hash past
/// [`Places::SCANNED`]. A batch of publishes spread over many channels
/// touched a channel for nearly every publish, and the scan of every one
/// before it made the batch cost the square of its length.
#[derive(Default)]
struct Places {
    names: Vec<String>,
    hashed: std::collections::HashMap<String, usize>,
}

impl Places {
    const SCANNED: usize = 8;

    /// The place of channel `name`, given the next one by `add` when it is
    /// new (places are handed out 0, 1, 2, ...).
    fn of(&mut self, name: &str, add: impl FnOnce() -> usize) -> usize {
        if self.hashed.is_empty() {
            if let Some(idx) = self.names.iter().position(|n| n == name) {
                return idx;
            }
            let idx = add();
            self.names.push(name.to_owned());
            if self.names.len() > Self::SCANNED {
                self.hashed = std::mem::take(&mut self.names)
                    .into_iter()
                    .enumerate()
                    .map(|(idx, name)| (name, idx))
                    .collect();
            }
            return idx;
        }
        match self.hashed.get(name) {
            Some(&idx) => idx,
            None => {
                let idx = add();
                self.hashed.insert(name.to_owned(), idx);
                idx
            }
        }
    }
}

/// The answers in the order the publishes came in the batch.
fn in_order(mut outcomes: Vec<(u64, Outcome)>) -> Vec<Outcome> {
    outcomes.sort_by_key(|(index, _)| *index);
    outcomes.into_iter().map(|(_, outcome)| outcome).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's channels as `run_batch` enters them: each new name the
    /// next place, each name seen before its own, before and after the
    /// list is hashed.
    #[test]
    fn a_channel_keeps_its_place_however_many_a_batch_touches() {
        fn enter(places: &mut Places, list: &mut Vec<String>, name: &str) -> usize {
            places.of(name, || {
                list.push(name.to_owned());
                list.len() - 1
            })
        }
        let mut places = Places::default();
        let mut list: Vec<String> = Vec::new();
        let names: Vec<String> = (0..40).map(|i| format!("c{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            assert_eq!(enter(&mut places, &mut list, name), i);
            // Every channel entered so far is found where it was put.
            for (j, earlier) in names[..=i].iter().enumerate() {
                assert_eq!(
                    enter(&mut places, &mut list, earlier),
                    j,
                    "{earlier} after {name}"
                );
            }
        }
        assert!(!places.hashed.is_empty() && places.names.is_empty());
        assert_eq!(list, names);
    }
}
