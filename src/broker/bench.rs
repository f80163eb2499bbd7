//! What a publisher costs on a provider, measured through a real broker
//! (`saguin bench`): the broker is started in this process on a scratch
//! configuration (one append channel on the provider under test, a
//! listener on 127.0.0.1 port 0), and MQTT 3.1.1 clients on the project's
//! codec publish to it over the loopback. Two runs: one publisher paced to
//! a rate, each publish's time to its PUBACK; then publishers as fast as a
//! window of 64 unacknowledged publishes each allows, the publishes
//! acknowledged a second.

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

/// The channel the runs publish to.
pub const CHANNEL: &str = "bench";
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
}

/// What the runs measured.
#[derive(Clone, Debug)]
pub struct PublishCosts {
    /// Each paced publish's time from its write to its PUBACK.
    pub paced: Latencies,
    /// Publishes acknowledged a second by the fast publishers.
    pub sustained: f64,
}

/// Runs `load` against a broker serving `config` (which must name one
/// append channel [`CHANNEL`] and listen on 127.0.0.1 port 0), then stops
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
    progress(&format!(
        "one publisher paced to {:.0} publishes a second",
        load.paced_rate
    ));
    let paced = paced(addr, load).await?;
    progress(&format!(
        "{} publishers as fast as {WINDOW} in flight each allow",
        load.fast_publishers
    ));
    let mut runs = Vec::with_capacity(load.fast_publishers);
    for i in 0..load.fast_publishers {
        runs.push(tokio::spawn(fast(addr, i, load)));
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
async fn paced(addr: SocketAddr, load: Load) -> Result<Latencies, Error> {
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
                writer.publish(packet_id, payload.clone()).await?;
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
async fn fast(addr: SocketAddr, index: usize, load: Load) -> Result<u64, Error> {
    let mut conn = Client::connect(addr, &format!("bench-fast-{index}")).await?;
    let payload = Bytes::from(vec![b'f'; load.payload]);
    let mut next_id: u64 = 0;
    let mut send = || {
        let packet_id = (next_id % 60_000 + 1) as u16;
        next_id += 1;
        publish_packet(packet_id, payload.clone())
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

/// A QoS 1 publish to the bench channel.
fn publish_packet(packet_id: u16, payload: Bytes) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: ByteStr::from(format!("{CHANNEL}/device").as_str()),
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
    async fn publish(&mut self, packet_id: u16, payload: Bytes) -> Result<(), Error> {
        let mut buf = BytesMut::new();
        codec::encode(&publish_packet(packet_id, payload), VERSION, &mut buf)?;
        self.wr.write_all(&buf).await?;
        Ok(())
    }
}
