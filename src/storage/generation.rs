//! A memory provider's snapshot directory as a sequence of generations
//! (`format/FORMAT.md` §4): what a memory provider promises at a crash,
//! `docs/design.md` storage rule 9.
//!
//! A generation is the provider's state at one moment: the files of the
//! stores that changed since the last generation, written under names no
//! earlier generation used, and a manifest (kind 6) listing every file the
//! generation is made of - the new ones and, for each store that did not
//! change, the file an earlier generation wrote. The manifest is written
//! last and put in place by one rename: that rename is the generation's
//! commit, so at every instant the directory holds one whole generation,
//! and a copy of it holds either one (every file the manifest lists, each
//! the very file listed) or names the file it lacks.
//!
//! This module keeps what the writer knows of the directory ([`Committed`]),
//! which stores changed since their files were written ([`Generations`]),
//! and writes one generation ([`write_generation`]): the changed files a few
//! at a time and made durable together, the directory synced, the
//! manifest, the directory synced again, then the files it no longer lists
//! removed (or kept as spares, [`super::spares`]). A file that fails
//! keeps its store's previous file in the manifest, marked `behind`, and the
//! store is written again at the next generation; a manifest that fails
//! leaves the previous generation current and every store to be written
//! again.
//!
//! The layers, each naming only those below it: the memory provider knows
//! nothing of files; [`super::snapshot_write`] copies its stores and
//! encodes and writes one file a store; this module decides which files
//! make a generation and commits them. [`write_snapshot`] writes a whole
//! copy as the next generation and [`save_snapshot`] copies and writes,
//! for callers that hold no broker loop.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use saguin_format::channel_name::{
    split_generation_file_name, temp_file_name, BROADCAST_FILE, MANIFEST_FILE, RETAINED_FILE,
    ROOM_FILE, SESSIONS_FILE, SNAPSHOT_SUFFIX, TEMP_SUFFIX,
};
use saguin_format::f21::{self, Generation, GenerationFile, SnapshotFile};
use saguin_format::model::UnixNanos;

use super::memory::{KnownChannel, MemoryProvider, MetChannel};
use super::snapshot_write::{
    self, copy_changed, copy_provider, fixed_store_versions, ChannelCopy, FailedFile, ProviderCopy,
    SnapshotOptions, Store, Unobserved, WriteObserver, WriteReport, WrittenFile,
};
use super::spares::Spares;

/// A data file's name read back: the store it holds and the generation
/// that wrote it (0 for a fixed name, written by a build before
/// generations), or `None` for any other name. A channel file whose name
/// is not a channel's canonical encoding is `Channel(None)`'s business of
/// the directory scan, not a store.
pub fn data_file(name: &str) -> Option<(Option<Store>, u64)> {
    let (base, generation) = match split_generation_file_name(name) {
        Some((base, generation)) => (base, generation),
        None => (name.to_owned(), 0),
    };
    let store = match base.as_str() {
        SESSIONS_FILE => Some(Store::Sessions),
        BROADCAST_FILE => Some(Store::Broadcast),
        RETAINED_FILE => Some(Store::Retained),
        _ if base.ends_with(SNAPSHOT_SUFFIX) => {
            return Some((
                saguin_format::channel_name::decode_file_name(&base).map(Store::Channel),
                generation,
            ))
        }
        _ => return None,
    };
    Some((store, generation))
}

/// What the writer knows of the directory: its current generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Committed {
    /// The manifest's generation; 0 when the directory holds no generation
    /// manifest (a first start, or files a build before generations wrote).
    pub generation: u64,
    /// The moment of the state the current generation holds; 0 with none.
    pub captured_at: UnixNanos,
    /// The file of each store, as a manifest lists it. Shared: a capture
    /// on the broker's loop takes the current generation as its base,
    /// and copying 10,000 entries there was most of a capture's time.
    pub files: Arc<BTreeMap<Store, GenerationFile>>,
    /// The highest generation any file in the directory is numbered with,
    /// committed or not: a new generation is numbered above it, so it never
    /// writes under the name of a file a crashed one left behind.
    pub highest: u64,
}

