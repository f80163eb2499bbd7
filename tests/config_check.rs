//! `saguin check-config` as a process: exit codes, one stderr line per
//! problem with its YAML path (the golden files in fixtures/config/bad), and
//! `--output` that is deterministic, equal for equivalent configurations,
//! and loads back.

mod broker_support;

use broker_support::volume::memory_backed_dir;
use saguin::storage::file_system::{unkept, Unkept};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn saguin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .output()
        .expect("run saguin")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/config")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 fixture path")
}

/// check-config's answer for the full fixtures: valid, and served - their
/// append, latest and queue channels among it.
const SERVED: i32 = 0;

/// The channels of `stderr` check-config says serve refuses, by YAML path.
fn refused_paths(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains("`saguin serve` refuses"))
        .filter_map(|l| {
            let start = l.find("channels[")?;
            let end = start + l[start..].find("): ")? + 1;
            Some(l[start..end].to_owned())
        })
        .collect()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_bad_fixture_is_refused_with_exactly_its_expected_problems() {
    let bad = fixtures().join("bad");
    let files_dir = fixtures()
        .join("files")
        .canonicalize()
        .expect("fixtures/config/files");
    let mut checked = 0;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&bad)
        .expect("read fixtures/config/bad")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    entries.sort();
    for yaml in entries {
        let expected_path = yaml.with_extension("expected");
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()))
            .replace("{files}", path_str(&files_dir));
        let out = saguin(&["check-config", "--config", path_str(&yaml)]);
        assert_eq!(code(&out), 1, "{}: {}", yaml.display(), stderr(&out));
        assert!(
            out.stdout.is_empty(),
            "{}: stdout: {}",
            yaml.display(),
            stdout(&out)
        );
        let prefix = format!("{}: ", yaml.display());
        let err = stderr(&out);
        let mut lines: Vec<&str> = err.lines().collect();
        let last = lines.pop().expect("a closing line");
        assert!(
            last.starts_with("saguin: ") && last.ends_with("the configuration is invalid"),
            "{last}"
        );
        let problems: Vec<&str> = lines
            .iter()
            .map(|l| {
                l.strip_prefix(&prefix)
                    .unwrap_or_else(|| panic!("a problem line without the file name: {l}"))
            })
            .collect();
        let expected: Vec<&str> = expected.lines().collect();
        assert_eq!(problems, expected, "{}", yaml.display());
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} bad fixtures");
}

