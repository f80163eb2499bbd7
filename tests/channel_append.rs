//! Append channels end to end, through the real `saguin serve`: offsets
//! from 1 in commit order, `saguin-offset` on every delivery, where a
//! consumer starts (`saguin-from`) and where it resumes, retention gaps, a
//! full channel, exactly once into a channel, `saguin sqlite dump` beside
//! the broker, and what survives kill -9 (sqlite) and SIGTERM (memory).
//!
//! Over 1,500 lines: every file under `tests/` is a binary of its own,
//! compiled and linked with the whole broker, so the append channel's end
//! to end tests stay one binary rather than several; the latest and queue
//! channels have theirs (`channel_latest_queue.rs`).
//!
//! The tests that draw random numbers print their seed (`seed N`); set
//! `SAGUIN_CHAOS_SEED=N` to replay one.

mod broker_support;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use broker_support::*;
use saguin::broker::codec::{ByteStr, Packet, PubAck, Publish, PublishProperties, QoS, ReasonCode};
use tokio::net::TcpStream;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const NEXT: &str = "saguin_channel_next{channel=\"telemetry\"}";
const RECORDS: &str = "saguin_channel_records{channel=\"telemetry\"}";
const FLOOR: &str = "saguin_channel_floor{channel=\"telemetry\"}";
const BYTES: &str = "saguin_channel_bytes{channel=\"telemetry\"}";
const GAPS: &str = "saguin_consumer_gap_total{channel=\"telemetry\"}";
const LAG: &str = "saguin_consumer_lag{channel=\"telemetry\"}";

/// One listener, anonymous clients and the metrics endpoint; `rest` holds
/// the storage, channels and broker sections.
fn config(rest: &str) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n{rest}"
    )
}

/// The append channel `telemetry` (with `channel_extra` keys) on the
/// sqlite provider `db` in `dir`, which keeps the sessions too.
fn sqlite_config(dir: &Path, channel_extra: &str) -> String {
    config(&format!(
        "storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: db\n{channel_extra}\
         broker:\n  session_storage: db\n",
        dir.join("saguin.db").display()
    ))
}

/// The append channel `telemetry` (with `channel_extra` keys) and the
/// sessions on the memory provider `mem`, snapshotted in `dir`.
fn memory_config(dir: &Path, channel_extra: &str) -> String {
    config(&format!(
        "storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: mem\n{channel_extra}\
         broker:\n  session_storage: mem\n",
        dir.join("snap").display()
    ))
}

/// xorshift64*, seeded from `SAGUIN_CHAOS_SEED` or the clock and printed,
/// so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = match std::env::var("SAGUIN_CHAOS_SEED") {
            Ok(s) => s
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("SAGUIN_CHAOS_SEED={s:?} is not a u64")),
            Err(_) => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64,
        };
        eprintln!("seed {seed}");
        // splitmix64 of the seed: any seed, 0 included, gives a live state.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// The value of the one user property `name` of a delivery.
fn user_property<'a>(p: &'a Publish, name: &str) -> Option<&'a str> {
    let mut found = p
        .properties
        .user_properties
        .iter()
        .filter(|(k, _)| k == name);
    let first = found.next().map(|(_, v)| v.as_str());
    assert!(
        found.next().is_none(),
        "{name} twice on {}: {:?}",
        &*p.topic,
        p.properties.user_properties
    );
    first
}

/// The record's offset, from the delivery's `saguin-offset`.
fn offset_of(p: &Publish) -> u64 {
    let value = user_property(p, "saguin-offset").unwrap_or_else(|| {
        panic!(
            "no saguin-offset on {}: {:?}",
            &*p.topic, p.properties.user_properties
        )
    });
    value
        .parse()
        .unwrap_or_else(|_| panic!("saguin-offset {value:?} is not a decimal offset"))
}

fn text(payload: &[u8]) -> String {
    String::from_utf8(payload.to_vec()).expect("payloads of these tests are text")
}

async fn client(broker: &Broker, id: &str, opts: ConnectOpts) -> Raw<TcpStream> {
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect(id, opts).await;
    assert_eq!(ack.reason, ReasonCode::Success, "{id} connects");
    c
}

/// A consumer of `telemetry/#` at `q`, starting where `from` says
/// (`None`: no `saguin-from`).
async fn consumer(broker: &Broker, id: &str, q: u8, from: Option<&str>) -> Raw<TcpStream> {
    let mut c = client(broker, id, ConnectOpts::clean()).await;
    subscribe_telemetry(&mut c, q, from).await;
    c
}

async fn subscribe_telemetry(c: &mut Raw<TcpStream>, q: u8, from: Option<&str>) {
    let properties: Vec<(&str, &str)> = from.map(|f| ("saguin-from", f)).into_iter().collect();
    let reasons = c
        .subscribe_with_user_properties(1, "telemetry/#", q, &properties)
        .await;
    assert_eq!(
        reasons,
        vec![ReasonCode::from_u8(q).unwrap()],
        "a consumer subscribing from {from:?}"
    );
}

/// DISCONNECT, then wait for the broker to close the connection: by then
/// it has handled everything the client sent before.
async fn leave(c: &mut Raw<TcpStream>) {
    c.send(Packet::Disconnect(saguin::broker::codec::Disconnect::new(
        ReasonCode::Success,
    )))
    .await;
    c.expect_close().await;
}

/// Scrapes the metrics until `ready` finds what is waited for in them.
/// The interval only paces the scrapes; the wait ends on the value seen,
/// bounded.
async fn wait_metrics<T>(broker: &Broker, what: &str, ready: impl Fn(&str) -> Option<T>) -> T {
    let bound = WAIT * 3;
    let deadline = tokio::time::Instant::now() + bound;
    let mut pace = tokio::time::interval(Duration::from_millis(20));
    loop {
        pace.tick().await;
        let text = metrics_text(broker);
        if let Some(value) = ready(&text) {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("no {what} within {bound:?}; the last metrics:\n{text}");
        }
    }
}

/// The channels the chaos publisher spreads its records over, one
/// provider's: its persister stores the publishes of all of them in
/// shared transactions.
const CHAOS_CHANNELS: [&str; 3] = ["telemetry", "east", "west"];

/// Where the chaos publisher sends sequence number `seq`.
fn chaos_topic(seq: u64) -> String {
    format!("{}/chaos", CHAOS_CHANNELS[(seq % 3) as usize])
}

/// Keeps 256 QoS 1 publishes in flight over [`CHAOS_CHANNELS`], payload =
/// the next sequence number, until the broker has PUBACKed `kill_after` of
/// them; then SIGKILLs it and reads what it had sent before dying. Every
/// PUBACKed sequence number goes into `acked`.
async fn publish_until_killed(
    broker: &Broker,
    kill_after: u64,
    seq: &mut u64,
    acked: &mut Vec<u64>,
) {
    const WINDOW: usize = 256;
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    let ack = p.connect("chaos-publisher", ConnectOpts::clean()).await;
    let window = ack.properties.receive_maximum.unwrap_or(u16::MAX);
    assert!(
        usize::from(window) >= WINDOW,
        "the broker allows {window} in flight"
    );
    let mut inflight: HashMap<u16, u64> = HashMap::new();
    let mut packet_id = 0u16;
    let mut answered = 0u64;
    let mut killed = false;
    loop {
        while !killed && inflight.len() < WINDOW {
            packet_id = packet_id % u16::MAX + 1;
            assert!(
                !inflight.contains_key(&packet_id),
                "packet id {packet_id} reused"
            );
            *seq += 1;
            p.publish(
                &chaos_topic(*seq),
                seq.to_string().as_bytes(),
                1,
                false,
                packet_id,
            )
            .await;
            inflight.insert(packet_id, *seq);
        }
        match p.recv_within(WAIT).await {
            Ok(Some(Packet::PubAck(a))) => {
                assert_eq!(a.reason, ReasonCode::Success, "PUBACK {a:?}");
                let sent = inflight.remove(&a.packet_id).unwrap_or_else(|| {
                    panic!("PUBACK for packet id {} not in flight", a.packet_id)
                });
                acked.push(sent);
                answered += 1;
                if answered == kill_after && !killed {
                    // SAFETY: a signal to the child this test started.
                    unsafe {
                        libc::kill(broker.child.id() as i32, libc::SIGKILL);
                    }
                    killed = true;
                }
            }
            Ok(Some(other)) => panic!("expected PUBACK, got {other:?}"),
            Ok(None) if killed => return,
            Ok(None) => panic!("the broker closed the publisher after {answered} PUBACKs"),
            Err(()) => panic!(
                "no PUBACK within {WAIT:?}; {} in flight, {answered} answered, killed: {killed}",
                inflight.len()
            ),
        }
    }
}

