//! A record as a memory store keeps it: its fields, and its topic, client
//! id and payload in one allocation (an append channel's log, a latest
//! channel's and the retained store's values). The broker's retained index
//! holds the retained store's own handle on a value rather than a copy of
//! it (`LatestStore::set_sharing`), so a retained message on memory is
//! held once.

use std::sync::Arc;

use bytes::Bytes;
use saguin_format::model::{Record, UnixNanos};

/// What the store keeps of one value or marker: the record's fields, its
/// topic, client id and payload in one allocation, and the parts most
/// records lack out of line. A [`Record`] is about 200 bytes before its
/// strings, and a store of a million retained messages held one for each;
/// this is 64, rebuilt into a record when read (reads are the rare side: a
/// snapshot, a restart, a subscription's retained messages; writes come
/// with every retained publish).
#[derive(Debug)]
pub struct Kept {
    pub(crate) offset: u64,
    pub(crate) timestamp: UnixNanos,
    pub(crate) message_id: [u8; 16],
    /// The topic, then the client id, then the payload. A copy, not a
    /// share of the record's: a share of a payload a restart decoded into
    /// its own buffer gave it a shared header (24 bytes a value), and a
    /// share of a publish's payload kept the connection's whole read of
    /// many packets resident. Copied out again when read.
    pub(crate) bytes: Box<[u8]>,
    /// Where the topic and the client id end in `bytes`. An MQTT string
    /// is at most 65,535 bytes; a longer one (a record another writer
    /// made) is kept in `rare`, and its length here is 0.
    topic_len: u16,
    client_len: u16,
    /// Where the topic's last level starts in it: what the broker's
    /// retained index orders a message it shares by, read at every
    /// comparison (0 for a topic too long for `topic_len`, whose last
    /// level is looked for instead). It fits the struct's padding.
    last_level_at: u16,
    pub(crate) qos: u8,
    pub(crate) retain: bool,
    /// A record holding only what the fields above do not: its User
    /// Properties, publish properties, bridge and broadcast-only fields.
    /// Its topic and client id are empty (but for one too long for
    /// `bytes`), its payload always. `None` when it would be
    /// [`Record::new`]'s empty one.
    pub(crate) rare: Option<Box<Record>>,
}

impl Kept {
    pub(crate) fn new(record: &Record) -> Kept {
        // Named field by field: a field added to `Record` is a compile error
        // here until it is kept.
        let Record {
            offset,
            message_id,
            topic,
            timestamp,
            user_properties,
            payload,
            props,
            retain,
            bridge,
            client_id,
            qos,
            shared_copy,
            owed_to,
        } = record;
        // A string too long for its length field goes out of line.
        let fits = |text: &str| u16::try_from(text.len()).ok();
        let (topic_len, rare_topic) = match fits(topic) {
            Some(len) => (len, String::new()),
            None => (0, topic.clone()),
        };
        let (client_len, rare_client) = match fits(client_id) {
            Some(len) => (len, String::new()),
            None => (0, client_id.clone()),
        };
        let mut bytes =
            Vec::with_capacity(usize::from(topic_len) + usize::from(client_len) + payload.len());
        bytes.extend_from_slice(&topic.as_bytes()[..usize::from(topic_len)]);
        bytes.extend_from_slice(&client_id.as_bytes()[..usize::from(client_len)]);
        bytes.extend_from_slice(payload);
        let rare = (!rare_topic.is_empty()
            || !rare_client.is_empty()
            || !user_properties.is_empty()
            || props.is_allocated()
            || bridge.is_some()
            || *shared_copy
            || owed_to.is_some())
        .then(|| {
            // Its correlation data copied like the payload: a share of it
            // kept what it was read from resident, a restart's whole file.
            let mut props = props.clone();
            if let Some(data) = props.correlation_data.as_mut() {
                *data = Bytes::copy_from_slice(data);
            }
            Box::new(Record {
                user_properties: user_properties.clone(),
                props,
                bridge: bridge.clone(),
                shared_copy: *shared_copy,
                owed_to: owed_to.clone(),
                client_id: rare_client,
                ..Record::new(rare_topic, Bytes::new())
            })
        });
        Kept {
            offset: *offset,
            timestamp: *timestamp,
            message_id: *message_id,
            bytes: bytes.into_boxed_slice(),
            topic_len,
            client_len,
            last_level_at: match topic_len {
                0 => 0,
                _ => topic.rfind('/').map_or(0, |slash| slash + 1) as u16,
            },
            qos: *qos,
            retain: *retain,
            rare,
        }
    }

    /// `bytes[from..to]`, which [`Kept::new`] copied from a `str` cut at
    /// its ends.
    fn text(&self, from: usize, to: usize) -> &str {
        // SAFETY: `new` copied the topic, then the client id, whole from
        // `str`s, and the lengths it kept are theirs: both are cut from
        // `bytes` at the boundaries of what was copied.
        unsafe { std::str::from_utf8_unchecked(&self.bytes[from..to]) }
    }

    pub fn topic(&self) -> &str {
        match &self.rare {
            Some(rare) if !rare.topic.is_empty() => &rare.topic,
            _ => self.text(0, usize::from(self.topic_len)),
        }
    }

