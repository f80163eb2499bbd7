//! Load benchmark: publish throughput and end-to-end latency of saguin,
//! side by side with Mosquitto (`/usr/sbin/mosquitto`) and rumqttd 0.20
//! (`cargo install rumqttd`; found on PATH or in `~/.cargo/bin`, and a
//! run without it says so on stderr and in its last line), each started
//! here on its own loopback port.
//!
//! `cargo bench --bench load` (release). The clients are raw tokio MQTT
//! 3.1.1 clients built on the project's codec; the rows ending `rumqttc`
//! use rumqttc (the MQTT client of rumqttd's project, independent of
//! saguin's codec) instead, each client on its own event loop, the way an
//! application would. Every message is counted at every subscriber; a
//! missing message fails the run.
//!
//! Environment: `SAGUIN_BENCH_SCALE` (default 1.0) scales message counts;
//! `SAGUIN_BENCH_BROKERS` (default `saguin,mosquitto,rumqttd`) picks brokers;
//! `SAGUIN_BENCH_ONLY` runs only the tests whose name contains it (ending
//! in `$`: whose name ends with what comes before it, so `q1 1pub->50sub$`
//! is that row without its persistent twin);
//! `SAGUIN_BENCH_BASELINE` names the binary run as `saguin-baseline`;
//! the broker `external` is one already listening at `SAGUIN_BENCH_ADDR`
//! (a saguin under `valgrind --tool=callgrind`, say), which the run leaves
//! running.

mod bench_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use saguin::broker::codec::{
    self, ByteStr, Connect, ConnectProperties, FrameDecoder, Packet, ProtocolVersion, PubAck,
    Publish, PublishProperties, QoS, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const PAYLOAD: usize = 64;
/// Outstanding QoS 1/2 publishes per publisher (and the brokers' inflight).
const WINDOW: usize = 100;
const V: ProtocolVersion = ProtocolVersion::V311;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Conn {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    decoder: FrameDecoder,
}

impl Conn {
    async fn connect(addr: SocketAddr, client_id: &str) -> Result<Conn, Error> {
        Self::connect_with(addr, client_id, true).await
    }

    /// `clean`: false makes a persistent session (MQTT 3.1.1 clean session 0).
    async fn connect_with(addr: SocketAddr, client_id: &str, clean: bool) -> Result<Conn, Error> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut conn = Conn {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::with_capacity(64 * 1024),
            decoder: FrameDecoder::client(256 * 1024 * 1024, V),
        };
        conn.push(&Packet::Connect(Connect {
            protocol: V,
            clean_start: clean,
            keep_alive: 120,
            client_id: client_id.to_owned(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        }))?;
        conn.flush().await?;
        match conn.next().await? {
            Packet::ConnAck(ack) if !ack.reason.is_error() => Ok(conn),
            other => Err(format!("{client_id}: unexpected {other:?}").into()),
        }
    }