/// FireMQ's chaos test on sqlite channels: SIGKILL at a random moment
/// under 256 publishes in flight over three channels of one provider,
/// four times; every PUBACKed record is there afterwards, once, in its
/// channel, in offset order.
#[test]
fn kill_9_four_times_under_load_loses_no_acknowledged_record() {
    let mut rng = Rng::seeded();
    let dir = tempfile::tempdir().unwrap();
    let others: String = CHAOS_CHANNELS[1..]
        .iter()
        .map(|name| format!("  - name: {name}\n    kind: append\n    storage: db\n"))
        .collect();
    let yaml = format!(
        "{}limits:\n  receive_maximum: 256\n",
        sqlite_config(dir.path(), &others)
    );
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let mut seq = 0u64;
    let mut acked = Vec::new();
    for cycle in 1..=4 {
        let kill_after = rng.range(50, 2000);
        let before = acked.len();
        rt.block_on(publish_until_killed(
            &broker, kill_after, &mut seq, &mut acked,
        ));
        eprintln!(
            "cycle {cycle}: SIGKILL after {kill_after} PUBACKs; {} PUBACKed of {seq} sent so far",
            acked.len() - before
        );
        broker = broker.restart(&yaml);
    }
    rt.block_on(async {
        let mut p = client(&broker, "closer", ConnectOpts::clean()).await;
        for (i, channel) in CHAOS_CHANNELS.iter().enumerate() {
            let packet_id = u16::try_from(i + 1).unwrap();
            p.publish_acked(&format!("{channel}/end"), b"end", 1, false, packet_id)
                .await;
        }
        let mut stored = HashSet::new();
        for channel in CHAOS_CHANNELS {
            let mut c = client(&broker, &format!("auditor-{channel}"), ConnectOpts::clean()).await;
            let reasons = c
                .subscribe_with_user_properties(
                    1,
                    &format!("{channel}/#"),
                    1,
                    &[("saguin-from", "earliest")],
                )
                .await;
            assert_eq!(reasons, vec![ReasonCode::GrantedQoS1], "{channel}");
            let mut last = 0;
            loop {
                let m = match c.recv_within(WAIT).await {
                    Ok(Some(Packet::Publish(m))) => m,
                    Ok(Some(other)) => panic!("expected PUBLISH, got {other:?}"),
                    Ok(None) => panic!("the broker closed the auditor after {channel} {last}"),
                    Err(()) => panic!(
                        "the auditor stalled after {channel} {last} ({} records read) before the end marker",
                        stored.len()
                    ),
                };
                c.ack_publish(&m).await;
                let offset = offset_of(&m);
                assert!(
                    offset > last,
                    "{channel}: offset {offset} delivered after {last}: offsets must rise"
                );
                last = offset;
                if *m.topic == format!("{channel}/end") {
                    break;
                }
                let n: u64 = text(&m.payload).parse().expect("a sequence number");
                assert_eq!(*m.topic, chaos_topic(n), "record {n} in its channel");
                assert!(
                    stored.insert(n),
                    "record {n} stored twice (again at {channel} {offset})"
                );
            }
        }
        let missing: Vec<u64> = acked
            .iter()
            .copied()
            .filter(|n| !stored.contains(n))
            .collect();
        assert!(
            missing.is_empty(),
            "{} of {} PUBACKed records are missing, the first: {:?}",
            missing.len(),
            acked.len(),
            &missing[..missing.len().min(20)]
        );
        eprintln!(
            "{} PUBACKed, {} stored of {seq} sent over {} channels",
            acked.len(),
            stored.len(),
            CHAOS_CHANNELS.len()
        );
    });
}

/// Publishes QoS 1 into `telemetry/p{i}`, one at a time, until `stop` (or
/// 3000 records); the payloads PUBACKed.
async fn steady_publisher(
    addr: std::net::SocketAddr,
    i: usize,
    stop: Arc<AtomicBool>,
) -> Vec<String> {
    let mut p = Raw::tcp(addr, v5()).await;
    p.connect(&format!("publisher-{i}"), ConnectOpts::clean())
        .await;
    let topic = format!("telemetry/p{i}");
    let mut acked = Vec::new();
    let mut packet_id = 0u16;
    while !stop.load(Relaxed) && acked.len() < 3000 {
        packet_id = packet_id % u16::MAX + 1;
        let payload = format!("p{i}-{}", acked.len());
        publish_acked(&mut p, &topic, &payload, packet_id).await;
        acked.push(payload);
    }
    p.disconnect().await;
    acked
}

/// One QoS 1 publish of `payload` to `topic`, and its PUBACK, which must
/// be a success.
async fn publish_acked(p: &mut Raw<TcpStream>, topic: &str, payload: &str, packet_id: u16) {
    p.publish(topic, payload.as_bytes(), 1, false, packet_id)
        .await;
    match p.recv().await {
        Some(Packet::PubAck(a)) if a.packet_id == packet_id => {
            assert_eq!(a.reason, ReasonCode::Success, "{payload}: {a:?}")
        }
        other => panic!("{payload}: expected PUBACK {packet_id}, got {other:?}"),
    }
}

/// What a consumer was given: each offset's payload (the same every time
/// it comes) and the offsets it acknowledged.
#[derive(Default)]
struct Received {
    payloads: HashMap<u64, String>,
    acked: BTreeSet<u64>,
}

impl Received {
    fn delivered(&mut self, m: &Publish) -> u64 {
        let offset = offset_of(m);
        let payload = text(&m.payload);
        if let Some(before) = self.payloads.insert(offset, payload.clone()) {
            assert_eq!(
                before, payload,
                "offset {offset} delivered with two payloads"
            );
        }
        offset
    }

    fn missing(&self, below: u64) -> Vec<u64> {
        (1..below)
            .filter(|o| !self.acked.contains(o))
            .take(20)
            .collect()
    }
}

