//! The state rebuilt from what its providers hold, once at startup before
//! anything listens: retained messages, persistent sessions (detached,
//! their expiry counted on from when they went away), their subscriptions,
//! their in-flight exchanges (same packet identifiers, resent with DUP on
//! resume; a QoS 2 exchange past PUBREC owes its PUBREL), the messages the
//! broadcast log holds for them from their cursor on, and the QoS 2 ids
//! their clients had not released. The reading is done by the caller
//! ([`Restored`] is plain data), so the state stays free of I/O.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ids::IdMap;
use super::intent::{Role, Write};
use super::records::{message_from_served, will_request};
use super::session::{
    InflightEntry, InflightPhase, Pending, PendingWill, QueuedMessage, Session, SessionSubscription,
};
use super::BrokerState;
use crate::broker::long_lived;
use crate::broker::message::Message;
use crate::broker::metrics::DropReason;
use crate::broker::subscriptions::{SessionKey, SubOptions};
use crate::storage::contract::{
    session_expired_at, HeldPublish, InflightEntry as StoredInflight, InflightPhase as StoredPhase,
    Position, ServedValue, SessionEntry, BROADCAST_LOG_NAME,
};
use crate::storage::kept::Kept;
use crate::topic;
use saguin_format::model::{ChannelKind, Record};

/// What the providers hold, read at startup.
#[derive(Debug, Default)]
pub struct Restored {
    pub retained: Vec<Record>,
    pub sessions: Vec<SessionEntry>,
    /// Each session's cursor on the broadcast log.
    pub cursors: Vec<(String, u64)>,
    /// Every message the broadcast log holds, ascending, each kept compact
    /// as it was read ([`Kept`]) and lent to its message: held as records
    /// beside the state as it was built, a million queued messages took a
    /// restart to twice what they come to in the state.
    pub log: Vec<Kept>,
    pub log_next: u64,
    /// Exactly-once holds of the session provider (every channel's; only
    /// the broadcast log's are taken from here).
    pub held: Vec<HeldPublish>,
    /// The append channels served, in configuration order.
    pub channels: Vec<RestoredChannel>,
}

/// What the state knows of a channel when it starts.
#[derive(Debug, Clone)]
pub struct RestoredChannel {
    pub name: Arc<str>,
    pub kind: ChannelKind,
    pub next: u64,
    /// A queue's lease and the index of its dead-letter channel.
    pub queue: Option<QueueSetup>,
    /// Every stored position.
    pub positions: Vec<Position>,
    /// Exactly-once publishes held in this channel for their release.
    pub holds: Vec<HeldPublish>,
}

/// What the state is told of a queue when it starts.
#[derive(Debug, Clone)]
pub struct QueueSetup {
    /// How long a worker holds a record before it counts as an attempt.
    pub lease: Duration,
    /// Most records one worker holds at once, whatever its window.
    pub max_held_per_worker: usize,
    /// The index of its dead-letter channel, when that is served.
    pub dead_letter: Option<u16>,
}

/// What [`BrokerState::restore_sessions`] leaves for
/// [`BrokerState::restore_rest`]: each session it made, in the order it
/// made them, with the in-flight entries its store held (made into the
/// session's once the log they point into is read), and how many had
/// expired.
#[derive(Debug, Default)]
pub struct RestoredSessions {
    sessions: Vec<(SessionKey, Vec<StoredInflight>)>,
    expired: usize,
}

/// What restoring came to, for the startup log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreSummary {
    pub retained: usize,
    pub sessions: usize,
    pub expired_sessions: usize,
    pub inflight: usize,
    pub queued: usize,
    pub holds: usize,
}

