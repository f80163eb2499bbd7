//! One client connection, served by one task: the reader side (socket →
//! bounded frame decoder → protocol adapter → broker event queue) and the
//! writer side (bounded outbound queue → encoder → batched socket writes)
//! are polled together, so neither waits for the other. TCP and TLS go
//! through the same code: anything `AsyncRead + AsyncWrite`.
//!
//! What a connection holds while its client is quiet is multiplied by every
//! connection a broker serves, so a quiet one holds as little as the two
//! sides need: one task of 128 bytes, polled by hand ([`ConnectionTask`]:
//! a pointer to the connection and one to its place under the cap; it and
//! the connection's boxed state are measured by
//! `an_idle_connections_task_stays_small`), no read buffer (reads land on
//! the stack, and only a partial packet's bytes are kept), no batch of
//! queued packets (they are encoded as they are taken), at most
//! `WRITE_KEEP` (1 KiB) of write buffer once the outbound queue is
//! drained, the handshake's state boxed and gone, no timer of its own
//! (the broker's one [`KeepAliveTimer`] watches its client's silence),
//! and the loop's state in its boxed state, not in the task's future.

use std::any::{Any, TypeId};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::alias::{AliasUse, OutboundAliases};
use super::auth::{scram, PasswordChecks};
use super::auth_files::Reloadable;
use super::codec::{
    self, AckProperties, ByteStr, ConnAck, ConnAckProperties, Connect, DecodeError, Disconnect,
    DisconnectProperties, FrameDecoder, Packet, ProtocolVersion, PubAck, Publish, QoS, ReasonCode,
    Role, SubAck, UnsubAck,
};
use super::keep_alive::KeepAliveTimer;
use super::lazy::{self, Lazy};
use super::link;
use super::long_lived;
use super::message::WireForm;
use super::message::{DecimalBuf, Message};
use super::metrics::{CloseReason, Metrics};
use super::parking::{Lot, Parkable};
use super::places::Held;
use super::read_order::Stamped;
use super::state::{
    ConnAckExtras, ConnectRequest, Event, Inbound, InboundPublish, KeepAlive, Outbound, WillRequest,
};
use super::subscriptions::SubOptions;
use crate::config::auth::PasswordFile;

/// What every connection needs to know, shared.
#[derive(Debug)]
pub struct ConnectionContext {
    /// The largest packet accepted (announced as Maximum Packet Size).
    pub max_packet_size: u32,
    /// Topic aliases a client may set (announced as Topic Alias Maximum).
    pub topic_alias_maximum: u16,
    pub allow_anonymous: bool,
    /// The password file in force (a reload may replace it).
    pub passwords: Option<Arc<Reloadable<PasswordFile>>>,
    /// Where passwords are checked.
    pub password_checks: PasswordChecks,
    pub metrics: Arc<Metrics>,
    /// Packets a connection's writer may have queued before the state
    /// pauses its reader and drops QoS 0 to it.
    pub outbound_queue: usize,
    /// `limits.max_keep_alive` (0: the client's own keep alive).
    pub max_keep_alive: u16,
    /// `broker.topic_aliases`: outbound topic aliases towards MQTT 5
    /// clients that announce a Topic Alias Maximum.
    pub topic_aliases: bool,
    /// The one timer of every connection's keep alive.
    pub keep_alives: Arc<KeepAliveTimer>,
    /// Where plain connections wait while their clients are quiet.
    pub parking: Arc<Lot<Parked>>,
    /// The broker task's queue, every connection's: kept here rather than
    /// in each connection, where it was a word of every parked one.
    pub events: mpsc::Sender<Event>,
}

impl ConnectionContext {
    /// Below this many queued packets a writer tells the state it caught
    /// up.
    fn low_water(&self) -> usize {
        (self.outbound_queue / 2).max(1)
    }
}

/// The most bytes asked of the socket per read (a busy publisher's). A
/// read lands in a buffer on the stack of the poll and only what it
/// brought is copied out, so a connection waiting for its client holds no
/// read buffer at all.
const READ_CHUNK: usize = 16 * 1024;
/// The most packets a read's batch is given room for before it is filled.
const BATCH_HINT_MAX: usize = 256;
/// Packets taken from the outbound queue per socket write.
const WRITE_BATCH: usize = 256;
/// What a writer keeps of its buffer once its queue is drained: a busy
/// subscriber's next batch is written without growing a new one, and an
/// idle connection keeps what its CONNACK took.
const WRITE_KEEP: usize = 1024;
/// A write buffer larger than this (one batch of large messages) is not
/// kept for the next batch even while more are queued.
const WRITE_KEEP_MAX: usize = 1024 * 1024;
/// A payload at least this large is written from its message, beside its
/// encoded header, rather than copied into the write buffer.
const SPLICE_MIN: usize = 16 * 1024;
/// Spliced payloads handed to one vectored write, with the encoded bytes
/// around them: a write takes the rest at its next turn.
const SPLICED_PARTS: usize = 16;
/// How long a closing connection waits for its writer to flush.
const WRITER_GRACE: Duration = Duration::from_secs(5);
/// How long a finished writer's flush and shutdown of the write side may
/// take.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// After the broker's last packet (a DISCONNECT or a refusing CONNACK) and
/// the shutdown of the write side, the client's bytes are read and dropped
/// before the socket closes: closing with unread input makes the kernel
/// send a reset, which discards what it has not sent yet and, at the
/// client, what the client has not read yet - the reason code among it.
/// The linger ends when the client closes its side (it read the reason),
/// after [`LINGER_TIME`], or after [`LINGER_BYTES`].
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// One read of `rd` into a buffer on the stack, what it brought appended
/// to `unread`: `Ok(0)` is the end of the stream. Nothing is allocated
/// while the socket has nothing to read, and then only what it brought.
fn poll_read_into<R: AsyncRead + Unpin>(
    rd: &mut R,
    cx: &mut Context<'_>,
    unread: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    let mut chunk = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
    let mut buf = ReadBuf::uninit(&mut chunk);
    ready!(Pin::new(rd).poll_read(cx, &mut buf))?;
    unread.extend_from_slice(buf.filled());
    Poll::Ready(Ok(buf.filled().len()))
}

/// Unread bytes with nothing in them are given back: a decoded packet's
/// fields keep their own part of the read alive as long as they need it,
/// and the empty remainder (even one with no room left) would keep the
/// whole read's allocation for a client that may say nothing for minutes.
fn give_back_if_empty(unread: &mut BytesMut) {
    if unread.is_empty() {
        *unread = BytesMut::new();
    }
}

enum ReadFailure {
    Io,
    Eof,
    Decode(DecodeError),
}

/// Read until one packet is decoded.
async fn read_packet<R: AsyncRead + Unpin>(
    rd: &mut R,
    unread: &mut BytesMut,
    decoder: &mut FrameDecoder,
    metrics: &Metrics,
) -> Result<Packet, ReadFailure> {
    loop {
        match decoder.decode(unread) {
            Ok(Some(packet)) => return Ok(packet),
            Ok(None) => {}
            Err(err) => return Err(ReadFailure::Decode(err)),
        }
        match poll_fn(|cx| poll_read_into(rd, cx, unread)).await {
            Ok(0) => return Err(ReadFailure::Eof),
            Ok(n) => {
                metrics.bytes_received.fetch_add(n as u64, Relaxed);
            }
            Err(_) => return Err(ReadFailure::Io),
        }
    }
}

/// Whether an accepted transport is served or only told why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Serve,
    /// Over `limits.max_connections`: its CONNECT is answered CONNACK 0x97
    /// (3.1.1: return code 3, server unavailable) and the connection closed.
    OverLimit,
}

/// An accepted transport and what serving it takes until its CONNECT is
/// handed on, made once by the server and boxed: an async fn keeps its
/// arguments for its whole life, and the future it goes into is every
/// connection's task.
pub struct Handshake<S> {
    pub stream: S,
    pub peer: SocketAddr,
    /// The connection's generation: how the state names it.
    pub id: u64,
    /// When the CONNECT (and a TLS handshake before it) must be done.
    pub deadline: Instant,
    pub context: Arc<ConnectionContext>,
    pub shutdown: broadcast::Receiver<()>,
    pub admission: Admission,
}

impl<S> Handshake<S> {
    /// The same handshake over `stream` (a TLS stream over the accepted
    /// TCP one), and the stream it had.
    pub fn with_stream<T>(self, stream: T) -> (S, Handshake<T>) {
        let Handshake {
            stream: had,
            peer,
            id,
            deadline,
            context,
            shutdown,
            admission,
        } = self;
        let handshake = Handshake {
            stream,
            peer,
            id,
            deadline,
            context,
            shutdown,
            admission,
        };
        (had, handshake)
    }
}

/// Serve one transport from its first byte to its close, holding `held`
/// (its place under the broker's cap) until the end: the task of a plain
/// connection.
pub fn serve<S>(handshake: Box<Handshake<S>>, held: Held) -> ConnectionTask<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_after(move || std::future::ready(Some(handshake)), held)
}

/// [`serve`] once the future `handshake` makes gives the transport
/// (`None`: it did not, a TLS handshake that failed): the task of a TLS
/// connection. A function that makes the future, not the future: a future
/// awaited in the async block that captured it is laid out twice in it,
/// and a TLS handshake's holds a whole rustls session.
pub fn serve_after<S, F>(
    handshake: impl FnOnce() -> F + Send + 'static,
    held: Held,
) -> ConnectionTask<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Future<Output = Option<Box<Handshake<S>>>> + Send + 'static,
{
    // Boxed and gone once the CONNECT is handed on: what the handshake
    // holds while it waits (the CONNECT, an authentication, a refusal's
    // linger) would otherwise size every connection's task for its whole
    // life, and most of a broker's connections are idle.
    let establishing: Boxed<_> = Box::pin(async move {
        let handshake = handshake().await?;
        establish(handshake).await
    });
    ConnectionTask {
        stage: Stage::Establishing(Box::new(establishing)),
        held: Some(held),
    }
}

/// One connection's task, polled by hand so that all it holds for the
/// connection's life is a pointer to where the connection is and its
/// place: 24 bytes, in a stage of 32 (tokio keeps the future or its
/// result there) with tokio's 96 around it, 128 in all, the allocator's
/// block for a task: half the 256 an async fn's future took
/// (`an_idle_connections_task_stays_small`). Without `--cfg
/// tokio_unstable`, which adds a field to every task.
pub struct ConnectionTask<S> {
    stage: Stage<S>,
    /// Its place, held until the connection ends; handed on with the
    /// connection when it parks.
    held: Option<Held>,
}

/// Where a connection's task is. Each future is boxed twice (a pointer to
/// a fat pointer): one word a stage, for the few moments a connection
/// spends outside [`Stage::Serving`].
enum Stage<S> {
    Establishing(Box<Boxed<Option<Box<Connection<S>>>>>),
    Serving(Box<Connection<S>>),
    Closing(Box<Boxed<()>>),
    Done,
}

/// A future of a stage, boxed.
type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Future for ConnectionTask<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let task = self.get_mut();
        loop {
            match &mut task.stage {
                Stage::Establishing(establishing) => {
                    task.stage = match ready!(establishing.as_mut().as_mut().poll(cx)) {
                        Some(mut connection) => {
                            connection.begin_serving();
                            Stage::Serving(connection)
                        }
                        None => Stage::Done,
                    };
                }
                Stage::Serving(connection) => {
                    let Poll::Ready(ending) = connection.poll_serve(cx) else {
                        if connection.out.link.take_park() && connection.is_quiet() {
                            if let Stage::Serving(connection) =
                                std::mem::replace(&mut task.stage, Stage::Done)
                            {
                                match park(connection, &mut task.held) {
                                    // The task ends; the lot holds the rest.
                                    Ok(()) => return Poll::Ready(()),
                                    Err(connection) => task.stage = Stage::Serving(connection),
                                }
                            }
                        }
                        return Poll::Pending;
                    };
                    if let Stage::Serving(connection) =
                        std::mem::replace(&mut task.stage, Stage::Done)
                    {
                        // Boxed: held only while closing.
                        task.stage = Stage::Closing(Box::new(Box::pin(connection.close(ending))));
                    }
                }
                Stage::Closing(closing) => {
                    ready!(closing.as_mut().as_mut().poll(cx));
                    task.stage = Stage::Done;
                }
                Stage::Done => return Poll::Ready(()),
            }
        }
    }
}

