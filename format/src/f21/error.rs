//! Why a format 21 file was refused. Each variant is a different finding an
//! operator acts on differently ("truncated", "bad checksum", "another
//! version", "not a snapshot at all" are never folded together), and each
//! Display is a sentence; the command layer prefixes the path.

use super::FileKind;

/// A format 21 file that cannot be loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than a header and its checksum: the write stopped early.
    #[error("truncated: the file holds {len} bytes, fewer than the {needed} a format 21 header and checksum take")]
    Truncated { len: usize, needed: usize },

    /// The trailer does not match the bytes before it.
    #[error("checksum mismatch: the trailer at byte {offset} holds CRC32C {stored:#010x} but the bytes before it give {computed:#010x}; the file is damaged or was cut short")]
    ChecksumMismatch {
        offset: usize,
        stored: u32,
        computed: u32,
    },

    /// The first eight bytes are not saguin's magic.
    #[error("not a saguin snapshot: bytes 0..8 are {found}, not the snapshot magic {expected}")]
    NotASnapshot { found: String, expected: String },

    /// A saguin snapshot of another format version.
    #[error("format {version} (written by saguin {writer} at {}); this build reads format {}", super::time::format_unix_nanos(*.written_at), super::FORMAT_VERSION)]
    OtherVersion {
        version: u32,
        writer: String,
        written_at: i64,
    },

    /// A kind byte format 21 does not define.
    #[error("unknown file kind {kind} at byte 12; format 21 defines 1 (channel), 2 (manifest), 3 (retained), 4 (sessions), 5 (broadcast)")]
    UnknownKind { kind: u8 },

    /// A file of one kind where another was asked for.
    #[error("a {found} file where a {expected} file was expected")]
    WrongKind { expected: FileKind, found: FileKind },

    /// A field's bytes cannot be what the writer wrote.
    #[error("corrupt {field} at byte {offset}: {reason}")]
    Corrupt {
        field: String,
        offset: usize,
        reason: String,
    },

    /// The body ended before the trailer.
    #[error("{count} unexpected bytes at byte {offset}, after the end of the body and before the checksum")]
    TrailingBytes { offset: usize, count: usize },

    /// The bytes decode but say something that cannot be true
    /// (the pass a checksum cannot cover, `FORMAT.md` §2.9).
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
}

impl DecodeError {
    pub(crate) fn corrupt(
        field: impl Into<String>,
        offset: usize,
        reason: impl Into<String>,
    ) -> DecodeError {
        DecodeError::Corrupt {
            field: field.into(),
            offset,
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> DecodeError {
        DecodeError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Prefix the field path with the element it belongs to, e.g.
    /// `records[17]` + `.topic`. Used only on the error path.
    pub(crate) fn within(self, parent: &dyn std::fmt::Display) -> DecodeError {
        match self {
            DecodeError::Corrupt {
                field,
                offset,
                reason,
            } => DecodeError::Corrupt {
                field: join_field(parent, &field),
                offset,
                reason,
            },
            DecodeError::Invalid { field, reason } => DecodeError::Invalid {
                field: join_field(parent, &field),
                reason,
            },
            other => other,
        }
    }

    /// A short stable name of the finding, for JSON output.
    pub fn code(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::ChecksumMismatch { .. } => "checksum-mismatch",
            DecodeError::NotASnapshot { .. } => "not-a-snapshot",
            DecodeError::OtherVersion { .. } => "other-version",
            DecodeError::UnknownKind { .. } => "unknown-kind",
            DecodeError::WrongKind { .. } => "wrong-kind",
            DecodeError::Corrupt { .. } => "corrupt",
            DecodeError::TrailingBytes { .. } => "trailing-bytes",
            DecodeError::Invalid { .. } => "invalid",
        }
    }
}

fn join_field(parent: &dyn std::fmt::Display, field: &str) -> String {
    if field.is_empty() {
        parent.to_string()
    } else if field.starts_with('[') {
        format!("{parent}{field}")
    } else {
        format!("{parent}.{field}")
    }
}
