//! A room: space on a file system that a provider keeps allocated in a file
//! of its own and gives up only when that file system is full, so that
//! what must still be written then - a sqlite provider's checkpoint
//! (`sqlite::room`), a memory provider's snapshot generation - has room to
//! be written into. It is taken back whole once the file system has that
//! much free again.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A room as its file stands. What of it is allocated is `kept`. Giving
/// it up punches holes in its file and keeps the file's length, so a file
/// with holes is a room given up, in part or whole, and not taken back
/// since - the state survives a restart, whatever the configuration says
/// now. A file system that cannot punch holes (vfat, exfat) has the file
/// cut instead: a file of no length is a room given up whole, and one cut
/// in part reads after a restart as a smaller room still kept, which is
/// what it is (a crash while a room is first allocated leaves such a file
/// too: the next start is held until the room fits, the safe side). A
/// whole file shorter than the room (a larger room configured since) is
/// one to grow, not one given up; a longer one (a smaller room configured
/// since, or a room grown and not cut back) is cut to the room when its
/// provider first looks again ([`Room::recheck`]). No file is a room never
/// taken (or one that never fitted).
#[derive(Debug)]
pub(crate) struct Room {
    path: PathBuf,
    bytes: u64,
    kept: u64,
    given_up: bool,
    /// When taking it may be tried again, after a try that failed.
    next_try: Option<Instant>,
    /// A failure to take it was said (once until it is taken), or needs
    /// no saying: it was given up, which its giver said.
    warned: bool,
    /// When its file was last read again while whole ([`Room::recheck`]).
    checked_at: Option<Instant>,
    /// Its file system does not hold blocks allocated ahead of writes
    /// ([`cannot_hold`]): not tried again until a restart.
    unheld: bool,
}

/// How often a whole room's file is read again, so that one removed or cut
/// by hand is taken again.
const RECHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A room file's length and allocated bytes; `None` when there is no
/// such file.
fn file_state(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map(|m| (m.len(), m.blocks().saturating_mul(512)))
}

/// What of the file at `path` is allocated on its file system (0 for no
/// such file): a room's bytes held, whatever its length.
pub(crate) fn allocated_bytes(path: &Path) -> u64 {
    file_state(path).map_or(0, |(len, allocated)| len.min(allocated))
}

impl Room {
    /// The room of `bytes` in the file `path`, as it stands.
    pub fn at(path: PathBuf, bytes: u64) -> Room {
        let mut room = Room {
            path,
            bytes,
            kept: 0,
            given_up: false,
            next_try: None,
            warned: false,
            checked_at: None,
            unheld: false,
        };
        room.refresh();
        room
    }

    /// While whole, reads its file again at most every ten seconds (the
    /// first time at once): a file a larger room left is cut to this one,
    /// what it held beyond given back. Called by its provider's writer
    /// only, which holds the provider's lock: a second broker started on
    /// the same files cuts nothing of the first one's room.
    pub fn recheck(&mut self, now: Instant) {
        if self.is_whole() && self.checked_at.is_none_or(|at| now >= at + RECHECK_EVERY) {
            self.checked_at = Some(now);
            if file_state(&self.path).is_some_and(|(len, _)| len > self.bytes) {
                // Failing, the rest stays allocated beside a room read
                // whole: room to spare, nothing lost.
                let _ = cut_to(&self.path, self.bytes);
            }
            self.refresh();
        }
    }

