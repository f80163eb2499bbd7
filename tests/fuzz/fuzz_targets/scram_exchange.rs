//! Fuzzes the server side of SCRAM-SHA-512: the client-first and
//! client-final messages are a client's bytes, before it is known who the
//! client is. Nothing may panic; a server-first message is SCRAM's syntax
//! and carries the client's nonce followed by the server's; a client-final
//! message with the right binding and nonce but a made-up proof fails as a
//! bad proof, never as anything else and never as a success.
//!
//! The input is split at the first 0xFF byte (never in UTF-8): the
//! client-first message, then the client-final message, which is tried as
//! it is and as the proof of a well-formed client-final.

#![no_main]

use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use saguin::broker::auth::scram::{ScramError, ScramServer};
use saguin::config::PasswordFile;

/// One `$7$` user (PBKDF2-SHA512, 101 iterations), as a password file
/// holds it, and one `$6$` user that SCRAM cannot serve.
const PASSWORDS: &str = "\
alice:$7$101$c2FsdHlzYWx0MTIz$Xjf31CbqH7xSYYPxy8z+01oN/M/dwPdj4uCauHHxo4ZT0C+VrwCmf7tL+RgYnrjplSmwaW+fQCVqb1YXsoH2bQ==
bob:$6$c2FsdHlzYWx0MTIz$Xjf31CbqH7xSYYPxy8z+01oN/M/dwPdj4uCauHHxo4ZT0C+VrwCmf7tL+RgYnrjplSmwaW+fQCVqb1YXsoH2bQ==
";

const SERVER_NONCE: &str = "c2VydmVyLW5vbmNl";

fuzz_target!(|data: &[u8]| {
    let (first, last) = match data.iter().position(|&b| b == 0xFF) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let file = PasswordFile::parse(PASSWORDS).expect("the fuzz target's password file parses");

    let Ok((server, server_first)) = ScramServer::start(&file, first, SERVER_NONCE) else {
        return;
    };
    let server_first = String::from_utf8(server_first).expect("server-first is UTF-8");
    let mut fields = server_first.split(',');
    let nonce = fields
        .next()
        .and_then(|f| f.strip_prefix("r="))
        .expect("server-first starts with the nonce");
    assert!(nonce.ends_with(SERVER_NONCE) && nonce.len() > SERVER_NONCE.len());
    assert!(fields.next().is_some_and(|f| f.starts_with("s=")));
    assert!(fields.next().is_some_and(|f| f.starts_with("i=")));
    assert!(fields.next().is_none());
    let nonce = nonce.to_owned();
    let _ = server.finish(last);

    // The same start again, answered with a well-formed client-final.
    let (server, _) = ScramServer::start(&file, first, SERVER_NONCE)
        .expect("a client-first accepted once is accepted again");
    let text = std::str::from_utf8(first).expect("an accepted client-first is UTF-8");
    let gs2_end = text
        .match_indices(',')
        .nth(1)
        .map(|(at, _)| at + 1)
        .expect("an accepted client-first has a GS2 header");
    let b64 = base64::engine::general_purpose::STANDARD;
    let client_final = format!(
        "c={},r={nonce},p={}",
        b64.encode(&text[..gs2_end]),
        b64.encode(last)
    );
    assert_eq!(
        server.finish(client_final.as_bytes()),
        Err(ScramError::BadProof),
        "{client_final}"
    );
});
