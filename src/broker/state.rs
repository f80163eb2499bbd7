//! The broker state: every session, subscription and retained message, owned
//! by one task (single writer). It holds no sockets, tasks or clocks: it
//! consumes [`Event`]s stamped with a time and answers by queueing
//! [`Outbound`] packets on each connection's bounded queue. Tests drive it
//! directly with events and read those queues.
//!
//! Connections are named by a generation number allocated once per accepted
//! transport. A session remembers the generation attached to it; an event
//! from any other generation (a taken-over or already closed connection) is
//! ignored.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::codec::ByteStr;
use super::message::{publish_packet_len, Message, MessageProperties};
use super::metrics::{CloseReason, DropReason, Metrics};
use super::retained::RetainedStore;
use super::session::{
    IdMap, IdSet, InflightEntry, InflightPhase, MemorySessions, PendingWill, QueuedMessage,
    Session, SessionStore, SessionSubscription,
};
use super::topic::{
    self, merge_matches, Delivery, Match, SessionKey, SubOptions, SubscriptionIndex,
};

/// MQTT 5 reason codes the state machine answers with (3.1.1 connections get
/// the equivalent return code or nothing; the writer maps them).
pub mod reason {
    pub const SUCCESS: u8 = 0x00;
    pub const DISCONNECT_WITH_WILL: u8 = 0x04;
    pub const NO_SUBSCRIPTION_EXISTED: u8 = 0x11;
    pub const UNSPECIFIED: u8 = 0x80;
    pub const PROTOCOL_ERROR: u8 = 0x82;
    pub const CLIENT_IDENTIFIER_NOT_VALID: u8 = 0x85;
    pub const BAD_USER_NAME_OR_PASSWORD: u8 = 0x86;
    pub const NOT_AUTHORIZED: u8 = 0x87;
    pub const SERVER_SHUTTING_DOWN: u8 = 0x8B;
    pub const SESSION_TAKEN_OVER: u8 = 0x8E;
    pub const TOPIC_FILTER_INVALID: u8 = 0x8F;
    pub const TOPIC_NAME_INVALID: u8 = 0x90;
    pub const PACKET_IDENTIFIER_NOT_FOUND: u8 = 0x92;
    pub const RECEIVE_MAXIMUM_EXCEEDED: u8 = 0x93;
    pub const TOPIC_ALIAS_INVALID: u8 = 0x94;
    pub const PACKET_TOO_LARGE: u8 = 0x95;
    pub const QUOTA_EXCEEDED: u8 = 0x97;
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0x9E;
}

/// The broker's bounds, from `limits` in the configuration.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Cap on any session's expiry interval, seconds; also the expiry of a
    /// 3.1.1 session with clean session 0.
    pub max_session_expiry: u32,
    /// Announced to v5 clients; the outbound inflight window of 3.1.1 clients.
    pub receive_maximum: u16,
    /// Per session, QoS 1/2 messages waiting (offline or beyond the inflight window).
    pub max_queued_messages: usize,
    pub max_subscriptions_per_session: usize,
    /// Largest packet accepted (announced as Maximum Packet Size).
    pub max_packet_size: u32,
    /// Topic aliases a v5 client may use towards the broker.
    pub topic_alias_maximum: u16,
    /// An inbound QoS 2 id not released by PUBREL within this is forgotten
    /// and counted (`broker.exactly_once.expires_after`).
    pub exactly_once_expires_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_session_expiry: 7 * 24 * 3600,
            receive_maximum: 64,
            max_queued_messages: 1000,
            max_subscriptions_per_session: 100,
            max_packet_size: 256 * 1024 + 8 * 1024,
            topic_alias_maximum: 32,
            exactly_once_expires_after: Duration::from_secs(3600),
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
    pub client_id: String,
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
        reason: u8,
    },
    PubRec {
        packet_id: u16,
        reason: u8,
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
        filters: Vec<(String, SubOptions)>,
    },
    Unsubscribe {
        packet_id: u16,
        filters: Vec<String>,
    },
    PingReq,
    Disconnect {
        reason: u8,
        session_expiry: Option<u32>,
    },
}

/// How a connection's bounded queues and close signal look to the state.
#[derive(Debug, Clone)]
pub struct ConnectionHandle {
    pub outbound: mpsc::Sender<Outbound>,
    /// Set to true to make the connection's tasks drop the transport now.
    pub kill: watch::Sender<bool>,
}

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
    },
    /// The connection ended (or must end) for `reason`; `disconnect_reason`
    /// is the v5 DISCONNECT reason to send first, if any.
    Closed {
        connection: u64,
        reason: CloseReason,
        disconnect_reason: Option<u8>,
    },
}

/// A packet the state asks a connection's writer to send.
#[derive(Debug, Clone)]
pub enum Outbound {
    ConnAck {
        session_present: bool,
        /// v5 reason; the writer maps it to a 3.1.1 return code.
        reason: u8,
        assigned_client_id: Option<Arc<str>>,
        /// Set when the broker granted a different session expiry.
        session_expiry: Option<u32>,
        receive_maximum: u16,
        maximum_packet_size: u32,
        topic_alias_maximum: u16,
    },
    Publish {
        packet_id: u16,
        qos: u8,
        retain: bool,
        dup: bool,
        message: Arc<Message>,
        subscription_ids: Vec<u32>,
        /// Message expiry left, to forward instead of the original interval.
        expiry: Option<u32>,
        /// A `$SYS` statistic: not counted as a message sent.
        sys: bool,
    },
    PubAck {
        packet_id: u16,
        reason: u8,
    },
    PubRec {
        packet_id: u16,
        reason: u8,
    },
    PubRel {
        packet_id: u16,
        reason: u8,
    },
    PubComp {
        packet_id: u16,
        reason: u8,
    },
    SubAck {
        packet_id: u16,
        reasons: Vec<u8>,
    },
    UnsubAck {
        packet_id: u16,
        reasons: Vec<u8>,
    },
    PingResp,
    /// v5: send DISCONNECT with this reason (and reason string), then
    /// close. 3.1.1: just close.
    Disconnect {
        reason: u8,
        reason_string: Option<&'static str>,
    },
}

