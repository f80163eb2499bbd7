//! `saguin sqlite dump|backup|verify`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use rusqlite::Connection;
use saguin::storage::backup::{self, BackupError};
use saguin::storage::sqlite::row::record_at;
use saguin::storage::sqlite::schema::RECORD_COLUMNS;
use saguin::storage::sqlite::{self as provider, SqliteOpenError};
use serde_json::{json, Value};

use crate::exit;
use crate::output::{
    cell, extend_message_json, payload_cell, props_cell, session_json, table, time_json, time_text,
    RecordJson,
};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Show what a sqlite provider's database holds (read-only).
    #[command(long_about = DUMP_ABOUT, after_help = DUMP_EXAMPLES)]
    Dump(DumpArgs),
    /// Take an online, consistent, verified copy of a database.
    #[command(long_about = BACKUP_ABOUT, after_help = BACKUP_EXAMPLES)]
    Backup(BackupArgs),
    /// Check a database's pages and the invariants its rows keep (read-only).
    #[command(long_about = VERIFY_ABOUT, after_help = VERIFY_EXAMPLES)]
    Verify(VerifyArgs),
}

const VERIFY_ABOUT: &str = "\
Check a sqlite provider's database, read-only: the counterpart of snapshot verify.

Opened as sqlite dump opens it (read-only, query_only, never immutable=1, \
never created), and every check runs in one read transaction, so it is safe \
beside a running broker and sees one moment of it. The checks:

  - PRAGMA integrity_check answers ok;
  - the schema version is 20 and every table and the meta row are there;
  - per channel: floor within 1..=next; every record, value and queue item \
at an offset below next (one at or past next would be issued again) and not \
below the floor;
  - append channels and dead-letter channels: records contiguous in \
[floor, next) - a channel is removed from the front only, so a hole is what a \
stray DELETE makes; the broadcast log alone may have gaps;
  - append channels: bytes equal to the sum of the records' sizes, counted by \
the function the stores count by (Record::accounted_size), and each record \
row's stored size equal to its record's;
  - positions not past their channel's next; held publishes with a holder \
and a packet id 1..=65535; rows of a channel that has no channels row;
  - every queue has its append dead-letter channel <queue>.dlq;
  - sessions: subscriptions and Will decode; every broadcast-log cursor of \
a session that exists; in-flight entries within the \
session's window, of a session that exists, below the broadcast log's next, \
of a shared group that exists; shared groups' cursors not past next, \
returned deliveries below it.

Each finding is one line naming the table, the channel and the offset where \
there is one; at most 1000 are listed and the rest counted. --json prints one \
document: {\"path\", \"ok\", \"integrity_check\", \"schema_version\", \
\"checked\": {\"channels\", \"records\", \"positions\", \"sessions\", \"inflight\", \
\"shared_groups\"}, \"findings\": [{\"code\", \"table\", \"channel\", \"offset\", \
\"detail\"}] (channel and offset null where there is none), \"findings_omitted\", \
\"exit_code\"}. --quiet prints nothing; the \
exit status answers. saguin migrate and saguin sqlite backup run these same \
checks on what they read and write.

Exit status: 0 every check passed; 1 a check failed (each finding listed); 3 \
the database is missing or cannot be opened; 2 usage.";

const VERIFY_EXAMPLES: &str = "\
Examples:
  saguin sqlite verify /var/lib/saguin/saguin.db
  saguin sqlite backup /var/lib/saguin/saguin.db /backups/s.db && saguin sqlite verify --quiet /backups/s.db
  saguin sqlite verify /var/lib/saguin/saguin.db --json | jq '.findings[] | select(.code == \"hole\")'";

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    pub db: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print nothing; the exit code answers.
    #[arg(long, conflicts_with = "json")]
    pub quiet: bool,
}

const DUMP_ABOUT: &str = "\
Show what a sqlite provider's database holds, read-only.

