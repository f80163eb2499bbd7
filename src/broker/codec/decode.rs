//! Parsing one complete packet body into the packet model, with every check
//! the specification asks of a receiver. The frame decoder has already
//! checked the fixed header's type, flags and size.

use bytes::Bytes;

use super::error::DecodeError;
use super::packet::{
    Auth, ConnAck, Connect, Disconnect, LastWill, Packet, PubAck, Publish, RetainHandling, SubAck,
    Subscribe, SubscribeFilter, SubscriptionOptions, UnsubAck, Unsubscribe,
};
use super::primitives::{PacketType, ProtocolVersion, QoS};
use super::properties::{
    AckProperties, AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties,
    PublishProperties, SubscribeProperties, UnsubscribeProperties, WillProperties,
};
use super::reason::ReasonCode;
use super::topic::{split_shared, validate_topic_filter_syntax, validate_topic_name};
use super::wire::Reader;

/// Which side of the connection is decoding: a server refuses packets only
/// a server may send, and the reverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Decoding what a client sent.
    Server,
    /// Decoding what a server sent.
    Client,
}

/// Checks the first byte of a fixed header: a defined type, the flags the
/// specification prescribes for it (MQTT 2.1.3), the direction, and for
/// PUBLISH the QoS/DUP combination. Needs only that one byte, so a bad
/// packet is refused before its body is buffered.
pub fn check_first_byte(
    byte: u8,
    version: Option<ProtocolVersion>,
    role: Role,
) -> Result<PacketType, DecodeError> {
    let nibble = byte >> 4;
    let flags = byte & 0x0F;
    let packet =
        PacketType::from_nibble(nibble).ok_or(DecodeError::ReservedPacketType { nibble, byte })?;
    if packet == PacketType::Auth && version == Some(ProtocolVersion::V311) {
        return Err(DecodeError::ReservedPacketType { nibble, byte });
    }
    match packet {
        PacketType::Publish => {
            let qos = (flags >> 1) & 0b11;
            if qos == 3 {
                return Err(DecodeError::InvalidQoS { packet });
            }
            if qos == 0 && flags & 0b1000 != 0 {
                return Err(DecodeError::DupWithQoS0);
            }
        }
        PacketType::PubRel | PacketType::Subscribe | PacketType::Unsubscribe => {
            if flags != 0b0010 {
                return Err(DecodeError::InvalidFixedHeaderFlags { packet, flags });
            }
        }
        _ => {
            if flags != 0 {
                return Err(DecodeError::InvalidFixedHeaderFlags { packet, flags });
            }
        }
    }
    let direction_ok = match role {
        Role::Server => packet.is_client_to_server(),
        Role::Client => packet.is_server_to_client(),
    };
    if !direction_ok {
        return Err(DecodeError::UnexpectedPacket {
            packet,
            why: match role {
                Role::Server => "only a server sends it",
                Role::Client => "only a client sends it",
            },
        });
    }
    match (packet, version) {
        (PacketType::Connect, Some(_)) => Err(DecodeError::UnexpectedPacket {
            packet,
            why: "CONNECT was already received on this connection",
        }),
        (PacketType::Connect, None) => Ok(packet),
        (_, None) if role == Role::Server => Err(DecodeError::UnexpectedPacket {
            packet,
            why: "the first packet must be CONNECT",
        }),
        _ => Ok(packet),
    }
}