/// Seed 004: a durable consumer that keeps going away and coming back
/// while eight publishers commit concurrently resumes from its position
/// without ever skipping a record committed around its reconnect.
#[test]
fn a_resumed_consumer_never_skips_a_late_commit() {
    let mut rng = Rng::seeded();
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let durable = |clean_start: bool| {
            let mut opts = ConnectOpts::persistent(300);
            opts.clean_start = clean_start;
            // A small window, so records are in flight at each departure.
            opts.properties.receive_maximum = Some(16);
            opts
        };
        let mut c = client(&broker, "durable", durable(true)).await;
        subscribe_telemetry(&mut c, 1, Some("earliest")).await;
        let stop = Arc::new(AtomicBool::new(false));
        let publishers: Vec<_> = (0..8)
            .map(|i| tokio::spawn(steady_publisher(broker.addr(), i, stop.clone())))
            .collect();
        let mut got = Received::default();
        for round in 0..20 {
            let take = rng.range(1, 40);
            // Odd rounds drop the connection with the last delivery
            // unacknowledged; even rounds leave with DISCONNECT.
            let abrupt = round % 2 == 1;
            for i in 0..take {
                let m = c.next_publish(false).await;
                let offset = got.delivered(&m);
                if abrupt && i + 1 == take {
                    continue;
                }
                c.ack_publish(&m).await;
                got.acked.insert(offset);
            }
            if abrupt {
                drop(c);
            } else {
                leave(&mut c).await;
            }
            let mut next = Raw::tcp(broker.addr(), v5()).await;
            let ack = next.connect("durable", durable(false)).await;
            assert!(ack.session_present, "round {round}: the session is kept");
            c = next;
        }
        stop.store(true, Relaxed);
        let mut published = HashSet::new();
        for p in publishers {
            published.extend(p.await.expect("publisher"));
        }
        let next = published.len() as u64 + 1;
        assert_eq!(
            metric_sample(&metrics_text(&broker), NEXT),
            Some(next),
            "next is one past the PUBACKed records"
        );
        while (got.acked.len() as u64) < next - 1 {
            match c.recv_within(WAIT).await {
                Ok(Some(Packet::Publish(m))) => {
                    let offset = got.delivered(&m);
                    c.ack_publish(&m).await;
                    got.acked.insert(offset);
                }
                Ok(Some(other)) => panic!("expected PUBLISH, got {other:?}"),
                Ok(None) => panic!("the broker closed the consumer"),
                Err(()) => panic!(
                    "the consumer stalled with {} of {} records; the first missing: {:?}",
                    got.acked.len(),
                    next - 1,
                    got.missing(next)
                ),
            }
        }
        assert_eq!(
            got.acked.iter().copied().collect::<Vec<_>>(),
            (1..next).collect::<Vec<_>>(),
            "exactly the offsets [1, {next})"
        );
        let delivered: HashSet<String> = got.payloads.into_values().collect();
        assert_eq!(
            delivered, published,
            "the records are the PUBACKed publishes"
        );
        eprintln!("{} records through 20 reconnects", next - 1);
    });
}

/// Devices each consuming their own commands, killed with the broker
/// (kill -9) while their latest commands are unacknowledged and the
/// records they do not match lie between: each comes back to every
/// command it had not acknowledged, in order, none of another device's,
/// and then to what is published after the restart. More devices than
/// the broker hands a read together.
#[test]
fn devices_back_after_a_kill_9_are_sent_each_its_own_commands_in_order() {
    const DEVICES: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    let device = |d: usize| format!("dev-{d}");
    let command = |d: usize, n: usize| format!("dev-{d}-{n}");
    let rt = runtime();
    let publish_round = |broker: &Broker, round: usize| {
        rt.block_on(async {
            let mut p = client(broker, "publisher", ConnectOpts::clean()).await;
            let mut packet_id = 0u16;
            for k in 0..50 {
                packet_id += 1;
                let (topic, payload) = (format!("telemetry/away-{k}"), format!("away-{round}-{k}"));
                publish_acked(&mut p, &topic, &payload, packet_id).await;
            }
            for d in 0..DEVICES {
                packet_id += 1;
                let topic = format!("telemetry/{}", device(d));
                publish_acked(&mut p, &topic, &command(d, round), packet_id).await;
            }
            p.disconnect().await;
        })
    };
    let mut devices: Vec<Raw<TcpStream>> = rt.block_on(async {
        let mut devices = Vec::new();
        for d in 0..DEVICES {
            let mut c = client(&broker, &device(d), ConnectOpts::persistent(300)).await;
            let filter = format!("telemetry/{}", device(d));
            assert_eq!(
                c.subscribe_with_user_properties(1, &filter, 1, &[]).await,
                vec![ReasonCode::GrantedQoS1]
            );
            devices.push(c);
        }
        devices
    });
    for round in 0..3 {
        publish_round(&broker, round);
    }
    rt.block_on(async {
        for (d, c) in devices.iter_mut().enumerate() {
            for round in 0..3 {
                let m = c.next_publish(false).await;
                assert_eq!(text(&m.payload), command(d, round));
                // The first acknowledged; the rest are owed at the kill.
                if round == 0 {
                    c.ack_publish(&m).await;
                }
            }
        }
    });
    drop(devices);
    let broker = broker.restart(&yaml);
    let mut devices: Vec<Raw<TcpStream>> = rt.block_on(async {
        let mut devices = Vec::new();
        for d in 0..DEVICES {
            let mut opts = ConnectOpts::persistent(300);
            opts.clean_start = false;
            let mut c = Raw::tcp(broker.addr(), v5()).await;
            let ack = c.connect(&device(d), opts).await;
            assert!(ack.session_present, "{}: its session is kept", device(d));
            devices.push(c);
        }
        devices
    });
    publish_round(&broker, 3);
    rt.block_on(async {
        for (d, c) in devices.iter_mut().enumerate() {
            let mut got = Vec::new();
            let mut offsets = Vec::new();
            while got.last() != Some(&command(d, 3)) {
                let m = c.next_publish(true).await;
                offsets.push(offset_of(&m));
                got.push(text(&m.payload));
            }
            // The acknowledged command comes again only if the kill came
            // before its place was written: at least once, never lost.
            if got.first() == Some(&command(d, 0)) {
                got.remove(0);
            }
            assert_eq!(
                got,
                vec![command(d, 1), command(d, 2), command(d, 3)],
                "{}",
                device(d)
            );
            assert!(offsets.is_sorted(), "{}: in order: {offsets:?}", device(d));
        }
    });
}

/// A memory channel across SIGTERM: every record with its offset, `next`,
/// and a persistent consumer's position.
#[test]
fn a_memory_channel_keeps_records_next_and_positions_across_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_config(dir.path(), "");
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    rt.block_on(async {
        let mut keeper = client(&broker, "keeper", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut keeper, 1, None).await;
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=30u16 {
            p.publish_acked(
                &format!("telemetry/m{i}"),
                format!("r{i}").as_bytes(),
                1,
                false,
                i,
            )
            .await;
        }
        for i in 1..=12 {
            let m = keeper.next_publish(true).await;
            assert_eq!((offset_of(&m), text(&m.payload)), (i, format!("r{i}")));
        }
        // Offset 13 arrives and is never acknowledged.
        let m = keeper.next_publish(false).await;
        assert_eq!(offset_of(&m), 13);
        leave(&mut keeper).await;
        p.disconnect().await;
    });
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut reader = consumer(&broker, "reader", 1, Some("earliest")).await;
        for i in 1..=30u64 {
            let m = reader.next_publish(true).await;
            assert_eq!(
                (offset_of(&m), &*m.topic, text(&m.payload)),
                (i, format!("telemetry/m{i}").as_str(), format!("r{i}"))
            );
        }
        reader.expect_nothing().await;

        let mut keeper = Raw::tcp(broker.addr(), v5()).await;
        let ack = keeper
            .connect("keeper", ConnectOpts::persistent(3600))
            .await;
        assert!(ack.session_present, "the persistent session came back");
        for i in 13..=30 {
            let m = keeper.next_publish(true).await;
            assert_eq!(
                offset_of(&m),
                i,
                "resumed after the last acknowledged record"
            );
        }

        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        p.publish_acked("telemetry/after", b"after", 1, false, 1)
            .await;
        for c in [&mut reader, &mut keeper] {
            let m = c.next_publish(true).await;
            assert_eq!(
                (offset_of(&m), &*m.topic),
                (31, "telemetry/after"),
                "next came back"
            );
        }
    });
}

