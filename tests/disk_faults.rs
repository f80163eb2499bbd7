//! Disk faults survived, on real file systems: a sqlite provider on a
//! size-limited tmpfs that fills up, on an ext4 image the kernel remounts
//! read-only, and with an fsync or a write failing on the n-th call (the
//! `SAGUIN_INJECT_FAULTS` seam, for what a file system cannot be made to do
//! on demand). In each: what was PUBACKed is there after kill -9 and a
//! restart, nothing refused is stored, other providers' channels and
//! broadcast topics keep working, the broker never exits on its own, and
//! the fault is logged once per change of the provider's health.
//!
//! Mounting needs root (CI runs as root); without it each test says it
//! skipped, loudly, and passes. Every mount is undone by a drop guard.

mod broker_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use broker_support::volume::Volume;
use broker_support::*;
use saguin::broker::codec::{Packet, ReasonCode};
use saguin::storage::contract::{AppendStore, Provider};
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A sqlite provider `db` on `volume` keeping the append channel
/// `telemetry`, and a memory provider `mem` keeping the append channel
/// `other`; broadcast topics and sessions in memory; metrics served.
fn config(volume: &Path, dir: &Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         \x20 - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: db\n\
         \x20 - name: other\n    kind: append\n    storage: mem\n",
        volume.join("saguin.db").display(),
        dir.join("snapshots").display()
    )
}

/// A 2 KiB payload that says which publish it was.
fn payload(i: u32) -> Vec<u8> {
    let mut p = format!("{i:08}").into_bytes();
    p.resize(2048, b'.');
    p
}

fn index_of(payload: &[u8]) -> u32 {
    std::str::from_utf8(&payload[..8]).unwrap().parse().unwrap()
}

/// What became of a run of QoS 1 publishes.
#[derive(Default, Debug)]
struct Answers {
    acknowledged: Vec<u32>,
    /// Refused with 0x83.
    failed: Vec<u32>,
}

/// Publishes `ids` at QoS 1 to `topic`, one at a time, each answered
/// before the next: every one must be answered with a PUBACK, success or
/// 0x83 (a full file system is not the configured bound: never 0x97).
async fn publish_each(
    c: &mut Raw<tokio::net::TcpStream>,
    topic: &str,
    ids: impl IntoIterator<Item = u32>,
) -> Answers {
    let mut answers = Answers::default();
    for i in ids {
        let packet_id = (i % 60_000 + 1) as u16;
        c.publish(topic, &payload(i), 1, false, packet_id).await;
        match c.recv().await {
            Some(Packet::PubAck(a)) if a.packet_id == packet_id => match a.reason {
                ReasonCode::Success => answers.acknowledged.push(i),
                ReasonCode::ImplementationSpecificError => answers.failed.push(i),
                other => panic!("publish {i}: PUBACK {other:?}; a full disk answers 0x83"),
            },
            other => panic!("publish {i}: expected its PUBACK, got {other:?}"),
        }
    }
    answers
}

/// Publishes in rounds of ten from `first` until one is refused (0x83),
/// at most 2,000: what became of them all.
async fn publish_until_refused(
    c: &mut Raw<tokio::net::TcpStream>,
    topic: &str,
    first: u32,
) -> Answers {
    let mut all = Answers::default();
    for round in 0..200u32 {
        let from = first + round * 10;
        let answers = publish_each(c, topic, from..from + 10).await;
        all.acknowledged.extend(answers.acknowledged);
        all.failed.extend(&answers.failed);
        if !answers.failed.is_empty() {
            break;
        }
    }
    all
}

/// [`publish_each`] on a connection of its own, the clean MQTT 5 client
/// `id`.
fn publish_as(
    rt: &tokio::runtime::Runtime,
    broker: &Broker,
    id: &str,
    topic: &str,
    ids: std::ops::Range<u32>,
) -> Answers {
    rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect(id, ConnectOpts::clean()).await;
        publish_each(&mut c, topic, ids).await
    })
}

/// The provider `db` at `db`, keeping a checkpoint's room of `room` bytes.
fn open_with_room(db: &Path, room: u64) -> SqliteProvider {
    let mut options = SqliteOptions::new("db", db);
    options.checkpoint_room = room;
    SqliteProvider::open(options).unwrap()
}

/// Every record of `channel` in the database, by the publish index its
/// payload carries, opened the way a restarted broker opens it.
fn stored(db: &Path, channel: &str) -> Vec<u32> {
    let provider = SqliteProvider::open(SqliteOptions::new("check", db)).expect("reopen");
    let store = append_store(&provider, channel);
    let records = store.read_from(store.floor()).unwrap();
    provider.close().unwrap();
    records.iter().map(|r| index_of(&r.payload)).collect()
}

fn sqlite_verify(db: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["sqlite", "verify"])
        .arg(db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sqlite verify {}: {}{}",
        db.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The broker is still running: it never exits on its own over a fault.
fn still_running(broker: &mut Broker) {
    assert!(
        broker.child.try_wait().unwrap().is_none(),
        "the broker exited: {}",
        broker.log_text()
    );
}

fn log_lines_with(broker: &Broker, needle: &str) -> usize {
    broker
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

const NO_SPACE: &str = "no space left for the storage provider";
const ROOM_AGAIN: &str = "has room again";
const FAILED: &str = "storage provider failed";

#[test]
fn a_full_tmpfs_refuses_publishes_with_0x83_takes_them_again_when_freed_and_loses_none() {
    let test =
        "a_full_tmpfs_refuses_publishes_with_0x83_takes_them_again_when_freed_and_loses_none";
    let Some(volume) = Volume::tmpfs(test, "8m") else {
        return;
    };
    // The measured case: 5 MiB of the 8 taken by something else.
    let ballast = volume.path.join("ballast");
    std::fs::write(&ballast, vec![0u8; 5 << 20]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&volume.path, dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let log_before_full = broker.log.lock().unwrap().len();
    let (first, during) = rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("filler", ConnectOpts::clean()).await;
        let first = publish_each(&mut c, "telemetry/a", 0..2000).await;
        assert!(
            !first.failed.is_empty(),
            "2,000 publishes of 2 KiB never filled the volume"
        );
        // Still connected; other providers' channels and broadcast topics
        // keep working meanwhile.
        c.send(Packet::PingReq).await;
        assert!(matches!(c.recv().await, Some(Packet::PingResp)));
        let other = publish_each(&mut c, "other/a", 0..20).await;
        assert_eq!(other.acknowledged.len(), 20, "{other:?}");
        let broadcast = publish_each(&mut c, "plain/topic", 0..20).await;
        assert_eq!(broadcast.acknowledged.len(), 20, "{broadcast:?}");
        // Still full: refused again, without a second log line.
        let during = publish_each(&mut c, "telemetry/a", 2000..2050).await;
        (first, during)
    });
    still_running(&mut broker);
    let text = metrics_text(&broker);
    assert!(
        metric_sample(
            &text,
            "saguin_storage_errors_total{provider=\"db\",kind=\"no_space\"}"
        )
        .is_some_and(|n| n > 0),
        "{text}"
    );
    assert_eq!(
        metric_sample(&text, "saguin_provider_no_space{provider=\"db\"}"),
        Some(1),
        "{text}"
    );
    assert_eq!(
        metric_sample(&text, "saguin_provider_failed{provider=\"db\"}"),
        Some(0)
    );
    assert_eq!(
        metric_sample(
            &text,
            "saguin_storage_errors_total{provider=\"db\",kind=\"full\"}"
        ),
        Some(0),
        "a full file system is not the configured bound"
    );
    // Once per change of health, not once per publish.
    broker.wait_log(|l| l.contains(NO_SPACE));
    assert_eq!(
        log_lines_with(&broker, NO_SPACE),
        1,
        "{}",
        broker.log_text()
    );
    let log_bytes_while_full: usize = broker.log.lock().unwrap()[log_before_full..]
        .iter()
        .map(|l| l.len() + 1)
        .sum();

    // Space returns: the very next publishes are taken, with no restart.
    std::fs::remove_file(&ballast).unwrap();
    let freed = Instant::now();
    let after = rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("after", ConnectOpts::clean()).await;
        let after = publish_each(&mut c, "telemetry/b", 3000..3050).await;
        eprintln!(
            "FIGURE full tmpfs: {} of {} acknowledged before full, {} refused while full; first publish after freeing answered {:?} after the space returned; {} bytes of log from the first publish to the freeing",
            first.acknowledged.len(),
            first.acknowledged.len() + first.failed.len(),
            first.failed.len() + during.failed.len(),
            freed.elapsed(),
            log_bytes_while_full
        );
        after
    });
    assert_eq!(after.acknowledged.len(), 50, "{after:?}");
    broker.wait_log(|l| l.contains(ROOM_AGAIN));
    still_running(&mut broker);

    // kill -9, then a restart: every acknowledged record is there, and no
    // refused one.
    let db = volume.path.join("saguin.db");
    let mut broker = broker.restart(&yaml);
    still_running(&mut broker);
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let have: BTreeSet<u32> = stored(&db, "telemetry").into_iter().collect();
    let want: BTreeSet<u32> = first
        .acknowledged
        .iter()
        .chain(&during.acknowledged)
        .chain(&after.acknowledged)
        .copied()
        .collect();
    assert_eq!(have, want, "exactly the acknowledged records are stored");
    sqlite_verify(&db);
}

