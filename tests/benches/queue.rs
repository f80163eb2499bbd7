//! Queue and latest channels through the real broker.
//!
//! `cargo bench --bench queue` (release). Three tables, memory and sqlite
//! side by side in one run:
//!
//! 1. Queue throughput: 128-byte jobs published at QoS 1 by 4 producers
//!    (64 unacknowledged each) into a queue worked by 1, 4 and 16 workers
//!    that acknowledge each job as it arrives. Jobs resolved per second,
//!    from the first publish until the queue's depth (`saguin_queue_depth`)
//!    is 0 again, so every resolution has committed; and the latency from
//!    a job's publish to its worker's PUBACK, p50 and p99.
//! 2. Latest: 100,000 topics held (`devices/site-N/dM`, 1,000 sites of 100
//!    devices), then a subscriber to `devices/site-7/#` (100 matching):
//!    the time from its SUBSCRIBE to the 100th current value, over 5
//!    subscribers, and the median time to its SUBACK; then a durable
//!    consumer of one site resuming after its 100 topics changed: from its
//!    CONNECT to the 100th change, the median of three.
//! 3. The store alone, no broker and no client: the jobs of each offer
//!    leased in one transaction, then resolved each in a transaction of
//!    its own, or all of them in one (as a persister resolves those that
//!    queued up together) - the ceilings the first table is measured
//!    against.
//!
//! `SAGUIN_BENCH_SCALE` scales the job and topic counts; `queue`,
//! `latest` or `store` after `--bench` runs only those tables.

mod bench_support;

use std::io::{Read, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bench_support::{start, stop, Conn, Error};
use bytes::Bytes;
use saguin::broker::codec::{
    ByteStr, Packet, PubAck, Publish, PublishProperties, QoS, Subscribe, SubscribeFilter,
    SubscribeProperties, SubscriptionOptions,
};
use tokio::io::AsyncWriteExt;

const PRODUCERS: usize = 4;
const PRODUCER_WINDOW: usize = 64;
const JOB_BYTES: usize = 128;

#[derive(Clone, Copy)]
enum Kind {
    Memory,
    Sqlite,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Sqlite => "sqlite",
        }
    }
}

fn config(dir: &Path, kind: Kind, channel: &str) -> Result<(PathBuf, SocketAddr), Error> {
    let path = dir.join("saguin.yaml");
    let storage = match kind {
        Kind::Memory => "    kind: memory\n".to_owned(),
        Kind::Sqlite => format!(
            "    kind: sqlite\n    file_path: {}\n",
            dir.join("saguin.db").display()
        ),
    };
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?;
    let metrics_addr = metrics.local_addr()?;
    drop(metrics);
    std::fs::write(
        &path,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
             log:\n  level: info\nmetrics:\n  bind: {metrics_addr}\n\
             storage:\n  - name: db\n{storage}channels:\n{channel}"
        ),
    )?;
    Ok((path, metrics_addr))
}

fn scrape_depth(metrics: SocketAddr) -> Option<u64> {
    let mut s = std::net::TcpStream::connect(metrics).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .find(|l| l.starts_with("saguin_queue_depth{channel=\"jobs\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn publish(topic: &str, payload: Bytes, packet_id: u16) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: ByteStr::from(topic),
        packet_id,
        properties: PublishProperties::default(),
        payload,
    })
}

fn subscribe(filter: &str, qos: QoS) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: filter.into(),
            options: SubscriptionOptions {
                qos,
                ..Default::default()
            },
        }],
        properties: SubscribeProperties::default(),
    })
}

/// Publishes `topics(i)` for `i` in `range` at QoS 1, `PRODUCER_WINDOW`
/// unacknowledged at a time, each payload starting with its send time
/// (nanoseconds since `epoch`).
async fn produce(
    addr: SocketAddr,
    id: String,
    range: std::ops::Range<usize>,
    topic: fn(usize) -> String,
    epoch: Instant,
) -> Result<(), Error> {
    let (conn, _) = Conn::connect(addr, &id, true).await?;
    let (mut rd, mut wr) = conn.into_split();
    let total = range.len();
    let mut sent = 0;
    let mut acked = 0;
    let mut next = range.start;
    let mut buf = bytes::BytesMut::new();
    while acked < total {
        while sent - acked < PRODUCER_WINDOW && next < range.end {
            let mut payload = vec![b'j'; JOB_BYTES];
            let at = epoch.elapsed().as_nanos() as u64;
            payload[..8].copy_from_slice(&at.to_be_bytes());
            let packet_id = (sent % 60_000 + 1) as u16;
            buf.clear();
            saguin::broker::codec::encode(
                &publish(&topic(next), Bytes::from(payload), packet_id),
                bench_support::V,
                &mut buf,
            )?;
            wr.write_all(&buf).await?;
            sent += 1;
            next += 1;
        }
        match rd.next().await? {
            Packet::PubAck(_) => acked += 1,
            other => return Err(format!("{id}: unexpected {other:?}").into()),
        }
    }
    Ok(())
}

