//! Records of an append channel read from its store lately or committed
//! lately, each with the message its consumers receive, so that consumers
//! near each other share one read and one message instead of each reading
//! and building its own.
//!
//! A read for one consumer asks for more than that consumer has room for
//! when the channel's records are small, and what it does not take now is
//! here when its room comes back, or when another consumer reaches those
//! offsets. A span is what one read found: every record the store held
//! between its `start` and its `end` at that moment. Spans never overlap;
//! the least used is let go first, past [`max_spans`] or [`MAX_BYTES`] a
//! channel. The bytes bound what the reads hold; the count grows with the
//! channel's consumers, so that consumers spread along a channel (a burst
//! they catch up on at different speeds) keep the spans they read from
//! instead of letting each other's go and reading every record again.
//!
//! A record committed while the channel has consumers is added to the
//! span that ends at its offset ([`Recent::append`]), with the message
//! built for it: the channel's tail is here, so a consumer a little behind
//! (its window was full when the record came) is sent it without a read.
//! The tail span gives back its oldest records past [`MAX_BYTES`], a
//! quarter at a time, so appends do not move the rest one by one.
//!
//! A span outlives nothing retention removed: the retention task tells the
//! state each channel's new floor ([`super::Event::FloorRaised`]) and what
//! is below it is let go at once, so the next read of a consumer that was
//! still behind it finds the floor and is told the gap.

use std::sync::Arc;

use crate::broker::message::Message;
use crate::storage::contract::LentRecord;

/// Spans one channel keeps at least.
pub(super) const MIN_SPANS: usize = 16;

/// Spans a channel with `consumers` keeps: two for each (the span it reads
/// from and the one a read ahead of it made), at least [`MIN_SPANS`].
pub(super) fn max_spans(consumers: usize) -> usize {
    MIN_SPANS.max(consumers.saturating_mul(2))
}
/// Accounted bytes of records one channel keeps (one read's more may be
/// kept past it: what that read holds is in memory anyway).
pub(super) const MAX_BYTES: u64 = 1 << 20;

/// A record read lately, and the message consumers of it receive, once one
/// of them has been sent it.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub record: LentRecord,
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
            .is_some_and(|e| e.record.offset() == offset)
        {
            return guess;
        }
        self.entries.partition_point(|e| e.record.offset() < offset)
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

/// The entries of one span from a consumer's offset on, taken out of the
/// span while they are handed out ([`Recent::take_run`]) and put back after
/// ([`Recent::put_back`]): sending a run costs no look-up a record, and the
/// records and messages are lent, not cloned.
#[derive(Debug)]
pub(super) struct Run {
    /// The span's start, which names it.
    start: u64,
    /// Where the span ends: every offset below it holds an entry or none.
    pub end: u64,
    pub entries: Vec<Entry>,
    /// The first entry at or after the offset asked.
    pub from: usize,
}

/// What the records read lately say of an offset holding none of them.
#[derive(Debug)]
pub(super) enum Lookup {
    /// The offset is covered up to this end and holds no record: the store
    /// held none from the offset to there.
    Empty { end: u64 },
    /// Nothing is known of the offset: it takes a read.
    Unknown,
}

impl Recent {
    /// Accounted bytes a record takes on average here, once any is kept.
    pub fn record_bytes(&self) -> Option<u64> {
        (self.records > 0).then(|| (self.bytes / self.records).max(1))
    }

    /// The span covering `offset`, its entries taken out from there on
    /// (see [`Run`]); `Lookup::Empty` and `Lookup::Unknown` as
    /// [`Recent::lookup`] says them.
    pub fn take_run(&mut self, offset: u64) -> Result<Run, Lookup> {
        self.clock += 1;
        let clock = self.clock;
        let Some(span) = self.covering(offset).map(|i| &mut self.spans[i]) else {
            return Err(Lookup::Unknown);
        };
        span.used = clock;
        let from = span.index_of(offset);
        if from >= span.entries.len() {
            return Err(Lookup::Empty { end: span.end });
        }
        Ok(Run {
            start: span.start,
            end: span.end,
            entries: std::mem::take(&mut span.entries),
            from,
        })
    }

