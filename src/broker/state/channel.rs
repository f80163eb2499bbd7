//! Append channels: publishes stored as records, and consumers reading
//! them at their own pace.
//!
//! A PUBLISH whose topic's first level names an append channel becomes a
//! record at the channel's next offset, written by the channel's
//! persister; its PUBACK waits for the commit (a QoS 2 publish is held in
//! the channel, without an offset, until its PUBREL). A SUBSCRIBE whose
//! filter's first level is a channel's name makes the session a
//! *consumer* of it, reader `mqtt:<client id>`.
//!
//! A consumer is a number, not a queue: `next`, the offset it looks at
//! next, and the offsets it was sent and has not acknowledged. A commit
//! hands its record straight to every consumer that is caught up and has
//! room (the record in hand, no read); a consumer behind, or one whose
//! window was full, reads a window of records from the store, bounded by
//! its room, on the provider's read connections
//! ([`ChannelRead`] out, [`Event::ChannelRead`](super::Event::ChannelRead)
//! in), so a consumer a week behind costs one stored number and its reads
//! hold back nobody else. Offsets are taken in commit order and commits
//! reach the state in that order, so a consumer handed offset `n` has
//! been handed, or skipped by its filters, every offset below it.
//!
//! Its position - the lowest offset it was sent and has not acknowledged,
//! or `next` - is written every `broker.session.ack_commit_interval`, when
//! the consumer goes away and at shutdown: a stored position may lag and
//! never leads. Records removed by retention before the consumer got them
//! are announced on its next delivery as `saguin-gap: FROM-TO` and counted
//! (invariant 1).

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use super::bridges::BridgeHold;
use super::consumer::{
    first_level, Consumer, ConsumerFilter, Offsets, GAP_PROPERTY, OFFSET_PROPERTY,
};
use super::following::Followers;
use super::ids::{IdMap, IdSet};
use super::intent::{Role, Write};
use super::reads::{ChannelRead, ReadWindow, Seek};
use super::recent::{self, Lookup, Recent};
use super::records::{message_with_properties, publish_properties_of};
use super::restore::RestoredChannel;
use super::session::{InflightEntry, QueuedMessage, SessionSubscription};
use super::BrokerState;
use crate::broker::message::Message;
use crate::broker::metrics::DropReason;
use crate::broker::subscriptions::{Match, SessionKey, SubOptions};
use crate::storage::contract::{LentRecord, Reader, RecordParts};
use saguin_format::model::{ChannelKind, Record};

/// Most records one read asks for.
const READ_MAX: usize = 256;

/// A channel as the state routes to it: append, latest or queue (whose
/// workers are in [`super::queue`]).
#[derive(Debug)]
pub(super) struct Channel {
    pub name: Arc<str>,
    pub kind: ChannelKind,
    /// The offset the next record takes, as far as commits have told.
    pub next: u64,
    /// Sessions consuming it, connected or not: a set, which a session
    /// ending leaves at once where a list was searched through every
    /// consumer for it (a hundred thousand sessions expiring together).
    pub consumers: IdSet<SessionKey>,
    /// An append channel's records read lately, shared by its consumers.
    pub recent: Recent,
    /// Reads out from an offset of an append channel: their ticket and the
    /// offsets they ask for, `from..until`. A consumer whose `next` lies
    /// in one waits for it instead of reading the same records again.
    pub reads_out: Vec<(u64, u64, u64)>,
    /// An append channel's consumers by their filters, and those that
    /// follow its tail ([`super::following`]).
    pub followers: Followers,
    /// The consumer lag last given to the metrics: a tick gives only a
    /// lag that moved. Giving every channel's twice a second, a lock and
    /// a name copied for each, was most of what an idle broker of 10,000
    /// channels spent (0.6% of a core, where one of 10 channels spends
    /// 0.1%).
    pub lag_told: Option<u64>,
}

/// The channels' indices by their names: every publish and every filter
/// asks which channel its first level names, and with thousands of
/// channels a search through a list of them was most of a publish's cost.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ChannelNames {
    by_name: HashMap<Arc<str>, u16>,
}

impl ChannelNames {
    /// `names` in index order.
    fn new(names: impl IntoIterator<Item = Arc<str>>) -> ChannelNames {
        let by_name = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let index = u16::try_from(i).expect("the configuration caps the channels served");
                (name, index)
            })
            .collect();
        ChannelNames { by_name }
    }

    fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// The channels served, by index (`Role::Channel`), and what their
/// consumers have asked of them.
#[derive(Debug, Default)]
pub(super) struct Channels {
    pub all: Vec<Channel>,
    /// The channels' names: known before they are restored, so that a
    /// restored session's subscriptions within a channel are told from
    /// broadcast ones ([`BrokerState::name_channels`]).
    pub names: ChannelNames,
    /// Consumers' reads out, by ticket.
    pub consumer_reads: IdMap<u64, ConsumerRead>,
    /// Consumers to let catch up once the current event is handled.
    pub pumps_due: Vec<(SessionKey, u16)>,
    /// Set while a turn's events are handled together: the pumps wait for
    /// the last of them (`BrokerState::handle_all`).
    pub hold_pumps: bool,
    /// Sessions with consumers connected again since the pumps last ran:
    /// those that may catch up together (`catch_up`).
    pub back: Vec<SessionKey>,
    /// Passes made over recent records for consumers together
    /// (`catch_up`), counted for the tests.
    #[cfg(test)]
    pub passes_together: u64,
    /// Sessions consuming a channel that may have a connection: every one
    /// that has is here (added as it is connected or consumes while
    /// connected), the rest are let go when looked at
    /// ([`BrokerState::attached_consumers`]).
    pub attached: IdSet<SessionKey>,
    /// When the consumer lag gauge is next worked out, where there are
    /// too many consumers to do it at every tick.
    pub lag_due: Option<Instant>,
    /// When the flush next writes the places of consumers moved only over
    /// records they do not match ([`super::positions::PASSED_OVER_INTERVAL`]).
    pub passed_over_due: Option<Instant>,
    /// Sessions whose consumers' places may have moved since they were
    /// written: the flush looks at these ([`BrokerState::place_moved`]).
    pub moved: IdSet<SessionKey>,
}

