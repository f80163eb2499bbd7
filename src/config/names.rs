//! Channel name rules and the file name a channel is stored under
//! (`format/FORMAT.md` §3).

/// Longest channel name, in bytes.
pub const CHANNEL_NAME_MAX_BYTES: usize = 128;

/// Most channels one broker serves: those configured and a dead-letter
/// channel for each queue. The broker numbers them in 16 bits, and this is
/// the most measured served (docs/benchmarks.md, "Channels in one broker").
pub const MAX_SERVED_CHANNELS: usize = 10_000;

/// The channels a broker serves for `channels` configured: each, and a
/// dead-letter channel for each queue among them.
pub(crate) fn served_channels<'a>(channels: impl IntoIterator<Item = &'a super::Channel>) -> usize {
    channels
        .into_iter()
        .map(|c| 1 + usize::from(c.queue().is_some()))
        .sum()
}

/// Longest file name the snapshot directory may be asked to hold (the
/// common `NAME_MAX` of Linux file systems).
pub const FILE_NAME_MAX_BYTES: usize = saguin_format::channel_name::MAX_FILE_NAME_LEN;

/// The snapshot file name of a channel: every byte outside `[A-Za-z0-9_-]`
/// percent-encoded as `%XX` (upper-case hex) - the dot and the percent sign
/// included, so no name can come out as `.` or `..` and two names never
/// share a file - then `.snapshot`. The very encoder the snapshot writer
/// uses, so the length checked here is the length written.
pub fn channel_file_name(name: &str) -> String {
    saguin_format::channel_name::encode_file_name(name)
}

/// The longest name a channel's file takes in a snapshot directory: its
/// encoded name, the largest generation's number and the temporary suffix
/// it is written under first.
fn longest_file_name_len(name: &str) -> usize {
    use saguin_format::channel_name::{
        generation_file_name, temp_file_name, MAX_GENERATION_INFIX_LEN,
    };
    debug_assert_eq!(
        generation_file_name(&channel_file_name(name), u64::MAX).len(),
        channel_file_name(name).len() + MAX_GENERATION_INFIX_LEN
    );
    temp_file_name(&generation_file_name(&channel_file_name(name), u64::MAX)).len()
}

/// Check a channel name; the reason it is refused, if it is.
pub fn check_channel_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a channel name cannot be empty".to_string());
    }
    if name.len() > CHANNEL_NAME_MAX_BYTES {
        return Err(format!(
            "channel name is {} bytes; the limit is {CHANNEL_NAME_MAX_BYTES}",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} cannot be a channel name"));
    }
    if name.starts_with('$') {
        return Err(format!(
            "channel name {name:?} starts with '$', which MQTT reserves for the server's topics"
        ));
    }
    for (what, c) in [
        ("'/' (a channel is one topic level)", '/'),
        ("'+' (a wildcard)", '+'),
        ("'#' (a wildcard)", '#'),
        ("NUL", '\0'),
    ] {
        if name.contains(c) {
            return Err(format!("channel name {name:?} contains {what}"));
        }
    }
    if !saguin_format::channel_name::file_name_fits(name) {
        return Err(format!(
            "channel name {name:?} is stored under file names of up to {} bytes once percent-encoded, numbered by generation and while being written; the limit is {FILE_NAME_MAX_BYTES} (every byte outside A-Z a-z 0-9 _ - takes three)",
            longest_file_name_len(name)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_keeps_the_safe_set_and_escapes_the_rest() {
        assert_eq!(channel_file_name("telemetry"), "telemetry.snapshot");
        assert_eq!(channel_file_name("a.b"), "a%2Eb.snapshot");
        assert_eq!(channel_file_name(".."), "%2E%2E.snapshot");
        assert_eq!(channel_file_name("50%"), "50%25.snapshot");
        assert_eq!(channel_file_name("Jobs_1-x"), "Jobs_1-x.snapshot");
        assert_eq!(channel_file_name("é"), "%C3%A9.snapshot");
        assert_eq!(channel_file_name("a b"), "a%20b.snapshot");
    }

    #[test]
    fn names_follow_the_rules() {
        for good in [
            "telemetry",
            "a.b",
            "...",
            ".hidden",
            "jobs.dlq",
            "x",
            &"a".repeat(128),
        ] {
            assert_eq!(check_channel_name(good), Ok(()), "{good:?}");
        }
        let refused = [
            ("", "empty"),
            (".", "cannot be a channel name"),
            ("..", "cannot be a channel name"),
            ("$SYS", "starts with '$'"),
            ("a/b", "one topic level"),
            ("a+", "wildcard"),
            ("#", "wildcard"),
            ("a\0b", "NUL"),
        ];
        for (name, why) in refused {
            let err = check_channel_name(name).unwrap_err();
            assert!(err.contains(why), "{name:?}: {err}");
        }
        assert!(check_channel_name(&"a".repeat(129))
            .unwrap_err()
            .contains("129 bytes"));
    }

    #[test]
    fn a_name_within_128_bytes_can_still_be_too_long_to_store() {
        // 73 dots encode to 219 bytes, plus ".snapshot", the largest
        // generation's ".18446744073709551615" and ".tmp" = 253: fits.
        assert_eq!(check_channel_name(&".".repeat(73)), Ok(()));
        // 74 dots: 222 + 9 + 21 + 4 = 256.
        let err = check_channel_name(&".".repeat(74)).unwrap_err();
        assert!(err.contains("up to 256 bytes"), "{err}");
    }
}
