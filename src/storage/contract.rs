//! The store contracts both providers implement.
//!
//! The broker declares what it asks of an append channel, a latest channel
//! and a queue, and does not care which provider answers. Every method that
//! keeps or reads records returns a [`Result`]: a memory store never fails,
//! but a record the broker was told was stored and was not must never be
//! acknowledged, so the error is in the signature for both. The counters
//! (`next`, `floor`, `bytes`, `depth`, `lowest_position`) return no error: a
//! store is the only writer of its channel and holds them in memory, loaded
//! from what is stored and advanced only from what has committed.
//!
//! Offsets start at 1. `next` is the offset the next record takes and `floor`
//! the oldest offset that can still be read; both are stored, never derived
//! from the surviving records (invariant 9), and only a removal raises the
//! floor, in the same operation that removes.
//!
//! A latest channel's floor is where its changes are whole: every deletion
//! at or above it is still held as a marker, and a marker is only ever
//! forgotten below it. Its values are never removed, so a value set long
//! ago stays current below a raised floor; a reader whose place is below
//! the floor may have missed deletions there, and reads every value again
//! from the first offset ([`read_changes`], the one rule both providers
//! are read by). A latest channel's retention forgets markers from the
//! oldest ([`forgets_deletion`]), raising the floor past the last one
//! forgotten.
//!
//! Every trait is object safe and `Send + Sync`, so the broker holds
//! `Arc<dyn AppendStore>` and the conformance test drives either provider
//! through one script.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use saguin_format::model::{ChannelKind, PublishProps, Record, UnixNanos, UserProperty};

use super::kept::{Kept, KeptRecord};

/// The reason code an MQTT 5 acknowledgement carries for a write the store
/// refused because a bound was reached (Quota exceeded).
pub const REASON_QUOTA_EXCEEDED: u8 = 0x97;
/// The reason code for any other failed write (Implementation specific error).
pub const REASON_WRITE_FAILED: u8 = 0x83;

/// The header a dead-lettered record carries with the attempts made on it.
pub const HEADER_ATTEMPTS: &str = "saguin-attempts";
/// The header with the moment of the record's first delivery (RFC 3339, UTC).
pub const HEADER_FIRST_DELIVERED: &str = "saguin-first-delivered";
/// The header with the moment of the record's last delivery (RFC 3339, UTC).
pub const HEADER_LAST_DELIVERED: &str = "saguin-last-delivered";
/// The header saying why the record was dead-lettered.
pub const HEADER_DLQ_REASON: &str = "saguin-dlq-reason";
/// The suffix of a queue's dead-letter channel: `jobs` dead-letters into
/// `jobs.dlq`, an append channel in the same provider.
pub use saguin_format::channel_name::DLQ_SUFFIX;

/// Deliveries of a queue record before it moves to the dead-letter channel,
/// unless the channel's `max_attempts` says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// The first offset any channel assigns.
pub const FIRST_OFFSET: u64 = 1;

/// What a store can answer instead of doing what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The channel's own `max_bytes` would be crossed. MQTT 0x97.
    #[error("channel {channel}: full: {held} bytes held, a record of {size} bytes would cross max_bytes {max_bytes}")]
    ChannelFull {
        channel: String,
        held: u64,
        size: u64,
        max_bytes: u64,
    },
    /// The provider's bound would be crossed (on sqlite: SQLITE_FULL). MQTT 0x97.
    #[error("provider {provider}: full: {size} more bytes do not fit ({used} of {limit} usable bytes in use)")]
    ProviderFull {
        provider: String,
        size: u64,
        used: u64,
        limit: u64,
    },
    /// A write that did not happen for any reason other than a bound. MQTT 0x83.
    #[error("{context}: write failed: {detail}")]
    Write { context: String, detail: String },
    /// A read below the floor: those records were removed (invariant 1).
    #[error("channel {channel}: offset {offset} is below the floor {floor}; the records before the floor were removed")]
    BelowFloor {
        channel: String,
        offset: u64,
        floor: u64,
    },
    /// A read past the next offset: no record there has been written.
    #[error("channel {channel}: offset {offset} is past the next offset {next}")]
    PastNext {
        channel: String,
        offset: u64,
        next: u64,
    },
    /// Stored state that contradicts itself or the format.
    #[error("{what}: corrupt: {detail}")]
    Corrupt { what: String, detail: String },
    /// An I/O failure, with what was being done and to which path.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A channel opened as one kind that is stored as another.
    #[error("channel {channel}: configured as {configured} but stored as {stored}")]
    KindMismatch {
        channel: String,
        configured: ChannelKind,
        stored: ChannelKind,
    },
    /// A reader name outside the `mqtt:` / `bridge:` schemes.
    #[error("reader {input:?}: {reason}")]
    InvalidReader { input: String, reason: &'static str },
    /// An argument the contract does not admit (a position past `next`, a
    /// queue offset that is not held, a bound of zero).
    #[error("{what}: {detail}")]
    Invalid { what: String, detail: String },
    /// The provider was closed; nothing more is written to it.
    #[error("provider {provider}: closed")]
    Closed { provider: String },
    /// A failure of the engine underneath (sqlite), with its own words.
    #[error("{context}: {detail}")]
    Backend { context: String, detail: String },
    /// The disk under the provider refused a write: full (ENOSPC, EDQUOT,
    /// EFBIG), failing (EIO, a failed fsync) or read-only. MQTT 0x83: the
    /// write failed; it is not the configured bound that was reached.
    #[error("{context}: {kind_text}: {detail}", kind_text = kind.describe())]
    Disk {
        kind: FaultKind,
        context: String,
        detail: String,
    },
    /// The provider met a fault nothing written after it can be trusted
    /// over (an I/O error, a failed fsync, a read-only file system): every
    /// write is refused until the broker is restarted. MQTT 0x83.
    #[error("provider {provider}: failed ({kind_text}) and refuses writes until a restart: {detail}", kind_text = kind.describe())]
    ProviderFailed {
        provider: String,
        kind: FaultKind,
        detail: String,
    },
}

/// What kind of storage failure an error was, as
/// `saguin_storage_errors_total{provider,kind}` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// A configured bound was reached: a channel's or a provider's
    /// `max_bytes`. The only kind answered with 0x97.
    Full,
    /// The file system has no room for the write (ENOSPC, EDQUOT, or the
    /// file size limit, EFBIG). Nothing stored is at risk; writes go
    /// through again as soon as there is room.
    NoSpace,
    /// The disk answered a read or a write with an I/O error (EIO).
    Io,
    /// The file system is read-only (EROFS), such as after the kernel
    /// remounted it so on an error.
    ReadOnly,
    /// An fsync failed: what was written since the last good one may not
    /// be on the disk, whatever a later fsync answers.
    Fsync,
    /// A memory provider's snapshot could not be written.
    Snapshot,
    /// Anything else: a damaged file, a closed provider, an engine error.
    Other,
}

impl FaultKind {
    pub const ALL: [FaultKind; 7] = [
        FaultKind::Full,
        FaultKind::NoSpace,
        FaultKind::Io,
        FaultKind::ReadOnly,
        FaultKind::Fsync,
        FaultKind::Snapshot,
        FaultKind::Other,
    ];

    /// The `kind` label of `saguin_storage_errors_total`.
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Full => "full",
            FaultKind::NoSpace => "no_space",
            FaultKind::Io => "io",
            FaultKind::ReadOnly => "read_only",
            FaultKind::Fsync => "fsync",
            FaultKind::Snapshot => "snapshot",
            FaultKind::Other => "other",
        }
    }

    /// The kind in words, for errors and logs.
    pub fn describe(self) -> &'static str {
        match self {
            FaultKind::Full => "full",
            FaultKind::NoSpace => "no space left on the file system",
            FaultKind::Io => "I/O error",
            FaultKind::ReadOnly => "read-only file system",
            FaultKind::Fsync => "fsync failed",
            FaultKind::Snapshot => "snapshot not written",
            FaultKind::Other => "failed",
        }
    }

    /// The kind an operating system error number is: the file system
    /// without room, read-only, or failing. `None` for the rest.
    pub fn of_errno(errno: i32) -> Option<FaultKind> {
        match errno {
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => Some(FaultKind::NoSpace),
            libc::EROFS => Some(FaultKind::ReadOnly),
            libc::EIO => Some(FaultKind::Io),
            _ => None,
        }
    }

    /// What a failed fsync is, by its errno when one is known: a read-only
    /// file system is said as one (it is what the operator must put right,
    /// whichever call met it first); any other is an fsync failure,
    /// whatever its errno said.
    pub fn of_failed_sync(errno: Option<i32>) -> FaultKind {
        match errno.and_then(FaultKind::of_errno) {
            Some(FaultKind::ReadOnly) => FaultKind::ReadOnly,
            _ => FaultKind::Fsync,
        }
    }

    /// A fault after which a provider refuses every write until it is
    /// opened again (and SQLite's own recovery has run): the disk may have
    /// lost, or may lose, what it was told to keep.
    pub fn is_sticky(self) -> bool {
        matches!(self, FaultKind::Io | FaultKind::ReadOnly | FaultKind::Fsync)
    }
}

