//! Outbound bridges against a real Mosquitto: every record a producer was
//! acknowledged for reaches the remote, through kill -9 of saguin, cuts of
//! the link and restarts of the remote; duplicates allowed, never a loss,
//! and each publisher's records arrive in channel order. The link runs
//! through a relay that logs every PUBACK of the remote with the PUBLISH it
//! answered: when Mosquitto is killed -9, only records it acknowledged
//! before (from memory) may be missing, and a missing record is reported
//! as one the remote never acknowledged (saguin's loss) or one it did.

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

/// Per topic, the first occurrences of one publisher's records are in
/// channel order.
fn check_ordered(seen: &[(String, Vec<u8>)]) {
    let mut first: HashSet<(usize, u32)> = HashSet::new();
    let mut last: HashMap<(String, usize), u32> = HashMap::new();
    for (topic, payload) in seen {
        let (p, seq) = parse(payload);
        if !first.insert((p, seq)) {
            continue;
        }
        if let Some(before) = last.insert((topic.clone(), p), seq) {
            assert!(before < seq, "{topic}: {p}:{seq} after {p}:{before}");
        }
    }
}

/// What happens to whom after each round (rounds are numbered from 0).
struct Plan {
    rounds: u32,
    per_round: u32,
    /// The link cut under the bridge: it reconnects and resends.
    cut: &'static [u32],
    /// The remote restarted with SIGTERM (it writes its persistence).
    terminate_remote: &'static [u32],
    /// The remote killed -9 and started again: what it acknowledged from
    /// memory since its last save may be gone.
    kill_remote: &'static [u32],
    /// saguin killed -9 and started again.
    kill_saguin: &'static [u32],
}

/// The marker published after every round: once the remote's subscriber
/// has it, it has everything it will ever get (the bridge sends in channel
/// order, Mosquitto delivers one client's messages in order).
const MARKER: &[u8] = b"99:0";

