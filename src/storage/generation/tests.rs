use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use saguin_format::channel_name::{
    encode_file_name, spare_file_name, MANIFEST_FILE, SESSIONS_FILE,
};
use saguin_format::f21::{Manifest, ManifestEntry};
use saguin_format::model::{ChannelKind, Record};

use super::*;
use crate::storage::contract::{Provider, SessionEntry, SessionStore};
use crate::storage::names_in as names;
use crate::storage::snapshot_dir::{self, FindingKind, ScanOptions};
use crate::storage::snapshot_write::Unobserved;

fn provider() -> Arc<MemoryProvider> {
    MemoryProvider::unbounded()
}

fn append(p: &MemoryProvider, channel: &str, payload: &str) {
    p.open_channel(channel, ChannelKind::Append)
        .unwrap()
        .as_append()
        .unwrap()
        .append(Record::new(channel, payload.to_owned()))
        .unwrap();
}

/// The generations of a directory with none yet, keeping spares or not
/// whatever its file system.
fn fresh(dir: &Path, p: &MemoryProvider, spares: bool) -> Generations {
    Generations::new(dir, SnapshotOptions::default(), Committed::default(), p)
        .keeping_spares(spares)
}

/// Captures and writes the next generation, as the broker does.
fn generation(g: &mut Generations, p: &MemoryProvider, at: i64) -> Option<Outcome> {
    let job = g.capture(p, at)?;
    Some(g.write(job, &Unobserved))
}

fn codes(dir: &Path) -> Vec<&'static str> {
    snapshot_dir::scan_checking(dir, &ScanOptions::default())
        .unwrap()
        .findings
        .iter()
        .map(FindingKind::code)
        .collect()
}

#[test]
fn a_generation_writes_only_the_stores_that_changed_and_lists_the_rest() {
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    append(&p, "a", "1");
    append(&p, "b", "1");
    let mut g = fresh(d.path(), &p, false);
    let first = generation(&mut g, &p, 10).expect("two new stores");
    assert_eq!(first.committed.as_ref().unwrap().generation, 1);
    assert_eq!(
        names(d.path()),
        ["a.1.snapshot", "b.1.snapshot", MANIFEST_FILE]
    );
    assert!(generation(&mut g, &p, 11).is_none(), "nothing changed");

    append(&p, "a", "2");
    let second = generation(&mut g, &p, 20).expect("a changed");
    let written: Vec<&str> = second
        .report
        .written
        .iter()
        .map(|w| w.file_name.as_str())
        .collect();
    assert_eq!(written, ["a.2.snapshot", MANIFEST_FILE]);
    // The file a's new one replaced is gone; b's stays, listed as it was.
    assert_eq!(
        names(d.path()),
        ["a.2.snapshot", "b.1.snapshot", MANIFEST_FILE]
    );
    let committed = read_committed(d.path());
    assert_eq!(committed.generation, 2);
    assert_eq!(committed.captured_at, 20);
    let listed: Vec<(&str, u64, i64)> = committed
        .files
        .values()
        .map(|f| (f.file_name.as_str(), f.generation, f.written_at))
        .collect();
    assert_eq!(listed, [("a.2.snapshot", 2, 20), ("b.1.snapshot", 1, 10)]);
    assert!(codes(d.path()).is_empty(), "{:?}", codes(d.path()));

    // What a restart loads is the second generation: a with both records.
    let loaded = snapshot_dir::load(d.path(), &ScanOptions::default()).unwrap();
    assert_eq!(loaded.channels["a"].file.records.len(), 2);
    assert_eq!(loaded.channels["b"].file.records.len(), 1);
}

#[test]
fn a_manifest_that_cannot_be_written_leaves_the_previous_generation_whole() {
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    append(&p, "a", "1");
    let mut g = fresh(d.path(), &p, false);
    generation(&mut g, &p, 10).unwrap();
    let before = names(d.path());
    append(&p, "a", "2");
    // A directory squatting on the manifest's temporary name: its write
    // fails after a's new file was written.
    fs::create_dir(d.path().join(temp_file_name(MANIFEST_FILE))).unwrap();
    let failed = generation(&mut g, &p, 20).unwrap();
    assert!(failed.committed.is_none());
    assert!(failed
        .report
        .failed
        .iter()
        .any(|f| f.file_name == MANIFEST_FILE));
    // The new file went with it: the directory is the first generation.
    let mut after = names(d.path());
    after.retain(|n| !n.ends_with(".tmp"));
    assert_eq!(after, before);
    assert_eq!(g.committed().generation, 1);
    assert!(g.has_changes(&p), "a is written again at the next attempt");

    fs::remove_dir(d.path().join(temp_file_name(MANIFEST_FILE))).unwrap();
    let retried = generation(&mut g, &p, 30).unwrap();
    let committed = retried.committed.unwrap();
    // Numbered past the attempt that did not land.
    assert_eq!(committed.generation, 3);
    assert_eq!(committed.files[&Store::Channel("a".into())].written_at, 30);
    assert!(codes(d.path()).is_empty(), "{:?}", codes(d.path()));
}

