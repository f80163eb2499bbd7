//! The retained messages as the state routes from them: a trie by topic
//! level. It is the in-memory side of the retained store the configured
//! provider keeps (`broker.retained_storage`): loaded from it at startup,
//! changed only after the provider committed the change, so a SUBSCRIBE
//! matches without a read from storage and never holds the event loop.
//!
//! A retained message is held in one allocation of exactly its QoS, the
//! last level of its topic and its payload, or, on a memory provider, as
//! the retained store's own handle on it, so it is held once (`leaf`). Its
//! topic's other levels are the trie's path to it, and a `Message` is made
//! from it only when it is sent. A message with MQTT 5 properties (rare
//! among retained values) is kept whole beside the trie instead.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use crate::broker::message::{Message, MessageProperties};
use crate::storage::kept::Kept;

mod leaf;

pub use leaf::Leaf;

/// A level of the trie: the messages whose topic ends one level below it,
/// each found by its last level, and the levels that lead further down.
///
/// A message is held once, by the set of the level above its last: no
/// node and no copy of its last level is made for it. Most topics are
/// distinct in their last level (`site/device-17/temperature`), so the
/// levels a million retained messages share are few and the messages
/// themselves cost one pointer each in a B-tree.
#[derive(Debug, Default)]
struct Node {
    values: BTreeSet<Leaf>,
    children: BTreeMap<Box<str>, Node>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.values.is_empty() && self.children.is_empty()
    }

    /// The levels one below this one, in byte order of their names: each
    /// with its message (a topic ending there) and its level (topics going
    /// further), either of which may be absent.
    fn below(&self) -> impl Iterator<Item = Below<'_>> {
        let mut values = self.values.iter().peekable();
        let mut children = self.children.iter().peekable();
        std::iter::from_fn(move || {
            let order = match (values.peek(), children.peek()) {
                (None, None) => return None,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(value), Some((name, _))) => value.name().cmp(&***name),
            };
            match order {
                Ordering::Less => values.next().map(Below::value),
                Ordering::Greater => children.next().map(|(name, node)| Below::level(name, node)),
                Ordering::Equal => {
                    values
                        .next()
                        .zip(children.next())
                        .map(|(value, (name, node))| Below {
                            value: Some(value),
                            ..Below::level(name, node)
                        })
                }
            }
        })
    }

    /// The level named `name` one below this one, when anything is there.
    fn get<'a>(&'a self, name: &'a str) -> Option<Below<'a>> {
        let value = self.values.get(name);
        let node = self.children.get(name);
        (value.is_some() || node.is_some()).then_some(Below { name, value, node })
    }
}

/// One level below a node, as a filter walks it.
struct Below<'a> {
    name: &'a str,
    value: Option<&'a Leaf>,
    node: Option<&'a Node>,
}

impl<'a> Below<'a> {
    fn value(leaf: &'a Leaf) -> Below<'a> {
        Below {
            name: leaf.name(),
            value: Some(leaf),
            node: None,
        }
    }

    fn level(name: &'a str, node: &'a Node) -> Below<'a> {
        Below {
            name,
            value: None,
            node: Some(node),
        }
    }
}

/// The leaf of `message` as the index holds it, found by its last level
/// `name`: `None` when it has properties (or a last level too long to
/// count in the leaf's head), and is kept whole.
fn held(name: &str, message: &Message) -> Option<Leaf> {
    has_no_properties(message)
        .then(|| Leaf::plain(name, message.qos, &message.payload))
        .flatten()
}

/// A message the index may hold as its last level, QoS and payload.
fn has_no_properties(message: &Message) -> bool {
    !message.properties.is_allocated() || message.properties == MessageProperties::default()
}

/// A retained message a filter matched, owed to a subscriber until there
/// is room to send it: a held leaf with its topic's levels above it, or a
/// message kept whole (or not from the index at all: a latest channel's
/// value, a `$SYS` topic).
#[derive(Clone, Debug)]
pub enum Retained {
    Whole(Arc<Message>),
    Held {
        /// The topic's levels above the last, each followed by `/`; shared
        /// by every message a SUBSCRIBE found on the same level.
        above: Arc<str>,
        leaf: Leaf,
    },
}

