//! Reads of channel records for consumers, off the broker task.
//!
//! The state asks for a window of records ([`ChannelRead`]) when a
//! consumer is behind; the answer comes back as
//! [`Event::ChannelRead`]. A memory channel's read is a lock and a copy,
//! so it is answered inline, like its writes. A sqlite channel's read runs
//! on the blocking pool against the provider's read connections (one read
//! transaction each: the floor and the records from one snapshot), so a
//! slow read holds back that consumer alone - no publisher, no other
//! consumer and not the broker task.
//!
//! A latest channel is read two ways: its current values under a
//! consumer's filters ([`Seek::Current`], each filter narrowed by the
//! store to the topic its literal prefix names and those under it), and
//! what changed since an offset, a window at a time, deletions as empty
//! payloads - or, once the floor has passed deletions a consumer was owed,
//! every row again from the first offset ([`contract::read_changes`]).
//! A queue is read for the records
//! available at the state's moment ([`Seek::Time`]): a read only, the
//! lease that follows is a write.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use saguin_format::model::Record;
use tokio::sync::mpsc;

use super::metrics::Metrics;
use super::providers::ServedChannel;
use super::state::{ChannelRead, Event, ReadWindow, Seek, StorageFailure};
use crate::storage::contract::{
    self, AppendStore, ChannelStore, LatestStore, LentRecord, ProviderKind, QueueStore,
    StorageError,
};

/// Times a read moves up to a floor that rose under it before it gives up
/// (retention removing records as fast as a consumer reads them).
const FLOOR_RETRIES: usize = 8;

/// One window of `store` from `from`, at most `max` records. A seek below
/// the floor starts at the floor and says so (the gap); `Earliest` and a
/// time start at what is held and report none.
pub fn read_window(
    store: &dyn AppendStore,
    from: Seek,
    max: usize,
) -> Result<ReadWindow, StorageError> {
    let (mut at, asked) = match from {
        Seek::Offset(offset) => (offset, true),
        Seek::Earliest => (store.floor(), false),
        Seek::Time(time) => match store.first_at_or_after(time)? {
            Some(offset) => (offset, false),
            None => (store.next(), false),
        },
        Seek::Current | Seek::Resync { .. } => {
            return Err(StorageError::Invalid {
                what: format!("channel {}", store.name()),
                detail: "an append channel has no current values".into(),
            })
        }
    };
    let mut floor = None;
    for _ in 0..FLOOR_RETRIES {
        match store.lend_from_n(at, max) {
            Ok(mut records) => {
                on_channel_topics(store.name(), &mut records);
                return Ok(ReadWindow {
                    start: at,
                    floor,
                    records,
                    next: None,
                });
            }
            Err(StorageError::BelowFloor { floor: raised, .. }) => {
                if asked {
                    floor = Some(raised);
                }
                at = raised;
            }
            Err(StorageError::PastNext { .. }) => {
                return Ok(ReadWindow {
                    start: at,
                    floor,
                    records: Vec::new(),
                    next: None,
                })
            }
            Err(e) => return Err(e),
        }
    }
    Err(StorageError::Backend {
        context: format!("channel {}: reading from offset {at}", store.name()),
        detail: "retention kept removing the records being read".into(),
    })
}

/// Records a queue moved into its dead-letter channel keep the queue's
/// topic (`jobs/email`); they are read on the dead-letter channel's own
/// (`jobs.dlq/email`), so its consumers' filters match them.
fn on_channel_topics(channel: &str, records: &mut [LentRecord]) {
    for lent in records {
        let topic = lent.topic();
        // Most records are on the channel's own topics: told by their
        // first bytes, without searching each topic for its first level.
        let own = topic
            .strip_prefix(channel)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if own {
            continue;
        }
        // Another channel's topic: the rest past its first level goes
        // under this one.
        let topic = match topic.split_once('/') {
            Some((_, rest)) => format!("{channel}/{rest}"),
            None => channel.to_owned(),
        };
        // The record, whole, with the dead-letter channel's topic.
        match lent {
            LentRecord::Whole(record) => Arc::make_mut(record).topic = topic,
            LentRecord::Kept(kept) => {
                let record = Record {
                    topic,
                    ..kept.record_sharing()
                };
                *lent = LentRecord::whole(record);
            }
        }
    }
}

