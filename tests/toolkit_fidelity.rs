//! Migrations lose nothing and refuse what does not verify; `snapshot
//! verify` and `sqlite verify` answer no where a backup must not be kept.
//! Every test drives the real binary except the round-trip property, which
//! calls the same library function the binary calls, many times.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use bytes::Bytes;
use proptest::prelude::*;
use rusqlite::Connection;
use saguin_format::channel_name::{encode_file_name, BROADCAST_FILE, MANIFEST_FILE, SESSIONS_FILE};
use saguin_format::f21::{
    self, BroadcastFile, ChannelFile, DeadLetter, HeldPublish, InflightEntry, InflightPhase,
    Manifest, ManifestEntry, Position, QueueItem, RetainedFile, Session, SessionsFile, SharedGroup,
    SharedGroupKey, SnapshotFile, Subscription,
};
use saguin_format::model::{ChannelKind, Record, UserProperty};

const AT: i64 = 1_767_225_600_000_000_000;

fn saguin<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: Output) -> Output {
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    o
}

// ---- a directory holding every kind of row --------------------------------

/// What varies between generated directories.
#[derive(Clone, Debug)]
struct Shape {
    /// Records of the append channel (contiguous from its floor).
    append: u64,
    append_floor: u64,
    /// Offsets of the queue's unresolved items (ascending, gaps allowed).
    queue_gaps: Vec<u64>,
    dead_letters: u64,
    /// Latest values; every third is a deletion marker.
    latest: u64,
    retained: u64,
    /// Broadcast messages, at offsets with gaps.
    log_gaps: Vec<u64>,
    /// The order the shared group's deliveries were returned in.
    returned_order: Vec<usize>,
    payload: Vec<u8>,
    saved_at: i64,
}

fn default_shape() -> Shape {
    Shape {
        append: 5,
        append_floor: 3,
        queue_gaps: vec![1, 3],
        dead_letters: 2,
        latest: 4,
        retained: 3,
        log_gaps: vec![1, 1, 2, 1, 3],
        returned_order: vec![2, 0, 1],
        payload: b"\x00payload\xff".to_vec(),
        saved_at: AT - 7_000_000_000,
    }
}

fn record(offset: u64, topic: &str, payload: &[u8], n: u64) -> Record {
    let mut r = Record::new(topic, Bytes::copy_from_slice(payload));
    r.offset = offset;
    r.message_id = [n as u8; 16];
    r.timestamp = AT - n as i64;
    r.qos = (n % 3) as u8;
    r.client_id = format!("pub-{n}");
    if n % 2 == 0 {
        r.user_properties.push(UserProperty {
            name: "k".into(),
            value: format!("v{n}"),
        });
        r.props.content_type = Some("text/plain".into());
        r.props.correlation_data = Some(Bytes::from_static(&[0, 1, 2]));
    }
    r
}

fn sum(records: &[Record]) -> u64 {
    records.iter().map(Record::accounted_size).sum()
}

fn mqtt(id: &str, offset: u64, saved_at: i64) -> Position {
    Position {
        reader: format!("mqtt:{id}"),
        offset,
        saved_at,
        session_expiry: Some(3600),
    }
}

fn bridge(id: &str, offset: u64, saved_at: i64) -> Position {
    Position {
        reader: format!("bridge:{id}"),
        offset,
        saved_at,
        session_expiry: None,
    }
}

fn held(client: &str, packet_id: u16, n: u64) -> HeldPublish {
    let mut r = record(0, "held/topic", b"held", n);
    r.qos = 2;
    HeldPublish {
        client_id: client.into(),
        packet_id,
        held_at: AT - 5,
        record: r,
    }
}

/// A directory's files, by name.
type Files = Vec<(String, SnapshotFile)>;

/// A change made to a directory's files before they are written.
type Mutation = fn(&mut Files);