/// A worker: acknowledges every job as it arrives, recording the latency
/// from its publish, until `stop`.
async fn work(
    addr: SocketAddr,
    id: String,
    epoch: Instant,
    mut stop: tokio::sync::watch::Receiver<bool>,
    ready: tokio::sync::mpsc::Sender<()>,
) -> Result<Vec<u64>, Error> {
    let (mut conn, _) = Conn::connect(addr, &id, true).await?;
    conn.send(&subscribe("jobs/#", QoS::AtLeastOnce)).await?;
    match conn.next().await? {
        Packet::SubAck(_) => {}
        other => return Err(format!("{id}: unexpected {other:?}").into()),
    }
    let _ = ready.send(()).await;
    let (mut rd, mut wr) = conn.into_split();
    let mut latencies = Vec::new();
    let mut buf = bytes::BytesMut::new();
    loop {
        let packet = tokio::select! {
            _ = stop.changed() => return Ok(latencies),
            p = rd.next() => p?,
        };
        if let Packet::Publish(p) = packet {
            let mut at = [0u8; 8];
            at.copy_from_slice(&p.payload[..8]);
            let sent = u64::from_be_bytes(at);
            latencies.push((epoch.elapsed().as_nanos() as u64).saturating_sub(sent));
            buf.clear();
            saguin::broker::codec::encode(
                &Packet::PubAck(PubAck::new(p.packet_id)),
                bench_support::V,
                &mut buf,
            )?;
            wr.write_all(&buf).await?;
        }
    }
}

struct QueueRow {
    jobs_per_second: f64,
    p50: Duration,
    p99: Duration,
}

async fn queue_run(kind: Kind, workers: usize, jobs: usize) -> Result<QueueRow, Error> {
    let dir = tempfile::tempdir()?;
    let (path, metrics) = config(
        dir.path(),
        kind,
        "  - name: jobs\n    kind: queue\n    storage: db\n    lease: 30s\n",
    )?;
    let broker = start(&path).await?;
    let addr = broker.addr;
    let epoch = Instant::now();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(workers);
    let mut handles = Vec::new();
    for w in 0..workers {
        handles.push(tokio::spawn(work(
            addr,
            format!("worker-{w}"),
            epoch,
            stop_rx.clone(),
            ready_tx.clone(),
        )));
    }
    for _ in 0..workers {
        ready_rx
            .recv()
            .await
            .ok_or("a worker failed to subscribe")?;
    }
    let began = Instant::now();
    let per = jobs / PRODUCERS;
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        producers.push(tokio::spawn(produce(
            addr,
            format!("producer-{p}"),
            p * per..(p + 1) * per,
            |i| format!("jobs/j{i}"),
            epoch,
        )));
    }
    for p in producers {
        p.await??;
    }
    // Resolved: every resolution committed, the depth back at 0.
    let deadline = Instant::now() + Duration::from_secs(300);
    // The scrapes are paced; the loop ends on the depth seen.
    let mut pace = tokio::time::interval(Duration::from_millis(2));
    while scrape_depth(metrics) != Some(0) {
        if Instant::now() > deadline {
            return Err("the queue never drained".into());
        }
        pace.tick().await;
    }
    let elapsed = began.elapsed();
    let _ = stop_tx.send(true);
    let mut latencies = Vec::new();
    for h in handles {
        latencies.extend(h.await??);
    }
    stop(broker).await?;
    if latencies.len() < per * PRODUCERS {
        return Err(format!("{} of {} jobs delivered", latencies.len(), per * PRODUCERS).into());
    }
    latencies.sort_unstable();
    let at = |q: f64| Duration::from_nanos(latencies[((latencies.len() - 1) as f64 * q) as usize]);
    Ok(QueueRow {
        jobs_per_second: (per * PRODUCERS) as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    })
}

