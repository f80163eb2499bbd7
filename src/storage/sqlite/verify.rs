//! The checks `saguin sqlite verify` runs, and that `migrate` and `sqlite
//! backup` run before trusting a database: `PRAGMA integrity_check`, the
//! schema version and tables, then the invariants (`format/FORMAT.md` §7) the
//! rows themselves keep.
//!
//! A page-level check proves the b-trees are whole, not that the rows
//! agree with each other: a stray `DELETE`, a flipped bit in an integer or a
//! hand edit passes `integrity_check` and still leaves a channel that
//! reissues offsets or a byte count that lies. The row invariants:
//!
//! - every channel: `floor <= next`, every stored offset `< next` and (but
//!   for the broadcast log's positions and a latest channel's values, which
//!   stay current below a floor its retention raised) every record's
//!   `>= floor`;
//! - append channels (dead-letter channels included): records contiguous in
//!   `[floor, next)` - the channel is removed from the front only, so a hole
//!   is what a stray `DELETE` makes (invariant 1); the broadcast log alone
//!   may have gaps (a message leaves once nobody owes it);
//! - append channels: `bytes` equal to the sum of their records'
//!   [`Record::accounted_size`], the function the stores count by (never
//!   computed in SQL); every record row's stored `size` equal to it too;
//! - positions not past `next`; rows of a table keyed by channel whose
//!   channel has no `channels` row;
//! - a queue has its append dead-letter channel `<queue>.dlq`;
//! - sessions: every broadcast-log cursor's session present; the in-flight
//!   table within the session's window and every entry's session present, its log offset below the log's `next`, its
//!   shared group present; shared groups' cursors at most `next`, returned
//!   offsets below it.
//!
//! Rows are read one at a time (never collected by an untrusted count), and
//! at most [`MAX_FINDINGS`] findings are kept, the rest counted.

use std::collections::{BTreeMap, BTreeSet};

use super::units::ChannelRow;
use rusqlite::{Connection, OptionalExtension};
use saguin_format::model::Record;

use super::row::record_at;
use super::schema::{RECORD_COLUMNS, SCHEMA_VERSION, TABLES};
use super::session::{subscriptions_from_json, will_from_json};
use crate::storage::contract::{dead_letter_name, BROADCAST_LOG_NAME};

/// Findings kept in full; beyond this they are only counted.
pub const MAX_FINDINGS: usize = 1000;

/// One thing wrong, naming the table, and the channel and offset where
/// there is one.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// A kebab-case code a script can match.
    pub code: &'static str,
    pub table: &'static str,
    /// `null` in JSON where the finding is about no one channel.
    pub channel: Option<String>,
    /// `null` in JSON where the finding is about no one offset.
    pub offset: Option<u64>,
    pub detail: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.table)?;
        if let Some(c) = &self.channel {
            write!(f, ": channel {c:?}")?;
        }
        if let Some(o) = self.offset {
            write!(f, ": offset {o}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// What was looked at, for the summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Checked {
    pub channels: u64,
    pub records: u64,
    pub positions: u64,
    pub sessions: u64,
    pub inflight: u64,
    pub shared_groups: u64,
}

/// The outcome of [`verify`]: no findings means the database passed.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Verification {
    pub integrity_check: String,
    pub schema_version: Option<i64>,
    pub checked: Checked,
    pub findings: Vec<Finding>,
    /// Findings past [`MAX_FINDINGS`], counted and not kept.
    pub findings_omitted: u64,
}

impl Verification {
    pub fn is_ok(&self) -> bool {
        self.findings.is_empty() && self.findings_omitted == 0
    }

    /// Every finding as one line each, and the count of those left out.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.findings.iter().map(ToString::to_string).collect();
        if self.findings_omitted > 0 {
            out.push(format!("... and {} more findings", self.findings_omitted));
        }
        out
    }

    fn add(
        &mut self,
        code: &'static str,
        table: &'static str,
        channel: Option<&str>,
        offset: Option<u64>,
        detail: String,
    ) {
        if self.findings.len() >= MAX_FINDINGS {
            self.findings_omitted += 1;
            return;
        }
        self.findings.push(Finding {
            code,
            table,
            channel: channel.map(str::to_owned),
            offset,
            detail,
        });
    }

    /// A query that failed (a damaged page, a value of the wrong type) is a
    /// finding of its table, not the end of the check.
    fn unreadable(&mut self, table: &'static str, channel: Option<&str>, e: rusqlite::Error) {
        self.add(
            "unreadable",
            table,
            channel,
            None,
            format!("cannot be read: {e}"),
        );
    }
}

