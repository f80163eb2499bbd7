//! Quiet clients' connections parked off the runtime, through the real
//! binary: each comes back for whatever comes for it (a delivery, its
//! client's bytes or hang-up, a takeover, a shutdown, its keep alive
//! running out) and is served as if it had never left.
//!
//! A keep alive of 6 s parks a quiet client after 3 s and closes a silent
//! one at 9 s: every step below waits on the parked gauge, then acts well
//! inside the 6 s between the two.

mod broker_support;

use broker_support::*;
use saguin::broker::codec::{Packet, ReasonCode};

const KEEP_ALIVE: u16 = 6;
const PARKED: &str = "saguin_connections_parked";

fn broker() -> Broker {
    Broker::start(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         auth:\n  allow_anonymous: true\n",
    )
}

fn quiet(keep_alive: u16) -> ConnectOpts {
    ConnectOpts {
        keep_alive,
        ..ConnectOpts::clean()
    }
}

/// Wait until `n` connections are parked.
fn parked(broker: &Broker, n: u64) {
    wait_metric_where(broker, PARKED, |parked| parked == n);
}

#[tokio::test]
async fn a_parked_client_is_served_again_by_a_delivery_and_a_ping_and_closed_when_silent() {
    let broker = broker();
    let mut device = Raw::tcp(broker.addr(), v4()).await;
    device.connect("device", quiet(KEEP_ALIVE)).await;
    device.subscribe(1, "cmd/device/#", 1).await;
    // Keep alive 0: never parked.
    let mut operator = Raw::tcp(broker.addr(), v4()).await;
    operator.connect("operator", quiet(0)).await;

    parked(&broker, 1);
    // A delivery resumes it, through its link.
    operator
        .publish_acked("cmd/device/reboot", b"now", 1, false, 1)
        .await;
    let command = device.next_publish(true).await;
    assert_eq!(&command.payload[..], b"now");
    // Heard (its PUBACK), it parks again after the same quiet.
    parked(&broker, 1);
    // Its own bytes resume it, through the lot's poll set.
    device.expect_nothing().await;
    parked(&broker, 1);
    // Silent, it is still closed at its keep alive, parked or not.
    assert!(device.expect_close().await.is_empty());
    wait_metric_where(
        &broker,
        "saguin_disconnects_total{reason=\"keep_alive_timeout\"}",
        |n| n == 1,
    );
    parked(&broker, 0);
    operator.expect_nothing().await;
}

#[tokio::test]
async fn a_parked_client_that_hangs_up_is_closed_and_its_will_published() {
    let broker = broker();
    let mut watcher = Raw::tcp(broker.addr(), v4()).await;
    watcher.connect("watcher", quiet(0)).await;
    watcher.subscribe(1, "wills/#", 1).await;
    let mut device = Raw::tcp(broker.addr(), v4()).await;
    let mut opts = quiet(KEEP_ALIVE);
    opts.will = Some(("wills/device".into(), b"gone".to_vec(), 1, false, None));
    device.connect("device", opts).await;

    parked(&broker, 1);
    drop(device);
    let will = watcher.next_publish(true).await;
    assert_eq!(&will.topic[..], "wills/device");
    assert_eq!(&will.payload[..], b"gone");
    parked(&broker, 0);
    wait_metric_where(&broker, "saguin_connections", |n| n == 1);
    // Seen hanging up, not closed at its keep alive (which publishes the
    // will too).
    let text = metrics_text(&broker);
    assert_eq!(
        metric_sample(
            &text,
            "saguin_disconnects_total{reason=\"keep_alive_timeout\"}"
        ),
        Some(0),
        "{text}"
    );
}

#[tokio::test]
async fn a_parked_client_is_told_of_a_takeover_and_of_a_shutdown() {
    let mut broker = broker();
    let mut first = Raw::tcp(broker.addr(), v5()).await;
    first.connect("device", quiet(KEEP_ALIVE)).await;
    parked(&broker, 1);

    let mut second = Raw::tcp(broker.addr(), v5()).await;
    second.connect("device", quiet(KEEP_ALIVE)).await;
    match first.expect_close().await.as_slice() {
        [Packet::Disconnect(d)] => assert_eq!(d.reason, ReasonCode::SessionTakenOver),
        other => panic!("expected a DISCONNECT for the takeover, got {other:?}"),
    }

    parked(&broker, 1);
    let stopped = tokio::task::spawn_blocking(move || broker.terminate());
    match second.expect_close().await.as_slice() {
        [Packet::Disconnect(d)] => assert_eq!(d.reason, ReasonCode::ServerShuttingDown),
        other => panic!("expected a DISCONNECT for the shutdown, got {other:?}"),
    }
    assert_eq!(stopped.await.unwrap(), Some(0));
}

/// What the connection set up with its client outlives a park: the topic
/// aliases it gave an MQTT 5 subscriber are still in force after it, so
/// a topic sent before is sent as its alias alone.
#[tokio::test]
async fn a_parked_clients_outbound_topic_aliases_survive_the_park() {
    let broker = broker();
    let mut device = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = quiet(KEEP_ALIVE);
    opts.properties.topic_alias_maximum = Some(4);
    device.connect("device", opts).await;
    device.subscribe(1, "cmd/#", 1).await;
    let mut operator = Raw::tcp(broker.addr(), v5()).await;
    operator.connect("operator", quiet(0)).await;

    operator
        .publish_acked("cmd/reboot", b"1", 1, false, 1)
        .await;
    let first = device.next_publish(true).await;
    assert_eq!(&first.topic[..], "cmd/reboot");
    let alias = first.properties.topic_alias.expect("an alias given");

    parked(&broker, 1);
    operator
        .publish_acked("cmd/reboot", b"2", 1, false, 2)
        .await;
    let second = device.next_publish(true).await;
    assert_eq!(&second.payload[..], b"2");
    assert_eq!(&second.topic[..], "", "sent as its alias alone");
    assert_eq!(second.properties.topic_alias, Some(alias));
}
