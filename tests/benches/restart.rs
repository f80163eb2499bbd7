//! Restart benchmark: how long `saguin serve` takes from exec to listening,
//! and how long a graceful stop takes, with 100,000 retained messages and
//! 10,000 persistent sessions (one subscription each) kept by a memory
//! provider with a snapshot directory and by a sqlite provider.
//!
//! `cargo bench --bench restart` (release). `SAGUIN_BENCH_SCALE` (default
//! 1.0) scales both counts. Every retained message and session is counted
//! after the restart; a missing one fails the run.

mod bench_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bench_support::{start, stop, Conn, Error, V};
use bytes::{Bytes, BytesMut};
use saguin::broker::codec::{
    self, Packet, Publish, PublishProperties, QoS, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions,
};
use tokio::io::AsyncWriteExt;

fn config(dir: &Path, provider: &str) -> Result<PathBuf, Error> {
    let storage = match provider {
        "memory" => format!(
            "storage:\n  - name: p\n    kind: memory\n    snapshot_dir: {}\n",
            dir.join("snapshots").display()
        ),
        _ => format!(
            "storage:\n  - name: p\n    kind: sqlite\n    file_path: {}\n",
            dir.join("saguin.db").display()
        ),
    };
    let path = dir.join("saguin.yaml");
    std::fs::write(
        &path,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
             limits:\n  max_retained: 10000000\n  max_sessions: 10000000\nlog:\n  level: info\n\
             {storage}broker:\n  retained_storage: p\n  session_storage: p\n"
        ),
    )?;
    Ok(path)
}

/// Fill the broker: `retained` retained messages over a few pipelined
/// publishers, `sessions` persistent sessions with one subscription each.
async fn fill(addr: SocketAddr, retained: usize, sessions: usize) -> Result<(), Error> {
    const PUBLISHERS: usize = 4;
    let mut tasks = Vec::new();
    for p in 0..PUBLISHERS {
        tasks.push(tokio::spawn(async move {
            let (mut conn, _) = Conn::connect(addr, &format!("filler-{p}"), true).await?;
            let mine: Vec<usize> = (0..retained).filter(|i| i % PUBLISHERS == p).collect();
            for chunk in mine.chunks(500) {
                let mut buf = BytesMut::new();
                for (k, i) in chunk.iter().enumerate() {
                    codec::encode(
                        &Packet::Publish(Publish {
                            dup: false,
                            qos: QoS::AtLeastOnce,
                            retain: true,
                            topic: format!("site/{}/device/{i}", i % 100).into(),
                            packet_id: (k + 1) as u16,
                            properties: PublishProperties::default(),
                            payload: Bytes::from_static(b"{\"state\":\"on\",\"value\":21.5}"),
                        }),
                        V,
                        &mut buf,
                    )?;
                }
                conn.stream.write_all(&buf).await?;
                for _ in chunk {
                    match conn.next().await? {
                        Packet::PubAck(_) => {}
                        other => {
                            return Err::<(), Error>(
                                format!("expected PUBACK, got {other:?}").into(),
                            )
                        }
                    }
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    bench_support::make_sessions(addr, sessions).await
}

/// Count what came back: every retained message through one `#`
/// subscription, and a sample of sessions resumed with session present.
async fn count(addr: SocketAddr, retained: usize, sessions: usize) -> Result<(), Error> {
    let (mut conn, _) = Conn::connect(addr, "counter", true).await?;
    conn.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: "site/#".into(),
            options: SubscriptionOptions::default(),
        }],
        properties: SubscribeProperties::default(),
    }))
    .await?;
    let mut seen = 0;
    while seen < retained {
        match conn.next().await? {
            Packet::Publish(p) if p.retain => seen += 1,
            Packet::SubAck(_) => {}
            other => return Err(format!("counting retained: {other:?}").into()),
        }
    }
    for s in (0..sessions).step_by((sessions / 100).max(1)) {
        let (_conn, present) = Conn::connect(addr, &format!("session-{s}"), false).await?;
        if !present {
            return Err(format!("session-{s} did not come back").into());
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("restart: run with `cargo bench --bench restart`");
        return;
    }
    let scale: f64 = std::env::var("SAGUIN_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let retained = ((100_000.0 * scale) as usize).max(10);
    let sessions = ((10_000.0 * scale) as usize).max(10);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "saguin restart benchmark: {retained} retained messages, {sessions} persistent sessions; load average {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut failed = false;
    let mut rows = Vec::new();
    for provider in ["memory", "sqlite"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let outcome: Result<(Duration, Duration, Duration), Error> = async {
            let path = config(dir.path(), provider)?;
            let first = start(&path).await?;
            fill(first.addr, retained, sessions).await?;
            let stopped_in = stop(first).await?;
            let second = start(&path).await?;
            let started_in = second.started_in;
            count(second.addr, retained, sessions).await?;
            // The same stop again, with what the restart loaded.
            let again = stop(second).await?;
            Ok((started_in, stopped_in, again))
        }
        .await;
        match outcome {
            Ok((start, stop1, stop2)) => {
                println!(
                    "{provider:<7} exec to listening {:>8.1} ms   graceful stop {:>8.1} ms (after the restart {:>8.1} ms)",
                    start.as_secs_f64() * 1000.0,
                    stop1.as_secs_f64() * 1000.0,
                    stop2.as_secs_f64() * 1000.0
                );
                rows.push((provider, start, stop1));
            }
            Err(e) => {
                println!("FAIL {provider}: {e}");
                failed = true;
            }
        }
    }
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    table.set_header(["provider", "exec to listening", "graceful stop"]);
    for (provider, start, stop) in rows {
        table.add_row([
            provider.to_string(),
            format!("{:.0} ms", start.as_secs_f64() * 1000.0),
            format!("{:.0} ms", stop.as_secs_f64() * 1000.0),
        ]);
    }
    println!("{table}");
    if failed {
        std::process::exit(1);
    }
}