/// Decodes one packet from its fixed-header byte and its body (the
/// `remaining length` bytes after the fixed header). `header_len` is the
/// fixed header's length, so errors report offsets within the packet.
/// CONNECT carries its own version; every other packet is read as
/// `version`. The first byte must already have passed [`check_first_byte`].
pub fn decode_body(
    first_byte: u8,
    body: Bytes,
    header_len: usize,
    version: ProtocolVersion,
    role: Role,
) -> Result<Packet, DecodeError> {
    let nibble = first_byte >> 4;
    let packet = PacketType::from_nibble(nibble).ok_or(DecodeError::ReservedPacketType {
        nibble,
        byte: first_byte,
    })?;
    let mut r = Reader::new(body, header_len, packet);
    let v5 = version == ProtocolVersion::V5;
    let out = match packet {
        PacketType::Connect => Packet::Connect(connect(&mut r)?),
        PacketType::ConnAck => Packet::ConnAck(connack(&mut r, v5)?),
        PacketType::Publish => Packet::Publish(publish(&mut r, first_byte, v5, role)?),
        PacketType::PubAck => Packet::PubAck(pub_ack(&mut r, v5)?),
        PacketType::PubRec => Packet::PubRec(pub_ack(&mut r, v5)?),
        PacketType::PubRel => Packet::PubRel(pub_ack(&mut r, v5)?),
        PacketType::PubComp => Packet::PubComp(pub_ack(&mut r, v5)?),
        PacketType::Subscribe => Packet::Subscribe(subscribe(&mut r, v5)?),
        PacketType::SubAck => Packet::SubAck(suback(&mut r, v5)?),
        PacketType::Unsubscribe => Packet::Unsubscribe(unsubscribe(&mut r, v5)?),
        PacketType::UnsubAck => Packet::UnsubAck(unsuback(&mut r, v5)?),
        PacketType::PingReq => Packet::PingReq,
        PacketType::PingResp => Packet::PingResp,
        PacketType::Disconnect => Packet::Disconnect(disconnect(&mut r, v5)?),
        PacketType::Auth => {
            if !v5 {
                return Err(DecodeError::ReservedPacketType {
                    nibble,
                    byte: first_byte,
                });
            }
            Packet::Auth(auth(&mut r)?)
        }
    };
    if !r.is_empty() {
        return Err(DecodeError::TrailingBytes {
            packet,
            count: r.remaining(),
            at: r.at(),
        });
    }
    Ok(out)
}

fn packet_id(r: &mut Reader) -> Result<u16, DecodeError> {
    let id = r.u16("packet identifier")?;
    if id == 0 {
        return Err(DecodeError::ZeroPacketId { packet: r.packet });
    }
    Ok(id)
}

fn reason(r: &mut Reader) -> Result<ReasonCode, DecodeError> {
    let at = r.at();
    let code = r.u8("reason code")?;
    ReasonCode::from_u8(code)
        .filter(|c| c.allowed_in(r.packet))
        .ok_or(DecodeError::InvalidReasonCode {
            packet: r.packet,
            code,
            at,
        })
}

/// Protocol names: "MQTT" for 3.1.1 and 5.0, "MQIsdp" for 3.1 (refused).
const PROTOCOL_NAME: &[u8] = b"MQTT";
const PROTOCOL_NAME_V31: &[u8] = b"MQIsdp";

mod connect_flags {
    pub const RESERVED: u8 = 0b0000_0001;
    pub const CLEAN_START: u8 = 0b0000_0010;
    pub const WILL: u8 = 0b0000_0100;
    pub const WILL_QOS_SHIFT: u8 = 3;
    pub const WILL_RETAIN: u8 = 0b0010_0000;
    pub const PASSWORD: u8 = 0b0100_0000;
    pub const USERNAME: u8 = 0b1000_0000;
}

fn connect(r: &mut Reader) -> Result<Connect, DecodeError> {
    use connect_flags::*;
    let name = r.binary("protocol name")?;
    let level = r.u8("protocol level")?;
    if name.as_ref() != PROTOCOL_NAME {
        if name.as_ref() == PROTOCOL_NAME_V31 {
            return Err(DecodeError::UnsupportedProtocolVersion { level });
        }
        return Err(DecodeError::InvalidProtocolName {
            name: String::from_utf8_lossy(&name).into_owned(),
        });
    }
    let protocol = ProtocolVersion::from_level(level)
        .ok_or(DecodeError::UnsupportedProtocolVersion { level })?;
    let v5 = protocol == ProtocolVersion::V5;

    let flags = r.u8("connect flags")?;
    if flags & RESERVED != 0 {
        return Err(DecodeError::ReservedConnectFlag);
    }
    let will_flag = flags & WILL != 0;
    let will_qos = (flags >> WILL_QOS_SHIFT) & 0b11;
    let will_retain = flags & WILL_RETAIN != 0;
    if !will_flag && (will_qos != 0 || will_retain) {
        return Err(DecodeError::WillFlagsWithoutWill);
    }
    let will_qos = QoS::from_u8(will_qos).ok_or(DecodeError::InvalidWillQoS)?;
    let has_username = flags & USERNAME != 0;
    let has_password = flags & PASSWORD != 0;
    if !v5 && has_password && !has_username {
        return Err(DecodeError::PasswordWithoutUsername);
    }
    let keep_alive = r.u16("keep alive")?;
    let properties = if v5 {
        ConnectProperties::read(r)?
    } else {
        ConnectProperties::default()
    };

    let client_id = r.string("client identifier")?;
    let will = if will_flag {
        let will_properties = if v5 {
            WillProperties::read(r)?
        } else {
            WillProperties::default()
        };
        let topic = r.byte_str("will topic")?;
        validate_topic_name(r.packet, &topic)?;
        let payload = r.binary("will payload")?;
        Some(LastWill {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties: will_properties,
        })
    } else {
        None
    };
    let username = if has_username {
        Some(r.string("user name")?)
    } else {
        None
    };
    let password = if has_password {
        Some(r.binary("password")?)
    } else {
        None
    };
    Ok(Connect {
        protocol,
        clean_start: flags & CLEAN_START != 0,
        keep_alive,
        client_id,
        will,
        username,
        password,
        properties,
    })
}

