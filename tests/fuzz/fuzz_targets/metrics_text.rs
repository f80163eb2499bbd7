//! Fuzzes the Prometheus text reader behind `saguin status`: the body is
//! whatever answered on the metrics address. It may refuse, naming a line
//! the text has, never panic; a sample read has a metric name.

#![no_main]

use libfuzzer_sys::fuzz_target;
use saguin::broker::status::parse_text;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_text(text) {
        Ok(samples) => {
            assert!(samples.len() <= text.lines().count());
            for sample in samples {
                assert!(!sample.name.is_empty());
            }
        }
        Err((line, detail)) => {
            assert!((1..=text.lines().count()).contains(&line), "{line}");
            assert!(!detail.is_empty());
        }
    }
});
