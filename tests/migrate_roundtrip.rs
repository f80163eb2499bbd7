//! `saguin migrate` carrying everything: snapshots -> sqlite -> snapshots
//! gives the same decoded files; what the sqlite provider itself wrote is
//! read back whole; what a migration wrote is what the sqlite provider reads;
//! the MBMQTT01 golden files import into both provider kinds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use bytes::Bytes;
use saguin::storage::contract::{
    InflightEntry, InflightPhase, Position, Provider, Reader, SessionEntry, SubscriptionEntry,
    WillEntry,
};
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
use saguin_format::f21::{self, SnapshotFile};
use saguin_format::model::{ChannelKind, PublishProps, Record, UserProperty};
use serde_json::Value;

fn saguin(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .output()
        .unwrap()
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

fn ok(out: Output) -> Output {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Every data file of a directory, decoded, by the fixed name of what it
/// holds (a generation's number taken out of its name). The manifests are
/// left out: a directory a build before generations wrote has a
/// shutdown's, a migration writes a generation's, and each names its own
/// files.
fn decoded(dir: &Path) -> BTreeMap<String, SnapshotFile> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.ends_with(".snapshot")
                || n.starts_with("saguin.") && n != "saguin.lock" && n != "saguin.manifest"
        })
        .map(|e| {
            let (_, mut file) = f21::decode(&std::fs::read(e.path()).unwrap()).unwrap();
            // A retained file's offsets only order its values; the golden
            // file writes 0 throughout, which a migration numbers 1, 2, ...
            // (FORMAT.md §2.6), so they are not compared here.
            // Positions are a set, keyed by reader.
            if let SnapshotFile::Channel(c) = &mut file {
                c.positions.sort_by(|a, b| a.reader.cmp(&b.reader));
                if let Some(d) = &mut c.dead_letter {
                    d.positions.sort_by(|a, b| a.reader.cmp(&b.reader));
                }
            }
            if let SnapshotFile::Retained(r) = &mut file {
                for rec in &mut r.records {
                    rec.offset = 0;
                }
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let name = saguin_format::channel_name::split_generation_file_name(&name)
                .map_or(name, |(base, _)| base);
            (name, file)
        })
        .collect()
}