/// Runs every check on `conn`'s database, inside the caller's read
/// transaction when there is one (so every check sees one moment). Never
/// writes.
pub fn verify(conn: &Connection) -> Verification {
    let mut v = Verification::default();
    integrity(conn, &mut v);
    if !schema(conn, &mut v) {
        return v;
    }
    let channels = match channel_rows(conn) {
        Ok(c) => c,
        Err(e) => {
            v.unreadable("channels", None, e);
            return v;
        }
    };
    v.checked.channels = channels.len() as u64;
    for row in channels.values() {
        check_channel(conn, row, &channels, &mut v);
    }
    for (table, what) in [
        ("records", "records"),
        ("latest_values", "values"),
        ("queue_items", "queue items"),
        ("positions", "positions"),
        ("held_publishes", "held publishes"),
    ] {
        orphans(conn, table, what, &mut v);
    }
    check_sessions(conn, channels.get(BROADCAST_LOG_NAME), &mut v);
    v
}

fn integrity(conn: &Connection, v: &mut Verification) {
    let lines = conn
        .prepare("PRAGMA integrity_check(100)")
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()
        });
    match lines {
        Ok(lines) if lines == ["ok"] => v.integrity_check = "ok".into(),
        Ok(lines) => {
            v.integrity_check = lines.join("; ");
            for line in lines {
                v.add("integrity", "database", None, None, line);
            }
        }
        Err(e) => {
            v.integrity_check = e.to_string();
            v.add(
                "integrity",
                "database",
                None,
                None,
                format!("integrity_check could not run: {e}"),
            );
        }
    }
}

/// The schema version and tables; false when the rows cannot be checked.
fn schema(conn: &Connection, v: &mut Verification) -> bool {
    match conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)) {
        Ok(version) => {
            v.schema_version = Some(version);
            if version != SCHEMA_VERSION {
                v.add(
                    "schema-version",
                    "database",
                    None,
                    None,
                    format!("schema version {version}; this build reads {SCHEMA_VERSION}"),
                );
                return false;
            }
        }
        Err(e) => {
            v.unreadable("database", None, e);
            return false;
        }
    }
    let mut whole = true;
    for table in TABLES {
        let found = conn
            .query_row(
                "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get::<_, i64>(0),
            )
            .optional();
        match found {
            Ok(Some(_)) => {}
            Ok(None) => {
                whole = false;
                v.add(
                    "missing-table",
                    table,
                    None,
                    None,
                    "the table is missing".into(),
                );
            }
            Err(e) => {
                whole = false;
                v.unreadable(table, None, e);
            }
        }
    }
    if whole {
        match conn
            .query_row("SELECT schema_version FROM meta WHERE id = 1", [], |r| {
                r.get::<_, i64>(0)
            })
            .optional()
        {
            Ok(Some(SCHEMA_VERSION)) => {}
            Ok(Some(other)) => v.add(
                "schema-version",
                "meta",
                None,
                None,
                format!("the meta row states schema version {other}, the header {SCHEMA_VERSION}"),
            ),
            Ok(None) => v.add("missing-meta", "meta", None, None, "no meta row".into()),
            Err(e) => v.unreadable("meta", None, e),
        }
    }
    whole
}

fn channel_rows(conn: &Connection) -> rusqlite::Result<BTreeMap<String, ChannelRow>> {
    Ok(super::units::channel_rows(conn)?
        .into_iter()
        .map(|row| (row.name.clone(), row))
        .collect())
}