async fn out_through_crashes(protocol: &str, test: &str, plan: Plan) {
    if !have_mosquitto(test) {
        return;
    }
    let mut rng = Rng::seeded(test);
    let mut remote = Mosquitto::start("");
    let mut collector = Collector::start(&remote, "collector", "sites/17/#").await;
    if !plan.kill_remote.is_empty() {
        // Saved now, the subscription outlives every kill -9: nothing the
        // remote takes after a restart goes to nobody.
        remote.restart();
    }
    let mut relay = Relay::watching(&remote).await;
    let (mut killed, mut terminated) = (HashSet::new(), HashSet::new());
    let dir = tempfile::tempdir().unwrap();
    let yaml = saguin_yaml(
        dir.path(),
        "  - { name: telemetry, kind: append, storage: db }",
        &bridge_yaml(relay.addr, protocol),
    );
    let mut saguin = Broker::start_in(dir, &yaml);
    let per_round = plan.per_round;
    for round in 0..plan.rounds {
        let range = round * per_round..(round + 1) * per_round;
        let kill_remote = plan.kill_remote.contains(&round);
        if kill_remote {
            // What the remote takes now waits in its memory for the
            // subscriber, to be lost with it.
            collector.go_offline().await;
        }
        let addr = saguin.addr();
        let publishers: Vec<_> = (0..PUBLISHERS)
            .map(|p| tokio::spawn(publish(addr, p, range.clone())))
            .collect();
        for p in publishers {
            p.await.unwrap();
        }
        // Something of this round is at the remote, the rest on its way.
        let target = round * per_round + 1 + rng.below(u64::from(per_round / 2)) as u32;
        let target = target.min((round + 1) * per_round - 1);
        if kill_remote {
            relay
                .wait_acked("a record of the round", |a| parse(&a.payload).1 >= target)
                .await;
        } else {
            collector
                .wait_until(TRANSFER, |seen| {
                    seen.iter().any(|(_, p)| parse(p).1 >= target)
                })
                .await;
        }
        if plan.cut.contains(&round) {
            let before = relay.accepted();
            relay.cut();
            relay.wait_accepted_over(before).await;
        }
        if plan.terminate_remote.contains(&round) {
            terminated.insert(remote.incarnation());
            tokio::task::block_in_place(|| remote.restart());
        }
        if kill_remote {
            killed.insert(remote.incarnation());
            tokio::task::block_in_place(|| remote.kill9_and_start());
            collector.go_online();
        }
        if plan.kill_saguin.contains(&round) {
            saguin = saguin.restart(&yaml);
        }
    }
    let mut marker = Raw::tcp(saguin.addr(), v5()).await;
    marker.connect("marker", ConnectOpts::clean()).await;
    marker
        .publish_acked("telemetry/t0", MARKER, 1, false, 1)
        .await;
    marker.disconnect().await;
    collector
        .wait_until(TRANSFER, |seen| seen.iter().any(|(_, p)| p == MARKER))
        .await;
    let total = plan.rounds * per_round;
    let seen = collector.seen.lock().unwrap().clone();
    let distinct: HashSet<(usize, u32)> = seen.iter().map(|(_, p)| parse(p)).collect();
    // Which starts of the remote acknowledged each record.
    let mut acked_by: HashMap<(usize, u32), HashSet<u64>> = HashMap::new();
    // And how many acknowledgements that start sent after it, at least
    // (for a failure's report).
    let mut acked_before_end: HashMap<(usize, u32), usize> = HashMap::new();
    let acked = relay.acked();
    let mut per_start: HashMap<u64, usize> = HashMap::new();
    for a in &acked {
        *per_start.entry(a.incarnation).or_default() += 1;
    }
    let mut rank: HashMap<u64, usize> = HashMap::new();
    for a in &acked {
        let record = parse(&a.payload);
        acked_by.entry(record).or_default().insert(a.incarnation);
        let r = rank.entry(a.incarnation).or_default();
        *r += 1;
        let after = per_start[&a.incarnation] - *r;
        let e = acked_before_end.entry(record).or_insert(after);
        *e = (*e).min(after);
    }
    let mut lost_by_kill = 0;
    let (mut never_acked, mut lost_after_ack) = (Vec::new(), Vec::new());
    for record in (0..PUBLISHERS).flat_map(|p| (0..total).map(move |s| (p, s))) {
        if distinct.contains(&record) {
            continue;
        }
        match acked_by.get(&record) {
            // Acknowledged only from the memory of starts killed -9.
            Some(by) if by.is_subset(&killed) => lost_by_kill += 1,
            Some(by) => lost_after_ack.push((record, by.clone(), acked_before_end[&record])),
            None => never_acked.push(record),
        }
    }
    if !never_acked.is_empty() || !lost_after_ack.is_empty() {
        let log = saguin.log_text();
        let tail: Vec<&str> = log.lines().filter(|l| l.contains("bridge")).collect();
        panic!(
            "{} records missing at the remote that it never acknowledged, the first {:?}; \
             {} it acknowledged and did not deliver, the first {:?} (by the starts of the \
             remote that acknowledged it, and how many acknowledgements that start sent \
             after it; killed {killed:?}, terminated {terminated:?}); the bridge's log:\n{}",
            never_acked.len(),
            &never_acked[..never_acked.len().min(20)],
            lost_after_ack.len(),
            &lost_after_ack[..lost_after_ack.len().min(20)],
            tail[tail.len().saturating_sub(40)..].join("\n")
        );
    }
    check_ordered(&seen);
    // Stopped gracefully, the bridge's position is the channel's end: a
    // restart finds nothing left to send.
    assert_eq!(saguin.terminate(), Some(0));
    let saguin = saguin.restart(&yaml);
    let line = saguin.wait_log(|l| l.contains("msg=\"bridge\""));
    assert!(line.contains("lag_records=\"telemetry=0\""), "{line}");
    let records = PUBLISHERS * total as usize;
    eprintln!(
        "{test}: {records} records, {} duplicates at the remote, {lost_by_kill} lost with the \
         remote's memory ({} acknowledged by starts it killed)",
        seen.len() - distinct.len(),
        acked_by
            .values()
            .filter(|by| by.iter().any(|i| killed.contains(i)))
            .count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_mqtt5_every_acknowledged_record_reaches_mosquitto_through_crashes() {
    out_through_crashes("mqtt5", "out_mqtt5", CRASHES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_mqtt311_every_acknowledged_record_reaches_mosquitto_through_crashes() {
    out_through_crashes("mqtt311", "out_mqtt311", CRASHES).await;
}

/// Check 1: saguin killed -9 four times, the link cut twice, the remote
/// restarted with SIGTERM once.
const CRASHES: Plan = Plan {
    rounds: 5,
    per_round: 2_000,
    cut: &[1, 3],
    terminate_remote: &[2],
    kill_remote: &[],
    kill_saguin: &[0, 1, 2, 3],
};

/// Mosquitto acknowledges from memory: killed -9, it may lose what it
/// acknowledged since its last save, and only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_only_what_the_remote_acknowledged_before_its_kill_9_may_be_missing() {
    out_through_crashes(
        "mqtt5",
        "out_remote_kill_9",
        Plan {
            rounds: 4,
            per_round: 1_000,
            cut: &[1],
            terminate_remote: &[],
            kill_remote: &[0, 2],
            kill_saguin: &[1],
        },
    )
    .await;
}

/// A SIGTERM stores the bridge's position with everything the remote
/// acknowledged, the acknowledgements the bridge still held for the state
/// included: the position is committed at shutdown only here (an
/// `ack_commit_interval` of an hour). Once the relay passed the remote's
/// PUBACK of every publisher's last record, what the bridge may be sent
/// again after the restart is only what it had not read yet of those
/// PUBACKs: at most one window, not the transfer.
#[tokio::test]
async fn out_sigterm_stores_the_position_of_everything_the_remote_acknowledged() {
    let test = "out_sigterm_stores_the_position_of_everything_the_remote_acknowledged";
    if !have_mosquitto(test) {
        return;
    }
    let remote = Mosquitto::start("");
    let mut collector = Collector::start(&remote, "collector", "sites/17/#").await;
    let mut relay = Relay::watching(&remote).await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = saguin_yaml(
        dir.path(),
        "  - { name: telemetry, kind: append, storage: db }",
        &bridge_yaml(relay.addr, "mqtt5"),
    )
    .replace("ack_commit_interval: 50ms", "ack_commit_interval: 1h");
    let mut saguin = Broker::start_in(dir, &yaml);
    let per = 500u32;
    let addr = saguin.addr();
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|p| tokio::spawn(publish(addr, p, 0..per)))
        .collect();
    for p in publishers {
        p.await.unwrap();
    }
    let all = PUBLISHERS * per as usize;
    for p in 0..PUBLISHERS {
        let last = format!("{p}:{}", per - 1).into_bytes();
        relay
            .wait_acked("each publisher's last record", |a| a.payload == last)
            .await;
    }
    assert_eq!(saguin.terminate(), Some(0), "a clean stop");
    let saguin = saguin.restart(&yaml);
    let mut c = Raw::tcp(saguin.addr(), v5()).await;
    c.connect("marker", ConnectOpts::clean()).await;
    c.publish_acked("telemetry/marker", MARKER, 1, false, 1)
        .await;
    c.disconnect().await;
    collector
        .wait_until(TRANSFER, |seen| seen.iter().any(|(_, p)| p == MARKER))
        .await;
    let seen = collector.seen.lock().unwrap().clone();
    let again: Vec<_> = seen
        .iter()
        .filter(|(_, p)| p != MARKER)
        .skip(all)
        .map(|(t, p)| (t.clone(), String::from_utf8_lossy(p).into_owned()))
        .collect();
    // `max_inflight: 32` in `bridge_yaml`.
    assert!(
        again.len() <= 32,
        "{} records sent again after a clean stop, first {:?}",
        again.len(),
        again.first()
    );
    let distinct: HashSet<_> = seen.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(distinct.len(), all + 1, "every record, then the marker");
}
