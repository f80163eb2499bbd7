//! `saguin snapshot inspect` as a process, human and JSON, on the MBMQTT01
//! goldens and on format 21 files and directories written at test time.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use saguin_format::channel_name::{BROADCAST_FILE, MANIFEST_FILE, SESSIONS_FILE};
use saguin_format::f21::{
    self, BroadcastFile, ChannelFile, Manifest, ManifestEntry, Position, SessionsFile, SnapshotFile,
};
use saguin_format::model::{ChannelKind, Record, UserProperty};
use serde_json::Value;

const T: i64 = 1_767_225_600_000_000_000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn saguin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn fixture(name: &str) -> String {
    root()
        .join("fixtures/mbmqtt")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn mbmqtt_v3_human() {
    let out = saguin(&["snapshot", "inspect", &fixture("broker-v3.snapshot")]);
    assert_eq!(out.status.code(), Some(0));
    let s = stdout(&out);
    assert!(
        s.contains("MBMQTT01 broker.snapshot, Disk V3: 2 sessions, 2 retained messages"),
        "{s}"
    );
    assert!(s.contains("sensor-17") && s.contains("plant-a") && s.contains("2026-01-01T00:00:00Z"));
    assert!(s.contains("[7, 9]"));
    assert!(s.contains("cmd/sensor-17/#"));
    assert!(s.contains("status/héllo"));
    // Messages only with --records.
    assert!(!s.contains("cmd/sensor-17/reboot"));
    let out = saguin(&[
        "snapshot",
        "inspect",
        "--records",
        &fixture("broker-v3.snapshot"),
    ]);
    let s = stdout(&out);
    assert!(
        s.contains("cmd/sensor-17/reboot") && s.contains("\"now\""),
        "{s}"
    );
    assert!(
        s.contains("hex:000102ff"),
        "binary payloads are shown as hex: {s}"
    );
    assert!(s.contains("await-pubcomp"));
}

#[test]
fn mbmqtt_json_shows_the_conversions() {
    let out = saguin(&[
        "snapshot",
        "inspect",
        "--json",
        &fixture("broker-v1.snapshot"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let doc = json(&out);
    assert_eq!(doc["type"], "mbmqtt01");
    assert_eq!(doc["valid"], true);
    assert_eq!(doc["header"]["version"], 1);
    let s = &doc["contents"]["sessions"][0];
    assert_eq!(s["client_id"], "legacy-1");
    assert_eq!(s["principal"], Value::Null);
    assert_eq!(s["legacy_anonymous"], true);
    assert_eq!(s["detach_millis"], Value::Null);
    assert_eq!(s["inbound_qos2"], serde_json::json!([]));
    assert_eq!(s["inflight"][0]["phase"], "await-puback");
    assert_eq!(s["inflight"][0]["message"]["qos"], 1);
    assert_eq!(s["pending"][0]["payload_text"], "3");
    assert_eq!(doc["files"], serde_json::json!([]));

    let out = saguin(&[
        "snapshot",
        "inspect",
        "--json",
        &fixture("broker-v2.snapshot"),
    ]);
    let doc = json(&out);
    let s = &doc["contents"]["sessions"][0];
    assert_eq!(s["principal"], "utility");
    assert_eq!(s["detach_millis"], 1_700_000_000_123u64);
    assert_eq!(s["pending"][1]["qos"], 1);
    assert_eq!(doc["contents"]["retained"][0]["topic"], "broadcast");
}

#[test]
fn damaged_file_exits_1_and_names_the_problem() {
    let p = root().join("fixtures/damaged/mbmqtt/crc-wrong.snapshot");
    let out = saguin(&["snapshot", "inspect", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "snapshot {}: legacy MBMQTT01 broker.snapshot, not a saguin snapshot: CRC mismatch",
            p.display()
        )),
        "{err}"
    );
    let out = saguin(&["snapshot", "inspect", "--json", p.to_str().unwrap()]);
    let doc = json(&out);
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["problem"]["code"], "crc-mismatch");
    let out = saguin(&["snapshot", "inspect", "/nonexistent/broker.snapshot"]);
    assert_eq!(out.status.code(), Some(3));
}

fn telemetry() -> ChannelFile {
    let mut c = ChannelFile::new("telemetry", ChannelKind::Append);
    for i in 1..=3u64 {
        let mut r = Record::new("telemetry/dev1/temp", format!("{}", 20 + i).into_bytes());
        r.offset = i;
        r.timestamp = T + i as i64 * 1_000_000_000;
        r.qos = 1;
        r.client_id = "dev1".into();
        if i == 2 {
            r.payload = vec![0u8, 159, 146, 150].into();
            r.user_properties.push(UserProperty {
                name: "unit".into(),
                value: "C".into(),
            });
            r.props.content_type = Some("application/octet-stream".into());
        }
        c.bytes += r.accounted_size();
        c.records.push(r);
    }
    c.next = 4;
    c.positions.push(Position {
        reader: "mqtt:dash".into(),
        offset: 2,
        saved_at: T,
        session_expiry: Some(3600),
    });
    c
}

fn put(dir: &Path, name: &str, file: &SnapshotFile, at: i64) {
    std::fs::write(
        dir.join(name),
        f21::encode_with_writer(file, "0123456789ab", at),
    )
    .unwrap();
}

#[test]
fn format_21_channel_file_with_records() {
    let d = tempfile::tempdir().unwrap();
    put(
        d.path(),
        "telemetry.snapshot",
        &SnapshotFile::Channel(telemetry()),
        T,
    );
    let p = d.path().join("telemetry.snapshot");
    let p = p.to_str().unwrap();

    let out = saguin(&["snapshot", "inspect", "--records", "--limit", "2", p]);
    assert_eq!(out.status.code(), Some(0));
    let s = stdout(&out);
    assert!(
        s.contains("0123456789ab") && s.contains("2026-01-01T00:00:00Z"),
        "{s}"
    );
    assert!(s.contains("telemetry") && s.contains("append"));
    assert!(s.contains("mqtt:dash"));
    assert!(s.contains("\"21\"") && s.contains("hex:009f9296"), "{s}");
    assert!(s.contains("unit=C") && s.contains("content-type=application/octet-stream"));
    // --limit 2: the third record is not listed.
    assert!(!s.contains("\"23\""), "{s}");

    let out = saguin(&["snapshot", "inspect", "--json", "--records", p]);
    let doc = json(&out);
    assert_eq!(doc["type"], "f21");
    assert_eq!(doc["header"]["format"], 21);
    assert_eq!(doc["header"]["kind"], "channel");
    assert_eq!(doc["header"]["writer"], "0123456789ab");
    assert_eq!(doc["header"]["written_at"], "2026-01-01T00:00:00Z");
    let c = &doc["contents"];
    assert_eq!(c["channel"], "telemetry");
    assert_eq!(
        (c["next"].as_u64(), c["floor"].as_u64()),
        (Some(4), Some(1))
    );
    assert_eq!(c["records"].as_array().unwrap().len(), 3);
    assert_eq!(c["records"][0]["payload_text"], "21");
    assert_eq!(c["records"][1]["payload_text"], Value::Null);
    assert_eq!(c["records"][1]["payload_hex"], "009f9296");
    assert_eq!(c["records"][1]["user_properties"][0]["name"], "unit");
    assert_eq!(c["records"][0]["time"], "2026-01-01T00:00:01Z");
    assert_eq!(c["positions"][0]["reader"], "mqtt:dash");

    // Without --records, no record list at all, and the count of them all.
    let doc = json(&saguin(&["snapshot", "inspect", "--json", p]));
    assert!(doc["contents"].get("records").is_none());
    assert_eq!(doc["contents"]["record_count"], 3);
    // --limit cuts the rows shown, not the count.
    let doc = json(&saguin(&[
        "snapshot",
        "inspect",
        "--json",
        "--records",
        "--limit",
        "2",
        p,
    ]));
    assert_eq!(doc["contents"]["records"].as_array().unwrap().len(), 2);
    assert_eq!(doc["contents"]["record_count"], 3);

    // --channel naming another channel is refused.
    let out = saguin(&["snapshot", "inspect", "--channel", "other", p]);
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn another_format_version_shows_its_header() {
    let d = tempfile::tempdir().unwrap();
    let mut bytes = f21::encode_with_writer(&SnapshotFile::Channel(telemetry()), "0123456789ab", T);
    bytes[8..12].copy_from_slice(&20u32.to_le_bytes());
    let p = d.path().join("telemetry.snapshot");
    std::fs::write(&p, &bytes).unwrap();
    let out = saguin(&["snapshot", "inspect", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("20"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!(
        "snapshot {}: format 20 (written by saguin 0123456789ab at 2026-01-01T00:00:00Z); this build reads format 21",
        p.display()
    )), "{err}");
    let doc = json(&saguin(&[
        "snapshot",
        "inspect",
        "--json",
        p.to_str().unwrap(),
    ]));
    assert_eq!(doc["header"]["format"], 20);
    assert_eq!(doc["problem"]["code"], "other-version");
}

#[test]
fn a_directory_with_manifest_findings() {
    let d = tempfile::tempdir().unwrap();
    let manifest = Manifest {
        began_at: T,
        channels: vec![
            ManifestEntry {
                channel: "telemetry".into(),
                file_name: "telemetry.snapshot".into(),
                kind: ChannelKind::Append,
            },
            ManifestEntry {
                channel: "jobs".into(),
                file_name: "jobs.snapshot".into(),
                kind: ChannelKind::Queue,
            },
        ],
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
    // Written by an earlier shutdown.
    put(
        d.path(),
        "telemetry.snapshot",
        &SnapshotFile::Channel(telemetry()),
        T - 60_000_000_000,
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
    std::fs::write(d.path().join("jobs.snapshot.tmp"), b"partial").unwrap();
    let dir = d.path().to_str().unwrap();

    let out = saguin(&["snapshot", "inspect", dir]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = stdout(&out);
    assert!(
        s.contains("manifest: shutdown began at 2026-01-01T00:00:00Z, 2 channels listed"),
        "{s}"
    );
    assert!(
        s.contains("WARN") && s.contains("jobs.snapshot: listed by the manifest and not there")
    );
    assert!(s.contains("telemetry.snapshot: written at 2025-12-31T23:59:00Z, before the shutdown"));
    assert!(s.contains("jobs.snapshot.tmp: a temporary file"));

    let out = saguin(&["snapshot", "inspect", "--json", dir]);
    assert_eq!(out.status.code(), Some(0));
    let doc = json(&out);
    assert_eq!(doc["type"], "directory");
    // A broker starts on it, and records are gone: shown, and not valid.
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["manifest"]["channels"][1]["channel"], "jobs");
    let codes: Vec<&str> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    for c in [
        "listed-but-missing",
        "written-before-manifest",
        "leftover-temp",
    ] {
        assert!(codes.contains(&c), "{codes:?}");
    }
    let files = doc["files"].as_array().unwrap();
    assert_eq!(files.len(), 4);
    let telemetry = files
        .iter()
        .find(|f| f["name"] == "telemetry.snapshot")
        .unwrap();
    assert_eq!(telemetry["status"], "ok");
    assert_eq!(telemetry["contents"]["record_count"], 3);

    // --channel: only that channel's file.
    let doc = json(&saguin(&[
        "snapshot",
        "inspect",
        "--json",
        "--channel",
        "telemetry",
        dir,
    ]));
    assert_eq!(doc["files"].as_array().unwrap().len(), 1);

    // A refused directory: sessions without their log.
    std::fs::remove_file(d.path().join(BROADCAST_FILE)).unwrap();
    let out = saguin(&["snapshot", "inspect", dir]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("FAIL"));
}

#[test]
fn every_format_21_fixture_inspects() {
    // The golden files are part of the repository: a missing directory is
    // a failure, not a test with nothing to check.
    let f21 = root().join("fixtures/f21");
    let mut paths = vec![f21.join("dir")];
    for e in std::fs::read_dir(&f21).expect("fixtures/f21 is in the repository") {
        let p = e.unwrap().path();
        if p.is_file() {
            paths.push(p);
        }
    }
    assert!(
        paths.len() > 1,
        "no format 21 files under {}: {paths:?}",
        f21.display()
    );
    for p in paths {
        let p = p.to_str().unwrap();
        for extra in [
            &[][..],
            &["--records"][..],
            &["--json"][..],
            &["--json", "--records", "--limit", "1"][..],
        ] {
            let mut args = vec!["snapshot", "inspect", p];
            args.extend_from_slice(extra);
            let out = saguin(&args);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            if extra.contains(&"--json") {
                let doc = json(&out);
                assert_eq!(doc["valid"], true);
                assert!(doc["findings"].is_array() && doc["files"].is_array());
            } else {
                assert!(!out.stdout.is_empty());
            }
        }
    }
}

fn f21_fixture(name: &str) -> String {
    root().join("fixtures/f21").join(name).display().to_string()
}

/// A message object (a record, or a Will) carries its whole payload and
/// every property, in the one shape channel records use.
fn assert_full_message(m: &Value, what: &str) {
    for key in [
        "topic",
        "qos",
        "retain",
        "payload_bytes",
        "payload_text",
        "payload_hex",
        "user_properties",
        "properties",
    ] {
        assert!(m.get(key).is_some(), "{what} lacks {key}: {m}");
    }
    for key in [
        "content_type",
        "response_topic",
        "correlation_data_hex",
        "payload_format_indicator",
        "message_expiry_interval",
    ] {
        assert!(
            m["properties"].get(key).is_some(),
            "{what} lacks properties.{key}: {m}"
        );
    }
    assert!(m["user_properties"].is_array(), "{what}: {m}");
}

fn assert_full_record(r: &Value, what: &str) {
    assert_full_message(r, what);
    for key in ["offset", "time", "client_id", "message_id"] {
        assert!(r.get(key).is_some(), "{what} lacks {key}: {r}");
    }
}

#[test]
fn dead_letters_show_in_full_with_records() {
    let p = f21_fixture("queue.snapshot");
    let doc = json(&saguin(&["snapshot", "inspect", "--json", "--records", &p]));
    let dlq = &doc["contents"]["dead_letter"];
    assert_eq!(dlq["channel"], "jobs.dlq");
    assert_eq!(dlq["record_count"], 1);
    let records = dlq["records"].as_array().expect("dead letter records");
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_full_record(r, "dead letter");
    assert_eq!(r["offset"], 2);
    assert_eq!(r["payload_text"], "img-0");
    assert_eq!(r["payload_hex"], "696d672d30");
    assert_eq!(r["client_id"], "sensor-7");
    assert_eq!(r["bridge"], "uplink");
    assert_eq!(r["properties"]["content_type"], "application/json");

    // Without --records only the count, as for the channel's own records.
    let doc = json(&saguin(&["snapshot", "inspect", "--json", &p]));
    assert!(doc["contents"]["dead_letter"].get("records").is_none());
    assert_eq!(doc["contents"]["dead_letter"]["record_count"], 1);

    let out = saguin(&["snapshot", "inspect", "--records", &p]);
    let s = stdout(&out);
    assert!(
        s.contains("records of jobs.dlq") && s.contains("img-0"),
        "{s}"
    );
}

#[test]
fn held_publishes_show_their_whole_message() {
    for (file, client, packet_id, topic) in [
        ("queue.snapshot", "worker-launcher", 65535, "jobs/encode"),
        ("append.snapshot", "sensor-7", 17, "telemetry/sensor-7/temp"),
        ("saguin.broadcast", "dashboard", 3, "alerts/door/critical"),
    ] {
        let p = f21_fixture(file);
        let doc = json(&saguin(&["snapshot", "inspect", "--json", "--records", &p]));
        let held = doc["contents"]["held"].as_array().expect("held");
        let h = &held[0];
        assert_eq!(h["client_id"], client, "{file}");
        assert_eq!(h["packet_id"], packet_id, "{file}");
        assert_eq!(h["topic"], topic, "{file}");
        assert!(h["held_at"].is_string(), "{file}");
        let r = &h["record"];
        assert_full_record(r, file);
        assert_eq!(r["topic"], topic);
        assert_eq!(r["qos"], 2);
        assert_eq!(r["retain"], true);
        assert_eq!(r["payload_text"], "held until PUBREL");
        assert_eq!(r["properties"]["response_topic"], "replies/sensor-7");
        assert_eq!(r["properties"]["correlation_data_hex"], "000102feff");
        assert_eq!(r["properties"]["message_expiry_interval"], 3600);
        assert_eq!(
            r["user_properties"][1],
            serde_json::json!({"name": "unit", "value": "°C"})
        );

        let s = stdout(&saguin(&["snapshot", "inspect", "--records", &p]));
        assert!(s.contains("exactly-once publishes held"), "{file}: {s}");
        assert!(s.contains("held until PUBREL"), "{file}: {s}");
        assert!(s.contains("response-topic=replies/sensor-7"), "{file}: {s}");
    }
}

#[test]
fn wills_show_payload_and_properties() {
    let p = f21_fixture("saguin.sessions");
    let doc = json(&saguin(&["snapshot", "inspect", "--json", "--records", &p]));
    let will = doc["contents"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|s| s["will"].as_object())
        .map(|w| Value::Object(w.clone()))
        .expect("a session with a Will");
    assert_full_message(&will, "will");
    assert_eq!(will["topic"], "clients/dashboard/gone");
    assert_eq!(will["delay_interval"], 30);
    assert_eq!(will["payload_text"], "dashboard went away");
    assert_eq!(will["properties"]["content_type"], "text/plain");
    assert_eq!(
        will["properties"]["correlation_data_hex"],
        "77696c6c2d636f7272"
    );
    assert_eq!(will["properties"]["message_expiry_interval"], 600);
    assert_eq!(
        will["user_properties"],
        serde_json::json!([{"name": "reason", "value": "lost"}, {"name": "reason", "value": "timeout"}])
    );

    let s = stdout(&saguin(&["snapshot", "inspect", "--records", &p]));
    assert!(
        s.contains("wills:") && s.contains("dashboard went away"),
        "{s}"
    );
    assert!(s.contains("reason=lost, reason=timeout"), "{s}");
}

/// Every code a JSON reader sees is kebab-case, whichever format or check
/// named it.
#[test]
fn every_problem_code_is_kebab_case() {
    let mut paths = Vec::new();
    for dir in ["fixtures/damaged/f21", "fixtures/damaged/mbmqtt"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "snapshot") {
                paths.push(p.display().to_string());
            }
        }
    }
    let mut args = vec!["snapshot", "verify", "--json"];
    args.extend(paths.iter().map(String::as_str));
    let doc = json(&saguin(&args));
    let results = doc["results"].as_array().unwrap();
    assert!(results.len() > 10);
    let mut seen = 0;
    for r in results {
        if let Some(code) = r["problem"]["code"].as_str() {
            seen += 1;
            assert!(
                !code.is_empty()
                    && code
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{code:?} for {}",
                r["path"]
            );
        }
    }
    assert!(seen > 10, "{doc}");
}

/// Without `--records` the summary of a directory holding 5,000
/// retained messages and 500 positions fits a screen, naming what it left
/// out; `--records` lists every row; `--channel nosuch` is exit 3.
#[test]
fn snapshot_inspect_summary_fits_a_screen_and_names_a_missing_channel() {
    let d = tempfile::tempdir().unwrap();
    let mut retained = saguin_format::f21::RetainedFile::default();
    for i in 0..5000u64 {
        let mut r = Record::new(format!("status/device-{i:05}"), b"online".to_vec());
        r.timestamp = T;
        retained.records.push(r);
    }
    let mut channel = telemetry();
    for i in 0..500 {
        channel.positions.push(Position {
            reader: format!("mqtt:consumer-{i:03}"),
            offset: 1,
            saved_at: T,
            session_expiry: Some(60),
        });
    }
    put(
        d.path(),
        saguin_format::channel_name::RETAINED_FILE,
        &SnapshotFile::Retained(retained),
        T,
    );
    put(
        d.path(),
        "telemetry.snapshot",
        &SnapshotFile::Channel(channel),
        T,
    );
    let dir = d.path().display().to_string();

    let out = saguin(&["snapshot", "inspect", &dir]);
    let s = stdout(&out);
    assert!(s.lines().count() < 120, "{} lines:\n{s}", s.lines().count());
    assert!(s.contains("status/device-00000"), "{s}");
    assert!(!s.contains("status/device-04999"), "{s}");
    assert!(
        s.contains("4990 more retained messages (--records lists them all)"),
        "{s}"
    );
    assert!(
        s.contains("491 more positions (--records lists them all)"),
        "{s}"
    );

    let out = saguin(&["snapshot", "inspect", "--records", &dir]);
    let s = stdout(&out);
    assert!(
        s.contains("status/device-04999"),
        "--records lists every row"
    );
    assert!(s.contains("mqtt:consumer-499"));
    assert!(!s.contains("more retained messages"), "{s}");

    let out = saguin(&["snapshot", "inspect", "--channel", "nosuch", &dir]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no channel named \"nosuch\""), "{err}");
    assert!(out.stdout.is_empty());
    let out = saguin(&["snapshot", "inspect", "--channel", "telemetry", &dir]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_empty_directory_is_shown_with_exit_0_and_judged_as_verify_judges_it() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    let finding = format!(
        "FAIL {dir}: the directory holds no channel, retained-store, sessions or broadcast file: nothing in it to verify or keep"
    );

    let out = saguin(&["snapshot", "inspect", dir]);
    assert_eq!(out.status.code(), Some(0));
    let s = stdout(&out);
    assert!(s.contains(&finding), "{s}");
    assert!(!s.contains("WARN"), "{s}");

    let out = saguin(&["snapshot", "inspect", "--json", dir]);
    assert_eq!(out.status.code(), Some(0));
    let doc = json(&out);
    assert_eq!(doc["valid"], false, "{doc:#}");
    let findings = doc["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{doc:#}");
    assert_eq!(findings[0]["code"], "nothing-stored");
    assert_eq!(findings[0]["verdict"], "fail");

    // The same line, and the verdict as an exit status.
    let out = saguin(&["snapshot", "verify", dir]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains(&finding), "{}", stdout(&out));
}

#[test]
fn no_inspected_directory_is_valid_beside_a_finding_whose_verdict_is_fail() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    let valid_agrees = |what: &str| {
        let doc = json(&saguin(&["snapshot", "inspect", "--json", dir]));
        let fails = doc["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["verdict"] == "fail");
        assert_eq!(doc["valid"], !fails, "{what}: {doc:#}");
        let verified = saguin(&["snapshot", "verify", dir]).status.code() == Some(0);
        assert_eq!(doc["valid"], verified, "{what}: {doc:#}");
    };
    valid_agrees("empty");
    // Only a manifest: still nothing stored.
    let manifest = Manifest {
        began_at: T,
        channels: vec![ManifestEntry {
            channel: "telemetry".into(),
            file_name: "telemetry.snapshot".into(),
            kind: ChannelKind::Append,
        }],
        retained: false,
        sessions: false,
        broadcast: false,
    };
    put(
        d.path(),
        MANIFEST_FILE,
        &SnapshotFile::Manifest(manifest),
        T,
    );
    valid_agrees("a manifest alone");
    put(
        d.path(),
        "telemetry.snapshot",
        &SnapshotFile::Channel(telemetry()),
        T,
    );
    valid_agrees("whole");
    let doc = json(&saguin(&["snapshot", "inspect", "--json", dir]));
    assert_eq!(doc["valid"], true, "{doc:#}");
}
