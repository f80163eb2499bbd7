//! MQTT 3.1.1 and 5.0 conformance through the real broker with its default
//! settings (anonymous, everything in memory), one behaviour per test, as an
//! interoperability suite (Eclipse Paho's client_test.py / client_test5.py)
//! and the normative statements would check it. Each test names the
//! statement it checks.

mod broker_support;

use broker_support::*;
use bytes::Bytes;
use saguin::broker::codec::{
    self, ByteStr, Packet, PayloadFormat, ProtocolVersion, PubAck, Publish, PublishProperties,
    ReasonCode, RetainHandling, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions, Unsubscribe,
};
use tokio::net::TcpStream;

type Client = Raw<TcpStream>;

async fn client(broker: &Broker, version: ProtocolVersion, id: &str) -> Client {
    let mut c = Raw::tcp(broker.addr(), version).await;
    let ack = c.connect(id, ConnectOpts::clean()).await;
    assert_eq!(ack.reason, ReasonCode::Success, "{ack:?}");
    c
}

async fn persistent(broker: &Broker, version: ProtocolVersion, id: &str) -> (Client, bool) {
    let mut c = Raw::tcp(broker.addr(), version).await;
    let ack = c.connect(id, ConnectOpts::persistent(300)).await;
    assert_eq!(ack.reason, ReasonCode::Success, "{ack:?}");
    (c, ack.session_present)
}

fn options(q: u8) -> SubscriptionOptions {
    SubscriptionOptions {
        qos: qos(q),
        ..Default::default()
    }
}

/// The broker closes the connection; on MQTT 5 its last packet is a
/// DISCONNECT with `code`.
async fn expect_disconnect(c: &mut Client, code: ReasonCode) {
    let seen = c.expect_close().await;
    if c.version == ProtocolVersion::V5 {
        match seen.last() {
            Some(Packet::Disconnect(d)) => assert_eq!(d.reason, code, "{seen:?}"),
            other => panic!("expected DISCONNECT {code:?}, got {other:?} after {seen:?}"),
        }
    }
}

/// The broker closes the connection without a CONNACK.
async fn expect_closed_without_connack(c: &mut Client) {
    let seen = c.expect_close().await;
    assert!(
        !seen.iter().any(|p| matches!(p, Packet::ConnAck(_))),
        "{seen:?}"
    );
}

/// DISCONNECT 0x00 and wait for the broker to close the connection, so the
/// next CONNECT with the same client id is not a takeover.
async fn disconnect_and_wait(mut c: Client) {
    c.send(Packet::Disconnect(codec::Disconnect::new(
        ReasonCode::Success,
    )))
    .await;
    c.expect_close().await;
}

fn body(p: &Publish) -> &[u8] {
    &p.payload
}

// ---------------------------------------------------------------- basics

/// MQTT-3.3.5-1 / MQTT-4.3: messages at each QoS, delivered at the
/// minimum of published and granted QoS (3.1.1).
#[tokio::test]
async fn publish_subscribe_at_each_qos_v311() {
    let broker = Broker::anonymous();
    check_each_qos(&broker, v4()).await;
}

/// MQTT-3.3.5-1 / MQTT-4.3: the same on MQTT 5.
#[tokio::test]
async fn publish_subscribe_at_each_qos_v5() {
    let broker = Broker::anonymous();
    check_each_qos(&broker, v5()).await;
}

async fn check_each_qos(broker: &Broker, version: ProtocolVersion) {
    let mut sub = client(broker, version, "qos-sub").await;
    let mut publisher = client(broker, version, "qos-pub").await;
    for granted in 0..=2u8 {
        let filter = format!("qos/{granted}");
        assert_eq!(
            sub.subscribe(1, &filter, granted).await,
            vec![ReasonCode::from_u8(granted).unwrap()]
        );
        for published in 0..=2u8 {
            let payload = format!("{granted}{published}");
            publisher
                .publish_acked(&filter, payload.as_bytes(), published, false, 10)
                .await;
            let got = sub.next_publish(true).await;
            assert_eq!(body(&got), payload.as_bytes());
            assert_eq!(got.qos.as_u8(), granted.min(published));
            assert!(!got.retain && !got.dup);
        }
    }
}

// ---------------------------------------------------------------- retained

/// MQTT-3.3.1-5 / MQTT-3.3.1-6 (5.0: MQTT-3.3.1-9): a retained message is
/// stored and sent to a new subscription with RETAIN=1; a live forward to an
/// existing subscription has RETAIN=0 (3.1.1 MQTT-3.3.1-9).
#[tokio::test]
async fn retained_message_delivered_on_subscribe_with_retain_flag() {
    let broker = Broker::anonymous();
    let mut publisher = client(&broker, v4(), "ret-pub").await;
    let mut live = client(&broker, v4(), "ret-live").await;
    live.subscribe(1, "ret/#", 1).await;
    publisher.publish_acked("ret/a", b"kept", 1, true, 1).await;
    let forwarded = live.next_publish(true).await;
    assert!(!forwarded.retain, "live forward keeps RETAIN=0 on 3.1.1");
    for version in [v4(), v5()] {
        let mut late = client(&broker, version, "ret-late").await;
        late.subscribe(1, "ret/+", 1).await;
        let got = late.next_publish(true).await;
        assert_eq!(body(&got), b"kept");
        assert!(got.retain);
        late.disconnect().await;
    }
}

/// MQTT-3.3.1-10 / MQTT-3.3.1-11 (5.0: MQTT-3.3.1-6/-7): a retained PUBLISH
/// with an empty payload removes the retained message and is forwarded.
#[tokio::test]
async fn retained_message_cleared_by_empty_payload() {
    let broker = Broker::anonymous();
    let mut publisher = client(&broker, v5(), "clr-pub").await;
    publisher.publish_acked("clr/a", b"kept", 1, true, 1).await;
    let mut live = client(&broker, v5(), "clr-live").await;
    live.subscribe(1, "clr/a", 1).await;
    assert_eq!(body(&live.next_publish(true).await), b"kept");
    publisher.publish_acked("clr/a", b"", 1, true, 2).await;
    assert_eq!(body(&live.next_publish(true).await), b"");
    let mut late = client(&broker, v5(), "clr-late").await;
    late.subscribe(1, "clr/#", 1).await;
    late.expect_nothing().await;
}

