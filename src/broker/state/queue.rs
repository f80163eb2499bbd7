//! Queue channels: each record to one worker at a time, under a lease.
//!
//! A PUBLISH to a queue's topic enqueues a record (answered after the
//! commit, as an append is). A SUBSCRIBE whose filter's first level names
//! the queue makes the session a *worker*; a record goes to a connected
//! worker whose filter matches it and whose Receive Maximum has room, the
//! workers taking turns, at QoS 1.
//!
//! What is out with whom is the state's alone and never stored
//! (invariant 15): a delivery is an offset, the worker, the packet
//! identifier, the store's delivery id and epoch, and the moment its lease
//! ends on the state's clock. The store is asked, off the broker task, for
//! the records available at the state's moment (an offer: a read only);
//! each record handed out is then a lease written through the queue's
//! persister (the attempt count is the one thing stored), and only once it
//! has committed is the PUBLISH sent. A PUBACK below 0x80 resolves the
//! record (removed in one transaction); 0x80 or above, a lease that ran
//! out (looked at every tick) or the worker going away releases it: an
//! attempt was counted, and the store makes the record available again
//! after the backoff gap for that attempt - or, with its attempts spent,
//! moves it to `<queue>.dlq` with the `saguin-*` headers in one
//! transaction. A resolution or release that fails is tried again at the
//! next tick; the record stays held meanwhile, so it is never handed to a
//! second worker while the first may still finish it.
//!
//! Every moment handed to the store (the offer, the lease's end, the
//! backoff's start) is the state's injected clock as Unix time
//! ([`BrokerState::unix_at`]), so a test drives leases and backoff by
//! moving the clock, and a restart - which forgets every holder - starts
//! with every unresolved record available with its attempts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::consumer::{first_level, OFFSET_PROPERTY};
use super::ids::IdMap;
use super::intent::{Parked, QueueWrite, Role, Write};
use super::reads::{ChannelRead, ReadWindow, Seek};
use super::restore::RestoredChannel;
use super::session::{Inflight, InflightEntry, InflightPhase, QueuedMessage, SessionSubscription};
use super::{BrokerState, ReasonCode, StorageFailure};
use crate::broker::metrics::{DropReason, Metrics};
use crate::broker::subscriptions::SessionKey;
use crate::storage::contract::{Lease, RecordParts, Released, HEADER_ATTEMPTS};
use crate::topic;
use saguin_format::model::UnixNanos;

/// Most records one offer asks for.
const OFFER_MAX: usize = 256;

/// How far one delivery has got.
#[derive(Debug, Clone)]
enum Step {
    /// Its lease is being written.
    Leasing,
    /// Out with the worker under `packet_id` until `until`.
    Held {
        delivery_id: u64,
        epoch: u64,
        packet_id: u16,
        until: Instant,
    },
    /// The worker finished it; the resolution is being written (or is
    /// tried again at the next tick when `retry`).
    Resolving {
        delivery_id: u64,
        epoch: u64,
        retry: bool,
    },
    /// It failed for `reason`; the release is being written (or is tried
    /// again at the next tick when `retry`).
    Releasing {
        delivery_id: u64,
        epoch: u64,
        reason: String,
        retry: bool,
    },
}

#[derive(Debug, Clone)]
struct Delivery {
    worker: SessionKey,
    step: Step,
}

/// The queues' volatile halves, and the work the current event left them.
#[derive(Debug, Default)]
pub(super) struct Queues {
    /// By channel index.
    pub by_channel: BTreeMap<u16, Queue>,
    /// Queues to offer once the current event is handled.
    pub due: Vec<u16>,
    /// Offers out: ticket to the queue's channel index.
    pub offers_out: IdMap<u64, u16>,
    /// Queue writes the current event made, each sealed on its own.
    pub writes: Vec<(u16, Write, QueueWrite)>,
    /// Leases being written, counted by the worker each is for, across
    /// every queue: each already takes a place in that worker's window,
    /// which nothing else sent meanwhile (a broadcast delivery, a channel
    /// record, another queue's job) may take ([`Queues::window_taken`]).
    leasing: IdMap<SessionKey, u32>,
}