#[test]
fn a_copy_that_mixes_two_generations_is_refused_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    append(&p, "a", "1");
    append(&p, "b", "1");
    let mut g = fresh(d.path(), &p, false);
    generation(&mut g, &p, 10).unwrap();
    let first = tempfile::tempdir().unwrap();
    for name in names(d.path()) {
        fs::copy(d.path().join(&name), first.path().join(&name)).unwrap();
    }
    append(&p, "a", "2");
    generation(&mut g, &p, 20).unwrap();

    // The second generation's manifest with the first's files: what a copy
    // that read the manifest after the others were copied holds.
    let mixed = tempfile::tempdir().unwrap();
    for name in names(first.path()) {
        fs::copy(first.path().join(&name), mixed.path().join(&name)).unwrap();
    }
    fs::copy(
        d.path().join(MANIFEST_FILE),
        mixed.path().join(MANIFEST_FILE),
    )
    .unwrap();
    let report = snapshot_dir::scan_checking(mixed.path(), &ScanOptions::default()).unwrap();
    let failures: Vec<String> = report
        .verification_failures()
        .map(|f| f.to_string())
        .collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].starts_with("a.2.snapshot: listed by the manifest and not there"));

    // A file under the listed name that is not the listed file (another
    // broker's generation 2, say) is refused too, naming it.
    let other = provider();
    append(&other, "a", "elsewhere");
    append(&other, "a", "and again");
    let foreign = tempfile::tempdir().unwrap();
    let mut og = fresh(foreign.path(), &other, false);
    generation(&mut og, &other, 15).unwrap();
    append(&other, "a", "third");
    generation(&mut og, &other, 25).unwrap();
    fs::copy(
        foreign.path().join("a.2.snapshot"),
        mixed.path().join("a.2.snapshot"),
    )
    .unwrap();
    let report = snapshot_dir::scan_checking(mixed.path(), &ScanOptions::default()).unwrap();
    let failures: Vec<String> = report
        .verification_failures()
        .map(|f| f.to_string())
        .collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].starts_with("a.2.snapshot: not the file the manifest's generation lists"),
        "{failures:?}"
    );
    assert!(!report.is_loadable());

    // So is a listed file emptied, or holding another generation's bytes
    // cut short, under the copy (a file replaced and reused as a spare
    // while it was read), though it cannot be read at all.
    let listed = fs::read(d.path().join("a.2.snapshot")).unwrap();
    let reused = fs::read(foreign.path().join("a.2.snapshot")).unwrap();
    let failure = |bytes: &[u8]| {
        fs::write(mixed.path().join("a.2.snapshot"), bytes).unwrap();
        let report = snapshot_dir::scan_checking(mixed.path(), &ScanOptions::default()).unwrap();
        let failures: Vec<String> = report
            .verification_failures()
            .map(|f| f.to_string())
            .collect();
        assert_eq!(failures.len(), 1, "{failures:?}");
        failures[0].clone()
    };
    for torn in [&listed[..0], &reused[..reused.len() / 2]] {
        let said = failure(torn);
        assert!(
            said.starts_with("a.2.snapshot: not the file the manifest's generation lists"),
            "{said}"
        );
    }
    // The listed file cut short, or of the listed length and checksum
    // and unreadable, is damaged, and said to be.
    let said = failure(&listed[..listed.len() / 2]);
    assert!(!said.contains("not the file the manifest"), "{said}");
    let mut damaged = listed.clone();
    damaged[listed.len() / 2] ^= 0xff;
    let said = failure(&damaged);
    assert!(said.contains("checksum mismatch"), "{said}");
    assert!(!said.contains("not the file the manifest"), "{said}");
}

