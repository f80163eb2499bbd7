//! What each format 21 file holds, as Rust values. The byte layout of each
//! is in `FORMAT.md` §2; the rules the semantic pass enforces are in
//! `validate.rs` and the same section.

use super::FileKind;
use crate::model::{ChannelKind, PublishProps, Record, UnixNanos, UserProperty};

/// One channel's file: its counters, its records (or queue items), its
/// consumers' positions, the exactly-once publishes it holds and, for a
/// queue, its dead-letter channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelFile {
    /// The channel's configured name (not the file name).
    pub name: String,
    pub kind: ChannelKind,
    /// The offset the next record will take; stored, never derived.
    pub next: u64,
    /// The oldest offset that can still be read; stored, never derived.
    pub floor: u64,
    /// The bytes the channel counts against its bounds
    /// (`Record::accounted_size` summed by the writer).
    pub bytes: u64,
    /// Append: the log from the floor up. Latest: the current value of each
    /// topic, one per topic, an empty payload being a deletion tombstone.
    /// Queue: always empty (a queue keeps `items`).
    pub records: Vec<Record>,
    /// Queue only: every unresolved record with its delivery history.
    pub items: Vec<QueueItem>,
    /// Durable consumers' positions in this channel.
    pub positions: Vec<Position>,
    /// Exactly-once publishes held until their PUBREL.
    pub held: Vec<HeldPublish>,
    /// Queue only: the dead-letter channel `<queue>.dlq`, kept in the
    /// queue's own file.
    pub dead_letter: Option<DeadLetter>,
}

impl ChannelFile {
    /// An empty channel of `kind` at offsets `1..` with nothing held.
    pub fn new(name: impl Into<String>, kind: ChannelKind) -> ChannelFile {
        ChannelFile {
            name: name.into(),
            kind,
            next: 1,
            floor: 1,
            bytes: 0,
            records: Vec::new(),
            items: Vec::new(),
            positions: Vec::new(),
            held: Vec::new(),
            dead_letter: None,
        }
    }
}

/// A queue's dead-letter channel: an append channel kept inside the
/// queue's file, named `<queue>.dlq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// Always `<queue name>.dlq`.
    pub name: String,
    pub next: u64,
    pub floor: u64,
    pub bytes: u64,
    pub records: Vec<Record>,
    pub positions: Vec<Position>,
}

impl DeadLetter {
    /// The dead-letter channel's name for `queue`.
    pub fn name_for(queue: &str) -> String {
        format!("{queue}{}", crate::channel_name::DLQ_SUFFIX)
    }
}

/// An unresolved queue record. Who holds it, under which Delivery ID and
/// until when are deliberately not stored (invariant 15, `FORMAT.md` §7): every item comes back available.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueItem {
    pub record: Record,
    /// Delivery attempts made so far, so a spent record is dead-lettered
    /// rather than starting over.
    pub attempts: u32,
    /// When it was first handed to a worker; `0` = never.
    pub first_delivered: UnixNanos,
    /// When it was last handed to a worker; `0` = never.
    pub last_delivered: UnixNanos,
}

/// A durable consumer's place in a channel: a cursor, never a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    /// `mqtt:<client id>` for an MQTT session, `bridge:<name>` for an
    /// outbound bridge rule.
    pub reader: String,
    /// The next offset the reader will read; at most the channel's `next`.
    pub offset: u64,
    /// When the position was taken for writing; with `session_expiry` it
    /// lets a loader drop positions whose session expired while the broker
    /// was down.
    pub saved_at: UnixNanos,
    /// The Session Expiry Interval (seconds) granted to the reader's
    /// session. `Some` for every `mqtt:` reader in a channel file (0 means
    /// the session ended with its connection); `None` for `bridge:` readers
    /// and for session cursors on the broadcast log, which are not swept.
    pub session_expiry: Option<u32>,
}

/// The reader-name scheme of an MQTT session's position.
pub const READER_MQTT: &str = "mqtt:";
/// The reader-name scheme of an outbound bridge rule's position.
pub const READER_BRIDGE: &str = "bridge:";

/// An exactly-once publish held between its PUBLISH and its PUBREL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPublish {
    /// The client whose exchange this is.
    pub client_id: String,
    /// The exchange's packet identifier (nonzero, unique per client).
    pub packet_id: u16,
    /// When it was held; what `expires_after` measures.
    pub held_at: UnixNanos,
    /// The record to be written at the release; its `offset` is always 0.
    pub record: Record,
}

/// The manifest: written first at a shutdown, it says when that shutdown
/// began and what it meant to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The moment the shutdown began; a channel file written before it did
    /// not finish in this shutdown.
    pub began_at: UnixNanos,
    /// Every channel file this shutdown asked to be written.
    pub channels: Vec<ManifestEntry>,
    /// Whether the retained store's file was part of this shutdown.
    pub retained: bool,
    /// Whether `saguin.sessions` was part of this shutdown.
    pub sessions: bool,
    /// Whether `saguin.broadcast` was part of this shutdown.
    pub broadcast: bool,
}

/// One channel file a shutdown asked to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    pub channel: String,
    /// Always `channel_name::encode_file_name(channel)`.
    pub file_name: String,
    pub kind: ChannelKind,
}

