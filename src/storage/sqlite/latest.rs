//! A latest channel on sqlite: `latest_values` keyed by (channel, topic),
//! so replacing a value is one statement straight to its row. A deletion
//! keeps the row as a marker (empty payload, `deleted = 1`) at the offset
//! it took, so a consumer resuming from a position learns of it; a trim
//! forgets markers below the floor it raises.
//!
//! A latest channel has no stored byte counter (a replacement
//! would need a point read on the publish path to feed it). The contract
//! still asks for `bytes` and `record_count`, so the size of every row
//! (values and markers, as the memory provider counts them) is read once at
//! open and kept in memory, moved by the writer after each commit - the
//! value being replaced is then already in hand. The retained store keeps
//! no markers: a deletion there removes the row.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use rusqlite::{Connection, OptionalExtension};
use saguin_format::model::{ChannelKind, Record};

use super::batch::Job;
use super::channel::{
    target_of, ChannelCounters, Deletion, LatestEntry, Pending, Positions, Staged, Target,
};
use super::row::{record_at, with_served_at, Encoded};
use super::schema::{record_columns, served_columns};
use super::Shared;
use crate::storage::contract::{
    self, forgets_deletion, LatestStore, OffsetStore, Position, Reader, Removed, ServedValue,
    StorageError, RETAINED_STORE_NAME,
};
use crate::topic::{filter_matches, literal_prefix, prefix_end};
use saguin_format::model::UnixNanos;

const SQL_GET: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    " FROM latest_values WHERE channel = ?1 AND topic = ?2 AND deleted = 0"
);
const SQL_LIVE: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    " FROM latest_values WHERE channel = ?1 AND deleted = 0 ORDER BY offset"
);
/// [`SQL_LIVE`] as the broker serves the values: a restart reads its
/// retained messages with half the columns, and makes nothing for a row.
const SQL_SERVED: &str = concat!(
    "SELECT offset, ",
    served_columns!(),
    " FROM latest_values WHERE channel = ?1 AND deleted = 0 ORDER BY offset"
);
/// The values under a filter's literal prefix (`prefix/` up to its end):
/// a range of the (channel, topic) key rather than every row of the
/// channel.
const SQL_LIVE_FROM: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    " FROM latest_values WHERE channel = ?1 AND deleted = 0 AND topic >= ?2"
);
const SQL_LIVE_RANGE: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    " FROM latest_values WHERE channel = ?1 AND deleted = 0 AND topic >= ?2 AND topic < ?3"
);
const SQL_SINCE: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    ", deleted FROM latest_values WHERE channel = ?1 AND offset >= ?2 ORDER BY offset"
);
const SQL_FLOOR: &str = "SELECT floor FROM channels WHERE name = ?1";
/// The bytes of every row, values and markers, and the count of each, in
/// one aggregate: a store of a million values is summed by SQLite rather
/// than handed over a row at a time.
const SQL_SIZES: &str = "SELECT coalesce(sum(size), 0), count(*) FILTER (WHERE deleted = 0),
         count(*) FILTER (WHERE deleted = 1)
     FROM latest_values WHERE channel = ?1";
/// The deletion markers, read only where there are some.
const SQL_MARKERS: &str =
    "SELECT offset, timestamp FROM latest_values WHERE channel = ?1 AND deleted = 1";
/// One topic's row as a write sees it, on the primary key.
const SQL_ROW: &str = "SELECT size, deleted, offset, timestamp FROM latest_values
     WHERE channel = ?1 AND topic = ?2";
const SQL_NEXT_FLOOR: &str = "SELECT next, floor FROM channels WHERE name = ?1";

/// Forgets one deletion marker, found by its offset on the offset index.
const SQL_FORGET: &str =
    "DELETE FROM latest_values WHERE channel = ?1 AND offset = ?2 AND deleted = 1
     RETURNING topic, size";

