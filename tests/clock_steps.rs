//! The system clock stepping under a running broker, as on a device
//! without a battery-backed clock: it starts at a time long past and NTP
//! sets it later. The broker runs under libfaketime (Debian's `faketime`,
//! which `.ci/run` installs), whose offset a file sets while the broker
//! runs; the monotonic clock is left alone, as a real step leaves it.
//! Receipt times are read from the sqlite file after a clean stop.

mod broker_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use broker_support::*;

/// libfaketime's multi-threaded build, where Debian puts it.
fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .map(|dir| Path::new(dir).join("faketime/libfaketimeMT.so.1"))
    .find(|path| path.exists())
}

/// The system clock as the broker sees it: `offset` is libfaketime's
/// (`-3650d`: ten years behind; `+0`: the real time), read again at every
/// call, so writing the file steps the clock.
struct FakeClock {
    library: PathBuf,
    offset_file: PathBuf,
    /// The brokers started on it, by process id.
    started: std::cell::RefCell<Vec<u32>>,
}

impl FakeClock {
    fn new(test: &str, dir: &Path) -> Option<FakeClock> {
        let Some(library) = libfaketime() else {
            say_skipped(
                test,
                "libfaketime is not installed (apt-get install faketime; .ci/run does)",
            );
            return None;
        };
        Some(FakeClock {
            library,
            offset_file: dir.join("clock-offset"),
            started: Default::default(),
        })
    }

    /// Written whole and renamed into place: libfaketime reads the file at
    /// every call and must never find it half written.
    fn set(&self, offset: &str) {
        let next = self.offset_file.with_extension("next");
        std::fs::write(&next, format!("{offset}\n")).unwrap();
        std::fs::rename(&next, &self.offset_file).unwrap();
    }

    /// `broker` stopped (killed, if it still runs) and started again on
    /// this clock in its directory.
    fn restart(&self, broker: Broker, yaml: &str) -> Broker {
        self.started(broker.restart_with(yaml, |command| self.run_on_it(command)))
    }

    fn start(&self, dir: tempfile::TempDir, yaml: &str) -> Broker {
        self.started(Broker::start_with(dir, yaml, |command| {
            self.run_on_it(command)
        }))
    }

    fn started(&self, broker: Broker) -> Broker {
        self.started.borrow_mut().push(broker.child.id());
        broker
    }

    /// `command` runs on this clock (and says what retention removed).
    fn run_on_it(&self, command: &mut std::process::Command) {
        command
            .env("LD_PRELOAD", &self.library)
            .env("FAKETIME_TIMESTAMP_FILE", &self.offset_file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("RUST_LOG", "info,saguin::broker::retention=debug");
    }
}

/// libfaketime leaves a shared-memory segment and a semaphore in /dev/shm,
/// named by the process id, after every process it was loaded into, on a
/// clean exit as after a kill: removed once the brokers are gone (each
/// test's broker is declared after its clock, so dropped first).
impl Drop for FakeClock {
    fn drop(&mut self) {
        for pid in self.started.get_mut().iter() {
            for name in [
                format!("faketime_shm_{pid}"),
                format!("sem.faketime_sem_{pid}"),
            ] {
                let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
            }
        }
    }
}

/// A directory for a broker, the clock it runs on, its configuration and
/// the sqlite file of its channel; `None` (said) without libfaketime.
fn set_up(test: &str) -> Option<(tempfile::TempDir, FakeClock, String, PathBuf)> {
    let dir = tempfile::tempdir().unwrap();
    let clock = FakeClock::new(test, dir.path())?;
    let yaml = config(dir.path());
    let db = dir.path().join("channels.db");
    Some((dir, clock, yaml, db))
}

fn config(dir: &Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: disk\n    kind: sqlite\n    file_path: {}\n    checkpoint_room: 0\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: disk\n    retention_age: 1h\n",
        dir.join("channels.db").display()
    )
}

fn real_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Publishes `r<first>`..=`r<last>` to `telemetry/a` at QoS 1, each
/// acknowledged.
async fn publish_range(broker: &Broker, first: u32, last: u32) {
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    c.connect("publisher", ConnectOpts::clean()).await;
    for i in first..=last {
        c.publish_acked(
            "telemetry/a",
            format!("r{i}").as_bytes(),
            1,
            false,
            i as u16,
        )
        .await;
    }
    c.disconnect().await;
}