/// MQTT-4.7.2-1: topics beginning with `$` are not matched by filters
/// starting with `#` or `+`, neither live nor retained.
#[tokio::test]
async fn dollar_topics_not_matched_by_leading_wildcards() {
    let broker = Broker::anonymous();
    let mut publisher = client(&broker, v5(), "dollar-pub").await;
    publisher.publish_acked("$test/x", b"r", 1, true, 1).await;
    let mut sub = client(&broker, v5(), "dollar-sub").await;
    sub.subscribe(1, "#", 1).await;
    sub.subscribe(2, "+/x", 1).await;
    sub.subscribe(3, "+/+", 1).await;
    publisher
        .publish_acked("$test/x", b"live", 1, false, 2)
        .await;
    // A marker proves the subscriptions work and orders the check.
    publisher
        .publish_acked("plain/x", b"marker", 1, false, 3)
        .await;
    let got = sub.next_publish(true).await;
    assert_eq!(&*got.topic, "plain/x");
    sub.expect_nothing().await;
    let mut explicit = client(&broker, v5(), "dollar-explicit").await;
    explicit.subscribe(1, "$test/#", 1).await;
    assert_eq!(body(&explicit.next_publish(true).await), b"r");
}

// ---------------------------------------------------------------- sessions

/// MQTT-3.1.2-4 / MQTT-3.1.2-5: with clean session 0 (3.1.1) the
/// subscription and QoS 1/2 messages published while offline survive; the
/// CONNACK says the session is present (MQTT-3.2.2-2).
#[tokio::test]
async fn offline_messages_queued_for_persistent_session_v311() {
    let broker = Broker::anonymous();
    let (mut sub, present) = persistent(&broker, v4(), "offline-v4").await;
    assert!(!present);
    sub.subscribe(1, "off/#", 2).await;
    disconnect_and_wait(sub).await;
    let mut publisher = client(&broker, v4(), "offline-pub").await;
    publisher.publish_acked("off/0", b"zero", 0, false, 1).await;
    publisher.publish_acked("off/1", b"one", 1, false, 2).await;
    publisher.publish_acked("off/2", b"two", 2, false, 3).await;
    let (mut sub, present) = persistent(&broker, v4(), "offline-v4").await;
    assert!(present);
    assert_eq!(body(&sub.next_publish(true).await), b"one");
    assert_eq!(body(&sub.next_publish(true).await), b"two");
    sub.expect_nothing().await;
}

/// MQTT-4.4.0-1 / MQTT-3.3.1-1 / MQTT-4.6.0-1: unacknowledged messages are
/// resent on reconnect with DUP=1, the same packet ids, in order.
#[tokio::test]
async fn unacknowledged_messages_redelivered_with_dup_in_order() {
    let broker = Broker::anonymous();
    let (mut sub, _) = persistent(&broker, v4(), "redeliver").await;
    sub.subscribe(1, "redo", 1).await;
    let mut publisher = client(&broker, v4(), "redeliver-pub").await;
    for i in 0..3u16 {
        publisher
            .publish_acked("redo", format!("m{i}").as_bytes(), 1, false, i + 1)
            .await;
    }
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(sub.next_publish(false).await);
    }
    drop(sub); // no PUBACK, network loss
    let (mut sub, present) = persistent(&broker, v4(), "redeliver").await;
    assert!(present);
    for original in &first {
        let again = sub.next_publish(true).await;
        assert!(again.dup);
        assert_eq!(again.packet_id, original.packet_id);
        assert_eq!(again.payload, original.payload);
    }
}

/// MQTT 5 3.1.2.11.2: Session Expiry Interval 0 (absent) ends the session
/// when the connection closes.
#[tokio::test]
async fn session_expiry_zero_ends_the_session_at_disconnect() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.clean_start = false;
    c.connect("exp0", opts.clone()).await;
    c.subscribe(1, "exp0", 1).await;
    disconnect_and_wait(c).await;
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("exp0", opts).await;
    assert!(!ack.session_present);
}

/// MQTT 5 3.1.2.11.2 / MQTT-3.1.4-3 (Paho client_test5 session expiry): a
/// session with expiry 0 ends when its connection is taken over, so the new
/// connection (clean start 0) finds no session.
#[tokio::test]
async fn takeover_of_a_session_with_expiry_zero_finds_no_session() {
    let broker = Broker::anonymous();
    for version in [v5(), v4()] {
        let mut first = Raw::tcp(broker.addr(), version).await;
        let ack = first.connect("take0", ConnectOpts::clean()).await;
        assert!(!ack.session_present);
        first.subscribe(1, "take0", 1).await;
        let mut second = Raw::tcp(broker.addr(), version).await;
        let mut opts = ConnectOpts::clean();
        opts.clean_start = false;
        if version == v4() {
            // 3.1.1 clean session 0 asks for a persistent session; the old
            // clean session still ended with its connection.
            opts.properties.session_expiry_interval = None;
        }
        let ack = second.connect("take0", opts).await;
        assert!(!ack.session_present, "{version:?}");
        expect_disconnect(&mut first, ReasonCode::SessionTakenOver).await;
        disconnect_and_wait(second).await;
        // Clean the 3.1.1 persistent session for the next round.
        let cleaner = client(&broker, version, "take0").await;
        disconnect_and_wait(cleaner).await;
    }
}

/// MQTT 5 3.1.2.11.2: a non-zero Session Expiry Interval keeps the session.
#[tokio::test]
async fn session_expiry_interval_keeps_the_session() {
    let broker = Broker::anonymous();
    let (mut c, _) = persistent(&broker, v5(), "exp300").await;
    c.subscribe(1, "exp300", 1).await;
    disconnect_and_wait(c).await;
    let (_c, present) = persistent(&broker, v5(), "exp300").await;
    assert!(present);
}

// Session expiry after its interval: timing, tested on the state's injected clock in
// src/broker/state/tests.rs (a_session_ends_when_its_expiry_interval_passes_not_before).

/// MQTT-3.14.2-2 (5.0 3.14.2.2.2): DISCONNECT may set the Session Expiry
/// Interval to 0, ending the session.
#[tokio::test]
async fn disconnect_can_shorten_session_expiry_to_zero() {
    let broker = Broker::anonymous();
    let (mut c, _) = persistent(&broker, v5(), "shorten").await;
    c.send(Packet::Disconnect(codec::Disconnect {
        reason: ReasonCode::Success,
        properties: codec::DisconnectProperties {
            session_expiry_interval: Some(0),
            ..Default::default()
        },
    }))
    .await;
    assert!(c.expect_close().await.is_empty());
    let (_c, present) = persistent(&broker, v5(), "shorten").await;
    assert!(!present);
}

