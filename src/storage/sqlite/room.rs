//! The checkpoint's room: space on the database's file system that a
//! sqlite provider keeps allocated in a file of its own,
//! `<database>-room`, and gives up only to a checkpoint that found the file
//! system full.
//!
//! A checkpoint copies the write-ahead log into the database, and the
//! pages the log added grow the database's file. When the log has taken
//! the last of the file system, that growth finds no room, the log can
//! never be copied, and so never written from its start again: every
//! write, the removals that would make room included, is refused for as
//! long as nothing else on the file system gives way, and a restart
//! changes nothing. The room is what that checkpoint grows into. Once it
//! is given up, the provider holds at most the pages it holds then (its
//! ceiling lowered to them, `Shared::disk_ceiling`), so no later
//! checkpoint needs the file to grow, and removals make the room that
//! publishes take again; the room is taken back, and the ceiling lifted,
//! once the file system has that much free.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What the room's file is named after: the database's name with this
/// appended (`saguin.db` → `saguin.db-room`).
pub const ROOM_SUFFIX: &str = "-room";

/// The room kept by default: the size the write-ahead log is started again
/// at ([`super::WAL_RESTART_BYTES`]), which bounds what a checkpoint can
/// have to copy beyond the database's end.
pub const CHECKPOINT_ROOM_DEFAULT: u64 = super::WAL_RESTART_BYTES;

/// The room's file beside `db`.
pub fn room_path(db: &Path) -> PathBuf {
    super::sidecar_path(db, ROOM_SUFFIX)
}

/// The room as its file stands, as the flusher keeps it and an open finds
/// it. What of it is allocated is `kept`; a file shorter than the room is
/// a room given up, in part or whole, and not taken back since - the state
/// survives a restart, so a provider opened on it starts held to what it
/// holds. No file is a room never taken (or one that never fitted).
#[derive(Debug)]
pub(crate) struct Room {
    path: PathBuf,
    bytes: u64,
    kept: u64,
    given_up: bool,
    /// When taking it may be tried again, after a try that failed.
    next_try: Option<Instant>,
    /// A failure to take it was logged (once until it is taken).
    warned: bool,
}

impl Room {
    /// The room of `bytes` beside `db`, as its file stands.
    pub fn open(db: &Path, bytes: u64) -> Room {
        use std::os::unix::fs::MetadataExt;
        let path = room_path(db);
        let (kept, given_up) = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => (
                m.len().min(m.blocks().saturating_mul(512)).min(bytes),
                m.len() < bytes,
            ),
            _ => (0, false),
        };
        Room {
            path,
            bytes,
            kept,
            given_up,
            next_try: None,
            warned: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What of it is allocated now.
    pub fn kept(&self) -> u64 {
        self.kept
    }

    pub fn is_whole(&self) -> bool {
        self.kept == self.bytes
    }

    /// Given up, in part or whole, and not taken back since.
    pub fn is_given_up(&self) -> bool {
        self.given_up
    }

    /// Whether a try to take the room is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        !self.is_whole() && self.next_try.is_none_or(|at| now >= at)
    }

    /// Takes the room whole: its file allocated on the disk in full. On a
    /// failure (the file system has less free) what it kept stays as it
    /// was, a room never taken leaves no file, and the next try is due at
    /// `retry_at`.
    pub fn take(&mut self, retry_at: Instant) -> io::Result<()> {
        let on_failure = self.given_up.then_some(self.kept);
        match allocate(&self.path, self.bytes, on_failure) {
            Ok(()) => {
                self.kept = self.bytes;
                self.given_up = false;
                self.next_try = None;
                Ok(())
            }
            Err(e) => {
                self.next_try = Some(retry_at);
                Err(e)
            }
        }
    }

    /// Gives up to `wanted` bytes of it back to the file system: its file
    /// is cut by that much (kept, even empty, so the room is known to be
    /// given up). Returns what was given.
    pub fn give(&mut self, wanted: u64) -> io::Result<u64> {
        let left = self.kept.saturating_sub(wanted);
        match std::fs::OpenOptions::new().write(true).open(&self.path) {
            Ok(file) => file.set_len(left)?,
            // Removed by hand: there is nothing to give back.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.kept = 0;
                return Ok(0);
            }
            Err(e) => return Err(e),
        }
        let given = self.kept - left;
        self.kept = left;
        self.given_up = true;
        Ok(given)
    }
}

