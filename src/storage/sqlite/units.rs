//! A migration's units to and from a schema-20 database, with the rows the
//! provider's stores read and write, through a connection of the
//! migration's own: the copy paths keep transactions of their own, one per
//! unit.
//!
//! Sessions are written and read by the session store's own functions
//! (`session.rs`), so the `subscriptions` and `will` columns have one
//! encoding.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use rusqlite::{params, CachedStatement, Connection, OptionalExtension, ToSql};
use saguin_format::f21::{
    BroadcastFile, ChannelFile, DeadLetter, FileKind, HeldPublish, Position, QueueItem, RecordList,
    RecordSink, RetainedFile, SessionsFile, SharedGroup, SharedGroupKey, SnapshotFile,
};
use saguin_format::model::{ChannelKind, Record};

use super::row::{record_at, Encoded};
use super::schema::RECORD_COLUMNS;
use super::session::{read_sessions as read_session_rows, write_session};
use crate::storage::contract::{dead_letter_name, RETAINED_STORE_NAME};
use crate::storage::migrate::model::{Counts, Unit, LOG};
use crate::storage::sample::ListCounts;
use crate::storage::snapshot_dir::{self, FileProblem, LoadSink, Records, ScanOptions};

/// A unit that could not be read, named.
#[derive(Debug)]
pub struct ReadFailure {
    pub name: String,
    pub kind: &'static str,
    pub error: String,
}

fn channel_kind(text: &str) -> Option<ChannelKind> {
    super::parse_kind(text)
}

/// A `channels` row.
#[derive(Clone, Debug)]
pub struct ChannelRow {
    pub name: String,
    pub kind: String,
    pub next: u64,
    pub floor: u64,
    pub bytes: u64,
}

pub fn channel_rows(conn: &Connection) -> rusqlite::Result<Vec<ChannelRow>> {
    let mut stmt =
        conn.prepare("SELECT name, kind, next, floor, bytes FROM channels ORDER BY name")?;
    let rows = stmt.query_map([], |r| {
        Ok(ChannelRow {
            name: r.get(0)?,
            kind: r.get(1)?,
            next: r.get(2)?,
            floor: r.get(3)?,
            bytes: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// Every unit the database holds, read inside the caller's read transaction
/// so all of them are one moment. A unit whose rows do not decode is a
/// failure of its own; the others are read regardless.
pub fn read_units(conn: &Connection) -> rusqlite::Result<(Vec<Unit>, Vec<ReadFailure>)> {
    let rows = channel_rows(conn)?;
    let by_name: BTreeMap<&str, &ChannelRow> = rows.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut units = Vec::new();
    let mut failures = Vec::new();
    // The dead-letter channels travel inside their queues.
    let dead_letters: BTreeSet<String> = rows
        .iter()
        .filter(|r| r.kind == "queue")
        .map(|r| dead_letter_name(&r.name))
        .filter(|d| by_name.contains_key(d.as_str()))
        .collect();
    for row in &rows {
        if row.name.starts_with("$saguin/") || dead_letters.contains(&row.name) {
            continue;
        }
        let kind = channel_kind(&row.kind).map_or("channel", ChannelKind::as_str);
        match read_channel(conn, row, &by_name) {
            Ok(c) => units.push(Unit::Channel(c)),
            Err(error) => failures.push(ReadFailure {
                name: row.name.clone(),
                kind,
                error,
            }),
        }
    }
    if let Some(row) = by_name.get(RETAINED_STORE_NAME) {
        match read_retained(conn, row) {
            Ok(r) => units.push(Unit::Retained(r)),
            Err(error) => failures.push(ReadFailure {
                name: RETAINED_STORE_NAME.into(),
                kind: "retained",
                error,
            }),
        }
    }
    let session_count: i64 = conn.query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))?;
    if by_name.contains_key(LOG) || session_count > 0 {
        match read_sessions(conn, by_name.get(LOG).copied()) {
            Ok((sessions, log)) => units.push(Unit::Sessions { sessions, log }),
            Err(error) => failures.push(ReadFailure {
                name: crate::storage::migrate::model::SESSIONS_UNIT.into(),
                kind: "sessions",
                error,
            }),
        }
    }
    Ok((units, failures))
}

fn text(e: rusqlite::Error) -> String {
    e.to_string()
}

fn read_records(conn: &Connection, channel: &str) -> Result<Vec<Record>, String> {
    let sql =
        format!("SELECT offset, {RECORD_COLUMNS} FROM records WHERE channel = ?1 ORDER BY offset");
    let mut stmt = conn.prepare_cached(&sql).map_err(text)?;
    let rows = stmt
        .query_map([channel], |r| {
            let offset: u64 = r.get(0)?;
            record_at(r, 1, offset)
        })
        .map_err(text)?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| format!("records: {e}"))
}

fn sum_sizes(conn: &Connection, sql: &str, channel: &str) -> Result<u64, String> {
    conn.query_row(sql, [channel], |r| r.get::<_, i64>(0))
        .map(|n| n.max(0) as u64)
        .map_err(text)
}

fn read_positions(conn: &Connection, channel: &str) -> Result<Vec<Position>, String> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT reader, offset, saved_at, session_expiry FROM positions WHERE channel = ?1 ORDER BY reader",
        )
        .map_err(text)?;
    let rows = stmt
        .query_map([channel], |r| {
            Ok(Position {
                reader: r.get(0)?,
                offset: r.get(1)?,
                saved_at: r.get(2)?,
                session_expiry: r.get(3)?,
            })
        })
        .map_err(text)?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| format!("positions: {e}"))
}

