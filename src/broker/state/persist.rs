//! Writes: what the state asks its providers to store, and what it does
//! once they have.
//!
//! The state never calls storage. A handler that must persist stages
//! [`Write`]s for a [`Role`] and seals them with what it owes the client
//! (a [`Parked`] answer); sealing turns each role's writes into an
//! [`Intent`] with a ticket, which the server hands to that role's
//! persister. [`Event::Committed`](super::Event::Committed) with the ticket
//! releases the answer. A sealed group waits for every ticket it made (a
//! retained publish to a topic persistent sessions are owed writes to two
//! roles) and is answered with the first failure, if any.
//!
//! The broadcast log: a QoS 1/2 message owed to at least one persistent
//! session is appended once, however many sessions are owed it, and each
//! persistent session holding it (queued or in flight) holds one
//! reference. An entry nobody references any more is released from the log
//! with the others released meanwhile, on the next flush. A session's
//! cursor is the lowest offset it still holds (or the log's next offset
//! when it holds none), so a stored cursor never passes what the session is
//! still owed.

use std::collections::{BTreeMap, VecDeque};

use saguin_format::model::{Record, UnixNanos};
use tokio::time::Instant;

use super::ids::{IdMap, IdSet};
use super::intent::{Class, Intent, Parked, Role, StorageFailure, Write, Written};
use super::records::{publish_props_of, user_properties_of, will_entry};
use super::session::InflightPhase;
use super::{BrokerState, Outbound, ReasonCode};
use crate::broker::lazy::Lazy;
use crate::broker::message::Message;
use crate::broker::metrics::{CloseReason, DropReason};
use crate::broker::subscriptions::SessionKey;
use crate::storage::contract::{
    HeldPublish, InflightEntry as StoredInflight, InflightPhase as StoredPhase, SessionEntry,
    ShareGroupKey, SubscriptionEntry, BROADCAST_LOG_NAME,
};

#[derive(Debug)]
struct Wait {
    remaining: usize,
    failure: Option<StorageFailure>,
    appended: Option<u64>,
    place: Place,
}

/// Where a wait's answer is released.
#[derive(Debug)]
enum Place {
    /// In a connection's queue of answers, behind those before it.
    Queued { connection: u64, answer: u64 },
    /// On its own: nobody's packet waits (or its connection went away).
    Alone(Parked),
}

/// The answer numbered `id` in a connection's queue: answers are numbered
/// one past the last one queued and leave from the front, so it is `id`
/// less the front's number from the front - found without a walk of a
/// queue thousands of pipelined publishes long.
fn queued_answer(
    answers: &mut Lazy<VecDeque<super::Answer>>,
    id: u64,
) -> Option<&mut super::Answer> {
    let answers = answers.allocated_mut()?;
    let front = answers.front()?.id;
    let at = usize::try_from(id.wrapping_sub(front)).ok()?;
    answers.get_mut(at).filter(|a| a.id == id)
}

/// The state's bookkeeping of writes.
#[derive(Debug)]
pub(super) struct Persistence {
    next_ticket: u64,
    next_wait: u64,
    /// By [`Role::index`].
    staged: Vec<Vec<Write>>,
    /// The indices of `staged` that hold writes: a seal looks at these,
    /// not at every role (a role for each of up to 10,000 channels, where
    /// a publish stages for one).
    staged_roles: Vec<usize>,
    intents: Vec<Intent>,
    tickets: IdMap<u64, u64>,
    waits: IdMap<u64, Wait>,
    /// Persistent sessions holding each broadcast-log entry.
    log_refs: BTreeMap<u64, u32>,
    /// Entries nobody holds any more, released at the next flush.
    releasable: Vec<u64>,
    /// The log's next offset, as far as commits have told.
    pub log_next: u64,
    /// Sessions whose in-flight table or cursor changed since written.
    dirty: IdSet<SessionKey>,
    /// Answers of connections that went away, ready to be released (their
    /// publishes are still routed; their acknowledgements go nowhere).
    orphans: Vec<(Parked, Option<StorageFailure>, Option<u64>)>,
    next_message_id: u64,
}