/// MQTT 5 3.14.2.2.2: a Session Expiry Interval of 0 at CONNECT cannot be
/// made non-zero by DISCONNECT: protocol error 0x82.
#[tokio::test]
async fn disconnect_cannot_raise_session_expiry_from_zero() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "raise").await;
    c.send(Packet::Disconnect(codec::Disconnect {
        reason: ReasonCode::Success,
        properties: codec::DisconnectProperties {
            session_expiry_interval: Some(60),
            ..Default::default()
        },
    }))
    .await;
    expect_disconnect(&mut c, ReasonCode::ProtocolError).await;
}

/// MQTT-3.1.3-7 / 5.0 3.2.2.3.7: an empty client id gets one assigned,
/// announced as Assigned Client Identifier.
#[tokio::test]
async fn empty_client_id_gets_assigned_identifier_v5() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("", ConnectOpts::clean()).await;
    assert_eq!(ack.reason, ReasonCode::Success);
    let id = ack
        .properties
        .assigned_client_identifier
        .expect("assigned id");
    assert!(!id.is_empty());
}

/// MQTT-3.1.3-8: 3.1.1 empty client id with clean session 0 → CONNACK 0x02
/// and close; with clean session 1 it is accepted (MQTT-3.1.3-6).
#[tokio::test]
async fn empty_client_id_rules_v311() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.send_connect("", ConnectOpts::persistent(0)).await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => {
            assert_eq!(ack.reason, ReasonCode::ClientIdentifierNotValid);
            assert!(!ack.session_present);
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
    assert!(c.expect_close().await.is_empty());
    // 0x02 on the wire, not 0x85.
    let ack = broker_support::v311_connack_bytes(broker.addr(), b"", false).await;
    assert_eq!(ack, [0x20, 0x02, 0x00, 0x02]);
    let accepted = client(&broker, v4(), "").await;
    drop(accepted);
}

// ---------------------------------------------------------------- CONNECT edge cases

/// MQTT-3.1.0-2 (5.0 MQTT-3.1.0-2): a second CONNECT is a protocol error.
#[tokio::test]
async fn second_connect_is_a_protocol_error() {
    let broker = Broker::anonymous();
    for version in [v4(), v5()] {
        let mut c = client(&broker, version, "twice").await;
        c.send_connect("twice", ConnectOpts::clean()).await;
        expect_disconnect(&mut c, ReasonCode::ProtocolError).await;
    }
}

/// MQTT-3.1.0-1: the first packet must be CONNECT; otherwise the connection
/// is closed.
#[tokio::test]
async fn first_packet_not_connect_closes() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.send(Packet::PingReq).await;
    expect_closed_without_connack(&mut c).await;
}

/// MQTT-3.1.2-3: the reserved CONNECT flag must be 0; otherwise malformed.
#[tokio::test]
async fn connect_reserved_flag_set_is_malformed() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.send_bytes(&[
        0x10, 0x0D, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x03, 0, 60, 0, 1, b'a',
    ])
    .await;
    expect_closed_without_connack(&mut c).await;
}

/// MQTT-3.1.2-14: Will QoS 3 is malformed.
#[tokio::test]
async fn connect_will_qos_3_is_malformed() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.send_bytes(&[
        0x10, 0x13, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x1E, 0, 60, 0, 1, b'a', 0, 1, b't', 0, 1,
        b'w',
    ])
    .await;
    expect_closed_without_connack(&mut c).await;
}

/// MQTT-3.1.2-22 (3.1.1): the password flag without the user name flag is
/// malformed.
#[tokio::test]
async fn connect_password_without_user_name_is_malformed_v311() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.send_bytes(&[
        0x10, 0x10, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x42, 0, 60, 0, 1, b'a', 0, 1, b'p',
    ])
    .await;
    expect_closed_without_connack(&mut c).await;
}

/// MQTT-3.1.2-18 / -19: a user name flag with a user name is accepted by a
/// broker that allows anonymous clients and has no password file.
#[tokio::test]
async fn connect_with_user_name_accepted_by_default_broker() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.username = Some("someone".into());
    opts.password = Some("secret".into());
    assert_eq!(c.connect("user", opts).await.reason, ReasonCode::Success);
}

// ---------------------------------------------------------------- keep alive

// Keep alive: 1.5 x Keep Alive on a paused clock in src/broker/connection.rs;
// the close with 0x8D and the Will in broker_session.rs.

// ---------------------------------------------------------------- overlapping subscriptions

/// MQTT-3.3.5-1 (3.1.1): overlapping subscriptions deliver the message
/// once, at the maximum granted QoS.
#[tokio::test]
async fn overlapping_subscriptions_deliver_once_at_max_qos_v311() {
    let broker = Broker::anonymous();
    let mut sub = client(&broker, v4(), "overlap4").await;
    sub.subscribe(1, "ov/#", 2).await;
    sub.subscribe(2, "ov/+", 1).await;
    let mut publisher = client(&broker, v4(), "overlap4-pub").await;
    publisher.publish_acked("ov/a", b"x", 2, false, 1).await;
    let got = sub.next_publish(true).await;
    assert_eq!(got.qos.as_u8(), 2);
    sub.expect_nothing().await;
}

/// MQTT-3.3.4-3 / MQTT-3.3.4-4 (5.0): a single copy for overlapping
/// subscriptions carries the Subscription Identifiers of all of them.
#[tokio::test]
async fn overlapping_subscriptions_carry_every_subscription_identifier_v5() {
    let broker = Broker::anonymous();
    let mut sub = client(&broker, v5(), "overlap5").await;
    sub.subscribe_with(1, "ov5/#", options(1), Some(7)).await;
    sub.subscribe_with(2, "ov5/+", options(1), Some(9)).await;
    sub.subscribe_with(3, "ov5/a", options(0), None).await;
    let mut publisher = client(&broker, v5(), "overlap5-pub").await;
    publisher.publish_acked("ov5/a", b"x", 1, false, 1).await;
    let got = sub.next_publish(true).await;
    let mut ids = got.properties.subscription_identifiers.clone();
    ids.sort_unstable();
    assert_eq!(ids, vec![7, 9]);
    sub.expect_nothing().await;
}

// ---------------------------------------------------------------- subscribe / unsubscribe

/// Paho client_test "subscribe failure": a default broker denies nothing,
/// so `test/nosubscribe` is granted.
#[tokio::test]
async fn default_broker_grants_test_nosubscribe() {
    let broker = Broker::anonymous();
    for version in [v4(), v5()] {
        let mut c = client(&broker, version, "nosub").await;
        assert_eq!(
            c.subscribe(1, "test/nosubscribe", 2).await,
            vec![ReasonCode::GrantedQoS2]
        );
    }
}

