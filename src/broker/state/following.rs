//! Consumers of an append or a latest channel that follow its tail (a
//! latest channel's consumer follows its changes): a record committed
//! is offered to the connected consumers whose filters match it, found in
//! the channel's index of them, and the rest are not looked at. 50,000
//! devices each consuming their own commands (`cmd/<id>/#`) cost a record
//! one walk of the index, not 50,000 looks; offline, they cost the index
//! nothing (a consumer's filters are in it while its session is connected).
//!
//! A consumer passed over keeps its `next` where it was. It is moved on
//! when it is next looked at, to the channel's next offset ("settled"),
//! which is right for a consumer in the channel's `following` set. The
//! set's rule: **every record of the channel from the consumer's `next`
//! to the channel's next offset was committed while it was in the set,
//! and matched none of its filters.** What keeps it so:
//! - a consumer joins only caught up (`next` at the channel's next
//!   offset, no read out - a latest channel's current values being read
//!   count as one - no seek, no gap to announce), connected and so
//!   indexed;
//! - every record committed goes through [`BrokerState::channel_committed`],
//!   which looks its matching consumers up in the index: one that is a
//!   member is settled to the record's offset before it is offered the
//!   record, and leaves the set unless the offer moved it past it (it had
//!   no room);
//! - whatever else moves a member's `next` back, adds to its filters or
//!   takes them out of the index settles it and takes it out first: a new
//!   subscription or a seek, values owed that were not sent, its session
//!   detached or ended; records that reach a channel without a commit (a
//!   dead letter's move) take every member out.
//!
//! Settling is a look-up; a member is settled where its `next` is read:
//! before it catches up, before its position is written, in the lag gauge.

use super::consumer::ConsumerFilter;
use super::ids::IdSet;
use super::BrokerState;
use crate::broker::subscriptions::{Match, SessionKey, SubscriptionIndex};
use saguin_format::model::ChannelKind;

/// A channel's connected consumers by their filters, and those following
/// its tail. A detached consumer is sent nothing: its filters leave the
/// index as it goes (and it stops following, settled), so 50,000 offline
/// devices cost the index nothing.
#[derive(Debug, Default)]
pub(super) struct Followers {
    /// The filters of every consumer in `indexed`.
    filters: SubscriptionIndex,
    /// Consumers whose filters are in the index: every connected one.
    indexed: IdSet<SessionKey>,
    /// Consumers whose `next` is the channel's next offset as far as any
    /// record matching their filters goes (the module's rule); all indexed.
    following: IdSet<SessionKey>,
    /// The indexed consumers not following: those the tick lets catch up
    /// (a failed read wakes nothing else). Thousands of devices following
    /// their commands are not looked at by it.
    behind: IdSet<SessionKey>,
}

impl Followers {
    /// `key`'s filters are now `new`, in place of `old`: those that changed
    /// leave the index or come in, with what they ask (a consumer holding
    /// a thousand filters adds one at a time). One not indexed comes in
    /// whole when `connected`. Both lists are in filter order, as
    /// `BrokerState::filters_on` makes them: walked side by side, a
    /// holder's SUBSCRIBE costs one look at each of its filters.
    pub fn refiled(
        &mut self,
        key: SessionKey,
        old: &[ConsumerFilter],
        new: &[ConsumerFilter],
        connected: bool,
    ) {
        if !self.indexed.contains(&key) {
            if connected {
                self.index(key, new);
            }
            return;
        }
        debug_assert!(
            old.is_sorted_by(|a, b| a.filter < b.filter)
                && new.is_sorted_by(|a, b| a.filter < b.filter),
            "a consumer's filters out of order"
        );
        let (mut before, mut after) = (old.iter().peekable(), new.iter().peekable());
        loop {
            match (before.peek(), after.peek()) {
                (None, None) => break,
                (Some(was), Some(now)) if was.filter == now.filter => {
                    if was.options() != now.options() {
                        self.filters.insert(None, &now.filter, key, now.options());
                    }
                    before.next();
                    after.next();
                }
                (Some(was), Some(now)) if was.filter > now.filter => {
                    self.filters.insert(None, &now.filter, key, now.options());
                    after.next();
                }
                (None, Some(now)) => {
                    self.filters.insert(None, &now.filter, key, now.options());
                    after.next();
                }
                (Some(was), _) => {
                    self.filters.remove(None, &was.filter, key);
                    before.next();
                }
            }
        }
        if new.is_empty() {
            self.indexed.remove(&key);
            self.following.remove(&key);
            self.behind.remove(&key);
        }
    }

