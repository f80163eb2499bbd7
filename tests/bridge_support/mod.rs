//! Shared by the bridge tests: a real Mosquitto per test (its own port,
//! configuration and persistence directory, readiness read from its log),
//! a TCP relay the test can cut, a collector at the remote that survives
//! the remote's restarts, and a seeded random source whose seed is printed.
#![allow(dead_code)]

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
        eprintln!("SKIP {test}: {MOSQUITTO} not installed (apt-get install mosquitto)");
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
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                log.0.lock().unwrap().push(line);
                log.1.notify_all();
            }
            log.0.lock().unwrap().push("(exited)".to_owned());
            log.1.notify_all();
        });
        let (lines, _) = self
            .log
            .1
            .wait_timeout_while(self.log.0.lock().unwrap(), WAIT, |l| {
                !l[start..]
                    .iter()
                    .any(|l| l.contains(" running") || l.contains("(exited)"))
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

    /// SIGTERM (Mosquitto writes its persistence file), wait, start again
    /// on the same port and directory.
    pub fn restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let _ = child.wait();
        }
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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A TCP relay between the bridge and its remote; [`Relay::cut`] drops
/// every connection through it (the listener stays).
pub struct Relay {
    pub addr: SocketAddr,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accepted: watch::Receiver<u64>,
}

impl Relay {
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (accepted_tx, accepted) = watch::channel(0u64);
        let held = conns.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let task = tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    let _ = inbound.shutdown().await;
                });
                held.lock().unwrap().push(task.abort_handle());
                accepted_tx.send_modify(|n| *n += 1);
            }
        });
        Relay {
            addr,
            conns,
            accepted,
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
}

/// What a subscriber at the remote received: topic and payload, in order.
pub type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A QoS 1 subscriber with a persistent session at the remote, acking
/// each message after recording it and reconnecting each time the remote
/// starts again.
pub struct Collector {
    pub seen: Seen,
    count: watch::Receiver<usize>,
}

impl Collector {
    pub async fn start(remote: &Mosquitto, client_id: &str, filter: &str) -> Collector {
        let seen: Seen = Arc::default();
        let (count_tx, count) = watch::channel(0usize);
        let mut up = remote.up.subscribe();
        let addr = remote.addr();
        let (id, filter, record) = (client_id.to_owned(), filter.to_owned(), seen.clone());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            loop {
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
                            match c.recv_within(Duration::from_secs(3600)).await {
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
                                    if let Some(r) = ready.take() {
                                        let _ = r.send(());
                                    }
                                }
                                Ok(Some(_)) => {}
                                Ok(None) | Err(()) => break,
                            }
                        }
                    }
                }
                // Down: until the remote has started again.
                if up.changed().await.is_err() {
                    return;
                }
            }
        });
        tokio::time::timeout(WAIT, ready_rx)
            .await
            .expect("the collector did not subscribe")
            .expect("collector running");
        Collector { seen, count }
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
