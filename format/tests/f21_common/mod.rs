//! The sample content of the format 21 golden fixtures, shared by the
//! fixture test and the property tests. Changing anything here changes the
//! fixtures: rewrite them with `SAGUIN_BLESS=1 cargo test -p saguin-format
//! --test f21_fixtures` and review the diff.
#![allow(dead_code)]

use bytes::Bytes;
use saguin_format::f21::*;
use saguin_format::model::{ChannelKind, PublishProps, Record, UserProperty};

/// The writer string stamped into every fixture.
pub const FIXTURE_WRITER: &str = "fixture0000";
/// 2026-01-01T00:00:00Z: when the fixture shutdown began.
pub const SHUTDOWN_AT: i64 = 1_767_225_600_000_000_000;
/// When the fixture channel files were written, a second after the manifest.
pub const WRITTEN_AT: i64 = SHUTDOWN_AT + 1_000_000_000;

pub fn up(name: &str, value: &str) -> UserProperty {
    UserProperty {
        name: name.into(),
        value: value.into(),
    }
}

fn message_id(n: u8) -> [u8; 16] {
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = n.wrapping_mul(16).wrapping_add(i as u8);
    }
    id
}

/// A record with every field set to something other than its default.
pub fn full_record(offset: u64, topic: &str, payload: &[u8]) -> Record {
    Record {
        offset,
        message_id: message_id(offset as u8),
        topic: topic.into(),
        timestamp: SHUTDOWN_AT - 60_000_000_000 + offset as i64 * 1_000_000,
        user_properties: vec![up("site", "north"), up("unit", "°C"), up("site", "backup")],
        payload: Bytes::copy_from_slice(payload),
        props: PublishProps {
            content_type: Some("application/json".into()),
            response_topic: Some("replies/sensor-7".into()),
            correlation_data: Some(Bytes::from_static(&[0, 1, 2, 0xfe, 0xff])),
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(3600),
        }
        .into(),
        retain: true,
        bridge: Some("uplink".into()),
        client_id: "sensor-7".into(),
        qos: 2,
        shared_copy: false,
        owed_to: None,
    }
}

/// A record with only a topic, payload, client and QoS.
pub fn plain_record(offset: u64, topic: &str, payload: &[u8], qos: u8) -> Record {
    let mut r = Record::new(topic, Bytes::copy_from_slice(payload));
    r.offset = offset;
    r.message_id = message_id(offset as u8 ^ 0x55);
    r.timestamp = SHUTDOWN_AT - 30_000_000_000 + offset as i64;
    r.client_id = "plain-client".into();
    r.qos = qos;
    r
}

fn held(client: &str, packet_id: u16, topic: &str) -> HeldPublish {
    let mut record = full_record(0, topic, b"held until PUBREL");
    record.offset = 0;
    record.bridge = None;
    record.client_id = client.into();
    HeldPublish {
        client_id: client.into(),
        packet_id,
        held_at: SHUTDOWN_AT - 5_000_000_000,
        record,
    }
}