/// Retention removes records a persistent consumer has not read; when it
/// comes back, its first delivery says which (`saguin-gap`) and the gap is
/// counted.
#[test]
fn retention_behind_a_lagging_consumer_is_told_as_a_gap_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "    retention_bytes: 4KiB\n");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut laggard = client(&broker, "laggard", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut laggard, 1, None).await;
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=3u16 {
            p.publish_acked("telemetry/early", format!("{i}").as_bytes(), 1, false, i)
                .await;
        }
        for i in 1..=3 {
            assert_eq!(offset_of(&laggard.next_publish(true).await), i);
        }
        // Its position, 4, is stored as it goes.
        leave(&mut laggard).await;
        let gaps_before = metric_sample(&metrics_text(&broker), GAPS).unwrap_or(0);

        // 211 accounted bytes each: the last 397 are twenty times 4 KiB.
        let payload = vec![b'x'; 200];
        for i in 4..=400u16 {
            p.publish_acked("telemetry/bulk", &payload, 1, false, i)
                .await;
        }
        let floor = wait_metrics(&broker, "retention down to 4 KiB", |t| {
            let floor = metric_sample(t, FLOOR)?;
            let bytes = metric_sample(t, BYTES)?;
            (floor > 4 && bytes <= 4096).then_some(floor)
        })
        .await;
        assert!(
            floor < 400,
            "retention keeps what fits in 4 KiB (floor {floor})"
        );
        // Away at 4 with next at 401: the most any consumer is behind.
        wait_metrics(&broker, "the laggard's lag", |t| {
            metric_sample(t, LAG).filter(|&n| n == 397)
        })
        .await;

        let mut laggard = Raw::tcp(broker.addr(), v5()).await;
        let ack = laggard
            .connect("laggard", ConnectOpts::persistent(3600))
            .await;
        assert!(ack.session_present);
        let m = laggard.next_publish(true).await;
        assert_eq!(offset_of(&m), floor, "the first record retention kept");
        let expected_gap = format!("4-{}", floor - 1);
        assert_eq!(
            user_property(&m, "saguin-gap"),
            Some(expected_gap.as_str()),
            "the removed offsets it missed"
        );
        let m = laggard.next_publish(true).await;
        assert_eq!(offset_of(&m), floor + 1);
        assert_eq!(user_property(&m, "saguin-gap"), None, "one gap, told once");
        wait_metrics(&broker, "the gap counted", |t| {
            metric_sample(t, GAPS).filter(|&n| n > gaps_before)
        })
        .await;
        for offset in floor + 2..=400 {
            assert_eq!(offset_of(&laggard.next_publish(true).await), offset);
        }
        wait_metrics(&broker, "no lag once caught up", |t| {
            metric_sample(t, LAG).filter(|&n| n == 0)
        })
        .await;
    });
}

/// `saguin-from` with an RFC 3339 time, an offset, `earliest`, nothing
/// (`next`), and a value it cannot be.
#[test]
fn saguin_from_a_time_an_offset_earliest_or_nothing_and_a_bad_value_refused() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=3u16 {
            p.publish_acked(&format!("telemetry/a{i}"), b"before", 1, false, i)
                .await;
        }
        // The broker stamped those on receipt, before answering. `at` is a
        // whole millisecond more than one after the last answer, and the
        // next three are sent a millisecond after it: a margin either side
        // for the broker's clock, which counts from its start on the
        // monotonic clock.
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let at = UNIX_EPOCH + Duration::from_millis(since_epoch.as_millis() as u64 + 2);
        let deadline = std::time::Instant::now() + WAIT;
        while SystemTime::now() < at + Duration::from_millis(1) {
            assert!(
                std::time::Instant::now() < deadline,
                "the clock stands still"
            );
            p.round_trip().await;
        }
        for i in 4..=6u16 {
            p.publish_acked(&format!("telemetry/b{i}"), b"after", 1, false, i)
                .await;
        }
        // The same instant an hour east of UTC, as RFC 3339 writes it.
        let east = humantime::format_rfc3339_millis(at + Duration::from_secs(3600))
            .to_string()
            .replace('Z', "+01:00");
        let at = humantime::format_rfc3339_millis(at).to_string();

        for (id, from, first) in [
            ("by-time", Some(at.as_str()), 4),
            ("by-time-east", Some(east.as_str()), 4),
            ("by-offset", Some("2"), 2),
            ("from-earliest", Some("earliest"), 1),
        ] {
            let mut c = consumer(&broker, id, 1, from).await;
            for offset in first..=6 {
                let m = c.next_publish(true).await;
                assert_eq!(offset_of(&m), offset, "{id} from {from:?}");
            }
            c.expect_nothing().await;
        }

        let mut c = consumer(&broker, "from-next", 1, None).await;
        c.expect_nothing().await;
        p.publish_acked("telemetry/c7", b"later", 1, false, 7).await;
        assert_eq!(
            offset_of(&c.next_publish(true).await),
            7,
            "without saguin-from: next"
        );

        for (i, bad) in ["yesterday", "-1", "2026-13-45T99:00:00Z"]
            .iter()
            .enumerate()
        {
            let mut c = client(&broker, &format!("bad-from-{i}"), ConnectOpts::clean()).await;
            let ack = c
                .suback_with_user_properties(1, "telemetry/#", 1, &[("saguin-from", bad)])
                .await;
            assert_eq!(
                ack.reasons,
                [ReasonCode::ImplementationSpecificError],
                "saguin-from {bad:?} is refused"
            );
            // An MQTT 5 client is told why, naming the value.
            let why = ack.properties.reason_string.unwrap_or_default();
            assert!(
                why.contains("saguin-from") && why.contains(&format!("{bad:?}")),
                "{why}"
            );
        }
    });
}

/// A channel at its `max_bytes` refuses with 0x97 (MQTT 3.1.1: the
/// connection is closed); another channel beside it still commits.
#[test]
fn a_full_channel_refuses_with_0x97_and_its_neighbour_still_commits() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&format!(
        "storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: db\n    max_bytes: 4KiB\n\
         \x20 - name: events\n    kind: append\n    storage: db\n",
        dir.path().join("saguin.db").display()
    ));
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut p = client(&broker, "filler", ConnectOpts::clean()).await;
        // 11 bytes of topic and 1000 of payload: four fit in 4096 bytes.
        let payload = vec![b'f'; 1000];
        let mut reasons = Vec::new();
        for i in 1..=8u16 {
            p.publish("telemetry/f", &payload, 1, false, i).await;
            match p.recv().await {
                Some(Packet::PubAck(a)) if a.packet_id == i => reasons.push(a.reason),
                other => panic!("expected PUBACK {i}, got {other:?}"),
            }
        }
        let mut expected = vec![ReasonCode::Success; 4];
        expected.extend([ReasonCode::QuotaExceeded; 4]);
        assert_eq!(
            reasons, expected,
            "four records fit, the fifth would cross 4 KiB"
        );
        // Still connected: a full channel is no reason to cut a client.
        p.round_trip().await;
        p.publish("events/x", b"beside", 1, false, 9).await;
        match p.recv().await {
            Some(Packet::PubAck(a)) => {
                assert_eq!((a.packet_id, a.reason), (9, ReasonCode::Success))
            }
            other => panic!("expected PUBACK 9, got {other:?}"),
        }

        let mut old = Raw::tcp(broker.addr(), v4()).await;
        old.connect("old", ConnectOpts::clean()).await;
        old.publish("telemetry/f", &payload, 1, false, 1).await;
        let seen = old.expect_close().await;
        assert!(
            !seen.iter().any(|p| matches!(p, Packet::PubAck(_))),
            "MQTT 3.1.1 has no reason code: closed, no PUBACK; got {seen:?}"
        );

        let mut c = consumer(&broker, "reader", 1, Some("earliest")).await;
        for offset in 1..=4 {
            assert_eq!(offset_of(&c.next_publish(true).await), offset);
        }
        c.expect_nothing().await;
        let mut e = client(&broker, "events-reader", ConnectOpts::clean()).await;
        let reasons = e
            .subscribe_with_user_properties(1, "events/#", 1, &[("saguin-from", "earliest")])
            .await;
        assert_eq!(reasons, vec![ReasonCode::GrantedQoS1]);
        let m = e.next_publish(true).await;
        assert_eq!((offset_of(&m), &m.payload[..]), (1, &b"beside"[..]));
    });
}