/// Allocates `bytes` of `path` on its file system, creating the file. The
/// blocks are allocated, not just the size set: a sparse file would hold
/// no room. A failed allocation cuts the file back to `on_failure`, or
/// removes it when that is `None`.
fn allocate(path: &Path, bytes: u64, on_failure: Option<u64>) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let mut meta = file.metadata()?;
    if meta.len() > bytes {
        // A larger room a previous configuration kept: this one's size.
        file.set_len(bytes)?;
        meta = file.metadata()?;
    }
    if meta.len() == bytes && meta.blocks().saturating_mul(512) >= bytes {
        return Ok(());
    }
    let len = libc::off_t::try_from(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "room larger than a file"))?;
    // SAFETY: `file` is an open descriptor for the whole call;
    // posix_fallocate touches no memory of ours.
    let status = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, len) };
    if status == 0 {
        return Ok(());
    }
    match on_failure {
        Some(len) => {
            let _ = file.set_len(len);
        }
        None => {
            drop(file);
            let _ = std::fs::remove_file(path);
        }
    }
    Err(io::Error::from_raw_os_error(status))
}

/// What a sqlite provider's file system has against what the provider
/// may take: its bound (or what it holds, unbounded), its write-ahead log
/// at the most it reaches (the restart size and an eighth more, above the
/// 70-72 MB measured), and its checkpoint's room. What the provider's files
/// hold already counts as theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Free on the file system for this process.
    pub free_bytes: u64,
    /// What the database, its log and its room hold now.
    pub held_bytes: u64,
    /// What the provider may take.
    pub needs_bytes: u64,
}

impl Capacity {
    /// Of the database at `db` (which need not exist yet); `None` when its
    /// file system cannot be asked.
    pub fn of(
        db: &Path,
        max_bytes: Option<u64>,
        checkpoint_room: u64,
        wal_restart_bytes: u64,
    ) -> Option<Capacity> {
        let len = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
        let free_bytes = db.parent().and_then(available_bytes)?;
        let database = len(db);
        let held_bytes =
            database + len(&super::wal_path(db)) + len(&room_path(db)).min(checkpoint_room);
        let needs_bytes = max_bytes.unwrap_or(0).max(database)
            + Self::log_at_most(wal_restart_bytes)
            + checkpoint_room;
        Some(Capacity {
            free_bytes,
            held_bytes,
            needs_bytes,
        })
    }

    /// The most the write-ahead log's file reaches.
    pub fn log_at_most(wal_restart_bytes: u64) -> u64 {
        wal_restart_bytes + wal_restart_bytes / 8
    }

    pub fn fits(&self) -> bool {
        self.free_bytes.saturating_add(self.held_bytes) >= self.needs_bytes
    }
}

/// Says, at WARN, when the provider's file system cannot hold what the
/// provider may take ([`Capacity`]): an operator learns at the start, not
/// when the disk fills, that the bound is out of reach.
pub(super) fn warn_if_the_file_system_is_short(options: &super::SqliteOptions, db: &Path) {
    let Some(capacity) = Capacity::of(
        db,
        options.max_bytes,
        options.checkpoint_room,
        options.wal_restart_bytes,
    ) else {
        return;
    };
    if !capacity.fits() {
        tracing::warn!(provider = %options.name, file = %db.display(), free_bytes = capacity.free_bytes,
            held_bytes = capacity.held_bytes, needs_bytes = capacity.needs_bytes,
            max_bytes = options.max_bytes.unwrap_or(0),
            log_bytes_at_most = Capacity::log_at_most(options.wal_restart_bytes),
            checkpoint_room = options.checkpoint_room,
            "the file system under the storage provider is smaller than what it may take (its max_bytes or what it holds, its write-ahead log and its checkpoint's room): it will run out of room before its bound");
    }
}

/// What the file system holding `dir` has free for this process.
fn available_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and
    // `stat` is written in full by a call that returns 0.
    if unsafe { libc::statvfs(c.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    // 32 bits wide on 32-bit targets (an ARM board's), 64 here.
    #[allow(clippy::useless_conversion)]
    let bytes = u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize));
    Some(bytes)
}

