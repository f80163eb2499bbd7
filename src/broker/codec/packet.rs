//! The packet model shared by MQTT 3.1.1 and 5.0.
//!
//! One set of types serves both versions: fields that exist only in MQTT 5
//! (properties, most reason codes) are simply empty/`Success` on a 3.1.1
//! connection, and the encoder leaves them out for 3.1.1.

use bytes::Bytes;

use super::primitives::{ByteStr, PacketType, ProtocolVersion, QoS};
use super::properties::{
    AckProperties, AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties,
    PublishProperties, SubscribeProperties, UnsubscribeProperties, WillProperties,
};
use super::reason::ReasonCode;

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
