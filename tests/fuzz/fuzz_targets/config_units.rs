//! Fuzzes the configuration's sizes and durations (`64 MiB`, `1m 30s`):
//! any text is read or refused, never a panic or an overflow, and a
//! duration read is written in its normal form, which reads back as the
//! same duration.

#![no_main]

use libfuzzer_sys::fuzz_target;
use saguin::config::units::{format_duration, parse_duration, parse_size};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(message) = parse_size(text) {
        assert!(!message.is_empty());
    }
    match parse_duration(text) {
        Ok(duration) => {
            let normal = format_duration(duration);
            assert_eq!(
                parse_duration(&normal),
                Ok(duration),
                "{text:?} -> {normal:?}"
            );
        }
        Err(message) => assert!(!message.is_empty()),
    }
});
