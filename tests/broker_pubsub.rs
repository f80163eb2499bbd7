//! Publish/subscribe through the real broker: rumqttc 3.1.1 and 5.0 clients
//! at every QoS, Mosquitto's command-line clients, retained messages,
//! overlapping subscriptions, subscription identifiers, no-local, shared
//! subscriptions, topic aliases, message expiry and `$SYS`.

mod broker_support;

use std::time::Duration;

use broker_support::*;
use bytes::Bytes;
use saguin::broker::codec::{
    Packet, PublishProperties, ReasonCode, RetainHandling, SubscriptionOptions,
};
use tokio::sync::mpsc;

/// A rumqttc 3.1.1 client whose received PUBLISHes arrive on a channel, and
/// whose SUBACKs are awaited.
struct V4 {
    client: rumqttc::AsyncClient,
    publishes: mpsc::UnboundedReceiver<rumqttc::Publish>,
    subacks: mpsc::UnboundedReceiver<()>,
}

impl V4 {
    async fn connect(port: u16, id: &str) -> V4 {
        let mut opts = rumqttc::MqttOptions::new(id, "127.0.0.1", port);
        opts.set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = rumqttc::AsyncClient::new(opts, 100);
        let (ptx, publishes) = mpsc::unbounded_channel();
        let (stx, subacks) = mpsc::unbounded_channel();
        let (ctx, mut connected) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                        let _ = ptx.send(p);
                    }
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_))) => {
                        let _ = stx.send(());
                    }
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                        let _ = ctx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        tokio::time::timeout(WAIT, connected.recv())
            .await
            .expect("CONNACK")
            .expect("connected");
        V4 {
            client,
            publishes,
            subacks,
        }
    }

    async fn subscribe(&mut self, filter: &str, q: rumqttc::QoS) {
        self.client.subscribe(filter, q).await.unwrap();
        tokio::time::timeout(WAIT, self.subacks.recv())
            .await
            .expect("SUBACK")
            .unwrap();
    }

    async fn next(&mut self) -> rumqttc::Publish {
        tokio::time::timeout(WAIT, self.publishes.recv())
            .await
            .expect("PUBLISH")
            .unwrap()
    }
}

struct V5 {
    client: rumqttc::v5::AsyncClient,
    publishes: mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::Publish>,
    subacks: mpsc::UnboundedReceiver<()>,
}

