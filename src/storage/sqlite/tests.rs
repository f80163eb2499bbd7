//! Unit tests of the sqlite provider against real files.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use bytes::Bytes;
use saguin_format::model::{Record, UserProperty};

use super::*;
use crate::storage::contract::{
    AppendStore, HeldPublish, InflightEntry, InflightPhase, Released, SessionEntry,
    ShareGroupEntry, ShareGroupKey, SubscriptionEntry, WillEntry,
};

fn options(dir: &Path) -> SqliteOptions {
    let mut o = SqliteOptions::new("db", dir.join("saguin.db"));
    o.read_connections = 2;
    o
}

fn rec(topic: &str, payload: &str, ts: i64) -> Record {
    let mut r = Record::new(topic, Bytes::from(payload.to_string()));
    r.timestamp = ts;
    r.client_id = "c1".into();
    r.qos = 1;
    r
}

fn append(p: &SqliteProvider, name: &str) -> Arc<dyn AppendStore> {
    p.open_channel(name, ChannelKind::Append)
        .unwrap()
        .as_append()
        .unwrap()
        .clone()
}

fn queue(p: &SqliteProvider, name: &str) -> Arc<dyn crate::storage::contract::QueueStore> {
    p.open_channel(name, ChannelKind::Queue)
        .unwrap()
        .as_queue()
        .unwrap()
        .clone()
}

#[test]
fn a_new_database_is_private_wal_and_schema_20() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let path = dir.path().join("saguin.db");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(dir.path().join("saguin.db.lock").exists());
    // A second broker is refused at once, naming the lock.
    let err = SqliteProvider::open(options(dir.path())).unwrap_err();
    assert!(matches!(err, SqliteOpenError::Locked(_)), "{err}");
    assert!(err.to_string().contains("saguin.db.lock"), "{err}");
    p.close().unwrap();

    let conn = open_read_only(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let page: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(page, 4096);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND sql LIKE '%STRICT%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 11);
    let (by, at) = schema::creator(&conn).unwrap();
    assert_eq!(by, WRITER_REVISION);
    assert!(at > 0);
    // Closing checkpointed: the main file stands alone.
    let wal = std::fs::metadata(dir.path().join("saguin.db-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert_eq!(wal, 0);
}

/// A file whose table lost a column is refused at open, by the read
/// statements prepared there, not at the first read that needs it.
#[test]
fn a_table_missing_a_column_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    SqliteProvider::open(options(dir.path()))
        .unwrap()
        .close()
        .unwrap();
    Connection::open(dir.path().join("saguin.db"))
        .unwrap()
        .execute_batch("ALTER TABLE latest_values DROP COLUMN owed_to")
        .unwrap();
    let err = SqliteProvider::open(options(dir.path())).unwrap_err();
    assert!(
        matches!(&err, SqliteOpenError::Sqlite { context, .. } if *context == "preparing the read statements"),
        "{err:?}"
    );
    assert!(err.to_string().contains("owed_to"), "{err}");
}

#[test]
fn another_schema_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saguin.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE meta (id INTEGER PRIMARY KEY, schema_version INTEGER, created_by TEXT, created_at INTEGER);
         INSERT INTO meta VALUES (1, 5, '0123456789ab', 1767225600000000000);
         PRAGMA user_version = 5;",
    )
    .unwrap();
    drop(conn);
    let err = SqliteProvider::open(options(dir.path())).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "storage {}: schema version 5 (created by saguin 0123456789ab at 2026-01-01T00:00:00Z); this broker reads version 20",
            path.display()
        )
    );
    let err = open_read_only(&path).unwrap_err();
    assert!(err.to_string().contains("schema version 5"), "{err}");

    // Tables and no version: not adopted.
    let path2 = dir.path().join("other.db");
    Connection::open(&path2)
        .unwrap()
        .execute_batch("CREATE TABLE records (x INTEGER);")
        .unwrap();
    let err = SqliteProvider::open(SqliteOptions::new("db", &path2)).unwrap_err();
    assert!(matches!(err, SqliteOpenError::Unversioned { .. }), "{err}");

    // Not a database at all.
    let path3 = dir.path().join("junk.db");
    std::fs::write(&path3, vec![7u8; 8192]).unwrap();
    let err = SqliteProvider::open(SqliteOptions::new("db", &path3)).unwrap_err();
    assert!(err.to_string().contains("junk.db"), "{err}");
}