/// MQTT-4.7.1-1/-2 / MQTT-4.8.0-1 (5.0 4.13.1): a syntactically invalid
/// filter makes the SUBSCRIBE malformed: DISCONNECT 0x81 and close (the
/// per-filter 0x8F is for well-formed filters the broker does not accept).
#[tokio::test]
async fn syntactically_invalid_filter_is_malformed_v5() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "badfilter").await;
    // "a/#/b": # not last. Hand-encoded: the codec refuses to encode it.
    c.send_bytes(&[
        0x82, 0x0A, 0, 1, 0, 0, 5, b'a', b'/', b'#', b'/', b'b', 0x01,
    ])
    .await;
    expect_disconnect(&mut c, ReasonCode::MalformedPacket).await;
}

/// MQTT-4.8.2-1 / -2 (5.0 3.9.3): `$share/{ShareName}` without a filter is
/// a well-formed topic filter but no valid shared subscription: SUBACK 0x8F
/// for that filter, the others in the packet granted, the connection kept.
#[tokio::test]
async fn invalid_shared_subscription_gets_0x8f_per_filter() {
    let broker = Broker::anonymous();
    for (version, refused) in [
        (v5(), ReasonCode::TopicFilterInvalid),
        (v4(), ReasonCode::UnspecifiedError),
    ] {
        let mut c = client(&broker, version, "badshare").await;
        c.send(Packet::Subscribe(Subscribe {
            packet_id: 5,
            filters: vec![
                SubscribeFilter {
                    filter: "ok/topic".into(),
                    options: options(1),
                },
                SubscribeFilter {
                    filter: "$share/grp".into(),
                    options: options(1),
                },
                SubscribeFilter {
                    filter: "$share//a".into(),
                    options: options(1),
                },
            ],
            properties: SubscribeProperties::default(),
        }))
        .await;
        match c.recv().await {
            Some(Packet::SubAck(ack)) => assert_eq!(
                ack.reasons,
                vec![ReasonCode::GrantedQoS1, refused, refused],
                "{version:?}"
            ),
            other => panic!("expected SUBACK, got {other:?}"),
        }
        c.send(Packet::PingReq).await;
        assert!(matches!(c.recv().await, Some(Packet::PingResp)));
        disconnect_and_wait(c).await;
    }
}

/// MQTT-3.10.4-5 / MQTT-3.11.3-1 (5.0): UNSUBACK has one reason per
/// filter; 0x11 where no subscription existed; delivery stops.
#[tokio::test]
async fn unsubscribe_answers_per_filter_and_stops_delivery() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "unsub").await;
    c.subscribe(1, "uns/a", 1).await;
    c.send(Packet::Unsubscribe(Unsubscribe {
        packet_id: 2,
        filters: vec!["uns/a".into(), "uns/none".into()],
        properties: Default::default(),
    }))
    .await;
    match c.recv().await {
        Some(Packet::UnsubAck(ack)) => {
            assert_eq!(ack.packet_id, 2);
            assert_eq!(
                ack.reasons,
                vec![ReasonCode::Success, ReasonCode::NoSubscriptionExisted]
            );
        }
        other => panic!("expected UNSUBACK, got {other:?}"),
    }
    c.publish_acked("uns/a", b"gone", 1, false, 3).await;
    c.expect_nothing().await;
}

// ---------------------------------------------------------------- will

/// MQTT-3.1.2-8 / MQTT-3.14.4-3: DISCONNECT 0x00 discards the Will; 0x04
/// publishes it (5.0 3.14.2.1).
#[tokio::test]
async fn will_suppressed_by_normal_disconnect_sent_on_0x04() {
    let broker = Broker::anonymous();
    let mut watcher = client(&broker, v5(), "will-watch").await;
    watcher.subscribe(1, "will/#", 1).await;
    for (code, topic) in [(0x00u8, "will/normal"), (0x04, "will/with")] {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        let mut opts = ConnectOpts::clean();
        opts.will = Some((topic.into(), b"bye".to_vec(), 1, false, None));
        c.connect(topic, opts).await;
        c.send(Packet::Disconnect(codec::Disconnect::new(
            ReasonCode::from_u8(code).unwrap(),
        )))
        .await;
        c.expect_close().await;
    }
    let got = watcher.next_publish(true).await;
    assert_eq!(&*got.topic, "will/with");
    watcher.expect_nothing().await;
}

/// MQTT 5 3.1.3.2.2: the Will waits for its delay, but a session ending
/// first publishes it then (here: session expiry 0, delay 600 s).
#[tokio::test]
async fn will_sent_at_session_end_before_its_delay() {
    let broker = Broker::anonymous();
    let mut watcher = client(&broker, v5(), "wd-watch").await;
    watcher.subscribe(1, "wd/#", 1).await;
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.will = Some(("wd/x".into(), b"late".to_vec(), 1, false, Some(600)));
    c.connect("wd", opts).await;
    drop(c);
    assert_eq!(body(&watcher.next_publish(true).await), b"late");
}

/// MQTT 5 3.1.3.2.2 with MQTT-3.1.4-3: a takeover ends a session with
/// expiry 0, so the old connection's delayed Will is published then, even
/// when the new connection asks to resume (clean start 0).
#[tokio::test]
async fn takeover_of_expiry_zero_session_publishes_delayed_will() {
    let broker = Broker::anonymous();
    let mut watcher = client(&broker, v5(), "tw-watch").await;
    watcher.subscribe(1, "tw/#", 1).await;
    let mut old = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.will = Some(("tw/x".into(), b"gone".to_vec(), 1, false, Some(600)));
    old.connect("tw", opts).await;
    let mut new = Raw::tcp(broker.addr(), v5()).await;
    let mut resume = ConnectOpts::clean();
    resume.clean_start = false;
    assert!(!new.connect("tw", resume).await.session_present);
    assert_eq!(body(&watcher.next_publish(true).await), b"gone");
}

/// MQTT 5 3.1.3.2.2: with a session that outlives the connection, the Will
/// is published after the Will Delay Interval.
#[tokio::test]
async fn will_delay_interval_is_honoured() {
    let broker = Broker::anonymous();
    let mut watcher = client(&broker, v5(), "wdi-watch").await;
    watcher.subscribe(1, "wdi/#", 1).await;
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::persistent(300);
    opts.will = Some(("wdi/x".into(), b"delayed".to_vec(), 1, false, Some(1)));
    c.connect("wdi", opts).await;
    drop(c);
    // The broker's timer publishes it; that it waits the whole delay, and
    // that a reconnect cancels it, is tested on the state's clock
    // (a_will_waits_for_its_delay_and_a_reconnect_cancels_it).
    assert_eq!(body(&watcher.next_publish(true).await), b"delayed");
}

