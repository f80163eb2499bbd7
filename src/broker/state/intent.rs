//! The protocol between the state and its persisters: a [`Write`] for a
//! [`Role`], sealed into an [`Intent`] with a ticket, answered by
//! [`Event::Committed`](super::Event::Committed) with what each write came
//! to ([`Written`]) or why it did not ([`StorageFailure`]); and what the
//! state owes once it has ([`Parked`]). How writes are staged, sealed and
//! answered is `persist.rs`.

use std::sync::Arc;

use saguin_format::model::{Record, UnixNanos};
use tokio::time::Instant;

use super::consumer::ConsumerStart;
use super::session::SessionSubscription;
use super::{Outbound, ReasonCode};
use crate::broker::message::Message;
use crate::broker::metrics::CloseReason;
use crate::broker::subscriptions::{Delivery, SessionKey};
use crate::storage::contract::{HeldPublish, SessionEntry};
use crate::storage::kept::Kept;

/// Which provider a write goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `broker.session_storage`: sessions, the broadcast log, broadcast
    /// QoS 2 holds.
    Sessions,
    /// `broker.retained_storage`: the retained store.
    Retained,
    /// The append channel of this index (in configuration order): its
    /// records, holds and positions, in the channel's provider.
    Channel(u16),
}

impl Role {
    /// The role's place among the persisters: sessions, retained, then
    /// each channel.
    pub fn index(self) -> usize {
        match self {
            Role::Sessions => 0,
            Role::Retained => 1,
            Role::Channel(i) => 2 + usize::from(i),
        }
    }

    pub(super) fn of_index(index: usize) -> Role {
        match index {
            0 => Role::Sessions,
            1 => Role::Retained,
            i => Role::Channel(u16::try_from(i - 2).unwrap_or(u16::MAX)),
        }
    }
}

/// One write for a provider.
#[derive(Debug, Clone)]
pub enum Write {
    /// A persistent session's record: begun, changed or detached.
    SaveSession(SessionEntry),
    /// A session ended; its broadcast-log cursor goes with it.
    RemoveSession(String),
    SaveCursor {
        client_id: String,
        offset: u64,
    },
    /// A message persistent sessions are owed; answered with its offset.
    AppendLog(Record),
    ReleaseLog(Vec<u64>),
    SetRetained(Record),
    DeleteRetained(String),
    /// A QoS 2 publish held until its PUBREL (in the broadcast log, or
    /// in the channel its record names).
    Hold(HeldPublish),
    DropHold {
        client_id: String,
        packet_id: u16,
    },
    /// A record appended to the role's channel; answered with the record.
    Append(Record),
    /// A held QoS 2 publish written at the channel's next offset (PUBREL);
    /// answered with the record.
    Release {
        client_id: String,
        packet_id: u16,
    },
    /// A channel hold let go without its record (expired, session ended).
    DropChannelHold {
        client_id: String,
        packet_id: u16,
    },
    SavePosition(crate::storage::contract::Position),
    DropPosition(crate::storage::contract::Reader),
    /// The queue record at `offset` handed to `holder` until `lease_until`
    /// (an attempt counted, the one thing stored); answered with the lease.
    Lease {
        offset: u64,
        holder: String,
        lease_until: UnixNanos,
        now: UnixNanos,
    },
    /// A worker finished a delivery: its record is removed.
    Resolve {
        delivery_id: u64,
        epoch: u64,
    },
    /// A delivery failed: its record is available again after the backoff
    /// gap, or moves to the dead-letter channel with its attempts spent.
    ReleaseLease {
        delivery_id: u64,
        epoch: u64,
        now: UnixNanos,
        reason: String,
    },
}

/// What a write came to.
#[derive(Debug, Clone)]
pub enum Written {
    Done,
    /// The offset an [`Write::AppendLog`] took, and the log's own handle
    /// on the message where it keeps one (a memory log's): the deliveries
    /// share it rather than the publish's copy.
    Appended(u64, Option<Kept>),
    /// The retained store's own handle on the value a
    /// [`Write::SetRetained`] set, where it keeps one (a memory store's):
    /// the retained index holds it rather than a copy.
    Retained(Kept),
    /// A record stored in the channel of this index, with its offset.
    Stored(u16, Arc<Record>),
    /// A queue record leased, in the queue of this index.
    Leased(u16, Box<crate::storage::contract::Lease>),
    /// A delivery resolved (false: it was superseded, nothing changed).
    Resolved(u16, u64, bool),
    /// What releasing a delivery did.
    Released(u16, u64, crate::storage::contract::Released),
}

/// Writes for one provider, answered together with one ticket.
#[derive(Debug)]
pub struct Intent {
    pub ticket: u64,
    pub role: Role,
    /// What kind of write it is, for the order a provider serves them in
    /// (group commit: publishes and session writes take turns, writes a
    /// client waits on first).
    pub class: Class,
    pub writes: Vec<Write>,
}

/// The kinds of write a persister takes turns between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A record appended, a retained value replaced: the publish path.
    Publish,
    /// A session write a client's packet waits on (a session begun, a
    /// subscription stored, a QoS 2 publish held or let go).
    Answering,
    /// A departed client's write: a disconnect recorded, a session ended.
    Departed,
    /// A connected session's background write: its in-flight table and
    /// cursor, log entries let go.
    Connected,
}

impl Write {
    /// Is this write on the publish path (rather than a session write)?
    pub fn is_publish(&self) -> bool {
        matches!(
            self,
            Write::AppendLog(_)
                | Write::SetRetained(_)
                | Write::DeleteRetained(_)
                | Write::Append(_)
                | Write::Release { .. }
                // A queue's writes keep transactions of their own, never
                // inside a group of session writes.
                | Write::Lease { .. }
                | Write::Resolve { .. }
                | Write::ReleaseLease { .. }
        )
    }

