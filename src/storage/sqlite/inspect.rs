//! Read-only views of a provider's database for the operator's tools
//! (`saguin sqlite dump`): typed rows, so no module outside the provider
//! issues SQL against its schema. Each function reads through the
//! connection it is given; the caller holds one read transaction across
//! them so everything shown is one moment.

use rusqlite::Connection;
use saguin_format::model::{ChannelKind, Record};

pub use super::held::all_held;
use super::parse_kind;
use super::row::record_at;
use super::schema::record_columns;
use crate::storage::contract::BROADCAST_LOG_NAME;

/// A channel as the overview lists it. `bytes` is the stored counter for
/// an append channel and the rows' sizes summed for the others (which keep
/// theirs in memory); `records` counts rows - a latest channel's values,
/// its deletion markers left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelSummary {
    pub name: String,
    pub kind: String,
    pub next: u64,
    pub floor: u64,
    pub bytes: u64,
    pub records: u64,
}

pub fn channel_summaries(conn: &Connection) -> rusqlite::Result<Vec<ChannelSummary>> {
    let mut stmt = conn.prepare(
        "SELECT c.name, c.kind, c.next, c.floor,
           CASE c.kind WHEN 'append' THEN c.bytes
             WHEN 'latest' THEN (SELECT coalesce(sum(size), 0) FROM latest_values v WHERE v.channel = c.name AND v.deleted = 0)
             ELSE (SELECT coalesce(sum(size), 0) FROM queue_items q WHERE q.channel = c.name) END,
           CASE c.kind WHEN 'append' THEN (SELECT count(*) FROM records r WHERE r.channel = c.name)
             WHEN 'latest' THEN (SELECT count(*) FROM latest_values v WHERE v.channel = c.name AND v.deleted = 0)
             ELSE (SELECT count(*) FROM queue_items q WHERE q.channel = c.name) END
         FROM channels c ORDER BY c.name",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(ChannelSummary {
            name: r.get(0)?,
            kind: r.get(1)?,
            next: r.get(2)?,
            floor: r.get(3)?,
            bytes: r.get(4)?,
            records: r.get(5)?,
        })
    })?;
    rows.collect()
}

/// A stored reader position of some channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPosition {
    pub channel: String,
    /// As stored (`mqtt:<client>` or `bridge:<name>`), undecoded: a tool
    /// shows what is there.
    pub reader: String,
    pub offset: u64,
    pub saved_at: i64,
    pub session_expiry: Option<u32>,
}

pub fn all_positions(conn: &Connection) -> rusqlite::Result<Vec<StoredPosition>> {
    let mut stmt = conn.prepare(
        "SELECT channel, reader, offset, saved_at, session_expiry FROM positions ORDER BY channel, reader",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(StoredPosition {
            channel: r.get(0)?,
            reader: r.get(1)?,
            offset: r.get(2)?,
            saved_at: r.get(3)?,
            session_expiry: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// A persistent session counted rather than decoded: what the overview's
/// table shows even when a row would not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    pub client_id: String,
    pub principal: Option<String>,
    pub expiry_interval: u32,
    pub detached_at: i64,
    pub subscriptions: u64,
    pub window: u16,
    pub inflight: u64,
    /// Its broadcast-log cursor, `None` when it has none.
    pub cursor: Option<u64>,
}

pub fn session_summaries(conn: &Connection) -> rusqlite::Result<Vec<SessionSummary>> {
    let mut stmt = conn.prepare(
        "SELECT s.client_id, s.principal, s.expiry_interval, s.detached_at, json_array_length(s.subscriptions), s.window,
            (SELECT count(*) FROM session_inflight i WHERE i.client_id = s.client_id),
            (SELECT p.offset FROM positions p WHERE p.channel = ?1 AND p.reader = 'mqtt:' || s.client_id)
         FROM sessions s ORDER BY s.client_id",
    )?;
    let rows = stmt.query_map([BROADCAST_LOG_NAME], |r| {
        Ok(SessionSummary {
            client_id: r.get(0)?,
            principal: r.get(1)?,
            expiry_interval: r.get(2)?,
            detached_at: r.get(3)?,
            subscriptions: r.get(4)?,
            window: r.get(5)?,
            inflight: r.get(6)?,
            cursor: r.get(7)?,
        })
    })?;
    rows.collect()
}

/// A queue's depth and what survives of its deliveries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueSummary {
    pub channel: String,
    pub depth: u64,
    /// Items delivered at least once.
    pub delivered: u64,
    pub max_attempts: u64,
    /// Attempts summed over every item.
    pub attempts: u64,
    /// The earliest first delivery, 0 when none was delivered.
    pub oldest_first_delivered: i64,
}

pub fn queue_summaries(conn: &Connection) -> rusqlite::Result<Vec<QueueSummary>> {
    let mut stmt = conn.prepare(
        "SELECT c.name, count(q.offset), coalesce(sum(q.attempts > 0), 0), coalesce(max(q.attempts), 0),
            coalesce(sum(q.attempts), 0), coalesce(min(nullif(q.first_delivered, 0)), 0)
         FROM channels c LEFT JOIN queue_items q ON q.channel = c.name
         WHERE c.kind = 'queue' GROUP BY c.name ORDER BY c.name",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(QueueSummary {
            channel: r.get(0)?,
            depth: r.get(1)?,
            delivered: r.get(2)?,
            max_attempts: r.get(3)?,
            attempts: r.get(4)?,
            oldest_first_delivered: r.get(5)?,
        })
    })?;
    rows.collect()
}