    fn push(&mut self, packet: &Packet) -> Result<(), Error> {
        codec::encode(packet, V, &mut self.wbuf)?;
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Error> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Decode one buffered packet without reading.
    fn try_next(&mut self) -> Result<Option<Packet>, Error> {
        Ok(self.decoder.decode(&mut self.rbuf)?)
    }

    async fn fill(&mut self) -> Result<(), Error> {
        self.rbuf.reserve(32 * 1024);
        if self.stream.read_buf(&mut self.rbuf).await? == 0 {
            return Err("connection closed by the broker".into());
        }
        Ok(())
    }

    async fn next(&mut self) -> Result<Packet, Error> {
        loop {
            if let Some(p) = self.try_next()? {
                return Ok(p);
            }
            self.fill().await?;
        }
    }
}

fn qos_of(q: u8) -> QoS {
    QoS::from_u8(q).unwrap_or(QoS::AtMostOnce)
}

fn ack(packet_id: u16) -> PubAck {
    PubAck::new(packet_id)
}

fn payload(seq: u64) -> Bytes {
    let mut b = BytesMut::with_capacity(PAYLOAD);
    b.put_u64(now_ns());
    b.put_u64(seq);
    b.resize(PAYLOAD, 0x5A);
    b.freeze()
}

/// Publish `count` messages; `rate` (msgs/s) paces them when set.
async fn publisher(
    addr: SocketAddr,
    id: String,
    topic: String,
    qos: u8,
    count: u64,
    rate: Option<f64>,
) -> Result<(), Error> {
    let mut conn = Conn::connect(addr, &id).await?;
    let topic = ByteStr::from(topic);
    let mut sent = 0u64;
    let mut done = 0u64;
    let mut inflight = 0usize;
    let mut next_id: u16 = 0;
    let start = Instant::now();
    while done < count {
        let mut burst = 0;
        while sent < count && (qos == 0 || inflight < WINDOW) && burst < 64 {
            if let Some(rate) = rate {
                let due = start + Duration::from_secs_f64(sent as f64 / rate);
                let now = Instant::now();
                if due > now {
                    if burst > 0 {
                        break;
                    }
                    conn.flush().await?;
                    tokio::time::sleep(due - now).await;
                }
            }
            next_id = if next_id == u16::MAX { 1 } else { next_id + 1 };
            conn.push(&Packet::Publish(Publish {
                dup: false,
                qos: qos_of(qos),
                retain: false,
                topic: topic.clone(),
                packet_id: if qos == 0 { 0 } else { next_id },
                properties: PublishProperties::default(),
                payload: payload(sent),
            }))?;
            sent += 1;
            burst += 1;
            if qos == 0 {
                done += 1;
            } else {
                inflight += 1;
            }
        }
        conn.flush().await?;
        if qos == 0 {
            continue;
        }
        if sent < count && inflight < WINDOW && rate.is_some() {
            // Paced: don't block on acks when the window has room.
            while let Some(p) = conn.try_next()? {
                handle_pub_ack(&mut conn, p, &mut inflight, &mut done)?;
            }
            continue;
        }
        conn.fill().await?;
        while let Some(p) = conn.try_next()? {
            handle_pub_ack(&mut conn, p, &mut inflight, &mut done)?;
        }
    }
    conn.push(&Packet::Disconnect(codec::Disconnect::new(
        codec::ReasonCode::Success,
    )))?;
    conn.flush().await?;
    Ok(())
}

fn handle_pub_ack(
    conn: &mut Conn,
    p: Packet,
    inflight: &mut usize,
    done: &mut u64,
) -> Result<(), Error> {
    match p {
        Packet::PubAck(_) | Packet::PubComp(_) => {
            *inflight -= 1;
            *done += 1;
        }
        Packet::PubRec(a) => conn.push(&Packet::PubRel(ack(a.packet_id)))?,
        other => return Err(format!("publisher got {other:?}").into()),
    }
    Ok(())
}

/// Subscribe, report ready, then count `expected` messages; returns latencies (ns).
async fn subscriber(
    addr: SocketAddr,
    id: String,
    topic: String,
    qos: u8,
    expected: u64,
    ready: tokio::sync::mpsc::Sender<()>,
    clean: bool,
) -> Result<Vec<u64>, Error> {
    let mut conn = Conn::connect_with(addr, &id, clean).await?;
    conn.push(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: topic,
            options: SubscriptionOptions {
                qos: qos_of(qos),
                ..SubscriptionOptions::default()
            },
        }],
        properties: SubscribeProperties::default(),
    }))?;
    conn.flush().await?;
    match conn.next().await? {
        Packet::SubAck(_) => {}
        other => return Err(format!("expected SUBACK, got {other:?}").into()),
    }
    let _ = ready.send(()).await;
    drop(ready);
    let mut latencies = Vec::with_capacity(expected as usize);
    while (latencies.len() as u64) < expected {
        conn.fill().await?;
        let now = now_ns();
        while let Some(p) = conn.try_next()? {
            match p {
                Packet::Publish(p) => {
                    let sent = p
                        .payload
                        .get(..8)
                        .map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
                        .unwrap_or(0);
                    latencies.push(now.saturating_sub(sent));
                    match p.qos {
                        QoS::AtMostOnce => {}
                        QoS::AtLeastOnce => conn.push(&Packet::PubAck(ack(p.packet_id)))?,
                        QoS::ExactlyOnce => conn.push(&Packet::PubRec(ack(p.packet_id)))?,
                    }
                }
                Packet::PubRel(a) => conn.push(&Packet::PubComp(ack(a.packet_id)))?,
                Packet::PingResp => {}
                other => return Err(format!("subscriber got {other:?}").into()),
            }
        }
        conn.flush().await?;
    }
    Ok(latencies)
}

