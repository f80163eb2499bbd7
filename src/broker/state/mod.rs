//! The broker state: every session, subscription and retained message, owned
//! by one task (single writer). It holds no sockets, tasks, clocks or
//! storage: it consumes [`Event`]s stamped with a time and answers by
//! queueing [`Outbound`] packets on each connection's bounded queue and by
//! emitting [`Intent`]s, the writes its storage providers must commit.
//! Tests drive it directly with events and read those queues.
//!
//! Connections are named by a generation number allocated once per accepted
//! transport. A session remembers the generation attached to it; an event
//! from any other generation (a taken-over or already closed connection) is
//! ignored.
//!
//! **Acknowledged only after commit** (invariant 18). A packet whose
//! handling writes something (a persistent session begun or changed, a
//! retained value, a QoS 2 hold, a message persistent sessions are owed in
//! the broadcast log) emits an [`Intent`] with a ticket and parks what it
//! owes the client - the CONNACK, SUBACK, PUBACK, PUBREC, PUBCOMP and the
//! fan-out of a publish - in the connection's queue of answers until
//! [`Event::Committed`] for that ticket arrives. Packets are handled as they
//! arrive (a publisher's next publish need not wait for the previous one's
//! commit: their writes share transactions), and answers leave the queue
//! only from its front, so one client's packets are answered, and its
//! publishes fanned out, in the order they were sent. A failed write
//! answers MQTT 5 with 0x83 (0x97 when
//! the provider is full) and closes an MQTT 3.1.1 connection without the
//! acknowledgement. Packets that write nothing (QoS 0/1 to clean sessions,
//! acknowledgements of clean sessions) take no detour at all.
//!
//! **Rooms.** The state's fields are grouped by what they are about, each
//! group a struct that owns the methods touching only its own fields:
//! `Sessions` (`session.rs`), `Channels`
//! (`channel.rs`), `Groups` (`channel_share.rs`), `Queues` (`queue.rs`),
//! `LatestReads` (`latest.rs`), `Bridges` (`bridges.rs`), `ReadRequests`
//! (`reads.rs`) and `Persistence` (`persist.rs`). A method that moves
//! several of them is `BrokerState`'s, in the file of the flow it belongs
//! to: that is where one room's change reaches another (a commit hands a
//! record to consumers, groups and queues; a session's end lets go of its
//! consumers, groups and workers). [`BrokerState::handle`] is the one
//! dispatcher of events.
//!
//! The flows, by file: `connect` (CONNECT, takeover, resume),
//! `publish` (inbound PUBLISH, the QoS flows, routing and delivery
//! windows), `subscribe` (SUBSCRIBE, UNSUBSCRIBE, retained on subscribe),
//! `close` (connection end, Will, session end, timers, shutdown), `sys`
//! (`$SYS`), `persist` (intents out, commits in, the broadcast log's
//! references and the periodic flush), `channel`, `channel_share`,
//! `latest` and `queue` (what each kind of channel means to a client),
//! `positions` (consumers' stored positions) and `restore` (the state
//! rebuilt from what the providers hold).
//!
//! The types several state files share live in leaf modules that import
//! no other state file but leaves, so no two state files import each
//! other: `intent` (the protocol with the persisters: [`Role`], [`Write`],
//! [`Intent`], [`StorageFailure`], the parked answers), `reads` (reads of
//! records: [`ChannelRead`], [`ReadWindow`], [`Seek`]), `consumer` (a
//! session's place in a channel), `records` (messages as stored records),
//! `ids` (maps keyed by broker-allocated integers) and `session` (a
//! session's own state); the parts of a table entry allocated when first
//! changed are [`crate::broker::lazy`]'s.
//!
//! The session and connection tables hold an entry per client, boxed: a
//! table's spare room is then a pointer a slot rather than an entry. What
//! most clients never use (a Will, the QoS 1/2 queues and tables, answers
//! waiting for a commit, a retained backlog) is boxed or lazy, so an idle
//! client's entries are 192 and 104 bytes.

mod bridges;
mod catch_up;
mod channel;
mod channel_share;
pub mod clock;
mod close;
mod connect;
mod consumer;
mod detached;
mod following;
mod ids;
mod intent;
mod latest;
mod persist;
mod positions;
mod publish;
mod queue;
mod reads;
mod recent;
mod records;
mod restore;
pub mod retained;
pub mod session;
mod subscribe;
mod sys;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use saguin_format::model::UnixNanos;
use tokio::time::Instant;

