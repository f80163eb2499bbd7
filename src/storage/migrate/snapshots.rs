//! Units to and from a snapshot directory, through the code the broker
//! uses: [`snapshot_dir::scan`] (the loader's own decode and validation, so
//! what is migrated is what `serve` would load; into a database, the same
//! scan counting each channel's records, which are then carried from its
//! file as they are written, [`Carry::FromFiles`]) and
//! [`generation::write_snapshot`] (the broker's writer: the units as
//! the directory's first generation, each file to a temporary name, all
//! of them synced together, each renamed, the directory fsynced, the
//! manifest last; 0700 and 0600).

use std::path::Path;

use saguin_format::channel_name::{BROADCAST_FILE, RETAINED_CHANNEL, SESSIONS_FILE};
use saguin_format::f21::{self, ChannelFile, FileKind, SnapshotFile};
use saguin_format::model::{ChannelKind, Record, UnixNanos};

use super::model::{Unit, SESSIONS_UNIT};
use crate::storage::contract::{
    dead_letter_name, HeldPublish, Position, Reader, ShareGroupEntry, ShareGroupKey,
    BROADCAST_LOG_NAME, RETAINED_STORE_NAME,
};
use crate::storage::generation;
use crate::storage::kept::Kept;
use crate::storage::memory::{AppendCopy, BroadcastCopy, LatestCopy, QueueCopy};
use crate::storage::sample::Sample;
use crate::storage::snapshot_dir::{
    self, FileOutcome, FindingKind, Records, Role, ScanOptions, Severity,
};
use crate::storage::snapshot_write::{ChannelCopy, ProviderCopy, SnapshotOptions, WriteReport};
use crate::storage::sqlite::units::{retained_offsets, ReadFailure};

/// What a snapshot directory holds, as units, with the files that were
/// refused and the warnings (stale files, leftover temporary files).
#[derive(Debug, Default)]
pub struct DirUnits {
    pub units: Vec<Unit>,
    pub failures: Vec<ReadFailure>,
    pub warnings: Vec<String>,
    /// Every finding for which `snapshot verify` answers no (but for an
    /// empty directory, which is "nothing to migrate"), named: a source
    /// with any is refused whole.
    pub refusals: Vec<String>,
}

/// What a read of a directory holds of its channels' records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    /// Every record, decoded: for a writer that takes them whole.
    Whole,
    /// None: each channel is a [`Unit::ChannelInFile`], its records counted
    /// as the directory is scanned and read again from its file as they
    /// are written.
    FromFiles,
}

