//! Bridge benchmark, side by side in one run: Mosquitto's bridge into a
//! Mosquitto, against saguin's bridge (channel on memory, then on sqlite)
//! into the same kind of Mosquitto.
//!
//! `cargo bench --bench bridge` (release). 8 QoS 1 publishers of 128-byte
//! payloads publish into the edge broker; one QoS 1 subscriber at the
//! remote counts every message (a missing one fails the run) and takes the
//! end-to-end latency from the send time in the payload. Then the backlog
//! case: the remote is stopped (the cut), a backlog is published into the
//! edge, the remote started again, and the time until the whole backlog
//! arrived is the drain time. Windows (Mosquitto `max_inflight_messages`,
//! saguin `max_inflight`) 20 and 64.
//!
//! The cut lasts as long as publishing the backlog takes (half a minute
//! for a million), not five minutes: by then both bridges wait their
//! longest between attempts (Mosquitto's `restart_timeout 1`, saguin's
//! `reconnect.cap` of 500 ms), so a longer cut adds only idle time;
//! `SAGUIN_BENCH_CUT_S` makes it last at least that many seconds.
//!
//! Environment: `SAGUIN_BENCH_MESSAGES` (default 200,000 per live run),
//! `SAGUIN_BENCH_RATE` (messages a second over all publishers; default
//! unpaced: each publisher as fast as its 32 outstanding are answered),
//! `SAGUIN_BENCH_BACKLOG` (default 1,000,000; 0 runs no backlog),
//! `SAGUIN_BENCH_CUT_S` (default 0), `SAGUIN_BENCH_WINDOWS` (default
//! `20,64`), `SAGUIN_BENCH_EDGES` (default `mosquitto,saguin
//! memory,saguin sqlite`: which edges are run). An edge `<label> memory`
//! or `<label> sqlite` with another label than `saguin` runs the binary
//! named by `SAGUIN_BENCH_BIN_<LABEL>` (e.g. `SAGUIN_BENCH_BIN_MAIN` for
//! `main memory`), so two builds are compared in one run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use saguin::broker::codec::{
    self, Connect, ConnectProperties, FrameDecoder, Packet, ProtocolVersion, PubAck, Publish,
    PublishProperties, QoS, Subscribe, SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const PUBLISHERS: usize = 8;
const PAYLOAD: usize = 128;
/// Outstanding publishes per publisher.
const PUBLISH_WINDOW: usize = 32;
const V: ProtocolVersion = ProtocolVersion::V311;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

struct Conn {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    decoder: FrameDecoder,
}

impl Conn {
    async fn connect(addr: SocketAddr, client_id: &str, clean: bool) -> Result<Conn, Error> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut c = Conn {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::with_capacity(64 * 1024),
            decoder: FrameDecoder::client(16 << 20, V),
        };
        c.queue(&Packet::Connect(Connect {
            protocol: V,
            clean_start: clean,
            keep_alive: 0,
            client_id: client_id.into(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        }))?;
        c.flush().await?;
        match c.recv().await? {
            Packet::ConnAck(a) if !a.reason.is_error() => Ok(c),
            other => Err(format!("CONNACK expected, got {other:?}").into()),
        }
    }

    fn queue(&mut self, p: &Packet) -> Result<(), Error> {
        codec::encode(p, V, &mut self.wbuf)?;
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Error> {
        self.stream.write_all(&self.wbuf).await?;
        self.wbuf.clear();
        Ok(())
    }

    async fn recv(&mut self) -> Result<Packet, Error> {
        loop {
            if let Some(p) = self.decoder.decode(&mut self.rbuf)? {
                return Ok(p);
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err("closed".into());
            }
        }
    }
}

/// A broker process started here, its log read for readiness.
struct Proc {
    child: Child,
}

impl Proc {
    /// SIGTERM and wait: Mosquitto writes its persistence file, so the
    /// subscriber's session and what it is owed survive the restart.
    async fn terminate(mut self) {
        if let Some(pid) = self.child.id() {
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_line(child: &mut Child, pattern: &str) -> Result<(), Error> {
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains(pattern) {
                return Ok::<bool, std::io::Error>(true);
            }
        }
        Ok(false)
    })
    .await??;
    if !found {
        return Err(format!("never logged {pattern:?}").into());
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(())
}

async fn mosquitto(dir: &Path, name: &str, port: u16, extra: &str) -> Result<Proc, Error> {
    // Started as root, Mosquitto runs as the `mosquitto` user: its
    // persistence file must be writable by it, or a restart starts empty.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/{name}-\nmax_queued_messages 0\nlog_dest stderr\nlog_type information\n{extra}\n",
            dir.display()
        ),
    )?;
    let mut child = Command::new("/usr/sbin/mosquitto")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    wait_line(&mut child, " running").await?;
    Ok(Proc { child })
}

