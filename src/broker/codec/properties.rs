//! MQTT 5 properties (§2.2.2): one struct per packet kind, holding exactly
//! the properties that packet may carry.
//!
//! Decoding goes through one loop ([`read_properties`]) that checks each
//! identifier is valid for the packet, refuses a repeat of a property that
//! may appear once, and checks values the specification constrains (0/1
//! bytes, receive maximum and maximum packet size nonzero, subscription
//! identifier 1..=268,435,455, topic alias nonzero). Encoding goes through one
//! description per struct (`visit`) walked by a length counter and a writer,
//! so the computed length and the written bytes cannot disagree.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::DecodeError;
use super::primitives::{ByteStr, PacketType, QoS};
use super::wire::{self, Reader, MAX_VARIABLE_BYTE_INTEGER};

/// User properties: name/value pairs, ordered, names may repeat.
pub type UserProperties = Vec<(String, String)>;

/// Property identifiers (MQTT 5 §2.2.2.2).
pub mod id {
    pub const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
    pub const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
    pub const CONTENT_TYPE: u8 = 0x03;
    pub const RESPONSE_TOPIC: u8 = 0x08;
    pub const CORRELATION_DATA: u8 = 0x09;
    pub const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
    pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
    pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
    pub const SERVER_KEEP_ALIVE: u8 = 0x13;
    pub const AUTHENTICATION_METHOD: u8 = 0x15;
    pub const AUTHENTICATION_DATA: u8 = 0x16;
    pub const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
    pub const WILL_DELAY_INTERVAL: u8 = 0x18;
    pub const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
    pub const RESPONSE_INFORMATION: u8 = 0x1A;
    pub const SERVER_REFERENCE: u8 = 0x1C;
    pub const REASON_STRING: u8 = 0x1F;
    pub const RECEIVE_MAXIMUM: u8 = 0x21;
    pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
    pub const TOPIC_ALIAS: u8 = 0x23;
    pub const MAXIMUM_QOS: u8 = 0x24;
    pub const RETAIN_AVAILABLE: u8 = 0x25;
    pub const USER_PROPERTY: u8 = 0x26;
    pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
    pub const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
    pub const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
    pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;
}

/// The specification's name of a property identifier, for messages.
pub fn property_name(property: u8) -> &'static str {
    match property {
        id::PAYLOAD_FORMAT_INDICATOR => "Payload Format Indicator",
        id::MESSAGE_EXPIRY_INTERVAL => "Message Expiry Interval",
        id::CONTENT_TYPE => "Content Type",
        id::RESPONSE_TOPIC => "Response Topic",
        id::CORRELATION_DATA => "Correlation Data",
        id::SUBSCRIPTION_IDENTIFIER => "Subscription Identifier",
        id::SESSION_EXPIRY_INTERVAL => "Session Expiry Interval",
        id::ASSIGNED_CLIENT_IDENTIFIER => "Assigned Client Identifier",
        id::SERVER_KEEP_ALIVE => "Server Keep Alive",
        id::AUTHENTICATION_METHOD => "Authentication Method",
        id::AUTHENTICATION_DATA => "Authentication Data",
        id::REQUEST_PROBLEM_INFORMATION => "Request Problem Information",
        id::WILL_DELAY_INTERVAL => "Will Delay Interval",
        id::REQUEST_RESPONSE_INFORMATION => "Request Response Information",
        id::RESPONSE_INFORMATION => "Response Information",
        id::SERVER_REFERENCE => "Server Reference",
        id::REASON_STRING => "Reason String",
        id::RECEIVE_MAXIMUM => "Receive Maximum",
        id::TOPIC_ALIAS_MAXIMUM => "Topic Alias Maximum",
        id::TOPIC_ALIAS => "Topic Alias",
        id::MAXIMUM_QOS => "Maximum QoS",
        id::RETAIN_AVAILABLE => "Retain Available",
        id::USER_PROPERTY => "User Property",
        id::MAXIMUM_PACKET_SIZE => "Maximum Packet Size",
        id::WILDCARD_SUBSCRIPTION_AVAILABLE => "Wildcard Subscription Available",
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE => "Subscription Identifier Available",
        id::SHARED_SUBSCRIPTION_AVAILABLE => "Shared Subscription Available",
        _ => "unknown property",
    }
}