#[test]
fn the_rfc_example_problem_line_names_its_yaml_path() {
    let yaml = fixtures().join("bad/missing-provider.yaml");
    let out = saguin(&["check-config", "--config", path_str(&yaml)]);
    assert_eq!(code(&out), 1);
    assert!(
        stderr(&out).contains(r#"channels[2].storage: no provider named "db2""#),
        "{}",
        stderr(&out)
    );
}

#[test]
fn good_fixtures_are_valid_and_summarised() {
    // The full fixtures configure an append, a latest and a queue
    // channel, all served: nothing is refused.
    for (name, expected, refused) in [
        ("full.yaml", SERVED, &[][..] as &[&str]),
        ("full-rewritten.yaml", SERVED, &[][..]),
        ("minimal.yaml", 0, &[][..]),
    ] {
        let yaml = fixtures().join("good").join(name);
        let out = saguin(&["check-config", "--config", path_str(&yaml)]);
        assert_eq!(code(&out), expected, "{name}: {}", stderr(&out));
        assert_eq!(refused_paths(&stderr(&out)), refused, "{name}");
        assert!(
            !stderr(&out).contains("(telemetry)"),
            "the append channel is served"
        );
        assert!(
            stderr(&out)
                .lines()
                .all(|l| l.contains("`saguin serve` refuses")),
            "{name}: {}",
            stderr(&out)
        );
        assert!(stdout(&out).contains(": valid"), "{}", stdout(&out));
    }
    let out = saguin(&[
        "check-config",
        "--config",
        path_str(&fixtures().join("good/full.yaml")),
    ]);
    let text = stdout(&out);
    assert!(
        text.contains("channel telemetry (append) on provider db (sqlite): every commit is kept"),
        "{text}"
    );
    assert!(
        text.contains("less about one flush_interval (150ms) on a power cut"),
        "{text}"
    );
    assert!(text.contains("1048576 pages of 4096 bytes"), "{text}");
    assert!(text.contains("reserve 270336 bytes (66 pages"), "{text}");
    assert!(
        text.contains(
            "retained messages: provider mem (memory): kept as of the last snapshot generation (written to /var/lib/saguin/snapshots 250ms after the last change, at most 2s after a change); a crash, an OOM kill or a power cut loses up to the last 2s"
        ),
        "{text}"
    );

    let out = saguin(&[
        "check-config",
        "--config",
        path_str(&fixtures().join("good/minimal.yaml")),
    ]);
    assert!(
        stdout(&out).contains("this configuration keeps nothing"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn output_is_one_document_on_stdout_with_the_summary_on_stderr() {
    let yaml = fixtures().join("good/full.yaml");
    let out = saguin(&[
        "check-config",
        "--config",
        path_str(&yaml),
        "--output",
        "json",
    ]);
    assert_eq!(code(&out), SERVED, "{}", stderr(&out));
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["limits"]["max_message_size"], 262_144);
    assert_eq!(doc["storage"][0]["name"], "db");
    assert_eq!(doc["storage"][0]["max_bytes"], 4_294_967_296_u64);
    assert_eq!(doc["storage"][0]["flush_interval"], "150ms");
    assert_eq!(doc["storage"][0]["publish_commit_interval"], "none");
    assert_eq!(doc["channels"][0]["name"], "devices");
    let names: Vec<&str> = doc["channels"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|c| c["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["devices", "jobs", "telemetry"], "sorted by name");
    assert!(stderr(&out).contains("valid"));
    assert!(stderr(&out).contains("channel jobs (queue, with its dead-letter channel jobs.dlq)"));

    // Default format is YAML.
    let out = saguin(&["check-config", "--config", path_str(&yaml), "--output"]);
    assert_eq!(code(&out), SERVED);
    let doc: serde_json::Value =
        serde_norway::from_slice(&out.stdout).expect("stdout is one YAML document");
    assert_eq!(doc["log"]["format"], "logfmt");
}

#[test]
fn equivalent_configurations_print_identical_documents() {
    let a = fixtures().join("good/full.yaml");
    let b = fixtures().join("good/full-rewritten.yaml");
    for format in ["yaml", "json"] {
        let out_a = saguin(&["check-config", "--config", path_str(&a), "--output", format]);
        let out_b = saguin(&["check-config", "--config", path_str(&b), "--output", format]);
        let again = saguin(&["check-config", "--config", path_str(&a), "--output", format]);
        assert_eq!(code(&out_a), SERVED, "{}", stderr(&out_a));
        assert_eq!(code(&out_b), SERVED, "{}", stderr(&out_b));
        assert_eq!(stdout(&out_a), stdout(&out_b), "{format}");
        assert_eq!(
            stdout(&out_a),
            stdout(&again),
            "{format}: not deterministic"
        );
    }
}

#[test]
fn the_resolved_document_loads_back_to_itself() {
    let dir = tempfile::tempdir().expect("temp dir");
    for format in ["yaml", "json"] {
        let first = saguin(&[
            "check-config",
            "--config",
            path_str(&fixtures().join("good/full.yaml")),
            "--output",
            format,
        ]);
        assert_eq!(code(&first), SERVED);
        let resolved = dir.path().join(format!("resolved.{format}"));
        std::fs::write(&resolved, &first.stdout).expect("write the resolved document");
        let second = saguin(&[
            "check-config",
            "--config",
            path_str(&resolved),
            "--output",
            format,
        ]);
        assert_eq!(code(&second), SERVED, "{format}: {}", stderr(&second));
        assert_eq!(stdout(&first), stdout(&second), "{format}");
    }
}

#[test]
fn output_redacts_what_the_named_files_hold() {
    let yaml = fixtures().join("good/full.yaml");
    let out = saguin(&[
        "check-config",
        "--config",
        path_str(&yaml),
        "--output",
        "json",
    ]);
    let all = format!("{}{}", stdout(&out), stderr(&out));
    let key = std::fs::read_to_string(fixtures().join("files/server.key")).expect("key");
    let key_body: String = key.lines().nth(1).expect("a key line").to_string();
    assert!(!all.contains(&key_body), "key material printed");
    assert!(!all.contains("BEGIN"), "PEM printed");
    let passwords = std::fs::read_to_string(fixtures().join("files/passwords")).expect("passwords");
    for line in passwords.lines() {
        let hash = line.rsplit('$').next().expect("a hash");
        assert!(!all.contains(hash), "a password hash printed");
    }
    assert!(!all.contains("telemetry/secret"), "ACL contents printed");
    // The paths are configuration and are printed.
    assert!(stdout(&out).contains("files/server.key"));
}

#[test]
fn the_embedded_default_is_valid_and_keeps_nothing() {
    let out = saguin(&["check-config"]);
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains("this configuration keeps nothing"));
    let out = saguin(&["check-config", "--output", "json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["listeners"][0]["bind"], "127.0.0.1:1883");
    assert_eq!(doc["auth"]["allow_anonymous"], true);
    assert_eq!(doc["channels"], serde_json::json!([]));
    assert_eq!(doc["storage"], serde_json::json!([]));
}

#[test]
fn a_file_that_cannot_be_read_exits_3() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nope.yaml");
    let out = saguin(&["check-config", "--config", path_str(&missing)]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("nope.yaml"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());

    let out = saguin(&["check-config", "--config", path_str(dir.path())]);
    assert_eq!(code(&out), 3);
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_file_that_is_not_text_is_invalid_not_unreadable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = dir.path().join("binary.yaml");
    std::fs::write(&binary, b"listeners: \xff\xfe\n").expect("write");
    let out = saguin(&["check-config", "--config", path_str(&binary)]);
    assert_eq!(code(&out), 1);
    assert!(
        stderr(&out).contains("not UTF-8 text (invalid byte at offset 11)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["check-config", "--output", "xml"][..],
        &["check-config", "--no-such-flag"][..],
        &["check-config", "--config"][..],
    ] {
        let out = saguin(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn relative_paths_resolve_against_the_configuration_file_not_the_working_directory() {
    let yaml = fixtures().join("good/full.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .current_dir(std::env::temp_dir())
        .args([
            "check-config",
            "--config",
            path_str(&yaml),
            "--output",
            "json",
        ])
        .output()
        .expect("run saguin");
    assert_eq!(code(&out), SERVED, "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let expected = fixtures().join("files/acl").canonicalize().expect("acl");
    assert_eq!(doc["auth"]["acl_file"], path_str(&expected));
}

/// `--output` carries, for every file the configuration names, the
/// SHA-256 of its bytes (never the bytes), so a diff of two deployments
/// shows a differing password or ACL file.
#[test]
fn output_shows_a_sha256_of_every_named_file() {
    use sha2::{Digest, Sha256};
    let yaml = fixtures().join("good/full.yaml");
    let out = saguin(&[
        "check-config",
        "--config",
        path_str(&yaml),
        "--output",
        "json",
    ]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let digests = doc["file_sha256"]
        .as_object()
        .expect("file_sha256 is a mapping");
    let files = fixtures().join("files");
    let mut expected = Vec::new();
    for name in ["acl", "ca.pem", "passwords", "server.key", "server.pem"] {
        let path = files.join(name).canonicalize().expect("fixture");
        let bytes = std::fs::read(&path).expect("read fixture");
        expected.push((
            path_str(&path).to_string(),
            hex::encode(Sha256::digest(&bytes)),
        ));
    }
    let got: Vec<(String, String)> = digests
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().expect("hex").to_string()))
        .collect();
    assert_eq!(got, expected);

    // A changed password file changes its digest and nothing else.
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["acl", "ca.pem", "passwords", "server.key", "server.pem"] {
        std::fs::copy(files.join(name), dir.path().join(name)).expect("copy");
    }
    let config = std::fs::read_to_string(&yaml)
        .expect("read")
        .replace("../files/", "");
    let copy = dir.path().join("saguin.yaml");
    std::fs::write(&copy, &config).expect("write");
    let before = saguin(&["check-config", "--config", path_str(&copy), "--output"]);
    let mut passwords = std::fs::read_to_string(dir.path().join("passwords")).expect("read");
    passwords.push_str("# rotated\n");
    std::fs::write(dir.path().join("passwords"), passwords).expect("write");
    let after = saguin(&["check-config", "--config", path_str(&copy), "--output"]);
    let (before, after) = (stdout(&before), stdout(&after));
    let changed: Vec<(&str, &str)> = before
        .lines()
        .zip(after.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(changed[0].0.contains("passwords"), "{changed:?}");
}

/// An expired or not-yet-valid listener certificate is a warning
/// naming its dates; the configuration is still valid.
#[test]
fn an_expired_or_not_yet_valid_certificate_is_a_warning_with_its_dates() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut listeners = String::new();
    for (i, (from, until)) in [((2000, 1, 1), (2001, 6, 30)), ((2090, 1, 1), (2091, 1, 1))]
        .into_iter()
        .enumerate()
    {
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        params.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        std::fs::write(dir.path().join(format!("c{i}.pem")), cert.pem()).expect("write");
        std::fs::write(dir.path().join(format!("k{i}.pem")), key.serialize_pem()).expect("write");
        listeners.push_str(&format!(
            "  - name: tls{i}\n    bind: 127.0.0.1:0\n    tls: {{ cert: c{i}.pem, key: k{i}.pem }}\n"
        ));
    }
    let yaml = dir.path().join("saguin.yaml");
    std::fs::write(
        &yaml,
        format!("auth:\n  allow_anonymous: true\nlisteners:\n{listeners}"),
    )
    .expect("write");
    let out = saguin(&["check-config", "--config", path_str(&yaml)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("listeners[0].tls.cert")
            && err.contains("expired: valid from 2000-01-01T00:00:00Z until 2001-06-30T00:00:00Z"),
        "{err}"
    );
    assert!(
        err.contains("listeners[1].tls.cert")
            && err.contains("is not valid yet: valid from 2090-01-01T00:00:00Z"),
        "{err}"
    );
}

/// Checking a configuration of many listeners and providers is
/// linear. A debug build took 136 s on this configuration with the
/// quadratic checks and takes 4.4 s with linear ones; the bound below is
/// the test's own timeout, far above the linear figure on a busy machine.
#[test]
fn check_config_of_a_large_configuration_is_linear() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut text = String::from("auth:\n  allow_anonymous: true\nlisteners:\n");
    for i in 0..120_000u32 {
        text.push_str(&format!(
            "  - name: l{i}\n    bind: 127.{}.{}.{}:{}\n",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255,
            1000 + i % 50_000
        ));
    }
    text.push_str("storage:\n");
    for i in 0..20_000 {
        text.push_str(&format!("  - name: p{i}\n    kind: memory\n"));
    }
    let yaml = dir.path().join("large.yaml");
    std::fs::write(&yaml, text).expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["check-config", "--config", path_str(&yaml)])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait());
    });
    match finished.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(status) => assert_eq!(status.expect("wait").code(), Some(0)),
        Err(_) => {
            // SAFETY: signalling the child this test spawned and has not reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("check-config of 120,000 listeners did not finish in 60 s");
        }
    }
}

#[test]
fn the_channels_served_are_capped_and_a_providers_many_are_tabled_in_short_lines() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = |channels: usize| {
        let mut text = format!(
            "auth:\n  allow_anonymous: true\nlisteners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nstorage:\n  - name: db\n    kind: sqlite\n    file_path: {}\nchannels:\n",
            dir.path().join("saguin.db").display()
        );
        for i in 0..channels {
            text.push_str(&format!("  - {{name: c{i}, kind: append, storage: db}}\n"));
        }
        let yaml = dir.path().join(format!("{channels}.yaml"));
        std::fs::write(&yaml, text).expect("write");
        yaml
    };
    let most = saguin::config::MAX_SERVED_CHANNELS;
    let out = saguin(&["check-config", "--config", path_str(&config(most))]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // The providers table names every channel, in lines the width of a
    // terminal: one line of them all took the table's layout most of a
    // second.
    let table = stdout(&out);
    assert!(table.contains(&format!(" c{},", most - 2)));
    assert!(table.contains(&format!(" c{} ", most - 1)));
    assert!(
        table.lines().all(|l| l.chars().count() < 300),
        "a line of {} characters",
        table.lines().map(|l| l.chars().count()).max().unwrap_or(0)
    );
    let out = saguin(&["check-config", "--config", path_str(&config(most + 1))]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            ": channels: {} channels configured and a dead-letter channel for each of 0 queues make {} to serve; the limit is {most}",
            most + 1,
            most + 1
        )),
        "{}",
        stderr(&out)
    );
}

/// The configuration reference is a generated man page listing
/// every key, and the commented example it shows is a configuration the
/// loader accepts.
#[test]
fn the_configuration_reference_and_its_example() {
    let example = fixtures().join("example.yaml");
    let out = saguin(&["check-config", "--config", path_str(&example)]);
    // Valid, and served whole.
    assert_eq!(code(&out), SERVED, "{}", stderr(&out));
    assert!(refused_paths(&stderr(&out)).is_empty());
    assert!(
        stderr(&out)
            .lines()
            .all(|l| l.contains("`saguin serve` refuses")),
        "{}",
        stderr(&out)
    );
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("man/saguin-config.5"))
            .expect("man/saguin-config.5");
    for key in [
        "listeners[].tls.client_ca",
        "storage[].publish_commit_interval",
        "channels[].dlq_retention_bytes",
        "broker.exactly_once.expires_after",
        "limits.max_sessions",
        "limits.max_retained",
        "limits.max_keep_alive",
        "log.format",
    ] {
        assert!(
            page.contains(&key.replace('-', "\\-")),
            "{key} not in the reference"
        );
    }
    assert!(page.contains("Default: 150ms."), "defaults are listed");
    assert!(
        page.contains("handshake_timeout: 10s"),
        "the example is shown"
    );
}

/// Append channels are served, so a configuration of them alone is valid
/// with nothing refused, whichever provider holds them.
#[test]
fn append_channels_alone_are_valid_and_nothing_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = dir.path().join("saguin.yaml");
    std::fs::write(
        &yaml,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
             auth:\n  allow_anonymous: true\n\
             storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
             \x20 - name: mem\n    kind: memory\n\
             channels:\n  - name: telemetry\n    kind: append\n    storage: db\n    retention_bytes: 1GiB\n    retention_age: 7d\n\
             \x20 - name: logs\n    kind: append\n    storage: mem\n",
            dir.path().join("saguin.db").display()
        ),
    )
    .expect("write config");
    for output in [&[][..], &["--output"][..], &["--output", "json"][..]] {
        let mut args = vec!["check-config", "--config", path_str(&yaml)];
        args.extend_from_slice(output);
        let out = saguin(&args);
        assert_eq!(code(&out), 0, "{output:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("refuses"),
            "{output:?}: {}",
            stderr(&out)
        );
    }
    let out = saguin(&["check-config", "--config", path_str(&yaml)]);
    assert!(stdout(&out).contains(": valid\n"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("channel logs (append) on provider mem (memory): not kept"),
        "{}",
        stdout(&out)
    );
}

/// What check-config accepts, serve serves: a database placed on a file
/// another provider keeps beside its own, or reached through a symlink
/// whose target is not created yet, is refused before serve ever runs,
/// with both keys named.
#[test]
fn check_config_refuses_providers_that_would_meet_on_one_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = "auth:\n  allow_anonymous: true\nlisteners:\n  - name: m\n    bind: 127.0.0.1:0\n";
    std::os::unix::fs::symlink("a.db", dir.path().join("l.db")).expect("symlink");
    for (other, expected) in [
        (
            "a.db-wal",
            "storage[1].file_path: {dir}/a.db-wal is the write-ahead log of storage[0].file_path {dir}/a.db",
        ),
        (
            "a.db.lock",
            "storage[1].file_path: {dir}/a.db.lock is the lock of storage[0].file_path {dir}/a.db",
        ),
        (
            "l.db",
            "storage[1].file_path: {dir}/l.db is also storage[0] (file_path); two providers cannot share a database",
        ),
    ] {
        let yaml = dir.path().join("saguin.yaml");
        std::fs::write(
            &yaml,
            format!(
                "{base}storage:\n  - {{name: p, kind: sqlite, file_path: a.db}}\n  - {{name: q, kind: sqlite, file_path: {other}}}\n\
                 channels:\n  - {{name: x, kind: append, storage: p}}\n  - {{name: y, kind: append, storage: q}}\n"
            ),
        )
        .expect("write");
        let out = saguin(&["check-config", "--config", path_str(&yaml)]);
        assert_eq!(code(&out), 1, "{other}: {}", stderr(&out));
        let expected = expected.replace(
            "{dir}",
            path_str(&dir.path().canonicalize().expect("canonical")),
        );
        assert!(stderr(&out).contains(&expected), "{other}: {}", stderr(&out));
        assert!(
            !dir.path().join("a.db").exists(),
            "check-config created a database"
        );
    }
}

/// The sweep's other refusals, each at its key path: a duration no clock
/// can hold, limits no CONNECT fits, a number beyond 64 bits.
#[test]
fn check_config_names_the_key_of_each_bound() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = "auth:\n  allow_anonymous: true\nlisteners:\n  - name: m\n    bind: 127.0.0.1:0\n";
    for (extra, expected) in [
        (
            "storage: [{name: m, kind: memory}]\nchannels: [{name: t, kind: append, storage: m}]\nbridges: [{name: b, address: \"r:1883\", out: [{channel: t}], reconnect: {base: 18446744073709551615s, cap: 18446744073709551615s}}]\n",
            "bridges[0].reconnect.base: duration \"18446744073709551615s\" is longer than 4294967295s (about 136 years)",
        ),
        (
            "limits: {max_message_size: 1, max_header_bytes: 0}\n",
            "limits.max_message_size: 1 + limits.max_header_bytes 0 = 1 bytes is the largest packet the broker accepts",
        ),
        (
            "storage: [{name: m, kind: memory, max_bytes: 18446744073709551616}]\n",
            "storage[0].max_bytes: the number 18446744073709551616 is too large",
        ),
    ] {
        let yaml = dir.path().join("saguin.yaml");
        std::fs::write(&yaml, format!("{base}{extra}")).expect("write");
        let out = saguin(&["check-config", "--config", path_str(&yaml)]);
        assert_eq!(code(&out), 1, "{extra}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{extra}: {}", stderr(&out));
    }
}