// ---------------------------------------------------------------- shared subscriptions

/// MQTT 5 4.8.2: a shared subscription delivers each message to one member,
/// in turn, at the minimum of published and granted QoS.
#[tokio::test]
async fn shared_subscription_round_robin_with_qos_downgrade() {
    let broker = Broker::anonymous();
    let mut a = client(&broker, v5(), "share-a").await;
    let mut b = client(&broker, v5(), "share-b").await;
    a.subscribe(1, "$share/g/sh/+", 0).await;
    b.subscribe(1, "$share/g/sh/+", 0).await;
    let mut publisher = client(&broker, v5(), "share-pub").await;
    for i in 0..4u16 {
        publisher
            .publish_acked("sh/x", format!("{i}").as_bytes(), 1, false, i + 1)
            .await;
    }
    let mut got = Vec::new();
    for member in [&mut a, &mut b] {
        for _ in 0..2 {
            let p = member.next_publish(true).await;
            assert_eq!(p.qos.as_u8(), 0);
            got.push(String::from_utf8(p.payload.to_vec()).unwrap());
        }
        member.expect_nothing().await;
    }
    got.sort();
    assert_eq!(got, ["0", "1", "2", "3"]);
}

/// A 3.1.1 client may subscribe to `$share/...` too (the broker accepts the
/// MQTT 5 syntax from both versions) and shares with 5.0 members.
#[tokio::test]
async fn shared_subscription_works_for_v311_clients() {
    let broker = Broker::anonymous();
    let mut a = client(&broker, v4(), "share4-a").await;
    assert_eq!(
        a.subscribe(1, "$share/g4/s4/#", 1).await,
        vec![ReasonCode::GrantedQoS1]
    );
    let mut publisher = client(&broker, v5(), "share4-pub").await;
    publisher.publish_acked("s4/x", b"one", 1, false, 1).await;
    assert_eq!(body(&a.next_publish(true).await), b"one");
}

// ---------------------------------------------------------------- topic aliases

/// MQTT-3.3.2-12 (5.0): an alias sets the mapping; a later PUBLISH with an
/// empty topic and that alias goes to the mapped topic.
#[tokio::test]
async fn topic_alias_with_empty_topic_resolves() {
    let broker = Broker::anonymous();
    let mut sub = client(&broker, v5(), "alias-sub").await;
    sub.subscribe(1, "alias/t", 1).await;
    let mut publisher = client(&broker, v5(), "alias-pub").await;
    for (topic, payload) in [("alias/t", "set"), ("", "use")] {
        publisher
            .publish_props(
                topic,
                payload.as_bytes(),
                1,
                false,
                1,
                PublishProperties {
                    topic_alias: Some(3),
                    ..Default::default()
                },
            )
            .await;
        let got = sub.next_publish(true).await;
        assert_eq!(&*got.topic, "alias/t");
        assert_eq!(body(&got), payload.as_bytes());
        assert!(matches!(publisher.recv().await, Some(Packet::PubAck(_))));
    }
}

/// MQTT-3.3.2-8 / -9 (5.0): alias 0, or above the announced Topic Alias
/// Maximum, is DISCONNECT 0x94.
#[tokio::test]
async fn topic_alias_zero_or_above_maximum_is_0x94() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("alias-max", ConnectOpts::clean()).await;
    let maximum = ack.properties.topic_alias_maximum.expect("announced");
    c.publish_props(
        "a",
        b"x",
        0,
        false,
        0,
        PublishProperties {
            topic_alias: Some(maximum + 1),
            ..Default::default()
        },
    )
    .await;
    expect_disconnect(&mut c, ReasonCode::TopicAliasInvalid).await;
    // Alias 0 is not encodable by the codec: hand-encoded PUBLISH QoS 0,
    // topic "a", properties: topic alias (0x23) = 0.
    let mut c = client(&broker, v5(), "alias-zero").await;
    c.send_bytes(&[0x30, 0x08, 0, 1, b'a', 3, 0x23, 0, 0, b'x'])
        .await;
    expect_disconnect(&mut c, ReasonCode::TopicAliasInvalid).await;
}

/// MQTT-3.3.2-7 (5.0 3.3.2.3.4, Paho client_test5 client topic alias):
/// mappings do not survive the connection; an empty topic with an alias
/// this connection never set is DISCONNECT 0x94.
#[tokio::test]
async fn topic_alias_not_mapped_on_this_connection_is_0x94() {
    let broker = Broker::anonymous();
    let alias = PublishProperties {
        topic_alias: Some(1),
        ..Default::default()
    };
    let mut c = client(&broker, v5(), "alias-unmapped").await;
    c.publish_props("alias/u", b"set", 1, false, 1, alias.clone())
        .await;
    assert!(matches!(c.recv().await, Some(Packet::PubAck(_))));
    disconnect_and_wait(c).await;
    let mut c = client(&broker, v5(), "alias-unmapped").await;
    c.publish_props("", b"use", 1, false, 2, alias).await;
    expect_disconnect(&mut c, ReasonCode::TopicAliasInvalid).await;
}

/// MQTT 5 3.3.2.1 / 3.3.4: an empty topic without a Topic Alias is a
/// protocol error.
#[tokio::test]
async fn empty_topic_without_alias_is_a_protocol_error() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "empty-topic").await;
    c.send_bytes(&[0x30, 0x04, 0, 0, 0, b'x']).await;
    expect_disconnect(&mut c, ReasonCode::ProtocolError).await;
}

/// MQTT-3.3.2-2: a topic name with a wildcard: DISCONNECT 0x90.
#[tokio::test]
async fn topic_name_with_wildcard_is_0x90() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "wild-topic").await;
    c.send_bytes(&[0x30, 0x07, 0, 3, b'a', b'/', b'#', 0, b'x'])
        .await;
    expect_disconnect(&mut c, ReasonCode::TopicNameInvalid).await;
}

/// MQTT-3.3.2-14 (5.0): a Response Topic with a wildcard is a protocol
/// error: DISCONNECT 0x82 (as Paho's interoperability tests expect).
#[tokio::test]
async fn response_topic_with_wildcard_is_a_protocol_error() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "resp-wild").await;
    // PUBLISH QoS 0 "a", properties: response topic (0x08) "a/#", payload "x".
    c.send_bytes(&[
        0x30, 0x0B, 0, 1, b'a', 6, 0x08, 0, 3, b'a', b'/', b'#', b'x',
    ])
    .await;
    expect_disconnect(&mut c, ReasonCode::ProtocolError).await;
}

// ---------------------------------------------------------------- sizes and flow control

