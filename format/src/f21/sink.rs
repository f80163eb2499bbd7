//! What the decoder does with each record it decodes.
//!
//! One decoder serves both the loader and `saguin snapshot verify`: the
//! same parsing and the same semantic checks run whichever sink receives
//! the records, so a file `verify` calls valid is one the loader accepts.
//! The loader's sink ([`Collect`]) keeps every record; a checker's
//! ([`Tally`]) counts them and drops each as soon as it has been checked,
//! so its peak memory is its input (the file's bytes, or a stream's
//! window: [`super::decode_stream`]) plus a few words per list (and the
//! topic set of a latest channel or the retained store).

use super::types::QueueItem;
use crate::model::Record;

/// Which list of a file a record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordList {
    /// A channel's `records` (append or latest).
    ChannelRecords,
    /// A queue's dead-letter channel's `records`.
    DeadLetterRecords,
    /// The retained store's `records`.
    Retained,
    /// The broadcast log's `messages`.
    BroadcastMessages,
    /// A queue's `items`, handed to [`RecordSink::item`].
    QueueItems,
}

/// Receives each record and queue item of a file's record lists as it is
/// decoded, after its per-record checks ran (the file's verdict comes when
/// the whole file has been read). Positions, held publishes, sessions and
/// the manifest are always kept: they are small and the file-level rules
/// need them whole.
pub trait RecordSink {
    /// How many of the `count` elements of `list` about to be decoded the
    /// sink will put in the decoded file's list, to size it once; a sink
    /// keeping them itself may size its own store here. `count` has been
    /// checked against the bytes left, so it is never larger than the
    /// input can justify.
    fn capacity(&mut self, list: RecordList, count: usize) -> usize;

    /// A decoded record of `list`; push it onto `kept` to keep it.
    fn record(&mut self, list: RecordList, record: Record, kept: &mut Vec<Record>);

    /// A decoded queue item; push it onto `kept` to keep it.
    fn item(&mut self, item: QueueItem, kept: &mut Vec<QueueItem>);
}

/// A sink lent for one decode: what it receives goes to the one lent.
impl<S: RecordSink + ?Sized> RecordSink for &mut S {
    #[inline]
    fn capacity(&mut self, list: RecordList, count: usize) -> usize {
        (**self).capacity(list, count)
    }

    #[inline]
    fn record(&mut self, list: RecordList, record: Record, kept: &mut Vec<Record>) {
        (**self).record(list, record, kept)
    }

    #[inline]
    fn item(&mut self, item: QueueItem, kept: &mut Vec<QueueItem>) {
        (**self).item(item, kept)
    }
}

/// Keeps every record: the decoded file is whole. What the loader uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Collect;

impl RecordSink for Collect {
    #[inline]
    fn capacity(&mut self, _: RecordList, count: usize) -> usize {
        count
    }

    #[inline]
    fn record(&mut self, _: RecordList, record: Record, kept: &mut Vec<Record>) {
        kept.push(record);
    }

    #[inline]
    fn item(&mut self, item: QueueItem, kept: &mut Vec<QueueItem>) {
        kept.push(item);
    }
}

/// Keeps no record or queue item, only their number and accounted bytes:
/// the decoded file's record lists come back empty. What a checker uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Records of every list, queue items' records included.
    pub records: u64,
    /// Their [`Record::accounted_size`], summed.
    pub accounted_bytes: u64,
    /// Their payload bytes, summed.
    pub payload_bytes: u64,
}

impl Tally {
    #[inline]
    fn count(&mut self, record: &Record) {
        self.records += 1;
        self.accounted_bytes += record.accounted_size();
        self.payload_bytes += record.payload.len() as u64;
    }
}

impl RecordSink for Tally {
    #[inline]
    fn capacity(&mut self, _: RecordList, _: usize) -> usize {
        0
    }

    #[inline]
    fn record(&mut self, _: RecordList, record: Record, _: &mut Vec<Record>) {
        self.count(&record);
    }

    #[inline]
    fn item(&mut self, item: QueueItem, _: &mut Vec<QueueItem>) {
        self.count(&item.record);
    }
}
