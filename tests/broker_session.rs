//! Sessions through the real broker: persistent resume with queued QoS 1/2
//! and DUP redelivery, takeover, Wills (with delay, and the rules for
//! normal disconnects and takeovers), keep alive, and the principal that
//! owns a session.

mod broker_support;

use broker_support::*;
use saguin::broker::codec::{Packet, PubAck, ReasonCode};

#[tokio::test]
async fn persistent_session_queues_and_redelivers_with_dup() {
    for version in [v4(), v5()] {
        let broker = Broker::anonymous();
        let mut s = Raw::tcp(broker.addr(), version).await;
        let mut opts = ConnectOpts::persistent(600);
        // The Will tells the test when the broker has seen the connection go.
        opts.will = Some(("gone/ps".into(), b"x".to_vec(), 1, false, None));
        let ack = s.connect("ps", opts).await;
        assert!(!ack.session_present);
        s.subscribe(1, "ps/#", 2).await;
        let mut p = Raw::tcp(broker.addr(), version).await;
        p.connect("ps-pub", ConnectOpts::clean()).await;
        p.subscribe(1, "gone/ps", 1).await;

        // Delivered but not acknowledged: must come back with DUP=1.
        p.publish_acked("ps/1", b"unacked-q1", 1, false, 1).await;
        p.publish_acked("ps/2", b"unacked-q2", 2, false, 2).await;
        let first = s.next_publish(false).await;
        let second = s.next_publish(false).await;
        assert!(!first.dup && !second.dup);
        // For the QoS 2 one, PUBREC was sent: the broker then awaits PUBCOMP.
        p.publish_acked("ps/3", b"released-q2", 2, false, 3).await;
        let third = s.next_publish(false).await;
        s.send(Packet::PubRec(PubAck::new(third.packet_id))).await;
        match s.recv().await {
            Some(Packet::PubRel(r)) => assert_eq!(r.packet_id, third.packet_id),
            other => panic!("expected PUBREL, got {other:?}"),
        }
        drop(s); // network loss, no DISCONNECT
        let will = p.next_publish(true).await;
        assert_eq!(will.topic.to_string(), "gone/ps");

        // Queued while offline (the QoS 0 one is not: it is dropped).
        p.publish_acked("ps/6", b"dropped-q0", 0, false, 0).await;
        p.publish_acked("ps/4", b"queued-q1", 1, false, 4).await;
        p.publish_acked("ps/5", b"queued-q2", 2, false, 5).await;

        let mut s = Raw::tcp(broker.addr(), version).await;
        let ack = s.connect("ps", ConnectOpts::persistent(600)).await;
        assert!(ack.session_present, "{version}: session resumed");
        // Replay in the original order: PUBLISH DUP=1 with the same ids,
        // PUBREL for the one awaiting PUBCOMP; then the queue.
        let r1 = s.next_publish(false).await;
        assert!(r1.dup);
        assert_eq!(
            (r1.packet_id, &r1.payload[..]),
            (first.packet_id, &b"unacked-q1"[..])
        );
        let r2 = s.next_publish(false).await;
        assert!(r2.dup);
        assert_eq!(
            (r2.packet_id, &r2.payload[..]),
            (second.packet_id, &b"unacked-q2"[..])
        );
        match s.recv().await {
            Some(Packet::PubRel(r)) => assert_eq!(r.packet_id, third.packet_id),
            other => panic!("expected PUBREL replay, got {other:?}"),
        }
        let q1 = s.next_publish(false).await;
        assert_eq!(&q1.payload[..], b"queued-q1");
        assert!(!q1.dup);
        let q2 = s.next_publish(false).await;
        assert_eq!(&q2.payload[..], b"queued-q2");
        assert_eq!(q2.qos as u8, 2);
        // Finish everything; nothing else (the QoS 0 was not queued).
        s.ack_publish(&r1).await;
        s.ack_publish(&r2).await;
        s.send(Packet::PubComp(PubAck::new(third.packet_id))).await;
        s.ack_publish(&q1).await;
        s.ack_publish(&q2).await;
        s.expect_nothing().await;
    }
}

