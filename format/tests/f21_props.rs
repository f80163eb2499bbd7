//! Properties of the format 21 codec over generated content: what is
//! encoded decodes to itself; any single bit flip or truncation of a valid
//! file is refused; no mutation of a resealed file makes the decoder panic.

use bytes::Bytes;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use saguin_format::f21::*;
use saguin_format::model::{ChannelKind, PublishProps, Record, UserProperty};

fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9/+#]{0,12}", "\\PC{0,6}", Just(String::new()),]
}

/// A topic a message can be published to: nonempty, no `+` or `#`.
fn topic() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9/]{1,12}", "[^+#\\x00]{1,6}"]
}

fn nonempty_text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9é_-]{1,10}"
}

fn payload() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..48).prop_map(Bytes::from)
}

fn props() -> impl Strategy<Value = PublishProps> {
    (
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(payload()),
        proptest::option::of(0u8..=1),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(|(ct, rt, cd, pfi, mei)| PublishProps {
            content_type: ct,
            response_topic: rt,
            correlation_data: cd,
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
        })
}

fn user_properties() -> impl Strategy<Value = Vec<UserProperty>> {
    proptest::collection::vec(
        (text(), text()).prop_map(|(name, value)| UserProperty { name, value }),
        0..4,
    )
}

/// A record valid anywhere but the broadcast log (no shared_copy/owed_to);
/// the offset is assigned by the container.
fn record() -> impl Strategy<Value = Record> {
    (
        (
            any::<[u8; 16]>(),
            topic(),
            any::<i64>(),
            user_properties(),
            payload(),
        ),
        (
            props(),
            any::<bool>(),
            proptest::option::of(text()),
            text(),
            0u8..=2,
        ),
    )
        .prop_map(
            |(
                (message_id, topic, timestamp, user_properties, payload),
                (props, retain, bridge, client_id, qos),
            )| Record {
                offset: 0,
                message_id,
                topic,
                timestamp,
                user_properties,
                payload,
                props: props.into(),
                retain,
                bridge,
                client_id,
                qos,
                shared_copy: false,
                owed_to: None,
            },
        )
}

/// `records` at ascending offsets from `floor`, with gaps; returns next.
fn place(records: &mut [Record], floor: u64, gaps: &[u64]) -> u64 {
    let mut at = floor;
    for (i, r) in records.iter_mut().enumerate() {
        at += gaps.get(i).copied().unwrap_or(0);
        r.offset = at;
        at += 1;
    }
    at
}

fn positions(next: u64, seed: Vec<(bool, u64, i64, u32)>) -> Vec<Position> {
    seed.into_iter()
        .enumerate()
        .map(|(i, (bridge, offset, saved_at, expiry))| Position {
            reader: if bridge {
                format!("bridge:b{i}")
            } else {
                format!("mqtt:c{i}")
            },
            offset: offset % (next + 1),
            saved_at,
            session_expiry: (!bridge).then_some(expiry),
        })
        .collect()
}

fn position_seed() -> impl Strategy<Value = Vec<(bool, u64, i64, u32)>> {
    proptest::collection::vec(
        (any::<bool>(), any::<u64>(), any::<i64>(), any::<u32>()),
        0..4,
    )
}

fn held() -> impl Strategy<Value = Vec<HeldPublish>> {
    proptest::collection::vec((record(), any::<i64>()), 0..3).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (mut record, held_at))| {
                record.qos = 2;
                HeldPublish {
                    client_id: format!("client-{}", i % 2),
                    packet_id: i as u16 + 1,
                    held_at,
                    record,
                }
            })
            .collect()
    })
}

prop_compose! {
    fn channel()(
        kind in prop_oneof![Just(ChannelKind::Append), Just(ChannelKind::Latest), Just(ChannelKind::Queue)],
        name in nonempty_text(),
        floor in 1u64..1_000_000,
        extra_next in 0u64..3,
        mut records in proptest::collection::vec(record(), 0..6),
        gaps in proptest::collection::vec(0u64..3, 0..6),
        deliveries in proptest::collection::vec((any::<u32>(), any::<i64>(), any::<i64>()), 6),
        pos in position_seed(),
        held in held(),
        bytes in any::<u64>(),
        dlq in proptest::option::of((1u64..100, proptest::collection::vec(record(), 0..3), position_seed())),
    ) -> ChannelFile {
        if kind == ChannelKind::Latest {
            for (i, r) in records.iter_mut().enumerate() {
                r.topic = format!("{}/{i}", r.topic);
            }
        }
        // An append channel holds a record at every offset of
        // [floor, next): no gaps, and nothing missing below next.
        let next = if kind == ChannelKind::Append {
            place(&mut records, floor, &[])
        } else {
            place(&mut records, floor, &gaps) + extra_next
        };
        let mut c = ChannelFile::new(name, kind);
        c.floor = floor;
        c.next = next;
        c.bytes = bytes;
        c.positions = positions(next, pos);
        c.held = held;
        if kind == ChannelKind::Queue {
            c.items = records
                .into_iter()
                .zip(deliveries)
                .map(|(record, (attempts, first, last))| QueueItem {
                    record,
                    attempts,
                    first_delivered: first,
                    last_delivered: if first == 0 { 0 } else { last },
                })
                .collect();
            c.dead_letter = dlq.map(|(dfloor, mut drecords, dpos)| {
                let dnext = place(&mut drecords, dfloor, &[]);
                DeadLetter {
                    name: DeadLetter::name_for(&c.name),
                    next: dnext,
                    floor: dfloor,
                    bytes: drecords.iter().map(Record::accounted_size).sum(),
                    records: drecords,
                    positions: positions(dnext, dpos),
                }
            });
        } else {
            c.records = records;
        }
        c
    }
}

