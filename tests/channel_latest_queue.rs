//! Latest and queue channels through the real binary: values, replacement
//! and deletion, a durable consumer resuming with exactly what changed
//! (across kill -9 on sqlite and SIGTERM on memory); workers that never
//! hold one job together, an expired lease counted, refused jobs
//! dead-lettered with their headers, and attempts that survive kill -9.

mod broker_support;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::Path;

use broker_support::*;
use bytes::Bytes;
use saguin::broker::codec::{
    self, Packet, PubAck, Publish, ReasonCode, RetainHandling, SubscriptionOptions,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn sqlite_yaml(dir: &Path, channels: &str) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\nmetrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         channels:\n{channels}broker:\n  session_storage: db\n",
        dir.join("saguin.db").display()
    )
}

fn memory_yaml(dir: &Path, channels: &str) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\nmetrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: db\n    kind: memory\n    snapshot_dir: {}\n\
         channels:\n{channels}broker:\n  session_storage: db\n",
        dir.join("snapshots").display()
    )
}

const DEVICES: &str = "  - name: devices\n    kind: latest\n    storage: db\n";

/// Prometheus text from the broker's metrics listener.
fn scrape(broker: &Broker) -> String {
    let mut s = std::net::TcpStream::connect(broker.listeners["metrics"]).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

fn metric(text: &str, line_start: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Scrapes until `line_start` reads `want`: a count the broker reaches
/// once its commits are in, waited for with a bounded number of scrapes.
fn wait_metric(broker: &Broker, line_start: &str, want: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = scrape(broker);
        if metric(&text, line_start) == Some(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{line_start} never reached {want}: {text}"
        );
        std::thread::yield_now();
    }
}

fn user_property(p: &Publish, name: &str) -> Option<String> {
    p.properties
        .user_properties
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

async fn puback_with(c: &mut Raw<tokio::net::TcpStream>, packet_id: u16, reason: ReasonCode) {
    let mut ack = PubAck::new(packet_id);
    ack.reason = reason;
    c.send(Packet::PubAck(ack)).await;
}

// ---- latest ---------------------------------------------------------------

/// Values, replacement and deletion; then a durable consumer away while 5
/// topics change and 2 are deleted gets exactly those 7 changes on resume,
/// across the stop `stop` makes.
fn a_durable_latest_consumer_gets_exactly_what_changed(
    yaml: impl Fn(&Path) -> String,
    stop: impl Fn(&mut Broker),
    sqlite: bool,
) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let yaml = yaml(dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    rt.block_on(async {
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        for i in 1..=10u16 {
            let topic = format!("devices/site-7/d{i}");
            publisher.publish_acked(&topic, b"v1", 1, false, i).await;
        }
        // Replaced and deleted before anybody subscribes.
        publisher
            .publish_acked("devices/site-7/d1", b"v2", 1, false, 11)
            .await;
        publisher
            .publish_acked("devices/site-7/gone", b"x", 1, false, 12)
            .await;
        publisher
            .publish_acked("devices/site-7/gone", b"", 1, false, 13)
            .await;

        let mut consumer = Raw::tcp(broker.addr(), v5()).await;
        consumer
            .connect("durable", ConnectOpts::persistent(3600))
            .await;
        consumer.subscribe(1, "devices/site-7/#", 1).await;
        let mut values = BTreeMap::new();
        for _ in 0..10 {
            let p = consumer.next_publish(true).await;
            assert!(p.retain, "a current value carries RETAIN: {p:?}");
            values.insert(p.topic.to_string(), p.payload.clone());
        }
        consumer.expect_nothing().await;
        assert_eq!(values.len(), 10);
        assert_eq!(values["devices/site-7/d1"], Bytes::from_static(b"v2"));
        assert!(!values.contains_key("devices/site-7/gone"));
        // A live change arrives as a change.
        publisher
            .publish_acked("devices/site-7/d10", b"v2", 1, false, 14)
            .await;
        let p = consumer.next_publish(true).await;
        assert_eq!((p.topic.as_ref(), p.retain), ("devices/site-7/d10", false));
        consumer.disconnect().await;
    });
    if sqlite {
        // The position is written as the consumer goes; kill -9 comes after.
        wait_position(&db, "devices", "mqtt:durable");
    }
    rt.block_on(async {
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        for i in 1..=5u16 {
            let topic = format!("devices/site-7/d{i}");
            publisher.publish_acked(&topic, b"v3", 1, false, i).await;
        }
        publisher
            .publish_acked("devices/site-7/d6", b"", 1, false, 6)
            .await;
        publisher
            .publish_acked("devices/site-7/d7", b"", 1, false, 7)
            .await;
        // Another site's change is not the consumer's.
        publisher
            .publish_acked("devices/site-8/d1", b"v1", 1, false, 8)
            .await;
    });
    stop(&mut broker);
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut consumer = Raw::tcp(broker.addr(), v5()).await;
        let ack = consumer
            .connect("durable", ConnectOpts::persistent(3600))
            .await;
        assert!(ack.session_present);
        let mut changes = Vec::new();
        for _ in 0..7 {
            let p = consumer.next_publish(true).await;
            assert!(!p.retain, "a change, not a current value: {p:?}");
            changes.push((p.topic.to_string(), p.payload.clone()));
        }
        consumer.expect_nothing().await;
        changes.sort();
        let mut want: Vec<(String, Bytes)> = (1..=5)
            .map(|i| (format!("devices/site-7/d{i}"), Bytes::from_static(b"v3")))
            .collect();
        want.push(("devices/site-7/d6".into(), Bytes::new()));
        want.push(("devices/site-7/d7".into(), Bytes::new()));
        assert_eq!(
            changes, want,
            "exactly the 7 changes, deletions as empty payloads"
        );
        // A new subscriber gets the values as they are now.
        let mut fresh = Raw::tcp(broker.addr(), v5()).await;
        fresh.connect("fresh", ConnectOpts::clean()).await;
        fresh.subscribe(1, "devices/site-7/#", 0).await;
        let mut now = BTreeMap::new();
        for _ in 0..8 {
            let p = fresh.next_publish(false).await;
            now.insert(p.topic.to_string(), p.payload.clone());
        }
        fresh.expect_nothing().await;
        assert_eq!(now["devices/site-7/d1"], Bytes::from_static(b"v3"));
        assert_eq!(now["devices/site-7/d10"], Bytes::from_static(b"v2"));
        assert!(!now.contains_key("devices/site-7/d6"));
    });
}

