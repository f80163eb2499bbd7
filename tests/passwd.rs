//! `saguin passwd`: writes mosquitto_passwd's `$7$` format that
//! `auth.password_file` reads, mode 0600, never showing the password.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use saguin::config::PasswordFile;

fn passwd(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("passwd")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        // A command refused before it reads stdin closes it: not an error.
        if let Err(e) = input.write_all(text.as_bytes()) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
        }
    }
    drop(input);
    child.wait_with_output().expect("wait")
}

fn all_output(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[test]
fn saguin_passwd_writes_the_format_the_broker_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("passwords");
    let f = file.to_str().expect("utf-8");

    // -b: batch, a new file.
    let out = passwd(&["-b", f, "alice", "wonder land"], None);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert_eq!(mode(&file), 0o600);
    let text = std::fs::read_to_string(&file).expect("read");
    assert!(text.starts_with("alice:$7$101$"), "{text}");
    assert!(!all_output(&out).contains("wonder land"), "password shown");

    // Without -b and without a terminal: one line of stdin.
    let out = passwd(&[f, "bob"], Some("builder\n"));
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(!all_output(&out).contains("builder"), "password shown");
    let loaded = PasswordFile::load(&file).expect("the broker's reader reads it");
    assert!(saguin::broker::auth::check_password(
        &loaded,
        "alice",
        b"wonder land"
    ));
    assert!(saguin::broker::auth::check_password(
        &loaded, "bob", b"builder"
    ));
    assert!(!saguin::broker::auth::check_password(
        &loaded,
        "bob",
        b"builder\n"
    ));

    // Changing a password keeps the other lines, comments and order.
    let mut text = std::fs::read_to_string(&file).expect("read");
    text.insert_str(0, "# site 17\n");
    std::fs::write(&file, &text).expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = passwd(&["-b", "-I", "1000", f, "alice", "new one"], None);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert_eq!(mode(&file), 0o600, "replaced with mode 0600");
    let after = std::fs::read_to_string(&file).expect("read");
    let lines: Vec<&str> = after.lines().collect();
    assert_eq!(lines.len(), 3, "{after}");
    assert_eq!(lines[0], "# site 17");
    assert!(lines[1].starts_with("alice:$7$1000$"), "{after}");
    assert_eq!(lines[2], text.lines().nth(2).expect("bob's line"));
    let loaded = PasswordFile::load(&file).expect("reads");
    assert!(saguin::broker::auth::check_password(
        &loaded, "alice", b"new one"
    ));
    assert!(!saguin::broker::auth::check_password(
        &loaded,
        "alice",
        b"wonder land"
    ));

    // -D deletes; a user who is not there is named, nothing changes.
    let out = passwd(&["-D", f, "bob"], None);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(!std::fs::read_to_string(&file)
        .expect("read")
        .contains("bob:"));
    let before = std::fs::read(&file).expect("read");
    let out = passwd(&["-D", f, "bob"], None);
    assert_eq!(out.status.code(), Some(3));
    assert!(all_output(&out).contains("no user named \"bob\""));
    assert_eq!(std::fs::read(&file).expect("read"), before);

    // A configuration naming the file is valid, and the broker's loader
    // is the one that read it.
    let yaml = dir.path().join("saguin.yaml");
    std::fs::write(
        &yaml,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  password_file: passwords\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["check-config", "--config"])
        .arg(&yaml)
        .output()
        .expect("check-config");
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
}

#[test]
fn saguin_passwd_upgrades_a_plain_text_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("passwords");
    let f = file.to_str().expect("utf-8");
    let hashed = saguin::broker::auth::hash_password(b"kept", 101).expect("hash");
    std::fs::write(
        &file,
        format!("# plain\nalice:secret one\ncarol:{hashed}\n"),
    )
    .expect("write");

    // Without -U a plain-text line is refused by line, never by its text.
    let out = passwd(&["-b", f, "bob", "x"], None);
    assert_eq!(out.status.code(), Some(1));
    let shown = all_output(&out);
    assert!(shown.contains("line 2"), "{shown}");
    assert!(!shown.contains("secret one"), "{shown}");

    let out = passwd(&["-U", f], None);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(all_output(&out).contains("hashed 1 plain-text password"));
    let text = std::fs::read_to_string(&file).expect("read");
    assert!(!text.contains("secret one"));
    assert!(
        text.contains(&format!("carol:{hashed}")),
        "hashed lines kept"
    );
    let loaded = PasswordFile::load(&file).expect("reads");
    assert!(saguin::broker::auth::check_password(
        &loaded,
        "alice",
        b"secret one"
    ));
    assert!(saguin::broker::auth::check_password(
        &loaded, "carol", b"kept"
    ));
    assert_eq!(mode(&file), 0o600);
}

#[test]
fn saguin_passwd_usage_errors_exit_2_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("passwords");
    let f = file.to_str().expect("utf-8");
    for args in [
        &["-b", f, "a:b", "pw"][..],
        &["-b", f, "alice"][..],
        &["-b", f, "alice", ""][..],
        &[f, "alice", "pw"][..],
        &["-U", f, "alice"][..],
        &["-D", f][..],
        &["-b", "-D", f, "alice", "pw"][..],
        &["-b", "-I", "0", f, "alice", "pw"][..],
        &[f][..],
    ] {
        let out = passwd(args, Some("pw\n"));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", all_output(&out));
    }
    assert!(!file.exists(), "nothing was written");
    let out = passwd(&["-U", f], None);
    assert_eq!(out.status.code(), Some(3), "-U of a missing file");
    let out = passwd(&[f, "alice"], Some("\n"));
    assert_eq!(out.status.code(), Some(2), "an empty password from stdin");
}

#[test]
fn a_directory_as_the_password_file_is_refused_before_a_password_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8");
    let refusal = format!("saguin: passwd {d}: not a regular file");
    // Empty stdin: the directory is named, not the empty password it would
    // otherwise have read.
    for args in [&[d, "alice"][..], &["-b", d, "alice", "pw"][..]] {
        let out = passwd(args, None);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", all_output(&out));
        assert!(
            all_output(&out).contains(&refusal),
            "{args:?}: {}",
            all_output(&out)
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("list").count(),
        0,
        "nothing was written in it"
    );
}