#[test]
fn counters_are_stored_and_survive_emptying_and_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let p = SqliteProvider::open(options(dir.path())).unwrap();
        let s = append(&p, "telemetry");
        for i in 0..10 {
            let mut r = rec("telemetry/a", &format!("v{i}"), 1000 + i);
            r.user_properties.push(UserProperty {
                name: "k".into(),
                value: "v".into(),
            });
            r.props.correlation_data = Some(Bytes::from_static(&[1, 2, 3]));
            let stored = s.append(r).unwrap();
            assert_eq!(stored.offset, i as u64 + 1);
        }
        assert_eq!(s.next(), 11);
        assert_eq!(s.record_count(), 10);
        let all = s.read_from(1).unwrap();
        assert_eq!(all.len(), 10);
        assert_eq!(all[3].payload, Bytes::from("v3"));
        assert_eq!(all[3].user_properties.len(), 1);
        assert_eq!(
            all[3].props.correlation_data.as_deref(),
            Some(&[1u8, 2, 3][..])
        );
        let bytes = s.bytes();
        assert_eq!(bytes, all.iter().map(Record::accounted_size).sum::<u64>());

        let removed = s.trim(4, None).unwrap();
        assert_eq!(removed.records, 3);
        assert_eq!(s.floor(), 4);
        assert!(matches!(
            s.read_from(2),
            Err(StorageError::BelowFloor { floor: 4, .. })
        ));
        assert!(matches!(
            s.read_from(12),
            Err(StorageError::PastNext { .. })
        ));
        assert!(s.read_from(11).unwrap().is_empty());
        // Emptying the channel changes neither next nor (beyond the removal) floor.
        let removed = s.trim(100, None).unwrap();
        assert_eq!(removed.records, 7);
        assert_eq!(
            (s.next(), s.floor(), s.bytes(), s.record_count()),
            (11, 11, 0, 0)
        );
        p.close().unwrap();
    }
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let s = append(&p, "telemetry");
    assert_eq!((s.next(), s.floor(), s.bytes()), (11, 11, 0));
    assert_eq!(s.append(rec("telemetry/a", "x", 1)).unwrap().offset, 11);
    // Kinds are fixed.
    assert!(matches!(
        p.open_channel("telemetry", ChannelKind::Queue),
        Err(StorageError::KindMismatch { .. })
    ));
}

#[test]
fn trim_by_size_and_age_walk_from_the_oldest() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let s = append(&p, "t");
    for (i, ts) in [10, 20, 0, 5, 40].into_iter().enumerate() {
        s.append(rec("t", &format!("{i}23456789"), ts)).unwrap();
    }
    // 10 bytes each (topic 1 + payload 9).
    assert_eq!(s.bytes(), 50);
    // The unset timestamp stops the age walk.
    let removed = s.trim_older_than(30).unwrap();
    assert_eq!(removed.records, 2);
    assert_eq!(s.floor(), 3);
    // A clock step backwards: the earliest offset at or after, not the nearest.
    assert_eq!(s.first_at_or_after(5).unwrap(), Some(4));
    assert_eq!(s.first_at_or_after(41).unwrap(), None);
    let removed = s.trim(0, Some(15)).unwrap();
    assert_eq!((removed.records, removed.bytes), (2, 20));
    assert_eq!((s.floor(), s.bytes(), s.record_count()), (5, 10, 1));
}

#[test]
fn group_commit_hands_out_every_offset_once() {
    group_commit_round(Some(Duration::from_millis(2)), 16);
}

/// Without an interval a leader leads on while publishes are queued (up to
/// `LEAD_TURNS` batches); with a batch size of one every publish is its own
/// transaction and the lead still moves on.
#[test]
fn group_commit_without_an_interval_hands_out_every_offset_once() {
    group_commit_round(None, 256);
    group_commit_round(None, 1);
}