impl Committed {
    /// The number the next generation takes.
    pub fn next_generation(&self) -> u64 {
        self.generation.max(self.highest) + 1
    }

    /// The manifest of this generation.
    pub fn manifest(&self) -> Generation {
        Generation {
            generation: self.generation,
            captured_at: self.captured_at,
            files: self.files.values().cloned().collect(),
        }
    }
}

/// Reads what a file's manifest entry states about it without decoding
/// it: its length, its header's written-at and its trailing checksum.
pub fn file_identity(path: &Path) -> std::io::Result<(u64, UnixNanos, u32)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let length = file.metadata()?.len();
    let mut header = [0u8; f21::HEADER_LEN];
    file.read_exact(&mut header)?;
    let written_at = f21::read_header(&header)
        .map(|h| h.written_at)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut trailer = [0u8; f21::TRAILER_LEN];
    file.seek(SeekFrom::End(-(f21::TRAILER_LEN as i64)))?;
    file.read_exact(&mut trailer)?;
    Ok((length, written_at, u32::from_le_bytes(trailer)))
}

/// The directory's current generation as its manifest states it, for a
/// writer with no state of its own (a migration, a test writing twice): a
/// generation manifest's files; nothing for any other manifest or none.
/// The highest generation number of any file present is taken either way.
pub fn read_committed(dir: &Path) -> Committed {
    let mut committed = Committed::default();
    if let Ok(bytes) = super::read::read_bounded(&dir.join(MANIFEST_FILE), MANIFEST_READ_LIMIT) {
        if let Ok((_, SnapshotFile::Generation(g))) = f21::decode(&bytes) {
            committed.generation = g.generation;
            committed.captured_at = g.captured_at;
            committed.files = Arc::new(
                g.files
                    .into_iter()
                    .map(|f| (Store::of_entry(&f), f))
                    .collect(),
            );
        }
    }
    committed.highest = highest_generation(dir);
    committed
}

/// The largest manifest a reader of the directory takes: a few hundred
/// bytes a file, so this is room for a hundred thousand channels.
pub const MANIFEST_READ_LIMIT: u64 = 64 * 1024 * 1024;

/// The highest generation any data file in `dir` is numbered with (a
/// temporary file is not one: its name is truncated and written again).
pub fn highest_generation(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| data_file(name).is_some_and(|(store, _)| store.is_some()))
        .filter_map(|name| split_generation_file_name(&name).map(|(_, generation)| generation))
        .max()
        .unwrap_or(0)
}

/// Which stores changed since their files were written: a provider's
/// generations, kept by whoever writes them (the broker's background
/// snapshots and its shutdown share one).
#[derive(Debug)]
pub struct Generations {
    dir: PathBuf,
    options: SnapshotOptions,
    committed: Committed,
    /// The retained store's and the sessions pair's versions as of the
    /// files the current generation lists (or, once a capture is out, as
    /// the capture copied them); a channel's are in `channels`.
    captured: HashMap<Store, u64>,
    /// The same stores' versions as of their files in the current
    /// generation.
    written: HashMap<Store, u64>,
    /// What the generations know of each channel, in name order.
    channels: Vec<ChannelMark>,
    /// The room kept for the generation that finds the file system full
    /// ([`Generations::keep_room`]); `None` keeps none.
    room: Option<super::room::Room>,
    /// The name the room is held under in the log.
    name: String,
    /// The files replaced generations keep to make later ones' from.
    spares: Spares,
}

/// What the generations know of one of the provider's channels.
#[derive(Debug)]
struct ChannelMark {
    name: String,
    /// The channel itself. A capture walks the provider's channels and
    /// these marks side by side, both in name order, and knows each
    /// channel's mark by the channel rather than by hashing and comparing
    /// its name: for 10,000 changed channels, names hashed and compared
    /// twice were most of a capture's time on the broker's loop.
    channel: KnownChannel,
    /// Its version as of its file in the current generation; `None`
    /// where the generation lists none (or one behind).
    written: Option<u64>,
    /// As `written`, or, once a capture is out, as the capture copied it.
    captured: Option<u64>,
    /// An append channel's records as the last capture held them: the
    /// next capture copies only what was appended after (see
    /// [`Generations::write`]), so a capture costs the traffic since the
    /// last one, not the channel's length.
    held: Option<HeldRecords>,
}

