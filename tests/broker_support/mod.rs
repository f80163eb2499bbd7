//! Shared by the broker integration tests: start the real `saguin serve` on
//! 127.0.0.1 port 0 with a configuration in a temp dir, find its listeners in
//! its log, and talk to it with raw MQTT (the project's codec), rumqttc or
//! the Mosquitto command-line clients.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use saguin::broker::codec::{
    self, ByteStr, Connect, ConnectProperties, FrameDecoder, LastWill, Packet, ProtocolVersion,
    PubAck, Publish, PublishProperties, QoS, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions, WillProperties,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub mod volume;

/// Every wait in these tests is bounded by this.
pub const WAIT: Duration = Duration::from_secs(10);

/// A running `saguin serve`.
pub struct Broker {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub listeners: HashMap<String, SocketAddr>,
    pub log: Arc<Mutex<Vec<String>>>,
    /// Notified after each line is added to `log`.
    logged: Arc<Condvar>,
}

impl Broker {
    /// Start with `yaml` as the configuration (bind addresses should be
    /// `127.0.0.1:0`). Waits for a `listening` line per listener.
    pub fn start(yaml: &str) -> Broker {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_in(dir, yaml)
    }

    /// Like [`start`], in a directory already holding files the config names.
    pub fn start_in(dir: tempfile::TempDir, yaml: &str) -> Broker {
        Self::start_with(dir, yaml, |_| {})
    }

