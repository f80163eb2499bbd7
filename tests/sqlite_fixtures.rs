//! Golden schema-20 databases in `fixtures/sqlite/`, read by the current
//! code: a file written by an earlier build of this version must keep
//! opening with everything it held, and files of another version or with no
//! version must keep being refused by name.
//!
//! `SAGUIN_UPDATE_FIXTURES=1 cargo test --test sqlite_fixtures` rewrites
//! them (only when the schema version itself changes, which is exactly when
//! old files must stop opening).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use saguin::model::{ChannelKind, Record, UserProperty};
use saguin::storage::contract::{HeldPublish, Position, Provider, Reader};
use saguin::storage::sqlite::{open_read_only, SqliteOpenError, SqliteOptions, SqliteProvider};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/sqlite")
}

/// A fixture copied to a temporary directory (opening writes to it).
fn copy_of(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join(name);
    std::fs::copy(fixtures().join(name), &to).unwrap();
    (dir, to)
}

fn options(path: &Path) -> SqliteOptions {
    let mut o = SqliteOptions::new("db", path);
    o.read_connections = 1;
    o.flush_interval = Duration::from_millis(10);
    o
}

fn record(topic: &str, payload: &str, ts: i64) -> Record {
    let mut r = Record::new(topic, Bytes::from(payload.to_string()));
    r.timestamp = ts;
    r.client_id = "fixture".into();
    r.qos = 1;
    r.message_id = [3; 16];
    r
}

/// The fixture's latest channel.
fn devices(p: &SqliteProvider) -> std::sync::Arc<dyn saguin::storage::contract::LatestStore> {
    p.open_channel("devices", ChannelKind::Latest)
        .unwrap()
        .as_latest()
        .unwrap()
        .clone()
}

/// What `schema20-basic.db` holds, written through the provider.
fn write_basic(path: &Path) {
    let p = SqliteProvider::open(options(path)).unwrap();
    let log = p
        .open_channel("telemetry", ChannelKind::Append)
        .unwrap()
        .as_append()
        .unwrap()
        .clone();
    for i in 1..=5 {
        let mut r = record(
            "telemetry/dev1",
            &format!("reading {i}"),
            1_767_225_600_000_000_000 + i,
        );
        r.user_properties.push(UserProperty {
            name: "unit".into(),
            value: "C".into(),
        });
        r.props.correlation_data = Some(Bytes::from_static(&[0xde, 0xad]));
        log.append(r).unwrap();
    }
    log.trim(3, None).unwrap();
    log.save_position(Position {
        reader: Reader::bridge("cloud").unwrap(),
        offset: 4,
        saved_at: 1,
        session_expiry: None,
    })
    .unwrap();
    let latest = devices(&p);
    latest.set(record("devices/a", "on", 1)).unwrap();
    latest.set(record("devices/b", "off", 2)).unwrap();
    latest.delete("devices/b").unwrap();
    let jobs = p
        .open_channel("jobs", ChannelKind::Queue)
        .unwrap()
        .as_queue()
        .unwrap()
        .clone();
    jobs.enqueue(record("jobs", "job 1", 3)).unwrap();
    jobs.enqueue(record("jobs", "job 2", 4)).unwrap();
    let lease = jobs.lease(1, "worker", i64::MAX, 10).unwrap();
    assert_eq!(lease.attempts, 1);
    p.held_publishes()
        .unwrap()
        .hold(HeldPublish {
            channel: "telemetry".into(),
            client_id: "c2".into(),
            packet_id: 9,
            held_at: 5,
            record: Record {
                qos: 2,
                ..record("telemetry/dev2", "held", 5)
            },
        })
        .unwrap();
    p.close().unwrap();
}

#[test]
fn the_schema_20_fixture_opens_with_everything_it_held() {
    let name = "schema20-basic.db";
    if std::env::var_os("SAGUIN_UPDATE_FIXTURES").is_some() {
        std::fs::create_dir_all(fixtures()).unwrap();
        let target = fixtures().join(name);
        let _ = std::fs::remove_file(&target);
        write_basic(&target);
        let _ = std::fs::remove_file(fixtures().join(format!("{name}.lock")));
    }
    let (_dir, path) = copy_of(name);
    let p = SqliteProvider::open(options(&path)).unwrap();
    let log = p
        .open_channel("telemetry", ChannelKind::Append)
        .unwrap()
        .as_append()
        .unwrap()
        .clone();
    assert_eq!((log.next(), log.floor(), log.record_count()), (6, 3, 3));
    let records = log.read_from(3).unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].payload, Bytes::from("reading 3"));
    assert_eq!(records[0].user_properties[0].value, "C");
    assert_eq!(
        records[0].props.correlation_data.as_deref(),
        Some(&[0xde, 0xad][..])
    );
    assert_eq!(
        log.bytes(),
        records.iter().map(Record::accounted_size).sum::<u64>()
    );
    assert_eq!(log.lowest_position(), 4);
    let latest = devices(&p);
    assert_eq!(latest.next(), 4);
    assert_eq!(latest.match_with_deletions("#", 1).unwrap().len(), 2);
    let jobs = p
        .open_channel("jobs", ChannelKind::Queue)
        .unwrap()
        .as_queue()
        .unwrap()
        .clone();
    let items = jobs.items().unwrap();
    assert_eq!(
        items
            .iter()
            .map(|i| (i.record.offset, i.attempts))
            .collect::<Vec<_>>(),
        [(1, 1), (2, 0)]
    );
    assert_eq!(p.held_publishes().unwrap().held().unwrap().len(), 1);
    // The file is still version 20 after this build wrote to it.
    log.append(record("telemetry/dev1", "after", 9)).unwrap();
    p.close().unwrap();
    let conn = open_read_only(&path).unwrap();
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 20);
}