/// What the five subscribers of the latest table took: to the 100th
/// value (fastest, median, slowest), and the median to the SUBACK; and
/// the median of three resumes of a durable consumer, from its CONNECT to
/// the 100th change.
struct LatestRow {
    values: (Duration, Duration, Duration),
    suback: Duration,
    resume: Duration,
}

/// Reads PUBLISHes until `n` have come.
async fn publishes(conn: &mut Conn, n: usize) -> Result<(), Error> {
    let mut seen = 0;
    while seen < n {
        if let Packet::Publish(_) = conn.next().await? {
            seen += 1;
        }
    }
    Ok(())
}

/// Fills a latest channel with `sites` x 100 topics, then times 5
/// subscribers to one site's 100 values.
async fn latest_run(kind: Kind, sites: usize) -> Result<LatestRow, Error> {
    let dir = tempfile::tempdir()?;
    let (path, _) = config(
        dir.path(),
        kind,
        "  - name: devices\n    kind: latest\n    storage: db\n",
    )?;
    let broker = start(&path).await?;
    let addr = broker.addr;
    let topics = sites * 100;
    let per = topics / PRODUCERS;
    let epoch = Instant::now();
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        producers.push(tokio::spawn(produce(
            addr,
            format!("producer-{p}"),
            p * per..(p + 1) * per,
            |i| format!("devices/site-{}/d{}", i / 100, i % 100),
            epoch,
        )));
    }
    for p in producers {
        p.await??;
    }
    let mut times = Vec::new();
    let mut subacks = Vec::new();
    for s in 0..5 {
        let (mut conn, _) = Conn::connect(addr, &format!("viewer-{s}"), true).await?;
        let asked = Instant::now();
        conn.send(&subscribe("devices/site-7/#", QoS::AtMostOnce))
            .await?;
        let mut values = 0;
        while values < 100 {
            match conn.next().await? {
                Packet::Publish(_) => values += 1,
                Packet::SubAck(_) => subacks.push(asked.elapsed()),
                _ => {}
            }
        }
        times.push(asked.elapsed());
    }
    // A durable consumer of one site away while its 100 topics change,
    // three times: it reads what changed since its place, not the channel.
    let (mut conn, _) = Conn::connect(addr, "resumer", false).await?;
    conn.send(&subscribe("devices/site-3/#", QoS::AtMostOnce))
        .await?;
    publishes(&mut conn, 100).await?;
    let mut resumes = Vec::new();
    for round in 0..3 {
        conn.send(&Packet::Disconnect(saguin::broker::codec::Disconnect::new(
            saguin::broker::codec::ReasonCode::Success,
        )))
        .await?;
        drop(conn);
        let mut changes = Vec::new();
        for p in 0..PRODUCERS {
            let per = 100 / PRODUCERS;
            changes.push(tokio::spawn(produce(
                addr,
                format!("changer-{round}-{p}"),
                300 + p * per..300 + (p + 1) * per,
                |i| format!("devices/site-{}/d{}", i / 100, i % 100),
                epoch,
            )));
        }
        for c in changes {
            c.await??;
        }
        let asked = Instant::now();
        let (resumed, present) = Conn::connect(addr, "resumer", false).await?;
        if !present {
            return Err("the resumer's session was not kept".into());
        }
        conn = resumed;
        publishes(&mut conn, 100).await?;
        resumes.push(asked.elapsed());
    }
    stop(broker).await?;
    times.sort_unstable();
    subacks.sort_unstable();
    resumes.sort_unstable();
    Ok(LatestRow {
        values: (times[0], times[2], times[4]),
        suback: subacks.get(subacks.len() / 2).copied().unwrap_or_default(),
        resume: resumes[1],
    })
}

