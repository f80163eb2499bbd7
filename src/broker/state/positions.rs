//! Consumers' stored positions: where a new consumer starts, written with
//! its SUBSCRIBE; every moved position written at the flush (one moved
//! only over records its consumer does not match, once a minute), when the
//! consumer goes away and before a snapshot; dropped with its
//! subscription; kept in memory for a bridge while its session is away.
//! A stored position may lag and never leads: it never passes an
//! unacknowledged record (`Consumer::position`).

use std::time::Duration;

use tokio::time::Instant;

use super::bridges::BridgeHold;
use super::consumer::{Consumer, ConsumerStart};
use super::intent::{Role, Write};
use super::reads::Seek;
use super::session::Session;
use super::BrokerState;
use crate::broker::subscriptions::SessionKey;
use crate::storage::contract::{Position, Reader};

/// Up to this many consumers and this many channels the lag gauge is
/// worked out at every tick (twice a second); past either, once every
/// [`LAG_INTERVAL`]: it looks at each consumer of each channel, and 50,000
/// offline devices consuming a channel cost an idle broker a hundredth of
/// a core at every tick, as 10,000 channels with no consumer cost it a
/// pass over a list of 3 MB.
pub(super) const LAG_AT_EVERY_TICK: usize = 1_000;

/// How often the lag gauge is worked out past [`LAG_AT_EVERY_TICK`]
/// consumers or channels: fresher than a scrape needs.
pub(super) const LAG_INTERVAL: Duration = Duration::from_secs(5);

/// A place moved only over records that matched none of its consumer's
/// filters (it follows the channel's tail: `super::following`) is written
/// by the flush at most this often; one moved by a delivery or an
/// acknowledgement at every flush, and every one when the consumer goes
/// away and at the stop. Killed between two, such a consumer resumes
/// behind records it does not match, and reads past them: none is sent
/// twice. 15,000 connected devices consuming a channel that records
/// arrive in had each flush write 15,000 places.
pub(super) const PASSED_OVER_INTERVAL: Duration = Duration::from_secs(60);

impl BrokerState {
    /// Write where a new consumer of session `key` starts, with the
    /// SUBSCRIBE that makes it, when the session keeps positions: its
    /// SUBACK then waits for the position as well (invariant 18), and a
    /// restart before the first flush resumes there, not at the `next` of
    /// that later moment. A start known without a read (`next`, an offset)
    /// is written as it is. A start that takes a read (earliest, a time) is
    /// written as the first offset, and as what the read found once it
    /// returns. A latest channel's consumer owed the current values
    /// (`values_owed`, as Retain Handling says) is written as the first
    /// offset too, until they are acknowledged: killed before then, it
    /// resumes from there and is sent every value again, as changes.
    pub(super) fn stage_start(
        &mut self,
        key: SessionKey,
        start: &mut ConsumerStart,
        values_owed: bool,
        now: Instant,
    ) {
        let channel = start.channel;
        let latest = self.channels.is_latest(channel);
        if start.group.is_some()
            || (latest && start.seek.is_some())
            || self.channels.is_queue(channel)
            || self.sessions.consumer_index(key, channel).is_some()
            || !self.consumes(key, channel)
        {
            return;
        }
        let next = self.channels.all[channel as usize].next;
        // A consumer told to start past the end waits there; what is
        // stored is never past the channel's next offset. A start that
        // takes a read to find (`earliest`, a time, a latest channel's
        // values) is stored as the first offset until the read finds it
        // (the values: until they are acknowledged): a kill before then
        // resumes it from the floor, with more than it asked for, not at
        // `next` without what it asked for.
        let first = crate::storage::contract::FIRST_OFFSET;
        let (begin, stored) = match start.seek {
            // Its changes start at `next` as the values' read finds it.
            None if latest => (None, if values_owed { first } else { next }),
            None => (Some(next), next),
            Some(Seek::Offset(offset)) => (Some(offset), offset.min(next)),
            Some(Seek::Earliest | Seek::Time(_)) => (None, first),
            Some(Seek::Current | Seek::Resync { .. }) => return,
        };
        let session = &self.sessions.by_key[&key];
        if let Some(bridge) = session.bridge() {
            if self.bridges.position(channel, bridge).is_some() {
                return;
            }
        }
        let Some((reader, session_expiry)) = position_holder(session) else {
            return;
        };
        if let Some(begin) = begin {
            start.seek = Some(Seek::Offset(begin));
        }
        start.stored = Some(stored);
        let saved_at = self.receipt_time(now).max(1);
        self.persist.stage(
            Role::Channel(channel),
            Write::SavePosition(Position {
                reader,
                offset: stored,
                saved_at,
                session_expiry,
            }),
        );
    }

    /// Stage the position of every consumer of `key` that moved since it
    /// was last written. Only sessions that outlive their connection keep
    /// one: a position of a session ending with its connection would be
    /// dropped with it.
    pub(super) fn stage_positions(&mut self, key: SessionKey, now: Instant) {
        self.stage_positions_passed_over(key, now, true);
    }