/// A connection once its CONNECT was handed to the state.
struct Connection<S> {
    stream: Stamped<S>,
    /// Bytes read and not decoded yet: the start of a packet still being
    /// received, or nothing at all (no allocation).
    unread: BytesMut,
    peer: Peer,
    id: u64,
    client_id: Arc<str>,
    /// The keep alive held to, in seconds (0: none). Kept as the two
    /// bytes the CONNACK grants rather than a duration: every connection
    /// holds one.
    keep_alive: u16,
    /// Its metrics, keep-alive timer and the broker task's queue among
    /// what every connection shares: one pointer where each of them was
    /// one.
    context: Arc<ConnectionContext>,
    out: Outgoing,
    serving: Serving,
    /// What few connections hold, boxed: `None` for most.
    rare: Option<Box<Rare>>,
}

/// What the connection's loop keeps between its polls. Kept here, in the
/// connection's box, and not in the task's future: tokio aligns a task to
/// 128 B, and the allocator gives that alignment for free only to blocks
/// of a power of two, so a task of 384 B took a 512 B block like one of
/// 512 B; the loop polled by hand by [`ConnectionTask`] leaves a task of
/// 128 B.
#[derive(Debug)]
struct Serving {
    /// Room for as many packets as the last read brought (up to a bound):
    /// a batch grown one doubling at a time copies its packets each time.
    batch_hint: u16,
    /// Bytes came with the CONNECT's read, or since the last decode.
    fresh: bool,
    /// The state paused the reader.
    paused: bool,
    /// A read ready is handed on before the next batch is written.
    read_first: bool,
    /// The writer caught up while the event queue was full.
    drained_owed: bool,
}

impl Default for Serving {
    fn default() -> Serving {
        Serving {
            batch_hint: 1,
            fresh: false,
            paused: false,
            read_first: true,
            drained_owed: false,
        }
    }
}

/// The event queue's wait for room, owned so the connection can keep it
/// between polls.
type Reserving = Pin<
    Box<dyn Future<Output = Result<mpsc::OwnedPermit<Event>, mpsc::error::SendError<()>>> + Send>,
>;

/// What few connections hold: a re-authentication, and what waits for
/// room in the full event queue.
#[derive(Default)]
struct Rare {
    /// Only for a connection that authenticated with SCRAM; AUTH on any
    /// other is a protocol error.
    reauth: Option<Reauthentication>,
    /// The topic aliases the client set: only MQTT 5 clients that use
    /// them have any.
    aliases: InboundAliases,
    /// The packets of the last read, waiting for room in the state's queue.
    handing: Option<Event>,
    /// What ends the connection once they are handed on.
    fatal: Option<Fatal>,
    /// The place in the queue waited for.
    reserving: Option<Reserving>,
}

impl Rare {
    /// It holds what outlives a wait for the state's queue: the
    /// re-authentication or the alias table.
    fn is_held(&self) -> bool {
        self.reauth.is_some() || !self.aliases.slots.is_empty()
    }
}

/// A client's address as its connection keeps it, for its log lines: an
/// IPv4 one inline, an IPv6 one (with its flow and scope, 28 bytes) boxed,
/// so every connection holds 16 bytes for it where a `SocketAddr` takes 32.
enum Peer {
    V4(SocketAddrV4),
    V6(Box<SocketAddrV6>),
}

impl From<SocketAddr> for Peer {
    fn from(addr: SocketAddr) -> Peer {
        match addr {
            SocketAddr::V4(v4) => Peer::V4(v4),
            SocketAddr::V6(v6) => Peer::V6(Box::new(v6)),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::V4(v4) => v4.fmt(f),
            Peer::V6(v6) => v6.fmt(f),
        }
    }
}

/// A plain connection parked while its client is quiet
/// ([`super::parking`]): what serving it again takes that its task cannot
/// make afresh. Its read order's stamp, write buffer, loop flags and the
/// runtime's registration of its socket are made again when it resumes.
pub struct Parked {
    socket: std::net::TcpStream,
    link: link::Outlet,
    aliases: Option<Box<OutboundAliases>>,
    kept: Kept,
}

/// What a parked connection keeps as it was, and is served with again.
struct Kept {
    peer: Peer,
    id: u64,
    client_id: Arc<str>,
    keep_alive: u16,
    version: ProtocolVersion,
    client_max: u32,
    context: Arc<ConnectionContext>,
    rare: Option<Box<Rare>>,
    /// The task's place under the cap.
    held: Held,
}

impl Parkable for Parked {
    fn socket(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    fn resume(self: Box<Self>, readable: bool) {
        let Parked {
            socket,
            link,
            aliases,
            kept,
        } = *self;
        let runtime = kept.context.parking.runtime().clone();
        // The socket is registered with the runtime's driver of the thread
        // it resumes on, whichever woke it.
        let _entered = runtime.enter();
        if readable {
            // Its client spoke (or hung up) as the lot looked: heard, so a
            // keep alive running out at the same moment does not close a
            // client whose bytes the new registration has not seen yet.
            if let Some(limit) = silence_limit(kept.keep_alive) {
                kept.context.keep_alives.heard(&link, limit);
            }
        }
        match tokio::net::TcpStream::from_std(socket) {
            Ok(stream) => kept.spawn(
                link,
                aliases,
                match readable {
                    true => Stamped::readable(stream),
                    false => Stamped::new(stream),
                },
                &runtime,
            ),
            // The runtime would not take the socket back (out of memory,
            // or of the kernel's watches): the connection ends as one
            // whose socket failed, its session told, its client closed.
            Err(err) => kept.spawn(
                link,
                aliases,
                Stamped::new(Unregistered(Some(err))),
                &runtime,
            ),
        }
    }
}

impl Kept {
    /// Serve it over `stream` with a task of its own, from where it left.
    fn spawn<S>(
        self,
        link: link::Outlet,
        aliases: Option<Box<OutboundAliases>>,
        stream: Stamped<S>,
        runtime: &tokio::runtime::Handle,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Kept {
            peer,
            id,
            client_id,
            keep_alive,
            version,
            client_max,
            context,
            rare,
            held,
        } = self;
        let out = Outgoing::new(link, version, client_max, aliases);
        let connection = Box::new(Connection {
            stream,
            unread: BytesMut::new(),
            peer,
            id,
            client_id,
            keep_alive,
            context,
            out,
            serving: Serving::default(),
            rare,
        });
        runtime.spawn(ConnectionTask {
            stage: Stage::Serving(connection),
            held: Some(held),
        });
    }
}

/// The transport of a parked connection the runtime would not take back:
/// its first read fails with why, and so does every write.
struct Unregistered(Option<std::io::Error>);

impl Unregistered {
    fn failure(&mut self) -> std::io::Error {
        self.0
            .take()
            .unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::NotConnected))
    }
}

impl AsyncRead for Unregistered {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Err(self.get_mut().failure()))
    }
}

impl AsyncWrite for Unregistered {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Err(self.get_mut().failure()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Park `connection`, told to and found quiet, handing on its place:
/// `Err` gives it back when it is not a plain connection, the broker
/// parks nothing, the process has no descriptor to spare, or something
/// came for it as it went (it is polled again).
fn park<S>(
    connection: Box<Connection<S>>,
    held: &mut Option<Held>,
) -> Result<(), Box<Connection<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = plain(connection)?;
    let Some(place) = held.take() else {
        return Err(back(connection));
    };
    let lot = connection.context.parking.clone();
    let taken = lot.reserve().and_then(|(reservation, waker)| {
        // A descriptor of its own for the socket, before anything is
        // given up: the runtime's closes with its registration. Once the
        // link takes the slot's waker, every wake of the link goes to the
        // slot.
        match connection.stream.get_ref().as_fd().try_clone_to_owned() {
            Ok(socket) if connection.out.link.park_with(waker) => Some((reservation, socket)),
            _ => {
                lot.release(reservation);
                None
            }
        }
    });
    match taken {
        Some((reservation, socket)) => {
            let socket = std::net::TcpStream::from(socket);
            lot.fill(reservation, connection.into_parked(socket, place));
            Ok(())
        }
        None => {
            *held = Some(place);
            Err(back(connection))
        }
    }
}

/// `connection` as a plain one: `Err` gives it back when it is not.
fn plain<S: 'static>(
    connection: Box<Connection<S>>,
) -> Result<Box<Connection<tokio::net::TcpStream>>, Box<Connection<S>>> {
    let any: Box<dyn Any> = connection;
    any.downcast::<Connection<tokio::net::TcpStream>>()
        .map_err(|any| match any.downcast::<Connection<S>>() {
            Ok(connection) => connection,
            Err(_) => unreachable!("a box keeps the type it was made with"),
        })
}

/// A plain connection as the `S` it was before [`plain`].
fn back<S: 'static>(connection: Box<Connection<tokio::net::TcpStream>>) -> Box<Connection<S>> {
    let any: Box<dyn Any> = connection;
    match any.downcast::<Connection<S>>() {
        Ok(connection) => connection,
        Err(_) => unreachable!("only a plain connection is made plain"),
    }
}

impl Connection<tokio::net::TcpStream> {
    /// What of it a parked connection keeps. Its transport goes with the
    /// runtime's registration; `socket` is the same socket's own
    /// descriptor.
    fn into_parked(self: Box<Self>, socket: std::net::TcpStream, held: Held) -> Box<Parked> {
        let Connection {
            stream,
            peer,
            id,
            client_id,
            keep_alive,
            context,
            out,
            rare,
            ..
        } = *self;
        drop(stream);
        let Outgoing {
            link,
            version,
            client_max,
            aliases,
            ..
        } = out;
        // Held for as long as its client is quiet: among long-lived blocks.
        long_lived::make(move || {
            Box::new(Parked {
                socket,
                link,
                aliases,
                kept: Kept {
                    peer,
                    id,
                    client_id,
                    keep_alive,
                    version,
                    client_max,
                    context,
                    rare,
                    held,
                },
            })
        })
    }
}

