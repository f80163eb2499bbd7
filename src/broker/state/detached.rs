//! Sessions without a connection, each with the next moment it needs
//! looking at: its Will's delay or its expiry. A tick takes the ones due
//! by their moment; looking at every detached session twice a second cost
//! an idle broker 5 ms of its one thread a tick at 100,000 sessions, and
//! ten times that at a million.

use std::collections::BTreeSet;

use tokio::time::Instant;

use super::ids::IdSet;
use crate::broker::subscriptions::SessionKey;

/// A session's moment is not kept beside its key: it is the session's own
/// ([`Session::next_due`](super::session::Session::next_due)), which its
/// owner hands in. A moment that changed without being handed in (a Will
/// taken early) leaves its entry behind, taken in its turn and found not
/// due; never a session due and not taken.
#[derive(Debug, Default)]
pub(super) struct Detached {
    keys: IdSet<SessionKey>,
    /// The moments, earliest first.
    due: BTreeSet<(Instant, SessionKey)>,
}

impl Detached {
    /// Session `key` is detached and due at `at`.
    pub(super) fn insert(&mut self, key: SessionKey, at: Option<Instant>) {
        self.keys.insert(key);
        if let Some(at) = at {
            self.due.insert((at, key));
        }
    }

    /// Detached sessions and their moments, many at once (a restart's):
    /// the moments are built into full nodes, where one at a time leaves
    /// a B-tree's nodes about half full.
    pub(super) fn insert_many(&mut self, sessions: Vec<(Instant, SessionKey)>) {
        self.keys.extend(sessions.iter().map(|&(_, key)| key));
        let mut built = BTreeSet::from_iter(sessions);
        self.due.append(&mut built);
    }

    /// Session `key`, due at `at`, has a connection again or ended. Was
    /// it detached?
    pub(super) fn remove(&mut self, key: SessionKey, at: Option<Instant>) -> bool {
        if let Some(at) = at {
            self.due.remove(&(at, key));
        }
        self.keys.remove(&key)
    }

    pub(super) fn contains(&self, key: SessionKey) -> bool {
        self.keys.contains(&key)
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = SessionKey> + '_ {
        self.keys.iter().copied()
    }

    pub(super) fn reserve(&mut self, more: usize) {
        self.keys.reserve(more);
    }

    /// The sessions due by `now`, in key order, each once. They stay
    /// detached, due again only when handed in again
    /// ([`Detached::insert`]): whoever takes them looks at each and says
    /// when it is next due.
    pub(super) fn take_due(&mut self, now: Instant) -> Vec<SessionKey> {
        let mut keys = Vec::new();
        while let Some(&(at, key)) = self.due.first() {
            if at > now {
                break;
            }
            self.due.pop_first();
            if self.keys.contains(&key) {
                keys.push(key);
            }
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_the_sessions_due_are_taken() {
        let start = Instant::now();
        let at = |secs| Some(start + Duration::from_secs(secs));
        let mut detached = Detached::default();
        detached.insert(1, at(30));
        detached.insert(2, at(10));
        detached.insert(3, None);
        detached.insert(4, at(20));
        detached.insert(5, at(10));

        assert!(detached.take_due(start + Duration::from_secs(9)).is_empty());
        assert_eq!(
            detached.take_due(start + Duration::from_secs(20)),
            vec![2, 4, 5]
        );
        // Taken, they are still detached, and due again only when told.
        assert!(detached.contains(2) && detached.contains(4) && detached.contains(3));
        assert!(detached
            .take_due(start + Duration::from_secs(25))
            .is_empty());
        detached.insert(2, at(40));
        assert_eq!(
            detached.take_due(start + Duration::from_secs(100)),
            vec![1, 2]
        );
        assert!(detached
            .take_due(start + Duration::from_secs(1000))
            .is_empty());
    }

    #[test]
    fn a_session_removed_or_moved_is_due_at_its_moment_or_not_at_all() {
        let start = Instant::now();
        let at = |secs| Some(start + Duration::from_secs(secs));
        let mut detached = Detached::default();
        detached.insert_many(vec![
            (start + Duration::from_secs(10), 1),
            (start + Duration::from_secs(10), 2),
        ]);
        detached.insert(3, at(5));
        assert!(detached.remove(2, at(10)));
        assert!(!detached.remove(2, at(10)));
        // A moment moved later without the earlier one handed back: the
        // earlier entry is taken once, then the later one.
        detached.insert(1, at(50));
        assert_eq!(
            detached.take_due(start + Duration::from_secs(10)),
            vec![1, 3]
        );
        assert_eq!(detached.take_due(start + Duration::from_secs(50)), vec![1]);
        // Removed after being taken: nothing is left of it.
        assert!(detached.remove(1, None));
        assert!(detached.remove(3, None));
        assert!(detached.keys.is_empty() && detached.due.is_empty());
        // A session that had a connection again is not taken at its old
        // moment, even were its entry left behind.
        detached.insert(4, at(60));
        assert!(detached.remove(4, None));
        assert!(detached
            .take_due(start + Duration::from_secs(60))
            .is_empty());
    }
}