#[test]
fn a_consumer_keeps_receiving_and_acknowledging_while_the_disk_is_full() {
    let test = "a_consumer_keeps_receiving_and_acknowledging_while_the_disk_is_full";
    let Some(volume) = Volume::tmpfs(test, "8m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&volume.path, dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    const RECORDS: u32 = 300;
    runtime().block_on(async {
        let mut p = Raw::tcp(broker.addr(), v5()).await;
        p.connect("producer", ConnectOpts::clean()).await;
        let stored = publish_each(&mut p, "telemetry/c", 0..RECORDS).await;
        assert_eq!(stored.acknowledged.len(), RECORDS as usize);

        // A consumer with a window of 10, started before the disk fills.
        let mut opts = ConnectOpts::persistent(3600);
        opts.properties.receive_maximum = Some(10);
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("consumer", opts).await;
        let reasons = c
            .subscribe_with_user_properties(1, "telemetry/#", 1, &[("saguin-from", "earliest")])
            .await;
        assert_eq!(reasons, vec![ReasonCode::GrantedQoS1]);
        let mut got = Vec::new();
        let mut unacked = Vec::new();
        for _ in 0..10 {
            unacked.push(c.next_publish(false).await);
        }
        // The disk fills up: nothing is left.
        volume.fill("ballast");
        let refused = publish_each(&mut p, "telemetry/c", RECORDS..RECORDS + 5).await;
        assert_eq!(refused.failed.len(), 5, "{refused:?}");
        // The consumer acknowledges and goes on receiving to the end.
        for m in unacked.drain(..) {
            got.push(index_of(&m.payload));
            c.ack_publish(&m).await;
        }
        while got.len() < RECORDS as usize {
            let m = c.next_publish(true).await;
            got.push(index_of(&m.payload));
        }
        assert_eq!(got, (0..RECORDS).collect::<Vec<_>>());
    });
    still_running(&mut broker);
    assert!(
        log_lines_with(&broker, NO_SPACE) <= 1,
        "{}",
        broker.log_text()
    );
}

#[test]
fn a_read_only_remount_fails_the_provider_until_a_restart_and_loses_nothing() {
    let test = "a_read_only_remount_fails_the_provider_until_a_restart_and_loses_nothing";
    let Some(volume) = Volume::ext4(test, 16) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&volume.path, dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let before = publish_as(&rt, &broker, "before", "telemetry/d", 0..100);
    assert_eq!(before.acknowledged.len(), 100);
    // What the flusher makes durable every flush_interval, made so now: a
    // kernel that turns a file system read-only drops the pages it had not
    // written, which is a power cut to the commits of the last interval
    // (docs/operations.md, "Disk faults"), and this test is about the rest.
    volume.sync();
    volume.fail_into_read_only();
    rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("during", ConnectOpts::clean()).await;
        let during = publish_each(&mut c, "telemetry/d", 100..150).await;
        assert!(during.acknowledged.is_empty(), "{during:?}");
        // The other provider and broadcast topics go on.
        let other = publish_each(&mut c, "other/d", 0..10).await;
        assert_eq!(other.acknowledged.len(), 10);
        let broadcast = publish_each(&mut c, "plain/d", 0..10).await;
        assert_eq!(broadcast.acknowledged.len(), 10);
        // MQTT 3.1.1: disconnected, never acknowledged.
        let mut old = Raw::tcp(broker.addr(), v4()).await;
        old.connect("old", ConnectOpts::clean()).await;
        old.publish("telemetry/d", &payload(999), 1, false, 1).await;
        let seen = old.expect_close().await;
        assert!(
            !seen.iter().any(|p| matches!(p, Packet::PubAck(_))),
            "{seen:?}"
        );
    });
    still_running(&mut broker);
    let line = broker.wait_log(|l| l.contains(FAILED));
    assert!(line.contains("kind=read_only"), "{line}");
    assert_eq!(log_lines_with(&broker, FAILED), 1, "{}", broker.log_text());
    let text = metrics_text(&broker);
    assert_eq!(
        metric_sample(&text, "saguin_provider_failed{provider=\"db\"}"),
        Some(1),
        "{text}"
    );
    assert!(
        metric_sample(
            &text,
            "saguin_storage_errors_total{provider=\"db\",kind=\"read_only\"}"
        )
        .is_some_and(|n| n >= 50),
        "{text}"
    );
    // The documented recovery: the disk put right, a restart.
    let db = volume.path.join("saguin.db");
    // The same directory again: the configuration names the memory
    // provider's snapshots there, and a directory of its own would leave
    // them behind, unowned, when the test ends.
    let dir = std::mem::replace(&mut broker.dir, tempfile::tempdir().unwrap());
    drop(broker);
    volume.mount_again();
    let mut broker = Broker::start_in(dir, &yaml);
    rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("after", ConnectOpts::clean()).await;
        let after = publish_each(&mut c, "telemetry/d", 200..210).await;
        assert_eq!(after.acknowledged.len(), 10, "{after:?}");
    });
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let have: BTreeSet<u32> = stored(&db, "telemetry").into_iter().collect();
    let want: BTreeSet<u32> = (0..100).chain(200..210).collect();
    assert_eq!(have, want);
    sqlite_verify(&db);
}