/// A connected client as the state sees it.
#[derive(Debug)]
struct Connection {
    handle: ConnectionHandle,
    session: SessionKey,
    v5: bool,
    /// The client's Receive Maximum: its outbound inflight window.
    receive_maximum: usize,
    maximum_packet_size: Option<u32>,
    will: Option<WillRequest>,
}

/// What the `$SYS/broker/#` topics report, and how often.
pub const SYS_INTERVAL: Duration = Duration::from_secs(10);

/// The single-writer broker state.
pub struct BrokerState {
    limits: Limits,
    metrics: Arc<Metrics>,
    authorizer: Arc<dyn Authorizer>,
    retained: Box<dyn RetainedStore>,
    session_store: Box<dyn SessionStore>,
    index: SubscriptionIndex,
    sessions: IdMap<SessionKey, Session>,
    by_client_id: HashMap<Arc<str>, SessionKey>,
    connections: IdMap<u64, Connection>,
    /// Sessions without a connection (timers for expiry and Will delay).
    detached: IdSet<SessionKey>,
    next_session: SessionKey,
    next_assigned_id: u64,
    /// Connections to close once the current event is handled (closing one
    /// may publish a Will, which must not happen in the middle of a fan-out).
    doomed: Vec<(u64, CloseReason, Option<u8>)>,
    scratch_matches: Vec<Match>,
    scratch_deliveries: Vec<Delivery>,
    shutting_down: bool,
    version: String,
    /// When unreleased inbound QoS 2 ids are next looked at.
    next_exactly_once_sweep: Option<Instant>,
}

impl BrokerState {
    pub fn new(
        limits: Limits,
        metrics: Arc<Metrics>,
        authorizer: Arc<dyn Authorizer>,
        retained: Box<dyn RetainedStore>,
    ) -> Self {
        Self {
            limits,
            metrics,
            authorizer,
            retained,
            session_store: Box::new(MemorySessions),
            index: SubscriptionIndex::new(),
            sessions: IdMap::default(),
            by_client_id: HashMap::new(),
            connections: IdMap::default(),
            detached: IdSet::default(),
            next_session: 1,
            next_assigned_id: 1,
            doomed: Vec::new(),
            scratch_matches: Vec::new(),
            scratch_deliveries: Vec::new(),
            shutting_down: false,
            version: format!("saguin {}", env!("CARGO_PKG_VERSION")),
            next_exactly_once_sweep: None,
        }
    }