pub(crate) fn read_statements() -> Vec<String> {
    [
        SQL_GET,
        SQL_LIVE,
        SQL_SERVED,
        SQL_LIVE_FROM,
        SQL_LIVE_RANGE,
        SQL_SINCE,
        SQL_FLOOR,
        SQL_SIZES,
        SQL_MARKERS,
        SQL_NEXT_FLOOR,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

const SQL_UPSERT: &str = concat!(
    "INSERT INTO latest_values (channel, offset, deleted, ",
    record_columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
     ON CONFLICT (channel, topic) DO UPDATE SET offset = excluded.offset, deleted = excluded.deleted,
         message_id = excluded.message_id, timestamp = excluded.timestamp,
         headers = excluded.headers, payload = excluded.payload, props = excluded.props,
         retain = excluded.retain, bridge = excluded.bridge, client_id = excluded.client_id,
         qos = excluded.qos, shared_copy = excluded.shared_copy, owed_to = excluded.owed_to,
         size = excluded.size"
);

pub struct LatestChannel {
    me: Weak<LatestChannel>,
    shared: Arc<Shared>,
    name: String,
    /// `count` is the topics holding a value (markers excluded).
    counters: ChannelCounters,
    /// Each deletion marker's offset -> its timestamp, oldest first, as
    /// committed: what a retention sweep walks, without passing over the
    /// values between. The values themselves are not held: a write reads
    /// the row it replaces on the primary key, so a channel of a million
    /// topics costs no memory per topic (a retained store is one).
    markers: Mutex<BTreeMap<u64, i64>>,
    keep_markers: bool,
    positions: Positions,
}

/// A `latest_values` row's size and, for a marker, its offset and time,
/// as [`SQL_ROW`] reads them.
fn entry_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<LatestEntry> {
    let deleted: bool = r.get(1)?;
    let deletion = deleted
        .then(|| {
            Ok::<_, rusqlite::Error>(Deletion {
                offset: r.get(2)?,
                timestamp: r.get(3)?,
            })
        })
        .transpose()?;
    Ok(LatestEntry {
        size: r.get(0)?,
        deletion,
    })
}

impl LatestChannel {
    pub(crate) fn open(shared: Arc<Shared>, name: &str) -> contract::Result<Arc<LatestChannel>> {
        let (next, floor, _) = shared.channel_row(name, ChannelKind::Latest)?;
        // The rows summed in one read, the markers kept: the same snapshot
        // for both.
        let (bytes, count, markers) = shared.read(
            || format!("channel {name}: reading value sizes"),
            |conn| {
                let (bytes, count, deleted): (u64, u64, u64) = conn
                    .prepare_cached(SQL_SIZES)?
                    .query_row([name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                let mut markers = BTreeMap::new();
                if deleted > 0 {
                    let mut stmt = conn.prepare_cached(SQL_MARKERS)?;
                    let mut rows = stmt.query([name])?;
                    while let Some(r) = rows.next()? {
                        markers.insert(r.get(0)?, r.get(1)?);
                    }
                }
                Ok((bytes, count, markers))
            },
        )?;
        let positions = Positions::load(Arc::clone(&shared), name)?;
        Ok(Arc::new_cyclic(|me| LatestChannel {
            me: me.clone(),
            shared,
            name: name.to_string(),
            counters: ChannelCounters::new(name, (next, floor, bytes), count, false),
            markers: Mutex::new(markers),
            keep_markers: name != RETAINED_STORE_NAME,
            positions,
        }))
    }

    /// A topic's row as the open transaction sees it (this transaction's
    /// own change first): `None` when there is none.
    fn current(
        &self,
        conn: &Connection,
        pending: &Pending,
        topic: &str,
    ) -> rusqlite::Result<Option<LatestEntry>> {
        if let Some(entry) = pending.topics.get(topic) {
            return Ok(*entry);
        }
        conn.prepare_cached(SQL_ROW)?
            .query_row(rusqlite::params![self.name, topic], entry_of)
            .optional()
    }

    fn markers(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, i64>> {
        self.markers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn upsert(
        &self,
        conn: &Connection,
        offset: u64,
        encoded: &Encoded<'_>,
        deleted: bool,
    ) -> rusqlite::Result<()> {
        let p = encoded.params();
        conn.prepare_cached(SQL_UPSERT)?.execute(rusqlite::params![
            self.name, offset, deleted, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9],
            p[10], p[11], p[12]
        ])?;
        Ok(())
    }

    /// Replaces a topic's value inside the open transaction.
    fn stage_value(
        &self,
        conn: &Connection,
        pending: &mut Pending,
        record: &Record,
    ) -> rusqlite::Result<u64> {
        let offset = pending.next;
        let encoded = Encoded::new(record);
        // Read before the upsert replaces it.
        match self.current(conn, pending, &record.topic)? {
            Some(LatestEntry { size, deletion }) => {
                pending.bytes = pending.bytes.saturating_sub(size);
                if let Some(marker) = deletion {
                    pending.count += 1;
                    pending.replaced_markers.push(marker.offset);
                }
            }
            None => pending.count += 1,
        }
        self.upsert(conn, offset, &encoded, false)?;
        holds(pending, &record.topic, encoded.size, None);
        pending.next += 1;
        Ok(offset)
    }

    /// Deletes a topic inside the open transaction, taking an offset only
    /// when the topic holds a value. The deletion (the record with the
    /// empty payload, as the publisher sent it) stays as the topic's marker
    /// so a resuming consumer learns of it, and counts its size as the
    /// memory provider's does; the retained store keeps no markers.
    fn stage_delete(
        &self,
        conn: &Connection,
        pending: &mut Pending,
        record: &Record,
    ) -> rusqlite::Result<Option<u64>> {
        let Some(LatestEntry {
            size: old,
            deletion: None,
        }) = self.current(conn, pending, &record.topic)?
        else {
            return Ok(None);
        };
        let offset = pending.next;
        pending.bytes = pending.bytes.saturating_sub(old);
        pending.count = pending.count.saturating_sub(1);
        if self.keep_markers {
            let encoded = Encoded::new(record);
            self.upsert(conn, offset, &encoded, true)?;
            let deletion = Deletion {
                offset,
                timestamp: record.timestamp,
            };
            holds(pending, &record.topic, encoded.size, Some(deletion));
        } else {
            conn.prepare_cached("DELETE FROM latest_values WHERE channel = ?1 AND topic = ?2")?
                .execute(rusqlite::params![self.name, record.topic])?;
            pending.topics.insert(record.topic.clone(), None);
        }
        pending.next += 1;
        Ok(Some(offset))
    }

    /// Forgets every marker below `bound` (at most `next`) and raises the
    /// floor to it (never lowering it) in one transaction. The markers are
    /// the ones the writer keeps in memory, each removed by its offset, so
    /// the values between them are not read.
    fn forget_below(&self, bound: u64) -> contract::Result<Removed> {
        let mut w = self.shared.writer()?;
        let floor = self.counters.floor();
        let bound = bound.min(self.counters.next());
        let stale: Vec<u64> = self
            .markers()
            .range(..bound)
            .map(|(offset, _)| *offset)
            .collect();
        if bound <= floor && stale.is_empty() {
            return Ok(Removed::default());
        }
        let raised = bound.max(floor);
        let result = w.txn(false, |conn| {
            let mut forgotten = Vec::with_capacity(stale.len());
            let mut stmt = conn.prepare_cached(SQL_FORGET)?;
            for offset in &stale {
                let mut rows = stmt.query(rusqlite::params![self.name, offset])?;
                while let Some(r) = rows.next()? {
                    forgotten.push((r.get::<_, String>(0)?, r.get::<_, u64>(1)?, *offset));
                }
            }
            conn.prepare_cached("UPDATE channels SET floor = ?2 WHERE name = ?1")?
                .execute(rusqlite::params![self.name, raised])?;
            Ok(forgotten)
        });
        match result {
            Ok(forgotten) => {
                let mut removed = Removed::default();
                {
                    // The writer is held: no commit since `stale` was read,
                    // so each marker forgotten is one the map holds.
                    let mut markers = self.markers();
                    for (_, size, offset) in forgotten {
                        markers.remove(&offset);
                        removed.records += 1;
                        removed.bytes += size;
                    }
                }
                // Markers hold no value, so the value count stays.
                self.counters.removed(0, removed.bytes);
                self.counters.set_floor(raised);
                self.shared.set_publishes_full(false);
                Ok(removed)
            }
            Err(e) => Err(self.shared.write_error(
                Some(w.conn()),
                format!("channel {}: forgetting deletions", self.name),
                0,
                &e,
            )),
        }
    }

    pub(crate) fn target(&self) -> contract::Result<Target> {
        target_of(&self.me, &self.shared.name)
    }
}

/// The topic's row now holds `size` bytes, a value or (`deletion`) a
/// deletion's marker, as the transaction moves the counters.
fn holds(pending: &mut Pending, topic: &str, size: u64, deletion: Option<Deletion>) {
    pending.bytes += size;
    pending
        .topics
        .insert(topic.to_string(), Some(LatestEntry { size, deletion }));
}

impl Staged for LatestChannel {
    fn counters(&self) -> &ChannelCounters {
        &self.counters
    }

    fn stage(
        &self,
        conn: &Connection,
        pending: &mut Pending,
        record: &Record,
    ) -> rusqlite::Result<Option<u64>> {
        if record.payload.is_empty() {
            self.stage_delete(conn, pending, record)
        } else {
            self.stage_value(conn, pending, record).map(Some)
        }
    }

    fn describe(&self, record: &Record) -> String {
        if record.payload.is_empty() {
            format!("channel {}: deleting {}", self.name, record.topic)
        } else {
            format!("channel {}: storing a publish", self.name)
        }
    }

    fn committed(&self, pending: Pending) {
        {
            let mut markers = self.markers();
            for offset in &pending.replaced_markers {
                markers.remove(offset);
            }
            for deletion in pending.topics.values().flatten().filter_map(|e| e.deletion) {
                markers.insert(deletion.offset, deletion.timestamp);
            }
        }
        self.counters.committed(&pending);
    }
}

impl LatestChannel {
    /// Every current value (deletions left out), in offset order, handed
    /// to `each` as it is read.
    fn each_live(&self, each: &mut dyn FnMut(Record)) -> contract::Result<()> {
        self.each_live_row(SQL_LIVE, &mut |r| {
            each(record_at(r, 1, r.get(0)?)?);
            Ok(())
        })
    }

    /// Every row `sql` reads for this channel (its offset first), handed
    /// to `row` as it is read, in one read.
    fn each_live_row(
        &self,
        sql: &str,
        row: &mut dyn FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<()>,
    ) -> contract::Result<()> {
        self.shared.read(
            || format!("channel {}: reading every value", self.name),
            |conn| {
                {
                    let mut stmt = conn.prepare_cached(sql)?;
                    let mut rows = stmt.query([&self.name])?;
                    while let Some(r) = rows.next()? {
                        row(r)?;
                    }
                }
                // The whole store was read once (a restart's, a snapshot's
                // or an export's): the pages it left in this connection's
                // cache would not be read again soon, and held for as long
                // as the connection lives. Only memory: its failure does
                // not fail a read that was whole.
                conn.release_memory().ok();
                Ok(())
            },
        )
    }
}

impl LatestStore for LatestChannel {
    fn set(&self, record: Record) -> contract::Result<Record> {
        contract::check_record(&self.name, &record, false)?;
        let target = self.target()?;
        // The MQTT rule: an empty payload deletes. A topic that held
        // nothing takes no offset; the answer says so with offset 0.
        let deletes = record.payload.is_empty();
        let topic = record.topic.clone();
        match self
            .shared
            .batcher
            .submit(&self.shared, Job { target, record })?
        {
            Some(stored) => Ok(stored),
            None if deletes => Ok(Record::new(topic, bytes::Bytes::new())),
            None => Err(StorageError::Write {
                context: format!("channel {}", self.name),
                detail: "the value was not stored".into(),
            }),
        }
    }

    fn get(&self, topic: &str) -> contract::Result<Option<Record>> {
        self.shared.read(
            || format!("channel {}: reading {topic}", self.name),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_GET)?;
                let mut rows = stmt.query(rusqlite::params![self.name, topic])?;
                match rows.next()? {
                    Some(r) => Ok(Some(record_at(r, 1, r.get(0)?)?)),
                    None => Ok(None),
                }
            },
        )
    }

    fn delete(&self, topic: &str) -> contract::Result<Option<Record>> {
        let target = self.target()?;
        let record = Record::new(topic, bytes::Bytes::new());
        self.shared
            .batcher
            .submit(&self.shared, Job { target, record })
    }

    fn match_filter(&self, filter: &str) -> contract::Result<Vec<Record>> {
        // The levels before the first wildcard name one topic, which `#`
        // matches too, and the topics under it (`prefix/...`): a range of
        // the (channel, topic) key beside one point read, where the bare
        // prefix's range would also hold every sibling it begins
        // (`devices/site-7` begins `devices/site-70` and `devices/site-700`).
        let prefix = literal_prefix(filter);
        let mut out = self.shared.read(
            || format!("channel {}: matching {filter}", self.name),
            |conn| {
                let mut out = Vec::new();
                let mut keep = |r: &rusqlite::Row<'_>| -> rusqlite::Result<()> {
                    let topic: String = r.get(2)?;
                    if filter_matches(filter, &topic) {
                        out.push(record_at(r, 1, r.get(0)?)?);
                    }
                    Ok(())
                };
                if prefix.is_empty() {
                    let mut stmt = conn.prepare_cached(SQL_LIVE_FROM)?;
                    let mut rows = stmt.query(rusqlite::params![self.name, prefix])?;
                    while let Some(r) = rows.next()? {
                        keep(r)?;
                    }
                    return Ok(out);
                }
                {
                    let mut stmt = conn.prepare_cached(SQL_GET)?;
                    let mut rows = stmt.query(rusqlite::params![self.name, prefix])?;
                    if let Some(r) = rows.next()? {
                        keep(r)?;
                    }
                }
                if prefix != filter {
                    let under = format!("{prefix}/");
                    let mut stmt;
                    let mut rows = match prefix_end(&under) {
                        Some(end) => {
                            stmt = conn.prepare_cached(SQL_LIVE_RANGE)?;
                            stmt.query(rusqlite::params![self.name, under, end])?
                        }
                        None => {
                            stmt = conn.prepare_cached(SQL_LIVE_FROM)?;
                            stmt.query(rusqlite::params![self.name, under])?
                        }
                    };
                    while let Some(r) = rows.next()? {
                        keep(r)?;
                    }
                }
                Ok(out)
            },
        )?;
        out.sort_by_key(|r| r.offset);
        Ok(out)
    }

    fn values(&self) -> contract::Result<Vec<Record>> {
        let mut values = Vec::new();
        self.each_live(&mut |record| values.push(record))?;
        Ok(values)
    }

    fn for_each_value(&self, each: &mut dyn FnMut(Record)) -> contract::Result<()> {
        self.each_live(each)
    }

    fn for_each_served_value(&self, each: &mut dyn FnMut(ServedValue<'_>)) -> contract::Result<()> {
        self.each_live_row(SQL_SERVED, &mut |r| with_served_at(r, 1, r.get(0)?, each))
    }

    fn match_with_deletions(&self, filter: &str, since: u64) -> contract::Result<Vec<Record>> {
        self.match_with_deletions_n(filter, since, usize::MAX)
    }

    fn match_with_deletions_n(
        &self,
        filter: &str,
        since: u64,
        max: usize,
    ) -> contract::Result<Vec<Record>> {
        let (next, floor, out) = self.shared.read(
            || format!("channel {}: matching {filter} since {since}", self.name),
            |conn| {
                let (next, floor): (u64, u64) = conn
                    .prepare_cached(SQL_NEXT_FLOOR)?
                    .query_row([&self.name], |r| Ok((r.get(0)?, r.get(1)?)))?;
                let out = changes_since(conn, &self.name, filter, since, max)?;
                Ok((next, floor, out))
            },
        )?;
        if since < floor {
            return Err(StorageError::BelowFloor {
                channel: self.name.clone(),
                offset: since,
                floor,
            });
        }
        if since > next {
            return Err(StorageError::PastNext {
                channel: self.name.clone(),
                offset: since,
                next,
            });
        }
        Ok(out)
    }

    fn rows_from_n(
        &self,
        filter: &str,
        since: u64,
        max: usize,
    ) -> contract::Result<(u64, Vec<Record>)> {
        self.shared.read(
            || format!("channel {}: reading {filter} from {since}", self.name),
            |conn| {
                let floor: u64 = conn
                    .prepare_cached(SQL_FLOOR)?
                    .query_row([&self.name], |r| r.get(0))?;
                let out = changes_since(conn, &self.name, filter, since, max)?;
                Ok((floor, out))
            },
        )
    }

    fn trim(&self, before: u64) -> contract::Result<Removed> {
        self.forget_below(before)
    }

    fn deletions(&self) -> u64 {
        self.markers().len() as u64
    }

    fn forget_deletions(
        &self,
        keep: Option<u64>,
        cutoff: Option<UnixNanos>,
    ) -> contract::Result<Removed> {
        let bound = {
            let markers = self.markers();
            let mut held = markers.len() as u64;
            let mut bound = None;
            for (&offset, &timestamp) in markers.iter() {
                if !forgets_deletion(held, keep, timestamp, cutoff) {
                    break;
                }
                held -= 1;
                bound = Some(offset + 1);
            }
            bound
        };
        match bound {
            Some(bound) => self.forget_below(bound),
            None => Ok(Removed::default()),
        }
    }
}

impl OffsetStore for LatestChannel {
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

/// Up to `max` changes of channel `name` from offset `since` on whose
/// topic matches `filter`, a deletion as its marker row was published.
/// The rows come off the offset index in order: the cursor stops once the
/// window is full.
fn changes_since(
    conn: &rusqlite::Connection,
    name: &str,
    filter: &str,
    since: u64,
    max: usize,
) -> rusqlite::Result<Vec<Record>> {
    let mut stmt = conn.prepare_cached(SQL_SINCE)?;
    let mut rows = stmt.query(rusqlite::params![name, since])?;
    let mut out = Vec::new();
    while out.len() < max {
        let Some(r) = rows.next()? else {
            break;
        };
        let topic: String = r.get(2)?;
        if filter_matches(filter, &topic) {
            out.push(record_at(r, 1, r.get(0)?)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::contract::Provider;
    use crate::storage::sqlite::{SqliteOptions, SqliteProvider};

    fn devices(p: &dyn Provider) -> Arc<dyn LatestStore> {
        p.open_channel("devices", ChannelKind::Latest)
            .unwrap()
            .as_latest()
            .unwrap()
            .clone()
    }

    /// The writer holds a latest channel's markers, not its values: what
    /// it counts as values replace markers and markers values, in one
    /// transaction or in several, is what a reopen sums from the rows.
    #[test]
    fn markers_replaced_by_values_are_let_go_and_the_counts_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("saguin.db");
        let value = |topic: &str| Record::new(topic, bytes::Bytes::from_static(b"value"));
        let deletion = |topic: &str| Record::new(topic, bytes::Bytes::new());
        let counts = |latest: &dyn LatestStore| {
            (
                latest.deletions(),
                latest.record_count(),
                latest.bytes(),
                latest.next(),
            )
        };
        let before = {
            let provider = SqliteProvider::open(SqliteOptions::new("db", path.clone())).unwrap();
            let latest = devices(&provider);
            for i in 0..100 {
                latest.set(value(&format!("devices/{i}"))).unwrap();
            }
            for i in 0..10 {
                latest.delete(&format!("devices/{i}")).unwrap();
            }
            assert_eq!(latest.deletions(), 10);
            // A marker replaced alone, and in one batch a value replacing a
            // marker, then deleted again, then set once more.
            latest.set(value("devices/0")).unwrap();
            // The provider's own instance, whose counters `latest` reads.
            let channel = provider
                .latest_locked(&mut provider.shared.registry.lock().unwrap(), "devices")
                .unwrap();
            let jobs = [
                value("devices/1"),
                deletion("devices/1"),
                value("devices/1"),
                deletion("devices/2"),
            ]
            .map(|record| Job {
                target: channel.target().unwrap(),
                record,
            });
            for outcome in provider
                .shared
                .batcher
                .submit_many(&provider.shared, jobs.into())
            {
                outcome.unwrap();
            }
            assert_eq!(latest.deletions(), 8, "devices/0 and /1 hold values again");
            assert_eq!(latest.record_count(), 92);
            // Forgetting every marker leaves the values alone.
            let removed = latest.forget_deletions(Some(0), None).unwrap();
            assert_eq!(removed.records, 8);
            assert_eq!(latest.deletions(), 0);
            counts(&*latest)
        };
        let provider = SqliteProvider::open(SqliteOptions::new("db", path)).unwrap();
        assert_eq!(counts(&*devices(&provider)), before);
    }

    /// The plan SQLite chooses for `sql`, one detail line per step.
    fn plan(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt.query_map(params, |r| r.get::<_, String>(3)).unwrap();
        rows.map(|r| r.unwrap()).collect()
    }

    /// Both providers: a filter gets what it matches, though each reads
    /// only the topic its literal prefix names and the topics under it.
    #[test]
    fn a_filter_matches_what_it_matches_reading_under_its_prefix_only() {
        let dir = tempfile::tempdir().unwrap();
        for provider in crate::storage::both_providers(dir.path()) {
            filters_match(&*devices(&*provider), provider.name());
        }
    }

    fn filters_match(latest: &dyn LatestStore, provider: &str) {
        let topics = [
            "devices",
            "devices/site-7",
            "devices/site-7/d1",
            "devices/site-7/a/b",
            "devices/site-70/d1",
            "devices/site-7x",
            "devices/site-8/d1",
            "devices//d1",
            "devices/",
        ];
        for topic in topics {
            latest
                .set(Record::new(topic, bytes::Bytes::from_static(b"v")))
                .unwrap();
        }
        latest.delete("devices/site-8/d1").unwrap();
        for filter in [
            "devices/site-7/#",
            "devices/site-7/+",
            "devices/site-7",
            "devices/+/d1",
            "devices/#",
            "devices//#",
            "devices/site-7/a/+",
            "#",
            "+/site-7",
        ] {
            let got: Vec<String> = latest
                .match_filter(filter)
                .unwrap()
                .into_iter()
                .map(|r| r.topic)
                .collect();
            let want: Vec<&str> = topics
                .iter()
                .copied()
                .filter(|t| *t != "devices/site-8/d1" && filter_matches(filter, t))
                .collect();
            assert_eq!(got, want, "{provider}: {filter}");
        }
    }

    #[test]
    fn a_resume_reads_a_range_of_the_offset_index_not_every_topic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("saguin.db");
        let p = SqliteProvider::open(SqliteOptions::new("db", &path)).unwrap();
        let latest = devices(&p);
        for i in 0..500 {
            let topic = format!("devices/d{}", i % 100);
            latest
                .set(Record::new(topic, bytes::Bytes::from(format!("v{i}"))))
                .unwrap();
        }
        latest.delete("devices/d7").unwrap();
        // Offsets 401..=500 hold each topic's value; d7's deletion took
        // 501. From 450: the values from there on, and the deletion.
        let changed = latest.match_with_deletions("devices/#", 450).unwrap();
        let offsets: Vec<u64> = changed.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, (450..=501).collect::<Vec<_>>());
        assert!(changed.last().unwrap().payload.is_empty(), "the deletion");
        // A window of them reads no further.
        let window = latest.match_with_deletions_n("devices/#", 450, 10).unwrap();
        assert_eq!(
            window.iter().map(|r| r.offset).collect::<Vec<_>>(),
            (450..460).collect::<Vec<_>>()
        );
        let conn = crate::storage::sqlite::open_read_only(&path).unwrap();
        let resume = plan(&conn, SQL_SINCE, rusqlite::params!["devices", 450]);
        let forget = plan(&conn, SQL_FORGET, rusqlite::params!["devices", 501]);
        for (steps, what) in [(resume, "a resume"), (forget, "forgetting a marker")] {
            assert!(
                // `USING COVERING INDEX` where the index holds every
                // column the statement reads.
                steps
                    .iter()
                    .any(|s| s.contains("INDEX latest_values_by_offset")),
                "{what}: {steps:?}"
            );
            assert!(
                !steps
                    .iter()
                    .any(|s| s.starts_with("SCAN") || s.contains("TEMP B-TREE")),
                "{what} scans or sorts: {steps:?}"
            );
        }
    }

    /// A channel's open sums and counts its rows from the offset index
    /// alone: no row of the table is visited.
    #[test]
    fn an_open_counts_its_values_from_the_index_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("saguin.db");
        let p = SqliteProvider::open(SqliteOptions::new("db", &path)).unwrap();
        let latest = devices(&p);
        for i in 0..10 {
            latest
                .set(Record::new(format!("devices/d{i}"), "v"))
                .unwrap();
        }
        latest.delete("devices/d3").unwrap();
        let before = latest.as_offset_store();
        let (bytes, count) = (before.bytes(), before.record_count());
        p.close().unwrap();

        let p = SqliteProvider::open(SqliteOptions::new("db", &path)).unwrap();
        let reopened = devices(&p);
        let after = reopened.as_offset_store();
        assert_eq!(
            (after.bytes(), after.record_count(), reopened.deletions()),
            (bytes, count, 1),
            "the sums read back from the index"
        );
        assert_eq!(count, 9);
        let conn = crate::storage::sqlite::open_read_only(&path).unwrap();
        let steps = plan(&conn, SQL_SIZES, rusqlite::params!["devices"]);
        assert!(
            steps
                .iter()
                .any(|s| s.contains("USING COVERING INDEX latest_values_by_offset")),
            "{steps:?}"
        );
    }
}