/// Every file of a directory as saguin's writers write it.
fn world(s: &Shape) -> Files {
    let mut files = Vec::new();
    // Append: contiguous in [floor, next), two positions, a held publish.
    let mut a = ChannelFile::new("telemetry", ChannelKind::Append);
    a.floor = s.append_floor;
    a.next = s.append_floor + s.append;
    a.records = (0..s.append)
        .map(|i| record(s.append_floor + i, "t/a", &s.payload, i))
        .collect();
    a.bytes = sum(&a.records);
    a.positions = vec![
        bridge("uplink", a.floor, s.saved_at),
        mqtt("reader-1", a.next, s.saved_at + 1),
    ];
    a.held = vec![held("pub-a", 7, 1)];
    files.push(a);
    // Latest: one value per topic, every third a deletion marker.
    let mut l = ChannelFile::new("state", ChannelKind::Latest);
    l.records = (0..s.latest)
        .map(|i| {
            let payload: &[u8] = if i % 3 == 2 { b"" } else { &s.payload };
            record(1 + i * 2, &format!("s/{i}"), payload, i)
        })
        .collect();
    l.next = 2 * s.latest + 1;
    l.bytes = sum(&l.records);
    l.positions = vec![mqtt("reader-2", 1, s.saved_at + 2)];
    files.push(l);
    // Queue: items with gaps, its own positions, a dead-letter channel.
    let mut q = ChannelFile::new("jobs", ChannelKind::Queue);
    let mut offset = 0;
    for (i, gap) in s.queue_gaps.iter().enumerate() {
        offset += gap;
        q.items.push(QueueItem {
            record: record(offset, "q/job", &s.payload, i as u64),
            attempts: i as u32,
            first_delivered: if i > 0 { AT - 100 } else { 0 },
            last_delivered: if i > 0 { AT - 50 } else { 0 },
        });
    }
    q.next = offset + 1;
    q.floor = q.items.first().map_or(q.next, |i| i.record.offset);
    q.bytes = q.items.iter().map(|i| i.record.accounted_size()).sum();
    q.positions = vec![
        bridge("q-audit", q.floor, s.saved_at + 3),
        bridge("q-mirror", q.next, s.saved_at + 4),
    ];
    let dl: Vec<Record> = (0..s.dead_letters)
        .map(|i| record(1 + i, "q/job", &s.payload, 40 + i))
        .collect();
    q.dead_letter = Some(DeadLetter {
        name: "jobs.dlq".into(),
        next: s.dead_letters + 1,
        floor: 1,
        bytes: sum(&dl),
        records: dl,
        positions: vec![bridge("dlq-drain", 1, s.saved_at + 5)],
    });
    files.push(q);
    let mut out: Files = files
        .into_iter()
        .map(|c| (encode_file_name(&c.name), SnapshotFile::Channel(c)))
        .collect();
    // Retained: the store's own offsets, nonzero, in topic order as saguin
    // writes the store ("r/10" before "r/2": the offsets need not ascend).
    let mut retained = RetainedFile {
        records: (0..s.retained)
            .map(|i| {
                let mut r = record(4 + i * 3, &format!("r/{i}"), &s.payload, i);
                r.retain = true;
                r
            })
            .collect(),
    };
    retained.records.sort_by(|a, b| a.topic.cmp(&b.topic));
    out.push((
        saguin_format::channel_name::RETAINED_FILE.to_string(),
        SnapshotFile::Retained(retained),
    ));
    // Broadcast log with gaps, cursors with their times, a held broadcast.
    let mut log = BroadcastFile::default();
    let mut offset = 10;
    for (i, gap) in s.log_gaps.iter().enumerate() {
        offset += gap;
        let mut r = record(offset, "b/x", &s.payload, i as u64);
        r.shared_copy = i % 2 == 1;
        log.messages.push(r);
    }
    log.next = offset + 1;
    log.floor = log.messages.first().map_or(log.next, |m| m.offset);
    log.bytes = sum(&log.messages);
    log.cursors = vec![
        Position {
            reader: "mqtt:dev-a".into(),
            offset: log.floor,
            saved_at: s.saved_at + 6,
            session_expiry: None,
        },
        Position {
            reader: "mqtt:dev-b".into(),
            offset: log.next,
            saved_at: s.saved_at + 7,
            session_expiry: None,
        },
    ];
    log.held = vec![held("dev-a", 9, 2)];
    let group = SharedGroupKey {
        group: "workers".into(),
        filter: "b/#".into(),
    };
    let offsets: Vec<u64> = log.messages.iter().map(|m| m.offset).collect();
    let returned: Vec<u64> = s
        .returned_order
        .iter()
        .filter_map(|i| offsets.get(*i).copied())
        .collect();
    let session = |id: &str, inflight: Vec<InflightEntry>| Session {
        client_id: id.into(),
        principal: Some(format!("user-{id}")),
        expiry_interval: 3600,
        detached_at: AT - 9,
        subscriptions: vec![Subscription {
            filter: "$share/workers/b/#".into(),
            qos: 2,
            no_local: false,
            retain_as_published: true,
            retain_handling: 1,
            subscription_id: Some(5),
            log_offset: log.floor,
        }],
        will: None,
        window: 4,
        inflight,
    };
    let sessions = SessionsFile {
        sessions: vec![
            session(
                "dev-a",
                vec![InflightEntry {
                    log_offset: log.floor,
                    packet_id: 3,
                    qos: 2,
                    phase: InflightPhase::AwaitingComp,
                    shared_group: Some(group.clone()),
                }],
            ),
            session("dev-b", Vec::new()),
        ],
        shared_groups: vec![SharedGroup {
            key: group,
            cursor: log.next,
            returned,
        }],
    };
    out.push((BROADCAST_FILE.into(), SnapshotFile::Broadcast(log)));
    out.push((SESSIONS_FILE.into(), SnapshotFile::Sessions(sessions)));
    let mut manifest = Manifest {
        began_at: AT,
        channels: out
            .iter()
            .filter_map(|(_, f)| match f {
                SnapshotFile::Channel(c) => Some(ManifestEntry {
                    channel: c.name.clone(),
                    file_name: encode_file_name(&c.name),
                    kind: c.kind,
                }),
                _ => None,
            })
            .collect(),
        retained: true,
        sessions: true,
        broadcast: true,
    };
    // The shutdown writer lists channels in name order.
    manifest.channels.sort_by(|a, b| a.channel.cmp(&b.channel));
    out.push((MANIFEST_FILE.into(), SnapshotFile::Manifest(manifest)));
    out
}

