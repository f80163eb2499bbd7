//! What the restart and reconnect-storm benchmarks share: a raw MQTT 3.1.1
//! client on the project's codec, and starting and stopping the real
//! `saguin serve` on a configuration.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use saguin::broker::codec::{
    self, Connect, ConnectProperties, FrameDecoder, Packet, ProtocolVersion, QoS, Subscribe,
    SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub const V: ProtocolVersion = ProtocolVersion::V311;

pub struct Conn {
    pub stream: TcpStream,
    rbuf: BytesMut,
    decoder: FrameDecoder,
    version: ProtocolVersion,
}

impl Conn {
    /// An MQTT 3.1.1 connection, keep alive 120 s. Returns whether the
    /// broker had a session for `id`.
    pub async fn connect(addr: SocketAddr, id: &str, clean: bool) -> Result<(Conn, bool), Error> {
        Conn::connect_as(addr, id, clean, None).await
    }

    /// [`Conn::connect`] with a user name (the client id) and `password`
    /// when one is given.
    pub async fn connect_as(
        addr: SocketAddr,
        id: &str,
        clean: bool,
        password: Option<&str>,
    ) -> Result<(Conn, bool), Error> {
        Conn::handshake(
            addr,
            Connect {
                protocol: V,
                clean_start: clean,
                keep_alive: 120,
                client_id: id.to_owned(),
                will: None,
                username: password.map(|_| id.to_owned()),
                password: password.map(|p| Bytes::copy_from_slice(p.as_bytes())),
                properties: ConnectProperties::default(),
            },
        )
        .await
    }

    /// [`Conn::connect`] in `version`, asking for `keep_alive` seconds.
    pub async fn connect_with(
        addr: SocketAddr,
        id: &str,
        clean: bool,
        keep_alive: u16,
        version: ProtocolVersion,
    ) -> Result<(Conn, bool), Error> {
        Conn::handshake(
            addr,
            Connect {
                protocol: version,
                clean_start: clean,
                keep_alive,
                client_id: id.to_owned(),
                will: None,
                username: None,
                password: None,
                properties: ConnectProperties::default(),
            },
        )
        .await
    }

    /// A clean MQTT 5 connection, keep alive 60 s, that is sent at most
    /// `receive_maximum` QoS 1 and 2 messages it has not acknowledged (an
    /// MQTT 5 client that does not say is sent up to 65,535).
    pub async fn connect_v5_receiving(
        addr: SocketAddr,
        id: &str,
        receive_maximum: u16,
    ) -> Result<Conn, Error> {
        let connect = Connect {
            protocol: ProtocolVersion::V5,
            clean_start: true,
            keep_alive: 60,
            client_id: id.to_owned(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties {
                receive_maximum: Some(receive_maximum),
                ..ConnectProperties::default()
            },
        };
        Ok(Conn::handshake(addr, connect).await?.0)
    }

    /// A clean MQTT 3.1.1 connection with `will`, keep alive 60 s.
    pub async fn connect_with_will(
        addr: SocketAddr,
        id: &str,
        will: codec::LastWill,
    ) -> Result<Conn, Error> {
        let connect = Connect {
            protocol: V,
            clean_start: true,
            keep_alive: 60,
            client_id: id.to_owned(),
            will: Some(will),
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        };
        Ok(Conn::handshake(addr, connect).await?.0)
    }

    /// Sends `connect` on a new connection and reads its CONNACK, which
    /// must accept it: the connection, and whether a session was present.
    async fn handshake(addr: SocketAddr, connect: Connect) -> Result<(Conn, bool), Error> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let version = connect.protocol;
        let id = connect.client_id.clone();
        let mut conn = Conn {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            decoder: FrameDecoder::client(256 * 1024 * 1024, version),
            version,
        };
        conn.send(&Packet::Connect(connect)).await?;
        match conn.next().await? {
            Packet::ConnAck(ack) if !ack.reason.is_error() => {
                let present = ack.session_present;
                Ok((conn, present))
            }
            other => Err(format!("{id}: unexpected {other:?}").into()),
        }
    }

