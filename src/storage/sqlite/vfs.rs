//! The VFS every connection of a sqlite provider opens its files through:
//! SQLite's own unix VFS, wrapped so that a failed write, sync, read or
//! truncate says which operating system error it was, and so that a test
//! can make a chosen call fail. A sticky fault fails the provider until a
//! restart (`docs/design.md` storage rule 10).
//!
//! Why a wrapper: SQLite answers both "the page ceiling was reached" and
//! "the file system is full" with `SQLITE_FULL`, and an EDQUOT or an EIO
//! on a write with the same `SQLITE_IOERR_WRITE`; the provider answers the
//! first of each pair differently from the second (a bound is 0x97 and
//! passes; a full disk is 0x83; an I/O error fails the provider). Each
//! failing call records its operation and `errno` in a thread-local slot
//! ([`take_last`]) that the provider reads on the same thread right after
//! the statement failed. Every other call goes straight through: the
//! wrapper adds one indirect call to each file operation and nothing else.
//!
//! Fault injection, for what a real file system cannot be made to do on
//! demand (an EIO on the n-th write, an fsync that fails once and then
//! succeeds): [`arm`] attaches a [`Faults`] plan to a database path, and
//! the wrapper answers a matching call with the planned error without
//! making it (a write with ENOSPC answers `SQLITE_FULL`, as the unix VFS
//! does; any other write `SQLITE_IOERR_WRITE`, a sync `SQLITE_IOERR_FSYNC`,
//! a read `SQLITE_IOERR_READ`, a truncate `SQLITE_IOERR_TRUNCATE`). The
//! provider's own fsync of the write-ahead log asks the same plan
//! ([`Faults::injected`]). A provider arms the plan the environment
//! variable [`INJECT_ENV`] names for it when it opens; nothing else does,
//! and without the variable no plan exists.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rusqlite::ffi;

/// The name the wrapper is registered under.
pub const VFS_NAME: &str = "saguin-unix";

/// The environment variable whose plan a provider arms when it opens: a
/// comma-separated list of `PROVIDER:FILE:OP:N:ERRNO` (e.g.
/// `db:wal:sync:2:EIO`), where FILE is `db` or `wal`, OP is `write`,
/// `sync`, `read` or `truncate`, N the call (counted from the provider's
/// open, from 1) that fails - `N+` for that call and every one after - and
/// ERRNO one of `EIO`, `ENOSPC`, `EDQUOT`, `EROFS`. A test seam: an
/// operator never sets it.
pub const INJECT_ENV: &str = "SAGUIN_INJECT_FAULTS";

/// Which file of a database a call is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRole {
    Db,
    Wal,
    /// The rest (a temporary file, a statement journal): never planned.
    Other,
}

/// A file operation that can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Open,
    Read,
    Write,
    Truncate,
    Sync,
    /// Growing or mapping the shared-memory index (`-shm`).
    ShmMap,
}

/// The last failed file operation on this thread, and its `errno` (0 when
/// the failure set none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed {
    pub op: Op,
    pub role: FileRole,
    pub errno: i32,
}

thread_local! {
    static LAST: Cell<Option<Failed>> = const { Cell::new(None) };
}

/// Forgets what an earlier failure on this thread recorded, so that the
/// next [`take_last`] answers for what follows.
pub fn clear_last() {
    LAST.with(|l| l.set(None));
}

/// What the last failed file operation on this thread was, taken.
pub fn take_last() -> Option<Failed> {
    LAST.with(|l| l.take())
}

fn record(op: Op, role: FileRole, errno: i32) {
    LAST.with(|l| l.set(Some(Failed { op, role, errno })));
}

/// One planned failure.
#[derive(Debug)]
struct Rule {
    role: FileRole,
    op: Op,
    nth: u64,
    and_after: bool,
    errno: i32,
    calls: AtomicU64,
}

