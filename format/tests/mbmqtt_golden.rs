//! Golden MBMQTT01 V1/V2/V3 files and the damaged corpus.
//!
//! `fixtures/mbmqtt/broker-v{1,2,3}.snapshot` and every file of
//! `fixtures/damaged/mbmqtt/` (with its `EXPECTED` list) are produced here.
//! Run with `SAGUIN_BLESS=1` to write them; otherwise the bytes are compared
//! with what is committed, so a change to the encoders or to the corpus is
//! never silent.

mod mbmqtt_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mbmqtt_support::*;
use saguin_format::mbmqtt::{
    decode, encode, DecodeError, Detach, Inflight, Phase, Principal, RetainedMessage, Subscription,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn blessing() -> bool {
    std::env::var_os("SAGUIN_BLESS").is_some_and(|v| v == "1")
}

/// Write `bytes` at `path` when blessing, else require the file to hold
/// exactly them.
fn golden(path: &Path, bytes: &[u8]) {
    if blessing() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
        return;
    }
    let on_disk = std::fs::read(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run the tests with SAGUIN_BLESS=1 to write it",
            path.display()
        )
    });
    assert!(
        on_disk == bytes,
        "{} differs from what the test produces; if the change is intended run with SAGUIN_BLESS=1",
        path.display()
    );
}

#[test]
fn v3_golden_file_decodes_field_by_field() {
    let model = golden_v3();
    let bytes = encode(&model).unwrap();
    // The test's independent writer agrees with the library's encoder.
    assert_eq!(bytes, encode_v3_raw(&model).seal(3));
    golden(&fixtures().join("mbmqtt/broker-v3.snapshot"), &bytes);

    let s = decode(&bytes).unwrap();
    assert_eq!(s.version_read, 3);
    assert_eq!(s.sessions.len(), 2);
    let a = &s.sessions[0];
    assert_eq!(a.client_id, "sensor-17");
    assert_eq!(a.principal, Principal::Named("plant-a".into()));
    assert_eq!(a.detach, Detach::Millis(1_767_225_600_000));
    assert_eq!(a.next_packet_id, 42);
    assert_eq!(
        a.subscriptions,
        vec![
            Subscription {
                filter: "cmd/sensor-17/#".into(),
                qos: 2
            },
            Subscription {
                filter: "fleet/+/config".into(),
                qos: 1
            },
            Subscription {
                filter: "time".into(),
                qos: 0
            },
        ]
    );
    assert_eq!(a.inbound_qos2, vec![7, 9]);
    assert_eq!(a.inflight.len(), 3);
    assert_eq!(a.inflight[0].packet_id, 39);
    assert_eq!(a.inflight[0].phase, Phase::AwaitPuback);
    assert_eq!(
        a.inflight[0].message,
        Some(msg("cmd/sensor-17/reboot", b"now", false, 1))
    );
    assert_eq!(a.inflight[1].phase, Phase::AwaitPubrec);
    let fw = a.inflight[1].message.as_ref().unwrap();
    assert_eq!(
        (fw.payload.as_slice(), fw.retain, fw.qos),
        (&[0u8, 1, 2, 0xff][..], true, 2)
    );
    assert_eq!(
        a.inflight[2],
        Inflight {
            packet_id: 41,
            phase: Phase::AwaitPubcomp,
            message: None
        }
    );
    assert_eq!(a.pending.len(), 2);
    assert_eq!(
        a.pending[0],
        msg("fleet/a/config", b"{\"rate\":5}", false, 1)
    );
    assert_eq!(a.pending[1].qos, 2);
    let b = &s.sessions[1];
    assert_eq!(b.client_id, "dashboard");
    assert_eq!(b.principal, Principal::Named(String::new()));
    assert_eq!(b.detach, Detach::Millis(0));
    assert!(b.subscriptions.is_empty() && b.inflight.is_empty() && b.pending.is_empty());
    assert_eq!(
        s.retained,
        vec![
            RetainedMessage {
                topic: "fleet/a/config".into(),
                payload: b"{\"rate\":5}".to_vec(),
                qos: 1
            },
            RetainedMessage {
                topic: "status/héllo".into(),
                payload: vec![],
                qos: 2
            },
        ]
    );
    assert_eq!(s, model);
}

