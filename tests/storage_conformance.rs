//! The storage conformance test: one
//! script drives a provider through every contract and records every
//! answer - offsets assigned, records returned, counters, the refusal below
//! the floor, bounds and quota errors, retention, positions, a queue through
//! offer, lease, resolve, release, expiry and dead-letter, held exactly-once
//! publishes - across a restart. Two implementations of one contract are
//! worth having only if they agree, so every provider's answers are compared
//! with the same golden transcript, `fixtures/storage_conformance.txt`.
//!
//! A provider plugs in with a [`Harness`] and one line:
//! `conformance_test!(sqlite_provider_conforms, SqliteHarness::new());`
//!
//! `SAGUIN_UPDATE_GOLDEN=1 cargo test --test storage_conformance` rewrites
//! the transcript from the memory provider.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use saguin::model::{ChannelKind, Record, UserProperty};
use saguin::storage::contract::{
    now_nanos, read_changes, AppendStore, Changes, ChannelStore, HeldPublish, LatestStore,
    Position, Provider, QueueStore, Reader, StorageError,
};
use saguin::storage::generation::save_snapshot;
use saguin::storage::memory::{LoadOptions, MemoryConfig, MemoryProvider};
use saguin::storage::snapshot_write::SnapshotOptions;

/// What the script needs from a provider under test.
pub trait Harness {
    /// The provider under test (unbounded).
    fn provider(&self) -> Arc<dyn Provider>;
    /// Stops the provider the way a graceful shutdown does and opens it
    /// again from what it kept. `channels` is the configuration.
    fn restart(&mut self, channels: &[(String, ChannelKind)]);
    /// A fresh provider bounded at `max_bytes` with `reserve` held back.
    fn bounded(&self, max_bytes: u64, reserve: u64) -> Arc<dyn Provider>;
}

/// The memory provider, restarted through a snapshot directory.
pub struct MemoryHarness {
    dir: tempfile::TempDir,
    provider: Arc<MemoryProvider>,
}

impl Default for MemoryHarness {
    fn default() -> Self {
        MemoryHarness::new()
    }
}

impl MemoryHarness {
    pub fn new() -> MemoryHarness {
        MemoryHarness {
            dir: tempfile::tempdir().expect("temporary directory"),
            provider: memory(None, 0),
        }
    }

    fn snapshot_dir(&self) -> PathBuf {
        self.dir.path().join("snapshots")
    }
}

fn memory(max_bytes: Option<u64>, reserve: u64) -> Arc<MemoryProvider> {
    MemoryProvider::new(MemoryConfig {
        name: "mem".into(),
        max_bytes,
        reserve,
    })
    .expect("memory provider")
}

impl Harness for MemoryHarness {
    fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
    }

    fn restart(&mut self, channels: &[(String, ChannelKind)]) {
        let options = SnapshotOptions {
            retained: true,
            sessions: true,
            ..SnapshotOptions::default()
        };
        let report = save_snapshot(&self.provider, &self.snapshot_dir(), &options, now_nanos());
        assert!(report.is_complete(), "snapshot failed: {:?}", report.failed);
        self.provider.close().expect("close");
        let fresh = memory(None, 0);
        let loaded = fresh
            .load_snapshot_dir(
                &self.snapshot_dir(),
                &LoadOptions {
                    channels: channels.to_vec(),
                    retained: true,
                    sessions: true,
                    now: now_nanos(),
                    max_session_expiry: 7 * 24 * 3600,
                    max_file_bytes: saguin::storage::read::F21_DEFAULT_MAX_BYTES,
                },
            )
            .expect("load");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        self.provider = fresh;
    }

    fn bounded(&self, max_bytes: u64, reserve: u64) -> Arc<dyn Provider> {
        memory(Some(max_bytes), reserve)
    }
}

/// Runs the script and compares its transcript with the golden one.
pub fn check(harness: impl Harness) {
    let transcript = conformance_script(harness).join("\n") + "\n";
    let golden = golden_path();
    if std::env::var_os("SAGUIN_UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &transcript).expect("write golden transcript");
        return;
    }
    let expected = std::fs::read_to_string(&golden).expect("golden transcript");
    if transcript != expected {
        let first = transcript
            .lines()
            .zip(expected.lines())
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("\n  got:      {a}\n  expected: {b}"))
            .unwrap_or_else(|| "\n  (the transcripts differ in length)".into());
        panic!(
            "the provider's answers differ from {}:{first}",
            golden.display()
        );
    }
}

fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/storage_conformance.txt")
}

#[macro_export]
macro_rules! conformance_test {
    ($name:ident, $harness:expr) => {
        #[test]
        fn $name() {
            check($harness);
        }
    };
}

