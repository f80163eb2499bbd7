use bytes::Bytes;
use saguin_format::f21::{self, InflightPhase};
use saguin_format::mbmqtt::{self, Detach, Inflight, Message, Phase, Principal};
use saguin_format::model::Record;

use super::*;

#[test]
fn counts_name_every_difference() {
    let a = Counts {
        next: 5,
        records: 4,
        ..Counts::default()
    };
    let b = Counts {
        next: 5,
        records: 3,
        positions: 1,
        ..Counts::default()
    };
    assert_eq!(
        a.differences(&b),
        ["records: 4 in, 3 out", "positions: 0 in, 1 out"]
    );
    assert!(a.differences(&a).is_empty());
}

#[test]
fn retained_offsets_are_kept_when_they_order_and_renumbered_when_not() {
    let mut a = Record::new("a", "1");
    let mut b = Record::new("b", "2");
    a.offset = 3;
    b.offset = 9;
    let kept = crate::storage::sqlite::units::retained_offsets(&[a.clone(), b.clone()]);
    assert_eq!((kept[0].offset, kept[1].offset), (3, 9));
    // In topic order, a store's offsets need not ascend.
    let kept = crate::storage::sqlite::units::retained_offsets(&[b.clone(), a.clone()]);
    assert_eq!((kept[0].offset, kept[1].offset), (9, 3));
    b.offset = 3;
    let twice = crate::storage::sqlite::units::retained_offsets(&[a.clone(), b.clone()]);
    assert_eq!((twice[0].offset, twice[1].offset), (1, 2));
    a.offset = 0;
    b.offset = 0;
    let fresh = crate::storage::sqlite::units::retained_offsets(&[a, b]);
    assert_eq!((fresh[0].offset, fresh[1].offset), (1, 2));
}

fn message(topic: &str, qos: u8) -> Message {
    Message {
        topic: topic.into(),
        payload: b"p".to_vec(),
        retain: false,
        qos,
    }
}

#[test]
fn an_mbmqtt_session_becomes_owed_messages_inflight_entries_and_a_cursor() {
    let snapshot = mbmqtt::Snapshot {
        version_read: 1,
        sessions: vec![
            mbmqtt::Session {
                client_id: "old".into(),
                principal: Principal::LegacyAnonymous,
                detach: Detach::Unknown,
                next_packet_id: 9,
                subscriptions: vec![mbmqtt::Subscription {
                    filter: "a/#".into(),
                    qos: 1,
                }],
                inbound_qos2: vec![4],
                inflight: vec![
                    Inflight {
                        packet_id: 1,
                        phase: Phase::AwaitPuback,
                        message: Some(message("a/1", 1)),
                    },
                    Inflight {
                        packet_id: 2,
                        phase: Phase::AwaitPubcomp,
                        message: None,
                    },
                ],
                pending: vec![message("a/2", 1)],
            },
            mbmqtt::Session {
                client_id: "idle".into(),
                principal: Principal::Named("ops".into()),
                detach: Detach::Millis(1_000),
                next_packet_id: 1,
                subscriptions: Vec::new(),
                inbound_qos2: Vec::new(),
                inflight: Vec::new(),
                pending: Vec::new(),
            },
        ],
        retained: vec![mbmqtt::RetainedMessage {
            topic: "r".into(),
            payload: b"v".to_vec(),
            qos: 1,
        }],
    };
    let now = 1_767_225_600_000_000_000;
    let imported = import_mbmqtt(&snapshot, now);
    assert_eq!(imported.legacy.inbound_qos2_dropped, 1);
    let mut units = imported.units;
    assert!(units[0].0.validate().is_ok());
    let (Unit::Sessions { sessions, log }, expected) = &units[0] else {
        panic!("sessions first")
    };
    assert_eq!(units[0].0.counts(), *expected);
    assert_eq!((log.next, log.floor, log.messages.len()), (4, 1, 3));
    assert!(log
        .messages
        .iter()
        .all(|m| m.owed_to.as_deref() == Some("old")));
    assert_eq!(log.messages[1].topic, PUBCOMP_OWED_TOPIC);
    let old = sessions
        .sessions
        .iter()
        .find(|s| s.client_id == "old")
        .unwrap();
    assert_eq!(old.principal, None);
    assert_eq!(old.detached_at, now);
    assert_eq!(old.expiry_interval, IMPORTED_SESSION_EXPIRY);
    assert_eq!(old.inflight[1].phase, InflightPhase::AwaitingComp);
    assert_eq!(old.inflight[1].qos, 2);
    let idle = sessions
        .sessions
        .iter()
        .find(|s| s.client_id == "idle")
        .unwrap();
    assert_eq!(idle.principal.as_deref(), Some("ops"));
    assert_eq!(idle.detached_at, 1_000_000_000);
    let cursor = |reader: &str| {
        log.cursors
            .iter()
            .find(|c| c.reader == reader)
            .unwrap()
            .offset
    };
    assert_eq!((cursor("mqtt:old"), cursor("mqtt:idle")), (1, 4));
    let (Unit::Retained(r), _) = &units[1] else {
        panic!("retained second")
    };
    assert_eq!(r.records[0].payload, Bytes::from_static(b"v"));
    assert!(r.records[0].retain);
    // What the import makes is what the loader accepts.
    f21::validate_pair(sessions, log).unwrap();
}

