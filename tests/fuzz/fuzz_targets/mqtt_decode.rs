//! Fuzzes the MQTT frame decoder: arbitrary bytes, fed in arbitrary chunk
//! sizes to server and client decoders of both versions, must never panic;
//! and every packet that decodes must encode to exactly `encoded_len` bytes
//! and decode back to the same packet (the model the codec is compared with).
//!
//! The first input byte picks the set-up: bit 0 the version (a client
//! decoder's; a server learns it from CONNECT), bits 1-2 the role and size
//! cap, bits 3-7 the chunk size.

#![no_main]

use libfuzzer_sys::fuzz_target;
use saguin::broker::codec::{
    encode, encoded_len, BytesMut, FrameDecoder, Packet, ProtocolVersion, PROTOCOL_MAX_PACKET_SIZE,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, input)) = data.split_first() else {
        return;
    };
    let version = if mode & 1 == 0 {
        ProtocolVersion::V311
    } else {
        ProtocolVersion::V5
    };
    let mut decoder = match (mode >> 1) & 0b11 {
        0 => FrameDecoder::server(PROTOCOL_MAX_PACKET_SIZE),
        1 => FrameDecoder::client(PROTOCOL_MAX_PACKET_SIZE, version),
        2 => FrameDecoder::server(256),
        _ => FrameDecoder::client(256, version),
    };
    let chunk = usize::from(mode >> 3) + 1;
    let mut buf = BytesMut::new();
    for piece in input.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(packet)) => check_round_trip(&decoder, &packet),
                Ok(None) => break,
                Err(error) => {
                    // Every refusal names itself and maps to a reason code.
                    assert!(!error.to_string().is_empty());
                    assert!(error.reason_code().is_error());
                    return;
                }
            }
        }
    }
});

fn check_round_trip(decoder: &FrameDecoder, packet: &Packet) {
    let version = decoder
        .version()
        .expect("the version is known once a packet has decoded");
    let mut bytes = BytesMut::new();
    encode(packet, version, &mut bytes).expect("a decoded packet encodes");
    assert_eq!(Ok(bytes.len()), encoded_len(packet, version));
    let state = match packet {
        Packet::Connect(_) => None,
        _ => Some(version),
    };
    let mut again = FrameDecoder::new(decoder.role(), PROTOCOL_MAX_PACKET_SIZE, state);
    let decoded = again.decode(&mut bytes).expect("re-encoded packet decodes");
    assert_eq!(decoded.as_ref(), Some(packet));
    assert!(bytes.is_empty());
}