/// A provider's health as the disk under it left it (`saguin_provider_failed`,
/// `saguin_provider_no_space`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Health {
    #[default]
    Writing,
    /// The last write that needed room found none; the next may.
    NoSpace,
    /// Writes are refused until a restart.
    Failed { kind: FaultKind, detail: String },
}

impl StorageError {
    /// The MQTT 5 reason code a PUBACK/PUBREC answers this failure with:
    /// 0x97 for a reached bound, 0x83 for anything else.
    pub fn mqtt_reason_code(&self) -> u8 {
        if self.is_full() {
            REASON_QUOTA_EXCEEDED
        } else {
            REASON_WRITE_FAILED
        }
    }

    /// True when a bound (channel or provider) refused the write.
    pub fn is_full(&self) -> bool {
        matches!(
            self,
            StorageError::ChannelFull { .. } | StorageError::ProviderFull { .. }
        )
    }

    /// What kind of failure this is, for `saguin_storage_errors_total`.
    pub fn kind(&self) -> FaultKind {
        match self {
            StorageError::ChannelFull { .. } | StorageError::ProviderFull { .. } => FaultKind::Full,
            StorageError::Disk { kind, .. } | StorageError::ProviderFailed { kind, .. } => *kind,
            StorageError::Io { source, .. } => source
                .raw_os_error()
                .and_then(FaultKind::of_errno)
                .unwrap_or(FaultKind::Other),
            _ => FaultKind::Other,
        }
    }

    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> StorageError {
        StorageError::Io {
            context: context.into(),
            source,
        }
    }
}

/// The result of every fallible store operation.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// The scheme of a reader name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReaderScheme {
    /// A durable consumer that is an MQTT session: `mqtt:<client id>`.
    Mqtt,
    /// An outbound bridge rule, holding a position with no session: `bridge:<name>`.
    Bridge,
}

impl ReaderScheme {
    pub fn prefix(self) -> &'static str {
        match self {
            ReaderScheme::Mqtt => "mqtt:",
            ReaderScheme::Bridge => "bridge:",
        }
    }
}

/// A reader's name: a scheme and an identifier. The one rule for what goes into a
/// snapshot and a database alike.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reader {
    scheme: ReaderScheme,
    id: String,
}

/// The longest identifier a reader may have: an MQTT client id is a UTF-8
/// string of at most 65,535 bytes.
pub const MAX_READER_ID_BYTES: usize = saguin_format::f21::MAX_IDENTIFIER_BYTES;

impl Reader {
    /// A reader for an MQTT session's client id.
    pub fn mqtt(client_id: &str) -> Result<Reader> {
        Reader::new(ReaderScheme::Mqtt, client_id)
    }

    /// A reader for a bridge rule's name.
    pub fn bridge(name: &str) -> Result<Reader> {
        Reader::new(ReaderScheme::Bridge, name)
    }

    pub fn new(scheme: ReaderScheme, id: &str) -> Result<Reader> {
        let invalid = |reason| StorageError::InvalidReader {
            input: format!("{}{}", scheme.prefix(), id),
            reason,
        };
        if id.is_empty() {
            return Err(invalid("the identifier after the scheme is empty"));
        }
        // The identifier rule every file field follows (FORMAT.md §2.9).
        if id.len() > MAX_READER_ID_BYTES {
            return Err(invalid("the identifier is longer than 65535 bytes"));
        }
        if saguin_format::f21::check_identifier("reader", id).is_err() {
            return Err(invalid("the identifier holds a NUL character"));
        }
        Ok(Reader {
            scheme,
            id: id.to_owned(),
        })
    }

    /// Parses `mqtt:<client id>` or `bridge:<name>`.
    pub fn parse(input: &str) -> Result<Reader> {
        for scheme in [ReaderScheme::Mqtt, ReaderScheme::Bridge] {
            if let Some(id) = input.strip_prefix(scheme.prefix()) {
                return Reader::new(scheme, id);
            }
        }
        Err(StorageError::InvalidReader {
            input: input.to_owned(),
            reason: "a reader is named mqtt:<client id> or bridge:<name>",
        })
    }

    pub fn scheme(&self) -> ReaderScheme {
        self.scheme
    }

    /// The client id or bridge name, without the scheme.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Display for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.scheme.prefix(), self.id)
    }
}

impl std::str::FromStr for Reader {
    type Err = StorageError;
    fn from_str(s: &str) -> Result<Reader> {
        Reader::parse(s)
    }
}

/// A durable reader's place in one channel: a cursor, never a copy of the
/// records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    pub reader: Reader,
    /// The offset the reader reads next: everything below it was delivered.
    /// At most the channel's `next` (a stored position may lag, never lead).
    pub offset: u64,
    /// When the position was saved (the consumer went away, the ack interval
    /// ran, or a snapshot was taken).
    pub saved_at: UnixNanos,
    /// The Session Expiry Interval in seconds the reader's session was
    /// granted. `Some` for an `mqtt:` reader (0 = ends with the connection),
    /// `None` for a `bridge:` reader, which has no session and never expires.
    pub session_expiry: Option<u32>,
}

impl Position {
    /// True when the reader's session would have expired by `now`, judged
    /// against an interval no longer than `max_session_expiry` seconds
    /// (limits.max_session_expiry bounds every row). Only `mqtt:` readers
    /// expire: a bridge states no interval, and its zero would mean the
    /// opposite of MQTT's zero.
    pub fn expired_at(&self, now: UnixNanos, max_session_expiry: u32) -> bool {
        if self.reader.scheme() != ReaderScheme::Mqtt {
            return false;
        }
        let interval = self.session_expiry.unwrap_or(0).min(max_session_expiry);
        let ends = self
            .saved_at
            .saturating_add(i64::from(interval).saturating_mul(1_000_000_000));
        ends <= now
    }
}

/// What a removal did: how many records went and how many bytes came back.
/// Both are zero when nothing was removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub records: u64,
    pub bytes: u64,
}

impl Removed {
    pub fn add(&mut self, other: Removed) {
        self.records += other.records;
        self.bytes += other.bytes;
    }
}

/// Does a latest channel's retention forget its oldest deletion marker?
/// Yes while more than `keep` markers are held (`held` counts this one),
/// or when the marker is older than `cutoff`; a marker with no timestamp
/// (0) is never too old. Markers are looked at from the oldest and the
/// walk stops at the first that stays, so the floor, raised past the last
/// one forgotten, never passes a marker that is kept (invariant 1).
pub fn forgets_deletion(
    held: u64,
    keep: Option<u64>,
    timestamp: UnixNanos,
    cutoff: Option<UnixNanos>,
) -> bool {
    keep.is_some_and(|keep| held > keep)
        || cutoff.is_some_and(|cutoff| timestamp != 0 && timestamp < cutoff)
}

/// What a latest channel's reader is sent next ([`read_changes`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// The offset the records begin at: the one asked for, or the first
    /// offset when the reader starts over.
    pub start: u64,
    /// Set when the reader starts over: the floor that had passed what it
    /// relied on. Deletions below it were forgotten; the records are every
    /// row again from the first offset, the values set below the floor
    /// among them.
    pub resync: Option<u64>,
    pub records: Vec<Record>,
}

/// The changes of `store` under `filter` for a reader at `from`, at most
/// `max`, ordered by offset. `relied` is the lowest offset whose deletion
/// markers the reader counts on: `from` for a reader resuming, the floor
/// its resync began under for one in the middle of a resync (it reads the
/// values below that floor, whose markers are gone). While the floor is at
/// most `relied` the reader gets the rows from `from`; once the floor has
/// passed it, deletions it was owed were forgotten and it starts over:
/// every row from the first offset, every current value among them, with
/// the floor that passed it - a full resync, never a silent miss
/// (invariant 1).
pub fn read_changes(
    store: &dyn LatestStore,
    filter: &str,
    from: u64,
    relied: u64,
    max: usize,
) -> Result<Changes> {
    let (floor, records) = store.rows_from_n(filter, from, max)?;
    if floor <= relied {
        return Ok(Changes {
            start: from,
            resync: None,
            records,
        });
    }
    let (floor, records) = store.rows_from_n(filter, FIRST_OFFSET, max)?;
    Ok(Changes {
        start: FIRST_OFFSET,
        resync: Some(floor),
        records,
    })
}

