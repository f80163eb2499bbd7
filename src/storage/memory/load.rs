//! Loading a snapshot directory into a memory provider at startup (RFC 0004
//! "Loading").
//!
//! A channel file that is damaged, truncated, of another format, of another
//! channel or of another kind than the configuration names is fatal, and
//! every such file is named, not only the first: an empty start is
//! indistinguishable from a fresh install and destroys the evidence. The
//! manifest's own findings are warnings - it holds no records. What decoding
//! cannot know is decided here, where the stores are rebuilt: queue items
//! come back available with no holder, holds in a file the last shutdown did
//! not rewrite are counted as abandoned, and positions whose session expired
//! while the broker was down are dropped.
//!
//! This reads the directory with the format 21 decoder directly; the
//! directory scanner of `storage::snapshot_dir` reports on a directory for
//! the operator's commands, and `tests/snapshot_loader_agreement.rs` holds
//! the two to one verdict on every kind of damage ("verify says OK, serve
//! refuses" must not happen).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use saguin_format::channel_name::{
    encode_file_name, BROADCAST_FILE, LOCK_FILE, MANIFEST_FILE, RETAINED_FILE, SESSIONS_FILE,
    TEMP_SUFFIX,
};
use saguin_format::f21::{self, FileKind, Header, Manifest, SnapshotFile};
use saguin_format::model::{ChannelKind, Record, UnixNanos};

use super::{MemChannel, MemoryAppend, MemoryLatest, MemoryProvider, MemoryQueue};
use crate::storage::contract::{
    dead_letter_name, format_time, HeldPublish, InflightEntry, InflightPhase, Position, Reader,
    SessionEntry, SessionStore, ShareGroupEntry, ShareGroupKey, SubscriptionEntry, WillEntry,
    BROADCAST_LOG_NAME,
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
}

/// What a load did, for the startup log.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub loaded: Vec<LoadedChannel>,
    /// The manifest's findings and anything else the operator should read.
    pub warnings: Vec<String>,
    /// Positions dropped because their session expired while down.
    pub dropped_positions: u64,
    /// Exactly-once holds in files the last shutdown did not rewrite.
    pub abandoned_holds: u64,
    /// Sessions that expired while the broker was down.
    pub dropped_sessions: u64,
    /// Snapshot files no configured channel asked for.
    pub ignored_files: Vec<String>,
    /// Temporary files of writes that never finished.
    pub leftover_temp_files: Vec<String>,
    /// The manifest's moment, when one was read.
    pub manifest_began_at: Option<UnixNanos>,
}

/// One file that stops the start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadProblem {
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

/// A decoded file with where it came from.
struct Read {
    path: PathBuf,
    header: Header,
    file: SnapshotFile,
}

fn read_file(path: &Path, expected: FileKind) -> Result<Option<Read>, LoadProblem> {
    let problem = |detail: String| LoadProblem {
        path: path.to_path_buf(),
        detail,
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(problem(format!("cannot be examined: {e}"))),
    };
    if !meta.file_type().is_file() {
        return Err(problem(
            "is not a regular file (a symlink, directory or device is never loaded)".into(),
        ));
    }
    let bytes = fs::read(path).map_err(|e| problem(format!("cannot be read: {e}")))?;
    let (header, file) = f21::decode_bytes(bytes.into()).map_err(|e| problem(e.to_string()))?;
    if file.kind() != expected {
        return Err(problem(format!(
            "is a {} file where a {} file belongs",
            file.kind(),
            expected
        )));
    }
    Ok(Some(Read {
        path: path.to_path_buf(),
        header,
        file,
    }))
}

/// How a file's stamp compares with the manifest's moment.
fn staleness(
    report: &mut LoadReport,
    began_at: Option<UnixNanos>,
    what: &str,
    written_at: UnixNanos,
) -> bool {
    let Some(began) = began_at else {
        return false;
    };
    if written_at < began {
        report.warnings.push(format!(
            "{what}: written at {}, before the last shutdown began at {}: everything published to it after {} is gone",
            format_time(written_at),
            format_time(began),
            format_time(written_at)
        ));
        return true;
    }
    if written_at > began {
        report.warnings.push(format!(
            "{what}: written at {}, after the manifest's moment {}: the channels of a later shutdown finished and its manifest did not",
            format_time(written_at),
            format_time(began)
        ));
    }
    false
}