fn write_world(dir: &Path, s: &Shape) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, file) in world(s) {
        std::fs::write(dir.join(name), f21::encode(&file, AT)).unwrap();
    }
}

/// Every data file's bytes without what a writer stamps (the header's
/// writer and written-at, the checksum over them: FORMAT.md §2.1, a 45-byte
/// header and a 4-byte trailer), by the fixed name of what it holds: a
/// generation's number is taken out of a file's name. The manifests are
/// left out: a directory written before generations has a shutdown's, a
/// migration writes a generation's, and each names its own files.
fn bodies(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.ends_with(".snapshot")
                || (n.starts_with("saguin.") && n != "saguin.lock" && n != MANIFEST_FILE)
        })
        .map(|e| {
            let bytes = std::fs::read(e.path()).unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let name = saguin_format::channel_name::split_generation_file_name(&name)
                .map_or(name, |(base, _)| base);
            (name, bytes[45..bytes.len() - 4].to_vec())
        })
        .collect()
}

/// The file of the directory's current generation that holds what `base`
/// (a fixed name) names: itself in a directory written before
/// generations.
fn current(dir: &Path, base: &str) -> PathBuf {
    saguin::storage::generation::read_committed(dir)
        .files
        .iter()
        .find(|(store, _)| store.base_name() == base)
        .map_or_else(|| dir.join(base), |(_, f)| dir.join(&f.file_name))
}

fn decoded(dir: &Path, name: &str) -> SnapshotFile {
    f21::decode(&std::fs::read(current(dir, name)).unwrap())
        .unwrap()
        .1
}

fn to_sqlite(src: &Path, db: &Path) -> Output {
    saguin(&[
        "migrate".as_ref(),
        "to-sqlite".as_ref(),
        src.as_os_str(),
        db.as_os_str(),
    ])
}

fn to_snapshots(db: &Path, dir: &Path) -> Output {
    saguin(&[
        "migrate".as_ref(),
        "to-snapshots".as_ref(),
        db.as_os_str(),
        dir.as_os_str(),
    ])
}

/// A rich directory migrated into a database by the binary.
fn rich_database(root: &Path) -> PathBuf {
    let src = root.join("src");
    write_world(&src, &default_shape());
    let db = root.join("rich.db");
    ok(to_sqlite(&src, &db));
    db
}

fn sql(db: &Path, statement: &str) {
    Connection::open(db)
        .unwrap()
        .execute_batch(statement)
        .unwrap();
}

// ---- 1, 2, 3: fidelity ----------------------------------------------------

