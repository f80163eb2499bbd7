//! The storage providers the broker keeps its state in, from startup to a
//! graceful stop
//! (docs/operations.md, "What is kept, and what is promised").
//!
//! [`Providers::open`] runs before any listener is bound, for every
//! provider a channel, `broker.retained_storage` or
//! `broker.session_storage` names, in configuration order, each opened once
//! whatever it keeps:
//!
//! 1. The lock, before anything of the provider is touched: a provider
//!    another live process holds is refused at once, naming the provider,
//!    the lock and its holder. A memory provider's snapshot directory is
//!    created (0700) for its lock to live in; a sqlite provider's
//!    `SqliteProvider::open` takes `<file_path>.lock` first thing.
//! 2. Open and recover. sqlite: the schema created or its version checked,
//!    the positions of expired sessions dropped. Memory: the snapshot
//!    directory loaded by the scan `saguin snapshot verify` runs, each file
//!    held to a size limit derived from the provider's bound
//!    ([`LoadOptions::file_limit_for`]), the positions of expired sessions
//!    dropped as each channel's file is read; the directory's findings
//!    become startup warnings.
//! 3. Then every channel - append, latest and queue - in configuration
//!    order: its store opened in its provider as the kind configured (one
//!    stored as another kind stops the start, naming both), its
//!    `max_bytes` and a queue's backoff and attempts set, and kept with its
//!    retention as a [`ServedChannel`]; a queue's dead-letter channel is
//!    served beside it as an append channel of its own.
//!
//! A damaged, truncated or foreign-version file stops the start naming the
//! file: an empty start is indistinguishable from a fresh install and
//! destroys the evidence. A role no provider is named for is kept by a
//! built-in memory provider with no snapshot directory: nothing is kept,
//! and `serve` says so.
//!
//! A memory provider with a snapshot directory gets a [`SnapshotWriter`]
//! once it is loaded: the directory's generations continue from the one
//! loaded (files no generation lists removed first), written in the
//! background while the broker serves (`super::snapshots`).
//!
//! [`Providers::close`] is the last thing a graceful stop does, after the
//! broker has handed everything to its providers: each memory provider's
//! writer is stopped (the generation it was writing finished) and its last
//! generation written - every store that changed since the one before,
//! with positions and exactly-once holds (each file to a temporary name,
//! a few at a time; all of them synced together, then renamed; the
//! directory fsynced; the manifest last) - each sqlite provider checkpointed (TRUNCATE) and
//! closed, and every lock let go. Every file written and every failure is
//! logged by name, and the [`ShutdownStatus`] says what is being written
//! while it is.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use saguin_format::model::{ChannelKind, UnixNanos};

use crate::config::{self, units::format_duration, ChannelKindConfig, ChannelLines, Config};
use crate::storage::contract::{self, OffsetStore, Provider, SessionStore, StorageError};
use crate::storage::generation::{self, Generations};
use crate::storage::lock::{self, LockError, LockGuard};
use crate::storage::memory::{LoadError, LoadOptions, MemoryConfig, MemoryProvider};
use crate::storage::snapshot_write::{self, SnapshotOptions, WriteObserver, WrittenFile};

use super::snapshots::SnapshotWriter;
use crate::storage::sqlite::{SqliteOpenError, SqliteOptions, SqliteProvider};

/// The name the built-in memory provider goes by: in parentheses, so it
/// cannot be taken for a configured provider's.
pub const BUILT_IN_NAME: &str = "(built-in memory)";

/// How many files of one snapshot are written at once.
const PARALLEL_FILES: usize = 4;

/// Why the broker cannot start on its providers. Each names the provider
/// and the file, directory or lock; `serve` exits 3 with it.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// Another live process holds the provider's lock.
    #[error("storage provider {provider}: {source}; one broker at a time may use a provider")]
    Held {
        provider: String,
        #[source]
        source: Box<LockError>,
    },
    /// The lock could not be taken for another reason.
    #[error("storage provider {provider}: {source}")]
    Lock {
        provider: String,
        #[source]
        source: Box<LockError>,
    },
    /// The snapshot directory could not be created or is no directory.
    #[error("storage provider {provider}: snapshot directory {}: {source}", .dir.display())]
    SnapshotDir {
        provider: String,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The database's directory could not be created or is no directory.
    #[error("storage provider {provider}: the database's directory {}: {source}", .dir.display())]
    DatabaseDir {
        provider: String,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The snapshot directory holds a file that cannot be loaded.
    #[error("storage provider {provider}: {source}")]
    Snapshot {
        provider: String,
        #[source]
        source: Box<LoadError>,
    },
    /// The sqlite database could not be opened, checked or recovered.
    #[error("storage provider {provider}: {source}")]
    Sqlite {
        provider: String,
        #[source]
        source: Box<SqliteOpenError>,
    },
    /// The provider refused its settings (a bound below twice the reserve).
    #[error("storage provider {provider}: {source}")]
    Settings {
        provider: String,
        #[source]
        source: StorageError,
    },
    /// A channel's store could not be opened in its provider: it is stored
    /// there as another kind, or the provider failed.
    #[error("storage provider {provider}: channel {channel} cannot be served: {source}")]
    Channel {
        channel: String,
        provider: String,
        #[source]
        source: StorageError,
    },
    /// A channel or broker store names a provider the configuration does
    /// not hold (the configuration loader refuses this; kept so it is never
    /// a panic).
    #[error("{key} names the storage provider {provider:?}, which is not configured")]
    Unknown { key: String, provider: String },
}

/// What one provider is for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Roles {
    retained: bool,
    sessions: bool,
    /// The append channels it holds, in configuration order.
    channels: Vec<Arc<str>>,
}

impl Roles {
    fn is_empty(&self) -> bool {
        *self == Roles::default()
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (self.retained, self.sessions) {
            (true, true) => {
                parts.push("retained messages, sessions and the broadcast log".to_owned())
            }
            (true, false) => parts.push("retained messages".to_owned()),
            (false, true) => parts.push("sessions and the broadcast log".to_owned()),
            (false, false) => {}
        }
        match self.channels.as_slice() {
            [] => {}
            [one] => parts.push(format!("channel {one}")),
            many => parts.push(format!("channels {}", named_briefly(many))),
        }
        if parts.is_empty() {
            "nothing".to_owned()
        } else {
            parts.join("; ")
        }
    }
}

/// Names in a log line: every one up to
/// [`config::CHANNELS_STATED_ONE_BY_ONE`], past it the first few and how
/// many more.
fn named_briefly(names: &[Arc<str>]) -> String {
    const FIRST: usize = 3;
    if names.len() <= config::CHANNELS_STATED_ONE_BY_ONE {
        return names.join(", ");
    }
    format!(
        "{} and {} more",
        names[..FIRST].join(", "),
        names.len() - FIRST
    )
}