/// The failures planned for one database's files.
#[derive(Debug)]
pub struct Faults {
    rules: Vec<Rule>,
    /// Calls are counted (and fail) only while set: a test opens a
    /// provider, then counts from the moment it means.
    counting: std::sync::atomic::AtomicBool,
}

impl Default for Faults {
    fn default() -> Faults {
        Faults {
            rules: Vec::new(),
            counting: std::sync::atomic::AtomicBool::new(true),
        }
    }
}

impl Faults {
    /// A plan with no rules.
    pub fn new() -> Faults {
        Faults::default()
    }

    /// Counts nothing until [`Faults::start_counting`].
    pub fn paused(self) -> Faults {
        self.counting.store(false, Ordering::Relaxed);
        self
    }

    pub fn start_counting(&self) {
        self.counting.store(true, Ordering::Relaxed);
    }

    /// Counts nothing again until [`Faults::start_counting`]: the calls a
    /// test makes to look, which must not change what fails.
    pub fn stop_counting(&self) {
        self.counting.store(false, Ordering::Relaxed);
    }

    /// Fails the `nth` call (from 1) of `op` on `role` with `errno`; with
    /// `and_after`, every call after it as well.
    pub fn fail(mut self, role: FileRole, op: Op, nth: u64, and_after: bool, errno: i32) -> Faults {
        self.rules.push(Rule {
            role,
            op,
            nth: nth.max(1),
            and_after,
            errno,
            calls: AtomicU64::new(0),
        });
        self
    }

    /// The rules of [`INJECT_ENV`]'s value `spec` for provider `provider`;
    /// `Err` names an entry that does not parse.
    pub fn parse(spec: &str, provider: &str) -> Result<Faults, String> {
        let mut faults = Faults::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || format!("{INJECT_ENV}: {entry:?} is not PROVIDER:FILE:OP:N:ERRNO");
            let parts: Vec<&str> = entry.split(':').collect();
            let [name, file, op, nth, errno] = parts[..] else {
                return Err(bad());
            };
            let role = match file {
                "db" => FileRole::Db,
                "wal" => FileRole::Wal,
                _ => return Err(bad()),
            };
            let op = match op {
                "write" => Op::Write,
                "sync" => Op::Sync,
                "read" => Op::Read,
                "truncate" => Op::Truncate,
                _ => return Err(bad()),
            };
            let (nth, and_after) = match nth.strip_suffix('+') {
                Some(n) => (n, true),
                None => (nth, false),
            };
            let nth: u64 = nth.parse().map_err(|_| bad())?;
            let errno = match errno {
                "EIO" => libc::EIO,
                "ENOSPC" => libc::ENOSPC,
                "EDQUOT" => libc::EDQUOT,
                "EROFS" => libc::EROFS,
                _ => return Err(bad()),
            };
            if name == provider {
                faults = faults.fail(role, op, nth, and_after, errno);
            }
        }
        Ok(faults)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Counts a call of `op` on `role` and answers the `errno` it is
    /// planned to fail with, if it is.
    pub fn injected(&self, role: FileRole, op: Op) -> Option<i32> {
        if !self.counting.load(Ordering::Relaxed) {
            return None;
        }
        let mut out = None;
        for rule in self.rules.iter().filter(|r| r.role == role && r.op == op) {
            let n = rule.calls.fetch_add(1, Ordering::Relaxed) + 1;
            if n == rule.nth || (rule.and_after && n > rule.nth) {
                out = out.or(Some(rule.errno));
            }
        }
        out
    }
}

/// The plans armed, by database path as SQLite names it (absolute, with
/// symbolic links resolved).
type Plans = Mutex<Vec<(PathBuf, Arc<Faults>)>>;

fn plans() -> &'static Plans {
    static PLANS: OnceLock<Plans> = OnceLock::new();
    PLANS.get_or_init(Default::default)
}

