//! Per-session delivery state: the packet identifier allocator, the ordered
//! outbound inflight table, the offline pending FIFO and the inbound QoS 2
//! identifiers (method B).

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::sync::Arc;

use super::consumer::{Consumer, ConsumerStart};
use super::detached::Detached;
use super::ids::{IdMap, IdSet};
use crate::broker::lazy::{empty, Lazy};
use crate::broker::long_lived;
use crate::broker::message::Message;
use crate::broker::small_map::SmallMap;
use crate::broker::subscriptions::{SessionKey, SubOptions};
use crate::topic;

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
    /// A boxed slice, not a `Vec`: a queue of many messages, most with
    /// none, holds no spare capacity's word for each.
    pub subscription_ids: Box<[u32]>,
    /// Its offset in the broadcast log, when a persistent session is owed
    /// it there (the session holds one reference to that entry). Offsets
    /// count from 1 (FORMAT.md), so it is 8 bytes where an `Option<u64>`
    /// is 16 ([`QueuedMessage::log_offset`] reads it).
    pub logged: Option<NonZeroU64>,
}

impl QueuedMessage {
    /// Its offset in the broadcast log, if a persistent session is owed it
    /// there.
    pub fn log_offset(&self) -> Option<u64> {
        self.logged.map(NonZeroU64::get)
    }

    /// What [`QueuedMessage::logged`] keeps of broadcast log offset
    /// `offset`. No offset is 0: the log's first is 1.
    pub fn logged_at(offset: Option<u64>) -> Option<NonZeroU64> {
        let logged = offset.and_then(NonZeroU64::new);
        debug_assert_eq!(logged.is_some(), offset.is_some(), "log offset 0");
        logged
    }

    /// What it counts against `limits.max_queued_bytes`
    /// ([`Message::queued_bytes`]).
    pub fn queued_bytes(&self) -> u64 {
        self.message.queued_bytes()
    }
}

/// The bounds of one session's queue, from `limits.max_queued_messages`
/// and `limits.max_queued_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBound {
    pub messages: usize,
    /// None: bounded by count alone.
    pub bytes: Option<u64>,
}

/// A session's QoS 1/2 messages waiting for a connection or for room in
/// its window, oldest first, with the bytes they count
/// ([`QueuedMessage::queued_bytes`]).
#[derive(Debug, Default)]
pub struct Pending {
    messages: VecDeque<QueuedMessage>,
    bytes: u64,
}

impl Pending {
    pub const fn new() -> Self {
        Self {
            messages: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Whether `queued` fits beside what waits: a message that would take
    /// the queue past either bound is not kept (a message larger than the
    /// byte bound is never queued).
    pub fn admits(&self, queued: &QueuedMessage, bound: QueueBound) -> bool {
        self.messages.len() < bound.messages
            && bound
                .bytes
                .is_none_or(|max| self.bytes + queued.queued_bytes() <= max)
    }

    pub fn push_back(&mut self, queued: QueuedMessage) {
        self.bytes += queued.queued_bytes();
        self.messages.push_back(queued);
    }

    pub fn pop_front(&mut self) -> Option<QueuedMessage> {
        let queued = self.messages.pop_front()?;
        self.bytes -= queued.queued_bytes();
        Some(queued)
    }

    /// Moves every message of `other` behind this queue's.
    pub fn append(&mut self, other: &mut Pending) {
        self.bytes += std::mem::take(&mut other.bytes);
        self.messages.append(&mut other.messages);
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The bytes its messages count against `limits.max_queued_bytes`.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn iter(&self) -> impl Iterator<Item = &QueuedMessage> {
        self.messages.iter()
    }
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
    /// Not yet sent again on the session's present connection: the session
    /// resumed with more exchanges unfinished than its client's window
    /// now takes (a client that came back with a smaller Receive Maximum),
    /// so it is resent once the window has room ([`Inflight::resume`]).
    pub unsent: bool,
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
            log_offset: queued.log_offset(),
            queued: Some(queued),
            channel,
            unsent: false,
        }
    }
}

/// Outbound exchanges in the order they were started: replayed in that order
/// on resume.
///
/// Packet identifiers are handed out in turn from a small range - twice
/// what is in flight, at least [`ID_SPAN`] - so the identifiers in use are
/// a bitmap of a few words rather than a hash set, and finding a free one
/// takes a step or two. Clients acknowledge in order as a rule, so the
/// entry an acknowledgement names is looked for from the oldest; the bitmap
/// turns an identifier that is not in flight away at once.
#[derive(Debug, Default)]
pub struct Inflight {
    entries: VecDeque<InflightEntry>,
    /// One bit per packet identifier in use, grown to the largest.
    used: Vec<u64>,
    next_id: u16,
    /// The last identifier handed out before they last went round to 1.
    last_before_round: u16,
    /// How many entries are [`InflightEntry::unsent`].
    unsent: usize,
}

/// The least range packet identifiers are handed out from.
const ID_SPAN: usize = 256;

impl Inflight {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many entries wait to be sent again on this connection.
    pub fn unsent(&self) -> usize {
        self.unsent
    }