/// An append channel's records as a capture held them.
#[derive(Debug, Default)]
struct HeldRecords {
    records: super::memory::KeptRecords,
    /// The channel's next offset then: the next capture copies from it.
    next: u64,
}

/// One generation to write: the changed stores' copies and the
/// generation they are written over.
#[derive(Debug)]
pub struct Job {
    pub copy: ProviderCopy,
    pub base: Committed,
    /// How many files are written at once.
    pub parallel_files: usize,
}

impl Job {
    /// How many stores it writes.
    pub fn stores(&self) -> usize {
        self.copy.channels.len()
            + usize::from(self.copy.retained.is_some())
            + 2 * usize::from(self.copy.sessions.is_some())
    }
}

/// What writing a job came to.
#[derive(Debug)]
pub struct Outcome {
    /// The generation now current, when its manifest landed.
    pub committed: Option<Committed>,
    /// Each store written, with the version its file holds.
    pub written: Vec<(Store, u64)>,
    /// Files written and files that failed, by name.
    pub report: WriteReport,
    /// How many files no manifest lists any more went: removed, or kept
    /// as spares.
    pub removed: usize,
    /// What of the room is allocated after it; `None` keeps none.
    pub room_kept: Option<u64>,
    /// A file found no room and the room was given up for the next
    /// generation to write into.
    pub room_given: bool,
}

impl Generations {
    /// The generations of `dir`, whose current generation is `committed`,
    /// for `provider` as it was just loaded from it: a store whose file the
    /// generation lists and the directory holds, not marked behind, is
    /// taken as written at the version it has now; any other (a store with
    /// no file yet, one whose listed file is gone, or one whose newer state
    /// a failed write lost) is written at the next generation.
    pub fn new(
        dir: &Path,
        options: SnapshotOptions,
        committed: Committed,
        provider: &MemoryProvider,
    ) -> Generations {
        let kept = |store: &Store| {
            committed
                .files
                .get(store)
                .is_some_and(|f| !f.behind && dir.join(&f.file_name).is_file())
        };
        let mut written = HashMap::new();
        for (store, version) in fixed_store_versions(provider, &options) {
            if kept(&store) {
                written.insert(store, version);
            }
        }
        // Met first, and each file looked for after: no file system call
        // under the provider's lock.
        let mut met = Vec::new();
        provider.meet_channels(|channel| {
            met.push((channel.name.to_owned(), channel.known(), channel.version()));
        });
        let channels = met
            .into_iter()
            .map(|(name, channel, version)| {
                let written = kept(&Store::Channel(name.clone())).then_some(version);
                ChannelMark {
                    name,
                    channel,
                    written,
                    captured: written,
                    held: None,
                }
            })
            .collect();
        Generations {
            dir: dir.to_path_buf(),
            options,
            captured: written.clone(),
            written,
            channels,
            committed,
            room: None,
            name: String::new(),
            spares: Spares::by_file_system(),
        }
    }

    /// These generations keeping the files they replace as spares, or
    /// not, whatever the directory's file system.
    pub fn keeping_spares(mut self, keep: bool) -> Generations {
        self.spares = Spares::kept(keep);
        self
    }

    /// Keeps `bytes` of room in the directory, in [`ROOM_FILE`], for the
    /// generation that finds the file system full (0 keeps none), the
    /// provider named `name` in what is logged of it. It is taken at the
    /// first generation written, off the broker's loop. A generation a
    /// file of which failed for want of room gives it up whole, and the
    /// next generation (due as any change is, not after the retry gap)
    /// writes into it; after a generation that wrote all it was given, it
    /// is taken back whole when it fits.
    pub fn keep_room(&mut self, name: &str, bytes: u64) {
        self.name = name.to_owned();
        self.room = (bytes > 0).then(|| super::room::Room::at(self.dir.join(ROOM_FILE), bytes));
    }