/// A latest channel read: the current values under `filters`
/// ([`Seek::Current`]), or at most `max` changes from an offset,
/// deletions as empty payloads ([`contract::read_changes`]: a reader the
/// floor passed starts over at the first offset, the window's `floor`
/// saying so). A window that holds every change says up to where
/// (`next`), so a consumer passes offsets later values replaced.
pub fn read_latest(
    store: &dyn LatestStore,
    from: Seek,
    filters: &[String],
    max: usize,
) -> Result<ReadWindow, StorageError> {
    match from {
        Seek::Current => {
            let start = store.next();
            let mut records = Vec::new();
            for filter in filters {
                records.extend(store.match_filter(filter)?);
            }
            records.sort_by_key(|r| r.offset);
            records.dedup_by_key(|r| r.offset);
            Ok(ReadWindow {
                start,
                floor: None,
                records: records.into_iter().map(LentRecord::whole).collect(),
                next: None,
            })
        }
        Seek::Offset(since) => read_latest_changes(store, since, since, max),
        Seek::Resync { from, floor } => read_latest_changes(store, from, floor, max),
        other => Err(StorageError::Invalid {
            what: format!("channel {}", store.name()),
            detail: format!("a latest channel is not read from {other:?}"),
        }),
    }
}

/// At most `max` changes of `store` from `from` for a reader relying on
/// the deletion markers from `relied` ([`contract::read_changes`]).
fn read_latest_changes(
    store: &dyn LatestStore,
    from: u64,
    relied: u64,
    max: usize,
) -> Result<ReadWindow, StorageError> {
    let whole = format!("{}/#", store.name());
    let next = store.next();
    // One more than the window: whether it holds every change.
    let ask = max.saturating_add(1);
    let changes = contract::read_changes(store, &whole, from, relied, ask)?;
    let mut records = changes.records;
    let complete = records.len() <= max;
    records.truncate(max);
    let last = records.last().map_or(0, |r| r.offset + 1);
    Ok(ReadWindow {
        start: changes.start,
        floor: changes.resync,
        records: records.into_iter().map(LentRecord::whole).collect(),
        next: complete.then_some(next.max(last)),
    })
}

/// The records of `store` available at the moment `from` names
/// ([`Seek::Time`]), at most `max`, oldest first.
pub fn read_queue(
    store: &dyn QueueStore,
    from: Seek,
    max: usize,
) -> Result<ReadWindow, StorageError> {
    let Seek::Time(now) = from else {
        return Err(StorageError::Invalid {
            what: format!("queue {}", store.name()),
            detail: format!("a queue is offered at a moment, not from {from:?}"),
        });
    };
    let records = store
        .offer(max, now)?
        .into_iter()
        .map(|item| LentRecord::whole(item.record))
        .collect();
    Ok(ReadWindow {
        start: 0,
        floor: None,
        records,
        next: None,
    })
}

/// One read of whichever kind of channel `store` is.
fn read_any(store: &ChannelStore, read: &ChannelRead) -> Result<ReadWindow, StorageError> {
    match store {
        ChannelStore::Append(s) => read_window(&**s, read.from, read.max),
        ChannelStore::Latest(s) => read_latest(&**s, read.from, &read.filters, read.max),
        ChannelStore::Queue(s) => read_queue(&**s, read.from, read.max),
    }
}

struct Source {
    /// Reads made of the channel (`saguin_channel_reads_total`).
    reads: Arc<AtomicU64>,
    store: ChannelStore,
    provider: String,
    inline: bool,
}

/// The readers of every served channel, by the channel's index.
pub struct Readers {
    sources: Vec<Source>,
    answers: mpsc::UnboundedSender<Event>,
    metrics: Arc<Metrics>,
}

impl Readers {
    pub fn new(
        channels: &[ServedChannel],
        metrics: Arc<Metrics>,
        answers: mpsc::UnboundedSender<Event>,
    ) -> Readers {
        Readers {
            sources: channels
                .iter()
                .map(|c| Source {
                    reads: metrics.channel_reads(&c.name),
                    store: c.store.clone(),
                    provider: c.provider.name().to_owned(),
                    inline: c.provider.kind() == ProviderKind::Memory,
                })
                .collect(),
            answers,
            metrics,
        }
    }