fn connack(r: &mut Reader, v5: bool) -> Result<ConnAck, DecodeError> {
    let at = r.at();
    let ack_flags = r.u8("acknowledge flags")?;
    if ack_flags & !1 != 0 {
        return Err(DecodeError::ReservedBits {
            packet: r.packet,
            field: "acknowledge flags",
            value: ack_flags,
            at,
        });
    }
    let session_present = ack_flags & 1 != 0;
    if v5 {
        let reason = reason(r)?;
        let properties = ConnAckProperties::read(r)?;
        Ok(ConnAck {
            session_present,
            reason,
            properties,
        })
    } else {
        let at = r.at();
        let code = r.u8("connect return code")?;
        let reason = ReasonCode::from_v311_connack(code).ok_or(DecodeError::InvalidReasonCode {
            packet: r.packet,
            code,
            at,
        })?;
        Ok(ConnAck {
            session_present,
            reason,
            properties: ConnAckProperties::default(),
        })
    }
}

fn publish(r: &mut Reader, first_byte: u8, v5: bool, role: Role) -> Result<Publish, DecodeError> {
    let qos = QoS::from_u8((first_byte >> 1) & 0b11)
        .ok_or(DecodeError::InvalidQoS { packet: r.packet })?;
    let dup = first_byte & 0b1000 != 0;
    if dup && qos == QoS::AtMostOnce {
        return Err(DecodeError::DupWithQoS0);
    }
    let retain = first_byte & 1 != 0;
    let topic = r.byte_str("topic name")?;
    if !topic.is_empty() {
        validate_topic_name(r.packet, &topic)?;
    }
    let packet_id = if qos == QoS::AtMostOnce {
        0
    } else {
        packet_id(r)?
    };
    let properties = if v5 {
        PublishProperties::read(r)?
    } else {
        PublishProperties::default()
    };
    if topic.is_empty() && properties.topic_alias.is_none() {
        return Err(DecodeError::EmptyTopic);
    }
    if role == Role::Server && !properties.subscription_identifiers.is_empty() {
        return Err(DecodeError::SubscriptionIdFromClient);
    }
    Ok(Publish {
        dup,
        qos,
        retain,
        topic,
        packet_id,
        properties,
        payload: r.take_rest(),
    })
}

/// PUBACK, PUBREC, PUBREL, PUBCOMP. On MQTT 5 the reason code and the
/// property length may each be left out (§3.4.2.1): remaining length 2
/// means Success without properties, 3 means a reason without properties.
fn pub_ack(r: &mut Reader, v5: bool) -> Result<PubAck, DecodeError> {
    let packet_id = packet_id(r)?;
    let mut ack = PubAck::new(packet_id);
    if v5 && !r.is_empty() {
        ack.reason = reason(r)?;
        if !r.is_empty() {
            ack.properties = AckProperties::read(r)?;
        }
    }
    Ok(ack)
}

mod sub_options {
    pub const QOS: u8 = 0b0000_0011;
    pub const NO_LOCAL: u8 = 0b0000_0100;
    pub const RETAIN_AS_PUBLISHED: u8 = 0b0000_1000;
    pub const RETAIN_HANDLING_SHIFT: u8 = 4;
    /// Bits 6-7 on MQTT 5; on 3.1.1 everything above the QoS is reserved.
    pub const RESERVED_V5: u8 = 0b1100_0000;
    pub const RESERVED_V311: u8 = 0b1111_1100;
}

