//! `saguin sqlite backup`: an online, consistent, verified copy of a sqlite
//! provider's database, taken while a broker writes to it.
//!
//! cp is not a backup of a WAL database, and VACUUM INTO does not fsync its
//! output. This copy is SQLite's online backup, read from a
//! read-only connection (never `immutable=1`, which would ignore the
//! write-ahead log) that holds one read transaction for the whole copy, so
//! every page comes from one moment while the broker goes on committing.
//! Inside that same transaction the source's row counts are taken: they are
//! the counts of exactly the moment copied.
//!
//! The copy goes to a temporary name in the destination's directory, created
//! 0600. It is then proved - `PRAGMA integrity_check` answers `ok`, the
//! schema version is 20, the row invariants of `saguin sqlite verify` hold
//! ([`super::sqlite::verify`]), every table holds the rows the source held at
//! that moment - fsynced, linked to its final name (which fails rather than
//! replacing anything that appeared meanwhile), and the directory fsynced.
//! Only then is success reported. Any failure removes the temporary file and
//! leaves nothing at the destination; a destination without room (or
//! failing) is named, with what its file system said.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{ffi, Connection, OpenFlags};

use super::sqlite::schema::row_counts;
use super::sqlite::{self, SqliteOpenError, SCHEMA_VERSION};

/// Pages copied per step: small enough for a smooth progress bar, large
/// enough that the per-step cost vanishes.
const PAGES_PER_STEP: i32 = 1024;
/// How long a busy or locked step is retried before the backup gives up.
const BUSY_PATIENCE: Duration = Duration::from_secs(30);

/// The sidecars SQLite may keep beside a database.
use crate::storage::sqlite::{occupied_destination, sidecar_path, SIDECARS};
use crate::storage::{parent_of, NoParent};

/// Why a backup was not taken. Nothing is left at the destination.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{}: {what}; a backup never writes over anything", path.display())]
    DestinationExists { path: PathBuf, what: String },
    #[error("{}: the parent directory {} does not exist; a backup creates only the destination itself", path.display(), parent.display())]
    DestinationParentMissing { path: PathBuf, parent: PathBuf },
    #[error("{}: no such database", path.display())]
    SourceMissing { path: PathBuf },
    #[error(transparent)]
    SourceOpen(#[from] SqliteOpenError),
    #[error("{}: {context}: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: {context}: {source}", path.display())]
    Io {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The destination's file system has less free than the copy takes:
    /// refused before a page is written.
    #[error("{}: its file system has {free} bytes of space free and the copy needs {needs}{}; nothing was written: free space there, or back up to another file system", path.display(), if *.beside_source { " (the database's own file system, which the broker writes to as well)" } else { "" })]
    DestinationShort {
        path: PathBuf,
        free: u64,
        needs: u64,
        beside_source: bool,
    },
    /// The destination's file system has fewer files left than the copy
    /// opens beside it: refused before a page is written, or found so when
    /// the copy failed (another process took the last files meanwhile),
    /// the copy then removed.
    #[error("{}: its file system lets {free} more files be made and the copy needs {needs} (itself, its journal, its log and its index); nothing was written: free some there, or back up to another file system", path.display())]
    DestinationOutOfFiles {
        path: PathBuf,
        free: u64,
        needs: u64,
    },
    /// The copy was made and does not prove itself; it was removed.
    #[error("{}: the copy does not verify: {detail}; it was removed", path.display())]
    Verify { path: PathBuf, detail: String },
}

impl BackupError {
    /// True when the copy was made and failed its proof (the answer is "no")
    /// rather than the work not being possible.
    pub fn is_verification(&self) -> bool {
        matches!(self, BackupError::Verify { .. })
    }
}

/// What a backup copied and proved.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BackupReport {
    pub source: PathBuf,
    pub destination: PathBuf,
    /// Every table with its rows, at the moment copied (equal in both).
    pub tables: Vec<(String, u64)>,
    pub rows: u64,
    /// Pages times page size of the copy.
    pub bytes: u64,
    pub pages: u64,
    pub schema_version: i64,
    /// `ok`.
    pub integrity_check: String,
    #[serde(skip)]
    pub elapsed: Duration,
}

impl BackupReport {
    /// Megabytes (10^6 bytes) a second.
    pub fn mb_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.bytes as f64 / 1e6 / secs
        } else {
            0.0
        }
    }
}