conformance_test!(memory_provider_conforms, MemoryHarness::new());
conformance_test!(sqlite_provider_conforms, SqliteHarness::new());

/// The sqlite provider, restarted by closing and reopening its database.
pub struct SqliteHarness {
    dir: tempfile::TempDir,
    provider: Arc<saguin::storage::sqlite::SqliteProvider>,
}

impl Default for SqliteHarness {
    fn default() -> Self {
        SqliteHarness::new()
    }
}

impl SqliteHarness {
    pub fn new() -> SqliteHarness {
        let dir = tempfile::tempdir().expect("temporary directory");
        let provider = sqlite(&dir.path().join("saguin.db"), None, 0);
        SqliteHarness { dir, provider }
    }
}

fn sqlite(
    path: &Path,
    max_bytes: Option<u64>,
    reserve: u64,
) -> Arc<saguin::storage::sqlite::SqliteProvider> {
    let mut options = saguin::storage::sqlite::SqliteOptions::new("db", path);
    options.max_bytes = max_bytes;
    options.reserve = reserve;
    options.read_connections = 2;
    Arc::new(saguin::storage::sqlite::SqliteProvider::open(options).expect("sqlite provider"))
}

impl Harness for SqliteHarness {
    fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
    }

    fn restart(&mut self, _channels: &[(String, ChannelKind)]) {
        self.provider.close().expect("close");
        self.provider = sqlite(&self.dir.path().join("saguin.db"), None, 0);
    }

    /// A sqlite bound is the file's, and an empty schema-20 file
    /// is already larger than the script's bound; so the bound given is
    /// what the empty file takes plus the script's figure - the same room
    /// for records as the memory provider gets.
    fn bounded(&self, max_bytes: u64, reserve: u64) -> Arc<dyn Provider> {
        let path = self
            .dir
            .path()
            .join(format!("bounded-{max_bytes}-{reserve}.db"));
        let empty = sqlite(&path, None, 0);
        empty.close().expect("close");
        drop(empty);
        let schema_bytes = std::fs::metadata(&path).expect("empty database").len();
        sqlite(&path, Some(schema_bytes + max_bytes), reserve)
    }
}

/// An error as the transcript records it: the variant and the numbers both
/// providers must agree on, never the wording.
fn err(e: &StorageError) -> String {
    match e {
        StorageError::ChannelFull { .. } => format!("ChannelFull(0x{:02x})", e.mqtt_reason_code()),
        StorageError::ProviderFull { .. } => {
            format!("ProviderFull(0x{:02x})", e.mqtt_reason_code())
        }
        StorageError::BelowFloor { offset, floor, .. } => {
            format!("BelowFloor(offset {offset}, floor {floor})")
        }
        StorageError::PastNext { offset, next, .. } => {
            format!("PastNext(offset {offset}, next {next})")
        }
        StorageError::KindMismatch {
            configured, stored, ..
        } => format!("KindMismatch({configured} over {stored})"),
        StorageError::Invalid { .. } => "Invalid".into(),
        StorageError::InvalidReader { .. } => "InvalidReader".into(),
        other => format!("Failed({other})"),
    }
}

fn show<T: std::fmt::Debug>(r: Result<T, StorageError>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => err(&e),
    }
}

/// A record as the transcript shows it: every field a store keeps.
fn rec(r: &Record) -> String {
    let headers: Vec<String> = r
        .user_properties
        .iter()
        .map(|p| format!("{}={}", p.name, p.value))
        .collect();
    format!(
        "#{} {} {:?} ts={} h=[{}] qos={} retain={} client={:?}",
        r.offset,
        r.topic,
        String::from_utf8_lossy(&r.payload),
        r.timestamp,
        headers.join(","),
        r.qos,
        r.retain,
        r.client_id
    )
}

fn rows(r: Result<(u64, Vec<Record>), StorageError>) -> String {
    match r {
        Ok((floor, records)) => format!("floor {floor}: {}", recs(Ok(records))),
        Err(e) => err(&e),
    }
}

fn changes(r: Result<Changes, StorageError>) -> String {
    match r {
        Ok(c) => format!(
            "start {} resync {:?}: {}",
            c.start,
            c.resync,
            recs(Ok(c.records))
        ),
        Err(e) => err(&e),
    }
}

fn recs(r: Result<Vec<Record>, StorageError>) -> String {
    match r {
        Ok(v) => format!("[{}]", v.iter().map(rec).collect::<Vec<_>>().join("; ")),
        Err(e) => err(&e),
    }
}

fn record(topic: &str, payload: &str, timestamp: i64) -> Record {
    let mut r = Record::new(topic, payload.as_bytes().to_vec());
    r.timestamp = timestamp;
    r.client_id = "producer".into();
    r.qos = 1;
    r.message_id = [7; 16];
    r
}