/// Eight publishers over two channels, 100 publishes each: every offset is
/// handed out once per channel, each publisher's offsets rise in the order
/// it published, and every publish is counted in exactly one transaction.
fn group_commit_round(interval: Option<Duration>, max_records: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.publish_commit_interval = interval;
    o.publish_commit_max_records = max_records;
    let p = SqliteProvider::open(o).unwrap();
    let a = append(&p, "a");
    let b = append(&p, "b");
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let s = if t % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            std::thread::spawn(move || {
                (0..100)
                    .map(|i| s.append(rec("x", &format!("{t}-{i}"), 1)).unwrap().offset)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let per_thread: Vec<Vec<u64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for mine in &per_thread {
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
    }
    let mut offsets: Vec<u64> = per_thread.into_iter().flatten().collect();
    offsets.sort_unstable();
    let mut expected: Vec<u64> = (1..=400).chain(1..=400).collect();
    expected.sort_unstable();
    assert_eq!(offsets, expected);
    assert_eq!((a.next(), b.next()), (401, 401));
    let rows: Vec<u64> = a.read_from(1).unwrap().iter().map(|r| r.offset).collect();
    assert_eq!(rows, (1..=400).collect::<Vec<_>>());
    let (batches, publishes) = p.group_commit_stats();
    assert_eq!(publishes, 800);
    assert!(batches >= 800u64.div_ceil(max_records as u64) && batches <= 800);
    if max_records == 1 {
        assert_eq!(batches, 800);
    }
}

#[test]
fn a_refusal_is_one_records_and_a_full_provider_is_quota() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.reserve = 64 * 1024;
    o.max_bytes = Some(1024 * 1024);
    let p = SqliteProvider::open(o).unwrap();
    let bounds = p.bounds().unwrap();
    assert_eq!(bounds.relief_pages, 256);
    assert_eq!(bounds.publish_pages, 240);
    let s = append(&p, "a");
    s.set_max_bytes(Some(25));
    s.append(rec("a", "123456789", 1)).unwrap();
    s.append(rec("a", "123456789", 1)).unwrap();
    let err = s.append(rec("a", "123456789", 1)).unwrap_err();
    assert!(matches!(err, StorageError::ChannelFull { .. }), "{err}");
    assert_eq!(err.mqtt_reason_code(), 0x97);
    assert_eq!(s.next(), 3);
    s.set_max_bytes(None);

    // Fill the provider to its publish ceiling.
    let big = "x".repeat(8000);
    let mut full = None;
    for _ in 0..200 {
        match s.append(rec("a", &big, 1)) {
            Ok(_) => {}
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    let err = full.expect("the provider never filled");
    assert!(matches!(err, StorageError::ProviderFull { .. }), "{err}");
    assert_eq!(err.mqtt_reason_code(), 0x97);
    let next = s.next();
    // Nothing was skipped or reused: the failed publish handed its offset back.
    assert_eq!(s.read_from(1).unwrap().last().unwrap().offset, next - 1);
    // A relief write (a stored position) still goes through, in the reserve.
    s.save_position(Position {
        reader: Reader::mqtt("consumer").unwrap(),
        offset: next,
        saved_at: contract::now_nanos(),
        session_expiry: Some(3600),
    })
    .unwrap();
    // Retention frees pages and publishes resume.
    s.trim(next - 5, None).unwrap();
    s.append(rec("a", &big, 1)).unwrap();
}

#[test]
fn bounds_that_round_to_nothing_or_below_twice_the_reserve_are_refused() {
    assert!(PageBounds::compute(100, 0, 4096).is_err());
    assert!(PageBounds::compute(1 << 20, 600 * 1024, 4096).is_err());
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.max_bytes = Some(1000);
    o.reserve = 10;
    let err = SqliteProvider::open(o).unwrap_err();
    assert!(err.to_string().contains("0 pages"), "{err}");
    assert!(
        !dir.path().join("saguin.db").exists(),
        "a refused bound creates nothing"
    );
}

/// What a latest channel counts in memory (its bytes, values and
/// markers) is read back at a reopen as it stood at the close.
#[test]
fn a_latest_channels_counts_and_markers_come_back_at_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let latest = |p: &SqliteProvider| {
        p.open_channel("devices", ChannelKind::Latest)
            .unwrap()
            .as_latest()
            .unwrap()
            .clone()
    };
    let before = {
        let p = SqliteProvider::open(options(dir.path())).unwrap();
        let l = latest(&p);
        for (topic, payload) in [
            ("devices/a", "1"),
            ("devices/b", "22"),
            ("devices/c", "333"),
        ] {
            l.set(rec(topic, payload, 1)).unwrap();
        }
        l.delete("devices/b").unwrap().unwrap();
        l.delete("devices/c").unwrap().unwrap();
        let before = (l.bytes(), l.record_count(), l.deletions());
        assert_eq!((before.1, before.2), (1, 2));
        p.close().unwrap();
        before
    };
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let l = latest(&p);
    assert_eq!((l.bytes(), l.record_count(), l.deletions()), before);
    // The markers themselves came back (offsets 4 and 5, after the three
    // values): the older one is forgotten first, the floor raised past it.
    let removed = l.forget_deletions(Some(1), None).unwrap();
    assert_eq!(removed.records, 1);
    assert_eq!(l.deletions(), 1);
    assert_eq!(l.floor(), 5);
}

#[test]
fn latest_values_deletions_and_their_floor() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let l = p
        .open_channel("devices", ChannelKind::Latest)
        .unwrap()
        .as_latest()
        .unwrap()
        .clone();
    assert_eq!(l.set(rec("devices/a", "1", 1)).unwrap().offset, 1);
    assert_eq!(l.set(rec("devices/b", "2", 1)).unwrap().offset, 2);
    assert_eq!(l.set(rec("devices/a", "3", 1)).unwrap().offset, 3);
    assert_eq!(l.record_count(), 2);
    assert_eq!(l.bytes(), 20);
    assert_eq!(
        l.get("devices/a").unwrap().unwrap().payload,
        Bytes::from("3")
    );
    let marker = l.delete("devices/b").unwrap().unwrap();
    assert_eq!((marker.offset, marker.payload.len()), (4, 0));
    assert!(l.delete("devices/zz").unwrap().is_none());
    assert_eq!(l.next(), 5);
    let all: Vec<(String, u64, usize)> = l
        .match_with_deletions("devices/#", 1)
        .unwrap()
        .into_iter()
        .map(|r| (r.topic, r.offset, r.payload.len()))
        .collect();
    assert_eq!(
        all,
        vec![("devices/a".into(), 3, 1), ("devices/b".into(), 4, 0)]
    );
    assert_eq!(l.match_filter("devices/+").unwrap().len(), 1);
    // What a restart reads: the values without the marker, shared as read.
    let values = l.values().unwrap();
    assert_eq!(
        values
            .iter()
            .map(|r| (&*r.topic, r.offset))
            .collect::<Vec<_>>(),
        vec![("devices/a", 3)]
    );
    let mut each = Vec::new();
    l.for_each_value(&mut |record| each.push(record)).unwrap();
    assert_eq!(each, values);
    l.trim(5).unwrap();
    assert!(matches!(
        l.match_with_deletions("#", 2),
        Err(StorageError::BelowFloor { .. })
    ));
    assert_eq!(l.match_with_deletions("#", 5).unwrap().len(), 0);
    // The floor passed a's value, which stays current below it; b's marker
    // below it was forgotten.
    assert_eq!((l.floor(), l.deletions()), (5, 0));
    assert_eq!(l.get("devices/a").unwrap().unwrap().offset, 3);
    let (floor, rows) = l.rows_from_n("#", 1, 10).unwrap();
    assert_eq!(
        (floor, rows.iter().map(|r| r.offset).collect::<Vec<_>>()),
        (5, vec![3])
    );
    assert_eq!(l.bytes(), 10, "b's marker gave its bytes back");
    // An empty payload through set deletes.
    // Markers count their size, as the memory provider's do.
    let m = l.set(rec("devices/a", "", 1)).unwrap();
    assert_eq!((m.offset, l.record_count(), l.bytes()), (5, 0, 9));
    assert_eq!(l.deletions(), 1);
}

#[test]
fn a_queue_leases_retries_and_dead_letters_in_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    {
        let p = SqliteProvider::open(options(dir.path())).unwrap();
        let q = queue(&p, "jobs");
        q.set_max_attempts(2);
        q.set_backoff(vec![Duration::from_secs(1)]);
        for i in 0..3 {
            q.enqueue(rec("jobs", &format!("job{i}"), 100)).unwrap();
        }
        assert_eq!((q.depth(), q.next()), (3, 4));
        let offer = q.offer(10, 1_000).unwrap();
        assert_eq!(offer.len(), 3);
        let lease = q.lease(1, "w1", 2_000, 1_000).unwrap();
        assert_eq!(lease.attempts, 1);
        assert!(q.lease(1, "w2", 2_000, 1_000).is_err(), "held");
        assert_eq!(q.offer(10, 1_000).unwrap().len(), 2);
        assert_eq!(q.expired_leases(2_000).len(), 1);
        let r = q
            .release(lease.delivery_id, lease.epoch, 1_500, "nack")
            .unwrap();
        assert_eq!(
            r,
            Released::Retry {
                offset: 1,
                not_before: 1_500 + 1_000_000_000
            }
        );
        assert_eq!(
            q.release(lease.delivery_id, lease.epoch, 1_500, "again")
                .unwrap(),
            Released::Stale
        );
        assert_eq!(q.offer(10, 2_000).unwrap().len(), 2, "backing off");
        let lease = q.lease(1, "w1", 3_000_000_000, 2_000_000_000).unwrap();
        assert_eq!(lease.attempts, 2);
        match q
            .release(
                lease.delivery_id,
                lease.epoch,
                2_000_000_001,
                "failed twice",
            )
            .unwrap()
        {
            Released::DeadLettered {
                offset: 1,
                dlq_offset: 1,
            } => {}
            other => panic!("{other:?}"),
        }
        let dlq = q.dead_letter();
        let dead = dlq.read_from(1).unwrap();
        assert_eq!(dead.len(), 1);
        let names: Vec<&str> = dead[0]
            .user_properties
            .iter()
            .map(|u| u.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "saguin-attempts",
                "saguin-first-delivered",
                "saguin-last-delivered",
                "saguin-dlq-reason"
            ]
        );
        assert_eq!(q.depth(), 2);
        let lease = q.lease(2, "w1", 10, 5).unwrap();
        assert!(q.resolve(lease.delivery_id, lease.epoch).unwrap());
        assert!(!q.resolve(lease.delivery_id, lease.epoch).unwrap());
        // One lease of offset 3 that the restart forgets: its attempt is kept.
        q.lease(3, "w1", 10, 5).unwrap();
        p.close().unwrap();
    }
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let q = queue(&p, "jobs");
    q.set_max_attempts(1);
    let items = q.items().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!((items[0].record.offset, items[0].attempts), (3, 1));
    assert_eq!((q.depth(), q.next()), (1, 4));
    assert_eq!(q.dead_letter_spent(100).unwrap(), 1);
    assert_eq!(q.depth(), 0);
    assert_eq!(q.dead_letter().next(), 3);
}

