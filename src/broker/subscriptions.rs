//! The subscription index: which sessions a published topic reaches. The
//! topic rules it follows (validity, matching) are [`crate::topic`]'s.
//!
//! The index is a trie keyed by topic level. Matching walks the levels of a
//! published topic once, following the literal child, the `+` child and the
//! `#` child of each node. Topics whose first level starts with `$` are not
//! matched by a `+` or `#` in the first level of a filter (MQTT 4.7.2).
//!
//! Shared subscriptions (`$share/GROUP/filter`) live in the same trie under
//! their filter, grouped by name; each publication picks one member of each
//! matching group, round robin, preferring members that are connected.

use super::lazy::{empty, Lazy};
use super::long_lived;
use super::small_map::{self, SmallMap};

/// The key the broker gives a session; the index stores only these.
pub type SessionKey = u64;

/// The options a session subscribed with (MQTT 5 subscription options; a
/// 3.1.1 subscription has only the QoS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubOptions {
    pub qos: u8,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: u8,
    /// Subscription identifier from the SUBSCRIBE's properties, if any.
    pub subscription_id: Option<u32>,
}

/// One subscription found for a published topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    pub session: SessionKey,
    pub options: SubOptions,
    /// Matched through a shared subscription (no-local does not apply, and
    /// retain-as-published is ignored).
    pub shared: bool,
}

#[derive(Debug, Default)]
struct SharedGroup {
    members: Vec<(SessionKey, SubOptions)>,
    /// Index of the member that gets the next publication.
    next: usize,
}

/// A level's name as its parent's key, looked up by its bytes: up to
/// [`LevelName::INLINE`] bytes are held in the key itself, a longer name
/// in a box. A level of a million device ids is searched at every command
/// to one of them, and a boxed name took each of the search's comparisons
/// to a block of its own, far from the B-tree node and rarely in cache.
enum LevelName {
    Inline {
        len: u8,
        bytes: [u8; LevelName::INLINE],
    },
    Boxed(Box<[u8]>),
}

impl LevelName {
    /// As many bytes as fit beside the length in the 24 bytes the boxed
    /// form takes with its tag.
    const INLINE: usize = 22;

    fn new(name: &str) -> LevelName {
        let name = name.as_bytes();
        if name.len() > Self::INLINE {
            return LevelName::Boxed(name.into());
        }
        let mut bytes = [0; Self::INLINE];
        bytes[..name.len()].copy_from_slice(name);
        LevelName::Inline {
            len: name.len() as u8,
            bytes,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            LevelName::Inline { len, bytes } => &bytes[..usize::from(*len)],
            LevelName::Boxed(bytes) => bytes,
        }
    }
}

impl std::borrow::Borrow<[u8]> for LevelName {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

// Ordered and compared as its bytes, as the `[u8]` it is looked up by
// must be (and as `str` orders, so the index walks in name order).
impl Ord for LevelName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl PartialOrd for LevelName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for LevelName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for LevelName {}

impl std::fmt::Debug for LevelName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

/// The wildcard levels' names, as a level is looked up.
const HASH: &[u8] = b"#";
const PLUS: &[u8] = b"+";

#[derive(Debug, Default)]
struct Node {
    children: SmallMap<LevelName, Node>,
    /// Non-shared subscribers whose filter ends here.
    subscribers: Vec<(SessionKey, SubOptions)>,
    /// Shared groups whose filter ends here: allocated for the few levels
    /// that have one, so every other level is a pointer smaller.
    shared: Lazy<SmallMap<Box<str>, SharedGroup>>,
}

empty!(SmallMap<Box<str>, SharedGroup>, SmallMap::new());

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.subscribers.is_empty() && self.shared.is_empty()
    }
}

/// Every subscription of every session, indexed by filter level.
#[derive(Debug, Default)]
pub struct SubscriptionIndex {
    root: Node,
    count: usize,
}