#[test]
fn snapshots_to_sqlite_to_snapshots_gives_equal_content() {
    let tmp = tempfile::tempdir().unwrap();
    // A copy: the migration takes the source's lock, which creates its file.
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for e in std::fs::read_dir(fixtures().join("f21/dir")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    let db = tmp.path().join("saguin.db");
    let back = tmp.path().join("back");
    let out = ok(saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("5 of 5 units carried"), "{text}");
    assert!(text.contains("counts in equal counts out"), "{text}");
    ok(saguin(&[
        os("migrate"),
        os("to-snapshots"),
        db.as_os_str(),
        back.as_os_str(),
    ]));
    let (a, b) = (decoded(&src), decoded(&back));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, file) in &a {
        assert_eq!(
            Some(file),
            b.get(name),
            "{name} differs after the round trip"
        );
    }
    // And once more through sqlite: the second database holds what the first did.
    let db2 = tmp.path().join("again.db");
    ok(saguin(&[
        os("migrate"),
        os("to-sqlite"),
        back.as_os_str(),
        db2.as_os_str(),
    ]));
    let dump = |db: &Path| -> Value {
        let out = ok(saguin(&[
            os("sqlite"),
            os("dump"),
            db.as_os_str(),
            os("--json"),
        ]));
        let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
        for k in ["database", "created_at"] {
            v.as_object_mut().unwrap().remove(k);
        }
        // Broadcast cursors' saved-at is not kept by the snapshot writer.
        for p in v["positions"].as_array_mut().unwrap() {
            if p["channel"] == "$saguin/broadcast" {
                p["saved_at"] = Value::Null;
            }
        }
        v
    };
    assert_eq!(dump(&db), dump(&db2));
    // The snapshot destination is private.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&back).unwrap().permissions().mode() & 0o777,
        0o700
    );
    for e in std::fs::read_dir(&back).unwrap() {
        let e = e.unwrap();
        assert_eq!(
            e.metadata().unwrap().permissions().mode() & 0o777,
            0o600,
            "{:?}",
            e.file_name()
        );
    }
    assert_eq!(
        std::fs::metadata(&db).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

fn record(topic: &str, payload: &str) -> Record {
    let mut r = Record::new(topic, Bytes::copy_from_slice(payload.as_bytes()));
    r.timestamp = 1_767_225_600_000_000_000;
    r.client_id = "pub-1".into();
    r.qos = 1;
    r.user_properties = vec![
        UserProperty {
            name: "k".into(),
            value: "1".into(),
        },
        UserProperty {
            name: "k".into(),
            value: "2".into(),
        },
    ];
    r.props = PublishProps {
        content_type: Some("text/plain".into()),
        correlation_data: Some(Bytes::from_static(&[0, 1, 255])),
        ..Default::default()
    }
    .into();
    r
}

fn session(client: &str, log_offset: u64) -> SessionEntry {
    SessionEntry {
        client_id: client.into(),
        principal: Some("ops".into()),
        expiry_interval: 3600,
        detached_at: 1_767_225_600_000_000_000,
        subscriptions: vec![SubscriptionEntry {
            filter: "fleet/#".into(),
            qos: 2,
            no_local: true,
            retain_as_published: true,
            retain_handling: 1,
            subscription_id: Some(7),
            log_offset: 1,
        }],
        will: Some(WillEntry {
            topic: "fleet/gone".into(),
            payload: Bytes::from_static(b"\x00bye"),
            qos: 1,
            retain: true,
            delay_interval: 30,
            props: PublishProps {
                response_topic: Some("r".into()),
                ..Default::default()
            },
            user_properties: vec![UserProperty {
                name: "a".into(),
                value: "b".into(),
            }],
        }),
        window: 10,
        inflight: vec![InflightEntry {
            log_offset,
            packet_id: 9,
            qos: 2,
            phase: InflightPhase::AwaitingComp,
            shared_group: None,
        }],
    }
}

/// A database written by the sqlite provider through its stores.
fn provider_database(db: &Path) -> (Vec<SessionEntry>, Vec<Position>) {
    let p = SqliteProvider::open(SqliteOptions::new("db", db)).unwrap();
    let t = p.open_channel("telemetry", ChannelKind::Append).unwrap();
    let t = t.as_append().unwrap();
    for i in 0..50 {
        t.append(record(&format!("telemetry/d{i}"), &format!("v{i}")))
            .unwrap();
    }
    t.trim(11, None).unwrap();
    let pos = Position {
        reader: Reader::mqtt("dash").unwrap(),
        offset: 30,
        saved_at: saguin::storage::contract::now_nanos(),
        session_expiry: Some(60),
    };
    t.save_position(pos.clone()).unwrap();
    let l = p.open_channel("state", ChannelKind::Latest).unwrap();
    let l = l.as_latest().unwrap();
    l.set(record("state/a", "1")).unwrap();
    l.set(record("state/b", "2")).unwrap();
    l.delete("state/a").unwrap();
    let q = p.open_channel("jobs", ChannelKind::Queue).unwrap();
    let q = q.as_queue().unwrap();
    q.set_max_attempts(1);
    for i in 0..5 {
        q.enqueue(record("jobs/x", &format!("job{i}"))).unwrap();
    }
    let lease = q.lease(1, "w", i64::MAX, 100).unwrap();
    q.release(lease.delivery_id, lease.epoch, 200, "nack")
        .unwrap();
    let lease = q.lease(2, "w", i64::MAX, 300).unwrap();
    assert_eq!(lease.attempts, 1);
    p.retained()
        .unwrap()
        .set(record("fleet/r", "retained"))
        .unwrap();
    let log = p.broadcast_log().unwrap();
    let m = log.append(record("fleet/a", "owed")).unwrap();
    log.save_cursor("s1", m.offset).unwrap();
    let sessions = p.sessions().unwrap();
    sessions.save(session("s1", m.offset)).unwrap();
    let all = sessions.sessions().unwrap();
    p.close().unwrap();
    (all, vec![pos])
}

#[test]
fn what_the_provider_wrote_is_carried_whole_and_reads_back_in_the_provider() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("live.db");
    let (sessions, positions) = provider_database(&db);
    let snaps = tmp.path().join("snaps");
    ok(saguin(&[
        os("migrate"),
        os("to-snapshots"),
        db.as_os_str(),
        snaps.as_os_str(),
    ]));
    let files = decoded(&snaps);
    let SnapshotFile::Channel(t) = &files["telemetry.snapshot"] else {
        panic!()
    };
    assert_eq!((t.next, t.floor, t.records.len()), (51, 11, 40));
    assert_eq!(t.records[0].offset, 11);
    assert_eq!(t.records[0].user_properties.len(), 2);
    assert_eq!(t.positions.len(), 1);
    let SnapshotFile::Channel(j) = &files["jobs.snapshot"] else {
        panic!()
    };
    assert_eq!(j.items.len(), 4, "one job dead-lettered");
    assert_eq!(j.items[0].attempts, 1);
    assert_eq!(j.items[0].first_delivered, 300);
    let dlq = j.dead_letter.as_ref().unwrap();
    assert_eq!(dlq.records.len(), 1);
    let SnapshotFile::Channel(s) = &files["state.snapshot"] else {
        panic!()
    };
    assert_eq!(s.records.len(), 2, "a value and a deletion marker");
    let SnapshotFile::Sessions(sf) = &files["saguin.sessions"] else {
        panic!()
    };
    assert_eq!(sf.sessions.len(), 1);
    assert_eq!(
        sf.sessions[0].will.as_ref().unwrap().payload,
        Bytes::from_static(b"\x00bye")
    );
    assert_eq!(sf.sessions[0].subscriptions[0].subscription_id, Some(7));

    // Back into a new database, and opened by the provider itself.
    let db2 = tmp.path().join("migrated.db");
    ok(saguin(&[
        os("migrate"),
        os("to-sqlite"),
        snaps.as_os_str(),
        db2.as_os_str(),
    ]));
    let p = SqliteProvider::open(SqliteOptions::new("db", &db2)).unwrap();
    assert_eq!(p.sessions().unwrap().sessions().unwrap(), sessions);
    let t = p.open_channel("telemetry", ChannelKind::Append).unwrap();
    let t = t.as_append().unwrap();
    assert_eq!((t.next(), t.floor(), t.record_count()), (51, 11, 40));
    assert_eq!(t.positions().unwrap(), positions);
    assert_eq!(
        t.read_from(11).unwrap()[0].props.correlation_data,
        Some(Bytes::from_static(&[0, 1, 255]))
    );
    let q = p.open_channel("jobs", ChannelKind::Queue).unwrap();
    let q = q.as_queue().unwrap();
    assert_eq!(
        (q.depth(), q.next(), q.dead_letter().record_count()),
        (4, 6, 1)
    );
    assert_eq!(q.items().unwrap()[0].attempts, 1);
    let l = p.open_channel("state", ChannelKind::Latest).unwrap();
    let l = l.as_latest().unwrap();
    assert_eq!(l.match_with_deletions("#", 1).unwrap().len(), 2);
    assert_eq!(l.next(), 4);
    // A new record takes the next offset, never a reused one.
    assert_eq!(t.append(record("telemetry/n", "new")).unwrap().offset, 51);
    assert_eq!(p.retained().unwrap().record_count(), 1);
    let log = p.broadcast_log().unwrap();
    assert_eq!(log.cursor("s1").unwrap(), Some(1));
    p.close().unwrap();
}

