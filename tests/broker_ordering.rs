//! A SUBSCRIBE on one connection and a PUBLISH on another, written one
//! right after the other: the subscription takes effect first, as on a
//! broker with one event loop (Mosquitto), though MQTT promises no order
//! across connections. Measured against Mosquitto itself, alternating
//! round by round, so both meet the same machine at the same moment.

mod bridge_support;
mod broker_support;

use bridge_support::{have_mosquitto, Mosquitto};
use broker_support::{v5, wire_bytes, Broker, ConnectOpts, Raw};
use saguin::broker::codec::{
    ByteStr, Packet, Publish, PublishProperties, QoS, Subscribe, SubscribeFilter,
    SubscribeProperties, SubscriptionOptions, Unsubscribe,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Rounds per broker.
const ROUNDS: usize = 1000;

/// A subscriber and a publisher on one broker, and what reached the
/// subscriber.
struct Pair {
    name: &'static str,
    sub: Raw<TcpStream>,
    publisher: Raw<TcpStream>,
    delivered: usize,
}

async fn pair(name: &'static str, addr: std::net::SocketAddr, persistent: bool) -> Pair {
    let mut sub = Raw::tcp(addr, v5()).await;
    // Each packet goes when written, as MQTT clients send them: a round
    // is several small writes on each connection.
    sub.stream.set_nodelay(true).expect("nodelay");
    let opts = if persistent {
        ConnectOpts::persistent(3600)
    } else {
        ConnectOpts::clean()
    };
    sub.connect(&format!("order-sub-{name}"), opts).await;
    let mut publisher = Raw::tcp(addr, v5()).await;
    publisher.stream.set_nodelay(true).expect("nodelay");
    publisher
        .connect(&format!("order-pub-{name}"), ConnectOpts::clean())
        .await;
    Pair {
        name,
        sub,
        publisher,
        delivered: 0,
    }
}

/// One round: SUBSCRIBE to a fresh topic and, at once, from the other
/// connection, PUBLISH to it (QoS 0), each written whole before the next.
/// Whether it was delivered is known without a timeout: once the
/// publisher's PINGRESP is in hand its PUBLISH was handled, so a delivery
/// was queued for the subscriber before the subscriber's own ping. The
/// topic is unsubscribed again (a session holds at most
/// `limits.max_subscriptions_per_session` subscriptions).
async fn round(p: &mut Pair, i: usize) {
    let topic = format!("order/{}/{i}", p.name);
    let subscribe = wire_bytes(
        &Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: topic.clone(),
                options: SubscriptionOptions::default(),
            }],
            properties: SubscribeProperties::default(),
        }),
        v5(),
    );
    let publish = wire_bytes(
        &Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: ByteStr::from(topic.as_str()),
            packet_id: 0,
            payload: bytes::Bytes::from_static(b"x"),
            properties: PublishProperties::default(),
        }),
        v5(),
    );
    p.sub.stream.write_all(&subscribe).await.expect("write");
    p.publisher.stream.write_all(&publish).await.expect("write");
    let to_publisher = p.publisher.round_trip().await;
    assert!(to_publisher.is_empty(), "{to_publisher:?}");
    let mut seen = p.sub.round_trip().await;
    if !seen.iter().any(|s| matches!(s, Packet::SubAck(_))) {
        // Not yet answered (a SUBACK that waits for its commit comes
        // after the PINGRESP only if the ping was answered first: it is
        // not, but say so rather than miscount).
        seen.extend(p.sub.round_trip().await);
    }
    assert!(
        seen.iter().any(|s| matches!(s, Packet::SubAck(_))),
        "{}: no SUBACK: {seen:?}",
        p.name
    );
    if seen
        .iter()
        .any(|s| matches!(s, Packet::Publish(m) if *m.topic == *topic))
    {
        p.delivered += 1;
    }
    p.sub
        .send(Packet::Unsubscribe(Unsubscribe {
            packet_id: 2,
            filters: vec![topic],
            properties: Default::default(),
        }))
        .await;
    loop {
        match p.sub.recv().await {
            Some(Packet::UnsubAck(_)) => break,
            Some(Packet::Publish(_)) => continue,
            other => panic!("{}: expected UNSUBACK, got {other:?}", p.name),
        }
    }
}

/// A client SUBSCRIBEs and another PUBLISHes a moment later without
/// waiting for the SUBACK (as the Paho MQTT 5.0 interoperability suite's
/// request/response and subscribe-options tests do): the runtime ran the
/// task it woke last first, so of two sockets readable together the later
/// one's packets reached the state first; saguin takes them in the order
/// the sockets became readable. On a memory-only broker and on one keeping
/// sessions in sqlite (the subscriber's session persistent, its SUBSCRIBE
/// stored before its SUBACK), saguin delivers as many as Mosquitto in the
/// same alternating run, within three hundredths of the rounds.
#[test]
fn a_subscribe_read_before_a_publish_on_another_connection_takes_effect_first() {
    let test = "a_subscribe_read_before_a_publish_on_another_connection_takes_effect_first";
    if !have_mosquitto(test) {
        return;
    }
    let memory = Broker::plain("auth:\n  allow_anonymous: true\n");
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = Broker::start(&format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\nstorage:\n  - name: db\n    kind: sqlite\n    file_path: {}\nbroker:\n  session_storage: db\n",
        dir.path().join("sessions.db").display()
    ));
    let mosquitto = Mosquitto::start("");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (memory_pair, sqlite_pair, mosquitto_pair) = rt.block_on(async {
        let mut pairs = [
            pair("memory", memory.addr(), false).await,
            pair("sqlite", sqlite.addr(), true).await,
            pair("mosquitto", mosquitto.addr(), false).await,
        ];
        for i in 0..ROUNDS {
            for p in pairs.iter_mut() {
                round(p, i).await;
            }
        }
        let [m, s, q] = pairs;
        (m.delivered, s.delivered, q.delivered)
    });
    eprintln!(
        "FIGURE subscribe then publish at once, alternating {ROUNDS} rounds each: saguin memory {memory_pair}, saguin sqlite sessions {sqlite_pair}, Mosquitto {mosquitto_pair}"
    );
    // A reader whose worker thread the machine took away at the moment
    // its bytes came (this test runs beside other builds) can still lose
    // the race now and then; without the read order about a fifth of the
    // rounds were lost. Keeping sessions in sqlite puts the provider's
    // threads beside the broker's on the same CPUs: on a slow day of this
    // 2-core machine it lost 11-15 rounds in one run of four, the build
    // before its read connections were opened as reads need them as well,
    // where memory lost none; memory lost 21 in a run beside a release
    // build of the whole project. Both are held to three hundredths:
    // without the read order about a fifth is lost.
    let allowed = mosquitto_pair.saturating_sub(3 * ROUNDS / 100);
    assert!(
        memory_pair >= allowed,
        "memory: saguin delivered {memory_pair} of {ROUNDS}, Mosquitto {mosquitto_pair}"
    );
    let allowed = mosquitto_pair.saturating_sub(3 * ROUNDS / 100);
    assert!(
        sqlite_pair >= allowed,
        "sqlite sessions: saguin delivered {sqlite_pair} of {ROUNDS}, Mosquitto {mosquitto_pair}"
    );
}
