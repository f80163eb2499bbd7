//! Flow control never cuts a client silently: retained messages and
//! queued messages are paced by the client's window, a client that does not
//! read its acknowledgements is read more slowly rather than dropped, QoS 0
//! to a slow reader is dropped and counted, and a disconnect the broker
//! decides is logged and carries its reason code.

mod broker_support;

use std::io::{Read, Write};

use broker_support::*;
use bytes::BytesMut;
use saguin::broker::codec::{self, Packet, Publish, QoS, ReasonCode};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Prometheus text from the broker's metrics listener.
fn scrape(broker: &Broker) -> String {
    let addr = broker.listeners["metrics"];
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

fn metric(text: &str, line_start: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {line_start} in {text}"))
}

const SMALL_LIMITS: &str = "auth:\n  allow_anonymous: true\nlimits:\n  max_queued_messages: 10\n  receive_maximum: 5\nmetrics:\n  bind: 127.0.0.1:0\n";

#[test]
fn a_wildcard_subscriber_gets_every_retained_message_paced_by_its_window() {
    // More retained messages than max_queued_messages + receive_maximum:
    // once an overflow that cut the subscriber without a word.
    let broker = Broker::plain(SMALL_LIMITS);
    runtime().block_on(async {
        let mut p = Raw::tcp(broker.addr(), v4()).await;
        p.connect("pub", ConnectOpts::clean()).await;
        for i in 0..1200u16 {
            p.publish(&format!("r/{i}"), b"v", 1, true, i % 60000 + 1)
                .await;
        }
        for _ in 0..1200 {
            assert!(matches!(p.recv().await, Some(Packet::PubAck(_))));
        }
        for q in [0u8, 1] {
            let mut s = Raw::tcp(broker.addr(), v5()).await;
            let mut opts = ConnectOpts::clean();
            opts.properties.receive_maximum = Some(3);
            s.connect(&format!("sub{q}"), opts).await;
            let reasons = s.subscribe(1, "#", q).await;
            assert_eq!(reasons, vec![ReasonCode::from_u8(q).unwrap()]);
            let mut seen = std::collections::BTreeSet::new();
            while seen.len() < 1200 {
                let m = s.next_publish(true).await;
                assert!(m.retain);
                seen.insert(m.topic.to_string());
            }
            // Still connected: a ping round trip answers.
            s.send(Packet::PingReq).await;
            assert!(matches!(s.recv().await, Some(Packet::PingResp)));
        }
    });
}

#[test]
fn an_mqtt5_subscriber_that_names_no_receive_maximum_is_sent_the_brokers_window() {
    let broker =
        Broker::plain("auth:\n  allow_anonymous: true\nlimits:\n  max_inflight_messages: 5\n");
    runtime().block_on(async {
        // No Receive Maximum: 65,535, as most MQTT 5 libraries ask.
        let mut s = Raw::tcp(broker.addr(), v5()).await;
        s.connect("sub", ConnectOpts::clean()).await;
        s.subscribe(1, "t", 1).await;
        let mut p = Raw::tcp(broker.addr(), v4()).await;
        p.connect("pub", ConnectOpts::clean()).await;
        for i in 1..=20u16 {
            p.publish_acked("t", format!("{i}").as_bytes(), 1, false, i)
                .await;
        }
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(s.next_publish(false).await);
        }
        // Every one was routed before its PUBACK: the rest wait in the
        // session's queue, not on the wire.
        s.expect_nothing().await;
        s.send(Packet::PubAck(codec::PubAck::new(held[0].packet_id)))
            .await;
        let next = s.next_publish(false).await;
        assert_eq!(&next.payload[..], b"6");
        s.expect_nothing().await;
        // Acknowledged, the rest follow in order.
        for m in held.iter().skip(1).chain([&next]) {
            s.send(Packet::PubAck(codec::PubAck::new(m.packet_id)))
                .await;
        }
        for i in 7..=20 {
            let m = s.next_publish(true).await;
            assert_eq!(m.payload, format!("{i}").into_bytes());
        }
    });
}