/// Payload Format Indicator values (§3.3.2.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadFormat {
    /// Unspecified bytes.
    Unspecified = 0,
    /// UTF-8 encoded character data.
    Utf8 = 1,
}

/// CONNECT properties (§3.1.2.11).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectProperties {
    pub session_expiry_interval: Option<u32>,
    /// Nonzero when present.
    pub receive_maximum: Option<u16>,
    /// Nonzero when present: the largest packet the client accepts.
    pub maximum_packet_size: Option<u32>,
    pub topic_alias_maximum: Option<u16>,
    pub request_response_information: Option<bool>,
    pub request_problem_information: Option<bool>,
    pub user_properties: UserProperties,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

/// Will properties, carried in CONNECT's payload (§3.1.3.2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WillProperties {
    pub will_delay_interval: Option<u32>,
    pub payload_format_indicator: Option<PayloadFormat>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
}

/// CONNACK properties (§3.2.2.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnAckProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    /// Only QoS 0 or 1 may be sent; absent means 2.
    pub maximum_qos: Option<QoS>,
    pub retain_available: Option<bool>,
    pub maximum_packet_size: Option<u32>,
    pub assigned_client_identifier: Option<String>,
    pub topic_alias_maximum: Option<u16>,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
    pub wildcard_subscription_available: Option<bool>,
    pub subscription_identifiers_available: Option<bool>,
    pub shared_subscription_available: Option<bool>,
    pub server_keep_alive: Option<u16>,
    pub response_information: Option<String>,
    pub server_reference: Option<String>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

/// PUBLISH properties (§3.3.2.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishProperties {
    pub payload_format_indicator: Option<PayloadFormat>,
    pub message_expiry_interval: Option<u32>,
    /// Nonzero when present.
    pub topic_alias: Option<u16>,
    pub response_topic: Option<ByteStr>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
    /// Server to client only: one per matching subscription that had one.
    pub subscription_identifiers: Vec<u32>,
    pub content_type: Option<ByteStr>,
}

/// Properties of PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckProperties {
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
}

/// SUBSCRIBE properties (§3.8.2.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscribeProperties {
    /// 1..=268,435,455 when present.
    pub subscription_identifier: Option<u32>,
    pub user_properties: UserProperties,
}

/// UNSUBSCRIBE properties (§3.10.2.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnsubscribeProperties {
    pub user_properties: UserProperties,
}

/// DISCONNECT properties (§3.14.2.2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DisconnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
    pub server_reference: Option<String>,
}

/// AUTH properties (§3.15.2.2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthProperties {
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
}

impl AckProperties {
    pub fn is_empty(&self) -> bool {
        self.reason_string.is_none() && self.user_properties.is_empty()
    }
}

/// Which property set a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Context {
    Connect,
    Will,
    ConnAck,
    Publish,
    Ack,
    Subscribe,
    Unsubscribe,
    Disconnect,
    Auth,
}

const fn mask(ids: &[u8]) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < ids.len() {
        m |= 1u64 << ids[i];
        i += 1;
    }
    m
}