impl Default for Persistence {
    fn default() -> Self {
        Self {
            next_ticket: 1,
            next_wait: 1,
            staged: vec![Vec::new(), Vec::new()],
            staged_roles: Vec::new(),
            intents: Vec::new(),
            tickets: IdMap::default(),
            waits: IdMap::default(),
            log_refs: BTreeMap::new(),
            releasable: Vec::new(),
            log_next: 1,
            dirty: IdSet::default(),
            orphans: Vec::new(),
            next_message_id: 1,
        }
    }
}

// The bookkeeping alone: what is staged and sealed, the waits, the
// broadcast log's references. What an answer does to sessions and
// connections is `BrokerState`'s, below.
impl Persistence {
    /// A write for `role`, sealed with the next seal.
    pub(super) fn stage(&mut self, role: Role, write: Write) {
        let index = role.index();
        if self.staged.len() <= index {
            self.staged.resize_with(index + 1, Vec::new);
        }
        let staged = &mut self.staged[index];
        if staged.is_empty() {
            self.staged_roles.push(index);
        }
        // Most seals hold one write, and the vector goes with the intent:
        // room for one `Write` (352 bytes), not the four a first push
        // makes room for.
        if staged.capacity() == 0 {
            staged.reserve_exact(1);
        }
        staged.push(write);
    }

    pub(super) fn has_staged(&self) -> bool {
        !self.staged_roles.is_empty()
    }

    /// Turn what was staged into intents answered at `place`. Returns the
    /// wait's id, or `None` when nothing was staged.
    fn seal_at(&mut self, place: Place) -> Option<u64> {
        if !self.has_staged() {
            return None;
        }
        let session_class = match &place {
            Place::Alone(Parked::Background) | Place::Alone(Parked::Close { .. }) => {
                Class::Departed
            }
            Place::Alone(Parked::Flush { .. }) => Class::Connected,
            Place::Queued { .. } | Place::Alone(_) => Class::Answering,
        };
        let wait = self.next_wait;
        self.next_wait += 1;
        let mut remaining = 0;
        // Retained first, then sessions, then channels: the order a
        // packet's writes are issued in.
        let mut order = std::mem::take(&mut self.staged_roles);
        order.sort_unstable_by_key(|&index| match Role::of_index(index) {
            Role::Retained => 0,
            Role::Sessions => 1,
            Role::Channel(channel) => 2 + usize::from(channel),
        });
        for index in order {
            let role = Role::of_index(index);
            let writes = std::mem::take(&mut self.staged[index]);
            if writes.is_empty() {
                continue;
            }
            // A packet's publish writes and its session writes go in
            // intents of their own: a provider groups each with its kind.
            let (publish, session) = split_publishes(writes);
            for (class, writes) in [(Class::Publish, publish), (session_class, session)] {
                if writes.is_empty() {
                    continue;
                }
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                remaining += 1;
                self.tickets.insert(ticket, wait);
                self.intents.push(Intent {
                    ticket,
                    role,
                    class,
                    writes,
                });
            }
        }
        self.waits.insert(
            wait,
            Wait {
                remaining,
                failure: None,
                appended: None,
                place,
            },
        );
        Some(wait)
    }

    /// Seal what was staged, answered by `parked` on its own.
    pub(super) fn seal(&mut self, parked: Parked) -> Option<u64> {
        self.seal_at(Place::Alone(parked))
    }

    /// Write what nobody waits for.
    pub(super) fn seal_background(&mut self) {
        self.seal(Parked::Background);
    }

    /// A connection went away with answers still queued: each is answered
    /// on its own once its commit arrives (its publishes are still routed),
    /// those ready now at the end of the current event.
    pub(super) fn orphan_answers(&mut self, answers: VecDeque<super::Answer>) {
        for a in answers {
            match a.wait {
                Some(wait) => {
                    if let Some(w) = self.waits.get_mut(&wait) {
                        w.place = Place::Alone(a.parked);
                    }
                }
                None => self.orphans.push((a.parked, a.failure, a.appended)),
            }
        }
    }

    /// A persistent session now holds log entry `offset`.
    pub(super) fn hold_log(&mut self, key: SessionKey, offset: u64) {
        *self.log_refs.entry(offset).or_default() += 1;
        self.dirty.insert(key);
    }

