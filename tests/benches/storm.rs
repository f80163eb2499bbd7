//! Reconnect storm: 10,000 persistent sessions (one subscription each)
//! reconnect at once to a broker keeping sessions on sqlite, while 10
//! publishers send 2,000 QoS 1 messages a second in total to one durable
//! subscriber (the reference storm, scaled to this machine).
//!
//! `cargo bench --bench storm` (release). Reports the storm's total time
//! (first CONNECT to last CONNACK), the worst CONNACK, the PUBACK median
//! and p99 during the storm, the longest a flush of acknowledgements
//! waited for its commit (`saguin_ack_store_wait_seconds_max`), whether the
//! subscriber got every message and what the broker dropped
//! (`saguin_dropped_messages_total`: a subscriber whose queue overflows
//! sheds). The publishers and the subscriber run on a thread and runtime
//! of their own, apart from the 10,000 reconnecting clients.
//! The run is made three times: with the persister's shared transactions,
//! with each session write in a transaction of its own
//! (`SAGUIN_SESSION_WRITES_ALONE`), to show what the grouping buys, and
//! with shared transactions and every session's client connecting with a
//! user name and password (a password file of one line a session, PBKDF2
//! at mosquitto_passwd's 101 iterations), as devices after a power cut
//! come back. Each row also reads the broker's threads and resident set at
//! the last CONNACK.
//! `SAGUIN_BENCH_SCALE` scales the session count.

mod bench_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench_support::{make_sessions_as, stop, Conn, Error, V};
use bytes::{Bytes, BytesMut};
use saguin::broker::codec::{
    self, Packet, PubAck, Publish, PublishProperties, QoS, Subscribe, SubscribeFilter,
    SubscribeProperties, SubscriptionOptions,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch, Notify};

const PUBLISHERS: usize = 10;
const RATE_PER_PUBLISHER: u64 = 200;

/// The password of every session's user in the run with passwords.
const PASSWORD: &str = "storm";

/// The broker's configuration, and the address of its metrics listener;
/// with a password file naming each of the `sessions` clients as a user
/// when `passwords` (the publishers and the subscriber stay anonymous).
fn config(dir: &Path, sessions: usize, passwords: bool) -> Result<(PathBuf, SocketAddr), Error> {
    let path = dir.join("saguin.yaml");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let password_file = if passwords {
        // One hash for every user: the check costs the same, the file
        // takes no time to make.
        let hash = saguin::broker::auth::hash_password(PASSWORD.as_bytes(), 101)?;
        let file = dir.join("passwords");
        let lines: String = (0..sessions)
            .map(|s| format!("session-{s}:{hash}\n"))
            .collect();
        std::fs::write(&file, lines)?;
        format!("  password_file: {}\n", file.display())
    } else {
        String::new()
    };
    std::fs::write(
        &path,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n{password_file}\
             limits:\n  max_connections: 20000\n  max_sessions: 1000000\nlog:\n  level: info\n\
             metrics:\n  bind: {metrics}\n\
             storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
             broker:\n  session_storage: db\n",
            dir.join("saguin.db").display()
        ),
    )?;
    Ok((path, metrics))
}

/// The durable subscriber: acknowledges everything, counts what arrives
/// on `received`, until `done` is notified.
async fn subscriber(
    addr: SocketAddr,
    received: watch::Sender<u64>,
    done: Arc<Notify>,
    subscribed: tokio::sync::oneshot::Sender<()>,
) -> Result<(), Error> {
    let mut subscribed = Some(subscribed);
    let (mut conn, _) = Conn::connect(addr, "storm-subscriber", false).await?;
    conn.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: "feed/#".into(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..SubscriptionOptions::default()
            },
        }],
        properties: SubscribeProperties::default(),
    }))
    .await?;
    loop {
        let packet = tokio::select! {
            _ = done.notified() => return Ok(()),
            packet = conn.next() => packet?,
        };
        match packet {
            Packet::Publish(p) => {
                received.send_modify(|n| *n += 1);
                conn.send(&Packet::PubAck(PubAck::new(p.packet_id))).await?;
            }
            Packet::SubAck(_) => {
                if let Some(subscribed) = subscribed.take() {
                    let _ = subscribed.send(());
                }
            }
            other => return Err(format!("subscriber got {other:?}").into()),
        }
    }
}