    /// [`Self::stage_positions`], leaving unwritten, unless `passed_over`,
    /// the places of consumers following their channel's tail that moved
    /// only over records matching none of their filters.
    fn stage_positions_passed_over(&mut self, key: SessionKey, now: Instant, passed_over: bool) {
        let saved_at = self.receipt_time(now).max(1);
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        let mut moved = Vec::new();
        for consumer in session.consumers.allocated_mut().into_iter().flatten() {
            let state = &self.channels.all[consumer.channel as usize];
            let following = state.followers.is_following(key);
            let Some(offset) = unwritten_place(consumer, state.next, following, passed_over) else {
                continue;
            };
            if following {
                consumer.next = consumer.next.max(state.next);
            }
            moved.push((consumer.channel, offset));
        }
        // Most sessions looked at have no consumer that moved: their
        // reader's name is made only for one that did.
        if moved.is_empty() {
            return;
        }
        let Some((reader, expiry)) = position_holder(session) else {
            return;
        };
        for consumer in session.consumers.allocated_mut().into_iter().flatten() {
            if let Some(&(_, offset)) = moved.iter().find(|(c, _)| *c == consumer.channel) {
                consumer.stored = Some(offset);
            }
        }
        for (channel, offset) in moved {
            self.persist.stage(
                Role::Channel(channel),
                Write::SavePosition(Position {
                    reader: reader.clone(),
                    offset,
                    saved_at,
                    session_expiry: expiry,
                }),
            );
        }
    }

    /// A consumer of session `key` was sent, skipped, acknowledged, moved
    /// or made: the next flush looks at its place.
    pub(super) fn place_moved(&mut self, key: SessionKey) {
        self.channels.moved.insert(key);
    }

    /// Stage every changed position (the flush): a connected consumer's,
    /// one moved only over records it does not match once every
    /// [`PASSED_OVER_INTERVAL`]. A detached one's were written as it went
    /// away; one that a read answered after that moved is written once it
    /// is back. Between the walks of every connected consumer that the
    /// interval brings, only the sessions marked by [`Self::place_moved`]
    /// are looked at: thousands of devices following a channel's tail cost
    /// a flush nothing.
    pub(super) fn stage_all_positions(&mut self, now: Instant) {
        let passed_over =
            self.shutting_down || self.channels.passed_over_due.is_none_or(|due| now >= due);
        let marked = std::mem::take(&mut self.channels.moved);
        if passed_over {
            self.channels.passed_over_due = Some(now + PASSED_OVER_INTERVAL);
            for key in self.attached_consumers() {
                self.stage_positions_passed_over(key, now, true);
            }
        } else {
            #[cfg(debug_assertions)]
            self.check_moved_marked(&marked);
            let mut keys: Vec<SessionKey> = marked.into_iter().collect();
            keys.sort_unstable();
            for key in keys {
                // A detached one's place was written as it went.
                if self
                    .sessions
                    .by_key
                    .get(&key)
                    .is_some_and(|s| s.connection().is_some())
                {
                    self.stage_positions_passed_over(key, now, false);
                }
            }
        }
        self.stage_group_positions(now);
    }

    /// A debug build's check that every connected consumer whose place
    /// this flush would write was marked moved.
    #[cfg(debug_assertions)]
    fn check_moved_marked(&mut self, marked: &super::ids::IdSet<SessionKey>) {
        for key in self.attached_consumers() {
            if marked.contains(&key) {
                continue;
            }
            let session = &self.sessions.by_key[&key];
            if position_holder(session).is_none() {
                continue;
            }
            for consumer in session.consumers.iter() {
                let state = &self.channels.all[consumer.channel as usize];
                let following = state.followers.is_following(key);
                assert_eq!(
                    unwritten_place(consumer, state.next, following, false),
                    None,
                    "the place of {key:?} in channel {} moved unmarked: {consumer:?}",
                    consumer.channel
                );
            }
        }
    }

    /// Publish each channel's largest consumer lag (the tick): it looks at
    /// every consumer, detached ones too, so not at every flush, and past
    /// [`LAG_AT_EVERY_TICK`] consumers or channels once every
    /// [`LAG_INTERVAL`]. Only a lag that moved is given to the metrics.
    pub(super) fn publish_consumer_lag(&mut self, now: Instant) {
        // Before anything is counted: counting the consumers looks at
        // every channel.
        if self.channels.lag_due.is_some_and(|due| now < due) {
            return;
        }
        let consumers: usize = self.channels.all.iter().map(|c| c.consumers.len()).sum();
        self.channels.lag_due = (consumers > LAG_AT_EVERY_TICK
            || self.channels.all.len() > LAG_AT_EVERY_TICK)
            .then_some(now + LAG_INTERVAL);
        let sessions = &self.sessions;
        for (i, channel) in self.channels.all.iter_mut().enumerate() {
            let lag = channel
                .consumers
                .iter()
                .filter_map(|k| Some((k, sessions.by_key.get(k)?)))
                .filter_map(|(k, s)| {
                    let c = s.consumers.iter().find(|c| c.channel == i as u16)?;
                    // One following the tail is at its end, up to what it
                    // has not acknowledged.
                    Some(match channel.followers.is_following(*k) {
                        true => c.unacked.first().unwrap_or(channel.next),
                        false => c.position(),
                    })
                })
                .map(|position| channel.next.saturating_sub(position))
                .max()
                .unwrap_or(0);
            if channel.lag_told != Some(lag) {
                self.metrics.set_consumer_lag(&channel.name, lag);
                channel.lag_told = Some(lag);
            }
        }
    }

