//! Shared by the bridge tests: a real Mosquitto per test (its own port,
//! configuration and persistence directory, readiness read from its log),
//! a TCP relay the test can cut, a collector at the remote that survives
//! the remote's restarts, and a seeded random source whose seed is printed.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use saguin::broker::codec::{
    Packet, PubAck, QoS, Subscribe, SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::broker_support::{v5, ConnectOpts, Raw, WAIT};

pub const MOSQUITTO: &str = "/usr/sbin/mosquitto";

/// Is Mosquitto installed? When not, say so loudly.
pub fn have_mosquitto(test: &str) -> bool {
    let ok = std::path::Path::new(MOSQUITTO).exists();
    if !ok {
        crate::broker_support::say_skipped(
            test,
            &format!("{MOSQUITTO} not installed (apt-get install mosquitto)"),
        );
    }
    ok
}

/// A running Mosquitto, persistence on, `max_queued_messages 0`.
pub struct Mosquitto {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
    extra: String,
    log: Arc<(Mutex<Vec<String>>, Condvar)>,
    /// Bumped at each start: what a collector waits on to reconnect.
    pub up: watch::Sender<u64>,
    /// Processes spawned so far: names the end of each one's log.
    spawns: u64,
}

impl Mosquitto {
    pub fn start(extra: &str) -> Mosquitto {
        let dir = tempfile::tempdir().expect("temp dir");
        let (up, _) = watch::channel(0);
        let mut m = Mosquitto {
            child: None,
            dir,
            port: 0,
            extra: extra.to_owned(),
            log: Arc::new((Mutex::new(Vec::new()), Condvar::new())),
            up,
            spawns: 0,
        };
        // A port taken between the probe and Mosquitto's bind is retried.
        for _ in 0..5 {
            m.port = free_port();
            if m.spawn() {
                return m;
            }
        }
        panic!("mosquitto did not start: {:#?}", m.log.0.lock().unwrap());
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn spawn(&mut self) -> bool {
        // Mosquitto started as root runs as the `mosquitto` user: its
        // persistence file must be writable by it too, or a SIGTERM saves
        // nothing and every restart starts empty.
        let _ = std::fs::set_permissions(
            self.dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        );
        let conf = self.dir.path().join("mosquitto.conf");
        let text = format!(
            "listener {} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nmax_queued_messages 0\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\nlog_type information\n{}\n",
            self.port,
            self.dir.path().display(),
            self.extra
        );
        std::fs::write(&conf, text).expect("write mosquitto.conf");
        let mut child = Command::new(MOSQUITTO)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mosquitto");
        let stderr = child.stderr.take().expect("stderr");
        let log = self.log.clone();
        let start = log.0.lock().unwrap().len();
        // The previous process's reader may log its end after this one
        // started: each end names its process.
        self.spawns += 1;
        let exited = format!("(exited {})", self.spawns);
        let end = exited.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                log.0.lock().unwrap().push(line);
                log.1.notify_all();
            }
            log.0.lock().unwrap().push(end);
            log.1.notify_all();
        });
        let (lines, _) = self
            .log
            .1
            .wait_timeout_while(self.log.0.lock().unwrap(), WAIT, |l| {
                !l[start..]
                    .iter()
                    .any(|l| l.contains(" running") || *l == exited)
            })
            .unwrap();
        let running = lines[start..].iter().any(|l| l.contains(" running"));
        drop(lines);
        if !running {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        self.child = Some(child);
        self.up.send_modify(|n| *n += 1);
        true
    }

    pub fn log_text(&self) -> String {
        self.log.0.lock().unwrap().join("\n")
    }

    /// Wait (bounded) for a log line `matches` accepts.
    pub fn wait_log(&self, matches: impl Fn(&str) -> bool) {
        let (lines, timeout) = self
            .log
            .1
            .wait_timeout_while(self.log.0.lock().unwrap(), WAIT * 3, |l| {
                !l.iter().any(|l| matches(l))
            })
            .unwrap();
        drop(lines);
        assert!(
            !timeout.timed_out(),
            "mosquitto never logged it:\n{}",
            self.log_text()
        );
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// kill -9, then start again on the same port and directory: what it
    /// held only in memory is gone, its persistence file is the one it
    /// last wrote.
    pub fn kill9_and_start(&mut self) {
        self.kill9();
        self.start_again();
    }

    /// The start running now (see [`Mosquitto::up`]).
    pub fn incarnation(&self) -> u64 {
        *self.up.borrow()
    }

    /// SIGTERM (Mosquitto writes its persistence file), wait, start again
    /// on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// SIGTERM, and wait until it exited, its persistence file written.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let _ = child.wait();
        }
        let log = self.log_text();
        let last_start = log.rfind(" running").unwrap_or(0);
        assert!(
            !log[last_start..].contains("Error saving"),
            "mosquitto did not save its persistence: {log}"
        );
    }

    /// Start again on the same port and directory.
    pub fn start_again(&mut self) {
        assert!(
            self.spawn(),
            "mosquitto did not start again: {}",
            self.log_text()
        );
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A port to listen on again after a restart: below the kernel's
/// ephemeral range, so no outgoing connection on the machine is handed it
/// as its local port while the listener is down.
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, span) = (10_000u16, low.saturating_sub(10_000).max(1));
    let mut pick = Rng::seeded_quietly();
    for _ in 0..1000 {
        let port = from + pick.below(u64::from(span)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below {low}");
}

/// A TCP relay between the bridge and its remote. It reads the MQTT
/// stream both ways (packets are passed on whole, each logged first, see
/// [`WirePacket`]), can swallow packets of chosen types from the remote,
/// and [`Relay::cut`] drops every connection through it (the listener
/// stays).
pub struct Relay {
    pub addr: SocketAddr,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accepted: watch::Receiver<u64>,
    wire: Arc<Mutex<Vec<WirePacket>>>,
    logged: watch::Receiver<usize>,
    swallow: Arc<Mutex<HashSet<u8>>>,
}

/// One packet through the relay, as it was passed on (or swallowed).
#[derive(Clone, Debug)]
pub struct WirePacket {
    /// The relay's connection it went through, counted from 1.
    pub conn: u64,
    /// Which start of the remote the connection reached (its
    /// [`Mosquitto::up`] count when the relay connected; 0 unwatched).
    pub incarnation: u64,
    /// From the bridge to the remote (else from the remote).
    pub to_remote: bool,
    /// The MQTT packet type (3 PUBLISH, 4 PUBACK, 5 PUBREC, 6 PUBREL, ...).
    pub kind: u8,
    pub packet_id: Option<u16>,
    pub qos: u8,
    pub dup: bool,
    pub topic: String,
    pub payload: Vec<u8>,
    /// The reason code of an acknowledgement (0 when it states none).
    pub reason: u8,
    /// Not passed on (see [`Relay::swallow`]).
    pub swallowed: bool,
}

pub const PUBLISH: u8 = 3;
pub const PUBACK: u8 = 4;
pub const PUBREC: u8 = 5;
pub const PUBREL: u8 = 6;
pub const PUBCOMP: u8 = 7;

/// A PUBACK (< 0x80) the remote sent, with the PUBLISH it answered: the
/// last one under its packet id on the same connection.
#[derive(Clone, Debug)]
pub struct Acked {
    pub incarnation: u64,
    pub topic: String,
    pub payload: Vec<u8>,
}

impl Relay {
    pub async fn start(target: SocketAddr) -> Relay {
        Self::start_inner(target, None).await
    }

    /// A relay to `remote` that labels each connection with the start of
    /// Mosquitto it reached.
    pub async fn watching(remote: &Mosquitto) -> Relay {
        Self::start_inner(remote.addr(), Some(remote.up.subscribe())).await
    }

    async fn start_inner(target: SocketAddr, up: Option<watch::Receiver<u64>>) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (accepted_tx, accepted) = watch::channel(0u64);
        let wire: Arc<Mutex<Vec<WirePacket>>> = Arc::default();
        let (logged_tx, logged) = watch::channel(0usize);
        let logged_tx = Arc::new(logged_tx);
        let swallow: Arc<Mutex<HashSet<u8>>> = Arc::default();
        let held = conns.clone();
        let (wire2, swallow2) = (wire.clone(), swallow.clone());
        tokio::spawn(async move {
            let mut conn = 0u64;
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                conn += 1;
                let log = Log {
                    conn,
                    // Read before connecting: a start that completes in
                    // between labels the connection with the one before.
                    incarnation: up.as_ref().map_or(0, |u| *u.borrow()),
                    wire: wire2.clone(),
                    logged: logged_tx.clone(),
                };
                let swallow = swallow2.clone();
                let task = tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = outbound.set_nodelay(true);
                    let _ = inbound.set_nodelay(true);
                    pipe(inbound, outbound, log, swallow).await;
                });
                held.lock().unwrap().push(task.abort_handle());
                accepted_tx.send_modify(|n| *n += 1);
            }
        });
        Relay {
            addr,
            conns,
            accepted,
            wire,
            logged,
            swallow,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        *self.accepted.borrow()
    }

    /// Wait (bounded) until more than `n` connections were accepted.
    pub async fn wait_accepted_over(&mut self, n: u64) {
        tokio::time::timeout(WAIT * 3, self.accepted.wait_for(|a| *a > n))
            .await
            .expect("the bridge did not connect through the relay again")
            .expect("relay running");
    }

    pub fn cut(&self) {
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }

    /// From now on, packets of type `kind` from the remote are logged and
    /// not passed on.
    pub fn swallow(&self, kind: u8) {
        self.swallow.lock().unwrap().insert(kind);
    }

    /// Pass everything on again.
    pub fn pass_all(&self) {
        self.swallow.lock().unwrap().clear();
    }

    /// Every packet through the relay so far.
    pub fn wire(&self) -> Vec<WirePacket> {
        self.wire.lock().unwrap().clone()
    }

    /// Wait (bounded) until `done` holds for what went through.
    pub async fn wait_wire(&mut self, what: &str, done: impl Fn(&[WirePacket]) -> bool) {
        let wire = self.wire.clone();
        let result = tokio::time::timeout(
            WAIT * 3,
            self.logged.wait_for(|_| done(&wire.lock().unwrap())),
        )
        .await;
        assert!(result.is_ok(), "never through the relay: {what}");
    }

    /// Wait (bounded) until the remote acknowledged a PUBLISH `done`
    /// accepts.
    pub async fn wait_acked(&mut self, what: &str, done: impl Fn(&Acked) -> bool) {
        let wire = self.wire.clone();
        let mut pairing = Pairing::default();
        let result = tokio::time::timeout(
            WAIT * 3,
            self.logged.wait_for(|_| {
                let wire = wire.lock().unwrap();
                pairing.more(&wire).iter().any(&done)
            }),
        )
        .await;
        assert!(result.is_ok(), "the remote never acknowledged {what}");
    }

    /// Every PUBACK (< 0x80) the remote sent, with what it answered.
    pub fn acked(&self) -> Vec<Acked> {
        Pairing::default().more(&self.wire.lock().unwrap())
    }
}

