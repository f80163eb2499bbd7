//! Decode and encode errors. Every refusal is its own variant naming what was
//! wrong and where (`at` is the byte offset inside the packet, counted from
//! the first byte of the fixed header), and maps to the MQTT 5 reason code a
//! server sends in CONNACK or DISCONNECT before closing the connection.

use thiserror::Error;

use super::primitives::PacketType;
use super::reason::ReasonCode;

/// Why received bytes are not an acceptable MQTT packet. Always fatal to the
/// connection (MQTT 5 §4.13): the broker answers with
/// [`DecodeError::reason_code`] (CONNACK if no CONNACK was sent yet, else
/// DISCONNECT; nothing on 3.1.1) and closes.
///
/// A refused CONNECT leaves the decoder's version unknown. For
/// [`DecodeError::UnsupportedProtocolVersion`] and
/// [`DecodeError::InvalidProtocolName`] the answer is a 3.1.1-format CONNACK
/// with return code 0x01 (MQTT 3.1.1 MQTT-3.1.2-2; 3.1 clients read the same
/// two bytes; MQTT 5 allows 0x84 but a client of another version could not
/// read it); for any other refused CONNECT the server may simply close.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The remaining length's fourth byte still has its continuation bit set.
    #[error("remaining length is longer than 4 bytes")]
    MalformedRemainingLength,

    /// Known from the fixed header alone, before the body is buffered.
    #[error("{packet} of {size} bytes exceeds the maximum packet size of {max} bytes")]
    PacketTooLarge {
        packet: PacketType,
        size: u64,
        max: u32,
    },

    /// Packet type 0, or AUTH (15) on an MQTT 3.1.1 connection.
    #[error("reserved packet type {nibble} in fixed header byte 0x{byte:02X}")]
    ReservedPacketType { nibble: u8, byte: u8 },

    /// Fixed-header flag bits other than those MQTT prescribes for the type.
    #[error("{packet}: fixed header flags 0b{flags:04b} are not allowed (MQTT 2.1.3)")]
    InvalidFixedHeaderFlags { packet: PacketType, flags: u8 },

    /// A packet that may not arrive now or in this direction: anything before
    /// CONNECT, a second CONNECT, a server-only packet sent by a client.
    #[error("{packet} not expected: {why}")]
    UnexpectedPacket {
        packet: PacketType,
        why: &'static str,
    },

    /// The body ends inside a field.
    #[error("{packet}: body ends inside {field} at byte {at}")]
    Truncated {
        packet: PacketType,
        field: &'static str,
        at: usize,
    },

    /// A variable byte integer longer than 4 bytes or not minimally encoded.
    #[error("{packet}: {field} at byte {at} is not a valid variable byte integer")]
    MalformedVariableByteInteger {
        packet: PacketType,
        field: &'static str,
        at: usize,
    },

    /// Bytes left over after the last field the packet type defines.
    #[error("{packet}: {count} unexpected trailing bytes at byte {at}")]
    TrailingBytes {
        packet: PacketType,
        count: usize,
        at: usize,
    },

    /// Not UTF-8 (which includes encoded surrogates, MQTT-1.5.4-1).
    #[error("{packet}: {field} at byte {at} is not valid UTF-8")]
    InvalidUtf8 {
        packet: PacketType,
        field: &'static str,
        at: usize,
    },

    /// U+0000 inside a string (MQTT-1.5.4-2).
    #[error("{packet}: {field} at byte {at} contains U+0000")]
    NullCharacter {
        packet: PacketType,
        field: &'static str,
        at: usize,
    },

    /// CONNECT's protocol name is neither "MQTT" nor "MQIsdp".
    #[error("CONNECT: protocol name {name:?} is not \"MQTT\"")]
    InvalidProtocolName { name: String },

    /// A protocol level this server does not speak (3 = MQTT 3.1 "MQIsdp").
    #[error("CONNECT: protocol level {level} is not supported (4 = MQTT 3.1.1, 5 = MQTT 5.0)")]
    UnsupportedProtocolVersion { level: u8 },

    /// Bit 0 of the CONNECT flags is reserved and must be 0 (MQTT-3.1.2-3).
    #[error("CONNECT: reserved flag bit 0 is set")]
    ReservedConnectFlag,

    /// Reserved bits set in a flags byte of the variable header (CONNACK
    /// acknowledge flags, MQTT-3.2.2-1).
    #[error("{packet}: reserved bits set in {field} 0x{value:02X} at byte {at}")]
    ReservedBits {
        packet: PacketType,
        field: &'static str,
        value: u8,
        at: usize,
    },

    /// Will QoS 3 (MQTT-3.1.2-12).
    #[error("CONNECT: Will QoS is 3")]
    InvalidWillQoS,

    /// Will QoS or Will Retain set without the Will flag (MQTT-3.1.2-11/13).
    #[error("CONNECT: Will QoS or Will Retain set while the Will flag is 0")]
    WillFlagsWithoutWill,

    /// MQTT 3.1.1 forbids a password without a user name (MQTT-3.1.2-22).
    #[error("CONNECT: password flag set without the user name flag")]
    PasswordWithoutUsername,

    /// Both QoS bits set (MQTT-3.3.1-4).
    #[error("{packet}: QoS 3 is not a QoS")]
    InvalidQoS { packet: PacketType },

    /// DUP must be 0 on QoS 0 (MQTT-3.3.1-2).
    #[error("PUBLISH: DUP set on a QoS 0 message")]
    DupWithQoS0,

    /// Packet identifier 0 where one is required (MQTT-2.2.1-3).
    #[error("{packet}: packet identifier is 0")]
    ZeroPacketId { packet: PacketType },

    /// A topic name with wildcards or otherwise not allowed.
    #[error("{packet}: topic name {topic:?} is invalid: {why}")]
    InvalidTopicName {
        packet: PacketType,
        topic: String,
        why: &'static str,
    },

    /// A Response Topic that is no valid topic name: empty or with a
    /// wildcard (MQTT-3.3.2-14). A protocol error, not "Topic Name
    /// invalid", which is about the PUBLISH's own topic.
    #[error("{packet}: response topic {topic:?} is invalid: {why}")]
    InvalidResponseTopic {
        packet: PacketType,
        topic: String,
        why: &'static str,
    },

    /// Zero-length topic and no topic alias (MQTT 5 §3.3.2.1); on 3.1.1 a
    /// topic must always be at least one character (MQTT-4.7.3-1).
    #[error("PUBLISH: empty topic name without a topic alias")]
    EmptyTopic,

    /// A topic filter whose wildcards are misplaced, or that is empty.
    #[error("{packet}: topic filter {filter:?} is invalid: {why}")]
    InvalidTopicFilter {
        packet: PacketType,
        filter: String,
        why: &'static str,
    },

    /// `$share/{group}/{filter}` with a bad group or missing filter.
    #[error("{packet}: shared subscription {filter:?} is invalid: {why}")]
    InvalidSharedSubscription {
        packet: PacketType,
        filter: String,
        why: &'static str,
    },

    /// No Local on a shared subscription (MQTT-3.8.3-4).
    #[error("SUBSCRIBE: No Local set on shared subscription {filter:?}")]
    SharedSubscriptionNoLocal { filter: String },

    /// SUBSCRIBE/UNSUBSCRIBE without any filter (MQTT-3.8.3-2, -3.10.3-2).
    #[error("{packet} carries no topic filter")]
    NoTopicFilters { packet: PacketType },

    /// Reserved bits of subscription options set (MQTT-3.8.3-5).
    #[error("SUBSCRIBE: reserved bits set in the options 0x{options:02X} of {filter:?}")]
    ReservedSubscriptionOptions { filter: String, options: u8 },

    /// Retain Handling 3 (MQTT 5 §3.8.3.1).
    #[error("SUBSCRIBE: retain handling 3 for {filter:?}")]
    InvalidRetainHandling { filter: String },

    /// A property identifier that does not exist or is not allowed in this
    /// packet (MQTT 5 §2.2.2.2).
    #[error("{packet}: property identifier 0x{id:02X} at byte {at} is not valid in this packet")]
    InvalidPropertyId {
        packet: PacketType,
        id: u8,
        at: usize,
    },

    /// A property that may appear once appears again.
    #[error("{packet}: property {property} appears more than once (at byte {at})")]
    DuplicateProperty {
        packet: PacketType,
        property: &'static str,
        at: usize,
    },

    /// A property with a value the specification refuses (receive maximum 0,
    /// maximum packet size 0, subscription identifier 0, a 0/1 byte that is
    /// neither, …).
    #[error("{packet}: property {property} has invalid value {value} (at byte {at})")]
    InvalidPropertyValue {
        packet: PacketType,
        property: &'static str,
        value: u32,
        at: usize,
    },

    /// Topic alias 0 (MQTT-3.3.2-8).
    #[error("PUBLISH: topic alias 0")]
    TopicAliasZero,

    /// Authentication Data without Authentication Method.
    #[error("{packet}: authentication data without an authentication method")]
    AuthDataWithoutMethod { packet: PacketType },

    /// A subscription identifier in a PUBLISH sent by a client (MQTT-3.3.4-6).
    #[error("PUBLISH: a client may not send a subscription identifier")]
    SubscriptionIdFromClient,

    /// A reason code not defined for this packet type.
    #[error("{packet}: reason code 0x{code:02X} at byte {at} is not valid in this packet")]
    InvalidReasonCode {
        packet: PacketType,
        code: u8,
        at: usize,
    },
}

