//! Topic name and topic filter syntax (MQTT 5 §4.7, shared subscriptions
//! §4.8.2). Shared by both protocol versions.

use super::error::DecodeError;
use super::packet::PacketType;

/// The prefix that makes a filter a shared subscription.
pub const SHARE_PREFIX: &str = "$share/";

/// A topic name (what PUBLISH and Will carry): at least one character, no
/// wildcard (MQTT-3.3.2-2, MQTT-4.7.3-1). Empty names are refused by the
/// caller where an alias may stand in.
pub fn validate_topic_name(packet: PacketType, topic: &str) -> Result<(), DecodeError> {
    let why = if topic.is_empty() {
        "it is empty"
    } else if topic.contains(['+', '#']) {
        "a topic name may not contain the wildcards + or #"
    } else {
        return Ok(());
    };
    Err(DecodeError::InvalidTopicName {
        packet,
        topic: topic.to_owned(),
        why,
    })
}

/// A Response Topic (PUBLISH, Will properties): a valid topic name
/// (MQTT-3.3.2-14), refused as a protocol error.
pub fn validate_response_topic(packet: PacketType, topic: &str) -> Result<(), DecodeError> {
    match validate_topic_name(packet, topic) {
        Err(DecodeError::InvalidTopicName { topic, why, .. }) => {
            Err(DecodeError::InvalidResponseTopic { packet, topic, why })
        }
        other => other,
    }
}

/// Why a plain (non-shared) topic filter is malformed, if it is.
fn filter_problem(filter: &str) -> Option<&'static str> {
    if filter.is_empty() {
        return Some("it is empty");
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return Some("# must be a whole level and the last one");
        }
        if level.contains('+') && level != "+" {
            return Some("+ must be a whole level");
        }
    }
    None
}

/// A topic filter (SUBSCRIBE, UNSUBSCRIBE): wildcards well placed
/// (MQTT-4.7.1-1, -4.7.1-2) and, for `$share/{group}/{filter}`, a
/// non-empty group without wildcards or `/` followed by a valid filter
/// (MQTT-4.8.2-1, -4.8.2-2).
pub fn validate_topic_filter(packet: PacketType, filter: &str) -> Result<(), DecodeError> {
    if let Some(rest) = filter.strip_prefix(SHARE_PREFIX) {
        let shared = |why| DecodeError::InvalidSharedSubscription {
            packet,
            filter: filter.to_owned(),
            why,
        };
        let Some((group, inner)) = rest.split_once('/') else {
            return Err(shared("no topic filter after the share name"));
        };
        if group.is_empty() {
            return Err(shared("the share name is empty"));
        }
        if group.contains(['+', '#']) {
            return Err(shared("the share name may not contain + or #"));
        }
        if let Some(why) = filter_problem(inner) {
            return Err(shared(why));
        }
        return Ok(());
    }
    if let Some(why) = filter_problem(filter) {
        return Err(DecodeError::InvalidTopicFilter {
            packet,
            filter: filter.to_owned(),
            why,
        });
    }
    Ok(())
}

/// Like [`validate_topic_filter`], except that a `$share/` filter which is
/// not a valid shared subscription but is a well-formed topic filter
/// passes: the server refuses it for that filter only (SUBACK 0x8F, "the
/// Topic Filter is correctly formed but is not allowed"), the packet's other
/// filters still count.
pub fn validate_topic_filter_syntax(packet: PacketType, filter: &str) -> Result<(), DecodeError> {
    match validate_topic_filter(packet, filter) {
        Err(DecodeError::InvalidSharedSubscription { .. }) if filter_problem(filter).is_none() => {
            Ok(())
        }
        other => other,
    }
}

/// Splits a validated shared subscription `$share/{group}/{filter}` into
/// group and filter; `None` for an ordinary filter.
pub fn split_shared(filter: &str) -> Option<(&str, &str)> {
    filter.strip_prefix(SHARE_PREFIX)?.split_once('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: PacketType = PacketType::Subscribe;

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
        ] {
            assert_eq!(validate_topic_filter(P, ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "a#",
            "a/#/b",
            "#/a",
            "a+",
            "a/b+/c",
            "sport/tennis#",
            "++",
            "##",
        ] {
            assert!(
                matches!(
                    validate_topic_filter(P, bad),
                    Err(DecodeError::InvalidTopicFilter { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn shared() {
        assert_eq!(validate_topic_filter(P, "$share/g/a/+"), Ok(()));
        assert_eq!(split_shared("$share/g/a/+"), Some(("g", "a/+")));
        assert_eq!(split_shared("$share/g/#"), Some(("g", "#")));
        assert_eq!(split_shared("a/b"), None);
        // "$sharefoo" is an ordinary filter.
        assert_eq!(validate_topic_filter(P, "$sharefoo/x"), Ok(()));
        for bad in [
            "$share/",
            "$share/g",
            "$share//a",
            "$share/g+/a",
            "$share/#/a",
            "$share/g/",
            "$share/g/a#",
        ] {
            assert!(
                matches!(
                    validate_topic_filter(P, bad),
                    Err(DecodeError::InvalidSharedSubscription { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn names() {
        assert_eq!(validate_topic_name(PacketType::Publish, "a/b"), Ok(()));
        assert_eq!(validate_topic_name(PacketType::Publish, "/"), Ok(()));
        for bad in ["", "a/+", "#", "a/b#"] {
            assert!(
                validate_topic_name(PacketType::Publish, bad).is_err(),
                "{bad}"
            );
        }
    }
}