/// PUBACKs paired with their PUBLISH, read on from where it stopped.
#[derive(Default)]
struct Pairing {
    read: usize,
    sent: HashMap<(u64, u16), (String, Vec<u8>)>,
}

impl Pairing {
    fn more(&mut self, wire: &[WirePacket]) -> Vec<Acked> {
        let mut acked = Vec::new();
        for p in &wire[self.read..] {
            match (p.kind, p.to_remote, p.packet_id) {
                (PUBLISH, true, Some(id)) => {
                    self.sent
                        .insert((p.conn, id), (p.topic.clone(), p.payload.clone()));
                }
                (PUBACK, false, Some(id)) if p.reason < 0x80 => {
                    if let Some((topic, payload)) = self.sent.get(&(p.conn, id)) {
                        acked.push(Acked {
                            incarnation: p.incarnation,
                            topic: topic.clone(),
                            payload: payload.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        self.read = wire.len();
        acked
    }
}

/// Where a relay connection logs what it passes on.
struct Log {
    conn: u64,
    incarnation: u64,
    wire: Arc<Mutex<Vec<WirePacket>>>,
    logged: Arc<watch::Sender<usize>>,
}

/// Both directions of one relay connection, packet by packet; either side
/// closing ends both.
async fn pipe(inbound: TcpStream, outbound: TcpStream, log: Log, swallow: Arc<Mutex<HashSet<u8>>>) {
    let (mut bridge_rx, mut bridge_tx) = inbound.into_split();
    let (mut remote_rx, mut remote_tx) = outbound.into_split();
    // The protocol level of the bridge's CONNECT: MQTT 5 PUBLISH packets
    // carry properties.
    let level = std::sync::atomic::AtomicU8::new(0);
    let none: Mutex<HashSet<u8>> = Mutex::default();
    let up = relay_direction(&mut bridge_rx, &mut remote_tx, true, &log, &level, &none);
    let down = relay_direction(
        &mut remote_rx,
        &mut bridge_tx,
        false,
        &log,
        &level,
        &swallow,
    );
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

async fn relay_direction(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    to_remote: bool,
    log: &Log,
    level: &std::sync::atomic::AtomicU8,
    swallow: &Mutex<HashSet<u8>>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    use tokio::io::AsyncReadExt;
    let mut buf = bytes::BytesMut::with_capacity(64 * 1024);
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        out.clear();
        while let Some(len) = frame_len(&buf) {
            if buf.len() < len {
                break;
            }
            let frame = buf.split_to(len);
            let mut packet = describe(&frame, level.load(Relaxed));
            if packet.kind == 1 {
                level.store(packet.qos, Relaxed);
            }
            packet.conn = log.conn;
            packet.incarnation = log.incarnation;
            packet.to_remote = to_remote;
            packet.swallowed = swallow.lock().unwrap().contains(&packet.kind);
            if !packet.swallowed {
                out.extend_from_slice(&frame);
            }
            let n = {
                let mut wire = log.wire.lock().unwrap();
                wire.push(packet);
                wire.len()
            };
            log.logged.send_replace(n);
        }
        if to.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// The length of the packet `buf` starts with, once its fixed header is
/// complete.
fn frame_len(buf: &[u8]) -> Option<usize> {
    let mut len = 0usize;
    for i in 1..5 {
        let b = *buf.get(i)?;
        len |= usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return Some(i + 1 + len);
        }
    }
    panic!("the relay read a malformed remaining length");
}

/// What the relay logs of one whole packet (`level`: the connection's
/// protocol level; a CONNECT's own level is returned in `qos`).
fn describe(frame: &[u8], level: u8) -> WirePacket {
    let kind = frame[0] >> 4;
    let mut at = 1;
    while frame[at] & 0x80 != 0 {
        at += 1;
    }
    let body = &frame[at + 1..];
    let u16_at = |i: usize| u16::from_be_bytes([body[i], body[i + 1]]);
    let mut packet = WirePacket {
        conn: 0,
        incarnation: 0,
        to_remote: false,
        kind,
        packet_id: None,
        qos: 0,
        dup: false,
        topic: String::new(),
        payload: Vec::new(),
        reason: 0,
        swallowed: false,
    };
    match kind {
        // Protocol name `00 04 MQTT`, then the level (0x80: a bridge).
        1 => packet.qos = body[6] & 0x7f,
        PUBLISH => {
            packet.qos = (frame[0] >> 1) & 3;
            packet.dup = frame[0] & 8 != 0;
            let topic_len = usize::from(u16_at(0));
            packet.topic = String::from_utf8_lossy(&body[2..2 + topic_len]).into_owned();
            let mut pos = 2 + topic_len;
            if packet.qos > 0 {
                packet.packet_id = Some(u16_at(pos));
                pos += 2;
            }
            if level == 5 {
                let (mut props, mut shift) = (0usize, 0);
                loop {
                    let b = body[pos];
                    pos += 1;
                    props |= usize::from(b & 0x7f) << shift;
                    shift += 7;
                    if b & 0x80 == 0 {
                        break;
                    }
                }
                pos += props;
            }
            packet.payload = body[pos..].to_vec();
        }
        PUBACK | PUBREC | PUBREL | PUBCOMP => {
            packet.packet_id = Some(u16_at(0));
            packet.reason = body.get(2).copied().unwrap_or(0);
        }
        _ => {}
    }
    packet
}

/// What a subscriber at the remote received: topic and payload, in order.
pub type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A QoS 1 subscriber with a persistent session at the remote, acking
/// each message after recording it and reconnecting each time the remote
/// starts again; [`Collector::go_offline`] leaves the remote to queue for
/// it.
pub struct Collector {
    pub seen: Seen,
    count: watch::Receiver<usize>,
    online: watch::Sender<bool>,
    connected: watch::Receiver<bool>,
}

impl Collector {
    pub async fn start(remote: &Mosquitto, client_id: &str, filter: &str) -> Collector {
        let seen: Seen = Arc::default();
        let (count_tx, count) = watch::channel(0usize);
        let (online, mut online_rx) = watch::channel(true);
        let (connected_tx, connected) = watch::channel(false);
        let mut up = remote.up.subscribe();
        let addr = remote.addr();
        let (id, filter, record) = (client_id.to_owned(), filter.to_owned(), seen.clone());
        tokio::spawn(async move {
            loop {
                let online_now = online_rx.wait_for(|o| *o).await.is_ok();
                if !online_now {
                    return;
                }
                let _ = *up.borrow_and_update();
                if let Ok(stream) = TcpStream::connect(addr).await {
                    let mut c = Raw::new(stream, crate::broker_support::v4());
                    let mut opts = ConnectOpts::persistent(0);
                    opts.keep_alive = 0;
                    c.send_connect(&id, opts).await;
                    if let Ok(Some(Packet::ConnAck(_))) = c.recv_within(WAIT).await {
                        let options = SubscriptionOptions {
                            qos: QoS::AtLeastOnce,
                            ..SubscriptionOptions::default()
                        };
                        c.send(Packet::Subscribe(saguin::broker::codec::Subscribe {
                            packet_id: 1,
                            filters: vec![saguin::broker::codec::SubscribeFilter {
                                filter: filter.clone(),
                                options,
                            }],
                            properties: Default::default(),
                        }))
                        .await;
                        loop {
                            let packet = tokio::select! {
                                p = c.recv_within(Duration::from_secs(3600)) => p,
                                _ = async { online_rx.wait_for(|o| !*o).await.is_ok() } => {
                                    // The session stays: the remote queues.
                                    c.send(Packet::Disconnect(
                                        saguin::broker::codec::Disconnect::new(
                                            saguin::broker::codec::ReasonCode::Success,
                                        ),
                                    ))
                                    .await;
                                    break;
                                }
                            };
                            match packet {
                                Ok(Some(Packet::Publish(p))) => {
                                    let n = {
                                        let mut s = record.lock().unwrap();
                                        s.push((p.topic.to_string(), p.payload.to_vec()));
                                        s.len()
                                    };
                                    if p.qos == QoS::AtLeastOnce {
                                        c.send(Packet::PubAck(PubAck::new(p.packet_id))).await;
                                    }
                                    count_tx.send_replace(n);
                                }
                                Ok(Some(Packet::SubAck(_))) => {
                                    connected_tx.send_replace(true);
                                }
                                Ok(Some(_)) => {}
                                Ok(None) | Err(()) => break,
                            }
                        }
                    }
                }
                connected_tx.send_replace(false);
                if !*online_rx.borrow() {
                    continue;
                }
                // Down: until the remote has started again.
                if up.changed().await.is_err() {
                    return;
                }
            }
        });
        let mut collector = Collector {
            seen,
            count,
            online,
            connected,
        };
        collector.wait_connected(true).await;
        collector
    }

    async fn wait_connected(&mut self, connected: bool) {
        tokio::time::timeout(WAIT, self.connected.wait_for(|c| *c == connected))
            .await
            .expect("the collector did not (dis)connect")
            .expect("collector running");
    }

    /// Wait (bounded) until it is subscribed again after its remote
    /// started again.
    pub async fn wait_subscribed(&mut self) {
        self.wait_connected(true).await;
    }

    /// Disconnect (the session stays, the remote queues for it) and wait
    /// until it has.
    pub async fn go_offline(&mut self) {
        self.online.send_replace(false);
        self.wait_connected(false).await;
    }

    /// Connect again (at once, or once the remote is up) and resubscribe.
    pub fn go_online(&self) {
        self.online.send_replace(true);
    }

    /// Wait (bounded by `within`) until `done` holds for what was seen;
    /// false when it did not in time.
    pub async fn try_wait_until(
        &mut self,
        within: Duration,
        done: impl Fn(&[(String, Vec<u8>)]) -> bool,
    ) -> bool {
        let seen = self.seen.clone();
        tokio::time::timeout(within, self.count.wait_for(|_| done(&seen.lock().unwrap())))
            .await
            .is_ok()
    }

    /// Wait (bounded by `within`) until `done` holds for what was seen.
    pub async fn wait_until(
        &mut self,
        within: Duration,
        done: impl Fn(&[(String, Vec<u8>)]) -> bool,
    ) {
        let seen = self.seen.clone();
        let result =
            tokio::time::timeout(within, self.count.wait_for(|_| done(&seen.lock().unwrap())))
                .await;
        if result.is_err() {
            panic!(
                "the remote did not receive what was expected within {within:?}: {} messages",
                self.seen.lock().unwrap().len()
            );
        }
    }
}

/// A seeded xorshift source; the seed comes from `SAGUIN_TEST_SEED` or the
/// clock, and is printed so a failing run can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn seeded(test: &str) -> Rng {
        let seed = std::env::var("SAGUIN_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{test}: SAGUIN_TEST_SEED={seed}");
        Rng(seed | 1)
    }

    /// A source for choices that need no replay (ports).
    fn seeded_quietly() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng((nanos ^ u64::from(std::process::id()).rotate_left(32)) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A sqlite-backed saguin configuration with one bridge `yaml_bridge`.
pub fn saguin_yaml(dir: &std::path::Path, channels: &str, bridges: &str) -> String {
    format!(
        "listeners: [{{ name: mqtt, bind: 127.0.0.1:0 }}]
auth: {{ allow_anonymous: true }}
storage: [{{ name: db, kind: sqlite, file_path: {} }}]
channels:
{channels}
broker: {{ session_storage: db, session: {{ ack_commit_interval: 50ms }} }}
bridges:
{bridges}",
        dir.join("saguin.db").display()
    )
}

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// Every record of `channel` from the earliest, as `(topic, payload)`,
/// until `done` holds (bounded).
pub async fn read_channel(
    addr: SocketAddr,
    filter: &str,
    within: Duration,
    done: impl Fn(&[(String, Vec<u8>)]) -> bool,
) -> Vec<(String, Vec<u8>)> {
    let mut c = Raw::tcp(addr, v5()).await;
    c.connect("reader", ConnectOpts::clean()).await;
    c.send(Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: filter.to_owned(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..SubscriptionOptions::default()
            },
        }],
        properties: SubscribeProperties {
            subscription_identifier: None,
            user_properties: vec![("saguin-from".into(), "earliest".into())],
        },
    }))
    .await;
    let mut seen = Vec::new();
    let read = async {
        while !done(&seen) {
            match c.recv_within(within).await {
                Ok(Some(Packet::Publish(p))) => {
                    seen.push((p.topic.to_string(), p.payload.to_vec()));
                    c.send(Packet::PubAck(PubAck::new(p.packet_id))).await;
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
    seen
}
