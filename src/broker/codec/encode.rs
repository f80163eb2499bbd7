//! Encoding the packet model for either protocol version.
//!
//! Every encode first measures the packet (checking each field fits its
//! encoding), so nothing is written for a packet that cannot be sent, and
//! [`encoded_len`] is exactly the number of bytes [`encode`] writes.

use bytes::{BufMut, BytesMut};

use super::error::EncodeError;
use super::packet::{Ack, Packet, Publish};
use super::primitives::{PacketType, ProtocolVersion, QoS};
use super::properties::id::SUBSCRIPTION_IDENTIFIER;
use super::properties::{Measure, PublishProperties, Sink, Write};
use super::reason::ReasonCode;
use super::wire::{self, MAX_VARIABLE_BYTE_INTEGER};

/// Size of a whole packet (fixed header included) with `body` bytes after
/// the fixed header.
fn total_len(body: usize) -> usize {
    1 + wire::var_int_len(body) + body
}

/// Length of a property block including its length prefix, checking every
/// field fits.
fn props_len<P: PropertyBlock>(packet: PacketType, props: &P) -> Result<usize, EncodeError> {
    let mut m = Measure::default();
    props.measure(&mut m);
    measured_props_len(packet, m)
}

fn measured_props_len(packet: PacketType, m: Measure) -> Result<usize, EncodeError> {
    if let Some((field, len)) = m.too_long {
        return Err(EncodeError::FieldTooLong { packet, field, len });
    }
    if m.len > MAX_VARIABLE_BYTE_INTEGER as usize {
        return Err(EncodeError::PacketTooLarge {
            packet,
            size: m.len as u64,
            max: u64::from(MAX_VARIABLE_BYTE_INTEGER),
        });
    }
    Ok(wire::var_int_len(m.len) + m.len)
}

/// A property struct walked by either sink: measured, then written.
trait PropertyBlock {
    fn measure(&self, m: &mut Measure);
    fn write(&self, w: &mut Write<'_>);
}

macro_rules! property_block {
    ($($t:ty),*) => {$(
        impl PropertyBlock for $t {
            fn measure(&self, m: &mut Measure) {
                self.visit(m)
            }
            fn write(&self, w: &mut Write<'_>) {
                self.visit(w)
            }
        }
    )*};
}

property_block!(
    super::properties::ConnectProperties,
    super::properties::WillProperties,
    super::properties::ConnAckProperties,
    super::properties::PublishProperties,
    super::properties::AckProperties,
    super::properties::SubscribeProperties,
    super::properties::UnsubscribeProperties,
    super::properties::DisconnectProperties,
    super::properties::AuthProperties
);

/// Writes a property block: its length, then the properties.
fn put_props<P: PropertyBlock>(buf: &mut BytesMut, props: &P) {
    let mut m = Measure::default();
    props.measure(&mut m);
    wire::put_var_int(buf, m.len);
    props.write(&mut Write(buf));
}

fn str_len(packet: PacketType, field: &'static str, len: usize) -> Result<usize, EncodeError> {
    wire::check_len(packet, field, len)?;
    Ok(2 + len)
}

fn nonzero_id(packet: PacketType, id: u16) -> Result<(), EncodeError> {
    if id == 0 {
        return Err(EncodeError::ZeroPacketId { packet });
    }
    Ok(())
}

/// Length of the body (everything after the fixed header), validating the
/// packet as it goes.
fn body_len(packet: &Packet, version: ProtocolVersion) -> Result<usize, EncodeError> {
    let kind = packet.packet_type();
    let v5 = version == ProtocolVersion::V5;
    let len = match packet {
        Packet::Connect(c) => {
            // protocol name "MQTT", level, flags, keep alive
            let mut len = 6 + 1 + 1 + 2;
            if v5 {
                len += props_len(kind, &c.properties)?;
            }
            len += str_len(kind, "client identifier", c.client_id.len())?;
            if let Some(will) = &c.will {
                if v5 {
                    len += props_len(kind, &will.properties)?;
                }
                len += str_len(kind, "will topic", will.topic.len())?;
                len += str_len(kind, "will payload", will.payload.len())?;
            }
            if let Some(u) = &c.username {
                len += str_len(kind, "user name", u.len())?;
            }
            if let Some(p) = &c.password {
                len += str_len(kind, "password", p.len())?;
            }
            len
        }
        Packet::ConnAck(c) => {
            if v5 {
                2 + props_len(kind, &c.properties)?
            } else {
                2
            }
        }
        Packet::Publish(p) => PublishRef::of(p).body_len(version)?,
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            nonzero_id(kind, a.packet_id)?;
            if !v5 {
                2
            } else if a.properties.is_empty() {
                if a.reason == ReasonCode::Success {
                    2
                } else {
                    3
                }
            } else {
                3 + props_len(kind, &a.properties)?
            }
        }
        Packet::Subscribe(s) => {
            nonzero_id(kind, s.packet_id)?;
            let mut len = 2;
            if v5 {
                len += props_len(kind, &s.properties)?;
            }
            for f in &s.filters {
                len += str_len(kind, "topic filter", f.filter.len())? + 1;
            }
            len
        }
        Packet::SubAck(s) => {
            nonzero_id(kind, s.packet_id)?;
            let mut len = 2 + s.reasons.len();
            if v5 {
                len += props_len(kind, &s.properties)?;
            }
            len
        }
        Packet::Unsubscribe(u) => {
            nonzero_id(kind, u.packet_id)?;
            let mut len = 2;
            if v5 {
                len += props_len(kind, &u.properties)?;
            }
            for f in &u.filters {
                len += str_len(kind, "topic filter", f.len())?;
            }
            len
        }
        Packet::UnsubAck(u) => {
            nonzero_id(kind, u.packet_id)?;
            if v5 {
                2 + props_len(kind, &u.properties)? + u.reasons.len()
            } else {
                2
            }
        }
        Packet::PingReq | Packet::PingResp => 0,
        Packet::Disconnect(d) => {
            if !v5 {
                0
            } else if d.properties.is_empty() {
                usize::from(d.reason != ReasonCode::NORMAL_DISCONNECTION)
            } else {
                1 + props_len(kind, &d.properties)?
            }
        }
        Packet::Auth(a) => {
            if !v5 {
                return Err(EncodeError::NotInVersion {
                    packet: kind,
                    version,
                });
            }
            if a.properties.is_empty() && a.reason == ReasonCode::Success {
                0
            } else {
                1 + props_len(kind, &a.properties)?
            }
        }
    };
    check_body_len(kind, len)
}

