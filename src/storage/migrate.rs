//! Moving a provider's data to the other provider kind, and importing a
//! legacy MBMQTT01 `broker.snapshot` (`saguin migrate`, `man saguin-migrate`).
//!
//! The rules (`docs/design.md` storage rule 8), each enforced here rather
//! than by the command line:
//!
//! - **The destination must not exist**, or be an empty directory; a
//!   database's `-wal`, `-shm` and `-journal` must not exist either, and its parent directory must. Checked before
//!   anything is read.
//! - **It is built beside itself**, under [`staging_path`], and linked (a
//!   database) or renamed (a directory) into place only once read back,
//!   verified and counted; neither replaces anything. A migration stopped
//!   half way leaves nothing at the destination to block a retry.
//! - **Both providers' locks are taken**: a source a running broker holds is
//!   refused at once, naming the holder. Taking a lock creates its file
//!   (`<db>.lock`, `<dir>/saguin.lock`) if absent: that is the one thing a
//!   migration creates beside its source, and a migration refused once it
//!   holds the lock removes that file again. A database source is checked
//!   to be a regular file beginning with SQLite's header before its lock is
//!   taken, so a path named by mistake gets no lock file at all.
//! - **The source is never touched**: a database is opened read-only (never
//!   `immutable=1`), a directory is only read; even what a starting broker
//!   would drop (expired positions) is left alone and carried.
//! - **The checker is the migrator**: the source is verified first, whole -
//!   a directory by `snapshot verify`'s checks and verdicts, a database by
//!   `sqlite verify`'s ([`sqlite::verify`]) and then by the loader's own
//!   validation of each unit - and a source that fails is refused with every
//!   finding named, before anything is created.
//! - **Nothing is created when there is nothing to migrate** (an empty
//!   directory, a database without channels, sessions or retained messages):
//!   an empty destination would satisfy "must not exist" and lock the
//!   operator out of retrying that path. When no unit could be written at
//!   all, what was created is removed again for the same reason.
//! - **A write failure is reported and the conversion carries on**, unit by unit,
//!   so every unit that did not make it is named. A queue and its
//!   dead-letter channel are one file and one transaction.
//! - **Counts in and counts out** ([`Counts`]) are taken per unit - out from
//!   the destination as written, read back - and a difference is a failure.

mod mbmqtt_import;
pub(crate) mod model;
mod snapshots;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

pub use crate::storage::sqlite::units::{count_unit, read_units, write_unit, ReadFailure};
pub use mbmqtt_import::{
    import as import_mbmqtt, Imported, LegacyCounts, IMPORTED_SESSION_EXPIRY, IMPORTED_WINDOW,
    PUBCOMP_OWED_TOPIC,
};
pub use model::{Counts, Unit, SESSIONS_UNIT};

use super::contract::now_nanos;
use super::lock::{self, LockError, LockGuard};
use super::read::{self, ReadError};
use super::snapshot_dir::{ScanError, ScanOptions};
use super::sqlite::{self, SqliteOpenError, PAGE_SIZE, WRITER_REVISION};
use super::{parent_of, NoParent};
use snapshots::Carry;

/// Where a migration reads.
#[derive(Clone, Debug)]
pub enum Source {
    /// A memory provider's snapshot directory.
    SnapshotDir(PathBuf),
    /// A sqlite provider's database.
    Sqlite(PathBuf),
    /// A legacy MBMQTT01 `broker.snapshot`, read up to `max_bytes`.
    Mbmqtt { path: PathBuf, max_bytes: u64 },
}

impl Source {
    pub fn path(&self) -> &Path {
        match self {
            Source::SnapshotDir(p) | Source::Sqlite(p) => p,
            Source::Mbmqtt { path, .. } => path,
        }
    }
}

/// Where a migration writes.
#[derive(Clone, Debug)]
pub enum Destination {
    Sqlite(PathBuf),
    SnapshotDir(PathBuf),
}

impl Destination {
    pub fn path(&self) -> &Path {
        match self {
            Destination::Sqlite(p) | Destination::SnapshotDir(p) => p,
        }
    }
}

/// Told how the work advances, for a progress bar. Every method has a
/// default that does nothing.
pub trait Progress: Sync {
    /// The total records about to be written.
    fn start(&self, _total: u64) {}
    /// A unit is being written.
    fn unit(&self, _name: &str) {}
    /// `n` more records were written.
    fn advance(&self, _n: u64) {}
    /// Writing is over; the destination is being read back.
    fn verifying(&self) {}
}

