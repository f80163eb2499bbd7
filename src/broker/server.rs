//! The server: listeners, the connection cap, the broker task and shutdown.
//!
//! Shape (mini-redis): `run(listeners, shutdown)`; each accept loop takes a
//! semaphore permit *before* accepting, so at most `max_connections`
//! transports exist; one task per connection; on shutdown the listeners stop,
//! the broker state says goodbye to every client, and `run` waits for every
//! connection task to drain (bounded) before returning.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio::time::Instant;
use tokio_rustls::{server::TlsStream, TlsAcceptor};

use super::connection::{self, ConnectionContext, Handshake};
use super::metrics::{CloseReason, Metrics};
use super::persister::{PersisterGone, Persisters};
use super::places::{Held, Places};
use super::read_order;
use super::state::{BrokerState, Event, Intent, SYS_INTERVAL};
use super::views::ChannelView;

/// How many events the broker queue holds before readers wait (backpressure:
/// a decoded packet is never dropped, its reader just stops reading).
pub const EVENT_QUEUE: usize = 1024;
/// Client events the broker task takes from its queue at once; up to twice
/// as many once the connections woken with them have run.
const EVENT_BATCH: usize = 64;

/// Connections accepted over `limits.max_connections` at once, only to be
/// answered CONNACK 0x97 (3.1.1: return code 3) and closed; beyond these,
/// newcomers wait in the kernel's backlog.
const OVER_LIMIT_REFUSALS: usize = 32;

/// Metrics requests served at once.
const METRICS_CONNECTIONS: usize = 16;

/// How long shutdown waits for connections to finish writing their goodbyes.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// One bound listener, ready to accept.
pub struct BoundListener {
    pub name: String,
    pub listener: TcpListener,
    pub tls: Option<TlsAcceptor>,
    /// Time to finish the TLS handshake and send CONNECT.
    pub handshake_timeout: Duration,
}

/// Everything `run` needs.
pub struct Server {
    pub listeners: Vec<BoundListener>,
    pub metrics_listener: Option<TcpListener>,
    pub state: BrokerState,
    pub metrics: Arc<Metrics>,
    pub max_connections: usize,
    pub context: Arc<ConnectionContext>,
    /// The broker task's queue, which `context` sends to.
    pub events: mpsc::Receiver<Event>,
    pub persisters: Persisters,
    /// Reads of channel records for consumers.
    pub readers: super::reader::Readers,
    /// Answers of the persisters and readers.
    pub commits: super::persister::Commits,
    /// `broker.session.ack_commit_interval`: how often acknowledgements,
    /// in-flight tables and cursors are written.
    pub flush_interval: Duration,
    /// The supervisor's watchdog, pinged from the broker task's own loop
    /// (set by `serve` when `WATCHDOG_USEC` asks for it).
    pub watchdog: Option<super::notify::Watchdog>,
    /// The password and ACL files in force, for a reload to replace.
    pub auth: super::auth_files::AuthFiles,
    /// The bridges to run, and the stores of the channels served (their
    /// lag gauges read `next` there).
    pub bridges: Vec<crate::config::bridge::Bridge>,
    pub bridge_channels: std::collections::HashMap<String, ChannelView>,
    /// `Limits::outbound_queue`, for the bridges' in-process connections.
    pub outbound_queue: usize,
    /// The memory providers' background snapshots, driven from the broker
    /// task (set by `serve`; none by default).
    pub snapshots: super::snapshots::Snapshots,
}

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listener {name}: cannot bind {bind}: {source}")]
    Bind {
        name: String,
        bind: SocketAddr,
        source: std::io::Error,
    },
    #[error("provider {provider}: {source}")]
    Storage {
        provider: String,
        source: crate::storage::contract::StorageError,
    },
    /// The broker task ended while serving (a panic): nothing is served
    /// any more, so the process must exit and be restarted.
    #[error("the broker task stopped: {0}")]
    BrokerFailed(String),
}

/// Connections the kernel completes for a listener and holds until the
/// broker accepts them. A site's devices reconnect at once after a
/// restart or an outage: with the 1,024 a listener gets by default, a
/// storm of 2,000 overflowed it (the kernel's `ListenOverflows` counted
/// about 8,000 drops in one), and each handshake dropped waits on the
/// kernel's retransmissions, seconds to a minute and more, or is lost.
/// The kernel holds a listener to `net.core.somaxconn` (4,096 by default
/// since Linux 5.4) whatever it asks for.
const LISTEN_BACKLOG: u32 = 4096;

