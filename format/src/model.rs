//! The record and its parts: the vocabulary shared by every format, the
//! storage layer and the broker.

use std::ops::{Deref, DerefMut};

use bytes::Bytes;

/// Unix time in nanoseconds. `0` means "not set" in every format: a zero timestamp is never read as a date.
pub type UnixNanos = i64;

/// The kind of a channel, fixed for its whole life (a file of another kind
/// than the configuration names is refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChannelKind {
    /// A log: records keep their offsets until retention removes them.
    Append,
    /// One value per topic.
    Latest,
    /// Each record handed to one worker; unresolved records only.
    Queue,
}

impl ChannelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelKind::Append => "append",
            ChannelKind::Latest => "latest",
            ChannelKind::Queue => "queue",
        }
    }
}

impl std::fmt::Display for ChannelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The five MQTT 5 publish properties a record keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishProps {
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
}

impl PublishProps {
    /// No property set, as a record without properties reads.
    pub fn none() -> &'static PublishProps {
        &NO_PROPS
    }

    /// True when no property is set (stored as NULL / absent).
    pub fn is_empty(&self) -> bool {
        self.content_type.is_none()
            && self.response_topic.is_none()
            && self.correlation_data.is_none()
            && self.payload_format_indicator.is_none()
            && self.message_expiry_interval.is_none()
    }
}

/// One User Property, in the publisher's order; names may repeat.
/// A record's publish properties, held out of line and only when one is
/// set. Most records carry none, and inline they were 96 of a record's 288
/// bytes, which a memory provider keeps for every record it holds. Read
/// through `Deref` (none reads as [`PublishProps::default`]); the first
/// change through `DerefMut` allocates them.
#[derive(Clone, Default)]
pub struct RecordProps(Option<Box<PublishProps>>);

/// Equal when they read the same: properties set and then cleared again
/// equal none.
impl PartialEq for RecordProps {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for RecordProps {}

/// What a record without properties reads as.
static NO_PROPS: PublishProps = PublishProps {
    content_type: None,
    response_topic: None,
    correlation_data: None,
    payload_format_indicator: None,
    message_expiry_interval: None,
};

impl RecordProps {
    /// Whether they are held out of line (some property is set): a record
    /// without properties holds no allocation for them.
    pub fn is_allocated(&self) -> bool {
        self.0.is_some()
    }
}

impl From<PublishProps> for RecordProps {
    /// Empty properties are not kept.
    fn from(props: PublishProps) -> Self {
        if props.is_empty() {
            RecordProps(None)
        } else {
            RecordProps(Some(Box::new(props)))
        }
    }
}

impl Deref for RecordProps {
    type Target = PublishProps;

    fn deref(&self) -> &PublishProps {
        self.0.as_deref().unwrap_or(&NO_PROPS)
    }
}

impl DerefMut for RecordProps {
    fn deref_mut(&mut self) -> &mut PublishProps {
        self.0.get_or_insert_with(Box::default)
    }
}

impl std::fmt::Debug for RecordProps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserProperty {
    pub name: String,
    pub value: String,
}

/// A stored message: what a channel, the retained store and the broadcast
/// log keep for one PUBLISH.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The record's offset in its channel; `0` where none is assigned yet
    /// (a held exactly-once publish carries no offset).
    pub offset: u64,
    /// Broker-assigned message id, unique per broker.
    pub message_id: [u8; 16],
    pub topic: String,
    /// Receipt time; `0` = unset, never "too old" for retention.
    pub timestamp: UnixNanos,
    pub user_properties: Vec<UserProperty>,
    pub payload: Bytes,
    pub props: RecordProps,
    /// The retain flag the publisher set.
    pub retain: bool,
    /// The bridge the record arrived on, if any.
    pub bridge: Option<String>,
    /// The client id that published it.
    pub client_id: String,
    /// The QoS it was published at (0..=2).
    pub qos: u8,
    /// Broadcast log only: a channel's record copied for the shared groups
    /// over that channel.
    pub shared_copy: bool,
    /// Broadcast log only: the one session this message is owed to, where it
    /// is a retained value copied for that session.
    pub owed_to: Option<String>,
}

impl Record {
    /// A record with only a topic and payload set; everything else empty.
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Record {
        Record {
            offset: 0,
            message_id: [0; 16],
            topic: topic.into(),
            timestamp: 0,
            user_properties: Vec::new(),
            payload: payload.into(),
            props: RecordProps::default(),
            retain: false,
            bridge: None,
            client_id: String::new(),
            qos: 0,
            shared_copy: false,
            owed_to: None,
        }
    }

    /// The size a record counts for against `retention_bytes`, `max_bytes`
    /// and a provider's bound. One function for both providers: topic, payload, every User Property name and
    /// value, and the publish properties' contents. Never computed in SQL.
    pub fn accounted_size(&self) -> u64 {
        let props = &self.props;
        let mut size = self.topic.len() + self.payload.len();
        for p in &self.user_properties {
            size += p.name.len() + p.value.len();
        }
        size += props.content_type.as_ref().map_or(0, String::len);
        size += props.response_topic.as_ref().map_or(0, String::len);
        size += props.correlation_data.as_ref().map_or(0, Bytes::len);
        size as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounted_size_counts_topic_payload_and_headers() {
        let mut r = Record::new("a/b", &b"12345"[..]);
        assert_eq!(r.accounted_size(), 8);
        r.user_properties.push(UserProperty {
            name: "k".into(),
            value: "vv".into(),
        });
        r.props.content_type = Some("text".into());
        assert_eq!(r.accounted_size(), 8 + 3 + 4);
    }

    /// A memory provider holds every record behind an `Arc`: with its
    /// header it fits the allocator's 224-byte class. It was 288 bytes
    /// with the publish properties inline.
    #[test]
    fn a_record_stays_small() {
        let record = std::mem::size_of::<Record>();
        assert!(record <= 200, "a record is {record} bytes");
        assert_eq!(std::mem::size_of::<RecordProps>(), 8);
    }

    #[test]
    fn a_record_without_properties_holds_no_allocation_for_them() {
        assert!(!Record::new("t", "x").props.is_allocated());
        let decoded = RecordProps::from(PublishProps::default());
        assert!(!decoded.is_allocated());
        assert!(decoded.is_empty());

        let mut props = RecordProps::from(PublishProps {
            message_expiry_interval: Some(5),
            ..PublishProps::default()
        });
        assert!(props.is_allocated());
        assert_eq!(props.message_expiry_interval, Some(5));
        // Set through `DerefMut`, which is what allocates.
        let mut set = RecordProps::default();
        let fields: &mut PublishProps = &mut set;
        fields.content_type = Some("text/plain".into());
        assert!(set.is_allocated());
        assert_eq!(set.content_type.as_deref(), Some("text/plain"));
        props.message_expiry_interval = None;
        assert!(props.is_empty());
        assert_eq!(
            props,
            RecordProps::default(),
            "equal when they read the same"
        );
    }
}