impl Channels {
    /// The append channel `topic` (a name or filter) belongs to: its first
    /// level names one.
    pub(super) fn of_topic(&self, topic: &str) -> Option<u16> {
        if self.names.is_empty() {
            return None;
        }
        let first = topic.split('/').next().unwrap_or(topic);
        self.names.by_name.get(first).copied()
    }

    /// Is channel index `channel` a latest channel?
    pub(super) fn is_latest(&self, channel: u16) -> bool {
        self.all
            .get(channel as usize)
            .is_some_and(|c| c.kind == ChannelKind::Latest)
    }

    /// Is channel index `channel` a queue?
    pub(super) fn is_queue(&self, channel: u16) -> bool {
        self.all
            .get(channel as usize)
            .is_some_and(|c| c.kind == ChannelKind::Queue)
    }

    /// Retention removed `channel`'s records below `floor`: none of them
    /// is handed on from the recent reads, so a consumer still behind them
    /// reads, finds the floor and is told the gap.
    pub(super) fn floor_raised(&mut self, channel: &str, floor: u64) {
        // By its name's index, not a search of the list: a sweep of
        // thousands of channels at their bound raises a floor for each.
        let found = self
            .names
            .by_name
            .get(channel)
            .and_then(|&index| self.all.get_mut(usize::from(index)));
        if let Some(state) = found {
            debug_assert_eq!(&*state.name, channel, "a channel's name and its index");
            state.recent.remove_below(floor);
        }
    }
}

/// A read out for consumers of a channel.
#[derive(Debug)]
pub(super) struct ConsumerRead {
    pub channel: u16,
    /// The consumers its answer goes to, each with its generation: the
    /// one that asked first, then those that joined it.
    pub readers: Vec<(SessionKey, u64)>,
}

impl BrokerState {
    /// Stage a publish into channel `channel`: appended (QoS 0/1) or held
    /// until its PUBREL (QoS 2). Its answer waits for the commit.
    pub(super) fn stage_channel_publish(
        &mut self,
        key: SessionKey,
        channel: u16,
        packet_id: u16,
        message: &Message,
        now: Instant,
    ) {
        let client_id = self.sessions.by_key[&key].client_id.clone();
        let mut record = self.record_of(message, &client_id, now);
        record.bridge = self.sessions.by_key[&key]
            .bridge()
            .map(|bridge| bridge.to_string());
        if message.qos == 2 {
            let held = crate::storage::contract::HeldPublish {
                channel: self.channels.all[channel as usize].name.to_string(),
                client_id: client_id.to_string(),
                packet_id,
                held_at: self.receipt_time(now).max(1),
                record,
            };
            let session = self
                .sessions
                .hold_inbound(key, packet_id, now)
                .expect("connected session");
            session.rare.channel_holds.insert(packet_id, channel);
            session.rare.writing.insert(packet_id, false);
            self.persist
                .stage(Role::Channel(channel), Write::Hold(held));
        } else {
            self.persist
                .stage(Role::Channel(channel), Write::Append(record));
        }
    }

    /// A record of `channel` committed at its offset: handed to every
    /// consumer that is caught up and has room, the others read it later.
    pub(super) fn channel_committed(&mut self, channel: u16, record: Arc<Record>, now: Instant) {
        let record = LentRecord::Whole(record);
        // A deletion of a topic that held nothing took no offset.
        if record.offset() == 0 {
            return;
        }
        let Some(state) = self.channels.all.get_mut(channel as usize) else {
            return;
        };
        state.next = state.next.max(record.offset() + 1);
        if state.kind == ChannelKind::Queue {
            self.queues.committed(channel);
            return;
        }
        self.groups_committed(channel, &record, now);
        let Some(state) = self.channels.all.get(channel as usize) else {
            return;
        };
        if state.consumers.is_empty() {
            return;
        }
        // Built once for every consumer, and kept with the record among the
        // channel's recent ones for those that take it later.
        let message = Arc::new(self.consumer_message(&record, None, now));
        let state = &mut self.channels.all[channel as usize];
        if state.kind == ChannelKind::Append {
            let consumer_count = state.consumers.len();
            state
                .recent
                .append(record.clone(), Some(message.clone()), consumer_count);
        }
        self.offer_to_matching(channel, &record, &message, now);
    }