#[tokio::test]
async fn clean_start_discards_the_session() {
    let broker = Broker::anonymous();
    let mut s = Raw::tcp(broker.addr(), v5()).await;
    s.connect("cs", ConnectOpts::persistent(600)).await;
    s.subscribe(1, "cs/t", 1).await;
    s.disconnect().await;
    let mut s = Raw::tcp(broker.addr(), v5()).await;
    let ack = s.connect("cs", ConnectOpts::clean()).await;
    assert!(!ack.session_present);
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    p.connect("cs-pub", ConnectOpts::clean()).await;
    p.publish_acked("cs/t", b"x", 1, false, 1).await;
    s.expect_nothing().await;
}

#[tokio::test]
async fn takeover_closes_the_old_connection_with_0x8e() {
    let broker = Broker::anonymous();
    let mut old = Raw::tcp(broker.addr(), v5()).await;
    old.connect("to", ConnectOpts::persistent(600)).await;
    old.subscribe(1, "to/t", 1).await;
    let mut new = Raw::tcp(broker.addr(), v5()).await;
    let ack = new.connect("to", ConnectOpts::persistent(600)).await;
    assert!(ack.session_present);
    let closing = old.expect_close().await;
    assert!(
        matches!(closing.as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::SessionTakenOver),
        "{closing:?}"
    );
    // The subscription moved to the new connection.
    let mut p = Raw::tcp(broker.addr(), v4()).await;
    p.connect("to-pub", ConnectOpts::clean()).await;
    p.publish_acked("to/t", b"after", 1, false, 1).await;
    assert_eq!(&new.next_publish(true).await.payload[..], b"after");
    // A 3.1.1 takeover just closes.
    let mut a = Raw::tcp(broker.addr(), v4()).await;
    a.connect("to4", ConnectOpts::clean()).await;
    let mut b = Raw::tcp(broker.addr(), v4()).await;
    b.connect("to4", ConnectOpts::clean()).await;
    assert!(a.expect_close().await.is_empty());
}

fn with_will(
    mut opts: ConnectOpts,
    topic: &str,
    payload: &[u8],
    delay: Option<u32>,
) -> ConnectOpts {
    opts.will = Some((topic.into(), payload.to_vec(), 1, false, delay));
    opts
}

#[tokio::test]
async fn will_on_network_loss_not_on_normal_disconnect_yes_on_0x04() {
    let broker = Broker::anonymous();
    let mut w = Raw::tcp(broker.addr(), v5()).await;
    w.connect("will-watch", ConnectOpts::clean()).await;
    w.subscribe(1, "will/#", 1).await;

    let mut c = Raw::tcp(broker.addr(), v4()).await;
    c.connect(
        "w1",
        with_will(ConnectOpts::clean(), "will/w1", b"gone", None),
    )
    .await;
    drop(c);
    let m = w.next_publish(true).await;
    assert_eq!(
        (m.topic.to_string().as_str(), &m.payload[..]),
        ("will/w1", &b"gone"[..])
    );

    let c = {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect(
            "w2",
            with_will(ConnectOpts::clean(), "will/w2", b"nope", None),
        )
        .await;
        c
    };
    // Once the broker has closed it, the DISCONNECT has been handled.
    let mut c = c;
    c.send(Packet::Disconnect(saguin::broker::codec::Disconnect::new(
        ReasonCode::Success,
    )))
    .await;
    c.expect_close().await;
    w.expect_nothing().await;

    let mut c = Raw::tcp(broker.addr(), v5()).await;
    c.connect(
        "w3",
        with_will(ConnectOpts::clean(), "will/w3", b"asked", None),
    )
    .await;
    c.send(Packet::Disconnect(saguin::broker::codec::Disconnect::new(
        ReasonCode::DisconnectWithWillMessage,
    )))
    .await;
    let m = w.next_publish(true).await;
    assert_eq!(&m.payload[..], b"asked");
}

// Will delay and its cancelling by a reconnect: timing, tested on the
// state's injected clock in src/broker/state/tests.rs
// (a_will_waits_for_its_delay_and_a_reconnect_cancels_it); the delayed Will
// end to end in broker_conformance.rs.