/// MQTT-3.1.2-24 (5.0 3.2.2.3.6): a packet above the announced Maximum
/// Packet Size: DISCONNECT 0x95.
#[tokio::test]
async fn packet_above_server_maximum_is_0x95() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("too-big", ConnectOpts::clean()).await;
    let maximum = ack.properties.maximum_packet_size.expect("announced") as usize;
    c.publish("big", &vec![b'x'; maximum], 0, false, 0).await;
    expect_disconnect(&mut c, ReasonCode::PacketTooLarge).await;
}

/// MQTT-3.1.2-25 (5.0): the server never sends a packet above the client's
/// Maximum Packet Size; a smaller message still arrives.
#[tokio::test]
async fn server_respects_client_maximum_packet_size() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.properties.maximum_packet_size = Some(128);
    c.connect("small", opts).await;
    c.subscribe(1, "small/#", 1).await;
    let mut publisher = client(&broker, v5(), "small-pub").await;
    publisher
        .publish_acked("small/big", &[b'x'; 500], 1, false, 1)
        .await;
    publisher
        .publish_acked("small/ok", b"fits", 1, false, 2)
        .await;
    let got = c.next_publish(true).await;
    assert_eq!(&*got.topic, "small/ok");
}

/// MQTT-3.3.4-9 (5.0): the server does not send more unacknowledged QoS 1/2
/// PUBLISHes than the client's Receive Maximum.
#[tokio::test]
async fn server_respects_client_receive_maximum() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.properties.receive_maximum = Some(2);
    c.connect("rmax", opts).await;
    c.subscribe(1, "rmax", 1).await;
    let mut publisher = client(&broker, v5(), "rmax-pub").await;
    for i in 0..4u16 {
        publisher
            .publish_acked("rmax", &[i as u8], 1, false, i + 1)
            .await;
    }
    let first = c.next_publish(false).await;
    let second = c.next_publish(false).await;
    c.expect_nothing().await;
    c.ack_publish(&first).await;
    let third = c.next_publish(false).await;
    c.ack_publish(&second).await;
    c.ack_publish(&third).await;
    let fourth = c.next_publish(true).await;
    assert_eq!(
        [&first, &second, &third, &fourth].map(|p| body(p).to_vec()),
        [[0], [1], [2], [3]].map(|b| b.to_vec()),
        "in order, never more than two unacknowledged"
    );
}

/// MQTT-3.3.4-7 / 5.0 4.9: more unacknowledged QoS 2 PUBLISHes from a
/// client than the server's Receive Maximum: DISCONNECT 0x93.
#[tokio::test]
async fn client_exceeding_server_receive_maximum_is_0x93() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("flood", ConnectOpts::clean()).await;
    let maximum = ack.properties.receive_maximum.expect("announced");
    for id in 1..=maximum + 1 {
        c.publish("flood", b"x", 2, false, id).await;
    }
    let seen = c.expect_close().await;
    match seen.last() {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::ReceiveMaximumExceeded),
        other => panic!("expected DISCONNECT 0x93, got {other:?}"),
    }
}

// ---------------------------------------------------------------- properties

/// MQTT-3.3.2-15..-20 (5.0): Response Topic, Correlation Data, Payload
/// Format Indicator, Content Type and User Properties are forwarded
/// unaltered.
#[tokio::test]
async fn publish_properties_forwarded_unaltered() {
    let broker = Broker::anonymous();
    let mut sub = client(&broker, v5(), "props-sub").await;
    sub.subscribe(1, "req/#", 1).await;
    let mut publisher = client(&broker, v5(), "props-pub").await;
    let properties = PublishProperties {
        payload_format_indicator: Some(PayloadFormat::Utf8),
        response_topic: Some(ByteStr::from("resp/1")),
        correlation_data: Some(Bytes::from_static(b"\x00\x01corr")),
        content_type: Some(ByteStr::from("text/plain")),
        user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
        ..Default::default()
    };
    publisher
        .publish_props("req/x", b"hello", 1, false, 1, properties.clone())
        .await;
    let got = sub.next_publish(true).await;
    assert_eq!(
        got.properties.payload_format_indicator,
        Some(PayloadFormat::Utf8)
    );
    assert_eq!(got.properties.response_topic, properties.response_topic);
    assert_eq!(got.properties.correlation_data, properties.correlation_data);
    assert_eq!(got.properties.content_type, properties.content_type);
    assert_eq!(got.properties.user_properties, properties.user_properties);
}

// Message expiry of queued messages: timing, tested on the state's injected clock in
// src/broker/state/tests.rs (a_queued_message_expires_and_the_rest_carry_the_time_left).

// The expiry left on a resent message: timing, tested on the state's injected clock in
// src/broker/state/tests.rs (a_resent_message_carries_the_expiry_left).

// ---------------------------------------------------------------- subscription options

/// MQTT-3.8.3-3 (5.0): No Local: the publisher's own messages are not sent
/// back to it.
#[tokio::test]
async fn no_local_suppresses_own_messages() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "nolocal").await;
    let mut o = options(1);
    o.no_local = true;
    c.subscribe_with(1, "nl/#", o, None).await;
    c.publish_acked("nl/a", b"mine", 1, false, 2).await;
    let mut other = client(&broker, v5(), "nolocal-other").await;
    other.publish_acked("nl/a", b"theirs", 1, false, 1).await;
    assert_eq!(body(&c.next_publish(true).await), b"theirs");
}

/// MQTT-3.3.1-12 / -13 (5.0): Retain As Published keeps RETAIN on live
/// forwards; without it RETAIN is 0.
#[tokio::test]
async fn retain_as_published_controls_live_retain_flag() {
    let broker = Broker::anonymous();
    let mut keep = client(&broker, v5(), "rap-keep").await;
    let mut o = options(1);
    o.retain_as_published = true;
    keep.subscribe_with(1, "rap/x", o, None).await;
    let mut clear = client(&broker, v5(), "rap-clear").await;
    clear.subscribe(1, "rap/x", 1).await;
    let mut publisher = client(&broker, v5(), "rap-pub").await;
    publisher.publish_acked("rap/x", b"r", 1, true, 1).await;
    assert!(keep.next_publish(true).await.retain);
    assert!(!clear.next_publish(true).await.retain);
}

