//! `saguin snapshot inspect|verify`.
//!
//! Both read through `saguin::storage::snapshot_dir`, the code the memory
//! provider loads with, so what `verify` calls OK is what `serve` loads.
//! `verify` uses its checking scan: the same decoder and checks, keeping no
//! record and reading each file as a stream, so its peak memory is about
//! the largest record's (and a latest channel's or the retained store's
//! topics). `inspect` reads the same way, keeping only the records it
//! shows (`storage::sample`).
//!
//! Over 1,500 lines: a human table and a JSON document for every kind of
//! file the command reads (a channel, a manifest of either kind, the
//! retained store, sessions, the broadcast log, an MBMQTT01 snapshot) and
//! for a directory's findings. Each printer is a function of its own; the
//! next to grow moves the printers of one kind into a module beside this.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use comfy_table::Table;
use saguin::storage::read::{self, SpecialKind};
use saguin::storage::sample::{ListCounts, Sample};
use saguin::storage::snapshot_dir::{
    self, AnySnapshot, DirManifest, DirReport, FileOutcome, FileProblem, FindingKind, Records,
    ScanOptions, Verdict,
};
use saguin_format::f21::{
    time::format_unix_nanos, BroadcastFile, ChannelFile, Generation, Header, HeldPublish, Manifest,
    Position, RetainedFile, SessionsFile, SnapshotFile,
};
use saguin_format::mbmqtt;
use saguin_format::model::Record;
use serde_json::{json, Value};

use crate::exit;
use crate::output::{
    cell, payload_cell, payload_text, props_cell, session_json, table, time_json, time_text,
    RecordJson,
};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Show what a snapshot directory, format 21 file or MBMQTT01 file holds.
    ///
    /// The kind of PATH is told from its bytes (the magic), never its name.
    /// A directory is shown with its generation: its number, the moment of
    /// the state it holds and how long ago that was (what a crash of the
    /// broker writing it would lose), and when it was committed.
    /// Exit 0 when it was shown and a broker would load it, 1 when a broker
    /// would not (what could be read is still shown), 3 when it cannot be
    /// read at all, or when --channel names a channel no file holds.
    /// A directory's findings are tagged FAIL, WARN or INFO by the verdict
    /// of saguin snapshot verify, and `"valid"` in --json is that verdict:
    /// a directory with nothing in it, or whose records may be gone, is
    /// shown with exit 0 (a broker starts on it) and is not valid.
    ///
    /// The human output is a summary that fits a screen: each list
    /// (retained messages, sessions, subscriptions, positions, cursors,
    /// held publishes, shared groups) shows its first 10 rows and a line
    /// saying how many it left out. --records lists every row (at most
    /// --limit per list) and every record. Client ids, topics and user
    /// properties are shown with control characters escaped (`\u{1b}`);
    /// --json carries them exactly.
    ///
    /// `--json` prints one document:
    /// `{"path", "type": "directory"|"f21"|"mbmqtt01"|null, "valid": bool,
    /// "problem": null|{"code","message"}, "header": null|HEADER,
    /// "contents": null|CONTENTS, "files": [FILE], "findings": [FINDING]}`.
    /// HEADER is `{"format","kind","writer","written_at","written_at_unix_nanos"}`;
    /// CONTENTS has a `"kind"` (`channel`, `manifest`, `generation`,
    /// `retained`, `sessions`, `broadcast`, `mbmqtt01`) and that kind's
    /// fields (a generation's: `"generation","captured_at",
    /// "captured_at_unix_nanos","files"`, each file `{"kind","channel",
    /// "file","generation","written_at","written_at_unix_nanos","length",
    /// "checksum","behind"}`); records
    /// (RECORD: `{"offset","message_id","time","time_unix_nanos","topic",
    /// "qos","retain","client_id","bridge","shared_copy","owed_to",
    /// "payload_bytes","payload_text","payload_hex","user_properties",
    /// "properties"}`, the shape `saguin sqlite dump` prints a record in;
    /// `payload_text` is null unless the payload is printable UTF-8,
    /// `properties` is `{"content_type","response_topic",
    /// "correlation_data_hex","payload_format_indicator",
    /// "message_expiry_interval"}`, a queue's items add `"attempts",
    /// "first_delivered","last_delivered"`) appear under `"records"` (a
    /// queue's under `"items"`) only with `--records`, a channel's dead
    /// letters under `"dead_letter"."records"` likewise.
    /// Each held exactly-once publish (`"held"`) is `{"client_id",
    /// "packet_id","held_at","topic","record": RECORD}`; a session's
    /// `"will"` is `{"topic","qos","retain","delay_interval",
    /// "payload_bytes","payload_text","payload_hex","user_properties",
    /// "properties"}`. Problem and finding codes are kebab-case
    /// (`checksum-mismatch`, `not-a-snapshot`, `crc-mismatch`).
    /// For a directory `"manifest"` is its manifest's CONTENTS (a
    /// directory's generation and when its state was taken), `files` lists
    /// `{"name","role","generation","status","problem","header",
    /// "contents"}` (status `ok`, `fail`, `unreadable`, `not-read` for a
    /// file this provider does not keep, `not-current` for one the current
    /// generation does not list) and `findings` lists `{"severity",
    /// "verdict","code","file","message"}` (severity: `error` when a broker
    /// would not load the directory; verdict: verify's `fail`, `warn` or
    /// `info`); both are `[]` for a single file. Readers must ignore fields
    /// they do not know.
    Inspect(InspectArgs),
    /// Decode and validate snapshot files as the broker does at startup.
    ///
    /// Prints `OK <path>` or `FAIL <path>: <problem>` per file (a directory:
    /// every file in it, then its findings as `WARN`/`FAIL` lines), then a
    /// summary line. Exit 0 when every file is valid, 1 when any is not
    /// (a symlink, FIFO, device or directory where a file belongs is not a
    /// valid snapshot), 3 when some file could not be read at all (missing,
    /// permission, I/O), which takes precedence.
    ///
    /// A directory holds one generation: the files its manifest lists
    /// (format/FORMAT.md §4); only those are read. A copy of a directory a
    /// broker was writing holds one whole generation when verify exits 0,
    /// and is refused naming the file it lacks or got from another
    /// generation when one committed during the copy: copy again.
    ///
    /// A directory's findings and their verdicts. FAIL (exit 1):
    /// `file-refused` (a file does not decode or validate),
    /// `name-mismatch` (a channel file under another channel's name),
    /// `not-the-listed-file` (a listed file whose length, written-at or
    /// checksum is not what the manifest states: a copy mixing two
    /// generations), `sessions-without-broadcast`,
    /// `sessions-broadcast-mismatch` (the sessions do not fit the log),
    /// `listed-but-missing` (the manifest lists a file that is not there:
    /// its records are gone), `written-before-manifest` (a file older than
    /// a shutdown's manifest, in a directory written before generations:
    /// what was published after its moment is gone),
    /// `generations-without-manifest` (numbered files and no manifest to
    /// say they are one generation), `nothing-stored` (no channel,
    /// retained, sessions or broadcast file: nothing to verify). WARN (exit
    /// 0): `manifest-missing`, `manifest-unreadable` (the manifest file
    /// itself also FAILs), `written-after-manifest` (a later shutdown
    /// finished its files and not its manifest; nothing is lost), `behind`
    /// (a store whose newer state could not be written: what happened to
    /// it after its file is gone), `uncommitted` (a file of a generation
    /// being written or cut short; not read), `leftover-temp` (an
    /// unfinished write, never read). Not printed, in `--json` only:
    /// `not-in-manifest`, `superseded`, `not-configured`, `unrecognised`.
    /// A broker starts on a directory with `listed-but-missing`,
    /// `written-before-manifest` or `generations-without-manifest`
    /// findings (its loader warns); verify answers no, because records may
    /// be gone. The same verdicts decide what `saguin migrate` refuses to
    /// read.
    ///
    /// `--json` prints one document: `{"results": [{"path","status":
    /// "ok"|"fail"|"unreadable","format","kind","problem":null|{"code",
    /// "message"}}], "findings": [{"path","severity","verdict","code",
    /// "file","message"}], "summary": {"checked","ok","failed","unreadable",
    /// "warnings"}, "exit_code"}`.
    Verify(VerifyArgs),
}

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A snapshot directory, a format 21 file, or an MBMQTT01 broker.snapshot.
    pub path: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// List records.
    #[arg(long)]
    pub records: bool,
    /// At most this many records per channel.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Only this channel.
    #[arg(long, value_name = "NAME")]
    pub channel: Option<String>,
    /// Refuse a file larger than this: bytes, or a size with a unit as in
    /// the configuration (10MiB binary, 10MB decimal). Default: 64MiB for
    /// MBMQTT01, 4GiB for format 21.
    #[arg(long, value_name = "SIZE", value_parser = saguin::config::units::parse_size)]
    pub max_bytes: Option<u64>,
}

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Snapshot directories or files.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print nothing; the exit code answers.
    #[arg(long, conflicts_with = "json")]
    pub quiet: bool,
    /// Refuse a file larger than this: bytes, or a size with a unit as in
    /// the configuration (10MiB binary, 10MB decimal). Default: 64MiB for
    /// MBMQTT01, 4GiB for format 21.
    #[arg(long, value_name = "SIZE", value_parser = saguin::config::units::parse_size)]
    pub max_bytes: Option<u64>,
}

