//! Unit tests of the envelope: the header, the order of the checks, and the
//! worked example in FORMAT.md §2.1.

use super::*;

const EXAMPLE_AT: i64 = 1_767_225_600_000_000_000;

/// FORMAT.md §2.1's empty retained store, byte for byte.
const EMPTY_RETAINED: [u8; 53] = [
    0x89, 0x53, 0x41, 0x47, 0x55, 0x49, 0x4e, 0x0a, 0x15, 0x00, 0x00, 0x00, 0x03, 0x66, 0x69, 0x78,
    0x74, 0x75, 0x72, 0x65, 0x30, 0x30, 0x30, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xfa, 0xed, 0x51, 0x72, 0x86, 0x18, 0x00, 0x00, 0x00,
    0x00, 0xa5, 0x57, 0x5e, 0x48,
];

#[test]
fn the_documented_example_is_what_the_encoder_writes() {
    let file = SnapshotFile::Retained(RetainedFile::default());
    assert_eq!(
        encode_with_writer(&file, "fixture0000", EXAMPLE_AT),
        EMPTY_RETAINED
    );
    let (header, decoded) = decode(&EMPTY_RETAINED).expect("decodes");
    assert_eq!(decoded, file);
    assert_eq!(
        header,
        Header {
            format_version: 21,
            kind: 3,
            writer: "fixture0000".into(),
            written_at: EXAMPLE_AT
        }
    );
}

#[test]
fn crc32c_is_castagnoli() {
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
}

#[test]
fn the_writer_is_this_builds_revision() {
    assert!(!crate::REVISION.is_empty());
    assert!(crate::REVISION.len() <= WRITER_LEN);
    let bytes = encode(&SnapshotFile::Retained(RetainedFile::default()), 5);
    assert_eq!(read_header(&bytes).expect("header").writer, crate::REVISION);
}

#[test]
fn a_long_writer_is_cut_at_a_character_boundary() {
    let writer = "é".repeat(20); // 40 bytes
    let bytes = encode_with_writer(&SnapshotFile::Retained(RetainedFile::default()), &writer, 1);
    let (header, _) = decode(&bytes).expect("decodes");
    assert_eq!(header.writer, "é".repeat(12));
}

#[test]
fn short_inputs_are_told_apart() {
    assert!(matches!(
        decode(&[]),
        Err(DecodeError::Truncated { len: 0, .. })
    ));
    assert!(matches!(
        decode(&MAGIC[..3]),
        Err(DecodeError::Truncated { len: 3, .. })
    ));
    assert!(matches!(
        decode(b"MBM"),
        Err(DecodeError::NotASnapshot { .. })
    ));
    assert!(matches!(
        decode(&EMPTY_RETAINED[..44]),
        Err(DecodeError::Truncated { len: 44, .. })
    ));
    assert!(matches!(
        decode(&EMPTY_RETAINED[..48]),
        Err(DecodeError::Truncated { len: 48, .. })
    ));
    assert!(matches!(
        decode(&EMPTY_RETAINED[..52]),
        Err(DecodeError::ChecksumMismatch { .. })
    ));
}

#[test]
fn another_version_is_named_even_when_short() {
    let mut bytes = EMPTY_RETAINED[..45].to_vec();
    bytes[8] = 22;
    assert_eq!(
        decode(&bytes),
        Err(DecodeError::OtherVersion {
            version: 22,
            writer: "fixture0000".into(),
            written_at: EXAMPLE_AT
        })
    );
}

#[test]
fn the_writer_field_must_be_text_then_padding() {
    let reseal = |mut b: Vec<u8>| {
        let end = b.len() - 4;
        let crc = crc32c::crc32c(&b[..end]);
        b[end..].copy_from_slice(&crc.to_le_bytes());
        b
    };
    let mut bytes = EMPTY_RETAINED.to_vec();
    bytes[30] = b'x'; // after the NUL padding began
    let e = decode(&reseal(bytes)).expect_err("refused");
    assert_eq!(e.code(), "corrupt");
    assert!(e.to_string().contains("header.writer at byte 30"), "{e}");
    let mut bytes = EMPTY_RETAINED.to_vec();
    bytes[13] = 0xff;
    let e = decode(&reseal(bytes)).expect_err("refused");
    assert!(e.to_string().contains("not valid UTF-8"), "{e}");
}

#[test]
fn decode_expecting_checks_the_kind() {
    assert!(decode_expecting(&EMPTY_RETAINED, FileKind::Retained).is_ok());
    assert_eq!(
        decode_expecting(&EMPTY_RETAINED, FileKind::Sessions),
        Err(DecodeError::WrongKind {
            expected: FileKind::Sessions,
            found: FileKind::Retained
        })
    );
}