/// Refuses a destination that exists, or whose `-wal`, `-shm` or `-journal`
/// does: SQLite would read any of them as part of the copy.
pub fn check_destination(dest: &Path) -> Result<(), BackupError> {
    match occupied_destination(dest) {
        Some(what) => Err(BackupError::DestinationExists {
            path: dest.to_path_buf(),
            what,
        }),
        None => Ok(()),
    }
}

/// The files a copy makes: itself, its journal, and the log and index
/// SQLite opens beside it while the copy is in WAL mode.
const FILES_BESIDE_THE_COPY: u64 = 4;

/// Above the copy's pages, what its file system is asked to have free: the
/// copy's journal while it is written, and what else writes there meanwhile.
const ROOM_BEYOND_THE_COPY: u64 = 1 << 20;

/// Refuses a copy of `source` (as it stands: it grows little while the
/// copy is begun) that the file system under `dest` has no room for,
/// before a page is written: a copy that fills the file system would fail at its
/// end all the same, and one beside the database would have the broker's
/// writes refused for want of room while it ran.
fn check_room(db: &Path, source: &Connection, dest: &Path) -> Result<(), BackupError> {
    let pragma = |name: &str| -> Result<u64, BackupError> {
        source
            .query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .map_err(|e| BackupError::Sqlite {
                path: db.to_path_buf(),
                context: "reading the database's size",
                source: e,
            })
    };
    let needs = pragma("page_count")?
        .saturating_mul(pragma("page_size")?)
        .saturating_add(ROOM_BEYOND_THE_COPY);
    let dir = parent_of(dest);
    let Some((free, files)) = crate::storage::room::available(&dir) else {
        return Ok(());
    };
    if let Some(free) = files.filter(|&f| f < FILES_BESIDE_THE_COPY) {
        return Err(BackupError::DestinationOutOfFiles {
            path: dest.to_path_buf(),
            free,
            needs: FILES_BESIDE_THE_COPY,
        });
    }
    if free < needs {
        use std::os::unix::fs::MetadataExt;
        // The database's own device, through any link to it.
        let device = |path: &Path| fs::metadata(path).map(|m| m.dev()).ok();
        let beside_source = device(&dir).is_some_and(|d| device(db) == Some(d));
        return Err(BackupError::DestinationShort {
            path: dest.to_path_buf(),
            free,
            needs,
            beside_source,
        });
    }
    Ok(())
}

/// Refuses a destination whose directory is not there
/// ([`storage::check_parent`](crate::storage::check_parent)).
fn check_parent(dest: &Path) -> Result<(), BackupError> {
    crate::storage::check_parent(dest).map_err(|no| match no {
        NoParent::Missing(parent) => BackupError::DestinationParentMissing {
            path: dest.to_path_buf(),
            parent,
        },
        NoParent::Unreadable(path, source) => BackupError::Io {
            path,
            context: "looking at the destination's directory",
            source,
        },
    })
}

/// The temporary name in `dest`'s directory.
fn temp_path(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "backup".into());
    let tmp = format!(".{name}.{}.backup.tmp", std::process::id());
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.join(tmp),
        _ => PathBuf::from(tmp),
    }
}

fn remove_with_sidecars(path: &Path) {
    let _ = fs::remove_file(path);
    for suffix in SIDECARS {
        let _ = fs::remove_file(sidecar_path(path, suffix));
    }
}

