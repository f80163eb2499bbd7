//! The persisters: where the state's [`Intent`]s are written, one per role
//! (`broker.session_storage`, `broker.retained_storage`, each channel),
//! each role's in the order the state made them (`docs/design.md` storage
//! rules 1 and 4).
//!
//! A memory provider's writes cost a lock and a copy, so they run inline in
//! the broker task and are answered before it reads the next event. A
//! sqlite provider's writes are transactions with disk I/O behind them, so
//! they run on a thread of the provider's, serving every role it keeps,
//! fed by a bounded queue, answered as [`Event::Committed`]. When that
//! queue is full the broker task waits for room before it reads another
//! client event: clients stop being read rather than their writes being
//! buffered without bound. The thread takes whatever has queued up each
//! time it wakes and serves each role in turns (`turns`): publishes
//! group-committed (those of all the provider's channels together),
//! session writes of several packets in one transaction, the writes a
//! client waits on first.
//!
//! A failed write is counted in `saguin_storage_errors_total{provider,kind}`;
//! the state answers the client the write was for. A fault of the disk
//! (no room, an I/O error, a failed fsync, a read-only file system) is
//! logged by its provider as its health moves; any other failure's first
//! of a streak is logged here at ERROR.

mod served_batch;
mod turns;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use served_batch::ServedBatch;
use tokio::sync::mpsc;
use turns::{Turns, GIVE_WAY_AFTER};

use super::metrics::Metrics;
use super::providers::ServedChannel;
use super::state::{
    Class, Event, Intent, QueueSetup, Restored, RestoredChannel, StorageFailure, Write, Written,
};
use super::views::{ChannelView, ProviderView};
use crate::storage::contract::{
    self, BroadcastLog, ChannelStore, FaultKind, HeldPublishStore, LatestStore, LeaseRequest,
    OffsetStore, Provider, ProviderKind, QueueStore, ServedValue, SessionStore, StorageError,
    BROADCAST_LOG_NAME,
};
use saguin_format::model::Record;

/// Intents queued for a sqlite persister before the broker waits.
pub const QUEUE: usize = 4096;

/// Where the persisters and readers answer the broker task: a publish
/// group's answers on a queue of their own, read first, so a PUBACK never
/// waits behind the session answers queued ahead of it. In a reconnect
/// storm the broker task answers CONNECTs more slowly than a provider
/// commits their sessions: measured, a session's answer waited up to
/// 20-60 ms in the queue at the storm's peak. Answers of the two kinds were
/// never ordered against each other - the persister's turns serve a
/// publish ahead of session writes queued before it - and each queue
/// keeps its own order.
#[derive(Clone)]
pub struct CommitSender {
    publishes: mpsc::UnboundedSender<Event>,
    rest: mpsc::UnboundedSender<Event>,
}

impl CommitSender {
    /// The queue of every answer but a publish group's (a reader's too).
    pub fn rest(&self) -> mpsc::UnboundedSender<Event> {
        self.rest.clone()
    }
}

/// The broker task's end of [`CommitSender`].
pub struct Commits {
    publishes: mpsc::UnboundedReceiver<Event>,
    rest: mpsc::UnboundedReceiver<Event>,
}

impl Commits {
    /// The next answer, a publish group's first; `None` once every sender
    /// of both queues is gone and nothing is queued.
    pub async fn recv(&mut self) -> Option<Event> {
        tokio::select! {
            biased;
            Some(answer) = self.publishes.recv() => Some(answer),
            answer = self.rest.recv() => match answer {
                Some(answer) => Some(answer),
                None => self.publishes.recv().await,
            },
        }
    }

    /// Up to `most` more answers already queued, publish groups' first,
    /// appended to `out`: answers handled in one turn.
    pub fn take_ready(&mut self, out: &mut Vec<Event>, most: usize) {
        for _ in 0..most {
            match self.publishes.try_recv().or_else(|_| self.rest.try_recv()) {
                Ok(answer) => out.push(answer),
                Err(_) => return,
            }
        }
    }
}

/// The two answer queues, and the broker task's end of them.
pub fn commit_channel() -> (CommitSender, Commits) {
    let (publishes, publishes_rx) = mpsc::unbounded_channel();
    let (rest, rest_rx) = mpsc::unbounded_channel();
    (
        CommitSender { publishes, rest },
        Commits {
            publishes: publishes_rx,
            rest: rest_rx,
        },
    )
}

/// The stores one role writes to. A channel's persister holds its
/// channel and its provider's holds; the others the stores of their role.
#[derive(Clone)]
struct Stores {
    handle: Arc<dyn Provider>,
    /// Every write in a transaction of its own: what the reconnect-storm
    /// benchmark compares the shared transactions against
    /// (`SAGUIN_SESSION_WRITES_ALONE` set in the environment).
    alone: bool,
    provider: String,
    sessions: Option<Arc<dyn SessionStore>>,
    log: Option<Arc<dyn BroadcastLog>>,
    held: Arc<dyn HeldPublishStore>,
    retained: Option<Arc<dyn LatestStore>>,
    /// The channel's index among those served, and its store.
    channel: Option<(u16, ChannelStore)>,
}

/// What a persister writes.
pub enum Keeps {
    Sessions,
    Retained,
    /// The channel of this index, of whichever kind.
    Channel(u16, ChannelStore),
}

impl Stores {
    fn of(provider: Arc<dyn Provider>, keeps: Keeps) -> Result<Stores, StorageError> {
        let (sessions, log, retained, channel) = match keeps {
            Keeps::Sessions => (
                Some(provider.sessions()?),
                Some(provider.broadcast_log()?),
                None,
                None,
            ),
            Keeps::Retained => (None, None, Some(provider.retained()?), None),
            Keeps::Channel(index, store) => (None, None, None, Some((index, store))),
        };
        Ok(Stores {
            provider: provider.name().to_owned(),
            sessions,
            log,
            held: provider.held_publishes()?,
            retained,
            channel,
            handle: provider,
            alone: std::env::var_os("SAGUIN_SESSION_WRITES_ALONE").is_some(),
        })
    }

    /// A store this persister does not hold was asked for: a write sent to
    /// the wrong role, refused rather than written somewhere else.
    fn missing(&self, what: &str) -> StorageError {
        StorageError::Invalid {
            what: format!("provider {}", self.provider),
            detail: format!("its persister does not keep {what}"),
        }
    }

    fn sessions(&self) -> Result<&Arc<dyn SessionStore>, StorageError> {
        self.sessions
            .as_ref()
            .ok_or_else(|| self.missing("sessions"))
    }

    fn log(&self) -> Result<&Arc<dyn BroadcastLog>, StorageError> {
        self.log
            .as_ref()
            .ok_or_else(|| self.missing("the broadcast log"))
    }

    fn retained(&self) -> Result<&Arc<dyn LatestStore>, StorageError> {
        self.retained
            .as_ref()
            .ok_or_else(|| self.missing("retained messages"))
    }

    fn channel(&self) -> Result<(u16, &ChannelStore), StorageError> {
        self.channel
            .as_ref()
            .map(|(i, c)| (*i, c))
            .ok_or_else(|| self.missing("a channel"))
    }

    fn queue(&self) -> Result<(u16, &Arc<dyn QueueStore>), StorageError> {
        let (index, store) = self.channel()?;
        store
            .as_queue()
            .map(|q| (index, q))
            .ok_or_else(|| self.missing("a queue"))
    }

    /// A record into this persister's channel: appended, set as its
    /// topic's value (an empty payload deletes), or enqueued.
    fn store_record(&self, record: Record) -> Result<Written, StorageError> {
        let (index, channel) = self.channel()?;
        let stored = match channel {
            ChannelStore::Append(s) => Arc::new(s.append(record)?),
            ChannelStore::Latest(s) => Arc::new(s.set(record)?),
            ChannelStore::Queue(s) => Arc::new(s.enqueue(record)?),
        };
        Ok(Written::Stored(index, stored))
    }

    /// This persister's channel's positions: an append or a latest
    /// channel's, refused for a queue (it has workers, not readers).
    fn positions(&self) -> Result<&dyn OffsetStore, StorageError> {
        self.channel()?
            .1
            .offsets()
            .ok_or_else(|| self.missing("positions (a queue has workers, not readers)"))
    }