    /// Where tasks beside the readers tell the state of what the stores
    /// did (retention's removals).
    pub fn answers(&self) -> mpsc::UnboundedSender<Event> {
        self.answers.clone()
    }

    /// Make `read`: an inline channel's answer is returned, the others
    /// arrive later on the answer channel.
    pub fn submit(&self, read: ChannelRead) -> Option<Event> {
        let ticket = read.ticket;
        let Some(source) = self.sources.get(usize::from(read.channel)) else {
            return Some(Event::ChannelRead {
                ticket,
                result: Err(StorageFailure {
                    full: false,
                    message: format!("no channel of index {}", read.channel),
                }),
            });
        };
        source.reads.fetch_add(1, Relaxed);
        if source.inline {
            let result = read_any(&source.store, &read);
            return Some(Event::ChannelRead {
                ticket,
                result: self.failure(&source.provider, result),
            });
        }
        let store = source.store.clone();
        let provider = source.provider.clone();
        let answers = self.answers.clone();
        let metrics = self.metrics.clone();
        tokio::task::spawn_blocking(move || {
            let result = read_any(&store, &read);
            let result = failure(&metrics, &provider, result);
            let _ = answers.send(Event::ChannelRead { ticket, result });
        });
        None
    }

    fn failure(
        &self,
        provider: &str,
        result: Result<ReadWindow, StorageError>,
    ) -> Result<ReadWindow, StorageFailure> {
        failure(&self.metrics, provider, result)
    }
}

