//! Per-session delivery state: the packet identifier allocator, the ordered
//! outbound inflight table, the offline pending FIFO and the inbound QoS 2
//! identifiers (method B).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::broker::message::Message;
use crate::broker::topic::SubOptions;

/// A fast hasher for the integer keys the broker allocates (session keys,
/// connection generations) and for packet identifiers (at most 65535 per
/// session): a multiply-rotate mix instead of SipHash on the hot path.
/// Strings a client chooses (client ids) keep the standard hasher.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const ID_HASH_K: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(ID_HASH_K);
        }
    }
    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(ID_HASH_K);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Maps and sets keyed by broker-allocated integers or packet ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// Where an outbound QoS 1/2 exchange stands.
#[derive(Debug, Clone)]
pub enum InflightPhase {
    /// QoS 1 PUBLISH sent, waiting for PUBACK.
    AwaitPuback,
    /// QoS 2 PUBLISH sent, waiting for PUBREC.
    AwaitPubrec,
    /// PUBREL sent, waiting for PUBCOMP; the message is released.
    AwaitPubcomp,
}

/// A message handed to a session, with what its subscriptions made of it.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    pub message: Arc<Message>,
    pub qos: u8,
    pub retain: bool,
    pub subscription_ids: Vec<u32>,
    /// Its offset in the broadcast log, when a persistent session is owed
    /// it there (the session holds one reference to that entry).
    pub log_offset: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct InflightEntry {
    pub packet_id: u16,
    pub phase: InflightPhase,
    /// 1 or 2.
    pub qos: u8,
    /// Its offset in the broadcast log (persistent sessions only); kept
    /// after PUBREC so the stored in-flight table still names it.
    pub log_offset: Option<u64>,
    /// None once PUBREC released it.
    pub queued: Option<QueuedMessage>,
    /// A channel record delivered to a consumer: the channel's index and
    /// the record's offset. Never stored with the session: a consumer
    /// resumes from its position, which this exchange holds back.
    pub channel: Option<(u16, u64)>,
}

impl InflightEntry {
    /// A QoS 1/2 delivery just sent: waiting for its PUBACK or PUBREC.
    pub fn sent(packet_id: u16, queued: QueuedMessage, channel: Option<(u16, u64)>) -> Self {
        InflightEntry {
            packet_id,
            phase: if queued.qos == 1 {
                InflightPhase::AwaitPuback
            } else {
                InflightPhase::AwaitPubrec
            },
            qos: queued.qos,
            log_offset: queued.log_offset,
            queued: Some(queued),
            channel,
        }
    }
}

/// Outbound exchanges in the order they were started: replayed in that order
/// on resume.
#[derive(Debug, Default)]
pub struct Inflight {
    entries: VecDeque<InflightEntry>,
    ids: IdSet<u16>,
    next_id: u16,
}

impl Inflight {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A packet identifier not used by any exchange in flight. None when all
    /// 65535 are taken.
    pub fn allocate_id(&mut self) -> Option<u16> {
        if self.ids.len() >= usize::from(u16::MAX) {
            return None;
        }
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            if self.next_id == 0 {
                continue;
            }
            if !self.ids.contains(&self.next_id) {
                return Some(self.next_id);
            }
        }
    }

    pub fn push(&mut self, entry: InflightEntry) {
        self.ids.insert(entry.packet_id);
        self.entries.push_back(entry);
    }

    /// The entry for `packet_id`; acknowledgements usually name the oldest,
    /// so the search starts at the front.
    pub fn get_mut(&mut self, packet_id: u16) -> Option<&mut InflightEntry> {
        if !self.ids.contains(&packet_id) {
            return None;
        }
        self.entries.iter_mut().find(|e| e.packet_id == packet_id)
    }

    pub fn remove(&mut self, packet_id: u16) -> Option<InflightEntry> {
        if !self.ids.remove(&packet_id) {
            return None;
        }
        let at = self.entries.iter().position(|e| e.packet_id == packet_id)?;
        self.entries.remove(at)
    }

    pub fn iter(&self) -> impl Iterator<Item = &InflightEntry> {
        self.entries.iter()
    }
}

