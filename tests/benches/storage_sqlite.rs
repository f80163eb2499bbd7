//! Benchmarks of the sqlite provider (`cargo bench --bench storage_sqlite`).
//!
//! Measured, each several times and printed as a range:
//! - a single-row append per commit, against a bare rusqlite insert + commit
//!   into the same kind of table, WAL + synchronous=NORMAL, in the same run
//!   (target: at most 1.3 times the bare figure), by the wall clock and by
//!   the thread's own CPU time (the figure a loaded machine moves least);
//! - group commit with 8 concurrent appenders, against the same appenders
//!   with one transaction per append (target: at least 5 times the rate);
//! - removing one record from a channel of 10,000 and of 100,000 records;
//! - one pass of the retention sweeps (by size, by age) with nothing over
//!   the bound, against 10 / 100 / 1,000 / 10,000 channels.
//!
//! The files go under `SAGUIN_BENCH_DIR` (default: the system temporary
//! directory). Put it on the machine's own disk: on a tmpfs every figure
//! measures memory, because fsync there does nothing.
//!
//! `cargo bench --bench storage_sqlite -- append group` runs only the
//! sections named (append, group, trim, sweep).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use comfy_table::Table;
use saguin::model::ChannelKind;
use saguin::storage::contract::{self, AppendStore, Provider, Retention};
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
use saguin_format::model::Record;

const PAYLOAD: usize = 128;
const RUNS: usize = 3;

fn record(i: u64) -> Record {
    let mut r = Record::new("bench/topic", Bytes::from(vec![b'x'; PAYLOAD]));
    r.timestamp = contract::now_nanos();
    r.client_id = format!("c{}", i % 8);
    r.qos = 1;
    r
}

fn provider(path: &Path, configure: impl FnOnce(&mut SqliteOptions)) -> SqliteProvider {
    let mut o = SqliteOptions::new("bench", path);
    o.read_connections = 2;
    configure(&mut o);
    SqliteProvider::open(o).expect("open provider")
}

fn append_store(p: &SqliteProvider, name: &str) -> Arc<dyn AppendStore> {
    p.open_channel(name, ChannelKind::Append)
        .expect("open channel")
        .as_append()
        .expect("append")
        .clone()
}

/// This thread's CPU time so far. On a shared machine the wall clock of a
/// commit is mostly time spent waiting for a CPU; the thread's own CPU time
/// is what the code costs, and it moves far less with the load.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Wall and CPU time per operation of a timed loop.
struct Cost {
    wall: Duration,
    cpu: Duration,
}

/// Per-operation time of `n` operations.
fn per_op(elapsed: Duration, n: u64) -> Duration {
    elapsed / u32::try_from(n).unwrap_or(u32::MAX)
}

fn fmt(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 10_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else {
        format!("{:.2}ms", ns as f64 / 1e6)
    }
}

fn range(samples: &[Duration]) -> String {
    let lo = samples.iter().min().copied().unwrap_or_default();
    let hi = samples.iter().max().copied().unwrap_or_default();
    if fmt(lo) == fmt(hi) {
        fmt(lo)
    } else {
        format!("{}–{}", fmt(lo), fmt(hi))
    }
}

fn median(samples: &[Duration]) -> Duration {
    let mut s = samples.to_vec();
    s.sort();
    s.get(s.len() / 2).copied().unwrap_or_default()
}

/// One append per commit through the provider (no company to wait for).
fn provider_single_append(dir: &Path, n: u64) -> Cost {
    let path = dir.join("single.db");
    let p = provider(&path, |_| {});
    let s = append_store(&p, "t");
    for i in 0..200 {
        s.append(record(i)).expect("warm-up append");
    }
    let started = Instant::now();
    let cpu = thread_cpu();
    for i in 0..n {
        s.append(record(i)).expect("append");
    }
    let d = Cost {
        cpu: per_op(thread_cpu().saturating_sub(cpu), n),
        wall: per_op(started.elapsed(), n),
    };
    p.close().expect("close");
    drop(p);
    remove_db(&path);
    d
}