use super::codec::ByteStr;
use super::message::MessageProperties;
use super::metrics::{CloseReason, Metrics};
use super::subscriptions::{Delivery, Match, SessionKey, SubOptions, SubscriptionIndex};
use crate::broker::lazy::{self, Lazy};
use bridges::Bridges;
use channel::Channels;
use channel_share::Groups;
use ids::IdMap;
use latest::LatestReads;
use queue::Queues;
use reads::ReadRequests;
use retained::{Retained, RetainedIndex};
use session::Sessions;

pub use consumer::{parse_from, FROM_PROPERTY, GAP_PROPERTY, OFFSET_PROPERTY};
pub use intent::{Class, Intent, Role, StorageFailure, Write, Written};
pub use reads::{ChannelRead, ReadWindow, Seek};
pub use records::unix_now;
pub use restore::{QueueSetup, RestoreSummary, Restored, RestoredChannel};

/// The reason codes the state answers with: the codec's own type (MQTT
/// 3.1.1 connections get the equivalent return code or nothing; the writer
/// maps them).
pub use super::codec::ReasonCode;

/// The broker's bounds, from `limits` in the configuration.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Cap on any session's expiry interval, seconds; also the expiry of a
    /// 3.1.1 session with clean session 0.
    pub max_session_expiry: u32,
    /// Announced to v5 clients: what they may send unacknowledged.
    pub receive_maximum: u16,
    /// The outbound inflight window: all of a 3.1.1 client's, and the
    /// most of a v5 client's Receive Maximum the broker uses.
    pub max_inflight_messages: u16,
    /// Per session, QoS 1/2 messages waiting (offline or beyond the inflight window).
    pub max_queued_messages: usize,
    /// Per session, the bytes of their topics and payloads; None: no bound.
    pub max_queued_bytes: Option<u64>,
    pub max_subscriptions_per_session: usize,
    /// Persistent sessions kept; a CONNECT that would start one more is
    /// refused with 0x97.
    pub max_sessions: usize,
    /// Retained topics; a retained publish to a new topic beyond it is
    /// refused with 0x97 (replacing or deleting one is not).
    pub max_retained: usize,
    /// Largest packet accepted (announced as Maximum Packet Size).
    pub max_packet_size: u32,
    /// Topic aliases a v5 client may use towards the broker.
    pub topic_alias_maximum: u16,
    /// An inbound QoS 2 id not released by PUBREL within this is forgotten
    /// and counted (`broker.exactly_once.expires_after`).
    pub exactly_once_expires_after: Duration,
    /// Outbound packets a connection's writer may have queued before QoS 0
    /// deliveries to it are dropped (and counted) and its reader paused.
    pub outbound_queue: usize,
    /// Cap on keep alive, seconds (`limits.max_keep_alive`); 0: none.
    pub max_keep_alive: u16,
}

/// The keep alive a connection is held to, from what its CONNECT asked
/// and `limits.max_keep_alive`. The reader enforces it; the CONNACK tells
/// an MQTT 5 client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Seconds (0: no check), and whether CONNACK must say so as Server
    /// Keep Alive because it differs from what the client asked.
    Held {
        seconds: u16,
        server_keep_alive: bool,
    },
    /// A 3.1.1 client asked for more than the cap (or for none): 3.1.1
    /// cannot be told another value, so it is refused (return code 2, as
    /// Mosquitto does).
    Refused,
}

impl KeepAlive {
    pub fn grant(max_keep_alive: u16, v5: bool, asked: u16) -> KeepAlive {
        if max_keep_alive == 0 || (asked != 0 && asked <= max_keep_alive) {
            return KeepAlive::Held {
                seconds: asked,
                server_keep_alive: false,
            };
        }
        if v5 {
            KeepAlive::Held {
                seconds: max_keep_alive,
                server_keep_alive: true,
            }
        } else {
            KeepAlive::Refused
        }
    }
}

/// The least [`Limits::qos0_byte_bound`] is: a `max_queued_bytes` of 0
/// keeps no queue for a session, but must not drop a burst of QoS 0 to a
/// client that reads it.
pub const QOS0_BYTES_FLOOR: u64 = 1 << 20;

/// The most [`Limits::qos0_byte_bound`] is (1 GiB): the link keeps the
/// bytes waiting in a word, exact below 4 GiB.
pub const QOS0_BYTES_CEILING: u64 = 1 << 30;

impl Limits {
    /// What a session's queue may hold.
    pub fn queue_bound(&self) -> session::QueueBound {
        session::QueueBound {
            messages: self.max_queued_messages,
            bytes: self.max_queued_bytes,
        }
    }