    /// A resumed session's exchanges: the oldest `window` are sent again at
    /// once, the rest marked unsent. MQTT 5 counts a resent PUBLISH, and a
    /// PUBREL, against the Receive Maximum the client just gave
    /// (MQTT-3.3.4-9), which may be smaller than the one they were sent
    /// under.
    pub fn resume(&mut self, window: usize) {
        for (i, entry) in self.entries.iter_mut().enumerate() {
            entry.unsent = i >= window;
        }
        self.unsent = self.entries.len().saturating_sub(window);
    }

    /// The oldest unsent entry, now marked sent.
    pub fn take_unsent(&mut self) -> Option<&InflightEntry> {
        if self.unsent == 0 {
            return None;
        }
        let entry = self.entries.iter_mut().find(|e| e.unsent)?;
        entry.unsent = false;
        self.unsent -= 1;
        Some(entry)
    }

    fn in_use(&self, packet_id: u16) -> bool {
        let i = usize::from(packet_id);
        self.used
            .get(i / 64)
            .is_some_and(|word| word & (1 << (i % 64)) != 0)
    }

    fn set_used(&mut self, packet_id: u16, used: bool) {
        let i = usize::from(packet_id);
        if self.used.len() <= i / 64 {
            if !used {
                return;
            }
            self.used.resize(i / 64 + 1, 0);
        }
        if used {
            self.used[i / 64] |= 1 << (i % 64);
        } else {
            self.used[i / 64] &= !(1 << (i % 64));
        }
    }

    /// A packet identifier not used by any exchange in flight. None when all
    /// 65535 are taken.
    pub fn allocate_id(&mut self) -> Option<u16> {
        if self.entries.len() >= usize::from(u16::MAX) {
            return None;
        }
        // At most half the range is in use, so a free one is near.
        let span = (2 * self.entries.len() + 2).clamp(ID_SPAN, usize::from(u16::MAX)) as u16;
        loop {
            self.next_id = if self.next_id >= span {
                self.last_before_round = self.next_id;
                1
            } else {
                self.next_id + 1
            };
            if !self.in_use(self.next_id) {
                return Some(self.next_id);
            }
        }
    }

    pub fn push(&mut self, entry: InflightEntry) {
        self.set_used(entry.packet_id, true);
        self.entries.push_back(entry);
    }

    /// Where `packet_id`'s entry is. Identifiers are handed out in turn, so
    /// it is first looked for as far from the oldest as its identifier is
    /// from the oldest's (a PUBREC behind exchanges waiting for their
    /// PUBCOMP, say); failing that, from the front, since acknowledgements
    /// usually name the oldest.
    fn position(&self, packet_id: u16) -> Option<usize> {
        if !self.in_use(packet_id) {
            return None;
        }
        let oldest = self.entries.front()?.packet_id;
        let guess = if packet_id >= oldest {
            usize::from(packet_id - oldest)
        } else {
            // Handed out after the identifiers went round.
            (usize::from(self.last_before_round) + usize::from(packet_id))
                .saturating_sub(usize::from(oldest))
        };
        if self
            .entries
            .get(guess)
            .is_some_and(|e| e.packet_id == packet_id)
        {
            return Some(guess);
        }
        self.entries.iter().position(|e| e.packet_id == packet_id)
    }

    /// The entry for `packet_id`.
    pub fn get_mut(&mut self, packet_id: u16) -> Option<&mut InflightEntry> {
        let at = self.position(packet_id)?;
        self.entries.get_mut(at)
    }