impl DecodeError {
    /// The MQTT 5 reason code the server sends before closing.
    pub fn reason_code(&self) -> ReasonCode {
        use DecodeError::*;
        match self {
            MalformedRemainingLength
            | ReservedPacketType { .. }
            | InvalidFixedHeaderFlags { .. }
            | Truncated { .. }
            | MalformedVariableByteInteger { .. }
            | TrailingBytes { .. }
            | InvalidUtf8 { .. }
            | NullCharacter { .. }
            | ReservedConnectFlag
            | ReservedBits { .. }
            | InvalidWillQoS
            | WillFlagsWithoutWill
            | PasswordWithoutUsername
            | InvalidQoS { .. }
            | ReservedSubscriptionOptions { .. }
            | InvalidPropertyId { .. }
            | InvalidReasonCode { .. } => ReasonCode::MalformedPacket,
            PacketTooLarge { .. } => ReasonCode::PacketTooLarge,
            InvalidProtocolName { .. } | UnsupportedProtocolVersion { .. } => {
                ReasonCode::UnsupportedProtocolVersion
            }
            UnexpectedPacket { .. }
            | DupWithQoS0
            | ZeroPacketId { .. }
            | EmptyTopic
            | InvalidResponseTopic { .. }
            | SharedSubscriptionNoLocal { .. }
            | NoTopicFilters { .. }
            | InvalidRetainHandling { .. }
            | DuplicateProperty { .. }
            | InvalidPropertyValue { .. }
            | AuthDataWithoutMethod { .. }
            | SubscriptionIdFromClient => ReasonCode::ProtocolError,
            InvalidTopicName { .. } => ReasonCode::TopicNameInvalid,
            InvalidTopicFilter { .. } | InvalidSharedSubscription { .. } => {
                ReasonCode::TopicFilterInvalid
            }
            TopicAliasZero => ReasonCode::TopicAliasInvalid,
        }
    }
}

/// Why a packet cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// Larger than the protocol's 268,435,455-byte remaining length or the
    /// peer's maximum packet size, even after dropping optional properties.
    #[error("{packet} of {size} bytes exceeds the maximum packet size of {max} bytes")]
    PacketTooLarge {
        packet: PacketType,
        size: u64,
        max: u64,
    },

    /// A string or binary field longer than 65,535 bytes.
    #[error("{packet}: {field} is {len} bytes, more than 65535")]
    FieldTooLong {
        packet: PacketType,
        field: &'static str,
        len: usize,
    },

    /// QoS 1/2 PUBLISH, SUBSCRIBE, … with packet identifier 0.
    #[error("{packet}: packet identifier is 0")]
    ZeroPacketId { packet: PacketType },

    /// A variable byte integer value above 268,435,455.
    #[error("{packet}: {field} value {value} exceeds 268435455")]
    ValueTooLarge {
        packet: PacketType,
        field: &'static str,
        value: u32,
    },

    /// A packet that does not exist in the requested version (AUTH on 3.1.1).
    #[error("{packet} does not exist in {version}")]
    NotInVersion {
        packet: PacketType,
        version: super::primitives::ProtocolVersion,
    },
}