    fn apply(&self, write: Write) -> Result<Written, StorageError> {
        match write {
            Write::SaveSession(entry) => self.sessions()?.save(entry).map(|()| Written::Done),
            Write::RemoveSession(client_id) => {
                self.sessions()?.remove(&client_id).map(|_| Written::Done)
            }
            Write::SaveCursor { client_id, offset } => self
                .log()?
                .save_cursor(&client_id, offset)
                .map(|()| Written::Done),
            Write::AppendLog(record) => self
                .log()?
                .append_sharing(record)
                .map(|(offset, kept)| Written::Appended(offset, kept)),
            Write::ReleaseLog(offsets) => self.log()?.release(&offsets).map(|_| Written::Done),
            Write::SetRetained(record) => self
                .retained()?
                .set_sharing(record)
                .map(|(_, kept)| kept.map_or(Written::Done, Written::Retained)),
            Write::DeleteRetained(topic) => self.retained()?.delete(&topic).map(|_| Written::Done),
            Write::Hold(held) => {
                let size = held.record.accounted_size();
                match self.channel.as_ref().map(|(_, c)| c) {
                    Some(ChannelStore::Append(s)) => contract::check_channel_room(&**s, size)?,
                    Some(ChannelStore::Queue(q)) => {
                        contract::check_room(q.name(), q.bytes(), q.max_bytes(), size)?
                    }
                    // A latest channel has no bound of its own.
                    Some(ChannelStore::Latest(_)) | None => {}
                }
                self.held.hold(held).map(|()| Written::Done)
            }
            Write::DropHold {
                client_id,
                packet_id,
            } => self
                .held
                .drop_hold(BROADCAST_LOG_NAME, &client_id, packet_id)
                .map(|_| Written::Done),
            Write::Append(record) => self.store_record(record),
            Write::Release {
                client_id,
                packet_id,
            } => {
                let (index, channel) = self.channel()?;
                Ok(
                    match self.held.release(channel.name(), &client_id, packet_id)? {
                        Some(record) => Written::Stored(index, Arc::new(record)),
                        None => Written::Done,
                    },
                )
            }
            Write::DropChannelHold {
                client_id,
                packet_id,
            } => {
                let (_, channel) = self.channel()?;
                self.held
                    .drop_hold(channel.name(), &client_id, packet_id)
                    .map(|_| Written::Done)
            }
            Write::SavePosition(position) => self
                .positions()?
                .save_position(position)
                .map(|()| Written::Done),
            Write::DropPosition(reader) => self
                .positions()?
                .drop_position(&reader)
                .map(|_| Written::Done),
            Write::Lease {
                offset,
                holder,
                lease_until,
                now,
            } => {
                let (index, queue) = self.queue()?;
                queue
                    .lease(offset, &holder, lease_until, now)
                    .map(|lease| Written::Leased(index, Box::new(lease)))
            }
            Write::Resolve { delivery_id, epoch } => {
                let (index, queue) = self.queue()?;
                queue
                    .resolve(delivery_id, epoch)
                    .map(|done| Written::Resolved(index, delivery_id, done))
            }
            Write::ReleaseLease {
                delivery_id,
                epoch,
                now,
                reason,
            } => {
                let (index, queue) = self.queue()?;
                queue
                    .release(delivery_id, epoch, now, &reason)
                    .map(|released| Written::Released(index, delivery_id, released))
            }
        }
    }

    /// Whether every write of `group` is a publish to this role's channel:
    /// such groups of several channels are stored together
    /// ([`publish_together`]); anything else runs as
    /// [`Stores::run_together`] runs it.
    fn publishes_to_its_channel(&self, group: &[Intent]) -> bool {
        !self.alone
            && self.channel.is_some()
            && group
                .iter()
                .all(|i| i.writes.iter().all(|w| matches!(w, Write::Append(_))))
    }

    /// Every write of `intent` in order; the first failure answers it.
    fn run(&self, intent: Intent) -> Result<Vec<Written>, StorageError> {
        intent.writes.into_iter().map(|w| self.apply(w)).collect()
    }

    /// Several intents, in order, sharing transactions: a run of session
    /// writes (of any number of intents) is one transaction, a run of log
    /// appends one group commit. A write of an intent an earlier write of
    /// which failed is not made. When a write of a shared session
    /// transaction fails, nothing of it is kept and each of its writes is
    /// made again alone, so each gets the answer it would have had alone.
    fn run_together(&self, intents: Vec<Intent>) -> Vec<(u64, Result<Vec<Written>, StorageError>)> {
        let mut failed: Vec<Option<StorageError>> = intents.iter().map(|_| None).collect();
        let mut written: Vec<Vec<Written>> = intents.iter().map(|_| Vec::new()).collect();
        let tickets: Vec<u64> = intents.iter().map(|i| i.ticket).collect();
        let mut flat: Vec<(usize, Write)> = Vec::new();
        for (i, intent) in intents.into_iter().enumerate() {
            flat.extend(intent.writes.into_iter().map(|w| (i, w)));
        }
        // A queue's leases and resolutions depend on nothing queued beside
        // them (each was asked for once what it acts on had committed), and
        // each is an intent of its own: gathered, each kind is one
        // transaction rather than one per neighbour of another kind.
        flat.sort_by_key(|(_, w)| match Run::of(w) {
            Run::Lease => 1,
            Run::Resolve => 2,
            _ => 0,
        });
        let mut rest = flat.into_iter().peekable();
        while let Some((i, first)) = rest.next() {
            let kind = if self.alone {
                Run::Single
            } else {
                Run::of(&first)
            };
            let mut run = vec![(i, first)];
            while let Some((_, next)) = rest.peek() {
                if kind == Run::Single || Run::of(next) != kind {
                    break;
                }
                run.push(rest.next().expect("peeked"));
            }
            run.retain(|(i, _)| failed[*i].is_none());
            let owners: Vec<usize> = run.iter().map(|(i, _)| *i).collect();
            // The writes are moved into what makes them, not copied: an
            // append's record is a publish's size.
            let answers = match kind {
                Run::Session if run.len() > 1 => self.sessions_together(&run),
                Run::Append | Run::ChannelAppend if run.len() > 1 => {
                    self.append_run(run.into_iter().map(|(_, w)| w).collect())
                }
                Run::Lease if run.len() > 1 => self.lease_run(&run),
                Run::Resolve if run.len() > 1 => self.resolve_run(&run),
                _ => run.into_iter().map(|(_, w)| self.apply(w)).collect(),
            };
            for (i, answer) in owners.into_iter().zip(answers) {
                match answer {
                    Ok(w) if failed[i].is_none() => written[i].push(w),
                    Ok(_) => {}
                    Err(e) => {
                        failed[i].get_or_insert(e);
                    }
                }
            }
        }
        tickets
            .into_iter()
            .zip(failed.into_iter().zip(written))
            .map(|(t, (f, w))| (t, f.map_or(Ok(w), Err)))
            .collect()
    }

    /// A session group in one transaction, giving way after each packet's
    /// writes when a publish has arrived (`arrivals` takes what queued up
    /// into `turns` and says whether a publish came) or [`GIVE_WAY_AFTER`]
    /// has passed (`elapsed`): what it ran commits, the rest goes back to
    /// `turns` at the front. When a write fails, nothing of the
    /// transaction is kept and the writes run again: all but the failed
    /// packet's together once, then the failed one alone, with the answer
    /// it would have had alone. Two shared attempts at most: a second
    /// failure makes each packet's writes run alone.
    fn run_session_group(
        &self,
        group: Vec<Intent>,
        turns: &mut Turns,
        mut arrivals: impl FnMut(&mut Turns) -> bool,
        elapsed: impl Fn() -> Duration,
    ) -> Vec<(u64, Result<Vec<Written>, StorageError>)> {
        if self.alone {
            return self.run_together(group);
        }
        let mut rest: VecDeque<Intent> = group.into();
        let mut ran: Vec<Intent> = Vec::new();
        let mut answers: Vec<(u64, Result<Vec<Written>, StorageError>)> = Vec::new();
        let together = self.handle.session_writes_together(&mut || {
            while let Some(intent) = rest.pop_front() {
                let result: Result<Vec<Written>, StorageError> = intent
                    .writes
                    .iter()
                    .map(|w| self.apply(w.clone()))
                    .collect();
                let failed = result.is_err();
                answers.push((intent.ticket, result));
                ran.push(intent);
                if failed {
                    return false;
                }
                let publish_arrived = arrivals(turns);
                if publish_arrived || turns.publish_waiting() || elapsed() >= GIVE_WAY_AFTER {
                    return true;
                }
            }
            true
        });
        match together {
            Ok(true) => {
                turns.give_back(rest.into_iter().collect());
                answers
            }
            Ok(false) => {
                turns.give_back(rest.into_iter().collect());
                // The packet whose write failed is the last one run.
                let failed = ran.pop().expect("a failed write was run");
                let mut answers = self.second_attempt(ran);
                answers.push((failed.ticket, self.run(failed)));
                answers
            }
            // The transaction failed to commit, or to begin (a failed
            // provider refuses it before any write runs): nothing to single
            // out, and each packet answers alone, those not reached too.
            // Given back, they would come here again at once, for ever,
            // and never be answered.
            Err(_) => ran
                .into_iter()
                .chain(rest)
                .map(|intent| (intent.ticket, self.run(intent)))
                .collect(),
        }
    }

    /// The second and last shared attempt of a session group that failed:
    /// `intents` together, or each alone when one fails again.
    fn second_attempt(
        &self,
        intents: Vec<Intent>,
    ) -> Vec<(u64, Result<Vec<Written>, StorageError>)> {
        if intents.is_empty() {
            return Vec::new();
        }
        let mut answers = Vec::with_capacity(intents.len());
        let together = self.handle.session_writes_together(&mut || {
            for intent in &intents {
                let result: Result<Vec<Written>, StorageError> = intent
                    .writes
                    .iter()
                    .map(|w| self.apply(w.clone()))
                    .collect();
                let failed = result.is_err();
                answers.push((intent.ticket, result));
                if failed {
                    return false;
                }
            }
            true
        });
        if matches!(together, Ok(true)) {
            return answers;
        }
        intents
            .into_iter()
            .map(|intent| (intent.ticket, self.run(intent)))
            .collect()
    }