#[test]
fn v2_golden_file_converts_to_the_v3_model() {
    let model = golden_v2();
    let bytes = encode_legacy(2, &model).seal(2);
    golden(&fixtures().join("mbmqtt/broker-v2.snapshot"), &bytes);

    let s = decode(&bytes).unwrap();
    assert_eq!(s.version_read, 2);
    let a = &s.sessions[0];
    assert_eq!(a.client_id, "meter-3");
    // V2 keeps its principal and detach epoch.
    assert_eq!(a.principal, Principal::Named("utility".into()));
    assert_eq!(a.detach, Detach::Millis(1_700_000_000_123));
    assert_eq!(a.next_packet_id, 65535);
    assert_eq!(a.subscriptions[0].qos, 1);
    assert_eq!(a.subscriptions[1].qos, 0);
    // Inbound QoS 2 starts empty.
    assert!(a.inbound_qos2.is_empty());
    // Legacy inflight becomes AwaitPuback carrying a QoS 1 message.
    assert_eq!(a.inflight.len(), 1);
    assert_eq!(a.inflight[0].packet_id, 65534);
    assert_eq!(a.inflight[0].phase, Phase::AwaitPuback);
    assert_eq!(
        a.inflight[0].message,
        Some(msg("meter/3/tariff", b"peak", true, 1))
    );
    // Pending becomes QoS 1, order kept.
    assert_eq!(
        a.pending,
        vec![
            msg("meter/3/read", b"", false, 1),
            msg("broadcast", b"maintenance 02:00", false, 1)
        ]
    );
    assert_eq!(s.sessions[1].detach, Detach::Millis(5));
    assert_eq!(s.retained[0].qos, 0);
    assert_eq!(s, model);

    // The converted model writes as V3 and reads back the same (but V3).
    let v3 = decode(&encode(&s).unwrap()).unwrap();
    assert_eq!(v3.version_read, 3);
    assert_eq!(v3.sessions, s.sessions);
}

#[test]
fn v1_golden_file_converts_to_the_v3_model() {
    let model = golden_v1();
    let bytes = encode_legacy(1, &model).seal(1);
    golden(&fixtures().join("mbmqtt/broker-v1.snapshot"), &bytes);

    let s = decode(&bytes).unwrap();
    assert_eq!(s.version_read, 1);
    let a = &s.sessions[0];
    assert_eq!(a.client_id, "legacy-1");
    assert_eq!(a.principal, Principal::LegacyAnonymous);
    assert_eq!(a.detach, Detach::Unknown);
    assert_eq!(a.next_packet_id, 10);
    assert!(a.inbound_qos2.is_empty());
    assert!(a
        .inflight
        .iter()
        .all(|i| i.phase == Phase::AwaitPuback && i.message.as_ref().unwrap().qos == 1));
    assert!(a.inflight[1].message.as_ref().unwrap().retain);
    assert_eq!(a.pending, vec![msg("legacy/c", b"3", false, 1)]);
    assert_eq!(s.retained[0].qos, 1);
    assert_eq!(s, model);
}

/// One damaged file: its name, its bytes, and a substring the refusal must
/// contain (both from the library and from `saguin snapshot verify`).
struct Case {
    name: String,
    bytes: Vec<u8>,
    expect: String,
}

fn case(name: &str, bytes: Vec<u8>, expect: &str) -> Case {
    Case {
        name: format!("{name}.snapshot"),
        bytes,
        expect: expect.into(),
    }
}

/// A minimal valid V3 payload with one session, written by `f` so a test
/// can change exactly one field.
fn one_session_v3(f: impl FnOnce(&mut Raw)) -> Vec<u8> {
    let mut w = Raw::new();
    f(&mut w);
    w.seal(3)
}