#[test]
fn expired_session_positions_are_dropped_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let p = SqliteProvider::open(options(dir.path())).unwrap();
        let s = append(&p, "t");
        s.append(rec("t", "1", 1)).unwrap();
        let save = |reader: Reader, saved_at, session_expiry| {
            s.save_position(Position {
                reader,
                offset: 2,
                saved_at,
                session_expiry,
            })
            .unwrap()
        };
        let now = contract::now_nanos();
        save(Reader::mqtt("zero").unwrap(), now, Some(0));
        save(
            Reader::mqtt("old").unwrap(),
            now - 7_200_000_000_000,
            Some(3600),
        );
        save(Reader::mqtt("fresh").unwrap(), now, Some(3600));
        save(Reader::bridge("cloud").unwrap(), 1, None);
        assert_eq!(s.lowest_position(), 2);
        p.close().unwrap();
    }
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let s = append(&p, "t");
    let readers: Vec<String> = s
        .positions()
        .unwrap()
        .iter()
        .map(|p| p.reader.to_string())
        .collect();
    assert_eq!(readers, ["bridge:cloud", "mqtt:fresh"]);
    assert!(s.drop_position(&Reader::bridge("cloud").unwrap()).unwrap());
}

#[test]
fn held_publishes_release_into_their_channel() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let s = append(&p, "t");
    let held = p.held_publishes().unwrap();
    held.hold(HeldPublish {
        channel: "t".into(),
        client_id: "c1".into(),
        packet_id: 7,
        held_at: 100,
        record: Record {
            qos: 2,
            ..rec("t/x", "exactly once", 50)
        },
    })
    .unwrap();
    assert_eq!(held.held().unwrap().len(), 1);
    assert_eq!(s.next(), 1, "a hold takes no offset");
    let stored = held.release("t", "c1", 7).unwrap().unwrap();
    assert_eq!(stored.offset, 1);
    assert_eq!(s.next(), 2);
    assert!(held.release("t", "c1", 7).unwrap().is_none());
    assert_eq!(
        s.read_from(1).unwrap()[0].payload,
        Bytes::from("exactly once")
    );
    held.hold(HeldPublish {
        channel: "t".into(),
        client_id: "c1".into(),
        packet_id: 8,
        held_at: 100,
        record: Record {
            qos: 2,
            ..rec("t/x", "late", 50)
        },
    })
    .unwrap();
    assert_eq!(held.expire_older_than(101).unwrap(), 1);
}

