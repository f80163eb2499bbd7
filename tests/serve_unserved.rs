//! What `saguin serve` serves and what it refuses, as a process. Append
//! channels are served: each opened in its provider before anything
//! listens, stated once at startup, swept by retention, and written or
//! checkpointed at the stop. Latest and queue channels (with a queue's
//! dead-letter channel) are served too, so a configuration check-config
//! accepts is one serve serves.

mod broker_support;

use std::path::Path;
use std::process::{Command, Output};

use broker_support::{append_store, field, Broker};
use saguin::storage::contract::{Position, Provider, Reader};
use saguin::storage::generation::save_snapshot;
use saguin::storage::memory::{MemoryConfig, MemoryProvider};
use saguin::storage::snapshot_write::SnapshotOptions;
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
use saguin_format::model::{ChannelKind, Record};

const SECOND: i64 = 1_000_000_000;

fn saguin(args: &[&str], config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run saguin")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A configuration with one listener on port 0, a sqlite provider `db`
/// in `dir`, and `channels` (YAML list items).
fn sqlite_config(dir: &Path, channels: &str) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
         auth:\n  allow_anonymous: true\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         channels:\n{channels}",
        dir.join("saguin.db").display()
    )
}

fn write_config(dir: &Path, yaml: &str) -> std::path::PathBuf {
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, yaml).expect("write config");
    path
}

fn now() -> i64 {
    saguin::storage::contract::now_nanos()
}

fn record(channel: &str, payload: &str, timestamp: i64) -> Record {
    Record {
        timestamp,
        qos: 1,
        client_id: "producer".into(),
        ..Record::new(format!("{channel}/device"), payload.to_owned())
    }
}

fn position(client: &str, offset: u64, saved_at: i64, expiry: u32) -> Position {
    Position {
        reader: Reader::mqtt(client).expect("a reader"),
        offset,
        saved_at,
        session_expiry: Some(expiry),
    }
}

/// The position of bridge `name`: it has no session, so it never expires
/// and survives every restart.
fn bridge_position(name: &str, offset: u64) -> Position {
    Position {
        reader: Reader::bridge(name).expect("a reader"),
        offset,
        saved_at: now(),
        session_expiry: None,
    }
}

/// `db` holding channel `telemetry` with `records` and two positions:
/// `bridge:cloud` (which never expires) and `mqtt:gone` (a session that
/// expired while the broker was down).
fn sqlite_with_telemetry(db: &Path, records: &[Record]) -> u64 {
    let provider = SqliteProvider::open(SqliteOptions::new("db", db)).expect("open sqlite");
    let store = append_store(&provider, "telemetry");
    for r in records {
        store.append(r.clone()).expect("append");
    }
    store
        .save_position(bridge_position("cloud", 2))
        .expect("save");
    store
        .save_position(position("gone", 1, now() - 7200 * SECOND, 3600))
        .expect("save");
    let bytes = store.bytes();
    provider.close().expect("close");
    bytes
}

/// The log up to and including the `listening` line: everything the
/// start logged before it served.
fn startup_log(broker: &Broker) -> Vec<String> {
    broker.wait_log(|l| l.contains("msg=\"listening\""));
    broker.log.lock().unwrap().clone()
}

fn line<'a>(lines: &'a [String], msg: &str, channel: &str) -> Option<(usize, &'a String)> {
    lines.iter().enumerate().find(|(_, l)| {
        l.contains(&format!("msg=\"{msg}\"")) && field(l, "channel").as_deref() == Some(channel)
    })
}