#[test]
fn latest_on_sqlite_values_deletions_and_a_resume_across_kill_9() {
    a_durable_latest_consumer_gets_exactly_what_changed(
        |d| sqlite_yaml(d, DEVICES),
        |b| {
            b.child.kill().unwrap();
            b.child.wait().unwrap();
        },
        true,
    );
}

#[test]
fn latest_on_memory_values_deletions_and_a_resume_across_sigterm() {
    a_durable_latest_consumer_gets_exactly_what_changed(
        |d| memory_yaml(d, DEVICES),
        |b| assert_eq!(b.terminate(), Some(0)),
        false,
    );
}

/// SUBSCRIBE `filter` at QoS 1 with Retain Handling 2: no current values.
async fn subscribe_without_values(c: &mut Raw<tokio::net::TcpStream>, filter: &str) {
    c.subscribe_with(
        1,
        filter,
        SubscriptionOptions {
            qos: qos(1),
            retain_handling: RetainHandling::DoNotSend,
            ..Default::default()
        },
        None,
    )
    .await;
}

#[test]
fn retain_handling_2_sends_no_current_values() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_yaml(dir.path(), DEVICES);
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        publisher
            .publish_acked("devices/a", b"1", 1, false, 1)
            .await;
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        c.connect("c", ConnectOpts::clean()).await;
        subscribe_without_values(&mut c, "devices/#").await;
        c.expect_nothing().await;
        publisher
            .publish_acked("devices/a", b"2", 1, false, 2)
            .await;
        let p = c.next_publish(true).await;
        assert_eq!(p.payload, Bytes::from_static(b"2"));
    });
}

/// A consumer's connection with room for `window` deliveries.
async fn durable_connect(
    addr: std::net::SocketAddr,
    id: &str,
    window: u16,
) -> (Raw<tokio::net::TcpStream>, bool) {
    let mut c = Raw::tcp(addr, v5()).await;
    let mut opts = ConnectOpts::persistent(3600);
    opts.properties.receive_maximum = Some(window);
    let ack = c.connect(id, opts).await;
    (c, ack.session_present)
}

/// `n` PUBLISHes, answered or not.
async fn take(c: &mut Raw<tokio::net::TcpStream>, n: usize, ack: bool) -> Vec<Publish> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(c.next_publish(ack).await);
    }
    out
}

/// Each PUBLISH's (topic, offset, retain, dup).
fn seen(publishes: &[Publish]) -> Vec<(String, u64, bool, bool)> {
    publishes
        .iter()
        .map(|p| {
            let offset = user_property(p, "saguin-offset").unwrap().parse().unwrap();
            (p.topic.to_string(), offset, p.retain, p.dup)
        })
        .collect()
}