/// Room given up beyond what a checkpoint was reckoned to need: its
/// reckoning is the pages the log holds beyond the database's file, and
/// what else the file system takes meanwhile (a log line, another
/// process's write) should not make it fall short.
const GIVEN_BEYOND_NEED: u64 = 1 << 20;

/// Room given up first to an open that found none: enough for the
/// write-ahead log's index (32 KiB), recovery's writes and the lock's
/// holder row.
pub(super) const GIVEN_TO_AN_OPEN: u64 = 1 << 20;

impl super::FlushLoop {
    /// A checkpoint found the file system full: the provider is held to
    /// what it holds, as much of the room as the log needs to be copied is
    /// given up (all of it, should that fall short), and the checkpoint
    /// tried again. Without room left to give (none kept, none taken, all
    /// given) the log waits for room made beside the provider: holding the
    /// provider to what it holds is lifted by taking the room back whole,
    /// and a room that never fitted would never lift it.
    pub(super) fn checkpoint_with_room(&mut self, commits: u64) -> Option<super::Checkpointed> {
        if self.room.as_ref().is_none_or(|r| r.kept() == 0) {
            return None;
        }
        let shared = self.shared.upgrade()?;
        if shared.disk_ceiling.load(Ordering::Acquire) == 0 {
            let pages = shared.hold_to_disk()?;
            tracing::warn!(provider = %self.name, file = %shared.path.display(),
                holds_bytes = pages * shared.page_size,
                "the file system under the storage provider is full: it keeps at most what it holds until there is room again; publishes beyond are refused (0x83), and what retention and consumers remove makes room for them");
        }
        let need = self.log_beyond_database(&shared) + GIVEN_BEYOND_NEED;
        let mut given = 0;
        let mut done = None;
        for wanted in [need, u64::MAX] {
            let room = self.room.as_mut()?;
            if room.kept() == 0 {
                break;
            }
            // Taking it back fails while the file system is full; the lines
            // below say why.
            room.warned = true;
            match room.give(wanted) {
                Ok(bytes) => given += bytes,
                Err(e) => {
                    tracing::error!(provider = %self.name, file = %room.path().display(), error = %e,
                        "giving up the checkpoint's room failed; the write-ahead log waits for room made beside the provider");
                    break;
                }
            }
            done = self.checkpoint_once(commits);
            if done.is_some() {
                break;
            }
        }
        let kept = self.room.as_ref().map_or(0, Room::kept);
        shared.room_held.store(kept, Ordering::Release);
        match done {
            Some(_) => {
                tracing::warn!(provider = %self.name, given_bytes = given, room_left_bytes = kept,
                "gave up the checkpoint's room to copy the write-ahead log into the database; it is taken back whole, and the provider's ceiling lifted, once the file system has that much free")
            }
            None => tracing::error!(provider = %self.name, given_bytes = given,
                "the checkpoint's room was not enough to copy the write-ahead log; writes are refused until room is made beside the provider"),
        }
        done
    }

    /// What a checkpoint has to grow the database's file by: the pages
    /// the log holds beyond its end, read on the checkpoint's connection.
    fn log_beyond_database(&self, shared: &super::Shared) -> u64 {
        let pages: u64 = self
            .checkpointer
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap_or(0);
        let file = std::fs::metadata(&shared.path).map_or(0, |m| m.len());
        (pages * shared.page_size).saturating_sub(file)
    }

