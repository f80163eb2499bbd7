//! Loading a snapshot directory into a memory provider at startup.
//!
//! The checker is the loader: every byte of the directory
//! is read, and every decision about whether it can be loaded is made, by
//! [`snapshot_dir::scan`] - the code `saguin snapshot verify` runs - with
//! its bounded read (no symlink, FIFO or device is opened, no file past the
//! size limit is read), its decode and semantic pass, its manifest cases,
//! its leftover temporary files, its sessions/log pair check and its file
//! name to channel name match. A directory it refuses is refused here with
//! the same words, every file named, not only the first: an empty start is
//! indistinguishable from a fresh install and destroys the evidence. Its
//! warnings are the startup's warnings.
//!
//! What only the provider can know is decided here, where the stores are
//! rebuilt from the validated files: a channel whose configured kind is not
//! the one in its file is refused, queue items come back available with no
//! holder, holds in a file older than the manifest are counted as
//! abandoned, positions whose session expired while the broker was down
//! are dropped, and everything restored is charged to the byte counter.
//! `tests/snapshot_loader_agreement.rs` drives `saguin snapshot verify` and
//! this loader over every damaged fixture and holds them to one verdict.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use saguin_format::channel_name::{encode_file_name, RETAINED_FILE, SESSIONS_FILE};
use saguin_format::f21::{
    self, BroadcastFile, QueueItem, RecordList, RecordSink, SessionsFile, SnapshotFile, READER_MQTT,
};
use saguin_format::model::{ChannelKind, Record, UnixNanos};

use super::latest::LatestLoad;
use super::queue::RestoredItem;
use super::{MemChannel, MemoryAppend, MemoryLatest, MemoryProvider, MemoryQueue};
use crate::storage::contract::{
    dead_letter_name, HeldPublish, Position, Reader, SessionEntry, ShareGroupEntry, ShareGroupKey,
    BROADCAST_LOG_NAME,
};
use crate::storage::kept::Kept;
use crate::storage::read::{ReadError, F21_DEFAULT_MAX_BYTES};
use crate::storage::snapshot_dir::{
    self, DirReport, FileOutcome, FindingKind, LoadSink, Loaded, Records, ScanError, ScanOptions,
    Severity,
};

/// What a load is asked to bring back.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// The configured channels on this provider, with their kinds. A file
    /// for any other channel is left alone (the configuration dropped it).
    pub channels: Vec<(String, ChannelKind)>,
    /// This provider keeps the retained store.
    pub retained: bool,
    /// This provider keeps sessions and the broadcast log.
    pub sessions: bool,
    /// The moment of the start, for expiry.
    pub now: UnixNanos,
    /// limits.max_session_expiry, seconds: bounds every interval judged.
    pub max_session_expiry: u32,
    /// The largest format 21 file read, checked before a byte of it is:
    /// [`LoadOptions::file_limit_for`] the provider's bound.
    pub max_file_bytes: u64,
}

/// How many times its bound one file of a bounded provider may be.
pub const FILE_LIMIT_BOUND_FACTOR: u64 = 8;

/// The least file limit of a bounded provider, however small its bound.
pub const FILE_LIMIT_FLOOR: u64 = 64 * 1024 * 1024;

impl LoadOptions {
    /// The per-file size limit of a provider whose bound is `max_bytes`.
    ///
    /// A start reads a file as a stream, so this is not what it allocates
    /// for one; it is the largest file a provider of this bound writes, and
    /// a larger one is refused before it is read. The bound counts each record's topic,
    /// payload and properties; the file adds per record its fixed fields
    /// (57 bytes) and the publishing client id, and holds the sessions,
    /// which the bound does not count. So a provider's file is a small
    /// multiple of its bound: [`FILE_LIMIT_BOUND_FACTOR`] times it, never
    /// below [`FILE_LIMIT_FLOOR`] (room for the sessions of a small
    /// provider). An unbounded provider gives nothing to derive a limit
    /// from and keeps the 4 GiB default `snapshot verify` uses.
    pub fn file_limit_for(max_bytes: Option<u64>) -> u64 {
        match max_bytes {
            Some(max) => max
                .saturating_mul(FILE_LIMIT_BOUND_FACTOR)
                .max(FILE_LIMIT_FLOOR),
            None => F21_DEFAULT_MAX_BYTES,
        }
    }

    /// How the directory is scanned: only the files this provider keeps
    /// are read, each held to [`LoadOptions::max_file_bytes`].
    fn scan_options(&self) -> ScanOptions {
        ScanOptions {
            channels: Some(self.channels.iter().map(|(n, _)| n.clone()).collect()),
            retained: self.retained,
            sessions: self.sessions,
            max_bytes_f21: self.max_file_bytes,
            ..ScanOptions::default()
        }
    }
}

/// One channel brought back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedChannel {
    pub name: String,
    pub kind: ChannelKind,
    pub next: u64,
    pub floor: u64,
    /// Records, values or queue items.
    pub records: u64,
    pub bytes: u64,
    pub written_at: UnixNanos,
    /// Positions in it (or its dead-letter channel) dropped because their
    /// session expired while the broker was down.
    pub dropped_positions: u64,
}

/// What a load did, for the startup log.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub loaded: Vec<LoadedChannel>,
    /// The directory's warnings, worded as `snapshot verify` words them,
    /// and anything else the operator should read.
    pub warnings: Vec<String>,
    /// Every warning and info finding of the directory scan, typed.
    pub findings: Vec<FindingKind>,
    /// Positions dropped because their session expired while down.
    pub dropped_positions: u64,
    /// Exactly-once holds in files the last shutdown did not rewrite.
    pub abandoned_holds: u64,
    /// Sessions that expired while the broker was down.
    pub dropped_sessions: u64,
    /// Files in the directory this provider was not asked for (and left
    /// unread), and names that are no snapshot file at all.
    pub ignored_files: Vec<String>,
    /// Temporary files of writes that never finished.
    pub leftover_temp_files: Vec<String>,
    /// The manifest's moment (a generation's state, or a shutdown's
    /// start), when one was read.
    pub manifest_at: Option<UnixNanos>,
    /// The generation the directory holds (0: files a build before
    /// generations wrote, or none).
    pub generation: u64,
    /// The directory's current generation, for the writer that continues
    /// it.
    pub committed: crate::storage::generation::Committed,
}

