//! An MBMQTT01 `broker.snapshot` as saguin units: what saguin keeps for a
//! persistent session, and the retained store.
//!
//! The mapping, where the legacy format and saguin's model differ:
//!
//! | MBMQTT01 | saguin |
//! | --- | --- |
//! | principal `Named("")` (V2/V3 anonymous) or `LegacyAnonymous` (V1) | no principal |
//! | principal `Named(name)` | principal `name` |
//! | detach epoch `Millis(ms)`, ms > 0 | detached at `ms` |
//! | detach `Unknown` (V1) or `Millis(0)` | detached at the moment of the import (the expiry window starts then, as the legacy broker started it when it first saw the session after loading) |
//! | (no expiry in the format: MQTT 3.1.1 persistent sessions) | expiry interval 4294967295 s ("never" in MQTT 5); the destination broker's `limits.max_session_expiry` bounds it, as it bounds every stored session |
//! | (no Receive Maximum) | window 65535, MQTT's default Receive Maximum |
//! | subscription filter and QoS | the same, with MQTT 5 options at their defaults (no-local off, retain-as-published off, retain handling 0, no subscription id), made at the start of the broadcast log |
//! | in-flight phase 1 (PUBACK owed) or 2 (PUBREC owed), with its message | the message in the broadcast log, owed to this session only, and an in-flight entry awaiting its acknowledgement with the same packet identifier and QoS |
//! | in-flight phase 3 (PUBCOMP owed, message no longer kept) | an empty message in the broadcast log under `$saguin/mbmqtt/pubcomp-owed`, QoS 2, owed to this session only, and an in-flight entry awaiting PUBCOMP: a resumed session is sent the PUBREL, never that message |
//! | pending (offline) messages, FIFO | messages in the broadcast log after the session's in-flight ones, owed to this session only, in the same order |
//! | (none) | the session's cursor in the log: its first owed message, or the log's end when it is owed nothing |
//! | next packet id | not carried: saguin chooses packet identifiers itself |
//! | inbound QoS 2 ids awaiting PUBREL | not carried (the format keeps no message to hold): counted and reported; the client's PUBREL is answered without a delivery |
//! | retained message (topic, payload, QoS) | a retained message with the retain flag set, numbered in file order |
//!
//! Every imported message has no publisher client id, no receipt time (0 =
//! unset, never too old), and a message id built from the import's moment
//! and its place in the log.

use bytes::Bytes;
use saguin_format::f21::{
    BroadcastFile, InflightEntry, InflightPhase, Position, RetainedFile, Session, SessionsFile,
    Subscription, READER_MQTT,
};
use saguin_format::mbmqtt::{self, Detach, Phase, Principal};
use saguin_format::model::{Record, UnixNanos};

use super::model::{Counts, Unit};

/// The expiry interval an imported session is granted (MQTT 5's "never"):
/// the destination's `limits.max_session_expiry` bounds it.
pub const IMPORTED_SESSION_EXPIRY: u32 = u32::MAX;
/// The window an imported session's in-flight table is written under.
pub const IMPORTED_WINDOW: u16 = u16::MAX;
/// The topic of the log entry standing for a phase-3 exchange.
pub const PUBCOMP_OWED_TOPIC: &str = "$saguin/mbmqtt/pubcomp-owed";

/// What the legacy file held, counted before the mapping: the counts in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LegacyCounts {
    pub version: u16,
    pub sessions: u64,
    pub subscriptions: u64,
    pub inflight: u64,
    pub pending: u64,
    pub retained: u64,
    /// Inbound QoS 2 ids, which are not carried.
    pub inbound_qos2_dropped: u64,
}

/// The import: the units, the legacy counts, and the counts each unit must
/// show when read back from the destination.
pub struct Imported {
    pub units: Vec<(Unit, Counts)>,
    pub legacy: LegacyCounts,
}

fn message_id(at: UnixNanos, n: u64) -> [u8; 16] {
    let mut id = [0u8; 16];
    let (a, b) = id.split_at_mut(8);
    a.copy_from_slice(&at.to_be_bytes());
    b.copy_from_slice(&n.to_be_bytes());
    id
}

