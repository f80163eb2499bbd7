//! Snapshot directories: the manifest, one format 21 file per channel, writing and loading.
//!
//! `saguin snapshot inspect` looks at a directory through [`scan`] and
//! `saguin snapshot verify` through [`scan_checking`], the same scan with
//! each record dropped once the one decoder has checked it and each file
//! read as a stream (so verifying a file costs about its largest record in
//! memory, and a latest channel's or the retained store's topics); [`load`] is [`scan`] plus "refuse on any error", for a loader.
//! "Verify says OK, serve refuses" must not happen: both scans run one
//! decoder and one set of checks ([`saguin_format::f21::decode_with`],
//! and [`saguin_format::f21::decode_stream`] with the same verdicts), the memory
//! provider's loader (`storage::memory::load`) reads every byte through
//! [`scan`] and [`into_loaded`] (the two halves of [`load`]) and only
//! builds stores from what they hand back, and
//! `tests/snapshot_loader_agreement.rs` holds `saguin snapshot verify` and
//! that loader to one verdict on every kind of damage.
//!
//! What a directory may hold (names from [`saguin_format::channel_name`];
//! `N` is the number of the generation that wrote a file, absent in a
//! directory a build before generations wrote):
//!
//! | name | what |
//! | --- | --- |
//! | `saguin.manifest` | the generation manifest (kind 6), written last: it commits its generation; or a shutdown's manifest (kind 2) beside fixed names |
//! | `<encoded channel>.N.snapshot` | one channel (a queue and its dead-letter channel share one) |
//! | `%24saguin%2Fretained.N.snapshot` | the retained store |
//! | `saguin.N.sessions`, `saguin.N.broadcast` | persistent sessions and the broadcast log, a pair |
//! | `*.tmp` | a write that never finished: reported, never read |
//! | `saguin.lock` (and its `-journal`, `-wal`, `-shm`) | the provider's lock and the sidecars SQLite leaves beside it: not snapshots, ignored |
//! | `saguin.room`, `saguin.<n>.spare` | room kept for a generation on a full file system, and replaced files a generation keeps (emptied when over one block) to make later ones from: not snapshots, ignored |
//!
//! Over 1,500 lines with its tests, because the scan, its findings and
//! their verdicts are one reading of a directory that `snapshot verify`,
//! `snapshot inspect` and the loader must share whole (split, two of them
//! could drift apart); the tests (from `mod tests`) are a third of it.
//!
//! Which files are current is the manifest's to say (`format/FORMAT.md`
//! §4): a generation manifest's list, each file checked to be the one
//! listed (length, written-at, checksum); beside a shutdown's manifest the
//! fixed names; with no usable manifest, the newest file of each store. A
//! file the current generation does not list is not read.
//!
//! Findings are typed ([`Severity`]): an **error** means the broker does not
//! start on this directory (a damaged, truncated or foreign-version file, a
//! file whose name does not match the channel inside it, a listed file
//! that is not the one listed, a sessions file without its broadcast log,
//! an in-flight entry past the log's next offset); a **warning** is what
//! the manifest and leftover temporary files tell the operator (the
//! manifest's own failures are warnings); **info** is a file nobody asked
//! for or one a later generation replaced.
//!
//! A shutdown's manifest's moment: a build before generations stamped every
//! file a shutdown wrote, the manifest included, with one "written at"
//! equal to the manifest's `began_at`. A file stamped earlier was not
//! rewritten by that shutdown (its write never landed, or the channel was
//! not configured then): everything published to it after its own moment
//! is gone. A file stamped later was written by a later shutdown whose
//! manifest did not land: the channels finished and the manifest did not.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use saguin_format::channel_name::{
    encode_file_name, spare_number, BROADCAST_FILE, LOCK_FILE, MANIFEST_FILE, RETAINED_FILE,
    ROOM_FILE, SESSIONS_FILE, TEMP_SUFFIX,
};
use saguin_format::f21::{
    self, time::format_unix_nanos, BroadcastFile, ChannelFile, FileKind, Generation,
    GenerationFile, Header, Manifest, RecordSink, RetainedFile, SessionsFile, SnapshotFile, Tally,
};
use saguin_format::mbmqtt;
use saguin_format::model::UnixNanos;

use super::contract::{Reader, StorageError};
use super::generation::{self, Committed};
use super::read::{self, ReadError, SpecialKind, F21_DEFAULT_MAX_BYTES, MBMQTT_DEFAULT_MAX_BYTES};
use super::snapshot_write::Store;

/// How a directory (or one file) is read.
#[derive(Clone, Debug)]
pub struct ScanOptions {
    /// Ceiling for one format 21 file; [`F21_DEFAULT_MAX_BYTES`] by default.
    pub max_bytes_f21: u64,
    /// Ceiling for an MBMQTT01 file; [`MBMQTT_DEFAULT_MAX_BYTES`] by default.
    pub max_bytes_mbmqtt: u64,
    /// When set, only these channels' files are decoded; any other channel
    /// file is reported as not configured and left unread (a channel the
    /// configuration dropped is "a file nobody opens"). `None`
    /// decodes every file, as `verify` does.
    pub channels: Option<BTreeSet<String>>,
    /// False when the provider does not keep the retained store: its file
    /// is reported as not configured and left unread. True for `verify`.
    pub retained: bool,
    /// False when the provider does not keep the sessions: the sessions
    /// file and the broadcast log are reported as not configured and left
    /// unread. True for `verify`.
    pub sessions: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            max_bytes_f21: F21_DEFAULT_MAX_BYTES,
            max_bytes_mbmqtt: MBMQTT_DEFAULT_MAX_BYTES,
            channels: None,
            retained: true,
            sessions: true,
        }
    }
}

impl ScanOptions {
    /// True when a file of this role is to be read: a channel file only for
    /// a channel asked for (a name that decodes to no channel is nobody's),
    /// the retained store and the sessions pair only when kept here.
    fn asks_for(&self, role: &Role) -> bool {
        match role {
            Role::Manifest => true,
            Role::Channel(channel) => match &self.channels {
                None => true,
                Some(wanted) => channel.as_ref().is_some_and(|c| wanted.contains(c)),
            },
            Role::Retained => self.retained,
            Role::Sessions | Role::Broadcast => self.sessions,
        }
    }

    /// One limit for every kind of file (`--max-bytes`).
    pub fn with_max_bytes(max: u64) -> ScanOptions {
        ScanOptions {
            max_bytes_f21: max,
            max_bytes_mbmqtt: max,
            channels: None,
            retained: true,
            sessions: true,
        }
    }
}

/// What a read keeps of a format 21 file's records. Either way the file
/// goes through the one decoder with every check the loader runs
/// ([`f21::decode_with`]); only what becomes of each record once checked
/// differs.
#[derive(Default)]
pub enum Records<'a> {
    /// Every record is kept: what a loader and `inspect` need.
    #[default]
    Keep,
    /// Each record is dropped once checked, so the decoded file's record
    /// lists are empty, and the file is read as a stream: reading it costs
    /// about its largest record in memory (and, for a latest channel or the
    /// retained store, its topics), whatever its length. What
    /// `verify` needs.
    Drop,
    /// Every record is handed to the sink as it is checked, which keeps it
    /// or leaves it in the decoded file, and the sink is told as each file
    /// of a scan is done; the file is read as a stream, as for `Drop`. What
    /// a memory provider's load needs, so its start never holds ten million
    /// decoded records, or their file's bytes, beside the store it builds
    /// from them.
    Into(&'a mut dyn LoadSink),
}

/// A sink that keeps the records of a directory's files as a scan reads
/// them, file by file.
pub trait LoadSink: RecordSink {
    /// Every record and queue item handed since the previous call came
    /// from `file` (its name in the directory); `decoded` is false when
    /// the file was refused, and then what it handed is no file's.
    fn file_read(&mut self, file: &str, decoded: bool);
}

impl Records<'_> {
    /// The same choice, lent for one file's read.
    fn reborrow(&mut self) -> Records<'_> {
        match self {
            Records::Keep => Records::Keep,
            Records::Drop => Records::Drop,
            Records::Into(sink) => Records::Into(&mut **sink),
        }
    }
}

/// Any snapshot file saguin reads, told apart by its magic.
// One value per file read, never held in bulk: boxing buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum AnySnapshot {
    F21 { header: Header, file: SnapshotFile },
    Mbmqtt(mbmqtt::Snapshot),
}