/// A memory provider's snapshot directory while the provider is open.
struct SnapshotDir {
    dir: PathBuf,
    /// Held for as long as the provider is open.
    lock: Box<LockGuard>,
    /// Writes its generations: in the background, and the last at close.
    writer: Arc<SnapshotWriter>,
}

enum Backend {
    Memory {
        provider: Arc<MemoryProvider>,
        snapshot: Option<SnapshotDir>,
    },
    Sqlite {
        provider: Arc<SqliteProvider>,
        flush_interval: Duration,
    },
}

struct Opened {
    name: String,
    roles: Roles,
    backend: Backend,
}

impl Opened {
    fn provider(&self) -> Arc<dyn Provider> {
        match &self.backend {
            Backend::Memory { provider, .. } => provider.clone(),
            Backend::Sqlite { provider, .. } => provider.clone(),
        }
    }

    /// What the provider promises to keep, in the words every startup line
    /// about it uses (invariant 14: stated where it is claimed).
    fn durability(&self) -> String {
        match &self.backend {
            Backend::Memory {
                snapshot: Some(snapshot),
                ..
            } => memory_durability(&snapshot.dir, snapshot.writer.schedule()),
            Backend::Memory { snapshot: None, .. } => {
                "nothing: lost when the broker stops".to_owned()
            }
            Backend::Sqlite {
                provider,
                flush_interval,
            } => format!(
                "every commit to {}, less about the last flush_interval ({}) on a power cut",
                provider.path().display(),
                humantime::format_duration(*flush_interval)
            ),
        }
    }

    /// True for a memory provider with no snapshot directory.
    fn keeps_nothing(&self) -> bool {
        matches!(self.backend, Backend::Memory { snapshot: None, .. })
    }
}

/// What a memory provider with a snapshot directory promises, in the
/// words of its startup line (invariant 14): the last generation, and how
/// old it may be when the broker is killed.
fn memory_durability(dir: &Path, schedule: crate::config::SnapshotSchedule) -> String {
    match (schedule.debounce, schedule.max_delay) {
        (_, None) => format!(
            "as of the last graceful stop: written to {} when the broker stops, lost since then on a crash or power cut",
            dir.display()
        ),
        (debounce, Some(max_delay)) => format!(
            "as of the last snapshot generation in {}: written {} and at most {} after the first change since the last one; a crash or power cut loses up to the last {} (and the time one generation takes to write)",
            dir.display(),
            match debounce {
                Some(d) => format!("{} after the last change", humantime::format_duration(d)),
                None => "only at the maximum delay".to_owned(),
            },
            humantime::format_duration(max_delay),
            humantime::format_duration(max_delay)
        ),
    }
}

/// A channel the broker serves: its store, of whichever kind, opened and
/// recovered in its provider before anything listens, and its retention.
/// A queue's dead-letter channel `<queue>.dlq` is served as an append
/// channel of its own, so it is consumed like any other.
#[derive(Clone)]
pub struct ServedChannel {
    pub name: Arc<str>,
    /// The provider holding the channel (its persister writes the records).
    pub provider: Arc<dyn Provider>,
    pub store: contract::ChannelStore,
    pub retention: contract::Retention,
    /// A queue's settings (its lease above all; the store has the rest).
    pub queue: Option<config::QueueSettings>,
}

/// Drop, and log, every `bridge:` position whose bridge the configuration
/// no longer names (a reader with no session exists because a line of
/// configuration names it, and stops existing when that line goes),
/// and the QoS 2 publishes such a bridge left held, which no release will
/// come for. Blocking; before the state is restored from the channels.
pub fn drop_removed_bridge_positions(
    channels: &[ServedChannel],
    configured: &[&str],
) -> Result<usize, StorageError> {
    let mut dropped = 0;
    for channel in channels {
        // Queues hold no positions.
        let Some(offsets) = channel.store.offsets() else {
            continue;
        };
        for position in offsets.positions()? {
            let reader = &position.reader;
            if reader.scheme() != contract::ReaderScheme::Bridge
                || configured.contains(&reader.id())
            {
                continue;
            }
            if offsets.drop_position(reader)? {
                dropped += 1;
                tracing::info!(channel = %channel.name, reader = %reader, offset = position.offset,
                    "position dropped: its bridge is no longer configured");
            }
        }
    }
    // Each provider's holds once, for every channel it serves.
    let mut providers: Vec<&Arc<dyn Provider>> = Vec::new();
    for channel in channels {
        if !providers
            .iter()
            .any(|p| p.name() == channel.provider.name())
        {
            providers.push(&channel.provider);
        }
    }
    for provider in providers {
        let held = provider.held_publishes()?;
        for hold in held.held()? {
            let served = channels
                .iter()
                .any(|c| *c.name == hold.channel && c.provider.name() == provider.name());
            let removed = served
                && hold.client_id.parse::<contract::Reader>().is_ok_and(|r| {
                    r.scheme() == contract::ReaderScheme::Bridge && !configured.contains(&r.id())
                });
            if removed && held.drop_hold(&hold.channel, &hold.client_id, hold.packet_id)? {
                dropped += 1;
                tracing::warn!(channel = %hold.channel, client_id = %hold.client_id, packet_id = hold.packet_id,
                    "held QoS 2 publish dropped unreleased: its bridge is no longer configured");
            }
        }
    }
    Ok(dropped)
}

/// A served channel's line at the start: what it holds, its durability
/// (its provider's), its bound and retention, at the level `$level` (the
/// one `tracing` macro of that name).
macro_rules! log_channel {
    ($level:ident, $channel:expr, $opened:expr) => {{
        let channel: &ServedChannel = $channel;
        let o: &Opened = $opened;
        match &channel.store {
            contract::ChannelStore::Append(store) => tracing::$level!(
                channel = %channel.name,
                kind = "append",
                provider = %o.name,
                durability = %o.durability(),
                records = store.record_count(),
                next = store.next(),
                floor = store.floor(),
                bytes = store.bytes(),
                max_bytes = %or_none(store.max_bytes()),
                retention_bytes = %or_none(channel.retention.bytes),
                retention_age = %channel.retention.age.map(format_duration).unwrap_or_else(|| "none".to_owned()),
                "channel"
            ),
            contract::ChannelStore::Latest(store) => tracing::$level!(
                channel = %channel.name,
                kind = "latest",
                provider = %o.name,
                durability = %o.durability(),
                topics = store.record_count(),
                deletions = store.deletions(),
                next = store.next(),
                floor = store.floor(),
                bytes = store.bytes(),
                retention_deletions = %or_none(channel.retention.deletions),
                retention_age = %channel.retention.age.map(format_duration).unwrap_or_else(|| "none".to_owned()),
                "channel"
            ),
            contract::ChannelStore::Queue(store) => {
                let settings = channel.queue.as_ref();
                tracing::$level!(
                    channel = %channel.name,
                    kind = "queue",
                    provider = %o.name,
                    durability = %o.durability(),
                    depth = store.depth(),
                    next = store.next(),
                    bytes = store.bytes(),
                    max_bytes = %or_none(store.max_bytes()),
                    lease = %settings.map(|q| format_duration(q.lease)).unwrap_or_default(),
                    max_attempts = settings.map_or(0, |q| q.max_attempts),
                    dead_letter = %store.dead_letter().name(),
                    "channel"
                )
            }
        }
    }};
}

