//! Channel names to file names and back (`FORMAT.md` §3), the fixed names
//! of a snapshot directory, and the names a generation writes them under
//! (`FORMAT.md` §4).
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
/// The room a memory provider keeps allocated for the generation that finds
/// the file system full (not a snapshot file).
pub const ROOM_FILE: &str = "saguin.room";
/// What a spare file's name ends with (not a snapshot file): a file a
/// generation replaced, kept (emptied when over one block) for a later
/// one to make its file from, on ext4 without a journal (`FORMAT.md` §4).
pub const SPARE_SUFFIX: &str = ".spare";
/// Appended to a file's final name while it is being written; a leftover
/// one is a write that never finished.
pub const TEMP_SUFFIX: &str = ".tmp";
/// The reserved name the retained store is written under.
pub const RETAINED_CHANNEL: &str = "$saguin/retained";
/// What a queue's name takes to name its dead-letter channel: `jobs`
/// dead-letters into `jobs.dlq`, kept in the queue's file.
pub const DLQ_SUFFIX: &str = ".dlq";
/// The retained store's file name, `encode_file_name(RETAINED_CHANNEL)`.
pub const RETAINED_FILE: &str = "%24saguin%2Fretained.snapshot";
/// The longest file name the common Linux file systems accept, in bytes.
pub const MAX_FILE_NAME_LEN: usize = 255;
/// The most a generation adds to a fixed name: a dot and the 20 digits of
/// the largest `u64`.
pub const MAX_GENERATION_INFIX_LEN: usize = 21;

/// Spare file number `n`'s name, `saguin.<n>.spare`.
pub fn spare_file_name(n: u64) -> String {
    format!("saguin.{n}{SPARE_SUFFIX}")
}

/// The number of spare file `name`, or `None` when it is not one.
pub fn spare_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("saguin.")?.strip_suffix(SPARE_SUFFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

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

/// The name generation `generation` writes the file of fixed name `base`
/// under: the generation's decimal number before the last suffix, so
/// `telemetry.snapshot` becomes `telemetry.7.snapshot` and
/// `saguin.sessions` becomes `saguin.7.sessions`. A generation's files are
/// never written over, so two generations never share a name. No fixed
/// name holds a dot before its suffix (an encoded channel name holds none,
/// §3), which is what makes the number unambiguous.
pub fn generation_file_name(base: &str, generation: u64) -> String {
    match base.rsplit_once('.') {
        Some((stem, suffix)) => format!("{stem}.{generation}.{suffix}"),
        None => format!("{base}.{generation}"),
    }
}

/// The fixed name and the generation of a name [`generation_file_name`]
/// produces, or `None` for any other name (a fixed name, a leading zero, a
/// generation of 0, a number past `u64`): only the canonical spelling is
/// read back, so a file has one name.
pub fn split_generation_file_name(name: &str) -> Option<(String, u64)> {
    let (stem, suffix) = name.rsplit_once('.')?;
    let (base_stem, digits) = stem.rsplit_once('.')?;
    if base_stem.is_empty()
        || digits.is_empty()
        || digits.starts_with('0')
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let generation: u64 = digits.parse().ok()?;
    let base = format!("{base_stem}.{suffix}");
    (generation_file_name(&base, generation) == name).then_some((base, generation))
}

/// Whether `channel`'s file name, as the largest generation writes it, and
/// the temporary name it is written under first, fit in
/// [`MAX_FILE_NAME_LEN`] bytes. Configuration validation refuses a channel
/// for which this is false: the encoding trebles every byte outside the
/// safe set, so a name within the 128-byte channel limit can still be too
/// long to store.
pub fn file_name_fits(channel: &str) -> bool {
    encoded_len(channel) + MAX_GENERATION_INFIX_LEN + TEMP_SUFFIX.len() <= MAX_FILE_NAME_LEN
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
    fn a_spare_file_is_told_by_its_whole_name() {
        assert_eq!(spare_file_name(7), "saguin.7.spare");
        assert_eq!(spare_number(&spare_file_name(7)), Some(7));
        assert_eq!(spare_number(&spare_file_name(u64::MAX)), Some(u64::MAX));
        for other in [
            "saguin..spare",
            "saguin.x.spare",
            "saguin.7.spare.tmp",
            "telemetry.7.spare",
            "saguin.99999999999999999999.spare",
            "saguin.7.snapshot",
        ] {
            assert_eq!(spare_number(other), None, "{other}");
        }
    }

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
    fn file_name_length_accounts_for_the_encoding_generation_and_temp_suffix() {
        assert!(file_name_fits(&"a".repeat(128)));
        // 74 dots become 222 bytes, plus ".snapshot", the largest generation
        // and ".tmp": 256, too long.
        assert!(!file_name_fits(&".".repeat(74)));
        assert!(file_name_fits(&".".repeat(73)));
        let limit = MAX_FILE_NAME_LEN
            - SNAPSHOT_SUFFIX.len()
            - MAX_GENERATION_INFIX_LEN
            - TEMP_SUFFIX.len();
        assert!(file_name_fits(&"a".repeat(limit)));
        assert!(!file_name_fits(&"a".repeat(limit + 1)));
        let longest = generation_file_name(&encode_file_name(&"a".repeat(limit)), u64::MAX);
        assert_eq!(temp_file_name(&longest).len(), MAX_FILE_NAME_LEN);
        assert_eq!(encoded_len("a.b"), encode_file_name("a.b").len());
    }

    #[test]
    fn a_generation_names_each_fixed_name_once_and_reads_back_only_that() {
        assert_eq!(
            generation_file_name("telemetry.snapshot", 7),
            "telemetry.7.snapshot"
        );
        assert_eq!(
            generation_file_name(RETAINED_FILE, 12),
            "%24saguin%2Fretained.12.snapshot"
        );
        assert_eq!(generation_file_name(SESSIONS_FILE, 1), "saguin.1.sessions");
        assert_eq!(
            generation_file_name(BROADCAST_FILE, u64::MAX),
            "saguin.18446744073709551615.broadcast"
        );
        for (base, generation) in [
            ("telemetry.snapshot", 7),
            ("a%2Eb.snapshot", 1),
            (SESSIONS_FILE, 99),
            (BROADCAST_FILE, u64::MAX),
        ] {
            assert_eq!(
                split_generation_file_name(&generation_file_name(base, generation)),
                Some((base.to_owned(), generation))
            );
        }
        for not_one in [
            "telemetry.snapshot",
            "saguin.sessions",
            "telemetry.07.snapshot",
            "telemetry.0.snapshot",
            "telemetry..snapshot",
            "telemetry.7a.snapshot",
            ".7.snapshot",
            "telemetry.18446744073709551616.snapshot",
            "telemetry.7.snapshot.tmp",
            "saguin.manifest",
        ] {
            assert_eq!(split_generation_file_name(not_one), None, "{not_one}");
        }
    }
}