    /// Takes the room back whole when it is not and a try is due (at the
    /// first turn, then once a second until it is). Taken while the
    /// provider is held to what it holds, it lifts that ceiling: the file
    /// system has the room free again.
    pub(super) fn keep_room(&mut self) {
        let Some(room) = self.room.as_mut() else {
            return;
        };
        let now = Instant::now();
        if !room.due(now) {
            return;
        }
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        if shared.failed.load(Ordering::Acquire) {
            return;
        }
        match room.take(now + super::CHECKPOINT_EVERY) {
            Ok(()) => {
                room.warned = false;
                shared.room_held.store(room.bytes(), Ordering::Release);
                if shared.disk_ceiling.load(Ordering::Acquire) != 0 && shared.lift_disk_ceiling() {
                    tracing::info!(provider = %self.name, file = %shared.path.display(), room_bytes = room.bytes(),
                        "the checkpoint's room is kept again, the file system having that much free: the storage provider's ceiling is back to its configuration");
                }
            }
            Err(e) => {
                // Given up to a checkpoint or an open, which said so.
                if !room.warned && shared.disk_ceiling.load(Ordering::Acquire) == 0 {
                    room.warned = true;
                    tracing::warn!(provider = %self.name, file = %room.path().display(), room_bytes = room.bytes(), error = %e,
                        "cannot keep the checkpoint's room beside the storage provider (tried again every second): should the write-ahead log take the last of the file system, writes stop until room is made beside it");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn allocated(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn a_room_is_taken_allocated_given_up_in_part_and_taken_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        let mut room = Room::open(&db, 1 << 20);
        assert_eq!(room.path(), dir.path().join("saguin.db-room"));
        assert!(!room.is_given_up() && room.kept() == 0);
        let now = Instant::now();
        assert!(room.due(now));
        room.take(now).unwrap();
        assert!(room.is_whole() && !room.due(now));
        assert_eq!(std::fs::metadata(room.path()).unwrap().len(), 1 << 20);
        assert!(allocated(room.path()) >= 1 << 20, "allocated, not sparse");

        assert_eq!(room.give(256 << 10).unwrap(), 256 << 10);
        assert_eq!(room.kept(), 768 << 10);
        assert!(room.is_given_up() && room.due(now));
        assert!(
            allocated(room.path()) <= 768 << 10,
            "the part given is freed"
        );
        // The state survives a restart: the file says it.
        let reopened = Room::open(&db, 1 << 20);
        assert!(reopened.is_given_up());
        assert_eq!(reopened.kept(), 768 << 10);

        assert_eq!(room.give(u64::MAX).unwrap(), 768 << 10);
        assert_eq!(room.kept(), 0);
        assert_eq!(std::fs::metadata(room.path()).unwrap().len(), 0);
        assert!(Room::open(&db, 1 << 20).is_given_up(), "kept, empty");

        room.take(now).unwrap();
        assert!(room.is_whole() && !room.is_given_up());
        assert!(allocated(room.path()) >= 1 << 20);
        assert!(!Room::open(&db, 1 << 20).is_given_up());
    }

    #[test]
    fn a_sparse_file_left_beside_the_database_is_allocated_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        let path = room_path(&db);
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let mut room = Room::open(&db, 1 << 20);
        assert_eq!(room.kept(), 0);
        assert!(!room.is_given_up());
        room.take(Instant::now()).unwrap();
        assert!(allocated(&path) >= 1 << 20);
    }

    #[test]
    fn a_larger_room_a_previous_configuration_kept_is_cut_to_this_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        Room::open(&db, 2 << 20).take(Instant::now()).unwrap();
        let mut room = Room::open(&db, 1 << 20);
        assert!(room.is_whole() && !room.is_given_up());
        room.take(Instant::now()).unwrap();
        assert_eq!(std::fs::metadata(room.path()).unwrap().len(), 1 << 20);
        assert!(allocated(room.path()) < 2 << 20, "the rest given back");
    }

    #[test]
    fn a_room_that_cannot_be_taken_leaves_what_it_kept_and_waits_for_its_next_try() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        // Larger than any file: never allocated.
        let too_large = u64::MAX / 2;
        let mut never = Room::open(&db, too_large);
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(1);
        assert!(never.take(later).is_err());
        assert!(!never.due(now) && never.due(later));
        assert!(
            !room_path(&db).exists(),
            "a room never taken leaves no file"
        );

        // One given up in part keeps that part through a failed try.
        let mut room = Room::open(&db, 1 << 20);
        room.take(now).unwrap();
        room.give(512 << 10).unwrap();
        let mut larger = Room::open(&db, too_large);
        assert!(larger.is_given_up());
        assert!(larger.take(later).is_err());
        assert_eq!(std::fs::metadata(room_path(&db)).unwrap().len(), 512 << 10);
        assert!(allocated(&room_path(&db)) >= 512 << 10);
    }

    #[test]
    fn a_room_whose_place_is_no_file_is_an_error_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        std::fs::create_dir(room_path(&db)).unwrap();
        let mut room = Room::open(&db, 4096);
        assert!(room.take(Instant::now()).is_err());
        assert!(room.give(4096).is_err());
    }
}