#[test]
fn tidying_removes_only_what_no_generation_will_read() {
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    append(&p, "a", "1");
    let mut g = fresh(d.path(), &p, false);
    generation(&mut g, &p, 10).unwrap();
    for leftover in [
        "a.2.snapshot",        // a generation that never committed
        "a.2.snapshot.tmp",    // and its file cut short
        "saguin.manifest.tmp", // its commit cut short
        "saguin.3.sessions",   // another store's uncommitted file
    ] {
        fs::write(d.path().join(leftover), b"x").unwrap();
    }
    for kept in [
        "b.snapshot",     // a fixed name: a build before generations wrote it
        "b.snapshot.tmp", // its write cut short: reported, not ours to judge
        "notes.txt",
        "saguin.lock",
    ] {
        fs::write(d.path().join(kept), b"x").unwrap();
    }
    let removed = tidy(d.path(), &read_committed(d.path()));
    assert_eq!(
        removed,
        [
            "a.2.snapshot",
            "a.2.snapshot.tmp",
            "saguin.3.sessions",
            "saguin.manifest.tmp"
        ]
    );
    assert_eq!(
        names(d.path()),
        [
            "a.1.snapshot",
            "b.snapshot",
            "b.snapshot.tmp",
            "notes.txt",
            "saguin.lock",
            MANIFEST_FILE
        ]
    );
}

#[test]
fn a_directory_a_build_before_generations_wrote_is_carried_on_store_by_store() {
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    append(&p, "a", "1");
    append(&p, "b", "1");
    let session = SessionEntry {
        client_id: "c".into(),
        principal: None,
        expiry_interval: 60,
        detached_at: 0,
        subscriptions: Vec::new(),
        will: None,
        window: 10,
        inflight: Vec::new(),
    };
    p.session_store().save(session).unwrap();
    let options = SnapshotOptions {
        sessions: true,
        ..SnapshotOptions::default()
    };
    // Fixed names and a shutdown's manifest (kind 2).
    let mut g =
        Generations::new(d.path(), options.clone(), Committed::default(), &p).keeping_spares(false);
    generation(&mut g, &p, 10).unwrap();
    let committed = read_committed(d.path());
    for (store, file) in committed.files.iter() {
        fs::rename(
            d.path().join(&file.file_name),
            d.path().join(store.base_name()),
        )
        .unwrap();
    }
    let manifest = Manifest {
        began_at: 10,
        channels: ["a", "b"]
            .iter()
            .map(|c| ManifestEntry {
                channel: (*c).into(),
                file_name: encode_file_name(c),
                kind: ChannelKind::Append,
            })
            .collect(),
        retained: false,
        sessions: true,
        broadcast: true,
    };
    fs::write(
        d.path().join(MANIFEST_FILE),
        f21::encode(&SnapshotFile::Manifest(manifest), 10),
    )
    .unwrap();

    // Loaded as a broker would: each fixed-name file adopted as it is.
    let report = snapshot_dir::scan(d.path(), &ScanOptions::default()).unwrap();
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    let adopted = report.committed.clone();
    assert_eq!(adopted.generation, 0);
    assert!(adopted.files.values().all(|f| f.generation == 0));
    let loaded = provider();
    let mut g = Generations::new(d.path(), options, adopted, &loaded).keeping_spares(false);
    // Stores the provider holds nothing of are not "changed": the
    // provider here loaded nothing, so write one store of its own.
    append(&loaded, "a", "fresh");
    let outcome = generation(&mut g, &loaded, 20).unwrap();
    let written: Vec<&str> = outcome
        .report
        .written
        .iter()
        .map(|w| w.file_name.as_str())
        .collect();
    assert!(written.contains(&"a.1.snapshot"), "{written:?}");
    // a's fixed-name file was replaced and removed; b's and the sessions
    // pair's stay, listed under their fixed names until written again.
    let mut left = names(d.path());
    left.retain(|n| n != "saguin.1.broadcast" && n != "saguin.1.sessions");
    assert_eq!(
        left,
        [
            "a.1.snapshot",
            "b.snapshot",
            "saguin.broadcast",
            MANIFEST_FILE,
            SESSIONS_FILE
        ]
    );
    let committed = read_committed(d.path());
    assert_eq!(
        committed.files[&Store::Channel("b".into())].file_name,
        "b.snapshot"
    );
    assert!(codes(d.path()).is_empty(), "{:?}", codes(d.path()));
}

