//! Files written by an implementation independent of saguin's encoders —
//! format 21 from `format/FORMAT.md` §1–4 alone, MBMQTT01 V1–V3 from
//! `format/FORMAT.md` §5 and the legacy format's own description — kept in
//! `fixtures/independent/` so the documents and the binary stay in step:
//! `snapshot verify` accepts every valid file, `inspect --json` shows exactly
//! the values that writer put in (its `expected.json`), and each file of
//! `refused/` is refused with the code and message its `EXPECTED` names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;

fn independent(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/independent")
        .join(sub)
}

fn saguin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .timeout(Duration::from_secs(60))
        .output()
        .expect("saguin runs")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn expected(sub: &str) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(independent(sub).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn inspect(path: &Path) -> Value {
    let p = path.display().to_string();
    let out = saguin(&["snapshot", "inspect", "--json", "--records", &p]);
    assert_eq!(out.status.code(), Some(0), "inspect {p}");
    let doc = json_of(&out);
    assert_eq!(doc["valid"], true, "{p}");
    assert_eq!(doc["problem"], Value::Null, "{p}");
    doc
}

/// Every file the expected list names, verified in one run: exit 0, each ok.
fn verify_all_ok(sub: &str) -> usize {
    let dir = independent(sub);
    let paths: Vec<String> = expected(sub)
        .keys()
        .map(|name| dir.join(name).display().to_string())
        .collect();
    let mut args = vec!["snapshot", "verify", "--json"];
    args.extend(paths.iter().map(String::as_str));
    let out = saguin(&args);
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{doc:#}");
    for result in doc["results"].as_array().unwrap() {
        assert_eq!(result["status"], "ok", "{result:#}");
    }
    assert_eq!(doc["summary"]["ok"], paths.len());
    paths.len()
}

/// Nanoseconds as the writer stored them; `0` is "not set" and shows as null.
fn is_unset(nanos: &Value) -> bool {
    nanos.as_i64() == Some(0)
}

fn check_record(at: &str, wrote: &Value, shown: &Value) {
    for key in [
        "offset",
        "topic",
        "client_id",
        "qos",
        "retain",
        "shared_copy",
        "bridge",
        "owed_to",
        "message_id",
    ] {
        assert_eq!(shown[key], wrote[key], "{at}.{key}");
    }
    assert_eq!(
        shown["time_unix_nanos"], wrote["timestamp"],
        "{at}.timestamp"
    );
    if is_unset(&wrote["timestamp"]) {
        assert_eq!(shown["time"], Value::Null, "{at}.time");
    }
    assert_eq!(shown["payload_hex"], wrote["payload"], "{at}.payload");
    let users: Vec<Value> = shown["user_properties"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| Value::Array(vec![u["name"].clone(), u["value"].clone()]))
        .collect();
    assert_eq!(
        Value::Array(users),
        wrote["user_properties"],
        "{at}.user_properties"
    );
    let props = &shown["properties"];
    for key in [
        "content_type",
        "response_topic",
        "payload_format_indicator",
        "message_expiry_interval",
    ] {
        assert_eq!(props[key], wrote[key], "{at}.{key}");
    }
    assert_eq!(
        props["correlation_data_hex"], wrote["correlation_data"],
        "{at}.correlation_data"
    );
}

fn check_records(at: &str, wrote: &Value, shown: &Value) {
    let (wrote, shown) = (wrote.as_array().unwrap(), shown.as_array().unwrap());
    assert_eq!(wrote.len(), shown.len(), "{at} count");
    for (i, (w, s)) in wrote.iter().zip(shown).enumerate() {
        check_record(&format!("{at}[{i}]"), w, s);
    }
}

fn check_positions(at: &str, wrote: &Value, shown: &Value) {
    let (wrote, shown) = (wrote.as_array().unwrap(), shown.as_array().unwrap());
    assert_eq!(wrote.len(), shown.len(), "{at} count");
    for (i, (w, s)) in wrote.iter().zip(shown).enumerate() {
        for key in ["reader", "offset", "session_expiry"] {
            assert_eq!(s[key], w[key], "{at}[{i}].{key}");
        }
        if is_unset(&w["saved_at"]) {
            assert_eq!(s["saved_at"], Value::Null, "{at}[{i}].saved_at");
        }
    }
}

fn check_held(at: &str, wrote: &Value, shown: &Value) {
    let (wrote, shown) = (wrote.as_array().unwrap(), shown.as_array().unwrap());
    assert_eq!(wrote.len(), shown.len(), "{at} count");
    for (i, (w, s)) in wrote.iter().zip(shown).enumerate() {
        assert_eq!(s["client_id"], w["client_id"], "{at}[{i}].client_id");
        assert_eq!(s["packet_id"], w["packet_id"], "{at}[{i}].packet_id");
        assert_eq!(s["topic"], w["record"]["topic"], "{at}[{i}].record.topic");
    }
}

fn check_f21(name: &str, wrote: &Value, shown: &Value) {
    let header = &shown["header"];
    assert_eq!(header["format"], 21, "{name}");
    assert_eq!(header["kind"], wrote["kind"], "{name} kind");
    assert_eq!(header["writer"], wrote["writer"], "{name} writer");
    assert_eq!(
        header["written_at_unix_nanos"], wrote["written_at"],
        "{name} written_at"
    );
    let (b, c) = (&wrote["body"], &shown["contents"]);
    match wrote["kind"].as_str().unwrap() {
        "channel" => {
            assert_eq!(c["channel"], b["name"], "{name}");
            assert_eq!(c["channel_kind"], b["kind"], "{name}");
            for key in ["next", "floor", "bytes"] {
                assert_eq!(c[key], b[key], "{name}.{key}");
            }
            check_records(&format!("{name}:records"), &b["records"], &c["records"]);
            let items = b["items"].as_array().unwrap();
            let shown_items = c["items"].as_array().unwrap();
            assert_eq!(items.len(), shown_items.len(), "{name} items");
            for (i, (w, s)) in items.iter().zip(shown_items).enumerate() {
                let at = format!("{name}:items[{i}]");
                check_record(&at, &w["record"], s);
                assert_eq!(s["attempts"], w["attempts"], "{at}.attempts");
                if is_unset(&w["first_delivered"]) {
                    assert_eq!(s["first_delivered"], Value::Null, "{at}");
                }
                if is_unset(&w["last_delivered"]) {
                    assert_eq!(s["last_delivered"], Value::Null, "{at}");
                }
            }
            check_positions(
                &format!("{name}:positions"),
                &b["positions"],
                &c["positions"],
            );
            check_held(&format!("{name}:held"), &b["held"], &c["held"]);
            match (&b["dead_letter"], &c["dead_letter"]) {
                (Value::Null, Value::Null) => {}
                (w, s) => {
                    assert_eq!(s["channel"], w["name"], "{name}:dead_letter");
                    for key in ["next", "floor", "bytes"] {
                        assert_eq!(s[key], w[key], "{name}:dead_letter.{key}");
                    }
                    assert_eq!(
                        s["record_count"],
                        w["records"].as_array().unwrap().len(),
                        "{name}:dead_letter.records"
                    );
                    check_positions(
                        &format!("{name}:dead_letter.positions"),
                        &w["positions"],
                        &s["positions"],
                    );
                }
            }
        }
        "retained" => check_records(&format!("{name}:records"), &b["records"], &c["records"]),
        "broadcast" => {
            for key in ["next", "floor", "bytes"] {
                assert_eq!(c[key], b[key], "{name}.{key}");
            }
            check_records(&format!("{name}:messages"), &b["messages"], &c["records"]);
            check_positions(&format!("{name}:cursors"), &b["cursors"], &c["cursors"]);
            check_held(&format!("{name}:held"), &b["held"], &c["held"]);
        }
        "manifest" => {
            assert_eq!(c["began_at_unix_nanos"], b["began_at"], "{name}");
            for key in ["retained", "sessions", "broadcast"] {
                assert_eq!(c[key], b[key], "{name}.{key}");
            }
            let entries = b["channels"].as_array().unwrap();
            let shown_entries = c["channels"].as_array().unwrap();
            assert_eq!(entries.len(), shown_entries.len(), "{name}");
            for (w, s) in entries.iter().zip(shown_entries) {
                assert_eq!(s["channel"], w["channel"], "{name}");
                assert_eq!(s["file"], w["file_name"], "{name}");
                assert_eq!(s["channel_kind"], w["kind"], "{name}");
            }
        }
        "sessions" => {
            let sessions = b["sessions"].as_array().unwrap();
            let shown_sessions = c["sessions"].as_array().unwrap();
            assert_eq!(sessions.len(), shown_sessions.len(), "{name}");
            for (i, (w, s)) in sessions.iter().zip(shown_sessions).enumerate() {
                let at = format!("{name}:sessions[{i}]");
                for key in [
                    "client_id",
                    "principal",
                    "expiry_interval",
                    "window",
                    "subscriptions",
                ] {
                    assert_eq!(s[key], w[key], "{at}.{key}");
                }
                let inflight = w["inflight"].as_array().unwrap();
                let shown_inflight = s["inflight"].as_array().unwrap();
                assert_eq!(inflight.len(), shown_inflight.len(), "{at}.inflight");
                for (j, (wi, si)) in inflight.iter().zip(shown_inflight).enumerate() {
                    for key in ["log_offset", "packet_id", "qos", "shared_group"] {
                        assert_eq!(si[key], wi[key], "{at}.inflight[{j}].{key}");
                    }
                    let phase = if wi["phase"] == 1 {
                        "awaiting PUBCOMP"
                    } else {
                        "awaiting PUBACK/PUBREC"
                    };
                    assert_eq!(si["phase"], phase, "{at}.inflight[{j}].phase");
                }
                match (&w["will"], &s["will"]) {
                    (Value::Null, Value::Null) => {}
                    (ww, sw) => {
                        for key in ["topic", "qos", "retain", "delay_interval"] {
                            assert_eq!(sw[key], ww[key], "{at}.will.{key}");
                        }
                    }
                }
            }
            let groups = b["shared_groups"].as_array().unwrap();
            let shown_groups = c["shared_groups"].as_array().unwrap();
            assert_eq!(groups.len(), shown_groups.len(), "{name}");
            for (w, s) in groups.iter().zip(shown_groups) {
                assert_eq!(s["group"], w["key"]["group"], "{name}");
                assert_eq!(s["filter"], w["key"]["filter"], "{name}");
                assert_eq!(s["cursor"], w["cursor"], "{name}");
                assert_eq!(s["returned"], w["returned"], "{name}");
            }
        }
        other => panic!("{name}: unexpected kind {other}"),
    }
}

#[test]
fn independent_f21_files_verify() {
    assert_eq!(verify_all_ok("f21"), 12);
}

#[test]
fn independent_f21_inspect_shows_what_was_written() {
    for (name, wrote) in expected("f21") {
        let shown = inspect(&independent("f21").join(&name));
        check_f21(&name, &wrote, &shown);
    }
}

#[test]
fn independent_f21_directory_is_a_clean_shutdown() {
    let dir = independent("f21/dir").display().to_string();
    let out = saguin(&["snapshot", "verify", "--json", &dir]);
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{doc:#}");
    assert_eq!(doc["summary"]["ok"], 9, "{doc:#}");
    assert_eq!(doc["findings"], Value::Array(vec![]), "{doc:#}");

    let shown = inspect(&independent("f21/dir"));
    assert_eq!(shown["type"], "directory");
    assert_eq!(shown["findings"], Value::Array(vec![]));
    let names: Vec<&str> = shown["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    for name in [
        "saguin.manifest",
        "%24saguin%2Fretained.snapshot",
        "saguin.broadcast",
        "saguin.sessions",
        "50%25%2Ea-b_c.snapshot",
        "state%2Ex.snapshot",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
}

fn phase_name(phase: &Value) -> &'static str {
    match phase.as_u64() {
        Some(1) => "await-puback",
        Some(2) => "await-pubrec",
        Some(3) => "await-pubcomp",
        other => panic!("phase {other:?}"),
    }
}

fn check_message(at: &str, wrote: &Value, shown: &Value, qos: &Value) {
    assert_eq!(shown["topic"], wrote["topic"], "{at}.topic");
    assert_eq!(shown["payload_hex"], wrote["payload"], "{at}.payload");
    assert_eq!(shown["retain"], wrote["retain"] == 1, "{at}.retain");
    assert_eq!(&shown["qos"], qos, "{at}.qos");
}

#[test]
fn independent_mbmqtt_verify_and_convert() {
    assert_eq!(verify_all_ok("mbmqtt"), 3);
    for (name, wrote) in expected("mbmqtt") {
        let shown = inspect(&independent("mbmqtt").join(&name));
        let version = wrote["version"].as_u64().unwrap();
        assert_eq!(shown["type"], "mbmqtt01", "{name}");
        assert_eq!(shown["contents"]["version"], version, "{name}");
        let state = &wrote["state"];
        let sessions = state["sessions"].as_array().unwrap();
        let shown_sessions = shown["contents"]["sessions"].as_array().unwrap();
        assert_eq!(sessions.len(), shown_sessions.len(), "{name}");
        for (i, (w, s)) in sessions.iter().zip(shown_sessions).enumerate() {
            let at = format!("{name}:sessions[{i}]");
            assert_eq!(s["client_id"], w["client_id"], "{at}");
            assert_eq!(s["next_packet_id"], w["next_packet_id"], "{at}");
            if version == 1 {
                // V1 holds neither: LegacyAnonymous, detach time unknown.
                assert_eq!(s["legacy_anonymous"], true, "{at}");
                assert_eq!(s["principal"], Value::Null, "{at}");
                assert_eq!(s["detach_millis"], Value::Null, "{at}");
            } else {
                assert_eq!(s["legacy_anonymous"], false, "{at}");
                assert_eq!(s["principal"], w["principal"], "{at}");
                let millis: u64 = w["detach"].as_str().unwrap().parse().unwrap();
                assert_eq!(s["detach_millis"], millis, "{at}");
            }
            let subs: Vec<Value> = s["subscriptions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| Value::Array(vec![x["filter"].clone(), x["qos"].clone()]))
                .collect();
            assert_eq!(Value::Array(subs), w["subs"], "{at}.subscriptions");
            let inbound = w.get("inbound").cloned().unwrap_or(Value::Array(vec![]));
            assert_eq!(s["inbound_qos2"], inbound, "{at}.inbound_qos2");
            let inflight = w["inflight"].as_array().unwrap();
            let shown_inflight = s["inflight"].as_array().unwrap();
            assert_eq!(inflight.len(), shown_inflight.len(), "{at}.inflight");
            for (j, (wi, si)) in inflight.iter().zip(shown_inflight).enumerate() {
                let at = format!("{at}.inflight[{j}]");
                assert_eq!(si["packet_id"], wi["packet_id"], "{at}");
                if version == 3 {
                    assert_eq!(si["phase"], phase_name(&wi["phase"]), "{at}");
                    match wi.get("message") {
                        Some(m) if !m.is_null() => check_message(&at, m, &si["message"], &m["qos"]),
                        _ => assert_eq!(si["message"], Value::Null, "{at}"),
                    }
                } else {
                    // A legacy inflight entry awaits its PUBACK, at QoS 1.
                    assert_eq!(si["phase"], "await-puback", "{at}");
                    check_message(&at, &wi["message"], &si["message"], &Value::from(1));
                }
            }
            let pending = w["pending"].as_array().unwrap();
            let shown_pending = s["pending"].as_array().unwrap();
            assert_eq!(pending.len(), shown_pending.len(), "{at}.pending");
            for (j, (wm, sm)) in pending.iter().zip(shown_pending).enumerate() {
                let qos = if version == 3 {
                    wm["qos"].clone()
                } else {
                    Value::from(1)
                };
                check_message(&format!("{at}.pending[{j}]"), wm, sm, &qos);
            }
        }
        let retained: Vec<Value> = shown["contents"]["retained"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                serde_json::json!({"topic": r["topic"], "payload": r["payload_hex"], "qos": r["qos"]})
            })
            .collect();
        assert_eq!(Value::Array(retained), state["retained"], "{name}:retained");
    }
}

/// Each file of `refused/` in one `verify --json` run: exit 1, and every
/// result fails with the code and a message holding the substring listed.
fn check_refused(sub: &str) {
    let dir = independent(sub);
    let listing = std::fs::read_to_string(dir.join("EXPECTED")).unwrap();
    let mut wanted = BTreeMap::new();
    for line in listing
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut cols = line.split('\t');
        let (file, code, text) = (
            cols.next().unwrap(),
            cols.next().unwrap(),
            cols.next().unwrap(),
        );
        wanted.insert(dir.join(file).display().to_string(), (code, text));
    }
    let on_disk = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != "EXPECTED")
        .count();
    assert_eq!(on_disk, wanted.len(), "every file in {sub} is listed");
    let mut args = vec!["snapshot", "verify", "--json"];
    args.extend(wanted.keys().map(String::as_str));
    let out = saguin(&args);
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{doc:#}");
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), wanted.len());
    for result in results {
        let path = result["path"].as_str().unwrap();
        let (code, text) = wanted[path];
        assert_eq!(result["status"], "fail", "{path}");
        assert_eq!(result["problem"]["code"], code, "{path}: {result:#}");
        let message = result["problem"]["message"].as_str().unwrap();
        assert!(message.contains(text), "{path}: {message:?} lacks {text:?}");
    }
}

#[test]
fn independent_f21_refusals() {
    check_refused("f21/refused");
}

#[test]
fn independent_mbmqtt_refusals() {
    check_refused("mbmqtt/refused");
}