    /// An entry appended that no session ended up holding.
    pub(super) fn release_unheld(&mut self, offset: u64) {
        if !self.log_refs.contains_key(&offset) {
            self.releasable.push(offset);
        }
    }

    pub(super) fn clear_dirty(&mut self) {
        self.dirty.clear();
    }

    pub(super) fn mark_dirty(&mut self, key: SessionKey) {
        self.dirty.insert(key);
    }

    /// A persistent session let go of log entry `offset` (acknowledged,
    /// dropped, or its session ended).
    pub(super) fn unhold_log(&mut self, key: Option<SessionKey>, offset: u64) {
        if let Some(key) = key {
            self.dirty.insert(key);
        }
        let Some(count) = self.log_refs.get_mut(&offset) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            self.log_refs.remove(&offset);
            self.releasable.push(offset);
            if self.releasable.len() >= RELEASE_AT {
                let offsets = std::mem::take(&mut self.releasable);
                self.stage(Role::Sessions, Write::ReleaseLog(offsets));
                self.seal_background();
            }
        }
    }
}

/// A packet's publish writes and its other writes, apart. Nearly every
/// seal holds writes of one kind: those keep their vector, since a new one
/// sized for a `Write` is past the allocator's per-thread cache and, with a
/// large heap (a memory channel's records), its slowest path.
fn split_publishes(writes: Vec<Write>) -> (Vec<Write>, Vec<Write>) {
    let publishes = writes.iter().filter(|w| w.is_publish()).count();
    if publishes == writes.len() {
        (writes, Vec::new())
    } else if publishes == 0 {
        (Vec::new(), writes)
    } else {
        writes.into_iter().partition(Write::is_publish)
    }
}

/// Sessions one intent of a flush writes.
const FLUSH_SESSIONS: usize = 64;

/// Released log entries written at once rather than at the next flush.
const RELEASE_AT: usize = 500;

impl BrokerState {
    /// Writes the providers must commit, in the order they were made; the
    /// server hands each to its role's persister.
    pub fn take_intents(&mut self, out: &mut Vec<Intent>) {
        out.append(&mut self.persist.intents);
    }

    /// Intents issued and not answered yet (shutdown waits for none).
    pub fn writes_outstanding(&self) -> usize {
        self.persist.tickets.len()
    }

    /// Queue `parked` as `connection`'s next answer: released once what was
    /// staged for it has committed and every answer before it is released.
    /// With nothing staged and nothing before it, it is answered at once.
    pub(super) fn park_or_answer(&mut self, connection: u64, parked: Parked, now: Instant) {
        let queued = self
            .connections
            .get(&connection)
            .map(|c| !c.answers.is_empty());
        let staged = self.persist.has_staged();
        match queued {
            None => {
                // The connection is gone: only what the packet wrote
                // remains to be answered, on its own.
                if staged {
                    self.persist.seal(parked);
                } else {
                    self.answer(parked, None, None, now);
                }
                return;
            }
            Some(false) if !staged => {
                self.answer(parked, None, None, now);
                return;
            }
            Some(_) => {}
        }
        let id = {
            let conn = self
                .connections
                .get_mut(&connection)
                .expect("looked up above");
            // Unique among the answers queued: an answer leaves the queue
            // only once no wait names it any more.
            conn.answers.back().map_or(0, |a| a.id.wrapping_add(1))
        };
        let wait = self.persist.seal_at(Place::Queued {
            connection,
            answer: id,
        });
        let conn = self
            .connections
            .get_mut(&connection)
            .expect("looked up above");
        conn.answers.push_back(super::Answer {
            id,
            wait,
            failure: None,
            appended: None,
            parked,
        });
        if conn.answers.len() == super::ANSWERS_PAUSE {
            conn.handle.set_paused(true);
        }
        if wait.is_none() {
            self.release_answers(connection, now);
        }
    }

    /// Seal with `parked` (a publish without a connection waiting, such as a
    /// Will), or answer it at once when nothing was staged.
    pub(super) fn seal_or_answer(&mut self, parked: Parked, now: Instant) {
        if !self.persist.has_staged() {
            self.answer(parked, None, None, now);
            return;
        }
        self.persist.seal(parked);
    }