/// An append channel: records 3..=9 (the floor rose past 1 and 2), varied
/// properties, positions of each reader kind, two held publishes.
pub fn append_channel() -> ChannelFile {
    let mut records = vec![
        full_record(3, "telemetry/sensor-7/temp", br#"{"t":21.5}"#),
        plain_record(4, "telemetry/sensor-8/temp", b"19.0", 0),
        plain_record(5, "telemetry/sensor-8/temp", b"", 1),
        plain_record(6, "telemetry/bin", &[0, 159, 146, 150, 255], 1),
    ];
    let mut unset_time = plain_record(7, "telemetry/clockless", b"no clock", 0);
    unset_time.timestamp = 0;
    records.push(unset_time);
    let mut only_user_props = plain_record(8, "telemetry/é/ü", "ünïcödé".as_bytes(), 2);
    only_user_props.user_properties = vec![up("", ""), up("k", "v"), up("k", "v2")];
    only_user_props.props.message_expiry_interval = Some(0);
    only_user_props.props.payload_format_indicator = Some(0);
    records.push(only_user_props);
    let mut bridged = plain_record(9, "telemetry/bridged", &[7u8; 300], 1);
    bridged.bridge = Some("site-b".into());
    bridged.props.correlation_data = Some(Bytes::new());
    records.push(bridged);
    let bytes = records.iter().map(Record::accounted_size).sum();
    ChannelFile {
        name: "telemetry".into(),
        kind: ChannelKind::Append,
        next: 10,
        floor: 3,
        bytes,
        records,
        items: vec![],
        positions: vec![
            Position {
                reader: "mqtt:sensor-dashboard".into(),
                offset: 5,
                saved_at: SHUTDOWN_AT - 1_000_000,
                session_expiry: Some(3600),
            },
            Position {
                reader: "bridge:uplink".into(),
                offset: 10,
                saved_at: SHUTDOWN_AT - 2_000_000,
                session_expiry: None,
            },
            Position {
                reader: "mqtt:short-lived".into(),
                offset: 1,
                saved_at: SHUTDOWN_AT - 3_000_000,
                session_expiry: Some(0),
            },
        ],
        held: vec![
            held("sensor-7", 17, "telemetry/sensor-7/temp"),
            held("sensor-8", 1, "telemetry/sensor-8/temp"),
        ],
        dead_letter: None,
    }
}

/// A latest channel: one value per topic, one of them a deletion tombstone.
pub fn latest_channel() -> ChannelFile {
    let mut records = vec![
        plain_record(12, "state/door", b"closed", 1),
        full_record(15, "state/hvac", br#"{"mode":"cool"}"#),
        plain_record(20, "state/removed", b"", 1),
        plain_record(21, "state/door2", b"open", 0),
    ];
    records[2].retain = true;
    let bytes = records.iter().map(Record::accounted_size).sum();
    ChannelFile {
        name: "state".into(),
        kind: ChannelKind::Latest,
        next: 22,
        floor: 1,
        bytes,
        records,
        items: vec![],
        positions: vec![Position {
            reader: "mqtt:hmi".into(),
            offset: 16,
            saved_at: SHUTDOWN_AT - 7_000_000,
            session_expiry: Some(86_400),
        }],
        held: vec![],
        dead_letter: None,
    }
}

/// A queue with unresolved items in each delivery state and a dead-letter
/// channel holding a spent record.
pub fn queue_channel() -> ChannelFile {
    let items = vec![
        QueueItem {
            record: plain_record(40, "jobs/resize", b"img-1", 1),
            attempts: 0,
            first_delivered: 0,
            last_delivered: 0,
        },
        QueueItem {
            record: full_record(41, "jobs/resize", b"img-2"),
            attempts: 2,
            first_delivered: SHUTDOWN_AT - 20_000_000_000,
            last_delivered: SHUTDOWN_AT - 10_000_000_000,
        },
        QueueItem {
            record: plain_record(44, "jobs/encode", b"video-9", 2),
            attempts: 1,
            first_delivered: SHUTDOWN_AT - 1_000_000_000,
            last_delivered: SHUTDOWN_AT - 1_000_000_000,
        },
    ];
    let mut spent = full_record(2, "jobs/resize", b"img-0");
    spent
        .user_properties
        .push(up("dlq-reason", "attempts exhausted"));
    let dlq_records = vec![spent];
    let bytes = items.iter().map(|i| i.record.accounted_size()).sum();
    ChannelFile {
        name: "jobs".into(),
        kind: ChannelKind::Queue,
        next: 45,
        floor: 40,
        bytes,
        records: vec![],
        items,
        positions: vec![],
        held: vec![held("worker-launcher", 65535, "jobs/encode")],
        dead_letter: Some(DeadLetter {
            name: "jobs.dlq".into(),
            next: 3,
            floor: 2,
            bytes: dlq_records.iter().map(Record::accounted_size).sum(),
            records: dlq_records,
            positions: vec![Position {
                reader: "bridge:dlq-export".into(),
                offset: 2,
                saved_at: SHUTDOWN_AT - 9_000_000,
                session_expiry: None,
            }],
        }),
    }
}

pub fn manifest() -> Manifest {
    let entry = |channel: &str, kind| ManifestEntry {
        channel: channel.into(),
        file_name: saguin_format::channel_name::encode_file_name(channel),
        kind,
    };
    Manifest {
        began_at: SHUTDOWN_AT,
        channels: vec![
            entry("telemetry", ChannelKind::Append),
            entry("state", ChannelKind::Latest),
            entry("jobs", ChannelKind::Queue),
        ],
        retained: true,
        sessions: true,
        broadcast: true,
    }
}

pub fn retained() -> RetainedFile {
    let mut device = full_record(0, "devices/gw-1/config", br#"{"rate":5}"#);
    device.offset = 0;
    let mut status = plain_record(0, "devices/gw-1/status", b"online", 1);
    status.retain = true;
    let mut tree = plain_record(0, "site/tree", b"a/b/c", 0);
    tree.retain = true;
    RetainedFile {
        records: vec![device, status, tree],
    }
}

pub fn workers_group() -> SharedGroupKey {
    SharedGroupKey {
        group: "workers".into(),
        filter: "alerts/#".into(),
    }
}

pub fn sessions() -> SessionsFile {
    let dashboard = Session {
        client_id: "dashboard".into(),
        principal: Some("ops".into()),
        expiry_interval: 3600,
        detached_at: SHUTDOWN_AT - 100_000_000_000,
        subscriptions: vec![
            Subscription {
                filter: "alerts/+/critical".into(),
                qos: 2,
                no_local: true,
                retain_as_published: true,
                retain_handling: 2,
                subscription_id: Some(268_435_455),
                log_offset: 100,
            },
            Subscription {
                filter: "$share/workers/alerts/#".into(),
                qos: 1,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
                subscription_id: None,
                log_offset: 101,
            },
        ],
        will: Some(Will {
            topic: "clients/dashboard/gone".into(),
            payload: Bytes::from_static(b"dashboard went away"),
            qos: 1,
            retain: true,
            delay_interval: 30,
            props: PublishProps {
                content_type: Some("text/plain".into()),
                response_topic: None,
                correlation_data: Some(Bytes::from_static(b"will-corr")),
                payload_format_indicator: Some(1),
                message_expiry_interval: Some(600),
            },
            user_properties: vec![up("reason", "lost"), up("reason", "timeout")],
        }),
        window: 3,
        inflight: vec![
            InflightEntry {
                log_offset: 102,
                packet_id: 7,
                qos: 1,
                phase: InflightPhase::AwaitingAck,
                shared_group: None,
            },
            InflightEntry {
                log_offset: 103,
                packet_id: 8,
                qos: 2,
                phase: InflightPhase::AwaitingComp,
                shared_group: Some(workers_group()),
            },
            InflightEntry {
                log_offset: 105,
                packet_id: 9,
                qos: 2,
                phase: InflightPhase::AwaitingAck,
                shared_group: None,
            },
        ],
    };
    let connected = Session {
        client_id: "gw-1".into(),
        principal: None,
        expiry_interval: 0,
        detached_at: 0,
        subscriptions: vec![Subscription {
            filter: "devices/gw-1/cmd".into(),
            qos: 0,
            no_local: false,
            retain_as_published: false,
            retain_handling: 1,
            subscription_id: Some(1),
            log_offset: 104,
        }],
        will: None,
        window: 65535,
        inflight: vec![],
    };
    SessionsFile {
        sessions: vec![dashboard, connected],
        shared_groups: vec![SharedGroup {
            key: workers_group(),
            cursor: 104,
            returned: vec![101, 99],
        }],
    }
}

pub fn broadcast() -> BroadcastFile {
    let mut shared = plain_record(101, "alerts/pump/critical", b"pressure", 1);
    shared.shared_copy = true;
    let mut owed = plain_record(104, "devices/gw-1/cmd", b"reboot", 0);
    owed.owed_to = Some("gw-1".into());
    owed.retain = true;
    let messages = vec![
        plain_record(99, "alerts/fan/critical", b"stalled", 1),
        full_record(100, "alerts/valve/critical", b"stuck"),
        shared,
        plain_record(102, "alerts/door/critical", b"forced", 1),
        plain_record(103, "alerts/pump/critical", b"leak", 2),
        owed,
        plain_record(105, "alerts/fan/critical", b"fire", 2),
    ];
    BroadcastFile {
        next: 106,
        floor: 99,
        bytes: messages.iter().map(Record::accounted_size).sum(),
        messages,
        cursors: vec![
            Position {
                reader: "mqtt:dashboard".into(),
                offset: 102,
                saved_at: SHUTDOWN_AT - 100_000_000_000,
                session_expiry: None,
            },
            Position {
                reader: "mqtt:gw-1".into(),
                offset: 106,
                saved_at: SHUTDOWN_AT,
                session_expiry: None,
            },
        ],
        held: vec![held("dashboard", 3, "alerts/door/critical")],
    }
}

/// Every single-file fixture: file name under `fixtures/f21/`, content,
/// written-at.
pub fn single_fixtures() -> Vec<(&'static str, SnapshotFile, i64)> {
    vec![
        (
            "append.snapshot",
            SnapshotFile::Channel(append_channel()),
            WRITTEN_AT,
        ),
        (
            "latest.snapshot",
            SnapshotFile::Channel(latest_channel()),
            WRITTEN_AT,
        ),
        (
            "queue.snapshot",
            SnapshotFile::Channel(queue_channel()),
            WRITTEN_AT,
        ),
        (
            "saguin.manifest",
            SnapshotFile::Manifest(manifest()),
            SHUTDOWN_AT,
        ),
        (
            "retained.snapshot",
            SnapshotFile::Retained(retained()),
            WRITTEN_AT,
        ),
        (
            "saguin.sessions",
            SnapshotFile::Sessions(sessions()),
            WRITTEN_AT,
        ),
        (
            "saguin.broadcast",
            SnapshotFile::Broadcast(broadcast()),
            WRITTEN_AT,
        ),
    ]
}

/// The complete snapshot directory `fixtures/f21/dir/`: a clean shutdown
/// (manifest first; every file of one shutdown is stamped with its moment).
pub fn directory_fixture() -> Vec<(String, SnapshotFile, i64)> {
    use saguin_format::channel_name::*;
    vec![
        (
            MANIFEST_FILE.into(),
            SnapshotFile::Manifest(manifest()),
            SHUTDOWN_AT,
        ),
        (
            encode_file_name("telemetry"),
            SnapshotFile::Channel(append_channel()),
            SHUTDOWN_AT,
        ),
        (
            encode_file_name("state"),
            SnapshotFile::Channel(latest_channel()),
            SHUTDOWN_AT,
        ),
        (
            encode_file_name("jobs"),
            SnapshotFile::Channel(queue_channel()),
            SHUTDOWN_AT,
        ),
        (
            RETAINED_FILE.into(),
            SnapshotFile::Retained(retained()),
            SHUTDOWN_AT,
        ),
        (
            BROADCAST_FILE.into(),
            SnapshotFile::Broadcast(broadcast()),
            SHUTDOWN_AT,
        ),
        (
            SESSIONS_FILE.into(),
            SnapshotFile::Sessions(sessions()),
            SHUTDOWN_AT,
        ),
    ]
}

pub fn encode_fixture(file: &SnapshotFile, written_at: i64) -> Vec<u8> {
    encode_with_writer(file, FIXTURE_WRITER, written_at)
}