The database is opened with SQLITE_OPEN_READ_ONLY and query_only, never with \
immutable=1: a running broker's commits since its last checkpoint are in the \
write-ahead log, and this reader sees them. It is safe beside a running \
broker and writes nothing. A database of another schema version is refused \
with the same sentence the broker refuses it with; a missing file is never \
created. Like any SQLite reader of a WAL database, it leaves an empty -wal \
and -shm beside a database that had none (a stopped broker's): they are \
SQLite's own, and the broker uses them as it finds them.

Without --channel it shows the channels (kind, next, floor, bytes, records), \
the durable consumers' positions, the persistent sessions, the queues' depths \
and attempts, and the held exactly-once publishes. With --channel it lists that \
channel's records from --from (default: its floor), at most --limit of them: \
offset, time (RFC 3339), topic, payload (quoted text when it is printable \
UTF-8, hex: otherwise, as snapshot inspect shows it), user properties and \
publish properties, with a progress bar on a terminal while they are read. \
In --json and --ndjson each record is RECORD, the one shape \
`saguin snapshot inspect --json` prints a record in (see \
saguin-snapshot-inspect(1)): {\"offset\", \"message_id\", \"time\", \
\"time_unix_nanos\", \"topic\", \"qos\", \"retain\", \"client_id\", \"bridge\", \
\"shared_copy\", \"owed_to\", \"payload_bytes\", \"payload_text\", \
\"payload_hex\", \"user_properties\", \"properties\"}, with \"deleted\" for a \
latest channel's rows and \"attempts\", \"first_delivered\", \
\"last_delivered\" for a queue's.

--json prints one JSON document; --ndjson prints one JSON object per line \
(each overview row carries \"type\"; each record is one line). Readers ignore \
fields they do not know; empty lists are []. The human overview is a summary; \
the JSON overview carries everything it counts, in full: each session's \
subscriptions with their options (\"subscription_list\"), its in-flight \
entries (\"inflight_list\") and its Will (\"will\", payload and properties) \
beside the counts, every held exactly-once publish (\"held_publish_list\", \
NDJSON type held_publish) and every shared group with its cursor and returned \
deliveries (\"share_group_list\", NDJSON type share_group). Sessions, \
subscriptions and Wills are shaped as in `saguin snapshot inspect --json`.

Exit status: 0 shown; 3 the database is missing, unreadable, of another \
schema version, or holds no such channel; 2 usage.";

const DUMP_EXAMPLES: &str = "\
Examples:
  saguin sqlite dump /var/lib/saguin/saguin.db
  saguin sqlite dump /var/lib/saguin/saguin.db --json | jq '.channels[] | {name, next, floor}'
  saguin sqlite dump /var/lib/saguin/saguin.db --channel telemetry --from 4500 --limit 20
  saguin sqlite dump /var/lib/saguin/saguin.db --channel telemetry --ndjson | wc -l";

const BACKUP_ABOUT: &str = "\
Take an online, consistent, verified copy of a sqlite provider's database while \
a broker writes to it.

cp is not a backup of a running broker: the committed data is split between \
the database and its write-ahead log, and two copies of a pair being written \
are not one moment. This command uses SQLite's online backup from a read-only \
connection holding one read transaction, so every page of the copy is from \
one moment while the broker keeps committing. It writes to a temporary name \
in DEST's directory (mode 0600), proves the copy - PRAGMA integrity_check \
answers ok, the schema version is 20, the row invariants sqlite verify checks \
hold, and every table holds exactly the rows the source held at the moment \
copied (counted inside that same read \
transaction) - fsyncs it, moves it to DEST without replacing anything, and \
fsyncs the directory. Only then does it report success. The copy is a single \
file in rollback-journal mode; the broker opens it in WAL mode as usual.

DEST, and DEST-wal, DEST-shm and DEST-journal, must not exist. A failure \
removes the temporary file and leaves nothing at DEST. A progress bar is shown \
when stderr is a terminal; a summary line (tables, rows, bytes, MB/s) is \
printed either way.

Exit status: 0 copied and proved; 1 the copy was made and did not prove \
itself (removed); 3 could not copy (DEST or a sidecar exists, the source is \
missing or of another schema version, I/O); 2 usage.";

const BACKUP_EXAMPLES: &str = "\
Examples:
  saguin sqlite backup /var/lib/saguin/saguin.db /backups/saguin-$(date +%F).db
  saguin sqlite backup /var/lib/saguin/saguin.db /mnt/usb/saguin.db && echo verified";

#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    pub db: PathBuf,
    /// One JSON document on stdout.
    #[arg(long, conflicts_with = "ndjson")]
    pub json: bool,
    /// One JSON object per line on stdout.
    #[arg(long)]
    pub ndjson: bool,
    /// List this channel's records.
    #[arg(long, value_name = "NAME")]
    pub channel: Option<String>,
    /// First offset to list (default: the channel's floor).
    #[arg(long, value_name = "OFFSET", requires = "channel")]
    pub from: Option<u64>,
    /// At most this many records.
    #[arg(long, value_name = "N", requires = "channel")]
    pub limit: Option<u64>,
}

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    pub db: PathBuf,
    pub dest: PathBuf,
}

