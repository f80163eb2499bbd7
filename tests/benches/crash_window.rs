//! What kill -9 costs a memory provider with background snapshot
//! generations: twenty runs of `saguin serve` (a memory channel, snapshot
//! debounce 250 ms, maximum delay 2 s) under a steady QoS 1 publisher,
//! each killed at a random moment 2.5-6.5 s after its start. After each
//! kill the snapshot directory is read as a restart reads it: the age of
//! the generation it holds at the moment of the kill (the crash window),
//! and how many acknowledged publishes it lacks. The target: the worst
//! window at most the maximum delay plus the longest generation write the
//! broker reported (`saguin_snapshot_write_seconds_max`).
//!
//! `cargo bench --bench crash_window` (release). `SAGUIN_BENCH_RUNS`
//! (default 20) sets the number of runs.

mod bench_support;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bench_support::{scrape, Conn, Error};
use bytes::Bytes;
use saguin::broker::codec::{ByteStr, Packet, Publish, PublishProperties, QoS};
use saguin::storage::snapshot_dir::{self, ScanOptions};

const MAX_DELAY: Duration = Duration::from_secs(2);

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn config(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    let path = dir.join("saguin.yaml");
    std::fs::write(
        &path,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
             metrics:\n  bind: 127.0.0.1:{}\nlog:\n  level: info\n\
             storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
             \x20   snapshot_debounce: 250ms\n    snapshot_max_delay: 2s\n\
             channels:\n  - name: telemetry\n    kind: append\n    storage: mem\n",
            free_port()?,
            dir.join("snapshots").display()
        ),
    )?;
    Ok(path)
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn metrics_addr(config: &Path) -> Option<std::net::SocketAddr> {
    let text = std::fs::read_to_string(config).ok()?;
    let port = text
        .split("metrics:\n  bind: 127.0.0.1:")
        .nth(1)?
        .lines()
        .next()?
        .parse()
        .ok()?;
    Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Publishes numbered QoS 1 records one at a time until the broker goes;
/// `acked` holds each acknowledged number's PUBACK time, in order.
async fn publish(addr: std::net::SocketAddr, acked: Arc<Mutex<Vec<i64>>>, count: Arc<AtomicU64>) {
    let Ok((mut conn, _)) = Conn::connect(addr, "steady", true).await else {
        return;
    };
    let mut n: u64 = 0;
    loop {
        let packet_id = (n % 60_000 + 1) as u16;
        let publish = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: ByteStr::from("telemetry/steady"),
            packet_id,
            properties: PublishProperties::default(),
            payload: Bytes::from(n.to_string()),
        });
        if conn.send(&publish).await.is_err() {
            return;
        }
        match conn.next().await {
            Ok(Packet::PubAck(a)) if a.packet_id == packet_id => {
                acked.lock().unwrap().push(now_nanos());
                count.fetch_add(1, Ordering::Relaxed);
            }
            _ => return,
        }
        n += 1;
    }
}

struct Run {
    generation: u64,
    window: Duration,
    acked: usize,
    kept: usize,
    write_max: Duration,
}

async fn run(seed: &mut u64) -> Result<Run, Error> {
    let dir = tempfile::tempdir()?;
    let config = config(dir.path())?;
    let metrics = metrics_addr(&config).ok_or("no metrics address")?;
    let mut broker = bench_support::start(&config).await?;
    let acked = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicU64::new(0));
    let publisher = tokio::spawn(publish(broker.addr, acked.clone(), count.clone()));
    // A moment drawn in 2.5-6.5 s: past the first generations, anywhere
    // in their cycle.
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    let at = Duration::from_millis(2_500 + *seed % 4_000);
    tokio::time::sleep(at).await;
    let write_max = scrape(metrics, "saguin_snapshot_write_seconds_max")
        .await
        .map(Duration::from_secs_f64)
        .unwrap_or_default();
    let killed_at = now_nanos();
    broker.child.start_kill()?;
    broker.child.wait().await?;
    let _ = publisher.await;
    let loaded = snapshot_dir::load(&dir.path().join("snapshots"), &ScanOptions::default())
        .map_err(|e| e.to_string())?;
    let kept = loaded
        .channels
        .get("telemetry")
        .map_or(0, |c| c.file.records.len());
    let acked = acked.lock().unwrap().len();
    let captured_at = loaded.committed.captured_at;
    let window = Duration::from_nanos(u64::try_from(killed_at - captured_at).unwrap_or(0));
    Ok(Run {
        generation: loaded.committed.generation,
        window,
        acked,
        kept,
        write_max,
    })
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("crash_window: run with `cargo bench --bench crash_window`");
        return;
    }
    let runs: usize = std::env::var("SAGUIN_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut seed = now_nanos() as u64 | 1;
    println!(
        "kill -9 under a steady QoS 1 publisher, memory provider, snapshot_debounce 250ms, snapshot_max_delay 2s; {runs} runs, seed {seed}"
    );
    println!(
        "{:>4} | {:>10} | {:>10} | {:>9} | {:>9} | {:>9} | {:>10}",
        "run", "generation", "window", "acked", "kept", "lost", "write max"
    );
    let mut worst = Duration::ZERO;
    let mut worst_bound = Duration::ZERO;
    let mut failed = false;
    for i in 0..runs {
        match run(&mut seed).await {
            Ok(r) => {
                let lost = r.acked.saturating_sub(r.kept);
                println!(
                    "{:>4} | {:>10} | {:>8.0}ms | {:>9} | {:>9} | {:>9} | {:>8.1}ms",
                    i + 1,
                    r.generation,
                    r.window.as_secs_f64() * 1000.0,
                    r.acked,
                    r.kept,
                    lost,
                    r.write_max.as_secs_f64() * 1000.0
                );
                worst = worst.max(r.window);
                worst_bound = worst_bound.max(MAX_DELAY + r.write_max);
            }
            Err(e) => {
                println!("{:>4} | failed: {e}", i + 1);
                failed = true;
            }
        }
    }
    println!(
        "worst window {:.0} ms; maximum delay + the longest write: {:.0} ms (target: worst <= that: {})",
        worst.as_secs_f64() * 1000.0,
        worst_bound.as_secs_f64() * 1000.0,
        if worst <= worst_bound { "met" } else { "not met" }
    );
    if failed {
        std::process::exit(1);
    }
}