    /// The bytes of QoS 0 deliveries (topics and payloads) that may wait
    /// for a connection's writer before more QoS 0 to it is dropped: none
    /// without `max_queued_bytes`, else it, within [`QOS0_BYTES_FLOOR`]
    /// and [`QOS0_BYTES_CEILING`].
    pub fn qos0_byte_bound(&self) -> Option<u32> {
        self.max_queued_bytes
            .map(|b| b.clamp(QOS0_BYTES_FLOOR, QOS0_BYTES_CEILING) as u32)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_session_expiry: 7 * 24 * 3600,
            receive_maximum: 64,
            max_inflight_messages: 64,
            max_queued_messages: 1000,
            max_queued_bytes: None,
            max_subscriptions_per_session: 100,
            max_sessions: 100_000,
            max_retained: 100_000,
            max_packet_size: 256 * 1024 + 8 * 1024,
            topic_alias_maximum: 32,
            exactly_once_expires_after: Duration::from_secs(3600),
            outbound_queue: 2048,
            max_keep_alive: 0,
        }
    }
}

/// Authorisation decisions (the ACL). Principals are authenticated before
/// the state sees a connection.
pub trait Authorizer: Send + Sync {
    /// Does the ACL say anything at all? (When not, every check is skipped.)
    fn is_active(&self) -> bool;
    fn can_publish(&self, principal: Option<&str>, client_id: &str, topic: &str) -> bool;
    fn can_subscribe(&self, principal: Option<&str>, client_id: &str, filter: &str) -> bool;
    fn can_receive(&self, principal: Option<&str>, client_id: &str, topic: &str) -> bool;
}

/// Every client may do everything.
#[derive(Debug, Default)]
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn is_active(&self) -> bool {
        false
    }
    fn can_publish(&self, _: Option<&str>, _: &str, _: &str) -> bool {
        true
    }
    fn can_subscribe(&self, _: Option<&str>, _: &str, _: &str) -> bool {
        true
    }
    fn can_receive(&self, _: Option<&str>, _: &str, _: &str) -> bool {
        true
    }
}

/// A Will as carried in CONNECT.
#[derive(Debug, Clone)]
pub struct WillRequest {
    pub topic: ByteStr,
    pub payload: Bytes,
    pub qos: u8,
    pub retain: bool,
    pub properties: MessageProperties,
    /// Will Delay Interval, seconds (0 for 3.1.1).
    pub delay: u32,
}