/// The generation manifest (kind 6), `saguin.manifest`: which files make
/// up the directory's current generation. Written last, after every file
/// it lists is durable, and put in place by one rename: the directory's
/// generation changes in that one step, so at every instant it holds one
/// whole generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The generation's number, from 1, one more than the one it replaces.
    pub generation: u64,
    /// The moment of the broker's state this generation holds: what a crash
    /// loses is measured from it.
    pub captured_at: UnixNanos,
    /// Every file of the generation: each channel's, the retained store's,
    /// the sessions and the broadcast log, whichever generation wrote it.
    pub files: Vec<GenerationFile>,
}

/// One file a generation is made of, and what proves a copy of it is that
/// file: its length, its header's written-at and its trailing checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerationFile {
    /// What it holds: a channel, the retained store, the sessions or the
    /// broadcast log (never a manifest).
    pub kind: FileKind,
    /// The channel's configured name for a channel file; empty otherwise.
    pub channel: String,
    /// The file's name in the directory: the fixed name with the number of
    /// the generation that wrote it (`channel_name::generation_file_name`),
    /// or the fixed name alone for a file a build before generations wrote
    /// (`generation` 0).
    pub file_name: String,
    /// The generation that wrote the file: this one, or an earlier one when
    /// the store had not changed since.
    pub generation: u64,
    /// The file header's written-at: the moment of its generation's state.
    pub written_at: UnixNanos,
    /// The file's length in bytes.
    pub length: u64,
    /// The file's trailing CRC32C.
    pub checksum: u32,
    /// The store changed after this file was written and its newer state
    /// could not be written: what it holds is as of `written_at`, and
    /// whatever happened to the store after that is not kept.
    pub behind: bool,
}

/// The retained store: one retained message per topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetainedFile {
    pub records: Vec<Record>,
}

/// `saguin.sessions`: every persistent session the provider keeps and every
/// shared group's cursor on the broadcast log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionsFile {
    pub sessions: Vec<Session>,
    pub shared_groups: Vec<SharedGroup>,
}

/// A persistent MQTT session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub client_id: String,
    /// The name its client authenticated as, if it did.
    pub principal: Option<String>,
    /// The Session Expiry Interval granted (seconds), after
    /// `limits.max_session_expiry`.
    pub expiry_interval: u32,
    /// When its client went away; `0` while connected.
    pub detached_at: UnixNanos,
    pub subscriptions: Vec<Subscription>,
    pub will: Option<Will>,
    /// The client's Receive Maximum the in-flight table was written under
    /// (1..=65535).
    pub window: u16,
    /// The messages on the wire, in the order they were sent.
    pub inflight: Vec<InflightEntry>,
}

/// One subscription with every option its SUBSCRIBE carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    /// The topic filter as subscribed (a `$share/<group>/` prefix included).
    pub filter: String,
    /// Maximum QoS (0..=2).
    pub qos: u8,
    pub no_local: bool,
    pub retain_as_published: bool,
    /// Retain Handling (0..=2).
    pub retain_handling: u8,
    /// Subscription Identifier (1..=268,435,455), if one was given.
    pub subscription_id: Option<u32>,
    /// The broadcast log's next offset when the subscription was made.
    pub log_offset: u64,
}

/// A session's Will message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Will {
    pub topic: String,
    pub payload: bytes::Bytes,
    pub qos: u8,
    pub retain: bool,
    /// Will Delay Interval, seconds.
    pub delay_interval: u32,
    pub props: PublishProps,
    /// The Will's User Properties in the client's order.
    pub user_properties: Vec<UserProperty>,
}

/// How far a message on the wire has got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InflightPhase {
    /// Sent and unanswered: a PUBACK (QoS 1) or PUBREC (QoS 2) is owed.
    AwaitingAck,
    /// QoS 2 answered with a PUBREC: the PUBREL was sent, a PUBCOMP is owed.
    AwaitingComp,
}

impl InflightPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            InflightPhase::AwaitingAck => "awaiting PUBACK/PUBREC",
            InflightPhase::AwaitingComp => "awaiting PUBCOMP",
        }
    }
}

/// One message on the wire to a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InflightEntry {
    /// The message's offset in the broadcast log.
    pub log_offset: u64,
    /// Nonzero, unique within the session (MQTT-4.4.0-1 re-sends carry it).
    pub packet_id: u16,
    /// 1 or 2.
    pub qos: u8,
    pub phase: InflightPhase,
    /// The shared group that handed the message to the session, if one did.
    pub shared_group: Option<SharedGroupKey>,
}

/// A shared group is named by its group name and its topic filter
/// (`$share/<group>/<filter>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharedGroupKey {
    pub group: String,
    pub filter: String,
}

/// A shared group's cursor on the broadcast log and the deliveries its
/// members' endings returned to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedGroup {
    pub key: SharedGroupKey,
    /// What the group is owed is the log from here on.
    pub cursor: u64,
    /// Log offsets owed again ahead of the cursor, in the order returned.
    pub returned: Vec<u64>,
}

/// `saguin.broadcast`: the log of what sessions are owed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BroadcastFile {
    pub next: u64,
    /// The lowest offset still held; the log may have gaps above it.
    pub floor: u64,
    pub bytes: u64,
    /// Messages in ascending offset order, `shared_copy`/`owed_to` set
    /// where they apply.
    pub messages: Vec<Record>,
    /// Each session's cursor, as reader `mqtt:<client id>` with no expiry.
    pub cursors: Vec<Position>,
    /// QoS 2 broadcasts held for their release.
    pub held: Vec<HeldPublish>,
}

impl Default for BroadcastFile {
    fn default() -> Self {
        BroadcastFile {
            next: 1,
            floor: 1,
            bytes: 0,
            messages: Vec::new(),
            cursors: Vec::new(),
            held: Vec::new(),
        }
    }
}