#[test]
fn sessions_and_the_broadcast_log_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let session = SessionEntry {
        client_id: "dev-1".into(),
        principal: Some("alice".into()),
        expiry_interval: 3600,
        detached_at: 0,
        subscriptions: vec![SubscriptionEntry {
            filter: "$share/g/a/#".into(),
            qos: 1,
            no_local: true,
            retain_as_published: false,
            retain_handling: 2,
            subscription_id: Some(9),
            log_offset: 1,
        }],
        will: Some(WillEntry {
            topic: "bye".into(),
            payload: Bytes::from_static(&[0, 1, 2]),
            qos: 1,
            retain: true,
            delay_interval: 5,
            props: Default::default(),
            user_properties: vec![UserProperty {
                name: "a".into(),
                value: "b".into(),
            }],
        }),
        window: 2,
        inflight: vec![InflightEntry {
            log_offset: 2,
            packet_id: 11,
            qos: 2,
            phase: InflightPhase::AwaitingComp,
            shared_group: Some(ShareGroupKey {
                group: "g".into(),
                filter: "a/#".into(),
            }),
        }],
    };
    {
        let p = SqliteProvider::open(options(dir.path())).unwrap();
        let sessions = p.sessions().unwrap();
        sessions.save(session.clone()).unwrap();
        let log = p.broadcast_log().unwrap();
        for i in 0..4 {
            assert_eq!(
                log.append(rec("b", &format!("{i}"), 1)).unwrap().offset,
                i + 1
            );
        }
        log.save_cursor("dev-1", 2).unwrap();
        log.save_cursor("gone", 1).unwrap();
        let freed = log.release(&[1, 3]).unwrap();
        assert_eq!(freed.records, 2);
        assert_eq!((log.floor(), log.record_count(), log.next()), (2, 2, 5));
        let held: Vec<u64> = log
            .read_from_n(1, 10)
            .unwrap()
            .iter()
            .map(|r| r.offset)
            .collect();
        assert_eq!(held, [2, 4]);
        log.save_share_group(ShareGroupEntry {
            key: ShareGroupKey {
                group: "g".into(),
                filter: "a/#".into(),
            },
            cursor: 3,
            returned: vec![2],
        })
        .unwrap();
        p.close().unwrap();
    }
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    assert_eq!(
        p.sessions().unwrap().get("dev-1").unwrap().unwrap(),
        session
    );
    let log = p.broadcast_log().unwrap();
    assert_eq!((log.floor(), log.record_count(), log.next()), (2, 2, 5));
    // The cursor of a session not held went at open.
    assert_eq!(log.cursors().unwrap(), vec![("dev-1".to_string(), 2)]);
    assert_eq!(log.share_groups().unwrap()[0].returned, vec![2]);
    assert!(p.sessions().unwrap().remove("dev-1").unwrap());
    assert_eq!(log.cursor("dev-1").unwrap(), None);
}

#[test]
fn a_tool_reads_a_running_provider_through_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let s = append(&p, "t");
    for _ in 0..5 {
        s.append(rec("t", "x", 1)).unwrap();
    }
    let conn = open_read_only(&dir.path().join("saguin.db")).unwrap();
    let n: i64 = conn
        .query_row(
            "SELECT count(*) FROM records WHERE channel = 't'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 5);
    assert!(
        conn.execute("DELETE FROM records", []).is_err(),
        "read-only"
    );
}