    /// Give a span back the entries [`Recent::take_run`] took (with the
    /// messages built meanwhile). Nothing may change the spans between the
    /// two.
    pub fn put_back(&mut self, run: Run) {
        // Nothing changes the spans while a run is out (the state hands a
        // run out and puts it back within one call); were the span gone,
        // what it held would be let go with it.
        if let Some(i) = self.covering(run.start) {
            let span = &mut self.spans[i];
            if span.start == run.start && span.entries.is_empty() {
                span.entries = run.entries;
            }
        }
    }

    /// A record committed at the channel's tail, and the message its
    /// consumers receive: added to the span ending at its offset (or a span
    /// of its own), unless a read already holds it. The channel has
    /// `consumers` ([`max_spans`]).
    pub fn append(&mut self, record: LentRecord, message: Option<Arc<Message>>, consumers: usize) {
        let offset = record.offset();
        if self.covering(offset).is_some() {
            return;
        }
        self.clock += 1;
        let bytes = record.accounted_size();
        self.bytes += bytes;
        self.records += 1;
        let entry = Entry { record, message };
        let at = self.spans.partition_point(|s| s.start < offset);
        let extend = at.checked_sub(1).filter(|&i| self.spans[i].end == offset);
        match extend {
            Some(i) => {
                let span = &mut self.spans[i];
                span.entries.push(entry);
                span.end = offset + 1;
                span.bytes += bytes;
                span.used = self.clock;
            }
            None => {
                // A span after it would overlap it only if a read saw
                // the record before its commit came; covering said no.
                self.spans.insert(
                    at,
                    Span {
                        start: offset,
                        end: offset + 1,
                        entries: vec![entry],
                        bytes,
                        used: self.clock,
                    },
                );
            }
        }
        self.evict(consumers);
        if self.bytes > MAX_BYTES {
            if let Some(i) = self.spans.iter().position(|s| s.end == offset + 1) {
                self.trim_front(i);
            }
        }
    }

    /// Let go of span `i`'s oldest records until the channel keeps three
    /// quarters of [`MAX_BYTES`] (its newest record stays).
    fn trim_front(&mut self, i: usize) {
        let target = MAX_BYTES / 4 * 3;
        let span = &mut self.spans[i];
        let mut gone = 0;
        let mut freed = 0;
        while gone + 1 < span.entries.len() && self.bytes - freed > target {
            freed += span.entries[gone].record.accounted_size();
            gone += 1;
        }
        if gone == 0 {
            return;
        }
        span.entries.drain(..gone);
        span.start = span.entries[0].record.offset();
        span.bytes -= freed;
        self.bytes -= freed;
        self.records -= gone as u64;
    }

