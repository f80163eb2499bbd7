//! Outbound bridges against a scripted remote, which answers exactly as
//! the test says: a withheld PUBACK (ack_timeout, reconnect, resend with
//! DUP), a Maximum QoS below the rule's (refused), a Maximum Packet Size
//! below a record (skipped with its offset), a refusing PUBACK (held, sent
//! again), a remote that forgets its session between PUBREC and PUBREL.

mod bridge_support;
mod broker_support;

use bridge_support::saguin_yaml;
use broker_support::{v4, v5, Broker, ConnectOpts, Raw, WAIT};
use bytes::BytesMut;
use saguin::broker::codec::{
    self, ConnAck, ConnAckProperties, FrameDecoder, Packet, ProtocolVersion, PubAck, Publish, QoS,
    ReasonCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The server side of one bridge connection, on the project's codec.
struct Peer {
    stream: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl Peer {
    /// Accept the bridge's next connection and answer its CONNECT.
    async fn accept(
        listener: &TcpListener,
        connack: ConnAckProperties,
        present: bool,
    ) -> (Peer, codec::Connect) {
        let (stream, _) = tokio::time::timeout(WAIT * 3, listener.accept())
            .await
            .expect("the bridge did not connect")
            .unwrap();
        let mut peer = Peer {
            stream,
            buf: BytesMut::new(),
            decoder: FrameDecoder::server(1 << 20),
        };
        let connect = match peer.recv().await {
            Some(Packet::Connect(c)) => c,
            other => panic!("expected CONNECT, got {other:?}"),
        };
        peer.send(Packet::ConnAck(ConnAck {
            session_present: present,
            reason: ReasonCode::Success,
            properties: connack,
        }))
        .await;
        (peer, connect)
    }

    async fn recv(&mut self) -> Option<Packet> {
        loop {
            if let Some(p) = self.decoder.decode(&mut self.buf).expect("decodable") {
                return Some(p);
            }
            match tokio::time::timeout(WAIT, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return None,
                Ok(Ok(_)) => {}
                Err(_) => panic!("nothing from the bridge within {WAIT:?}"),
            }
        }
    }

    async fn next_publish(&mut self) -> Publish {
        loop {
            match self.recv().await {
                Some(Packet::Publish(p)) => return p,
                Some(Packet::PingReq) => self.send(Packet::PingResp).await,
                Some(_) => {}
                None => panic!("the bridge closed the connection"),
            }
        }
    }

    async fn send(&mut self, packet: Packet) {
        let mut out = BytesMut::new();
        codec::encode(&packet, ProtocolVersion::V5, &mut out).unwrap();
        let _ = self.stream.write_all(&out).await;
    }
}

fn yaml(dir: &std::path::Path, remote: std::net::SocketAddr, extra: &str) -> String {
    saguin_yaml(
        dir,
        "  - { name: telemetry, kind: append, storage: db }",
        &format!(
            "  - name: cloud
    address: {remote}
    reconnect: {{ base: 50ms, cap: 200ms }}
{extra}    out: [{{ channel: telemetry, remote_prefix: up/ }}]
"
        ),
    )
    .replace(
        "listeners: [{ name: mqtt, bind: 127.0.0.1:0 }]",
        "listeners: [{ name: mqtt, bind: 127.0.0.1:0 }]\nmetrics: { bind: 127.0.0.1:0 }",
    )
}

async fn publish(saguin: &Broker, topic: &str, payload: &[u8]) {
    let mut c = Raw::tcp(saguin.addr(), v5()).await;
    c.connect("producer", ConnectOpts::clean()).await;
    c.publish_acked(topic, payload, 1, false, 1).await;
    c.disconnect().await;
}

/// Scrape, a scrape every 10 ms, until the metrics contain `line`
/// (bounded); the last scrape.
async fn scrape_until(saguin: &Broker, line: &str) -> String {
    let mut pace = tokio::time::interval(std::time::Duration::from_millis(10));
    let found = tokio::time::timeout(WAIT, async {
        loop {
            pace.tick().await;
            let metrics = scrape(saguin).await;
            if metrics.contains(line) {
                return metrics;
            }
        }
    })
    .await;
    match found {
        Ok(metrics) => metrics,
        Err(_) => panic!("never {line}: {}", scrape(saguin).await),
    }
}

async fn scrape(saguin: &Broker) -> String {
    let mut s = TcpStream::connect(saguin.listeners["metrics"])
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withheld_puback_is_sent_again_with_dup_after_ack_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = yaml(
        dir.path(),
        listener.local_addr().unwrap(),
        "    ack_timeout: 300ms\n",
    );
    let saguin = Broker::start_in(dir, &config);
    let (mut first, connect) = Peer::accept(&listener, ConnAckProperties::default(), false).await;
    assert!(
        !connect.clean_start,
        "the remote keeps the bridge's session"
    );
    publish(&saguin, "telemetry/d1", b"one").await;
    let sent = first.next_publish().await;
    assert_eq!(sent.topic.as_str(), "up/telemetry/d1");
    assert!(!sent.dup);
    assert_eq!(sent.qos, QoS::AtLeastOnce);
    let props = &sent.properties.user_properties;
    assert!(
        props.contains(&("saguin-offset".into(), "1".into())),
        "{props:?}"
    );
    assert!(
        props.contains(&("saguin-channel".into(), "telemetry".into())),
        "{props:?}"
    );
    // No PUBACK: after ack_timeout the bridge gives up on this connection.
    let (mut second, _) = Peer::accept(&listener, ConnAckProperties::default(), true).await;
    let again = second.next_publish().await;
    assert!(again.dup, "the resend carries DUP");
    assert_eq!(again.packet_id, sent.packet_id);
    assert_eq!(again.payload, sent.payload);
    second
        .send(Packet::PubAck(PubAck::new(again.packet_id)))
        .await;
    saguin.wait_log(|l| l.contains("past ack_timeout"));
    publish(&saguin, "telemetry/d1", b"two").await;
    let next = second.next_publish().await;
    assert_eq!(&next.payload[..], b"two");
    // The bridge may send "two" before it reads the PUBACK of "one" (its
    // deliveries are looked at first): the count follows the PUBACK.
    let metrics = scrape_until(&saguin, "saguin_bridge_acked_total{bridge=\"cloud\"} 1").await;
    assert!(
        metrics.contains("saguin_bridge_resent_total{bridge=\"cloud\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("saguin_bridge_connects_total{bridge=\"cloud\",result=\"ok\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("saguin_bridge_connected{bridge=\"cloud\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_whose_maximum_qos_is_below_the_rule_is_refused_with_the_reason() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = yaml(dir.path(), listener.local_addr().unwrap(), "");
    let saguin = Broker::start_in(dir, &config);
    let props = ConnAckProperties {
        maximum_qos: Some(QoS::AtMostOnce),
        ..ConnAckProperties::default()
    };
    let (_peer, _) = Peer::accept(&listener, props, false).await;
    let line = saguin.wait_log(|l| l.contains("bridge refused the remote"));
    assert!(
        line.contains("Maximum QoS is 0, below qos 1 of out[0]"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_for_the_remote_is_skipped_with_its_offset_and_a_refusal_is_sent_again()
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = yaml(dir.path(), listener.local_addr().unwrap(), "");
    let saguin = Broker::start_in(dir, &config);
    let props = ConnAckProperties {
        maximum_packet_size: Some(200),
        ..ConnAckProperties::default()
    };
    let (mut peer, _) = Peer::accept(&listener, props, false).await;
    publish(&saguin, "telemetry/big", &[b'x'; 400]).await;
    publish(&saguin, "telemetry/small", b"fits").await;
    let sent = peer.next_publish().await;
    assert_eq!(&sent.payload[..], b"fits");
    let line = saguin.wait_log(|l| l.contains("bridge skipped a record larger"));
    assert!(line.contains("offset=1"), "{line}");
    // Refused (0x97): the position holds and the record goes again.
    let mut refusal = PubAck::new(sent.packet_id);
    refusal.reason = ReasonCode::QuotaExceeded;
    peer.send(Packet::PubAck(refusal)).await;
    let again = peer.next_publish().await;
    assert_eq!(&again.payload[..], b"fits");
    peer.send(Packet::PubAck(PubAck::new(again.packet_id)))
        .await;
    let line = saguin.wait_log(|l| l.contains("the remote refused a record"));
    assert!(
        line.contains("reason=0x97") && line.contains("state=blocked"),
        "{line}"
    );
    let metrics = scrape(&saguin).await;
    assert!(
        metrics.contains("saguin_bridge_skipped_total{bridge=\"cloud\",reason=\"too_large\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("saguin_bridge_refused_total{bridge=\"cloud\",reason=\"0x97\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_removed_by_retention_before_they_went_out_are_announced_as_a_gap() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = yaml(
        dir.path(),
        listener.local_addr().unwrap(),
        "    max_inflight: 1\n",
    )
    .replace(
        "{ name: telemetry, kind: append, storage: db }",
        "{ name: telemetry, kind: append, storage: db, retention_bytes: 4KiB }",
    )
    .replace("log: { level: info }", "")
        + "log: { level: debug }\n";
    let saguin = Broker::start_in(dir, &config);
    let (mut peer, _) = Peer::accept(&listener, ConnAckProperties::default(), false).await;
    publish(&saguin, "telemetry/d", b"first").await;
    let first = peer.next_publish().await;
    // While the first waits for its PUBACK, more records arrive than the
    // bridge is handed ahead of the remote's window, and retention removes
    // those still only in the channel.
    let mut producer = Raw::tcp(saguin.addr(), v5()).await;
    producer.connect("producer", ConnectOpts::clean()).await;
    for id in 1..=400u16 {
        producer
            .publish_acked("telemetry/d", &[b'x'; 1000], 1, false, id)
            .await;
    }
    producer.disconnect().await;
    saguin.wait_log(|l| l.contains("retention removed records"));
    peer.send(Packet::PubAck(PubAck::new(first.packet_id)))
        .await;
    // What the bridge was handed goes out in order, then the first send
    // after the gap announces it.
    let mut last = offset_of(&first);
    let (next, gap) = loop {
        let p = peer.next_publish().await;
        if let Some(gap) = property(&p, "saguin-gap") {
            break (p, gap);
        }
        assert_eq!(
            offset_of(&p),
            last + 1,
            "a record went missing before the gap"
        );
        last = offset_of(&p);
        peer.send(Packet::PubAck(PubAck::new(p.packet_id))).await;
    };
    let line = saguin.wait_log(|l| l.contains("msg=\"bridge gap\""));
    let (from, to) = gap.split_once('-').unwrap();
    assert!(
        line.contains(&format!("from={from}")) && line.contains(&format!("to={to}")),
        "{line}"
    );
    let (from, to): (u64, u64) = (from.parse().unwrap(), to.parse().unwrap());
    assert_eq!(from, last + 1, "the gap starts after the last record sent");
    assert_eq!(
        to + 1,
        offset_of(&next),
        "the gap ends before the record carrying it"
    );
    let removed = to - from + 1;
    let metrics = scrape(&saguin).await;
    assert!(
        metrics.contains(&format!(
            "saguin_bridge_gap_records_total{{bridge=\"cloud\"}} {removed}"
        )),
        "{metrics}"
    );
}

fn property(p: &Publish, key: &str) -> Option<String> {
    p.properties
        .user_properties
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
}

fn offset_of(p: &Publish) -> u64 {
    property(p, "saguin-offset")
        .and_then(|v| v.parse().ok())
        .expect("every send carries saguin-offset")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_position_of_a_bridge_no_longer_configured_is_dropped_at_startup() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = yaml(
        dir.path(),
        listener.local_addr().unwrap(),
        "    max_inflight: 1\n",
    );
    let mut saguin = Broker::start_in(dir, &config);
    let (mut peer, _) = Peer::accept(&listener, ConnAckProperties::default(), false).await;
    publish(&saguin, "telemetry/d", b"one").await;
    let sent = peer.next_publish().await;
    peer.send(Packet::PubAck(PubAck::new(sent.packet_id))).await;
    // With a window of one, the second goes out only once the state took
    // the first's acknowledgement.
    publish(&saguin, "telemetry/d", b"two").await;
    assert_eq!(&peer.next_publish().await.payload[..], b"two");
    // A graceful stop stores the position.
    assert_eq!(saguin.terminate(), Some(0));
    let without = config[..config.find("bridges:").unwrap()].to_owned();
    let saguin = saguin.restart(&without);
    let line = saguin.wait_log(|l| l.contains("its bridge is no longer configured"));
    assert!(
        line.contains("reader=bridge:cloud") && line.contains("offset=2"),
        "{line}"
    );
}

impl Peer {
    /// The next packet of `kind` from the bridge, answering PINGREQ.
    async fn next_of(&mut self, what: &str, matches: impl Fn(&Packet) -> bool) -> Packet {
        loop {
            match self.recv().await {
                Some(p) if matches(&p) => return p,
                Some(Packet::PingReq) => self.send(Packet::PingResp).await,
                Some(_) => {}
                None => panic!("the bridge closed the connection before {what}"),
            }
        }
    }

    async fn qos2_publish(&mut self, packet_id: u16, payload: &'static [u8]) {
        self.send(Packet::Publish(Publish {
            dup: false,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: "cmd/d".into(),
            packet_id,
            properties: Default::default(),
            payload: bytes::Bytes::from_static(payload),
        }))
        .await;
    }
}

/// saguin with a bridge bringing `cmd/#` of the scripted remote into the
/// channel `commands` at QoS 2, and its configuration.
fn start_inbound_qos2(listener: &TcpListener) -> (Broker, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = saguin_yaml(
        dir.path(),
        "  - { name: commands, kind: append, storage: db }",
        &format!(
            "  - name: cloud
    address: {}
    reconnect: {{ base: 50ms, cap: 200ms }}
    in: [{{ filter: cmd/#, local_prefix: commands/, qos: 2 }}]
",
            listener.local_addr().unwrap()
        ),
    );
    (Broker::start_in(dir, &config), config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_that_forgot_its_session_has_its_held_qos2_written_once_and_its_id_reused_after() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (saguin, _) = start_inbound_qos2(&listener);
    let (mut first, _) = Peer::accept(&listener, ConnAckProperties::default(), false).await;
    first
        .next_of("SUBSCRIBE", |p| matches!(p, Packet::Subscribe(_)))
        .await;
    first.qos2_publish(5, b"held").await;
    first
        .next_of(
            "PUBREC",
            |p| matches!(p, Packet::PubRec(r) if r.packet_id == 5),
        )
        .await;
    // Held, not a record; the remote goes away without its PUBREL and
    // comes back without the session: nobody will release it.
    drop(first);
    let (mut second, _) = Peer::accept(&listener, ConnAckProperties::default(), false).await;
    // The same packet id at once, for a new message: it waits until the
    // forgotten one is written.
    second.qos2_publish(5, b"new").await;
    second
        .next_of(
            "PUBREC of the new one",
            |p| matches!(p, Packet::PubRec(r) if r.packet_id == 5),
        )
        .await;
    second.send(Packet::PubRel(PubAck::new(5))).await;
    second
        .next_of(
            "PUBCOMP",
            |p| matches!(p, Packet::PubComp(c) if c.packet_id == 5),
        )
        .await;
    let seen = bridge_support::read_channel(
        saguin.addr(),
        "commands/#",
        std::time::Duration::from_secs(30),
        |seen| seen.len() >= 2,
    )
    .await;
    let payloads: Vec<&[u8]> = seen.iter().map(|(_, p)| p.as_slice()).collect();
    assert_eq!(payloads, vec![&b"held"[..], &b"new"[..]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos2_hold_of_a_bridge_no_longer_configured_is_dropped_at_startup() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (mut saguin, config) = start_inbound_qos2(&listener);
    let (mut peer, _) = Peer::accept(&listener, ConnAckProperties::default(), false).await;
    peer.qos2_publish(9, b"never released").await;
    peer.next_of(
        "PUBREC",
        |p| matches!(p, Packet::PubRec(r) if r.packet_id == 9),
    )
    .await;
    assert_eq!(saguin.terminate(), Some(0));
    let without = config[..config.find("bridges:").unwrap()].to_owned();
    let saguin = saguin.restart(&without);
    let line = saguin.wait_log(|l| l.contains("its bridge is no longer configured"));
    assert!(
        line.contains("held QoS 2 publish dropped") && line.contains("client_id=bridge:cloud"),
        "{line}"
    );
}

/// A bridge's connection inside the broker has client id and principal
/// `bridge:<name>`: a network CONNECT with a client id under that prefix,
/// a configured name or not, is refused (MQTT 5 0x85, 3.1.1 0x02 on the
/// wire) with the peer and the id logged, and so is one with such a user
/// name (0x86, 3.1.1 0x04); the bridge's own connection carries on.
#[tokio::test]
async fn a_network_client_id_beginning_bridge_is_refused_and_the_bridge_carries_on() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = yaml(dir.path(), listener.local_addr().unwrap(), "");
    let saguin = Broker::start_in(dir, &config);
    let (mut peer, _) = Peer::accept(&listener, ConnAckProperties::default(), false).await;
    for (version, id) in [
        (v5(), "bridge:cloud"),
        (v4(), "bridge:cloud"),
        (v5(), "bridge:added-later"),
        (v4(), "bridge:"),
    ] {
        let mut c = Raw::tcp(saguin.addr(), version).await;
        let ack = c.connect(id, ConnectOpts::persistent(600)).await;
        assert_eq!(ack.reason, ReasonCode::ClientIdentifierNotValid, "{id}");
        assert!(!ack.session_present);
        assert!(c.expect_close().await.is_empty(), "{id}: closed after");
    }
    // 3.1.1's CONNACK carries return code 0x02, identifier rejected.
    let ack = broker_support::v311_connack_bytes(saguin.addr(), b"bridge:cloud", true).await;
    assert_eq!(ack, [0x20, 0x02, 0x00, 0x02]);
    let line = saguin.wait_log(|l| l.contains("bridge:added-later"));
    assert!(
        line.contains("connection refused") && line.contains("peer=127.0.0.1:"),
        "{line}"
    );
    // A real client is told so, on both versions.
    if broker_support::have_mosquitto_clients("bridge client id") {
        let port = saguin.port().to_string();
        for version in ["mqttv5", "mqttv311"] {
            let out = std::process::Command::new("mosquitto_pub")
                .args(["-p", &port, "-V", version, "-i", "bridge:cloud"])
                .args(["-t", "telemetry/x", "-m", "m", "-q", "1"])
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
            assert!(!out.status.success(), "{version}: refused");
            assert!(said.contains("identifier"), "{version}: {said}");
        }
    }
    // The bridge's principal is not to be had either: without a password
    // file a user name is the principal as given.
    for version in [v5(), v4()] {
        let mut c = Raw::tcp(saguin.addr(), version).await;
        let mut opts = ConnectOpts::clean();
        opts.username = Some("bridge:cloud".into());
        let ack = c.connect("stranger", opts).await;
        assert_eq!(ack.reason, ReasonCode::BadUserNameOrPassword);
        assert!(c.expect_close().await.is_empty());
    }
    // An id that only looks like one is a client like any other.
    let mut c = Raw::tcp(saguin.addr(), v5()).await;
    assert_eq!(
        c.connect("bridge-cloud", ConnectOpts::clean()).await.reason,
        ReasonCode::Success
    );
    c.disconnect().await;
    // The bridge's own connection still carries the channel out.
    publish(&saguin, "telemetry/after", b"after").await;
    let sent = peer.next_publish().await;
    assert_eq!(&sent.payload[..], b"after");
}