fn read_held(conn: &Connection, channel: &str) -> Result<Vec<HeldPublish>, String> {
    let sql = format!(
        "SELECT holder_client_id, packet_id, held_at, {RECORD_COLUMNS} FROM held_publishes
         WHERE channel = ?1 ORDER BY holder_client_id, packet_id"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(text)?;
    let rows = stmt
        .query_map([channel], |r| {
            Ok(HeldPublish {
                client_id: r.get(0)?,
                packet_id: r.get(1)?,
                held_at: r.get(2)?,
                record: record_at(r, 3, 0)?,
            })
        })
        .map_err(text)?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| format!("held publishes: {e}"))
}

fn read_channel(
    conn: &Connection,
    row: &ChannelRow,
    by_name: &BTreeMap<&str, &ChannelRow>,
) -> Result<ChannelFile, String> {
    let kind = channel_kind(&row.kind)
        .ok_or_else(|| format!("kind {:?} is not append, latest or queue", row.kind))?;
    let mut c = ChannelFile::new(row.name.clone(), kind);
    c.next = row.next;
    c.floor = row.floor;
    c.held = read_held(conn, &row.name)?;
    match kind {
        ChannelKind::Append => {
            c.bytes = row.bytes;
            c.records = read_records(conn, &row.name)?;
            c.positions = read_positions(conn, &row.name)?;
        }
        ChannelKind::Latest => {
            let sql = format!(
                "SELECT offset, {RECORD_COLUMNS}, deleted FROM latest_values WHERE channel = ?1 ORDER BY offset"
            );
            let mut stmt = conn.prepare_cached(&sql).map_err(text)?;
            let rows = stmt
                .query_map([&row.name], |r| {
                    let offset: u64 = r.get(0)?;
                    let mut record = record_at(r, 1, offset)?;
                    let deleted: bool = r.get(14)?;
                    if deleted {
                        record.payload = Bytes::new();
                    }
                    Ok(record)
                })
                .map_err(text)?;
            c.records = rows
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(|e| format!("values: {e}"))?;
            // A snapshot states what the memory provider counts: every
            // value and deletion marker at its accounted size (the sqlite
            // provider keeps no byte count for a latest channel).
            c.bytes = c.records.iter().map(Record::accounted_size).sum();
            c.positions = read_positions(conn, &row.name)?;
        }
        ChannelKind::Queue => {
            c.positions = read_positions(conn, &row.name)?;
            let sql = format!(
                "SELECT offset, {RECORD_COLUMNS}, attempts, first_delivered, last_delivered
                 FROM queue_items WHERE channel = ?1 ORDER BY offset"
            );
            let mut stmt = conn.prepare_cached(&sql).map_err(text)?;
            let rows = stmt
                .query_map([&row.name], |r| {
                    let offset: u64 = r.get(0)?;
                    Ok(QueueItem {
                        record: record_at(r, 1, offset)?,
                        attempts: r.get(14)?,
                        first_delivered: r.get(15)?,
                        last_delivered: r.get(16)?,
                    })
                })
                .map_err(text)?;
            c.items = rows
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(|e| format!("queue items: {e}"))?;
            c.bytes = sum_sizes(
                conn,
                "SELECT coalesce(sum(size), 0) FROM queue_items WHERE channel = ?1",
                &row.name,
            )?;
            let dlq = dead_letter_name(&row.name);
            let mut dead = DeadLetter {
                name: dlq.clone(),
                next: 1,
                floor: 1,
                bytes: 0,
                records: Vec::new(),
                positions: Vec::new(),
            };
            if let Some(d) = by_name.get(dlq.as_str()) {
                if d.kind != "append" {
                    return Err(format!(
                        "its dead-letter channel {dlq} is stored as {}, not append",
                        d.kind
                    ));
                }
                dead.next = d.next;
                dead.floor = d.floor;
                dead.bytes = d.bytes;
                dead.records = read_records(conn, &dlq).map_err(|e| format!("{dlq}: {e}"))?;
                dead.positions = read_positions(conn, &dlq).map_err(|e| format!("{dlq}: {e}"))?;
            }
            c.dead_letter = Some(dead);
        }
    }
    Ok(c)
}