/// Why one file cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    /// It could not be read, or is not a regular file, or is too large.
    /// Shown without the path, which the caller names.
    #[error("{}", .0.reason())]
    Read(#[from] ReadError),
    /// A format 21 file that does not decode or validate. `header` is what
    /// could still be read of it, for messages naming version and writer.
    #[error("{error}")]
    F21 {
        header: Option<Header>,
        error: f21::DecodeError,
    },
    /// An MBMQTT01 file that does not decode.
    #[error("legacy MBMQTT01 broker.snapshot, not a saguin snapshot: {error}")]
    Mbmqtt { error: mbmqtt::DecodeError },
    #[error(
        "empty file: the file holds 0 bytes; not a saguin snapshot or an MBMQTT01 broker.snapshot"
    )]
    Empty,
    /// Neither magic.
    #[error("not a saguin snapshot: wrong magic at offset 0: {found} is neither saguin format 21 ({f21}) nor MBMQTT01")]
    NotASnapshot { found: String, f21: String },
}

impl FileProblem {
    /// True when the file could not be read at all (exit 3 rather than 1).
    pub fn is_unreadable(&self) -> bool {
        matches!(self, FileProblem::Read(e) if e.is_unreadable())
    }

    /// A short stable name for JSON output.
    pub fn code(&self) -> &'static str {
        match self {
            FileProblem::Read(e) => e.code(),
            FileProblem::F21 { error, .. } => error.code(),
            FileProblem::Mbmqtt { error } => error.code(),
            FileProblem::Empty => "empty",
            FileProblem::NotASnapshot { .. } => "not-a-snapshot",
        }
    }
}

/// The lock database and the sidecar files SQLite keeps beside it while the
/// lock is held (a rollback journal, or a write-ahead log and its index):
/// the provider's, never snapshot files, so a scan passes them silently.
fn is_lock_file(name: &str) -> bool {
    name.strip_prefix(LOCK_FILE)
        .is_some_and(|rest| matches!(rest, "" | "-journal" | "-wal" | "-shm"))
}

fn hex_spaced(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which format the leading bytes belong to. A file shorter than a magic
/// that is a prefix of one is that format's (and then refused as short by
/// its decoder), so a cut file is called truncated rather than foreign.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Magic {
    F21,
    Mbmqtt,
    Empty,
    Unknown,
}

pub fn detect(bytes: &[u8]) -> Magic {
    let n = bytes.len().min(8);
    let prefix = bytes.get(..n).unwrap_or_default();
    if bytes.is_empty() {
        Magic::Empty
    } else if f21::MAGIC.get(..n) == Some(prefix) {
        Magic::F21
    } else if mbmqtt::MAGIC.get(..n) == Some(prefix) {
        Magic::Mbmqtt
    } else {
        Magic::Unknown
    }
}

/// Read one file and decode it as whatever its bytes say it is, with the
/// size limit of that kind. `expected` refuses a format 21 file of another
/// kind (a channel file where `saguin.sessions` should be).
pub fn read_snapshot_file(
    path: &Path,
    opts: &ScanOptions,
    expected: Option<FileKind>,
) -> Result<AnySnapshot, FileProblem> {
    read_snapshot_file_with(path, opts, expected, Records::Keep)
}

/// [`read_snapshot_file`] for a checker: every check runs, and each format
/// 21 record is dropped once checked ([`Records::Drop`]), so a large
/// channel file costs about its largest record in memory (and a latest
/// channel's or the retained store's topics). The verdict is the
/// loader's.
pub fn check_snapshot_file(path: &Path, opts: &ScanOptions) -> Result<AnySnapshot, FileProblem> {
    read_snapshot_file_with(path, opts, None, Records::Drop)
}

/// [`read_snapshot_file`], keeping or dropping the records.
pub fn read_snapshot_file_with(
    path: &Path,
    opts: &ScanOptions,
    expected: Option<FileKind>,
    records: Records,
) -> Result<AnySnapshot, FileProblem> {
    let ceiling = opts.max_bytes_f21.max(opts.max_bytes_mbmqtt);
    let opened = read::open_bounded_by_magic(path, ceiling, |probe| match detect(probe) {
        Magic::Mbmqtt => opts.max_bytes_mbmqtt,
        _ => opts.max_bytes_f21,
    })?;
    match (records, detect(opened.probe())) {
        (Records::Drop, Magic::F21) => stream_f21(opened, expected, &mut Tally::default()),
        (Records::Into(sink), Magic::F21) => stream_f21(opened, expected, sink),
        _ => decode_snapshot_bytes(&opened.read_whole()?, expected),
    }
}

/// The format 21 arm of [`read_snapshot_file_with`] with another sink than
/// the one keeping every record: the same decoder and checks, reading the
/// file as a stream, so that what it costs in memory is what the sink
/// keeps, not the file's length.
fn stream_f21(
    mut opened: read::Opened,
    expected: Option<FileKind>,
    mut sink: impl RecordSink,
) -> Result<AnySnapshot, FileProblem> {
    let size = opened.length()?;
    let decoded = f21::decode_stream(&mut opened.source(), size, expected, &mut sink);
    match decoded {
        Err(f21::StreamError::Read(e)) => Err(opened.failed(e).into()),
        Err(f21::StreamError::Decode { header, error }) => {
            opened.finish()?;
            Err(FileProblem::F21 { header, error })
        }
        Ok((header, file)) => {
            opened.finish()?;
            match check_readers(&file) {
                Ok(()) => Ok(AnySnapshot::F21 { header, file }),
                Err(error) => Err(FileProblem::F21 {
                    header: Some(header),
                    error,
                }),
            }
        }
    }
}

/// Read one format 21 file of the `expected` kind: what a directory holds.
pub fn read_f21_file(
    path: &Path,
    opts: &ScanOptions,
    expected: FileKind,
) -> Result<(Header, SnapshotFile), FileProblem> {
    read_f21_file_with(path, opts, expected, Records::Keep)
}

/// [`read_f21_file`], keeping or dropping the records.
pub fn read_f21_file_with(
    path: &Path,
    opts: &ScanOptions,
    expected: FileKind,
    records: Records,
) -> Result<(Header, SnapshotFile), FileProblem> {
    match read_snapshot_file_with(path, opts, Some(expected), records)? {
        AnySnapshot::F21 { header, file } => Ok((header, file)),
        // With `expected` set an MBMQTT01 file is refused while decoding.
        AnySnapshot::Mbmqtt(_) => Err(FileProblem::F21 {
            header: None,
            error: f21::DecodeError::NotASnapshot {
                found: "MBMQTT01".into(),
                expected: hex_spaced(&f21::MAGIC),
            },
        }),
    }
}

/// [`read_snapshot_file`] on bytes already in memory.
pub fn decode_snapshot_bytes(
    bytes: &[u8],
    expected: Option<FileKind>,
) -> Result<AnySnapshot, FileProblem> {
    match detect(bytes) {
        Magic::Empty => Err(FileProblem::Empty),
        Magic::Unknown => Err(FileProblem::NotASnapshot {
            found: hex_spaced(bytes.get(..8).unwrap_or(bytes)),
            f21: hex_spaced(&f21::MAGIC),
        }),
        Magic::Mbmqtt => match expected {
            Some(kind) => Err(FileProblem::F21 {
                header: None,
                error: f21::DecodeError::NotASnapshot {
                    found: format!("MBMQTT01 (a legacy broker.snapshot, where a format 21 {kind} file belongs)"),
                    expected: hex_spaced(&f21::MAGIC),
                },
            }),
            None => mbmqtt::decode(bytes)
                .map(AnySnapshot::Mbmqtt)
                .map_err(|error| FileProblem::Mbmqtt { error }),
        },
        Magic::F21 => {
            let decoded = match expected {
                Some(kind) => f21::decode_expecting(bytes, kind),
                None => f21::decode(bytes),
            };
            decoded
                .and_then(|(header, file)| check_readers(&file).map(|()| (header, file)))
                .map(|(header, file)| AnySnapshot::F21 { header, file })
                .map_err(|error| FileProblem::F21 {
                    header: f21::read_header(bytes).ok(),
                    error,
                })
        }
    }
}

/// Every reader a file names must be one the stores accept
/// ([`Reader::parse`]: no NUL, at most 65,535 bytes after the scheme),
/// so that a file this calls valid is never refused by the loader that
/// turns its positions into [`Reader`]s.
pub fn check_readers(file: &SnapshotFile) -> Result<(), f21::DecodeError> {
    let lists: Vec<(&str, &[f21::Position])> = match file {
        SnapshotFile::Channel(c) => {
            let mut lists = vec![("positions", c.positions.as_slice())];
            if let Some(d) = &c.dead_letter {
                lists.push(("dead_letter.positions", d.positions.as_slice()));
            }
            lists
        }
        SnapshotFile::Broadcast(b) => vec![("cursors", b.cursors.as_slice())],
        _ => Vec::new(),
    };
    for (field, positions) in lists {
        for (i, p) in positions.iter().enumerate() {
            if let Err(e) = Reader::parse(&p.reader) {
                let reason = match e {
                    StorageError::InvalidReader { reason, .. } => reason.to_string(),
                    other => other.to_string(),
                };
                return Err(f21::DecodeError::Invalid {
                    field: format!("{field}[{i}].reader"),
                    reason,
                });
            }
        }
    }
    Ok(())
}

