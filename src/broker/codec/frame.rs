//! The bounded frame decoder: turns a TCP byte stream into packets.
//!
//! ```text
//!   byte 0          bytes 1..=4                     remaining length bytes
//! +--------+---------------------------+-------------------------------------+
//! |type|flg| remaining length (VBI,    | variable header and payload         |
//! |4b  |4b | 1..4 bytes, ≤ 268,435,455)|                                     |
//! +--------+---------------------------+-------------------------------------+
//! ```
//!
//! First *check* (type, flags, direction, remaining length, size cap) from
//! the fixed header alone — a packet over the cap is refused before one byte
//! of its body is buffered — then, once the whole frame is in the buffer,
//! split it off and *parse* it. An incomplete frame is `Ok(None)`, never an
//! error.

use bytes::{Buf, Bytes, BytesMut};

use super::decode::{check_first_byte, decode_body, Role};
use super::error::DecodeError;
use super::packet::{Ack, Packet};
use super::primitives::{PacketType, ProtocolVersion};
use super::wire::{parse_var_int, VarInt, MAX_VARIABLE_BYTE_INTEGER};

/// The largest packet the protocol can express: 1 type byte, 4 length
/// bytes, 268,435,455 body bytes.
pub const PROTOCOL_MAX_PACKET_SIZE: u32 = 1 + 4 + MAX_VARIABLE_BYTE_INTEGER;

/// The most a decoder reserves beyond the bytes received while waiting for
/// the rest of a frame.
const MAX_RESERVE_AHEAD: usize = 64 * 1024;

/// A PUBLISH shorter than this is copied out of the read buffer rather
/// than split off it: its topic and payload outlive the read whenever a
/// queue, a retained topic or a slow writer keeps the message, and as a
/// part of the buffer they would keep all of it alive, every other
/// packet read with them included (a session owed one message in a
/// hundred of a publisher's stream held 4.4 KB for each 64 B message:
/// docs/benchmarks.md, "A session owed one message in N"). A longer one
/// is most of its own allocation: the buffer grew to hold it.
const COPIED_BELOW: usize = 64 * 1024;

/// A fixed header that has passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedHeader {
    pub packet_type: PacketType,
    /// The whole first byte, flags included.
    pub first_byte: u8,
    /// 2..=5: the type byte and the remaining length's bytes.
    pub header_len: usize,
    /// Bytes after the fixed header.
    pub remaining_len: usize,
}

impl FixedHeader {
    /// The whole packet's size: what MQTT 5 calls the packet size.
    pub fn frame_len(&self) -> usize {
        self.header_len + self.remaining_len
    }
}

/// Reads and checks a fixed header at the start of `buf`: `Ok(None)` while
/// the remaining length is incomplete. Refuses a packet larger than
/// `max_packet_size` bytes as soon as its length is known.
pub fn check_fixed_header(
    buf: &[u8],
    max_packet_size: u32,
    version: Option<ProtocolVersion>,
    role: Role,
) -> Result<Option<FixedHeader>, DecodeError> {
    let Some(&first_byte) = buf.first() else {
        return Ok(None);
    };
    let packet_type = check_first_byte(first_byte, version, role)?;
    let (remaining_len, len_bytes) = match parse_var_int(buf.get(1..).unwrap_or_default()) {
        VarInt::Value { value, len } => (value as usize, len),
        VarInt::Incomplete => return Ok(None),
        VarInt::Malformed => return Err(DecodeError::MalformedRemainingLength),
    };
    let header = FixedHeader {
        packet_type,
        first_byte,
        header_len: 1 + len_bytes,
        remaining_len,
    };
    if header.frame_len() as u64 > u64::from(max_packet_size) {
        return Err(DecodeError::PacketTooLarge {
            packet: packet_type,
            size: header.frame_len() as u64,
            max: max_packet_size,
        });
    }
    Ok(Some(header))
}

/// Decodes packets from a connection's receive buffer. A server's decoder
/// expects CONNECT first and then reads every packet in the version that
/// CONNECT announced.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    /// The largest whole packet (fixed header included) accepted; what the
    /// server announces as Maximum Packet Size.
    pub max_packet_size: u32,
    role: Role,
    version: Option<ProtocolVersion>,
}

