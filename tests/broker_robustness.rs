//! Bad input closes only the connection it came on; shutdown is clean;
//! invalid configuration is refused; metrics are served.

mod broker_support;

use std::io::{Read, Write};

use broker_support::*;
use saguin::broker::codec::{Packet, ReasonCode};
use tokio::io::AsyncWriteExt;

/// A subscriber and a publisher that must keep working while others misbehave.
async fn bystanders(broker: &Broker) -> (Raw<tokio::net::TcpStream>, Raw<tokio::net::TcpStream>) {
    let mut s = Raw::tcp(broker.addr(), v5()).await;
    s.connect("bystander-sub", ConnectOpts::clean()).await;
    s.subscribe(1, "ok/#", 1).await;
    let mut p = Raw::tcp(broker.addr(), v4()).await;
    p.connect("bystander-pub", ConnectOpts::clean()).await;
    (s, p)
}

async fn still_working(
    s: &mut Raw<tokio::net::TcpStream>,
    p: &mut Raw<tokio::net::TcpStream>,
    id: u16,
) {
    p.publish_acked("ok/t", &id.to_be_bytes(), 1, false, id)
        .await;
    let m = s.next_publish(true).await;
    assert_eq!(&m.payload[..], &id.to_be_bytes());
}

#[tokio::test]
async fn malformed_packets_close_only_their_connection() {
    let broker = Broker::anonymous();
    let (mut s, mut p) = bystanders(&broker).await;

    // Garbage before CONNECT.
    let mut raw = tokio::net::TcpStream::connect(broker.addr()).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut c = Raw::new(raw, v4());
    assert!(c.expect_close().await.is_empty());
    still_working(&mut s, &mut p, 1).await;

    // A v5 connection sending a reserved packet type after CONNECT gets
    // DISCONNECT 0x81 and is closed.
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    c.connect("bad-v5", ConnectOpts::clean()).await;
    c.send_bytes(&[0x00, 0x00]).await;
    let closing = c.expect_close().await;
    assert!(
        matches!(closing.as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::MalformedPacket),
        "{closing:?}"
    );
    still_working(&mut s, &mut p, 2).await;

    // A PUBLISH whose topic length runs past the packet (3.1.1): closed.
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.connect("bad-v4", ConnectOpts::clean()).await;
    c.send_bytes(&[0x30, 0x04, 0x00, 0x10, b'a', b'b']).await;
    assert!(c.expect_close().await.is_empty());
    still_working(&mut s, &mut p, 3).await;

    // A remaining length that never ends.
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.connect("bad-len", ConnectOpts::clean()).await;
    c.send_bytes(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]).await;
    assert!(c.expect_close().await.is_empty());
    still_working(&mut s, &mut p, 4).await;

    // A second CONNECT is a protocol error.
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    c.connect("twice", ConnectOpts::clean()).await;
    c.send_bytes(&[
        0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x3C, 0x00, 0x00, 0x00,
    ])
    .await;
    let closing = c.expect_close().await;
    assert!(
        matches!(closing.as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::ProtocolError),
        "{closing:?}"
    );
    still_working(&mut s, &mut p, 5).await;
}

#[tokio::test]
async fn oversize_packet_closes_only_its_connection() {
    let broker = Broker::plain("auth:\n  allow_anonymous: true\nlimits:\n  max_message_size: 1KiB\n  max_header_bytes: 1KiB\n");
    let (mut s, mut p) = bystanders(&broker).await;
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("big", ConnectOpts::clean()).await;
    let max = ack
        .properties
        .maximum_packet_size
        .expect("maximum packet size announced");
    assert_eq!(max, 2048);
    // Announce a 1 MiB PUBLISH: refused from its header alone.
    c.send_bytes(&[0x30, 0x80, 0x80, 0x40]).await;
    let closing = c.expect_close().await;
    assert!(
        matches!(closing.as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::PacketTooLarge),
        "{closing:?}"
    );
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.connect("big4", ConnectOpts::clean()).await;
    c.publish("ok/t", &vec![1u8; 4096], 0, false, 0).await;
    assert!(c.expect_close().await.is_empty());
    still_working(&mut s, &mut p, 9).await;
}

#[tokio::test]
async fn sigterm_exits_zero_says_goodbye_and_sends_no_wills() {
    let mut broker = Broker::anonymous();
    let mut watcher = Raw::tcp(broker.addr(), v5()).await;
    watcher.connect("watcher", ConnectOpts::clean()).await;
    watcher.subscribe(1, "wills/#", 0).await;
    let mut doomed = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.will = Some((
        "wills/doomed".into(),
        b"should not be sent".to_vec(),
        0,
        false,
        None,
    ));
    doomed.connect("doomed", opts).await;
    let mut old = Raw::tcp(broker.addr(), v4()).await;
    let mut opts = ConnectOpts::clean();
    opts.will = Some(("wills/old".into(), b"nor this".to_vec(), 0, false, None));
    old.connect("old", opts).await;

    let code = broker.terminate();
    assert_eq!(code, Some(0), "log:\n{}", broker.log_text());
    for c in [&mut watcher, &mut doomed] {
        let closing = c.expect_close().await;
        assert!(
            matches!(closing.as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::ServerShuttingDown),
            "no Will before the goodbye: {closing:?}"
        );
    }
    assert!(old.expect_close().await.is_empty());
}