fn subscribe(r: &mut Reader, v5: bool) -> Result<Subscribe, DecodeError> {
    use sub_options::*;
    let packet_id = packet_id(r)?;
    let properties = if v5 {
        SubscribeProperties::read(r)?
    } else {
        SubscribeProperties::default()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string("topic filter")?;
        let options = r.u8("subscription options")?;
        let reserved = if v5 { RESERVED_V5 } else { RESERVED_V311 };
        if options & reserved != 0 {
            return Err(DecodeError::ReservedSubscriptionOptions { filter, options });
        }
        let qos =
            QoS::from_u8(options & QOS).ok_or(DecodeError::InvalidQoS { packet: r.packet })?;
        let retain_handling = RetainHandling::from_u8((options >> RETAIN_HANDLING_SHIFT) & 0b11)
            .ok_or_else(|| DecodeError::InvalidRetainHandling {
                filter: filter.clone(),
            })?;
        let no_local = options & NO_LOCAL != 0;
        validate_topic_filter_syntax(r.packet, &filter)?;
        if no_local && split_shared(&filter).is_some() {
            return Err(DecodeError::SharedSubscriptionNoLocal { filter });
        }
        filters.push(SubscribeFilter {
            filter,
            options: SubscriptionOptions {
                qos,
                no_local,
                retain_as_published: options & RETAIN_AS_PUBLISHED != 0,
                retain_handling,
            },
        });
    }
    if filters.is_empty() {
        return Err(DecodeError::NoTopicFilters { packet: r.packet });
    }
    Ok(Subscribe {
        packet_id,
        filters,
        properties,
    })
}

fn suback(r: &mut Reader, v5: bool) -> Result<SubAck, DecodeError> {
    let packet_id = packet_id(r)?;
    let properties = if v5 {
        AckProperties::read(r)?
    } else {
        AckProperties::default()
    };
    let mut reasons = Vec::with_capacity(r.remaining());
    while !r.is_empty() {
        if v5 {
            reasons.push(reason(r)?);
        } else {
            let at = r.at();
            let code = r.u8("return code")?;
            reasons.push(ReasonCode::from_v311_suback(code).ok_or(
                DecodeError::InvalidReasonCode {
                    packet: r.packet,
                    code,
                    at,
                },
            )?);
        }
    }
    Ok(SubAck {
        packet_id,
        reasons,
        properties,
    })
}

fn unsubscribe(r: &mut Reader, v5: bool) -> Result<Unsubscribe, DecodeError> {
    let packet_id = packet_id(r)?;
    let properties = if v5 {
        UnsubscribeProperties::read(r)?
    } else {
        UnsubscribeProperties::default()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string("topic filter")?;
        validate_topic_filter_syntax(r.packet, &filter)?;
        filters.push(filter);
    }
    if filters.is_empty() {
        return Err(DecodeError::NoTopicFilters { packet: r.packet });
    }
    Ok(Unsubscribe {
        packet_id,
        filters,
        properties,
    })
}

fn unsuback(r: &mut Reader, v5: bool) -> Result<UnsubAck, DecodeError> {
    let packet_id = packet_id(r)?;
    let mut ack = UnsubAck {
        packet_id,
        reasons: Vec::new(),
        properties: AckProperties::default(),
    };
    if v5 {
        ack.properties = AckProperties::read(r)?;
        ack.reasons.reserve(r.remaining());
        while !r.is_empty() {
            ack.reasons.push(reason(r)?);
        }
    }
    Ok(ack)
}

/// DISCONNECT: on MQTT 5, remaining length 0 means Normal disconnection,
/// 1 a reason without properties (§3.14.2.1).
fn disconnect(r: &mut Reader, v5: bool) -> Result<Disconnect, DecodeError> {
    let mut out = Disconnect::new(ReasonCode::NORMAL_DISCONNECTION);
    if v5 && !r.is_empty() {
        out.reason = reason(r)?;
        if !r.is_empty() {
            out.properties = DisconnectProperties::read(r)?;
        }
    }
    Ok(out)
}

/// AUTH: remaining length 0 means Success without properties (§3.15.2.1).
fn auth(r: &mut Reader) -> Result<Auth, DecodeError> {
    let mut out = Auth {
        reason: ReasonCode::Success,
        properties: AuthProperties::default(),
    };
    if !r.is_empty() {
        out.reason = reason(r)?;
        if !r.is_empty() {
            out.properties = AuthProperties::read(r)?;
        }
    }
    Ok(out)
}
