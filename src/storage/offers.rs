//! Where a queue's offers start reading.
//!
//! An offer hands out the oldest records no worker holds and none waits
//! out its backoff. Read from the queue's head every time, it reads past
//! every record held or waiting first: with a downstream down and its jobs
//! refused, ten thousand of them waiting out their backoff at the head
//! made every offer read ten thousand rows, and the healthy jobs behind
//! them were taken at a fifth of their rate. The cursor remembers how far
//! the last offer read past such records before it found one to offer,
//! and goes back to a record whose backoff ended when the next offer
//! comes. A record let go by its worker always waits out a backoff first
//! (a gap of 0 ends at once), so backoffs ending are the only way back
//! below the cursor.

use std::collections::BTreeSet;

use saguin_format::model::UnixNanos;

use super::contract::FIRST_OFFSET;

#[derive(Debug)]
pub(crate) struct OfferCursor {
    /// Every record below this was held or waiting out its backoff when
    /// an offer last read past it.
    from: u64,
    /// Backoffs by when they end, and the record each holds back. One
    /// whose record was since leased or removed only lowers the cursor
    /// once for nothing.
    ending: BTreeSet<(UnixNanos, u64)>,
}

impl Default for OfferCursor {
    fn default() -> Self {
        OfferCursor {
            from: FIRST_OFFSET,
            ending: BTreeSet::new(),
        }
    }
}

impl OfferCursor {
    /// The record at `offset` waits out a backoff until `not_before`.
    pub(crate) fn backoff(&mut self, offset: u64, not_before: UnixNanos) {
        self.ending.insert((not_before, offset));
    }

    /// An offer at `now`, starting where nothing below can be offered but
    /// what a backoff ended at or before `now` gave back
    /// ([`OfferScan::from`]).
    pub(crate) fn start(&mut self, now: UnixNanos) -> OfferScan {
        while let Some(&(ends, offset)) = self.ending.first() {
            if ends > now {
                break;
            }
            self.ending.pop_first();
            self.from = self.from.min(offset);
        }
        OfferScan {
            from: self.from,
            read_past: self.from,
            leading: true,
        }
    }

    /// The offer is over: the next starts past the records it read past
    /// before any other.
    pub(crate) fn finish(&mut self, scan: OfferScan) {
        self.from = self.from.max(scan.read_past);
    }
}

/// One offer's reading, in offset order from [`OfferScan::from`].
#[derive(Debug)]
pub(crate) struct OfferScan {
    pub(crate) from: u64,
    read_past: u64,
    /// No record but held or waiting ones read yet.
    leading: bool,
}

impl OfferScan {
    /// The record at `offset` is held or waits out its backoff.
    pub(crate) fn waiting(&mut self, offset: u64) {
        if self.leading {
            self.read_past = offset + 1;
        }
    }

    /// A record neither held nor waiting was read (offered or not): the
    /// next offer starts no later than it.
    pub(crate) fn free(&mut self) {
        self.leading = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An offer at `now` over records `1..=last`, `waiting` those held or
    /// waiting: where it started.
    fn offer(cursor: &mut OfferCursor, now: UnixNanos, last: u64, waiting: &[u64]) -> u64 {
        let mut scan = cursor.start(now);
        let from = scan.from;
        for offset in from..=last {
            if waiting.contains(&offset) {
                scan.waiting(offset);
            } else {
                scan.free();
            }
        }
        cursor.finish(scan);
        from
    }

    #[test]
    fn an_offer_starts_past_what_the_last_read_past_until_a_backoff_ends() {
        let mut cursor = OfferCursor::default();
        // Records 1-9 wait out backoffs ending at 100 (4) and 200.
        let waiting: Vec<u64> = (1..10).collect();
        for &offset in &waiting {
            cursor.backoff(offset, if offset == 4 { 100 } else { 200 });
        }
        assert_eq!(offer(&mut cursor, 0, 12, &waiting), FIRST_OFFSET);
        assert_eq!(offer(&mut cursor, 99, 12, &waiting), 10, "read past 1-9");
        let others: Vec<u64> = (1..10).filter(|&o| o != 4).collect();
        assert_eq!(offer(&mut cursor, 100, 12, &others), 4, "4's backoff ended");
        assert_eq!(
            offer(&mut cursor, 150, 12, &others),
            4,
            "4 was not read past"
        );
        assert_eq!(offer(&mut cursor, 200, 12, &[]), 1, "the rest ended");
    }

    #[test]
    fn only_the_leading_waiting_records_are_read_past() {
        let mut cursor = OfferCursor::default();
        // 1 and 2 wait, 3 is free (offered, or its attempts spent), 4 waits.
        assert_eq!(offer(&mut cursor, 0, 5, &[1, 2, 4]), FIRST_OFFSET);
        assert_eq!(offer(&mut cursor, 0, 5, &[1, 2, 4]), 3);
        assert_eq!(offer(&mut cursor, 0, 5, &[1, 2, 4]), 3);
    }
}