/// A subscription as the session holds it (the raw filter is the key).
#[derive(Debug, Clone)]
pub struct SessionSubscription {
    pub share_group: Option<String>,
    pub filter: String,
    pub options: SubOptions,
    /// The broadcast log's next offset when it was made: a message logged
    /// below it was not owed through this subscription.
    pub log_offset: u64,
}

/// A Will waiting for its delay to pass.
#[derive(Debug, Clone)]
pub struct PendingWill {
    pub message: Arc<Message>,
    pub publish_at: tokio::time::Instant,
    /// The Will as its CONNECT carried it, for the stored session.
    pub will: super::WillRequest,
}

/// One MQTT session: lives across connections when persistent.
#[derive(Debug)]
pub struct Session {
    pub client_id: Arc<str>,
    /// The authenticated user that owns it (None: anonymous). Only the same
    /// principal may take it over or end it.
    pub principal: Option<Arc<str>>,
    /// Subscriptions by raw filter (`$share/G/f` included), in byte order.
    pub subscriptions: BTreeMap<String, SessionSubscription>,
    pub inflight: Inflight,
    /// QoS 1/2 messages waiting for a connection or inflight room.
    pub pending: VecDeque<QueuedMessage>,
    /// Inbound QoS 2 packet identifiers routed but not yet released (method
    /// B), with when each arrived (holds expire after `exactly_once.expires_after`).
    pub inbound_qos2: IdMap<u16, tokio::time::Instant>,
    /// Seconds the session outlives its connection (0: ends with it).
    pub expiry_interval: u32,
    /// The connection currently attached, if any (set once its CONNACK
    /// went out).
    pub connection: Option<u64>,
    /// A connection whose CONNACK waits for the session's write.
    pub connecting: Option<u64>,
    /// When a detached session expires.
    pub expires_at: Option<tokio::time::Instant>,
    pub pending_will: Option<PendingWill>,
    /// The session provider holds a record of this session (it is
    /// persistent and its first write was issued): changes are written.
    pub stored: bool,
    /// Its in-flight table or cursor changed since it was last written.
    pub dirty: bool,
    /// The Receive Maximum of its last connection: the window its in-flight
    /// table is written under.
    pub window: u16,
    /// Its places in the append channels it consumes.
    pub consumers: Vec<super::channel::Consumer>,
    /// The bridge whose session this is (see `ConnectRequest::bridge`).
    pub bridge: Option<Arc<str>>,
    /// Inbound QoS 2 publishes held in a channel until their PUBREL: the
    /// packet id and the channel's index (their times are in `inbound_qos2`).
    pub channel_holds: IdMap<u16, u16>,
}

impl Session {
    pub fn new(client_id: Arc<str>, principal: Option<Arc<str>>) -> Self {
        Self {
            client_id,
            principal,
            subscriptions: BTreeMap::new(),
            inflight: Inflight::default(),
            pending: VecDeque::new(),
            inbound_qos2: IdMap::default(),
            expiry_interval: 0,
            connection: None,
            connecting: None,
            expires_at: None,
            pending_will: None,
            stored: false,
            dirty: false,
            window: 1,
            consumers: Vec::new(),
            bridge: None,
            channel_holds: IdMap::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_skip_those_in_flight_and_zero() {
        let mut inflight = Inflight::default();
        let a = inflight.allocate_id().unwrap();
        assert_eq!(a, 1);
        inflight.push(InflightEntry {
            packet_id: a,
            phase: InflightPhase::AwaitPuback,
            qos: 1,
            log_offset: None,
            queued: None,
            channel: None,
        });
        inflight.next_id = 0;
        assert_eq!(inflight.allocate_id(), Some(2));
        inflight.next_id = u16::MAX;
        assert_eq!(inflight.allocate_id(), Some(2));
        assert!(inflight.remove(1).is_some());
        assert!(inflight.remove(1).is_none());
        assert!(inflight.is_empty());
    }
}