/// An authenticated CONNECT.
#[derive(Debug, Clone)]
pub struct ConnectRequest {
    pub v5: bool,
    /// Shared with the connection, which names it in its log lines.
    pub client_id: Arc<str>,
    pub clean_start: bool,
    pub keep_alive: u16,
    pub principal: Option<Arc<str>>,
    pub will: Option<WillRequest>,
    /// Session Expiry Interval asked for (v5; 0 when absent).
    pub session_expiry: u32,
    /// The client's Receive Maximum (65535 when absent).
    pub receive_maximum: u16,
    /// The client's Maximum Packet Size (None: no limit beyond the protocol's).
    pub maximum_packet_size: Option<u32>,
    /// MQTT 5 Request Response Information = 1.
    pub request_response_information: bool,
    /// Enhanced authentication that succeeded: the method and the data the
    /// CONNACK carries (SCRAM's server-final message).
    pub authentication: Option<(&'static str, Bytes)>,
    /// Set when the connection is a bridge's, made inside the broker (never
    /// from the wire): the records it publishes carry the bridge's name, its
    /// places in channels are the reader `bridge:<name>`, and it is not
    /// handed records that arrived over a bridge (one hop).
    pub bridge: Option<Arc<str>>,
}

/// A PUBLISH from a client, topic alias already resolved.
#[derive(Debug, Clone)]
pub struct InboundPublish {
    pub packet_id: u16,
    pub qos: u8,
    pub retain: bool,
    pub dup: bool,
    pub topic: ByteStr,
    pub payload: Bytes,
    pub properties: MessageProperties,
}

/// A packet from a connected client, as the state needs it.
#[derive(Debug, Clone)]
pub enum Inbound {
    Publish(InboundPublish),
    PubAck {
        packet_id: u16,
        reason: ReasonCode,
    },
    PubRec {
        packet_id: u16,
        reason: ReasonCode,
    },
    PubRel {
        packet_id: u16,
    },
    PubComp {
        packet_id: u16,
    },
    Subscribe {
        packet_id: u16,
        subscription_id: Option<u32>,
        /// The SUBSCRIBE's User Properties (`saguin-from` among them).
        user_properties: Vec<(String, String)>,
        filters: Vec<(String, SubOptions)>,
    },
    Unsubscribe {
        packet_id: u16,
        filters: Vec<String>,
    },
    PingReq,
    Disconnect {
        reason: ReasonCode,
        session_expiry: Option<u32>,
    },
}

impl Inbound {
    /// A PUBACK, PUBREC or PUBCOMP: the client's answer to a delivery.
    fn answers_delivery(&self) -> bool {
        matches!(
            self,
            Inbound::PubAck { .. } | Inbound::PubRec { .. } | Inbound::PubComp { .. }
        )
    }
}

pub use super::link::ConnectionHandle;

/// Something for the broker state to act on.
#[derive(Debug)]
pub enum Event {
    /// A transport sent a valid, authenticated CONNECT.
    Connect {
        connection: u64,
        request: Box<ConnectRequest>,
        handle: ConnectionHandle,
    },
    /// Packets read from one connection, in order.
    Packets {
        connection: u64,
        packets: Vec<Inbound>,
        /// Where the read that brought them stands in the order the
        /// connections' sockets became readable
        /// ([`read_order`](crate::broker::read_order)).
        read_order: u64,
    },
    /// The connection ended (or must end) for `reason`; `disconnect_reason`
    /// is the v5 DISCONNECT reason to send first, if any.
    Closed {
        connection: u64,
        reason: CloseReason,
        disconnect_reason: Option<ReasonCode>,
    },
    /// A connection's writer caught up after the state asked it to say so.
    Drained { connection: u64 },
    /// A provider committed (or failed) the intent with this ticket.
    Committed {
        ticket: u64,
        result: Result<Vec<Written>, StorageFailure>,
    },
    /// A read of channel records asked for with this ticket came back.
    ChannelRead {
        ticket: u64,
        result: Result<ReadWindow, StorageFailure>,
    },
    /// Retention removed the records of append channel `channel` below
    /// `floor`.
    FloorRaised { channel: Arc<str>, floor: u64 },
}

/// A packet the state asks a connection's writer to send.
#[derive(Debug, Clone)]
pub enum Outbound {
    ConnAck {
        session_present: bool,
        /// v5 reason; the writer maps it to a 3.1.1 return code.
        reason: ReasonCode,
        /// Set when the broker granted a different session expiry.
        session_expiry: Option<u32>,
        receive_maximum: u16,
        maximum_packet_size: u32,
        topic_alias_maximum: u16,
        /// Server Keep Alive, when the broker holds the client to another
        /// keep alive than it asked for.
        server_keep_alive: Option<u16>,
        /// What only some clients are told, boxed: every packet queued for
        /// a writer, each delivery among them, takes the room of the
        /// largest kind.
        extras: Option<Box<ConnAckExtras>>,
    },
    Publish {
        packet_id: u16,
        qos: u8,
        retain: bool,
        dup: bool,
        message: Arc<super::message::Message>,
        subscription_ids: Vec<u32>,
        /// Message expiry left, to forward instead of the original interval.
        expiry: Option<u32>,
        /// A `$SYS` statistic: not counted as a message sent.
        sys: bool,
    },
    PubAck {
        packet_id: u16,
        reason: ReasonCode,
    },
    PubRec {
        packet_id: u16,
        reason: ReasonCode,
    },
    PubRel {
        packet_id: u16,
        reason: ReasonCode,
    },
    PubComp {
        packet_id: u16,
        reason: ReasonCode,
    },
    SubAck {
        packet_id: u16,
        reasons: Vec<ReasonCode>,
        /// Why a filter was refused, for an MQTT 5 client: what it could
        /// not learn from the reason code alone.
        reason_string: Option<Box<str>>,
    },
    UnsubAck {
        packet_id: u16,
        reasons: Vec<ReasonCode>,
    },
    PingResp,
    /// AUTH of a re-authentication (the connection's reader sends these
    /// itself): 0x18 with the server-first message, 0x00 with server-final.
    Auth {
        reason: ReasonCode,
        method: &'static str,
        /// A boxed slice, not `Bytes`: half the size, which every queued
        /// packet pays (see `ConnAck::extras`).
        data: Box<[u8]>,
    },
    /// v5: send DISCONNECT with this reason (and reason string), then
    /// close. 3.1.1: just close.
    Disconnect {
        reason: ReasonCode,
        reason_string: Option<&'static str>,
    },
}

impl Outbound {
    /// A CONNACK refusing the connection with `reason`.
    pub fn refusing_connack(reason: ReasonCode) -> Outbound {
        Outbound::ConnAck {
            session_present: false,
            reason,
            session_expiry: None,
            receive_maximum: 0,
            maximum_packet_size: 0,
            topic_alias_maximum: 0,
            server_keep_alive: None,
            extras: None,
        }
    }
}

/// What a CONNACK tells some clients only.
#[derive(Debug, Clone, Default)]
pub struct ConnAckExtras {
    /// The client identifier the broker assigned.
    pub assigned_client_id: Option<Arc<str>>,
    /// Response Information, when the client asked for it.
    pub response_information: Option<Arc<str>>,
    /// Authentication Method and Data of a completed exchange.
    pub authentication: Option<(&'static str, Bytes)>,
}

/// Answers a connection may have queued before its reader is paused (the
/// client's packets wait in its socket until the commits catch up).
const ANSWERS_PAUSE: usize = 1024;

/// One answer a connection is owed, in the order its packets came.
#[derive(Debug)]
struct Answer {
    id: u64,
    /// The wait whose commit it needs; `None` once answered (or when it
    /// needed none and only waits for those before it).
    wait: Option<u64>,
    failure: Option<StorageFailure>,
    appended: Option<u64>,
    parked: intent::Parked,
}

/// A connected client as the state sees it.
#[derive(Debug)]
struct Connection {
    handle: ConnectionHandle,
    /// Its session, whose client id its log lines name
    /// ([`BrokerState::client_id_of`]): not kept twice, so the entry fits
    /// the allocator's 64-byte class.
    session: SessionKey,
    v5: bool,
    /// The client's Receive Maximum: its outbound inflight window
    /// ([`Connection::window`]).
    receive_maximum: u16,
    /// What the client accepts; `None` is the protocol's own bound. Never
    /// 0 (the decoder refuses it), so it takes no tag.
    maximum_packet_size: Option<std::num::NonZeroU32>,
    // Boxed, as is a session's pending Will: most connections have none,
    // and every entry of the connection table is as large as its largest.
    will: Option<Box<WillRequest>>,
    /// What its packets are owed, in order; each waits for its own commit
    /// and for those before it. Lazy, as is the retained backlog: a client
    /// whose packets write nothing never has an answer wait. Each is
    /// numbered one past the last queued (no counter in every entry).
    answers: Lazy<VecDeque<Answer>>,
    /// QoS 0 deliveries dropped because the client was not reading.
    dropped_qos0: u64,
    /// Packets the state put on the connection's outbound queue, modulo
    /// 2^32 as the writer's count is ([`Connection::waiting`]).
    sent: u32,
    /// Retained messages a SUBSCRIBE still owes, sent as the writer drains.
    retained_backlog: Lazy<VecDeque<RetainedDue>>,
}

lazy::empty!(VecDeque<Answer>, VecDeque::new());
lazy::empty!(VecDeque<RetainedDue>, VecDeque::new());

impl Connection {
    /// The client's outbound inflight window.
    fn window(&self) -> usize {
        usize::from(self.receive_maximum)
    }