/// MQTT-3.3.1-9 / -10 / -11 (5.0): Retain Handling 0 sends retained
/// messages on every subscribe, 1 only for a new subscription, 2 never.
#[tokio::test]
async fn retain_handling_0_1_2() {
    let broker = Broker::anonymous();
    let mut publisher = client(&broker, v5(), "rh-pub").await;
    publisher.publish_acked("rh/x", b"r", 1, true, 1).await;
    let mut c = client(&broker, v5(), "rh").await;
    for (handling, first, again) in [
        (RetainHandling::OnSubscribe, true, true),
        (RetainHandling::OnNewSubscribe, true, false),
        (RetainHandling::DoNotSend, false, false),
    ] {
        let mut o = options(1);
        o.retain_handling = handling;
        // A distinct filter matching "rh/x" per handling.
        let filter = match handling {
            RetainHandling::OnSubscribe => "rh/+",
            RetainHandling::OnNewSubscribe => "rh/#",
            _ => "rh/x",
        };
        for expected in [first, again] {
            c.subscribe_with(1, filter, o, None).await;
            if expected {
                assert!(c.next_publish(true).await.retain, "{handling:?}");
            } else {
                c.expect_nothing().await;
            }
        }
    }
}

// ---------------------------------------------------------------- acknowledgements

/// MQTT 5 3.4.2.1 / 3.5.2.1: PUBACK and PUBREC from a client with an error
/// reason code end the exchange; the next message is sent.
#[tokio::test]
async fn puback_and_pubrec_with_reason_codes_end_the_exchange() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.properties.receive_maximum = Some(1);
    c.connect("acks", opts).await;
    c.subscribe(1, "acks/#", 2).await;
    let mut publisher = client(&broker, v5(), "acks-pub").await;
    publisher.publish_acked("acks/1", b"1", 1, false, 1).await;
    publisher.publish_acked("acks/2", b"2", 2, false, 2).await;
    publisher.publish_acked("acks/3", b"3", 1, false, 3).await;
    let one = c.next_publish(false).await;
    c.send(Packet::PubAck(PubAck {
        packet_id: one.packet_id,
        reason: ReasonCode::NoMatchingSubscribers,
        properties: Default::default(),
    }))
    .await;
    let two = c.next_publish(false).await;
    assert_eq!(body(&two), b"2");
    c.send(Packet::PubRec(PubAck {
        packet_id: two.packet_id,
        reason: ReasonCode::UnspecifiedError,
        properties: Default::default(),
    }))
    .await;
    // No PUBREL follows a failed PUBREC; the next message comes instead.
    let three = c.next_publish(true).await;
    assert_eq!(body(&three), b"3");
}

/// MQTT 5 3.7.2.1: PUBREL for an unknown packet id: PUBCOMP 0x92.
#[tokio::test]
async fn pubrel_for_unknown_id_gets_pubcomp_0x92() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "pubrel").await;
    c.send(Packet::PubRel(PubAck::new(77))).await;
    match c.recv().await {
        Some(Packet::PubComp(a)) => {
            assert_eq!(a.packet_id, 77);
            assert_eq!(a.reason, ReasonCode::PacketIdentifierNotFound);
        }
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
}

/// MQTT-2.2.1-3 / MQTT-4.3.3-2: a packet id is reusable once its exchange
/// completes; a QoS 2 duplicate before PUBREL is not delivered twice.
#[tokio::test]
async fn packet_id_reuse_after_completion_and_qos2_duplicate() {
    let broker = Broker::anonymous();
    let mut sub = client(&broker, v5(), "reuse-sub").await;
    sub.subscribe(1, "reuse", 1).await;
    let mut c = client(&broker, v5(), "reuse").await;
    c.publish_acked("reuse", b"a", 1, false, 9).await;
    c.publish_acked("reuse", b"b", 1, false, 9).await;
    c.publish("reuse", b"c", 2, false, 9).await;
    assert!(matches!(c.recv().await, Some(Packet::PubRec(_))));
    let mut dup = Publish {
        dup: true,
        qos: qos(2),
        retain: false,
        topic: ByteStr::from("reuse"),
        packet_id: 9,
        properties: Default::default(),
        payload: Bytes::from_static(b"c"),
    };
    c.send(Packet::Publish(dup.clone())).await;
    assert!(matches!(c.recv().await, Some(Packet::PubRec(_))));
    c.send(Packet::PubRel(PubAck::new(9))).await;
    assert!(matches!(c.recv().await, Some(Packet::PubComp(_))));
    dup.dup = false;
    dup.payload = Bytes::from_static(b"d");
    c.publish_acked("reuse", b"d", 2, false, 9).await;
    for expected in [&b"a"[..], b"b", b"c", b"d"] {
        assert_eq!(body(&sub.next_publish(true).await), expected);
    }
    sub.expect_nothing().await;
}

/// MQTT-3.9.3 (3.1.1: return code 0x80) / 5.0 3.9.3 (0x87 Not authorized):
/// a subscription the ACL denies fails for that filter only; the others in
/// the same SUBSCRIBE are granted (Paho client_test "subscribe failure"
/// against a broker configured to deny `test/nosubscribe`).
#[tokio::test]
async fn acl_denied_subscription_fails_per_filter() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "acl", b"topic readwrite test/allowed\n");
    let broker = Broker::start_in(
        dir,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n  acl_file: acl\n",
    );
    for (version, denied) in [
        (v4(), ReasonCode::UnspecifiedError),
        (v5(), ReasonCode::NotAuthorized),
    ] {
        let mut c = client(&broker, version, "acl-sub").await;
        c.send(Packet::Subscribe(Subscribe {
            packet_id: 3,
            filters: vec![
                SubscribeFilter {
                    filter: "test/nosubscribe".into(),
                    options: options(2),
                },
                SubscribeFilter {
                    filter: "test/allowed".into(),
                    options: options(1),
                },
            ],
            properties: SubscribeProperties::default(),
        }))
        .await;
        match c.recv().await {
            Some(Packet::SubAck(ack)) => {
                assert_eq!(
                    ack.reasons,
                    vec![denied, ReasonCode::GrantedQoS1],
                    "{version:?}"
                )
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
        disconnect_and_wait(c).await;
    }
}

// ---------------------------------------------------------------- malformed control packets

/// Send `bytes` after a successful CONNECT and expect the connection closed
/// (MQTT 5: DISCONNECT with `code` first).
async fn refused_after_connect(version: ProtocolVersion, bytes: &[u8], code: ReasonCode) {
    let broker = Broker::anonymous();
    let mut c = client(&broker, version, "malformed").await;
    c.send_bytes(bytes).await;
    expect_disconnect(&mut c, code).await;
}

/// MQTT-3.3.1-2: DUP must be 0 on a QoS 0 PUBLISH.
#[tokio::test]
async fn qos0_publish_with_dup_is_malformed() {
    refused_after_connect(
        v4(),
        &[0x38, 0x04, 0, 1, b'a', b'x'],
        ReasonCode::MalformedPacket,
    )
    .await;
}

/// MQTT-3.3.1-4: a PUBLISH with both QoS bits set is malformed.
#[tokio::test]
async fn publish_qos_3_is_malformed() {
    refused_after_connect(
        v5(),
        &[0x36, 0x07, 0, 1, b'a', 0, 1, 0, b'x'],
        ReasonCode::MalformedPacket,
    )
    .await;
}

/// MQTT-2.2.1-3 (5.0 MQTT-2.2.1-3): a QoS 1 PUBLISH needs a non-zero
/// packet identifier.
#[tokio::test]
async fn qos1_publish_with_packet_id_zero_is_refused() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "pid0").await;
    c.send_bytes(&[0x32, 0x07, 0, 1, b'a', 0, 0, 0, b'x']).await;
    let seen = c.expect_close().await;
    match seen.last() {
        Some(Packet::Disconnect(d)) => assert!(
            matches!(
                d.reason,
                ReasonCode::MalformedPacket | ReasonCode::ProtocolError
            ),
            "{d:?}"
        ),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
}

