//! Topic names, topic filters and the subscription index.
//!
//! The index is a trie keyed by topic level. Matching walks the levels of a
//! published topic once, following the literal child, the `+` child and the
//! `#` child of each node. Topics whose first level starts with `$` are not
//! matched by a `+` or `#` in the first level of a filter (MQTT 4.7.2).
//!
//! Shared subscriptions (`$share/GROUP/filter`) live in the same trie under
//! their filter, grouped by name; each publication picks one member of each
//! matching group, round robin, preferring members that are connected.

use std::collections::BTreeMap;

/// The key the broker gives a session; the index stores only these.
pub type SessionKey = u64;

/// Why a topic name or filter was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("empty")]
    Empty,
    #[error("contains NUL")]
    Nul,
    #[error("a topic name cannot contain + or #")]
    WildcardInName,
    #[error("# must be the whole last level")]
    BadMultiLevel,
    #[error("+ must be a whole level")]
    BadSingleLevel,
    #[error("shared subscription needs $share/GROUP/FILTER with a non-empty group without + or #")]
    BadShare,
    #[error("longer than 65535 bytes")]
    TooLong,
}

/// Check a topic name a client publishes to.
pub fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::Empty);
    }
    if name.len() > 65535 {
        return Err(TopicError::TooLong);
    }
    if name.contains('\0') {
        return Err(TopicError::Nul);
    }
    if name.contains(['+', '#']) {
        return Err(TopicError::WildcardInName);
    }
    Ok(())
}

/// Check a (non-shared) topic filter.
pub fn validate_filter(filter: &str) -> Result<(), TopicError> {
    if filter.is_empty() {
        return Err(TopicError::Empty);
    }
    if filter.len() > 65535 {
        return Err(TopicError::TooLong);
    }
    if filter.contains('\0') {
        return Err(TopicError::Nul);
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return Err(TopicError::BadMultiLevel);
        }
        if level.contains('+') && level != "+" {
            return Err(TopicError::BadSingleLevel);
        }
    }
    Ok(())
}

/// A subscription filter as the client wrote it, split into its share group
/// (if any) and the filter proper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedFilter<'a> {
    pub share_group: Option<&'a str>,
    pub filter: &'a str,
}

/// Parse and validate a SUBSCRIBE/UNSUBSCRIBE filter, `$share/G/f` included.
pub fn parse_filter(raw: &str) -> Result<ParsedFilter<'_>, TopicError> {
    if let Some(rest) = raw.strip_prefix("$share/") {
        let (group, filter) = rest.split_once('/').ok_or(TopicError::BadShare)?;
        if group.is_empty() || group.contains(['+', '#']) || filter.is_empty() {
            return Err(TopicError::BadShare);
        }
        validate_filter(filter)?;
        return Ok(ParsedFilter {
            share_group: Some(group),
            filter,
        });
    }
    validate_filter(raw)?;
    Ok(ParsedFilter {
        share_group: None,
        filter: raw,
    })
}

/// Does `filter` (already valid, not shared) match topic `name`?
pub fn filter_matches(filter: &str, name: &str) -> bool {
    if name.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut n = name.split('/');
    loop {
        match (f.next(), n.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

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

#[derive(Debug, Default)]
struct Node {
    children: BTreeMap<Box<str>, Node>,
    /// Non-shared subscribers whose filter ends here.
    subscribers: Vec<(SessionKey, SubOptions)>,
    shared: BTreeMap<Box<str>, SharedGroup>,
}

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
    /// not the `$share/G/` prefix). Returns true when it replaced one.
    pub fn insert(
        &mut self,
        share_group: Option<&str>,
        filter: &str,
        session: SessionKey,
        options: SubOptions,
    ) -> bool {
        let mut node = &mut self.root;
        for level in filter.split('/') {
            node = node.children.entry(level.into()).or_default();
        }
        let list = match share_group {
            None => &mut node.subscribers,
            Some(group) => &mut node.shared.entry(group.into()).or_default().members,
        };
        if let Some(entry) = list.iter_mut().find(|(s, _)| *s == session) {
            entry.1 = options;
            true
        } else {
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
                    let Some(g) = node.shared.get_mut(group) else {
                        return false;
                    };
                    let before = g.members.len();
                    g.members.retain(|(s, _)| *s != session);
                    let removed = before != g.members.len();
                    if g.members.is_empty() {
                        node.shared.remove(group);
                    } else if g.next >= g.members.len() {
                        g.next = 0;
                    }
                    removed
                }
            },
            Some((first, rest)) => {
                let Some(child) = node.children.get_mut(*first) else {
                    return false;
                };
                let removed = Self::remove_in(child, rest, share_group, session);
                if child.is_empty() {
                    node.children.remove(*first);
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
        let levels: Vec<&str> = name.split('/').collect();
        Self::walk(&mut self.root, &levels, dollar, true, is_online, out);
    }

    fn walk(
        node: &mut Node,
        levels: &[&str],
        dollar: bool,
        first: bool,
        is_online: &dyn Fn(SessionKey) -> bool,
        out: &mut Vec<Match>,
    ) {
        let wildcards_allowed = !(first && dollar);
        match levels.split_first() {
            None => {
                Self::collect(node, is_online, out);
                // `a/#` matches `a` too.
                if let Some(hash) = node.children.get_mut("#") {
                    Self::collect(hash, is_online, out);
                }
            }
            Some((level, rest)) => {
                if let Some(child) = node.children.get_mut(*level) {
                    Self::walk(child, rest, dollar, false, is_online, out);
                }
                if wildcards_allowed {
                    if let Some(child) = node.children.get_mut("+") {
                        Self::walk(child, rest, dollar, false, is_online, out);
                    }
                    if let Some(hash) = node.children.get_mut("#") {
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
        for group in node.shared.values_mut() {
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

    fn sessions(index: &mut SubscriptionIndex, topic: &str) -> Vec<SessionKey> {
        let mut out = Vec::new();
        index.matches(topic, &|_| true, &mut out);
        let mut s: Vec<_> = out.iter().map(|m| m.session).collect();
        s.sort();
        s
    }

    #[test]
    fn validation() {
        assert!(validate_topic_name("a/b").is_ok());
        assert!(validate_topic_name("a/+").is_err());
        assert!(validate_topic_name("").is_err());
        assert!(validate_filter("a/#").is_ok());
        assert!(validate_filter("#").is_ok());
        assert!(validate_filter("+/+/c").is_ok());
        assert!(validate_filter("a/#/b").is_err());
        assert!(validate_filter("a#").is_err());
        assert!(validate_filter("a/b+").is_err());
        assert_eq!(
            parse_filter("$share/g/a/+").unwrap(),
            ParsedFilter {
                share_group: Some("g"),
                filter: "a/+"
            }
        );
        assert!(parse_filter("$share//a").is_err());
        assert!(parse_filter("$share/g").is_err());
        assert!(parse_filter("$share/g+/a").is_err());
    }

    #[test]
    fn filter_matching_rules() {
        assert!(filter_matches("a/#", "a"));
        assert!(filter_matches("a/#", "a/b/c"));
        assert!(filter_matches("a/+/c", "a/b/c"));
        assert!(!filter_matches("a/+", "a/b/c"));
        assert!(filter_matches("+/+", "/x"));
        assert!(!filter_matches("#", "$SYS/broker"));
        assert!(!filter_matches("+/broker", "$SYS/broker"));
        assert!(filter_matches("$SYS/#", "$SYS/broker"));
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
}
