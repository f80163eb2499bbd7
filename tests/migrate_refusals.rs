//! `saguin migrate` refusals, each with its documented exit code, and
//! what must not happen on a refusal: nothing created, the source untouched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::SystemTime;

use assert_cmd::Command;
use saguin::storage::lock;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/f21/dir")
}

fn saguin(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .output()
        .unwrap()
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A copy of the good snapshot directory fixture.
fn snapshot_copy(into: &Path) -> PathBuf {
    let dir = into.join("snapshots");
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(fixture_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

/// A database migrated from the fixture.
fn database(into: &Path) -> PathBuf {
    let src = snapshot_copy(into);
    let db = into.join("saguin.db");
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    db
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Bytes and mtime of every file in `dir` but the lock's own.
fn fingerprint(dir: &Path) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            !e.file_name().to_string_lossy().contains(".lock") && e.file_name() != "saguin.lock"
        })
        .map(|e| {
            let meta = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (std::fs::read(e.path()).unwrap(), meta.modified().unwrap()),
            )
        })
        .collect()
}

/// A database without channels, sessions or retained messages, at `path`.
fn bare_database(path: &Path) -> PathBuf {
    drop(
        saguin::storage::sqlite::SqliteProvider::open(saguin::storage::sqlite::SqliteOptions::new(
            "db", path,
        ))
        .unwrap(),
    );
    path.to_path_buf()
}

#[test]
fn config_is_refused_with_exit_2_and_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let src = snapshot_copy(tmp.path());
    let db = tmp.path().join("new.db");
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
        os("--config"),
        os("saguin.yaml"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("reads and writes only the paths it is given"),
        "{}",
        stderr(&out)
    );
    assert!(!db.exists());
    for sub in [
        ["to-snapshots", "x.db", "dir"],
        ["from-mbmqtt", "b.snapshot", "--to-sqlite"],
    ] {
        let mut args: Vec<&std::ffi::OsStr> = vec![os("migrate")];
        args.extend(sub.iter().map(|s| os(s)));
        if sub[0] == "from-mbmqtt" {
            args.push(db.as_os_str());
        }
        args.extend([os("--config"), os("c.yaml")]);
        assert_eq!(saguin(&args).status.code(), Some(2));
    }
}

#[test]
fn an_existing_destination_or_sidecar_is_refused_with_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let src = snapshot_copy(tmp.path());
    let db = tmp.path().join("taken.db");
    std::fs::write(&db, b"").unwrap();
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("exists"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&db).unwrap(), b"");
    std::fs::remove_file(&db).unwrap();
    for side in ["-wal", "-shm", "-journal"] {
        let sidecar = tmp.path().join(format!("taken.db{side}"));
        std::fs::write(&sidecar, b"x").unwrap();
        let out = saguin(&[
            os("migrate"),
            os("to-sqlite"),
            src.as_os_str(),
            db.as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(3), "{side}");
        assert!(stderr(&out).contains(side), "{}", stderr(&out));
        assert!(!db.exists(), "{side}");
        std::fs::remove_file(&sidecar).unwrap();
    }
    // A snapshot directory destination holding a channel file or a manifest.
    let source_db = database(&tmp.path().join("d").tap_mkdir());
    for name in ["old.snapshot", "saguin.manifest"] {
        let dest = tmp.path().join(format!("dest-{name}"));
        std::fs::create_dir(&dest).unwrap();
        std::fs::write(dest.join(name), b"x").unwrap();
        let out = saguin(&[
            os("migrate"),
            os("to-snapshots"),
            source_db.as_os_str(),
            dest.as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(stderr(&out).contains(name), "{}", stderr(&out));
        assert_eq!(listing(&dest), vec![name.to_string()]);
    }
    // An empty directory is a destination.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = saguin(&[
        os("migrate"),
        os("to-snapshots"),
        source_db.as_os_str(),
        empty.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}
impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

#[test]
fn a_missing_source_is_exit_3_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("out.db");
    let dir = tmp.path().join("out");
    let missing = tmp.path().join("nowhere");
    for args in [
        vec![
            os("migrate"),
            os("to-sqlite"),
            missing.as_os_str(),
            db.as_os_str(),
        ],
        vec![
            os("migrate"),
            os("to-snapshots"),
            missing.as_os_str(),
            dir.as_os_str(),
        ],
        vec![
            os("migrate"),
            os("from-mbmqtt"),
            missing.as_os_str(),
            os("--to-sqlite"),
            db.as_os_str(),
        ],
    ] {
        let out = saguin(&args);
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        assert!(stderr(&out).contains("no such"), "{}", stderr(&out));
    }
    assert_eq!(listing(tmp.path()), Vec::<String>::new());
}

#[test]
fn a_source_held_by_a_running_broker_is_exit_3_naming_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let src = snapshot_copy(tmp.path());
    let guard = lock::acquire(&lock::lock_path_for_snapshot_dir(&src)).unwrap();
    let db = tmp.path().join("new.db");
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("pid {}", std::process::id())),
        "{err}"
    );
    assert!(err.contains("stop the broker"), "{err}");
    assert!(!db.exists());
    drop(guard);

    let sdb = database(&tmp.path().join("s").tap_mkdir());
    let guard = lock::acquire(&lock::lock_path_for_database(&sdb)).unwrap();
    let dest = tmp.path().join("snaps");
    let out = saguin(&[
        os("migrate"),
        os("to-snapshots"),
        sdb.as_os_str(),
        dest.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("held by"), "{}", stderr(&out));
    assert!(!dest.exists());
    drop(guard);
}