pub fn run(cmd: Command) -> anyhow::Result<u8> {
    match cmd {
        Command::Inspect(args) => inspect(args),
        Command::Verify(args) => verify(args),
    }
}

fn scan_options(max_bytes: Option<u64>) -> ScanOptions {
    match max_bytes {
        Some(max) => ScanOptions::with_max_bytes(max),
        None => ScanOptions::default(),
    }
}

// ---------------------------------------------------------------------------
// verify

/// What verifying one file came to.
struct FileResult {
    path: PathBuf,
    format: Option<&'static str>,
    kind: Option<&'static str>,
    problem: Option<(&'static str, String)>,
    unreadable: bool,
}

fn verify(args: VerifyArgs) -> anyhow::Result<u8> {
    let opts = scan_options(args.max_bytes);
    let show_lines = !args.quiet && !args.json;
    let progress =
        (!args.quiet && std::io::stderr().is_terminal() && args.paths.len() > 3).then(|| {
            let bar = indicatif::ProgressBar::new(args.paths.len() as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {wide_msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
    let mut out = std::io::stdout().lock();
    let mut results: Vec<FileResult> = Vec::new();
    let mut findings: Vec<Value> = Vec::new();
    let mut warnings = 0usize;
    let mut dir_errors = 0usize;

    for path in &args.paths {
        if let Some(bar) = &progress {
            bar.set_message(path.display().to_string());
        }
        let is_dir = read::lstat(path)
            .ok()
            .is_some_and(|m| SpecialKind::of(&m) == Some(SpecialKind::Directory));
        let mut lines = Vec::new();
        if is_dir {
            // The checking scan runs the loader's decoder and checks but
            // keeps no record: a verdict costs about the largest file's size.
            match snapshot_dir::scan_checking(path, &opts) {
                Ok(report) => {
                    for f in &report.files {
                        let r = match &f.outcome {
                            FileOutcome::Decoded { file, .. } => FileResult {
                                path: f.path.clone(),
                                format: Some("f21"),
                                kind: Some(file.kind().as_str()),
                                problem: None,
                                unreadable: false,
                            },
                            FileOutcome::Failed(p) => failed(&f.path, p),
                            FileOutcome::NotConfigured | FileOutcome::NotCurrent => continue,
                        };
                        lines.push(result_line(&r));
                        results.push(r);
                    }
                    for finding in &report.findings {
                        // File refusals already have their FAIL line.
                        if matches!(finding, FindingKind::FileRefused { .. }) {
                            continue;
                        }
                        match finding.verdict() {
                            Verdict::Fail => {
                                dir_errors += 1;
                                lines.push(format!("FAIL {}: {finding}", path.display()));
                            }
                            Verdict::Warn => {
                                warnings += 1;
                                lines.push(format!("WARN {}: {finding}", path.display()));
                            }
                            // Files nobody asked for are in --json and
                            // `inspect`; a verify line per stray file would
                            // bury the answer.
                            Verdict::Info => {}
                        }
                        findings.push(finding_json(Some(path), finding));
                    }
                }
                Err(e) => {
                    let r = FileResult {
                        path: path.clone(),
                        format: None,
                        kind: None,
                        unreadable: e.is_unreadable(),
                        problem: Some(("directory", scan_error_reason(&e))),
                    };
                    lines.push(result_line(&r));
                    results.push(r);
                }
            }
        } else {
            let r = match snapshot_dir::check_snapshot_file(path, &opts) {
                Ok(AnySnapshot::F21 { file, .. }) => FileResult {
                    path: path.clone(),
                    format: Some("f21"),
                    kind: Some(file.kind().as_str()),
                    problem: None,
                    unreadable: false,
                },
                Ok(AnySnapshot::Mbmqtt(_)) => FileResult {
                    path: path.clone(),
                    format: Some("mbmqtt01"),
                    kind: Some("broker-snapshot"),
                    problem: None,
                    unreadable: false,
                },
                Err(p) => failed(path, &p),
            };
            lines.push(result_line(&r));
            results.push(r);
        }
        if show_lines {
            match &progress {
                Some(bar) => bar.suspend(|| write_lines(&mut out, &lines))?,
                None => write_lines(&mut out, &lines)?,
            }
        }
        if let Some(bar) = &progress {
            bar.inc(1);
        }
    }
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }

    let unreadable = results.iter().filter(|r| r.unreadable).count();
    let failed = results
        .iter()
        .filter(|r| r.problem.is_some() && !r.unreadable)
        .count();
    let ok = results.iter().filter(|r| r.problem.is_none()).count();
    let code = if unreadable > 0 {
        exit::CANNOT
    } else if failed > 0 || dir_errors > 0 {
        exit::NO
    } else {
        exit::OK
    };
    if args.json {
        let doc = json!({
            "results": results.iter().map(|r| json!({
                "path": r.path.display().to_string(),
                "status": if r.unreadable { "unreadable" } else if r.problem.is_some() { "fail" } else { "ok" },
                "format": r.format,
                "kind": r.kind,
                "problem": r.problem.as_ref().map(|(code, message)| json!({"code": code, "message": message})),
            })).collect::<Vec<_>>(),
            "findings": findings,
            "summary": {
                "checked": results.len(),
                "ok": ok,
                "failed": failed,
                "unreadable": unreadable,
                "warnings": warnings,
            },
            "exit_code": code,
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else if !args.quiet {
        let mut summary = format!(
            "{} checked: {ok} ok, {failed} failed, {unreadable} unreadable",
            plural(results.len(), "file")
        );
        if dir_errors > 0 {
            summary.push_str(&format!(", {}", plural(dir_errors, "directory error")));
        }
        if warnings > 0 {
            summary.push_str(&format!(", {}", plural(warnings, "warning")));
        }
        writeln!(out, "{summary}")?;
    }
    out.flush()?;
    Ok(code)
}

fn failed(path: &Path, p: &FileProblem) -> FileResult {
    let format = match p {
        FileProblem::F21 { .. } => Some("f21"),
        FileProblem::Mbmqtt { .. } => Some("mbmqtt01"),
        _ => None,
    };
    FileResult {
        path: path.to_path_buf(),
        format,
        kind: None,
        unreadable: p.is_unreadable(),
        problem: Some((p.code(), p.to_string())),
    }
}

fn scan_error_reason(e: &snapshot_dir::ScanError) -> String {
    match e {
        snapshot_dir::ScanError::Read(r) => r.reason(),
        snapshot_dir::ScanError::NotADirectory { kind, .. } => {
            format!("is {kind}, not a snapshot directory")
        }
    }
}

fn result_line(r: &FileResult) -> String {
    match &r.problem {
        None => format!("OK {}", r.path.display()),
        Some((_, message)) => format!("FAIL {}: {message}", r.path.display()),
    }
}

fn write_lines(out: &mut impl Write, lines: &[String]) -> std::io::Result<()> {
    for l in lines {
        writeln!(out, "{l}")?;
    }
    Ok(())
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn finding_json(dir: Option<&Path>, f: &FindingKind) -> Value {
    let mut v = json!({
        "severity": f.severity().as_str(),
        "verdict": f.verdict().as_str(),
        "code": f.code(),
        "file": f.file(),
        "message": f.to_string(),
    });
    if let (Some(dir), Some(obj)) = (dir, v.as_object_mut()) {
        obj.insert("path".into(), json!(dir.display().to_string()));
    }
    v
}

// ---------------------------------------------------------------------------
// inspect

/// What `--records`, `--limit` and `--channel` ask for.
struct View {
    records: bool,
    limit: Option<u64>,
    channel: Option<String>,
}

/// Rows of each list the summary shows without `--records`, so the
/// summary of a store of 100,000 retained messages or sessions fits a
/// screen; `--records` lists every row (at most `--limit`).
const SUMMARY_ROWS: usize = 10;

impl View {
    fn take<'a, T>(&self, items: &'a [T]) -> &'a [T] {
        match self.limit {
            Some(n) => items
                .get(..usize::try_from(n).unwrap_or(usize::MAX).min(items.len()))
                .unwrap_or(items),
            None => items,
        }
    }

    /// The rows of a list a human table shows: every one (up to `--limit`)
    /// with `--records`, the first [`SUMMARY_ROWS`] without; and how many
    /// are left out.
    fn rows<'a, T>(&self, items: &'a [T]) -> (&'a [T], usize) {
        let shown = if self.records {
            self.take(items)
        } else {
            items.get(..SUMMARY_ROWS.min(items.len())).unwrap_or(items)
        };
        (shown, items.len() - shown.len())
    }
}

/// The line under a table that left rows out, naming how many.
fn more_rows(out: &mut impl Write, hidden: usize, what: &str, view: &View) -> std::io::Result<()> {
    if hidden == 0 {
        return Ok(());
    }
    if view.records {
        writeln!(out, "... {hidden} more {what} (past --limit)")
    } else {
        writeln!(out, "... {hidden} more {what} (--records lists them all)")
    }
}

fn inspect(args: InspectArgs) -> anyhow::Result<u8> {
    let opts = scan_options(args.max_bytes);
    let view = View {
        records: args.records,
        limit: args.limit,
        channel: args.channel.clone(),
    };
    let path = &args.path;
    let meta = match read::lstat(path) {
        Ok(m) => m,
        Err(e) => {
            return fail_inspect(&args, None, ("not-found", e.reason()), exit::CANNOT);
        }
    };
    // Records are shown only with --records (at most --limit of them):
    // the rest are counted as they are read, and not kept.
    let mut sample = Sample::keeping(if view.records { view.limit } else { Some(0) });
    if SpecialKind::of(&meta) == Some(SpecialKind::Directory) {
        return match snapshot_dir::scan_with(path, &opts, Records::Into(&mut sample)) {
            Ok(report) => inspect_dir(&args, &view, &report, &sample),
            Err(e) => {
                let code = if e.is_unreadable() {
                    exit::CANNOT
                } else {
                    exit::NO
                };
                fail_inspect(&args, None, ("directory", scan_error_reason(&e)), code)
            }
        };
    }
    match snapshot_dir::read_snapshot_file_with(path, &opts, None, Records::Into(&mut sample)) {
        Ok(AnySnapshot::F21 { header, file }) => {
            let counts = sample.counts();
            if let Some(name) = &view.channel {
                if let SnapshotFile::Channel(c) = &file {
                    if &c.name != name {
                        anyhow::bail!(
                            "snapshot {}: holds channel {:?}, not {name:?}",
                            path.display(),
                            c.name
                        );
                    }
                }
            }
            if args.json {
                print_json(&json!({
                    "path": path.display().to_string(),
                    "type": "f21",
                    "valid": true,
                    "problem": null,
                    "header": header_json(&header),
                    "contents": contents_json(&file, &counts, &view),
                    "files": [],
                    "findings": [],
                }))?;
            } else {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", path.display())?;
                print_header(&mut out, &header)?;
                print_contents(&mut out, &file, &counts, &view)?;
            }
            Ok(exit::OK)
        }
        Ok(AnySnapshot::Mbmqtt(snapshot)) => {
            if args.json {
                print_json(&json!({
                    "path": path.display().to_string(),
                    "type": "mbmqtt01",
                    "valid": true,
                    "problem": null,
                    "header": {"format": "MBMQTT01", "version": snapshot.version_read},
                    "contents": mbmqtt_json(&snapshot, &view),
                    "files": [],
                    "findings": [],
                }))?;
            } else {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", path.display())?;
                print_mbmqtt(&mut out, &snapshot, &view)?;
            }
            Ok(exit::OK)
        }
        Err(p) => {
            let header = match &p {
                FileProblem::F21 { header, .. } => header.clone(),
                _ => None,
            };
            let code = if p.is_unreadable() {
                exit::CANNOT
            } else {
                exit::NO
            };
            fail_inspect(&args, header.as_ref(), (p.code(), p.to_string()), code)
        }
    }
}

/// A PATH that is not a valid snapshot: show what is known (the header of a
/// file of another version), name the problem, exit `code`.
fn fail_inspect(
    args: &InspectArgs,
    header: Option<&Header>,
    (code_name, message): (&str, String),
    code: u8,
) -> anyhow::Result<u8> {
    let path = &args.path;
    if args.json {
        print_json(&json!({
            "path": path.display().to_string(),
            "type": header.map(|_| "f21"),
            "valid": false,
            "problem": {"code": code_name, "message": message},
            "header": header.map(header_json),
            "contents": null,
            "files": [],
            "findings": [],
        }))?;
    } else if let Some(h) = header {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", path.display())?;
        print_header(&mut out, h)?;
    }
    let mut err = std::io::stderr().lock();
    writeln!(err, "saguin: snapshot {}: {message}", path.display())?;
    Ok(code)
}

fn print_json(v: &Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

fn header_json(h: &Header) -> Value {
    json!({
        "format": h.format_version,
        "kind": h.file_kind().map(|k| k.as_str()),
        "kind_byte": h.kind,
        "writer": h.writer,
        "written_at": time_json(h.written_at),
        "written_at_unix_nanos": h.written_at,
    })
}

fn print_header(out: &mut impl Write, h: &Header) -> std::io::Result<()> {
    let mut t = table();
    t.set_header(vec!["format", "kind", "writer", "written at"]);
    t.add_row(vec![
        h.format_version.to_string(),
        h.file_kind()
            .map(|k| k.as_str().to_string())
            .unwrap_or_else(|| format!("unknown ({})", h.kind)),
        cell(&h.writer),
        time_text(h.written_at),
    ]);
    writeln!(out, "{t}")
}

/// A record as RECORD ([`RecordJson`]).
fn record_json(r: &Record) -> Value {
    RecordJson::new(r).to_value()
}

fn held_json(h: &HeldPublish) -> Value {
    json!({
        "client_id": h.client_id,
        "packet_id": h.packet_id,
        "held_at": time_json(h.held_at),
        "topic": h.record.topic,
        "record": record_json(&h.record),
    })
}

fn records_table(records: &[Record]) -> Table {
    let mut t = table();
    t.set_header(vec![
        "offset",
        "time",
        "topic",
        "qos",
        "payload",
        "properties",
    ]);
    for r in records {
        t.add_row(vec![
            r.offset.to_string(),
            time_text(r.timestamp),
            cell(&r.topic),
            r.qos.to_string(),
            payload_cell(&r.payload),
            props_cell(&r.user_properties, &r.props),
        ]);
    }
    t
}

fn positions_json(ps: &[Position]) -> Vec<Value> {
    ps.iter()
        .map(|p| {
            json!({
                "reader": p.reader,
                "offset": p.offset,
                "saved_at": time_json(p.saved_at),
                "session_expiry": p.session_expiry,
            })
        })
        .collect()
}

fn print_positions(
    out: &mut impl Write,
    title: &str,
    ps: &[Position],
    view: &View,
) -> std::io::Result<()> {
    let (shown, hidden) = view.rows(ps);
    writeln!(out, "{title}:\n{}", positions_table(shown))?;
    more_rows(out, hidden, "positions", view)
}

fn positions_table(ps: &[Position]) -> Table {
    let mut t = table();
    t.set_header(vec!["reader", "position", "saved at", "session expiry"]);
    for p in ps {
        t.add_row(vec![
            cell(&p.reader),
            p.offset.to_string(),
            time_text(p.saved_at),
            p.session_expiry
                .map(|s| format!("{s}s"))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    t
}

/// A file's contents as JSON; `counts` are its record lists' lengths,
/// which the decoded lists keep only the shown rows of.
fn contents_json(file: &SnapshotFile, counts: &ListCounts, view: &View) -> Value {
    let with_records = |mut v: Value, records: &[Record]| {
        if view.records {
            if let Some(o) = v.as_object_mut() {
                o.insert(
                    "records".into(),
                    Value::Array(view.take(records).iter().map(record_json).collect()),
                );
            }
        }
        v
    };
    match file {
        SnapshotFile::Channel(c) => channel_json(c, counts, view),
        SnapshotFile::Manifest(m) => manifest_json(m),
        SnapshotFile::Generation(g) => generation_json(g),
        SnapshotFile::Retained(r) => with_records(
            json!({"kind": "retained", "record_count": r.records.len(),
                   "topics": r.records.iter().map(|r| &r.topic).collect::<Vec<_>>()}),
            &r.records,
        ),
        SnapshotFile::Sessions(s) => sessions_json(s),
        SnapshotFile::Broadcast(b) => with_records(
            json!({
                "kind": "broadcast",
                "next": b.next,
                "floor": b.floor,
                "bytes": b.bytes,
                "record_count": counts.messages,
                "cursors": positions_json(&b.cursors),
                "held": b.held.iter().map(held_json).collect::<Vec<_>>(),
            }),
            &b.messages,
        ),
    }
}

fn channel_json(c: &ChannelFile, counts: &ListCounts, view: &View) -> Value {
    let mut v = json!({
        "kind": "channel",
        "channel": c.name,
        "channel_kind": c.kind.as_str(),
        "next": c.next,
        "floor": c.floor,
        "bytes": c.bytes,
        "record_count": counts.records,
        "item_count": counts.items,
        "positions": positions_json(&c.positions),
        "held": c.held.iter().map(held_json).collect::<Vec<_>>(),
        "dead_letter": c.dead_letter.as_ref().map(|d| json!({
            "channel": d.name, "next": d.next, "floor": d.floor, "bytes": d.bytes,
            "record_count": counts.dead_letter, "positions": positions_json(&d.positions),
        })),
    });
    if view.records {
        if let Some(d) = v.get_mut("dead_letter").and_then(Value::as_object_mut) {
            if let Some(dl) = &c.dead_letter {
                d.insert(
                    "records".into(),
                    Value::Array(view.take(&dl.records).iter().map(record_json).collect()),
                );
            }
        }
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "records".into(),
                Value::Array(view.take(&c.records).iter().map(record_json).collect()),
            );
            o.insert(
                "items".into(),
                Value::Array(
                    view.take(&c.items)
                        .iter()
                        .map(|i| {
                            RecordJson::new(&i.record)
                                .queue_item(i.attempts, i.first_delivered, i.last_delivered)
                                .to_value()
                        })
                        .collect(),
                ),
            );
        }
    }
    v
}

fn manifest_json(m: &Manifest) -> Value {
    json!({
        "kind": "manifest",
        "began_at": time_json(m.began_at),
        "began_at_unix_nanos": m.began_at,
        "channels": m.channels.iter().map(|e| json!({"channel": e.channel, "file": e.file_name, "channel_kind": e.kind.as_str()})).collect::<Vec<_>>(),
        "retained": m.retained,
        "sessions": m.sessions,
        "broadcast": m.broadcast,
    })
}

fn generation_json(g: &Generation) -> Value {
    json!({
        "kind": "generation",
        "generation": g.generation,
        "captured_at": time_json(g.captured_at),
        "captured_at_unix_nanos": g.captured_at,
        "files": g.files.iter().map(|f| json!({
            "kind": f.kind.as_str(),
            "channel": (!f.channel.is_empty()).then_some(&f.channel),
            "file": f.file_name,
            "generation": f.generation,
            "written_at": time_json(f.written_at),
            "written_at_unix_nanos": f.written_at,
            "length": f.length,
            "checksum": format!("{:08x}", f.checksum),
            "behind": f.behind,
        })).collect::<Vec<_>>(),
    })
}

/// Either manifest a directory holds.
fn dir_manifest_json(m: &DirManifest) -> Value {
    match m {
        DirManifest::Shutdown(m) => manifest_json(m),
        DirManifest::Generation(g) => generation_json(g),
    }
}

fn sessions_json(s: &SessionsFile) -> Value {
    json!({
        "kind": "sessions",
        "sessions": s.sessions.iter().map(session_json).collect::<Vec<_>>(),
        "shared_groups": s.shared_groups.iter().map(|g| json!({
            "group": g.key.group, "filter": g.key.filter, "cursor": g.cursor, "returned": g.returned,
        })).collect::<Vec<_>>(),
    })
}

fn print_contents(
    out: &mut impl Write,
    file: &SnapshotFile,
    counts: &ListCounts,
    view: &View,
) -> std::io::Result<()> {
    match file {
        SnapshotFile::Channel(c) => print_channel(out, c, counts, view),
        SnapshotFile::Manifest(m) => print_manifest(out, m),
        SnapshotFile::Generation(g) => print_generation(out, g),
        SnapshotFile::Retained(r) => print_retained(out, r, view),
        SnapshotFile::Sessions(s) => print_sessions(out, s, view),
        SnapshotFile::Broadcast(b) => print_broadcast(out, b, counts, view),
    }
}

fn print_channel(
    out: &mut impl Write,
    c: &ChannelFile,
    counts: &ListCounts,
    view: &View,
) -> std::io::Result<()> {
    let mut t = table();
    t.set_header(vec![
        "channel",
        "kind",
        "next",
        "floor",
        "bytes",
        "records",
        "items",
        "positions",
        "held",
    ]);
    t.add_row(vec![
        c.name.clone(),
        c.kind.as_str().into(),
        c.next.to_string(),
        c.floor.to_string(),
        c.bytes.to_string(),
        counts.records.to_string(),
        counts.items.to_string(),
        c.positions.len().to_string(),
        c.held.len().to_string(),
    ]);
    if let Some(d) = &c.dead_letter {
        t.add_row(vec![
            d.name.clone(),
            "append (dead letters)".into(),
            d.next.to_string(),
            d.floor.to_string(),
            d.bytes.to_string(),
            counts.dead_letter.to_string(),
            "-".into(),
            d.positions.len().to_string(),
            "-".into(),
        ]);
    }
    writeln!(out, "{t}")?;
    if !c.positions.is_empty() {
        print_positions(out, &format!("positions of {}", c.name), &c.positions, view)?;
    }
    if let Some(d) = c.dead_letter.as_ref().filter(|d| !d.positions.is_empty()) {
        print_positions(out, &format!("positions of {}", d.name), &d.positions, view)?;
    }
    print_held(out, &c.held, view)?;
    if view.records {
        if counts.records > 0 || counts.items == 0 {
            writeln!(
                out,
                "records of {}:\n{}",
                c.name,
                records_table(view.take(&c.records))
            )?;
        }
        if counts.items > 0 {
            let mut t = table();
            t.set_header(vec![
                "offset",
                "time",
                "topic",
                "payload",
                "attempts",
                "last delivered",
            ]);
            for i in view.take(&c.items) {
                t.add_row(vec![
                    i.record.offset.to_string(),
                    time_text(i.record.timestamp),
                    cell(&i.record.topic),
                    payload_cell(&i.record.payload),
                    i.attempts.to_string(),
                    time_text(i.last_delivered),
                ]);
            }
            writeln!(out, "queue items of {}:\n{t}", c.name)?;
        }
        if let Some(d) = &c.dead_letter {
            writeln!(
                out,
                "records of {}:\n{}",
                d.name,
                records_table(view.take(&d.records))
            )?;
        }
    }
    Ok(())
}

/// The exactly-once publishes held before their PUBREL; with `--records`
/// each shows its whole message (payload and properties) too.
fn print_held(out: &mut impl Write, held: &[HeldPublish], view: &View) -> std::io::Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    let mut t = table();
    let mut header = vec!["client id", "packet id", "held at", "topic"];
    if view.records {
        header.extend(["qos", "retain", "payload", "properties"]);
    }
    t.set_header(header);
    let (shown, hidden) = view.rows(held);
    for h in shown {
        let mut row = vec![
            cell(&h.client_id),
            h.packet_id.to_string(),
            time_text(h.held_at),
            cell(&h.record.topic),
        ];
        if view.records {
            row.extend([
                h.record.qos.to_string(),
                h.record.retain.to_string(),
                payload_cell(&h.record.payload),
                props_cell(&h.record.user_properties, &h.record.props),
            ]);
        }
        t.add_row(row);
    }
    writeln!(out, "exactly-once publishes held:\n{t}")?;
    more_rows(out, hidden, "held publishes", view)
}

fn print_generation(out: &mut impl Write, g: &Generation) -> std::io::Result<()> {
    writeln!(
        out,
        "generation {}, the state at {}",
        g.generation,
        time_text(g.captured_at)
    )?;
    let mut t = table();
    t.set_header(vec![
        "holds",
        "file",
        "written by",
        "written at",
        "bytes",
        "behind",
    ]);
    for f in &g.files {
        t.add_row(vec![
            if f.channel.is_empty() {
                f.kind.as_str().to_owned()
            } else {
                format!("channel {}", f.channel)
            },
            f.file_name.clone(),
            if f.generation == 0 {
                "a build before generations".to_owned()
            } else {
                format!("generation {}", f.generation)
            },
            time_text(f.written_at),
            f.length.to_string(),
            yes_no(f.behind).to_owned(),
        ]);
    }
    writeln!(out, "{t}")
}

fn print_manifest(out: &mut impl Write, m: &Manifest) -> std::io::Result<()> {
    writeln!(out, "shutdown began at {}", time_text(m.began_at))?;
    let mut t = table();
    t.set_header(vec!["channel", "file", "kind"]);
    for e in &m.channels {
        t.add_row(vec![
            e.channel.clone(),
            e.file_name.clone(),
            e.kind.as_str().into(),
        ]);
    }
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "also written: retained store {}, sessions {}, broadcast log {}",
        yes_no(m.retained),
        yes_no(m.sessions),
        yes_no(m.broadcast)
    )
}

/// How long ago a moment was, by this machine's clock.
fn age_text(nanos: i64) -> String {
    let ago = saguin::storage::contract::now_nanos().saturating_sub(nanos);
    match u64::try_from(ago) {
        Ok(ago) => humantime::format_duration(std::time::Duration::from_millis(ago / 1_000_000))
            .to_string(),
        Err(_) => "in the future by this machine's clock".to_owned(),
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn print_retained(out: &mut impl Write, r: &RetainedFile, view: &View) -> std::io::Result<()> {
    writeln!(out, "{} retained messages", r.records.len())?;
    let mut t = table();
    t.set_header(vec!["topic", "qos", "time", "payload"]);
    let (shown, hidden) = view.rows(&r.records);
    for rec in shown {
        t.add_row(vec![
            cell(&rec.topic),
            rec.qos.to_string(),
            time_text(rec.timestamp),
            payload_cell(&rec.payload),
        ]);
    }
    writeln!(out, "{t}")?;
    more_rows(out, hidden, "retained messages", view)
}

fn print_sessions(out: &mut impl Write, s: &SessionsFile, view: &View) -> std::io::Result<()> {
    let mut t = table();
    t.set_header(vec![
        "client id",
        "principal",
        "expiry",
        "detached at",
        "window",
        "subscriptions",
        "in flight",
        "will",
    ]);
    let (sessions, hidden_sessions) = view.rows(&s.sessions);
    for s in sessions {
        t.add_row(vec![
            cell(&s.client_id),
            s.principal.as_deref().map_or_else(|| "-".into(), cell),
            format!("{}s", s.expiry_interval),
            time_text(s.detached_at),
            s.window.to_string(),
            s.subscriptions.len().to_string(),
            s.inflight.len().to_string(),
            s.will
                .as_ref()
                .map(|w| cell(&w.topic))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    writeln!(out, "{} sessions\n{t}", s.sessions.len())?;
    more_rows(out, hidden_sessions, "sessions", view)?;
    let mut t = table();
    t.set_header(vec!["client id", "filter", "qos", "options", "log offset"]);
    let subscriptions: Vec<_> = s
        .sessions
        .iter()
        .flat_map(|s| s.subscriptions.iter().map(move |sub| (s, sub)))
        .collect();
    let (shown_subscriptions, hidden_subscriptions) = view.rows(&subscriptions);
    let any = !subscriptions.is_empty();
    for (s, sub) in shown_subscriptions {
        {
            let mut opts = Vec::new();
            if sub.no_local {
                opts.push("no-local".to_string());
            }
            if sub.retain_as_published {
                opts.push("retain-as-published".into());
            }
            opts.push(format!("retain-handling={}", sub.retain_handling));
            if let Some(id) = sub.subscription_id {
                opts.push(format!("id={id}"));
            }
            t.add_row(vec![
                cell(&s.client_id),
                cell(&sub.filter),
                sub.qos.to_string(),
                opts.join(", "),
                sub.log_offset.to_string(),
            ]);
        }
    }
    if any {
        writeln!(out, "subscriptions:\n{t}")?;
        more_rows(out, hidden_subscriptions, "subscriptions", view)?;
    }
    if view.records && s.sessions.iter().any(|s| s.will.is_some()) {
        let mut t = table();
        t.set_header(vec![
            "client id",
            "topic",
            "qos",
            "retain",
            "delay",
            "payload",
            "properties",
        ]);
        for (client_id, w) in s
            .sessions
            .iter()
            .filter_map(|s| s.will.as_ref().map(|w| (&s.client_id, w)))
        {
            t.add_row(vec![
                cell(client_id),
                cell(&w.topic),
                w.qos.to_string(),
                w.retain.to_string(),
                format!("{}s", w.delay_interval),
                payload_cell(&w.payload),
                props_cell(&w.user_properties, &w.props),
            ]);
        }
        writeln!(out, "wills:\n{t}")?;
    }
    if !s.shared_groups.is_empty() {
        let mut t = table();
        t.set_header(vec!["group", "filter", "cursor", "returned"]);
        let (groups, hidden_groups) = view.rows(&s.shared_groups);
        for g in groups {
            t.add_row(vec![
                cell(&g.key.group),
                cell(&g.key.filter),
                g.cursor.to_string(),
                g.returned.len().to_string(),
            ]);
        }
        writeln!(out, "shared groups:\n{t}")?;
        more_rows(out, hidden_groups, "shared groups", view)?;
    }
    Ok(())
}

fn print_broadcast(
    out: &mut impl Write,
    b: &BroadcastFile,
    counts: &ListCounts,
    view: &View,
) -> std::io::Result<()> {
    let mut t = table();
    t.set_header(vec![
        "log", "next", "floor", "bytes", "messages", "cursors", "held",
    ]);
    t.add_row(vec![
        "broadcast".to_string(),
        b.next.to_string(),
        b.floor.to_string(),
        b.bytes.to_string(),
        counts.messages.to_string(),
        b.cursors.len().to_string(),
        b.held.len().to_string(),
    ]);
    writeln!(out, "{t}")?;
    if !b.cursors.is_empty() {
        print_positions(out, "session cursors", &b.cursors, view)?;
    }
    print_held(out, &b.held, view)?;
    if view.records {
        writeln!(out, "messages:\n{}", records_table(view.take(&b.messages)))?;
    }
    Ok(())
}

// ---- MBMQTT01 ---------------------------------------------------------------

fn detach_text(d: &mbmqtt::Detach) -> String {
    match d {
        mbmqtt::Detach::Unknown => "unknown".into(),
        mbmqtt::Detach::Millis(ms) => match i64::try_from(*ms)
            .ok()
            .and_then(|ms| ms.checked_mul(1_000_000))
        {
            Some(0) => "0 (1970-01-01T00:00:00Z)".into(),
            Some(n) => format_unix_nanos(n),
            None => format!("{ms} ms"),
        },
    }
}

fn principal_text(p: &mbmqtt::Principal) -> String {
    match p {
        mbmqtt::Principal::Named(n) if n.is_empty() => "(empty)".into(),
        mbmqtt::Principal::Named(n) => n.clone(),
        mbmqtt::Principal::LegacyAnonymous => "legacy-anonymous".into(),
    }
}

fn mbmqtt_message_json(m: &mbmqtt::Message) -> Value {
    json!({
        "topic": m.topic,
        "qos": m.qos,
        "retain": m.retain,
        "payload_bytes": m.payload.len(),
        "payload_text": payload_text(&m.payload),
        "payload_hex": hex::encode(&m.payload),
    })
}

fn mbmqtt_json(s: &mbmqtt::Snapshot, view: &View) -> Value {
    json!({
        "kind": "mbmqtt01",
        "version": s.version_read,
        "sessions": s.sessions.iter().map(|x| json!({
            "client_id": x.client_id,
            "principal": match &x.principal { mbmqtt::Principal::Named(n) => json!(n), mbmqtt::Principal::LegacyAnonymous => Value::Null },
            "legacy_anonymous": x.principal == mbmqtt::Principal::LegacyAnonymous,
            "detach_millis": match x.detach { mbmqtt::Detach::Millis(ms) => json!(ms), mbmqtt::Detach::Unknown => Value::Null },
            "next_packet_id": x.next_packet_id,
            "subscriptions": x.subscriptions.iter().map(|s| json!({"filter": s.filter, "qos": s.qos})).collect::<Vec<_>>(),
            "inbound_qos2": x.inbound_qos2,
            "inflight": view.take(&x.inflight).iter().map(|i| json!({
                "packet_id": i.packet_id,
                "phase": i.phase.as_str(),
                "message": i.message.as_ref().map(mbmqtt_message_json),
            })).collect::<Vec<_>>(),
            "pending": view.take(&x.pending).iter().map(mbmqtt_message_json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "retained": view.take(&s.retained).iter().map(|r| json!({
            "topic": r.topic,
            "qos": r.qos,
            "payload_bytes": r.payload.len(),
            "payload_text": payload_text(&r.payload),
            "payload_hex": hex::encode(&r.payload),
        })).collect::<Vec<_>>(),
    })
}

fn print_mbmqtt(out: &mut impl Write, s: &mbmqtt::Snapshot, view: &View) -> std::io::Result<()> {
    writeln!(
        out,
        "MBMQTT01 broker.snapshot, Disk V{}: {} sessions, {} retained messages",
        s.version_read,
        s.sessions.len(),
        s.retained.len()
    )?;
    let mut t = table();
    t.set_header(vec![
        "client id",
        "principal",
        "detached at",
        "next packet id",
        "subscriptions",
        "inbound QoS 2",
        "in flight",
        "pending",
    ]);
    let (sessions, hidden_sessions) = view.rows(&s.sessions);
    for x in sessions {
        t.add_row(vec![
            cell(&x.client_id),
            cell(&principal_text(&x.principal)),
            detach_text(&x.detach),
            x.next_packet_id.to_string(),
            x.subscriptions.len().to_string(),
            format!("{:?}", x.inbound_qos2),
            x.inflight.len().to_string(),
            x.pending.len().to_string(),
        ]);
    }
    writeln!(out, "{t}")?;
    more_rows(out, hidden_sessions, "sessions", view)?;
    let mut t = table();
    t.set_header(vec!["client id", "filter", "qos"]);
    let subscriptions: Vec<_> = s
        .sessions
        .iter()
        .flat_map(|x| x.subscriptions.iter().map(move |sub| (x, sub)))
        .collect();
    let (shown, hidden) = view.rows(&subscriptions);
    for (x, sub) in shown {
        t.add_row(vec![
            cell(&x.client_id),
            cell(&sub.filter),
            sub.qos.to_string(),
        ]);
    }
    if !subscriptions.is_empty() {
        writeln!(out, "subscriptions:\n{t}")?;
        more_rows(out, hidden, "subscriptions", view)?;
    }
    if view.records {
        let mut t = table();
        t.set_header(vec![
            "client id",
            "where",
            "packet id",
            "topic",
            "qos",
            "retain",
            "payload",
        ]);
        for x in &s.sessions {
            for i in view.take(&x.inflight) {
                let (topic, qos, retain, payload) = match &i.message {
                    Some(m) => (
                        cell(&m.topic),
                        m.qos.to_string(),
                        m.retain.to_string(),
                        payload_cell(&m.payload),
                    ),
                    None => ("-".into(), "2".into(), "-".into(), "-".into()),
                };
                t.add_row(vec![
                    cell(&x.client_id),
                    format!("in flight, {}", i.phase.as_str()),
                    i.packet_id.to_string(),
                    topic,
                    qos,
                    retain,
                    payload,
                ]);
            }
            for m in view.take(&x.pending) {
                t.add_row(vec![
                    cell(&x.client_id),
                    "pending".into(),
                    "-".into(),
                    cell(&m.topic),
                    m.qos.to_string(),
                    m.retain.to_string(),
                    payload_cell(&m.payload),
                ]);
            }
        }
        writeln!(out, "messages:\n{t}")?;
    }
    let mut t = table();
    t.set_header(vec!["retained topic", "qos", "payload"]);
    let (retained, hidden) = view.rows(&s.retained);
    for r in retained {
        t.add_row(vec![
            cell(&r.topic),
            r.qos.to_string(),
            payload_cell(&r.payload),
        ]);
    }
    writeln!(out, "{t}")?;
    more_rows(out, hidden, "retained messages", view)
}

// ---- directories ---------------------------------------------------------

fn inspect_dir(
    args: &InspectArgs,
    view: &View,
    report: &DirReport,
    sample: &Sample,
) -> anyhow::Result<u8> {
    let wanted = |f: &snapshot_dir::FileReport| match &view.channel {
        None => true,
        Some(name) => matches!(&f.role, snapshot_dir::Role::Channel(Some(c)) if c == name),
    };
    if let Some(name) = &view.channel {
        if !report.files.iter().any(wanted) {
            writeln!(
                std::io::stderr(),
                "saguin: snapshot {}: no channel named {name:?} (saguin snapshot inspect {} lists them)",
                report.dir.display(),
                report.dir.display()
            )?;
            return Ok(exit::CANNOT);
        }
    }
    let code = if report.has_unreadable() {
        exit::CANNOT
    } else if report.is_loadable() {
        exit::OK
    } else {
        exit::NO
    };
    if args.json {
        let files: Vec<Value> = report
            .files
            .iter()
            .filter(|f| wanted(f))
            .map(|f| {
                let (status, problem, header, contents) = match &f.outcome {
                    FileOutcome::Decoded { header, file } => (
                        "ok",
                        Value::Null,
                        header_json(header),
                        contents_json(file, &sample.counts_of(&f.name), view),
                    ),
                    FileOutcome::Failed(p) => (
                        if p.is_unreadable() {
                            "unreadable"
                        } else {
                            "fail"
                        },
                        json!({"code": p.code(), "message": p.to_string()}),
                        match p {
                            FileProblem::F21 {
                                header: Some(h), ..
                            } => header_json(h),
                            _ => Value::Null,
                        },
                        Value::Null,
                    ),
                    FileOutcome::NotConfigured => {
                        ("not-read", Value::Null, Value::Null, Value::Null)
                    }
                    FileOutcome::NotCurrent => {
                        ("not-current", Value::Null, Value::Null, Value::Null)
                    }
                };
                json!({
                    "name": f.name,
                    "role": f.role.as_str(),
                    "generation": f.generation,
                    "status": status,
                    "problem": problem,
                    "header": header,
                    "contents": contents,
                })
            })
            .collect();
        print_json(&json!({
            "path": report.dir.display().to_string(),
            "type": "directory",
            "valid": report.verifies(),
            "problem": null,
            "header": null,
            "contents": null,
            "manifest": report.manifest.as_ref().map(|(_, m)| dir_manifest_json(m)),
            "files": files,
            "findings": report.findings.iter().map(|f| finding_json(None, f)).collect::<Vec<_>>(),
        }))?;
        return Ok(code);
    }

    let mut out = std::io::stdout().lock();
    writeln!(out, "snapshot directory {}", report.dir.display())?;
    match &report.manifest {
        Some((header, DirManifest::Generation(g))) => writeln!(
            out,
            "manifest: generation {}, the state at {} ({} ago), committed at {}, {} files listed",
            g.generation,
            time_text(g.captured_at),
            age_text(g.captured_at),
            time_text(header.written_at),
            g.files.len()
        )?,
        Some((_, DirManifest::Shutdown(m))) => writeln!(
            out,
            "manifest: shutdown began at {}, {} channels listed",
            time_text(m.began_at),
            m.channels.len()
        )?,
        None => writeln!(out, "manifest: none usable")?,
    }
    let mut t = table();
    t.set_header(vec![
        "file",
        "kind",
        "status",
        "written at",
        "channel",
        "next",
        "floor",
        "bytes",
        "records",
    ]);
    for f in report.files.iter().filter(|f| wanted(f)) {
        let mut row = vec![cell(&f.name), f.role.as_str().to_string()];
        match &f.outcome {
            FileOutcome::Decoded { header, file } => {
                row.push("ok".into());
                row.push(time_text(header.written_at));
                match file {
                    SnapshotFile::Channel(c) => row.extend([
                        c.name.clone(),
                        c.next.to_string(),
                        c.floor.to_string(),
                        c.bytes.to_string(),
                        {
                            let counts = sample.counts_of(&f.name);
                            (counts.records + counts.items).to_string()
                        },
                    ]),
                    SnapshotFile::Broadcast(b) => row.extend([
                        "-".into(),
                        b.next.to_string(),
                        b.floor.to_string(),
                        b.bytes.to_string(),
                        sample.counts_of(&f.name).messages.to_string(),
                    ]),
                    SnapshotFile::Retained(r) => row.extend([
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        r.records.len().to_string(),
                    ]),
                    SnapshotFile::Sessions(s) => row.extend([
                        format!("{} sessions", s.sessions.len()),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                    ]),
                    SnapshotFile::Manifest(m) => row.extend([
                        format!("{} listed", m.channels.len()),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                    ]),
                    SnapshotFile::Generation(g) => row.extend([
                        format!("generation {}, {} listed", g.generation, g.files.len()),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                    ]),
                }
            }
            FileOutcome::Failed(p) => {
                row.push(
                    if p.is_unreadable() {
                        "unreadable"
                    } else {
                        "FAILED"
                    }
                    .into(),
                );
                row.extend(std::iter::repeat_n("-".to_string(), 6));
            }
            FileOutcome::NotConfigured => {
                row.push("not read".into());
                row.extend(std::iter::repeat_n("-".to_string(), 6));
            }
            FileOutcome::NotCurrent => {
                row.push(format!("not current (generation {})", f.generation));
                row.extend(std::iter::repeat_n("-".to_string(), 6));
            }
        }
        t.add_row(row);
    }
    writeln!(out, "{t}")?;
    for f in &report.findings {
        if view.channel.is_some()
            && f.file()
                .is_some_and(|file| !report.files.iter().any(|r| r.name == file && wanted(r)))
        {
            continue;
        }
        // Verify's verdict, so that the two commands print one tag for one
        // finding (see `DirReport::verifies`).
        let tag = match f.verdict() {
            Verdict::Fail => "FAIL",
            Verdict::Warn => "WARN",
            Verdict::Info => "INFO",
        };
        writeln!(out, "{tag} {}: {f}", report.dir.display())?;
    }
    // Details of every decoded file (the manifest's is above).
    for f in report.files.iter().filter(|f| wanted(f)) {
        if let FileOutcome::Decoded { file, .. } = &f.outcome {
            if matches!(
                file,
                SnapshotFile::Manifest(_) | SnapshotFile::Generation(_)
            ) {
                continue;
            }
            if matches!(file, SnapshotFile::Channel(_)) && !view.records {
                // The summary row above says it all; positions are shown
                // when there are any.
                if let SnapshotFile::Channel(c) = file {
                    if !c.positions.is_empty() {
                        writeln!(out)?;
                        print_positions(
                            &mut out,
                            &format!("positions of {}", c.name),
                            &c.positions,
                            view,
                        )?;
                    }
                }
                continue;
            }
            writeln!(out, "\n{}:", f.name)?;
            print_contents(&mut out, file, &sample.counts_of(&f.name), view)?;
        }
    }
    Ok(code)
}