/// A channel carried from its file that does not read as it did when the
/// directory was scanned (changed since, or damaged) is not written at
/// all: its transaction writes no row, and the failure names the file.
/// Read as it was, it is written with every record, and the records are
/// counted as they were scanned.
#[test]
fn a_channel_carried_from_its_file_is_written_whole_or_not_at_all() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures.join("f21/dir")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let read = snapshots::read_dir(dir.path(), &ScanOptions::default(), Carry::FromFiles).unwrap();
    let carried: Vec<&Unit> = read
        .units
        .iter()
        .filter(|u| matches!(u, Unit::ChannelInFile { .. }))
        .collect();
    assert!(!carried.is_empty(), "{:?}", read.units);

    let db = dir.path().join("carried.db");
    let mut conn = create_database(&db).unwrap();
    for unit in &carried {
        let Unit::ChannelInFile { lists, .. } = unit else {
            unreachable!()
        };
        write_unit(&mut conn, unit, &|_| {}).unwrap();
        let out = count_unit(&conn, unit).unwrap();
        assert_eq!(out, unit.counts(), "{}", unit.name());
        assert!(
            lists.records + lists.items > 0,
            "{}: {lists:?}",
            unit.name()
        );
    }

    // Each channel's file damaged after the scan, or replaced by another
    // channel's: nothing of it is written, its dead-letter channel
    // included.
    let written = |conn: &rusqlite::Connection, table: &str| -> u64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    };
    for (i, unit) in carried.iter().enumerate() {
        let Unit::ChannelInFile { file, .. } = unit else {
            unreachable!()
        };
        let original = std::fs::read(file).unwrap();
        let other = carried
            .iter()
            .find_map(|u| match u {
                Unit::ChannelInFile { file: f, .. } if f != file => Some(f.clone()),
                _ => None,
            })
            .unwrap();
        let mut damaged = original.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 0xff;
        for (how, bytes, says) in [
            ("damaged", damaged, "checksum"),
            ("replaced", std::fs::read(&other).unwrap(), "changed since"),
        ] {
            std::fs::write(file, &bytes).unwrap();
            let db = dir.path().join(format!("refused-{i}-{how}.db"));
            let mut conn = create_database(&db).unwrap();
            let failed = write_unit(&mut conn, unit, &|_| {})
                .unwrap_err()
                .to_string();
            assert!(
                failed.contains(&file.display().to_string()) && failed.contains(says),
                "{how}: {failed}"
            );
            for table in [
                "channels",
                "records",
                "latest_values",
                "queue_items",
                "positions",
            ] {
                assert_eq!(written(&conn, table), 0, "{how} {}: {table}", unit.name());
            }
        }
        std::fs::write(file, &original).unwrap();
    }
}
