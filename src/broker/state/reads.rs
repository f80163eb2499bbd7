//! Reads of channel records, the protocol with the readers that do them
//! off the broker task: a [`ChannelRead`] out, a [`ReadWindow`] back as
//! [`Event::ChannelRead`](super::Event::ChannelRead), each under a ticket.

use saguin_format::model::UnixNanos;

use crate::storage::contract::LentRecord;

/// Where a read of a channel starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// At this offset; a removed one is reported as a gap.
    Offset(u64),
    /// At the oldest record still held.
    Earliest,
    /// At the earliest record received at or after this time (or at `next`
    /// when none was). Of a queue: the records available at this moment.
    Time(UnixNanos),
    /// A latest channel's current values under the read's filters.
    Current,
    /// A latest channel's rows from `from` for a consumer in the middle of
    /// a resync that began under `floor`: the values below the floor are
    /// read, whose deletion markers are gone (`contract::read_changes`).
    Resync { from: u64, floor: u64 },
}

/// A read of records for one consumer, done off the broker task.
#[derive(Debug, Clone)]
pub struct ChannelRead {
    pub ticket: u64,
    pub channel: u16,
    pub from: Seek,
    pub max: usize,
    /// The filters a latest channel's current values are read under.
    pub filters: Vec<String>,
}

/// What a read found.
#[derive(Debug, Clone, Default)]
pub struct ReadWindow {
    /// The offset the window begins at (the seek resolved).
    pub start: u64,
    /// Set when `start` had to move up past removed records: the floor it
    /// moved to (the records from the asked offset below it are gone). Of
    /// a latest channel: the floor that passed the deletions the reader
    /// relied on, `start` being the first offset it reads every row from
    /// again (a resync).
    pub floor: Option<u64>,
    /// Each read's own: a memory append channel lends its own kept
    /// records, nothing rebuilt; a database's are whole.
    pub records: Vec<LentRecord>,
    /// Set when the window holds every change below it (a latest
    /// channel's, whose later values replace earlier offsets): a consumer
    /// handed all of it looks at this offset next.
    pub next: Option<u64>,
}

/// Reads asked for and not yet taken by the server, and the counter
/// their tickets come from.
#[derive(Debug)]
pub(super) struct ReadRequests {
    pub waiting: Vec<ChannelRead>,
    next: u64,
}

impl Default for ReadRequests {
    fn default() -> Self {
        Self {
            waiting: Vec::new(),
            next: 1,
        }
    }
}

impl ReadRequests {
    /// A number never handed out before: a read's ticket, or the
    /// generation of a consumer or group, which its reads' answers carry.
    pub fn number(&mut self) -> u64 {
        let number = self.next;
        self.next += 1;
        number
    }
}
