//! The lock: one broker at a time per provider, taken before anything of
//! it is touched (`docs/design.md` storage rule 7).
//!
//! The lock is a tiny SQLite database of its own beside what it guards
//! (`<file_path>.lock` for a sqlite provider, `saguin.lock` inside a snapshot
//! directory), never the provider's database: locking that exclusively would
//! lock out `sqlite3` readers too.
//!
//! It is claimed by an *unconditional* write (`INSERT OR REPLACE` of the
//! holder row) on a connection in `locking_mode=EXCLUSIVE`: exclusive mode
//! takes the file's exclusive lock on the first write and never gives it
//! back, while a read takes only a shared lock that does not exclude another
//! reader. A conditional write (`CREATE TABLE IF NOT EXISTS` alone) writes
//! nothing on every run but the first, so two brokers would both start.
//!
//! Never blocking: `busy_timeout` is 0 and a held lock is answered at once,
//! naming the lock and, where the row can be read, its holder.
//!
//! The lock is the live connection, not the file: a lock file whose holder is
//! gone is an ordinary file and the next broker simply takes it.
//!
//! One POSIX-lock trap shapes the probe: closing *any* descriptor of a file
//! drops every fcntl lock the process holds on it. So nothing here opens a
//! raw descriptor (or an `immutable=1` connection, which SQLite closes
//! directly) on a lock file this process holds; the process-wide registry of
//! held locks answers for those instead.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension};

/// The file name of a snapshot directory's lock.
pub const SNAPSHOT_DIR_LOCK_NAME: &str = saguin_format::channel_name::LOCK_FILE;

/// The revision this build records as a lock holder and a database's creator.
pub const BUILD_REVISION: &str = saguin_format::REVISION;

/// SQLite's unix VFS lock bytes (sqlite3.c `PENDING_BYTE` and neighbours):
/// a writer holds a write lock on the reserved byte, and an exclusive holder
/// a write lock on the whole shared range.
const PENDING_BYTE: i64 = 0x4000_0000;
const RESERVED_BYTE: i64 = PENDING_BYTE + 1;
const SHARED_SIZE: i64 = 510;

/// How long `acquire` waits for a *reader* of the lock database to let go
/// once it already holds the reserved lock (so no other writer exists). A
/// reader is a probe or `sqlite3`, never a competing broker.
const READER_GRACE: Duration = Duration::from_millis(250);

/// Who holds (or last held) a lock: the row the holder wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Holder {
    pub pid: u32,
    pub host: String,
    /// When the holder took the lock, unix nanoseconds.
    pub since_unix_ns: i64,
    /// The saguin revision the holder runs.
    pub revision: String,
    /// When the holder let the lock go cleanly, unix nanoseconds; 0 while
    /// held, and after a holder that died holding it (that is what tells a
    /// stale lock from a released one). 0 rather than an `Option` keeps
    /// `LockError` small, and matches how every other time is unset.
    pub released_unix_ns: i64,
}

impl Holder {
    fn of_this_process() -> Holder {
        Holder {
            pid: std::process::id(),
            host: this_host(),
            since_unix_ns: unix_nanos_now(),
            revision: BUILD_REVISION.to_string(),
            released_unix_ns: 0,
        }
    }