#[test]
fn item1_a_queues_own_positions_are_carried_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let db = rich_database(tmp.path());
    let back = tmp.path().join("back");
    let out = ok(saguin(&[
        "migrate".as_ref(),
        "to-snapshots".as_ref(),
        db.as_os_str(),
        back.as_os_str(),
        "--json".as_ref(),
    ]));
    let SnapshotFile::Channel(q) = decoded(&back, "jobs.snapshot") else {
        panic!("jobs.snapshot is a channel file")
    };
    let readers: Vec<&str> = q.positions.iter().map(|p| p.reader.as_str()).collect();
    assert_eq!(readers, ["bridge:q-audit", "bridge:q-mirror"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = doc["units"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "jobs")
        .unwrap()
        .clone();
    // Two of the queue's own and one of its dead-letter channel's.
    assert_eq!(jobs["counts_in"]["positions"], 3, "{jobs}");
    assert_eq!(jobs["counts_out"]["positions"], 3, "{jobs}");
    let sessions = doc["units"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["kind"] == "sessions")
        .unwrap()
        .clone();
    assert_eq!(sessions["counts_in"]["returned"], 3, "{sessions}");
    assert_eq!(sessions["counts_out"]["returned"], 3, "{sessions}");
}

#[test]
fn item2_broadcast_cursor_saved_at_is_carried() {
    let tmp = tempfile::tempdir().unwrap();
    let db = rich_database(tmp.path());
    let back = tmp.path().join("back");
    ok(to_snapshots(&db, &back));
    let SnapshotFile::Broadcast(log) = decoded(&back, BROADCAST_FILE) else {
        panic!("saguin.broadcast is a broadcast file")
    };
    let shape = default_shape();
    let times: Vec<i64> = log.cursors.iter().map(|c| c.saved_at).collect();
    assert_eq!(times, [shape.saved_at + 6, shape.saved_at + 7]);
}

#[test]
fn item3_returned_deliveries_keep_the_order_returned_through_sqlite() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let shape = default_shape();
    write_world(&src, &shape);
    let SnapshotFile::Sessions(before) = decoded(&src, SESSIONS_FILE) else {
        panic!()
    };
    let order = before.shared_groups[0].returned.clone();
    assert!(
        order.windows(2).any(|w| w[0] > w[1]),
        "the case returns out of offset order: {order:?}"
    );
    let db = tmp.path().join("s.db");
    ok(to_sqlite(&src, &db));
    let back = tmp.path().join("back");
    ok(to_snapshots(&db, &back));
    let SnapshotFile::Sessions(after) = decoded(&back, SESSIONS_FILE) else {
        panic!()
    };
    assert_eq!(after.shared_groups[0].returned, order);
}

// ---- 4, 5, 6: code and document agree -------------------------------------

fn format_md() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("format/FORMAT.md")).unwrap()
}

#[test]
fn item4_retained_offsets_are_written_as_the_store_holds_them_as_documented() {
    let tmp = tempfile::tempdir().unwrap();
    let db = rich_database(tmp.path());
    let back = tmp.path().join("back");
    ok(to_snapshots(&db, &back));
    let SnapshotFile::Retained(r) = decoded(&back, saguin_format::channel_name::RETAINED_FILE)
    else {
        panic!()
    };
    let offsets: Vec<u64> = r.records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [4, 7, 10], "the store's own offsets, not 0");
    let doc = format_md();
    assert!(
        !doc.contains("are written as `0`") && !doc.contains("(written `0`, ignored)"),
        "FORMAT.md still says retained offsets are written as 0"
    );
    assert!(doc.contains("saguin writes the store's own offsets"));
}

#[test]
fn item5_a_queue_items_offset_is_named_through_its_record() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_world(&src, &default_shape());
    let mut files = world(&default_shape());
    let (_, SnapshotFile::Channel(q)) = files
        .iter_mut()
        .find(|(n, _)| n == "jobs.snapshot")
        .unwrap()
    else {
        panic!()
    };
    q.items[1].record.offset = q.items[0].record.offset;
    std::fs::write(
        src.join("jobs.snapshot"),
        f21::encode(&SnapshotFile::Channel(q.clone()), AT),
    )
    .unwrap();
    let out = saguin(&["snapshot".as_ref(), "verify".as_ref(), src.as_os_str()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("items[1].record.offset"), "{stdout}");
    assert!(format_md().contains("`items[2].record.offset`"));
}

#[test]
fn item6_an_identifier_holding_nul_is_refused_in_every_place() {
    let cases: [(&str, Mutation); 4] = [
        ("sessions[0].client_id", |files| {
            for (_, f) in files.iter_mut() {
                if let SnapshotFile::Sessions(s) = f {
                    s.sessions[1].client_id = "dev\0b".into();
                    s.sessions.swap(0, 1);
                }
                if let SnapshotFile::Broadcast(b) = f {
                    b.cursors.retain(|c| c.reader != "mqtt:dev-b");
                }
            }
        }),
        ("positions[1].reader", |files| {
            for (_, f) in files.iter_mut() {
                if let SnapshotFile::Channel(c) = f {
                    if c.name == "telemetry" {
                        c.positions[1].reader = "mqtt:reader\0".into();
                    }
                }
            }
        }),
        ("held[0].client_id", |files| {
            for (_, f) in files.iter_mut() {
                if let SnapshotFile::Channel(c) = f {
                    if c.name == "telemetry" {
                        c.held[0].client_id = "pub\0a".into();
                    }
                }
            }
        }),
        ("records[0].client_id", |files| {
            for (_, f) in files.iter_mut() {
                if let SnapshotFile::Channel(c) = f {
                    if c.name == "telemetry" {
                        c.records[0].client_id = "\0".into();
                    }
                }
            }
        }),
    ];
    for (field, mutate) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let mut files = world(&default_shape());
        mutate(&mut files);
        for (name, file) in &files {
            std::fs::write(tmp.path().join(name), f21::encode(file, AT)).unwrap();
        }
        let out = saguin(&[
            "snapshot".as_ref(),
            "verify".as_ref(),
            tmp.path().as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{field}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(field) && stdout.contains("NUL"),
            "{field}: {stdout}"
        );
    }
    assert!(format_md().contains("**Identifiers.** One rule holds for every identifier"));
}