/// The binary an edge's label names (see the module's comment).
fn saguin_bin(label: &str) -> Result<PathBuf, Error> {
    if label == "saguin" {
        return Ok(std::env::var_os("SAGUIN_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_saguin"))));
    }
    let var = format!("SAGUIN_BENCH_BIN_{}", label.to_uppercase());
    std::env::var_os(&var)
        .map(PathBuf::from)
        .ok_or_else(|| format!("edge {label:?} needs {var}").into())
}

async fn saguin(
    dir: &Path,
    port: u16,
    edge: &str,
    remote: u16,
    window: usize,
) -> Result<Proc, Error> {
    let (label, storage) = edge
        .split_once(' ')
        .ok_or_else(|| format!("edge {edge:?} is not `<label> memory|sqlite`"))?;
    let provider = match storage {
        "sqlite" => format!(
            "{{ name: db, kind: sqlite, file_path: {}/bench.db }}",
            dir.display()
        ),
        "memory" => "{ name: db, kind: memory }".to_owned(),
        other => {
            return Err(format!("edge {edge:?}: storage {other:?} is not memory or sqlite").into())
        }
    };
    let conf = dir.join("saguin.yaml");
    std::fs::write(
        &conf,
        format!(
            "listeners: [{{ name: mqtt, bind: 127.0.0.1:{port} }}]
auth: {{ allow_anonymous: true }}
storage: [{provider}]
channels: [{{ name: bench, kind: append, storage: db }}]
log: {{ level: info }}
bridges:
  - name: cloud
    address: 127.0.0.1:{remote}
    protocol: mqtt311
    client_id: bench.cloud
    max_inflight: {window}
    reconnect: {{ base: 100ms, cap: 500ms }}
    out: [{{ channel: bench, remote_prefix: sites/17/, qos: 1 }}]
"
        ),
    )?;
    let mut child = Command::new(saguin_bin(label)?)
        .arg("serve")
        .arg("--config")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    wait_line(&mut child, "bridge connected").await?;
    Ok(Proc { child })
}

/// Publisher `p` sends `n` QoS 1 messages, `PUBLISH_WINDOW` outstanding;
/// with `rate` (messages a second), no faster than that.
async fn publish(addr: SocketAddr, p: usize, n: usize, rate: Option<f64>) -> Result<(), Error> {
    let mut c = Conn::connect(addr, &format!("bench-pub{p}"), true).await?;
    let topic = format!("bench/p{p}");
    let (mut sent, mut acked, mut id) = (0usize, 0usize, 1u16);
    let started = Instant::now();
    let mut pace = tokio::time::interval(Duration::from_millis(2));
    while acked < n {
        let due = rate.map_or(n, |r| {
            ((started.elapsed().as_secs_f64() * r) as usize + 1).min(n)
        });
        if sent == acked && sent >= due {
            pace.tick().await;
            continue;
        }
        while sent < due && sent - acked < PUBLISH_WINDOW {
            let mut payload = BytesMut::with_capacity(PAYLOAD);
            payload.put_u64(now_ns());
            payload.resize(PAYLOAD, b'x');
            c.queue(&Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: topic.as_str().into(),
                packet_id: id,
                properties: PublishProperties::default(),
                payload: payload.freeze(),
            }))?;
            id = id % 60_000 + 1;
            sent += 1;
        }
        c.flush().await?;
        let packet = if rate.is_some() && sent < n {
            tokio::select! {
                packet = c.recv() => Some(packet?),
                _ = pace.tick() => None,
            }
        } else {
            Some(c.recv().await?)
        };
        match packet {
            Some(Packet::PubAck(a)) if !a.reason.is_error() => acked += 1,
            Some(Packet::PubAck(a)) => return Err(format!("refused {a:?}").into()),
            _ => {}
        }
    }
    Ok(())
}

