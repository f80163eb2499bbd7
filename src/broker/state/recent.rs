//! Records of an append channel read from its store lately, each with the
//! message its consumers receive, so that consumers near each other share
//! one read and one message instead of each reading and building its own.
//!
//! A read for one consumer asks for more than that consumer has room for
//! when the channel's records are small, and what it does not take now is
//! here when its room comes back, or when another consumer reaches those
//! offsets. A span is what one read found: every record the store held
//! between its `start` and its `end` at that moment. Spans never overlap;
//! the least used is let go first, past [`MAX_SPANS`] or
//! [`MAX_BYTES`] a channel.
//!
//! A span outlives nothing retention removed: the retention task tells the
//! state each channel's new floor ([`super::Event::FloorRaised`]) and what
//! is below it is let go at once, so the next read of a consumer that was
//! still behind it finds the floor and is told the gap.

use std::sync::Arc;

use saguin_format::model::Record;

use crate::broker::message::Message;

/// Spans one channel keeps.
pub(super) const MAX_SPANS: usize = 16;
/// Accounted bytes of records one channel keeps (one read's more may be
/// kept past it: what that read holds is in memory anyway).
pub(super) const MAX_BYTES: u64 = 1 << 20;

/// A record read lately, and the message consumers of it receive, once one
/// of them has been sent it.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub record: Arc<Record>,
    pub message: Option<Arc<Message>>,
}

#[derive(Debug)]
struct Span {
    start: u64,
    end: u64,
    entries: Vec<Entry>,
    bytes: u64,
    /// When it was last looked up, on [`Recent::clock`].
    used: u64,
}

impl Span {
    /// The index of the first entry at or after `offset`.
    fn index_of(&self, offset: u64) -> usize {
        // Offsets are contiguous unless a write failed after taking one,
        // so the direct guess is right; the search covers the rest.
        let guess = offset.saturating_sub(self.start) as usize;
        if self
            .entries
            .get(guess)
            .is_some_and(|e| e.record.offset == offset)
        {
            return guess;
        }
        self.entries.partition_point(|e| e.record.offset < offset)
    }
}

/// One channel's records read lately.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// In the order of their offsets.
    spans: Vec<Span>,
    bytes: u64,
    records: u64,
    clock: u64,
}

/// What the records read lately say of an offset.
#[derive(Debug)]
pub(super) enum Lookup {
    /// The record at or next after the offset (the store held none in
    /// between), at this index of its span.
    Found(Entry, SpanAt),
    /// The offset is covered up to this end and holds no record: the store
    /// held none from the offset to there.
    Empty { end: u64 },
    /// Nothing is known of the offset: it takes a read.
    Unknown,
}

/// Where a found entry is, to give it its message.
#[derive(Debug, Clone, Copy)]
pub(super) struct SpanAt {
    start: u64,
    index: usize,
}

impl Recent {
    /// Accounted bytes a record takes on average here, once any is kept.
    pub fn record_bytes(&self) -> Option<u64> {
        (self.records > 0).then(|| (self.bytes / self.records).max(1))
    }

    pub fn lookup(&mut self, offset: u64) -> Lookup {
        self.clock += 1;
        let clock = self.clock;
        let Some(span) = self.covering(offset).map(|i| &mut self.spans[i]) else {
            return Lookup::Unknown;
        };
        span.used = clock;
        let index = span.index_of(offset);
        match span.entries.get(index) {
            Some(entry) => Lookup::Found(
                entry.clone(),
                SpanAt {
                    start: span.start,
                    index,
                },
            ),
            None => Lookup::Empty { end: span.end },
        }
    }

    /// The message built for the entry `at` names, for the consumers after.
    pub fn set_message(&mut self, at: SpanAt, message: &Arc<Message>) {
        if let Some(entry) = self
            .covering(at.start)
            .and_then(|i| self.spans[i].entries.get_mut(at.index))
        {
            entry.message = Some(message.clone());
        }
    }

    /// Keep what a read from `start` found (`records`, ascending). The part
    /// another span already covers is left to it.
    pub fn insert(&mut self, start: u64, records: Vec<Arc<Record>>) {
        let Some(last) = records.last().map(|r| r.offset) else {
            return;
        };
        let mut start = start;
        while let Some(i) = self.covering(start) {
            start = self.spans[i].end;
        }
        // The new span ends where the next span begins, so none overlap.
        let at = self.spans.partition_point(|s| s.start < start);
        let end = self
            .spans
            .get(at)
            .map_or(last + 1, |next| next.start.min(last + 1));
        if start >= end {
            return;
        }
        let mut bytes = 0;
        let entries: Vec<Entry> = records
            .into_iter()
            .skip_while(|r| r.offset < start)
            .take_while(|r| r.offset < end)
            .map(|record| {
                bytes += record.accounted_size();
                Entry {
                    record,
                    message: None,
                }
            })
            .collect();
        self.clock += 1;
        self.bytes += bytes;
        self.records += entries.len() as u64;
        self.spans.insert(
            at,
            Span {
                start,
                end,
                entries,
                bytes,
                used: self.clock,
            },
        );
        self.evict();
    }

    /// The span covering `offset`.
    fn covering(&self, offset: u64) -> Option<usize> {
        let after = self.spans.partition_point(|s| s.start <= offset);
        let i = after.checked_sub(1)?;
        (offset < self.spans[i].end).then_some(i)
    }

