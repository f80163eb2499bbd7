//! MQTT topic names and topic filters: which are valid (MQTT 5 §4.7,
//! shared subscriptions §4.8.2; MQTT 3.1.1 §4.7 is the same) and which
//! filter matches which name.
//!
//! The one home of these rules. The codec validates names and filters with
//! them, the broker's subscription index and restore path match with them,
//! the ACL validates and covers with them, and the storage providers'
//! `match_filter` selects retained values with them. It sits at the library
//! root, not under `broker`, because the storage layer (which the broker
//! builds on, never the reverse) needs the matching rule too.
//!
//! Topics whose first level starts with `$` are not matched by a `+` or `#`
//! in the first level of a filter (MQTT-4.7.2-1).

/// The prefix that makes a filter a shared subscription.
pub const SHARE_PREFIX: &str = "$share/";

/// The longest topic name or filter: its length is a two-byte field.
pub const MAX_LEN: usize = 65_535;

/// Why a topic name or filter is refused. The message completes a sentence
/// naming the topic ("topic filter `a#`: '#' must be ...").
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("it is empty")]
    Empty,
    #[error("it is longer than 65535 bytes")]
    TooLong,
    #[error("it contains NUL")]
    Nul,
    #[error("a topic name may not contain the wildcards + or #")]
    WildcardInName,
    #[error("'#' must be the whole last level of a topic filter")]
    MisplacedMultiLevel,
    #[error("'+' must be a whole level of a topic filter")]
    MisplacedSingleLevel,
    #[error("no topic filter after the share name")]
    NoSharedFilter,
    #[error("the share name is empty")]
    EmptyShareName,
    #[error("the share name may not contain + or #")]
    WildcardInShareName,
}

impl TopicError {
    /// The message as a static string, for errors that carry one.
    pub fn why(self) -> &'static str {
        match self {
            TopicError::Empty => "it is empty",
            TopicError::TooLong => "it is longer than 65535 bytes",
            TopicError::Nul => "it contains NUL",
            TopicError::WildcardInName => "a topic name may not contain the wildcards + or #",
            TopicError::MisplacedMultiLevel => "'#' must be the whole last level of a topic filter",
            TopicError::MisplacedSingleLevel => "'+' must be a whole level of a topic filter",
            TopicError::NoSharedFilter => "no topic filter after the share name",
            TopicError::EmptyShareName => "the share name is empty",
            TopicError::WildcardInShareName => "the share name may not contain + or #",
        }
    }

    /// Whether the error is about the `$share/{group}/` part of a filter.
    pub fn is_share_problem(self) -> bool {
        matches!(
            self,
            TopicError::NoSharedFilter
                | TopicError::EmptyShareName
                | TopicError::WildcardInShareName
        )
    }
}

fn check_text(text: &str) -> Result<(), TopicError> {
    if text.is_empty() {
        return Err(TopicError::Empty);
    }
    if text.len() > MAX_LEN {
        return Err(TopicError::TooLong);
    }
    if text.contains('\0') {
        return Err(TopicError::Nul);
    }
    Ok(())
}

/// A topic name (what PUBLISH and a Will carry, and a Response Topic): at
/// least one character, no wildcard (MQTT-3.3.2-2, MQTT-4.7.3-1).
pub fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::Empty);
    }
    if name.len() > MAX_LEN {
        return Err(TopicError::TooLong);
    }
    // Every publish is checked: one pass over the bytes without an early
    // exit (which the compiler can do a vector at a time), not one search
    // per character sought; only a name that fails is looked at again.
    let suspect = name
        .bytes()
        .fold(false, |seen, b| seen | (b == 0) | (b == b'+') | (b == b'#'));
    if !suspect {
        return Ok(());
    }
    // NUL is reported before a wildcard, as `check_text` does for filters,
    // wherever each is.
    if name.contains('\0') {
        return Err(TopicError::Nul);
    }
    Err(TopicError::WildcardInName)
}

