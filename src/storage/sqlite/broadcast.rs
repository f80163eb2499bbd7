//! The broadcast log on sqlite: rows of `records` under the reserved name
//! `$saguin/broadcast` with a `channels` row of its own (it is not a channel
//! and nothing subscribes to it). A message leaves once nobody owes it, from
//! anywhere in the log, so the log may have gaps; the floor is the lowest
//! offset still held and no offset is reused. A session's cursor is a
//! `positions` row; a shared group's cursor is a `share_groups` row and the
//! deliveries returned to it `share_returned` rows. The log's reads stay on
//! the write connection: they decide what a write does.

use std::sync::Arc;

use rusqlite::OptionalExtension;
use saguin_format::model::Record;

use super::append::AppendChannel;
use super::row::record_at;
use super::schema::record_columns;
use super::Shared;
use crate::storage::contract::{
    self, AppendStore, BroadcastLog, OffsetStore, Removed, ShareGroupEntry, ShareGroupKey,
    StorageError, BROADCAST_LOG_NAME,
};

pub(crate) struct Broadcast {
    shared: Arc<Shared>,
    log: Arc<AppendChannel>,
}

impl Broadcast {
    pub fn new(shared: Arc<Shared>, log: Arc<AppendChannel>) -> Broadcast {
        debug_assert!(log.is_gapped());
        Broadcast { shared, log }
    }

    pub fn log(&self) -> Arc<AppendChannel> {
        Arc::clone(&self.log)
    }

    fn cursor_reader(client_id: &str) -> String {
        format!("mqtt:{client_id}")
    }