/// No progress shown.
pub struct NoProgress;
impl Progress for NoProgress {}

/// What became of one unit.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UnitReport {
    pub name: String,
    /// `append`, `latest`, `queue`, `retained` or `sessions`.
    pub kind: String,
    /// What the source held (`None` when the source's file was refused).
    pub counts_in: Option<Counts>,
    /// What the destination holds, read back (`None` when not written).
    pub counts_out: Option<Counts>,
    /// Why the unit failed; `None` when it was carried whole.
    pub error: Option<String>,
}

impl UnitReport {
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }
}

/// What a migration did.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub source: PathBuf,
    pub destination: PathBuf,
    /// One per unit, in the order written.
    pub units: Vec<UnitReport>,
    /// Failures that belong to no one unit (the manifest, the directory).
    pub failures: Vec<String>,
    /// What the source's loader warned about (stale files, leftovers).
    pub warnings: Vec<String>,
    /// For an MBMQTT01 import: what the legacy file held.
    pub legacy: Option<LegacyCounts>,
    #[serde(skip)]
    pub elapsed: Duration,
    /// True when the destination was removed again because nothing in it
    /// could be written.
    pub destination_removed: bool,
}

impl Report {
    pub fn is_complete(&self) -> bool {
        self.failures.is_empty() && self.units.iter().all(UnitReport::is_ok)
    }

    /// Records (and queue items, dead letters, log messages) carried.
    pub fn records_carried(&self) -> u64 {
        self.units
            .iter()
            .filter(|u| u.is_ok())
            .filter_map(|u| u.counts_out)
            .map(|c| c.records + c.queue_items + c.dead_letters)
            .sum()
    }
}

/// Why a migration did not start. Each names the path; all mean "could not
/// do the work" (exit 3).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{}: {what}; a migration writes only into a destination that does not exist (or an empty directory), so it never lands beside channels that are already there", path.display())]
    DestinationExists { path: PathBuf, what: String },
    #[error("{}: no such {what}", path.display())]
    SourceMissing { path: PathBuf, what: &'static str },
    #[error("{}: {detail}", path.display())]
    SourceNotUsable { path: PathBuf, detail: String },
    #[error("{what} is locked: {source}; stop the broker that holds it first")]
    Locked {
        what: String,
        #[source]
        source: LockError,
    },
    #[error("{}: the parent directory {} does not exist; a migration creates only the destination itself", path.display(), parent.display())]
    DestinationParentMissing { path: PathBuf, parent: PathBuf },
    #[error("{}: refused, nothing was created: the source does not verify ({} finding{}):\n  {}", path.display(), findings.len(), if findings.len() == 1 { "" } else { "s" }, findings.join("\n  "))]
    SourceRefused {
        path: PathBuf,
        findings: Vec<String>,
    },
    #[error("{}: nothing to migrate ({detail}); nothing was created at {}", path.display(), destination.display())]
    NothingToMigrate {
        path: PathBuf,
        destination: PathBuf,
        detail: String,
    },
    #[error(transparent)]
    SourceOpen(#[from] SqliteOpenError),
    #[error("{}: {context}: {source}", path.display())]
    Io {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {context}: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: rusqlite::Error,
    },
}

/// The sidecars SQLite may keep beside a database.
pub use crate::storage::sqlite::SIDECARS as SQLITE_SIDECARS;

use crate::storage::sqlite::sidecar_path as with_suffix;

fn exists(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// Refuses a database destination that exists, or any of whose sidecars
/// does.
pub fn check_database_destination(db: &Path) -> Result<(), MigrateError> {
    match crate::storage::sqlite::occupied_destination(db) {
        Some(what) => Err(MigrateError::DestinationExists {
            path: db.to_path_buf(),
            what,
        }),
        None => Ok(()),
    }
}

/// Refuses a snapshot directory destination that is not a directory, or
/// is a directory that holds anything.
pub fn check_dir_destination(dir: &Path) -> Result<(), MigrateError> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(MigrateError::Io {
                path: dir.to_path_buf(),
                context: "looking at the destination",
                source,
            })
        }
    };
    if !meta.is_dir() {
        return Err(MigrateError::DestinationExists {
            path: dir.to_path_buf(),
            what: "exists and is not a directory".into(),
        });
    }
    let entries = fs::read_dir(dir).map_err(|source| MigrateError::Io {
        path: dir.to_path_buf(),
        context: "listing the destination",
        source,
    })?;
    // The new directory is renamed over this one, which replaces only an
    // empty directory: anything in it (a lock file included) is refused
    // here by name rather than at the end.
    match entries.into_iter().next() {
        None => Ok(()),
        Some(Err(source)) => Err(MigrateError::Io {
            path: dir.to_path_buf(),
            context: "listing the destination",
            source,
        }),
        Some(Ok(entry)) => Err(MigrateError::DestinationExists {
            path: dir.to_path_buf(),
            what: format!(
                "is a directory that is not empty (it holds {})",
                entry.file_name().to_string_lossy()
            ),
        }),
    }
}