/// What the subscriber hands back: latencies in ns, the instant the last
/// message arrived.
type Counted = Result<(Vec<u64>, Instant), Error>;

/// Subscribes (persistent session) and returns a receiver of the count of
/// `n` messages. The subscriber runs on its own thread and runtime: sharing
/// the publishers' runtime, it would be cheaper to wake while they run,
/// so its pace - and the remote's, which wakes it - would depend on how
/// long the edge keeps the publishers busy.
async fn subscriber(
    addr: SocketAddr,
    n: usize,
) -> Result<tokio::sync::oneshot::Receiver<Counted>, Error> {
    let (ready_tx, ready) = tokio::sync::oneshot::channel::<Result<(), String>>();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bench-sub".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let mut c = match subscribe(addr).await {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let _ = done_tx.send(count(&mut c, n).await);
            });
        })?;
    ready.await?.map_err(Error::from)?;
    Ok(done)
}

async fn subscribe(addr: SocketAddr) -> Result<Conn, Error> {
    let mut c = Conn::connect(addr, "bench-sub", false).await?;
    c.queue(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: "sites/17/#".into(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..SubscriptionOptions::default()
            },
        }],
        properties: SubscribeProperties::default(),
    }))?;
    c.flush().await?;
    loop {
        if let Packet::SubAck(_) = c.recv().await? {
            return Ok(c);
        }
    }
}

async fn count(c: &mut Conn, n: usize) -> Counted {
    let mut latencies = Vec::with_capacity(n);
    while latencies.len() < n {
        if let Packet::Publish(p) = c.recv().await? {
            let sent = u64::from_be_bytes(p.payload[..8].try_into()?);
            latencies.push(now_ns().saturating_sub(sent));
            c.queue(&Packet::PubAck(PubAck::new(p.packet_id)))?;
            if c.rbuf.is_empty() {
                c.flush().await?;
            }
        }
    }
    c.flush().await?;
    Ok((latencies, Instant::now()))
}

struct Figures {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn run_live(
    edge: SocketAddr,
    remote: SocketAddr,
    n: usize,
    rate: Option<f64>,
) -> Result<Figures, Error> {
    let sub = subscriber(remote, n).await?;
    let started = Instant::now();
    let per = n / PUBLISHERS;
    let each = rate.map(|r| r / PUBLISHERS as f64);
    let pubs: Vec<_> = (0..PUBLISHERS)
        .map(|p| tokio::spawn(publish(edge, p, per, each)))
        .collect();
    for p in pubs {
        p.await??;
    }
    let (mut lat, last) = tokio::time::timeout(Duration::from_secs(600), sub).await???;
    lat.sort_unstable();
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)] as f64 / 1e6;
    Ok(Figures {
        rate: (per * PUBLISHERS) as f64 / last.duration_since(started).as_secs_f64(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
    })
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let plan = Plan {
        messages: env_usize("SAGUIN_BENCH_MESSAGES", 200_000),
        rate: Some(env_usize("SAGUIN_BENCH_RATE", 0))
            .filter(|r| *r > 0)
            .map(|r| r as f64),
        backlog: env_usize("SAGUIN_BENCH_BACKLOG", 1_000_000),
        cut: Duration::from_secs(env_usize("SAGUIN_BENCH_CUT_S", 0) as u64),
    };
    let windows: Vec<usize> = std::env::var("SAGUIN_BENCH_WINDOWS")
        .unwrap_or_else(|_| "20,64".into())
        .split(',')
        .filter_map(|w| w.trim().parse().ok())
        .collect();
    let edges: Vec<String> = std::env::var("SAGUIN_BENCH_EDGES")
        .unwrap_or_else(|_| "mosquitto,saguin memory,saguin sqlite".into())
        .split(',')
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect();
    println!(
        "bridge: {PUBLISHERS} QoS 1 publishers, {PAYLOAD} B, {} messages live ({}), backlog {} after a cut of at least {}s",
        plan.messages,
        plan.rate.map_or("unpaced".to_owned(), |r| format!("{r:.0}/s")),
        plan.backlog,
        plan.cut.as_secs()
    );
    println!("| edge | window | delivered/s | p50 ms | p99 ms | backlog drain s |");
    println!("|---|---|---|---|---|---|");
    for &window in &windows {
        for edge_kind in edges.iter().map(String::as_str) {
            match run_one(edge_kind, window, &plan).await {
                Ok((live, drain)) => println!(
                    "| {edge_kind} | {window} | {:.0} | {:.2} | {:.2} | {} |",
                    live.rate,
                    live.p50_ms,
                    live.p99_ms,
                    drain.map_or("-".to_owned(), |d| format!("{d:.2}"))
                ),
                Err(e) => println!("| {edge_kind} | {window} | failed: {e} | | | |"),
            }
        }
    }
}