/// The current values a new consumer is sent are held in its stored
/// position until each is acknowledged: a position written while some
/// are out never passes them, across kill -9 and across a connection that
/// went away with some not yet sent, and once all are acknowledged a
/// resume sends none of them again.
#[test]
fn current_values_are_covered_by_the_stored_position_only_once_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let yaml = sqlite_yaml(dir.path(), DEVICES);
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let site = |i: u64| format!("devices/site-7/d{i:02}");
    rt.block_on(async {
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        for i in 1..=10u16 {
            publisher
                .publish_acked(&site(u64::from(i)), b"v1", 1, false, i)
                .await;
        }
        // Room for 4: offsets 1-4 go out, 5-10 wait.
        let (mut c, _) = durable_connect(broker.addr(), "durable", 4).await;
        c.subscribe(1, "devices/site-7/#", 1).await;
        let first = take(&mut c, 4, false).await;
        assert_eq!(
            seen(&first).iter().map(|v| (v.1, v.2)).collect::<Vec<_>>(),
            [(1, true), (2, true), (3, true), (4, true)]
        );
        // Written while all four are out: it passes none of them.
        assert_eq!(
            wait_position_where(&db, "devices", "mqtt:durable", |_| true),
            1
        );
        for p in &first[..2] {
            c.ack_publish(p).await;
        }
        // 5 and 6 take the room; the position moves to the lowest still out.
        let more = seen(&take(&mut c, 2, false).await);
        assert_eq!(more.iter().map(|v| v.1).collect::<Vec<_>>(), [5, 6]);
        wait_position_where(&db, "devices", "mqtt:durable", |o| o == 3);
        // A second consumer whose connection goes away with 8 values unsent.
        let (mut d, _) = durable_connect(broker.addr(), "durable-2", 2).await;
        d.subscribe(1, "devices/site-7/#", 1).await;
        assert_eq!(take(&mut d, 2, false).await.len(), 2);
        d.disconnect().await;
        // The 2 it held come again, then the 8 it was never sent, as changes.
        let (mut d, present) = durable_connect(broker.addr(), "durable-2", 100).await;
        assert!(present);
        let again = seen(&take(&mut d, 10, true).await);
        assert_eq!(
            again.iter().map(|v| (v.1, v.2, v.3)).collect::<Vec<_>>(),
            [
                (1, true, true),
                (2, true, true),
                (3, false, false),
                (4, false, false),
                (5, false, false),
                (6, false, false),
                (7, false, false),
                (8, false, false),
                (9, false, false),
                (10, false, false),
            ],
            "{again:?}"
        );
        d.expect_nothing().await;
        // All acknowledged: the position passes them.
        wait_position_where(&db, "devices", "mqtt:durable-2", |o| o == 11);
        d.disconnect().await;
    });
    // Killed while "durable" holds 3-6 and has 7-10 unsent.
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    let mut broker = broker.restart(&yaml);
    rt.block_on(async {
        let (mut c, present) = durable_connect(broker.addr(), "durable", 100).await;
        assert!(present);
        let resumed = seen(&take(&mut c, 8, true).await);
        assert_eq!(
            resumed
                .iter()
                .map(|v| (v.0.clone(), v.2))
                .collect::<Vec<_>>(),
            (3..=10).map(|i| (site(i), false)).collect::<Vec<_>>(),
            "every value not acknowledged before the kill, as a change"
        );
        c.expect_nothing().await;
        wait_position_where(&db, "devices", "mqtt:durable", |o| o == 11);
        c.disconnect().await;
    });
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let (mut c, present) = durable_connect(broker.addr(), "durable", 100).await;
        let (mut d, present_2) = durable_connect(broker.addr(), "durable-2", 100).await;
        assert!(present && present_2);
        c.expect_nothing().await;
        d.expect_nothing().await;
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        publisher.publish_acked(&site(1), b"v2", 1, false, 1).await;
        for consumer in [&mut c, &mut d] {
            let p = consumer.next_publish(true).await;
            assert_eq!(
                (p.topic.to_string(), p.payload.as_ref(), p.retain),
                (site(1), &b"v2"[..], false),
                "only the change after, not a value again"
            );
            consumer.expect_nothing().await;
        }
    });
}