impl Retained {
    pub fn qos(&self) -> u8 {
        match self {
            Retained::Whole(message) => message.qos,
            Retained::Held { leaf, .. } => leaf.qos(),
        }
    }

    pub fn topic(&self) -> Cow<'_, str> {
        match self {
            Retained::Whole(message) => Cow::Borrowed(&message.topic),
            Retained::Held { above, leaf } => Cow::Owned([&**above, leaf.name()].concat()),
        }
    }

    /// The message to send, made at `now`. A held message has no expiry
    /// (that is a property), so its receipt time counts for nothing.
    pub fn into_message(self, now: Instant) -> Arc<Message> {
        match self {
            Retained::Whole(message) => message,
            Retained::Held { above, leaf } => Arc::new(Message {
                topic: [&*above, leaf.name()].concat().into(),
                qos: leaf.qos(),
                payload: Bytes::from_owner(PayloadOf(leaf)),
                retain: true,
                properties: MessageProperties::default(),
                received_at: now,
                channel_offset: None,
                wire: Default::default(),
            }),
        }
    }
}

impl From<Arc<Message>> for Retained {
    fn from(message: Arc<Message>) -> Self {
        Retained::Whole(message)
    }
}

/// A leaf's payload as a `Bytes` owner: sent without a copy.
struct PayloadOf(Leaf);

impl AsRef<[u8]> for PayloadOf {
    fn as_ref(&self) -> &[u8] {
        self.0.payload()
    }
}

/// A topic's last level: what its level's set finds it by.
fn last_level(topic: &str) -> &str {
    topic.rsplit_once('/').map_or(topic, |(_, last)| last)
}

/// A topic's levels above its last: the path to the set holding it.
fn levels_above(topic: &str) -> impl Iterator<Item = &str> {
    topic
        .rsplit_once('/')
        .into_iter()
        .flat_map(|(above, _)| above.split('/'))
}

/// Retained messages in a trie by topic level.
#[derive(Debug, Default)]
pub struct RetainedIndex {
    root: Node,
    /// The messages kept whole (see [`held`]), by topic.
    whole: HashMap<Box<str>, Arc<Message>>,
    count: usize,
    /// Messages a restart handed over and [`Self::pack`] has not yet put
    /// in their levels' sets, by the levels above their last (the topic up
    /// to and with its last `/`): a set built whole from its messages is
    /// built without the search each insertion makes, which compares the
    /// new message with a dozen or more in each node on its way down.
    restored: HashMap<Box<str>, Vec<Leaf>>,
}