#[test]
fn channels_of_every_kind_are_served_and_stated_once_at_startup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "{}broker:\n  session_storage: db\n",
        sqlite_config(
            dir.path(),
            "  - name: telemetry\n    kind: append\n    storage: db\n\
             \x20 - name: devices\n    kind: latest\n    storage: db\n\
             \x20 - name: jobs\n    kind: queue\n    storage: db\n    dlq_retention_bytes: 1MiB\n",
        )
    );
    let config = write_config(dir.path(), &yaml);
    let out = saguin(&["check-config"], &config);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("refuses"), "{}", stderr(&out));
    let mut broker = Broker::start_in(dir, &yaml);
    let lines = startup_log(&broker);
    for (channel, kind) in [
        ("telemetry", "append"),
        ("devices", "latest"),
        ("jobs", "queue"),
        ("jobs.dlq", "append"),
    ] {
        let (_, l) = line(&lines, "channel", channel)
            .unwrap_or_else(|| panic!("no channel line for {channel}: {lines:#?}"));
        assert_eq!(field(l, "kind").as_deref(), Some(kind), "{l}");
    }
    let (_, dlq) = line(&lines, "channel", "jobs.dlq").expect("the dead-letter channel");
    assert_eq!(
        field(dlq, "retention_bytes").as_deref(),
        Some("1048576"),
        "{dlq}"
    );
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
}

/// Past 100 channels the start states them a provider at a time: one
/// durability sentence and one line of totals for each provider, each
/// channel's own lines at the debug level, so ten thousand channels do not
/// log twenty thousand lines at every start.
#[test]
fn many_channels_are_stated_a_provider_at_a_time_and_each_at_debug() {
    const CHANNELS: usize = 101;
    let channels: String = (0..CHANNELS)
        .map(|i| {
            if i == 0 {
                "  - {name: c0, kind: queue, storage: db}\n".to_owned()
            } else {
                format!("  - {{name: c{i}, kind: append, storage: db}}\n")
            }
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = sqlite_config(dir.path(), &channels);
    let mut broker = Broker::start_in(dir, &yaml);
    let lines = startup_log(&broker);
    let durability: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("msg=\"durability\""))
        .collect();
    assert!(
        durability.iter().any(|l| l.contains(
            "101 channels (1 queue, each with its dead-letter channel, 100 append) on provider db (sqlite): every commit is kept"
        )),
        "{durability:#?}"
    );
    assert!(
        !durability.iter().any(|l| l.contains("channel c1 ")),
        "{durability:#?}"
    );
    assert!(line(&lines, "channel", "c1").is_none(), "{lines:#?}");
    // The queue's dead-letter channel is served and counted beside it.
    let totals = lines
        .iter()
        .find(|l| l.contains("msg=\"channels (each channel's line is at the debug level)\""))
        .unwrap_or_else(|| panic!("no provider totals: {lines:#?}"));
    assert_eq!(field(totals, "provider").as_deref(), Some("db"), "{totals}");
    assert_eq!(
        field(totals, "channels").as_deref(),
        Some("102"),
        "{totals}"
    );
    let provider = lines
        .iter()
        .find(|l| {
            l.contains("msg=\"storage provider\"") && field(l, "provider").as_deref() == Some("db")
        })
        .expect("the provider's line");
    assert!(
        provider.contains("channels c0, c1, c2 and 98 more"),
        "{provider}"
    );
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());

    // At the debug level each channel has its lines again.
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "{}log:\n  level: debug\n",
        sqlite_config(dir.path(), &channels)
    );
    let mut broker = Broker::start_in(dir, &yaml);
    let lines = startup_log(&broker);
    let (_, c1) = line(&lines, "channel", "c1").expect("c1's line at debug");
    assert!(c1.contains("level=DEBUG"), "{c1}");
    assert!(
        lines.iter().any(
            |l| l.contains("level=DEBUG") && l.contains("channel c100 (append) on provider db")
        ),
        "{lines:#?}"
    );
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());

    // A memory provider's stop writes a file for each channel: past as
    // many, each file's line is at debug, the stop's summary at info.
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
         auth:\n  allow_anonymous: true\n\
         storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
         channels:\n{}",
        dir.path().join("snap").display(),
        channels.replace("storage: db", "storage: mem")
    );
    let mut broker = Broker::start_in(dir, &yaml);
    startup_log(&broker);
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let summary = broker.wait_log(|l| l.contains("msg=\"snapshot written\""));
    assert_eq!(
        field(&summary, "files").as_deref(),
        Some("102"),
        "{summary}"
    );
    assert!(
        !broker.log_text().contains("msg=\"snapshot file written\""),
        "{}",
        broker.log_text()
    );
}