impl SubscriptionIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of subscriptions (shared memberships included).
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Add or replace `session`'s subscription to `filter` (a valid filter,
    /// not the `$share/G/` prefix). Returns true when it replaced one. The
    /// levels and lists it makes are kept as long as their subscriptions:
    /// made among long-lived blocks ([`long_lived`]).
    pub fn insert(
        &mut self,
        share_group: Option<&str>,
        filter: &str,
        session: SessionKey,
        options: SubOptions,
    ) -> bool {
        long_lived::make(|| self.insert_made(share_group, filter, session, options))
    }

    fn insert_made(
        &mut self,
        share_group: Option<&str>,
        filter: &str,
        session: SessionKey,
        options: SubOptions,
    ) -> bool {
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = node.children.get_or_insert_with(
                level.as_bytes(),
                || LevelName::new(level),
                Node::default,
            );
        }
        let list = match share_group {
            None => &mut node.subscribers,
            Some(group) => {
                &mut node
                    .shared
                    .get_or_insert_with(group, || group.into(), SharedGroup::default)
                    .members
            }
        };
        if let Some(entry) = list.iter_mut().find(|(s, _)| *s == session) {
            entry.1 = options;
            true
        } else {
            // A filter most often has one subscriber: a device's own
            // command topic.
            small_map::reserve_one(list);
            list.push((session, options));
            self.count += 1;
            false
        }
    }

    /// Remove `session`'s subscription to `filter`. Returns true when it existed.
    pub fn remove(&mut self, share_group: Option<&str>, filter: &str, session: SessionKey) -> bool {
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = Self::remove_in(&mut self.root, &levels, share_group, session);
        if removed {
            self.count -= 1;
        }
        removed
    }

    fn remove_in(
        node: &mut Node,
        levels: &[&str],
        share_group: Option<&str>,
        session: SessionKey,
    ) -> bool {
        match levels.split_first() {
            None => match share_group {
                None => {
                    let before = node.subscribers.len();
                    node.subscribers.retain(|(s, _)| *s != session);
                    before != node.subscribers.len()
                }
                Some(group) => {
                    let Some(g) = node.shared.allocated_mut().and_then(|s| s.get_mut(group)) else {
                        return false;
                    };
                    let before = g.members.len();
                    g.members.retain(|(s, _)| *s != session);
                    let removed = before != g.members.len();
                    if g.members.is_empty() {
                        if let Some(shared) = node.shared.allocated_mut() {
                            shared.remove(group);
                        }
                    } else if g.next >= g.members.len() {
                        g.next = 0;
                    }
                    removed
                }
            },
            Some((first, rest)) => {
                let Some(child) = node.children.get_mut(first.as_bytes()) else {
                    return false;
                };
                let removed = Self::remove_in(child, rest, share_group, session);
                if child.is_empty() {
                    node.children.remove(first.as_bytes());
                }
                removed
            }
        }
    }

    /// Collect every subscription matching topic `name` into `out` (cleared
    /// first). Shared groups contribute one member each, chosen round robin
    /// among members for which `is_online` holds (any member if none is).
    pub fn matches(
        &mut self,
        name: &str,
        is_online: &dyn Fn(SessionKey) -> bool,
        out: &mut Vec<Match>,
    ) {
        out.clear();
        let dollar = name.starts_with('$');
        Self::walk(&mut self.root, Some(name), dollar, true, is_online, out);
    }

    /// `levels`: what is left of the name, its levels still joined by `/`
    /// (`None` past the last one), so a publish's walk allocates nothing.
    fn walk(
        node: &mut Node,
        levels: Option<&str>,
        dollar: bool,
        first: bool,
        is_online: &dyn Fn(SessionKey) -> bool,
        out: &mut Vec<Match>,
    ) {
        let wildcards_allowed = !(first && dollar);
        // A byte search: `/` is ASCII, and a char pattern's searcher costs
        // more than the few bytes of a level it looks through.
        let split = levels.map(|levels| match levels.bytes().position(|b| b == b'/') {
            Some(at) => (&levels[..at], Some(&levels[at + 1..])),
            None => (levels, None),
        });
        match split {
            None => {
                Self::collect(node, is_online, out);
                // `a/#` matches `a` too.
                if let Some(hash) = node.children.get_mut(HASH) {
                    Self::collect(hash, is_online, out);
                }
            }
            Some((level, rest)) => {
                if let Some(child) = node.children.get_mut(level.as_bytes()) {
                    Self::walk(child, rest, dollar, false, is_online, out);
                }
                if wildcards_allowed {
                    if let Some(child) = node.children.get_mut(PLUS) {
                        Self::walk(child, rest, dollar, false, is_online, out);
                    }
                    if let Some(hash) = node.children.get_mut(HASH) {
                        Self::collect(hash, is_online, out);
                    }
                }
            }
        }
    }

    fn collect(node: &mut Node, is_online: &dyn Fn(SessionKey) -> bool, out: &mut Vec<Match>) {
        out.extend(node.subscribers.iter().map(|(session, options)| Match {
            session: *session,
            options: *options,
            shared: false,
        }));
        let groups = node
            .shared
            .allocated_mut()
            .into_iter()
            .flat_map(|s| s.values_mut());
        for group in groups {
            let n = group.members.len();
            if n == 0 {
                continue;
            }
            let start = group.next % n;
            let pick = (0..n)
                .map(|i| (start + i) % n)
                .find(|&i| is_online(group.members[i].0))
                .unwrap_or(start);
            group.next = (pick + 1) % n;
            let (session, options) = group.members[pick];
            out.push(Match {
                session,
                options,
                shared: true,
            });
        }
    }
}