#[test]
fn a_publisher_that_does_not_read_its_pubacks_is_slowed_never_cut() {
    let broker = Broker::plain(SMALL_LIMITS);
    runtime().block_on(async {
        // MQTT 3.1.1: no Receive Maximum forbids this.
        let mut p = Raw::tcp(broker.addr(), v4()).await;
        p.connect("pub", ConnectOpts::clean()).await;
        // Every PUBLISH written before a single PUBACK is read.
        let mut all = BytesMut::new();
        for i in 1..=5000u16 {
            let packet = Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: "t".into(),
                packet_id: i,
                properties: Default::default(),
                payload: bytes::Bytes::from_static(b"x"),
            });
            codec::encode(&packet, v4(), &mut all).unwrap();
        }
        let (mut rd, mut wr) = tokio::io::split(p.stream);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            wr.write_all(&all).await.unwrap();
            wr
        });
        let mut raw = Raw::new(tokio::io::join(&mut rd, tokio::io::sink()), v4());
        let mut acked = 0u16;
        while acked < 5000 {
            match raw.recv().await {
                Some(Packet::PubAck(a)) => {
                    acked += 1;
                    assert_eq!(a.packet_id, acked, "in order");
                }
                other => panic!("expected PUBACK {}, got {other:?}", acked + 1),
            }
        }
        writer.await.unwrap();
    });
    assert!(!broker.log_text().contains("disconnecting client"));
}

/// Floods a QoS 0 subscriber that reads nothing with `sent` messages of
/// `size` bytes and a QoS 1 marker behind them (routed in order: once it
/// is acknowledged, every message of the flood was kept or dropped), then
/// lets it read. Returns how many it got before the marker and how many
/// the broker counted dropped, once a ping has shown it still connected.
async fn flood_a_subscriber_that_does_not_read(
    broker: &Broker,
    sent: u64,
    size: usize,
) -> (u64, u64) {
    let mut s = Raw::tcp(broker.addr(), v5()).await;
    s.connect("slow", ConnectOpts::clean()).await;
    s.subscribe(1, "flood", 0).await;
    s.subscribe(2, "marker", 1).await;
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    p.connect("pub", ConnectOpts::clean()).await;
    let payload = vec![b'x'; size];
    for _ in 0..sent {
        p.publish("flood", &payload, 0, false, 0).await;
    }
    p.publish_acked("marker", b"end", 1, false, 1).await;
    let dropped = metric(
        &scrape(broker),
        "saguin_dropped_messages_total{reason=\"slow_consumer\"}",
    );
    let mut kept = 0;
    loop {
        let m = s.next_publish(true).await;
        if &*m.topic == "marker" {
            break;
        }
        kept += 1;
    }
    s.send(Packet::PingReq).await;
    assert!(matches!(s.recv().await, Some(Packet::PingResp)));
    (kept, dropped)
}

#[test]
fn qos0_to_a_subscriber_that_falls_behind_is_dropped_and_counted_not_cut() {
    let broker = Broker::plain(SMALL_LIMITS);
    // Far more than the socket buffers hold while nobody reads.
    let (kept, dropped) =
        runtime().block_on(flood_a_subscriber_that_does_not_read(&broker, 20_000, 4096));
    assert!(kept < 20_000, "some were dropped ({kept} kept)");
    assert_eq!(kept + dropped, 20_000, "every drop is counted");
}

/// `limits.max_queued_bytes` bounds QoS 0 to a client that does not read,
/// as it bounds a session's queue: a thousand 64 KiB messages are fewer
/// packets than the writer's queue holds by count (1,064), so without the
/// byte bound none would be dropped; with 1 MiB, those beyond what the
/// socket buffers and 1 MiB hold are dropped and counted, and the client
/// is not cut.
#[test]
fn qos0_to_a_subscriber_that_falls_behind_is_held_to_the_byte_bound() {
    const SENT: u64 = 1_000;
    let broker = Broker::plain(
        "auth:\n  allow_anonymous: true\nlimits:\n  max_queued_bytes: 1MiB\nmetrics:\n  bind: 127.0.0.1:0\n",
    );
    let (kept, dropped) = runtime().block_on(flood_a_subscriber_that_does_not_read(
        &broker,
        SENT,
        64 * 1024,
    ));
    assert!(
        dropped > 0,
        "64 MiB of QoS 0 held for a client that does not read"
    );
    assert_eq!(kept + dropped, SENT, "every drop is counted");
    broker.wait_log(|l| l.contains("QoS 0 messages were dropped") && l.contains("client_id=slow"));
}

#[test]
fn a_disconnect_the_broker_decides_is_logged_and_carries_its_reason() {
    let broker = Broker::plain(SMALL_LIMITS);
    runtime().block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("victim", ConnectOpts::persistent(60)).await;
        let mut t = Raw::tcp(broker.addr(), v5()).await;
        t.connect("victim", ConnectOpts::persistent(60)).await;
        let seen = c.expect_close().await;
        assert!(
            matches!(seen.last(), Some(Packet::Disconnect(d)) if d.reason == ReasonCode::SessionTakenOver),
            "{seen:?}"
        );
        let line = broker
            .wait_log(|l| l.contains("disconnecting client") && l.contains("client_id=victim"));
        assert!(line.contains("session_taken_over") && line.contains("0x8E"), "{line}");
    });
}