impl Queues {
    /// The places session `key`'s window has taken: its exchanges in
    /// flight (`inflight`) and the jobs being leased to it, not yet sent.
    /// Every delivery that needs an acknowledgement asks this.
    pub(super) fn window_taken(&self, key: SessionKey, inflight: &Inflight) -> usize {
        let leasing = match self.leasing.is_empty() {
            true => 0,
            false => self.leasing.get(&key).map_or(0, |n| *n as usize),
        };
        inflight.len() + leasing
    }

    /// A lease for `worker` is being written.
    fn lease_started(&mut self, worker: SessionKey) {
        *self.leasing.entry(worker).or_insert(0) += 1;
    }

    /// A lease for `worker` was written (its job is sent or given back) or
    /// failed.
    fn lease_ended(&mut self, worker: SessionKey) {
        if let Some(n) = self.leasing.get_mut(&worker) {
            *n -= 1;
            if *n == 0 {
                self.leasing.remove(&worker);
            }
        }
    }

    /// The queues among the restored channels, with nobody working yet.
    pub(super) fn restore(&mut self, restored: &[RestoredChannel], metrics: &Metrics) {
        for (i, channel) in restored.iter().enumerate() {
            let Some(setup) = &channel.queue else {
                continue;
            };
            self.by_channel.insert(
                i as u16,
                Queue {
                    name: channel.name.clone(),
                    lease: setup.lease,
                    max_held_per_worker: setup.max_held_per_worker,
                    dead_letter: setup.dead_letter,
                    workers: Vec::new(),
                    turn: 0,
                    out: BTreeMap::new(),
                    reading: false,
                    again: false,
                    retry_at: None,
                },
            );
            metrics.set_queue_in_flight(&channel.name, 0);
        }
    }

    /// A resolution committed: the record is gone.
    pub(super) fn resolved(&mut self, channel: u16, delivery_id: u64, metrics: &Metrics) {
        let Some(queue) = self.by_channel.get_mut(&channel) else {
            return;
        };
        queue.out.retain(
            |_, d| !matches!(d.step, Step::Resolving { delivery_id: id, .. } if id == delivery_id),
        );
        metrics.set_queue_in_flight(&queue.name, queue.out.len() as u64);
        self.due.push(channel);
    }

    /// A record was enqueued in `channel`.
    pub(super) fn committed(&mut self, channel: u16) {
        self.due.push(channel);
    }

    /// Session `key` may have room again (it connected, or drained): the
    /// queues it works for offer again.
    pub(super) fn worker_room(&mut self, key: SessionKey) {
        for (channel, queue) in &self.by_channel {
            if queue.workers.contains(&key) {
                self.due.push(*channel);
            }
        }
    }

    /// The delivery of queue `channel`'s record at `offset`, while it is out.
    fn delivery_mut(&mut self, channel: u16, offset: u64) -> Option<&mut Delivery> {
        self.by_channel
            .get_mut(&channel)
            .and_then(|q| q.out.get_mut(&offset))
    }

    /// Release the delivery of `offset` for `reason` (an attempt was
    /// counted when it was leased).
    fn release_delivery(
        &mut self,
        channel: u16,
        offset: u64,
        delivery_id: u64,
        epoch: u64,
        reason: String,
    ) {
        let Some(d) = self.delivery_mut(channel, offset) else {
            return;
        };
        d.step = Step::Releasing {
            delivery_id,
            epoch,
            reason: reason.clone(),
            retry: false,
        };
        // The moment is stamped when the write is sealed.
        self.writes.push((
            channel,
            Write::ReleaseLease {
                delivery_id,
                epoch,
                now: 0,
                reason,
            },
            QueueWrite::Release { channel, offset },
        ));
    }