    /// Reads the room's state from its file again: a file removed or cut
    /// by hand is then a room to take again.
    pub fn refresh(&mut self) {
        (self.kept, self.given_up) = match file_state(&self.path) {
            Some((len, allocated)) => (
                len.min(allocated).min(self.bytes),
                allocated < len || len == 0,
            ),
            None => (0, false),
        };
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

    /// Whether a try to take the room is due at `now`: never again once
    /// its file system was found not to hold one.
    pub fn due(&self, now: Instant) -> bool {
        !self.is_whole() && !self.unheld && self.next_try.is_none_or(|at| now >= at)
    }

    /// Takes the room whole: its file allocated on the disk in full. On a
    /// failure (the file system has less free) the file is as it was (a
    /// room never taken leaves none), and the next try is due at
    /// `retry_at`; a file system that does not hold the blocks allocated
    /// ([`cannot_hold`]) is not tried again.
    pub fn take(&mut self, retry_at: Instant) -> io::Result<()> {
        // Asked first: an allocation that finds no room takes what is free
        // until it fails, and a write beside it then would find none.
        let missing = self.bytes - self.kept;
        let free = self.path.parent().and_then(available_bytes);
        if free.is_some_and(|free| free < missing) {
            self.next_try = Some(retry_at);
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let before = file_state(&self.path).map(|(len, _)| (len, self.kept));
        match allocate(&self.path, self.bytes, before) {
            Ok(()) => {
                self.kept = self.bytes;
                self.given_up = false;
                self.next_try = None;
                self.warned = false;
                Ok(())
            }
            Err(e) => {
                if cannot_hold(&e) {
                    self.unheld = true;
                    // Its file is gone, or as whole as it was.
                    self.refresh();
                }
                self.next_try = Some(retry_at);
                Err(e)
            }
        }
    }

    /// Grows a whole room to `bytes`, allocated in full, as [`Room::take`]
    /// takes it; on a failure it is the room it was, with no try pending.
    pub fn grow(&mut self, bytes: u64) -> io::Result<()> {
        if bytes <= self.bytes {
            return Ok(());
        }
        let was = std::mem::replace(&mut self.bytes, bytes);
        let grown = self.take(Instant::now());
        if grown.is_err() {
            self.bytes = was;
            self.next_try = None;
            self.refresh();
        }
        grown
    }

    /// Cuts a room grown past `bytes` back to it: what it held beyond is
    /// given back to the file system, and the room is whole at `bytes` if
    /// it was.
    pub fn shrink(&mut self, bytes: u64) -> io::Result<()> {
        if bytes >= self.bytes {
            return Ok(());
        }
        let cut = cut_to(&self.path, bytes);
        self.bytes = bytes;
        self.refresh();
        cut
    }

    /// Whether a failure to take it is the first since it was last taken
    /// (or given up): the one to say. Marks it said.
    pub fn first_failure(&mut self) -> bool {
        !std::mem::replace(&mut self.warned, true)
    }

    /// Gives up to `wanted` bytes of it back to the file system: holes are
    /// punched at its file's end, its length kept, so the room is known to
    /// be given up. Returns what was given.
    pub fn give(&mut self, wanted: u64) -> io::Result<u64> {
        // Taking it back fails while the file system is full; what gives it
        // up says why.
        self.warned = true;
        let left = self.kept.saturating_sub(wanted);
        let file = match std::fs::OpenOptions::new().write(true).open(&self.path) {
            Ok(file) => file,
            // Removed by hand: there is nothing to give back.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.kept = 0;
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        punch(&file, left, len.max(self.kept))?;
        let given = self.kept - left;
        self.kept = left;
        self.given_up = true;
        Ok(given)
    }
}

/// Cuts the file at `path` to `bytes` when it is longer; no file is
/// nothing to cut.
fn cut_to(path: &Path, bytes: u64) -> io::Result<()> {
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) if file.metadata()?.len() > bytes => file.set_len(bytes),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Frees the blocks of `file` from `from` to `to`, keeping its length; a
/// file system that cannot punch holes (or not now: one writing its
/// copies elsewhere may need room to punch them) has the file cut at
/// `from` instead.
fn punch(file: &std::fs::File, from: u64, to: u64) -> io::Result<()> {
    if to <= from {
        return Ok(());
    }
    let (Ok(offset), Ok(length)) = (
        libc::off_t::try_from(from),
        libc::off_t::try_from(to - from),
    ) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "room larger than a file",
        ));
    };
    #[cfg(test)]
    let punched = if tests::PUNCHING_HOLES_UNSUPPORTED.get() {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    } else {
        punch_hole(file, offset, length)
    };
    #[cfg(not(test))]
    let punched = punch_hole(file, offset, length);
    // What was punched is given back either way; cut, the room is given
    // back all the same, and a failed cut leaves the punch's reason.
    punched.or_else(|e| file.set_len(from).map_err(|_| e))
}

