//! The sqlite provider: one database file per provider,
//! schema version 20, WAL with `synchronous=NORMAL`, one writer connection,
//! `read_connections` query-only readers, a flusher that fsyncs the
//! write-ahead log every `flush_interval` when something committed,
//! checkpoints it once a second (at every turn while its file is past 64
//! MiB) and starts it again once it passes 64 MiB, cutting its file back
//! to that (so a provider that never stops committing keeps a bounded log), and
//! group commit of publishes.
//!
//! Opening order: the lock (`<file_path>.lock`) is taken before
//! the database is touched at all; the file is created 0600 before SQLite
//! sees it; the schema is applied (new file) or its version checked
//! (existing file, refused by name when it is not 20); positions of sessions
//! that expired while the broker was down are dropped; then the readers and
//! the flusher start. Closing stops the flusher, checkpoints with
//! `wal_checkpoint(TRUNCATE)` (a failure is logged, not fatal), and lets the
//! lock go last. Nothing here ever runs VACUUM.
//!
//! This module is the one that knows the schema: the stores (`append`,
//! `latest`, `queue`, `session`, `held`, `broadcast`), the group commit
//! (`batch`, which sees a channel only as `channel::Staged`), and the
//! typed reads and writes the tools need - `inspect` for `sqlite dump`,
//! `units` for the migrations, `verify`, and `schema::row_counts` for a
//! backup - so no module outside it names a table.
//!
//! Over 1,500 lines, on purpose for now: the provider's writer, its
//! flusher and its opening and closing share the private state of
//! `Shared` (the writer connection, the scope of a shared transaction, the
//! fault that fails the provider), and each reads it under the others'
//! rules. The stores already live in modules of their own; the flusher
//! (`Flusher`, `FlushLoop`) is the next to leave, taking `Shared`'s
//! flush fields with it.

mod append;
mod batch;
mod broadcast;
mod channel;
mod held;
pub mod inspect;
mod latest;
mod queue;
mod room;
pub mod row;
pub mod schema;
pub(crate) mod session;
pub mod units;
pub mod verify;
pub mod vfs;

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags};
use saguin_format::model::{ChannelKind, Record};

use super::contract::{
    self, BroadcastLog, ChannelStore, FaultKind, Health, HeldPublishStore, LatestStore, Position,
    Provider, ProviderKind, Reader, SessionStore, StorageError, BROADCAST_LOG_NAME,
    RETAINED_STORE_NAME,
};
use super::lock::{self, LockGuard};

pub use append::AppendChannel;
use channel::Target;
pub use latest::LatestChannel;
pub use queue::QueueChannel;
pub use room::{room_path, Capacity, CHECKPOINT_ROOM_DEFAULT, ROOM_SUFFIX};
pub use schema::{PAGE_SIZE, SCHEMA_VERSION};
pub use session::read_sessions;

/// The revision a database records as its creator.
pub const WRITER_REVISION: &str = lock::BUILD_REVISION;

/// The bounds of `flush_interval` (`man saguin-config`): a power cut costs
/// about one interval of commits, so it is kept to a second at most.
pub const FLUSH_INTERVAL_MIN: Duration = Duration::from_millis(10);
pub const FLUSH_INTERVAL_MAX: Duration = Duration::from_secs(1);
/// The longest `publish_commit_interval` admitted: the wait is paid per
/// connection, so a longer one is refused.
pub const PUBLISH_COMMIT_INTERVAL_MAX: Duration = Duration::from_secs(1);

/// A sqlite provider's settings (`storage[].kind: sqlite`).
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// The provider's configured name, for errors and logs.
    pub name: String,
    pub file_path: PathBuf,
    /// The page ceiling; `None` is unbounded.
    pub max_bytes: Option<u64>,
    /// One largest record with its headers
    /// ([`contract::reserve_for`]`(max_message_size, max_header_bytes)`).
    pub reserve: u64,
    pub flush_interval: Duration,
    /// `None` collects without waiting; a duration makes a batch wait for
    /// company up to it.
    pub publish_commit_interval: Option<Duration>,
    pub publish_commit_max_records: usize,
    /// 0 = every read on the writer.
    pub read_connections: usize,
    /// limits.max_session_expiry in seconds, bounding the position sweep.
    pub max_session_expiry: u32,
    /// The log in use past which it is started again
    /// ([`WAL_RESTART_BYTES`]; smaller only in tests).
    pub wal_restart_bytes: u64,
    /// The checkpoint's room kept beside the database (`room`); 0 keeps
    /// none.
    pub checkpoint_room: u64,
}

impl SqliteOptions {
    /// The defaults a configuration gets for the keys it leaves out.
    pub fn new(name: impl Into<String>, file_path: impl Into<PathBuf>) -> SqliteOptions {
        SqliteOptions {
            name: name.into(),
            file_path: file_path.into(),
            max_bytes: None,
            reserve: contract::reserve_for(256 * 1024, 8 * 1024),
            flush_interval: Duration::from_millis(150),
            publish_commit_interval: None,
            publish_commit_max_records: 256,
            read_connections: 4,
            max_session_expiry: 7 * 24 * 3600,
            wal_restart_bytes: WAL_RESTART_BYTES,
            checkpoint_room: CHECKPOINT_ROOM_DEFAULT,
        }
    }
}

/// Why a sqlite provider could not be opened. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum SqliteOpenError {
    #[error(transparent)]
    Locked(#[from] lock::LockError),
    /// There is no in-place upgrade.
    #[error("storage {}: schema version {version} ({}); this broker reads version {SCHEMA_VERSION}",
        path.display(), creator_text(.created_by, *.created_at))]
    SchemaVersion {
        path: PathBuf,
        version: i64,
        created_by: Option<String>,
        created_at: Option<i64>,
    },
    #[error("storage {}: holds tables but states no schema version; this broker reads version {SCHEMA_VERSION} and does not adopt a database it did not create", path.display())]
    Unversioned { path: PathBuf },
    #[error("storage {}: schema version {SCHEMA_VERSION} but the tables {tables} are missing; the file was damaged or edited", path.display())]
    MissingTables { path: PathBuf, tables: String },
    #[error("storage {}: {context}: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    /// Its file system has no room for what an open writes: the
    /// write-ahead log's index (`-shm`, 32 KiB) and the recovery's writes.
    #[error("storage {}: {context}: no space left on its file system ({source}); opening needs room for the write-ahead log and its index (-wal, -shm): free some and start again", path.display())]
    NoSpace {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("storage {}: {context}: {source}", path.display())]
    Io {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("storage {}: {detail}", path.display())]
    Settings { path: PathBuf, detail: String },
    /// Recovery at open (the position sweep, reading the channels) failed.
    #[error("storage {}: recovery at open: {source}", path.display())]
    Recovery {
        path: PathBuf,
        #[source]
        source: StorageError,
    },
}

impl SqliteOpenError {
    /// The open found no room on the file system.
    fn is_for_want_of_room(&self) -> bool {
        match self {
            SqliteOpenError::NoSpace { .. } => true,
            SqliteOpenError::Recovery { source, .. } => {
                source.kind() == contract::FaultKind::NoSpace
            }
            _ => false,
        }
    }
}

fn creator_text(by: &Option<String>, at: Option<i64>) -> String {
    match (by, at) {
        (Some(by), Some(at)) => format!("created by saguin {by} at {}", lock::rfc3339(at)),
        _ => "created by an unknown build: no meta row".to_string(),
    }
}

/// What a bound came to, stated once at startup (it is no longer quite the number the operator wrote).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageBounds {
    pub page_size: u64,
    /// Where publishes stop: `(max_bytes - reserve) / page_size`.
    pub publish_pages: u64,
    /// The ceiling relief transactions raise to: `max_bytes / page_size`.
    pub relief_pages: u64,
}

impl PageBounds {
    /// Refuses a bound that rounds to no pages (SQLite reads
    /// `max_page_count = 0` as a query) or one below twice the reserve.
    pub fn compute(max_bytes: u64, reserve: u64, page_size: u64) -> Result<PageBounds, String> {
        let relief_pages = max_bytes / page_size;
        if relief_pages == 0 {
            return Err(format!(
                "max_bytes {max_bytes} rounds down to 0 pages of {page_size} bytes"
            ));
        }
        if max_bytes < reserve.saturating_mul(2) {
            return Err(format!(
                "max_bytes {max_bytes} is below twice the reserve of {reserve} bytes (max_message_size + max_header_bytes)"
            ));
        }
        let publish_pages = (max_bytes - reserve) / page_size;
        if publish_pages == 0 {
            return Err(format!(
                "max_bytes {max_bytes} less the reserve of {reserve} bytes rounds down to 0 pages of {page_size} bytes"
            ));
        }
        Ok(PageBounds {
            page_size,
            publish_pages,
            relief_pages,
        })
    }
}

/// The counters the flusher shares with the provider (it must not hold the
/// provider itself alive).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Bumped after every commit: the flusher syncs only when it moved.
    pub commits: AtomicU64,
    /// Failed writes, reads, flushes and checkpoints, as this provider met
    /// them (the broker counts what its writers met by kind in
    /// saguin_storage_errors_total{provider,kind}).
    pub storage_errors: AtomicU64,
    /// WAL fsyncs performed.
    pub flushes: AtomicU64,
    /// Checkpoints on the writer that copied the whole log, so the next
    /// commit writes from its start (unless a reader is still in it).
    pub wal_restarts: AtomicU64,
    /// Publish transactions committed, and the publishes they held.
    pub publish_batches: AtomicU64,
    pub batched_publishes: AtomicU64,
}

/// The stores opened so far: asking twice gives back the first store.
#[derive(Default)]
struct Registry {
    kinds: BTreeMap<String, ChannelKind>,
    appends: HashMap<String, Arc<AppendChannel>>,
    latests: HashMap<String, Arc<LatestChannel>>,
    queues: HashMap<String, Arc<QueueChannel>>,
    sessions: Option<Arc<session::Sessions>>,
    broadcast: Option<Arc<broadcast::Broadcast>>,
    held: Option<Arc<held::Held>>,
}