    /// Keep what a read from `start` found (`records`, ascending). The part
    /// another span already covers is left to it. The channel has
    /// `consumers` ([`max_spans`]).
    pub fn insert(&mut self, start: u64, records: Vec<LentRecord>, consumers: usize) {
        let Some(last) = records.last().map(LentRecord::offset) else {
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
            .skip_while(|r| r.offset() < start)
            .take_while(|r| r.offset() < end)
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
        self.evict(consumers);
    }

    /// Where the first span after `offset` starts.
    pub fn next_span_after(&self, offset: u64) -> Option<u64> {
        let at = self.spans.partition_point(|s| s.start <= offset);
        self.spans.get(at).map(|s| s.start)
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
            let gone = span.entries.partition_point(|e| e.record.offset() < floor);
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
    fn evict(&mut self, consumers: usize) {
        let max_spans = max_spans(consumers);
        while self.spans.len() > 1 && (self.spans.len() > max_spans || self.bytes > MAX_BYTES) {
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
    use saguin_format::model::Record;

    use super::*;
    use crate::storage::kept::Kept;

    /// Records at `offsets`, lent as a memory store lends them.
    fn records(offsets: impl IntoIterator<Item = u64>) -> Vec<LentRecord> {
        offsets
            .into_iter()
            .map(|offset| {
                let mut r = Record::new("telemetry/a", vec![0u8; 100]);
                r.offset = offset;
                LentRecord::Kept(Kept::new(&r))
            })
            .collect()
    }

    /// The offset of the record found at or after `offset`, its run put
    /// back.
    fn found(recent: &mut Recent, offset: u64) -> Option<u64> {
        let run = recent.take_run(offset).ok()?;
        let found = run.entries[run.from].record.offset();
        recent.put_back(run);
        Some(found)
    }

    fn unknown(recent: &mut Recent, offset: u64) -> bool {
        matches!(recent.take_run(offset), Err(Lookup::Unknown))
    }

    #[test]
    fn a_read_is_found_by_every_offset_it_covers_and_nothing_else() {
        let mut recent = Recent::default();
        recent.insert(10, records(10..20), 1);
        assert_eq!(found(&mut recent, 10), Some(10));
        assert_eq!(found(&mut recent, 19), Some(19));
        assert!(unknown(&mut recent, 20));
        assert!(unknown(&mut recent, 9));
    }

    #[test]
    fn an_offset_the_store_did_not_hold_is_found_as_the_next_record() {
        let mut recent = Recent::default();
        // A read asked from 5; the store's records began at 7.
        recent.insert(5, records([7, 8, 10]), 1);
        assert_eq!(found(&mut recent, 5), Some(7));
        assert_eq!(found(&mut recent, 9), Some(10));
    }

    #[test]
    fn a_read_is_told_where_the_next_span_starts() {
        let mut recent = Recent::default();
        assert_eq!(recent.next_span_after(0), None);
        recent.insert(10, records(10..20), 1);
        recent.insert(40, records(40..50), 1);
        assert_eq!(recent.next_span_after(0), Some(10));
        assert_eq!(recent.next_span_after(9), Some(10));
        assert_eq!(recent.next_span_after(10), Some(40));
        assert_eq!(recent.next_span_after(25), Some(40));
        assert_eq!(recent.next_span_after(40), None);
    }

    #[test]
    fn spans_never_overlap() {
        let mut recent = Recent::default();
        recent.insert(20, records(20..30), 1);
        // A read from 15 that ran on past 20 keeps 15..20 only.
        recent.insert(15, records(15..25), 1);
        assert_eq!(found(&mut recent, 15), Some(15));
        assert_eq!(found(&mut recent, 22), Some(22));
        assert_eq!(recent.records, 15);
        // A read from inside a span adds what lies past it.
        recent.insert(25, records(25..35), 1);
        assert_eq!(recent.records, 20);
        assert_eq!(found(&mut recent, 31), Some(31));
        recent.insert(26, records(26..30), 1);
        assert_eq!(recent.records, 20);
    }

    #[test]
    fn retention_lets_go_of_what_it_removed() {
        let mut recent = Recent::default();
        recent.insert(1, records(1..11), 1);
        recent.insert(20, records(20..25), 1);
        recent.remove_below(5);
        assert!(unknown(&mut recent, 4));
        assert_eq!(found(&mut recent, 5), Some(5));
        recent.remove_below(22);
        assert!(unknown(&mut recent, 10));
        assert!(unknown(&mut recent, 21));
        assert_eq!(found(&mut recent, 22), Some(22));
        assert_eq!(recent.records, 3);
    }

    #[test]
    fn the_least_used_span_goes_first() {
        let mut recent = Recent::default();
        for i in 0..MIN_SPANS as u64 {
            recent.insert(i * 10, records(i * 10..i * 10 + 5), 1);
        }
        // The first is used; the second is now the least used.
        assert_eq!(found(&mut recent, 0), Some(0));
        let far = MIN_SPANS as u64 * 10;
        recent.insert(far, records(far..far + 5), 1);
        assert_eq!(found(&mut recent, 0), Some(0));
        assert!(unknown(&mut recent, 10));
        assert_eq!(found(&mut recent, far), Some(far));
    }

    /// Consumers spread along a channel each keep the span they read from:
    /// fifty of them keep a hundred spans, where a channel with few keeps
    /// sixteen.
    #[test]
    fn a_channel_keeps_two_spans_for_each_consumer() {
        for (consumers, kept) in [(1, MIN_SPANS), (8, MIN_SPANS), (50, 100)] {
            let mut recent = Recent::default();
            for i in 0..kept as u64 + 1 {
                recent.insert(i * 10, records(i * 10..i * 10 + 5), consumers);
            }
            assert_eq!(recent.spans.len(), kept, "{consumers} consumers");
            assert!(unknown(&mut recent, 0), "{consumers} consumers");
            assert_eq!(found(&mut recent, 10), Some(10), "{consumers} consumers");
        }
    }

    #[test]
    fn bytes_are_bounded_and_the_newest_read_is_kept() {
        let mut recent = Recent::default();
        let per = records([0])[0].accounted_size();
        let fit = MAX_BYTES / per;
        recent.insert(0, records(0..fit), 1);
        recent.insert(fit + 10, records(fit + 10..fit + 20), 1);
        assert!(recent.bytes <= MAX_BYTES || recent.spans.len() == 1);
        assert_eq!(found(&mut recent, fit + 10), Some(fit + 10));
        assert!(unknown(&mut recent, 0));
    }

    #[test]
    fn a_message_built_during_a_run_is_found_with_its_record() {
        let mut recent = Recent::default();
        recent.insert(1, records(1..3), 1);
        let mut run = recent.take_run(2).expect("covered");
        assert_eq!(run.from, 1);
        assert!(run.entries[run.from].message.is_none());
        let record = &run.entries[run.from].record;
        let message = Arc::new(crate::broker::state::records::message_with_properties(
            &record.parts(),
            record.payload(),
            tokio::time::Instant::now(),
            Default::default(),
        ));
        run.entries[run.from].message = Some(message.clone());
        // While the run is out its span is not looked at again.
        recent.put_back(run);
        let run = recent.take_run(2).expect("covered");
        let kept = run.entries[run.from].message.clone();
        recent.put_back(run);
        assert!(kept.is_some_and(|m| Arc::ptr_eq(&m, &message)));
    }

    #[test]
    fn a_commit_extends_the_span_ending_at_its_offset() {
        let mut recent = Recent::default();
        recent.insert(1, records(1..5), 1);
        for record in records(5..8) {
            recent.append(record, None, 1);
        }
        assert_eq!(recent.spans.len(), 1);
        assert_eq!(found(&mut recent, 7), Some(7));
        // A record a read already holds is not added twice.
        recent.append(records([6]).remove(0), None, 1);
        assert_eq!(recent.records, 7);
        // Past a hole (a write that failed after taking its offset) a new
        // span begins: the hole is not claimed to hold nothing.
        recent.append(records([9]).remove(0), None, 1);
        assert_eq!(recent.spans.len(), 2);
        assert!(unknown(&mut recent, 8));
        assert_eq!(found(&mut recent, 9), Some(9));
    }

    #[test]
    fn the_tail_gives_back_its_oldest_records_past_the_bound() {
        let mut recent = Recent::default();
        let per = records([0])[0].accounted_size();
        let fit = MAX_BYTES / per;
        for record in records(1..=fit * 2) {
            recent.append(record, None, 1);
            assert!(recent.bytes <= MAX_BYTES);
        }
        assert_eq!(recent.spans.len(), 1);
        let span = &recent.spans[0];
        assert_eq!(span.end, fit * 2 + 1);
        assert_eq!(span.entries.len() as u64, span.end - span.start);
        assert_eq!(recent.records, span.entries.len() as u64);
        assert!(unknown(&mut recent, 1));
        assert_eq!(found(&mut recent, fit * 2), Some(fit * 2));
    }
}
