//! Writing a memory provider's files (`format/FORMAT.md` §2, §4): what a
//! generation ([`super::generation`]) writes, at a graceful shutdown and,
//! with background snapshots, while the broker serves.
//!
//! Two phases. [`copy_changed`] copies the state of every store that
//! changed since a given version of each: counters, positions and shared
//! handles on its records - no record is copied, so it costs a walk of
//! pointers, and it runs at the moment the generation is to hold.
//! [`write_files`] runs after, off the broker's loop: it encodes each file
//! in format 21 and writes it.
//!
//! Each file is written to `<name>.tmp` in the same directory (a rename is
//! atomic only within one filesystem), made durable before the rename (so
//! a power cut cannot leave the new name over bytes still in the page
//! cache), and renamed to its generation's name, which no earlier
//! generation used: no file another generation lists is ever written over.
//! A generation's channels and retained store are made durable together,
//! by one sync of their file system where the kernel reports a failed
//! write-back through it ([`Durability`]): one flush of the disk rather
//! than one a file, which is what a generation of thousands of small
//! files spent its time on. The broadcast log and the sessions are one
//! pair: both are written or neither is.
//!
//! Every file of one generation is stamped with the generation's moment as
//! its written-at time, the same value its manifest holds. Files are
//! written a few at a time ([`SnapshotOptions::parallel_files`], 4 by
//! default) so fifteen channels are not fifteen concurrent writes on an
//! edge box, and every failure is reported, not only the first. The
//! directory is created 0700 and every file 0600: they hold whatever the
//! applications published.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use saguin_format::channel_name::{
    encode_file_name, generation_file_name, temp_file_name, BROADCAST_FILE, RETAINED_CHANNEL,
    RETAINED_FILE, SESSIONS_FILE,
};
use saguin_format::f21::{
    self, BroadcastFile, ChannelFile, DeadLetter, FileKind, GenerationFile,
    Position as FilePosition, SharedGroup,
};
use saguin_format::model::{ChannelKind, Record, UnixNanos};

use super::contract::{HeldPublish, Position, SessionEntry, ShareGroupEntry, BROADCAST_LOG_NAME};
use super::memory::{
    AppendCopy, BroadcastCopy, LatestCopy, MemChannelCopy, MemoryProvider, MetChannel, QueueCopy,
};
use super::spares::Spares;

/// What a snapshot writes besides the channels, and how.
#[derive(Clone, Debug)]
pub struct SnapshotOptions {
    /// Write the retained store's file (this provider is
    /// broker.retained_storage).
    pub retained: bool,
    /// Write the broadcast log and the sessions (this provider is
    /// broker.session_storage).
    pub sessions: bool,
    /// How many files are written at once.
    pub parallel_files: usize,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            retained: false,
            sessions: false,
            parallel_files: 4,
        }
    }
}

/// What one file of a generation holds: a channel (a queue with its
/// dead-letter channel), the retained store, or one of the sessions pair.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Store {
    Channel(String),
    Retained,
    Sessions,
    Broadcast,
}

impl Store {
    pub fn kind(&self) -> FileKind {
        match self {
            Store::Channel(_) => FileKind::Channel,
            Store::Retained => FileKind::Retained,
            Store::Sessions => FileKind::Sessions,
            Store::Broadcast => FileKind::Broadcast,
        }
    }

    /// The fixed name of its file (`format/FORMAT.md` §3, §4).
    pub fn base_name(&self) -> String {
        match self {
            Store::Channel(name) => encode_file_name(name),
            Store::Retained => RETAINED_FILE.to_owned(),
            Store::Sessions => SESSIONS_FILE.to_owned(),
            Store::Broadcast => BROADCAST_FILE.to_owned(),
        }
    }

    /// The store a manifest's entry is about.
    pub fn of_entry(entry: &GenerationFile) -> Store {
        match entry.kind {
            FileKind::Retained => Store::Retained,
            FileKind::Sessions => Store::Sessions,
            FileKind::Broadcast => Store::Broadcast,
            _ => Store::Channel(entry.channel.clone()),
        }
    }

    /// The channel name a manifest's entry gives it (empty but for a
    /// channel).
    pub(crate) fn channel(&self) -> String {
        match self {
            Store::Channel(name) => name.clone(),
            _ => String::new(),
        }
    }

    /// How the operator is told about it.
    pub fn describe(&self) -> String {
        match self {
            Store::Channel(name) => format!("channel {name}"),
            Store::Retained => "the retained store".to_owned(),
            Store::Sessions => "the sessions".to_owned(),
            Store::Broadcast => "the broadcast log".to_owned(),
        }
    }
}

/// One channel's state as copied.
#[derive(Clone, Debug)]
pub enum ChannelCopy {
    Append {
        copy: AppendCopy,
        held: Vec<HeldPublish>,
    },
    Latest {
        copy: LatestCopy,
        held: Vec<HeldPublish>,
    },
    Queue {
        copy: QueueCopy,
        /// Durable consumers' positions in the queue itself: the memory
        /// provider keeps none; a migration carries what its source holds.
        positions: Vec<Position>,
        dead_letter: AppendCopy,
        held: Vec<HeldPublish>,
    },
}

impl ChannelCopy {
    pub fn name(&self) -> &str {
        match self {
            ChannelCopy::Append { copy, .. } => &copy.name,
            ChannelCopy::Latest { copy, .. } => &copy.name,
            ChannelCopy::Queue { copy, .. } => &copy.name,
        }
    }

    pub fn kind(&self) -> ChannelKind {
        match self {
            ChannelCopy::Append { .. } => ChannelKind::Append,
            ChannelCopy::Latest { .. } => ChannelKind::Latest,
            ChannelCopy::Queue { .. } => ChannelKind::Queue,
        }
    }

    /// The version of the store the copy was made at (a queue's counts its
    /// dead-letter channel's changes too).
    pub fn version(&self) -> u64 {
        match self {
            ChannelCopy::Append { copy, .. } => copy.version,
            ChannelCopy::Latest { copy, .. } => copy.version,
            ChannelCopy::Queue { copy, .. } => copy.version,
        }
    }

    /// Records (or items) the copy holds.
    pub fn record_count(&self) -> usize {
        match self {
            ChannelCopy::Append { copy, .. } => copy.records.len(),
            ChannelCopy::Latest { copy, .. } => copy.records.len(),
            ChannelCopy::Queue {
                copy, dead_letter, ..
            } => copy.items.len() + dead_letter.records.len(),
        }
    }
}

/// The sessions and the broadcast log as copied together: the sessions,
/// the log (whose `version` is the pair's), and the log's held publishes.
pub type SessionsCopy = (Vec<Arc<SessionEntry>>, BroadcastCopy, Vec<HeldPublish>);

/// Everything phase one copied: what phase two writes.
#[derive(Clone, Debug)]
pub struct ProviderCopy {
    /// The moment the copy holds; every file written from it is stamped
    /// with it.
    pub captured_at: UnixNanos,
    /// Channels in name order.
    pub channels: Vec<ChannelCopy>,
    pub retained: Option<LatestCopy>,
    pub sessions: Option<SessionsCopy>,
}