fn mbmqtt(name: &str) -> PathBuf {
    fixtures().join("mbmqtt").join(name)
}

#[test]
fn mbmqtt_golden_files_import_into_both_providers() {
    for (file, version) in [
        ("broker-v1.snapshot", 1),
        ("broker-v2.snapshot", 2),
        ("broker-v3.snapshot", 3),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("import.db");
        let out = ok(saguin(&[
            os("migrate"),
            os("from-mbmqtt"),
            mbmqtt(file).as_os_str(),
            os("--to-sqlite"),
            db.as_os_str(),
            os("--json"),
        ]));
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["legacy"]["version"], version, "{file}");
        assert_eq!(doc["complete"], true);
        let legacy = doc["legacy"].clone();
        let sessions = doc["units"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["kind"] == "sessions")
            .unwrap();
        assert_eq!(sessions["counts_out"]["sessions"], legacy["sessions"]);
        assert_eq!(sessions["counts_out"]["inflight"], legacy["inflight"]);
        let owed = legacy["inflight"].as_u64().unwrap() + legacy["pending"].as_u64().unwrap();
        assert_eq!(sessions["counts_out"]["records"], owed);

        // The provider reads what the import wrote.
        let p = SqliteProvider::open(SqliteOptions::new("db", &db)).unwrap();
        let stored = p.sessions().unwrap().sessions().unwrap();
        assert_eq!(stored.len() as u64, legacy["sessions"].as_u64().unwrap());
        for s in &stored {
            assert_ne!(s.detached_at, 0, "an imported session is not connected");
            assert_eq!(s.expiry_interval, u32::MAX);
            assert!(p
                .broadcast_log()
                .unwrap()
                .cursor(&s.client_id)
                .unwrap()
                .is_some());
            if version == 1 {
                assert_eq!(s.principal, None, "V1 sessions have no principal");
            }
        }
        assert_eq!(
            p.retained().unwrap().record_count(),
            legacy["retained"].as_u64().unwrap()
        );
        p.close().unwrap();

        let dir = tmp.path().join("snaps");
        ok(saguin(&[
            os("migrate"),
            os("from-mbmqtt"),
            mbmqtt(file).as_os_str(),
            os("--to-snapshots"),
            dir.as_os_str(),
        ]));
        let verify = saguin(&[os("snapshot"), os("verify"), dir.as_os_str()]);
        assert_eq!(
            verify.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&verify.stdout)
        );
    }
}