/// What every store of one provider shares: the connections and counters.
pub(crate) struct Shared {
    pub name: String,
    pub path: PathBuf,
    pub options: SqliteOptions,
    /// The one write connection; `None` once closed.
    writer: Mutex<Option<Connection>>,
    readers: Mutex<Vec<Connection>>,
    readers_free: Condvar,
    reader_count: usize,
    /// Set, under `readers`, while [`Shared::with_readers_idle`] waits
    /// for every read to end: no read begins meanwhile.
    readers_held: AtomicBool,
    closed: AtomicBool,
    /// See [`Shared::refuse_if_publishes_are`].
    publishes_full: AtomicBool,
    /// What the disk under the provider last said ([`Shared::fault`]).
    health: Mutex<Health>,
    /// Set with `health` when it is [`Health::Failed`]: read before every
    /// write without taking the lock.
    failed: AtomicBool,
    /// The failures planned for this database's files, when
    /// [`vfs::INJECT_ENV`] names the provider.
    faults: Option<Arc<vfs::Faults>>,
    pub counters: Arc<Counters>,
    pub bounds: Option<PageBounds>,
    /// The file system's ceiling, in pages, while it is full (0: none):
    /// what the database held when a checkpoint found no room. Kept
    /// until the checkpoint's room is taken back ([`room`]).
    disk_ceiling: AtomicU64,
    /// The ceiling, in pages, while the write-ahead log cannot be copied
    /// into the database (0: none): the database's file and what the
    /// checkpoint's room covers beyond it ([`room`]).
    log_ceiling: AtomicU64,
    /// Under the log's ceiling, the room could not grow with what the log
    /// adds: publishes beyond what it covers are refused.
    room_short: AtomicBool,
    /// SQLite's own `max_page_count`, read at open: the ceiling of a
    /// provider without `max_bytes` once the file system's is lifted.
    unbounded_pages: u64,
    /// What of the checkpoint's room is allocated, in bytes
    /// (`saguin_provider_checkpoint_room_bytes`).
    room_held: AtomicU64,
    /// Bumped, and `room_moved` told, each time the room or the file
    /// system's ceiling moves ([`SqliteProvider::wait_for_room`]).
    room_moves: Mutex<u64>,
    room_moved: Condvar,
    pub page_size: u64,
    pub batcher: batch::Batcher,
    registry: Mutex<Registry>,
    flusher: Mutex<Option<Flusher>>,
    lock: Mutex<Option<LockGuard>>,
    /// The thread whose writes share one open transaction
    /// ([`Shared::together`]); the writer waits for it to end on any other.
    scope: Mutex<Option<std::thread::ThreadId>>,
    scope_ended: Condvar,
}

/// The write connection, held for one operation.
pub(crate) struct Writer<'a> {
    conn: MutexGuard<'a, Option<Connection>>,
    shared: &'a Shared,
}

impl Writer<'_> {
    pub fn conn(&self) -> &Connection {
        // `Shared::writer` returns a `Writer` only while the connection exists.
        self.conn.as_ref().expect("writer checked open")
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction and commits it. A
    /// relief transaction raises the page ceiling to the reserve inside the
    /// transaction and lowers it again on both paths (the pragma is
    /// connection state, which a rollback does not undo).
    pub fn txn<T>(
        &mut self,
        relief: bool,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let conn = self.conn();
        self.shared.refuse_if_failed()?;
        vfs::clear_last();
        if self.shared.in_scope() {
            return self.savepoint(relief, body);
        }
        // Prepared once and kept: parsing the text again costs every commit.
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let ceiling = if relief { self.shared.ceilings() } else { None };
        match run_bounded(conn, ceiling, "COMMIT", body) {
            Ok(out) => {
                self.shared.counters.commits.fetch_add(1, Ordering::Release);
                Ok(out)
            }
            Err(e) => {
                // SQLITE_FULL and I/O errors may already have ended the
                // transaction; a ROLLBACK with none open is itself an error.
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                if let Some(b) = ceiling {
                    let _ = set_max_page_count(conn, b.publish_pages);
                }
                Err(e)
            }
        }
    }
}

impl Writer<'_> {
    /// One write inside the transaction [`Shared::together`] holds open:
    /// a savepoint, released into that transaction or rolled back alone.
    fn savepoint<T>(
        &mut self,
        relief: bool,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let conn = self.conn();
        conn.prepare_cached("SAVEPOINT write")?.execute([])?;
        let ceiling = if relief { self.shared.ceilings() } else { None };
        let out = run_bounded(conn, ceiling, "RELEASE write", body);
        if out.is_err() {
            // SQLite may have ended the whole transaction (SQLITE_FULL, I/O):
            // then there is no savepoint to go back to.
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK TO write; RELEASE write");
            }
            if let Some(b) = ceiling {
                let _ = set_max_page_count(conn, b.publish_pages);
            }
        }
        out
    }
}

/// Runs `body` in the transaction or savepoint open on `conn` and ends it
/// with `end`: a relief write (`ceiling` set) may grow the file into the
/// reserve while it runs, and the publish ceiling is back before it ends.
/// On an error the caller rolls back and restores the ceiling.
fn run_bounded<T>(
    conn: &Connection,
    ceiling: Option<PageBounds>,
    end: &str,
    body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    if let Some(b) = ceiling {
        set_max_page_count(conn, b.relief_pages)?;
    }
    let out = body(conn)?;
    if let Some(b) = ceiling {
        set_max_page_count(conn, b.publish_pages)?;
    }
    conn.prepare_cached(end)?.execute([])?;
    Ok(out)
}

/// The lower of two page ceilings, 0 being none.
fn lower_ceiling(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, c) | (c, 0) => c,
        (a, b) => a.min(b),
    }
}

fn set_max_page_count(conn: &Connection, pages: u64) -> rusqlite::Result<()> {
    let _now: i64 = conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
        r.get(0)
    })?;
    Ok(())
}

impl Shared {
    /// Is this thread's write inside a transaction [`Shared::together`]
    /// holds open?
    fn in_scope(&self) -> bool {
        *self.scope.lock().unwrap_or_else(|e| e.into_inner()) == Some(std::thread::current().id())
    }