    /// A reader of the packets the broker sends, and the socket's write half.
    pub fn into_split(self) -> (ConnReader, tokio::net::tcp::OwnedWriteHalf) {
        let (rd, wr) = self.stream.into_split();
        (
            ConnReader {
                rd,
                rbuf: self.rbuf,
                decoder: self.decoder,
            },
            wr,
        )
    }

    pub async fn send(&mut self, packet: &Packet) -> Result<(), Error> {
        let mut buf = BytesMut::new();
        codec::encode(packet, self.version, &mut buf)?;
        self.stream.write_all(&buf).await?;
        Ok(())
    }

    pub async fn next(&mut self) -> Result<Packet, Error> {
        loop {
            if let Some(p) = self.decoder.decode(&mut self.rbuf)? {
                return Ok(p);
            }
            self.rbuf.reserve(32 * 1024);
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err("closed by the broker".into());
            }
        }
    }
}

pub struct Broker {
    pub child: Child,
    pub addr: SocketAddr,
    /// Exec to the `listening` line.
    pub started_in: Duration,
    /// How many snapshot generations saguin has logged as committed (its
    /// `saguin::broker::snapshots` target at debug, [`SNAPSHOT_LOG`]);
    /// never changes for Mosquitto.
    pub committed: tokio::sync::watch::Receiver<u64>,
    /// The last ERROR line saguin logged after its `listening` line (a
    /// listener bound after the MQTT one that failed: it exits); never
    /// set for Mosquitto.
    pub last_error: tokio::sync::watch::Receiver<Option<String>>,
}

/// `RUST_LOG` for a saguin whose snapshot generations a bench waits on:
/// the configured level, and each generation's commit logged.
pub const SNAPSHOT_LOG: &str = "info,saguin::broker::snapshots=debug";

pub async fn start(config: &Path) -> Result<Broker, Error> {
    start_with_env(config, &[]).await
}

/// [`start`] with `env` set for the broker process.
pub async fn start_with_env(config: &Path, env: &[(&str, &str)]) -> Result<Broker, Error> {
    start_binary(Path::new(env!("CARGO_BIN_EXE_saguin")), config, env).await
}

/// The earlier build a benchmark compares this one with, side by side in
/// one run: the saguin binary `SAGUIN_BENCH_BASELINE` names (build it
/// from the commit to compare with, `cargo build --release`, and copy
/// `target/release/saguin` aside). `None` when unset; an error when it
/// names no file.
pub fn baseline() -> Result<Option<std::path::PathBuf>, Error> {
    match std::env::var_os("SAGUIN_BENCH_BASELINE") {
        None => Ok(None),
        Some(path) => {
            let path = std::path::PathBuf::from(path);
            if path.is_file() {
                Ok(Some(path))
            } else {
                Err(format!("SAGUIN_BENCH_BASELINE={}: no such file", path.display()).into())
            }
        }
    }
}

/// [`start_with_env`] of the saguin binary `bin` (this build's, or a
/// [`baseline`]).
pub async fn start_binary(
    bin: &Path,
    config: &Path,
    env: &[(&str, &str)],
) -> Result<Broker, Error> {
    let began = Instant::now();
    let mut child = Command::new(bin)
        .envs(env.iter().copied())
        .arg("serve")
        .arg("--config")
        .arg(config)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let addr = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("msg=\"listening\"") && line.contains("listener=mqtt") {
                if let Some(addr) = line
                    .split_whitespace()
                    .find_map(|kv| kv.strip_prefix("addr="))
                {
                    return Ok::<SocketAddr, Error>(addr.parse()?);
                }
            }
            if line.contains("level=ERROR") {
                return Err(line.into());
            }
        }
        Err("saguin exited before listening".into())
    })
    .await??;
    let started_in = began.elapsed();
    let (commits, committed) = tokio::sync::watch::channel(0);
    let (errors, last_error) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("msg=\"snapshot generation committed\"") {
                commits.send_modify(|n| *n += 1);
            }
            if line.contains("level=ERROR") {
                errors.send_replace(Some(line));
            }
        }
    });
    Ok(Broker {
        child,
        addr,
        started_in,
        committed,
        last_error,
    })
}