fn append_store(p: &dyn Provider, name: &str) -> Arc<dyn AppendStore> {
    p.open_channel(name, ChannelKind::Append)
        .expect("open append")
        .as_append()
        .expect("append store")
        .clone()
}

fn latest_store(p: &dyn Provider, name: &str) -> Arc<dyn LatestStore> {
    p.open_channel(name, ChannelKind::Latest)
        .expect("open latest")
        .as_latest()
        .expect("latest store")
        .clone()
}

fn queue_store(p: &dyn Provider, name: &str) -> Arc<dyn QueueStore> {
    let q = p
        .open_channel(name, ChannelKind::Queue)
        .expect("open queue")
        .as_queue()
        .expect("queue store")
        .clone();
    q.set_backoff(vec![Duration::from_nanos(1000), Duration::from_nanos(5000)]);
    q.set_max_attempts(2);
    q
}

fn counters(s: &dyn AppendStore) -> String {
    format!(
        "next={} floor={} bytes={} records={} lowest_position={}",
        s.next(),
        s.floor(),
        s.bytes(),
        s.record_count(),
        s.lowest_position()
    )
}

fn position(reader: &str, offset: u64, saved_at: i64, expiry: Option<u32>) -> Position {
    Position {
        reader: Reader::parse(reader).expect("reader"),
        offset,
        saved_at,
        session_expiry: expiry,
    }
}

fn same_store(a: &ChannelStore, b: &ChannelStore) -> bool {
    fn addr<T: ?Sized>(a: &Arc<T>) -> *const () {
        Arc::as_ptr(a) as *const ()
    }
    match (a, b) {
        (ChannelStore::Append(x), ChannelStore::Append(y)) => addr(x) == addr(y),
        (ChannelStore::Latest(x), ChannelStore::Latest(y)) => addr(x) == addr(y),
        (ChannelStore::Queue(x), ChannelStore::Queue(y)) => addr(x) == addr(y),
        _ => false,
    }
}