#[tokio::test]
async fn keep_alive_timeout_closes_and_sends_will() {
    let broker = Broker::anonymous();
    let mut w = Raw::tcp(broker.addr(), v4()).await;
    w.connect("ka-watch", ConnectOpts::clean()).await;
    w.subscribe(1, "ka/#", 0).await;
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = with_will(ConnectOpts::clean(), "ka/idle", b"timed out", None);
    opts.keep_alive = 1;
    c.connect("ka", opts).await;
    // Silent client: closed after 1.5 x keep alive with 0x8D.
    let closing = c.expect_close().await;
    assert!(
        matches!(closing.as_slice(), [Packet::Disconnect(d)] if d.reason == ReasonCode::KeepAliveTimeout),
        "{closing:?}"
    );
    assert_eq!(&w.next_publish(true).await.payload[..], b"timed out");
}

// PINGREQ keeping a connection past 1.5 x Keep Alive: on a paused clock in
// src/broker/connection.rs.

#[tokio::test]
async fn qos2_method_b_duplicates_and_unknown_pubrel() {
    let broker = Broker::anonymous();
    let mut s = Raw::tcp(broker.addr(), v4()).await;
    s.connect("q2-sub", ConnectOpts::clean()).await;
    s.subscribe(1, "q2/t", 2).await;
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    p.connect("q2-pub", ConnectOpts::clean()).await;
    p.publish("q2/t", b"once", 2, false, 10).await;
    assert!(matches!(p.recv().await, Some(Packet::PubRec(r)) if r.packet_id == 10));
    // The duplicate (even with a different payload) only gets PUBREC.
    p.publish("q2/t", b"different", 2, false, 10).await;
    assert!(matches!(p.recv().await, Some(Packet::PubRec(r)) if r.packet_id == 10));
    p.send(Packet::PubRel(PubAck::new(10))).await;
    assert!(
        matches!(p.recv().await, Some(Packet::PubComp(c)) if c.packet_id == 10 && c.reason == ReasonCode::Success)
    );
    // Unknown PUBREL still gets PUBCOMP, with 0x92 on MQTT 5.
    p.send(Packet::PubRel(PubAck::new(11))).await;
    assert!(
        matches!(p.recv().await, Some(Packet::PubComp(c)) if c.packet_id == 11 && c.reason == ReasonCode::PacketIdentifierNotFound)
    );
    let m = s.next_publish(true).await;
    assert_eq!(&m.payload[..], b"once");
    s.expect_nothing().await;
}

// Session expiry after its interval: timing, tested on the state's injected clock in
// src/broker/state/tests.rs (a_session_ends_when_its_expiry_interval_passes_not_before).

#[tokio::test]
async fn session_expiry_is_capped_and_reported() {
    let broker =
        Broker::plain("auth:\n  allow_anonymous: true\nlimits:\n  max_session_expiry: 1h\n");
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("cap", ConnectOpts::persistent(u32::MAX)).await;
    assert_eq!(ack.properties.session_expiry_interval, Some(3600));
}

#[tokio::test]
async fn unsubscribe_and_sys_is_not_for_clients() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    c.connect("un", ConnectOpts::clean()).await;
    c.subscribe(1, "un/t", 1).await;
    c.send(Packet::Unsubscribe(saguin::broker::codec::Unsubscribe {
        packet_id: 2,
        filters: vec!["un/t".into(), "never".into()],
        properties: Default::default(),
    }))
    .await;
    match c.recv().await {
        Some(Packet::UnsubAck(u)) => {
            assert_eq!(
                u.reasons,
                vec![ReasonCode::Success, ReasonCode::NoSubscriptionExisted]
            )
        }
        other => panic!("expected UNSUBACK, got {other:?}"),
    }
    c.publish("un/t", b"x", 1, false, 3).await;
    assert!(matches!(c.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 3));
    c.expect_nothing().await;
    c.publish("$SYS/broker/uptime", b"forever", 1, false, 4)
        .await;
    assert!(
        matches!(c.recv().await, Some(Packet::PubAck(a)) if a.reason == ReasonCode::NotAuthorized)
    );
}