    /// An append or latest channel's record committed: offered to the
    /// consumers whose filters match it; the others follow the tail
    /// without being looked at, or catch up when they are next pumped.
    fn offer_to_matching(
        &mut self,
        channel: u16,
        record: &LentRecord,
        message: &Arc<Message>,
        now: Instant,
    ) {
        let offset = record.offset();
        let found = self.channels.all[channel as usize]
            .followers
            .matching(record.topic());
        for matched in found.chunk_by(|a, b| a.session == b.session) {
            let key = matched[0].session;
            let Some(index) = self.sessions.consumer_index(key, channel) else {
                continue;
            };
            // Everything before the record matched none of its filters.
            self.settle_to(key, channel, offset);
            self.offer_committed(key, index, record, message, Some(matched), now);
            let consumer = &self.sessions.by_key[&key].consumers[index];
            if consumer.next > offset {
                self.follow(key, index);
            } else {
                // It still needs the record: it was detached or had no
                // room, and is pumped when it has.
                self.channels.all[channel as usize].followers.unfollow(key);
            }
        }
    }

    /// Consumer `index` of `key` is told of a committed record: offered it
    /// when it is connected and caught up, let catch up when behind.
    fn offer_committed(
        &mut self,
        key: SessionKey,
        index: usize,
        record: &LentRecord,
        message: &Arc<Message>,
        matched: Option<&[Match]>,
        now: Instant,
    ) {
        self.place_moved(key);
        let session = &self.sessions.by_key[&key];
        if session.connection().is_none() {
            return;
        }
        let caught_up = {
            let c = &session.consumers[index];
            c.next == record.offset() && !c.reading && c.seek.is_none() && c.gap.is_none()
        };
        if caught_up {
            self.offer(key, index, record, Some(message), matched, now);
        } else {
            self.pump(key, index, now);
        }
    }