/// One file that stops the start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadProblem {
    /// The file, or the directory for a finding across files (whose detail
    /// then names the file, as `snapshot verify`'s line does).
    pub path: PathBuf,
    pub detail: String,
}

impl std::fmt::Display for LoadProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "snapshot {}: {}", self.path.display(), self.detail)
    }
}

/// The start is refused: every file that could not be loaded.
#[derive(Clone, Debug, thiserror::Error)]
#[error("snapshot directory {}: {} file(s) cannot be loaded: {}", .dir.display(), .problems.len(), join(.problems))]
pub struct LoadError {
    pub dir: PathBuf,
    pub problems: Vec<LoadProblem>,
}

fn join(problems: &[LoadProblem]) -> String {
    problems
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// A scan's error finding as the start's problem, worded as the `FAIL`
/// line `snapshot verify` prints for it: a refused file under its own
/// path, a finding across files under the directory's.
fn problem_of(dir: &Path, finding: &FindingKind) -> LoadProblem {
    match finding {
        FindingKind::FileRefused { file, problem } => LoadProblem {
            path: dir.join(file),
            detail: problem.clone(),
        },
        other => LoadProblem {
            path: dir.to_path_buf(),
            detail: other.to_string(),
        },
    }
}

/// A directory that could not be scanned at all.
fn scan_problem(dir: &Path, error: &ScanError) -> LoadProblem {
    match error {
        ScanError::Read(e) => LoadProblem {
            path: e.path().to_path_buf(),
            detail: e.reason(),
        },
        ScanError::NotADirectory { .. } => LoadProblem {
            path: dir.to_path_buf(),
            detail: error
                .to_string()
                .strip_prefix(&format!("{}: ", dir.display()))
                .map(str::to_owned)
                .unwrap_or_else(|| error.to_string()),
        },
    }
}

/// Each configured channel whose file decoded with another kind: the
/// provider's own refusal (append records are not put into a
/// latest map, nor queue work into a log where nothing can acknowledge it).
/// Judged on the scan before its verdict, so it is named beside any
/// damaged file rather than after it is mended.
fn kind_mismatches(report: &DirReport, options: &LoadOptions) -> Vec<LoadProblem> {
    let configured: BTreeMap<&str, ChannelKind> = options
        .channels
        .iter()
        .map(|(n, k)| (n.as_str(), *k))
        .collect();
    report
        .files
        .iter()
        .filter_map(|f| match &f.outcome {
            FileOutcome::Decoded {
                file: SnapshotFile::Channel(c),
                ..
            } => {
                let kind = *configured.get(c.name.as_str())?;
                (kind != c.kind).then(|| LoadProblem {
                    path: f.path.clone(),
                    detail: format!(
                        "channel {} is configured as {kind} but its file holds a {} channel; it is not loaded into the wrong shape",
                        c.name, c.kind
                    ),
                })
            }
            _ => None,
        })
        .collect()
}

fn parse_positions(
    path: &Path,
    positions: Vec<f21::Position>,
    options: &LoadOptions,
    report: &mut LoadReport,
) -> Result<Vec<Position>, LoadProblem> {
    let mut out = Vec::with_capacity(positions.len());
    for p in positions {
        // The scan refused every reader `Reader::parse` refuses
        // (`snapshot_dir::check_readers`), so this is never taken.
        let reader = Reader::parse(&p.reader).map_err(|e| LoadProblem {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        let position = Position {
            reader,
            offset: p.offset,
            saved_at: p.saved_at,
            session_expiry: p.session_expiry,
        };
        // A position whose session would have expired while the broker was
        // down goes now; otherwise they accumulate for ever.
        if position.expired_at(options.now, options.max_session_expiry) {
            report.dropped_positions += 1;
            continue;
        }
        out.push(position);
    }
    Ok(out)
}

fn holds(channel: &str, held: Vec<f21::HeldPublish>) -> Vec<HeldPublish> {
    held.into_iter()
        .map(|h| HeldPublish {
            channel: channel.to_owned(),
            client_id: h.client_id,
            packet_id: h.packet_id,
            held_at: h.held_at,
            record: h.record,
        })
        .collect()
}

/// A channel file's record lists, each record made compact as it was
/// decoded.
#[derive(Debug, Default)]
struct DecodedLists {
    records: Vec<Kept>,
    dead_letter: Vec<Kept>,
    items: Vec<RestoredItem>,
    /// The retained store's values, of its file.
    retained: LatestLoad,
}

/// What a start decodes straight into the stores' compact forms: the
/// retained store's values, and each channel file's lists by the file's
/// name. A record is let go once its compact form is made, so a start
/// never holds a file's decoded records beside the store built from them
/// (about 200 bytes a record before its strings: 2 GB for a channel of ten
/// million). The broadcast log's messages are decoded whole, in its file,
/// and made compact one by one as the log is restored.
#[derive(Debug, Default)]
struct StartSink {
    /// The retained store's values, once its file decoded.
    retained: LatestLoad,
    /// The lists of the file being read.
    reading: DecodedLists,
    files: HashMap<String, DecodedLists>,
}

impl RecordSink for StartSink {
    fn capacity(&mut self, list: RecordList, count: usize) -> usize {
        match list {
            RecordList::ChannelRecords => self.reading.records.reserve_exact(count),
            RecordList::DeadLetterRecords => self.reading.dead_letter.reserve_exact(count),
            RecordList::QueueItems => self.reading.items.reserve_exact(count),
            RecordList::Retained => self.reading.retained.reserve(count),
            RecordList::BroadcastMessages => return count,
        }
        0
    }

    fn record(&mut self, list: RecordList, record: Record, kept: &mut Vec<Record>) {
        match list {
            RecordList::ChannelRecords => self.reading.records.push(Kept::new(&record)),
            RecordList::DeadLetterRecords => self.reading.dead_letter.push(Kept::new(&record)),
            RecordList::Retained => self.reading.retained.push_retained(record),
            RecordList::BroadcastMessages | RecordList::QueueItems => kept.push(record),
        }
    }

    fn item(&mut self, item: QueueItem, _: &mut Vec<QueueItem>) {
        self.reading.items.push(RestoredItem {
            record: Kept::new(&item.record),
            attempts: item.attempts,
            first_delivered: item.first_delivered,
            last_delivered: item.last_delivered,
        });
    }
}

impl LoadSink for StartSink {
    fn file_read(&mut self, file: &str, decoded: bool) {
        let mut lists = std::mem::take(&mut self.reading);
        if decoded {
            // One file holds the retained store; any other holds none.
            if lists.retained.len() > 0 {
                self.retained = std::mem::take(&mut lists.retained);
            }
            self.files.insert(file.to_owned(), lists);
        }
    }
}

/// One channel's store, built from its validated file, and its holds.
struct Built {
    channel: MemChannel,
    holds: Vec<HeldPublish>,
}

impl MemoryProvider {
    /// Loads `dir` into this provider, which must hold no channel yet. A
    /// missing directory is a first start and loads nothing. Refused - with
    /// every file named, in the words of `saguin snapshot verify` - when the
    /// directory is one verify refuses, or a file holds a channel of another
    /// kind than the configured one.
    pub fn load_snapshot_dir(
        self: &Arc<Self>,
        dir: &Path,
        options: &LoadOptions,
    ) -> Result<LoadReport, LoadError> {
        let fail = |problems: Vec<LoadProblem>| LoadError {
            dir: dir.to_path_buf(),
            problems,
        };
        let mut decoded = StartSink::default();
        let records = Records::Into(&mut decoded);
        let scanned = match snapshot_dir::scan_with(dir, &options.scan_options(), records) {
            Ok(r) => r,
            // Only the directory itself can be missing here (a file that
            // vanishes after the listing is a refused file).
            Err(ScanError::Read(ReadError::NotFound { .. })) => return Ok(LoadReport::default()),
            Err(e) => return Err(fail(vec![scan_problem(dir, &e)])),
        };
        let mismatched = kind_mismatches(&scanned, options);
        let loaded = match snapshot_dir::into_loaded(scanned) {
            Ok(l) if mismatched.is_empty() => l,
            Ok(_) => return Err(fail(mismatched)),
            Err(snapshot_dir::LoadError::Refused { errors, .. }) => {
                let mut problems: Vec<LoadProblem> =
                    errors.iter().map(|e| problem_of(dir, e)).collect();
                problems.extend(mismatched);
                return Err(fail(problems));
            }
            Err(snapshot_dir::LoadError::Scan { error, .. }) => {
                return Err(fail(vec![scan_problem(dir, &error)]))
            }
        };
        self.restore_loaded(dir, loaded, decoded, options)
            .map_err(fail)
    }

    /// Turns a validated directory into this provider's stores.
    fn restore_loaded(
        self: &Arc<Self>,
        dir: &Path,
        loaded: Loaded,
        decoded: StartSink,
        options: &LoadOptions,
    ) -> Result<LoadReport, Vec<LoadProblem>> {
        let Loaded {
            manifest,
            mut channels,
            retained,
            sessions,
            broadcast,
            broadcast_stale,
            findings,
            committed,
        } = loaded;
        let StartSink {
            retained: retained_values,
            mut files,
            ..
        } = decoded;
        let mut report = LoadReport {
            manifest_at: manifest.as_ref().map(|(_, m)| m.moment()),
            generation: committed.generation,
            committed,
            ..LoadReport::default()
        };
        for f in &findings {
            if f.severity() == Severity::Warning {
                report.warnings.push(f.to_string());
            }
            match f {
                FindingKind::LeftoverTemp { file } => report.leftover_temp_files.push(file.clone()),
                FindingKind::NotConfigured { file } | FindingKind::Unrecognised { file, .. } => {
                    report.ignored_files.push(file.clone())
                }
                _ => {}
            }
        }
        report.findings = findings;

        let mut problems = Vec::new();
        let mut built: Vec<(String, Built)> = Vec::new();
        let wanted: BTreeSet<&str> = options.channels.iter().map(|(n, _)| n.as_str()).collect();
        for name in wanted {
            let Some(file) = channels.remove(name) else {
                continue;
            };
            let path = dir.join(&file.file_name);
            // Every file the scan read went through the sink; one whose
            // lists it did not keep is refused rather than started empty.
            let Some(lists) = files.remove(&file.file_name) else {
                problems.push(LoadProblem {
                    path,
                    detail: "its records were not kept as it was read".into(),
                });
                continue;
            };
            match self.build_channel(&path, file, lists, options, &mut report) {
                Ok(b) => built.push((name.to_owned(), b)),
                Err(p) => problems.push(p),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }

        if options.retained {
            // The scan handed the file's records to `retained_values` as it
            // decoded them.
            if retained.is_some() {
                let next = retained_values.len() as u64 + 1;
                if let Err(e) = self.retained_store().fill_loaded(next, 1, retained_values) {
                    problems.push(LoadProblem {
                        path: dir.join(RETAINED_FILE),
                        detail: e.to_string(),
                    });
                }
            }
        }

        // Sessions and the broadcast log, read together or not at all: the
        // scan refused a sessions file without its log and a pair that does
        // not fit; a log without a sessions file holds no session.
        if options.sessions {
            if let Some(log) = broadcast {
                if let Err(p) = self.restore_sessions(
                    dir,
                    sessions.unwrap_or_default(),
                    log,
                    broadcast_stale,
                    options,
                    &mut report,
                ) {
                    problems.push(p);
                }
            }
        }

        let mut restored_holds = Vec::new();
        for (name, b) in built {
            match self.install(&name, b.channel) {
                Ok(()) => restored_holds.extend(b.holds),
                Err(e) => problems.push(LoadProblem {
                    path: dir.join(encode_file_name(&name)),
                    detail: e.to_string(),
                }),
            }
        }
        for h in restored_holds {
            self.held().restore(h);
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(report)
    }

    /// One channel's store from its validated file, whose kind is the
    /// configured one (checked before the scan's verdict).
    fn build_channel(
        &self,
        path: &Path,
        file: snapshot_dir::LoadedChannel,
        lists: DecodedLists,
        options: &LoadOptions,
        report: &mut LoadReport,
    ) -> Result<Built, LoadProblem> {
        let snapshot_dir::LoadedChannel {
            header,
            file: c,
            stale,
            ..
        } = file;
        let name = c.name.as_str();
        let holds = if stale {
            // That shutdown's broker answered these releases without them:
            // counted, not restored.
            report.abandoned_holds += c.held.len() as u64;
            Vec::new()
        } else {
            holds(name, c.held)
        };
        let dropped_before = report.dropped_positions;
        let positions = parse_positions(path, c.positions, options, report)?;
        let shared = self.shared().clone();
        let DecodedLists {
            records: decoded_records,
            dead_letter: dead_letter_records,
            items,
            // A channel's file holds no retained value.
            retained: _,
        } = lists;
        let records = match c.kind {
            ChannelKind::Queue => items.len() as u64,
            _ => decoded_records.len() as u64,
        };
        let channel = match c.kind {
            ChannelKind::Append => MemChannel::Append(Arc::new(MemoryAppend::restore(
                name,
                shared,
                false,
                c.next,
                c.floor,
                decoded_records,
                positions,
            ))),
            ChannelKind::Latest => MemoryLatest::restore(
                name,
                shared,
                c.next,
                c.floor,
                LatestLoad::of_kept(decoded_records),
                positions,
            )
            .map(|l| MemChannel::Latest(Arc::new(l)))
            .map_err(|e| LoadProblem {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?,
            ChannelKind::Queue => {
                let dlq_name = dead_letter_name(name);
                let dead_letter = match c.dead_letter {
                    Some(d) => {
                        let dlq_positions = parse_positions(path, d.positions, options, report)?;
                        MemoryAppend::restore(
                            &dlq_name,
                            shared.clone(),
                            true,
                            d.next,
                            d.floor,
                            dead_letter_records,
                            dlq_positions,
                        )
                    }
                    None => MemoryAppend::restore(
                        &dlq_name,
                        shared.clone(),
                        true,
                        1,
                        1,
                        Vec::new(),
                        Vec::new(),
                    ),
                };
                // Every item comes back available: no epoch, no holder,
                // no deadline, whatever the file holds, which
                // `MemoryQueue::restore` enforces for any caller.
                MemChannel::Queue(Arc::new(MemoryQueue::restore(
                    name,
                    shared,
                    Arc::new(dead_letter),
                    c.next,
                    c.floor,
                    items,
                )))
            }
        };
        let bytes = match &channel {
            MemChannel::Append(a) => crate::storage::contract::OffsetStore::bytes(&**a),
            MemChannel::Latest(l) => crate::storage::contract::OffsetStore::bytes(&**l),
            MemChannel::Queue(q) => crate::storage::contract::QueueStore::bytes(&**q),
        };
        if bytes != c.bytes {
            report.warnings.push(format!(
                "channel {name}: the file states {} bytes and its records count for {bytes}; the records' count is used",
                c.bytes
            ));
        }
        report.loaded.push(LoadedChannel {
            name: name.to_owned(),
            kind: c.kind,
            next: c.next,
            floor: c.floor,
            records,
            bytes,
            written_at: header.written_at,
            dropped_positions: report.dropped_positions - dropped_before,
        });
        Ok(Built { channel, holds })
    }

    fn restore_sessions(
        &self,
        dir: &Path,
        sessions_file: SessionsFile,
        log_file: BroadcastFile,
        stale: bool,
        options: &LoadOptions,
        report: &mut LoadReport,
    ) -> Result<(), LoadProblem> {
        // Built whole from the file's list (in client id order, as it is
        // written), not inserted one at a time: a search of the map for
        // each of 100,000 sessions took a quarter of loading them. Each
        // session is put behind the store's `Arc` as it is taken, so the
        // map is built of handles rather than of whole sessions.
        let mut kept: BTreeMap<String, Arc<SessionEntry>> = sessions_file
            .sessions
            .into_iter()
            .filter(|entry| {
                let expired = crate::storage::contract::session_expired_at(
                    entry,
                    options.now,
                    options.max_session_expiry,
                );
                report.dropped_sessions += u64::from(expired);
                !expired
            })
            .map(|entry| (entry.client_id.clone(), Arc::new(entry)))
            .collect();
        // A cursor whose session is not held is dropped at the start.
        let held: HashSet<&str> = kept.keys().map(String::as_str).collect();
        let cursors: Vec<(String, u64)> = log_file
            .cursors
            .into_iter()
            .filter_map(|p| {
                let client = p.reader.strip_prefix(READER_MQTT)?;
                held.contains(client).then(|| (client.to_owned(), p.offset))
            })
            .collect();
        drop(held);
        // An in-flight entry behind its session's cursor was acknowledged;
        // one a shared group handed over stays behind the group's cursor.
        // The cursors are looked up by client id only once a session with
        // any in flight needs one.
        let mut cursor_of: Option<HashMap<&str, u64>> = None;
        for (client, s) in kept.iter_mut().filter(|(_, s)| !s.inflight.is_empty()) {
            let cursor_of = cursor_of
                .get_or_insert_with(|| cursors.iter().map(|(c, o)| (c.as_str(), *o)).collect());
            if let Some(&cursor) = cursor_of.get(client.as_str()) {
                Arc::make_mut(s)
                    .inflight
                    .retain(|e| e.shared_group.is_some() || e.log_offset >= cursor);
            }
        }
        let groups = sessions_file
            .shared_groups
            .into_iter()
            .map(|g| ShareGroupEntry {
                key: ShareGroupKey {
                    group: g.key.group,
                    filter: g.key.filter,
                },
                cursor: g.cursor,
                returned: g.returned,
            })
            .collect();
        self.broadcast().restore(
            log_file.next,
            log_file.floor,
            log_file.messages,
            cursors,
            groups,
        );
        if stale {
            report.abandoned_holds += log_file.held.len() as u64;
        } else {
            for h in holds(BROADCAST_LOG_NAME, log_file.held) {
                self.held().restore(h);
            }
        }
        self.session_store().restore(kept).map_err(|e| LoadProblem {
            path: dir.join(SESSIONS_FILE),
            detail: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use saguin_format::channel_name::MANIFEST_FILE;
    use saguin_format::model::Record;

    use super::*;
    use crate::storage::contract::{now_nanos, HeldPublishStore, LatestStore, Provider};
    use crate::storage::generation::save_snapshot;
    use crate::storage::snapshot_write::SnapshotOptions;

    fn provider() -> Arc<MemoryProvider> {
        MemoryProvider::unbounded()
    }

    fn options(channels: &[(&str, ChannelKind)]) -> LoadOptions {
        LoadOptions {
            channels: channels.iter().map(|(n, k)| (n.to_string(), *k)).collect(),
            retained: false,
            sessions: false,
            now: now_nanos(),
            max_session_expiry: 3600,
            max_file_bytes: F21_DEFAULT_MAX_BYTES,
        }
    }

    #[test]
    fn the_file_limit_follows_the_bound_above_its_floor() {
        assert_eq!(LoadOptions::file_limit_for(None), F21_DEFAULT_MAX_BYTES);
        assert_eq!(LoadOptions::file_limit_for(Some(1 << 20)), FILE_LIMIT_FLOOR);
        assert_eq!(
            LoadOptions::file_limit_for(Some(256 << 20)),
            (256 * FILE_LIMIT_BOUND_FACTOR) << 20
        );
        assert_eq!(LoadOptions::file_limit_for(Some(u64::MAX)), u64::MAX);
    }

    /// A directory holding channels `a` (append, 3 records, one hold) and
    /// `b` (latest), written at moment `at`.
    fn written(dir: &Path, at: UnixNanos) {
        let p = provider();
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        for i in 0..3 {
            a.as_append()
                .unwrap()
                .append(Record::new("a", format!("{i}")))
                .unwrap();
        }
        p.open_channel("b", ChannelKind::Latest).unwrap();
        let mut rec = Record::new("a", "held");
        rec.qos = 2;
        p.held_publishes()
            .unwrap()
            .hold(HeldPublish {
                channel: "a".into(),
                client_id: "c".into(),
                packet_id: 7,
                held_at: 5,
                record: rec,
            })
            .unwrap();
        let report = save_snapshot(&p, dir, &SnapshotOptions::default(), at);
        assert!(report.is_complete(), "{:?}", report.failed);
    }

    /// The retained store's file is made into the store's values as it is
    /// decoded: each comes back whole, numbered afresh in the file's order
    /// (by topic), and the store goes on numbering after them.
    #[test]
    fn retained_values_come_back_whole_numbered_in_the_files_order() {
        use saguin_format::model::UserProperty;
        let d = tempfile::tempdir().unwrap();
        let p = provider();
        let with_properties = Record {
            client_id: "dev-2".into(),
            qos: 1,
            retain: true,
            user_properties: vec![UserProperty {
                name: "unit".into(),
                value: "C".into(),
            }],
            ..Record::new("site/b", "2")
        };
        for record in [
            Record::new("site/c", "3"),
            with_properties.clone(),
            Record::new("site/a", "1"),
        ] {
            p.retained_store().set(record).unwrap();
        }
        let write = SnapshotOptions {
            retained: true,
            ..SnapshotOptions::default()
        };
        let report = save_snapshot(&p, d.path(), &write, now_nanos());
        assert!(report.is_complete(), "{:?}", report.failed);

        let loaded = provider();
        let options = LoadOptions {
            retained: true,
            ..options(&[])
        };
        loaded.load_snapshot_dir(d.path(), &options).unwrap();
        let store = loaded.retained_store();
        let values = store.values().unwrap();
        let order: Vec<(&str, u64, &[u8])> = values
            .iter()
            .map(|r| (r.topic.as_str(), r.offset, r.payload.as_ref()))
            .collect();
        assert_eq!(
            order,
            [
                ("site/a", 1, &b"1"[..]),
                ("site/b", 2, &b"2"[..]),
                ("site/c", 3, &b"3"[..])
            ]
        );
        let b = &values[1];
        assert_eq!(
            (&b.client_id, b.qos, b.retain, &b.user_properties),
            (
                &with_properties.client_id,
                1,
                true,
                &with_properties.user_properties
            )
        );
        store.set(Record::new("site/d", "4")).unwrap();
        assert_eq!(store.get("site/d").unwrap().unwrap().offset, 4);
    }

    /// Every kind of channel comes back from records made compact as the
    /// file was decoded: an append channel's records, a latest channel's
    /// values and deletion markers, a queue's items and its dead-letter
    /// channel's records, each whole and at its offset.
    #[test]
    fn every_channel_comes_back_whole_from_records_made_compact_as_decoded() {
        use saguin_format::model::UserProperty;
        let d = tempfile::tempdir().unwrap();
        let p = provider();
        let with_properties = Record {
            client_id: "dev-2".into(),
            qos: 1,
            user_properties: vec![UserProperty {
                name: "unit".into(),
                value: "C".into(),
            }],
            ..Record::new("site/b", "2")
        };
        let log = p.open_channel("log", ChannelKind::Append).unwrap();
        let log = log.as_append().unwrap();
        log.append(Record::new("site/a", "1")).unwrap();
        log.append(with_properties.clone()).unwrap();
        let state = p.open_channel("state", ChannelKind::Latest).unwrap();
        let state = state.as_latest().unwrap();
        state.set(Record::new("site/a", "on")).unwrap();
        state.set(with_properties.clone()).unwrap();
        state.delete("site/a").unwrap();
        let jobs = p.open_channel("jobs", ChannelKind::Queue).unwrap();
        let jobs = jobs.as_queue().unwrap();
        jobs.enqueue(with_properties.clone()).unwrap();
        jobs.dead_letter()
            .append(Record::new("jobs", "spent"))
            .unwrap();
        let before = (
            log.read_from(1).unwrap(),
            state.rows_from_n("#", 1, 10).unwrap(),
            jobs.offer(10, now_nanos()).unwrap(),
            jobs.dead_letter().read_from(1).unwrap(),
        );
        assert_eq!(
            (
                before.0.len(),
                before.1 .1.len(),
                before.2.len(),
                before.3.len()
            ),
            (2, 2, 1, 1)
        );
        let bytes_before = p.bytes();
        assert!(save_snapshot(&p, d.path(), &SnapshotOptions::default(), 10).is_complete());

        let fresh = provider();
        let report = fresh
            .load_snapshot_dir(
                d.path(),
                &options(&[
                    ("log", ChannelKind::Append),
                    ("state", ChannelKind::Latest),
                    ("jobs", ChannelKind::Queue),
                ]),
            )
            .unwrap();
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        let counts: Vec<(&str, u64)> = report
            .loaded
            .iter()
            .map(|c| (c.name.as_str(), c.records))
            .collect();
        assert_eq!(counts, [("jobs", 1), ("log", 2), ("state", 2)]);
        assert_eq!(fresh.bytes(), bytes_before, "what is restored is charged");
        let log = fresh.open_channel("log", ChannelKind::Append).unwrap();
        let state = fresh.open_channel("state", ChannelKind::Latest).unwrap();
        let jobs = fresh.open_channel("jobs", ChannelKind::Queue).unwrap();
        let jobs = jobs.as_queue().unwrap();
        let after = (
            log.as_append().unwrap().read_from(1).unwrap(),
            state.as_latest().unwrap().rows_from_n("#", 1, 10).unwrap(),
            jobs.offer(10, now_nanos()).unwrap(),
            jobs.dead_letter().read_from(1).unwrap(),
        );
        assert_eq!(after, before);
    }

    /// What a refused file handed the sink is no file's: the next file's
    /// lists hold only its own records.
    #[test]
    fn a_refused_files_records_are_no_files() {
        let mut sink = StartSink::default();
        let mut kept = Vec::new();
        sink.record(RecordList::ChannelRecords, Record::new("a", "1"), &mut kept);
        sink.file_read("damaged.snapshot", false);
        sink.record(RecordList::ChannelRecords, Record::new("b", "2"), &mut kept);
        sink.record(
            RecordList::DeadLetterRecords,
            Record::new("b", "3"),
            &mut kept,
        );
        sink.file_read("b.snapshot", true);
        sink.record(
            RecordList::BroadcastMessages,
            Record::new("c", "4"),
            &mut kept,
        );
        sink.file_read("saguin.broadcast", true);
        sink.record(RecordList::Retained, Record::new("r/1", "5"), &mut kept);
        sink.file_read("saguin.retained", false);
        assert_eq!(sink.retained.len(), 0, "a refused retained file's values");
        for topic in ["r/1", "r/2"] {
            sink.record(RecordList::Retained, Record::new(topic, "6"), &mut kept);
        }
        sink.file_read("saguin.retained", true);
        assert_eq!(sink.retained.len(), 2);
        assert!(!sink.files.contains_key("damaged.snapshot"));
        let b = &sink.files["b.snapshot"];
        let topics: Vec<&str> = b
            .records
            .iter()
            .chain(&b.dead_letter)
            .map(|k| k.topic())
            .collect();
        assert_eq!(topics, ["b", "b"]);
        assert!(sink.files["saguin.broadcast"].records.is_empty());
        assert_eq!(kept.len(), 1, "the broadcast log's records stay whole");
    }

    /// Turns a directory of one generation into what a build before
    /// generations wrote: every file under its fixed name, and a
    /// shutdown's manifest (kind 2) of moment `began_at`.
    fn to_legacy(dir: &Path, began_at: UnixNanos) {
        use crate::storage::generation::read_committed;
        use crate::storage::snapshot_write::Store;
        use saguin_format::f21::{Manifest, ManifestEntry};
        let committed = read_committed(dir);
        let mut manifest = Manifest {
            began_at,
            channels: Vec::new(),
            retained: false,
            sessions: false,
            broadcast: false,
        };
        for (store, file) in committed.files.iter() {
            fs::rename(dir.join(&file.file_name), dir.join(store.base_name())).unwrap();
            match store {
                Store::Channel(name) => manifest.channels.push(ManifestEntry {
                    channel: name.clone(),
                    file_name: encode_file_name(name),
                    kind: ChannelKind::Append,
                }),
                Store::Retained => manifest.retained = true,
                Store::Sessions => manifest.sessions = true,
                Store::Broadcast => manifest.broadcast = true,
            }
        }
        fs::write(
            dir.join(MANIFEST_FILE),
            f21::encode(&SnapshotFile::Manifest(manifest), began_at),
        )
        .unwrap();
    }

    #[test]
    fn a_missing_directory_is_a_first_start() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider();
        let report = p
            .load_snapshot_dir(
                &dir.path().join("none"),
                &options(&[("a", ChannelKind::Append)]),
            )
            .unwrap();
        assert!(report.loaded.is_empty());
    }

    #[test]
    fn every_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 10);
        for name in ["a.1.snapshot", "b.1.snapshot"] {
            let path = dir.path().join(name);
            let mut bytes = fs::read(&path).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x40;
            fs::write(&path, bytes).unwrap();
        }
        let err = provider()
            .load_snapshot_dir(
                dir.path(),
                &options(&[("a", ChannelKind::Append), ("b", ChannelKind::Latest)]),
            )
            .unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("a.1.snapshot") && text.contains("b.1.snapshot"),
            "{text}"
        );
        assert!(text.contains("checksum"), "{text}");
    }

    #[test]
    fn a_kind_other_than_configured_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 10);
        let err = provider()
            .load_snapshot_dir(dir.path(), &options(&[("a", ChannelKind::Queue)]))
            .unwrap_err();
        assert!(err.to_string().contains("configured as queue"), "{err}");
    }

    #[test]
    fn a_file_of_another_channel_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 10);
        fs::copy(
            dir.path().join("a.1.snapshot"),
            dir.path().join("b.1.snapshot"),
        )
        .unwrap();
        let err = provider()
            .load_snapshot_dir(dir.path(), &options(&[("b", ChannelKind::Append)]))
            .unwrap_err();
        assert!(err.to_string().contains("holds channel \"a\""), "{err}");
    }

    #[test]
    fn a_file_left_behind_by_a_failed_write_loses_its_holds_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider();
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        let a = a.as_append().unwrap();
        for i in 0..3 {
            a.append(Record::new("a", format!("{i}"))).unwrap();
        }
        let mut rec = Record::new("a", "held");
        rec.qos = 2;
        p.held_publishes()
            .unwrap()
            .hold(HeldPublish {
                channel: "a".into(),
                client_id: "c".into(),
                packet_id: 7,
                held_at: 5,
                record: rec,
            })
            .unwrap();
        assert!(save_snapshot(&p, dir.path(), &SnapshotOptions::default(), 10).is_complete());
        // The next generation cannot write a's file: the hold is released
        // into a fourth record that no file holds.
        fs::create_dir(dir.path().join("a.2.snapshot.tmp")).unwrap();
        p.held_publishes().unwrap().release("a", "c", 7).unwrap();
        let report = save_snapshot(&p, dir.path(), &SnapshotOptions::default(), 20);
        assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
        assert_eq!(report.generation, Some(2));

        let p = provider();
        let report = p
            .load_snapshot_dir(dir.path(), &options(&[("a", ChannelKind::Append)]))
            .unwrap();
        // That generation's broker answered the release without the hold
        // being kept: counted, not restored.
        assert_eq!(report.abandoned_holds, 1);
        assert!(p.held().held().unwrap().is_empty());
        assert!(
            report
                .warnings
                .iter()
                .any(|w| w.contains("a.1.snapshot") && w.contains("is gone")),
            "{:?}",
            report.warnings
        );
        assert_eq!(report.leftover_temp_files, ["a.2.snapshot.tmp"]);
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        assert_eq!(a.as_append().unwrap().record_count(), 3);
        assert_eq!(p.bytes(), 3 * 2, "loaded records are charged");
    }

    #[test]
    fn a_file_older_than_a_shutdown_manifest_loses_its_holds_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 10);
        // A build before generations: a later shutdown whose channel write
        // for `a` never landed, so its manifest is newer than a's file.
        to_legacy(dir.path(), 20);
        fs::write(dir.path().join("a.snapshot.tmp"), b"half").unwrap();
        let p = provider();
        let report = p
            .load_snapshot_dir(dir.path(), &options(&[("a", ChannelKind::Append)]))
            .unwrap();
        assert_eq!(report.abandoned_holds, 1);
        assert!(p.held().held().unwrap().is_empty());
        assert!(
            report.warnings.iter().any(|w| w.contains("is gone")),
            "{:?}",
            report.warnings
        );
        assert_eq!(report.leftover_temp_files, ["a.snapshot.tmp"]);
        assert_eq!(report.ignored_files, ["b.snapshot"]);
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        assert_eq!(a.as_append().unwrap().record_count(), 3);
        assert_eq!(p.bytes(), 3 * 2, "loaded records are charged");
    }

    #[test]
    fn a_listed_file_that_is_gone_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 10);
        fs::remove_file(dir.path().join("b.1.snapshot")).unwrap();
        let report = provider()
            .load_snapshot_dir(
                dir.path(),
                &options(&[("a", ChannelKind::Append), ("b", ChannelKind::Latest)]),
            )
            .unwrap();
        assert!(
            report
                .warnings
                .iter()
                .any(|w| w.contains("records are gone")),
            "{:?}",
            report.warnings
        );
    }

    /// A session load keeps the sessions still alive, each cursor whose
    /// session is held, and each in-flight entry its cursor has not passed
    /// (or a shared group handed over), whatever else is in the file.
    #[test]
    fn a_session_load_keeps_what_is_alive_and_drops_what_was_acknowledged() {
        use crate::storage::contract::{InflightEntry, InflightPhase, ShareGroupKey};
        let dir = tempfile::tempdir().unwrap();
        let p = provider();
        let log = p.broadcast_log().unwrap();
        for i in 0..3 {
            log.append(Record::new("t", format!("{i}"))).unwrap();
        }
        let inflight = |log_offset: u64, packet_id: u16, shared: bool| InflightEntry {
            log_offset,
            packet_id,
            qos: 1,
            phase: InflightPhase::AwaitingAck,
            shared_group: shared.then(|| ShareGroupKey {
                group: "g".into(),
                filter: "t".into(),
            }),
        };
        let session =
            |client_id: &str, detached_at: i64, inflight: Vec<InflightEntry>| SessionEntry {
                client_id: client_id.into(),
                principal: None,
                expiry_interval: 60,
                detached_at,
                subscriptions: Vec::new(),
                will: None,
                window: 4,
                inflight,
            };
        let now = now_nanos();
        let sessions = p.sessions().unwrap();
        let behind = vec![
            inflight(1, 1, false),
            inflight(3, 2, false),
            inflight(2, 3, true),
        ];
        sessions.save(session("b-behind", now, behind)).unwrap();
        sessions
            .save(session("a-plain", now, vec![inflight(1, 1, false)]))
            .unwrap();
        sessions.save(session("c-expired", 1, Vec::new())).unwrap();
        log.save_cursor("b-behind", 3).unwrap();
        log.save_cursor("c-expired", 1).unwrap();
        log.save_cursor("gone", 1).unwrap();
        log.save_share_group(crate::storage::contract::ShareGroupEntry {
            key: ShareGroupKey {
                group: "g".into(),
                filter: "t".into(),
            },
            cursor: 3,
            returned: Vec::new(),
        })
        .unwrap();
        let written = SnapshotOptions {
            sessions: true,
            ..SnapshotOptions::default()
        };
        let report = save_snapshot(&p, dir.path(), &written, now);
        assert!(report.is_complete(), "{:?}", report.failed);

        let mut o = options(&[]);
        o.sessions = true;
        o.now = now;
        let loaded = provider();
        let report = loaded.load_snapshot_dir(dir.path(), &o).unwrap();
        assert_eq!(report.dropped_sessions, 1);
        let mut held = loaded.sessions().unwrap().sessions().unwrap();
        held.sort_by(|x, y| x.client_id.cmp(&y.client_id));
        let ids: Vec<&str> = held.iter().map(|s| s.client_id.as_str()).collect();
        assert_eq!(ids, ["a-plain", "b-behind"]);
        assert_eq!(held[0].inflight, [inflight(1, 1, false)], "no cursor: kept");
        assert_eq!(
            held[1].inflight,
            [inflight(3, 2, false), inflight(2, 3, true)],
            "behind its cursor: acknowledged, unless a group's"
        );
        assert_eq!(
            loaded.broadcast_log().unwrap().cursors().unwrap(),
            [("b-behind".to_string(), 3)]
        );
    }

    #[test]
    fn sessions_without_their_log_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider();
        let options_w = SnapshotOptions {
            sessions: true,
            ..SnapshotOptions::default()
        };
        assert!(save_snapshot(&p, dir.path(), &options_w, 10).is_complete());
        fs::remove_file(dir.path().join("saguin.1.broadcast")).unwrap();
        let mut o = options(&[]);
        o.sessions = true;
        let err = provider().load_snapshot_dir(dir.path(), &o).unwrap_err();
        assert!(
            err.to_string()
                .contains("the broadcast log its sessions point into is lost"),
            "{err}"
        );
    }

    #[test]
    fn a_kind_mismatch_is_named_beside_a_damaged_file() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 10);
        let path = dir.path().join("b.1.snapshot");
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let err = provider()
            .load_snapshot_dir(
                dir.path(),
                &options(&[("a", ChannelKind::Latest), ("b", ChannelKind::Latest)]),
            )
            .unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
        assert_eq!(err.problems[0].path, path);
        assert!(err.problems[0].detail.contains("checksum"), "{err}");
        assert_eq!(err.problems[1].path, dir.path().join("a.1.snapshot"));
        assert!(
            err.problems[1]
                .detail
                .contains("configured as latest but its file holds a append channel"),
            "{err}"
        );
    }

    #[test]
    fn queue_items_come_back_available_and_expired_positions_go() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider();
        let q = p.open_channel("jobs", ChannelKind::Queue).unwrap();
        let q = q.as_queue().unwrap();
        q.enqueue(Record::new("jobs", "one")).unwrap();
        q.enqueue(Record::new("jobs", "two")).unwrap();
        let far = now_nanos() + 3_600_000_000_000;
        q.lease(1, "worker-1", far, 5).unwrap();
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        let a = a.as_append().unwrap();
        a.append(Record::new("a", "x")).unwrap();
        for (client, expiry) in [("gone", 0), ("kept", 3600)] {
            a.save_position(Position {
                reader: Reader::mqtt(client).unwrap(),
                offset: 1,
                saved_at: now_nanos(),
                session_expiry: Some(expiry),
            })
            .unwrap();
        }
        let bytes_before = p.bytes();
        assert!(save_snapshot(&p, dir.path(), &SnapshotOptions::default(), 10).is_complete());

        let fresh = provider();
        let report = fresh
            .load_snapshot_dir(
                dir.path(),
                &options(&[("jobs", ChannelKind::Queue), ("a", ChannelKind::Append)]),
            )
            .unwrap();
        assert_eq!(report.dropped_positions, 1);
        let dropped: Vec<(&str, u64)> = report
            .loaded
            .iter()
            .map(|c| (c.name.as_str(), c.dropped_positions))
            .collect();
        assert_eq!(dropped, [("a", 1), ("jobs", 0)], "counted per channel");
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        assert_eq!(fresh.bytes(), bytes_before, "what is restored is charged");
        let q = fresh.open_channel("jobs", ChannelKind::Queue).unwrap();
        let q = q.as_queue().unwrap();
        // The leased item has no holder now: both are offered at once, the
        // first with its attempt counted.
        let offered = q.offer(10, now_nanos()).unwrap();
        assert_eq!(offered.len(), 2, "{offered:?}");
        assert_eq!(offered[0].attempts, 1);
        let lease = q.lease(1, "worker-2", far, now_nanos()).unwrap();
        assert_eq!(lease.attempts, 2);
        let a = fresh.open_channel("a", ChannelKind::Append).unwrap();
        let readers: Vec<String> = a
            .as_append()
            .unwrap()
            .positions()
            .unwrap()
            .into_iter()
            .map(|p| p.reader.to_string())
            .collect();
        assert_eq!(readers, ["mqtt:kept"]);
    }

    #[test]
    fn a_store_kept_elsewhere_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 10);
        to_legacy(dir.path(), 10);
        fs::write(dir.path().join(SESSIONS_FILE), b"junk").unwrap();
        fs::write(dir.path().join(RETAINED_FILE), b"junk").unwrap();
        let report = provider()
            .load_snapshot_dir(dir.path(), &options(&[("a", ChannelKind::Append)]))
            .unwrap();
        assert_eq!(
            report.ignored_files,
            [RETAINED_FILE, "b.snapshot", SESSIONS_FILE]
        );
        let mut o = options(&[("a", ChannelKind::Append)]);
        o.sessions = true;
        let err = provider().load_snapshot_dir(dir.path(), &o).unwrap_err();
        // The damaged file, and the log it has lost (there is none here).
        assert_eq!(err.problems.len(), 2, "{err}");
        assert_eq!(err.problems[0].path, dir.path().join(SESSIONS_FILE));
        assert!(err.problems[1].detail.contains("has no saguin.broadcast"));
    }

    #[test]
    fn a_directory_that_is_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("snapshots");
        fs::write(&file, b"x").unwrap();
        let err = provider()
            .load_snapshot_dir(&file, &options(&[]))
            .unwrap_err();
        assert_eq!(err.problems[0].path, file);
        assert!(
            err.problems[0].detail.contains("not a snapshot directory"),
            "{err}"
        );
    }
}