impl Context {
    /// The identifiers allowed in this context, as a bit set.
    fn allowed(self) -> u64 {
        use id::*;
        match self {
            Context::Connect => {
                const {
                    mask(&[
                        SESSION_EXPIRY_INTERVAL,
                        RECEIVE_MAXIMUM,
                        MAXIMUM_PACKET_SIZE,
                        TOPIC_ALIAS_MAXIMUM,
                        REQUEST_RESPONSE_INFORMATION,
                        REQUEST_PROBLEM_INFORMATION,
                        USER_PROPERTY,
                        AUTHENTICATION_METHOD,
                        AUTHENTICATION_DATA,
                    ])
                }
            }
            Context::Will => {
                const {
                    mask(&[
                        WILL_DELAY_INTERVAL,
                        PAYLOAD_FORMAT_INDICATOR,
                        MESSAGE_EXPIRY_INTERVAL,
                        CONTENT_TYPE,
                        RESPONSE_TOPIC,
                        CORRELATION_DATA,
                        USER_PROPERTY,
                    ])
                }
            }
            Context::ConnAck => {
                const {
                    mask(&[
                        SESSION_EXPIRY_INTERVAL,
                        RECEIVE_MAXIMUM,
                        MAXIMUM_QOS,
                        RETAIN_AVAILABLE,
                        MAXIMUM_PACKET_SIZE,
                        ASSIGNED_CLIENT_IDENTIFIER,
                        TOPIC_ALIAS_MAXIMUM,
                        REASON_STRING,
                        USER_PROPERTY,
                        WILDCARD_SUBSCRIPTION_AVAILABLE,
                        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
                        SHARED_SUBSCRIPTION_AVAILABLE,
                        SERVER_KEEP_ALIVE,
                        RESPONSE_INFORMATION,
                        SERVER_REFERENCE,
                        AUTHENTICATION_METHOD,
                        AUTHENTICATION_DATA,
                    ])
                }
            }
            Context::Publish => {
                const {
                    mask(&[
                        PAYLOAD_FORMAT_INDICATOR,
                        MESSAGE_EXPIRY_INTERVAL,
                        TOPIC_ALIAS,
                        RESPONSE_TOPIC,
                        CORRELATION_DATA,
                        USER_PROPERTY,
                        SUBSCRIPTION_IDENTIFIER,
                        CONTENT_TYPE,
                    ])
                }
            }
            Context::Ack => const { mask(&[REASON_STRING, USER_PROPERTY]) },
            Context::Subscribe => const { mask(&[SUBSCRIPTION_IDENTIFIER, USER_PROPERTY]) },
            Context::Unsubscribe => const { mask(&[USER_PROPERTY]) },
            Context::Disconnect => {
                const {
                    mask(&[
                        SESSION_EXPIRY_INTERVAL,
                        REASON_STRING,
                        USER_PROPERTY,
                        SERVER_REFERENCE,
                    ])
                }
            }
            Context::Auth => {
                const {
                    mask(&[
                        AUTHENTICATION_METHOD,
                        AUTHENTICATION_DATA,
                        REASON_STRING,
                        USER_PROPERTY,
                    ])
                }
            }
        }
    }

    /// User Property may always repeat; Subscription Identifier repeats only
    /// in PUBLISH (one per matching subscription, §3.3.2.3.8).
    fn repeatable(self, property: u8) -> bool {
        property == id::USER_PROPERTY
            || (property == id::SUBSCRIPTION_IDENTIFIER && self == Context::Publish)
    }
}

/// One decoded property value.
pub(crate) enum Property {
    Byte(u8),
    Two(u16),
    Four(u32),
    Var(u32),
    Str(ByteStr),
    Binary(Bytes),
    Pair(String, String),
}

impl Property {
    fn into_string(self) -> String {
        match self {
            Property::Str(s) => s.as_str().to_owned(),
            _ => String::new(),
        }
    }
}

