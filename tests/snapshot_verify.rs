//! `saguin snapshot verify` as a process: every damaged fixture is refused
//! with its documented exit code and message, every good fixture passes,
//! and special files are refused without being opened.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use saguin_format::channel_name::{BROADCAST_FILE, MANIFEST_FILE, SESSIONS_FILE};
use saguin_format::f21::{
    self, BroadcastFile, ChannelFile, Manifest, ManifestEntry, SessionsFile, SnapshotFile,
};
use saguin_format::model::{ChannelKind, Record};

const T: i64 = 1_767_225_600_000_000_000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn saguin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        // A FIFO opened for reading would block forever: bound every run.
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap()
}

fn verify(path: &Path) -> Output {
    saguin(&["snapshot", "verify", path.to_str().unwrap()])
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn code(o: &Output) -> i32 {
    o.status
        .code()
        .expect("exited, not killed by a signal or the timeout")
}

#[test]
fn every_damaged_fixture_is_refused_as_expected() {
    let damaged = root().join("fixtures/damaged");
    let mut checked = 0;
    let mut dirs: Vec<_> = std::fs::read_dir(&damaged)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let Ok(expected) = std::fs::read_to_string(dir.join("EXPECTED")) else {
            continue;
        };
        for line in expected.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let mut parts = line.splitn(3, '\t');
            let (Some(file), Some(exit), Some(substring)) =
                (parts.next(), parts.next(), parts.next())
            else {
                panic!("{}: malformed EXPECTED line {line:?}", dir.display());
            };
            let exit: i32 = exit.parse().unwrap();
            let path = dir.join(file);
            let out = verify(&path);
            let (stdout, stderr) = text(&out);
            assert_ne!(code(&out), 0, "{} verified OK", path.display());
            assert_eq!(
                code(&out),
                exit,
                "{}: exit code\nstdout: {stdout}\nstderr: {stderr}",
                path.display()
            );
            assert!(!stderr.contains("panicked"), "{}: {stderr}", path.display());
            let fail_line = format!("FAIL {}", path.display());
            assert!(
                stdout.contains(&fail_line) && stdout.contains(substring),
                "{}: stdout lacks {substring:?}\nstdout: {stdout}\nstderr: {stderr}",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 100, "only {checked} damaged fixtures found");
}

/// Good fixtures: the MBMQTT01 goldens, and every format 21 file or
/// snapshot directory under fixtures/f21 when that corpus exists.
fn good_fixtures() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join("fixtures/mbmqtt"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let f21 = root().join("fixtures/f21");
    if f21.is_dir() {
        for entry in walkdir::WalkDir::new(&f21).min_depth(1) {
            let entry = entry.unwrap();
            let p = entry.path();
            let is_snapshot_dir = entry.file_type().is_dir() && p.join(MANIFEST_FILE).exists();
            let is_lone_file = entry.file_type().is_file()
                && !p.parent().is_some_and(|d| d.join(MANIFEST_FILE).exists())
                && std::fs::read(p).is_ok_and(|b| b.starts_with(&f21::MAGIC));
            if is_snapshot_dir || is_lone_file {
                out.push(p.to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_good_fixture_verifies() {
    let fixtures = good_fixtures();
    assert!(fixtures.len() >= 3);
    for path in &fixtures {
        let out = verify(path);
        let (stdout, stderr) = text(&out);
        assert_eq!(code(&out), 0, "{}\n{stdout}\n{stderr}", path.display());
        assert!(
            stdout.contains(&format!("OK {}", path.display())),
            "{stdout}"
        );
    }
    // All at once, with a summary line.
    let mut args = vec!["snapshot", "verify"];
    let strs: Vec<String> = fixtures.iter().map(|p| p.display().to_string()).collect();
    args.extend(strs.iter().map(String::as_str));
    let out = saguin(&args);
    assert_eq!(code(&out), 0);
    assert!(text(&out).0.contains(" checked: "));
}

#[test]
fn special_files_are_invalid_snapshots_and_never_opened() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("broker.snapshot");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = verify(&fifo);
    assert_eq!(code(&out), 1, "{:?}", text(&out));
    assert!(text(&out).0.contains("is a FIFO, not a regular file"));

    let link = d.path().join("link.snapshot");
    std::os::unix::fs::symlink(root().join("fixtures/mbmqtt/broker-v3.snapshot"), &link).unwrap();
    let out = verify(&link);
    assert_eq!(code(&out), 1);
    assert!(text(&out).0.contains("is a symbolic link"));

    let out = verify(Path::new("/dev/null"));
    assert_eq!(code(&out), 1);
    assert!(text(&out).0.contains("is a character device"));

    // A directory where a snapshot file belongs, inside a snapshot directory.
    let snap = d.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    std::fs::create_dir(snap.join("telemetry.snapshot")).unwrap();
    let out = verify(&snap);
    assert_eq!(code(&out), 1, "{:?}", text(&out));
    assert!(text(&out)
        .0
        .contains("telemetry.snapshot: is a directory, not a regular file"));

    // A symlinked snapshot directory.
    let dlink = d.path().join("snaplink");
    std::os::unix::fs::symlink(&snap, &dlink).unwrap();
    let out = verify(&dlink);
    assert_eq!(code(&out), 1);
    assert!(text(&out).0.contains("is a symbolic link"));

    // Missing: the work cannot be done.
    let out = verify(&d.path().join("missing.snapshot"));
    assert_eq!(code(&out), 3);
    assert!(text(&out).0.contains("missing.snapshot: no such file"));
}

#[test]
fn unreadable_file_exits_3() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = d.path().join("broker.snapshot");
    std::fs::copy(root().join("fixtures/mbmqtt/broker-v3.snapshot"), &p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    let binary = if as_root {
        // Root reads past permission bits: the command runs as nobody, for
        // whom they hold, from a copy of the binary nobody can reach
        // wherever the build tree is.
        let copy = d.path().join("saguin");
        if std::fs::hard_link(env!("CARGO_BIN_EXE_saguin"), &copy).is_err() {
            std::fs::copy(env!("CARGO_BIN_EXE_saguin"), &copy).unwrap();
        }
        copy
    } else {
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_saguin"))
    };
    let mut command = std::process::Command::new(&binary);
    command.args(["snapshot", "verify"]).arg(&p);
    if as_root {
        command.uid(65534).gid(65534);
    }
    let out = command.output().unwrap();
    assert_eq!(code(&out), 3, "{:?}", text(&out));
    assert!(
        text(&out).0.contains("permission denied"),
        "{:?}",
        text(&out)
    );
}

#[test]
fn size_limit_refuses_before_reading() {
    let v3 = root().join("fixtures/mbmqtt/broker-v3.snapshot");
    let out = saguin(&[
        "snapshot",
        "verify",
        "--max-bytes",
        "100",
        v3.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1);
    assert!(text(&out).0.contains("bytes is over the 100-byte limit"));
    let out = saguin(&[
        "snapshot",
        "verify",
        "--max-bytes",
        "1MiB",
        v3.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0);
    let out = saguin(&[
        "snapshot",
        "verify",
        "--max-bytes",
        "lots",
        v3.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 2);
}

#[test]
fn mbmqtt_default_limit_is_64_mib() {
    // A sparse file: its size is over the limit, and nothing is read.
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("broker.snapshot");
    let f = std::fs::File::create(&p).unwrap();
    std::io::Write::write_all(&mut &f, b"MBMQTT01").unwrap();
    f.set_len(64 * 1024 * 1024 + 1).unwrap();
    drop(f);
    let out = verify(&p);
    assert_eq!(code(&out), 1);
    assert!(
        text(&out)
            .0
            .contains("67108865 bytes is over the 67108864-byte limit"),
        "{:?}",
        text(&out)
    );
}

#[test]
fn quiet_and_json() {
    let good = root().join("fixtures/mbmqtt/broker-v1.snapshot");
    let bad = root().join("fixtures/damaged/mbmqtt/crc-wrong.snapshot");
    let out = saguin(&[
        "snapshot",
        "verify",
        "--quiet",
        good.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1);
    assert!(out.stdout.is_empty() && out.stderr.is_empty());

    let out = saguin(&[
        "snapshot",
        "verify",
        "--json",
        good.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["results"][0]["status"], "ok");
    assert_eq!(doc["results"][0]["format"], "mbmqtt01");
    assert_eq!(doc["results"][1]["status"], "fail");
    assert_eq!(doc["results"][1]["problem"]["code"], "crc-mismatch");
    assert_eq!(doc["summary"]["checked"], 2);
    assert_eq!(doc["summary"]["failed"], 1);
    assert_eq!(doc["exit_code"], 1);
    assert_eq!(doc["findings"], serde_json::json!([]));
}

fn put(dir: &Path, name: &str, file: &SnapshotFile, at: i64) {
    std::fs::write(
        dir.join(name),
        f21::encode_with_writer(file, "0123456789ab", at),
    )
    .unwrap();
}

fn telemetry() -> ChannelFile {
    let mut c = ChannelFile::new("telemetry", ChannelKind::Append);
    for i in 1..=3u64 {
        let mut r = Record::new("telemetry/dev1/temp", format!("{}", 20 + i).into_bytes());
        r.offset = i;
        r.timestamp = T + i as i64;
        r.qos = 1;
        r.client_id = "dev1".into();
        c.bytes += r.accounted_size();
        c.records.push(r);
    }
    c.next = 4;
    c
}

/// A directory one shutdown wrote whole.
fn snapshot_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let manifest = Manifest {
        began_at: T,
        channels: vec![ManifestEntry {
            channel: "telemetry".into(),
            file_name: "telemetry.snapshot".into(),
            kind: ChannelKind::Append,
        }],
        retained: false,
        sessions: true,
        broadcast: true,
    };
    put(
        d.path(),
        MANIFEST_FILE,
        &SnapshotFile::Manifest(manifest),
        T,
    );
    put(
        d.path(),
        "telemetry.snapshot",
        &SnapshotFile::Channel(telemetry()),
        T,
    );
    put(
        d.path(),
        SESSIONS_FILE,
        &SnapshotFile::Sessions(SessionsFile::default()),
        T,
    );
    put(
        d.path(),
        BROADCAST_FILE,
        &SnapshotFile::Broadcast(BroadcastFile::default()),
        T,
    );
    d
}

#[test]
fn a_snapshot_directory_verifies_file_by_file() {
    let d = snapshot_dir();
    let out = verify(d.path());
    let (stdout, stderr) = text(&out);
    assert_eq!(code(&out), 0, "{stdout}{stderr}");
    for name in [
        MANIFEST_FILE,
        "telemetry.snapshot",
        SESSIONS_FILE,
        BROADCAST_FILE,
    ] {
        assert!(
            stdout.contains(&format!("OK {}", d.path().join(name).display())),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("4 files checked: 4 ok, 0 failed, 0 unreadable"),
        "{stdout}"
    );

    // A leftover temporary file is reported, and is not a failure.
    std::fs::write(d.path().join("telemetry.snapshot.tmp"), b"half").unwrap();
    let out = verify(d.path());
    assert_eq!(code(&out), 0);
    assert!(text(&out)
        .0
        .contains("telemetry.snapshot.tmp: a temporary file"));

    // The log gone: the sessions file is refused.
    std::fs::remove_file(d.path().join(BROADCAST_FILE)).unwrap();
    let out = verify(d.path());
    assert_eq!(code(&out), 1);
    assert!(text(&out)
        .0
        .contains("saguin.sessions has no saguin.broadcast beside it"));
}

#[test]
fn another_format_version_is_named() {
    let d = tempfile::tempdir().unwrap();
    let mut bytes = f21::encode_with_writer(&SnapshotFile::Channel(telemetry()), "0123456789ab", T);
    bytes[8..12].copy_from_slice(&20u32.to_le_bytes());
    let p = d.path().join("telemetry.snapshot");
    std::fs::write(&p, &bytes).unwrap();
    let out = verify(&p);
    assert_eq!(code(&out), 1);
    let expected = format!(
        "FAIL {}: format 20 (written by saguin 0123456789ab at 2026-01-01T00:00:00Z); this build reads format 21",
        p.display()
    );
    assert!(text(&out).0.contains(&expected), "{:?}", text(&out));

    // In a directory: the same sentence, naming the file.
    std::fs::rename(&p, d.path().join("telemetry.snapshot")).unwrap();
    let out = verify(d.path());
    assert_eq!(code(&out), 1);
    assert!(text(&out)
        .0
        .contains("format 20 (written by saguin 0123456789ab"));
}

#[test]
fn many_files_in_one_run() {
    let fixtures = root().join("fixtures/damaged/mbmqtt");
    let mut args: Vec<String> = vec!["snapshot".into(), "verify".into()];
    for e in std::fs::read_dir(&fixtures).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "snapshot") {
            args.push(p.display().to_string());
        }
    }
    let n = args.len() - 2;
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(&args)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    let stdout = text(&out).0;
    assert_eq!(stdout.lines().filter(|l| l.starts_with("FAIL ")).count(), n);
    assert!(stdout.contains(&format!(
        "{n} files checked: 0 ok, {n} failed, 0 unreadable"
    )));
}

/// One size syntax everywhere, the configuration's: plain bytes,
/// binary (`1MiB`) and decimal (`1MB`) units, the same parser.
#[test]
fn one_size_syntax_everywhere() {
    let v3 = root().join("fixtures/mbmqtt/broker-v3.snapshot");
    let size = std::fs::metadata(&v3).unwrap().len();
    assert!(size < 1000, "the fixture is small");
    for (limit, expected) in [
        ("1MB", 0),
        ("1kB", 0),
        ("1 KiB", 0),
        ("100B", 1),
        ("1K", 2),
        ("1.5MB", 2),
    ] {
        let out = saguin(&[
            "snapshot",
            "verify",
            "--max-bytes",
            limit,
            v3.to_str().unwrap(),
        ]);
        assert_eq!(code(&out), expected, "verify --max-bytes {limit}");
        let out = saguin(&[
            "snapshot",
            "inspect",
            "--max-bytes",
            limit,
            v3.to_str().unwrap(),
        ]);
        assert_eq!(code(&out), expected, "inspect --max-bytes {limit}");
    }
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("imported");
    let out = saguin(&[
        "migrate",
        "from-mbmqtt",
        v3.to_str().unwrap(),
        "--to-snapshots",
        dest.to_str().unwrap(),
        "--max-bytes",
        "100B",
    ]);
    assert_eq!(code(&out), 3, "{}", text(&out).1);
    let out = saguin(&[
        "migrate",
        "from-mbmqtt",
        v3.to_str().unwrap(),
        "--to-snapshots",
        dest.to_str().unwrap(),
        "--max-bytes",
        "1MB",
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out).1);
}

#[test]
fn an_empty_directory_fails_verification_with_nothing_to_verify() {
    let d = tempfile::tempdir().unwrap();
    let out = verify(d.path());
    let (stdout, stderr) = text(&out);
    assert_eq!(code(&out), 1, "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(
            "FAIL {}: the directory holds no channel, retained-store, sessions or broadcast file: nothing in it to verify or keep",
            d.path().display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("0 files checked: 0 ok, 0 failed, 0 unreadable, 1 directory error"),
        "{stdout}"
    );

    let out = saguin(&["snapshot", "verify", "--json", d.path().to_str().unwrap()]);
    assert_eq!(code(&out), 1);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["exit_code"], 1);
    assert_eq!(doc["findings"][0]["code"], "nothing-stored");
    assert_eq!(doc["findings"][0]["verdict"], "fail");
}