    /// `key` is connected: its `filters` come into the index.
    pub fn index(&mut self, key: SessionKey, filters: &[ConsumerFilter]) {
        if filters.is_empty() || !self.indexed.insert(key) {
            return;
        }
        self.behind.insert(key);
        for f in filters {
            self.filters.insert(None, &f.filter, key, f.options());
        }
    }

    /// `key` is detached or gone: its `filters` leave the index, and it
    /// stops following, its `next` left where it is (settle it first).
    fn unindex(&mut self, key: SessionKey, filters: &[ConsumerFilter]) {
        self.following.remove(&key);
        self.behind.remove(&key);
        if !self.indexed.remove(&key) {
            return;
        }
        for f in filters {
            self.filters.remove(None, &f.filter, key);
        }
    }

    /// The filters matching `topic`, each consumer's together, in key order.
    pub fn matching(&mut self, topic: &str) -> Vec<Match> {
        let mut found = Vec::new();
        self.filters.matches(topic, &|_| true, &mut found);
        found.sort_by_key(|m| m.session);
        found
    }

    pub fn is_following(&self, key: SessionKey) -> bool {
        self.following.contains(&key)
    }

    /// `key`, indexed, follows the tail from here.
    fn join(&mut self, key: SessionKey) {
        debug_assert!(
            self.indexed.contains(&key),
            "a consumer not indexed follows"
        );
        self.following.insert(key);
        self.behind.remove(&key);
    }

    /// `key` no longer follows the tail, its `next` left where it is.
    pub fn unfollow(&mut self, key: SessionKey) {
        if self.following.remove(&key) {
            self.behind.insert(key);
        }
    }

    /// Every member stops following: those that were, in key order.
    fn leave_all(&mut self) -> Vec<SessionKey> {
        let mut members: Vec<SessionKey> =
            std::mem::take(&mut self.following).into_iter().collect();
        members.sort_unstable();
        self.behind.extend(members.iter().copied());
        members
    }

    /// The connected consumers not following the tail.
    pub fn behind(&self) -> impl Iterator<Item = SessionKey> + '_ {
        self.behind.iter().copied()
    }

    /// Filters indexed, for tests.
    #[cfg(test)]
    pub fn filter_count(&self) -> usize {
        self.filters.len()
    }

    /// Consumers following the tail, for tests.
    #[cfg(test)]
    pub fn following_count(&self) -> usize {
        self.following.len()
    }

    /// Is `key` indexed? For a debug build's check.
    pub fn is_indexed(&self, key: SessionKey) -> bool {
        self.indexed.contains(&key)
    }
}

impl BrokerState {
    /// Consumer `index` of `key` caught up with its channel: it follows the
    /// tail from here, when it is connected and owes nothing a read must find.
    pub(super) fn follow(&mut self, key: SessionKey, index: usize) {
        let Some(session) = self.sessions.by_key.get(&key) else {
            return;
        };
        let Some(consumer) = session.consumers.get(index) else {
            return;
        };
        let state = &mut self.channels.all[consumer.channel as usize];
        if session.connection().is_some()
            && state.kind != ChannelKind::Queue
            && consumer.next >= state.next
            && !consumer.reading
            && consumer.seek.is_none()
            && consumer.gap.is_none()
        {
            state.followers.join(key);
        }
    }

    /// A member's `next` moved to `through` (at most the channel's next
    /// offset): every record below it matched none of its filters.
    pub(super) fn settle_to(&mut self, key: SessionKey, channel: u16, through: u64) {
        if !self.channels.all[channel as usize]
            .followers
            .is_following(key)
        {
            return;
        }
        self.move_up(key, channel, through);
    }

    /// `key`'s consumer of `channel` looks next at `through`, unless it is
    /// past it.
    fn move_up(&mut self, key: SessionKey, channel: u16, through: u64) {
        self.place_moved(key);
        if let Some(consumer) = self.sessions.consumer_mut(key, channel) {
            consumer.next = consumer.next.max(through);
        }
    }

    /// Every consumer of `key` that follows its channel's tail, settled.
    pub(super) fn settle(&mut self, key: SessionKey) {
        self.place_moved(key);
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        for consumer in session.consumers.allocated_mut().into_iter().flatten() {
            let state = &self.channels.all[consumer.channel as usize];
            if state.followers.is_following(key) {
                consumer.next = consumer.next.max(state.next);
            }
        }
    }