    pub fn remove(&mut self, packet_id: u16) -> Option<InflightEntry> {
        self.remove_if(packet_id, |_| true)
    }

    /// Remove the entry for `packet_id` when `ends` says its exchange ends
    /// with what just came (a PUBACK ends one waiting for it, say).
    pub fn remove_if(
        &mut self,
        packet_id: u16,
        ends: impl FnOnce(&InflightEntry) -> bool,
    ) -> Option<InflightEntry> {
        let at = self.position(packet_id)?;
        if !ends(&self.entries[at]) {
            return None;
        }
        self.set_used(packet_id, false);
        // The front in O(1), as acknowledgements in order take it.
        let entry = self.entries.remove(at)?;
        if entry.unsent {
            self.unsent -= 1;
        }
        Some(entry)
    }

    pub fn iter(&self) -> impl Iterator<Item = &InflightEntry> {
        self.entries.iter()
    }
}

/// A subscription as the session holds it. The raw filter is the key of
/// the session's map, and its filter and share group are read from it:
/// kept again here, they were two strings and 48 bytes of every entry.
#[derive(Debug, Clone)]
pub struct SessionSubscription {
    pub options: SubOptions,
    /// The broadcast log's next offset when it was made: a message logged
    /// below it was not owed through this subscription.
    pub log_offset: u64,
    /// Where the filter begins in the raw filter: after `$share/<group>/`
    /// for a shared subscription, 0 otherwise.
    filter_at: u32,
}

impl SessionSubscription {
    /// A subscription to the valid raw filter `raw`.
    pub fn new(raw: &str, options: SubOptions, log_offset: u64) -> SessionSubscription {
        let filter = topic::split_shared(raw).map_or(raw, |(_, filter)| filter);
        SessionSubscription {
            options,
            log_offset,
            // A raw filter is an MQTT string, at most 65,535 bytes.
            filter_at: u32::try_from(raw.len() - filter.len()).unwrap_or(0),
        }
    }

    /// The filter, without a share's prefix, of `raw`, this
    /// subscription's key.
    pub fn filter<'a>(&self, raw: &'a str) -> &'a str {
        &raw[self.filter_at as usize..]
    }

    /// The share group named in `raw`, this subscription's key: what
    /// lies between `$share/` and the filter's `/`.
    pub fn share_group<'a>(&self, raw: &'a str) -> Option<&'a str> {
        let end = (self.filter_at as usize).checked_sub(1)?;
        raw.get(topic::SHARE_PREFIX.len()..end)
    }

    pub fn is_shared(&self) -> bool {
        self.filter_at > 0
    }
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
    /// Subscriptions by raw filter (`$share/G/f` included), in byte order:
    /// most sessions hold one or a few.
    pub subscriptions: SmallMap<String, SessionSubscription>,
    // The QoS 1/2 parts below are lazy: most clients of a broker never
    // use them, and each was 32-64 bytes of every session.
    pub inflight: Lazy<Inflight>,
    /// QoS 1/2 messages waiting for a connection or inflight room.
    pub pending: Lazy<Pending>,
    /// Seconds the session outlives its connection (0: ends with it).
    pub expiry_interval: u32,
    /// The connection currently attached, if any (set once its CONNACK
    /// went out): [`Session::connection`].
    attached: Option<NonZeroU64>,
    /// A connection whose CONNACK waits for the session's write:
    /// [`Session::connecting`].
    attaching: Option<NonZeroU64>,
    /// When a detached session expires.
    pub expires_at: Option<tokio::time::Instant>,
    /// The session provider holds a record of this session (it is
    /// persistent and its first write was issued): changes are written.
    /// Set before the session is kept, then by [`Sessions::set_stored`],
    /// which counts them.
    pub stored: bool,
    /// Its in-flight table or cursor changed since it was last written.
    pub dirty: bool,
    /// The Receive Maximum of its last connection: the window its in-flight
    /// table is written under.
    pub window: u16,
    /// Its places in the append channels it consumes (most sessions
    /// consume none).
    pub consumers: Lazy<Vec<super::consumer::Consumer>>,
    /// A bridge's name, a Will waiting for its delay, the inbound QoS 2
    /// holds: what few sessions use, in one part allocated the first time
    /// one of them is changed. Apart, they took five words of every
    /// session and the entry the allocator's 160-byte class.
    pub rare: Lazy<SessionRare>,
}

