//! What a publisher costs on a provider, measured through a real broker
//! (`saguin bench`): the broker is started in this process on a scratch
//! configuration (as many append channels on the provider under test as
//! the operator's configuration puts on it, a listener on 127.0.0.1 port
//! 0), and MQTT 3.1.1 clients on the project's codec publish to it over
//! the loopback, each publish to the next channel in turn. Two runs: one
//! publisher paced to a rate, each publish's time to its PUBACK; then
//! publishers as fast as a window of 64 unacknowledged publishes each
//! allows, the publishes acknowledged a second, for a set time or until
//! they have made a set number of publishes in all: the scratch provider
//! has no bound, and a memory provider's records are RAM and a sqlite
//! provider's the disk of the machine a live broker may be running on.
//!
//! Spread, not to one channel: a sqlite transaction writes a page of the
//! records' index and a counter row for each channel it holds a record
//! of, and a memory provider's generation a file for each channel that
//! changed, so a provider sustains about half as many publishes spread
//! over 10,000 channels as to one (docs/benchmarks.md, "`saguin bench`'s
//! publishes spread over the provider's channels").

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::codec::{
    self, ByteStr, Connect, ConnectProperties, FrameDecoder, Packet, ProtocolVersion, Publish,
    PublishProperties, QoS,
};
use super::providers::{Providers, ShutdownStatus};
use super::server;
use super::snapshots::Snapshots;
use crate::config::Config;
use crate::storage::bench::Latencies;

/// The name of the scratch configuration's channel `index`; a publish
/// to it goes to `<name>/device`.
pub fn channel_name(index: usize) -> String {
    format!("bench{index}")
}
const VERSION: ProtocolVersion = ProtocolVersion::V311;
/// Publishes each fast publisher keeps unacknowledged.
const WINDOW: usize = 64;
/// A PUBACK later than this fails the run: the broker is not answering.
const STALL: Duration = Duration::from_secs(30);

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long and how hard to publish.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// The paced publisher's rate, publishes a second.
    pub paced_rate: f64,
    pub paced_for: Duration,
    pub fast_publishers: usize,
    /// The fast publishers stop at this time or at `fast_max` publishes in
    /// all, whichever comes first.
    pub fast_for: Duration,
    pub fast_max: u64,
    pub payload: usize,
    /// The append channels the publishes are spread over, named by
    /// [`channel_name`] (at least one).
    pub channels: usize,
}

/// What the runs measured.
#[derive(Clone, Debug)]
pub struct PublishCosts {
    /// Each paced publish's time from its write to its PUBACK.
    pub paced: Latencies,
    /// Publishes acknowledged a second by the fast publishers.
    pub sustained: f64,
    /// How many the fast publishers had acknowledged, and in how long.
    pub fast_acknowledged: u64,
    pub fast_elapsed: Duration,
}

/// Runs `load` against a broker serving `config` (which must name the
/// append channels `load.channels` counts and listen on 127.0.0.1 port 0),
/// then stops it gracefully, its providers closed. Blocking; it makes a
/// runtime of its own.
pub fn publish_costs(
    config: &Config,
    load: Load,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<PublishCosts, Error> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("saguin-bench")
        .build()?;
    let providers = Providers::open(config)?;
    let last_recorded = providers.last_recorded_time();
    let outcome = runtime.block_on(async {
        let mut server = server::prepare(
            config,
            providers.sessions(),
            providers.retained(),
            providers.channels(),
            last_recorded,
        )
        .await?;
        server.snapshots = Snapshots::new(&providers.snapshot_writers(), Instant::now());
        let addr = server
            .listeners
            .first()
            .ok_or("the scratch configuration has no listener")?
            .listener
            .local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server::run(server, async {
            let _ = stopped.await;
        }));
        let measured = measure(addr, load, progress).await;
        let _ = stop.send(());
        serving.await??;
        measured
    });
    let closed = providers.close(&ShutdownStatus::default());
    if let Some(failure) = closed.failures.first() {
        return Err(failure.clone().into());
    }
    outcome
}