fn check_channel(
    conn: &Connection,
    row: &ChannelRow,
    all: &BTreeMap<String, ChannelRow>,
    v: &mut Verification,
) {
    let name = row.name.as_str();
    if row.floor < 1 || row.floor > row.next {
        v.add(
            "counters",
            "channels",
            Some(name),
            None,
            format!(
                "floor {} is not within 1..=next (next {})",
                row.floor, row.next
            ),
        );
    }
    match row.kind.as_str() {
        "append" => {
            let contiguous = name != BROADCAST_LOG_NAME;
            let sum = records(conn, "records", row, contiguous, v);
            if let Some(sum) = sum {
                if sum != row.bytes {
                    v.add(
                        "bytes",
                        "channels",
                        Some(name),
                        None,
                        format!(
                            "bytes is {}, and its records' sizes add up to {sum}",
                            row.bytes
                        ),
                    );
                }
            }
        }
        "latest" => {
            records(conn, "latest_values", row, false, v);
        }
        "queue" => {
            records(conn, "queue_items", row, false, v);
            let dlq = dead_letter_name(name);
            match all.get(&dlq) {
                None => v.add(
                    "dead-letter-missing",
                    "channels",
                    Some(name),
                    None,
                    format!("the queue has no row for its dead-letter channel {dlq:?}"),
                ),
                Some(d) if d.kind != "append" => v.add(
                    "dead-letter-kind",
                    "channels",
                    Some(&dlq),
                    None,
                    format!(
                        "the dead-letter channel is stored as {}, not append",
                        d.kind
                    ),
                ),
                Some(_) => {}
            }
        }
        other => v.add(
            "kind",
            "channels",
            Some(name),
            None,
            format!("kind {other:?} is not append, latest or queue"),
        ),
    }
    positions(conn, row, v);
    held(conn, row, v);
}

/// Checks one channel's rows of `table`; for an append table, the sum of
/// the records' accounted sizes (`None` when a row could not be read).
fn records(
    conn: &Connection,
    table: &'static str,
    row: &ChannelRow,
    contiguous: bool,
    v: &mut Verification,
) -> Option<u64> {
    let name = row.name.as_str();
    let deleted = if table == "latest_values" {
        "deleted"
    } else {
        "0"
    };
    let sql = format!(
        "SELECT offset, {RECORD_COLUMNS}, {deleted} FROM {table} WHERE channel = ?1 ORDER BY offset"
    );
    let result = (|| {
        let mut stmt = conn.prepare(&sql)?;
        let mut rows = stmt.query([name])?;
        let mut sum = 0u64;
        let mut whole = true;
        let mut expected = row.floor;
        while let Some(r) = rows.next()? {
            let offset: u64 = r.get(0)?;
            v.checked.records += 1;
            if offset >= row.next {
                v.add(
                    "offset-not-below-next",
                    table,
                    Some(name),
                    Some(offset),
                    format!(
                        "the channel's next is {}: the offset would be reissued",
                        row.next
                    ),
                );
            }
            let is_deleted: bool = r.get(14)?;
            // A latest channel's value stays current below a floor its
            // retention raised; its deletion markers are held at or above it.
            let held_below_floor = table == "latest_values" && !is_deleted && offset >= 1;
            if offset < row.floor && !held_below_floor {
                v.add(
                    "offset-below-floor",
                    table,
                    Some(name),
                    Some(offset),
                    format!("below the channel's floor {}", row.floor),
                );
            }
            if contiguous && offset > expected {
                v.add(
                    "hole",
                    table,
                    Some(name),
                    Some(expected),
                    saguin_format::f21::hole(expected, offset - 1, row.floor, row.next),
                );
            }
            expected = offset.saturating_add(1);
            match record_at(r, 1, offset) {
                Ok(record) => {
                    let size = Record::accounted_size(&record);
                    let stored: u64 = r.get(13)?;
                    if !is_deleted && stored != size {
                        v.add(
                            "size",
                            table,
                            Some(name),
                            Some(offset),
                            format!("size is stored as {stored}; the record counts {size}"),
                        );
                    }
                    sum += size;
                }
                Err(e) => {
                    whole = false;
                    v.add(
                        "undecodable",
                        table,
                        Some(name),
                        Some(offset),
                        format!("the row does not decode: {e}"),
                    );
                }
            }
        }
        if contiguous && expected < row.next && expected >= row.floor {
            v.add(
                "hole",
                table,
                Some(name),
                Some(expected),
                saguin_format::f21::hole(expected, row.next - 1, row.floor, row.next),
            );
        }
        Ok::<_, rusqlite::Error>(whole.then_some(sum))
    })();
    match result {
        Ok(sum) => sum,
        Err(e) => {
            v.unreadable(table, Some(name), e);
            None
        }
    }
}

