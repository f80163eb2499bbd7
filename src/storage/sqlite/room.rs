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

/// The room as the flusher keeps it.
#[derive(Debug)]
pub(crate) struct Room {
    path: PathBuf,
    bytes: u64,
    held: bool,
    /// When taking it may be tried again, after a try that failed.
    next_try: Option<Instant>,
    /// A failure to take it was logged (once until it is taken).
    warned: bool,
}

impl Room {
    /// A room of `bytes` beside `db`, not yet taken.
    pub fn new(db: &Path, bytes: u64) -> Room {
        Room {
            path: room_path(db),
            bytes,
            held: false,
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

    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Whether its file holds any blocks on the disk: room a previous run
    /// took, which can be given up.
    pub fn is_allocated(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).is_ok_and(|m| m.blocks() > 0)
    }

    /// Whether a try to take the room is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        !self.held && self.next_try.is_none_or(|at| now >= at)
    }

    /// Takes the room: its file allocated on the disk in full. A file a
    /// previous run left allocated is taken as it is. On a failure (the
    /// file system has less free) nothing stays allocated, and the next try
    /// is due at `retry_at`.
    pub fn take(&mut self, retry_at: Instant) -> io::Result<()> {
        match allocate(&self.path, self.bytes) {
            Ok(()) => {
                self.held = true;
                self.next_try = None;
                Ok(())
            }
            Err(e) => {
                self.next_try = Some(retry_at);
                Err(e)
            }
        }
    }

    /// Gives the room back to the file system: its file is cut to nothing
    /// (and kept, so what stands beside the database does not change).
    pub fn release(&mut self) -> io::Result<()> {
        self.held = false;
        match std::fs::OpenOptions::new().write(true).open(&self.path) {
            Ok(file) => file.set_len(0),
            // Removed by hand: there is nothing to give back.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Allocates `bytes` of `path` on its file system, creating the file. The
/// blocks are allocated, not just the size set: a sparse file would hold
/// no room. What a failed allocation took is given back.
fn allocate(path: &Path, bytes: u64) -> io::Result<()> {
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
    let _ = file.set_len(0);
    Err(io::Error::from_raw_os_error(status))
}

impl super::FlushLoop {
    /// A checkpoint found the file system full: the provider is held to
    /// what it holds, and the room is given up and the checkpoint tried
    /// again. Without a room held (none kept, none taken, or given up
    /// already) the log waits for room made beside the provider: holding
    /// the provider to what it holds is lifted by taking the room back,
    /// and a room that never fitted would never lift it.
    pub(super) fn checkpoint_with_room(&mut self, commits: u64) -> Option<super::Checkpointed> {
        if !self.room.as_ref().is_some_and(Room::is_held) {
            return None;
        }
        let shared = self.shared.upgrade()?;
        if shared.disk_ceiling.load(Ordering::Acquire) == 0 {
            let pages = shared.hold_to_disk()?;
            tracing::warn!(provider = %self.name, file = %shared.path.display(),
                holds_bytes = pages * shared.page_size,
                "the file system under the storage provider is full: it keeps at most what it holds until there is room again; publishes beyond are refused (0x83), and what retention and consumers remove makes room for them");
        }
        let room = self.room.as_mut()?;
        let bytes = room.bytes();
        let released = room.release();
        // Taking it back fails while the file system is full; this says why.
        room.warned = true;
        if let Err(e) = released {
            shared.room_held.store(0, Ordering::Release);
            tracing::error!(provider = %self.name, file = %room.path().display(), error = %e,
                "giving up the checkpoint's room failed; the write-ahead log waits for room made beside the provider");
            return None;
        }
        let done = self.checkpoint_once(commits);
        // Stored once the checkpoint it was given up for has run.
        shared.room_held.store(0, Ordering::Release);
        match done {
            Some(_) => tracing::warn!(provider = %self.name, room_bytes = bytes,
                "gave up the checkpoint's room to copy the write-ahead log into the database; it is taken back, and the provider's ceiling lifted, once the file system has that much free"),
            None => tracing::error!(provider = %self.name, room_bytes = bytes,
                "the checkpoint's room was not enough to copy the write-ahead log; writes are refused until room is made beside the provider"),
        }
        done
    }

    /// Takes the room when it is not held and a try is due (at the first
    /// turn, then once a second until it is). Taken while the provider is
    /// held to what it holds, it lifts that ceiling: the file system has
    /// the room free again.
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

    #[test]
    fn a_room_is_taken_allocated_and_given_back_to_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        let mut room = Room::new(&db, 1 << 20);
        assert_eq!(room.path(), dir.path().join("saguin.db-room"));
        let now = Instant::now();
        assert!(room.due(now));
        room.take(now).unwrap();
        assert!(room.is_held() && !room.due(now));
        let meta = std::fs::metadata(room.path()).unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert!(meta.blocks() * 512 >= 1 << 20, "allocated, not sparse");
        room.release().unwrap();
        assert!(!room.is_held());
        let meta = std::fs::metadata(room.path()).unwrap();
        assert_eq!((meta.len(), meta.blocks()), (0, 0));
        // Taken again from the empty file.
        room.take(now).unwrap();
        assert!(std::fs::metadata(room.path()).unwrap().blocks() * 512 >= 1 << 20);
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
        assert_eq!(std::fs::metadata(&path).unwrap().blocks(), 0);
        let mut room = Room::new(&db, 1 << 20);
        room.take(Instant::now()).unwrap();
        assert!(std::fs::metadata(&path).unwrap().blocks() * 512 >= 1 << 20);
    }

    #[test]
    fn a_larger_room_a_previous_configuration_kept_is_cut_to_this_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        Room::new(&db, 2 << 20).take(Instant::now()).unwrap();
        let mut room = Room::new(&db, 1 << 20);
        room.take(Instant::now()).unwrap();
        let meta = std::fs::metadata(room.path()).unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert!(meta.blocks() * 512 < 2 << 20, "the rest given back");
    }

    #[test]
    fn a_room_that_cannot_be_taken_leaves_nothing_and_waits_for_its_next_try() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file would be: the open fails.
        let db = dir.path().join("saguin.db");
        std::fs::create_dir(room_path(&db)).unwrap();
        let mut room = Room::new(&db, 4096);
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(1);
        assert!(room.take(later).is_err());
        assert!(!room.is_held());
        assert!(!room.due(now) && room.due(later));
        // Giving back a room not held from a path that is no file is an
        // error, never a panic.
        assert!(room.release().is_err());
    }
}