    /// Runs `body`'s writes (made on this thread through this provider's
    /// stores) in one transaction: each is a savepoint in it. Writes of
    /// other threads wait until it ends. Only writes that move no counter
    /// in memory may be made in it (see
    /// [`Provider::session_writes_together`](contract::Provider::session_writes_together)):
    /// a rollback could not move a counter back.
    fn together(&self, body: &mut dyn FnMut() -> bool) -> contract::Result<bool> {
        let me = std::thread::current().id();
        {
            let mut scope = self.scope.lock().unwrap_or_else(|e| e.into_inner());
            while scope.is_some_and(|t| t != me) {
                scope = self
                    .scope_ended
                    .wait(scope)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if scope.is_some() {
                // Already inside one: the writes join it.
                drop(scope);
                return Ok(body());
            }
            *scope = Some(me);
        }
        // The scope ends however this returns (a panicking body too), so
        // no other thread's writes wait for ever.
        struct EndScope<'a>(&'a Shared);
        impl Drop for EndScope<'_> {
            fn drop(&mut self) {
                *self.0.scope.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.0.scope_ended.notify_all();
            }
        }
        let _end_scope = EndScope(self);
        self.refuse_if_failed()
            .map_err(|e| self.write_error(None, "beginning a transaction".into(), 0, &e))?;
        vfs::clear_last();
        let begun = self.writer().and_then(|w| {
            w.conn()
                .prepare_cached("BEGIN IMMEDIATE")
                .and_then(|mut s| s.execute([]))
                .map(|_| ())
                .map_err(|e| {
                    self.write_error(Some(w.conn()), "beginning a transaction".into(), 0, &e)
                })
        });
        begun?;
        let kept = body();
        let ended = self.writer().and_then(|w| {
            let conn = w.conn();
            if conn.is_autocommit() {
                // A failed write ended the transaction already.
                return Ok(false);
            }
            if !kept {
                let _ = conn.execute_batch("ROLLBACK");
                return Ok(false);
            }
            match conn
                .prepare_cached("COMMIT")
                .and_then(|mut s| s.execute([]))
            {
                Ok(_) => {
                    self.counters.commits.fetch_add(1, Ordering::Release);
                    Ok(true)
                }
                Err(e) => {
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    Err(self.write_error(Some(conn), "committing session writes".into(), 0, &e))
                }
            }
        });
        ended
    }

    /// The write connection, or `Closed`. Waits while another thread's
    /// writes share a transaction ([`Shared::together`]).
    pub fn writer(&self) -> contract::Result<Writer<'_>> {
        let me = std::thread::current().id();
        let conn = loop {
            {
                let mut scope = self.scope.lock().unwrap_or_else(|e| e.into_inner());
                while scope.is_some_and(|t| t != me) {
                    scope = self
                        .scope_ended
                        .wait(scope)
                        .unwrap_or_else(|e| e.into_inner());
                }
            }
            let conn = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            // Another thread may have opened its shared transaction between
            // the look above and taking the connection: wait for it again.
            let scope = *self.scope.lock().unwrap_or_else(|e| e.into_inner());
            if scope.is_none_or(|t| t == me) {
                break conn;
            }
        };
        if conn.is_none() {
            return Err(StorageError::Closed {
                provider: self.name.clone(),
            });
        }
        Ok(Writer { conn, shared: self })
    }

    /// Runs `body` in one read transaction on a read connection (or on the
    /// writer when there are none), so everything it reads is one snapshot
    /// and it sees every commit that returned before it began.
    pub fn read<T>(
        &self,
        context: impl FnOnce() -> String,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> contract::Result<T> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StorageError::Closed {
                provider: self.name.clone(),
            });
        }
        vfs::clear_last();
        let in_txn = |conn: &Connection| -> rusqlite::Result<T> {
            conn.execute_batch("BEGIN")?;
            let out = body(conn);
            let end = conn.execute_batch("COMMIT");
            let out = out?;
            end?;
            Ok(out)
        };
        let result = if self.reader_count == 0 {
            let w = self.writer()?;
            in_txn(w.conn())
        } else {
            let conn = {
                let mut pool = self.readers.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if !self.readers_held.load(Ordering::Relaxed) {
                        if let Some(conn) = pool.pop() {
                            break conn;
                        }
                    }
                    if self.closed.load(Ordering::Acquire) {
                        return Err(StorageError::Closed {
                            provider: self.name.clone(),
                        });
                    }
                    pool = self
                        .readers_free
                        .wait(pool)
                        .unwrap_or_else(|e| e.into_inner());
                }
            };
            let out = in_txn(&conn);
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            self.readers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
            self.readers_free.notify_one();
            out
        };
        result.map_err(|e| self.read_error(context(), e))
    }

    /// Runs `body` once no read connection is in a read, and no read
    /// begins until it returns; `None` when some still read after
    /// `within`.
    fn with_readers_idle<T>(&self, within: Duration, body: impl FnOnce() -> T) -> Option<T> {
        let deadline = std::time::Instant::now() + within;
        let mut pool = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        self.readers_held.store(true, Ordering::Relaxed);
        let mut out = None;
        loop {
            if pool.len() >= self.reader_count {
                out = Some(body());
                break;
            }
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
                break;
            };
            pool = self
                .readers_free
                .wait_timeout(pool, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        self.readers_held.store(false, Ordering::Relaxed);
        drop(pool);
        // The reads that waited meanwhile, and any whose wake-up this wait
        // took, look again.
        self.readers_free.notify_all();
        out
    }

    pub fn read_error(&self, context: String, e: rusqlite::Error) -> StorageError {
        self.counters.storage_errors.fetch_add(1, Ordering::Relaxed);
        // An I/O error on a read is the disk failing as much as one on a
        // write: the provider fails (reads go on being tried).
        if let Some(kind) = classify(&e, vfs::take_last(), self.ceilings().is_some()) {
            if kind.is_sticky() {
                self.fault(kind, &e.to_string());
            }
            if kind != FaultKind::Full {
                return StorageError::Disk {
                    kind,
                    context: format!("storage {}: {context}", self.path.display()),
                    detail: e.to_string(),
                };
            }
        }
        match e {
            rusqlite::Error::FromSqlConversionFailure(_, _, detail) => StorageError::Corrupt {
                what: format!("storage {}: {context}", self.path.display()),
                detail: detail.to_string(),
            },
            rusqlite::Error::IntegralValueOutOfRange(col, v) => StorageError::Corrupt {
                what: format!("storage {}: {context}", self.path.display()),
                detail: format!("column {col} holds {v}, out of range"),
            },
            e => StorageError::Backend {
                context: format!("storage {}: {context}", self.path.display()),
                detail: e.to_string(),
            },
        }
    }

    /// A failed write: SQLITE_FULL from the page ceiling is the provider's
    /// bound (0x97); the disk without room, failing or read-only is a
    /// [`StorageError::Disk`] (0x83), and one of the faults after which
    /// nothing can be trusted fails the provider ([`Shared::fault`]); a
    /// write refused because the provider had failed already is
    /// [`StorageError::ProviderFailed`]; anything else a failed write
    /// (0x83). Call it on the thread the write failed on, right after: the
    /// cause is read from what the VFS recorded there.
    pub fn write_error(
        &self,
        conn: Option<&Connection>,
        context: String,
        size: u64,
        e: &rusqlite::Error,
    ) -> StorageError {
        let cause = self.cause_of(e);
        self.error_for(&cause, conn, context, size, e)
    }

    /// The page ceilings writes run under: the configured bound's, lowered
    /// to the file system's while that is in force. A relief write may
    /// still grow past the file system's by one reserve, which the room it
    /// gave up leaves free. `None`: no ceiling at all.
    pub(crate) fn ceilings(&self) -> Option<PageBounds> {
        self.ceilings_with(
            self.disk_ceiling.load(Ordering::Acquire),
            self.log_ceiling.load(Ordering::Acquire),
        )
    }

    /// [`Self::ceilings`] with the file system's ceiling at `disk` pages
    /// and the log's at `log` (0: none), the lower of them binding.
    fn ceilings_with(&self, disk: u64, log: u64) -> Option<PageBounds> {
        let disk = lower_ceiling(disk, log);
        if disk == 0 {
            return self.bounds;
        }
        let relief = disk.saturating_add(self.options.reserve.div_ceil(self.page_size));
        Some(match self.bounds {
            Some(b) => PageBounds {
                page_size: b.page_size,
                publish_pages: b.publish_pages.min(disk),
                relief_pages: b.relief_pages.min(relief),
            },
            None => PageBounds {
                page_size: self.page_size,
                publish_pages: disk,
                relief_pages: relief,
            },
        })
    }

    /// Whether the file system's ceiling (or the log's) is the lower one,
    /// so that a write refused at the ceiling was refused for want of room.
    fn disk_ceiling_binds(&self) -> bool {
        let disk = lower_ceiling(
            self.disk_ceiling.load(Ordering::Acquire),
            self.log_ceiling.load(Ordering::Acquire),
        );
        disk != 0 && self.bounds.is_none_or(|b| disk <= b.publish_pages)
    }

    /// Sets the file system's ceiling to `disk` pages and the log's to
    /// `log` (0: none) on the writer's connection `conn`, then records
    /// them: refusals at the ceiling the connection had until then keep
    /// their cause.
    fn set_ceilings(&self, conn: &Connection, disk: u64, log: u64) -> bool {
        let publish = self
            .ceilings_with(disk, log)
            .map_or(self.unbounded_pages, |c| c.publish_pages);
        let set = set_max_page_count(conn, publish).is_ok();
        if set {
            self.disk_ceiling.store(disk, Ordering::Release);
            self.log_ceiling.store(log, Ordering::Release);
        }
        self.room_moved();
        set
    }

    /// [`Self::set_ceilings`] with the file system's ceiling at `disk`.
    fn set_disk_ceiling(&self, conn: &Connection, disk: u64) -> bool {
        self.set_ceilings(conn, disk, self.log_ceiling.load(Ordering::Acquire))
    }

    /// [`Self::set_ceilings`] with the log's ceiling at `log`, on the
    /// writer.
    fn set_log_ceiling(&self, log: u64) -> bool {
        let Ok(writer) = self.writer() else {
            return false;
        };
        let disk = self.disk_ceiling.load(Ordering::Acquire);
        self.set_ceilings(writer.conn(), disk, log)
    }

    /// The file system is full: from now on the database holds at most the
    /// pages it holds, so no later checkpoint needs its file to grow.
    /// Returns those pages, or `None` when the writer could not be had.
    fn hold_to_disk(&self) -> Option<u64> {
        let writer = self.writer().ok()?;
        let conn = writer.conn();
        let pages: u64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).ok()?;
        self.set_disk_ceiling(conn, pages.max(1)).then_some(pages)
    }

    /// The file system has room again: the configured ceiling (or none).
    fn lift_disk_ceiling(&self) -> bool {
        let Ok(writer) = self.writer() else {
            return false;
        };
        self.set_disk_ceiling(writer.conn(), 0)
    }

    /// What of the checkpoint's room is allocated now.
    fn set_room_held(&self, bytes: u64) {
        if self.room_held.swap(bytes, Ordering::AcqRel) != bytes {
            self.room_moved();
        }
    }

    fn room_moved(&self) {
        *self.room_moves.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.room_moved.notify_all();
    }

    /// Why `e` happened, the provider's health moved accordingly. Taken
    /// once per failed statement: it consumes what the VFS recorded.
    pub(crate) fn cause_of(&self, e: &rusqlite::Error) -> Cause {
        if let Some(Health::Failed { kind, detail }) = self.failed_health() {
            vfs::clear_last();
            return Cause::Refused(kind, detail);
        }
        match classify(e, vfs::take_last(), self.ceilings().is_some()) {
            // The file system's ceiling: no room, not the configured bound.
            Some(FaultKind::Full) if self.disk_ceiling_binds() => {
                self.fault(FaultKind::NoSpace, &e.to_string());
                Cause::Disk(FaultKind::NoSpace)
            }
            Some(FaultKind::Full) => Cause::Bound,
            Some(kind) => {
                let detail = e.to_string();
                self.fault(kind, &detail);
                match self.failed_health() {
                    Some(Health::Failed { kind, detail }) => Cause::Refused(kind, detail),
                    _ => Cause::Disk(kind),
                }
            }
            None => Cause::Other,
        }
    }

    /// The error one write of a failed statement is answered with.
    pub(crate) fn error_for(
        &self,
        cause: &Cause,
        conn: Option<&Connection>,
        context: String,
        size: u64,
        e: &rusqlite::Error,
    ) -> StorageError {
        self.counters.storage_errors.fetch_add(1, Ordering::Relaxed);
        match cause {
            Cause::Bound => {
                let used = conn
                    .and_then(|c| {
                        c.query_row("PRAGMA page_count", [], |r| r.get::<_, u64>(0))
                            .ok()
                    })
                    .map_or(0, |pages| pages * self.page_size);
                let limit = self.bounds.map_or(0, |b| b.publish_pages * b.page_size);
                StorageError::ProviderFull {
                    provider: self.name.clone(),
                    size,
                    used,
                    limit,
                }
            }
            Cause::Disk(kind) => StorageError::Disk {
                kind: *kind,
                context: format!("storage {}: {context}", self.path.display()),
                detail: e.to_string(),
            },
            Cause::Refused(kind, detail) => StorageError::ProviderFailed {
                provider: self.name.clone(),
                kind: *kind,
                detail: detail.clone(),
            },
            Cause::Other => {
                if let rusqlite::Error::FromSqlConversionFailure(_, _, detail) = e {
                    return StorageError::Corrupt {
                        what: format!("storage {}: {context}", self.path.display()),
                        detail: detail.to_string(),
                    };
                }
                StorageError::Write {
                    context: format!("storage {}: {context}", self.path.display()),
                    detail: e.to_string(),
                }
            }
        }
    }

    /// The provider's health when it has failed.
    fn failed_health(&self) -> Option<Health> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        Some(
            self.health
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    /// A write is refused, without touching the file, once the provider
    /// has failed: after an I/O error or a failed fsync the file may not
    /// hold what SQLite believes it wrote (an fsync that fails once can
    /// succeed later over pages the kernel dropped), so nothing more is
    /// acknowledged on top of it until a restart has run SQLite's recovery.
    fn refuse_if_failed(&self) -> rusqlite::Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                Some(format!("provider {} has failed", self.name)),
            ));
        }
        Ok(())
    }

    /// The disk refused a write with `kind`: the provider's health moves,
    /// and the move - not each write - is logged. A sticky kind
    /// ([`FaultKind::is_sticky`]) fails the provider until it is opened
    /// again; no room marks it so until a publish finds room
    /// ([`Shared::room_again`]).
    pub(crate) fn fault(&self, kind: FaultKind, detail: &str) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*health, Health::Failed { .. }) {
            return;
        }
        if kind.is_sticky() {
            *health = Health::Failed {
                kind,
                detail: detail.to_owned(),
            };
            self.failed.store(true, Ordering::Release);
            tracing::error!(provider = %self.name, file = %self.path.display(), kind = kind.label(), error = %detail,
                "storage provider failed: every write to it is refused (0x83) until the broker is restarted, which runs SQLite's recovery; reads go on");
        } else if kind == FaultKind::NoSpace && *health == Health::Writing {
            *health = Health::NoSpace;
            tracing::error!(provider = %self.name, file = %self.path.display(), kind = kind.label(), error = %detail,
                "no space left for the storage provider: writes that need room are refused (0x83) until there is room again; nothing stored is lost");
        }
    }

    /// A publish was stored: if the provider was out of room, it has room
    /// again.
    pub(crate) fn room_again(&self) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if *health == Health::NoSpace {
            *health = Health::Writing;
            tracing::info!(provider = %self.name, file = %self.path.display(),
                "the storage provider has room again: writes succeed");
        }
    }

    /// The provider's health.
    pub fn health(&self) -> Health {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Creates the channel's row if absent (next = floor = 1) and returns
    /// its counters (next, floor, bytes), refusing a row of another kind.
    fn channel_row(&self, name: &str, kind: ChannelKind) -> contract::Result<(u64, u64, u64)> {
        let mut w = self.writer()?;
        let out = w.txn(false, |conn| {
            conn.execute(
                "INSERT INTO channels (name, kind, next, floor, bytes) VALUES (?1, ?2, 1, 1, 0)
                 ON CONFLICT (name) DO NOTHING",
                rusqlite::params![name, kind.as_str()],
            )?;
            conn.query_row(
                "SELECT kind, next, floor, bytes FROM channels WHERE name = ?1",
                [name],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, u64>(1)?,
                        r.get::<_, u64>(2)?,
                        r.get::<_, u64>(3)?,
                    ))
                },
            )
        });
        let (stored, next, floor, bytes) = out.map_err(|e| {
            self.write_error(Some(w.conn()), format!("opening channel {name}"), 0, &e)
        })?;
        let stored = parse_kind(&stored).ok_or_else(|| StorageError::Corrupt {
            what: format!("storage {}: channel {name}", self.path.display()),
            detail: format!("kind {stored:?} is not append, latest or queue"),
        })?;
        if floor > next || floor == 0 {
            return Err(StorageError::Corrupt {
                what: format!("storage {}: channel {name}", self.path.display()),
                detail: format!("floor {floor} and next {next} contradict each other"),
            });
        }
        if stored != kind {
            return Err(StorageError::KindMismatch {
                channel: name.to_string(),
                configured: kind,
                stored,
            });
        }
        Ok((next, floor, bytes))
    }

    /// Every stored position of `channel`, by reader.
    fn load_positions(&self, channel: &str) -> contract::Result<BTreeMap<String, u64>> {
        self.read(
            || format!("channel {channel}: reading positions"),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_POSITIONS_OFFSETS)?;
                let rows = stmt.query_map([channel], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?))
                })?;
                rows.collect()
            },
        )
    }

    /// A channel's position of `reader`, read on a read connection.
    pub fn position(&self, channel: &str, reader: &Reader) -> contract::Result<Option<Position>> {
        let name = reader.to_string();
        let row = self.read(
            || format!("channel {channel}: reading the position of {name}"),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_POSITION)?;
                let mut rows = stmt.query(rusqlite::params![channel, name])?;
                match rows.next()? {
                    Some(r) => Ok(Some((
                        r.get::<_, u64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Option<u32>>(2)?,
                    ))),
                    None => Ok(None),
                }
            },
        )?;
        Ok(row.map(|(offset, saved_at, session_expiry)| Position {
            reader: reader.clone(),
            offset,
            saved_at,
            session_expiry,
        }))
    }

    pub fn positions(&self, channel: &str) -> contract::Result<Vec<Position>> {
        let rows = self.read(
            || format!("channel {channel}: reading positions"),
            |conn| {
                let mut stmt = conn.prepare_cached(SQL_POSITIONS)?;
                let rows = stmt.query_map([channel], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, u64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<u32>>(3)?,
                    ))
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            },
        )?;
        rows.into_iter()
            .map(|(reader, offset, saved_at, session_expiry)| {
                let reader = Reader::parse(&reader).map_err(|e| StorageError::Corrupt {
                    what: format!(
                        "storage {}: channel {channel} positions",
                        self.path.display()
                    ),
                    detail: e.to_string(),
                })?;
                Ok(Position {
                    reader,
                    offset,
                    saved_at,
                    session_expiry,
                })
            })
            .collect()
    }

    /// Stores a position: a relief write (it may use the reserve). A
    /// position never leads the channel (`offset` within `1..=next`), an
    /// `mqtt:` reader states its session expiry and a `bridge:` reader none.
    pub fn save_position(
        &self,
        channel: &str,
        position: &Position,
        next: u64,
    ) -> contract::Result<()> {
        contract::check_position(channel, position, next)?;
        let name = position.reader.to_string();
        let mut w = self.writer()?;
        w.txn(true, |conn| {
            conn.prepare_cached(
                "INSERT INTO positions (channel, reader, offset, saved_at, session_expiry)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (channel, reader) DO UPDATE SET offset = excluded.offset,
                     saved_at = excluded.saved_at, session_expiry = excluded.session_expiry",
            )?
            .execute(rusqlite::params![
                channel,
                name,
                position.offset,
                position.saved_at,
                position.session_expiry
            ])
        })
        .map(|_| ())
        .map_err(|e| {
            self.write_error(
                Some(w.conn()),
                format!("channel {channel}: saving the position of {name}"),
                0,
                &e,
            )
        })
    }

    pub fn drop_position(&self, channel: &str, reader: &Reader) -> contract::Result<bool> {
        let name = reader.to_string();
        let mut w = self.writer()?;
        w.txn(true, |conn| {
            conn.prepare_cached("DELETE FROM positions WHERE channel = ?1 AND reader = ?2")?
                .execute(rusqlite::params![channel, name])
        })
        .map(|n| n > 0)
        .map_err(|e| {
            self.write_error(
                Some(w.conn()),
                format!("channel {channel}: dropping the position of {name}"),
                0,
                &e,
            )
        })
    }

    /// Refuses a publish-class write (a hold) while publishes are refused
    /// for want of room: set by a publish meeting SQLITE_FULL, cleared by
    /// any commit that stored a publish or removed something.
    pub fn refuse_if_publishes_are(&self, size: u64) -> contract::Result<()> {
        if self.publishes_full.load(Ordering::Acquire) {
            let used = self.provider_bytes();
            let limit = self.bounds.map_or(0, |b| b.publish_pages * b.page_size);
            return Err(StorageError::ProviderFull {
                provider: self.name.clone(),
                size,
                used,
                limit,
            });
        }
        Ok(())
    }

    /// Publishes met the ceiling (or, `false`, room was found or made).
    pub fn set_publishes_full(&self, full: bool) {
        self.publishes_full.store(full, Ordering::Release);
    }

    fn provider_bytes(&self) -> u64 {
        self.read(
            || "reading the page count".into(),
            |conn| conn.query_row("PRAGMA page_count", [], |r| r.get::<_, u64>(0)),
        )
        .map_or(0, |pages| pages * self.page_size)
    }
}