/// QoS 2 into a channel: held until PUBREL, then one record at one
/// offset; a DUP resend before PUBREL makes no second one. Deliveries go
/// at the lower of the subscription's and the record's QoS.
#[test]
fn exactly_once_into_a_channel_makes_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut c2 = consumer(&broker, "at-qos-2", 2, None).await;
        let mut c1 = consumer(&broker, "at-qos-1", 1, None).await;
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        let publish = |dup: bool| {
            Packet::Publish(Publish {
                dup,
                qos: QoS::ExactlyOnce,
                retain: false,
                topic: ByteStr::from("telemetry/once"),
                packet_id: 7,
                properties: PublishProperties::default(),
                payload: bytes::Bytes::from_static(b"once"),
            })
        };
        for dup in [false, true] {
            p.send(publish(dup)).await;
            match p.recv().await {
                Some(Packet::PubRec(r)) => {
                    assert_eq!(
                        (r.packet_id, r.reason),
                        (7, ReasonCode::Success),
                        "dup {dup}"
                    )
                }
                other => panic!("expected PUBREC (dup {dup}), got {other:?}"),
            }
            // Held, with no offset yet: nothing is delivered.
            c2.expect_nothing().await;
        }
        p.send(Packet::PubRel(PubAck::new(7))).await;
        match p.recv().await {
            Some(Packet::PubComp(c)) => {
                assert_eq!((c.packet_id, c.reason), (7, ReasonCode::Success))
            }
            other => panic!("expected PUBCOMP, got {other:?}"),
        }
        let m = c2.next_publish(true).await;
        assert_eq!(
            (offset_of(&m), m.qos, &m.payload[..]),
            (1, QoS::ExactlyOnce, &b"once"[..])
        );
        let m = c1.next_publish(true).await;
        assert_eq!((offset_of(&m), m.qos), (1, QoS::AtLeastOnce));

        // A QoS 0 and a QoS 1 record after it: offsets 2 and 3, in either
        // order (MQTT orders a client's messages per QoS), at the lower QoS.
        p.publish("telemetry/zero", b"0", 0, false, 0).await;
        p.publish_acked("telemetry/one", b"1", 1, false, 8).await;
        for (c, name) in [(&mut c2, "at-qos-2"), (&mut c1, "at-qos-1")] {
            let mut got = Vec::new();
            for _ in 0..2 {
                let m = c.next_publish(true).await;
                got.push((offset_of(&m), m.topic.to_string(), m.qos));
            }
            got.sort();
            let one_at = if got[0].1 == "telemetry/one" { 0 } else { 1 };
            assert_eq!(
                (got[0].0, got[1].0),
                (2, 3),
                "{name}: no record was made by the DUP: {got:?}"
            );
            assert_eq!(got[one_at].2, QoS::AtLeastOnce, "{name}: {got:?}");
            assert_eq!(got[1 - one_at].2, QoS::AtMostOnce, "{name}: {got:?}");
            c.expect_nothing().await;
        }
    });
}

/// A delivery carries the publisher's user properties, in order, then
/// `saguin-offset`; an MQTT 3.1.1 consumer gets the plain message.
#[test]
fn deliveries_carry_the_publishers_properties_then_saguin_offset() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut v5c = consumer(&broker, "modern", 1, None).await;
        let mut v4c = Raw::tcp(broker.addr(), v4()).await;
        v4c.connect("classic", ConnectOpts::clean()).await;
        assert_eq!(
            v4c.subscribe(1, "telemetry/#", 1).await,
            vec![ReasonCode::GrantedQoS1]
        );
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        let properties = PublishProperties {
            user_properties: vec![
                ("unit".into(), "C".into()),
                ("site".into(), "north".into()),
                ("unit".into(), "K".into()),
            ],
            ..Default::default()
        };
        p.publish_props("telemetry/room1", b"21.5", 1, false, 1, properties)
            .await;
        assert!(
            matches!(p.recv().await, Some(Packet::PubAck(a)) if a.reason == ReasonCode::Success)
        );

        let m = v5c.next_publish(true).await;
        assert_eq!(
            (&*m.topic, &m.payload[..]),
            ("telemetry/room1", &b"21.5"[..])
        );
        let owned = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        assert_eq!(
            m.properties.user_properties,
            owned(&[
                ("unit", "C"),
                ("site", "north"),
                ("unit", "K"),
                ("saguin-offset", "1")
            ])
        );
        let m = v4c.next_publish(true).await;
        assert_eq!(
            (&*m.topic, &m.payload[..], m.qos),
            ("telemetry/room1", &b"21.5"[..], QoS::AtLeastOnce)
        );
    });
}

fn dump(db: &Path, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["sqlite", "dump"])
        .arg(db)
        .args(args)
        .output()
        .expect("run saguin sqlite dump");
    assert_eq!(
        out.status.code(),
        Some(0),
        "sqlite dump {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// `saguin sqlite dump` beside the running broker shows what it has just
/// PUBACKed, commits not yet checkpointed included.
#[test]
fn sqlite_dump_beside_the_broker_shows_the_records_just_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let yaml = sqlite_config(dir.path(), "");
    let mut broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=5u16 {
            p.publish_acked(
                &format!("telemetry/d{i}"),
                format!("dumped {i}").as_bytes(),
                1,
                false,
                i,
            )
            .await;
        }
    });
    let doc = dump(&db, &["--channel", "telemetry", "--json"]);
    let records = doc["records"].as_array().expect("records");
    let shown: Vec<(u64, String, String)> = records
        .iter()
        .map(|r| {
            (
                r["offset"].as_u64().unwrap(),
                r["topic"].as_str().unwrap().to_owned(),
                r["payload_text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(u64, String, String)> = (1..=5)
        .map(|i| (i, format!("telemetry/d{i}"), format!("dumped {i}")))
        .collect();
    assert_eq!(shown, expected);
    let doc = dump(&db, &["--json"]);
    let telemetry = doc["channels"]
        .as_array()
        .expect("channels")
        .iter()
        .find(|c| c["name"] == "telemetry")
        .expect("the telemetry channel");
    assert_eq!(
        (telemetry["next"].as_u64(), telemetry["records"].as_u64()),
        (Some(6), Some(5))
    );
    assert!(
        broker.child.try_wait().unwrap().is_none(),
        "the broker ran throughout"
    );
}

/// The stored position of `reader` in `telemetry`, as `saguin sqlite dump`
/// reads it beside the broker.
fn stored_position(db: &Path, reader: &str) -> Option<u64> {
    let doc = dump(db, &["--json"]);
    doc["positions"]
        .as_array()?
        .iter()
        .find(|p| p["channel"] == "telemetry" && p["reader"] == reader)
        .and_then(|p| p["offset"].as_u64())
}

/// A connected consumer's position is written every ack_commit_interval,
/// not only when it goes: after kill -9 it resumes at its first
/// unacknowledged record, no later.
#[test]
fn a_connected_consumers_position_is_stored_and_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    // Kept connected until the broker dies.
    let _steady = rt.block_on(async {
        let mut c = client(&broker, "steady", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut c, 1, None).await;
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=10u16 {
            p.publish_acked("telemetry/s", format!("s{i}").as_bytes(), 1, false, i)
                .await;
        }
        for i in 1..=10 {
            let m = c.next_publish(i <= 6).await;
            assert_eq!(offset_of(&m), i);
        }
        // Paced like the metrics: the wait ends on the stored value.
        let deadline = tokio::time::Instant::now() + WAIT * 3;
        let mut pace = tokio::time::interval(Duration::from_millis(50));
        loop {
            pace.tick().await;
            match stored_position(&db, "mqtt:steady") {
                Some(7) => break,
                Some(n) if n > 7 => panic!("position {n} passes the unacknowledged offset 7"),
                other => assert!(
                    tokio::time::Instant::now() < deadline,
                    "the connected consumer's position was not stored within {:?}: {other:?}",
                    WAIT * 3
                ),
            }
        }
        c
    });
    // Killed by the restart.
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        let ack = c.connect("steady", ConnectOpts::persistent(3600)).await;
        assert!(ack.session_present, "the session is kept in db");
        for i in 7..=10 {
            let m = c.next_publish(true).await;
            assert_eq!((offset_of(&m), text(&m.payload)), (i, format!("s{i}")));
        }
        c.expect_nothing().await;
    });
}

