//! `saguin sqlite dump` on databases on disk: the overview and a channel's
//! records in human, JSON and NDJSON form; beside a provider that is open
//! and writing; refusals.

use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use bytes::Bytes;
use saguin::storage::contract::{Position, Provider, Reader};
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
use saguin_format::model::{ChannelKind, Record, UserProperty};
use serde_json::Value;

fn dump(db: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["sqlite", "dump"])
        .arg(db)
        .args(extra)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A provider with an append channel (one binary payload), a latest channel
/// and a queue, left open so its commits sit in the write-ahead log.
fn provider(dir: &Path) -> (SqliteProvider, PathBuf) {
    let db = dir.join("saguin.db");
    let p = SqliteProvider::open(SqliteOptions::new("db", &db)).unwrap();
    let t = p.open_channel("telemetry", ChannelKind::Append).unwrap();
    let t = t.as_append().unwrap();
    for i in 1..=10 {
        let mut r = Record::new(
            format!("telemetry/s{i}"),
            Bytes::from(format!("reading {i}")),
        );
        r.timestamp = 1_767_225_600_000_000_000 + i;
        r.user_properties.push(UserProperty {
            name: "unit".into(),
            value: "C".into(),
        });
        t.append(r).unwrap();
    }
    t.append(Record::new(
        "telemetry/bin",
        Bytes::from_static(&[0, 1, 0xfe, 0xff]),
    ))
    .unwrap();
    t.save_position(Position {
        reader: Reader::mqtt("dash").unwrap(),
        offset: 4,
        saved_at: saguin::storage::contract::now_nanos(),
        session_expiry: Some(600),
    })
    .unwrap();
    let l = p.open_channel("state", ChannelKind::Latest).unwrap();
    l.as_latest()
        .unwrap()
        .set(Record::new("state/a", "on"))
        .unwrap();
    let q = p.open_channel("jobs", ChannelKind::Queue).unwrap();
    let q = q.as_queue().unwrap();
    q.enqueue(Record::new("jobs/1", "a")).unwrap();
    q.enqueue(Record::new("jobs/2", "b")).unwrap();
    q.lease(1, "w", i64::MAX, 1_767_225_600_000_000_000)
        .unwrap();
    (p, db)
}

#[test]
fn the_overview_beside_a_running_provider_human_json_and_ndjson() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, db) = provider(tmp.path());

    let out = dump(&db, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("schema version 20"), "{s}");
    for needle in [
        "telemetry",
        "append",
        "state",
        "latest",
        "jobs",
        "queue",
        "jobs.dlq",
        "mqtt:dash",
        "600s",
    ] {
        assert!(s.contains(needle), "{needle} missing from\n{s}");
    }

    let out = dump(&db, &["--json"]);
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let telemetry = doc["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "telemetry")
        .unwrap();
    assert_eq!(telemetry["next"], 12, "commits still in the WAL are seen");
    assert_eq!(telemetry["records"], 11);
    assert_eq!(doc["positions"][0]["reader"], "mqtt:dash");
    assert_eq!(doc["sessions"], serde_json::json!([]));
    let jobs = &doc["queues"][0];
    assert_eq!(
        (jobs["depth"].as_u64(), jobs["delivered"].as_u64()),
        (Some(2), Some(1))
    );

    let out = dump(&db, &["--ndjson"]);
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "database");
    assert_eq!(lines.iter().filter(|l| l["type"] == "channel").count(), 4);
    assert_eq!(lines.iter().filter(|l| l["type"] == "queue").count(), 1);
    drop(p);
}

