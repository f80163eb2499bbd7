//! Format 21: saguin snapshot files (channel files, manifests, retained
//! store, sessions, broadcast log). Every byte
//! is documented in `FORMAT.md` §2.
//!
//! ```text
//!  offset  size  field
//!       0     8  magic            MAGIC, never changes across versions
//!       8     4  format version   u32 LE, 21
//!      12     1  kind             FileKind byte (1..=6)
//!      13    24  writer           the writing build's revision, UTF-8, NUL-padded
//!      37     8  written at       i64 LE, unix nanoseconds
//!      45     …  body             per kind (body.rs)
//!   len-4     4  checksum         u32 LE, CRC32C of bytes 0..len-4
//! ```
//!
//! The first five fields hold across every format version so a file of
//! another version can still be named (version, writer, time). Nothing
//! decoded is trusted until the trailer matches: a file read whole is
//! checked before its body is parsed, one read as a stream
//! ([`decode_stream`]) once it has been read through.

mod body;
mod error;
mod sink;
pub mod time;
mod topic_set;
mod types;
mod validate;
mod wire;

use bytes::Bytes;

pub use error::DecodeError;
pub use sink::{Collect, RecordList, RecordSink, Tally};
pub use types::*;
use validate::Lists;
pub use validate::{
    check_identifier, hole, validate, validate_broadcast_file, validate_pair, validate_pair_of,
    validate_sessions_of, MAX_IDENTIFIER_BYTES,
};

/// Bytes 0..8 of every saguin snapshot file, whatever its version. The
/// leading 0x89 keeps a text file from matching and shows a transfer that
/// stripped the high bit; the trailing newline shows line-ending mangling.
pub const MAGIC: [u8; 8] = *b"\x89SAGUIN\n";
/// The only format this build writes and reads.
pub const FORMAT_VERSION: u32 = 21;
/// Offset of the format version (u32).
pub const VERSION_OFFSET: usize = 8;
/// Offset of the kind byte.
pub const KIND_OFFSET: usize = 12;
/// Offset of the writer field.
pub const WRITER_OFFSET: usize = 13;
/// Width of the NUL-padded writer field.
pub const WRITER_LEN: usize = 24;
/// Offset of the written-at time (i64).
pub const WRITTEN_AT_OFFSET: usize = 37;
/// Where the body starts.
pub const HEADER_LEN: usize = 45;
/// The CRC32C trailer.
pub const TRAILER_LEN: usize = 4;
/// The smallest file that can be format 21.
pub const MIN_FILE_LEN: usize = HEADER_LEN + TRAILER_LEN;

/// The fields every version's header holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub format_version: u32,
    /// The raw kind byte (see [`FileKind`]); raw so a file of another
    /// version with kinds this build does not know can still be described.
    pub kind: u8,
    /// The revision of the build that wrote the file.
    pub writer: String,
    /// When the file was written, unix nanoseconds.
    pub written_at: i64,
}

impl Header {
    /// The kind, when this build knows the byte.
    pub fn file_kind(&self) -> Option<FileKind> {
        FileKind::from_byte(self.kind)
    }
}

/// What a file is, from its kind byte; never from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    Channel,
    Manifest,
    Retained,
    Sessions,
    Broadcast,
    /// The generation manifest: which files make up the directory's
    /// current generation.
    Generation,
}

impl FileKind {
    pub const ALL: [FileKind; 6] = [
        FileKind::Channel,
        FileKind::Manifest,
        FileKind::Retained,
        FileKind::Sessions,
        FileKind::Broadcast,
        FileKind::Generation,
    ];

    /// The header's kind byte.
    pub fn as_byte(self) -> u8 {
        match self {
            FileKind::Channel => 1,
            FileKind::Manifest => 2,
            FileKind::Retained => 3,
            FileKind::Sessions => 4,
            FileKind::Broadcast => 5,
            FileKind::Generation => 6,
        }
    }

    pub fn from_byte(byte: u8) -> Option<FileKind> {
        FileKind::ALL.into_iter().find(|k| k.as_byte() == byte)
    }

    /// A stable lower-case name, used in JSON output and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Channel => "channel",
            FileKind::Manifest => "manifest",
            FileKind::Retained => "retained",
            FileKind::Sessions => "sessions",
            FileKind::Broadcast => "broadcast",
            FileKind::Generation => "generation",
        }
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One decoded format 21 file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotFile {
    Channel(ChannelFile),
    Manifest(Manifest),
    Retained(RetainedFile),
    Sessions(SessionsFile),
    Broadcast(BroadcastFile),
    Generation(Generation),
}

