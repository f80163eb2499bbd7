//! MBMQTT01 `broker.snapshot`, Disk V1/V2/V3: the legacy format saguin reads.
//!
//! ```text
//! envelope (24 bytes, big-endian)
//!  0  magic           8 bytes  "MBMQTT01"
//!  8  version         u16      1, 2 or 3
//! 10  flags           u16      must be 0
//! 12  payload length  u64      must equal the bytes that follow
//! 20  payload CRC     u32      IEEE CRC-32 of the payload bytes
//! 24  payload         big-endian; strings and byte arrays are u32 length + bytes
//! ```
//!
//! The payload layouts of all three versions, and every decision this reader
//! takes where the legacy documentation is silent, are in `FORMAT.md` §5.
//! Every version decodes into the one V3 model ([`Snapshot`]); legacy
//! in-flight entries become [`Phase::AwaitPuback`], legacy pending messages
//! QoS 1, a legacy session has no inbound QoS 2 list, and a V1 session is
//! [`Principal::LegacyAnonymous`] with [`Detach::Unknown`].
//!
//! Decoding never panics, never indexes the input, and checks every count
//! against the bytes left before allocating for it.

mod decode;
mod encode;

pub use decode::decode;
pub use encode::{encode, seal};

use thiserror::Error;

/// The eight bytes every MBMQTT01 file starts with.
pub const MAGIC: [u8; 8] = *b"MBMQTT01";
/// Size of the envelope before the payload.
pub const ENVELOPE_LEN: usize = 24;
/// Offset of the u16 envelope version.
pub const VERSION_AT: usize = 8;
/// Offset of the u16 flags.
pub const FLAGS_AT: usize = 10;
/// Offset of the u64 payload length.
pub const LENGTH_AT: usize = 12;
/// Offset of the u32 IEEE CRC-32 of the payload.
pub const CRC_AT: usize = 20;
/// The newest version, the only one [`encode`] writes.
pub const CURRENT_VERSION: u16 = 3;
/// The default ceiling on the size of a file this build reads (64 MiB), the
/// legacy broker's own `--max-snapshot-bytes` default.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// True when `bytes` start with the MBMQTT01 magic: how a path's kind is
/// told from its bytes rather than its name.
pub fn has_magic(bytes: &[u8]) -> bool {
    bytes.get(..MAGIC.len()) == Some(&MAGIC[..])
}

/// A whole broker snapshot, in the V3 model whatever version was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The envelope version the bytes carried (1, 2 or 3).
    pub version_read: u16,
    /// Persistent sessions, in file order (client ids unique).
    pub sessions: Vec<Session>,
    /// Retained messages, in file order (topics unique).
    pub retained: Vec<RetainedMessage>,
}

/// Who a session belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// The name the session's client authenticated as (V2, V3); may be
    /// empty for an anonymous client of those versions.
    Named(String),
    /// A V1 session: the legacy format recorded no owner.
    LegacyAnonymous,
}

/// When the session's client went away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detach {
    /// Unix milliseconds (V2, V3).
    Millis(u64),
    /// A V1 session: the legacy format recorded no detach time, so the
    /// expiry window starts when the session is first seen after loading.
    Unknown,
}

/// A persistent session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub client_id: String,
    pub principal: Principal,
    pub detach: Detach,
    /// The packet identifier the broker would use next.
    pub next_packet_id: u16,
    /// Subscriptions in file order (filters unique within the session).
    pub subscriptions: Vec<Subscription>,
    /// Inbound QoS 2 packet ids awaiting PUBREL, in receive order
    /// (nonzero, unique). Always empty for V1/V2.
    pub inbound_qos2: Vec<u16>,
    /// Outbound messages on the wire, in PUBLISH order (ids nonzero, unique).
    pub inflight: Vec<Inflight>,
    /// Offline QoS 1/2 messages in FIFO order.
    pub pending: Vec<Message>,
}

/// One subscription of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    pub filter: String,
    /// Granted QoS: 0..=2 in V3, 0..=1 in V1/V2.
    pub qos: u8,
}

/// How far an outbound exchange has got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// 1: a QoS 1 PUBLISH sent, PUBACK owed.
    AwaitPuback,
    /// 2: a QoS 2 PUBLISH sent, PUBREC owed.
    AwaitPubrec,
    /// 3: PUBREL sent, PUBCOMP owed; the message itself is no longer kept.
    AwaitPubcomp,
}

