//! `saguin status` against a real broker: its providers, channels of every
//! kind and connections in one table or one JSON document, the address
//! read from --metrics or a configuration's metrics.bind, and exit 3
//! naming an endpoint that cannot be reached, stays silent or is not a
//! saguin broker, with --json printing the error as a document.

mod broker_support;

use std::io::{Read, Write};
use std::process::{Command, Output};

use broker_support::*;
use serde_json::Value;

fn saguin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .output()
        .expect("run saguin")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A memory provider with a snapshot directory and a sqlite provider, an
/// append, a latest and a queue channel.
fn config(dir: &std::path::Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n    max_bytes: 64MiB\n\
         \x20 - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: db\n\
         \x20 - name: devices\n    kind: latest\n    storage: mem\n\
         \x20 - name: jobs\n    kind: queue\n    storage: db\n\
         broker:\n  retained_storage: mem\n  session_storage: db\n",
        dir.join("saguin.db").display(),
        dir.join("snapshots").display()
    )
}

/// The broker, with three records in `telemetry`, two values in `devices`,
/// one job waiting in `jobs` and one client connected (returned, so it
/// stays connected).
fn serving() -> (Broker, tokio::runtime::Runtime, Raw<tokio::net::TcpStream>) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(dir.path());
    let broker = Broker::start_in(dir, &yaml);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("status-test", ConnectOpts::clean()).await;
        for (i, payload) in [b"21.5", b"21.7", b"22.0"].iter().enumerate() {
            c.publish_acked("telemetry/dev1/temp", *payload, 1, false, i as u16 + 1)
                .await;
        }
        c.publish_acked("devices/d1", b"on", 1, false, 10).await;
        c.publish_acked("devices/d2", b"off", 1, false, 11).await;
        c.publish_acked("jobs/email", b"to=alice", 1, false, 12)
            .await;
        c
    });
    (broker, rt, client)
}

fn endpoint(broker: &Broker) -> String {
    broker.listeners["metrics"].to_string()
}

#[test]
fn json_names_every_provider_and_channel_with_their_figures() {
    let (broker, _rt, _client) = serving();
    let out = saguin(&["status", "--metrics", &endpoint(&broker), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["endpoint"], endpoint(&broker));
    assert_eq!(doc["live"], true);
    assert_eq!(doc["ready"], true);
    assert_eq!(doc["readiness"][0], "ready");
    assert_eq!(doc["connections"], 1);
    assert_eq!(doc["messages_received"], 6);
    assert_eq!(doc["dropped_messages"]["slow_consumer"], 0);

    let providers = doc["providers"].as_array().unwrap();
    let names: Vec<&str> = providers
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["db", "mem"]);
    let db = &providers[0];
    assert_eq!(db["kind"], "sqlite");
    assert_eq!(db["max_bytes"], 64 * 1024 * 1024);
    assert!(db["bytes"].as_u64().unwrap() > 0, "{db}");
    assert_eq!(db["failed"], false);
    assert_eq!(db["held_to_disk"], false);
    assert_eq!(db["storage_errors"]["io"], 0);
    assert_eq!(db["snapshot"], Value::Null);
    let mem = &providers[1];
    assert_eq!(mem["kind"], "memory");
    assert_eq!(mem["max_bytes"], Value::Null, "unbounded");
    assert!(mem["snapshot"]["generation"].is_u64(), "{mem}");
    assert!(mem["snapshot"]["unsaved_seconds"].is_f64(), "{mem}");
    // The default 64 MiB room: 0 until taken after a generation.
    let room = mem["snapshot"]["room_bytes"].as_u64();
    assert!(room == Some(0) || room == Some(64 << 20), "{mem}");

    let channels = doc["channels"].as_array().unwrap();
    let by_name = |name: &str| {
        channels
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no channel {name}: {doc}"))
    };
    let telemetry = by_name("telemetry");
    assert_eq!(telemetry["kind"], "append");
    assert_eq!(telemetry["provider"], "db");
    assert_eq!(telemetry["records"], 3);
    assert_eq!(telemetry["next"], 4);
    assert_eq!(telemetry["floor"], 1);
    assert_eq!(telemetry["queue"], Value::Null);
    let devices = by_name("devices");
    assert_eq!(devices["kind"], "latest");
    assert_eq!(devices["provider"], "mem");
    assert_eq!(devices["records"], 2, "topics holding a value");
    let jobs = by_name("jobs");
    assert_eq!(jobs["kind"], "queue");
    assert_eq!(jobs["queue"]["depth"], 1);
    assert_eq!(jobs["queue"]["dead_lettered"], 0);
    let dlq = by_name("jobs.dlq");
    assert_eq!(dlq["kind"], "append");
    assert_eq!(dlq["records"], 0);
    assert_eq!(doc["bridges"], Value::Array(vec![]));
    assert_eq!(doc.get("error"), Some(&Value::Null), "{doc}");
}