    /// A run of appends (to the broadcast log, or to this persister's
    /// channel) as one group commit.
    fn append_run(&self, run: Vec<Write>) -> Vec<Result<Written, StorageError>> {
        let n = run.len();
        let to_channel = matches!(run.first(), Some(Write::Append(_)));
        let records: Vec<Record> = run
            .into_iter()
            .filter_map(|w| match w {
                Write::AppendLog(r) | Write::Append(r) => Some(r),
                _ => None,
            })
            .collect();
        let answers = if to_channel {
            self.channel().map(|(index, channel)| match channel {
                ChannelStore::Append(s) => s
                    .append_batch(records)
                    .into_iter()
                    .map(|r| r.map(|r| Written::Stored(index, Arc::new(r))))
                    .collect::<Vec<_>>(),
                ChannelStore::Queue(q) => q
                    .enqueue_many(records)
                    .into_iter()
                    .map(|r| r.map(|r| Written::Stored(index, Arc::new(r))))
                    .collect(),
                // A value replaced is collected by the provider itself.
                ChannelStore::Latest(_) => {
                    records.into_iter().map(|r| self.store_record(r)).collect()
                }
            })
        } else {
            self.log().map(|log| {
                log.append_batch(records)
                    .into_iter()
                    .map(|r| r.map(|r| Written::Appended(r.offset, None)))
                    .collect::<Vec<_>>()
            })
        };
        match answers {
            Ok(answers) => answers,
            Err(e) => self.unwritten(n, &e),
        }
    }

    /// The answers of a run of `n` writes none of which could be made.
    fn unwritten(&self, n: usize, e: &StorageError) -> Vec<Result<Written, StorageError>> {
        let detail = e.to_string();
        (0..n)
            .map(|_| {
                Err(StorageError::Write {
                    context: format!("provider {}", self.provider),
                    detail: detail.clone(),
                })
            })
            .collect()
    }

    /// A run of leases of this persister's queue in one transaction: the
    /// records of one offer handed out with one commit.
    fn lease_run(&self, run: &[(usize, Write)]) -> Vec<Result<Written, StorageError>> {
        let asked: Vec<LeaseRequest> = run
            .iter()
            .filter_map(|(_, w)| match w {
                Write::Lease {
                    offset,
                    holder,
                    lease_until,
                    now,
                } => Some(LeaseRequest {
                    offset: *offset,
                    holder: holder.clone(),
                    lease_until: *lease_until,
                    now: *now,
                }),
                _ => None,
            })
            .collect();
        match self.queue() {
            Ok((index, queue)) => queue
                .lease_many(asked)
                .into_iter()
                .map(|r| r.map(|lease| Written::Leased(index, Box::new(lease))))
                .collect(),
            Err(e) => self.unwritten(run.len(), &e),
        }
    }

    /// A run of resolutions of this persister's queue in one transaction,
    /// each answered only once it committed.
    fn resolve_run(&self, run: &[(usize, Write)]) -> Vec<Result<Written, StorageError>> {
        let asked: Vec<(u64, u64)> = run
            .iter()
            .filter_map(|(_, w)| match w {
                Write::Resolve { delivery_id, epoch } => Some((*delivery_id, *epoch)),
                _ => None,
            })
            .collect();
        match self.queue() {
            Ok((index, queue)) => queue
                .resolve_many(asked.clone())
                .into_iter()
                .zip(asked)
                .map(|(r, (delivery_id, _))| {
                    r.map(|done| Written::Resolved(index, delivery_id, done))
                })
                .collect(),
            Err(e) => self.unwritten(run.len(), &e),
        }
    }

    /// Session writes in one transaction; alone each when one fails.
    fn sessions_together(&self, run: &[(usize, Write)]) -> Vec<Result<Written, StorageError>> {
        let mut answers = Vec::with_capacity(run.len());
        let together = self.handle.session_writes_together(&mut || {
            for (_, w) in run {
                match self.apply(w.clone()) {
                    Ok(done) => answers.push(Ok(done)),
                    Err(e) => {
                        answers.push(Err(e));
                        return false;
                    }
                }
            }
            true
        });
        if matches!(together, Ok(true)) {
            return answers;
        }
        // Nothing of the shared transaction was kept: each alone.
        let mut failed_intents = Vec::new();
        run.iter()
            .map(|(i, w)| {
                if failed_intents.contains(i) {
                    return Err(StorageError::Write {
                        context: format!("provider {}", self.provider),
                        detail: "not made: an earlier write of the same packet failed".into(),
                    });
                }
                let answer = self.apply(w.clone());
                if answer.is_err() {
                    failed_intents.push(*i);
                }
                answer
            })
            .collect()
    }
}

/// How a write may share a transaction with its neighbours.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Run {
    /// Moves no counter: any number share one transaction.
    Session,
    /// A broadcast log append: group-committed with its neighbours.
    Append,
    /// A channel append: group-committed with its neighbours.
    ChannelAppend,
    /// A queue lease: the leases of one offer share a transaction.
    Lease,
    /// A queue resolution: those queued together share a transaction.
    Resolve,
    /// Everything else, alone.
    Single,
}

impl Run {
    fn of(write: &Write) -> Run {
        match write {
            Write::SaveSession(_)
            | Write::RemoveSession(_)
            | Write::SaveCursor { .. }
            | Write::Hold(_)
            | Write::DropHold { .. }
            | Write::DropChannelHold { .. }
            | Write::SavePosition(_)
            | Write::DropPosition(_) => Run::Session,
            Write::AppendLog(_) => Run::Append,
            Write::Append(_) => Run::ChannelAppend,
            Write::Lease { .. } => Run::Lease,
            Write::Resolve { .. } => Run::Resolve,
            Write::ReleaseLog(_)
            | Write::SetRetained(_)
            | Write::DeleteRetained(_)
            | Write::Release { .. }
            | Write::ReleaseLease { .. } => Run::Single,
        }
    }
}

/// Counts failures and logs the first of each streak.
struct Failures {
    metrics: Arc<Metrics>,
    provider: String,
    streak: u64,
}

impl Failures {
    /// A group's answers as the broker task is handed them.
    fn answered(&mut self, answers: GroupAnswers) -> Vec<Event> {
        answers
            .into_iter()
            .map(|(ticket, result)| Event::Committed {
                ticket,
                result: self.answer(result),
            })
            .collect()
    }

    fn answer(
        &mut self,
        result: Result<Vec<Written>, StorageError>,
    ) -> Result<Vec<Written>, StorageFailure> {
        match result {
            Ok(written) => {
                if self.streak > 0 {
                    tracing::debug!(provider = %self.provider, failed = self.streak, "storage writes succeed again");
                    self.streak = 0;
                }
                Ok(written)
            }
            Err(err) => {
                let kind = err.kind();
                self.metrics.storage_error(&self.provider, kind);
                // A fault of the disk is logged by the provider, once as its
                // health moves, whichever persister met it: not again here
                // per role and streak.
                let logged_by_provider = !matches!(kind, FaultKind::Full | FaultKind::Other);
                if self.streak == 0 && !logged_by_provider {
                    tracing::error!(provider = %self.provider, error = %err, "storage write failed; clients are answered with the failure and nothing is acknowledged that is not stored");
                }
                self.streak += 1;
                Err(StorageFailure {
                    full: err.is_full(),
                    message: err.to_string(),
                })
            }
        }
    }
}

enum Kind {
    Inline(Stores, Failures),
    /// Its provider's thread's queue ([`serve_provider`]).
    Thread(mpsc::Sender<Intent>),
    /// [`Persister::stepped`]'s.
    #[cfg(test)]
    Stepped(OnThread),
}

/// A group's answers: each intent's ticket and what it wrote.
type GroupAnswers = Vec<(u64, Result<Vec<Written>, StorageError>)>;

/// One role a provider's thread serves: its stores, its failures and its
/// queue of what it was handed.
struct OnThread {
    stores: Stores,
    failures: Failures,
    turns: Turns,
}

/// What a round made of a role's next group.
enum Next {
    /// A channel's publishes, to be stored with the round's others
    /// ([`publish_together`]).
    Together(Vec<Intent>),
    /// Run as the role's own thread ran it: whether it was a group of
    /// publishes (whose answers go on their own queue, read first), and
    /// its answers.
    Ran {
        publishes: bool,
        answers: GroupAnswers,
    },
}

impl OnThread {
    /// The next group of what waits in this role's turns; `None` when
    /// nothing does. `arrivals` and `elapsed` are what a session group
    /// gives way by ([`Stores::run_session_group`]).
    fn run_next(
        &mut self,
        arrivals: impl FnMut(&mut Turns) -> bool,
        elapsed: impl Fn() -> Duration,
    ) -> Option<Next> {
        let group = self.turns.next()?;
        let publishes = group.first().is_some_and(|i| i.class == Class::Publish);
        if publishes && self.stores.publishes_to_its_channel(&group) {
            return Some(Next::Together(group));
        }
        let answers = if publishes {
            self.stores.run_together(group)
        } else {
            self.stores
                .run_session_group(group, &mut self.turns, arrivals, elapsed)
        };
        Some(Next::Ran { publishes, answers })
    }
}