/// Runs the broker with `plan` in `SAGUIN_INJECT_FAULTS`, publishes until
/// the fault has failed the provider, and checks it stays failed (every
/// later publish refused, though the planned call was only one), is said
/// once in the log and by the gauge, and that a restart without the fault
/// finds every acknowledged record.
fn injected_fault_fails_the_provider(plan: &str, kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let volume = tempfile::tempdir().unwrap();
    let yaml = config(volume.path(), dir.path());
    let plan = plan.to_owned();
    let mut broker = Broker::start_with(dir, &yaml, |command| {
        command.env("SAGUIN_INJECT_FAULTS", &plan);
    });
    let rt = runtime();
    let answers = rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("p", ConnectOpts::clean()).await;
        let mut all = Answers::default();
        let mut next = 0;
        // Until the fault is met: the flusher's fsync runs beside the
        // publishes, so it is waited for by its effect, a refusal.
        while all.failed.is_empty() {
            assert!(next < 100_000, "the planned fault never failed a publish");
            let a = publish_each(&mut c, "telemetry/e", next..next + 10).await;
            all.acknowledged.extend(a.acknowledged);
            all.failed.extend(a.failed);
            next += 10;
        }
        let after = publish_each(&mut c, "telemetry/e", next..next + 20).await;
        assert!(
            after.acknowledged.is_empty(),
            "writes went on after the provider failed: {after:?}"
        );
        let other = publish_each(&mut c, "other/e", 0..5).await;
        assert_eq!(other.acknowledged.len(), 5);
        // A durable consumer's start is written to the failed provider
        // with its SUBSCRIBE: refused, and answered, never retried for
        // ever (the stop below would wait on it).
        let mut durable = Raw::tcp(broker.addr(), v5()).await;
        durable
            .connect("durable", ConnectOpts::persistent(3600))
            .await;
        let reasons = durable.subscribe(1, "telemetry/#", 1).await;
        assert_eq!(reasons.len(), 1);
        assert!(reasons[0].is_error(), "{reasons:?}");
        all
    });
    still_running(&mut broker);
    let line = broker.wait_log(|l| l.contains(FAILED));
    assert!(line.contains(&format!("kind={kind}")), "{line}");
    assert_eq!(log_lines_with(&broker, FAILED), 1, "{}", broker.log_text());
    assert!(line.contains("level=ERROR"), "{line}");
    let text = metrics_text(&broker);
    assert_eq!(
        metric_sample(&text, "saguin_provider_failed{provider=\"db\"}"),
        Some(1),
        "{text}"
    );
    let db = volume.path().join("saguin.db");
    // Not a clean stop: what the disk did not write may be gone.
    assert_eq!(broker.terminate(), Some(3), "{}", broker.log_text());
    assert!(
        broker.log_text().contains("failed while serving"),
        "{}",
        broker.log_text()
    );
    let mut broker = broker.restart(&yaml);
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let have: BTreeSet<u32> = stored(&db, "telemetry").into_iter().collect();
    let acknowledged: BTreeSet<u32> = answers.acknowledged.iter().copied().collect();
    assert!(
        acknowledged.is_subset(&have),
        "acknowledged but missing: {:?}",
        acknowledged.difference(&have).collect::<Vec<_>>()
    );
    // A publish refused is never stored.
    let refused: BTreeSet<u32> = answers.failed.iter().copied().collect();
    assert!(have.is_disjoint(&refused), "refused but stored");
    sqlite_verify(&db);
}

#[test]
fn a_failed_fsync_of_the_write_ahead_log_fails_the_provider_and_is_never_retried() {
    injected_fault_fails_the_provider("db:wal:sync:3:EIO", "fsync");
}

#[test]
fn an_io_error_writing_the_write_ahead_log_fails_the_provider() {
    // Past the writes that create the schema at the first start.
    injected_fault_fails_the_provider("db:wal:write:300:EIO", "io");
}

/// A database of `records` records of 2 KiB in channel `telemetry`, made
/// where the test's temp directories are (not on the volume).
fn source_database(dir: &Path, records: u32) -> PathBuf {
    let db = dir.join("source.db");
    let provider = SqliteProvider::open(SqliteOptions::new("source", &db)).unwrap();
    let store = append_store(&provider, "telemetry");
    for i in 0..records {
        store
            .append(saguin_format::model::Record::new("telemetry/x", payload(i)))
            .unwrap();
    }
    provider.close().unwrap();
    db
}

/// The file's CRC-32: what is compared to tell it was not touched.
fn digest(path: &Path) -> u32 {
    crc32fast::hash(&std::fs::read(path).unwrap())
}

/// What is in `dir`, by name.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Runs `saguin ARGS` expecting exit 3 with the destination named, and
/// nothing new left in `dest_dir` but `allowed`.
fn refused_for_space(args: &[&std::ffi::OsStr], dest: &Path, dest_dir: &Path, allowed: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "exit status; stderr: {stderr}");
    assert!(
        stderr.contains(&*dest.to_string_lossy()) || stderr.contains(&*dest_dir.to_string_lossy()),
        "the destination is not named: {stderr}"
    );
    assert!(
        stderr.to_lowercase().contains("space") || stderr.contains("full"),
        "the cause is not said: {stderr}"
    );
    let left: Vec<String> = names_in(dest_dir)
        .into_iter()
        .filter(|n| !allowed.contains(&n.as_str()))
        .collect();
    assert!(
        left.is_empty(),
        "left behind in {}: {left:?}; {stderr}",
        dest_dir.display()
    );
}