#[test]
fn a_store_with_no_file_or_one_left_behind_is_a_change_from_the_start() {
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    append(&p, "a", "1");
    let g = fresh(d.path(), &p, false);
    assert!(g.has_changes(&p), "a has no file yet");

    let mut g = g;
    generation(&mut g, &p, 10).unwrap();
    let mut committed = read_committed(d.path());
    let g = Generations::new(d.path(), SnapshotOptions::default(), committed.clone(), &p)
        .keeping_spares(false);
    assert!(!g.has_changes(&p), "a's file is its state");
    Arc::make_mut(&mut committed.files)
        .get_mut(&Store::Channel("a".into()))
        .unwrap()
        .behind = true;
    let g = Generations::new(d.path(), SnapshotOptions::default(), committed.clone(), &p)
        .keeping_spares(false);
    assert!(g.has_changes(&p), "a's file is behind its state");
    Arc::make_mut(&mut committed.files)
        .get_mut(&Store::Channel("a".into()))
        .unwrap()
        .behind = false;
    fs::remove_file(d.path().join("a.1.snapshot")).unwrap();
    let g =
        Generations::new(d.path(), SnapshotOptions::default(), committed, &p).keeping_spares(false);
    assert!(g.has_changes(&p), "a's listed file is gone");
}

/// The channels a capture copied, by name.
fn captured_names(job: &Job) -> Vec<&str> {
    job.copy.channels.iter().map(ChannelCopy::name).collect()
}

#[test]
fn a_channel_opened_between_captures_is_captured_and_known_by_the_captures_after() {
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    append(&p, "a", "1");
    append(&p, "c", "1");
    let mut g = fresh(d.path(), &p, false);
    generation(&mut g, &p, 10).unwrap();
    assert!(!g.has_changes(&p));

    // Opened after the generations were made, between the two in name
    // order, and one after both.
    append(&p, "b", "1");
    append(&p, "d", "1");
    assert!(g.has_changes(&p), "b and d have no file yet");
    let job = g.capture(&p, 20).expect("b and d are new");
    assert_eq!(captured_names(&job), ["b", "d"]);
    let outcome = g.write(job, &Unobserved);
    assert!(outcome.report.is_complete(), "{:?}", outcome.report.failed);
    assert!(!g.has_changes(&p));

    // Each is known again by the next capture, and copied only from where
    // the last capture left: the one record appended since.
    append(&p, "b", "2");
    append(&p, "c", "2");
    let job = g.capture(&p, 30).expect("b and c changed");
    assert_eq!(captured_names(&job), ["b", "c"]);
    for channel in &job.copy.channels {
        let ChannelCopy::Append { copy, .. } = channel else {
            panic!("an append channel")
        };
        // Offsets start at 1: the one record before was 1.
        assert_eq!((copy.from, copy.records.len()), (2, 1), "{}", copy.name);
    }
    g.write(job, &Unobserved);
    assert!(g.capture(&p, 40).is_none(), "nothing changed since");
    let loaded = snapshot_dir::load(d.path(), &ScanOptions::default()).unwrap();
    let counts: Vec<(&str, usize)> = ["a", "b", "c", "d"]
        .iter()
        .map(|name| (*name, loaded.channels[*name].file.records.len()))
        .collect();
    assert_eq!(counts, [("a", 1), ("b", 2), ("c", 2), ("d", 1)]);
}

#[test]
fn a_changed_channel_is_copied_from_where_the_last_capture_left_and_written_whole() {
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    for i in 0..1_000 {
        append(&p, "a", &i.to_string());
    }
    let mut g = fresh(d.path(), &p, false);
    generation(&mut g, &p, 10).unwrap();
    for i in 1_000..1_010 {
        append(&p, "a", &i.to_string());
    }
    // Retention removes the first hundred meanwhile.
    p.open_channel("a", ChannelKind::Append)
        .unwrap()
        .as_append()
        .unwrap()
        .trim(101, None)
        .unwrap();
    let job = g.capture(&p, 20).unwrap();
    let ChannelCopy::Append { copy, .. } = &job.copy.channels[0] else {
        panic!("an append channel")
    };
    // The capture copied what was appended since the last one, no more.
    assert_eq!((copy.from, copy.records.len()), (1_001, 10));
    let outcome = g.write(job, &Unobserved);
    assert!(outcome.report.is_complete(), "{:?}", outcome.report.failed);
    let loaded = snapshot_dir::load(d.path(), &ScanOptions::default()).unwrap();
    let file = &loaded.channels["a"].file;
    assert_eq!((file.floor, file.next), (101, 1_011));
    let offsets: Vec<u64> = file.records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (101..1_011).collect::<Vec<_>>());
    let last: Vec<&[u8]> = file
        .records
        .iter()
        .rev()
        .take(2)
        .map(|r| &r.payload[..])
        .collect();
    assert_eq!(last, [&b"1009"[..], &b"1008"[..]]);

    // A copy written without being completed would lose the records
    // before it: it is refused, not written.
    append(&p, "a", "late");
    let job = g.capture(&p, 30).unwrap();
    let outcome = write_generation(g.dir(), &job, &Spares::none(), &Unobserved);
    assert!(
        outcome.report.failed[0]
            .error
            .to_string()
            .contains("was not completed"),
        "{:?}",
        outcome.report.failed
    );
}