/// The receipt time of each record of `telemetry`, by payload, in offset
/// order, read from the file once the broker has stopped.
fn receipt_times(db: &Path) -> Vec<(String, i64)> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT payload, timestamp FROM records WHERE channel = 'telemetry' ORDER BY offset",
        )
        .unwrap();
    stmt.query_map([], |r| {
        Ok((
            String::from_utf8(r.get::<_, Vec<u8>>(0)?).unwrap(),
            r.get(1)?,
        ))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Within ten minutes of the real time: the clock's, not a time ten years
/// back.
fn is_recent(unix: i64) -> bool {
    (real_now() - unix).abs() < Duration::from_secs(600).as_nanos() as i64
}

const TEN_YEARS_BACK: &str = "-3650d";

#[test]
fn records_received_after_the_clock_is_set_carry_its_time_and_outlive_retention_by_age() {
    let test =
        "records_received_after_the_clock_is_set_carry_its_time_and_outlive_retention_by_age";
    let Some((dir, clock, yaml, db)) = set_up(test) else {
        return;
    };
    clock.set(TEN_YEARS_BACK);
    let mut broker = clock.start(dir, &yaml);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(publish_range(&broker, 1, 3));
    // NTP sets the clock.
    clock.set("+0");
    broker.wait_log(|l| l.contains("the system clock stepped forward"));
    assert_eq!(
        metric_sample(&metrics_text(&broker), "saguin_clock_steps_total"),
        Some(1)
    );
    rt.block_on(publish_range(&broker, 4, 6));
    // Set back an hour: not followed.
    clock.set("-1h");
    broker.wait_log(|l| l.contains("the system clock is behind the broker's receipt clock"));
    rt.block_on(publish_range(&broker, 7, 7));
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let times = receipt_times(&db);
    let payloads: Vec<&str> = times.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(payloads, ["r1", "r2", "r3", "r4", "r5", "r6", "r7"]);
    // Received before the clock was set: stamped by it, ten years back.
    assert!(times[..3].iter().all(|(_, t)| !is_recent(*t)), "{times:?}");
    // Received after: the clock's time, where they were stamped ten years
    // back too while the broker kept the clock it started with.
    assert!(times[3..].iter().all(|(_, t)| is_recent(*t)), "{times:?}");
    assert!(times.windows(2).all(|w| w[0].1 <= w[1].1), "{times:?}");

    // Restarted (the clock still an hour back: the start goes on from the
    // storage's last time), retention by age (1 h) removes what was
    // stamped ten years back, and keeps the rest.
    let broker = clock.restart(broker, &yaml);
    let swept = broker.wait_log(|l| l.contains("retention removed records"));
    assert_eq!(field(&swept, "records").as_deref(), Some("3"), "{swept}");
    let first = rt.block_on(async {
        let mut c = consumer_from_earliest(broker.addr(), "telemetry/#").await;
        String::from_utf8(c.next_publish(true).await.payload.to_vec()).unwrap()
    });
    assert_eq!(first, "r4");
}

#[test]
fn a_broker_started_on_a_clock_behind_its_storage_stamps_from_the_storages_last_time() {
    let test = "a_broker_started_on_a_clock_behind_its_storage_stamps_from_the_storages_last_time";
    let Some((dir, clock, yaml, db)) = set_up(test) else {
        return;
    };
    // A first run on a clock that was set, stopped cleanly: its lock
    // records when.
    clock.set("+0");
    let mut broker = clock.start(dir, &yaml);
    // Its stop is recorded after this.
    let stopping = real_now();
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    // The device restarts with its clock ten years back.
    clock.set(TEN_YEARS_BACK);
    let mut broker = clock.restart(broker, &yaml);
    broker.wait_log(|l| {
        l.contains("the system clock is behind the last time the storage was in use")
    });
    let ahead = metric_sample(&metrics_text(&broker), "saguin_receipt_clock_ahead_seconds");
    assert!(
        ahead.is_some_and(|s| s > 300_000_000),
        "ahead by {ahead:?} s"
    );
    let doc = status_json(&broker);
    assert!(
        doc["receipt_clock_ahead_seconds"].as_f64().unwrap() > 3.0e8,
        "{doc:#}"
    );
    let human = status_of(&broker, &[]);
    assert!(
        human.contains("behind the broker's receipt clock"),
        "{human}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(publish_range(&broker, 1, 2));
    // NTP sets the clock: the system clock passes the broker's again.
    clock.set("+0");
    broker.wait_log(|l| {
        l.contains("the system clock caught up with the broker's receipt clock")
            || l.contains("the system clock stepped forward")
    });
    rt.block_on(publish_range(&broker, 3, 3));
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let times = receipt_times(&db);
    let payloads: Vec<&str> = times.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(payloads, ["r1", "r2", "r3"]);
    // Stamped from the last stop on, where the system clock said ten
    // years back (the stop's own time: no record was there to go by).
    assert!(
        times.iter().all(|(_, t)| *t >= stopping && is_recent(*t)),
        "{times:?}"
    );
    assert!(times.windows(2).all(|w| w[0].1 <= w[1].1), "{times:?}");
}

/// A power cut leaves no stop time in the lock, and the lock's start time
/// was the clock's before NTP set it: the newest record's receipt time is
/// what the next start goes on from.
#[test]
fn after_a_power_cut_a_start_on_an_unset_clock_goes_on_from_the_newest_record() {
    let test = "after_a_power_cut_a_start_on_an_unset_clock_goes_on_from_the_newest_record";
    let Some((dir, clock, yaml, db)) = set_up(test) else {
        return;
    };
    clock.set(TEN_YEARS_BACK);
    let broker = clock.start(dir, &yaml);
    clock.set("+0");
    broker.wait_log(|l| l.contains("the system clock stepped forward"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(publish_range(&broker, 1, 1));
    // Killed: no stop is recorded, and the lock's start is ten years back.
    clock.set(TEN_YEARS_BACK);
    let mut broker = clock.restart(broker, &yaml);
    broker.wait_log(|l| {
        l.contains("the system clock is behind the last time the storage was in use")
    });
    rt.block_on(publish_range(&broker, 2, 2));
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let times = receipt_times(&db);
    let payloads: Vec<&str> = times.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(payloads, ["r1", "r2"]);
    assert!(times.iter().all(|(_, t)| is_recent(*t)), "{times:?}");
    assert!(times[0].1 <= times[1].1, "{times:?}");
}
