//! The order a sqlite persister serves its queue in: group commit of
//! publishes, with session writes taking turns beside them.
//!
//! - A group holds publishes or session writes, never both, and the two
//!   kinds take turns.
//! - Session writes a client waits on ([`Class::Answering`]) go first; the
//!   writes nobody waits on get every fifth session turn, and among those
//!   a departed client's ([`Class::Departed`]) get four turns to each one of
//!   a connected session's ([`Class::Connected`]).
//! - A session group is at most [`SESSION_GROUP`] packets' writes; it gives
//!   way when a publish arrives or [`GIVE_WAY_AFTER`] has passed, and what
//!   it had not run goes back to the front of its queue: it keeps its place.
//! - One client's writes land in the order they were made: an answering
//!   write moves the queued background writes of its client up among the
//!   answering writes, ahead of itself.
//!
//! Pure bookkeeping: no clock, no store. The runner asks it for the next
//! group and gives back what a group did not run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use crate::broker::state::{Class, Intent};

/// Most packets' session writes in one transaction.
pub const SESSION_GROUP: usize = 8;
/// A session transaction commits what it has after this long.
pub const GIVE_WAY_AFTER: Duration = Duration::from_millis(5);
/// Most publish intents in one group commit.
pub const PUBLISH_GROUP: usize = 256;

/// The queues and whose turn it is.
#[derive(Default)]
pub struct Turns {
    publish: VecDeque<Intent>,
    answering: VecDeque<Intent>,
    departed: VecDeque<Intent>,
    connected: VecDeque<Intent>,
    /// Background intents queued per client id, so an answering write
    /// looks for its client's only when there are some.
    background_of: HashMap<String, usize>,
    /// The next turn goes to publishes (when any wait).
    publish_turn: bool,
    session_turns: u64,
    background_turns: u64,
}

impl Turns {
    pub fn is_empty(&self) -> bool {
        self.publish.is_empty() && !self.sessions_waiting()
    }

    pub fn publish_waiting(&self) -> bool {
        !self.publish.is_empty()
    }

    fn sessions_waiting(&self) -> bool {
        !(self.answering.is_empty() && self.departed.is_empty() && self.connected.is_empty())
    }

    /// Queue `intent` behind those of its class.
    pub fn push(&mut self, intent: Intent) {
        match intent.class {
            Class::Publish => self.publish.push_back(intent),
            Class::Answering => {
                self.move_up_clients_of(&intent);
                self.answering.push_back(intent);
            }
            Class::Departed | Class::Connected => {
                for client in clients(&intent) {
                    *self.background_of.entry(client.to_owned()).or_default() += 1;
                }
                match intent.class {
                    Class::Departed => self.departed.push_back(intent),
                    _ => self.connected.push_back(intent),
                }
            }
        }
    }

    /// An answering write's client may have background writes queued:
    /// they were made first, so they are served first, among the answering.
    fn move_up_clients_of(&mut self, intent: &Intent) {
        let wanted: Vec<&str> = clients(intent)
            .filter(|c| self.background_of.get(*c).is_some_and(|n| *n > 0))
            .collect();
        if wanted.is_empty() {
            return;
        }
        let mut moved: Vec<(u64, Intent)> = Vec::new();
        for queue in [&mut self.departed, &mut self.connected] {
            let mut kept = VecDeque::with_capacity(queue.len());
            for i in queue.drain(..) {
                if clients(&i).any(|c| wanted.contains(&c)) {
                    moved.push((i.ticket, i));
                } else {
                    kept.push_back(i);
                }
            }
            *queue = kept;
        }
        // Tickets are issued in the order writes were made.
        moved.sort_by_key(|(ticket, _)| *ticket);
        for (_, i) in moved {
            self.forget_background(&i);
            self.answering.push_back(i);
        }
    }

    fn forget_background(&mut self, intent: &Intent) {
        if !matches!(intent.class, Class::Departed | Class::Connected) {
            return;
        }
        for client in clients(intent) {
            if let Some(n) = self.background_of.get_mut(client) {
                *n -= 1;
                if *n == 0 {
                    self.background_of.remove(client);
                }
            }
        }
    }

    /// The next group to run, or `None` when nothing waits.
    pub fn next(&mut self) -> Option<Vec<Intent>> {
        let sessions = self.sessions_waiting();
        if !self.publish.is_empty() && (self.publish_turn || !sessions) {
            self.publish_turn = false;
            let take = self.publish.len().min(PUBLISH_GROUP);
            return Some(self.publish.drain(..take).collect());
        }
        if !sessions {
            return None;
        }
        self.publish_turn = true;
        self.session_turns += 1;
        let background = !self.departed.is_empty() || !self.connected.is_empty();
        let background_turn = self.session_turns % 5 == 0 || self.answering.is_empty();
        let queue = if background && background_turn {
            self.background_turns += 1;
            let connected_turn = self.background_turns % 5 == 0 || self.departed.is_empty();
            if connected_turn && !self.connected.is_empty() {
                &mut self.connected
            } else {
                &mut self.departed
            }
        } else {
            &mut self.answering
        };
        let take = queue.len().min(SESSION_GROUP);
        let group: Vec<Intent> = queue.drain(..take).collect();
        for i in &group {
            self.forget_background(i);
        }
        Some(group)
    }