    /// `since` as RFC 3339 (seconds), or "unknown" for a value out of range.
    pub fn since_rfc3339(&self) -> String {
        rfc3339(self.since_unix_ns)
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} on {} since {} (saguin {})",
            self.pid,
            self.host,
            self.since_rfc3339(),
            self.revision
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another broker (or another guard in this process) holds the lock.
    #[error("lock {}: held by {}", path.display(), holder_text(.holder, *.holder_pid))]
    Held {
        path: PathBuf,
        /// The holder row, when it could be read (boxed: errors stay small).
        holder: Option<Box<Holder>>,
        /// The pid the operating system names as the lock's owner, when the
        /// row could not be read.
        holder_pid: Option<u32>,
    },
    #[error("lock {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("lock {}: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}

fn holder_text(holder: &Option<Box<Holder>>, pid: Option<u32>) -> String {
    match (holder, pid) {
        (Some(h), _) => h.to_string(),
        (None, Some(pid)) => format!("pid {pid} (its holder row cannot be read)"),
        (None, None) => "another process (its holder row cannot be read)".to_string(),
    }
}

/// The lock beside a sqlite provider's database: `<file_path>.lock`.
pub fn lock_path_for_database(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The lock inside a snapshot directory: `saguin.lock`.
pub fn lock_path_for_snapshot_dir(dir: &Path) -> PathBuf {
    dir.join(SNAPSHOT_DIR_LOCK_NAME)
}

/// A held lock. The lock is the connection: it lasts exactly as long as this
/// guard, and dropping the guard (or the process dying) frees it.
#[derive(Debug)]
pub struct LockGuard {
    path: PathBuf,
    key: PathBuf,
    holder: Holder,
    /// The latest time the holder before this one recorded (its start, or
    /// its clean release), unix nanoseconds; `None` for a new lock file.
    previous_time: Option<i64>,
    /// Holds the file's exclusive lock; never used after `acquire`.
    _conn: Connection,
}

impl LockGuard {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// The latest time the holder before this one wrote in the lock (when
    /// it took it, or when it let it go cleanly), by its clock: a time the
    /// storage the lock guards was known to be in use. `None` for a lock
    /// file nobody held before.
    pub fn previous_time(&self) -> Option<i64> {
        self.previous_time
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Record the clean release while still holding the lock, so `lock
        // status` can tell it from a holder that died. A failed write only
        // makes a released lock look stale, which errs on the safe side.
        let _ = self._conn.execute(
            "UPDATE holder SET released_unix_ns = ?1 WHERE id = 1",
            [unix_nanos_now().max(RECEIPT_TIME.load(Ordering::Relaxed))],
        );
        registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

/// The latest time the broker's receipt clock read in this process (0:
/// none): a lock let go records the later of it and the system clock, so
/// the next start on a clock not set yet goes on from it.
static RECEIPT_TIME: AtomicI64 = AtomicI64::new(0);

/// The broker's receipt clock reads `unix` (see [`RECEIPT_TIME`]).
pub fn note_receipt_time(unix: i64) {
    RECEIPT_TIME.fetch_max(unix, Ordering::Relaxed);
}

/// Locks held by this process, by canonical path, with their holder rows.
fn registry() -> &'static Mutex<HashMap<PathBuf, Holder>> {
    static HELD: OnceLock<Mutex<HashMap<PathBuf, Holder>>> = OnceLock::new();
    HELD.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Take the lock at `path`, creating the lock file (mode 0600) if absent.
/// Never blocks on another holder: a held lock is `LockError::Held` at once.
pub fn acquire(path: &Path) -> Result<LockGuard, LockError> {
    let io_err = |source| LockError::Io {
        path: path.to_path_buf(),
        source,
    };
    // `create_new` never opens an existing file: opening and closing a
    // descriptor of a lock this process holds would drop that lock.
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(e)),
    }
    let key = path.canonicalize().map_err(io_err)?;
    let mut held = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(holder) = held.get(&key) {
        return Err(LockError::Held {
            path: path.to_path_buf(),
            holder: Some(Box::new(holder.clone())),
            holder_pid: None,
        });
    }
    let holder = Holder::of_this_process();
    match claim(path, &holder) {
        Ok((conn, previous_time)) => {
            held.insert(key.clone(), holder.clone());
            Ok(LockGuard {
                path: path.to_path_buf(),
                key,
                holder,
                previous_time,
                _conn: conn,
            })
        }
        Err(e) if is_busy(&e) => {
            drop(held);
            Err(LockError::Held {
                path: path.to_path_buf(),
                holder: read_holder_unlocked(path).ok().flatten().map(Box::new),
                holder_pid: exclusive_owner_pid(path).ok().flatten(),
            })
        }
        Err(source) => Err(LockError::Sqlite {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Open the lock database and take its exclusive lock by writing the holder
/// row. Returns the connection that now holds the lock, and the latest time
/// the row it replaced recorded.
fn claim(path: &Path, holder: &Holder) -> rusqlite::Result<(Connection, Option<i64>)> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::ZERO)?;
    // `PRAGMA locking_mode` answers with a row; read it rather than `execute`.
    let _mode: String = conn.query_row("PRAGMA locking_mode=EXCLUSIVE", [], |r| r.get(0))?;
    conn.execute_batch("BEGIN IMMEDIATE")?;
    // Advisory: a row that cannot be read gives no time.
    let previous_time = read_holder(&conn)
        .ok()
        .flatten()
        .map(|h| h.since_unix_ns.max(h.released_unix_ns));
    let written = conn
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS holder (
                 id INTEGER PRIMARY KEY CHECK (id = 1),
                 pid INTEGER NOT NULL,
                 host TEXT NOT NULL,
                 since_unix_ns INTEGER NOT NULL,
                 revision TEXT NOT NULL,
                 released_unix_ns INTEGER
             ) STRICT",
        )
        .and_then(|()| add_released_column(&conn))
        .and_then(|()| {
            // The unconditional write: it is what takes the exclusive lock.
            conn.execute(
                "INSERT OR REPLACE INTO holder (id, pid, host, since_unix_ns, revision, released_unix_ns)
                 VALUES (1, ?1, ?2, ?3, ?4, NULL)",
                rusqlite::params![
                    holder.pid,
                    holder.host,
                    holder.since_unix_ns,
                    holder.revision
                ],
            )
        });
    if let Err(e) = written {
        let _ = conn.execute_batch("ROLLBACK");
        if is_full(&e) {
            return claim_without_writing(conn, path).map(|conn| (conn, previous_time));
        }
        return Err(e);
    }
    // Holding the reserved lock, no other writer can exist; only a reader
    // (a probe, `sqlite3`) can stand between this and the exclusive lock,
    // and a reader lets go in moments.
    let started = Instant::now();
    loop {
        match conn.execute_batch("COMMIT") {
            Ok(()) => return Ok((conn, previous_time)),
            Err(e) if is_busy(&e) && started.elapsed() < READER_GRACE => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
    }
}

/// Whether the holder table has the `released_unix_ns` column (lock files
/// written before it was added do not).
fn has_released_column(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM pragma_table_info('holder') WHERE name = 'released_unix_ns'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// Give a lock file written before `released_unix_ns` existed the column.
fn add_released_column(conn: &Connection) -> rusqlite::Result<()> {
    if !has_released_column(conn)? {
        conn.execute_batch("ALTER TABLE holder ADD COLUMN released_unix_ns INTEGER")?;
    }
    Ok(())
}

/// A full file system, or the lock file's own size limit.
fn is_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::DiskFull)
}

/// The lock taken on a file system with no room for the holder row: an
/// exclusive transaction that writes nothing takes the same exclusive file
/// lock, and the exclusive locking mode keeps it after the commit. The row
/// still names the holder before, so `lock status` names that one until a
/// start with room writes it again; the start says so.
fn claim_without_writing(conn: Connection, path: &Path) -> rusqlite::Result<Connection> {
    conn.execute_batch("BEGIN EXCLUSIVE; COMMIT")?;
    tracing::warn!(lock = %path.display(),
        "the lock is held, but its holder row could not be written (no space left): lock status names the holder before this one");
    Ok(conn)
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// What `saguin lock status` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockState {
    /// No lock file, or one nobody holds. `last_holder` is the row left by
    /// the last holder, when there is one (its process may still be alive
    /// and simply no longer holding it, or be on another host).
    Free { last_holder: Option<Holder> },
    /// Free, and the recorded holder's process died holding it: it is gone
    /// from this host and never recorded a release.
    Stale { last_holder: Holder },
    /// Held by a live process. `holder` when its row could be read, else the
    /// pid the operating system names as the owner of the lock, if any.
    Held {
        holder: Option<Holder>,
        holder_pid: Option<u32>,
    },
}

/// Tell whether the lock at `path` is held, without taking it and without
/// blocking. An error means "cannot tell".
pub fn probe(path: &Path) -> Result<LockState, LockError> {
    let io_err = |source| LockError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(LockState::Free { last_holder: None })
        }
        Err(e) => return Err(io_err(e)),
    };
    if !meta.is_file() {
        return Err(io_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let key = path.canonicalize().map_err(io_err)?;
    if let Some(holder) = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(LockState::Held {
            holder: Some(holder.clone()),
            holder_pid: None,
        });
    }
    let owner = exclusive_owner_pid(path).map_err(io_err)?;
    let row = read_holder_unlocked(path);
    match owner {
        Some(pid) => Ok(LockState::Held {
            holder: row.ok().flatten(),
            holder_pid: Some(pid),
        }),
        None => {
            // Free. Unreadable contents in a free lock cannot hide a holder:
            // the operating system's lock table already said nobody has it.
            let row = match row {
                Ok(row) => row,
                Err(source) if meta.len() > 0 => {
                    return Err(LockError::Sqlite {
                        path: path.to_path_buf(),
                        source,
                    })
                }
                Err(_) => None,
            };
            match row {
                Some(h)
                    if h.released_unix_ns == 0
                        && h.host == this_host()
                        && !process_alive(h.pid) =>
                {
                    Ok(LockState::Stale { last_holder: h })
                }
                last_holder => Ok(LockState::Free { last_holder }),
            }
        }
    }
}

/// The pid owning a write lock on the lock database's reserved byte or
/// shared range, as the kernel's lock table names it (`F_GETLK`). Testing
/// with a *read* lock type means readers do not count: only a writer or an
/// exclusive holder conflicts.
fn exclusive_owner_pid(path: &Path) -> io::Result<Option<u32>> {
    let file = std::fs::File::open(path)?;
    for (start, len) in [(RESERVED_BYTE, 1), (PENDING_BYTE + 2, SHARED_SIZE)] {
        // SAFETY: an all-zero `flock` is a valid value of the C struct.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_RDLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = start as _;
        fl.l_len = len as _;
        // SAFETY: the descriptor is open for the call and `fl` is a valid,
        // exclusively borrowed `flock`.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut fl) };
        if rc == -1 {
            return Err(io::Error::last_os_error());
        }
        if fl.l_type != libc::F_UNLCK as libc::c_short {
            return Ok(Some(u32::try_from(fl.l_pid).unwrap_or(0)));
        }
    }
    Ok(None)
}

/// Read the holder row without taking any lock (`immutable=1`), so a lock
/// held in exclusive mode by another process can still be described. Only
/// called for a lock this process does not hold (see the module comment).
fn read_holder_unlocked(path: &Path) -> rusqlite::Result<Option<Holder>> {
    let uri = format!("file:{}?immutable=1", uri_escape(path));
    let conn = Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    read_holder(&conn)
}

/// The holder row, or `None` when there is no row or no table.
fn read_holder(conn: &Connection) -> rusqlite::Result<Option<Holder>> {
    let has_table: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'holder'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if has_table.is_none() {
        return Ok(None);
    }
    let sql = if has_released_column(conn)? {
        "SELECT pid, host, since_unix_ns, revision, released_unix_ns FROM holder WHERE id = 1"
    } else {
        "SELECT pid, host, since_unix_ns, revision, NULL FROM holder WHERE id = 1"
    };
    conn.query_row(sql, [], |r| {
        Ok(Holder {
            pid: r.get(0)?,
            host: r.get(1)?,
            since_unix_ns: r.get(2)?,
            revision: r.get(3)?,
            released_unix_ns: r.get::<_, Option<i64>>(4)?.unwrap_or(0),
        })
    })
    .optional()
}

/// A path as the path part of an SQLite `file:` URI: `%`, `?` and `#` are
/// the characters that would otherwise end or alter it.
pub(crate) fn uri_escape(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// Whether `pid` names a live process on this host (`kill(pid, 0)`; EPERM
/// means it exists and belongs to someone else).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence and permission check.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// This machine's host name, or "unknown".
pub fn this_host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(buf.get(..end).unwrap_or_default()).into_owned()
}

pub(crate) fn unix_nanos_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Unix nanoseconds as RFC 3339 to the second; "unset" for 0.
pub(crate) fn rfc3339(unix_ns: i64) -> String {
    if unix_ns == 0 {
        return "unset".to_string();
    }
    match u64::try_from(unix_ns) {
        Ok(ns) => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
        }
        Err(_) => format!("{unix_ns}ns"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn acquire_creates_a_0600_file_and_refuses_a_second_taker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite.lock");
        let guard = acquire(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let err = acquire(&path).unwrap_err();
        match &err {
            LockError::Held { holder, .. } => {
                assert_eq!(holder.as_ref().unwrap().pid, std::process::id())
            }
            other => panic!("unexpected {other}"),
        }
        assert!(err.to_string().contains(&path.display().to_string()));
        assert!(matches!(probe(&path).unwrap(), LockState::Held { .. }));
        drop(guard);
        // Free again, and the second run (an existing lock file) takes it:
        // the unconditional write is what makes that a lock.
        assert!(matches!(
            probe(&path).unwrap(),
            LockState::Free {
                last_holder: Some(_)
            }
        ));
        let again = acquire(&path).unwrap();
        assert_eq!(again.holder().pid, std::process::id());
    }

    /// A new lock file has no time before it; a lock taken again knows
    /// the latest time its last holder wrote: its clean release, or its
    /// start when it died holding the lock.
    #[test]
    fn a_lock_taken_again_knows_the_latest_time_its_last_holder_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite.lock");
        let first = acquire(&path).unwrap();
        assert_eq!(first.previous_time(), None);
        let since = first.holder().since_unix_ns;
        drop(first);
        let LockState::Free {
            last_holder: Some(row),
        } = probe(&path).unwrap()
        else {
            panic!("free, with the row its holder left");
        };
        assert!(row.released_unix_ns >= since, "released before it started");
        let second = acquire(&path).unwrap();
        assert_eq!(second.previous_time(), Some(row.released_unix_ns));
        drop(second);
        let holder_was = |since: i64, released: Option<i64>| {
            Connection::open(&path)
                .unwrap()
                .execute(
                    "UPDATE holder SET since_unix_ns = ?1, released_unix_ns = ?2 WHERE id = 1",
                    rusqlite::params![since, released],
                )
                .unwrap();
        };
        // The later of the two: its release.
        holder_was(7, Some(9));
        assert_eq!(acquire(&path).unwrap().previous_time(), Some(9));
        // A holder that died: its row says when it started, no release.
        holder_was(7, None);
        assert_eq!(acquire(&path).unwrap().previous_time(), Some(7));
    }

    #[test]
    fn times_read_to_the_second() {
        assert_eq!(rfc3339(70_000_000_000), "1970-01-01T00:01:10Z");
        assert_eq!(rfc3339(0), "unset");
    }

    #[test]
    fn a_second_connection_in_this_process_cannot_take_a_held_lock() {
        // The registry answers first; below it, SQLite itself refuses.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let _guard = acquire(&path).unwrap();
        let err = claim(&path, &Holder::of_this_process()).unwrap_err();
        assert!(is_busy(&err), "{err}");
    }

    #[test]
    fn a_missing_lock_file_is_free_and_a_dead_pid_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("saguin.lock");
        assert_eq!(probe(&path).unwrap(), LockState::Free { last_holder: None });
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE holder (id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, host TEXT NOT NULL,
             since_unix_ns INTEGER NOT NULL, revision TEXT NOT NULL) STRICT",
        )
        .unwrap();
        // pid_max is at most 2^22 on Linux, so this pid cannot exist.
        conn.execute(
            "INSERT INTO holder VALUES (1, 2147483000, ?1, 1, 'old')",
            [this_host()],
        )
        .unwrap();
        drop(conn);
        assert!(matches!(probe(&path).unwrap(), LockState::Stale { .. }));
    }

    #[test]
    fn garbage_in_a_free_lock_file_cannot_be_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("saguin.lock");
        std::fs::write(&path, b"this is not a database at all, not even close").unwrap();
        assert!(probe(&path).is_err());
    }

    #[test]
    fn paths_beside_what_they_guard() {
        assert_eq!(
            lock_path_for_database(Path::new("/var/lib/saguin/saguin.db")),
            PathBuf::from("/var/lib/saguin/saguin.db.lock")
        );
        assert_eq!(
            lock_path_for_snapshot_dir(Path::new("/s")),
            PathBuf::from("/s/saguin.lock")
        );
    }
}