#[test]
fn file_kinds_round_trip_through_their_byte() {
    for kind in FileKind::ALL {
        assert_eq!(FileKind::from_byte(kind.as_byte()), Some(kind));
    }
    assert_eq!(FileKind::from_byte(0), None);
    assert_eq!(FileKind::from_byte(7), None);
}

fn generation_manifest() -> Generation {
    use crate::channel_name::{generation_file_name, BROADCAST_FILE, SESSIONS_FILE};
    let file = |kind, channel: &str, file_name: String, generation| GenerationFile {
        kind,
        channel: channel.to_owned(),
        file_name,
        generation,
        written_at: 1_000 + generation as i64,
        length: 120,
        checksum: 0xdead_beef,
        behind: false,
    };
    Generation {
        generation: 7,
        captured_at: 1_007,
        files: vec![
            file(
                FileKind::Channel,
                "a.b",
                generation_file_name("a%2Eb.snapshot", 7),
                7,
            ),
            file(FileKind::Channel, "old", "old.snapshot".into(), 0),
            file(
                FileKind::Broadcast,
                "",
                generation_file_name(BROADCAST_FILE, 3),
                3,
            ),
            file(
                FileKind::Sessions,
                "",
                generation_file_name(SESSIONS_FILE, 3),
                3,
            ),
        ],
    }
}

#[test]
fn a_generation_manifest_round_trips() {
    let g = generation_manifest();
    let bytes = encode(&SnapshotFile::Generation(g.clone()), 2_000);
    let (header, back) = decode(&bytes).unwrap();
    assert_eq!(header.kind, 6);
    assert_eq!(back, SnapshotFile::Generation(g));
}

#[test]
fn a_generation_manifest_names_each_file_by_the_generation_that_wrote_it() {
    let refused = |change: fn(&mut Generation), why: &str| {
        let mut g = generation_manifest();
        change(&mut g);
        let e = decode(&encode(&SnapshotFile::Generation(g), 1)).expect_err(why);
        assert!(e.to_string().contains(why), "{e}");
    };
    refused(|g| g.generation = 0, "numbered from 1");
    refused(
        |g| g.files[0].generation = 8,
        "past the manifest's own generation",
    );
    refused(
        |g| g.files[0].file_name = "a%2Eb.6.snapshot".into(),
        "is not the name generation 7 gives",
    );
    refused(
        |g| g.files[1].file_name = "old.0.snapshot".into(),
        "which is \"old.snapshot\"",
    );
    refused(|g| g.files[1].channel = "a.b".into(), "listed twice");
    refused(
        |g| g.files[2].channel = "x".into(),
        "only a channel file names",
    );
    refused(
        |g| g.files[0].channel.clear(),
        "is empty for a channel file",
    );
    refused(
        |g| g.files[0].length = 48,
        "shorter than any format 21 file",
    );
    refused(
        |g| {
            g.files.pop();
        },
        "one pair",
    );
    let mut g = generation_manifest();
    g.files[1].kind = FileKind::Generation;
    let mut bytes = encode(&SnapshotFile::Generation(g), 1);
    let end = bytes.len() - 4;
    let crc = crc32c::crc32c(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
    let e = decode(&bytes).expect_err("a manifest listing a manifest");
    assert!(e.to_string().contains("not 1 (channel)"), "{e}");
}

/// The fixture corpus: valid files and damaged ones.
fn fixture_files() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let mut files = Vec::new();
    for dir in ["f21", "f21/dir", "damaged/f21"] {
        for entry in std::fs::read_dir(root.join(dir))
            .expect("the fixture corpus")
            .flatten()
        {
            if entry.path().is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    assert!(files.len() > 40, "the fixture corpus is missing");
    files
}

/// What a streamed decode gave, as the whole decoder says it.
fn as_whole<T>(streamed: Result<T, StreamError>) -> Result<T, DecodeError> {
    streamed.map_err(|e| match e {
        StreamError::Decode { error, .. } => error,
        StreamError::Read(e) => panic!("a whole source failed: {e}"),
    })
}

/// A stream reads its window a few bytes at a time in these tests
/// (`wire::STREAM_CHUNK`), so every element of every fixture crosses a
/// refill: each decodes to the same file, or is refused with the same
/// finding, as the whole decoder gives, with either sink and any kind
/// expected.
#[test]
fn a_stream_decodes_every_fixture_as_the_whole_decoder_does() {
    let mut accepted = 0;
    for path in fixture_files() {
        let raw = std::fs::read(&path).unwrap();
        let shared = Bytes::from(raw.clone());
        let name = path.display();

        let whole = decode_with(&shared, &mut Collect);
        let streamed = as_whole(decode_stream(&mut &raw[..], raw.len(), None, &mut Collect));
        assert_eq!(streamed, whole, "{name}");
        accepted += usize::from(whole.is_ok());

        let mut whole_tally = Tally::default();
        let mut streamed_tally = Tally::default();
        let whole = decode_with(&shared, &mut whole_tally);
        let streamed = decode_stream(&mut &raw[..], raw.len(), None, &mut streamed_tally);
        assert_eq!(as_whole(streamed), whole, "{name}");
        if whole.is_ok() {
            assert_eq!(streamed_tally, whole_tally, "{name}");
        }

        for kind in [FileKind::Channel, FileKind::Retained] {
            let whole = decode_with_expecting(&shared, kind, &mut Tally::default());
            let streamed =
                decode_stream(&mut &raw[..], raw.len(), Some(kind), &mut Tally::default());
            assert_eq!(as_whole(streamed), whole, "{name} as {kind:?}");
        }
    }
    assert!(accepted > 5, "{accepted} fixtures accepted");
}

/// A source that ends before the length it was said to have, or fails,
/// is the read's verdict wherever it stops, never a finding about bytes
/// that were not read (but for a header that was read whole and refused).
#[test]
fn a_stream_whose_source_ends_early_or_fails_is_a_read_failure() {
    struct Failing<'a>(&'a [u8]);
    impl std::io::Read for Failing<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Err(std::io::Error::other("the disk failed"));
            }
            let n = buf.len().min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/f21");
    for name in ["append.snapshot", "retained.snapshot", "queue.snapshot"] {
        let raw = std::fs::read(root.join(name)).unwrap();
        for cut in [
            0,
            1,
            HEADER_LEN,
            HEADER_LEN + 1,
            raw.len() / 2,
            raw.len() - 1,
        ] {
            let short = decode_stream(&mut &raw[..cut], raw.len(), None, &mut Collect);
            match short {
                Err(StreamError::Read(e)) => {
                    assert_eq!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof,
                        "{name} cut at {cut}"
                    )
                }
                other => panic!("{name} cut at {cut}: {other:?}"),
            }
            let failed = decode_stream(&mut Failing(&raw[..cut]), raw.len(), None, &mut Collect);
            match failed {
                Err(StreamError::Read(e)) => assert_eq!(e.to_string(), "the disk failed"),
                other => panic!("{name} failing at {cut}: {other:?}"),
            }
        }
    }
}