/// A durable consumer's start is stored with its SUBSCRIBE, before the
/// SUBACK: killed before any flush of positions and before it acknowledged
/// a value, the broker resumes it from the first offset and it is sent
/// every value again, as changes, with the deletion since. A consumer
/// Retain Handling owes no values is stored at `next`.
#[test]
fn a_latest_consumer_killed_before_its_values_were_acknowledged_gets_them_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    // No flush of positions can come between the SUBACK and the kill.
    let yaml = format!(
        "{}  session:\n    ack_commit_interval: 1h\n",
        sqlite_yaml(dir.path(), DEVICES)
    );
    let broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let site = |i: u64| format!("devices/site-7/d{i}");
    let _held = rt.block_on(async {
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        for i in 1..=5u16 {
            publisher
                .publish_acked(&site(u64::from(i)), b"v1", 1, false, i)
                .await;
        }
        publisher
            .publish_acked(&site(6), b"gone", 1, false, 6)
            .await;
        publisher.publish_acked(&site(6), b"", 1, false, 7).await;
        // Room for 2: two values go out and are never acknowledged.
        let (mut c, _) = durable_connect(broker.addr(), "durable", 2).await;
        c.subscribe(1, "devices/site-7/#", 1).await;
        assert_eq!(
            sqlite_position(&db, "devices", "mqtt:durable"),
            Some(1),
            "the start stored before the SUBACK"
        );
        let out = seen(&take(&mut c, 2, false).await);
        assert!(out.iter().all(|v| v.2), "values, RETAIN set: {out:?}");
        let (mut quiet, _) = durable_connect(broker.addr(), "quiet", 10).await;
        subscribe_without_values(&mut quiet, "devices/site-7/#").await;
        assert_eq!(
            sqlite_position(&db, "devices", "mqtt:quiet"),
            Some(8),
            "owed no values: stored at next"
        );
        // Both kept connected until the broker dies.
        (c, quiet)
    });
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let (mut c, present) = durable_connect(broker.addr(), "durable", 100).await;
        assert!(present, "the session is kept in db");
        let resumed = take(&mut c, 6, true).await;
        let got: Vec<(String, Bytes, bool)> = resumed
            .iter()
            .map(|p| (p.topic.to_string(), p.payload.clone(), p.retain))
            .collect();
        let mut want: Vec<(String, Bytes, bool)> = (1..=5)
            .map(|i| (site(i), Bytes::from_static(b"v1"), false))
            .collect();
        want.push((site(6), Bytes::new(), false));
        assert_eq!(
            got, want,
            "every value again as a change, then the deletion since"
        );
        c.expect_nothing().await;
        let (mut quiet, present) = durable_connect(broker.addr(), "quiet", 10).await;
        assert!(present);
        quiet.expect_nothing().await;
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        publisher.publish_acked(&site(1), b"v2", 1, false, 1).await;
        for consumer in [&mut c, &mut quiet] {
            let p = consumer.next_publish(true).await;
            assert_eq!(
                (p.topic.to_string(), p.payload.as_ref()),
                (site(1), &b"v2"[..])
            );
        }
    });
}

// ---- queues ---------------------------------------------------------------

fn jobs(lease: &str, max_attempts: u32, backoff: &str) -> String {
    format!(
        "  - name: jobs\n    kind: queue\n    storage: db\n    lease: {lease}\n    max_attempts: {max_attempts}\n    backoff: {backoff}\n"
    )
}

/// What a worker saw: (worker, offset, payload), and whether it answered.
type Seen = (usize, u64, Bytes, bool);