/// Check-config calls a configuration valid only when serve serves it; one
/// function decides for both, and it refuses nothing this build accepts.
#[test]
fn check_config_agrees_with_serve() {
    let served = tempfile::tempdir().expect("tempdir");
    let yaml = sqlite_config(
        served.path(),
        "  - name: telemetry\n    kind: append\n    storage: db\n\
         \x20 - name: jobs\n    kind: queue\n    storage: db\n\
         \x20 - name: devices\n    kind: latest\n    storage: db\n",
    );
    let config = write_config(served.path(), &yaml);
    for output in [&[][..], &["--output"][..], &["--output", "json"][..]] {
        let args: Vec<&str> = ["check-config"].iter().chain(output).copied().collect();
        let out = saguin(&args, &config);
        assert_eq!(out.status.code(), Some(0), "{output:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("refuses"), "{}", stderr(&out));
    }
    let mut broker = Broker::start_in(served, &yaml);
    broker.wait_log(|l| l.contains("msg=\"channel\"") && l.contains("channel=jobs"));
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
}

#[test]
fn a_sqlite_channel_is_opened_before_listening_stated_once_and_kept_across_a_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("saguin.db");
    let records: Vec<Record> = (0..5)
        .map(|i| record("telemetry", &format!("r{i}"), now()))
        .collect();
    let bytes = sqlite_with_telemetry(&db, &records);
    let yaml = sqlite_config(
        dir.path(),
        "  - name: telemetry\n    kind: append\n    storage: db\n    max_bytes: 1MiB\n",
    );
    let mut broker = Broker::start_in(dir, &yaml);
    let lines = startup_log(&broker);
    let listening = lines
        .iter()
        .position(|l| l.contains("msg=\"listening\""))
        .expect("listening");
    let (dropped_at, dropped) = line(
        &lines,
        "dropped the positions of expired sessions",
        "telemetry",
    )
    .unwrap_or_else(|| panic!("no drop line: {lines:#?}"));
    assert_eq!(
        field(dropped, "provider").as_deref(),
        Some("db"),
        "{dropped}"
    );
    assert_eq!(
        field(dropped, "positions").as_deref(),
        Some("1"),
        "{dropped}"
    );
    let (channel_at, channel) = line(&lines, "channel", "telemetry")
        .unwrap_or_else(|| panic!("no channel line: {lines:#?}"));
    assert!(
        dropped_at < channel_at && channel_at < listening,
        "{lines:#?}"
    );
    assert_eq!(
        field(channel, "level").as_deref(),
        Some("INFO"),
        "{channel}"
    );
    for (key, value) in [
        ("kind", "append".to_owned()),
        ("provider", "db".to_owned()),
        ("records", "5".to_owned()),
        ("next", "6".to_owned()),
        ("floor", "1".to_owned()),
        ("bytes", bytes.to_string()),
        ("max_bytes", "1048576".to_owned()),
        ("retention_bytes", "none".to_owned()),
        ("retention_age", "none".to_owned()),
    ] {
        assert_eq!(
            field(channel, key).as_deref(),
            Some(value.as_str()),
            "{key}: {channel}"
        );
    }
    let durability = field(channel, "durability").expect("durability");
    assert!(durability.starts_with("every commit to "), "{durability}");
    assert!(
        durability.contains("flush_interval (150ms)"),
        "{durability}"
    );
    let provider_line = lines
        .iter()
        .find(|l| l.contains("msg=\"storage provider\"") && l.contains("provider=db"))
        .expect("the provider line");
    assert_eq!(
        field(provider_line, "keeps").as_deref(),
        Some("channel telemetry"),
        "{provider_line}"
    );
    assert_eq!(
        field(provider_line, "durability"),
        Some(durability),
        "one wording for both"
    );
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    assert!(
        std::fs::metadata(broker.dir.path().join("saguin.db-wal")).map_or(true, |m| m.len() == 0),
        "checkpointed at the stop"
    );

    let provider = SqliteProvider::open(SqliteOptions::new("db", &db)).expect("reopen");
    let store = append_store(&provider, "telemetry");
    assert_eq!(
        (store.record_count(), store.next(), store.floor()),
        (5, 6, 1)
    );
    let readers: Vec<String> = store
        .positions()
        .expect("positions")
        .iter()
        .map(|p| p.reader.to_string())
        .collect();
    // No bridge named cloud is configured: its position went at the open
    // (tests/bridge_*.rs keep one that is).
    assert!(readers.is_empty(), "{readers:?}");
    provider.close().expect("close");
}

