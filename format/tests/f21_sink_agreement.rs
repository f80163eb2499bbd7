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
        SnapshotFile::Manifest(_) | SnapshotFile::Sessions(_) | SnapshotFile::Generation(_) => {}
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

/// A channel whose first record breaks a semantic rule (QoS 3) and whose
/// last record's topic is not UTF-8: the structural fault is named,
/// whichever sink reads it, whole or as a stream, though the semantic one
/// comes first in the file.
#[test]
fn a_structural_fault_is_named_before_an_earlier_semantic_one() {
    use saguin_format::f21::{ChannelFile, DecodeError};
    use saguin_format::model::{ChannelKind, Record};

    let mut c = ChannelFile::new("t", ChannelKind::Latest);
    for (i, topic) in ["a/first", "a/dup", "a/dup", "zz/last"].iter().enumerate() {
        let mut r = Record::new(*topic, &b"x"[..]);
        r.offset = i as u64 + 1;
        r.qos = if i == 0 { 3 } else { 1 };
        c.records.push(r);
    }
    c.next = 5;
    let mut raw = f21::encode(&SnapshotFile::Channel(c), 1);
    let reseal = |raw: &mut Vec<u8>| {
        let end = raw.len() - 4;
        let crc = crc32c::crc32c(&raw[..end]);
        raw[end..].copy_from_slice(&crc.to_le_bytes());
    };
    let decode_both = |raw: &[u8]| {
        let copied = f21::decode(raw).map(|_| ());
        let bytes = Bytes::copy_from_slice(raw);
        let tallied = f21::decode_with(&bytes, &mut Tally::default()).map(|_| ());
        assert_eq!(copied, tallied);
        assert_eq!(copied, streamed(raw, &mut Tally::default()).map(|_| ()));
        copied
    };
    // As written: QoS 3 in records[0] outranks the later duplicate topic.
    match decode_both(&raw) {
        Err(DecodeError::Invalid { field, .. }) => assert_eq!(field, "records[0].qos"),
        other => panic!("{other:?}"),
    }
    // Without the QoS fault, the duplicate topic (the second pass) is named.
    let qos_at = raw
        .windows(7)
        .position(|w| w == b"a/first")
        .expect("first topic")
        - 4
        - 3;
    assert_eq!(raw[qos_at], 3);
    raw[qos_at] = 1;
    reseal(&mut raw);
    match decode_both(&raw) {
        Err(DecodeError::Invalid { field, .. }) => assert_eq!(field, "records[2].topic"),
        other => panic!("{other:?}"),
    }
    // Back to QoS 3, and the last topic made not UTF-8: corrupt wins.
    raw[qos_at] = 3;
    let last = raw
        .windows(7)
        .position(|w| w == b"zz/last")
        .expect("last topic");
    raw[last] = 0xff;
    reseal(&mut raw);
    match decode_both(&raw) {
        Err(DecodeError::Corrupt { field, .. }) => assert_eq!(field, "records[3].topic"),
        other => panic!("{other:?}"),
    }
}

/// [`f21::decode_stream`] of a whole input, its verdict as the whole
/// decoder names it.
fn streamed<S: f21::RecordSink>(
    raw: &[u8],
    sink: &mut S,
) -> Result<(f21::Header, SnapshotFile), f21::DecodeError> {
    f21::decode_stream(&mut &raw[..], raw.len(), None, sink).map_err(|e| match e {
        f21::StreamError::Decode { error, .. } => error,
        f21::StreamError::Read(e) => panic!("a whole input failed to read: {e}"),
    })
}

/// A file of several of the stream's windows, with records cut by every
/// window's end and one payload larger than a window, decodes as a stream
/// to what it decodes to whole; a latest channel's second value for a
/// topic is found in a stream as it is whole.
#[test]
fn a_file_larger_than_the_streams_window_decodes_as_it_does_whole() {
    use saguin_format::f21::{ChannelFile, DecodeError};
    use saguin_format::model::{ChannelKind, Record};

    let mut c = ChannelFile::new("t", ChannelKind::Latest);
    for i in 0..3_000u64 {
        let len = if i == 1_500 {
            3 << 20
        } else {
            (i as usize * 37) % 4_096
        };
        let mut r = Record::new(format!("site/{i}"), vec![(i % 251) as u8; len]);
        r.offset = i + 1;
        c.records.push(r);
    }
    c.next = 3_001;
    let raw = f21::encode(&SnapshotFile::Channel(c), 1);
    assert!(raw.len() > 8 << 20, "{} bytes", raw.len());
    let whole = f21::decode(&raw).expect("decodes");
    assert_eq!(streamed(&raw, &mut Collect).expect("streams"), whole);
    let mut tally = Tally::default();
    streamed(&raw, &mut tally).expect("streams");
    assert_eq!(tally.records, 3_000);

    // The last record's topic made the one before's: the second value is
    // named.
    let mut raw = raw;
    let last = raw
        .windows(9)
        .rposition(|w| w == b"site/2999")
        .expect("the last topic");
    raw[last..last + 9].copy_from_slice(b"site/2998");
    let end = raw.len() - 4;
    let crc = crc32c::crc32c(&raw[..end]);
    raw[end..].copy_from_slice(&crc.to_le_bytes());
    let whole = f21::decode(&raw);
    match &whole {
        Err(DecodeError::Invalid { field, reason }) => {
            assert_eq!(field, "records[2999].topic");
            assert!(reason.contains("second value"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(streamed(&raw, &mut Tally::default()), whole);
}
