//! An application message as the broker routes it: shared by every delivery
//! through an `Arc`, payload in `Bytes`, so fan-out never copies the payload.

use std::sync::OnceLock;

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
#[derive(Default)]
pub struct WireForms([OnceLock<Option<WireForm>>; 2]);

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
        &self.0[usize::from(with_id)]
    }
}

impl Clone for WireForms {
    fn clone(&self) -> Self {
        WireForms::default()
    }
}

impl std::fmt::Debug for WireForms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let encoded = self.0.iter().filter(|slot| slot.get().is_some()).count();
        write!(f, "WireForms({encoded} encoded)")
    }
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