/// The part of a [`Session`] most sessions never use.
#[derive(Debug, Default)]
pub struct SessionRare {
    /// The bridge whose session this is (see `ConnectRequest::bridge`):
    /// [`Session::set_bridge`].
    bridge: Option<Arc<str>>,
    /// [`Session::set_pending_will`].
    pending_will: Option<Box<PendingWill>>,
    /// Inbound QoS 2 packet identifiers routed but not yet released (method
    /// B), with when each arrived (holds expire after `exactly_once.expires_after`).
    pub inbound_qos2: IdMap<u16, tokio::time::Instant>,
    /// Inbound QoS 2 publishes held in a channel until their PUBREL: the
    /// packet id and the channel's index (their times are in `inbound_qos2`).
    pub channel_holds: IdMap<u16, u16>,
    /// Those of `inbound_qos2` whose writes (their hold, their routing)
    /// are not yet answered, by packet id: `true` once a duplicate of one
    /// came on a later connection, which is owed the answer the writes
    /// get. A PUBREC says the publish is stored, so a duplicate is not
    /// answered before it is.
    pub writing: IdMap<u16, bool>,
}

empty!(
    Inflight,
    Inflight {
        entries: VecDeque::new(),
        used: Vec::new(),
        next_id: 0,
        last_before_round: 0,
        unsent: 0,
    }
);
empty!(Pending, Pending::new());
empty!(Vec<super::consumer::Consumer>, Vec::new());
empty!(
    SessionRare,
    SessionRare {
        bridge: None,
        pending_will: None,
        inbound_qos2: IdMap::with_hasher(std::hash::BuildHasherDefault::new()),
        channel_holds: IdMap::with_hasher(std::hash::BuildHasherDefault::new()),
        writing: IdMap::with_hasher(std::hash::BuildHasherDefault::new()),
    }
);

impl Session {
    pub fn new(client_id: Arc<str>, principal: Option<Arc<str>>) -> Self {
        Self {
            client_id,
            principal,
            subscriptions: SmallMap::new(),
            inflight: Lazy::new(),
            pending: Lazy::new(),
            expiry_interval: 0,
            attached: None,
            attaching: None,
            expires_at: None,
            stored: false,
            dirty: false,
            window: 1,
            consumers: Lazy::new(),
            rare: Lazy::new(),
        }
    }

    /// Keeps subscription `raw` (replacing and returning one of the same
    /// filter). Its key is copied here, with the map's growth among
    /// long-lived blocks as the session itself is ([`long_lived`]).
    pub fn subscribe(
        &mut self,
        raw: &str,
        sub: SessionSubscription,
    ) -> Option<SessionSubscription> {
        long_lived::make(|| self.subscriptions.insert(raw.to_owned(), sub))
    }

    /// The bridge whose session this is.
    pub fn bridge(&self) -> Option<&Arc<str>> {
        self.rare.bridge.as_ref()
    }

    /// Names the bridge whose session this is (`None`: a client's). Only a
    /// bridge's name allocates the rare part.
    pub fn set_bridge(&mut self, bridge: Option<Arc<str>>) {
        if let Some(rare) = self.rare_to_change(bridge.is_some()) {
            rare.bridge = bridge;
        }
    }

    /// The Will waiting for its delay, if any.
    pub fn pending_will(&self) -> Option<&PendingWill> {
        self.rare.pending_will.as_deref()
    }

    pub fn set_pending_will(&mut self, will: Option<Box<PendingWill>>) {
        if let Some(rare) = self.rare_to_change(will.is_some()) {
            rare.pending_will = will;
        }
    }

    pub fn take_pending_will(&mut self) -> Option<Box<PendingWill>> {
        self.take_pending_will_if(|_| true)
    }

    /// Takes the Will waiting for its delay when `due` says it is due.
    pub fn take_pending_will_if(
        &mut self,
        due: impl FnOnce(&PendingWill) -> bool,
    ) -> Option<Box<PendingWill>> {
        self.rare
            .allocated_mut()?
            .pending_will
            .take_if(|will| due(will))
    }

    /// The rare part to change: `None` when it is unallocated and the
    /// change would leave it empty (`allocate` false), so clearing a
    /// field of a session that never set one allocates nothing.
    fn rare_to_change(&mut self, allocate: bool) -> Option<&mut SessionRare> {
        match allocate {
            true => Some(&mut self.rare),
            false => self.rare.allocated_mut(),
        }
    }

