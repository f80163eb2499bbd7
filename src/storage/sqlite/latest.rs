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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use saguin_format::model::{ChannelKind, Record};

use super::batch::{Job, Target};
use super::row::record_at;
use super::schema::record_columns;
use super::Shared;
use crate::storage::contract::{
    self, LatestStore, Position, Reader, Removed, StorageError, RETAINED_STORE_NAME,
};
use crate::topic::filter_matches;

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
const SQL_SINCE: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    ", deleted FROM latest_values WHERE channel = ?1 AND offset >= ?2 ORDER BY offset"
);
const SQL_FLOOR: &str = "SELECT floor FROM channels WHERE name = ?1";
const SQL_SIZES: &str = "SELECT topic, size, deleted FROM latest_values WHERE channel = ?1";
const SQL_NEXT_FLOOR: &str = "SELECT next, floor FROM channels WHERE name = ?1";

pub(crate) fn read_statements() -> Vec<String> {
    [
        SQL_GET,
        SQL_LIVE,
        SQL_SINCE,
        SQL_FLOOR,
        SQL_SIZES,
        SQL_NEXT_FLOOR,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What the writer knows of a topic's row without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LatestEntry {
    /// `Record::accounted_size` of the value or marker.
    pub size: u64,
    /// A deletion's marker rather than a value.
    pub marker: bool,
}

pub struct LatestChannel {
    me: Weak<LatestChannel>,
    shared: Arc<Shared>,
    name: String,
    next: AtomicU64,
    floor: AtomicU64,
    bytes: AtomicU64,
    /// Topics holding a value (markers excluded).
    count: AtomicU64,
    /// Every row: topic -> its size and whether it is a marker.
    topics: Mutex<HashMap<String, LatestEntry>>,
    keep_markers: bool,
    positions: Mutex<HashMap<String, u64>>,
}

impl LatestChannel {
    pub(crate) fn open(shared: Arc<Shared>, name: &str) -> contract::Result<Arc<LatestChannel>> {
        let (stored, next, floor, _) = shared.channel_row(name, ChannelKind::Latest)?;
        if stored != ChannelKind::Latest {
            return Err(StorageError::KindMismatch {
                channel: name.to_string(),
                configured: ChannelKind::Latest,
                stored,
            });
        }
        let rows: Vec<(String, u64, bool)> = shared.read(
            || format!("channel {name}: reading value sizes"),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_SIZES)?;
                let rows = stmt.query_map([name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                rows.collect()
            },
        )?;
        let bytes = rows.iter().map(|(_, size, _)| size).sum();
        let count = rows.iter().filter(|(_, _, marker)| !marker).count() as u64;
        let topics: HashMap<String, LatestEntry> = rows
            .into_iter()
            .map(|(topic, size, marker)| (topic, LatestEntry { size, marker }))
            .collect();
        let positions = shared.load_positions(name)?.into_iter().collect();
        Ok(Arc::new_cyclic(|me| LatestChannel {
            me: me.clone(),
            shared,
            name: name.to_string(),
            next: AtomicU64::new(next),
            floor: AtomicU64::new(floor),
            bytes: AtomicU64::new(bytes),
            count: AtomicU64::new(count),
            topics: Mutex::new(topics),
            keep_markers: name != RETAINED_STORE_NAME,
            positions: Mutex::new(positions),
        }))
    }

    pub(crate) fn name_str(&self) -> &str {
        &self.name
    }
    pub(crate) fn next_value(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }
    pub(crate) fn bytes_value(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }
    pub(crate) fn count_value(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }
    pub(crate) fn entry(&self, topic: &str) -> Option<LatestEntry> {
        self.topics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(topic)
            .copied()
    }
    pub(crate) fn keeps_markers(&self) -> bool {
        self.keep_markers
    }

    pub(crate) fn committed(
        &self,
        next: u64,
        bytes: u64,
        count: u64,
        changed: HashMap<String, Option<LatestEntry>>,
    ) {
        {
            let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
            for (topic, entry) in changed {
                match entry {
                    Some(entry) => topics.insert(topic, entry),
                    None => topics.remove(&topic),
                };
            }
        }
        self.bytes.store(bytes, Ordering::Release);
        self.count.store(count, Ordering::Release);
        self.next.store(next, Ordering::Release);
    }

    fn target(&self) -> contract::Result<Arc<LatestChannel>> {
        self.me.upgrade().ok_or_else(|| StorageError::Closed {
            provider: self.shared.name.clone(),
        })
    }
}

impl LatestStore for LatestChannel {
    fn name(&self) -> &str {
        &self.name
    }

    fn set(&self, record: Record) -> contract::Result<Record> {
        contract::check_record(&self.name, &record, false)?;
        let me = self.target()?;
        if record.payload.is_empty() {
            // The MQTT rule: an empty payload deletes. A topic that held
            // nothing takes no offset; the answer says so with offset 0.
            let topic = record.topic.clone();
            return Ok(self
                .shared
                .batcher
                .submit(&self.shared, Job::Delete(me, record))?
                .unwrap_or_else(|| Record::new(topic, bytes::Bytes::new())));
        }
        match self
            .shared
            .batcher
            .submit(&self.shared, Job::Put(Target::Latest(me), record))?
        {
            Some(stored) => Ok(stored),
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
        let me = self.target()?;
        self.shared.batcher.submit(
            &self.shared,
            Job::Delete(me, Record::new(topic, bytes::Bytes::new())),
        )
    }

    fn match_filter(&self, filter: &str) -> contract::Result<Vec<Record>> {
        self.shared.read(
            || format!("channel {}: matching {filter}", self.name),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_LIVE)?;
                let mut rows = stmt.query([&self.name])?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    let topic: String = r.get(2)?;
                    if filter_matches(filter, &topic) {
                        out.push(record_at(r, 1, r.get(0)?)?);
                    }
                }
                Ok(out)
            },
        )
    }

    fn match_with_deletions(&self, filter: &str, since: u64) -> contract::Result<Vec<Record>> {
        let (next, floor, out) = self.shared.read(
            || format!("channel {}: matching {filter} since {since}", self.name),
            |conn| {
                let (next, floor): (u64, u64) = conn
                    .prepare_cached(SQL_NEXT_FLOOR)?
                    .query_row([&self.name], |r| Ok((r.get(0)?, r.get(1)?)))?;
                let mut stmt = conn.prepare_cached(SQL_SINCE)?;
                let mut rows = stmt.query(rusqlite::params![self.name, since])?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    let topic: String = r.get(2)?;
                    if filter_matches(filter, &topic) {
                        // A marker row is the deletion as it was published.
                        out.push(record_at(r, 1, r.get(0)?)?);
                    }
                }
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

    fn trim(&self, before: u64) -> contract::Result<Removed> {
        let mut w = self.shared.writer()?;
        let floor = self.floor.load(Ordering::Acquire);
        let before = before.min(self.next_value());
        if before <= floor {
            return Ok(Removed::default());
        }
        // Values are never removed, so the floor rises no further than the
        // oldest value: a marker forgotten above the floor would be a
        // deletion a consumer is never told about (invariant 1).
        let result = w.txn(false, |conn| {
            let oldest_value: Option<u64> = conn
                .prepare_cached(
                    "SELECT min(offset) FROM latest_values WHERE channel = ?1 AND deleted = 0",
                )?
                .query_row([&self.name], |r| r.get(0))?;
            let bound = before.min(oldest_value.unwrap_or(before));
            if bound <= floor {
                return Ok(None);
            }
            let mut forgotten = Vec::new();
            {
                let mut stmt = conn.prepare_cached(
                    "DELETE FROM latest_values WHERE channel = ?1 AND deleted = 1 AND offset < ?2
                     RETURNING topic, size",
                )?;
                let mut rows = stmt.query(rusqlite::params![self.name, bound])?;
                while let Some(r) = rows.next()? {
                    forgotten.push((r.get::<_, String>(0)?, r.get::<_, u64>(1)?));
                }
            }
            conn.prepare_cached("UPDATE channels SET floor = ?2 WHERE name = ?1")?
                .execute(rusqlite::params![self.name, bound])?;
            Ok(Some((bound, forgotten)))
        });
        match result {
            Ok(None) => Ok(Removed::default()),
            Ok(Some((bound, forgotten))) => {
                let mut removed = Removed::default();
                {
                    let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
                    for (topic, size) in forgotten {
                        topics.remove(&topic);
                        removed.records += 1;
                        removed.bytes += size;
                    }
                }
                self.bytes
                    .fetch_sub(removed.bytes.min(self.bytes_value()), Ordering::AcqRel);
                self.floor.store(bound, Ordering::Release);
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

    fn next(&self) -> u64 {
        self.next_value()
    }

    fn floor(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }

    fn bytes(&self) -> u64 {
        self.bytes_value()
    }

    fn record_count(&self) -> u64 {
        self.count_value()
    }

    fn position(&self, reader: &Reader) -> contract::Result<Option<Position>> {
        self.shared.position(&self.name, reader)
    }

    fn save_position(&self, position: Position) -> contract::Result<()> {
        self.shared
            .save_position(&self.name, &position, self.next_value())?;
        self.positions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(position.reader.to_string(), position.offset);
        Ok(())
    }

    fn drop_position(&self, reader: &Reader) -> contract::Result<bool> {
        let dropped = self.shared.drop_position(&self.name, reader)?;
        self.positions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&reader.to_string());
        Ok(dropped)
    }

    fn positions(&self) -> contract::Result<Vec<Position>> {
        self.shared.positions(&self.name)
    }
}