fn check_body_len(packet: PacketType, len: usize) -> Result<usize, EncodeError> {
    if len > MAX_VARIABLE_BYTE_INTEGER as usize {
        return Err(EncodeError::PacketTooLarge {
            packet,
            size: total_len(len) as u64,
            max: u64::from(MAX_VARIABLE_BYTE_INTEGER),
        });
    }
    Ok(len)
}

/// What decides the size of a PUBLISH, borrowed from wherever the parts
/// live: the broker measures a delivery before it builds the packet.
#[derive(Debug, Clone, Copy)]
pub struct PublishParts<'a> {
    pub qos: QoS,
    pub topic_len: usize,
    /// Sent as they are, except that `subscription_ids` are added to their
    /// subscription identifiers.
    pub properties: &'a PublishProperties,
    pub subscription_ids: &'a [u32],
    /// A User Property sent after the properties' own.
    pub extra_user_property: Option<(&'a str, &'a str)>,
    pub payload_len: usize,
}

fn publish_body_len(
    parts: &PublishParts<'_>,
    version: ProtocolVersion,
) -> Result<usize, EncodeError> {
    measured_publish_body_len(
        parts.qos,
        parts.topic_len,
        parts.payload_len,
        version,
        |m| {
            parts.properties.measure(m);
            for &sub_id in parts.subscription_ids {
                m.var(SUBSCRIPTION_IDENTIFIER, Some(sub_id));
            }
            if let Some((key, value)) = parts.extra_user_property {
                m.pair(key, value);
            }
        },
    )
}

/// The body of a PUBLISH whose property block `measure` measures.
fn measured_publish_body_len(
    qos: QoS,
    topic_len: usize,
    payload_len: usize,
    version: ProtocolVersion,
    measure: impl FnOnce(&mut Measure),
) -> Result<usize, EncodeError> {
    let kind = PacketType::Publish;
    let mut len = str_len(kind, "topic name", topic_len)?;
    if qos != QoS::AtMostOnce {
        len += 2;
    }
    if version == ProtocolVersion::V5 {
        let mut m = Measure::default();
        measure(&mut m);
        len += measured_props_len(kind, m)?;
    }
    Ok(len + payload_len)
}