    /// When a detached session next needs looking at: its Will's delay
    /// or its expiry, whichever passes first.
    pub fn next_due(&self) -> Option<tokio::time::Instant> {
        let will = self.pending_will().map(|w| w.publish_at);
        match (will, self.expires_at) {
            (Some(will), Some(expiry)) => Some(will.min(expiry)),
            (will, expiry) => will.or(expiry),
        }
    }

    /// The connection attached, if any.
    pub fn connection(&self) -> Option<u64> {
        self.attached.map(NonZeroU64::get)
    }

    /// The connection whose CONNACK waits for the session's write, if any.
    pub fn connecting(&self) -> Option<u64> {
        self.attaching.map(NonZeroU64::get)
    }

    pub fn set_connection(&mut self, connection: Option<u64>) {
        self.attached = connection.map(connection_id);
    }

    pub fn set_connecting(&mut self, connection: Option<u64>) {
        self.attaching = connection.map(connection_id);
    }
}

/// A connection id as a session keeps it. Ids start at 1 (the server and
/// the bridges number connections from one counter), so "none" needs no
/// tag of its own: 8 bytes where an `Option<u64>` takes 16, twice in every
/// session.
fn connection_id(id: u64) -> NonZeroU64 {
    NonZeroU64::new(id).expect("connection ids start at 1")
}

/// Every session the broker keeps, connected or not, and how they are
/// found: by key, by client id, and those waiting without a connection.
#[derive(Debug)]
pub(super) struct Sessions {
    pub by_key: IdMap<SessionKey, Box<Session>>,
    /// Which session a client id has ([`Sessions::of_client`]); kept in
    /// step with `by_key` by [`Sessions::insert`] and [`Sessions::remove`].
    by_client_id: ClientIds,
    /// Sessions without a connection, by when each is next due (its
    /// Will's delay, its expiry).
    pub detached: Detached,
    /// The key the next new session takes.
    pub next_key: SessionKey,
    /// Numbers the client ids the broker assigns.
    pub next_assigned_id: u64,
    /// Sessions that took an inbound QoS 2 hold since the last look at
    /// their age (`BrokerState::tick`): every one holding any is here,
    /// and the look is at them, not at every session.
    holding: IdSet<SessionKey>,
    /// How many of the sessions are stored: a new persistent session is
    /// refused at `limits.max_sessions`, and counting them at every such
    /// CONNECT cost each one a look at every session.
    stored: usize,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            by_key: IdMap::default(),
            by_client_id: ClientIds::default(),
            detached: Detached::default(),
            next_key: 1,
            next_assigned_id: 1,
            holding: IdSet::default(),
            stored: 0,
        }
    }
}

impl Sessions {
    /// The key of the session client `client_id` has, if any.
    pub(super) fn of_client(&self, client_id: &str) -> Option<SessionKey> {
        self.by_client_id.get(client_id, &self.by_key)
    }

    /// Room for `more` sessions: a restart knows how many it brings back,
    /// and tables grown one doubling at a time rehashed every client id at
    /// each (a tenth of restoring 100,000 sessions).
    pub(super) fn reserve(&mut self, more: usize) {
        self.by_key.reserve(more);
        self.detached.reserve(more);
        self.by_client_id.reserve(more, &self.by_key);
    }

    /// Keep `session` under `key`, as the session its client id has.
    pub(super) fn insert(&mut self, key: SessionKey, session: Box<Session>) {
        self.stored += usize::from(session.stored);
        if let Some(old) = self.by_key.insert(key, session) {
            // A key is never reused; were it, its old client id goes too.
            self.stored -= usize::from(old.stored);
            self.by_client_id.remove(&old.client_id, key, &self.by_key);
        }
        self.by_client_id.insert(key, &self.by_key);
    }

    /// Session `key` has no connection: it is due when its Will's delay
    /// or its expiry passes, whichever comes first.
    pub(super) fn detach(&mut self, key: SessionKey) {
        let at = self.by_key.get(&key).and_then(|s| s.next_due());
        self.detached.insert(key, at);
    }

    /// Session `key` has a connection again: no longer due. Called before
    /// its Will or expiry is cleared, as its moment is read from them.
    pub(super) fn attach(&mut self, key: SessionKey) {
        let at = self.by_key.get(&key).and_then(|s| s.next_due());
        self.detached.remove(key, at);
    }