fn positions(conn: &Connection, row: &ChannelRow, v: &mut Verification) {
    let name = row.name.as_str();
    let result = (|| {
        let mut stmt = conn.prepare_cached(
            "SELECT reader, offset FROM positions WHERE channel = ?1 ORDER BY reader",
        )?;
        let mut rows = stmt.query([name])?;
        while let Some(r) = rows.next()? {
            let reader: String = r.get(0)?;
            let offset: u64 = r.get(1)?;
            v.checked.positions += 1;
            if offset > row.next {
                v.add(
                    "position-past-next",
                    "positions",
                    Some(name),
                    Some(offset),
                    format!("reader {reader:?} is past the channel's next {}", row.next),
                );
            }
        }
        Ok::<_, rusqlite::Error>(())
    })();
    if let Err(e) = result {
        v.unreadable("positions", Some(name), e);
    }
}

fn held(conn: &Connection, row: &ChannelRow, v: &mut Verification) {
    let name = row.name.as_str();
    let result = (|| {
        let mut stmt = conn.prepare_cached(
            "SELECT holder_client_id, packet_id FROM held_publishes WHERE channel = ?1",
        )?;
        let mut rows = stmt.query([name])?;
        while let Some(r) = rows.next()? {
            let client: String = r.get(0)?;
            let packet_id: i64 = r.get(1)?;
            if client.is_empty() || !(1..=65535).contains(&packet_id) {
                v.add(
                    "held",
                    "held_publishes",
                    Some(name),
                    None,
                    format!("holder {client:?} packet id {packet_id}: a holder is nonempty and a packet id 1..=65535"),
                );
            }
        }
        Ok::<_, rusqlite::Error>(())
    })();
    if let Err(e) = result {
        v.unreadable("held_publishes", Some(name), e);
    }
}

/// Rows of `table` whose channel has no `channels` row: what a deleted
/// channel row leaves behind, carried by nobody.
fn orphans(conn: &Connection, table: &'static str, what: &str, v: &mut Verification) {
    let sql = format!(
        "SELECT channel, count(*) FROM {table} WHERE channel NOT IN (SELECT name FROM channels)
         GROUP BY channel ORDER BY channel"
    );
    let result = (|| {
        let mut stmt = conn.prepare(&sql)?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let channel: String = r.get(0)?;
            let n: i64 = r.get(1)?;
            v.add(
                "orphan-rows",
                table,
                Some(&channel),
                None,
                format!("{n} {what} of a channel that has no channels row"),
            );
        }
        Ok::<_, rusqlite::Error>(())
    })();
    if let Err(e) = result {
        v.unreadable(table, None, e);
    }
}