pub fn run(cmd: Command) -> anyhow::Result<u8> {
    match cmd {
        Command::Dump(args) => dump(&args),
        Command::Backup(args) => run_backup(&args),
        Command::Verify(args) => run_verify(&args),
    }
}

fn run_verify(args: &VerifyArgs) -> anyhow::Result<u8> {
    let conn = match open(&args.db) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let what = || format!("sqlite verify {}", args.db.display());
    let tx = conn.unchecked_transaction().with_context(what)?;
    let v = provider::verify::verify(&tx);
    drop(tx);
    let code = if v.is_ok() { exit::OK } else { exit::NO };
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut doc = serde_json::to_value(&v)?;
        if let Value::Object(m) = &mut doc {
            m.insert("path".into(), json!(args.db.display().to_string()));
            m.insert("ok".into(), json!(v.is_ok()));
            m.insert("exit_code".into(), json!(code));
        }
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else if !args.quiet {
        for line in v.lines() {
            writeln!(out, "FAIL {}: {line}", args.db.display())?;
        }
        let c = &v.checked;
        let findings = v.findings.len() as u64 + v.findings_omitted;
        writeln!(
            out,
            "{} {}: integrity_check {}, schema version {}, {} channels, {} records, {} positions, {} sessions, {} in-flight entries, {} shared groups checked: {}",
            if v.is_ok() { "OK" } else { "FAIL" },
            args.db.display(),
            if v.integrity_check == "ok" { "ok" } else { "failed" },
            v.schema_version.map_or("unreadable".to_owned(), |n| n.to_string()),
            c.channels,
            c.records,
            c.positions,
            c.sessions,
            c.inflight,
            c.shared_groups,
            if findings == 0 {
                "no findings".to_owned()
            } else if findings == 1 {
                "1 finding".to_owned()
            } else {
                format!("{findings} findings")
            }
        )?;
    }
    out.flush()?;
    Ok(code)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    Human,
    Json,
    Ndjson,
}

fn open(db: &Path) -> Result<Connection, u8> {
    match provider::open_read_only(db) {
        Ok(c) => Ok(c),
        Err(e) => {
            let line = match &e {
                SqliteOpenError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    format!("storage {}: no such database", db.display())
                }
                other => other.to_string(),
            };
            let _ = writeln!(std::io::stderr(), "saguin: {line}");
            Err(exit::CANNOT)
        }
    }
}

struct ChannelRow {
    name: String,
    kind: String,
    next: u64,
    floor: u64,
    bytes: u64,
    records: u64,
}