/// A durable consumer's start is stored before its SUBACK: killed long
/// before any flush of positions, the broker resumes it where it began,
/// and it is sent what was committed after it subscribed.
#[test]
fn a_new_consumers_start_is_stored_before_its_suback() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    // No flush of positions can come between the SUBACK and the kill.
    let yaml = format!(
        "{}  session:\n    ack_commit_interval: 1h\n",
        sqlite_config(dir.path(), "")
    );
    let broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let (_consumer, before) = rt.block_on(async {
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=3u16 {
            p.publish_acked("telemetry/s", format!("early{i}").as_bytes(), 1, false, i)
                .await;
        }
        let mut c = client(&broker, "fresh", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut c, 1, None).await;
        // The SUBACK came: the start is stored, at the channel's next.
        let stored = stored_position(&db, "mqtt:fresh");
        assert_eq!(stored, Some(4), "the start stored before the SUBACK");
        for i in 1..=5u16 {
            p.publish_acked(
                "telemetry/s",
                format!("late{i}").as_bytes(),
                1,
                false,
                10 + i,
            )
            .await;
        }
        for i in 4..=8 {
            let m = c.next_publish(true).await;
            assert_eq!(offset_of(&m), i);
        }
        // A start that takes a read is stored once the read found it.
        let mut e = client(&broker, "earliest", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut e, 1, Some("earliest")).await;
        for i in 1..=8 {
            let m = e.next_publish(false).await;
            assert_eq!(offset_of(&m), i);
        }
        wait_position_where(&db, "telemetry", "mqtt:earliest", |o| o == 1);
        // Both kept connected until the broker dies: nothing stores their
        // positions on a disconnect.
        ((c, e), stored)
    });
    assert_eq!(before, Some(4));
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut c = Raw::tcp(broker.addr(), v5()).await;
        let ack = c.connect("fresh", ConnectOpts::persistent(3600)).await;
        assert!(ack.session_present, "the session is kept in db");
        for i in 4..=8u64 {
            let m = c.next_publish(true).await;
            assert_eq!(
                (offset_of(&m), text(&m.payload)),
                (i, format!("late{}", i - 3)),
                "resumed at its stored start"
            );
        }
        c.expect_nothing().await;
        let mut e = Raw::tcp(broker.addr(), v5()).await;
        let ack = e.connect("earliest", ConnectOpts::persistent(3600)).await;
        assert!(ack.session_present, "the session is kept in db");
        for i in 1..=8u64 {
            let m = e.next_publish(true).await;
            assert_eq!(offset_of(&m), i, "resumed at its resolved start");
        }
        e.expect_nothing().await;
    });
}

/// A QoS 2 publish into a channel, PUBREC received, is held across kill -9:
/// the resent PUBLISH (DUP) and the PUBREL after the restart make it one
/// record.
#[test]
fn a_held_exactly_once_publish_into_a_channel_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let held = |dup: bool| {
        Packet::Publish(Publish {
            dup,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: ByteStr::from("telemetry/held"),
            packet_id: 42,
            properties: PublishProperties::default(),
            payload: bytes::Bytes::from_static(b"held"),
        })
    };
    let expect_pubrec = |answer: Option<Packet>| match answer {
        Some(Packet::PubRec(r)) => assert_eq!((r.packet_id, r.reason), (42, ReasonCode::Success)),
        other => panic!("expected PUBREC 42, got {other:?}"),
    };
    rt.block_on(async {
        let mut p = client(&broker, "holder", ConnectOpts::persistent(3600)).await;
        p.send(held(false)).await;
        // PUBREC follows the hold's commit.
        expect_pubrec(p.recv().await);
    });
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut p = Raw::tcp(broker.addr(), v5()).await;
        let ack = p.connect("holder", ConnectOpts::persistent(3600)).await;
        assert!(ack.session_present);
        p.send(held(true)).await;
        expect_pubrec(p.recv().await);
        p.send(Packet::PubRel(PubAck::new(42))).await;
        match p.recv().await {
            Some(Packet::PubComp(c)) => assert_eq!(
                (c.packet_id, c.reason),
                (42, ReasonCode::Success),
                "the hold came back"
            ),
            other => panic!("expected PUBCOMP, got {other:?}"),
        }
        let mut c = consumer(&broker, "reader", 2, Some("earliest")).await;
        let m = c.next_publish(true).await;
        assert_eq!(
            (offset_of(&m), &*m.topic, m.qos),
            (1, "telemetry/held", QoS::ExactlyOnce)
        );
        // Published once that exchange is over: offset 2 says the DUP made
        // no second record.
        p.publish_acked("telemetry/marker", b"marker", 1, false, 43)
            .await;
        let m = c.next_publish(true).await;
        assert_eq!(
            (offset_of(&m), &*m.topic),
            (2, "telemetry/marker"),
            "one record"
        );
    });
}

/// Invariant 9 on memory: a channel retention emptied keeps its `next` and
/// `floor` across SIGTERM, so no offset is issued twice.
#[test]
fn a_memory_channel_emptied_by_retention_keeps_next_and_floor_across_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // Every record (211 bytes) is over the bound: the sweep removes all.
    let yaml = memory_config(dir.path(), "    retention_bytes: 100\n");
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    rt.block_on(async {
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=5u16 {
            p.publish_acked("telemetry/gone", &[b'g'; 200], 1, false, i)
                .await;
        }
        wait_metrics(&broker, "an empty channel", |t| {
            let records = metric_sample(t, RECORDS)?;
            let floor = metric_sample(t, FLOOR)?;
            (records == 0 && floor == 6).then_some(())
        })
        .await;
    });
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let broker = broker.restart(&yaml);
    let text = metrics_text(&broker);
    assert_eq!(
        (metric_sample(&text, NEXT), metric_sample(&text, FLOOR)),
        (Some(6), Some(6)),
        "{text}"
    );
    rt.block_on(async {
        let mut c = consumer(&broker, "watcher", 1, None).await;
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        p.publish_acked("telemetry/new", b"new", 1, false, 1).await;
        let m = c.next_publish(true).await;
        assert_eq!((offset_of(&m), &*m.topic), (6, "telemetry/new"));
    });
}