    pub(super) fn on_committed(
        &mut self,
        ticket: u64,
        result: Result<Vec<Written>, super::StorageFailure>,
        now: Instant,
    ) {
        let Some(wait_id) = self.persist.tickets.remove(&ticket) else {
            return;
        };
        let mut appended = None;
        let mut retained_kept = None;
        let mut logged_kept = None;
        let failure = match result {
            Ok(written) => {
                for w in written {
                    match w {
                        Written::Appended(offset, kept) => {
                            appended = Some(offset);
                            logged_kept = kept;
                            self.persist.log_next = self.persist.log_next.max(offset + 1);
                        }
                        Written::Retained(kept) => retained_kept = Some(kept),
                        // Consumers get a record as soon as it is
                        // committed, in commit order, whatever its
                        // publisher still waits for.
                        Written::Stored(channel, record) => {
                            self.channel_committed(channel, record, now)
                        }
                        Written::Leased(channel, lease) => self.leased(channel, *lease, now),
                        Written::Resolved(channel, delivery, _) => {
                            self.queues.resolved(channel, delivery, &self.metrics)
                        }
                        Written::Released(channel, delivery, released) => {
                            self.released(channel, delivery, released, now)
                        }
                        Written::Done => {}
                    }
                }
                None
            }
            Err(failure) => Some(failure),
        };
        let Some(wait) = self.persist.waits.get_mut(&wait_id) else {
            return;
        };
        if retained_kept.is_some() || logged_kept.is_some() {
            // Handed to the publish that wrote them, which the retained
            // index and the deliveries take them from when it is answered.
            let parked = match &mut wait.place {
                Place::Alone(parked) => Some(parked),
                Place::Queued { connection, answer } => self
                    .connections
                    .get_mut(connection)
                    .and_then(|c| queued_answer(&mut c.answers, *answer))
                    .map(|a| &mut a.parked),
            };
            if let Some(Parked::Publish(p)) = parked {
                if retained_kept.is_some() {
                    p.retained_kept = retained_kept;
                }
                if logged_kept.is_some() {
                    p.logged_kept = logged_kept;
                }
            }
        }
        wait.remaining -= 1;
        if appended.is_some() {
            wait.appended = appended;
        }
        if let Some(failure) = failure {
            wait.failure.get_or_insert(failure);
        }
        if wait.remaining > 0 {
            return;
        }
        let wait = self
            .persist
            .waits
            .remove(&wait_id)
            .expect("looked up above");
        match wait.place {
            Place::Alone(parked) => self.answer(parked, wait.failure, wait.appended, now),
            Place::Queued { connection, answer } => {
                let Some(conn) = self.connections.get_mut(&connection) else {
                    return;
                };
                if let Some(a) = queued_answer(&mut conn.answers, answer) {
                    a.wait = None;
                    a.failure = wait.failure;
                    a.appended = wait.appended;
                }
                self.release_answers(connection, now);
            }
        }
    }

    /// Release `connection`'s answers from the front while they are ready.
    fn release_answers(&mut self, connection: u64, now: Instant) {
        loop {
            let Some(conn) = self.connections.get_mut(&connection) else {
                return;
            };
            if conn.answers.front().is_none_or(|a| a.wait.is_some()) {
                if conn.answers.is_empty() {
                    // A persistent client's CONNACK waits on a write: the
                    // queue it took is given back, not kept by a device
                    // quiet for hours (room for four answers, 800 bytes).
                    conn.answers.take();
                }
                if conn.answers.len() < super::ANSWERS_PAUSE / 2 && self.has_room(connection) {
                    self.connections[&connection].handle.set_paused(false);
                }
                return;
            }
            let a = conn.answers.pop_front().expect("front checked");
            self.answer(a.parked, a.failure, a.appended, now);
        }
    }

    pub(super) fn run_orphans(&mut self, now: Instant) {
        while !self.persist.orphans.is_empty() {
            let orphans = std::mem::take(&mut self.persist.orphans);
            for (parked, failure, appended) in orphans {
                self.answer(parked, failure, appended, now);
            }
        }
    }