// ---- 7: the checker is the migrator --------------------------------------

fn refused_naming(db: &Path, root: &Path, expect: &[&str]) {
    let dest = root.join("out");
    let out = to_snapshots(db, &dest);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not verify"), "{err}");
    for e in expect {
        assert!(err.contains(e), "{e:?} in {err}");
    }
    assert!(!dest.exists(), "nothing is created");
    let verify = saguin(&["sqlite".as_ref(), "verify".as_ref(), db.as_os_str()]);
    assert_eq!(verify.status.code(), Some(1), "{}", text(&verify));
    let stdout = String::from_utf8_lossy(&verify.stdout);
    for e in expect {
        assert!(stdout.contains(e), "sqlite verify names {e:?}: {stdout}");
    }
}

#[test]
fn item7_migrate_refuses_a_database_that_does_not_verify_naming_each_finding() {
    let cases: [(&str, &[&str]); 6] = [
        (
            "UPDATE channels SET bytes = 1 WHERE name = 'telemetry'",
            &["channels: channel \"telemetry\": bytes is 1"],
        ),
        (
            "DELETE FROM channels WHERE name = 'telemetry'",
            &["records: channel \"telemetry\": 5 records of a channel that has no channels row"],
        ),
        (
            "DELETE FROM channels WHERE name = 'jobs.dlq'",
            &["channel \"jobs\": the queue has no row for its dead-letter channel \"jobs.dlq\""],
        ),
        (
            "UPDATE sessions SET client_id = 'dev-z' WHERE client_id = 'dev-a'",
            &["in-flight entries of client \"dev-a\", which has no sessions row"],
        ),
        (
            "DELETE FROM records WHERE channel = '$saguin/broadcast' AND offset = (SELECT max(offset) FROM records WHERE channel = '$saguin/broadcast')",
            &["channels: channel \"$saguin/broadcast\": bytes is"],
        ),
        (
            "UPDATE records SET offset = offset + 10 WHERE channel = 'telemetry' AND offset = (SELECT max(offset) FROM records WHERE channel = 'telemetry')",
            &["records: channel \"telemetry\": offset 17: the channel's next is 8"],
        ),
    ];
    for (statement, expect) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let db = rich_database(tmp.path());
        sql(&db, statement);
        refused_naming(&db, tmp.path(), expect);
    }
}

#[test]
fn item7_migrate_refuses_a_truncated_database() {
    let tmp = tempfile::tempdir().unwrap();
    let db = rich_database(tmp.path());
    let bytes = std::fs::read(&db).unwrap();
    std::fs::write(&db, &bytes[..bytes.len() - 4096]).unwrap();
    let dest = tmp.path().join("out");
    let out = to_snapshots(&db, &dest);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(!dest.exists());
    let verify = saguin(&["sqlite".as_ref(), "verify".as_ref(), db.as_os_str()]);
    assert_ne!(verify.status.code(), Some(0), "{}", text(&verify));
}

#[test]
fn item7_to_sqlite_refuses_a_directory_snapshot_verify_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_world(&src, &default_shape());
    // The sessions point into a log that is no longer there.
    let SnapshotFile::Broadcast(mut log) = decoded(&src, BROADCAST_FILE) else {
        panic!()
    };
    log.messages.clear();
    log.cursors.clear();
    log.held.clear();
    log.next = 1;
    log.floor = 1;
    log.bytes = 0;
    std::fs::write(
        src.join(BROADCAST_FILE),
        f21::encode(&SnapshotFile::Broadcast(log), AT),
    )
    .unwrap();
    let verify = saguin(&["snapshot".as_ref(), "verify".as_ref(), src.as_os_str()]);
    assert_eq!(verify.status.code(), Some(1), "{}", text(&verify));
    let db = tmp.path().join("s.db");
    let out = to_sqlite(&src, &db);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("saguin.sessions does not fit saguin.broadcast"),
        "{err}"
    );
    assert!(!db.exists());
}