/// The script. Every line it returns is one answer.
pub fn conformance_script(mut harness: impl Harness) -> Vec<String> {
    let mut out = Vec::new();
    let mut say = |line: String| out.push(line);
    let p = harness.provider();
    let p = &*p;

    // --- opening ---
    let first = p.open_channel("log", ChannelKind::Append).expect("open");
    let again = p.open_channel("log", ChannelKind::Append).expect("open");
    say(format!(
        "open twice gives the same store: {}",
        same_store(&first, &again)
    ));
    say(format!(
        "open as another kind: {}",
        show(p.open_channel("log", ChannelKind::Queue).map(|_| ()))
    ));
    let log = append_store(p, "log");
    say(format!("fresh: {}", counters(&*log)));

    // --- appends: offsets in order, timestamps that run backwards ---
    for (payload, ts) in [("a", 100), ("b", 200), ("c", 150)] {
        let stored = log.append(record("log/x", payload, ts));
        say(format!(
            "append {payload}: {}",
            show(stored.map(|r| r.offset))
        ));
    }
    let stored = log.append(record("log/x", "d", 300));
    say(format!("append d: {}", show(stored.map(|r| r.offset))));
    for stored in log.append_batch(vec![record("log/x", "e", 0)]) {
        say(format!("append e: {}", show(stored.map(|r| r.offset))));
    }
    say(format!("after appends: {}", counters(&*log)));
    say(format!("read_from 1: {}", recs(log.read_from(1))));
    say(format!("read_from_n 2,2: {}", recs(log.read_from_n(2, 2))));
    say(format!("read_from_n 0,2: {}", recs(log.read_from_n(0, 2))));
    say(format!(
        "read_from next: {}",
        recs(log.read_from(log.next()))
    ));
    say(format!("read_from past next: {}", recs(log.read_from(7))));
    say(format!("read_from 0: {}", recs(log.read_from(0))));
    for at in [1, 150, 250, 301] {
        say(format!(
            "first_at_or_after {at}: {}",
            show(log.first_at_or_after(at))
        ));
    }

    // --- positions ---
    let now = now_nanos();
    say(format!(
        "save mqtt:c1@3: {}",
        show(log.save_position(position("mqtt:c1", 3, now, Some(3600))))
    ));
    say(format!(
        "save bridge:up@2: {}",
        show(log.save_position(position("bridge:up", 2, now, None)))
    ));
    say(format!(
        "save mqtt:gone@4 (expiry 0): {}",
        show(log.save_position(position("mqtt:gone", 4, 1, Some(0))))
    ));
    say(format!(
        "save past next: {}",
        show(log.save_position(position("mqtt:c2", 99, now, Some(60))))
    ));
    say(format!(
        "save bridge with expiry: {}",
        show(log.save_position(position("bridge:x", 1, now, Some(60))))
    ));
    say(format!(
        "reader without scheme: {}",
        show(Reader::parse("c1"))
    ));
    say(format!(
        "position mqtt:c1: {}",
        show(
            log.position(&Reader::parse("mqtt:c1").expect("reader"))
                .map(|p| p.map(|p| p.offset))
        )
    ));
    say(format!("lowest_position: {}", log.lowest_position()));
    let up = Reader::parse("bridge:up").expect("reader");
    say(format!("drop bridge:up: {}", show(log.drop_position(&up))));
    say(format!(
        "drop bridge:up again: {}",
        show(log.drop_position(&up))
    ));
    say(format!(
        "positions: {}",
        show(log.positions().map(|ps| {
            ps.iter()
                .map(|p| format!("{}@{}", p.reader, p.offset))
                .collect::<Vec<_>>()
        }))
    ));

    // --- removal raises the floor and gives the bytes back ---
    say(format!("trim before 3: {}", show(log.trim(3, None))));
    say(format!("after trim: {}", counters(&*log)));
    say(format!(
        "read_from 2 (below floor): {}",
        recs(log.read_from(2))
    ));
    say(format!("read_from 3: {}", recs(log.read_from(3))));
    say(format!(
        "trim_older_than 200: {}",
        show(log.trim_older_than(200))
    ));
    say(format!("after age trim: {}", counters(&*log)));
    say(format!(
        "trim_older_than 1000 (stops at d): {}",
        show(log.trim_older_than(1000))
    ));

    // A record with no timestamp is never too old, and it stops the walk.
    let aged = append_store(p, "aged");
    for (payload, ts) in [("z", 0), ("y", 10), ("x", 20)] {
        aged.append(record("aged", payload, ts)).expect("append");
    }
    say(format!(
        "aged: trim_older_than 100: {}",
        show(aged.trim_older_than(100))
    ));
    say(format!("aged: {}", counters(&*aged)));

    // Size retention walks from the oldest.
    let sized = append_store(p, "sized");
    for payload in ["1111", "2222", "3333", "4444"] {
        sized.append(record("sized", payload, 1)).expect("append");
    }
    say(format!("sized: {}", counters(&*sized)));
    say(format!(
        "sized: trim to 20 bytes: {}",
        show(sized.trim(sized.floor(), Some(20)))
    ));
    say(format!("sized: {}", counters(&*sized)));

    // Emptying a channel changes neither number.
    say(format!(
        "log: trim everything: {}",
        show(log.trim(log.next(), None))
    ));
    say(format!("log emptied: {}", counters(&*log)));
    say(format!(
        "log: append after emptying: {}",
        show(log.append(record("log/x", "f", 400)).map(|r| r.offset))
    ));
    say(format!("log: {}", counters(&*log)));

    // --- the channel's own bound ---
    log.set_max_bytes(Some(log.bytes() + 6));
    say(format!(
        "within max_bytes: {}",
        show(log.append(record("log/x", "g", 1)).map(|r| r.offset))
    ));
    let refused = log.append(record("log/x", "h", 1));
    say(format!(
        "over max_bytes: {}",
        show(refused.map(|r| r.offset))
    ));
    log.set_max_bytes(None);
    say(format!(
        "after max_bytes lifted: {}",
        show(log.append(record("log/x", "h", 1)).map(|r| r.offset))
    ));
    say(format!("log: {}", counters(&*log)));

    // --- latest ---
    let latest = latest_store(p, "state");
    for (topic, payload) in [
        ("state/a", "1"),
        ("state/b", "1"),
        ("state/a", "2"),
        ("state/c", "1"),
    ] {
        say(format!(
            "set {topic}={payload}: {}",
            show(latest.set(record(topic, payload, 5)).map(|r| r.offset))
        ));
    }
    say(format!(
        "get state/a: {}",
        show(latest.get("state/a").map(|r| r.map(|r| rec(&r))))
    ));
    say(format!(
        "get state/z: {}",
        show(latest.get("state/z").map(|r| r.map(|r| rec(&r))))
    ));
    say(format!(
        "match state/+: {}",
        recs(latest.match_filter("state/+"))
    ));
    say(format!(
        "delete state/b: {}",
        show(latest.delete("state/b").map(|r| r.map(|r| r.offset)))
    ));
    say(format!(
        "delete state/b again: {}",
        show(latest.delete("state/b").map(|r| r.map(|r| r.offset)))
    ));
    say(format!(
        "set empty state/c (delete): {}",
        show(latest.set(record("state/c", "", 6)).map(|r| r.offset))
    ));
    say(format!(
        "set empty state/q (nothing): {}",
        show(latest.set(record("state/q", "", 6)).map(|r| r.offset))
    ));
    say(format!(
        "match_with_deletions # since 1: {}",
        recs(latest.match_with_deletions("#", 1))
    ));
    say(format!(
        "match_with_deletions state/b since 4: {}",
        recs(latest.match_with_deletions("state/b", 4))
    ));
    say(format!(
        "latest: next={} floor={} bytes={} records={}",
        latest.next(),
        latest.floor(),
        latest.bytes(),
        latest.record_count()
    ));
    say(format!("latest trim before 6: {}", show(latest.trim(6))));
    say(format!(
        "latest: next={} floor={} bytes={} records={}",
        latest.next(),
        latest.floor(),
        latest.bytes(),
        latest.record_count()
    ));
    say(format!(
        "match_with_deletions since 1 (below floor): {}",
        recs(latest.match_with_deletions("#", 1))
    ));
    say(format!(
        "match_with_deletions since 6: {}",
        recs(latest.match_with_deletions("#", 6))
    ));
    // The floor bounds deletion markers, not values: a value set below it
    // stays current, and a reader relying on forgotten deletions starts
    // over at the first offset (the contract's read_changes).
    say(format!(
        "rows_from 1 (values below the floor kept): {}",
        rows(latest.rows_from_n("#", 1, 10))
    ));
    say(format!(
        "read_changes from 1 (the floor passed it): {}",
        changes(read_changes(&*latest, "#", 1, 1, 10))
    ));
    say(format!(
        "read_changes from 3 relying on 6 (a resync going on): {}",
        changes(read_changes(&*latest, "#", 3, 6, 10))
    ));
    say(format!(
        "read_changes from 6: {}",
        changes(read_changes(&*latest, "#", 6, 6, 10))
    ));
    // Retention: by count, then by age (a marker with no timestamp is
    // never too old and stops the walk).
    for (topic, payload, ts) in [
        ("state/d", "1", 7),
        ("state/d", "", 7),
        ("state/e", "1", 8),
        ("state/f", "1", 8),
        ("state/f", "", 9),
    ] {
        say(format!(
            "set {topic}={payload:?}: {}",
            show(latest.set(record(topic, payload, ts)).map(|r| r.offset))
        ));
    }
    say(format!(
        "delete state/e (no timestamp): {}",
        show(latest.delete("state/e").map(|r| r.map(|r| r.offset)))
    ));
    say(format!("deletions: {}", latest.deletions()));
    say(format!(
        "forget_deletions keeping 3: {}",
        show(latest.forget_deletions(Some(3), None))
    ));
    say(format!(
        "latest: next={} floor={} deletions={} bytes={} records={}",
        latest.next(),
        latest.floor(),
        latest.deletions(),
        latest.bytes(),
        latest.record_count()
    ));
    say(format!(
        "forget_deletions older than 100: {}",
        show(latest.forget_deletions(None, Some(100)))
    ));
    say(format!(
        "latest: next={} floor={} deletions={} bytes={} records={}",
        latest.next(),
        latest.floor(),
        latest.deletions(),
        latest.bytes(),
        latest.record_count()
    ));
    say(format!(
        "forget_deletions older than 100 again (stops at the marker with no timestamp): {}",
        show(latest.forget_deletions(None, Some(100)))
    ));
    say(format!(
        "rows_from 1 after retention: {}",
        rows(latest.rows_from_n("#", 1, 10))
    ));
    say(format!(
        "latest position: {}",
        show(latest.save_position(position("mqtt:c1", 6, now, Some(3600))))
    ));

    // --- queue ---
    let jobs = queue_store(p, "jobs");
    for (payload, ts) in [("j1", 10), ("j2", 20), ("j3", 30), ("j4", 40)] {
        say(format!(
            "enqueue {payload}: {}",
            show(
                jobs.enqueue(record("jobs/run", payload, ts))
                    .map(|r| r.offset)
            )
        ));
    }
    say(format!(
        "depth={} bytes={} next={}",
        jobs.depth(),
        jobs.bytes(),
        jobs.next()
    ));
    let offered = |q: &dyn QueueStore, now: i64| {
        show(q.offer(10, now).map(|items| {
            items
                .iter()
                .map(|i| format!("#{}(attempts {})", i.record.offset, i.attempts))
                .collect::<Vec<_>>()
        }))
    };
    say(format!("offer: {}", offered(&*jobs, 1000)));
    let l1 = jobs.lease(1, "w1", 2000, 1000).expect("lease 1");
    say(format!(
        "lease 1: attempt {} #{} {}",
        l1.attempts,
        l1.offset,
        rec(&l1.record)
    ));
    say(format!(
        "lease 1 again: {}",
        show(jobs.lease(1, "w2", 2000, 1000).map(|l| l.attempts))
    ));
    say(format!(
        "lease missing: {}",
        show(jobs.lease(99, "w2", 2000, 1000).map(|l| l.attempts))
    ));
    say(format!("offer while 1 held: {}", offered(&*jobs, 1000)));
    say(format!(
        "resolve 1: {}",
        show(jobs.resolve(l1.delivery_id, l1.epoch))
    ));
    say(format!(
        "resolve 1 again: {}",
        show(jobs.resolve(l1.delivery_id, l1.epoch))
    ));
    say(format!("depth={} bytes={}", jobs.depth(), jobs.bytes()));

    let l2 = jobs.lease(2, "w1", 2000, 1000).expect("lease 2");
    say(format!("lease 2: attempt {}", l2.attempts));
    let released = jobs.release(l2.delivery_id, l2.epoch, 1100, "nack 0x80");
    say(format!("release 2: {}", show(released)));
    say(format!(
        "release 2 again (stale): {}",
        show(jobs.release(l2.delivery_id, l2.epoch, 1100, "nack"))
    ));
    say(format!("offer during backoff: {}", offered(&*jobs, 1500)));
    say(format!("offer after backoff: {}", offered(&*jobs, 2100)));
    say(format!(
        "lease 2 during backoff: {}",
        show(jobs.lease(2, "w1", 3000, 1500).map(|l| l.attempts))
    ));
    let l2b = jobs.lease(2, "w1", 3000, 2100).expect("lease 2 again");
    say(format!("lease 2 again: attempt {}", l2b.attempts));
    say(format!(
        "resolve with the old delivery: {}",
        show(jobs.resolve(l2.delivery_id, l2.epoch))
    ));
    say(format!(
        "release 2, attempts spent: {}",
        show(jobs.release(l2b.delivery_id, l2b.epoch, 2200, "nack 0x80"))
    ));
    let dlq = jobs.dead_letter();
    say(format!(
        "dead letter {}: {}",
        dlq.name(),
        recs(dlq.read_from(1))
    ));
    say(format!("dlq: {}", counters(&*dlq)));
    say(format!("depth={} bytes={}", jobs.depth(), jobs.bytes()));

    let l3 = jobs.lease(3, "w9", 1500, 1000).expect("lease 3");
    say(format!(
        "expired_leases at 1499: {:?}",
        jobs.expired_leases(1499)
            .iter()
            .map(|e| (e.offset, e.holder.clone()))
            .collect::<Vec<_>>()
    ));
    let expired = jobs.expired_leases(1500);
    say(format!(
        "expired_leases at 1500: {:?}",
        expired
            .iter()
            .map(|e| (e.offset, e.holder.clone()))
            .collect::<Vec<_>>()
    ));
    for e in &expired {
        say(format!(
            "release expired {}: {}",
            e.offset,
            show(jobs.release(e.delivery_id, e.epoch, 1500, "lease expired"))
        ));
    }
    say(format!(
        "resolve superseded 3: {}",
        show(jobs.resolve(l3.delivery_id, l3.epoch))
    ));
    let _held4 = jobs.lease(4, "w1", 99_000, 1000).expect("lease 4");
    say(format!(
        "expire_older_than 35 (4 held, 3 free): {}",
        show(jobs.expire_older_than(35))
    ));
    say(format!(
        "offer after expiry (4 held): {}",
        offered(&*jobs, 1_000_000)
    ));
    say(format!("depth={} bytes={}", jobs.depth(), jobs.bytes()));
    jobs.set_max_bytes(Some(jobs.bytes() + 5));
    say(format!(
        "queue over max_bytes: {}",
        show(
            jobs.enqueue(record("jobs/run", "too-big", 50))
                .map(|r| r.offset)
        )
    ));
    jobs.set_max_bytes(None);
    say(format!(
        "enqueue j5: {}",
        show(jobs.enqueue(record("jobs/run", "j5", 0)).map(|r| r.offset))
    ));
    let l5 = jobs.lease(5, "w1", 99_000, 1000).expect("lease 5");
    say(format!("lease 5 before restart: attempt {}", l5.attempts));

    // --- held exactly-once publishes ---
    let held = p.held_publishes().expect("held publishes");
    let hold = |client: &str, packet_id: u16, held_at: i64, payload: &str| HeldPublish {
        channel: "log".into(),
        client_id: client.into(),
        packet_id,
        held_at,
        record: Record {
            qos: 2,
            ..record("log/q2", payload, 77)
        },
    };
    say(format!(
        "hold c1/1: {}",
        show(held.hold(hold("c1", 1, 500, "q2a")))
    ));
    say(format!(
        "hold c1/2: {}",
        show(held.hold(hold("c1", 2, 10, "q2b")))
    ));
    say(format!(
        "hold c2/1: {}",
        show(held.hold(hold("c2", 1, 600, "q2c")))
    ));
    say(format!(
        "release c1/1: {}",
        show(held.release("log", "c1", 1).map(|r| r.map(|r| rec(&r))))
    ));
    say(format!(
        "release c1/1 again: {}",
        show(held.release("log", "c1", 1).map(|r| r.map(|r| rec(&r))))
    ));
    say(format!(
        "expire holds before 100: {}",
        show(held.expire_older_than(100))
    ));
    say(format!(
        "held: {}",
        show(held.held().map(|hs| {
            hs.iter()
                .map(|h| format!("{}/{}/{}", h.channel, h.client_id, h.packet_id))
                .collect::<Vec<_>>()
        }))
    ));
    say(format!("log: {}", counters(&*log)));

    // --- offsets become visible in the order they are assigned (docs/design.md storage rule 2) ---
    say(format!(
        "commit order under concurrency: {}",
        commit_order(&append_store(p, "race"))
    ));

    // --- restart ---
    let mut configured: Vec<(String, ChannelKind)> = ["log", "aged", "sized", "race"]
        .iter()
        .map(|n| (n.to_string(), ChannelKind::Append))
        .collect();
    configured.push(("state".into(), ChannelKind::Latest));
    configured.push(("jobs".into(), ChannelKind::Queue));
    let before: Vec<String> = snapshot_of(p);
    harness.restart(&configured);
    let p2 = harness.provider();
    let p = &*p2;
    let after: Vec<String> = snapshot_of(p);
    say(format!("restart keeps channels: {}", before == after));
    for (b, a) in before.iter().zip(after.iter()) {
        if b != a {
            say(format!("  before: {b}\n  after:  {a}"));
        }
    }
    let log = append_store(p, "log");
    say(format!("log after restart: {}", counters(&*log)));
    say(format!(
        "log records after restart: {}",
        recs(log.read_from(log.floor()))
    ));
    say(format!(
        "positions after restart (expired session dropped): {}",
        show(log.positions().map(|ps| {
            ps.iter()
                .map(|p| format!("{}@{}", p.reader, p.offset))
                .collect::<Vec<_>>()
        }))
    ));
    say(format!(
        "append after restart: {}",
        show(log.append(record("log/x", "i", 500)).map(|r| r.offset))
    ));
    let latest = latest_store(p, "state");
    say(format!(
        "latest after restart: {}",
        recs(latest.match_with_deletions("#", latest.floor()))
    ));
    say(format!(
        "latest rows after restart (values below the floor kept): {}",
        rows(latest.rows_from_n("#", 1, 10))
    ));
    say(format!(
        "latest after restart: next={} floor={} deletions={} records={}",
        latest.next(),
        latest.floor(),
        latest.deletions(),
        latest.record_count()
    ));
    say(format!(
        "latest position after restart: {}",
        show(
            latest
                .position(&Reader::parse("mqtt:c1").expect("reader"))
                .map(|p| p.map(|p| p.offset))
        )
    ));
    let jobs = queue_store(p, "jobs");
    say(format!(
        "queue after restart (all available): {}",
        offered(&*jobs, 1_000_000)
    ));
    say(format!(
        "stale delivery after restart: {}",
        show(jobs.resolve(l5.delivery_id, l5.epoch))
    ));
    let l5 = jobs
        .lease(5, "w2", 99_000, 1000)
        .expect("lease 5 after restart");
    say(format!("lease 5 after restart: attempt {}", l5.attempts));
    say(format!(
        "release 5, spent: {}",
        show(jobs.release(l5.delivery_id, l5.epoch, 1000, "worker gone"))
    ));
    jobs.set_max_attempts(1);
    say(format!(
        "offer with attempts spent: {}",
        offered(&*jobs, 1_000_000)
    ));
    say(format!(
        "dead_letter_spent: {}",
        show(jobs.dead_letter_spent(3000))
    ));
    say(format!("depth after: {}", jobs.depth()));
    say(format!(
        "dlq after restart: {}",
        recs(jobs.dead_letter().read_from(1))
    ));
    let held = p.held_publishes().expect("held publishes");
    say(format!(
        "held after restart: {}",
        show(held.held().map(|hs| {
            hs.iter()
                .map(|h| format!("{}/{}/{}", h.channel, h.client_id, h.packet_id))
                .collect::<Vec<_>>()
        }))
    ));
    say(format!(
        "release c2/1 after restart: {}",
        show(held.release("log", "c2", 1).map(|r| r.map(|r| rec(&r))))
    ));
    say(format!("log: {}", counters(&*log)));

    // --- the provider's bound ---
    say(format!("provider bound: {}", provider_bound(&harness)));
    out
}

