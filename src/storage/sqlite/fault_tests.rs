//! Each point where the disk can fail a sqlite provider, made to fail by
//! the VFS wrapper's plan ([`vfs::Faults`]): what the provider answers,
//! and what its health becomes. The file systems that fail for real (a
//! full tmpfs, an ext4 remounted read-only) are `tests/disk_faults.rs`.

use std::time::{Duration, Instant};

use saguin_format::model::Record;

use super::vfs::{FileRole, Op};
use super::*;
use crate::storage::contract::{AppendStore, FaultKind, Health};

/// A provider on `dir` whose files fail as `faults` plans, counted from
/// the moment it and its channel `telemetry` have opened.
fn faulty(dir: &Path, faults: vfs::Faults) -> (SqliteProvider, Arc<dyn AppendStore>) {
    let path = dir.join("saguin.db");
    std::fs::File::create(&path).unwrap();
    let faults = Arc::new(faults.paused());
    vfs::register().unwrap();
    vfs::arm(&path, Arc::clone(&faults));
    let mut o = SqliteOptions::new("db", &path);
    o.flush_interval = Duration::from_millis(10);
    o.read_connections = 1;
    let p = SqliteProvider::open(o).unwrap();
    let s = append(&p);
    faults.start_counting();
    (p, s)
}

fn append(p: &SqliteProvider) -> Arc<dyn AppendStore> {
    p.open_channel("telemetry", ChannelKind::Append)
        .unwrap()
        .as_append()
        .unwrap()
        .clone()
}

fn record(i: u32) -> Record {
    Record::new("telemetry/x", format!("record {i}").into_bytes())
}

/// Until `done` holds, or a bounded wait runs out (the flusher's own
/// thread meets the fault).
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn failed_with(p: &SqliteProvider) -> Option<FaultKind> {
    match p.health() {
        Health::Failed { kind, .. } => Some(kind),
        _ => None,
    }
}

/// After the provider failed, a write is refused without touching the
/// file, though the planned failure was a single call: the disk is not
/// trusted again until a restart.
fn refuses_writes(p: &SqliteProvider, store: &Arc<dyn AppendStore>, kind: FaultKind) {
    let next = store.next();
    match store.append(record(999)) {
        Err(e @ StorageError::ProviderFailed { .. }) => {
            assert_eq!(e.kind(), kind);
            assert_eq!(e.mqtt_reason_code(), contract::REASON_WRITE_FAILED);
        }
        other => panic!("a failed provider stored a write: {other:?}"),
    }
    assert_eq!(store.next(), next, "no offset taken");
    // Reads go on.
    assert!(store.read_from(store.floor()).is_ok());
    assert_eq!(failed_with(p), Some(kind));
}

/// What a reopened provider holds: every record stored before the fault.
fn reopened_holds(dir: &Path, records: u64) {
    vfs::disarm(&dir.join("saguin.db"));
    let p = SqliteProvider::open(SqliteOptions::new("db", dir.join("saguin.db"))).unwrap();
    let s = append(&p);
    assert_eq!(s.read_from(1).unwrap().len() as u64, records);
    assert_eq!(
        p.health(),
        Health::Writing,
        "a restart runs recovery and writes again"
    );
    s.append(record(1000)).unwrap();
}

#[test]
fn an_io_error_writing_the_wal_fails_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let (p, s) = faulty(
        dir.path(),
        vfs::Faults::new().fail(FileRole::Wal, Op::Write, 1, false, libc::EIO),
    );
    let e = s.append(record(0)).unwrap_err();
    assert_eq!(e.kind(), FaultKind::Io, "{e}");
    assert_eq!(e.mqtt_reason_code(), contract::REASON_WRITE_FAILED);
    refuses_writes(&p, &s, FaultKind::Io);
    p.close().unwrap();
    reopened_holds(dir.path(), 0);
}