    /// Take out the session under `key`, and its client id's entry when
    /// that is this session.
    pub(super) fn remove(&mut self, key: SessionKey) -> Option<Box<Session>> {
        let client_id = self.by_key.get(&key)?.client_id.clone();
        // Out of the client ids first: their table finds a key's client id
        // in `by_key`.
        self.by_client_id.remove(&client_id, key, &self.by_key);
        let session = self.by_key.remove(&key)?;
        self.stored -= usize::from(session.stored);
        Some(session)
    }

    /// Session `key` holds inbound QoS 2 `packet_id`, from `at`, until its
    /// PUBREL or its hold's expiry.
    pub(super) fn hold_inbound(
        &mut self,
        key: SessionKey,
        packet_id: u16,
        at: tokio::time::Instant,
    ) -> Option<&mut Session> {
        let session = self.by_key.get_mut(&key)?;
        session.rare.inbound_qos2.insert(packet_id, at);
        self.holding.insert(key);
        Some(session)
    }

    /// The sessions that may hold inbound QoS 2 publishes, in key order,
    /// taken out: whoever looks at them hands back those still holding
    /// any ([`Sessions::still_holding`]).
    pub(super) fn take_holding(&mut self) -> Vec<SessionKey> {
        debug_assert!(
            self.by_key
                .iter()
                .all(|(key, s)| s.rare.inbound_qos2.is_empty() || self.holding.contains(key)),
            "an inbound QoS 2 hold was taken without Sessions::hold_inbound"
        );
        let mut keys: Vec<SessionKey> = std::mem::take(&mut self.holding).into_iter().collect();
        keys.sort_unstable();
        keys
    }

    pub(super) fn still_holding(&mut self, key: SessionKey) {
        self.holding.insert(key);
    }

    /// Whether session `key` is stored from now.
    pub(super) fn set_stored(&mut self, key: SessionKey, stored: bool) {
        if let Some(session) = self.by_key.get_mut(&key) {
            if session.stored != stored {
                session.stored = stored;
                match stored {
                    true => self.stored += 1,
                    false => self.stored -= 1,
                }
            }
        }
    }

    /// Where session `key`'s consumer of `channel` is among its consumers.
    pub(super) fn consumer_index(&self, key: SessionKey, channel: u16) -> Option<usize> {
        self.by_key
            .get(&key)?
            .consumers
            .iter()
            .position(|c| c.channel == channel)
    }

    /// Session `key`'s consumer of `channel`, if it consumes it.
    pub(super) fn consumer_mut(&mut self, key: SessionKey, channel: u16) -> Option<&mut Consumer> {
        self.by_key
            .get_mut(&key)?
            .consumers
            .iter_mut()
            .find(|c| c.channel == channel)
    }

    /// Consumer `index` of session `key`, looked up before by the caller.
    pub(super) fn consumer_at(&mut self, key: SessionKey, index: usize) -> &mut Consumer {
        &mut self.by_key.get_mut(&key).expect("looked up").consumers[index]
    }

    /// Persistent sessions the provider holds (or is about to).
    pub(super) fn stored_count(&self) -> usize {
        debug_assert_eq!(
            self.stored,
            self.by_key.values().filter(|s| s.stored).count(),
            "a session's `stored` was changed without Sessions::set_stored"
        );
        self.stored
    }

    /// Does a delivery to `key` need the message in the broadcast log?
    pub(super) fn owed_durably(&self, key: SessionKey, qos: u8) -> bool {
        qos > 0 && self.by_key.get(&key).is_some_and(|s| s.stored)
    }

    /// The consumer `start` made had its position written with its
    /// SUBSCRIBE: the flush need not write it again.
    pub(super) fn started_stored(&mut self, key: SessionKey, start: &ConsumerStart) {
        let (Some(offset), Some(index)) = (start.stored, self.consumer_index(key, start.channel))
        else {
            return;
        };
        if let Some(session) = self.by_key.get_mut(&key) {
            session.consumers[index].stored = Some(offset);
        }
    }

