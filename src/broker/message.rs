//! An application message as the broker routes it: shared by every delivery
//! through an `Arc`, payload in `Bytes`, so fan-out never copies the payload.

use bytes::Bytes;
use tokio::time::Instant;

use super::codec::{ByteStr, PublishProperties};

/// MQTT 5 publication properties are forwarded unchanged: the codec's own
/// type, with topic alias and subscription identifiers left empty (they are
/// per connection / per delivery and set by the writer).
pub type MessageProperties = PublishProperties;

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
}

impl Message {
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

    /// Bytes of the MQTT 5 properties this message carries when forwarded
    /// (without subscription identifiers), for the maximum-packet-size check.
    pub fn v5_properties_len(&self) -> usize {
        let p = &self.properties;
        let mut n = 0;
        if p.payload_format_indicator.is_some() {
            n += 2;
        }
        if p.message_expiry_interval.is_some() {
            n += 5;
        }
        if let Some(c) = &p.content_type {
            n += 3 + c.len();
        }
        if let Some(r) = &p.response_topic {
            n += 3 + r.len();
        }
        if let Some(c) = &p.correlation_data {
            n += 3 + c.len();
        }
        for (k, v) in &p.user_properties {
            n += 5 + k.len() + v.len();
        }
        n
    }
}

/// Bytes a variable byte integer takes.
pub fn varint_len(value: usize) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// The size of the PUBLISH packet carrying `message` to a client: used to
/// honour the client's maximum packet size before sending.
pub fn publish_packet_len(message: &Message, qos: u8, v5: bool, subscription_ids: &[u32]) -> usize {
    let mut remaining = 2 + message.topic.len() + message.payload.len();
    if qos > 0 {
        remaining += 2;
    }
    if v5 {
        let mut props = message.v5_properties_len();
        for id in subscription_ids {
            props += 1 + varint_len(*id as usize);
        }
        remaining += varint_len(props) + props;
    }
    1 + varint_len(remaining) + remaining
}