/// A shared subscription group's cursor and returned deliveries, the
/// returned ones in the order the provider reads them back (by log offset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareGroupRow {
    pub group: String,
    pub filter: String,
    pub cursor: u64,
    pub returned: Vec<u64>,
}

pub fn share_groups(conn: &Connection) -> rusqlite::Result<Vec<ShareGroupRow>> {
    let mut stmt = conn.prepare(
        "SELECT group_name, filter, cursor FROM share_groups ORDER BY group_name, filter",
    )?;
    let groups = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<Vec<(String, String, u64)>>>()?;
    let mut returned = conn.prepare(
        "SELECT log_offset FROM share_returned WHERE group_name = ?1 AND filter = ?2 ORDER BY log_offset",
    )?;
    groups
        .into_iter()
        .map(|(group, filter, cursor)| {
            let offsets = returned
                .query_map(rusqlite::params![group, filter], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<u64>>>()?;
            Ok(ShareGroupRow {
                group,
                filter,
                cursor,
                returned: offsets,
            })
        })
        .collect()
}

/// A channel's kind and counters from its `channels` row; `None` when the
/// database has no channel of that name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelHead {
    pub kind: ChannelKind,
    pub next: u64,
    pub floor: u64,
}

pub fn channel_head(conn: &Connection, name: &str) -> rusqlite::Result<Option<ChannelHead>> {
    let row = conn.query_row(
        "SELECT kind, next, floor FROM channels WHERE name = ?1",
        [name],
        |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)),
    );
    match row {
        Ok((kind, next, floor)) => {
            let kind = parse_kind(&kind).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    0,
                    rusqlite::types::Type::Text,
                    format!("channel {name}: kind {kind:?} is not append, latest or queue").into(),
                )
            })?;
            Ok(Some(ChannelHead { kind, next, floor }))
        }
        Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
        Err(e) => Err(e),
    }
}

/// One stored record of a channel: an append channel's record, a latest
/// channel's value or deletion marker, a queue's item with its deliveries.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredRecord {
    pub record: Record,
    /// A latest channel's deletion marker.
    pub deleted: bool,
    /// A queue's item: attempts, first and last delivery (0 = none).
    pub delivery: Option<(u32, i64, i64)>,
}

const SQL_APPEND_FROM: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    ", 0, NULL, NULL, NULL FROM records WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT ?3"
);
const SQL_LATEST_FROM: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    ", deleted, NULL, NULL, NULL FROM latest_values WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT ?3"
);
const SQL_QUEUE_FROM: &str = concat!(
    "SELECT offset, ",
    record_columns!(),
    ", 0, attempts, first_delivered, last_delivered FROM queue_items WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT ?3"
);

/// How many rows of `channel` (of `kind`) stand at `from` or later.
pub fn count_from(
    conn: &Connection,
    channel: &str,
    kind: ChannelKind,
    from: u64,
) -> rusqlite::Result<u64> {
    let sql = match kind {
        ChannelKind::Append => "SELECT count(*) FROM records WHERE channel = ?1 AND offset >= ?2",
        ChannelKind::Latest => {
            "SELECT count(*) FROM latest_values WHERE channel = ?1 AND offset >= ?2"
        }
        ChannelKind::Queue => {
            "SELECT count(*) FROM queue_items WHERE channel = ?1 AND offset >= ?2"
        }
    };
    conn.query_row(sql, rusqlite::params![channel, from], |r| r.get(0))
}

/// The rows of `channel` (of `kind`) from offset `from` on, at most
/// `limit` (`None`: all), in offset order, each handed to `each` as it is
/// read so a long listing is never held whole.
pub fn records_from<E: From<rusqlite::Error>>(
    conn: &Connection,
    channel: &str,
    kind: ChannelKind,
    from: u64,
    limit: Option<u64>,
    mut each: impl FnMut(StoredRecord) -> Result<(), E>,
) -> Result<(), E> {
    let sql = match kind {
        ChannelKind::Append => SQL_APPEND_FROM,
        ChannelKind::Latest => SQL_LATEST_FROM,
        ChannelKind::Queue => SQL_QUEUE_FROM,
    };
    let limit = limit.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
    let mut stmt = conn.prepare(sql)?;
    let mut rows = stmt.query(rusqlite::params![channel, from, limit])?;
    while let Some(row) = rows.next()? {
        let offset: u64 = row.get(0)?;
        let attempts: Option<u32> = row.get(15)?;
        let delivery = match attempts {
            Some(attempts) => Some((attempts, row.get(16)?, row.get(17)?)),
            None => None,
        };
        each(StoredRecord {
            record: record_at(row, 1, offset)?,
            deleted: row.get(14)?,
            delivery,
        })?;
    }
    Ok(())
}
