//! The packet model shared by MQTT 3.1.1 and 5.0.
//!
//! One set of types serves both versions: fields that exist only in MQTT 5
//! (properties, most reason codes) are simply empty/`Success` on a 3.1.1
//! connection, and the encoder leaves them out for 3.1.1.

use std::fmt;
use std::ops::Deref;

use bytes::Bytes;

use super::properties::{
    AckProperties, AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties,
    PublishProperties, SubscribeProperties, UnsubscribeProperties, WillProperties,
};
use super::reason::ReasonCode;

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

/// Every MQTT control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Connect),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(PubAck),
    PubRec(PubAck),
    PubRel(PubAck),
    PubComp(PubAck),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    Auth(Auth),
}

impl Packet {
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Connect(_) => PacketType::Connect,
            Packet::ConnAck(_) => PacketType::ConnAck,
            Packet::Publish(_) => PacketType::Publish,
            Packet::PubAck(_) => PacketType::PubAck,
            Packet::PubRec(_) => PacketType::PubRec,
            Packet::PubRel(_) => PacketType::PubRel,
            Packet::PubComp(_) => PacketType::PubComp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::SubAck(_) => PacketType::SubAck,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::UnsubAck(_) => PacketType::UnsubAck,
            Packet::PingReq => PacketType::PingReq,
            Packet::PingResp => PacketType::PingResp,
            Packet::Disconnect(_) => PacketType::Disconnect,
            Packet::Auth(_) => PacketType::Auth,
        }
    }
}

/// CONNECT: the first packet of every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// Protocol level 4 (3.1.1) or 5 (5.0); decides how every later packet
    /// on the connection is read.
    pub protocol: ProtocolVersion,
    /// "Clean Session" in 3.1.1, "Clean Start" in 5.0.
    pub clean_start: bool,
    /// Seconds; 0 turns keep alive off.
    pub keep_alive: u16,
    /// May be empty (the server then assigns one, or refuses).
    pub client_id: String,
    pub will: Option<LastWill>,
    pub username: Option<String>,
    /// Binary data, not a string.
    pub password: Option<Bytes>,
    /// MQTT 5 only; default on 3.1.1.
    pub properties: ConnectProperties,
}

/// The Will message carried in CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastWill {
    pub topic: ByteStr,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// MQTT 5 only.
    pub properties: WillProperties,
}

/// CONNACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnAck {
    pub session_present: bool,
    /// `Success` to accept. On 3.1.1 mapped to the nearest connect return
    /// code ([`ReasonCode::to_v311_connack`]).
    pub reason: ReasonCode,
    /// MQTT 5 only.
    pub properties: ConnAckProperties,
}

/// PUBLISH. `topic` and `payload` are slices of the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty only when a topic alias stands for it (MQTT 5).
    pub topic: ByteStr,
    /// 0 for QoS 0 (absent on the wire); nonzero for QoS 1 and 2.
    pub packet_id: u16,
    pub properties: PublishProperties,
    pub payload: Bytes,
}

/// A PUBACK, PUBREC, PUBREL or PUBCOMP without properties: its kind and
/// packet identifier (decoded in the short form, which means reason
/// Success; encoded with a reason by [`super::encode_ack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    PubAck(u16),
    PubRec(u16),
    PubRel(u16),
    PubComp(u16),
}

impl Ack {
    pub fn packet_type(self) -> PacketType {
        match self {
            Ack::PubAck(_) => PacketType::PubAck,
            Ack::PubRec(_) => PacketType::PubRec,
            Ack::PubRel(_) => PacketType::PubRel,
            Ack::PubComp(_) => PacketType::PubComp,
        }
    }

    pub fn packet_id(self) -> u16 {
        match self {
            Ack::PubAck(id) | Ack::PubRec(id) | Ack::PubRel(id) | Ack::PubComp(id) => id,
        }
    }
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share one shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubAck {
    pub packet_id: u16,
    /// MQTT 5; always `Success` on 3.1.1.
    pub reason: ReasonCode,
    pub properties: AckProperties,
}

impl PubAck {
    /// A success acknowledgement with no properties (the short form).
    pub fn new(packet_id: u16) -> PubAck {
        PubAck {
            packet_id,
            reason: ReasonCode::Success,
            properties: AckProperties::default(),
        }
    }
}

/// What to do with retained messages when a subscription is made (MQTT 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RetainHandling {
    /// Send retained messages at the time of the subscribe.
    #[default]
    OnSubscribe = 0,
    /// Send them only if the subscription did not exist before.
    OnNewSubscribe = 1,
    /// Never send retained messages for this subscription.
    DoNotSend = 2,
}

impl RetainHandling {
    pub fn from_u8(value: u8) -> Option<RetainHandling> {
        match value {
            0 => Some(RetainHandling::OnSubscribe),
            1 => Some(RetainHandling::OnNewSubscribe),
            2 => Some(RetainHandling::DoNotSend),
            _ => None,
        }
    }
}

/// The options byte of one SUBSCRIBE entry. On 3.1.1 only `qos` is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: RetainHandling,
}

/// One topic filter of a SUBSCRIBE with its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    /// Validated: wildcards well placed, `$share/G/f` well formed.
    pub filter: String,
    pub options: SubscriptionOptions,
}

/// SUBSCRIBE: at least one filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: u16,
    pub filters: Vec<SubscribeFilter>,
    pub properties: SubscribeProperties,
}

/// SUBACK: one reason code per filter, in order. On 3.1.1 only granted QoS
/// 0/1/2 and 0x80 exist; other failure codes are sent as 0x80.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: u16,
    pub reasons: Vec<ReasonCode>,
    pub properties: AckProperties,
}

/// UNSUBSCRIBE: at least one filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub filters: Vec<String>,
    pub properties: UnsubscribeProperties,
}

/// UNSUBACK: one reason code per filter on MQTT 5, none on 3.1.1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubAck {
    pub packet_id: u16,
    pub reasons: Vec<ReasonCode>,
    pub properties: AckProperties,
}

/// DISCONNECT. On 3.1.1 it has no body (reason `NormalDisconnection`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    pub reason: ReasonCode,
    pub properties: DisconnectProperties,
}

impl Disconnect {
    pub fn new(reason: ReasonCode) -> Disconnect {
        Disconnect {
            reason,
            properties: DisconnectProperties::default(),
        }
    }
}

/// AUTH (MQTT 5 only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    pub reason: ReasonCode,
    pub properties: AuthProperties,
}