/// Why a statement failed, as [`Shared::cause_of`] read it.
pub(crate) enum Cause {
    /// The page ceiling: the provider's configured bound (0x97).
    Bound,
    /// The disk refused the write; the provider may go on.
    Disk(FaultKind),
    /// The provider has failed (by this write or before it).
    Refused(FaultKind, String),
    /// Anything else.
    Other,
}

/// What kind of disk fault `e` was, from SQLite's code and the `errno` the
/// VFS recorded for the file operation behind it; `Some(Full)` for the
/// page ceiling, `None` for what is not the disk's.
fn classify(
    e: &rusqlite::Error,
    recorded: Option<vfs::Failed>,
    bounded: bool,
) -> Option<FaultKind> {
    use rusqlite::ffi;
    let rusqlite::Error::SqliteFailure(err, _) = e else {
        return None;
    };
    let by_errno = recorded.and_then(|f| FaultKind::of_errno(f.errno));
    let ext = err.extended_code;
    if ext == ffi::SQLITE_IOERR_FSYNC
        || ext == ffi::SQLITE_IOERR_DIR_FSYNC
        || recorded.is_some_and(|f| f.op == vfs::Op::Sync)
    {
        return Some(FaultKind::of_failed_sync(recorded.map(|f| f.errno)));
    }
    match err.code {
        // The unix VFS answers ENOSPC on a write with SQLITE_FULL, as the
        // pager does the page ceiling: the recorded errno tells them apart.
        ErrorCode::DiskFull => Some(by_errno.unwrap_or(if bounded {
            FaultKind::Full
        } else {
            FaultKind::NoSpace
        })),
        ErrorCode::SystemIoFailure if ext == ffi::SQLITE_IOERR_NOMEM => None,
        ErrorCode::SystemIoFailure => Some(by_errno.unwrap_or(FaultKind::Io)),
        ErrorCode::ReadOnly | ErrorCode::CannotOpen => by_errno,
        _ => None,
    }
}

pub(crate) fn parse_kind(kind: &str) -> Option<ChannelKind> {
    match kind {
        "append" => Some(ChannelKind::Append),
        "latest" => Some(ChannelKind::Latest),
        "queue" => Some(ChannelKind::Queue),
        _ => None,
    }
}

const SQL_POSITION: &str =
    "SELECT offset, saved_at, session_expiry FROM positions WHERE channel = ?1 AND reader = ?2";
const SQL_POSITIONS: &str =
    "SELECT reader, offset, saved_at, session_expiry FROM positions WHERE channel = ?1 ORDER BY reader";
const SQL_POSITIONS_OFFSETS: &str = "SELECT reader, offset FROM positions WHERE channel = ?1";

/// Every statement a read connection runs: all are prepared on one read
/// connection when the provider opens, and each is cached on every
/// connection once used, so a statement is parsed at most once a
/// connection.
fn read_statements() -> Vec<String> {
    let mut all = vec![
        SQL_POSITION.to_string(),
        SQL_POSITIONS.to_string(),
        SQL_POSITIONS_OFFSETS.to_string(),
    ];
    all.extend(append::READ_STATEMENTS.iter().map(|s| s.to_string()));
    all.extend(latest::read_statements());
    all.extend(queue::read_statements());
    all.extend(session::read_statements());
    all.push(held::SQL_ALL.to_string());
    all
}

/// How often, at most, the flusher checkpoints the write-ahead log into
/// the database while commits keep coming. Off the writer a checkpoint's
/// fsyncs still hold commits back a little (the file system's journal is
/// shared): PUBACK p99 at 5,000 publishes/s was 3.3-4.2 ms on this machine
/// whether checkpoints ran every second or every ten (15-506 ms while the
/// writer ran them).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// The log in use past which the flusher starts it again from its
/// beginning ([`FlushLoop::restart_log`]): the disk a busy provider takes
/// beside `max_bytes`.
pub const WAL_RESTART_BYTES: u64 = 64 * 1024 * 1024;

/// Frames a checkpoint on the writer may be left to copy: about 4 MiB,
/// a few milliseconds of copying with commits held.
const WRITER_CHECKPOINT_FRAMES: i64 = 1024;

/// Checkpoints off the writer, at most, to bring what is left for the
/// writer's down to [`WRITER_CHECKPOINT_FRAMES`]; each copies what the
/// last left, so a writer committing faster than they copy is the only
/// way to need more.
const CHECKPOINTS_BEFORE_RESTART: usize = 4;