    pub(super) fn drop_position(&mut self, key: SessionKey, channel: u16) {
        let Some(session) = self.sessions.by_key.get(&key) else {
            return;
        };
        if let Some(reader) = reader_of(session) {
            self.persist
                .stage(Role::Channel(channel), Write::DropPosition(reader));
        }
    }

    /// A session ends (already out of every channel's consumer list): its
    /// positions go, and its unreleased QoS 2 publishes into channels are
    /// let go.
    pub(super) fn end_consumers(&mut self, key: SessionKey, session: &Session, now: Instant) {
        match (reader_of(session), session.bridge()) {
            // A bridge's place outlives its session (the remote went away):
            // kept, to resume from when the bridge connects again.
            (Some(reader), Some(bridge)) => {
                let saved_at = self.receipt_time(now).max(1);
                for consumer in session.consumers.iter() {
                    let offset = consumer
                        .position()
                        .min(self.channels.all[consumer.channel as usize].next);
                    self.bridges.keep_position(consumer.channel, bridge, offset);
                    self.persist.stage(
                        Role::Channel(consumer.channel),
                        Write::SavePosition(Position {
                            reader: reader.clone(),
                            offset,
                            saved_at,
                            session_expiry: None,
                        }),
                    );
                }
            }
            (Some(reader), None) => {
                // Only a position that was written needs removing.
                for consumer in session.consumers.iter().filter(|c| c.stored.is_some()) {
                    self.persist.stage(
                        Role::Channel(consumer.channel),
                        Write::DropPosition(reader.clone()),
                    );
                }
            }
            (None, _) => {}
        }
        let mut holds: Vec<(u16, u16)> = session
            .rare
            .channel_holds
            .iter()
            .map(|(p, c)| (*p, *c))
            .collect();
        holds.sort_unstable();
        if session.bridge().is_some() {
            // The remote has its PUBREC, or has it once the hold is
            // stored: the release may come on the bridge's next connection.
            if holds.is_empty() {
                return;
            }
            let kept = holds
                .into_iter()
                .map(|(packet_id, channel)| BridgeHold {
                    packet_id,
                    channel,
                    held_at: session
                        .rare
                        .inbound_qos2
                        .get(&packet_id)
                        .copied()
                        .unwrap_or(now),
                    writing: session.rare.writing.contains_key(&packet_id),
                })
                .collect();
            self.bridges
                .keep_holds(key, session.client_id.clone(), kept);
            return;
        }
        for (packet_id, channel) in holds {
            self.persist.stage(
                Role::Channel(channel),
                Write::DropChannelHold {
                    client_id: session.client_id.to_string(),
                    packet_id,
                },
            );
        }
    }
}

/// Where `consumer`'s place is written next, when it moved since it was:
/// settled to its channel's `channel_next` when it is `following`, and
/// then, unless `passed_over`, only if it moved by more than records it
/// does not match. None while a read is to find its start or its values.
fn unwritten_place(
    consumer: &Consumer,
    channel_next: u64,
    following: bool,
    passed_over: bool,
) -> Option<u64> {
    if consumer.seek.is_some() || consumer.values_pending {
        return None;
    }
    let next = match following {
        // Still where it was written: moved only past records it does not
        // match, which settling it passes.
        true if !passed_over && consumer.stored == Some(consumer.position()) => return None,
        true => consumer.next.max(channel_next),
        false => consumer.next,
    };
    // A consumer told to start past the end waits there; what is stored is
    // never past the channel's next offset.
    let offset = consumer.unacked.first().unwrap_or(next).min(channel_next);
    (consumer.stored != Some(offset)).then_some(offset)
}

/// The reader a session's positions are stored under and their session
/// expiry, for a session that keeps them: one outliving its connection, or
/// a bridge (whose position has no session and never expires).
fn position_holder(session: &Session) -> Option<(Reader, Option<u32>)> {
    let expiry = match session.bridge() {
        Some(_) => None,
        None if session.expiry_interval == 0 => return None,
        None => Some(session.expiry_interval),
    };
    Some((reader_of(session)?, expiry))
}

/// The reader a session's places in channels are stored under.
fn reader_of(session: &Session) -> Option<Reader> {
    match session.bridge() {
        Some(bridge) => Reader::bridge(bridge).ok(),
        None => Reader::mqtt(&session.client_id).ok(),
    }
}
