//! Bridges between two brokers: saguin into saguin with both killed -9
//! (every record arrives), loops in both directions (one publish, one
//! record each side) against Mosquitto and against saguin, and TLS.

mod bridge_support;
mod broker_support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use bridge_support::{fixture, free_port, have_mosquitto, read_channel, Collector, Mosquitto, Rng};
use broker_support::{v5, Broker, ConnectOpts, Raw};

/// A saguin on a fixed port (so a restart keeps its address), sqlite.
fn peer_yaml(dir: &std::path::Path, port: u16, channels: &str, bridges: &str, tls: &str) -> String {
    format!(
        "listeners: [{{ name: mqtt, bind: 127.0.0.1:{port}{tls} }}]
auth: {{ allow_anonymous: true }}
storage: [{{ name: db, kind: sqlite, file_path: {} }}]
channels:
{channels}
broker: {{ session_storage: db, session: {{ ack_commit_interval: 50ms }} }}
{bridges}",
        dir.join("saguin.db").display()
    )
}

fn bridge(name: &str, remote: SocketAddr, rules: &str) -> String {
    format!(
        "bridges:
  - name: {name}
    address: {remote}
    client_id: {name}.bridge
    reconnect: {{ base: 50ms, cap: 400ms }}
{rules}"
    )
}

async fn publish(addr: SocketAddr, client: &str, topic: &str, payloads: &[String]) {
    let mut c = Raw::tcp(addr, v5()).await;
    c.connect(client, ConnectOpts::clean()).await;
    for (i, p) in payloads.iter().enumerate() {
        c.publish_acked(topic, p.as_bytes(), 1, false, (i % 60_000 + 1) as u16)
            .await;
    }
    c.disconnect().await;
}