fn read_retained(conn: &Connection, _row: &ChannelRow) -> Result<RetainedFile, String> {
    let sql = format!(
        "SELECT offset, {RECORD_COLUMNS} FROM latest_values WHERE channel = ?1 AND deleted = 0 ORDER BY offset"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(text)?;
    let rows = stmt
        .query_map([RETAINED_STORE_NAME], |r| {
            let offset: u64 = r.get(0)?;
            record_at(r, 1, offset)
        })
        .map_err(text)?;
    Ok(RetainedFile {
        records: rows
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| format!("retained messages: {e}"))?,
    })
}

fn read_sessions(
    conn: &Connection,
    log_row: Option<&ChannelRow>,
) -> Result<(SessionsFile, BroadcastFile), String> {
    let sessions = read_session_rows(conn).map_err(|e| format!("sessions: {e}"))?;
    let mut groups_stmt = conn
        .prepare("SELECT group_name, filter, cursor FROM share_groups ORDER BY group_name, filter")
        .map_err(text)?;
    let groups = groups_stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, u64>(2)?,
            ))
        })
        .map_err(text)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| format!("shared groups: {e}"))?;
    let mut returned_stmt = conn
        .prepare(
            "SELECT log_offset FROM share_returned WHERE group_name = ?1 AND filter = ?2 ORDER BY rowid",
        )
        .map_err(text)?;
    let mut shared_groups = Vec::with_capacity(groups.len());
    for (group, filter, cursor) in groups {
        let returned = returned_stmt
            .query_map(params![group, filter], |r| r.get::<_, u64>(0))
            .map_err(text)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| format!("shared group {group:?}: returned deliveries: {e}"))?;
        shared_groups.push(SharedGroup {
            key: SharedGroupKey { group, filter },
            cursor,
            returned,
        });
    }
    let mut log = BroadcastFile::default();
    if let Some(row) = log_row {
        if row.kind != "append" {
            return Err(format!(
                "the broadcast log is stored as {}, not append",
                row.kind
            ));
        }
        log.next = row.next;
        log.floor = row.floor;
        log.bytes = row.bytes;
        log.messages = read_records(conn, LOG)?;
        log.cursors = read_positions(conn, LOG)?;
        log.held = read_held(conn, LOG)?;
    }
    Ok((
        SessionsFile {
            sessions,
            shared_groups,
        },
        log,
    ))
}