#[test]
fn a_thousand_jobs_four_workers_each_resolved_once_and_an_expired_lease_counted() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_yaml(dir.path(), &jobs("1s", 5, "[100ms]"));
    let broker = Broker::start_in(dir, &yaml);
    let addr = broker.addr();
    const JOBS: usize = 1000;
    let seen: Vec<Seen> = runtime().block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Seen>();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for w in 0..4usize {
            let tx = tx.clone();
            let mut stop = stop.clone();
            let mut c = worker_connect(addr, &format!("worker-{w}"), 8).await;
            c.subscribe(1, "jobs/#", 1).await;
            tasks.push(tokio::spawn(async move {
                // Worker 0 keeps its first job and never answers it: its
                // lease runs out and another worker gets it.
                let mut stalled = w != 0;
                loop {
                    tokio::select! {
                        _ = stop.changed() => return,
                        packet = c.recv_within(WAIT) => {
                            let Ok(Some(Packet::Publish(p))) = packet else { return };
                            let offset: u64 = user_property(&p, "saguin-offset").unwrap().parse().unwrap();
                            let answer = stalled;
                            stalled = true;
                            if answer {
                                c.send(Packet::PubAck(PubAck::new(p.packet_id))).await;
                            }
                            let _ = tx.send((w, offset, p.payload.clone(), answer));
                        }
                    }
                }
            }));
        }
        let mut producer = Raw::tcp(addr, v5()).await;
        producer.connect("producer", ConnectOpts::clean()).await;
        for i in 0..JOBS {
            producer
                .publish(&format!("jobs/j{i}"), format!("{i:0>124}").as_bytes(), 1, false, (i % 60000 + 1) as u16)
                .await;
        }
        let mut acked = 0;
        while acked < JOBS {
            match producer.recv().await {
                Some(Packet::PubAck(a)) => {
                    assert_eq!(a.reason, ReasonCode::Success);
                    acked += 1;
                }
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
        let mut seen = Vec::new();
        let mut resolved: HashMap<Bytes, usize> = HashMap::new();
        while resolved.len() < JOBS {
            let s = tokio::time::timeout(WAIT, rx.recv())
                .await
                .expect("every job handed out within the wait")
                .expect("workers running");
            if s.3 {
                *resolved.entry(s.2.clone()).or_default() += 1;
            }
            seen.push(s);
        }
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = t.await;
        }
        seen
    });
    // Every job resolved exactly once; the one whose lease expired was
    // delivered twice, first to worker 0, and nothing else was.
    let mut by_offset: BTreeMap<u64, Vec<(usize, bool)>> = BTreeMap::new();
    for (w, offset, _, answered) in &seen {
        by_offset.entry(*offset).or_default().push((*w, *answered));
    }
    assert_eq!(by_offset.len(), JOBS);
    let twice: Vec<_> = by_offset.iter().filter(|(_, v)| v.len() > 1).collect();
    assert_eq!(
        twice.len(),
        1,
        "only the expired lease was delivered again: {twice:?}"
    );
    let (_, deliveries) = twice[0];
    assert_eq!(deliveries.len(), 2);
    assert_eq!(
        deliveries[0],
        (0, false),
        "first to the stalled worker, unanswered"
    );
    assert!(deliveries[1].1, "then resolved by another");
    for (offset, v) in &by_offset {
        assert_eq!(
            v.iter().filter(|(_, a)| *a).count(),
            1,
            "offset {offset} resolved once"
        );
    }
    let workers: std::collections::BTreeSet<usize> = seen.iter().map(|s| s.0).collect();
    assert_eq!(workers.len(), 4, "spread across the workers");
    wait_metric(&broker, "saguin_queue_depth{channel=\"jobs\"}", 0);
    let text = scrape(&broker);
    assert_eq!(
        metric(&text, "saguin_queue_lease_expired_total{channel=\"jobs\"}"),
        Some(1)
    );
    assert_eq!(
        metric(&text, "saguin_queue_attempts_total{channel=\"jobs\"}"),
        Some(JOBS as u64 + 1)
    );
    // The depth moves only once a resolution committed: after kill -9 not
    // one of them comes back, and the next job is the first offered.
    let mut broker = broker;
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    let broker = broker.restart(&yaml);
    assert_eq!(
        metric(&scrape(&broker), "saguin_queue_depth{channel=\"jobs\"}"),
        Some(0)
    );
    runtime().block_on(async {
        let mut c = worker_connect(broker.addr(), "worker-after", 8).await;
        c.subscribe(1, "jobs/#", 1).await;
        let mut producer = Raw::tcp(broker.addr(), v5()).await;
        producer.connect("producer", ConnectOpts::clean()).await;
        producer
            .publish_acked("jobs/after", b"after", 1, false, 1)
            .await;
        let p = c.next_publish(true).await;
        assert_eq!(
            (p.payload.as_ref(), user_property(&p, "saguin-offset")),
            (&b"after"[..], Some((JOBS + 1).to_string()))
        );
    });
}

/// The dead-letter consumer's next record, with its four headers checked.
async fn dead_lettered(
    c: &mut Raw<tokio::net::TcpStream>,
    attempts: &str,
    reason: &str,
) -> Publish {
    let p = c.next_publish(true).await;
    assert!(p.topic.starts_with("jobs.dlq/"), "{p:?}");
    assert_eq!(
        user_property(&p, "saguin-attempts").as_deref(),
        Some(attempts)
    );
    for header in ["saguin-first-delivered", "saguin-last-delivered"] {
        let at = user_property(&p, header).unwrap_or_default();
        assert!(humantime::parse_rfc3339(&at).is_ok(), "{header}: {at:?}");
    }
    let why = user_property(&p, "saguin-dlq-reason").unwrap_or_default();
    assert!(why.contains(reason), "saguin-dlq-reason {why:?}");
    p
}

