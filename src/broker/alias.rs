//! Outbound topic aliases of one MQTT 5 connection (MQTT 5 3.3.2.3.4):
//! the writer's own table, never shared and never carried over to another
//! connection. A topic is given an alias the first time it is sent (the
//! broker cannot know which topics will repeat); the full topic goes with
//! that PUBLISH and later ones carry only the alias and an empty topic.
//! At most the client's Topic Alias Maximum aliases exist; when all are in
//! use the least recently sent topic gives its alias up to the new one.

use std::collections::{BTreeMap, HashMap};

use super::codec::ByteStr;

/// What to put in a PUBLISH for its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AliasUse {
    /// The client knows this alias for the topic: send the alias and an
    /// empty topic.
    Reuse(u16),
    /// The alias is (re)assigned to the topic: send both.
    Assign(u16),
}

#[derive(Debug)]
pub struct OutboundAliases {
    maximum: u16,
    /// Topic → (alias, the tick it was last sent).
    by_topic: HashMap<ByteStr, (u16, u64)>,
    /// Tick of last use → topic: the first entry is the least recently sent.
    by_use: BTreeMap<u64, ByteStr>,
    /// Aliases given up by [`OutboundAliases::forget`], reused first.
    free: Vec<u16>,
    tick: u64,
}

impl OutboundAliases {
    /// A table for a client whose Topic Alias Maximum is `maximum`; `None`
    /// when it accepts no aliases.
    pub fn new(maximum: u16) -> Option<OutboundAliases> {
        (maximum > 0).then(|| OutboundAliases {
            maximum,
            by_topic: HashMap::new(),
            by_use: BTreeMap::new(),
            free: Vec::new(),
            tick: 0,
        })
    }

    /// The alias for `topic` in the PUBLISH about to be sent.
    pub fn alias_for(&mut self, topic: &ByteStr) -> AliasUse {
        self.tick += 1;
        let tick = self.tick;
        if let Some((alias, last)) = self.by_topic.get_mut(topic) {
            self.by_use.remove(last);
            *last = tick;
            self.by_use.insert(tick, topic.clone());
            return AliasUse::Reuse(*alias);
        }
        let alias = if let Some(alias) = self.free.pop() {
            alias
        } else if self.by_topic.len() < usize::from(self.maximum) {
            // Aliases 1..=len are taken (none was freed): the next is free.
            u16::try_from(self.by_topic.len() + 1).unwrap_or(self.maximum)
        } else {
            let (_, oldest) = self
                .by_use
                .pop_first()
                .expect("a full table has a least recently used entry");
            self.by_topic
                .remove(&oldest)
                .map(|(alias, _)| alias)
                .expect("both maps hold the same topics")
        };
        self.by_topic.insert(topic.clone(), (alias, tick));
        self.by_use.insert(tick, topic.clone());
        AliasUse::Assign(alias)
    }

    /// The PUBLISH that would have assigned `topic` its alias was not sent
    /// (too large for the client): the client never learnt the mapping.
    pub fn forget(&mut self, topic: &ByteStr) {
        if let Some((alias, last)) = self.by_topic.remove(topic) {
            self.by_use.remove(&last);
            self.free.push(alias);
        }
    }

    pub fn len(&self) -> usize {
        self.by_topic.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_topic.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> ByteStr {
        ByteStr::from(s.to_owned())
    }

    #[test]
    fn a_topic_is_assigned_once_then_reused() {
        let mut a = OutboundAliases::new(2).unwrap();
        assert_eq!(a.alias_for(&t("a")), AliasUse::Assign(1));
        assert_eq!(a.alias_for(&t("b")), AliasUse::Assign(2));
        assert_eq!(a.alias_for(&t("a")), AliasUse::Reuse(1));
        assert_eq!(a.alias_for(&t("b")), AliasUse::Reuse(2));
    }

    #[test]
    fn the_least_recently_sent_topic_gives_up_its_alias() {
        let mut a = OutboundAliases::new(2).unwrap();
        a.alias_for(&t("a"));
        a.alias_for(&t("b"));
        a.alias_for(&t("a"));
        // "b" is the least recently sent: "c" takes its alias 2.
        assert_eq!(a.alias_for(&t("c")), AliasUse::Assign(2));
        assert_eq!(a.alias_for(&t("a")), AliasUse::Reuse(1));
        assert_eq!(a.alias_for(&t("b")), AliasUse::Assign(2));
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn never_above_the_maximum_whatever_the_topics() {
        let mut a = OutboundAliases::new(3).unwrap();
        for i in 0..1000u32 {
            let topic = t(&format!("t/{}", (i * 7919) % 11));
            let alias = match a.alias_for(&topic) {
                AliasUse::Reuse(n) | AliasUse::Assign(n) => n,
            };
            assert!((1..=3).contains(&alias), "alias {alias}");
            assert!(a.len() <= 3);
        }
    }

    #[test]
    fn a_forgotten_assignment_frees_its_alias() {
        let mut a = OutboundAliases::new(2).unwrap();
        a.alias_for(&t("a"));
        a.forget(&t("a"));
        assert!(a.is_empty());
        assert_eq!(a.alias_for(&t("b")), AliasUse::Assign(1));
        assert_eq!(a.alias_for(&t("a")), AliasUse::Assign(2));
    }

    #[test]
    fn no_table_for_a_client_that_takes_no_aliases() {
        assert!(OutboundAliases::new(0).is_none());
    }
}