/// Would a record of `size` bytes fit under `store`'s own bound? What a
/// QoS 2 publish held for the channel is checked against when it is held:
/// its release, which writes it, is a relief write and checks no bound, so
/// the hold is where a full channel says so.
pub fn check_channel_room(store: &dyn AppendStore, size: u64) -> Result<()> {
    check_room(store.name(), store.bytes(), store.max_bytes(), size)
}

/// A channel's own bound (`docs/design.md` storage rule 5), the one rule
/// every store and the broker apply:
/// channel `channel`, holding `held` bytes under `max_bytes`, takes a
/// record of `size` bytes only when both together stay within the bound
/// ([`StorageError::ChannelFull`], MQTT 0x97, otherwise). No bound admits
/// everything. Relief writes (a dead-letter move, a held publish's
/// release) are not asked.
#[inline]
pub fn check_room(channel: &str, held: u64, max_bytes: Option<u64>, size: u64) -> Result<()> {
    match max_bytes {
        Some(max_bytes) if held.saturating_add(size) > max_bytes => {
            Err(StorageError::ChannelFull {
                channel: channel.to_owned(),
                held,
                size,
                max_bytes,
            })
        }
        _ => Ok(()),
    }
}

/// What an append and a latest channel share: records that take offsets
/// in order (`next`, `floor`), what they hold, and the positions durable
/// readers keep in them. Declared once, so a caller that reads a counter
/// or keeps a position need not ask which of the two kinds a channel is
/// ([`ChannelStore::offsets`]); a queue hands each record to one worker
/// and keeps no positions.
pub trait OffsetStore: Send + Sync {
    /// The channel's name.
    fn name(&self) -> &str;

    /// The offset the next record (on a latest channel, the next set or
    /// deletion) will take.
    fn next(&self) -> u64;

    /// The oldest offset that can still be read.
    fn floor(&self) -> u64;

    /// The bytes the channel's records count for ([`Record::accounted_size`]);
    /// a latest channel's current values (it has no bound of its own; on a
    /// memory provider they count against the provider's).
    fn bytes(&self) -> u64;

    /// How many records the channel holds; on a latest channel, how many
    /// topics hold a value.
    fn record_count(&self) -> u64;

    /// The stored position of `reader` in this channel.
    fn position(&self, reader: &Reader) -> Result<Option<Position>>;

    /// Stores a position (relief: may use the reserve). A position past
    /// `next` is [`StorageError::Invalid`] ([`check_position`]).
    fn save_position(&self, position: Position) -> Result<()>;

    /// Removes a reader's position; true when there was one.
    fn drop_position(&self, reader: &Reader) -> Result<bool>;

    /// Every stored position, ordered by reader.
    fn positions(&self) -> Result<Vec<Position>>;
}

/// An [`OffsetStore`] seen as one, whatever store it is: what lets
/// [`ChannelStore::offsets`] hand out the shared part of an append or a
/// latest store (the build's minimum Rust has no trait upcasting).
/// Implemented for every [`OffsetStore`]; nothing implements it by hand.
pub trait AsOffsetStore {
    fn as_offset_store(&self) -> &dyn OffsetStore;
}

impl<T: OffsetStore> AsOffsetStore for T {
    fn as_offset_store(&self) -> &dyn OffsetStore {
        self
    }
}

/// An append channel: a log whose records keep their offsets until
/// retention removes them from the front.
pub trait AppendStore: OffsetStore + AsOffsetStore {
    /// Stores `record` at the channel's next offset and returns it with the
    /// offset set. Offsets are taken in commit order: a reader that sees an
    /// offset sees every lower one that will ever exist (`docs/design.md`
    /// storage rule 2). Refused
    /// with [`StorageError::ChannelFull`] or [`StorageError::ProviderFull`]
    /// at a bound; a publish never takes the provider's reserve.
    fn append(&self, record: Record) -> Result<Record>;

    /// Appends several records in order, sharing transactions where the
    /// provider has them (group commit); one answer per record, each what
    /// [`AppendStore::append`] would have answered.
    fn append_batch(&self, records: Vec<Record>) -> Vec<Result<Record>> {
        records.into_iter().map(|r| self.append(r)).collect()
    }

    /// Every record from `offset` to the end. `offset < floor` is
    /// [`StorageError::BelowFloor`]; `offset > next` is
    /// [`StorageError::PastNext`]; `offset == next` is empty.
    fn read_from(&self, offset: u64) -> Result<Vec<Record>>;

    /// At most `max` records from `offset`, with the bounds of `read_from`.
    fn read_from_n(&self, offset: u64, max: usize) -> Result<Vec<Record>>;

    /// [`AppendStore::read_from_n`], each record lent as the store keeps
    /// it where it keeps one the broker may hold (a memory store's), so
    /// that no record is rebuilt for a read; whole otherwise.
    fn lend_from_n(&self, offset: u64, max: usize) -> Result<Vec<LentRecord>> {
        let records = self.read_from_n(offset, max)?;
        Ok(records.into_iter().map(LentRecord::whole).collect())
    }

    /// The lowest offset any stored position points at, or `next()` when no
    /// reader holds one (nothing is owed to anybody).
    fn lowest_position(&self) -> u64;

    /// The earliest offset whose record's timestamp is at or after `at`,
    /// looking at every candidate rather than bisecting (receipt times can
    /// run backwards after a clock step). Records with timestamp 0 (unset)
    /// never match. `None` when no record qualifies.
    fn first_at_or_after(&self, at: UnixNanos) -> Result<Option<u64>>;

    /// The channel's own bound; `None` is unbounded. Checked on append.
    fn set_max_bytes(&self, max_bytes: Option<u64>);

    /// The bound set by [`AppendStore::set_max_bytes`].
    fn max_bytes(&self) -> Option<u64>;

    /// Removes every record below `before`, then, when `max_bytes` is given,
    /// the oldest records until the channel holds at most that many bytes.
    /// Raises the floor and returns the bytes in the same operation. Does not
    /// use the provider's reserve.
    fn trim(&self, before: u64, max_bytes: Option<u64>) -> Result<Removed>;

    /// Removes records from the oldest while their timestamp is set and
    /// older than `cutoff`, stopping at the first that stays: a record with
    /// timestamp 0 is never too old, and it stops the walk.
    fn trim_older_than(&self, cutoff: UnixNanos) -> Result<Removed>;
}

/// A current value of a latest store as the broker serves it, lent for the
/// moment it is handed over ([`LatestStore::for_each_served_value`]): what
/// a record holds less its message id, publisher, bridge and sharing
/// marks, which the broker does not serve.
#[derive(Clone, Copy, Debug)]
pub struct ServedValue<'a> {
    pub offset: u64,
    pub topic: &'a str,
    pub payload: &'a [u8],
    /// Receipt time (Unix nanoseconds; 0 = unset).
    pub timestamp: UnixNanos,
    pub qos: u8,
    pub retain: bool,
    /// The publish properties: [`PublishProps::default`] for a value
    /// without any, as nearly every retained value is.
    pub props: &'a PublishProps,
    pub user_properties: &'a [UserProperty],
    /// The store's own handle on the value, where it keeps one the broker
    /// may hold instead of a copy (a memory store's): a restart's retained
    /// index then holds each message once.
    pub kept: Option<&'a Kept>,
}

impl<'a> ServedValue<'a> {
    /// What the broker serves of `record`.
    pub fn of(record: &'a Record) -> ServedValue<'a> {
        RecordParts::from(record).into()
    }

    /// No publish or user properties: the value is its topic, payload
    /// and QoS.
    pub fn is_plain(&self) -> bool {
        self.user_properties.is_empty() && self.props.is_empty()
    }
}

/// A record's parts, lent from a whole record or from what a store keeps of
/// one: what a snapshot file is written from, with no record rebuilt.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecordParts<'a> {
    pub offset: u64,
    pub message_id: &'a [u8; 16],
    pub timestamp: UnixNanos,
    pub qos: u8,
    pub retain: bool,
    pub shared_copy: bool,
    pub topic: &'a str,
    pub client_id: &'a str,
    pub bridge: Option<&'a str>,
    pub owed_to: Option<&'a str>,
    pub user_properties: &'a [UserProperty],
    pub props: &'a PublishProps,
    pub payload: &'a [u8],
}