/// Record columns with the size overridden (a deletion marker counts 0, as
/// the provider stores it).
fn bind_record<'a>(encoded: &'a Encoded<'a>, size: &'a u64) -> [&'a dyn ToSql; 13] {
    let mut p = encoded.params();
    p[12] = size;
    p
}

fn insert_channel_row(
    tx: &Connection,
    name: &str,
    kind: ChannelKind,
    next: u64,
    floor: u64,
    bytes: u64,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO channels (name, kind, next, floor, bytes) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![name, kind.as_str(), next, floor, bytes])?;
    Ok(())
}

/// The statement that inserts one record of an append channel.
fn record_insert(tx: &Connection) -> rusqlite::Result<CachedStatement<'_>> {
    tx.prepare_cached(&format!(
        "INSERT INTO records (channel, offset, {RECORD_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
    ))
}

/// Inserts `r` into `channel` with `stmt` ([`record_insert`]): the bytes
/// it counts for, as the provider keeps them (a removal gives back exactly
/// that).
fn insert_record(
    stmt: &mut CachedStatement<'_>,
    channel: &str,
    r: &Record,
) -> rusqlite::Result<u64> {
    let e = Encoded::new(r);
    // Bound in place: the hot loop of a migration, one row per record.
    stmt.raw_bind_parameter(1, channel)?;
    stmt.raw_bind_parameter(2, r.offset)?;
    for (n, value) in e.params().into_iter().enumerate() {
        stmt.raw_bind_parameter(n + 3, value)?;
    }
    stmt.raw_execute()?;
    Ok(e.size)
}

fn insert_records(
    tx: &Connection,
    channel: &str,
    records: &[Record],
    tick: &dyn Fn(u64),
) -> rusqlite::Result<u64> {
    let mut stmt = record_insert(tx)?;
    let mut bytes = 0u64;
    for (i, r) in records.iter().enumerate() {
        bytes += insert_record(&mut stmt, channel, r)?;
        if i % 4096 == 4095 {
            tick(4096);
        }
    }
    tick(records.len() as u64 % 4096);
    Ok(bytes)
}

fn insert_positions(
    tx: &Connection,
    channel: &str,
    positions: &[Position],
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(
        "INSERT INTO positions (channel, reader, offset, saved_at, session_expiry) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for p in positions {
        stmt.execute(params![
            channel,
            p.reader,
            p.offset,
            p.saved_at,
            p.session_expiry
        ])?;
    }
    Ok(())
}

fn insert_held(tx: &Connection, channel: &str, held: &[HeldPublish]) -> rusqlite::Result<()> {
    let sql = format!(
        "INSERT INTO held_publishes (channel, holder_client_id, packet_id, held_at, {RECORD_COLUMNS})
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    for h in held {
        let record = Record {
            offset: 0,
            ..h.record.clone()
        };
        let e = Encoded::new(&record);
        let mut p: Vec<&dyn ToSql> = vec![&channel, &h.client_id, &h.packet_id, &h.held_at];
        p.extend(e.params());
        stmt.execute(&p[..])?;
    }
    Ok(())
}

/// Why a unit was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteFailure {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// The file a channel's records are carried from did not decode.
    #[error("{}: {problem}", file.display())]
    Carried { file: PathBuf, problem: FileProblem },
    /// It decoded, and does not hold what it held when the directory was
    /// scanned.
    #[error("{}: changed since the directory was checked: it no longer holds what it held then", file.display())]
    Changed { file: PathBuf },
}

/// Writes one unit in one transaction: all of it or none of it. `tick`
/// is told how many records went in, for a progress bar.
pub fn write_unit(
    conn: &mut Connection,
    unit: &Unit,
    tick: &dyn Fn(u64),
) -> Result<(), WriteFailure> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    match unit {
        Unit::Channel(c) => write_channel(&tx, c, tick)?,
        Unit::ChannelInFile {
            channel,
            file,
            lists,
        } => write_channel_in_file(&tx, channel, file, *lists, tick)?,
        Unit::Retained(r) => write_retained(&tx, r, tick)?,
        Unit::Sessions { sessions, log } => write_sessions(&tx, sessions, log, tick)?,
    }
    Ok(tx.commit()?)
}

