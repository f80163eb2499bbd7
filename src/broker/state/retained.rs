//! The retained messages as the state routes from them: a trie by topic
//! level. It is the in-memory side of the retained store the configured
//! provider keeps (`broker.retained_storage`): loaded from it at startup,
//! changed only after the provider committed the change, so a SUBSCRIBE
//! matches without a read from storage and never holds the event loop.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::broker::message::Message;

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
                            value: Some(&value.0),
                            ..Below::level(name, node)
                        })
                }
            }
        })
    }

    /// The level named `name` one below this one, when anything is there.
    fn get<'a>(&'a self, name: &'a str) -> Option<Below<'a>> {
        let value = self.values.get(name).map(|leaf| &leaf.0);
        let node = self.children.get(name);
        (value.is_some() || node.is_some()).then_some(Below { name, value, node })
    }
}

/// One level below a node, as a filter walks it.
struct Below<'a> {
    name: &'a str,
    value: Option<&'a Arc<Message>>,
    node: Option<&'a Node>,
}

impl<'a> Below<'a> {
    fn value(leaf: &'a Leaf) -> Below<'a> {
        Below {
            name: leaf.name(),
            value: Some(&leaf.0),
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

/// A retained message in its level's set, ordered (and found) by the last
/// level of its topic.
#[derive(Debug)]
struct Leaf(Arc<Message>);

impl Leaf {
    fn name(&self) -> &str {
        last_level(&self.0.topic)
    }
}

impl Borrow<str> for Leaf {
    fn borrow(&self) -> &str {
        self.name()
    }
}

impl PartialEq for Leaf {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Leaf {}

impl PartialOrd for Leaf {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Leaf {
    fn cmp(&self, other: &Self) -> Ordering {
        self.name().cmp(other.name())
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
    count: usize,
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
    pub fn set(&mut self, message: Arc<Message>) {
        let mut node = &mut self.root;
        for level in levels_above(&message.topic) {
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
        if node.values.replace(Leaf(message)).is_none() {
            self.count += 1;
        }
    }

    /// Forget the retained message of `topic`. Returns true if there was one.
    pub fn remove(&mut self, topic: &str) -> bool {
        /// Removes `last` from the level `above` leads to, and every level
        /// left empty on the way back up.
        fn remove_in(node: &mut Node, above: &[&str], last: &str) -> bool {
            match above.split_first() {
                None => node.values.remove(last),
                Some((first, rest)) => {
                    let Some(child) = node.children.get_mut(*first) else {
                        return false;
                    };
                    let removed = remove_in(child, rest, last);
                    if child.is_empty() {
                        node.children.remove(*first);
                    }
                    removed
                }
            }
        }
        let above: Vec<&str> = levels_above(topic).collect();
        let removed = remove_in(&mut self.root, &above, last_level(topic));
        if removed {
            self.count -= 1;
        }
        removed
    }

    /// Append every retained message whose topic matches `filter` (a valid,
    /// non-shared filter) to `out`, in topic byte order.
    pub fn matching(&self, filter: &str, out: &mut Vec<Arc<Message>>) {
        fn all(below: Below<'_>, out: &mut Vec<Arc<Message>>) {
            out.extend(below.value.cloned());
            for next in below.node.into_iter().flat_map(Node::below) {
                all(next, out);
            }
        }
        fn walk(below: Below<'_>, levels: &[&str], first: bool, out: &mut Vec<Arc<Message>>) {
            match levels.split_first() {
                None => out.extend(below.value.cloned()),
                Some((&"#", _)) => {
                    // `a/#` matches `a` itself and everything below; at the
                    // first level it skips `$` topics.
                    out.extend(below.value.cloned());
                    for next in below.node.into_iter().flat_map(Node::below) {
                        if !(first && next.name.starts_with('$')) {
                            all(next, out);
                        }
                    }
                }
                Some((&"+", rest)) => {
                    for next in below.node.into_iter().flat_map(Node::below) {
                        if !(first && next.name.starts_with('$')) {
                            walk(next, rest, false, out);
                        }
                    }
                }
                Some((level, rest)) => {
                    if let Some(next) = below.node.and_then(|node| node.get(level)) {
                        walk(next, rest, false, out);
                    }
                }
            }
        }
        let levels: Vec<&str> = filter.split('/').collect();
        let root = Below {
            name: "",
            value: None,
            node: Some(&self.root),
        };
        walk(root, &levels, true, out);
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::message::MessageProperties;
    use bytes::Bytes;
    use tokio::time::Instant;

    fn msg(topic: &str) -> Arc<Message> {
        Arc::new(Message {
            topic: topic.into(),
            payload: Bytes::from_static(b"x"),
            qos: 0,
            retain: true,
            properties: MessageProperties::default(),
            received_at: Instant::now(),
            wire: Default::default(),
        })
    }

    fn topics(store: &RetainedIndex, filter: &str) -> Vec<String> {
        let mut out = Vec::new();
        store.matching(filter, &mut out);
        out.iter().map(|m| m.topic.to_string()).collect()
    }

    #[test]
    fn set_match_remove() {
        let mut store = RetainedIndex::new();
        for t in ["a", "a/b", "a/b/c", "a/x", "$SYS/v", "b"] {
            store.set(msg(t));
        }
        store.set(msg("a/b"));
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
            store.set(msg(t));
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
            store.set(msg(t));
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

    mod against_a_list {
        use super::*;
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
                steps in prop::collection::vec((topic(), any::<bool>()), 0..40),
                filters in prop::collection::vec(filter(), 1..8),
            ) {
                let mut store = RetainedIndex::new();
                let mut list: Vec<String> = Vec::new();
                for (topic, set) in steps {
                    if set {
                        store.set(msg(&topic));
                        if !list.contains(&topic) {
                            list.push(topic);
                        }
                    } else {
                        let held = list.contains(&topic);
                        prop_assert_eq!(store.remove(&topic), held);
                        list.retain(|t| *t != topic);
                    }
                    prop_assert_eq!(store.len(), list.len());
                }
                list.sort_by(|a, b| a.split('/').cmp(b.split('/')));
                for filter in filters {
                    let expected: Vec<String> =
                        list.iter().filter(|t| filter_matches(&filter, t)).cloned().collect();
                    prop_assert_eq!(topics(&store, &filter), expected, "filter {}", filter);
                }
                for topic in &list {
                    prop_assert!(store.contains(topic));
                }
            }
        }
    }
}