fn manifest() -> impl Strategy<Value = Manifest> {
    (
        any::<i64>(),
        proptest::collection::vec((nonempty_text(), 0u8..3), 0..5),
        any::<[bool; 3]>(),
    )
        .prop_map(
            |(began_at, channels, [retained, sessions, broadcast])| Manifest {
                began_at,
                channels: channels
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, kind))| {
                        let channel = format!("{name}.{i}");
                        ManifestEntry {
                            file_name: saguin_format::channel_name::encode_file_name(&channel),
                            channel,
                            kind: [ChannelKind::Append, ChannelKind::Latest, ChannelKind::Queue]
                                [kind as usize],
                        }
                    })
                    .collect(),
                retained,
                sessions,
                broadcast,
            },
        )
}

fn retained() -> impl Strategy<Value = RetainedFile> {
    proptest::collection::vec((record(), any::<u64>()), 0..5).prop_map(|v| RetainedFile {
        records: v
            .into_iter()
            .enumerate()
            .map(|(i, (mut r, offset))| {
                r.topic = format!("{}~{i}", r.topic);
                r.offset = offset;
                r
            })
            .collect(),
    })
}

fn will() -> impl Strategy<Value = Will> {
    (
        topic(),
        payload(),
        0u8..=2,
        any::<bool>(),
        any::<u32>(),
        props(),
        user_properties(),
    )
        .prop_map(
            |(topic, payload, qos, retain, delay_interval, props, user_properties)| Will {
                topic,
                payload,
                qos,
                retain,
                delay_interval,
                props,
                user_properties,
            },
        )
}

/// qos, no_local, retain_as_published, retain_handling, id, log offset.
type SubscriptionSeed = (u8, bool, bool, u8, Option<u32>, u64);
/// log offset, QoS 2, awaiting PUBCOMP, handed over by a group.
type InflightSeed = (u64, bool, bool, bool);
type SessionSeed = (
    Option<String>,
    u32,
    i64,
    Option<Will>,
    Vec<SubscriptionSeed>,
    Vec<InflightSeed>,
    u16,
);

fn session_parts() -> impl Strategy<Value = SessionSeed> {
    (
        proptest::option::of(text()),
        any::<u32>(),
        any::<i64>(),
        proptest::option::of(will()),
        proptest::collection::vec(
            (
                0u8..=2,
                any::<bool>(),
                any::<bool>(),
                0u8..=2,
                proptest::option::of(1u32..=268_435_455),
                any::<u64>(),
            ),
            0..4,
        ),
        proptest::collection::vec(
            (any::<u64>(), any::<bool>(), any::<bool>(), any::<bool>()),
            0..5,
        ),
        0u16..100,
    )
}

