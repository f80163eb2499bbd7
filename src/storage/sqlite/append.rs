//! An append channel on sqlite: rows of `records` keyed by (channel,
//! offset), counters in the `channels` row and in memory.
//!
//! `next`, `floor` and `bytes` are loaded from the channels row at open and
//! moved only after a commit, by the writer: never derived from the rows
//! (invariant 9). An append channel has no holes between floor and next (it
//! is removed from the front only), so its record count is `next - floor`;
//! the broadcast log, which lets messages go from the middle, counts its
//! rows instead (`gapped`).

use std::sync::{Arc, Weak};

use saguin_format::model::{ChannelKind, Record, UnixNanos};

use super::batch::Job;
use super::channel::{target_of, ChannelCounters, Positions, RowPerRecord, Target};
use super::row::record_at;
use super::schema::record_columns;
use super::Shared;
use crate::storage::contract::{
    self, AppendStore, OffsetStore, Position, Reader, Removed, StorageError,
};

const SQL_NEXT_FLOOR: &str = "SELECT next, floor FROM channels WHERE name = ?1";
const SQL_READ: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    " FROM records WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT ?3"
);
const SQL_FIRST_AT_OR_AFTER: &str = "SELECT min(offset) FROM records
     WHERE channel = ?1 AND offset >= ?2 AND timestamp >= ?3 AND timestamp != 0";
const SQL_OLDEST_TIMESTAMP: &str =
    "SELECT timestamp FROM records WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT 1";
const SQL_COUNT: &str = "SELECT count(*) FROM records WHERE channel = ?1";

pub(crate) const READ_STATEMENTS: [&str; 5] = [
    SQL_NEXT_FLOOR,
    SQL_READ,
    SQL_FIRST_AT_OR_AFTER,
    SQL_OLDEST_TIMESTAMP,
    SQL_COUNT,
];

const SQL_INSERT: &str = concat!(
    "INSERT INTO records (channel, offset, ",
    record_columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
);

pub struct AppendChannel {
    me: Weak<AppendChannel>,
    shared: Arc<Shared>,
    name: String,
    /// The broadcast log: messages leave from the middle, so rows are counted.
    gapped: bool,
    counters: ChannelCounters,
    positions: Positions,
}

impl AppendChannel {
    pub(crate) fn open(
        shared: Arc<Shared>,
        name: &str,
        gapped: bool,
    ) -> contract::Result<Arc<AppendChannel>> {
        let row @ (next, floor, _) = shared.channel_row(name, ChannelKind::Append)?;
        let count = if gapped {
            shared.read(
                || format!("channel {name}: counting records"),
                |conn| {
                    conn.prepare_cached(SQL_COUNT)?
                        .query_row([name], |r| r.get::<_, u64>(0))
                },
            )?
        } else {
            next - floor
        };
        let positions = Positions::load(Arc::clone(&shared), name)?;
        Ok(Arc::new_cyclic(|me| AppendChannel {
            me: me.clone(),
            shared,
            name: name.to_string(),
            gapped,
            counters: ChannelCounters::new(name, row, count, true),
            positions,
        }))
    }

    fn removed(&self, floor: u64, records: u64, bytes: u64) {
        self.counters.removed(records, bytes);
        self.counters.set_floor(floor);
    }

    /// Several appends, in order, sharing transactions (group commit).
    pub(crate) fn append_many(&self, records: Vec<Record>) -> Vec<contract::Result<Record>> {
        let target = match self.target() {
            Ok(t) => t,
            Err(_) => {
                return records
                    .iter()
                    .map(|_| {
                        Err(StorageError::Closed {
                            provider: self.shared.name.clone(),
                        })
                    })
                    .collect()
            }
        };
        self.shared.batcher.submit_checked(
            &self.shared,
            &target,
            records,
            |record| contract::check_record(&self.name, record, self.gapped),
            || StorageError::Write {
                context: format!("channel {}", self.name),
                detail: "the append stored nothing".into(),
            },
        )
    }

    pub(crate) fn target(&self) -> contract::Result<Target> {
        target_of(&self.me, &self.shared.name)
    }

    /// Rows from `offset` on, at most `max`, in one read transaction with
    /// the stored floor, so a trim committing meanwhile cannot hand back the
    /// survivors as though nothing was missing (invariant 1).
    pub(crate) fn read_rows(
        &self,
        offset: u64,
        max: usize,
    ) -> contract::Result<(u64, u64, Vec<Record>)> {
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        self.shared.read(
            || format!("channel {}: reading from offset {offset}", self.name),
            |conn| {
                let (next, floor): (u64, u64) = conn
                    .prepare_cached(SQL_NEXT_FLOOR)?
                    .query_row([&self.name], |r| Ok((r.get(0)?, r.get(1)?)))?;
                if max == 0 || offset > next {
                    return Ok((next, floor, Vec::new()));
                }
                let mut stmt = conn.prepare_cached(SQL_READ)?;
                let rows = stmt.query_map(
                    rusqlite::params![self.name, offset.max(floor), limit],
                    |r| {
                        let offset: u64 = r.get(0)?;
                        record_at(r, 1, offset)
                    },
                )?;
                Ok((next, floor, rows.collect::<rusqlite::Result<Vec<_>>>()?))
            },
        )
    }

