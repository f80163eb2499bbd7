//! The MBMQTT01 decoder: envelope, then the version's payload, validated as
//! it is read. Offsets in errors are file offsets (the envelope counts).

use std::collections::HashSet;

use super::{
    DecodeError, Detach, Inflight, Message, Phase, Principal, RetainedMessage, Session, Snapshot,
    Subscription, CRC_AT, ENVELOPE_LEN, FLAGS_AT, LENGTH_AT, MAGIC, VERSION_AT,
};

/// Smallest encoding of each repeated item, per version, used to refuse a
/// count that cannot fit in the bytes left before anything is allocated.
const MIN_SUBSCRIPTION: u64 = 4 + 1;
const MIN_PACKET_ID: u64 = 2;
/// topic length + payload length + retain (+ QoS in V3).
const MIN_LEGACY_MESSAGE: u64 = 4 + 4 + 1;
const MIN_V3_MESSAGE: u64 = MIN_LEGACY_MESSAGE + 1;
/// id + phase (phase 3 carries nothing more).
const MIN_V3_INFLIGHT: u64 = 2 + 1;
const MIN_LEGACY_INFLIGHT: u64 = 2 + MIN_LEGACY_MESSAGE;
const MIN_RETAINED: u64 = 4 + 4 + 1;
/// client id + next packet id + subscription, inflight and pending counts.
const MIN_V1_SESSION: u64 = 4 + 2 + 4 * 3;
/// V1 + principal + detach.
const MIN_V2_SESSION: u64 = MIN_V1_SESSION + 4 + 4;
/// V2 + the inbound QoS 2 count.
const MIN_V3_SESSION: u64 = MIN_V2_SESSION + 4;

/// A pre-allocation never larger than this many items: a count passing the
/// bytes-left check is still only a claim until the items are read.
const MAX_PREALLOCATE: usize = 1024;

/// Decode a whole MBMQTT01 file (envelope included) into the V3 model.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, DecodeError> {
    let version = check_envelope(bytes)?;
    let mut r = Reader {
        buf: bytes,
        pos: ENVELOPE_LEN,
    };
    let at = r.at();
    let model = r.u32(|| "model version".into())?;
    if model != u32::from(version) {
        return Err(DecodeError::ModelVersionMismatch {
            at,
            found: model,
            envelope: version,
        });
    }
    let min_session = match version {
        1 => MIN_V1_SESSION,
        2 => MIN_V2_SESSION,
        _ => MIN_V3_SESSION,
    };
    let count = r.count(min_session, || "session count".into())?;
    let mut sessions = Vec::with_capacity(count.min(MAX_PREALLOCATE));
    let mut client_ids = HashSet::new();
    for i in 0..count {
        let at = r.at();
        let (session, client_id) = r.session(version, i)?;
        if !client_ids.insert(client_id) {
            return Err(DecodeError::DuplicateClientId {
                at,
                field: format!("sessions[{i}].client_id"),
                client_id: session.client_id,
            });
        }
        sessions.push(session);
    }
    let count = r.count(MIN_RETAINED, || "retained count".into())?;
    let mut retained = Vec::with_capacity(count.min(MAX_PREALLOCATE));
    let mut topics = HashSet::new();
    for i in 0..count {
        let at = r.at();
        let topic = r.nonempty_str(|| format!("retained[{i}].topic"))?;
        let payload = r.bytes(|| format!("retained[{i}].payload"))?.to_vec();
        let qos = r.qos(version, 2, || format!("retained[{i}].qos"))?;
        if !topics.insert(topic) {
            return Err(DecodeError::DuplicateRetainedTopic {
                at,
                field: format!("retained[{i}].topic"),
                topic: topic.to_owned(),
            });
        }
        retained.push(RetainedMessage {
            topic: topic.to_owned(),
            payload,
            qos,
        });
    }
    if r.left() != 0 {
        return Err(DecodeError::LeftoverBytes {
            at: r.at(),
            count: r.left() as u64,
        });
    }
    Ok(Snapshot {
        version_read: version,
        sessions,
        retained,
    })
}