impl RetainedIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Is a retained message held for `topic`?
    pub fn contains(&self, topic: &str) -> bool {
        let mut node = &self.root;
        for level in levels_above(topic) {
            match node.children.get(level) {
                Some(child) => node = child,
                None => return false,
            }
        }
        node.values.contains(last_level(topic))
    }

    /// Keep `message` as the retained message of its topic (replacing any).
    pub fn set(&mut self, message: &Message) {
        let topic: &str = &message.topic;
        let name = last_level(topic);
        let leaf = held(name, message).unwrap_or_else(|| {
            // The clone leaves the deliveries' encoded forms behind.
            self.whole
                .insert(topic.into(), Arc::new(Message::clone(message)));
            Leaf::whole(name, message.qos)
        });
        self.insert(topic, leaf);
    }

    /// [`Self::set`] for a message the retained store keeps as `kept` (a
    /// memory store's handle on it, as its write answers with it): held
    /// as that handle, not copied, unless it has properties and is kept
    /// whole.
    pub fn set_kept(&mut self, message: &Message, kept: Kept) {
        if !has_no_properties(message) {
            return self.set(message);
        }
        // The message's topic is the one the store keeps it under: the
        // handle goes into the leaf as it is, with the count it holds.
        self.insert(&message.topic, Leaf::kept(kept));
    }

    /// [`Self::set`] for a message with no properties, from its parts, as
    /// a restart reads them: no message is made for it. Returns false,
    /// keeping nothing, where it cannot be kept so (a last level longer
    /// than 65,535 bytes, which only another writer's file can hold): the
    /// caller then sets the message. It is in its level's set, and
    /// counted, once [`Self::pack`] has run.
    pub fn restore_plain(&mut self, topic: &str, qos: u8, payload: &[u8]) -> bool {
        match Leaf::plain(last_level(topic), qos, payload) {
            Some(leaf) => {
                self.restored_at(topic, leaf);
                true
            }
            None => false,
        }
    }

    /// [`Self::set_kept`] as a restart hands a message over (see
    /// [`Self::restore_plain`]); only for a message without properties.
    pub fn restore_kept(&mut self, kept: &Kept) {
        self.restored_at(kept.topic(), Leaf::kept(kept.clone()));
    }

    fn restored_at(&mut self, topic: &str, leaf: Leaf) {
        let above = &topic[..topic.len() - last_level(topic).len()];
        match self.restored.get_mut(above) {
            Some(leaves) => leaves.push(leaf),
            None => {
                self.restored.insert(above.into(), vec![leaf]);
            }
        }
    }

    /// Put `leaf` at `topic`, in place of what was there.
    fn insert(&mut self, topic: &str, leaf: Leaf) {
        let whole = leaf.is_whole();
        let mut node = &mut self.root;
        for level in levels_above(topic) {
            // Looked up first: the entry API would allocate the level's
            // name for every set, a level that exists included.
            if !node.children.contains_key(level) {
                node.children.insert(level.into(), Node::default());
            }
            node = node
                .children
                .get_mut(level)
                .expect("the level was just found or made");
        }
        match node.values.replace(leaf) {
            None => self.count += 1,
            Some(replaced) if replaced.is_whole() && !whole => {
                self.whole.remove(topic);
            }
            Some(_) => {}
        }
    }

    /// Forget the retained message of `topic`. Returns true if there was one.
    pub fn remove(&mut self, topic: &str) -> bool {
        /// Removes `last` from the level `above` leads to, and every level
        /// left empty on the way back up.
        fn remove_in(node: &mut Node, above: &[&str], last: &str) -> Option<Leaf> {
            match above.split_first() {
                None => node.values.take(last),
                Some((first, rest)) => {
                    let child = node.children.get_mut(*first)?;
                    let removed = remove_in(child, rest, last);
                    if child.is_empty() {
                        node.children.remove(*first);
                    }
                    removed
                }
            }
        }
        let above: Vec<&str> = levels_above(topic).collect();
        let Some(removed) = remove_in(&mut self.root, &above, last_level(topic)) else {
            return false;
        };
        if removed.is_whole() {
            self.whole.remove(topic);
        }
        self.count -= 1;
        true
    }

    /// Hand every retained message whose topic matches `filter` (a valid,
    /// non-shared filter) to `each`, in topic byte order.
    pub fn matching(&self, filter: &str, each: &mut dyn FnMut(Retained)) {
        let levels: Vec<&str> = filter.split('/').collect();
        let mut walk = Walk {
            whole: &self.whole,
            each,
            above: String::new(),
            shared_above: None,
        };
        walk.under(&self.root, &levels, true);
    }

    /// Put what a restart handed over in its levels' sets, and rebuild
    /// every other set with full B-tree nodes: a set filled a message at a
    /// time splits each node as it overflows and leaves it about half
    /// full (docs/benchmarks.md measures the difference). A set built
    /// from a restart's messages is sorted once and built full.
    pub fn pack(&mut self) {
        fn pack_node(node: &mut Node) {
            node.values = std::mem::take(&mut node.values).into_iter().collect();
            node.children.values_mut().for_each(pack_node);
        }
        pack_node(&mut self.root);
        for (above, leaves) in std::mem::take(&mut self.restored) {
            let mut node = &mut self.root;
            // `above` ends with `/` (or is empty, for a topic of one
            // level): the levels before that last `/`.
            if let Some(levels) = above.strip_suffix('/') {
                for level in levels.split('/') {
                    node = node.children.entry(level.into()).or_default();
                }
            }
            if node.values.is_empty() {
                node.values = leaves.into_iter().collect();
                self.count += node.values.len();
                continue;
            }
            // A level a message kept whole was set on as well (rare): one
            // at a time, as any other change.
            for leaf in leaves {
                let topic = [&*above, leaf.name()].concat();
                self.insert(&topic, leaf);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// A filter's walk down the trie, with the path it has come by.
struct Walk<'a> {
    whole: &'a HashMap<Box<str>, Arc<Message>>,
    each: &'a mut dyn FnMut(Retained),
    /// The levels walked down to the node whose levels are being looked
    /// at, each followed by `/`: the start of every topic found there.
    above: String,
    /// `above`, shared by the messages found there; made for the first.
    shared_above: Option<Arc<str>>,
}

impl Walk<'_> {
    /// Match the filter's `levels` (at least one) against the levels below
    /// `node`; `first` when they are the filter's first.
    fn under(&mut self, node: &Node, levels: &[&str], first: bool) {
        let Some((level, rest)) = levels.split_first() else {
            return;
        };
        // A wildcard at the first level skips `$` topics.
        let wildcard_may_take = |below: &Below<'_>| !(first && below.name.starts_with('$'));
        match *level {
            "#" => {
                for below in node.below().filter(wildcard_may_take) {
                    self.all(below);
                }
            }
            "+" => {
                for below in node.below().filter(wildcard_may_take) {
                    self.at(below, rest);
                }
            }
            name => {
                if let Some(below) = node.get(name) {
                    self.at(below, rest);
                }
            }
        }
    }

    /// `below` matched a filter level; match the filter's `rest` at and
    /// under it.
    fn at(&mut self, below: Below<'_>, rest: &[&str]) {
        match rest.first() {
            None => self.found(below.value),
            Some(level) => {
                // `a/#` matches `a` itself and everything below.
                if *level == "#" {
                    self.found(below.value);
                }
                if let Some(node) = below.node {
                    self.down(below.name, |walk| walk.under(node, rest, false));
                }
            }
        }
    }

    /// Everything at and under `below`.
    fn all(&mut self, below: Below<'_>) {
        self.found(below.value);
        if let Some(node) = below.node {
            self.down(below.name, |walk| {
                for next in node.below() {
                    walk.all(next);
                }
            });
        }
    }

    /// Walk `into` with the level `name` added to the path.
    fn down(&mut self, name: &str, into: impl FnOnce(&mut Self)) {
        let len = self.above.len();
        let shared = self.shared_above.take();
        self.above.push_str(name);
        self.above.push('/');
        into(self);
        self.above.truncate(len);
        self.shared_above = shared;
    }

    fn found(&mut self, leaf: Option<&Leaf>) {
        let Some(leaf) = leaf else {
            return;
        };
        if leaf.is_whole() {
            let topic = [self.above.as_str(), leaf.name()].concat();
            if let Some(message) = self.whole.get(topic.as_str()) {
                (self.each)(Retained::Whole(message.clone()));
            }
            return;
        }
        let above = self
            .shared_above
            .get_or_insert_with(|| Arc::from(self.above.as_str()))
            .clone();
        (self.each)(Retained::Held {
            above,
            leaf: leaf.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(topic: &str) -> Message {
        Message {
            topic: topic.into(),
            payload: Bytes::from_static(b"x"),
            qos: 0,
            retain: true,
            properties: MessageProperties::default(),
            received_at: Instant::now(),
            channel_offset: None,
            wire: Default::default(),
        }
    }

    fn topics(store: &RetainedIndex, filter: &str) -> Vec<String> {
        found(store, filter)
            .iter()
            .map(|m| m.topic().into_owned())
            .collect()
    }

    #[test]
    fn set_match_remove() {
        let mut store = RetainedIndex::new();
        for t in ["a", "a/b", "a/b/c", "a/x", "$SYS/v", "b"] {
            store.set(&msg(t));
        }
        store.set(&msg("a/b"));
        assert_eq!(store.len(), 6);
        assert_eq!(topics(&store, "a/#"), vec!["a", "a/b", "a/b/c", "a/x"]);
        assert_eq!(topics(&store, "a/+"), vec!["a/b", "a/x"]);
        assert_eq!(topics(&store, "#"), vec!["a", "a/b", "a/b/c", "a/x", "b"]);
        assert_eq!(topics(&store, "+"), vec!["a", "b"]);
        assert_eq!(topics(&store, "$SYS/#"), vec!["$SYS/v"]);
        assert!(store.contains("a/b") && !store.contains("a/b/x") && !store.contains("c"));
        assert!(store.remove("a/b"));
        assert!(!store.remove("a/b"));
        assert_eq!(topics(&store, "a/#"), vec!["a", "a/b/c", "a/x"]);
        assert_eq!(store.len(), 5);
    }

    /// Removing the last message under a level removes the level, and
    /// removing a message leaves the messages below its topic.
    #[test]
    fn a_removal_keeps_what_is_below_and_drops_what_it_emptied() {
        let mut store = RetainedIndex::new();
        for t in ["a/b", "a/b/c", "a/b/c/d"] {
            store.set(&msg(t));
        }
        assert!(store.remove("a/b/c/d"));
        assert!(store.root.children["a"].children["b"].children.is_empty());
        assert!(store.remove("a/b"));
        assert_eq!(topics(&store, "#"), vec!["a/b/c"]);
        assert!(store.remove("a/b/c"));
        assert!(store.root.is_empty());
        assert!(store.is_empty());
        assert!(!store.remove("a/b/c") && !store.remove("z"));
    }

    /// Topics with empty levels and levels that sort around `/`.
    #[test]
    fn empty_levels_and_neighbouring_names_are_told_apart() {
        let mut store = RetainedIndex::new();
        for t in ["/", "/a", "a//b", "a/b", "a-c", "a", "a/"] {
            store.set(&msg(t));
        }
        assert_eq!(store.len(), 7);
        assert_eq!(
            topics(&store, "#"),
            vec!["/", "/a", "a", "a/", "a//b", "a/b", "a-c"]
        );
        assert_eq!(topics(&store, "+/+"), vec!["/", "/a", "a/", "a/b"]);
        assert_eq!(topics(&store, "a/+/b"), vec!["a//b"]);
        assert!(store.contains("a/") && store.contains("/") && !store.contains("a/c"));
    }

    fn with_expiry(topic: &str, seconds: u32) -> Message {
        let mut message = msg(topic);
        message.properties.message_expiry_interval = Some(seconds);
        message
    }

    fn found(store: &RetainedIndex, filter: &str) -> Vec<Retained> {
        let mut out = Vec::new();
        store.matching(filter, &mut |found| out.push(found));
        out
    }

    /// A message without properties is held as its last level and payload
    /// in one allocation of their size, and is made whole again when sent.
    #[test]
    fn a_held_message_is_one_allocation_made_whole_when_sent() {
        let mut store = RetainedIndex::new();
        let mut message = msg("site/7/device/1234567");
        message.qos = 2;
        message.payload = Bytes::from(vec![7; 64]);
        store.set(&message);
        let [held] = <[_; 1]>::try_from(found(&store, "site/+/device/#")).unwrap();
        let Retained::Held {
            ref above,
            ref leaf,
        } = held
        else {
            panic!("kept whole: {held:?}");
        };
        assert_eq!((&**above, leaf.name()), ("site/7/device/", "1234567"));
        assert_eq!(leaf.own_len(), 4 + 7 + 64, "a head of 4 bytes");
        assert_eq!((held.qos(), &*held.topic()), (2, "site/7/device/1234567"));
        let held_payload = leaf.payload().as_ptr();
        let sent = held.into_message(Instant::now());
        assert_eq!(&*sent.topic, "site/7/device/1234567");
        assert_eq!((sent.qos, sent.retain), (2, true));
        assert_eq!(sent.payload, message.payload);
        assert_eq!(
            sent.payload.as_ptr(),
            held_payload,
            "the payload is sent from the leaf, not copied again"
        );
        assert!(store.whole.is_empty());
    }

    /// A message with properties is kept whole, and only while it is the
    /// topic's message.
    #[test]
    fn a_message_with_properties_is_kept_whole_while_it_is_retained() {
        let mut store = RetainedIndex::new();
        store.set(&with_expiry("a/b", 30));
        store.set(&msg("a/c"));
        let matched = found(&store, "a/+");
        let [Retained::Whole(kept), Retained::Held { .. }] = matched.as_slice() else {
            panic!("{matched:?}");
        };
        assert_eq!(kept.properties.message_expiry_interval, Some(30));
        assert_eq!(store.whole.len(), 1);
        store.set(&msg("a/b"));
        assert!(store.whole.is_empty() && store.len() == 2);
        store.set(&with_expiry("a/b", 5));
        assert!(store.remove("a/b"));
        assert!(store.whole.is_empty() && store.len() == 1);
        // A last level too long for the head's count is kept whole too.
        let long = format!("a/{}", "x".repeat(usize::from(u16::MAX) + 1));
        store.set(&msg(&long));
        assert_eq!(topics(&store, "a/#"), vec!["a/c".to_owned(), long.clone()]);
        assert!(store.remove(&long));
        assert!(store.whole.is_empty());
    }

    mod against_a_list {
        use super::*;

        /// A memory store's handle on a plain message at `topic`.
        fn kept(topic: &str) -> Kept {
            Kept::new(&saguin_format::model::Record::new(topic, "x"))
        }
        use crate::topic::filter_matches;
        use proptest::prelude::*;

        fn level() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                Just("a".to_owned()),
                Just("b".to_owned()),
                Just("a-b".to_owned()),
                Just("$s".to_owned()),
            ]
        }

        fn topic() -> impl Strategy<Value = String> {
            prop::collection::vec(level(), 1..4).prop_map(|levels| levels.join("/"))
        }

        fn filter() -> impl Strategy<Value = String> {
            let level = prop_oneof![level(), Just("+".to_owned())];
            (prop::collection::vec(level, 1..4), any::<bool>()).prop_map(|(mut levels, hash)| {
                if hash {
                    levels.push("#".to_owned());
                }
                levels.join("/")
            })
        }

        proptest! {
            /// Whatever is set and removed, the index answers a filter with
            /// exactly the topics a list would, in the order of their levels.
            #[test]
            fn the_index_answers_as_a_list_of_topics_would(
                restored in prop::collection::btree_map(topic(), 0..3u8, 0..20),
                steps in prop::collection::vec((topic(), any::<bool>(), 0..3u8), 0..40),
                filters in prop::collection::vec(filter(), 1..8),
                pack in any::<bool>(),
            ) {
                let mut store = RetainedIndex::new();
                // Each topic held, and whether its message has properties.
                let mut list: Vec<(String, bool)> = Vec::new();
                // A restart's messages first, each topic once (as a store
                // hands them over): those with properties set whole among
                // them, the rest put in their sets at once by `pack`.
                // Each message is one of three: with properties (0), held
                // as bytes of its own (1) or as a store's handle (2).
                for (topic, form) in restored {
                    match form {
                        0 => store.set(&with_expiry(&topic, 9)),
                        1 => prop_assert!(store.restore_plain(&topic, 0, b"x")),
                        _ => store.restore_kept(&kept(&topic)),
                    }
                    list.push((topic, form == 0));
                }
                store.pack();
                prop_assert_eq!(store.len(), list.len());
                for (topic, set, form) in steps {
                    list.retain(|(t, _)| *t != topic);
                    if set {
                        match form {
                            0 => store.set(&with_expiry(&topic, 9)),
                            1 => store.set(&msg(&topic)),
                            _ => store.set_kept(&msg(&topic), kept(&topic)),
                        }
                        list.push((topic, form == 0));
                    } else {
                        let held = store.contains(&topic);
                        prop_assert_eq!(store.remove(&topic), held);
                    }
                    prop_assert_eq!(store.len(), list.len());
                    prop_assert_eq!(store.whole.len(), list.iter().filter(|(_, p)| *p).count());
                }
                if pack {
                    store.pack();
                }
                let with_properties: Vec<String> =
                    list.iter().filter(|(_, p)| *p).map(|(t, _)| t.clone()).collect();
                let mut list: Vec<String> = list.into_iter().map(|(t, _)| t).collect();
                list.sort_by(|a, b| a.split('/').cmp(b.split('/')));
                for filter in filters {
                    let expected: Vec<String> =
                        list.iter().filter(|t| filter_matches(&filter, t)).cloned().collect();
                    prop_assert_eq!(topics(&store, &filter), expected, "filter {}", filter);
                    for found in found(&store, &filter) {
                        let properties = with_properties.contains(&found.topic().into_owned());
                        prop_assert_eq!(matches!(found, Retained::Whole(_)), properties);
                    }
                }
                for topic in &list {
                    prop_assert!(store.contains(topic));
                }
            }
        }
    }
}
