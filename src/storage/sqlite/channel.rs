//! What every sqlite channel kind shares: its counters, its cache of
//! reader positions, and [`Staged`], the one face a channel shows the
//! group commit - so `batch` knows no channel type and each channel may
//! call into `batch` without a circle.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use saguin_format::model::Record;

use super::row::Encoded;
use super::Shared;
use crate::storage::contract::{self, Position, Reader};

/// A channel's publish path as the group commit drives it: write a record
/// into the open transaction, then - after the commit - move the counters
/// in memory to what committed.
pub(crate) trait Staged: Send + Sync {
    fn counters(&self) -> &ChannelCounters;

    fn name(&self) -> &str {
        self.counters().name()
    }

    /// Writes one publish into the open transaction at `pending.next` and
    /// returns the offset it took; `None` when it took none (a latest
    /// channel's deletion of a topic that held nothing). An empty payload
    /// on a latest channel deletes, as MQTT says of a retained message.
    fn stage(
        &self,
        conn: &Connection,
        pending: &mut Pending,
        record: &Record,
    ) -> rusqlite::Result<Option<u64>>;

    /// What a failed write of `record` was doing, for its error.
    fn describe(&self, _record: &Record) -> String {
        format!("channel {}: storing a publish", self.name())
    }

    /// The counters after a commit; called with the writer still held, so
    /// nothing reads a counter between the commit and this.
    fn committed(&self, pending: Pending) {
        self.counters().committed(&pending);
    }
}

/// A channel whose every record is a row of its own (append, queue): it
/// stages a publish by inserting that row with `INSERT_ROW`.
pub(crate) trait RowPerRecord: Send + Sync {
    /// Binds channel, offset and the record columns, in that order.
    const INSERT_ROW: &'static str;
    fn row_counters(&self) -> &ChannelCounters;
}

impl<T: RowPerRecord> Staged for T {
    fn counters(&self) -> &ChannelCounters {
        self.row_counters()
    }

    fn stage(
        &self,
        conn: &Connection,
        pending: &mut Pending,
        record: &Record,
    ) -> rusqlite::Result<Option<u64>> {
        insert_row(conn, T::INSERT_ROW, self.name(), pending, record)
    }
}

/// Where a publish goes.
pub(crate) type Target = Arc<dyn Staged>;

/// The target of the store `me` names, or `Closed` once its provider let
/// it go.
pub(crate) fn target_of<T: Staged + 'static>(
    me: &std::sync::Weak<T>,
    provider: &str,
) -> contract::Result<Target> {
    me.upgrade()
        .map(|me| me as Target)
        .ok_or_else(|| contract::StorageError::Closed {
            provider: provider.to_owned(),
        })
}

/// What the writer knows of a keyed (latest) channel's row without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LatestEntry {
    /// `Record::accounted_size` of the value or marker.
    pub size: u64,
    /// A deletion's marker rather than a value: the offset it took and its
    /// timestamp, what a retention sweep looks at.
    pub deletion: Option<Deletion>,
}

/// A latest channel's deletion marker, as its retention walks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deletion {
    pub offset: u64,
    pub timestamp: i64,
}

/// A channel's counters as a transaction moves them, before they are committed.
pub(crate) struct Pending {
    pub next: u64,
    pub bytes: u64,
    pub count: u64,
    /// Latest channels: topic -> the size it now holds (None = deleted).
    pub topics: HashMap<String, Option<LatestEntry>>,
    /// Latest channels: the offsets of the deletion markers this
    /// transaction replaced with a value.
    pub replaced_markers: Vec<u64>,
}

impl Pending {
    /// The committed counters of `channel`, for a transaction to move.
    pub fn of(channel: &dyn Staged) -> Pending {
        let c = channel.counters();
        Pending {
            next: c.next(),
            bytes: c.bytes(),
            count: c.count(),
            topics: HashMap::new(),
            replaced_markers: Vec::new(),
        }
    }
}

/// No bound: `u64::MAX` in the atomic.
const UNBOUNDED: u64 = u64::MAX;

/// `next`, `floor`, `bytes`, the record count and the byte bound of one
/// channel, loaded at open and moved only by the writer after a commit:
/// never derived from the rows (invariant 9).
pub(crate) struct ChannelCounters {
    /// The channel's name, the key of its `channels` row.
    name: String,
    next: AtomicU64,
    floor: AtomicU64,
    bytes: AtomicU64,
    count: AtomicU64,
    max_bytes: AtomicU64,
    /// The `channels` row keeps `bytes` (an append channel); a latest
    /// channel and a queue keep theirs in memory, summed at open.
    bytes_in_row: bool,
}