#[test]
fn a_damaged_or_oversized_mbmqtt_file_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("broker.snapshot");
    let mut bytes = std::fs::read(mbmqtt("broker-v3.snapshot")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&bad, &bytes).unwrap();
    let db = tmp.path().join("x.db");
    let out = saguin(&[
        os("migrate"),
        os("from-mbmqtt"),
        bad.as_os_str(),
        os("--to-sqlite"),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CRC"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!db.exists());
    let out = saguin(&[
        os("migrate"),
        os("from-mbmqtt"),
        mbmqtt("broker-v3.snapshot").as_os_str(),
        os("--to-sqlite"),
        db.as_os_str(),
        os("--max-bytes"),
        os("10"),
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("limit"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!db.exists());
}

#[test]
fn rows_that_belong_to_no_channel_refuse_the_source_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("live.db");
    provider_database(&db);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "INSERT INTO positions (channel, reader, offset, saved_at, session_expiry) VALUES ('gone', 'bridge:b', 3, 0, NULL)",
        [],
    )
    .unwrap();
    drop(conn);
    let dest = tmp.path().join("snaps");
    let out = saguin(&[
        os("migrate"),
        os("to-snapshots"),
        db.as_os_str(),
        dest.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "positions: channel \"gone\": 1 positions of a channel that has no channels row"
        ),
        "{err}"
    );
    assert!(!dest.exists());
}