/// Reads a property block (length, then properties), calling `each` with
/// the identifier, its value and its offset. Identifier validity,
/// repetition and the value constraints common to every packet are checked
/// here.
pub(crate) fn read_properties(
    r: &mut Reader,
    context: Context,
    mut each: impl FnMut(u8, Property, usize) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let len = r.var_int("property length")?;
    let mut p = r.sub(len as usize, "properties")?;
    let packet = p.packet;
    let mut seen: u64 = 0;
    while !p.is_empty() {
        let at = p.at();
        // The identifier is a variable byte integer; every defined one fits
        // in a single byte, so a larger value is simply unknown.
        let raw_id = p.var_int("property identifier")?;
        let property = u8::try_from(raw_id).unwrap_or(u8::MAX);
        if property >= 64 || context.allowed() & (1u64 << property) == 0 {
            return Err(DecodeError::InvalidPropertyId {
                packet,
                id: property,
                at,
            });
        }
        let bit = 1u64 << property;
        if seen & bit != 0 && !context.repeatable(property) {
            return Err(DecodeError::DuplicateProperty {
                packet,
                property: property_name(property),
                at,
            });
        }
        seen |= bit;
        let name = property_name(property);
        let invalid = |value: u32| DecodeError::InvalidPropertyValue {
            packet,
            property: name,
            value,
            at,
        };
        let value = match property {
            id::PAYLOAD_FORMAT_INDICATOR
            | id::REQUEST_PROBLEM_INFORMATION
            | id::REQUEST_RESPONSE_INFORMATION
            | id::MAXIMUM_QOS
            | id::RETAIN_AVAILABLE
            | id::WILDCARD_SUBSCRIPTION_AVAILABLE
            | id::SUBSCRIPTION_IDENTIFIER_AVAILABLE
            | id::SHARED_SUBSCRIPTION_AVAILABLE => {
                let b = p.u8(name)?;
                if b > 1 {
                    return Err(invalid(u32::from(b)));
                }
                Property::Byte(b)
            }
            id::SERVER_KEEP_ALIVE | id::TOPIC_ALIAS_MAXIMUM => Property::Two(p.u16(name)?),
            id::RECEIVE_MAXIMUM => {
                let v = p.u16(name)?;
                if v == 0 {
                    return Err(invalid(0));
                }
                Property::Two(v)
            }
            id::TOPIC_ALIAS => {
                let v = p.u16(name)?;
                if v == 0 {
                    return Err(DecodeError::TopicAliasZero);
                }
                Property::Two(v)
            }
            id::MESSAGE_EXPIRY_INTERVAL | id::SESSION_EXPIRY_INTERVAL | id::WILL_DELAY_INTERVAL => {
                Property::Four(p.u32(name)?)
            }
            id::MAXIMUM_PACKET_SIZE => {
                let v = p.u32(name)?;
                if v == 0 {
                    return Err(invalid(0));
                }
                Property::Four(v)
            }
            id::SUBSCRIPTION_IDENTIFIER => {
                let v = p.var_int(name)?;
                if v == 0 {
                    return Err(invalid(0));
                }
                Property::Var(v)
            }
            id::CONTENT_TYPE
            | id::RESPONSE_TOPIC
            | id::ASSIGNED_CLIENT_IDENTIFIER
            | id::AUTHENTICATION_METHOD
            | id::RESPONSE_INFORMATION
            | id::SERVER_REFERENCE
            | id::REASON_STRING => Property::Str(p.byte_str(name)?),
            id::CORRELATION_DATA | id::AUTHENTICATION_DATA => Property::Binary(p.binary(name)?),
            id::USER_PROPERTY => {
                let key = p.string("User Property name")?;
                let value = p.string("User Property value")?;
                Property::Pair(key, value)
            }
            _ => {
                return Err(DecodeError::InvalidPropertyId {
                    packet,
                    id: property,
                    at,
                })
            }
        };
        each(property, value, at)?;
    }
    Ok(())
}

fn flag(v: Property) -> bool {
    matches!(v, Property::Byte(1))
}

fn byte(v: &Property) -> u8 {
    match v {
        Property::Byte(b) => *b,
        _ => 0,
    }
}

fn two(v: Property) -> u16 {
    match v {
        Property::Two(x) => x,
        _ => 0,
    }
}

fn four(v: Property) -> u32 {
    match v {
        Property::Four(x) | Property::Var(x) => x,
        _ => 0,
    }
}

fn binary(v: Property) -> Bytes {
    match v {
        Property::Binary(b) => b,
        _ => Bytes::new(),
    }
}

fn byte_str(v: Property) -> ByteStr {
    match v {
        Property::Str(s) => s,
        _ => ByteStr::default(),
    }
}

fn push_pair(list: &mut UserProperties, v: Property) {
    if let Property::Pair(k, val) = v {
        list.push((k, val));
    }
}

fn payload_format(v: &Property) -> PayloadFormat {
    if byte(v) == 1 {
        PayloadFormat::Utf8
    } else {
        PayloadFormat::Unspecified
    }
}

fn auth_data_needs_method(
    packet: PacketType,
    method: &Option<String>,
    data: &Option<Bytes>,
) -> Result<(), DecodeError> {
    if data.is_some() && method.is_none() {
        return Err(DecodeError::AuthDataWithoutMethod { packet });
    }
    Ok(())
}