    /// The value at `offset` of `channel` owed to `key` was sent or
    /// dropped: its position no longer waits for it.
    pub(super) fn value_done(&mut self, key: SessionKey, channel: u16, offset: u64) {
        if let Some(index) = self.consumer_index(key, channel) {
            let session = self.by_key.get_mut(&key).expect("indexed");
            session.consumers[index].owed_done(offset);
        }
    }
}

/// Which session each client id has: a table of session keys, each found
/// by its session's client id. A slot is the key alone (8 bytes, not the
/// 24 of a map from the client id): the table holds one for every session,
/// among them every idle device's.
///
/// Every key in the table is in the sessions it is given, so a key's hash
/// can always be made again from its session's client id.
#[derive(Default)]
struct ClientIds {
    table: hashbrown::HashTable<SessionKey>,
    /// Keyed per broker, as a map from the client id would be: client ids
    /// come from clients.
    hasher: std::hash::RandomState,
}

impl std::fmt::Debug for ClientIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIds")
            .field("len", &self.table.len())
            .finish_non_exhaustive()
    }
}

impl ClientIds {
    fn hash(&self, client_id: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, client_id)
    }

    fn get(
        &self,
        client_id: &str,
        sessions: &IdMap<SessionKey, Box<Session>>,
    ) -> Option<SessionKey> {
        self.table
            .find(self.hash(client_id), is_of(client_id, sessions))
            .copied()
    }

    /// Make `key` (in `sessions`) the session of its client id.
    fn insert(&mut self, key: SessionKey, sessions: &IdMap<SessionKey, Box<Session>>) {
        let Some(session) = sessions.get(&key) else {
            return;
        };
        let client_id = &*session.client_id;
        let hash = self.hash(client_id);
        match self.table.find_mut(hash, is_of(client_id, sessions)) {
            Some(entry) => *entry = key,
            None => {
                self.table
                    .insert_unique(hash, key, rehash(&self.hasher, sessions));
            }
        }
    }

    /// Room for `more` client ids without growing.
    fn reserve(&mut self, more: usize, sessions: &IdMap<SessionKey, Box<Session>>) {
        self.table.reserve(more, rehash(&self.hasher, sessions));
    }

    /// Forget `client_id`'s entry if it is `key`.
    fn remove(
        &mut self,
        client_id: &str,
        key: SessionKey,
        sessions: &IdMap<SessionKey, Box<Session>>,
    ) {
        let hash = self.hash(client_id);
        if let Ok(entry) = self.table.find_entry(hash, |&k| k == key) {
            entry.remove();
        } else {
            debug_assert!(self.get(client_id, sessions) != Some(key));
        }
    }
}

/// A stored key's hash, from its session's client id, for moving the
/// table's entries when it grows.
fn rehash<'a>(
    hasher: &'a std::hash::RandomState,
    sessions: &'a IdMap<SessionKey, Box<Session>>,
) -> impl Fn(&SessionKey) -> u64 + 'a {
    move |k| {
        // Every key is in `sessions`; one that were not would only be
        // lost to lookups, never found wrongly.
        sessions.get(k).map_or(0, |s| {
            std::hash::BuildHasher::hash_one(hasher, &*s.client_id)
        })
    }
}