#[test]
fn refused_jobs_are_dead_lettered_with_their_headers_and_attempts_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_yaml(dir.path(), &jobs("30s", 3, "[100ms]"));
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    // The worker stays connected until the broker is killed: its going
    // away would release the job first.
    let worker = rt.block_on(async {
        let mut producer = Raw::tcp(broker.addr(), v5()).await;
        producer.connect("producer", ConnectOpts::clean()).await;
        producer
            .publish_acked("jobs/a", b"job-a", 1, false, 1)
            .await;
        let mut w = worker_connect(broker.addr(), "w", 4).await;
        w.subscribe(1, "jobs/#", 1).await;
        // Two attempts refused with 0x80; the third delivered, then the
        // broker is killed before it is answered.
        for attempt in ["1", "2", "3"] {
            let p = w.next_publish(false).await;
            assert_eq!(p.payload, Bytes::from_static(b"job-a"));
            assert_eq!(
                user_property(&p, "saguin-attempts").as_deref(),
                Some(attempt)
            );
            if attempt != "3" {
                puback_with(&mut w, p.packet_id, ReasonCode::UnspecifiedError).await;
            }
        }
        w
    });
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    drop(worker);
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut dlq = Raw::tcp(broker.addr(), v5()).await;
        dlq.connect("dlq", ConnectOpts::clean()).await;
        dlq.send(Packet::Subscribe(codec::Subscribe {
            packet_id: 1,
            filters: vec![codec::SubscribeFilter {
                filter: "jobs.dlq/#".into(),
                options: SubscriptionOptions {
                    qos: qos(1),
                    ..Default::default()
                },
            }],
            properties: codec::SubscribeProperties {
                user_properties: vec![("saguin-from".into(), "earliest".into())],
                ..Default::default()
            },
        }))
        .await;
        match dlq.recv().await {
            Some(Packet::SubAck(_)) => {}
            other => panic!("expected SUBACK, got {other:?}"),
        }
        // Its attempts were spent before the restart: dead-lettered at
        // start, not delivered a fourth time.
        let p = dead_lettered(&mut dlq, "3", "restart").await;
        assert_eq!(p.payload, Bytes::from_static(b"job-a"));
        assert_eq!(user_property(&p, "saguin-offset").as_deref(), Some("1"));

        let mut producer = Raw::tcp(broker.addr(), v5()).await;
        producer.connect("producer", ConnectOpts::clean()).await;
        producer
            .publish_acked("jobs/b", b"job-b", 1, false, 1)
            .await;
        let mut w = worker_connect(broker.addr(), "w", 4).await;
        w.subscribe(1, "jobs/#", 1).await;
        for _ in 0..3 {
            let p = w.next_publish(false).await;
            assert_eq!(p.payload, Bytes::from_static(b"job-b"));
            puback_with(&mut w, p.packet_id, ReasonCode::UnspecifiedError).await;
        }
        let p = dead_lettered(&mut dlq, "3", "0x80").await;
        assert_eq!(p.payload, Bytes::from_static(b"job-b"));
        assert_eq!(
            user_property(&p, "saguin-offset").as_deref(),
            Some("2"),
            "no hole"
        );
        w.expect_nothing().await;
    });
    wait_metric(&broker, "saguin_queue_depth{channel=\"jobs\"}", 0);
    assert_eq!(
        metric(
            &scrape(&broker),
            "saguin_queue_dead_lettered_total{channel=\"jobs\"}"
        ),
        Some(1)
    );
}

#[test]
fn a_worker_going_away_counts_an_attempt_and_another_worker_gets_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_yaml(dir.path(), &jobs("30s", 5, "[100ms]"));
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut producer = Raw::tcp(broker.addr(), v5()).await;
        producer.connect("producer", ConnectOpts::clean()).await;
        let mut first = worker_connect(broker.addr(), "first", 4).await;
        first.subscribe(1, "jobs/#", 1).await;
        producer.publish_acked("jobs/x", b"job", 1, false, 1).await;
        let p = first.next_publish(false).await;
        assert_eq!(user_property(&p, "saguin-attempts").as_deref(), Some("1"));
        let mut second = worker_connect(broker.addr(), "second", 4).await;
        second.subscribe(1, "jobs/#", 1).await;
        second.expect_nothing().await;
        drop(first);
        let p = second.next_publish(true).await;
        assert_eq!(p.payload, Bytes::from_static(b"job"));
        assert_eq!(user_property(&p, "saguin-attempts").as_deref(), Some("2"));
    });
    wait_metric(&broker, "saguin_queue_depth{channel=\"jobs\"}", 0);
}