impl ChannelCounters {
    pub fn new(
        name: &str,
        (next, floor, bytes): (u64, u64, u64),
        count: u64,
        bytes_in_row: bool,
    ) -> Self {
        ChannelCounters {
            name: name.to_string(),
            next: AtomicU64::new(next),
            floor: AtomicU64::new(floor),
            bytes: AtomicU64::new(bytes),
            count: AtomicU64::new(count),
            max_bytes: AtomicU64::new(UNBOUNDED),
            bytes_in_row,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn next(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }
    pub fn floor(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }
    pub fn max_bytes(&self) -> Option<u64> {
        match self.max_bytes.load(Ordering::Acquire) {
            UNBOUNDED => None,
            max => Some(max),
        }
    }
    pub fn set_max_bytes(&self, max_bytes: Option<u64>) {
        self.max_bytes
            .store(max_bytes.unwrap_or(UNBOUNDED), Ordering::Release);
    }

    pub fn committed(&self, pending: &Pending) {
        self.bytes.store(pending.bytes, Ordering::Release);
        self.count.store(pending.count, Ordering::Release);
        // Last: a reader that sees `next` sees everything below it.
        self.next.store(pending.next, Ordering::Release);
    }

    /// Records and bytes a committed removal gave back.
    pub fn removed(&self, records: u64, bytes: u64) {
        self.bytes
            .fetch_sub(bytes.min(self.bytes()), Ordering::AcqRel);
        self.count
            .fetch_sub(records.min(self.count()), Ordering::AcqRel);
    }

    pub fn set_floor(&self, floor: u64) {
        self.floor.store(floor, Ordering::Release);
    }

    /// The counter row's update inside the open transaction: `next`, and
    /// `bytes` where the row keeps them.
    pub fn write_row(&self, conn: &Connection, pending: &Pending) -> rusqlite::Result<()> {
        let name = &self.name;
        if self.bytes_in_row {
            conn.prepare_cached("UPDATE channels SET next = ?2, bytes = ?3 WHERE name = ?1")?
                .execute(rusqlite::params![name, pending.next, pending.bytes])?;
        } else {
            conn.prepare_cached("UPDATE channels SET next = ?2 WHERE name = ?1")?
                .execute(rusqlite::params![name, pending.next])?;
        }
        Ok(())
    }
}

/// Inserts `record` as a new row at `pending.next` with the statement
/// `sql` (bound: channel, offset, the record columns) and counts it: the
/// stage of a channel whose every record is a row of its own.
fn insert_row(
    conn: &Connection,
    sql: &'static str,
    name: &str,
    pending: &mut Pending,
    record: &Record,
) -> rusqlite::Result<Option<u64>> {
    let offset = pending.next;
    let encoded = Encoded::new(record);
    let p = encoded.params();
    conn.prepare_cached(sql)?.execute(rusqlite::params![
        name, offset, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11],
        p[12]
    ])?;
    pending.bytes += encoded.size;
    pending.count += 1;
    pending.next += 1;
    Ok(Some(offset))
}

/// Writes each touched channel's counter row once.
pub(crate) fn write_counter_rows(
    conn: &Connection,
    touched: &[(Target, Pending)],
) -> rusqlite::Result<()> {
    for (target, pending) in touched {
        target.counters().write_row(conn, pending)?;
    }
    Ok(())
}

/// Moves the in-memory counters to what committed (writer still held).
pub(crate) fn publish_counters(touched: Vec<(Target, Pending)>) {
    for (target, pending) in touched {
        target.committed(pending);
    }
}

/// A channel's stored reader positions: read and written through the
/// provider, with every offset cached in memory for `lowest_position`.
pub(crate) struct Positions {
    shared: Arc<Shared>,
    channel: String,
    offsets: Mutex<BTreeMap<String, u64>>,
}

impl Positions {
    pub fn load(shared: Arc<Shared>, channel: &str) -> contract::Result<Positions> {
        let offsets = shared.load_positions(channel)?;
        Ok(Positions {
            shared,
            channel: channel.to_string(),
            offsets: Mutex::new(offsets),
        })
    }

    pub fn get(&self, reader: &Reader) -> contract::Result<Option<Position>> {
        self.shared.position(&self.channel, reader)
    }

    pub fn all(&self) -> contract::Result<Vec<Position>> {
        self.shared.positions(&self.channel)
    }

    pub fn save(&self, position: Position, next: u64) -> contract::Result<()> {
        self.shared.save_position(&self.channel, &position, next)?;
        self.offsets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(position.reader.to_string(), position.offset);
        Ok(())
    }

    pub fn drop_reader(&self, reader: &Reader) -> contract::Result<bool> {
        let dropped = self.shared.drop_position(&self.channel, reader)?;
        self.offsets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&reader.to_string());
        Ok(dropped)
    }

    /// The lowest stored position, `None` when there is none.
    pub fn lowest(&self) -> Option<u64> {
        self.offsets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .copied()
            .min()
    }
}
