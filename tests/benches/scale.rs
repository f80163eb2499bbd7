//! Scaling benchmark: how each cost grows with the work, saguin beside
//! Mosquitto 2 (`/usr/sbin/mosquitto`) in the same run, one broker at a
//! time, with the same client (the project's codec over 127.0.0.1).
//!
//! - `idle`: idle connections (keep alive 60 s): broker RSS per
//!   connection once saguin has parked them all (and, beside it, the
//!   figure a second after the last CONNECT, while each still has its
//!   task), CPU while idle, time to accept them all.
//! - `retained`: retained messages of 64 B: RSS per message after a
//!   restart, the peak RSS its startup reached, startup (exec to the
//!   first CONNACK, recovery included), and
//!   the time a `#` subscriber takes to receive them all, and on memory
//!   the peak RSS of a `saguin snapshot verify` of the stopped provider's
//!   directory. Mosquitto with persistence on.
//! - `append`: one append channel grown to each size, on a memory provider
//!   with a snapshot directory and on sqlite: startup, RSS (and the peak
//!   its startup reached), a consumer's
//!   seek by time (SUBSCRIBE to first record), the retention sweep that
//!   removes a tenth of it, and on memory the peak RSS of a
//!   `saguin snapshot verify` of the stopped provider's directory.
//! - `sessions`: persistent sessions with one queued QoS 1 message each
//!   (`SAGUIN_BENCH_QUEUED` each), on a memory provider with snapshots,
//!   on sqlite and in Mosquitto with persistence: restart to the first
//!   CONNACK, RSS (and its peak), the CPU the broker spends while they
//!   wait detached and nobody connects, a sample of them resumed with their
//!   first message, on memory the longest snapshot capture (on the
//!   broker's loop) and write while they were made, and the time to end
//!   every one (each client comes back clean and goes).
//!   `SAGUIN_BENCH_SESSIONS_CHANNEL` (set: any value) makes each saguin
//!   session a durable consumer of an append channel `cmd` instead.
//! - `commands`: devices each subscribed to its own command topic
//!   (`cmd/dev-<i>/#`, QoS 1), their subscriptions held by at most 1,000
//!   connections (the open-file limit keeps each device from being a
//!   connection of its own at the larger sizes; the idle curve measures
//!   connections): the time to take every subscription, broker RSS per
//!   subscription, and 100,000 QoS 1 commands to random devices: the rate
//!   at which they reach their devices and the broker's CPU a command.
//!   Mosquitto without persistence. `SAGUIN_BENCH_COMMANDS_CHANNEL` (set:
//!   any value) keeps saguin's commands in an append channel `cmd` on a
//!   memory provider, each holder a durable consumer of its devices.
//! - `telemetry`: devices each a connection publishing a 64 B QoS 1
//!   message a second (`SAGUIN_BENCH_TELEMETRY_EVERY` seconds) on its own
//!   topic, one backend subscribed to them all: the broker's CPU (in all
//!   and a message), RSS per device and the devices' PUBACK latency,
//!   measured over 10 s (or ten intervals) after a warm-up as long.
//!   Capped below the open-file limit as the idle curve is.
//! - `following`: devices each a persistent connection consuming its own
//!   commands (`cmd/dev-<i>/#`, QoS 1) from an append channel `cmd`, on a
//!   memory provider with a snapshot directory and on sqlite, while a
//!   publisher sends records to it (`SAGUIN_BENCH_FOLLOWING_RATE` a
//!   second, 1,000 by default), one in ten to a random connected device
//!   and the rest to devices not connected: the broker's CPU (in all and
//!   a record), measured over 10 s after a warm-up as long, and RSS per
//!   device once connected and once saguin has parked them all; every
//!   record sent to a device must reach it. What thousands of connected
//!   consumers cost while the records pass them over. Then every device,
//!   gone, comes back clean and goes: the time to end every session. Mosquitto with
//!   persistent sessions subscribed, persistence on.
//!   `SAGUIN_BENCH_FOLLOWING_BROADCAST` (set: any value) has saguin's
//!   sessions subscribe with no channel, as Mosquitto's do;
//!   `SAGUIN_BENCH_FOLLOWING_KIND=latest` makes `cmd` a latest channel
//!   (each device's desired settings, its current value sent as it
//!   subscribes). `SAGUIN_BENCH_FOLLOWING_CRASH` (set: any value) kills
//!   saguin with `SIGKILL` while every device is connected, restarts it
//!   and has every device come back, then sends each one record: the
//!   time and the CPU until every device has that record, so has caught
//!   up with the channel (a power cut at a site).
//!   Capped below the open-file limit as the idle curve is.
//! - `payloads`: one QoS 1 publisher to one QoS 1 subscriber with payloads
//!   of 64 B to 256 KiB (the sizes are payload bytes): messages and MiB a
//!   second, the broker's CPU a message and a MiB, and the peak RSS the
//!   row took.
//! - `jobs`: one queue channel with a backlog of jobs of 64 B, on a memory
//!   provider with a snapshot directory and on sqlite (a site whose
//!   workers were away): startup with the backlog waiting, RSS (and the
//!   peak its startup reached), a worker's first job from its SUBSCRIBE,
//!   the rate one worker takes [`JOBS_TAKEN`] jobs off the backlog's head
//!   (each acknowledged, a window at a time), the rate an MQTT 5 worker
//!   refuses as many (PUBACK 0x80: they wait out an hour's backoff), the
//!   rate one takes as many behind those, the rate as many jobs of a
//!   queue allowing one attempt reach its dead-letter channel when
//!   refused, and the graceful stop.
//! - `latest`: one latest channel holding a value of 64 B for each of N
//!   devices (`devices/site-<i / 100>/d<i>`), on a memory provider with a
//!   snapshot directory and on sqlite (a site's device twins): startup,
//!   RSS (and the peak its startup reached), the time a new QoS 1
//!   subscriber to one site takes to get its 100 current values and one
//!   to `devices/#` to get all N, and the graceful stop.
//! - `wills`: N devices connected with a retained QoS 1 Will on their
//!   status topic, and a backend subscribed to them all, lose their
//!   connections at once (a switch or an uplink going down): the time
//!   from the drop to the backend's last Will, and the broker's CPU a
//!   Will. Capped below the open-file limit as the idle curve is.
//! - `stalled`: one subscriber that stops reading and [`STALLED_MESSAGES`]
//!   messages of 1 KiB to 256 KiB published to it, at QoS 1 and at QoS 0:
//!   the broker's RSS once every one is routed (queued for the subscriber
//!   or dropped), with its queue bounded by count alone (1,000, both
//!   brokers' default) and by [`STALLED_BYTES`] as well
//!   (`limits.max_queued_bytes`; Mosquitto's `max_queued_bytes`); at QoS 1
//!   also an MQTT 5 subscriber that names no Receive Maximum (65,535, as
//!   most MQTT 5 libraries leave it).
//! - `sparse`: one offline persistent session owed one message in N of
//!   [`SPARSE_MESSAGES`] that four publishers send pipelined (QoS 1, 64
//!   B): the broker's RSS per message it owes and its peak, its sessions
//!   and broadcast log on the built-in memory store, on a memory provider
//!   with a snapshot directory (read once a generation holds every
//!   change, so the peak counts one written with every message owed) and
//!   on sqlite. What a message kept for later costs when the messages
//!   read beside it are not kept.
//! - `channels`: N append channels on one provider (memory with a
//!   snapshot directory, sqlite): the first start, the threads, the RSS
//!   and what each channel adds to it (against the row's first size), the
//!   broker's CPU a QoS 1 publish to one channel and spread over all of
//!   them, and the restart. Mosquitto (no persistence) publishes to the
//!   same topics. What one channel for each site or tenant costs.
//! - `churn`: one broker left running through N rounds of devices coming
//!   and going (a pool of [`CHURN_POOL`], [`CHURN_DEVICES`] a round:
//!   persistent and clean, leaving with and without a DISCONNECT, each
//!   publishing to an append channel, a latest channel, a retained topic
//!   and a queue, some sent a command), a backend, a worker and a
//!   retained reader after each round; the sizes are the rounds where
//!   its RSS and CPU are read, on memory (a snapshot directory), sqlite
//!   and Mosquitto (persistence on). Whether what a site does every day
//!   leaves memory behind.
//!
//! `cargo bench --bench scale` (release). `SAGUIN_BENCH_ONLY` picks curves
//! (comma-separated, default all); `SAGUIN_BENCH_SCALE` (default 1.0)
//! scales every size, `SAGUIN_BENCH_SIZES` (comma-separated counts)
//! replaces the sizes of the curves picked; `SAGUIN_BENCH_ROWS`
//! (comma-separated row names, default all) picks the brokers of the idle,
//! retained, commands, payloads, wills and stalled curves and the
//! providers of the append, following, jobs, latest, channels and churn
//! curves (`mosquitto` the following, channels and churn curves' peer);
//! `SAGUIN_BENCH_BASELINE` names an earlier saguin build whose rows
//! (`saguin-before` idle, `saguin-before-memory` and `saguin-before-sqlite`
//! retained, `saguin-before-memory` and `saguin-before-sqlite` sessions,
//! `memory-before` append and following, `sqlite-before` following,
//! `saguin-before` commands and stalled, `memory-before` and
//! `sqlite-before` jobs, latest and channels) run beside this build's in the same run (the idle curve's two
//! builds take turns going first, size by size);
//! `SAGUIN_BENCH_IDLE_SUBSCRIBED` (set: any value) subscribes each
//! idle connection to its own command topic; `SAGUIN_BENCH_IDLE_SECS` (default 10) is the idle
//! CPU window (of the idle and the sessions curves). Idle connections are capped below the process's open-file
//! limit (each connection is a descriptor in the broker and one here);
//! the run says so where it caps. A count that comes out short fails the
//! run.

mod bench_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use bench_support::{
    cpu_time, first_connack, rss, start_binary, start_mosquitto, status_bytes, stop, threads,
    Broker, Conn, Error, SNAPSHOT_LOG, V,
};
use bytes::{Bytes, BytesMut};
use saguin::broker::codec::{
    self, Disconnect, Packet, ProtocolVersion, PubAck, Publish, PublishProperties, QoS, ReasonCode,
    Subscribe, SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use tokio::io::AsyncWriteExt;

const PAYLOAD: [u8; 64] = [b'x'; 64];

fn main() -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> Result<(), Error> {
    let only = std::env::var("SAGUIN_BENCH_ONLY").unwrap_or_default();
    let wanted = |curve: &str| only.is_empty() || only.split(',').any(|c| c.trim() == curve);
    let scale: f64 = std::env::var("SAGUIN_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let chosen: Option<Vec<usize>> = match std::env::var("SAGUIN_BENCH_SIZES") {
        Ok(list) => Some(
            list.split(',')
                .map(|n| n.trim().parse::<usize>())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("SAGUIN_BENCH_SIZES={list}: {e}"))?,
        ),
        Err(_) => None,
    };
    let sizes = |base: &[usize]| -> Vec<usize> {
        chosen.clone().unwrap_or_else(|| {
            base.iter()
                .map(|&n| ((n as f64 * scale) as usize).max(1))
                .collect()
        })
    };
    println!(
        "scale {scale}, {} CPUs, load average {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mosquitto = Path::new("/usr/sbin/mosquitto").exists();
    if !mosquitto {
        println!("SKIP the Mosquitto rows: /usr/sbin/mosquitto not installed (apt-get install mosquitto)");
    }
    if wanted("idle") {
        idle(&sizes(&[1_000, 5_000, 10_000, 50_000]), mosquitto).await?;
    }
    if wanted("retained") {
        retained(&sizes(&[10_000, 100_000, 300_000, 1_000_000]), mosquitto).await?;
    }
    if wanted("append") {
        append(&sizes(&[1_000_000, 2_000_000, 5_000_000, 10_000_000])).await?;
    }
    if wanted("sessions") {
        sessions(&sizes(&[10_000, 25_000, 50_000, 100_000]), mosquitto).await?;
    }
    if wanted("commands") {
        commands(&sizes(&[1_000, 10_000, 100_000, 1_000_000]), mosquitto).await?;
    }
    if wanted("telemetry") {
        telemetry(&sizes(&[1_000, 5_000, 10_000, 50_000]), mosquitto).await?;
    }
    if wanted("following") {
        following(&sizes(&[1_000, 5_000, 10_000, 50_000]), mosquitto).await?;
    }
    if wanted("payloads") {
        payloads(&sizes(&[64, 1_024, 16_384, 262_144]), mosquitto).await?;
    }
    if wanted("jobs") {
        jobs(&sizes(&[10_000, 100_000, 1_000_000, 2_000_000])).await?;
    }
    if wanted("latest") {
        latest(&sizes(&[10_000, 100_000, 1_000_000])).await?;
    }
    if wanted("wills") {
        wills(&sizes(&[1_000, 5_000, 10_000, 50_000]), mosquitto).await?;
    }
    if wanted("stalled") {
        stalled(&sizes(&[1_024, 16_384, 262_144]), mosquitto).await?;
    }
    if wanted("sparse") {
        sparse(&sizes(&[1, 10, 100, 1_000]), mosquitto).await?;
    }
    if wanted("channels") {
        channels(&sizes(&[10, 100, 1_000, 10_000]), mosquitto, scale).await?;
    }
    if wanted("churn") {
        churn(&sizes(&[50, 100, 250, 500]), mosquitto).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------- process

/// Resident memory of process `pid` that is its own (heap, stacks: not
/// the pages of its executable and libraries, which the page cache holds
/// once for every process mapping them), bytes.
fn private_rss(pid: u32) -> Result<u64, Error> {
    status_bytes(pid, "RssAnon:")
}

/// The most resident memory process `pid` has had, bytes.
fn peak_rss(pid: u32) -> Result<u64, Error> {
    status_bytes(pid, "VmHWM:")
}

/// The peak RSS of `bin snapshot verify dir`, bytes, which must find the
/// directory valid; `None` without `/usr/bin/time`. Measured by that
/// small process rather than by waiting for the command here: a child
/// spawned from this process starts in its memory, and the kernel counts
/// the bench's own peak as the child's.
fn verify_peak_rss(bin: &Path, dir: &Path) -> Result<Option<u64>, Error> {
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        return Ok(None);
    }
    let out = std::process::Command::new(time)
        .args(["-f", "%M"])
        .arg(bin)
        .args(["snapshot", "verify"])
        .arg(dir)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "snapshot verify {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let kib: u64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .ok_or("no peak from /usr/bin/time")?
        .trim()
        .parse()?;
    Ok(Some(kib * 1024))
}

fn pid_of(broker: &Broker) -> Result<u32, Error> {
    broker.child.id().ok_or_else(|| "the broker exited".into())
}

/// The open-file limit of this process (and of the brokers it starts).
fn open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    limit.rlim_cur
}

/// Raises the soft open-file limit to the hard one (what `ulimit -n`
/// would allow); brokers started afterwards inherit it.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2)/setrlimit(2) on a struct of ours.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_nanos(time).to_string()
}