/// A PUBLISH written from borrowed parts, without building a [`Packet`]: a
/// broker delivery sends a shared message's topic, properties and payload
/// with what is its own beside them. Written exactly as the
/// [`Packet::Publish`] whose properties are `properties` with
/// `message_expiry_interval`, `topic_alias` and `subscription_ids` in place
/// of their own.
#[derive(Debug, Clone, Copy)]
pub struct PublishRef<'a> {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty only when a topic alias stands for it (MQTT 5).
    pub topic: &'a str,
    /// 0 for QoS 0; nonzero for QoS 1 and 2.
    pub packet_id: u16,
    pub properties: &'a PublishProperties,
    pub message_expiry_interval: Option<u32>,
    pub topic_alias: Option<u16>,
    pub subscription_ids: &'a [u32],
    /// A User Property sent after the properties' own (a channel record's
    /// offset, which its message keeps as a number).
    pub extra_user_property: Option<(&'a str, &'a str)>,
    pub payload: &'a [u8],
}

impl<'a> PublishRef<'a> {
    /// `publish` as it is.
    pub fn of(publish: &'a Publish) -> PublishRef<'a> {
        PublishRef {
            dup: publish.dup,
            qos: publish.qos,
            retain: publish.retain,
            topic: &publish.topic,
            packet_id: publish.packet_id,
            properties: &publish.properties,
            message_expiry_interval: publish.properties.message_expiry_interval,
            topic_alias: publish.properties.topic_alias,
            subscription_ids: &publish.properties.subscription_identifiers,
            extra_user_property: None,
            payload: &publish.payload,
        }
    }

    fn visit_properties<S: Sink>(&self, s: &mut S) {
        self.properties.visit_as(
            self.message_expiry_interval,
            self.topic_alias,
            self.subscription_ids,
            s,
        );
        // User Properties come last in the block: this one follows them.
        if let Some((key, value)) = self.extra_user_property {
            s.pair(key, value);
        }
    }

    fn first_byte(&self) -> u8 {
        let dup = self.dup && self.qos != QoS::AtMostOnce;
        ((PacketType::Publish as u8) << 4)
            | (u8::from(dup) << 3)
            | (self.qos.as_u8() << 1)
            | u8::from(self.retain)
    }

    fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if self.qos != QoS::AtMostOnce {
            nonzero_id(PacketType::Publish, self.packet_id)?;
        }
        measured_publish_body_len(
            self.qos,
            self.topic.len(),
            self.payload.len(),
            version,
            |m| self.visit_properties(m),
        )
    }

    fn write_body(&self, version: ProtocolVersion, buf: &mut BytesMut) {
        self.write_body_head(version, buf);
        buf.put_slice(self.payload);
    }

    /// The body but its payload, which ends it.
    fn write_body_head(&self, version: ProtocolVersion, buf: &mut BytesMut) {
        wire::put_binary(buf, self.topic.as_bytes());
        if self.qos != QoS::AtMostOnce {
            buf.put_u16(self.packet_id);
        }
        if version == ProtocolVersion::V5 {
            let mut m = Measure::default();
            self.visit_properties(&mut m);
            wire::put_var_int(buf, m.len);
            self.visit_properties(&mut Write(buf));
        }
    }
}

/// Appends the PUBLISH `publish` describes, as [`encode_within`] would the
/// packet built from it: refused with [`EncodeError::PacketTooLarge`] when
/// longer than `max_packet_size`. Returns the bytes written.
pub fn encode_publish(
    publish: &PublishRef<'_>,
    version: ProtocolVersion,
    max_packet_size: u32,
    buf: &mut BytesMut,
) -> Result<usize, EncodeError> {
    append_publish(publish, version, max_packet_size, buf, true)
}

/// [`encode_publish`] but for the payload, which the caller sends right
/// after the bytes appended (a large payload written from where it is
/// rather than copied). Returns the whole packet's length, payload
/// included.
pub fn encode_publish_head(
    publish: &PublishRef<'_>,
    version: ProtocolVersion,
    max_packet_size: u32,
    buf: &mut BytesMut,
) -> Result<usize, EncodeError> {
    append_publish(publish, version, max_packet_size, buf, false)
}

fn append_publish(
    publish: &PublishRef<'_>,
    version: ProtocolVersion,
    max_packet_size: u32,
    buf: &mut BytesMut,
    with_payload: bool,
) -> Result<usize, EncodeError> {
    let body = check_body_len(PacketType::Publish, publish.body_len(version)?)?;
    let len = total_len(body);
    if len > max_packet_size as usize {
        return Err(EncodeError::PacketTooLarge {
            packet: PacketType::Publish,
            size: len as u64,
            max: u64::from(max_packet_size),
        });
    }
    buf.reserve(if with_payload {
        len
    } else {
        len - publish.payload.len()
    });
    buf.put_u8(publish.first_byte());
    wire::put_var_int(buf, body);
    publish.write_body_head(version, buf);
    if with_payload {
        buf.put_slice(publish.payload);
    }
    Ok(len)
}

