//! `saguin migrate`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use comfy_table::{presets::UTF8_FULL_CONDENSED, ContentArrangement, Table};
use saguin::storage::migrate::{self, Destination, MigrateError, Progress, Report, Source};
use saguin::storage::read::MBMQTT_DEFAULT_MAX_BYTES;

use crate::exit;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Move a memory provider's snapshot directory into a new sqlite database.
    #[command(long_about = TO_SQLITE_ABOUT, after_help = TO_SQLITE_EXAMPLES)]
    ToSqlite {
        snapshot_dir: PathBuf,
        db: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Move a sqlite database into a new snapshot directory.
    #[command(long_about = TO_SNAPSHOTS_ABOUT, after_help = TO_SNAPSHOTS_EXAMPLES)]
    ToSnapshots {
        db: PathBuf,
        snapshot_dir: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Import a legacy MBMQTT01 broker.snapshot.
    // A required group of both destinations, so that a usage error names
    // both choices (`<--to-sqlite <DB>|--to-snapshots <DIR>>`) rather than
    // only one of them.
    #[command(
        long_about = FROM_MBMQTT_ABOUT,
        after_help = FROM_MBMQTT_EXAMPLES,
        group(
            clap::ArgGroup::new("destination")
                .required(true)
                .multiple(false)
                .args(["to_sqlite", "to_snapshots"])
        )
    )]
    FromMbmqtt {
        broker_snapshot: PathBuf,
        // The group already allows one; the conflict is stated as well so
        // that shell completion stops offering the other.
        #[arg(long, value_name = "DB", conflicts_with = "to_snapshots")]
        to_sqlite: Option<PathBuf>,
        #[arg(long, value_name = "DIR")]
        to_snapshots: Option<PathBuf>,
        /// Refuse a broker.snapshot larger than this: bytes, or a size with a
        /// unit as in the configuration (10MiB binary, 10MB decimal).
        #[arg(long, value_name = "SIZE", default_value_t = MBMQTT_DEFAULT_MAX_BYTES, value_parser = saguin::config::units::parse_size)]
        max_bytes: u64,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(clap::Args, Debug)]