struct Outcome {
    msgs_per_sec: f64,
    delivered: u64,
    expected: u64,
    p50_us: f64,
    p99_us: f64,
    error: Option<String>,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Waits for a run's publishers and subscribers (each within its budget)
/// and counts what every subscriber received against `expected`, keeping
/// the last error met (`error` is one met before).
async fn gather(
    pub_tasks: Vec<tokio::task::JoinHandle<Result<(), Error>>>,
    sub_tasks: Vec<tokio::task::JoinHandle<Result<Vec<u64>, Error>>>,
    start: Instant,
    expected: u64,
    mut error: Option<String>,
) -> Outcome {
    for t in pub_tasks {
        match tokio::time::timeout(Duration::from_secs(60), t).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => error = Some(format!("publisher: {e}")),
            Ok(Err(e)) => error = Some(format!("publisher task: {e}")),
            Err(_) => error = Some("publisher timed out".into()),
        }
    }
    let mut all = Vec::new();
    let mut delivered = 0u64;
    for t in sub_tasks {
        match tokio::time::timeout(Duration::from_secs(20), t).await {
            Ok(Ok(Ok(lat))) => {
                delivered += lat.len() as u64;
                all.extend(lat);
            }
            Ok(Ok(Err(e))) => error = Some(format!("subscriber: {e}")),
            Ok(Err(e)) => error = Some(format!("subscriber task: {e}")),
            Err(_) => error = Some("subscriber timed out waiting for messages".into()),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    if error.is_none() && delivered != expected {
        error = Some(format!("delivered {delivered} of {expected}"));
    }
    all.sort_unstable();
    Outcome {
        msgs_per_sec: delivered as f64 / elapsed,
        delivered,
        expected,
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
        error,
    }
}

#[allow(clippy::too_many_arguments)]
async fn scenario(
    addr: SocketAddr,
    tag: &str,
    qos: u8,
    pubs: usize,
    subs: usize,
    per_pub: u64,
    rate: Option<f64>,
    clean_subscribers: bool,
) -> Outcome {
    let topic = format!("bench/{tag}");
    let expected = per_pub * pubs as u64;
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(subs.max(1));
    let mut sub_tasks = Vec::new();
    for s in 0..subs {
        sub_tasks.push(tokio::spawn(subscriber(
            addr,
            format!("{tag}-s{s}"),
            topic.clone(),
            qos,
            expected,
            ready_tx.clone(),
            clean_subscribers,
        )));
    }
    drop(ready_tx);
    for _ in 0..subs {
        if tokio::time::timeout(Duration::from_secs(10), ready_rx.recv())
            .await
            .ok()
            .flatten()
            .is_none()
        {
            break;
        }
    }
    let start = Instant::now();
    let mut pub_tasks = Vec::new();
    for p in 0..pubs {
        pub_tasks.push(tokio::spawn(publisher(
            addr,
            format!("{tag}-p{p}"),
            topic.clone(),
            qos,
            per_pub,
            rate.map(|r| r / pubs as f64),
        )));
    }
    gather(pub_tasks, sub_tasks, start, expected * subs as u64, None).await
}

/// The MQTT 3.1.1 options of a rumqttc client of this benchmark: clean,
/// keep alive 120 s, [`WINDOW`] publishes in flight.
fn rumqttc_options(addr: SocketAddr, id: &str) -> rumqttc::MqttOptions {
    let mut opts = rumqttc::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(120));
    opts.set_clean_session(true);
    opts.set_inflight(WINDOW as u16);
    opts.set_max_packet_size(1024 * 1024, 1024 * 1024);
    opts
}

fn rumqttc_qos(q: u8) -> rumqttc::QoS {
    match q {
        0 => rumqttc::QoS::AtMostOnce,
        1 => rumqttc::QoS::AtLeastOnce,
        _ => rumqttc::QoS::ExactlyOnce,
    }
}

/// [`scenario`] with rumqttc clients: `pubs` publishers of `per_pub`
/// messages each to one topic, `subs` subscribers counting every one. A
/// publisher is done when its last publish is acknowledged (QoS 1/2) or
/// written (QoS 0).
async fn rumqttc_scenario(
    addr: SocketAddr,
    tag: &str,
    qos: u8,
    pubs: usize,
    subs: usize,
    per_pub: u64,
) -> Outcome {
    let topic = format!("bench/{tag}");
    let expected = per_pub * pubs as u64;
    let mut error = None;
    let mut sub_tasks = Vec::new();
    let mut ready = Vec::new();
    for s in 0..subs {
        let (client, mut eventloop) =
            rumqttc::AsyncClient::new(rumqttc_options(addr, &format!("{tag}-s{s}")), 1024);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        ready.push(ready_rx);
        let topic = topic.clone();
        sub_tasks.push(tokio::spawn(async move {
            client.subscribe(topic, rumqttc_qos(qos)).await?;
            let mut ready_tx = Some(ready_tx);
            let mut latencies = Vec::with_capacity(expected as usize);
            while (latencies.len() as u64) < expected {
                match eventloop.poll().await? {
                    rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)) => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) => {
                        let sent = p
                            .payload
                            .get(..8)
                            .map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
                            .unwrap_or(0);
                        latencies.push(now_ns().saturating_sub(sent));
                    }
                    _ => {}
                }
            }
            // The last acknowledgements go out before the connection ends.
            client.disconnect().await?;
            while !matches!(
                eventloop.poll().await,
                Err(_) | Ok(rumqttc::Event::Outgoing(rumqttc::Outgoing::Disconnect))
            ) {}
            Ok::<Vec<u64>, Error>(latencies)
        }));
    }
    for r in ready {
        if tokio::time::timeout(Duration::from_secs(10), r)
            .await
            .is_err()
        {
            error = Some("a rumqttc subscriber got no SUBACK".to_owned());
        }
    }
    let start = Instant::now();
    let mut pub_tasks = Vec::new();
    for p in 0..pubs {
        let (client, mut eventloop) =
            rumqttc::AsyncClient::new(rumqttc_options(addr, &format!("{tag}-p{p}")), 1024);
        let topic = topic.clone();
        pub_tasks.push(tokio::spawn(async move {
            let sender = tokio::spawn(async move {
                for seq in 0..per_pub {
                    client
                        .publish(topic.clone(), rumqttc_qos(qos), false, payload(seq))
                        .await?;
                }
                Ok::<rumqttc::AsyncClient, Error>(client)
            });
            let mut done = 0u64;
            while done < per_pub {
                match eventloop.poll().await? {
                    rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))
                    | rumqttc::Event::Incoming(rumqttc::Packet::PubComp(_))
                        if qos > 0 =>
                    {
                        done += 1
                    }
                    rumqttc::Event::Outgoing(rumqttc::Outgoing::Publish(_)) if qos == 0 => {
                        done += 1
                    }
                    _ => {}
                }
            }
            let client = sender.await??;
            client.disconnect().await?;
            while !matches!(
                eventloop.poll().await,
                Err(_) | Ok(rumqttc::Event::Outgoing(rumqttc::Outgoing::Disconnect))
            ) {}
            Ok::<(), Error>(())
        }));
    }
    gather(pub_tasks, sub_tasks, start, expected * subs as u64, error).await
}