impl BrokerState {
    /// Keep a stored retained message, read at `now`, before [`Self::restore`]
    /// rebuilds the rest: the retained store lends its values one at a
    /// time, so a million retained messages are never held twice while
    /// the broker starts. A value without properties (nearly every one) is
    /// kept from its parts, with no message made for it, or as the store's
    /// own handle on it where the store lends one (a memory store's).
    pub fn restore_retained(&mut self, value: ServedValue<'_>, now: Instant) {
        if value.is_plain() {
            if let Some(kept) = value.kept {
                return self.retained.restore_kept(kept);
            }
            if self
                .retained
                .restore_plain(value.topic, value.qos, value.payload)
            {
                return;
            }
        }
        let message = message_from_served(&value, self.received_at(value.timestamp, now));
        self.retained.set(&message);
    }

    /// Rebuild from `restored` at `now`. Sessions that expired while the
    /// broker was down, and holds of sessions no longer held, are removed
    /// from the provider (as writes, like any other).
    pub fn restore(&mut self, mut restored: Restored, now: Instant) -> RestoreSummary {
        self.name_channels(restored.channels.iter().map(|c| c.name.clone()));
        let sessions = self.restore_sessions(std::mem::take(&mut restored.sessions), now);
        self.restore_rest(restored, sessions, now)
    }

    /// The first half of [`Self::restore`]: the sessions themselves, their
    /// subscriptions and Wills, made from what the session store read,
    /// before the broadcast log is: a start reads the log on another
    /// thread meanwhile. What the log holds for them (their in-flight
    /// messages, what they are owed) is [`Self::restore_rest`]'s, with the
    /// same `now`.
    pub fn restore_sessions(
        &mut self,
        stored: Vec<SessionEntry>,
        now: Instant,
    ) -> RestoredSessions {
        let mut restoring = RestoredSessions {
            sessions: Vec::with_capacity(stored.len()),
            ..RestoredSessions::default()
        };
        let unix_now = self.receipt_time(now);
        self.sessions.reserve(stored.len());
        let mut detached = Vec::with_capacity(stored.len());
        for mut entry in stored {
            if self.sessions.of_client(&entry.client_id).is_some() {
                continue;
            }
            if session_expired_at(&entry, unix_now, self.limits.max_session_expiry)
                || entry.expiry_interval == 0
            {
                restoring.expired += 1;
                self.persist.stage(
                    Role::Sessions,
                    Write::RemoveSession(entry.client_id.clone()),
                );
                continue;
            }
            let key = self.sessions.next_key;
            self.sessions.next_key += 1;
            // What the session keeps is made among long-lived blocks
            // (`broker::long_lived`), apart from the restore's own.
            let (client_id, principal) = long_lived::make(|| {
                let client_id: Arc<str> = entry.client_id.as_str().into();
                (client_id, entry.principal.as_deref().map(Arc::from))
            });
            let mut session = Session::new(client_id.clone(), principal);
            session.stored = true;
            session.window = entry.window.max(1);
            session.expiry_interval = entry.expiry_interval.min(self.limits.max_session_expiry);
            // A session connected when the broker stopped went away then.
            let detached_at = if entry.detached_at == 0 {
                unix_now
            } else {
                entry.detached_at
            };
            let left = |secs: u32| {
                let end = detached_at.saturating_add(i64::from(secs).saturating_mul(1_000_000_000));
                now + Duration::from_nanos(end.saturating_sub(unix_now).max(0) as u64)
            };
            session.expires_at = Some(left(session.expiry_interval));
            if let Some(will) = &entry.will {
                let will = will_request(will);
                let delay = will.delay.min(session.expiry_interval);
                session.set_pending_will(Some(Box::new(PendingWill {
                    message: Self::will_message(&will, now),
                    publish_at: left(delay),
                    will,
                })));
            }
            for sub in &entry.subscriptions {
                let Ok(parsed) = topic::parse_filter(&sub.filter) else {
                    continue;
                };
                let options = SubOptions {
                    qos: sub.qos,
                    no_local: sub.no_local,
                    retain_as_published: sub.retain_as_published,
                    retain_handling: sub.retain_handling,
                    subscription_id: sub.subscription_id,
                };
                self.index_subscription(key, parsed.share_group, parsed.filter, options);
                let previous = session.subscribe(
                    &sub.filter,
                    SessionSubscription::new(&sub.filter, options, sub.log_offset),
                );
                if previous.is_none() {
                    self.metrics.subscriptions.fetch_add(1, Relaxed);
                }
            }
            // Its expiry is set above: a restored session always has a
            // moment (were it not, it would be taken now and found not due).
            detached.push((session.next_due().unwrap_or(now), key));
            self.sessions
                .insert(key, long_lived::make(|| Box::new(session)));
            self.metrics.sessions.fetch_add(1, Relaxed);
            restoring
                .sessions
                .push((key, std::mem::take(&mut entry.inflight)));
        }
        self.sessions.detached.insert_many(detached);
        restoring
    }

