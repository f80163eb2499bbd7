//! Fuzz the MBMQTT01 decoder: any input is refused or accepted without a
//! panic, and an accepted V3 file encodes back to exactly its own bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saguin_format::mbmqtt::{decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = decode(data) {
        if snapshot.version_read == 3 {
            let again = encode(&snapshot).expect("a decoded snapshot encodes");
            assert_eq!(again, data, "V3 decode/encode is not the identity");
        }
    }
});