/// One delivery per session for a publication: the matches merged at the
/// highest QoS, with every subscription identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub session: SessionKey,
    pub qos: u8,
    pub retain_as_published: bool,
    pub subscription_ids: Vec<u32>,
}

/// Merge `matches` into one delivery per session, dropping no-local matches
/// of the publisher's own session. Sorted by session key: deterministic.
pub fn merge_matches(
    matches: &mut [Match],
    publisher: Option<SessionKey>,
    out: &mut Vec<Delivery>,
) {
    out.clear();
    matches.sort_by_key(|m| m.session);
    for m in matches.iter() {
        if !m.shared && m.options.no_local && Some(m.session) == publisher {
            continue;
        }
        match out.last_mut() {
            Some(d) if d.session == m.session => {
                d.qos = d.qos.max(m.options.qos);
                d.retain_as_published |= m.options.retain_as_published && !m.shared;
                if let Some(id) = m.options.subscription_id {
                    if !d.subscription_ids.contains(&id) {
                        d.subscription_ids.push(id);
                    }
                }
            }
            _ => out.push(Delivery {
                session: m.session,
                qos: m.options.qos,
                retain_as_published: m.options.retain_as_published && !m.shared,
                subscription_ids: m.options.subscription_id.into_iter().collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(qos: u8) -> SubOptions {
        SubOptions {
            qos,
            no_local: false,
            retain_as_published: false,
            retain_handling: 0,
            subscription_id: None,
        }
    }

    /// Devices each subscribed to their own command topic: the level of
    /// their ids holds thousands of children, and each level below it one,
    /// with room for one (not a B-tree's eleven), and one subscriber with
    /// room for one (not four).
    #[test]
    fn a_level_with_one_child_holds_room_for_one() {
        // Its children, its subscribers and a pointer to its shared groups.
        assert!(std::mem::size_of::<Node>() <= 56);
        let mut index = SubscriptionIndex::new();
        for device in 0..100u64 {
            index.insert(None, &format!("cmd/{device}/#"), device, opts(1));
        }
        let ids = index
            .root
            .children
            .get(b"cmd".as_slice())
            .expect("the cmd level");
        assert!(matches!(ids.children, SmallMap::Many(_)));
        assert_eq!(ids.children.len(), 100);
        for device in ids.children.values() {
            let SmallMap::Few(hash) = &device.children else {
                panic!("one child is a vector");
            };
            assert_eq!((hash.len(), hash.capacity()), (1, 1));
            let subscribers = &hash[0].1.subscribers;
            assert_eq!((subscribers.len(), subscribers.capacity()), (1, 1));
            assert!(!hash[0].1.shared.is_allocated());
        }
        assert_eq!(sessions(&mut index, "cmd/7/reboot"), vec![7]);
    }

    /// A level's name is held in its key up to 22 bytes and boxed past
    /// that; either way the index finds it, and keys order as their names
    /// do. A key is 24 bytes, a boxed name's pointer and length with a tag.
    #[test]
    fn level_names_in_the_key_or_boxed_are_found_and_ordered_as_names() {
        assert_eq!(std::mem::size_of::<LevelName>(), 24);
        let names: Vec<String> = vec![
            String::new(),
            "a".into(),
            "é".into(),
            "x".repeat(21),
            "x".repeat(22),
            "x".repeat(23),
            "xy".repeat(200),
            "dev-0042".into(),
        ];
        for name in &names {
            let key = LevelName::new(name);
            assert_eq!(key.as_bytes(), name.as_bytes());
            assert_eq!(
                matches!(key, LevelName::Inline { .. }),
                name.len() <= LevelName::INLINE,
                "{name:?}"
            );
        }
        let mut keys: Vec<LevelName> = names.iter().map(|n| LevelName::new(n)).collect();
        keys.sort();
        let mut sorted = names.clone();
        sorted.sort();
        let keys: Vec<&[u8]> = keys.iter().map(LevelName::as_bytes).collect();
        let sorted: Vec<&[u8]> = sorted.iter().map(|n| n.as_bytes()).collect();
        assert_eq!(keys, sorted);

        let mut index = SubscriptionIndex::new();
        for (session, name) in names.iter().enumerate() {
            index.insert(None, &format!("t/{name}/#"), session as SessionKey, opts(1));
        }
        for (session, name) in names.iter().enumerate() {
            let topic = format!("t/{name}/x");
            assert_eq!(sessions(&mut index, &topic), vec![session as SessionKey]);
            assert!(index.remove(None, &format!("t/{name}/#"), session as SessionKey));
            assert!(sessions(&mut index, &topic).is_empty());
        }
        assert!(index.root.is_empty());
    }

    fn sessions(index: &mut SubscriptionIndex, topic: &str) -> Vec<SessionKey> {
        let mut out = Vec::new();
        index.matches(topic, &|_| true, &mut out);
        let mut s: Vec<_> = out.iter().map(|m| m.session).collect();
        s.sort();
        s
    }

    #[test]
    fn index_matches_wildcards_and_dollar() {
        let mut index = SubscriptionIndex::new();
        index.insert(None, "a/b", 1, opts(0));
        index.insert(None, "a/+", 2, opts(1));
        index.insert(None, "#", 3, opts(2));
        index.insert(None, "a/#", 4, opts(0));
        index.insert(None, "$SYS/#", 5, opts(0));
        assert_eq!(sessions(&mut index, "a/b"), vec![1, 2, 3, 4]);
        assert_eq!(sessions(&mut index, "a"), vec![3, 4]);
        assert_eq!(sessions(&mut index, "$SYS/broker/uptime"), vec![5]);
        assert!(index.remove(None, "a/+", 2));
        assert!(!index.remove(None, "a/+", 2));
        assert_eq!(sessions(&mut index, "a/b"), vec![1, 3, 4]);
        assert_eq!(index.len(), 4);
    }

    #[test]
    fn shared_round_robin_prefers_online() {
        let mut index = SubscriptionIndex::new();
        index.insert(Some("g"), "t", 1, opts(1));
        index.insert(Some("g"), "t", 2, opts(1));
        index.insert(Some("g"), "t", 3, opts(1));
        let mut out = Vec::new();
        let mut picked = Vec::new();
        for _ in 0..4 {
            index.matches("t", &|s| s != 2, &mut out);
            assert_eq!(out.len(), 1);
            picked.push(out[0].session);
        }
        assert_eq!(picked, vec![1, 3, 1, 3]);
    }

    #[test]
    fn overlapping_merge_highest_qos_all_ids_no_local() {
        let mut index = SubscriptionIndex::new();
        let mut a = opts(0);
        a.subscription_id = Some(7);
        let mut b = opts(2);
        b.subscription_id = Some(9);
        index.insert(None, "x/+", 1, a);
        index.insert(None, "x/#", 1, b);
        let mut nl = opts(1);
        nl.no_local = true;
        index.insert(None, "x/y", 2, nl);
        let mut m = Vec::new();
        index.matches("x/y", &|_| true, &mut m);
        let mut d = Vec::new();
        merge_matches(&mut m, Some(2), &mut d);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].session, 1);
        assert_eq!(d[0].qos, 2);
        assert_eq!(d[0].subscription_ids, vec![7, 9]);
    }

    fn level() -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(vec!["a", "b", "", "$s"])
    }

    proptest::proptest! {
        /// The trie walk reaches exactly the sessions whose filter
        /// `crate::topic::filter_matches` says matches.
        #[test]
        fn index_agrees_with_the_topic_rule(
            filters in proptest::collection::vec(
                (proptest::collection::vec(proptest::prop_oneof![level(), proptest::strategy::Just("+")], 0..4), proptest::bool::ANY),
                1..12,
            ),
            names in proptest::collection::vec(proptest::collection::vec(level(), 1..5), 1..8),
        ) {
            let filters: Vec<String> = filters
                .into_iter()
                .map(|(mut levels, hash)| {
                    if hash || levels.is_empty() {
                        levels.push("#");
                    }
                    levels.join("/")
                })
                .collect();
            let mut index = SubscriptionIndex::new();
            for (i, f) in filters.iter().enumerate() {
                index.insert(None, f, i as SessionKey, opts(0));
            }
            for name in names.iter().map(|l| l.join("/")).filter(|n| !n.is_empty()) {
                let expected: Vec<SessionKey> = (0..filters.len())
                    .filter(|&i| crate::topic::filter_matches(&filters[i], &name))
                    .map(|i| i as SessionKey)
                    .collect();
                proptest::prop_assert_eq!(sessions(&mut index, &name), expected, "{}", name);
            }
        }
    }
}