#[test]
fn the_table_and_the_address_read_from_a_configuration() {
    let (broker, _rt, _client) = serving();
    let port = broker.listeners["metrics"].port();
    // 0.0.0.0 is asked on the loopback address.
    let config = broker.dir.path().join("status.yaml");
    std::fs::write(&config, format!("metrics:\n  bind: 0.0.0.0:{port}\n")).unwrap();
    let out = saguin(&["status", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let first = stdout.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("saguin at 127.0.0.1:{port}: live, ready; up ")),
        "{stdout}"
    );
    assert!(first.contains("1 connection(s)"), "{first}");
    for row in [
        "│ db ",
        "│ mem ",
        "│ telemetry ",
        "│ devices ",
        "│ jobs ",
        "│ jobs.dlq ",
        "depth 1, 0 in flight, 0 dead-lettered",
        "generation ",
    ] {
        assert!(stdout.contains(row), "{row:?} missing:\n{stdout}");
    }
}

#[test]
fn an_endpoint_that_cannot_be_reached_exits_3_naming_it() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let out = saguin(&["status", "--metrics", &addr]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("metrics endpoint {addr}: cannot reach it")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn json_still_prints_a_document_naming_the_error_when_there_is_no_status() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let out = saguin(&["status", "--metrics", &addr, "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["endpoint"], addr);
    assert_eq!(doc.get("live"), Some(&Value::Null), "{doc}");
    assert_eq!(doc.get("ready"), Some(&Value::Null), "{doc}");
    let error = doc["error"].as_str().expect("an error string");
    assert!(
        error.contains(&format!("metrics endpoint {addr}: cannot reach it")),
        "{error}"
    );
    assert!(text(&out.stderr).contains(error), "{}", text(&out.stderr));

    // A configuration naming no endpoint: none to report, the same exit.
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none.yaml");
    std::fs::write(&none, "listeners: []\n").unwrap();
    let out = saguin(&["status", "--config", none.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc.get("endpoint"), Some(&Value::Null), "{doc}");
    assert!(
        doc["error"]
            .as_str()
            .is_some_and(|e| e.contains("metrics.bind is not set")),
        "{doc}"
    );
}

#[test]
fn an_endpoint_that_accepts_and_never_answers_is_named_as_silent_after_the_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        // Holds the connection, reading and never writing, until the command
        // gives up and closes it: the command's own timeout bounds the test.
        let (mut stream, _) = listener.accept().unwrap();
        let mut chunk = [0u8; 1024];
        while let Ok(n) = stream.read(&mut chunk) {
            if n == 0 {
                break;
            }
        }
    });
    let out = saguin(&["status", "--metrics", &addr, "--json"]);
    // Had the command never connected, this one is what `accept` takes:
    // the test ends either way.
    let _ = std::net::TcpStream::connect(&addr);
    server.join().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let seconds = saguin::broker::status::ANSWER_TIMEOUT.as_secs();
    let expected = format!(
        "metrics endpoint {addr}/healthz: accepted the connection but did not answer within {seconds} s"
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(!stderr.contains("os error"), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["error"], expected.as_str());
}

#[test]
fn an_endpoint_that_is_not_a_saguin_broker_exits_3_naming_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        // Answers its first request 404, as another web server would.
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut chunk = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&chunk[..n]),
            }
        }
        let _ = stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\nConnection: close\r\n\r\nno such!\r\n",
        );
    });
    let out = saguin(&["status", "--metrics", &addr]);
    server.join().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("metrics endpoint {addr}/healthz: HTTP 404")),
        "{stderr}"
    );
}

#[test]
fn a_configuration_without_a_metrics_listener_or_with_port_0_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none.yaml");
    std::fs::write(
        &none,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:1883\n",
    )
    .unwrap();
    let out = saguin(&["status", "--config", none.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("metrics.bind is not set"),
        "{}",
        text(&out.stderr)
    );
    let zero = dir.path().join("zero.yaml");
    std::fs::write(&zero, "metrics:\n  bind: 127.0.0.1:0\n").unwrap();
    let out = saguin(&["status", "--config", zero.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains("port 0"),
        "{}",
        text(&out.stderr)
    );
    // Neither flag: a usage error.
    assert_eq!(saguin(&["status"]).status.code(), Some(2));
}

#[test]
fn a_broker_with_a_failed_provider_answers_no_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(dir.path());
    let broker = Broker::start_with(dir, &yaml, |command| {
        command.env("SAGUIN_INJECT_FAULTS", "db:wal:sync:3:EIO");
    });
    runtime_publish_until_refused(&broker);
    let out = saguin(&["status", "--metrics", &endpoint(&broker)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains(": live, NOT READY;"), "{stdout}");
    assert!(stdout.contains("FAILED"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "{}: provider db: failed (fsync)",
            endpoint(&broker)
        )),
        "{stdout}"
    );
}

/// Publishes into `telemetry` (on `db`) until a publish is refused.
fn runtime_publish_until_refused(broker: &Broker) {
    use saguin::broker::codec::{Packet, ReasonCode};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("publisher", ConnectOpts::clean()).await;
        let mut packet_id = 0u16;
        loop {
            packet_id = packet_id
                .checked_add(1)
                .expect("the planned fault never failed a publish");
            c.publish("telemetry/t", b"21.5", 1, false, packet_id).await;
            match c.recv().await {
                Some(Packet::PubAck(a)) if a.reason == ReasonCode::Success => continue,
                Some(Packet::PubAck(a)) => {
                    assert_eq!(a.reason, ReasonCode::ImplementationSpecificError);
                    return;
                }
                other => panic!("expected a PUBACK, got {other:?}"),
            }
        }
    });
}
