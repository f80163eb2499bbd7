//! The retained messages as the state routes from them: a trie by topic
//! level. It is the in-memory side of the retained store the configured
//! provider keeps (`broker.retained_storage`): loaded from it at startup,
//! changed only after the provider committed the change, so a SUBSCRIBE
//! matches without a read from storage and never holds the event loop.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::broker::message::Message;

#[derive(Debug, Default)]
struct Node {
    children: BTreeMap<Box<str>, Node>,
    value: Option<Arc<Message>>,
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
        for level in topic.split('/') {
            match node.children.get(level) {
                Some(child) => node = child,
                None => return false,
            }
        }
        node.value.is_some()
    }

    /// Keep `message` as the retained message of its topic (replacing any).
    pub fn set(&mut self, message: Arc<Message>) {
        let mut node = &mut self.root;
        for level in message.topic.split('/') {
            node = node.children.entry(level.into()).or_default();
        }
        if node.value.replace(message).is_none() {
            self.count += 1;
        }
    }

    /// Forget the retained message of `topic`. Returns true if there was one.
    pub fn remove(&mut self, topic: &str) -> bool {
        fn remove_in(node: &mut Node, levels: &[&str]) -> bool {
            match levels.split_first() {
                None => node.value.take().is_some(),
                Some((first, rest)) => {
                    let Some(child) = node.children.get_mut(*first) else {
                        return false;
                    };
                    let removed = remove_in(child, rest);
                    if child.value.is_none() && child.children.is_empty() {
                        node.children.remove(*first);
                    }
                    removed
                }
            }
        }
        let levels: Vec<&str> = topic.split('/').collect();
        let removed = remove_in(&mut self.root, &levels);
        if removed {
            self.count -= 1;
        }
        removed
    }

    /// Append every retained message whose topic matches `filter` (a valid,
    /// non-shared filter) to `out`, in topic byte order.
    pub fn matching(&self, filter: &str, out: &mut Vec<Arc<Message>>) {
        fn all(node: &Node, out: &mut Vec<Arc<Message>>) {
            out.extend(node.value.iter().cloned());
            for child in node.children.values() {
                all(child, out);
            }
        }
        fn walk(node: &Node, levels: &[&str], first: bool, out: &mut Vec<Arc<Message>>) {
            match levels.split_first() {
                None => out.extend(node.value.iter().cloned()),
                Some((&"#", _)) => {
                    // `a/#` matches `a` itself and everything below; at the
                    // first level it skips `$` topics.
                    out.extend(node.value.iter().cloned());
                    for (name, child) in &node.children {
                        if first && name.starts_with('$') {
                            continue;
                        }
                        all(child, out);
                    }
                }
                Some((&"+", rest)) => {
                    for (name, child) in &node.children {
                        if first && name.starts_with('$') {
                            continue;
                        }
                        walk(child, rest, false, out);
                    }
                }
                Some((level, rest)) => {
                    if let Some(child) = node.children.get(*level) {
                        walk(child, rest, false, out);
                    }
                }
            }
        }
        let levels: Vec<&str> = filter.split('/').collect();
        if levels.first() == Some(&"#") {
            for (name, child) in &self.root.children {
                if !name.starts_with('$') {
                    all(child, out);
                }
            }
            return;
        }
        walk(&self.root, &levels, true, out);
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
}