struct Broker {
    name: &'static str,
    addr: SocketAddr,
    /// `None` for a broker this benchmark did not start.
    child: Option<Child>,
}

async fn wait_port(addr: SocketAddr) -> bool {
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// How a saguin under test keeps its sessions (`broker.session_storage`).
#[derive(Clone, Copy)]
enum Sessions {
    /// None configured: a memory provider without a snapshot directory.
    Unkept,
    /// A memory provider with a snapshot directory.
    Memory,
    Sqlite,
}

async fn start_saguin(
    dir: &Path,
    name: &'static str,
    bin: &Path,
    sessions: Sessions,
) -> Result<Broker, Error> {
    let data = dir.join(name);
    std::fs::create_dir_all(&data)?;
    let config = data.join("saguin.yaml");
    let storage = match sessions {
        Sessions::Unkept => String::new(),
        Sessions::Memory => format!(
            "storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: {}\nbroker:\n  session_storage: mem\n",
            data.join("snapshots").display()
        ),
        Sessions::Sqlite => format!(
            "storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\nbroker:\n  session_storage: db\n",
            data.join("saguin.db").display()
        ),
    };
    std::fs::write(
        &config,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\nlimits:\n  max_queued_messages: 1000000\n  receive_maximum: {WINDOW}\nlog:\n  level: warn\n{storage}"
        ),
    )?;
    let mut child = Command::new(bin)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let addr = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("msg=\"listening\"") && line.contains("listener=mqtt") {
                if let Some(addr) = line
                    .split_whitespace()
                    .find_map(|kv| kv.strip_prefix("addr="))
                {
                    return Ok::<SocketAddr, Error>(addr.parse()?);
                }
            }
        }
        Err("saguin exited before listening".into())
    })
    .await??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Broker {
        name,
        addr,
        child: Some(child),
    })
}