/// From the first byte to the CONNECT handed to the state: `None` when the
/// connection ended (refused, malformed, timed out) before that.
async fn establish<S>(handshake: Box<Handshake<S>>) -> Option<Box<Connection<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Handshake {
        stream,
        peer,
        id,
        deadline,
        context,
        mut shutdown,
        admission,
    } = *handshake;
    let metrics = context.metrics.clone();
    // Reads stamped in the order the sockets became readable: the state
    // takes packets that arrived together in that order.
    let mut stream = Stamped::new(stream);
    let mut unread = BytesMut::new();
    let mut decoder = FrameDecoder::server(context.max_packet_size);

    let first = tokio::select! {
        _ = shutdown.recv() => return None,
        first = tokio::time::timeout_at(deadline, read_packet(&mut stream, &mut unread, &mut decoder, &metrics)) => first,
    };
    let connect = match first {
        Ok(Ok(Packet::Connect(connect))) => connect,
        Ok(Ok(other)) => {
            metrics.disconnected(CloseReason::Protocol);
            tracing::info!(peer = %peer, packet = %other.packet_type(), "connection closed: first packet is not CONNECT");
            return None;
        }
        Ok(Err(ReadFailure::Decode(err))) => {
            if err.reason_code() == ReasonCode::UnsupportedProtocolVersion {
                // The client may speak an older version: answer in 3.1.1's
                // CONNACK layout, which every version can read.
                let ack = connack(
                    ReasonCode::UnsupportedProtocolVersion,
                    false,
                    ConnAckProperties::default(),
                );
                write_once(&mut stream, &ack, ProtocolVersion::V311, &metrics).await;
                linger(&mut stream).await;
            }
            metrics.disconnected(CloseReason::Malformed);
            tracing::info!(peer = %peer, error = %err, "connection closed: bad CONNECT");
            return None;
        }
        Ok(Err(_)) => {
            metrics.disconnected(CloseReason::Handshake);
            return None;
        }
        Err(_) => {
            metrics.disconnected(CloseReason::Handshake);
            tracing::info!(peer = %peer, "connection closed: no CONNECT before the handshake timeout");
            return None;
        }
    };
    let version = connect.protocol;
    if admission == Admission::OverLimit {
        metrics.disconnected(CloseReason::ConnectRefused);
        tracing::warn!(
            peer = %peer,
            client_id = %connect.client_id,
            principal = connect.username.as_deref().unwrap_or("(anonymous)"),
            reason = "0x97",
            "connection refused: limits.max_connections reached"
        );
        refuse_connect(&mut stream, ReasonCode::QuotaExceeded, version, &metrics).await;
        return None;
    }

    // The bridges' own names: a client id, or a user name (without a
    // password file a user name is the principal as given).
    let reserved = if super::bridge::is_reserved(&connect.client_id) {
        Some((ReasonCode::ClientIdentifierNotValid, "client ids"))
    } else if connect
        .username
        .as_deref()
        .is_some_and(super::bridge::is_reserved)
    {
        Some((ReasonCode::BadUserNameOrPassword, "user names"))
    } else {
        None
    };
    if let Some((code, what)) = reserved {
        let why = format!("{what} beginning `bridge:` are the bridges' own");
        refuse_logged(&mut stream, &metrics, peer, &connect, code, &why).await;
        return None;
    }

    let scram = version == ProtocolVersion::V5
        && connect.properties.authentication_method.as_deref() == Some(scram::SCRAM_SHA_512);
    let mut authentication = None;
    let authenticated = match &context.passwords {
        Some(passwords) if scram => {
            let exchange = tokio::time::timeout_at(
                deadline,
                // Boxed: a future held only while connecting is not kept in
                // every connection's task for its whole life.
                Box::pin(scram_exchange(
                    &mut stream,
                    &mut unread,
                    &mut decoder,
                    &connect,
                    &passwords.current(),
                    &metrics,
                )),
            )
            .await
            .unwrap_or(Err((
                ReasonCode::NotAuthorized,
                "no AUTH before the handshake timeout",
            )));
            match exchange {
                Ok((user, server_final)) => {
                    authentication = Some((scram::SCRAM_SHA_512, server_final));
                    Ok(Some(user))
                }
                Err((code, why)) => {
                    tracing::info!(
                        peer = %peer,
                        client_id = %connect.client_id,
                        method = scram::SCRAM_SHA_512,
                        reason = %format!("0x{:02X}", code.as_u8()),
                        "connection refused: enhanced authentication failed: {why}"
                    );
                    Err(code)
                }
            }
        }
        _ => authenticate(&context, &connect).await,
    };
    let principal = match authenticated {
        Ok(principal) => principal,
        Err(code) => {
            let why = "authentication failed";
            refuse_logged(&mut stream, &metrics, peer, &connect, code, why).await;
            return None;
        }
    };

    let reauth_as = authentication
        .is_some()
        .then(|| principal.clone())
        .flatten();
    // One copy, shared by the state's tables and this connection's logs.
    // Kept as long as the client's session or connection is: made in
    // pages of long-lived blocks, as are its link and the state's entries.
    let client_id: Arc<str> = long_lived::make(|| connect.client_id.as_str().into());
    let mut request = connect_request(&connect, principal, client_id.clone());
    request.authentication = authentication;
    let client_max = request
        .maximum_packet_size
        .unwrap_or(codec::PROTOCOL_MAX_PACKET_SIZE);
    // This connection's own table: a reconnect starts with none.
    let aliases = if context.topic_aliases && version == ProtocolVersion::V5 {
        OutboundAliases::new(connect.properties.topic_alias_maximum.unwrap_or(0)).map(Box::new)
    } else {
        None
    };
    let (handle, outlet) = long_lived::make(link::link);
    let out = Outgoing::new(outlet, version, client_max, aliases);
    let rare = match (reauth_as, &context.passwords) {
        (Some(user), Some(passwords)) => Some(Box::new(Rare {
            reauth: Some(Reauthentication {
                user,
                passwords: passwords.current(),
                pending: None,
                // Its answers leave through the outbound queue, only while the
                // state holds it open: the state alone decides when it ends.
                out: out.link.link(),
            }),
            ..Rare::default()
        })),
        _ => None,
    };
    tracing::debug!(peer = %peer, client_id = %connect.client_id, protocol = %version, "connected");
    if context
        .events
        .send(Event::Connect {
            connection: id,
            request: Box::new(request),
            handle,
        })
        .await
        .is_err()
    {
        return None;
    }
    stream.order().handed_on();

    // Held to what the state grants (and tells the client in CONNACK); a
    // refused 3.1.1 client is closed by the state before it matters.
    let held = match KeepAlive::grant(
        context.max_keep_alive,
        version == ProtocolVersion::V5,
        connect.keep_alive,
    ) {
        KeepAlive::Held { seconds, .. } => seconds,
        KeepAlive::Refused => connect.keep_alive,
    };
    // What came after the CONNECT in its read stays for the first decode.
    give_back_if_empty(&mut unread);
    // Boxed: moved from the handshake's future into the task's, a value
    // this size would be laid out in both.
    // Bytes that came with the CONNECT's read are the loop's first.
    let serving = Serving {
        fresh: !unread.is_empty(),
        ..Serving::default()
    };
    Some(Box::new(Connection {
        stream,
        unread,
        peer: Peer::from(peer),
        id,
        client_id,
        keep_alive: held,
        context,
        out,
        serving,
        rare,
    }))
}

/// Why the connection's loop ended, and where its writer stands.
struct Ending {
    reason: CloseReason,
    code: Option<ReasonCode>,
    detail: String,
    writer: WriterState,
    /// Packets read before the end and not yet handed to the state: they
    /// go before the close.
    unsent: Option<Box<Event>>,
}

impl Ending {
    fn new(reason: CloseReason, code: Option<ReasonCode>, detail: String) -> Ending {
        Ending {
            reason,
            code,
            detail,
            writer: WriterState::Running,
            unsent: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriterState {
    /// The outbound queue is still open: the state has more to say.
    Running,
    /// The writer took its last packet (or its write failed).
    Ended(Farewell),
    /// The transport is to be dropped now, nothing more written.
    Killed,
}

/// Why a read ends the connection (a malformed packet, a protocol error):
/// the close's reason, its reason code and what was wrong.
type Fatal = (CloseReason, Option<ReasonCode>, String);

impl<S> Connection<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Decode what was read into the packets of one event; everything
    /// decoded before a fatal packet is kept for the state.
    fn decode_unread(&mut self, batch_hint: usize) -> (Vec<Inbound>, Option<Fatal>) {
        // Made for each read rather than kept: what it holds is the
        // listener's and the version's, both kept elsewhere.
        let mut decoder = FrameDecoder::new(
            Role::Server,
            self.context.max_packet_size,
            Some(self.out.version),
        );
        let mut batch = Vec::new();
        let mut fatal = None;
        loop {
            // A subscriber's PUBACK (PUBREC, PUBREL, PUBCOMP) in its short
            // form goes to the state without a packet built for it.
            if let Some(ack) = decoder.decode_short_ack(&mut self.unread) {
                if batch.capacity() == 0 {
                    // A subscriber's read is its acknowledgements, four
                    // bytes each: room for as many as the bytes can hold.
                    let acks = (self.unread.len() / 4 + 1).min(BATCH_HINT_MAX);
                    batch.reserve_exact(batch_hint.max(acks));
                }
                batch.push(short_ack(ack));
                continue;
            }
            match decoder.decode(&mut self.unread) {
                Ok(Some(Packet::Auth(auth))) => {
                    let Some(reauth) = self.rare.as_mut().and_then(|r| r.reauth.as_mut()) else {
                        // AUTH without enhanced authentication in CONNECT
                        // (MQTT-4.12.0-6).
                        fatal = Some((
                            CloseReason::Protocol,
                            Some(ReasonCode::ProtocolError),
                            String::new(),
                        ));
                        break;
                    };
                    match reauth.step(auth) {
                        Ok(reply) => reauth.answer(reply),
                        Err(code) => {
                            tracing::info!(peer = %self.peer, client_id = %self.client_id, reason = %format!("0x{:02X}", code.as_u8()), "re-authentication failed");
                            fatal = Some((CloseReason::Protocol, Some(code), String::new()));
                            break;
                        }
                    }
                }
                Ok(Some(packet)) => {
                    match adapt(packet, self.context.topic_alias_maximum, &mut self.rare) {
                        Ok(Some(inbound)) => {
                            if batch.capacity() == 0 {
                                batch.reserve_exact(batch_hint);
                            }
                            batch.push(inbound)
                        }
                        Ok(None) => {}
                        Err(code) => {
                            fatal = Some((CloseReason::Protocol, Some(code), String::new()));
                            break;
                        }
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    let code = err.reason_code();
                    let reason = match code {
                        ReasonCode::PacketTooLarge => CloseReason::PacketTooLarge,
                        ReasonCode::MalformedPacket => CloseReason::Malformed,
                        _ => CloseReason::Protocol,
                    };
                    fatal = Some((reason, Some(code), err.to_string()));
                    break;
                }
            }
        }
        give_back_if_empty(&mut self.unread);
        (batch, fatal)
    }

    /// Before the first poll of [`Self::poll_serve`]: keep alive runs while
    /// the reader waits for its client, from the moment it starts waiting
    /// (neither a full event queue nor a pause counts against the client).
    fn begin_serving(&mut self) {
        if let Some(limit) = silence_limit(self.keep_alive) {
            let parks = TypeId::of::<S>() == TypeId::of::<tokio::net::TcpStream>();
            self.context.keep_alives.watch(&self.out.link, limit, parks);
        }
    }

    /// Nothing read and not handed on, nothing being written, nothing
    /// waited for but the client and the queue: what a parked connection
    /// can leave behind.
    fn is_quiet(&self) -> bool {
        let out = &self.out;
        self.unread.is_empty()
            && !self.serving.fresh
            && !self.serving.paused
            && !self.serving.drained_owed
            && self
                .rare
                .as_ref()
                .is_none_or(|r| r.handing.is_none() && r.reserving.is_none())
            && out.taken == 0
            && !out.finished
            && out.pending.is_empty()
    }

    /// The client was heard: its silence starts again.
    fn heard(&self) {
        if let Some(limit) = silence_limit(self.keep_alive) {
            self.context.keep_alives.heard(&self.out.link, limit);
        }
    }

    /// The packets of the last read were handed to the state: the end a
    /// fatal packet after them called for, or the client was heard.
    fn handed_on(&mut self, fatal: Option<Fatal>) -> Option<Ending> {
        self.stream.order().handed_on();
        match fatal {
            Some((reason, code, detail)) => Some(Ending::new(reason, code, detail)),
            None => {
                self.heard();
                None
            }
        }
    }

    /// Whether the packets of the last read wait for room in the state's
    /// queue.
    fn handing(&self) -> bool {
        self.rare.as_ref().is_some_and(|r| r.handing.is_some())
    }

    /// The connection's loop, polled by its task ([`ConnectionTask`]),
    /// until it ends: the reader's side, then the
    /// socket and the outbound queue ([`poll_io`]), then the wait for room
    /// in the state's queue, each ready one handled before the next poll.
    fn poll_serve(&mut self, cx: &mut Context<'_>) -> Poll<Ending> {
        loop {
            if self.serving.fresh && !self.handing() {
                self.serving.fresh = false;
                let (batch, mut fatal) = self.decode_unread(usize::from(self.serving.batch_hint));
                if !batch.is_empty() {
                    self.serving.batch_hint = batch.len().min(BATCH_HINT_MAX) as u16;
                    let event = Event::Packets {
                        connection: self.id,
                        packets: batch,
                        read_order: self.stream.order().last(),
                    };
                    match self.context.events.try_send(event) {
                        Ok(()) => {}
                        Err(TrySendError::Full(event)) => {
                            let rare = self.rare.get_or_insert_default();
                            rare.handing = Some(event);
                            rare.fatal = fatal.take();
                        }
                        Err(TrySendError::Closed(_)) => {
                            return Poll::Ready(Ending::new(
                                CloseReason::Shutdown,
                                None,
                                String::new(),
                            ))
                        }
                    }
                }
                if !self.handing() {
                    if let Some(ending) = self.handed_on(fatal) {
                        return Poll::Ready(ending);
                    }
                }
            }
            let handing = self.handing();
            if !handing {
                // Paused by the state (the client does not read what it is
                // sent, or its packets wait behind a write): its bytes wait
                // in the socket, and nobody waits for them.
                let now_paused = self.out.link.paused();
                if now_paused && !self.serving.paused {
                    self.stream.order().set_aside();
                } else if self.serving.paused && !now_paused {
                    self.heard();
                }
                self.serving.paused = now_paused;
            }
            let Serving {
                paused, read_first, ..
            } = self.serving;
            let reading = !paused && !handing;
            let timed = reading && self.keep_alive > 0;
            if self.keep_alive > 0 && !timed {
                self.context.keep_alives.not_timed(&self.out.link);
            }
            let Connection {
                stream,
                unread,
                out,
                ..
            } = self;
            if let Poll::Ready(io) =
                poll_io(cx, stream, out, unread, reading, read_first, paused, timed)
            {
                match io {
                    Io::Unpaused => {}
                    Io::Silent => {
                        return Poll::Ready(Ending::new(
                            CloseReason::KeepAlive,
                            Some(ReasonCode::KeepAliveTimeout),
                            String::new(),
                        ));
                    }
                    // The state let go of the link while the reader was
                    // paused: the broker is stopping.
                    Io::Ended => {
                        return Poll::Ready(Ending::new(CloseReason::Shutdown, None, String::new()))
                    }
                    Io::Written(Written::Batch) => {
                        self.serving.read_first = true;
                        let (farewell, drained) = self.out.batch_written(&self.context);
                        if drained {
                            // The state waits for this queue to drain (a
                            // paused reader, retained messages still
                            // owed): say it did.
                            match self.context.events.try_send(Event::Drained {
                                connection: self.id,
                            }) {
                                Err(TrySendError::Full(_)) => self.serving.drained_owed = true,
                                Ok(()) | Err(TrySendError::Closed(_)) => {}
                            }
                        }
                        if let Some(farewell) = farewell {
                            return Poll::Ready(self.ending_with(WriterState::Ended(farewell)));
                        }
                    }
                    Io::Written(Written::Failed | Written::QueueClosed) => {
                        return Poll::Ready(self.ending_with(WriterState::Ended(Farewell::Silent)));
                    }
                    Io::Read(Ok(0)) => {
                        return Poll::Ready(Ending::new(
                            CloseReason::Network,
                            None,
                            "closed by peer".into(),
                        ))
                    }
                    Io::Read(Ok(n)) => {
                        self.serving.read_first = false;
                        self.context
                            .metrics
                            .bytes_received
                            .fetch_add(n as u64, Relaxed);
                        self.serving.fresh = true;
                    }
                    Io::Read(Err(err)) => {
                        return Poll::Ready(Ending::new(
                            CloseReason::Network,
                            None,
                            err.to_string(),
                        ))
                    }
                }
                continue;
            }
            if !(handing || self.serving.drained_owed) {
                return Poll::Pending;
            }
            let events = &self.context.events;
            let rare = self.rare.get_or_insert_default();
            let reserving = rare
                .reserving
                .get_or_insert_with(|| Box::pin(events.clone().reserve_owned()));
            let Poll::Ready(permit) = reserving.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            rare.reserving = None;
            let Ok(permit) = permit else {
                return Poll::Ready(Ending::new(CloseReason::Shutdown, None, String::new()));
            };
            let handing = rare.handing.take();
            let fatal = rare.fatal.take();
            if !rare.is_held() {
                self.rare = None;
            }
            match handing {
                Some(event) => {
                    permit.send(event);
                    if let Some(ending) = self.handed_on(fatal) {
                        return Poll::Ready(ending);
                    }
                }
                None => {
                    self.serving.drained_owed = false;
                    permit.send(Event::Drained {
                        connection: self.id,
                    });
                }
            }
        }
    }

    /// The connection ended on its writer's side: the packets still
    /// waiting for the state's queue go with the close.
    fn ending_with(&mut self, writer: WriterState) -> Ending {
        let mut ending = Ending::new(CloseReason::Network, None, String::new());
        ending.writer = writer;
        ending.unsent = self
            .rare
            .as_mut()
            .and_then(|r| r.handing.take())
            .map(Box::new);
        ending
    }

    /// Tell the state the connection ended, and let the writer say its last
    /// word.
    async fn close(mut self: Box<Self>, ending: Ending) {
        let Ending {
            reason,
            code,
            detail,
            mut writer,
            unsent,
        } = ending;
        if !matches!(reason, CloseReason::Network) || !detail.is_empty() {
            tracing::debug!(peer = %self.peer, client_id = %self.client_id, reason = reason.label(), detail = %detail, "connection closing");
        }
        if matches!(
            reason,
            CloseReason::Malformed | CloseReason::Protocol | CloseReason::PacketTooLarge
        ) {
            tracing::info!(peer = %self.peer, client_id = %self.client_id, reason = reason.label(), error = %detail, "connection closed");
        }
        if let WriterState::Ended(_) = writer {
            self.shut_down_writes().await;
        }
        if let Some(event) = unsent {
            let _ = self.context.events.send(*event).await;
        }
        let _ = self
            .context
            .events
            .send(Event::Closed {
                connection: self.id,
                reason,
                disconnect_reason: code,
            })
            .await;
        if writer == WriterState::Running {
            // The state lets go of its end of the link; the writer
            // writes what is queued (a DISCONNECT with the reason, say) and
            // ends.
            let finish = async {
                let farewell = self.out.drain(&mut self.stream, &self.context).await;
                self.shut_down_writes().await;
                farewell
            };
            writer = match tokio::time::timeout(WRITER_GRACE, finish).await {
                Ok(farewell) => WriterState::Ended(farewell),
                Err(_) => WriterState::Killed,
            };
        }
        if writer == WriterState::Ended(Farewell::Said) {
            linger(&mut self.stream).await;
        }
    }

    async fn shut_down_writes(&mut self) {
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
            let _ = self.stream.flush().await;
            let _ = self.stream.shutdown().await;
        })
        .await;
    }
}

/// How long a client with keep alive `seconds` may be silent: one and a
/// half times that (MQTT-3.1.2-24).
fn silence_limit(seconds: u16) -> Option<Duration> {
    (seconds > 0).then(|| Duration::from_millis(u64::from(seconds) * 1500))
}

/// What one poll of a connection's socket and outbound queue came to.
enum Io {
    /// Bytes read (appended to the unread ones), 0 at the end of the stream.
    Read(std::io::Result<usize>),
    Written(Written),
    /// The state let the paused reader go.
    Unpaused,
    /// The state let go of the link while the reader was paused.
    Ended,
    /// The client was silent past its keep alive.
    Silent,
}

/// Both sides in one poll, so a write the client does not take never
/// stops the reads (nor the reads the writes): a client that writes
/// without reading is still read. `read_first` takes turns: a read ready
/// is handed on before a batch is written, as a reader of its own would
/// (the broker task waits for reads woken before the ones it holds), and
/// a busy reader still leaves the writer its turn. The keep-alive timer's
/// word that the client was silent (`timed`) counts only when neither
/// side had anything: a read that came as the timer looked is the
/// client heard.
#[allow(clippy::too_many_arguments)]
fn poll_io<S: AsyncRead + AsyncWrite + Unpin>(
    cx: &mut Context<'_>,
    stream: &mut S,
    out: &mut Outgoing,
    unread: &mut BytesMut,
    reading: bool,
    read_first: bool,
    paused: bool,
    timed: bool,
) -> Poll<Io> {
    if reading && read_first {
        if let Poll::Ready(read) = poll_read_into(stream, cx, unread) {
            return Poll::Ready(Io::Read(read));
        }
    }
    if let Poll::Ready(written) = out.poll_write(cx, stream) {
        return Poll::Ready(Io::Written(written));
    }
    if reading && !read_first {
        if let Poll::Ready(read) = poll_read_into(stream, cx, unread) {
            return Poll::Ready(Io::Read(read));
        }
    }
    if paused {
        // Its waker is the one the queue wakes: the same task.
        return match ready!(out.link.poll_unpaused(cx)) {
            true => Poll::Ready(Io::Unpaused),
            false => Poll::Ready(Io::Ended),
        };
    }
    if timed {
        // A writer waiting on its queue registered the task's waker where
        // the timer takes it, in the lock it found the queue empty in: the
        // flag is enough. One waiting on the socket registers it here.
        let silent = if out.waits_on_queue() {
            out.link.silent()
        } else {
            out.link.poll_silent(cx).is_ready()
        };
        if silent {
            return Poll::Ready(Io::Silent);
        }
    }
    Poll::Pending
}

/// What the writer's last act was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Farewell {
    /// A DISCONNECT or a refusing CONNACK was written and the write side
    /// shut down: the reason is on its way and must not be overtaken by a
    /// reset.
    Said,
    /// Closed without a last word (3.1.1, a write error, killed).
    Silent,
}