/// A provider whose files would be on tmpfs (an embedded image's volatile
/// `/var`) is valid, and check-config warns of it, naming its path; one on
/// a disk is not warned of. (`serve` logs the same warning as it starts:
/// tests/serve_storage.rs.)
#[test]
fn a_provider_on_a_memory_backed_file_system_is_warned_of() {
    let Some(volatile) =
        memory_backed_dir("a_provider_on_a_memory_backed_file_system_is_warned_of")
    else {
        return;
    };
    let check_with_data_in = |data: &Path| {
        let config = data.join("saguin.yaml");
        std::fs::write(
            &config,
            format!(
                "listeners: [{{name: mqtt, bind: \"127.0.0.1:0\"}}]\nauth: {{allow_anonymous: true}}\n\
                 storage:\n  - {{name: db, kind: sqlite, file_path: {}}}\n\
                 broker: {{session_storage: db}}\n",
                data.join("state").join("saguin.db").display()
            ),
        )
        .unwrap();
        let out = saguin(&["check-config", "--config", path_str(&config)]);
        assert_eq!(code(&out), SERVED, "{}", stderr(&out));
        stderr(&out)
    };
    let err = check_with_data_in(volatile.path());
    let named = format!(
        "warning: storage[0].file_path: {} is on tmpfs, which lives in memory",
        volatile.path().join("state").display()
    );
    assert!(
        err.contains(&named) && err.contains("lost at a reboot or a power cut"),
        "{err}"
    );
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    if unkept(disk.path()).and_then(Unkept::in_memory).is_none() {
        let err = check_with_data_in(disk.path());
        assert!(!err.contains("tmpfs"), "{err}");
    }
}