    /// What of the room is allocated; `None` keeps none.
    pub fn room_kept(&self) -> Option<u64> {
        self.room.as_ref().map(super::room::Room::kept)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn committed(&self) -> &Committed {
        &self.committed
    }

    /// Copies every store of `provider` that changed since it was last
    /// captured, as the generation after the current one; `None` when none
    /// did. Cheap: counters, positions and shared record handles (see
    /// [`copy_changed`]); the caller runs it at the moment the generation
    /// is to hold.
    pub fn capture(&mut self, provider: &MemoryProvider, captured_at: UnixNanos) -> Option<Job> {
        let marks = &mut self.channels;
        // The walk meets the channels in name order, as the marks are
        // kept: the next mark is the channel's, but for a channel met for
        // the first time.
        let mut next = 0;
        let mut chosen = Vec::new();
        let copy = copy_changed(
            provider,
            &self.options,
            captured_at,
            &self.captured,
            &mut |channel| {
                let at = mark_of(marks, &mut next, &channel);
                let mark = &marks[at];
                if mark.captured == Some(channel.version()) {
                    return None;
                }
                chosen.push(at);
                Some(mark.held.as_ref().map_or(0, |h| h.next))
            },
        );
        if copy.is_empty() {
            return None;
        }
        debug_assert_eq!(copy.channels.len(), chosen.len());
        for (channel, at) in copy.channels.iter().zip(chosen) {
            self.channels[at].captured = Some(channel.version());
        }
        for (store, version) in copy.fixed_versions() {
            self.captured.insert(store, version);
        }
        Some(Job {
            copy,
            base: self.committed.clone(),
            parallel_files: self.options.parallel_files,
        })
    }

    /// The mark of the channel named `name`.
    fn mark_named(&mut self, name: &str) -> Option<&mut ChannelMark> {
        let at = self
            .channels
            .binary_search_by(|m| m.name.as_str().cmp(name))
            .ok()?;
        Some(&mut self.channels[at])
    }

    /// A generation that writes no file and commits the current files as
    /// they are: what a graceful stop writes over a directory with no
    /// generation manifest yet (one a build before generations wrote), so
    /// that the stop leaves a directory `snapshot verify` calls one
    /// generation. `None` when the directory already has one, or holds
    /// nothing.
    pub fn adopt(&self, captured_at: UnixNanos) -> Option<Job> {
        (self.committed.generation == 0 && !self.committed.files.is_empty()).then(|| Job {
            copy: ProviderCopy {
                captured_at,
                channels: Vec::new(),
                retained: None,
                sessions: None,
            },
            base: self.committed.clone(),
            parallel_files: self.options.parallel_files,
        })
    }

    /// Writes `job`, captured from these generations, as the directory's
    /// next generation, and takes in what that came to. An append
    /// channel's copy holding only what was appended since the last capture
    /// is completed first from the records that capture held (off the
    /// broker's loop: this runs on the writer's thread).
    pub fn write(&mut self, mut job: Job, observer: &dyn WriteObserver) -> Outcome {
        self.complete(&mut job);
        let mut outcome = write_generation(&self.dir, &job, &self.spares, observer);
        self.settle(&outcome);
        outcome.room_given = self.room_after(&outcome);
        outcome.room_kept = self.room_kept();
        outcome
    }

    /// The room after a generation: given up whole when a file found no
    /// room (true: the next generation writes into it), taken back when it
    /// wrote all it was given and the room is not whole.
    fn room_after(&mut self, outcome: &Outcome) -> bool {
        let Some(room) = self.room.as_mut() else {
            return false;
        };
        // By kind: a manifest's failure is rebuilt without its errno.
        let no_room = outcome.report.failed.iter().any(|f| {
            matches!(
                f.error.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            )
        });
        if no_room {
            if room.kept() == 0 {
                return false;
            }
            return match room.give(u64::MAX) {
                Ok(given) => {
                    tracing::warn!(provider = %self.name, dir = %self.dir.display(), given_bytes = given,
                        "the file system under the snapshot directory is full: gave up the snapshot room, which the next generation writes into; it is taken back whole once the file system has that much free");
                    true
                }
                Err(e) => {
                    tracing::error!(provider = %self.name, dir = %self.dir.display(), error = %e,
                        "giving up the snapshot room failed");
                    false
                }
            };
        }
        if !outcome.report.failed.is_empty() || outcome.committed.is_none() {
            return false;
        }
        let now = std::time::Instant::now();
        room.recheck(now);
        if !room.due(now) {
            return false;
        }
        let given_up = room.is_given_up();
        match room.take(now) {
            Ok(()) => {
                if given_up {
                    tracing::info!(provider = %self.name, dir = %self.dir.display(), room_bytes = room.bytes(),
                        "the snapshot room is kept again, the file system having that much free");
                } else {
                    tracing::info!(provider = %self.name, dir = %self.dir.display(), room_bytes = room.bytes(),
                        "the snapshot room is kept");
                }
            }
            Err(e) if crate::storage::room::cannot_hold(&e) => {
                if room.first_failure() {
                    tracing::warn!(provider = %self.name, dir = %self.dir.display(), room_bytes = room.bytes(), error = %e,
                        "the snapshot room cannot be kept on this file system (not tried again until a restart): should the file system fill, generations fail until room is made beside them; keep that much free by the file system's own means (on ZFS, a dataset reservation) and set snapshot_room: 0");
                }
            }
            Err(e) => {
                if room.first_failure() {
                    tracing::warn!(provider = %self.name, dir = %self.dir.display(), room_bytes = room.bytes(), error = %e,
                        "cannot keep the snapshot room (tried again after each generation): should the file system fill, generations fail until room is made beside them");
                }
            }
        }
        false
    }

    /// Makes every append channel copy of `job` whole: the records held
    /// from the last capture, less those below the floor, then the ones
    /// copied since; and keeps them for the next.
    fn complete(&mut self, job: &mut Job) {
        for channel in &mut job.copy.channels {
            let ChannelCopy::Append { copy, .. } = channel else {
                continue;
            };
            let Some(mark) = self.mark_named(&copy.name) else {
                continue;
            };
            let held = mark.held.get_or_insert_with(HeldRecords::default);
            if copy.from == 0 {
                held.records = copy.records.clone();
            } else {
                held.records.drop_below(copy.floor);
                held.records.append(&mut copy.records);
                copy.records = held.records.clone();
                copy.from = 0;
            }
            held.next = copy.next;
        }
    }

    /// Takes in what writing a job came to: the generation it committed,
    /// the stores it wrote; every store it did not write is written again
    /// at the next generation.
    pub fn settle(&mut self, outcome: &Outcome) {
        let written: HashMap<&Store, u64> = outcome.written.iter().map(|(s, v)| (s, *v)).collect();
        if let Some(committed) = &outcome.committed {
            self.committed = committed.clone();
            for (store, version) in &written {
                match store {
                    Store::Channel(name) => {
                        if let Some(mark) = self.mark_named(name) {
                            mark.written = Some(*version);
                        }
                    }
                    _ => {
                        self.written.insert((*store).clone(), *version);
                    }
                }
            }
        } else {
            // Nothing landed: the highest number used still moves on, so
            // the next attempt never writes under a leftover's name.
            self.committed.highest = self.committed.highest.max(self.committed.next_generation());
        }
        // What was captured and not written is dirty again.
        self.captured = self.written.clone();
        for mark in &mut self.channels {
            mark.captured = mark.written;
        }
    }

    /// Whether any store changed since its file was written or captured.
    pub fn has_changes(&self, provider: &MemoryProvider) -> bool {
        let mut changed = fixed_store_versions(provider, &self.options)
            .into_iter()
            .any(|(store, version)| self.captured.get(&store) != Some(&version));
        provider.meet_channels(|channel| {
            changed = changed
                || self
                    .channels
                    .binary_search_by(|m| m.name.as_str().cmp(channel.name))
                    .map_or(true, |at| {
                        let mark = &self.channels[at];
                        !channel.is(&mark.channel) || mark.captured != Some(channel.version())
                    });
        });
        changed
    }
}

/// The index in `marks` of the mark of `channel`, met by a walk in name
/// order whose next mark is at `next` (moved past it): the mark there,
/// known by its channel; else the marks of channels the walk did not meet
/// are passed over, and a channel met for the first time is given a mark
/// there, as one never written (as is one that is not the channel its
/// mark held under its name).
fn mark_of(marks: &mut Vec<ChannelMark>, next: &mut usize, channel: &MetChannel<'_>) -> usize {
    while let Some(mark) = marks.get(*next) {
        if channel.is(&mark.channel) {
            break;
        }
        match mark.name.as_str().cmp(channel.name) {
            std::cmp::Ordering::Less => *next += 1,
            std::cmp::Ordering::Equal => {
                marks[*next] = ChannelMark::new(channel);
                break;
            }
            std::cmp::Ordering::Greater => {
                marks.insert(*next, ChannelMark::new(channel));
                break;
            }
        }
    }
    if *next == marks.len() {
        marks.push(ChannelMark::new(channel));
    }
    *next += 1;
    *next - 1
}

impl ChannelMark {
    /// The mark of a channel no generation has written.
    fn new(channel: &MetChannel<'_>) -> ChannelMark {
        ChannelMark {
            name: channel.name.to_owned(),
            channel: channel.known(),
            written: None,
            captured: None,
            held: None,
        }
    }
}

/// Writes `copy` into `dir` as the generation after the one the
/// directory holds (none: the first), every store of the copy in it.
/// Never stops at the first failure: every file that could not be written
/// is in the report, and each leaves its store's previous file current.
pub fn write_snapshot(dir: &Path, copy: &ProviderCopy, options: &SnapshotOptions) -> WriteReport {
    write_snapshot_observed(dir, copy, options, &Unobserved)
}

/// [`write_snapshot`], telling `observer` as each file starts and ends.
pub fn write_snapshot_observed(
    dir: &Path,
    copy: &ProviderCopy,
    options: &SnapshotOptions,
    observer: &dyn WriteObserver,
) -> WriteReport {
    let job = Job {
        copy: ProviderCopy {
            captured_at: copy.captured_at,
            channels: copy.channels.clone(),
            retained: copy.retained.clone(),
            sessions: copy.sessions.clone(),
        },
        base: read_committed(dir),
        parallel_files: options.parallel_files,
    };
    let outcome = write_generation(dir, &job, &Spares::none(), observer);
    let mut report = outcome.report;
    report.generation = outcome.committed.map(|c| c.generation);
    report
}

/// Both phases back to back, for callers that hold no broker loop (tests,
/// migration): copy everything, then write it as the directory's next
/// generation.
pub fn save_snapshot(
    provider: &MemoryProvider,
    dir: &Path,
    options: &SnapshotOptions,
    captured_at: UnixNanos,
) -> WriteReport {
    let copy = copy_provider(provider, options, captured_at);
    write_snapshot(dir, &copy, options)
}

/// Writes `job` into `dir` as the generation after `job.base`, telling
/// `observer` as each file starts and ends. Never stops at the first
/// failure: every file that could not be written is in the report, and
/// each leaves its store's previous file current.
pub fn write_generation(
    dir: &Path,
    job: &Job,
    spares: &Spares,
    observer: &dyn WriteObserver,
) -> Outcome {
    let generation = job.base.next_generation();
    let stamp = job.copy.captured_at;
    let mut report = WriteReport::default();
    let mut outcome = Outcome {
        committed: None,
        written: Vec::new(),
        report: WriteReport::default(),
        removed: 0,
        room_kept: None,
        room_given: false,
    };
    if let Err(error) = snapshot_write::create_dir(dir) {
        report.failed.push(FailedFile {
            file_name: String::new(),
            name: "snapshot directory".into(),
            path: dir.to_path_buf(),
            error,
        });
        outcome.report = report;
        return outcome;
    }

    spares.decide(dir);

    // 1. The changed stores' files, each under this generation's name.
    let files = snapshot_write::write_files(
        dir,
        &job.copy,
        generation,
        job.parallel_files,
        spares,
        observer,
    );
    let mut entries = (*job.base.files).clone();
    let mut fresh: Vec<String> = Vec::new();
    for file in files {
        match file.result {
            Ok(written) => {
                fresh.push(written.file_name.clone());
                entries.insert(
                    file.store.clone(),
                    GenerationFile {
                        kind: file.store.kind(),
                        channel: file.store.channel(),
                        file_name: written.file_name.clone(),
                        generation,
                        written_at: stamp,
                        length: written.bytes,
                        checksum: written.checksum,
                        behind: false,
                    },
                );
                outcome.written.push((file.store, file.version));
                report.written.push(written);
            }
            Err(failed) => {
                // The previous file stays, marked: what it holds is older
                // than the store.
                if let Some(entry) = entries.get_mut(&file.store) {
                    entry.behind = true;
                }
                report.failed.push(failed);
            }
        }
    }

    // 2. Every new name durable before the manifest names it.
    let synced = snapshot_write::sync_dir(dir);
    let manifest = Generation {
        generation,
        captured_at: stamp,
        files: entries.values().cloned().collect(),
    };
    let committed = synced.and_then(|()| {
        // Its header says when the generation committed: now, every file
        // it lists durable; `captured_at` says the moment its state is of.
        let bytes = f21::encode(
            &SnapshotFile::Generation(manifest),
            super::contract::now_nanos(),
        );
        observer.started(MANIFEST_FILE);
        // 3. The commit: one rename, then made durable.
        let written = snapshot_write::write_durable(dir, MANIFEST_FILE, &bytes)
            .and_then(|()| snapshot_write::sync_dir(dir));
        observer.finished(MANIFEST_FILE);
        written.map(|()| bytes.len() as u64)
    });
    match committed {
        Ok(bytes) => {
            report.written.push(WrittenFile {
                file_name: MANIFEST_FILE.into(),
                name: "manifest".into(),
                bytes,
                records: 0,
                checksum: 0,
            });
            // 4. Files no manifest lists any more: the ones the new files
            // replaced, removed or kept as spares.
            let listed: std::collections::HashSet<&str> =
                entries.values().map(|e| e.file_name.as_str()).collect();
            for old in job.base.files.values() {
                if !listed.contains(old.file_name.as_str())
                    && (spares.keep(dir, &old.file_name, old.length)
                        || std::fs::remove_file(dir.join(&old.file_name)).is_ok())
                {
                    outcome.removed += 1;
                }
            }
            spares.keep_at_most(dir, entries.len());
            outcome.committed = Some(Committed {
                generation,
                captured_at: stamp,
                files: Arc::new(entries),
                highest: job.base.highest.max(generation),
            });
        }
        Err(error) => {
            report.failed.push(FailedFile {
                file_name: MANIFEST_FILE.into(),
                // The same name whatever the generation: the writer logs a
                // file's failure once while it goes on failing.
                name: "manifest".into(),
                path: dir.join(MANIFEST_FILE),
                error: std::io::Error::new(
                    error.kind(),
                    format!("generation {generation} was not committed: {error}"),
                ),
            });
            // Nothing lists the new files: they go, and the previous
            // generation stays current, every store of this one to be
            // written again.
            for name in &fresh {
                let _ = std::fs::remove_file(dir.join(name));
            }
            outcome.written.clear();
        }
    }
    outcome.report = report;
    outcome
}

/// Removes what no generation will read: every generation-numbered data
/// file the current generation does not list (a generation that never
/// committed, or one whose files were replaced and not yet removed), and
/// the temporary files such generations left. Files under fixed names are
/// left alone until a generation replaces them. Run at startup, once the
/// directory is loaded; returns the names removed.
pub fn tidy(dir: &Path, committed: &Committed) -> Vec<String> {
    let listed: std::collections::HashSet<&str> = committed
        .files
        .values()
        .map(|f| f.file_name.as_str())
        .collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let unfinished = name.strip_suffix(TEMP_SUFFIX);
        let data_name = unfinished.unwrap_or(&name);
        let numbered = split_generation_file_name(data_name).is_some()
            && data_file(data_name).is_some_and(|(store, _)| store.is_some());
        let ours = numbered && (unfinished.is_some() || !listed.contains(data_name));
        // A temporary file of the manifest is a commit that never landed.
        let manifest_temp = name == temp_file_name(MANIFEST_FILE);
        if (ours || manifest_temp) && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(name);
        }
    }
    removed.sort();
    removed
}

#[cfg(test)]
mod tests;