/// Acknowledged out of order, a consumer's stored position stays at its
/// lowest unacknowledged record, and after kill -9 it resumes there.
#[test]
fn a_stored_position_never_passes_an_unacknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    let _connected = rt.block_on(async {
        let mut holding = client(&broker, "holding", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut holding, 1, None).await;
        let mut fence = client(&broker, "fence", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut fence, 1, None).await;
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=10u16 {
            p.publish_acked("telemetry/o", format!("o{i}").as_bytes(), 1, false, i)
                .await;
        }
        let mut first = None;
        for i in 1..=10 {
            let m = holding.next_publish(false).await;
            assert_eq!(offset_of(&m), i);
            if i == 1 {
                first = Some(m);
            } else {
                holding.ack_publish(&m).await;
            }
        }
        // Every acknowledgement above is handled once the ping is answered.
        holding.round_trip().await;
        for _ in 1..=10 {
            fence.next_publish(true).await;
        }
        // Positions are written together, in order: once the fence's
        // later one is stored, the holding consumer's is too.
        let deadline = tokio::time::Instant::now() + WAIT * 3;
        let mut pace = tokio::time::interval(Duration::from_millis(50));
        while stored_position(&db, "mqtt:fence") != Some(11) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fence's position was not stored within {:?}",
                WAIT * 3
            );
            pace.tick().await;
        }
        assert_eq!(
            stored_position(&db, "mqtt:holding"),
            Some(1),
            "offset 1 is not acknowledged: the position stays there"
        );
        (holding, fence, first)
    });
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut holding = Raw::tcp(broker.addr(), v5()).await;
        let ack = holding
            .connect("holding", ConnectOpts::persistent(3600))
            .await;
        assert!(ack.session_present);
        let m = holding.next_publish(true).await;
        assert_eq!((offset_of(&m), text(&m.payload)), (1, "o1".to_owned()));
        // The rest again (at least once), in order.
        for i in 2..=10 {
            assert_eq!(offset_of(&holding.next_publish(true).await), i);
        }
    });
}

/// A consumer is sent the records its filters match, once each at the
/// highest matching QoS, at their own offsets; the others pass it by.
#[test]
fn a_consumer_is_sent_what_its_filters_match() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut picky = client(&broker, "picky", ConnectOpts::persistent(3600)).await;
        assert_eq!(
            picky.subscribe(1, "telemetry/a/#", 1).await,
            vec![ReasonCode::GrantedQoS1]
        );
        let mut both = client(&broker, "both", ConnectOpts::clean()).await;
        assert_eq!(
            both.subscribe(1, "telemetry/a/#", 0).await,
            vec![ReasonCode::Success]
        );
        assert_eq!(
            both.subscribe(2, "telemetry/#", 1).await,
            vec![ReasonCode::GrantedQoS1]
        );
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for (i, topic) in ["a/1", "b/1", "a/2", "b/2"].iter().enumerate() {
            let packet_id = i as u16 + 1;
            p.publish_acked(&format!("telemetry/{topic}"), b"x", 1, false, packet_id)
                .await;
        }
        for (offset, topic) in [(1, "telemetry/a/1"), (3, "telemetry/a/2")] {
            let m = picky.next_publish(true).await;
            assert_eq!((offset_of(&m), &*m.topic), (offset, topic));
        }
        picky.expect_nothing().await;
        for offset in 1..=4 {
            let m = both.next_publish(true).await;
            assert_eq!(
                (offset_of(&m), m.qos),
                (offset, QoS::AtLeastOnce),
                "one copy, at the higher QoS"
            );
        }
        both.expect_nothing().await;
        leave(&mut picky).await;

        p.publish_acked("telemetry/b/3", b"x", 1, false, 5).await;
        p.publish_acked("telemetry/a/3", b"x", 1, false, 6).await;
        let mut picky = Raw::tcp(broker.addr(), v5()).await;
        let ack = picky.connect("picky", ConnectOpts::persistent(3600)).await;
        assert!(ack.session_present);
        let m = picky.next_publish(true).await;
        assert_eq!((offset_of(&m), &*m.topic), (6, "telemetry/a/3"));
        picky.expect_nothing().await;
    });
}

/// A consumer reading a backlog has at most its Receive Maximum of records
/// in flight, and one that stops acknowledging holds back neither the
/// publisher nor another consumer.
#[test]
fn a_consumer_is_sent_no_more_than_its_receive_maximum_and_holds_back_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=10u16 {
            p.publish_acked("telemetry/w", b"w", 1, false, i).await;
        }
        let mut opts = ConnectOpts::clean();
        opts.properties.receive_maximum = Some(3);
        let mut c = client(&broker, "narrow", opts).await;
        subscribe_telemetry(&mut c, 1, Some("earliest")).await;
        let mut held = Vec::new();
        for offset in 1..=3 {
            let m = c.next_publish(false).await;
            assert_eq!(offset_of(&m), offset);
            held.push(m);
        }
        c.expect_nothing().await;
        // `narrow` is stalled with its window full: the publisher is
        // answered and a consumer at the head is sent each record.
        let mut live = consumer(&broker, "live", 1, None).await;
        for i in 11..=20u16 {
            p.publish_acked("telemetry/w", b"w", 1, false, i).await;
            assert_eq!(offset_of(&live.next_publish(true).await), u64::from(i));
        }
        c.expect_nothing().await;
        c.ack_publish(&held.remove(0)).await;
        let m = c.next_publish(false).await;
        assert_eq!(offset_of(&m), 4, "one acknowledgement, one more record");
        held.push(m);
        c.expect_nothing().await;
        for m in held {
            c.ack_publish(&m).await;
        }
        for offset in 5..=20 {
            assert_eq!(offset_of(&c.next_publish(true).await), offset);
        }
        live.expect_nothing().await;
    });
}

/// An exactly-once publish into a full channel is refused at its PUBREC
/// (0x97), like a QoS 1 publish at its PUBACK: the hold is released into
/// the channel without a second look at the bound, so it is bounded when
/// it is taken.
#[test]
fn a_full_channel_refuses_exactly_once_publishes_at_pubrec() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "    max_bytes: 4KiB\n");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut p = client(&broker, "filler", ConnectOpts::clean()).await;
        // 11 bytes of topic and 1000 of payload: four fit in 4096 bytes.
        let payload = vec![b'f'; 1000];
        let mut reasons = Vec::new();
        for i in 1..=8u16 {
            p.publish("telemetry/f", &payload, 2, false, i).await;
            let reason = match p.recv().await {
                Some(Packet::PubRec(r)) if r.packet_id == i => r.reason,
                other => panic!("expected PUBREC {i}, got {other:?}"),
            };
            reasons.push(reason);
            if reason.as_u8() < 0x80 {
                p.send(Packet::PubRel(PubAck::new(i))).await;
                match p.recv().await {
                    Some(Packet::PubComp(c)) if c.packet_id == i => {
                        assert_eq!(c.reason, ReasonCode::Success)
                    }
                    other => panic!("expected PUBCOMP {i}, got {other:?}"),
                }
            }
        }
        let bytes = metric_sample(&metrics_text(&broker), BYTES);
        let mut expected = vec![ReasonCode::Success; 4];
        expected.extend([ReasonCode::QuotaExceeded; 4]);
        assert_eq!(
            reasons, expected,
            "four records fit, the fifth would cross 4 KiB (the channel holds {bytes:?} bytes)"
        );
        let mut c = consumer(&broker, "reader", 1, Some("earliest")).await;
        for offset in 1..=4 {
            assert_eq!(offset_of(&c.next_publish(true).await), offset);
        }
        c.expect_nothing().await;
    });
}