/// Maps a decoded snapshot, as of `now`.
pub fn import(snapshot: &mbmqtt::Snapshot, now: UnixNanos) -> Imported {
    let mut legacy = LegacyCounts {
        version: snapshot.version_read,
        sessions: snapshot.sessions.len() as u64,
        retained: snapshot.retained.len() as u64,
        ..LegacyCounts::default()
    };
    let mut log = BroadcastFile::default();
    let mut sessions = Vec::with_capacity(snapshot.sessions.len());
    let mut next: u64 = 1;
    let mut push = |log: &mut BroadcastFile,
                    client: &str,
                    topic: &str,
                    payload: &[u8],
                    qos: u8,
                    retain: bool| {
        let offset = next;
        next += 1;
        let mut r = Record::new(topic, Bytes::copy_from_slice(payload));
        r.offset = offset;
        r.qos = qos;
        r.retain = retain;
        r.message_id = message_id(now, offset);
        r.owed_to = Some(client.to_owned());
        log.bytes += r.accounted_size();
        log.messages.push(r);
        offset
    };
    // Cursors are filled once the log's end is known.
    let mut cursors: Vec<(String, Option<u64>)> = Vec::with_capacity(snapshot.sessions.len());
    for s in &snapshot.sessions {
        legacy.subscriptions += s.subscriptions.len() as u64;
        legacy.inflight += s.inflight.len() as u64;
        legacy.pending += s.pending.len() as u64;
        legacy.inbound_qos2_dropped += s.inbound_qos2.len() as u64;
        let mut first = None;
        let mut inflight = Vec::with_capacity(s.inflight.len());
        for e in &s.inflight {
            let (offset, qos, phase) = match (&e.message, e.phase) {
                (Some(m), phase) => (
                    push(
                        &mut log,
                        &s.client_id,
                        &m.topic,
                        &m.payload,
                        m.qos,
                        m.retain,
                    ),
                    m.qos,
                    if phase == Phase::AwaitPubcomp {
                        InflightPhase::AwaitingComp
                    } else {
                        InflightPhase::AwaitingAck
                    },
                ),
                (None, _) => (
                    push(&mut log, &s.client_id, PUBCOMP_OWED_TOPIC, &[], 2, false),
                    2,
                    InflightPhase::AwaitingComp,
                ),
            };
            first.get_or_insert(offset);
            inflight.push(InflightEntry {
                log_offset: offset,
                packet_id: e.packet_id,
                qos,
                phase,
                shared_group: None,
            });
        }
        for m in &s.pending {
            let offset = push(
                &mut log,
                &s.client_id,
                &m.topic,
                &m.payload,
                m.qos,
                m.retain,
            );
            first.get_or_insert(offset);
        }
        cursors.push((s.client_id.clone(), first));
        let principal = match &s.principal {
            Principal::Named(name) if !name.is_empty() => Some(name.clone()),
            _ => None,
        };
        let detached_at = match s.detach {
            Detach::Millis(ms) if ms > 0 => i64::try_from(ms)
                .ok()
                .and_then(|ms| ms.checked_mul(1_000_000))
                .unwrap_or(now),
            _ => now,
        };
        sessions.push(Session {
            client_id: s.client_id.clone(),
            principal,
            expiry_interval: IMPORTED_SESSION_EXPIRY,
            detached_at,
            subscriptions: s
                .subscriptions
                .iter()
                .map(|x| Subscription {
                    filter: x.filter.clone(),
                    qos: x.qos,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                    subscription_id: None,
                    log_offset: 1,
                })
                .collect(),
            will: None,
            // Packet ids are unique and nonzero, so at most 65535 are in flight.
            window: IMPORTED_WINDOW,
            inflight,
        });
    }
    log.next = next;
    log.floor = 1;
    log.cursors = cursors
        .into_iter()
        .map(|(client, first)| Position {
            reader: format!("{READER_MQTT}{client}"),
            offset: first.unwrap_or(next),
            saved_at: 0,
            session_expiry: None,
        })
        .collect();
    sessions.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    log.cursors.sort_by(|a, b| a.reader.cmp(&b.reader));

    let mut units = Vec::new();
    if !snapshot.sessions.is_empty() {
        // The counts out are checked against the legacy file's counts, not
        // against the mapping's own output.
        let expected = Counts {
            next: legacy.inflight + legacy.pending + 1,
            floor: 1,
            records: legacy.inflight + legacy.pending,
            positions: legacy.sessions,
            sessions: legacy.sessions,
            inflight: legacy.inflight,
            ..Counts::default()
        };
        units.push((
            Unit::Sessions {
                sessions: SessionsFile {
                    sessions,
                    shared_groups: Vec::new(),
                },
                log,
            },
            expected,
        ));
    }
    if !snapshot.retained.is_empty() {
        let records = snapshot
            .retained
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut r = Record::new(m.topic.clone(), Bytes::copy_from_slice(&m.payload));
                r.offset = i as u64 + 1;
                r.qos = m.qos;
                r.retain = true;
                r.message_id = message_id(now, u64::MAX - i as u64);
                r
            })
            .collect();
        units.push((
            Unit::Retained(RetainedFile { records }),
            Counts {
                records: legacy.retained,
                ..Counts::default()
            },
        ));
    }
    Imported { units, legacy }
}