    /// The largest packet the client accepts, where it said.
    fn max_packet(&self) -> Option<u32> {
        self.maximum_packet_size.map(std::num::NonZeroU32::get)
    }

    /// Owe `due` after what the connection is owed already. An empty
    /// backlog takes the vector itself rather than a copy: a `#` over a
    /// million retained messages owes a million.
    fn owe(&mut self, due: Vec<RetainedDue>) {
        if due.is_empty() {
            return;
        }
        let backlog = &mut *self.retained_backlog;
        if backlog.is_empty() {
            *backlog = VecDeque::from(due);
        } else {
            backlog.extend(due);
        }
    }

    /// Put `packet` on the writer's queue, pausing the client's reader when
    /// `limit` packets wait (it does not read what it is sent; the writer
    /// says when it has caught up). False when the writer is gone.
    fn queue(&mut self, packet: Outbound, limit: usize) -> bool {
        if self.handle.send(packet).is_err() {
            return false;
        }
        self.sent = self.sent.wrapping_add(1);
        self.pause_if_behind(limit);
        true
    }

    /// [`Connection::queue`] of packets already counted as sent, taken
    /// from `packets` in their order with one taking of the link.
    fn queue_all(&mut self, packets: &mut Vec<Outbound>, limit: usize) -> bool {
        if !self.handle.send_all(packets) {
            return false;
        }
        self.pause_if_behind(limit);
        true
    }

    /// Pause the client's reader once `limit` packets wait for its writer,
    /// and ask the writer to say when it has caught up.
    fn pause_if_behind(&self, limit: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.waiting() >= limit {
            self.handle.set_paused(true);
            self.handle.want_drained.store(true, Relaxed);
        }
    }