/// A lock this migration holds, and whether taking it created its file.
struct HeldLock {
    guard: LockGuard,
    path: PathBuf,
    created: bool,
}

impl HeldLock {
    fn take(what: String, path: PathBuf) -> Result<HeldLock, MigrateError> {
        let existed = exists(&path);
        let guard = lock::acquire(&path).map_err(|source| MigrateError::Locked { what, source })?;
        Ok(HeldLock {
            guard,
            path,
            created: !existed,
        })
    }

    /// Lets the lock go after a migration that leaves nothing behind: the
    /// lock file goes too when this migration created it, and never when it
    /// was there before (a broker's, or the operator's). A lock file left
    /// beside a refused source would be the one trace of a command that
    /// says it created nothing, and inside an empty directory it would
    /// make that directory refused as a destination ("not empty").
    ///
    /// The file is unlinked while still held, then let go: were it let go
    /// first, a broker starting in between could take it and then lose its
    /// file, and a second broker would start beside the first.
    fn release_leaving_nothing(self) {
        if self.created {
            let _ = fs::remove_file(&self.path);
        }
        drop(self.guard);
    }
}

/// What the source held, read and validated, with its lock.
struct SourceRead {
    /// Each unit with the counts the destination must show.
    units: Vec<(Unit, Counts)>,
    failures: Vec<ReadFailure>,
    warnings: Vec<String>,
    legacy: Option<LegacyCounts>,
    lock: Option<HeldLock>,
}

impl SourceRead {
    /// Ends a migration that created nothing (see [`HeldLock::release_leaving_nothing`]).
    fn refused(self) {
        if let Some(lock) = self.lock {
            lock.release_leaving_nothing();
        }
    }
}

