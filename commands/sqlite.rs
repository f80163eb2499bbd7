//! `saguin sqlite dump|backup|verify`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use rusqlite::Connection;
use saguin::storage::backup::{self, BackupError};
use saguin::storage::contract::HeldPublish;
use saguin::storage::sqlite::inspect;
use saguin::storage::sqlite::{self as provider, SqliteOpenError};
use saguin_format::model::ChannelKind;
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

Exit status: 0 every check passed; 1 a check failed (each finding listed), \
a file cut short, emptied or overwritten among them (a backup that must not \
be kept); 3 the file is missing, not a regular file or cannot be read; 2 \
usage.";

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
UTF-8, hex: otherwise, cut at 64 characters as snapshot inspect shows it; \
the JSON forms carry it whole), user properties and publish properties, with a progress bar on a terminal while they are read. \
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

DEST, and DEST-wal, DEST-shm and DEST-journal, must not exist. A file system \
under DEST with less free than the copy takes is refused before a page is \
written, saying what it has and what the copy needs (bytes, and the four \
files the copy opens); one whose last files are taken while the copy is \
made fails saying so. While the copy reads, \
the broker's write-ahead log cannot be copied into its database and grows with \
what is published; the broker's checkpoint room grows with it (see \
saguin-config(5), checkpoint_room): back up to another file system where you \
can. A failure removes the temporary file and leaves nothing at DEST. A progress bar is shown \
when stderr is a terminal; a summary line (tables, rows, bytes, MB/s) is \
printed either way.

Exit status: 0 copied and proved; 1 the copy was made and did not prove \
itself (removed); 3 could not copy (DEST or a sidecar exists, no room for it, \
the source is missing or of another schema version, I/O); 2 usage.";

const BACKUP_EXAMPLES: &str = "\
Examples:
  saguin sqlite backup /var/lib/saguin/saguin.db /backups/saguin-$(date +%F).db
  saguin sqlite backup /var/lib/saguin/saguin.db /mnt/usb/saguin.db && echo verified";

/// The largest offset a sqlite provider's database can hold.
const MAX_OFFSET: u64 = i64::MAX as u64;

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
    // SQLite stores an offset as a signed 64-bit integer, so no channel of
    // a database reaches past i64::MAX: a larger --from is a typo, refused
    // as usage with the bound named, as one past u64 already is.
    #[arg(long, value_name = "OFFSET", requires = "channel",
          value_parser = clap::value_parser!(u64).range(..=MAX_OFFSET))]
    pub from: Option<u64>,
    /// At most this many records.
    // Any count at or past a channel's length lists all of it, so a larger
    // --limit is taken as it is.
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
    // Opened as found: a file that is not this build's database, or no
    // database at all (cut short, emptied, overwritten), is what verify
    // answers "no" to, with its finding; only one that cannot be read is
    // "could not check".
    let conn = match provider::open_read_only_as_found(&args.db) {
        Ok(c) => c,
        Err(e) => return Ok(refused(&args.db, &e)),
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
    provider::open_read_only(db).map_err(|e| refused(db, &e))
}