/// Every storage provider the broker uses, opened, locked and recovered.
pub struct Providers {
    opened: Vec<Opened>,
    /// Indexes into `opened`.
    retained: usize,
    sessions: usize,
    /// Every append channel, in configuration order.
    channels: Vec<ServedChannel>,
}

impl Providers {
    /// Blocking: opens, locks and recovers every provider a channel or a
    /// broker store names, then opens every append channel (see the module
    /// documentation), or says why it cannot.
    pub fn open(config: &Config) -> Result<Providers, StartupError> {
        let retained_name = config.broker.retained_storage.as_deref();
        let session_name = config.broker.session_storage.as_deref();
        let named = [
            ("broker.retained_storage".to_owned(), retained_name),
            ("broker.session_storage".to_owned(), session_name),
        ]
        .into_iter()
        .chain(
            config
                .channels
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("channels[{i}].storage"), Some(c.storage.as_str()))),
        );
        for (key, name) in named {
            if let Some(name) = name {
                if config.provider(name).is_none() {
                    return Err(StartupError::Unknown {
                        key,
                        provider: name.to_owned(),
                    });
                }
            }
        }
        // Grouped once, so a configuration of many channels opens in
        // linear time.
        let mut channels_of: HashMap<&str, Vec<&config::Channel>> = HashMap::new();
        for channel in &config.channels {
            channels_of
                .entry(channel.storage.as_str())
                .or_default()
                .push(channel);
        }
        let mut opened = Vec::new();
        // Configuration order, each provider once whatever it keeps.
        for provider in &config.storage {
            let configured = channels_of
                .get(provider.name())
                .map(Vec::as_slice)
                .unwrap_or_default();
            let roles = Roles {
                retained: retained_name == Some(provider.name()),
                sessions: session_name == Some(provider.name()),
                channels: configured
                    .iter()
                    .map(|c| Arc::from(c.name.as_str()))
                    .collect(),
            };
            if roles.is_empty() && configured.is_empty() {
                continue;
            }
            opened.push(open_one(config, provider, roles, configured)?);
        }
        let missing = Roles {
            retained: retained_name.is_none(),
            sessions: session_name.is_none(),
            channels: Vec::new(),
        };
        if !missing.is_empty() {
            let provider = MemoryProvider::new(MemoryConfig {
                name: BUILT_IN_NAME.to_owned(),
                max_bytes: None,
                reserve: config.reserve_bytes(),
            })
            .map_err(|source| StartupError::Settings {
                provider: BUILT_IN_NAME.to_owned(),
                source,
            })?;
            opened.push(Opened {
                name: BUILT_IN_NAME.to_owned(),
                roles: missing,
                backend: Backend::Memory {
                    provider,
                    snapshot: None,
                },
            });
        }
        let channels = open_channels(config, &opened)?;
        let index_of = |wanted: fn(&Roles) -> bool| {
            opened
                .iter()
                .position(|o| wanted(&o.roles))
                .unwrap_or_default()
        };
        let retained = index_of(|r| r.retained);
        let sessions = index_of(|r| r.sessions);
        Ok(Providers {
            opened,
            retained,
            sessions,
            channels,
        })
    }

    /// The snapshot writers of the memory providers with a snapshot
    /// directory, for the broker task to drive their background
    /// generations.
    pub fn snapshot_writers(&self) -> Vec<Arc<SnapshotWriter>> {
        self.opened
            .iter()
            .filter_map(|o| match &o.backend {
                Backend::Memory {
                    snapshot: Some(s), ..
                } => Some(s.writer.clone()),
                _ => None,
            })
            .collect()
    }

    /// Blocking: the latest time the storage says it was in use before
    /// this start: the later of what any provider's lock recorded (the
    /// previous holder's start, or its stop by the later of its system and
    /// receipt clocks) and the receipt time of each append channel's newest
    /// record, which a power cut keeps. `None` when there is neither (new
    /// storage, or a memory provider without a snapshot directory only).
    pub fn last_recorded_time(&self) -> Option<UnixNanos> {
        let locks = self.opened.iter().filter_map(|o| match &o.backend {
            Backend::Memory {
                snapshot: Some(s), ..
            } => s.lock.previous_time(),
            Backend::Memory { snapshot: None, .. } => None,
            Backend::Sqlite { provider, .. } => provider.lock_previous_time(),
        });
        let newest_records = self.channels.iter().filter_map(|c| match &c.store {
            contract::ChannelStore::Append(store) => {
                let last = store.next().checked_sub(1)?;
                if last < store.floor().max(1) {
                    return None;
                }
                // A read that fails gives no time; the start goes on.
                let record = store.read_from_n(last, 1).ok()?.into_iter().next()?;
                (record.timestamp > 0).then_some(record.timestamp)
            }
            contract::ChannelStore::Latest(_) | contract::ChannelStore::Queue(_) => None,
        });
        locks.chain(newest_records).max()
    }

    /// The provider keeping retained messages.
    pub fn retained(&self) -> Arc<dyn Provider> {
        self.opened[self.retained].provider()
    }

    /// Every append channel the configuration names, in configuration order.
    pub fn channels(&self) -> Vec<ServedChannel> {
        self.channels.clone()
    }

    /// The provider keeping sessions, the broadcast log and the broadcast
    /// QoS 2 holds.
    pub fn sessions(&self) -> Arc<dyn Provider> {
        self.opened[self.sessions].provider()
    }

    /// One line per provider: what it keeps, its durability and what its
    /// bound came to; a warning for each memory provider with no snapshot
    /// directory that holds channels; then one line per channel: what it
    /// holds, its durability (its provider's), its bound and retention.
    pub fn log_startup(&self) {
        for o in &self.opened {
            let provider = o.provider();
            let keeps = o.roles.describe();
            let durability = o.durability();
            match &o.backend {
                Backend::Memory { .. } => {
                    let bound = match provider.max_bytes() {
                        Some(max) => format!(
                            "{max} bytes, of which {} held back as the reserve",
                            provider.reserve()
                        ),
                        None => "unbounded".to_owned(),
                    };
                    tracing::info!(provider = %o.name, kind = "memory", keeps = %keeps, durability = %durability,
                        bound = %bound, held_bytes = provider.bytes(), "storage provider");
                    if o.keeps_nothing() && !o.roles.channels.is_empty() {
                        tracing::warn!(provider = %o.name, channels = %named_briefly(&o.roles.channels),
                            "keeps nothing: a memory provider with no snapshot_dir; its channels' records and positions are lost when the broker stops");
                    }
                }
                Backend::Sqlite {
                    provider: sqlite, ..
                } => {
                    let bound = match sqlite.bounds() {
                        Some(b) => format!(
                            "{} pages of {} bytes ({} bytes), publishes stop at {} pages, {} bytes held back as the reserve",
                            b.relief_pages,
                            b.page_size,
                            b.relief_pages.saturating_mul(b.page_size),
                            b.publish_pages,
                            provider.reserve()
                        ),
                        None => "unbounded (SQLite's own limit)".to_owned(),
                    };
                    tracing::info!(provider = %o.name, kind = "sqlite", keeps = %keeps, durability = %durability,
                        bound = %bound, "storage provider");
                }
            }
        }
        let each = ChannelLines::at_start(self.channels.len()) == ChannelLines::Each;
        // A provider's channels, records and bytes, when its channels are
        // stated together.
        let mut totals: Vec<(&str, u64, u64, u64)> = Vec::new();
        for channel in &self.channels {
            let Some(o) = self
                .opened
                .iter()
                .find(|o| o.name == channel.provider.name())
            else {
                continue;
            };
            if each {
                log_channel!(info, channel, o);
                continue;
            }
            log_channel!(debug, channel, o);
            let (records, bytes) = match &channel.store {
                contract::ChannelStore::Append(store) => (store.record_count(), store.bytes()),
                contract::ChannelStore::Latest(store) => (store.record_count(), store.bytes()),
                contract::ChannelStore::Queue(store) => (store.depth(), store.bytes()),
            };
            match totals.iter_mut().find(|(name, ..)| *name == o.name) {
                Some((_, channels, r, b)) => {
                    *channels += 1;
                    *r += records;
                    *b += bytes;
                }
                None => totals.push((&o.name, 1, records, bytes)),
            }
        }
        for (provider, channels, records, bytes) in totals {
            tracing::info!(provider = %provider, channels, records, bytes,
                "channels (each channel's line is at the debug level)");
        }
    }

    /// Blocking graceful close, after the broker has handed everything to
    /// its providers: snapshots written, sqlite checkpointed and closed,
    /// every lock let go, each step logged. `status` names what is being
    /// written while it is.
    pub fn close(self, status: &ShutdownStatus) -> ShutdownReport {
        let started = Instant::now();
        let mut report = ShutdownReport::default();
        for o in self.opened {
            let Opened {
                name,
                roles: _,
                backend,
            } = o;
            match backend {
                Backend::Memory { provider, snapshot } => {
                    if let Some(snapshot) = snapshot {
                        write_memory(&name, &snapshot.writer, &snapshot.dir, status, &mut report);
                        close_provider(&name, provider.as_ref(), status, &mut report);
                        drop(snapshot);
                    } else {
                        close_provider(&name, provider.as_ref(), status, &mut report);
                    }
                }
                Backend::Sqlite { provider, .. } => {
                    status.set(format!(
                        "storage provider {name}: checkpointing and closing {}",
                        provider.path().display()
                    ));
                    close_provider(&name, provider.as_ref(), status, &mut report);
                }
            }
        }
        report.elapsed = started.elapsed();
        status.set("every storage provider closed");
        let bytes: u64 = report.written.iter().map(|(_, w)| w.bytes).sum();
        if report.is_complete() {
            tracing::info!(
                files = report.written.len(),
                bytes,
                elapsed_ms = report.elapsed.as_millis() as u64,
                "storage closed"
            );
        } else {
            tracing::error!(
                files = report.written.len(),
                bytes,
                failed = report.failures.len(),
                elapsed_ms = report.elapsed.as_millis() as u64,
                "storage closed with failures"
            );
        }
        report
    }
}