#[test]
fn a_destination_held_by_a_running_broker_is_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let src = snapshot_copy(tmp.path());
    let db = tmp.path().join("new.db");
    let guard = lock::acquire(&lock::lock_path_for_database(&db)).unwrap();
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("held by"), "{}", stderr(&out));
    assert!(!db.exists());
    drop(guard);
}

#[test]
fn nothing_to_migrate_is_exit_3_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let db = tmp.path().join("new.db");
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        empty.as_os_str(),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        stderr(&out).contains("nothing to migrate"),
        "{}",
        stderr(&out)
    );
    assert!(!db.exists());
    assert!(!tmp.path().join("new.db.lock").exists());

    let bare = bare_database(&tmp.path().join("bare.db"));
    let dest = tmp.path().join("snaps");
    let out = saguin(&[
        os("migrate"),
        os("to-snapshots"),
        bare.as_os_str(),
        dest.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing to migrate"),
        "{}",
        stderr(&out)
    );
    assert!(!dest.exists());
}

#[test]
fn a_database_of_another_schema_version_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("old.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "CREATE TABLE meta (id INTEGER PRIMARY KEY, schema_version INTEGER, created_by TEXT, created_at INTEGER);
         INSERT INTO meta VALUES (1, 5, '0123456789ab', 1767225600000000000);
         PRAGMA user_version = 5;",
    )
    .unwrap();
    drop(conn);
    let dest = tmp.path().join("snaps");
    let out = saguin(&[
        os("migrate"),
        os("to-snapshots"),
        db.as_os_str(),
        dest.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.contains("schema version 5 (created by saguin 0123456789ab at 2026-01-01T00:00:00Z); this broker reads version 20"),
        "{err}"
    );
    assert!(!dest.exists());
}

#[test]
fn a_damaged_source_file_refuses_the_whole_source_by_name_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = snapshot_copy(tmp.path());
    let path = src.join("state.snapshot");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let db = tmp.path().join("new.db");
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("does not verify"), "{err}");
    assert!(err.contains("state.snapshot"), "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(!db.exists());
    assert_eq!(listing(tmp.path()), ["snapshots"]);
}