    /// Worker `key` answered the delivery of `offset` under `packet_id`
    /// with a PUBACK of `reason`: below 0x80 it is resolved, otherwise
    /// released. A superseded delivery's answer (its lease ran out) does
    /// nothing.
    pub(super) fn acked(
        &mut self,
        key: SessionKey,
        channel: u16,
        offset: u64,
        packet_id: u16,
        reason: ReasonCode,
    ) {
        let Some(queue) = self.by_channel.get_mut(&channel) else {
            return;
        };
        let Some(d) = queue.out.get_mut(&offset) else {
            return;
        };
        let Step::Held {
            delivery_id,
            epoch,
            packet_id: held_as,
            ..
        } = d.step
        else {
            return;
        };
        if d.worker != key || held_as != packet_id {
            return;
        }
        let code = reason as u8;
        if code < 0x80 {
            self.resolve(channel, offset, delivery_id, epoch);
        } else {
            self.release_delivery(
                channel,
                offset,
                delivery_id,
                epoch,
                format!("the worker refused it (PUBACK reason 0x{code:02X})"),
            );
        }
    }

    /// The delivery of `offset` is done with (answered, or expired before
    /// it was sent): its resolution is written.
    fn resolve(&mut self, channel: u16, offset: u64, delivery_id: u64, epoch: u64) {
        let Some(d) = self.delivery_mut(channel, offset) else {
            return;
        };
        d.step = Step::Resolving {
            delivery_id,
            epoch,
            retry: false,
        };
        self.writes.push((
            channel,
            Write::Resolve { delivery_id, epoch },
            QueueWrite::Resolve { channel, offset },
        ));
    }