    /// Like [`start_in`], with `adjust` applied to the command first (for
    /// a test that limits the process).
    pub fn start_with(
        dir: tempfile::TempDir,
        yaml: &str,
        adjust: impl FnOnce(&mut Command),
    ) -> Broker {
        let path = dir.path().join("saguin.yaml");
        let yaml = with_session_storage(yaml, dir.path());
        let yaml = yaml.as_str();
        std::fs::write(&path, yaml).expect("write config");
        let expected = yaml.matches("bind:").count();
        let mut command = Command::new(env!("CARGO_BIN_EXE_saguin"));
        command
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        adjust(&mut command);
        let mut child = command.spawn().expect("spawn saguin");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        let logged = Arc::new(Condvar::new());
        let logged2 = logged.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("msg=\"listening\"") {
                    let name = field(&line, "listener");
                    let addr = field(&line, "addr");
                    if let (Some(name), Some(addr)) = (name, addr) {
                        let _ = tx.send((name, addr.parse::<SocketAddr>().expect("addr")));
                    }
                }
                log2.lock().unwrap().push(line);
                logged2.notify_all();
            }
        });
        let mut listeners = HashMap::new();
        while listeners.len() < expected {
            match rx.recv_timeout(WAIT) {
                Ok((name, addr)) => {
                    listeners.insert(name, addr);
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("saguin did not start listening: {:#?}", log.lock().unwrap());
                }
            }
        }
        Broker {
            child,
            dir,
            listeners,
            log,
            logged,
        }
    }

    /// A plain configuration with one TCP listener `mqtt` and `extra` YAML.
    pub fn plain(extra: &str) -> Broker {
        Self::start(&format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n{extra}"
        ))
    }

    pub fn anonymous() -> Broker {
        Self::plain("auth:\n  allow_anonymous: true\n")
    }

    pub fn addr(&self) -> SocketAddr {
        self.listeners["mqtt"]
    }

    pub fn port(&self) -> u16 {
        self.addr().port()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The first log line `matches` accepts, waiting (bounded) for the
    /// broker to write it: log lines reach the test through a pipe.
    pub fn wait_log(&self, matches: impl Fn(&str) -> bool) -> String {
        self.wait_log_count(matches, 1).remove(0)
    }

    /// Every log line `matches` accepts, once there are at least `count`
    /// (bounded wait).
    pub fn wait_log_count(&self, matches: impl Fn(&str) -> bool, count: usize) -> Vec<String> {
        let (log, timeout) = self
            .logged
            .wait_timeout_while(self.log.lock().unwrap(), WAIT, |log| {
                log.iter().filter(|l| matches(l)).count() < count
            })
            .unwrap();
        if timeout.timed_out() {
            drop(log);
            panic!(
                "fewer than {count} such log lines within {WAIT:?}:\n{}",
                self.log_text()
            );
        }
        log.iter().filter(|l| matches(l)).cloned().collect()
    }

    /// The first log line `then` accepts that was logged after the first
    /// line `first` accepts (bounded wait): an event known to follow
    /// another, where a count taken beforehand could be met by a line of
    /// an earlier round logged in between.
    pub fn wait_log_after(
        &self,
        first: impl Fn(&str) -> bool,
        then: impl Fn(&str) -> bool,
    ) -> String {
        let found = |log: &[String]| {
            let start = log.iter().position(|l| first(l))?;
            log[start + 1..].iter().find(|l| then(l)).cloned()
        };
        let (log, timeout) = self
            .logged
            .wait_timeout_while(self.log.lock().unwrap(), WAIT, |log| found(log).is_none())
            .unwrap();
        match found(&log) {
            Some(line) => line,
            None => {
                drop(log);
                assert!(timeout.timed_out());
                panic!(
                    "no such log line after the first one within {WAIT:?}:\n{}",
                    self.log_text()
                );
            }
        }
    }

    /// Start a new broker on this one's directory (this one must have
    /// stopped, or is killed now).
    pub fn restart(self, yaml: &str) -> Broker {
        self.restart_with(yaml, |_| {})
    }

    /// Like [`restart`], with `adjust` applied to the new command.
    pub fn restart_with(mut self, yaml: &str, adjust: impl FnOnce(&mut Command)) -> Broker {
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"));
        drop(self);
        Broker::start_with(dir, yaml, adjust)
    }

    /// SIGTERM, then the exit code (bounded wait).
    pub fn terminate(&mut self) -> Option<i32> {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether this test crate's brokers keep sessions and retained messages
/// in a sqlite provider: declared in Cargo.toml, where a `[[test]]` target
/// named `*_on_sqlite` builds a test file a second time for that (the
/// conformance and session tests), and fixed when the crate is compiled.
const ON_SQLITE: bool = ends_with(env!("CARGO_CRATE_NAME"), "_on_sqlite");

const fn ends_with(name: &str, suffix: &str) -> bool {
    let (name, suffix) = (name.as_bytes(), suffix.as_bytes());
    if suffix.len() > name.len() {
        return false;
    }
    let start = name.len() - suffix.len();
    let mut i = 0;
    while i < suffix.len() {
        if name[start + i] != suffix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A crate declared [`ON_SQLITE`], or any run with
/// `SAGUIN_TEST_SESSION_STORAGE=sqlite`, keeps sessions and retained
/// messages in a sqlite provider for configurations that name no storage
/// of their own, so every behaviour is checked on both.
fn with_session_storage(yaml: &str, dir: &Path) -> String {
    let wanted =
        ON_SQLITE || std::env::var("SAGUIN_TEST_SESSION_STORAGE").is_ok_and(|v| v == "sqlite");
    if !wanted || yaml.contains("storage:") || yaml.contains("\nbroker:") {
        return yaml.to_owned();
    }
    format!(
        "{yaml}{}storage:\n  - name: sessions\n    kind: sqlite\n    file_path: {}\nbroker:\n  session_storage: sessions\n  retained_storage: sessions\n",
        if yaml.ends_with('\n') { "" } else { "\n" },
        dir.join("sessions.db").display()
    )
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A clean MQTT 5 consumer, `consumer`, of `filter` over a channel from
/// the earliest record it holds (`saguin-from: earliest`), granted QoS 1.
pub async fn consumer_from_earliest(addr: SocketAddr, filter: &str) -> Raw<TcpStream> {
    let mut c = Raw::tcp(addr, v5()).await;
    c.connect("consumer", ConnectOpts::clean()).await;
    let reasons = c
        .subscribe_with_user_properties(1, filter, 1, &[("saguin-from", "earliest")])
        .await;
    assert_eq!(reasons, vec![codec::ReasonCode::GrantedQoS1]);
    c
}

/// `saguin status` against the broker's `metrics` listener, with `args`
/// before it (`--json`): what it printed on stdout.
pub fn status_of(broker: &Broker, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("status")
        .args(args)
        .arg("--metrics")
        .arg(broker.listeners["metrics"].to_string())
        .output()
        .expect("run saguin status");
    String::from_utf8(out.stdout).expect("status prints UTF-8")
}

/// `saguin status --json` against the broker's `metrics` listener.
pub fn status_json(broker: &Broker) -> serde_json::Value {
    let text = status_of(broker, &["--json"]);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("status --json: {e}: {text}"))
}

/// `key=value` or `key="value"` from a logfmt line.
pub fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        Some(quoted[..quoted.find('"')?].to_owned())
    } else {
        Some(rest.split_whitespace().next()?.to_owned())
    }
}

/// Are the Mosquitto command-line clients installed? When not, say so loudly.
pub fn have_mosquitto_clients(test: &str) -> bool {
    let ok = Command::new("mosquitto_pub")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        say_skipped(
            test,
            "mosquitto_pub/mosquitto_sub not installed (apt-get install mosquitto-clients)",
        );
    }
    ok
}

/// Set (to `1`) where every peer a test drives must be there: `.ci/run`
/// installs them, so a missing one is a failed install, and a test that
/// would pass by skipping fails instead. On a developer's machine, unset,
/// a missing peer is a loud skip.
pub const REQUIRE_PEERS: &str = "SAGUIN_REQUIRE_PEERS";

/// `SKIP test: why` on the process's standard error itself: the test
/// harness keeps what `eprintln!` writes from a test that passes, and a
/// skip nobody sees is a silent one. Where [`REQUIRE_PEERS`] is set, the
/// test fails with the same words instead.
pub fn say_skipped(test: &str, why: &str) {
    use std::io::Write;
    if std::env::var(REQUIRE_PEERS).is_ok_and(|v| v == "1") {
        panic!(
            "{test} cannot run here ({why}) and {REQUIRE_PEERS}=1 says every peer was installed"
        );
    }
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {why}");
}

/// A skip that stays a skip wherever it runs: what this machine cannot do
/// at all (mount a file system without the privilege to), not a peer that
/// was not installed.
pub fn say_cannot(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {why}");
}

/// The append channel `channel` of `provider`, opened (created empty if
/// new) to fill or read before or after a broker runs on it.
pub fn append_store(
    provider: &dyn saguin::storage::contract::Provider,
    channel: &str,
) -> Arc<dyn saguin::storage::contract::AppendStore> {
    provider
        .open_channel(channel, saguin_format::model::ChannelKind::Append)
        .expect("open the channel")
        .as_append()
        .expect("an append channel")
        .clone()
}

pub fn write_file(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write file");
    path
}

/// A raw MQTT client over any transport, on the project's codec.
pub struct Raw<S> {
    pub stream: S,
    pub version: ProtocolVersion,
    rbuf: BytesMut,
    decoder: FrameDecoder,
}

/// A Will: topic, payload, QoS, retain, delay interval.
pub type WillSpec = (String, Vec<u8>, u8, bool, Option<u32>);

/// Options for [`Raw::connect`].
#[derive(Clone, Default)]
pub struct ConnectOpts {
    pub clean_start: bool,
    pub keep_alive: u16,
    pub username: Option<String>,
    pub password: Option<String>,
    pub will: Option<WillSpec>,
    pub properties: ConnectProperties,
}

impl ConnectOpts {
    pub fn clean() -> Self {
        ConnectOpts {
            clean_start: true,
            keep_alive: 60,
            ..Default::default()
        }
    }
    pub fn persistent(expiry: u32) -> Self {
        let mut o = ConnectOpts {
            clean_start: false,
            keep_alive: 60,
            ..Default::default()
        };
        o.properties.session_expiry_interval = Some(expiry);
        o
    }
}

pub fn v5() -> ProtocolVersion {
    ProtocolVersion::V5
}
pub fn v4() -> ProtocolVersion {
    ProtocolVersion::V311
}

pub fn qos(q: u8) -> QoS {
    QoS::from_u8(q).unwrap()
}

impl Raw<TcpStream> {
    pub async fn tcp(addr: SocketAddr, version: ProtocolVersion) -> Raw<TcpStream> {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("connect timeout")
            .expect("connect");
        Raw::new(stream, version)
    }
    /// Nothing has arrived so far, checked without waiting: for a peer
    /// that cannot answer a ping (a connection not yet accepted).
    pub fn expect_nothing_yet(&mut self) {
        match self.stream.try_read_buf(&mut self.rbuf) {
            Ok(0) => panic!("expected nothing, the connection closed"),
            Ok(_) => panic!("expected nothing, got {:?}", self.rbuf),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("expected nothing, got {e}"),
        }
        assert!(
            self.rbuf.is_empty(),
            "expected nothing, got {:?}",
            self.rbuf
        );
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    pub fn new(stream: S, version: ProtocolVersion) -> Raw<S> {
        Raw {
            stream,
            version,
            rbuf: BytesMut::new(),
            decoder: FrameDecoder::client(16 * 1024 * 1024, version),
        }
    }

    pub async fn send(&mut self, packet: Packet) {
        let mut buf = BytesMut::new();
        codec::encode(&packet, self.version, &mut buf).expect("encode");
        self.send_bytes(&buf).await;
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        let _ = tokio::time::timeout(WAIT, self.stream.write_all(bytes)).await;
    }

    /// The next packet; None when the broker closed the connection.
    pub async fn recv(&mut self) -> Option<Packet> {
        self.recv_within(WAIT)
            .await
            .expect("no packet within the wait")
    }

    /// Err(()) on timeout, Ok(None) on close.
    pub async fn recv_within(&mut self, wait: Duration) -> Result<Option<Packet>, ()> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match self.decoder.decode(&mut self.rbuf) {
                Ok(Some(p)) => return Ok(Some(p)),
                Ok(None) => {}
                Err(e) => panic!("broker sent something undecodable: {e}"),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.rbuf)).await {
                Err(_) => return Err(()),
                Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Expect the broker to close the connection (after any packets,
    /// which are returned).
    pub async fn expect_close(&mut self) -> Vec<Packet> {
        let mut seen = Vec::new();
        loop {
            match self.recv_within(WAIT).await {
                Ok(Some(p)) => seen.push(p),
                Ok(None) => return seen,
                Err(()) => panic!("connection not closed; got {seen:?}"),
            }
        }
    }

    /// Sends PINGREQ and returns what arrives before its PINGRESP. The
    /// broker's one state answers events in order and queues a client's
    /// packets in order, so everything it queued for this client before it
    /// read the PINGREQ has then arrived: a barrier, not a wait.
    pub async fn round_trip(&mut self) -> Vec<Packet> {
        self.send(Packet::PingReq).await;
        let mut before = Vec::new();
        loop {
            match self.recv().await {
                Some(Packet::PingResp) => return before,
                Some(p) => before.push(p),
                None => panic!("closed before PINGRESP; got {before:?}"),
            }
        }
    }

    /// Nothing is on its way to this client: a ping round trip brings
    /// nothing before its PINGRESP. The event that would have sent
    /// something must have been handled first (a publisher's PUBACK or
    /// PUBCOMP, or the publisher's own [`round_trip`](Self::round_trip)).
    pub async fn expect_nothing(&mut self) {
        let before = self.round_trip().await;
        assert!(before.is_empty(), "expected nothing, got {before:?}");
    }

    pub async fn connect(&mut self, client_id: &str, opts: ConnectOpts) -> codec::ConnAck {
        self.send_connect(client_id, opts).await;
        match self.recv().await {
            Some(Packet::ConnAck(ack)) => ack,
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    /// Send CONNECT without waiting for the answer.
    pub async fn send_connect(&mut self, client_id: &str, opts: ConnectOpts) {
        let will = opts
            .will
            .map(|(topic, payload, q, retain, delay)| LastWill {
                topic: ByteStr::from(topic),
                payload: Bytes::from(payload),
                qos: qos(q),
                retain,
                properties: WillProperties {
                    will_delay_interval: delay,
                    ..Default::default()
                },
            });
        let properties = if self.version == ProtocolVersion::V5 {
            opts.properties
        } else {
            ConnectProperties::default()
        };
        self.send(Packet::Connect(Connect {
            protocol: self.version,
            clean_start: opts.clean_start,
            keep_alive: opts.keep_alive,
            client_id: client_id.to_owned(),
            will,
            username: opts.username,
            password: opts.password.map(Bytes::from),
            properties,
        }))
        .await;
    }

    pub async fn subscribe(
        &mut self,
        packet_id: u16,
        filter: &str,
        q: u8,
    ) -> Vec<codec::ReasonCode> {
        self.subscribe_with(
            packet_id,
            filter,
            SubscriptionOptions {
                qos: qos(q),
                ..Default::default()
            },
            None,
        )
        .await
    }

    pub async fn subscribe_with(
        &mut self,
        packet_id: u16,
        filter: &str,
        options: SubscriptionOptions,
        subscription_id: Option<u32>,
    ) -> Vec<codec::ReasonCode> {
        self.send(Packet::Subscribe(Subscribe {
            packet_id,
            filters: vec![SubscribeFilter {
                filter: filter.to_owned(),
                options,
            }],
            properties: SubscribeProperties {
                subscription_identifier: subscription_id,
                ..Default::default()
            },
        }))
        .await;
        loop {
            match self.recv().await {
                Some(Packet::SubAck(ack)) => {
                    assert_eq!(ack.packet_id, packet_id);
                    return ack.reasons;
                }
                // Retained messages may not precede SUBACK, but QoS 0
                // traffic from earlier subscriptions may.
                Some(Packet::Publish(_)) => continue,
                other => panic!("expected SUBACK, got {other:?}"),
            }
        }
    }

    pub async fn publish(
        &mut self,
        topic: &str,
        payload: &[u8],
        q: u8,
        retain: bool,
        packet_id: u16,
    ) {
        self.publish_props(
            topic,
            payload,
            q,
            retain,
            packet_id,
            PublishProperties::default(),
        )
        .await
    }

    pub async fn publish_props(
        &mut self,
        topic: &str,
        payload: &[u8],
        q: u8,
        retain: bool,
        packet_id: u16,
        properties: PublishProperties,
    ) {
        self.send(Packet::Publish(Publish {
            dup: false,
            qos: qos(q),
            retain,
            topic: ByteStr::from(topic),
            packet_id: if q == 0 { 0 } else { packet_id },
            properties,
            payload: Bytes::copy_from_slice(payload),
        }))
        .await;
    }

    /// Publish and complete the QoS handshake.
    pub async fn publish_acked(
        &mut self,
        topic: &str,
        payload: &[u8],
        q: u8,
        retain: bool,
        packet_id: u16,
    ) {
        self.publish(topic, payload, q, retain, packet_id).await;
        match q {
            0 => {}
            1 => match self.recv().await {
                Some(Packet::PubAck(a)) => assert_eq!(a.packet_id, packet_id),
                other => panic!("expected PUBACK, got {other:?}"),
            },
            _ => {
                match self.recv().await {
                    Some(Packet::PubRec(a)) => assert_eq!(a.packet_id, packet_id),
                    other => panic!("expected PUBREC, got {other:?}"),
                }
                self.send(Packet::PubRel(PubAck::new(packet_id))).await;
                match self.recv().await {
                    Some(Packet::PubComp(a)) => assert_eq!(a.packet_id, packet_id),
                    other => panic!("expected PUBCOMP, got {other:?}"),
                }
            }
        }
    }

    /// The next PUBLISH (acknowledging it per its QoS when `ack`).
    pub async fn next_publish(&mut self, ack: bool) -> Publish {
        loop {
            match self.recv().await {
                Some(Packet::Publish(p)) => {
                    if ack {
                        self.ack_publish(&p).await;
                    }
                    return p;
                }
                Some(Packet::PubRel(r)) if ack => {
                    self.send(Packet::PubComp(PubAck::new(r.packet_id))).await
                }
                other => panic!("expected PUBLISH, got {other:?}"),
            }
        }
    }

    pub async fn ack_publish(&mut self, p: &Publish) {
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.send(Packet::PubAck(PubAck::new(p.packet_id))).await,
            QoS::ExactlyOnce => {
                self.send(Packet::PubRec(PubAck::new(p.packet_id))).await;
                match self.recv().await {
                    Some(Packet::PubRel(r)) => assert_eq!(r.packet_id, p.packet_id),
                    other => panic!("expected PUBREL, got {other:?}"),
                }
                self.send(Packet::PubComp(PubAck::new(p.packet_id))).await;
            }
        }
    }

    pub async fn disconnect(mut self) {
        self.send(Packet::Disconnect(codec::Disconnect::new(
            codec::ReasonCode::Success,
        )))
        .await;
        let _ = self.stream.shutdown().await;
    }
}

/// A client that never stops writing: `chunk` is written over and over
/// while what the broker sends is read. Returns the DISCONNECT the broker
/// sent, or `None` if the connection ended (or broke) without one. The
/// writing stops once reading ends; write errors (a broken pipe once the
/// broker has closed) are ignored, as a client busy writing would.
pub async fn read_goodbye_while_writing(
    stream: TcpStream,
    version: ProtocolVersion,
    chunk: impl FnMut() -> Vec<u8> + Send + 'static,
) -> Option<codec::Disconnect> {
    read_goodbye_while_writing_after(stream, version, chunk, None).await
}

/// When many writers start together: each waits for `start` to be true and
/// says on `writing` once its first chunk is written.
pub struct WriteGate {
    pub start: tokio::sync::watch::Receiver<bool>,
    pub writing: tokio::sync::mpsc::UnboundedSender<()>,
}

/// [`read_goodbye_while_writing`], the writing held back by `gate`.
pub async fn read_goodbye_while_writing_after(
    stream: TcpStream,
    version: ProtocolVersion,
    chunk: impl FnMut() -> Vec<u8> + Send + 'static,
    gate: Option<WriteGate>,
) -> Option<codec::Disconnect> {
    read_goodbye_while_writing_lagging(stream, version, chunk, gate, 0).await
}

/// [`read_goodbye_while_writing_after`] by a client slow to read: it reads
/// nothing until it has written `lag` bytes (or its writes fail), so a
/// broker that closes at once after its DISCONNECT - a reset, with the
/// client's input unread - loses the reason before the client reads it.
pub async fn read_goodbye_while_writing_lagging(
    stream: TcpStream,
    version: ProtocolVersion,
    mut chunk: impl FnMut() -> Vec<u8> + Send + 'static,
    gate: Option<WriteGate>,
    lag: usize,
) -> Option<codec::Disconnect> {
    let (mut rd, mut wr) = stream.into_split();
    let (lagged_tx, lagged) = tokio::sync::oneshot::channel::<()>();
    let writing = tokio::spawn(async move {
        let mut lagged_tx = Some(lagged_tx);
        let mut written = 0usize;
        let mut gate = gate;
        if let Some(g) = gate.as_mut() {
            let _ = g.start.wait_for(|open| *open).await;
        }
        loop {
            if written >= lag {
                if let Some(tx) = lagged_tx.take() {
                    let _ = tx.send(());
                }
            }
            let bytes = chunk();
            if wr.write_all(&bytes).await.is_err() {
                return;
            }
            written += bytes.len();
            if let Some(g) = gate.take() {
                let _ = g.writing.send(());
            }
            // Still writing without pause, but leaving the test's reader
            // (and its other writers) their turn on the runtime.
            tokio::task::yield_now().await;
        }
    });
    // Sent once the lag is written; dropped if the writes fail first.
    let _ = tokio::time::timeout(WAIT, lagged).await;
    let mut decoder = FrameDecoder::client(16 * 1024 * 1024, version);
    let mut buf = BytesMut::new();
    // Bounded by the whole test's waits: many of these may run at once.
    let goodbye = tokio::time::timeout(WAIT * 3, async {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(Packet::Disconnect(d))) => return Some(d),
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => panic!("broker sent something undecodable: {e}"),
            }
            match rd.read_buf(&mut buf).await {
                Ok(0) => {
                    eprintln!("DEBUG eof");
                    return None;
                }
                Err(e) => {
                    eprintln!("DEBUG err {e}");
                    return None;
                }
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("neither a DISCONNECT nor a close within the wait");
    writing.abort();
    goodbye
}

/// The 4 bytes a broker answers to a hand-built MQTT 3.1.1 CONNECT
/// (keep alive 60, no will, no credentials) with `client_id` and the clean
/// session flag: 3.1.1's CONNACK layout on the wire, return code last.
pub async fn v311_connack_bytes(addr: SocketAddr, client_id: &[u8], clean: bool) -> [u8; 4] {
    let mut raw = TcpStream::connect(addr).await.unwrap();
    let flags = if clean { 0x02 } else { 0x00 };
    let mut connect = vec![0x10, (12 + client_id.len()) as u8];
    connect.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, flags, 0, 60]);
    connect.extend_from_slice(&(client_id.len() as u16).to_be_bytes());
    connect.extend_from_slice(client_id);
    raw.write_all(&connect).await.unwrap();
    let mut ack = [0u8; 4];
    tokio::time::timeout(WAIT, raw.read_exact(&mut ack))
        .await
        .unwrap()
        .unwrap();
    ack
}

/// The encoded bytes of `packet`, as they travel.
pub fn wire_bytes(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut buf = BytesMut::new();
    codec::encode(packet, version, &mut buf).expect("encode");
    buf.to_vec()
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    /// SUBSCRIBE to one filter carrying `user_properties` (MQTT 5), and the
    /// SUBACK's reasons.
    pub async fn subscribe_with_user_properties(
        &mut self,
        packet_id: u16,
        filter: &str,
        q: u8,
        user_properties: &[(&str, &str)],
    ) -> Vec<codec::ReasonCode> {
        self.suback_with_user_properties(packet_id, filter, q, user_properties)
            .await
            .reasons
    }

    /// As [`Raw::subscribe_with_user_properties`], the whole SUBACK.
    pub async fn suback_with_user_properties(
        &mut self,
        packet_id: u16,
        filter: &str,
        q: u8,
        user_properties: &[(&str, &str)],
    ) -> codec::SubAck {
        self.send(Packet::Subscribe(Subscribe {
            packet_id,
            filters: vec![SubscribeFilter {
                filter: filter.to_owned(),
                options: SubscriptionOptions {
                    qos: qos(q),
                    ..Default::default()
                },
            }],
            properties: SubscribeProperties {
                subscription_identifier: None,
                user_properties: user_properties
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            },
        }))
        .await;
        match self.recv().await {
            Some(Packet::SubAck(ack)) => {
                assert_eq!(ack.packet_id, packet_id);
                ack
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }
}

/// Prometheus text from the broker's `metrics` listener (the configuration
/// needs `metrics: {bind: 127.0.0.1:0}`).
pub fn metrics_text(broker: &Broker) -> String {
    use std::io::{Read, Write};
    let addr = broker.listeners["metrics"];
    let mut s = std::net::TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(WAIT)).expect("read timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request metrics");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// The value of one sample - its name with its labels, as exposed, such as
/// `saguin_channel_next{channel="telemetry"}` - or `None` when absent.
pub fn metric_sample(text: &str, sample: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Scrapes (bounded) until `sample` reads a value `want` accepts; returns
/// it. For a figure the broker reaches once its commits are in.
pub fn wait_metric_where(broker: &Broker, sample: &str, want: impl Fn(u64) -> bool) -> u64 {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = metrics_text(broker);
        if let Some(value) = metric_sample(&text, sample).filter(|v| want(*v)) {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sample} never came to what was waited for: {text}"
        );
        std::thread::yield_now();
    }
}

/// `GET path` from the broker's `metrics` listener: the status code and
/// the body.
pub fn metrics_get(broker: &Broker, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = broker.listeners["metrics"];
    let mut s = std::net::TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(WAIT)).expect("read timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The position the sqlite file holds for `reader`, if any.
pub fn sqlite_position(db: &Path, channel: &str, reader: &str) -> Option<u64> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .ok()?;
    conn.query_row(
        "SELECT offset FROM positions WHERE channel = ?1 AND reader = ?2",
        [channel, reader],
        |r| r.get(0),
    )
    .ok()
}

/// Waits (bounded) until the sqlite file holds a position for `reader`
/// that `want` accepts; returns it.
pub fn wait_position_where(
    db: &Path,
    channel: &str,
    reader: &str,
    want: impl Fn(u64) -> bool,
) -> u64 {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(offset) = sqlite_position(db, channel, reader).filter(|o| want(*o)) {
            return offset;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no such position for {reader} in {channel}: {:?}",
            sqlite_position(db, channel, reader)
        );
        std::thread::yield_now();
    }
}

/// Waits (bounded) until the sqlite file holds a position for `reader`.
pub fn wait_position(db: &Path, channel: &str, reader: &str) {
    wait_position_where(db, channel, reader, |_| true);
}

/// A clean MQTT 5 client `id` with a Receive Maximum of `window`: a queue
/// worker holds at most that many jobs at once.
pub async fn worker_connect(addr: SocketAddr, id: &str, window: u16) -> Raw<tokio::net::TcpStream> {
    let mut c = Raw::tcp(addr, v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.properties.receive_maximum = Some(window);
    c.connect(id, opts).await;
    c
}