    /// Packets on the outbound queue the writer has not taken yet.
    fn waiting(&self) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        let foreign = self.handle.foreign.load(Relaxed);
        let written = self.handle.written.load(Relaxed);
        let waiting = self.sent.wrapping_add(foreign).wrapping_sub(written);
        // Read apart, `written` may already count a foreign packet that
        // `foreign` did not: that is none waiting, not four billion.
        if waiting > i32::MAX as u32 {
            0
        } else {
            waiting as usize
        }
    }
}

/// What [`BrokerState::hold_sends`] holds: one connection's packets.
#[derive(Debug, Default)]
struct Held {
    connection: Option<u64>,
    packets: Vec<Outbound>,
}

/// A retained message owed to a subscription, waiting for room.
#[derive(Debug)]
struct RetainedDue {
    message: Retained,
    qos: u8,
    subscription_ids: Vec<u32>,
    sys: bool,
    /// A latest channel's current value (the channel's index and the
    /// value's offset): its consumer's position waits for it.
    channel: Option<(u16, u64)>,
}

/// What the `$SYS/broker/#` topics report, and how often.
pub const SYS_INTERVAL: Duration = Duration::from_secs(10);

/// The single-writer broker state.
pub struct BrokerState {
    limits: Limits,
    metrics: Arc<Metrics>,
    authorizer: Arc<dyn Authorizer>,
    retained: RetainedIndex,
    index: SubscriptionIndex,
    /// Every session, connected or not, and the client ids they go by.
    sessions: Sessions,
    connections: IdMap<u64, Box<Connection>>,
    /// Connections to close once the current event is handled (closing one
    /// may publish a Will, which must not happen in the middle of a fan-out).
    doomed: Vec<(u64, CloseReason, Option<ReasonCode>)>,
    /// A run of deliveries to one connection being made: what is sent to
    /// it meanwhile is held here and handed to its writer at once when the
    /// run ends ([`BrokerState::hold_sends`]).
    held: Held,
    scratch_matches: Vec<Match>,
    scratch_deliveries: Vec<Delivery>,
    shutting_down: bool,
    version: String,
    /// When unreleased inbound QoS 2 ids are next looked at.
    next_exactly_once_sweep: Option<Instant>,
    /// The clock of the times the state stores, on the injected monotonic
    /// time (so the state stays deterministic), following the system clock
    /// forward ([`clock`]).
    clock: clock::ReceiptClock,
    /// Where the clock started: the first half of every message id this
    /// run makes, kept when the clock is set forward.
    run_id: UnixNanos,
    /// Everything about writes: intents waiting to be taken, parked
    /// answers, the broadcast log's references.
    persist: persist::Persistence,
    /// The channels served (append, latest, queue) and their consumers'
    /// reads.
    channels: Channels,
    /// Reads of channel records asked for and not yet taken by the server,
    /// for consumers, groups, latest values and queues alike.
    reads: ReadRequests,
    /// Bridges' places and holds in channels while their sessions are away.
    bridges: Bridges,
    /// Shared groups over channels.
    groups: Groups,
    /// The queues' volatile halves: deliveries, workers, offers.
    queues: Queues,
    /// Reads of latest channels' current values.
    latest_reads: LatestReads,
    /// The session an acknowledgement in the current batch of packets
    /// freed window room for: promoted once the acknowledgements in a row
    /// are handled.
    window_freed: Option<SessionKey>,
    /// Publishes received while handling the current event: added to the
    /// shared counter once the event is handled, one write of a cache line
    /// the connections' tasks write too instead of one per message.
    received: u64,
}

impl BrokerState {
    /// The client id of `conn`'s session, for its log lines: a connection
    /// is detached before its session ends, so it always has one.
    fn client_id_of(&self, conn: &Connection) -> &str {
        self.sessions
            .by_key
            .get(&conn.session)
            .map_or("", |s| &s.client_id)
    }

    pub fn new(
        limits: Limits,
        metrics: Arc<Metrics>,
        authorizer: Arc<dyn Authorizer>,
        clock: clock::ReceiptClock,
    ) -> Self {
        Self {
            limits,
            metrics,
            authorizer,
            retained: RetainedIndex::new(),
            index: SubscriptionIndex::new(),
            sessions: Sessions::default(),
            connections: IdMap::default(),
            doomed: Vec::new(),
            held: Held::default(),
            scratch_matches: Vec::new(),
            scratch_deliveries: Vec::new(),
            shutting_down: false,
            version: format!("saguin {}", env!("CARGO_PKG_VERSION")),
            next_exactly_once_sweep: None,
            run_id: clock.base_unix(),
            clock,
            persist: persist::Persistence::default(),
            channels: Channels::default(),
            reads: ReadRequests::default(),
            bridges: Bridges::default(),
            groups: Groups::default(),
            queues: Queues::default(),
            latest_reads: LatestReads::default(),
            window_freed: None,
            received: 0,
        }
    }

    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.by_key.len()
    }

    /// What the state's clock reads at `now`: the unix time every stored
    /// time is stamped with.
    pub fn receipt_time(&self, now: Instant) -> UnixNanos {
        self.clock.unix_at(now)
    }