impl ProviderCopy {
    /// True when it holds no store at all.
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty() && self.retained.is_none() && self.sessions.is_none()
    }

    /// The retained store and the sessions pair's files, where copied,
    /// with the version each was copied at (a channel's is its copy's,
    /// [`ChannelCopy::version`]).
    pub fn fixed_versions(&self) -> Vec<(Store, u64)> {
        let mut out = Vec::new();
        if let Some(r) = &self.retained {
            out.push((Store::Retained, r.version));
        }
        if let Some((_, log, _)) = &self.sessions {
            out.push((Store::Broadcast, log.version));
            out.push((Store::Sessions, log.version));
        }
        out
    }
}

/// Copies the provider's whole state (every store, whatever its version).
pub fn copy_provider(
    provider: &MemoryProvider,
    options: &SnapshotOptions,
    captured_at: UnixNanos,
) -> ProviderCopy {
    copy_changed(provider, options, captured_at, &HashMap::new(), &mut |_| {
        Some(0)
    })
}

/// The versions of the stores of `provider` other than its channels that
/// a snapshot with `options` writes: the retained store's, and the
/// sessions pair's under both of its files. (A channel's is met walking
/// the provider's channels, [`MemoryProvider::meet_channels`].)
pub fn fixed_store_versions(
    provider: &MemoryProvider,
    options: &SnapshotOptions,
) -> Vec<(Store, u64)> {
    let mut out = Vec::new();
    if options.retained {
        out.push((Store::Retained, provider.retained_store().version()));
    }
    if options.sessions {
        let pair = provider.broadcast().version();
        out.push((Store::Broadcast, pair));
        out.push((Store::Sessions, pair));
    }
    out
}

/// Copies every channel `channel_from` chooses as the walk over the
/// provider's channels meets it, and the retained store and the sessions
/// pair where their version is not the one `since` gives them (or `since`
/// names them not). Cheap (shared record handles, counters and
/// positions), and made under the holds' lock, so no release moves a
/// record between a hold and its channel while the two are copied. An
/// append channel `channel_from` answers `Some(from)` for is copied from
/// offset `from` only (0: whole): the caller holds its earlier records
/// from a copy before.
pub fn copy_changed(
    provider: &MemoryProvider,
    options: &SnapshotOptions,
    captured_at: UnixNanos,
    since: &HashMap<Store, u64>,
    channel_from: &mut dyn FnMut(MetChannel<'_>) -> Option<u64>,
) -> ProviderCopy {
    let changed = |store: Store, version: u64| since.get(&store) != Some(&version);
    provider.held().with_holds(|holds| {
        let held_for = |channel: &str| -> Vec<HeldPublish> {
            holds
                .iter()
                .filter(|h| h.channel == channel)
                .cloned()
                .collect()
        };
        let channels = provider
            .copy_channels_where(channel_from)
            .into_iter()
            .map(|c| match c {
                MemChannelCopy::Append(copy) => ChannelCopy::Append {
                    held: held_for(&copy.name),
                    copy,
                },
                MemChannelCopy::Latest(copy) => ChannelCopy::Latest {
                    held: held_for(&copy.name),
                    copy,
                },
                MemChannelCopy::Queue(copy, dead_letter) => ChannelCopy::Queue {
                    held: held_for(&copy.name),
                    positions: Vec::new(),
                    copy,
                    dead_letter,
                },
            })
            .collect();
        let retained = provider.retained_store();
        let retained = (options.retained && changed(Store::Retained, retained.version()))
            .then(|| retained.copy_state());
        let log = provider.broadcast();
        let pair_version = log.version();
        let sessions = (options.sessions && changed(Store::Sessions, pair_version)).then(|| {
            // The version first, then the sessions, then the log: the copy
            // holds at least every change the version counts.
            let sessions = provider.session_store().shared_sessions();
            (
                sessions,
                log.copy_at(pair_version),
                held_for(BROADCAST_LOG_NAME),
            )
        });
        ProviderCopy {
            captured_at,
            channels,
            retained,
            sessions,
        }
    })
}

/// One file a snapshot wrote.
#[derive(Clone, Debug)]
pub struct WrittenFile {
    pub file_name: String,
    /// The channel (or store) it holds.
    pub name: String,
    pub bytes: u64,
    pub records: usize,
    /// Its trailing CRC32C, which its generation's manifest states.
    pub checksum: u32,
}

/// One file a snapshot could not write; its store's previous file stands.
#[derive(Debug)]
pub struct FailedFile {
    pub file_name: String,
    pub name: String,
    pub path: PathBuf,
    pub error: std::io::Error,
}

impl std::fmt::Display for FailedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "snapshot {}: {} was not written, its last snapshot stands: {}",
            self.path.display(),
            self.name,
            self.error
        )
    }
}

/// What a snapshot wrote and what it could not.
#[derive(Debug, Default)]
pub struct WriteReport {
    pub written: Vec<WrittenFile>,
    pub failed: Vec<FailedFile>,
    /// The generation the directory holds once it is done, when its
    /// manifest landed.
    pub generation: Option<u64>,
}

impl WriteReport {
    pub fn is_complete(&self) -> bool {
        self.failed.is_empty()
    }
}

/// Told as each file of a snapshot starts and stops being written (from
/// the writing threads), so a long shutdown can say what it is still
/// writing.
pub trait WriteObserver: Sync {
    fn started(&self, file_name: &str);
    fn finished(&self, file_name: &str);
}

/// Nobody to tell.
pub struct Unobserved;

impl WriteObserver for Unobserved {
    fn started(&self, _: &str) {}
    fn finished(&self, _: &str) {}
}

/// What became of one store's file in [`write_files`].
#[derive(Debug)]
pub struct StoreFile {
    pub store: Store,
    /// The store's version the file holds.
    pub version: u64,
    pub result: Result<WrittenFile, FailedFile>,
}

/// How the files of a generation are made durable before each is renamed
/// to its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Every file written, then one sync of their file system (`syncfs`
    /// through the directory, opened before the first file was written):
    /// one flush of the disk for the generation rather than one for each
    /// file. Only where the kernel reports through it a write-back that
    /// failed since that opening (Linux 5.8 and later); a failure it
    /// reports cannot be told apart from another file's, so it fails every
    /// file of the generation, each leaving its store's previous file.
    FileSystem,
    /// Each file fsynced before it is renamed: one flush of the disk for
    /// each, and each failure its own file's.
    EachFile,
}

impl Durability {
    /// The one this kernel supports: [`Durability::FileSystem`] where a
    /// `syncfs` reports write-back failures.
    pub fn of_this_kernel() -> Durability {
        static KERNEL: std::sync::OnceLock<Durability> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(|| {
            let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            if cfg!(target_os = "linux") && syncfs_reports_failures(&release) {
                Durability::FileSystem
            } else {
                Durability::EachFile
            }
        })
    }
}