    /// What a group that gave way did not run: back to the front of its
    /// queue, in its order.
    pub fn give_back(&mut self, rest: Vec<Intent>) {
        for intent in rest.into_iter().rev() {
            match intent.class {
                Class::Publish => self.publish.push_front(intent),
                Class::Answering => self.answering.push_front(intent),
                Class::Departed | Class::Connected => {
                    for client in clients(&intent) {
                        *self.background_of.entry(client.to_owned()).or_default() += 1;
                    }
                    match intent.class {
                        Class::Departed => self.departed.push_front(intent),
                        _ => self.connected.push_front(intent),
                    }
                }
            }
        }
    }
}

/// The client ids an intent's writes are for (deduplicated in order). An
/// intent may hold writes for thousands of clients: a set, where a search
/// of those already seen made it quadratic (with 5,000 connected consumers
/// it took most of the writer thread).
fn clients(intent: &Intent) -> impl Iterator<Item = &str> {
    let mut seen: HashSet<&str> = HashSet::new();
    intent
        .writes
        .iter()
        .filter_map(|w| w.client())
        .filter(move |c| seen.insert(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::state::{Role, Write};

    fn intent(ticket: u64, class: Class, client: &str) -> Intent {
        let writes = match class {
            Class::Publish => vec![Write::AppendLog(saguin_format::model::Record::new(
                "t",
                bytes::Bytes::new(),
            ))],
            _ => vec![Write::RemoveSession(client.to_owned())],
        };
        Intent {
            ticket,
            role: Role::Sessions,
            class,
            writes,
        }
    }

    fn tickets(group: &[Intent]) -> Vec<u64> {
        group.iter().map(|i| i.ticket).collect()
    }

    #[test]
    fn an_intents_clients_are_each_named_once_in_the_order_written() {
        let remove = |c: &str| Write::RemoveSession(c.to_owned());
        let intent = Intent {
            ticket: 1,
            role: Role::Sessions,
            class: Class::Departed,
            writes: vec![
                remove("b"),
                remove("a"),
                remove("b"),
                remove("c"),
                remove("a"),
            ],
        };
        assert_eq!(clients(&intent).collect::<Vec<_>>(), ["b", "a", "c"]);
    }

    #[test]
    fn publishes_and_session_writes_take_turns() {
        let mut t = Turns::default();
        for n in 0..20 {
            t.push(intent(n, Class::Answering, &format!("c{n}")));
        }
        t.push(intent(100, Class::Publish, ""));
        let first = t.next().unwrap();
        assert_eq!(
            first.len(),
            SESSION_GROUP,
            "a session group first (publish turn not yet due)"
        );
        assert_eq!(tickets(&t.next().unwrap()), vec![100], "then the publish");
        assert!(t
            .next()
            .unwrap()
            .iter()
            .all(|i| i.class == Class::Answering));
    }

    #[test]
    fn background_writes_get_every_fifth_session_turn_departed_four_to_one() {
        let mut t = Turns::default();
        for n in 0..200 {
            t.push(intent(n, Class::Answering, &format!("a{n}")));
        }
        for n in 0..200 {
            t.push(intent(1000 + n, Class::Departed, &format!("d{n}")));
            t.push(intent(2000 + n, Class::Connected, &format!("k{n}")));
        }
        let mut classes = Vec::new();
        for _ in 0..25 {
            classes.push(t.next().unwrap()[0].class);
        }
        let answering = classes.iter().filter(|c| **c == Class::Answering).count();
        let departed = classes.iter().filter(|c| **c == Class::Departed).count();
        let connected = classes.iter().filter(|c| **c == Class::Connected).count();
        assert_eq!((answering, departed + connected), (20, 5), "{classes:?}");
        assert_eq!((departed, connected), (4, 1), "{classes:?}");
    }

    #[test]
    fn an_answering_write_moves_its_clients_queued_writes_up_ahead_of_itself() {
        let mut t = Turns::default();
        for n in 0..30 {
            t.push(intent(n, Class::Departed, &format!("d{n}")));
        }
        t.push(intent(40, Class::Departed, "x"));
        t.push(intent(41, Class::Connected, "x"));
        t.push(intent(50, Class::Answering, "x"));
        let group = t.next().unwrap();
        assert_eq!(
            tickets(&group),
            vec![40, 41, 50],
            "x's writes in the order made, first"
        );
    }

    #[test]
    fn a_group_that_gave_way_keeps_its_place() {
        let mut t = Turns::default();
        for n in 0..12 {
            t.push(intent(n, Class::Answering, &format!("c{n}")));
        }
        let mut group = t.next().unwrap();
        let rest = group.split_off(3);
        t.give_back(rest);
        t.push(intent(100, Class::Answering, "late"));
        let next = t.next().unwrap();
        assert_eq!(tickets(&next), vec![3, 4, 5, 6, 7, 8, 9, 10]);
    }

    #[test]
    fn with_nothing_else_waiting_any_kind_runs() {
        let mut t = Turns::default();
        t.push(intent(1, Class::Connected, "k"));
        assert_eq!(tickets(&t.next().unwrap()), vec![1]);
        t.push(intent(2, Class::Publish, ""));
        t.push(intent(3, Class::Publish, ""));
        assert_eq!(tickets(&t.next().unwrap()), vec![2, 3]);
        assert!(t.next().is_none() && t.is_empty());
    }
}
