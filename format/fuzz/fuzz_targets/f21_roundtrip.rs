//! Whatever the format 21 decoder accepts, the encoder writes back byte for
//! byte: every field has exactly one encoding, so a decode that loses or
//! invents anything shows as a difference. The copying and the zero-copy
//! decoders must agree on every input, the checker's sink (records
//! dropped as decoded) must reach the same verdict, and so must the
//! decoder reading the input as a stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saguin_format::f21;

fuzz_target!(|data: &[u8]| {
    check(data);
    // The checksum stops almost every mutation at the door; reseal the
    // input so mutated bodies reach the round trip too.
    if data.len() >= f21::MIN_FILE_LEN {
        let mut sealed = data.to_vec();
        let end = sealed.len() - f21::TRAILER_LEN;
        let crc = crc32c::crc32c(&sealed[..end]);
        sealed[end..].copy_from_slice(&crc.to_le_bytes());
        check(&sealed);
    }
});

fn check(data: &[u8]) {
    let copied = f21::decode(data);
    let bytes = bytes::Bytes::copy_from_slice(data);
    let shared = f21::decode_bytes(bytes.clone());
    assert_eq!(copied, shared, "decode and decode_bytes disagree");
    let tallied = f21::decode_with(&bytes, &mut f21::Tally::default());
    assert_eq!(
        copied.as_ref().err(),
        tallied.as_ref().err(),
        "decode and the tallying decoder disagree"
    );
    let streamed = f21::decode_stream(&mut &data[..], data.len(), None, &mut f21::Collect)
        .map_err(|e| match e {
            f21::StreamError::Decode { error, .. } => error,
            f21::StreamError::Read(e) => panic!("a whole input failed to read: {e}"),
        });
    assert_eq!(copied, streamed, "decode and the streaming decoder disagree");
    if let Ok((header, file)) = copied {
        let again = f21::encode_with_writer(&file, &header.writer, header.written_at);
        assert_eq!(again, data, "decode then encode changed the bytes");
        let (header2, file2) = f21::decode(&again).expect("an encoded file decodes");
        assert_eq!(header2, header);
        assert_eq!(file2, file);
    }
}
