//! Any bytes into the format 21 decoder: it may refuse, never panic, hang
//! or allocate beyond what the input can justify.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saguin_format::f21;

fuzz_target!(|data: &[u8]| {
    let _ = f21::read_header(data);
    let _ = f21::decode(data);
    // The checksum stops almost every mutation at the door; reseal the
    // input so the body parser and the semantic pass are reached too.
    if data.len() >= f21::MIN_FILE_LEN {
        let mut sealed = data.to_vec();
        let end = sealed.len() - f21::TRAILER_LEN;
        let crc = crc32c_of(&sealed[..end]);
        sealed[end..].copy_from_slice(&crc.to_le_bytes());
        sealed[..8].copy_from_slice(&f21::MAGIC);
        sealed[8..12].copy_from_slice(&f21::FORMAT_VERSION.to_le_bytes());
        let crc = crc32c_of(&sealed[..end]);
        sealed[end..].copy_from_slice(&crc.to_le_bytes());
        let _ = f21::decode(&sealed);
    }
});

/// CRC32C (Castagnoli, reflected 0x82F63B78), bitwise: the fuzz crate
/// keeps its dependencies to the crate under test.
fn crc32c_of(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
