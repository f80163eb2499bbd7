//! The one decoder with either sink gives one verdict: every fixture and
//! every damaged file is accepted or refused with the same finding whether
//! its records are kept (the loader) or dropped as decoded (`verify`).

use std::path::PathBuf;

use bytes::Bytes;
use saguin_format::f21::{self, Collect, SnapshotFile, Tally};

fn fixture_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let mut files = Vec::new();
    for dir in ["f21", "f21/dir", "damaged/f21"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            if e.path().is_file() {
                files.push(e.path());
            }
        }
    }
    files.sort();
    assert!(files.len() > 40, "the fixture corpus is missing");
    files
}

/// The lists a [`Tally`] drops, emptied, so the rest of a file can be compared.
fn without_records(file: &SnapshotFile) -> SnapshotFile {
    let mut file = file.clone();
    match &mut file {
        SnapshotFile::Channel(c) => {
            c.records.clear();
            c.items.clear();
            if let Some(d) = &mut c.dead_letter {
                d.records.clear();
            }
        }
        SnapshotFile::Retained(r) => r.records.clear(),
        SnapshotFile::Broadcast(b) => b.messages.clear(),
        SnapshotFile::Manifest(_) | SnapshotFile::Sessions(_) => {}
    }
    file
}

#[test]
fn collect_and_tally_agree_on_every_fixture() {
    let mut accepted = 0;
    let mut refused = 0;
    for path in fixture_files() {
        let raw = std::fs::read(&path).unwrap();
        let copied = f21::decode(&raw);
        let shared = Bytes::from(raw);
        let collected = f21::decode_with(&shared, &mut Collect);
        assert_eq!(
            collected,
            copied,
            "{}: Collect and decode differ",
            path.display()
        );
        let mut tally = Tally::default();
        let tallied = f21::decode_with(&shared, &mut tally);
        match (&copied, &tallied) {
            (Ok((h1, full)), Ok((h2, dropped))) => {
                accepted += 1;
                assert_eq!(h1, h2);
                assert_eq!(&without_records(full), dropped, "{}", path.display());
                let kept = match full {
                    SnapshotFile::Channel(c) => {
                        c.records.len()
                            + c.items.len()
                            + c.dead_letter.as_ref().map_or(0, |d| d.records.len())
                    }
                    SnapshotFile::Retained(r) => r.records.len(),
                    SnapshotFile::Broadcast(b) => b.messages.len(),
                    _ => 0,
                };
                assert_eq!(tally.records, kept as u64, "{}", path.display());
            }
            (Err(e1), Err(e2)) => {
                refused += 1;
                assert_eq!(
                    e1,
                    e2,
                    "{}: the sinks name different findings",
                    path.display()
                );
            }
            _ => panic!(
                "{}: decode says {:?}, the tallying decoder {:?}",
                path.display(),
                copied.as_ref().err(),
                tallied.as_ref().err()
            ),
        }
    }
    assert!(
        accepted > 5 && refused > 30,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn validate_agrees_with_the_streamed_checks() {
    // `validate` on a whole file runs the same list checks the decoder
    // streams: a file the decoder accepts validates, and re-encoding a
    // refused-by-validate file is refused by the decoder with that finding.
    for path in fixture_files() {
        let raw = std::fs::read(&path).unwrap();
        if let Ok((_, file)) = f21::decode(&raw) {
            assert_eq!(f21::validate(&file), Ok(()), "{}", path.display());
        }
    }
}