/// The 16 bytes every SQLite database file begins with.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Refuses a snapshot directory source that is missing or is not a
/// directory, before its lock (inside it) is taken.
fn check_dir_source(dir: &Path) -> Result<(), MigrateError> {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(MigrateError::SourceNotUsable {
            path: dir.to_path_buf(),
            detail: "is not a snapshot directory".into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(MigrateError::SourceMissing {
            path: dir.to_path_buf(),
            what: "snapshot directory",
        }),
        Err(source) => Err(MigrateError::Io {
            path: dir.to_path_buf(),
            context: "looking at the source",
            source,
        }),
    }
}

/// Refuses a database source that is missing, is not a regular file (a
/// symbolic link is followed, as SQLite follows it), or does not begin with
/// SQLite's header - before its lock is taken, because taking it creates
/// `DB.lock` beside whatever was named, and a directory or a configuration
/// file given by mistake is refused with nothing created. The header needs
/// no lock to be read: SQLite never rewrites those bytes of a database.
fn check_database_source(db: &Path) -> Result<(), MigrateError> {
    use std::io::Read;

    let not_usable = |detail: String| MigrateError::SourceNotUsable {
        path: db.to_path_buf(),
        detail: format!("{detail}; nothing was created"),
    };
    let io = |source| MigrateError::Io {
        path: db.to_path_buf(),
        context: "looking at the source",
        source,
    };
    let kind_of = |meta: &fs::Metadata| {
        read::SpecialKind::of(meta).map(|kind| match kind {
            read::SpecialKind::Directory => not_usable(
                "is a directory, not a sqlite database (a snapshot directory is read by saguin migrate to-sqlite)".into(),
            ),
            kind => not_usable(format!("is {kind}, not a sqlite database")),
        })
    };
    match fs::metadata(db) {
        Ok(meta) => {
            if let Some(refused) = kind_of(&meta) {
                return Err(refused);
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MigrateError::SourceMissing {
                path: db.to_path_buf(),
                what: "database",
            })
        }
        Err(e) => return Err(io(e)),
    }
    // Non-blocking, and checked again once open: a path swapped for a FIFO
    // meanwhile is refused rather than waited on.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(db)
        .map_err(io)?;
    if let Some(refused) = kind_of(&file.metadata().map_err(io)?) {
        return Err(refused);
    }
    let mut header = Vec::with_capacity(SQLITE_HEADER.len());
    file.take(SQLITE_HEADER.len() as u64)
        .read_to_end(&mut header)
        .map_err(io)?;
    if header.is_empty() {
        return Err(not_usable("is empty, not a sqlite database".into()));
    }
    if header != SQLITE_HEADER {
        return Err(not_usable(
            "is not a sqlite database (it does not begin with SQLite's header)".into(),
        ));
    }
    Ok(())
}

/// Takes the source's lock and reads it; a refusal lets the lock go,
/// leaving nothing behind.
fn read_source(source: &Source, carry: Carry) -> Result<SourceRead, MigrateError> {
    let lock = match source {
        Source::SnapshotDir(dir) => {
            check_dir_source(dir)?;
            Some(HeldLock::take(
                format!("snapshot directory {}", dir.display()),
                lock::lock_path_for_snapshot_dir(dir),
            )?)
        }
        Source::Sqlite(db) => {
            check_database_source(db)?;
            Some(HeldLock::take(
                format!("database {}", db.display()),
                lock::lock_path_for_database(db),
            )?)
        }
        Source::Mbmqtt { .. } => None,
    };
    match read_locked(source, carry) {
        Ok(read) => Ok(SourceRead { lock, ..read }),
        Err(e) => {
            if let Some(lock) = lock {
                lock.release_leaving_nothing();
            }
            Err(e)
        }
    }
}

/// Reads the source, whose lock [`read_source`] holds; a snapshot
/// directory's channels as `carry` says.
fn read_locked(source: &Source, carry: Carry) -> Result<SourceRead, MigrateError> {
    match source {
        Source::SnapshotDir(dir) => {
            let read =
                snapshots::read_dir(dir, &ScanOptions::default(), carry).map_err(|e| match e {
                    ScanError::Read(r) => read_error(r),
                    other => MigrateError::SourceNotUsable {
                        path: dir.clone(),
                        detail: other.to_string(),
                    },
                })?;
            // The checker is the migrator: a directory `snapshot verify`
            // answers no for is not read from at all.
            if !read.refusals.is_empty() {
                return Err(MigrateError::SourceRefused {
                    path: dir.clone(),
                    findings: read.refusals,
                });
            }
            Ok(SourceRead {
                units: read
                    .units
                    .into_iter()
                    .map(|u| {
                        let c = u.counts();
                        (u, c)
                    })
                    .collect(),
                failures: read.failures,
                warnings: read.warnings,
                legacy: None,
                lock: None,
            })
        }
        Source::Sqlite(db) => {
            let sidecars_before: Vec<bool> = ["-wal", "-shm"]
                .iter()
                .map(|s| exists(&with_suffix(db, s)))
                .collect();
            let read = (|| {
                let conn = sqlite::open_read_only(db)?;
                let sql_err = |source| MigrateError::Sqlite {
                    path: db.clone(),
                    context: "reading the database",
                    source,
                };
                // One read transaction: the verification, every unit and
                // its counts are the same moment.
                let tx = conn.unchecked_transaction().map_err(sql_err)?;
                let verification = sqlite::verify::verify(&tx);
                if !verification.is_ok() {
                    return Err(MigrateError::SourceRefused {
                        path: db.clone(),
                        findings: verification.lines(),
                    });
                }
                let (units, failures) = read_units(&tx).map_err(sql_err)?;
                let mut counted = Vec::with_capacity(units.len());
                for u in units {
                    let c = count_unit(&tx, &u).map_err(sql_err)?;
                    counted.push((u, c));
                }
                drop(tx);
                drop(conn);
                Ok::<_, MigrateError>((counted, failures))
            })();
            remove_reader_sidecars(db, &sidecars_before);
            let (units, mut failures) = read?;
            let mut checked = Vec::with_capacity(units.len());
            for (mut u, rows) in units {
                let read_whole = rows.differences(&u.counts());
                let verdict = if read_whole.is_empty() {
                    u.validate()
                } else {
                    Err(format!(
                        "the rows read differ from the rows the database holds: {}",
                        read_whole.join(", ")
                    ))
                };
                match verdict {
                    Ok(()) => checked.push((u, rows)),
                    Err(error) => failures.push(ReadFailure {
                        name: u.name().to_owned(),
                        kind: u.kind(),
                        error: format!("{}: {error}", db.display()),
                    }),
                }
            }
            // A unit the broker's loader would refuse fails the source.
            if !failures.is_empty() {
                return Err(MigrateError::SourceRefused {
                    path: db.clone(),
                    findings: failures
                        .into_iter()
                        .map(|f| format!("{} {}: {}", f.kind, f.name, f.error))
                        .collect(),
                });
            }
            Ok(SourceRead {
                units: checked,
                failures,
                warnings: Vec::new(),
                legacy: None,
                lock: None,
            })
        }
        Source::Mbmqtt { path, max_bytes } => {
            let bytes = read::read_bounded(path, *max_bytes).map_err(read_error)?;
            let snapshot = saguin_format::mbmqtt::decode(&bytes).map_err(|e| {
                MigrateError::SourceNotUsable {
                    path: path.clone(),
                    detail: format!("MBMQTT01: {e}"),
                }
            })?;
            drop(bytes);
            let imported = import_mbmqtt(&snapshot, now_nanos());
            let mut failures = Vec::new();
            let mut units = Vec::new();
            for (mut u, c) in imported.units {
                match u.validate() {
                    Ok(()) => units.push((u, c)),
                    Err(error) => failures.push(ReadFailure {
                        name: u.name().to_owned(),
                        kind: u.kind(),
                        error: format!("{}: as imported: {error}", path.display()),
                    }),
                }
            }
            let mut warnings = Vec::new();
            if imported.legacy.inbound_qos2_dropped > 0 {
                warnings.push(format!(
                    "{}: {} inbound QoS 2 packet ids awaiting PUBREL are not carried: the format keeps no message to hold for them",
                    path.display(),
                    imported.legacy.inbound_qos2_dropped
                ));
            }
            Ok(SourceRead {
                units,
                failures,
                warnings,
                legacy: Some(imported.legacy),
                lock: None,
            })
        }
    }
}

/// A read-only connection to a WAL database creates its `-wal` and `-shm`
/// when they are absent (a stopped broker leaves neither) and cannot remove
/// them. With the provider's lock held no broker has the file open, so the
/// ones this read created - and only those, and the log only while empty -
/// are removed again: the source directory is left as it was found, but for
/// its lock file.
fn remove_reader_sidecars(db: &Path, existed_before: &[bool]) {
    let wal = with_suffix(db, "-wal");
    let shm = with_suffix(db, "-shm");
    let wal_created = !existed_before.first().copied().unwrap_or(true);
    let shm_created = !existed_before.get(1).copied().unwrap_or(true);
    let wal_empty = fs::symlink_metadata(&wal).map(|m| m.is_file() && m.len() == 0);
    if wal_created && shm_created && matches!(wal_empty, Ok(true)) {
        let _ = fs::remove_file(&wal);
        let _ = fs::remove_file(&shm);
    }
}

fn read_error(e: ReadError) -> MigrateError {
    match e {
        ReadError::NotFound { path } => MigrateError::SourceMissing { path, what: "file" },
        other => MigrateError::SourceNotUsable {
            path: other.path().to_path_buf(),
            detail: other.reason(),
        },
    }
}

/// Runs a migration from `source` into `destination`. `Err` when it could
/// not start (nothing was created); otherwise the report says what became of
/// every unit.
pub fn migrate(
    source: &Source,
    destination: &Destination,
    progress: &dyn Progress,
) -> Result<Report, MigrateError> {
    let started = Instant::now();
    check_parent(destination.path())?;
    match destination {
        Destination::Sqlite(db) => check_database_destination(db)?,
        Destination::SnapshotDir(dir) => check_dir_destination(dir)?,
    }
    // Into a database each channel's records are carried from its file as
    // they are written; into a directory the writer takes them whole.
    let carry = match destination {
        Destination::Sqlite(_) => Carry::FromFiles,
        Destination::SnapshotDir(_) => Carry::Whole,
    };
    let mut read = read_source(source, carry)?;
    let mut report = Report {
        source: source.path().to_path_buf(),
        destination: destination.path().to_path_buf(),
        units: Vec::new(),
        failures: Vec::new(),
        warnings: std::mem::take(&mut read.warnings),
        legacy: read.legacy.take(),
        elapsed: Duration::ZERO,
        destination_removed: false,
    };
    for f in &read.failures {
        report.units.push(UnitReport {
            name: f.name.clone(),
            kind: f.kind.to_owned(),
            counts_in: None,
            counts_out: None,
            error: Some(f.error.clone()),
        });
    }
    if read.units.is_empty() {
        let nothing = read.failures.is_empty();
        read.refused();
        if nothing {
            return Err(MigrateError::NothingToMigrate {
                path: source.path().to_path_buf(),
                destination: destination.path().to_path_buf(),
                detail: match source {
                    Source::SnapshotDir(_) => "the directory holds no snapshot file".into(),
                    Source::Sqlite(_) => {
                        "the database holds no channel, no retained message and no session".into()
                    }
                    Source::Mbmqtt { .. } => {
                        "the file holds no session and no retained message".into()
                    }
                },
            });
        }
        // Every unit was refused: nothing is created, every refusal named.
        report.elapsed = started.elapsed();
        return Ok(report);
    }
    progress.start(read.units.iter().map(|(u, _)| u.weight()).sum());
    match destination {
        Destination::Sqlite(db) => to_sqlite(db, &read.units, progress, &mut report)?,
        Destination::SnapshotDir(dir) => to_snapshots(dir, read.units, progress, &mut report)?,
    }
    drop(read.lock);
    report.elapsed = started.elapsed();
    Ok(report)
}

fn check_counts(name: &str, kind: &str, expected: Counts, out: Counts) -> UnitReport {
    let differences = expected.differences(&out);
    UnitReport {
        name: name.to_owned(),
        kind: kind.to_owned(),
        counts_in: Some(expected),
        counts_out: Some(out),
        error: (!differences.is_empty()).then(|| {
            format!(
                "counts out differ from counts in: {}",
                differences.join(", ")
            )
        }),
    }
}

/// Creates the database file 0600 (never over an existing one), then the
/// schema with its version and meta row in one transaction.
fn create_database(db: &Path) -> Result<Connection, MigrateError> {
    let io = |context, source| MigrateError::Io {
        path: db.to_path_buf(),
        context,
        source,
    };
    let sql = |context, source| MigrateError::Sqlite {
        path: db.to_path_buf(),
        context,
        source,
    };
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(db)
        .map_err(|e| io("creating the database file", e))?;
    let mut conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sql("opening the new database", e))?;
    // The provider's page size (set before anything is written). While the
    // file is filled it keeps a rollback journal: a unit's transaction is
    // still all or nothing, and pages new to the file are written once
    // rather than to a write-ahead log and again at the checkpoint. It is
    // put in WAL mode, as the provider keeps it, once every unit is in.
    // Nothing is synced while it is filled: the file is under its staging
    // name until it is counted, synced and linked into place, and a crash
    // before that leaves nothing at the destination. A sync at each unit's
    // commit (three, with the rollback journal) made a directory of 10,000
    // channels take 9.9 s, 30,000 fsyncs.
    conn.execute_batch(&format!(
        "PRAGMA page_size = {PAGE_SIZE}; PRAGMA journal_mode = DELETE; PRAGMA synchronous = OFF; PRAGMA cache_size = -65536;"
    ))
    .map_err(|e| sql("setting up the new database", e))?;
    sqlite::schema::apply_or_check(&mut conn, db, WRITER_REVISION, now_nanos())?;
    Ok(conn)
}