impl V5 {
    async fn connect(port: u16, id: &str) -> V5 {
        use rumqttc::v5::mqttbytes::v5::Packet as P;
        use rumqttc::v5::Event as E;
        let mut opts = rumqttc::v5::MqttOptions::new(id, "127.0.0.1", port);
        opts.set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(opts, 100);
        let (ptx, publishes) = mpsc::unbounded_channel();
        let (stx, subacks) = mpsc::unbounded_channel();
        let (ctx, mut connected) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(E::Incoming(P::Publish(p))) => {
                        let _ = ptx.send(p);
                    }
                    Ok(E::Incoming(P::SubAck(_))) => {
                        let _ = stx.send(());
                    }
                    Ok(E::Incoming(P::ConnAck(_))) => {
                        let _ = ctx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        tokio::time::timeout(WAIT, connected.recv())
            .await
            .expect("CONNACK")
            .expect("connected");
        V5 {
            client,
            publishes,
            subacks,
        }
    }

    async fn subscribe(&mut self, filter: &str, q: rumqttc::v5::mqttbytes::QoS) {
        self.client.subscribe(filter, q).await.unwrap();
        tokio::time::timeout(WAIT, self.subacks.recv())
            .await
            .expect("SUBACK")
            .unwrap();
    }

    async fn next(&mut self) -> rumqttc::v5::mqttbytes::v5::Publish {
        tokio::time::timeout(WAIT, self.publishes.recv())
            .await
            .expect("PUBLISH")
            .unwrap()
    }
}

#[tokio::test]
async fn rumqttc_v4_every_qos() {
    let broker = Broker::anonymous();
    let mut sub = V4::connect(broker.port(), "v4-sub").await;
    let publisher = V4::connect(broker.port(), "v4-pub").await;
    sub.subscribe("v4/+/data", rumqttc::QoS::ExactlyOnce).await;
    for (i, q) in [
        rumqttc::QoS::AtMostOnce,
        rumqttc::QoS::AtLeastOnce,
        rumqttc::QoS::ExactlyOnce,
    ]
    .into_iter()
    .enumerate()
    {
        let payload = format!("message {i}");
        publisher
            .client
            .publish("v4/dev/data", q, false, payload.clone())
            .await
            .unwrap();
        let got = sub.next().await;
        assert_eq!(got.topic, "v4/dev/data");
        assert_eq!(got.payload, Bytes::from(payload));
        assert_eq!(
            got.qos, q,
            "delivered at the publish QoS (subscription allows 2)"
        );
        assert!(!got.retain);
    }
}

#[tokio::test]
async fn rumqttc_v5_every_qos_and_downgrade() {
    use rumqttc::v5::mqttbytes::QoS as Q;
    let broker = Broker::anonymous();
    let mut sub = V5::connect(broker.port(), "v5-sub").await;
    let mut low = V5::connect(broker.port(), "v5-sub-q1").await;
    let publisher = V5::connect(broker.port(), "v5-pub").await;
    sub.subscribe("v5/#", Q::ExactlyOnce).await;
    low.subscribe("v5/#", Q::AtLeastOnce).await;
    for (i, q) in [Q::AtMostOnce, Q::AtLeastOnce, Q::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        let payload = format!("v5 message {i}");
        publisher
            .client
            .publish("v5/x", q, false, payload.clone())
            .await
            .unwrap();
        let got = sub.next().await;
        assert_eq!(got.topic, Bytes::from_static(b"v5/x"));
        assert_eq!(got.payload, Bytes::from(payload.clone()));
        assert_eq!(got.qos, q);
        let got = low.next().await;
        assert_eq!(got.payload, Bytes::from(payload));
        assert_eq!(
            got.qos,
            if q == Q::AtMostOnce {
                Q::AtMostOnce
            } else {
                Q::AtLeastOnce
            },
            "capped at the subscription's QoS"
        );
    }
}

#[tokio::test]
async fn v4_and_v5_clients_interoperate() {
    let broker = Broker::anonymous();
    let mut v4 = V4::connect(broker.port(), "mix-v4").await;
    let mut v5 = V5::connect(broker.port(), "mix-v5").await;
    v4.subscribe("mix/to-v4", rumqttc::QoS::AtLeastOnce).await;
    v5.subscribe("mix/to-v5", rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await;
    v5.client
        .publish(
            "mix/to-v4",
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            false,
            "from five",
        )
        .await
        .unwrap();
    v4.client
        .publish("mix/to-v5", rumqttc::QoS::AtLeastOnce, false, "from four")
        .await
        .unwrap();
    assert_eq!(v4.next().await.payload, Bytes::from_static(b"from five"));
    assert_eq!(v5.next().await.payload, Bytes::from_static(b"from four"));
}

#[tokio::test]
async fn retained_set_deliver_clear() {
    let broker = Broker::anonymous();
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    p.connect("ret-pub", ConnectOpts::clean()).await;
    p.publish_acked("ret/a", b"A", 1, true, 1).await;
    p.publish_acked("ret/b", b"B", 2, true, 2).await;
    p.publish_acked("ret/c/d", b"CD", 0, true, 0).await;

    let mut s = Raw::tcp(broker.addr(), v4()).await;
    s.connect("ret-sub", ConnectOpts::clean()).await;
    assert_eq!(
        s.subscribe(1, "ret/+", 2).await,
        vec![ReasonCode::GrantedQoS2]
    );
    let mut got = Vec::new();
    for _ in 0..2 {
        let m = s.next_publish(true).await;
        assert!(m.retain, "retained messages are delivered with RETAIN=1");
        got.push((m.topic.to_string(), m.payload.clone(), m.qos as u8));
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            ("ret/a".into(), Bytes::from_static(b"A"), 1),
            ("ret/b".into(), Bytes::from_static(b"B"), 2)
        ]
    );
    // A live publish with RETAIN is forwarded with RETAIN=0 (no
    // retain-as-published on this subscription).
    p.publish_acked("ret/a", b"A2", 1, true, 3).await;
    let live = s.next_publish(true).await;
    assert_eq!(live.payload, Bytes::from_static(b"A2"));
    assert!(!live.retain);
    // An empty retained payload clears it.
    p.publish_acked("ret/a", b"", 1, true, 4).await;
    let _ = s.next_publish(true).await;
    let mut late = Raw::tcp(broker.addr(), v4()).await;
    late.connect("ret-late", ConnectOpts::clean()).await;
    late.subscribe(1, "ret/#", 1).await;
    let m = late.next_publish(true).await;
    assert_eq!(m.topic.to_string(), "ret/b");
    let m = late.next_publish(true).await;
    assert_eq!(m.topic.to_string(), "ret/c/d");
    late.expect_nothing().await;
}

#[tokio::test]
async fn retain_handling_and_retain_as_published() {
    let broker = Broker::anonymous();
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    p.connect("rh-pub", ConnectOpts::clean()).await;
    p.publish_acked("rh/t", b"kept", 1, true, 1).await;
    let mut s = Raw::tcp(broker.addr(), v5()).await;
    s.connect("rh-sub", ConnectOpts::clean()).await;
    let opts = |rh, rap| SubscriptionOptions {
        qos: qos(1),
        retain_as_published: rap,
        retain_handling: rh,
        ..Default::default()
    };
    // 2: never send retained.
    s.subscribe_with(1, "rh/t", opts(RetainHandling::DoNotSend, false), None)
        .await;
    s.expect_nothing().await;
    // 1: only for a new subscription — this one exists.
    s.subscribe_with(2, "rh/t", opts(RetainHandling::OnNewSubscribe, true), None)
        .await;
    s.expect_nothing().await;
    // 0: always.
    s.subscribe_with(3, "rh/t", opts(RetainHandling::OnSubscribe, true), None)
        .await;
    let m = s.next_publish(true).await;
    assert!(m.retain);
    // Retain-as-published keeps RETAIN=1 on a live retained publish.
    p.publish_acked("rh/t", b"again", 1, true, 2).await;
    let m = s.next_publish(true).await;
    assert_eq!(m.payload, Bytes::from_static(b"again"));
    assert!(m.retain);
}

#[tokio::test]
async fn no_local_and_user_properties_and_response_fields_forwarded() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    c.connect("nl", ConnectOpts::clean()).await;
    c.subscribe_with(
        1,
        "nl/t",
        SubscriptionOptions {
            qos: qos(1),
            no_local: true,
            ..Default::default()
        },
        None,
    )
    .await;
    let mut other = Raw::tcp(broker.addr(), v5()).await;
    other.connect("nl-other", ConnectOpts::clean()).await;
    other.subscribe(1, "nl/t", 1).await;
    let props = PublishProperties {
        user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
        response_topic: Some("nl/reply".into()),
        correlation_data: Some(Bytes::from_static(b"corr")),
        content_type: Some("text/plain".into()),
        ..Default::default()
    };
    c.publish_props("nl/t", b"mine", 1, false, 1, props.clone())
        .await;
    match c.recv().await {
        Some(Packet::PubAck(a)) => assert_eq!(a.packet_id, 1),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    c.expect_nothing().await;
    let m = other.next_publish(true).await;
    assert_eq!(m.properties.user_properties, props.user_properties);
    assert_eq!(m.properties.response_topic, props.response_topic);
    assert_eq!(m.properties.correlation_data, props.correlation_data);
    assert_eq!(m.properties.content_type, props.content_type);
}

#[tokio::test]
async fn topic_alias_inbound_and_invalid_alias() {
    let broker = Broker::anonymous();
    let mut s = Raw::tcp(broker.addr(), v4()).await;
    s.connect("ta-sub", ConnectOpts::clean()).await;
    s.subscribe(1, "ta/#", 0).await;
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    let ack = p.connect("ta-pub", ConnectOpts::clean()).await;
    let max = ack
        .properties
        .topic_alias_maximum
        .expect("topic alias maximum announced");
    assert!(max >= 1);
    let alias = |a| PublishProperties {
        topic_alias: Some(a),
        ..Default::default()
    };
    p.publish_props("ta/long/topic", b"1", 0, false, 0, alias(1))
        .await;
    p.publish_props("", b"2", 0, false, 0, alias(1)).await;
    for expected in [b"1", b"2"] {
        let m = s.next_publish(true).await;
        assert_eq!(m.topic.to_string(), "ta/long/topic");
        assert_eq!(&m.payload[..], expected);
    }
    p.publish_props("ta/x", b"3", 0, false, 0, alias(max + 1))
        .await;
    let closing = p.expect_close().await;
    assert!(
        matches!(closing.as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::TopicAliasInvalid),
        "{closing:?}"
    );
}

// Message expiry of queued messages: timing, tested on the state's injected clock in
// src/broker/state/tests.rs (a_queued_message_expires_and_the_rest_carry_the_time_left).

#[tokio::test]
async fn sys_statistics() {
    let broker = Broker::anonymous();
    let mut s = Raw::tcp(broker.addr(), v4()).await;
    s.connect("sys", ConnectOpts::clean()).await;
    // `#` does not match `$` topics.
    s.subscribe(1, "#", 0).await;
    s.expect_nothing().await;
    s.subscribe(2, "$SYS/broker/#", 0).await;
    let mut topics = Vec::new();
    for _ in 0..4 {
        let m = s.next_publish(true).await;
        topics.push(m.topic.to_string());
    }
    for t in [
        "$SYS/broker/version",
        "$SYS/broker/uptime",
        "$SYS/broker/clients/connected",
        "$SYS/broker/messages/received",
    ] {
        assert!(topics.iter().any(|x| x == t), "{t} missing from {topics:?}");
    }
}

#[tokio::test]
async fn v5_server_assigned_client_id_and_v4_empty_id() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("", ConnectOpts::clean()).await;
    assert_eq!(ack.reason, ReasonCode::Success);
    assert!(ack
        .properties
        .assigned_client_identifier
        .as_deref()
        .is_some_and(|id| !id.is_empty()));
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    let ack = c.connect("", ConnectOpts::clean()).await;
    assert_eq!(ack.reason, ReasonCode::Success);
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    let ack = c.connect("", ConnectOpts::persistent(0)).await;
    assert_eq!(
        ack.reason,
        ReasonCode::ClientIdentifierNotValid,
        "3.1.1 return code 2"
    );
}

