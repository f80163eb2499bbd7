//! A sink that keeps the first rows of a file's record lists as it reads
//! them and counts every one: what `saguin snapshot inspect` shows, and
//! what a migration knows of a channel before it carries its records.
//!
//! The files are read as streams (`Records::Into`), so a channel of ten
//! million records costs the memory of the rows kept, not of the file and
//! every record decoded from it.

use std::collections::HashMap;

use crate::storage::snapshot_dir::LoadSink;
use saguin_format::f21::{QueueItem, RecordList, RecordSink};
use saguin_format::model::Record;

/// How many elements each record list of a file held, counted as it was
/// read; the decoded file's lists keep only the rows shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListCounts {
    pub records: usize,
    pub items: usize,
    pub dead_letter: usize,
    pub messages: usize,
}

/// Keeps the first `keep` elements of each list of a channel and the
/// first `keep_messages` of the broadcast log (every retained message:
/// their topics are listed), and counts them all, file by file.
#[derive(Debug)]
pub struct Sample {
    keep: usize,
    keep_messages: usize,
    /// The file being read.
    current: ListCounts,
    /// Each file a directory's scan has read, by name.
    by_file: HashMap<String, ListCounts>,
}

impl Sample {
    /// A sample keeping `keep` rows of each list (`None`: all of them).
    pub fn keeping(keep: Option<u64>) -> Sample {
        let keep = keep.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        Sample {
            keep,
            keep_messages: keep,
            current: ListCounts::default(),
            by_file: HashMap::new(),
        }
    }

    /// A sample keeping no channel's records, queue items or dead letters
    /// and every other record: what a migration carries from each
    /// channel's file as it writes it.
    pub fn counting_channels() -> Sample {
        Sample {
            keep_messages: usize::MAX,
            ..Sample::keeping(Some(0))
        }
    }

    /// The counts of the one file read outside a directory's scan.
    pub fn counts(&self) -> ListCounts {
        self.current
    }

    /// The counts of the file `name` a directory's scan read.
    pub fn counts_of(&self, name: &str) -> ListCounts {
        self.by_file.get(name).copied().unwrap_or_default()
    }

    fn keep<T>(element: T, kept: &mut Vec<T>, keep: usize) {
        if kept.len() < keep {
            kept.push(element);
        }
    }
}

impl RecordSink for Sample {
    fn capacity(&mut self, list: RecordList, count: usize) -> usize {
        match list {
            RecordList::Retained => count,
            RecordList::BroadcastMessages => count.min(self.keep_messages),
            _ => count.min(self.keep),
        }
    }

    fn record(&mut self, list: RecordList, record: Record, kept: &mut Vec<Record>) {
        let (count, keep) = match list {
            RecordList::Retained => {
                kept.push(record);
                return;
            }
            RecordList::ChannelRecords => (&mut self.current.records, self.keep),
            RecordList::DeadLetterRecords => (&mut self.current.dead_letter, self.keep),
            RecordList::BroadcastMessages => (&mut self.current.messages, self.keep_messages),
            RecordList::QueueItems => (&mut self.current.items, self.keep),
        };
        *count += 1;
        Sample::keep(record, kept, keep);
    }

    fn item(&mut self, item: QueueItem, kept: &mut Vec<QueueItem>) {
        self.current.items += 1;
        Sample::keep(item, kept, self.keep);
    }
}

impl LoadSink for Sample {
    fn file_read(&mut self, file: &str, _decoded: bool) {
        let counts = std::mem::take(&mut self.current);
        self.by_file.insert(file.to_owned(), counts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_keeps_what_it_shows_and_counts_everything() {
        let mut sample = Sample::keeping(Some(2));
        let mut kept = Vec::new();
        assert_eq!(sample.capacity(RecordList::ChannelRecords, 1_000), 2);
        for i in 0..5 {
            sample.record(
                RecordList::ChannelRecords,
                Record::new(format!("t/{i}"), &b""[..]),
                &mut kept,
            );
        }
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1].topic, "t/1");
        let mut retained = Vec::new();
        for i in 0..3 {
            sample.record(
                RecordList::Retained,
                Record::new(format!("r/{i}"), &b"x"[..]),
                &mut retained,
            );
        }
        assert_eq!(retained.len(), 3, "every retained message is listed");
        assert_eq!(sample.counts().records, 5);
        sample.file_read("a.snapshot", true);
        assert_eq!(sample.counts_of("a.snapshot").records, 5);
        assert_eq!(
            sample.counts(),
            ListCounts::default(),
            "the next file counts afresh"
        );
    }
}