/// Lock, open and recover one configured provider.
/// `channels` are the configured channels it holds, of every kind: their
/// files are loaded as the kind the configuration gives (another kind in
/// a file stops the start).
fn open_one(
    config: &Config,
    provider: &config::Provider,
    roles: Roles,
    channels: &[&config::Channel],
) -> Result<Opened, StartupError> {
    let name = provider.name().to_owned();
    let max_session_expiry =
        u32::try_from(config.limits.max_session_expiry.as_secs()).unwrap_or(u32::MAX);
    let backend = match provider {
        config::Provider::Memory(m) => {
            // A directory that is not there yet is a first start: it is
            // created for the lock, and there is nothing in it to load.
            let first_start = m.snapshot_dir.as_deref().is_some_and(|dir| {
                std::fs::symlink_metadata(dir)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            });
            let locked = match &m.snapshot_dir {
                Some(dir) => Some((dir.clone(), Box::new(lock_snapshot_dir(&name, dir)?))),
                None => None,
            };
            let memory = MemoryProvider::new(MemoryConfig {
                name: name.clone(),
                max_bytes: m.max_bytes,
                reserve: config.reserve_bytes(),
            })
            .map_err(|source| StartupError::Settings {
                provider: name.clone(),
                source,
            })?;
            let snapshot = match locked {
                Some((dir, lock)) => {
                    let committed = if first_start {
                        tracing::info!(provider = %name, dir = %dir.display(), "first start: the snapshot directory was created, nothing to load");
                        generation::Committed::default()
                    } else {
                        let options = LoadOptions {
                            channels: channels
                                .iter()
                                .map(|c| (c.name.clone(), channel_kind(&c.kind)))
                                .collect(),
                            retained: roles.retained,
                            sessions: roles.sessions,
                            now: contract::now_nanos(),
                            max_session_expiry,
                            max_file_bytes: LoadOptions::file_limit_for(m.max_bytes),
                        };
                        load_memory(&name, &memory, &dir, &options)?
                    };
                    for removed in generation::tidy(&dir, &committed) {
                        tracing::info!(provider = %name, dir = %dir.display(), file = %removed,
                            "removed a file no snapshot generation lists (a generation cut short or replaced)");
                    }
                    let options = SnapshotOptions {
                        retained: roles.retained,
                        sessions: roles.sessions,
                        parallel_files: PARALLEL_FILES,
                    };
                    let mut generations = Generations::new(&dir, options, committed, &memory);
                    generations.keep_room(&name, m.snapshot_room);
                    let writer =
                        SnapshotWriter::start(&name, memory.clone(), generations, m.snapshots);
                    Some(SnapshotDir { dir, lock, writer })
                }
                None => None,
            };
            Backend::Memory {
                provider: memory,
                snapshot,
            }
        }
        config::Provider::Sqlite(s) => {
            // Made 0700 on a first start, as a memory provider's snapshot
            // directory is: a unit's StateDirectory is made, a directory
            // under it named for the database is not.
            let dir = crate::storage::parent_of(&s.file_path);
            snapshot_write::create_dir(&dir).map_err(|source| StartupError::DatabaseDir {
                provider: name.clone(),
                dir,
                source,
            })?;
            let options = SqliteOptions {
                name: name.clone(),
                file_path: s.file_path.clone(),
                max_bytes: s.max_bytes,
                reserve: config.reserve_bytes(),
                flush_interval: s.flush_interval,
                publish_commit_interval: s.publish_commit_interval,
                publish_commit_max_records: s.publish_commit_max_records as usize,
                read_connections: s.read_connections as usize,
                max_session_expiry,
                wal_restart_bytes: crate::storage::sqlite::WAL_RESTART_BYTES,
                checkpoint_room: s.checkpoint_room,
            };
            let sqlite = SqliteProvider::open(options).map_err(|e| match e {
                SqliteOpenError::Locked(source) => lock_error(&name, source),
                source => StartupError::Sqlite {
                    provider: name.clone(),
                    source: Box::new(source),
                },
            })?;
            Backend::Sqlite {
                provider: Arc::new(sqlite),
                flush_interval: s.flush_interval,
            }
        }
    };
    Ok(Opened {
        name,
        roles,
        backend,
    })
}