/// Whether a key in the table is `client_id`'s session.
fn is_of<'a>(
    client_id: &'a str,
    sessions: &'a IdMap<SessionKey, Box<Session>>,
) -> impl Fn(&SessionKey) -> bool + 'a {
    move |k| sessions.get(k).is_some_and(|s| *s.client_id == *client_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clearing a rare field of a session that never set one (every
    /// CONNECT clears the bridge and the pending Will) allocates nothing;
    /// setting one does, and reads back.
    #[test]
    fn only_setting_a_rare_field_allocates_the_rare_part() {
        let mut session = Session::new("device-7".into(), None);
        session.set_bridge(None);
        session.set_pending_will(None);
        assert!(session.take_pending_will().is_none());
        assert!(session.take_pending_will_if(|_| true).is_none());
        assert!(session.bridge().is_none() && session.pending_will().is_none());
        assert!(!session.rare.is_allocated());
        session.set_bridge(Some("edge".into()));
        assert!(session.rare.is_allocated());
        assert_eq!(session.bridge().map(|b| &**b), Some("edge"));
        session.set_bridge(None);
        assert!(session.bridge().is_none());
    }

    fn entry(packet_id: u16) -> InflightEntry {
        InflightEntry {
            packet_id,
            phase: InflightPhase::AwaitPuback,
            qos: 1,
            log_offset: None,
            queued: None,
            channel: None,
            unsent: false,
        }
    }

    /// The client ids find their sessions as the table grows past its
    /// first sizes, as a session is ended, and as a key is replaced.
    #[test]
    fn a_client_id_finds_its_session() {
        let mut sessions = Sessions::default();
        for key in 1..=1_000u64 {
            let id: Arc<str> = format!("device-{key}").into();
            sessions.insert(key, Box::new(Session::new(id, None)));
        }
        assert_eq!(sessions.of_client("device-1"), Some(1));
        assert_eq!(sessions.of_client("device-1000"), Some(1_000));
        assert_eq!(sessions.of_client("device-1001"), None);
        assert_eq!(sessions.of_client(""), None);

        let ended = sessions.remove(500).unwrap();
        assert_eq!(&*ended.client_id, "device-500");
        assert_eq!(sessions.of_client("device-500"), None);
        assert!(sessions.remove(500).is_none());

        // The same client starts a new session: its id names the new key.
        sessions.insert(1_001, Box::new(Session::new("device-7".into(), None)));
        assert_eq!(sessions.of_client("device-7"), Some(1_001));
        // The old session ending leaves the new one found.
        sessions.remove(7).unwrap();
        assert_eq!(sessions.of_client("device-7"), Some(1_001));
        assert_eq!(sessions.by_client_id.table.len(), 999);
        for key in (1..=1_000u64).filter(|k| *k != 500 && *k != 7) {
            assert_eq!(sessions.of_client(&format!("device-{key}")), Some(key));
        }
    }

    #[test]
    fn ids_skip_those_in_flight_and_zero() {
        let mut inflight = Inflight::default();
        let a = inflight.allocate_id().unwrap();
        assert_eq!(a, 1);
        inflight.push(entry(a));
        inflight.next_id = 0;
        assert_eq!(inflight.allocate_id(), Some(2));
        inflight.next_id = u16::MAX;
        assert_eq!(inflight.allocate_id(), Some(2));
        assert!(inflight.remove(1).is_some());
        assert!(inflight.remove(1).is_none());
        assert!(inflight.is_empty());
    }

    /// Identifiers go round a small range, never one in use, whatever order
    /// the acknowledgements come in; restored identifiers far above the
    /// range are in use like any other.
    #[test]
    fn ids_go_round_a_small_range_around_those_in_flight() {
        let mut inflight = Inflight::default();
        inflight.push(entry(60_000));
        inflight.push(entry(2));
        let mut live = vec![60_000u16, 2];
        for round in 0..2_000u32 {
            let id = inflight.allocate_id().unwrap();
            assert!(!live.contains(&id), "{id} handed out twice");
            assert!(usize::from(id) <= ID_SPAN, "{id}");
            inflight.push(entry(id));
            live.push(id);
            if live.len() > 100 {
                // Out of order now and then: not always the oldest.
                let at = if round % 7 == 0 { live.len() / 2 } else { 1 };
                let gone = live.remove(at);
                assert_eq!(inflight.remove(gone).map(|e| e.packet_id), Some(gone));
            }
            assert_eq!(inflight.len(), live.len());
        }
        assert_eq!(inflight.get_mut(60_000).map(|e| e.packet_id), Some(60_000));
        assert!(inflight.get_mut(0).is_none());
        assert!(inflight.remove_if(60_000, |_| false).is_none());
        assert!(inflight.remove_if(60_000, |_| true).is_some());
        assert!(inflight.get_mut(60_000).is_none());
        let order: Vec<u16> = inflight.iter().map(|e| e.packet_id).collect();
        assert_eq!(order, live[1..]);
    }

    /// With more in flight than the least range, the range grows to twice
    /// that; all 65535 identifiers can be taken, and then none is left.
    #[test]
    fn every_id_can_be_in_flight() {
        let mut inflight = Inflight::default();
        let mut seen = IdSet::default();
        while let Some(id) = inflight.allocate_id() {
            assert_ne!(id, 0);
            assert!(seen.insert(id), "{id} handed out twice");
            inflight.push(entry(id));
        }
        assert_eq!(inflight.len(), usize::from(u16::MAX));
        assert!(inflight.remove(40_000).is_some());
        assert_eq!(inflight.allocate_id(), Some(40_000));
    }
}