impl<'a> From<&'a Record> for RecordParts<'a> {
    fn from(r: &'a Record) -> Self {
        RecordParts {
            offset: r.offset,
            message_id: &r.message_id,
            timestamp: r.timestamp,
            qos: r.qos,
            retain: r.retain,
            shared_copy: r.shared_copy,
            topic: &r.topic,
            client_id: &r.client_id,
            bridge: r.bridge.as_deref(),
            owed_to: r.owed_to.as_deref(),
            user_properties: &r.user_properties,
            props: &r.props,
            payload: &r.payload,
        }
    }
}

/// What the broker serves of a record's parts.
impl<'a> From<RecordParts<'a>> for ServedValue<'a> {
    fn from(r: RecordParts<'a>) -> Self {
        ServedValue {
            offset: r.offset,
            topic: r.topic,
            payload: r.payload,
            timestamp: r.timestamp,
            qos: r.qos,
            retain: r.retain,
            props: r.props,
            user_properties: r.user_properties,
            kept: None,
        }
    }
}

/// A record as a read lends it: whole, or the store's own kept record.
#[derive(Clone, Debug)]
pub enum LentRecord {
    Whole(Arc<Record>),
    Kept(Kept),
}

impl LentRecord {
    pub fn whole(record: Record) -> LentRecord {
        LentRecord::Whole(Arc::new(record))
    }

    /// Its parts, lent.
    pub fn parts(&self) -> RecordParts<'_> {
        match self {
            LentRecord::Whole(record) => RecordParts::from(&**record),
            LentRecord::Kept(kept) => kept.parts(),
        }
    }

    pub fn offset(&self) -> u64 {
        match self {
            LentRecord::Whole(record) => record.offset,
            LentRecord::Kept(kept) => kept.offset,
        }
    }

    pub fn topic(&self) -> &str {
        match self {
            LentRecord::Whole(record) => &record.topic,
            LentRecord::Kept(kept) => kept.topic(),
        }
    }

    pub fn qos(&self) -> u8 {
        match self {
            LentRecord::Whole(record) => record.qos,
            LentRecord::Kept(kept) => kept.qos,
        }
    }

    pub fn retain(&self) -> bool {
        match self {
            LentRecord::Whole(record) => record.retain,
            LentRecord::Kept(kept) => kept.retain,
        }
    }

    pub fn client_id(&self) -> &str {
        match self {
            LentRecord::Whole(record) => &record.client_id,
            LentRecord::Kept(kept) => kept.client_id(),
        }
    }

    /// The bridge it arrived over, if it did.
    pub fn bridge(&self) -> Option<&str> {
        match self {
            LentRecord::Whole(record) => record.bridge.as_deref(),
            LentRecord::Kept(kept) => kept.bridge(),
        }
    }

    /// [`Record::accounted_size`] of the record.
    pub fn accounted_size(&self) -> u64 {
        match self {
            LentRecord::Whole(record) => record.accounted_size(),
            LentRecord::Kept(kept) => kept.accounted_size(),
        }
    }

    /// Its payload, shared with what holds it rather than copied.
    pub fn payload(&self) -> Bytes {
        match self {
            LentRecord::Whole(record) => record.payload.clone(),
            LentRecord::Kept(kept) => kept.payload_shared(),
        }
    }
}

/// How a record kept compact is lent: here, beside what it is lent as.
impl KeptRecord {
    /// The record it keeps, lent part by part.
    pub fn parts(&self) -> RecordParts<'_> {
        let rare = self.rare.as_deref();
        RecordParts {
            offset: self.offset,
            message_id: &self.message_id,
            timestamp: self.timestamp,
            qos: self.qos,
            retain: self.retain,
            shared_copy: rare.is_some_and(|r| r.shared_copy),
            topic: self.topic(),
            client_id: self.client_id(),
            bridge: self.bridge(),
            owed_to: rare.and_then(|r| r.owed_to.as_deref()),
            user_properties: rare.map_or(&[], |r| &r.user_properties),
            props: rare.map_or(PublishProps::none(), |r| &r.props),
            payload: self.payload(),
        }
    }
}

impl Kept {
    /// What the broker serves of the record it keeps, lent from it with
    /// the handle itself, which the broker may hold.
    pub(crate) fn served(&self) -> ServedValue<'_> {
        ServedValue {
            kept: Some(self),
            ..self.parts().into()
        }
    }
}

/// A latest channel: one value per topic. Setting or deleting a topic takes
/// the channel's next offset, so a consumer can tell which of two values is
/// newer and what changed since its position.
pub trait LatestStore: OffsetStore + AsOffsetStore {
    /// Replaces the topic's value and returns it with its new offset. An
    /// empty payload deletes the topic (the MQTT rule), returning the
    /// deletion's marker - or, when the topic held no value, the record
    /// with offset 0: nothing changed and no offset was taken.
    fn set(&self, record: Record) -> Result<Record>;

    /// [`LatestStore::set`], with the store's own handle on the value it
    /// now holds where it keeps one the broker may hold instead of a copy
    /// (a memory store's; `None` for a deletion and for a store whose
    /// values live elsewhere, a database's).
    fn set_sharing(&self, record: Record) -> Result<(Record, Option<Kept>)> {
        self.set(record).map(|record| (record, None))
    }

    /// The topic's current value.
    fn get(&self, topic: &str) -> Result<Option<Record>>;

    /// Deletes the topic's value. Returns the deletion's marker -
    /// `Record::new(topic, empty)` with the offset the deletion took and
    /// nothing else set - or `None` when the topic held nothing (no offset
    /// is taken).
    fn delete(&self, topic: &str) -> Result<Option<Record>>;

    /// Every current value whose topic matches the MQTT topic filter,
    /// ordered by offset.
    fn match_filter(&self, filter: &str) -> Result<Vec<Record>>;

    /// Every current value, whatever its topic (`#` leaves out topics that
    /// start with `$`), ordered by offset.
    fn values(&self) -> Result<Vec<Record>>;

    /// Hand every current value to `each`, in offset order, made one at a
    /// time where the store can: a restart of a million retained messages
    /// then holds one record beside the state it builds, not all of them.
    /// Each is the caller's own, to move into what it builds.
    fn for_each_value(&self, each: &mut dyn FnMut(Record)) -> Result<()> {
        self.values()?.into_iter().for_each(each);
        Ok(())
    }

    /// [`LatestStore::for_each_value`] as the broker serves the values,
    /// each lent while `each` runs: a store that can leaves the columns
    /// the broker does not serve unread and makes nothing for a value. A
    /// restart reads its retained messages so.
    fn for_each_served_value(&self, each: &mut dyn FnMut(ServedValue<'_>)) -> Result<()> {
        self.for_each_value(&mut |record| each(ServedValue::of(&record)))
    }

    /// Every value set and every deletion at or after offset `since` whose
    /// topic matches, ordered by offset; deletions are records with an empty
    /// payload. `since < floor` is [`StorageError::BelowFloor`]: deletions
    /// below the floor were forgotten, and the reader must start over
    /// ([`read_changes`]).
    fn match_with_deletions(&self, filter: &str, since: u64) -> Result<Vec<Record>>;

    /// The first `max` of [`LatestStore::match_with_deletions`], read no
    /// further than those: a consumer far behind reads its changes a
    /// window at a time, not all of them for every window.
    fn match_with_deletions_n(&self, filter: &str, since: u64, max: usize) -> Result<Vec<Record>> {
        let mut records = self.match_with_deletions(filter, since)?;
        records.truncate(max);
        Ok(records)
    }

    /// The floor, and at most `max` of the rows at or after `since` whose
    /// topic matches, ordered by offset - read together, as of one moment.
    /// Unlike [`LatestStore::match_with_deletions_n`] it reads below the
    /// floor: every value set at or after `since` and every deletion marker
    /// held there (none below the floor is). What [`read_changes`] reads.
    fn rows_from_n(&self, filter: &str, since: u64, max: usize) -> Result<(u64, Vec<Record>)>;

    /// Forgets every deletion marker below `before` (at most `next`) and
    /// raises the floor to it in the same operation. Values are never
    /// removed: one set below the new floor stays current there.
    fn trim(&self, before: u64) -> Result<Removed>;

    /// How many deletion markers the channel holds (a counter, kept in
    /// memory like the others).
    fn deletions(&self) -> u64;

    /// A latest channel's retention: forgets deletion markers from the
    /// oldest while [`forgets_deletion`] says so of each - more than `keep`
    /// held, or one older than `cutoff` - stopping at the first that stays,
    /// and raises the floor past the last one forgotten in the same
    /// operation.
    fn forget_deletions(&self, keep: Option<u64>, cutoff: Option<UnixNanos>) -> Result<Removed>;
}

/// One unresolved queue record and what survives a restart about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueItem {
    pub record: Record,
    /// Deliveries made so far (a lease counts one).
    pub attempts: u32,
    /// 0 until first delivered.
    pub first_delivered: UnixNanos,
    /// 0 until first delivered.
    pub last_delivered: UnixNanos,
}

