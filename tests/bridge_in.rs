//! Inbound bridges: what the remote sends is a record before the remote is
//! acknowledged, so kill -9 of saguin loses nothing the remote handed it;
//! QoS 2 is held until the remote's PUBREL, through kill -9 too, and
//! written once.

mod bridge_support;
mod broker_support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use bridge_support::{
    have_mosquitto, read_channel, saguin_yaml, Mosquitto, Relay, Rng, PUBCOMP, PUBREC, PUBREL,
};
use broker_support::{v4, v5, Broker, ConnectOpts, Raw};

const PUBLISHERS: usize = 4;

async fn publish_to_remote(remote: SocketAddr, p: usize, seqs: std::ops::Range<u32>, qos: u8) {
    let mut c = Raw::tcp(remote, v4()).await;
    c.connect(&format!("remote-pub{p}"), ConnectOpts::clean())
        .await;
    let mut id = 1u16;
    for seq in seqs {
        c.publish_acked(
            &format!("sites/17/cmd/d{p}"),
            format!("{p}:{seq}").as_bytes(),
            qos,
            false,
            id,
        )
        .await;
        id = id % 60_000 + 1;
    }
    c.disconnect().await;
}

fn in_yaml(dir: &std::path::Path, remote: SocketAddr, qos: u8) -> String {
    saguin_yaml(
        dir,
        "  - { name: commands, kind: append, storage: db }",
        &format!(
            "  - name: cloud
    address: {remote}
    client_id: site17.cloud
    reconnect: {{ base: 50ms, cap: 400ms }}
    in: [{{ filter: sites/17/cmd/#, remote_prefix: sites/17/, local_prefix: commands/, qos: {qos} }}]
"
        ),
    )
}

/// kill -9 of saguin while the remote hands rounds over: at QoS 1 every
/// message is a record (duplicates allowed), at QoS 2 exactly one.
async fn in_through_kill_9(test: &str, qos: u8, rounds: u32, per_round: u32) {
    if !have_mosquitto(test) {
        return;
    }
    let mut rng = Rng::seeded(test);
    let remote = Mosquitto::start("log_type subscribe");
    let dir = tempfile::tempdir().unwrap();
    let yaml = in_yaml(dir.path(), remote.addr(), qos);
    let mut saguin = Broker::start_in(dir, &yaml);
    // The remote holds the bridge's subscription before anything is sent:
    // from then on it keeps what it has not handed over.
    tokio::task::block_in_place(|| {
        remote.wait_log(|l| l.contains(&format!("site17.cloud {qos} sites/17/cmd/#")))
    });
    for round in 0..rounds {
        let range = round * per_round..(round + 1) * per_round;
        let publishers: Vec<_> = (0..PUBLISHERS)
            .map(|p| tokio::spawn(publish_to_remote(remote.addr(), p, range.clone(), qos)))
            .collect();
        // kill -9 while the remote is handing the round over.
        if round + 1 < rounds {
            let wanted = 1 + rng.below(u64::from(per_round)) as usize;
            let addr = saguin.addr();
            read_channel(addr, "commands/#", Duration::from_secs(60), |seen| {
                seen.iter()
                    .filter(|(_, p)| round_of(p, per_round) == round)
                    .count()
                    >= wanted
            })
            .await;
            for p in publishers {
                p.await.unwrap();
            }
            saguin = saguin.restart(&yaml);
        } else {
            for p in publishers {
                p.await.unwrap();
            }
        }
    }
    let total = (rounds * per_round) as usize * PUBLISHERS;
    let seen = read_channel(
        saguin.addr(),
        "commands/#",
        Duration::from_secs(120),
        |seen| {
            seen.iter()
                .map(|(_, p)| p.clone())
                .collect::<HashSet<_>>()
                .len()
                == total
        },
    )
    .await;
    let distinct: HashSet<&Vec<u8>> = seen.iter().map(|(_, p)| p).collect();
    assert_eq!(distinct.len(), total, "records missing in the channel");
    for (topic, payload) in &seen {
        let p = std::str::from_utf8(payload)
            .unwrap()
            .split(':')
            .next()
            .unwrap();
        assert_eq!(topic, &format!("commands/cmd/d{p}"));
    }
    if qos == 2 {
        assert_eq!(seen.len(), total, "a QoS 2 message written twice");
    }
    eprintln!(
        "{test}: {total} messages, {} records ({} duplicates)",
        seen.len(),
        seen.len() - total
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_every_message_the_remote_handed_over_is_a_record_through_kill_9() {
    in_through_kill_9("in_kill_9", 1, 5, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_qos2_every_message_is_one_record_through_kill_9() {
    in_through_kill_9("in_qos2_kill_9", 2, 4, 250).await;
}

fn round_of(payload: &[u8], per_round: u32) -> u32 {
    let text = std::str::from_utf8(payload).unwrap();
    let seq: u32 = text.split(':').nth(1).unwrap().parse().unwrap();
    seq / per_round
}

/// Publish `payload` on `topic` into saguin and read the channel up to it:
/// what else the channel holds by then.
async fn channel_up_to(saguin: &Broker, topic: &str, payload: &str) -> Vec<String> {
    let mut c = Raw::tcp(saguin.addr(), v5()).await;
    c.connect("marker", ConnectOpts::clean()).await;
    c.publish_acked(topic, payload.as_bytes(), 1, false, 1)
        .await;
    c.disconnect().await;
    let seen = read_channel(
        saguin.addr(),
        "commands/#",
        Duration::from_secs(30),
        |seen| seen.iter().any(|(_, p)| p == payload.as_bytes()),
    )
    .await;
    let seen: Vec<String> = seen
        .iter()
        .map(|(_, p)| String::from_utf8_lossy(p).into_owned())
        .collect();
    assert!(seen.iter().any(|p| p == payload), "{payload} not read back");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_qos2_is_held_until_the_pubrel_through_kill_9_between_pubrec_and_pubrel() {
    if !have_mosquitto("in_qos2_held") {
        return;
    }
    let remote = Mosquitto::start("log_type subscribe");
    let mut relay = Relay::watching(&remote).await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = in_yaml(dir.path(), relay.addr, 2);
    let saguin = Broker::start_in(dir, &yaml);
    tokio::task::block_in_place(|| {
        remote.wait_log(|l| l.contains("site17.cloud 2 sites/17/cmd/#"))
    });
    // The remote's PUBREL does not reach the bridge.
    relay.swallow(PUBREL);
    let mut publisher = Raw::tcp(remote.addr(), v4()).await;
    publisher
        .connect("remote-producer", ConnectOpts::clean())
        .await;
    publisher
        .publish_acked("sites/17/cmd/d", b"exactly-once", 2, false, 1)
        .await;
    publisher.disconnect().await;
    relay
        .wait_wire("the bridge's PUBREC, then the remote's PUBREL", |w| {
            let rec = w.iter().position(|p| p.to_remote && p.kind == PUBREC);
            rec.is_some_and(|at| w[at..].iter().any(|p| p.kind == PUBREL && p.swallowed))
        })
        .await;
    // Held, not yet a record: a record published after it comes first.
    let seen = channel_up_to(&saguin, "commands/marker", "marker-1").await;
    assert!(!seen.contains(&"exactly-once".to_owned()), "{seen:?}");
    // kill -9 between PUBREC and PUBREL: the hold survives it.
    let connections = relay.accepted();
    let saguin = saguin.restart(&yaml);
    relay.wait_accepted_over(connections).await;
    // Reconnected, the remote releases again, and is not heard.
    relay
        .wait_wire("the remote's PUBREL again after the restart", |w| {
            w.iter()
                .filter(|p| p.kind == PUBREL && p.swallowed)
                .map(|p| p.conn)
                .collect::<HashSet<_>>()
                .len()
                >= 2
        })
        .await;
    let seen = channel_up_to(&saguin, "commands/marker", "marker-2").await;
    assert!(!seen.contains(&"exactly-once".to_owned()), "{seen:?}");
    // Now heard: the release writes the record once, and the remote gets
    // its PUBCOMP.
    relay.pass_all();
    let connections = relay.accepted();
    relay.cut();
    relay.wait_accepted_over(connections).await;
    relay
        .wait_wire("the bridge's PUBCOMP", |w| {
            w.iter().any(|p| p.to_remote && p.kind == PUBCOMP)
        })
        .await;
    let seen = channel_up_to(&saguin, "commands/marker", "marker-3").await;
    assert_eq!(
        seen,
        vec!["marker-1", "marker-2", "exactly-once", "marker-3"],
        "written at the release, once"
    );
}