fn session_head(w: &mut Raw, id: &str) {
    w.str(id).str("p").str("1000").u16(1);
}

fn corpus() -> Vec<Case> {
    let v3 = encode(&golden_v3()).unwrap();
    let v2 = encode_legacy(2, &golden_v2()).seal(2);
    let v1 = encode_legacy(1, &golden_v1()).seal(1);
    let mut cases = Vec::new();

    // The envelope, field by field.
    cases.push(case("empty", vec![], "empty file"));
    cases.push(case(
        "shorter-than-envelope",
        v3[..23].to_vec(),
        "shorter than the 24-byte MBMQTT01 envelope",
    ));
    let mut b = v3.clone();
    b[..8].copy_from_slice(b"MBMQTT02");
    cases.push(case("wrong-magic", b, "wrong magic at offset 0"));
    for version in [0u16, 4, 0xffff] {
        let mut b = v3.clone();
        b[8..10].copy_from_slice(&version.to_be_bytes());
        cases.push(case(
            &format!("unknown-version-{version}"),
            b,
            &format!("unknown MBMQTT01 version {version} at offset 8"),
        ));
    }
    let mut b = v3.clone();
    b[10..12].copy_from_slice(&0x8000u16.to_be_bytes());
    cases.push(case(
        "nonzero-flags",
        b,
        "nonzero flags 0x8000 at offset 10",
    ));
    let mut b = v3.clone();
    b.push(0);
    cases.push(case("trailing-byte", b, "trailing bytes"));
    let mut b = v3.clone();
    b[12..20].copy_from_slice(&u64::MAX.to_be_bytes());
    cases.push(case("length-huge", b, "truncated"));
    let mut b = v3.clone();
    b[20] ^= 0xff;
    cases.push(case("crc-wrong", b, "CRC mismatch"));

    // The file cut at every field boundary: a length mismatch (or a short
    // envelope) whatever the cut.
    let raw3 = encode_v3_raw(&golden_v3());
    let cuts: BTreeSet<usize> = (0..24)
        .step_by(4)
        .chain(raw3.marks.iter().map(|m| m + 24))
        .collect();
    for cut in &cuts {
        let expect = if *cut == 0 {
            "empty file"
        } else if *cut < 24 {
            "shorter than the 24-byte"
        } else {
            "truncated: the payload length at offset 12"
        };
        cases.push(case(
            &format!("cut-file-at-{cut:04}"),
            v3[..*cut].to_vec(),
            expect,
        ));
    }
    // The payload cut at every field boundary and sealed again with a valid
    // length and CRC: the decoder must find the missing field itself.
    for (name, version, raw) in [
        ("v3", 3u16, encode_v3_raw(&golden_v3())),
        ("v2", 2, encode_legacy(2, &golden_v2())),
        ("v1", 1, encode_legacy(1, &golden_v1())),
    ] {
        for cut in raw.marks.iter().copied().collect::<BTreeSet<_>>() {
            let bytes = saguin_format::mbmqtt::seal(version, &raw.out[..cut]);
            let err = decode(&bytes).unwrap_err();
            assert!(
                matches!(
                    err,
                    DecodeError::UnexpectedEnd { .. } | DecodeError::CountTooLarge { .. }
                ),
                "{name} cut at {cut}: {err}"
            );
            cases.push(case(
                &format!("cut-{name}-payload-at-{cut:04}"),
                bytes,
                &err.to_string(),
            ));
        }
    }

    // Single bit flips in every region of each version's file.
    for (name, file) in [("v3", &v3), ("v2", &v2), ("v1", &v1)] {
        for at in [24usize, 30, 40, file.len() / 2, file.len() - 1] {
            let mut b = file.clone();
            b[at] ^= 0x10;
            cases.push(case(
                &format!("flip-{name}-payload-{at:04}"),
                b,
                "CRC mismatch",
            ));
        }
        let mut b = file.clone();
        b[19] ^= 0x01;
        cases.push(case(&format!("flip-{name}-length"), b, "at offset 12"));
        let mut b = file.clone();
        b[23] ^= 0x01;
        cases.push(case(&format!("flip-{name}-crc"), b, "CRC mismatch"));
        let mut b = file.clone();
        b[9] ^= 0x04;
        cases.push(case(
            &format!("flip-{name}-version"),
            b,
            "unknown MBMQTT01 version",
        ));
    }

    // Each payload refusal, in a file whose envelope is valid.
    cases.push(case(
        "model-version-mismatch",
        one_session_v3(|w| {
            w.u32(2).u32(0).u32(0);
        }),
        "model version 2 at offset 24 does not match envelope version 3",
    ));
    cases.push(case(
        "session-count-huge",
        one_session_v3(|w| {
            w.u32(3).u32(u32::MAX).u32(0);
        }),
        "session count at offset 28 is 4294967295",
    ));
    cases.push(case(
        "subscription-count-huge",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0x1000_0000).u32(0).u32(0).u32(0).u32(0);
        }),
        "sessions[0].subscriptions count at offset",
    ));
    cases.push(case(
        "string-length-past-end",
        one_session_v3(|w| {
            w.u32(3).u32(1).u32(1000).out.extend_from_slice(&[b'x'; 40]);
        }),
        "sessions[0].client_id at offset 32 needs 1000 bytes",
    ));
    cases.push(case(
        "client-id-invalid-utf8",
        one_session_v3(|w| {
            w.u32(3).u32(1).bytes(b"ab\xff");
            w.str("p")
                .str("1")
                .u16(1)
                .u32(0)
                .u32(0)
                .u32(0)
                .u32(0)
                .u32(0);
        }),
        "sessions[0].client_id at offset 38 is not valid UTF-8",
    ));
    cases.push(case(
        "topic-invalid-utf8",
        one_session_v3(|w| {
            w.u32(3).u32(0).u32(1).bytes(b"\xc3(").bytes(b"").u8(0);
        }),
        "retained[0].topic at offset 40 is not valid UTF-8",
    ));
    cases.push(case(
        "client-id-empty",
        one_session_v3(|w| {
            w.u32(3).u32(1).str("");
            w.str("p")
                .str("1")
                .u16(1)
                .u32(0)
                .u32(0)
                .u32(0)
                .u32(0)
                .u32(0);
        }),
        "sessions[0].client_id at offset 32 is empty",
    ));
    cases.push(case(
        "duplicate-client-id",
        one_session_v3(|w| {
            w.u32(3).u32(2);
            for _ in 0..2 {
                session_head(w, "dup");
                w.u32(0).u32(0).u32(0).u32(0);
            }
            w.u32(0);
        }),
        "client id \"dup\" appears twice",
    ));
    cases.push(case(
        "inbound-zero-packet-id",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0).u32(1).u16(0).u32(0).u32(0).u32(0);
        }),
        "sessions[0].inbound_qos2[0] at offset",
    ));
    cases.push(case(
        "inbound-duplicate-packet-id",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0).u32(2).u16(5).u16(5).u32(0).u32(0).u32(0);
        }),
        "packet id 5 appears twice",
    ));
    cases.push(case(
        "inflight-zero-packet-id",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0).u32(0).u32(1).u16(0).u8(3).u32(0).u32(0);
        }),
        "sessions[0].inflight[0].packet_id at offset",
    ));
    cases.push(case(
        "inflight-duplicate-packet-id",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0)
                .u32(0)
                .u32(2)
                .u16(9)
                .u8(3)
                .u16(9)
                .u8(3)
                .u32(0)
                .u32(0);
        }),
        "sessions[0].inflight[1].packet_id",
    ));
    for phase in [0u8, 4] {
        cases.push(case(
            &format!("inflight-phase-{phase}"),
            one_session_v3(|w| {
                w.u32(3).u32(1);
                session_head(w, "c");
                w.u32(0).u32(0).u32(1).u16(9).u8(phase).u32(0).u32(0);
            }),
            &format!("sessions[0].inflight[0].phase at offset 66 is {phase}"),
        ));
    }
    cases.push(case(
        "phase-1-with-qos-2",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0).u32(0).u32(1).u16(9).u8(1).msg3("t", b"x", 0, 2);
            w.u32(0).u32(0);
        }),
        "does not match phase 1",
    ));
    cases.push(case(
        "phase-2-with-qos-1",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0).u32(0).u32(1).u16(9).u8(2).msg3("t", b"x", 0, 1);
            w.u32(0).u32(0);
        }),
        "does not match phase 2",
    ));
    // Phase 3 says no message follows, so a message written after it is
    // read as what comes next: here its topic length reads as the pending
    // count, far larger than the bytes left.
    cases.push(case(
        "phase-3-carrying-a-message",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0)
                .u32(0)
                .u32(1)
                .u16(9)
                .u8(3)
                .msg3("topic/x", b"payload", 0, 1);
            w.u32(0).u32(0);
        }),
        "sessions[0].pending count at offset 67 is 7",
    ));
    // Phase 2 says a message follows: the pending and retained counts are
    // read as its topic, which is then empty.
    cases.push(case(
        "phase-2-without-a-message",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0).u32(0).u32(1).u16(9).u8(2).u32(0).u32(0);
        }),
        "sessions[0].inflight[0].message.topic at offset 67 is empty",
    ));
    cases.push(case(
        "v3-subscription-qos-3",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(1).str("a/#").u8(3).u32(0).u32(0).u32(0).u32(0);
        }),
        "sessions[0].subscriptions[0].qos at offset 63 is QoS 3; version 3 allows 0..=2",
    ));
    cases.push(case(
        "v3-pending-qos-0",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0).u32(0).u32(0).u32(1).msg3("t", b"", 0, 0).u32(0);
        }),
        "sessions[0].pending[0].qos at offset 78 is QoS 0; version 3 allows 1..=2",
    ));
    cases.push(case(
        "v3-retained-qos-3",
        one_session_v3(|w| {
            w.u32(3).u32(0).u32(1).str("t").bytes(b"").u8(3);
        }),
        "retained[0].qos at offset 45 is QoS 3; version 3 allows 0..=2",
    ));
    cases.push(case(
        "retain-flag-2",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(0).u32(0).u32(0).u32(1).msg3("t", b"", 2, 1).u32(0);
        }),
        "sessions[0].pending[0].retain at offset 77 is 2",
    ));
    for (name, text) in [
        ("negative", "-5"),
        ("word", "abc"),
        ("empty", ""),
        ("leading-zero", "01"),
        ("overflow", "18446744073709551616"),
    ] {
        cases.push(case(
            &format!("detach-{name}"),
            one_session_v3(|w| {
                w.u32(3).u32(1).str("c").str("p").str(text).u16(1);
                w.u32(0).u32(0).u32(0).u32(0).u32(0);
            }),
            &format!("sessions[0].detach at offset 42 is {text:?}, not a nonnegative decimal"),
        ));
    }
    cases.push(case(
        "duplicate-subscription",
        one_session_v3(|w| {
            w.u32(3).u32(1);
            session_head(w, "c");
            w.u32(2).str("a/#").u8(0).str("a/#").u8(1);
            w.u32(0).u32(0).u32(0).u32(0);
        }),
        "filter \"a/#\" appears twice",
    ));
    cases.push(case(
        "duplicate-retained-topic",
        one_session_v3(|w| {
            w.u32(3).u32(0).u32(2);
            w.str("t").bytes(b"1").u8(0).str("t").bytes(b"2").u8(1);
        }),
        "retained topic \"t\" appears twice",
    ));
    cases.push(case(
        "leftover-after-retained",
        one_session_v3(|w| {
            w.u32(3).u32(0).u32(0).u8(0).u8(0).u8(0);
        }),
        "3 bytes left over at offset 36 after the retained list",
    ));
    // Legacy versions' QoS limits.
    let mut w = Raw::new();
    w.u32(2).u32(1).str("c").str("p").str("5").u16(1);
    w.u32(1).str("a").u8(2).u32(0).u32(0).u32(0);
    cases.push(case(
        "v2-subscription-qos-2",
        w.seal(2),
        "sessions[0].subscriptions[0].qos at offset 58 is QoS 2; version 2 allows 0..=1",
    ));
    let mut w = Raw::new();
    w.u32(1).u32(0).u32(1).str("t").bytes(b"").u8(2);
    cases.push(case(
        "v1-retained-qos-2",
        w.seal(1),
        "retained[0].qos at offset 45 is QoS 2; version 1 allows 0..=1",
    ));
    let mut w = Raw::new();
    w.u32(1).u32(1).str("c").u16(1).u32(0).u32(2);
    w.u16(4)
        .msg_legacy("t", b"", 0)
        .u16(4)
        .msg_legacy("t", b"", 0);
    w.u32(0).u32(0);
    cases.push(case(
        "v1-inflight-duplicate-packet-id",
        w.seal(1),
        "sessions[0].inflight[1].packet_id at offset",
    ));
    // A V3 payload under a V2 envelope: the model version says so first.
    let mut b = v3.clone();
    b[9] = 2;
    cases.push(case(
        "v3-payload-in-v2-envelope",
        b,
        "does not match envelope version 2",
    ));
    cases
}