/// Reads every file of `dir` with the loader's decoder. A refused file is
/// a failure of its unit (named); the others are read regardless.
pub fn read_dir(
    dir: &Path,
    opts: &ScanOptions,
    carry: Carry,
) -> Result<DirUnits, snapshot_dir::ScanError> {
    let mut sample = Sample::counting_channels();
    let report = match carry {
        Carry::Whole => snapshot_dir::scan(dir, opts)?,
        Carry::FromFiles => snapshot_dir::scan_with(dir, opts, Records::Into(&mut sample))?,
    };
    let mut out = DirUnits {
        refusals: report
            .verification_failures()
            .filter(|f| !matches!(f, FindingKind::NothingStored))
            .map(|f| format!("{}: {f}", dir.display()))
            .collect(),
        ..DirUnits::default()
    };
    let mut sessions = None;
    let mut log = None;
    let mut failed_session_files = Vec::new();
    for finding in &report.findings {
        match finding.severity() {
            Severity::Error => {}
            _ => {
                // The lock this migration holds keeps a journal of its own
                // beside it; that is not something the directory holds.
                let own_lock = finding
                    .file()
                    .is_some_and(|f| f.starts_with(saguin_format::channel_name::LOCK_FILE));
                if finding.code() != "nothing-stored" && !own_lock {
                    out.warnings.push(format!("{}: {finding}", dir.display()));
                }
            }
        }
    }
    // Cross-file errors that are not a single file's refusal.
    for finding in report.errors() {
        if matches!(
            finding.code(),
            "sessions-without-broadcast" | "pair-invalid"
        ) {
            failed_session_files.push(finding.to_string());
        }
    }
    for f in report.files {
        match (f.role, f.outcome) {
            // A manifest that cannot be used is a file that fails
            // verification: the broker starts over it with a warning (it
            // holds no records), a copy made from the directory does not.
            (Role::Manifest, FileOutcome::Failed(problem)) => out
                .refusals
                .push(format!("{}: {problem}", f.path.display())),
            (Role::Manifest, _) => {}
            (role, FileOutcome::Failed(problem)) => {
                let (name, kind) = match &role {
                    Role::Channel(Some(c)) => (c.clone(), "channel"),
                    Role::Channel(None) => (f.name.clone(), "channel"),
                    Role::Retained => (RETAINED_STORE_NAME.to_owned(), "retained"),
                    Role::Sessions | Role::Broadcast => {
                        failed_session_files.push(format!("{}: {problem}", f.name));
                        continue;
                    }
                    Role::Manifest => continue,
                };
                out.failures.push(ReadFailure {
                    name,
                    kind,
                    error: format!("{}: {problem}", f.path.display()),
                });
            }
            (role, FileOutcome::Decoded { file, .. }) => match file {
                SnapshotFile::Channel(c) => {
                    let expected = saguin_format::channel_name::encode_file_name(&c.name);
                    if role != Role::Channel(Some(c.name.clone())) {
                        out.failures.push(ReadFailure {
                            name: c.name.clone(),
                            kind: c.kind.as_str(),
                            error: format!(
                                "{}: holds channel {:?}, whose file is {expected}",
                                f.path.display(),
                                c.name
                            ),
                        });
                    } else if carry == Carry::FromFiles {
                        out.units.push(Unit::ChannelInFile {
                            channel: c,
                            lists: sample.counts_of(&f.name),
                            file: f.path,
                        });
                    } else {
                        out.units.push(Unit::Channel(c));
                    }
                }
                SnapshotFile::Retained(r) => out.units.push(Unit::Retained(r)),
                SnapshotFile::Sessions(s) => sessions = Some(s),
                SnapshotFile::Broadcast(b) => log = Some(b),
                SnapshotFile::Manifest(_) | SnapshotFile::Generation(_) => {}
            },
            (_, _) => {}
        }
    }
    match (sessions, log, failed_session_files.is_empty()) {
        (Some(sessions), Some(log), true) => out.units.push(Unit::Sessions { sessions, log }),
        (None, Some(log), true)
            if !log.messages.is_empty() || !log.cursors.is_empty() || !log.held.is_empty() =>
        {
            out.units.push(Unit::Sessions {
                sessions: Default::default(),
                log,
            })
        }
        (None, _, true) => {}
        (_, _, _) => out.failures.push(ReadFailure {
            name: SESSIONS_UNIT.into(),
            kind: "sessions",
            error: if failed_session_files.is_empty() {
                format!("{SESSIONS_FILE} is there without {BROADCAST_FILE}")
            } else {
                failed_session_files.join("; ")
            },
        }),
    }
    Ok(out)
}

/// Records moved behind the shared handles the writer takes, not copied.
fn kept(records: Vec<Record>) -> Vec<Kept> {
    records.iter().map(Kept::new).collect()
}

fn positions(channel: &str, list: &[f21::Position]) -> Result<Vec<Position>, String> {
    list.iter()
        .map(|p| {
            Ok(Position {
                reader: Reader::parse(&p.reader).map_err(|e| format!("channel {channel}: {e}"))?,
                offset: p.offset,
                saved_at: p.saved_at,
                session_expiry: p.session_expiry,
            })
        })
        .collect()
}

fn holds(channel: &str, held: &[f21::HeldPublish]) -> Vec<HeldPublish> {
    held.iter()
        .map(|h| HeldPublish {
            channel: channel.to_owned(),
            client_id: h.client_id.clone(),
            packet_id: h.packet_id,
            held_at: h.held_at,
            record: h.record.clone(),
        })
        .collect()
}

fn append_copy(
    name: &str,
    next: u64,
    floor: u64,
    bytes: u64,
    records: Vec<Record>,
    pos: &[f21::Position],
) -> Result<AppendCopy, String> {
    Ok(AppendCopy {
        version: 0,
        from: 0,
        name: name.to_owned(),
        next,
        floor,
        bytes,
        records: records.into(),
        positions: positions(name, pos)?,
    })
}

/// The shutdown writer's copy of one channel unit.
fn channel_copy(c: ChannelFile) -> Result<ChannelCopy, String> {
    let held = holds(&c.name, &c.held);
    Ok(match c.kind {
        ChannelKind::Append => ChannelCopy::Append {
            copy: append_copy(&c.name, c.next, c.floor, c.bytes, c.records, &c.positions)?,
            held,
        },
        ChannelKind::Latest => ChannelCopy::Latest {
            copy: LatestCopy {
                version: 0,
                name: c.name.clone(),
                next: c.next,
                floor: c.floor,
                bytes: c.bytes,
                records: c.records.into(),
                positions: positions(&c.name, &c.positions)?,
            },
            held,
        },
        ChannelKind::Queue => {
            let dlq = dead_letter_name(&c.name);
            let dead_letter = match c.dead_letter {
                Some(d) => append_copy(&dlq, d.next, d.floor, d.bytes, d.records, &d.positions)?,
                None => append_copy(&dlq, 1, 1, 0, Vec::new(), &[])?,
            };
            ChannelCopy::Queue {
                positions: positions(&c.name, &c.positions)?,
                copy: QueueCopy {
                    version: 0,
                    name: c.name.clone(),
                    next: c.next,
                    floor: c.floor,
                    bytes: c.bytes,
                    items: c
                        .items
                        .into_iter()
                        .map(|i| {
                            (
                                Kept::new(&i.record),
                                i.attempts,
                                i.first_delivered,
                                i.last_delivered,
                            )
                        })
                        .collect(),
                },
                dead_letter,
                held,
            }
        }
    })
}