/// A bare rusqlite insert + commit of the same row into a table keyed the
/// same way, WAL + synchronous=NORMAL. With `counter_row`, the transaction
/// also updates a counter row the way the store must (invariant 9: next and
/// bytes are stored, never derived) - the part of the difference that is
/// the schema's rather than the store's.
fn bare_single_insert(dir: &Path, n: u64, counter_row: bool) -> Cost {
    let path = dir.join("bare.db");
    let conn = rusqlite::Connection::open(&path).expect("open bare");
    conn.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
         CREATE TABLE records (channel TEXT NOT NULL, offset INTEGER NOT NULL, message_id BLOB NOT NULL,
             topic TEXT NOT NULL, timestamp INTEGER NOT NULL, payload BLOB NOT NULL, client_id TEXT NOT NULL,
             qos INTEGER NOT NULL, PRIMARY KEY (channel, offset)) STRICT;
         CREATE TABLE channels (name TEXT PRIMARY KEY, next INTEGER NOT NULL, bytes INTEGER NOT NULL) STRICT;
         INSERT INTO channels VALUES ('t', 1, 0);",
    )
    .expect("bare schema");
    let insert = |i: u64| {
        let r = record(i);
        conn.execute_batch("BEGIN").expect("begin");
        conn.prepare_cached("INSERT INTO records VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
            .expect("prepare")
            .execute(rusqlite::params![
                "t",
                i + 1,
                &r.message_id[..],
                r.topic,
                r.timestamp,
                &r.payload[..],
                r.client_id,
                r.qos
            ])
            .expect("insert");
        if counter_row {
            conn.prepare_cached("UPDATE channels SET next = ?2, bytes = ?3 WHERE name = ?1")
                .expect("prepare")
                .execute(rusqlite::params!["t", i + 2, (i + 1) * 140])
                .expect("update");
        }
        conn.execute_batch("COMMIT").expect("commit");
    };
    for i in 0..200 {
        insert(i);
    }
    let started = Instant::now();
    let cpu = thread_cpu();
    for i in 200..200 + n {
        insert(i);
    }
    let d = Cost {
        cpu: per_op(thread_cpu().saturating_sub(cpu), n),
        wall: per_op(started.elapsed(), n),
    };
    drop(conn);
    remove_db(&path);
    d
}