/// Every channel's counters and records, for comparing across a restart.
fn snapshot_of(p: &dyn Provider) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, kind) in p.channels() {
        let store = p.open_channel(&name, kind).expect("open");
        let line = match &store {
            ChannelStore::Append(a) => format!(
                "{name}: {} {}",
                counters(&**a),
                recs(a.read_from(a.floor()))
            ),
            ChannelStore::Latest(l) => format!(
                "{name}: next={} floor={} bytes={} {}",
                l.next(),
                l.floor(),
                l.bytes(),
                recs(l.match_with_deletions("#", l.floor()))
            ),
            ChannelStore::Queue(q) => format!(
                "{name}: next={} depth={} bytes={} {:?}",
                q.next(),
                q.depth(),
                q.bytes(),
                q.items().map(|is| is
                    .iter()
                    .map(|i| (
                        i.record.offset,
                        i.attempts,
                        i.first_delivered,
                        i.last_delivered
                    ))
                    .collect::<Vec<_>>())
            ),
        };
        lines.push(line);
    }
    lines
}

/// Four writers append while a reader keeps reading from where it got to:
/// the reader must never see an offset before every lower one (the
/// skipped record `docs/design.md` storage rule 2 rules out), and at the
/// end every offset was read exactly once.
fn commit_order(store: &Arc<dyn AppendStore>) -> String {
    const WRITERS: usize = 4;
    const EACH: usize = 500;
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let store = store.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut next = store.floor();
            let mut seen = BTreeSet::new();
            loop {
                let finished = done.load(Ordering::Acquire);
                let batch = match store.read_from_n(next, 64) {
                    Ok(b) => b,
                    Err(e) => return Err(format!("read failed: {e}")),
                };
                for r in &batch {
                    if r.offset != next {
                        return Err(format!(
                            "read offset {} while {} was not yet seen",
                            r.offset, next
                        ));
                    }
                    seen.insert(r.offset);
                    next += 1;
                }
                if finished && batch.is_empty() {
                    return Ok(seen.len());
                }
                if batch.is_empty() {
                    std::thread::yield_now();
                }
            }
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let mut r = Record::new("race", format!("{w}-{i}").into_bytes());
                    r.user_properties.push(UserProperty {
                        name: "w".into(),
                        value: w.to_string(),
                    });
                    store.append(r).expect("append");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    done.store(true, Ordering::Release);
    match reader.join().expect("reader") {
        Ok(n) if n == WRITERS * EACH => "every offset read once, in order".into(),
        Ok(n) => format!("read {n} of {}", WRITERS * EACH),
        Err(e) => e,
    }
}

