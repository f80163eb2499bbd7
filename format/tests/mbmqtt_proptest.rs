//! Properties of the MBMQTT01 codec: what the encoder writes decodes to the
//! same model; any single bit flip or truncation of a valid file is refused
//! (never accepted, never a panic); arbitrary bytes never panic.

mod mbmqtt_support;

use std::collections::BTreeSet;

use proptest::prelude::*;
use saguin_format::mbmqtt::{
    decode, encode, Detach, Inflight, Message, Phase, Principal, RetainedMessage, Session,
    Snapshot, Subscription,
};

fn text() -> impl Strategy<Value = String> {
    // Non-ASCII included: lengths are bytes, not characters.
    "[a-z0-9/+#é€]{1,12}"
}

fn message() -> impl Strategy<Value = Message> {
    (
        text(),
        proptest::collection::vec(any::<u8>(), 0..24),
        any::<bool>(),
        1u8..=2,
    )
        .prop_map(|(topic, payload, retain, qos)| Message {
            topic,
            payload,
            retain,
            qos,
        })
}

fn inflight() -> impl Strategy<Value = (Phase, Option<Message>)> {
    prop_oneof![
        message().prop_map(|m| {
            let phase = if m.qos == 1 {
                Phase::AwaitPuback
            } else {
                Phase::AwaitPubrec
            };
            (phase, Some(m))
        }),
        Just((Phase::AwaitPubcomp, None)),
    ]
}

fn session() -> impl Strategy<Value = Session> {
    (
        text(),
        ".{0,8}",
        any::<u64>(),
        any::<u16>(),
        proptest::collection::btree_map(text(), 0u8..=2, 0..4),
        proptest::collection::btree_set(1u16.., 0..4),
        proptest::collection::btree_map(1u16.., inflight(), 0..4),
        proptest::collection::vec(message(), 0..4),
    )
        .prop_map(
            |(client_id, principal, detach, next, subs, inbound, inflight, pending)| Session {
                client_id,
                principal: Principal::Named(principal),
                detach: Detach::Millis(detach),
                next_packet_id: next,
                subscriptions: subs
                    .into_iter()
                    .map(|(filter, qos)| Subscription { filter, qos })
                    .collect(),
                inbound_qos2: inbound.into_iter().rev().collect(),
                inflight: inflight
                    .into_iter()
                    .map(|(packet_id, (phase, message))| Inflight {
                        packet_id,
                        phase,
                        message,
                    })
                    .collect(),
                pending,
            },
        )
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (
        proptest::collection::vec(session(), 0..4),
        proptest::collection::btree_map(
            text(),
            (proptest::collection::vec(any::<u8>(), 0..16), 0u8..=2),
            0..4,
        ),
    )
        .prop_map(|(sessions, retained)| {
            // Client ids are unique in a valid file.
            let mut seen = BTreeSet::new();
            let sessions = sessions
                .into_iter()
                .filter(|s| seen.insert(s.client_id.clone()))
                .collect();
            Snapshot {
                version_read: 3,
                sessions,
                retained: retained
                    .into_iter()
                    .map(|(topic, (payload, qos))| RetainedMessage {
                        topic,
                        payload,
                        qos,
                    })
                    .collect(),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn encode_then_decode_is_identity(s in snapshot()) {
        let bytes = encode(&s).unwrap();
        prop_assert_eq!(decode(&bytes).unwrap(), s.clone());
        // And the encoding is canonical: writing it again gives the same bytes.
        prop_assert_eq!(encode(&decode(&bytes).unwrap()).unwrap(), bytes);
    }

    #[test]
    fn any_single_bit_flip_is_refused(s in snapshot(), pick in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = encode(&s).unwrap();
        let at = pick.index(bytes.len());
        bytes[at] ^= 1 << bit;
        prop_assert!(decode(&bytes).is_err(), "flip of bit {} at {} accepted", bit, at);
    }

    #[test]
    fn any_truncation_is_refused(s in snapshot(), pick in any::<prop::sample::Index>()) {
        let bytes = encode(&s).unwrap();
        let cut = pick.index(bytes.len());
        prop_assert!(decode(&bytes[..cut]).is_err(), "cut at {} accepted", cut);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
    }

    /// Arbitrary payloads under a valid envelope reach the payload decoder
    /// (the CRC matches), which must refuse or accept without panicking, and
    /// anything it accepts must encode back to the same bytes (V3).
    #[test]
    fn arbitrary_sealed_payloads_never_panic(version in 1u16..=3, mut payload in proptest::collection::vec(any::<u8>(), 0..200)) {
        if payload.len() >= 4 {
            payload[..4].copy_from_slice(&u32::from(version).to_be_bytes());
        }
        let file = mbmqtt_support::Raw { out: payload, marks: vec![] }.seal(version);
        if let Ok(s) = decode(&file) {
            if version == 3 {
                prop_assert_eq!(encode(&s).unwrap(), file);
            }
        }
    }
}