fn punch_hole(file: &std::fs::File, offset: libc::off_t, length: libc::off_t) -> io::Result<()> {
    // SAFETY: `file` is an open descriptor for the whole call; fallocate
    // touches no memory of ours.
    let punched = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(file),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            length,
        )
    };
    if punched == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Allocates `bytes` of `path` on its file system, creating the file. The
/// blocks are allocated, not just the size set: a sparse file would hold
/// no room. A failed allocation leaves the file as `before` (its length,
/// and what of it was allocated) says it was, or removes it when there
/// was none.
fn allocate(path: &Path, bytes: u64, before: Option<(u64, u64)>) -> io::Result<()> {
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
    let failure = match preallocate(&file, len).and_then(|()| file.metadata()) {
        // Asked again: a file system that keeps zeros compressed (ZFS)
        // takes the call, or glibc's emulation of it writing zeros, and
        // holds no block for them. Such a room would hold nothing, and
        // would be found short and taken again at every look.
        Ok(meta) if meta.blocks().saturating_mul(512) >= bytes => return Ok(()),
        Ok(_) => io::Error::new(io::ErrorKind::Unsupported, NOT_HELD),
        Err(e) => e,
    };
    match before {
        // Its holes say it was given up, and the room may be taken back
        // later: as it was.
        Some((len, kept)) if !cannot_hold(&failure) => {
            let _ = punch(&file, kept, len.max(bytes));
            let _ = file.set_len(len);
        }
        // None before, or any on a file system that cannot hold a room (an
        // earlier build's, or one copied there): what it seems to keep is
        // no room, and a room given up would hold the provider to what it
        // holds with nothing to take it back.
        _ => {
            drop(file);
            let _ = std::fs::remove_file(path);
        }
    }
    Err(failure)
}

/// What a file system that does not hold blocks allocated ahead of writes
/// is told by.
const NOT_HELD: &str =
    "the file system holds no blocks for a file allocated ahead of its writes (ZFS, for one)";

/// Whether `error` says the room's file system cannot hold a room at all,
/// whatever it has free: trying again would change nothing.
pub(crate) fn cannot_hold(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::Unsupported
}

/// Allocates the blocks of `file` up to `len`, growing it to that length.
fn preallocate(file: &std::fs::File, len: libc::off_t) -> io::Result<()> {
    #[cfg(test)]
    if tests::PREALLOCATION_HELD_NOTHING.get() {
        // A file system keeping zeros compressed: the length set, no block
        // held.
        return file.set_len(len as u64);
    }
    // SAFETY: `file` is an open descriptor for the whole call;
    // posix_fallocate touches no memory of ours.
    match unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(file), 0, len) } {
        0 => Ok(()),
        status => Err(io::Error::from_raw_os_error(status)),
    }
}

/// What the file system holding `dir` has free for this process.
pub(crate) fn available_bytes(dir: &Path) -> Option<u64> {
    available(dir).map(|(bytes, _)| bytes)
}

/// What the file system holding `dir` has free for this process: bytes,
/// and how many more files it may create (`None` where the file system
/// sets no such limit: btrfs says 0 of 0). `None` when it cannot be asked.
pub(crate) fn available(dir: &Path) -> Option<(u64, Option<u64>)> {
    let stat = statvfs(dir)?;
    // 32 bits wide on 32-bit targets (an ARM board's), 64 here.
    #[allow(clippy::useless_conversion)]
    let files = (u64::from(stat.f_files) > 0).then(|| u64::from(stat.f_favail));
    Some((free_for(&stat, *ROOT.get_or_init(is_root)), files))
}