/// The WAL flusher: every `flush_interval`, fsync the write-ahead log when
/// something committed since the last fsync (synchronous=NORMAL syncs only
/// at checkpoints); and at most every [`CHECKPOINT_EVERY`] (every turn
/// while the log's file is past [`WAL_RESTART_BYTES`]), when something
/// committed since, a passive checkpoint on a connection of its own. The
/// writer never checkpoints on its own (`wal_autocheckpoint = 0`): a
/// checkpoint's fsyncs there would stall every commit behind it - a
/// publisher's PUBACK waited up to 300 ms for one on this machine's disk.
/// Only to start the log again does the flusher take the writer, for the
/// last few frames ([`FlushLoop::restart_log`]). An idle provider writes
/// nothing.
struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

impl Flusher {
    /// `room_file`: where the checkpoint's room is kept (`None`: none).
    fn start(
        shared: &Arc<Shared>,
        interval: Duration,
        checkpointer: Connection,
        room_file: Option<PathBuf>,
    ) -> io::Result<Flusher> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let counters = Arc::clone(&shared.counters);
        // Read here, not in the thread: a thread slow to start would
        // otherwise count commits made meanwhile as already flushed.
        let flushed = counters.commits.load(Ordering::Acquire);
        let mut flush = FlushLoop {
            name: shared.name.clone(),
            wal_path: wal_path(&shared.path),
            wal: None,
            restart_bytes: shared.options.wal_restart_bytes,
            restart_frames: (shared.options.wal_restart_bytes / (shared.page_size + 24)).max(1)
                as i64,
            shared: Arc::downgrade(shared),
            counters,
            checkpointer,
            flushed,
            failing: false,
            checkpointed: flushed,
            last_checkpoint: std::time::Instant::now(),
            checkpoint_failing: false,
            checkpoint_found_no_room: false,
            room: room_file
                .map(|file| crate::storage::room::Room::at(file, shared.options.checkpoint_room)),
            faults: shared.faults.clone(),
        };
        // A room a previous run left whole is held from the start: no try
        // to take it is due, and the gauge must not read it as missing.
        if let Some(room) = &flush.room {
            shared.set_room_held(room.kept());
        }
        let stop_seen = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("sqlite-flush-{}", shared.name))
            .spawn(move || {
                let (stopped, cv) = &*stop_seen;
                let mut guard = stopped.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    let (g, _) = cv
                        .wait_timeout(guard, interval)
                        .unwrap_or_else(|e| e.into_inner());
                    guard = g;
                    let stopping = *guard;
                    let now = flush.counters.commits.load(Ordering::Acquire);
                    flush.sync(now);
                    if stopping {
                        return;
                    }
                    flush.checkpoint(now);
                    flush.keep_room();
                }
            })?;
        Ok(Flusher { stop, thread })
    }

    fn stop(self) {
        let (stopped, cv) = &*self.stop;
        *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        let _ = self.thread.join();
    }
}

/// What the flusher's thread keeps between its turns.
struct FlushLoop {
    name: String,
    wal_path: PathBuf,
    /// The log's descriptor, kept between fsyncs.
    wal: Option<std::fs::File>,
    /// [`WAL_RESTART_BYTES`], and in frames of this file's page size.
    restart_bytes: u64,
    restart_frames: i64,
    /// Weak: the provider owns the flusher, and stops it before it closes.
    shared: std::sync::Weak<Shared>,
    counters: Arc<Counters>,
    checkpointer: Connection,
    /// The commit count at the last fsync, and whether fsyncs fail.
    flushed: u64,
    failing: bool,
    /// The commit count at the last checkpoint, and when it ran.
    checkpointed: u64,
    last_checkpoint: std::time::Instant,
    checkpoint_failing: bool,
    /// The last checkpoint failed for want of room on the file system.
    checkpoint_found_no_room: bool,
    /// The checkpoint's room, unless the configuration keeps none.
    room: Option<crate::storage::room::Room>,
    /// The provider's planned failures, asked before each fsync of the log.
    faults: Option<Arc<vfs::Faults>>,
}

/// What `PRAGMA wal_checkpoint` answers.
struct Checkpointed {
    /// Frames in the log.
    log: i64,
    /// Frames of it copied into the database.
    copied: i64,
}

fn checkpoint_on(conn: &Connection) -> rusqlite::Result<Checkpointed> {
    // PASSIVE: copies what no reader still needs and never waits for the
    // writer or a reader.
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok(Checkpointed {
            log: r.get(1)?,
            copied: r.get(2)?,
        })
    })
}

impl FlushLoop {
    /// fsync the log when something committed since the last one.
    /// A failed fsync is never tried again as though the data were safe:
    /// the kernel may have dropped the pages it could not write and marked
    /// them clean, so a later fsync can succeed over a log that lost them.
    /// The provider fails instead ([`Shared::fault`]), refusing every write
    /// until a restart has run SQLite's recovery over what the disk holds.
    fn sync(&mut self, commits: u64) {
        if commits == self.flushed || self.failing {
            return;
        }
        let planned = self
            .faults
            .as_ref()
            .and_then(|f| f.injected(vfs::FileRole::Wal, vfs::Op::Sync));
        let synced = match planned {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => sync_wal(&self.wal_path, &mut self.wal),
        };
        match synced {
            Ok(()) => {
                self.flushed = commits;
                self.counters.flushes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.storage_errors.fetch_add(1, Ordering::Relaxed);
                self.failing = true;
                self.wal = None;
                let detail = format!("fsync of {}: {e}", self.wal_path.display());
                let kind = FaultKind::of_failed_sync(e.raw_os_error());
                match self.shared.upgrade() {
                    Some(shared) => shared.fault(kind, &detail),
                    None => tracing::error!(provider = %self.name, error = %detail,
                        "write-ahead log flush failed; acknowledged commits may not be durable"),
                }
            }
        }
    }

    /// Has the provider failed (its writes refused until a restart)?
    fn provider_failed(&self) -> bool {
        self.failing
            || self
                .shared
                .upgrade()
                .is_some_and(|s| s.failed.load(Ordering::Acquire))
    }

    /// A checkpoint when one is due and something committed since the
    /// last, and the log started again once it passed its bound. Due every
    /// [`CHECKPOINT_EVERY`], and at every turn while the log's file is past
    /// the bound: a writer fills it at tens of MB a second (48 MB/s from
    /// one publisher on this machine), so a second's wait is that much
    /// more disk taken.
    fn checkpoint(&mut self, commits: u64) {
        // Held to the room, the log is copied again with nothing committed
        // (publishes refused): what lets go is the checkpoint after the
        // reader that kept it.
        let held_to_room = self
            .shared
            .upgrade()
            .is_some_and(|s| s.log_ceiling.load(Ordering::Acquire) != 0);
        if (commits == self.checkpointed && !held_to_room)
            || (self.last_checkpoint.elapsed() < CHECKPOINT_EVERY && !self.log_past_bound())
            || self.provider_failed()
        {
            return;
        }
        self.last_checkpoint = std::time::Instant::now();
        let mut done = self.checkpoint_once(commits);
        if done.is_none() && self.checkpoint_found_no_room {
            done = self.checkpoint_with_room(commits);
        }
        for _ in 1..CHECKPOINTS_BEFORE_RESTART {
            match done {
                Some(c)
                    if c.log >= self.restart_frames
                        && c.log - c.copied > WRITER_CHECKPOINT_FRAMES =>
                {
                    done = self.checkpoint_once(commits);
                }
                _ => break,
            }
        }
        if let Some(c) = &done {
            if c.log >= self.restart_frames && c.log - c.copied <= WRITER_CHECKPOINT_FRAMES {
                self.restart_log();
            }
        }
        self.hold_to_room(done.as_ref(), commits);
    }

    /// Whether the log's file has grown past [`WAL_RESTART_BYTES`]. The
    /// writer's `journal_size_limit` cuts it back to exactly that at each
    /// restart, so only a log longer than the bound makes it larger.
    fn log_past_bound(&self) -> bool {
        std::fs::metadata(&self.wal_path).is_ok_and(|m| m.len() > self.restart_bytes)
    }

    fn checkpoint_once(&mut self, commits: u64) -> Option<Checkpointed> {
        vfs::clear_last();
        match checkpoint_on(&self.checkpointer) {
            Ok(c) => {
                self.checkpointed = commits;
                self.checkpoint_found_no_room = false;
                if self.checkpoint_failing {
                    tracing::info!(provider = %self.name, "checkpointing the write-ahead log succeeds again");
                }
                self.checkpoint_failing = false;
                Some(c)
            }
            Err(e) => {
                // A checkpoint that found no room leaves the log whole (it
                // is copied again by the next); one that met an I/O error
                // or a failed fsync fails the provider.
                let kind = match self.shared.upgrade() {
                    Some(shared) => {
                        shared
                            .counters
                            .storage_errors
                            .fetch_add(1, Ordering::Relaxed);
                        match shared.cause_of(&e) {
                            Cause::Disk(kind) | Cause::Refused(kind, _) => Some(kind),
                            Cause::Bound | Cause::Other => None,
                        }
                    }
                    None => None,
                };
                self.checkpoint_found_no_room = kind == Some(FaultKind::NoSpace);
                if !self.checkpoint_failing && !kind.is_some_and(FaultKind::is_sticky) {
                    tracing::warn!(provider = %self.name, error = %e, kind = kind.unwrap_or(FaultKind::Other).label(),
                        "checkpointing the write-ahead log failed; the log grows until one succeeds");
                }
                self.checkpoint_failing = true;
                None
            }
        }
    }

    /// Starts the log again from its beginning, so it stops growing. SQLite
    /// writes from the log's start only when a commit finds the whole log
    /// copied into the database and no reader still in it, which
    /// checkpoints beside a writer that keeps committing never achieve:
    /// each ends behind the commits made while it ran. So, holding the
    /// writer between two transactions and once this provider's readers
    /// have ended the reads they began (within a few milliseconds, or the
    /// next turn tries again), the last frames are copied on the writer
    /// itself, with its two fsyncs, and one write that changes nothing
    /// starts the log. Commits and reads wait meanwhile: 5-9 ms at 5,000
    /// publishes/s on this machine, once every 64 MiB of log. A reader of
    /// another process still in the log keeps it going on, until a turn
    /// finds it gone.
    fn restart_log(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let Ok(mut writer) = shared.writer() else {
            return;
        };
        let before = wal_header(&self.wal_path);
        let held_since = std::time::Instant::now();
        let started = shared.with_readers_idle(READERS_IDLE_WITHIN, || {
            match checkpoint_on(writer.conn()) {
                Ok(c) if c.copied == c.log => {}
                // A reader of another process is in the log.
                Ok(_) => return Ok(false),
                Err(e) => return Err(("checkpointing the write-ahead log on the writer", e)),
            }
            writer
                // The header page written with the value it holds: SQLite
                // skips a row rewritten with the same bytes, not this.
                .txn(false, |conn| {
                    conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
                })
                .map(|_| true)
                .map_err(|e| ("starting the write-ahead log again", e))
        });
        match started {
            // SQLite writes a new header, with a new salt, when it starts
            // the log again.
            Some(Ok(true)) if before.is_some() && wal_header(&self.wal_path) != before => {
                self.counters.wal_restarts.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(provider = %self.name,
                    writes_held_ms = held_since.elapsed().as_secs_f64() * 1000.0,
                    "write-ahead log started again from its beginning");
            }
            Some(Ok(_)) | None => {}
            Some(Err((context, e))) => {
                let e = shared.write_error(Some(writer.conn()), context.into(), 0, &e);
                if !self.checkpoint_failing {
                    tracing::warn!(provider = %self.name, error = %e,
                        "starting the write-ahead log again failed; the log grows until it succeeds");
                }
                self.checkpoint_failing = true;
            }
        }
    }
}