/// A channel held whole: its rows, then every record of its lists.
fn write_channel(tx: &Connection, c: &ChannelFile, tick: &dyn Fn(u64)) -> rusqlite::Result<()> {
    let mut carrier = Carrier::begin(tx, c, tick)?;
    for r in &c.records {
        carrier.insert(RecordList::ChannelRecords, r)?;
    }
    for item in &c.items {
        carrier.insert_item(item)?;
    }
    for r in c.dead_letter.iter().flat_map(|d| &d.records) {
        carrier.insert(RecordList::DeadLetterRecords, r)?;
    }
    carrier.finish()
}

/// [`write_channel`] of a channel whose records are read from `file` as
/// they are inserted: `c` holds everything else, and `lists` what the file
/// held when the directory was scanned. A file that does not decode, or no
/// longer holds that channel and that many records, writes nothing.
fn write_channel_in_file(
    tx: &Connection,
    c: &ChannelFile,
    file: &Path,
    lists: ListCounts,
    tick: &dyn Fn(u64),
) -> Result<(), WriteFailure> {
    let mut carrier = Carrier::begin(tx, c, tick)?;
    let read = snapshot_dir::read_f21_file_with(
        file,
        &ScanOptions::default(),
        FileKind::Channel,
        Records::Into(&mut carrier),
    );
    // The file's verdict first: a record a damaged file hands on before
    // its verdict may fail to insert (an offset twice), and the damage is
    // what is to be named.
    match read {
        Err(problem) => {
            return Err(WriteFailure::Carried {
                file: file.to_path_buf(),
                problem,
            })
        }
        Ok((_, SnapshotFile::Channel(back))) if back == *c && carrier.carried == lists => {}
        Ok(_) => {
            return Err(WriteFailure::Changed {
                file: file.to_path_buf(),
            })
        }
    }
    if let Some(e) = carrier.failed.take() {
        return Err(e.into());
    }
    Ok(carrier.finish()?)
}

/// Writes one channel record by record, each where its kind keeps it: an
/// append channel's records and a queue's dead letters with what they count
/// for, a latest channel's values with their deletion markers, a queue's
/// items. Fed from a channel held whole, or as its file is decoded (a
/// [`RecordSink`]: each record inserted and let go, so a channel of any
/// length is carried in the memory of one record and the file's window).
struct Carrier<'t> {
    tx: &'t Connection,
    channel: &'t ChannelFile,
    /// A queue's dead-letter channel.
    dead_letter: Option<String>,
    records: CachedStatement<'t>,
    values: CachedStatement<'t>,
    items: CachedStatement<'t>,
    /// What the channel's records and its dead letters count for.
    bytes: u64,
    dead_letter_bytes: u64,
    /// As a sink: how many of each list the file handed on.
    carried: ListCounts,
    /// Records inserted since `tick` was last told.
    untold: u64,
    tick: &'t dyn Fn(u64),
    /// As a sink: the first insert that failed. The rest of the file is
    /// read for its verdict, and nothing more is inserted.
    failed: Option<rusqlite::Error>,
}

