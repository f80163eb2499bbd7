//! A reconnect storm on a sqlite session provider: 2,000 persistent
//! sessions reconnect at once while a publisher sends; every CONNACK
//! arrives (session present), and after a restart every session's
//! subscription is intact.

mod broker_support;

use broker_support::*;
use saguin::broker::codec::{Packet, PubAck};

const SESSIONS: usize = 2_000;

/// How long the last of a storm's CONNACKs may take: every client asks at
/// once, so the last waits for all the others, and on a busy 2-core
/// machine a debug broker's 2,000 session loads took longer than one
/// packet's wait. Still a bound, never a pause.
const STORM_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config(dir: &std::path::Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         broker:\n  session_storage: db\n",
        dir.join("saguin.db").display()
    )
}

/// Connect every session at once (clean start 0); each CONNACK must say
/// its session is present, within the tests' bound.
async fn reconnect_all(broker: &Broker) -> Vec<Raw<tokio::net::TcpStream>> {
    let addr = broker.addr();
    let tasks: Vec<_> = (0..SESSIONS)
        .map(|i| {
            tokio::spawn(async move {
                let mut c = Raw::tcp(addr, v5()).await;
                c.send_connect(&format!("storm-{i}"), ConnectOpts::persistent(3600))
                    .await;
                match c.recv_within(STORM_WAIT).await {
                    Ok(Some(Packet::ConnAck(ack))) => {
                        assert!(ack.session_present, "storm-{i} lost its session")
                    }
                    other => panic!("storm-{i}: expected CONNACK, got {other:?}"),
                }
                c
            })
        })
        .collect();
    let mut clients = Vec::with_capacity(SESSIONS);
    for t in tasks {
        clients.push(t.await.unwrap());
    }
    clients
}

#[test]
fn every_connack_of_a_reconnect_storm_arrives_and_subscriptions_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    rt.block_on(async {
        for i in 0..SESSIONS {
            let mut c = Raw::tcp(broker.addr(), v5()).await;
            c.connect(&format!("storm-{i}"), ConnectOpts::persistent(3600))
                .await;
            c.subscribe(1, "storm/#", 1).await;
            c.disconnect().await;
        }
        // A publisher keeps sending (acknowledged) while the storm runs.
        let addr = broker.addr();
        let publisher = tokio::spawn(async move {
            let mut p = Raw::tcp(addr, v5()).await;
            p.connect("storm-publisher", ConnectOpts::clean()).await;
            for id in 1..=200u16 {
                p.publish_acked("other/topic", b"x", 1, false, id).await;
            }
        });
        let clients = reconnect_all(&broker).await;
        publisher.await.unwrap();
        for c in clients {
            drop(c);
        }
    });
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut clients = reconnect_all(&broker).await;
        let mut p = Raw::tcp(broker.addr(), v5()).await;
        p.connect("after", ConnectOpts::clean()).await;
        p.publish_acked("storm/after", b"1", 1, false, 1).await;
        for (i, c) in clients.iter_mut().enumerate() {
            match c.recv().await {
                Some(Packet::Publish(m)) => {
                    assert_eq!(&*m.topic, "storm/after", "storm-{i}");
                    c.send(Packet::PubAck(PubAck::new(m.packet_id))).await;
                }
                other => panic!("storm-{i}: its subscription did not survive: {other:?}"),
            }
        }
    });
}