    fn write<T>(
        &self,
        context: impl FnOnce() -> String,
        body: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> contract::Result<T> {
        let mut w = self.shared.writer()?;
        w.txn(true, body)
            .map_err(|e| self.shared.write_error(Some(w.conn()), context(), 0, &e))
    }

    fn read_on_writer<T>(
        &self,
        context: impl FnOnce() -> String,
        body: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> contract::Result<T> {
        let w = self.shared.writer()?;
        body(w.conn()).map_err(|e| self.shared.read_error(context(), e))
    }

    fn returned_of(conn: &rusqlite::Connection, key: &ShareGroupKey) -> rusqlite::Result<Vec<u64>> {
        let mut stmt = conn.prepare_cached(
            "SELECT log_offset FROM share_returned WHERE group_name = ?1 AND filter = ?2 ORDER BY rowid",
        )?;
        let rows = stmt.query_map(rusqlite::params![key.group, key.filter], |r| r.get(0))?;
        rows.collect()
    }
}

impl BroadcastLog for Broadcast {
    fn append(&self, record: Record) -> contract::Result<Record> {
        self.log.append(record)
    }

    fn append_batch(&self, records: Vec<Record>) -> Vec<contract::Result<Record>> {
        self.log.append_many(records)
    }

    fn read_from_n(&self, offset: u64, max: usize) -> contract::Result<Vec<Record>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        self.read_on_writer(
            || format!("{BROADCAST_LOG_NAME}: reading from offset {offset}"),
            |conn| {
                let mut stmt = conn.prepare_cached(concat!(
                    "SELECT offset, ",
                    record_columns!(),
                    " FROM records WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT ?3"
                ))?;
                let rows = stmt
                    .query_map(rusqlite::params![BROADCAST_LOG_NAME, offset, limit], |r| {
                        record_at(r, 1, r.get(0)?)
                    })?;
                rows.collect()
            },
        )
    }

    fn release(&self, offsets: &[u64]) -> contract::Result<Removed> {
        self.log.release_offsets(offsets)
    }

    fn next(&self) -> u64 {
        self.log.next()
    }

    fn floor(&self) -> u64 {
        self.log.floor()
    }

    fn bytes(&self) -> u64 {
        self.log.bytes()
    }

    fn record_count(&self) -> u64 {
        self.log.record_count()
    }

    fn cursor(&self, client_id: &str) -> contract::Result<Option<u64>> {
        let reader = Self::cursor_reader(client_id);
        self.read_on_writer(
            || format!("{BROADCAST_LOG_NAME}: reading the cursor of {client_id}"),
            |conn| {
                conn.prepare_cached(
                    "SELECT offset FROM positions WHERE channel = ?1 AND reader = ?2",
                )?
                .query_row(rusqlite::params![BROADCAST_LOG_NAME, reader], |r| r.get(0))
                .optional()
            },
        )
    }

    fn save_cursor(&self, client_id: &str, offset: u64) -> contract::Result<()> {
        let next = self.log.next();
        if offset > next {
            return Err(StorageError::Invalid {
                what: format!("{BROADCAST_LOG_NAME}: cursor of {client_id}"),
                detail: format!("offset {offset} is past the next offset {next}"),
            });
        }
        let reader = Self::cursor_reader(client_id);
        let now = contract::now_nanos();
        self.write(
            || format!("{BROADCAST_LOG_NAME}: saving the cursor of {client_id}"),
            |conn| {
                conn.prepare_cached(
                    "INSERT INTO positions (channel, reader, offset, saved_at, session_expiry) VALUES (?1, ?2, ?3, ?4, NULL)
                     ON CONFLICT (channel, reader) DO UPDATE SET offset = excluded.offset, saved_at = excluded.saved_at",
                )?
                .execute(rusqlite::params![BROADCAST_LOG_NAME, reader, offset, now])
                .map(|_| ())
            },
        )
    }

    fn drop_cursor(&self, client_id: &str) -> contract::Result<bool> {
        let reader = Self::cursor_reader(client_id);
        self.write(
            || format!("{BROADCAST_LOG_NAME}: dropping the cursor of {client_id}"),
            |conn| {
                conn.prepare_cached("DELETE FROM positions WHERE channel = ?1 AND reader = ?2")?
                    .execute(rusqlite::params![BROADCAST_LOG_NAME, reader])
                    .map(|n| n > 0)
            },
        )
    }

    fn cursors(&self) -> contract::Result<Vec<(String, u64)>> {
        let rows: Vec<(String, u64)> = self.read_on_writer(
            || format!("{BROADCAST_LOG_NAME}: reading cursors"),
            |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT reader, offset FROM positions WHERE channel = ?1 ORDER BY reader",
                )?;
                let rows = stmt.query_map([BROADCAST_LOG_NAME], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect()
            },
        )?;
        let mut out: Vec<(String, u64)> = rows
            .into_iter()
            .filter_map(|(reader, offset)| {
                reader
                    .strip_prefix("mqtt:")
                    .map(|id| (id.to_string(), offset))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    fn share_group(&self, key: &ShareGroupKey) -> contract::Result<Option<ShareGroupEntry>> {
        self.read_on_writer(
            || {
                format!(
                    "{BROADCAST_LOG_NAME}: reading share group {}/{}",
                    key.group, key.filter
                )
            },
            |conn| {
                let cursor: Option<u64> = conn
                    .prepare_cached(
                        "SELECT cursor FROM share_groups WHERE group_name = ?1 AND filter = ?2",
                    )?
                    .query_row(rusqlite::params![key.group, key.filter], |r| r.get(0))
                    .optional()?;
                match cursor {
                    Some(cursor) => Ok(Some(ShareGroupEntry {
                        key: key.clone(),
                        cursor,
                        returned: Self::returned_of(conn, key)?,
                    })),
                    None => Ok(None),
                }
            },
        )
    }

    fn save_share_group(&self, entry: ShareGroupEntry) -> contract::Result<()> {
        let key = entry.key.clone();
        self.write(
            || format!("{BROADCAST_LOG_NAME}: saving share group {}/{}", key.group, key.filter),
            |conn| {
                conn.prepare_cached(
                    "INSERT INTO share_groups (group_name, filter, cursor) VALUES (?1, ?2, ?3)
                     ON CONFLICT (group_name, filter) DO UPDATE SET cursor = excluded.cursor",
                )?
                .execute(rusqlite::params![entry.key.group, entry.key.filter, entry.cursor])?;
                conn.prepare_cached("DELETE FROM share_returned WHERE group_name = ?1 AND filter = ?2")?
                    .execute(rusqlite::params![entry.key.group, entry.key.filter])?;
                let mut insert = conn.prepare_cached(
                    "INSERT INTO share_returned (group_name, filter, log_offset) VALUES (?1, ?2, ?3)",
                )?;
                // Inserted in the order returned, which is the order they are
                // owed again: the table keeps no sequence column, so reads
                // take insertion (rowid) order, and the rows of a group are
                // always rewritten whole.
                let mut seen = std::collections::BTreeSet::new();
                for offset in entry.returned.iter().filter(|o| seen.insert(**o)) {
                    insert.execute(rusqlite::params![entry.key.group, entry.key.filter, offset])?;
                }
                Ok(())
            },
        )
    }

    fn drop_share_group(&self, key: &ShareGroupKey) -> contract::Result<bool> {
        self.write(
            || {
                format!(
                    "{BROADCAST_LOG_NAME}: dropping share group {}/{}",
                    key.group, key.filter
                )
            },
            |conn| {
                let n = conn
                    .prepare_cached(
                        "DELETE FROM share_groups WHERE group_name = ?1 AND filter = ?2",
                    )?
                    .execute(rusqlite::params![key.group, key.filter])?;
                conn.prepare_cached(
                    "DELETE FROM share_returned WHERE group_name = ?1 AND filter = ?2",
                )?
                .execute(rusqlite::params![key.group, key.filter])?;
                Ok(n > 0)
            },
        )
    }

    fn share_groups(&self) -> contract::Result<Vec<ShareGroupEntry>> {
        self.read_on_writer(
            || format!("{BROADCAST_LOG_NAME}: reading share groups"),
            |conn| {
                let keys: Vec<(ShareGroupKey, u64)> = {
                    let mut stmt =
                        conn.prepare_cached("SELECT group_name, filter, cursor FROM share_groups ORDER BY group_name, filter")?;
                    let rows = stmt.query_map([], |r| {
                        Ok((
                            ShareGroupKey {
                                group: r.get(0)?,
                                filter: r.get(1)?,
                            },
                            r.get(2)?,
                        ))
                    })?;
                    rows.collect::<rusqlite::Result<_>>()?
                };
                keys.into_iter()
                    .map(|(key, cursor)| {
                        let returned = Self::returned_of(conn, &key)?;
                        Ok(ShareGroupEntry { key, cursor, returned })
                    })
                    .collect()
            },
        )
    }
}