/// A plain (non-shared) topic filter: `#` only as the whole last level,
/// `+` only as a whole level (MQTT-4.7.1-1, -4.7.1-2). A `$share/` filter
/// is checked here as an ordinary filter; see [`parse_filter`].
pub fn validate_filter(filter: &str) -> Result<(), TopicError> {
    check_text(filter)?;
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return Err(TopicError::MisplacedMultiLevel);
        }
        if level.contains('+') && level != "+" {
            return Err(TopicError::MisplacedSingleLevel);
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

/// Parse and validate a SUBSCRIBE/UNSUBSCRIBE filter: for
/// `$share/{group}/{filter}` a non-empty group without wildcards followed
/// by a valid filter (MQTT-4.8.2-1, -4.8.2-2), otherwise a valid filter.
pub fn parse_filter(raw: &str) -> Result<ParsedFilter<'_>, TopicError> {
    let Some(rest) = raw.strip_prefix(SHARE_PREFIX) else {
        validate_filter(raw)?;
        return Ok(ParsedFilter {
            share_group: None,
            filter: raw,
        });
    };
    let (group, filter) = rest.split_once('/').ok_or(TopicError::NoSharedFilter)?;
    if group.is_empty() {
        return Err(TopicError::EmptyShareName);
    }
    if group.contains(['+', '#']) {
        return Err(TopicError::WildcardInShareName);
    }
    validate_filter(filter)?;
    Ok(ParsedFilter {
        share_group: Some(group),
        filter,
    })
}

/// Splits a shared subscription `$share/{group}/{filter}` into group and
/// filter; `None` for an ordinary filter.
pub fn split_shared(filter: &str) -> Option<(&str, &str)> {
    filter.strip_prefix(SHARE_PREFIX)?.split_once('/')
}

/// Does the valid, non-shared `filter` match the topic name `name`?
///
/// Compared a byte at a time, level by level, without splitting either:
/// every delivery of a channel record asks this of each of its consumer's
/// filters. `/` is ASCII, so a level boundary in UTF-8 is that byte.
pub fn filter_matches(filter: &str, name: &str) -> bool {
    let (f, n) = (filter.as_bytes(), name.as_bytes());
    if n.first() == Some(&b'$') && matches!(f.first(), Some(b'+' | b'#')) {
        return false;
    }
    let (mut i, mut j) = (0, 0);
    loop {
        // `i` and `j` are at the start of a level of each.
        let level_end = f[i..]
            .iter()
            .position(|&b| b == b'/')
            .map_or(f.len(), |p| i + p);
        match &f[i..level_end] {
            // A valid filter has `#` only as its last level.
            b"#" => return true,
            b"+" => {
                j = n[j..]
                    .iter()
                    .position(|&b| b == b'/')
                    .map_or(n.len(), |p| j + p);
            }
            literal => {
                let end = j + literal.len();
                if n.get(j..end) != Some(literal) || n.get(end).is_some_and(|&b| b != b'/') {
                    return false;
                }
                j = end;
            }
        }
        i = level_end;
        match (i == f.len(), j == n.len()) {
            (true, true) => return true,
            (true, false) => return false,
            // `a/#` matches `a` too.
            (false, true) => return &f[i..] == b"/#",
            (false, false) => {
                i += 1;
                j += 1;
            }
        }
    }
}

/// The levels of a valid, non-shared `filter` before its first wildcard,
/// as one string (`devices/site-7/#` gives `devices/site-7`): every topic
/// name it matches starts with it, so a store keeping topics in order
/// reads the range beginning there rather than every topic.
pub fn literal_prefix(filter: &str) -> &str {
    let mut end = 0;
    for (i, level) in filter.split('/').enumerate() {
        if level == "+" || level == "#" {
            break;
        }
        end += level.len() + usize::from(i > 0);
    }
    &filter[..end]
}

