//! A latest channel whose topics come and go stays bounded: 100,000
//! devices each set a value and delete it, a few others keep theirs, and
//! the retention sweep the broker runs every second
//! (`contract::sweep_deletions_by_count`) keeps the channel's deletion
//! markers at its `retention_deletions`, raising the floor past the values
//! that stay current below it - on both providers, and across a restart.

use std::path::Path;
use std::sync::Arc;

use saguin::model::{ChannelKind, Record};
use saguin::storage::contract::{
    now_nanos, read_changes, sweep_deletions_by_count, LatestStore, Provider, Retention,
};
use saguin::storage::generation::save_snapshot;
use saguin::storage::memory::{LoadOptions, MemoryConfig, MemoryProvider};
use saguin::storage::snapshot_write::SnapshotOptions;
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};

const CHURNED: usize = 100_000;
const KEPT: usize = 10;
const MARKERS_KEPT: u64 = 1_000;
/// The sweep runs after every this many devices came and went, as the
/// broker's would about every second under a steady churn.
const SWEEP_EVERY: usize = 10_000;
/// Threads setting and deleting at once (sqlite shares their transactions).
const THREADS: usize = 4;

fn latest(p: &dyn Provider) -> Arc<dyn LatestStore> {
    p.open_channel("devices", ChannelKind::Latest)
        .expect("open latest")
        .as_latest()
        .expect("latest store")
        .clone()
}

fn value(topic: &str, payload: &str) -> Record {
    Record {
        timestamp: now_nanos(),
        ..Record::new(topic, payload.to_owned())
    }
}

/// Sets and deletes devices `range`, `THREADS` at a time.
fn churn(store: &Arc<dyn LatestStore>, range: std::ops::Range<usize>) {
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let store = store.clone();
            let range = range.clone();
            s.spawn(move || {
                for i in range.skip(t).step_by(THREADS) {
                    let topic = format!("devices/churn/{i}");
                    store.set(value(&topic, "online")).expect("set");
                    store.set(value(&topic, "")).expect("delete");
                }
            });
        }
    });
}

/// What the channel looks like, for comparing before and after a restart.
fn summary(store: &dyn LatestStore) -> (u64, u64, u64, u64, u64) {
    (
        store.next(),
        store.floor(),
        store.deletions(),
        store.record_count(),
        store.bytes(),
    )
}

/// The churn and the sweeps on `provider`; `restart` reopens it from what
/// it kept.
fn churned_channel_stays_bounded(
    provider: Arc<dyn Provider>,
    restart: impl FnOnce() -> Arc<dyn Provider>,
) {
    let store = latest(&*provider);
    for i in 0..KEPT {
        store
            .set(value(&format!("devices/kept/{i}"), "installed"))
            .expect("set");
    }
    let retention = [(
        store.clone(),
        Retention {
            deletions: Some(MARKERS_KEPT),
            ..Retention::default()
        },
    )];
    let mut forgotten = 0;
    for start in (0..CHURNED).step_by(SWEEP_EVERY) {
        churn(&store, start..start + SWEEP_EVERY);
        let report = sweep_deletions_by_count(&retention);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        forgotten += report.total().records;
        assert_eq!(store.deletions(), MARKERS_KEPT, "after {start}");
    }
    let next = (KEPT + 2 * CHURNED) as u64 + 1;
    assert_eq!(store.next(), next, "every set and deletion took an offset");
    assert_eq!(forgotten, CHURNED as u64 - MARKERS_KEPT);
    assert_eq!(store.record_count(), KEPT as u64);
    // The markers kept are the newest deletions: the floor is just past the
    // last one forgotten, far above the values that stay current.
    let newest: Vec<u64> = store
        .match_with_deletions("devices/#", store.floor())
        .expect("changes from the floor")
        .iter()
        .map(|r| r.offset)
        .collect();
    assert_eq!(newest.len() as u64, MARKERS_KEPT);
    let oldest_kept = newest[0];
    // No row lies between the floor and the oldest marker kept: the
    // floor is just past the last marker forgotten.
    let (_, between) = store
        .rows_from_n("devices/#", store.floor(), 1)
        .expect("rows from the floor");
    assert_eq!(between[0].offset, oldest_kept);
    assert!(store.floor() > KEPT as u64 * 100);
    let marker_bytes = Record::new("devices/churn/99999", "").accounted_size();
    let value_bytes = value("devices/kept/0", "installed").accounted_size();
    assert!(
        store.bytes() <= MARKERS_KEPT * marker_bytes + KEPT as u64 * value_bytes,
        "{} bytes",
        store.bytes()
    );
    // A reader from the first offset is below the floor: it starts over and
    // gets the values kept below the floor first.
    let changes = read_changes(&*store, "devices/#", 1, 1, 2 * KEPT).expect("read");
    assert_eq!(changes.resync, Some(store.floor()));
    let topics: Vec<&str> = changes.records[..KEPT]
        .iter()
        .map(|r| r.topic.as_str())
        .collect();
    let kept: Vec<String> = (0..KEPT).map(|i| format!("devices/kept/{i}")).collect();
    assert_eq!(topics, kept);

    let before = summary(&*store);
    drop((store, retention));
    let reopened = restart();
    let store = latest(&*reopened);
    assert_eq!(summary(&*store), before, "the restart agrees");
    let (floor, rows) = store.rows_from_n("devices/#", 1, usize::MAX).expect("rows");
    assert_eq!(floor, before.1);
    assert_eq!(rows.len(), KEPT + MARKERS_KEPT as usize);
    assert!(rows[..KEPT].iter().all(|r| r.offset < floor));
}

#[test]
fn a_memory_latest_channel_with_churning_topics_stays_bounded() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let snapshots = dir.path().join("snapshots");
    let config = |name: &str| MemoryConfig {
        name: name.into(),
        max_bytes: None,
        reserve: 0,
    };
    let provider = MemoryProvider::new(config("mem")).expect("memory provider");
    let kept = provider.clone();
    churned_channel_stays_bounded(provider, move || {
        let report = save_snapshot(&kept, &snapshots, &SnapshotOptions::default(), now_nanos());
        assert!(report.is_complete(), "snapshot failed: {:?}", report.failed);
        kept.close().expect("close");
        let fresh = MemoryProvider::new(config("mem")).expect("memory provider");
        let loaded = fresh
            .load_snapshot_dir(
                &snapshots,
                &LoadOptions {
                    channels: vec![("devices".into(), ChannelKind::Latest)],
                    retained: false,
                    sessions: false,
                    now: now_nanos(),
                    max_session_expiry: 3600,
                    max_file_bytes: saguin::storage::read::F21_DEFAULT_MAX_BYTES,
                },
            )
            .expect("the loader takes a floor above values");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        fresh
    });
}

#[test]
fn a_sqlite_latest_channel_with_churning_topics_stays_bounded() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("saguin.db");
    let open = |path: &Path| {
        Arc::new(SqliteProvider::open(SqliteOptions::new("db", path)).expect("sqlite provider"))
    };
    let provider = open(&path);
    let kept = provider.clone();
    churned_channel_stays_bounded(provider, move || {
        kept.close().expect("close");
        drop(kept);
        let conn = saguin::storage::sqlite::open_read_only(&path).expect("read the database");
        let verified = saguin::storage::sqlite::verify::verify(&conn);
        assert!(verified.findings.is_empty(), "{:?}", verified.findings);
        drop(conn);
        open(&path)
    });
}