#[test]
fn a_channels_records_from_an_offset_with_a_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, db) = provider(tmp.path());

    let out = dump(
        &db,
        &["--channel", "telemetry", "--from", "9", "--limit", "5"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("reading 9") && s.contains("reading 10"), "{s}");
    assert!(!s.contains("reading 8"), "{s}");
    assert!(s.contains("hex:0001feff"), "binary payloads in hex: {s}");
    assert!(s.contains("unit=C"), "{s}");
    assert!(s.contains("2026-01-01T00:00:00.000000009Z"), "{s}");
    assert!(s.contains("3 records listed from offset 9"), "{s}");

    let out = dump(&db, &["--channel", "telemetry", "--json", "--limit", "2"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["records"].as_array().unwrap().len(), 2);
    assert_eq!(doc["records"][0]["offset"], 1);
    assert_eq!(doc["records"][0]["payload_text"], "reading 1");
    assert_eq!(doc["records"][0]["payload_hex"], hex::encode("reading 1"));
    assert_eq!(
        doc["records"][0]["user_properties"],
        serde_json::json!([{"name": "unit", "value": "C"}])
    );

    let out = dump(&db, &["--channel", "telemetry", "--ndjson", "--from", "11"]);
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["payload_text"], Value::Null);
    assert_eq!(lines[0]["payload_hex"], "0001feff");

    let out = dump(&db, &["--channel", "jobs", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["records"][0]["attempts"], 1);
    assert_eq!(doc["records"][1]["attempts"], 0);

    let out = dump(&db, &["--channel", "nosuch"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stderr).contains("no channel named \"nosuch\""));
    drop(p);
}

#[test]
fn a_missing_database_is_exit_3_and_is_not_created() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("nowhere.db");
    let out = dump(&db, &[]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("no such database"),
        "{}",
        text(&out.stderr)
    );
    assert!(!db.exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn another_schema_version_is_refused_with_the_providers_own_sentence() {
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
    let provider_line = SqliteProvider::open(SqliteOptions::new("db", &db))
        .unwrap_err()
        .to_string();
    let out = dump(&db, &["--json"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty());
    assert_eq!(text(&out.stderr).trim(), format!("saguin: {provider_line}"));
    assert!(
        provider_line.contains("schema version 5"),
        "{provider_line}"
    );
}

/// Human output shows client-supplied text (topics, user
/// properties, readers, payloads) with control characters escaped, so an
/// ESC sequence cannot rewrite the operator's terminal; JSON carries the
/// text exactly.
#[test]
fn control_characters_are_escaped_in_human_output_and_exact_in_json() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("saguin.db");
    let p = SqliteProvider::open(SqliteOptions::new("db", &db)).unwrap();
    let t = p.open_channel("telemetry", ChannelKind::Append).unwrap();
    let t = t.as_append().unwrap();
    let topic = "telemetry/\u{1b}[2J\u{1b}[H";
    let mut r = Record::new(topic, Bytes::from("ok\u{1b}]0;pwned\u{7}"));
    r.user_properties.push(UserProperty {
        name: "unit\r".into(),
        value: "\u{9b}31m".into(),
    });
    t.append(r).unwrap();
    if let Ok(reader) = Reader::mqtt("dash\u{1b}[2J") {
        t.save_position(Position {
            reader,
            offset: 1,
            saved_at: 1_767_225_600_000_000_000,
            session_expiry: Some(60),
        })
        .unwrap();
    }
    drop(p);

    for args in [&[][..], &["--channel", "telemetry"][..]] {
        let out = dump(&db, args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let shown = text(&out.stdout);
        assert!(
            !shown.chars().any(|c| c.is_control() && c != '\n'),
            "{args:?}: a raw control character reached the terminal:\n{shown:?}"
        );
        if !args.is_empty() {
            assert!(shown.contains(r"telemetry/\u{1b}[2J\u{1b}[H"), "{shown}");
            assert!(shown.contains(r"unit\r=\u{9b}31m"), "{shown}");
        }
    }
    let out = dump(&db, &["--channel", "telemetry", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["records"][0]["topic"], topic);
    assert_eq!(
        doc["records"][0]["user_properties"][0]["value"],
        "\u{9b}31m"
    );

    // The same through a snapshot directory and `snapshot inspect`.
    let dir = tmp.path().join("snapshots");
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["migrate", "to-snapshots"])
        .arg(&db)
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["snapshot", "inspect", "--records"])
        .arg(&dir)
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    assert!(
        !shown.chars().any(|c| c.is_control() && c != '\n'),
        "snapshot inspect: a raw control character reached the terminal:\n{shown:?}"
    );
    assert!(shown.contains(r"\u{1b}[2J"), "{shown}");
}

/// `--json` without `--channel` carries everything the overview
/// counts, in full: each session's subscriptions with their options, its
/// in-flight entries and Will, every held publish and every shared group.
#[test]
fn the_json_overview_carries_sessions_held_publishes_and_groups_in_full() {
    use saguin::storage::contract::{
        HeldPublish, InflightEntry, InflightPhase, SessionEntry, ShareGroupEntry, ShareGroupKey,
        SubscriptionEntry, WillEntry,
    };
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("saguin.db");
    let p = SqliteProvider::open(SqliteOptions::new("db", &db)).unwrap();
    let log = p.broadcast_log().unwrap();
    for i in 1..=3 {
        log.append(Record::new(format!("news/{i}"), "x")).unwrap();
    }
    let group = ShareGroupKey {
        group: "workers".into(),
        filter: "jobs/#".into(),
    };
    p.sessions()
        .unwrap()
        .save(SessionEntry {
            client_id: "dev-1".into(),
            principal: Some("alice".into()),
            expiry_interval: 3600,
            detached_at: 1_767_225_600_000_000_000,
            subscriptions: vec![SubscriptionEntry {
                filter: "cmd/dev-1/#".into(),
                qos: 2,
                no_local: true,
                retain_as_published: true,
                retain_handling: 1,
                subscription_id: Some(7),
                log_offset: 1,
            }],
            will: Some(WillEntry {
                topic: "status/dev-1".into(),
                payload: Bytes::from("offline"),
                qos: 1,
                retain: true,
                delay_interval: 30,
                props: Default::default(),
                user_properties: vec![UserProperty {
                    name: "why".into(),
                    value: "gone".into(),
                }],
            }),
            window: 16,
            inflight: vec![InflightEntry {
                log_offset: 2,
                packet_id: 11,
                qos: 2,
                phase: InflightPhase::AwaitingComp,
                shared_group: Some(group.clone()),
            }],
        })
        .unwrap();
    p.held_publishes()
        .unwrap()
        .hold(HeldPublish {
            channel: "$saguin/broadcast".into(),
            client_id: "dev-1".into(),
            packet_id: 5,
            held_at: 1_767_225_600_000_000_000,
            record: {
                let mut r = Record::new("news/held", "pending");
                r.qos = 2;
                r
            },
        })
        .unwrap();
    log.save_share_group(ShareGroupEntry {
        key: group,
        cursor: 3,
        returned: vec![2, 1],
    })
    .unwrap();
    drop(log);
    drop(p);

    let out = dump(&db, &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &doc["sessions"][0];
    assert_eq!(s["subscriptions"], 1, "the summary's count stays");
    let sub = &s["subscription_list"][0];
    assert_eq!(
        (
            &sub["filter"],
            &sub["qos"],
            &sub["no_local"],
            &sub["retain_as_published"],
            &sub["retain_handling"],
            &sub["subscription_id"]
        ),
        (
            &Value::from("cmd/dev-1/#"),
            &Value::from(2),
            &Value::from(true),
            &Value::from(true),
            &Value::from(1),
            &Value::from(7)
        )
    );
    let inflight = &s["inflight_list"][0];
    assert_eq!(inflight["packet_id"], 11);
    assert_eq!(inflight["phase"], "awaiting PUBCOMP");
    assert_eq!(inflight["shared_group"]["group"], "workers");
    assert_eq!(s["will"]["topic"], "status/dev-1");
    assert_eq!(s["will"]["payload_text"], "offline");
    assert_eq!(s["will"]["delay_interval"], 30);
    assert_eq!(s["will"]["user_properties"][0]["value"], "gone");
    assert_eq!(doc["held_publishes"], 1);
    let held = &doc["held_publish_list"][0];
    assert_eq!(held["client_id"], "dev-1");
    assert_eq!(held["packet_id"], 5);
    assert_eq!(held["topic"], "news/held");
    assert_eq!(held["payload_text"], "pending");
    assert_eq!(doc["share_groups"], 1);
    let g = &doc["share_group_list"][0];
    assert_eq!(g["cursor"], 3);
    assert_eq!(g["filter"], "jobs/#");
    assert_eq!(g["returned"].as_array().map(Vec::len), Some(2));

    let out = dump(&db, &["--ndjson"]);
    let kinds: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["type"].to_string())
        .collect();
    assert!(kinds.contains(&"\"held_publish\"".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"\"share_group\"".to_string()), "{kinds:?}");
}

/// An offset is a signed 64-bit integer in SQLite, so a `--from` past
/// i64::MAX can name no record of any database: it is refused as usage,
/// naming the option and the largest offset taken, where a `--limit` that
/// large only means every record.
#[test]
fn a_from_past_the_largest_sqlite_offset_is_a_usage_error_and_a_limit_that_large_lists_all() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, db) = provider(tmp.path());

    for from in ["9223372036854775808", "18446744073709551615"] {
        let out = dump(&db, &["--channel", "telemetry", "--from", from]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(out.stdout.is_empty());
        let err = text(&out.stderr);
        assert!(err.contains("--from"), "{err}");
        assert!(err.contains("9223372036854775807"), "{err}");
        assert!(
            !err.contains("conversion attempted"),
            "the bound, not SQLite's binding, is named: {err}"
        );
    }

    let out = dump(
        &db,
        &["--channel", "telemetry", "--from", "9223372036854775807"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("0 records listed"));

    for limit in ["9223372036854775808", "18446744073709551615"] {
        let out = dump(&db, &["--channel", "telemetry", "--limit", limit]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("11 records listed from offset 1"),
            "{}",
            text(&out.stdout)
        );
    }
    drop(p);
}