    /// The topic's last level: all of it after its last `/`.
    pub fn last_level(&self) -> &str {
        match self.last_level_at {
            0 => {
                let topic = self.topic();
                topic.rsplit_once('/').map_or(topic, |(_, last)| last)
            }
            at => self.text(usize::from(at), usize::from(self.topic_len)),
        }
    }

    pub fn client_id(&self) -> &str {
        match &self.rare {
            Some(rare) if !rare.client_id.is_empty() => &rare.client_id,
            _ => {
                let from = usize::from(self.topic_len);
                self.text(from, from + usize::from(self.client_len))
            }
        }
    }

    pub fn payload(&self) -> &[u8] {
        &self.bytes[usize::from(self.topic_len) + usize::from(self.client_len)..]
    }

    /// A deletion marker.
    pub fn is_marker(&self) -> bool {
        self.payload().is_empty()
    }

    /// [`Record::accounted_size`] of the record it keeps: `rare` counts
    /// what it holds (its topic only where the topic is kept there).
    pub fn accounted_size(&self) -> u64 {
        let rare = self.rare.as_ref().map_or(0, |r| r.accounted_size());
        u64::from(self.topic_len) + self.payload().len() as u64 + rare
    }

    /// The record it keeps, whole again.
    pub fn record(&self) -> Record {
        self.record_with(Bytes::copy_from_slice(self.payload()))
    }

    /// The record it keeps, whole again, its payload a share of this
    /// allocation rather than a copy: what a read hands the broker, which
    /// lets it go once the record is sent, so a consumer catching up does
    /// not copy every payload it is sent.
    pub(crate) fn record_sharing(self: &Arc<Self>) -> Record {
        self.record_with(Bytes::from_owner(PayloadOf(self.clone())))
    }

    fn record_with(&self, payload: Bytes) -> Record {
        let base = match &self.rare {
            Some(rare) => Record::clone(rare),
            None => Record::new(String::new(), Bytes::new()),
        };
        Record {
            offset: self.offset,
            message_id: self.message_id,
            topic: self.topic().to_owned(),
            timestamp: self.timestamp,
            payload,
            retain: self.retain,
            client_id: self.client_id().to_owned(),
            qos: self.qos,
            ..base
        }
    }
}

/// A kept record's payload, as the owner of the bytes a read lends.
struct PayloadOf(Arc<Kept>);

impl AsRef<[u8]> for PayloadOf {
    fn as_ref(&self) -> &[u8] {
        self.0.payload()
    }
}

#[cfg(test)]
mod tests {
    use saguin_format::model::UserProperty;

    use super::*;

    /// Every field of a record comes back as it went in, and counts the
    /// same against the bounds, whatever is set.
    #[test]
    fn a_kept_value_reads_back_as_its_record() {
        let plain = Record {
            offset: 7,
            message_id: [3; 16],
            timestamp: 1_700_000_000_000_000_000,
            retain: true,
            client_id: "dev-7".into(),
            qos: 1,
            ..Record::new("site/1/device/7", vec![1u8; 64])
        };
        let mut every = Record {
            user_properties: vec![UserProperty {
                name: "unit".into(),
                value: "C".into(),
            }],
            bridge: Some("uplink".into()),
            shared_copy: true,
            owed_to: Some("session-1".into()),
            ..plain.clone()
        };
        every.props.content_type = Some("text/plain".into());
        every.props.response_topic = Some("reply/7".into());
        every.props.correlation_data = Some(Bytes::from_static(b"c-1"));
        every.props.payload_format_indicator = Some(1);
        every.props.message_expiry_interval = Some(60);
        let marker = Record {
            offset: 9,
            ..Record::new("site/1/device/8", Bytes::new())
        };
        let empty = Record::new("", Bytes::new());
        // Longer than an MQTT string: another writer's record.
        let long = Record {
            client_id: "c".repeat(70_000),
            ..Record::new("t/".repeat(35_000), "v")
        };
        let mut expiring = Record::new("t/e", "v");
        expiring.props.message_expiry_interval = Some(30);
        let mut correlated = Record::new("t/c", "v");
        correlated.props.correlation_data = Some(Bytes::from_static(b"c-2"));
        // Each of what goes out of line, alone.
        let alone = [
            Record {
                shared_copy: true,
                ..Record::new("t/s", "v")
            },
            Record {
                owed_to: Some("session-2".into()),
                ..Record::new("t/o", "v")
            },
            expiring,
            correlated,
            Record {
                client_id: "c".repeat(70_000),
                ..Record::new("t/long-client", "v")
            },
        ];
        for record in [plain, every, marker, empty, long].into_iter().chain(alone) {
            let kept = Kept::new(&record);
            assert_eq!(kept.record(), record);
            assert_eq!(Arc::new(Kept::new(&record)).record_sharing(), record);
            assert_eq!(kept.topic(), record.topic);
            let last = record
                .topic
                .rsplit_once('/')
                .map_or(&*record.topic, |(_, l)| l);
            assert_eq!(kept.last_level(), last);
            assert_eq!(kept.accounted_size(), record.accounted_size());
            assert_eq!(kept.is_marker(), record.payload.is_empty());
            let rare = !record.user_properties.is_empty()
                || record.bridge.is_some()
                || record.shared_copy
                || record.owed_to.is_some()
                || record.props.is_allocated()
                || record.topic.len() > 65_535
                || record.client_id.len() > 65_535;
            assert_eq!(kept.rare.is_some(), rare, "{record:?}");
        }
    }
}
