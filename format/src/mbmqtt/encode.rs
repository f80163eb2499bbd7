//! The Disk V3 encoder. saguin never writes a legacy broker's file in
//! operation; this exists for golden fixtures, tests and fuzzing, and it
//! refuses every model the decoder would refuse, so whatever it writes reads
//! back as the same model.

use super::{
    decode, DecodeError, Detach, EncodeError, Message, Phase, Principal, Snapshot, CURRENT_VERSION,
    MAGIC,
};

/// Encode `snapshot` as a whole Disk V3 file, envelope included, whatever
/// version it was read from.
pub fn encode(snapshot: &Snapshot) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer { out: Vec::new() };
    w.u32(u32::from(CURRENT_VERSION));
    w.count(snapshot.sessions.len(), || "session count".into())?;
    for s in &snapshot.sessions {
        let id = || s.client_id.clone();
        w.string(&s.client_id, || "client id".into())?;
        match &s.principal {
            Principal::Named(name) => w.string(name, || format!("session {:?} principal", id()))?,
            Principal::LegacyAnonymous => {
                return Err(EncodeError::LegacyAnonymousPrincipal { client_id: id() })
            }
        }
        match s.detach {
            Detach::Millis(ms) => w.string(&ms.to_string(), String::new)?,
            Detach::Unknown => return Err(EncodeError::UnknownDetach { client_id: id() }),
        }
        w.u16(s.next_packet_id);
        w.count(s.subscriptions.len(), || {
            format!("session {:?} subscriptions", id())
        })?;
        for sub in &s.subscriptions {
            w.string(&sub.filter, || format!("session {:?} filter", id()))?;
            w.u8(sub.qos);
        }
        w.count(s.inbound_qos2.len(), || {
            format!("session {:?} inbound QoS 2", id())
        })?;
        for pid in &s.inbound_qos2 {
            w.u16(*pid);
        }
        w.count(s.inflight.len(), || format!("session {:?} inflight", id()))?;
        for entry in &s.inflight {
            w.u16(entry.packet_id);
            w.u8(entry.phase.code());
            match (entry.phase, &entry.message) {
                (Phase::AwaitPubcomp, None) => {}
                (Phase::AwaitPubcomp, Some(_)) => {
                    return Err(EncodeError::Phase3WithMessage {
                        client_id: id(),
                        packet_id: entry.packet_id,
                    })
                }
                (phase, None) => {
                    return Err(EncodeError::MessageMissing {
                        client_id: id(),
                        packet_id: entry.packet_id,
                        phase: phase.code(),
                    })
                }
                (_, Some(m)) => w.message(m)?,
            }
        }
        w.count(s.pending.len(), || format!("session {:?} pending", id()))?;
        for m in &s.pending {
            w.message(m)?;
        }
    }
    w.count(snapshot.retained.len(), || "retained count".into())?;
    for r in &snapshot.retained {
        w.string(&r.topic, || "retained topic".into())?;
        w.bytes(&r.payload, || format!("retained {:?} payload", r.topic))?;
        w.u8(r.qos);
    }
    let file = seal(CURRENT_VERSION, &w.out);
    // The decoder is the definition of a valid file: a model that breaks one
    // of its rules (a duplicate id, a QoS out of range) is refused here
    // rather than written.
    decode(&file).map_err(|e: DecodeError| EncodeError::Invalid(e))?;
    Ok(file)
}

/// The 24-byte envelope around `payload`: magic, version, zero flags,
/// length, IEEE CRC-32 of the payload.
pub fn seal(version: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(super::ENVELOPE_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

struct Writer {
    out: Vec<u8>,
}

impl Writer {
    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }
    fn count(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<(), EncodeError> {
        let n = u32::try_from(n).map_err(|_| EncodeError::TooLong {
            what: what(),
            len: n,
        })?;
        self.u32(n);
        Ok(())
    }
    fn bytes(&mut self, b: &[u8], what: impl FnOnce() -> String) -> Result<(), EncodeError> {
        self.count(b.len(), what)?;
        self.out.extend_from_slice(b);
        Ok(())
    }
    fn string(&mut self, s: &str, what: impl FnOnce() -> String) -> Result<(), EncodeError> {
        self.bytes(s.as_bytes(), what)
    }
    fn message(&mut self, m: &Message) -> Result<(), EncodeError> {
        self.string(&m.topic, || "message topic".into())?;
        self.bytes(&m.payload, || format!("message {:?} payload", m.topic))?;
        self.u8(u8::from(m.retain));
        self.u8(m.qos);
        Ok(())
    }
}