#[test]
fn sqlite_backup_onto_a_full_volume_exits_3_and_leaves_nothing() {
    let test = "sqlite_backup_onto_a_full_volume_exits_3_and_leaves_nothing";
    let Some(volume) = Volume::tmpfs(test, "1m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = source_database(dir.path(), 1000);
    let before = digest(&db);
    let dest = volume.path.join("backup.db");
    refused_for_space(
        &[
            "sqlite".as_ref(),
            "backup".as_ref(),
            db.as_os_str(),
            dest.as_os_str(),
        ],
        &dest,
        &volume.path,
        &[],
    );
    assert_eq!(digest(&db), before, "the source was touched");
    sqlite_verify(&db);
}

/// A destination whose file system has room for the copy's bytes but no
/// inode left for the files SQLite opens beside it is refused before a
/// page is written, saying so.
#[test]
fn sqlite_backup_onto_a_volume_without_inodes_for_its_files_is_refused_before_it_copies() {
    let test =
        "sqlite_backup_onto_a_volume_without_inodes_for_its_files_is_refused_before_it_copies";
    // Four inodes: the root directory and one file take two.
    let Some(volume) = Volume::tmpfs(test, "8m,nr_inodes=4") else {
        return;
    };
    std::fs::write(volume.path.join("other"), b"").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = source_database(dir.path(), 100);
    let stderr =
        backup_refused_before_it_copies(&db, &volume, "more files be made and the copy needs 4");
    assert_eq!(names_in(&volume.path), ["other"], "{stderr}");
}

/// `saguin sqlite backup` of `db` onto `volume`, refused before it copies
/// with exit 3 and words that say `why`: its stderr.
fn backup_refused_before_it_copies(db: &Path, volume: &Volume, why: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["sqlite", "backup"])
        .arg(db)
        .arg(volume.path.join("backup.db"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(why) && stderr.contains("nothing was written"),
        "{stderr}"
    );
    stderr
}

/// A destination whose file system has less free than the copy takes is
/// refused before a page is written, with what it has and what the copy
/// needs.
#[test]
fn sqlite_backup_onto_a_volume_without_room_for_it_is_refused_before_it_copies() {
    let test = "sqlite_backup_onto_a_volume_without_room_for_it_is_refused_before_it_copies";
    let Some(volume) = Volume::tmpfs(test, "4m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = source_database(dir.path(), 4000);
    assert!(std::fs::metadata(&db).unwrap().len() > 4 << 20);
    let stderr =
        backup_refused_before_it_copies(&db, &volume, "bytes of space free and the copy needs");
    assert!(names_in(&volume.path).is_empty(), "{stderr}");
}

#[test]
fn migrate_onto_a_full_volume_exits_3_and_leaves_nothing_that_looks_complete() {
    let test = "migrate_onto_a_full_volume_exits_3_and_leaves_nothing_that_looks_complete";
    let Some(volume) = Volume::tmpfs(test, "1m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = source_database(dir.path(), 1000);
    let before = digest(&db);
    // to-snapshots: a directory, onto the full volume.
    let snapshots = volume.path.join("snapshots");
    refused_for_space(
        &[
            "migrate".as_ref(),
            "to-snapshots".as_ref(),
            db.as_os_str(),
            snapshots.as_os_str(),
        ],
        &snapshots,
        &volume.path,
        // Taking the destination's lock creates its lock file.
        &["saguin.lock"],
    );
    assert_eq!(digest(&db), before, "the source was touched");
    // to-sqlite: a database, onto the full volume, from snapshots made
    // where there is room.
    let made = dir.path().join("snapshots");
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["migrate", "to-snapshots"])
        .arg(&db)
        .arg(&made)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Taking the source's lock creates its lock file, the one thing a
    // migration creates beside its source: every other file is compared.
    let files = |dir: &Path| {
        names_in(dir)
            .into_iter()
            .filter(|n| n != "saguin.lock")
            .map(|n| (digest(&dir.join(&n)), n))
            .collect::<Vec<_>>()
    };
    let before = files(&made);
    let dest = volume.path.join("migrated.db");
    refused_for_space(
        &[
            "migrate".as_ref(),
            "to-sqlite".as_ref(),
            made.as_os_str(),
            dest.as_os_str(),
        ],
        &dest,
        &volume.path,
        &["saguin.lock", "migrated.db.lock"],
    );
    let after = files(&made);
    assert_eq!(after, before, "the source directory was touched");
}

#[test]
fn latest_and_queue_channels_retained_messages_and_the_broadcast_log_refuse_with_0x83_while_full() {
    let test = "latest_and_queue_channels_retained_messages_and_the_broadcast_log_refuse_with_0x83_while_full";
    let Some(volume) = Volume::tmpfs(test, "8m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Everything on the one sqlite provider: sessions, the broadcast log,
    // retained messages, a latest and a queue channel.
    let yaml = format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         channels:\n  - name: devices\n    kind: latest\n    storage: db\n\
         \x20 - name: jobs\n    kind: queue\n    storage: db\n\
         broker:\n  session_storage: db\n  retained_storage: db\n",
        volume.path.join("saguin.db").display()
    );
    let mut broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        // A persistent subscriber, so a broadcast publish is owed to it
        // through the log.
        let mut sub = Raw::tcp(broker.addr(), v5()).await;
        sub.connect("sub", ConnectOpts::persistent(3600)).await;
        sub.subscribe(1, "plain/#", 1).await;
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("p", ConnectOpts::clean()).await;
        for topic in ["devices/a", "jobs/a", "plain/a"] {
            let stored = publish_each(&mut c, topic, 0..3).await;
            assert_eq!(stored.acknowledged.len(), 3, "{topic}: {stored:?}");
        }
        volume.fill("ballast");
        // Enough to outgrow what the write-ahead log had room for.
        for topic in ["devices/b", "jobs/b", "plain/b"] {
            let answers = publish_until_refused(&mut c, topic, 0).await;
            assert!(
                !answers.failed.is_empty(),
                "{topic}: nothing refused on a full disk"
            );
        }
        // Retained, on the same provider.
        c.publish("plain/retained", &payload(1), 1, true, 999).await;
        match c.recv().await {
            Some(Packet::PubAck(a)) => {
                assert_eq!(a.reason, ReasonCode::ImplementationSpecificError)
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_file(volume.path.join("ballast")).unwrap();
        for topic in ["devices/c", "jobs/c", "plain/c"] {
            let stored = publish_each(&mut c, topic, 0..5).await;
            assert_eq!(
                stored.acknowledged.len(),
                5,
                "{topic} after space returned: {stored:?}"
            );
        }
    });
    still_running(&mut broker);
    // The line reaches this test through the broker's standard error, which
    // a busy machine may deliver after the refusals it explains.
    broker.wait_log(|l| l.contains(NO_SPACE));
    assert_eq!(
        log_lines_with(&broker, NO_SPACE),
        1,
        "{}",
        broker.log_text()
    );
}

/// `saguin serve` on `yaml` that must not start: its exit code and what it
/// wrote, the wait bounded (a broker that starts after all is killed).
fn serve_refused(dir: &Path, yaml: &str) -> (Option<i32>, String) {
    let config = dir.join("refused.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // The child's stderr closes when it exits: the reader says so, and the
    // wait is on that, bounded.
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        let _ = done_tx.send(text);
    });
    match done.recv_timeout(WAIT) {
        Ok(text) => (child.wait().unwrap().code(), text),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            (None, done.recv().unwrap_or_default())
        }
    }
}

#[test]
fn a_sqlite_provider_on_a_full_disk_stops_the_start_naming_the_lack_of_room_and_loses_nothing() {
    let test =
        "a_sqlite_provider_on_a_full_disk_stops_the_start_naming_the_lack_of_room_and_loses_nothing";
    let Some(volume) = Volume::tmpfs(test, "8m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&volume.path, dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let before = publish_as(&rt, &broker, "before", "telemetry/a", 0..20);
    assert_eq!(before.acknowledged.len(), 20, "{before:?}");
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let db = volume.path.join("saguin.db");
    let bytes_before = digest(&db);

    // The disk fills while the broker is down: opening the database writes
    // its write-ahead log's index, so the start stops, naming why.
    let ballast = volume.fill("ballast");
    let (code, text) = serve_refused(broker.dir.path(), &yaml);
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.contains(&format!("storage {}", db.display()))
            && text.contains("no space left on its file system"),
        "{text}"
    );
    assert_eq!(
        digest(&db),
        bytes_before,
        "the refused start changed the database"
    );

    // Room again: the next start serves every record, and takes more.
    std::fs::remove_file(&ballast).unwrap();
    let mut broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("after", ConnectOpts::clean()).await;
        let after = publish_each(&mut c, "telemetry/b", 100..110).await;
        assert_eq!(after.acknowledged.len(), 10, "{after:?}");
    });
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let have: Vec<u32> = stored(&db, "telemetry");
    assert_eq!(have, (0..20).chain(100..110).collect::<Vec<_>>());
    sqlite_verify(&db);
}

/// Fills `volume` with a ballast file of its own and gives `bytes` of it
/// back: the file system has that much left.
fn fill_leaving(volume: &Volume, bytes: u64) -> PathBuf {
    let ballast = volume.fill("ballast");
    let filled = std::fs::metadata(&ballast).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ballast)
        .unwrap()
        .set_len(filled - bytes)
        .unwrap();
    ballast
}

/// A sqlite provider `db` on `volume` keeping an 8 MiB checkpoint's room
/// and `channel`; metrics served.
fn room_config(volume: &Volume, channel: &str) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n    checkpoint_room: 8MiB\n\
         channels:\n  - {channel}\n",
        volume.path.join("saguin.db").display()
    )
}

/// Until `done` holds of `provider`, woken each time its flusher moves
/// the room or the ceiling (bounded).
fn wait_for_room_of(provider: &SqliteProvider, what: &str, done: impl Fn(&SqliteProvider) -> bool) {
    assert!(provider.wait_for_room(WAIT * 6, done), "never: {what}");
}

/// Appends records of `payload(i)` for `i` from `first`, at most `count`,
/// until one is refused: each stored index with its offset, and the
/// refusal.
fn append_until_refused(
    store: &Arc<dyn AppendStore>,
    first: u32,
    count: u32,
) -> (
    Vec<(u32, u64)>,
    Option<saguin::storage::contract::StorageError>,
) {
    let mut stored = Vec::new();
    for i in first..first + count {
        let record = saguin_format::model::Record::new("telemetry/x", payload(i));
        match store.append(record) {
            Ok(r) => stored.push((i, r.offset)),
            Err(e) => return (stored, Some(e)),
        }
    }
    (stored, None)
}