    /// The system clock read `wall` at `now`: taken when it is ahead of the
    /// state's clock, never when behind ([`clock`]); a step of a second or
    /// more is logged.
    pub fn follow_wall_clock(&mut self, now: Instant, wall: UnixNanos) {
        use std::sync::atomic::Ordering::Relaxed;
        match self.clock.follow(now, wall) {
            clock::Followed::Steady => {}
            clock::Followed::Forward(step) => {
                self.metrics.clock_steps.fetch_add(1, Relaxed);
                // Their records and their places in channels say when they
                // were written by the clock before the step: written again
                // at the next flush, in this one, so that a restart does
                // not count the step against their expiry.
                let sessions = &mut self.sessions;
                for key in sessions.detached.keys() {
                    let Some(session) = sessions.by_key.get_mut(&key) else {
                        continue;
                    };
                    if !session.stored {
                        continue;
                    }
                    for consumer in session.consumers.allocated_mut().into_iter().flatten() {
                        consumer.stored = None;
                    }
                    self.persist.mark_dirty(key);
                }
                tracing::warn!(
                    step = %humantime::format_duration(Duration::from_millis(step.as_millis() as u64)),
                    now = %crate::storage::lock::rfc3339(wall),
                    "the system clock stepped forward: receipt times follow it from now"
                );
            }
            clock::Followed::Behind(gap) => {
                tracing::warn!(
                    gap = %humantime::format_duration(Duration::from_millis(gap.as_millis() as u64)),
                    system_clock = %crate::storage::lock::rfc3339(wall),
                    receipt_clock = %crate::storage::lock::rfc3339(self.receipt_time(now)),
                    "the system clock is behind the broker's receipt clock (it was set back): receipt times go on from the broker's clock, never back, until the system clock passes it or the broker restarts"
                );
            }
            clock::Followed::CaughtUp => {
                tracing::info!(now = %crate::storage::lock::rfc3339(wall), "the system clock caught up with the broker's receipt clock");
            }
        }
        self.metrics
            .receipt_clock_ahead_ms
            .store(self.clock.ahead_of(now, wall).as_millis() as u64, Relaxed);
    }

    /// Handle one event, then close whatever it doomed.
    pub fn handle(&mut self, event: Event, now: Instant) {
        match event {
            Event::Connect {
                connection,
                request,
                handle,
            } => self.on_connect(connection, *request, handle, now),
            Event::Packets {
                connection,
                mut packets,
                read_order: _,
            } => {
                if packets.first().is_some_and(Inbound::answers_delivery) {
                    // A subscriber's acknowledgements: each is taken by its
                    // fields, not moved as a whole `Inbound` (which has a
                    // publish's size).
                    for packet in packets.iter_mut() {
                        let packet = match *packet {
                            Inbound::PubAck { packet_id, reason } => {
                                Inbound::PubAck { packet_id, reason }
                            }
                            Inbound::PubRec { packet_id, reason } => {
                                Inbound::PubRec { packet_id, reason }
                            }
                            Inbound::PubComp { packet_id } => Inbound::PubComp { packet_id },
                            _ => std::mem::replace(packet, Inbound::PingReq),
                        };
                        if !self.batch_packet(connection, packet, now) {
                            break;
                        }
                    }
                } else {
                    for packet in packets {
                        if !self.batch_packet(connection, packet, now) {
                            break;
                        }
                    }
                }
                self.promote_due(now);
            }
            Event::Closed {
                connection,
                reason,
                disconnect_reason,
            } => {
                // A close waits behind the answers owed before it, so what
                // the client sent before it went away is still answered.
                let parked = intent::Parked::Close {
                    connection,
                    reason,
                    code: disconnect_reason,
                };
                self.park_or_answer(connection, parked, now);
            }
            Event::Drained { connection } => self.on_drained(connection, now),
            Event::Committed { ticket, result } => self.on_committed(ticket, result, now),
            Event::ChannelRead { ticket, result } => self.on_channel_read(ticket, result, now),
            Event::FloorRaised { channel, floor } => self.channels.floor_raised(&channel, floor),
        }
        self.after_event(now);
    }

    /// Handle `events` as one turn: each as [`BrokerState::handle`] does,
    /// but the consumers they let catch up do so once, after the last.
    /// A thousand devices back after a crash, each let go on as its
    /// session's write is answered, passed the same records a thousand
    /// times; let go on together, those that came back pass them once
    /// (`catch_up`).
    pub fn handle_all(&mut self, events: impl IntoIterator<Item = Event>, now: Instant) {
        self.channels.hold_pumps = true;
        for event in events {
            self.handle(event, now);
        }
        self.channels.hold_pumps = false;
        self.after_event(now);
    }