    /// The client id the write is for, if it is one client's.
    pub fn client(&self) -> Option<&str> {
        match self {
            Write::SaveSession(e) => Some(&e.client_id),
            Write::RemoveSession(c) | Write::SaveCursor { client_id: c, .. } => Some(c),
            Write::Hold(h) => Some(&h.client_id),
            Write::DropHold { client_id, .. }
            | Write::Release { client_id, .. }
            | Write::DropChannelHold { client_id, .. } => Some(client_id),
            Write::SavePosition(p) => Some(p.reader.id()),
            Write::DropPosition(r) => Some(r.id()),
            Write::Append(_)
            | Write::AppendLog(_)
            | Write::ReleaseLog(_)
            | Write::SetRetained(_)
            | Write::DeleteRetained(_)
            | Write::Lease { .. }
            | Write::Resolve { .. }
            | Write::ReleaseLease { .. } => None,
        }
    }
}

/// Why an intent did not commit.
#[derive(Debug, Clone)]
pub struct StorageFailure {
    /// The provider (or channel) was at its bound: 0x97, not 0x83.
    pub full: bool,
    pub message: String,
}

impl StorageFailure {
    /// The MQTT 5 reason code a client is answered with.
    pub fn reason_code(&self) -> ReasonCode {
        if self.full {
            ReasonCode::QuotaExceeded
        } else {
            ReasonCode::ImplementationSpecificError
        }
    }
}

/// What a sealed group owes once its writes committed.
#[derive(Debug)]
pub(super) enum Parked {
    /// Nobody waits (a disconnect recorded, a session ended, a flush).
    Background,
    /// A flush of these sessions' in-flight tables and cursors, taken for
    /// writing at `sealed`; marked dirty again if it fails, so the next
    /// flush retries.
    Flush {
        clients: Vec<Arc<str>>,
        sealed: Instant,
    },
    ConnAck {
        connection: u64,
        key: SessionKey,
        ack: Outbound,
        replay: bool,
    },
    SubAck {
        connection: u64,
        key: SessionKey,
        packet_id: u16,
        reasons: Vec<ReasonCode>,
        /// Why a filter was refused (see [`Outbound::SubAck`]).
        reason_string: Option<Box<str>>,
        /// Filters whose retained messages are sent after the SUBACK.
        retained_for: Vec<(String, crate::broker::subscriptions::SubOptions)>,
        /// The subscriptions as they were, to put back if the write fails.
        undo: Vec<(String, Option<SessionSubscription>)>,
        /// Channels it subscribed to, where their consumers start.
        consumers: Vec<ConsumerStart>,
    },
    UnsubAck {
        connection: u64,
        key: SessionKey,
        packet_id: u16,
        reasons: Vec<ReasonCode>,
        undo: Vec<(String, SessionSubscription)>,
        /// Channels it unsubscribed from, with the raw filter.
        channels: Vec<(u16, String)>,
    },
    /// A publish routed once its retained value, hold or log entry is
    /// stored; `ack` is what its publisher is owed (if anything).
    Publish(Box<ParkedPublish>),
    PubComp {
        connection: u64,
        packet_id: u16,
    },
    /// A packet for a client that needed no write but waits behind those
    /// that did.
    Reply {
        connection: u64,
        packet: Outbound,
    },
    /// A queue write: what becomes of its delivery when it fails.
    Queue(QueueWrite),
    /// The connection's close, after every answer owed before it.
    Close {
        connection: u64,
        reason: CloseReason,
        code: Option<ReasonCode>,
    },
}

#[derive(Debug)]
pub(super) struct ParkedPublish {
    pub connection: Option<u64>,
    pub packet_id: u16,
    pub qos: u8,
    pub message: Arc<Message>,
    pub publisher: Option<SessionKey>,
    /// The matched deliveries, computed when the publish arrived.
    pub deliveries: Vec<Delivery>,
    /// Whether a log entry was asked for (its offset comes with the commit).
    pub logged: bool,
    /// The retained index changes at commit: set (true) or delete.
    pub retain_change: Option<bool>,
    /// The retained store's handle on the value set, when its write
    /// answered with one ([`Written::Retained`]).
    pub retained_kept: Option<Kept>,
    /// The broadcast log's handle on the message appended, when its write
    /// answered with one ([`Written::Appended`]).
    pub logged_kept: Option<Kept>,
    /// The v5 reason the publisher is answered with on success.
    pub code: ReasonCode,
}

impl ParkedPublish {
    /// A client's publish its broadcast subscribers are not handed (one
    /// into a channel, or one the ACL refused): only answered, with `code`.
    pub fn unrouted(
        connection: u64,
        publisher: SessionKey,
        packet_id: u16,
        message: Arc<Message>,
        code: ReasonCode,
    ) -> Parked {
        Parked::Publish(Box::new(ParkedPublish {
            connection: Some(connection),
            packet_id,
            qos: message.qos,
            message,
            publisher: Some(publisher),
            deliveries: Vec::new(),
            logged: false,
            retain_change: None,
            retained_kept: None,
            logged_kept: None,
            code,
        }))
    }
}

/// A queue write in flight, and what becomes of its delivery if it fails.
#[derive(Debug, Clone)]
pub(super) enum QueueWrite {
    Lease { channel: u16, offset: u64 },
    Resolve { channel: u16, offset: u64 },
    Release { channel: u16, offset: u64 },
}