async fn measure(
    addr: SocketAddr,
    load: Load,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<PublishCosts, Error> {
    let topics = Topics::new(load.channels);
    progress(&format!(
        "one publisher paced to {:.0} publishes a second",
        load.paced_rate
    ));
    let paced = paced(addr, load, topics.clone()).await?;
    progress(&format!(
        "{} publishers as fast as {WINDOW} in flight each allow",
        load.fast_publishers
    ));
    // Every publisher connected before any starts: the run times
    // publishing, not connecting.
    let mut conns = Vec::with_capacity(load.fast_publishers);
    for i in 0..load.fast_publishers {
        conns.push(Client::connect(addr, &format!("bench-fast-{i}")).await?);
    }
    let start = Instant::now();
    let run = Arc::new(FastRun {
        until: start + load.fast_for,
        left: AtomicU64::new(load.fast_max),
    });
    let runs: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, conn)| tokio::spawn(fast(conn, i, load, topics.clone(), run.clone())))
        .collect();
    let mut acknowledged = 0u64;
    let mut last = start;
    for run in runs {
        let (count, at) = run.await??;
        acknowledged += count;
        last = last.max(at);
    }
    let elapsed = last - start;
    Ok(PublishCosts {
        paced,
        sustained: if elapsed.is_zero() {
            0.0
        } else {
            acknowledged as f64 / elapsed.as_secs_f64()
        },
        fast_acknowledged: acknowledged,
        fast_elapsed: elapsed,
    })
}

/// What the fast publishers share: when they stop, and how many more
/// publishes they may make.
struct FastRun {
    until: Instant,
    left: AtomicU64,
}

impl FastRun {
    /// One more publish, if the run has not ended.
    fn take(&self) -> bool {
        Instant::now() < self.until
            && self
                .left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }
}

/// One publisher at `load.paced_rate`, each publish's write to its PUBACK
/// timed, a reader beside the writer so a slow answer does not slow the
/// pace.
async fn paced(addr: SocketAddr, load: Load, topics: Topics) -> Result<Latencies, Error> {
    let conn = Client::connect(addr, "bench-paced").await?;
    let (mut reader, mut writer) = conn.split();
    let sent: Arc<Mutex<HashMap<u16, Instant>>> = Arc::default();
    let total = (load.paced_rate * load.paced_for.as_secs_f64()).max(1.0) as u64;
    let payload = Bytes::from(vec![b'p'; load.payload]);
    let writing = {
        let sent = sent.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / load.paced_rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for i in 0..total {
                tick.tick().await;
                let packet_id = (i % 60_000 + 1) as u16;
                sent.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(packet_id, Instant::now());
                writer
                    .publish(packet_id, topics.at(i as usize), payload.clone())
                    .await?;
            }
            Ok::<_, Error>(writer)
        })
    };
    let mut times = Vec::with_capacity(total as usize);
    while (times.len() as u64) < total {
        match tokio::time::timeout(STALL, reader.next()).await?? {
            Packet::PubAck(ack) => {
                let at = sent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&ack.packet_id);
                if let Some(at) = at {
                    times.push(at.elapsed());
                }
            }
            other => return Err(format!("expected a PUBACK, got {other:?}").into()),
        }
    }
    writing.await??;
    Ok(Latencies::new(times))
}