/// Check the 24-byte envelope against the whole file; returns the version.
fn check_envelope(bytes: &[u8]) -> Result<u16, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    let Some((envelope, payload)) = bytes.split_first_chunk::<ENVELOPE_LEN>() else {
        return Err(DecodeError::ShorterThanEnvelope { len: bytes.len() });
    };
    let field = |at: usize| -> &[u8] { envelope.get(at..).unwrap_or_default() };
    let magic = first::<8>(envelope);
    if magic != MAGIC {
        return Err(DecodeError::WrongMagic { found: magic });
    }
    let version = u16::from_be_bytes(first::<2>(field(VERSION_AT)));
    if !(1..=3).contains(&version) {
        return Err(DecodeError::UnknownVersion { version });
    }
    let flags = u16::from_be_bytes(first::<2>(field(FLAGS_AT)));
    if flags != 0 {
        return Err(DecodeError::NonzeroFlags { flags });
    }
    let declared = u64::from_be_bytes(first::<8>(field(LENGTH_AT)));
    let present = payload.len() as u64;
    if declared > present {
        return Err(DecodeError::Truncated { declared, present });
    }
    if declared < present {
        return Err(DecodeError::TrailingBytes { declared, present });
    }
    let stored = u32::from_be_bytes(first::<4>(field(CRC_AT)));
    let computed = crc32fast::hash(payload);
    if stored != computed {
        return Err(DecodeError::CrcMismatch { stored, computed });
    }
    Ok(version)
}