impl FrameDecoder {
    /// A decoder for the server side of a new connection: the first packet
    /// must be CONNECT, whose protocol level fixes the version.
    pub fn server(max_packet_size: u32) -> FrameDecoder {
        FrameDecoder {
            max_packet_size,
            role: Role::Server,
            version: None,
        }
    }

    /// A decoder for `role` in any state: `version` is `None` for a server
    /// that has not read CONNECT yet, `Some` once the version is known (for
    /// a connection whose CONNECT was read elsewhere).
    pub fn new(role: Role, max_packet_size: u32, version: Option<ProtocolVersion>) -> FrameDecoder {
        FrameDecoder {
            max_packet_size,
            role,
            version,
        }
    }

    /// A decoder for the client side of a connection speaking `version`.
    pub fn client(max_packet_size: u32, version: ProtocolVersion) -> FrameDecoder {
        FrameDecoder {
            max_packet_size,
            role: Role::Client,
            version: Some(version),
        }
    }

    /// The version learned from CONNECT (server) or given (client).
    pub fn version(&self) -> Option<ProtocolVersion> {
        self.version
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Checks the fixed header at the front of `buf` without consuming
    /// anything: lets a caller refuse an oversized or invalid packet as soon
    /// as its first bytes arrive.
    pub fn check_header(&self, buf: &[u8]) -> Result<Option<FixedHeader>, DecodeError> {
        check_fixed_header(buf, self.max_packet_size, self.version, self.role)
    }

    /// Takes a PUBACK, PUBREC, PUBREL or PUBCOMP in its short form (remaining
    /// length 2: the packet identifier alone, reason Success, no
    /// properties) off the front of `buf`, without building a [`Packet`]:
    /// a subscriber answers every delivery with one, and this is what most
    /// of a fan-out's input is. `None`, nothing consumed, for anything else
    /// (another packet, an incomplete one, an identifier of 0, one this
    /// decoder would refuse), which [`FrameDecoder::decode`] then reads, and
    /// refuses, as before.
    #[inline]
    pub fn decode_short_ack(&mut self, buf: &mut BytesMut) -> Option<Ack> {
        let &[first, 2, high, low, ..] = &buf[..] else {
            return None;
        };
        let packet_id = u16::from_be_bytes([high, low]);
        // Before CONNECT only CONNECT is read; all four go both ways.
        if packet_id == 0 || self.version.is_none() || self.max_packet_size < 4 {
            return None;
        }
        let ack = match first {
            0x40 => Ack::PubAck(packet_id),
            0x50 => Ack::PubRec(packet_id),
            0x62 => Ack::PubRel(packet_id),
            0x70 => Ack::PubComp(packet_id),
            _ => return None,
        };
        buf.advance(4);
        Some(ack)
    }

    /// Takes the next complete packet off the front of `buf`. `Ok(None)`
    /// means more bytes are needed (nothing is consumed; once the frame's
    /// size has passed the cap, room for up to 64 KiB more is reserved). Any error is
    /// fatal to the connection; see [`DecodeError::reason_code`].
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Packet>, DecodeError> {
        let Some(header) = self.check_header(buf)? else {
            return Ok(None);
        };
        let frame_len = header.frame_len();
        if buf.len() < frame_len {
            // Room for the rest of the frame, but never more than a bounded
            // step ahead of the bytes that actually arrived: the length is
            // the peer's claim, and only the cap has vouched for it.
            buf.reserve((frame_len - buf.len()).min(MAX_RESERVE_AHEAD));
            return Ok(None);
        }
        let body = if header.packet_type == PacketType::Publish && frame_len < COPIED_BELOW {
            let body = Bytes::copy_from_slice(&buf[header.header_len..frame_len]);
            buf.advance(frame_len);
            body
        } else {
            buf.split_to(frame_len)
                .freeze()
                .split_off(header.header_len)
        };
        // Before CONNECT the version is unknown; only CONNECT gets here
        // then, and it reads its own version.
        let version = self.version.unwrap_or(ProtocolVersion::V5);
        let packet = decode_body(
            header.first_byte,
            body,
            header.header_len,
            version,
            self.role,
        )?;
        if let Packet::Connect(connect) = &packet {
            self.version = Some(connect.protocol);
        }
        Ok(Some(packet))
    }
}
