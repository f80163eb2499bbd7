//! `/healthz` and `/readyz` on the metrics listener of a real broker: live
//! and ready once it serves, and not ready - naming the provider and why -
//! once a provider has failed, while it stays live.

mod broker_support;

use broker_support::*;
use saguin::broker::codec::{Packet, ReasonCode};

/// A sqlite provider `db` keeping the append channel `telemetry`, and a
/// memory provider `mem` keeping the latest channel `devices`.
fn config(dir: &std::path::Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         \x20 - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: db\n\
         \x20 - name: devices\n    kind: latest\n    storage: mem\n",
        dir.join("saguin.db").display(),
        dir.join("snapshots").display()
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_serving_broker_is_live_and_ready_with_every_provider_writing() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(dir.path());
    let broker = Broker::start_in(dir, &yaml);
    let (status, body) = metrics_get(&broker, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with("live: the broker loop turned ") && body.ends_with("s ago\n"),
        "{body}"
    );
    let (status, body) = metrics_get(&broker, "/readyz");
    assert_eq!(status, 200, "{body}");
    // Sessions and retained messages are kept by a built-in memory
    // provider, as no provider is named for them.
    assert_eq!(
        body,
        "ready\nprovider (built-in memory): writing\nprovider db: writing\nprovider mem: writing\n"
    );
    // A query string is no other path; an unknown path and another method
    // are refused, the paths served named.
    assert_eq!(metrics_get(&broker, "/readyz?verbose").0, 200);
    let (status, body) = metrics_get(&broker, "/health");
    assert_eq!(status, 404);
    assert!(
        body.contains("/healthz") && body.contains("/readyz"),
        "{body}"
    );
}

#[test]
fn a_failed_provider_makes_the_broker_not_ready_naming_it_while_it_stays_live() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(dir.path());
    // The third fsync of the write-ahead log fails: a failed fsync fails
    // the provider until a restart.
    let broker = Broker::start_with(dir, &yaml, |command| {
        command.env("SAGUIN_INJECT_FAULTS", "db:wal:sync:3:EIO");
    });
    assert_eq!(metrics_get(&broker, "/readyz").0, 200);
    runtime().block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("publisher", ConnectOpts::clean()).await;
        // The flusher's fsync runs beside the publishes: the fault is
        // waited for by its effect, a publish refused with 0x83.
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
                    break;
                }
                other => panic!("expected a PUBACK, got {other:?}"),
            }
        }
    });
    let (status, body) = metrics_get(&broker, "/readyz");
    assert_eq!(status, 503, "{body}");
    let mut lines = body.lines();
    assert_eq!(lines.next(), Some("not ready"));
    assert_eq!(lines.next(), Some("provider (built-in memory): writing"));
    let db = lines.next().unwrap_or_default();
    assert!(
        db.starts_with("provider db: failed (fsync): ")
            && db.ends_with("; every write is refused until a restart"),
        "{body}"
    );
    assert_eq!(lines.next(), Some("provider mem: writing"), "{body}");
    // Not live is for a wedged loop, which a restart mends; this one turns.
    assert_eq!(metrics_get(&broker, "/healthz").0, 200);
}