/// What `/proc/<pid>/status` reports under `field` (`VmRSS:`), trimmed.
fn status_field(pid: u32, field: &str) -> Result<String, Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .ok_or_else(|| format!("no {field} in /proc/{pid}/status"))?
        .trim()
        .to_owned())
}

/// A size in kB that `/proc/<pid>/status` reports under `field`, bytes.
pub fn status_bytes(pid: u32, field: &str) -> Result<u64, Error> {
    let kib: u64 = status_field(pid, field)?
        .split_whitespace()
        .next()
        .ok_or_else(|| format!("no size under {field} in /proc/{pid}/status"))?
        .parse()?;
    Ok(kib * 1024)
}

/// Resident memory of process `pid`, bytes.
pub fn rss(pid: u32) -> Result<u64, Error> {
    status_bytes(pid, "VmRSS:")
}

/// Threads of process `pid`.
pub fn threads(pid: u32) -> Result<u64, Error> {
    Ok(status_field(pid, "Threads:")?.parse()?)
}

/// The text the broker's metrics endpoint at `metrics` answers (its
/// headers too), within 10 s.
pub async fn metrics_text(metrics: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect(metrics).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(body)
}

/// The sum of the samples of metric `name` (every label set) the broker
/// serves at `metrics`, or `None` when it cannot be read.
pub async fn scrape(metrics: SocketAddr, name: &str) -> Option<f64> {
    let body = metrics_text(metrics).await?;
    let samples: Vec<f64> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| value.parse().ok())?
        })
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// SIGTERM and the time to exit.
pub async fn stop(mut broker: Broker) -> Result<Duration, Error> {
    let pid = broker.child.id().ok_or("no pid")? as i32;
    let began = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let status = tokio::time::timeout(Duration::from_secs(300), broker.child.wait()).await??;
    if !status.success() {
        return Err(format!("graceful stop exited {status}").into());
    }
    Ok(began.elapsed())
}

/// `sessions` persistent sessions `session-N`, each subscribed to
/// `cmd/N/#` at QoS 1, then disconnected; 16 connections at a time.
pub async fn make_sessions(addr: SocketAddr, sessions: usize) -> Result<(), Error> {
    make_sessions_as(addr, sessions, None).await
}