prop_compose! {
    fn sessions()(
        parts in proptest::collection::vec(session_parts(), 0..4),
        groups in proptest::collection::vec((nonempty_text(), any::<u64>(), proptest::collection::vec(any::<u64>(), 0..3)), 0..3),
    ) -> SessionsFile {
        let shared_groups: Vec<SharedGroup> = groups
            .into_iter()
            .enumerate()
            .map(|(i, (group, cursor, mut returned))| {
                returned.sort_unstable();
                returned.dedup();
                SharedGroup { key: SharedGroupKey { group, filter: format!("f/{i}") }, cursor, returned }
            })
            .collect();
        let sessions = parts
            .into_iter()
            .enumerate()
            .map(|(i, (principal, expiry_interval, detached_at, will, subs, inflight, extra_window))| {
                let inflight: Vec<InflightEntry> = inflight
                    .into_iter()
                    .enumerate()
                    .map(|(j, (offset, qos2, comp, shared))| InflightEntry {
                        log_offset: offset.wrapping_add(j as u64) / 8 * 8 + j as u64,
                        packet_id: j as u16 + 1,
                        qos: if qos2 { 2 } else { 1 },
                        phase: if qos2 && comp { InflightPhase::AwaitingComp } else { InflightPhase::AwaitingAck },
                        shared_group: if shared { shared_groups.first().map(|g| g.key.clone()) } else { None },
                    })
                    .collect();
                Session {
                    client_id: format!("client-{i}"),
                    principal,
                    expiry_interval,
                    detached_at,
                    subscriptions: subs
                        .into_iter()
                        .enumerate()
                        .map(|(j, (qos, no_local, rap, rh, id, log_offset))| Subscription {
                            filter: format!("s/{j}/#"),
                            qos,
                            no_local,
                            retain_as_published: rap,
                            retain_handling: rh,
                            subscription_id: id,
                            log_offset,
                        })
                        .collect(),
                    will,
                    window: (inflight.len() as u16).saturating_add(extra_window).max(1),
                    inflight,
                }
            })
            .collect();
        SessionsFile { sessions, shared_groups }
    }
}

prop_compose! {
    fn broadcast()(
        floor in 1u64..1000,
        mut messages in proptest::collection::vec((record(), any::<bool>(), proptest::option::of(text())), 0..6),
        gaps in proptest::collection::vec(0u64..5, 0..6),
        cursors in proptest::collection::vec(any::<u64>(), 0..4),
        held in held(),
        bytes in any::<u64>(),
    ) -> BroadcastFile {
        let mut records: Vec<Record> = messages
            .iter_mut()
            .map(|(r, shared, owed)| {
                let mut r = r.clone();
                r.shared_copy = *shared;
                r.owed_to = owed.take();
                r
            })
            .collect();
        let next = place(&mut records, floor, &gaps);
        BroadcastFile {
            next,
            floor,
            bytes,
            messages: records,
            cursors: cursors
                .into_iter()
                .enumerate()
                .map(|(i, o)| Position { reader: format!("mqtt:client-{i}"), offset: o % (next + 1), saved_at: o as i64, session_expiry: None })
                .collect(),
            held,
        }
    }
}

fn generation() -> impl Strategy<Value = Generation> {
    (
        1u64..1_000,
        any::<i64>(),
        proptest::collection::vec(
            (
                nonempty_text(),
                any::<u64>(),
                any::<i64>(),
                49u64..,
                any::<u32>(),
                any::<bool>(),
            ),
            0..5,
        ),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(generation, captured_at, channels, retained, sessions)| {
            use saguin_format::channel_name::{
                encode_file_name, generation_file_name, BROADCAST_FILE, RETAINED_FILE,
                SESSIONS_FILE,
            };
            let file = |kind,
                        channel: String,
                        base: String,
                        seed: u64,
                        written_at,
                        length,
                        checksum,
                        behind| {
                // Generation 0 is a file a build before generations wrote,
                // under its fixed name.
                let of = seed % (generation + 1);
                GenerationFile {
                    kind,
                    channel,
                    file_name: if of == 0 {
                        base.clone()
                    } else {
                        generation_file_name(&base, of)
                    },
                    generation: of,
                    written_at,
                    length,
                    checksum,
                    behind,
                }
            };
            let mut files: Vec<GenerationFile> = channels
                .into_iter()
                .enumerate()
                .map(|(i, (name, seed, at, length, checksum, behind))| {
                    let channel = format!("{name}.{i}");
                    let base = encode_file_name(&channel);
                    file(
                        FileKind::Channel,
                        channel,
                        base,
                        seed,
                        at,
                        length,
                        checksum,
                        behind,
                    )
                })
                .collect();
            if retained {
                files.push(file(
                    FileKind::Retained,
                    String::new(),
                    RETAINED_FILE.into(),
                    generation,
                    captured_at,
                    53,
                    7,
                    false,
                ));
            }
            if sessions {
                files.push(file(
                    FileKind::Broadcast,
                    String::new(),
                    BROADCAST_FILE.into(),
                    generation,
                    captured_at,
                    80,
                    8,
                    false,
                ));
                files.push(file(
                    FileKind::Sessions,
                    String::new(),
                    SESSIONS_FILE.into(),
                    generation,
                    captured_at,
                    60,
                    9,
                    false,
                ));
            }
            Generation {
                generation,
                captured_at,
                files,
            }
        })
}