/// Whether a Linux kernel of `release` (`6.1.0-13-amd64`) reports a failed
/// write-back through `syncfs`: from 5.8.
fn syncfs_reports_failures(release: &str) -> bool {
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= (5, 8),
        _ => false,
    }
}

/// What [`write_files`] tells its observer while the generation's files
/// are made durable together.
fn to_the_disk(files: usize) -> String {
    format!("{files} files to the disk")
}

impl StoreFile {
    /// A file written unsynced, renamed to its name now that it is
    /// durable; a failed file as it is.
    fn put_in_place(self, dir: &Path) -> StoreFile {
        let Ok(written) = &self.result else {
            return self;
        };
        match put_in_place(dir, &written.file_name) {
            Ok(()) => self,
            Err(e) => self.failed(dir, e),
        }
    }

    /// A file written unsynced that will not be put in place: its
    /// temporary file removed, `error` its failure. A failed file as it
    /// is.
    fn failed(self, dir: &Path, error: std::io::Error) -> StoreFile {
        let Ok(written) = self.result else {
            return self;
        };
        let _ = fs::remove_file(dir.join(temp_file_name(&written.file_name)));
        StoreFile {
            result: Err(FailedFile {
                path: dir.join(&written.file_name),
                file_name: written.file_name,
                name: written.name,
                error,
            }),
            ..self
        }
    }
}

/// Writes every store of `copy` under generation `generation`'s names,
/// `parallel` files at a time (the channels and the retained store), then
/// the broadcast log and the sessions as one pair: both, or neither (a
/// pair the loader would refuse is not written at all). The channels and
/// the retained store are made durable as this kernel can
/// ([`Durability::of_this_kernel`]).
pub fn write_files(
    dir: &Path,
    copy: &ProviderCopy,
    generation: u64,
    parallel: usize,
    spares: &Spares,
    observer: &dyn WriteObserver,
) -> Vec<StoreFile> {
    write_files_with(
        dir,
        copy,
        generation,
        parallel,
        Durability::of_this_kernel(),
        spares,
        observer,
    )
}

/// [`write_files`] making the files durable by `durability`, each of the
/// channels' and the retained store's made from one of `spares` while
/// there are any.
pub fn write_files_with(
    dir: &Path,
    copy: &ProviderCopy,
    generation: u64,
    parallel: usize,
    durability: Durability,
    spares: &Spares,
    observer: &dyn WriteObserver,
) -> Vec<StoreFile> {
    let stamp = copy.captured_at;
    let jobs: Vec<Job<'_>> = copy
        .channels
        .iter()
        .map(Job::Channel)
        .chain(copy.retained.as_ref().map(Job::Retained))
        .collect();
    // Opened before any file is written: its sync reports every write-back
    // that failed from now on.
    let file_system = match durability {
        Durability::FileSystem if !jobs.is_empty() => Some(File::open(dir)),
        _ => None,
    };
    let sync_each = file_system.is_none();
    let mut results = in_parallel(&jobs, parallel, |job| {
        let file_name = job.file_name(generation);
        observer.started(&file_name);
        let outcome = job.write(dir, generation, stamp, sync_each, spares);
        observer.finished(&file_name);
        outcome
    });
    if let Some(file_system) = file_system {
        let waiting = results.iter().filter(|r| r.result.is_ok()).count();
        let label = to_the_disk(waiting);
        observer.started(&label);
        let synced = file_system.and_then(|d| sync_file_system(&d));
        observer.finished(&label);
        results = results
            .into_iter()
            .map(|file| match &synced {
                Ok(()) => file.put_in_place(dir),
                Err(e) => file.failed(
                    dir,
                    std::io::Error::new(
                        e.kind(),
                        format!("the sync of the generation's files failed: {e}"),
                    ),
                ),
            })
            .collect();
    }
    if let Some(pair) = &copy.sessions {
        results.extend(write_pair(dir, pair, generation, stamp, observer));
    }
    results
}

/// `each` of `items`, `parallel` at a time on threads of their own, the
/// answers in the items' order.
fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    parallel: usize,
    each: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let answers = Mutex::new(Vec::with_capacity(items.len()));
    let cursor = AtomicUsize::new(0);
    let workers = parallel.clamp(1, items.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = cursor.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let answer = each(item);
                super::memory::lock(&answers).push((i, answer));
            });
        }
    });
    let mut answers = answers.into_inner().unwrap_or_else(|e| e.into_inner());
    answers.sort_unstable_by_key(|(i, _)| *i);
    answers.into_iter().map(|(_, answer)| answer).collect()
}

/// Syncs the file system `dir` is on: every file written to it made
/// durable, and a write-back that failed since `dir` was opened reported.
fn sync_file_system(dir: &File) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: the descriptor is `dir`'s own and open; the call touches
        // no memory of ours.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        Err(std::io::Error::other("no syncfs on this system"))
    }
}

/// The broadcast log and the sessions that point into it, both or
/// neither.
fn write_pair(
    dir: &Path,
    (sessions, log, held): &SessionsCopy,
    generation: u64,
    stamp: UnixNanos,
    observer: &dyn WriteObserver,
) -> Vec<StoreFile> {
    let log_name = generation_file_name(BROADCAST_FILE, generation);
    let sessions_name = generation_file_name(SESSIONS_FILE, generation);
    // The log's fields and lists but its messages, which are written from
    // the store's own records as the file is encoded, as a channel's are:
    // a copy of every message owed, and a buffer the size of the file,
    // would double what the log holds at every generation. The store
    // checked each message as it was appended.
    let log_fields = broadcast_file_but_messages(log, held);
    // The sessions are checked and encoded as the store holds them, each
    // behind its handle: no copy of every session.
    let groups = shared_groups(&log.groups);
    let log_records = log.messages.len();
    let session_count = sessions.len();
    // A pair the loader would refuse is not written over the last good
    // one: a broker that cannot start is worse than one that starts from
    // the previous generation's sessions, and the failure is named.
    let loadable = f21::validate_pair_of(sessions, &groups, log.next)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            f21::validate_sessions_of(sessions, &groups)
                .map_err(|e| format!("{SESSIONS_FILE}: {e}"))
        })
        .and_then(|()| {
            f21::validate_broadcast_file(&log_fields).map_err(|e| format!("{BROADCAST_FILE}: {e}"))
        });
    let result = loadable
        .map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the sessions and their log would not load, so neither was written: {e}"),
            )
        })
        .and_then(|()| {
            observer.started(&log_name);
            let log_written = write_durable_with(dir, &log_name, |out| {
                stream::write_broadcast(out, &log_fields, &log.messages, held, stamp)
            });
            observer.finished(&log_name);
            let log_written = log_written?;
            let session_bytes = f21::encode_sessions_of(sessions, &groups, stamp);
            observer.started(&sessions_name);
            let sessions_written = write_durable(dir, &sessions_name, &session_bytes);
            observer.finished(&sessions_name);
            match sessions_written {
                Ok(()) => Ok((
                    log_written,
                    (session_bytes.len() as u64, trailer(&session_bytes)),
                )),
                Err(e) => {
                    // Half a pair is no pair.
                    let _ = fs::remove_file(dir.join(&log_name));
                    Err(e)
                }
            }
        });
    let version = log.version;
    match result {
        Ok(((log_len, log_crc), (sessions_len, sessions_crc))) => vec![
            StoreFile {
                store: Store::Broadcast,
                version,
                result: Ok(WrittenFile {
                    file_name: log_name,
                    name: BROADCAST_LOG_NAME.into(),
                    bytes: log_len,
                    records: log_records,
                    checksum: log_crc,
                }),
            },
            StoreFile {
                store: Store::Sessions,
                version,
                result: Ok(WrittenFile {
                    file_name: sessions_name,
                    name: "sessions".into(),
                    bytes: sessions_len,
                    records: session_count,
                    checksum: sessions_crc,
                }),
            },
        ],
        Err(error) => {
            let other = std::io::Error::new(error.kind(), error.to_string());
            vec![
                StoreFile {
                    store: Store::Broadcast,
                    version,
                    result: Err(FailedFile {
                        path: dir.join(&log_name),
                        file_name: log_name,
                        name: BROADCAST_LOG_NAME.into(),
                        error,
                    }),
                },
                StoreFile {
                    store: Store::Sessions,
                    version,
                    result: Err(FailedFile {
                        path: dir.join(&sessions_name),
                        file_name: sessions_name,
                        name: "sessions".into(),
                        error: other,
                    }),
                },
            ]
        }
    }
}