impl<'t> Carrier<'t> {
    /// The channel's row, and its dead-letter channel's.
    fn begin(
        tx: &'t Connection,
        c: &'t ChannelFile,
        tick: &'t dyn Fn(u64),
    ) -> rusqlite::Result<Carrier<'t>> {
        insert_channel_row(tx, &c.name, c.kind, c.next, c.floor, 0)?;
        // In the same transaction as its queue: a move between them is never
        // recorded by half.
        let dead_letter = match c.kind {
            ChannelKind::Queue => Some(dead_letter_row(tx, c)?),
            ChannelKind::Append | ChannelKind::Latest => None,
        };
        Ok(Carrier {
            tx,
            channel: c,
            dead_letter,
            records: record_insert(tx)?,
            values: latest_insert(tx)?,
            items: item_insert(tx)?,
            bytes: 0,
            dead_letter_bytes: 0,
            carried: ListCounts::default(),
            untold: 0,
            tick,
            failed: None,
        })
    }

    /// One record of the channel's `list`.
    fn insert(&mut self, list: RecordList, r: &Record) -> rusqlite::Result<()> {
        let name = self.channel.name.as_str();
        match (list, self.channel.kind, &self.dead_letter) {
            (RecordList::ChannelRecords, ChannelKind::Latest, _) => {
                insert_value(&mut self.values, name, r, true)?;
            }
            (RecordList::ChannelRecords, _, _) => {
                self.bytes += insert_record(&mut self.records, name, r)?;
            }
            (RecordList::DeadLetterRecords, _, Some(dlq)) => {
                self.dead_letter_bytes += insert_record(&mut self.records, dlq, r)?;
            }
            // No other list is in a channel that decodes.
            _ => {}
        }
        self.told();
        Ok(())
    }

    /// One item of a queue.
    fn insert_item(&mut self, item: &QueueItem) -> rusqlite::Result<()> {
        insert_item(&mut self.items, &self.channel.name, item)?;
        self.told();
        Ok(())
    }

    fn told(&mut self) {
        self.untold += 1;
        if self.untold == 4096 {
            (self.tick)(4096);
            self.untold = 0;
        }
    }

    /// What the channel holds beside its record lists, once they are in:
    /// the byte counts, positions and held publishes.
    fn finish(self) -> rusqlite::Result<()> {
        (self.tick)(self.untold);
        if self.channel.kind == ChannelKind::Append {
            set_bytes(self.tx, &self.channel.name, self.bytes)?;
        }
        if let Some(dlq) = &self.dead_letter {
            set_bytes(self.tx, dlq, self.dead_letter_bytes)?;
        }
        let (tx, c) = (self.tx, self.channel);
        if let Some(d) = &c.dead_letter {
            insert_positions(tx, &dead_letter_name(&c.name), &d.positions)?;
        }
        insert_positions(tx, &c.name, &c.positions)?;
        insert_held(tx, &c.name, &c.held)
    }

    /// Keeps the first failure, as a sink must: it cannot return it.
    fn keep_failure(&mut self, inserted: rusqlite::Result<()>) {
        if let Err(e) = inserted {
            self.failed.get_or_insert(e);
        }
    }
}

impl RecordSink for Carrier<'_> {
    fn capacity(&mut self, _: RecordList, _: usize) -> usize {
        0
    }

    // Counted whether inserted or not: the file's verdict and its counts
    // decide what is said of a file whose insert failed.
    fn record(&mut self, list: RecordList, record: Record, _: &mut Vec<Record>) {
        match list {
            RecordList::ChannelRecords => self.carried.records += 1,
            RecordList::DeadLetterRecords => self.carried.dead_letter += 1,
            _ => {}
        }
        if self.failed.is_none() {
            let inserted = self.insert(list, &record);
            self.keep_failure(inserted);
        }
    }

    fn item(&mut self, item: QueueItem, _: &mut Vec<QueueItem>) {
        self.carried.items += 1;
        if self.failed.is_none() {
            let inserted = self.insert_item(&item);
            self.keep_failure(inserted);
        }
    }
}

impl LoadSink for Carrier<'_> {
    fn file_read(&mut self, _: &str, _: bool) {}
}

/// A queue's dead-letter channel's row (before any of its records): its
/// name.
fn dead_letter_row(tx: &Connection, c: &ChannelFile) -> rusqlite::Result<String> {
    let dlq = dead_letter_name(&c.name);
    let (next, floor) = c.dead_letter.as_ref().map_or((1, 1), |d| (d.next, d.floor));
    insert_channel_row(tx, &dlq, ChannelKind::Append, next, floor, 0)?;
    Ok(dlq)
}

/// The stored byte count of an append channel: what its records count for,
/// as the provider keeps it (a removal gives back exactly that).
fn set_bytes(tx: &Connection, channel: &str, bytes: u64) -> rusqlite::Result<()> {
    tx.prepare_cached("UPDATE channels SET bytes = ?2 WHERE name = ?1")?
        .execute(params![channel, bytes])?;
    Ok(())
}

