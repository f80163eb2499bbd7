//! What a publisher costs on a provider, measured through a real broker
//! (`saguin bench`): the broker is started in this process on a scratch
//! configuration (as many append channels on the provider under test as
//! the operator's configuration puts on it, a listener on 127.0.0.1 port
//! 0), and MQTT 3.1.1 clients on the project's codec publish to it over
//! the loopback, each publish to the next channel in turn. Two runs: one
//! publisher paced to a rate, each publish's time to its PUBACK; then
//! publishers as fast as a window of 64 unacknowledged publishes each
//! allows, the publishes acknowledged a second.
//!
//! Spread, not to one channel: a sqlite transaction writes a row of
//! counters for every channel it holds a record of, and the pages of
//! records of many channels, so a provider's publishes spread over 10,000
//! channels cost about twice its publishes to one (docs/benchmarks.md,
//! "Channels in one broker").

use std::collections::HashMap;
use std::net::SocketAddr;
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
    pub fast_for: Duration,
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
}

/// Runs `load` against a broker serving `config` (which must name the
/// append channels `load.channels` counts and listen on 127.0.0.1 port 0),
/// then stops
/// it gracefully, its providers closed. Blocking; it makes a runtime of its
/// own.
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
    let mut runs = Vec::with_capacity(load.fast_publishers);
    for i in 0..load.fast_publishers {
        runs.push(tokio::spawn(fast(addr, i, load, topics.clone())));
    }
    let mut acknowledged = 0u64;
    for run in runs {
        acknowledged += run.await??;
    }
    Ok(PublishCosts {
        paced,
        sustained: acknowledged as f64 / load.fast_for.as_secs_f64(),
    })
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

/// One publisher keeping [`WINDOW`] publishes unacknowledged for
/// `load.fast_for`; how many were acknowledged in that time.
async fn fast(addr: SocketAddr, index: usize, load: Load, topics: Topics) -> Result<u64, Error> {
    let mut conn = Client::connect(addr, &format!("bench-fast-{index}")).await?;
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
    for _ in 0..WINDOW {
        codec::encode(&send(), VERSION, &mut batch)?;
    }
    conn.stream.write_all(&batch).await?;
    let until = Instant::now() + load.fast_for;
    let mut acknowledged = 0u64;
    let mut in_flight = WINDOW;
    while in_flight > 0 {
        match tokio::time::timeout(STALL, conn.next()).await?? {
            Packet::PubAck(_) => {
                in_flight -= 1;
                if Instant::now() < until {
                    acknowledged += 1;
                    let packet = send();
                    conn.write(&packet).await?;
                    in_flight += 1;
                }
            }
            other => return Err(format!("expected a PUBACK, got {other:?}").into()),
        }
    }
    Ok(acknowledged)
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

    #[test]
    fn every_channel_is_published_to() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("bench.db");
        let channels: String = (0..3)
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
            &dir.path().join("bench.yaml"),
        )
        .unwrap();
        let load = Load {
            paced_rate: 200.0,
            paced_for: Duration::from_millis(50),
            fast_publishers: 2,
            fast_for: Duration::from_millis(100),
            payload: 16,
            channels: 3,
        };
        let costs = publish_costs(&config, load, &|_| {}).unwrap();
        assert_eq!(costs.paced.len(), 10);
        let conn = rusqlite::Connection::open(&db).unwrap();
        let mut counts: Vec<(String, u64)> = conn
            .prepare("SELECT channel, count(*) FROM records GROUP BY channel ORDER BY channel")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        // The paced publisher's ten alone give each channel three or more.
        assert_eq!(counts.len(), 3, "{counts:?}");
        counts.retain(|(_, n)| *n < 3);
        assert!(counts.is_empty(), "{counts:?}");
    }
}