/// The first `N` bytes of a slice the caller has already sized (the
/// envelope is a fixed 24-byte array); zeros if it were ever shorter.
fn first<const N: usize>(bytes: &[u8]) -> [u8; N] {
    bytes.first_chunk::<N>().copied().unwrap_or([0; N])
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn at(&self) -> u64 {
        self.pos as u64
    }

    fn left(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, field: impl FnOnce() -> String) -> Result<&'a [u8], DecodeError> {
        let slice = self
            .pos
            .checked_add(n)
            .and_then(|end| self.buf.get(self.pos..end));
        match slice {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(DecodeError::UnexpectedEnd {
                at: self.at(),
                field: field(),
                needed: n as u64,
                left: self.left() as u64,
            }),
        }
    }

    fn array<const N: usize>(
        &mut self,
        field: impl FnOnce() -> String,
    ) -> Result<[u8; N], DecodeError> {
        Ok(first::<N>(self.take(N, field)?))
    }

    fn u8(&mut self, field: impl FnOnce() -> String) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: impl FnOnce() -> String) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: impl FnOnce() -> String) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    /// A u32 count of items at least `min_each` bytes long, refused before
    /// any allocation when they could not fit in what is left.
    fn count(&mut self, min_each: u64, field: impl Fn() -> String) -> Result<usize, DecodeError> {
        let at = self.at();
        let count = self.u32(&field)?;
        let left = self.left() as u64;
        if u64::from(count).saturating_mul(min_each) > left {
            return Err(DecodeError::CountTooLarge {
                at,
                field: field(),
                count,
                min_each,
                left,
            });
        }
        usize::try_from(count).map_err(|_| DecodeError::CountTooLarge {
            at,
            field: field(),
            count,
            min_each,
            left,
        })
    }

    /// A u32 length and that many bytes.
    fn bytes(&mut self, field: impl Fn() -> String) -> Result<&'a [u8], DecodeError> {
        let at = self.at();
        let len = self.u32(&field)?;
        let left = self.left() as u64;
        if u64::from(len) > left {
            return Err(DecodeError::UnexpectedEnd {
                at,
                field: field(),
                needed: u64::from(len),
                left,
            });
        }
        self.take(len as usize, field)
    }

    fn string(&mut self, field: impl Fn() -> String) -> Result<String, DecodeError> {
        self.str(field).map(str::to_owned)
    }

    /// A string borrowed from the input: what the duplicate checks hold, so
    /// a set of client ids, filters or topics costs no copy of each.
    fn str(&mut self, field: impl Fn() -> String) -> Result<&'a str, DecodeError> {
        let at = self.at();
        let raw = self.bytes(&field)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s),
            Err(e) => Err(DecodeError::InvalidUtf8 {
                // The length prefix, then the first byte that is not UTF-8.
                at: at + 4 + e.valid_up_to() as u64,
                field: field(),
            }),
        }
    }

    fn nonempty_string(&mut self, field: impl Fn() -> String) -> Result<String, DecodeError> {
        self.nonempty_str(field).map(str::to_owned)
    }

    fn nonempty_str(&mut self, field: impl Fn() -> String) -> Result<&'a str, DecodeError> {
        let at = self.at();
        let s = self.str(&field)?;
        if s.is_empty() {
            return Err(DecodeError::EmptyString { at, field: field() });
        }
        Ok(s)
    }

    /// A QoS byte within `0..=max` for V3, `0..=min(max, 1)` for V1/V2.
    fn qos(
        &mut self,
        version: u16,
        max_v3: u8,
        field: impl Fn() -> String,
    ) -> Result<u8, DecodeError> {
        let at = self.at();
        let qos = self.u8(&field)?;
        let (max, allowed) = match (version, max_v3) {
            (3, 2) => (2, "0..=2"),
            _ => (1, "0..=1"),
        };
        if qos > max {
            return Err(DecodeError::QosOutOfRange {
                at,
                field: field(),
                qos,
                version,
                allowed,
            });
        }
        Ok(qos)
    }

    fn retain(&mut self, field: impl Fn() -> String) -> Result<bool, DecodeError> {
        let at = self.at();
        match self.u8(&field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(DecodeError::RetainOutOfRange {
                at,
                field: field(),
                value,
            }),
        }
    }

    fn packet_id(
        &mut self,
        seen: &mut HashSet<u16>,
        field: impl Fn() -> String,
    ) -> Result<u16, DecodeError> {
        let at = self.at();
        let id = self.u16(&field)?;
        if id == 0 {
            return Err(DecodeError::ZeroPacketId { at, field: field() });
        }
        if !seen.insert(id) {
            return Err(DecodeError::DuplicatePacketId {
                at,
                field: field(),
                packet_id: id,
            });
        }
        Ok(id)
    }

    /// A message: topic, payload, retain, and in V3 a QoS of 1 or 2. Legacy
    /// messages carry no QoS byte and read as QoS 1.
    ///
    /// `path` names the message in errors; it is only formatted on the
    /// error path, never per message read.
    fn message(&mut self, version: u16, path: &dyn Fn() -> String) -> Result<Message, DecodeError> {
        let topic = self.nonempty_string(|| format!("{}.topic", path()))?;
        let payload = self.bytes(|| format!("{}.payload", path()))?.to_vec();
        let retain = self.retain(|| format!("{}.retain", path()))?;
        let qos = if version == 3 {
            let at = self.at();
            let qos = self.u8(|| format!("{}.qos", path()))?;
            if !(1..=2).contains(&qos) {
                return Err(DecodeError::QosOutOfRange {
                    at,
                    field: format!("{}.qos", path()),
                    qos,
                    version,
                    allowed: "1..=2",
                });
            }
            qos
        } else {
            1
        };
        Ok(Message {
            topic,
            payload,
            retain,
            qos,
        })
    }

    /// A session, and its client id borrowed from the input for the
    /// caller's duplicate check.
    fn session(&mut self, version: u16, i: usize) -> Result<(Session, &'a str), DecodeError> {
        let client_id_ref = self.nonempty_str(|| format!("sessions[{i}].client_id"))?;
        let client_id = client_id_ref.to_owned();
        let (principal, detach) = if version >= 2 {
            let principal = self.string(|| format!("sessions[{i}].principal"))?;
            let at = self.at();
            let text = self.string(|| format!("sessions[{i}].detach"))?;
            let millis = parse_detach(&text).ok_or_else(|| DecodeError::InvalidDetach {
                at,
                field: format!("sessions[{i}].detach"),
                text: text.clone(),
            })?;
            (Principal::Named(principal), Detach::Millis(millis))
        } else {
            (Principal::LegacyAnonymous, Detach::Unknown)
        };
        let next_packet_id = self.u16(|| format!("sessions[{i}].next_packet_id"))?;

        let count = self.count(MIN_SUBSCRIPTION, || {
            format!("sessions[{i}].subscriptions count")
        })?;
        let mut subscriptions = Vec::with_capacity(count.min(MAX_PREALLOCATE));
        let mut filters = HashSet::new();
        for j in 0..count {
            let at = self.at();
            let filter =
                self.nonempty_str(|| format!("sessions[{i}].subscriptions[{j}].filter"))?;
            let qos = self.qos(version, 2, || {
                format!("sessions[{i}].subscriptions[{j}].qos")
            })?;
            if !filters.insert(filter) {
                return Err(DecodeError::DuplicateSubscription {
                    at,
                    field: format!("sessions[{i}].subscriptions[{j}].filter"),
                    filter: filter.to_owned(),
                });
            }
            subscriptions.push(Subscription {
                filter: filter.to_owned(),
                qos,
            });
        }

        let mut inbound_qos2 = Vec::new();
        if version == 3 {
            let count = self.count(MIN_PACKET_ID, || {
                format!("sessions[{i}].inbound_qos2 count")
            })?;
            inbound_qos2.reserve(count.min(MAX_PREALLOCATE));
            let mut seen = HashSet::new();
            for j in 0..count {
                let id =
                    self.packet_id(&mut seen, || format!("sessions[{i}].inbound_qos2[{j}]"))?;
                inbound_qos2.push(id);
            }
        }

        let min_inflight = if version == 3 {
            MIN_V3_INFLIGHT
        } else {
            MIN_LEGACY_INFLIGHT
        };
        let count = self.count(min_inflight, || format!("sessions[{i}].inflight count"))?;
        let mut inflight = Vec::with_capacity(count.min(MAX_PREALLOCATE));
        let mut seen = HashSet::new();
        for j in 0..count {
            let path = || format!("sessions[{i}].inflight[{j}]");
            let message_path = || format!("{}.message", path());
            let packet_id = self.packet_id(&mut seen, || format!("{}.packet_id", path()))?;
            if version == 3 {
                let at = self.at();
                let code = self.u8(|| format!("{}.phase", path()))?;
                let phase = Phase::from_code(code).ok_or_else(|| DecodeError::UnknownPhase {
                    at,
                    field: format!("{}.phase", path()),
                    phase: code,
                })?;
                // The phase alone says whether a message follows: phase 3
                // (await PUBCOMP) keeps no topic or payload.
                let message = match phase.message_qos() {
                    Some(expected) => {
                        let message = self.message(version, &message_path)?;
                        if message.qos != expected {
                            return Err(DecodeError::PhaseQosMismatch {
                                // The QoS byte is the message's last.
                                at: self.at().saturating_sub(1),
                                field: format!("{}.qos", message_path()),
                                phase: code,
                                qos: message.qos,
                            });
                        }
                        Some(message)
                    }
                    None => None,
                };
                inflight.push(Inflight {
                    packet_id,
                    phase,
                    message,
                });
            } else {
                let message = self.message(version, &message_path)?;
                inflight.push(Inflight {
                    packet_id,
                    phase: Phase::AwaitPuback,
                    message: Some(message),
                });
            }
        }

        let min_message = if version == 3 {
            MIN_V3_MESSAGE
        } else {
            MIN_LEGACY_MESSAGE
        };
        let count = self.count(min_message, || format!("sessions[{i}].pending count"))?;
        let mut pending = Vec::with_capacity(count.min(MAX_PREALLOCATE));
        for j in 0..count {
            pending.push(self.message(version, &|| format!("sessions[{i}].pending[{j}]"))?);
        }

        let session = Session {
            client_id,
            principal,
            detach,
            next_packet_id,
            subscriptions,
            inbound_qos2,
            inflight,
            pending,
        };
        Ok((session, client_id_ref))
    }
}

/// Detach milliseconds: ASCII digits only, no sign, no leading zero (so
/// every value has exactly one spelling), within u64.
pub(super) fn parse_detach(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if !canonical {
        return None;
    }
    text.parse::<u64>().ok()
}