#[test]
fn the_flusher_syncs_after_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.flush_interval = Duration::from_millis(10);
    let p = SqliteProvider::open(o).unwrap();
    let s = append(&p, "t");
    let before = p.flushes();
    s.append(rec("t", "x", 1)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.flushes() == before {
        assert!(Instant::now() < deadline, "no flush within 10s");
        std::thread::yield_now();
    }
    assert_eq!(p.storage_errors(), 0);
}

/// Checkpoints beside a writer that never pauses end behind it, so
/// without a restart the log only grows. A restart is counted only when
/// SQLite wrote the log's header again, with a new salt.
#[test]
fn the_log_starts_again_while_commits_never_pause_and_readers_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.flush_interval = Duration::from_millis(10);
    o.wal_restart_bytes = 256 * 1024;
    let p = SqliteProvider::open(o).unwrap();
    let s = append(&p, "t");
    let stop = Arc::new(AtomicBool::new(false));
    let reading = {
        let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let next = s.next();
                s.read_from_n(next.saturating_sub(8).max(1), 8).unwrap();
                reads += 1;
            }
            reads
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut commits = 0u64;
    while p.wal_restarts() < 4 {
        assert!(
            Instant::now() < deadline,
            "the log was not started again 4 times within 120s"
        );
        s.append(rec("t", "x", 1)).unwrap();
        commits += 1;
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reading.join().unwrap() > 0);
    assert_eq!(p.storage_errors(), 0);
    // Each restart cut the log's file back to its bound, so the file is
    // the bound or the frames written since the last restart, whichever
    // is more; a file left at what the log once grew to (many MiB here)
    // is more than both.
    let frames: u64 = rusqlite::Connection::open(dir.path().join("saguin.db"))
        .unwrap()
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
        .unwrap();
    let wal = std::fs::metadata(dir.path().join("saguin.db-wal"))
        .unwrap()
        .len();
    let written = 32 + frames * (PAGE_SIZE + 24);
    assert!(
        wal <= written.max(256 * 1024),
        "the log's file holds {wal} bytes for {frames} frames"
    );
    drop(s);
    p.close().unwrap();
    // Everything committed is there after the restarts.
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let s = append(&p, "t");
    assert_eq!(s.next(), commits + 1);
    for offset in [1, commits / 2, commits] {
        assert_eq!(s.read_from_n(offset, 1).unwrap()[0].offset, offset);
    }
}

#[test]
fn a_closed_provider_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let s = append(&p, "t");
    p.close().unwrap();
    assert!(matches!(
        s.append(rec("t", "x", 1)),
        Err(StorageError::Closed { .. })
    ));
    // The lock went with it.
    let again = SqliteProvider::open(options(dir.path())).unwrap();
    drop(again);
}

fn plain_session(client_id: &str, window: u16, inflight: usize) -> SessionEntry {
    SessionEntry {
        client_id: client_id.into(),
        principal: None,
        expiry_interval: 60,
        detached_at: 0,
        subscriptions: Vec::new(),
        will: None,
        window,
        inflight: (0..inflight)
            .map(|i| InflightEntry {
                log_offset: 1,
                packet_id: i as u16 + 1,
                qos: 1,
                phase: InflightPhase::AwaitingAck,
                shared_group: None,
            })
            .collect(),
    }
}

/// Every session is read with its own in-flight entries, in their order,
/// from one pass over the in-flight table: whatever order the sessions
/// were saved in, with a session between two that have none, and with an
/// entry whose session is gone (not read, as before).
#[test]
fn every_session_is_read_with_its_own_inflight_entries() {
    let dir = tempfile::tempdir().unwrap();
    let saved = [
        plain_session("c", 4, 3),
        plain_session("a", 2, 0),
        plain_session("b", 2, 2),
        plain_session("d", 1, 0),
        plain_session("ab", 3, 1),
    ];
    {
        let p = SqliteProvider::open(options(dir.path())).unwrap();
        let sessions = p.sessions().unwrap();
        for session in &saved {
            sessions.save(session.clone()).unwrap();
        }
        p.close().unwrap();
    }
    let raw = Connection::open(dir.path().join("saguin.db")).unwrap();
    raw.execute_batch(
        "INSERT INTO session_inflight (client_id, seq, log_offset, packet_id, qos, phase)
         VALUES ('aa', 0, 1, 9, 1, 'awaiting_ack'), ('e', 0, 1, 9, 1, 'awaiting_ack')",
    )
    .unwrap();
    let mut by_client_id = saved.to_vec();
    by_client_id.sort_by(|x, y| x.client_id.cmp(&y.client_id));
    assert_eq!(read_sessions(&raw).unwrap(), by_client_id, "a tool's read");
    drop(raw);
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let mut read = p.sessions().unwrap().sessions().unwrap();
    read.sort_by(|x, y| x.client_id.cmp(&y.client_id));
    assert_eq!(read, by_client_id, "the provider's read");
    assert_eq!(
        p.sessions().unwrap().get("b").unwrap().as_ref(),
        Some(&saved[2]),
        "one session's read"
    );
}