impl SnapshotFile {
    pub fn kind(&self) -> FileKind {
        match self {
            SnapshotFile::Channel(_) => FileKind::Channel,
            SnapshotFile::Manifest(_) => FileKind::Manifest,
            SnapshotFile::Retained(_) => FileKind::Retained,
            SnapshotFile::Sessions(_) => FileKind::Sessions,
            SnapshotFile::Broadcast(_) => FileKind::Broadcast,
            SnapshotFile::Generation(_) => FileKind::Generation,
        }
    }
}

/// Reads the version-independent header without checking the checksum, so
/// a file of another version (or a damaged one) can still be named.
pub fn read_header(bytes: &[u8]) -> Result<Header, DecodeError> {
    let magic_len = bytes.len().min(MAGIC.len());
    let prefix = bytes.get(..magic_len).unwrap_or_default();
    if bytes.is_empty() {
        return Err(DecodeError::Truncated {
            len: 0,
            needed: MIN_FILE_LEN,
        });
    }
    if MAGIC.get(..magic_len) != Some(prefix) {
        return Err(DecodeError::NotASnapshot {
            found: hex_bytes(prefix),
            expected: hex_bytes(&MAGIC),
        });
    }
    let (Some(version), Some(&kind), Some(writer), Some(written_at)) = (
        le_array::<4>(bytes, VERSION_OFFSET),
        bytes.get(KIND_OFFSET),
        bytes.get(WRITER_OFFSET..WRITER_OFFSET + WRITER_LEN),
        le_array::<8>(bytes, WRITTEN_AT_OFFSET),
    ) else {
        return Err(DecodeError::Truncated {
            len: bytes.len(),
            needed: MIN_FILE_LEN,
        });
    };
    let writer_end = writer.iter().position(|&b| b == 0).unwrap_or(WRITER_LEN);
    let writer = String::from_utf8_lossy(writer.get(..writer_end).unwrap_or_default()).into_owned();
    Ok(Header {
        format_version: u32::from_le_bytes(version),
        kind,
        writer,
        written_at: i64::from_le_bytes(written_at),
    })
}

fn le_array<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn hex_bytes(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&format!("{b:02x}"));
    }
    if s.is_empty() {
        s.push_str("(none)");
    }
    s
}

/// Decodes and validates a whole file: header, checksum, body, and the
/// semantic pass (`FORMAT.md` §2.9). Payloads and correlation data are
/// copied out one by one, so nothing decoded keeps `bytes` alive and a
/// record removed later gives its memory back. [`decode_bytes`] slices
/// them out of a shared buffer instead.
pub fn decode(bytes: &[u8]) -> Result<(Header, SnapshotFile), DecodeError> {
    let (header, kind) = check_envelope(bytes)?;
    let body_end = bytes.len().saturating_sub(TRAILER_LEN); // check_envelope: len >= MIN_FILE_LEN
    let mut r = wire::Reader::copying(bytes, HEADER_LEN, body_end);
    let file = decode_body(&mut r, kind, &mut Collect)?;
    Ok((header, file))
}

/// [`decode`] without copying payloads: every payload and correlation data
/// is a zero-copy slice of `bytes`, so the whole buffer stays allocated as
/// long as any decoded record does. The fastest path and the smallest peak;
/// a caller that trims records one by one and counts their memory as freed
/// should prefer [`decode`].
pub fn decode_bytes(bytes: Bytes) -> Result<(Header, SnapshotFile), DecodeError> {
    decode_with(&bytes, &mut Collect)
}

/// The one decoder, generic over what becomes of each record: header,
/// checksum, body and every semantic rule, exactly as [`decode`] runs them,
/// with each record of the file's record lists (and each queue item)
/// handed to `sink` once decoded. With [`Collect`] this is
/// [`decode_bytes`]; with [`Tally`] the returned file's record lists are
/// empty and the peak memory is `bytes` plus a few words per list, which
/// is how a checker reads a large file. Payloads a sink keeps are
/// zero-copy slices of `bytes`.
pub fn decode_with<S: RecordSink>(
    bytes: &Bytes,
    sink: &mut S,
) -> Result<(Header, SnapshotFile), DecodeError> {
    let (header, kind) = check_envelope(bytes)?;
    let body_end = bytes.len().saturating_sub(TRAILER_LEN); // check_envelope: len >= MIN_FILE_LEN
    let mut r = wire::Reader::shared(bytes, HEADER_LEN, body_end);
    let file = decode_body(&mut r, kind, sink)?;
    Ok((header, file))
}