#[test]
fn invalid_config_exits_1_naming_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(
        dir.path(),
        "bad.yaml",
        b"listeners:\n  - name: mqtt\n    bind: not-an-address\nlimits:\n  receive_maximum: 0\nbogus: 1\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bogus"), "{err}");
    assert!(err.contains("listeners[0].bind"), "{err}");
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let broker = Broker::start(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\nmetrics:\n  bind: 127.0.0.1:0\n",
    );
    let addr = broker.listeners["metrics"];
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for name in [
        "saguin_connections ",
        "saguin_messages_received_total ",
        "saguin_messages_sent_total ",
        "saguin_bytes_received_total ",
        "saguin_subscriptions ",
        "saguin_retained_messages ",
        "saguin_dropped_messages_total{reason=",
        "saguin_disconnects_total{reason=",
    ] {
        assert!(body.contains(name), "{name} missing:\n{body}");
    }
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 404"), "{body}");
}

#[test]
fn json_logs_when_configured() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(
        dir.path(),
        "json.yaml",
        b"listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\nlog:\n  format: json\n",
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["serve", "--config"])
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("listening") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx.recv_timeout(WAIT);
    let _ = child.kill();
    let _ = child.wait();
    let line = line.expect("a listening line");
    let value: serde_json::Value = serde_json::from_str(&line).expect("one JSON object per line");
    assert_eq!(value["message"], "listening");
    assert_eq!(value["listener"], "mqtt");
    assert!(value["addr"].as_str().unwrap().starts_with("127.0.0.1:"));
}

#[tokio::test]
async fn malformed_input_publishes_the_will() {
    let broker = Broker::anonymous();
    let mut w = Raw::tcp(broker.addr(), v4()).await;
    w.connect("mw-watch", ConnectOpts::clean()).await;
    w.subscribe(1, "mw/#", 0).await;
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.will = Some(("mw/c".into(), b"broken".to_vec(), 0, false, None));
    c.connect("mw", opts).await;
    c.send_bytes(&[0xF0, 0x01, 0xFF]).await;
    let _ = c.expect_close().await;
    assert_eq!(&w.next_publish(true).await.payload[..], b"broken");
}

#[tokio::test]
async fn unsupported_protocol_version_gets_connack_0x01() {
    use tokio::io::AsyncReadExt;
    let broker = Broker::anonymous();
    let mut raw = tokio::net::TcpStream::connect(broker.addr()).await.unwrap();
    // MQTT 3.1 CONNECT: protocol name "MQIsdp", level 3.
    let mut connect = vec![0x10, 0x11, 0x00, 0x06];
    connect.extend_from_slice(b"MQIsdp");
    connect.extend_from_slice(&[0x03, 0x02, 0x00, 0x3C, 0x00, 0x03]);
    connect.extend_from_slice(b"old");
    raw.write_all(&connect).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, raw.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer, vec![0x20, 0x02, 0x00, 0x01]);
}

/// A client that publishes into a channel, subscribes and disconnects, all
/// in one write, is gone before its SUBACK, which waits behind the
/// channel's write: the answer finds its session ended and is let go, and
/// the broker carries on serving everyone else.
#[tokio::test]
async fn a_client_gone_before_its_suback_breaks_nothing() {
    let broker = Broker::plain(
        "auth:\n  allow_anonymous: true\n\
         storage:\n  - name: mem\n    kind: memory\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: mem\n",
    );
    let (mut s, mut p) = bystanders(&broker).await;
    for round in 0..3u16 {
        let mut c = Raw::tcp(broker.addr(), v4()).await;
        c.connect("hasty", ConnectOpts::clean()).await;
        let publish = Packet::Publish(saguin::broker::codec::Publish {
            dup: false,
            qos: qos(0),
            retain: false,
            topic: "telemetry/x".into(),
            packet_id: 0,
            properties: Default::default(),
            payload: bytes::Bytes::from_static(b"reading"),
        });
        let subscribe = Packet::Subscribe(saguin::broker::codec::Subscribe {
            packet_id: 1,
            filters: vec![saguin::broker::codec::SubscribeFilter {
                filter: "ok/#".to_owned(),
                options: Default::default(),
            }],
            properties: Default::default(),
        });
        let disconnect =
            Packet::Disconnect(saguin::broker::codec::Disconnect::new(ReasonCode::Success));
        let mut burst = wire_bytes(&publish, v4());
        burst.extend(wire_bytes(&subscribe, v4()));
        burst.extend(wire_bytes(&disconnect, v4()));
        c.send_bytes(&burst).await;
        c.expect_close().await;
        still_working(&mut s, &mut p, round + 1).await;
    }
}