#[test]
fn a_schema_5_file_is_refused_by_name() {
    let name = "schema5.db";
    if std::env::var_os("SAGUIN_UPDATE_FIXTURES").is_some() {
        std::fs::create_dir_all(fixtures()).unwrap();
        let target = fixtures().join(name);
        let _ = std::fs::remove_file(&target);
        let conn = rusqlite::Connection::open(&target).unwrap();
        conn.execute_batch(
            "CREATE TABLE meta (id INTEGER PRIMARY KEY, schema_version INTEGER NOT NULL,
                 created_by TEXT NOT NULL, created_at INTEGER NOT NULL);
             INSERT INTO meta VALUES (1, 5, '0123456789ab', 1767225600000000000);
             CREATE TABLE records (channel TEXT, offset INTEGER, payload BLOB);
             PRAGMA user_version = 5;",
        )
        .unwrap();
    }
    let (_dir, path) = copy_of(name);
    let err = SqliteProvider::open(options(&path)).unwrap_err();
    assert!(matches!(
        err,
        SqliteOpenError::SchemaVersion { version: 5, .. }
    ));
    assert_eq!(
        err.to_string(),
        format!(
            "storage {}: schema version 5 (created by saguin 0123456789ab at 2026-01-01T00:00:00Z); this broker reads version 20",
            path.display()
        )
    );
}

#[test]
fn a_file_with_tables_and_no_version_is_refused() {
    let name = "unversioned.db";
    if std::env::var_os("SAGUIN_UPDATE_FIXTURES").is_some() {
        std::fs::create_dir_all(fixtures()).unwrap();
        let target = fixtures().join(name);
        let _ = std::fs::remove_file(&target);
        rusqlite::Connection::open(&target)
            .unwrap()
            .execute_batch("CREATE TABLE channels (name TEXT PRIMARY KEY, next INTEGER);")
            .unwrap();
    }
    let (_dir, path) = copy_of(name);
    let err = SqliteProvider::open(options(&path)).unwrap_err();
    assert!(matches!(err, SqliteOpenError::Unversioned { .. }), "{err}");
    assert!(
        err.to_string().contains("states no schema version"),
        "{err}"
    );
}

/// The plan SQLite chooses for a latest consumer's resume on `conn`.
fn resume_plan(conn: &rusqlite::Connection) -> String {
    let mut stmt = conn
        .prepare(
            "EXPLAIN QUERY PLAN SELECT offset, topic, deleted FROM latest_values
             WHERE channel = ?1 AND offset >= ?2 ORDER BY offset",
        )
        .unwrap();
    let steps = stmt
        .query_map(rusqlite::params!["devices", 2], |r| r.get::<_, String>(3))
        .unwrap();
    steps.map(|s| s.unwrap()).collect::<Vec<_>>().join("; ")
}

#[test]
fn a_schema_20_file_written_before_the_offset_index_gains_it_at_open() {
    let (_dir, path) = copy_of("schema20-basic.db");
    // As an earlier build wrote it: a resume scanned every topic.
    let before = resume_plan(&open_read_only(&path).unwrap());
    assert!(
        !before.contains("latest_values_by_offset"),
        "the fixture predates the index: {before}"
    );
    let p = SqliteProvider::open(options(&path)).unwrap();
    let latest = devices(&p);
    // What it held reads the same through the index.
    let changed = latest.match_with_deletions("#", 2).unwrap();
    assert_eq!(
        changed
            .iter()
            .map(|r| (r.topic.as_str(), r.offset, r.payload.is_empty()))
            .collect::<Vec<_>>(),
        [("devices/b", 3, true)]
    );
    p.close().unwrap();
    let conn = open_read_only(&path).unwrap();
    let after = resume_plan(&conn);
    assert!(
        after.contains("USING INDEX latest_values_by_offset") && !after.contains("SCAN"),
        "{after}"
    );
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 20, "an index is not a new version");
    drop(conn);
    // Opened again, nothing more is created: the index is there.
    let p = SqliteProvider::open(options(&path)).unwrap();
    p.close().unwrap();
}

/// The offset index as `sqlite_schema` keeps it.
fn offset_index(conn: &rusqlite::Connection) -> String {
    conn.query_row(
        "SELECT sql FROM sqlite_schema WHERE type = 'index' AND name = 'latest_values_by_offset'",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn a_schema_20_file_with_the_earlier_offset_index_gains_its_sizes_at_open() {
    let (_dir, path) = copy_of("schema20-basic.db");
    let p = SqliteProvider::open(options(&path)).unwrap();
    let held = devices(&p).values().unwrap();
    p.close().unwrap();
    // As a build before the sizes were in the index left it.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP INDEX latest_values_by_offset;
         CREATE INDEX latest_values_by_offset ON latest_values (channel, offset);",
    )
    .unwrap();
    drop(conn);

    let p = SqliteProvider::open(options(&path)).unwrap();
    let latest = devices(&p);
    assert_eq!(latest.values().unwrap(), held, "the same values");
    assert_eq!(
        latest.match_with_deletions("#", 2).unwrap().len(),
        1,
        "the deletion still read by its offset"
    );
    p.close().unwrap();
    let conn = open_read_only(&path).unwrap();
    assert_eq!(
        offset_index(&conn),
        "CREATE INDEX latest_values_by_offset ON latest_values (channel, offset, deleted, size)"
    );
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 20, "an index is not a new version");
}