/// [`decode_with`], refusing a file of any kind but `expected` (after the
/// file has decoded, as [`decode_expecting`] does).
pub fn decode_with_expecting<S: RecordSink>(
    bytes: &Bytes,
    expected: FileKind,
    sink: &mut S,
) -> Result<(Header, SnapshotFile), DecodeError> {
    let (header, file) = decode_with(bytes, sink)?;
    check_kind(file.kind(), expected)?;
    Ok((header, file))
}

fn check_kind(found: FileKind, expected: FileKind) -> Result<(), DecodeError> {
    if found != expected {
        return Err(DecodeError::WrongKind { expected, found });
    }
    Ok(())
}

fn decode_body<S: RecordSink>(
    r: &mut wire::Reader<'_>,
    kind: FileKind,
    sink: &mut S,
) -> Result<SnapshotFile, DecodeError> {
    let parsed = parse_body(r, kind, sink)?;
    judge_body(parsed, r.pos(), r.remaining())
}

/// The body parsed, each list's checks run as it streamed by: the file and
/// the lists' verdicts, held for [`judge_body`].
fn parse_body<'a, I: wire::Input<'a>, S: RecordSink>(
    r: &mut wire::Reader<'a, I>,
    kind: FileKind,
    sink: &mut S,
) -> Result<(SnapshotFile, Lists), DecodeError> {
    Ok(match kind {
        FileKind::Channel => {
            let (c, checks) = body::get_channel(r, sink)?;
            (SnapshotFile::Channel(c), Lists::Channel(checks.finish()))
        }
        FileKind::Manifest => (SnapshotFile::Manifest(body::get_manifest(r)?), Lists::None),
        FileKind::Sessions => (SnapshotFile::Sessions(body::get_sessions(r)?), Lists::None),
        FileKind::Generation => (
            SnapshotFile::Generation(body::get_generation(r)?),
            Lists::None,
        ),
        FileKind::Retained => {
            let (f, records) = body::get_retained(r, sink)?;
            (SnapshotFile::Retained(f), Lists::One(records))
        }
        FileKind::Broadcast => {
            let (b, messages) = body::get_broadcast(r, sink)?;
            (SnapshotFile::Broadcast(b), Lists::One(messages))
        }
    })
}

/// A parsed body judged whole, `remaining` bytes left unparsed at `pos`:
/// a structural fault anywhere is reported ahead of a semantic one (as
/// the semantic pass over a decoded file would).
fn judge_body(
    (file, lists): (SnapshotFile, Lists),
    pos: usize,
    remaining: usize,
) -> Result<SnapshotFile, DecodeError> {
    if remaining != 0 {
        return Err(DecodeError::TrailingBytes {
            offset: pos,
            count: remaining,
        });
    }
    validate::validate_decoded(&file, lists)?;
    Ok(file)
}

/// Why a file read as a stream ([`decode_stream`]) was not decoded.
#[derive(Debug)]
pub enum StreamError {
    /// The source failed, or ended before the length it was said to have.
    Read(std::io::Error),
    /// The bytes are not a valid file of the kind expected: the verdict
    /// [`decode_with`] gives on the same bytes. `header` when the file's
    /// header could be read.
    Decode {
        header: Option<Header>,
        error: DecodeError,
    },
}