/// The least string greater than every string starting with `prefix`
/// (in byte order, which is code point order for UTF-8), or `None` when
/// there is none: the exclusive end of a prefix's range.
pub fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut code = u32::from(last) + 1;
        if (0xD800..0xE000).contains(&code) {
            code = 0xE000;
        }
        if let Some(next) = char::from_u32(code) {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Is every topic name that `topic` (a name, or a valid filter) can match
/// matched by `filter`? For a name this is [`filter_matches`]; for a
/// filter it is what an ACL grant must do to allow a SUBSCRIBE.
pub fn filter_covers(filter: &str, topic: &str) -> bool {
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    let mut first = true;
    loop {
        match (f.next(), t.next()) {
            (Some("#"), Some(level)) => return !(first && level.starts_with('$')),
            (Some("#"), None) => return true,
            (Some("+"), Some(level)) => {
                if level == "#" || (first && level.starts_with('$')) {
                    return false;
                }
            }
            (Some(fl), Some(tl)) => {
                if fl != tl {
                    return false;
                }
            }
            (None, None) => return true,
            _ => return false,
        }
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matching rules as the specification words them, level by level.
    fn matches_by_levels(filter: &str, name: &str) -> bool {
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

    #[test]
    fn filters_match_as_the_specification_says() {
        for (filter, name, expected) in [
            ("a/#", "a", true),
            ("a/#", "a/", true),
            ("#", "", true),
            ("+", "", true),
            ("a/+", "a/", true),
            ("a/+", "a", false),
            ("a", "a/b", false),
            ("a/b", "a", false),
            ("a/", "a", false),
            ("a/", "a/", true),
            ("a//b", "a//b", true),
            ("+/x", "$SYS/x", false),
            ("#", "$SYS/x", false),
            ("$SYS/#", "$SYS/x", true),
            ("telemetry/+/temp", "telemetry/site-7/temp", true),
            ("telemetry/+/temp", "telemetry/site-7/temperature", false),
            ("telemetry/site", "telemetry/site-7", false),
            ("telemetry/é/#", "telemetry/é/x", true),
        ] {
            assert_eq!(filter_matches(filter, name), expected, "{filter} / {name}");
            assert_eq!(
                matches_by_levels(filter, name),
                expected,
                "{filter} / {name}"
            );
        }
    }

    /// A valid filter: levels of `a`, `b`, `$`, `é` or empty, `+` for a
    /// whole level, `#` only as the last.
    fn filter() -> impl Strategy<Value = String> {
        let level = prop_oneof!["[ab$é]{0,2}", Just("+".to_owned())];
        (proptest::collection::vec(level, 1..5), any::<bool>()).prop_map(|(levels, hash)| {
            let mut filter = levels.join("/");
            if hash {
                filter.push_str(if filter.is_empty() { "#" } else { "/#" });
            }
            filter
        })
    }

    proptest! {
        #[test]
        fn the_byte_matcher_agrees_with_the_levels(filter in filter(), name in "[ab$é/]{0,8}") {
            prop_assert_eq!(filter_matches(&filter, &name), matches_by_levels(&filter, &name));
        }
    }

    #[test]
    fn a_filter_prefix_bounds_every_topic_it_matches() {
        assert_eq!(literal_prefix("devices/site-7/#"), "devices/site-7");
        assert_eq!(literal_prefix("devices/+/temp"), "devices");
        assert_eq!(literal_prefix("devices/a"), "devices/a");
        assert_eq!(literal_prefix("#"), "");
        assert_eq!(literal_prefix("+/x"), "");
        assert_eq!(
            prefix_end("devices/site-7").as_deref(),
            Some("devices/site-8")
        );
        assert_eq!(prefix_end("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end(""), None);
        for topic in ["devices/site-7", "devices/site-7/a", "devices/site-70/a"] {
            assert!(topic.starts_with(literal_prefix("devices/site-7/#")));
            assert!(*topic < *prefix_end("devices/site-7").unwrap());
        }
    }
    use proptest::prelude::*;

    #[test]
    fn names() {
        for ok in ["a/b", "/", "a//b", "$SYS/broker"] {
            assert_eq!(validate_topic_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(validate_topic_name(""), Err(TopicError::Empty));
        assert_eq!(validate_topic_name("a/+"), Err(TopicError::WildcardInName));
        assert_eq!(validate_topic_name("#"), Err(TopicError::WildcardInName));
        assert_eq!(validate_topic_name("a/b#"), Err(TopicError::WildcardInName));
        assert_eq!(validate_topic_name("a\0b"), Err(TopicError::Nul));
        // NUL before a wildcard, wherever each is.
        assert_eq!(validate_topic_name("a/+\0"), Err(TopicError::Nul));
        assert_eq!(
            validate_topic_name(&"a".repeat(MAX_LEN + 1)),
            Err(TopicError::TooLong)
        );
        assert_eq!(validate_topic_name(&"a".repeat(MAX_LEN)), Ok(()));
    }

    #[test]
    fn filters() {
        for ok in [
            "#",
            "+",
            "a",
            "a/b",
            "a/+/c",
            "a/#",
            "+/+",
            "/",
            "//",
            "/#",
            "a//b",
            "$SYS/#",
            "sport/tennis/+",
            "+/tennis/#",
            "$sharefoo/x",
        ] {
            assert_eq!(validate_filter(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", TopicError::Empty),
            ("a#", TopicError::MisplacedMultiLevel),
            ("a/#/b", TopicError::MisplacedMultiLevel),
            ("#/a", TopicError::MisplacedMultiLevel),
            ("sport/tennis#", TopicError::MisplacedMultiLevel),
            ("##", TopicError::MisplacedMultiLevel),
            ("a+", TopicError::MisplacedSingleLevel),
            ("a/b+/c", TopicError::MisplacedSingleLevel),
            ("++", TopicError::MisplacedSingleLevel),
            ("a/\0", TopicError::Nul),
        ] {
            assert_eq!(validate_filter(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn shared_filters() {
        assert_eq!(
            parse_filter("$share/g/a/+"),
            Ok(ParsedFilter {
                share_group: Some("g"),
                filter: "a/+"
            })
        );
        assert_eq!(
            parse_filter("a/+"),
            Ok(ParsedFilter {
                share_group: None,
                filter: "a/+"
            })
        );
        assert_eq!(split_shared("$share/g/a/+"), Some(("g", "a/+")));
        assert_eq!(split_shared("$share/g/#"), Some(("g", "#")));
        assert_eq!(split_shared("a/b"), None);
        for (bad, why) in [
            ("$share/", TopicError::NoSharedFilter),
            ("$share/g", TopicError::NoSharedFilter),
            ("$share//a", TopicError::EmptyShareName),
            ("$share/g+/a", TopicError::WildcardInShareName),
            ("$share/#/a", TopicError::WildcardInShareName),
            ("$share/g/", TopicError::Empty),
            ("$share/g/a#", TopicError::MisplacedMultiLevel),
        ] {
            assert_eq!(parse_filter(bad), Err(why), "{bad}");
        }
        assert!(TopicError::EmptyShareName.is_share_problem());
        assert!(!TopicError::Empty.is_share_problem());
    }

    #[test]
    fn why_is_the_message() {
        for e in [
            TopicError::Empty,
            TopicError::TooLong,
            TopicError::Nul,
            TopicError::WildcardInName,
            TopicError::MisplacedMultiLevel,
            TopicError::MisplacedSingleLevel,
            TopicError::NoSharedFilter,
            TopicError::EmptyShareName,
            TopicError::WildcardInShareName,
        ] {
            assert_eq!(e.why(), e.to_string());
        }
    }

    #[test]
    fn matching_rules() {
        assert!(filter_matches("a/#", "a"));
        assert!(filter_matches("a/#", "a/b/c"));
        assert!(filter_matches("a/+/c", "a/b/c"));
        assert!(!filter_matches("a/+", "a/b/c"));
        assert!(filter_matches("+/+", "/x"));
        assert!(filter_matches("#", "a/b"));
        assert!(filter_matches("a/b", "a/b"));
        assert!(!filter_matches("#", "$SYS/broker"));
        assert!(!filter_matches("+/broker", "$SYS/broker"));
        assert!(filter_matches("$SYS/#", "$SYS/broker"));
        assert!(filter_matches("a/+/#", "a/$x/y"));
    }

    #[test]
    fn covering_rules() {
        assert!(filter_covers("#", "a/b"));
        assert!(!filter_covers("#", "$SYS/x"));
        assert!(!filter_covers("+/x", "$SYS/x"));
        assert!(filter_covers("$SYS/#", "$SYS/x"));
        assert!(filter_covers("a/#", "a"));
        assert!(filter_covers("a/+", "a/b"));
        assert!(!filter_covers("a/+", "a/b/c"));
        assert!(!filter_covers("a/+", "a/#"));
        assert!(filter_covers("a/+", "a/+"));
        assert!(!filter_covers("a/b", "a/+"));
        assert!(filter_covers("a//b", "a//b"));
        assert!(filter_covers("a/#", "a/+/#"));
    }

    /// The definition, written independently of the walk above: with `#`
    /// at level k the name needs at least k levels, each of the first k
    /// equal or under `+`; without `#` the level counts are equal and each
    /// level equal or under `+`. `$` names escape a wildcard first level.
    fn reference_matches(filter: &str, name: &str) -> bool {
        let f: Vec<&str> = filter.split('/').collect();
        let n: Vec<&str> = name.split('/').collect();
        if n[0].starts_with('$') && (f[0] == "+" || f[0] == "#") {
            return false;
        }
        let level_ok = |fl: &str, nl: &str| fl == "+" || fl == nl;
        match f.iter().position(|l| *l == "#") {
            Some(k) => n.len() >= k && f[..k].iter().zip(&n).all(|(a, b)| level_ok(a, b)),
            None => f.len() == n.len() && f.iter().zip(&n).all(|(a, b)| level_ok(a, b)),
        }
    }

    /// Levels from a small alphabet, so filters and names collide often.
    fn name_strategy() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(vec!["a", "b", "", "$s"]), 1..5)
            .prop_map(|levels| levels.join("/"))
            .prop_filter("a name is not empty", |name| !name.is_empty())
    }

    fn filter_strategy() -> impl Strategy<Value = String> {
        (
            prop::collection::vec(prop::sample::select(vec!["a", "b", "", "$s", "+"]), 0..5),
            any::<bool>(),
        )
            .prop_filter_map("a filter is not empty", |(mut levels, hash)| {
                if hash {
                    levels.push("#");
                }
                let filter = levels.join("/");
                (!filter.is_empty()).then_some(filter)
            })
    }

    proptest! {
        #[test]
        fn matching_agrees_with_the_definition(filter in filter_strategy(), name in name_strategy()) {
            prop_assert_eq!(validate_filter(&filter), Ok(()));
            prop_assert_eq!(validate_topic_name(&name), Ok(()));
            prop_assert_eq!(filter_matches(&filter, &name), reference_matches(&filter, &name));
            // For a name, covering is matching.
            prop_assert_eq!(filter_covers(&filter, &name), filter_matches(&filter, &name));
        }

        #[test]
        fn a_covered_filter_only_matches_covered_names(
            outer in filter_strategy(),
            inner in filter_strategy(),
            names in prop::collection::vec(name_strategy(), 1..24),
        ) {
            if filter_covers(&outer, &inner) {
                for name in &names {
                    if filter_matches(&inner, name) {
                        prop_assert!(filter_matches(&outer, name), "{outer} covers {inner} but not {name}");
                    }
                }
            }
        }
    }
}