/// A paced publisher: returns (sent at, PUBACK latency) pairs.
async fn publisher(
    addr: SocketAddr,
    id: usize,
    stop: Arc<AtomicBool>,
    epoch: Instant,
    acknowledged_once: mpsc::Sender<()>,
) -> Result<Vec<(Duration, Duration)>, Error> {
    let (conn, _) = Conn::connect(addr, &format!("storm-pub-{id}"), true).await?;
    let (mut rd, mut wr) = conn.into_split();
    let sent_at: Arc<std::sync::Mutex<std::collections::HashMap<u16, Instant>>> =
        Default::default();
    let sent = sent_at.clone();
    let writer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_PUBLISHER));
        let mut packet_id: u16 = 0;
        let mut count = 0u64;
        while !stop.load(Ordering::Acquire) {
            tick.tick().await;
            packet_id = packet_id.wrapping_add(1).max(1);
            let mut buf = BytesMut::new();
            codec::encode(
                &Packet::Publish(Publish {
                    dup: false,
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    topic: format!("feed/{id}").into(),
                    packet_id,
                    properties: PublishProperties::default(),
                    payload: Bytes::from_static(b"reading"),
                }),
                V,
                &mut buf,
            )?;
            sent.lock().unwrap().insert(packet_id, Instant::now());
            wr.write_all(&buf).await?;
            count += 1;
        }
        Ok::<u64, Error>(count)
    });
    let mut latencies = Vec::new();
    loop {
        let packet = tokio::time::timeout(Duration::from_secs(30), rd.next()).await;
        match packet {
            Ok(Ok(Packet::PubAck(a))) => {
                let now = Instant::now();
                if let Some(at) = sent_at.lock().unwrap().remove(&a.packet_id) {
                    latencies.push((at - epoch, now - at));
                }
                if latencies.len() == 1 {
                    let _ = acknowledged_once.send(()).await;
                }
            }
            Ok(Ok(other)) => return Err(format!("publisher got {other:?}").into()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a PUBACK took over 30 s".into()),
        }
        if writer.is_finished() && sent_at.lock().unwrap().is_empty() {
            break;
        }
    }
    let count = writer.await??;
    if latencies.len() as u64 != count {
        return Err(format!("{} of {count} publishes acknowledged", latencies.len()).into());
    }
    Ok(latencies)
}

struct Storm {
    total: Duration,
    worst_connack: Duration,
    puback_p50: Duration,
    puback_p99: Duration,
    /// The longest a flush of acknowledgements waited for its commit.
    longest_ack_wait: Duration,
    /// Messages the broker dropped (`saguin_dropped_messages_total`).
    shed: u64,
    published: usize,
    received: u64,
    /// The broker's threads at the last CONNACK.
    threads: u64,
    /// The broker's resident set at the last CONNACK, bytes.
    rss: u64,
}