#[test]
fn a_log_that_took_the_last_of_the_disk_is_copied_into_the_room_and_removals_make_room_again() {
    let test =
        "a_log_that_took_the_last_of_the_disk_is_copied_into_the_room_and_removals_make_room_again";
    if let Some(volume) = Volume::tmpfs(test, "24m") {
        the_room_takes_a_log_that_filled(volume);
    }
}

/// ext4 gives blocks a truncate freed back only once its journal commits
/// (forcing the commit when an allocation finds none), and allocates a
/// file's blocks as unwritten extents.
#[test]
fn on_ext4_a_log_that_took_the_last_of_the_disk_is_copied_into_the_room() {
    let test = "on_ext4_a_log_that_took_the_last_of_the_disk_is_copied_into_the_room";
    if let Some(volume) = Volume::ext4(test, 32) {
        the_room_takes_a_log_that_filled(volume);
    }
}

/// On `volume`: a log that takes the last of the file system is copied
/// into part of the room; retention then makes room that publishes take;
/// a restart while still full starts held; room made lifts the ceiling;
/// a restart after the room fits again is not held; every record
/// acknowledged is there and no other.
fn the_room_takes_a_log_that_filled(volume: Volume) {
    use saguin::storage::contract::FaultKind;
    const ROOM: u64 = 8 << 20;
    let db = volume.path.join("saguin.db");
    let provider = open_with_room(&db, ROOM);
    let store = append_store(&provider, "telemetry");
    wait_for_room_of(&provider, "the room taken", |p| {
        p.checkpoint_room_held() == ROOM
    });
    assert!(
        std::fs::metadata(volume.path.join("saguin.db-room"))
            .unwrap()
            .len()
            == ROOM
    );

    // The rest of the file system taken by something else; the log takes
    // the last of it faster than a checkpoint copies it.
    let ballast = fill_leaving(&volume, 3 << 20);
    let (mut kept, refused) = append_until_refused(&store, 0, 5000);
    let refused = refused.expect("5,000 records of 2 KiB never filled the volume");
    assert_eq!(refused.kind(), FaultKind::NoSpace, "{refused}");
    assert!(!kept.is_empty());

    // The checkpoint that finds no room is given the room: the provider
    // is held to what it holds.
    wait_for_room_of(&provider, "the room given up", |p| {
        p.held_to_disk().is_some() && p.checkpoint_room_held() < ROOM
    });
    // As much as the log needed: the rest is kept for the next time, the
    // part given punched out of the file, its length kept.
    let left = provider.checkpoint_room_held();
    assert!(left > 0, "the whole room given to a log of a few MiB");
    let room = std::fs::metadata(volume.path.join("saguin.db-room")).unwrap();
    assert_eq!(room.len(), ROOM);
    assert!(std::os::unix::fs::MetadataExt::blocks(&room) * 512 <= left + (64 << 10));

    // Retention commits, and publishes are taken into the pages it freed:
    // without the room, both were refused until room was made beside it.
    let removed = store.trim(store.next() - 100, None).unwrap();
    assert!(removed.records > 0);
    let trimmed_below = store.floor();
    let (after_trim, refused) = append_until_refused(&store, 10_000, 2000);
    assert!(
        !after_trim.is_empty(),
        "nothing taken into the pages retention freed"
    );
    // Beyond them, refused for want of room (0x83), not the configured bound.
    let refused = refused.expect("the provider grew past what it held");
    assert_eq!(refused.kind(), FaultKind::NoSpace, "{refused}");
    assert_eq!(
        refused.mqtt_reason_code(),
        saguin::storage::contract::REASON_WRITE_FAILED
    );
    kept.extend(&after_trim);

    // A restart while the room is given up and the file system still full
    // starts held to what it holds: the room's file says so. (The close
    // removed the log; the file system is filled again. The open, finding
    // no room for the log's index, is given a part of what is left.)
    provider.close().unwrap();
    drop(store);
    let refill = volume.fill("refill");
    let provider = open_with_room(&db, ROOM);
    assert!(provider.held_to_disk().is_some());
    let store = append_store(&provider, "telemetry");
    let (while_held, refused) = append_until_refused(&store, 15_000, 2000);
    let refused = refused.expect("a restart lifted the ceiling on a full disk");
    assert_eq!(refused.kind(), FaultKind::NoSpace, "{refused}");
    kept.extend(&while_held);

    // Room made beside it: the room is taken back and the ceiling lifted.
    std::fs::remove_file(&ballast).unwrap();
    std::fs::remove_file(&refill).unwrap();
    wait_for_room_of(&provider, "the room taken back", |p| {
        p.checkpoint_room_held() == ROOM && p.held_to_disk().is_none()
    });

    // Given up again (a hole where half of it was), and room made while it
    // is down: the next open takes it back, not held for a moment.
    let room = std::fs::OpenOptions::new()
        .write(true)
        .open(volume.path.join("saguin.db-room"))
        .unwrap();
    // SAFETY: `room` is open for the call, which touches no memory of ours.
    let punched = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&room),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            (ROOM / 2) as libc::off_t,
            (ROOM / 2) as libc::off_t,
        )
    };
    assert_eq!(punched, 0, "{}", std::io::Error::last_os_error());
    drop(room);
    provider.close().unwrap();
    drop(store);
    let provider = open_with_room(&db, ROOM);
    assert_eq!(provider.held_to_disk(), None);
    assert_eq!(provider.checkpoint_room_held(), ROOM);
    let store = append_store(&provider, "telemetry");
    let (after_freeing, refused) = append_until_refused(&store, 20_000, 200);
    assert!(refused.is_none(), "{refused:?}");
    kept.extend(&after_freeing);
    provider.close().unwrap();

    // Every record stored is there, and no refused one.
    let want: Vec<u32> = kept
        .iter()
        .filter(|(_, offset)| *offset >= trimmed_below)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(stored(&db, "telemetry"), want);
    sqlite_verify(&db);
}

/// Another process's reader, in a read transaction, as a backup's is:
/// the write-ahead log's frames after it began cannot be copied into the
/// database while it lasts.
fn log_reader(db: &Path) -> rusqlite::Connection {
    let reader =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    reader
}

/// What the write-ahead log adds beyond the database's file: what the
/// checkpoint after a reader grows it by.
fn log_beyond_database(db: &Path) -> u64 {
    let probe =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let pages: u64 = probe
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    let page_size: u64 = probe
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    (pages * page_size).saturating_sub(std::fs::metadata(db).unwrap().len())
}

/// The checkpoint's room of the reader tests.
const ROOM: u64 = 8 << 20;

/// What [`kept_by_a_reader`] leaves: the provider, its channel, the
/// reader, and the records stored.
type KeptByAReader = (
    SqliteProvider,
    Arc<dyn AppendStore>,
    rusqlite::Connection,
    Vec<(u32, u64)>,
);

/// A provider at `db` with a room of [`ROOM`], another process's reader
/// in its log, and records past a quarter of the room (1,536 of 2 KiB, a
/// page each) that the reader keeps the next checkpoint from copying.
fn kept_by_a_reader(db: &Path) -> KeptByAReader {
    let provider = open_with_room(db, ROOM);
    let store = append_store(&provider, "telemetry");
    wait_for_room_of(&provider, "the room taken", |p| {
        p.checkpoint_room_held() == ROOM
    });
    let reader = log_reader(db);
    let (kept, refused) = append_until_refused(&store, 0, 1536);
    assert!(refused.is_none(), "{refused:?}");
    assert!(log_beyond_database(db) > ROOM / 4);
    (provider, store, reader, kept)
}