fn channels(conn: &Connection) -> rusqlite::Result<Vec<ChannelRow>> {
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
        Ok(ChannelRow {
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

fn dump(args: &DumpArgs) -> anyhow::Result<u8> {
    let output = if args.json {
        Output::Json
    } else if args.ndjson {
        Output::Ndjson
    } else {
        Output::Human
    };
    let conn = match open(&args.db) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let what = || format!("sqlite dump {}", args.db.display());
    // One read transaction: every table shown is one moment.
    let tx = conn.unchecked_transaction().with_context(what)?;
    let code = match &args.channel {
        Some(name) => dump_channel(&tx, args, name, output).with_context(what)?,
        None => dump_overview(&tx, &args.db, output).with_context(what)?,
    };
    drop(tx);
    Ok(code)
}

fn dump_overview(conn: &Connection, db: &Path, output: Output) -> anyhow::Result<u8> {
    let (created_by, created_at) =
        provider::schema::creator(conn).unwrap_or_else(|_| ("unknown".into(), 0));
    let channels = channels(conn)?;
    let mut stmt = conn.prepare(
        "SELECT channel, reader, offset, saved_at, session_expiry FROM positions ORDER BY channel, reader",
    )?;
    let positions: Vec<(String, String, u64, i64, Option<u32>)> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut stmt = conn.prepare(
        "SELECT s.client_id, s.principal, s.expiry_interval, s.detached_at, json_array_length(s.subscriptions), s.window,
            (SELECT count(*) FROM session_inflight i WHERE i.client_id = s.client_id),
            (SELECT p.offset FROM positions p WHERE p.channel = '$saguin/broadcast' AND p.reader = 'mqtt:' || s.client_id)
         FROM sessions s ORDER BY s.client_id",
    )?;
    #[allow(clippy::type_complexity)]
    let sessions: Vec<(String, Option<String>, u32, i64, i64, u16, u64, Option<u64>)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut stmt = conn.prepare(
        "SELECT c.name, count(q.offset), coalesce(sum(q.attempts > 0), 0), coalesce(max(q.attempts), 0),
            coalesce(sum(q.attempts), 0), coalesce(min(nullif(q.first_delivered, 0)), 0)
         FROM channels c LEFT JOIN queue_items q ON q.channel = c.name
         WHERE c.kind = 'queue' GROUP BY c.name ORDER BY c.name",
    )?;
    let queues: Vec<(String, u64, u64, u64, u64, i64)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let held: u64 = conn.query_row("SELECT count(*) FROM held_publishes", [], |r| r.get(0))?;
    let groups: u64 = conn.query_row("SELECT count(*) FROM share_groups", [], |r| r.get(0))?;
    // In full for the JSON forms, decoded as the provider decodes them.
    let full_sessions: std::collections::HashMap<String, Value> = provider::read_sessions(conn)?
        .iter()
        .map(|s| (s.client_id.clone(), session_json(s)))
        .collect();
    let held_list = held_publishes(conn)?;
    let group_list = share_groups(conn)?;

    let channel_json = |c: &ChannelRow| json!({"name": c.name, "kind": c.kind, "next": c.next, "floor": c.floor, "bytes": c.bytes, "records": c.records});
    let position_json = |p: &(String, String, u64, i64, Option<u32>)| json!({"channel": p.0, "reader": p.1, "offset": p.2, "saved_at": time_json(p.3), "session_expiry": p.4});
    // The summary's counts, then the session in full: `subscription_list`,
    // `inflight_list` and `will` (the shape `snapshot inspect` prints).
    let session_json = |s: &(String, Option<String>, u32, i64, i64, u16, u64, Option<u64>)| {
        let full = full_sessions.get(&s.0);
        json!({"client_id": s.0, "principal": s.1, "expiry_interval": s.2, "detached_at": time_json(s.3),
               "subscriptions": s.4, "window": s.5, "inflight": s.6, "cursor": s.7,
               "subscription_list": full.map_or(json!([]), |f| f["subscriptions"].clone()),
               "inflight_list": full.map_or(json!([]), |f| f["inflight"].clone()),
               "will": full.map_or(Value::Null, |f| f["will"].clone())})
    };
    let queue_json = |q: &(String, u64, u64, u64, u64, i64)| {
        json!({"channel": q.0, "depth": q.1, "delivered": q.2, "max_attempts": q.3, "attempts": q.4,
               "oldest_first_delivered": time_json(q.5)})
    };
    let mut out = std::io::stdout().lock();
    match output {
        Output::Json => {
            let doc = json!({
                "database": db.display().to_string(),
                "schema_version": provider::SCHEMA_VERSION,
                "created_by": created_by,
                "created_at": time_json(created_at),
                "channels": channels.iter().map(channel_json).collect::<Vec<_>>(),
                "positions": positions.iter().map(position_json).collect::<Vec<_>>(),
                "sessions": sessions.iter().map(session_json).collect::<Vec<_>>(),
                "queues": queues.iter().map(queue_json).collect::<Vec<_>>(),
                "held_publishes": held,
                "share_groups": groups,
                "held_publish_list": held_list,
                "share_group_list": group_list,
            });
            serde_json::to_writer_pretty(&mut out, &doc)?;
            writeln!(out)?;
        }
        Output::Ndjson => {
            let mut line = |kind: &str, mut v: Value| -> anyhow::Result<()> {
                if let Value::Object(m) = &mut v {
                    m.insert("type".into(), json!(kind));
                }
                serde_json::to_writer(&mut out, &v)?;
                writeln!(out)?;
                Ok(())
            };
            line(
                "database",
                json!({"database": db.display().to_string(), "schema_version": provider::SCHEMA_VERSION,
                "created_by": created_by, "created_at": time_json(created_at), "held_publishes": held, "share_groups": groups}),
            )?;
            for c in &channels {
                line("channel", channel_json(c))?;
            }
            for p in &positions {
                line("position", position_json(p))?;
            }
            for s in &sessions {
                line("session", session_json(s))?;
            }
            for q in &queues {
                line("queue", queue_json(q))?;
            }
            for h in &held_list {
                line("held_publish", h.clone())?;
            }
            for g in &group_list {
                line("share_group", g.clone())?;
            }
        }
        Output::Human => {
            writeln!(
                out,
                "{}: schema version {}, created by saguin {} at {}",
                db.display(),
                provider::SCHEMA_VERSION,
                created_by,
                time_text(created_at)
            )?;
            let mut t = table();
            t.set_header(vec!["channel", "kind", "next", "floor", "bytes", "records"]);
            for c in &channels {
                t.add_row(vec![
                    c.name.clone(),
                    c.kind.clone(),
                    c.next.to_string(),
                    c.floor.to_string(),
                    c.bytes.to_string(),
                    c.records.to_string(),
                ]);
            }
            writeln!(out, "{t}")?;
            if !positions.is_empty() {
                let mut t = table();
                t.set_header(vec![
                    "channel",
                    "reader",
                    "offset",
                    "saved at",
                    "session expiry",
                ]);
                for p in &positions {
                    t.add_row(vec![
                        p.0.clone(),
                        cell(&p.1),
                        p.2.to_string(),
                        time_text(p.3),
                        p.4.map_or("-".into(), |s| format!("{s}s")),
                    ]);
                }
                writeln!(out, "{t}")?;
            }
            if !sessions.is_empty() {
                let mut t = table();
                t.set_header(vec![
                    "session",
                    "principal",
                    "expiry",
                    "detached at",
                    "subscriptions",
                    "in flight",
                    "cursor",
                ]);
                for s in &sessions {
                    t.add_row(vec![
                        cell(&s.0),
                        s.1.as_deref().map_or_else(|| "-".into(), cell),
                        format!("{}s", s.2),
                        if s.3 == 0 {
                            "connected".into()
                        } else {
                            time_text(s.3)
                        },
                        s.4.to_string(),
                        s.6.to_string(),
                        s.7.map_or("-".into(), |c| c.to_string()),
                    ]);
                }
                writeln!(out, "{t}")?;
            }
            if !queues.is_empty() {
                let mut t = table();
                t.set_header(vec![
                    "queue",
                    "depth",
                    "delivered",
                    "attempts",
                    "max attempts",
                    "oldest first delivery",
                ]);
                for q in &queues {
                    t.add_row(vec![
                        q.0.clone(),
                        q.1.to_string(),
                        q.2.to_string(),
                        q.4.to_string(),
                        q.3.to_string(),
                        time_text(q.5),
                    ]);
                }
                writeln!(out, "{t}")?;
            }
            writeln!(
                out,
                "{} channels, {} positions, {} sessions, {} queues, {} held publishes, {} shared groups",
                channels.len(),
                positions.len(),
                sessions.len(),
                queues.len(),
                held,
                groups
            )?;
        }
    }
    Ok(exit::OK)
}

/// Every held exactly-once publish in full: channel, holder, packet id, when
/// it was held, and its whole message.
fn held_publishes(conn: &Connection) -> rusqlite::Result<Vec<Value>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT channel, holder_client_id, packet_id, held_at, {RECORD_COLUMNS} FROM held_publishes
         ORDER BY channel, holder_client_id, packet_id"
    ))?;
    let rows = stmt.query_map([], |r| {
        let record = record_at(r, 4, 0)?;
        let mut v = json!({
            "channel": r.get::<_, String>(0)?,
            "client_id": r.get::<_, String>(1)?,
            "packet_id": r.get::<_, u16>(2)?,
            "held_at": time_json(r.get(3)?),
            "topic": record.topic,
            "qos": record.qos,
            "retain": record.retain,
            "time": time_json(record.timestamp),
        });
        extend_message_json(
            &mut v,
            &record.payload,
            &record.props,
            &record.user_properties,
        );
        Ok(v)
    })?;
    rows.collect()
}