/// The path SQLite's unix VFS names `db` by, which the wrapper looks plans
/// up under.
fn plan_key(db: &Path) -> PathBuf {
    std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf())
}

/// Attaches `faults` to the database at `db` (which must exist): files of
/// it opened from now on fail as planned. Replaces an earlier plan.
pub fn arm(db: &Path, faults: Arc<Faults>) {
    let key = plan_key(db);
    let mut plans = plans().lock().unwrap_or_else(|e| e.into_inner());
    plans.retain(|(p, _)| *p != key);
    plans.push((key, faults));
}

/// Removes the plan of `db`, if any.
pub fn disarm(db: &Path) {
    let key = plan_key(db);
    plans()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(p, _)| *p != key);
}

/// The plan armed for `db`, if any.
pub fn armed(db: &Path) -> Option<Arc<Faults>> {
    let key = plan_key(db);
    plans()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(p, _)| *p == key)
        .map(|(_, f)| Arc::clone(f))
}

fn armed_for_name(db: &str) -> Option<Arc<Faults>> {
    let plans = plans().lock().unwrap_or_else(|e| e.into_inner());
    if plans.is_empty() {
        return None;
    }
    plans
        .iter()
        .find(|(p, _)| p.as_os_str() == db)
        .map(|(_, f)| Arc::clone(f))
}

/// One open file: SQLite's `sqlite3_file` header, then what the wrapper
/// keeps, then the unix VFS's own file structure in the same allocation.
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// `Arc::into_raw` of the plan, or null; given back in `x_close`.
    faults: *const Faults,
    role: FileRole,
}

/// Where the real file starts inside a `ShimFile` allocation.
const REAL_OFFSET: usize = std::mem::size_of::<ShimFile>().next_multiple_of(16);

/// The unix VFS, found once.
struct Real(*mut ffi::sqlite3_vfs);
// SAFETY: SQLite's VFS objects are immutable once registered and meant to
// be shared by every thread.
unsafe impl Send for Real {}
unsafe impl Sync for Real {}

static REAL: OnceLock<Real> = OnceLock::new();
static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();

/// Registers the wrapper (once per process; later calls answer the first
/// one's outcome). `Err` says why SQLite refused it.
pub fn register() -> Result<(), String> {
    REGISTERED
        .get_or_init(|| {
            // SAFETY: sqlite3_vfs_find(NULL) returns the default VFS, which
            // lives for the whole process; the copy made of it is leaked, so
            // it outlives every connection that opens files through it.
            unsafe {
                let real = ffi::sqlite3_vfs_find(std::ptr::null());
                if real.is_null() {
                    return Err("SQLite has no default VFS".into());
                }
                let _ = REAL.set(Real(real));
                let name = CString::new(VFS_NAME).expect("no NUL in the name");
                let mut vfs: ffi::sqlite3_vfs = *real;
                vfs.pNext = std::ptr::null_mut();
                vfs.zName = name.into_raw();
                vfs.szOsFile = (REAL_OFFSET + (*real).szOsFile as usize) as c_int;
                vfs.xOpen = Some(x_open);
                let vfs = Box::into_raw(Box::new(vfs));
                match ffi::sqlite3_vfs_register(vfs, 0) {
                    ffi::SQLITE_OK => Ok(()),
                    rc => Err(format!("sqlite3_vfs_register answered {rc}")),
                }
            }
        })
        .clone()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_errno(value: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = value }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(real_vfs) = REAL.get() else {
        return ffi::SQLITE_ERROR;
    };
    let _ = vfs;
    let shim = file as *mut ShimFile;
    let real = (file as *mut u8).add(REAL_OFFSET) as *mut ffi::sqlite3_file;
    (*shim).base.pMethods = std::ptr::null();
    (*shim).real = real;
    (*shim).faults = std::ptr::null();
    (*real).pMethods = std::ptr::null();
    let role = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
        FileRole::Db
    } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
        FileRole::Wal
    } else {
        FileRole::Other
    };
    (*shim).role = role;
    let Some(open) = (*real_vfs.0).xOpen else {
        return ffi::SQLITE_ERROR;
    };
    let rc = open(real_vfs.0, name, real, flags, out_flags);
    if rc != ffi::SQLITE_OK {
        record(Op::Open, role, errno());
    }
    if (*real).pMethods.is_null() {
        return rc;
    }
    if !name.is_null() && role != FileRole::Other {
        if let Ok(text) = CStr::from_ptr(name).to_str() {
            let db = match role {
                FileRole::Wal => text.strip_suffix("-wal").unwrap_or(text),
                _ => text,
            };
            if let Some(faults) = armed_for_name(db) {
                (*shim).faults = Arc::into_raw(faults);
            }
        }
    }
    (*shim).base.pMethods = &METHODS;
    rc
}