    /// A queue write failed: a lease is forgotten (the record is offered
    /// again), a resolution or release is tried again at the next tick.
    pub(super) fn write_failed(
        &mut self,
        write: QueueWrite,
        failure: StorageFailure,
        now: Instant,
    ) {
        let (channel, offset) = match write {
            QueueWrite::Lease { channel, offset }
            | QueueWrite::Resolve { channel, offset }
            | QueueWrite::Release { channel, offset } => (channel, offset),
        };
        let Some(queue) = self.by_channel.get_mut(&channel) else {
            return;
        };
        tracing::warn!(channel = %queue.name, offset, error = %failure.message, "a queue write failed; the record stays in the queue with its attempts and is tried again");
        match write {
            QueueWrite::Lease { .. } => {
                let worker = queue.out.remove(&offset).map(|d| d.worker);
                queue.retry_at = Some(now);
                if let Some(worker) = worker {
                    self.lease_ended(worker);
                }
            }
            QueueWrite::Resolve { .. } | QueueWrite::Release { .. } => {
                if let Some(d) = queue.out.get_mut(&offset) {
                    match &mut d.step {
                        Step::Resolving { retry, .. } | Step::Releasing { retry, .. } => {
                            *retry = true
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// At the tick, on the state's clock: a delivery whose lease ran out
    /// is released (an attempt was counted when it was leased), a
    /// resolution or release that failed is written again, and a queue
    /// whose backoff ended is due to be offered.
    pub(super) fn tick(&mut self, now: Instant, metrics: &Metrics) {
        let mut expired = Vec::new();
        let mut again = Vec::new();
        for (channel, queue) in &mut self.by_channel {
            for (offset, d) in &mut queue.out {
                match &mut d.step {
                    Step::Held {
                        delivery_id,
                        epoch,
                        until,
                        ..
                    } if *until <= now => expired.push((*channel, *offset, *delivery_id, *epoch)),
                    Step::Resolving {
                        delivery_id,
                        epoch,
                        retry,
                    } if *retry => {
                        *retry = false;
                        again.push((
                            *channel,
                            Write::Resolve {
                                delivery_id: *delivery_id,
                                epoch: *epoch,
                            },
                            QueueWrite::Resolve {
                                channel: *channel,
                                offset: *offset,
                            },
                        ));
                    }
                    Step::Releasing {
                        delivery_id,
                        epoch,
                        reason,
                        retry,
                    } if *retry => {
                        *retry = false;
                        again.push((
                            *channel,
                            Write::ReleaseLease {
                                delivery_id: *delivery_id,
                                epoch: *epoch,
                                now: 0,
                                reason: reason.clone(),
                            },
                            QueueWrite::Release {
                                channel: *channel,
                                offset: *offset,
                            },
                        ));
                    }
                    _ => {}
                }
            }
            if queue.retry_at.is_some_and(|at| at <= now) {
                queue.retry_at = None;
                self.due.push(*channel);
            }
        }
        self.writes.extend(again);
        for (channel, offset, delivery_id, epoch) in expired {
            // The packet identifier stays the worker's until it answers;
            // that answer finds the delivery superseded.
            if let Some(queue) = self.by_channel.get(&channel) {
                metrics.queue_lease_expired(&queue.name);
            }
            self.release_delivery(
                channel,
                offset,
                delivery_id,
                epoch,
                "the lease expired".to_owned(),
            );
        }
    }
}

/// One queue's volatile half.
#[derive(Debug)]
pub(super) struct Queue {
    name: Arc<str>,
    lease: Duration,
    /// Most records one worker holds (being leased or sent, not yet
    /// answered), within its window.
    max_held_per_worker: usize,
    dead_letter: Option<u16>,
    /// Sessions subscribed to it, connected or not.
    workers: Vec<SessionKey>,
    /// Whose turn is next.
    turn: usize,
    /// Records out with a worker or on their way to one, by offset.
    out: BTreeMap<u64, Delivery>,
    /// An offer is out.
    reading: bool,
    /// Something changed while it was: offer again when it is back.
    again: bool,
    /// The earliest moment a released record is available again.
    retry_at: Option<Instant>,
}

impl BrokerState {
    /// Session `key`'s subscriptions on queue `channel` changed: it works
    /// for the queue while it has one there.
    pub(super) fn refresh_worker(&mut self, key: SessionKey, channel: u16, _now: Instant) {
        let subscribed = self.worker_filters(key, channel).next().is_some();
        let Some(queue) = self.queues.by_channel.get_mut(&channel) else {
            return;
        };
        let known = queue.workers.contains(&key);
        if subscribed && !known {
            queue.workers.push(key);
        } else if !subscribed && known {
            // What it holds stays its own until it answers or goes away.
            queue.workers.retain(|k| *k != key);
        }
        self.queues.due.push(channel);
    }

    /// The filters of session `key` on queue `channel`, shared or not.
    fn worker_filters(
        &self,
        key: SessionKey,
        channel: u16,
    ) -> impl Iterator<Item = (&str, &SessionSubscription)> {
        let name = self
            .channels
            .all
            .get(channel as usize)
            .map(|c| c.name.clone());
        self.sessions
            .by_key
            .get(&key)
            .into_iter()
            .flat_map(move |s| {
                let name = name.clone();
                s.subscriptions
                    .iter()
                    .map(|(raw, sub)| (sub.filter(raw), sub))
                    .filter(move |(filter, _)| name.as_deref() == Some(first_level(filter)))
            })
    }

    /// Room worker `key` has for one more delivery: its window less what
    /// it holds and what is on its way to it, and no more than the
    /// queue lets one worker hold.
    fn worker_room_of(&self, queue: &Queue, key: SessionKey) -> usize {
        let Some(session) = self.sessions.by_key.get(&key) else {
            return 0;
        };
        let Some(connection) = session.connection() else {
            return 0;
        };
        let Some(conn) = self.connections.get(&connection) else {
            return 0;
        };
        let (leasing, sent) = queue.out.values().filter(|d| d.worker == key).fold(
            (0, 0),
            |(leasing, sent), d| match d.step {
                Step::Leasing => (leasing + 1, sent),
                Step::Held { .. } => (leasing, sent + 1),
                Step::Resolving { .. } | Step::Releasing { .. } => (leasing, sent),
            },
        );
        let window = conn
            .window()
            .saturating_sub(self.queues.window_taken(key, &session.inflight));
        window.min(queue.max_held_per_worker.saturating_sub(leasing + sent))
    }

    /// Offer every queue the event made due.
    pub(super) fn run_queue_pumps(&mut self, now: Instant) {
        if self.queues.due.is_empty() {
            return;
        }
        let mut due = std::mem::take(&mut self.queues.due);
        due.sort_unstable();
        due.dedup();
        for channel in due {
            self.offer_queue(channel, now);
        }
    }

    /// Ask the store for what `channel` has available, as much as its
    /// workers have room for.
    fn offer_queue(&mut self, channel: u16, now: Instant) {
        let Some(queue) = self.queues.by_channel.get(&channel) else {
            return;
        };
        if queue.reading {
            self.queues
                .by_channel
                .get_mut(&channel)
                .expect("looked up")
                .again = true;
            return;
        }
        let room: usize = queue
            .workers
            .iter()
            .map(|k| self.worker_room_of(queue, *k))
            .sum();
        if room == 0 {
            return;
        }
        let leasing = queue
            .out
            .values()
            .filter(|d| matches!(d.step, Step::Leasing))
            .count();
        let ticket = self.reads.number();
        let moment = self.receipt_time(now);
        let queue = self.queues.by_channel.get_mut(&channel).expect("looked up");
        queue.reading = true;
        queue.again = false;
        self.queues.offers_out.insert(ticket, channel);
        self.reads.waiting.push(ChannelRead {
            ticket,
            channel,
            from: Seek::Time(moment),
            // Records being leased are not held in the store yet: read
            // past them.
            max: (room + leasing).clamp(1, OFFER_MAX),
            filters: Vec::new(),
        });
    }

    /// An offer came back: each record to a worker with room whose filter
    /// matches it, as a lease to write. False when the ticket is not one.
    pub(super) fn on_offer_read(
        &mut self,
        ticket: u64,
        result: &Result<ReadWindow, StorageFailure>,
        now: Instant,
    ) -> bool {
        let Some(channel) = self.queues.offers_out.remove(&ticket) else {
            return false;
        };
        let Some(queue) = self.queues.by_channel.get_mut(&channel) else {
            return true;
        };
        queue.reading = false;
        let window = match result {
            Ok(window) => window,
            Err(failure) => {
                tracing::warn!(channel = %queue.name, error = %failure.message, "offering a queue's records failed; offered again at the next tick");
                queue.retry_at = Some(now);
                return true;
            }
        };
        let lease = queue.lease;
        for record in &window.records {
            let queue = &self.queues.by_channel[&channel];
            if queue.out.contains_key(&record.offset()) {
                continue;
            }
            let Some(worker) = self.next_worker(channel, record.topic()) else {
                break;
            };
            let holder = self.sessions.by_key[&worker].client_id.to_string();
            let queue = self.queues.by_channel.get_mut(&channel).expect("looked up");
            queue.out.insert(
                record.offset(),
                Delivery {
                    worker,
                    step: Step::Leasing,
                },
            );
            self.queues.lease_started(worker);
            let write = Write::Lease {
                offset: record.offset(),
                holder,
                lease_until: self.receipt_time(now + lease),
                now: self.receipt_time(now),
            };
            self.queues.writes.push((
                channel,
                write,
                QueueWrite::Lease {
                    channel,
                    offset: record.offset(),
                },
            ));
        }
        if self.queues.by_channel[&channel].again {
            self.queues.due.push(channel);
        }
        true
    }

    /// The next worker, in turn, with room and a filter matching `topic`.
    fn next_worker(&mut self, channel: u16, topic_name: &str) -> Option<SessionKey> {
        let queue = self.queues.by_channel.get(&channel)?;
        let count = queue.workers.len();
        for step in 0..count {
            let at = (queue.turn + step) % count;
            let key = queue.workers[at];
            if self.worker_room_of(queue, key) == 0 {
                continue;
            }
            let matches = self
                .worker_filters(key, channel)
                .any(|(filter, _)| topic::filter_matches(filter, topic_name));
            if matches {
                self.queues
                    .by_channel
                    .get_mut(&channel)
                    .expect("looked up")
                    .turn = at + 1;
                return Some(key);
            }
        }
        None
    }

    /// A lease committed: the record goes to its worker now, or back at
    /// once when the worker went away meanwhile.
    pub(super) fn leased(&mut self, channel: u16, lease: Lease, now: Instant) {
        let Some(queue) = self.queues.by_channel.get(&channel) else {
            return;
        };
        self.metrics.queue_attempt(&queue.name);
        let Some(worker) = queue.out.get(&lease.offset).map(|d| d.worker) else {
            return;
        };
        self.queues.lease_ended(worker);
        let connection = self
            .sessions
            .by_key
            .get(&worker)
            .and_then(|s| s.connection());
        let packet_id = connection.and_then(|_| {
            self.sessions
                .by_key
                .get_mut(&worker)
                .and_then(|s| s.inflight.allocate_id())
        });
        let (Some(connection), Some(packet_id)) = (connection, packet_id) else {
            self.queues.release_delivery(
                channel,
                lease.offset,
                lease.delivery_id,
                lease.epoch,
                "the worker went away".to_owned(),
            );
            return;
        };
        let subscription_ids: Vec<u32> = self
            .worker_filters(worker, channel)
            .filter(|(filter, _)| topic::filter_matches(filter, &lease.record.topic))
            .filter_map(|(_, s)| s.options.subscription_id)
            .collect();
        let mut message = self.consumer_message_of(
            &RecordParts::from(&lease.record),
            lease.record.payload.clone(),
            None,
            now,
        );
        // The offset among the properties, so the attempts follow it.
        let user = &mut message.properties.user_properties;
        if let Some(offset) = message.channel_offset.take() {
            user.push((OFFSET_PROPERTY.to_owned(), offset.to_string()));
        }
        user.push((HEADER_ATTEMPTS.to_owned(), lease.attempts.to_string()));
        let queued = QueuedMessage {
            message: Arc::new(message),
            qos: 1,
            retain: false,
            subscription_ids: subscription_ids.into(),
            logged: None,
        };
        if queued.message.expiry_left(now).is_err() {
            // Its publisher's Message Expiry Interval ran out while it
            // waited: never delivered, as no expired message is, but
            // resolved and counted, where sent it took a place in the
            // worker's window that nothing would ever free.
            self.metrics.dropped(DropReason::Expired);
            self.queues
                .resolve(channel, lease.offset, lease.delivery_id, lease.epoch);
            return;
        }
        let until = now + self.queues.by_channel[&channel].lease;
        let session = self.sessions.by_key.get_mut(&worker).expect("looked up");
        session.inflight.push(InflightEntry {
            packet_id,
            phase: InflightPhase::AwaitPuback,
            qos: 1,
            log_offset: None,
            queued: Some(queued.clone()),
            channel: Some((channel, lease.offset)),
            unsent: false,
        });
        let queue = self.queues.by_channel.get_mut(&channel).expect("looked up");
        if let Some(d) = queue.out.get_mut(&lease.offset) {
            d.step = Step::Held {
                delivery_id: lease.delivery_id,
                epoch: lease.epoch,
                packet_id,
                until,
            };
        }
        self.metrics
            .set_queue_in_flight(&queue.name, queue.out.len() as u64);
        self.transmit(connection, queued, packet_id, false, now);
    }

    /// A release committed: the record waits out its backoff, or went to
    /// the dead-letter channel, whose consumers then read it.
    pub(super) fn released(
        &mut self,
        channel: u16,
        delivery_id: u64,
        released: Released,
        now: Instant,
    ) {
        let Some(queue) = self.queues.by_channel.get_mut(&channel) else {
            return;
        };
        queue.out.retain(
            |_, d| !matches!(d.step, Step::Releasing { delivery_id: id, .. } if id == delivery_id),
        );
        self.metrics
            .set_queue_in_flight(&queue.name, queue.out.len() as u64);
        match released {
            Released::Retry { not_before, .. } => {
                let at = self.instant_at(not_before, now);
                let queue = self.queues.by_channel.get_mut(&channel).expect("looked up");
                queue.retry_at = Some(queue.retry_at.map_or(at, |r| r.min(at)));
            }
            Released::DeadLettered { dlq_offset, .. } => {
                let queue = &self.queues.by_channel[&channel];
                self.metrics.queue_dead_lettered(&queue.name);
                if let Some(dlq) = queue.dead_letter {
                    self.channel_advanced(dlq, dlq_offset + 1, now);
                }
            }
            Released::Stale => {}
        }
        self.queues.due.push(channel);
    }

    /// The channel of `channel` has records below `next` the state was
    /// not handed (a dead-letter move): its consumers read them.
    fn channel_advanced(&mut self, channel: u16, next: u64, now: Instant) {
        if self.channels.all.get(channel as usize).is_none() {
            return;
        }
        // The records below `next` were not offered to those following
        // the tail: none is moved past them.
        self.leave_following_all(channel);
        let state = &mut self.channels.all[channel as usize];
        state.next = state.next.max(next);
        let consumers = state.consumers.clone();
        for key in consumers {
            if let Some(index) = self.sessions.consumer_index(key, channel) {
                self.pump(key, index, now);
            }
        }
    }

    /// Session `key`'s connection went away: what it held is released
    /// (an attempt each) and its packets for them are forgotten, so a
    /// resumed session is not sent them again.
    pub(super) fn worker_gone(&mut self, key: SessionKey) {
        let mut gone = Vec::new();
        for (channel, queue) in &self.queues.by_channel {
            for (offset, d) in &queue.out {
                if let (
                    true,
                    Step::Held {
                        delivery_id,
                        epoch,
                        packet_id,
                        ..
                    },
                ) = (d.worker == key, &d.step)
                {
                    gone.push((*channel, *offset, *delivery_id, *epoch, *packet_id));
                }
            }
        }
        for (channel, offset, delivery_id, epoch, packet_id) in gone {
            if let Some(session) = self.sessions.by_key.get_mut(&key) {
                session.inflight.remove(packet_id);
            }
            self.queues.release_delivery(
                channel,
                offset,
                delivery_id,
                epoch,
                "the worker went away".to_owned(),
            );
        }
    }

    /// Session `key` ended: it works for no queue any more.
    pub(super) fn forget_worker(&mut self, key: SessionKey) {
        self.worker_gone(key);
        for queue in self.queues.by_channel.values_mut() {
            queue.workers.retain(|k| *k != key);
        }
    }

    /// The tick: leases that ran out are released, failed writes tried
    /// again, and queues whose backoff ended offered again.
    pub(super) fn tick_queues(&mut self, now: Instant) {
        self.queues.tick(now, &self.metrics);
        self.run_queue_pumps(now);
        self.seal_queue_writes(now);
    }

    /// Seal each queue write made by the current event as a write of its
    /// own (one transaction, one answer), after whatever else the event
    /// staged, so no other packet's answer waits on it.
    pub(super) fn seal_queue_writes(&mut self, now: Instant) {
        if self.queues.writes.is_empty() {
            return;
        }
        if self.persist.has_staged() {
            self.persist.seal_background();
        }
        let moment = self.receipt_time(now);
        for (channel, mut write, parked) in std::mem::take(&mut self.queues.writes) {
            if let Write::ReleaseLease { now, .. } = &mut write {
                *now = moment;
            }
            self.persist.stage(Role::Channel(channel), write);
            self.persist.seal(Parked::Queue(parked));
        }
    }

    /// The instant the Unix time `at` is on the state's clock (`now` when
    /// it has passed).
    fn instant_at(&self, at: UnixNanos, now: Instant) -> Instant {
        let ahead = at.saturating_sub(self.receipt_time(now));
        if ahead <= 0 {
            return now;
        }
        now + Duration::from_nanos(ahead as u64)
    }

    /// Records out with workers in queue `name`: for tests.
    #[cfg(test)]
    pub(super) fn queue_in_flight(&self, name: &str) -> Vec<(u64, SessionKey)> {
        self.queues
            .by_channel
            .values()
            .filter(|q| &*q.name == name)
            .flat_map(|q| q.out.iter().map(|(o, d)| (*o, d.worker)))
            .collect()
    }
}
