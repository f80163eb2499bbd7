//! One client connection: the reader (bounded frame decoder → protocol
//! adapter → broker event queue) and the writer (bounded outbound queue →
//! encoder → batched socket writes). TCP and TLS go through the same code:
//! anything `AsyncRead + AsyncWrite`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use super::alias::{AliasUse, OutboundAliases};
use super::auth::scram;
use super::auth_files::Reloadable;
use super::codec::{
    self, AckProperties, ByteStr, ConnAck, ConnAckProperties, Connect, DecodeError, Disconnect,
    DisconnectProperties, FrameDecoder, Packet, ProtocolVersion, PubAck, Publish, QoS, ReasonCode,
    SubAck, UnsubAck,
};
use super::message::Message;
use super::message::WireForm;
use super::metrics::{CloseReason, Metrics};
use super::state::{
    ConnAckExtras, ConnectRequest, ConnectionHandle, Event, Inbound, InboundPublish, KeepAlive,
    Outbound, WillRequest,
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
    pub metrics: Arc<Metrics>,
    /// Packets a connection's writer may have queued before the state
    /// pauses its reader and drops QoS 0 to it.
    pub outbound_queue: usize,
    /// `limits.max_keep_alive` (0: the client's own keep alive).
    pub max_keep_alive: u16,
    /// `broker.topic_aliases`: outbound topic aliases towards MQTT 5
    /// clients that announce a Topic Alias Maximum.
    pub topic_aliases: bool,
}

/// The most bytes asked of the socket per read (a busy publisher's).
const READ_CHUNK: usize = 16 * 1024;
/// The least: what a quiet connection's pending read holds.
const READ_MIN: usize = 512;
/// What an idle connection's writer keeps of its write buffer.
const WRITE_KEEP: usize = 1024;
/// The most packets a read's batch is given room for before it is filled.
const BATCH_HINT_MAX: usize = 256;
/// Packets taken from the outbound queue per socket write.
const WRITE_BATCH: usize = 256;
/// How long a closing connection waits for its writer to flush.
const WRITER_GRACE: Duration = Duration::from_secs(5);
/// After the broker's last packet (a DISCONNECT or a refusing CONNACK) and
/// the shutdown of the write side, the client's bytes are read and dropped
/// before the socket closes: closing with unread input makes the kernel
/// send a reset, which discards what it has not sent yet and, at the
/// client, what the client has not read yet - the reason code among it.
/// The linger ends when the client closes its side (it read the reason),
/// after [`LINGER_TIME`], or after [`LINGER_BYTES`].
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// A connection's unread bytes, and how much room its next read gets.
/// The room doubles while reads fill it, up to [`READ_CHUNK`] (a busy publisher reads 16 KiB a call),
/// halves while they bring a quarter of it or less, down to [`READ_MIN`],
/// and a buffer with nothing left in it that is larger than twice that is
/// given back: most of a broker's connections are quiet, and what each
/// holds while its read waits is multiplied by all of them.
#[derive(Debug)]
struct ReadRoom {
    buf: BytesMut,
    want: usize,
    /// The spare room the pending read was given.
    given: usize,
}

impl ReadRoom {
    fn new() -> ReadRoom {
        ReadRoom {
            buf: BytesMut::new(),
            want: READ_MIN,
            given: 0,
        }
    }

    /// Ready the buffer for the next read and lend it.
    fn prepare(&mut self) -> &mut BytesMut {
        let buf = &mut self.buf;
        if buf.is_empty() && buf.capacity() > 2 * self.want {
            *buf = BytesMut::new();
        }
        if buf.capacity() - buf.len() < self.want {
            buf.reserve(self.want);
        }
        self.given = buf.capacity() - buf.len();
        buf
    }