/// A record leased to a worker. The delivery id and epoch are volatile
/// (invariant 15): neither survives a restart nor means anything to a caller
/// beyond "is this delivery still the current one".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub delivery_id: u64,
    pub epoch: u64,
    /// The attempt this delivery is, counting from 1.
    pub attempts: u32,
    pub offset: u64,
    pub record: Record,
}

/// A lease whose deadline passed, as [`QueueStore::expired_leases`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredLease {
    pub delivery_id: u64,
    pub epoch: u64,
    pub offset: u64,
    pub holder: String,
}

/// One lease asked of [`QueueStore::lease_many`]: the arguments of
/// [`QueueStore::lease`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    pub offset: u64,
    pub holder: String,
    pub lease_until: UnixNanos,
    pub now: UnixNanos,
}

/// What a release did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Released {
    /// The record is available again from `not_before` (the backoff gap).
    Retry { offset: u64, not_before: UnixNanos },
    /// Its attempts were spent: it moved to the dead-letter channel at
    /// `dlq_offset`.
    DeadLettered { offset: u64, dlq_offset: u64 },
    /// The delivery id is unknown or its epoch superseded: nothing changed.
    Stale,
}

/// A queue channel: each record is handed to one worker. Its rows are
/// unresolved records only; who holds one is in memory (invariant 15).
pub trait QueueStore: Send + Sync {
    fn name(&self) -> &str;

    /// Stores a record at the queue's next offset, available at once.
    fn enqueue(&self, record: Record) -> Result<Record>;

    /// Several records, in order, sharing transactions where the provider
    /// has them (group commit); one answer each, what
    /// [`QueueStore::enqueue`] would have answered, each given only once
    /// the transaction holding it committed.
    fn enqueue_many(&self, records: Vec<Record>) -> Vec<Result<Record>> {
        records.into_iter().map(|r| self.enqueue(r)).collect()
    }

    fn set_max_bytes(&self, max_bytes: Option<u64>);
    fn max_bytes(&self) -> Option<u64>;

    /// Bytes of the unresolved records.
    fn bytes(&self) -> u64;

    /// How many records are unresolved (held or not).
    fn depth(&self) -> u64;

    fn next(&self) -> u64;

    /// The gaps before attempt 2, 3, ...; the last repeats.
    fn set_backoff(&self, gaps: Vec<Duration>);

    /// Deliveries after which a failed record is dead-lettered (at least 1).
    fn set_max_attempts(&self, max_attempts: u32);

    /// Up to `max` records available at `now`, oldest first: not held, past
    /// their backoff, attempts not spent. A read only.
    fn offer(&self, max: usize, now: UnixNanos) -> Result<Vec<QueueItem>>;

    /// Hands the record at `offset` to `holder` until `lease_until`, counting
    /// an attempt (the one thing stored). Refused when the record is not
    /// available.
    fn lease(
        &self,
        offset: u64,
        holder: &str,
        lease_until: UnixNanos,
        now: UnixNanos,
    ) -> Result<Lease>;

    /// Several leases, in order, sharing one transaction where the provider
    /// has them; one answer each, what [`QueueStore::lease`] would have
    /// answered. A failure of the shared transaction fails every lease in
    /// it, and none of them holds its record.
    fn lease_many(&self, asked: Vec<LeaseRequest>) -> Vec<Result<Lease>> {
        asked
            .into_iter()
            .map(|a| self.lease(a.offset, &a.holder, a.lease_until, a.now))
            .collect()
    }

    /// The worker finished the record: it is removed. False when the
    /// delivery is unknown or superseded (nothing changed).
    fn resolve(&self, delivery_id: u64, epoch: u64) -> Result<bool>;

    /// Several resolutions (`(delivery_id, epoch)`), sharing one
    /// transaction where the provider has them; one answer each, what
    /// [`QueueStore::resolve`] would have answered alone, and nothing is
    /// removed before that transaction commits.
    fn resolve_many(&self, asked: Vec<(u64, u64)>) -> Vec<Result<bool>> {
        asked
            .into_iter()
            .map(|(delivery_id, epoch)| self.resolve(delivery_id, epoch))
            .collect()
    }

    /// The delivery failed (a negative acknowledgement, an expired lease, the
    /// worker went away). With attempts left the record is available again
    /// after the backoff gap; with none it moves to the dead-letter channel
    /// with the `saguin-*` headers, atomically, giving `reason`.
    fn release(
        &self,
        delivery_id: u64,
        epoch: u64,
        now: UnixNanos,
        reason: &str,
    ) -> Result<Released>;

    /// Leases whose deadline is at or before `now`. Reads memory only; the
    /// caller releases each.
    fn expired_leases(&self, now: UnixNanos) -> Vec<ExpiredLease>;

    /// Removes records not held by a worker whose timestamp is set and older
    /// than `cutoff`.
    fn expire_older_than(&self, cutoff: UnixNanos) -> Result<Removed>;

    /// Moves every record not held whose attempts are already spent (as a
    /// restart finds them) to the dead-letter channel. Returns how many moved.
    fn dead_letter_spent(&self, now: UnixNanos) -> Result<u64>;

    /// The `<queue>.dlq` append channel records are dead-lettered into.
    fn dead_letter(&self) -> Arc<dyn AppendStore>;

    /// Every unresolved record, oldest first.
    fn items(&self) -> Result<Vec<QueueItem>>;
}

/// An exactly-once publish held until its PUBREL: keyed by channel, client
/// and packet identifier; the record carries no offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPublish {
    pub channel: String,
    pub client_id: String,
    pub packet_id: u16,
    pub held_at: UnixNanos,
    pub record: Record,
}

/// Exactly-once publishes held for their release, for every channel of one
/// provider (and the broadcast log, under `$saguin/broadcast`).
pub trait HeldPublishStore: Send + Sync {
    /// Holds a publish. A second hold of the same key replaces the first (the
    /// client re-sent its PUBLISH with DUP).
    fn hold(&self, held: HeldPublish) -> Result<()>;

    /// Releases a held publish into its channel at the channel's next
    /// offset, in one operation with removing the hold (relief: may use the
    /// reserve). `None` when nothing is held under the key.
    fn release(&self, channel: &str, client_id: &str, packet_id: u16) -> Result<Option<Record>>;

    /// Drops a hold without writing it; true when there was one.
    fn drop_hold(&self, channel: &str, client_id: &str, packet_id: u16) -> Result<bool>;

    /// Drops holds held before `cutoff` (broker.exactly_once.expires_after);
    /// returns how many went.
    fn expire_older_than(&self, cutoff: UnixNanos) -> Result<u64>;

    /// Every hold, ordered by channel, client and packet identifier.
    fn held(&self) -> Result<Vec<HeldPublish>>;
}

/// How far a message on the wire to a session has got (format 21's type).
pub type InflightPhase = saguin_format::f21::InflightPhase;

/// A shared group, named by its group name and its topic filter
/// (`$share/<group>/<filter>`); format 21's type.
pub type ShareGroupKey = saguin_format::f21::SharedGroupKey;

/// One message on the wire to a persistent session; format 21's type.
pub type InflightEntry = saguin_format::f21::InflightEntry;

/// One subscription of a persistent session, with every option its
/// SUBSCRIBE carried and the broadcast log's next offset when it was made.
/// The very type a format 21 sessions file holds, so a provider, the
/// snapshot writer and the migrations share one shape and one encoding.
pub type SubscriptionEntry = saguin_format::f21::Subscription;

/// A session's Will message, with its User Properties in the client's
/// order; the format 21 type itself, as [`SubscriptionEntry`] is.
pub type WillEntry = saguin_format::f21::Will;

/// A persistent MQTT session as the provider keeps it: the very type a
/// format 21 sessions file holds, so the providers, the snapshot writer and
/// the migrations need no conversions between them.
pub type SessionEntry = saguin_format::f21::Session;