/// A provider's thread: every role it keeps (`roles`, each with its
/// index), in rounds. Each round takes whatever has queued up, then each
/// role with something waiting runs its next group as a thread of its own
/// ran it; the publish groups of channels in one round are stored in one
/// call ([`Provider::publish_together`]), so publishes spread over many
/// channels share transactions as those to one channel do. Each role's
/// writes keep their order: they come on one queue and each role's
/// groups run in turn.
fn serve_provider(
    mut roles: Vec<(usize, OnThread)>,
    mut intents: mpsc::Receiver<Intent>,
    commits: &CommitSender,
) {
    let place_of: HashMap<usize, usize> = roles
        .iter()
        .enumerate()
        .map(|(place, (index, _))| (*index, place))
        .collect();
    let mut waiting = Waiting::new(roles.len());
    let mut open = true;
    loop {
        if waiting.is_empty() {
            if !open {
                return;
            }
            match intents.blocking_recv() {
                Some(intent) => queue_for(&mut roles, &place_of, &mut waiting, intent),
                None => return,
            }
        }
        while let Ok(intent) = intents.try_recv() {
            queue_for(&mut roles, &place_of, &mut waiting, intent);
        }
        if intents.is_closed() && intents.is_empty() {
            open = false;
        }
        let mut together: Vec<(usize, Vec<Intent>)> = Vec::new();
        for place in waiting.take() {
            // Arrivals for the other roles during a session group wait
            // beside, in order.
            let mut beside = Vec::new();
            let started = Instant::now();
            let next = roles[place].1.run_next(
                |turns| {
                    let mut publish_arrived = false;
                    while let Ok(arrived) = intents.try_recv() {
                        publish_arrived |= arrived.class == Class::Publish;
                        if place_of.get(&arrived.role.index()) == Some(&place) {
                            turns.push(arrived);
                        } else {
                            beside.push(arrived);
                        }
                    }
                    publish_arrived
                },
                || started.elapsed(),
            );
            for arrived in beside {
                queue_for(&mut roles, &place_of, &mut waiting, arrived);
            }
            let role = &mut roles[place].1;
            if !role.turns.is_empty() {
                waiting.mark(place);
            }
            match next {
                None => {}
                Some(Next::Together(group)) => together.push((place, group)),
                Some(Next::Ran { publishes, answers }) => {
                    let answers = role.failures.answered(answers);
                    if !send_answers(commits, publishes, answers) {
                        return;
                    }
                }
            }
        }
        if together.is_empty() {
            continue;
        }
        let groups = together
            .into_iter()
            .map(|(place, group)| (place, &roles[place].1, group))
            .collect();
        for (place, answers) in publish_together(groups) {
            let answers = roles[place].1.failures.answered(answers);
            if !send_answers(commits, true, answers) {
                return;
            }
        }
    }
}

/// The roles of a provider's thread with something queued, by place, in
/// the order they were handed it: a round looks at these, not at every
/// role (a role for each of up to 10,000 channels, where a lone publish
/// is for one).
struct Waiting {
    places: Vec<usize>,
    marked: Vec<bool>,
}

impl Waiting {
    fn new(roles: usize) -> Waiting {
        Waiting {
            places: Vec::new(),
            marked: vec![false; roles],
        }
    }

    fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    fn mark(&mut self, place: usize) {
        if !std::mem::replace(&mut self.marked[place], true) {
            self.places.push(place);
        }
    }

    /// This round's roles; those marked from now on wait for the next.
    fn take(&mut self) -> Vec<usize> {
        let places = std::mem::take(&mut self.places);
        for &place in &places {
            self.marked[place] = false;
        }
        places
    }
}

/// Queue `intent` behind those of its role, which then waits for a round.
fn queue_for(
    roles: &mut [(usize, OnThread)],
    place_of: &HashMap<usize, usize>,
    waiting: &mut Waiting,
    intent: Intent,
) {
    match place_of.get(&intent.role.index()) {
        Some(&place) => {
            roles[place].1.turns.push(intent);
            waiting.mark(place);
        }
        // Routed here by its role, so never; dropped, its client would
        // wait for an answer that never comes.
        None => debug_assert!(false, "an intent for a role this thread does not serve"),
    }
}

/// Hand `answers` to the broker task, a publish group's on their own
/// queue; false once the broker task is gone.
fn send_answers(commits: &CommitSender, publishes: bool, answers: Vec<Event>) -> bool {
    let answer_to = if publishes {
        &commits.publishes
    } else {
        &commits.rest
    };
    answers
        .into_iter()
        .all(|answer| answer_to.send(answer).is_ok())
}

/// The publish groups of several channels' roles of one provider (each
/// with the caller's `place` for it, and only appending to its role's
/// channel: [`Stores::publishes_to_its_channel`]), their records stored
/// in one call to the provider; each place's answers, each intent
/// answered with its records as stored or the first refusal among them.
fn publish_together(groups: Vec<(usize, &OnThread, Vec<Intent>)>) -> Vec<(usize, GroupAnswers)> {
    let Some((_, first, _)) = groups.first() else {
        return Vec::new();
    };
    let provider = first.stores.handle.clone();
    // Each group's place, channel index, and intents' tickets and counts
    // of records.
    type Shape = (usize, u16, Vec<(u64, usize)>);
    let mut shapes: Vec<Shape> = Vec::with_capacity(groups.len());
    let mut runs: Vec<(&ChannelStore, Vec<Record>)> = Vec::with_capacity(groups.len());
    let mut answered: Vec<(usize, GroupAnswers)> = Vec::new();
    for (place, role, group) in groups {
        let stores = &role.stores;
        let Some((index, store)) = stores.channel.as_ref() else {
            // Never so (the groups are of roles that keep a channel), but
            // an intent dropped would leave its client waiting.
            let refused = group
                .into_iter()
                .map(|i| (i.ticket, Err(stores.missing("a channel"))))
                .collect();
            answered.push((place, refused));
            continue;
        };
        let mut records = Vec::new();
        let mut intents = Vec::with_capacity(group.len());
        for intent in group {
            let count = intent.writes.len();
            records.extend(intent.writes.into_iter().filter_map(|w| match w {
                Write::Append(record) => Some(record),
                _ => None,
            }));
            intents.push((intent.ticket, count));
        }
        shapes.push((place, *index, intents));
        runs.push((store, records));
    }
    let mut stored = provider.publish_together(runs).into_iter();
    for (place, index, intents) in shapes {
        let mut stored = stored.next().unwrap_or_default().into_iter();
        let answers = intents
            .into_iter()
            .map(|(ticket, count)| {
                let mut written = Vec::with_capacity(count);
                let mut failed = None;
                for answer in stored.by_ref().take(count) {
                    match answer {
                        Ok(record) => written.push(Written::Stored(index, Arc::new(record))),
                        Err(e) => {
                            failed.get_or_insert(e);
                        }
                    }
                }
                if failed.is_none() && written.len() < count {
                    failed = Some(StorageError::Write {
                        context: format!("provider {}", provider.name()),
                        detail: "it answered fewer publishes than it was handed".into(),
                    });
                }
                (ticket, failed.map_or(Ok(written), Err))
            })
            .collect();
        answered.push((place, answers));
    }
    answered
}

/// One role's persister.
pub struct Persister {
    kind: Kind,
}

/// The persister thread stopped (it panicked): the broker cannot store
/// anything more and must stop.
#[derive(Debug, thiserror::Error)]
#[error("the persister of provider {0} stopped")]
pub struct PersisterGone(pub String);

impl Persister {
    /// A provider's stores for `keeps`, registered with `metrics`, and the
    /// count of its failed writes.
    fn parts(
        provider: Arc<dyn Provider>,
        keeps: Keeps,
        metrics: Arc<Metrics>,
    ) -> Result<(ProviderKind, Stores, Failures), StorageError> {
        let kind = provider.kind();
        let stores = Stores::of(provider, keeps)?;
        metrics.register_provider(&stores.provider, ProviderView::of(&stores.handle));
        let failures = Failures {
            metrics,
            provider: stores.provider.clone(),
            streak: 0,
        };
        Ok((kind, stores, failures))
    }

    /// A persister whose thread is its caller: [`Persister::step`] runs
    /// the next group of what it was handed, as the thread would, so a
    /// test decides which writes share a group and when each is answered.
    /// A memory provider's answers as it is handed a write, as always.
    #[cfg(test)]
    pub fn stepped(
        provider: Arc<dyn Provider>,
        keeps: Keeps,
        metrics: Arc<Metrics>,
    ) -> Result<Persister, StorageError> {
        let (kind, stores, failures) = Persister::parts(provider, keeps, metrics)?;
        Ok(Persister {
            kind: match kind {
                ProviderKind::Memory => Kind::Inline(stores, failures),
                _ => Kind::Stepped(OnThread {
                    stores,
                    failures,
                    turns: Turns::default(),
                }),
            },
        })
    }

    /// The answers of the next group a stepped persister was handed, in
    /// the order its thread would send them; `None` when nothing waits.
    /// A session group does not give way: nothing arrives meanwhile and
    /// no time passes.
    #[cfg(test)]
    pub fn step(&mut self) -> Option<Vec<Event>> {
        match &mut self.kind {
            Kind::Stepped(role) => {
                let answers = match role.run_next(|_| false, || Duration::ZERO)? {
                    Next::Together(group) => role.stores.run_together(group),
                    Next::Ran { answers, .. } => answers,
                };
                Some(role.failures.answered(answers))
            }
            _ => None,
        }
    }