    /// Keep persistent sessions in `store`, restoring what it holds: each
    /// comes back detached, its expiry counted from `now`.
    pub fn with_session_store(mut self, mut store: Box<dyn SessionStore>, now: Instant) -> Self {
        for mut session in store.restore() {
            if self.by_client_id.contains_key(&session.client_id) {
                continue;
            }
            let key = self.next_session;
            self.next_session += 1;
            session.connection = None;
            session.pending_will = None;
            session.expires_at =
                Some(now + Duration::from_secs(u64::from(session.expiry_interval)));
            for sub in session.subscriptions.values() {
                if !self
                    .index
                    .insert(sub.share_group.as_deref(), &sub.filter, key, sub.options)
                {
                    self.metrics.subscriptions.fetch_add(1, Relaxed);
                }
            }
            self.by_client_id.insert(session.client_id.clone(), key);
            self.sessions.insert(key, session);
            self.detached.insert(key);
            self.metrics.sessions.fetch_add(1, Relaxed);
        }
        self.session_store = store;
        self
    }

    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
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
                packets,
            } => {
                for packet in packets {
                    if !self.connections.contains_key(&connection) {
                        break;
                    }
                    self.on_packet(connection, packet, now);
                    if !self.doomed.is_empty() {
                        self.close_doomed(now);
                    }
                }
            }
            Event::Closed {
                connection,
                reason,
                disconnect_reason,
            } => self.close(connection, reason, disconnect_reason, now),
        }
        self.close_doomed(now);
    }

    fn close_doomed(&mut self, now: Instant) {
        while let Some((connection, reason, code)) = self.doomed.pop() {
            self.close(connection, reason, code, now);
        }
    }

    fn send(&mut self, connection: u64, packet: Outbound) {
        let Some(conn) = self.connections.get(&connection) else {
            return;
        };
        match conn.handle.outbound.try_send(packet) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(packet)) => {
                // A slow consumer: only this connection pays for it.
                if matches!(packet, Outbound::Publish { .. }) {
                    self.metrics.dropped(DropReason::SlowConsumer);
                }
                let _ = conn.handle.kill.send(true);
                self.doomed
                    .push((connection, CloseReason::SlowConsumer, None));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                // The writer is gone (the socket failed); the reader's
                // Closed event may still be on its way.
                self.doomed.push((connection, CloseReason::Network, None));
            }
        }
    }

    // ---- CONNECT ------------------------------------------------------

    fn on_connect(
        &mut self,
        connection: u64,
        request: ConnectRequest,
        handle: ConnectionHandle,
        now: Instant,
    ) {
        if self.shutting_down {
            let _ = handle.outbound.try_send(Outbound::Disconnect {
                reason: reason::SERVER_SHUTTING_DOWN,
                reason_string: Some(CloseReason::Shutdown.describe()),
            });
            return;
        }
        let refuse = |handle: &ConnectionHandle, code: u8| {
            let _ = handle.outbound.try_send(Outbound::ConnAck {
                session_present: false,
                reason: code,
                assigned_client_id: None,
                session_expiry: None,
                receive_maximum: 0,
                maximum_packet_size: 0,
                topic_alias_maximum: 0,
            });
        };
        let mut assigned = None;
        let client_id: Arc<str> = if request.client_id.is_empty() {
            if !request.v5 && !request.clean_start {
                self.metrics.disconnected(CloseReason::ConnectRefused);
                refuse(&handle, reason::CLIENT_IDENTIFIER_NOT_VALID);
                return;
            }
            let id: Arc<str> = format!("saguin-{}-{}", self.next_assigned_id, connection).into();
            self.next_assigned_id += 1;
            assigned = Some(id.clone());
            id
        } else {
            request.client_id.as_str().into()
        };
        // 3.1.1 clean session 0 keeps the session as long as the broker allows.
        let wanted_expiry = if request.v5 {
            request.session_expiry
        } else if request.clean_start {
            0
        } else {
            u32::MAX
        };
        let expiry = wanted_expiry.min(self.limits.max_session_expiry);

        // The timer may not have run yet: a Will whose delay passed, or a
        // session whose expiry passed, is settled before this CONNECT sees it.
        if let Some(&key) = self.by_client_id.get(&client_id) {
            self.settle_due(key, now);
        }
        let mut session_present = false;
        if let Some(&key) = self.by_client_id.get(&client_id) {
            let (owner_differs, old_connection, ends_with_connection) = {
                let s = &self.sessions[&key];
                (
                    s.principal != request.principal,
                    s.connection,
                    s.expiry_interval == 0,
                )
            };
            if owner_differs {
                self.metrics.disconnected(CloseReason::ConnectRefused);
                refuse(&handle, reason::NOT_AUTHORIZED);
                return;
            }
            if let Some(old) = old_connection {
                // Takeover: the old connection's Will goes now unless its
                // delay is running and the session continues.
                if let Some(conn) = self.connections.get_mut(&old) {
                    if let Some(will) = conn.will.take() {
                        if will.delay == 0 || request.clean_start || ends_with_connection {
                            let principal = self.sessions[&key].principal.clone();
                            self.publish_will(&will, principal.as_deref(), &client_id, now);
                        }
                    }
                }
                self.detach_connection(
                    old,
                    CloseReason::TakenOver,
                    Some(reason::SESSION_TAKEN_OVER),
                );
            }
            // A session with expiry 0 ends with its connection (MQTT 5
            // 3.1.2.11.2; 3.1.1 clean session 1), and a takeover closes that
            // connection: the new one starts afresh.
            if request.clean_start || (old_connection.is_some() && ends_with_connection) {
                self.end_session(key, now);
            } else {
                session_present = true;
            }
        }

        let key = if session_present {
            self.by_client_id[&client_id]
        } else {
            let key = self.next_session;
            self.next_session += 1;
            self.sessions.insert(
                key,
                Session::new(client_id.clone(), request.principal.clone()),
            );
            self.by_client_id.insert(client_id.clone(), key);
            self.metrics.sessions.fetch_add(1, Relaxed);
            key
        };
        self.detached.remove(&key);
        {
            let session = self.sessions.get_mut(&key).expect("inserted above");
            session.connection = Some(connection);
            session.expiry_interval = expiry;
            session.expires_at = None;
            // A new connection before the Will delay passed cancels the Will.
            session.pending_will = None;
        }
        let receive_maximum = if request.v5 {
            usize::from(request.receive_maximum.max(1))
        } else {
            usize::from(self.limits.receive_maximum.max(1))
        };
        self.connections.insert(
            connection,
            Connection {
                handle,
                session: key,
                v5: request.v5,
                receive_maximum,
                maximum_packet_size: request.maximum_packet_size,
                will: request.will,
            },
        );
        self.metrics.connections.fetch_add(1, Relaxed);
        self.send(
            connection,
            Outbound::ConnAck {
                session_present,
                reason: reason::SUCCESS,
                assigned_client_id: assigned,
                session_expiry: (request.v5 && expiry != wanted_expiry).then_some(expiry),
                receive_maximum: self.limits.receive_maximum,
                maximum_packet_size: self.limits.max_packet_size,
                topic_alias_maximum: self.limits.topic_alias_maximum,
            },
        );
        if session_present {
            self.replay(connection, key, now);
        }
        self.promote(key, now);
    }

    /// Resend every unfinished exchange in its original order: PUBLISH with
    /// DUP=1 and the same packet id, or PUBREL for those awaiting PUBCOMP.
    /// A resent PUBLISH carries the expiry left at `now` (MQTT-3.3.2-6);
    /// one whose lifetime ran out while in flight is still resent, as its
    /// delivery had started (MQTT-4.4.0-1), with 0 left.
    fn replay(&mut self, connection: u64, key: SessionKey, now: Instant) {
        let session = &self.sessions[&key];
        let packets: Vec<Outbound> = session
            .inflight
            .iter()
            .map(|entry| match (&entry.phase, &entry.queued) {
                (InflightPhase::AwaitPubcomp, _) | (_, None) => Outbound::PubRel {
                    packet_id: entry.packet_id,
                    reason: reason::SUCCESS,
                },
                (_, Some(q)) => Outbound::Publish {
                    packet_id: entry.packet_id,
                    qos: q.qos,
                    retain: q.retain,
                    dup: true,
                    message: q.message.clone(),
                    subscription_ids: q.subscription_ids.clone(),
                    expiry: q.message.expiry_left(now).unwrap_or(Some(0)),
                    sys: false,
                },
            })
            .collect();
        for packet in packets {
            self.send(connection, packet);
        }
    }

    // ---- packets ------------------------------------------------------

    fn on_packet(&mut self, connection: u64, packet: Inbound, now: Instant) {
        let Some(conn) = self.connections.get(&connection) else {
            return;
        };
        let key = conn.session;
        let v5 = conn.v5;
        match packet {
            Inbound::Publish(publish) => self.on_publish(connection, key, v5, publish, now),
            Inbound::PubAck { packet_id, .. } => {
                let session = self.sessions.get_mut(&key).expect("connected session");
                if matches!(
                    session.inflight.get_mut(packet_id).map(|e| &e.phase),
                    Some(InflightPhase::AwaitPuback)
                ) {
                    session.inflight.remove(packet_id);
                    self.promote(key, now);
                }
            }
            Inbound::PubRec {
                packet_id,
                reason: code,
            } => {
                let session = self.sessions.get_mut(&key).expect("connected session");
                match session.inflight.get_mut(packet_id) {
                    Some(entry) if matches!(entry.phase, InflightPhase::AwaitPubrec) => {
                        if code >= 0x80 {
                            // v5: the receiver refused it; the exchange ends here.
                            session.inflight.remove(packet_id);
                            self.promote(key, now);
                        } else {
                            entry.phase = InflightPhase::AwaitPubcomp;
                            entry.queued = None;
                            self.send(
                                connection,
                                Outbound::PubRel {
                                    packet_id,
                                    reason: reason::SUCCESS,
                                },
                            );
                        }
                    }
                    Some(entry) if matches!(entry.phase, InflightPhase::AwaitPubcomp) => {
                        self.send(
                            connection,
                            Outbound::PubRel {
                                packet_id,
                                reason: reason::SUCCESS,
                            },
                        );
                    }
                    Some(_) => self.doom(connection, CloseReason::Protocol, reason::PROTOCOL_ERROR),
                    None => self.send(
                        connection,
                        Outbound::PubRel {
                            packet_id,
                            reason: reason::PACKET_IDENTIFIER_NOT_FOUND,
                        },
                    ),
                }
            }
            Inbound::PubComp { packet_id } => {
                let session = self.sessions.get_mut(&key).expect("connected session");
                if matches!(
                    session.inflight.get_mut(packet_id).map(|e| &e.phase),
                    Some(InflightPhase::AwaitPubcomp)
                ) {
                    session.inflight.remove(packet_id);
                    self.promote(key, now);
                }
            }
            Inbound::PubRel { packet_id } => {
                let session = self.sessions.get_mut(&key).expect("connected session");
                let code = if session.inbound_qos2.remove(&packet_id).is_some() {
                    reason::SUCCESS
                } else {
                    reason::PACKET_IDENTIFIER_NOT_FOUND
                };
                self.send(
                    connection,
                    Outbound::PubComp {
                        packet_id,
                        reason: code,
                    },
                );
            }
            Inbound::Subscribe {
                packet_id,
                subscription_id,
                filters,
            } => self.on_subscribe(connection, key, packet_id, subscription_id, filters, now),
            Inbound::Unsubscribe { packet_id, filters } => {
                let mut reasons = Vec::with_capacity(filters.len());
                for raw in filters {
                    let existed = self.unsubscribe(key, &raw);
                    reasons.push(if existed {
                        reason::SUCCESS
                    } else {
                        reason::NO_SUBSCRIPTION_EXISTED
                    });
                }
                self.send(connection, Outbound::UnsubAck { packet_id, reasons });
            }
            Inbound::PingReq => self.send(connection, Outbound::PingResp),
            Inbound::Disconnect {
                reason: code,
                session_expiry,
            } => {
                if let Some(asked) = session_expiry {
                    let session = self.sessions.get_mut(&key).expect("connected session");
                    if session.expiry_interval == 0 && asked != 0 {
                        // MQTT 5 3.14.2.2.2: a session that was to end with
                        // the connection cannot be made to outlive it here.
                        self.doom(connection, CloseReason::Protocol, reason::PROTOCOL_ERROR);
                        return;
                    }
                    session.expiry_interval = asked.min(self.limits.max_session_expiry);
                }
                let close_reason = if code == reason::DISCONNECT_WITH_WILL {
                    CloseReason::ClientDisconnectWithWill
                } else {
                    CloseReason::ClientDisconnect
                };
                self.close(connection, close_reason, None, now);
            }
        }
    }

    fn doom(&mut self, connection: u64, reason: CloseReason, code: u8) {
        self.doomed.push((connection, reason, Some(code)));
    }

    fn on_publish(
        &mut self,
        connection: u64,
        key: SessionKey,
        v5: bool,
        publish: InboundPublish,
        now: Instant,
    ) {
        self.metrics.messages_received.fetch_add(1, Relaxed);
        let InboundPublish {
            packet_id,
            qos,
            retain,
            dup: _,
            topic,
            payload,
            properties,
        } = publish;
        let session = self.sessions.get(&key).expect("connected session");
        if qos == 2 && session.inbound_qos2.contains_key(&packet_id) {
            // Method B: already routed; a duplicate only gets PUBREC.
            self.send(
                connection,
                Outbound::PubRec {
                    packet_id,
                    reason: reason::SUCCESS,
                },
            );
            return;
        }
        // `$SYS/...` is the broker's own: clients are refused as by the ACL.
        let allowed = !topic.starts_with("$SYS")
            && (!self.authorizer.is_active()
                || self.authorizer.can_publish(
                    session.principal.as_deref(),
                    &session.client_id,
                    &topic,
                ));
        if qos == 2 && (allowed || !v5) {
            // A denied 3.1.1 QoS 2 still completes the handshake: keep the id
            // so a duplicate gets PUBREC and PUBREL gets PUBCOMP.
            let session = self.sessions.get_mut(&key).expect("connected session");
            session.inbound_qos2.insert(packet_id, now);
            if v5 && session.inbound_qos2.len() > usize::from(self.limits.receive_maximum) {
                self.doom(
                    connection,
                    CloseReason::Protocol,
                    reason::RECEIVE_MAXIMUM_EXCEEDED,
                );
                return;
            }
        }
        if allowed {
            let message = Arc::new(Message {
                topic,
                payload,
                qos,
                retain,
                properties,
                received_at: now,
            });
            if retain {
                self.store_retained(&message);
            }
            self.route(message, Some(key), now);
        }
        let code = if allowed {
            reason::SUCCESS
        } else {
            reason::NOT_AUTHORIZED
        };
        match qos {
            1 => self.send(
                connection,
                Outbound::PubAck {
                    packet_id,
                    reason: code,
                },
            ),
            2 => self.send(
                connection,
                Outbound::PubRec {
                    packet_id,
                    reason: code,
                },
            ),
            _ => {}
        }
    }

    fn store_retained(&mut self, message: &Arc<Message>) {
        if message.payload.is_empty() {
            self.retained.remove(&message.topic);
        } else {
            // Topic and payload are slices of the connection's read buffer;
            // a retained message may live for months, so it gets its own
            // bytes instead of pinning that buffer.
            let own = Message {
                topic: ByteStr::from(&*message.topic),
                payload: Bytes::copy_from_slice(&message.payload),
                ..Message::clone(message)
            };
            self.retained.set(Arc::new(own));
        }
        self.metrics
            .retained
            .store(self.retained.len() as i64, Relaxed);
    }

    // ---- routing ------------------------------------------------------

    /// Fan `message` out to every matching session: one delivery per
    /// session, at the highest matching QoS, the payload shared by `Arc`.
    fn route(&mut self, message: Arc<Message>, publisher: Option<SessionKey>, now: Instant) {
        let mut matches = std::mem::take(&mut self.scratch_matches);
        let mut deliveries = std::mem::take(&mut self.scratch_deliveries);
        {
            let sessions = &self.sessions;
            self.index.matches(
                &message.topic,
                &|k| sessions.get(&k).is_some_and(|s| s.connection.is_some()),
                &mut matches,
            );
        }
        merge_matches(&mut matches, publisher, &mut deliveries);
        for d in deliveries.drain(..) {
            let retain = d.retain_as_published && message.retain;
            let qos = d.qos.min(message.qos);
            self.deliver(
                d.session,
                message.clone(),
                qos,
                retain,
                d.subscription_ids,
                false,
                now,
            );
        }
        self.scratch_matches = matches;
        self.scratch_deliveries = deliveries;
    }

    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        key: SessionKey,
        message: Arc<Message>,
        qos: u8,
        retain: bool,
        subscription_ids: Vec<u32>,
        sys: bool,
        now: Instant,
    ) {
        let Some(session) = self.sessions.get_mut(&key) else {
            return;
        };
        if self.authorizer.is_active()
            && !self.authorizer.can_receive(
                session.principal.as_deref(),
                &session.client_id,
                &message.topic,
            )
        {
            return;
        }
        let queued = QueuedMessage {
            message,
            qos,
            retain,
            subscription_ids,
        };
        let Some(connection) = session.connection else {
            if qos > 0 && session.expiry_interval > 0 {
                Self::enqueue(&self.metrics, &self.limits, session, queued);
            } else {
                self.metrics.dropped(DropReason::Offline);
            }
            return;
        };
        if qos == 0 {
            self.transmit(connection, queued, 0, sys, now);
            return;
        }
        let window = self
            .connections
            .get(&connection)
            .map_or(0, |c| c.receive_maximum);
        // Receive Maximum counts every exchange not yet finished by PUBACK,
        // PUBCOMP or a PUBREC >= 0x80 (MQTT 5 3.3.4).
        if session.pending.is_empty() && session.inflight.len() < window {
            self.start_exchange(key, connection, queued, now);
        } else {
            Self::enqueue(&self.metrics, &self.limits, session, queued);
        }
    }

    fn enqueue(metrics: &Metrics, limits: &Limits, session: &mut Session, queued: QueuedMessage) {
        if session.pending.len() >= limits.max_queued_messages {
            metrics.dropped(DropReason::QueueFull);
        } else {
            session.pending.push_back(queued);
        }
    }

    /// Put a QoS 1/2 message in flight (or drop it, as if delivered, when it
    /// expired or is too large for the client).
    fn start_exchange(
        &mut self,
        key: SessionKey,
        connection: u64,
        queued: QueuedMessage,
        now: Instant,
    ) {
        if !self.fits(connection, &queued, now) {
            return;
        }
        let session = self.sessions.get_mut(&key).expect("caller checked");
        let Some(packet_id) = session.inflight.allocate_id() else {
            Self::enqueue(&self.metrics, &self.limits, session, queued);
            return;
        };
        let qos = queued.qos;
        session.inflight.push(InflightEntry {
            packet_id,
            phase: if qos == 1 {
                InflightPhase::AwaitPuback
            } else {
                InflightPhase::AwaitPubrec
            },
            queued: Some(queued.clone()),
        });
        self.transmit(connection, queued, packet_id, false, now);
    }

    /// Is the message still alive, and within the client's maximum packet
    /// size? Counts the drop when not.
    fn fits(&self, connection: u64, queued: &QueuedMessage, now: Instant) -> bool {
        if queued.message.expiry_left(now).is_err() {
            self.metrics.dropped(DropReason::Expired);
            return false;
        }
        if let Some(conn) = self.connections.get(&connection) {
            if let Some(max) = conn.maximum_packet_size {
                let len = publish_packet_len(
                    &queued.message,
                    queued.qos,
                    conn.v5,
                    &queued.subscription_ids,
                );
                if len > max as usize {
                    self.metrics.dropped(DropReason::TooLarge);
                    return false;
                }
            }
        }
        true
    }

    fn transmit(
        &mut self,
        connection: u64,
        queued: QueuedMessage,
        packet_id: u16,
        sys: bool,
        now: Instant,
    ) {
        if packet_id == 0 && !self.fits(connection, &queued, now) {
            return;
        }
        let Ok(expiry) = queued.message.expiry_left(now) else {
            return;
        };
        self.send(
            connection,
            Outbound::Publish {
                packet_id,
                qos: queued.qos,
                retain: queued.retain,
                dup: false,
                message: queued.message,
                subscription_ids: queued.subscription_ids,
                expiry,
                sys,
            },
        );
    }

    /// Move pending messages into flight while the client's window allows.
    fn promote(&mut self, key: SessionKey, now: Instant) {
        loop {
            let Some(session) = self.sessions.get_mut(&key) else {
                return;
            };
            let Some(connection) = session.connection else {
                return;
            };
            let window = self
                .connections
                .get(&connection)
                .map_or(0, |c| c.receive_maximum);
            if session.inflight.len() >= window {
                return;
            }
            let Some(queued) = session.pending.pop_front() else {
                return;
            };
            self.start_exchange(key, connection, queued, now);
            if self.doomed.iter().any(|(c, _, _)| *c == connection) {
                return;
            }
        }
    }

    // ---- SUBSCRIBE ------------------------------------------------------

    fn on_subscribe(
        &mut self,
        connection: u64,
        key: SessionKey,
        packet_id: u16,
        subscription_id: Option<u32>,
        filters: Vec<(String, SubOptions)>,
        now: Instant,
    ) {
        let mut reasons = Vec::with_capacity(filters.len());
        let mut retained_for: Vec<(String, SubOptions)> = Vec::new();
        for (raw, mut options) in filters {
            options.subscription_id = subscription_id;
            let parsed = match topic::parse_filter(&raw) {
                Ok(p) => p,
                Err(_) => {
                    reasons.push(reason::TOPIC_FILTER_INVALID);
                    continue;
                }
            };
            if parsed.share_group.is_some() && options.no_local {
                // MQTT 5 3.8.3.1: No Local on a shared subscription.
                self.doom(connection, CloseReason::Protocol, reason::PROTOCOL_ERROR);
                return;
            }
            let session = self.sessions.get_mut(&key).expect("connected session");
            if self.authorizer.is_active()
                && !self.authorizer.can_subscribe(
                    session.principal.as_deref(),
                    &session.client_id,
                    parsed.filter,
                )
            {
                reasons.push(reason::NOT_AUTHORIZED);
                continue;
            }
            let existed = session.subscriptions.contains_key(&raw);
            if !existed && session.subscriptions.len() >= self.limits.max_subscriptions_per_session
            {
                reasons.push(reason::QUOTA_EXCEEDED);
                continue;
            }
            session.subscriptions.insert(
                raw.clone(),
                SessionSubscription {
                    share_group: parsed.share_group.map(str::to_owned),
                    filter: parsed.filter.to_owned(),
                    options,
                },
            );
            let replaced = self
                .index
                .insert(parsed.share_group, parsed.filter, key, options);
            if !replaced {
                self.metrics.subscriptions.fetch_add(1, Relaxed);
            }
            reasons.push(options.qos);
            let wants_retained = match options.retain_handling {
                0 => true,
                1 => !existed,
                _ => false,
            };
            if wants_retained && parsed.share_group.is_none() {
                retained_for.push((parsed.filter.to_owned(), options));
            }
        }
        self.send(connection, Outbound::SubAck { packet_id, reasons });
        let mut found = Vec::new();
        for (filter, options) in retained_for {
            found.clear();
            self.retained.matching(&filter, &mut found);
            for message in found.drain(..) {
                let qos = options.qos.min(message.qos);
                self.deliver(
                    key,
                    message,
                    qos,
                    true,
                    options.subscription_id.into_iter().collect(),
                    false,
                    now,
                );
            }
            if filter.starts_with("$SYS") {
                for message in self.sys_messages(now) {
                    if topic::filter_matches(&filter, &message.topic) {
                        self.deliver(
                            key,
                            message,
                            0,
                            true,
                            options.subscription_id.into_iter().collect(),
                            true,
                            now,
                        );
                    }
                }
            }
        }
    }

    fn unsubscribe(&mut self, key: SessionKey, raw: &str) -> bool {
        let Some(session) = self.sessions.get_mut(&key) else {
            return false;
        };
        let Some(sub) = session.subscriptions.remove(raw) else {
            return false;
        };
        if self
            .index
            .remove(sub.share_group.as_deref(), &sub.filter, key)
        {
            self.metrics.subscriptions.fetch_sub(1, Relaxed);
        }
        true
    }

    // ---- ending connections and sessions --------------------------------

    /// Drop the connection from the state and tell its tasks to finish: send
    /// DISCONNECT `code` first when there is room for it.
    fn detach_connection(
        &mut self,
        connection: u64,
        reason: CloseReason,
        code: Option<u8>,
    ) -> Option<Connection> {
        let conn = self.connections.remove(&connection)?;
        self.metrics.connections.fetch_sub(1, Relaxed);
        self.metrics.disconnected(reason);
        let sent = match code {
            Some(code) => conn
                .handle
                .outbound
                .try_send(Outbound::Disconnect {
                    reason: code,
                    reason_string: Some(reason.describe()),
                })
                .is_ok(),
            // The writer finishes what is queued and closes when the queue's
            // sender (held only here) is dropped.
            None => true,
        };
        if !sent || matches!(reason, CloseReason::SlowConsumer) {
            let _ = conn.handle.kill.send(true);
        }
        if let Some(session) = self.sessions.get_mut(&conn.session) {
            if session.connection == Some(connection) {
                session.connection = None;
            }
        }
        Some(conn)
    }

    /// End `connection` for `reason`: Will handling, then the session either
    /// ends or waits for its expiry.
    fn close(&mut self, connection: u64, reason: CloseReason, code: Option<u8>, now: Instant) {
        let Some(mut conn) = self.detach_connection(connection, reason, code) else {
            return;
        };
        let key = conn.session;
        let Some(session) = self.sessions.get_mut(&key) else {
            return;
        };
        let will = conn
            .will
            .take()
            .filter(|_| reason.sends_will() && !self.shutting_down);
        let expiry = session.expiry_interval;
        if let Some(will) = will {
            if will.delay == 0 || expiry == 0 {
                let principal = session.principal.clone();
                let client_id = session.client_id.clone();
                self.publish_will(&will, principal.as_deref(), &client_id, now);
            } else {
                let message = Self::will_message(&will, now);
                let delay = will.delay.min(expiry);
                let session = self.sessions.get_mut(&key).expect("checked above");
                session.pending_will = Some(PendingWill {
                    message,
                    publish_at: now + Duration::from_secs(u64::from(delay)),
                });
            }
        }
        let Some(session) = self.sessions.get_mut(&key) else {
            return;
        };
        if session.connection.is_some() {
            return;
        }
        if expiry == 0 {
            self.end_session(key, now);
        } else {
            session.expires_at = Some(now + Duration::from_secs(u64::from(expiry)));
            self.session_store.keep(session);
            self.detached.insert(key);
        }
    }

    fn will_message(will: &WillRequest, now: Instant) -> Arc<Message> {
        Arc::new(Message {
            topic: will.topic.clone(),
            payload: will.payload.clone(),
            qos: will.qos,
            retain: will.retain,
            properties: will.properties.clone(),
            received_at: now,
        })
    }

    fn publish_will(
        &mut self,
        will: &WillRequest,
        principal: Option<&str>,
        client_id: &str,
        now: Instant,
    ) {
        if self.shutting_down {
            return;
        }
        if self.authorizer.is_active()
            && !self
                .authorizer
                .can_publish(principal, client_id, &will.topic)
        {
            return;
        }
        let message = Self::will_message(will, now);
        self.publish_message(message, now);
    }

    fn publish_message(&mut self, message: Arc<Message>, now: Instant) {
        if message.retain {
            self.store_retained(&message);
        }
        self.route(message, None, now);
    }

    /// Forget a session: its subscriptions, queues and any pending Will
    /// (published now, as the session ends before its delay).
    fn end_session(&mut self, key: SessionKey, now: Instant) {
        let Some(session) = self.sessions.remove(&key) else {
            return;
        };
        self.metrics.sessions.fetch_sub(1, Relaxed);
        self.detached.remove(&key);
        self.session_store.forget(&session.client_id);
        if self.by_client_id.get(&session.client_id) == Some(&key) {
            self.by_client_id.remove(&session.client_id);
        }
        for sub in session.subscriptions.values() {
            if self
                .index
                .remove(sub.share_group.as_deref(), &sub.filter, key)
            {
                self.metrics.subscriptions.fetch_sub(1, Relaxed);
            }
        }
        if let Some(will) = session.pending_will {
            if !self.shutting_down {
                self.publish_message(will.message, now);
            }
        }
    }

    // ---- time -----------------------------------------------------------

    /// What [`tick`](Self::tick) would do for one detached session at `now`:
    /// publish its Will when the delay passed, end it when it expired.
    fn settle_due(&mut self, key: SessionKey, now: Instant) {
        if !self.detached.contains(&key) {
            return;
        }
        let Some(session) = self.sessions.get_mut(&key) else {
            return;
        };
        let will = session
            .pending_will
            .take_if(|w| w.publish_at <= now)
            .map(|w| w.message);
        let expired = session.expires_at.is_some_and(|at| at <= now);
        if let Some(will) = will {
            self.publish_message(will, now);
        }
        if expired {
            self.end_session(key, now);
        }
    }

    /// Publish Wills whose delay passed and end sessions that expired.
    pub fn tick(&mut self, now: Instant) {
        let mut wills = Vec::new();
        let mut expired = Vec::new();
        for &key in &self.detached {
            let Some(session) = self.sessions.get_mut(&key) else {
                continue;
            };
            if session
                .pending_will
                .as_ref()
                .is_some_and(|w| w.publish_at <= now)
            {
                wills.push(session.pending_will.take().expect("checked").message);
            }
            if session.expires_at.is_some_and(|at| at <= now) {
                expired.push(key);
            }
        }
        wills.sort_by(|a, b| a.topic.cmp(&b.topic));
        for will in wills {
            self.publish_message(will, now);
        }
        expired.sort_unstable();
        for key in expired {
            self.end_session(key, now);
        }
        // Unreleased QoS 2 holds: looked at once a minute at most.
        if self.next_exactly_once_sweep.is_none_or(|at| at <= now) {
            self.next_exactly_once_sweep = Some(now + Duration::from_secs(60));
            if let Some(cutoff) = now.checked_sub(self.limits.exactly_once_expires_after) {
                for session in self.sessions.values_mut() {
                    let before = session.inbound_qos2.len();
                    session.inbound_qos2.retain(|_, at| *at > cutoff);
                    for _ in session.inbound_qos2.len()..before {
                        self.metrics.dropped(DropReason::ExactlyOnceExpired);
                    }
                }
            }
        }
        self.close_doomed(now);
    }

    /// The `$SYS/broker/...` statistics as messages.
    fn sys_messages(&self, now: Instant) -> Vec<Arc<Message>> {
        let m = &self.metrics;
        let values = [
            ("$SYS/broker/version", self.version.clone()),
            (
                "$SYS/broker/uptime",
                format!("{} seconds", m.started.elapsed().as_secs()),
            ),
            (
                "$SYS/broker/clients/connected",
                m.connections.load(Relaxed).to_string(),
            ),
            (
                "$SYS/broker/messages/received",
                m.messages_received.load(Relaxed).to_string(),
            ),
            (
                "$SYS/broker/messages/sent",
                m.messages_sent.load(Relaxed).to_string(),
            ),
            (
                "$SYS/broker/subscriptions/count",
                m.subscriptions.load(Relaxed).to_string(),
            ),
            (
                "$SYS/broker/retained messages/count",
                self.retained.len().to_string(),
            ),
        ];
        values
            .into_iter()
            .map(|(topic, value)| {
                Arc::new(Message {
                    topic: topic.into(),
                    payload: Bytes::from(value),
                    qos: 0,
                    retain: false,
                    properties: MessageProperties::default(),
                    received_at: now,
                })
            })
            .collect()
    }

    /// Publish the `$SYS` statistics: QoS 0, not retained, not counted,
    /// delivered only to matching subscriptions the ACL allows.
    pub fn publish_sys(&mut self, now: Instant) {
        for message in self.sys_messages(now) {
            let mut matches = std::mem::take(&mut self.scratch_matches);
            let mut deliveries = std::mem::take(&mut self.scratch_deliveries);
            {
                let sessions = &self.sessions;
                self.index.matches(
                    &message.topic,
                    &|k| sessions.get(&k).is_some_and(|s| s.connection.is_some()),
                    &mut matches,
                );
            }
            merge_matches(&mut matches, None, &mut deliveries);
            for d in deliveries.drain(..) {
                self.deliver(
                    d.session,
                    message.clone(),
                    0,
                    false,
                    d.subscription_ids,
                    true,
                    now,
                );
            }
            self.scratch_matches = matches;
            self.scratch_deliveries = deliveries;
        }
        self.close_doomed(now);
    }

    /// Server shutdown: no Will is published; every v5 client gets
    /// DISCONNECT 0x8B; every connection is told to close.
    pub fn shutdown(&mut self) {
        self.shutting_down = true;
        let mut connections: Vec<u64> = self.connections.keys().copied().collect();
        connections.sort_unstable();
        for connection in connections {
            if let Some(mut conn) = self.detach_connection(
                connection,
                CloseReason::Shutdown,
                Some(reason::SERVER_SHUTTING_DOWN),
            ) {
                conn.will = None;
            }
        }
        for session in self.sessions.values_mut() {
            session.pending_will = None;
            if session.expiry_interval > 0 {
                self.session_store.keep(session);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::retained::MemoryRetained;

    struct Client {
        rx: mpsc::Receiver<Outbound>,
        kill: watch::Receiver<bool>,
    }

    impl Client {
        fn drain(&mut self) -> Vec<Outbound> {
            let mut out = Vec::new();
            while let Ok(o) = self.rx.try_recv() {
                out.push(o);
            }
            out
        }
    }

    fn state() -> BrokerState {
        BrokerState::new(
            Limits::default(),
            Arc::new(Metrics::new()),
            Arc::new(AllowAll),
            Box::new(MemoryRetained::new()),
        )
    }

    fn connect(
        state: &mut BrokerState,
        conn: u64,
        id: &str,
        clean: bool,
        queue: usize,
        now: Instant,
    ) -> Client {
        let (tx, rx) = mpsc::channel(queue);
        let (kill_tx, kill) = watch::channel(false);
        state.handle(
            Event::Connect {
                connection: conn,
                request: Box::new(ConnectRequest {
                    v5: true,
                    client_id: id.into(),
                    clean_start: clean,
                    keep_alive: 60,
                    principal: None,
                    will: None,
                    session_expiry: if clean { 0 } else { 300 },
                    receive_maximum: 10,
                    maximum_packet_size: None,
                }),
                handle: ConnectionHandle {
                    outbound: tx,
                    kill: kill_tx,
                },
            },
            now,
        );
        Client { rx, kill }
    }

    fn packets(state: &mut BrokerState, conn: u64, packets: Vec<Inbound>, now: Instant) {
        state.handle(
            Event::Packets {
                connection: conn,
                packets,
            },
            now,
        );
    }

    fn subscribe(filter: &str, qos: u8) -> Inbound {
        Inbound::Subscribe {
            packet_id: 1,
            subscription_id: None,
            filters: vec![(
                filter.into(),
                SubOptions {
                    qos,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                    subscription_id: None,
                },
            )],
        }
    }

    fn publish(topic: &str, qos: u8, id: u16) -> Inbound {
        Inbound::Publish(InboundPublish {
            packet_id: id,
            qos,
            retain: false,
            dup: false,
            topic: ByteStr::from(topic),
            payload: Bytes::from_static(b"p"),
            properties: MessageProperties::default(),
        })
    }

    #[test]
    fn late_events_of_a_taken_over_generation_do_nothing() {
        let now = Instant::now();
        let mut s = state();
        let mut old = connect(&mut s, 1, "c", false, 64, now);
        packets(&mut s, 1, vec![subscribe("t", 1)], now);
        let mut new = connect(&mut s, 2, "c", false, 64, now);
        assert!(matches!(
            old.drain().last(),
            Some(Outbound::Disconnect { reason: 0x8E, .. })
        ));
        assert!(matches!(
            new.drain().first(),
            Some(Outbound::ConnAck {
                session_present: true,
                ..
            })
        ));
        // The old connection's late packets and close are ignored.
        packets(
            &mut s,
            1,
            vec![Inbound::Unsubscribe {
                packet_id: 2,
                filters: vec!["t".into()],
            }],
            now,
        );
        s.handle(
            Event::Closed {
                connection: 1,
                reason: CloseReason::Network,
                disconnect_reason: None,
            },
            now,
        );
        assert_eq!(s.connection_count(), 1);
        let _pub = connect(&mut s, 3, "p", true, 64, now);
        packets(&mut s, 3, vec![publish("t", 1, 1)], now);
        assert!(new
            .drain()
            .iter()
            .any(|o| matches!(o, Outbound::Publish { qos: 1, .. })));
    }

    #[test]
    fn a_full_outbound_queue_disconnects_only_that_consumer() {
        let now = Instant::now();
        let mut s = state();
        let mut slow = connect(&mut s, 1, "slow", true, 4, now);
        packets(&mut s, 1, vec![subscribe("t", 0)], now);
        let mut fast = connect(&mut s, 2, "fast", true, 1024, now);
        packets(&mut s, 2, vec![subscribe("t", 0)], now);
        let _p = connect(&mut s, 3, "p", true, 64, now);
        packets(
            &mut s,
            3,
            (0..10).map(|_| publish("t", 0, 0)).collect(),
            now,
        );
        assert!(*slow.kill.borrow(), "the slow consumer is told to close");
        assert!(!*fast.kill.borrow());
        let delivered = fast
            .drain()
            .iter()
            .filter(|o| matches!(o, Outbound::Publish { .. }))
            .count();
        assert_eq!(delivered, 10);
        assert_eq!(s.connection_count(), 2);
        let _ = slow.drain();
    }

    #[test]
    fn offline_queue_is_bounded_and_replayed_in_order() {
        let now = Instant::now();
        let mut s = BrokerState::new(
            Limits {
                max_queued_messages: 3,
                ..Limits::default()
            },
            Arc::new(Metrics::new()),
            Arc::new(AllowAll),
            Box::new(MemoryRetained::new()),
        );
        let _c = connect(&mut s, 1, "c", false, 64, now);
        packets(&mut s, 1, vec![subscribe("t", 1)], now);
        s.handle(
            Event::Closed {
                connection: 1,
                reason: CloseReason::Network,
                disconnect_reason: None,
            },
            now,
        );
        let _p = connect(&mut s, 2, "p", true, 64, now);
        packets(
            &mut s,
            2,
            (1..=5).map(|i| publish("t", 1, i)).collect(),
            now,
        );
        let mut c = connect(&mut s, 3, "c", false, 64, now);
        let out = c.drain();
        let ids: Vec<u16> = out
            .iter()
            .filter_map(|o| match o {
                Outbound::Publish {
                    packet_id,
                    dup: false,
                    ..
                } => Some(*packet_id),
                _ => None,
            })
            .collect();
        assert_eq!(ids, vec![1, 2, 3], "three kept, two dropped and counted");
        assert_eq!(s.metrics.dropped_count(DropReason::QueueFull), 2);
    }

    #[test]
    fn unreleased_qos2_holds_expire_and_are_counted() {
        let now = Instant::now();
        let mut s = state();
        let mut p = connect(&mut s, 1, "p", true, 64, now);
        packets(&mut s, 1, vec![publish("t", 2, 5)], now);
        s.tick(now + Duration::from_secs(10));
        assert_eq!(s.metrics.dropped_count(DropReason::ExactlyOnceExpired), 0);
        s.next_exactly_once_sweep = None;
        s.tick(now + Duration::from_secs(3601));
        assert_eq!(s.metrics.dropped_count(DropReason::ExactlyOnceExpired), 1);
        // The id is free again: PUBREL for it is now unknown.
        packets(&mut s, 1, vec![Inbound::PubRel { packet_id: 5 }], now);
        assert!(p.drain().iter().any(|o| matches!(
            o,
            Outbound::PubComp {
                packet_id: 5,
                reason: 0x92
            }
        )));
    }
}