/// Count, log and answer a refused CONNECT.
async fn refuse_logged<T: AsyncRead + AsyncWrite + Unpin>(
    transport: &mut T,
    metrics: &Metrics,
    peer: SocketAddr,
    connect: &Connect,
    code: ReasonCode,
    why: &str,
) {
    metrics.disconnected(CloseReason::ConnectRefused);
    tracing::info!(
        peer = %peer,
        client_id = %connect.client_id,
        principal = connect.username.as_deref().unwrap_or("(anonymous)"),
        reason = %format!("0x{:02X}", code.as_u8()),
        "connection refused: {why}"
    );
    refuse_connect(transport, code, connect.protocol, metrics).await;
}

/// Answer a refused CONNECT and let the client read it before the close.
async fn refuse_connect<T: AsyncRead + AsyncWrite + Unpin>(
    transport: &mut T,
    code: ReasonCode,
    version: ProtocolVersion,
    metrics: &Metrics,
) {
    let ack = connack(code, false, ConnAckProperties::default());
    write_once(transport, &ack, version, metrics).await;
    linger(transport).await;
}

/// Read and drop what the client still sends until it closes its side,
/// [`LINGER_TIME`] passes, or [`LINGER_BYTES`] were dropped.
async fn linger<R: AsyncRead + Unpin>(rd: &mut R) {
    let mut scratch = vec![0u8; 16 * 1024];
    let mut dropped = 0usize;
    let _ = tokio::time::timeout(LINGER_TIME, async {
        while dropped < LINGER_BYTES {
            match rd.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => dropped += n,
            }
        }
    })
    .await;
}

fn connack(reason: ReasonCode, session_present: bool, properties: ConnAckProperties) -> Packet {
    Packet::ConnAck(ConnAck {
        session_present,
        reason,
        properties,
    })
}

async fn write_once<W: AsyncWrite + Unpin>(
    wr: &mut W,
    packet: &Packet,
    version: ProtocolVersion,
    metrics: &Metrics,
) {
    let mut buf = BytesMut::new();
    if codec::encode(packet, version, &mut buf).is_ok() {
        metrics.bytes_sent.fetch_add(buf.len() as u64, Relaxed);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            wr.write_all(&buf).await?;
            wr.shutdown().await
        })
        .await;
    }
}

/// Re-authentication on a live connection (MQTT 5 4.12.1): only for a
/// connection that authenticated with SCRAM-SHA-512, as the same user.
struct Reauthentication {
    /// The SCRAM user of the CONNECT.
    user: Arc<str>,
    passwords: Arc<PasswordFile>,
    pending: Option<scram::ScramServer>,
    /// Where the answers are queued: the connection's outbound queue
    /// (counted there as the connection's own).
    out: Arc<link::ConnectionLink>,
}

impl Reauthentication {
    /// The AUTH to send for `auth`, or the DISCONNECT reason.
    fn step(&mut self, auth: codec::Auth) -> Result<Outbound, ReasonCode> {
        if auth.properties.authentication_method.as_deref() != Some(scram::SCRAM_SHA_512) {
            return Err(ReasonCode::ProtocolError);
        }
        let data = auth.properties.authentication_data.unwrap_or_default();
        match (auth.reason, self.pending.take()) {
            (ReasonCode::ReAuthenticate, None) => {
                let nonce = scram::server_nonce().map_err(|_| ReasonCode::UnspecifiedError)?;
                let (server, server_first) =
                    scram::ScramServer::start(&self.passwords, &data, &nonce)
                        .map_err(|_| ReasonCode::ProtocolError)?;
                self.pending = Some(server);
                Ok(Outbound::Auth {
                    reason: ReasonCode::ContinueAuthentication,
                    method: scram::SCRAM_SHA_512,
                    data: server_first.into(),
                })
            }
            (ReasonCode::ContinueAuthentication, Some(server)) => {
                if server.user() != &*self.user {
                    return Err(ReasonCode::NotAuthorized);
                }
                match server.finish(&data) {
                    Ok(server_final) => Ok(Outbound::Auth {
                        reason: ReasonCode::Success,
                        method: scram::SCRAM_SHA_512,
                        data: server_final.into(),
                    }),
                    // 0x86 is no DISCONNECT reason: "not authorized" is.
                    Err(scram::ScramError::BadProof) => Err(ReasonCode::NotAuthorized),
                    Err(scram::ScramError::Malformed(_)) => Err(ReasonCode::ProtocolError),
                }
            }
            _ => Err(ReasonCode::ProtocolError),
        }
    }

    /// Queue an answer behind what the state queued, counted as the
    /// connection's own.
    fn answer(&self, reply: Outbound) {
        self.out.send_own(reply);
    }
}