/// What a file in the directory is, by its name (its contents must agree).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Manifest,
    /// A channel file; the channel its name decodes to, if it does.
    Channel(Option<String>),
    Retained,
    Sessions,
    Broadcast,
}

impl Role {
    /// What `name` is, and the generation its name carries (0 for a fixed
    /// name); `None` for a name that is no snapshot file.
    pub fn of(name: &str) -> Option<(Role, u64)> {
        if name == MANIFEST_FILE {
            return Some((Role::Manifest, 0));
        }
        let (store, generation) = generation::data_file(name)?;
        let role = match store {
            Some(Store::Channel(channel)) => Role::Channel(Some(channel)),
            Some(Store::Retained) => Role::Retained,
            Some(Store::Sessions) => Role::Sessions,
            Some(Store::Broadcast) => Role::Broadcast,
            None => Role::Channel(None),
        };
        Some((role, generation))
    }

    /// The store a data file of this role holds (none for the manifest or
    /// a channel file whose name decodes to no channel).
    pub fn store(&self) -> Option<Store> {
        match self {
            Role::Manifest | Role::Channel(None) => None,
            Role::Channel(Some(c)) => Some(Store::Channel(c.clone())),
            Role::Retained => Some(Store::Retained),
            Role::Sessions => Some(Store::Sessions),
            Role::Broadcast => Some(Store::Broadcast),
        }
    }

    fn expected_kind(&self) -> FileKind {
        match self {
            Role::Manifest => FileKind::Manifest,
            Role::Channel(_) => FileKind::Channel,
            Role::Retained => FileKind::Retained,
            Role::Sessions => FileKind::Sessions,
            Role::Broadcast => FileKind::Broadcast,
        }
    }

    pub fn as_str(&self) -> &'static str {
        self.expected_kind().as_str()
    }
}

/// The directory's manifest, of either kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirManifest {
    /// Kind 2: written first by a shutdown of a build before generations,
    /// over files under fixed names.
    Shutdown(Manifest),
    /// Kind 6: the current generation, written last.
    Generation(Generation),
}

impl DirManifest {
    /// The moment it records: the shutdown's start, or the generation's
    /// state.
    pub fn moment(&self) -> UnixNanos {
        match self {
            DirManifest::Shutdown(m) => m.began_at,
            DirManifest::Generation(g) => g.captured_at,
        }
    }

    /// The generation it commits (0 for a shutdown's manifest).
    pub fn generation(&self) -> u64 {
        match self {
            DirManifest::Shutdown(_) => 0,
            DirManifest::Generation(g) => g.generation,
        }
    }
}

/// One snapshot file of the directory and what became of it.
#[derive(Debug)]
pub struct FileReport {
    /// The file's name in the directory.
    pub name: String,
    pub path: PathBuf,
    pub role: Role,
    /// The generation its name carries; 0 for a fixed name.
    pub generation: u64,
    /// Its store's state after it was written is lost: the generation
    /// lists it as behind (a newer state could not be written), or a
    /// shutdown manifest's moment is later than the file's. A behind
    /// file's held publishes are counted as abandoned, not restored.
    pub behind: bool,
    /// Decoded (header and contents), refused, or not read.
    pub outcome: FileOutcome,
}

#[derive(Debug)]
pub enum FileOutcome {
    Decoded {
        header: Header,
        file: SnapshotFile,
    },
    Failed(FileProblem),
    /// A file the options did not ask for: left unread.
    NotConfigured,
    /// A file of another generation than the directory's current one (a
    /// generation that never committed, or one replaced since): not read.
    NotCurrent,
}

impl FileReport {
    pub fn header(&self) -> Option<&Header> {
        match &self.outcome {
            FileOutcome::Decoded { header, .. } => Some(header),
            _ => None,
        }
    }
}

/// How serious a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Not a problem: what the operator may want to know.
    Info,
    /// The broker starts; something was lost or left behind and is named.
    Warning,
    /// The broker does not start on this directory.
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// What verification answers for a finding ([`FindingKind::verdict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The directory fails verification (`FAIL`, exit 1).
    Fail,
    /// Named, and the directory still verifies (`WARN`).
    Warn,
    /// Only in `--json` and `inspect`.
    Info,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Fail => "fail",
            Verdict::Warn => "warn",
            Verdict::Info => "info",
        }
    }
}

/// A directory-level finding; file decode failures are in [`FileReport`]
/// and repeated here as [`FindingKind::FileRefused`] so one list holds
/// every problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FindingKind {
    // ---- errors -------------------------------------------------------
    /// A file did not read or decode (its [`FileReport`] has the problem).
    FileRefused { file: String, problem: String },
    /// A channel file whose name is not its channel's file name.
    NameMismatch {
        file: String,
        channel: String,
        expected_file: String,
    },
    /// A sessions file with no broadcast log beside it: its log is lost.
    SessionsWithoutBroadcast { file: String, log: String },
    /// The sessions file and the broadcast log disagree (an in-flight entry
    /// at or past the log's next offset, ...).
    PairInvalid {
        file: String,
        log: String,
        problem: String,
    },
    /// A file the generation manifest lists whose length, written-at or
    /// checksum is not what the manifest states: not the file that
    /// generation wrote (a copy holding files of two generations).
    NotTheListedFile { file: String, problem: String },
    // ---- warnings -----------------------------------------------------
    /// No manifest: nothing says whether the last shutdown finished.
    ManifestMissing,
    /// The manifest could not be read or decoded (its own failure is a
    /// warning: it holds no records).
    ManifestUnreadable { problem: String },
    /// Files numbered by generation and no usable manifest: nothing says
    /// which of them make one generation; the newest of each store is read.
    GenerationsWithoutManifest,
    /// A file the manifest listed is not there: that channel's records are gone.
    ListedButMissing { file: String, what: String },
    /// A file older than the manifest's moment: what was published after its own moment is gone.
    WrittenBeforeManifest {
        file: String,
        written_at: i64,
        manifest_at: i64,
    },
    /// A file newer than the manifest's moment: the files finished and the manifest did not.
    WrittenAfterManifest {
        file: String,
        written_at: i64,
        manifest_at: i64,
    },
    /// A file the generation lists as behind: its store's newer state could
    /// not be written, so what happened to it after `written_at` is gone.
    Behind {
        file: String,
        what: String,
        written_at: i64,
    },
    /// A file of a generation the manifest does not commit (one being
    /// written, or one a crash or a failure cut short): not read.
    Uncommitted {
        file: String,
        generation: u64,
        manifest: u64,
    },
    /// A temporary file a write left behind; never read, never promoted.
    LeftoverTemp { file: String },
    /// The directory holds no snapshot file at all, or only a manifest.
    NothingStored,
    // ---- info ---------------------------------------------------------
    /// A snapshot file the manifest did not ask for (a channel the
    /// configuration dropped is the operator's own doing).
    NotInManifest { file: String },
    /// A file of an earlier generation that a later one replaced (removed
    /// by the broker once nothing lists it): not read.
    Superseded { file: String, generation: u64 },
    /// A file the configuration does not ask this provider for (another
    /// channel, or the retained store or sessions kept elsewhere): not read.
    NotConfigured { file: String },
    /// Something in the directory that is not a snapshot file.
    Unrecognised { file: String, what: String },
}

impl FindingKind {
    pub fn severity(&self) -> Severity {
        use FindingKind::*;
        match self {
            FileRefused { .. }
            | NameMismatch { .. }
            | SessionsWithoutBroadcast { .. }
            | PairInvalid { .. }
            | NotTheListedFile { .. } => Severity::Error,
            ManifestMissing
            | ManifestUnreadable { .. }
            | GenerationsWithoutManifest
            | ListedButMissing { .. }
            | WrittenBeforeManifest { .. }
            | WrittenAfterManifest { .. }
            | Behind { .. }
            | Uncommitted { .. }
            | LeftoverTemp { .. }
            | NothingStored => Severity::Warning,
            NotInManifest { .. }
            | Superseded { .. }
            | NotConfigured { .. }
            | Unrecognised { .. } => Severity::Info,
        }
    }