/// Every shared subscription group's cursor and returned deliveries, the
/// returned ones in the order the provider reads them back
/// (`src/storage/sqlite/broadcast.rs`, by log offset): the dump shows what a
/// broker would load.
fn share_groups(conn: &Connection) -> rusqlite::Result<Vec<Value>> {
    let mut stmt = conn.prepare(
        "SELECT g.group_name, g.filter, g.cursor,
            (SELECT json_group_array(log_offset) FROM
               (SELECT log_offset FROM share_returned r
                WHERE r.group_name = g.group_name AND r.filter = g.filter ORDER BY log_offset))
         FROM share_groups g ORDER BY g.group_name, g.filter",
    )?;
    let rows = stmt.query_map([], |r| {
        let returned: String = r.get(3)?;
        let returned: Value = serde_json::from_str(&returned).unwrap_or_else(|_| json!([]));
        Ok(json!({
            "group": r.get::<_, String>(0)?,
            "filter": r.get::<_, String>(1)?,
            "cursor": r.get::<_, u64>(2)?,
            "returned": returned,
        }))
    })?;
    rows.collect()
}

fn dump_channel(
    conn: &Connection,
    args: &DumpArgs,
    name: &str,
    output: Output,
) -> anyhow::Result<u8> {
    let row: Option<(String, u64, u64)> = conn
        .query_row(
            "SELECT kind, next, floor FROM channels WHERE name = ?1",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map(Some)
        .or_else(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            e => Err(e),
        })?;
    let Some((kind, next, floor)) = row else {
        writeln!(
            std::io::stderr(),
            "saguin: storage {}: no channel named {name:?} (saguin sqlite dump {} lists them)",
            args.db.display(),
            args.db.display()
        )?;
        return Ok(exit::CANNOT);
    };
    let from = args.from.unwrap_or(floor);
    let limit = args
        .limit
        .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
    let sql = match kind.as_str() {
        "append" => format!(
            "SELECT offset, {RECORD_COLUMNS}, 0, NULL, NULL, NULL FROM records WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT ?3"
        ),
        "latest" => format!(
            "SELECT offset, {RECORD_COLUMNS}, deleted, NULL, NULL, NULL FROM latest_values WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT ?3"
        ),
        _ => format!(
            "SELECT offset, {RECORD_COLUMNS}, 0, attempts, first_delivered, last_delivered FROM queue_items WHERE channel = ?1 AND offset >= ?2 ORDER BY offset LIMIT ?3"
        ),
    };
    // A bar on a terminal for a long listing; nothing when piped.
    let bar = if std::io::stderr().is_terminal() {
        let table_name = match kind.as_str() {
            "append" => "records",
            "latest" => "latest_values",
            _ => "queue_items",
        };
        let total: u64 = conn.query_row(
            &format!("SELECT count(*) FROM {table_name} WHERE channel = ?1 AND offset >= ?2"),
            rusqlite::params![name, from],
            |r| r.get(0),
        )?;
        let total = args.limit.map_or(total, |l| l.min(total));
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} records {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query(rusqlite::params![name, from, limit])?;
    let mut out = std::io::stdout().lock();
    let mut json_records = Vec::new();
    let mut t = table();
    let queue = kind == "queue";
    let mut header = vec!["offset", "time", "topic", "payload", "properties"];
    if queue {
        header.extend(["attempts", "first delivered", "last delivered"]);
    }
    t.set_header(header);
    let mut listed = 0u64;
    while let Some(row) = rows.next()? {
        let offset: u64 = row.get(0)?;
        let record = record_at(row, 1, offset)?;
        let deleted: bool = row.get(14)?;
        let attempts: Option<u32> = row.get(15)?;
        let first: Option<i64> = row.get(16)?;
        let last: Option<i64> = row.get(17)?;
        listed += 1;
        bar.inc(1);
        let json = || {
            let shown = RecordJson::new(&record);
            match kind.as_str() {
                "latest" => shown.latest_row(deleted),
                "queue" => {
                    shown.queue_item(attempts.unwrap_or(0), first.unwrap_or(0), last.unwrap_or(0))
                }
                _ => shown,
            }
            .to_value()
        };
        match output {
            Output::Json => json_records.push(json()),
            Output::Ndjson => {
                serde_json::to_writer(&mut out, &json())?;
                writeln!(out)?;
            }
            Output::Human => {
                let payload = if deleted {
                    "(deleted)".to_owned()
                } else {
                    payload_cell(&record.payload)
                };
                let mut cells = vec![
                    offset.to_string(),
                    time_text(record.timestamp),
                    cell(&record.topic),
                    payload,
                    props_cell(&record.user_properties, &record.props),
                ];
                if queue {
                    cells.push(attempts.unwrap_or(0).to_string());
                    cells.push(time_text(first.unwrap_or(0)));
                    cells.push(time_text(last.unwrap_or(0)));
                }
                t.add_row(cells);
            }
        }
    }
    bar.finish_and_clear();
    match output {
        Output::Json => {
            let doc = json!({
                "database": args.db.display().to_string(),
                "channel": name,
                "kind": kind,
                "next": next,
                "floor": floor,
                "from": from,
                "records": json_records,
            });
            serde_json::to_writer_pretty(&mut out, &doc)?;
            writeln!(out)?;
        }
        Output::Ndjson => {}
        Output::Human => {
            writeln!(out, "{t}")?;
            writeln!(
                out,
                "channel {name} ({kind}): next {next}, floor {floor}; {listed} records listed from offset {from}"
            )?;
        }
    }
    Ok(exit::OK)
}

fn run_backup(args: &BackupArgs) -> anyhow::Result<u8> {
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} pages {elapsed} {wide_msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let progress = |done: u64, total: u64| {
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    };
    let result = backup::backup(&args.db, &args.dest, &progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    match result {
        Ok(report) => {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "backup {} -> {}: verified (integrity_check ok, schema version {}, row counts equal to the source at the moment copied): {} tables, {} rows, {} bytes in {:.2}s ({:.1} MB/s)",
                report.source.display(),
                report.destination.display(),
                report.schema_version,
                report.tables.len(),
                report.rows,
                report.bytes,
                report.elapsed.as_secs_f64(),
                report.mb_per_s()
            )?;
            Ok(exit::OK)
        }
        Err(e) => {
            let code = if e.is_verification() {
                exit::NO
            } else {
                exit::CANNOT
            };
            let line = match &e {
                BackupError::SourceOpen(SqliteOpenError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    format!("storage {}: no such database", args.db.display())
                }
                other => other.to_string(),
            };
            writeln!(std::io::stderr(), "saguin: sqlite backup: {line}")?;
            Ok(code)
        }
    }
}
