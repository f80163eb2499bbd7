//! Fuzz the MBMQTT01 decoder: any input is refused or accepted without a
//! panic, and an accepted V3 file encodes back to exactly its own bytes.
//! The envelope's length and CRC stop almost every mutation at the door,
//! so the input is also read as a payload and sealed in a valid envelope
//! of the version its first byte picks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saguin_format::mbmqtt::{decode, encode, seal, ENVELOPE_LEN};

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some((&pick, payload)) = data.split_first() {
        let version = u16::from(pick % 3) + 1;
        check(&seal(version, payload));
    }
});

fn check(data: &[u8]) {
    if let Ok(snapshot) = decode(data) {
        assert!(data.len() >= ENVELOPE_LEN);
        if snapshot.version_read == 3 {
            let again = encode(&snapshot).expect("a decoded snapshot encodes");
            assert_eq!(again, data, "V3 decode/encode is not the identity");
        }
    }
}