async fn start_mosquitto(dir: &Path, persist: bool) -> Result<Broker, Error> {
    let name = if persist {
        "mosquitto-persist"
    } else {
        "mosquitto"
    };
    let persistence = if persist {
        "persistence true\n"
    } else {
        "persistence false\n"
    };
    let started = bench_support::start_mosquitto(
        &dir.join(name),
        &format!(
            "max_queued_messages 1000000\nmax_inflight_messages {WINDOW}\nmax_queued_bytes 0\n{persistence}"
        ),
    )
    .await?;
    Ok(Broker {
        name,
        addr: started.addr,
        child: Some(started.child),
    })
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// rumqttd on PATH, else where `cargo install` puts it.
fn rumqttd_binary() -> Option<PathBuf> {
    on_path("rumqttd").or_else(|| {
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))?;
        Some(cargo_home.join("bin").join("rumqttd")).filter(|p| p.is_file())
    })
}

async fn start_rumqttd(dir: &Path) -> Result<Broker, Error> {
    let bin = rumqttd_binary()
        .ok_or("rumqttd is neither on PATH nor in ~/.cargo/bin (cargo install rumqttd)")?;
    let port = bench_support::free_port()?;
    let console = bench_support::free_port()?;
    let config = dir.join("rumqttd.toml");
    std::fs::write(
        &config,
        format!(
            r#"id = 0

[router]
id = 0
max_connections = 10010
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = 10

[v4.1]
name = "v4-1"
listen = "127.0.0.1:{port}"
next_connection_delay_ms = 1
    [v4.1.connections]
    connection_timeout_ms = 60000
    max_payload_size = 20480
    max_inflight_count = {WINDOW}
    dynamic_filters = true

[console]
listen = "127.0.0.1:{console}"
"#
        ),
    )?;
    let child = Command::new(bin)
        .arg("-c")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    if !wait_port(addr).await {
        return Err("rumqttd did not start listening".into());
    }
    Ok(Broker {
        name: "rumqttd",
        addr,
        child: Some(child),
    })
}