/// How long the flusher waits, holding the writer, for this provider's
/// readers to end the reads they began before the whole log was copied.
const READERS_IDLE_WITHIN: Duration = Duration::from_millis(5);

/// The write-ahead log's 32-byte header, or `None` when it cannot be read.
fn wal_header(path: &Path) -> Option<[u8; 32]> {
    use std::io::Read;
    let mut header = [0u8; 32];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .ok()?;
    Some(header)
}

fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// fsync the write-ahead log. The descriptor is kept between flushes; SQLite
/// places no locks on the `-wal` file, so holding it is harmless.
fn sync_wal(path: &Path, wal: &mut Option<std::fs::File>) -> io::Result<()> {
    if wal.is_none() {
        match std::fs::File::open(path) {
            Ok(f) => *wal = Some(f),
            // No log yet: nothing committed through it to sync.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    match wal {
        Some(f) => f.sync_data(),
        None => Ok(()),
    }
}

/// Pragmas every connection gets at open, before anything else runs.
fn apply_connection_pragmas(conn: &Connection, query_only: bool) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(5))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "journal_mode stayed {mode:?}; WAL is required"
        )));
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL")?;
    if query_only {
        conn.execute_batch("PRAGMA query_only = 1")?;
    }
    Ok(())
}

/// Creates the database file at 0600 if it does not exist, before SQLite
/// sees it (SQLite would create it 0644 less the umask).
fn create_private(path: &Path) -> io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// A sqlite storage provider.
pub struct SqliteProvider {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SqliteProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteProvider")
            .field("name", &self.shared.name)
            .field("path", &self.shared.path)
            .finish()
    }
}

impl SqliteProvider {
    /// Opens (creating if absent) the provider's database: the lock first,
    /// then the file, the schema or its version check, the position sweep,
    /// the readers and the flusher. A provider whose checkpoint's room was
    /// given up and not taken back since opens held to what it holds
    /// ([`room`]). An open that finds no room on the file system (its
    /// write-ahead log's index, recovery's writes) gives up part of the
    /// room, then all of it, and opens again, held to what it holds: a
    /// broker restarted on a file system that filled while it was down
    /// serves what it stores.
    pub fn open(options: SqliteOptions) -> Result<SqliteProvider, SqliteOpenError> {
        // Beside the file a symlink leads to, as SQLite's own files are:
        // the room must be on the database's file system.
        let db =
            std::fs::canonicalize(&options.file_path).unwrap_or_else(|_| options.file_path.clone());
        if options.checkpoint_room == 0 {
            let opened = Self::open_once(options.clone(), None, false);
            if opened.is_ok() {
                room::warn_if_the_file_system_is_short(&options, &db);
            }
            return opened;
        }
        let mut room =
            crate::storage::room::Room::at(room::room_path(&db), options.checkpoint_room);
        // Given up and not taken back: taken now if it fits, so a start on
        // a file system that has room again is not held for a turn.
        if room.is_given_up() {
            let _ = room.take(std::time::Instant::now());
        }
        let room_file = room.path().to_path_buf();
        let mut opened = Self::open_once(options.clone(), Some(&room_file), room.is_given_up());
        for wanted in [room::GIVEN_TO_AN_OPEN, u64::MAX] {
            match &opened {
                Err(e) if e.is_for_want_of_room() && room.kept() > 0 => {
                    let given = match room.give(wanted) {
                        Ok(given) => given,
                        Err(give) => {
                            tracing::error!(provider = %options.name, file = %room.path().display(), error = %give,
                                "giving up the checkpoint's room failed");
                            break;
                        }
                    };
                    tracing::warn!(provider = %options.name, file = %options.file_path.display(), error = %e,
                        given_bytes = given, room_left_bytes = room.kept(),
                        "no room on the file system to open the storage provider: gave up the checkpoint's room to open it; it keeps at most what it holds (publishes beyond refused with 0x83) until the room is taken back whole");
                }
                _ => break,
            }
            opened = Self::open_once(options.clone(), Some(&room_file), true);
        }
        if opened.is_ok() {
            room::warn_if_the_file_system_is_short(&options, &db);
        }
        opened
    }

    /// One open; `held_to_disk`: the provider starts held to what it
    /// holds, its room given up.
    fn open_once(
        options: SqliteOptions,
        room_file: Option<&Path>,
        held_to_disk: bool,
    ) -> Result<SqliteProvider, SqliteOpenError> {
        let path = options.file_path.clone();
        let settings = |detail: String| SqliteOpenError::Settings {
            path: path.clone(),
            detail,
        };
        if options.flush_interval < FLUSH_INTERVAL_MIN
            || options.flush_interval > FLUSH_INTERVAL_MAX
        {
            return Err(settings(format!(
                "flush_interval {:?} is outside 10ms..1s",
                options.flush_interval
            )));
        }
        if options
            .publish_commit_interval
            .is_some_and(|i| i > PUBLISH_COMMIT_INTERVAL_MAX)
        {
            return Err(settings("publish_commit_interval is longer than 1s".into()));
        }
        if options.publish_commit_max_records == 0 {
            return Err(settings("publish_commit_max_records is 0".into()));
        }
        // Checked before the lock and the file: a refused bound creates nothing.
        if let Some(max) = options.max_bytes {
            PageBounds::compute(max, options.reserve, PAGE_SIZE).map_err(settings)?;
        }

        let guard = lock::acquire(&lock::lock_path_for_database(&path))?;
        let io_err = |context, source| SqliteOpenError::Io {
            path: path.clone(),
            context,
            source,
        };
        // A failure of a file call that had no room is named as such: at
        // an open, SQLite calls running out of room for the write-ahead
        // log's index an I/O error.
        let sql_err = |context, source| match vfs::take_last() {
            Some(failed) if matches!(failed.errno, libc::ENOSPC | libc::EDQUOT) => {
                SqliteOpenError::NoSpace {
                    path: path.clone(),
                    context,
                    source,
                }
            }
            _ => SqliteOpenError::Sqlite {
                path: path.clone(),
                context,
                source,
            },
        };
        vfs::clear_last();
        create_private(&path).map_err(|e| io_err("creating the database file", e))?;
        vfs::register().map_err(|detail| settings(format!("the file wrapper: {detail}")))?;
        let faults = match std::env::var(vfs::INJECT_ENV) {
            Ok(spec) => {
                let faults = vfs::Faults::parse(&spec, &options.name).map_err(settings)?;
                (!faults.is_empty()).then(|| Arc::new(faults))
            }
            // A plan a test armed for this file itself.
            Err(_) => vfs::armed(&path),
        };
        if let Some(faults) = &faults {
            tracing::warn!(provider = %options.name, file = %path.display(), plan = %std::env::var(vfs::INJECT_ENV).unwrap_or_default(),
                "failures are injected into this provider's files ({})", vfs::INJECT_ENV);
            vfs::arm(&path, Arc::clone(faults));
        }
        let open_conn = |context| {
            Connection::open_with_flags_and_vfs(
                &path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                vfs::VFS_NAME,
            )
            .map_err(|e| sql_err(context, e))
        };
        let mut writer = open_conn("opening the database")?;
        // The page size only takes on a file with no pages yet; it must be
        // set before WAL mode writes the header.
        let pages: u64 = writer
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(|e| sql_err("reading the database header", e))?;
        if pages == 0 {
            writer
                .execute_batch(&format!("PRAGMA page_size = {PAGE_SIZE}"))
                .map_err(|e| sql_err("setting the page size", e))?;
        } else {
            schema::refuse_foreign(&writer, &path)?;
        }
        apply_connection_pragmas(&writer, false)
            .map_err(|e| sql_err("setting WAL and synchronous=NORMAL", e))?;
        // The flusher checkpoints, on a connection of its own.
        writer
            .execute_batch("PRAGMA wal_autocheckpoint = 0")
            .map_err(|e| sql_err("turning off checkpoints on the writer", e))?;
        // The log is started again on the writer (`FlushLoop::restart_log`),
        // which then cuts its file back to this: what a burst grew it to is
        // given back to the disk, and the file's size is the log's.
        writer
            .query_row(
                &format!("PRAGMA journal_size_limit = {}", options.wal_restart_bytes),
                [],
                |_| Ok(()),
            )
            .map_err(|e| sql_err("bounding the write-ahead log's file", e))?;
        schema::apply_or_check(&mut writer, &path, WRITER_REVISION, lock::unix_nanos_now())?;
        // On a file made elsewhere the page size is read back, never assumed.
        let page_size: u64 = writer
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| sql_err("reading the page size", e))?;
        let unbounded_pages: u64 = writer
            .query_row("PRAGMA max_page_count", [], |r| r.get(0))
            .map_err(|e| sql_err("reading max_page_count", e))?;
        let bounds = match options.max_bytes {
            Some(max) => {
                let b = PageBounds::compute(max, options.reserve, page_size).map_err(settings)?;
                set_max_page_count(&writer, b.publish_pages)
                    .map_err(|e| sql_err("setting max_page_count", e))?;
                tracing::info!(provider = %options.name, file = %path.display(), max_bytes = max,
                    page_size, publish_pages = b.publish_pages, reserve_bytes = options.reserve,
                    publishes_stop_at = b.publish_pages * page_size, relief_ceiling = b.relief_pages * page_size,
                    "sqlite provider bound");
                Some(b)
            }
            None => None,
        };
        writer.set_prepared_statement_cache_capacity(64);