/// SCRAM-SHA-512 over AUTH (MQTT 5 4.12): the CONNECT's Authentication
/// Data is client-first, AUTH 0x18 answers server-first, the client's AUTH
/// 0x18 brings client-final. `Ok((user, server-final))` for the CONNACK;
/// `Err((reason, why))` refuses the CONNECT. Proofs are checked, never
/// logged.
async fn scram_exchange<T>(
    transport: &mut T,
    unread: &mut BytesMut,
    decoder: &mut FrameDecoder,
    connect: &Connect,
    passwords: &PasswordFile,
    metrics: &Metrics,
) -> Result<(Arc<str>, bytes::Bytes), (ReasonCode, &'static str)>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let client_first = connect
        .properties
        .authentication_data
        .clone()
        .unwrap_or_default();
    let nonce =
        scram::server_nonce().map_err(|_| (ReasonCode::UnspecifiedError, "no random nonce"))?;
    let (server, server_first) = scram::ScramServer::start(passwords, &client_first, &nonce)
        .map_err(|_| {
            (
                ReasonCode::MalformedPacket,
                "a malformed client-first message",
            )
        })?;
    let challenge = Packet::Auth(codec::Auth {
        reason: ReasonCode::ContinueAuthentication,
        properties: codec::AuthProperties {
            authentication_method: Some(scram::SCRAM_SHA_512.to_owned()),
            authentication_data: Some(server_first.into()),
            ..codec::AuthProperties::default()
        },
    });
    let mut out = BytesMut::new();
    codec::encode(&challenge, ProtocolVersion::V5, &mut out).map_err(|_| {
        (
            ReasonCode::UnspecifiedError,
            "the challenge could not be encoded",
        )
    })?;
    transport.write_all(&out).await.map_err(|_| {
        (
            ReasonCode::UnspecifiedError,
            "the challenge could not be sent",
        )
    })?;
    metrics.bytes_sent.fetch_add(out.len() as u64, Relaxed);
    let answer = match read_packet(transport, unread, decoder, metrics).await {
        Ok(Packet::Auth(auth))
            if auth.reason == ReasonCode::ContinueAuthentication
                && auth.properties.authentication_method.as_deref()
                    == Some(scram::SCRAM_SHA_512) =>
        {
            auth.properties.authentication_data.unwrap_or_default()
        }
        Ok(_) => {
            return Err((
                ReasonCode::ProtocolError,
                "the answer is not AUTH 0x18 SCRAM-SHA-512",
            ))
        }
        Err(_) => return Err((ReasonCode::ProtocolError, "no answer to the challenge")),
    };
    let user: Arc<str> = server.user().into();
    match server.finish(&answer) {
        Ok(server_final) => Ok((user, server_final.into())),
        Err(scram::ScramError::BadProof) => Err((
            ReasonCode::BadUserNameOrPassword,
            "the proof does not match",
        )),
        Err(scram::ScramError::Malformed(_)) => Err((
            ReasonCode::MalformedPacket,
            "a malformed client-final message",
        )),
    }
}

/// Who the client is: `Ok(None)` anonymous, `Ok(Some(user))` authenticated,
/// `Err(reason)` refused. Passwords are compared, never logged.
async fn authenticate(
    context: &ConnectionContext,
    connect: &Connect,
) -> Result<Option<Arc<str>>, ReasonCode> {
    if connect.properties.authentication_method.is_some() {
        return Err(ReasonCode::BadAuthenticationMethod);
    }
    match &connect.username {
        None => {
            if context.allow_anonymous {
                Ok(None)
            } else {
                Err(ReasonCode::NotAuthorized)
            }
        }
        Some(user) => match &context.passwords {
            Some(passwords) => {
                // PBKDF2 costs what the file's iteration count says: off the
                // runtime's workers, on threads of its own.
                let checked = context
                    .password_checks
                    .check(
                        passwords.current(),
                        user.clone(),
                        connect.password.clone().unwrap_or_default(),
                    )
                    .await;
                let ok = match checked {
                    Ok(ok) => ok,
                    Err(error) => {
                        tracing::error!(error = %error, "a password could not be checked");
                        return Err(ReasonCode::ServerUnavailable);
                    }
                };
                if ok {
                    Ok(Some(user.as_str().into()))
                } else {
                    Err(ReasonCode::BadUserNameOrPassword)
                }
            }
            // Without a password file a user name is only a label, and only
            // where anonymous clients are welcome anyway.
            None if context.allow_anonymous => Ok(Some(user.as_str().into())),
            None => Err(ReasonCode::BadUserNameOrPassword),
        },
    }
}

fn connect_request(
    connect: &Connect,
    principal: Option<Arc<str>>,
    client_id: Arc<str>,
) -> ConnectRequest {
    let v5 = connect.protocol == ProtocolVersion::V5;
    let props = &connect.properties;
    let will = connect.will.as_ref().map(|will| {
        let p = &will.properties;
        WillRequest {
            topic: will.topic.clone(),
            payload: will.payload.clone(),
            qos: will.qos.as_u8(),
            retain: will.retain,
            properties: codec::PublishProperties {
                payload_format_indicator: p.payload_format_indicator,
                message_expiry_interval: p.message_expiry_interval,
                topic_alias: None,
                response_topic: p.response_topic.clone().map(ByteStr::from),
                correlation_data: p.correlation_data.clone(),
                user_properties: p.user_properties.clone(),
                subscription_identifiers: Vec::new(),
                content_type: p.content_type.clone().map(ByteStr::from),
            }
            .into(),
            delay: p.will_delay_interval.unwrap_or(0),
        }
    });
    ConnectRequest {
        v5,
        client_id,
        clean_start: connect.clean_start,
        keep_alive: connect.keep_alive,
        principal,
        will,
        session_expiry: if v5 {
            props.session_expiry_interval.unwrap_or(0)
        } else {
            0
        },
        receive_maximum: props.receive_maximum.unwrap_or(u16::MAX),
        maximum_packet_size: props.maximum_packet_size,
        request_response_information: v5 && props.request_response_information == Some(true),
        authentication: None,
        bridge: None,
    }
}

/// What the state needs of an acknowledgement in its short form (reason
/// Success, no properties; see [`FrameDecoder::decode_short_ack`]).
fn short_ack(ack: codec::Ack) -> Inbound {
    use codec::Ack as A;
    let reason = ReasonCode::Success;
    match ack {
        A::PubAck(packet_id) => Inbound::PubAck { packet_id, reason },
        A::PubRec(packet_id) => Inbound::PubRec { packet_id, reason },
        A::PubRel(packet_id) => Inbound::PubRel { packet_id },
        A::PubComp(packet_id) => Inbound::PubComp { packet_id },
    }
}

/// The protocol adapter: a decoded packet into what the state needs, with
/// topic aliases resolved. `Err(reason)` closes the connection.
/// The topic aliases a client set on this connection, up to the maximum
/// the CONNACK announced; the table grows as the client uses them, so a
/// client that never does (every MQTT 3.1.1 client) holds none.
#[derive(Default)]
struct InboundAliases {
    /// Grown to the highest alias used. A boxed slice rather than a
    /// `Vec`: aliases are set a few times in a connection's life.
    slots: Box<[Option<ByteStr>]>,
}

impl InboundAliases {
    /// Alias `alias`'s slot, `None` when it is out of range (0 or above
    /// `maximum`, the listener's).
    fn slot(&mut self, alias: u16, maximum: u16) -> Option<&mut Option<ByteStr>> {
        if alias == 0 || alias > maximum {
            return None;
        }
        let index = usize::from(alias);
        if self.slots.len() <= index {
            let mut slots = std::mem::take(&mut self.slots).into_vec();
            slots.resize(index + 1, None);
            self.slots = slots.into_boxed_slice();
        }
        self.slots.get_mut(index)
    }
}

/// `rare` is made for the alias table of the first PUBLISH that sets one.
fn adapt(
    packet: Packet,
    alias_maximum: u16,
    rare: &mut Option<Box<Rare>>,
) -> Result<Option<Inbound>, ReasonCode> {
    Ok(Some(match packet {
        Packet::Publish(publish) => {
            let Publish {
                dup,
                qos,
                retain,
                mut topic,
                packet_id,
                mut properties,
                payload,
            } = publish;
            if let Some(alias) = properties.topic_alias.take() {
                let slot = rare
                    .get_or_insert_default()
                    .aliases
                    .slot(alias, alias_maximum)
                    .ok_or(ReasonCode::TopicAliasInvalid)?;
                if topic.is_empty() {
                    // An alias this connection never mapped is as invalid
                    // as one out of range (MQTT 5 3.3.2.3.4).
                    topic = slot.clone().ok_or(ReasonCode::TopicAliasInvalid)?;
                } else {
                    *slot = Some(topic.clone());
                }
            }
            if topic.is_empty() {
                return Err(ReasonCode::ProtocolError);
            }
            properties.subscription_identifiers.clear();
            Inbound::Publish(InboundPublish {
                packet_id,
                qos: qos.as_u8(),
                retain,
                dup,
                topic,
                payload,
                properties: properties.into(),
            })
        }
        Packet::PubAck(ack) => Inbound::PubAck {
            packet_id: ack.packet_id,
            reason: ack.reason,
        },
        Packet::PubRec(ack) => Inbound::PubRec {
            packet_id: ack.packet_id,
            reason: ack.reason,
        },
        Packet::PubRel(ack) => Inbound::PubRel {
            packet_id: ack.packet_id,
        },
        Packet::PubComp(ack) => Inbound::PubComp {
            packet_id: ack.packet_id,
        },
        Packet::Subscribe(subscribe) => Inbound::Subscribe {
            packet_id: subscribe.packet_id,
            subscription_id: subscribe.properties.subscription_identifier,
            user_properties: subscribe.properties.user_properties,
            filters: subscribe
                .filters
                .into_iter()
                .map(|f| {
                    (
                        f.filter,
                        SubOptions {
                            qos: f.options.qos.as_u8(),
                            no_local: f.options.no_local,
                            retain_as_published: f.options.retain_as_published,
                            retain_handling: f.options.retain_handling as u8,
                            subscription_id: None,
                        },
                    )
                })
                .collect(),
        },
        Packet::Unsubscribe(unsubscribe) => Inbound::Unsubscribe {
            packet_id: unsubscribe.packet_id,
            filters: unsubscribe.filters,
        },
        Packet::PingReq => Inbound::PingReq,
        Packet::Disconnect(disconnect) => Inbound::Disconnect {
            reason: disconnect.reason,
            session_expiry: disconnect.properties.session_expiry_interval,
        },
        // AUTH is taken by the reader before this (re-authentication); a
        // second CONNECT or anything only a server sends is out of place.
        _ => return Err(ReasonCode::ProtocolError),
    }))
}

fn qos(value: u8) -> QoS {
    QoS::from_u8(value).unwrap_or(QoS::AtMostOnce)
}

fn ack(packet_id: u16, code: ReasonCode) -> PubAck {
    PubAck {
        packet_id,
        reason: code,
        properties: AckProperties::default(),
    }
}

/// The packet for an outbound item other than a delivery; `None` for a
/// 3.1.1 DISCONNECT.
fn to_packet(out: Outbound, v5: bool) -> Option<Packet> {
    Some(match out {
        Outbound::ConnAck {
            session_present,
            reason: code,
            session_expiry,
            receive_maximum,
            maximum_packet_size,
            topic_alias_maximum,
            server_keep_alive,
            extras,
        } => {
            let ConnAckExtras {
                assigned_client_id,
                response_information,
                authentication,
            } = extras.map(|e| *e).unwrap_or_default();
            let properties = if code == ReasonCode::Success {
                ConnAckProperties {
                    session_expiry_interval: session_expiry,
                    receive_maximum: Some(receive_maximum),
                    maximum_packet_size: Some(maximum_packet_size),
                    assigned_client_identifier: assigned_client_id.map(|id| id.to_string()),
                    topic_alias_maximum: Some(topic_alias_maximum),
                    server_keep_alive,
                    response_information: response_information.map(|r| r.to_string()),
                    authentication_method: authentication
                        .as_ref()
                        .map(|(method, _)| (*method).to_owned()),
                    authentication_data: authentication.map(|(_, data)| data),
                    ..ConnAckProperties::default()
                }
            } else {
                ConnAckProperties::default()
            };
            connack(code, session_present, properties)
        }
        // A delivery is written from its shared message by
        // [`write_delivery`], never built into a packet of its own.
        Outbound::Publish { .. } => return None,
        Outbound::PubAck { packet_id, reason } => Packet::PubAck(ack(packet_id, reason)),
        Outbound::PubRec { packet_id, reason } => Packet::PubRec(ack(packet_id, reason)),
        Outbound::PubRel { packet_id, reason } => Packet::PubRel(ack(packet_id, reason)),
        Outbound::PubComp { packet_id, reason } => Packet::PubComp(ack(packet_id, reason)),
        Outbound::SubAck {
            packet_id,
            reasons,
            reason_string,
        } => Packet::SubAck(SubAck {
            packet_id,
            reasons,
            properties: AckProperties {
                reason_string: reason_string.map(String::from),
                ..AckProperties::default()
            },
        }),
        Outbound::UnsubAck { packet_id, reasons } => Packet::UnsubAck(UnsubAck {
            packet_id,
            reasons,
            properties: AckProperties::default(),
        }),
        Outbound::PingResp => Packet::PingResp,
        Outbound::Auth {
            reason,
            method,
            data,
        } => Packet::Auth(codec::Auth {
            reason,
            properties: codec::AuthProperties {
                authentication_method: Some(method.to_owned()),
                authentication_data: Some(data.into()),
                ..codec::AuthProperties::default()
            },
        }),
        Outbound::Disconnect {
            reason,
            reason_string,
        } => {
            if !v5 {
                return None;
            }
            Packet::Disconnect(Disconnect {
                reason,
                properties: DisconnectProperties {
                    reason_string: reason_string.map(str::to_owned),
                    ..DisconnectProperties::default()
                },
            })
        }
    })
}