fn parse_positions(
    path: &Path,
    positions: Vec<f21::Position>,
    options: &LoadOptions,
    report: &mut LoadReport,
    problems: &mut Vec<LoadProblem>,
) -> Vec<Position> {
    let mut out = Vec::with_capacity(positions.len());
    for p in positions {
        let reader = match Reader::parse(&p.reader) {
            Ok(r) => r,
            Err(e) => {
                problems.push(LoadProblem {
                    path: path.to_path_buf(),
                    detail: e.to_string(),
                });
                continue;
            }
        };
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
    out
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

impl MemoryProvider {
    /// Loads `dir` into this provider, which must hold no channel yet. A
    /// missing directory is a first start and loads nothing. Refused - with
    /// every file named - when any file asked for cannot be loaded.
    pub fn load_snapshot_dir(
        self: &Arc<Self>,
        dir: &Path,
        options: &LoadOptions,
    ) -> Result<LoadReport, LoadError> {
        let mut report = LoadReport::default();
        let mut problems = Vec::new();
        let fail = |problems: Vec<LoadProblem>| LoadError {
            dir: dir.to_path_buf(),
            problems,
        };
        let listing = match fs::read_dir(dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
            Err(e) => {
                return Err(fail(vec![LoadProblem {
                    path: dir.to_path_buf(),
                    detail: format!("cannot be listed: {e}"),
                }]))
            }
        };
        let mut present = BTreeSet::new();
        for entry in listing {
            match entry {
                Ok(e) => {
                    present.insert(e.file_name().to_string_lossy().into_owned());
                }
                Err(e) => problems.push(LoadProblem {
                    path: dir.to_path_buf(),
                    detail: format!("cannot be listed: {e}"),
                }),
            }
        }

        // The manifest: its failures are warnings.
        let manifest: Option<Manifest> = match read_file(
            &dir.join(MANIFEST_FILE),
            FileKind::Manifest,
        ) {
            Ok(Some(Read {
                file: SnapshotFile::Manifest(m),
                ..
            })) => Some(m),
            Ok(_) => {
                if present.iter().any(|f| f.ends_with(".snapshot")) {
                    report.warnings.push(format!(
                        "{}: no manifest beside the channel files: whether the last shutdown finished cannot be told",
                        dir.join(MANIFEST_FILE).display()
                    ));
                }
                None
            }
            Err(p) => {
                report.warnings.push(format!(
                    "{p}; whether the last shutdown finished cannot be told"
                ));
                None
            }
        };
        let began_at = manifest.as_ref().map(|m| m.began_at);
        report.manifest_began_at = began_at;
        let listed: BTreeMap<&str, ChannelKind> = manifest
            .as_ref()
            .map(|m| {
                m.channels
                    .iter()
                    .map(|e| (e.channel.as_str(), e.kind))
                    .collect()
            })
            .unwrap_or_default();

        let mut wanted_files = BTreeSet::new();
        let mut built: Vec<(String, MemChannel)> = Vec::new();
        let mut restored_holds: Vec<HeldPublish> = Vec::new();
        for (name, kind) in &options.channels {
            let file_name = encode_file_name(name);
            wanted_files.insert(file_name.clone());
            let path = dir.join(&file_name);
            let read = match read_file(&path, FileKind::Channel) {
                Ok(Some(r)) => r,
                Ok(None) => {
                    if listed.contains_key(name.as_str()) {
                        report.warnings.push(format!(
                            "channel {name}: {} was listed by the last shutdown's manifest and is not there: that channel's records are gone",
                            path.display()
                        ));
                    }
                    continue;
                }
                Err(p) => {
                    problems.push(p);
                    continue;
                }
            };
            let Read {
                path,
                header,
                file: SnapshotFile::Channel(c),
            } = read
            else {
                continue;
            };
            if &c.name != name {
                problems.push(LoadProblem {
                    path,
                    detail: format!("holds channel {:?}, not {name:?}", c.name),
                });
                continue;
            }
            if c.kind != *kind {
                problems.push(LoadProblem {
                    path,
                    detail: format!(
                        "channel {name} is configured as {kind} but its file holds a {} channel; it is not loaded into the wrong shape",
                        c.kind
                    ),
                });
                continue;
            }
            let stale = staleness(
                &mut report,
                began_at,
                &format!("channel {name}"),
                header.written_at,
            );
            if stale {
                // That shutdown's broker answered these releases without
                // them: counted, not restored.
                report.abandoned_holds += c.held.len() as u64;
            } else {
                restored_holds.extend(holds(name, c.held));
            }
            let positions =
                parse_positions(&path, c.positions, options, &mut report, &mut problems);
            let shared = self.shared().clone();
            let records = match c.kind {
                ChannelKind::Queue => c.items.len() as u64,
                _ => c.records.len() as u64,
            };
            let channel = match c.kind {
                ChannelKind::Append => MemChannel::Append(Arc::new(MemoryAppend::restore(
                    name, shared, false, c.next, c.floor, c.records, positions,
                ))),
                ChannelKind::Latest => {
                    match MemoryLatest::restore(name, shared, c.next, c.floor, c.records, positions)
                    {
                        Ok(l) => MemChannel::Latest(Arc::new(l)),
                        Err(e) => {
                            problems.push(LoadProblem {
                                path,
                                detail: e.to_string(),
                            });
                            continue;
                        }
                    }
                }
                ChannelKind::Queue => {
                    let dlq_name = dead_letter_name(name);
                    let dead_letter = match c.dead_letter {
                        Some(d) => {
                            let dlq_positions = parse_positions(
                                &path,
                                d.positions,
                                options,
                                &mut report,
                                &mut problems,
                            );
                            MemoryAppend::restore(
                                &dlq_name,
                                shared.clone(),
                                true,
                                d.next,
                                d.floor,
                                d.records,
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
                    let items = c
                        .items
                        .into_iter()
                        .map(|i| crate::storage::contract::QueueItem {
                            record: i.record,
                            attempts: i.attempts,
                            first_delivered: i.first_delivered,
                            last_delivered: i.last_delivered,
                        })
                        .collect();
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
                MemChannel::Append(a) => crate::storage::contract::AppendStore::bytes(&**a),
                MemChannel::Latest(l) => crate::storage::contract::LatestStore::bytes(&**l),
                MemChannel::Queue(q) => crate::storage::contract::QueueStore::bytes(&**q),
            };
            if bytes != c.bytes {
                report.warnings.push(format!(
                    "channel {name}: the file states {} bytes and its records count for {bytes}; the records' count is used",
                    c.bytes
                ));
            }
            report.loaded.push(LoadedChannel {
                name: name.clone(),
                kind: *kind,
                next: c.next,
                floor: c.floor,
                records,
                bytes,
                written_at: header.written_at,
            });
            built.push((name.clone(), channel));
        }

        // The retained store.
        if options.retained {
            wanted_files.insert(RETAINED_FILE.to_owned());
            match read_file(&dir.join(RETAINED_FILE), FileKind::Retained) {
                Ok(Some(Read {
                    file: SnapshotFile::Retained(r),
                    header,
                    path,
                })) => {
                    staleness(&mut report, began_at, "retained store", header.written_at);
                    // The retained store's offsets only order its values;
                    // they are numbered afresh in the file's order.
                    let records: Vec<Record> = r
                        .records
                        .into_iter()
                        .enumerate()
                        .map(|(i, rec)| Record {
                            offset: i as u64 + 1,
                            ..rec
                        })
                        .collect();
                    let next = records.len() as u64 + 1;
                    if let Err(e) = self.retained_store().fill(next, 1, records) {
                        problems.push(LoadProblem {
                            path,
                            detail: e.to_string(),
                        });
                    }
                }
                Ok(_) => {
                    if manifest.as_ref().is_some_and(|m| m.retained) {
                        report.warnings.push(format!(
                            "retained store: {} was written by the last shutdown and is not there: the retained messages are gone",
                            dir.join(RETAINED_FILE).display()
                        ));
                    }
                }
                Err(p) => problems.push(p),
            }
        }

        // Sessions and the broadcast log, read together or not at all.
        if options.sessions {
            wanted_files.insert(SESSIONS_FILE.to_owned());
            wanted_files.insert(BROADCAST_FILE.to_owned());
            let sessions = read_file(&dir.join(SESSIONS_FILE), FileKind::Sessions);
            let log = read_file(&dir.join(BROADCAST_FILE), FileKind::Broadcast);
            match (sessions, log) {
                (Err(a), Err(b)) => {
                    problems.push(a);
                    problems.push(b);
                }
                (Err(p), _) | (_, Err(p)) => problems.push(p),
                (Ok(Some(_)), Ok(None)) => problems.push(LoadProblem {
                    path: dir.join(BROADCAST_FILE),
                    detail: format!(
                        "is missing beside {SESSIONS_FILE}: the sessions have lost the log they point into"
                    ),
                }),
                (Ok(sessions), Ok(Some(log))) => {
                    if let Err(p) =
                        self.restore_sessions(sessions, log, began_at, options, &mut report)
                    {
                        problems.push(p);
                    }
                }
                (Ok(None), Ok(None)) => {}
            }
        }

        for f in &present {
            if f.ends_with(TEMP_SUFFIX) {
                report.leftover_temp_files.push(f.clone());
            } else if f != MANIFEST_FILE && f != LOCK_FILE && !wanted_files.contains(f) {
                report.ignored_files.push(f.clone());
            }
        }
        if !report.leftover_temp_files.is_empty() {
            report.warnings.push(format!(
                "{}: temporary files of writes that never finished: {}",
                dir.display(),
                report.leftover_temp_files.join(", ")
            ));
        }

        if !problems.is_empty() {
            return Err(fail(problems));
        }
        for (name, channel) in built {
            if let Err(e) = self.install(&name, channel) {
                problems.push(LoadProblem {
                    path: dir.join(encode_file_name(&name)),
                    detail: e.to_string(),
                });
            }
        }
        for h in restored_holds {
            self.held().restore(h);
        }
        if !problems.is_empty() {
            return Err(fail(problems));
        }
        Ok(report)
    }

    fn restore_sessions(
        &self,
        sessions: Option<Read>,
        log: Read,
        began_at: Option<UnixNanos>,
        options: &LoadOptions,
        report: &mut LoadReport,
    ) -> Result<(), LoadProblem> {
        let SnapshotFile::Broadcast(log_file) = log.file else {
            return Ok(());
        };
        let (sessions_file, sessions_path) = match sessions {
            Some(Read {
                file: SnapshotFile::Sessions(s),
                path,
                ..
            }) => (s, path),
            _ => (f21::SessionsFile::default(), log.path.clone()),
        };
        f21::validate_pair(&sessions_file, &log_file).map_err(|e| LoadProblem {
            path: sessions_path.clone(),
            detail: format!("does not agree with {BROADCAST_FILE}: {e}"),
        })?;
        let stale = staleness(report, began_at, "broadcast log", log.header.written_at);
        let mut kept: BTreeMap<String, SessionEntry> = BTreeMap::new();
        for s in sessions_file.sessions {
            let entry = session_entry(s);
            if entry.expired_at(options.now, options.max_session_expiry) {
                report.dropped_sessions += 1;
                continue;
            }
            kept.insert(entry.client_id.clone(), entry);
        }
        // A cursor whose session is not held is dropped at the start.
        let cursors: Vec<(String, u64)> = log_file
            .cursors
            .into_iter()
            .filter_map(|p| {
                let client = p.reader.strip_prefix("mqtt:")?.to_owned();
                kept.contains_key(&client).then_some((client, p.offset))
            })
            .collect();
        // An in-flight entry behind its session's cursor was acknowledged;
        // one a shared group handed over stays behind the group's cursor.
        for (client, cursor) in &cursors {
            if let Some(s) = kept.get_mut(client) {
                s.inflight
                    .retain(|e| e.shared_group.is_some() || e.log_offset >= *cursor);
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
        for s in kept.into_values() {
            self.session_store().save(s).map_err(|e| LoadProblem {
                path: sessions_path.clone(),
                detail: e.to_string(),
            })?;
        }
        Ok(())
    }
}

fn session_entry(s: f21::Session) -> SessionEntry {
    SessionEntry {
        client_id: s.client_id,
        principal: s.principal,
        expiry_interval: s.expiry_interval,
        detached_at: s.detached_at,
        subscriptions: s
            .subscriptions
            .into_iter()
            .map(|x| SubscriptionEntry {
                filter: x.filter,
                qos: x.qos,
                no_local: x.no_local,
                retain_as_published: x.retain_as_published,
                retain_handling: x.retain_handling,
                subscription_id: x.subscription_id,
                log_offset: x.log_offset,
            })
            .collect(),
        will: s.will.map(|w| WillEntry {
            topic: w.topic,
            payload: w.payload,
            qos: w.qos,
            retain: w.retain,
            delay_interval: w.delay_interval,
            props: w.props,
            user_properties: w.user_properties,
        }),
        window: s.window,
        inflight: s
            .inflight
            .into_iter()
            .map(|i| InflightEntry {
                log_offset: i.log_offset,
                packet_id: i.packet_id,
                qos: i.qos,
                phase: match i.phase {
                    f21::InflightPhase::AwaitingAck => InflightPhase::AwaitingAck,
                    f21::InflightPhase::AwaitingComp => InflightPhase::AwaitingComp,
                },
                shared_group: i.shared_group.map(|k| ShareGroupKey {
                    group: k.group,
                    filter: k.filter,
                }),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::contract::{now_nanos, HeldPublishStore, Provider};
    use crate::storage::memory::MemoryConfig;
    use crate::storage::snapshot_write::{save_snapshot, SnapshotOptions};

    fn provider() -> Arc<MemoryProvider> {
        MemoryProvider::new(MemoryConfig {
            name: "mem".into(),
            max_bytes: None,
            reserve: 0,
        })
        .unwrap()
    }

    fn options(channels: &[(&str, ChannelKind)]) -> LoadOptions {
        LoadOptions {
            channels: channels.iter().map(|(n, k)| (n.to_string(), *k)).collect(),
            retained: false,
            sessions: false,
            now: now_nanos(),
            max_session_expiry: 3600,
        }
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
        for name in ["a.snapshot", "b.snapshot"] {
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
            text.contains("a.snapshot") && text.contains("b.snapshot"),
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
        fs::copy(dir.path().join("a.snapshot"), dir.path().join("c.snapshot")).unwrap();
        let err = provider()
            .load_snapshot_dir(dir.path(), &options(&[("c", ChannelKind::Append)]))
            .unwrap_err();
        assert!(err.to_string().contains("holds channel \"a\""), "{err}");
    }

    #[test]
    fn a_file_older_than_the_manifest_loses_its_holds_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 10);
        // A later shutdown whose channel write for `a` never landed: the
        // manifest is newer than a's file.
        let later = tempfile::tempdir().unwrap();
        written(later.path(), 20);
        fs::copy(
            later.path().join(MANIFEST_FILE),
            dir.path().join(MANIFEST_FILE),
        )
        .unwrap();
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
        fs::remove_file(dir.path().join("b.snapshot")).unwrap();
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

    #[test]
    fn sessions_without_their_log_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider();
        let options_w = SnapshotOptions {
            sessions: true,
            ..SnapshotOptions::default()
        };
        assert!(save_snapshot(&p, dir.path(), &options_w, 10).is_complete());
        fs::remove_file(dir.path().join(BROADCAST_FILE)).unwrap();
        let mut o = options(&[]);
        o.sessions = true;
        let err = provider().load_snapshot_dir(dir.path(), &o).unwrap_err();
        assert!(err.to_string().contains("lost the log"), "{err}");
    }
}
