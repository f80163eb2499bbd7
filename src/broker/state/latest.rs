//! Latest channels: one value per topic, and consumers that get the
//! current values first and the changes after.
//!
//! A PUBLISH to a latest channel's topic replaces that topic's value (an
//! empty payload deletes it), through the channel's persister like an
//! append, and is answered after the commit. Every set and every deletion
//! takes the channel's next offset, so a latest consumer is an append
//! consumer over those offsets ([`super::channel`]): caught up, it is
//! handed each change as it commits; behind, it reads what changed since
//! its `next`, deletions as empty payloads, each topic's latest change
//! only.
//!
//! A new consumer - no place in memory and none stored - is first sent the
//! current values under its filters, with RETAIN set, as Retain Handling
//! says (0: on every such SUBSCRIBE, 1: when the subscription is new, 2:
//! never): read off the broker task, queued behind the connection's
//! retained messages and sent as its window allows. Its change stream
//! starts at the channel's `next` as the SUBSCRIBE found it and waits
//! until the values are sent, so a change that committed while they were
//! read comes after them, never before an older value. A consumer with a
//! place (a persistent session, a stored position after a restart)
//! resumes from it with the changes only.
//!
//! The values are the consumer's as much as its changes, so its stored
//! position covers them only once each is acknowledged (QoS 1/2) or sent
//! (QoS 0): until then it is at most the lowest offset still owed. A
//! durable consumer's position is written with its SUBSCRIBE, before the
//! SUBACK, as the first offset, and stays there while the values are
//! read (what is owed is not known yet; a failed read is asked again at
//! the tick, the changes waiting meanwhile): killed before any of them
//! was acknowledged, it resumes from the first offset and is sent every
//! value again as a change, with the deletions since (empty payloads for
//! topics it never had). Values its connection had not sent when it went
//! away are read again from the lowest when it resumes, as changes - each
//! topic's latest change since, so a value replaced meanwhile comes as its
//! replacement - and a resume after a restart does the same from the
//! stored position.
//!
//! A consumer whose place fell below the floor (its channel's retention
//! forgot deletions it was owed) is sent every row again from the first
//! offset, with `saguin-gap` on the first (`consumer::Consumer::resync`,
//! `storage::contract::read_changes`).

use std::sync::Arc;

use tokio::time::Instant;

use super::consumer::ConsumerStart;
use super::ids::IdMap;
use super::reads::{ChannelRead, ReadRequests, ReadWindow, Seek};
use super::{BrokerState, RetainedDue, StorageFailure};
use crate::broker::subscriptions::{SessionKey, SubOptions};
use crate::topic;

/// Reads of latest channels' current values for their consumers.
#[derive(Debug, Default)]
pub(super) struct LatestReads {
    /// Out, by ticket.
    pub out: IdMap<u64, ValuesRead>,
    /// Those that failed, asked again at the tick.
    pub failed: Vec<ValuesRead>,
}

impl LatestReads {
    /// Ask the readers for `read`'s current values, under a new ticket.
    fn ask(&mut self, reads: &mut ReadRequests, read: ValuesRead) {
        let ticket = reads.number();
        reads.waiting.push(ChannelRead {
            ticket,
            channel: read.channel,
            from: Seek::Current,
            max: usize::MAX,
            filters: read.filters.iter().map(|(f, _)| f.clone()).collect(),
        });
        self.out.insert(ticket, read);
    }
}

/// A read of current values out: for whom, and under which filters.
#[derive(Debug)]
pub(super) struct ValuesRead {
    key: SessionKey,
    channel: u16,
    generation: u64,
    filters: Vec<(String, SubOptions)>,
}

impl BrokerState {
    /// The latest channels of `consumers` session `key` has no consumer of
    /// yet: those owe it their current values.
    pub(super) fn fresh_latest_consumers(
        &self,
        key: SessionKey,
        consumers: &[ConsumerStart],
    ) -> Vec<u16> {
        consumers
            .iter()
            .filter(|s| s.group.is_none() && self.channels.is_latest(s.channel))
            .filter(|s| self.sessions.consumer_index(key, s.channel).is_none())
            .map(|s| s.channel)
            .collect()
    }

    /// Ask for the current values a SUBSCRIBE owes: for each of `fresh`,
    /// under its filters Retain Handling asked values for.
    pub(super) fn latest_values(
        &mut self,
        connection: u64,
        key: SessionKey,
        fresh: &[u16],
        wanted: &[(String, SubOptions)],
    ) {
        if !self.connections.contains_key(&connection) {
            return;
        }
        for &channel in fresh {
            let filters: Vec<(String, SubOptions)> = wanted
                .iter()
                .filter(|(f, _)| self.channels.of_topic(f) == Some(channel))
                .cloned()
                .collect();
            if filters.is_empty() {
                continue;
            }
            let Some(index) = self.sessions.consumer_index(key, channel) else {
                continue;
            };
            let session = self.sessions.by_key.get_mut(&key).expect("indexed");
            let consumer = &mut session.consumers[index];
            // Its changes wait for the values (see the module documentation).
            consumer.reading = true;
            consumer.values_pending = true;
            let generation = consumer.generation;
            self.latest_reads.ask(
                &mut self.reads,
                ValuesRead {
                    key,
                    channel,
                    generation,
                    filters,
                },
            );
        }
    }