/// True when `session` has expired by `now`: it is detached and its
/// interval (capped at `max_session_expiry`) has run out.
pub fn session_expired_at(session: &SessionEntry, now: UnixNanos, max_session_expiry: u32) -> bool {
    if session.detached_at == 0 {
        return false;
    }
    let interval = i64::from(session.expiry_interval.min(max_session_expiry));
    session
        .detached_at
        .saturating_add(interval.saturating_mul(1_000_000_000))
        <= now
}

/// Persistent sessions of one provider (broker.session_storage).
pub trait SessionStore: Send + Sync {
    /// Stores (creates or replaces) a session.
    fn save(&self, session: SessionEntry) -> Result<()>;
    fn get(&self, client_id: &str) -> Result<Option<SessionEntry>>;
    /// Ends a session, taking its broadcast-log cursor with it.
    fn remove(&self, client_id: &str) -> Result<bool>;
    /// Every session, in the order the store keeps them (by client id on
    /// memory, as the rows lie on sqlite): a restart takes them in any
    /// order, and what lists them for a reader orders them itself.
    fn sessions(&self) -> Result<Vec<SessionEntry>>;
}

/// A shared group's place in the broadcast log, with the deliveries a
/// member's ending returned to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareGroupEntry {
    pub key: ShareGroupKey,
    pub cursor: u64,
    /// Offsets the group is owed again, ahead of its cursor.
    pub returned: Vec<u64>,
}

/// The broadcast log: what persistent sessions are owed, written once
/// however many sessions are owed it. Messages leave it from the middle once
/// nobody owes them, so it may have gaps; no offset is reused.
pub trait BroadcastLog: Send + Sync {
    fn append(&self, record: Record) -> Result<Record>;
    /// [`BroadcastLog::append`], answering the offset the message took and
    /// the log's own handle on it where it keeps one the broker may hold
    /// instead of a copy (a memory log's; `None` for a log whose messages
    /// live elsewhere, a database's).
    fn append_sharing(&self, record: Record) -> Result<(u64, Option<Kept>)> {
        self.append(record).map(|record| (record.offset, None))
    }
    /// Appends several messages in order, sharing transactions where the
    /// provider has them; one answer per message.
    fn append_batch(&self, records: Vec<Record>) -> Vec<Result<Record>> {
        records.into_iter().map(|r| self.append(r)).collect()
    }
    /// At most `max` messages still held from `offset` (gaps skipped).
    fn read_from_n(&self, offset: u64, max: usize) -> Result<Vec<Record>>;
    /// Lets messages go that nobody owes any more; returns what was freed.
    fn release(&self, offsets: &[u64]) -> Result<Removed>;
    fn next(&self) -> u64;
    /// The lowest offset still held (or `next` when the log is empty).
    fn floor(&self) -> u64;
    fn bytes(&self) -> u64;
    fn record_count(&self) -> u64;

    /// A session's cursor: the offset it reads next.
    fn cursor(&self, client_id: &str) -> Result<Option<u64>>;
    fn save_cursor(&self, client_id: &str, offset: u64) -> Result<()>;
    fn drop_cursor(&self, client_id: &str) -> Result<bool>;
    /// Every session cursor, ordered by client id.
    fn cursors(&self) -> Result<Vec<(String, u64)>>;

    fn share_group(&self, key: &ShareGroupKey) -> Result<Option<ShareGroupEntry>>;
    fn save_share_group(&self, entry: ShareGroupEntry) -> Result<()>;
    fn drop_share_group(&self, key: &ShareGroupKey) -> Result<bool>;
    fn share_groups(&self) -> Result<Vec<ShareGroupEntry>>;
}

/// A channel's store, of whichever kind the channel is.
#[derive(Clone)]
pub enum ChannelStore {
    Append(Arc<dyn AppendStore>),
    Latest(Arc<dyn LatestStore>),
    Queue(Arc<dyn QueueStore>),
}

impl ChannelStore {
    pub fn kind(&self) -> ChannelKind {
        match self {
            ChannelStore::Append(_) => ChannelKind::Append,
            ChannelStore::Latest(_) => ChannelKind::Latest,
            ChannelStore::Queue(_) => ChannelKind::Queue,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            ChannelStore::Append(s) => s.name(),
            ChannelStore::Latest(s) => s.name(),
            ChannelStore::Queue(s) => s.name(),
        }
    }

    /// The offset the channel's next record takes.
    pub fn next(&self) -> u64 {
        match self {
            ChannelStore::Append(s) => s.next(),
            ChannelStore::Latest(s) => s.next(),
            ChannelStore::Queue(s) => s.next(),
        }
    }

    /// The channel's offsets, counters and readers' positions, whichever
    /// of the two kinds that keep them it is; `None` for a queue, which
    /// hands each record to one worker and has no readers.
    pub fn offsets(&self) -> Option<&dyn OffsetStore> {
        match self {
            ChannelStore::Append(s) => Some(s.as_offset_store()),
            ChannelStore::Latest(s) => Some(s.as_offset_store()),
            ChannelStore::Queue(_) => None,
        }
    }