pub struct Common {
    /// One JSON document on stdout (the report), diagnostics on stderr.
    #[arg(long)]
    pub json: bool,
    /// Refused: a migration reads and writes only the paths it is given.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

macro_rules! rules {
    () => {
        "\
The rules it enforces:

  - --config is refused (exit 2): a migration reads and writes only the paths \
it is given, so it works on a copy, on another machine, on a directory from a \
backup, and for an operator whose configuration has drifted.
  - The destination must not exist, or must be an empty directory; for a \
database, DB-wal, DB-shm and DB-journal must not exist either. Its parent \
directory must exist: a migration creates nothing but the destination.
  - The destination is built under a temporary name beside it \
(.NAME.PID.migrate.tmp) and moved into place - a database linked, a \
directory renamed, neither replacing anything - only once it has been read \
back, verified and counted. A migration stopped half way (a SIGTERM, a power \
cut) leaves nothing at the destination, so a retry is never blocked; what \
it leaves under the temporary name may be removed.
  - The broker must be stopped: both providers' locks are taken (DB.lock, \
DIR/saguin.lock), and a lock a running broker holds is refused at once, \
naming the holder. Taking a lock creates its file if absent: that is the one \
thing created beside the source.
  - The source is never touched: a database is opened read-only (never \
immutable=1), a directory only read. Even the expired positions a starting \
broker would drop are carried, unchanged.
  - The source is verified first, whole, and a source that fails is refused \
(exit 3) with every finding named and nothing created: a directory by the \
checks and verdicts of saguin snapshot verify (pair checks included; a \
listed file that is missing, a manifest that cannot be used and a hole in an \
append channel are refusals), a database by those of saguin \
sqlite verify (integrity_check, schema, and the row invariants: no holes, no \
offset at or past next, bytes equal to the records' sizes, no rows of a \
channel without its channels row, every queue's dead-letter row, in-flight \
entries of a session that exists) and then by the loader's own validation \
of every unit.
  - Nothing is created when there is nothing to migrate (exit 3, \"nothing to \
migrate\"), and a destination none of whose units could be written is removed \
again, so the path stays open for a retry.
  - A failure to write is reported and the migration carries on, one unit at a time (a \
channel, a queue with its dead-letter channel in one transaction, the retained \
store, the sessions with the broadcast log), listing every unit that did not \
make it.

What is carried: next and floor as they stand, every record at the offset it \
already has, deletion markers of latest channels, every queue record with its \
attempt count and first and last delivery times, the dead-letter channel, \
every consumer position (a queue's included) with the time it was saved, \
held exactly-once publishes, the retained store, the \
persistent sessions with their subscriptions, Wills and in-flight tables, the \
broadcast log with its cursors and their times, shared groups and their \
returned deliveries in the order returned.

Counts in and counts out (next, floor, records, queue items, dead letters, \
positions - a queue's own and its dead-letter channel's, or the broadcast \
log's cursors - held publishes, sessions, in-flight entries, shared groups, \
returned deliveries) are printed per unit (the last two in --json); from a \
database the counts in are taken by SQL from its rows, so a row the reading \
missed fails the unit; the counts out are read back from the destination as \
written, and a difference is a failure. A progress bar is shown when stderr \
is a terminal; a summary line is printed either way. --json prints the report \
as one JSON document.

Exit status: 0 every unit carried and counted equal; 3 something could not \
be done (a destination or sidecar exists or its parent does not, the source \
is missing, locked by a running broker, does not verify, or holds nothing to \
migrate; a unit failed or its counts differ - every one is listed); 2 usage, \
including --config."
    };
}
const TO_SQLITE_ABOUT: &str = concat!(
    "\
Move a memory provider's snapshot directory into a new sqlite database, with \
the broker stopped.

The database is created 0600 with schema version 20, as the sqlite provider \
creates it, written one unit per transaction, checkpointed and fsynced before \
anything is reported.

The order that works: declare the destination provider in the configuration \
(a provider no channel names is inert); stop the broker; run the migration; \
change the channel's storage: to the new provider; start the broker and \
confirm the channel before removing the snapshot directory.\n\n",
    rules!()
);

const TO_SQLITE_EXAMPLES: &str = "\
Examples:
  systemctl stop saguin
  saguin migrate to-sqlite /var/lib/saguin/snapshots /var/lib/saguin/saguin.db
  saguin migrate to-sqlite /backup/snapshots /tmp/check.db --json | jq '.units[] | select(.error)'";

const TO_SNAPSHOTS_ABOUT: &str = concat!(
    "\
Move a sqlite database into a new snapshot directory, with the broker stopped.

The database is read in one read transaction, so every channel is the same \
moment. The directory is written with the writer a broker uses at shutdown: \
each file to a temporary name, all of them made durable together, each \
renamed, the directory fsynced, the manifest last; the directory 0700 and every file 0600. It is then read \
back with the loader for the counts out.

A database of another schema version is refused by name: there is no in-place \
upgrade, and carrying one across takes the older binary to export it first.\n\n",
    rules!()
);

const TO_SNAPSHOTS_EXAMPLES: &str = "\
Examples:
  systemctl stop saguin
  saguin migrate to-snapshots /var/lib/saguin/saguin.db /var/lib/saguin/snapshots";

const FROM_MBMQTT_ABOUT: &str = concat!(
    "\
Import a legacy MBMQTT01 broker.snapshot (Disk V1, V2 or V3) into a new sqlite \
database (--to-sqlite) or a new snapshot directory (--to-snapshots).

The file is read only if it is a regular file no larger than --max-bytes \
(64 MiB by default), then decoded and validated whole (FORMAT.md §5) before \
anything is created. Persistent sessions and retained messages are carried as \
saguin keeps them:

  - principal: a V1 session (LegacyAnonymous) and an empty V2/V3 principal \
become no principal; a name stays that name;
  - detached at: the legacy detach epoch; an unknown one (V1) or 0 becomes the \
moment of the import, so the expiry window starts then, as the legacy broker \
started it on first sight after loading;
  - expiry interval: 4294967295 s (MQTT 5's \"never\"), because MQTT 3.1.1 \
persistent sessions do not expire by themselves; the broker's \
limits.max_session_expiry bounds it as it bounds every stored session;
  - subscriptions: filter and QoS, MQTT 5 options at their defaults;
  - in-flight messages (PUBACK or PUBREC owed) and pending messages go into the \
broadcast log in order, each owed to its session only, with in-flight entries \
keeping their packet identifiers; a PUBCOMP owed (phase 3, message no longer \
kept) becomes an empty log entry under $saguin/mbmqtt/pubcomp-owed with an \
in-flight entry awaiting PUBCOMP, so the resumed session is sent the PUBREL; \
the session's cursor is its first owed message; the window is 65535;
  - not carried: the next packet id (saguin chooses its own) and inbound QoS 2 \
ids awaiting PUBREL (no message is kept to hold; they are counted and \
reported);
  - retained messages: topic, payload and QoS, retain flag set.

The same destination rules apply as for the other migrations; counts in are \
the legacy file's (sessions, in-flight entries, messages owed, retained \
messages) and must equal the counts out.\n\n",
    rules!()
);

const FROM_MBMQTT_EXAMPLES: &str = "\
Examples:
  saguin migrate from-mbmqtt /var/lib/mbmqtt/broker.snapshot --to-sqlite /var/lib/saguin/sessions.db
  saguin migrate from-mbmqtt broker.snapshot --to-snapshots /var/lib/saguin/snapshots --max-bytes 268435456";

/// A progress bar on a terminal, nothing when piped.
struct Bar(Option<indicatif::ProgressBar>);

impl Bar {
    fn new(json: bool) -> Bar {
        Bar((!json && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} records {elapsed} {wide_msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        }))
    }
}

impl Progress for Bar {
    fn start(&self, total: u64) {
        if let Some(b) = &self.0 {
            b.set_length(total);
        }
    }
    fn unit(&self, name: &str) {
        if let Some(b) = &self.0 {
            b.set_message(name.to_owned());
        }
    }
    fn advance(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }
    fn verifying(&self) {
        if let Some(b) = &self.0 {
            b.set_message("reading the destination back");
        }
    }
}

pub fn run(cmd: Command) -> anyhow::Result<u8> {
    let (source, destination, common) = match cmd {
        Command::ToSqlite {
            snapshot_dir,
            db,
            common,
        } => (
            Source::SnapshotDir(snapshot_dir),
            Destination::Sqlite(db),
            common,
        ),
        Command::ToSnapshots {
            db,
            snapshot_dir,
            common,
        } => (
            Source::Sqlite(db),
            Destination::SnapshotDir(snapshot_dir),
            common,
        ),
        Command::FromMbmqtt {
            broker_snapshot,
            to_sqlite,
            to_snapshots,
            max_bytes,
            common,
        } => {
            let destination = match (to_sqlite, to_snapshots) {
                (Some(db), None) => Destination::Sqlite(db),
                (None, Some(dir)) => Destination::SnapshotDir(dir),
                _ => {
                    writeln!(std::io::stderr(), "saguin: migrate from-mbmqtt: give exactly one of --to-sqlite DB and --to-snapshots DIR")?;
                    return Ok(exit::USAGE);
                }
            };
            (
                Source::Mbmqtt {
                    path: broker_snapshot,
                    max_bytes,
                },
                destination,
                common,
            )
        }
    };
    if let Some(config) = &common.config {
        writeln!(
            std::io::stderr(),
            "saguin: migrate: --config {} refused: a migration reads and writes only the paths it is given, and reads no configuration (so it works on a copy, on another machine, and when the configuration has drifted)",
            config.display()
        )?;
        return Ok(exit::USAGE);
    }
    let bar = Bar::new(common.json);
    let result = migrate::migrate(&source, &destination, &bar);
    if let Some(b) = &bar.0 {
        b.finish_and_clear();
    }
    match result {
        Ok(report) => print_report(&report, common.json),
        Err(e) => {
            let mut err = std::io::stderr().lock();
            writeln!(err, "saguin: migrate: {e}")?;
            if let MigrateError::NothingToMigrate { .. } = e {
                writeln!(err, "saguin: migrate: nothing migrated")?;
            }
            Ok(exit::CANNOT)
        }
    }
}

fn pair(a: Option<u64>, b: Option<u64>) -> String {
    let text = |v: Option<u64>| v.map_or("-".to_owned(), |n| n.to_string());
    if a == b {
        text(a)
    } else {
        format!("{} → {}", text(a), text(b))
    }
}

fn print_report(report: &Report, json: bool) -> anyhow::Result<u8> {
    let code = if report.is_complete() {
        exit::OK
    } else {
        exit::CANNOT
    };
    let mut out = std::io::stdout().lock();
    if json {
        let mut doc = serde_json::to_value(report)?;
        if let serde_json::Value::Object(m) = &mut doc {
            m.insert("complete".into(), serde_json::json!(report.is_complete()));
            m.insert(
                "elapsed_seconds".into(),
                serde_json::json!(report.elapsed.as_secs_f64()),
            );
            m.insert(
                "records_carried".into(),
                serde_json::json!(report.records_carried()),
            );
        }
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled);
        t.set_header(vec![
            "unit",
            "kind",
            "next",
            "floor",
            "records",
            "queue items",
            "dead letters",
            "positions",
            "held",
            "sessions",
            "in flight",
            "result",
        ]);
        for u in &report.units {
            let get = |f: fn(&migrate::Counts) -> u64| {
                pair(u.counts_in.as_ref().map(f), u.counts_out.as_ref().map(f))
            };
            t.add_row(vec![
                u.name.clone(),
                u.kind.clone(),
                get(|c| c.next),
                get(|c| c.floor),
                get(|c| c.records),
                get(|c| c.queue_items),
                get(|c| c.dead_letters),
                get(|c| c.positions),
                get(|c| c.held),
                get(|c| c.sessions),
                get(|c| c.inflight),
                if u.is_ok() {
                    "ok".into()
                } else {
                    "FAILED".into()
                },
            ]);
        }
        writeln!(out, "{t}")?;
        if let Some(l) = &report.legacy {
            writeln!(
                out,
                "MBMQTT01 V{}: {} sessions, {} subscriptions, {} in flight, {} pending, {} retained; {} inbound QoS 2 ids not carried",
                l.version, l.sessions, l.subscriptions, l.inflight, l.pending, l.retained, l.inbound_qos2_dropped
            )?;
        }
    }
    let mut err = std::io::stderr().lock();
    for w in &report.warnings {
        writeln!(err, "saguin: migrate: warning: {w}")?;
    }
    for u in &report.units {
        if let Some(e) = &u.error {
            writeln!(err, "saguin: migrate: {} {}: {e}", u.kind, u.name)?;
        }
    }
    for f in &report.failures {
        writeln!(err, "saguin: migrate: {f}")?;
    }
    let ok = report.units.iter().filter(|u| u.is_ok()).count();
    let secs = report.elapsed.as_secs_f64();
    let records = report.records_carried();
    let rate = if secs > 0.0 {
        records as f64 / secs
    } else {
        0.0
    };
    let summary = format!(
        "migrate {} -> {}: {ok} of {} units carried, {records} records in {secs:.2}s ({rate:.0} records/s){}",
        report.source.display(),
        report.destination.display(),
        report.units.len(),
        if report.destination_removed {
            "; nothing could be written, so the destination was removed again"
        } else if code == exit::OK {
            "; counts in equal counts out"
        } else {
            "; FAILED, see above"
        }
    );
    if json {
        writeln!(err, "{summary}")?;
    } else {
        writeln!(out, "{summary}")?;
    }
    Ok(code)
}
