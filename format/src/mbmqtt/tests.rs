use super::decode::parse_detach;
use super::*;

fn sample() -> Snapshot {
    Snapshot {
        version_read: 3,
        sessions: vec![Session {
            client_id: "c1".into(),
            principal: Principal::Named("alice".into()),
            detach: Detach::Millis(1_700_000_000_000),
            next_packet_id: 7,
            subscriptions: vec![Subscription {
                filter: "a/#".into(),
                qos: 2,
            }],
            inbound_qos2: vec![3, 4],
            inflight: vec![
                Inflight {
                    packet_id: 5,
                    phase: Phase::AwaitPubrec,
                    message: Some(Message {
                        topic: "a/b".into(),
                        payload: b"x".to_vec(),
                        retain: false,
                        qos: 2,
                    }),
                },
                Inflight {
                    packet_id: 6,
                    phase: Phase::AwaitPubcomp,
                    message: None,
                },
            ],
            pending: vec![],
        }],
        retained: vec![RetainedMessage {
            topic: "r".into(),
            payload: vec![],
            qos: 0,
        }],
    }
}

#[test]
fn round_trip() {
    let s = sample();
    let bytes = encode(&s).unwrap();
    assert!(has_magic(&bytes));
    assert_eq!(decode(&bytes).unwrap(), s);
}

#[test]
fn detach_is_canonical_decimal() {
    assert_eq!(parse_detach("0"), Some(0));
    assert_eq!(parse_detach("18446744073709551615"), Some(u64::MAX));
    for bad in [
        "",
        "-1",
        "+1",
        "01",
        "1.5",
        " 1",
        "18446744073709551616",
        "١",
    ] {
        assert_eq!(parse_detach(bad), None, "{bad:?}");
    }
}

#[test]
fn envelope_refusals_in_order() {
    assert_eq!(decode(b""), Err(DecodeError::Empty));
    assert_eq!(
        decode(b"MBMQTT01"),
        Err(DecodeError::ShorterThanEnvelope { len: 8 })
    );
    let good = encode(&sample()).unwrap();
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(decode(&bad).unwrap_err().code(), "wrong-magic");
    let mut bad = good.clone();
    bad[9] = 4;
    assert_eq!(
        decode(&bad),
        Err(DecodeError::UnknownVersion { version: 4 })
    );
    let mut bad = good.clone();
    bad[11] = 1;
    assert_eq!(decode(&bad), Err(DecodeError::NonzeroFlags { flags: 1 }));
    let bad = &good[..good.len() - 1];
    assert_eq!(decode(bad).unwrap_err().code(), "truncated");
    let mut bad = good.clone();
    bad.push(0);
    assert_eq!(decode(&bad).unwrap_err().code(), "trailing-bytes");
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert_eq!(decode(&bad).unwrap_err().code(), "crc-mismatch");
}

#[test]
fn encoder_refuses_what_v3_cannot_say() {
    let mut s = sample();
    s.sessions[0].inflight[1].message = s.sessions[0].inflight[0].message.clone();
    assert!(matches!(
        encode(&s),
        Err(EncodeError::Phase3WithMessage { packet_id: 6, .. })
    ));
    let mut s = sample();
    s.sessions[0].inflight[0].message = None;
    assert!(matches!(
        encode(&s),
        Err(EncodeError::MessageMissing { phase: 2, .. })
    ));
    let mut s = sample();
    s.sessions[0].principal = Principal::LegacyAnonymous;
    assert!(matches!(
        encode(&s),
        Err(EncodeError::LegacyAnonymousPrincipal { .. })
    ));
    let mut s = sample();
    s.sessions[0].detach = Detach::Unknown;
    assert!(matches!(encode(&s), Err(EncodeError::UnknownDetach { .. })));
    let mut s = sample();
    s.sessions[0].inbound_qos2 = vec![3, 3];
    assert!(matches!(
        encode(&s),
        Err(EncodeError::Invalid(DecodeError::DuplicatePacketId { .. }))
    ));
}