#[test]
fn writes_manifest_and_channel_files_with_private_modes() {
    let p = provider();
    let a = p.open_channel("a.b", ChannelKind::Append).unwrap();
    a.as_append()
        .unwrap()
        .append(Record::new("a.b/x", "1"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let report = save_snapshot(&p, &snap, &SnapshotOptions::default(), 42);
    assert!(report.is_complete(), "{:?}", report.failed);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&snap), 0o700);
    assert_eq!(mode(&snap.join(MANIFEST_FILE)), 0o600);
    assert_eq!(report.generation, Some(1));
    let file = snap.join("a%2Eb.1.snapshot");
    assert_eq!(mode(&file), 0o600);
    let (header, decoded) = f21::decode(&fs::read(&file).unwrap()).unwrap();
    assert_eq!(header.written_at, 42);
    let SnapshotFile::Channel(c) = decoded else {
        panic!("not a channel file")
    };
    assert_eq!((c.next, c.floor, c.records.len()), (2, 1, 1));
    assert!(fs::read_dir(&snap).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".tmp")));
}

#[test]
fn every_failure_is_reported_and_old_files_stand() {
    let p = provider();
    for name in ["one", "two", "three"] {
        p.open_channel(name, ChannelKind::Append).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let report = save_snapshot(&p, dir.path(), &SnapshotOptions::default(), 1);
    assert!(report.is_complete());
    let before = fs::read(dir.path().join("two.1.snapshot")).unwrap();
    // A directory squatting on each temporary name of the second
    // generation makes those writes fail.
    fs::create_dir(dir.path().join("two.2.snapshot.tmp")).unwrap();
    fs::create_dir(dir.path().join("three.2.snapshot.tmp")).unwrap();
    let report = save_snapshot(&p, dir.path(), &SnapshotOptions::default(), 2);
    let mut failed: Vec<&str> = report.failed.iter().map(|f| f.name.as_str()).collect();
    failed.sort();
    assert_eq!(failed, ["three", "two"]);
    assert_eq!(report.generation, Some(2));
    assert_eq!(fs::read(dir.path().join("two.1.snapshot")).unwrap(), before);
    assert!(report.written.iter().any(|w| w.name == "one"));
    // The second generation lists the first's files of the two that
    // failed, marked behind, and the new one of the third.
    let committed = read_committed(dir.path());
    let names: Vec<(&str, bool)> = committed
        .files
        .values()
        .map(|f| (f.file_name.as_str(), f.behind))
        .collect();
    assert_eq!(
        names,
        [
            ("one.2.snapshot", false),
            ("three.1.snapshot", true),
            ("two.1.snapshot", true)
        ]
    );
    assert!(!dir.path().join("one.1.snapshot").exists());
}

#[test]
fn sessions_the_loader_would_refuse_are_not_written() {
    let p = provider();
    let options = SnapshotOptions {
        sessions: true,
        ..SnapshotOptions::default()
    };
    let session = |window| SessionEntry {
        client_id: "c".into(),
        principal: None,
        expiry_interval: 60,
        detached_at: 0,
        subscriptions: Vec::new(),
        will: None,
        window,
        inflight: Vec::new(),
    };
    p.session_store().save(session(10)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    assert!(save_snapshot(&p, dir.path(), &options, 1).is_complete());
    let first = saguin_format::channel_name::generation_file_name(SESSIONS_FILE, 1);
    let before = fs::read(dir.path().join(&first)).unwrap();
    p.session_store().save(session(0)).unwrap();
    let report = save_snapshot(&p, dir.path(), &options, 2);
    assert_eq!(report.failed.len(), 2, "{:?}", report.failed);
    assert!(report.failed[0].to_string().contains("would not load"));
    assert_eq!(fs::read(dir.path().join(&first)).unwrap(), before);
    assert!(!dir
        .path()
        .join(saguin_format::channel_name::generation_file_name(
            SESSIONS_FILE,
            2
        ))
        .exists());
}

#[test]
fn a_file_written_over_a_longer_spare_is_cut_to_its_own_length() {
    let d = tempfile::tempdir().unwrap();
    // A spare an earlier run left, holding a block of what it was.
    fs::write(d.path().join(spare_file_name(1)), [0xa5u8; 4000]).unwrap();
    let p = provider();
    append(&p, "a", "1");
    let mut g = fresh(d.path(), &p, true);
    let outcome = generation(&mut g, &p, 10).unwrap();
    assert!(outcome.report.is_complete(), "{:?}", outcome.report.failed);
    let written = outcome
        .report
        .written
        .iter()
        .find(|w| w.name == "a")
        .expect("a written");
    assert!(written.bytes < 4000, "{} bytes", written.bytes);
    assert_eq!(
        fs::metadata(d.path().join(&written.file_name))
            .unwrap()
            .len(),
        written.bytes
    );
    assert!(!names(d.path()).contains(&spare_file_name(1)), "taken");
    assert!(codes(d.path()).is_empty(), "{:?}", codes(d.path()));
    let loaded = snapshot_dir::load(d.path(), &ScanOptions::default()).unwrap();
    assert_eq!(loaded.channels["a"].file.records.len(), 1);
}

#[test]
fn a_directory_keeps_no_more_spares_than_its_manifest_lists_files() {
    let d = tempfile::tempdir().unwrap();
    // Spares a run with many more channels left.
    for n in 1..=20 {
        fs::write(d.path().join(spare_file_name(n)), b"").unwrap();
    }
    let p = provider();
    append(&p, "a", "1");
    let mut g = fresh(d.path(), &p, true);
    let first = generation(&mut g, &p, 10).unwrap();
    let listed = first.committed.expect("committed").files.len();
    let spares = || {
        names(d.path())
            .iter()
            .filter(|n| n.ends_with(".spare"))
            .count()
    };
    assert_eq!(spares(), listed, "{:?}", names(d.path()));
    // A generation replacing a file keeps it, within the bound.
    append(&p, "a", "2");
    let second = generation(&mut g, &p, 20).unwrap();
    assert_eq!(spares(), second.committed.expect("committed").files.len());
    assert!(codes(d.path()).is_empty(), "{:?}", codes(d.path()));
}

#[test]
fn a_directory_keeping_spares_makes_files_from_the_ones_generations_replaced() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().unwrap();
    let p = provider();
    append(&p, "a", "1");
    append(&p, "b", "1");
    let mut g = fresh(d.path(), &p, true);
    generation(&mut g, &p, 10).unwrap();
    let first = fs::metadata(d.path().join("a.1.snapshot")).unwrap().len();
    append(&p, "a", "2");
    generation(&mut g, &p, 20).unwrap();
    // a's first file is kept as a spare, its one block with it.
    assert_eq!(
        names(d.path()),
        [
            "a.2.snapshot",
            "b.1.snapshot",
            "saguin.1.spare",
            MANIFEST_FILE
        ]
    );
    let spare = fs::metadata(d.path().join("saguin.1.spare")).unwrap();
    assert_eq!(spare.len(), first);

    append(&p, "a", "3");
    append(&p, "b", "2");
    generation(&mut g, &p, 30).unwrap();
    assert_eq!(
        names(d.path()),
        [
            "a.3.snapshot",
            "b.3.snapshot",
            "saguin.2.spare",
            "saguin.3.spare",
            MANIFEST_FILE
        ]
    );
    // One of the new files is the spare, renamed and written.
    let made: Vec<u64> = ["a.3.snapshot", "b.3.snapshot"]
        .iter()
        .map(|name| fs::metadata(d.path().join(name)).unwrap().ino())
        .collect();
    assert!(made.contains(&spare.ino()), "{made:?} {}", spare.ino());
    // A scan and a restart pass over the spares, and tidying keeps them.
    assert!(codes(d.path()).is_empty(), "{:?}", codes(d.path()));
    let loaded = snapshot_dir::load(d.path(), &ScanOptions::default()).unwrap();
    assert_eq!(loaded.channels["a"].file.records.len(), 3);
    assert_eq!(loaded.channels["b"].file.records.len(), 2);
    assert!(tidy(d.path(), g.committed()).is_empty());
}