/// Opens every channel of `config` in the provider it names, in
/// configuration order, its own bound set (a queue's settings too, and
/// its dead-letter channel served beside it).
fn open_channels(config: &Config, opened: &[Opened]) -> Result<Vec<ServedChannel>, StartupError> {
    let by_name: HashMap<&str, &Opened> = opened.iter().map(|o| (o.name.as_str(), o)).collect();
    let mut served = Vec::new();
    for (i, channel) in config.channels.iter().enumerate() {
        let Some(o) = by_name.get(channel.storage.as_str()) else {
            return Err(StartupError::Unknown {
                key: format!("channels[{i}].storage"),
                provider: channel.storage.clone(),
            });
        };
        let provider = o.provider();
        let failed = |source| StartupError::Channel {
            channel: channel.name.clone(),
            provider: o.name.clone(),
            source,
        };
        let kind = channel_kind(&channel.kind);
        let store = provider.open_channel(&channel.name, kind).map_err(failed)?;
        if store.kind() != kind {
            return Err(failed(StorageError::KindMismatch {
                channel: channel.name.clone(),
                configured: kind,
                stored: store.kind(),
            }));
        }
        let retention = contract::Retention {
            bytes: channel.retention_bytes,
            age: channel.retention_age,
            deletions: channel.retention_deletions,
        };
        let queue = channel.queue().cloned();
        match &store {
            contract::ChannelStore::Append(s) => s.set_max_bytes(channel.max_bytes),
            contract::ChannelStore::Latest(_) => {}
            contract::ChannelStore::Queue(q) => {
                q.set_max_bytes(channel.max_bytes);
                if let Some(settings) = &queue {
                    q.set_backoff(settings.backoff.clone());
                    q.set_max_attempts(settings.max_attempts);
                }
            }
        }
        let dead_letter = store.as_queue().map(|q| q.dead_letter());
        served.push(ServedChannel {
            name: Arc::from(channel.name.as_str()),
            provider: provider.clone(),
            store,
            retention,
            queue: queue.clone(),
        });
        // The dead-letter channel: an append channel of its own, bounded
        // by dlq_retention_bytes.
        if let Some(dead_letter) = dead_letter {
            served.push(ServedChannel {
                name: Arc::from(dead_letter.name()),
                provider,
                store: contract::ChannelStore::Append(dead_letter),
                retention: contract::Retention {
                    bytes: queue.and_then(|q| q.dlq_retention_bytes),
                    age: None,
                    deletions: None,
                },
                queue: None,
            });
        }
    }
    Ok(served)
}

/// A configured channel kind as the stores name it.
fn channel_kind(kind: &ChannelKindConfig) -> ChannelKind {
    match kind {
        ChannelKindConfig::Append => ChannelKind::Append,
        ChannelKindConfig::Latest => ChannelKind::Latest,
        ChannelKindConfig::Queue(_) => ChannelKind::Queue,
    }
}