#[test]
fn a_worker_that_names_no_receive_maximum_holds_no_more_than_the_queue_lets_one() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_yaml(
        dir.path(),
        &format!("{}    max_held_per_worker: 3\n", jobs("30s", 5, "[1h]")),
    );
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut producer = Raw::tcp(broker.addr(), v5()).await;
        producer.connect("producer", ConnectOpts::clean()).await;
        for i in 1..=10u16 {
            producer
                .publish_acked(&format!("jobs/j{i}"), b"job", 1, false, i)
                .await;
        }
        // MQTT 5 without a Receive Maximum: the broker may send 65,535.
        let mut greedy = Raw::tcp(broker.addr(), v5()).await;
        greedy.connect("greedy", ConnectOpts::clean()).await;
        greedy.subscribe(1, "jobs/#", 1).await;
        let held = take(&mut greedy, 3, false).await;
        // The rest go to the next worker: the greedy one was leased no
        // more than its three.
        let mut other = worker_connect(broker.addr(), "other", 16).await;
        other.subscribe(1, "jobs/#", 1).await;
        let rest = take(&mut other, 7, true).await;
        let mut offsets: Vec<String> = held
            .iter()
            .chain(&rest)
            .map(|p| user_property(p, "saguin-offset").unwrap())
            .collect();
        offsets.sort();
        offsets.dedup();
        assert_eq!(offsets.len(), 10, "each job to one worker");
        greedy.expect_nothing().await;
        // An answer lets one more out: refused, it waits out the hour.
        puback_with(&mut greedy, held[0].packet_id, ReasonCode::UnspecifiedError).await;
        greedy.expect_nothing().await;
    });
    wait_metric(&broker, "saguin_queue_depth{channel=\"jobs\"}", 3);
}

#[test]
fn a_worker_subscribing_at_qos_0_is_refused_and_told_why_and_gets_no_job() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_yaml(dir.path(), &jobs("30s", 5, "[100ms]"));
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut producer = Raw::tcp(broker.addr(), v5()).await;
        producer.connect("producer", ConnectOpts::clean()).await;
        producer.publish_acked("jobs/x", b"job", 1, false, 1).await;
        // Granted QoS 0, a job would have to go at QoS 1 all the same (it
        // is leased until its PUBACK): refused instead, with the reason.
        let mut idle = worker_connect(broker.addr(), "at-most-once", 4).await;
        let ack = idle.suback_with_user_properties(1, "jobs/#", 0, &[]).await;
        assert_eq!(ack.reasons, [ReasonCode::ImplementationSpecificError]);
        let why = ack.properties.reason_string.unwrap_or_default();
        assert!(why.contains("jobs/#") && why.contains("QoS 1"), "{why}");
        idle.expect_nothing().await;
        // MQTT 3.1.1 has no reason string: its refusal is 0x80.
        let mut old = Raw::tcp(broker.addr(), v4()).await;
        old.connect("at-most-once-311", ConnectOpts::clean()).await;
        assert_eq!(
            old.subscribe(1, "jobs/#", 0).await,
            [ReasonCode::UnspecifiedError]
        );
        // At QoS 1 the same client is a worker and takes the job.
        let ack = idle.suback_with_user_properties(2, "jobs/#", 1, &[]).await;
        assert_eq!(ack.reasons, [ReasonCode::GrantedQoS1]);
        assert_eq!(ack.properties.reason_string, None);
        let p = idle.next_publish(true).await;
        assert_eq!(p.payload, Bytes::from_static(b"job"));
    });
    wait_metric(&broker, "saguin_queue_depth{channel=\"jobs\"}", 0);
}

#[test]
fn a_memory_queue_keeps_its_jobs_and_their_attempts_across_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // A backoff longer than the test: the refused job waits it out until
    // the restart forgets it (delivery state is volatile).
    let yaml = memory_yaml(dir.path(), &jobs("30s", 5, "[1h]"));
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    rt.block_on(async {
        let mut producer = Raw::tcp(broker.addr(), v5()).await;
        producer.connect("producer", ConnectOpts::clean()).await;
        producer
            .publish_acked("jobs/a", b"job-a", 1, false, 1)
            .await;
        producer
            .publish_acked("jobs/b", b"job-b", 1, false, 2)
            .await;
        let mut w = worker_connect(broker.addr(), "w", 1).await;
        w.subscribe(1, "jobs/#", 1).await;
        let p = w.next_publish(false).await;
        assert_eq!(p.payload, Bytes::from_static(b"job-a"));
        puback_with(&mut w, p.packet_id, ReasonCode::UnspecifiedError).await;
        let p = w.next_publish(true).await;
        assert_eq!(p.payload, Bytes::from_static(b"job-b"));
        w.expect_nothing().await;
    });
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut w = worker_connect(broker.addr(), "w", 4).await;
        w.subscribe(1, "jobs/#", 1).await;
        let p = w.next_publish(true).await;
        assert_eq!(p.payload, Bytes::from_static(b"job-a"));
        assert_eq!(
            user_property(&p, "saguin-attempts").as_deref(),
            Some("2"),
            "its attempt came back with it"
        );
        w.expect_nothing().await;
    });
    wait_metric(&broker, "saguin_queue_depth{channel=\"jobs\"}", 0);
}