#[test]
fn item7_sqlite_backup_refuses_a_copy_whose_rows_contradict_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    let db = rich_database(tmp.path());
    sql(
        &db,
        "UPDATE channels SET bytes = 1 WHERE name = 'telemetry'",
    );
    let dest = tmp.path().join("backup.db");
    let out = saguin(&[
        "sqlite".as_ref(),
        "backup".as_ref(),
        db.as_os_str(),
        dest.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bytes is 1"), "{err}");
    assert!(!dest.exists());
}

// ---- 8: crash-safe ---------------------------------------------------------

fn staging_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".migrate.tmp"))
        .collect()
}

/// Files created in a directory, as the kernel reports them (inotify): a
/// test waits on the event instead of polling the directory.
struct CreatedIn(std::os::fd::OwnedFd);

impl CreatedIn {
    fn watch(dir: &Path) -> CreatedIn {
        use std::os::fd::FromRawFd;
        let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: plain syscalls on a descriptor this value owns.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK);
            assert!(fd >= 0, "inotify_init1");
            assert!(libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_CREATE) >= 0);
            CreatedIn(std::os::fd::OwnedFd::from_raw_fd(fd))
        }
    }

    /// Until something was created (or `most` passed), then drain.
    fn wait(&self, most: std::time::Duration) {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(most.as_millis()).unwrap_or(i32::MAX);
        let mut buf = [0u8; 4096];
        // SAFETY: one pollfd, and a read into a buffer of its stated size.
        unsafe {
            libc::poll(&mut poll, 1, ms);
            while libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) > 0 {}
        }
    }
}

/// A directory large enough that a migration of it is still writing when
/// its temporary file is first seen.
fn big_dir(dir: &Path) {
    let mut shape = default_shape();
    shape.append = 200_000;
    shape.payload = vec![b'x'; 64];
    write_world(dir, &shape);
}

#[test]
fn item8_a_migration_stopped_half_way_leaves_nothing_at_the_destination() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    big_dir(&src);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let db = out_dir.join("s.db");
    // Watched before the migration starts, so its creation is not missed.
    let created = CreatedIn::watch(&out_dir);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["migrate", "to-sqlite"])
        .arg(&src)
        .arg(&db)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the event: the temporary database appears (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while staging_entries(&out_dir).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the migration ended before its temporary file was seen"
        );
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "no temporary file");
        created.wait(left);
    }
    // SIGTERM, as a supervisor stops it.
    let pid = child.id() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(!status.success(), "the migration was stopped, not finished");
    assert!(!db.exists(), "a stopped migration leaves no database at DB");
    // A retry is not blocked by what the stopped one left under its
    // temporary name, and leaves nothing of its own behind.
    let left = staging_entries(&out_dir);
    ok(to_sqlite(&src, &db));
    assert!(db.exists());
    assert_eq!(staging_entries(&out_dir), left);
    ok(saguin(&[
        "sqlite".as_ref(),
        "verify".as_ref(),
        db.as_os_str(),
    ]));
}

#[test]
fn item8_a_directory_destination_is_built_beside_it_and_renamed_into_place() {
    let tmp = tempfile::tempdir().unwrap();
    let db = rich_database(tmp.path());
    // A leftover of a stopped migration blocks nothing.
    std::fs::create_dir(tmp.path().join(".out.1.migrate.tmp")).unwrap();
    let dest = tmp.path().join("out");
    ok(to_snapshots(&db, &dest));
    assert!(dest.join(MANIFEST_FILE).exists());
    assert_eq!(staging_entries(tmp.path()), [".out.1.migrate.tmp"]);
    // An empty directory is replaced; one holding anything is refused.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    ok(to_snapshots(&db, &empty));
    let busy = tmp.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("saguin.lock"), b"").unwrap();
    let out = to_snapshots(&db, &busy);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty (it holds saguin.lock)"));
}

// ---- 9: round trips --------------------------------------------------------

fn migrate_lib(
    source: saguin::storage::migrate::Source,
    dest: saguin::storage::migrate::Destination,
) {
    let report =
        saguin::storage::migrate::migrate(&source, &dest, &saguin::storage::migrate::NoProgress)
            .unwrap();
    assert!(
        report.is_complete(),
        "{:?} {:?}",
        report.failures,
        report.units
    );
}

