//! The codec's errors for topic names and filters (MQTT 5 §4.7, shared
//! subscriptions §4.8.2; both protocol versions). The rules themselves are
//! [`crate::topic`]'s; this module says which packet error each refusal is.

use super::error::DecodeError;
use super::primitives::PacketType;
use crate::topic;

pub use crate::topic::split_shared;

/// A topic name (what PUBLISH and Will carry). Empty names are refused by
/// the caller where an alias may stand in.
pub fn validate_topic_name(packet: PacketType, name: &str) -> Result<(), DecodeError> {
    topic::validate_topic_name(name).map_err(|e| DecodeError::InvalidTopicName {
        packet,
        topic: name.to_owned(),
        why: e.why(),
    })
}

/// A Response Topic (PUBLISH, Will properties): a valid topic name
/// (MQTT-3.3.2-14), refused as a protocol error.
pub fn validate_response_topic(packet: PacketType, name: &str) -> Result<(), DecodeError> {
    topic::validate_topic_name(name).map_err(|e| DecodeError::InvalidResponseTopic {
        packet,
        topic: name.to_owned(),
        why: e.why(),
    })
}

/// A topic filter (SUBSCRIBE, UNSUBSCRIBE), `$share/{group}/{filter}`
/// included: a `$share/` filter that is not a valid shared subscription is
/// an invalid shared subscription, whatever part of it is wrong.
pub fn validate_topic_filter(packet: PacketType, filter: &str) -> Result<(), DecodeError> {
    topic::parse_filter(filter).map(|_| ()).map_err(|e| {
        if filter.starts_with(topic::SHARE_PREFIX) {
            DecodeError::InvalidSharedSubscription {
                packet,
                filter: filter.to_owned(),
                why: e.why(),
            }
        } else {
            DecodeError::InvalidTopicFilter {
                packet,
                filter: filter.to_owned(),
                why: e.why(),
            }
        }
    })
}

/// Like [`validate_topic_filter`], except that a `$share/` filter which is
/// not a valid shared subscription but is a well-formed topic filter
/// passes: the server refuses it for that filter only (SUBACK 0x8F, "the
/// Topic Filter is correctly formed but is not allowed"), the packet's other
/// filters still count.
pub fn validate_topic_filter_syntax(packet: PacketType, filter: &str) -> Result<(), DecodeError> {
    match validate_topic_filter(packet, filter) {
        Err(DecodeError::InvalidSharedSubscription { .. })
            if topic::validate_filter(filter).is_ok() =>
        {
            Ok(())
        }
        other => other,
    }
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