/// The number of bytes [`encode`] writes for the PUBLISH `parts` describe,
/// fixed header included, without building it: [`encoded_len`] of that
/// packet.
pub fn publish_len(
    parts: &PublishParts<'_>,
    version: ProtocolVersion,
) -> Result<usize, EncodeError> {
    let body = check_body_len(PacketType::Publish, publish_body_len(parts, version)?)?;
    Ok(total_len(body))
}

/// The number of bytes [`encode`] writes for `packet`, fixed header
/// included: compare it with the peer's Maximum Packet Size.
pub fn encoded_len(packet: &Packet, version: ProtocolVersion) -> Result<usize, EncodeError> {
    Ok(total_len(body_len(packet, version)?))
}

fn first_byte(packet: &Packet) -> u8 {
    let kind = packet.packet_type() as u8;
    let flags = match packet {
        Packet::Publish(p) => return PublishRef::of(p).first_byte(),
        Packet::PubRel(_) | Packet::Subscribe(_) | Packet::Unsubscribe(_) => 0b0010,
        _ => 0,
    };
    (kind << 4) | flags
}

/// Appends `packet` encoded for `version` to `buf`. Nothing is written when
/// an error is returned.
pub fn encode(
    packet: &Packet,
    version: ProtocolVersion,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    let body = body_len(packet, version)?;
    buf.reserve(total_len(body));
    let start = buf.len();
    buf.put_u8(first_byte(packet));
    wire::put_var_int(buf, body);
    write_body(packet, version, buf);
    debug_assert_eq!(buf.len() - start, total_len(body));
    Ok(())
}

/// Encodes a PUBACK, PUBREC, PUBREL or PUBCOMP without properties - what
/// the broker sends for every QoS 1/2 exchange - byte for byte as
/// [`encode_within`] encodes the [`Packet`], without building one: the
/// identifier alone when the reason is Success or the version 3.1.1, the
/// reason code after it otherwise.
pub fn encode_ack(
    ack: Ack,
    reason: ReasonCode,
    version: ProtocolVersion,
    max_packet_size: u32,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    let packet = ack.packet_type();
    nonzero_id(packet, ack.packet_id())?;
    let with_reason = version == ProtocolVersion::V5 && reason != ReasonCode::Success;
    let size = 4 + usize::from(with_reason);
    if size as u64 > u64::from(max_packet_size) {
        return Err(EncodeError::PacketTooLarge {
            packet,
            size: size as u64,
            max: u64::from(max_packet_size),
        });
    }
    let first = match ack {
        Ack::PubAck(_) => 0x40,
        Ack::PubRec(_) => 0x50,
        Ack::PubRel(_) => 0x62,
        Ack::PubComp(_) => 0x70,
    };
    buf.reserve(size);
    buf.put_u8(first);
    buf.put_u8(size as u8 - 2);
    buf.put_u16(ack.packet_id());
    if with_reason {
        buf.put_u8(reason.as_u8());
    }
    Ok(())
}

/// Encodes `packet` so that it is at most `max_packet_size` bytes (the
/// peer's Maximum Packet Size). When it would be larger, the reason string
/// and user properties of a CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP,
/// SUBACK, UNSUBACK, DISCONNECT or AUTH are dropped, as the specification
/// prescribes (MQTT-3.4.2-2 and its counterparts); a PUBLISH or anything
/// still too large is refused with [`EncodeError::PacketTooLarge`] and the
/// caller discards it (MQTT-3.1.2-25). Returns the bytes written.
pub fn encode_within(
    packet: &Packet,
    version: ProtocolVersion,
    max_packet_size: u32,
    buf: &mut BytesMut,
) -> Result<usize, EncodeError> {
    let max = max_packet_size as usize;
    let len = encoded_len(packet, version)?;
    if len <= max {
        encode(packet, version, buf)?;
        return Ok(len);
    }
    let mut stripped = packet.clone();
    let strippable = match &mut stripped {
        Packet::ConnAck(c) => {
            c.properties.strip_diagnostics();
            true
        }
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            a.properties.strip_diagnostics();
            true
        }
        Packet::SubAck(s) => {
            s.properties.strip_diagnostics();
            true
        }
        Packet::UnsubAck(u) => {
            u.properties.strip_diagnostics();
            true
        }
        Packet::Disconnect(d) => {
            d.properties.strip_diagnostics();
            true
        }
        Packet::Auth(a) => {
            a.properties.strip_diagnostics();
            true
        }
        _ => false,
    };
    let size = if strippable {
        let len = encoded_len(&stripped, version)?;
        if len <= max {
            encode(&stripped, version, buf)?;
            return Ok(len);
        }
        len
    } else {
        len
    };
    Err(EncodeError::PacketTooLarge {
        packet: packet.packet_type(),
        size: size as u64,
        max: u64::from(max_packet_size),
    })
}