/// A bound for a log line: the number, or `none`.
fn or_none(value: Option<u64>) -> String {
    value.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

fn lock_error(provider: &str, source: LockError) -> StartupError {
    let provider = provider.to_owned();
    let source = Box::new(source);
    match *source {
        LockError::Held { .. } => StartupError::Held { provider, source },
        _ => StartupError::Lock { provider, source },
    }
}

/// The directory (created 0700 on a first start, so its lock has a place)
/// and its lock, before any file in it is read.
fn lock_snapshot_dir(provider: &str, dir: &Path) -> Result<LockGuard, StartupError> {
    snapshot_write::create_dir(dir).map_err(|source| StartupError::SnapshotDir {
        provider: provider.to_owned(),
        dir: dir.to_path_buf(),
        source,
    })?;
    lock::acquire(&lock::lock_path_for_snapshot_dir(dir)).map_err(|e| lock_error(provider, e))
}

/// Loads a snapshot directory, its findings logged as warnings; the
/// directory's current generation, for the writer that continues it.
fn load_memory(
    name: &str,
    memory: &Arc<MemoryProvider>,
    dir: &Path,
    options: &LoadOptions,
) -> Result<generation::Committed, StartupError> {
    let report =
        memory
            .load_snapshot_dir(dir, options)
            .map_err(|source| StartupError::Snapshot {
                provider: name.to_owned(),
                source: Box::new(source),
            })?;
    for warning in &report.warnings {
        tracing::warn!(provider = %name, dir = %dir.display(), "{warning}");
    }
    for file in &report.ignored_files {
        tracing::info!(provider = %name, dir = %dir.display(), file = %file,
            "not a file this provider keeps; left alone");
    }
    for channel in report.loaded.iter().filter(|c| c.dropped_positions > 0) {
        tracing::info!(provider = %name, channel = %channel.name, positions = channel.dropped_positions,
            "dropped the positions of expired sessions");
    }
    let sessions = if options.sessions {
        memory
            .session_store()
            .sessions()
            .map(|s| s.len())
            .unwrap_or_default()
    } else {
        0
    };
    // How old the state is: what a crash before this start lost is what
    // changed after this moment.
    let age = report.manifest_at.map(|at| {
        let ms = (options.now.saturating_sub(at) / 1_000_000).max(0);
        humantime::format_duration(Duration::from_millis(ms as u64)).to_string()
    });
    tracing::info!(
        provider = %name,
        dir = %dir.display(),
        generation = report.generation,
        captured_at = report.manifest_at.map(lock::rfc3339).unwrap_or_else(|| "none".into()),
        age = %age.unwrap_or_else(|| "unknown (no manifest)".into()),
        retained = memory.retained_store().record_count(),
        sessions,
        dropped_sessions = report.dropped_sessions,
        dropped_positions = report.dropped_positions,
        abandoned_holds = report.abandoned_holds,
        held_bytes = memory.bytes(),
        "snapshot loaded"
    );
    Ok(report.committed)
}

/// Writes a memory provider's last generation: its background writer
/// stopped (what it was writing finished), then whatever changed since
/// the last generation, each file and each failure logged by name.
fn write_memory(
    name: &str,
    writer: &SnapshotWriter,
    dir: &Path,
    status: &ShutdownStatus,
    report: &mut ShutdownReport,
) {
    status.set(format!(
        "storage provider {name}: finishing the snapshot generation being written in {}",
        dir.display()
    ));
    writer.stop();
    let started = Instant::now();
    status.set(format!(
        "storage provider {name}: copying its state for the snapshot in {}",
        dir.display()
    ));
    let mut generations = writer.generations();
    let now = contract::now_nanos();
    let job = generations
        .capture(writer.provider(), now)
        .or_else(|| generations.adopt(now));
    let Some(job) = job else {
        let committed = generations.committed();
        tracing::info!(provider = %name, dir = %dir.display(), generation = committed.generation,
            captured_at = %lock::rfc3339(committed.captured_at),
            "snapshot: nothing changed since the last generation, nothing to write");
        return;
    };
    let observer = StatusObserver {
        status,
        prefix: format!("storage provider {name}: snapshot {}", dir.display()),
        writing: Mutex::new(BTreeSet::new()),
    };
    let mut outcome = generations.write(job, &observer);
    // A file found no room and the room was given up: the stop has no next
    // generation, so it writes what is still unwritten into the room now.
    if outcome.room_given {
        if let Some(job) = generations.capture(writer.provider(), contract::now_nanos()) {
            tracing::warn!(provider = %name, dir = %dir.display(), failed = outcome.report.failed.len(),
                "snapshot: writing again into the snapshot room what found no room");
            let first = std::mem::take(&mut outcome.report.written);
            let (removed, committed) = (outcome.removed, outcome.committed.take());
            outcome = generations.write(job, &observer);
            outcome.report.written.splice(0..0, first);
            outcome.removed += removed;
            // The first generation stands when the second's manifest found
            // no room either.
            outcome.committed = outcome.committed.take().or(committed);
        }
    }
    drop(generations);
    let written = &outcome.report;
    // Past as many files as the start states channels one by one, each
    // file's line is at the debug level: the stop's own lines last.
    let each = written.written.len() <= config::CHANNELS_STATED_ONE_BY_ONE;
    for w in &written.written {
        if each {
            tracing::info!(provider = %name, dir = %dir.display(), file = %w.file_name, bytes = w.bytes,
                records = w.records, "snapshot file written");
        } else {
            tracing::debug!(provider = %name, dir = %dir.display(), file = %w.file_name, bytes = w.bytes,
                records = w.records, "snapshot file written");
        }
    }
    for f in &written.failed {
        writer.count_failure();
        tracing::error!(provider = %name, path = %f.path.display(), error = %f.error, "{f}");
        report
            .failures
            .push(format!("storage provider {name}: {f}"));
    }
    let generation = outcome.committed.as_ref().map(|c| c.generation);
    if let Some(c) = &outcome.committed {
        writer.record_committed(c.generation, c.captured_at);
    }
    tracing::info!(provider = %name, dir = %dir.display(),
        generation = %generation.map_or_else(|| "none (the previous one stands)".to_owned(), |g| g.to_string()),
        files = written.written.len(),
        bytes = written.written.iter().map(|w| w.bytes).sum::<u64>(),
        failed = written.failed.len(), removed = outcome.removed,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "snapshot written");
    report.written.extend(
        outcome
            .report
            .written
            .into_iter()
            .map(|w| (name.to_owned(), w)),
    );
}

/// Closes one provider, a failure reported by name.
fn close_provider(
    name: &str,
    provider: &dyn Provider,
    status: &ShutdownStatus,
    report: &mut ShutdownReport,
) {
    status.set(format!("storage provider {name}: closing"));
    // A provider that failed while serving closes as well as it can, but
    // the stop is not a clean one: what it acknowledged since its last
    // flush may not be on the disk that failed.
    if let contract::Health::Failed { kind, detail } = provider.health() {
        tracing::error!(provider = %name, kind = kind.label(), error = %detail,
            "the storage provider failed while serving: commits acknowledged since its last flush may not be on its disk; put the disk right and restart");
        report.failures.push(format!(
            "storage provider {name}: failed while serving ({}): {detail}",
            kind.label()
        ));
    }
    match provider.close() {
        Ok(()) => tracing::info!(provider = %name, "storage provider closed"),
        Err(e) => {
            tracing::error!(provider = %name, error = %e, "closing the storage provider failed");
            report
                .failures
                .push(format!("storage provider {name}: closing: {e}"));
        }
    }
}

/// What a graceful close wrote and what it could not.
#[derive(Debug, Default)]
pub struct ShutdownReport {
    /// Every file written, with its provider.
    pub written: Vec<(String, WrittenFile)>,
    /// Every failure, naming the provider and the file.
    pub failures: Vec<String>,
    /// How long the close took.
    pub elapsed: Duration,
}

impl ShutdownReport {
    /// False when any file or any close failed.
    pub fn is_complete(&self) -> bool {
        self.failures.is_empty()
    }
}

/// What a shutdown is doing right now, for a second signal to report and,
/// under a notify supervisor, sent to it as `STATUS=` at every change.
#[derive(Clone, Debug, Default)]
pub struct ShutdownStatus {
    current: Arc<Mutex<String>>,
    supervisor: Option<Arc<super::notify::Notifier>>,
}

impl ShutdownStatus {
    /// A status whose every change is also sent to `supervisor`.
    pub fn reporting_to(supervisor: Option<Arc<super::notify::Notifier>>) -> ShutdownStatus {
        ShutdownStatus {
            current: Arc::default(),
            supervisor,
        }
    }

    pub fn set(&self, what: impl Into<String>) {
        let what = what.into();
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if *current == what {
            return;
        }
        // Sent under the lock, so the supervisor sees changes in order.
        if let Some(supervisor) = &self.supervisor {
            supervisor.status(&what);
        }
        *current = what;
    }

    pub fn get(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Keeps `status` naming the files of one snapshot still being written.
struct StatusObserver<'a> {
    status: &'a ShutdownStatus,
    prefix: String,
    writing: Mutex<BTreeSet<String>>,
}

impl StatusObserver<'_> {
    fn update(&self, writing: &BTreeSet<String>) {
        let files: Vec<&str> = writing.iter().map(String::as_str).collect();
        self.status.set(if files.is_empty() {
            format!("{}: between files", self.prefix)
        } else {
            format!("{}: writing {}", self.prefix, files.join(", "))
        });
    }
}

impl WriteObserver for StatusObserver<'_> {
    fn started(&self, file_name: &str) {
        let mut writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        writing.insert(file_name.to_owned());
        self.update(&writing);
    }

    fn finished(&self, file_name: &str) {
        let mut writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        writing.remove(file_name);
        self.update(&writing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::contract::{Position, Reader};
    use saguin_format::model::Record;

    fn config(dir: &Path, storage: &str, broker: &str) -> Config {
        let text = format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
             auth:\n  allow_anonymous: true\n\
             storage:\n{storage}broker:\n{broker}"
        );
        Config::from_yaml_str(&text, &dir.join("saguin.yaml")).expect("valid configuration")
    }

    fn config_with_channels(dir: &Path, storage: &str, channels: &str, broker: &str) -> Config {
        let text = format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
             auth:\n  allow_anonymous: true\n\
             storage:\n{storage}channels:\n{channels}broker:\n{broker}"
        );
        Config::from_yaml_str(&text, &dir.join("saguin.yaml")).expect("valid configuration")
    }

    fn sqlite(dir: &Path) -> String {
        format!(
            "  - name: db\n    kind: sqlite\n    file_path: {}\n",
            dir.join("saguin.db").display()
        )
    }

    fn record(channel: &str, payload: &str) -> Record {
        Record {
            timestamp: contract::now_nanos(),
            qos: 1,
            ..Record::new(channel, payload.to_owned())
        }
    }

    fn position(client: &str, offset: u64, saved_at: i64, expiry: u32) -> Position {
        Position {
            reader: Reader::mqtt(client).unwrap(),
            offset,
            saved_at,
            session_expiry: Some(expiry),
        }
    }

    #[test]
    fn every_append_channel_is_opened_in_configuration_order_with_its_bounds() {
        let d = tempfile::tempdir().unwrap();
        let c = config_with_channels(
            d.path(),
            &format!("{}{}", memory(d.path()), sqlite(d.path())),
            "  - {name: zeta, kind: append, storage: db, max_bytes: 1MiB, retention_bytes: 64KiB, retention_age: 1h}\n\
             \x20 - {name: alpha, kind: append, storage: mem}\n\
             \x20 - {name: beta, kind: append, storage: db}\n",
            "  session_storage: db\n",
        );
        let p = Providers::open(&c).unwrap();
        // mem is named by a channel only, and opened for it: its lock is held.
        assert!(d.path().join("snap/saguin.lock").exists());
        let names: Vec<&str> = p.opened.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["mem", "db", BUILT_IN_NAME]);
        assert_eq!(p.opened[0].roles.describe(), "channel alpha");
        assert_eq!(
            p.opened[1].roles.describe(),
            "sessions and the broadcast log; channels zeta, beta"
        );
        let channels = p.channels();
        let order: Vec<(&str, &str)> = channels
            .iter()
            .map(|c| (&*c.name, c.provider.name()))
            .collect();
        assert_eq!(order, [("zeta", "db"), ("alpha", "mem"), ("beta", "db")]);
        assert_eq!(
            channels[0].store.as_append().expect("append").max_bytes(),
            Some(1024 * 1024)
        );
        assert_eq!(
            channels[0].retention,
            contract::Retention {
                bytes: Some(64 * 1024),
                age: Some(Duration::from_secs(3600)),
                deletions: None,
            }
        );
        assert_eq!(
            channels[1].store.as_append().expect("append").max_bytes(),
            None
        );
        assert_eq!(channels[1].retention, contract::Retention::default());
        assert!(same(&channels[0].provider, &p.sessions()));
        assert!(p.close(&ShutdownStatus::default()).is_complete());
    }

    #[test]
    fn a_channel_stored_as_another_kind_stops_the_start_naming_it_and_its_provider() {
        let d = tempfile::tempdir().unwrap();
        let db =
            SqliteProvider::open(SqliteOptions::new("db", d.path().join("saguin.db"))).unwrap();
        db.open_channel("devices", ChannelKind::Latest).unwrap();
        db.close().unwrap();
        drop(db);
        let c = config_with_channels(
            d.path(),
            &sqlite(d.path()),
            "  - {name: devices, kind: append, storage: db}\n",
            "",
        );
        let err = Providers::open(&c).err().expect("refused");
        assert!(matches!(err, StartupError::Channel { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("storage provider db"), "{text}");
        assert!(text.contains("channel devices"), "{text}");
        assert!(
            text.contains("configured as append but stored as latest"),
            "{text}"
        );
        // Nothing is held on the way out: the provider can be opened again.
        SqliteProvider::open(SqliteOptions::new("db", d.path().join("saguin.db")))
            .unwrap()
            .close()
            .unwrap();
    }

    #[test]
    fn a_memory_channel_is_written_at_close_with_its_positions_and_holds_and_comes_back() {
        let d = tempfile::tempdir().unwrap();
        let c = config_with_channels(
            d.path(),
            &memory(d.path()),
            "  - {name: telemetry, kind: append, storage: mem}\n",
            "",
        );
        let p = Providers::open(&c).unwrap();
        let channel = p.channels().remove(0);
        for payload in ["one", "two", "three"] {
            channel
                .store
                .as_append()
                .expect("append")
                .append(record("telemetry", payload))
                .unwrap();
        }
        let now = contract::now_nanos();
        channel
            .store
            .as_append()
            .expect("append")
            .save_position(position("kept", 2, now, 3600))
            .unwrap();
        // Saved two hours ago with a one-hour session: expired while down.
        let two_hours = 2 * 3600 * 1_000_000_000;
        channel
            .store
            .as_append()
            .expect("append")
            .save_position(position("gone", 1, now - two_hours, 3600))
            .unwrap();
        let held = contract::HeldPublish {
            channel: "telemetry".into(),
            client_id: "producer".into(),
            packet_id: 7,
            held_at: now,
            record: Record {
                qos: 2,
                client_id: "producer".into(),
                ..record("telemetry", "held")
            },
        };
        channel
            .provider
            .held_publishes()
            .unwrap()
            .hold(held.clone())
            .unwrap();
        drop(channel);
        let report = p.close(&ShutdownStatus::default());
        assert!(report.is_complete(), "{:?}", report.failures);
        let files: Vec<&str> = report
            .written
            .iter()
            .map(|(_, w)| w.file_name.as_str())
            .collect();
        assert_eq!(
            files,
            ["telemetry.1.snapshot", "saguin.manifest"],
            "the manifest last: it commits the generation"
        );

        let again = Providers::open(&c).unwrap();
        let channel = again.channels().remove(0);
        assert_eq!(
            (
                channel.store.as_append().expect("append").record_count(),
                channel.store.as_append().expect("append").next(),
                channel.store.as_append().expect("append").floor()
            ),
            (3, 4, 1)
        );
        let readers: Vec<String> = channel
            .store
            .as_append()
            .expect("append")
            .positions()
            .unwrap()
            .iter()
            .map(|p| p.reader.to_string())
            .collect();
        assert_eq!(
            readers,
            ["mqtt:kept"],
            "the expired session's position was dropped at open"
        );
        assert_eq!(
            channel.provider.held_publishes().unwrap().held().unwrap(),
            [held]
        );
        assert!(again.close(&ShutdownStatus::default()).is_complete());
    }

    #[test]
    fn a_sqlite_provider_holding_only_channels_is_checkpointed_at_close() {
        let d = tempfile::tempdir().unwrap();
        let c = config_with_channels(
            d.path(),
            &sqlite(d.path()),
            "  - {name: telemetry, kind: append, storage: db}\n",
            "",
        );
        let p = Providers::open(&c).unwrap();
        assert_eq!(p.opened[0].roles.describe(), "channel telemetry");
        let channel = p.channels().remove(0);
        for i in 0..50 {
            channel
                .store
                .as_append()
                .expect("append")
                .append(record("telemetry", &format!("r{i}")))
                .unwrap();
        }
        drop(channel);
        let wal = d.path().join("saguin.db-wal");
        assert!(
            wal.metadata().is_ok_and(|m| m.len() > 0),
            "the log holds the commits"
        );
        assert!(p.close(&ShutdownStatus::default()).is_complete());
        assert!(
            wal.metadata().map_or(true, |m| m.len() == 0),
            "checkpointed into the database at close"
        );
        let db =
            SqliteProvider::open(SqliteOptions::new("db", d.path().join("saguin.db"))).unwrap();
        let store = db.open_channel("telemetry", ChannelKind::Append).unwrap();
        assert_eq!(store.as_append().unwrap().next(), 51);
        db.close().unwrap();
    }

    #[test]
    fn roles_say_which_channels_a_provider_holds() {
        let roles = |retained, sessions, channels: &[&str]| Roles {
            retained,
            sessions,
            channels: channels.iter().map(|c| Arc::from(*c)).collect(),
        };
        assert_eq!(roles(false, false, &[]).describe(), "nothing");
        assert_eq!(
            roles(true, true, &[]).describe(),
            "retained messages, sessions and the broadcast log"
        );
        assert_eq!(
            roles(true, false, &["a"]).describe(),
            "retained messages; channel a"
        );
        assert_eq!(roles(false, false, &["a", "b"]).describe(), "channels a, b");
    }

    fn memory(dir: &Path) -> String {
        format!(
            "  - name: mem\n    kind: memory\n    snapshot_dir: {}\n",
            dir.join("snap").display()
        )
    }

    fn same(a: &Arc<dyn Provider>, b: &Arc<dyn Provider>) -> bool {
        std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
    }

    #[test]
    fn a_provider_named_by_both_roles_is_opened_once() {
        let d = tempfile::tempdir().unwrap();
        let c = config(
            d.path(),
            &memory(d.path()),
            "  retained_storage: mem\n  session_storage: mem\n",
        );
        let p = Providers::open(&c).unwrap();
        assert_eq!(p.opened.len(), 1);
        assert!(same(&p.retained(), &p.sessions()));
        assert_eq!(p.retained().name(), "mem");
        assert!(p.close(&ShutdownStatus::default()).is_complete());
    }

    #[test]
    fn a_role_no_provider_is_named_for_is_kept_by_the_built_in_memory_provider() {
        let d = tempfile::tempdir().unwrap();
        let c = config(d.path(), &memory(d.path()), "  retained_storage: mem\n");
        let p = Providers::open(&c).unwrap();
        assert_eq!(p.retained().name(), "mem");
        assert_eq!(p.sessions().name(), BUILT_IN_NAME);
        assert!(!same(&p.retained(), &p.sessions()));
        let status = ShutdownStatus::default();
        let report = p.close(&status);
        assert!(report.is_complete(), "{:?}", report.failures);
        // Only what `mem` keeps is written: the manifest and the retained
        // store, no sessions pair.
        let files: Vec<&str> = report
            .written
            .iter()
            .map(|(p, w)| {
                assert_eq!(p, "mem");
                w.file_name.as_str()
            })
            .collect();
        assert_eq!(
            files,
            ["%24saguin%2Fretained.1.snapshot", "saguin.manifest"]
        );
        assert!(!d.path().join("snap/saguin.1.sessions").exists());
        assert_eq!(status.get(), "every storage provider closed");
    }

    #[test]
    fn nothing_named_uses_one_built_in_provider_and_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let c = config(d.path(), &memory(d.path()), "");
        let p = Providers::open(&c).unwrap();
        assert_eq!(p.opened.len(), 1);
        assert!(same(&p.retained(), &p.sessions()));
        assert_eq!(p.retained().name(), BUILT_IN_NAME);
        // `mem` is named by nothing: it is not opened, its directory not made.
        assert!(!d.path().join("snap").exists());
        let report = p.close(&ShutdownStatus::default());
        assert!(report.is_complete() && report.written.is_empty());
    }

    #[test]
    fn a_held_provider_is_refused_naming_it_its_lock_and_its_holder() {
        let d = tempfile::tempdir().unwrap();
        let c = config(d.path(), &memory(d.path()), "  session_storage: mem\n");
        let first = Providers::open(&c).unwrap();
        let err = Providers::open(&c).err().expect("refused");
        assert!(matches!(err, StartupError::Held { .. }), "{err}");
        let text = err.to_string();
        let lock = d.path().join("snap").join("saguin.lock");
        assert!(text.contains("storage provider mem"), "{text}");
        assert!(text.contains(&lock.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(first.close(&ShutdownStatus::default()));
        // Let go at close: it can be taken again.
        let again = Providers::open(&c).unwrap();
        assert!(again.close(&ShutdownStatus::default()).is_complete());
    }

    #[test]
    fn a_snapshot_that_cannot_be_written_makes_the_report_incomplete_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let c = config(d.path(), &memory(d.path()), "  session_storage: mem\n");
        let p = Providers::open(&c).unwrap();
        let snap = d.path().join("snap");
        std::fs::rename(&snap, d.path().join("moved")).unwrap();
        std::fs::write(&snap, b"x").unwrap();
        let report = p.close(&ShutdownStatus::default());
        assert!(!report.is_complete());
        assert!(
            report
                .failures
                .iter()
                .any(|f| f.contains(&snap.display().to_string())),
            "{:?}",
            report.failures
        );
    }

    #[test]
    fn the_status_names_every_file_still_being_written() {
        let status = ShutdownStatus::default();
        let observer = StatusObserver {
            status: &status,
            prefix: "storage provider mem: snapshot /s".into(),
            writing: Mutex::new(BTreeSet::new()),
        };
        observer.started("b.snapshot");
        observer.started("a.snapshot");
        assert_eq!(
            status.get(),
            "storage provider mem: snapshot /s: writing a.snapshot, b.snapshot"
        );
        observer.finished("a.snapshot");
        assert_eq!(
            status.get(),
            "storage provider mem: snapshot /s: writing b.snapshot"
        );
        observer.finished("b.snapshot");
        assert_eq!(
            status.get(),
            "storage provider mem: snapshot /s: between files"
        );
    }
}