/// The real file behind `file`, and its methods.
unsafe fn real(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    let real = (*(file as *mut ShimFile)).real;
    (real, &*(*real).pMethods)
}

/// The planned errno of this call, if it is planned to fail.
unsafe fn planned(file: *mut ffi::sqlite3_file, op: Op) -> Option<i32> {
    let shim = &*(file as *mut ShimFile);
    if shim.faults.is_null() {
        return None;
    }
    let errno = (*shim.faults).injected(shim.role, op)?;
    set_errno(errno);
    record(op, shim.role, errno);
    Some(errno)
}

/// Records a failed call's `errno` for [`take_last`].
unsafe fn noted(file: *mut ffi::sqlite3_file, op: Op, rc: c_int) -> c_int {
    if rc != ffi::SQLITE_OK && rc & 0xff != ffi::SQLITE_BUSY && rc != ffi::SQLITE_IOERR_SHORT_READ {
        record(op, (*(file as *mut ShimFile)).role, errno());
    }
    rc
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let shim = file as *mut ShimFile;
    let (real, m) = real(file);
    let rc = match m.xClose {
        Some(f) => f(real),
        None => ffi::SQLITE_OK,
    };
    if !(*shim).faults.is_null() {
        drop(Arc::from_raw((*shim).faults));
        (*shim).faults = std::ptr::null();
    }
    (*shim).base.pMethods = std::ptr::null();
    rc
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    if planned(file, Op::Read).is_some() {
        return ffi::SQLITE_IOERR_READ;
    }
    let (real, m) = real(file);
    match m.xRead {
        Some(f) => noted(file, Op::Read, f(real, buf, amount, offset)),
        None => ffi::SQLITE_IOERR_READ,
    }
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    if let Some(errno) = planned(file, Op::Write) {
        return if errno == libc::ENOSPC {
            ffi::SQLITE_FULL
        } else {
            ffi::SQLITE_IOERR_WRITE
        };
    }
    let (real, m) = real(file);
    match m.xWrite {
        Some(f) => noted(file, Op::Write, f(real, buf, amount, offset)),
        None => ffi::SQLITE_IOERR_WRITE,
    }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    if planned(file, Op::Truncate).is_some() {
        return ffi::SQLITE_IOERR_TRUNCATE;
    }
    let (real, m) = real(file);
    match m.xTruncate {
        Some(f) => noted(file, Op::Truncate, f(real, size)),
        None => ffi::SQLITE_IOERR_TRUNCATE,
    }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    if planned(file, Op::Sync).is_some() {
        return ffi::SQLITE_IOERR_FSYNC;
    }
    let (real, m) = real(file);
    match m.xSync {
        Some(f) => noted(file, Op::Sync, f(real, flags)),
        None => ffi::SQLITE_IOERR_FSYNC,
    }
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    let (real, m) = real(file);
    match m.xFileSize {
        Some(f) => f(real, size),
        None => ffi::SQLITE_IOERR_FSTAT,
    }
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let (real, m) = real(file);
    match m.xLock {
        Some(f) => f(real, level),
        None => ffi::SQLITE_IOERR_LOCK,
    }
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let (real, m) = real(file);
    match m.xUnlock {
        Some(f) => f(real, level),
        None => ffi::SQLITE_IOERR_UNLOCK,
    }
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    let (real, m) = real(file);
    match m.xCheckReservedLock {
        Some(f) => f(real, out),
        None => ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
    }
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    let (real, m) = real(file);
    match m.xFileControl {
        // Growing the file ahead of a write (SQLITE_FCNTL_SIZE_HINT) fails
        // with the file system's errno like a write would.
        Some(f) => {
            let rc = f(real, op, arg);
            if op == ffi::SQLITE_FCNTL_SIZE_HINT {
                noted(file, Op::Write, rc)
            } else {
                rc
            }
        }
        None => ffi::SQLITE_NOTFOUND,
    }
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, m) = real(file);
    m.xSectorSize.map_or(4096, |f| f(real))
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let (real, m) = real(file);
    m.xDeviceCharacteristics.map_or(0, |f| f(real))
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    page_size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let (real, m) = real(file);
    match m.xShmMap {
        Some(f) => noted(file, Op::ShmMap, f(real, page, page_size, extend, out)),
        None => ffi::SQLITE_IOERR_SHMMAP,
    }
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    let (real, m) = real(file);
    match m.xShmLock {
        Some(f) => f(real, offset, n, flags),
        None => ffi::SQLITE_IOERR_SHMLOCK,
    }
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    let (real, m) = real(file);
    if let Some(f) = m.xShmBarrier {
        f(real)
    }
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    let (real, m) = real(file);
    match m.xShmUnmap {
        Some(f) => f(real, delete),
        None => ffi::SQLITE_OK,
    }
}