    /// What `saguin snapshot verify` answers for this finding, and so what a
    /// migration, which verifies its source first, refuses. Stricter than
    /// [`severity`](Self::severity), the broker's view: a broker starts on a
    /// directory whose manifest says records are gone (it warns, and serves
    /// what is left), but a backup script asking "is this copy good" must be
    /// told no. A directory with nothing in it to verify is a "no" too, and
    /// so are files numbered by generation with no manifest to say they are
    /// one.
    pub fn verdict(&self) -> Verdict {
        use FindingKind::*;
        match self {
            FileRefused { .. }
            | NameMismatch { .. }
            | SessionsWithoutBroadcast { .. }
            | PairInvalid { .. }
            | NotTheListedFile { .. }
            | GenerationsWithoutManifest
            | ListedButMissing { .. }
            | WrittenBeforeManifest { .. }
            | NothingStored => Verdict::Fail,
            ManifestMissing
            | ManifestUnreadable { .. }
            | WrittenAfterManifest { .. }
            | Behind { .. }
            | Uncommitted { .. }
            | LeftoverTemp { .. } => Verdict::Warn,
            NotInManifest { .. }
            | Superseded { .. }
            | NotConfigured { .. }
            | Unrecognised { .. } => Verdict::Info,
        }
    }

    /// A short stable name for JSON output.
    pub fn code(&self) -> &'static str {
        use FindingKind::*;
        match self {
            FileRefused { .. } => "file-refused",
            NameMismatch { .. } => "name-mismatch",
            SessionsWithoutBroadcast { .. } => "sessions-without-broadcast",
            PairInvalid { .. } => "sessions-broadcast-mismatch",
            NotTheListedFile { .. } => "not-the-listed-file",
            ManifestMissing => "manifest-missing",
            ManifestUnreadable { .. } => "manifest-unreadable",
            GenerationsWithoutManifest => "generations-without-manifest",
            ListedButMissing { .. } => "listed-but-missing",
            WrittenBeforeManifest { .. } => "written-before-manifest",
            WrittenAfterManifest { .. } => "written-after-manifest",
            Behind { .. } => "behind",
            Uncommitted { .. } => "uncommitted",
            LeftoverTemp { .. } => "leftover-temp",
            NothingStored => "nothing-stored",
            NotInManifest { .. } => "not-in-manifest",
            Superseded { .. } => "superseded",
            NotConfigured { .. } => "not-configured",
            Unrecognised { .. } => "unrecognised",
        }
    }

    /// The file the finding is about, if it is about one.
    pub fn file(&self) -> Option<&str> {
        use FindingKind::*;
        match self {
            FileRefused { file, .. }
            | NameMismatch { file, .. }
            | NotTheListedFile { file, .. }
            | ListedButMissing { file, .. }
            | WrittenBeforeManifest { file, .. }
            | WrittenAfterManifest { file, .. }
            | Behind { file, .. }
            | Uncommitted { file, .. }
            | LeftoverTemp { file }
            | NotInManifest { file }
            | Superseded { file, .. }
            | NotConfigured { file }
            | Unrecognised { file, .. } => Some(file),
            SessionsWithoutBroadcast { file, .. } | PairInvalid { file, .. } => Some(file),
            ManifestMissing | ManifestUnreadable { .. } | GenerationsWithoutManifest => {
                Some(MANIFEST_FILE)
            }
            NothingStored => None,
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use FindingKind::*;
        match self {
            FileRefused { file, problem } => write!(f, "{file}: {problem}"),
            NameMismatch {
                file,
                channel,
                expected_file,
            } => write!(
                f,
                "{file}: holds channel {channel:?}, whose file is {expected_file}; a file is loaded only under its own channel's name"
            ),
            SessionsWithoutBroadcast { file, log } => write!(
                f,
                "{file} has no {log} beside it: the broadcast log its sessions point into is lost, and the broker does not start on it"
            ),
            PairInvalid { file, log, problem } => {
                write!(f, "{file} does not fit {log}: {problem}")
            }
            NotTheListedFile { file, problem } => write!(
                f,
                "{file}: not the file the manifest's generation lists ({problem}); a copy taken while a later generation was written mixes two of them: copy the directory again"
            ),
            ManifestMissing => write!(
                f,
                "{MANIFEST_FILE} is missing: nothing says whether the last shutdown wrote every file"
            ),
            ManifestUnreadable { problem } => write!(
                f,
                "{MANIFEST_FILE} cannot be used ({problem}); the files are loaded without it and nothing says whether the last shutdown finished"
            ),
            GenerationsWithoutManifest => write!(
                f,
                "no usable {MANIFEST_FILE} beside files numbered by generation: nothing says which of them make one generation; the newest file of each store is read"
            ),
            ListedButMissing { file, what } => write!(
                f,
                "{file}: listed by the manifest and not there: {what} records are gone"
            ),
            WrittenBeforeManifest {
                file,
                written_at,
                manifest_at,
            } => write!(
                f,
                "{file}: written at {}, before the shutdown the manifest records ({}): everything published to it after {} is gone",
                format_unix_nanos(*written_at),
                format_unix_nanos(*manifest_at),
                format_unix_nanos(*written_at)
            ),
            WrittenAfterManifest {
                file,
                written_at,
                manifest_at,
            } => write!(
                f,
                "{file}: written at {}, after the manifest's moment ({}): a later shutdown finished its files and its manifest did not land",
                format_unix_nanos(*written_at),
                format_unix_nanos(*manifest_at)
            ),
            Behind {
                file,
                what,
                written_at,
            } => write!(
                f,
                "{file}: {what} changed after this file was written at {} and the newer state could not be written: what happened to it since is gone",
                format_unix_nanos(*written_at)
            ),
            Uncommitted {
                file,
                generation,
                manifest,
            } => write!(
                f,
                "{file}: written by generation {generation}, which the manifest (generation {manifest}) does not commit: a generation being written or cut short; not read"
            ),
            LeftoverTemp { file } => write!(
                f,
                "{file}: a temporary file a write left behind; it was never completed and is not read"
            ),
            NothingStored => write!(
                f,
                "the directory holds no channel, retained-store, sessions or broadcast file: nothing in it to verify or keep"
            ),
            NotInManifest { file } => write!(
                f,
                "{file}: not listed by the manifest (a channel the configuration dropped?)"
            ),
            Superseded { file, generation } => write!(
                f,
                "{file}: generation {generation}'s file, replaced by a later generation; not read"
            ),
            NotConfigured { file } => write!(
                f,
                "{file}: not a store the configuration keeps on this provider; not read"
            ),
            Unrecognised { file, what } => write!(f, "{file}: {what}; ignored"),
        }
    }
}

/// Everything [`scan`] found in a directory.
#[derive(Debug)]
pub struct DirReport {
    pub dir: PathBuf,
    /// The manifest, when it decoded.
    pub manifest: Option<(Header, DirManifest)>,
    /// Every snapshot file (manifest included), sorted by name.
    pub files: Vec<FileReport>,
    /// Every finding, errors first, then by file.
    pub findings: Vec<FindingKind>,
    /// The directory's current generation as a writer continues it: the
    /// generation manifest's files, or, without one, the files read as
    /// current (each with what its header and trailer state).
    pub committed: Committed,
}

impl DirReport {
    /// True when the broker would load this directory (no error finding).
    pub fn is_loadable(&self) -> bool {
        self.errors().next().is_none()
    }

    pub fn errors(&self) -> impl Iterator<Item = &FindingKind> {
        self.findings
            .iter()
            .filter(|f| f.severity() == Severity::Error)
    }

    /// The findings that fail verification ([`Verdict::Fail`]).
    pub fn verification_failures(&self) -> impl Iterator<Item = &FindingKind> {
        self.findings
            .iter()
            .filter(|f| f.verdict() == Verdict::Fail)
    }

    /// True when `saguin snapshot verify` passes this directory: no finding
    /// whose verdict is [`Verdict::Fail`] (every error is one).
    ///
    /// This, not [`is_loadable`](Self::is_loadable), is what a directory's
    /// `"valid"` means wherever it is printed, so that no document says
    /// valid beside a finding whose verdict is fail. `snapshot inspect`
    /// describes and `snapshot verify` judges, and both judge by this one
    /// rule: an empty directory (`nothing-stored`), or one whose records
    /// may be gone (`listed-but-missing`, `written-before-manifest`,
    /// `generations-without-manifest`), is not valid in either, and both
    /// print such a finding as FAIL. Inspect's exit status stays the
    /// broker's view (0 when a broker would load what was shown, which it
    /// does for those directories, warning), because it answers "could
    /// this be shown", not "is this copy good"; verify's exit status is
    /// this verdict.
    pub fn verifies(&self) -> bool {
        self.verification_failures().next().is_none()
    }

    /// True when some file could not be read at all (missing between
    /// listing and reading, permission, I/O): exit 3 rather than 1.
    pub fn has_unreadable(&self) -> bool {
        self.files
            .iter()
            .any(|f| matches!(&f.outcome, FileOutcome::Failed(p) if p.is_unreadable()))
    }
}

/// Why a directory could not be scanned at all.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{}: is {kind}, not a snapshot directory", .path.display())]
    NotADirectory { path: PathBuf, kind: &'static str },
}

