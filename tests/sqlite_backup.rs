//! `saguin sqlite backup` on databases on disk: a copy taken while another
//! thread keeps appending through the sqlite provider verifies and holds a
//! consistent prefix; refusals leave nothing behind.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use assert_cmd::Command;
use bytes::Bytes;
use saguin::storage::contract::Provider;
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
use saguin_format::model::{ChannelKind, Record};

fn backup(db: &Path, dest: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["sqlite", "backup"])
        .arg(db)
        .arg(dest)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The payload the record at `offset` carries, so any record can be checked.
fn payload(offset: u64) -> Bytes {
    Bytes::from(format!("{offset:012}").repeat(80))
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_backup_under_concurrent_appends_verifies_and_is_a_consistent_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("live.db");
    let provider = Arc::new(SqliteProvider::open(SqliteOptions::new("db", &db)).unwrap());
    let store = provider
        .open_channel("telemetry", ChannelKind::Append)
        .unwrap();
    let telemetry = store.as_append().unwrap().clone();
    for offset in 1..=3000 {
        telemetry
            .append(Record::new("telemetry/x", payload(offset)))
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(AtomicU64::new(0));
    let (started_tx, started_rx) = mpsc::channel();
    let writer = {
        let (stop, appended, telemetry) = (stop.clone(), appended.clone(), telemetry.clone());
        std::thread::spawn(move || {
            let mut told = false;
            while !stop.load(Ordering::Acquire) {
                let next = telemetry.next();
                let r = telemetry
                    .append(Record::new("telemetry/x", payload(next)))
                    .unwrap();
                assert_eq!(r.offset, next);
                appended.fetch_add(1, Ordering::AcqRel);
                if !told {
                    started_tx.send(()).unwrap();
                    told = true;
                }
            }
        })
    };
    started_rx.recv().unwrap();
    let dest = tmp.path().join("copy.db");
    let out = backup(&db, &dest);
    let during = appended.load(Ordering::Acquire);
    stop.store(true, Ordering::Release);
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = text(&out.stdout);
    assert!(summary.contains("verified"), "{summary}");
    assert!(summary.contains("11 tables"), "{summary}");
    assert!(summary.contains("MB/s"), "{summary}");
    assert!(during >= 1);

    assert_eq!(
        std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let names = listing(tmp.path());
    assert!(names.contains(&"copy.db".to_string()));
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with("copy.db-") && !n.contains("backup.tmp")),
        "the copy is one file and no temporary is left: {names:?}"
    );

    // The copy: a whole database, and a prefix of what the source holds.
    let copy =
        rusqlite::Connection::open_with_flags(&dest, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let check: String = copy
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let (next, floor, bytes): (u64, u64, u64) = copy
        .query_row(
            "SELECT next, floor, bytes FROM channels WHERE name = 'telemetry'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let (count, min, max, size): (u64, u64, u64, u64) = copy
        .query_row(
            "SELECT count(*), min(offset), max(offset), sum(size) FROM records WHERE channel = 'telemetry'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!(floor, 1);
    assert!(next > 3000, "the prefilled records are there");
    assert_eq!(
        (count, min, max),
        (next - 1, 1, next - 1),
        "no hole, nothing past next"
    );
    assert_eq!(
        bytes, size,
        "the counter row and the records are one moment"
    );
    let mut stmt = copy
        .prepare("SELECT offset, payload FROM records WHERE channel = 'telemetry' ORDER BY offset")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, u64>(0)?, r.get::<_, Vec<u8>>(1)?)))
        .unwrap();
    for row in rows {
        let (offset, body) = row.unwrap();
        assert_eq!(body, payload(offset), "record {offset}");
    }
    assert!(telemetry.next() >= next, "the source is at least as far on");
    drop(stmt);
    drop(copy);

    // The broker opens the copy as it opens its own file.
    let restored = SqliteProvider::open(SqliteOptions::new("restored", &dest)).unwrap();
    let t = restored
        .open_channel("telemetry", ChannelKind::Append)
        .unwrap();
    assert_eq!(t.as_append().unwrap().next(), next);
    restored.close().unwrap();
    provider.close().unwrap();
}

#[test]
fn an_existing_destination_or_sidecar_is_exit_3_and_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("live.db");
    SqliteProvider::open(SqliteOptions::new("db", &db))
        .unwrap()
        .close()
        .unwrap();
    let dest = tmp.path().join("copy.db");
    std::fs::write(&dest, b"keep").unwrap();
    let out = backup(&db, &dest);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("exists"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"keep");
    std::fs::remove_file(&dest).unwrap();
    for side in ["-wal", "-shm", "-journal"] {
        let sidecar = tmp.path().join(format!("copy.db{side}"));
        std::fs::write(&sidecar, b"x").unwrap();
        let out = backup(&db, &dest);
        assert_eq!(out.status.code(), Some(3), "{side}");
        assert!(text(&out.stderr).contains(side), "{}", text(&out.stderr));
        assert!(!dest.exists());
        std::fs::remove_file(&sidecar).unwrap();
    }
    assert!(listing(tmp.path())
        .iter()
        .all(|n| !n.contains("backup.tmp")));
}

#[test]
fn a_missing_or_foreign_source_is_exit_3_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("copy.db");
    let out = backup(&tmp.path().join("nowhere.db"), &dest);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("no such database"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(listing(tmp.path()), Vec::<String>::new());

    let old = tmp.path().join("old.db");
    let conn = rusqlite::Connection::open(&old).unwrap();
    conn.execute_batch("CREATE TABLE t (x); PRAGMA user_version = 7;")
        .unwrap();
    drop(conn);
    let out = backup(&old, &dest);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("schema version 7"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dest.exists());
    assert_eq!(listing(tmp.path()), ["old.db"]);
}

#[test]
fn a_destination_whose_directory_does_not_exist_is_exit_3_naming_it_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("live.db");
    SqliteProvider::open(SqliteOptions::new("db", &db))
        .unwrap()
        .close()
        .unwrap();
    let before = listing(tmp.path());
    let parent = tmp.path().join("nodir");
    let out = backup(&db, &parent.join("s.db"));
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "the parent directory {} does not exist",
            parent.display()
        )),
        "{err}"
    );
    assert!(
        !err.contains("backup.tmp"),
        "the temporary name is not the operator's: {err}"
    );
    assert!(!parent.exists());
    assert_eq!(listing(tmp.path()), before);
}
