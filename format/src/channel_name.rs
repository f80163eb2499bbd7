//! Channel names to file names and back (`FORMAT.md` §3), and the fixed names of a snapshot directory.
//!
//! A channel name is not a file name: `a.b` is a legal channel and `.` and
//! `..` are two directories. Every byte outside `[A-Za-z0-9_-]` is written
//! as `%XX` (upper-case hex), the dot and the percent sign included, so no
//! channel name can come out as `.` or `..` whatever the configuration
//! admitted, and two channel names can never reach one file. FORMAT.md §3.

/// What every channel file's name ends with.
pub const SNAPSHOT_SUFFIX: &str = ".snapshot";
/// The manifest, written first at every shutdown.
pub const MANIFEST_FILE: &str = "saguin.manifest";
/// Persistent sessions and shared groups.
pub const SESSIONS_FILE: &str = "saguin.sessions";
/// The broadcast log.
pub const BROADCAST_FILE: &str = "saguin.broadcast";
/// The directory's lock file (not a snapshot file).
pub const LOCK_FILE: &str = "saguin.lock";
/// Appended to a file's final name while it is being written; a leftover
/// one is a write that never finished.
pub const TEMP_SUFFIX: &str = ".tmp";
/// The reserved name the retained store is written under.
pub const RETAINED_CHANNEL: &str = "$saguin/retained";
/// The retained store's file name, `encode_file_name(RETAINED_CHANNEL)`.
pub const RETAINED_FILE: &str = "%24saguin%2Fretained.snapshot";
/// The longest file name the common Linux file systems accept, in bytes.
pub const MAX_FILE_NAME_LEN: usize = 255;

fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The file a channel's snapshot is written to, e.g. `telemetry` →
/// `telemetry.snapshot`, `a.b` → `a%2Eb.snapshot`.
pub fn encode_file_name(channel: &str) -> String {
    let mut out = String::with_capacity(channel.len() * 3 + SNAPSHOT_SUFFIX.len());
    for &b in channel.as_bytes() {
        if is_safe(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out.push_str(SNAPSHOT_SUFFIX);
    out
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The channel a file name belongs to, or `None` when the name is not one
/// [`encode_file_name`] produces (another suffix, lower-case or malformed
/// escapes, an escaped safe byte, a raw unsafe byte, or not UTF-8): only
/// the canonical spelling is accepted, so the mapping is one-to-one.
pub fn decode_file_name(file_name: &str) -> Option<String> {
    let stem = file_name.strip_suffix(SNAPSHOT_SUFFIX)?;
    if stem.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(stem.len());
    let mut bytes = stem.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hi = hex_value(bytes.next()?)?;
            let lo = hex_value(bytes.next()?)?;
            let decoded = (hi << 4) | lo;
            if is_safe(decoded) {
                return None;
            }
            out.push(decoded);
        } else if is_safe(b) {
            out.push(b);
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// The name a channel file is written under before its rename.
pub fn temp_file_name(final_name: &str) -> String {
    format!("{final_name}{TEMP_SUFFIX}")
}

/// Whether `channel`'s file name, and the temporary name it is written
/// under first, fit in [`MAX_FILE_NAME_LEN`] bytes. Configuration
/// validation refuses a channel for which this is false: the encoding
/// trebles every byte outside the safe set, so a name within the 128-byte
/// channel limit can still be too long to store.
pub fn file_name_fits(channel: &str) -> bool {
    encoded_len(channel) + TEMP_SUFFIX.len() <= MAX_FILE_NAME_LEN
}

/// The length of `encode_file_name(channel)` without building it.
pub fn encoded_len(channel: &str) -> usize {
    channel
        .bytes()
        .map(|b| if is_safe(b) { 1 } else { 3 })
        .sum::<usize>()
        + SNAPSHOT_SUFFIX.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_rfc_examples() {
        assert_eq!(encode_file_name("telemetry"), "telemetry.snapshot");
        assert_eq!(encode_file_name(RETAINED_CHANNEL), RETAINED_FILE);
        assert_eq!(encode_file_name("."), "%2E.snapshot");
        assert_eq!(encode_file_name(".."), "%2E%2E.snapshot");
        assert_eq!(encode_file_name("a.b"), "a%2Eb.snapshot");
        assert_eq!(encode_file_name("50%"), "50%25.snapshot");
        assert_eq!(encode_file_name("jobs.dlq"), "jobs%2Edlq.snapshot");
        assert_eq!(encode_file_name("é"), "%C3%A9.snapshot");
    }

    #[test]
    fn decodes_only_canonical_names() {
        for name in ["telemetry", "a.b", "..", "$saguin/retained", "é x%"] {
            assert_eq!(
                decode_file_name(&encode_file_name(name)).as_deref(),
                Some(name)
            );
        }
        for bad in [
            "telemetry",
            ".snapshot",
            "a.b.snapshot",
            "%2e.snapshot",
            "%41.snapshot",
            "%2.snapshot",
            "%.snapshot",
            "%FF.snapshot",
            "saguin.sessions",
            "telemetry.snapshot.tmp",
        ] {
            assert_eq!(decode_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn file_name_length_accounts_for_the_encoding_and_temp_suffix() {
        assert!(file_name_fits(&"a".repeat(128)));
        // 81 dots become 243 bytes, plus ".snapshot" and ".tmp": 256, too long.
        assert!(!file_name_fits(&".".repeat(81)));
        assert!(file_name_fits(&".".repeat(80)));
        let limit = MAX_FILE_NAME_LEN - SNAPSHOT_SUFFIX.len() - TEMP_SUFFIX.len();
        assert!(file_name_fits(&"a".repeat(limit)));
        assert!(!file_name_fits(&"a".repeat(limit + 1)));
        assert_eq!(encoded_len("a.b"), encode_file_name("a.b").len());
    }
}