impl ScanError {
    pub fn is_unreadable(&self) -> bool {
        match self {
            ScanError::Read(e) => e.is_unreadable(),
            ScanError::NotADirectory { .. } => false,
        }
    }
}

/// List `dir`, decode every snapshot file in it with the format 21
/// decoder, and report per file and across files. See the module docs.
pub fn scan(dir: &Path, opts: &ScanOptions) -> Result<DirReport, ScanError> {
    scan_with(dir, opts, Records::Keep)
}

/// [`scan`] for a checker (`saguin snapshot verify`): the same decoder, the
/// same checks and the same findings, with each file's records dropped once
/// checked ([`Records::Drop`]): the decoded channel, retained and broadcast
/// files come back with empty record lists, and each file is read as a
/// stream: the peak memory is about the largest record, and the topics of
/// the largest latest channel or retained store, rather than any file's
/// size.
pub fn scan_checking(dir: &Path, opts: &ScanOptions) -> Result<DirReport, ScanError> {
    scan_with(dir, opts, Records::Drop)
}

/// Reads the manifest, of either kind.
fn read_manifest(path: &Path, opts: &ScanOptions) -> Result<(Header, DirManifest), FileProblem> {
    let refused = |found: String| FileProblem::F21 {
        header: None,
        error: f21::DecodeError::NotASnapshot {
            found,
            expected: hex_spaced(&f21::MAGIC),
        },
    };
    match read_snapshot_file_with(path, opts, None, Records::Keep)? {
        AnySnapshot::F21 {
            header,
            file: SnapshotFile::Manifest(m),
        } => Ok((header, DirManifest::Shutdown(m))),
        AnySnapshot::F21 {
            header,
            file: SnapshotFile::Generation(g),
        } => Ok((header, DirManifest::Generation(g))),
        AnySnapshot::F21 { header, file } => Err(FileProblem::F21 {
            header: Some(header),
            error: f21::DecodeError::WrongKind {
                expected: FileKind::Manifest,
                found: file.kind(),
            },
        }),
        AnySnapshot::Mbmqtt(_) => Err(refused(
            "MBMQTT01 (a legacy broker.snapshot, where a format 21 manifest belongs)".into(),
        )),
    }
}

/// A data file found in the directory, before it is read.
struct Found {
    name: String,
    path: PathBuf,
    role: Role,
    generation: u64,
}

/// [`scan`], keeping or dropping the records.
pub fn scan_with(
    dir: &Path,
    opts: &ScanOptions,
    mut records: Records,
) -> Result<DirReport, ScanError> {
    let meta = read::lstat(dir)?;
    match SpecialKind::of(&meta) {
        Some(SpecialKind::Directory) => {}
        Some(kind) => {
            return Err(ScanError::NotADirectory {
                path: dir.to_path_buf(),
                kind: kind.as_str(),
            })
        }
        None => {
            return Err(ScanError::NotADirectory {
                path: dir.to_path_buf(),
                kind: "a regular file",
            })
        }
    }
    let entries = std::fs::read_dir(dir).map_err(|e| ReadError::from_io(dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ReadError::from_io(dir, e))?;
        names.push(entry.file_name());
    }
    names.sort();

    // 1. What each name is.
    let mut findings = Vec::new();
    let mut found = Vec::new();
    let mut manifest_present = false;
    for os_name in names {
        let Some(name) = os_name.to_str().map(str::to_owned) else {
            findings.push(FindingKind::Unrecognised {
                file: os_name.to_string_lossy().into_owned(),
                what: "a name that is not UTF-8, so no snapshot file".into(),
            });
            continue;
        };
        let path = dir.join(&name);
        if name.ends_with(TEMP_SUFFIX) {
            findings.push(FindingKind::LeftoverTemp { file: name });
            continue;
        }
        if is_lock_file(&name) || name == ROOM_FILE || spare_number(&name).is_some() {
            continue;
        }
        match Role::of(&name) {
            Some((Role::Manifest, _)) => manifest_present = true,
            Some((role, generation)) => found.push(Found {
                name,
                path,
                role,
                generation,
            }),
            None => {
                let what = match read::lstat(&path).ok().and_then(|m| SpecialKind::of(&m)) {
                    Some(kind) => format!("{kind}, not a snapshot file"),
                    None => "not a snapshot file name".into(),
                };
                findings.push(FindingKind::Unrecognised { file: name, what });
            }
        }
    }
    let highest = found.iter().map(|f| f.generation).max().unwrap_or(0);

    // 2. The manifest first: it says which files are current.
    let mut files = Vec::new();
    let mut manifest = None;
    if manifest_present {
        let path = dir.join(MANIFEST_FILE);
        let outcome = match read_manifest(&path, opts) {
            Ok((header, m)) => {
                manifest = Some((header.clone(), m.clone()));
                FileOutcome::Decoded {
                    header,
                    file: match m {
                        DirManifest::Shutdown(m) => SnapshotFile::Manifest(m),
                        DirManifest::Generation(g) => SnapshotFile::Generation(g),
                    },
                }
            }
            Err(problem) => {
                findings.push(FindingKind::ManifestUnreadable {
                    problem: problem.to_string(),
                });
                FileOutcome::Failed(problem)
            }
        };
        files.push(FileReport {
            name: MANIFEST_FILE.into(),
            path,
            role: Role::Manifest,
            generation: manifest.as_ref().map_or(0, |(_, m)| m.generation()),
            behind: false,
            outcome,
        });
    }
    let generation = match &manifest {
        Some((_, DirManifest::Generation(g))) => Some(g),
        _ => None,
    };
    let listed: BTreeMap<&str, &GenerationFile> = generation
        .map(|g| g.files.iter().map(|f| (f.file_name.as_str(), f)).collect())
        .unwrap_or_default();

    // 3. Which files are current: the ones a generation manifest lists;
    // beside a shutdown's manifest, the fixed names; with neither, the
    // newest file of each store.
    let current: BTreeSet<String> = match &manifest {
        Some((_, DirManifest::Generation(_))) => {
            listed.keys().map(|name| (*name).to_owned()).collect()
        }
        Some((_, DirManifest::Shutdown(_))) => found
            .iter()
            .filter(|f| f.generation == 0)
            .map(|f| f.name.clone())
            .collect(),
        None => {
            let mut newest: BTreeMap<Option<Store>, &Found> = BTreeMap::new();
            let mut current = BTreeSet::new();
            for f in &found {
                match f.role.store() {
                    // A name no store's: read on its own merits.
                    None => {
                        current.insert(f.name.clone());
                    }
                    Some(store) => {
                        let slot = newest.entry(Some(store)).or_insert(f);
                        if f.generation > slot.generation {
                            *slot = f;
                        }
                    }
                }
            }
            current.extend(newest.values().map(|f| f.name.clone()));
            current
        }
    };

    // 4. Read the current files this provider keeps. A scan that streams
    // its files decodes the sessions file on a thread of its own while it
    // reads the rest: it holds no records for `records`, and at 100,000
    // sessions its decoding and checks were about a quarter of a memory
    // provider's load (174-199 ms, 136-155 ms with it beside). A scan that
    // keeps every record reads each file whole, one after the other.
    let manifest_generation = manifest.as_ref().map_or(0, |(_, m)| m.generation());
    std::thread::scope(|scope| {
        let mut sessions_beside = match records {
            Records::Keep => None,
            Records::Drop | Records::Into(_) => found
                .iter()
                .find(|f| {
                    f.role == Role::Sessions && current.contains(&f.name) && opts.asks_for(&f.role)
                })
                .and_then(|f| {
                    let path = f.path.clone();
                    std::thread::Builder::new()
                        .name("saguin-sessions".into())
                        .spawn_scoped(scope, move || {
                            read_f21_file_with(
                                &path,
                                opts,
                                Role::Sessions.expected_kind(),
                                Records::Drop,
                            )
                        })
                        // Not started: read here, in its turn.
                        .ok()
                }),
        };
        for f in found {
            let Found {
                name,
                path,
                role,
                generation: file_generation,
            } = f;
            if !current.contains(&name) {
                findings.push(match &manifest {
                    Some(_) if file_generation > manifest_generation => FindingKind::Uncommitted {
                        file: name.clone(),
                        generation: file_generation,
                        manifest: manifest_generation,
                    },
                    Some(_) if file_generation == 0 => {
                        FindingKind::NotInManifest { file: name.clone() }
                    }
                    _ => FindingKind::Superseded {
                        file: name.clone(),
                        generation: file_generation,
                    },
                });
                files.push(FileReport {
                    name,
                    path,
                    role,
                    generation: file_generation,
                    behind: false,
                    outcome: FileOutcome::NotCurrent,
                });
                continue;
            }
            let behind = listed.get(name.as_str()).is_some_and(|e| e.behind);
            let outcome = if opts.asks_for(&role) {
                let read = match sessions_beside.take_if(|_| role == Role::Sessions) {
                    Some(beside) => beside
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    None => {
                        read_f21_file_with(&path, opts, role.expected_kind(), records.reborrow())
                    }
                };
                let outcome = match read {
                    Ok((header, file)) => FileOutcome::Decoded { header, file },
                    Err(problem) => FileOutcome::Failed(problem),
                };
                if let Records::Into(sink) = &mut records {
                    sink.file_read(&name, matches!(outcome, FileOutcome::Decoded { .. }));
                }
                outcome
            } else {
                findings.push(FindingKind::NotConfigured { file: name.clone() });
                FileOutcome::NotConfigured
            };
            files.push(FileReport {
                name,
                path,
                role,
                generation: file_generation,
                behind,
                outcome,
            });
        }
    });

    // Per-file findings: refusals, channel names, and whether each file a
    // generation lists is the one it wrote.
    for f in &files {
        match (&f.role, &f.outcome) {
            (Role::Manifest, _) => {}
            (_, FileOutcome::Failed(p)) => findings.push(
                match listed
                    .get(f.name.as_str())
                    .and_then(|entry| reused_mismatch(entry, &f.path))
                {
                    Some(problem) => FindingKind::NotTheListedFile {
                        file: f.name.clone(),
                        problem,
                    },
                    None => FindingKind::FileRefused {
                        file: f.name.clone(),
                        problem: p.to_string(),
                    },
                },
            ),
            (role, FileOutcome::Decoded { header, file }) => {
                if let SnapshotFile::Channel(c) = file {
                    let expected_base = encode_file_name(&c.name);
                    if *role != Role::Channel(Some(c.name.clone())) {
                        let expected_file = if f.generation == 0 {
                            expected_base
                        } else {
                            saguin_format::channel_name::generation_file_name(
                                &expected_base,
                                f.generation,
                            )
                        };
                        findings.push(FindingKind::NameMismatch {
                            file: f.name.clone(),
                            channel: c.name.clone(),
                            expected_file,
                        });
                    }
                }
                if let Some(entry) = listed.get(f.name.as_str()) {
                    if let Some(problem) = listed_mismatch(entry, header, &f.path) {
                        findings.push(FindingKind::NotTheListedFile {
                            file: f.name.clone(),
                            problem,
                        });
                    }
                }
            }
            _ => {}
        }
    }

    // The sessions file and its log (unless the provider keeps no sessions).
    let current_of = |role: Role| {
        files.iter().find(|f| {
            f.role == role && opts.sessions && !matches!(f.outcome, FileOutcome::NotCurrent)
        })
    };
    let log_beside = |sessions: &FileReport| match sessions.generation {
        0 => BROADCAST_FILE.to_owned(),
        g => saguin_format::channel_name::generation_file_name(BROADCAST_FILE, g),
    };
    match (current_of(Role::Sessions), current_of(Role::Broadcast)) {
        (Some(s), None) => findings.push(FindingKind::SessionsWithoutBroadcast {
            file: s.name.clone(),
            log: log_beside(s),
        }),
        (Some(sessions), Some(log)) => {
            let (s, b) = (sessions, log);
            if let (
                FileOutcome::Decoded {
                    file: SnapshotFile::Sessions(s),
                    ..
                },
                FileOutcome::Decoded {
                    file: SnapshotFile::Broadcast(b),
                    ..
                },
            ) = (&s.outcome, &b.outcome)
            {
                if let Err(e) = f21::validate_pair(s, b) {
                    findings.push(FindingKind::PairInvalid {
                        file: sessions.name.clone(),
                        log: log.name.clone(),
                        problem: e.to_string(),
                    });
                }
            }
        }
        _ => {}
    }

    // What the manifest says of the files, by its kind.
    let has_data = files
        .iter()
        .any(|f| f.role != Role::Manifest && !matches!(f.outcome, FileOutcome::NotCurrent));
    let numbered = files.iter().any(|f| {
        f.role != Role::Manifest
            && f.generation > 0
            && !matches!(f.outcome, FileOutcome::NotCurrent)
    });
    match &manifest {
        Some((_, DirManifest::Generation(g))) => generation_findings(g, &files, &mut findings),
        Some((_, DirManifest::Shutdown(m))) => manifest_findings(m, &files, &mut findings),
        None if numbered => findings.push(FindingKind::GenerationsWithoutManifest),
        None if !manifest_present && has_data => findings.push(FindingKind::ManifestMissing),
        None => {}
    }
    // A manifest alone holds no record: there is nothing to keep.
    if !has_data {
        findings.push(FindingKind::NothingStored);
    }

    // Behind, beside a shutdown's manifest: a listed file older than it.
    let shutdown_at = match &manifest {
        Some((_, DirManifest::Shutdown(m))) => Some(m.began_at),
        _ => None,
    };
    if let Some(at) = shutdown_at {
        for f in &mut files {
            if f.role != Role::Manifest && f.header().is_some_and(|h| h.written_at < at) {
                f.behind = true;
            }
        }
    }
    let committed = committed_of(&manifest, &files, highest);

    findings.sort_by(|a, b| {
        b.severity()
            .cmp(&a.severity())
            .then_with(|| a.file().cmp(&b.file()))
    });
    Ok(DirReport {
        dir: dir.to_path_buf(),
        manifest,
        files,
        findings,
        committed,
    })
}