/// The statement that inserts one queue item.
fn item_insert(tx: &Connection) -> rusqlite::Result<CachedStatement<'_>> {
    tx.prepare_cached(&format!(
        "INSERT INTO queue_items (channel, offset, {RECORD_COLUMNS}, attempts, first_delivered, last_delivered)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"
    ))
}

fn insert_item(
    stmt: &mut CachedStatement<'_>,
    channel: &str,
    item: &QueueItem,
) -> rusqlite::Result<()> {
    let e = Encoded::new(&item.record);
    let mut p: Vec<&dyn ToSql> = vec![&channel, &item.record.offset];
    p.extend(e.params());
    p.push(&item.attempts);
    p.push(&item.first_delivered);
    p.push(&item.last_delivered);
    stmt.execute(&p[..])?;
    Ok(())
}

/// The statement that inserts one value of a latest channel.
fn latest_insert(tx: &Connection) -> rusqlite::Result<CachedStatement<'_>> {
    tx.prepare_cached(&format!(
        "INSERT INTO latest_values (channel, offset, deleted, {RECORD_COLUMNS})
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
    ))
}

/// Inserts the value `r` of `channel`; with `markers`, an empty payload is
/// a deletion marker (the retained store keeps none).
fn insert_value(
    stmt: &mut CachedStatement<'_>,
    channel: &str,
    r: &Record,
    markers: bool,
) -> rusqlite::Result<()> {
    let deleted = markers && r.payload.is_empty();
    let e = Encoded::new(r);
    let size = if deleted { 0 } else { e.size };
    let mut p: Vec<&dyn ToSql> = vec![&channel, &r.offset, &deleted];
    p.extend(bind_record(&e, &size));
    stmt.execute(&p[..])?;
    Ok(())
}

fn insert_latest(
    tx: &Connection,
    channel: &str,
    records: &[Record],
    markers: bool,
    tick: &dyn Fn(u64),
) -> rusqlite::Result<()> {
    let mut stmt = latest_insert(tx)?;
    for r in records {
        insert_value(&mut stmt, channel, r, markers)?;
    }
    tick(records.len() as u64);
    Ok(())
}

/// The retained store's offsets only order its values: kept when they can
/// (nonzero, no two alike; saguin writes the store in topic order, so they
/// need not ascend), numbered afresh in file order when they cannot, as the
/// memory provider's loader numbers them.
pub fn retained_offsets(records: &[Record]) -> Vec<Record> {
    let mut offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
    offsets.sort_unstable();
    let kept = offsets.first().is_none_or(|&lowest| lowest > 0)
        && offsets.windows(2).all(|w| w.first() < w.get(1));
    records
        .iter()
        .enumerate()
        .map(|(i, r)| Record {
            offset: if kept { r.offset } else { i as u64 + 1 },
            ..r.clone()
        })
        .collect()
}

fn write_retained(tx: &Connection, r: &RetainedFile, tick: &dyn Fn(u64)) -> rusqlite::Result<()> {
    let records = retained_offsets(&r.records);
    let next = records.iter().map(|r| r.offset + 1).max().unwrap_or(1);
    insert_channel_row(tx, RETAINED_STORE_NAME, ChannelKind::Latest, next, 1, 0)?;
    insert_latest(tx, RETAINED_STORE_NAME, &records, false, tick)
}

