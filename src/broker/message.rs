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
}