/// Why a file is not the one a generation manifest lists under its name,
/// or `None` when its length, header and checksum are the listed ones.
fn listed_mismatch(entry: &GenerationFile, header: &Header, path: &Path) -> Option<String> {
    if header.written_at != entry.written_at {
        return Some(format!(
            "written at {}, listed as written at {}",
            format_unix_nanos(header.written_at),
            format_unix_nanos(entry.written_at)
        ));
    }
    match generation::file_identity(path) {
        Ok((length, _, _)) if length != entry.length => {
            Some(format!("{length} bytes, listed as {} bytes", entry.length))
        }
        Ok((_, _, checksum)) if checksum != entry.checksum => Some(format!(
            "checksum {checksum:08x}, listed as {:08x}",
            entry.checksum
        )),
        Ok(_) => None,
        Err(e) => Some(format!("its length and checksum cannot be read: {e}")),
    }
}

/// Why a listed file that cannot be read is not the file listed rather
/// than that file damaged: it holds nothing a header fits in (emptied),
/// or its header is another generation's, as a file holds that a copy
/// read while the broker reused it (where generations keep spares,
/// FORMAT.md §4). `None` for a file that starts as the listed one did:
/// damaged.
fn reused_mismatch(entry: &GenerationFile, path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let length = file.metadata().ok()?.len();
    let mut header = Vec::with_capacity(f21::HEADER_LEN);
    file.take(f21::HEADER_LEN as u64)
        .read_to_end(&mut header)
        .ok()?;
    if header.len() < f21::HEADER_LEN {
        return Some(format!("{length} bytes, listed as {} bytes", entry.length));
    }
    let written_at = f21::read_header(&header).ok()?.written_at;
    (written_at != entry.written_at).then(|| {
        format!(
            "written at {}, listed as written at {}",
            format_unix_nanos(written_at),
            format_unix_nanos(entry.written_at)
        )
    })
}

/// What a generation manifest says of the files: each listed one missing,
/// and each listed as behind.
fn generation_findings(g: &Generation, files: &[FileReport], findings: &mut Vec<FindingKind>) {
    let present: BTreeSet<&str> = files.iter().map(|f| f.name.as_str()).collect();
    for entry in &g.files {
        let what = Store::of_entry(entry).describe();
        if !present.contains(entry.file_name.as_str()) {
            findings.push(FindingKind::ListedButMissing {
                file: entry.file_name.clone(),
                what: format!("{what}'s"),
            });
        } else if entry.behind {
            findings.push(FindingKind::Behind {
                file: entry.file_name.clone(),
                what,
                written_at: entry.written_at,
            });
        }
    }
}

