//! `saguin lock status` against real lock files: free, held by this (test)
//! process through the library, held by a foreign exclusive connection whose
//! row cannot be read, stale, and cannot tell.

use std::path::Path;
use std::process::Output;

use assert_cmd::Command;
use saguin::storage::lock;

fn status(path: &Path, json: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_saguin"));
    cmd.args(["lock", "status"]).arg(path);
    if json {
        cmd.arg("--json");
    }
    cmd.output().unwrap()
}

fn json_of(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn a_database_with_no_lock_file_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    std::fs::write(&db, b"").unwrap();
    let out = status(&db, false);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("saguin.db.lock: free"), "{text}");

    let out = status(&db, true);
    assert_eq!(out.status.code(), Some(0));
    let doc = json_of(&out);
    assert_eq!(doc["state"], "free");
    assert!(doc["holder"].is_null());
    assert!(doc["lock"].as_str().unwrap().ends_with("saguin.db.lock"));
}

#[test]
fn a_lock_held_by_another_process_names_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let lock_path = lock::lock_path_for_database(&db);
    let guard = lock::acquire(&lock_path).unwrap();

    // Asked by database and by lock file alike.
    for path in [&db, &lock_path] {
        std::fs::write(&db, b"").unwrap();
        let out = status(path, true);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let doc = json_of(&out);
        assert_eq!(doc["state"], "held");
        assert_eq!(doc["holder"]["pid"], std::process::id());
        assert_eq!(doc["holder"]["host"], lock::this_host());
        assert_eq!(doc["holder_pid"], std::process::id());
    }
    let out = status(&lock_path, false);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("held by pid {}", std::process::id())),
        "{text}"
    );

    drop(guard);
    let out = status(&lock_path, true);
    assert_eq!(out.status.code(), Some(0));
    let doc = json_of(&out);
    assert_eq!(doc["state"], "free");
    assert_eq!(doc["holder"]["pid"], std::process::id());
}

#[test]
fn a_snapshot_directory_is_asked_about_its_saguin_lock() {
    let dir = tempfile::tempdir().unwrap();
    let guard = lock::acquire(&lock::lock_path_for_snapshot_dir(dir.path())).unwrap();
    let out = status(dir.path(), true);
    assert_eq!(out.status.code(), Some(1));
    let doc = json_of(&out);
    assert!(doc["lock"].as_str().unwrap().ends_with("saguin.lock"));
    drop(guard);
    assert_eq!(status(dir.path(), false).status.code(), Some(0));
}

#[test]
fn a_foreign_exclusive_holder_is_held_even_without_a_readable_row() {
    // Another program with the lock database open in exclusive mode, having
    // written no holder row at all.
    let dir = tempfile::tempdir().unwrap();
    let lock_path = dir.path().join("other.lock");
    let conn = rusqlite::Connection::open(&lock_path).unwrap();
    let _: String = conn
        .query_row("PRAGMA locking_mode=EXCLUSIVE", [], |r| r.get(0))
        .unwrap();
    conn.execute_batch("CREATE TABLE t (x INTEGER) STRICT; INSERT INTO t VALUES (1);")
        .unwrap();
    let out = status(&lock_path, true);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc = json_of(&out);
    assert_eq!(doc["state"], "held");
    assert!(doc["holder"].is_null());
    assert_eq!(doc["holder_pid"], std::process::id());

    // And the broker's own acquire refuses at once, naming the lock.
    let err = lock::acquire(&lock_path).unwrap_err();
    assert!(
        err.to_string().contains(&lock_path.display().to_string()),
        "{err}"
    );
    drop(conn);
}

#[test]
fn a_lock_left_by_a_dead_process_is_stale_and_free() {
    let dir = tempfile::tempdir().unwrap();
    let lock_path = dir.path().join("saguin.db.lock");
    let conn = rusqlite::Connection::open(&lock_path).unwrap();
    conn.execute_batch(
        "CREATE TABLE holder (id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER NOT NULL,
         host TEXT NOT NULL, since_unix_ns INTEGER NOT NULL, revision TEXT NOT NULL) STRICT",
    )
    .unwrap();
    // Above Linux's largest pid_max (2^22), so no process has it.
    conn.execute(
        "INSERT INTO holder VALUES (1, 2147483000, ?1, 1767225600000000000, 'old')",
        [lock::this_host()],
    )
    .unwrap();
    drop(conn);

    let out = status(&lock_path, false);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stale lock left by pid 2147483000"), "{text}");

    let doc = json_of(&status(&lock_path, true));
    assert_eq!(doc["state"], "stale");
    assert_eq!(doc["holder"]["since"], "2026-01-01T00:00:00Z");

    // A stale lock is taken by the next broker.
    let guard = lock::acquire(&lock_path).unwrap();
    assert_eq!(guard.holder().pid, std::process::id());
}

#[test]
fn a_lock_that_cannot_be_read_is_cannot_tell() {
    let dir = tempfile::tempdir().unwrap();
    let lock_path = dir.path().join("junk.lock");
    std::fs::write(&lock_path, vec![0x5a; 4096]).unwrap();
    let out = status(&lock_path, true);
    assert_eq!(out.status.code(), Some(3));
    let doc = json_of(&out);
    assert_eq!(doc["state"], "unknown");
    assert!(doc["error"].as_str().unwrap().contains("junk.lock"));

    let missing = dir.path().join("nothing-here.db");
    let out = status(&missing, false);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing-here.db"));
}

#[test]
fn a_running_sqlite_provider_holds_its_databases_lock() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let provider = saguin::storage::sqlite::SqliteProvider::open(
        saguin::storage::sqlite::SqliteOptions::new("db", &db),
    )
    .unwrap();
    let out = status(&db, true);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc = json_of(&out);
    assert_eq!(doc["state"], "held");
    assert_eq!(doc["holder"]["pid"], std::process::id());
    drop(provider);
    let out = status(&db, true);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_of(&out)["state"], "free");
}

/// A lock its holder let go of cleanly is "free (last released by
/// pid N at T)", even once that process is gone; only a holder that died
/// holding it leaves a stale lock.
#[test]
fn a_cleanly_released_lock_is_free_with_its_release_not_stale() {
    let dir = tempfile::tempdir().unwrap();
    let lock_path = dir.path().join("saguin.db.lock");
    drop(lock::acquire(&lock_path).unwrap());
    // The releasing process has since exited: a pid above Linux's largest
    // pid_max (2^22) stands for it.
    let conn = rusqlite::Connection::open(&lock_path).unwrap();
    conn.execute("UPDATE holder SET pid = 2147483000", [])
        .unwrap();
    drop(conn);

    let out = status(&lock_path, false);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("free (last released by pid 2147483000 on "),
        "{text}"
    );
    assert!(!text.contains("stale"), "{text}");
    let doc = json_of(&status(&lock_path, true));
    assert_eq!(doc["state"], "free");
    assert!(doc["holder"]["released"].is_string(), "{doc}");
}