#[test]
fn the_source_is_never_touched() {
    let tmp = tempfile::tempdir().unwrap();
    let src = snapshot_copy(tmp.path());
    let before = fingerprint(&src);
    let names_before = listing(&src);
    let db = tmp.path().join("db").tap_mkdir().join("saguin.db");
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(fingerprint(&src), before);
    let mut expected = names_before.clone();
    expected.push("saguin.lock".into());
    expected.sort();
    assert_eq!(listing(&src), expected, "only the lock file is added");

    // The database, stopped (no -wal, no -shm): read and left as found.
    let db_dir = db.parent().unwrap().to_path_buf();
    let before = fingerprint(&db_dir);
    let names_before = listing(&db_dir);
    let dest = tmp.path().join("back");
    let out = saguin(&[
        os("migrate"),
        os("to-snapshots"),
        db.as_os_str(),
        dest.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(fingerprint(&db_dir), before);
    assert_eq!(listing(&db_dir), names_before);
}

#[test]
fn a_unit_that_cannot_be_written_is_listed_and_the_others_carried() {
    use saguin_format::channel_name::{encode_file_name, MANIFEST_FILE};
    use saguin_format::f21::{self, ChannelFile, Manifest, ManifestEntry, SnapshotFile};
    use saguin_format::model::{ChannelKind, Record};

    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("snaps");
    std::fs::create_dir(&src).unwrap();
    let at = 1_767_225_600_000_000_000i64;
    // A queue "x" carries its dead-letter channel "x.dlq"; an append channel
    // of that very name cannot land beside it in one database.
    let mut queue = ChannelFile::new("x", ChannelKind::Queue);
    queue.dead_letter = Some(f21::DeadLetter {
        name: "x.dlq".into(),
        next: 1,
        floor: 1,
        bytes: 0,
        records: Vec::new(),
        positions: Vec::new(),
    });
    let clash = ChannelFile::new("x.dlq", ChannelKind::Append);
    let mut fine = ChannelFile::new("ok", ChannelKind::Append);
    let mut r = Record::new("ok/1", "v");
    r.offset = 1;
    fine.bytes = r.accounted_size();
    fine.records.push(r);
    fine.next = 2;
    let files = [queue, clash, fine];
    let manifest = Manifest {
        began_at: at,
        channels: files
            .iter()
            .map(|c| ManifestEntry {
                channel: c.name.clone(),
                file_name: encode_file_name(&c.name),
                kind: c.kind,
            })
            .collect(),
        retained: false,
        sessions: false,
        broadcast: false,
    };
    std::fs::write(
        src.join(MANIFEST_FILE),
        f21::encode(&SnapshotFile::Manifest(manifest), at),
    )
    .unwrap();
    for c in files {
        std::fs::write(
            src.join(encode_file_name(&c.name)),
            f21::encode(&SnapshotFile::Channel(c), at),
        )
        .unwrap();
    }
    let db = tmp.path().join("new.db");
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        src.as_os_str(),
        db.as_os_str(),
        os("--json"),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let result = |name: &str| {
        doc["units"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == name)
            .unwrap()
            .clone()
    };
    assert!(result("ok")["error"].is_null());
    assert_eq!(result("ok")["counts_out"]["records"], 1);
    // Files go in name order: "x%2Edlq.snapshot" lands first, and the
    // queue whose dead-letter channel would overwrite it is refused whole.
    assert!(result("x.dlq")["error"].is_null());
    let failed = result("x");
    assert!(
        failed["error"].as_str().unwrap().contains("not written"),
        "{failed}"
    );
    assert!(failed["counts_out"].is_null());
    assert!(stderr(&out).contains("queue x:"), "{}", stderr(&out));
    assert_eq!(doc["complete"], false);
}

#[test]
fn from_mbmqtt_without_a_destination_names_both_destinations_with_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .current_dir(tmp.path())
        .args(["migrate", "from-mbmqtt", "legacy/broker.snapshot"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("required arguments were not provided"),
        "{err}"
    );
    assert!(
        err.contains("<--to-sqlite <DB>|--to-snapshots <DIR>>"),
        "{err}"
    );

    // Both at once is as much a usage error, naming the two.
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .current_dir(tmp.path())
        .args([
            "migrate",
            "from-mbmqtt",
            "legacy/broker.snapshot",
            "--to-sqlite",
            "new.db",
            "--to-snapshots",
            "snaps",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("'--to-sqlite <DB>' cannot be used with '--to-snapshots <DIR>'"),
        "{err}"
    );
    assert_eq!(listing(tmp.path()), Vec::<String>::new());
}

#[test]
fn to_snapshots_refuses_a_source_that_is_not_a_database_and_creates_nothing_beside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let snapshots = snapshot_copy(tmp.path());
    let yaml = tmp.path().join("saguin.yaml");
    std::fs::write(&yaml, b"listeners:\n  - bind: 127.0.0.1:1883\n").unwrap();
    let empty = tmp.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    // A lock file is a SQLite file of its own: only opening it tells it
    // from a database, and that takes the source's lock first.
    let db = database(&tmp.path().join("db").tap_mkdir());
    let lock_file = lock::lock_path_for_database(&db);
    assert!(lock_file.exists());
    for (source, says) in [
        (&snapshots, "is a directory, not a sqlite database"),
        (&yaml, "is not a sqlite database"),
        (&empty, "is empty, not a sqlite database"),
        (&lock_file, "saguin.db.lock:"),
    ] {
        let parent = source.parent().unwrap();
        let names_before = listing(parent);
        let inside_before = listing(source);
        let dest = tmp.path().join("out");
        let out = saguin(&[
            os("migrate"),
            os("to-snapshots"),
            source.as_os_str(),
            dest.as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(3), "{source:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{source:?}: {}", stderr(&out));
        assert_eq!(listing(parent), names_before, "{source:?}");
        assert_eq!(listing(source), inside_before, "{source:?}");
        assert!(!dest.exists(), "{source:?}");
    }
}

#[test]
fn a_refusal_after_the_lock_removes_a_lock_file_it_created_and_keeps_one_that_was_there() {
    let tmp = tempfile::tempdir().unwrap();
    // A database holding nothing to migrate is refused once it is open,
    // which is after its lock was taken.
    let bare = bare_database(&tmp.path().join("bare.db"));
    let bare_lock = lock::lock_path_for_database(&bare);
    let _ = std::fs::remove_file(&bare_lock);
    let names_before = listing(tmp.path());
    let dest = tmp.path().join("snaps");
    let refuse = || {
        let out = saguin(&[
            os("migrate"),
            os("to-snapshots"),
            bare.as_os_str(),
            dest.as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("nothing to migrate"),
            "{}",
            stderr(&out)
        );
    };
    refuse();
    assert_eq!(listing(tmp.path()), names_before);

    // A lock file that was there before (a broker's, stopped) stays.
    drop(lock::acquire(&bare_lock).unwrap());
    let names_before = listing(tmp.path());
    refuse();
    assert_eq!(listing(tmp.path()), names_before);
    assert!(bare_lock.is_file());

    // An empty snapshot directory is left empty, so it can still be the
    // destination it looks like.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let db = tmp.path().join("new.db");
    let out = saguin(&[
        os("migrate"),
        os("to-sqlite"),
        empty.as_os_str(),
        db.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing to migrate"),
        "{}",
        stderr(&out)
    );
    assert_eq!(listing(&empty), Vec::<String>::new());
    let source = database(&tmp.path().join("s").tap_mkdir());
    let out = saguin(&[
        os("migrate"),
        os("to-snapshots"),
        source.as_os_str(),
        empty.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