#[test]
fn damaged_corpus_is_refused_by_name() {
    let dir = fixtures().join("damaged/mbmqtt");
    let cases = corpus();
    let mut names = BTreeSet::new();
    let mut expected = String::from(
        "# file\texit code\tsubstring of the refusal (`saguin snapshot verify`); written by format/tests/mbmqtt_golden.rs\n",
    );
    for c in &cases {
        assert!(names.insert(c.name.clone()), "duplicate case {}", c.name);
        let err = decode(&c.bytes).expect_err(&c.name);
        // The refusal from the library names the problem. A file without
        // the magic is reported by the command as not a snapshot at all, so
        // its library message differs only there.
        let message = err.to_string();
        assert!(
            message.contains(&c.expect),
            "{}: {message:?} does not contain {:?}",
            c.name,
            c.expect
        );
        golden(&dir.join(&c.name), &c.bytes);
        expected.push_str(&format!("{}\t1\t{}\n", c.name, c.expect));
    }
    golden(&dir.join("EXPECTED"), expected.as_bytes());
    if !blessing() {
        // No stale file left behind that nothing checks.
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            assert!(
                name == "EXPECTED" || names.contains(&name),
                "{name} in {} is not produced by this test",
                dir.display()
            );
        }
    }
}

#[test]
fn every_refusal_code_is_in_the_corpus() {
    let codes: BTreeSet<&str> = corpus()
        .iter()
        .map(|c| decode(&c.bytes).unwrap_err().code())
        .collect();
    for code in [
        "empty",
        "shorter-than-envelope",
        "wrong-magic",
        "unknown-version",
        "nonzero-flags",
        "truncated",
        "trailing-bytes",
        "crc-mismatch",
        "model-version-mismatch",
        "unexpected-end",
        "count-too-large",
        "invalid-utf8",
        "empty-string",
        "duplicate-client-id",
        "zero-packet-id",
        "duplicate-packet-id",
        "unknown-phase",
        "phase-qos-mismatch",
        "qos-out-of-range",
        "retain-out-of-range",
        "invalid-detach",
        "duplicate-subscription",
        "duplicate-retained-topic",
        "leftover-bytes",
    ] {
        assert!(codes.contains(code), "no damaged file exercises {code}");
    }
}
