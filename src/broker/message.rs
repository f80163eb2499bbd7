//! An application message as the broker routes it: shared by every delivery
//! through an `Arc`, payload in `Bytes`, so fan-out never copies the payload.

use std::num::NonZeroU64;
use std::sync::OnceLock;

use bytes::Bytes;
use once_cell::race::OnceBox;
use tokio::time::Instant;

use super::codec::{ByteStr, PublishProperties};
use super::lazy::{empty, Lazy};

/// MQTT 5 publication properties, forwarded unchanged: the codec's own
/// type, with topic alias and subscription identifiers left empty (they are
/// per connection / per delivery and set by the writer).
///
/// Kept out of line, and only when there are any: most messages - every
/// MQTT 3.1.1 publish, a retained sensor reading - carry none, and the
/// codec's type is 160 bytes a message would hold for nothing (a million
/// retained messages, 160 MB). Read through `Deref` (no properties reads as
/// the empty set); the first change through `DerefMut` allocates them.
pub type MessageProperties = Lazy<PublishProperties>;

empty!(
    PublishProperties,
    PublishProperties {
        payload_format_indicator: None,
        message_expiry_interval: None,
        topic_alias: None,
        response_topic: None,
        correlation_data: None,
        user_properties: Vec::new(),
        subscription_identifiers: Vec::new(),
        content_type: None,
    }
);

impl From<PublishProperties> for MessageProperties {
    /// Empty properties are not kept. Told field by field: a comparison
    /// with the empty set compared each list's bytes, on every channel
    /// record a consumer is sent.
    fn from(properties: PublishProperties) -> Self {
        let PublishProperties {
            payload_format_indicator,
            message_expiry_interval,
            topic_alias,
            response_topic,
            correlation_data,
            user_properties,
            subscription_identifiers,
            content_type,
        } = &properties;
        let empty = payload_format_indicator.is_none()
            && message_expiry_interval.is_none()
            && topic_alias.is_none()
            && response_topic.is_none()
            && correlation_data.is_none()
            && user_properties.is_empty()
            && subscription_identifiers.is_empty()
            && content_type.is_none();
        if empty {
            Lazy::new()
        } else {
            Lazy::boxed(properties)
        }
    }
}

/// The message expiry interval has passed: the message is not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired;

/// A publication accepted by the broker.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: ByteStr,
    pub payload: Bytes,
    pub qos: u8,
    pub retain: bool,
    pub properties: MessageProperties,
    /// When the broker accepted it: the message expiry counts from here.
    pub received_at: Instant,
    /// A channel record's offset, sent to MQTT 5 consumers as the User
    /// Property [`OFFSET_PROPERTY`] after the publisher's (see
    /// [`Message::offset_property`]). Kept as a number rather than among the
    /// properties: a record's message is made for every record its
    /// consumers read, and the property was three allocations of it that
    /// an MQTT 3.1.1 consumer never sees.
    pub channel_offset: Option<NonZeroU64>,
    /// Its MQTT 5 PUBLISH as most deliveries send it, encoded once by the
    /// first connection writer that sends it and copied by the others.
    /// Last in the struct: away from the reference counts the state
    /// changes.
    pub wire: WireForms,
}

/// A message's MQTT 5 PUBLISH bytes as every delivery of one kind sends
/// them (see [`WireForms::shape`]), each encoded the first time a writer
/// needs it. The packet identifier and the DUP, QoS and RETAIN bits are
/// each delivery's own, written over the copy.
///
/// MQTT 3.1.1 has none: its PUBLISH is the topic, the identifier and the
/// payload, so encoding it is the copy, and a form kept would cost an
/// allocation a message for nothing. An MQTT 5 PUBLISH carries the
/// message's properties (the publisher's user properties, a channel's
/// `saguin-offset`), measured and written once here instead of once a
/// delivery.
///
/// Cloning a message clones none of them: a clone may be given another
/// topic or payload.
///
/// The two slots are allocated with the first form: a message no MQTT 5
/// client receives - most retained messages, every channel record a 3.1.1
/// consumer reads - holds one empty word for them instead of 64 bytes.
#[derive(Default)]
pub struct WireForms(OnceBox<[OnceLock<Option<WireForm>>; 2]>);

/// One shape's bytes.
#[derive(Debug)]
pub struct WireForm {
    pub bytes: Box<[u8]>,
    /// Where the packet identifier is (QoS 1 and 2 forms).
    pub packet_id_at: usize,
}

impl WireForms {
    /// The slot of the form with a packet identifier (QoS 1 and 2) or
    /// without (QoS 0).
    pub fn shape(&self, with_id: bool) -> &OnceLock<Option<WireForm>> {
        &self.0.get_or_init(Box::default)[usize::from(with_id)]
    }
}

impl Clone for WireForms {
    fn clone(&self) -> Self {
        WireForms::default()
    }
}

impl std::fmt::Debug for WireForms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let encoded = self.0.get().map_or(0, |slots| {
            slots.iter().filter(|s| s.get().is_some()).count()
        });
        write!(f, "WireForms({encoded} encoded)")
    }
}