impl Phase {
    /// The byte the format stores.
    pub fn code(self) -> u8 {
        match self {
            Phase::AwaitPuback => 1,
            Phase::AwaitPubrec => 2,
            Phase::AwaitPubcomp => 3,
        }
    }

    pub fn from_code(code: u8) -> Option<Phase> {
        match code {
            1 => Some(Phase::AwaitPuback),
            2 => Some(Phase::AwaitPubrec),
            3 => Some(Phase::AwaitPubcomp),
            _ => None,
        }
    }

    /// The QoS a message in this phase must carry; `None` for phase 3,
    /// which carries no message.
    pub fn message_qos(self) -> Option<u8> {
        match self {
            Phase::AwaitPuback => Some(1),
            Phase::AwaitPubrec => Some(2),
            Phase::AwaitPubcomp => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::AwaitPuback => "await-puback",
            Phase::AwaitPubrec => "await-pubrec",
            Phase::AwaitPubcomp => "await-pubcomp",
        }
    }
}

/// One outbound in-flight entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inflight {
    pub packet_id: u16,
    pub phase: Phase,
    /// Present exactly for phases 1 and 2.
    pub message: Option<Message>,
}

/// A message owed to a session (in flight or pending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
    /// 1 or 2 (legacy messages carry no QoS and read as 1).
    pub qos: u8,
}

/// A retained message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetainedMessage {
    pub topic: String,
    pub payload: Vec<u8>,
    /// 0..=2 in V3, 0..=1 in V1/V2.
    pub qos: u8,
}

/// Why bytes are not a readable MBMQTT01 snapshot. Every variant names the
/// byte offset in the file (envelope included) and, inside the payload, the
/// field (`sessions[2].inflight[0].packet_id`).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("empty file: an MBMQTT01 snapshot is at least {ENVELOPE_LEN} bytes")]
    Empty,
    #[error("{len} bytes is shorter than the {ENVELOPE_LEN}-byte MBMQTT01 envelope")]
    ShorterThanEnvelope { len: usize },
    #[error("wrong magic at offset 0: {} is not \"MBMQTT01\"; not an MBMQTT01 snapshot", hex8(.found))]
    WrongMagic { found: [u8; 8] },
    #[error("unknown MBMQTT01 version {version} at offset {VERSION_AT}; this build reads versions 1, 2 and 3")]
    UnknownVersion { version: u16 },
    #[error("nonzero flags {flags:#06x} at offset {FLAGS_AT}; flags must be 0")]
    NonzeroFlags { flags: u16 },
    #[error("truncated: the payload length at offset {LENGTH_AT} declares {declared} bytes and only {present} follow the envelope")]
    Truncated { declared: u64, present: u64 },
    #[error("trailing bytes: the payload length at offset {LENGTH_AT} declares {declared} bytes and {present} follow the envelope")]
    TrailingBytes { declared: u64, present: u64 },
    #[error("CRC mismatch: the CRC-32 at offset {CRC_AT} is {stored:#010x} and the payload's is {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("model version {found} at offset {at} does not match envelope version {envelope}")]
    ModelVersionMismatch { at: u64, found: u32, envelope: u16 },
    #[error("{field} at offset {at} needs {needed} bytes and only {left} remain in the payload")]
    UnexpectedEnd {
        at: u64,
        field: String,
        needed: u64,
        left: u64,
    },
    #[error("{field} at offset {at} is {count}, which at {min_each} bytes each cannot fit in the {left} bytes left")]
    CountTooLarge {
        at: u64,
        field: String,
        count: u32,
        min_each: u64,
        left: u64,
    },
    #[error("{field} at offset {at} is not valid UTF-8")]
    InvalidUtf8 { at: u64, field: String },
    #[error("{field} at offset {at} is empty")]
    EmptyString { at: u64, field: String },
    #[error("{field} at offset {at}: client id {client_id:?} appears twice")]
    DuplicateClientId {
        at: u64,
        field: String,
        client_id: String,
    },
    #[error("{field} at offset {at} is 0; packet ids are 1..=65535")]
    ZeroPacketId { at: u64, field: String },
    #[error("{field} at offset {at}: packet id {packet_id} appears twice in the list")]
    DuplicatePacketId {
        at: u64,
        field: String,
        packet_id: u16,
    },
    #[error("{field} at offset {at} is {phase}; phases are 1 (await PUBACK), 2 (await PUBREC), 3 (await PUBCOMP)")]
    UnknownPhase { at: u64, field: String, phase: u8 },
    #[error("{field} at offset {at} is QoS {qos}, which does not match phase {phase} (phase 1 carries QoS 1, phase 2 QoS 2)")]
    PhaseQosMismatch {
        at: u64,
        field: String,
        phase: u8,
        qos: u8,
    },
    #[error("{field} at offset {at} is QoS {qos}; version {version} allows {allowed}")]
    QosOutOfRange {
        at: u64,
        field: String,
        qos: u8,
        version: u16,
        allowed: &'static str,
    },
    #[error("{field} at offset {at} is {value}; a retain flag is 0 or 1")]
    RetainOutOfRange { at: u64, field: String, value: u8 },
    #[error(
        "{field} at offset {at} is {text:?}, not a nonnegative decimal number of milliseconds"
    )]
    InvalidDetach {
        at: u64,
        field: String,
        text: String,
    },
    #[error("{field} at offset {at}: filter {filter:?} appears twice in the session")]
    DuplicateSubscription {
        at: u64,
        field: String,
        filter: String,
    },
    #[error("{field} at offset {at}: retained topic {topic:?} appears twice")]
    DuplicateRetainedTopic {
        at: u64,
        field: String,
        topic: String,
    },
    #[error("{count} bytes left over at offset {at} after the retained list")]
    LeftoverBytes { at: u64, count: u64 },
}