/// A PUBLISH the writer sends: the shared message and what is this
/// delivery's own.
#[derive(Clone, Copy)]
struct Delivery<'a> {
    dup: bool,
    qos: QoS,
    retain: bool,
    packet_id: u16,
    message: &'a Message,
    subscription_ids: &'a [u32],
    /// Message expiry left, sent in place of the original interval.
    expiry: Option<u32>,
}

/// Encode `delivery` into `buf` straight from its message (no packet is
/// built, nothing of the message copied or counted again), with an
/// outbound topic alias when the connection uses them. False when it was
/// not sent: too large for the client (the state has already measured it,
/// so this only guards against the estimate being off).
fn write_delivery(
    delivery: &Delivery<'_>,
    version: ProtocolVersion,
    client_max: u32,
    aliases: Option<&mut OutboundAliases>,
    buf: &mut BytesMut,
    spliced: &mut Lazy<Spliced>,
) -> bool {
    let message = delivery.message;
    let splice = message.payload.len() >= SPLICE_MIN;
    // Most MQTT 5 deliveries of a message send the same bytes but for
    // their packet identifier and flags: those are copied from the form
    // the first writer encoded. A delivery with its own topic alias,
    // Subscription Identifiers or expiry left is encoded for itself, as is
    // every MQTT 3.1.1 one (see `WireForms`).
    if version == ProtocolVersion::V5
        && !splice
        && aliases.is_none()
        && message.properties.topic_alias.is_none()
        && delivery.subscription_ids.is_empty()
        && delivery.expiry.is_none()
    {
        return copy_delivery(delivery, version, client_max, buf);
    }
    let mut aliases = aliases;
    let (topic, topic_alias, assigned) = match aliases.as_deref_mut() {
        Some(table) => match table.alias_for(&message.topic) {
            AliasUse::Reuse(alias) => ("", Some(alias), false),
            AliasUse::Assign(alias) => (&*message.topic, Some(alias), true),
        },
        None => (&*message.topic, message.properties.topic_alias, false),
    };
    let mut offset = DecimalBuf::default();
    // MQTT 3.1.1 has no properties: its deliveries write no offset, so it
    // is not formatted for them.
    let extra_user_property = match version {
        ProtocolVersion::V5 => message.offset_property(&mut offset),
        ProtocolVersion::V311 => None,
    };
    let publish = codec::PublishRef {
        dup: delivery.dup,
        qos: delivery.qos,
        retain: delivery.retain,
        topic,
        packet_id: delivery.packet_id,
        properties: &message.properties,
        message_expiry_interval: delivery.expiry,
        topic_alias,
        subscription_ids: delivery.subscription_ids,
        extra_user_property,
        payload: &message.payload,
    };
    if splice {
        if codec::encode_publish_head(&publish, version, client_max, buf).is_ok() {
            // The batch is below `WRITE_KEEP_MAX` and a packet below
            // 256 MiB, so where the payload goes fits.
            let at = u32::try_from(buf.len()).unwrap_or(u32::MAX);
            spliced.push((at, message.payload.clone()));
            return true;
        }
    } else if codec::encode_publish(&publish, version, client_max, buf).is_ok() {
        return true;
    }
    if let (true, Some(table)) = (assigned, aliases) {
        // Not sent, so the client never learnt this alias.
        table.forget(&message.topic);
    }
    false
}

/// [`write_delivery`] of a delivery every writer sends alike: the
/// message's form copied, its first byte and packet identifier written
/// over. The form is encoded once, by the first writer that needs it.
/// False when it is too large for the client, as
/// [`codec::encode_publish`] would refuse it.
fn copy_delivery(
    delivery: &Delivery<'_>,
    version: ProtocolVersion,
    client_max: u32,
    buf: &mut BytesMut,
) -> bool {
    let message = delivery.message;
    let with_id = delivery.qos != QoS::AtMostOnce;
    let form = message.wire.shape(with_id).get_or_init(|| {
        let mut offset = DecimalBuf::default();
        let publish = codec::PublishRef {
            dup: false,
            qos: if with_id {
                QoS::AtLeastOnce
            } else {
                QoS::AtMostOnce
            },
            retain: false,
            topic: &message.topic,
            // Any identifier: each delivery writes its own over it.
            packet_id: u16::from(with_id),
            properties: &message.properties,
            message_expiry_interval: None,
            topic_alias: None,
            subscription_ids: &[],
            extra_user_property: message.offset_property(&mut offset),
            payload: &message.payload,
        };
        let mut bytes = BytesMut::new();
        codec::encode_publish(&publish, version, u32::MAX, &mut bytes).ok()?;
        // The fixed header (a byte and the remaining length), then the
        // topic's length and bytes: the identifier follows.
        let length_bytes = bytes.iter().skip(1).take_while(|b| **b & 0x80 != 0).count() + 1;
        Some(WireForm {
            packet_id_at: 1 + length_bytes + 2 + message.topic.len(),
            bytes: Vec::from(bytes).into_boxed_slice(),
        })
    });
    let Some(form) = form else {
        return false;
    };
    if form.bytes.len() > client_max as usize {
        return false;
    }
    let start = buf.len();
    buf.extend_from_slice(&form.bytes);
    let dup = delivery.dup && with_id;
    buf[start] = ((codec::PacketType::Publish as u8) << 4)
        | (u8::from(dup) << 3)
        | (delivery.qos.as_u8() << 1)
        | u8::from(delivery.retain);
    if with_id {
        let at = start + form.packet_id_at;
        buf[at..at + 2].copy_from_slice(&delivery.packet_id.to_be_bytes());
    }
    true
}

/// What was written: a batch, or the end of the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// The batch taken from the queue is on the socket.
    Batch,
    /// The socket refused it (the client is gone).
    Failed,
    /// The state let go of its end of the link: nothing more will come.
    QueueClosed,
}

/// A batch's spliced payloads: each the offset in the write buffer it goes
/// at, and the payload. Allocated for the connections that are sent one.
type Spliced = Vec<(u32, bytes::Bytes)>;
lazy::empty!(Spliced, Vec::new());

/// The writer side of a connection: takes up to [`WRITE_BATCH`] queued
/// packets at a time, encoding each as it is taken into one buffer, and
/// writes it, as many times as the socket takes part of it. Packets are
/// taken one by one, so no batch of them is held; the buffer is given
/// back, beyond [`WRITE_KEEP`], whenever the queue is drained.
struct Outgoing {
    /// The connection's end of the queue, its counts and its pause.
    link: link::Outlet,
    /// Packets taken off the queue in one go and not yet encoded: the
    /// writer takes them a batch at a time.
    pending: VecDeque<Outbound>,
    /// The batch's counts are as narrow as what they count: every
    /// connection holds them.
    version: ProtocolVersion,
    client_max: u32,
    /// Outbound topic aliases (MQTT 5 clients that announce a maximum).
    aliases: Option<Box<OutboundAliases>>,
    /// The encoded batch, and how much of it the socket took so far.
    buf: BytesMut,
    /// The batch's large payloads, written from their messages: each the
    /// offset in `buf` it goes at (right after its header), and the
    /// payload.
    spliced: Lazy<Spliced>,
    /// At most one batch's bytes, or one packet's (below 256 MiB), the
    /// spliced payloads counted.
    at: u32,
    /// Packets of the batch in `buf` (at most `WRITE_BATCH`): 0 while no
    /// batch is being written.
    taken: u16,
    /// Deliveries in the batch (for `saguin_messages_sent_total`).
    publishes: u16,
    /// The batch ends with the connection's last word (a DISCONNECT, a
    /// refusing CONNACK), or with the end of a 3.1.1 connection, which
    /// has none: nothing more is taken from the queue.
    finished: bool,
    said: bool,
}

impl Outgoing {
    fn new(
        link: link::Outlet,
        version: ProtocolVersion,
        client_max: u32,
        aliases: Option<Box<OutboundAliases>>,
    ) -> Outgoing {
        Outgoing {
            link,
            pending: VecDeque::new(),
            version,
            client_max,
            aliases,
            buf: BytesMut::new(),
            spliced: Lazy::default(),
            at: 0,
            taken: 0,
            publishes: 0,
            finished: false,
            said: false,
        }
    }