    /// Reads of current values that failed are asked again (the tick),
    /// for consumers still waiting for them and connected.
    pub(super) fn retry_values(&mut self) {
        for read in std::mem::take(&mut self.latest_reads.failed) {
            let waiting = self
                .sessions
                .consumer_index(read.key, read.channel)
                .map(|i| &self.sessions.by_key[&read.key].consumers[i])
                .is_some_and(|c| c.generation == read.generation && c.values_pending);
            if !waiting {
                continue;
            }
            if self.sessions.by_key[&read.key].connection().is_some() {
                self.latest_reads.ask(&mut self.reads, read);
            } else {
                self.latest_reads.failed.push(read);
            }
        }
    }

    /// A read of current values came back: queued as retained messages,
    /// then the consumer's changes go on. False when the ticket is not one.
    pub(super) fn on_values_read(
        &mut self,
        ticket: u64,
        result: &Result<ReadWindow, StorageFailure>,
        now: Instant,
    ) -> bool {
        let Some(read) = self.latest_reads.out.remove(&ticket) else {
            return false;
        };
        let Some(index) = self.sessions.consumer_index(read.key, read.channel) else {
            return true;
        };
        let consumer = &mut self
            .sessions
            .by_key
            .get_mut(&read.key)
            .expect("indexed")
            .consumers[index];
        if consumer.generation != read.generation {
            return true;
        }
        let window = match result {
            Ok(window) => window,
            Err(failure) => {
                // Asked again at the tick; its changes wait for the values
                // meanwhile, and no position passes what it is owed.
                tracing::warn!(channel = %self.channels.all[read.channel as usize].name, error = %failure.message, "reading a latest channel's current values failed; it is tried again");
                self.latest_reads.failed.push(read);
                return true;
            }
        };
        consumer.reading = false;
        consumer.values_pending = false;
        let below = consumer.next;
        let session = &self.sessions.by_key[&read.key];
        let (principal, client_id) = (session.principal.clone(), session.client_id.clone());
        let mut due = Vec::new();
        for record in &window.records {
            if self.authorizer.is_active()
                && !self
                    .authorizer
                    .can_receive(principal.as_deref(), &client_id, record.topic())
            {
                continue;
            }
            let matching = read
                .filters
                .iter()
                .filter(|(f, _)| topic::filter_matches(f, record.topic()));
            let mut qos = None;
            let mut subscription_ids = Vec::new();
            for (_, options) in matching {
                qos = qos.max(Some(options.qos));
                subscription_ids.extend(options.subscription_id);
            }
            let Some(qos) = qos else {
                continue;
            };
            // A value at or past where its changes start comes again as a
            // change; one below is owed, and holds its position back.
            let owed = (record.offset() < below).then_some((read.channel, record.offset()));
            due.push(RetainedDue {
                message: Arc::new(self.consumer_message(record, None, now)).into(),
                qos: qos.min(record.qos()),
                subscription_ids,
                sys: false,
                channel: owed,
            });
        }
        let consumer = &mut self
            .sessions
            .by_key
            .get_mut(&read.key)
            .expect("indexed")
            .consumers[index];
        for (_, offset) in due.iter().filter_map(|d| d.channel) {
            consumer.owe(offset);
        }
        self.place_moved(read.key);
        let connection = self.sessions.by_key[&read.key]
            .connection()
            .filter(|c| self.connections.contains_key(c));
        let Some(connection) = connection else {
            // Gone while they were read: read again when it resumes.
            self.values_not_sent(read.key, due);
            return true;
        };
        if let Some(conn) = self.connections.get_mut(&connection) {
            conn.owe(due);
        }
        self.send_retained_backlog(connection, now);
        self.pump(read.key, index, now);
        true
    }

    /// Current values owed to `key` will not be sent (`due`, what its
    /// connection had not sent when it went away): each consumer reads
    /// again from the lowest, so a resume sends them - as changes, or as
    /// whatever replaced them since - and its position holds them back
    /// until then.
    pub(super) fn values_not_sent(
        &mut self,
        key: SessionKey,
        due: impl IntoIterator<Item = RetainedDue>,
    ) {
        self.place_moved(key);
        let mut owed: std::collections::BTreeMap<u16, Vec<u64>> = Default::default();
        for (channel, offset) in due.into_iter().filter_map(|d| d.channel) {
            owed.entry(channel).or_default().push(offset);
        }
        for (channel, offsets) in owed {
            // Its `next` moves back to what it is owed.
            self.leave_following(key, channel);
            let generation = self.reads.number();
            if let Some(index) = self.sessions.consumer_index(key, channel) {
                let session = self.sessions.by_key.get_mut(&key).expect("indexed");
                session.consumers[index].rewind(&offsets, generation);
            }
        }
    }

    /// The value at `offset` of `channel` owed to `key` was sent or
    /// dropped: its place no longer waits for it.
    pub(super) fn value_done(&mut self, key: SessionKey, channel: u16, offset: u64) {
        self.sessions.value_done(key, channel, offset);
        self.place_moved(key);
    }

    /// Have the current values owed on `connection` all been sent? A latest
    /// consumer's changes wait until they have.
    pub(super) fn values_sent(&self, connection: u64) -> bool {
        self.connections
            .get(&connection)
            .is_none_or(|c| c.retained_backlog.is_empty())
    }
}