// ---- latest: retention of deletions --------------------------------------

const CHURNING_DEVICES: &str =
    "  - name: devices\n    kind: latest\n    storage: db\n    retention_deletions: 2\n";

/// A durable consumer away while its channel's retention forgot deletions
/// it was owed resumes below the raised floor: its first delivery carries
/// `saguin-gap`, and it is sent every current value again from the first
/// offset - the one set long before the floor too - with the deletions the
/// floor kept, then the changes. The deletion it was not told of (`c`) is
/// what the resync leaves out: never a silent miss.
fn a_consumer_below_a_raised_floor_gets_every_value_again(yaml: impl Fn(&Path) -> String) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml(dir.path());
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        for (i, topic) in ["devices/a", "devices/b", "devices/c"].iter().enumerate() {
            publisher
                .publish_acked(topic, b"v1", 1, false, i as u16 + 1)
                .await;
        }
        let mut mirror = Raw::tcp(broker.addr(), v5()).await;
        mirror
            .connect("mirror", ConnectOpts::persistent(3600))
            .await;
        mirror.subscribe(1, "devices/#", 1).await;
        assert_eq!(take(&mut mirror, 3, true).await.len(), 3);
        mirror.expect_nothing().await;
        mirror.disconnect().await;
    });
    // Gone before anything changes: nothing is in flight to it.
    wait_metric(&broker, "saguin_connections ", 0);
    runtime().block_on(async {
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        // Away: c deleted (offset 4), four devices come and go (5..=12),
        // b replaced (13). Five markers; retention keeps the newest two.
        publisher.publish_acked("devices/c", b"", 1, false, 4).await;
        let mut id = 5;
        for i in 0..4 {
            let topic = format!("devices/tmp/{i}");
            publisher.publish_acked(&topic, b"on", 1, false, id).await;
            publisher.publish_acked(&topic, b"", 1, false, id + 1).await;
            id += 2;
        }
        publisher
            .publish_acked("devices/b", b"v2", 1, false, id)
            .await;
    });
    // The markers at 4, 6 and 8 are forgotten: the floor is 9, above the
    // value of a (offset 1), which stays current.
    wait_metric(&broker, "saguin_channel_floor{channel=\"devices\"}", 9);
    runtime().block_on(async {
        let (mut mirror, present) = durable_connect(broker.addr(), "mirror", 64).await;
        assert!(present);
        let resync = take(&mut mirror, 4, true).await;
        mirror.expect_nothing().await;
        assert_eq!(
            user_property(&resync[0], "saguin-gap").as_deref(),
            Some("4-8"),
            "the first delivery tells the gap: {:?}",
            resync[0]
        );
        assert!(resync[1..]
            .iter()
            .all(|p| user_property(p, "saguin-gap").is_none()));
        let got: Vec<(String, u64, String)> = resync
            .iter()
            .map(|p| {
                (
                    p.topic.to_string(),
                    user_property(p, "saguin-offset").unwrap().parse().unwrap(),
                    String::from_utf8_lossy(&p.payload).into_owned(),
                )
            })
            .collect();
        let want = [
            ("devices/a", 1, "v1"),
            ("devices/tmp/2", 10, ""),
            ("devices/tmp/3", 12, ""),
            ("devices/b", 13, "v2"),
        ]
        .map(|(t, o, p)| (t.to_owned(), o, p.to_owned()));
        assert_eq!(got, want);
        // Caught up again: a change comes as one.
        let mut publisher = Raw::tcp(broker.addr(), v5()).await;
        publisher.connect("publisher", ConnectOpts::clean()).await;
        publisher
            .publish_acked("devices/a", b"v2", 1, false, 1)
            .await;
        let p = mirror.next_publish(true).await;
        assert_eq!(
            (p.topic.as_ref(), p.payload.as_ref()),
            ("devices/a", &b"v2"[..])
        );
        assert_eq!(user_property(&p, "saguin-offset").as_deref(), Some("14"));
    });
    let text = scrape(&broker);
    assert_eq!(
        metric(&text, "saguin_consumer_gap_total{channel=\"devices\"}"),
        Some(1),
        "{text}"
    );
}

#[test]
fn a_consumer_below_a_raised_floor_gets_every_value_again_on_sqlite() {
    a_consumer_below_a_raised_floor_gets_every_value_again(|d| sqlite_yaml(d, CHURNING_DEVICES));
}

#[test]
fn a_consumer_below_a_raised_floor_gets_every_value_again_on_memory() {
    a_consumer_below_a_raised_floor_gets_every_value_again(|d| memory_yaml(d, CHURNING_DEVICES));
}