        let mut readers = Vec::with_capacity(options.read_connections);
        let statements = read_statements();
        for n in 0..options.read_connections {
            let conn = open_conn("opening a read connection")?;
            apply_connection_pragmas(&conn, true)
                .map_err(|e| sql_err("setting up a read connection", e))?;
            conn.set_prepared_statement_cache_capacity(statements.len() + 8);
            // Every read statement is prepared here once, so a file whose
            // tables lack a column is refused at open rather than at a
            // read. It is prepared on the connection a read takes first
            // (the pool's last), and the other connections prepare each at
            // its first use, which keeps three quarters of that parsing out
            // of a start.
            if n + 1 == options.read_connections {
                for sql in &statements {
                    conn.prepare_cached(sql)
                        .map_err(|e| sql_err("preparing the read statements", e))?;
                }
            }
            readers.push(conn);
        }

        let checkpointer = open_conn("opening the checkpoint connection")?;
        apply_connection_pragmas(&checkpointer, false)
            .map_err(|e| sql_err("setting up the checkpoint connection", e))?;
        let counters = Arc::new(Counters::default());
        let flush_interval = options.flush_interval;
        let shared = Arc::new(Shared {
            name: options.name.clone(),
            path: path.clone(),
            batcher: batch::Batcher::new(
                options.publish_commit_interval,
                options.publish_commit_max_records,
            ),
            options,
            writer: Mutex::new(Some(writer)),
            scope: Mutex::new(None),
            scope_ended: Condvar::new(),
            reader_count: readers.len(),
            readers_held: AtomicBool::new(false),
            readers: Mutex::new(readers),
            readers_free: Condvar::new(),
            closed: AtomicBool::new(false),
            publishes_full: AtomicBool::new(false),
            health: Mutex::new(Health::Writing),
            failed: AtomicBool::new(false),
            faults,
            counters,
            bounds,
            disk_ceiling: AtomicU64::new(0),
            log_ceiling: AtomicU64::new(0),
            room_short: AtomicBool::new(false),
            unbounded_pages,
            room_held: AtomicU64::new(0),
            room_moves: Mutex::new(0),
            room_moved: Condvar::new(),
            page_size,
            registry: Mutex::new(Registry::default()),
            flusher: Mutex::new(None),
            lock: Mutex::new(Some(guard)),
        });
        if held_to_disk && shared.hold_to_disk().is_none() {
            return Err(SqliteOpenError::Settings {
                path,
                detail: "holding the provider to what it holds failed".into(),
            });
        }
        let flusher = Flusher::start(
            &shared,
            flush_interval,
            checkpointer,
            room_file.map(Path::to_path_buf),
        )
        .map_err(|e| io_err("starting the flusher", e))?;
        *shared.flusher.lock().unwrap_or_else(|e| e.into_inner()) = Some(flusher);
        let provider = SqliteProvider { shared };
        provider
            .recover()
            .map_err(|source| SqliteOpenError::Recovery {
                path: path.clone(),
                source,
            })?;
        Ok(provider)
    }

    /// Recovery at open: nothing about queue work (none of the delivery
    /// state is stored), and the positions whose sessions expired while the
    /// broker was down are dropped - unconditionally, clean shutdown or not.
    /// Broadcast-log cursors are not judged by expiry: one goes when its
    /// session is not held.
    fn recover(&self) -> contract::Result<()> {
        let shared = &self.shared;
        let now = contract::now_nanos();
        let max_expiry = shared.options.max_session_expiry;
        let positions: Vec<(String, String, i64, Option<u32>)> = shared.read(
            || "reading positions for the expiry sweep".into(),
            |conn| {
                let mut stmt = conn.prepare(
                    "SELECT channel, reader, saved_at, session_expiry FROM positions WHERE reader LIKE 'mqtt:%' AND channel != ?1",
                )?;
                let rows = stmt.query_map([BROADCAST_LOG_NAME], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
                rows.collect()
            },
        )?;
        let expired: Vec<(String, String)> = positions
            .into_iter()
            .filter(|(_, reader, saved_at, session_expiry)| {
                Reader::parse(reader).is_ok_and(|reader| {
                    Position {
                        reader,
                        offset: 0,
                        saved_at: *saved_at,
                        session_expiry: *session_expiry,
                    }
                    .expired_at(now, max_expiry)
                })
            })
            .map(|(c, r, _, _)| (c, r))
            .collect();
        let mut w = shared.writer()?;
        let (dropped, dropped_cursors) = w
            .txn(true, |conn| {
                let mut dropped: BTreeMap<&str, usize> = BTreeMap::new();
                for (channel, reader) in &expired {
                    *dropped.entry(channel).or_default() += conn.execute(
                        "DELETE FROM positions WHERE channel = ?1 AND reader = ?2",
                        rusqlite::params![channel, reader],
                    )?;
                }
                // Each cursor looks its session up by the key's index: a
                // list of every session's reader name, made for a `NOT IN`,
                // took 75 ms at 100,000 sessions where this takes 50.
                let cursors = conn.execute(
                    "DELETE FROM positions WHERE channel = ?1 AND NOT (
                         substr(reader, 1, 5) = 'mqtt:'
                         AND EXISTS (SELECT 1 FROM sessions WHERE client_id = substr(reader, 6)))",
                    [BROADCAST_LOG_NAME],
                )?;
                Ok((dropped, cursors))
            })
            .map_err(|e| {
                shared.write_error(Some(w.conn()), "dropping expired positions".into(), 0, &e)
            })?;
        let kinds: Vec<(String, String)> = {
            let mut stmt = w
                .conn()
                .prepare("SELECT name, kind FROM channels ORDER BY name")
                .map_err(|e| shared.read_error("listing channels".into(), e))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>());
            rows.map_err(|e| shared.read_error("listing channels".into(), e))?
        };
        drop(w);
        let mut registry = shared.registry.lock().unwrap_or_else(|e| e.into_inner());
        for (name, kind) in kinds {
            let kind = parse_kind(&kind).ok_or_else(|| StorageError::Corrupt {
                what: format!("storage {}: channel {name}", shared.path.display()),
                detail: format!("kind {kind:?} is not append, latest or queue"),
            })?;
            registry.kinds.insert(name, kind);
        }
        for (channel, positions) in dropped.into_iter().filter(|(_, n)| *n > 0) {
            tracing::info!(provider = %shared.name, channel, positions, "dropped the positions of expired sessions");
        }
        if dropped_cursors > 0 {
            tracing::info!(provider = %shared.name, cursors = dropped_cursors, "dropped the broadcast-log cursors of sessions no longer held");
        }
        Ok(())
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// What the bound came to, if there is one.
    pub fn bounds(&self) -> Option<PageBounds> {
        self.shared.bounds
    }

    /// Failed operations, as this provider met them.
    pub fn storage_errors(&self) -> u64 {
        self.shared.counters.storage_errors.load(Ordering::Relaxed)
    }

    /// What of the checkpoint's room is allocated now, in bytes: less
    /// than `checkpoint_room` before it first fits and while it is given
    /// up, in part or whole.
    pub fn checkpoint_room_held(&self) -> u64 {
        self.shared.room_held.load(Ordering::Acquire)
    }

    /// The latest time the lock's holder before this one recorded (see
    /// [`LockGuard::previous_time`]); `None` for a new lock file or once
    /// closed.
    pub fn lock_previous_time(&self) -> Option<i64> {
        self.shared
            .lock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(LockGuard::previous_time)
    }

    /// Waits, at most `within`, until `done` holds of this provider,
    /// looking again each time its checkpoint's room or its file system's
    /// ceiling moves (the flusher's doing, on its own thread). Whether it
    /// came to hold.
    pub fn wait_for_room(&self, within: Duration, done: impl Fn(&SqliteProvider) -> bool) -> bool {
        let deadline = std::time::Instant::now() + within;
        let mut moves = self
            .shared
            .room_moves
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while !done(self) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            moves = self
                .shared
                .room_moved
                .wait_timeout(moves, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// What the provider keeps at most while the write-ahead log cannot
    /// be copied into the database, in bytes (`None`: no such ceiling).
    pub fn held_to_log(&self) -> Option<u64> {
        match self.shared.log_ceiling.load(Ordering::Acquire) {
            0 => None,
            pages => Some(pages * self.shared.page_size),
        }
    }

    /// The most the provider holds while the file system is full (the
    /// pages it held when a checkpoint found no room), in bytes; `None`
    /// while it may grow to its configured bound.
    pub fn held_to_disk(&self) -> Option<u64> {
        match self.shared.disk_ceiling.load(Ordering::Acquire) {
            0 => None,
            pages => Some(pages * self.shared.page_size),
        }
    }

    /// How many WAL fsyncs the flusher has made.
    pub fn flushes(&self) -> u64 {
        self.shared.counters.flushes.load(Ordering::Relaxed)
    }

    /// How many times the flusher copied the whole log on the writer, so
    /// the log was started again.
    pub fn wal_restarts(&self) -> u64 {
        self.shared.counters.wal_restarts.load(Ordering::Relaxed)
    }

    /// Group commit so far: (publish transactions committed, publishes in
    /// them). Their ratio is the mean batch.
    pub fn group_commit_stats(&self) -> (u64, u64) {
        (
            self.shared.counters.publish_batches.load(Ordering::Relaxed),
            self.shared
                .counters
                .batched_publishes
                .load(Ordering::Relaxed),
        )
    }

    /// The append store of `name` (opened like [`Provider::open_channel`]).
    pub fn append_channel(&self, name: &str) -> contract::Result<Arc<AppendChannel>> {
        let mut registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.append_locked(&mut registry, name)
    }

    fn check_kind(
        &self,
        registry: &Registry,
        name: &str,
        kind: ChannelKind,
    ) -> contract::Result<()> {
        match registry.kinds.get(name) {
            Some(&stored) if stored != kind => Err(StorageError::KindMismatch {
                channel: name.to_string(),
                configured: kind,
                stored,
            }),
            _ => Ok(()),
        }
    }

    /// The store of `name` in `stores`, opened with `open` and registered
    /// under `kind` the first time it is asked for.
    fn registered<T>(
        &self,
        registry: &mut Registry,
        name: &str,
        kind: ChannelKind,
        stores: fn(&mut Registry) -> &mut HashMap<String, Arc<T>>,
        open: impl FnOnce(&mut Registry) -> contract::Result<Arc<T>>,
    ) -> contract::Result<Arc<T>> {
        if let Some(store) = stores(registry).get(name) {
            return Ok(Arc::clone(store));
        }
        self.check_kind(registry, name, kind)?;
        let store = open(registry)?;
        registry.kinds.insert(name.to_string(), kind);
        stores(registry).insert(name.to_string(), Arc::clone(&store));
        Ok(store)
    }

    fn append_locked(
        &self,
        registry: &mut Registry,
        name: &str,
    ) -> contract::Result<Arc<AppendChannel>> {
        let shared = Arc::clone(&self.shared);
        self.registered(
            registry,
            name,
            ChannelKind::Append,
            |r| &mut r.appends,
            |_| AppendChannel::open(shared, name, false),
        )
    }

    fn latest_locked(
        &self,
        registry: &mut Registry,
        name: &str,
    ) -> contract::Result<Arc<LatestChannel>> {
        let shared = Arc::clone(&self.shared);
        self.registered(
            registry,
            name,
            ChannelKind::Latest,
            |r| &mut r.latests,
            |_| LatestChannel::open(shared, name),
        )
    }

    fn queue_locked(
        &self,
        registry: &mut Registry,
        name: &str,
    ) -> contract::Result<Arc<QueueChannel>> {
        let shared = Arc::clone(&self.shared);
        self.registered(
            registry,
            name,
            ChannelKind::Queue,
            |r| &mut r.queues,
            |registry| {
                let dlq = self.append_locked(registry, &contract::dead_letter_name(name))?;
                QueueChannel::open(shared, name, dlq)
            },
        )
    }

    /// Looks up an opened store by name, for a held publish's release.
    pub(crate) fn target_of(shared: &Shared, channel: &str) -> Option<Target> {
        let registry = shared.registry.lock().unwrap_or_else(|e| e.into_inner());
        if channel == BROADCAST_LOG_NAME {
            return registry.broadcast.as_ref().map(|b| b.log() as Target);
        }
        if let Some(s) = registry.appends.get(channel) {
            return Some(Arc::clone(s) as Target);
        }
        if let Some(s) = registry.latests.get(channel) {
            return Some(Arc::clone(s) as Target);
        }
        registry
            .queues
            .get(channel)
            .map(|s| Arc::clone(s) as Target)
    }

    fn close_inner(&self) -> contract::Result<()> {
        let shared = &self.shared;
        if shared.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        shared.readers_free.notify_all();
        if let Some(flusher) = shared
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            flusher.stop();
        }
        // Waits for the batch in progress, if any: it holds the writer.
        let writer = shared
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        shared
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if let Some(conn) = writer {
            // What makes the main file a complete copy on its own. A failure
            // is worth saying and not worth refusing to shut down over: the
            // data is committed either way and the next open replays the log.
            match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            }) {
                Ok(0) => {}
                Ok(_) => tracing::error!(provider = %shared.name, file = %shared.path.display(),
                    "checkpoint at close could not complete (a reader held the log); the next open replays it"),
                Err(e) => {
                    tracing::error!(provider = %shared.name, file = %shared.path.display(), error = %e,
                    "checkpoint at close failed; the next open replays the log")
                }
            }
            if let Err((_, e)) = conn.close() {
                tracing::error!(provider = %shared.name, error = %e, "closing the database failed");
            }
        }
        if shared.faults.is_some() {
            vfs::disarm(&shared.path);
        }
        // Break the store <-> provider cycle, then let the lock go last.
        *shared.registry.lock().unwrap_or_else(|e| e.into_inner()) = Registry::default();
        shared.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(())
    }
}