    /// Removes everything below the offset `walk` decides, in one
    /// transaction with the new floor and byte total. `walk` sees rows
    /// oldest first - (offset, timestamp, size) - and answers whether each
    /// goes; the first that stays ends the walk.
    fn remove_front(
        &self,
        before: u64,
        mut goes: impl FnMut(u64, i64, u64, u64) -> bool,
    ) -> contract::Result<Removed> {
        let mut w = self.shared.writer()?;
        let floor = self.counters.floor();
        let next = self.counters.next();
        let bytes = self.counters.bytes();
        let before = before.min(next);
        let result = w.txn(false, |conn| {
            let mut new_floor = floor;
            let mut remaining = bytes;
            {
                let mut stmt = conn.prepare_cached(
                    "SELECT offset, timestamp, size FROM records WHERE channel = ?1 AND offset >= ?2 ORDER BY offset",
                )?;
                let mut rows = stmt.query(rusqlite::params![self.name, floor])?;
                while let Some(row) = rows.next()? {
                    let offset: u64 = row.get(0)?;
                    let timestamp: i64 = row.get(1)?;
                    let size: u64 = row.get(2)?;
                    if offset < before || goes(offset, timestamp, size, remaining) {
                        remaining = remaining.saturating_sub(size);
                        new_floor = offset + 1;
                    } else {
                        break;
                    }
                }
            }
            // Records below `before` that are already gone still move the floor.
            new_floor = new_floor.max(before);
            if new_floor == floor {
                return Ok(None);
            }
            let records = conn
                .prepare_cached("DELETE FROM records WHERE channel = ?1 AND offset < ?2")?
                .execute(rusqlite::params![self.name, new_floor])? as u64;
            conn.prepare_cached("UPDATE channels SET floor = ?2, bytes = ?3 WHERE name = ?1")?
                .execute(rusqlite::params![self.name, new_floor, remaining])?;
            Ok(Some((new_floor, remaining, records)))
        });
        match result {
            Ok(Some((new_floor, remaining, records))) => {
                self.removed(new_floor, records, bytes - remaining);
                self.shared.set_publishes_full(false);
                Ok(Removed {
                    records,
                    bytes: bytes - remaining,
                })
            }
            Ok(None) => Ok(Removed::default()),
            Err(e) => Err(self.shared.write_error(
                Some(w.conn()),
                format!("channel {}: removing records", self.name),
                0,
                &e,
            )),
        }
    }

    /// Lets the given messages go from anywhere in the log (broadcast log
    /// only), in one transaction with the new floor and byte total.
    pub(crate) fn release_offsets(&self, offsets: &[u64]) -> contract::Result<Removed> {
        if offsets.is_empty() {
            return Ok(Removed::default());
        }
        let mut w = self.shared.writer()?;
        let bytes = self.counters.bytes();
        let next = self.counters.next();
        let result = w.txn(false, |conn| {
            let mut freed = 0u64;
            let mut records = 0u64;
            for offset in offsets {
                let size: Option<u64> = conn
                    .prepare_cached(
                        "DELETE FROM records WHERE channel = ?1 AND offset = ?2 RETURNING size",
                    )?
                    .query_row(rusqlite::params![self.name, offset], |r| r.get(0))
                    .map(Some)
                    .or_else(|e| match e {
                        rusqlite::Error::QueryReturnedNoRows => Ok(None),
                        e => Err(e),
                    })?;
                if let Some(size) = size {
                    freed += size;
                    records += 1;
                }
            }
            let lowest: Option<u64> = conn
                .prepare_cached("SELECT min(offset) FROM records WHERE channel = ?1")?
                .query_row([&self.name], |r| r.get(0))?;
            let floor = lowest.unwrap_or(next);
            let remaining = bytes.saturating_sub(freed);
            conn.prepare_cached("UPDATE channels SET floor = ?2, bytes = ?3 WHERE name = ?1")?
                .execute(rusqlite::params![self.name, floor, remaining])?;
            Ok((floor, records, freed))
        });
        match result {
            Ok((floor, records, freed)) => {
                self.removed(floor, records, freed);
                self.shared.set_publishes_full(false);
                Ok(Removed {
                    records,
                    bytes: freed,
                })
            }
            Err(e) => Err(self.shared.write_error(
                Some(w.conn()),
                format!("channel {}: releasing messages", self.name),
                0,
                &e,
            )),
        }
    }