/// Says why `db` could not be opened; the exit code that answers.
fn refused(db: &Path, e: &SqliteOpenError) -> u8 {
    let line = match e {
        SqliteOpenError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            format!("storage {}: no such database", db.display())
        }
        other => other.to_string(),
    };
    let _ = writeln!(std::io::stderr(), "saguin: {line}");
    exit::CANNOT
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
    let channels = inspect::channel_summaries(conn)?;
    let positions = inspect::all_positions(conn)?;
    let sessions = inspect::session_summaries(conn)?;
    let queues = inspect::queue_summaries(conn)?;
    // In full for the JSON forms, decoded as the provider decodes them.
    let full_sessions: std::collections::HashMap<String, Value> = provider::read_sessions(conn)?
        .iter()
        .map(|s| (s.client_id.clone(), session_json(s)))
        .collect();
    let held_list: Vec<Value> = inspect::all_held(conn)?.iter().map(held_json).collect();
    let group_list: Vec<Value> = inspect::share_groups(conn)?
        .iter()
        .map(|g| json!({"group": g.group, "filter": g.filter, "cursor": g.cursor, "returned": g.returned}))
        .collect();
    let held = held_list.len();
    let groups = group_list.len();

    let channel_json = |c: &inspect::ChannelSummary| json!({"name": c.name, "kind": c.kind, "next": c.next, "floor": c.floor, "bytes": c.bytes, "records": c.records});
    let position_json = |p: &inspect::StoredPosition| json!({"channel": p.channel, "reader": p.reader, "offset": p.offset, "saved_at": time_json(p.saved_at), "session_expiry": p.session_expiry});
    // The summary's counts, then the session in full: `subscription_list`,
    // `inflight_list` and `will` (the shape `snapshot inspect` prints).
    let session_json = |s: &inspect::SessionSummary| {
        let full = full_sessions.get(&s.client_id);
        json!({"client_id": s.client_id, "principal": s.principal, "expiry_interval": s.expiry_interval, "detached_at": time_json(s.detached_at),
               "subscriptions": s.subscriptions, "window": s.window, "inflight": s.inflight, "cursor": s.cursor,
               "subscription_list": full.map_or(json!([]), |f| f["subscriptions"].clone()),
               "inflight_list": full.map_or(json!([]), |f| f["inflight"].clone()),
               "will": full.map_or(Value::Null, |f| f["will"].clone())})
    };
    let queue_json = |q: &inspect::QueueSummary| {
        json!({"channel": q.channel, "depth": q.depth, "delivered": q.delivered, "max_attempts": q.max_attempts, "attempts": q.attempts,
               "oldest_first_delivered": time_json(q.oldest_first_delivered)})
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
                        p.channel.clone(),
                        cell(&p.reader),
                        p.offset.to_string(),
                        time_text(p.saved_at),
                        p.session_expiry.map_or("-".into(), |s| format!("{s}s")),
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
                        cell(&s.client_id),
                        s.principal.as_deref().map_or_else(|| "-".into(), cell),
                        format!("{}s", s.expiry_interval),
                        if s.detached_at == 0 {
                            "connected".into()
                        } else {
                            time_text(s.detached_at)
                        },
                        s.subscriptions.to_string(),
                        s.inflight.to_string(),
                        s.cursor.map_or("-".into(), |c| c.to_string()),
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
                        q.channel.clone(),
                        q.depth.to_string(),
                        q.delivered.to_string(),
                        q.attempts.to_string(),
                        q.max_attempts.to_string(),
                        time_text(q.oldest_first_delivered),
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

/// A held exactly-once publish in full: channel, holder, packet id, when
/// it was held, and its whole message.
fn held_json(h: &HeldPublish) -> Value {
    let r = &h.record;
    let mut v = json!({
        "channel": h.channel,
        "client_id": h.client_id,
        "packet_id": h.packet_id,
        "held_at": time_json(h.held_at),
        "topic": r.topic,
        "qos": r.qos,
        "retain": r.retain,
        "time": time_json(r.timestamp),
    });
    extend_message_json(&mut v, &r.payload, &r.props, &r.user_properties);
    v
}

fn dump_channel(
    conn: &Connection,
    args: &DumpArgs,
    name: &str,
    output: Output,
) -> anyhow::Result<u8> {
    let Some(head) = inspect::channel_head(conn, name)? else {
        writeln!(
            std::io::stderr(),
            "saguin: storage {}: no channel named {name:?} (saguin sqlite dump {} lists them)",
            args.db.display(),
            args.db.display()
        )?;
        return Ok(exit::CANNOT);
    };
    let (kind, next, floor) = (head.kind, head.next, head.floor);
    let from = args.from.unwrap_or(floor);
    // A bar on a terminal for a long listing; nothing when piped.
    let bar = if std::io::stderr().is_terminal() {
        let total = inspect::count_from(conn, name, kind, from)?;
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
    let mut out = std::io::stdout().lock();
    let mut json_records = Vec::new();
    let mut t = table();
    let queue = kind == ChannelKind::Queue;
    let mut header = vec!["offset", "time", "topic", "payload", "properties"];
    if queue {
        header.extend(["attempts", "first delivered", "last delivered"]);
    }
    t.set_header(header);
    let mut listed = 0u64;
    inspect::records_from(conn, name, kind, from, args.limit, |row| {
        let record = &row.record;
        listed += 1;
        bar.inc(1);
        let (attempts, first, last) = row.delivery.unwrap_or((0, 0, 0));
        let json = || {
            let shown = RecordJson::new(record);
            match kind {
                ChannelKind::Latest => shown.latest_row(row.deleted),
                ChannelKind::Queue => shown.queue_item(attempts, first, last),
                ChannelKind::Append => shown,
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
                let payload = if row.deleted {
                    "(deleted)".to_owned()
                } else {
                    payload_cell(&record.payload)
                };
                let mut cells = vec![
                    record.offset.to_string(),
                    time_text(record.timestamp),
                    cell(&record.topic),
                    payload,
                    props_cell(&record.user_properties, &record.props),
                ];
                if queue {
                    cells.push(attempts.to_string());
                    cells.push(time_text(first));
                    cells.push(time_text(last));
                }
                t.add_row(cells);
            }
        }
        Ok::<(), anyhow::Error>(())
    })?;
    let kind = kind.as_str();
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