impl DecodeError {
    /// A short stable name for the refusal (`crc-mismatch`), for JSON output.
    pub fn code(&self) -> &'static str {
        match self {
            DecodeError::Empty => "empty",
            DecodeError::ShorterThanEnvelope { .. } => "shorter-than-envelope",
            DecodeError::WrongMagic { .. } => "wrong-magic",
            DecodeError::UnknownVersion { .. } => "unknown-version",
            DecodeError::NonzeroFlags { .. } => "nonzero-flags",
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::TrailingBytes { .. } => "trailing-bytes",
            DecodeError::CrcMismatch { .. } => "crc-mismatch",
            DecodeError::ModelVersionMismatch { .. } => "model-version-mismatch",
            DecodeError::UnexpectedEnd { .. } => "unexpected-end",
            DecodeError::CountTooLarge { .. } => "count-too-large",
            DecodeError::InvalidUtf8 { .. } => "invalid-utf8",
            DecodeError::EmptyString { .. } => "empty-string",
            DecodeError::DuplicateClientId { .. } => "duplicate-client-id",
            DecodeError::ZeroPacketId { .. } => "zero-packet-id",
            DecodeError::DuplicatePacketId { .. } => "duplicate-packet-id",
            DecodeError::UnknownPhase { .. } => "unknown-phase",
            DecodeError::PhaseQosMismatch { .. } => "phase-qos-mismatch",
            DecodeError::QosOutOfRange { .. } => "qos-out-of-range",
            DecodeError::RetainOutOfRange { .. } => "retain-out-of-range",
            DecodeError::InvalidDetach { .. } => "invalid-detach",
            DecodeError::DuplicateSubscription { .. } => "duplicate-subscription",
            DecodeError::DuplicateRetainedTopic { .. } => "duplicate-retained-topic",
            DecodeError::LeftoverBytes { .. } => "leftover-bytes",
        }
    }
}

/// Why a model cannot be written as Disk V3. The encoder refuses exactly
/// what the decoder would refuse, plus the states V3 bytes cannot express.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EncodeError {
    #[error("session {client_id:?}: a legacy anonymous principal has no V3 encoding")]
    LegacyAnonymousPrincipal { client_id: String },
    #[error("session {client_id:?}: an unknown detach time has no V3 encoding")]
    UnknownDetach { client_id: String },
    #[error("session {client_id:?}: in-flight packet id {packet_id} is in phase 3 and carries a message")]
    Phase3WithMessage { client_id: String, packet_id: u16 },
    #[error("session {client_id:?}: in-flight packet id {packet_id} is in phase {phase} and carries no message")]
    MessageMissing {
        client_id: String,
        packet_id: u16,
        phase: u8,
    },
    #[error("{what} is {len} long; the format's u32 limit is {}", u32::MAX)]
    TooLong { what: String, len: usize },
    /// The bytes the encoder produced would not decode: the model breaks a
    /// rule of the format (duplicate id, QoS out of range, ...).
    #[error("the snapshot would not decode: {0}")]
    Invalid(#[from] DecodeError),
}

fn hex8(bytes: &[u8; 8]) -> String {
    let mut out = String::with_capacity(16);
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests;