/// [`decode_with`] of a file of `len` bytes read from `source` as it is
/// decoded, a window at a time, so that reading it costs about its
/// largest record rather than its length, with the topics a latest
/// channel's or the retained store's checks keep (its byte strings are
/// copies). Every check runs, in the order [`decode_with`] runs them, and
/// the verdict is the same; but the checksum is judged at the end, so
/// `sink` receives a file's records before its verdict. A sink that keeps
/// them must let them go when this fails. `expected` refuses a file of
/// any other kind, as [`decode_with_expecting`] does. Reads exactly `len`
/// bytes, whatever the verdict (a header refused included), unless
/// `source` fails or ends first: whether it has more is the caller's to
/// ask.
pub fn decode_stream<S: RecordSink>(
    source: &mut dyn std::io::Read,
    len: usize,
    expected: Option<FileKind>,
    sink: &mut S,
) -> Result<(Header, SnapshotFile), StreamError> {
    let mut head = [0u8; HEADER_LEN];
    let head = head.get_mut(..len.min(HEADER_LEN)).unwrap_or_default();
    source.read_exact(head).map_err(StreamError::Read)?;
    let head = &*head;
    let refuse = |error| StreamError::Decode {
        header: read_header(head).ok(),
        error,
    };
    // A file its header refuses is still read to its length, so that one
    // that shrank is the read's failure, not a finding about bytes that
    // are gone.
    let refuse_header = |source: &mut dyn std::io::Read, error| {
        let rest = len.saturating_sub(head.len()) as u64;
        match std::io::copy(&mut std::io::Read::take(source, rest), &mut std::io::sink()) {
            Ok(read) if read == rest => refuse(error),
            Ok(_) => StreamError::Read(std::io::ErrorKind::UnexpectedEof.into()),
            Err(e) => StreamError::Read(e),
        }
    };
    let header = match read_header(head) {
        Ok(header) => header,
        Err(error) => return Err(refuse_header(source, error)),
    };
    if header.format_version != FORMAT_VERSION {
        let error = DecodeError::OtherVersion {
            version: header.format_version,
            writer: header.writer,
            written_at: header.written_at,
        };
        return Err(refuse_header(source, error));
    }
    let Some(body_end) = len
        .checked_sub(TRAILER_LEN)
        .filter(|&end| end >= HEADER_LEN)
    else {
        let error = DecodeError::Truncated {
            len,
            needed: MIN_FILE_LEN,
        };
        return Err(refuse_header(source, error));
    };
    // What the envelope says beyond the checksum is judged after it, as
    // `check_envelope` does: the file is read through to the checksum
    // first whatever the kind byte and writer field hold.
    let kind = header
        .file_kind()
        .ok_or(DecodeError::UnknownKind { kind: header.kind })
        .and_then(|kind| check_writer_field(head).map(|()| kind));
    let mut r = wire::Reader::streaming(source, HEADER_LEN, crc32c::crc32c(head), body_end);
    let parsed = kind.and_then(|kind| parse_body(&mut r, kind, sink));
    let (pos, remaining) = (r.pos(), r.remaining());
    let (computed, stored) = r
        .finish_stream::<TRAILER_LEN>()
        .map_err(StreamError::Read)?;
    let stored = u32::from_le_bytes(stored);
    if stored != computed {
        return Err(refuse(DecodeError::ChecksumMismatch {
            offset: body_end,
            stored,
            computed,
        }));
    }
    let file = parsed
        .and_then(|parsed| judge_body(parsed, pos, remaining))
        .and_then(|file| match expected {
            Some(expected) => check_kind(file.kind(), expected).map(|()| file),
            None => Ok(file),
        })
        .map_err(refuse)?;
    Ok((header, file))
}

/// [`decode`], refusing a file of any kind but `expected`.
pub fn decode_expecting(
    bytes: &[u8],
    expected: FileKind,
) -> Result<(Header, SnapshotFile), DecodeError> {
    let (header, file) = decode(bytes)?;
    check_kind(file.kind(), expected)?;
    Ok((header, file))
}

/// Magic, version, length, checksum, kind byte and writer field, in the
/// order that names the most specific finding: a foreign version is named
/// before its checksum is judged, since another version may checksum
/// differently.
fn check_envelope(bytes: &[u8]) -> Result<(Header, FileKind), DecodeError> {
    let header = read_header(bytes)?;
    if header.format_version != FORMAT_VERSION {
        return Err(DecodeError::OtherVersion {
            version: header.format_version,
            writer: header.writer,
            written_at: header.written_at,
        });
    }
    let Some(body_end) = bytes
        .len()
        .checked_sub(TRAILER_LEN)
        .filter(|&end| end >= HEADER_LEN)
    else {
        return Err(DecodeError::Truncated {
            len: bytes.len(),
            needed: MIN_FILE_LEN,
        });
    };
    let (Some(covered), Some(stored)) = (bytes.get(..body_end), le_array::<4>(bytes, body_end))
    else {
        return Err(DecodeError::Truncated {
            len: bytes.len(),
            needed: MIN_FILE_LEN,
        });
    };
    let stored = u32::from_le_bytes(stored);
    let computed = crc32c::crc32c(covered);
    if stored != computed {
        return Err(DecodeError::ChecksumMismatch {
            offset: body_end,
            stored,
            computed,
        });
    }
    let Some(kind) = header.file_kind() else {
        return Err(DecodeError::UnknownKind { kind: header.kind });
    };
    check_writer_field(bytes)?;
    Ok((header, kind))
}