    /// What every event leaves to do once it is handled.
    fn after_event(&mut self, now: Instant) {
        self.close_doomed(now);
        self.run_orphans(now);
        self.run_pumps(now);
        self.run_queue_pumps(now);
        // Whatever closing staged (a detached session recorded, a session
        // ended) is written too.
        if self.persist.has_staged() {
            self.persist.seal_background();
        }
        self.seal_queue_writes(now);
        if self.received > 0 {
            use std::sync::atomic::Ordering::Relaxed;
            self.metrics
                .messages_received
                .fetch_add(std::mem::take(&mut self.received), Relaxed);
        }
    }

    /// Handle one packet of a batch read from `connection`; false once the
    /// connection is gone. Acknowledgements in a row free window room one
    /// by one; what waits for it is sent once, after the last of them, and
    /// before anything else the client sent.
    // Inlined into both loops of `handle`: a call would move each packet
    // (a publish's size) once more.
    #[inline(always)]
    fn batch_packet(&mut self, connection: u64, packet: Inbound, now: Instant) -> bool {
        if !self.connections.contains_key(&connection) {
            return false;
        }
        if !packet.answers_delivery() {
            self.promote_due(now);
        }
        self.on_packet(connection, packet, now);
        if !self.doomed.is_empty() {
            self.promote_due(now);
            self.close_doomed(now);
        }
        true
    }

    /// Promote the session whose window acknowledgements freed, if any.
    fn promote_due(&mut self, now: Instant) {
        if let Some(key) = self.window_freed.take() {
            self.promote(key, now);
        }
    }

    /// Must an answer for `connection` wait (something was staged for it,
    /// or answers before it are still waiting)?
    fn must_queue(&self, connection: u64) -> bool {
        self.persist.has_staged()
            || self
                .connections
                .get(&connection)
                .is_some_and(|c| !c.answers.is_empty())
    }

    fn close_doomed(&mut self, now: Instant) {
        while let Some((connection, reason, code)) = self.doomed.pop() {
            self.close(connection, reason, code, now);
        }
    }

    /// Queue `packet` for `connection`'s writer. Acknowledgements and QoS
    /// 1/2 deliveries (bounded by the client's window) are always queued;
    /// a client that does not read its acknowledgements has its reader
    /// paused until the writer catches up, never its connection cut.
    fn send(&mut self, connection: u64, packet: Outbound) {
        let Some(conn) = self.connections.get_mut(&connection) else {
            return;
        };
        if self.held.connection == Some(connection) {
            conn.sent = conn.sent.wrapping_add(1);
            self.held.packets.push(packet);
            return;
        }
        if !conn.queue(packet, self.limits.outbound_queue) {
            // The writer is gone (the socket failed); the reader's
            // Closed event may still be on its way.
            self.doomed.push((connection, CloseReason::Network, None));
        }
    }

    /// Hold what is sent to `connection` until [`Self::release_sends`]: a
    /// run of deliveries to one consumer takes its writer's queue once, not
    /// once a delivery. Counted as sent while held, so its room is right.
    fn hold_sends(&mut self, connection: u64) {
        // What another hold still has goes to its own connection first,
        // never to this one.
        self.release_sends();
        self.held.connection = Some(connection);
    }

    /// Hand what [`Self::hold_sends`] held to the connection's writer, as
    /// [`Self::send`] would have one by one.
    fn release_sends(&mut self) {
        let Some(connection) = self.held.connection.take() else {
            return;
        };
        if self.held.packets.is_empty() {
            return;
        }
        let Some(conn) = self.connections.get_mut(&connection) else {
            self.held.packets.clear();
            return;
        };
        if !conn.queue_all(&mut self.held.packets, self.limits.outbound_queue) {
            self.doomed.push((connection, CloseReason::Network, None));
        }
    }

    /// May a QoS 0 delivery (or a retained message on subscribe) be queued
    /// for `connection` now?
    fn has_room(&self, connection: u64) -> bool {
        self.connections
            .get(&connection)
            .is_some_and(|c| c.waiting() < self.limits.outbound_queue)
    }

    fn on_drained(&mut self, connection: u64, now: Instant) {
        let Some(conn) = self.connections.get(&connection) else {
            return;
        };
        if conn.answers.len() < ANSWERS_PAUSE {
            conn.handle.set_paused(false);
        }
        let key = conn.session;
        self.send_retained_backlog(connection, now);
        self.pump_all(key, now);
    }

    fn doom(&mut self, connection: u64, reason: CloseReason, code: ReasonCode) {
        self.doomed.push((connection, reason, Some(code)));
    }

    /// Retained topics held.
    pub fn retained_count(&self) -> usize {
        self.retained.len()
    }
}