/// A reader of another process keeps the write-ahead log from being
/// copied into the database: the checkpoint's room grows with what the
/// log adds beyond the database's file, so the checkpoint after the reader
/// fits into it however full the file system is by then, and publishes go
/// on while the file system has the room free. Once the log is copied the
/// room is cut back. Everything acknowledged is stored.
#[test]
fn a_reader_that_keeps_the_log_from_being_copied_grows_the_room_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let (provider, store, reader, mut kept) = kept_by_a_reader(&db);
    wait_for_room_of(&provider, "the room grown", |p| {
        p.held_to_log().is_some() && p.checkpoint_room_held() >= log_beyond_database(&db) + ROOM
    });
    // Twice the configured room more, half of it between two turns of the
    // flusher: the room keeps growing ahead of it.
    for first in [10_000, 20_000, 30_000, 40_000] {
        let (more, refused) = append_until_refused(&store, first, 1024);
        assert!(refused.is_none(), "{refused:?}");
        kept.extend(&more);
        wait_for_room_of(&provider, "the room ahead of the log", |p| {
            p.checkpoint_room_held() >= log_beyond_database(&db) + ROOM
        });
    }
    assert_eq!(provider.held_to_disk(), None, "the file system is not full");

    // The reader ends: the log is copied, the room cut back, the provider
    // let go.
    drop(reader);
    wait_for_room_of(&provider, "let go", |p| {
        p.held_to_log().is_none() && p.checkpoint_room_held() == ROOM
    });
    assert_eq!(
        std::fs::metadata(dir.path().join("saguin.db-room"))
            .unwrap()
            .len(),
        ROOM,
        "cut back to the configured room"
    );
    let (after, refused) = append_until_refused(&store, 50_000, 100);
    assert!(refused.is_none(), "{refused:?}");
    kept.extend(&after);
    provider.close().unwrap();
    drop(store);
    let want: Vec<u32> = kept.iter().map(|(i, _)| *i).collect();
    assert_eq!(stored(&db, "telemetry"), want);
    sqlite_verify(&db);
}

/// Through the broker: while another process reads its database, the
/// room grows with what publishes add beyond it, as the gauge shows,
/// nothing is refused, and the room is cut back once the reader ends.
#[test]
fn a_broker_whose_database_another_process_reads_grows_its_room_and_refuses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("saguin.db");
    let yaml = format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n    checkpoint_room: 8MiB\n\
         channels:\n  - {{name: telemetry, kind: append, storage: db}}\n",
        db.display()
    );
    let broker = Broker::start_in(dir, &yaml);
    broker.wait_log(|l| l.contains(ROOM_KEPT));
    let reader = log_reader(&db);
    let rt = runtime();
    let mut p = rt.block_on(async {
        let mut p = Raw::tcp(broker.addr(), v5()).await;
        p.connect("producer", ConnectOpts::clean()).await;
        p
    });
    // Past a quarter of the room's 16 MiB floor (1,536 publishes of 2 KiB,
    // a page each), less than it is kept ahead by once it grows.
    let before = rt.block_on(publish_each(&mut p, "telemetry/x", 0..1536));
    assert!(before.failed.is_empty(), "{before:?}");
    broker.wait_log(|l| l.contains("the checkpoint's room grows with what the log adds"));
    let sample = "saguin_provider_checkpoint_room_bytes{provider=\"db\"}";
    let grown = wait_metric_where(&broker, sample, |bytes| bytes > ROOM_8_MIB);
    assert!(grown >= log_beyond_database(&db) + ROOM_8_MIB, "{grown}");
    assert_eq!(metric_sample(&metrics_text(&broker), HELD), Some(0));
    let during = rt.block_on(publish_each(&mut p, "telemetry/x", 10_000..10_100));
    assert!(during.failed.is_empty(), "{during:?}");

    drop(reader);
    broker.wait_log(|l| l.contains("the write-ahead log is copied into the database again"));
    assert_eq!(room_bytes(&broker), ROOM_8_MIB);
    let after = rt.block_on(publish_each(&mut p, "telemetry/x", 20_000..20_100));
    assert!(after.failed.is_empty(), "{after:?}");
}

/// On a file system too small for the room to keep growing, the provider
/// is held to what the room covers: publishes beyond are refused for want
/// of room (0x83), and the checkpoint after the reader is copied into the
/// room even with the file system full, where without it the log could
/// never be copied again. Everything acknowledged is stored.
#[test]
fn a_reader_that_keeps_the_log_from_being_copied_holds_the_provider_to_its_room() {
    let test = "a_reader_that_keeps_the_log_from_being_copied_holds_the_provider_to_its_room";
    // Room for the log's own frames: each append writes three or four.
    let Some(volume) = Volume::tmpfs(test, "64m") else {
        return;
    };
    use saguin::storage::contract::FaultKind;
    let db = volume.path.join("saguin.db");
    let (provider, store, reader, mut kept) = kept_by_a_reader(&db);
    wait_for_room_of(&provider, "held to the room", |p| p.held_to_log().is_some());

    // Something else takes the rest of the file system: the room cannot
    // grow, and publishes are refused where it no longer covers them (or
    // where the log finds the file system full).
    let ballast = fill_leaving(&volume, 1 << 20);
    let (more, refused) = append_until_refused(&store, 10_000, 20_000);
    let refused = refused.expect("the provider grew past its room on a full file system");
    assert_eq!(refused.kind(), FaultKind::NoSpace, "{refused}");
    kept.extend(&more);
    let beyond = log_beyond_database(&db);
    assert!(
        beyond <= provider.checkpoint_room_held(),
        "the log adds {beyond} B beyond the database, more than the room"
    );

    // The reader ends with the file system full: the log is copied into
    // the room, and removals go on.
    drop(reader);
    wait_for_room_of(&provider, "the log copied", |p| p.held_to_log().is_none());
    assert_eq!(
        std::fs::metadata(volume.path.join("saguin.db-room"))
            .unwrap()
            .len(),
        ROOM,
        "the grown room cut back to the configured one"
    );
    let removed = store.trim(store.next() - 100, None).unwrap();
    assert!(removed.records > 0);
    let trimmed_below = store.floor();
    provider.close().unwrap();
    drop(store);
    std::fs::remove_file(&ballast).unwrap();
    let want: Vec<u32> = kept
        .iter()
        .filter(|(_, offset)| *offset >= trimmed_below)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(stored(&db, "telemetry"), want);
    sqlite_verify(&db);
}

/// The broker's `saguin_provider_checkpoint_room_bytes` for `db`.
fn room_bytes(broker: &Broker) -> u64 {
    let sample = "saguin_provider_checkpoint_room_bytes{provider=\"db\"}";
    metric_sample(&metrics_text(broker), sample).expect(sample)
}

/// The room taken at the start (logged once it is).
const ROOM_KEPT: &str = "msg=\"the checkpoint's room is kept\"";
/// The room taken back, the ceiling lifted.
const ROOM_KEPT_AGAIN: &str = "the checkpoint's room is kept again";

const ROOM_8_MIB: u64 = 8 << 20;
const HELD: &str = "saguin_provider_held_to_disk{provider=\"db\"}";

/// A worker on `jobs/#` with a window of `window`.
async fn worker(addr: std::net::SocketAddr, id: &str, window: u16) -> Raw<tokio::net::TcpStream> {
    let mut c = worker_connect(addr, id, window).await;
    assert_eq!(
        c.subscribe(1, "jobs/#", 1).await,
        vec![ReasonCode::GrantedQoS1]
    );
    c
}