#[test]
fn session_writes_together_commit_as_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let sessions = p.sessions().unwrap();
    let before = p.shared.counters.commits.load(Ordering::Acquire);
    let kept = p
        .session_writes_together(&mut || {
            (0..5).all(|i| sessions.save(plain_session(&format!("s{i}"), 1, 0)).is_ok())
        })
        .unwrap();
    assert!(kept);
    assert_eq!(
        p.shared.counters.commits.load(Ordering::Acquire) - before,
        1,
        "five writes, one commit"
    );
    assert_eq!(sessions.sessions().unwrap().len(), 5);
}

#[test]
fn a_failed_write_keeps_nothing_of_the_shared_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let sessions = p.sessions().unwrap();
    let kept = p
        .session_writes_together(&mut || {
            sessions.save(plain_session("a", 1, 0)).is_ok()
                // Refused: more in flight than its window.
                && sessions.save(plain_session("b", 1, 2)).is_ok()
        })
        .unwrap();
    assert!(!kept);
    assert!(
        sessions.sessions().unwrap().is_empty(),
        "the write before the failure is not kept either"
    );
}

#[test]
fn another_threads_write_waits_for_the_shared_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let p = Arc::new(SqliteProvider::open(options(dir.path())).unwrap());
    let sessions = p.sessions().unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let other = {
        let p = p.clone();
        std::thread::spawn(move || {
            started_rx.recv().unwrap();
            // Made while the transaction is open: committed on its own,
            // after it, never inside it.
            p.sessions()
                .unwrap()
                .save(plain_session("other", 1, 0))
                .unwrap();
        })
    };
    let kept = p
        .session_writes_together(&mut || {
            sessions.save(plain_session("mine", 1, 0)).unwrap();
            started_tx.send(()).unwrap();
            // Give the other thread every chance to get in; it must wait.
            let _ = release_rx.recv_timeout(Duration::from_millis(50));
            false
        })
        .unwrap();
    drop(release_tx);
    other.join().unwrap();
    assert!(!kept);
    let ids: Vec<String> = sessions
        .sessions()
        .unwrap()
        .into_iter()
        .map(|s| s.client_id)
        .collect();
    assert_eq!(
        ids,
        vec!["other".to_string()],
        "the rollback took only this thread's write"
    );
}

#[test]
fn leases_share_one_transaction_and_each_is_answered_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let q = queue(&p, "jobs");
    for i in 0..3 {
        q.enqueue(rec("jobs", &format!("job{i}"), 100)).unwrap();
    }
    q.lease(2, "w0", 5_000, 1_000).unwrap();
    let ask = |offset: u64| crate::storage::contract::LeaseRequest {
        offset,
        holder: format!("w{offset}"),
        lease_until: 5_000,
        now: 1_000,
    };
    let commits = p
        .shared
        .counters
        .commits
        .load(std::sync::atomic::Ordering::Acquire);
    let answers = q.lease_many(vec![ask(1), ask(2), ask(3), ask(9)]);
    assert_eq!(
        p.shared
            .counters
            .commits
            .load(std::sync::atomic::Ordering::Acquire),
        commits + 1,
        "one transaction"
    );
    assert_eq!(answers.len(), 4);
    assert_eq!(answers[0].as_ref().unwrap().offset, 1);
    assert!(answers[1].is_err(), "held already");
    assert_eq!(answers[2].as_ref().unwrap().attempts, 1);
    assert!(answers[3].is_err(), "no record there");
    let attempts: Vec<u32> = q.items().unwrap().iter().map(|i| i.attempts).collect();
    assert_eq!(attempts, vec![1, 1, 1]);
    assert!(q.offer(10, 1_000).unwrap().is_empty(), "every record held");
}

fn commits(p: &SqliteProvider) -> u64 {
    p.shared
        .counters
        .commits
        .load(std::sync::atomic::Ordering::Acquire)
}

#[test]
fn jobs_enqueued_together_share_a_transaction_and_a_refusal_is_one_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let q = queue(&p, "jobs");
    let before = commits(&p);
    let mut records: Vec<Record> = (0..5)
        .map(|i| rec("jobs/a", &format!("job{i}"), 100))
        .collect();
    // A record no provider can keep: refused on its own.
    let mut bad = rec("jobs/a", "bad", 100);
    bad.qos = 3;
    records.insert(2, bad);
    let answers = q.enqueue_many(records);
    assert_eq!(commits(&p), before + 1, "one transaction for the five");
    let offsets: Vec<Option<u64>> = answers
        .iter()
        .map(|a| a.as_ref().ok().map(|r| r.offset))
        .collect();
    assert_eq!(
        offsets,
        vec![Some(1), Some(2), None, Some(3), Some(4), Some(5)]
    );
    assert_eq!((q.depth(), q.next()), (5, 6));
}