/// Publishes stop short of the reserve; relief operations (a position, a
/// held publish's release) still go through; trimming gives the room back.
fn provider_bound(harness: &dyn HarnessDyn) -> String {
    harness.bound_answers()
}

/// Object-safe view of the part of a harness `provider_bound` needs.
trait HarnessDyn {
    fn bound_answers(&self) -> String;
}

impl<H: Harness> HarnessDyn for H {
    fn bound_answers(&self) -> String {
        let p = self.bounded(64 * 1024, 8 * 1024);
        let p = &*p;
        let log = append_store(p, "fill");
        let payload = "x".repeat(1000);
        let mut accepted = 0u32;
        let refusal = loop {
            match log.append(record("fill", &payload, 1)) {
                Ok(_) => accepted += 1,
                Err(e) => break e,
            }
            if accepted > 10_000 {
                return "never refused".into();
            }
        };
        let mut answers = vec![format!(
            "refused after some publishes: {} reason=0x{:02x}",
            err(&refusal),
            refusal.mqtt_reason_code()
        )];
        answers.push(format!(
            "used within the bound: {}",
            p.max_bytes().is_some_and(|m| p.bytes() <= m)
        ));
        answers.push(format!(
            "position at the bound: {}",
            show(log.save_position(position("mqtt:c", 2, now_nanos(), Some(60))))
        ));
        let held = p.held_publishes().expect("held");
        let hold = held.hold(HeldPublish {
            channel: "fill".into(),
            client_id: "c".into(),
            packet_id: 1,
            held_at: 1,
            record: Record {
                qos: 2,
                ..record("fill", &payload, 1)
            },
        });
        answers.push(format!("hold at the bound: {}", show(hold)));
        answers.push(format!(
            "trim frees room: {}",
            log.trim(log.floor() + 4, None)
                .map(|r| r.records)
                .unwrap_or(0)
        ));
        answers.push(format!(
            "publish after trim: {}",
            show(log.append(record("fill", &payload, 1)).map(|_| "stored"))
        ));
        answers.join(", ")
    }
}