    /// The rest of [`Self::restore`], after [`Self::restore_sessions`]:
    /// the retained messages and channels `restored` holds, and what the
    /// broadcast log holds for each restored session.
    pub fn restore_rest(
        &mut self,
        mut restored: Restored,
        restoring: RestoredSessions,
        now: Instant,
    ) -> RestoreSummary {
        debug_assert!(
            restored.sessions.is_empty(),
            "the sessions are restore_sessions's"
        );
        let mut summary = RestoreSummary {
            sessions: restoring.sessions.len(),
            expired_sessions: restoring.expired,
            ..RestoreSummary::default()
        };
        let unix_now = self.receipt_time(now);
        for record in std::mem::take(&mut restored.retained) {
            self.restore_retained(ServedValue::of(&record), now);
        }
        self.retained.pack();
        summary.retained = self.retained.len();
        self.metrics
            .retained
            .store(self.retained.len() as i64, Relaxed);
        self.persist.log_next = restored.log_next.max(1);
        // Each compact record is lent to its message, which copies what it
        // keeps, and let go once it is made. Held in a list in the log's
        // order, 24 bytes a record beside its message, each client id
        // once: a map of a million records, each with its own copy of its
        // publisher's id, took a restart 92 MiB above what it then held.
        let mut names = ClientIds::default();
        let mut log: Vec<(u64, Logged)> = std::mem::take(&mut restored.log)
            .into_iter()
            .filter_map(|kept| {
                let parts = kept.parts();
                if parts.shared_copy {
                    return None;
                }
                let offset = parts.offset;
                let client_id = names.intern(parts.client_id);
                let owed_to = parts.owed_to.map(|id| names.intern(id));
                let value = ServedValue::from(parts);
                let message = message_from_served(&value, self.received_at(value.timestamp, now));
                let logged = Logged {
                    message: Arc::new(message),
                    client_id,
                    owed_to: owed_to.unwrap_or(NOBODY),
                };
                Some((offset, logged))
            })
            .collect();
        if !log.is_sorted_by_key(|(offset, _)| *offset) {
            log.sort_unstable_by_key(|(offset, _)| *offset);
        }
        let logged_at = |offset: u64| {
            log.binary_search_by_key(&offset, |(o, _)| *o)
                .ok()
                .map(|i| &log[i].1)
        };
        let cursors: HashMap<&str, u64> = restored
            .cursors
            .iter()
            .map(|(c, o)| (c.as_str(), *o))
            .collect();
        let mut owing: IdMap<SessionKey, Owing> = IdMap::default();
        owing.reserve(restoring.sessions.len());
        for (key, stored_inflight) in restoring.sessions {
            let Some(session) = self.sessions.by_key.get_mut(&key) else {
                continue;
            };
            let mut in_flight = Vec::new();
            for e in &stored_inflight {
                let Some(Logged { message, .. }) = logged_at(e.log_offset) else {
                    continue;
                };
                let phase = match (e.phase, e.qos) {
                    (StoredPhase::AwaitingComp, _) => InflightPhase::AwaitPubcomp,
                    (StoredPhase::AwaitingAck, 1) => InflightPhase::AwaitPuback,
                    (StoredPhase::AwaitingAck, _) => InflightPhase::AwaitPubrec,
                };
                let queued =
                    (!matches!(phase, InflightPhase::AwaitPubcomp)).then(|| QueuedMessage {
                        message: message.clone(),
                        qos: e.qos,
                        retain: false,
                        subscription_ids: Box::default(),
                        logged: QueuedMessage::logged_at(Some(e.log_offset)),
                    });
                long_lived::make(|| {
                    session.inflight.push(InflightEntry {
                        packet_id: e.packet_id,
                        phase,
                        qos: e.qos,
                        log_offset: Some(e.log_offset),
                        queued,
                        channel: None,
                        unsent: false,
                    })
                });
                in_flight.push(e.log_offset);
            }
            let cursor = cursors
                .get(&*session.client_id)
                .copied()
                .unwrap_or(self.persist.log_next);
            summary.inflight += in_flight.len();
            for &offset in &in_flight {
                self.persist.hold_log(key, offset);
            }
            owing.insert(
                key,
                Owing {
                    cursor,
                    in_flight,
                    queued: Pending::new(),
                },
            );
        }
        // What the log holds for each session from its cursor on, in one
        // pass over the log: a record is offered to the session it is owed
        // to, or to the sessions whose subscriptions match its topic. (A
        // pass per session over the log from its cursor cost sessions times
        // records: 25,000 sessions took 16 s to restore.)
        let mut matched = Vec::new();
        let mut candidates = Vec::new();
        for (offset, logged) in &log {
            let offset = *offset;
            candidates.clear();
            match names.owed_to(logged) {
                Some(client_id) => candidates.extend(self.sessions.of_client(client_id)),
                None => {
                    // Shared subscriptions are not restored from the log
                    // (their members take turns live); nobody is online.
                    self.index
                        .matches(&logged.message.topic, &|_| false, &mut matched);
                    candidates.extend(matched.iter().filter(|m| !m.shared).map(|m| m.session));
                    candidates.sort_unstable();
                    candidates.dedup();
                }
            }
            for key in &candidates {
                let Some(owing) = owing.get_mut(key) else {
                    continue;
                };
                // A queue full by count admits nothing more: what it would
                // be owed is not worked out.
                if offset < owing.cursor
                    || owing.in_flight.contains(&offset)
                    || owing.queued.len() >= self.limits.max_queued_messages
                {
                    continue;
                }
                let Some(q) = owed(&self.sessions.by_key[key], offset, logged, &names) else {
                    continue;
                };
                if owing.queued.admits(&q, self.limits.queue_bound()) {
                    owing.queued.push_back(q);
                }
            }
        }
        for (key, mut owing) in owing {
            summary.queued += owing.queued.len();
            let offsets: Vec<u64> = owing.queued.iter().filter_map(|q| q.log_offset()).collect();
            if let Some(session) = self.sessions.by_key.get_mut(&key) {
                session.pending.append(&mut owing.queued);
            }
            for offset in offsets {
                self.persist.hold_log(key, offset);
            }
        }
        for held in &restored.held {
            if held.channel != BROADCAST_LOG_NAME {
                continue;
            }
            let key = self.sessions.of_client(&held.client_id);
            match key {
                Some(key) => {
                    let age = unix_now.saturating_sub(held.held_at).max(0);
                    let at = now
                        .checked_sub(Duration::from_nanos(age as u64))
                        .unwrap_or(now);
                    if self
                        .sessions
                        .hold_inbound(key, held.packet_id, at)
                        .is_some()
                    {
                        summary.holds += 1;
                    }
                }
                None => {
                    self.metrics.dropped(DropReason::ExactlyOnceExpired);
                    self.persist.stage(
                        Role::Sessions,
                        Write::DropHold {
                            client_id: held.client_id.clone(),
                            packet_id: held.packet_id,
                        },
                    )
                }
            }
        }
        for &(offset, _) in &log {
            self.persist.release_unheld(offset);
        }
        drop(log);
        let channels = std::mem::take(&mut restored.channels);
        self.restore_channels(channels, now);
        // What was read is what is stored: nothing to write back but the
        // removals staged above.
        self.persist.clear_dirty();
        self.persist.seal_background();
        summary
    }
}