fn remove_database(db: &Path) {
    let _ = fs::remove_file(db);
    for suffix in SQLITE_SIDECARS {
        let _ = fs::remove_file(with_suffix(db, suffix));
    }
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    fs::File::open(parent_of(path))?.sync_all()
}

/// Refuses a destination whose directory is not there
/// ([`storage::check_parent`](crate::storage::check_parent)).
fn check_parent(dest: &Path) -> Result<(), MigrateError> {
    crate::storage::check_parent(dest).map_err(|no| match no {
        NoParent::Missing(parent) => MigrateError::DestinationParentMissing {
            path: dest.to_path_buf(),
            parent,
        },
        NoParent::Unreadable(path, source) => MigrateError::Io {
            path,
            context: "looking at the destination's directory",
            source,
        },
    })
}

/// The temporary name a destination is built under, beside it (a rename
/// is atomic only within one file system): `.<name>.<pid>.migrate.tmp`.
/// A migration stopped before the end leaves only this behind, which
/// blocks nothing: the destination itself never existed.
pub fn staging_path(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "migrate".into());
    parent_of(dest).join(format!(".{name}.{}.migrate.tmp", std::process::id()))
}

fn to_sqlite(
    db: &Path,
    units: &[(Unit, Counts)],
    progress: &dyn Progress,
    report: &mut Report,
) -> Result<(), MigrateError> {
    let guard = HeldLock::take(
        format!("database {}", db.display()),
        lock::lock_path_for_database(db),
    )?;
    let release = HeldLock::release_leaving_nothing;
    // Built under a temporary name and linked into place only once counted:
    // a migration stopped half way leaves nothing at DB to be mistaken for
    // a database or to block a retry.
    let staged = staging_path(db);
    if let Err(e) = check_database_destination(&staged) {
        release(guard);
        return Err(e);
    }
    let mut conn = match create_database(&staged) {
        Ok(c) => c,
        Err(e) => {
            if !matches!(e, MigrateError::Io { .. }) {
                remove_database(&staged);
            }
            release(guard);
            return Err(e);
        }
    };
    let mut written = Vec::with_capacity(units.len());
    for (unit, expected) in units {
        progress.unit(unit.name());
        match write_unit(&mut conn, unit, &|n| progress.advance(n)) {
            Ok(()) => written.push((unit, *expected)),
            Err(e) => report.units.push(UnitReport {
                name: unit.name().to_owned(),
                kind: unit.kind().to_owned(),
                counts_in: Some(*expected),
                counts_out: None,
                error: Some(format!("{}: not written: {e}", db.display())),
            }),
        }
    }
    progress.verifying();
    let finish = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        .and_then(|mode| {
            if mode.eq_ignore_ascii_case("wal") {
                Ok(())
            } else {
                Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
                    Some(format!("the journal mode stayed {mode}")),
                ))
            }
        });
    if let Err(e) = finish {
        report.failures.push(format!(
            "{}: putting the new database in WAL mode: {e}",
            db.display()
        ));
    }
    if let Err((_, e)) = conn.close() {
        report
            .failures
            .push(format!("{}: closing the new database: {e}", db.display()));
    }
    // Counts out, read back from the file as it now stands on disk.
    // Read-write (and query_only) so that closing it, as the last
    // connection, removes the -wal and -shm it opens: the new database is
    // left as one file.
    let counted = Connection::open_with_flags(
        &staged,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|conn| conn.execute_batch("PRAGMA query_only = 1").map(|()| conn))
    .map_err(|e| {
        format!(
            "{}: opening the new database to count it: {e}",
            db.display()
        )
    })
    .and_then(|conn| {
        // The destination passes the checks its source passed.
        let verification = sqlite::verify::verify(&conn);
        if !verification.is_ok() {
            return Err(format!(
                "{}: the new database does not verify: {}",
                db.display(),
                verification.lines().join("; ")
            ));
        }
        written
            .iter()
            .map(|(unit, expected)| {
                count_unit(&conn, unit)
                    .map(|out| check_counts(unit.name(), unit.kind(), *expected, out))
                    .map_err(|e| format!("{}: counting {}: {e}", db.display(), unit.name()))
            })
            .collect::<Result<Vec<_>, String>>()
    });
    let proven = counted.is_ok();
    match counted {
        Ok(list) => report.units.extend(list),
        Err(e) => {
            report.failures.push(e);
            for (unit, expected) in &written {
                report.units.push(UnitReport {
                    name: unit.name().to_owned(),
                    kind: unit.kind().to_owned(),
                    counts_in: Some(*expected),
                    counts_out: None,
                    error: Some("not counted out".into()),
                });
            }
        }
    }
    if written.is_empty() || !proven {
        remove_database(&staged);
        report.destination_removed = true;
        release(guard);
        return Ok(());
    }
    let placed = fs::File::open(&staged)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("{}: making the new database durable: {e}", db.display()))
        // A link fails where a rename would replace: nothing that appeared
        // at DB meanwhile is overwritten.
        .and_then(|()| {
            fs::hard_link(&staged, db).map_err(|e| {
                format!(
                    "{}: moving the new database into place from {}: {e}",
                    db.display(),
                    staged.display()
                )
            })
        })
        .and_then(|()| {
            let _ = fs::remove_file(&staged);
            sync_parent(db).map_err(|e| {
                format!(
                    "{}: making the new database's name durable: {e}",
                    db.display()
                )
            })
        });
    match placed {
        // The lock file stays beside the new database, as a broker's would.
        Ok(()) => drop(guard),
        Err(e) => {
            report.failures.push(e);
            remove_database(&staged);
            report.destination_removed = !exists(db);
            release(guard);
        }
    }
    Ok(())
}

