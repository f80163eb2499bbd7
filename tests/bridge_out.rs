//! Outbound bridges against a real Mosquitto: every record a producer was
//! acknowledged for reaches the remote, through kill -9 of saguin, cuts of
//! the link and restarts of the remote; duplicates allowed, never a loss,
//! and each publisher's records arrive in channel order.

mod bridge_support;
mod broker_support;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use bridge_support::{have_mosquitto, saguin_yaml, Collector, Mosquitto, Relay, Rng};
use broker_support::{v5, Broker, ConnectOpts, Raw};
use saguin::broker::codec::Packet;

const TOPICS: usize = 50;
const PUBLISHERS: usize = 4;
/// Bounds the wait for a whole transfer on a busy machine.
const TRANSFER: Duration = Duration::from_secs(180);

fn bridge_yaml(remote: SocketAddr, protocol: &str) -> String {
    format!(
        "  - name: cloud
    address: {remote}
    protocol: {protocol}
    client_id: site17.cloud
    reconnect: {{ base: 50ms, cap: 400ms }}
    max_inflight: 32
    out: [{{ channel: telemetry, remote_prefix: sites/17/, qos: 1, from: earliest }}]
"
    )
}

/// Publisher `p` publishes `seqs` QoS 1 into the channel, a window of 16
/// at a time, and returns once every one was acknowledged.
async fn publish(addr: SocketAddr, p: usize, seqs: std::ops::Range<u32>) {
    let mut c = Raw::tcp(addr, v5()).await;
    c.connect(&format!("pub{p}"), ConnectOpts::clean()).await;
    let mut outstanding = 0usize;
    let mut next_id = 1u16;
    for seq in seqs {
        let topic = format!("telemetry/t{}", (seq as usize * PUBLISHERS + p) % TOPICS);
        c.publish(&topic, format!("{p}:{seq}").as_bytes(), 1, false, next_id)
            .await;
        next_id = next_id % 60_000 + 1;
        outstanding += 1;
        while outstanding >= 16 {
            match c.recv().await {
                Some(Packet::PubAck(ack)) => {
                    assert!(!ack.reason.is_error(), "refused: {ack:?}");
                    outstanding -= 1;
                }
                Some(_) => {}
                None => panic!("publisher {p} cut off"),
            }
        }
    }
    while outstanding > 0 {
        match c.recv().await {
            Some(Packet::PubAck(_)) => outstanding -= 1,
            Some(_) => {}
            None => panic!("publisher {p} cut off"),
        }
    }
    c.disconnect().await;
}

/// `(publisher, seq)` of a payload `p:seq`.
fn parse(payload: &[u8]) -> (usize, u32) {
    let text = std::str::from_utf8(payload).expect("utf-8");
    let (p, s) = text.split_once(':').expect("p:seq");
    (p.parse().unwrap(), s.parse().unwrap())
}

fn check_complete_and_ordered(seen: &[(String, Vec<u8>)], per_publisher: u32) {
    let mut first: HashSet<(usize, u32)> = HashSet::new();
    let mut last: HashMap<(String, usize), u32> = HashMap::new();
    for (topic, payload) in seen {
        let (p, seq) = parse(payload);
        if !first.insert((p, seq)) {
            continue;
        }
        // First occurrences of one publisher on one topic: channel order.
        if let Some(before) = last.insert((topic.clone(), p), seq) {
            assert!(before < seq, "{topic}: {p}:{seq} after {p}:{before}");
        }
    }
    for p in 0..PUBLISHERS {
        for seq in 0..per_publisher {
            assert!(
                first.contains(&(p, seq)),
                "record {p}:{seq} never reached the remote"
            );
        }
    }
}