/// The directory's current generation as a writer continues it (see
/// [`DirReport::committed`]).
fn committed_of(
    manifest: &Option<(Header, DirManifest)>,
    files: &[FileReport],
    highest: u64,
) -> Committed {
    if let Some((_, DirManifest::Generation(g))) = manifest {
        return Committed {
            generation: g.generation,
            captured_at: g.captured_at,
            files: std::sync::Arc::new(
                g.files
                    .iter()
                    .map(|f| (Store::of_entry(f), f.clone()))
                    .collect(),
            ),
            highest,
        };
    }
    // Files a build before generations wrote, or a directory with no
    // manifest: each current file is adopted as it is, so the next
    // generation lists it until its store is written again.
    let mut committed = Committed {
        highest,
        ..Committed::default()
    };
    for f in files {
        if matches!(f.outcome, FileOutcome::NotCurrent | FileOutcome::Failed(_)) {
            continue;
        }
        let Some(store) = f.role.store() else {
            continue;
        };
        let Ok((length, written_at, checksum)) = generation::file_identity(&f.path) else {
            continue;
        };
        std::sync::Arc::make_mut(&mut committed.files).insert(
            store.clone(),
            GenerationFile {
                kind: store.kind(),
                channel: match &store {
                    Store::Channel(c) => c.clone(),
                    _ => String::new(),
                },
                file_name: f.name.clone(),
                generation: f.generation,
                written_at,
                length,
                checksum,
                behind: f.behind,
            },
        );
    }
    committed
}

fn manifest_findings(m: &Manifest, files: &[FileReport], findings: &mut Vec<FindingKind>) {
    let present: BTreeMap<&str, &FileReport> = files
        .iter()
        .filter(|f| !matches!(f.outcome, FileOutcome::NotCurrent))
        .map(|f| (f.name.as_str(), f))
        .collect();
    let mut listed: Vec<(String, String)> = m
        .channels
        .iter()
        .map(|e| (e.file_name.clone(), format!("channel {:?}'s", e.channel)))
        .collect();
    if m.retained {
        listed.push((RETAINED_FILE.into(), "the retained store's".into()));
    }
    if m.sessions {
        listed.push((SESSIONS_FILE.into(), "the persistent sessions'".into()));
    }
    if m.broadcast {
        listed.push((BROADCAST_FILE.into(), "the broadcast log's".into()));
    }
    let listed_names: BTreeSet<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    for (file, what) in &listed {
        if !present.contains_key(file.as_str()) {
            findings.push(FindingKind::ListedButMissing {
                file: file.clone(),
                what: what.clone(),
            });
        }
    }
    for f in present.values() {
        if f.role == Role::Manifest {
            continue;
        }
        if !listed_names.contains(f.name.as_str()) {
            findings.push(FindingKind::NotInManifest {
                file: f.name.clone(),
            });
            continue;
        }
        let Some(header) = f.header() else { continue };
        if header.written_at < m.began_at {
            findings.push(FindingKind::WrittenBeforeManifest {
                file: f.name.clone(),
                written_at: header.written_at,
                manifest_at: m.began_at,
            });
        } else if header.written_at > m.began_at {
            findings.push(FindingKind::WrittenAfterManifest {
                file: f.name.clone(),
                written_at: header.written_at,
                manifest_at: m.began_at,
            });
        }
    }
}

/// A directory the memory provider can load: every file decoded and
/// validated, warnings kept for the startup log.
#[derive(Debug, Default)]
pub struct Loaded {
    pub manifest: Option<(Header, DirManifest)>,
    /// Channel name → its file. `stale` is true for a file whose store's
    /// later state is lost (see [`FileReport::behind`]): it is read for its
    /// records and not for its holds (each held publish is counted as
    /// abandoned).
    pub channels: BTreeMap<String, LoadedChannel>,
    pub retained: Option<RetainedFile>,
    pub sessions: Option<SessionsFile>,
    pub broadcast: Option<BroadcastFile>,
    /// The broadcast log is behind: its held publishes are counted as
    /// abandoned, as a stale channel's are.
    pub broadcast_stale: bool,
    /// Warnings and info, to be logged once at startup.
    pub findings: Vec<FindingKind>,
    /// The directory's current generation, for the writer that continues
    /// it.
    pub committed: Committed,
}

#[derive(Debug)]
pub struct LoadedChannel {
    pub header: Header,
    pub file: ChannelFile,
    pub stale: bool,
    /// Its name in the directory.
    pub file_name: String,
}

/// Why a directory does not load: its path and every error finding.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("snapshot {}: {error}", .dir.display())]
    Scan { error: ScanError, dir: PathBuf },
    #[error("snapshot {}: {}", .dir.display(), .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Refused {
        dir: PathBuf,
        errors: Vec<FindingKind>,
    },
}

/// Scan `dir` and hand back its contents, or refuse it naming every error.
/// The broker's memory provider loads through this, so it accepts exactly
/// what `saguin snapshot verify` calls OK.
pub fn load(dir: &Path, opts: &ScanOptions) -> Result<Loaded, LoadError> {
    let report = scan(dir, opts).map_err(|error| LoadError::Scan {
        error,
        dir: dir.to_path_buf(),
    })?;
    into_loaded(report)
}