    /// `key` stops following `channel`'s tail, settled first: what comes
    /// next moves its `next` some other way.
    pub(super) fn leave_following(&mut self, key: SessionKey, channel: u16) {
        let through = self.channels.all[channel as usize].next;
        self.settle_to(key, channel, through);
        self.channels.all[channel as usize].followers.unfollow(key);
    }

    /// Session `key` is connected: its consumers' filters come into their
    /// channels' indexes.
    pub(super) fn index_consumers(&mut self, key: SessionKey) {
        let Some(session) = self.sessions.by_key.get(&key) else {
            return;
        };
        for consumer in session.consumers.iter() {
            self.channels.all[consumer.channel as usize]
                .followers
                .index(key, &consumer.filters);
        }
    }

    /// Session `key` is detached or ends: its consumers leave the tails they
    /// follow, settled (a detached one's place is written as it goes, a
    /// bridge's kept at its end), and their filters leave the indexes.
    pub(super) fn unindex_consumers(&mut self, key: SessionKey) {
        self.settle(key);
        let Some(session) = self.sessions.by_key.get(&key) else {
            return;
        };
        for consumer in session.consumers.iter() {
            self.channels.all[consumer.channel as usize]
                .followers
                .unindex(key, &consumer.filters);
        }
    }

    /// Records reached `channel` other than by a commit: no member may be
    /// moved past them, so every one is settled where it stands and leaves.
    pub(super) fn leave_following_all(&mut self, channel: u16) {
        let members = self.channels.all[channel as usize].followers.leave_all();
        let through = self.channels.all[channel as usize].next;
        for key in members {
            self.move_up(key, channel, through);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(name: &str, qos: u8) -> ConsumerFilter {
        ConsumerFilter {
            filter: name.to_owned(),
            whole_channel: false,
            qos,
            no_local: false,
            retain_as_published: false,
            subscription_id: None,
        }
    }

    /// What the index asks of `key` for each topic of `topics`.
    fn asked(followers: &mut Followers, key: SessionKey, topics: &[&str]) -> Vec<Option<u8>> {
        topics
            .iter()
            .map(|t| {
                let found = followers.matching(t);
                found
                    .iter()
                    .find(|m| m.session == key)
                    .map(|m| m.options.qos)
            })
            .collect()
    }

    /// Refiling walks the old and the new filters side by side: whatever
    /// they share, interleave or leave, the index ends holding exactly the
    /// new ones, with what they ask, and another consumer's are untouched.
    #[test]
    fn refiling_leaves_the_index_holding_exactly_the_new_filters() {
        let topics = ["c/a", "c/b", "c/c", "c/d", "c/e"];
        // Each case's old and new filters, with the QoS each asks.
        type Filters<'a> = &'a [(&'a str, u8)];
        let cases: &[(Filters, Filters)] = &[
            (&[], &[("c/b", 1)]),
            (&[("c/b", 1)], &[]),
            (&[("c/a", 1), ("c/c", 1)], &[("c/b", 1), ("c/d", 0)]),
            (
                &[("c/a", 1), ("c/b", 0), ("c/e", 1)],
                &[("c/b", 1), ("c/c", 1)],
            ),
            (
                &[("c/b", 1), ("c/d", 1)],
                &[("c/a", 0), ("c/b", 1), ("c/d", 0), ("c/e", 1)],
            ),
            (&[("c/a", 1), ("c/b", 1), ("c/c", 1)], &[("c/c", 1)]),
        ];
        for (old, new) in cases {
            let old: Vec<ConsumerFilter> = old.iter().map(|(f, q)| filter(f, *q)).collect();
            let new: Vec<ConsumerFilter> = new.iter().map(|(f, q)| filter(f, *q)).collect();
            let mut followers = Followers::default();
            let other = [filter("c/c", 2)];
            followers.refiled(9, &[], &other, true);
            followers.refiled(1, &[], &old, true);
            followers.refiled(1, &old, &new, true);
            let expected: Vec<Option<u8>> = topics
                .iter()
                .map(|t| new.iter().find(|f| f.filter == *t).map(|f| f.qos))
                .collect();
            assert_eq!(
                asked(&mut followers, 1, &topics),
                expected,
                "{old:?} -> {new:?}"
            );
            assert_eq!(
                asked(&mut followers, 9, &topics),
                vec![None, None, Some(2), None, None],
                "the other consumer"
            );
            assert_eq!(followers.filter_count(), new.len() + 1);
            assert_eq!(followers.is_indexed(1), !new.is_empty());
        }
    }
}