/// What one run does.
struct Plan {
    messages: usize,
    rate: Option<f64>,
    backlog: usize,
    cut: Duration,
}

/// The live figures, and the backlog's drain time in seconds (none with
/// `backlog` 0).
async fn run_one(
    edge_kind: &str,
    window: usize,
    plan: &Plan,
) -> Result<(Figures, Option<f64>), Error> {
    let dir = tempfile::tempdir()?;
    let (remote_port, edge_port) = (free_port(), free_port());
    let remote_addr = SocketAddr::from(([127, 0, 0, 1], remote_port));
    let edge_addr = SocketAddr::from(([127, 0, 0, 1], edge_port));
    let mut remote = mosquitto(dir.path(), "remote", remote_port, "").await?;
    let _edge = match edge_kind {
        "mosquitto" => {
            mosquitto(
                dir.path(),
                "edge",
                edge_port,
                &format!(
                    "max_inflight_messages {window}\nconnection cloud\naddress 127.0.0.1:{remote_port}\nclientid bench.cloud\ncleansession false\nrestart_timeout 1\ntopic bench/# out 1 \"\" sites/17/\n"
                ),
            )
            .await?
        }
        kind => saguin(dir.path(), edge_port, kind, remote_port, window).await?,
    };
    // Let the bridge's subscription at the remote be in place: one message
    // through before measuring.
    run_live(edge_addr, remote_addr, PUBLISHERS, None).await?;
    let live = run_live(edge_addr, remote_addr, plan.messages, plan.rate).await?;
    if plan.backlog == 0 {
        remote.terminate().await;
        return Ok((live, None));
    }
    // Backlog: the remote away while the edge takes it all.
    remote.terminate().await;
    let cut_at = Instant::now();
    let per = plan.backlog / PUBLISHERS;
    let pubs: Vec<_> = (0..PUBLISHERS)
        .map(|p| tokio::spawn(publish(edge_addr, p, per, None)))
        .collect();
    for p in pubs {
        p.await??;
    }
    // The cut is a length the run was asked for: the remote stays away
    // until it has passed (a tick at an instant gone is at once).
    if !plan.cut.is_zero() {
        let end = tokio::time::Instant::from_std(cut_at + plan.cut);
        tokio::time::interval_at(end, plan.cut).tick().await;
    }
    remote = mosquitto(dir.path(), "remote", remote_port, "").await?;
    let started = Instant::now();
    let sub = subscriber(remote_addr, per * PUBLISHERS).await?;
    let (_, last) = tokio::time::timeout(Duration::from_secs(1200), sub).await???;
    remote.terminate().await;
    Ok((live, Some(last.duration_since(started).as_secs_f64())))
}