async fn storm(sessions: usize, alone: bool, passwords: bool) -> Result<Storm, Error> {
    let dir = tempfile::tempdir()?;
    let (path, metrics) = config(dir.path(), sessions, passwords)?;
    let password = passwords.then_some(PASSWORD);
    let broker = if alone {
        bench_support::start_with_env(&path, &[("SAGUIN_SESSION_WRITES_ALONE", "1")]).await?
    } else {
        bench_support::start_with_env(&path, &[]).await?
    };
    let addr = broker.addr;
    make_sessions_as(addr, sessions, password).await?;
    let (received, mut counted) = watch::channel(0u64);
    let done = Arc::new(Notify::new());
    let epoch = Instant::now();
    // The publishers run from before the storm (each has had a PUBACK) to
    // its last CONNACK, on a runtime and thread of their own with the
    // subscriber: queued behind the storm's 10,000 connecting tasks in
    // one runtime, a PUBACK would wait for the bench's own scheduler, not
    // the broker.
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let (ready_tx, mut ready) = mpsc::channel(PUBLISHERS);
    let (latencies_tx, latencies_rx) = tokio::sync::oneshot::channel();
    let feed = {
        let stop_publishing = stop_publishing.clone();
        let done = done.clone();
        std::thread::Builder::new()
            .name("storm-publishers".into())
            .spawn(move || -> Result<(), Error> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let (subscribed, is_subscribed) = tokio::sync::oneshot::channel();
                    let sub = tokio::spawn(subscriber(addr, received, done.clone(), subscribed));
                    // Nothing is published before the subscription is in
                    // place: the subscriber must get every message.
                    is_subscribed
                        .await
                        .map_err(|_| "the subscriber stopped before its SUBACK")?;
                    let pubs: Vec<_> = (0..PUBLISHERS)
                        .map(|p| {
                            tokio::spawn(publisher(
                                addr,
                                p,
                                stop_publishing.clone(),
                                epoch,
                                ready_tx.clone(),
                            ))
                        })
                        .collect();
                    drop(ready_tx);
                    let mut latencies = Vec::new();
                    for p in pubs {
                        match p.await? {
                            Ok(l) => latencies.extend(l),
                            Err(e) => {
                                let _ = latencies_tx.send(Err(format!("publisher: {e}")));
                                done.notify_one();
                                return Err("a publisher failed".into());
                            }
                        }
                    }
                    let _ = latencies_tx.send(Ok(latencies));
                    sub.await?.map_err(|e| format!("subscriber: {e}"))?;
                    Ok(())
                })
            })?
    };
    for _ in 0..PUBLISHERS {
        tokio::time::timeout(Duration::from_secs(30), ready.recv())
            .await?
            .ok_or("a publisher stopped before its first PUBACK")?;
    }
    let begun = Instant::now();
    let mut connects = Vec::with_capacity(sessions);
    for s in 0..sessions {
        connects.push(tokio::spawn(async move {
            let t = Instant::now();
            let (conn, present) = Conn::connect_as(addr, &format!("session-{s}"), false, password)
                .await
                .map_err(|e| format!("session-{s} connecting: {e}"))?;
            if !present {
                return Err::<_, Error>(format!("session-{s} lost its session").into());
            }
            Ok((t.elapsed(), Instant::now(), conn))
        }));
    }
    let mut worst = Duration::ZERO;
    let mut last = begun;
    let mut held = Vec::with_capacity(sessions);
    for c in connects {
        let (waited, at, conn) = c.await??;
        worst = worst.max(waited);
        last = last.max(at);
        held.push(conn);
    }
    let total = last - begun;
    let pid = broker.child.id().ok_or("the broker exited")?;
    let (threads, rss) = (bench_support::threads(pid)?, bench_support::rss(pid)?);
    stop_publishing.store(true, Ordering::Release);
    let latencies = latencies_rx
        .await
        .map_err(|_| "the publishers' thread stopped")??;
    let published = latencies.len();
    // Wait for the subscriber to have everything (bounded): short of it
    // after a minute, the report shows what it got.
    let _ = tokio::time::timeout(
        Duration::from_secs(60),
        counted.wait_for(|n| *n >= published as u64),
    )
    .await;
    let received = *counted.borrow();
    done.notify_one();
    tokio::task::spawn_blocking(move || feed.join())
        .await?
        .map_err(|_| "the publishers' thread panicked")??;
    drop(held);
    let mut during: Vec<Duration> = latencies
        .iter()
        .filter(|(at, _)| epoch + *at >= begun && epoch + *at <= last)
        .map(|(_, l)| *l)
        .collect();
    during.sort_unstable();
    let pick = |q: f64| {
        during
            .get(((during.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    let ack_wait = bench_support::scrape(metrics, "saguin_ack_store_wait_seconds_max")
        .await
        .ok_or("no saguin_ack_store_wait_seconds_max")?;
    let shed = bench_support::scrape(metrics, "saguin_dropped_messages_total")
        .await
        .ok_or("no saguin_dropped_messages_total")?;
    stop(broker).await?;
    Ok(Storm {
        longest_ack_wait: Duration::from_secs_f64(ack_wait),
        shed: shed as u64,
        total,
        worst_connack: worst,
        puback_p50: pick(0.5),
        puback_p99: pick(0.99),
        published,
        received,
        threads,
        rss,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("storm: run with `cargo bench --bench storm`");
        return;
    }
    let scale: f64 = std::env::var("SAGUIN_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let sessions = ((10_000.0 * scale) as usize).max(10);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "saguin reconnect storm: {sessions} persistent sessions, {PUBLISHERS} publishers at {} QoS 1 msg/s in total; load average {}",
        PUBLISHERS as u64 * RATE_PER_PUBLISHER,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    table.set_header([
        "session writes",
        "storm",
        "worst CONNACK",
        "PUBACK p50",
        "PUBACK p99",
        "longest ack wait",
        "received / published",
        "shed",
        "broker threads",
        "broker RSS",
    ]);
    let mut failed = false;
    for (name, alone, passwords) in [
        ("shared transactions", false, false),
        ("one transaction each", true, false),
        ("shared transactions, passwords", false, true),
    ] {
        match storm(sessions, alone, passwords).await {
            Ok(s) => {
                table.add_row([
                    name.to_string(),
                    format!("{:.2} s", s.total.as_secs_f64()),
                    format!("{:.2} s", s.worst_connack.as_secs_f64()),
                    format!("{:.2} ms", s.puback_p50.as_secs_f64() * 1000.0),
                    format!("{:.2} ms", s.puback_p99.as_secs_f64() * 1000.0),
                    format!("{:.2} ms", s.longest_ack_wait.as_secs_f64() * 1000.0),
                    format!("{} / {}", s.received, s.published),
                    s.shed.to_string(),
                    s.threads.to_string(),
                    format!("{:.1} MiB", s.rss as f64 / (1024.0 * 1024.0)),
                ]);
                if s.received < s.published as u64 || s.shed > 0 {
                    failed = true;
                }
            }
            Err(e) => {
                println!("FAIL {name}: {e}");
                failed = true;
            }
        }
    }
    println!("{table}");
    if failed {
        std::process::exit(1);
    }
}