fn write_sessions(
    tx: &Connection,
    sessions: &SessionsFile,
    log: &BroadcastFile,
    tick: &dyn Fn(u64),
) -> rusqlite::Result<()> {
    insert_channel_row(tx, LOG, ChannelKind::Append, log.next, log.floor, 0)?;
    let bytes = insert_records(tx, LOG, &log.messages, tick)?;
    tx.prepare_cached("UPDATE channels SET bytes = ?2 WHERE name = ?1")?
        .execute(params![LOG, bytes])?;
    // Cursors carry no expiry: they live as long as their session.
    let cursors: Vec<Position> = log
        .cursors
        .iter()
        .map(|p| Position {
            session_expiry: None,
            ..p.clone()
        })
        .collect();
    insert_positions(tx, LOG, &cursors)?;
    insert_held(tx, LOG, &log.held)?;
    for s in &sessions.sessions {
        write_session(tx, s)?;
    }
    tick(sessions.sessions.len() as u64);
    let mut group_stmt = tx.prepare_cached(
        "INSERT INTO share_groups (group_name, filter, cursor) VALUES (?1, ?2, ?3)",
    )?;
    let mut returned_stmt = tx.prepare_cached(
        "INSERT INTO share_returned (group_name, filter, log_offset) VALUES (?1, ?2, ?3)",
    )?;
    for g in &sessions.shared_groups {
        group_stmt.execute(params![g.key.group, g.key.filter, g.cursor])?;
        for o in &g.returned {
            returned_stmt.execute(params![g.key.group, g.key.filter, o])?;
        }
    }
    Ok(())
}

fn count(conn: &Connection, sql: &str, args: &[&dyn ToSql]) -> rusqlite::Result<u64> {
    conn.prepare_cached(sql)?
        .query_row(args, |r| r.get::<_, i64>(0))
        .map(|n| n.max(0) as u64)
}

fn counters(conn: &Connection, name: &str) -> rusqlite::Result<(u64, u64)> {
    Ok(conn
        .prepare_cached("SELECT next, floor FROM channels WHERE name = ?1")?
        .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((0, 0)))
}

/// What the database holds of `unit` (the same rules as [`Unit::counts`]),
/// counted by SQL: the counts in from a source database, the counts out
/// from a destination one.
pub fn count_unit(conn: &Connection, unit: &Unit) -> rusqlite::Result<Counts> {
    const RECORDS: &str = "SELECT count(*) FROM records WHERE channel = ?1";
    const POSITIONS: &str = "SELECT count(*) FROM positions WHERE channel = ?1";
    const HELD: &str = "SELECT count(*) FROM held_publishes WHERE channel = ?1";
    Ok(match unit {
        Unit::Channel(c) | Unit::ChannelInFile { channel: c, .. } => {
            let name = c.name.as_str();
            let (next, floor) = counters(conn, name)?;
            let mut n = Counts {
                next,
                floor,
                positions: count(conn, POSITIONS, &[&name])?,
                held: count(conn, HELD, &[&name])?,
                ..Counts::default()
            };
            match c.kind {
                ChannelKind::Append => n.records = count(conn, RECORDS, &[&name])?,
                ChannelKind::Latest => {
                    n.records = count(
                        conn,
                        "SELECT count(*) FROM latest_values WHERE channel = ?1",
                        &[&name],
                    )?
                }
                ChannelKind::Queue => {
                    n.queue_items = count(
                        conn,
                        "SELECT count(*) FROM queue_items WHERE channel = ?1",
                        &[&name],
                    )?;
                    let dlq = dead_letter_name(name);
                    n.dead_letters = count(conn, RECORDS, &[&dlq])?;
                    n.positions += count(conn, POSITIONS, &[&dlq])?;
                    (n.dead_letter_next, n.dead_letter_floor) = counters(conn, &dlq)?;
                }
            }
            n
        }
        Unit::Retained(_) => Counts {
            records: count(
                conn,
                "SELECT count(*) FROM latest_values WHERE channel = ?1 AND deleted = 0",
                &[&RETAINED_STORE_NAME],
            )?,
            ..Counts::default()
        },
        Unit::Sessions { .. } => {
            let (next, floor) = counters(conn, LOG)?;
            Counts {
                next,
                floor,
                records: count(conn, RECORDS, &[&LOG])?,
                positions: count(conn, POSITIONS, &[&LOG])?,
                held: count(conn, HELD, &[&LOG])?,
                sessions: count(conn, "SELECT count(*) FROM sessions", &[])?,
                inflight: count(conn, "SELECT count(*) FROM session_inflight", &[])?,
                shared_groups: count(conn, "SELECT count(*) FROM share_groups", &[])?,
                returned: count(conn, "SELECT count(*) FROM share_returned", &[])?,
                ..Counts::default()
            }
        }
    })
}