/// Every row of every table but `meta` (who created the file, and when),
/// in a fixed order; a shared group's returned deliveries in the order kept.
fn rows(db: &Path) -> Vec<String> {
    let conn = Connection::open(db).unwrap();
    let mut out = Vec::new();
    for table in saguin::storage::sqlite::schema::TABLES {
        if table == "meta" {
            continue;
        }
        let order = if table == "share_returned" {
            "group_name, filter, rowid"
        } else {
            "1, 2, 3"
        };
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
            .unwrap();
        let n = stmt.column_count();
        let mut q = stmt.query([]).unwrap();
        while let Some(r) = q.next().unwrap() {
            let values: Vec<String> = (0..n)
                .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                .collect();
            out.push(format!("{table}: {}", values.join(", ")));
        }
    }
    out
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        0u64..12,
        1u64..50,
        proptest::collection::vec(1u64..4, 0..6),
        0u64..4,
        0u64..7,
        0u64..5,
        proptest::collection::vec(1u64..4, 1..8),
        Just(()).prop_perturb(|_, mut rng| {
            let mut order: Vec<usize> = (0..6).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (rng.next_u32() as usize) % (i + 1));
            }
            order.truncate(3);
            order
        }),
        proptest::collection::vec(any::<u8>(), 0..40),
        0i64..1_000_000,
    )
        .prop_map(
            |(
                append,
                append_floor,
                queue_gaps,
                dead_letters,
                latest,
                retained,
                log_gaps,
                returned_order,
                payload,
                t,
            )| Shape {
                append,
                append_floor,
                queue_gaps,
                dead_letters,
                latest,
                retained,
                log_gaps,
                returned_order,
                payload,
                saved_at: AT - t,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn item9_directory_sqlite_directory_is_byte_identical_and_sqlite_directory_sqlite_row_identical(s in shape()) {
        use saguin::storage::migrate::{Destination, Source};
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        write_world(&src, &s);
        let db = tmp.path().join("a.db");
        migrate_lib(Source::SnapshotDir(src.clone()), Destination::Sqlite(db.clone()));
        let back = tmp.path().join("back");
        migrate_lib(Source::Sqlite(db.clone()), Destination::SnapshotDir(back.clone()));
        prop_assert_eq!(bodies(&src), bodies(&back));
        let again = tmp.path().join("b.db");
        migrate_lib(Source::SnapshotDir(back), Destination::Sqlite(again.clone()));
        prop_assert_eq!(rows(&db), rows(&again));
    }
}

#[test]
fn item9_a_directory_with_every_kind_of_row_round_trips_through_the_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_world(&src, &default_shape());
    let db = tmp.path().join("a.db");
    ok(to_sqlite(&src, &db));
    let back = tmp.path().join("back");
    ok(to_snapshots(&db, &back));
    assert_eq!(bodies(&src), bodies(&back));
    let again = tmp.path().join("b.db");
    ok(to_sqlite(&back, &again));
    assert_eq!(rows(&db), rows(&again));
}

// ---- 10: snapshot verify verdicts -----------------------------------------