impl Drop for SqliteProvider {
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}

impl Provider for SqliteProvider {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn kind(&self) -> ProviderKind {
        ProviderKind::Sqlite
    }

    fn open_channel(&self, name: &str, kind: ChannelKind) -> contract::Result<ChannelStore> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(StorageError::Closed {
                provider: self.shared.name.clone(),
            });
        }
        let mut registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Ok(match kind {
            ChannelKind::Append => ChannelStore::Append(self.append_locked(&mut registry, name)?),
            ChannelKind::Latest => ChannelStore::Latest(self.latest_locked(&mut registry, name)?),
            ChannelKind::Queue => ChannelStore::Queue(self.queue_locked(&mut registry, name)?),
        })
    }

    fn publish_together(
        &self,
        runs: Vec<(&ChannelStore, Vec<Record>)>,
    ) -> Vec<Vec<contract::Result<Record>>> {
        // Each run's store as this provider made it; one it did not make,
        // or one closed, is written by its own store, which says why.
        let staged: Option<Vec<batch::Run>> = {
            let registry = self
                .shared
                .registry
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            runs.iter()
                .map(|(store, _)| {
                    let name = store.name();
                    let (target, gapped) = match store.kind() {
                        ChannelKind::Append => {
                            let c = registry.appends.get(name)?;
                            (c.target().ok()?, c.is_gapped())
                        }
                        ChannelKind::Latest => (registry.latests.get(name)?.target().ok()?, false),
                        ChannelKind::Queue => (registry.queues.get(name)?.target().ok()?, false),
                    };
                    Some(batch::Run {
                        target,
                        name,
                        gapped,
                        latest: store.kind() == ChannelKind::Latest,
                    })
                })
                .collect()
        };
        match staged {
            Some(staged) => self.shared.batcher.submit_runs(
                &self.shared,
                staged
                    .into_iter()
                    .zip(runs)
                    .map(|(run, (_, records))| (run, records))
                    .collect(),
            ),
            None => contract::publish_each(runs),
        }
    }

    fn channels(&self) -> Vec<(String, ChannelKind)> {
        let registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        registry
            .kinds
            .iter()
            .filter(|(name, _)| !name.starts_with("$saguin/"))
            .map(|(name, kind)| (name.clone(), *kind))
            .collect()
    }

    fn bytes(&self) -> u64 {
        self.shared.provider_bytes()
    }

    fn max_bytes(&self) -> Option<u64> {
        self.shared.options.max_bytes
    }

    fn reserve(&self) -> u64 {
        if self.shared.options.max_bytes.is_some() {
            self.shared.options.reserve
        } else {
            0
        }
    }

    fn retained(&self) -> contract::Result<Arc<dyn LatestStore>> {
        let mut registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Ok(self.latest_locked(&mut registry, RETAINED_STORE_NAME)?)
    }

    fn sessions(&self) -> contract::Result<Arc<dyn SessionStore>> {
        let mut registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(s) = &registry.sessions {
            return Ok(Arc::clone(s) as Arc<dyn SessionStore>);
        }
        let s = Arc::new(session::Sessions::new(Arc::clone(&self.shared)));
        registry.sessions = Some(Arc::clone(&s));
        Ok(s)
    }

    fn broadcast_log(&self) -> contract::Result<Arc<dyn BroadcastLog>> {
        let mut registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(b) = &registry.broadcast {
            return Ok(Arc::clone(b) as Arc<dyn BroadcastLog>);
        }
        self.check_kind(&registry, BROADCAST_LOG_NAME, ChannelKind::Append)?;
        let log = AppendChannel::open(Arc::clone(&self.shared), BROADCAST_LOG_NAME, true)?;
        registry
            .kinds
            .insert(BROADCAST_LOG_NAME.to_string(), ChannelKind::Append);
        let b = Arc::new(broadcast::Broadcast::new(Arc::clone(&self.shared), log));
        registry.broadcast = Some(Arc::clone(&b));
        Ok(b)
    }

    fn held_publishes(&self) -> contract::Result<Arc<dyn HeldPublishStore>> {
        let mut registry = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(h) = &registry.held {
            return Ok(Arc::clone(h) as Arc<dyn HeldPublishStore>);
        }
        let h = Arc::new(held::Held::new(Arc::clone(&self.shared)));
        registry.held = Some(Arc::clone(&h));
        Ok(h)
    }

    fn session_writes_together(&self, body: &mut dyn FnMut() -> bool) -> contract::Result<bool> {
        self.shared.together(body)
    }

    fn health(&self) -> Health {
        self.shared.health()
    }

    fn checkpoint_room(&self) -> Option<contract::CheckpointRoom> {
        (self.shared.options.checkpoint_room > 0).then(|| contract::CheckpointRoom {
            kept_bytes: self.checkpoint_room_held(),
            held_to_disk: self.held_to_disk().is_some()
                || (self.held_to_log().is_some() && self.shared.room_short.load(Ordering::Acquire)),
        })
    }

    fn close(&self) -> contract::Result<()> {
        self.close_inner()
    }
}

/// The files SQLite may keep beside a database; each belongs to it, so a
/// copy written next to a stale one would be read together with it.
pub const SIDECARS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// `db` with `suffix` appended to its file name (`saguin.db` → `saguin.db-wal`).
pub fn sidecar_path(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// What already stands where a new database is to be written — the file
/// itself, or one of its sidecars — as a phrase naming it; `None` when the
/// place is free (the overwrite guard covers the sidecars).
pub fn occupied_destination(db: &Path) -> Option<String> {
    let exists = |p: &Path| std::fs::symlink_metadata(p).is_ok();
    if exists(db) {
        return Some("exists".into());
    }
    SIDECARS.iter().find_map(|suffix| {
        let side = sidecar_path(db, suffix);
        exists(&side).then(|| {
            format!(
                "{} exists beside it (a database's {suffix} belongs to it)",
                side.display()
            )
        })
    })
}

/// Opens a provider's database read-only for tools (`saguin sqlite dump`,
/// migrations): the same version check as the broker, never `immutable=1`
/// (which ignores the write-ahead log and shows a running broker's file as
/// empty or stale). The connection is `query_only` as well.
pub fn open_read_only(path: &Path) -> Result<Connection, SqliteOpenError> {
    let sql_err = |context, source| SqliteOpenError::Sqlite {
        path: path.to_path_buf(),
        context,
        source,
    };
    let conn = open_read_only_as_found(path)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| sql_err("reading the schema version", e))?;
    if version != SCHEMA_VERSION {
        let has_tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| sql_err("reading the schema", e))?;
        if version == 0 && has_tables > 0 {
            return Err(SqliteOpenError::Unversioned {
                path: path.to_path_buf(),
            });
        }
        let creator = schema::creator(&conn).ok();
        return Err(SqliteOpenError::SchemaVersion {
            path: path.to_path_buf(),
            version,
            created_by: creator.as_ref().map(|(by, _)| by.clone()),
            created_at: creator.map(|(_, at)| at),
        });
    }
    Ok(conn)
}

/// Opens a regular file read-only as [`open_read_only`] does, without
/// judging what it holds: for `saguin sqlite verify`, for which a file
/// that is not this build's database, or no database at all, is a finding.
pub fn open_read_only_as_found(path: &Path) -> Result<Connection, SqliteOpenError> {
    let sql_err = |context, source| SqliteOpenError::Sqlite {
        path: path.to_path_buf(),
        context,
        source,
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(SqliteOpenError::Io {
                path: path.to_path_buf(),
                context: "opening the database",
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            })
        }
        Err(e) => {
            return Err(SqliteOpenError::Io {
                path: path.to_path_buf(),
                context: "opening the database",
                source: e,
            })
        }
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sql_err("opening the database read-only", e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| sql_err("setting the busy timeout", e))?;
    conn.execute_batch("PRAGMA query_only = 1")
        .map_err(|e| sql_err("setting query_only", e))?;
    Ok(conn)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fault_tests;