/// What each row starts: saguin on `config`, or Mosquitto with `extra`
/// configuration lines, both in `dir`. `started_in` is exec to the first
/// CONNACK for both.
enum Which<'a> {
    Saguin { config: &'a Path, bin: &'a Path },
    Mosquitto { extra: &'a str },
}

/// This build's saguin binary.
fn this_build() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_saguin"))
}

/// Whether `SAGUIN_BENCH_ROWS` asks for row `name` (all rows when unset).
fn row_wanted(name: &str) -> bool {
    match std::env::var("SAGUIN_BENCH_ROWS") {
        Ok(rows) => rows.split(',').any(|r| r.trim() == name),
        Err(_) => true,
    }
}

/// The rows of a curve with one saguin row a size: this build, the
/// earlier one when `SAGUIN_BENCH_BASELINE` names it, and Mosquitto when
/// it is installed; those `SAGUIN_BENCH_ROWS` asks for.
fn rows(baseline: &Option<PathBuf>, mosquitto: bool) -> Vec<&'static str> {
    let mut rows = vec!["saguin"];
    if baseline.is_some() {
        rows.push("saguin-before");
    }
    if mosquitto {
        rows.push("mosquitto");
    }
    rows.retain(|r| row_wanted(r));
    rows
}

/// What row `name` of [`rows`] (or the idle curve) starts: this build or
/// the earlier one on `config`, or Mosquitto with `mosquitto_extra`.
fn row<'a>(
    name: &str,
    config: &'a Path,
    baseline: &'a Option<PathBuf>,
    mosquitto_extra: &'a str,
) -> Which<'a> {
    match (name, baseline) {
        ("saguin-before", Some(before)) => Which::Saguin {
            config,
            bin: before,
        },
        ("mosquitto", _) => Which::Mosquitto {
            extra: mosquitto_extra,
        },
        _ => Which::Saguin {
            config,
            bin: this_build(),
        },
    }
}

async fn launch(which: &Which<'_>, dir: &Path) -> Result<Broker, Error> {
    match which {
        Which::Saguin { config, bin } => {
            let began = Instant::now();
            let mut broker = start_binary(bin, config, &[("RUST_LOG", SNAPSHOT_LOG)]).await?;
            if let Err(e) = first_connack(broker.addr, Duration::from_secs(300)).await {
                // Whether it went away after naming its listener, and why.
                let exited = broker.child.try_wait()?;
                let logged = broker.last_error.borrow().clone();
                return Err(format!(
                    "{e} (the broker's process: {exited:?}; its last error: {logged:?})"
                )
                .into());
            }
            broker.started_in = began.elapsed();
            Ok(broker)
        }
        Which::Mosquitto { extra } => start_mosquitto(dir, extra).await,
    }
}

fn saguin_config(dir: &Path, body: &str) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("saguin.yaml");
    std::fs::write(
        &path,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
             log:\n  level: info\n{body}"
        ),
    )?;
    Ok(path)
}

// ---------------------------------------------------------------- clients

/// Publishes `count` QoS 1 messages from `publishers` connections, each
/// keeping up to 500 in flight; `topic(i)` names message `i`.
async fn publish_many(
    addr: SocketAddr,
    count: usize,
    retain: bool,
    topic: impl Fn(usize) -> String + Copy + Send + Sync + 'static,
) -> Result<(), Error> {
    publish_range(addr, 0..count, retain, topic).await
}

/// [`publish_many`] of messages `range`.
async fn publish_range(
    addr: SocketAddr,
    range: std::ops::Range<usize>,
    retain: bool,
    topic: impl Fn(usize) -> String + Copy + Send + Sync + 'static,
) -> Result<(), Error> {
    const PUBLISHERS: usize = 4;
    const WINDOW: usize = 500;
    let mut tasks = Vec::new();
    for p in 0..PUBLISHERS {
        let range = range.clone();
        tasks.push(tokio::spawn(async move {
            let (mut conn, _) = Conn::connect(addr, &format!("scale-publisher-{p}"), true).await?;
            let mine: Vec<usize> = range.skip(p).step_by(PUBLISHERS).collect();
            for chunk in mine.chunks(WINDOW) {
                let topics = chunk.iter().map(|&i| topic(i));
                publish_window(&mut conn, topics, retain, &format!("publisher {p}")).await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Publishes a QoS 1 message of [`PAYLOAD`] to each of `topics` in one
/// write (packet identifiers from 1) and waits for every PUBACK; `who`
/// names the publisher in an error.
async fn publish_window(
    conn: &mut Conn,
    topics: impl Iterator<Item = String>,
    retain: bool,
    who: &str,
) -> Result<(), Error> {
    let mut buf = BytesMut::new();
    let mut sent = 0;
    for (k, topic) in topics.enumerate() {
        codec::encode(
            &Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain,
                topic: topic.into(),
                packet_id: (k + 1) as u16,
                properties: PublishProperties::default(),
                payload: Bytes::from_static(&PAYLOAD),
            }),
            V,
            &mut buf,
        )?;
        sent += 1;
    }
    conn.stream.write_all(&buf).await?;
    for _ in 0..sent {
        match conn.next().await? {
            Packet::PubAck(ack) if !ack.reason.is_error() => {}
            other => return Err(format!("{who}: expected PUBACK, got {other:?}").into()),
        }
    }
    Ok(())
}

/// Waits for the next packets `conn` is sent and takes every one already
/// read with them; each must be a QoS 1 message `expected` accepts. They
/// are acknowledged in one write; returns how many there were. `who`
/// names the client in an error.
async fn acknowledge_messages(
    conn: &mut Conn,
    who: &str,
    expected: impl Fn(&Publish) -> bool,
) -> Result<usize, Error> {
    let mut acks = Vec::new();
    let mut next = Some(conn.next().await?);
    while let Some(packet) = next {
        match packet {
            Packet::Publish(p) if expected(&p) => {
                acks.push(Packet::PubAck(PubAck::new(p.packet_id)))
            }
            other => return Err(format!("{who}: unexpected {other:?}").into()),
        }
        next = conn.try_next()?;
    }
    conn.send_all(&acks).await?;
    Ok(acks.len())
}

/// [`subscribe`] with no user properties, and its SUBACK read: an error
/// naming `who` unless it granted the filter.
async fn subscribe_acked(conn: &mut Conn, filter: &str, qos: QoS, who: &str) -> Result<(), Error> {
    subscribe(conn, filter, qos, Vec::new()).await?;
    match conn.next().await? {
        Packet::SubAck(ack) if !ack.reasons.iter().any(|r| r.is_error()) => Ok(()),
        other => Err(format!("{who}: expected SUBACK, got {other:?}").into()),
    }
}

async fn subscribe(
    conn: &mut Conn,
    filter: &str,
    qos: QoS,
    user_properties: Vec<(String, String)>,
) -> Result<(), Error> {
    conn.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: filter.to_owned(),
            options: SubscriptionOptions {
                qos,
                ..SubscriptionOptions::default()
            },
        }],
        properties: SubscribeProperties {
            subscription_identifier: None,
            user_properties,
        },
    }))
    .await
}

// ---------------------------------------------------------------- idle