/// [`make_sessions`], each client `session-<i>` connecting as the user of
/// its id with `password` when one is given.
pub async fn make_sessions_as(
    addr: SocketAddr,
    sessions: usize,
    password: Option<&'static str>,
) -> Result<(), Error> {
    const CONNECTORS: usize = 16;
    let mut tasks = Vec::new();
    for c in 0..CONNECTORS {
        tasks.push(tokio::spawn(async move {
            for s in (0..sessions).filter(|s| s % CONNECTORS == c) {
                let (mut conn, _) =
                    Conn::connect_as(addr, &format!("session-{s}"), false, password).await?;
                conn.send(&Packet::Subscribe(Subscribe {
                    packet_id: 1,
                    filters: vec![SubscribeFilter {
                        filter: format!("cmd/{s}/#"),
                        options: SubscriptionOptions {
                            qos: QoS::AtLeastOnce,
                            ..SubscriptionOptions::default()
                        },
                    }],
                    properties: SubscribeProperties::default(),
                }))
                .await?;
                match conn.next().await? {
                    Packet::SubAck(_) => {}
                    other => {
                        return Err::<(), Error>(format!("expected SUBACK, got {other:?}").into())
                    }
                }
                conn.send(&Packet::Disconnect(codec::Disconnect::new(
                    codec::ReasonCode::Success,
                )))
                .await?;
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The read half of a [`Conn`].
pub struct ConnReader {
    rd: tokio::net::tcp::OwnedReadHalf,
    rbuf: BytesMut,
    decoder: FrameDecoder,
}

impl ConnReader {
    pub async fn next(&mut self) -> Result<Packet, Error> {
        loop {
            if let Some(p) = self.decoder.decode(&mut self.rbuf)? {
                return Ok(p);
            }
            self.rbuf.reserve(32 * 1024);
            if self.rd.read_buf(&mut self.rbuf).await? == 0 {
                return Err("closed by the broker".into());
            }
        }
    }
}

impl Conn {
    /// The next packet already read, without waiting on the socket: what
    /// lets a client answer a burst of packets with one write.
    pub fn try_next(&mut self) -> Result<Option<Packet>, Error> {
        Ok(self.decoder.decode(&mut self.rbuf)?)
    }

    /// Writes `packets` in one write.
    pub async fn send_all(&mut self, packets: &[Packet]) -> Result<(), Error> {
        let mut buf = BytesMut::new();
        for packet in packets {
            codec::encode(packet, self.version, &mut buf)?;
        }
        self.stream.write_all(&buf).await?;
        Ok(())
    }
}

/// CPU time process `pid` has used (user + system).
pub fn cpu_time(pid: u32) -> Result<Duration, Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis: state is the first,
    // utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .ok_or("no command in stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).ok_or("no utime")?.parse::<u64>()?
        + fields.get(12).ok_or("no stime")?.parse::<u64>()?;
    // SAFETY: sysconf(3) has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / per_second))
}

/// The machine's CPU time so far, from `/proc/stat`, in clock ticks: all
/// of it, and what the hypervisor gave to other guests while this one
/// had work (`steal`).
#[derive(Clone, Copy)]
pub struct CpuTimes {
    total: u64,
    stolen: u64,
}

impl CpuTimes {
    /// `None` where `/proc/stat` has no `cpu` line to read.
    pub fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        // user nice system idle iowait irq softirq steal guest guest_nice;
        // guest time is counted in user already.
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|t| t.parse().ok())
            .collect::<Option<_>>()?;
        Some(CpuTimes {
            total: ticks.iter().sum(),
            stolen: *ticks.get(7)?,
        })
    }

    /// The share of the machine's CPU time taken by the hypervisor
    /// between `earlier` and this.
    pub fn stolen_since(self, earlier: CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let stolen = self.stolen.checked_sub(earlier.stolen)?;
        (total > 0).then(|| stolen as f64 / total as f64)
    }
}

/// A free TCP port on 127.0.0.1 (for a peer broker that cannot be told to
/// pick its own).
pub fn free_port() -> Result<u16, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Mosquitto 2 (`/usr/sbin/mosquitto`) listening on 127.0.0.1, anonymous,
/// its configuration written into `dir` with `extra` lines appended (for
/// example `persistence true`; `persistence_location` is `dir`). Run as
/// root it stays root (`user root`): by default it would drop to the
/// `mosquitto` user, which cannot write its persistence file into a
/// directory root made. `started_in` is exec to its first CONNACK.
pub async fn start_mosquitto(dir: &Path, extra: &str) -> Result<Broker, Error> {
    let bin = Path::new("/usr/sbin/mosquitto");
    if !bin.exists() {
        return Err("/usr/sbin/mosquitto not installed (apt-get install mosquitto)".into());
    }
    std::fs::create_dir_all(dir)?;
    let port = free_port()?;
    // SAFETY: geteuid(2) has no preconditions.
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root\n"
    } else {
        ""
    };
    let config = dir.join("mosquitto.conf");
    std::fs::write(
        &config,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\n{user}persistence_location {}/\nlog_dest none\n{extra}",
            dir.display()
        ),
    )?;
    let began = Instant::now();
    let child = Command::new(bin)
        .arg("-c")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    first_connack(addr, Duration::from_secs(300)).await?;
    Ok(Broker {
        child,
        addr,
        started_in: began.elapsed(),
        committed: tokio::sync::watch::channel(0).1,
        last_error: tokio::sync::watch::channel(None).1,
    })
}

/// Waits until a broker at `addr` answers a CONNECT (clean, 3.1.1),
/// trying every 2 ms, for at most `bound`.
pub async fn first_connack(addr: SocketAddr, bound: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + bound;
    loop {
        match Conn::connect(addr, "bench-ready", true).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("{addr} did not answer a CONNECT in {bound:?}: {e}").into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}