/// The user property every delivery of a channel record carries: its offset.
pub const OFFSET_PROPERTY: &str = "saguin-offset";

/// Room for a `u64` written in decimal.
pub type DecimalBuf = itoa::Buffer;

impl Message {
    /// What it counts against `limits.max_queued_bytes`: its topic and
    /// payload, the bytes a queue waiting for a client holds on to.
    pub fn queued_bytes(&self) -> u64 {
        (self.topic.len() + self.payload.len()) as u64
    }

    /// The [`OFFSET_PROPERTY`] a delivery of this message adds after the
    /// publisher's user properties, its value written into `buf`: `None`
    /// for a message that is not a channel record's (or carries its offset
    /// among its properties, beside a gap).
    pub fn offset_property<'b>(&self, buf: &'b mut DecimalBuf) -> Option<(&'static str, &'b str)> {
        Some((OFFSET_PROPERTY, buf.format(self.channel_offset?.get())))
    }

    /// Seconds of expiry left at `now`: `Ok(None)` when the message never
    /// expires, `Err(Expired)` when its interval has passed.
    pub fn expiry_left(&self, now: Instant) -> Result<Option<u32>, Expired> {
        match self.properties.message_expiry_interval {
            None => Ok(None),
            Some(interval) => {
                let elapsed = now.saturating_duration_since(self.received_at).as_secs();
                let elapsed = u32::try_from(elapsed).unwrap_or(u32::MAX);
                if elapsed >= interval {
                    Err(Expired)
                } else {
                    Ok(Some(interval - elapsed))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(properties: MessageProperties) -> Message {
        Message {
            topic: ByteStr::from("site/7/device/1234567"),
            payload: Bytes::from_static(&[b'x'; 64]),
            qos: 1,
            retain: true,
            properties,
            received_at: Instant::now(),
            channel_offset: None,
            wire: WireForms::default(),
        }
    }

    /// A retained message is kept behind an `Arc` for as long as it is
    /// retained: with its allocation's header it fits the allocator's
    /// 128-byte class. It was 248 bytes with the properties and both wire
    /// forms' slots inline.
    #[test]
    fn a_message_stays_small() {
        let message = std::mem::size_of::<Message>();
        assert!(message <= 112, "a message is {message} bytes");
        assert_eq!(std::mem::size_of::<MessageProperties>(), 8);
        assert_eq!(std::mem::size_of::<WireForms>(), 8);
    }

    /// A channel record's offset, kept as a number, reads back as the
    /// property it stands for; a message without one has none.
    #[test]
    fn a_kept_offset_reads_as_its_property() {
        let mut buf = DecimalBuf::default();
        let mut m = message(MessageProperties::default());
        assert_eq!(m.offset_property(&mut buf), None);
        for n in [1, 9, 10, 4_294_967_296, u64::MAX] {
            m.channel_offset = NonZeroU64::new(n);
            let expected = n.to_string();
            assert_eq!(
                m.offset_property(&mut buf),
                Some((OFFSET_PROPERTY, expected.as_str()))
            );
        }
    }

    #[test]
    fn a_message_without_properties_holds_no_allocation_for_them() {
        let none = message(MessageProperties::default());
        assert!(!none.properties.is_allocated());
        assert_eq!(none.properties.message_expiry_interval, None);
        assert!(none.properties.user_properties.is_empty());
        // The codec's empty properties, as a decoded PUBLISH without any
        // carries them, are not kept either.
        let decoded = MessageProperties::from(PublishProperties::default());
        assert!(!decoded.is_allocated());
        assert_eq!(decoded, MessageProperties::default());
        // Nor is anything allocated for the wire forms until one is made.
        assert!(none.wire.0.get().is_none());
    }

    #[test]
    fn properties_are_allocated_when_set_and_read_back_as_set() {
        let expiring = MessageProperties::from(PublishProperties {
            message_expiry_interval: Some(30),
            ..PublishProperties::default()
        });
        assert!(expiring.is_allocated());
        assert_eq!(expiring.message_expiry_interval, Some(30));
        assert_eq!(
            expiring.clone().into_inner().message_expiry_interval,
            Some(30)
        );

        // The first change allocates them; reading never does.
        let mut offset = message(MessageProperties::default());
        assert_eq!(offset.expiry_left(offset.received_at), Ok(None));
        assert!(!offset.properties.is_allocated());
        offset
            .properties
            .user_properties
            .push(("saguin-offset".into(), "7".into()));
        assert!(offset.properties.is_allocated());
        assert_eq!(
            offset.properties.user_properties,
            [("saguin-offset".to_owned(), "7".to_owned())]
        );
        // A clone of the message carries them; its wire forms start empty.
        let _ = offset.wire.shape(false).set(None);
        let clone = offset.clone();
        assert_eq!(clone.properties, offset.properties);
        assert!(clone.wire.0.get().is_none());
        // Set and cleared again, they equal none.
        offset.properties.user_properties.clear();
        assert_eq!(offset.properties, MessageProperties::default());
    }
}