/// MQTT-3.8.1-1: SUBSCRIBE's fixed header flags must be 0010.
#[tokio::test]
async fn subscribe_with_wrong_header_flags_is_malformed() {
    refused_after_connect(
        v4(),
        &[0x80, 0x06, 0, 1, 0, 1, b'a', 0x00],
        ReasonCode::MalformedPacket,
    )
    .await;
}

/// MQTT-3.8.3-3 (3.1.1; 5.0 MQTT-3.8.3-2): a SUBSCRIBE without a filter is
/// a protocol violation.
#[tokio::test]
async fn subscribe_without_filters_is_refused() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "nofilter").await;
    c.send_bytes(&[0x82, 0x03, 0, 1, 0]).await;
    let seen = c.expect_close().await;
    assert!(
        !seen.iter().any(|p| matches!(p, Packet::SubAck(_))),
        "{seen:?}"
    );
}

/// MQTT-3.10.1-1: UNSUBSCRIBE's fixed header flags must be 0010.
#[tokio::test]
async fn unsubscribe_with_wrong_header_flags_is_malformed() {
    refused_after_connect(
        v4(),
        &[0xA0, 0x05, 0, 1, 0, 1, b'a'],
        ReasonCode::MalformedPacket,
    )
    .await;
}

/// MQTT-3.1.2-15 (3.1.1: MQTT-3.1.2-15): Will Retain without the Will Flag
/// is malformed.
#[tokio::test]
async fn connect_will_retain_without_will_is_malformed() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.send_bytes(&[
        0x10, 0x0D, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x22, 0, 60, 0, 1, b'a',
    ])
    .await;
    expect_closed_without_connack(&mut c).await;
}

/// MQTT-3.12.4-1: PINGREQ is answered with PINGRESP.
#[tokio::test]
async fn pingreq_is_answered_with_pingresp() {
    let broker = Broker::anonymous();
    for version in [v4(), v5()] {
        let mut c = client(&broker, version, "ping").await;
        c.send(Packet::PingReq).await;
        assert!(matches!(c.recv().await, Some(Packet::PingResp)));
    }
}

/// MQTT 5 3.8.2.1.2: a Subscription Identifier of 0 is a protocol error.
#[tokio::test]
async fn subscription_identifier_zero_is_refused() {
    let broker = Broker::anonymous();
    let mut c = client(&broker, v5(), "subid0").await;
    // SUBSCRIBE id 1, properties: 0x0B (subscription identifier) = 0.
    c.send_bytes(&[0x82, 0x09, 0, 1, 2, 0x0B, 0, 0, 1, b'a', 0x01])
        .await;
    let seen = c.expect_close().await;
    match seen.last() {
        Some(Packet::Disconnect(d)) => assert!(
            matches!(
                d.reason,
                ReasonCode::MalformedPacket | ReasonCode::ProtocolError
            ),
            "{d:?}"
        ),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
}

/// MQTT-3.8.4-8 / 4.3: a retained message is sent to a new subscription at
/// the minimum of its stored QoS and the granted QoS.
#[tokio::test]
async fn retained_message_delivered_at_minimum_qos() {
    let broker = Broker::anonymous();
    let mut publisher = client(&broker, v4(), "retqos-pub").await;
    publisher
        .publish_acked("retqos/2", b"two", 2, true, 1)
        .await;
    publisher
        .publish_acked("retqos/0", b"zero", 0, true, 2)
        .await;
    let mut c = client(&broker, v4(), "retqos").await;
    c.subscribe(1, "retqos/2", 1).await;
    assert_eq!(c.next_publish(true).await.qos.as_u8(), 1);
    c.subscribe(2, "retqos/0", 2).await;
    assert_eq!(c.next_publish(true).await.qos.as_u8(), 0);
}

/// MQTT 5 3.1.2.9: unlike 3.1.1, a password without a user name is
/// allowed; the default broker accepts the client.
#[tokio::test]
async fn connect_password_without_user_name_is_allowed_v5() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    c.send_bytes(&[
        0x10, 0x11, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x42, 0, 60, 0, 0, 1, b'a', 0, 1, b'p',
    ])
    .await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason, ReasonCode::Success),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

/// MQTT-3.2.2-21 / -22 (5.0 3.2.2.3.14): the broker keeps the client's
/// Keep Alive as asked (even the maximum), so CONNACK carries no Server
/// Keep Alive; the connection stays up under PINGREQ.
#[tokio::test]
async fn keep_alive_is_not_capped_so_no_server_keep_alive() {
    let broker = Broker::anonymous();
    for keep_alive in [0u16, 65535] {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        let mut opts = ConnectOpts::clean();
        opts.keep_alive = keep_alive;
        let ack = c.connect("ka-nocap", opts).await;
        assert_eq!(ack.reason, ReasonCode::Success);
        assert_eq!(ack.properties.server_keep_alive, None);
        c.send(Packet::PingReq).await;
        assert!(matches!(c.recv().await, Some(Packet::PingResp)));
        disconnect_and_wait(c).await;
    }
}

/// MQTT-3.1.2-1 (5.0 3.1.2.1): a CONNECT with another protocol name is not
/// accepted: no successful CONNACK, the connection closes.
#[tokio::test]
async fn connect_with_wrong_protocol_name_is_refused() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.send_bytes(&[0x10, 0x0A, 0, 2, b'h', b'j', 4, 0x02, 0, 60, 0, 0])
        .await;
    let seen = c.expect_close().await;
    assert!(
        !seen
            .iter()
            .any(|p| matches!(p, Packet::ConnAck(a) if a.reason == ReasonCode::Success)),
        "{seen:?}"
    );
}
