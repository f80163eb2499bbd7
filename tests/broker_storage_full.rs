//! A provider at its bound refuses with 0x97 (MQTT 3.1.1: a disconnect
//! without the acknowledgement), and nothing acknowledged is missing after
//! a restart.

mod broker_support;

use std::path::Path;

use broker_support::*;
use saguin::broker::codec::{Packet, ReasonCode};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A memory provider of 8 KiB keeping retained messages; the reserve (one
/// largest record: 1 KiB + 1 KiB of headers) is held back from publishes.
fn config(dir: &Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         limits:\n  max_message_size: 1KiB\n  max_header_bytes: 1KiB\n\
         storage:\n  - name: small\n    kind: memory\n    snapshot_dir: {}\n    max_bytes: 8KiB\n\
         broker:\n  retained_storage: small\n",
        dir.join("snapshots").display()
    )
}

#[test]
fn a_full_provider_refuses_with_0x97_and_keeps_what_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    let payload = vec![b'v'; 500];
    let acknowledged = runtime().block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("filler", ConnectOpts::clean()).await;
        let mut acknowledged = Vec::new();
        let mut refused = 0;
        for i in 1..=40u16 {
            let topic = format!("r/{i}");
            c.publish(&topic, &payload, 1, true, i).await;
            match c.recv().await {
                Some(Packet::PubAck(a)) if a.reason == ReasonCode::Success => {
                    acknowledged.push(topic)
                }
                Some(Packet::PubAck(a)) => {
                    assert_eq!(a.reason, ReasonCode::QuotaExceeded, "full is 0x97");
                    refused += 1;
                }
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
        assert!(
            !acknowledged.is_empty() && refused > 0,
            "{} kept, {refused} refused",
            acknowledged.len()
        );
        // Still connected: a full provider is no reason to cut a client.
        c.send(Packet::PingReq).await;
        assert!(matches!(c.recv().await, Some(Packet::PingResp)));

        // MQTT 3.1.1 has no reason code: disconnected, no PUBACK.
        let mut old = Raw::tcp(broker.addr(), v4()).await;
        old.connect("old", ConnectOpts::clean()).await;
        old.publish("r/one-more", &payload, 1, true, 1).await;
        let seen = old.expect_close().await;
        assert!(
            !seen.iter().any(|p| matches!(p, Packet::PubAck(_))),
            "{seen:?}"
        );
        acknowledged
    });
    broker.wait_log(|l| l.contains("level=ERROR") && l.contains("storage write failed"));
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let broker = broker.restart(&yaml);
    runtime().block_on(async {
        let mut r = Raw::tcp(broker.addr(), v5()).await;
        r.connect("reader", ConnectOpts::clean()).await;
        r.subscribe(1, "r/#", 0).await;
        let mut topics = Vec::new();
        while topics.len() < acknowledged.len() {
            let p = r.next_publish(false).await;
            topics.push(p.topic.to_string());
        }
        // Nothing more than what was acknowledged: a ping answers next.
        r.send(Packet::PingReq).await;
        assert!(matches!(r.recv().await, Some(Packet::PingResp)));
        topics.sort();
        let mut want = acknowledged.clone();
        want.sort();
        assert_eq!(topics, want, "exactly the acknowledged retained messages");
    });
}

/// A sqlite provider whose file cannot grow (the process's file size limit
/// is reached: writes fail with EFBIG, the file system without room for
/// it, not the provider's configured bound).
fn sqlite_config(dir: &Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         broker:\n  retained_storage: db\n",
        dir.join("saguin.db").display()
    )
}

