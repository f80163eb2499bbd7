//! The bridge's client side towards the remote broker: TCP or TLS, the
//! project's codec, CONNECT and CONNACK, and the backoff between attempts.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use crate::broker::codec::{
    self, ConnAck, Connect, ConnectProperties, Disconnect, FrameDecoder, Packet, ProtocolVersion,
    QoS, ReasonCode,
};
use crate::config::bridge::{split_host_port, Bridge, BridgeProtocol};

/// Time for TCP, TLS and CONNACK together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;

pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// What the remote granted in its CONNACK.
#[derive(Debug, Clone, Copy)]
pub(super) struct Granted {
    pub session_present: bool,
    /// Its Receive Maximum (65535 when it states none).
    pub receive_maximum: u16,
    /// Its Maximum QoS (2 when it states none).
    pub maximum_qos: u8,
    /// Its Maximum Packet Size (None: the protocol's).
    pub maximum_packet_size: Option<u32>,
    /// Its Server Keep Alive, when it overrides the bridge's.
    pub keep_alive: Option<u16>,
}

/// Why a connection attempt did not give a connection.
#[derive(Debug)]
pub(super) enum ConnectFailure {
    /// No TCP, TLS or CONNACK (unreachable, timed out, a bad certificate).
    Failed(String),
    /// The remote answered and said no.
    Refused(ReasonCode),
}

/// A connected remote.
pub(super) struct Remote {
    pub address: String,
    pub version: ProtocolVersion,
    pub granted: Granted,
    reader: ReadHalf<Box<dyn Io>>,
    writer: WriteHalf<Box<dyn Io>>,
    decoder: FrameDecoder,
    buf: BytesMut,
    out: BytesMut,
}