#[test]
fn item10_snapshot_verify_says_no_to_an_empty_directory_and_to_a_listed_file_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = saguin(&["snapshot".as_ref(), "verify".as_ref(), empty.as_os_str()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("FAIL"),
        "{}",
        text(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing in it to verify"));

    let src = tmp.path().join("src");
    write_world(&src, &default_shape());
    std::fs::remove_file(src.join("state.snapshot")).unwrap();
    let out = saguin(&[
        "snapshot".as_ref(),
        "verify".as_ref(),
        src.as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let finding = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "listed-but-missing")
        .unwrap()
        .clone();
    assert_eq!(finding["verdict"], "fail", "{finding}");
    assert_eq!(
        finding["severity"], "warning",
        "the broker still starts: {finding}"
    );
    // A benign warning stays a warning.
    let src2 = tmp.path().join("src2");
    write_world(&src2, &default_shape());
    std::fs::write(src2.join("state.snapshot.tmp"), b"half").unwrap();
    let out = ok(saguin(&[
        "snapshot".as_ref(),
        "verify".as_ref(),
        src2.as_os_str(),
    ]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("WARN"));
}

// ---- 11: sqlite verify ------------------------------------------------------

#[test]
fn item11_sqlite_verify_passes_a_good_database_and_names_table_channel_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let db = rich_database(tmp.path());
    let out = ok(saguin(&[
        "sqlite".as_ref(),
        "verify".as_ref(),
        db.as_os_str(),
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("OK "), "{stdout}");
    assert!(stdout.contains("no findings"), "{stdout}");
    let quiet = ok(saguin(&[
        "sqlite".as_ref(),
        "verify".as_ref(),
        db.as_os_str(),
        "--quiet".as_ref(),
    ]));
    assert!(quiet.stdout.is_empty());

    // A stray DELETE makes a hole (invariant 1).
    sql(
        &db,
        "DELETE FROM records WHERE channel = 'telemetry' AND offset = 5",
    );
    let out = saguin(&[
        "sqlite".as_ref(),
        "verify".as_ref(),
        db.as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["exit_code"], 1);
    let hole = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "hole")
        .unwrap()
        .clone();
    assert_eq!(hole["table"], "records");
    assert_eq!(hole["channel"], "telemetry");
    assert_eq!(hole["offset"], 5);
    let quiet = saguin(&[
        "sqlite".as_ref(),
        "verify".as_ref(),
        db.as_os_str(),
        "--quiet".as_ref(),
    ]);
    assert_eq!(quiet.status.code(), Some(1));
    assert!(quiet.stdout.is_empty());
}

#[test]
fn item11_sqlite_verify_is_read_only_and_never_creates_a_database() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("none.db");
    let out = saguin(&["sqlite".as_ref(), "verify".as_ref(), missing.as_os_str()]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(!missing.exists());
    let db = rich_database(tmp.path());
    let before = std::fs::read(&db).unwrap();
    ok(saguin(&[
        "sqlite".as_ref(),
        "verify".as_ref(),
        db.as_os_str(),
    ]));
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn item11_a_database_cut_short_emptied_or_never_one_fails_sqlite_verify() {
    // What a backup script meets on a disk that filled or failed: each is
    // a file that must not be kept, so each is a "no" (1) with its
    // finding, never "could not check" (3).
    let tmp = tempfile::tempdir().unwrap();
    let good = std::fs::read(rich_database(tmp.path())).unwrap();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("cut.db", good[..good.len() / 2].to_vec(), "integrity"),
        ("empty.db", Vec::new(), "schema-version"),
        ("noise.db", vec![0x5a; 8192], "integrity"),
    ];
    for (name, bytes, code) in cases {
        let db = tmp.path().join(name);
        std::fs::write(&db, &bytes).unwrap();
        let out = saguin(&[
            "sqlite".as_ref(),
            "verify".as_ref(),
            db.as_os_str(),
            "--json".as_ref(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["ok"], false, "{name}: {doc}");
        assert_eq!(doc["exit_code"], 1, "{name}: {doc}");
        assert!(
            doc["findings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["code"] == code),
            "{name}: {doc}"
        );
        let human = saguin(&["sqlite".as_ref(), "verify".as_ref(), db.as_os_str()]);
        assert_eq!(human.status.code(), Some(1), "{name}: {}", text(&human));
        assert!(
            String::from_utf8_lossy(&human.stdout).contains("FAIL "),
            "{name}: {}",
            text(&human)
        );
        // Read, never repaired or added to.
        assert_eq!(std::fs::read(&db).unwrap(), bytes, "{name}");
    }
}

#[test]
fn item11_sqlite_verify_checks_positions_windows_and_stored_sizes() {
    let cases: [(&str, &str); 4] = [
        (
            "UPDATE positions SET offset = 99 WHERE channel = 'telemetry' AND reader = 'bridge:uplink'",
            "positions: channel \"telemetry\": offset 99: reader \"bridge:uplink\" is past the channel's next 8",
        ),
        (
            "UPDATE sessions SET window = 1; INSERT INTO session_inflight (client_id, seq, log_offset, packet_id, qos, phase) VALUES ('dev-a', 5, 11, 4, 1, 'awaiting_ack')",
            "holds more in-flight entries than its window 1",
        ),
        (
            "UPDATE records SET size = size + 1 WHERE channel = 'jobs.dlq' AND offset = 1",
            "records: channel \"jobs.dlq\": offset 1: size is stored as",
        ),
        (
            "UPDATE channels SET floor = 4 WHERE name = 'telemetry'",
            "records: channel \"telemetry\": offset 3: below the channel's floor 4",
        ),
    ];
    for (statement, expect) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let db = rich_database(tmp.path());
        sql(&db, statement);
        let out = saguin(&["sqlite".as_ref(), "verify".as_ref(), db.as_os_str()]);
        assert_eq!(out.status.code(), Some(1), "{statement}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(expect),
            "{expect:?}: {}",
            text(&out)
        );
    }
}

// ---- 20: the destination's parent ------------------------------------------

#[test]
fn item20_migrate_refuses_a_destination_whose_parent_does_not_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let db = rich_database(tmp.path());
    let src = tmp.path().join("src");
    for (out, dest) in [
        (
            to_snapshots(&db, &tmp.path().join("no/such/dir")),
            tmp.path().join("no"),
        ),
        (
            to_sqlite(&src, &tmp.path().join("nowhere/s.db")),
            tmp.path().join("nowhere"),
        ),
    ] {
        assert_eq!(out.status.code(), Some(3), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("does not exist"), "{err}");
        assert!(!dest.exists(), "nothing is created");
    }
}