struct Row {
    broker: &'static str,
    test: String,
    outcome: Outcome,
}

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`:
    // the load run belongs to `cargo bench` only.
    if !std::env::args().any(|a| a == "--bench") {
        println!("load: run with `cargo bench --bench load`");
        return;
    }
    let _ = epoch();
    let scale: f64 = std::env::var("SAGUIN_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let wanted =
        std::env::var("SAGUIN_BENCH_BROKERS").unwrap_or_else(|_| "saguin,mosquitto,rumqttd".into());
    let n = |base: f64| ((base * scale).round() as u64).max(10);
    let dir = tempfile::tempdir().expect("temp dir");
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "saguin load benchmark: {cpus} CPU(s) {model}; load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("payload {PAYLOAD} B, QoS 1/2 window {WINDOW} per publisher, MQTT 3.1.1 clients on the project codec; msg/s = messages received by all subscribers per second");

    let mut rows = Vec::new();
    let mut failed = false;
    let mut skipped: Vec<String> = Vec::new();
    for name in wanted.split(',').map(str::trim) {
        // SAGUIN_BENCH_BIN runs another binary (or a profiler wrapping one).
        let this_bin = std::env::var_os("SAGUIN_BENCH_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_saguin")));
        let this = this_bin.as_path();
        let started = match name {
            "saguin" => start_saguin(dir.path(), "saguin", this, Sessions::Unkept).await,
            "saguin-memory" => {
                start_saguin(dir.path(), "saguin-memory", this, Sessions::Memory).await
            }
            "saguin-sqlite" => {
                start_saguin(dir.path(), "saguin-sqlite", this, Sessions::Sqlite).await
            }
            // An earlier build, for a side-by-side comparison in one run.
            "saguin-baseline" => match std::env::var_os("SAGUIN_BENCH_BASELINE") {
                Some(bin) => {
                    start_saguin(
                        dir.path(),
                        "saguin-baseline",
                        Path::new(&bin),
                        Sessions::Unkept,
                    )
                    .await
                }
                None => Err("set SAGUIN_BENCH_BASELINE to an earlier saguin binary".into()),
            },
            "mosquitto" => start_mosquitto(dir.path(), false).await,
            "mosquitto-persist" => start_mosquitto(dir.path(), true).await,
            "rumqttd" => start_rumqttd(dir.path()).await,
            // A broker started elsewhere (under a profiler, say), left
            // running afterwards.
            "external" => match std::env::var("SAGUIN_BENCH_ADDR") {
                Ok(addr) => addr
                    .parse::<SocketAddr>()
                    .map(|addr| Broker {
                        name: "external",
                        addr,
                        child: None,
                    })
                    .map_err(|e| format!("SAGUIN_BENCH_ADDR {addr}: {e}").into()),
                Err(_) => Err("set SAGUIN_BENCH_ADDR to the broker's address".into()),
            },
            other => Err(format!("unknown broker {other}").into()),
        };
        let mut broker = match started {
            Ok(b) => b,
            Err(e) => {
                // Said where it is seen, and again under the table: a
                // comparison without its peer must not pass unnoticed.
                eprintln!("SKIP {name}: {e}");
                skipped.push(format!("{name} ({e})"));
                continue;
            }
        };
        // (name, qos, pubs, subs, messages per publisher, rate, clean subscribers)
        type Case = (String, u8, usize, usize, u64, Option<f64>, bool);
        let mut cases: Vec<Case> = Vec::new();
        for qos in [0u8, 1, 2] {
            cases.push((
                format!("q{qos} 1pub->1sub"),
                qos,
                1,
                1,
                n(50_000.0),
                None,
                true,
            ));
            cases.push((
                format!("q{qos} 4pub->1sub"),
                qos,
                4,
                1,
                n(25_000.0),
                None,
                true,
            ));
            cases.push((
                format!("q{qos} 8pub->1sub"),
                qos,
                8,
                1,
                n(12_500.0),
                None,
                true,
            ));
            cases.push((
                format!("q{qos} 1pub->50sub"),
                qos,
                1,
                50,
                n(2_000.0),
                None,
                true,
            ));
            cases.push((
                format!("q{qos} latency@5k/s"),
                qos,
                1,
                1,
                n(10_000.0),
                Some(5_000.0),
                true,
            ));
        }
        // Persistent sessions (clean session 0): what the session provider
        // costs a fan-out.
        cases.push((
            "q1 1pub->50sub persistent".into(),
            1,
            1,
            50,
            n(2_000.0),
            None,
            false,
        ));
        // The same load from rumqttc clients: what an application sees.
        for qos in [0u8, 1, 2] {
            cases.push((
                format!("q{qos} 4pub->1sub rumqttc"),
                qos,
                4,
                1,
                n(25_000.0),
                None,
                true,
            ));
        }
        let only = std::env::var("SAGUIN_BENCH_ONLY").unwrap_or_default();
        let wanted_row = |test: &str| match only.strip_suffix('$') {
            Some(end) => test.ends_with(end),
            None => test.contains(only.as_str()),
        };
        for (i, (test, qos, pubs, subs, per_pub, rate, clean)) in cases.into_iter().enumerate() {
            if !wanted_row(&test) {
                continue;
            }
            let tag = format!("{}-{i}", broker.name);
            let outcome = if test.ends_with("rumqttc") {
                rumqttc_scenario(broker.addr, &tag, qos, pubs, subs, per_pub).await
            } else {
                scenario(broker.addr, &tag, qos, pubs, subs, per_pub, rate, clean).await
            };
            if let Some(e) = &outcome.error {
                eprintln!("FAIL {} {test}: {e}", broker.name);
                failed = true;
            }
            eprintln!(
                "{:<10} {:<20} {:>12.0} msg/s  p50 {:>9.0} us  p99 {:>9.0} us  {}/{}",
                broker.name,
                test,
                outcome.msgs_per_sec,
                outcome.p50_us,
                outcome.p99_us,
                outcome.delivered,
                outcome.expected
            );
            rows.push(Row {
                broker: broker.name,
                test,
                outcome,
            });
        }
        if let Some(child) = &mut broker.child {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    table.set_header([
        "test",
        "broker",
        "msg/s",
        "p50 µs",
        "p99 µs",
        "delivered",
        "result",
    ]);
    let mut tests: Vec<String> = Vec::new();
    for r in &rows {
        if !tests.contains(&r.test) {
            tests.push(r.test.clone());
        }
    }
    for test in &tests {
        for r in rows.iter().filter(|r| &r.test == test) {
            let o = &r.outcome;
            table.add_row([
                test.clone(),
                r.broker.to_string(),
                format!("{:.0}", o.msgs_per_sec),
                format!("{:.0}", o.p50_us),
                format!("{:.0}", o.p99_us),
                format!("{}/{}", o.delivered, o.expected),
                o.error.clone().unwrap_or_else(|| "ok".into()),
            ]);
        }
    }
    println!("{table}");
    if !skipped.is_empty() {
        println!("NOT MEASURED: {}", skipped.join("; "));
    }
    if failed {
        // `exit` runs no destructor: the brokers' directory goes first.
        drop(dir);
        std::process::exit(1);
    }
}