    pub(crate) fn is_gapped(&self) -> bool {
        self.gapped
    }
}

impl AppendStore for AppendChannel {
    fn append(&self, record: Record) -> contract::Result<Record> {
        contract::check_record(&self.name, &record, self.gapped)?;
        let target = self.target()?;
        match self
            .shared
            .batcher
            .submit(&self.shared, Job { target, record })?
        {
            Some(stored) => Ok(stored),
            None => Err(StorageError::Write {
                context: format!("channel {}", self.name),
                detail: "the append stored nothing".into(),
            }),
        }
    }

    fn read_from(&self, offset: u64) -> contract::Result<Vec<Record>> {
        self.read_from_n(offset, usize::MAX)
    }

    fn append_batch(&self, records: Vec<Record>) -> Vec<contract::Result<Record>> {
        self.append_many(records)
    }

    fn read_from_n(&self, offset: u64, max: usize) -> contract::Result<Vec<Record>> {
        // The bounds come from the same read snapshot as the records: a
        // commit that landed after the in-memory counters were read is
        // still inside them.
        let (next, floor, records) = self.read_rows(offset, max)?;
        if offset < floor && !self.gapped {
            return Err(StorageError::BelowFloor {
                channel: self.name.clone(),
                offset,
                floor,
            });
        }
        if offset > next {
            return Err(StorageError::PastNext {
                channel: self.name.clone(),
                offset,
                next,
            });
        }
        Ok(records)
    }

    fn lowest_position(&self) -> u64 {
        self.positions
            .lowest()
            .unwrap_or_else(|| self.counters.next())
    }

    fn first_at_or_after(&self, at: UnixNanos) -> contract::Result<Option<u64>> {
        // Every candidate is looked at (no bisecting): receipt times can run
        // backwards after a clock step.
        let floor = self.counters.floor();
        self.shared.read(
            || format!("channel {}: seeking by time", self.name),
            |conn| {
                conn.prepare_cached(SQL_FIRST_AT_OR_AFTER)?
                    .query_row(rusqlite::params![self.name, floor, at], |r| {
                        r.get::<_, Option<u64>>(0)
                    })
            },
        )
    }

    fn set_max_bytes(&self, max_bytes: Option<u64>) {
        self.counters.set_max_bytes(max_bytes);
    }

    fn max_bytes(&self) -> Option<u64> {
        self.counters.max_bytes()
    }

    fn trim(&self, before: u64, max_bytes: Option<u64>) -> contract::Result<Removed> {
        let over = |remaining: u64| max_bytes.is_some_and(|max| remaining > max);
        if before <= self.floor() && !over(self.counters.bytes()) {
            return Ok(Removed::default());
        }
        self.remove_front(before, |_, _, _, remaining| over(remaining))
    }

    fn trim_older_than(&self, cutoff: UnixNanos) -> contract::Result<Removed> {
        // A record with timestamp 0 is never too old, and stops the walk.
        let too_old = |ts: i64| ts != 0 && ts < cutoff;
        let floor = self.floor();
        // Settled on a read connection when the oldest record stays, which
        // is the steady state: no write transaction at all.
        let oldest: Option<i64> = self.shared.read(
            || format!("channel {}: reading its oldest record", self.name),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_OLDEST_TIMESTAMP)?;
                let mut rows = stmt.query(rusqlite::params![self.name, floor])?;
                match rows.next()? {
                    Some(r) => Ok(Some(r.get(0)?)),
                    None => Ok(None),
                }
            },
        )?;
        if !oldest.is_some_and(too_old) {
            return Ok(Removed::default());
        }
        self.remove_front(0, |_, ts, _, _| too_old(ts))
    }
}

impl OffsetStore for AppendChannel {
    fn name(&self) -> &str {
        &self.name
    }

    fn next(&self) -> u64 {
        self.counters.next()
    }

    fn floor(&self) -> u64 {
        self.counters.floor()
    }

    fn bytes(&self) -> u64 {
        self.counters.bytes()
    }

    fn record_count(&self) -> u64 {
        self.counters.count()
    }

    fn position(&self, reader: &Reader) -> contract::Result<Option<Position>> {
        self.positions.get(reader)
    }

    fn save_position(&self, position: Position) -> contract::Result<()> {
        self.positions.save(position, self.counters.next())
    }

    fn drop_position(&self, reader: &Reader) -> contract::Result<bool> {
        self.positions.drop_reader(reader)
    }

    fn positions(&self) -> contract::Result<Vec<Position>> {
        self.positions.all()
    }
}

impl RowPerRecord for AppendChannel {
    const INSERT_ROW: &'static str = SQL_INSERT;
    fn row_counters(&self) -> &ChannelCounters {
        &self.counters
    }
}