/// The trailing checksum of an encoded file.
fn trailer(bytes: &[u8]) -> u32 {
    let end = bytes.len().saturating_sub(f21::TRAILER_LEN);
    bytes
        .get(end..)
        .and_then(|t| <[u8; 4]>::try_from(t).ok())
        .map_or(0, u32::from_le_bytes)
}

enum Job<'a> {
    Channel(&'a ChannelCopy),
    Retained(&'a LatestCopy),
}

impl Job<'_> {
    fn store(&self) -> Store {
        match self {
            Job::Channel(c) => Store::Channel(c.name().to_owned()),
            Job::Retained(_) => Store::Retained,
        }
    }

    fn file_name(&self, generation: u64) -> String {
        generation_file_name(&self.store().base_name(), generation)
    }

    /// Writes the store's file: under its name, synced, when `sync`;
    /// otherwise left unsynced under its temporary name, for
    /// [`StoreFile::put_in_place`] once the file system is synced.
    fn write(
        &self,
        dir: &Path,
        generation: u64,
        stamp: UnixNanos,
        sync: bool,
        spares: &Spares,
    ) -> StoreFile {
        let store = self.store();
        let file_name = self.file_name(generation);
        let (name, records, version) = match self {
            Job::Channel(c) => (c.name().to_owned(), c.record_count(), c.version()),
            Job::Retained(r) => (RETAINED_CHANNEL.to_owned(), r.records.len(), r.version),
        };
        let outcome = match self {
            // A copy of only the records since an earlier one is made
            // whole before it is written (`Generations::write`); written as
            // it is, it would lose the records before them.
            Job::Channel(ChannelCopy::Append { copy, .. }) if copy.from != 0 => {
                Err(std::io::Error::other(
                    "the copy holds only the records since the last capture and was not completed",
                ))
            }
            // A channel file is encoded straight from the shared records
            // into the file (a latest channel's rebuilt one at a time from
            // what its store keeps): no copy of every record, no buffer
            // the size of the file, and the kernel writes back the first
            // pages while the last are still being encoded.
            Job::Channel(c) => write_file_with(dir, &file_name, sync, spares, |out| {
                stream::write_channel(out, c, stamp)
            }),
            Job::Retained(r) => write_file_with(dir, &file_name, sync, spares, |out| {
                stream::write_retained(out, r, stamp)
            }),
        };
        let result = match outcome {
            Ok((bytes, checksum)) => Ok(WrittenFile {
                file_name,
                name,
                bytes,
                records,
                checksum,
            }),
            Err(error) => Err(FailedFile {
                path: dir.join(&file_name),
                file_name,
                name,
                error,
            }),
        };
        StoreFile {
            store,
            version,
            result,
        }
    }
}

fn file_positions(positions: &[Position]) -> Vec<FilePosition> {
    positions
        .iter()
        .map(|p| FilePosition {
            reader: p.reader.to_string(),
            offset: p.offset,
            saved_at: p.saved_at,
            session_expiry: p.session_expiry,
        })
        .collect()
}

fn file_held(held: &[HeldPublish]) -> Vec<f21::HeldPublish> {
    held.iter()
        .map(|h| f21::HeldPublish {
            client_id: h.client_id.clone(),
            packet_id: h.packet_id,
            held_at: h.held_at,
            record: Record {
                offset: 0,
                ..h.record.clone()
            },
        })
        .collect()
}

/// The format 21 channel file of a copy.
pub fn channel_file(c: &ChannelCopy) -> ChannelFile {
    match c {
        ChannelCopy::Append { copy, held } => ChannelFile {
            name: copy.name.clone(),
            kind: ChannelKind::Append,
            next: copy.next,
            floor: copy.floor,
            bytes: copy.bytes,
            records: copy.records.to_vec(),
            items: Vec::new(),
            positions: file_positions(&copy.positions),
            held: file_held(held),
            dead_letter: None,
        },
        ChannelCopy::Latest { copy, held } => ChannelFile {
            name: copy.name.clone(),
            kind: ChannelKind::Latest,
            next: copy.next,
            floor: copy.floor,
            bytes: copy.bytes,
            records: copy.records.to_vec(),
            items: Vec::new(),
            positions: file_positions(&copy.positions),
            held: file_held(held),
            dead_letter: None,
        },
        ChannelCopy::Queue {
            copy,
            positions,
            dead_letter,
            held,
        } => ChannelFile {
            name: copy.name.clone(),
            kind: ChannelKind::Queue,
            next: copy.next,
            floor: copy.floor,
            bytes: copy.bytes,
            records: Vec::new(),
            items: copy
                .items
                .iter()
                .map(|(record, attempts, first, last)| f21::QueueItem {
                    record: record.record(),
                    attempts: *attempts,
                    first_delivered: *first,
                    last_delivered: *last,
                })
                .collect(),
            positions: file_positions(positions),
            held: file_held(held),
            dead_letter: Some(DeadLetter {
                name: dead_letter.name.clone(),
                next: dead_letter.next,
                floor: dead_letter.floor,
                bytes: dead_letter.bytes,
                records: dead_letter.records.to_vec(),
                positions: file_positions(&dead_letter.positions),
            }),
        },
    }
}