fn snapshot_file() -> impl Strategy<Value = SnapshotFile> {
    prop_oneof![
        3 => channel().prop_map(SnapshotFile::Channel),
        1 => manifest().prop_map(SnapshotFile::Manifest),
        1 => generation().prop_map(SnapshotFile::Generation),
        1 => retained().prop_map(SnapshotFile::Retained),
        2 => sessions().prop_map(SnapshotFile::Sessions),
        2 => broadcast().prop_map(SnapshotFile::Broadcast),
    ]
}

fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
    let end = bytes.len() - TRAILER_LEN;
    let crc = crc32c::crc32c(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn what_is_encoded_decodes_to_itself(file in snapshot_file(), written_at in any::<i64>(), writer in "[0-9a-f]{0,24}") {
        validate(&file).map_err(|e| TestCaseError::fail(format!("the generator made an invalid file: {e}")))?;
        let bytes = encode_with_writer(&file, &writer, written_at);
        let (header, decoded) = decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(header.format_version, FORMAT_VERSION);
        prop_assert_eq!(header.writer, writer);
        prop_assert_eq!(header.written_at, written_at);
        prop_assert_eq!(header.kind, file.kind().as_byte());
        prop_assert_eq!(&decoded, &file);
        let (_, shared) = decode_bytes(Bytes::from(bytes)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(shared, file);
    }

    /// A sessions file written from its parts as a writer holds them (each
    /// session behind a handle) is the file's bytes, checked the same,
    /// alone and beside a log: a second session of one client is refused
    /// by both.
    #[test]
    fn a_sessions_file_from_its_parts_is_the_files_bytes(file in sessions(), written_at in any::<i64>(), next in any::<u64>()) {
        let handles: Vec<std::sync::Arc<Session>> =
            file.sessions.iter().cloned().map(std::sync::Arc::new).collect();
        prop_assert_eq!(
            encode_sessions_of(&handles, &file.shared_groups, written_at),
            encode(&SnapshotFile::Sessions(file.clone()), written_at)
        );
        prop_assert!(validate_sessions_of(&handles, &file.shared_groups).is_ok());
        let log = BroadcastFile { next, ..BroadcastFile::default() };
        prop_assert_eq!(
            validate_pair_of(&handles, &file.shared_groups, next).map_err(|e| e.to_string()),
            validate_pair(&file, &log).map_err(|e| e.to_string())
        );
        if let Some(first) = handles.first() {
            let twice = [first.clone(), first.clone()];
            let whole = SnapshotFile::Sessions(SessionsFile {
                sessions: vec![Session::clone(first), Session::clone(first)],
                shared_groups: file.shared_groups.clone(),
            });
            prop_assert_eq!(
                validate_sessions_of(&twice, &file.shared_groups).map_err(|e| e.to_string()),
                validate(&whole).map_err(|e| e.to_string())
            );
            prop_assert!(validate_sessions_of(&twice, &file.shared_groups).is_err());
        }
    }

    #[test]
    fn any_single_bit_flip_is_refused(file in snapshot_file(), bit in any::<prop::sample::Index>()) {
        let mut bytes = encode(&file, 1);
        let at = bit.index(bytes.len() * 8);
        bytes[at / 8] ^= 1 << (at % 8);
        prop_assert!(decode(&bytes).is_err(), "bit {} flipped and the file still decoded", at);
    }

    #[test]
    fn any_truncation_is_refused(file in snapshot_file(), cut in any::<prop::sample::Index>()) {
        let bytes = encode(&file, 1);
        let len = cut.index(bytes.len());
        prop_assert!(decode(&bytes[..len]).is_err(), "cut to {} bytes and still decoded", len);
    }

    /// Mutations behind a valid checksum reach every parse and validation
    /// path; the decoder may accept or refuse, never panic.
    #[test]
    fn resealed_mutations_never_panic(
        file in snapshot_file(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = encode(&file, 1);
        let body = bytes.len() - HEADER_LEN - TRAILER_LEN;
        if body > 0 {
            for (at, value) in edits {
                let i = HEADER_LEN + at.index(body);
                bytes[i] = value;
            }
        }
        let _ = decode(&reseal(bytes));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
        let _ = read_header(&bytes);
        let mut with_header = encode(&SnapshotFile::Retained(RetainedFile::default()), 0);
        with_header.truncate(HEADER_LEN);
        with_header.extend_from_slice(&bytes);
        with_header.extend_from_slice(&[0; 4]);
        let _ = decode(&reseal(with_header));
    }
}

#[test]
fn every_truncation_of_every_fixture_kind_is_refused() {
    // Deterministic companion to the property: every length, every kind.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..8 {
        let file = snapshot_file()
            .new_tree(&mut runner)
            .expect("generate")
            .current();
        let bytes = encode(&file, 7);
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len]).is_err(),
                "{:?} cut to {len} bytes decoded",
                file.kind()
            );
        }
    }
}