/// Leases and resolves `jobs` jobs straight on a queue store: each
/// resolution alone, or (`together`) the resolutions of one offer in one
/// call, as a persister makes them when they queued up together.
fn store_alone(kind: Kind, jobs: usize, together: bool) -> Result<f64, Error> {
    use saguin::storage::contract::Provider;
    use saguin_format::model::{ChannelKind, Record};
    let dir = tempfile::tempdir()?;
    let provider: std::sync::Arc<dyn Provider> = match kind {
        Kind::Memory => {
            saguin::storage::memory::MemoryProvider::new(saguin::storage::memory::MemoryConfig {
                name: "db".into(),
                max_bytes: None,
                reserve: 0,
            })?
        }
        Kind::Sqlite => std::sync::Arc::new(saguin::storage::sqlite::SqliteProvider::open(
            saguin::storage::sqlite::SqliteOptions::new("db", dir.path().join("saguin.db")),
        )?),
    };
    let store = provider.open_channel("jobs", ChannelKind::Queue)?;
    let queue = store.as_queue().ok_or("not a queue")?;
    for i in 0..jobs {
        queue.enqueue(Record::new(format!("jobs/j{i}"), vec![b'j'; JOB_BYTES]))?;
    }
    let began = Instant::now();
    let mut done = 0;
    while done < jobs {
        let now = saguin::storage::contract::now_nanos();
        // The leases of one offer share a transaction, as the broker's do.
        let asked = queue
            .offer(256, now)?
            .into_iter()
            .map(|item| saguin::storage::contract::LeaseRequest {
                offset: item.record.offset,
                holder: "w".into(),
                lease_until: now + 30_000_000_000,
                now,
            })
            .collect();
        let leases = queue
            .lease_many(asked)
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        if together {
            let asked = leases.iter().map(|l| (l.delivery_id, l.epoch)).collect();
            for resolved in queue.resolve_many(asked) {
                resolved?;
                done += 1;
            }
        } else {
            for lease in leases {
                queue.resolve(lease.delivery_id, lease.epoch)?;
                done += 1;
            }
        }
    }
    Ok(jobs as f64 / began.elapsed().as_secs_f64())
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("queue: run with `cargo bench --bench queue`");
        return;
    }
    let scale: f64 = std::env::var("SAGUIN_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let jobs = ((20_000.0 * scale) as usize).max(PRODUCERS * 10);
    let sites = ((1_000.0 * scale) as usize).max(8);
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let runs = |table: &str| only.is_empty() || only.iter().any(|o| o == table);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "saguin queue and latest channels: {cpus} CPUs, load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    if runs("queue") {
        println!(
            "\nqueue: {jobs} jobs of {JOB_BYTES} bytes, {PRODUCERS} producers (QoS 1, {PRODUCER_WINDOW} in flight each)"
        );
        println!(
            "{:<8} {:>8} {:>16} {:>12} {:>12}",
            "provider", "workers", "resolved/s", "p50", "p99"
        );
        for workers in [1, 4, 16] {
            for kind in [Kind::Memory, Kind::Sqlite] {
                match queue_run(kind, workers, jobs).await {
                    Ok(row) => println!(
                        "{:<8} {:>8} {:>16.0} {:>12} {:>12}",
                        kind.name(),
                        workers,
                        row.jobs_per_second,
                        ms(row.p50),
                        ms(row.p99)
                    ),
                    Err(e) => println!("{:<8} {:>8} failed: {e}", kind.name(), workers),
                }
            }
        }
    }
    if runs("latest") {
        println!(
            "\nlatest: {} topics held, a subscriber to devices/site-7/# (100 matching), 5 subscribers",
            sites * 100
        );
        println!(
            "{:<8} {:>12} {:>12} {:>12} {:>14} {:>12}",
            "provider", "fastest", "median", "slowest", "SUBACK median", "resume"
        );
        for kind in [Kind::Memory, Kind::Sqlite] {
            match latest_run(kind, sites).await {
                Ok(LatestRow {
                    values: (min, median, max),
                    suback,
                    resume,
                }) => println!(
                    "{:<8} {:>12} {:>12} {:>12} {:>14} {:>12}",
                    kind.name(),
                    ms(min),
                    ms(median),
                    ms(max),
                    ms(suback),
                    ms(resume)
                ),
                Err(e) => println!("{:<8} failed: {e}", kind.name()),
            }
        }
    }
    if runs("store") {
        println!(
            "\nthe queue store alone: {jobs} jobs, 256 leased per transaction, resolved each in a transaction of its own or 256 in one"
        );
        println!("{:<8} {:>16} {:>16}", "provider", "alone/s", "together/s");
        for kind in [Kind::Memory, Kind::Sqlite] {
            match (
                store_alone(kind, jobs, false),
                store_alone(kind, jobs, true),
            ) {
                (Ok(alone), Ok(together)) => {
                    println!("{:<8} {:>16.0} {:>16.0}", kind.name(), alone, together)
                }
                (Err(e), _) | (_, Err(e)) => println!("{:<8} failed: {e}", kind.name()),
            }
        }
    }
}