/// One publisher keeping [`WINDOW`] publishes unacknowledged while `run`
/// lasts: how many were acknowledged before it ended, and when the last
/// of them was.
async fn fast(
    mut conn: Client,
    index: usize,
    load: Load,
    topics: Topics,
    run: Arc<FastRun>,
) -> Result<(u64, Instant), Error> {
    let payload = Bytes::from(vec![b'f'; load.payload]);
    let mut next_id: u64 = 0;
    // Each publisher starts at its own share of the channels, so they do
    // not all write the same channel at once.
    let first = index * topics.len() / load.fast_publishers.max(1);
    let mut send = || {
        let packet_id = (next_id % 60_000 + 1) as u16;
        let topic = topics.at(first + next_id as usize);
        next_id += 1;
        publish_packet(packet_id, topic, payload.clone())
    };
    let mut batch = BytesMut::new();
    let mut in_flight = 0;
    while in_flight < WINDOW && run.take() {
        codec::encode(&send(), VERSION, &mut batch)?;
        in_flight += 1;
    }
    conn.stream.write_all(&batch).await?;
    let mut acknowledged = 0u64;
    let mut last = Instant::now();
    while in_flight > 0 {
        match tokio::time::timeout(STALL, conn.next()).await?? {
            Packet::PubAck(_) => {
                in_flight -= 1;
                let now = Instant::now();
                // What is acknowledged after the time is up is not counted,
                // nor is the time it took.
                if now < run.until {
                    acknowledged += 1;
                    last = now;
                }
                if run.take() {
                    let packet = send();
                    conn.write(&packet).await?;
                    in_flight += 1;
                }
            }
            other => return Err(format!("expected a PUBACK, got {other:?}").into()),
        }
    }
    Ok((acknowledged, last))
}

/// The topic of each scratch channel, made once and shared by the
/// publishers.
#[derive(Clone)]
struct Topics(Arc<[ByteStr]>);

impl Topics {
    fn new(channels: usize) -> Topics {
        Topics(
            (0..channels.max(1))
                .map(|i| ByteStr::from(format!("{}/device", channel_name(i)).as_str()))
                .collect(),
        )
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// The topic of the `n`th publish, the channels taken in turn.
    fn at(&self, n: usize) -> ByteStr {
        self.0[n % self.0.len()].clone()
    }
}

/// A QoS 1 publish to `topic`.
fn publish_packet(packet_id: u16, topic: ByteStr, payload: Bytes) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic,
        packet_id,
        properties: PublishProperties::default(),
        payload,
    })
}

/// An MQTT 3.1.1 client on the project's codec.
struct Client {
    stream: TcpStream,
    rbuf: BytesMut,
    decoder: FrameDecoder,
}

impl Client {
    async fn connect(addr: SocketAddr, id: &str) -> Result<Client, Error> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let mut client = Client {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            decoder: FrameDecoder::client(16 * 1024 * 1024, VERSION),
        };
        client
            .write(&Packet::Connect(Connect {
                protocol: VERSION,
                clean_start: true,
                keep_alive: 120,
                client_id: id.to_owned(),
                will: None,
                username: None,
                password: None,
                properties: ConnectProperties::default(),
            }))
            .await?;
        match client.next().await? {
            Packet::ConnAck(ack) if !ack.reason.is_error() => Ok(client),
            other => Err(format!("{id}: CONNECT answered {other:?}").into()),
        }
    }

    async fn write(&mut self, packet: &Packet) -> Result<(), Error> {
        let mut buf = BytesMut::new();
        codec::encode(packet, VERSION, &mut buf)?;
        self.stream.write_all(&buf).await?;
        Ok(())
    }

    async fn next(&mut self) -> Result<Packet, Error> {
        next_packet(&mut self.stream, &mut self.rbuf, &mut self.decoder).await
    }

    fn split(self) -> (Reader, Writer) {
        let (rd, wr) = self.stream.into_split();
        (
            Reader {
                rd,
                rbuf: self.rbuf,
                decoder: self.decoder,
            },
            Writer { wr },
        )
    }
}

async fn next_packet(
    stream: &mut (impl AsyncReadExt + Unpin),
    rbuf: &mut BytesMut,
    decoder: &mut FrameDecoder,
) -> Result<Packet, Error> {
    loop {
        if let Some(p) = decoder.decode(rbuf)? {
            return Ok(p);
        }
        rbuf.reserve(32 * 1024);
        if stream.read_buf(rbuf).await? == 0 {
            return Err("the broker closed the connection".into());
        }
    }
}

struct Reader {
    rd: tokio::net::tcp::OwnedReadHalf,
    rbuf: BytesMut,
    decoder: FrameDecoder,
}