    /// Release what a sealed group owed, now that its writes are answered.
    fn answer(
        &mut self,
        parked: Parked,
        failure: Option<StorageFailure>,
        appended: Option<u64>,
        now: Instant,
    ) {
        match parked {
            Parked::Background => {}
            Parked::Queue(write) => {
                if let Some(failure) = failure {
                    self.queues.write_failed(write, failure, now);
                }
            }
            Parked::Reply { connection, packet } => self.send(connection, packet),
            Parked::Close {
                connection,
                reason,
                code,
            } => self.close(connection, reason, code, now),
            Parked::Flush { clients, sealed } => {
                if failure.is_some() {
                    for client in clients {
                        if let Some(key) = self.sessions.of_client(&client) {
                            self.persist.dirty.insert(key);
                        }
                    }
                } else {
                    self.metrics
                        .acknowledgements_stored(now.saturating_duration_since(sealed));
                }
            }
            Parked::ConnAck {
                connection,
                key,
                ack,
                replay,
            } => self.answer_connect(connection, key, ack, replay, failure, now),
            Parked::SubAck {
                connection,
                key,
                packet_id,
                reasons,
                reason_string,
                retained_for,
                undo,
                consumers,
            } => match failure {
                None => {
                    self.send(
                        connection,
                        Outbound::SubAck {
                            packet_id,
                            reasons,
                            reason_string,
                        },
                    );
                    let fresh = self.fresh_latest_consumers(key, &consumers);
                    let values_for = retained_for.clone();
                    self.deliver_retained(connection, key, retained_for, now);
                    for start in consumers {
                        if !self.sessions.by_key.contains_key(&key) {
                            break;
                        }
                        if self.channels.is_queue(start.channel) {
                            self.refresh_worker(key, start.channel, now);
                            continue;
                        }
                        match &start.group {
                            Some((raw, filter)) => {
                                self.join_group(key, start.channel, raw, filter, start.seek)
                            }
                            None => {
                                self.refresh_consumer(key, start.channel, start.seek, None, now);
                                self.sessions.started_stored(key, &start);
                            }
                        }
                    }
                    self.latest_values(connection, key, &fresh, &values_for);
                }
                Some(failure) => {
                    self.undo_subscriptions(key, undo);
                    // A start written beside a subscription that was not.
                    for start in consumers.iter().filter(|s| s.stored.is_some()) {
                        self.drop_position(key, start.channel);
                    }
                    let code = failure.reason_code();
                    let reasons = reasons
                        .into_iter()
                        .map(|r| if r.is_error() { r } else { code })
                        .collect();
                    self.refuse_or_answer(
                        connection,
                        Outbound::SubAck {
                            packet_id,
                            reasons,
                            reason_string,
                        },
                    );
                }
            },
            Parked::UnsubAck {
                connection,
                key,
                packet_id,
                reasons,
                undo,
                channels,
            } => match failure {
                None => {
                    self.send(connection, Outbound::UnsubAck { packet_id, reasons });
                    for (channel, raw) in channels {
                        if !self.sessions.by_key.contains_key(&key) {
                            break;
                        }
                        if self.channels.is_queue(channel) {
                            self.refresh_worker(key, channel, now);
                        } else if crate::topic::split_shared(&raw).is_some() {
                            self.leave_group(key, &raw);
                        } else {
                            self.refresh_consumer(key, channel, None, None, now);
                        }
                    }
                }
                Some(failure) => {
                    for (raw, sub) in undo {
                        self.resubscribe(key, raw, sub);
                    }
                    let code = failure.reason_code();
                    let reasons = reasons
                        .into_iter()
                        .map(|r| if r.is_error() { r } else { code })
                        .collect();
                    self.refuse_or_answer(connection, Outbound::UnsubAck { packet_id, reasons });
                }
            },
            Parked::Publish(p) => self.answer_publish(*p, failure, appended, now),
            Parked::PubComp {
                connection,
                packet_id,
            } => {
                let packet = Outbound::PubComp {
                    packet_id,
                    reason: failure
                        .as_ref()
                        .map_or(ReasonCode::Success, StorageFailure::reason_code),
                };
                if failure.is_some() {
                    self.refuse_or_answer(connection, packet);
                } else {
                    self.send(connection, packet);
                }
            }
        }
    }