fn payloads(seen: &[(String, Vec<u8>)]) -> Vec<String> {
    seen.iter()
        .map(|(_, p)| String::from_utf8_lossy(p).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn saguin_into_saguin_every_record_arrives_with_both_killed() {
    let mut rng = Rng::seeded("saguin_into_saguin");
    let (a_port, b_port) = (free_port(), free_port());
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b_yaml = peer_yaml(
        b_dir.path(),
        b_port,
        "  - { name: sites, kind: append, storage: db }",
        "",
        "",
    );
    let a_yaml = peer_yaml(
        a_dir.path(),
        a_port,
        "  - { name: telemetry, kind: append, storage: db }",
        &bridge(
            "cloud",
            SocketAddr::from(([127, 0, 0, 1], b_port)),
            "    out: [{ channel: telemetry, remote_prefix: sites/17/ }]\n",
        ),
        "",
    );
    let mut b = Broker::start_in(b_dir, &b_yaml);
    let mut a = Broker::start_in(a_dir, &a_yaml);
    let rounds = 4;
    let per_round = 500;
    for round in 0..rounds {
        let batch: Vec<String> = (round * per_round..(round + 1) * per_round)
            .map(|i| format!("r{i}"))
            .collect();
        publish(a.addr(), "producer", "telemetry/d", &batch).await;
        let wanted = 1 + rng.below(per_round as u64) as usize;
        read_channel(b.addr(), "sites/#", Duration::from_secs(60), |seen| {
            let mine: HashSet<&Vec<u8>> = seen.iter().map(|(_, p)| p).collect();
            mine.len() >= round * per_round + wanted.min(per_round)
        })
        .await;
        // kill -9: the remote on even rounds, the bridge's side on odd ones.
        if round % 2 == 0 {
            b = b.restart(&b_yaml);
        } else {
            a = a.restart(&a_yaml);
        }
    }
    let total = rounds * per_round;
    let seen = read_channel(b.addr(), "sites/#", Duration::from_secs(120), |seen| {
        seen.iter().map(|(_, p)| p).collect::<HashSet<_>>().len() == total
    })
    .await;
    let distinct: HashSet<String> = payloads(&seen).into_iter().collect();
    for i in 0..total {
        assert!(
            distinct.contains(&format!("r{i}")),
            "r{i} never reached the remote saguin"
        );
    }
    // Offsets differ, the order is the channel's: first occurrences rise.
    let mut last = None;
    let mut firsts = HashSet::new();
    for p in payloads(&seen) {
        if firsts.insert(p.clone()) {
            let n: usize = p[1..].parse().unwrap();
            assert!(last.is_none_or(|l| l < n), "r{n} after r{last:?}");
            last = Some(n);
        }
    }
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_loop_with_mosquitto_carries_each_publish_once_each_way() {
    if !have_mosquitto("loop_mosquitto") {
        return;
    }
    let remote = Mosquitto::start("log_type subscribe");
    let mut collector = Collector::start(&remote, "watcher", "telemetry/#").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = peer_yaml(
        dir.path(),
        0,
        "  - { name: telemetry, kind: append, storage: db }",
        &bridge(
            "cloud",
            remote.addr(),
            "    out: [{ channel: telemetry }]\n    in: [{ filter: telemetry/#, local_prefix: \"\" }]\n",
        ),
        "",
    );
    let saguin = Broker::start_in(dir, &yaml);
    saguin.wait_log(|l| l.contains("bridge connected"));
    tokio::task::block_in_place(|| remote.wait_log(|l| l.contains("cloud.bridge 1 telemetry/#")));
    publish(saguin.addr(), "local", "telemetry/a", &["local-1".into()]).await;
    let mut at_remote = Raw::tcp(remote.addr(), broker_support::v4()).await;
    at_remote
        .connect("remote-producer", ConnectOpts::clean())
        .await;
    at_remote
        .publish_acked("telemetry/b", b"remote-1", 1, false, 1)
        .await;
    // The marker follows both through the same channel and bridge: any
    // copy of what came before it would have arrived first.
    read_channel(
        saguin.addr(),
        "telemetry/#",
        Duration::from_secs(30),
        |seen| payloads(seen).contains(&"remote-1".to_owned()),
    )
    .await;
    publish(saguin.addr(), "local", "telemetry/a", &["marker".into()]).await;
    collector
        .wait_until(Duration::from_secs(30), |seen| {
            payloads(seen).contains(&"marker".to_owned())
        })
        .await;
    let mut seen = payloads(&collector.seen.lock().unwrap());
    seen.sort();
    assert_eq!(seen, vec!["local-1", "marker", "remote-1"], "at the remote");
    let records = read_channel(
        saguin.addr(),
        "telemetry/#",
        Duration::from_secs(30),
        |seen| payloads(seen).contains(&"marker".to_owned()),
    )
    .await;
    let mut records = payloads(&records);
    records.sort();
    assert_eq!(
        records,
        vec!["local-1", "marker", "remote-1"],
        "in the channel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_saguins_bridged_both_ways_keep_one_record_each_side() {
    let (a_port, b_port) = (free_port(), free_port());
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rules = "    out: [{ channel: telemetry }]\n";
    let channels = "  - { name: telemetry, kind: append, storage: db }";
    let a_yaml = peer_yaml(
        a_dir.path(),
        a_port,
        channels,
        &bridge("to-b", SocketAddr::from(([127, 0, 0, 1], b_port)), rules),
        "",
    );
    let b_yaml = peer_yaml(
        b_dir.path(),
        b_port,
        channels,
        &bridge("to-a", SocketAddr::from(([127, 0, 0, 1], a_port)), rules),
        "",
    );
    let a = Broker::start_in(a_dir, &a_yaml);
    let b = Broker::start_in(b_dir, &b_yaml);
    a.wait_log(|l| l.contains("bridge connected"));
    b.wait_log(|l| l.contains("bridge connected"));
    publish(a.addr(), "pa", "telemetry/x", &["from-a".into()]).await;
    publish(b.addr(), "pb", "telemetry/x", &["from-b".into()]).await;
    // Markers after both, on each side: what a loop would have added
    // arrives before them.
    read_channel(b.addr(), "telemetry/#", Duration::from_secs(30), |s| {
        payloads(s).contains(&"from-a".to_owned())
    })
    .await;
    read_channel(a.addr(), "telemetry/#", Duration::from_secs(30), |s| {
        payloads(s).contains(&"from-b".to_owned())
    })
    .await;
    publish(a.addr(), "pa", "telemetry/x", &["marker-a".into()]).await;
    publish(b.addr(), "pb", "telemetry/x", &["marker-b".into()]).await;
    let done = |s: &[(String, Vec<u8>)]| {
        let p = payloads(s);
        p.contains(&"marker-a".to_owned()) && p.contains(&"marker-b".to_owned())
    };
    for side in [&a, &b] {
        let mut records = payloads(
            &read_channel(side.addr(), "telemetry/#", Duration::from_secs(30), done).await,
        );
        records.sort();
        assert_eq!(records, vec!["from-a", "from-b", "marker-a", "marker-b"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bridge_over_tls_checks_the_remote_against_its_ca() {
    let files = fixture("config/files");
    let b_dir = tempfile::tempdir().unwrap();
    let b_yaml = format!(
        "listeners:
  - {{ name: mqtt, bind: 127.0.0.1:0 }}
  - {{ name: mqtts, bind: 127.0.0.1:0, tls: {{ cert: {}, key: {} }} }}
auth: {{ allow_anonymous: true }}
storage: [{{ name: db, kind: sqlite, file_path: {} }}]
channels: [{{ name: sites, kind: append, storage: db }}]
",
        files.join("server.pem").display(),
        files.join("server.key").display(),
        b_dir.path().join("saguin.db").display()
    );
    let b = Broker::start_in(b_dir, &b_yaml);
    let a_dir = tempfile::tempdir().unwrap();
    let rules = format!(
        "    tls: {{ ca: {}, server_name: localhost }}\n    out: [{{ channel: telemetry, remote_prefix: sites/ }}]\n",
        files.join("ca.pem").display()
    );
    let a_yaml = peer_yaml(
        a_dir.path(),
        0,
        "  - { name: telemetry, kind: append, storage: db }",
        &bridge("secure", b.listeners["mqtts"], &rules),
        "",
    );
    let a = Broker::start_in(a_dir, &a_yaml);
    a.wait_log(|l| l.contains("bridge connected"));
    publish(a.addr(), "p", "telemetry/t", &["over-tls".into()]).await;
    let seen = read_channel(b.addr(), "sites/#", Duration::from_secs(30), |s| {
        !s.is_empty()
    })
    .await;
    assert_eq!(payloads(&seen), vec!["over-tls"]);
    assert_eq!(seen[0].0, "sites/telemetry/t");
}

/// The retained messages the remote holds under `filter` (a fresh
/// subscriber's, up to a marker published after it subscribed), sorted.
async fn remote_retained(
    remote: &Mosquitto,
    filter: &str,
    marker_topic: &str,
) -> Vec<(String, String)> {
    let mut peek = Raw::tcp(remote.addr(), broker_support::v4()).await;
    peek.connect("peek", ConnectOpts::clean()).await;
    peek.subscribe(1, filter, 1).await;
    let mut marker = Raw::tcp(remote.addr(), broker_support::v4()).await;
    marker.connect("peek-marker", ConnectOpts::clean()).await;
    marker
        .publish_acked(marker_topic, b"end", 1, false, 1)
        .await;
    marker.disconnect().await;
    let mut retained = Vec::new();
    loop {
        let p = peek.next_publish(true).await;
        if p.topic.as_str() == marker_topic {
            break;
        }
        assert!(
            p.retain,
            "only retained messages come before the marker: {p:?}"
        );
        retained.push((
            p.topic.to_string(),
            String::from_utf8_lossy(&p.payload).into_owned(),
        ));
    }
    peek.disconnect().await;
    retained.sort();
    retained
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_latest_channel_goes_out_as_retained_values_and_a_deletion_deletes_the_remotes() {
    if !have_mosquitto("latest_out") {
        return;
    }
    let mut remote = Mosquitto::start("");
    let mut collector = Collector::start(&remote, "watcher", "sites/17/#").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = peer_yaml(
        dir.path(),
        0,
        "  - { name: devices, kind: latest, storage: db }",
        &bridge(
            "cloud",
            remote.addr(),
            "    out: [{ channel: devices, remote_prefix: sites/17/, from: earliest }]\n",
        ),
        "",
    );
    let saguin = Broker::start_in(dir, &yaml);
    saguin.wait_log(|l| l.contains("bridge connected"));
    let mut c = Raw::tcp(saguin.addr(), v5()).await;
    c.connect("devices", ConnectOpts::clean()).await;
    // Published without RETAIN: a latest channel's value is one anyway.
    c.publish_acked("devices/d1", b"on", 1, false, 1).await;
    c.publish_acked("devices/d2", b"idle", 1, false, 2).await;
    let arrived = |payload: &'static str| {
        move |seen: &[(String, Vec<u8>)]| seen.iter().any(|(_, p)| p == payload.as_bytes())
    };
    collector
        .wait_until(Duration::from_secs(30), arrived("idle"))
        .await;
    let retained = remote_retained(&remote, "sites/17/devices/#", "sites/17/devices/zz").await;
    assert_eq!(
        retained,
        vec![
            ("sites/17/devices/d1".to_owned(), "on".to_owned()),
            ("sites/17/devices/d2".to_owned(), "idle".to_owned())
        ]
    );
    // A replacement replaces it there; a deletion deletes it there.
    c.publish_acked("devices/d1", b"off", 1, false, 3).await;
    c.publish_acked("devices/d2", b"", 1, false, 4).await;
    c.publish_acked("devices/d3", b"new", 1, true, 5).await;
    collector
        .wait_until(Duration::from_secs(30), arrived("new"))
        .await;
    c.disconnect().await;
    let retained = remote_retained(&remote, "sites/17/devices/#", "sites/17/devices/zz").await;
    assert_eq!(
        retained,
        vec![
            ("sites/17/devices/d1".to_owned(), "off".to_owned()),
            ("sites/17/devices/d3".to_owned(), "new".to_owned())
        ]
    );
    // Changed while the bridge is away (the remote down, saguin started
    // again): resumed from its stored position, each topic's latest change
    // goes out, a deletion among them.
    let mut saguin = saguin;
    tokio::task::block_in_place(|| remote.stop());
    assert_eq!(saguin.terminate(), Some(0));
    let saguin = saguin.restart(&yaml);
    let mut c = Raw::tcp(saguin.addr(), v5()).await;
    c.connect("devices", ConnectOpts::clean()).await;
    c.publish_acked("devices/d1", b"standby", 1, false, 1).await;
    c.publish_acked("devices/d1", b"away", 1, false, 2).await;
    c.publish_acked("devices/d3", b"", 1, false, 3).await;
    c.disconnect().await;
    tokio::task::block_in_place(|| remote.start_again());
    // Both changes, each in its own PUBLISH: the remote holds a value once
    // its subscribers are sent it, so the retained values are read after
    // the deletion of d3 arrived too (d3 was never deleted before).
    collector
        .wait_until(Duration::from_secs(30), |seen| {
            let d3_deleted = seen
                .iter()
                .any(|(topic, p)| topic == "sites/17/devices/d3" && p.is_empty());
            arrived("away")(seen) && d3_deleted
        })
        .await;
    let retained = remote_retained(&remote, "sites/17/devices/#", "sites/17/devices/zz").await;
    assert_eq!(
        retained,
        vec![("sites/17/devices/d1".to_owned(), "away".to_owned())]
    );
    // Live, each topic's changes in order; what changed while away, each
    // topic's latest only (the watcher's resubscription brings the
    // retained values again in between).
    let seen: Vec<(String, String)> = collector
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|(topic, p)| (topic.clone(), String::from_utf8_lossy(p).into_owned()))
        .filter(|(_, p)| p != "end")
        .collect();
    let live = seen.iter().position(|(_, p)| p == "new").expect("new") + 1;
    // A change committed while the current values were read may come as
    // both (at least once): again after the topic's own, never after a
    // later one of it.
    let mut live_by_topic: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (topic, p) in &seen[..live] {
        let values = live_by_topic.entry(topic).or_default();
        if values.last() != Some(&p.as_str()) {
            values.push(p);
        }
    }
    assert_eq!(
        live_by_topic,
        [
            ("sites/17/devices/d1", vec!["on", "off"]),
            ("sites/17/devices/d2", vec!["idle", ""]),
            ("sites/17/devices/d3", vec!["new"]),
        ]
        .into(),
        "{seen:?}"
    );
    let away: Vec<&str> = seen[live..].iter().map(|(_, p)| p.as_str()).collect();
    assert!(!away.contains(&"standby"), "{seen:?}");
    assert!(away.contains(&"away") && away.contains(&""), "{seen:?}");
}

/// A bridge to two Mosquittos, each behind a relay (so the test can cut
/// the link to one while it stays up); one collector at each.
struct TwoRemotes {
    remotes: [Mosquitto; 2],
    relays: [bridge_support::Relay; 2],
    collectors: [Collector; 2],
    saguin: Broker,
}

impl TwoRemotes {
    async fn start(round_robin: bool) -> TwoRemotes {
        let remotes = [Mosquitto::start(""), Mosquitto::start("")];
        let collectors = [
            Collector::start(&remotes[0], "watcher", "sites/17/#").await,
            Collector::start(&remotes[1], "watcher", "sites/17/#").await,
        ];
        let relays = [
            bridge_support::Relay::watching(&remotes[0]).await,
            bridge_support::Relay::watching(&remotes[1]).await,
        ];
        let dir = tempfile::tempdir().unwrap();
        let yaml = peer_yaml(
            dir.path(),
            0,
            "  - { name: telemetry, kind: append, storage: db }",
            &format!(
                "bridges:
  - name: cloud
    address: [{}, {}]
    round_robin: {round_robin}
    client_id: cloud.bridge
    reconnect: {{ base: 50ms, cap: 300ms }}
    out: [{{ channel: telemetry, remote_prefix: sites/17/ }}]
",
                relays[0].addr, relays[1].addr
            ),
            "",
        );
        let saguin = Broker::start_in(dir, &yaml);
        TwoRemotes {
            remotes,
            relays,
            collectors,
            saguin,
        }
    }

    /// Publish `payload` and wait until remote `at` has it.
    async fn arrives_at(&mut self, at: usize, payload: &str) {
        publish(
            self.saguin.addr(),
            "producer",
            "telemetry/d",
            &[payload.to_owned()],
        )
        .await;
        let wanted = payload.as_bytes().to_vec();
        self.collectors[at]
            .wait_until(Duration::from_secs(30), |seen| {
                seen.iter().any(|(_, p)| *p == wanted)
            })
            .await;
    }

    /// The `n`th "bridge connected" line names relay `at`.
    fn connected_to(&self, n: usize, at: usize) {
        let lines = self
            .saguin
            .wait_log_count(|l| l.contains("msg=\"bridge connected\""), n);
        let address = self.relays[at].addr.to_string();
        assert!(
            lines[n - 1].contains(&address),
            "{} is not {address}",
            lines[n - 1]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_round_robin_the_bridge_fails_over_to_the_second_address_and_returns_to_the_first()
{
    if !have_mosquitto("failover") {
        return;
    }
    let mut two = TwoRemotes::start(false).await;
    two.connected_to(1, 0);
    two.arrives_at(0, "to-primary").await;
    // The primary goes: the bridge connects to the second address.
    tokio::task::block_in_place(|| two.remotes[0].kill9());
    two.connected_to(2, 1);
    two.arrives_at(1, "to-secondary").await;
    // Back, the primary takes the bridge again, the secondary still up.
    tokio::task::block_in_place(|| two.remotes[0].start_again());
    two.collectors[0].wait_subscribed().await;
    two.saguin
        .wait_log(|l| l.contains("primary address is reachable again"));
    two.connected_to(3, 0);
    two.arrives_at(0, "primary-again").await;
    let at_secondary = payloads(&two.collectors[1].seen.lock().unwrap());
    assert!(
        !at_secondary.contains(&"primary-again".to_owned()),
        "{at_secondary:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_round_robin_each_reconnect_starts_at_the_next_address() {
    if !have_mosquitto("round_robin") {
        return;
    }
    let mut two = TwoRemotes::start(true).await;
    two.connected_to(1, 0);
    two.arrives_at(0, "first").await;
    // A cut link, both remotes up: the next connection is to the other.
    two.relays[0].cut();
    two.connected_to(2, 1);
    two.arrives_at(1, "second").await;
    two.relays[1].cut();
    two.connected_to(3, 0);
    two.arrives_at(0, "third").await;
    // (What was in flight at a cut may reach both: at least once.)
    assert!(!payloads(&two.collectors[1].seen.lock().unwrap()).contains(&"third".to_owned()));
}