    /// Ask `connection`'s writer to say when it has caught up, so a
    /// consumer waiting for room there is let go on.
    fn want_drained(&self, connection: u64) {
        if let Some(conn) = self.connections.get(&connection) {
            conn.handle
                .want_drained
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A record as a consumer receives it: the publisher's properties, then
    /// `saguin-offset` (and `saguin-gap` when it has one to announce). The
    /// offset is kept as a number and written by the connection's writer
    /// (`Message::channel_offset`); beside a gap, both are kept as
    /// properties, in that order.
    pub(super) fn consumer_message(
        &self,
        record: &LentRecord,
        gap: Option<(u64, u64)>,
        now: Instant,
    ) -> Message {
        self.consumer_message_of(&record.parts(), record.payload(), gap, now)
    }

    /// [`Self::consumer_message`] of a record's parts and its payload.
    pub(super) fn consumer_message_of(
        &self,
        parts: &RecordParts<'_>,
        payload: Bytes,
        gap: Option<(u64, u64)>,
        now: Instant,
    ) -> Message {
        let received_at = self.received_at(parts.timestamp, now);
        let mut properties = publish_properties_of(parts.props, parts.user_properties);
        let Some((from, to)) = gap else {
            return Message {
                // Offsets start at 1.
                channel_offset: NonZeroU64::new(parts.offset),
                ..message_with_properties(parts, payload, received_at, properties)
            };
        };
        let user = &mut properties.user_properties;
        user.reserve_exact(2);
        user.push((OFFSET_PROPERTY.to_owned(), parts.offset.to_string()));
        user.push((GAP_PROPERTY.to_owned(), format!("{from}-{to}")));
        message_with_properties(parts, payload, received_at, properties)
    }

    /// Offer `record` (at the consumer's `next`) to consumer `index` of
    /// `key`: sent when a filter matches and there is room, skipped when
    /// none matches. False when there was no room (it stays at `next`).
    /// Its callers mark the place moved, once for a run of records.
    pub(super) fn offer(
        &mut self,
        key: SessionKey,
        index: usize,
        record: &LentRecord,
        prepared: Option<&Arc<Message>>,
        matched: Option<&[Match]>,
        now: Instant,
    ) -> bool {
        let Some(session) = self.sessions.by_key.get(&key) else {
            return false;
        };
        let Some(connection) = session.connection() else {
            return false;
        };
        let consumer = &session.consumers[index];
        // The consumer's filters that match the record: as the channel's
        // index found them, or each matched here.
        let (mut found, mut scanned);
        let matching: &mut dyn Iterator<Item = SubOptions> = match matched {
            Some(matched) => {
                found = matched.iter().map(|m| m.options);
                &mut found
            }
            None => {
                scanned = consumer
                    .filters
                    .iter()
                    .filter(|f| f.matches(record.topic()))
                    .map(ConsumerFilter::options);
                &mut scanned
            }
        };
        let window = self.connections.get(&connection).map_or(0, |c| c.window());
        let window_full = self.queues.window_taken(key, &session.inflight) >= window;
        // Most offers that find no room find a full window: said before
        // any filter is matched when every filter would send it inside
        // the window (a QoS 0 record, or a QoS 0 subscription, goes
        // outside it). Its acknowledgements make the room and pump it;
        // only a writer that is behind is asked to say when it drained.
        let all_qos_above_0 = match matched {
            Some(matched) => matched.iter().all(|m| m.options.qos > 0),
            None => consumer.filters.iter().all(|f| f.qos > 0),
        };
        if window_full && record.qos() > 0 && all_qos_above_0 {
            return false;
        }
        let mut best: Option<SubOptions> = None;
        let mut subscription_ids = Vec::new();
        // One hop: a bridge is not handed what arrived over a bridge.
        let looped = session.bridge().is_some() && record.bridge().is_some();
        for f in matching {
            // Every matching subscription's identifier, as MQTT 5 says,
            // those of no-local ones too.
            subscription_ids.extend(f.subscription_id);
            if looped || (f.no_local && record.client_id() == &*session.client_id) {
                continue;
            }
            if best.is_none_or(|b| f.qos > b.qos) {
                best = Some(f);
            }
        }
        let Some(filter) = best else {
            self.sessions.consumer_at(key, index).next = record.offset() + 1;
            return true;
        };
        let qos = filter.qos.min(record.qos());
        let retain = filter.retain_as_published && record.retain();
        let gap = consumer.gap;
        if qos > 0 && window_full {
            return false;
        }
        let has_room = self.has_room(connection)
            && (!self.channels.is_latest(consumer.channel) || self.values_sent(connection));
        if !has_room {
            self.want_drained(connection);
            return false;
        }
        let message = match (prepared, gap) {
            (Some(m), None) => m.clone(),
            _ => Arc::new(self.consumer_message(record, gap, now)),
        };
        let queued = QueuedMessage {
            message,
            qos,
            retain,
            subscription_ids: subscription_ids.into(),
            logged: None,
        };
        let offset = record.offset();
        let session = self.sessions.by_key.get_mut(&key).expect("looked up");
        let consumer = &mut session.consumers[index];
        consumer.gap = None;
        consumer.next = offset + 1;
        if queued.message.expiry_left(now).is_err() {
            self.metrics.dropped(DropReason::Expired);
            return true;
        }
        if qos == 0 {
            self.transmit(connection, queued, 0, false, now);
            return true;
        }
        let Some(packet_id) = session.inflight.allocate_id() else {
            consumer.next = offset;
            return false;
        };
        consumer.unacked.insert(offset);
        let channel = consumer.channel;
        session.inflight.push(InflightEntry::sent(
            packet_id,
            queued.clone(),
            Some((channel, offset)),
        ));
        self.transmit(connection, queued, packet_id, false, now);
        true
    }

    /// Let consumer `index` of `key` catch up once the current event is
    /// handled (every acknowledgement of a read has made its room by then,
    /// so one read fills the window).
    pub(super) fn pump(&mut self, key: SessionKey, index: usize, _now: Instant) {
        if let Some(consumer) = self
            .sessions
            .by_key
            .get(&key)
            .and_then(|s| s.consumers.get(index))
        {
            self.channels.pumps_due.push((key, consumer.channel));
        }
    }

    /// The reads the event just handled made due.
    pub(super) fn run_pumps(&mut self, now: Instant) {
        self.run_group_reads();
        if self.channels.hold_pumps {
            return;
        }
        let mut back = std::mem::take(&mut self.channels.back);
        if self.channels.pumps_due.is_empty() {
            return;
        }
        let mut due = std::mem::take(&mut self.channels.pumps_due);
        due.sort_unstable();
        due.dedup();
        if back.len() >= super::catch_up::TOGETHER_AT_LEAST {
            back.sort_unstable();
            self.catch_up_back(&due, &back, now);
        }
        for (key, channel) in due {
            if let Some(index) = self.sessions.consumer_index(key, channel) {
                self.read_for(key, index, now);
            }
        }
    }

    /// Consumer `index` of `key` catches up from its channel's recent
    /// reads, then reads from its `next` when it is still behind,
    /// connected, has room and has no read out.
    fn read_for(&mut self, key: SessionKey, index: usize, now: Instant) {
        if let Some(consumer) = self
            .sessions
            .by_key
            .get(&key)
            .and_then(|s| s.consumers.get(index))
        {
            // One following its channel's tail has nothing to read: every
            // record from its `next` on matched none of its filters. Left
            // unsettled, its place is written with the others passed over
            // (the tick pumps every connected consumer: settled here, each
            // would be written at every flush after a tick).
            if self.channels.all[consumer.channel as usize]
                .followers
                .is_following(key)
            {
                return;
            }
        }
        if !self.serve_recent(key, index, now) {
            return;
        }
        let Some(session) = self.sessions.by_key.get(&key) else {
            return;
        };
        let Some(connection) = session.connection() else {
            return;
        };
        let Some(consumer) = session.consumers.get(index) else {
            return;
        };
        if consumer.reading {
            return;
        }
        let channel = consumer.channel;
        let behind = consumer.seek.is_some()
            || consumer.gap.is_some()
            || consumer.next < self.channels.all[channel as usize].next;
        if !behind {
            // A latest channel's consumer catches up here (its reads are
            // not kept among recent ones): it follows the tail from now.
            self.follow(key, index);
            return;
        }
        let window = self.connections.get(&connection).map_or(0, |c| c.window());
        let wants_acks = consumer.filters.iter().any(|f| f.qos > 0);
        let room = if wants_acks {
            window.saturating_sub(self.queues.window_taken(key, &session.inflight))
        } else {
            READ_MAX
        };
        if room == 0 {
            return;
        }
        if !self.has_room(connection) {
            self.want_drained(connection);
            return;
        }
        // A latest channel's changes wait for the current values still owed
        // on the connection (`offer`): read now, they would be read again
        // and again until then. Sending the last of them pumps it.
        if self.channels.is_latest(channel) && !self.values_sent(connection) {
            return;
        }
        // Small records are read past the consumer's room: what it does
        // not take now waits among the recent reads, for it and for the
        // consumers behind it.
        let state = &self.channels.all[channel as usize];
        let ask = match (state.kind, state.recent.record_bytes()) {
            (ChannelKind::Append, Some(bytes)) => {
                room.max(usize::try_from(recent::MAX_BYTES / bytes).unwrap_or(usize::MAX))
            }
            _ => room,
        };
        let from = match (consumer.seek, consumer.resync) {
            (Some(seek), _) => seek,
            (None, Some(floor)) if consumer.next < floor => Seek::Resync {
                from: consumer.next,
                floor,
            },
            (None, _) => Seek::Offset(consumer.next),
        };
        let generation = consumer.generation;
        let append = state.kind == ChannelKind::Append;
        debug_assert!(
            !self.channels.all[channel as usize]
                .followers
                .is_following(key),
            "a consumer following the tail reads"
        );
        // Whichever read answers it, the consumer waits for one from here.
        self.sessions.consumer_at(key, index).reading = true;
        // Consumers at the same place read once: one whose next a read
        // out already asks for waits for its answer.
        let state = &self.channels.all[channel as usize];
        let joined = match from {
            Seek::Offset(next) if append => state
                .reads_out
                .iter()
                .find(|&&(_, start, until)| start <= next && next < until)
                .map(|&(ticket, _, _)| ticket),
            _ => None,
        };
        if let Some(ticket) = joined {
            if let Some(read) = self.channels.consumer_reads.get_mut(&ticket) {
                read.readers.push((key, generation));
                return;
            }
        }
        let ticket = self.reads.number();
        let mut max = ask.clamp(1, READ_MAX);
        if let (Seek::Offset(start), true) = (from, append) {
            let state = &mut self.channels.all[channel as usize];
            // What the recent reads hold from the next span on is served
            // from there: read only up to it.
            if let Some(held) = state.recent.next_span_after(start) {
                max = max.min(usize::try_from(held - start).unwrap_or(usize::MAX).max(1));
            }
            state
                .reads_out
                .push((ticket, start, start.saturating_add(max as u64)));
        }
        self.channels.consumer_reads.insert(
            ticket,
            ConsumerRead {
                channel,
                readers: vec![(key, generation)],
            },
        );
        self.reads.waiting.push(ChannelRead {
            ticket,
            channel,
            from,
            max,
            filters: Vec::new(),
        });
    }

    /// Hand consumer `index` of `key` what its channel's recent reads hold
    /// from its `next` on, as far as its room allows. False when its room
    /// ran out; true when it is caught up or the rest takes a read.
    ///
    /// A span's records are handed out as a run: looked up once, each
    /// record and its message lent to [`BrokerState::offer`] in turn.
    pub(super) fn serve_recent(&mut self, key: SessionKey, index: usize, now: Instant) -> bool {
        self.place_moved(key);
        loop {
            let Some(consumer) = self
                .sessions
                .by_key
                .get(&key)
                .and_then(|s| s.consumers.get(index))
            else {
                return true;
            };
            let channel = consumer.channel as usize;
            if consumer.reading || consumer.seek.is_some() {
                return true;
            }
            let next = consumer.next;
            let state = &mut self.channels.all[channel];
            if state.kind != ChannelKind::Append {
                return true;
            }
            if next >= state.next {
                self.follow(key, index);
                return true;
            }
            let mut run = match state.recent.take_run(next) {
                Err(Lookup::Empty { end }) => {
                    self.sessions.consumer_at(key, index).next = end;
                    continue;
                }
                Err(_) => return true,
                Ok(run) => run,
            };
            let mut room = true;
            // The run's deliveries go to the consumer's writer together.
            if let Some(connection) = self.sessions.by_key.get(&key).and_then(|s| s.connection()) {
                self.hold_sends(connection);
            }
            for at in run.from..run.entries.len() {
                let consumer = &self.sessions.by_key[&key].consumers[index];
                let topic = run.entries[at].record.topic();
                // A record it does not match is passed here, before a
                // message is made for it or its session looked at: a
                // device back after a crash passes thousands of other
                // devices' records for each of its own.
                if !consumer.filters.iter().any(|f| f.matches(topic)) {
                    continue;
                }
                let has_gap = consumer.gap.is_some();
                let offset = run.entries[at].record.offset();
                // Everything before the record matched none of its filters.
                let consumer = self.sessions.consumer_at(key, index);
                debug_assert!(
                    consumer.next <= offset,
                    "a run starts at its reader's place"
                );
                consumer.next = offset;
                let entry = &mut run.entries[at];
                // A gap's announcement makes a message of its own.
                if entry.message.is_none() && !has_gap {
                    entry.message = Some(Arc::new(self.consumer_message(&entry.record, None, now)));
                }
                let message = if has_gap {
                    None
                } else {
                    entry.message.as_ref()
                };
                if !self.offer(key, index, &entry.record, message, None, now) {
                    room = false;
                    break;
                }
            }
            self.release_sends();
            let end = run.end;
            self.channels.all[channel].recent.put_back(run);
            if !room {
                return false;
            }
            // The span holds nothing more up to its end.
            let consumer = self.sessions.consumer_at(key, index);
            consumer.next = consumer.next.max(end);
        }
    }

    /// Every consumer of session `key` catches up as far as its room allows.
    pub(super) fn pump_all(&mut self, key: SessionKey, now: Instant) {
        self.queues.worker_room(key);
        for (index, group) in self.groups.all.iter().enumerate() {
            if group.has_member(key) {
                self.groups.due.push(index);
            }
        }
        let count = self
            .sessions
            .by_key
            .get(&key)
            .map_or(0, |s| s.consumers.len());
        for index in 0..count {
            self.pump(key, index, now);
        }
    }

    /// Reads of channel records the server must make, in the order asked.
    pub fn take_reads(&mut self, out: &mut Vec<ChannelRead>) {
        out.append(&mut self.reads.waiting);
    }

    /// A read came back: its records go to the consumer in order, as far as
    /// its room allows; what did not fit is read again later.
    pub(super) fn on_channel_read(
        &mut self,
        ticket: u64,
        result: Result<ReadWindow, super::StorageFailure>,
        now: Instant,
    ) {
        if self.on_group_read(ticket, &result, now)
            || self.on_values_read(ticket, &result, now)
            || self.on_offer_read(ticket, &result, now)
        {
            return;
        }
        let Some(read) = self.channels.consumer_reads.remove(&ticket) else {
            return;
        };
        let channel = read.channel;
        let state = &mut self.channels.all[channel as usize];
        state.reads_out.retain(|&(t, _, _)| t != ticket);
        let channel_name = state.name.clone();
        // The consumers still waiting for this read: those that went, or
        // were moved elsewhere meanwhile (a new generation), are not.
        let mut readers = Vec::with_capacity(read.readers.len());
        for (key, generation) in read.readers {
            let Some(index) = self.sessions.consumer_index(key, channel) else {
                continue;
            };
            let consumer = &mut self
                .sessions
                .by_key
                .get_mut(&key)
                .expect("indexed")
                .consumers[index];
            if consumer.generation != generation {
                continue;
            }
            consumer.reading = false;
            readers.push((key, index));
            self.place_moved(key);
        }
        if readers.is_empty() {
            return;
        }
        let window = match result {
            Ok(window) => window,
            Err(failure) => {
                // Tried again at the next tick: a consumer is never moved
                // past records it could not read.
                tracing::warn!(channel = %channel_name, error = %failure.message, consumers = readers.len(), "reading records for consumers failed; it is tried again");
                return;
            }
        };
        let progressed = !window.records.is_empty();
        let append = self.channels.all[channel as usize].kind == ChannelKind::Append;
        let mut resolved = Vec::new();
        for &(key, index) in &readers {
            let consumer = &mut self
                .sessions
                .by_key
                .get_mut(&key)
                .expect("indexed")
                .consumers[index];
            // A start that took a read to find is written at once, not at
            // the next flush: a restart before then would begin at `next`.
            // (Only the consumer that asked can have one: none joins a
            // read from a seek.)
            if consumer.seek.take().is_some() {
                consumer.next = window.start;
                resolved.push(key);
            }
            if let Some(floor) = window.floor {
                if !append {
                    // A latest channel forgot deletions this consumer was
                    // owed: it reads every row again from where the window
                    // starts.
                    consumer.gap = Some((consumer.next, floor - 1));
                    consumer.next = window.start;
                    consumer.resync = Some(floor);
                    self.metrics.consumer_gap(&channel_name);
                } else if floor > consumer.next {
                    consumer.gap = Some((consumer.next, floor - 1));
                    consumer.next = floor;
                    self.metrics.consumer_gap(&channel_name);
                }
            }
            if consumer.resync.is_some_and(|floor| consumer.next >= floor) {
                consumer.resync = None;
            }
        }
        if append {
            // Kept for the consumers after them, and sent from there.
            let state = &mut self.channels.all[channel as usize];
            state
                .recent
                .insert(window.start, window.records, state.consumers.len());
            self.serve_recent_all(channel, &readers, now);
        } else {
            for &(key, index) in &readers {
                self.offer_window(key, index, &window, now);
            }
        }
        for key in resolved {
            self.stage_positions(key, now);
        }
        if progressed {
            for &(key, index) in &readers {
                self.pump(key, index, now);
            }
        }
    }

    /// A latest channel's window, offered in order as far as the room
    /// allows; one offered whole moves the consumer to where it ends.
    fn offer_window(&mut self, key: SessionKey, index: usize, window: &ReadWindow, now: Instant) {
        self.place_moved(key);
        for record in &window.records {
            let next = self.sessions.by_key[&key].consumers[index].next;
            if record.offset() < next {
                continue;
            }
            if !self.offer(key, index, record, None, None, now) {
                return;
            }
        }
        if let Some(end) = window.next {
            let consumer = &mut self
                .sessions
                .by_key
                .get_mut(&key)
                .expect("indexed")
                .consumers[index];
            consumer.next = consumer.next.max(end);
        }
    }

    /// Consumers that fell behind with nothing to wake them (a failed
    /// read) try again; called from the tick. Only a connected one can
    /// be sent anything (a session reconnecting is pumped then), and one
    /// following its channel's tail has nothing to read: those left are
    /// the channels' connected consumers behind it.
    pub(super) fn pump_stalled(&mut self, now: Instant) {
        // Those behind are connected, so attached: with none attached
        // there is no channel to look at, where an idle broker looked at
        // each of its channels at every tick.
        if self.channels.attached.is_empty() {
            debug_assert!(
                self.channels
                    .all
                    .iter()
                    .all(|c| c.followers.behind().next().is_none()),
                "a consumer behind is not attached"
            );
            return;
        }
        let mut keys: Vec<SessionKey> = self
            .channels
            .all
            .iter()
            .flat_map(|c| c.followers.behind())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            self.pump_all(key, now);
        }
    }

    /// The sessions consuming a channel that have a connection. A
    /// detached consumer is sent nothing and acknowledges nothing, and its
    /// positions were written as it went away: a broker's turns need not
    /// look at it (thousands of offline devices that consume a channel).
    pub(super) fn attached_consumers(&mut self) -> Vec<SessionKey> {
        debug_assert!(
            self.channels
                .all
                .iter()
                .flat_map(|c| &c.consumers)
                .all(|key| {
                    self.sessions
                        .by_key
                        .get(key)
                        .is_none_or(|s| s.connection().is_none())
                        || self.channels.attached.contains(key)
                }),
            "a connected consumer was left out of Channels::attached"
        );
        debug_assert!(
            self.channels
                .all
                .iter()
                .all(|c| c.consumers.iter().all(|key| {
                    self.sessions
                        .by_key
                        .get(key)
                        .is_none_or(|s| s.connection().is_none())
                        || c.followers.is_indexed(*key)
                })),
            "a connected consumer's filters were left out of its channel's index"
        );
        let sessions = &self.sessions.by_key;
        self.channels.attached.retain(|key| {
            sessions
                .get(key)
                .is_some_and(|s| s.connection().is_some() && !s.consumers.is_empty())
        });
        let mut keys: Vec<SessionKey> = self.channels.attached.iter().copied().collect();
        keys.sort_unstable();
        keys
    }

    /// A channel delivery's exchange ended: the record no longer holds the
    /// consumer's position back.
    pub(super) fn channel_acknowledged(&mut self, key: SessionKey, channel: u16, offset: u64) {
        if self.groups.acknowledged(key, channel, offset) {
            return;
        }
        self.place_moved(key);
        if let Some(index) = self.sessions.consumer_index(key, channel) {
            let session = self.sessions.by_key.get_mut(&key).expect("indexed");
            session.consumers[index].unacked.remove(offset);
        }
    }

    /// The session's own (not shared) subscriptions on `channel`, by their
    /// raw filters.
    fn subscriptions_on(
        &self,
        key: SessionKey,
        channel: u16,
    ) -> impl Iterator<Item = (&String, &SessionSubscription)> {
        let name = &self.channels.all[channel as usize].name;
        self.sessions.by_key[&key]
            .subscriptions
            .iter()
            .filter(move |(raw, s)| !s.is_shared() && first_level(s.filter(raw)) == &**name)
    }

    /// Whether the session consumes `channel`: it holds a subscription
    /// there of its own (asked without making its filters).
    pub(super) fn consumes(&self, key: SessionKey, channel: u16) -> bool {
        self.subscriptions_on(key, channel).next().is_some()
    }

    /// The session's subscriptions on `channel`, as its consumer matches
    /// records against them.
    pub(super) fn filters_on(&self, key: SessionKey, channel: u16) -> Vec<ConsumerFilter> {
        let name = &self.channels.all[channel as usize].name;
        let mut filters: Vec<ConsumerFilter> = self
            .subscriptions_on(key, channel)
            .map(|(raw, s): (&String, &SessionSubscription)| ConsumerFilter {
                filter: s.filter(raw).to_owned(),
                whole_channel: s
                    .filter(raw)
                    .strip_prefix(&**name)
                    .is_some_and(|rest| rest == "/#"),
                qos: s.options.qos,
                no_local: s.options.no_local,
                retain_as_published: s.options.retain_as_published,
                subscription_id: s.options.subscription_id,
            })
            .collect();
        // Kept by the consumer as long as it lives: a device's one filter
        // holds room for one, not the four a first push makes.
        filters.shrink_to_fit();
        filters
    }

    /// Make (or refresh) session `key`'s consumer of `channel` after its
    /// subscriptions there changed. A new consumer starts at `start`
    /// (its stored position at startup), else at `seek`, else at `next`;
    /// an existing one moves only when `seek` is given. One with no
    /// subscription left there goes, with its position.
    pub(super) fn refresh_consumer(
        &mut self,
        key: SessionKey,
        channel: u16,
        seek: Option<Seek>,
        start: Option<u64>,
        now: Instant,
    ) {
        if self.channels.is_queue(channel) {
            self.refresh_worker(key, channel, now);
            return;
        }
        self.place_moved(key);
        let filters = self.filters_on(key, channel);
        let next = self.channels.all[channel as usize].next;
        let generation = self.reads.number();
        let index = self.sessions.consumer_index(key, channel);
        // Its filters change: it stops following the tail (a new filter
        // would be owed records it was passed over for), and is pumped
        // below, to follow it again once caught up.
        self.leave_following(key, channel);
        let session = self.sessions.by_key.get_mut(&key).expect("known session");
        let old = index.map(|i| std::mem::take(&mut session.consumers[i].filters));
        self.channels.all[channel as usize].followers.refiled(
            key,
            old.as_deref().unwrap_or_default(),
            &filters,
            session.connection().is_some(),
        );
        match index {
            Some(i) if filters.is_empty() => {
                session.consumers.remove(i);
                self.channels.all[channel as usize].consumers.remove(&key);
                self.drop_position(key, channel);
                return;
            }
            None if filters.is_empty() => return,
            Some(i) => {
                let consumer = &mut session.consumers[i];
                consumer.filters = filters;
                if let Some(seek) = seek {
                    consumer.generation = generation;
                    consumer.reading = false;
                    consumer.values_pending = false;
                    consumer.gap = None;
                    consumer.resync = None;
                    consumer.unacked.clear();
                    consumer.set_start(seek);
                }
            }
            None => {
                let start = start.or_else(|| {
                    let bridge = session.bridge()?;
                    self.bridges.position(channel, bridge)
                });
                let mut consumer = Consumer {
                    channel,
                    generation,
                    filters,
                    next: start.unwrap_or(next),
                    unacked: Offsets::default(),
                    values_pending: false,
                    reading: false,
                    seek: None,
                    gap: None,
                    resync: None,
                    stored: start,
                };
                if let (None, Some(seek)) = (start, seek) {
                    consumer.set_start(seek);
                }
                // Most sessions consume one channel: room for one, not the
                // four a first push makes (a consumer is some 150 bytes).
                session.consumers.reserve_exact(1);
                session.consumers.push(consumer);
                if session.connection().is_some() {
                    self.channels.attached.insert(key);
                }
                self.channels.all[channel as usize].consumers.insert(key);
            }
        }
        if let Some(i) = self.sessions.consumer_index(key, channel) {
            self.pump(key, i, now);
        }
    }

    /// The channels served, by index, named before anything is restored:
    /// a filter within one is matched by its consumers, never by the
    /// broadcast index, and the sessions restored first are told so.
    pub fn name_channels(&mut self, names: impl IntoIterator<Item = Arc<str>>) {
        self.channels.names = ChannelNames::new(names);
    }

    /// Restore channels and the consumers of restored sessions; positions
    /// and holds nobody owns any more are dropped.
    pub(super) fn restore_channels(&mut self, restored: Vec<RestoredChannel>, now: Instant) {
        let names = ChannelNames::new(restored.iter().map(|c| c.name.clone()));
        debug_assert!(
            self.channels.names.is_empty() || self.channels.names == names,
            "the channels named before the restore are those restored"
        );
        self.channels.names = names;
        self.channels.all = restored
            .iter()
            .map(|c| Channel {
                name: c.name.clone(),
                kind: c.kind,
                next: c.next.max(1),
                consumers: IdSet::default(),
                recent: Recent::default(),
                reads_out: Vec::new(),
                followers: Followers::default(),
                lag_told: None,
            })
            .collect();
        self.queues.restore(&restored, &self.metrics);
        for (i, channel) in restored.into_iter().enumerate() {
            let i = i as u16;
            for position in channel.positions {
                let key = self.sessions.of_client(position.reader.id());
                let owned = key.is_some_and(|k| self.consumes(k, i))
                    && position.reader.scheme() == crate::storage::contract::ReaderScheme::Mqtt;
                match key {
                    Some(key) if owned => {
                        let start = position.offset.min(self.channels.all[i as usize].next);
                        self.refresh_consumer(key, i, None, Some(start), now);
                    }
                    // A shared group's place, for when a member joins.
                    _ if position.reader.scheme()
                        == crate::storage::contract::ReaderScheme::Mqtt
                        && position.reader.id().starts_with("$share/") =>
                    {
                        self.groups
                            .positions
                            .insert((i, position.reader.id().to_owned()), position.offset);
                    }
                    _ if position.reader.scheme()
                        == crate::storage::contract::ReaderScheme::Mqtt =>
                    {
                        self.persist
                            .stage(Role::Channel(i), Write::DropPosition(position.reader));
                    }
                    // A bridge resumes from it when it connects.
                    _ => {
                        self.bridges
                            .keep_position(i, position.reader.id(), position.offset);
                    }
                }
            }
            // Sessions consuming the channel with no position stored yet
            // start at its next offset.
            let keys: Vec<SessionKey> = self.sessions.by_key.keys().copied().collect();
            for key in keys {
                if self.sessions.consumer_index(key, i).is_none() && self.consumes(key, i) {
                    self.refresh_consumer(key, i, None, None, now);
                }
            }
            // Members of shared groups over the channel rejoin them.
            let mut members: Vec<(SessionKey, String, String)> = self
                .sessions
                .by_key
                .iter()
                .flat_map(|(k, s)| {
                    s.subscriptions
                        .iter()
                        .filter(|(_, sub)| sub.is_shared())
                        .map(move |(raw, sub)| (*k, raw.clone(), sub.filter(raw).to_owned()))
                })
                // A queue's shared workers are workers like any other.
                .filter(|_| channel.kind != ChannelKind::Queue)
                .filter(|(_, _, filter)| first_level(filter) == &*channel.name)
                .collect();
            members.sort();
            for (key, raw, filter) in members {
                self.join_group(key, i, &raw, &filter, None);
            }
            for hold in channel.holds {
                let bridge = hold
                    .client_id
                    .parse::<Reader>()
                    .is_ok_and(|r| r.scheme() == crate::storage::contract::ReaderScheme::Bridge);
                match self.sessions.of_client(&hold.client_id) {
                    Some(key) => {
                        let session = self
                            .sessions
                            .hold_inbound(key, hold.packet_id, now)
                            .expect("indexed");
                        session.rare.channel_holds.insert(hold.packet_id, i);
                    }
                    // A bridge's, kept for its connection (the holds of a
                    // bridge no longer configured were dropped at open).
                    None if bridge => self.bridges.add_hold(
                        &hold.client_id,
                        BridgeHold {
                            packet_id: hold.packet_id,
                            channel: i,
                            held_at: now,
                            writing: false,
                        },
                    ),
                    // Its session ended with the process (a clean one), so
                    // does the publish it never released: counted as at any
                    // session's end.
                    None => {
                        self.metrics.dropped(DropReason::ExactlyOnceExpired);
                        self.persist.stage(
                            Role::Channel(i),
                            Write::DropChannelHold {
                                client_id: hold.client_id,
                                packet_id: hold.packet_id,
                            },
                        )
                    }
                }
            }
        }
    }

    /// Channels served, for tests and the startup log.
    pub fn channel_count(&self) -> usize {
        self.channels.all.len()
    }
}