    /// A failed write's answer: MQTT 5 gets the packet with its reason
    /// code; MQTT 3.1.1 has no code to carry it and is disconnected.
    pub(super) fn refuse_or_answer(&mut self, connection: u64, packet: Outbound) {
        let Some(conn) = self.connections.get(&connection) else {
            return;
        };
        if conn.v5 {
            self.send(connection, packet);
        } else {
            tracing::warn!(client_id = %self.client_id_of(conn), "disconnecting an MQTT 3.1.1 client: a write its packet caused failed, and 3.1.1 has no reason code to say so");
            self.doomed.push((connection, CloseReason::Storage, None));
        }
    }

    // ---- the broadcast log ----------------------------------------------

    /// The session's cursor: the lowest log offset it still holds, or the
    /// log's next offset.
    fn cursor_of(&self, key: SessionKey) -> u64 {
        let Some(session) = self.sessions.by_key.get(&key) else {
            return self.persist.log_next;
        };
        let inflight = session.inflight.iter().filter_map(|e| e.log_offset);
        let pending = session.pending.iter().filter_map(|q| q.log_offset());
        inflight
            .chain(pending)
            .min()
            .unwrap_or(self.persist.log_next)
    }

    /// Write every changed session's in-flight table and cursor, and let go
    /// of the log entries nobody holds (`broker.session.ack_commit_interval`,
    /// at a disconnect and before shutdown).
    pub fn flush(&mut self, now: Instant) {
        // Taken whole, not drained: a drain clears every slot of a table
        // that a restart or a storm once grew, at every flush after.
        let mut dirty: Vec<SessionKey> = match self.persist.dirty.is_empty() {
            true => Vec::new(),
            false => std::mem::take(&mut self.persist.dirty)
                .into_iter()
                .collect(),
        };
        dirty.sort_unstable();
        let mut clients = Vec::new();
        for key in dirty {
            let Some(session) = self.sessions.by_key.get(&key) else {
                continue;
            };
            if !session.stored {
                continue;
            }
            clients.push(session.client_id.clone());
            self.stage_session(key, now);
            // A few sessions an intent: a provider shares a transaction
            // among several (a commit per session would be paid between
            // the publishes it takes turns with), and gives way to a
            // publish between them, which one intent of every session of
            // a storm could not.
            if clients.len() == FLUSH_SESSIONS {
                self.persist.seal(Parked::Flush {
                    clients: std::mem::take(&mut clients),
                    sealed: now,
                });
            }
        }
        if !self.persist.releasable.is_empty() {
            let offsets = std::mem::take(&mut self.persist.releasable);
            self.persist
                .stage(Role::Sessions, Write::ReleaseLog(offsets));
        }
        self.stage_all_positions(now);
        self.persist.seal(Parked::Flush {
            clients,
            sealed: now,
        });
    }

    /// Write one session now (a disconnect, a subscription change): its
    /// record and its cursor.
    pub(super) fn stage_session(&mut self, key: SessionKey, now: Instant) {
        let entry = self.session_entry(key, now);
        let cursor = self.cursor_of(key);
        let client_id = entry.client_id.clone();
        self.persist.dirty.remove(&key);
        self.persist
            .stage(Role::Sessions, Write::SaveSession(entry));
        self.persist.stage(
            Role::Sessions,
            Write::SaveCursor {
                client_id,
                offset: cursor,
            },
        );
        self.stage_positions(key, now);
    }