unsafe extern "C" fn x_fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let (real, m) = real(file);
    match m.xFetch {
        Some(f) => f(real, offset, amount, out),
        None => {
            *out = std::ptr::null_mut();
            ffi::SQLITE_OK
        }
    }
}

unsafe extern "C" fn x_unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    page: *mut c_void,
) -> c_int {
    let (real, m) = real(file);
    match m.xUnfetch {
        Some(f) => f(real, offset, page),
        None => ffi::SQLITE_OK,
    }
}

/// The wrapper's methods: version 3, every one of the unix VFS's passed
/// through. A file the unix VFS opened with an older version of the
/// methods has `None` in the later slots, which each wrapper answers as
/// SQLite would a missing method.
static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_parses_for_its_provider_only_and_counts_calls() {
        let f = Faults::parse("db:wal:sync:2:EIO, other:db:write:1+:ENOSPC", "db").unwrap();
        assert_eq!(f.injected(FileRole::Wal, Op::Sync), None);
        assert_eq!(f.injected(FileRole::Db, Op::Sync), None, "another file");
        assert_eq!(f.injected(FileRole::Wal, Op::Sync), Some(libc::EIO));
        assert_eq!(f.injected(FileRole::Wal, Op::Sync), None, "only the 2nd");
        assert!(
            f.injected(FileRole::Db, Op::Write).is_none(),
            "another provider's"
        );
        let g = Faults::parse("x:db:write:2+:ENOSPC", "x").unwrap();
        assert_eq!(g.injected(FileRole::Db, Op::Write), None);
        assert_eq!(g.injected(FileRole::Db, Op::Write), Some(libc::ENOSPC));
        assert_eq!(g.injected(FileRole::Db, Op::Write), Some(libc::ENOSPC));
        for bad in [
            "db:wal:sync:2",
            "db:log:sync:1:EIO",
            "db:wal:flush:1:EIO",
            "db:wal:sync:x:EIO",
            "db:wal:sync:1:EPERM",
        ] {
            assert!(Faults::parse(bad, "db").is_err(), "{bad}");
        }
    }
}
