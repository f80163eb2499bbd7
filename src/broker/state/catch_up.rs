//! Consumers of an append channel catching up on the same records
//! together. After a crash, thousands of devices come back at places the
//! broker wrote up to a minute before (a place moved only past records
//! its consumer does not match is written that seldom: `positions`), and
//! each must pass every record since. They join each other's reads
//! (`channel::read_for`); a read they joined is handed out in one pass
//! over its records, each record's consumers found in the channel's index
//! of their filters (`following`), instead of every consumer looking at
//! every record: 19,000 devices each passing 20,000 records were 380
//! million looks. Devices back after that read was answered find its
//! records among the recent reads: those whose sessions' writes were
//! answered in one turn (`BrokerState::handle_all`) pass them in one pass
//! as well (`BrokerState::catch_up_back`).
//!
//! The pass keeps the rule a consumer's `next` keeps: everything below
//! it was sent or skipped. A member is looked at from its `next` on; a
//! record the index says it matches is offered to it, and the records
//! before that (which matched none of its filters, or the index would
//! have said so) are passed; a member whose room ran out leaves the pass
//! where it stands, and one that is left at the end of the records read
//! has passed them all. Only a connected consumer is a member (the index
//! holds the filters of connected ones only), and only one with no gap
//! to announce: the others, and fewer than [`TOGETHER_AT_LEAST`]
//! consumers, are handed the records one by one.

use std::collections::BTreeMap;

use saguin_format::model::ChannelKind;
use tokio::time::Instant;

use super::ids::IdMap;
use super::recent::Lookup;
use super::BrokerState;
use crate::broker::subscriptions::SessionKey;

/// Consumers of one read handed out in one pass from this many: below
/// it, each looking at the records (a filter or two matched a record) is
/// cheaper than the index's look-up of each record.
pub(super) const TOGETHER_AT_LEAST: usize = 8;

impl BrokerState {
    /// Hand `readers` (consumer `index` of each session, all of `channel`,
    /// an append channel) what the channel's recent reads hold from their
    /// places on: together when enough can be, then each as far as its
    /// own state lets it ([`BrokerState::serve_recent`]).
    pub(super) fn serve_recent_all(
        &mut self,
        channel: u16,
        readers: &[(SessionKey, usize)],
        now: Instant,
    ) {
        self.pass_if_together(channel, readers, now);
        for &(key, index) in readers {
            self.serve_recent(key, index, now);
        }
    }

    /// The consumers a turn pumped (`due`) of the sessions that came back
    /// in it (`back`; both sorted), those of each append channel handed
    /// what its recent reads hold together when enough can be: devices
    /// back after a crash at places the recent reads hold, each passing
    /// the same records alone. What is left to each, and its read, is its
    /// pump's. Consumers pumped for room an acknowledgement made are not
    /// among them: each is near its last place and takes a window's worth
    /// there, where a pass would look at every record the reads hold.
    pub(super) fn catch_up_back(
        &mut self,
        due: &[(SessionKey, u16)],
        back: &[SessionKey],
        now: Instant,
    ) {
        let mut by_channel: BTreeMap<u16, Vec<(SessionKey, usize)>> = BTreeMap::new();
        for &(key, channel) in due {
            if back.binary_search(&key).is_err()
                || self.channels.all[channel as usize].kind != ChannelKind::Append
            {
                continue;
            }
            if let Some(index) = self.sessions.consumer_index(key, channel) {
                by_channel.entry(channel).or_default().push((key, index));
            }
        }
        for (channel, readers) in by_channel {
            self.pass_if_together(channel, &readers, now);
        }
    }

    /// Those of `readers` (consumer `index` of each session, all of
    /// `channel`) that can be passed the records together, in one pass
    /// when there are enough of them.
    fn pass_if_together(&mut self, channel: u16, readers: &[(SessionKey, usize)], now: Instant) {
        if readers.len() < TOGETHER_AT_LEAST {
            return;
        }
        let state = &self.channels.all[channel as usize];
        let members: IdMap<SessionKey, usize> = readers
            .iter()
            .copied()
            .filter(|&(key, index)| {
                // One following the tail has nothing to pass.
                state.followers.is_indexed(key)
                    && !state.followers.is_following(key)
                    && self
                        .sessions
                        .by_key
                        .get(&key)
                        .and_then(|s| s.consumers.get(index))
                        .is_some_and(|c| {
                            c.channel == channel
                                && c.gap.is_none()
                                && c.seek.is_none()
                                && !c.reading
                        })
            })
            .collect();
        if members.len() >= TOGETHER_AT_LEAST {
            self.pass_together(channel, members, now);
        }
    }

    /// One pass over the recent reads of `channel` for `members`, from the
    /// lowest place among them to where the reads it can run through end.
    fn pass_together(&mut self, channel: u16, mut members: IdMap<SessionKey, usize>, now: Instant) {
        let next_of = |s: &Self, key: &SessionKey, index: usize| -> u64 {
            s.sessions.by_key[key].consumers[index].next
        };
        #[cfg(test)]
        {
            self.channels.passes_together += 1;
        }
        for &key in members.keys() {
            self.place_moved(key);
        }
        loop {
            let Some(from) = members
                .iter()
                .map(|(key, &index)| next_of(self, key, index))
                .min()
            else {
                return;
            };
            let state = &mut self.channels.all[channel as usize];
            let mut run = match state.recent.take_run(from) {
                Ok(run) => run,
                Err(Lookup::Empty { end }) => {
                    self.pass_to(&members, end);
                    continue;
                }
                Err(Lookup::Unknown) => return,
            };
            for at in run.from..run.entries.len() {
                let offset = run.entries[at].record.offset();
                let found = self.channels.all[channel as usize]
                    .followers
                    .matching(run.entries[at].record.topic());
                for matched in found.chunk_by(|a, b| a.session == b.session) {
                    let key = matched[0].session;
                    let Some(&index) = members.get(&key) else {
                        continue;
                    };
                    if next_of(self, &key, index) > offset {
                        continue;
                    }
                    if run.entries[at].message.is_none() {
                        let message = self.consumer_message(&run.entries[at].record, None, now);
                        run.entries[at].message = Some(std::sync::Arc::new(message));
                    }
                    // Everything before the record matched none of its
                    // filters.
                    self.sessions.consumer_at(key, index).next = offset;
                    let entry = &run.entries[at];
                    if !self.offer(
                        key,
                        index,
                        &entry.record,
                        entry.message.as_ref(),
                        Some(matched),
                        now,
                    ) {
                        // No room: it waits at the record.
                        members.remove(&key);
                    }
                }
            }
            let end = run.end;
            self.channels.all[channel as usize].recent.put_back(run);
            self.pass_to(&members, end);
        }
    }

    /// Every one of `members` passed the records below `end`.
    fn pass_to(&mut self, members: &IdMap<SessionKey, usize>, end: u64) {
        for (&key, &index) in members {
            let consumer = self.sessions.consumer_at(key, index);
            consumer.next = consumer.next.max(end);
        }
    }
}