    /// The read brought `n` bytes.
    fn read(&mut self, n: usize) {
        if n >= self.given {
            self.want = (self.want * 2).min(READ_CHUNK);
        } else if n <= self.want / 4 {
            self.want = (self.want / 2).max(READ_MIN);
        }
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
    room: &mut ReadRoom,
    decoder: &mut FrameDecoder,
    metrics: &Metrics,
) -> Result<Packet, ReadFailure> {
    loop {
        match decoder.decode(&mut room.buf) {
            Ok(Some(packet)) => return Ok(packet),
            Ok(None) => {}
            Err(err) => return Err(ReadFailure::Decode(err)),
        }
        match rd.read_buf(room.prepare()).await {
            Ok(0) => return Err(ReadFailure::Eof),
            Ok(n) => {
                room.read(n);
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

/// Serve one transport from its first byte to its close.
#[allow(clippy::too_many_arguments)]
pub async fn serve<S>(
    stream: S,
    peer: SocketAddr,
    id: u64,
    deadline: Instant,
    events: mpsc::Sender<Event>,
    context: Arc<ConnectionContext>,
    shutdown: broadcast::Receiver<()>,
    admission: Admission,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Boxed and gone once the CONNECT is handed on: what the handshake
    // holds while it waits (the CONNECT, an authentication, a refusal's
    // linger) would otherwise size every connection's task for its whole
    // life, and most of a broker's connections are idle.
    let established = Box::pin(establish(
        stream, peer, id, deadline, &events, &context, shutdown, admission,
    ))
    .await;
    if let Some(established) = established {
        read_loop(established, peer, id, events, context.metrics.clone()).await;
    }
}

/// What a connection keeps once its CONNECT was handed to the state.
struct Established<S> {
    rd: tokio::io::ReadHalf<super::read_order::Stamped<S>>,
    /// Where this connection's reads stand among every connection's.
    read_order: super::read_order::ReadOrder,
    room: ReadRoom,
    decoder: FrameDecoder,
    client_id: String,
    /// How long the connection may be silent.
    keep_alive: Option<Duration>,
    aliases: InboundAliases,
    reauth: Reauthentication,
    /// Where re-authentication answers are queued, and their count.
    reauth_out: (mpsc::WeakUnboundedSender<Outbound>, Arc<AtomicUsize>),
    kill_rx: watch::Receiver<bool>,
    pause_rx: watch::Receiver<bool>,
    writer: tokio::task::JoinHandle<Farewell>,
}

/// From the first byte to the CONNECT handed to the state: `None` when the
/// connection ended (refused, malformed, timed out) before that.
#[allow(clippy::too_many_arguments)]
async fn establish<S>(
    stream: S,
    peer: SocketAddr,
    id: u64,
    deadline: Instant,
    events: &mpsc::Sender<Event>,
    context: &ConnectionContext,
    mut shutdown: broadcast::Receiver<()>,
    admission: Admission,
) -> Option<Established<S>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let metrics = context.metrics.clone();
    // Reads stamped in the order the sockets became readable: the state
    // takes packets that arrived together in that order.
    let (stream, read_order) = super::read_order::Stamped::new(stream);
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut room = ReadRoom::new();
    let mut decoder = FrameDecoder::server(context.max_packet_size);

    let first = tokio::select! {
        _ = shutdown.recv() => return None,
        first = tokio::time::timeout_at(deadline, read_packet(&mut rd, &mut room, &mut decoder, &metrics)) => first,
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
                write_once(&mut wr, &ack, ProtocolVersion::V311, &metrics).await;
                linger(&mut rd).await;
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
        refuse_connect(
            &mut rd,
            &mut wr,
            ReasonCode::QuotaExceeded,
            version,
            &metrics,
        )
        .await;
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
        refuse_logged(&mut rd, &mut wr, &metrics, peer, &connect, code, &why).await;
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
                    &mut rd,
                    &mut wr,
                    &mut room,
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
        _ => authenticate(context, &connect).await,
    };
    let principal = match authenticated {
        Ok(principal) => principal,
        Err(code) => {
            let why = "authentication failed";
            refuse_logged(&mut rd, &mut wr, &metrics, peer, &connect, code, why).await;
            return None;
        }
    };

    let reauth_as = authentication
        .is_some()
        .then(|| principal.clone())
        .flatten();
    let mut request = connect_request(&connect, principal);
    request.authentication = authentication;
    let client_max = request
        .maximum_packet_size
        .unwrap_or(codec::PROTOCOL_MAX_PACKET_SIZE);
    // This connection's own table: a reconnect starts with none.
    let aliases = if context.topic_aliases && version == ProtocolVersion::V5 {
        OutboundAliases::new(connect.properties.topic_alias_maximum.unwrap_or(0))
    } else {
        None
    };
    let (outbound_tx, outbound_rx) = mpsc::unbounded_channel();
    let (kill_tx, kill_rx) = watch::channel(false);
    let (pause_tx, pause_rx) = watch::channel(false);
    let written = Arc::new(AtomicUsize::new(0));
    let foreign = Arc::new(AtomicUsize::new(0));
    let want_drained = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(writer(
        wr,
        outbound_rx,
        kill_tx.clone(),
        kill_tx.subscribe(),
        version,
        client_max,
        aliases,
        metrics.clone(),
        WriterFlow {
            id,
            written: written.clone(),
            want_drained: want_drained.clone(),
            low_water: (context.outbound_queue / 2).max(1),
            events: events.clone(),
        },
    ));
    // Re-authentication answers leave through the same queue; a weak
    // sender, so the state alone still decides when the queue ends.
    let reauth_out = (outbound_tx.downgrade(), foreign.clone());
    let handle = ConnectionHandle {
        outbound: outbound_tx,
        written,
        foreign,
        kill: kill_tx,
        pause: pause_tx,
        want_drained,
    };
    let client_id = connect.client_id.clone();
    tracing::debug!(peer = %peer, client_id = %client_id, protocol = %version, "connected");
    if events
        .send(Event::Connect {
            connection: id,
            request: Box::new(request),
            handle,
        })
        .await
        .is_err()
    {
        writer.abort();
        return None;
    }
    read_order.handed_on();

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
    // One and a half times the keep alive without a packet (MQTT-3.1.2-24).
    let keep_alive = (held > 0).then(|| Duration::from_millis(u64::from(held) * 1500));
    Some(Established {
        rd,
        read_order,
        room,
        decoder,
        client_id,
        keep_alive,
        aliases: InboundAliases::new(context.topic_alias_maximum),
        reauth: Reauthentication {
            user: reauth_as,
            passwords: context.passwords.as_ref().map(|p| p.current()),
            pending: None,
        },
        reauth_out,
        kill_rx,
        pause_rx,
        writer,
    })
}

/// Read packets and hand them to the state until the connection ends.
async fn read_loop<S>(
    mut conn: Established<S>,
    peer: SocketAddr,
    id: u64,
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Room for as many packets as the last read brought (up to a bound):
    // a batch grown one doubling at a time copies its packets each time.
    let mut batch_hint = 1;
    let (close_reason, close_code, detail) = 'read: loop {
        let mut batch = Vec::new();
        let mut fatal = None;
        loop {
            // A subscriber's PUBACK (PUBREC, PUBREL, PUBCOMP) in its short
            // form goes to the state without a packet built for it.
            if let Some(ack) = conn.decoder.decode_short_ack(&mut conn.room.buf) {
                if batch.capacity() == 0 {
                    // A subscriber's read is its acknowledgements, four
                    // bytes each: conn.room for as many as the bytes can hold.
                    let acks = (conn.room.buf.len() / 4 + 1).min(BATCH_HINT_MAX);
                    batch.reserve_exact(batch_hint.max(acks));
                }
                batch.push(short_ack(ack));
                continue;
            }
            match conn.decoder.decode(&mut conn.room.buf) {
                Ok(Some(Packet::Auth(auth))) => match conn.reauth.step(auth) {
                    Ok(reply) => {
                        if let Some(out) = conn.reauth_out.0.upgrade() {
                            if out.send(reply).is_ok() {
                                conn.reauth_out.1.fetch_add(1, Relaxed);
                            }
                        }
                    }
                    Err(code) => {
                        tracing::info!(peer = %peer, client_id = %conn.client_id, reason = %format!("0x{:02X}", code.as_u8()), "re-authentication failed");
                        fatal = Some((CloseReason::Protocol, Some(code), String::new()));
                        break;
                    }
                },
                Ok(Some(packet)) => match adapt(packet, &mut conn.aliases) {
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
                },
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
        if !batch.is_empty() {
            batch_hint = batch.len().min(BATCH_HINT_MAX);
        }
        if !batch.is_empty()
            && events
                .send(Event::Packets {
                    connection: id,
                    packets: batch,
                    read_order: conn.read_order.last(),
                })
                .await
                .is_err()
        {
            break 'read (CloseReason::Shutdown, None, String::new());
        }
        conn.read_order.handed_on();
        if let Some(fatal) = fatal {
            break 'read fatal;
        }
        // Paused by the state (the client does not read what it is sent,
        // or its packets wait behind a write): its bytes wait in the socket.
        if *conn.pause_rx.borrow() {
            // Not read until the state resumes it: nobody waits for it.
            conn.read_order.set_aside();
        }
        while *conn.pause_rx.borrow_and_update() {
            tokio::select! {
                biased;
                _ = conn.kill_rx.changed() => break 'read (CloseReason::Network, None, String::new()),
                changed = conn.pause_rx.changed() => if changed.is_err() {
                    break 'read (CloseReason::Shutdown, None, String::new());
                },
            }
        }
        let buf = conn.room.prepare();
        let read = async {
            match conn.keep_alive {
                Some(limit) => tokio::time::timeout(limit, conn.rd.read_buf(buf)).await,
                None => Ok(conn.rd.read_buf(buf).await),
            }
        };
        tokio::select! {
            biased;
            _ = conn.kill_rx.changed() => break 'read (CloseReason::Network, None, String::new()),
            read = read => match read {
                Ok(Ok(0)) => break 'read (CloseReason::Network, None, "closed by peer".into()),
                Ok(Ok(n)) => {
                    conn.room.read(n);
                    metrics.bytes_received.fetch_add(n as u64, Relaxed);
                }
                Ok(Err(err)) => break 'read (CloseReason::Network, None, err.to_string()),
                Err(_) => break 'read (CloseReason::KeepAlive, Some(ReasonCode::KeepAliveTimeout), String::new()),
            },
        }
    };
    // Boxed: held only while closing, not in every idle connection's task.
    Box::pin(close(
        conn,
        peer,
        id,
        events,
        (close_reason, close_code, detail),
    ))
    .await;
}

/// Tell the state the connection ended, and let the writer say its last
/// word.
async fn close<S>(
    mut conn: Established<S>,
    peer: SocketAddr,
    id: u64,
    events: mpsc::Sender<Event>,
    (close_reason, close_code, detail): (CloseReason, Option<ReasonCode>, String),
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if !matches!(close_reason, CloseReason::Network) || !detail.is_empty() {
        tracing::debug!(peer = %peer, client_id = %conn.client_id, reason = close_reason.label(), detail = %detail, "connection closing");
    }
    if matches!(
        close_reason,
        CloseReason::Malformed | CloseReason::Protocol | CloseReason::PacketTooLarge
    ) {
        tracing::info!(peer = %peer, client_id = %conn.client_id, reason = close_reason.label(), error = %detail, "connection closed");
    }
    let _ = events
        .send(Event::Closed {
            connection: id,
            reason: close_reason,
            disconnect_reason: close_code,
        })
        .await;
    // The state drops the outbound queue's sender; the writer flushes what
    // is queued (a DISCONNECT with the reason, say) and ends.
    match tokio::time::timeout(WRITER_GRACE, &mut conn.writer).await {
        Ok(Ok(Farewell::Said)) => linger(&mut conn.rd).await,
        Ok(_) => {}
        Err(_) => conn.writer.abort(),
    }
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
async fn refuse_logged<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    rd: &mut R,
    wr: &mut W,
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
    refuse_connect(rd, wr, code, connect.protocol, metrics).await;
}

/// Answer a refused CONNECT and let the client read it before the close.
async fn refuse_connect<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    rd: &mut R,
    wr: &mut W,
    code: ReasonCode,
    version: ProtocolVersion,
    metrics: &Metrics,
) {
    let ack = connack(code, false, ConnAckProperties::default());
    write_once(wr, &ack, version, metrics).await;
    linger(rd).await;
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
    /// The SCRAM user of the CONNECT; `None`: no enhanced authentication.
    user: Option<Arc<str>>,
    passwords: Option<Arc<PasswordFile>>,
    pending: Option<scram::ScramServer>,
}

impl Reauthentication {
    /// The AUTH to send for `auth`, or the DISCONNECT reason.
    fn step(&mut self, auth: codec::Auth) -> Result<Outbound, ReasonCode> {
        let (Some(user), Some(passwords)) = (&self.user, &self.passwords) else {
            // AUTH without enhanced authentication in CONNECT (MQTT-4.12.0-6).
            return Err(ReasonCode::ProtocolError);
        };
        if auth.properties.authentication_method.as_deref() != Some(scram::SCRAM_SHA_512) {
            return Err(ReasonCode::ProtocolError);
        }
        let data = auth.properties.authentication_data.unwrap_or_default();
        match (auth.reason, self.pending.take()) {
            (ReasonCode::ReAuthenticate, None) => {
                let nonce = scram::server_nonce().map_err(|_| ReasonCode::UnspecifiedError)?;
                let (server, server_first) = scram::ScramServer::start(passwords, &data, &nonce)
                    .map_err(|_| ReasonCode::ProtocolError)?;
                self.pending = Some(server);
                Ok(Outbound::Auth {
                    reason: ReasonCode::ContinueAuthentication,
                    method: scram::SCRAM_SHA_512,
                    data: server_first.into(),
                })
            }
            (ReasonCode::ContinueAuthentication, Some(server)) => {
                if server.user() != &**user {
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
}

/// SCRAM-SHA-512 over AUTH (MQTT 5 4.12): the CONNECT's Authentication
/// Data is client-first, AUTH 0x18 answers server-first, the client's AUTH
/// 0x18 brings client-final. `Ok((user, server-final))` for the CONNACK;
/// `Err((reason, why))` refuses the CONNECT. Proofs are checked, never
/// logged.
async fn scram_exchange<R, W>(
    rd: &mut R,
    wr: &mut W,
    room: &mut ReadRoom,
    decoder: &mut FrameDecoder,
    connect: &Connect,
    passwords: &PasswordFile,
    metrics: &Metrics,
) -> Result<(Arc<str>, bytes::Bytes), (ReasonCode, &'static str)>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
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
    wr.write_all(&out).await.map_err(|_| {
        (
            ReasonCode::UnspecifiedError,
            "the challenge could not be sent",
        )
    })?;
    metrics.bytes_sent.fetch_add(out.len() as u64, Relaxed);
    let answer = match read_packet(rd, room, decoder, metrics).await {
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
                // PBKDF2 costs what the file's iteration count says: keep it
                // off the runtime's worker threads.
                let passwords = passwords.current();
                let (name, password) = (user.clone(), connect.password.clone().unwrap_or_default());
                let ok = tokio::task::spawn_blocking(move || {
                    super::auth::check_password(&passwords, &name, &password)
                })
                .await
                .unwrap_or(false);
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

fn connect_request(connect: &Connect, principal: Option<Arc<str>>) -> ConnectRequest {
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
        client_id: connect.client_id.clone(),
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
struct InboundAliases {
    maximum: u16,
    slots: Vec<Option<ByteStr>>,
}

impl InboundAliases {
    fn new(maximum: u16) -> InboundAliases {
        InboundAliases {
            maximum,
            slots: Vec::new(),
        }
    }

    /// Alias `alias`'s slot, `None` when it is out of range (0 or above
    /// the maximum).
    fn slot(&mut self, alias: u16) -> Option<&mut Option<ByteStr>> {
        if alias == 0 || alias > self.maximum {
            return None;
        }
        let index = usize::from(alias);
        if self.slots.len() <= index {
            self.slots.resize(index + 1, None);
        }
        self.slots.get_mut(index)
    }
}

fn adapt(packet: Packet, aliases: &mut InboundAliases) -> Result<Option<Inbound>, ReasonCode> {
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
                let slot = aliases.slot(alias).ok_or(ReasonCode::TopicAliasInvalid)?;
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
        Outbound::SubAck { packet_id, reasons } => Packet::SubAck(SubAck {
            packet_id,
            reasons,
            properties: AckProperties::default(),
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
) -> bool {
    let message = delivery.message;
    // Most MQTT 5 deliveries of a message send the same bytes but for
    // their packet identifier and flags: those are copied from the form
    // the first writer encoded. A delivery with its own topic alias,
    // Subscription Identifiers or expiry left is encoded for itself, as is
    // every MQTT 3.1.1 one (see `WireForms`).
    if version == ProtocolVersion::V5
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
        payload: &message.payload,
    };
    if codec::encode_publish(&publish, version, client_max, buf).is_ok() {
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

/// The writer: drains the outbound queue in batches, encodes, and writes
/// each batch with one `write_all`. Ends when the state drops the queue's
/// sender, after a DISCONNECT, on a write error or when killed; then closes
/// the transport and tells the reader.
/// What the writer shares with the state about its queue.
struct WriterFlow {
    id: u64,
    /// Packets taken from the queue so far (only the writer adds to it).
    written: Arc<AtomicUsize>,
    want_drained: Arc<AtomicBool>,
    /// Below this many queued packets the state is told the writer caught up.
    low_water: usize,
    events: mpsc::Sender<Event>,
}

#[allow(clippy::too_many_arguments)]
async fn writer<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Outbound>,
    kill_tx: watch::Sender<bool>,
    mut kill_rx: watch::Receiver<bool>,
    version: ProtocolVersion,
    client_max: u32,
    mut aliases: Option<OutboundAliases>,
    metrics: Arc<Metrics>,
    flow: WriterFlow,
) -> Farewell {
    let v5 = version == ProtocolVersion::V5;
    // Both grow with the first batch and are given back whenever the
    // queue is drained (below): an idle connection holds neither.
    let mut buf = BytesMut::new();
    let mut batch = Vec::new();
    let mut killed = false;
    let mut farewell = Farewell::Silent;
    'run: loop {
        let received = tokio::select! {
            biased;
            _ = kill_rx.changed() => { killed = true; break 'run }
            n = rx.recv_many(&mut batch, WRITE_BATCH) => n,
        };
        if received == 0 {
            break;
        }
        let mut finished = false;
        let mut said = false;
        let mut publishes = 0u64;
        for out in batch.drain(..) {
            if finished {
                continue;
            }
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
                if write_delivery(&delivery, version, client_max, aliases.as_mut(), &mut buf) {
                    publishes += u64::from(!sys);
                }
                continue;
            }
            let ack = match out {
                Outbound::PubAck { packet_id, reason } => {
                    Some((codec::Ack::PubAck(packet_id), reason))
                }
                Outbound::PubRec { packet_id, reason } => {
                    Some((codec::Ack::PubRec(packet_id), reason))
                }
                Outbound::PubRel { packet_id, reason } => {
                    Some((codec::Ack::PubRel(packet_id), reason))
                }
                Outbound::PubComp { packet_id, reason } => {
                    Some((codec::Ack::PubComp(packet_id), reason))
                }
                _ => None,
            };
            if let Some((ack, reason)) = ack {
                // As `encode_within` would write it, without a packet built.
                let _ = codec::encode_ack(ack, reason, version, client_max, &mut buf);
                continue;
            }
            let last_word = match &out {
                Outbound::Disconnect { .. } => true,
                Outbound::ConnAck { reason, .. } => reason.is_error(),
                _ => false,
            };
            finished |= last_word;
            let Some(packet) = to_packet(out, v5) else {
                continue;
            };
            said |= last_word;
            // Too large for the client even without its diagnostics: not
            // sent (MQTT-3.1.2-25).
            let _ = codec::encode_within(&packet, version, client_max, &mut buf);
        }
        let write = wr.write_all(&buf);
        let written = tokio::select! {
            biased;
            _ = kill_rx.changed() => { killed = true; break 'run }
            written = write => written,
        };
        if written.is_err() {
            break;
        }
        if said {
            farewell = Farewell::Said;
        }
        metrics.bytes_sent.fetch_add(buf.len() as u64, Relaxed);
        metrics.messages_sent.fetch_add(publishes, Relaxed);
        buf.clear();
        flow.written.fetch_add(received, Relaxed);
        let left = rx.len();
        if left == 0 {
            if buf.capacity() > WRITE_KEEP {
                buf = BytesMut::new();
            }
            if batch.capacity() > 8 {
                batch = Vec::new();
            }
        } else if buf.capacity() > 1024 * 1024 {
            // One batch of large messages: not kept for the next.
            buf = BytesMut::new();
        }
        // Read before it is swapped: the swap would take the line from
        // the state's core after every write.
        if left < flow.low_water
            && flow.want_drained.load(Relaxed)
            && flow.want_drained.swap(false, Relaxed)
        {
            // The state waits for this queue to drain (a paused reader,
            // retained messages still owed): say it did.
            let _ = flow
                .events
                .send(Event::Drained {
                    connection: flow.id,
                })
                .await;
        }
        if finished {
            break;
        }
    }
    if !killed {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = wr.flush().await;
            let _ = wr.shutdown().await;
        })
        .await;
    } else {
        farewell = Farewell::Silent;
    }
    let _ = kill_tx.send(true);
    farewell
}

#[cfg(test)]
mod tests {
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
                wire: Default::default(),
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
                            payload: &message.payload,
                        };
                        codec::encode_publish(&publish, version, u32::MAX, &mut own).unwrap();
                        assert_eq!(copied, own, "QoS {q} topic {topic_len}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_copied_delivery_too_large_for_the_client_is_not_written() {
        let message = Message {
            topic: codec::ByteStr::from("telemetry/a"),
            payload: bytes::Bytes::from(vec![0u8; 100]),
            qos: 1,
            retain: false,
            properties: Default::default(),
            received_at: tokio::time::Instant::now(),
            wire: Default::default(),
        };
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

    #[test]
    fn a_read_room_grows_while_reads_fill_it_and_gives_back_a_quiet_connections_buffer() {
        let mut room = ReadRoom::new();
        // A busy publisher: every read fills what it was given.
        for _ in 0..10 {
            let buf = room.prepare();
            let given = buf.capacity() - buf.len();
            buf.extend(std::iter::repeat_n(0u8, given));
            room.read(given);
            room.buf.clear();
        }
        assert_eq!(room.want, READ_CHUNK, "grown to the largest read");
        assert!(room.prepare().capacity() >= READ_CHUNK);
        // Then quiet: small reads shrink it, and an emptied buffer larger
        // than twice what is wanted is given back.
        for _ in 0..10 {
            room.read(2);
            room.prepare();
        }
        assert_eq!(room.want, READ_MIN);
        assert!(
            room.buf.capacity() <= 2 * READ_MIN,
            "a quiet connection holds {} bytes",
            room.buf.capacity()
        );
    }

    #[test]
    fn a_read_room_keeps_what_is_buffered() {
        let mut room = ReadRoom::new();
        room.prepare().extend_from_slice(&[0x30, 0x05, 0, 1]);
        room.read(4);
        let buf = room.prepare();
        assert_eq!(&buf[..], &[0x30, 0x05, 0, 1], "a partial packet is kept");
        assert!(buf.capacity() - buf.len() >= READ_MIN);
    }

    /// An anonymous connection's context with the defaults the tests share.
    fn test_context() -> Arc<ConnectionContext> {
        Arc::new(ConnectionContext {
            max_packet_size: 1 << 20,
            topic_alias_maximum: 0,
            allow_anonymous: true,
            passwords: None,
            metrics: Arc::new(Metrics::new()),
            outbound_queue: 16,
            max_keep_alive: 0,
            topic_aliases: false,
        })
    }

    /// A connection served over an in-memory pipe, with the test as the
    /// broker's state: it reads the events and holds the handle.
    struct Served {
        client: tokio::io::DuplexStream,
        events: mpsc::Receiver<Event>,
        _shutdown: broadcast::Sender<()>,
        _handle: Option<ConnectionHandle>,
    }

    impl Served {
        async fn connect(keep_alive: u16) -> Served {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let (events_tx, events) = mpsc::channel(16);
            let (shutdown, shutdown_rx) = broadcast::channel(1);
            let context = test_context();
            tokio::spawn(serve(
                server,
                "127.0.0.1:1".parse().unwrap(),
                1,
                Instant::now() + Duration::from_secs(60),
                events_tx,
                context,
                shutdown_rx,
                Admission::Serve,
            ));
            let mut served = Served {
                client,
                events,
                _shutdown: shutdown,
                _handle: None,
            };
            served
                .send(Packet::Connect(Connect {
                    protocol: ProtocolVersion::V311,
                    clean_start: true,
                    keep_alive,
                    client_id: "ka".into(),
                    will: None,
                    username: None,
                    password: None,
                    properties: Default::default(),
                }))
                .await;
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

    /// What an idle connection holds for its whole life is its two tasks:
    /// the reader's future (the handshake is boxed and gone) and the
    /// writer's. Multiplied by every connection a broker holds, a future
    /// that grows by a kilobyte costs an edge site's 50,000 devices 50 MB.
    #[tokio::test]
    async fn an_idle_connections_tasks_stay_small() {
        let (_client, server) = tokio::io::duplex(64);
        let (events, _events_rx) = mpsc::channel::<Event>(1);
        let (_shutdown, shutdown_rx) = broadcast::channel(1);
        let context = test_context();
        let reader = serve(
            server,
            "127.0.0.1:1".parse().unwrap(),
            1,
            Instant::now(),
            events.clone(),
            context,
            shutdown_rx,
            Admission::Serve,
        );
        let reader = std::mem::size_of_val(&reader);
        assert!(reader <= 2048, "the reader's future is {reader} bytes");

        let (_client, server) = tokio::io::duplex(64);
        let (_, wr) = tokio::io::split(server);
        let (_tx, rx) = mpsc::unbounded_channel::<Outbound>();
        let (kill_tx, kill_rx) = watch::channel(false);
        let writer = writer(
            wr,
            rx,
            kill_tx,
            kill_rx,
            ProtocolVersion::V5,
            1 << 20,
            None,
            Arc::new(Metrics::new()),
            WriterFlow {
                id: 1,
                written: Arc::new(AtomicUsize::new(0)),
                want_drained: Arc::new(AtomicBool::new(false)),
                low_water: 1,
                events,
            },
        );
        let writer = std::mem::size_of_val(&writer);
        assert!(writer <= 1024, "the writer's future is {writer} bytes");
    }
}
