//! `saguin ... | head`: a reader that closes the pipe early is not a
//! failure. Every output mode of every command that can print more than a
//! pipe holds exits 0 with nothing on stderr when its stdout is closed.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use bytes::Bytes;
use saguin::storage::contract::{Position, Provider, Reader};
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
use saguin_format::model::{ChannelKind, Record};

/// Run saguin with `args`, read the first few bytes of its stdout, close
/// the pipe, and return its exit code and stderr.
fn closed_early(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn saguin");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 16];
    let _ = stdout.read(&mut first);
    drop(stdout);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    (status.code(), stderr)
}

/// A database whose overview and records are each far more than a pipe's
/// buffer (64 KiB on Linux).
fn big_database(dir: &Path) -> std::path::PathBuf {
    let db = dir.join("big.db");
    let p = SqliteProvider::open(SqliteOptions::new("db", &db)).expect("open");
    let t = p
        .open_channel("telemetry", ChannelKind::Append)
        .expect("channel");
    let t = t.as_append().expect("append");
    for i in 0..3000 {
        t.append(Record::new(
            format!("telemetry/sensor-{i}"),
            Bytes::from(format!("reading number {i} of a long series")),
        ))
        .expect("append");
    }
    for i in 0..2000 {
        t.save_position(Position {
            reader: Reader::mqtt(&format!("consumer-{i}")).expect("reader"),
            offset: 1,
            saved_at: 1_767_225_600_000_000_000,
            session_expiry: Some(600),
        })
        .expect("position");
    }
    drop(p);
    db
}

fn assert_quiet_success(args: &[&str]) {
    let (code, stderr) = closed_early(args);
    assert_eq!(code, Some(0), "{args:?}: stderr: {stderr}");
    assert!(stderr.is_empty(), "{args:?}: stderr: {stderr}");
}

#[test]
fn head_closing_the_pipe_exits_0_quietly_in_every_output_mode() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let db = big_database(tmp.path());
    let db = db.to_str().expect("utf-8 path");
    for mode in [&[][..], &["--json"][..], &["--ndjson"][..]] {
        let mut overview = vec!["sqlite", "dump", db];
        overview.extend_from_slice(mode);
        assert_quiet_success(&overview);
        let mut records = overview.clone();
        records.extend(["--channel", "telemetry"]);
        assert_quiet_success(&records);
    }

    let dir = tmp.path().join("snapshots");
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["migrate", "to-snapshots", db])
        .arg(&dir)
        .output()
        .expect("migrate");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = dir.to_str().expect("utf-8 path");
    for mode in [&[][..], &["--json"][..]] {
        let mut inspect = vec!["snapshot", "inspect", dir, "--records"];
        inspect.extend_from_slice(mode);
        assert_quiet_success(&inspect);
    }
    let mut verify = vec!["snapshot", "verify"];
    verify.extend(std::iter::repeat_n(dir, 2000));
    assert_quiet_success(&verify);

    let config = tmp.path().join("many.yaml");
    let mut text = String::from("auth:\n  allow_anonymous: true\nlisteners:\n");
    for i in 0..3000 {
        text.push_str(&format!(
            "  - name: listener-{i}\n    bind: 127.0.0.1:{}\n",
            2000 + i
        ));
    }
    std::fs::write(&config, text).expect("write config");
    let config = config.to_str().expect("utf-8 path");
    for mode in [&[][..], &["--output"][..], &["--output", "json"][..]] {
        let mut check = vec!["check-config", "--config", config];
        check.extend_from_slice(mode);
        assert_quiet_success(&check);
    }
}