    /// Write `intent`: inline ones are answered in the returned event,
    /// threaded ones later on the commit channel. Waits while the thread's
    /// queue is full (backpressure).
    pub async fn submit(&mut self, intent: Intent) -> Result<Option<Event>, PersisterGone> {
        match &mut self.kind {
            Kind::Inline(stores, failures) => {
                let ticket = intent.ticket;
                let result = failures.answer(stores.run(intent));
                Ok(Some(Event::Committed { ticket, result }))
            }
            Kind::Thread(queue) => queue
                .send(intent)
                .await
                .map(|()| None)
                .map_err(|_| PersisterGone(String::new())),
            #[cfg(test)]
            Kind::Stepped(role) => {
                role.turns.push(intent);
                Ok(None)
            }
        }
    }
}

/// One persister per role (two roles naming one provider share a provider,
/// and each role's writes keep their order): sessions, retained, then one
/// per append channel, by [`Role::index`](super::state::Role::index).
pub struct Persisters {
    roles: Vec<Persister>,
    /// One for each sqlite provider, serving every role it keeps.
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Persisters {
    /// The persisters of every role: a memory provider's inline, and one
    /// thread for each other provider, serving every role it keeps
    /// ([`serve_provider`]). A thread of each role's own cost a sqlite
    /// channel a thread and 40 KB, and publishes spread over a hundred
    /// channels twice the broker's CPU of the same publishes to one: each
    /// woke a thread of its own (docs/benchmarks.md, "Channels in one
    /// broker").
    pub fn start(
        sessions: Arc<dyn Provider>,
        retained: Arc<dyn Provider>,
        channels: &[ServedChannel],
        metrics: Arc<Metrics>,
        commits: CommitSender,
    ) -> Result<Persisters, StorageError> {
        // Each provider's queue and the roles its thread will serve.
        struct Threaded {
            provider: String,
            queue: mpsc::Sender<Intent>,
            intents: mpsc::Receiver<Intent>,
            roles: Vec<(usize, OnThread)>,
        }
        let mut threaded: Vec<Threaded> = Vec::new();
        // `of_roles` makes the roles in the order of their indices.
        let mut role = 0;
        let mut persisters =
            Persisters::of_roles(sessions, retained, channels, |provider, keeps| {
                let index = role;
                role += 1;
                let (kind, stores, failures) = Persister::parts(provider, keeps, metrics.clone())?;
                if kind == ProviderKind::Memory {
                    return Ok(Persister {
                        kind: Kind::Inline(stores, failures),
                    });
                }
                let at = match threaded.iter().position(|t| t.provider == stores.provider) {
                    Some(at) => at,
                    None => {
                        let (queue, intents) = mpsc::channel::<Intent>(QUEUE);
                        threaded.push(Threaded {
                            provider: stores.provider.clone(),
                            queue,
                            intents,
                            roles: Vec::new(),
                        });
                        threaded.len() - 1
                    }
                };
                let thread = &mut threaded[at];
                thread.roles.push((
                    index,
                    OnThread {
                        stores,
                        failures,
                        turns: Turns::default(),
                    },
                ));
                Ok(Persister {
                    kind: Kind::Thread(thread.queue.clone()),
                })
            })?;
        for Threaded {
            provider,
            queue,
            intents,
            roles,
        } in threaded
        {
            // The roles hold the queue's senders; this one goes.
            drop(queue);
            let commits = commits.clone();
            let thread = std::thread::Builder::new()
                .name(format!("saguin-persist-{provider}"))
                .spawn(move || serve_provider(roles, intents, &commits))
                .map_err(|e| StorageError::io("starting the persister thread", e))?;
            persisters.threads.push(thread);
        }
        Ok(persisters)
    }

    /// [`Persisters::start`] with [`Persister::stepped`] persisters:
    /// [`Persisters::step`] answers their writes.
    #[cfg(test)]
    pub fn stepped(
        sessions: Arc<dyn Provider>,
        retained: Arc<dyn Provider>,
        channels: &[ServedChannel],
        metrics: Arc<Metrics>,
    ) -> Result<Persisters, StorageError> {
        Persisters::of_roles(sessions, retained, channels, |provider, keeps| {
            Persister::stepped(provider, keeps, metrics.clone())
        })
    }

    /// One persister for each role, made by `persister`.
    fn of_roles(
        sessions: Arc<dyn Provider>,
        retained: Arc<dyn Provider>,
        channels: &[ServedChannel],
        mut persister: impl FnMut(Arc<dyn Provider>, Keeps) -> Result<Persister, StorageError>,
    ) -> Result<Persisters, StorageError> {
        let mut roles = vec![
            persister(sessions, Keeps::Sessions)?,
            persister(retained, Keeps::Retained)?,
        ];
        for (index, channel) in channels.iter().enumerate() {
            let index = u16::try_from(index).map_err(|_| StorageError::Invalid {
                what: "channels".into(),
                detail: "more than 65535 channels".into(),
            })?;
            roles.push(persister(
                channel.provider.clone(),
                Keeps::Channel(index, channel.store.clone()),
            )?);
        }
        Ok(Persisters {
            roles,
            threads: Vec::new(),
        })
    }

    /// The answers of the next group the stepped persister of role
    /// `index` ([`Role::index`](super::state::Role::index)) was handed.
    #[cfg(test)]
    pub fn step(&mut self, index: usize) -> Option<Vec<Event>> {
        self.roles.get_mut(index)?.step()
    }

    /// One round of every stepped persister, as a provider's thread runs
    /// one ([`serve_provider`]): each role's next group, the publish
    /// groups of each provider's channels stored together; each group's
    /// answers, `None` when nothing waits. A session group does not give
    /// way: nothing arrives meanwhile.
    #[cfg(test)]
    pub fn step_round(&mut self) -> Option<Vec<Vec<Event>>> {
        // Groups of intents, each with its role's index.
        type Groups = Vec<(usize, Vec<Intent>)>;
        let mut answers = Vec::new();
        let mut together: Groups = Vec::new();
        for (index, persister) in self.roles.iter_mut().enumerate() {
            let Kind::Stepped(role) = &mut persister.kind else {
                continue;
            };
            match role.run_next(|_| false, || Duration::ZERO) {
                None => {}
                Some(Next::Together(group)) => together.push((index, group)),
                Some(Next::Ran { answers: ran, .. }) => {
                    answers.push(role.failures.answered(ran));
                }
            }
        }
        // Each provider's channels' groups in one call.
        let mut by_provider: Vec<(String, Groups)> = Vec::new();
        for (index, group) in together {
            let Kind::Stepped(role) = &self.roles[index].kind else {
                continue;
            };
            let provider = role.stores.provider.clone();
            match by_provider.iter_mut().find(|(name, _)| *name == provider) {
                Some((_, groups)) => groups.push((index, group)),
                None => by_provider.push((provider, vec![(index, group)])),
            }
        }
        for (_, groups) in by_provider {
            let groups = groups
                .into_iter()
                .filter_map(|(index, group)| match &self.roles[index].kind {
                    Kind::Stepped(role) => Some((index, role, group)),
                    _ => None,
                })
                .collect();
            for (index, ran) in publish_together(groups) {
                if let Kind::Stepped(role) = &mut self.roles[index].kind {
                    answers.push(role.failures.answered(ran));
                }
            }
        }
        (!answers.is_empty()).then_some(answers)
    }

    pub async fn submit(&mut self, intent: Intent) -> Result<Option<Event>, PersisterGone> {
        let index = intent.role.index();
        match self.roles.get_mut(index) {
            Some(persister) => persister.submit(intent).await,
            None => Err(PersisterGone(format!("role {index}"))),
        }
    }

    /// Stop taking intents and wait for each thread to finish what it has.
    pub fn stop(self) {
        drop(self.roles);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// Messages read from the broadcast log at once at startup.
const RESTORE_CHUNK: usize = 4096;

/// Batches of retained messages read ahead of the building: with the one
/// being filled and the one being built, at most about 6,000 messages (or
/// 6 MiB of topics and payloads) are between the two threads.
const RETAINED_BATCHES_IN_FLIGHT: usize = 4;

/// Hand every stored retained message to `each`, in the store's order, on
/// the calling thread (blocking; before listening). Every value: `#` would
/// leave the `$` topics behind.
///
/// The store is read on a thread of its own, in batches, while `each`
/// builds on this one: a start takes the longer of the two rather than
/// their sum. Each value is lent as the broker serves it: the reading
/// thread reads only those columns and copies each value into its batch's
/// one buffer, and `each` makes what it keeps from the lent value.
pub fn read_retained(
    retained: &dyn Provider,
    each: &mut dyn FnMut(ServedValue<'_>),
) -> Result<(), StorageError> {
    std::thread::scope(|scope| {
        let (batches_tx, batches) = std::sync::mpsc::sync_channel(RETAINED_BATCHES_IN_FLIGHT);
        let reader = std::thread::Builder::new()
            .name("saguin-restore".into())
            .spawn_scoped(scope, move || {
                let mut batch = ServedBatch::default();
                retained.retained()?.for_each_served_value(&mut |value| {
                    if batch.push(value) {
                        // The receiver lives until this thread is joined.
                        let _ = batches_tx.send(std::mem::take(&mut batch));
                    }
                })?;
                if !batch.is_empty() {
                    let _ = batches_tx.send(batch);
                }
                Ok(())
            })
            .map_err(|e| StorageError::Io {
                context: "starting the thread that reads the retained messages".into(),
                source: e,
            })?;
        for batch in batches {
            batch.for_each(&mut *each);
        }
        reader
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Read what the state is rebuilt from besides the retained messages
/// ([`read_retained`]) (blocking; before listening), the sessions handed
/// to `build` as soon as they are read.
///
/// The broadcast log, its cursors and the channels are read on a thread
/// of their own while the sessions are read and built into the state on
/// this one: a start takes the longer of the two rather than their sum.
/// At 100,000 sessions on sqlite the log's side reads for about 0.2 s and
/// the sessions' side reads and builds for about 0.3 s, where reading
/// everything and then building took 0.5 s.
pub fn read_restored(
    sessions: &dyn Provider,
    channels: &[ServedChannel],
    build: &mut dyn FnMut(Vec<crate::storage::contract::SessionEntry>),
) -> Result<Restored, StorageError> {
    std::thread::scope(|scope| {
        let beside = std::thread::Builder::new()
            .name("saguin-restore".into())
            .spawn_scoped(scope, || {
                let mut restored = read_log_and_channels(sessions, channels)?;
                restored.cursors = sessions.broadcast_log()?.cursors()?;
                Ok::<_, StorageError>(restored)
            })
            .map_err(|e| StorageError::Io {
                context: "starting the thread that reads the broadcast log".into(),
                source: e,
            })?;
        let stored = sessions.sessions().and_then(|store| store.sessions());
        let built = stored.map(build);
        let restored = beside
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        built?;
        restored
    })
}

/// What [`read_restored`] reads beside the sessions: the broadcast log,
/// the exactly-once holds and the channels.
fn read_log_and_channels(
    sessions: &dyn Provider,
    channels: &[ServedChannel],
) -> Result<Restored, StorageError> {
    let mut restored_channels = Vec::with_capacity(channels.len());
    // Every hold of a provider is read once, however many channels it holds.
    let mut holds_of: std::collections::HashMap<
        String,
        Vec<crate::storage::contract::HeldPublish>,
    > = std::collections::HashMap::new();
    for channel in channels {
        let provider = channel.provider.name().to_owned();
        if !holds_of.contains_key(&provider) {
            let held = channel.provider.held_publishes()?.held()?;
            holds_of.insert(provider.clone(), held);
        }
        let holds = holds_of[&provider]
            .iter()
            .filter(|h| h.channel == *channel.name)
            .cloned()
            .collect();
        if let Some(queue) = channel.store.as_queue() {
            // Attempts spent before the stop are dead-lettered now,
            // rather than starting over (invariant 15).
            let moved = queue.dead_letter_spent(crate::storage::contract::now_nanos())?;
            if moved > 0 {
                tracing::info!(channel = %channel.name, moved, "records whose attempts were spent before the restart moved to the dead-letter channel");
            }
        }
        let view = ChannelView::of(&channel.store);
        let queue = channel.queue.as_ref().map(|settings| {
            let dead_letter = crate::storage::contract::dead_letter_name(&channel.name);
            QueueSetup {
                lease: settings.lease,
                max_held_per_worker: usize::from(settings.max_held_per_worker),
                dead_letter: channels
                    .iter()
                    .position(|c| *c.name == *dead_letter)
                    .and_then(|i| u16::try_from(i).ok()),
            }
        });
        restored_channels.push(RestoredChannel {
            name: channel.name.clone(),
            kind: view.kind(),
            next: view.next(),
            queue,
            // A queue has workers, not readers: none.
            positions: view.positions()?,
            holds,
        });
    }
    let log = sessions.broadcast_log()?;
    let mut messages = Vec::new();
    let mut from = log.floor();
    loop {
        let chunk = log.read_from_n(from, RESTORE_CHUNK)?;
        let Some(last) = chunk.last() else {
            break;
        };
        from = last.offset + 1;
        messages.extend(chunk.iter().map(crate::storage::kept::Kept::new));
    }
    Ok(Restored {
        // Read one at a time by `read_retained`.
        retained: Vec::new(),
        // Handed to the state as they are read (`read_restored`).
        sessions: Vec::new(),
        // Read after these, on the same thread (`read_restored`).
        cursors: Vec::new(),
        log_next: log.next(),
        log: messages,
        held: sessions.held_publishes()?.held()?,
        channels: restored_channels,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::broker::state::Role;
    use crate::storage::contract::{ChannelStore, Position, Reader};
    use crate::storage::sqlite::{SqliteOptions, SqliteProvider};
    use saguin_format::model::ChannelKind;

    fn answer(ticket: u64) -> Event {
        Event::Committed {
            ticket,
            result: Ok(Vec::new()),
        }
    }

    fn ticket_of(event: Option<Event>) -> Option<u64> {
        match event {
            Some(Event::Committed { ticket, .. }) => Some(ticket),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_publish_groups_answer_is_read_before_the_session_answers_queued_ahead_of_it() {
        let (tx, mut commits) = commit_channel();
        for ticket in 1..=3 {
            tx.rest().send(answer(ticket)).unwrap();
        }
        tx.publishes.send(answer(10)).unwrap();
        tx.rest().send(answer(4)).unwrap();
        let mut order = Vec::new();
        for _ in 0..5 {
            order.push(ticket_of(commits.recv().await).unwrap());
        }
        assert_eq!(order, vec![10, 1, 2, 3, 4], "each queue in its own order");
    }

    #[tokio::test]
    async fn the_answers_end_only_once_both_queues_are_closed_and_empty() {
        let (tx, mut commits) = commit_channel();
        let publishes = tx.publishes.clone();
        drop(tx);
        publishes.send(answer(7)).unwrap();
        drop(publishes);
        assert_eq!(ticket_of(commits.recv().await), Some(7));
        assert!(commits.recv().await.is_none());
    }

    /// A sqlite provider that counts its shared transactions, and refuses
    /// to begin one while `refusing` is set, as a failed provider does.
    struct Counting {
        inner: Arc<SqliteProvider>,
        shared: AtomicUsize,
        /// Calls of `publish_together`.
        together: AtomicUsize,
        refusing: std::sync::atomic::AtomicBool,
    }

    impl Provider for Counting {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn kind(&self) -> ProviderKind {
            self.inner.kind()
        }
        fn open_channel(
            &self,
            name: &str,
            kind: ChannelKind,
        ) -> Result<ChannelStore, StorageError> {
            self.inner.open_channel(name, kind)
        }
        fn channels(&self) -> Vec<(String, ChannelKind)> {
            self.inner.channels()
        }
        fn bytes(&self) -> u64 {
            self.inner.bytes()
        }
        fn max_bytes(&self) -> Option<u64> {
            self.inner.max_bytes()
        }
        fn reserve(&self) -> u64 {
            self.inner.reserve()
        }
        fn retained(&self) -> Result<Arc<dyn LatestStore>, StorageError> {
            self.inner.retained()
        }
        fn sessions(&self) -> Result<Arc<dyn SessionStore>, StorageError> {
            self.inner.sessions()
        }
        fn broadcast_log(&self) -> Result<Arc<dyn BroadcastLog>, StorageError> {
            self.inner.broadcast_log()
        }
        fn held_publishes(&self) -> Result<Arc<dyn HeldPublishStore>, StorageError> {
            self.inner.held_publishes()
        }
        fn publish_together(
            &self,
            runs: Vec<(&ChannelStore, Vec<Record>)>,
        ) -> Vec<Vec<Result<Record, StorageError>>> {
            self.together.fetch_add(1, Ordering::Relaxed);
            self.inner.publish_together(runs)
        }
        fn session_writes_together(
            &self,
            body: &mut dyn FnMut() -> bool,
        ) -> Result<bool, StorageError> {
            self.shared.fetch_add(1, Ordering::Relaxed);
            if self.refusing.load(Ordering::Relaxed) {
                return Err(StorageError::Write {
                    context: "beginning a transaction".into(),
                    detail: "the provider has failed".into(),
                });
            }
            self.inner.session_writes_together(body)
        }
        fn close(&self) -> Result<(), StorageError> {
            self.inner.close()
        }
    }

    #[tokio::test]
    async fn one_thread_serves_every_role_of_a_provider_and_stores_channels_publishes_together() {
        let dir = tempfile::tempdir().unwrap();
        let provider = Arc::new(Counting {
            inner: Arc::new(
                SqliteProvider::open(SqliteOptions::new("db", dir.path().join("saguin.db")))
                    .unwrap(),
            ),
            shared: AtomicUsize::new(0),
            together: AtomicUsize::new(0),
            refusing: std::sync::atomic::AtomicBool::new(false),
        });
        let kinds = [
            ("a", ChannelKind::Append),
            ("b", ChannelKind::Append),
            ("l", ChannelKind::Latest),
            ("q", ChannelKind::Queue),
        ];
        let served: Vec<ServedChannel> = kinds
            .iter()
            .map(|&(name, kind)| ServedChannel {
                name: name.into(),
                provider: provider.clone(),
                store: provider.open_channel(name, kind).unwrap(),
                retention: Default::default(),
                queue: None,
            })
            .collect();
        let (commits, mut answers) = commit_channel();
        let mut persisters = Persisters::start(
            provider.clone(),
            provider.clone(),
            &served,
            Arc::new(Metrics::new()),
            commits,
        )
        .unwrap();
        assert_eq!(persisters.threads.len(), 1, "one thread for the provider");
        // Forty publishes over the four channels; the 13th is refused (QoS
        // 3), and the latest channel's first deletes a topic that held
        // nothing.
        let mut expected = Vec::new();
        for ticket in 0..40u64 {
            let channel = (ticket % 4) as u16;
            let (name, kind) = kinds[usize::from(channel)];
            let mut record = Record::new(
                format!("{name}/t{}", ticket % 3),
                if ticket == 2 {
                    bytes::Bytes::new()
                } else {
                    bytes::Bytes::from(ticket.to_string())
                },
            );
            if ticket == 13 {
                record.qos = 3;
            }
            expected.push((channel, kind, ticket));
            persisters
                .submit(Intent {
                    ticket,
                    role: Role::Channel(channel),
                    class: Class::Publish,
                    writes: vec![Write::Append(record)],
                })
                .await
                .unwrap();
        }
        let mut next_offset = [1u64; 4];
        let mut got = std::collections::BTreeMap::new();
        while got.len() < expected.len() {
            match answers.recv().await {
                Some(Event::Committed { ticket, result }) => {
                    got.insert(ticket, result);
                }
                other => panic!("not an answer: {other:?}"),
            }
        }
        for (channel, kind, ticket) in expected {
            let result = &got[&ticket];
            if ticket == 13 {
                assert!(result.is_err(), "the refused one alone");
                continue;
            }
            let written = result.as_ref().unwrap();
            let [Written::Stored(index, record)] = written.as_slice() else {
                panic!("ticket {ticket}: {written:?}");
            };
            assert_eq!(*index, channel);
            if ticket == 2 {
                assert_eq!(record.offset, 0, "a deletion of nothing takes no offset");
                continue;
            }
            assert_eq!(record.payload, bytes::Bytes::from(ticket.to_string()));
            // Each channel's offsets in the order its publishes came.
            let slot = &mut next_offset[usize::from(channel)];
            assert_eq!(
                record.offset, *slot,
                "ticket {ticket} on a {kind:?} channel"
            );
            *slot += 1;
        }
        assert!(provider.together.load(Ordering::Relaxed) >= 1);
        persisters.stop();
        let a = served[0].store.as_append().unwrap();
        let offsets: Vec<u64> = a.read_from(1).unwrap().iter().map(|r| r.offset).collect();
        assert_eq!(offsets, (1..=10).collect::<Vec<_>>());
    }

    /// A channel persister's stores on a fresh sqlite database, with one
    /// record in the channel (so positions 1 and 2 are valid, 3 on are not).
    fn stores(dir: &std::path::Path) -> (Stores, Arc<Counting>) {
        let inner = Arc::new(
            SqliteProvider::open(SqliteOptions::new("db", dir.join("saguin.db"))).unwrap(),
        );
        let channel = inner
            .open_channel("telemetry", ChannelKind::Append)
            .unwrap()
            .as_append()
            .unwrap()
            .clone();
        channel
            .append(Record::new("telemetry/a", bytes::Bytes::from_static(b"x")))
            .unwrap();
        let counting = Arc::new(Counting {
            inner,
            shared: AtomicUsize::new(0),
            together: AtomicUsize::new(0),
            refusing: std::sync::atomic::AtomicBool::new(false),
        });
        let mut stores = Stores::of(
            counting.clone(),
            Keeps::Channel(0, ChannelStore::Append(channel)),
        )
        .unwrap();
        stores.alone = false;
        (stores, counting)
    }

    fn position(ticket: u64, reader: &str, offset: u64) -> Intent {
        Intent {
            ticket,
            role: crate::broker::state::Role::Channel(0),
            class: Class::Connected,
            writes: vec![Write::SavePosition(Position {
                reader: Reader::mqtt(reader).unwrap(),
                offset,
                saved_at: 1,
                session_expiry: Some(60),
            })],
        }
    }

    fn stored(stores: &Stores) -> Vec<(String, u64)> {
        let (_, channel) = stores.channel().unwrap();
        channel
            .as_append()
            .unwrap()
            .positions()
            .unwrap()
            .into_iter()
            .map(|p| (p.reader.id().to_owned(), p.offset))
            .collect()
    }

    #[test]
    fn a_failed_write_is_singled_out_in_at_most_two_shared_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let (stores, counting) = stores(dir.path());
        let mut turns = Turns::default();
        // The second packet's position is past the channel's next: refused.
        let group = vec![
            position(1, "a", 1),
            position(2, "b", 9),
            position(3, "c", 2),
        ];
        let answers = stores.run_session_group(group, &mut turns, |_| false, || Duration::ZERO);
        let outcome: Vec<(u64, bool)> = answers.iter().map(|(t, r)| (*t, r.is_ok())).collect();
        // The first shared attempt stopped at the failure; the one after it
        // waits in `turns`, the one before it was kept in the second.
        assert_eq!(outcome, vec![(1, true), (2, false)]);
        assert_eq!(counting.shared.load(Ordering::Relaxed), 2);
        assert_eq!(stored(&stores), vec![("a".to_owned(), 1)]);
        let rest = turns.next().unwrap();
        assert_eq!(rest.iter().map(|i| i.ticket).collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn a_group_whose_transaction_cannot_begin_is_answered_and_not_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let (stores, counting) = stores(dir.path());
        counting.refusing.store(true, Ordering::Relaxed);
        let mut turns = Turns::default();
        let group = vec![position(1, "a", 1), position(2, "b", 2)];
        let answers = stores.run_session_group(group, &mut turns, |_| false, || Duration::ZERO);
        let tickets: Vec<u64> = answers.iter().map(|(t, _)| *t).collect();
        assert_eq!(tickets, vec![1, 2], "every packet is answered");
        // Nothing waits to be tried again: it would be refused again.
        assert!(turns.next().is_none());
    }

    /// An append channel whose positions fail as scheduled: each reader's
    /// saves answer from its list in turn (true: an injected I/O failure),
    /// then succeed.
    struct Flaky {
        inner: Arc<dyn crate::storage::contract::AppendStore>,
        failures: std::sync::Mutex<std::collections::HashMap<String, VecDeque<bool>>>,
    }

    impl crate::storage::contract::AppendStore for Flaky {
        fn append(&self, record: Record) -> Result<Record, StorageError> {
            self.inner.append(record)
        }
        fn read_from(&self, offset: u64) -> Result<Vec<Record>, StorageError> {
            self.inner.read_from(offset)
        }
        fn read_from_n(&self, offset: u64, max: usize) -> Result<Vec<Record>, StorageError> {
            self.inner.read_from_n(offset, max)
        }
        fn lowest_position(&self) -> u64 {
            self.inner.lowest_position()
        }
        fn first_at_or_after(
            &self,
            at: saguin_format::model::UnixNanos,
        ) -> Result<Option<u64>, StorageError> {
            self.inner.first_at_or_after(at)
        }
        fn set_max_bytes(&self, max_bytes: Option<u64>) {
            self.inner.set_max_bytes(max_bytes)
        }
        fn max_bytes(&self) -> Option<u64> {
            self.inner.max_bytes()
        }
        fn trim(
            &self,
            before: u64,
            max_bytes: Option<u64>,
        ) -> Result<crate::storage::contract::Removed, StorageError> {
            self.inner.trim(before, max_bytes)
        }
        fn trim_older_than(
            &self,
            cutoff: saguin_format::model::UnixNanos,
        ) -> Result<crate::storage::contract::Removed, StorageError> {
            self.inner.trim_older_than(cutoff)
        }
    }

    impl crate::storage::contract::OffsetStore for Flaky {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn next(&self) -> u64 {
            self.inner.next()
        }
        fn floor(&self) -> u64 {
            self.inner.floor()
        }
        fn bytes(&self) -> u64 {
            self.inner.bytes()
        }
        fn record_count(&self) -> u64 {
            self.inner.record_count()
        }
        fn position(&self, reader: &Reader) -> Result<Option<Position>, StorageError> {
            self.inner.position(reader)
        }
        fn save_position(&self, position: Position) -> Result<(), StorageError> {
            let fails = self
                .failures
                .lock()
                .unwrap()
                .get_mut(position.reader.id())
                .and_then(VecDeque::pop_front)
                .unwrap_or(false);
            if fails {
                return Err(StorageError::Io {
                    context: format!("saving the position of {}", position.reader),
                    source: std::io::Error::other("injected"),
                });
            }
            self.inner.save_position(position)
        }
        fn drop_position(&self, reader: &Reader) -> Result<bool, StorageError> {
            self.inner.drop_position(reader)
        }
        fn positions(&self) -> Result<Vec<Position>, StorageError> {
            self.inner.positions()
        }
    }

    /// The failure of a shared session transaction, injected by the store:
    /// the first shared attempt stops at the failing packet; the packets
    /// before it share a second and last attempt, and when that fails too
    /// (the store fails `a` once more) each runs alone; the failing packet
    /// runs alone and alone gets the failure; the packets after it wait
    /// for the next group, which commits them together. Two shared
    /// attempts at most, and no neighbour answered with another's failure.
    #[test]
    fn an_injected_failure_fails_only_its_own_packet_in_at_most_two_shared_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let (stores, counting) = stores(dir.path());
        let (_, channel) = stores.channel().unwrap();
        let flaky = Arc::new(Flaky {
            inner: channel.as_append().unwrap().clone(),
            failures: std::sync::Mutex::new(
                [
                    // a: fine in the first attempt, fails in the second.
                    ("a".to_owned(), VecDeque::from([false, true])),
                    // b: fails every time.
                    ("b".to_owned(), VecDeque::from([true, true, true])),
                ]
                .into_iter()
                .collect(),
            ),
        });
        let mut stores = Stores::of(
            counting.clone(),
            Keeps::Channel(0, ChannelStore::Append(flaky)),
        )
        .unwrap();
        stores.alone = false;
        let mut turns = Turns::default();
        let group = vec![
            position(1, "a", 1),
            position(2, "b", 1),
            position(3, "c", 1),
            position(4, "d", 2),
        ];
        let answers = stores.run_session_group(group, &mut turns, |_| false, || Duration::ZERO);
        let outcome: Vec<(u64, bool)> = answers.iter().map(|(t, r)| (*t, r.is_ok())).collect();
        assert_eq!(outcome, vec![(1, true), (2, false)]);
        assert!(
            matches!(&answers[1].1, Err(StorageError::Io { .. })),
            "{:?}",
            answers[1].1
        );
        assert_eq!(
            counting.shared.load(Ordering::Relaxed),
            2,
            "two shared attempts"
        );
        // The packets after the failure: the next group, one transaction.
        let rest = turns.next().unwrap();
        assert_eq!(
            rest.iter().map(|i| i.ticket).collect::<Vec<_>>(),
            vec![3, 4]
        );
        let answers = stores.run_session_group(rest, &mut turns, |_| false, || Duration::ZERO);
        assert!(answers.iter().all(|(_, r)| r.is_ok()), "{answers:?}");
        assert_eq!(counting.shared.load(Ordering::Relaxed), 3);
        assert_eq!(
            stored(&stores),
            vec![
                ("a".to_owned(), 1),
                ("c".to_owned(), 1),
                ("d".to_owned(), 2)
            ]
        );
    }

    #[test]
    fn a_session_group_gives_way_after_the_time_allowed_on_a_fake_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (stores, _) = stores(dir.path());
        let mut turns = Turns::default();
        let clock = std::cell::Cell::new(Duration::ZERO);
        let group = vec![
            position(1, "a", 1),
            position(2, "b", 1),
            position(3, "c", 1),
        ];
        let answers = stores.run_session_group(
            group,
            &mut turns,
            |_| {
                // Each packet's writes take 3 ms.
                clock.set(clock.get() + Duration::from_millis(3));
                false
            },
            || clock.get(),
        );
        // 3 ms after the first: on; 6 ms after the second: past the 5 ms.
        assert_eq!(answers.len(), 2);
        assert_eq!(stored(&stores).len(), 2);
        let rest = turns.next().unwrap();
        assert_eq!(rest.iter().map(|i| i.ticket).collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn a_session_group_gives_way_to_a_publish_that_arrived() {
        let dir = tempfile::tempdir().unwrap();
        let (stores, _) = stores(dir.path());
        let mut turns = Turns::default();
        turns.push(position(1, "a", 1));
        turns.push(position(2, "b", 1));
        let group = turns.next().unwrap();
        assert_eq!(group.len(), 2);
        let mut arrived = false;
        let answers = stores.run_session_group(
            group,
            &mut turns,
            |turns| {
                if !arrived {
                    arrived = true;
                    turns.push(Intent {
                        ticket: 9,
                        role: crate::broker::state::Role::Channel(0),
                        class: Class::Publish,
                        writes: vec![Write::Append(Record::new(
                            "telemetry/b",
                            bytes::Bytes::from_static(b"y"),
                        ))],
                    });
                    return true;
                }
                false
            },
            || Duration::ZERO,
        );
        assert_eq!(answers.len(), 1);
        // The publish goes first, then the packet that gave way.
        let next: Vec<u64> = turns.next().unwrap().iter().map(|i| i.ticket).collect();
        assert_eq!(next, vec![9]);
        let next: Vec<u64> = turns.next().unwrap().iter().map(|i| i.ticket).collect();
        assert_eq!(next, vec![2]);
    }

    /// A restart's read hands every retained message over once, in the
    /// store's offset order, across the batches the reading thread sends,
    /// and on the thread that asked: from either provider.
    #[test]
    fn every_retained_message_is_handed_over_once_in_order_across_batches() {
        let dir = tempfile::tempdir().unwrap();
        for provider in crate::storage::both_providers(dir.path()) {
            let retained = provider.retained().unwrap();
            let count = served_batch::BATCH_VALUES * 2 + 7;
            // Written in the reverse of the topics' order, one written again.
            for i in (0..count).rev() {
                retained
                    .set(Record::new(
                        format!("t/{i:05}"),
                        bytes::Bytes::from_static(b"v"),
                    ))
                    .unwrap();
            }
            let mut again = Record::new("t/00010", bytes::Bytes::from_static(b"again"));
            again.props.content_type = Some("text/plain".into());
            again
                .user_properties
                .push(saguin_format::model::UserProperty {
                    name: "k".into(),
                    value: "v".into(),
                });
            retained.set(again).unwrap();
            let asking = std::thread::current().id();
            let mut handed = Vec::new();
            let mut lent_again = None;
            read_retained(&*provider, &mut |value| {
                assert_eq!(std::thread::current().id(), asking);
                handed.push((value.offset, value.topic.to_owned()));
                if value.topic == "t/00010" {
                    lent_again = Some((
                        value.payload.to_vec(),
                        value.props.content_type.clone(),
                        value.user_properties.to_vec(),
                    ));
                }
            })
            .unwrap();
            let name = provider.name();
            assert_eq!(handed.len(), count, "{name}");
            assert!(
                handed.windows(2).all(|w| w[0].0 < w[1].0),
                "{name}: offset order"
            );
            let topics: std::collections::BTreeSet<&str> =
                handed.iter().map(|(_, t)| t.as_str()).collect();
            assert_eq!(topics.len(), count, "{name}: each topic once");
            assert_eq!(
                handed.last().unwrap().1,
                "t/00010",
                "{name}: as last written"
            );
            let (payload, content_type, user_properties) = lent_again.unwrap();
            assert_eq!(payload, b"again", "{name}");
            assert_eq!(content_type.as_deref(), Some("text/plain"), "{name}");
            assert_eq!(user_properties.len(), 1, "{name}");
            provider.close().unwrap();
        }
    }

    /// A store that cannot be read is the read's error, and nothing is
    /// handed over.
    #[test]
    fn a_retained_read_that_fails_hands_nothing_over() {
        let dir = tempfile::tempdir().unwrap();
        let provider =
            SqliteProvider::open(SqliteOptions::new("db", dir.path().join("saguin.db"))).unwrap();
        provider.close().unwrap();
        let mut handed = 0;
        let read = read_retained(&provider, &mut |_| handed += 1);
        assert!(matches!(read, Err(StorageError::Closed { .. })), "{read:?}");
        assert_eq!(handed, 0);
    }

    /// A start's read hands the sessions over as they are read, and
    /// answers the log and its cursors, read beside them; a provider that
    /// cannot be read is the read's error, and nothing is handed over.
    #[test]
    fn the_sessions_are_handed_over_and_the_log_is_read_beside_them() {
        let dir = tempfile::tempdir().unwrap();
        let provider =
            SqliteProvider::open(SqliteOptions::new("db", dir.path().join("saguin.db"))).unwrap();
        let log = provider.broadcast_log().unwrap();
        let owed = log
            .append(Record::new("cmd/a", bytes::Bytes::from_static(b"x")))
            .unwrap();
        log.save_cursor("a", owed.offset).unwrap();
        provider
            .sessions()
            .unwrap()
            .save(crate::storage::contract::SessionEntry {
                client_id: "a".into(),
                principal: None,
                expiry_interval: 60,
                detached_at: 1,
                subscriptions: Vec::new(),
                will: None,
                window: 1,
                inflight: Vec::new(),
            })
            .unwrap();
        let mut handed = Vec::new();
        let restored = read_restored(&provider, &[], &mut |stored| {
            handed.extend(stored.into_iter().map(|s| s.client_id))
        })
        .unwrap();
        assert_eq!(handed, ["a"]);
        assert!(restored.sessions.is_empty(), "handed over, not kept");
        assert_eq!(restored.cursors, [("a".to_string(), owed.offset)]);
        let logged: Vec<u64> = restored.log.iter().map(|k| k.parts().offset).collect();
        assert_eq!(logged, [owed.offset]);

        provider.close().unwrap();
        let mut handed = 0;
        let read = read_restored(&provider, &[], &mut |_| handed += 1);
        assert!(matches!(read, Err(StorageError::Closed { .. })), "{read:?}");
        assert_eq!(handed, 0);
    }
}