#[test]
fn resolutions_share_one_transaction_and_each_is_answered_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let q = queue(&p, "jobs");
    for i in 0..4 {
        q.enqueue(rec("jobs", &format!("job{i}"), 100)).unwrap();
    }
    let leases: Vec<_> = (1..=3)
        .map(|offset| q.lease(offset, "w", 5_000, 1_000).unwrap())
        .collect();
    let bytes = q.bytes();
    let before = commits(&p);
    let answers = q.resolve_many(vec![
        (leases[0].delivery_id, leases[0].epoch),
        // Superseded: nothing changes.
        (leases[1].delivery_id, leases[1].epoch + 100),
        (leases[2].delivery_id, leases[2].epoch),
        // The same delivery twice: the second finds it gone.
        (leases[0].delivery_id, leases[0].epoch),
        (999, 1),
    ]);
    assert_eq!(commits(&p), before + 1, "one transaction");
    let answers: Vec<bool> = answers.into_iter().map(|a| a.unwrap()).collect();
    assert_eq!(answers, vec![true, false, true, false, false]);
    let left: Vec<u64> = q.items().unwrap().iter().map(|i| i.record.offset).collect();
    assert_eq!(left, vec![2, 4], "only what committed is gone");
    assert_eq!(q.depth(), 2);
    assert!(q.bytes() < bytes);
    // What was resolved stays resolved after a reopen.
    drop(q);
    p.close().unwrap();
    drop(p);
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let q = queue(&p, "jobs");
    let left: Vec<u64> = q.items().unwrap().iter().map(|i| i.record.offset).collect();
    assert_eq!(left, vec![2, 4]);
    // A restart forgets every delivery (invariant 15).
    assert!(!q.resolve(leases[1].delivery_id, leases[1].epoch).unwrap());
}

/// A retained row whose columns do not hold what a value needs is
/// refused by name when a restart reads it as served, as when it is read
/// whole, and nothing is lent from it.
#[test]
fn a_retained_row_that_cannot_be_a_value_is_refused_when_read_as_served() {
    for (column, change, said) in [
        ("qos", "qos = 7", "qos 7 is not 0, 1 or 2"),
        ("topic", "topic = CAST(X'FF' AS TEXT)", "invalid utf-8"),
        ("props", "props = '{\"nonsense\":1}'", "nonsense"),
        ("headers", "headers = '{}'", ""),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let p = SqliteProvider::open(options(dir.path())).unwrap();
        let retained = p.retained().unwrap();
        retained
            .set(Record::new("a/b", Bytes::from_static(b"v")))
            .unwrap();
        p.close().unwrap();
        let raw = Connection::open(dir.path().join("saguin.db")).unwrap();
        raw.execute_batch(&format!("UPDATE latest_values SET {change}"))
            .unwrap();
        drop(raw);

        let p = SqliteProvider::open(options(dir.path())).unwrap();
        let retained = p.retained().unwrap();
        let mut lent = 0;
        let served = retained.for_each_served_value(&mut |_| lent += 1);
        let whole = retained.for_each_value(&mut |_| lent += 1);
        assert_eq!(lent, 0, "{column}");
        for read in [served, whole] {
            match read {
                Err(StorageError::Corrupt { detail, .. }) => {
                    assert!(detail.contains(said), "{column}: {detail}")
                }
                other => panic!("{column}: {other:?}"),
            }
        }
        p.close().unwrap();
    }
}

/// Reading the whole retained store (a restart's read) leaves its pages
/// in no connection's cache: they are not read again soon, and a
/// connection's cache is held as long as the provider is open.
#[test]
fn reading_every_retained_value_leaves_no_pages_cached() {
    let dir = tempfile::tempdir().unwrap();
    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let retained = p.retained().unwrap();
    let payload = Bytes::from(vec![b'x'; 8 * 1024]);
    for i in 0..600 {
        retained
            .set(Record::new(format!("site/{i}"), payload.clone()))
            .unwrap();
    }
    p.close().unwrap();

    let p = SqliteProvider::open(options(dir.path())).unwrap();
    let mut read = 0;
    p.retained()
        .unwrap()
        .for_each_served_value(&mut |_| read += 1)
        .unwrap();
    assert_eq!(read, 600);
    let cached: i64 = p
        .shared
        .readers
        .lock()
        .unwrap()
        .iter()
        .map(|conn| {
            let (mut used, mut highest) = (0, 0);
            // SAFETY: the handle is a live connection's, the two
            // out-parameters are valid, and nothing is reset.
            let status = unsafe {
                rusqlite::ffi::sqlite3_db_status(
                    conn.handle(),
                    rusqlite::ffi::SQLITE_DBSTATUS_CACHE_USED,
                    &mut used,
                    &mut highest,
                    0,
                )
            };
            assert_eq!(status, rusqlite::ffi::SQLITE_OK);
            i64::from(used)
        })
        .sum();
    // Without the release the read leaves about 400 KB cached here, with
    // it about 14 KB.
    assert!(cached < 64 * 1024, "{cached} B still cached");
    p.close().unwrap();
}
