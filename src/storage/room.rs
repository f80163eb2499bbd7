//! A room: space on a file system that a provider keeps allocated in a file
//! of its own and gives up only when that file system is full, so that
//! what must still be written then - a sqlite provider's checkpoint
//! (`sqlite::room`), a memory provider's snapshot generation - has room to
//! be written into. It is taken back whole once the file system has that
//! much free again.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A room as its file stands. What of it is allocated is `kept`; a file
/// shorter than the room is a room given up, in part or whole, and not
/// taken back since - the state survives a restart. No file is a room
/// never taken (or one that never fitted).
#[derive(Debug)]
pub(crate) struct Room {
    path: PathBuf,
    bytes: u64,
    kept: u64,
    given_up: bool,
    /// When taking it may be tried again, after a try that failed.
    next_try: Option<Instant>,
    /// A failure to take it was logged (once until it is taken).
    pub warned: bool,
}

impl Room {
    /// The room of `bytes` in the file `path`, as it stands.
    pub fn at(path: PathBuf, bytes: u64) -> Room {
        use std::os::unix::fs::MetadataExt;
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

/// What the file system holding `dir` has free for this process.
pub(crate) fn available_bytes(dir: &Path) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::sqlite::room_path;
    use std::os::unix::fs::MetadataExt;

    fn allocated(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn a_room_is_taken_allocated_given_up_in_part_and_taken_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        let mut room = Room::at(room_path(&db), 1 << 20);
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
        let reopened = Room::at(room_path(&db), 1 << 20);
        assert!(reopened.is_given_up());
        assert_eq!(reopened.kept(), 768 << 10);

        assert_eq!(room.give(u64::MAX).unwrap(), 768 << 10);
        assert_eq!(room.kept(), 0);
        assert_eq!(std::fs::metadata(room.path()).unwrap().len(), 0);
        assert!(
            Room::at(room_path(&db), 1 << 20).is_given_up(),
            "kept, empty"
        );

        room.take(now).unwrap();
        assert!(room.is_whole() && !room.is_given_up());
        assert!(allocated(room.path()) >= 1 << 20);
        assert!(!Room::at(room_path(&db), 1 << 20).is_given_up());
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
        let mut room = Room::at(room_path(&db), 1 << 20);
        assert_eq!(room.kept(), 0);
        assert!(!room.is_given_up());
        room.take(Instant::now()).unwrap();
        assert!(allocated(&path) >= 1 << 20);
    }

    #[test]
    fn a_larger_room_a_previous_configuration_kept_is_cut_to_this_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        Room::at(room_path(&db), 2 << 20)
            .take(Instant::now())
            .unwrap();
        let mut room = Room::at(room_path(&db), 1 << 20);
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
        let mut never = Room::at(room_path(&db), too_large);
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(1);
        assert!(never.take(later).is_err());
        assert!(!never.due(now) && never.due(later));
        assert!(
            !room_path(&db).exists(),
            "a room never taken leaves no file"
        );

        // One given up in part keeps that part through a failed try.
        let mut room = Room::at(room_path(&db), 1 << 20);
        room.take(now).unwrap();
        room.give(512 << 10).unwrap();
        let mut larger = Room::at(room_path(&db), too_large);
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
        let mut room = Room::at(room_path(&db), 4096);
        assert!(room.take(Instant::now()).is_err());
        assert!(room.give(4096).is_err());
    }
}
