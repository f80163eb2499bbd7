//! The MQTT 3.1.1 and 5.0 codec: bounded frame decoder, packet model, encoder.
//!
//! - [`FrameDecoder`] takes packets off a connection's `BytesMut`: it checks
//!   the fixed header (type, flags, direction, remaining length, size cap)
//!   before buffering a body, returns `Ok(None)` while a frame is incomplete,
//!   learns the protocol version from CONNECT, and validates every packet
//!   before it reaches broker state. Each refusal is a [`DecodeError`]
//!   variant whose [`DecodeError::reason_code`] is what the server sends.
//! - [`Packet`] and its structs are one model for both versions; MQTT 5 only
//!   fields are empty on 3.1.1.
//! - [`encode`], [`encoded_len`] and [`encode_within`] write packets for a
//!   version, the last one honouring the peer's Maximum Packet Size.
//!
//! Files: `frame` (fixed header, decoder), `decode` (packet bodies),
//! `encode`, `packet` (model), `primitives` (version, QoS, packet type,
//! string: what every other file names, naming none of them),
//! `properties`, `reason`, `topic` (name/filter syntax), `wire` (integers,
//! strings), `error`.

mod decode;
mod encode;
mod error;
mod frame;
mod packet;
mod primitives;
pub mod properties;
pub mod reason;
pub mod topic;
mod wire;

#[cfg(test)]
mod tests;

/// The buffer types of the API, re-exported so callers need no version match.
pub use bytes::{Bytes, BytesMut};
pub use decode::{check_first_byte, decode_body, Role};
pub use encode::{
    encode, encode_ack, encode_publish, encode_publish_head, encode_within, encoded_len,
    publish_len, PublishParts, PublishRef,
};
pub use error::{DecodeError, EncodeError};
pub use frame::{check_fixed_header, FixedHeader, FrameDecoder, PROTOCOL_MAX_PACKET_SIZE};
pub use packet::{
    Ack, Auth, ConnAck, Connect, Disconnect, LastWill, Packet, PubAck, Publish, RetainHandling,
    SubAck, Subscribe, SubscribeFilter, SubscriptionOptions, UnsubAck, Unsubscribe,
};
pub use primitives::{ByteStr, PacketType, ProtocolVersion, QoS};
pub use properties::{
    AckProperties, AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties,
    PayloadFormat, PublishProperties, SubscribeProperties, UnsubscribeProperties, UserProperties,
    WillProperties,
};
pub use reason::ReasonCode;
pub use wire::MAX_VARIABLE_BYTE_INTEGER;