/// Wait until the broker counts exactly `n` subscriptions (`$SYS`).
async fn wait_subscriptions(probe: &mut Raw<tokio::net::TcpStream>, n: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    let mut packet_id = 1;
    loop {
        // Each SUBSCRIBE to `$SYS` is answered with fresh values.
        probe
            .subscribe(packet_id, "$SYS/broker/subscriptions/count", 0)
            .await;
        let m = probe.next_publish(true).await;
        let seen = String::from_utf8_lossy(&m.payload)
            .parse::<u64>()
            .unwrap_or(0);
        if seen == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "subscriptions stayed at {seen}, not {n}"
        );
        packet_id = packet_id % 1000 + 1;
    }
}

#[tokio::test]
async fn mosquitto_clients_pub_sub_every_qos() {
    if !have_mosquitto_clients("mosquitto_clients_pub_sub_every_qos") {
        return;
    }
    let broker = Broker::anonymous();
    let port = broker.port().to_string();
    // The probe's own `$SYS` subscription is the one always counted.
    let mut probe = Raw::tcp(broker.addr(), v4()).await;
    probe.connect("probe", ConnectOpts::clean()).await;
    for version in ["mqttv311", "mqttv5"] {
        for q in ["0", "1", "2"] {
            let topic = format!("mosq/{version}/{q}");
            let sub = std::process::Command::new("mosquitto_sub")
                .args([
                    "-V",
                    version,
                    "-p",
                    &port,
                    "-t",
                    &topic,
                    "-q",
                    q,
                    "-C",
                    "1",
                    "-W",
                    "10",
                    "-i",
                    &format!("ms-{version}-{q}"),
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            wait_subscriptions(&mut probe, 2).await;
            let status = std::process::Command::new("mosquitto_pub")
                .args([
                    "-V",
                    version,
                    "-p",
                    &port,
                    "-t",
                    &topic,
                    "-q",
                    q,
                    "-m",
                    "hello from mosquitto_pub",
                ])
                .status()
                .unwrap();
            assert!(status.success());
            let out = sub.wait_with_output().unwrap();
            assert!(out.status.success());
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "hello from mosquitto_pub"
            );
            // The next round starts once this subscriber is gone.
            wait_subscriptions(&mut probe, 1).await;
        }
    }
}