/// Appends a second from `writers` threads, each appending `each` records.
fn concurrent_rate(
    dir: &Path,
    writers: u64,
    each: u64,
    max_records: usize,
    interval: Option<Duration>,
) -> f64 {
    let path = dir.join(format!("group-{max_records}.db"));
    let p = provider(&path, |o| {
        o.publish_commit_max_records = max_records;
        o.publish_commit_interval = interval;
    });
    let s = append_store(&p, "t");
    let started = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for i in 0..each {
                    s.append(record(w * each + i)).expect("append");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    let rate = (writers * each) as f64 / started.elapsed().as_secs_f64();
    assert_eq!(s.next(), writers * each + 1);
    let (batches, publishes) = p.group_commit_stats();
    eprintln!(
        "max_records {max_records} interval {interval:?}: {rate:.0}/s, {batches} transactions, {:.1} publishes each",
        publishes as f64 / batches.max(1) as f64
    );
    p.close().expect("close");
    drop(p);
    remove_db(&path);
    rate
}

/// Removing one record from the front of a channel holding `held`.
fn trim_one(dir: &Path, held: u64, removals: u64) -> Duration {
    let path = dir.join(format!("trim-{held}.db"));
    let p = provider(&path, |o| o.publish_commit_max_records = 1024);
    let s = append_store(&p, "long");
    // Filled from several threads so group commit batches the load.
    let threads: Vec<_> = (0..8)
        .map(|w| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for i in 0..(held + removals).div_ceil(8) {
                    s.append(record(w + i)).expect("append");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("filler");
    }
    let started = Instant::now();
    for _ in 0..removals {
        let removed = s.trim(s.floor() + 1, None).expect("trim");
        assert_eq!(removed.records, 1);
    }
    let d = per_op(started.elapsed(), removals);
    p.close().expect("close");
    drop(p);
    remove_db(&path);
    d
}

/// One pass of each sweep over `channels` channels of 8 records, nothing
/// over either bound (the steady state).
fn sweeps(dir: &Path, channels: usize) -> (Vec<Duration>, Vec<Duration>) {
    let path = dir.join(format!("sweep-{channels}.db"));
    let p = provider(&path, |_| {});
    let mut stores = Vec::with_capacity(channels);
    for c in 0..channels {
        stores.push(append_store(&p, &format!("ch{c}")));
    }
    let filler = stores.clone();
    let chunks: Vec<Vec<Arc<dyn AppendStore>>> = filler
        .chunks(channels.div_ceil(8).max(1))
        .map(|c| c.to_vec())
        .collect();
    let threads: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            std::thread::spawn(move || {
                for s in chunk {
                    for i in 0..8 {
                        s.append(record(i)).expect("append");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("filler");
    }
    let retention = Retention {
        bytes: Some(1 << 30),
        age: Some(Duration::from_secs(7 * 24 * 3600)),
        deletions: None,
    };
    let set: Vec<(Arc<dyn AppendStore>, Retention)> =
        stores.into_iter().map(|s| (s, retention.clone())).collect();
    let passes = if channels >= 10_000 { 3 } else { 10 };
    let mut by_size = Vec::new();
    let mut by_age = Vec::new();
    for _ in 0..passes {
        let started = Instant::now();
        let report = contract::sweep_by_size(&set);
        by_size.push(started.elapsed());
        assert_eq!(report.total().records, 0);
        let started = Instant::now();
        let report = contract::sweep_by_age(&set, contract::now_nanos());
        by_age.push(started.elapsed());
        assert_eq!(report.total().records, 0);
        assert!(report.failed.is_empty());
    }
    drop(set);
    p.close().expect("close");
    drop(p);
    remove_db(&path);
    (by_size, by_age)
}

fn remove_db(path: &Path) {
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let base = std::env::var_os("SAGUIN_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base).expect("bench directory");
    let dir = dir.path();
    let scale = |full: u64, small: u64| if quick { small } else { full };
    // `cargo bench --bench storage_sqlite -- append group` runs only the
    // sections named (append, group, trim, sweep); none named runs all.
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |section: &str| named.is_empty() || named.iter().any(|n| n == section);
    eprintln!(
        "bench directory: {}{}",
        dir.display(),
        if quick { " (quick run)" } else { "" }
    );

    let mut table = Table::new();
    table.set_header(vec!["benchmark", "figure", "against", "ratio", "target"]);

    // 1. A single-row append per commit against a bare insert + commit.
    if wanted("append") {
        let n = scale(20_000, 500);
        let mut ours = Vec::new();
        let mut bare = Vec::new();
        let mut bare_counter = Vec::new();
        for _ in 0..RUNS {
            bare.push(bare_single_insert(dir, n, false));
            bare_counter.push(bare_single_insert(dir, n, true));
            ours.push(provider_single_append(dir, n));
        }
        let wall = |v: &[Cost]| v.iter().map(|c| c.wall).collect::<Vec<_>>();
        let cpu = |v: &[Cost]| v.iter().map(|c| c.cpu).collect::<Vec<_>>();
        for (label, pick, target) in [
            (
                "wall",
                &wall as &dyn Fn(&[Cost]) -> Vec<Duration>,
                "<= 1.3x",
            ),
            ("thread CPU", &cpu, "<= 1.3x"),
        ] {
            let (o, b, bc) = (pick(&ours), pick(&bare), pick(&bare_counter));
            let ratio = median(&o).as_secs_f64() / median(&b).as_secs_f64();
            table.add_row(vec![
                format!("append, one per commit ({PAYLOAD} B payload), {label}"),
                format!("{} per commit", range(&o)),
                format!("bare insert + commit {}", range(&b)),
                format!("{ratio:.2}x"),
                target.into(),
            ]);
            let ratio = median(&o).as_secs_f64() / median(&bc).as_secs_f64();
            table.add_row(vec![
                format!("  the same, against the same SQL by hand, {label}"),
                format!("{} per commit", range(&o)),
                format!("insert + counter row + commit {}", range(&bc)),
                format!("{ratio:.2}x"),
                String::new(),
            ]);
        }
    }

    // 2. Group commit with 8 appenders against one transaction per append:
    // collecting without waiting (the default), and with an interval and a
    // batch size matched to the appenders.
    if wanted("group") {
        let each = scale(4_000, 100);
        let fmt_rate = |v: &[f64]| {
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(0.0, f64::max);
            format!("{lo:.0}–{hi:.0}/s")
        };
        let mid = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let mut single = Vec::new();
        let mut collected = Vec::new();
        let mut waited = Vec::new();
        for _ in 0..RUNS {
            single.push(concurrent_rate(dir, 8, each, 1, None));
            collected.push(concurrent_rate(dir, 8, each, 256, None));
            waited.push(concurrent_rate(
                dir,
                8,
                each,
                8,
                Some(Duration::from_millis(2)),
            ));
        }
        for (label, rates) in [
            ("8 appenders, group commit (interval none, 256)", &collected),
            ("8 appenders, group commit (interval 2ms, 8)", &waited),
        ] {
            table.add_row(vec![
                label.to_string(),
                fmt_rate(rates),
                format!("one txn per append {}", fmt_rate(&single)),
                format!("{:.1}x", mid(rates) / mid(&single)),
                ">= 5x".into(),
            ]);
        }
    }

    // 3. Trim on a long channel.
    if wanted("trim") {
        for held in [scale(10_000, 1_000), scale(100_000, 2_000)] {
            let samples: Vec<Duration> = (0..RUNS)
                .map(|_| trim_one(dir, held, scale(500, 50)))
                .collect();
            table.add_row(vec![
                format!("trim one record, {held} held"),
                range(&samples),
                String::new(),
                String::new(),
                "flat in length".into(),
            ]);
        }
    }

    // 4. Retention sweeps against the channel count.
    if wanted("sweep") {
        let counts: &[usize] = if quick {
            &[10, 100]
        } else {
            &[10, 100, 1_000, 10_000]
        };
        for &channels in counts {
            let (by_size, by_age) = sweeps(dir, channels);
            table.add_row(vec![
                format!("sweep by size, {channels} channels"),
                range(&by_size),
                String::new(),
                String::new(),
                "reads nothing".into(),
            ]);
            table.add_row(vec![
                format!("sweep by age, {channels} channels"),
                range(&by_age),
                String::new(),
                String::new(),
                "one read a channel".into(),
            ]);
        }
    }
    println!("{table}");
}