/// SQLite's online backup between two open connections, stepping
/// [`PAGES_PER_STEP`] pages at a time and telling `progress` (pages done,
/// pages in all) after each step. A source that stays busy for longer than
/// [`BUSY_PATIENCE`] fails the copy rather than hanging it.
fn copy_pages(
    source: &Connection,
    dest: &mut Connection,
    progress: &dyn Fn(u64, u64),
) -> Result<u64, CopyFailed> {
    use rusqlite::backup::{Backup, StepResult};
    let backup = Backup::new(source, dest).map_err(CopyFailed::Sqlite)?;
    let mut busy_since: Option<Instant> = None;
    loop {
        let step = backup.step(PAGES_PER_STEP).map_err(CopyFailed::Sqlite)?;
        let p = backup.progress();
        let total = p.pagecount.max(0) as u64;
        let left = p.remaining.max(0) as u64;
        progress(total.saturating_sub(left), total);
        match step {
            StepResult::Done => return Ok(total),
            StepResult::More => busy_since = None,
            // Busy, Locked, and any future variant: wait a little, bounded.
            _ => {
                let since = *busy_since.get_or_insert_with(Instant::now);
                if since.elapsed() > BUSY_PATIENCE {
                    return Err(CopyFailed::Busy(format!(
                        "the database stayed busy for {BUSY_PATIENCE:?}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Why pages were not copied.
enum CopyFailed {
    Sqlite(rusqlite::Error),
    Busy(String),
}

/// Copies `db` to `dest` and proves the copy. `progress` is told (pages
/// done, pages in all) as the copy advances.
pub fn backup(
    db: &Path,
    dest: &Path,
    progress: &dyn Fn(u64, u64),
) -> Result<BackupReport, BackupError> {
    let started = Instant::now();
    // Before the source is opened: a reader of a WAL database may leave
    // -wal and -shm beside it, and a refusal leaves nothing anywhere.
    check_parent(dest)?;
    check_destination(dest)?;
    if let Err(e) = fs::symlink_metadata(db) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Err(BackupError::SourceMissing {
                path: db.to_path_buf(),
            });
        }
    }
    let source = sqlite::open_read_only(db)?;
    // Before the read transaction: a refusal holds the broker's log back
    // for no time at all.
    check_room(db, &source, dest)?;
    let tmp = temp_path(dest);
    check_destination(&tmp).map_err(|_| BackupError::DestinationExists {
        path: dest.to_path_buf(),
        what: format!("the temporary name {} is taken", tmp.display()),
    })?;
    let result = copy_and_prove(db, &source, &tmp, dest, progress);
    drop(source);
    match result {
        Ok((tables, pages, page_size)) => {
            let rows = tables.iter().map(|(_, n)| n).sum();
            Ok(BackupReport {
                source: db.to_path_buf(),
                destination: dest.to_path_buf(),
                tables,
                rows,
                bytes: pages * page_size,
                pages,
                schema_version: SCHEMA_VERSION,
                integrity_check: "ok".into(),
                elapsed: started.elapsed(),
            })
        }
        Err(e) => {
            // Asked before the copy's own files are removed, which frees
            // what they took.
            let e = out_of_files(dest, &tmp, e);
            remove_with_sidecars(&tmp);
            Err(e)
        }
    }
}

/// A failure of the copy (`tmp`, to become `dest`) where its file system
/// has no file left to make is that failure: SQLite says of a journal or
/// log it could not create only "unable to open database file", against
/// the temporary copy, when another process took the last files after
/// [`check_room`].
fn out_of_files(dest: &Path, tmp: &Path, e: BackupError) -> BackupError {
    let of_the_copy = match &e {
        BackupError::Sqlite { path, .. } | BackupError::Io { path, .. } => {
            path == tmp || path == dest
        }
        _ => false,
    };
    match crate::storage::room::available(&parent_of(dest)) {
        Some((_, Some(0))) if of_the_copy => BackupError::DestinationOutOfFiles {
            path: dest.to_path_buf(),
            free: 0,
            needs: FILES_BESIDE_THE_COPY,
        },
        _ => e,
    }
}

type Copied = (Vec<(String, u64)>, u64, u64);

fn copy_and_prove(
    db: &Path,
    source: &Connection,
    tmp: &Path,
    dest: &Path,
    progress: &dyn Fn(u64, u64),
) -> Result<Copied, BackupError> {
    let src_err = |context, source| BackupError::Sqlite {
        path: db.to_path_buf(),
        context,
        source,
    };
    let tmp_err = |context, source| BackupError::Sqlite {
        path: tmp.to_path_buf(),
        context,
        source,
    };
    let io = |path: &Path, context, source| BackupError::Io {
        path: path.to_path_buf(),
        context,
        source,
    };
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(|e| io(tmp, "creating the temporary copy", e))?;

    // One read transaction on the source for the counts and every page: the
    // counts are those of the moment the copy holds.
    source
        .execute_batch("BEGIN DEFERRED")
        .map_err(|e| src_err("opening a read transaction", e))?;
    let counted = row_counts(source).map_err(|e| src_err("counting rows", e));
    let copied = counted.and_then(|tables| {
        // The copy's file goes through the provider's file wrapper, which
        // records the errno of a failed write: a full or failing
        // destination is then named as the destination, with what its file
        // system said, rather than as "database or disk is full" against
        // the source the pages were read from.
        sqlite::vfs::register().map_err(|detail| BackupError::Sqlite {
            path: tmp.to_path_buf(),
            context: "opening the temporary copy",
            source: rusqlite::Error::SqliteFailure(
                ffi::Error::new(ffi::SQLITE_ERROR),
                Some(detail),
            ),
        })?;
        let mut target = Connection::open_with_flags_and_vfs(
            tmp,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            sqlite::vfs::VFS_NAME,
        )
        .map_err(|e| tmp_err("opening the temporary copy", e))?;
        sqlite::vfs::clear_last();
        let pages = copy_pages(source, &mut target, progress).map_err(|failed| match failed {
            CopyFailed::Sqlite(e) => match sqlite::vfs::take_last() {
                Some(f) if f.errno != 0 => BackupError::Io {
                    path: dest.to_path_buf(),
                    context: "writing the copy",
                    source: std::io::Error::from_raw_os_error(f.errno),
                },
                _ => BackupError::Sqlite {
                    path: db.to_path_buf(),
                    context: "copying pages",
                    source: e,
                },
            },
            CopyFailed::Busy(detail) => BackupError::Sqlite {
                path: db.to_path_buf(),
                context: "copying pages",
                source: rusqlite::Error::SqliteFailure(
                    ffi::Error::new(ffi::SQLITE_BUSY),
                    Some(detail),
                ),
            },
        })?;
        // A copy is one file that stands alone: no write-ahead log beside it.
        target
            .query_row("PRAGMA journal_mode = DELETE", [], |r| {
                r.get::<_, String>(0)
            })
            .map_err(|e| tmp_err("leaving WAL mode on the copy", e))?;
        let page_size: u64 = target
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| tmp_err("reading the page size", e))?;
        target
            .close()
            .map_err(|(_, e)| tmp_err("closing the temporary copy", e))?;
        Ok((tables, pages, page_size))
    });
    let _ = source.execute_batch("COMMIT");
    let (tables, pages, page_size) = copied?;

    // The proof, from the file on disk through a fresh connection.
    verify_copy(tmp, dest, &tables)?;

    fs::File::open(tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(tmp, "fsyncing the copy", e))?;
    // A link fails where a rename would replace: nothing that appeared at
    // the destination meanwhile is overwritten.
    fs::hard_link(tmp, dest).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            BackupError::DestinationExists {
                path: dest.to_path_buf(),
                what: "appeared while the copy was made".into(),
            }
        } else {
            io(dest, "moving the copy into place", e)
        }
    })?;
    let _ = fs::remove_file(tmp);
    let parent = parent_of(dest);
    if let Err(e) = fs::File::open(&parent).and_then(|d| d.sync_all()) {
        let _ = fs::remove_file(dest);
        return Err(io(&parent, "fsyncing the destination directory", e));
    }
    Ok((tables, pages, page_size))
}

fn verify_copy(tmp: &Path, dest: &Path, expected: &[(String, u64)]) -> Result<(), BackupError> {
    let fail = |detail: String| BackupError::Verify {
        path: dest.to_path_buf(),
        detail,
    };
    let conn = Connection::open_with_flags(
        tmp,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| fail(format!("it cannot be opened: {e}")))?;
    let mut stmt = conn
        .prepare("PRAGMA integrity_check")
        .map_err(|e| fail(format!("integrity_check: {e}")))?;
    let lines: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| fail(format!("integrity_check: {e}")))?;
    drop(stmt);
    if lines != ["ok"] {
        return Err(fail(format!("integrity_check says {}", lines.join("; "))));
    }
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| fail(format!("reading its schema version: {e}")))?;
    if version != SCHEMA_VERSION {
        return Err(fail(format!(
            "schema version {version}, where the source states {SCHEMA_VERSION}"
        )));
    }
    // The invariants `saguin sqlite verify` checks: a copy of a database
    // whose rows contradict each other is not a backup to keep.
    let verification = sqlite::verify::verify(&conn);
    if !verification.is_ok() {
        return Err(fail(verification.lines().join("; ")));
    }
    let counted = row_counts(&conn).map_err(|e| fail(format!("counting rows: {e}")))?;
    let differences: Vec<String> = expected
        .iter()
        .zip(&counted)
        .filter(|(a, b)| a != b)
        .map(|((t, a), (_, b))| format!("{t}: {a} rows in the source, {b} in the copy"))
        .collect();
    if !differences.is_empty() {
        return Err(fail(differences.join(", ")));
    }
    Ok(())
}