fn check_sessions(conn: &Connection, log: Option<&ChannelRow>, v: &mut Verification) {
    // With no log row the log is empty: nothing may point into it.
    let log_next = log.map_or(1, |l| l.next);
    let result = (|| {
        let mut windows: BTreeMap<String, u16> = BTreeMap::new();
        {
            let mut stmt = conn.prepare(
                "SELECT client_id, window, subscriptions, will FROM sessions ORDER BY client_id",
            )?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let client: String = r.get(0)?;
                let window: i64 = r.get(1)?;
                let subs: String = r.get(2)?;
                let will: Option<String> = r.get(3)?;
                v.checked.sessions += 1;
                if client.is_empty() {
                    v.add(
                        "session",
                        "sessions",
                        None,
                        None,
                        "a session with an empty client id".into(),
                    );
                }
                let window = match u16::try_from(window) {
                    Ok(w) if w >= 1 => w,
                    _ => {
                        v.add(
                            "session",
                            "sessions",
                            None,
                            None,
                            format!("session {client:?}: window {window} is not 1..=65535"),
                        );
                        u16::MAX
                    }
                };
                match subscriptions_from_json(&subs) {
                    Ok(list) => {
                        for s in list.iter().filter(|s| s.log_offset > log_next) {
                            v.add(
                                "session",
                                "sessions",
                                None,
                                Some(s.log_offset),
                                format!(
                                    "session {client:?}: subscription {:?} is past the broadcast log's next {log_next}",
                                    s.filter
                                ),
                            );
                        }
                    }
                    Err(e) => v.add(
                        "undecodable",
                        "sessions",
                        None,
                        None,
                        format!("session {client:?}: subscriptions: {e}"),
                    ),
                }
                if let Some(text) = will {
                    if let Err(e) = will_from_json(&text) {
                        v.add(
                            "undecodable",
                            "sessions",
                            None,
                            None,
                            format!("session {client:?}: will: {e}"),
                        );
                    }
                }
                windows.insert(client, window);
            }
        }
        let mut groups: BTreeSet<(String, String)> = BTreeSet::new();
        {
            let mut stmt = conn.prepare("SELECT group_name, filter, cursor FROM share_groups")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let group: String = r.get(0)?;
                let filter: String = r.get(1)?;
                let cursor: u64 = r.get(2)?;
                v.checked.shared_groups += 1;
                if cursor > log_next {
                    v.add(
                        "group-past-next",
                        "share_groups",
                        Some(BROADCAST_LOG_NAME),
                        Some(cursor),
                        format!("shared group {group:?} {filter:?}: the cursor is past the log's next {log_next}"),
                    );
                }
                groups.insert((group, filter));
            }
        }
        {
            let mut stmt =
                conn.prepare("SELECT group_name, filter, log_offset FROM share_returned")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let group: String = r.get(0)?;
                let filter: String = r.get(1)?;
                let offset: u64 = r.get(2)?;
                if offset >= log_next {
                    v.add(
                        "returned-not-below-next",
                        "share_returned",
                        Some(BROADCAST_LOG_NAME),
                        Some(offset),
                        format!("shared group {group:?} {filter:?}: a returned delivery at or past the log's next {log_next}"),
                    );
                }
                if !groups.contains(&(group.clone(), filter.clone())) {
                    v.add(
                        "orphan-rows",
                        "share_returned",
                        Some(BROADCAST_LOG_NAME),
                        Some(offset),
                        format!("returned delivery of shared group {group:?} {filter:?}, which has no share_groups row"),
                    );
                }
            }
        }
        {
            // A session's ending takes its cursor in the same transaction:
            // a cursor without its session is what renaming one leaves.
            let mut stmt =
                conn.prepare("SELECT reader, offset FROM positions WHERE channel = ?1")?;
            let mut rows = stmt.query([BROADCAST_LOG_NAME])?;
            while let Some(r) = rows.next()? {
                let reader: String = r.get(0)?;
                let offset: u64 = r.get(1)?;
                let client = reader.strip_prefix("mqtt:");
                if !client.is_some_and(|c| windows.contains_key(c)) {
                    v.add(
                        "orphan-rows",
                        "positions",
                        Some(BROADCAST_LOG_NAME),
                        Some(offset),
                        format!("cursor {reader:?} has no session"),
                    );
                }
            }
        }
        let mut stmt = conn.prepare(
            "SELECT client_id, log_offset, packet_id, qos, phase, share_group, share_filter
             FROM session_inflight ORDER BY client_id, seq",
        )?;
        let mut rows = stmt.query([])?;
        let mut current: Option<(String, u64)> = None;
        while let Some(r) = rows.next()? {
            let client: String = r.get(0)?;
            let offset: u64 = r.get(1)?;
            let packet_id: i64 = r.get(2)?;
            let qos: i64 = r.get(3)?;
            let phase: String = r.get(4)?;
            let group: Option<String> = r.get(5)?;
            let filter: Option<String> = r.get(6)?;
            v.checked.inflight += 1;
            let n = match &mut current {
                Some((c, n)) if *c == client => {
                    *n += 1;
                    *n
                }
                _ => {
                    current = Some((client.clone(), 1));
                    1
                }
            };
            let at = Some(offset);
            let log = Some(BROADCAST_LOG_NAME);
            match windows.get(&client) {
                None => {
                    if n == 1 {
                        v.add(
                            "orphan-rows",
                            "session_inflight",
                            log,
                            at,
                            format!(
                                "in-flight entries of client {client:?}, which has no sessions row"
                            ),
                        );
                    }
                }
                Some(window) if n == u64::from(*window) + 1 => v.add(
                    "inflight-over-window",
                    "session_inflight",
                    log,
                    at,
                    format!(
                        "session {client:?} holds more in-flight entries than its window {window}"
                    ),
                ),
                Some(_) => {}
            }
            if offset >= log_next {
                v.add(
                    "inflight-not-below-next",
                    "session_inflight",
                    log,
                    at,
                    format!("session {client:?}: at or past the broadcast log's next {log_next}"),
                );
            }
            let phase_ok = phase == "awaiting_ack" || (phase == "awaiting_comp" && qos == 2);
            if !(1..=65535).contains(&packet_id) || !(1..=2).contains(&qos) || !phase_ok {
                v.add(
                    "inflight",
                    "session_inflight",
                    log,
                    at,
                    format!("session {client:?}: packet id {packet_id}, qos {qos}, phase {phase}: a packet id is 1..=65535, qos 1 or 2, awaiting_comp only at qos 2"),
                );
            }
            match (group, filter) {
                (None, None) => {}
                (Some(g), Some(f)) if groups.contains(&(g.clone(), f.clone())) => {}
                (g, f) => v.add(
                    "inflight",
                    "session_inflight",
                    log,
                    at,
                    format!("session {client:?}: shared group {g:?} {f:?} has no share_groups row"),
                ),
            }
        }
        Ok::<_, rusqlite::Error>(())
    })();
    if let Err(e) = result {
        v.unreadable("sessions", None, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::apply_or_check(
            &mut conn,
            std::path::Path::new(":memory:"),
            "test",
            0,
        )
        .unwrap();
        conn
    }

    fn append(conn: &Connection, name: &str, offsets: &[u64], next: u64, floor: u64) {
        let mut bytes = 0;
        for o in offsets {
            let r = Record::new("t", &b"12345"[..]);
            let e = super::super::row::Encoded::new(&r);
            bytes += e.size;
            let mut p: Vec<&dyn rusqlite::ToSql> = vec![&name, o];
            p.extend(e.params());
            conn.execute(
                &format!("INSERT INTO records (channel, offset, {RECORD_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"),
                &p[..],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO channels (name, kind, next, floor, bytes) VALUES (?1, 'append', ?2, ?3, ?4)",
            rusqlite::params![name, next, floor, bytes],
        )
        .unwrap();
    }

    fn codes(v: &Verification) -> Vec<&'static str> {
        v.findings.iter().map(|f| f.code).collect()
    }

    #[test]
    fn a_consistent_database_passes() {
        let conn = db();
        append(&conn, "a", &[3, 4, 5], 6, 3);
        let v = verify(&conn);
        assert!(v.is_ok(), "{:?}", v.lines());
        assert_eq!(v.checked.records, 3);
    }

    #[test]
    fn a_hole_a_reissued_offset_and_a_lying_byte_count_are_named() {
        let conn = db();
        append(&conn, "a", &[3, 5], 6, 3);
        append(&conn, "b", &[1, 2], 2, 1);
        conn.execute("UPDATE channels SET bytes = 1 WHERE name = 'a'", [])
            .unwrap();
        let v = verify(&conn);
        let lines = v.lines().join("\n");
        assert!(codes(&v).contains(&"hole"), "{lines}");
        assert!(
            lines.contains("records: channel \"a\": offset 4"),
            "{lines}"
        );
        assert!(codes(&v).contains(&"bytes"), "{lines}");
        assert!(lines.contains("channel \"b\": offset 2"), "{lines}");
        assert!(codes(&v).contains(&"offset-not-below-next"), "{lines}");
    }

    #[test]
    fn the_broadcast_log_may_have_gaps_and_a_queue_needs_its_dead_letter_row() {
        let conn = db();
        append(&conn, BROADCAST_LOG_NAME, &[2, 7], 9, 2);
        conn.execute(
            "INSERT INTO channels (name, kind, next, floor, bytes) VALUES ('jobs', 'queue', 1, 1, 0)",
            [],
        )
        .unwrap();
        let v = verify(&conn);
        assert_eq!(codes(&v), vec!["dead-letter-missing"], "{:?}", v.lines());
    }

    #[test]
    fn rows_of_a_deleted_channel_and_inflight_entries_of_a_missing_session_are_named() {
        let conn = db();
        append(&conn, "gone", &[1, 2], 3, 1);
        conn.execute("DELETE FROM channels WHERE name = 'gone'", [])
            .unwrap();
        conn.execute(
            "INSERT INTO session_inflight (client_id, seq, log_offset, packet_id, qos, phase) VALUES ('x', 0, 0, 1, 1, 'awaiting_ack')",
            [],
        )
        .unwrap();
        let v = verify(&conn);
        let lines = v.lines().join("\n");
        assert!(
            lines.contains(
                "records: channel \"gone\": 2 records of a channel that has no channels row"
            ),
            "{lines}"
        );
        assert!(
            lines.contains("client \"x\", which has no sessions row"),
            "{lines}"
        );
    }

    #[test]
    fn findings_past_the_cap_are_counted_not_kept() {
        let mut v = Verification::default();
        for _ in 0..MAX_FINDINGS + 5 {
            v.add("x", "t", None, None, String::new());
        }
        assert_eq!(v.findings.len(), MAX_FINDINGS);
        assert_eq!(v.findings_omitted, 5);
        assert!(!v.is_ok());
    }
}