/// A format 21 writer field is UTF-8 followed only by NUL padding.
fn check_writer_field(bytes: &[u8]) -> Result<(), DecodeError> {
    let field = bytes
        .get(WRITER_OFFSET..WRITER_OFFSET + WRITER_LEN)
        .unwrap_or_default();
    let end = field.iter().position(|&b| b == 0).unwrap_or(WRITER_LEN);
    let (text, padding) = field.split_at(end);
    if let Err(e) = std::str::from_utf8(text) {
        return Err(DecodeError::corrupt(
            "header.writer",
            WRITER_OFFSET + e.valid_up_to(),
            "not valid UTF-8",
        ));
    }
    if let Some(i) = padding.iter().position(|&b| b != 0) {
        return Err(DecodeError::corrupt(
            "header.writer",
            WRITER_OFFSET + end + i,
            "a non-NUL byte after the NUL padding began",
        ));
    }
    Ok(())
}

/// The header of a `kind` file written by `writer` (cut to 24 bytes at a
/// character boundary) at `written_at`: what every encoder writes first.
pub fn header(kind: FileKind, writer: &str, written_at: i64) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[..VERSION_OFFSET].copy_from_slice(&MAGIC);
    out[VERSION_OFFSET..KIND_OFFSET].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[KIND_OFFSET] = kind.as_byte();
    let mut cut = writer.len().min(WRITER_LEN);
    while !writer.is_char_boundary(cut) {
        cut -= 1;
    }
    out[WRITER_OFFSET..WRITER_OFFSET + cut].copy_from_slice(&writer.as_bytes()[..cut]);
    out[WRITTEN_AT_OFFSET..HEADER_LEN].copy_from_slice(&written_at.to_le_bytes());
    out
}

/// Encodes `file` stamped with this build's revision ([`crate::REVISION`]).
/// The encoder writes what it is given; [`validate`] is what says whether
/// that is loadable.
pub fn encode(file: &SnapshotFile, written_at: i64) -> Vec<u8> {
    encode_with_writer(file, crate::REVISION, written_at)
}

/// [`encode`] of a sessions file from its parts as a writer holds them
/// (each session behind a handle of its own): the same bytes, with no
/// copy of every session made first.
pub fn encode_sessions_of<S: std::borrow::Borrow<Session>>(
    sessions: &[S],
    shared_groups: &[SharedGroup],
    written_at: i64,
) -> Vec<u8> {
    framed(FileKind::Sessions, crate::REVISION, written_at, 4096, |w| {
        body::put_sessions_of(w, sessions, shared_groups)
    })
}

/// [`encode`] with an explicit writer string (cut to 24 bytes at a
/// character boundary), for fixtures and tests.
pub fn encode_with_writer(file: &SnapshotFile, writer: &str, written_at: i64) -> Vec<u8> {
    let hint = match file {
        SnapshotFile::Channel(c) => body::channel_size_hint(c),
        SnapshotFile::Retained(f) => body::records_size_hint(&f.records),
        SnapshotFile::Broadcast(f) => body::records_size_hint(&f.messages),
        SnapshotFile::Manifest(_) | SnapshotFile::Sessions(_) => 4096,
        SnapshotFile::Generation(g) => body::generation_size_hint(g),
    };
    framed(file.kind(), writer, written_at, hint, |w| match file {
        SnapshotFile::Channel(c) => body::put_channel(w, c),
        SnapshotFile::Manifest(m) => body::put_manifest(w, m),
        SnapshotFile::Retained(f) => body::put_retained(w, f),
        SnapshotFile::Sessions(f) => body::put_sessions(w, f),
        SnapshotFile::Broadcast(f) => body::put_broadcast(w, f),
        SnapshotFile::Generation(g) => body::put_generation(w, g),
    })
}

/// A whole file of `kind`: its header, the body `put` writes (about
/// `hint` bytes), and the trailing checksum.
fn framed(
    kind: FileKind,
    writer: &str,
    written_at: i64,
    hint: usize,
    put: impl FnOnce(&mut wire::Writer),
) -> Vec<u8> {
    let mut w = wire::Writer::with_capacity(MIN_FILE_LEN + hint);
    w.buf.extend_from_slice(&header(kind, writer, written_at));
    put(&mut w);
    let crc = crc32c::crc32c(&w.buf);
    w.u32(crc);
    w.buf
}

#[cfg(test)]
mod tests;