/// `saguin-from` past the channel's end is a client's choice, not a
/// storage failure: nothing is written that the store refuses (a position
/// never leads the channel), so no error is logged or counted for it.
#[test]
fn a_saguin_from_past_next_makes_no_failed_storage_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("saguin.db");
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=3u16 {
            p.publish_acked("telemetry/x", b"x", 1, false, i).await;
        }
        let mut ahead = client(&broker, "ahead", ConnectOpts::persistent(3600)).await;
        let reasons = ahead
            .subscribe_with_user_properties(1, "telemetry/#", 1, &[("saguin-from", "1000")])
            .await;
        assert_eq!(reasons.len(), 1);
        // Its position, if it has one, is written as it goes.
        leave(&mut ahead).await;
        // Positions of one provider are written in order: once a later
        // consumer's is stored, the one above was tried.
        let mut fence = client(&broker, "fence", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut fence, 1, Some("earliest")).await;
        for _ in 1..=3 {
            fence.next_publish(true).await;
        }
        leave(&mut fence).await;
        let deadline = tokio::time::Instant::now() + WAIT * 3;
        let mut pace = tokio::time::interval(Duration::from_millis(50));
        while stored_position(&db, "mqtt:fence") != Some(4) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fence's position was not stored within {:?}",
                WAIT * 3
            );
            pace.tick().await;
        }
    });
    // Every kind of failure, summed.
    let text = metrics_text(&broker);
    let errors: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("saguin_storage_errors_total{provider=\"db\","))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(!errors.is_empty(), "{text}");
    assert_eq!(errors.iter().sum::<u64>(), 0, "{}", broker.log_text());
    if let Some(position) = stored_position(&db, "mqtt:ahead") {
        assert!(position <= 4, "a stored position {position} leads next 4");
    }
}

/// `$share/g/telemetry/#` through the binary: each record goes to one
/// member with its `saguin-offset`; what a member held when its session
/// ended goes to the others; the group's one place in the channel is kept
/// across a stop while it has no member, and a new group starts where its
/// `saguin-from` says.
#[test]
fn a_shared_group_over_a_channel_hands_each_record_to_one_member_and_keeps_its_place() {
    const GROUP: &str = "$share/g/telemetry/#";
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path(), "");
    let mut broker = Broker::start_in(dir, &yaml);
    let rt = runtime();
    rt.block_on(async {
        let mut a = client(&broker, "member-a", ConnectOpts::clean()).await;
        let mut b = client(&broker, "member-b", ConnectOpts::clean()).await;
        for m in [&mut a, &mut b] {
            let reasons = m.subscribe_with_user_properties(1, GROUP, 1, &[]).await;
            assert_eq!(reasons, vec![ReasonCode::GrantedQoS1]);
        }
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 1..=10u16 {
            p.publish_acked(&format!("telemetry/s{i}"), b"s", 1, false, i)
                .await;
        }
        // `a` acknowledges nothing, `b` everything.
        let (mut held_by_a, mut got_by_b) = (Vec::new(), Vec::new());
        while held_by_a.len() + got_by_b.len() < 10 {
            tokio::select! {
                m = a.next_publish(false) => held_by_a.push(offset_of(&m)),
                // Acknowledged once chosen, so no acknowledgement is cut
                // short when the other branch wins.
                m = b.next_publish(false) => {
                    b.ack_publish(&m).await;
                    got_by_b.push(offset_of(&m));
                }
            }
        }
        let mut all: Vec<u64> = held_by_a.iter().chain(&got_by_b).copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (1..=10).collect::<Vec<u64>>(),
            "each record to one member: a {held_by_a:?}, b {got_by_b:?}"
        );
        assert!(
            !held_by_a.is_empty() && !got_by_b.is_empty(),
            "records go to both members in turn: a {held_by_a:?}, b {got_by_b:?}"
        );

        // `a`'s connection drops; its session ends and what it held is
        // handed to `b`.
        drop(a);
        let mut returned = BTreeSet::new();
        while !held_by_a.iter().all(|o| returned.contains(o)) {
            returned.insert(offset_of(&b.next_publish(true).await));
        }
        // A record after what was handed out again: once `b` has it, it
        // has had (and acknowledged) all before it, so it leaves holding
        // nothing and the group's place is past it.
        p.publish_acked("telemetry/s11", b"s", 1, false, 11).await;
        while offset_of(&b.next_publish(true).await) != 11 {}
        leave(&mut b).await;

        // Written while the group has no member: kept for it.
        for i in 12..=15u16 {
            p.publish_acked(&format!("telemetry/s{i}"), b"s", 1, false, i)
                .await;
        }
        p.disconnect().await;
    });
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    let broker = broker.restart(&yaml);
    rt.block_on(async {
        let mut c = client(&broker, "member-c", ConnectOpts::clean()).await;
        let reasons = c.subscribe_with_user_properties(1, GROUP, 1, &[]).await;
        assert_eq!(reasons, vec![ReasonCode::GrantedQoS1]);
        for offset in 12..=15 {
            assert_eq!(
                offset_of(&c.next_publish(true).await),
                offset,
                "the group resumes at its stored place"
            );
        }
        c.expect_nothing().await;

        let mut h = client(&broker, "member-h", ConnectOpts::clean()).await;
        let reasons = h
            .subscribe_with_user_properties(
                1,
                "$share/h/telemetry/#",
                1,
                &[("saguin-from", "earliest")],
            )
            .await;
        assert_eq!(reasons, vec![ReasonCode::GrantedQoS1]);
        for offset in 1..=15 {
            assert_eq!(offset_of(&h.next_publish(true).await), offset);
        }
        h.expect_nothing().await;
    });
}

/// Seek by time over a receipt clock that stepped back: records 1 and 2
/// were stamped by a broker whose clock ran three hours fast (record 2),
/// then corrected; this broker stamps 3 to 6 with the true time. A
/// consumer from one hour ahead starts at the first offset at or after
/// it, 2, though every later record is older: the seek looks at every
/// record, not where a search over sorted times would land (past 6).
#[test]
fn a_seek_by_time_finds_the_first_record_at_or_after_it_over_a_clock_step_back() {
    use saguin::storage::contract::Provider as _;
    use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
    use saguin_format::model::Record;
    const HOUR: i64 = 3_600_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let now = saguin::storage::contract::now_nanos();
    {
        let provider = SqliteProvider::open(SqliteOptions::new("db", dir.path().join("saguin.db")))
            .expect("open sqlite");
        let store = append_store(&provider, "telemetry");
        for (payload, timestamp) in [("an hour ago", now - HOUR), ("clock ahead", now + 3 * HOUR)] {
            store
                .append(Record {
                    timestamp,
                    qos: 1,
                    client_id: "before".into(),
                    ..Record::new("telemetry/old".to_owned(), payload.to_owned())
                })
                .expect("append");
        }
        provider.close().expect("close");
    }
    let rfc3339 = |nanos: i64| {
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_nanos(nanos as u64))
            .to_string()
    };
    let db = dir.path().join("saguin.db");
    let yaml = sqlite_config(dir.path(), "");
    let broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut p = client(&broker, "publisher", ConnectOpts::clean()).await;
        for i in 3..=6u16 {
            p.publish_acked("telemetry/new", b"now", 1, false, i).await;
        }
        let ahead = rfc3339(now + HOUR);
        let mut c = consumer(&broker, "from-ahead", 1, Some(&ahead)).await;
        for offset in 2..=6 {
            assert_eq!(
                offset_of(&c.next_publish(true).await),
                offset,
                "from {ahead}"
            );
        }
        c.expect_nothing().await;

        // Nothing at or after four hours ahead: the consumer starts at
        // `next`. Its session outlives the connection, so the start the
        // read found is stored: once it is, the consumer is in place and
        // the next publish is after it.
        let past_all = rfc3339(now + 4 * HOUR);
        let mut c = client(&broker, "from-past-all", ConnectOpts::persistent(3600)).await;
        subscribe_telemetry(&mut c, 1, Some(&past_all)).await;
        wait_position_where(&db, "telemetry", "mqtt:from-past-all", |o| o == 7);
        c.expect_nothing().await;
        p.publish_acked("telemetry/new", b"later", 1, false, 7)
            .await;
        assert_eq!(offset_of(&c.next_publish(true).await), 7, "from {past_all}");
    });
}