/// What a restored session is owed from the log, gathered in one pass.
struct Owing {
    /// The first log offset it has not been sent.
    cursor: u64,
    /// The offsets its in-flight table holds (not queued again).
    in_flight: Vec<u64>,
    queued: Pending,
}

/// A broadcast log message as a restart offers it: the message, and what
/// its record says of who published it and who it is owed to.
struct Logged {
    message: Arc<Message>,
    /// Its publisher's client id, for `no_local` ([`ClientIds`]).
    client_id: u32,
    /// The client id of the one session a copy is kept for, or
    /// [`NOBODY`] ([`ClientIds`]).
    owed_to: u32,
}

/// [`Logged::owed_to`] of a record kept for every session it matches.
const NOBODY: u32 = u32::MAX;

/// The client ids a restart's broadcast log names, each held once: a
/// record holds its publisher's (and the one session's a copy is kept
/// for) as an index here.
#[derive(Default)]
struct ClientIds {
    ids: Vec<Arc<str>>,
    index: HashMap<Arc<str>, u32>,
}

impl ClientIds {
    fn intern(&mut self, client_id: &str) -> u32 {
        if let Some(&i) = self.index.get(client_id) {
            return i;
        }
        // Below `NOBODY`: a log names fewer clients than it has records.
        let i = self.ids.len() as u32;
        let id: Arc<str> = client_id.into();
        self.ids.push(id.clone());
        self.index.insert(id, i);
        i
    }