fn to_snapshots(
    dir: &Path,
    units: Vec<(Unit, Counts)>,
    progress: &dyn Progress,
    report: &mut Report,
) -> Result<(), MigrateError> {
    // Built under a temporary name beside DIR and renamed into place once
    // read back and counted. The rename is the guard against a broker
    // starting on DIR meanwhile: it fails rather than replace a directory
    // that holds anything, and a broker's lock file is something.
    let staged = staging_path(dir);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staged)
        .map_err(|source| MigrateError::Io {
            path: staged.clone(),
            context: "creating the temporary snapshot directory",
            source,
        })?;
    let remove_staged = || {
        let _ = fs::remove_dir_all(&staged);
    };
    // The units move into the writer's copy (no record is copied); what is
    // checked afterwards is kept aside.
    let expected: Vec<(String, &'static str, Counts, u64)> = units
        .iter()
        .map(|(u, c)| (u.name().to_owned(), u.kind(), *c, u.weight()))
        .collect();
    let (copy, options, refused) =
        snapshots::provider_copy(units.into_iter().map(|(u, _)| u).collect(), now_nanos());
    for (name, error) in &refused {
        report.units.push(UnitReport {
            name: name.clone(),
            kind: "channel".into(),
            counts_in: None,
            counts_out: None,
            error: Some(error.clone()),
        });
    }
    progress.unit("snapshot files");
    let written = snapshots::write_dir(&staged, &copy, &options);
    drop(copy);
    progress.advance(expected.iter().map(|(_, _, _, w)| w).sum());
    let mut failed_units = std::collections::BTreeMap::new();
    for f in &written.failed {
        let unit = snapshots::unit_of_written(&f.name);
        if expected.iter().any(|(name, ..)| *name == unit) {
            failed_units.insert(unit, f.to_string());
        } else {
            report.failures.push(f.to_string());
        }
    }
    progress.verifying();
    // Counted, not held: only the counts are compared.
    let read_back = snapshots::read_dir(&staged, &ScanOptions::default(), Carry::FromFiles);
    let (found, back_failures) = match read_back {
        Ok(back) => {
            // The destination passes the checks its source passed.
            report
                .failures
                .extend(back.refusals.iter().map(|r| format!("reading back: {r}")));
            let units: std::collections::BTreeMap<String, Unit> = back
                .units
                .into_iter()
                .map(|u| (u.name().to_owned(), u))
                .collect();
            (units, back.failures)
        }
        Err(e) => {
            report
                .failures
                .push(format!("{}: reading back: {e}", dir.display()));
            Default::default()
        }
    };
    let mut any_written = false;
    for (name, kind, counts_in, _) in &expected {
        if refused.iter().any(|(n, _)| n == name) {
            continue;
        }
        let failed = |error: String| UnitReport {
            name: name.clone(),
            kind: (*kind).to_owned(),
            counts_in: Some(*counts_in),
            counts_out: None,
            error: Some(error),
        };
        if let Some(error) = failed_units.get(name) {
            report.units.push(failed(error.clone()));
            continue;
        }
        match found.get(name) {
            Some(back) => {
                any_written = true;
                report
                    .units
                    .push(check_counts(name, kind, *counts_in, back.counts()));
            }
            None => {
                let why = back_failures
                    .iter()
                    .find(|f| f.name == *name)
                    .map(|f| f.error.clone())
                    .unwrap_or_else(|| {
                        "written, and not found when the directory was read back".into()
                    });
                report.units.push(failed(why));
            }
        }
    }
    if !any_written {
        remove_staged();
        report.destination_removed = true;
        return Ok(());
    }
    // Over an empty directory a rename replaces it; over anything else it
    // fails, and nothing is replaced.
    let placed = fs::rename(&staged, dir)
        .map_err(|e| {
            format!(
                "{}: moving the new directory into place from {}: {e}",
                dir.display(),
                staged.display()
            )
        })
        .and_then(|()| {
            sync_parent(dir).map_err(|e| {
                format!(
                    "{}: making the new directory's name durable: {e}",
                    dir.display()
                )
            })
        });
    if let Err(e) = placed {
        report.failures.push(e);
        remove_staged();
        report.destination_removed = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