/// The second half of [`load`], for a caller that looks at the scanned
/// files before they are handed over (the memory provider names a file
/// whose channel kind is not the configured one even when another file
/// is damaged): refused naming every error, or the directory's contents.
pub fn into_loaded(report: DirReport) -> Result<Loaded, LoadError> {
    if !report.is_loadable() {
        return Err(LoadError::Refused {
            errors: report.errors().cloned().collect(),
            dir: report.dir,
        });
    }
    let mut loaded = Loaded {
        manifest: report.manifest,
        findings: report
            .findings
            .into_iter()
            .filter(|f| f.severity() != Severity::Error)
            .collect(),
        committed: report.committed,
        ..Loaded::default()
    };
    for f in report.files {
        let FileOutcome::Decoded { header, file } = f.outcome else {
            continue;
        };
        match file {
            SnapshotFile::Channel(c) => {
                loaded.channels.insert(
                    c.name.clone(),
                    LoadedChannel {
                        header,
                        file: c,
                        stale: f.behind,
                        file_name: f.name,
                    },
                );
            }
            SnapshotFile::Retained(r) => loaded.retained = Some(r),
            SnapshotFile::Sessions(s) => loaded.sessions = Some(s),
            SnapshotFile::Broadcast(b) => {
                loaded.broadcast_stale = f.behind;
                loaded.broadcast = Some(b);
            }
            SnapshotFile::Manifest(_) | SnapshotFile::Generation(_) => {}
        }
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use saguin_format::f21::{InflightEntry, InflightPhase, ManifestEntry, Session};
    use saguin_format::model::ChannelKind;

    const T: i64 = 1_767_225_600_000_000_000;

    fn put(dir: &Path, name: &str, file: &SnapshotFile, at: i64) {
        std::fs::write(
            dir.join(name),
            f21::encode_with_writer(file, "0123456789ab", at),
        )
        .unwrap();
    }

    fn manifest(channels: &[&str], sessions: bool) -> SnapshotFile {
        SnapshotFile::Manifest(Manifest {
            began_at: T,
            channels: channels
                .iter()
                .map(|c| ManifestEntry {
                    channel: (*c).into(),
                    file_name: encode_file_name(c),
                    kind: ChannelKind::Append,
                })
                .collect(),
            retained: true,
            sessions,
            broadcast: sessions,
        })
    }

    fn channel(name: &str) -> SnapshotFile {
        SnapshotFile::Channel(ChannelFile::new(name, ChannelKind::Append))
    }

    /// A whole, consistent directory written by one shutdown.
    fn good_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        put(
            d.path(),
            MANIFEST_FILE,
            &manifest(&["telemetry", "a.b"], true),
            T,
        );
        put(d.path(), "telemetry.snapshot", &channel("telemetry"), T);
        put(d.path(), "a%2Eb.snapshot", &channel("a.b"), T);
        put(
            d.path(),
            RETAINED_FILE,
            &SnapshotFile::Retained(RetainedFile::default()),
            T,
        );
        put(
            d.path(),
            SESSIONS_FILE,
            &SnapshotFile::Sessions(SessionsFile::default()),
            T,
        );
        put(
            d.path(),
            BROADCAST_FILE,
            &SnapshotFile::Broadcast(BroadcastFile::default()),
            T,
        );
        d
    }

    /// A sessions file of one session, client `c`, with `inflight` on the
    /// wire.
    fn one_session(inflight: Vec<InflightEntry>) -> SessionsFile {
        SessionsFile {
            sessions: vec![Session {
                client_id: "c".into(),
                principal: None,
                expiry_interval: 60,
                detached_at: T,
                subscriptions: vec![],
                will: None,
                window: 10,
                inflight,
            }],
            shared_groups: vec![],
        }
    }

    fn codes(r: &DirReport) -> Vec<&'static str> {
        r.findings.iter().map(FindingKind::code).collect()
    }

    #[test]
    fn a_whole_directory_loads_with_nothing_to_say() {
        let d = good_dir();
        std::fs::write(d.path().join(LOCK_FILE), b"").unwrap();
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        assert_eq!(r.files.len(), 6);
        let loaded = load(d.path(), &ScanOptions::default()).unwrap();
        assert_eq!(
            loaded.channels.keys().collect::<Vec<_>>(),
            vec!["a.b", "telemetry"]
        );
        assert!(loaded.channels.values().all(|c| !c.stale));
        assert!(
            loaded.retained.is_some() && loaded.sessions.is_some() && loaded.broadcast.is_some()
        );
    }

    #[test]
    fn the_lock_and_its_sqlite_sidecars_are_passed_silently() {
        let d = good_dir();
        for suffix in ["", "-journal", "-wal", "-shm"] {
            std::fs::write(d.path().join(format!("{LOCK_FILE}{suffix}")), b"x").unwrap();
        }
        // A name that merely starts like the lock's is still reported.
        std::fs::write(d.path().join(format!("{LOCK_FILE}-old")), b"x").unwrap();
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert_eq!(codes(&r), vec!["unrecognised"], "{:?}", r.findings);
        assert_eq!(r.findings[0].file(), Some("saguin.lock-old"));
        assert_eq!(r.files.len(), 6);
    }

    #[test]
    fn the_manifests_four_cases_are_warnings_and_info() {
        let d = good_dir();
        // Listed and missing.
        std::fs::remove_file(d.path().join("a%2Eb.snapshot")).unwrap();
        // Written before the manifest's moment.
        put(d.path(), "telemetry.snapshot", &channel("telemetry"), T - 1);
        // Written after it.
        put(
            d.path(),
            RETAINED_FILE,
            &SnapshotFile::Retained(RetainedFile::default()),
            T + 1,
        );
        // Nobody asked for it.
        put(d.path(), "old.snapshot", &channel("old"), T);
        // A write that never finished.
        std::fs::write(d.path().join("telemetry.snapshot.tmp"), b"partial").unwrap();
        std::fs::write(d.path().join("notes.txt"), b"x").unwrap();

        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert!(r.is_loadable(), "{:?}", r.findings);
        let mut c = codes(&r);
        c.sort();
        assert_eq!(
            c,
            vec![
                "leftover-temp",
                "listed-but-missing",
                "not-in-manifest",
                "unrecognised",
                "written-after-manifest",
                "written-before-manifest",
            ]
        );
        let text: Vec<String> = r.findings.iter().map(ToString::to_string).collect();
        assert!(text.iter().any(|t| t.contains("a%2Eb.snapshot: listed by the manifest and not there: channel \"a.b\"'s records are gone")), "{text:?}");
        assert!(text
            .iter()
            .any(|t| t.contains("everything published to it after")));
        let loaded = load(d.path(), &ScanOptions::default()).unwrap();
        assert!(loaded.channels["telemetry"].stale);
        assert!(!loaded.channels["old"].stale);
    }

    #[test]
    fn no_manifest_is_a_warning() {
        let d = good_dir();
        std::fs::remove_file(d.path().join(MANIFEST_FILE)).unwrap();
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert!(r.is_loadable());
        assert_eq!(codes(&r), vec!["manifest-missing"]);
        // A damaged manifest is a warning too: it holds no records.
        std::fs::write(d.path().join(MANIFEST_FILE), b"\x89SAGUIN\nxx").unwrap();
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert!(r.is_loadable());
        assert_eq!(codes(&r), vec!["manifest-unreadable"]);
    }

    /// A streaming scan reads the sessions file on a thread of its own; it
    /// answers what a scan reading every file in turn does, for a whole
    /// sessions file and for a damaged one, in the files' order.
    #[test]
    fn a_sessions_file_read_beside_the_others_is_judged_as_in_turn() {
        let d = good_dir();
        put(
            d.path(),
            SESSIONS_FILE,
            &SnapshotFile::Sessions(one_session(vec![])),
            T,
        );
        let outcomes = |r: &DirReport| -> Vec<String> {
            r.files
                .iter()
                .map(|f| match &f.outcome {
                    FileOutcome::Decoded {
                        file: SnapshotFile::Sessions(s),
                        ..
                    } => format!("{}: {:?}", f.name, s),
                    FileOutcome::Decoded { .. } => format!("{}: decoded", f.name),
                    FileOutcome::Failed(p) => format!("{}: {p}", f.name),
                    other => format!("{}: {other:?}", f.name),
                })
                .collect()
        };
        let in_turn = scan(d.path(), &ScanOptions::default()).unwrap();
        let beside = scan_checking(d.path(), &ScanOptions::default()).unwrap();
        assert!(beside.is_loadable());
        assert_eq!(outcomes(&beside), outcomes(&in_turn));
        assert!(outcomes(&beside)
            .iter()
            .any(|o| o.starts_with("saguin.sessions: SessionsFile")));

        let path = d.path().join(SESSIONS_FILE);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let in_turn = scan(d.path(), &ScanOptions::default()).unwrap();
        let beside = scan_checking(d.path(), &ScanOptions::default()).unwrap();
        assert!(!beside.is_loadable());
        assert_eq!(outcomes(&beside), outcomes(&in_turn));
        assert_eq!(codes(&beside), codes(&in_turn));
    }

    #[test]
    fn sessions_without_broadcast_is_refused() {
        let d = good_dir();
        std::fs::remove_file(d.path().join(BROADCAST_FILE)).unwrap();
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert!(!r.is_loadable());
        assert!(codes(&r).contains(&"sessions-without-broadcast"));
        let err = load(d.path(), &ScanOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("saguin.sessions has no saguin.broadcast beside it"),
            "{err}"
        );
    }

    #[test]
    fn inflight_past_the_logs_next_is_refused() {
        let d = good_dir();
        let sessions = one_session(vec![InflightEntry {
            log_offset: 5,
            packet_id: 1,
            qos: 1,
            phase: InflightPhase::AwaitingAck,
            shared_group: None,
        }]);
        put(
            d.path(),
            SESSIONS_FILE,
            &SnapshotFile::Sessions(sessions),
            T,
        );
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert_eq!(
            codes(&r),
            vec!["sessions-broadcast-mismatch"],
            "{:?}",
            r.findings
        );
        assert!(r.findings[0]
            .to_string()
            .contains("at or past the broadcast log's next offset 1"));
    }

    #[test]
    fn file_name_must_match_the_channel_inside() {
        let d = good_dir();
        put(d.path(), "telemetry.snapshot", &channel("metrics"), T);
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert!(codes(&r).contains(&"name-mismatch"));
        assert!(!r.is_loadable());
    }

    #[test]
    fn damaged_and_foreign_files_are_errors_naming_the_file() {
        let d = good_dir();
        let mut bytes = std::fs::read(d.path().join("telemetry.snapshot")).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(d.path().join("telemetry.snapshot"), &bytes).unwrap();
        // A sessions file holding a channel.
        put(d.path(), SESSIONS_FILE, &channel("x"), T);
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        let errors: Vec<String> = r.errors().map(ToString::to_string).collect();
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("telemetry.snapshot: checksum mismatch")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e
                .starts_with("saguin.sessions: a channel file where a sessions file was expected")),
            "{errors:?}"
        );
        // A FIFO named like a channel file is refused, never opened.
        let fifo = d.path().join("pipe.snapshot");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let r = scan(d.path(), &ScanOptions::default()).unwrap();
        assert!(r
            .errors()
            .any(|e| e.to_string().contains("pipe.snapshot: ")
                && e.to_string().contains("is a FIFO")));
    }

    #[test]
    fn only_configured_channels_are_read_when_asked() {
        let d = good_dir();
        std::fs::write(d.path().join("junk.snapshot"), b"not a snapshot").unwrap();
        let opts = ScanOptions {
            channels: Some(["telemetry".to_string(), "a.b".to_string()].into()),
            ..ScanOptions::default()
        };
        let r = scan(d.path(), &opts).unwrap();
        assert!(r.is_loadable(), "{:?}", r.findings);
        assert!(codes(&r).contains(&"not-configured"));
    }

    #[test]
    fn a_symlinked_or_missing_directory_is_refused() {
        let d = good_dir();
        let link = d.path().with_extension("link");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        let err = scan(&link, &ScanOptions::default()).unwrap_err();
        std::fs::remove_file(&link).unwrap();
        assert!(matches!(
            err,
            ScanError::NotADirectory {
                kind: "a symbolic link",
                ..
            }
        ));
        let err = scan(&d.path().join("nope"), &ScanOptions::default()).unwrap_err();
        assert!(err.is_unreadable());
    }

    #[test]
    fn kind_is_told_from_the_bytes() {
        assert_eq!(detect(b""), Magic::Empty);
        assert_eq!(detect(b"MBMQ"), Magic::Mbmqtt);
        assert_eq!(detect(b"MBMQTT01rest"), Magic::Mbmqtt);
        assert_eq!(detect(&f21::MAGIC), Magic::F21);
        assert_eq!(detect(b"\x89SAG"), Magic::F21);
        assert_eq!(detect(b"SQLite format 3"), Magic::Unknown);
    }
}
