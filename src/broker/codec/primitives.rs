//! The protocol's primitive types, which every other part of the codec
//! names: the version a connection speaks, a QoS, a packet's type and a
//! UTF-8 string shared with the buffer it was read from.

use std::fmt;
use std::ops::Deref;

use bytes::Bytes;

/// The protocol version a connection speaks, learned from its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolVersion {
    /// MQTT 3.1.1 (protocol level 4).
    V311,
    /// MQTT 5.0 (protocol level 5).
    V5,
}

impl ProtocolVersion {
    /// The protocol level byte carried in CONNECT.
    pub fn level(self) -> u8 {
        match self {
            ProtocolVersion::V311 => 4,
            ProtocolVersion::V5 => 5,
        }
    }

    /// The version for a CONNECT protocol level, if supported.
    pub fn from_level(level: u8) -> Option<Self> {
        match level {
            4 => Some(ProtocolVersion::V311),
            5 => Some(ProtocolVersion::V5),
            _ => None,
        }
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProtocolVersion::V311 => "MQTT 3.1.1",
            ProtocolVersion::V5 => "MQTT 5.0",
        })
    }
}

/// Quality of service of a PUBLISH or granted to a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum QoS {
    #[default]
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS for its two-bit value; 3 is not a QoS.
    pub fn from_u8(value: u8) -> Option<QoS> {
        match value {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }

    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// The control packet type, the high nibble of the first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketType {
    Connect = 1,
    ConnAck = 2,
    Publish = 3,
    PubAck = 4,
    PubRec = 5,
    PubRel = 6,
    PubComp = 7,
    Subscribe = 8,
    SubAck = 9,
    Unsubscribe = 10,
    UnsubAck = 11,
    PingReq = 12,
    PingResp = 13,
    Disconnect = 14,
    Auth = 15,
}

impl PacketType {
    /// The type for the high nibble of a fixed header; 0 is reserved.
    pub fn from_nibble(nibble: u8) -> Option<PacketType> {
        Some(match nibble {
            1 => PacketType::Connect,
            2 => PacketType::ConnAck,
            3 => PacketType::Publish,
            4 => PacketType::PubAck,
            5 => PacketType::PubRec,
            6 => PacketType::PubRel,
            7 => PacketType::PubComp,
            8 => PacketType::Subscribe,
            9 => PacketType::SubAck,
            10 => PacketType::Unsubscribe,
            11 => PacketType::UnsubAck,
            12 => PacketType::PingReq,
            13 => PacketType::PingResp,
            14 => PacketType::Disconnect,
            15 => PacketType::Auth,
            _ => return None,
        })
    }

    /// Whether a client may send this type to a server (AUTH and DISCONNECT
    /// go both ways).
    pub fn is_client_to_server(self) -> bool {
        !matches!(
            self,
            PacketType::ConnAck | PacketType::SubAck | PacketType::UnsubAck | PacketType::PingResp
        )
    }

    /// Whether a server may send this type to a client.
    pub fn is_server_to_client(self) -> bool {
        !matches!(
            self,
            PacketType::Connect
                | PacketType::Subscribe
                | PacketType::Unsubscribe
                | PacketType::PingReq
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            PacketType::Connect => "CONNECT",
            PacketType::ConnAck => "CONNACK",
            PacketType::Publish => "PUBLISH",
            PacketType::PubAck => "PUBACK",
            PacketType::PubRec => "PUBREC",
            PacketType::PubRel => "PUBREL",
            PacketType::PubComp => "PUBCOMP",
            PacketType::Subscribe => "SUBSCRIBE",
            PacketType::SubAck => "SUBACK",
            PacketType::Unsubscribe => "UNSUBSCRIBE",
            PacketType::UnsubAck => "UNSUBACK",
            PacketType::PingReq => "PINGREQ",
            PacketType::PingResp => "PINGRESP",
            PacketType::Disconnect => "DISCONNECT",
            PacketType::Auth => "AUTH",
        }
    }
}

impl fmt::Display for PacketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A UTF-8 string backed by `Bytes`: decoding a PUBLISH topic slices the
/// input buffer instead of allocating. The invariant (valid UTF-8) is upheld
/// by every constructor.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ByteStr(Bytes);

impl ByteStr {
    pub const fn from_static(s: &'static str) -> ByteStr {
        ByteStr(Bytes::from_static(s.as_bytes()))
    }

    /// Wraps bytes if they are UTF-8; `None` if they are not.
    pub fn from_utf8(bytes: Bytes) -> Option<ByteStr> {
        std::str::from_utf8(&bytes).ok()?;
        Some(ByteStr(bytes))
    }

    /// Wraps bytes the decoder has just validated as UTF-8, so the hot
    /// PUBLISH path validates each topic once.
    pub(super) fn from_validated(bytes: Bytes) -> ByteStr {
        debug_assert!(std::str::from_utf8(&bytes).is_ok());
        ByteStr(bytes)
    }

    pub fn as_str(&self) -> &str {
        // SAFETY: every constructor (`from_static`, `from_utf8`, `From<String>`,
        // `From<&str>`, `from_validated` after `str::from_utf8`) only admits
        // valid UTF-8, and the bytes are immutable afterwards.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }

    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }

    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl Deref for ByteStr {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for ByteStr {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for ByteStr {
    fn from(s: String) -> ByteStr {
        ByteStr(Bytes::from(s))
    }
}

impl From<&str> for ByteStr {
    fn from(s: &str) -> ByteStr {
        ByteStr(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl PartialEq<str> for ByteStr {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ByteStr {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Debug for ByteStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ByteStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
