//! What a migration carries: one *unit* per file of a snapshot directory,
//! in the format 21 model both providers translate to and from.
//!
//! A unit is what moves, and what fails, as one piece: a channel (a queue
//! with its dead-letter channel, which are one file and one transaction), the
//! retained store, or the persistent sessions with the broadcast log they
//! point into (read together or neither is worth reading).

use std::path::PathBuf;

use saguin_format::f21::{BroadcastFile, ChannelFile, RetainedFile, SessionsFile, SnapshotFile};
use saguin_format::model::ChannelKind;

use crate::storage::sample::ListCounts;

use crate::storage::contract::{BROADCAST_LOG_NAME, RETAINED_STORE_NAME};

/// One piece of a provider's data that is migrated, counted and reported
/// on its own.
// One value per unit, handed on by value once: boxing buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A channel; a queue carries its dead-letter channel inside.
    Channel(ChannelFile),
    /// A channel of a snapshot directory whose records are carried from its
    /// file as they are read rather than held: `channel` has every field
    /// but its record lists (records, queue items, dead letters), which
    /// `lists` counts. What a migration into a database reads, so that a
    /// channel of ten million records costs a window of its file, not all
    /// of them at once.
    ChannelInFile {
        channel: ChannelFile,
        file: PathBuf,
        lists: ListCounts,
    },
    /// The retained store (broker.retained_storage).
    Retained(RetainedFile),
    /// Persistent sessions and the broadcast log (broker.session_storage).
    Sessions {
        sessions: SessionsFile,
        log: BroadcastFile,
    },
}

/// The name a session unit is reported under.
pub const SESSIONS_UNIT: &str = "$saguin/sessions";

impl Unit {
    /// The name the unit is reported under: the channel's, or the reserved
    /// store name.
    pub fn name(&self) -> &str {
        match self {
            Unit::Channel(c) | Unit::ChannelInFile { channel: c, .. } => &c.name,
            Unit::Retained(_) => RETAINED_STORE_NAME,
            Unit::Sessions { .. } => SESSIONS_UNIT,
        }
    }

    /// `append`, `latest`, `queue`, `retained` or `sessions`.
    pub fn kind(&self) -> &'static str {
        match self {
            Unit::Channel(c) | Unit::ChannelInFile { channel: c, .. } => c.kind.as_str(),
            Unit::Retained(_) => "retained",
            Unit::Sessions { .. } => "sessions",
        }
    }

    /// What the unit holds, by the rules of [`Counts`].
    pub fn counts(&self) -> Counts {
        match self {
            Unit::Channel(c) => channel_counts(
                c,
                ListCounts {
                    records: c.records.len(),
                    items: c.items.len(),
                    dead_letter: c.dead_letter.as_ref().map_or(0, |d| d.records.len()),
                    messages: 0,
                },
            ),
            Unit::ChannelInFile { channel, lists, .. } => channel_counts(channel, *lists),
            Unit::Retained(r) => Counts {
                records: r.records.len() as u64,
                ..Counts::default()
            },
            Unit::Sessions { sessions, log } => Counts {
                next: log.next,
                floor: log.floor,
                records: log.messages.len() as u64,
                positions: log.cursors.len() as u64,
                held: log.held.len() as u64,
                sessions: sessions.sessions.len() as u64,
                inflight: sessions
                    .sessions
                    .iter()
                    .map(|s| s.inflight.len() as u64)
                    .sum(),
                shared_groups: sessions.shared_groups.len() as u64,
                returned: sessions
                    .shared_groups
                    .iter()
                    .map(|g| g.returned.len() as u64)
                    .sum(),
                ..Counts::default()
            },
        }
    }

    /// How much work the unit is, for a progress bar: its records.
    pub fn weight(&self) -> u64 {
        let c = self.counts();
        c.records + c.queue_items + c.dead_letters + c.sessions
    }

    /// The same validation the snapshot loader runs on the file this unit
    /// becomes, so a unit the broker would refuse is refused before it is
    /// written anywhere. The unit is lent to the validator, not copied.
    pub fn validate(&mut self) -> Result<(), String> {
        use saguin_format::f21::validate;
        match self {
            Unit::Channel(c) => {
                let file = SnapshotFile::Channel(std::mem::replace(
                    c,
                    ChannelFile::new(String::new(), ChannelKind::Append),
                ));
                let result = validate(&file).map_err(|e| e.to_string());
                if let SnapshotFile::Channel(back) = file {
                    *c = back;
                }
                result
            }
            // Only a snapshot directory's scan makes one, and the scan
            // checked it; carried, its file must hold what it held then.
            Unit::ChannelInFile { .. } => Ok(()),
            Unit::Retained(r) => {
                let file = SnapshotFile::Retained(std::mem::take(r));
                let result = validate(&file).map_err(|e| e.to_string());
                if let SnapshotFile::Retained(back) = file {
                    *r = back;
                }
                result
            }
            Unit::Sessions { sessions, log } => {
                let file = SnapshotFile::Sessions(std::mem::take(sessions));
                let first = validate(&file)
                    .map_err(|e| format!("{}: {e}", saguin_format::channel_name::SESSIONS_FILE));
                if let SnapshotFile::Sessions(back) = file {
                    *sessions = back;
                }
                first?;
                let file = SnapshotFile::Broadcast(std::mem::take(log));
                let second = validate(&file)
                    .map_err(|e| format!("{}: {e}", saguin_format::channel_name::BROADCAST_FILE));
                if let SnapshotFile::Broadcast(back) = file {
                    *log = back;
                }
                second?;
                saguin_format::f21::validate_pair(sessions, log).map_err(|e| e.to_string())
            }
        }
    }
}