    fn client_id(&self, i: u32) -> &str {
        &self.ids[i as usize]
    }

    fn owed_to(&self, logged: &Logged) -> Option<&str> {
        (logged.owed_to != NOBODY).then(|| self.client_id(logged.owed_to))
    }
}

/// The queue entry a restored session is owed for log message `offset`,
/// if any of its subscriptions (made at or before it) matches.
fn owed(
    session: &Session,
    offset: u64,
    logged: &Logged,
    names: &ClientIds,
) -> Option<QueuedMessage> {
    let message = &logged.message;
    let mut best: Option<(u8, bool)> = None;
    let mut ids = Vec::new();
    for (raw, sub) in session.subscriptions.iter() {
        if sub.is_shared() || offset < sub.log_offset {
            continue;
        }
        if sub.options.no_local && names.client_id(logged.client_id) == &*session.client_id {
            continue;
        }
        if !topic::filter_matches(sub.filter(raw), &message.topic) {
            continue;
        }
        let qos = sub.options.qos.min(message.qos);
        let rap = sub.options.retain_as_published;
        best = Some(match best {
            Some((q, r)) => (q.max(qos), r || rap),
            None => (qos, rap),
        });
        if let Some(id) = sub.options.subscription_id {
            ids.push(id);
        }
    }
    let (qos, rap) = best?;
    (qos > 0).then(|| QueuedMessage {
        message: message.clone(),
        qos,
        retain: rap && message.retain,
        subscription_ids: ids.into(),
        logged: QueuedMessage::logged_at(Some(offset)),
    })
}

#[cfg(test)]
mod tests {
    /// What a restart holds for each broadcast log record beside its
    /// message while it works out what every session is owed.
    #[test]
    fn a_logged_record_is_24_bytes_beside_its_message() {
        assert_eq!(std::mem::size_of::<(u64, super::Logged)>(), 24);
    }
}