impl Remote {
    /// Connect to `address` and complete CONNECT/CONNACK.
    pub async fn connect(bridge: &Bridge, address: &str) -> Result<Remote, ConnectFailure> {
        match tokio::time::timeout(CONNECT_TIMEOUT, Self::connect_inner(bridge, address)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectFailure::Failed(format!(
                "no CONNACK within {}s",
                CONNECT_TIMEOUT.as_secs()
            ))),
        }
    }

    async fn connect_inner(bridge: &Bridge, address: &str) -> Result<Remote, ConnectFailure> {
        let failed =
            |what: &str, e: &dyn std::fmt::Display| ConnectFailure::Failed(format!("{what}: {e}"));
        let (host, port) = split_host_port(address)
            .ok_or_else(|| ConnectFailure::Failed(format!("{address:?} is not host:port")))?;
        let tcp = TcpStream::connect((host, port))
            .await
            .map_err(|e| failed("TCP connect", &e))?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Io> = match &bridge.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let name = tls.server_name.as_deref().unwrap_or(host).to_owned();
                let server_name = rustls::pki_types::ServerName::try_from(name)
                    .map_err(|e| failed("TLS server name", &e))?;
                let connector =
                    tokio_rustls::TlsConnector::from(Arc::clone(tls.client_config.expose()));
                let stream = connector
                    .connect(server_name, tcp)
                    .await
                    .map_err(|e| failed("TLS handshake", &e))?;
                Box::new(stream)
            }
        };
        let version = match bridge.protocol {
            BridgeProtocol::Mqtt311 => ProtocolVersion::V311,
            BridgeProtocol::Mqtt5 => ProtocolVersion::V5,
        };
        let (reader, writer) = tokio::io::split(stream);
        let mut remote = Remote {
            address: address.to_owned(),
            version,
            granted: Granted {
                session_present: false,
                receive_maximum: u16::MAX,
                maximum_qos: 2,
                maximum_packet_size: None,
                keep_alive: None,
            },
            reader,
            writer,
            decoder: FrameDecoder::client(codec::PROTOCOL_MAX_PACKET_SIZE, version),
            buf: BytesMut::with_capacity(READ_CHUNK),
            out: BytesMut::with_capacity(READ_CHUNK),
        };
        let v5 = version == ProtocolVersion::V5;
        let connect = Packet::Connect(Connect {
            protocol: version,
            // The remote keeps the bridge's session: what `in` subscribed
            // to waits there while the link is down.
            clean_start: false,
            keep_alive: bridge.keepalive.as_secs() as u16,
            client_id: bridge.client_id.clone(),
            will: None,
            username: bridge.username.clone(),
            password: bridge.password.as_ref().map(|p| p.expose().clone().into()),
            properties: if v5 {
                ConnectProperties {
                    session_expiry_interval: Some(
                        u32::try_from(bridge.session_expiry.as_secs()).unwrap_or(u32::MAX),
                    ),
                    receive_maximum: Some(bridge.max_inflight),
                    ..ConnectProperties::default()
                }
            } else {
                ConnectProperties::default()
            },
        });
        let mut bytes = BytesMut::new();
        codec::encode(&connect, version, &mut bytes).map_err(|e| failed("encode CONNECT", &e))?;
        if !v5 && bridge.try_private {
            mark_bridge(&mut bytes);
        }
        remote
            .writer
            .write_all(&bytes)
            .await
            .map_err(|e| failed("send CONNECT", &e))?;
        let ack = match remote.recv().await {
            Ok(Packet::ConnAck(ack)) => ack,
            Ok(other) => {
                return Err(ConnectFailure::Failed(format!(
                    "the first packet is {}, not CONNACK",
                    other.packet_type()
                )))
            }
            Err(e) => return Err(ConnectFailure::Failed(e)),
        };
        let ConnAck {
            session_present,
            reason,
            properties,
        } = ack;
        if reason.is_error() {
            return Err(ConnectFailure::Refused(reason));
        }
        remote.granted = Granted {
            session_present,
            receive_maximum: properties.receive_maximum.unwrap_or(u16::MAX).max(1),
            maximum_qos: properties.maximum_qos.map_or(2, QoS::as_u8),
            maximum_packet_size: properties.maximum_packet_size,
            keep_alive: properties.server_keep_alive,
        };
        Ok(remote)
    }

    /// Read until one packet is decoded. Cancel safe: bytes read stay in
    /// the buffer.
    pub async fn recv(&mut self) -> Result<Packet, String> {
        loop {
            match self.decoder.decode(&mut self.buf) {
                Ok(Some(packet)) => return Ok(packet),
                Ok(None) => {}
                Err(e) => return Err(format!("malformed input: {e}")),
            }
            self.buf.reserve(READ_CHUNK);
            match self.reader.read_buf(&mut self.buf).await {
                Ok(0) => return Err("closed by the remote".to_owned()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// A packet already complete in the buffer, without reading.
    pub fn decoded(&mut self) -> Option<Result<Packet, String>> {
        match self.decoder.decode(&mut self.buf) {
            Ok(Some(packet)) => Some(Ok(packet)),
            Ok(None) => None,
            Err(e) => Some(Err(format!("malformed input: {e}"))),
        }
    }

    /// Queue `packet` for the next [`flush`](Self::flush). False when it
    /// exceeds the remote's Maximum Packet Size (nothing is queued).
    pub fn queue(&mut self, packet: &Packet) -> bool {
        let max = self.max_packet_size();
        codec::encode_within(packet, self.version, max, &mut self.out).is_ok()
    }

    /// Queue `publish` as [`Remote::queue`] would its packet, encoded
    /// from the publish itself (a send keeps it for a resend).
    pub fn queue_publish(&mut self, publish: &codec::Publish) -> bool {
        codec::encode_publish(
            &codec::PublishRef::of(publish),
            self.version,
            self.max_packet_size(),
            &mut self.out,
        )
        .is_ok()
    }

    fn max_packet_size(&self) -> u32 {
        self.granted
            .maximum_packet_size
            .unwrap_or(codec::PROTOCOL_MAX_PACKET_SIZE)
    }

    pub fn has_queued(&self) -> bool {
        !self.out.is_empty()
    }

    /// Write what was queued.
    pub async fn flush(&mut self) -> Result<(), String> {
        if self.out.is_empty() {
            return Ok(());
        }
        let result = self.writer.write_all(&self.out).await;
        self.out.clear();
        if self.out.capacity() > 1024 * 1024 {
            self.out = BytesMut::with_capacity(READ_CHUNK);
        }
        result.map_err(|e| e.to_string())
    }

    /// DISCONNECT (normal) and close: the remote keeps the session.
    pub async fn close(mut self) {
        let _ = self.queue(&Packet::Disconnect(Disconnect::new(ReasonCode::Success)));
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = self.flush().await;
            let _ = self.writer.shutdown().await;
        })
        .await;
    }
}

/// MQTT 3.1.1 bridges announce protocol level `4 | 0x80` (Mosquitto's
/// `try_private`): the remote then sends back nothing the bridge
/// published. The level byte follows the fixed header and the protocol
/// name `00 04 M Q T T`.
fn mark_bridge(connect: &mut BytesMut) {
    let mut at = 1;
    while connect.get(at).is_some_and(|b| b & 0x80 != 0) {
        at += 1;
    }
    let level = at + 1 + 6;
    if let Some(byte) = connect.get_mut(level) {
        *byte |= 0x80;
    }
}

/// Jittered exponential backoff.
pub(super) struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
    seed: u64,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration, seed: u64) -> Backoff {
        Backoff {
            base,
            cap,
            failures: 0,
            seed: seed | 1,
        }
    }

    /// The wait before the next attempt: between half and all of
    /// `base * 2^failures`, at most `cap`.
    pub fn next_delay(&mut self) -> Duration {
        let full = self
            .base
            .saturating_mul(1u32 << self.failures.min(16))
            .min(self.cap);
        self.failures = self.failures.saturating_add(1);
        // xorshift64: spread bridges that lost the same remote at once.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let half = full / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_nanos(self.seed % nanos)
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_byte_is_marked() {
        let connect = Packet::Connect(Connect {
            protocol: ProtocolVersion::V311,
            clean_start: false,
            keep_alive: 60,
            client_id: "x".repeat(200),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        });
        let mut bytes = BytesMut::new();
        codec::encode(&connect, ProtocolVersion::V311, &mut bytes).unwrap();
        mark_bridge(&mut bytes);
        // Two length bytes for 200+ bytes of body.
        assert_eq!(&bytes[3..9], b"\x00\x04MQTT");
        assert_eq!(bytes[9], 0x84);
    }

    #[test]
    fn backoff_grows_with_jitter_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8), 42);
        let delays: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let full = Duration::from_secs(1 << i.min(3));
            assert!(*d >= full / 2 && *d <= full, "{i}: {d:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_secs(1));
    }
}