/// Takes `count` jobs from `c`, finishing each: their publish indexes.
async fn finish_jobs(c: &mut Raw<tokio::net::TcpStream>, count: usize) -> Vec<u32> {
    let mut done = Vec::new();
    while done.len() < count {
        let m = c.next_publish(false).await;
        done.push(index_of(&m.payload));
        c.ack_publish(&m).await;
    }
    done
}

#[test]
fn a_queue_on_a_disk_its_log_filled_takes_publishes_again_as_workers_finish_jobs() {
    let test = "a_queue_on_a_disk_its_log_filled_takes_publishes_again_as_workers_finish_jobs";
    let Some(volume) = Volume::tmpfs(test, "24m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = room_config(&volume, "{name: jobs, kind: queue, storage: db}");
    let mut broker = Broker::start_in(dir, &yaml);
    broker.wait_log(|l| l.contains(ROOM_KEPT));
    assert_eq!(room_bytes(&broker), ROOM_8_MIB);
    let ballast = fill_leaving(&volume, 3 << 20);
    let addr = broker.addr();
    let rt = runtime();
    let mut acknowledged = BTreeSet::new();
    let mut finished = BTreeSet::new();
    rt.block_on(async {
        let mut p = Raw::tcp(addr, v5()).await;
        p.connect("producer", ConnectOpts::clean()).await;
        // Jobs until the log has taken the last of the file system.
        let filling = publish_until_refused(&mut p, "jobs/a", 0).await;
        assert!(
            !filling.failed.is_empty(),
            "2,000 jobs of 2 KiB never filled the volume"
        );
        acknowledged.extend(filling.acknowledged);
        assert!(!acknowledged.is_empty());
        // The checkpoint that found no room was given the room.
        broker.wait_log(|l| l.contains("gave up the checkpoint's room to copy"));
        assert!(room_bytes(&broker) < ROOM_8_MIB);
        assert_eq!(metric_sample(&metrics_text(&broker), HELD), Some(1));
        let doc = status_json(&broker);
        let db = doc["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "db")
            .unwrap();
        assert_eq!(db["held_to_disk"], true, "{doc}");

        // Workers finish jobs; the removals commit, and publishes are taken
        // into the pages they freed.
        const DEPTH: &str = "saguin_queue_depth{channel=\"jobs\"}";
        let depth = metric_sample(&metrics_text(&broker), DEPTH).expect("the queue's depth");
        let mut w = worker(addr, "worker", 10).await;
        finished.extend(finish_jobs(&mut w, 60).await);
        wait_metric_where(&broker, DEPTH, |now| now + 60 <= depth);
        let after = publish_each(&mut p, "jobs/b", 10_000..10_030).await;
        assert_eq!(after.acknowledged.len(), 30, "{after:?}");
        acknowledged.extend(after.acknowledged);
        // Beyond what it holds, refused for want of room: 0x83.
        let more = publish_until_refused(&mut p, "jobs/c", 20_000).await;
        assert!(
            !more.failed.is_empty(),
            "the provider grew past what it held"
        );
        acknowledged.extend(more.acknowledged);

        // Room made beside it: the room is taken back, the ceiling lifted.
        std::fs::remove_file(&ballast).unwrap();
        broker.wait_log(|l| l.contains(ROOM_KEPT_AGAIN));
        assert_eq!(room_bytes(&broker), ROOM_8_MIB);
        assert_eq!(metric_sample(&metrics_text(&broker), HELD), Some(0));
        let freed = publish_each(&mut p, "jobs/d", 30_000..30_100).await;
        assert_eq!(freed.acknowledged.len(), 100, "{freed:?}");
        acknowledged.extend(freed.acknowledged);
    });
    still_running(&mut broker);

    // kill -9 and a restart: every job acknowledged and not finished is
    // handed out, and none refused.
    let broker = broker.restart(&yaml);
    let room = "saguin_provider_checkpoint_room_bytes{provider=\"db\"}";
    assert_eq!(
        metric_sample(&metrics_text(&broker), room),
        Some(ROOM_8_MIB),
        "a room left whole reads whole from the start"
    );
    let want: BTreeSet<u32> = acknowledged.difference(&finished).copied().collect();
    let got: BTreeSet<u32> = rt.block_on(async {
        let mut w = worker(broker.addr(), "worker-after", 100).await;
        finish_jobs(&mut w, want.len()).await.into_iter().collect()
    });
    assert_eq!(got, want);
}

#[test]
fn a_broker_restarted_on_a_disk_that_filled_while_it_was_down_gives_up_the_room_and_serves_what_it_holds(
) {
    let test = "a_broker_restarted_on_a_disk_that_filled_while_it_was_down_gives_up_the_room_and_serves_what_it_holds";
    let Some(volume) = Volume::tmpfs(test, "24m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = volume.path.join("saguin.db");
    let yaml = room_config(&volume, "{name: telemetry, kind: append, storage: db}");
    let mut broker = Broker::start_in(dir, &yaml);
    broker.wait_log(|l| l.contains(ROOM_KEPT));
    assert_eq!(room_bytes(&broker), ROOM_8_MIB);
    let rt = runtime();
    let before = publish_as(&rt, &broker, "before", "telemetry/a", 0..20);
    assert_eq!(before.acknowledged.len(), 20, "{before:?}");
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());

    // The disk fills while the broker is down. Opening the database needs
    // room for its write-ahead log's index: the room is given up for it.
    let ballast = volume.fill("ballast");
    let mut broker = broker.restart(&yaml);
    broker.wait_log(|l| l.contains("gave up the checkpoint's room to open it"));
    assert!(room_bytes(&broker) < ROOM_8_MIB);
    let taken_while_full = rt.block_on(async {
        // What it holds is served.
        let mut c = consumer_from_earliest(broker.addr(), "telemetry/#").await;
        let mut got = Vec::new();
        while got.len() < 20 {
            let m = c.next_publish(true).await;
            got.push(index_of(&m.payload));
        }
        assert_eq!(got, (0..20).collect::<Vec<_>>());
        // Beyond what it holds, refused for want of room.
        let mut p = Raw::tcp(broker.addr(), v5()).await;
        p.connect("producer", ConnectOpts::clean()).await;
        let refused = publish_each(&mut p, "telemetry/b", 50..60).await;
        assert!(!refused.failed.is_empty(), "{refused:?}");
        refused.acknowledged
    });
    still_running(&mut broker);

    // Room made: the room is taken back and publishes are taken again.
    std::fs::remove_file(&ballast).unwrap();
    broker.wait_log(|l| l.contains(ROOM_KEPT_AGAIN));
    assert_eq!(room_bytes(&broker), ROOM_8_MIB);
    let after = publish_as(&rt, &broker, "after", "telemetry/c", 100..110);
    assert_eq!(after.acknowledged.len(), 10, "{after:?}");
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let have: Vec<u32> = stored(&db, "telemetry");
    let want: Vec<u32> = (0..20).chain(taken_while_full).chain(100..110).collect();
    assert_eq!(have, want);
    sqlite_verify(&db);
}

#[test]
fn a_provider_whose_file_system_cannot_hold_its_bound_says_so_at_the_start() {
    let test = "a_provider_whose_file_system_cannot_hold_its_bound_says_so_at_the_start";
    let Some(volume) = Volume::tmpfs(test, "24m") else {
        return;
    };
    const SHORT: &str =
        "the file system under the storage provider is smaller than what it may take";
    // 16 MiB of bound, 8 MiB of room and the log's 72 MiB on 24 MiB.
    let dir = tempfile::tempdir().unwrap();
    let yaml = room_config(&volume, "{name: telemetry, kind: append, storage: db}").replace(
        "checkpoint_room: 8MiB",
        "checkpoint_room: 8MiB\n    max_bytes: 16MiB",
    );
    let mut broker = Broker::start_in(dir, &yaml);
    let line = broker.wait_log(|l| l.contains(SHORT));
    for figure in [
        "needs_bytes=",
        "free_bytes=",
        "max_bytes=16777216",
        "checkpoint_room=8388608",
    ] {
        assert!(line.contains(figure), "{line}");
    }
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());

    // The same provider on a file system that holds it all: no such line.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let yaml = yaml.replace(
        &volume.path.join("saguin.db").display().to_string(),
        &db.display().to_string(),
    );
    let mut broker = Broker::start_in(dir, &yaml);
    // Listeners bind once every provider has opened, and checked.
    broker.wait_log(|l| l.contains("msg=\"listening\""));
    assert_eq!(log_lines_with(&broker, SHORT), 0, "{}", broker.log_text());
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
}