impl ConnectProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = ConnectProperties::default();
        read_properties(r, Context::Connect, |property, v, _| {
            match property {
                id::SESSION_EXPIRY_INTERVAL => out.session_expiry_interval = Some(four(v)),
                id::RECEIVE_MAXIMUM => out.receive_maximum = Some(two(v)),
                id::MAXIMUM_PACKET_SIZE => out.maximum_packet_size = Some(four(v)),
                id::TOPIC_ALIAS_MAXIMUM => out.topic_alias_maximum = Some(two(v)),
                id::REQUEST_RESPONSE_INFORMATION => {
                    out.request_response_information = Some(flag(v))
                }
                id::REQUEST_PROBLEM_INFORMATION => out.request_problem_information = Some(flag(v)),
                id::USER_PROPERTY => push_pair(&mut out.user_properties, v),
                id::AUTHENTICATION_METHOD => out.authentication_method = Some(v.into_string()),
                id::AUTHENTICATION_DATA => out.authentication_data = Some(binary(v)),
                _ => {}
            }
            Ok(())
        })?;
        auth_data_needs_method(
            r.packet,
            &out.authentication_method,
            &out.authentication_data,
        )?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        s.four(id::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        s.two(id::RECEIVE_MAXIMUM, self.receive_maximum);
        s.four(id::MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        s.two(id::TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        s.flag(
            id::REQUEST_RESPONSE_INFORMATION,
            self.request_response_information,
        );
        s.flag(
            id::REQUEST_PROBLEM_INFORMATION,
            self.request_problem_information,
        );
        s.str(
            id::AUTHENTICATION_METHOD,
            self.authentication_method.as_deref(),
        );
        s.bin(id::AUTHENTICATION_DATA, self.authentication_data.as_deref());
        s.pairs(&self.user_properties);
    }
}

impl WillProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = WillProperties::default();
        let packet = r.packet;
        read_properties(r, Context::Will, |property, v, _| {
            match property {
                id::WILL_DELAY_INTERVAL => out.will_delay_interval = Some(four(v)),
                id::PAYLOAD_FORMAT_INDICATOR => {
                    out.payload_format_indicator = Some(payload_format(&v))
                }
                id::MESSAGE_EXPIRY_INTERVAL => out.message_expiry_interval = Some(four(v)),
                id::CONTENT_TYPE => out.content_type = Some(v.into_string()),
                id::RESPONSE_TOPIC => {
                    let topic = byte_str(v);
                    super::topic::validate_response_topic(packet, &topic)?;
                    out.response_topic = Some(topic.as_str().to_owned());
                }
                id::CORRELATION_DATA => out.correlation_data = Some(binary(v)),
                id::USER_PROPERTY => push_pair(&mut out.user_properties, v),
                _ => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        s.four(id::WILL_DELAY_INTERVAL, self.will_delay_interval);
        s.byte(
            id::PAYLOAD_FORMAT_INDICATOR,
            self.payload_format_indicator.map(|f| f as u8),
        );
        s.four(id::MESSAGE_EXPIRY_INTERVAL, self.message_expiry_interval);
        s.str(id::CONTENT_TYPE, self.content_type.as_deref());
        s.str(id::RESPONSE_TOPIC, self.response_topic.as_deref());
        s.bin(id::CORRELATION_DATA, self.correlation_data.as_deref());
        s.pairs(&self.user_properties);
    }
}

impl ConnAckProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = ConnAckProperties::default();
        read_properties(r, Context::ConnAck, |property, v, _| {
            match property {
                id::SESSION_EXPIRY_INTERVAL => out.session_expiry_interval = Some(four(v)),
                id::RECEIVE_MAXIMUM => out.receive_maximum = Some(two(v)),
                id::MAXIMUM_QOS => out.maximum_qos = QoS::from_u8(byte(&v)),
                id::RETAIN_AVAILABLE => out.retain_available = Some(flag(v)),
                id::MAXIMUM_PACKET_SIZE => out.maximum_packet_size = Some(four(v)),
                id::ASSIGNED_CLIENT_IDENTIFIER => {
                    out.assigned_client_identifier = Some(v.into_string())
                }
                id::TOPIC_ALIAS_MAXIMUM => out.topic_alias_maximum = Some(two(v)),
                id::REASON_STRING => out.reason_string = Some(v.into_string()),
                id::USER_PROPERTY => push_pair(&mut out.user_properties, v),
                id::WILDCARD_SUBSCRIPTION_AVAILABLE => {
                    out.wildcard_subscription_available = Some(flag(v))
                }
                id::SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
                    out.subscription_identifiers_available = Some(flag(v))
                }
                id::SHARED_SUBSCRIPTION_AVAILABLE => {
                    out.shared_subscription_available = Some(flag(v))
                }
                id::SERVER_KEEP_ALIVE => out.server_keep_alive = Some(two(v)),
                id::RESPONSE_INFORMATION => out.response_information = Some(v.into_string()),
                id::SERVER_REFERENCE => out.server_reference = Some(v.into_string()),
                id::AUTHENTICATION_METHOD => out.authentication_method = Some(v.into_string()),
                id::AUTHENTICATION_DATA => out.authentication_data = Some(binary(v)),
                _ => {}
            }
            Ok(())
        })?;
        auth_data_needs_method(
            r.packet,
            &out.authentication_method,
            &out.authentication_data,
        )?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        s.four(id::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        s.two(id::RECEIVE_MAXIMUM, self.receive_maximum);
        s.byte(id::MAXIMUM_QOS, self.maximum_qos.map(QoS::as_u8));
        s.flag(id::RETAIN_AVAILABLE, self.retain_available);
        s.four(id::MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        s.str(
            id::ASSIGNED_CLIENT_IDENTIFIER,
            self.assigned_client_identifier.as_deref(),
        );
        s.two(id::TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        s.flag(
            id::WILDCARD_SUBSCRIPTION_AVAILABLE,
            self.wildcard_subscription_available,
        );
        s.flag(
            id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            self.subscription_identifiers_available,
        );
        s.flag(
            id::SHARED_SUBSCRIPTION_AVAILABLE,
            self.shared_subscription_available,
        );
        s.two(id::SERVER_KEEP_ALIVE, self.server_keep_alive);
        s.str(
            id::RESPONSE_INFORMATION,
            self.response_information.as_deref(),
        );
        s.str(id::SERVER_REFERENCE, self.server_reference.as_deref());
        s.str(
            id::AUTHENTICATION_METHOD,
            self.authentication_method.as_deref(),
        );
        s.bin(id::AUTHENTICATION_DATA, self.authentication_data.as_deref());
        s.str(id::REASON_STRING, self.reason_string.as_deref());
        s.pairs(&self.user_properties);
    }

    /// Drops the properties a sender must leave out rather than exceed the
    /// receiver's maximum packet size (MQTT-3.2.2-19, -20).
    pub fn strip_diagnostics(&mut self) {
        self.reason_string = None;
        self.user_properties.clear();
    }
}

impl PublishProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = PublishProperties::default();
        let packet = r.packet;
        read_properties(r, Context::Publish, |property, v, _| {
            match property {
                id::PAYLOAD_FORMAT_INDICATOR => {
                    out.payload_format_indicator = Some(payload_format(&v))
                }
                id::MESSAGE_EXPIRY_INTERVAL => out.message_expiry_interval = Some(four(v)),
                id::TOPIC_ALIAS => out.topic_alias = Some(two(v)),
                id::RESPONSE_TOPIC => {
                    let topic = byte_str(v);
                    super::topic::validate_response_topic(packet, &topic)?;
                    out.response_topic = Some(topic);
                }
                id::CORRELATION_DATA => out.correlation_data = Some(binary(v)),
                id::USER_PROPERTY => push_pair(&mut out.user_properties, v),
                id::SUBSCRIPTION_IDENTIFIER => out.subscription_identifiers.push(four(v)),
                id::CONTENT_TYPE => out.content_type = Some(byte_str(v)),
                _ => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        self.visit_as(
            self.message_expiry_interval,
            self.topic_alias,
            &self.subscription_identifiers,
            s,
        );
    }

    /// [`Self::visit`] with the three fields a delivery sets for itself in
    /// place of the struct's own.
    pub(crate) fn visit_as<S: Sink>(
        &self,
        message_expiry_interval: Option<u32>,
        topic_alias: Option<u16>,
        subscription_identifiers: &[u32],
        s: &mut S,
    ) {
        s.byte(
            id::PAYLOAD_FORMAT_INDICATOR,
            self.payload_format_indicator.map(|f| f as u8),
        );
        s.four(id::MESSAGE_EXPIRY_INTERVAL, message_expiry_interval);
        s.two(id::TOPIC_ALIAS, topic_alias);
        s.str(id::RESPONSE_TOPIC, self.response_topic.as_deref());
        s.bin(id::CORRELATION_DATA, self.correlation_data.as_deref());
        for &sub_id in subscription_identifiers {
            s.var(id::SUBSCRIPTION_IDENTIFIER, Some(sub_id));
        }
        s.str(id::CONTENT_TYPE, self.content_type.as_deref());
        s.pairs(&self.user_properties);
    }
}

impl AckProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = AckProperties::default();
        read_properties(r, Context::Ack, |property, v, _| {
            match property {
                id::REASON_STRING => out.reason_string = Some(v.into_string()),
                id::USER_PROPERTY => push_pair(&mut out.user_properties, v),
                _ => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        s.str(id::REASON_STRING, self.reason_string.as_deref());
        s.pairs(&self.user_properties);
    }

    /// Drops the reason string and user properties (MQTT-3.4.2-2, -3 and
    /// their counterparts): a sender leaves them out rather than exceed the
    /// receiver's maximum packet size.
    pub fn strip_diagnostics(&mut self) {
        self.reason_string = None;
        self.user_properties.clear();
    }
}

impl SubscribeProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = SubscribeProperties::default();
        read_properties(r, Context::Subscribe, |property, v, _| {
            match property {
                id::SUBSCRIPTION_IDENTIFIER => out.subscription_identifier = Some(four(v)),
                id::USER_PROPERTY => push_pair(&mut out.user_properties, v),
                _ => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        s.var(id::SUBSCRIPTION_IDENTIFIER, self.subscription_identifier);
        s.pairs(&self.user_properties);
    }
}

impl UnsubscribeProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = UnsubscribeProperties::default();
        read_properties(r, Context::Unsubscribe, |property, v, _| {
            if property == id::USER_PROPERTY {
                push_pair(&mut out.user_properties, v);
            }
            Ok(())
        })?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        s.pairs(&self.user_properties);
    }
}

impl DisconnectProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = DisconnectProperties::default();
        read_properties(r, Context::Disconnect, |property, v, _| {
            match property {
                id::SESSION_EXPIRY_INTERVAL => out.session_expiry_interval = Some(four(v)),
                id::REASON_STRING => out.reason_string = Some(v.into_string()),
                id::USER_PROPERTY => push_pair(&mut out.user_properties, v),
                id::SERVER_REFERENCE => out.server_reference = Some(v.into_string()),
                _ => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        s.four(id::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        s.str(id::SERVER_REFERENCE, self.server_reference.as_deref());
        s.str(id::REASON_STRING, self.reason_string.as_deref());
        s.pairs(&self.user_properties);
    }

    /// Drops reason string and user properties (MQTT-3.14.2-3, -4).
    pub fn strip_diagnostics(&mut self) {
        self.reason_string = None;
        self.user_properties.clear();
    }

    pub fn is_empty(&self) -> bool {
        *self == DisconnectProperties::default()
    }
}

impl AuthProperties {
    pub(crate) fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut out = AuthProperties::default();
        read_properties(r, Context::Auth, |property, v, _| {
            match property {
                id::AUTHENTICATION_METHOD => out.authentication_method = Some(v.into_string()),
                id::AUTHENTICATION_DATA => out.authentication_data = Some(binary(v)),
                id::REASON_STRING => out.reason_string = Some(v.into_string()),
                id::USER_PROPERTY => push_pair(&mut out.user_properties, v),
                _ => {}
            }
            Ok(())
        })?;
        auth_data_needs_method(
            r.packet,
            &out.authentication_method,
            &out.authentication_data,
        )?;
        Ok(out)
    }

    pub(crate) fn visit<S: Sink>(&self, s: &mut S) {
        s.str(
            id::AUTHENTICATION_METHOD,
            self.authentication_method.as_deref(),
        );
        s.bin(id::AUTHENTICATION_DATA, self.authentication_data.as_deref());
        s.str(id::REASON_STRING, self.reason_string.as_deref());
        s.pairs(&self.user_properties);
    }

    /// Drops reason string and user properties (MQTT-3.15.2-2, -3).
    pub fn strip_diagnostics(&mut self) {
        self.reason_string = None;
        self.user_properties.clear();
    }

    pub fn is_empty(&self) -> bool {
        *self == AuthProperties::default()
    }
}

/// Where a property description goes: a length counter or a buffer. Every
/// method skips `None`.
pub(crate) trait Sink {
    fn byte(&mut self, property: u8, value: Option<u8>);
    fn two(&mut self, property: u8, value: Option<u16>);
    fn four(&mut self, property: u8, value: Option<u32>);
    fn var(&mut self, property: u8, value: Option<u32>);
    fn bin(&mut self, property: u8, value: Option<&[u8]>);
    fn pair(&mut self, key: &str, value: &str);

    fn flag(&mut self, property: u8, value: Option<bool>) {
        self.byte(property, value.map(u8::from));
    }
    fn str(&mut self, property: u8, value: Option<&str>) {
        self.bin(property, value.map(str::as_bytes));
    }
    fn pairs(&mut self, list: &UserProperties) {
        for (k, v) in list {
            self.pair(k, v);
        }
    }
}

/// Counts the encoded size of a property block (without its length prefix)
/// and remembers the first field too long for its encoding.
#[derive(Default)]
pub(crate) struct Measure {
    pub(crate) len: usize,
    /// (field, length or value) of the first field that cannot be encoded.
    pub(crate) too_long: Option<(&'static str, usize)>,
}

impl Measure {
    fn over(&mut self, field: &'static str, len: usize) {
        if self.too_long.is_none() {
            self.too_long = Some((field, len));
        }
    }
}

impl Sink for Measure {
    fn byte(&mut self, _: u8, value: Option<u8>) {
        if value.is_some() {
            self.len += 2;
        }
    }
    fn two(&mut self, _: u8, value: Option<u16>) {
        if value.is_some() {
            self.len += 3;
        }
    }
    fn four(&mut self, _: u8, value: Option<u32>) {
        if value.is_some() {
            self.len += 5;
        }
    }
    fn var(&mut self, property: u8, value: Option<u32>) {
        if let Some(v) = value {
            if v > MAX_VARIABLE_BYTE_INTEGER {
                self.over(property_name(property), v as usize);
            }
            self.len += 1 + wire::var_int_len(v as usize);
        }
    }
    fn bin(&mut self, property: u8, value: Option<&[u8]>) {
        if let Some(v) = value {
            if v.len() > usize::from(u16::MAX) {
                self.over(property_name(property), v.len());
            }
            self.len += 3 + v.len();
        }
    }
    fn pair(&mut self, key: &str, value: &str) {
        for part in [key, value] {
            if part.len() > usize::from(u16::MAX) {
                self.over("User Property", part.len());
            }
        }
        self.len += 5 + key.len() + value.len();
    }
}

/// Writes properties into a buffer.
pub(crate) struct Write<'a>(pub(crate) &'a mut BytesMut);

impl Sink for Write<'_> {
    fn byte(&mut self, property: u8, value: Option<u8>) {
        if let Some(v) = value {
            self.0.put_u8(property);
            self.0.put_u8(v);
        }
    }
    fn two(&mut self, property: u8, value: Option<u16>) {
        if let Some(v) = value {
            self.0.put_u8(property);
            self.0.put_u16(v);
        }
    }
    fn four(&mut self, property: u8, value: Option<u32>) {
        if let Some(v) = value {
            self.0.put_u8(property);
            self.0.put_u32(v);
        }
    }
    fn var(&mut self, property: u8, value: Option<u32>) {
        if let Some(v) = value {
            self.0.put_u8(property);
            wire::put_var_int(self.0, v as usize);
        }
    }
    fn bin(&mut self, property: u8, value: Option<&[u8]>) {
        if let Some(v) = value {
            self.0.put_u8(property);
            wire::put_binary(self.0, v);
        }
    }
    fn pair(&mut self, key: &str, value: &str) {
        self.0.put_u8(id::USER_PROPERTY);
        wire::put_binary(self.0, key.as_bytes());
        wire::put_binary(self.0, value.as_bytes());
    }
}