fn statvfs(dir: &Path) -> Option<libc::statvfs> {
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
    Some(unsafe { stat.assume_init() })
}

static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether this process is root outside any user namespace: the root
/// whose writes a file system's blocks kept back for root take. Root in a
/// user namespace of its own (a rootless container) is not.
fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    let euid = unsafe { libc::geteuid() };
    euid == 0
        && std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|map| {
            map.lines().any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.first() == Some(&"0") && fields.get(1) == Some(&"0")
            })
        })
}

/// What a file system's `stat` leaves free for a process, `root` or not.
/// Root may write into the blocks the file system keeps back from others
/// (ext4 keeps 5% by default), and fills the disk only when those are
/// gone too: a broker run as root that counted only the others' would
/// not take its room back until as much again was freed (50 GB on a disk
/// of a terabyte). Of what is free, ext4 keeps back from root too the
/// least of 2% and 4,096 blocks, for its own use: never counted.
fn free_for(stat: &libc::statvfs, root: bool) -> u64 {
    // 32 bits wide on 32-bit targets (an ARM board's), 64 here.
    #[allow(clippy::useless_conversion)]
    let (free, available, blocks) = (
        u64::from(stat.f_bfree),
        u64::from(stat.f_bavail),
        u64::from(stat.f_blocks),
    );
    let usable = if root {
        free.saturating_sub((blocks / 50).min(4096)).max(available)
    } else {
        available
    };
    #[allow(clippy::useless_conversion)]
    usable.saturating_mul(u64::from(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::os::unix::fs::MetadataExt;

    thread_local! {
        /// This thread's allocations behave as on a file system that keeps
        /// zeros compressed: they succeed and hold no block.
        pub(super) static PREALLOCATION_HELD_NOTHING: Cell<bool> = const { Cell::new(false) };
        /// This thread's holes cannot be punched, as on vfat or exfat.
        pub(super) static PUNCHING_HOLES_UNSUPPORTED: Cell<bool> = const { Cell::new(false) };
    }

    /// Where a database `db`'s room would be.
    fn room_path(db: &Path) -> PathBuf {
        let mut name = db.as_os_str().to_owned();
        name.push("-room");
        PathBuf::from(name)
    }

    fn allocated(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    fn len(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().len()
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
        assert_eq!(len(room.path()), 1 << 20);
        assert!(allocated(room.path()) >= 1 << 20, "allocated, not sparse");

        assert_eq!(room.give(256 << 10).unwrap(), 256 << 10);
        assert_eq!(room.kept(), 768 << 10);
        assert!(room.is_given_up() && room.due(now));
        assert!(
            allocated(room.path()) <= 768 << 10,
            "the part given is freed"
        );
        assert_eq!(len(room.path()), 1 << 20, "its length kept");
        // The state survives a restart, whatever the room configured now.
        for bytes in [1 << 20, 4 << 20] {
            let reopened = Room::at(room_path(&db), bytes);
            assert!(reopened.is_given_up(), "{bytes}");
            assert_eq!(reopened.kept(), 768 << 10);
        }

        assert_eq!(room.give(u64::MAX).unwrap(), 768 << 10);
        assert_eq!(room.kept(), 0);
        assert_eq!(allocated(room.path()), 0);
        assert!(Room::at(room_path(&db), 1 << 20).is_given_up());

        room.take(now).unwrap();
        assert!(room.is_whole() && !room.is_given_up());
        assert!(allocated(room.path()) >= 1 << 20);
        assert!(!Room::at(room_path(&db), 1 << 20).is_given_up());
    }

    #[test]
    fn a_larger_room_configured_since_is_one_to_grow_not_one_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        Room::at(room_path(&db), 1 << 20)
            .take(Instant::now())
            .unwrap();
        let mut room = Room::at(room_path(&db), 2 << 20);
        assert!(!room.is_given_up());
        assert_eq!(room.kept(), 1 << 20);
        assert!(room.due(Instant::now()));
        room.take(Instant::now()).unwrap();
        assert!(allocated(room.path()) >= 2 << 20);
    }

    #[test]
    fn a_sparse_file_left_beside_the_database_is_taken_before_it_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        let path = room_path(&db);
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let mut room = Room::at(room_path(&db), 1 << 20);
        assert_eq!(room.kept(), 0);
        assert!(room.due(Instant::now()));
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
        assert!(!room.due(Instant::now()));
        assert_eq!(len(room.path()), 2 << 20, "not cut by a mere look");
        // Cut when its provider first looks again, not when next taken: a
        // whole room is not.
        room.recheck(Instant::now());
        assert!(room.is_whole());
        assert_eq!(len(room.path()), 1 << 20);
        assert!(allocated(room.path()) < 2 << 20, "the rest given back");
    }

    /// On a file system that cannot punch holes the room is cut: in part,
    /// it reads after a restart as the smaller room it still is; whole,
    /// its file of no length reads as a room given up, so a restart before
    /// it is taken back opens held as it would with holes.
    #[test]
    fn a_room_cut_where_holes_cannot_be_punched_reads_as_what_it_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        let mut room = Room::at(room_path(&db), 1 << 20);
        let now = Instant::now();
        room.take(now).unwrap();
        PUNCHING_HOLES_UNSUPPORTED.set(true);
        assert_eq!(room.give(256 << 10).unwrap(), 256 << 10);
        assert!(room.is_given_up() && room.kept() == 768 << 10);
        assert_eq!(len(room.path()), 768 << 10, "cut, not punched");
        let reopened = Room::at(room_path(&db), 1 << 20);
        assert_eq!(reopened.kept(), 768 << 10);
        assert!(!reopened.is_given_up() && reopened.due(now));

        assert_eq!(room.give(u64::MAX).unwrap(), 768 << 10);
        PUNCHING_HOLES_UNSUPPORTED.set(false);
        assert_eq!(len(room.path()), 0);
        let reopened = Room::at(room_path(&db), 1 << 20);
        assert!(reopened.is_given_up() && reopened.kept() == 0);
        room.take(now).unwrap();
        assert!(!Room::at(room_path(&db), 1 << 20).is_given_up());
    }

    /// A whole room grows, allocated in full, and is cut back; a growth
    /// the file system cannot hold leaves the room it was.
    #[test]
    fn a_room_grows_and_is_cut_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        let mut room = Room::at(room_path(&db), 1 << 20);
        let now = Instant::now();
        room.take(now).unwrap();
        room.grow(3 << 20).unwrap();
        assert!(room.is_whole() && room.kept() == 3 << 20);
        assert!(allocated(room.path()) >= 3 << 20);
        assert!(room.grow(u64::MAX / 2).is_err());
        assert!(room.is_whole() && room.kept() == 3 << 20 && !room.is_given_up());
        assert_eq!(len(room.path()), 3 << 20);
        room.shrink(1 << 20).unwrap();
        assert!(room.is_whole() && room.kept() == 1 << 20);
        assert_eq!(len(room.path()), 1 << 20);
        assert!(allocated(room.path()) < 3 << 20, "the rest given back");
    }

    #[test]
    fn root_counts_the_blocks_kept_back_from_others_as_free() {
        // SAFETY: statvfs is plain integers; all zeros is a valid value.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        stat.f_frsize = 4096;
        stat.f_blocks = 1_000_000;
        stat.f_bfree = 100_000;
        stat.f_bavail = 50_000;
        // ext4's own 4,096 blocks (less than 2% here) are never counted.
        assert_eq!(free_for(&stat, true), (100_000 - 4096) * 4096);
        assert_eq!(free_for(&stat, false), 50_000 * 4096);
        // Nor 2% of a small file system; never less than the others have.
        stat.f_blocks = 10_000;
        stat.f_bfree = 1000;
        stat.f_bavail = 950;
        assert_eq!(free_for(&stat, true), 950 * 4096);
    }

    #[test]
    fn a_room_removed_by_hand_while_whole_is_seen_and_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        let mut room = Room::at(room_path(&db), 1 << 20);
        let t0 = Instant::now();
        room.take(t0).unwrap();
        room.recheck(t0);
        std::fs::remove_file(room.path()).unwrap();
        room.recheck(t0 + std::time::Duration::from_secs(1));
        assert!(room.is_whole(), "read again at most every ten seconds");
        room.recheck(t0 + RECHECK_EVERY);
        assert!(!room.is_whole() && !room.is_given_up());
        assert!(room.due(t0 + RECHECK_EVERY));
    }

    #[test]
    fn a_room_larger_than_the_file_system_is_refused_before_its_file_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        // Larger than any file system: refused by the look at its free
        // space, before any allocation, and tried again at its next turn.
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

        // One given up in part keeps that part, and its shape, through a
        // try refused so.
        let mut room = Room::at(room_path(&db), 1 << 20);
        room.take(now).unwrap();
        room.give(512 << 10).unwrap();
        let mut larger = Room::at(room_path(&db), too_large);
        assert!(larger.is_given_up());
        assert!(larger.take(later).is_err());
        assert_eq!(len(&room_path(&db)), 1 << 20);
        assert!(allocated(&room_path(&db)) >= 512 << 10);
        assert!(Room::at(room_path(&db), 1 << 20).is_given_up());
    }

    #[test]
    fn a_room_whose_place_is_no_file_is_an_error_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        std::fs::create_dir(room_path(&db)).unwrap();
        let mut room = Room::at(room_path(&db), 4096);
        assert!(!room.is_whole());
        assert!(room.take(Instant::now()).is_err());
        assert!(room.give(4096).is_err());
    }

    #[test]
    fn a_file_system_that_holds_no_preallocated_blocks_is_found_out_once_and_not_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        PREALLOCATION_HELD_NOTHING.set(true);
        let mut room = Room::at(room_path(&db), 1 << 20);
        let now = Instant::now();
        let error = room.take(now).unwrap_err();
        assert!(cannot_hold(&error), "{error}");
        assert!(error.to_string().contains("ZFS"), "{error}");
        assert_eq!(room.kept(), 0);
        assert!(!room.path().exists(), "a room never taken leaves no file");
        let much_later = now + 1000 * RECHECK_EVERY;
        room.recheck(much_later);
        assert!(!room.due(much_later), "not tried again until a restart");

        // One whole from before (a directory moved there, say) keeps
        // nothing there either: it goes, and holds no checkpoint to it.
        PREALLOCATION_HELD_NOTHING.set(false);
        Room::at(room_path(&db), 1 << 20).take(now).unwrap();
        PREALLOCATION_HELD_NOTHING.set(true);
        let mut larger = Room::at(room_path(&db), 2 << 20);
        assert!(cannot_hold(&larger.take(now).unwrap_err()));
        assert_eq!(larger.kept(), 0);
        assert!(!room.path().exists());
        assert!(!larger.due(much_later));
        PREALLOCATION_HELD_NOTHING.set(false);
    }

    /// A room file with its length and no blocks (an earlier build's on
    /// such a file system, or one copied there) reads as given up; once the
    /// file system is found not to hold a room it is removed, so no start
    /// is held to what its provider holds for it.
    #[test]
    fn holes_on_a_file_system_that_cannot_hold_a_room_do_not_read_as_one_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saguin.db");
        std::fs::File::create(room_path(&db))
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let mut room = Room::at(room_path(&db), 1 << 20);
        assert!(room.is_given_up());
        PREALLOCATION_HELD_NOTHING.set(true);
        let error = room.take(Instant::now()).unwrap_err();
        PREALLOCATION_HELD_NOTHING.set(false);
        assert!(cannot_hold(&error), "{error}");
        assert!(!room.is_given_up() && room.kept() == 0);
        assert!(!room_path(&db).exists());
        assert!(!Room::at(room_path(&db), 1 << 20).is_given_up());
    }
}
