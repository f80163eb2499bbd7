//! Spare files of a snapshot directory on ext4 without a journal
//! (`format/FORMAT.md` §4).
//!
//! There, making a file passes over every inode removed in the last
//! minute (the file system will not hand one out again that soon without
//! a journal, and reads each to see), and a generation removes a file for
//! every one it makes: a generation of 10,000 small files kept a CPU busy
//! for 3-4 s, nearly all of it the kernel's. So there a generation keeps
//! each file it replaced under a spare name (`saguin.<n>.spare`), emptied
//! but for a file of one block or less, and a later generation makes its
//! files by renaming spares and writing over them: no inode removed, none
//! made, and for small files no block freed or taken. Elsewhere the replaced
//! files are removed, which costs less than keeping them: with a journal
//! the spares' two renames and the emptying cost more CPU than a removal
//! and a new file (docs/benchmarks.md, "What a generation of many small
//! files costs the CPU").
//!
//! A spare is never listed by a manifest and never read. What a crash
//! leaves is as harmless: a spare, a replaced file under its old name
//! (removed at startup as one no generation lists), or a spare renamed to
//! a temporary name (removed at startup as a write that never finished).

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use saguin_format::channel_name::{spare_file_name, spare_number};

/// The most a spare keeps of the file it was: one block of the file
/// system (4 KiB on ext4 as made by default). A directory of 10,000
/// channels keeps no more than 40 MB so, and a generation that writes its
/// files over them takes no block of the file system's.
pub const KEPT_BYTES: u64 = 4096;

/// A directory's spare files, and whether it keeps any.
#[derive(Debug, Default)]
pub struct Spares {
    /// Whether replaced files are kept as spares: decided by the file
    /// system at the first generation written.
    keep: OnceLock<bool>,
    pool: Mutex<Pool>,
}

#[derive(Debug, Default)]
struct Pool {
    /// The spares in the directory, by name.
    names: Vec<String>,
    /// The number the next spare is named with.
    next: u64,
    /// Whether the directory was looked in for spares left before.
    looked: bool,
}

impl Spares {
    /// Spares decided by the directory's file system when it is first
    /// written to.
    pub fn by_file_system() -> Spares {
        Spares::default()
    }

    /// Spares that are never kept: each replaced file is removed.
    pub fn none() -> Spares {
        Spares::kept(false)
    }

    /// Spares kept, or not, whatever the file system.
    pub fn kept(keep: bool) -> Spares {
        let spares = Spares::default();
        let _ = spares.keep.set(keep);
        spares
    }