/// Bind `bind` for listener `name`: reusing an address a closed
/// listener's connections still hold, as a restart needs.
pub async fn bind(name: &str, bind: SocketAddr) -> Result<TcpListener, ServerError> {
    let listen = || {
        let socket = match bind {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.bind(bind)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|source| ServerError::Bind {
        name: name.to_owned(),
        bind,
        source,
    })
}

/// Serve until `shutdown` completes, then close every connection cleanly
/// (no Wills, DISCONNECT 0x8B to MQTT 5 clients), write what the state
/// still owes its providers and return. An error when the broker task
/// failed while serving.
pub async fn run(server: Server, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let Server {
        listeners,
        metrics_listener,
        state,
        metrics,
        max_connections,
        context,
        events: events_rx,
        persisters,
        readers,
        commits,
        flush_interval,
        watchdog,
        auth: _,
        bridges,
        bridge_channels,
        outbound_queue,
        snapshots,
    } = server;
    let (notify_shutdown, _) = broadcast::channel::<()>(1);
    // Held by the connections' places (`Places`): when the last place is
    // dropped, the drain is complete.
    let (drain_tx, mut drain_rx) = mpsc::channel::<()>(1);
    let limit = Places::new(max_connections.max(1), &drain_tx);
    let refusals = Places::new(OVER_LIMIT_REFUSALS, &drain_tx);
    // Connection ids start at 1: a session keeps them with 0 as "none".
    let generation = Arc::new(AtomicU64::new(1));

    let mut broker = tokio::spawn(broker_task(
        state,
        metrics.clone(),
        events_rx,
        commits,
        Storage {
            persisters,
            readers,
        },
        flush_interval,
        notify_shutdown.subscribe(),
        watchdog,
        snapshots,
    ));

    for listener in listeners {
        let acceptor = Acceptor {
            listener,
            limit: limit.clone(),
            refusals: refusals.clone(),
            context: context.clone(),
            metrics: metrics.clone(),
            generation: generation.clone(),
            shutdown: notify_shutdown.clone(),
        };
        tokio::spawn(acceptor.run(notify_shutdown.subscribe()));
    }
    // Every provider was recovered before `prepare` bound the listeners,
    // and every acceptor runs: the broker is ready before the metrics
    // listener answers its first request.
    metrics.set_serving(true);
    if let Some(listener) = metrics_listener {
        tokio::spawn(serve_metrics(
            listener,
            metrics.clone(),
            notify_shutdown.subscribe(),
        ));
    }
    let bridges = super::bridge::Bridges::start(
        &bridges,
        context.events.clone(),
        generation.clone(),
        metrics.clone(),
        bridge_channels,
        outbound_queue,
    );
    // The drain ends when the last place is given back: every acceptor's
    // and every connection's.
    drop((limit, refusals, drain_tx));

    let failed = tokio::select! {
        _ = shutdown => None,
        ended = &mut broker => Some(match ended {
            Ok(Ok(())) => "it returned".to_owned(),
            Ok(Err(gone)) => gone.to_string(),
            Err(e) if e.is_panic() => format!("it panicked: {}", super::bridge::panic_message(&*e.into_panic())),
            Err(e) => e.to_string(),
        }),
    };
    metrics.set_serving(false);
    if let Some(why) = failed {
        tracing::error!(reason = %why, "the broker task stopped while serving; exiting so a supervisor can restart the broker");
        let _ = notify_shutdown.send(());
        return Err(ServerError::BrokerFailed(why));
    }
    tracing::info!(
        connections = metrics.connections.load(Relaxed),
        "shutting down"
    );
    // The bridges first: each closes its connection to the state, which
    // stages its positions before the state's own shutdown writes them.
    bridges.stop().await;
    let _ = notify_shutdown.send(());
    match broker.await {
        Ok(Ok(())) => {}
        Ok(Err(gone)) => return Err(ServerError::BrokerFailed(gone.to_string())),
        Err(e) if e.is_panic() => {
            let why = super::bridge::panic_message(&*e.into_panic());
            tracing::error!(reason = %why, "the broker task panicked during shutdown");
            return Err(ServerError::BrokerFailed(why));
        }
        Err(e) => return Err(ServerError::BrokerFailed(e.to_string())),
    }
    if tokio::time::timeout(DRAIN_TIMEOUT, drain_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain timeout; closing them");
    }
    // Parked connections the drain passed by go with their sockets; the
    // lot holds them, and they hold what every connection shares.
    context.parking.close();
    tracing::info!("stopped");
    Ok(())
}

/// Where the state's intents are written and its reads made.
struct Storage {
    persisters: Persisters,
    readers: super::reader::Readers,
}

/// Hand every intent the state emitted to its persister and every read to
/// its reader; answers of inline ones go straight back into the state
/// (which may emit more).
async fn dispatch(
    state: &mut BrokerState,
    storage: &mut Storage,
    intents: &mut Vec<Intent>,
    reads: &mut Vec<super::state::ChannelRead>,
) -> Result<(), PersisterGone> {
    loop {
        state.take_intents(intents);
        state.take_reads(reads);
        if intents.is_empty() && reads.is_empty() {
            return Ok(());
        }
        for intent in intents.drain(..) {
            if let Some(answer) = storage.persisters.submit(intent).await? {
                state.handle(answer, Instant::now());
            }
        }
        for read in reads.drain(..) {
            if let Some(answer) = storage.readers.submit(read) {
                state.handle(answer, Instant::now());
            }
        }
    }
}

/// The single writer: applies events to the state in arrival order, and
/// hands what it must store to the persisters. It is also the one writer
/// of the memory providers' stores, so it captures their background
/// snapshot generations, each at one moment of its order
/// ([`super::snapshots`]).
#[allow(clippy::too_many_arguments)]
async fn broker_task(
    mut state: BrokerState,
    metrics: Arc<Metrics>,
    mut events: mpsc::Receiver<Event>,
    mut commits: super::persister::Commits,
    mut storage: Storage,
    flush_interval: Duration,
    mut shutdown: broadcast::Receiver<()>,
    mut watchdog: Option<super::notify::Watchdog>,
    mut snapshots: super::snapshots::Snapshots,
) -> Result<(), PersisterGone> {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sys = tokio::time::interval_at(Instant::now() + SYS_INTERVAL, SYS_INTERVAL);
    sys.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut flush = tokio::time::interval(flush_interval.max(Duration::from_millis(1)));
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Vec::with_capacity(2 * EVENT_BATCH);
    let mut answers = Vec::with_capacity(EVENT_BATCH + 1);
    let mut watermark = read_order::Watermark::default();
    let mut intents = Vec::new();
    let mut reads = Vec::new();
    // The next snapshot generation due, reset only when that moment moves.
    let snapshot_due = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(snapshot_due);
    let mut armed: Option<Instant> = None;
    metrics.heartbeat();
    loop {
        let due = snapshots.next_due();
        if due != armed {
            if let Some(at) = due {
                snapshot_due.as_mut().reset(at);
            }
            armed = due;
        }
        tokio::select! {
            biased;
            _ = shutdown.recv() => break,
            // Answers first: they release acknowledgements clients wait on.
            // Those ready are handled in one turn: a thousand devices
            // back after a crash are let go on together once their
            // sessions are written (`BrokerState::handle_all`).
            Some(committed) = commits.recv() => {
                answers.push(committed);
                commits.take_ready(&mut answers, EVENT_BATCH);
                state.handle_all(answers.drain(..), Instant::now());
            }
            // Before client events: a broker kept busy must still capture
            // its snapshot generations on time (the crash window).
            _ = &mut snapshot_due, if armed.is_some() => {
                armed = None;
                snapshots.start_due(Instant::now());
            }
            (provider, written) = snapshots.finished(), if !snapshots.is_empty() => {
                snapshots.settle(provider, written, Instant::now());
            }
            received = events.recv_many(&mut batch, EVENT_BATCH) => {
                if received == 0 {
                    break;
                }
                take_in_read_order(&mut events, &mut batch, &mut watermark).await;
                let now = Instant::now();
                for event in batch.drain(..) {
                    state.handle(event, now);
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                state.follow_wall_clock(now, super::state::unix_now());
                // What the providers' locks record at the stop.
                crate::storage::lock::note_receipt_time(state.receipt_time(now));
                state.tick(now);
            }
            _ = flush.tick() => state.flush(Instant::now()),
            _ = sys.tick() => state.publish_sys(Instant::now()),
            _ = super::notify::ping_due(&watchdog) => {}
        }
        dispatch(&mut state, &mut storage, &mut intents, &mut reads).await?;
        // Whatever the turn changed in a memory provider counts from now.
        snapshots.observe(Instant::now());
        // After every turn, busy or idle: a wedged loop stops the pings,
        // and `/healthz` reads the heartbeat's age.
        if let Some(watchdog) = &mut watchdog {
            watchdog.ping_if_due(Instant::now());
        }
        metrics.heartbeat();
    }
    state.shutdown(Instant::now());
    // Connect events still queued are answered with DISCONNECT 0x8B.
    events.close();
    while let Ok(event) = events.try_recv() {
        state.handle(event, Instant::now());
    }
    dispatch(&mut state, &mut storage, &mut intents, &mut reads).await?;
    // Every write the state made is answered before the providers close.
    while state.writes_outstanding() > 0 {
        match commits.recv().await {
            Some(committed) => state.handle(committed, Instant::now()),
            None => break,
        }
        dispatch(&mut state, &mut storage, &mut intents, &mut reads).await?;
    }
    // The stop's own time, later than the last tick's: the times the stop
    // and the writes since that tick stored are not after it.
    crate::storage::lock::note_receipt_time(state.receipt_time(Instant::now()));
    storage.persisters.stop();
    // A generation being written is finished and taken in; the providers'
    // close writes the last one.
    snapshots.drain().await;
    Ok(())
}

/// Connections whose sockets became readable before the packets in
/// `batch` may not have handed theirs on yet (the runtime runs the task it
/// woke last first): the broker task lets them run, takes what they sent
/// and hands the packets to the state in the order the sockets became
/// readable ([`read_order`](super::read_order)).
async fn take_in_read_order(
    events: &mut mpsc::Receiver<Event>,
    batch: &mut Vec<Event>,
    watermark: &mut read_order::Watermark,
) {
    // A full batch is a backlog: the broker never waits for readers while
    // it is behind, and takes what it holds in their order.
    if batch.len() >= EVENT_BATCH {
        read_order::sort_packets(batch);
        return;
    }
    let latest = |batch: &[Event]| {
        batch
            .iter()
            .filter_map(|e| match e {
                Event::Packets { read_order, .. } => Some(*read_order),
                _ => None,
            })
            .max()
    };
    // Only readers woken before what the batch holds are waited for; what
    // arrives meanwhile is sorted with it.
    let Some(last) = latest(batch) else {
        return;
    };
    if watermark.woken_before(last) {
        watermark
            .wait_before(last, Instant::now() + read_order::ORDER_WAIT)
            .await;
    }
    // Taken again whether or not it waited: a reader hands its packets on
    // before it lets go of its stamp, so one the watermark found let go
    // after the batch was taken (on another worker, at the same moment)
    // has its packets in the queue, not in the batch. Sorted without them,
    // a PUBLISH read after a SUBSCRIBE went to the state first, about one
    // round in five of `tests/broker_ordering.rs` on an idle two-core
    // machine.
    while batch.len() < 2 * EVENT_BATCH {
        match events.try_recv() {
            Ok(event) => batch.push(event),
            Err(_) => break,
        }
    }
    read_order::sort_packets(batch);
}

/// Which place an accepted connection took: one under the cap, or one of
/// the few for refusing newcomers.
enum Slot {
    Serve(Held),
    Refuse(Held),
}

/// What a TLS listener's connections share: one pointer in each task.
struct TlsListener {
    acceptor: TlsAcceptor,
    name: String,
    metrics: Arc<Metrics>,
}

struct Acceptor {
    listener: BoundListener,
    limit: Arc<Places>,
    /// Room for connections over the limit that are answered and closed.
    refusals: Arc<Places>,
    context: Arc<ConnectionContext>,
    metrics: Arc<Metrics>,
    generation: Arc<AtomicU64>,
    shutdown: broadcast::Sender<()>,
}

impl Acceptor {
    async fn run(self, mut shutdown: broadcast::Receiver<()>) {
        let mut backoff = Duration::from_millis(10);
        let tls = self.listener.tls.clone().map(|acceptor| {
            Arc::new(TlsListener {
                acceptor,
                name: self.listener.name.clone(),
                metrics: self.metrics.clone(),
            })
        });
        loop {
            // A permit first: a connection's, or at the cap one of the few
            // for refusing newcomers with a CONNACK saying why (instead of
            // leaving them in the backlog until their own timeout).
            let permit = tokio::select! {
                biased;
                _ = shutdown.recv() => return,
                held = self.limit.take() => match held {
                    Some(held) => Slot::Serve(held),
                    None => return,
                },
                held = self.refusals.take() => match held {
                    Some(held) => Slot::Refuse(held),
                    None => return,
                },
            };
            let accepted = tokio::select! {
                _ = shutdown.recv() => return,
                accepted = self.listener.listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(pair) => {
                    backoff = Duration::from_millis(10);
                    pair
                }
                Err(err) => {
                    // Out of descriptors and the like: say so and back off,
                    // rather than spin.
                    tracing::error!(listener = %self.listener.name, error = %err, backoff_ms = backoff.as_millis() as u64, "accept failed");
                    drop(permit);
                    tokio::select! {
                        _ = shutdown.recv() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            // A connection may have ended while this one waited in accept.
            let permit = match permit {
                Slot::Refuse(refusal) => match self.limit.try_take() {
                    Some(serve) => Slot::Serve(serve),
                    None => Slot::Refuse(refusal),
                },
                serve => serve,
            };
            let (admission, held) = match permit {
                Slot::Serve(held) => (connection::Admission::Serve, held),
                Slot::Refuse(held) => (connection::Admission::OverLimit, held),
            };
            let handshake = Box::new(Handshake {
                stream,
                peer,
                deadline: Instant::now() + self.listener.handshake_timeout,
                id: self.generation.fetch_add(1, Relaxed),
                context: self.context.clone(),
                shutdown: self.shutdown.subscribe(),
                admission,
            });
            // A TLS connection's task is the same size: its TLS handshake
            // is boxed with the rest of what the start takes, and gone
            // once done (a rustls session among it).
            match &tls {
                Some(tls) => {
                    let tls = tls.clone();
                    tokio::spawn(connection::serve_after(
                        move || tls_handshake(handshake, tls),
                        held,
                    ))
                }
                None => tokio::spawn(connection::serve(handshake, held)),
            };
        }
    }
}

/// The TLS handshake over the accepted stream: the handshake of the
/// connection over TLS, or `None` when it failed or timed out.
async fn tls_handshake(
    handshake: Box<Handshake<TcpStream>>,
    tls: Arc<TlsListener>,
) -> Option<Box<Handshake<TlsStream<TcpStream>>>> {
    let (stream, waiting) = handshake.with_stream(());
    match tokio::time::timeout_at(waiting.deadline, tls.acceptor.accept(stream)).await {
        Ok(Ok(tls_stream)) => Some(Box::new(waiting.with_stream(tls_stream).1)),
        Ok(Err(err)) => {
            tls.metrics.disconnected(CloseReason::Handshake);
            tracing::info!(listener = tls.name.as_str(), peer = %waiting.peer, error = %err, "TLS handshake failed");
            None
        }
        Err(_) => {
            tls.metrics.disconnected(CloseReason::Handshake);
            tracing::info!(listener = tls.name.as_str(), peer = %waiting.peer, "TLS handshake timed out");
            None
        }
    }
}

/// A minimal HTTP/1.1 responder, one request per connection: `GET
/// /metrics` gets the Prometheus text, `GET /healthz` and `GET /readyz`
/// whether the broker is live and ready ([`super::health`]), anything else
/// 404.
async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    mut shutdown: broadcast::Receiver<()>,
) {
    // A scrape endpoint needs few connections at once; a flood waits.
    let limit = Arc::new(Semaphore::new(METRICS_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.recv() => return,
            permit = limit.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.recv() => return,
            accepted = listener.accept() => accepted,
        };
        let (mut stream, _) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                tracing::error!(listener = "metrics", error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut request = Vec::with_capacity(512);
            let mut chunk = [0u8; 1024];
            let read_head = async {
                loop {
                    let n = stream.read(&mut chunk).await?;
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&chunk[..n]);
                    if request.windows(4).any(|w| w == b"\r\n\r\n") || request.len() > 8192 {
                        break;
                    }
                }
                Ok::<_, std::io::Error>(())
            };
            if !matches!(
                tokio::time::timeout(Duration::from_secs(5), read_head).await,
                Ok(Ok(()))
            ) {
                return;
            }
            let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
            let mut parts = line.split(|&b| b == b' ');
            let method = parts.next().unwrap_or_default().to_vec();
            let target = parts.next().unwrap_or_default();
            let path = target
                .split(|&b| b == b'?')
                .next()
                .unwrap_or_default()
                .to_vec();
            // Providers are read (a sqlite provider's page count, its
            // health) off the runtime's threads.
            let answered = tokio::task::spawn_blocking(move || answer(&method, &path, &metrics));
            let Ok((answer, content_type)) = answered.await else {
                return;
            };
            let response = format!(
                "HTTP/1.1 {} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                answer.status,
                answer.reason_phrase(),
                answer.body.len(),
                answer.body
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// The metrics listener's answer to `method` `path`, with its content type.
fn answer(method: &[u8], path: &[u8], metrics: &Metrics) -> (super::health::Answer, &'static str) {
    use super::health::{liveness, readiness, Answer};
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != b"GET" {
        let body = "only GET is served here\n".to_owned();
        return (Answer { status: 405, body }, TEXT);
    }
    match path {
        b"/metrics" => (
            Answer {
                status: 200,
                body: metrics.render(),
            },
            "text/plain; version=0.0.4; charset=utf-8",
        ),
        b"/healthz" => (liveness(metrics.last_heartbeat().elapsed()), TEXT),
        b"/readyz" => (
            readiness(metrics.is_serving(), &metrics.provider_health()),
            TEXT,
        ),
        _ => (
            Answer {
                status: 404,
                body: "not found; metrics are at /metrics, liveness at /healthz, readiness at /readyz\n"
                    .to_owned(),
            },
            TEXT,
        ),
    }
}

/// The broker's limits from the configuration. The announced Maximum Packet
/// Size is `max_message_size + max_header_bytes`: room for the largest
/// payload and topic plus its properties and headers.
pub fn limits_from(config: &crate::config::Config) -> super::state::Limits {
    let l = &config.limits;
    super::state::Limits {
        max_session_expiry: u32::try_from(l.max_session_expiry.as_secs()).unwrap_or(u32::MAX),
        receive_maximum: l.receive_maximum.max(1),
        max_inflight_messages: l.max_inflight_messages.max(1),
        max_queued_messages: l.max_queued_messages as usize,
        max_queued_bytes: l.max_queued_bytes,
        max_subscriptions_per_session: l.max_subscriptions_per_session as usize,
        max_packet_size: u32::try_from(l.max_message_size.saturating_add(l.max_header_bytes))
            .unwrap_or(u32::MAX)
            .min(super::codec::PROTOCOL_MAX_PACKET_SIZE),
        topic_alias_maximum: 64,
        exactly_once_expires_after: config.broker.exactly_once.expires_after,
        max_sessions: l.max_sessions as usize,
        max_retained: l.max_retained as usize,
        // Room for a full window and the largest queue of every session
        // before QoS 0 to a client that does not read is dropped.
        outbound_queue: (l.max_queued_messages as usize)
            .saturating_add(usize::from(l.max_inflight_messages))
            .max(1024),
        max_keep_alive: l.max_keep_alive,
    }
}

/// Build the broker state from what `sessions` and `retained` hold, start
/// their persisters, then bind every listener (and the metrics endpoint) of
/// `config`, logging one `listening` line per listener with the address
/// actually bound. The providers are opened, locked and recovered by the
/// caller before this; nothing listens until the state is restored. The
/// state's clock starts no earlier than `last_recorded`, the latest time the
/// providers' locks recorded ([`super::state::clock`]).
pub async fn prepare(
    config: &crate::config::Config,
    sessions: Arc<dyn crate::storage::contract::Provider>,
    retained: Arc<dyn crate::storage::contract::Provider>,
    channels: Vec<super::providers::ServedChannel>,
    last_recorded: Option<saguin_format::model::UnixNanos>,
) -> Result<Server, ServerError> {
    let metrics = Arc::new(Metrics::new());
    // Every configured bridge is in /metrics from the first scrape, not
    // from its link task's first run.
    for bridge in &config.bridges {
        metrics.bridge(&bridge.name);
    }
    let limits = limits_from(config);
    let auth = super::auth_files::AuthFiles::from_config(&config.auth);
    let authorizer: Arc<dyn super::state::Authorizer> = match &auth.acl {
        Some(acl) => Arc::new(super::auth::AclAuthorizer(acl.served.clone())),
        None => Arc::new(super::state::AllowAll),
    };
    let started = std::time::Instant::now();
    {
        let configured: Vec<String> = config.bridges.iter().map(|b| b.name.clone()).collect();
        let served = channels.clone();
        tokio::task::spawn_blocking(move || {
            let names: Vec<&str> = configured.iter().map(String::as_str).collect();
            super::providers::drop_removed_bridge_positions(&served, &names)
        })
        .await
        .map_err(|e| ServerError::BrokerFailed(e.to_string()))?
        .map_err(|source| ServerError::Storage {
            provider: sessions.name().to_owned(),
            source,
        })?;
    }
    let (now, wall) = (Instant::now(), super::state::unix_now());
    let mut state = BrokerState::new(
        limits.clone(),
        metrics.clone(),
        authorizer,
        super::state::clock::ReceiptClock::starting(now, wall, last_recorded),
    );
    // How far the clock starts ahead of the system clock, in the metrics
    // from the first scrape.
    state.follow_wall_clock(now, wall);
    state.name_channels(channels.iter().map(|c| c.name.clone()));
    // Read and rebuilt off the runtime's threads, the retained messages
    // one at a time into the state.
    let (state, summary) = {
        let (from_sessions, from_retained) = (sessions.clone(), retained.clone());
        let from_channels = channels.clone();
        tokio::task::spawn_blocking(move || {
            let now = Instant::now();
            super::persister::read_retained(&*from_retained, &mut |value| {
                state.restore_retained(value, now)
            })
            .map_err(|source| (from_retained.name().to_owned(), source))?;
            let now = Instant::now();
            let mut sessions = None;
            let restored =
                super::persister::read_restored(&*from_sessions, &from_channels, &mut |stored| {
                    sessions = Some(state.restore_sessions(stored, now))
                })
                .map_err(|source| (from_sessions.name().to_owned(), source))?;
            let summary = state.restore_rest(restored, sessions.unwrap_or_default(), now);
            Ok((state, summary))
        })
        .await
        .map_err(|e| ServerError::BrokerFailed(e.to_string()))?
        .map_err(|(provider, source)| ServerError::Storage { provider, source })?
    };
    tracing::info!(
        retained = summary.retained,
        sessions = summary.sessions,
        expired_sessions = summary.expired_sessions,
        inflight = summary.inflight,
        queued = summary.queued,
        exactly_once_holds = summary.holds,
        ms = started.elapsed().as_millis() as u64,
        "state restored"
    );
    let (commits_tx, commits) = super::persister::commit_channel();
    for channel in &channels {
        let view = ChannelView::of(&channel.store);
        metrics.register_channel_info(
            &channel.name,
            super::metrics::ChannelInfo {
                kind: view.kind(),
                provider: channel.provider.name().to_owned(),
            },
        );
        metrics.register_channel(&channel.name, view);
    }
    let readers = super::reader::Readers::new(&channels, metrics.clone(), commits_tx.rest());
    let persisters = Persisters::start(
        sessions.clone(),
        retained.clone(),
        &channels,
        metrics.clone(),
        commits_tx,
    )
    .map_err(|source| ServerError::Storage {
        provider: sessions.name().to_owned(),
        source,
    })?;
    let mut listeners = Vec::with_capacity(config.listeners.len());
    for l in &config.listeners {
        let listener = bind(&l.name, l.bind).await?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            name: l.name.clone(),
            bind: l.bind,
            source,
        })?;
        let tls = l
            .tls
            .as_ref()
            .map(|t| TlsAcceptor::from(t.material.server_config.expose().clone()));
        let transport = match &l.tls {
            None => "tcp",
            Some(t) if t.client_ca.is_some() => "mtls",
            Some(_) => "tls",
        };
        tracing::info!(listener = %l.name, addr = %addr, transport, "listening");
        listeners.push(BoundListener {
            name: l.name.clone(),
            listener,
            tls,
            handshake_timeout: l.handshake_timeout,
        });
    }
    let metrics_listener = match config.metrics.bind {
        Some(bind_addr) => {
            let listener = bind("metrics", bind_addr).await?;
            let addr = listener.local_addr().map_err(|source| ServerError::Bind {
                name: "metrics".into(),
                bind: bind_addr,
                source,
            })?;
            tracing::info!(listener = "metrics", addr = %addr, path = "/metrics", "listening");
            Some(listener)
        }
        None => None,
    };
    let (events_tx, events) = mpsc::channel::<Event>(EVENT_QUEUE);
    let context = Arc::new(ConnectionContext {
        max_packet_size: limits.max_packet_size,
        topic_alias_maximum: limits.topic_alias_maximum,
        allow_anonymous: config.auth.allow_anonymous,
        passwords: auth.passwords.as_ref().map(|f| f.served.clone()),
        password_checks: super::auth::PasswordChecks::one_a_cpu(),
        metrics: metrics.clone(),
        outbound_queue: limits.outbound_queue,
        max_keep_alive: limits.max_keep_alive,
        topic_aliases: config.broker.topic_aliases,
        keep_alives: super::keep_alive::KeepAliveTimer::start(),
        parking: super::parking::Lot::start(metrics.clone()),
        events: events_tx,
    });
    Ok(Server {
        listeners,
        metrics_listener,
        state,
        metrics,
        max_connections: config.limits.max_connections as usize,
        context,
        events,
        persisters,
        readers,
        commits,
        flush_interval: config.broker.session.ack_commit_interval,
        watchdog: None,
        auth,
        bridges: config.bridges.clone(),
        bridge_channels: channels
            .iter()
            .map(|c| (c.name.to_string(), ChannelView::of(&c.store)))
            .collect(),
        outbound_queue: limits.outbound_queue,
        snapshots: super::snapshots::Snapshots::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::places;

    fn handshake<S>(
        stream: S,
        peer: SocketAddr,
        shutdown: &broadcast::Sender<()>,
    ) -> Box<Handshake<S>> {
        Box::new(Handshake {
            stream,
            peer,
            id: 1,
            deadline: Instant::now(),
            context: connection::tests::test_context(),
            shutdown: shutdown.subscribe(),
            admission: connection::Admission::Serve,
        })
    }

    /// A reader hands its packets on and lets go of its stamp between the
    /// broker task taking its batch and looking at the stamps (on another
    /// worker, at the same moment): its packets, read before the batch's,
    /// are still taken and handed to the state first.
    #[tokio::test]
    async fn packets_handed_on_as_the_batch_was_taken_go_before_it() {
        use super::read_order::tests::{order, packets};
        let (sender, mut events) = mpsc::channel(8);
        let mut watermark = read_order::Watermark::default();
        let earlier = read_order::next_stamp();
        let later = read_order::next_stamp();
        // The earlier reader's stamp is let go already (never held here);
        // its packets are queued after the batch was taken.
        let mut batch = vec![packets(2, later)];
        sender.send(packets(1, earlier)).await.unwrap();
        take_in_read_order(&mut events, &mut batch, &mut watermark).await;
        assert_eq!(order(&batch), [(1, earlier), (2, later)]);
    }

    /// A listener holds a reconnect storm the broker has not accepted yet:
    /// more connections than the 1,024 a listener gets by default wait,
    /// none dropped. Read from the kernel's table of TCP sockets, where a
    /// listener's receive queue is the connections waiting to be accepted.
    #[tokio::test]
    async fn a_listener_holds_a_storm_of_connections_not_yet_accepted() {
        const STORM: usize = 1_500;
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if somaxconn < STORM {
            eprintln!(
                "SKIP a_listener_holds_a_storm_of_connections_not_yet_accepted: \
                 net.core.somaxconn is {somaxconn}, below the {STORM} connections it holds"
            );
            return;
        }
        let listener = bind("mqtt", "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let port = addr.port();
        let mut clients = Vec::with_capacity(STORM);
        for i in 0..STORM {
            // A handshake the listener has no room for waits on the
            // kernel's retransmissions: bounded here, it fails the test.
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
                Ok(client) => clients.push(client),
                Err(err) => panic!("connection {i} of {STORM} was not taken: {err}"),
            }
        }
        // Each handshake is queued as the kernel answers its last packet,
        // on loopback before or just after the client's connect returns.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut waiting = waiting_to_be_accepted(port);
        while waiting < STORM && std::time::Instant::now() < deadline {
            std::thread::yield_now();
            waiting = waiting_to_be_accepted(port);
        }
        assert_eq!(
            waiting, STORM,
            "connections dropped before they were accepted"
        );
        drop(clients);
    }

    /// The connections waiting to be accepted on the IPv4 listener on
    /// `port`: its receive queue in `/proc/net/tcp`.
    fn waiting_to_be_accepted(port: u16) -> usize {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let local = format!(":{port:04X}");
        table
            .lines()
            .skip(1)
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .find(|fields| fields[1].ends_with(&local) && fields[3] == "0A")
            .map(|fields| {
                let (_, queued) = fields[4].split_once(':').unwrap();
                usize::from_str_radix(queued, 16).unwrap()
            })
            .expect("the listener is in /proc/net/tcp")
    }

    /// A listener, a client connected to it, and the server's side of that
    /// connection with the client's address.
    async fn accepted() -> (TcpListener, TcpStream, TcpStream, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        (listener, client, stream, peer)
    }

    /// A plain connection's task and a TLS one are the same size: where the
    /// connection is (a tag and a pointer) and its place (one pointer).
    /// What tokio puts around them is pinned in `connection`'s
    /// `an_idle_connections_task_stays_small`.
    #[tokio::test]
    async fn a_connections_task_is_as_small_whether_plain_or_tls() {
        let files = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/config");
        let config = crate::config::Config::from_yaml_str(
            "listeners:\n  - name: tls\n    bind: 127.0.0.1:0\n    tls:\n      \
             cert: files/server.pem\n      key: files/server.key\n\
             auth:\n  allow_anonymous: true\n",
            &files.join("saguin.yaml"),
        )
        .unwrap();
        let material = &config.listeners[0].tls.as_ref().unwrap().material;
        let tls = Arc::new(TlsListener {
            acceptor: TlsAcceptor::from(material.server_config.expose().clone()),
            name: "tls".into(),
            metrics: Arc::new(Metrics::default()),
        });
        let (listener, _client, stream, peer) = accepted().await;
        let (shutdown, _) = broadcast::channel(1);
        let plain = connection::serve(handshake(stream, peer, &shutdown), places::tests::held());
        assert_eq!(std::mem::size_of_val(&places::tests::held()), 8);
        assert!(
            std::mem::size_of_val(&plain) <= 24,
            "{}",
            std::mem::size_of_val(&plain)
        );
        let other = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let other = handshake(other, peer, &shutdown);
        let over_tls =
            connection::serve_after(move || tls_handshake(other, tls), places::tests::held());
        assert_eq!(
            std::mem::size_of_val(&over_tls),
            std::mem::size_of_val(&plain)
        );
    }
}