/// A failed read is counted against its provider like a failed write.
fn failure(
    metrics: &Metrics,
    provider: &str,
    result: Result<ReadWindow, StorageError>,
) -> Result<ReadWindow, StorageFailure> {
    result.map_err(|e| {
        metrics.storage_error(provider, e.kind());
        StorageFailure {
            full: false,
            message: e.to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::contract::Provider;
    use crate::storage::memory::MemoryProvider;
    use saguin_format::model::{ChannelKind, Record};

    fn channel() -> Arc<dyn AppendStore> {
        let provider = MemoryProvider::unbounded();
        let store = provider
            .open_channel("telemetry", ChannelKind::Append)
            .unwrap();
        store.as_append().unwrap().clone()
    }

    fn record(at: i64) -> Record {
        let mut r = Record::new("telemetry/a", vec![1u8; 8]);
        r.timestamp = at;
        r
    }

    /// Every read made for a channel's consumers is counted against the
    /// channel, each served channel's series there before its first.
    #[test]
    fn reads_are_counted_by_channel() {
        let provider = MemoryProvider::unbounded();
        let served = |name: &str| ServedChannel {
            name: Arc::from(name),
            provider: provider.clone(),
            store: provider.open_channel(name, ChannelKind::Append).unwrap(),
            retention: contract::Retention::default(),
            queue: None,
        };
        let metrics = Arc::new(Metrics::new());
        let readers = Readers::new(
            &[served("telemetry"), served("audit")],
            metrics.clone(),
            mpsc::unbounded_channel().0,
        );
        assert!(metrics
            .render()
            .contains("saguin_channel_reads_total{channel=\"audit\"} 0\n"));
        for ticket in 1..=3 {
            let read = ChannelRead {
                ticket,
                channel: 0,
                from: Seek::Earliest,
                max: 16,
                filters: Vec::new(),
            };
            assert!(matches!(
                readers.submit(read),
                Some(Event::ChannelRead { result: Ok(_), .. })
            ));
        }
        assert_eq!(metrics.channel_read_count("telemetry"), 3);
        assert_eq!(metrics.channel_read_count("audit"), 0);
        assert!(metrics
            .render()
            .contains("saguin_channel_reads_total{channel=\"telemetry\"} 3\n"));
    }

    /// A record keeps its topic when it is on the channel's topics, and is
    /// read under the channel's first level when it is not, whatever the
    /// two names share.
    #[test]
    fn records_are_read_on_the_channels_own_topics() {
        use crate::storage::kept::Kept;
        let lent = |topic: &str| {
            let mut record = Record::new(topic, vec![7u8; 4]);
            record.offset = 1;
            [
                LentRecord::whole(record.clone()),
                LentRecord::Kept(Kept::new(&record)),
            ]
        };
        for (topic, read_as) in [
            ("jobs.dlq/email", "jobs.dlq/email"),
            ("jobs.dlq", "jobs.dlq"),
            ("jobs/email/urgent", "jobs.dlq/email/urgent"),
            ("jobs", "jobs.dlq"),
            ("jobs.dlqx/email", "jobs.dlq/email"),
            ("jobs.dl/email", "jobs.dlq/email"),
        ] {
            let mut records = lent(topic);
            on_channel_topics("jobs.dlq", &mut records);
            for record in &records {
                assert_eq!(record.topic(), read_as, "{topic}");
                assert_eq!(&record.payload()[..], &[7u8; 4]);
            }
        }
    }

    #[test]
    fn a_seek_below_the_floor_reports_the_floor() {
        let store = channel();
        for t in 1..=10 {
            store.append(record(t)).unwrap();
        }
        store.trim(6, None).unwrap();
        let w = read_window(&*store, Seek::Offset(2), 3).unwrap();
        assert_eq!(w.start, 6);
        assert_eq!(w.floor, Some(6));
        let offsets: Vec<u64> = w.records.iter().map(LentRecord::offset).collect();
        assert_eq!(offsets, vec![6, 7, 8]);
        // The oldest held is no gap.
        let w = read_window(&*store, Seek::Earliest, 100).unwrap();
        assert_eq!((w.start, w.floor, w.records.len()), (6, None, 5));
    }

    #[test]
    fn a_time_seek_looks_at_every_record() {
        let store = channel();
        // The receipt clock stepped back after the third record.
        for t in [100, 200, 300, 150, 400] {
            store.append(record(t)).unwrap();
        }
        let w = read_window(&*store, Seek::Time(250), 10).unwrap();
        assert_eq!(w.start, 3);
        assert_eq!(w.floor, None);
        let w = read_window(&*store, Seek::Time(500), 10).unwrap();
        assert_eq!((w.start, w.records.len()), (6, 0));
    }

    #[test]
    fn a_seek_at_next_is_an_empty_window() {
        let store = channel();
        store.append(record(1)).unwrap();
        let w = read_window(&*store, Seek::Offset(2), 10).unwrap();
        assert_eq!((w.start, w.floor, w.records.len()), (2, None, 0));
        let w = read_window(&*store, Seek::Offset(9), 10).unwrap();
        assert!(w.records.is_empty());
    }

    /// A dead-letter channel's records keep their queue's topic in the
    /// store; a read lends them with the channel's own, every other part
    /// as stored.
    #[test]
    fn a_dead_letter_channels_records_are_read_with_its_topic() {
        let provider = MemoryProvider::unbounded();
        let store = provider
            .open_channel("jobs.dlq", ChannelKind::Append)
            .unwrap();
        let store = store.as_append().unwrap().clone();
        let moved = Record {
            client_id: "worker-1".into(),
            ..record(5)
        };
        store
            .append(Record {
                topic: "jobs/email".into(),
                ..moved.clone()
            })
            .unwrap();
        store
            .append(Record {
                topic: "jobs.dlq/sms".into(),
                ..moved.clone()
            })
            .unwrap();
        let w = read_window(&*store, Seek::Earliest, 10).unwrap();
        let read: Vec<(&str, &str, u64)> = w
            .records
            .iter()
            .map(|r| (r.topic(), r.client_id(), r.offset()))
            .collect();
        assert_eq!(
            read,
            [
                ("jobs.dlq/email", "worker-1", 1),
                ("jobs.dlq/sms", "worker-1", 2)
            ]
        );
        assert!(matches!(w.records[0], LentRecord::Whole(_)), "rewritten");
        assert!(matches!(w.records[1], LentRecord::Kept(_)), "lent as kept");
        assert_eq!(&w.records[0].payload()[..], &moved.payload[..]);
    }
}