/// What a channel holds whose record lists hold `lists`.
fn channel_counts(c: &ChannelFile, lists: ListCounts) -> Counts {
    let mut n = Counts {
        next: c.next,
        floor: c.floor,
        records: lists.records as u64,
        queue_items: lists.items as u64,
        positions: c.positions.len() as u64,
        held: c.held.len() as u64,
        ..Counts::default()
    };
    if let Some(d) = &c.dead_letter {
        n.dead_letters = lists.dead_letter as u64;
        n.positions += d.positions.len() as u64;
        n.dead_letter_next = d.next;
        n.dead_letter_floor = d.floor;
    } else if c.kind == ChannelKind::Queue {
        n.dead_letter_next = 1;
        n.dead_letter_floor = 1;
    }
    n
}

/// What a unit holds, counted the same way on both sides of a migration and
/// compared: a migration whose counts out differ from its counts in failed.
///
/// - `next`, `floor`: the channel's counters (the broadcast log's for
///   sessions; 0 for the retained store, whose offsets only order values);
/// - `records`: append records, latest values and deletion markers, retained
///   messages, or broadcast-log messages;
/// - `queue_items`, `dead_letters`: a queue's unresolved records and its
///   dead-letter channel's records (with that channel's counters);
/// - `positions`: durable consumer positions (a queue's are its dead-letter
///   channel's), or the sessions' broadcast-log cursors;
/// - `held`: exactly-once publishes held for their PUBREL;
/// - `sessions`, `inflight`, `shared_groups`, `returned`: persistent
///   sessions, their in-flight entries, shared groups' cursors, and the
///   deliveries returned to the groups.
///
/// From a database the counts in are taken by SQL from the source's rows,
/// not from what was read of them, so a row the reading misses fails the
/// unit rather than vanishing from both sides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub next: u64,
    pub floor: u64,
    pub records: u64,
    pub queue_items: u64,
    pub dead_letters: u64,
    pub dead_letter_next: u64,
    pub dead_letter_floor: u64,
    pub positions: u64,
    pub held: u64,
    pub sessions: u64,
    pub inflight: u64,
    pub shared_groups: u64,
    pub returned: u64,
}

impl Counts {
    /// The fields that differ between `self` (in) and `out`, named.
    pub fn differences(&self, out: &Counts) -> Vec<String> {
        let pairs = [
            ("next", self.next, out.next),
            ("floor", self.floor, out.floor),
            ("records", self.records, out.records),
            ("queue items", self.queue_items, out.queue_items),
            ("dead letters", self.dead_letters, out.dead_letters),
            (
                "dead-letter next",
                self.dead_letter_next,
                out.dead_letter_next,
            ),
            (
                "dead-letter floor",
                self.dead_letter_floor,
                out.dead_letter_floor,
            ),
            ("positions", self.positions, out.positions),
            ("held publishes", self.held, out.held),
            ("sessions", self.sessions, out.sessions),
            ("in-flight entries", self.inflight, out.inflight),
            ("shared groups", self.shared_groups, out.shared_groups),
            ("returned deliveries", self.returned, out.returned),
        ];
        pairs
            .iter()
            .filter(|(_, a, b)| a != b)
            .map(|(what, a, b)| format!("{what}: {a} in, {b} out"))
            .collect()
    }
}

/// The name of the broadcast log's channel row and positions.
pub(crate) const LOG: &str = BROADCAST_LOG_NAME;
