//! Retained messages on their way from the thread that reads them to the
//! one that builds the state from them, at a restart.
//!
//! A batch packs what the store lent of each value: its topic and payload
//! are copied into one buffer the batch shares, so reading a value makes
//! nothing on its own, and the thread that builds lets go of one buffer a
//! batch instead of a topic and a payload a message, each made on the
//! other thread. A value the store lends with its own handle (a memory
//! store's) comes over as that handle, copied nowhere: the state holds it.

use saguin_format::model::{PublishProps, UnixNanos, UserProperty};

use crate::storage::contract::ServedValue;
use crate::storage::kept::Kept;

/// Values a batch holds at most; with [`BATCH_BYTES`], what bounds it.
pub(super) const BATCH_VALUES: usize = 1024;

/// Topic and payload bytes after which a batch is full whatever its
/// count: a batch of large retained payloads stays about this size.
const BATCH_BYTES: usize = 1 << 20;

/// One value of a batch: where its topic and payload are in the buffer,
/// and the rest as lent.
struct Packed {
    offset: u64,
    timestamp: UnixNanos,
    /// The topic is `bytes[start..topic_end]`, the payload
    /// `bytes[topic_end..end]`, where `start` is the previous value's `end`.
    topic_end: usize,
    end: usize,
    qos: u8,
    retain: bool,
    /// Only for a value with properties (rare among retained messages).
    properties: Option<Box<(PublishProps, Vec<UserProperty>)>>,
    /// The store's handle on the value, when it lent one: its topic and
    /// payload are then read from it, and nothing is copied into `bytes`.
    kept: Option<Kept>,
}

#[derive(Default)]
pub(super) struct ServedBatch {
    bytes: Vec<u8>,
    values: Vec<Packed>,
}

impl ServedBatch {
    /// Copy `value` in. Returns true once the batch is full.
    pub(super) fn push(&mut self, value: ServedValue<'_>) -> bool {
        if self.values.is_empty() {
            self.values.reserve(BATCH_VALUES);
        }
        let kept = value.kept.cloned();
        let topic_end = match kept {
            Some(_) => self.bytes.len(),
            None => {
                self.bytes.extend_from_slice(value.topic.as_bytes());
                let topic_end = self.bytes.len();
                self.bytes.extend_from_slice(value.payload);
                topic_end
            }
        };
        let properties = (!value.is_plain())
            .then(|| Box::new((value.props.clone(), value.user_properties.to_vec())));
        self.values.push(Packed {
            offset: value.offset,
            timestamp: value.timestamp,
            topic_end,
            end: self.bytes.len(),
            qos: value.qos,
            retain: value.retain,
            properties,
            kept,
        });
        self.values.len() == BATCH_VALUES || self.bytes.len() >= BATCH_BYTES
    }

    pub(super) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Lend every value to `each`, in the order they were pushed.
    pub(super) fn for_each(&self, each: &mut dyn FnMut(ServedValue<'_>)) {
        let mut start = 0;
        for packed in &self.values {
            let (topic, payload) = match &packed.kept {
                Some(kept) => (kept.topic(), kept.payload()),
                None => (
                    // SAFETY: `push` copied the topic whole from a `&str`,
                    // and `start..topic_end` are the ends of that copy.
                    unsafe { std::str::from_utf8_unchecked(&self.bytes[start..packed.topic_end]) },
                    &self.bytes[packed.topic_end..packed.end],
                ),
            };
            let (props, user_properties) = match &packed.properties {
                Some(properties) => (&properties.0, properties.1.as_slice()),
                None => (PublishProps::none(), &[][..]),
            };
            each(ServedValue {
                offset: packed.offset,
                topic,
                payload,
                timestamp: packed.timestamp,
                qos: packed.qos,
                retain: packed.retain,
                props,
                user_properties,
                kept: packed.kept.as_ref(),
            });
            start = packed.end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saguin_format::model::Record;

    fn record(topic: &str, payload: &[u8]) -> Record {
        Record {
            offset: 7,
            timestamp: 11,
            qos: 1,
            retain: true,
            ..Record::new(topic, payload.to_vec())
        }
    }

    #[test]
    fn values_come_back_as_lent_properties_included() {
        let plain = record("a/b", b"one");
        let mut with_properties = record("a/c", b"");
        with_properties.props.content_type = Some("text/plain".into());
        with_properties.user_properties.push(UserProperty {
            name: "k".into(),
            value: "v".into(),
        });
        let unicode = record("ü/ß", b"three");
        let mut batch = ServedBatch::default();
        for r in [&plain, &with_properties, &unicode] {
            assert!(!batch.push(ServedValue::of(r)));
        }
        let mut back = Vec::new();
        batch.for_each(&mut |v| {
            back.push((
                v.offset,
                v.topic.to_owned(),
                v.payload.to_vec(),
                v.timestamp,
                v.qos,
                v.retain,
                v.props.clone(),
                v.user_properties.to_vec(),
            ))
        });
        let want: Vec<_> = [&plain, &with_properties, &unicode]
            .iter()
            .map(|r| {
                (
                    r.offset,
                    r.topic.clone(),
                    r.payload.to_vec(),
                    r.timestamp,
                    r.qos,
                    r.retain,
                    (*r.props).clone(),
                    r.user_properties.clone(),
                )
            })
            .collect();
        assert_eq!(back, want);
    }

    /// A value lent with the store's handle comes over as that handle:
    /// nothing of it is copied into the batch.
    #[test]
    fn a_value_lent_with_its_handle_comes_over_as_the_handle() {
        let kept = Kept::new(&record("a/b", b"one"));
        let copied = record("a/c", b"two");
        let mut batch = ServedBatch::default();
        assert!(!batch.push(kept.served()));
        assert!(batch.bytes.is_empty(), "nothing copied");
        assert!(!batch.push(ServedValue::of(&copied)));
        let mut back = Vec::new();
        batch.for_each(&mut |v| {
            back.push((
                v.topic.to_owned(),
                v.payload.to_vec(),
                v.offset,
                v.kept.cloned(),
            ))
        });
        let [(topic, payload, offset, Some(handle)), (topic2, payload2, _, None)] = back.as_slice()
        else {
            panic!("{back:?}");
        };
        assert!(Kept::ptr_eq(handle, &kept));
        assert_eq!(
            (topic.as_str(), payload.as_slice(), *offset),
            ("a/b", &b"one"[..], 7)
        );
        assert_eq!((topic2.as_str(), payload2.as_slice()), ("a/c", &b"two"[..]));
    }

    #[test]
    fn a_batch_is_full_at_its_count_or_its_bytes() {
        let small = record("t", b"v");
        let mut batch = ServedBatch::default();
        let full_at = (1..=BATCH_VALUES + 1)
            .find(|_| batch.push(ServedValue::of(&small)))
            .unwrap();
        assert_eq!(full_at, BATCH_VALUES);

        let large = record("t", &vec![0; BATCH_BYTES / 2]);
        let mut batch = ServedBatch::default();
        assert!(!batch.push(ServedValue::of(&large)));
        assert!(batch.push(ServedValue::of(&large)));
    }
}