    /// Take a batch when none is being written, and write what is left of
    /// it. Ready once the whole batch is on the socket, the socket failed,
    /// or the queue ended.
    fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        wr: &mut W,
    ) -> Poll<Written> {
        if self.taken == 0 {
            if self.finished {
                return Poll::Pending;
            }
            if self.pending.is_empty() && !ready!(self.link.poll_take(cx, &mut self.pending)) {
                return Poll::Ready(Written::QueueClosed);
            }
            // Bounded in bytes too: a batch of large messages is written
            // before more are encoded, and its offset fits `at`.
            while usize::from(self.taken) < WRITE_BATCH
                && self.batch_len() < WRITE_KEEP_MAX
                && !self.finished
            {
                let Some(out) = self.pending.pop_front() else {
                    break;
                };
                self.encode(out);
                self.taken += 1;
            }
        }
        let len = self.batch_len();
        while (self.at as usize) < len {
            let written = if self.spliced.is_empty() {
                let unwritten = &self.buf[self.at as usize..];
                ready!(Pin::new(&mut *wr).poll_write(cx, unwritten))
            } else {
                let mut parts = [std::io::IoSlice::new(&[]); 2 * SPLICED_PARTS + 1];
                let count = self.unwritten_parts(&mut parts);
                ready!(Pin::new(&mut *wr).poll_write_vectored(cx, &parts[..count]))
            };
            match written {
                Ok(0) | Err(_) => return Poll::Ready(Written::Failed),
                // A write takes at most what it was given, which is below
                // the bound on a batch plus one packet.
                Ok(n) => self.at += u32::try_from(n).unwrap_or(u32::MAX),
            }
        }
        Poll::Ready(Written::Batch)
    }

    /// The batch's bytes: the encoded ones and the spliced payloads.
    fn batch_len(&self) -> usize {
        self.buf.len() + self.spliced.iter().map(|(_, p)| p.len()).sum::<usize>()
    }

    /// What is left of the batch from `at`, in order, as at most
    /// `parts.len()` slices: the encoded bytes cut where each spliced
    /// payload goes. Returns how many were filled.
    fn unwritten_parts<'a>(&'a self, parts: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut skip = self.at as usize;
        let mut count = 0;
        let mut add = |piece: &'a [u8]| {
            if skip >= piece.len() {
                skip -= piece.len();
            } else if count < parts.len() {
                parts[count] = std::io::IoSlice::new(&piece[skip..]);
                skip = 0;
                count += 1;
            }
        };
        let mut from = 0;
        for (at, payload) in self.spliced.iter() {
            add(&self.buf[from..*at as usize]);
            add(payload);
            from = *at as usize;
        }
        add(&self.buf[from..]);
        count
    }

    /// Whether a `Pending` from [`Self::poll_write`] came from the empty
    /// queue, the task's waker registered in it, rather than from the
    /// socket.
    fn waits_on_queue(&self) -> bool {
        self.taken == 0 && !self.finished
    }

    /// The batch is written: count it off the queue and give the buffers
    /// back if nothing more waits. Says whether that was the last word,
    /// and whether the state should be told the queue drained.
    fn batch_written(&mut self, context: &ConnectionContext) -> (Option<Farewell>, bool) {
        let metrics = &context.metrics;
        metrics
            .bytes_sent
            .fetch_add(self.batch_len() as u64, Relaxed);
        metrics
            .messages_sent
            .fetch_add(u64::from(self.publishes), Relaxed);
        self.link.written.fetch_add(u32::from(self.taken), Relaxed);
        self.taken = 0;
        self.at = 0;
        self.publishes = 0;
        if let Some(spliced) = self.spliced.allocated_mut() {
            spliced.clear();
        }
        let left = self.pending.len() + self.link.queued();
        let keep = if left == 0 {
            WRITE_KEEP
        } else {
            WRITE_KEEP_MAX
        };
        if self.buf.capacity() > keep {
            self.buf = BytesMut::new();
        } else {
            self.buf.clear();
        }
        // Read before it is swapped: the swap would take the line from
        // the state's core after every write.
        let drained = left < context.low_water()
            && self.link.want_drained.load(Relaxed)
            && self.link.want_drained.swap(false, Relaxed);
        let farewell = self.finished.then_some(match self.said {
            true => Farewell::Said,
            false => Farewell::Silent,
        });
        (farewell, drained)
    }

    /// Write what is queued until the state ends the queue or the last
    /// word is written (a closing connection's writer).
    async fn drain<W: AsyncWrite + Unpin>(
        &mut self,
        wr: &mut W,
        context: &ConnectionContext,
    ) -> Farewell {
        loop {
            match poll_fn(|cx| self.poll_write(cx, wr)).await {
                Written::Batch => {
                    if let (Some(farewell), _) = self.batch_written(context) {
                        return farewell;
                    }
                }
                Written::Failed | Written::QueueClosed => return Farewell::Silent,
            }
        }
    }

    /// Encode a packet taken from the queue into `buf`: a delivery from
    /// its shared message, an acknowledgement without a packet built. A
    /// last word is the batch's last packet.
    fn encode(&mut self, out: Outbound) {
        let v5 = self.version == ProtocolVersion::V5;
        let (version, client_max) = (self.version, self.client_max);
        if let Outbound::Publish {
            packet_id,
            qos: q,
            retain,
            dup,
            message,
            subscription_ids,
            expiry,
            sys,
        } = out
        {
            let delivery = Delivery {
                dup,
                qos: qos(q),
                retain,
                packet_id,
                message: &message,
                subscription_ids: &subscription_ids,
                expiry,
            };
            let aliases = self.aliases.as_deref_mut();
            let (buf, spliced) = (&mut self.buf, &mut self.spliced);
            if write_delivery(&delivery, version, client_max, aliases, buf, spliced) {
                self.publishes += u16::from(!sys);
            }
            return;
        }
        let ack = match out {
            Outbound::PubAck { packet_id, reason } => Some((codec::Ack::PubAck(packet_id), reason)),
            Outbound::PubRec { packet_id, reason } => Some((codec::Ack::PubRec(packet_id), reason)),
            Outbound::PubRel { packet_id, reason } => Some((codec::Ack::PubRel(packet_id), reason)),
            Outbound::PubComp { packet_id, reason } => {
                Some((codec::Ack::PubComp(packet_id), reason))
            }
            _ => None,
        };
        if let Some((ack, reason)) = ack {
            // As `encode_within` would write it, without a packet built.
            let _ = codec::encode_ack(ack, reason, version, client_max, &mut self.buf);
            return;
        }
        let last_word = match &out {
            Outbound::Disconnect { .. } => true,
            Outbound::ConnAck { reason, .. } => reason.is_error(),
            _ => false,
        };
        self.finished |= last_word;
        let Some(packet) = to_packet(out, v5) else {
            return;
        };
        self.said |= last_word;
        // Too large for the client even without its diagnostics: not
        // sent (MQTT-3.1.2-25).
        let _ = codec::encode_within(&packet, version, client_max, &mut self.buf);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A copied delivery is byte for byte what encoding it for itself
    /// writes, whatever its flags, identifier and topic length (a
    /// remaining length of one byte and of two).
    #[test]
    fn a_copied_delivery_is_the_bytes_of_one_encoded_for_itself() {
        let mut properties = codec::PublishProperties::default();
        properties
            .user_properties
            .push(("saguin-offset".into(), "42".into()));
        for topic_len in [1, 200] {
            let message = Message {
                topic: codec::ByteStr::from("t".repeat(topic_len)),
                payload: bytes::Bytes::from_static(b"payload"),
                qos: 2,
                retain: true,
                properties: properties.clone().into(),
                received_at: tokio::time::Instant::now(),
                channel_offset: None,
                wire: Default::default(),
            };
            // The same record's message with its offset kept as a number.
            let numbered = Message {
                properties: Default::default(),
                channel_offset: std::num::NonZeroU64::new(42),
                wire: Default::default(),
                ..message.clone()
            };
            {
                let version = ProtocolVersion::V5;
                for (q, packet_id, dup, retain) in [
                    (0, 0, false, false),
                    (1, 7, false, true),
                    (2, 65535, true, false),
                    (1, 300, true, true),
                ] {
                    let delivery = Delivery {
                        dup,
                        qos: qos(q),
                        retain,
                        packet_id,
                        message: &message,
                        subscription_ids: &[],
                        expiry: None,
                    };
                    // Twice: encoded the first time, copied the second.
                    for _ in 0..2 {
                        let mut copied = BytesMut::new();
                        assert!(copy_delivery(&delivery, version, u32::MAX, &mut copied));
                        let mut own = BytesMut::new();
                        let publish = codec::PublishRef {
                            dup,
                            qos: qos(q),
                            retain,
                            topic: &message.topic,
                            packet_id,
                            properties: &message.properties,
                            message_expiry_interval: None,
                            topic_alias: None,
                            subscription_ids: &[],
                            extra_user_property: None,
                            payload: &message.payload,
                        };
                        codec::encode_publish(&publish, version, u32::MAX, &mut own).unwrap();
                        assert_eq!(copied, own, "QoS {q} topic {topic_len}");
                        // The offset kept as a number is written where the
                        // property was, copied or encoded for itself.
                        let numbered_delivery = Delivery {
                            message: &numbered,
                            ..delivery
                        };
                        let mut from_number = BytesMut::new();
                        assert!(copy_delivery(
                            &numbered_delivery,
                            version,
                            u32::MAX,
                            &mut from_number
                        ));
                        assert_eq!(from_number, own, "QoS {q} topic {topic_len}");
                        let expiring = |d: Delivery<'_>| {
                            let mut buf = BytesMut::new();
                            let d = Delivery {
                                expiry: Some(9),
                                ..d
                            };
                            assert!(write_delivery(
                                &d,
                                version,
                                u32::MAX,
                                None,
                                &mut buf,
                                &mut Lazy::default()
                            ));
                            buf
                        };
                        assert_eq!(expiring(numbered_delivery), expiring(delivery));
                    }
                }
            }
        }
    }

    #[test]
    fn a_copied_delivery_too_large_for_the_client_is_not_written() {
        let message = qos1_message("telemetry/a", bytes::Bytes::from(vec![0u8; 100]));
        let delivery = Delivery {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            packet_id: 1,
            message: &message,
            subscription_ids: &[],
            expiry: None,
        };
        let mut buf = BytesMut::new();
        assert!(!copy_delivery(
            &delivery,
            ProtocolVersion::V311,
            64,
            &mut buf
        ));
        assert!(buf.is_empty());
        assert!(copy_delivery(
            &delivery,
            ProtocolVersion::V311,
            1024,
            &mut buf
        ));
    }

    /// A read of a socket with nothing to say holds nothing; what a read
    /// brings is kept only while it is the start of a packet.
    #[tokio::test]
    async fn unread_bytes_are_kept_only_while_a_packet_is_partial() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let mut unread = BytesMut::new();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(poll_read_into(&mut server, &mut cx, &mut unread).is_pending());
        assert_eq!(unread.capacity(), 0, "a quiet socket's read holds nothing");

        let mut decoder = FrameDecoder::server(1 << 20);
        // A CONNECT and the first two bytes of a PINGREQ.
        let mut bytes = BytesMut::new();
        codec::encode(&connect_packet(60), ProtocolVersion::V311, &mut bytes).unwrap();
        bytes.extend_from_slice(&[0xC0]);
        client.write_all(&bytes).await.unwrap();
        let n = poll_fn(|cx| poll_read_into(&mut server, cx, &mut unread))
            .await
            .unwrap();
        assert_eq!(n, bytes.len());
        assert!(matches!(
            decoder.decode(&mut unread),
            Ok(Some(Packet::Connect(_)))
        ));
        assert!(matches!(decoder.decode(&mut unread), Ok(None)));
        give_back_if_empty(&mut unread);
        assert_eq!(&unread[..], &[0xC0], "a partial packet is kept");

        client.write_all(&[0x00]).await.unwrap();
        poll_fn(|cx| poll_read_into(&mut server, cx, &mut unread))
            .await
            .unwrap();
        assert!(matches!(
            decoder.decode(&mut unread),
            Ok(Some(Packet::PingReq))
        ));
        give_back_if_empty(&mut unread);
        assert_eq!(unread.capacity(), 0, "nothing is held once it is decoded");
    }

    /// The writer takes at most a batch at a time, and once its queue is
    /// drained keeps no more than [`WRITE_KEEP`] of its buffer.
    #[tokio::test]
    async fn a_writer_keeps_a_small_buffer_once_its_queue_is_drained() {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        let (tx, rx) = link::link();
        let mut out = Outgoing::new(rx, ProtocolVersion::V311, 1 << 20, None);
        let link = out.link.link();
        let context = test_context();
        // 14 bytes each: a batch of them outgrows what is kept.
        let suback = || Outbound::SubAck {
            packet_id: 1,
            reasons: vec![ReasonCode::Success; 10],
            reason_string: None,
        };
        for _ in 0..WRITE_BATCH + 1 {
            tx.send(suback()).unwrap();
        }
        let first = poll_fn(|cx| out.poll_write(cx, &mut server)).await;
        assert_eq!(first, Written::Batch);
        assert_eq!(out.batch_written(&context), (None, false));
        assert_eq!(link.written.load(Relaxed) as usize, WRITE_BATCH);
        assert!(
            out.buf.capacity() > WRITE_KEEP,
            "kept while one more packet waits"
        );
        let second = poll_fn(|cx| out.poll_write(cx, &mut server)).await;
        assert_eq!(second, Written::Batch);
        out.batch_written(&context);
        assert_eq!(link.written.load(Relaxed) as usize, WRITE_BATCH + 1);
        assert_eq!(
            out.buf.capacity(),
            0,
            "a batch's large buffer is given back"
        );
        tx.send(Outbound::PingResp).unwrap();
        let third = poll_fn(|cx| out.poll_write(cx, &mut server)).await;
        assert_eq!(third, Written::Batch);
        out.batch_written(&context);
        assert!(
            (1..=WRITE_KEEP).contains(&out.buf.capacity()),
            "a small one is kept for the next batch"
        );
        let mut received = vec![0u8; 14 * (WRITE_BATCH + 1) + 2];
        client.read_exact(&mut received).await.unwrap();
        let (subacks, pingresp) = received.split_at(14 * (WRITE_BATCH + 1));
        assert!(subacks.chunks(14).all(|p| p[..4] == [0x90, 12, 0, 1]));
        assert_eq!(pingresp, [0xD0, 0x00]);
        drop(tx);
        let closed = poll_fn(|cx| out.poll_write(cx, &mut server)).await;
        assert_eq!(closed, Written::QueueClosed);
    }

    /// Large payloads are written from their messages beside their
    /// encoded headers, more of them in a batch than one write takes and
    /// through a socket that takes a few KiB at a time: the client reads
    /// every packet byte for byte as encoded whole, in order, and the bytes
    /// are counted as sent.
    #[tokio::test]
    async fn large_payloads_are_written_from_their_messages_byte_for_byte() {
        for version in [ProtocolVersion::V311, ProtocolVersion::V5] {
            let (mut client, mut server) = tokio::io::duplex(5_000);
            let (tx, rx) = link::link();
            let mut out = Outgoing::new(rx, version, 1 << 20, None);
            let context = test_context();
            let mut expected = BytesMut::new();
            for i in 0..SPLICED_PARTS + 5 {
                // Large and small payloads, and an acknowledgement, in turn.
                let len = if i % 3 == 2 {
                    64
                } else {
                    SPLICE_MIN + i * 1_000
                };
                let payload: Vec<u8> = (0..len).map(|b| (b % 251) as u8).collect();
                let message = Arc::new(qos1_message(
                    &format!("large/{i}"),
                    bytes::Bytes::from(payload.clone()),
                ));
                let packet_id = i as u16 + 1;
                tx.send(Outbound::Publish {
                    packet_id,
                    qos: 1,
                    retain: false,
                    dup: false,
                    message,
                    subscription_ids: Vec::new(),
                    expiry: None,
                    sys: false,
                })
                .unwrap();
                tx.send(Outbound::PubAck {
                    packet_id,
                    reason: ReasonCode::Success,
                })
                .unwrap();
                let publish = Packet::Publish(Publish {
                    dup: false,
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    topic: format!("large/{i}").into(),
                    packet_id,
                    properties: Default::default(),
                    payload: bytes::Bytes::from(payload),
                });
                codec::encode(&publish, version, &mut expected).unwrap();
                codec::encode(
                    &Packet::PubAck(PubAck::new(packet_id)),
                    version,
                    &mut expected,
                )
                .unwrap();
            }
            let reader = tokio::spawn(async move {
                let mut received = vec![0u8; expected.len()];
                client.read_exact(&mut received).await.unwrap();
                (received, expected)
            });
            let mut sent = 0;
            while out.link.queued() > 0 || !out.pending.is_empty() {
                assert_eq!(
                    poll_fn(|cx| out.poll_write(cx, &mut server)).await,
                    Written::Batch
                );
                sent += out.batch_len();
                out.batch_written(&context);
            }
            let (received, expected) = tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("the client reads every byte it is owed")
                .unwrap();
            assert!(received == expected[..], "{version:?}: the bytes differ");
            assert_eq!(sent, expected.len());
            assert_eq!(
                context.metrics.bytes_sent.load(Relaxed) as usize,
                expected.len()
            );
        }
    }

    /// A QoS 1 message on `topic`, not retained, without properties.
    fn qos1_message(topic: &str, payload: bytes::Bytes) -> Message {
        Message {
            topic: codec::ByteStr::from(topic),
            payload,
            qos: 1,
            retain: false,
            properties: Default::default(),
            received_at: tokio::time::Instant::now(),
            channel_offset: None,
            wire: Default::default(),
        }
    }

    fn connect_packet(keep_alive: u16) -> Packet {
        Packet::Connect(Connect {
            protocol: ProtocolVersion::V311,
            clean_start: true,
            keep_alive,
            client_id: "ka".into(),
            will: None,
            username: None,
            password: None,
            properties: Default::default(),
        })
    }

    /// An anonymous connection's context with the defaults the tests
    /// share, its events going nowhere.
    pub(in crate::broker) fn test_context() -> Arc<ConnectionContext> {
        test_context_with(mpsc::channel(1).0)
    }

    /// [`test_context`], its events sent to `events`.
    fn test_context_with(events: mpsc::Sender<Event>) -> Arc<ConnectionContext> {
        Arc::new(ConnectionContext {
            max_packet_size: 1 << 20,
            topic_alias_maximum: 0,
            allow_anonymous: true,
            passwords: None,
            password_checks: PasswordChecks::one_a_cpu(),
            metrics: Arc::new(Metrics::new()),
            outbound_queue: 16,
            max_keep_alive: 0,
            topic_aliases: false,
            keep_alives: KeepAliveTimer::start(),
            parking: Lot::start(Arc::new(Metrics::new())),
            events,
        })
    }

    /// A connection served over an in-memory pipe, with the test as the
    /// broker's state: it reads the events and holds the handle.
    struct Served {
        client: tokio::io::DuplexStream,
        events: mpsc::Receiver<Event>,
        _shutdown: broadcast::Sender<()>,
        _handle: Option<crate::broker::state::ConnectionHandle>,
    }

    impl Served {
        async fn connect(keep_alive: u16) -> Served {
            Served::connect_over(keep_alive, 64 * 1024).await
        }

        /// Over a pipe that holds `capacity` bytes each way.
        async fn connect_over(keep_alive: u16, capacity: usize) -> Served {
            let (client, server) = tokio::io::duplex(capacity);
            let (events_tx, events) = mpsc::channel(16);
            let (shutdown, shutdown_rx) = broadcast::channel(1);
            let context = test_context_with(events_tx);
            tokio::spawn(serve(
                Box::new(Handshake {
                    stream: server,
                    peer: "127.0.0.1:1".parse().unwrap(),
                    id: 1,
                    deadline: Instant::now() + Duration::from_secs(60),
                    context,
                    shutdown: shutdown_rx,
                    admission: Admission::Serve,
                }),
                crate::broker::places::tests::held(),
            ));
            let mut served = Served {
                client,
                events,
                _shutdown: shutdown,
                _handle: None,
            };
            served.send(connect_packet(keep_alive)).await;
            match served.events.recv().await {
                Some(Event::Connect { handle, .. }) => served._handle = Some(handle),
                _ => panic!("expected the Connect event"),
            }
            served
        }

        async fn send(&mut self, packet: Packet) {
            let mut buf = BytesMut::new();
            codec::encode(&packet, ProtocolVersion::V311, &mut buf).unwrap();
            self.client.write_all(&buf).await.unwrap();
        }

        /// The next event that is not a batch of packets, and when (on the
        /// paused clock) it came.
        async fn closed(&mut self) -> (CloseReason, Instant) {
            loop {
                match self.events.recv().await {
                    Some(Event::Closed { reason, .. }) => return (reason, Instant::now()),
                    Some(Event::Packets { .. }) => continue,
                    _ => panic!("expected the Closed event"),
                }
            }
        }
    }

    /// A PUBLISH of a topic alias, MQTT 5, QoS 0.
    fn aliased(alias: u16, topic: &str) -> Packet {
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: topic.into(),
            packet_id: 0,
            properties: codec::PublishProperties {
                topic_alias: Some(alias),
                ..Default::default()
            },
            payload: bytes::Bytes::from_static(b"x"),
        })
    }

    fn topic_of(inbound: Option<Inbound>) -> String {
        match inbound {
            Some(Inbound::Publish(publish)) => publish.topic.to_string(),
            _ => panic!("expected a PUBLISH"),
        }
    }

    /// A connection's topic aliases live in its rare part, made by the
    /// first alias set and kept from then on: a wait for the state's queue
    /// that ends lets the rest of that part go, and not them.
    #[test]
    fn topic_aliases_are_made_when_set_and_kept() {
        let mut rare = None;
        let first = adapt(aliased(3, "site/a"), 4, &mut rare).unwrap();
        assert_eq!(topic_of(first), "site/a");
        assert!(rare.as_ref().is_some_and(|r| r.is_held()));
        let again = adapt(aliased(3, ""), 4, &mut rare).unwrap();
        assert_eq!(topic_of(again), "site/a");
        assert!(matches!(
            adapt(aliased(5, "site/b"), 4, &mut rare),
            Err(ReasonCode::TopicAliasInvalid)
        ));
        assert!(matches!(
            adapt(aliased(2, ""), 4, &mut rare),
            Err(ReasonCode::TopicAliasInvalid)
        ));
        // A client that sets none holds no rare part for them.
        let mut none = None;
        adapt(Packet::PingReq, 4, &mut none).unwrap();
        assert!(none.is_none());
        assert!(!Rare::default().is_held());
    }

    /// Every packet queued for a writer takes the room of the largest kind
    /// of packet: what is rare (a CONNACK's extras, AUTH data) is boxed so
    /// that a delivery does not pay for it.
    #[test]
    fn a_queued_packet_is_no_larger_than_a_delivery() {
        assert!(std::mem::size_of::<Outbound>() <= 48);
    }

    // The clock is paused: it moves only by `advance`, or, when every task
    // waits, straight to the next timer. So the instant a Closed event
    // arrives is the instant the reader's keep alive timer fired.

    /// MQTT-3.1.2-24: no packet within 1.5 x Keep Alive closes the
    /// connection, exactly then.
    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_closed_at_one_and_a_half_times_keep_alive() {
        let mut c = Served::connect(2).await;
        let connected = Instant::now();
        let (reason, at) = c.closed().await;
        assert!(matches!(reason, CloseReason::KeepAlive));
        assert_eq!(at - connected, Duration::from_secs(3));
    }

    /// Any packet (here PINGREQ) restarts the keep alive period.
    #[tokio::test(start_paused = true)]
    async fn each_packet_restarts_the_keep_alive_period() {
        let mut c = Served::connect(1).await;
        for _ in 0..3 {
            tokio::time::advance(Duration::from_millis(1400)).await;
            c.send(Packet::PingReq).await;
            match c.events.recv().await {
                Some(Event::Packets { packets, .. }) => {
                    assert!(matches!(packets[..], [Inbound::PingReq]))
                }
                _ => panic!("expected the PINGREQ"),
            }
        }
        let last_ping = Instant::now();
        let (reason, at) = c.closed().await;
        assert!(matches!(reason, CloseReason::KeepAlive));
        assert_eq!(at - last_ping, Duration::from_millis(1500));
    }

    /// Queue more than the pipe of [`Served::connect_over`]`(_, 64)`
    /// holds: the writer waits for the client to read. A SUBACK of 200
    /// reasons, packet id 7.
    fn stall_the_writer(handle: &crate::broker::state::ConnectionHandle) {
        let reasons = vec![ReasonCode::GrantedQoS1; 200];
        handle
            .send(Outbound::SubAck {
                packet_id: 7,
                reasons,
                reason_string: None,
            })
            .unwrap();
    }

    /// A client silent and not reading what it is sent is closed at its
    /// limit all the same: the writer waits on the socket, not the queue,
    /// and the keep-alive timer still wakes the task.
    #[tokio::test(start_paused = true)]
    async fn a_silent_client_that_leaves_a_write_unread_is_closed_at_its_limit() {
        let mut c = Served::connect_over(2, 64).await;
        let connected = Instant::now();
        let handle = c._handle.take().unwrap();
        stall_the_writer(&handle);
        let (reason, at) = tokio::time::timeout(Duration::from_secs(10), c.closed())
            .await
            .expect("the silent client is never closed");
        assert!(matches!(reason, CloseReason::KeepAlive));
        assert_eq!(at - connected, Duration::from_secs(3));
        c._handle = Some(handle);
    }

    /// A client that sends without reading what it is sent is still read:
    /// a write the socket does not take does not stop the reads.
    #[tokio::test]
    async fn a_connection_reads_while_its_client_leaves_a_write_unread() {
        let mut c = Served::connect_over(0, 64).await;
        let handle = c._handle.take().unwrap();
        stall_the_writer(&handle);
        c.send(Packet::PingReq).await;
        match c.events.recv().await {
            Some(Event::Packets { packets, .. }) => {
                assert!(matches!(packets[..], [Inbound::PingReq]))
            }
            _ => panic!("expected the PINGREQ"),
        }
        // The client reads at last, and the whole SUBACK arrives.
        // Fixed header (remaining length 202 in two bytes), packet id, reasons.
        let mut suback = vec![0u8; 1 + 2 + 2 + 200];
        c.client.read_exact(&mut suback).await.unwrap();
        assert_eq!(&suback[..5], &[0x90, 0xCA, 0x01, 0x00, 0x07]);
        assert!(suback[5..].iter().all(|r| *r == 0x01));
        c._handle = Some(handle);
    }

    /// What a parked connection holds of its own, beside its link and the
    /// state's entries: everything else its task had (the task, its boxed
    /// state, the runtime's registration of its socket, the read order's
    /// stamp: about 720 B) is freed while it is parked. Its place under
    /// the cap is held inline, not boxed, and the broker task's queue is
    /// the context's: 96 B, the allocator's class below 112.
    #[test]
    fn a_parked_connection_stays_small() {
        assert!(
            std::mem::size_of::<Parked>() <= 96,
            "a parked connection holds {} bytes",
            std::mem::size_of::<Parked>()
        );
    }

    /// What an idle connection holds for its whole life is one task: its
    /// future (the handshake is boxed and gone, and so is what closing
    /// takes) is a pointer to the connection and its place under the cap.
    /// Multiplied by every connection a broker holds, a task that grows by
    /// a kilobyte costs an edge site's 50,000 devices 50 MB. tokio lays a
    /// task out as 96 bytes of its own around a stage that holds the future
    /// or its result (a `JoinError`, 24 bytes) and aligns it to 128: at
    /// 24 bytes the future keeps the stage at 32 and the task at 128, the
    /// allocator's block (an async fn's future of 72 bytes made a task of
    /// 208, in a 256-byte block).
    #[tokio::test]
    async fn an_idle_connections_task_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        let (_shutdown, shutdown_rx) = broadcast::channel(1);
        let task = serve(
            Box::new(Handshake {
                stream: server,
                peer,
                id: 1,
                deadline: Instant::now(),
                context: test_context(),
                shutdown: shutdown_rx,
                admission: Admission::Serve,
            }),
            crate::broker::places::tests::held(),
        );
        assert!(
            std::mem::size_of_val(&task) <= 24,
            "the connection's task holds {} bytes",
            std::mem::size_of_val(&task)
        );
        // tokio's stage: the future, or its result, laid out as tokio
        // lays it out (`repr(C)`).
        #[allow(dead_code)]
        #[repr(C)]
        enum Stage<T: Future> {
            Running(T),
            Finished(Result<T::Output, tokio::task::JoinError>),
            Consumed,
        }
        fn stage_of<T: Future>(_: &T) -> usize {
            std::mem::size_of::<Stage<T>>()
        }
        assert!(stage_of(&task) <= 32, "a stage of {}", stage_of(&task));
        // What the task keeps in a box of its own once connected.
        // Its fields beside the transport, whose size tokio's build decides
        // (32 B in release, 40 in debug): 256 B in all, the allocator's
        // class below 320, in release.
        let connection = std::mem::size_of::<Connection<tokio::net::TcpStream>>();
        let transport = std::mem::size_of::<tokio::net::TcpStream>();
        assert!(
            connection - transport <= 256 - 32,
            "the connection is {connection} bytes, {transport} of them its transport"
        );
    }
}