    /// Decides, once, whether `dir` keeps spares (ext4 without a journal),
    /// and takes in the spares an earlier run left there, or removes them
    /// when it keeps none. Called as each generation starts, `dir` made.
    pub fn decide(&self, dir: &Path) {
        let keep = *self
            .keep
            .get_or_init(|| super::file_system::without_journal(dir) == Some(true));
        let mut pool = self.lock();
        if pool.looked {
            return;
        }
        pool.looked = true;
        pool.next = 1;
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Some(n) = spare_number(&name) else {
                continue;
            };
            if keep {
                pool.names.push(name);
                pool.next = pool.next.max(n.saturating_add(1));
            } else {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Makes `dir/path`'s file from a spare, by renaming one to it: true
    /// when one was there to take (the file is then at `path`, holding up
    /// to [`KEPT_BYTES`] of the file it was, for its writer to write over
    /// and cut to its own length).
    pub fn take(&self, dir: &Path, path: &Path) -> bool {
        loop {
            let Some(name) = self.lock().names.pop() else {
                return false;
            };
            if fs::rename(dir.join(&name), path).is_ok() {
                return true;
            }
            // Gone from under us (an operator's tidying): the next.
        }
    }

    /// Keeps `dir/name`, a file of `length` bytes no generation lists any
    /// more, as a spare when the directory keeps them: renamed, then
    /// emptied if it is longer than [`KEPT_BYTES`]. Renamed first, so that
    /// a copy of the directory taken meanwhile finds the file whole under
    /// its name or not at all, as it would a removed one (never an emptied
    /// file under a name a manifest lists). False when it is not kept; the
    /// caller removes it.
    pub fn keep(&self, dir: &Path, name: &str, length: u64) -> bool {
        if self.keep.get() != Some(&true) {
            return false;
        }
        let mut pool = self.lock();
        let spare = spare_file_name(pool.next);
        if fs::rename(dir.join(name), dir.join(&spare)).is_err() {
            return false;
        }
        pool.next += 1;
        // A spare of one block or less keeps its block: the file made from
        // it is written over it, and cut to its own length, where emptying
        // it freed the block, the write took one again and the close of a
        // file emptied and written again started its write-back at once
        // (10,000 channels' generation: 0.9 s of CPU against 1.5 s). A
        // larger one is emptied now so that its bytes are free while it
        // waits; should that fail, the file made from it is cut to its
        // length all the same.
        if length > KEPT_BYTES {
            let _ = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(dir.join(&spare));
        }
        pool.names.push(spare);
        true
    }

    /// Removes the spares beyond `most`. A generation replaces at most
    /// every file the one before listed, so a directory never needs more
    /// spares than its manifest lists files; more are left by a
    /// configuration with fewer channels than the one before, and kept
    /// they would hold that many inodes for good.
    pub fn keep_at_most(&self, dir: &Path, most: usize) {
        let mut pool = self.lock();
        while pool.names.len() > most {
            if let Some(name) = pool.names.pop() {
                let _ = fs::remove_file(dir.join(name));
            }
        }
    }

    /// How many spares the directory holds.
    pub fn len(&self) -> usize {
        self.lock().names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::names_in as names;

    #[test]
    fn a_replaced_file_is_kept_and_taken_by_a_rename_emptied_when_over_a_block() {
        let d = tempfile::tempdir().unwrap();
        let spares = Spares::kept(true);
        spares.decide(d.path());
        let large = vec![7u8; KEPT_BYTES as usize + 1];
        fs::write(d.path().join("b.1.snapshot"), &large).unwrap();
        assert!(spares.keep(d.path(), "b.1.snapshot", large.len() as u64));
        fs::write(d.path().join("a.1.snapshot"), b"records").unwrap();
        assert!(spares.keep(d.path(), "a.1.snapshot", 7));
        assert_eq!(names(d.path()), ["saguin.1.spare", "saguin.2.spare"]);
        let len = |name: &str| fs::metadata(d.path().join(name)).unwrap().len();
        assert_eq!(len("saguin.1.spare"), 0, "over a block: emptied");
        assert_eq!(len("saguin.2.spare"), 7, "a block or less: kept");

        use std::os::unix::fs::MetadataExt;
        let inode = fs::metadata(d.path().join("saguin.2.spare")).unwrap().ino();
        let made = d.path().join("a.2.snapshot.tmp");
        assert!(spares.take(d.path(), &made));
        assert_eq!(fs::metadata(&made).unwrap().ino(), inode, "the same file");
        assert!(spares.take(d.path(), &d.path().join("b.2.snapshot.tmp")));
        assert!(spares.is_empty());
        assert!(!spares.take(d.path(), &d.path().join("c.2.snapshot.tmp")));
    }

    #[test]
    fn spares_beyond_those_a_generation_could_take_are_removed() {
        let d = tempfile::tempdir().unwrap();
        for n in 1..=5 {
            fs::write(d.path().join(spare_file_name(n)), b"").unwrap();
        }
        let spares = Spares::kept(true);
        spares.decide(d.path());
        assert_eq!(spares.len(), 5);
        spares.keep_at_most(d.path(), 2);
        assert_eq!(spares.len(), 2);
        assert_eq!(names(d.path()).len(), 2, "{:?}", names(d.path()));
        // The two kept are the ones the pool still names.
        assert!(spares.take(d.path(), &d.path().join("a.tmp")));
        assert!(spares.take(d.path(), &d.path().join("b.tmp")));
        assert!(!spares.take(d.path(), &d.path().join("c.tmp")));
        assert_eq!(names(d.path()), ["a.tmp", "b.tmp"]);
    }

    #[test]
    fn a_directory_that_keeps_none_removes_what_it_replaced_and_spares_left_before() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("saguin.4.spare"), b"").unwrap();
        fs::write(d.path().join("a.1.snapshot"), b"records").unwrap();
        let spares = Spares::kept(false);
        spares.decide(d.path());
        assert_eq!(
            names(d.path()),
            ["a.1.snapshot"],
            "the spare left before is gone"
        );
        assert!(!spares.keep(d.path(), "a.1.snapshot", 7));
        assert!(!spares.take(d.path(), &d.path().join("a.2.snapshot.tmp")));
    }

    #[test]
    fn spares_an_earlier_run_left_are_taken_and_new_ones_numbered_past_them() {
        let d = tempfile::tempdir().unwrap();
        for n in [3, 9] {
            fs::write(d.path().join(spare_file_name(n)), b"").unwrap();
        }
        fs::write(d.path().join("saguin.x.spare"), b"").unwrap();
        fs::write(d.path().join("a.1.snapshot"), b"records").unwrap();
        let spares = Spares::kept(true);
        spares.decide(d.path());
        assert_eq!(spares.len(), 2);
        assert!(spares.keep(d.path(), "a.1.snapshot", 7));
        assert!(d.path().join("saguin.10.spare").exists());
        // Deciding again finds nothing new.
        spares.decide(d.path());
        assert_eq!(spares.len(), 3);
    }

    #[test]
    fn a_spare_gone_from_under_the_pool_is_passed_over() {
        let d = tempfile::tempdir().unwrap();
        let spares = Spares::kept(true);
        spares.decide(d.path());
        for name in ["a.1.snapshot", "b.1.snapshot"] {
            fs::write(d.path().join(name), b"x").unwrap();
            assert!(spares.keep(d.path(), name, 1));
        }
        fs::remove_file(d.path().join("saguin.2.spare")).unwrap();
        let made = d.path().join("c.2.snapshot.tmp");
        assert!(spares.take(d.path(), &made));
        assert!(made.exists());
        assert!(!spares.take(d.path(), &d.path().join("d.2.snapshot.tmp")));
    }
}