/// The shutdown writer's copy of every unit, stamped `began_at`. A unit that
/// cannot be expressed (a reader name the store refuses) is a failure.
pub fn provider_copy(
    units: Vec<Unit>,
    began_at: UnixNanos,
) -> (ProviderCopy, SnapshotOptions, Vec<(String, String)>) {
    let mut copy = ProviderCopy {
        captured_at: began_at,
        channels: Vec::new(),
        retained: None,
        sessions: None,
    };
    let mut failures = Vec::new();
    for unit in units {
        match unit {
            Unit::Channel(c) => {
                let name = c.name.clone();
                match channel_copy(c) {
                    Ok(cc) => copy.channels.push(cc),
                    Err(e) => failures.push((name, e)),
                }
            }
            // Into a directory the records are written whole, so they are
            // read whole.
            Unit::ChannelInFile { channel, file, .. } => {
                let read =
                    snapshot_dir::read_f21_file(&file, &ScanOptions::default(), FileKind::Channel);
                match read {
                    Ok((_, SnapshotFile::Channel(c))) => match channel_copy(c) {
                        Ok(cc) => copy.channels.push(cc),
                        Err(e) => failures.push((channel.name, e)),
                    },
                    Ok(_) => failures.push((
                        channel.name,
                        format!("{}: not a channel file", file.display()),
                    )),
                    Err(problem) => {
                        failures.push((channel.name, format!("{}: {problem}", file.display())))
                    }
                }
            }
            Unit::Retained(r) => {
                let records = retained_offsets(&r.records);
                copy.retained = Some(LatestCopy {
                    version: 0,
                    name: RETAINED_STORE_NAME.into(),
                    next: records.iter().map(|r| r.offset + 1).max().unwrap_or(1),
                    floor: 1,
                    bytes: records.iter().map(Record::accounted_size).sum(),
                    records: records.into(),
                    positions: Vec::new(),
                })
            }
            Unit::Sessions { sessions, log } => {
                let log_copy = BroadcastCopy {
                    version: 0,
                    next: log.next,
                    floor: log.floor,
                    bytes: log.bytes,
                    messages: kept(log.messages),
                    cursors: log
                        .cursors
                        .iter()
                        .map(|p| {
                            let client =
                                p.reader.strip_prefix(f21::READER_MQTT).unwrap_or(&p.reader);
                            (std::sync::Arc::from(client), p.offset, p.saved_at)
                        })
                        .collect(),
                    groups: sessions
                        .shared_groups
                        .iter()
                        .map(|g| ShareGroupEntry {
                            key: ShareGroupKey {
                                group: g.key.group.clone(),
                                filter: g.key.filter.clone(),
                            },
                            cursor: g.cursor,
                            returned: g.returned.clone(),
                        })
                        .collect(),
                };
                copy.sessions = Some((
                    sessions
                        .sessions
                        .iter()
                        .cloned()
                        .map(std::sync::Arc::new)
                        .collect(),
                    log_copy,
                    holds(BROADCAST_LOG_NAME, &log.held),
                ));
            }
        }
    }
    copy.channels.sort_by(|a, b| a.name().cmp(b.name()));
    let options = SnapshotOptions {
        retained: copy.retained.is_some(),
        sessions: copy.sessions.is_some(),
        parallel_files: 4,
    };
    (copy, options, failures)
}

/// Writes the units with the shutdown's writer. The report names every file
/// that was not written; the caller maps them back to units.
pub fn write_dir(dir: &Path, copy: &ProviderCopy, options: &SnapshotOptions) -> WriteReport {
    generation::write_snapshot(dir, copy, options)
}

/// The unit name a file the writer reported belongs to.
pub fn unit_of_written(name: &str) -> String {
    if name == RETAINED_CHANNEL {
        RETAINED_STORE_NAME.into()
    } else if name == BROADCAST_LOG_NAME || name == "sessions" {
        SESSIONS_UNIT.into()
    } else {
        name.to_owned()
    }
}