    /// Let go of every record below `floor` (retention removed them).
    pub fn remove_below(&mut self, floor: u64) {
        for span in &mut self.spans {
            if span.start >= floor {
                continue;
            }
            let gone = span.entries.partition_point(|e| e.record.offset < floor);
            let bytes: u64 = span.entries[..gone]
                .iter()
                .map(|e| e.record.accounted_size())
                .sum();
            span.entries.drain(..gone);
            span.bytes -= bytes;
            self.bytes -= bytes;
            self.records -= gone as u64;
            span.start = floor.min(span.end);
        }
        self.spans.retain(|s| s.start < s.end);
    }

    /// Let go of the least used spans past the bounds; the newest stays.
    fn evict(&mut self) {
        while self.spans.len() > 1 && (self.spans.len() > MAX_SPANS || self.bytes > MAX_BYTES) {
            let Some(oldest) = self
                .spans
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.used)
                .map(|(i, _)| i)
            else {
                return;
            };
            let span = self.spans.remove(oldest);
            self.bytes -= span.bytes;
            self.records -= span.entries.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(offsets: impl IntoIterator<Item = u64>) -> Vec<Arc<Record>> {
        offsets
            .into_iter()
            .map(|offset| {
                let mut r = Record::new("telemetry/a", vec![0u8; 100]);
                r.offset = offset;
                Arc::new(r)
            })
            .collect()
    }

    fn found(recent: &mut Recent, offset: u64) -> Option<u64> {
        match recent.lookup(offset) {
            Lookup::Found(entry, _) => Some(entry.record.offset),
            _ => None,
        }
    }

    #[test]
    fn a_read_is_found_by_every_offset_it_covers_and_nothing_else() {
        let mut recent = Recent::default();
        recent.insert(10, records(10..20));
        assert_eq!(found(&mut recent, 10), Some(10));
        assert_eq!(found(&mut recent, 19), Some(19));
        assert!(matches!(recent.lookup(20), Lookup::Unknown));
        assert!(matches!(recent.lookup(9), Lookup::Unknown));
    }

    #[test]
    fn an_offset_the_store_did_not_hold_is_found_as_the_next_record() {
        let mut recent = Recent::default();
        // A read asked from 5; the store's records began at 7.
        recent.insert(5, records([7, 8, 10]));
        assert_eq!(found(&mut recent, 5), Some(7));
        assert_eq!(found(&mut recent, 9), Some(10));
    }

    #[test]
    fn spans_never_overlap() {
        let mut recent = Recent::default();
        recent.insert(20, records(20..30));
        // A read from 15 that ran on past 20 keeps 15..20 only.
        recent.insert(15, records(15..25));
        assert_eq!(found(&mut recent, 15), Some(15));
        assert_eq!(found(&mut recent, 22), Some(22));
        assert_eq!(recent.records, 15);
        // A read from inside a span adds what lies past it.
        recent.insert(25, records(25..35));
        assert_eq!(recent.records, 20);
        assert_eq!(found(&mut recent, 31), Some(31));
        recent.insert(26, records(26..30));
        assert_eq!(recent.records, 20);
    }

    #[test]
    fn retention_lets_go_of_what_it_removed() {
        let mut recent = Recent::default();
        recent.insert(1, records(1..11));
        recent.insert(20, records(20..25));
        recent.remove_below(5);
        assert!(matches!(recent.lookup(4), Lookup::Unknown));
        assert_eq!(found(&mut recent, 5), Some(5));
        recent.remove_below(22);
        assert!(matches!(recent.lookup(10), Lookup::Unknown));
        assert!(matches!(recent.lookup(21), Lookup::Unknown));
        assert_eq!(found(&mut recent, 22), Some(22));
        assert_eq!(recent.records, 3);
    }

    #[test]
    fn the_least_used_span_goes_first() {
        let mut recent = Recent::default();
        for i in 0..MAX_SPANS as u64 {
            recent.insert(i * 10, records(i * 10..i * 10 + 5));
        }
        // The first is used; the second is now the least used.
        assert_eq!(found(&mut recent, 0), Some(0));
        let far = MAX_SPANS as u64 * 10;
        recent.insert(far, records(far..far + 5));
        assert_eq!(found(&mut recent, 0), Some(0));
        assert!(matches!(recent.lookup(10), Lookup::Unknown));
        assert_eq!(found(&mut recent, far), Some(far));
    }

    #[test]
    fn bytes_are_bounded_and_the_newest_read_is_kept() {
        let mut recent = Recent::default();
        let per = records([0])[0].accounted_size();
        let fit = MAX_BYTES / per;
        recent.insert(0, records(0..fit));
        recent.insert(fit + 10, records(fit + 10..fit + 20));
        assert!(recent.bytes <= MAX_BYTES || recent.spans.len() == 1);
        assert_eq!(found(&mut recent, fit + 10), Some(fit + 10));
        assert!(matches!(recent.lookup(0), Lookup::Unknown));
    }

    #[test]
    fn a_message_once_built_is_found_with_its_record() {
        let mut recent = Recent::default();
        recent.insert(1, records(1..3));
        let Lookup::Found(entry, at) = recent.lookup(2) else {
            panic!("found");
        };
        assert!(entry.message.is_none());
        let message = Arc::new(crate::broker::state::persist::message_from_record(
            &entry.record,
            tokio::time::Instant::now(),
        ));
        recent.set_message(at, &message);
        let Lookup::Found(entry, _) = recent.lookup(2) else {
            panic!("found");
        };
        assert!(entry.message.is_some_and(|m| Arc::ptr_eq(&m, &message)));
    }
}
