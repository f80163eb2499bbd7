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
//! once the file system has that much free. While another process's
//! reader keeps the log from being copied, the room grows with what the
//! log adds beyond the database, and the provider keeps at most what it
//! covers ([`super::FlushLoop::hold_to_room`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::storage::room::{allocated_bytes, available_bytes, Room};

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
        let held_bytes = database
            + len(&super::wal_path(db))
            + allocated_bytes(&room_path(db)).min(checkpoint_room);
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

/// Room given up beyond what a checkpoint was reckoned to need: its
/// reckoning is the pages the log holds beyond the database's file, and
/// what else the file system takes meanwhile (a log line, another
/// process's write) should not make it fall short.
const GIVEN_BEYOND_NEED: u64 = 1 << 20;

/// How far the room is kept ahead of what the log adds beyond the
/// database while a reader keeps it: the configured room, and at least
/// 16 MiB, so that a small room does not hold back what a writer adds
/// between two turns (at every turn of the flusher once the log is past
/// its restart size, a second at most before).
fn ahead_of_log(configured: u64) -> u64 {
    configured.max(16 << 20)
}

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
            match room.give(wanted) {
                Ok(bytes) => given += bytes,
                Err(e) => {
                    tracing::error!(provider = %self.name, file = %room.path().display(), error = %e,
                        "giving up the checkpoint's room failed; the write-ahead log waits for room made beside the provider");
                    // Nothing was given: what holds the provider to what it
                    // holds would otherwise wait for a room still whole.
                    if given == 0 && shared.lift_disk_ceiling() {
                        room.refresh();
                    }
                    break;
                }
            }
            done = self.checkpoint_once(commits);
            if done.is_some() {
                break;
            }
        }
        // A room grown with a log a reader kept goes back to its configured
        // size: what it keeps beyond that is the file system's again, and
        // one still whole at that size holds the provider to nothing.
        let configured = shared.options.checkpoint_room;
        let mut whole_again = false;
        if let Some(room) = self.room.as_mut().filter(|r| r.bytes() > configured) {
            if let Err(e) = room.shrink(configured) {
                tracing::warn!(provider = %self.name, file = %room.path().display(), error = %e,
                    "cutting the checkpoint's room back to its configured size failed");
            }
            whole_again = room.is_whole() && shared.lift_disk_ceiling();
        }
        let kept = self.room.as_ref().map_or(0, Room::kept);
        shared.set_room_held(kept);
        match done {
            Some(_) if whole_again => {
                tracing::warn!(provider = %self.name, given_bytes = given, room_left_bytes = kept,
                "gave up what the checkpoint's room had grown by to copy the write-ahead log into the database; the room is whole at its configured size, and the provider's ceiling back to its configuration")
            }
            Some(_) => {
                tracing::warn!(provider = %self.name, given_bytes = given, room_left_bytes = kept,
                "gave up the checkpoint's room to copy the write-ahead log into the database; it is taken back whole, and the provider's ceiling lifted, once the file system has that much free")
            }
            None => tracing::error!(provider = %self.name, given_bytes = given,
                "the checkpoint's room was not enough to copy the write-ahead log; writes are refused until room is made beside the provider"),
        }
        done
    }

    /// Keeps the room ahead of what the write-ahead log adds beyond the
    /// database's file while the log is not being copied into it, and holds
    /// the provider to what the room covers. A reader of another process (a
    /// backup reading for minutes, a shell left in a transaction) keeps the
    /// log's frames from being copied, so what the log adds beyond the
    /// database's end grows for as long as it reads; the checkpoint after
    /// the reader grows the file by all of it, and should the file system
    /// be full by then, only the room is sure to be there. So once a
    /// checkpoint (`last`) left frames behind, the log adds more than a
    /// quarter of [`ahead_of_log`] beyond the database, and a checkpoint
    /// with the provider's own readers idle still leaves frames behind,
    /// the room grows, at every turn,
    /// to what the log adds and that much more while the file system has it
    /// free, and the provider keeps at most what the room covers: publishes
    /// are refused (0x83) only where the room could not grow. Once the log
    /// adds less than an eighth of it, the room is cut back to its
    /// configured size and the provider let go. Not while the room is not
    /// whole: the file system's ceiling governs then.
    pub(super) fn hold_to_room(&mut self, last: Option<&super::Checkpointed>, commits: u64) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let configured = shared.options.checkpoint_room;
        let ahead = ahead_of_log(configured);
        let held = shared.log_ceiling.load(Ordering::Acquire) != 0;
        let whole = self.room.as_ref().is_some_and(Room::is_whole)
            && shared.disk_ceiling.load(Ordering::Acquire) == 0;
        if !whole {
            if held {
                shared.set_log_ceiling(0);
            }
            shared.room_short.store(false, Ordering::Release);
            // A room given up, or removed by hand, is taken back at its
            // configured size.
            if let Some(room) = self.room.as_mut() {
                let _ = room.shrink(configured);
            }
            return;
        }
        // Nothing left behind, nothing to hold: the turn's usual case, read
        // no further.
        if !held && last.is_none_or(|c| c.copied >= c.log) {
            return;
        }
        // A checkpoint the reader check runs may grow the file after this:
        // the ceiling from it is then lower than it could be until the next
        // turn, never higher.
        let (file, beyond) = self.database_and_beyond(&shared);
        if !held && (beyond <= ahead / 4 || !self.outside_reader(&shared, commits)) {
            return;
        }
        let Some(room) = self.room.as_mut() else {
            return;
        };
        if held && beyond < ahead / 8 {
            if let Err(e) = room.shrink(configured) {
                tracing::warn!(provider = %self.name, file = %room.path().display(), error = %e,
                    "cutting the checkpoint's room back to its configured size failed; it keeps more than configured until it is next given up or the provider restarts");
            }
            // Recorded before it is said, so that the gauge agrees with the
            // line by the time the line is read.
            shared.set_room_held(room.kept());
            if shared.set_log_ceiling(0) {
                shared.room_short.store(false, Ordering::Release);
                tracing::info!(provider = %self.name, log_beyond_database_bytes = beyond,
                    room_bytes = room.kept(),
                    "the write-ahead log is copied into the database again: the checkpoint's room is back to its configured size, and the provider's ceiling to its configuration");
            }
            return;
        }
        // What a relief write may take beyond the ceiling, and the margin a
        // checkpoint is given, stay inside the room, beyond what it is
        // kept ahead by.
        let margin = GIVEN_BEYOND_NEED + shared.options.reserve;
        let grown = room.grow(beyond + ahead + margin);
        let pages = ((file + room.kept().saturating_sub(margin)) / shared.page_size).max(1);
        if pages != shared.log_ceiling.load(Ordering::Acquire) {
            shared.set_log_ceiling(pages);
        }
        // Said once the ceiling it sets holds.
        shared.set_room_held(room.kept());
        if !held {
            tracing::info!(provider = %self.name, file = %shared.path.display(),
                log_beyond_database_bytes = beyond, room_bytes = room.kept(),
                "the write-ahead log is not being copied into the database (another process is reading it: a backup, a shell in a transaction): the checkpoint's room grows with what the log adds, and the provider keeps at most what the room covers, until the log is copied again");
        }
        match grown {
            Err(e) if !shared.room_short.swap(true, Ordering::AcqRel) => {
                tracing::warn!(provider = %self.name, file = %room.path().display(), error = %e,
                    log_beyond_database_bytes = beyond, room_bytes = room.kept(),
                    holds_at_most_bytes = pages * shared.page_size,
                    "the checkpoint's room cannot grow with what the write-ahead log adds while another process reads it: publishes beyond what the room covers are refused (0x83) until the log is copied again");
            }
            Err(_) => {}
            Ok(()) => shared.room_short.store(false, Ordering::Release),
        }
    }

    /// Whether a reader of another process keeps frames of the log from
    /// being copied: a checkpoint run while none of the provider's own
    /// readers is in a read (they end theirs within milliseconds) still
    /// leaves some behind. Asked only once what the log adds passed a
    /// quarter of the room, which its own readers never pin; its failure
    /// is any checkpoint's ([`super::FlushLoop::checkpoint_once`]).
    /// `false` when its own do not end in time: the next turn asks again.
    fn outside_reader(&mut self, shared: &super::Shared, commits: u64) -> bool {
        matches!(
            shared.with_readers_idle(super::READERS_IDLE_WITHIN, || {
                self.checkpoint_once(commits)
            }),
            Some(Some(c)) if c.copied < c.log
        )
    }

    /// What a checkpoint has to grow the database's file by: the pages
    /// the log holds beyond its end, read on the checkpoint's connection.
    fn log_beyond_database(&self, shared: &super::Shared) -> u64 {
        self.database_and_beyond(shared).1
    }

    /// The database's file length, and [`Self::log_beyond_database`].
    fn database_and_beyond(&self, shared: &super::Shared) -> (u64, u64) {
        let pages: u64 = self
            .checkpointer
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap_or(0);
        let file = std::fs::metadata(&shared.path).map_or(0, |m| m.len());
        (file, (pages * shared.page_size).saturating_sub(file))
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
        room.recheck(now);
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        if !room.due(now) {
            shared.set_room_held(room.kept());
            return;
        }
        if shared.failed.load(Ordering::Acquire) {
            return;
        }
        match room.take(now + super::CHECKPOINT_EVERY) {
            Ok(()) => {
                shared.set_room_held(room.bytes());
                if shared.disk_ceiling.load(Ordering::Acquire) == 0 {
                    tracing::info!(provider = %self.name, file = %room.path().display(), room_bytes = room.bytes(),
                        "the checkpoint's room is kept");
                } else if shared.lift_disk_ceiling() {
                    tracing::info!(provider = %self.name, file = %shared.path.display(), room_bytes = room.bytes(),
                        "the checkpoint's room is kept again, the file system having that much free: the storage provider's ceiling is back to its configuration");
                }
            }
            Err(e) if crate::storage::room::cannot_hold(&e) => {
                if room.first_failure() {
                    tracing::warn!(provider = %self.name, file = %room.path().display(), room_bytes = room.bytes(), error = %e,
                        "the checkpoint's room cannot be kept on this file system (not tried again until a restart): should the write-ahead log take the last of it, writes stop until room is made beside the provider; keep that much free by the file system's own means (on ZFS, a dataset reservation) and set checkpoint_room: 0");
                }
            }
            Err(e) => {
                // Given up to a checkpoint or an open, which said so.
                if shared.disk_ceiling.load(Ordering::Acquire) == 0 && room.first_failure() {
                    tracing::warn!(provider = %self.name, file = %room.path().display(), room_bytes = room.bytes(), error = %e,
                        "cannot keep the checkpoint's room beside the storage provider (tried again every second): should the write-ahead log take the last of the file system, writes stop until room is made beside it");
                }
            }
        }
    }
}
