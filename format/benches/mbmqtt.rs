//! MBMQTT01 decode throughput: a legacy `broker.snapshot` of 20,000
//! persistent sessions (about 44 MB), each with subscriptions, messages on
//! the wire and an offline queue. Prints a table.
//!
//! `cargo bench -p saguin-format --bench mbmqtt` (release profile). Set
//! `SAGUIN_BENCH_SESSIONS` to change the session count.

use std::hint::black_box;
use std::time::{Duration, Instant};

use saguin_format::mbmqtt::{
    self, Detach, Inflight, Message, Phase, Principal, RetainedMessage, Session, Snapshot,
    Subscription,
};

const ROUNDS: usize = 5;
const PENDING: usize = 12;
const PAYLOAD_LEN: usize = 128;

fn session_count() -> usize {
    std::env::var("SAGUIN_BENCH_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn message(topic: String, qos: u8) -> Message {
    Message {
        topic,
        payload: vec![0x5a; PAYLOAD_LEN],
        retain: false,
        qos,
    }
}

/// Sessions shaped like a fleet of devices that went offline with work
/// queued: three subscriptions, two messages on the wire and a dozen queued.
fn snapshot(sessions: usize) -> Snapshot {
    let sessions = (0..sessions)
        .map(|i| Session {
            client_id: format!("device-{i:06}"),
            principal: Principal::Named(format!("fleet-{}", i % 50)),
            detach: Detach::Millis(1_767_225_600_000 + i as u64),
            next_packet_id: 10,
            subscriptions: ["cmd", "config", "ota"]
                .iter()
                .map(|s| Subscription {
                    filter: format!("devices/{i:06}/{s}/#"),
                    qos: 1,
                })
                .collect(),
            inbound_qos2: vec![7],
            inflight: vec![
                Inflight {
                    packet_id: 8,
                    phase: Phase::AwaitPuback,
                    message: Some(message(format!("devices/{i:06}/cmd/reboot"), 1)),
                },
                Inflight {
                    packet_id: 9,
                    phase: Phase::AwaitPubcomp,
                    message: None,
                },
            ],
            pending: (0..PENDING)
                .map(|j| {
                    message(
                        format!("devices/{i:06}/config/key-{j:02}"),
                        1 + (j % 2) as u8,
                    )
                })
                .collect(),
        })
        .collect();
    let retained = (0..1000)
        .map(|i| RetainedMessage {
            topic: format!("fleet/status/{i:04}"),
            payload: vec![0x33; 64],
            qos: 1,
        })
        .collect();
    Snapshot {
        version_read: 3,
        sessions,
        retained,
    }
}

fn main() {
    let n = session_count();
    let snap = snapshot(n);
    let bytes = mbmqtt::encode(&snap).expect("the bench snapshot encodes");
    let size = bytes.len();
    let mb = size as f64 / 1e6;
    let mut decode = Vec::new();
    let mut encode = Vec::new();
    let mut crc = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        black_box(mbmqtt::decode(black_box(&bytes)).expect("decodes"));
        decode.push(start.elapsed());
        let start = Instant::now();
        black_box(mbmqtt::encode(black_box(&snap)).expect("encodes"));
        encode.push(start.elapsed());
        let start = Instant::now();
        black_box(crc32fast::hash(black_box(&bytes)));
        crc.push(start.elapsed());
    }
    println!(
        "MBMQTT01 V3 broker.snapshot: {n} sessions, {size} bytes; best and median of {ROUNDS}"
    );
    println!(
        "| {:<16} | {:>8} | {:>9} | {:>8} | {:>11} |",
        "operation", "best ms", "median ms", "MB/s", "sessions/s"
    );
    println!(
        "|{}|{}|{}|{}|{}|",
        "-".repeat(18),
        "-".repeat(10),
        "-".repeat(11),
        "-".repeat(10),
        "-".repeat(13)
    );
    for (what, mut times) in [
        ("decode", decode),
        ("encode", encode),
        ("CRC-32 alone", crc),
    ] {
        times.sort();
        let best: Duration = times[0];
        let median = times[times.len() / 2];
        println!(
            "| {what:<16} | {:>8.1} | {:>9.1} | {:>8.0} | {:>11.0} |",
            best.as_secs_f64() * 1e3,
            median.as_secs_f64() * 1e3,
            mb / best.as_secs_f64(),
            n as f64 / best.as_secs_f64(),
        );
    }
}