/// How long a broker left alone is watched for the CPU it spends
/// (`SAGUIN_BENCH_IDLE_SECS`, 10 s).
fn idle_window() -> Duration {
    Duration::from_secs(
        std::env::var("SAGUIN_BENCH_IDLE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    )
}

/// The share of a core broker `pid` spends over the next `window` while
/// nothing is asked of it.
async fn idle_cpu(pid: u32, window: Duration) -> Result<f64, Error> {
    let cpu_before = cpu_time(pid)?;
    let measured_from = Instant::now();
    // What is measured is the passing of the window itself, with nothing
    // asked of the broker: there is no event to wait on.
    tokio::time::sleep(window).await;
    Ok((cpu_time(pid)? - cpu_before).as_secs_f64() / measured_from.elapsed().as_secs_f64())
}

async fn idle(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    raise_open_file_limit();
    let limit = open_file_limit();
    // Each connection is a descriptor in the broker and one in this
    // process; leave room for everything else either has open.
    let cap = limit.saturating_sub(1_000) as usize;
    let window = idle_window();
    // Each a device listening on its own command topic, as most are.
    let subscribed = std::env::var_os("SAGUIN_BENCH_IDLE_SUBSCRIBED").is_some();
    println!(
        "\n## Idle connections (keep alive 60 s, clean, MQTT 3.1.1{})",
        if subscribed {
            ", each subscribed to cmd/<its id>/# at QoS 1"
        } else {
            ""
        }
    );
    let mut sizes: Vec<usize> = sizes.iter().map(|&n| n.min(cap)).collect();
    sizes.dedup();
    if sizes.contains(&cap) {
        println!(
            "capped at {cap}: the open-file limit is {limit} and cannot be raised here \
             (each connection is a descriptor in the broker and one in this process)"
        );
    }
    println!(
        "| broker | connections | accept all | RSS | RSS per connection | private per connection | the same, served (1 s after) | parked | CPU while idle ({}s) |",
        window.as_secs()
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let baseline = bench_support::baseline()?;
    let dir = tempfile::tempdir()?;
    for (size, &n) in sizes.iter().enumerate() {
        let mut brokers = vec!["saguin"];
        if baseline.is_some() {
            // The two builds take turns going first: a size's first row
            // accepts slower whichever build it is (measured with one
            // build in both rows), so a fixed order leans one way.
            if size % 2 == 1 {
                brokers.insert(0, "saguin-before");
            } else {
                brokers.push("saguin-before");
            }
        }
        if mosquitto {
            brokers.push("mosquitto");
        }
        for name in brokers.into_iter().filter(|b| row_wanted(b)) {
            let data = dir.path().join(format!("{name}-idle-{n}"));
            let metrics_port = bench_support::free_port()?;
            let config = saguin_config(
                &data,
                &format!(
                    "limits:\n  max_connections: {}\nmetrics:\n  bind: 127.0.0.1:{metrics_port}\n",
                    n + 100
                ),
            )?;
            let which = row(
                name,
                &config,
                &baseline,
                "persistence false\nmax_connections -1\n",
            );
            let broker = launch(&which, &data).await?;
            let pid = pid_of(&broker)?;
            let before = rss(pid)?;
            let private_before = private_rss(pid)?;
            let began = Instant::now();
            let conns = connect_idle(broker.addr, n, subscribed).await?;
            let accepted_in = began.elapsed();
            // Let the broker's buffers for the CONNECT burst go back first.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let served = rss(pid)?;
            // saguin parks a quiet client's connection after 10 s (half
            // its keep alive, at most 10 s): the row is measured once all
            // are. A build without the gauge parks nothing.
            let parked = match which {
                Which::Saguin { .. } => all_parked(metrics_port, n).await,
                Which::Mosquitto { .. } => None,
            };
            let cpu = idle_cpu(pid, window).await?;
            let after = rss(pid)?;
            let private_after = private_rss(pid)?;
            println!(
                "| {name} | {n} | {} | {} | {:.0} B | {:.0} B | {:.0} B | {} | {:.2}% of a core |",
                ms(accepted_in),
                mib(after as f64),
                (after.saturating_sub(before)) as f64 / n as f64,
                (private_after.saturating_sub(private_before)) as f64 / n as f64,
                (served.saturating_sub(before)) as f64 / n as f64,
                parked.map_or("-".to_owned(), |p| p.to_string()),
                cpu * 100.0
            );
            drop(conns);
            stop(broker).await?;
        }
    }
    Ok(())
}

/// Waits (at most two minutes) until saguin, whose metrics listen on
/// `port`, has parked `n` connections: a quiet client's connection is
/// parked after 10 s (half its keep alive, at most 10 s). Returns the
/// last count read; `None` for a build without the gauge (it parks
/// nothing).
async fn all_parked(port: u16, n: usize) -> Option<u64> {
    let metrics = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let parked = bench_support::scrape(metrics, "saguin_connections_parked")
            .await
            .map(|p| p as u64);
        if parked.is_none_or(|p| p >= n as u64) || Instant::now() > deadline {
            return parked;
        }
        // The gauge is the only word of a park the broker gives (it logs
        // none and pushes nothing): asked four times a second, far below
        // the CPU a row measures after.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `n` connections, 64 connecting at a time; all still open, each
/// subscribed to its command topic when `subscribed` (its SUBACK read).
async fn connect_idle(addr: SocketAddr, n: usize, subscribed: bool) -> Result<Vec<Conn>, Error> {
    connect_many(n, move |i| async move {
        let id = format!("idle-{i}");
        let (mut conn, _) = Conn::connect_with(addr, &id, true, 60, V).await?;
        if subscribed {
            subscribe_acked(&mut conn, &format!("cmd/{id}/#"), QoS::AtLeastOnce, &id).await?;
        }
        Ok(conn)
    })
    .await
}

/// `n` connections, 64 connecting at a time, connection `i` made by
/// `make(i)`; in that order.
async fn connect_many<F, Made>(n: usize, make: F) -> Result<Vec<Conn>, Error>
where
    F: Fn(usize) -> Made + Clone + Send + 'static,
    Made: std::future::Future<Output = Result<Conn, Error>> + Send,
{
    const CONNECTORS: usize = 64;
    let mut tasks = Vec::new();
    for c in 0..CONNECTORS.min(n) {
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in (c..n).step_by(CONNECTORS) {
                mine.push((i, make(i).await?));
            }
            Ok::<_, Error>(mine)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for task in tasks {
        all.extend(task.await??);
    }
    all.sort_unstable_by_key(|(i, _)| *i);
    Ok(all.into_iter().map(|(_, conn)| conn).collect())
}

// ---------------------------------------------------------------- retained

fn retained_topic(i: usize) -> String {
    format!("site/{}/device/{i}", i % 100)
}

async fn retained(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    println!("\n## Retained messages (64 B payload, topics site/<i mod 100>/device/<i>)");
    println!(
        "| broker | retained | RSS after restart | RSS per message | target | peak RSS in startup | startup | `#` receives all | fill | graceful stop | `snapshot verify` peak RSS |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let baseline = bench_support::baseline()?;
    let dir = tempfile::tempdir()?;
    for &n in sizes {
        let topic_bytes: usize = (0..n).map(|i| retained_topic(i).len()).sum();
        let target = 1.5 * (PAYLOAD.len() as f64 + topic_bytes as f64 / n as f64);
        let mut brokers = vec!["saguin-memory"];
        if baseline.is_some() {
            brokers.push("saguin-before-memory");
        }
        brokers.push("saguin-sqlite");
        if baseline.is_some() {
            brokers.push("saguin-before-sqlite");
        }
        if mosquitto {
            brokers.push("mosquitto-persist");
        }
        for name in brokers.into_iter().filter(|b| row_wanted(b)) {
            let data = dir.path().join(format!("{name}-{n}"));
            let bin = provider_bin(name, &baseline);
            let storage = provider_storage(name, &data);
            let config = saguin_config(
                &data,
                &format!(
                    "limits:\n  max_retained: {}\nstorage:\n{storage}broker:\n  retained_storage: p\n  session_storage: p\n",
                    n + 100
                ),
            )?;
            let which = if name == "mosquitto-persist" {
                Which::Mosquitto {
                    extra: "persistence true\nmax_queued_messages 0\nmax_queued_bytes 0\n",
                }
            } else {
                Which::Saguin {
                    config: &config,
                    bin,
                }
            };
            // The empty broker's memory is the baseline.
            let empty = launch(&which, &data).await?;
            let baseline = rss(pid_of(&empty)?)?;
            stop(empty).await?;

            let broker = launch(&which, &data).await?;
            let began = Instant::now();
            publish_many(broker.addr, n, true, retained_topic).await?;
            let filled_in = began.elapsed();
            let stopped_in = stop(broker).await?;

            let broker = launch(&which, &data).await?;
            let restarted_in = broker.started_in;
            let after = rss(pid_of(&broker)?)?;
            let peak = peak_rss(pid_of(&broker)?)?;
            let received_in = receive_all_retained(broker.addr, n).await?;
            stop(broker).await?;
            // What a backup script's check of the stopped provider's
            // directory costs: it keeps every retained topic to refuse a
            // second value for one.
            let verify_peak = if name.ends_with("-memory") {
                verify_peak_rss(bin, &data.join("snapshots"))?
                    .map_or_else(|| "no /usr/bin/time".to_owned(), |b| mib(b as f64))
            } else {
                "-".to_owned()
            };
            println!(
                "| {name} | {n} | {} | {:.0} B | {target:.0} B | {} | {} | {} | {} | {} | {verify_peak} |",
                mib(after as f64),
                after.saturating_sub(baseline) as f64 / n as f64,
                mib(peak as f64),
                ms(restarted_in),
                ms(received_in),
                ms(filled_in),
                ms(stopped_in)
            );
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

/// A `#` subscriber at QoS 0: the time from its SUBSCRIBE to the `n`th
/// retained message.
async fn receive_all_retained(addr: SocketAddr, n: usize) -> Result<Duration, Error> {
    let (mut conn, _) = Conn::connect(addr, "scale-everything", true).await?;
    let began = Instant::now();
    subscribe(&mut conn, "#", QoS::AtMostOnce, Vec::new()).await?;
    let mut received = 0;
    let deadline = Duration::from_secs(600);
    while received < n {
        match tokio::time::timeout(deadline.saturating_sub(began.elapsed()), conn.next()).await {
            Err(_) => return Err(format!("# received {received} of {n} retained").into()),
            Ok(packet) => {
                if let Packet::Publish(p) = packet? {
                    if p.retain {
                        received += 1;
                    }
                }
            }
        }
    }
    Ok(began.elapsed())
}

// ---------------------------------------------------------------- channels

/// QoS 1 publishes of each phase of the channels curve at scale 1.
const CHANNELS_PUBLISHES: f64 = 100_000.0;

/// The broker's CPU time over `publishes` QoS 1 publishes to `topic(i)`,
/// a publish, in microseconds.
async fn cpu_a_publish(
    broker: &Broker,
    publishes: usize,
    topic: impl Fn(usize) -> String + Copy + Send + Sync + 'static,
) -> Result<f64, Error> {
    let pid = pid_of(broker)?;
    let before = cpu_time(pid)?;
    publish_many(broker.addr, publishes, false, topic).await?;
    Ok((cpu_time(pid)? - before).as_secs_f64() * 1e6 / publishes as f64)
}

async fn channels(sizes: &[usize], mosquitto: bool, scale: f64) -> Result<(), Error> {
    let publishes = ((CHANNELS_PUBLISHES * scale) as usize).max(1);
    let window = idle_window();
    println!(
        "\n## Channels in one broker (append channels c0..cN on one provider; {publishes} QoS 1 publishes of 64 B to one of them, then as many spread over all; CPU while idle over {} s after the restart, no client)",
        window.as_secs()
    );
    println!(
        "| broker | channels | first start | threads | RSS | RSS a channel | broker CPU a publish, one channel | spread over all | restart | RSS after | CPU while idle |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let baseline = bench_support::baseline()?;
    let mut names = provider_rows(&baseline);
    if mosquitto && row_wanted("mosquitto") {
        names.push("mosquitto");
    }
    let dir = tempfile::tempdir()?;
    // Each row's first size and RSS: what a channel adds is read against it.
    let mut first: std::collections::HashMap<&str, (usize, u64)> = Default::default();
    for &n in sizes {
        for &name in &names {
            let data = dir.path().join(format!("{name}-{n}"));
            if name == "mosquitto" {
                let which = Which::Mosquitto {
                    extra: "persistence false\nset_tcp_nodelay true\n",
                };
                let broker = launch(&which, &data).await?;
                let one = cpu_a_publish(&broker, publishes, |_| "c0/d".to_string()).await?;
                let spread =
                    cpu_a_publish(&broker, publishes, move |i| format!("c{}/d", i % n)).await?;
                stop(broker).await?;
                println!(
                    "| {name} | {n} | - | - | - | - | {one:.1} µs | {spread:.1} µs | - | - | - |"
                );
                continue;
            }
            let storage = provider_storage(name, &data);
            let mut body = format!("storage:\n{storage}channels:\n");
            for c in 0..n {
                body.push_str(&format!("  - {{name: c{c}, kind: append, storage: p}}\n"));
            }
            let config = saguin_config(&data, &body)?;
            let which = Which::Saguin {
                config: &config,
                bin: provider_bin(name, &baseline),
            };
            let broker = launch(&which, &data).await?;
            let first_start = broker.started_in;
            let pid = pid_of(&broker)?;
            let threads = threads(pid)?;
            let resident = rss(pid)?;
            let (n0, rss0) = *first.entry(name).or_insert((n, resident));
            let a_channel = if n > n0 {
                format!("{:.0} B", (resident as f64 - rss0 as f64) / (n - n0) as f64)
            } else {
                "-".to_string()
            };
            let one = cpu_a_publish(&broker, publishes, |_| "c0/d".to_string()).await?;
            let spread =
                cpu_a_publish(&broker, publishes, move |i| format!("c{}/d", i % n)).await?;
            stop(broker).await?;
            let broker = launch(&which, &data).await?;
            let restart = broker.started_in;
            let restarted = pid_of(&broker)?;
            let after = rss(restarted)?;
            // Everything was written at the stop: nothing is due after the
            // restart, and no client is connected.
            let idle = idle_cpu(restarted, window).await?;
            stop(broker).await?;
            println!(
                "| {name} | {n} | {} | {threads} | {} | {a_channel} | {one:.1} µs | {spread:.1} µs | {} | {} | {:.2}% |",
                ms(first_start),
                mib(resident as f64),
                ms(restart),
                mib(after as f64),
                idle * 100.0,
            );
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- append

fn record_topic(i: usize) -> String {
    format!("telemetry/dev{}", i % 1000)
}

/// The provider rows of a curve: memory and sqlite, and the earlier
/// build's of each when `SAGUIN_BENCH_BASELINE` names it; those
/// `SAGUIN_BENCH_ROWS` asks for.
fn provider_rows(baseline: &Option<PathBuf>) -> Vec<&'static str> {
    let mut providers = vec!["memory", "sqlite"];
    if baseline.is_some() {
        providers.extend(["memory-before", "sqlite-before"]);
    }
    providers.retain(|p| row_wanted(p));
    providers
}

/// The build a provider row runs: the earlier one for a row named
/// `*-before*` (`memory-before`, `saguin-before-sqlite`) when
/// `SAGUIN_BENCH_BASELINE` names it, else this one.
fn provider_bin<'a>(provider: &str, baseline: &'a Option<PathBuf>) -> &'a Path {
    match (provider.contains("-before"), baseline) {
        (true, Some(before)) => before.as_path(),
        _ => this_build(),
    }
}

/// The `storage` list of a provider row, one provider `p` in `data`: a
/// memory provider with a snapshot directory for a row naming `memory`,
/// else sqlite.
fn provider_storage(provider: &str, data: &Path) -> String {
    if provider.contains("memory") {
        format!(
            "  - name: p\n    kind: memory\n    snapshot_dir: {}\n",
            data.join("snapshots").display()
        )
    } else {
        format!(
            "  - name: p\n    kind: sqlite\n    file_path: {}\n",
            data.join("saguin.db").display()
        )
    }
}

async fn append(sizes: &[usize]) -> Result<(), Error> {
    println!("\n## One append channel (64 B records)");
    println!(
        "| provider | records | startup | RSS | peak RSS in startup | seek by time | sweep of a tenth | removed | graceful stop | fill rate | `snapshot verify` peak RSS |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let baseline = bench_support::baseline()?;
    let mut providers = vec!["memory"];
    if baseline.is_some() {
        providers.push("memory-before");
    }
    providers.push("sqlite");
    for provider in providers.into_iter().filter(|p| row_wanted(p)) {
        let bin = provider_bin(provider, &baseline);
        let dir = tempfile::tempdir()?;
        let data = dir.path().join(provider);
        let storage = provider_storage(provider, &data);
        let metrics: SocketAddr = format!("127.0.0.1:{}", bench_support::free_port()?).parse()?;
        let config_with = |retention: Option<u64>| {
            let retention = retention
                .map(|b| format!("    retention_bytes: {b}\n"))
                .unwrap_or_default();
            saguin_config(
                &data,
                &format!(
                    "storage:\n{storage}channels:\n  - name: telemetry\n    kind: append\n    storage: p\n{retention}metrics:\n  bind: {metrics}\n"
                ),
            )
        };
        let mut held = 0usize;
        for &n in sizes {
            let config = config_with(None)?;
            let broker = start_binary(bin, &config, &[]).await?;
            let fill_began = SystemTime::now();
            let began = Instant::now();
            publish_many(broker.addr, n - held, false, record_topic).await?;
            let fill_rate = (n - held) as f64 / began.elapsed().as_secs_f64();
            let records = bench_support::scrape(metrics, "saguin_channel_records")
                .await
                .ok_or("no saguin_channel_records")?;
            if records as usize != n {
                return Err(format!("{provider}: the channel holds {records}, not {n}").into());
            }
            let bytes = bench_support::scrape(metrics, "saguin_channel_bytes")
                .await
                .ok_or("no saguin_channel_bytes")?;
            let stopped_in = stop(broker).await?;

            let broker = launch(
                &Which::Saguin {
                    config: &config,
                    bin,
                },
                &data,
            )
            .await?;
            let started_in = broker.started_in;
            let resident = rss(pid_of(&broker)?)?;
            let peak = peak_rss(pid_of(&broker)?)?;
            let seek = seek_by_time(broker.addr, fill_began).await?;
            stop(broker).await?;
            let verify_peak = if provider.starts_with("memory") {
                verify_peak_rss(bin, &data.join("snapshots"))?
                    .map_or_else(|| "no /usr/bin/time".to_owned(), |b| mib(b as f64))
            } else {
                "-".to_owned()
            };

            // A bound a tenth below what the channel holds: the sweep that
            // runs as the broker starts removes the oldest tenth.
            let config = config_with(Some((bytes * 0.9) as u64))?;
            let broker = launch(
                &Which::Saguin {
                    config: &config,
                    bin,
                },
                &data,
            )
            .await?;
            let (swept_in, removed) = wait_sweep(metrics).await?;
            held = bench_support::scrape(metrics, "saguin_channel_records")
                .await
                .ok_or("no saguin_channel_records")? as usize;
            stop(broker).await?;
            println!(
                "| {provider} | {n} | {} | {} | {} | {} | {} | {removed} | {} | {:.0}/s | {verify_peak} |",
                ms(started_in),
                mib(resident as f64),
                mib(peak as f64),
                ms(seek),
                ms(swept_in),
                ms(stopped_in),
                fill_rate
            );
        }
    }
    Ok(())
}

/// An MQTT 5 consumer that subscribes from `time`: the time from its
/// SUBSCRIBE to its first record.
async fn seek_by_time(addr: SocketAddr, time: SystemTime) -> Result<Duration, Error> {
    let (mut conn, _) =
        Conn::connect_with(addr, "scale-seeker", true, 60, ProtocolVersion::V5).await?;
    let began = Instant::now();
    subscribe(
        &mut conn,
        "telemetry/#",
        QoS::AtLeastOnce,
        vec![("saguin-from".to_owned(), rfc3339(time))],
    )
    .await?;
    loop {
        match tokio::time::timeout(Duration::from_secs(300), conn.next()).await?? {
            Packet::Publish(_) => return Ok(began.elapsed()),
            Packet::SubAck(ack) if ack.reasons.iter().any(|r| r.is_error()) => {
                return Err(format!("seek refused: {ack:?}").into())
            }
            _ => {}
        }
    }
}

/// Scrapes until retention has removed records: how long its longest
/// pass took (the one that removed them; the broker measures it) and how
/// many records it removed.
async fn wait_sweep(metrics: SocketAddr) -> Result<(Duration, u64), Error> {
    let began = Instant::now();
    loop {
        let removed = bench_support::scrape(metrics, "saguin_retention_removed_records_total")
            .await
            .unwrap_or(0.0);
        if removed > 0.0 {
            let took = bench_support::scrape(metrics, "saguin_retention_sweep_seconds_max")
                .await
                .ok_or("no saguin_retention_sweep_seconds_max")?;
            return Ok((Duration::from_secs_f64(took), removed as u64));
        }
        if began.elapsed() > Duration::from_secs(600) {
            return Err("retention removed nothing in 600 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------- sessions

async fn sessions(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    const SAMPLE: usize = 1_000;
    let queued: usize = match std::env::var("SAGUIN_BENCH_QUEUED") {
        Ok(q) => q
            .parse()
            .map_err(|e| format!("SAGUIN_BENCH_QUEUED={q}: {e}"))?,
        Err(_) => 1,
    };
    // Each session a durable consumer of an append channel `cmd` (its
    // `cmd/<n>/#` names it) rather than a broadcast subscriber.
    let consumers = std::env::var_os("SAGUIN_BENCH_SESSIONS_CHANNEL").is_some();
    let channel = match consumers {
        true => "channels:\n  - name: cmd\n    kind: append\n    storage: p\n",
        false => "",
    };
    println!(
        "\n## Persistent sessions, {queued} queued QoS 1 message(s) each{}",
        if consumers {
            ", each consuming the append channel `cmd` (Mosquitto: subscribed)"
        } else {
            ""
        }
    );
    println!(
        "| broker | sessions | restart to first CONNACK | RSS | peak RSS | CPU while idle | sample resumed | graceful stop | longest snapshot capture / write | end every session |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    // After the restart, with every session detached and none due: what
    // keeping them costs a broker nobody speaks to.
    let window = idle_window();
    let dir = tempfile::tempdir()?;
    let baseline = bench_support::baseline()?;
    for &n in sizes {
        // "saguin-memory": a memory provider with a snapshot directory,
        // whose generations write the sessions while they are made.
        let mut brokers = vec!["saguin-memory", "saguin-sqlite"];
        if baseline.is_some() {
            brokers.extend(["saguin-before-memory", "saguin-before-sqlite"]);
        }
        if mosquitto {
            brokers.push("mosquitto-persist");
        }
        for name in brokers.into_iter().filter(|name| row_wanted(name)) {
            let data = dir.path().join(format!("{name}-{n}"));
            let metrics: SocketAddr =
                format!("127.0.0.1:{}", bench_support::free_port()?).parse()?;
            let config = saguin_config(
                &data,
                &format!(
                    "limits:\n  max_sessions: {}\n  max_queued_messages: {}\nstorage:\n{}broker:\n  session_storage: p\n{channel}metrics:\n  bind: {metrics}\n",
                    n + 100,
                    queued.max(1000),
                    provider_storage(name, &data)
                ),
            )?;
            let mosquitto_extra = format!(
                "persistence true\nmax_connections -1\nmax_queued_messages {}\n",
                queued.max(1000)
            );
            let which = if name == "mosquitto-persist" {
                Which::Mosquitto {
                    extra: &mosquitto_extra,
                }
            } else {
                Which::Saguin {
                    config: &config,
                    bin: provider_bin(name, &baseline),
                }
            };
            let mut broker = launch(&which, &data).await?;
            bench_support::make_sessions(broker.addr, n).await?;
            SESSIONS.store(n, std::sync::atomic::Ordering::Relaxed);
            publish_many(broker.addr, n * queued, false, |i| {
                format!(
                    "cmd/{}/go",
                    i % SESSIONS.load(std::sync::atomic::Ordering::Relaxed)
                )
            })
            .await?;
            let snapshots = if name.ends_with("-memory") {
                snapshot_saved(&mut broker, metrics).await?;
                let seconds = |metric| async move {
                    bench_support::scrape(metrics, metric)
                        .await
                        .map_or("-".to_owned(), |s| format!("{:.1} ms", s * 1e3))
                };
                format!(
                    "{} / {}",
                    seconds("saguin_snapshot_capture_seconds_max").await,
                    seconds("saguin_snapshot_write_seconds_max").await
                )
            } else {
                "-".to_owned()
            };
            let stopped_in = stop(broker).await?;

            let broker = launch(&which, &data).await?;
            let restarted_in = broker.started_in;
            let resident = rss(pid_of(&broker)?)?;
            let peak = peak_rss(pid_of(&broker)?)?;
            let idle = idle_cpu(pid_of(&broker)?, window).await?;
            let step = (n / SAMPLE).max(1);
            let mut resumed = 0;
            for s in (0..n).step_by(step) {
                resume_one(broker.addr, s).await?;
                resumed += 1;
            }
            let ended_in = end_sessions(broker.addr, "session-", n).await?;
            stop(broker).await?;
            println!(
                "| {name} | {n} | {} | {} | {} | {:.2}% of a core | {resumed} of {resumed} | {} | {snapshots} | {} |",
                ms(restarted_in),
                mib(resident as f64),
                mib(peak as f64),
                idle * 100.0,
                ms(stopped_in),
                ms(ended_in)
            );
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

/// How many sessions the sessions curve's current row has: its
/// publishers' topics go round them (a plain function pointer names each
/// message's topic).
static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// Session `session-<s>` resumes (session present) and gets its first
/// queued message.
async fn resume_one(addr: SocketAddr, s: usize) -> Result<(), Error> {
    let (mut conn, present) = Conn::connect(addr, &format!("session-{s}"), false).await?;
    if !present {
        return Err(format!("session-{s} was not kept").into());
    }
    let topic = format!("cmd/{s}/go");
    loop {
        match tokio::time::timeout(Duration::from_secs(30), conn.next()).await?? {
            Packet::Publish(p) if *p.topic == *topic => {
                conn.send(&Packet::PubAck(PubAck::new(p.packet_id))).await?;
                return Ok(());
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------- commands

/// Connections that hold the devices' subscriptions, device `i`'s on
/// connection `i % HOLDERS`: as many devices as connections up to it.
const HOLDERS: usize = 1_000;

/// Commands sent at each size, each to one device's topic.
const COMMANDS: usize = 100_000;

/// QoS 1 commands the sender keeps unacknowledged.
const COMMAND_WINDOW: usize = 500;

fn command_filter(device: usize) -> String {
    format!("cmd/dev-{device}/#")
}

fn command_topic(device: usize) -> String {
    format!("cmd/dev-{device}/set")
}

/// The devices `n` commands go to, spread over `devices` as a
/// deterministic pseudo-random walk (xorshift), the same in every row.
fn command_targets(n: usize, devices: usize) -> Vec<usize> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % devices as u64) as usize
        })
        .collect()
}

async fn commands(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    println!(
        "\n## Commands to devices ({COMMANDS} QoS 1 commands to cmd/dev-<random device>/set; \
         each device subscribed to cmd/dev-<i>/# at QoS 1, the subscriptions held by at most \
         {HOLDERS} connections)"
    );
    println!(
        "| broker | devices | subscribe all | RSS per subscription | commands/s | broker CPU a command |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    // The commands kept in an append channel `cmd` on a memory provider,
    // each holder a durable consumer of its devices' filters, rather than
    // sent to broadcast subscriptions.
    let channel = std::env::var_os("SAGUIN_BENCH_COMMANDS_CHANNEL").is_some();
    if channel {
        println!("(saguin: `cmd` an append channel on a memory provider; Mosquitto: subscribed)");
    }
    let baseline = bench_support::baseline()?;
    let dir = tempfile::tempdir()?;
    for &n in sizes {
        for name in rows(&baseline, mosquitto) {
            let data = dir.path().join(format!("{name}-commands-{n}"));
            let storage = match channel {
                true => format!(
                    "storage:\n{}channels:\n  - name: cmd\n    kind: append\n    storage: p\n",
                    provider_storage("memory", &data)
                ),
                false => String::new(),
            };
            let config = saguin_config(
                &data,
                &format!(
                    "limits:\n  max_connections: {}\n  max_subscriptions_per_session: {}\n{storage}",
                    HOLDERS + 100,
                    n.div_ceil(HOLDERS) + 1
                ),
            )?;
            // Each command is a small write to one device's socket:
            // without TCP_NODELAY (off by default in Mosquitto, always on
            // in saguin) they wait on the devices' delayed ACKs.
            let which = row(
                name,
                &config,
                &baseline,
                "persistence false\nmax_connections -1\nset_tcp_nodelay true\n",
            );
            let broker = launch(&which, &data).await?;
            let pid = pid_of(&broker)?;
            let holders = connect_holders(broker.addr, n.min(HOLDERS)).await?;
            let before = rss(pid)?;
            let began = Instant::now();
            let holders = subscribe_devices(holders, n).await?;
            let subscribed_in = began.elapsed();
            let subscribed = rss(pid)?;
            let cpu_before = cpu_time(pid)?;
            let began = Instant::now();
            let holders =
                send_commands(broker.addr, holders, &command_targets(COMMANDS, n)).await?;
            let took = began.elapsed();
            let cpu = cpu_time(pid)? - cpu_before;
            drop(holders);
            println!(
                "| {name} | {n} | {} | {:.0} B | {:.0} | {:.2} µs |",
                ms(subscribed_in),
                subscribed.saturating_sub(before) as f64 / n as f64,
                COMMANDS as f64 / took.as_secs_f64(),
                cpu.as_secs_f64() * 1e6 / COMMANDS as f64
            );
            stop(broker).await?;
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

/// `count` connections to hold the devices' subscriptions, 64 connecting
/// at a time; holder `h` is `holders[h]`.
async fn connect_holders(addr: SocketAddr, count: usize) -> Result<Vec<Conn>, Error> {
    connect_many(count, move |h| async move {
        Ok(Conn::connect(addr, &format!("holder-{h}"), true).await?.0)
    })
    .await
}

/// Subscribes device `i`'s filter on holder `i % holders.len()` for every
/// device below `devices`, 100 filters a SUBSCRIBE, every holder at once;
/// returns once each SUBACK granted them all.
async fn subscribe_devices(holders: Vec<Conn>, devices: usize) -> Result<Vec<Conn>, Error> {
    const FILTERS_A_PACKET: usize = 100;
    let count = holders.len();
    let mut tasks = Vec::new();
    for (h, mut conn) in holders.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mine: Vec<usize> = (h..devices).step_by(count).collect();
            let mut packets = Vec::new();
            for (k, chunk) in mine.chunks(FILTERS_A_PACKET).enumerate() {
                packets.push(Packet::Subscribe(Subscribe {
                    packet_id: (k % usize::from(u16::MAX)) as u16 + 1,
                    filters: chunk
                        .iter()
                        .map(|&i| SubscribeFilter {
                            filter: command_filter(i),
                            options: SubscriptionOptions {
                                qos: QoS::AtLeastOnce,
                                ..SubscriptionOptions::default()
                            },
                        })
                        .collect(),
                    properties: SubscribeProperties::default(),
                }));
            }
            conn.send_all(&packets).await?;
            for _ in &packets {
                match tokio::time::timeout(Duration::from_secs(300), conn.next()).await?? {
                    Packet::SubAck(ack) if !ack.reasons.iter().any(|r| r.is_error()) => {}
                    other => {
                        return Err(format!(
                            "holder-{h}: expected a SUBACK granting all, got {other:?}"
                        )
                        .into())
                    }
                }
            }
            Ok::<_, Error>((h, conn))
        }));
    }
    let mut all = Vec::with_capacity(count);
    for task in tasks {
        all.push(task.await??);
    }
    all.sort_unstable_by_key(|(h, _)| *h);
    Ok(all.into_iter().map(|(_, conn)| conn).collect())
}

/// Sends a QoS 1 command to each of `targets` from one connection, keeping
/// [`COMMAND_WINDOW`] unacknowledged, and returns once every command has
/// reached its device's holder, each acknowledged by it. Gives the holders
/// back still connected: a holder that went as soon as it had its commands
/// would have the broker drop its subscriptions while the rest are
/// measured.
async fn send_commands(
    addr: SocketAddr,
    holders: Vec<Conn>,
    targets: &[usize],
) -> Result<Vec<Conn>, Error> {
    let mut expected = vec![0usize; holders.len()];
    for &device in targets {
        expected[device % holders.len()] += 1;
    }
    let mut receivers = Vec::new();
    for (h, (mut conn, count)) in holders.into_iter().zip(expected).enumerate() {
        receivers.push(tokio::spawn(async move {
            let (who, mut received) = (format!("holder-{h}"), 0);
            while received < count {
                received += acknowledge_messages(&mut conn, &who, |_| true).await?;
            }
            Ok::<Conn, Error>(conn)
        }));
    }
    let (mut sender, _) = Conn::connect(addr, "commander", true).await?;
    for chunk in targets.chunks(COMMAND_WINDOW) {
        let topics = chunk.iter().map(|&device| command_topic(device));
        publish_window(&mut sender, topics, false, "commander").await?;
    }
    let mut holders = Vec::with_capacity(receivers.len());
    for receiver in receivers {
        holders.push(tokio::time::timeout(Duration::from_secs(300), receiver).await???);
    }
    Ok(holders)
}

// ---------------------------------------------------------------- telemetry

/// How long each telemetry row is measured, after a warm-up as long, at
/// least: ten of the devices' intervals.
const TELEMETRY_WINDOW: Duration = Duration::from_secs(10);

/// How often each device publishes: `SAGUIN_BENCH_TELEMETRY_EVERY`
/// seconds, 1 by default.
fn telemetry_interval() -> Result<Duration, Error> {
    match std::env::var("SAGUIN_BENCH_TELEMETRY_EVERY") {
        Ok(every) => Ok(Duration::try_from_secs_f64(every.parse()?)
            .map_err(|e| format!("SAGUIN_BENCH_TELEMETRY_EVERY={every}: {e}"))?),
        Err(_) => Ok(Duration::from_secs(1)),
    }
}

fn telemetry_topic(device: usize) -> String {
    format!("site/{}/device/{device}/telemetry", device % 100)
}

async fn telemetry(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    raise_open_file_limit();
    let limit = open_file_limit();
    // Each device is a descriptor in the broker and one here.
    let cap = limit.saturating_sub(1_000) as usize;
    let every = telemetry_interval()?;
    let window = TELEMETRY_WINDOW.max(every * 10);
    println!(
        "\n## Telemetry from devices (each device a connection publishing a 64 B QoS 1 message \
         every {every:?} to site/<i mod 100>/device/<i>/telemetry, one backend subscribed to \
         site/+/device/+/telemetry at QoS 1; measured over {window:?} after a warm-up as long)"
    );
    let mut sizes: Vec<usize> = sizes.iter().map(|&n| n.min(cap)).collect();
    sizes.dedup();
    if sizes.contains(&cap) {
        println!("capped at {cap}: the open-file limit is {limit}");
    }
    println!(
        "| broker | devices | messages/s to the backend | broker CPU | broker CPU a message | RSS per device | PUBACK p50 | PUBACK p99 |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let baseline = bench_support::baseline()?;
    let dir = tempfile::tempdir()?;
    for &n in &sizes {
        for name in rows(&baseline, mosquitto) {
            let data = dir.path().join(format!("{name}-telemetry-{n}"));
            let config =
                saguin_config(&data, &format!("limits:\n  max_connections: {}\n", n + 100))?;
            // As in the commands curve: small writes, each its own.
            let which = row(
                name,
                &config,
                &baseline,
                "persistence false\nmax_connections -1\nset_tcp_nodelay true\n",
            );
            let broker = launch(&which, &data).await?;
            let pid = pid_of(&broker)?;
            let before = rss(pid)?;
            let row = run_telemetry(broker.addr, pid, n, every, window).await?;
            let resident = rss(pid)?;
            stop(broker).await?;
            println!(
                "| {name} | {n} | {:.0} | {:.1}% of a core | {:.1} µs | {:.0} B | {:.2} ms | {:.2} ms |",
                row.received as f64 / row.window.as_secs_f64(),
                row.cpu.as_secs_f64() * 100.0 / row.window.as_secs_f64(),
                row.cpu.as_secs_f64() * 1e6 / row.received.max(1) as f64,
                resident.saturating_sub(before) as f64 / n as f64,
                row.puback_p50.as_secs_f64() * 1e3,
                row.puback_p99.as_secs_f64() * 1e3,
            );
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

struct TelemetryRow {
    window: Duration,
    /// Messages the backend received in the window.
    received: u64,
    /// The broker's CPU time in the window.
    cpu: Duration,
    puback_p50: Duration,
    puback_p99: Duration,
}

/// Connects `n` devices and a backend to the broker `pid` at `addr`, has
/// each device publish `every` (the devices spread evenly over it), and
/// measures `window` after a warm-up as long.
async fn run_telemetry(
    addr: SocketAddr,
    pid: u32,
    n: usize,
    every: Duration,
    window: Duration,
) -> Result<TelemetryRow, Error> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let (mut backend, _) = Conn::connect(addr, "telemetry-backend", true).await?;
    subscribe_acked(
        &mut backend,
        "site/+/device/+/telemetry",
        QoS::AtLeastOnce,
        "backend",
    )
    .await?;
    let received = Arc::new(AtomicU64::new(0));
    let stopping = Arc::new(AtomicBool::new(false));
    // Runs until aborted: a read or write that fails ends it with the error.
    let backend_task: tokio::task::JoinHandle<Result<(), Error>> = {
        let received = received.clone();
        tokio::spawn(async move {
            loop {
                let got = acknowledge_messages(&mut backend, "backend", |_| true).await?;
                received.fetch_add(got as u64, Ordering::Relaxed);
            }
        })
    };
    let devices = connect_idle(addr, n, false).await?;
    let began = tokio::time::Instant::now();
    let measure_from = began + window;
    let measure_to = measure_from + window;
    let mut tasks = Vec::with_capacity(n);
    for (i, mut device) in devices.into_iter().enumerate() {
        let stopping = stopping.clone();
        tasks.push(tokio::spawn(async move {
            let first = began + every.mul_f64(i as f64 / n as f64);
            let mut ticks = tokio::time::interval_at(first, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut latencies = Vec::new();
            let mut packet_id: u16 = 0;
            while !stopping.load(Ordering::Relaxed) {
                let tick = ticks.tick().await;
                packet_id = packet_id.wrapping_add(1).max(1);
                let sent = Instant::now();
                device
                    .send(&Packet::Publish(Publish {
                        dup: false,
                        qos: QoS::AtLeastOnce,
                        retain: false,
                        topic: telemetry_topic(i).into(),
                        packet_id,
                        properties: PublishProperties::default(),
                        payload: Bytes::from_static(&PAYLOAD),
                    }))
                    .await?;
                match device.next().await? {
                    Packet::PubAck(ack) if !ack.reason.is_error() => {}
                    other => {
                        return Err::<_, Error>(
                            format!("device {i}: expected PUBACK, got {other:?}").into(),
                        )
                    }
                }
                if tick >= measure_from && tick < measure_to {
                    latencies.push(sent.elapsed());
                }
            }
            Ok((device, latencies))
        }));
    }
    tokio::time::sleep_until(measure_from).await;
    let cpu_before = cpu_time(pid)?;
    let received_before = received.load(Ordering::Relaxed);
    tokio::time::sleep_until(measure_to).await;
    let cpu = cpu_time(pid)? - cpu_before;
    let in_window = received.load(Ordering::Relaxed) - received_before;
    stopping.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut still_connected = Vec::with_capacity(n);
    for task in tasks {
        let (device, mine) = tokio::time::timeout(Duration::from_secs(60), task).await???;
        latencies.extend(mine);
        still_connected.push(device);
    }
    if backend_task.is_finished() {
        backend_task.await??;
        return Err("the backend's connection ended".into());
    }
    backend_task.abort();
    drop(still_connected);
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    Ok(TelemetryRow {
        window,
        received: in_window,
        cpu,
        puback_p50: at(0.50),
        puback_p99: at(0.99),
    })
}

// ---------------------------------------------------------------- following

/// The kind of the following curve's channel
/// (`SAGUIN_BENCH_FOLLOWING_KIND`: `append`, the default, or `latest`).
fn following_kind() -> Result<String, Error> {
    match std::env::var("SAGUIN_BENCH_FOLLOWING_KIND") {
        Ok(kind) if kind == "append" || kind == "latest" => Ok(kind),
        Ok(kind) => Err(format!("SAGUIN_BENCH_FOLLOWING_KIND={kind}: append or latest").into()),
        Err(_) => Ok("append".to_owned()),
    }
}

/// Records a second the following curve's publisher sends
/// (`SAGUIN_BENCH_FOLLOWING_RATE`, 1,000 by default).
fn following_rate() -> Result<u64, Error> {
    match std::env::var("SAGUIN_BENCH_FOLLOWING_RATE") {
        Ok(rate) => Ok(rate
            .parse()
            .map_err(|e| format!("SAGUIN_BENCH_FOLLOWING_RATE={rate}: {e}"))?),
        Err(_) => Ok(1_000),
    }
}

/// One record in this many goes to a connected device; the others to
/// devices that are not connected (no consumer matches them).
const FOLLOWING_TO_A_DEVICE: u64 = 10;

async fn following(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    raise_open_file_limit();
    let limit = open_file_limit();
    // Each device is a descriptor in the broker and one here.
    let cap = limit.saturating_sub(1_000) as usize;
    let rate = following_rate()?;
    println!(
        "\n## Devices following a channel (each device a persistent MQTT 3.1.1 connection, keep \
         alive 60 s, consuming cmd/dev-<i>/# of an append channel `cmd` at QoS 1; a publisher \
         sends {rate} QoS 1 records of 64 B a second, one in {FOLLOWING_TO_A_DEVICE} to a random \
         connected device, the others to devices not connected; measured over \
         {TELEMETRY_WINDOW:?} after a warm-up as long. Mosquitto: persistent sessions subscribed \
         at QoS 1, persistence on)"
    );
    let mut sizes: Vec<usize> = sizes.iter().map(|&n| n.min(cap)).collect();
    sizes.dedup();
    if sizes.contains(&cap) {
        println!("capped at {cap}: the open-file limit is {limit}");
    }
    println!(
        "| broker | devices | connect and subscribe all | RSS per device, served | parked | RSS per device, parked | records/s | broker CPU | broker CPU a record | delivered | end every session |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    // The devices' sessions subscribed to broadcast topics rather than
    // consuming a channel: what the channel adds to each.
    let kind = following_kind()?;
    let crash = std::env::var_os("SAGUIN_BENCH_FOLLOWING_CRASH").is_some();
    let channel = match std::env::var_os("SAGUIN_BENCH_FOLLOWING_BROADCAST") {
        Some(_) => {
            println!("(saguin: no channel, the records broadcast to persistent sessions)");
            String::new()
        }
        None => {
            if kind != "append" {
                println!("(saguin: `cmd` a {kind} channel)");
            }
            format!("channels:\n  - name: cmd\n    kind: {kind}\n    storage: p\n")
        }
    };
    let baseline = bench_support::baseline()?;
    let mut brokers = provider_rows(&baseline);
    if mosquitto && row_wanted("mosquitto") {
        brokers.push("mosquitto");
    }
    let dir = tempfile::tempdir()?;
    for &n in &sizes {
        for &name in &brokers {
            let data = dir.path().join(format!("{name}-following-{n}"));
            let metrics_port = bench_support::free_port()?;
            let config = saguin_config(
                &data,
                &format!(
                    "limits:\n  max_connections: {}\n  max_sessions: {}\nstorage:\n{}broker:\n  \
                     session_storage: p\nmetrics:\n  bind: 127.0.0.1:{metrics_port}\n{}",
                    n + 100,
                    n + 100,
                    provider_storage(name, &data),
                    channel
                ),
            )?;
            let which = match name {
                "mosquitto" => Which::Mosquitto {
                    extra: "persistence true\nmax_connections -1\nset_tcp_nodelay true\n",
                },
                _ => Which::Saguin {
                    config: &config,
                    bin: provider_bin(name, &baseline),
                },
            };
            let broker = launch(&which, &data).await?;
            let pid = pid_of(&broker)?;
            let before = rss(pid)?;
            let began = Instant::now();
            let devices = connect_following(broker.addr, n).await?;
            let connected_in = began.elapsed();
            let served = rss(pid)?;
            // A site's devices are quiet most of the time: each is
            // measured once saguin has parked them all.
            let parked = match which {
                Which::Saguin { .. } => all_parked(metrics_port, n).await,
                Which::Mosquitto { .. } => None,
            };
            let resident = rss(pid)?;
            // Mosquitto's restart is not what the row measures.
            let crash = crash && matches!(which, Which::Saguin { .. });
            let row = run_following(broker.addr, pid, devices, rate, crash).await?;
            let broker = match crash {
                false => broker,
                true => {
                    let mut killed = broker;
                    killed.child.wait().await?;
                    let broker = launch(&which, &data).await?;
                    let after = catch_up(broker.addr, pid_of(&broker)?, n).await?;
                    println!(
                        "| {name} | {n} | after kill -9: started in {}, every device back in {}, \
                         every device caught up in {}, broker CPU {} |",
                        ms(broker.started_in),
                        ms(after.reconnected),
                        ms(after.caught_up),
                        ms(after.cpu)
                    );
                    broker
                }
            };
            let ended_in = end_sessions(broker.addr, "dev-", n).await?;
            stop(broker).await?;
            println!(
                "| {name} | {n} | {} | {:.0} B | {} | {:.0} B | {:.0} | {:.1} ms a second | {:.1} µs | {} of {} | {} |",
                ms(connected_in),
                served.saturating_sub(before) as f64 / n as f64,
                parked.map_or("-".to_owned(), |p| p.to_string()),
                resident.saturating_sub(before) as f64 / n as f64,
                row.records as f64 / TELEMETRY_WINDOW.as_secs_f64(),
                row.cpu.as_secs_f64() * 1e3 / TELEMETRY_WINDOW.as_secs_f64(),
                row.cpu.as_secs_f64() * 1e6 / row.records.max(1) as f64,
                row.delivered,
                row.to_devices,
                ms(ended_in),
            );
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

struct CaughtUp {
    /// From the first device's CONNECT to the last one's CONNACK.
    reconnected: Duration,
    /// From the first CONNECT to the last device's marker received.
    caught_up: Duration,
    /// The broker's CPU time over the same.
    cpu: Duration,
}

/// The topic of the record that tells device `i` it has caught up: sent
/// after every device is back, it reaches the device only once the device
/// has passed every record before it.
fn marker_topic(i: usize) -> String {
    format!("cmd/dev-{i}/caught-up")
}

/// After a crash: every device `dev-<i>` comes back to its session,
/// acknowledging whatever it is sent; once all are back, one record
/// ([`marker_topic`]) is published to each, and the wait ends when every
/// device has received its own (so has passed everything before it).
async fn catch_up(addr: SocketAddr, pid: u32, n: usize) -> Result<CaughtUp, Error> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let cpu_before = cpu_time(pid)?;
    let began = Instant::now();
    let devices = connect_many(n, move |i| async move {
        let (conn, _) = Conn::connect_with(addr, &format!("dev-{i}"), false, 60, V).await?;
        Ok(conn)
    })
    .await?;
    let reconnected = began.elapsed();
    // Told of every device's marker and of every failure.
    let progress = Arc::new(tokio::sync::Notify::new());
    let marked = Arc::new(AtomicUsize::new(0));
    let readers: Vec<tokio::task::JoinHandle<Result<(), Error>>> = devices
        .into_iter()
        .enumerate()
        .map(|(i, mut device)| {
            let (progress, marked) = (progress.clone(), marked.clone());
            tokio::spawn(async move {
                let who = format!("dev-{i}");
                let marker = marker_topic(i);
                loop {
                    let seen = std::sync::atomic::AtomicBool::new(false);
                    let got = acknowledge_messages(&mut device, &who, |p| {
                        if *p.topic == *marker {
                            seen.store(true, Ordering::Relaxed);
                        }
                        true
                    })
                    .await;
                    if seen.load(Ordering::Relaxed) {
                        marked.fetch_add(1, Ordering::Relaxed);
                    }
                    progress.notify_one();
                    got?;
                }
            })
        })
        .collect();
    publish_range(addr, 0..n, false, marker_topic).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while marked.load(Ordering::Relaxed) < n {
        if let Some(i) = readers.iter().position(|r| r.is_finished()) {
            return Err(format!("dev-{i} after the restart: went away").into());
        }
        if tokio::time::timeout_at(deadline, progress.notified())
            .await
            .is_err()
        {
            return Err(format!(
                "{} of {n} devices caught up ten minutes after the restart",
                marked.load(Ordering::Relaxed)
            )
            .into());
        }
    }
    let caught_up = began.elapsed();
    let cpu = cpu_time(pid)? - cpu_before;
    for reader in readers {
        reader.abort();
    }
    Ok(CaughtUp {
        reconnected,
        caught_up,
        cpu,
    })
}

/// Every client `<prefix><i>` below `n`, gone, comes back clean, 64 at a
/// time, which ends its session (and its consumers of channels), and
/// goes: the time to the last CONNACK.
async fn end_sessions(addr: SocketAddr, prefix: &'static str, n: usize) -> Result<Duration, Error> {
    const CONNECTORS: usize = 64;
    let began = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CONNECTORS.min(n) {
        tasks.push(tokio::spawn(async move {
            for i in (c..n).step_by(CONNECTORS) {
                let (mut conn, _) = Conn::connect(addr, &format!("{prefix}{i}"), true).await?;
                conn.send(&Packet::Disconnect(Disconnect::new(
                    ReasonCode::NORMAL_DISCONNECTION,
                )))
                .await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(began.elapsed())
}

/// `n` persistent sessions `dev-<i>` (keep alive 60 s), 64 connecting at
/// a time, each consuming [`command_filter`]`(i)` at QoS 1 (its SUBACK
/// read); device `i` is the `i`th.
async fn connect_following(addr: SocketAddr, n: usize) -> Result<Vec<Conn>, Error> {
    connect_many(n, move |i| async move {
        let id = format!("dev-{i}");
        let (mut conn, _) = Conn::connect_with(addr, &id, false, 60, V).await?;
        subscribe_acked(&mut conn, &command_filter(i), QoS::AtLeastOnce, &id).await?;
        Ok(conn)
    })
    .await
}

struct FollowingRow {
    /// Records published (and acknowledged) in the window.
    records: u64,
    /// The broker's CPU time in the window.
    cpu: Duration,
    /// Records sent to connected devices over the whole run, and how
    /// many of them the devices received.
    to_devices: u64,
    delivered: u64,
}

/// Has each of `devices` acknowledge what it is sent while a publisher
/// sends `rate` records a second (paced every 10 ms), and measures the
/// broker `pid`'s CPU over [`TELEMETRY_WINDOW`] after a warm-up as long.
/// Every record sent to a device must reach it: a short count fails.
async fn run_following(
    addr: SocketAddr,
    pid: u32,
    devices: Vec<Conn>,
    rate: u64,
    crash: bool,
) -> Result<FollowingRow, Error> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let n = devices.len();
    // Told of every delivery, acknowledgement and failure below.
    let progress = Arc::new(tokio::sync::Notify::new());
    let delivered = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::with_capacity(n);
    for (i, mut device) in devices.into_iter().enumerate() {
        let delivered = delivered.clone();
        let topic = format!("cmd/dev-{i}/");
        let progress = progress.clone();
        let reader: tokio::task::JoinHandle<Result<(), Error>> = tokio::spawn(async move {
            let who = format!("dev-{i}");
            loop {
                let got = acknowledge_messages(&mut device, &who, |p| {
                    p.topic.starts_with(topic.as_str())
                })
                .await;
                // Whatever happened, the wait at the end looks again.
                progress.notify_one();
                delivered.fetch_add(got? as u64, Ordering::Relaxed);
            }
        });
        readers.push(reader);
    }

    let (publisher, _) = Conn::connect(addr, "following-publisher", true).await?;
    let (mut acks, mut out) = publisher.into_split();
    let acked = Arc::new(AtomicU64::new(0));
    let ack_reader: tokio::task::JoinHandle<Result<(), Error>> = {
        let (acked, progress) = (acked.clone(), progress.clone());
        tokio::spawn(async move {
            loop {
                let packet = acks.next().await;
                progress.notify_one();
                match packet? {
                    Packet::PubAck(ack) if !ack.reason.is_error() => {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        return Err(format!("publisher: expected PUBACK, got {other:?}").into())
                    }
                }
            }
        })
    };
    let stopping = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    // Gives its write half back: dropped, it would end the connection
    // before every acknowledgement is read.
    let writer: tokio::task::JoinHandle<Result<_, Error>> = {
        let (stopping, sent) = (stopping.clone(), sent.clone());
        tokio::spawn(async move {
            let targets = std::iter::repeat_with({
                let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
                move || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state
                }
            });
            let mut targets = targets.map(|r| (r % n as u64) as usize);
            let began = tokio::time::Instant::now();
            let mut ticks = tokio::time::interval(Duration::from_millis(10));
            let (mut written, mut to_devices) = (0u64, 0u64);
            while !stopping.load(Ordering::Relaxed) {
                ticks.tick().await;
                let due = (began.elapsed().as_secs_f64() * rate as f64) as u64;
                let mut buf = BytesMut::new();
                while written < due {
                    let topic = if written % FOLLOWING_TO_A_DEVICE == 0 {
                        to_devices += 1;
                        command_topic(targets.next().unwrap_or(0))
                    } else {
                        format!("cmd/away-{}/set", written % 1_000)
                    };
                    codec::encode(
                        &Packet::Publish(Publish {
                            dup: false,
                            qos: QoS::AtLeastOnce,
                            retain: false,
                            topic: topic.into(),
                            packet_id: (written % u64::from(u16::MAX)) as u16 + 1,
                            properties: PublishProperties::default(),
                            payload: Bytes::from_static(&PAYLOAD),
                        }),
                        V,
                        &mut buf,
                    )?;
                    written += 1;
                }
                out.write_all(&buf).await?;
                sent.store(written, Ordering::Relaxed);
            }
            Ok((to_devices, out))
        })
    };

    let measure_from = tokio::time::Instant::now() + TELEMETRY_WINDOW;
    tokio::time::sleep_until(measure_from).await;
    let cpu_before = cpu_time(pid)?;
    let acked_before = acked.load(Ordering::Relaxed);
    tokio::time::sleep_until(measure_from + TELEMETRY_WINDOW).await;
    let cpu = cpu_time(pid)? - cpu_before;
    let records = acked.load(Ordering::Relaxed) - acked_before;
    stopping.store(true, Ordering::Relaxed);
    let (to_devices, _publishing) =
        tokio::time::timeout(Duration::from_secs(60), writer).await???;
    let total = sent.load(Ordering::Relaxed);

    // Everything sent is acknowledged, and every record sent to a device
    // reaches it, within a minute: looked at again whenever a device or
    // the publisher is sent something or fails.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::Relaxed) < total || delivered.load(Ordering::Relaxed) < to_devices {
        if let Some(i) = readers.iter().position(|r| r.is_finished()) {
            return Err(format!("dev-{i}: {:?}", readers.swap_remove(i).await?).into());
        }
        if ack_reader.is_finished() {
            return Err(format!("publisher: {:?}", ack_reader.await?).into());
        }
        if tokio::time::timeout_at(deadline, progress.notified())
            .await
            .is_err()
        {
            break;
        }
    }
    let delivered = delivered.load(Ordering::Relaxed);
    if crash {
        // Killed with every device connected: its place is what the
        // broker last wrote of it, not what it writes as a device goes.
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
    for reader in readers {
        reader.abort();
    }
    ack_reader.abort();
    let acked = acked.load(Ordering::Relaxed);
    if acked < total || delivered < to_devices {
        return Err(format!(
            "after a minute {acked} of {total} records acknowledged, {delivered} of the \
             {to_devices} sent to devices delivered"
        )
        .into());
    }
    Ok(FollowingRow {
        records,
        cpu,
        to_devices,
        delivered,
    })
}

// ---------------------------------------------------------------- payloads

/// Bytes each payload row moves, at least 1,000 and at most 100,000
/// messages of its size.
const PAYLOAD_BUDGET: usize = 1 << 30;

/// QoS 1 messages the publisher of a payload row keeps unacknowledged.
const PAYLOAD_WINDOW: usize = 100;

async fn payloads(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    println!(
        "\n## Payload sizes (one publisher, {PAYLOAD_WINDOW} QoS 1 messages unacknowledged, to \
         one QoS 1 subscriber; {} MiB or 1,000-100,000 messages a row)",
        PAYLOAD_BUDGET >> 20
    );
    println!(
        "| broker | payload | messages | messages/s | MiB/s | broker CPU a message | broker CPU a MiB | peak RSS above the empty broker's |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let baseline = bench_support::baseline()?;
    let dir = tempfile::tempdir()?;
    for &size in sizes {
        let count = (PAYLOAD_BUDGET / size.max(1)).clamp(1_000, 100_000);
        let mosquitto_extra = format!(
            "persistence false\nset_tcp_nodelay true\nmax_queued_messages {count}\nmax_queued_bytes 0\n"
        );
        for name in rows(&baseline, mosquitto) {
            let data = dir.path().join(format!("{name}-payload-{size}"));
            // Room for the largest payload asked for, and its topic, and
            // for a subscriber behind by the whole row: the broker
            // acknowledges a QoS 1 publish once it has routed it, so the
            // publisher's window does not bound the subscriber's queue,
            // and a queue at its bound drops (counted) what would make
            // the row come out short.
            let config = saguin_config(
                &data,
                &format!(
                    "limits:\n  max_message_size: {}\n  max_queued_messages: {}\n",
                    size + 1024,
                    count
                ),
            )?;
            let which = row(name, &config, &baseline, &mosquitto_extra);
            let broker = launch(&which, &data).await?;
            let pid = pid_of(&broker)?;
            let before = rss(pid)?;
            let cpu_before = cpu_time(pid)?;
            let took = move_payloads(broker.addr, size, count).await?;
            let cpu = cpu_time(pid)? - cpu_before;
            let peak = peak_rss(pid)?;
            stop(broker).await?;
            let mib = (size * count) as f64 / (1 << 20) as f64;
            println!(
                "| {name} | {size} B | {count} | {:.0} | {:.1} | {:.2} µs | {:.2} ms | {} |",
                count as f64 / took.as_secs_f64(),
                mib / took.as_secs_f64(),
                cpu.as_secs_f64() * 1e6 / count as f64,
                cpu.as_secs_f64() * 1e3 / mib,
                self::mib(peak.saturating_sub(before) as f64),
            );
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

/// Publishes `count` QoS 1 messages of `size` bytes to one subscriber,
/// [`PAYLOAD_WINDOW`] unacknowledged; the time from the first publish to
/// the subscriber's last message.
async fn move_payloads(addr: SocketAddr, size: usize, count: usize) -> Result<Duration, Error> {
    const TOPIC: &str = "bench/payloads";
    let (mut subscriber, _) = Conn::connect(addr, "payload-subscriber", true).await?;
    subscribe_acked(&mut subscriber, TOPIC, QoS::AtLeastOnce, "subscriber").await?;
    let receiver = tokio::spawn(async move {
        let mut received = 0;
        while received < count {
            let of_size = |p: &Publish| p.payload.len() == size;
            received += acknowledge_messages(&mut subscriber, "subscriber", of_size).await?;
        }
        Ok::<(), Error>(())
    });
    let payload = Bytes::from(vec![b'p'; size]);
    let (publisher, _) = Conn::connect(addr, "payload-publisher", true).await?;
    let (mut acks, mut writer) = publisher.into_split();
    let began = Instant::now();
    let mut sent = 0;
    let mut unacked = 0;
    while sent < count {
        let mut buf = BytesMut::new();
        while unacked < PAYLOAD_WINDOW && sent < count {
            codec::encode(
                &Packet::Publish(Publish {
                    dup: false,
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    topic: TOPIC.into(),
                    packet_id: (sent % PAYLOAD_WINDOW) as u16 + 1,
                    properties: PublishProperties::default(),
                    payload: payload.clone(),
                }),
                V,
                &mut buf,
            )?;
            sent += 1;
            unacked += 1;
        }
        writer.write_all(&buf).await?;
        match acks.next().await? {
            Packet::PubAck(ack) if !ack.reason.is_error() => unacked -= 1,
            other => return Err(format!("publisher: expected PUBACK, got {other:?}").into()),
        }
    }
    tokio::time::timeout(Duration::from_secs(300), receiver).await???;
    Ok(began.elapsed())
}

// ---------------------------------------------------------------- jobs

/// Jobs one worker takes off the head of each row's backlog, one refuses
/// after that and one takes behind those (a quarter of the backlog each
/// where that is fewer).
const JOBS_TAKEN: usize = 10_000;

fn job_topic(i: usize) -> String {
    format!("jobs/site{}/job{i}", i % 100)
}

async fn jobs(sizes: &[usize]) -> Result<(), Error> {
    println!("\n## One queue channel with a backlog (64 B jobs)");
    println!(
        "| provider | jobs waiting | startup | RSS | peak RSS in startup | first job | taken by one worker | refused by one | taken behind the refused | refused for the last time | graceful stop | fill rate |"
    );
    println!(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let baseline = bench_support::baseline()?;
    for provider in provider_rows(&baseline) {
        let bin = provider_bin(provider, &baseline);
        let dir = tempfile::tempdir()?;
        let data = dir.path().join(provider);
        let storage = provider_storage(provider, &data);
        let metrics: SocketAddr = format!("127.0.0.1:{}", bench_support::free_port()?).parse()?;
        let config = saguin_config(
            &data,
            &format!(
                "storage:\n{storage}channels:\n  - name: jobs\n    kind: queue\n    storage: p\n    lease: 1h\n    backoff: [1h]\n    max_attempts: 100\n  - name: spent\n    kind: queue\n    storage: p\n    max_attempts: 1\nmetrics:\n  bind: {metrics}\n"
            ),
        )?;
        let which = Which::Saguin {
            config: &config,
            bin,
        };
        for &n in sizes {
            let broker = launch(&which, &data).await?;
            // What the rows before left waiting, as the provider counted it
            // when it opened: every resolution of theirs committed by their
            // graceful stop.
            let waiting = bench_support::scrape(metrics, "saguin_queue_depth")
                .await
                .ok_or("no saguin_queue_depth")? as usize;
            let began = Instant::now();
            publish_many(broker.addr, n - waiting, false, job_topic).await?;
            let fill_rate = (n - waiting) as f64 / began.elapsed().as_secs_f64();
            let depth = bench_support::scrape(metrics, "saguin_queue_depth")
                .await
                .ok_or("no saguin_queue_depth")?;
            if depth as usize != n {
                return Err(format!("{provider}: the queue holds {depth} jobs, not {n}").into());
            }
            stop(broker).await?;

            let broker = launch(&which, &data).await?;
            let started_in = broker.started_in;
            let resident = rss(pid_of(&broker)?)?;
            let peak = peak_rss(pid_of(&broker)?)?;
            // A quarter each at the smaller sizes: what is taken, refused
            // and taken behind the refused comes from the backlog.
            let portion = JOBS_TAKEN.min(n / 4);
            let (first, taken, taking) = take_jobs(broker.addr, portion).await?;
            let (refused, refusing) = refuse_jobs(broker.addr, "jobs/#", portion).await?;
            let (_, taken_behind, taking_behind) = take_jobs(broker.addr, portion).await?;
            let dead_lettering = dead_letter_jobs(broker.addr, portion).await?;
            let stopped_in = stop(broker).await?;
            println!(
                "| {provider} | {n} | {} | {} | {} | {} | {:.0}/s | {:.0}/s | {:.0}/s | {:.0}/s | {} | {:.0}/s |",
                ms(started_in),
                mib(resident as f64),
                mib(peak as f64),
                ms(first),
                taken as f64 / taking.as_secs_f64(),
                refused as f64 / refusing.as_secs_f64(),
                taken_behind as f64 / taking_behind.as_secs_f64(),
                portion as f64 / dead_lettering.as_secs_f64(),
                ms(stopped_in),
                fill_rate
            );
        }
    }
    Ok(())
}

/// The Receive Maximum of the MQTT 5 worker that refuses jobs: the
/// window the broker gives an MQTT 3.1.1 worker by default. With MQTT 5's
/// default of 65,535, a build that honoured it leased the worker every
/// job it had, and the jobs it held when it went away were released to
/// wait out the hour's backoff too: a backlog of 1,000 left the worker
/// behind it nothing to take.
const REFUSER_WINDOW: u16 = 64;

/// An MQTT 5 worker that subscribes to the queue and refuses at least
/// `count` jobs (PUBACK 0x80, what a worker whose downstream is down
/// answers), each read's in one write: how many, and the time it took.
/// The queue's backoff keeps them waiting at its head.
async fn refuse_jobs(
    addr: SocketAddr,
    filter: &str,
    count: usize,
) -> Result<(usize, Duration), Error> {
    let mut conn = Conn::connect_v5_receiving(addr, "scale-refuser", REFUSER_WINDOW).await?;
    let began = Instant::now();
    subscribe_acked(&mut conn, filter, QoS::AtLeastOnce, "refuser").await?;
    let mut refused = 0;
    while refused < count {
        let mut acks = Vec::new();
        let mut next = Some(conn.next().await?);
        while let Some(packet) = next {
            match packet {
                Packet::Publish(p) => acks.push(Packet::PubAck(PubAck {
                    packet_id: p.packet_id,
                    reason: saguin::broker::codec::ReasonCode::UnspecifiedError,
                    properties: Default::default(),
                })),
                other => return Err(format!("refuser: unexpected {other:?}").into()),
            }
            next = conn.try_next()?;
        }
        refused += acks.len();
        conn.send_all(&acks).await?;
    }
    Ok((refused, began.elapsed()))
}

fn spent_topic(i: usize) -> String {
    format!("spent/job{i}")
}

/// `count` jobs put in the queue `spent`, which allows one attempt, and
/// refused by a worker: the time from the worker's SUBSCRIBE until a
/// consumer of the dead-letter channel `spent.dlq` has been sent every one
/// (a record is sent once its move has committed).
async fn dead_letter_jobs(addr: SocketAddr, count: usize) -> Result<Duration, Error> {
    let (mut consumer, _) = Conn::connect(addr, "scale-dead-letters", true).await?;
    subscribe_acked(
        &mut consumer,
        "spent.dlq/#",
        QoS::AtLeastOnce,
        "dead letters",
    )
    .await?;
    publish_range(addr, 0..count, false, spent_topic).await?;
    let began = Instant::now();
    let consumed = tokio::spawn(async move {
        let mut received = 0;
        while received < count {
            received += acknowledge_messages(&mut consumer, "dead letters", |_| true).await?;
        }
        Ok::<Instant, Error>(Instant::now())
    });
    refuse_jobs(addr, "spent/#", count).await?;
    let last = tokio::time::timeout(Duration::from_secs(300), consumed).await???;
    Ok(last - began)
}

/// A worker that subscribes to the queue and takes at least `count` jobs,
/// acknowledging what each read brought in one write: the time from its
/// SUBSCRIBE to its first job, how many it took (the last read may bring
/// more), and the time it took them.
async fn take_jobs(addr: SocketAddr, count: usize) -> Result<(Duration, usize, Duration), Error> {
    let (mut conn, _) = Conn::connect(addr, "scale-worker", true).await?;
    let began = Instant::now();
    subscribe_acked(&mut conn, "jobs/#", QoS::AtLeastOnce, "worker").await?;
    let mut taken = acknowledge_messages(&mut conn, "worker", |_| true).await?;
    let first = began.elapsed();
    while taken < count {
        taken += acknowledge_messages(&mut conn, "worker", |_| true).await?;
    }
    Ok((first, taken, began.elapsed()))
}

// ---------------------------------------------------------------- latest

fn device_topic(i: usize) -> String {
    format!("devices/site-{}/d{i}", i / 100)
}

async fn latest(sizes: &[usize]) -> Result<(), Error> {
    println!("\n## One latest channel (a 64 B value for each device)");
    println!(
        "| provider | devices | startup | RSS | peak RSS in startup | one site's 100 values | every value | graceful stop | fill rate |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let baseline = bench_support::baseline()?;
    for provider in provider_rows(&baseline) {
        let bin = provider_bin(provider, &baseline);
        let dir = tempfile::tempdir()?;
        let data = dir.path().join(provider);
        let storage = provider_storage(provider, &data);
        let config = saguin_config(
            &data,
            &format!("storage:\n{storage}channels:\n  - name: devices\n    kind: latest\n    storage: p\n"),
        )?;
        let which = Which::Saguin {
            config: &config,
            bin,
        };
        let mut held = 0usize;
        for &n in sizes {
            let broker = launch(&which, &data).await?;
            let began = Instant::now();
            publish_range(broker.addr, held..n, false, device_topic).await?;
            let fill_rate = (n - held) as f64 / began.elapsed().as_secs_f64();
            held = n;
            stop(broker).await?;

            let broker = launch(&which, &data).await?;
            let started_in = broker.started_in;
            let resident = rss(pid_of(&broker)?)?;
            let peak = peak_rss(pid_of(&broker)?)?;
            let site = current_values(broker.addr, "devices/site-7/#", 100).await?;
            let every = current_values(broker.addr, "devices/#", n).await?;
            let stopped_in = stop(broker).await?;
            println!(
                "| {provider} | {n} | {} | {} | {} | {} | {} | {} | {:.0}/s |",
                ms(started_in),
                mib(resident as f64),
                mib(peak as f64),
                ms(site),
                ms(every),
                ms(stopped_in),
                fill_rate
            );
        }
    }
    Ok(())
}

/// A new QoS 1 subscriber to `filter`: the time from its SUBSCRIBE to its
/// `count`th current value, each acknowledged.
async fn current_values(addr: SocketAddr, filter: &str, count: usize) -> Result<Duration, Error> {
    let (mut conn, _) = Conn::connect(addr, "scale-viewer", true).await?;
    let began = Instant::now();
    subscribe_acked(&mut conn, filter, QoS::AtLeastOnce, "viewer").await?;
    let mut got = 0;
    while got < count {
        got += acknowledge_messages(&mut conn, "viewer", |_| true).await?;
    }
    Ok(began.elapsed())
}

// ---------------------------------------------------------------- wills

async fn wills(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    raise_open_file_limit();
    // Each device is a descriptor in the broker and one here.
    let cap = open_file_limit().saturating_sub(1_000) as usize;
    let mut sizes: Vec<usize> = sizes.iter().map(|&n| n.min(cap)).collect();
    sizes.dedup();
    println!(
        "\n## Devices lost at once (each with a retained QoS 1 Will, one backend on status/# at QoS 1){}",
        if sizes.contains(&cap) {
            format!("; capped at {cap} by the open-file limit")
        } else {
            String::new()
        }
    );
    println!("| broker | devices | every Will received | broker CPU a Will |");
    println!("| --- | ---: | ---: | ---: |");
    let dir = tempfile::tempdir()?;
    let mosquitto_extra = "persistence false\nset_tcp_nodelay true\nmax_queued_messages 0\n";
    for &n in &sizes {
        for name in rows(&None, mosquitto) {
            let data = dir.path().join(format!("{name}-wills-{n}"));
            let config = saguin_config(
                &data,
                &format!(
                    "limits:\n  max_connections: {}\n  max_queued_messages: {}\n  max_retained: {}\n",
                    n + 100,
                    n + 100,
                    n + 100
                ),
            )?;
            let which = row(name, &config, &None, mosquitto_extra);
            let broker = launch(&which, &data).await?;
            let pid = pid_of(&broker)?;
            let (mut backend, _) = Conn::connect(broker.addr, "wills-backend", true).await?;
            subscribe_acked(&mut backend, "status/#", QoS::AtLeastOnce, "backend").await?;
            let devices = connect_with_wills(broker.addr, n).await?;
            let cpu_before = cpu_time(pid)?;
            let began = Instant::now();
            drop(devices);
            let mut received = 0;
            while received < n {
                let of_a_device = |p: &Publish| p.topic.starts_with("status/dev-");
                received += acknowledge_messages(&mut backend, "backend", of_a_device).await?;
            }
            let took = began.elapsed();
            let cpu = cpu_time(pid)? - cpu_before;
            stop(broker).await?;
            println!(
                "| {name} | {n} | {} | {:.1} µs |",
                ms(took),
                cpu.as_secs_f64() * 1e6 / n as f64
            );
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

/// Connects `n` devices `dev-<i>`, each with a retained QoS 1 Will
/// `offline` on `status/dev-<i>`.
async fn connect_with_wills(addr: SocketAddr, n: usize) -> Result<Vec<Conn>, Error> {
    const CONNECTORS: usize = 64;
    let mut tasks = Vec::new();
    for c in 0..CONNECTORS {
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in (c..n).step_by(CONNECTORS) {
                let will = codec::LastWill {
                    topic: format!("status/dev-{i}").into(),
                    payload: Bytes::from_static(b"offline"),
                    qos: QoS::AtLeastOnce,
                    retain: true,
                    properties: Default::default(),
                };
                mine.push(Conn::connect_with_will(addr, &format!("dev-{i}"), will).await?);
            }
            Ok::<_, Error>(mine)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(all)
}

// ---------------------------------------------------------------- stalled

/// Messages published to the stalled subscriber of each row: more than its
/// window and a queue of 1,000 hold, so the bound is reached.
const STALLED_MESSAGES: usize = 2_000;

/// The byte bound of the bounded rows.
const STALLED_BYTES: usize = 16 << 20;

async fn stalled(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    println!(
        "\n## A subscriber that stops reading ({STALLED_MESSAGES} messages published to one \
         subscriber of their QoS that reads nothing after its SUBACK)"
    );
    println!(
        "| broker | subscriber | QoS | queue bound | payload | RSS above the empty broker's | peak RSS above it |"
    );
    println!("| --- | --- | ---: | --- | ---: | ---: | ---: |");
    let dir = tempfile::tempdir()?;
    let baseline = bench_support::baseline()?;
    let brokers = rows(&baseline, mosquitto);
    let subscribers = [
        (QoS::AtLeastOnce, ProtocolVersion::V311),
        (QoS::AtLeastOnce, ProtocolVersion::V5),
        (QoS::AtMostOnce, ProtocolVersion::V311),
    ];
    for (qos, version) in subscribers {
        for &size in sizes {
            for bound in [None, Some(STALLED_BYTES)] {
                for &name in &brokers {
                    let row = StalledRow {
                        qos,
                        version,
                        size,
                        bound,
                    };
                    stalled_row(dir.path(), name, &baseline, row).await?;
                }
            }
        }
    }
    Ok(())
}

/// One row of the stalled curve: the subscriber's QoS and protocol, the
/// payload's size and the queue's byte bound.
#[derive(Clone, Copy)]
struct StalledRow {
    qos: QoS,
    version: ProtocolVersion,
    size: usize,
    bound: Option<usize>,
}

async fn stalled_row(
    dir: &Path,
    name: &str,
    baseline: &Option<PathBuf>,
    row_of: StalledRow,
) -> Result<(), Error> {
    let StalledRow {
        qos,
        version,
        size,
        bound,
    } = row_of;
    let data = dir.join(format!(
        "{name}-stalled-{qos:?}-{version:?}-{size}-{bound:?}"
    ));
    let config = saguin_config(
        &data,
        &format!(
            "limits:\n  max_message_size: {}\n  max_queued_bytes: {}\n",
            size + 1024,
            bound.map_or("none".to_owned(), |b| b.to_string())
        ),
    )?;
    let mosquitto_extra = format!(
        "persistence false\nset_tcp_nodelay true\nmax_queued_bytes {}\n",
        bound.unwrap_or(0)
    );
    let which = row(name, &config, baseline, &mosquitto_extra);
    let broker = launch(&which, &data).await?;
    let pid = pid_of(&broker)?;
    let before = rss(pid)?;
    let subscriber = publish_to_a_stalled_subscriber(broker.addr, qos, version, size).await?;
    let after = rss(pid)?;
    let peak = peak_rss(pid)?;
    drop(subscriber);
    stop(broker).await?;
    println!(
        "| {name} | {} | {} | {} | {size} B | {} | {} |",
        match version {
            ProtocolVersion::V5 => "MQTT 5, no Receive Maximum",
            _ => "MQTT 3.1.1",
        },
        qos as u8,
        bound.map_or("1,000 messages".to_owned(), |b| format!(
            "1,000 messages, {}",
            self::mib(b as f64)
        )),
        self::mib(after.saturating_sub(before) as f64),
        self::mib(peak.saturating_sub(before) as f64),
    );
    std::fs::remove_dir_all(&data)?;
    Ok(())
}

/// Subscribes a client of `version` at `qos` that then reads nothing (an
/// MQTT 5 one naming no Receive Maximum), and publishes
/// [`STALLED_MESSAGES`] messages of `size` bytes to it at `qos`: at QoS 1
/// each acknowledged before the next, at QoS 0 followed by one QoS 1
/// message to another topic, acknowledged once the broker has routed
/// every one before it. Returns the subscriber, still connected.
async fn publish_to_a_stalled_subscriber(
    addr: SocketAddr,
    qos: QoS,
    version: ProtocolVersion,
    size: usize,
) -> Result<Conn, Error> {
    const TOPIC: &str = "bench/stalled";
    let (mut subscriber, _) =
        Conn::connect_with(addr, "stalled-subscriber", true, 120, version).await?;
    subscribe_acked(&mut subscriber, TOPIC, qos, "subscriber").await?;
    let payload = Bytes::from(vec![b's'; size]);
    let (mut publisher, _) = Conn::connect(addr, "stalled-publisher", true).await?;
    let count = match qos {
        QoS::AtMostOnce => STALLED_MESSAGES + 1,
        _ => STALLED_MESSAGES,
    };
    for i in 0..count {
        let packet_id = (i % 60_000) as u16 + 1;
        let (qos, topic) = match qos {
            QoS::AtMostOnce if i < STALLED_MESSAGES => (qos, TOPIC),
            QoS::AtMostOnce => (QoS::AtLeastOnce, "bench/stalled-marker"),
            _ => (qos, TOPIC),
        };
        publisher
            .send(&Packet::Publish(Publish {
                dup: false,
                qos,
                retain: false,
                topic: topic.into(),
                packet_id: if qos == QoS::AtMostOnce { 0 } else { packet_id },
                properties: PublishProperties::default(),
                payload: payload.clone(),
            }))
            .await?;
        if qos == QoS::AtMostOnce {
            continue;
        }
        match publisher.next().await? {
            Packet::PubAck(ack) if ack.packet_id == packet_id && !ack.reason.is_error() => {}
            other => {
                return Err(format!("publisher: expected PUBACK {packet_id}, got {other:?}").into())
            }
        }
    }
    Ok(subscriber)
}

// ---------------------------------------------------------------- sparse

/// What the sparse curve's publishers send at every row.
const SPARSE_MESSAGES: usize = 100_000;

/// One in how many messages of the sparse curve's current row goes to
/// the session (a plain function pointer names each message's topic).
static SPARSE_EVERY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// Waits until the provider's snapshot generation holds every change
/// (`saguin_snapshot_unsaved_seconds` reads 0), looking again at each
/// generation the broker commits, at most two minutes. A change not yet
/// held makes a generation come within `snapshot_max_delay`.
async fn snapshot_saved(broker: &mut Broker, metrics: SocketAddr) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        // Seen before the look: a commit after it wakes the wait below.
        broker.committed.borrow_and_update();
        if bench_support::scrape(metrics, "saguin_snapshot_unsaved_seconds").await == Some(0.0) {
            return Ok(());
        }
        tokio::time::timeout_at(deadline, broker.committed.changed())
            .await
            .map_err(|_| "no snapshot generation held every change within 2 minutes")?
            .map_err(|_| "the broker's log ended before a generation held every change")?;
    }
}

async fn sparse(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    println!(
        "\n## A session owed one message in N ({SPARSE_MESSAGES} QoS 1 messages of 64 B from \
         four publishers, 500 in flight each; one offline persistent session subscribed to one \
         topic)"
    );
    println!(
        "| broker | sessions on | one in | messages owed | RSS above the empty broker's | per message owed | peak RSS |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    let dir = tempfile::tempdir()?;
    let baseline = bench_support::baseline()?;
    for &every in sizes {
        let mut brokers = Vec::new();
        for name in rows(&baseline, mosquitto) {
            if name == "mosquitto" {
                brokers.push((name, "memory"));
            } else {
                brokers.extend([(name, "memory"), (name, "snapshots"), (name, "sqlite")]);
            }
        }
        for (name, store) in brokers {
            let data = dir.path().join(format!("{name}-{store}-sparse-{every}"));
            let metrics: SocketAddr =
                format!("127.0.0.1:{}", bench_support::free_port()?).parse()?;
            // "snapshots": a memory provider with a snapshot directory, whose
            // every generation writes the broadcast log and the sessions.
            let storage = match store {
                "sqlite" | "snapshots" => format!(
                    "storage:\n{}broker:\n  session_storage: p\n",
                    provider_storage(
                        if store == "sqlite" {
                            "sqlite"
                        } else {
                            "memory"
                        },
                        &data
                    )
                ),
                _ => String::new(),
            };
            let config = saguin_config(
                &data,
                &format!(
                    "limits:\n  max_queued_messages: {SPARSE_MESSAGES}\n{storage}metrics:\n  bind: {metrics}\n"
                ),
            )?;
            let mosquitto_extra =
                format!("persistence false\nmax_queued_messages {SPARSE_MESSAGES}\n");
            let which = row(name, &config, &baseline, &mosquitto_extra);
            let mut broker = launch(&which, &data).await?;
            let pid = pid_of(&broker)?;
            let before = rss(pid)?;
            bench_support::make_sessions(broker.addr, 1).await?;
            SPARSE_EVERY.store(every, std::sync::atomic::Ordering::Relaxed);
            publish_many(broker.addr, SPARSE_MESSAGES, false, |i| {
                if i % SPARSE_EVERY.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                    "cmd/0/go".to_owned()
                } else {
                    "cmd/elsewhere/go".to_owned()
                }
            })
            .await?;
            if store == "snapshots" {
                snapshot_saved(&mut broker, metrics).await?;
            }
            let after = rss(pid)?;
            let peak = peak_rss(pid)?;
            stop(broker).await?;
            let owed = SPARSE_MESSAGES.div_ceil(every);
            let grown = after.saturating_sub(before);
            println!(
                "| {name} | {store} | {every} | {owed} | {} | {:.0} B | {} |",
                self::mib(grown as f64),
                grown as f64 / owed as f64,
                self::mib(peak as f64),
            );
            std::fs::remove_dir_all(&data)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- churn

/// Devices a round of the churn curve connects, from a pool of
/// [`CHURN_POOL`] taken in turn: each device is back every fifth round.
const CHURN_DEVICES: usize = 200;
const CHURN_POOL: usize = 1_000;

/// One broker's life of rounds: each size of `sizes` is a point on it,
/// where its memory is read.
async fn churn(sizes: &[usize], mosquitto: bool) -> Result<(), Error> {
    println!(
        "\n## A broker left running (rounds of {CHURN_DEVICES} devices of {CHURN_POOL}, each \
         back every fifth round: every third persistent, every seventh subscribed to its \
         command topic and sent a command, every eleventh gone without a DISCONNECT; each \
         publishes QoS 1 to an append channel, a latest channel and a retained topic, every \
         fifth a job to a queue; then a persistent backend takes the round's records, a \
         persistent worker its jobs and a reader a fiftieth of the retained messages)"
    );
    println!(
        "| broker | rounds | connections | sessions | retained | append records | latest values | jobs waiting | RSS | private RSS | private RSS since the row before | private RSS once idle | broker CPU a round |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let rounds = sizes.iter().copied().max().unwrap_or(0);
    let dir = tempfile::tempdir()?;
    let mut brokers = vec!["memory", "sqlite"];
    if mosquitto {
        brokers.push("mosquitto");
    }
    brokers.retain(|b| row_wanted(b));
    for name in brokers {
        let data = dir.path().join(format!("churn-{name}"));
        let metrics: SocketAddr = format!("127.0.0.1:{}", bench_support::free_port()?).parse()?;
        let config = saguin_config(
            &data,
            &format!(
                "metrics:\n  bind: {metrics}\nstorage:\n{}channels:\n  - name: tele\n    kind: append\n    storage: p\n    \
                 retention_bytes: 256KiB\n  - name: twin\n    kind: latest\n    storage: p\n  \
                 - name: jobs\n    kind: queue\n    storage: p\nbroker:\n  retained_storage: p\n  \
                 session_storage: p\n",
                provider_storage(name, &data)
            ),
        )?;
        let which = row(
            name,
            &config,
            &None,
            "persistence true\nmax_connections -1\nset_tcp_nodelay true\n",
        );
        let broker = launch(&which, &data).await?;
        let pid = pid_of(&broker)?;
        // The backend and the worker subscribe before the first round, so
        // each round's records and jobs are theirs to take.
        for (id, filter) in [("churn-backend", "tele/#"), ("churn-worker", "jobs/#")] {
            let (mut conn, _) = Conn::connect(broker.addr, id, false).await?;
            subscribe_acked(&mut conn, filter, QoS::AtLeastOnce, id).await?;
            disconnect(conn).await?;
        }
        let mut connections = 2;
        let mut private_before = private_rss(pid)?;
        let mut cpu_before = cpu_time(pid)?;
        let mut round_before = 0;
        for round in 1..=rounds {
            connections += churn_round(broker.addr, round).await?;
            if sizes.contains(&round) {
                let private = private_rss(pid)?;
                let cpu = cpu_time(pid)?;
                let mut held = String::new();
                for series in [
                    "saguin_sessions",
                    "saguin_retained_messages",
                    "saguin_channel_records{channel=\"tele\"}",
                    "saguin_channel_records{channel=\"twin\"}",
                    "saguin_queue_depth{channel=\"jobs\"}",
                ] {
                    match scrape_series(metrics, series).await {
                        Some(n) if name != "mosquitto" => held += &format!(" {n} |"),
                        _ => held += " - |",
                    }
                }
                let busy = rss(pid)?;
                let idle = settled_private_rss(pid).await?;
                println!(
                    "| {name} | {round} | {connections} |{held} {} | {} | {:+.1} KiB | {} | {:.1} ms |",
                    mib(busy as f64),
                    mib(private as f64),
                    (private as f64 - private_before as f64) / 1024.0,
                    mib(idle as f64),
                    (cpu - cpu_before).as_secs_f64() * 1e3 / (round - round_before) as f64
                );
                // The next row's growth is from what the broker held once
                // idle, and its CPU leaves out the idle wait.
                (private_before, cpu_before, round_before) = (idle, cpu_time(pid)?, round);
            }
        }
        stop(broker).await?;
        std::fs::remove_dir_all(&data)?;
    }
    Ok(())
}

/// The value of one series (`name{label="value"}`) of the metrics at
/// `metrics`.
async fn scrape_series(metrics: SocketAddr, series: &str) -> Option<f64> {
    bench_support::metrics_text(metrics)
        .await?
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The private RSS of broker `pid` once it has given back what it freed
/// while busy: read every 500 ms until it has not fallen for 24
/// readings in a row (12 s: a broker churned by this curve was seen to
/// give most of it back 5-10 s after the last round), for at most 60 s.
async fn settled_private_rss(pid: u32) -> Result<u64, Error> {
    let mut lowest = private_rss(pid)?;
    let mut steady = 0;
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = private_rss(pid)?;
        if now < lowest {
            (lowest, steady) = (now, 0);
        } else {
            steady += 1;
            if steady == 24 {
                break;
            }
        }
    }
    Ok(lowest)
}

/// Round `round` of the churn curve; returns the connections it made.
async fn churn_round(addr: SocketAddr, round: usize) -> Result<usize, Error> {
    let first = (round - 1) * CHURN_DEVICES % CHURN_POOL;
    let mut tasks = Vec::new();
    for device in first..first + CHURN_DEVICES {
        tasks.push(tokio::spawn(churn_device(addr, device, round)));
    }
    for (device, task) in (first..).zip(tasks) {
        task.await?
            .map_err(|e| format!("round {round}, device dev{device}: {e}"))?;
    }
    let this_round = churn_payload(round);
    let records = CHURN_DEVICES;
    take_all(addr, "churn-backend", records, &this_round, |p| {
        p.topic.starts_with("tele/")
    })
    .await
    .map_err(|e| format!("round {round}, the backend: {e}"))?;
    let jobs = CHURN_DEVICES / 5;
    take_all(addr, "churn-worker", jobs, &this_round, |p| {
        p.topic.starts_with("jobs/")
    })
    .await
    .map_err(|e| format!("round {round}, the worker: {e}"))?;
    // Every device below this round's last has published its retained
    // message; a fiftieth of them are under one `site/<k>/`.
    let seen = (round * CHURN_DEVICES).min(CHURN_POOL);
    let (mut reader, _) = Conn::connect(addr, "churn-retained", true).await?;
    let site = round % 50;
    subscribe_acked(
        &mut reader,
        &format!("site/{site}/#"),
        QoS::AtMostOnce,
        "reader",
    )
    .await?;
    let mut retained = 0;
    while retained < seen / 50 {
        match reader.next().await? {
            Packet::Publish(p) if p.retain && p.topic.starts_with(&format!("site/{site}/")) => {
                retained += 1
            }
            other => return Err(format!("retained reader: unexpected {other:?}").into()),
        }
    }
    disconnect(reader).await?;
    Ok(CHURN_DEVICES + 3)
}

/// What each message of round `round` carries: its number in 64 B.
fn churn_payload(round: usize) -> Bytes {
    Bytes::from(format!("{round:064}"))
}

/// Device `device` in round `round`: its publishes, its command when it
/// has a command topic, and its leaving.
async fn churn_device(addr: SocketAddr, device: usize, round: usize) -> Result<(), Error> {
    let who = format!("dev{device}");
    let (mut conn, _) = Conn::connect(addr, &who, device % 3 != 0).await?;
    let commanded = device % 7 == 0;
    let command = format!("cmd/{who}/reboot");
    let mut publishes = vec![
        (format!("tele/{who}"), false),
        (format!("twin/{who}"), false),
        (format!("site/{}/{who}", device % 50), true),
    ];
    if device % 5 == 0 {
        publishes.push((format!("jobs/{who}"), false));
    }
    if commanded {
        subscribe_acked(&mut conn, &format!("cmd/{who}/#"), QoS::AtLeastOnce, &who).await?;
        publishes.push((command.clone(), false));
    }
    let this_round = churn_payload(round);
    let mut buf = BytesMut::new();
    for (k, (topic, retain)) in publishes.iter().enumerate() {
        codec::encode(
            &Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: *retain,
                topic: topic.as_str().into(),
                packet_id: (k + 1) as u16,
                properties: PublishProperties::default(),
                payload: this_round.clone(),
            }),
            V,
            &mut buf,
        )?;
    }
    conn.stream.write_all(&buf).await?;
    // Every PUBACK, and this round's command; a command of a round
    // before, sent again because its device left before acknowledging
    // it, is acknowledged too.
    let (mut acks, mut commands) = (0, 0);
    while acks < publishes.len() || (commanded && commands == 0) {
        match conn.next().await? {
            Packet::PubAck(ack) if !ack.reason.is_error() => acks += 1,
            Packet::Publish(p) if *p.topic == *command => {
                conn.send(&Packet::PubAck(PubAck::new(p.packet_id))).await?;
                commands += usize::from(p.payload == this_round);
            }
            other => return Err(format!("{who}: unexpected {other:?}").into()),
        }
    }
    if device % 11 != 0 {
        disconnect(conn).await?;
    }
    Ok(())
}

/// Connects persistent client `id` and takes QoS 1 messages `expected`
/// accepts, acknowledging each, until it has `count` topics' messages of
/// `this_round` (their payload); then leaves.
async fn take_all(
    addr: SocketAddr,
    id: &str,
    count: usize,
    this_round: &Bytes,
    expected: impl Fn(&Publish) -> bool,
) -> Result<(), Error> {
    let (mut conn, _) = Conn::connect(addr, id, false).await?;
    // A message of a round before is taken again when the last connection
    // left before its acknowledgement was read, or when the broker had not
    // yet read that connection's DISCONNECT as the round's first messages
    // came: sent to the connection going away, it is sent again, as MQTT
    // allows. Each of this round's topics is counted once.
    let mut taken = std::collections::HashSet::new();
    while taken.len() < count {
        match conn.next().await? {
            Packet::Publish(p) if p.qos == QoS::AtLeastOnce && expected(&p) => {
                conn.send(&Packet::PubAck(PubAck::new(p.packet_id))).await?;
                if p.payload == this_round {
                    taken.insert(p.topic.to_string());
                }
            }
            other => return Err(format!("{id}: unexpected {other:?}").into()),
        }
    }
    disconnect(conn).await
}

/// Sends a normal DISCONNECT and waits for the broker to close the
/// connection: the next round's messages for this client id are not
/// sent to a connection going away. What comes before the close (a
/// message sent before the DISCONNECT was read) is left unacknowledged,
/// for the client id's next connection.
async fn disconnect(mut conn: Conn) -> Result<(), Error> {
    conn.send(&Packet::Disconnect(Disconnect::new(
        ReasonCode::NORMAL_DISCONNECTION,
    )))
    .await?;
    while conn.next().await.is_ok() {}
    Ok(())
}
