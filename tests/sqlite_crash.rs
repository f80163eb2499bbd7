//! Crash test of the sqlite provider (the durability model: a writer killed
//! with SIGKILL at random moments, then every reported commit checked).
//!
//! This test binary re-executes itself as the child: with
//! `SAGUIN_CRASH_CHILD=<db>` set, `crash_child_appends_until_killed` opens a
//! provider on `<db>` and appends from four threads (so group commit batches
//! form), printing `COMMIT <offset> <payload>` after each append returned.
//! The parent kills it mid-stream several times, reopens the database each
//! time, and checks that every reported commit is there at its offset, that
//! no offset was reused, and that there is no hole.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use saguin::model::ChannelKind;
use saguin::storage::contract::{AppendStore, Provider};
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
use saguin_format::model::Record;

const CHILD_ENV: &str = "SAGUIN_CRASH_CHILD";
const ROUND_ENV: &str = "SAGUIN_CRASH_ROUND";
/// Set to a seed the test printed to replay that run's kill points.
const SEED_ENV: &str = "SAGUIN_CRASH_SEED";
const CHANNEL: &str = "telemetry";

fn options(db: &Path) -> SqliteOptions {
    let mut o = SqliteOptions::new("crash", db);
    o.flush_interval = Duration::from_millis(10);
    o.read_connections = 1;
    o
}

/// Odd rounds collect publishes with an interval, so a kill can land while
/// a leader waits for company or commits a batch of several.
fn child_options(db: &Path, round: u32) -> SqliteOptions {
    let mut o = options(db);
    if round % 2 == 1 {
        o.publish_commit_interval = Some(Duration::from_millis(1));
        o.publish_commit_max_records = 16;
    }
    o
}

/// The child's body, run by the crash test as a process of its own (and
/// ignored by an ordinary run, which counts it neither passed nor failed).
#[test]
#[ignore = "the crash test's child process, run by it with --ignored"]
fn crash_child_appends_until_killed() {
    let Ok(db) = std::env::var(CHILD_ENV) else {
        return;
    };
    let round: u32 = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let provider = SqliteProvider::open(child_options(Path::new(&db), round)).unwrap();
    let store: Arc<dyn AppendStore> = provider
        .open_channel(CHANNEL, ChannelKind::Append)
        .unwrap()
        .as_append()
        .unwrap()
        .clone();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0u64.. {
                    let payload = format!("r{round}-t{t}-{i}");
                    let mut record =
                        Record::new(format!("{CHANNEL}/t{t}"), Bytes::from(payload.clone()));
                    record.timestamp = 1;
                    let stored = store.append(record).unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "COMMIT {} {payload}", stored.offset).unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// A small deterministic generator seeded from the clock, or from
/// `SAGUIN_CRASH_SEED`: the kill points differ between runs, and the seed
/// is printed so a failure can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn every_reported_commit_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let seed = match std::env::var(SEED_ENV) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not an unsigned integer")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    // Printed first, so a failure's captured output starts with it.
    eprintln!("crash test seed {seed} (replay: {SEED_ENV}={seed} cargo test --test sqlite_crash)");
    let mut rng = Lcg(seed);
    let deadline = Instant::now() + Duration::from_secs(90);
    // offset -> payload, across every round: a reused offset would show up
    // as a payload changing under a number already reported.
    let mut reported: BTreeMap<u64, String> = BTreeMap::new();
    let rounds = 5;
    for round in 0..rounds {
        let kill_after = 20 + rng.next() % 400;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_child_appends_until_killed",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &db)
            .env(ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = 0;
        let mut killed = false;
        let mut this_round = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    panic!("round {round}: no progress before the deadline");
                }
            };
            let Some(rest) = line.strip_prefix("COMMIT ") else {
                continue;
            };
            let (offset, payload) = rest.split_once(' ').unwrap();
            this_round.push((offset.parse::<u64>().unwrap(), payload.to_string()));
            seen += 1;
            if seen == kill_after && !killed {
                // SIGKILL, mid-stream: appends are in flight on four threads.
                child.kill().unwrap();
                killed = true;
            }
        }
        let status = child.wait().unwrap();
        reader.join().unwrap();
        assert!(
            killed,
            "round {round}: the child stopped on its own: {status:?}"
        );
        for (offset, payload) in this_round {
            if let Some(previous) = reported.insert(offset, payload.clone()) {
                panic!("round {round}: offset {offset} reported twice: {previous} and {payload}");
            }
        }

        // Reopen (the lock died with the child) and check.
        let provider = SqliteProvider::open(options(&db)).unwrap();
        let store = provider
            .open_channel(CHANNEL, ChannelKind::Append)
            .unwrap()
            .as_append()
            .unwrap()
            .clone();
        let records = store.read_from(store.floor()).unwrap();
        let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
        let expected: Vec<u64> = (1..store.next()).collect();
        assert_eq!(
            offsets, expected,
            "round {round}: a hole or a reused offset"
        );
        let stored: BTreeMap<u64, &Bytes> =
            records.iter().map(|r| (r.offset, &r.payload)).collect();
        for (offset, payload) in &reported {
            assert_eq!(
                stored.get(offset).map(|p| p.as_ref()),
                Some(payload.as_bytes()),
                "round {round}: reported commit {offset} ({payload}) lost"
            );
        }
        assert_eq!(
            store.bytes(),
            records.iter().map(Record::accounted_size).sum::<u64>(),
            "round {round}: the stored byte counter disagrees with the records"
        );
        provider.close().unwrap();
        eprintln!(
            "round {round}: killed after {kill_after} reported commits; {} records, next {}",
            records.len(),
            store.next()
        );
    }
    assert!(reported.len() >= rounds * 20);
}