#[test]
fn a_memory_channel_comes_back_from_its_snapshot_and_is_written_again_at_the_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshots = dir.path().join("snapshots");
    let memory = MemoryProvider::new(MemoryConfig {
        name: "mem".into(),
        max_bytes: None,
        reserve: 0,
    })
    .expect("memory provider");
    let store = append_store(&*memory, "telemetry");
    for i in 0..3 {
        store
            .append(record("telemetry", &format!("r{i}"), now()))
            .expect("append");
    }
    store.trim(2, None).expect("trim");
    store
        .save_position(bridge_position("cloud", 3))
        .expect("save");
    store
        .save_position(position("gone", 2, now() - 7200 * SECOND, 3600))
        .expect("save");
    assert!(save_snapshot(&memory, &snapshots, &SnapshotOptions::default(), now()).is_complete());
    let yaml = format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
         auth:\n  allow_anonymous: true\n\
         storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
         \x20   snapshot_debounce: none\n    snapshot_max_delay: none\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: mem\n    retention_age: 7d\n",
        snapshots.display()
    );
    let mut broker = Broker::start_in(dir, &yaml);
    let lines = startup_log(&broker);
    let (_, dropped) = line(
        &lines,
        "dropped the positions of expired sessions",
        "telemetry",
    )
    .unwrap_or_else(|| panic!("no drop line: {lines:#?}"));
    assert_eq!(
        field(dropped, "positions").as_deref(),
        Some("1"),
        "{dropped}"
    );
    let (_, channel) = line(&lines, "channel", "telemetry")
        .unwrap_or_else(|| panic!("no channel line: {lines:#?}"));
    for (key, value) in [
        ("provider", "mem"),
        ("records", "2"),
        ("next", "4"),
        ("floor", "2"),
        ("max_bytes", "none"),
        ("retention_age", "7days"),
    ] {
        assert_eq!(
            field(channel, key).as_deref(),
            Some(value),
            "{key}: {channel}"
        );
    }
    let durability = field(channel, "durability").expect("durability");
    assert!(
        durability.starts_with("as of the last graceful stop"),
        "{durability}"
    );
    // Retention starts once the broker is prepared, after the listeners.
    let retention = broker.wait_log(|l| l.contains("msg=\"retention\""));
    assert_eq!(
        field(&retention, "by_age").as_deref(),
        Some("1"),
        "{retention}"
    );
    assert_eq!(
        field(&retention, "age_every").as_deref(),
        Some("16h 48m"),
        "{retention}"
    );
    assert_eq!(
        field(&retention, "by_size").as_deref(),
        Some("0"),
        "{retention}"
    );
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let written = broker.wait_log(|l| {
        // The second generation: the first was written before the start.
        l.contains("msg=\"snapshot file written\"") && l.contains("file=telemetry.2.snapshot")
    });
    assert_eq!(
        field(&written, "records").as_deref(),
        Some("2"),
        "{written}"
    );

    // What the stop wrote loads: the records above the floor and the one
    // position still owed.
    let again = MemoryProvider::new(MemoryConfig {
        name: "mem".into(),
        max_bytes: None,
        reserve: 0,
    })
    .expect("memory provider");
    let report = again
        .load_snapshot_dir(
            &broker.dir.path().join("snapshots"),
            &saguin::storage::memory::LoadOptions {
                channels: vec![("telemetry".into(), ChannelKind::Append)],
                retained: false,
                sessions: false,
                now: now(),
                max_session_expiry: 7 * 24 * 3600,
                max_file_bytes: 64 * 1024 * 1024,
            },
        )
        .expect("the stop's snapshot loads");
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let store = append_store(&*again, "telemetry");
    assert_eq!(
        (store.record_count(), store.next(), store.floor()),
        (2, 4, 2)
    );
    let readers: Vec<String> = store
        .positions()
        .expect("positions")
        .iter()
        .map(|p| p.reader.to_string())
        .collect();
    // No bridge named cloud is configured: its position went at the open
    // (tests/bridge_*.rs keep one that is).
    assert!(readers.is_empty(), "{readers:?}");
}