#[test]
fn no_room_for_a_wal_write_refuses_that_write_only_and_is_not_the_bound() {
    for errno in [libc::ENOSPC, libc::EDQUOT] {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = faulty(
            dir.path(),
            vfs::Faults::new().fail(FileRole::Wal, Op::Write, 1, false, errno),
        );
        let e = s.append(record(1)).unwrap_err();
        assert_eq!(e.kind(), FaultKind::NoSpace, "errno {errno}: {e}");
        assert!(
            !e.is_full(),
            "a full file system is not the configured bound"
        );
        assert_eq!(e.mqtt_reason_code(), contract::REASON_WRITE_FAILED);
        assert_eq!(p.health(), Health::NoSpace);
        // Room again: the next write goes through, and says so.
        s.append(record(2)).unwrap();
        assert_eq!(p.health(), Health::Writing);
        s.append(record(3)).unwrap();
        assert_eq!(s.read_from(1).unwrap().len(), 2);
        p.close().unwrap();
        reopened_holds(dir.path(), 2);
    }
}

#[test]
fn the_page_ceiling_is_still_the_bound_and_answers_0x97() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = SqliteOptions::new("db", dir.path().join("saguin.db"));
    o.reserve = 4096;
    o.max_bytes = Some(256 * 1024);
    let p = SqliteProvider::open(o).unwrap();
    let s = append(&p);
    let big = vec![b'x'; 16 * 1024];
    let e = (0..100)
        .find_map(|_| s.append(Record::new("telemetry/x", big.clone())).err())
        .expect("the bound was never reached");
    assert_eq!(e.kind(), FaultKind::Full, "{e}");
    assert_eq!(e.mqtt_reason_code(), contract::REASON_QUOTA_EXCEEDED);
    assert_eq!(p.health(), Health::Writing);
}

#[test]
fn a_failed_fsync_of_the_wal_by_the_flusher_fails_the_provider_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let (p, s) = faulty(
        dir.path(),
        vfs::Faults::new().fail(FileRole::Wal, Op::Sync, 1, false, libc::EIO),
    );
    s.append(record(0)).unwrap();
    wait_for("the flusher's fsync failed the provider", || {
        failed_with(&p).is_some()
    });
    refuses_writes(&p, &s, FaultKind::Fsync);
    p.close().unwrap();
    reopened_holds(dir.path(), 1);
}

/// A read-only file system is said as one, though an fsync met it first:
/// the flusher's of the log, or a checkpoint's of the database.
#[test]
fn an_fsync_meeting_a_read_only_file_system_fails_the_provider_as_read_only() {
    for role in [FileRole::Wal, FileRole::Db] {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = faulty(
            dir.path(),
            vfs::Faults::new().fail(role, Op::Sync, 1, false, libc::EROFS),
        );
        s.append(record(0)).unwrap();
        wait_for("the fsync failed the provider", || {
            failed_with(&p).is_some()
        });
        refuses_writes(&p, &s, FaultKind::ReadOnly);
        p.close().unwrap();
        reopened_holds(dir.path(), 1);
    }
}

#[test]
fn an_io_error_writing_the_database_in_a_checkpoint_fails_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let (p, s) = faulty(
        dir.path(),
        vfs::Faults::new().fail(FileRole::Db, Op::Write, 1, false, libc::EIO),
    );
    s.append(record(0)).unwrap();
    wait_for("the checkpoint's write failed the provider", || {
        failed_with(&p).is_some()
    });
    refuses_writes(&p, &s, FaultKind::Io);
    p.close().unwrap();
    reopened_holds(dir.path(), 1);
}

#[test]
fn a_failed_fsync_of_the_database_in_a_checkpoint_fails_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let (p, s) = faulty(
        dir.path(),
        vfs::Faults::new().fail(FileRole::Db, Op::Sync, 1, false, libc::EIO),
    );
    s.append(record(0)).unwrap();
    wait_for("the checkpoint's fsync failed the provider", || {
        failed_with(&p).is_some()
    });
    refuses_writes(&p, &s, FaultKind::Fsync);
    p.close().unwrap();
    reopened_holds(dir.path(), 1);
}

#[test]
fn an_io_error_reading_fails_the_provider_and_reads_are_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let (p, s) = faulty(
        dir.path(),
        vfs::Faults::new().fail(FileRole::Wal, Op::Read, 1, false, libc::EIO),
    );
    s.append(record(0)).unwrap();
    let e = s.read_from(1).unwrap_err();
    assert_eq!(e.kind(), FaultKind::Io, "{e}");
    refuses_writes(&p, &s, FaultKind::Io);
    assert_eq!(s.read_from(1).unwrap().len(), 1);
    p.close().unwrap();
    reopened_holds(dir.path(), 1);
}