/// The broadcast log's file as [`stream::write_broadcast`] writes it, with
/// no messages.
fn broadcast_file_but_messages(log: &BroadcastCopy, held: &[HeldPublish]) -> BroadcastFile {
    BroadcastFile {
        next: log.next,
        floor: log.floor,
        bytes: log.bytes,
        messages: Vec::new(),
        cursors: log
            .cursors
            .iter()
            .map(|(client, offset, saved_at)| FilePosition {
                reader: format!("{}{client}", f21::READER_MQTT),
                offset: *offset,
                saved_at: *saved_at,
                session_expiry: None,
            })
            .collect(),
        held: file_held(held),
    }
}

/// The shared subscription groups' cursors as the sessions file keeps them.
fn shared_groups(groups: &[ShareGroupEntry]) -> Vec<SharedGroup> {
    groups
        .iter()
        .map(|g| SharedGroup {
            key: g.key.clone(),
            cursor: g.cursor,
            returned: g.returned.clone(),
        })
        .collect()
}

/// Creates the snapshot directory 0700 when it does not exist (a sqlite
/// provider's database directory too, and any directory above either).
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(std::io::Error::other(format!(
            "{} exists and is not a directory",
            dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir),
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to `dir/name` crash-safely: a temporary name in the same
/// directory, created 0600, written whole, fsynced, then renamed over the
/// old file. The caller syncs the directory. On failure the temporary file
/// is removed and the old file is untouched.
pub fn write_durable(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    write_durable_with(dir, name, |out| {
        out.write_all(bytes)?;
        Ok(bytes.len() as u64)
    })
    .map(|_| ())
}

/// [`write_durable`] with the contents produced by `fill`, whose answer
/// (how many bytes it wrote, say) is returned once the file is in place.
pub fn write_durable_with<T>(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut WritebackFile) -> std::io::Result<T>,
) -> std::io::Result<T> {
    write_file_with(dir, name, true, &Spares::none(), fill)
}

/// Writes `dir/name`'s temporary file with `fill`, made from one of
/// `spares` if there is one (written over and cut to its own length);
/// when `sync`, fsyncs it and renames it to `name` too. On failure the
/// temporary file is removed.
fn write_file_with<T>(
    dir: &Path,
    name: &str,
    sync: bool,
    spares: &Spares,
    fill: impl FnOnce(&mut WritebackFile) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let tmp = dir.join(temp_file_name(name));
    let spare = spares.take(dir, &tmp);
    let result = (|| {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(!spare)
            .mode(0o600)
            .open(&tmp)?;
        let mut out = WritebackFile::new(f);
        let written = fill(&mut out)?;
        if spare {
            // What is left of the file the spare was, past this one's end.
            out.file.set_len(out.written)?;
        }
        if sync {
            out.into_inner().sync_all()?;
        }
        Ok(written)
    })();
    match result {
        Ok(written) if sync => put_in_place(dir, name).map(|()| written),
        Ok(written) => Ok(written),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Renames `dir/name`'s temporary file, durable, to `name`; on failure it
/// is removed.
fn put_in_place(dir: &Path, name: &str) -> std::io::Result<()> {
    let tmp = dir.join(temp_file_name(name));
    fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// How much is written before the kernel is asked to start writing it back.
const WRITEBACK_STEP: u64 = 8 * 1024 * 1024;

/// A file being written from start to end that asks the kernel to start
/// writing back every [`WRITEBACK_STEP`] bytes as they are handed over
/// (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`, which does not wait), so
/// the disk works while the rest is still being encoded and the closing
/// fsync waits for the tail rather than the whole file. It is only a hint:
/// durability still comes from that fsync, which reports any write error.
pub struct WritebackFile {
    file: File,
    written: u64,
    started: u64,
}

impl WritebackFile {
    fn new(file: File) -> WritebackFile {
        WritebackFile {
            file,
            written: 0,
            started: 0,
        }
    }

    fn into_inner(self) -> File {
        self.file
    }

    fn start_writeback(&mut self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let (Ok(offset), Ok(len)) = (
                i64::try_from(self.started),
                i64::try_from(self.written - self.started),
            ) else {
                return;
            };
            // SAFETY: the descriptor is this open file's own; the call only
            // schedules writeback of a range and touches no memory of ours.
            // Its result is ignored on purpose: the fsync that follows the
            // whole write is what reports an I/O error.
            unsafe {
                libc::sync_file_range(
                    self.file.as_raw_fd(),
                    offset,
                    len,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
        }
        self.started = self.written;
    }
}

impl Write for WritebackFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= WRITEBACK_STEP {
            self.start_writeback();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// fsyncs a directory, making the renames in it durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A format 21 channel file written straight from a [`ChannelCopy`]: the
/// byte layout of `saguin_format::f21` (FORMAT.md §2), produced from
/// borrowed records and checksummed as it goes. The test
/// `streamed_files_are_the_codecs_bytes` holds it to the codec's own
/// encoder byte for byte, for every channel kind.
mod stream {
    use std::io::{self, Write};

    use saguin_format::f21::{self, FileKind};
    use saguin_format::model::{ChannelKind, UnixNanos};

    use super::ChannelCopy;
    use crate::storage::contract::{HeldPublish, Position, RecordParts};
    use crate::storage::kept::Kept;
    use crate::storage::memory::LatestCopy;

    /// Bytes gathered before each write and checksum update.
    const CHUNK: usize = 256 * 1024;

    struct Encoder<'w, W: Write> {
        out: &'w mut W,
        buf: Vec<u8>,
        crc: u32,
        written: u64,
    }

    impl<W: Write> Encoder<'_, W> {
        fn flush_chunk(&mut self) -> io::Result<()> {
            self.crc = crc32c::crc32c_append(self.crc, &self.buf);
            self.out.write_all(&self.buf)?;
            self.written += self.buf.len() as u64;
            self.buf.clear();
            Ok(())
        }

        fn maybe_flush(&mut self) -> io::Result<()> {
            if self.buf.len() >= CHUNK {
                self.flush_chunk()?;
            }
            Ok(())
        }

        /// The trailer written; the file's length and checksum.
        fn finish(mut self) -> io::Result<(u64, u32)> {
            self.flush_chunk()?;
            let crc = self.crc.to_le_bytes();
            self.out.write_all(&crc)?;
            Ok((self.written + crc.len() as u64, self.crc))
        }

        fn u8(&mut self, v: u8) {
            self.buf.push(v);
        }
        fn bool(&mut self, v: bool) {
            self.buf.push(u8::from(v));
        }
        fn u16(&mut self, v: u16) {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
        fn u32(&mut self, v: u32) {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
        fn u64(&mut self, v: u64) {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
        fn i64(&mut self, v: i64) {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
        fn len(&mut self, n: usize) -> io::Result<()> {
            let n = u32::try_from(n).map_err(|_| {
                io::Error::other("a count or length does not fit the format's 32 bits")
            })?;
            self.u32(n);
            Ok(())
        }
        fn bytes(&mut self, v: &[u8]) -> io::Result<()> {
            self.len(v.len())?;
            self.buf.extend_from_slice(v);
            Ok(())
        }
        fn str(&mut self, v: &str) -> io::Result<()> {
            self.bytes(v.as_bytes())
        }
        fn opt_str(&mut self, v: Option<&str>) -> io::Result<()> {
            match v {
                None => self.u8(0),
                Some(s) => {
                    self.u8(1);
                    self.str(s)?;
                }
            }
            Ok(())
        }
        fn opt_bytes(&mut self, v: Option<&[u8]>) -> io::Result<()> {
            match v {
                None => self.u8(0),
                Some(s) => {
                    self.u8(1);
                    self.bytes(s)?;
                }
            }
            Ok(())
        }
        fn opt_u8(&mut self, v: Option<u8>) {
            match v {
                None => self.u8(0),
                Some(x) => {
                    self.u8(1);
                    self.u8(x);
                }
            }
        }
        fn opt_u32(&mut self, v: Option<u32>) {
            match v {
                None => self.u8(0),
                Some(x) => {
                    self.u8(1);
                    self.u32(x);
                }
            }
        }

        fn record(&mut self, r: RecordParts<'_>) -> io::Result<()> {
            self.u64(r.offset);
            self.buf.extend_from_slice(r.message_id);
            self.i64(r.timestamp);
            self.u8(r.qos);
            self.bool(r.retain);
            self.bool(r.shared_copy);
            self.str(r.topic)?;
            self.str(r.client_id)?;
            self.opt_str(r.bridge)?;
            self.opt_str(r.owed_to)?;
            self.len(r.user_properties.len())?;
            for p in r.user_properties {
                self.str(&p.name)?;
                self.str(&p.value)?;
            }
            let p = r.props;
            self.opt_str(p.content_type.as_deref())?;
            self.opt_str(p.response_topic.as_deref())?;
            self.opt_bytes(p.correlation_data.as_deref())?;
            self.opt_u8(p.payload_format_indicator);
            self.opt_u32(p.message_expiry_interval);
            self.bytes(r.payload)?;
            self.maybe_flush()
        }

        /// Records lent by a copy, part by part.
        fn records<'r>(
            &mut self,
            count: usize,
            records: impl Iterator<Item = RecordParts<'r>>,
        ) -> io::Result<()> {
            self.len(count)?;
            for r in records {
                self.record(r)?;
            }
            Ok(())
        }

        fn positions(&mut self, positions: &[Position]) -> io::Result<()> {
            self.len(positions.len())?;
            for p in positions {
                self.str(&p.reader.to_string())?;
                self.u64(p.offset);
                self.i64(p.saved_at);
                self.opt_u32(p.session_expiry);
            }
            Ok(())
        }

        fn held(&mut self, held: &[HeldPublish]) -> io::Result<()> {
            self.len(held.len())?;
            for h in held {
                self.str(&h.client_id)?;
                self.u16(h.packet_id);
                self.i64(h.held_at);
                // A held publish takes its offset at its release.
                self.record(RecordParts {
                    offset: 0,
                    ..(&h.record).into()
                })?;
            }
            Ok(())
        }
    }

    fn kind_byte(kind: ChannelKind) -> u8 {
        match kind {
            ChannelKind::Append => 0,
            ChannelKind::Latest => 1,
            ChannelKind::Queue => 2,
        }
    }

    impl<'w, W: Write> Encoder<'w, W> {
        /// An encoder whose file begins with the header of a `kind` file
        /// stamped `stamp`.
        fn begin(out: &'w mut W, kind: FileKind, stamp: UnixNanos) -> Self {
            let mut e = Encoder {
                out,
                buf: Vec::with_capacity(CHUNK + 64 * 1024),
                crc: 0,
                written: 0,
            };
            e.buf
                .extend_from_slice(&f21::header(kind, saguin_format::REVISION, stamp));
            e
        }
    }

    /// Writes the retained store's copy as a whole format 21 retained file,
    /// stamped `stamp`: its values in topic order with the offsets the
    /// store holds (FORMAT.md §2.6), each rebuilt as it is written. Returns
    /// the file's length and its trailing checksum.
    pub fn write_retained<W: Write>(
        out: &mut W,
        copy: &LatestCopy,
        stamp: UnixNanos,
    ) -> io::Result<(u64, u32)> {
        let mut e = Encoder::begin(out, FileKind::Retained, stamp);
        e.records(copy.records.len(), copy.records.parts_by_topic())?;
        e.finish()
    }

    /// Writes a whole format 21 broadcast file, stamped `stamp`: the
    /// fields and cursors of `fields` (the file as checked, its messages
    /// left out), then `messages` encoded from the store's records one at
    /// a time, and its QoS 2 holds `held`. Returns the file's length and
    /// its trailing checksum.
    pub fn write_broadcast<W: Write>(
        out: &mut W,
        fields: &f21::BroadcastFile,
        messages: &[Kept],
        held: &[HeldPublish],
        stamp: UnixNanos,
    ) -> io::Result<(u64, u32)> {
        let mut e = Encoder::begin(out, FileKind::Broadcast, stamp);
        e.u64(fields.next);
        e.u64(fields.floor);
        e.u64(fields.bytes);
        e.records(messages.len(), messages.iter().map(|m| m.parts()))?;
        e.len(fields.cursors.len())?;
        for p in &fields.cursors {
            e.str(&p.reader)?;
            e.u64(p.offset);
            e.i64(p.saved_at);
            e.opt_u32(p.session_expiry);
        }
        e.held(held)?;
        e.finish()
    }

    /// Writes `c` as a whole format 21 channel file, stamped `stamp`.
    /// Returns the file's length and its trailing checksum.
    pub fn write_channel<W: Write>(
        out: &mut W,
        c: &ChannelCopy,
        stamp: UnixNanos,
    ) -> io::Result<(u64, u32)> {
        let mut e = Encoder::begin(out, FileKind::Channel, stamp);

        let (name, next, floor, bytes) = match c {
            ChannelCopy::Append { copy, .. } => (&copy.name, copy.next, copy.floor, copy.bytes),
            ChannelCopy::Latest { copy, .. } => (&copy.name, copy.next, copy.floor, copy.bytes),
            ChannelCopy::Queue { copy, .. } => (&copy.name, copy.next, copy.floor, copy.bytes),
        };
        e.str(name)?;
        e.u8(kind_byte(c.kind()));
        e.u64(next);
        e.u64(floor);
        e.u64(bytes);
        match c {
            ChannelCopy::Append { copy, held } => {
                e.records(copy.records.len(), copy.records.parts())?;
                e.len(0)?; // items
                e.positions(&copy.positions)?;
                e.held(held)?;
                e.u8(0); // no dead-letter channel
            }
            ChannelCopy::Latest { copy, held } => {
                e.records(copy.records.len(), copy.records.parts())?;
                e.len(0)?;
                e.positions(&copy.positions)?;
                e.held(held)?;
                e.u8(0);
            }
            ChannelCopy::Queue {
                copy,
                positions,
                dead_letter,
                held,
            } => {
                e.len(0)?; // records
                e.len(copy.items.len())?;
                for (record, attempts, first, last) in &copy.items {
                    e.record(record.parts())?;
                    e.u32(*attempts);
                    e.i64(*first);
                    e.i64(*last);
                }
                e.positions(positions)?;
                e.held(held)?;
                e.u8(1);
                e.str(&dead_letter.name)?;
                e.u64(dead_letter.next);
                e.u64(dead_letter.floor);
                e.u64(dead_letter.bytes);
                e.records(dead_letter.records.len(), dead_letter.records.parts())?;
                e.positions(&dead_letter.positions)?;
            }
        }
        e.finish()
    }
}

#[cfg(test)]
mod tests {

    use std::sync::Arc;

    use super::*;
    use crate::storage::contract::Provider;
    use crate::storage::memory::lock;
    use saguin_format::f21::SnapshotFile;

    #[test]
    fn syncfs_reports_failures_from_linux_5_8() {
        for (release, reports) in [
            ("6.18.44-fc-v1300", true),
            ("5.8.0", true),
            ("5.10.0-28-arm64", true),
            ("5.7.19", false),
            ("4.19.0-rpi", false),
            ("5", false),
            ("", false),
            ("linux", false),
        ] {
            assert_eq!(syncfs_reports_failures(release), reports, "{release}");
        }
    }

    /// Tells which files started and finished, in order.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);

    impl WriteObserver for Recorded {
        fn started(&self, file_name: &str) {
            lock(&self.0).push(format!("started {file_name}"));
        }
        fn finished(&self, file_name: &str) {
            lock(&self.0).push(format!("finished {file_name}"));
        }
    }

    /// A directory's files and their bytes.
    fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().into_string().unwrap(),
                    fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_generation_synced_at_once_writes_the_files_each_synced_does() {
        let p = MemoryProvider::unbounded();
        for c in 0..12 {
            let store = p
                .open_channel(&format!("c{c}"), ChannelKind::Append)
                .unwrap();
            for i in 0..=c {
                store
                    .as_append()
                    .unwrap()
                    .append(Record::new(format!("t/{c}"), format!("{i}")))
                    .unwrap();
            }
        }
        let options = SnapshotOptions {
            retained: true,
            ..SnapshotOptions::default()
        };
        let copy = copy_provider(&p, &options, 77);
        let at_once = tempfile::tempdir().unwrap();
        let each = tempfile::tempdir().unwrap();
        let observer = Recorded::default();
        let written = write_files_with(
            at_once.path(),
            &copy,
            3,
            4,
            Durability::FileSystem,
            &Spares::none(),
            &observer,
        );
        let written_each = write_files_with(
            each.path(),
            &copy,
            3,
            4,
            Durability::EachFile,
            &Spares::none(),
            &Unobserved,
        );
        assert_eq!(written.len(), 13, "twelve channels and the retained store");
        assert!(written
            .iter()
            .chain(&written_each)
            .all(|f| f.result.is_ok()));
        let (a, b) = (contents(at_once.path()), contents(each.path()));
        assert_eq!(a.len(), 13);
        assert!(a.iter().all(|(name, _)| !name.ends_with(".tmp")), "{a:?}");
        assert_eq!(a, b, "the same files, byte for byte");
        // Each file is told as it is written, and the sync after them all.
        let told = lock(&observer.0).clone();
        let label = to_the_disk(13);
        assert_eq!(told.len(), 2 * 13 + 2);
        assert_eq!(
            told[told.len() - 2..],
            [format!("started {label}"), format!("finished {label}")]
        );
    }

    #[test]
    fn a_file_left_unsynced_is_put_in_place_or_removed_with_its_failure() {
        let dir = tempfile::tempdir().unwrap();
        let unsynced = |name: &str| {
            write_file_with(dir.path(), name, false, &Spares::none(), |out| {
                out.write_all(b"bytes")
            })
            .unwrap();
            assert!(dir.path().join(temp_file_name(name)).exists());
            StoreFile {
                store: Store::Channel(name.into()),
                version: 1,
                result: Ok(WrittenFile {
                    file_name: name.into(),
                    name: name.into(),
                    bytes: 5,
                    records: 1,
                    checksum: 0,
                }),
            }
        };
        let placed = unsynced("a.1.snapshot").put_in_place(dir.path());
        assert!(placed.result.is_ok());
        assert_eq!(fs::read(dir.path().join("a.1.snapshot")).unwrap(), b"bytes");

        let failed = unsynced("b.1.snapshot").failed(dir.path(), std::io::Error::other("EIO"));
        let error = failed.result.unwrap_err();
        assert_eq!(
            (error.name.as_str(), error.error.to_string().as_str()),
            ("b.1.snapshot", "EIO")
        );
        assert!(!dir.path().join("b.1.snapshot").exists());

        // A temporary file gone before its rename fails its file.
        let lost = unsynced("c.1.snapshot");
        fs::remove_file(dir.path().join(temp_file_name("c.1.snapshot"))).unwrap();
        assert!(lost.put_in_place(dir.path()).result.is_err());
        assert_eq!(contents(dir.path()).len(), 1, "a.1.snapshot alone");
    }

    #[test]
    fn a_file_written_across_several_writeback_steps_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let pattern: Vec<u8> = (0..=250u8).collect();
        let total = (WRITEBACK_STEP as usize) * 2 + 12_345;
        let written = write_durable_with(dir.path(), "big.snapshot", |out| {
            let mut left = total;
            while left > 0 {
                let n = left.min(pattern.len());
                out.write_all(&pattern[..n])?;
                left -= n;
            }
            Ok(total as u64)
        })
        .unwrap();
        assert_eq!(written, total as u64);
        let back = std::fs::read(dir.path().join("big.snapshot")).unwrap();
        assert_eq!(back.len(), total);
        assert!(back.chunks(pattern.len()).all(|c| c == &pattern[..c.len()]));
        assert!(!dir.path().join(temp_file_name("big.snapshot")).exists());
    }

    fn provider() -> Arc<MemoryProvider> {
        MemoryProvider::unbounded()
    }

    #[test]
    fn streamed_files_are_the_codecs_bytes() {
        use crate::storage::contract::{HeldPublish, Position, Reader};
        use saguin_format::model::{PublishProps, UserProperty};

        let p = provider();
        let full = |topic: &str, payload: &str, qos: u8| {
            let mut r = Record::new(topic, payload.as_bytes().to_vec());
            r.message_id = [3; 16];
            r.timestamp = 1_234;
            r.qos = qos;
            r.retain = true;
            r.client_id = "client".into();
            r.bridge = Some("up".into());
            r.user_properties = vec![
                UserProperty {
                    name: "k".into(),
                    value: "v".into(),
                },
                UserProperty {
                    name: "k".into(),
                    value: "w".into(),
                },
            ];
            r.props = PublishProps {
                content_type: Some("text/plain".into()),
                response_topic: Some("reply".into()),
                correlation_data: Some(bytes::Bytes::from_static(b"\x00\x01")),
                payload_format_indicator: Some(1),
                message_expiry_interval: Some(60),
            }
            .into();
            r
        };
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        let a = a.as_append().unwrap();
        for i in 0..5 {
            a.append(full("a/x", &format!("{i}"), 1)).unwrap();
        }
        a.trim(3, None).unwrap();
        a.save_position(Position {
            reader: Reader::mqtt("c").unwrap(),
            offset: 4,
            saved_at: 9,
            session_expiry: Some(30),
        })
        .unwrap();
        a.save_position(Position {
            reader: Reader::bridge("b").unwrap(),
            offset: 3,
            saved_at: 9,
            session_expiry: None,
        })
        .unwrap();
        p.held_publishes()
            .unwrap()
            .hold(HeldPublish {
                channel: "a".into(),
                client_id: "c".into(),
                packet_id: 4,
                held_at: 8,
                record: full("a/q", "held", 2),
            })
            .unwrap();
        let l = p.open_channel("l", ChannelKind::Latest).unwrap();
        let l = l.as_latest().unwrap();
        l.set(full("l/1", "one", 0)).unwrap();
        l.set(full("l/2", "two", 0)).unwrap();
        l.delete("l/1").unwrap();
        let q = p.open_channel("q", ChannelKind::Queue).unwrap();
        let q = q.as_queue().unwrap();
        q.set_max_attempts(1);
        for i in 0..3 {
            q.enqueue(full("q", &format!("job{i}"), 1)).unwrap();
        }
        let lease = q.lease(2, "w", 10, 5).unwrap();
        q.release(lease.delivery_id, lease.epoch, 6, "nack")
            .unwrap();
        q.lease(3, "w", 10, 7).unwrap();

        let copy = copy_provider(&p, &SnapshotOptions::default(), 77);
        assert_eq!(copy.channels.len(), 3);
        for c in &copy.channels {
            let mut streamed = Vec::new();
            let (len, checksum) = stream::write_channel(&mut streamed, c, 77).unwrap();
            assert_eq!(len, streamed.len() as u64);
            assert_eq!(checksum, trailer(&streamed));
            let codec = f21::encode(&SnapshotFile::Channel(channel_file(c)), 77);
            assert_eq!(
                streamed,
                codec,
                "channel {} differs from the codec",
                c.name()
            );
            f21::decode(&streamed).unwrap();
        }
    }

    /// The broadcast log is streamed from the store's records, a released
    /// message's gap, a cursor and a QoS 2 hold with them: the codec's
    /// bytes for the whole file, which decode to it.
    #[test]
    fn the_broadcast_log_is_streamed_as_the_codecs_bytes() {
        use crate::storage::contract::{BroadcastLog, HeldPublishStore};

        let p = provider();
        let log = p.broadcast();
        for i in 0..5 {
            let mut r = Record::new(format!("t/{i}"), format!("message {i}").into_bytes());
            r.qos = 1;
            r.client_id = "publisher".into();
            if i == 3 {
                r.owed_to = Some("c1".into());
                r.props.message_expiry_interval = Some(60);
            }
            log.append(r).unwrap();
        }
        log.release(&[2]).unwrap();
        log.save_cursor("c1", 4).unwrap();
        p.held()
            .hold(HeldPublish {
                channel: BROADCAST_LOG_NAME.into(),
                client_id: "c2".into(),
                packet_id: 7,
                held_at: 5,
                record: Record {
                    qos: 2,
                    ..Record::new("t/held", "held")
                },
            })
            .unwrap();

        let options = SnapshotOptions {
            sessions: true,
            ..SnapshotOptions::default()
        };
        let copy = copy_provider(&p, &options, 77);
        let (_, log_copy, held) = copy.sessions.as_ref().unwrap();
        let mut streamed = Vec::new();
        let fields = broadcast_file_but_messages(log_copy, held);
        let (len, checksum) =
            stream::write_broadcast(&mut streamed, &fields, &log_copy.messages, held, 77).unwrap();
        assert_eq!(len, streamed.len() as u64);
        assert_eq!(checksum, trailer(&streamed));

        let whole = BroadcastFile {
            messages: log_copy.messages.iter().map(|m| m.record()).collect(),
            ..fields
        };
        assert_eq!(
            (whole.messages.len(), whole.cursors.len(), whole.held.len()),
            (4, 1, 1)
        );
        let codec = f21::encode(&SnapshotFile::Broadcast(whole.clone()), 77);
        assert_eq!(streamed, codec);
        let (_, SnapshotFile::Broadcast(back)) = f21::decode(&streamed).unwrap() else {
            panic!("not a broadcast file");
        };
        assert_eq!(back, whole);
    }

    /// The retained store is written in topic order, whatever order its
    /// values were set in, each with the offset the store holds, and the
    /// streamed file is the codec's bytes for those records.
    #[test]
    fn the_retained_store_is_streamed_in_topic_order() {
        use crate::storage::contract::LatestStore;
        use saguin_format::f21::RetainedFile;
        use saguin_format::model::PublishProps;

        let p = provider();
        let store = p.retained_store();
        for topic in ["t/9", "a/b/c", "t/10", "m"] {
            let mut r = Record::new(topic, format!("value of {topic}").into_bytes());
            r.qos = 1;
            r.retain = true;
            r.client_id = "publisher".into();
            store.set(r).unwrap();
        }
        let mut with_props = Record::new("t/5", "with properties");
        with_props.props = PublishProps {
            content_type: Some("text/plain".into()),
            ..PublishProps::default()
        }
        .into();
        store.set(with_props).unwrap();
        store.delete("m").unwrap();
        store.set(Record::new("t/9", "set again")).unwrap();

        let copy = store.copy_state();
        let mut streamed = Vec::new();
        let (len, checksum) = stream::write_retained(&mut streamed, &copy, 77).unwrap();
        assert_eq!(len, streamed.len() as u64);
        assert_eq!(checksum, trailer(&streamed));

        let mut expected = copy.records.to_vec();
        expected.sort_by(|a, b| a.topic.cmp(&b.topic));
        let codec = f21::encode(
            &SnapshotFile::Retained(RetainedFile {
                records: expected.clone(),
            }),
            77,
        );
        assert_eq!(streamed, codec);
        let (_, SnapshotFile::Retained(back)) = f21::decode(&streamed).unwrap() else {
            panic!("not a retained file");
        };
        let topics: Vec<&str> = back.records.iter().map(|r| r.topic.as_str()).collect();
        assert_eq!(topics, ["a/b/c", "t/10", "t/5", "t/9"]);
        let offsets: Vec<u64> = back.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [2, 3, 5, 7]);
        assert_eq!(back.records, expected);
    }
}