/// Every record of `telemetry` from the earliest, read by a consumer
/// through the broker until `count` came: their publish indexes.
async fn read_from_earliest(addr: std::net::SocketAddr, count: usize) -> Vec<u32> {
    let mut c = consumer_from_earliest(addr, "telemetry/#").await;
    let mut got = Vec::new();
    while got.len() < count {
        got.push(index_of(&c.next_publish(true).await.payload));
    }
    got
}

/// A memory provider `mem` keeping `telemetry` in a snapshot directory on
/// `volume` with a 2 MiB room, its generations written as `schedule` says.
fn memory_room_config(volume: &Volume, schedule: &str) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - {{name: mem, kind: memory, snapshot_dir: {}, snapshot_room: 2MiB, {schedule}}}\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: mem\n",
        volume.path.join("snapshots").display()
    )
}

#[test]
fn a_memory_provider_whose_disk_fills_writes_its_next_generation_into_the_snapshot_room() {
    let test =
        "a_memory_provider_whose_disk_fills_writes_its_next_generation_into_the_snapshot_room";
    let Some(volume) = Volume::tmpfs(test, "16m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_room_config(
        &volume,
        "snapshot_debounce: 20ms, snapshot_max_delay: 100ms",
    );
    const ROOM: u64 = 2 << 20;
    let room = "saguin_snapshot_room_bytes{provider=\"mem\"}";
    let failures = "saguin_snapshot_failures_total{provider=\"mem\"}";
    let room_file = volume.path.join("snapshots").join("saguin.room");
    let allocated =
        || std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&room_file).unwrap()) * 512;
    // Each generation committed is logged (DEBUG) with the moment it holds.
    let broker = Broker::start_with(dir, &yaml, |c| {
        c.env("RUST_LOG", "info,saguin::broker::snapshots=debug");
    });
    let rt = runtime();
    let publish = |broker: &Broker, ids: std::ops::Range<u32>| {
        publish_as(&rt, broker, "p", "telemetry/a", ids)
    };
    let first = publish(&broker, 0..20);
    assert_eq!(first.acknowledged.len(), 20);
    // The room is taken after the first generation.
    broker.wait_log(|l| l.contains("msg=\"the snapshot room is kept\""));
    assert!(allocated() >= ROOM);

    // The file system fills; the next generation's channel file finds no
    // room, and the room is given up to the one after it.
    let ballast = volume.fill("ballast");
    let during = publish(&broker, 20..220);
    assert_eq!(
        during.acknowledged.len(),
        200,
        "a memory provider takes them"
    );
    let acknowledged_by = saguin::storage::contract::now_nanos();
    broker.wait_log(|l| l.contains("gave up the snapshot room"));
    // A generation holding every change: one captured after the last
    // acknowledgement. Its failures and its room are counted before it is
    // logged.
    broker.wait_log(|l| {
        l.contains("snapshot generation committed")
            && field(l, "captured_at")
                .and_then(|at| at.parse::<i64>().ok())
                .is_some_and(|at| at >= acknowledged_by)
    });
    let text = metrics_text(&broker);
    assert!(
        metric_sample(&text, failures).is_some_and(|n| n >= 1),
        "{text}"
    );
    assert!(
        metric_sample(&text, room).is_some_and(|b| b < ROOM),
        "{text}"
    );

    // kill -9: what was acknowledged after the disk filled is in the last
    // generation.
    let mut broker = broker.restart(&yaml);
    let got = rt.block_on(read_from_earliest(broker.addr(), 220));
    assert_eq!(got, (0..220).collect::<Vec<_>>());

    // Room made: the room is taken back after the next generation.
    std::fs::remove_file(&ballast).unwrap();
    let after = publish(&broker, 300..301);
    assert_eq!(after.acknowledged.len(), 1);
    broker.wait_log(|l| l.contains("the snapshot room is kept again"));
    assert!(allocated() >= ROOM);
    still_running(&mut broker);
}

#[test]
fn a_stop_on_a_full_disk_writes_its_last_generation_into_the_snapshot_room() {
    let test = "a_stop_on_a_full_disk_writes_its_last_generation_into_the_snapshot_room";
    let Some(volume) = Volume::tmpfs(test, "16m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let snapshots = volume.path.join("snapshots");
    // Written at the stop only.
    let yaml = memory_room_config(&volume, "snapshot_debounce: none, snapshot_max_delay: none");
    let rt = runtime();
    let publish = |broker: &Broker, ids: std::ops::Range<u32>| {
        publish_as(&rt, broker, "p", "telemetry/a", ids)
    };
    let mut broker = Broker::start_in(dir, &yaml);
    assert_eq!(publish(&broker, 0..20).acknowledged.len(), 20);
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    // The room is taken after the first generation, the stop's.
    let room = snapshots.join("saguin.room");
    assert_eq!(std::fs::metadata(&room).unwrap().len(), 2 << 20);

    let mut broker = broker.restart(&yaml);
    assert_eq!(publish(&broker, 20..220).acknowledged.len(), 200);
    volume.fill("ballast");
    // The stop's generation finds no room, gives the room up and writes
    // into it: a clean stop, nothing lost.
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    assert_eq!(
        log_lines_with(&broker, "writing again into the snapshot room"),
        1,
        "{}",
        broker.log_text()
    );

    let broker = broker.restart(&yaml);
    let got = rt.block_on(read_from_earliest(broker.addr(), 220));
    assert_eq!(got, (0..220).collect::<Vec<_>>());
}

/// A destination whose file system runs out of inodes while the copy is
/// made (another process takes the last ones after the check) fails the
/// copy naming the destination and what it lacks, and leaves nothing.
#[test]
fn sqlite_backup_whose_destination_runs_out_of_inodes_while_it_copies_says_so() {
    let test = "sqlite_backup_whose_destination_runs_out_of_inodes_while_it_copies_says_so";
    let Some(volume) = Volume::tmpfs(test, "32m,nr_inodes=6") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = source_database(dir.path(), 4000);
    let dest = volume.path.join("backup.db");
    let taken = std::cell::Cell::new(0);
    let take_the_rest = |_done: u64, _all: u64| {
        // After the first step: every inode left goes to another file.
        while std::fs::write(volume.path.join(format!("other-{}", taken.get())), b"").is_ok() {
            taken.set(taken.get() + 1);
        }
    };
    let err = saguin::storage::backup::backup(&db, &dest, &take_the_rest).unwrap_err();
    let said = err.to_string();
    assert!(taken.get() > 0, "nothing was taken: {said}");
    assert!(said.contains(&dest.display().to_string()), "{said}");
    assert!(said.contains("more files be made"), "{said}");
    let left: Vec<String> = names_in(&volume.path)
        .into_iter()
        .filter(|n| !n.starts_with("other-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