impl Reader {
    async fn next(&mut self) -> Result<Packet, Error> {
        next_packet(&mut self.rd, &mut self.rbuf, &mut self.decoder).await
    }
}

struct Writer {
    wr: tokio::net::tcp::OwnedWriteHalf,
}

impl Writer {
    async fn publish(
        &mut self,
        packet_id: u16,
        topic: ByteStr,
        payload: Bytes,
    ) -> Result<(), Error> {
        let mut buf = BytesMut::new();
        codec::encode(
            &publish_packet(packet_id, topic, payload),
            VERSION,
            &mut buf,
        )?;
        self.wr.write_all(&buf).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channels_are_taken_in_turn() {
        let topics = Topics::new(3);
        let names: Vec<String> = (0..7).map(|n| topics.at(n).to_string()).collect();
        assert_eq!(
            names,
            [
                "bench0/device",
                "bench1/device",
                "bench2/device",
                "bench0/device",
                "bench1/device",
                "bench2/device",
                "bench0/device"
            ]
        );
        // None asked for is one.
        assert_eq!(Topics::new(0).len(), 1);
    }

    /// A broker of `channels` append channels on a sqlite provider in
    /// `dir`, as `saguin bench` makes one, and the file it keeps them in.
    fn scratch(dir: &std::path::Path, channels: usize) -> (Config, std::path::PathBuf) {
        let db = dir.join("bench.db");
        let channels: String = (0..channels)
            .map(|i| {
                format!(
                    "  - {{name: {}, kind: append, storage: db}}\n",
                    channel_name(i)
                )
            })
            .collect();
        let config = Config::from_yaml_str(
            &format!(
                "listeners: [{{name: bench, bind: \"127.0.0.1:0\"}}]\n\
                 auth: {{allow_anonymous: true}}\n\
                 storage:\n  - {{name: db, kind: sqlite, file_path: {}}}\n\
                 channels:\n{channels}",
                db.display()
            ),
            &dir.join("bench.yaml"),
        )
        .unwrap();
        (config, db)
    }

    /// The records the scratch file holds, by channel.
    fn records_by_channel(db: &std::path::Path) -> Vec<(String, u64)> {
        let conn = rusqlite::Connection::open(db).unwrap();
        let mut statement = conn
            .prepare("SELECT channel, count(*) FROM records GROUP BY channel ORDER BY channel")
            .unwrap();
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn every_channel_is_published_to() {
        let dir = tempfile::tempdir().unwrap();
        let (config, db) = scratch(dir.path(), 3);
        let load = Load {
            paced_rate: 200.0,
            paced_for: Duration::from_millis(50),
            fast_publishers: 2,
            fast_for: Duration::from_millis(100),
            fast_max: u64::MAX,
            payload: 16,
            channels: 3,
        };
        let costs = publish_costs(&config, load, &|_| {}).unwrap();
        assert_eq!(costs.paced.len(), 10);
        let mut counts = records_by_channel(&db);
        // The paced publisher's ten alone give each channel three or more.
        assert_eq!(counts.len(), 3, "{counts:?}");
        counts.retain(|(_, n)| *n < 3);
        assert!(counts.is_empty(), "{counts:?}");
    }

    #[test]
    fn the_fast_publishers_stop_at_their_most_publishes_in_all() {
        let dir = tempfile::tempdir().unwrap();
        let (config, db) = scratch(dir.path(), 2);
        // Far longer than the run takes: the count ends it.
        let load = Load {
            paced_rate: 100.0,
            paced_for: Duration::from_millis(50),
            fast_publishers: 3,
            fast_for: Duration::from_secs(120),
            fast_max: 500,
            payload: 16,
            channels: 2,
        };
        let costs = publish_costs(&config, load, &|_| {}).unwrap();
        assert_eq!(costs.paced.len(), 5);
        assert_eq!(costs.fast_acknowledged, 500);
        assert!(costs.sustained > 0.0);
        // Every publish made was stored, and no more were made.
        let stored: u64 = records_by_channel(&db).iter().map(|(_, n)| n).sum();
        assert_eq!(stored, 5 + 500);
    }
}