    /// The stored form of session `key` at `now`.
    pub(super) fn session_entry(&self, key: SessionKey, now: Instant) -> SessionEntry {
        let session = &self.sessions.by_key[&key];
        let attached = session.connection().or(session.connecting());
        let connection = attached.and_then(|c| self.connections.get(&c));
        let will = match (connection, session.pending_will()) {
            (Some(conn), _) => conn.will.as_deref().map(will_entry),
            (None, Some(pending)) => Some(will_entry(&pending.will)),
            (None, None) => None,
        };
        let subscriptions = session
            .subscriptions
            .iter()
            .map(|(raw, sub)| SubscriptionEntry {
                filter: raw.clone(),
                qos: sub.options.qos,
                no_local: sub.options.no_local,
                retain_as_published: sub.options.retain_as_published,
                retain_handling: sub.options.retain_handling,
                subscription_id: sub.options.subscription_id,
                log_offset: sub.log_offset.min(self.persist.log_next),
            })
            .collect();
        let inflight = session
            .inflight
            .iter()
            .filter_map(|e| {
                Some(StoredInflight {
                    log_offset: e.log_offset?,
                    packet_id: e.packet_id,
                    qos: e.qos,
                    phase: match e.phase {
                        InflightPhase::AwaitPubcomp => StoredPhase::AwaitingComp,
                        _ => StoredPhase::AwaitingAck,
                    },
                    shared_group: None::<ShareGroupKey>,
                })
            })
            .collect();
        SessionEntry {
            client_id: session.client_id.to_string(),
            principal: session.principal.as_deref().map(str::to_owned),
            expiry_interval: session.expiry_interval,
            detached_at: if attached.is_some() {
                0
            } else {
                // When it went away, not now: a record written again later
                // (its Will published, the stop, a clock stepped forward)
                // keeps its expiry counted from its disconnection.
                let went = session
                    .expires_at
                    .and_then(|at| {
                        at.checked_sub(std::time::Duration::from_secs(u64::from(
                            session.expiry_interval,
                        )))
                    })
                    .map_or(now, |went| went.min(now));
                self.receipt_time(went).max(1)
            },
            subscriptions,
            will,
            window: session.window.max(1),
            inflight,
        }
    }

    // ---- records ---------------------------------------------------------

    /// The stored form of `message`, published by `client_id` at `now`.
    pub(super) fn record_of(&mut self, message: &Message, client_id: &str, now: Instant) -> Record {
        let id = self.persist.next_message_id;
        self.persist.next_message_id += 1;
        let mut message_id = [0u8; 16];
        message_id[..8].copy_from_slice(&self.run_id.to_be_bytes());
        message_id[8..].copy_from_slice(&id.to_be_bytes());
        let p = &message.properties;
        Record {
            offset: 0,
            message_id,
            topic: message.topic.to_string(),
            timestamp: self.receipt_time(message.received_at.min(now)).max(1),
            user_properties: user_properties_of(p),
            payload: message.payload.clone(),
            props: publish_props_of(p).into(),
            retain: message.retain,
            bridge: None,
            client_id: client_id.to_owned(),
            qos: message.qos,
            shared_copy: false,
            owed_to: None,
        }
    }

    /// When the broker accepted what it received at `timestamp` (Unix
    /// nanoseconds), on the state's clock: its age by the wall clock,
    /// counted back from `now`.
    pub(super) fn received_at(&self, timestamp: UnixNanos, now: Instant) -> Instant {
        let age = self.receipt_time(now).saturating_sub(timestamp).max(0);
        now.checked_sub(std::time::Duration::from_nanos(age as u64))
            .unwrap_or(now)
    }

    /// Counted when a write fails for a QoS 0 publish nobody can be told.
    pub(super) fn count_storage_drop(&self) {
        self.metrics.dropped(DropReason::StorageFailed);
    }

    /// A QoS 2 hold for the broadcast log.
    pub(super) fn held_publish(
        &mut self,
        client_id: &str,
        packet_id: u16,
        message: &Message,
        now: Instant,
    ) -> HeldPublish {
        let record = self.record_of(message, client_id, now);
        HeldPublish {
            channel: BROADCAST_LOG_NAME.to_owned(),
            client_id: client_id.to_owned(),
            packet_id,
            held_at: self.receipt_time(now).max(1),
            record,
        }
    }

    /// Queue entries a session holds in the log, oldest first: for tests.
    #[cfg(test)]
    pub(super) fn log_references(&self) -> Vec<(u64, u32)> {
        self.persist
            .log_refs
            .iter()
            .map(|(o, c)| (*o, *c))
            .collect()
    }
}