fn write_body(packet: &Packet, version: ProtocolVersion, buf: &mut BytesMut) {
    let v5 = version == ProtocolVersion::V5;
    match packet {
        Packet::Connect(c) => {
            wire::put_binary(buf, b"MQTT");
            buf.put_u8(version.level());
            let mut flags = 0u8;
            if c.clean_start {
                flags |= 0b0000_0010;
            }
            if let Some(will) = &c.will {
                flags |= 0b0000_0100 | (will.qos.as_u8() << 3);
                if will.retain {
                    flags |= 0b0010_0000;
                }
            }
            if c.password.is_some() {
                flags |= 0b0100_0000;
            }
            if c.username.is_some() {
                flags |= 0b1000_0000;
            }
            buf.put_u8(flags);
            buf.put_u16(c.keep_alive);
            if v5 {
                put_props(buf, &c.properties);
            }
            wire::put_binary(buf, c.client_id.as_bytes());
            if let Some(will) = &c.will {
                if v5 {
                    put_props(buf, &will.properties);
                }
                wire::put_binary(buf, will.topic.as_bytes());
                wire::put_binary(buf, &will.payload);
            }
            if let Some(u) = &c.username {
                wire::put_binary(buf, u.as_bytes());
            }
            if let Some(p) = &c.password {
                wire::put_binary(buf, p);
            }
        }
        Packet::ConnAck(c) => {
            buf.put_u8(u8::from(c.session_present));
            if v5 {
                buf.put_u8(c.reason.as_u8());
                put_props(buf, &c.properties);
            } else {
                buf.put_u8(c.reason.to_v311_connack());
            }
        }
        Packet::Publish(p) => PublishRef::of(p).write_body(version, buf),
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            buf.put_u16(a.packet_id);
            if v5 {
                let empty = a.properties.is_empty();
                if !empty || a.reason != ReasonCode::Success {
                    buf.put_u8(a.reason.as_u8());
                }
                if !empty {
                    put_props(buf, &a.properties);
                }
            }
        }
        Packet::Subscribe(s) => {
            buf.put_u16(s.packet_id);
            if v5 {
                put_props(buf, &s.properties);
            }
            for f in &s.filters {
                wire::put_binary(buf, f.filter.as_bytes());
                let o = &f.options;
                let options = if v5 {
                    o.qos.as_u8()
                        | (u8::from(o.no_local) << 2)
                        | (u8::from(o.retain_as_published) << 3)
                        | ((o.retain_handling as u8) << 4)
                } else {
                    o.qos.as_u8()
                };
                buf.put_u8(options);
            }
        }
        Packet::SubAck(s) => {
            buf.put_u16(s.packet_id);
            if v5 {
                put_props(buf, &s.properties);
                for r in &s.reasons {
                    buf.put_u8(r.as_u8());
                }
            } else {
                for r in &s.reasons {
                    buf.put_u8(r.to_v311_suback());
                }
            }
        }
        Packet::Unsubscribe(u) => {
            buf.put_u16(u.packet_id);
            if v5 {
                put_props(buf, &u.properties);
            }
            for f in &u.filters {
                wire::put_binary(buf, f.as_bytes());
            }
        }
        Packet::UnsubAck(u) => {
            buf.put_u16(u.packet_id);
            if v5 {
                put_props(buf, &u.properties);
                for r in &u.reasons {
                    buf.put_u8(r.as_u8());
                }
            }
        }
        Packet::PingReq | Packet::PingResp => {}
        Packet::Disconnect(d) => {
            if v5 {
                let empty = d.properties.is_empty();
                if !empty || d.reason != ReasonCode::NORMAL_DISCONNECTION {
                    buf.put_u8(d.reason.as_u8());
                }
                if !empty {
                    put_props(buf, &d.properties);
                }
            }
        }
        Packet::Auth(a) => {
            if !a.properties.is_empty() || a.reason != ReasonCode::Success {
                buf.put_u8(a.reason.as_u8());
                put_props(buf, &a.properties);
            }
        }
    }
}