    pub fn as_append(&self) -> Option<&Arc<dyn AppendStore>> {
        match self {
            ChannelStore::Append(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_latest(&self) -> Option<&Arc<dyn LatestStore>> {
        match self {
            ChannelStore::Latest(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_queue(&self) -> Option<&Arc<dyn QueueStore>> {
        match self {
            ChannelStore::Queue(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Debug for ChannelStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChannelStore::{}({})", self.kind(), self.name())
    }
}

/// Which implementation a provider is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    Memory,
    Sqlite,
}

/// The name the retained store is kept under; it reaches a snapshot
/// directory as `%24saguin%2Fretained.snapshot`, a name no channel produces.
pub const RETAINED_STORE_NAME: &str = saguin_format::channel_name::RETAINED_CHANNEL;
/// The name the broadcast log is kept under.
pub const BROADCAST_LOG_NAME: &str = "$saguin/broadcast";

/// The size of a provider's reserve: one largest possible record with its
/// headers. Not a configuration key of its own (`docs/design.md` storage
/// rule 5).
pub fn reserve_for(max_message_size: u64, max_header_bytes: u64) -> u64 {
    max_message_size.saturating_add(max_header_bytes)
}

/// A storage provider: the place a channel's records, counters and
/// positions all live.
pub trait Provider: Send + Sync {
    /// The provider's configured name.
    fn name(&self) -> &str;
    fn kind(&self) -> ProviderKind;

    /// The store of channel `name`, created empty (next = floor = 1) if the
    /// provider holds none. Asking twice gives back the same store; asking
    /// for a kind other than the stored one is
    /// [`StorageError::KindMismatch`]. Opening a queue opens its `.dlq`
    /// append channel too.
    fn open_channel(&self, name: &str, kind: ChannelKind) -> Result<ChannelStore>;

    /// The channels the provider holds, ordered by name, with their kinds.
    fn channels(&self) -> Vec<(String, ChannelKind)>;

    /// Bytes counted against the provider's bound.
    fn bytes(&self) -> u64;
    /// The provider's bound; `None` is unbounded.
    fn max_bytes(&self) -> Option<u64>;
    /// The part of `max_bytes` publishes may not take.
    fn reserve(&self) -> u64;

    /// The retained broadcast messages, when this provider keeps them.
    fn retained(&self) -> Result<Arc<dyn LatestStore>>;
    /// Persistent sessions, when this provider keeps them.
    fn sessions(&self) -> Result<Arc<dyn SessionStore>>;
    /// The broadcast log, kept with the sessions.
    fn broadcast_log(&self) -> Result<Arc<dyn BroadcastLog>>;
    /// Exactly-once publishes held for their release.
    fn held_publishes(&self) -> Result<Arc<dyn HeldPublishStore>>;

    /// Publishes to several of this provider's channels, each run's
    /// records in order and each answered as its store's own batch would
    /// answer it (a latest channel's as [`LatestStore::set`] does), in as
    /// few transactions as the provider can share among them. A provider
    /// that commits each store on its own writes each run in turn.
    fn publish_together(
        &self,
        runs: Vec<(&ChannelStore, Vec<Record>)>,
    ) -> Vec<Vec<Result<Record>>> {
        publish_each(runs)
    }

    /// Runs `body` - session writes only (sessions saved or removed,
    /// broadcast-log cursors, exactly-once holds made or dropped: writes
    /// that move no counter) - in one transaction where the provider has
    /// them. `body` returns false when one of its writes failed; then
    /// nothing of it is kept, and the answer is `Ok(false)`. `Ok(true)`:
    /// every write committed. An error: the commit itself failed and
    /// nothing is kept. A provider without transactions runs `body` as it
    /// is (each write kept as it returned) and answers `Ok(true)`.
    fn session_writes_together(&self, body: &mut dyn FnMut() -> bool) -> Result<bool> {
        body();
        Ok(true)
    }

    /// Whether the disk under the provider takes writes
    /// (`saguin_provider_failed`, `saguin_provider_no_space`). A provider
    /// with no disk under its writes is always writing.
    fn health(&self) -> Health {
        Health::Writing
    }

    /// The room kept on its file system for the checkpoint that finds it
    /// full (`saguin_provider_checkpoint_room_bytes`,
    /// `saguin_provider_held_to_disk`); `None` for a provider that keeps
    /// none.
    fn checkpoint_room(&self) -> Option<CheckpointRoom> {
        None
    }

    /// Stops accepting writes and releases what the provider holds open.
    /// Writes after close are [`StorageError::Closed`].
    fn close(&self) -> Result<()>;
}

/// Publishes to several channels, each run written by its own store in
/// turn ([`Provider::publish_together`] where nothing is shared).
pub fn publish_each(runs: Vec<(&ChannelStore, Vec<Record>)>) -> Vec<Vec<Result<Record>>> {
    runs.into_iter()
        .map(|(store, records)| match store {
            ChannelStore::Append(s) => s.append_batch(records),
            ChannelStore::Queue(s) => s.enqueue_many(records),
            ChannelStore::Latest(s) => records.into_iter().map(|r| s.set(r)).collect(),
        })
        .collect()
}

/// A provider's checkpoint's room, as a scrape reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointRoom {
    /// What of it is allocated now, in bytes.
    pub kept_bytes: u64,
    /// The file system filled: the provider keeps at most what it held
    /// then, until the room is taken back whole.
    pub held_to_disk: bool,
}

/// A channel's retention, as the ticker applies it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// retention_bytes; `None` keeps any size.
    pub bytes: Option<u64>,
    /// retention_age; `None` keeps any age. A latest channel's: the age
    /// past which its deletion markers are forgotten.
    pub age: Option<Duration>,
    /// A latest channel's retention_deletions: the deletion markers it
    /// keeps; `None` keeps any number.
    pub deletions: Option<u64>,
}

/// What one sweep removed, per channel that lost anything, and the channels
/// whose removal failed (each named, the sweep carrying on).
#[derive(Debug, Default)]
pub struct SweepReport {
    pub removed: Vec<(String, Removed)>,
    pub failed: Vec<(String, StorageError)>,
}

impl SweepReport {
    /// One channel's removal: counted when it removed anything, named when
    /// it failed.
    fn add(&mut self, channel: &str, result: Result<Removed>) {
        match result {
            Ok(removed) if removed.records > 0 => self.removed.push((channel.to_owned(), removed)),
            Ok(_) => {}
            Err(e) => self.failed.push((channel.to_owned(), e)),
        }
    }

    pub fn total(&self) -> Removed {
        let mut total = Removed::default();
        for (_, r) in &self.removed {
            total.add(*r);
        }
        total
    }
}

/// One pass of the size sweep over `channels`: a channel under its
/// retention_bytes is settled from the byte count it keeps, reading nothing;
/// one over it is trimmed from the oldest until it fits.
pub fn sweep_by_size(channels: &[(Arc<dyn AppendStore>, Retention)]) -> SweepReport {
    let mut report = SweepReport::default();
    for (store, retention) in channels {
        let Some(limit) = retention.bytes else {
            continue;
        };
        if store.bytes() <= limit {
            continue;
        }
        report.add(store.name(), store.trim(store.floor(), Some(limit)));
    }
    report
}

/// One pass of the age sweep at `now`: each channel with a retention_age is
/// walked from its oldest record, stopping at the first that stays, so the
/// sweep reads what it removes rather than what the channel holds.
pub fn sweep_by_age(channels: &[(Arc<dyn AppendStore>, Retention)], now: UnixNanos) -> SweepReport {
    let mut report = SweepReport::default();
    for (store, retention) in channels {
        let Some(age) = retention.age else {
            continue;
        };
        let Some(cutoff) = age_cutoff(age, now) else {
            continue;
        };
        report.add(store.name(), store.trim_older_than(cutoff));
    }
    report
}

/// One pass of the size sweep over latest channels' deletion markers: a
/// channel holding at most its retention_deletions is settled from the
/// count it keeps, reading nothing; one over it forgets its oldest
/// markers until it holds that many.
pub fn sweep_deletions_by_count(channels: &[(Arc<dyn LatestStore>, Retention)]) -> SweepReport {
    let mut report = SweepReport::default();
    for (store, retention) in channels {
        let Some(keep) = retention.deletions else {
            continue;
        };
        if store.deletions() <= keep {
            continue;
        }
        report.add(store.name(), store.forget_deletions(Some(keep), None));
    }
    report
}

/// One pass of the age sweep over latest channels' deletion markers at
/// `now`: each channel with a retention_age forgets its markers from the
/// oldest while they are older than it, stopping at the first that stays.
pub fn sweep_deletions_by_age(
    channels: &[(Arc<dyn LatestStore>, Retention)],
    now: UnixNanos,
) -> SweepReport {
    let mut report = SweepReport::default();
    for (store, retention) in channels {
        let Some(cutoff) = retention.age.and_then(|age| age_cutoff(age, now)) else {
            continue;
        };
        if store.deletions() == 0 {
            continue;
        }
        report.add(store.name(), store.forget_deletions(None, Some(cutoff)));
    }
    report
}

/// The timestamp below which a record is older than `age` at `now`;
/// `None` when no timestamp is (the clock is younger than the age).
fn age_cutoff(age: Duration, now: UnixNanos) -> Option<UnixNanos> {
    let age_nanos = i64::try_from(age.as_nanos()).unwrap_or(i64::MAX);
    let cutoff = now.saturating_sub(age_nanos);
    (cutoff > 0).then_some(cutoff)
}

/// Refuses a record a snapshot or a database could not keep faithfully,
/// before it is stored - rather than at the next start, when the file that
/// holds it would be refused. `broadcast` admits the two broadcast-log
/// fields. Both providers call it on every write path.
pub fn check_record(channel: &str, record: &Record, broadcast: bool) -> Result<()> {
    let invalid = |detail: String| StorageError::Invalid {
        what: format!("channel {channel}: record on {:?}", record.topic),
        detail,
    };
    if record.qos > 2 {
        return Err(invalid(format!("QoS {} is not 0, 1 or 2", record.qos)));
    }
    if let Some(p) = record.props.payload_format_indicator {
        if p > 1 {
            return Err(invalid(format!(
                "payload format indicator {p} is not 0 or 1"
            )));
        }
    }
    if !broadcast && (record.shared_copy || record.owed_to.is_some()) {
        return Err(invalid(
            "shared_copy and owed_to belong to the broadcast log only".into(),
        ));
    }
    Ok(())
}

/// Refuses a hold the format could not keep: a client id, a nonzero packet
/// identifier, and a QoS 2 record (only exactly-once publishes are held).
pub fn check_hold(held: &HeldPublish) -> Result<()> {
    let invalid = |detail: &str| StorageError::Invalid {
        what: format!(
            "channel {}: held publish {}/{}",
            held.channel, held.client_id, held.packet_id
        ),
        detail: detail.to_owned(),
    };
    if held.client_id.is_empty() {
        return Err(invalid("the client id is empty"));
    }
    if held.packet_id == 0 {
        return Err(invalid("packet identifier 0 is never used"));
    }
    if held.record.qos != 2 {
        return Err(invalid("only QoS 2 publishes are held"));
    }
    check_record(
        &held.channel,
        &held.record,
        held.channel == BROADCAST_LOG_NAME,
    )
}

/// The name of a queue's dead-letter channel.
pub fn dead_letter_name(queue: &str) -> String {
    format!("{queue}{DLQ_SUFFIX}")
}

/// The gap before a queue record is offered again after its `attempts`th
/// delivery failed: `backoff[attempts - 1]`, the last gap for every attempt
/// past the list, none with no list. Both providers answer a release with
/// it.
pub fn backoff_gap(backoff: &[std::time::Duration], attempts: u32) -> std::time::Duration {
    let Some(last) = backoff.len().checked_sub(1) else {
        return std::time::Duration::ZERO;
    };
    let i = (attempts.saturating_sub(1) as usize).min(last);
    backoff.get(i).copied().unwrap_or(std::time::Duration::ZERO)
}

/// True when a queue record delivered `attempts` times may not be
/// delivered again: it belongs in the dead-letter channel. Both providers
/// offer, lease and release by it.
pub fn attempts_spent(attempts: u32, max_attempts: u32) -> bool {
    attempts >= max_attempts
}

/// What a failed delivery of a queue record leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Its attempts are spent: it moves to the dead-letter channel.
    DeadLetter,
    /// It is offered again from this moment (the backoff gap after now).
    RetryAt(UnixNanos),
}

/// The one rule of a release, for both providers: a record whose
/// `attempts` are spent is dead-lettered, any other is available again
/// [`backoff_gap`] after `now` (`docs/design.md` storage rule 11).
pub fn after_failed_delivery(
    attempts: u32,
    max_attempts: u32,
    backoff: &[Duration],
    now: UnixNanos,
) -> AfterFailure {
    if attempts_spent(attempts, max_attempts) {
        return AfterFailure::DeadLetter;
    }
    let gap = backoff_gap(backoff, attempts);
    AfterFailure::RetryAt(now.saturating_add(i64::try_from(gap.as_nanos()).unwrap_or(i64::MAX)))
}

/// A queue record as its dead-letter channel keeps it: no offset yet (the
/// move takes one), and the `saguin-*` headers saying how many attempts it
/// had, when it was first and last delivered (now, if it never was) and
/// why it moved, after the publisher's own User Properties. Both providers
/// stamp a dead letter with it.
pub fn dead_letter_record(
    mut record: Record,
    attempts: u32,
    first_delivered: UnixNanos,
    last_delivered: UnixNanos,
    now: UnixNanos,
    reason: &str,
) -> Record {
    record.offset = 0;
    let last = if last_delivered != 0 {
        last_delivered
    } else {
        now
    };
    for (name, value) in [
        (HEADER_ATTEMPTS, attempts.to_string()),
        (HEADER_FIRST_DELIVERED, format_time(first_delivered)),
        (HEADER_LAST_DELIVERED, format_time(last)),
        (HEADER_DLQ_REASON, reason.to_owned()),
    ] {
        record
            .user_properties
            .push(saguin_format::model::UserProperty {
                name: name.to_owned(),
                value,
            });
    }
    record
}

/// Nanoseconds since the Unix epoch, now. A clock before 1970 reads as 1 so
/// that "now" is never the unset 0.
pub fn now_nanos() -> UnixNanos {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(_) => 1,
    }
}

/// RFC 3339 (UTC, nanoseconds) of a Unix-nanosecond time, for headers; the
/// unset 0 is the empty string rather than a date in 1970.
pub fn format_time(at: UnixNanos) -> String {
    if at <= 0 {
        return String::new();
    }
    let t = std::time::UNIX_EPOCH + Duration::from_nanos(at as u64);
    humantime::format_rfc3339_nanos(t).to_string()
}

/// A position is at least the first offset and never past `next` (a stored
/// position may lag, never lead: `docs/design.md` storage rule 3); an `mqtt:` reader states its session
/// expiry and a `bridge:` reader none. Both providers check by this.
pub fn check_position(channel: &str, position: &Position, next: u64) -> Result<()> {
    if position.offset < FIRST_OFFSET || position.offset > next {
        return Err(StorageError::Invalid {
            what: format!("channel {channel}: position of {}", position.reader),
            detail: format!(
                "offset {} is outside 1..={next} (a position never leads the channel)",
                position.offset
            ),
        });
    }
    let expiry_ok = match position.reader.scheme() {
        ReaderScheme::Mqtt => position.session_expiry.is_some(),
        ReaderScheme::Bridge => position.session_expiry.is_none(),
    };
    if !expiry_ok {
        return Err(StorageError::Invalid {
            what: format!("channel {channel}: position of {}", position.reader),
            detail: "an mqtt: reader states its session expiry interval and a bridge: reader states none".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_gap_is_the_attempts_own_then_the_last_one() {
        use std::time::Duration;
        let gaps = [Duration::from_secs(1), Duration::from_secs(5)];
        assert_eq!(backoff_gap(&gaps, 1), Duration::from_secs(1));
        assert_eq!(backoff_gap(&gaps, 2), Duration::from_secs(5));
        assert_eq!(backoff_gap(&gaps, 9), Duration::from_secs(5));
        assert_eq!(backoff_gap(&gaps, 0), Duration::from_secs(1));
        assert_eq!(backoff_gap(&[], 3), Duration::ZERO);
    }

    #[test]
    fn a_failed_delivery_waits_its_gap_or_moves_once_its_attempts_are_spent() {
        let gaps = [Duration::from_secs(1), Duration::from_secs(5)];
        let now = 10 * 1_000_000_000;
        assert_eq!(
            after_failed_delivery(1, 3, &gaps, now),
            AfterFailure::RetryAt(11 * 1_000_000_000)
        );
        assert_eq!(
            after_failed_delivery(2, 3, &gaps, now),
            AfterFailure::RetryAt(15 * 1_000_000_000)
        );
        assert_eq!(
            after_failed_delivery(3, 3, &gaps, now),
            AfterFailure::DeadLetter
        );
        assert_eq!(
            after_failed_delivery(1, 1, &[], now),
            AfterFailure::DeadLetter
        );
        assert_eq!(
            after_failed_delivery(1, 2, &[], now),
            AfterFailure::RetryAt(now),
            "no backoff: at once"
        );
        assert_eq!(
            after_failed_delivery(1, 2, &[Duration::MAX], i64::MAX - 1),
            AfterFailure::RetryAt(i64::MAX),
            "a gap past the end of time saturates"
        );
        assert!(!attempts_spent(4, 5));
        assert!(attempts_spent(5, 5));
    }

    #[test]
    fn a_dead_letter_carries_why_after_the_publishers_properties() {
        let mut r = Record::new("jobs/a", "x");
        r.offset = 7;
        r.user_properties.push(saguin_format::model::UserProperty {
            name: "mine".into(),
            value: "1".into(),
        });
        let d = dead_letter_record(r, 3, 1_000_000_000, 0, 2_000_000_000, "nack");
        assert_eq!(d.offset, 0, "the move takes an offset");
        let names: Vec<(&str, &str)> = d
            .user_properties
            .iter()
            .map(|p| (p.name.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("mine", "1"),
                (HEADER_ATTEMPTS, "3"),
                (HEADER_FIRST_DELIVERED, format_time(1_000_000_000).as_str()),
                // Never delivered last: now.
                (HEADER_LAST_DELIVERED, format_time(2_000_000_000).as_str()),
                (HEADER_DLQ_REASON, "nack"),
            ]
        );
    }

    #[test]
    fn reader_names_parse_and_print() {
        let r = Reader::parse("mqtt:dev-1").unwrap();
        assert_eq!(r.scheme(), ReaderScheme::Mqtt);
        assert_eq!(r.id(), "dev-1");
        assert_eq!(r.to_string(), "mqtt:dev-1");
        let b: Reader = "bridge:cloud:eu".parse().unwrap();
        assert_eq!(b.scheme(), ReaderScheme::Bridge);
        assert_eq!(b.id(), "cloud:eu");
        for bad in ["", "mqtt:", "bridge:", "client-1", "http:x", "mqtt:a\0b"] {
            assert!(Reader::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn reason_codes_separate_bounds_from_failures() {
        let full = StorageError::ProviderFull {
            provider: "mem".into(),
            size: 1,
            used: 1,
            limit: 1,
        };
        assert_eq!(full.mqtt_reason_code(), 0x97);
        let failed = StorageError::Write {
            context: "x".into(),
            detail: "y".into(),
        };
        assert_eq!(failed.mqtt_reason_code(), 0x83);
    }

    #[test]
    fn only_session_readers_expire() {
        let mut p = Position {
            reader: Reader::bridge("b").unwrap(),
            offset: 1,
            saved_at: 1_000_000_000,
            session_expiry: None,
        };
        assert!(!p.expired_at(i64::MAX, 3600));
        p.reader = Reader::mqtt("c").unwrap();
        p.session_expiry = Some(0);
        assert!(
            p.expired_at(1_000_000_000, 3600),
            "zero ends with the connection"
        );
        p.session_expiry = Some(10);
        assert!(!p.expired_at(5_000_000_000, 3600));
        assert!(p.expired_at(11_000_000_000, 3600));
        p.session_expiry = Some(u32::MAX);
        assert!(
            p.expired_at(3_602_000_000_000, 3600),
            "capped by max_session_expiry"
        );
    }
}