async fn out_through_crashes(protocol: &str, test: &str, restart_remote: bool) {
    if !have_mosquitto(test) {
        return;
    }
    let mut rng = Rng::seeded(test);
    let mut remote = Mosquitto::start("");
    let mut collector = Collector::start(&remote, "collector", "sites/17/#").await;
    let mut relay = Relay::start(remote.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = saguin_yaml(
        dir.path(),
        "  - { name: telemetry, kind: append, storage: db }",
        &bridge_yaml(relay.addr, protocol),
    );
    let mut saguin = Broker::start_in(dir, &yaml);
    let rounds = 5u32;
    let per_round = 2_000u32;
    for round in 0..rounds {
        let range = round * per_round..(round + 1) * per_round;
        let addr = saguin.addr();
        let publishers: Vec<_> = (0..PUBLISHERS)
            .map(|p| tokio::spawn(publish(addr, p, range.clone())))
            .collect();
        for p in publishers {
            p.await.unwrap();
        }
        // Something of this round is at the remote, the rest on its way.
        let target = round * per_round + 1 + rng.below(u64::from(per_round / 2)) as u32;
        collector
            .wait_until(TRANSFER, |seen| {
                seen.iter()
                    .any(|(_, p)| parse(p).1 >= target.min((round + 1) * per_round - 1))
            })
            .await;
        match round {
            // The link cut under the bridge: it reconnects, resends.
            1 | 3 => {
                let before = relay.accepted();
                relay.cut();
                relay.wait_accepted_over(before).await;
            }
            // The remote restarted (SIGTERM, it keeps its persistence).
            2 if restart_remote => remote.restart(),
            _ => {}
        }
        // kill -9 of saguin mid-transfer, every round but the last.
        if round + 1 < rounds {
            saguin = saguin.restart(&yaml);
        }
    }
    let total = rounds * per_round;
    let complete = collector
        .try_wait_until(TRANSFER, |seen| {
            let distinct: HashSet<(usize, u32)> = seen.iter().map(|(_, p)| parse(p)).collect();
            distinct.len() == PUBLISHERS * total as usize
        })
        .await;
    if !complete {
        let distinct: HashSet<(usize, u32)> = collector
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, p)| parse(p))
            .collect();
        let missing: Vec<(usize, u32)> = (0..PUBLISHERS)
            .flat_map(|p| (0..total).map(move |s| (p, s)))
            .filter(|r| !distinct.contains(r))
            .collect();
        let log = saguin.log_text();
        let tail: Vec<&str> = log.lines().filter(|l| l.contains("bridge")).collect();
        panic!(
            "{} records missing at the remote, the first {:?}; the bridge's log:\n{}",
            missing.len(),
            &missing[..missing.len().min(20)],
            tail[tail.len().saturating_sub(40)..].join("\n")
        );
    }
    check_complete_and_ordered(&collector.seen.lock().unwrap(), total);
    // Stopped gracefully, the bridge's position is the channel's end: a
    // restart finds nothing left to send.
    assert_eq!(saguin.terminate(), Some(0));
    let saguin = saguin.restart(&yaml);
    let line = saguin.wait_log(|l| l.contains("msg=\"bridge\""));
    assert!(line.contains("lag_records=\"telemetry=0\""), "{line}");
    let duplicates = collector.seen.lock().unwrap().len() - PUBLISHERS * total as usize;
    eprintln!(
        "{test}: {} records, {duplicates} duplicates at the remote",
        PUBLISHERS * total as usize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_mqtt5_every_acknowledged_record_reaches_mosquitto_through_crashes() {
    out_through_crashes("mqtt5", "out_mqtt5", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_mqtt311_every_acknowledged_record_reaches_mosquitto_through_crashes() {
    // Without the remote's restart: across a SIGTERM restart of Mosquitto
    // 2.0.11, about one window of records it had PUBACKed to a 3.1.1
    // bridge was sometimes never delivered to the persistent subscriber
    // (README, "Bridges"); MQTT 5 is checked with the restart.
    out_through_crashes("mqtt311", "out_mqtt311", false).await;
}