#[test]
fn a_memory_provider_with_no_snapshot_dir_holding_channels_says_it_keeps_nothing() {
    let mut broker = Broker::start(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
         auth:\n  allow_anonymous: true\n\
         storage:\n  - name: mem\n    kind: memory\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: mem\n\
         \x20 - name: logs\n    kind: append\n    storage: mem\n",
    );
    let warning =
        broker.wait_log(|l| l.contains("msg=\"keeps nothing") && l.contains("provider=mem"));
    assert_eq!(
        field(&warning, "level").as_deref(),
        Some("WARN"),
        "{warning}"
    );
    assert_eq!(
        field(&warning, "channels").as_deref(),
        Some("telemetry, logs"),
        "{warning}"
    );
    let channel = broker.wait_log(|l| l.contains("msg=\"channel\"") && l.contains("channel=logs"));
    assert_eq!(
        field(&channel, "durability").as_deref(),
        Some("nothing: lost when the broker stops"),
        "{channel}"
    );
    broker.wait_log(|l| l.contains("msg=\"nothing is kept: channels, retained messages"));
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
}

#[test]
fn retention_trims_a_channel_by_size_then_by_age_while_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("saguin.db");
    // Ten records from two hours ago, then ten from now, all one size.
    let records: Vec<Record> = (0..20)
        .map(|i| {
            let at = if i < 10 { now() - 7200 * SECOND } else { now() };
            record("telemetry", &format!("record {i:02}"), at)
        })
        .collect();
    let bytes = sqlite_with_telemetry(&db, &records);
    let one = bytes / 20;
    let yaml = format!(
        "{}log:\n  level: debug\n",
        sqlite_config(
            dir.path(),
            &format!(
                "  - name: telemetry\n    kind: append\n    storage: db\n    retention_bytes: {}\n    retention_age: 1h\n",
                one * 15
            ),
        )
    );
    let mut broker = Broker::start_in(dir, &yaml);
    let removed = broker.wait_log_count(
        |l| l.contains("msg=\"retention removed records\"") && l.contains("channel=telemetry"),
        2,
    );
    let by = |sweep: &str| {
        removed
            .iter()
            .find(|l| field(l, "sweep").as_deref() == Some(sweep))
            .unwrap_or_else(|| panic!("no {sweep} sweep: {removed:#?}"))
    };
    let size = by("size");
    assert_eq!(field(size, "records").as_deref(), Some("5"), "{size}");
    assert_eq!(field(size, "bytes"), Some((one * 5).to_string()), "{size}");
    assert_eq!(field(size, "floor").as_deref(), Some("6"), "{size}");
    let age = by("age");
    assert_eq!(field(age, "records").as_deref(), Some("5"), "{age}");
    assert_eq!(field(age, "floor").as_deref(), Some("11"), "{age}");
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    assert!(
        !broker.log_text().contains("retention sweep failed"),
        "{}",
        broker.log_text()
    );

    let provider = SqliteProvider::open(SqliteOptions::new("db", &db)).expect("reopen");
    let store = append_store(&provider, "telemetry");
    assert_eq!(
        (store.record_count(), store.next(), store.floor()),
        (10, 21, 11)
    );
    assert_eq!(store.bytes(), one * 10);
    provider.close().expect("close");
}