/// A source that fails once, after `at` bytes, and then gives the rest as
/// if nothing happened: the failure is the verdict all the same, not the
/// checksum of a file with a hole in it.
#[test]
fn a_stream_whose_source_fails_once_keeps_the_failure() {
    struct FailsOnce<'a> {
        bytes: &'a [u8],
        at: usize,
        failed: bool,
    }
    impl std::io::Read for FailsOnce<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if !self.failed && self.at == 0 {
                self.failed = true;
                return Err(std::io::Error::other("the disk failed once"));
            }
            let limit = if self.failed { buf.len() } else { self.at };
            let n = buf.len().min(limit).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            if !self.failed {
                self.at -= n;
            }
            Ok(n)
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/f21");
    let raw = std::fs::read(root.join("append.snapshot")).unwrap();
    for at in [HEADER_LEN + 3, raw.len() / 2, raw.len() - 2] {
        let mut source = FailsOnce {
            bytes: &raw,
            at,
            failed: false,
        };
        match decode_stream(&mut source, raw.len(), None, &mut Collect) {
            Err(StreamError::Read(e)) => assert_eq!(e.to_string(), "the disk failed once"),
            other => panic!("failing once at {at}: {other:?}"),
        }
    }
}

/// A file its header refuses is read to its length all the same: one
/// that is shorter than it was said to be is the read's failure, not the
/// header's finding; whole, it is the finding.
#[test]
fn a_stream_refused_by_its_header_is_still_read_to_its_length() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/damaged/f21");
    for name in ["version-22.snapshot", "truncated-at-trailer-48.snapshot"] {
        let raw = std::fs::read(root.join(name)).unwrap();
        let whole = decode(&raw).unwrap_err();
        assert!(
            matches!(
                whole,
                DecodeError::OtherVersion { .. } | DecodeError::Truncated { .. }
            ),
            "{name}: {whole:?}"
        );
        let mut source = &raw[..];
        match decode_stream(&mut source, raw.len(), None, &mut Collect) {
            Err(StreamError::Decode { error, .. }) => assert_eq!(error, whole, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        assert!(
            source.is_empty(),
            "{name}: {} bytes left unread",
            source.len()
        );
        let short = &raw[..raw.len() - 1];
        match decode_stream(&mut &short[..], raw.len(), None, &mut Collect) {
            Err(StreamError::Read(e)) => {
                assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{name}")
            }
            other => panic!("{name} cut short: {other:?}"),
        }
    }
}