#[test]
fn an_unwritable_provider_answers_0x83_and_keeps_what_it_acknowledged() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path());
    let broker = Broker::start_with(dir, &yaml, |command| {
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                // Past 1 MiB a file write fails (EFBIG) instead of the
                // process being killed by SIGXFSZ.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let limit = libc::rlimit {
                    rlim_cur: 1 << 20,
                    rlim_max: 1 << 20,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    let payload = vec![b'v'; 64 * 1024];
    let acknowledged = runtime().block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("filler", ConnectOpts::clean()).await;
        let mut acknowledged = Vec::new();
        let mut failed = 0;
        for i in 1..=40u16 {
            let topic = format!("big/{i}");
            c.publish(&topic, &payload, 1, true, i).await;
            match c.recv().await {
                Some(Packet::PubAck(a)) if a.reason == ReasonCode::Success => {
                    acknowledged.push(topic)
                }
                Some(Packet::PubAck(a)) => {
                    assert_eq!(
                        a.reason,
                        ReasonCode::ImplementationSpecificError,
                        "an I/O failure is 0x83"
                    );
                    failed += 1;
                }
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
        assert!(failed > 0, "the file limit was never reached");
        let mut old = Raw::tcp(broker.addr(), v4()).await;
        old.connect("old", ConnectOpts::clean()).await;
        old.publish("big/one-more", &payload, 1, true, 1).await;
        let seen = old.expect_close().await;
        assert!(
            !seen.iter().any(|p| matches!(p, Packet::PubAck(_))),
            "{seen:?}"
        );
        acknowledged
    });
    // A file that cannot grow is a file system without room for it:
    // logged once by the provider, as it runs out.
    let text = broker.wait_log(|l| l.contains("no space left for the storage provider"));
    assert!(
        text.contains("level=ERROR") && text.contains("provider=db"),
        "{text}"
    );
    // Killed, and restarted without the limit: every acknowledged retained
    // message is there.
    let broker = broker.restart(&yaml);
    runtime().block_on(async {
        let mut r = Raw::tcp(broker.addr(), v5()).await;
        r.connect("reader", ConnectOpts::clean()).await;
        r.subscribe(1, "big/#", 0).await;
        let mut topics = Vec::new();
        while topics.len() < acknowledged.len() {
            topics.push(r.next_publish(false).await.topic.to_string());
        }
        r.send(Packet::PingReq).await;
        assert!(matches!(r.recv().await, Some(Packet::PingResp)));
        topics.sort();
        let mut want = acknowledged.clone();
        want.sort();
        assert_eq!(topics, want);
    });
}

/// A QoS 2 publish into a full channel sent twice in one write (a client
/// retrying before its answer came) is refused once, with 0x97: the
/// duplicate waits for the first's hold and gets its answer, never a
/// PUBREC 0x00 for a publish that was not stored.
#[test]
fn a_duplicate_of_a_refused_exactly_once_publish_is_never_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         limits:\n  max_message_size: 1KiB\n  max_header_bytes: 1KiB\n\
         storage:\n  - name: small\n    kind: memory\n    snapshot_dir: {}\n    max_bytes: 8KiB\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: small\n",
        dir.path().join("snapshots").display()
    );
    let broker = Broker::start_in(dir, &yaml);
    let payload = vec![b'v'; 500];
    runtime().block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("twice", ConnectOpts::clean()).await;
        let mut full = false;
        for i in 1..=40u16 {
            c.publish("telemetry/a", &payload, 1, false, i).await;
            match c.recv().await {
                Some(Packet::PubAck(a)) if a.reason == ReasonCode::Success => {}
                Some(Packet::PubAck(a)) => {
                    assert_eq!(a.reason, ReasonCode::QuotaExceeded, "full is 0x97");
                    full = true;
                    break;
                }
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
        assert!(full, "the channel never filled");
        let publish = |dup| {
            Packet::Publish(saguin::broker::codec::Publish {
                dup,
                qos: qos(2),
                retain: false,
                topic: "telemetry/a".into(),
                packet_id: 100,
                properties: Default::default(),
                payload: payload.clone().into(),
            })
        };
        let mut bytes = wire_bytes(&publish(false), v5());
        bytes.extend(wire_bytes(&publish(true), v5()));
        bytes.extend(wire_bytes(&Packet::PingReq, v5()));
        c.send_bytes(&bytes).await;
        let mut answers = Vec::new();
        loop {
            match c.recv().await {
                Some(Packet::PingResp) => break,
                Some(Packet::PubRec(r)) => answers.push(r.reason),
                other => panic!("expected PUBREC or PINGRESP, got {other:?}"),
            }
        }
        assert_eq!(answers, [ReasonCode::QuotaExceeded], "{answers:?}");
    });
}
