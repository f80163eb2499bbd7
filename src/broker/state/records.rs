//! Messages as the providers store them, and back: a publish as a
//! [`Record`], a Will as a [`WillEntry`], and the properties each keeps.
//! Free functions of the values alone, shared by every state file that
//! writes or reads a record.

use bytes::Bytes;
use saguin_format::model::{PublishProps, UnixNanos, UserProperty};
use tokio::time::Instant;

use super::WillRequest;
use crate::broker::codec::{ByteStr, PayloadFormat, PublishProperties};
use crate::broker::message::{Message, MessageProperties};
use crate::storage::contract::{RecordParts, ServedValue, WillEntry};

/// A Will as the session provider keeps it.
pub(super) fn will_entry(will: &WillRequest) -> WillEntry {
    let p = &will.properties;
    WillEntry {
        topic: will.topic.to_string(),
        payload: will.payload.clone(),
        qos: will.qos,
        retain: will.retain,
        delay_interval: will.delay,
        props: publish_props_of(p),
        user_properties: user_properties_of(p),
    }
}

/// The five publish properties a record keeps, from a message's.
pub(super) fn publish_props_of(p: &MessageProperties) -> PublishProps {
    PublishProps {
        content_type: p.content_type.as_deref().map(str::to_owned),
        response_topic: p.response_topic.as_deref().map(str::to_owned),
        correlation_data: p.correlation_data.clone(),
        payload_format_indicator: p.payload_format_indicator.map(|f| f as u8),
        message_expiry_interval: p.message_expiry_interval,
    }
}

/// A message's User Properties as a record keeps them, in order.
pub(super) fn user_properties_of(p: &MessageProperties) -> Vec<UserProperty> {
    p.user_properties
        .iter()
        .map(|(name, value)| UserProperty {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

/// A stored Will as the state carries it.
pub(super) fn will_request(will: &WillEntry) -> WillRequest {
    WillRequest {
        topic: ByteStr::from(will.topic.as_str()),
        payload: will.payload.clone(),
        qos: will.qos,
        retain: will.retain,
        properties: properties_of(&will.props, &will.user_properties),
        delay: will.delay_interval,
    }
}

fn properties_of(props: &PublishProps, user: &[UserProperty]) -> MessageProperties {
    MessageProperties::from(publish_properties_of(props, user))
}

/// A record's properties as the codec carries them.
pub(super) fn publish_properties_of(
    props: &PublishProps,
    user: &[UserProperty],
) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: props.payload_format_indicator.map(|f| {
            if f == 1 {
                PayloadFormat::Utf8
            } else {
                PayloadFormat::Unspecified
            }
        }),
        message_expiry_interval: props.message_expiry_interval,
        topic_alias: None,
        response_topic: props.response_topic.as_deref().map(ByteStr::from),
        correlation_data: props.correlation_data.clone(),
        user_properties: user
            .iter()
            .map(|p| (p.name.clone(), p.value.clone()))
            .collect(),
        subscription_identifiers: Vec::new(),
        content_type: props.content_type.as_deref().map(ByteStr::from),
    }
}

/// A stored record's parts and its payload as a routable message received
/// at `received_at`, with `properties` in place of the record's: its own,
/// with what the broker adds to them (a consumer's offset).
pub(super) fn message_with_properties(
    parts: &RecordParts<'_>,
    payload: Bytes,
    received_at: Instant,
    properties: PublishProperties,
) -> Message {
    Message {
        topic: ByteStr::from(parts.topic),
        payload,
        qos: parts.qos,
        retain: parts.retain,
        properties: MessageProperties::from(properties),
        received_at,
        channel_offset: None,
        wire: Default::default(),
    }
}

/// A value a store lent as a routable message received at `received_at`:
/// its topic and payload copied into what the message owns.
pub(super) fn message_from_served(value: &ServedValue<'_>, received_at: Instant) -> Message {
    Message {
        properties: properties_of(value.props, value.user_properties),
        topic: ByteStr::from(value.topic),
        payload: Bytes::copy_from_slice(value.payload),
        qos: value.qos,
        retain: value.retain,
        received_at,
        channel_offset: None,
        wire: Default::default(),
    }
}

/// Unix nanoseconds now, from the system clock.
pub fn unix_now() -> UnixNanos {
    crate::storage::contract::now_nanos()
}
