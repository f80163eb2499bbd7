//! State tests: events in, packets and intents out, commits fed by hand on
//! an injected clock.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::*;
use crate::broker::codec::ByteStr;
use crate::broker::message::MessageProperties;
use crate::broker::metrics::{CloseReason, DropReason, Metrics};
use crate::broker::topic::SubOptions;

struct Client {
    rx: mpsc::UnboundedReceiver<Outbound>,
    kill: watch::Receiver<bool>,
    pause: watch::Receiver<bool>,
}

impl Client {
    fn drain(&mut self) -> Vec<Outbound> {
        let mut out = Vec::new();
        while let Ok(o) = self.rx.try_recv() {
            out.push(o);
        }
        out
    }
}

/// A stand-in for the persisters: answers every intent, assigning log
/// offsets as a provider would, or failing when told to.
#[derive(Default)]
struct FakeStore {
    next_offset: u64,
    writes: Vec<Write>,
    /// The records of channel 0, offsets from 1.
    channel: Vec<saguin_format::model::Record>,
    /// Channel 0's holds by client id and packet id.
    holds: std::collections::HashMap<(String, u16), saguin_format::model::Record>,
}

impl FakeStore {
    /// Answer everything the state asked for, in order.
    fn commit_all(&mut self, s: &mut BrokerState, now: Instant) {
        loop {
            let mut intents = Vec::new();
            s.take_intents(&mut intents);
            if intents.is_empty() {
                return;
            }
            for intent in intents {
                let written = self.apply(&intent);
                s.handle(
                    Event::Committed {
                        ticket: intent.ticket,
                        result: Ok(written),
                    },
                    now,
                );
            }
        }
    }

    fn apply(&mut self, intent: &Intent) -> Vec<Written> {
        intent
            .writes
            .iter()
            .map(|w| {
                self.writes.push(w.clone());
                match w {
                    Write::AppendLog(_) => {
                        self.next_offset += 1;
                        Written::Appended(self.next_offset)
                    }
                    Write::Append(record) => self.store_in_channel(record.clone()),
                    Write::Hold(held)
                        if held.channel != crate::storage::contract::BROADCAST_LOG_NAME =>
                    {
                        self.holds.insert(
                            (held.client_id.clone(), held.packet_id),
                            held.record.clone(),
                        );
                        Written::Done
                    }
                    Write::Release {
                        client_id,
                        packet_id,
                    } => match self.holds.remove(&(client_id.clone(), *packet_id)) {
                        Some(record) => self.store_in_channel(record),
                        None => Written::Done,
                    },
                    _ => Written::Done,
                }
            })
            .collect()
    }

    fn store_in_channel(&mut self, mut record: saguin_format::model::Record) -> Written {
        record.offset = self.channel.len() as u64 + 1;
        self.channel.push(record.clone());
        Written::Stored(0, Box::new(record))
    }

    /// Answer every read the state asked for from channel 0, whose records
    /// below `floor` are gone.
    fn answer_reads(&mut self, s: &mut BrokerState, floor: u64, now: Instant) -> usize {
        let mut reads = Vec::new();
        s.take_reads(&mut reads);
        let count = reads.len();
        for read in reads {
            let Seek::Offset(from) = read.from else {
                panic!("only offsets are sought here");
            };
            let start = from.max(floor);
            let records = self
                .channel
                .iter()
                .filter(|r| r.offset >= start)
                .take(read.max)
                .cloned()
                .collect();
            s.handle(
                Event::ChannelRead {
                    ticket: read.ticket,
                    result: Ok(ReadWindow {
                        start,
                        floor: (start > from).then_some(start),
                        records,
                    }),
                },
                now,
            );
        }
        count
    }

    /// Fail everything the state asked for.
    fn fail_all(&mut self, s: &mut BrokerState, now: Instant, full: bool) {
        let mut intents = Vec::new();
        s.take_intents(&mut intents);
        for intent in intents {
            s.handle(
                Event::Committed {
                    ticket: intent.ticket,
                    result: Err(StorageFailure {
                        full,
                        message: "injected".into(),
                    }),
                },
                now,
            );
        }
    }
}

fn state_with(limits: Limits) -> BrokerState {
    BrokerState::new(
        limits,
        Arc::new(Metrics::new()),
        Arc::new(AllowAll),
        (Instant::now(), 1_700_000_000_000_000_000),
    )
}

fn state() -> BrokerState {
    state_with(Limits::default())
}

fn connect_with(
    state: &mut BrokerState,
    conn: u64,
    id: &str,
    clean: bool,
    v5: bool,
    now: Instant,
) -> Client {
    let mut request = request(id, clean, if clean { 0 } else { 300 });
    request.v5 = v5;
    connect_as(state, conn, request, now)
}

/// A v5 CONNECT without a Will.
fn request(id: &str, clean: bool, session_expiry: u32) -> ConnectRequest {
    ConnectRequest {
        v5: true,
        client_id: id.into(),
        clean_start: clean,
        keep_alive: 60,
        principal: None,
        will: None,
        session_expiry,
        receive_maximum: 10,
        maximum_packet_size: None,
        request_response_information: false,
        authentication: None,
        bridge: None,
    }
}

fn connect_as(state: &mut BrokerState, conn: u64, request: ConnectRequest, now: Instant) -> Client {
    let (tx, rx) = mpsc::unbounded_channel();
    let (kill_tx, kill) = watch::channel(false);
    let (pause_tx, pause) = watch::channel(false);
    state.handle(
        Event::Connect {
            connection: conn,
            request: Box::new(request),
            handle: ConnectionHandle {
                outbound: tx,
                written: Arc::new(AtomicUsize::new(0)),
                foreign: Arc::new(AtomicUsize::new(0)),
                kill: kill_tx,
                pause: pause_tx,
                want_drained: Arc::new(AtomicBool::new(false)),
            },
        },
        now,
    );
    Client { rx, kill, pause }
}

fn connect(state: &mut BrokerState, conn: u64, id: &str, clean: bool, now: Instant) -> Client {
    connect_with(state, conn, id, clean, true, now)
}

fn packets(state: &mut BrokerState, conn: u64, packets: Vec<Inbound>, now: Instant) {
    state.handle(
        Event::Packets {
            connection: conn,
            packets,
        },
        now,
    );
}

fn subscribe(filter: &str, qos: u8) -> Inbound {
    Inbound::Subscribe {
        packet_id: 1,
        subscription_id: None,
        user_properties: Vec::new(),
        filters: vec![(
            filter.into(),
            SubOptions {
                qos,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
                subscription_id: None,
            },
        )],
    }
}

fn publish(topic: &str, qos: u8, id: u16) -> Inbound {
    publish_retained(topic, qos, id, false)
}

fn publish_retained(topic: &str, qos: u8, id: u16, retain: bool) -> Inbound {
    Inbound::Publish(InboundPublish {
        packet_id: id,
        qos,
        retain,
        dup: false,
        topic: ByteStr::from(topic),
        payload: Bytes::from_static(b"p"),
        properties: MessageProperties::default(),
    })
}

fn closed(state: &mut BrokerState, conn: u64, now: Instant) {
    state.handle(
        Event::Closed {
            connection: conn,
            reason: CloseReason::Network,
            disconnect_reason: None,
        },
        now,
    );
}

fn publish_ids(out: &[Outbound]) -> Vec<u16> {
    out.iter()
        .filter_map(|o| match o {
            Outbound::Publish {
                packet_id,
                dup: false,
                ..
            } => Some(*packet_id),
            _ => None,
        })
        .collect()
}

#[test]
fn late_events_of_a_taken_over_generation_do_nothing() {
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut old = connect(&mut s, 1, "c", false, now);
    packets(&mut s, 1, vec![subscribe("t", 1)], now);
    store.commit_all(&mut s, now);
    let mut new = connect(&mut s, 2, "c", false, now);
    store.commit_all(&mut s, now);
    assert!(matches!(
        old.drain().last(),
        Some(Outbound::Disconnect {
            reason: ReasonCode::SessionTakenOver,
            ..
        })
    ));
    assert!(matches!(
        new.drain().first(),
        Some(Outbound::ConnAck {
            session_present: true,
            ..
        })
    ));
    // The old connection's late packets and close are ignored.
    packets(
        &mut s,
        1,
        vec![Inbound::Unsubscribe {
            packet_id: 2,
            filters: vec!["t".into()],
        }],
        now,
    );
    closed(&mut s, 1, now);
    assert_eq!(s.connection_count(), 1);
    let _pub = connect(&mut s, 3, "p", true, now);
    packets(&mut s, 3, vec![publish("t", 1, 1)], now);
    store.commit_all(&mut s, now);
    assert!(new
        .drain()
        .iter()
        .any(|o| matches!(o, Outbound::Publish { qos: 1, .. })));
}

#[test]
fn qos0_to_a_client_that_does_not_read_is_dropped_and_counted_not_cut() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        outbound_queue: 4,
        ..Limits::default()
    });
    let mut slow = connect(&mut s, 1, "slow", true, now);
    packets(&mut s, 1, vec![subscribe("t", 0)], now);
    let mut fast = connect(&mut s, 2, "fast", true, now);
    packets(&mut s, 2, vec![subscribe("t", 0)], now);
    // The fast one reads as it goes.
    let mut delivered = 0;
    let _ = fast.drain();
    let _p = connect(&mut s, 3, "p", true, now);
    for _ in 0..10 {
        packets(&mut s, 3, vec![publish("t", 0, 0)], now);
        let out = fast.drain();
        delivered += out.len();
        fast_written(&s, 2, out.len());
    }
    assert_eq!(delivered, 10);
    assert!(!*slow.kill.borrow(), "a slow QoS 0 consumer is not cut");
    assert_eq!(s.connection_count(), 3);
    // slow got CONNACK + SUBACK + 2 publishes before its queue was full.
    let slow_out = slow.drain();
    assert_eq!(publish_ids(&slow_out).len(), 2);
    assert_eq!(s.metrics.dropped_count(DropReason::SlowConsumer), 8);
}

/// What a writer does after writing `n` packets of `conn`.
fn fast_written(s: &BrokerState, conn: u64, n: usize) {
    let c = &s.connections[&conn];
    c.handle
        .written
        .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

#[test]
fn acknowledgements_a_client_does_not_read_pause_its_reader() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        outbound_queue: 8,
        ..Limits::default()
    });
    let mut p = connect(&mut s, 1, "p", true, now);
    packets(
        &mut s,
        1,
        (1..=20).map(|i| publish("t", 1, i)).collect(),
        now,
    );
    assert!(!*p.kill.borrow(), "never cut for its own acknowledgements");
    assert!(*p.pause.borrow(), "its reader is paused instead");
    let acks = p
        .drain()
        .iter()
        .filter(|o| matches!(o, Outbound::PubAck { .. }))
        .count();
    assert_eq!(acks, 20, "every acknowledgement is kept");
    fast_written(&s, 1, 21);
    s.handle(Event::Drained { connection: 1 }, now);
    assert!(!*p.pause.borrow(), "drained: reading again");
}

#[test]
fn offline_queue_is_bounded_and_replayed_in_order() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_queued_messages: 3,
        ..Limits::default()
    });
    let mut store = FakeStore::default();
    let _c = connect(&mut s, 1, "c", false, now);
    packets(&mut s, 1, vec![subscribe("t", 1)], now);
    store.commit_all(&mut s, now);
    closed(&mut s, 1, now);
    let _p = connect(&mut s, 2, "p", true, now);
    packets(
        &mut s,
        2,
        (1..=5).map(|i| publish("t", 1, i)).collect(),
        now,
    );
    store.commit_all(&mut s, now);
    let mut c = connect(&mut s, 3, "c", false, now);
    store.commit_all(&mut s, now);
    let out = c.drain();
    assert_eq!(
        publish_ids(&out),
        vec![1, 2, 3],
        "three kept, two dropped and counted"
    );
    assert_eq!(s.metrics.dropped_count(DropReason::QueueFull), 2);
}

#[test]
fn unreleased_qos2_holds_expire_and_are_counted() {
    let now = Instant::now();
    let mut s = state();
    let mut p = connect(&mut s, 1, "p", true, now);
    packets(&mut s, 1, vec![publish("t", 2, 5)], now);
    s.tick(now + Duration::from_secs(10));
    assert_eq!(s.metrics.dropped_count(DropReason::ExactlyOnceExpired), 0);
    s.next_exactly_once_sweep = None;
    s.tick(now + Duration::from_secs(3601));
    assert_eq!(s.metrics.dropped_count(DropReason::ExactlyOnceExpired), 1);
    // The id is free again: PUBREL for it is now unknown.
    packets(&mut s, 1, vec![Inbound::PubRel { packet_id: 5 }], now);
    assert!(p.drain().iter().any(|o| matches!(
        o,
        Outbound::PubComp {
            packet_id: 5,
            reason: ReasonCode::PacketIdentifierNotFound
        }
    )));
}

#[test]
fn no_connack_before_the_persistent_session_is_committed() {
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut c = connect(&mut s, 1, "c", false, now);
    assert!(c.drain().is_empty(), "nothing before the commit");
    // Packets sent meanwhile wait behind the CONNACK.
    packets(&mut s, 1, vec![Inbound::PingReq], now);
    assert!(c.drain().is_empty());
    store.commit_all(&mut s, now);
    let out = c.drain();
    assert!(matches!(
        out[0],
        Outbound::ConnAck {
            reason: ReasonCode::Success,
            ..
        }
    ));
    assert!(matches!(out[1], Outbound::PingResp));
    assert!(
        matches!(store.writes[0], Write::SaveSession(ref e) if e.client_id == "c" && e.detached_at == 0)
    );
}

#[test]
fn a_failed_session_write_refuses_v5_with_its_reason_and_cuts_v311() {
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut v5 = connect_with(&mut s, 1, "a", false, true, now);
    store.fail_all(&mut s, now, true);
    assert!(matches!(
        v5.drain().first(),
        Some(Outbound::ConnAck {
            reason: ReasonCode::QuotaExceeded,
            ..
        })
    ));
    let mut v3 = connect_with(&mut s, 2, "b", false, false, now);
    store.fail_all(&mut s, now, false);
    assert!(
        v3.drain().is_empty(),
        "3.1.1: no acknowledgement, the connection is closed"
    );
    assert_eq!(s.connection_count(), 0);
    assert_eq!(s.session_count(), 0, "nothing unstored is kept");
}

#[test]
fn acknowledgements_wait_for_their_commit_and_keep_their_order() {
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut c = connect(&mut s, 1, "c", true, now);
    let _ = c.drain();
    // A retained publish is stored before its PUBACK; the QoS 1 publish
    // after it, which stores nothing, still waits behind it.
    packets(
        &mut s,
        1,
        vec![publish_retained("r", 1, 1, true), publish("x", 1, 2)],
        now,
    );
    assert!(c.drain().is_empty());
    store.commit_all(&mut s, now);
    let ids: Vec<u16> = c
        .drain()
        .iter()
        .filter_map(|o| match o {
            Outbound::PubAck { packet_id, .. } => Some(*packet_id),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(s.retained_count(), 1);
}

#[test]
fn a_failed_retained_write_answers_its_reason_and_changes_nothing() {
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut c = connect(&mut s, 1, "c", true, now);
    let _ = c.drain();
    packets(&mut s, 1, vec![publish_retained("r", 1, 7, true)], now);
    store.fail_all(&mut s, now, false);
    assert!(matches!(
        c.drain().first(),
        Some(Outbound::PubAck {
            packet_id: 7,
            reason: ReasonCode::ImplementationSpecificError
        })
    ));
    assert_eq!(s.retained_count(), 0);
}

#[test]
fn retained_topics_are_capped() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_retained: 2,
        ..Limits::default()
    });
    let mut store = FakeStore::default();
    let mut c = connect(&mut s, 1, "c", true, now);
    for (i, t) in ["a", "b", "c", "a"].iter().enumerate() {
        packets(
            &mut s,
            1,
            vec![publish_retained(t, 1, i as u16 + 1, true)],
            now,
        );
        store.commit_all(&mut s, now);
    }
    let codes: Vec<ReasonCode> = c
        .drain()
        .iter()
        .filter_map(|o| match o {
            Outbound::PubAck { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            ReasonCode::Success,
            ReasonCode::Success,
            ReasonCode::QuotaExceeded,
            ReasonCode::Success
        ],
        "a new topic past the cap is refused, a replacement is not"
    );
}

#[test]
fn offline_messages_live_once_in_the_broadcast_log_and_leave_it_when_acknowledged() {
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    for (conn, id) in [(1, "a"), (2, "b")] {
        let _ = connect(&mut s, conn, id, false, now);
        packets(&mut s, conn, vec![subscribe("t", 1)], now);
        store.commit_all(&mut s, now);
        closed(&mut s, conn, now);
    }
    store.commit_all(&mut s, now);
    let _p = connect(&mut s, 3, "p", true, now);
    packets(&mut s, 3, vec![publish("t", 1, 1)], now);
    store.commit_all(&mut s, now);
    let appended = store
        .writes
        .iter()
        .filter(|w| matches!(w, Write::AppendLog(_)))
        .count();
    assert_eq!(
        appended, 1,
        "one log entry however many sessions are owed it"
    );
    assert_eq!(s.log_references(), vec![(1, 2)]);
    for (conn, id) in [(4, "a"), (5, "b")] {
        let mut c = connect(&mut s, conn, id, false, now);
        store.commit_all(&mut s, now);
        let out = c.drain();
        let packet_id = publish_ids(&out)[0];
        packets(
            &mut s,
            conn,
            vec![Inbound::PubAck {
                packet_id,
                reason: ReasonCode::Success,
            }],
            now,
        );
    }
    assert!(s.log_references().is_empty());
    s.flush(now);
    store.commit_all(&mut s, now);
    assert!(store
        .writes
        .iter()
        .any(|w| matches!(w, Write::ReleaseLog(o) if o == &vec![1])));
}

#[test]
fn a_restored_session_resends_its_inflight_with_dup_and_owes_pubrel() {
    use crate::storage::contract::{
        InflightEntry as StoredInflight, InflightPhase as StoredPhase, SessionEntry,
        SubscriptionEntry,
    };
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let record = |offset: u64, qos: u8| saguin_format::model::Record {
        offset,
        qos,
        timestamp: 1_700_000_000_000_000_000,
        ..saguin_format::model::Record::new("t", Bytes::from_static(b"m"))
    };
    let summary = s.restore(
        Restored {
            retained: vec![record(0, 0)],
            sessions: vec![SessionEntry {
                client_id: "c".into(),
                principal: None,
                expiry_interval: 300,
                detached_at: 1_700_000_000_000_000_000,
                subscriptions: vec![SubscriptionEntry {
                    filter: "t".into(),
                    qos: 2,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                    subscription_id: None,
                    log_offset: 1,
                }],
                will: None,
                window: 10,
                inflight: vec![
                    StoredInflight {
                        log_offset: 1,
                        packet_id: 7,
                        qos: 1,
                        phase: StoredPhase::AwaitingAck,
                        shared_group: None,
                    },
                    StoredInflight {
                        log_offset: 2,
                        packet_id: 8,
                        qos: 2,
                        phase: StoredPhase::AwaitingComp,
                        shared_group: None,
                    },
                ],
            }],
            cursors: vec![("c".into(), 1)],
            log: vec![record(1, 1), record(2, 2), record(3, 2)],
            log_next: 4,
            held: Vec::new(),
            channels: Vec::new(),
        },
        now,
    );
    assert_eq!(
        (summary.sessions, summary.inflight, summary.queued),
        (1, 2, 1)
    );
    store.commit_all(&mut s, now);
    let mut c = connect(&mut s, 1, "c", false, now);
    store.commit_all(&mut s, now);
    let out = c.drain();
    assert!(matches!(
        out[0],
        Outbound::ConnAck {
            session_present: true,
            ..
        }
    ));
    assert!(matches!(
        out[1],
        Outbound::Publish {
            packet_id: 7,
            dup: true,
            ..
        }
    ));
    assert!(matches!(out[2], Outbound::PubRel { packet_id: 8, .. }));
    // The message the log held past the in-flight ones is delivered new.
    assert!(matches!(
        out[3],
        Outbound::Publish {
            qos: 2,
            dup: false,
            ..
        }
    ));
}

#[test]
fn persistent_sessions_past_the_cap_are_refused_with_0x97() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_sessions: 2,
        ..Limits::default()
    });
    let mut store = FakeStore::default();
    let mut codes = Vec::new();
    for (conn, id) in [(1, "a"), (2, "b"), (3, "c")] {
        let mut c = connect(&mut s, conn, id, false, now);
        store.commit_all(&mut s, now);
        if let Some(Outbound::ConnAck { reason, .. }) = c.drain().first() {
            codes.push(*reason);
        }
    }
    // A clean session is not kept, so the cap does not apply to it.
    let mut clean = connect(&mut s, 4, "d", true, now);
    if let Some(Outbound::ConnAck { reason, .. }) = clean.drain().first() {
        codes.push(*reason);
    }
    // Resuming a kept session is not a new one.
    let mut again = connect(&mut s, 5, "a", false, now);
    store.commit_all(&mut s, now);
    if let Some(Outbound::ConnAck { reason, .. }) = again.drain().first() {
        codes.push(*reason);
    }
    assert_eq!(
        codes,
        vec![
            ReasonCode::Success,
            ReasonCode::Success,
            ReasonCode::QuotaExceeded,
            ReasonCode::Success,
            ReasonCode::Success
        ]
    );
}

/// Whether the CONNACK among `out` says a session was present.
fn session_present(out: &[Outbound]) -> bool {
    match out.iter().find(|o| matches!(o, Outbound::ConnAck { .. })) {
        Some(Outbound::ConnAck {
            session_present,
            reason: ReasonCode::Success,
            ..
        }) => *session_present,
        other => panic!("expected a successful CONNACK, got {other:?}"),
    }
}

/// Payloads of the PUBLISHes among `out`, with the expiry each forwards.
fn published(out: &[Outbound]) -> Vec<(Bytes, Option<u32>)> {
    out.iter()
        .filter_map(|o| match o {
            Outbound::Publish {
                message, expiry, ..
            } => Some((message.payload.clone(), *expiry)),
            _ => None,
        })
        .collect()
}

fn expiring_publish(topic: &str, payload: &'static [u8], id: u16, seconds: u32) -> Inbound {
    Inbound::Publish(InboundPublish {
        packet_id: id,
        qos: 1,
        retain: false,
        dup: false,
        topic: ByteStr::from(topic),
        payload: Bytes::from_static(payload),
        properties: MessageProperties {
            message_expiry_interval: Some(seconds),
            ..MessageProperties::default()
        },
    })
}

/// MQTT 5 3.1.2.11.2 (MQTT-3.1.2-23): a detached session lives its Session
/// Expiry Interval, and not a moment longer.
#[test]
fn a_session_ends_when_its_expiry_interval_passes_not_before() {
    let t0 = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let _c = connect_as(&mut s, 1, request("c", false, 1), t0);
    packets(&mut s, 1, vec![subscribe("t", 1)], t0);
    store.commit_all(&mut s, t0);
    closed(&mut s, 1, t0);
    store.commit_all(&mut s, t0);
    let almost = t0 + Duration::from_millis(999);
    s.tick(almost);
    store.commit_all(&mut s, almost);
    let mut c = connect_as(&mut s, 2, request("c", false, 1), almost);
    store.commit_all(&mut s, almost);
    assert!(
        session_present(&c.drain()),
        "kept until the interval passes"
    );
    closed(&mut s, 2, almost);
    store.commit_all(&mut s, almost);
    let after = almost + Duration::from_secs(1);
    s.tick(after);
    store.commit_all(&mut s, after);
    let mut c = connect_as(&mut s, 3, request("c", false, 1), after);
    store.commit_all(&mut s, after);
    assert!(!session_present(&c.drain()), "ended once it passed");
}

/// MQTT 5 3.1.3.2.2: the Will of a session that outlives its connection
/// is published once the Will Delay Interval has passed, not before; a
/// reconnect within the delay cancels it.
#[test]
fn a_will_waits_for_its_delay_and_a_reconnect_cancels_it() {
    let t0 = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut watcher = connect(&mut s, 1, "watcher", true, t0);
    packets(&mut s, 1, vec![subscribe("will/#", 1)], t0);
    store.commit_all(&mut s, t0);
    watcher.drain();
    let with_will = |id: &str, delay: u32| {
        let mut r = request(id, false, 60);
        r.will = Some(WillRequest {
            topic: ByteStr::from(format!("will/{id}")),
            payload: Bytes::from_static(b"gone"),
            qos: 1,
            retain: false,
            properties: MessageProperties::default(),
            delay,
        });
        r
    };
    let _late = connect_as(&mut s, 2, with_will("late", 1), t0);
    let _never = connect_as(&mut s, 3, with_will("never", 2), t0);
    store.commit_all(&mut s, t0);
    closed(&mut s, 2, t0);
    closed(&mut s, 3, t0);
    store.commit_all(&mut s, t0);

    let almost = t0 + Duration::from_millis(999);
    s.tick(almost);
    store.commit_all(&mut s, almost);
    assert_eq!(published(&watcher.drain()), vec![], "not before the delay");

    // "never" comes back within its delay: its Will is cancelled.
    let mut back = connect_as(&mut s, 4, request("never", false, 60), almost);
    store.commit_all(&mut s, almost);
    assert!(session_present(&back.drain()));

    let after = t0 + Duration::from_secs(1);
    s.tick(after);
    store.commit_all(&mut s, after);
    let out = watcher.drain();
    assert_eq!(published(&out), vec![(Bytes::from_static(b"gone"), None)]);
    assert!(out.iter().any(|o| matches!(
        o,
        Outbound::Publish { message, .. } if &*message.topic == "will/late"
    )));

    let much_later = t0 + Duration::from_secs(30);
    s.tick(much_later);
    store.commit_all(&mut s, much_later);
    assert_eq!(
        published(&watcher.drain()),
        vec![],
        "the cancelled Will never comes"
    );
}

/// MQTT-3.3.2-5 / -6: a message queued for an offline session is dropped
/// once its Message Expiry Interval has passed; one still alive forwards
/// the time it has left.
#[test]
fn a_queued_message_expires_and_the_rest_carry_the_time_left() {
    let t0 = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let _c = connect(&mut s, 1, "sub", false, t0);
    packets(&mut s, 1, vec![subscribe("mx/#", 1)], t0);
    store.commit_all(&mut s, t0);
    closed(&mut s, 1, t0);
    store.commit_all(&mut s, t0);
    let _p = connect(&mut s, 2, "pub", true, t0);
    packets(
        &mut s,
        2,
        vec![
            expiring_publish("mx/short", b"short", 1, 1),
            expiring_publish("mx/long", b"long", 2, 60),
        ],
        t0,
    );
    store.commit_all(&mut s, t0);
    let later = t0 + Duration::from_millis(2100);
    let mut c = connect(&mut s, 3, "sub", false, later);
    store.commit_all(&mut s, later);
    let out = c.drain();
    assert!(session_present(&out));
    assert_eq!(
        published(&out),
        vec![(Bytes::from_static(b"long"), Some(58))],
        "the short one expired; the long one lost two whole seconds"
    );
    assert_eq!(s.metrics.dropped_count(DropReason::Expired), 1);
}

/// MQTT-3.3.2-6 with MQTT-4.4.0-1: a message resent on reconnect carries
/// the expiry left, not the original interval.
#[test]
fn a_resent_message_carries_the_expiry_left() {
    let t0 = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut c = connect(&mut s, 1, "sub", false, t0);
    packets(&mut s, 1, vec![subscribe("mxr", 1)], t0);
    store.commit_all(&mut s, t0);
    c.drain();
    let _p = connect(&mut s, 2, "pub", true, t0);
    packets(&mut s, 2, vec![expiring_publish("mxr", b"x", 1, 60)], t0);
    store.commit_all(&mut s, t0);
    assert_eq!(
        published(&c.drain()),
        vec![(Bytes::from_static(b"x"), Some(60))]
    );
    // Not acknowledged: the connection ends with the message in flight.
    closed(&mut s, 1, t0);
    store.commit_all(&mut s, t0);
    let later = t0 + Duration::from_millis(1100);
    let mut c = connect(&mut s, 3, "sub", false, later);
    store.commit_all(&mut s, later);
    let out = c.drain();
    assert!(out
        .iter()
        .any(|o| matches!(o, Outbound::Publish { dup: true, .. })));
    assert_eq!(published(&out), vec![(Bytes::from_static(b"x"), Some(59))]);
}

// ---- append channels ------------------------------------------------------

/// A state serving one append channel, `telemetry`, with `next` as given.
fn channel_state(limits: Limits, next: u64) -> BrokerState {
    let mut s = state_with(limits);
    s.restore(
        Restored {
            channels: vec![RestoredChannel {
                name: "telemetry".into(),
                next,
                positions: Vec::new(),
                holds: Vec::new(),
            }],
            ..Restored::default()
        },
        Instant::now(),
    );
    let mut none = Vec::new();
    s.take_intents(&mut none);
    s
}

/// The offsets (and gaps) of the channel records in `out`, in order.
fn channel_deliveries(out: &[Outbound]) -> Vec<(u64, Option<String>)> {
    out.iter()
        .filter_map(|o| match o {
            Outbound::Publish { message, .. } => {
                let props = &message.properties.user_properties;
                let offset = props
                    .iter()
                    .find(|(k, _)| k == OFFSET_PROPERTY)?
                    .1
                    .parse()
                    .ok()?;
                let gap = props
                    .iter()
                    .find(|(k, _)| k == GAP_PROPERTY)
                    .map(|(_, v)| v.clone());
                Some((offset, gap))
            }
            _ => None,
        })
        .collect()
}

fn puback_ids(out: &[Outbound]) -> Vec<u16> {
    out.iter()
        .filter_map(|o| match o {
            Outbound::PubAck { packet_id, reason } if *reason == ReasonCode::Success => {
                Some(*packet_id)
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_channel_publish_is_answered_after_its_commit_and_handed_to_a_caught_up_consumer() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut consumer = connect(&mut s, 1, "reader", true, now);
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    packets(&mut s, 1, vec![subscribe("telemetry/#", 1)], now);
    store.commit_all(&mut s, now);
    consumer.drain();
    publisher.drain();
    packets(&mut s, 2, vec![publish("telemetry/a", 1, 7)], now);
    // Nothing before the commit: no PUBACK, no delivery.
    assert!(puback_ids(&publisher.drain()).is_empty());
    assert!(consumer.drain().is_empty());
    store.commit_all(&mut s, now);
    assert_eq!(puback_ids(&publisher.drain()), vec![7]);
    assert_eq!(channel_deliveries(&consumer.drain()), vec![(1, None)]);
    // The record in hand: no read was needed.
    let mut reads = Vec::new();
    s.take_reads(&mut reads);
    assert!(reads.is_empty());
    // A broadcast subscriber of `#` gets nothing of the channel.
    assert_eq!(store.channel.len(), 1);
}

#[test]
fn a_consumer_behind_its_window_reads_from_the_store_in_order_without_a_hole() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    // Receive Maximum 10 (see `request`).
    let mut consumer = connect(&mut s, 1, "reader", false, now);
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    packets(&mut s, 1, vec![subscribe("telemetry/#", 1)], now);
    store.commit_all(&mut s, now);
    consumer.drain();
    let burst: Vec<Inbound> = (1..=25).map(|i| publish("telemetry/a", 1, i)).collect();
    packets(&mut s, 2, burst, now);
    store.commit_all(&mut s, now);
    assert_eq!(puback_ids(&publisher.drain()).len(), 25);
    let mut out = consumer.drain();
    let mut got: Vec<u64> = channel_deliveries(&out)
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    assert_eq!(got, (1..=10).collect::<Vec<u64>>());
    // Acknowledging frees the window: the rest is read, not queued. The
    // last window is left unacknowledged.
    while got.len() < 25 {
        let acks: Vec<Inbound> = publish_ids(&out)
            .into_iter()
            .map(|packet_id| Inbound::PubAck {
                packet_id,
                reason: ReasonCode::Success,
            })
            .collect();
        packets(&mut s, 1, acks, now);
        assert_eq!(store.answer_reads(&mut s, 1, now), 1, "one read per window");
        out = consumer.drain();
        got.extend(channel_deliveries(&out).into_iter().map(|(o, _)| o));
    }
    assert_eq!(got, (1..=25).collect::<Vec<u64>>());
    // The stored position passes only what was acknowledged: 1..=20.
    s.flush(now);
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    let saved: Vec<u64> = intents
        .iter()
        .flat_map(|i| i.writes.iter())
        .filter_map(|w| match w {
            Write::SavePosition(p) => Some(p.offset),
            _ => None,
        })
        .collect();
    assert_eq!(saved, vec![21]);
}

#[test]
fn records_removed_before_a_consumer_got_them_are_announced_as_a_gap() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    let burst: Vec<Inbound> = (1..=8).map(|i| publish("telemetry/a", 1, i)).collect();
    packets(&mut s, 2, burst, now);
    store.commit_all(&mut s, now);
    publisher.drain();
    let mut consumer = connect(&mut s, 1, "reader", true, now);
    let mut from_two = subscribe("telemetry/#", 1);
    if let Inbound::Subscribe {
        user_properties, ..
    } = &mut from_two
    {
        user_properties.push((FROM_PROPERTY.into(), "2".into()));
    }
    packets(&mut s, 1, vec![from_two], now);
    store.commit_all(&mut s, now);
    // Retention removed 1..=5: the floor is 6.
    store.answer_reads(&mut s, 6, now);
    let got = channel_deliveries(&consumer.drain());
    assert_eq!(got[0], (6, Some("2-5".to_owned())));
    assert_eq!(got[1], (7, None));
    assert_eq!(got[2], (8, None));
    assert_eq!(got.len(), 3);
}

#[test]
fn a_qos2_publish_into_a_channel_is_held_until_its_release_and_stored_once() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut consumer = connect(&mut s, 1, "reader", true, now);
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    packets(&mut s, 1, vec![subscribe("telemetry/#", 2)], now);
    store.commit_all(&mut s, now);
    consumer.drain();
    publisher.drain();
    packets(&mut s, 2, vec![publish("telemetry/a", 2, 9)], now);
    store.commit_all(&mut s, now);
    let out = publisher.drain();
    assert!(matches!(
        out.as_slice(),
        [Outbound::PubRec {
            packet_id: 9,
            reason: ReasonCode::Success
        }]
    ));
    assert!(store.channel.is_empty(), "held without an offset");
    // A duplicate before the release makes no second record.
    packets(&mut s, 2, vec![publish("telemetry/a", 2, 9)], now);
    store.commit_all(&mut s, now);
    publisher.drain();
    packets(&mut s, 2, vec![Inbound::PubRel { packet_id: 9 }], now);
    assert!(publisher.drain().is_empty(), "PUBCOMP waits for the write");
    store.commit_all(&mut s, now);
    assert!(matches!(
        publisher.drain().as_slice(),
        [Outbound::PubComp {
            packet_id: 9,
            reason: ReasonCode::Success
        }]
    ));
    assert_eq!(store.channel.len(), 1);
    assert_eq!(channel_deliveries(&consumer.drain()), vec![(1, None)]);
}

#[test]
fn a_failed_channel_write_answers_its_reason_and_delivers_nothing() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut consumer = connect(&mut s, 1, "reader", true, now);
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    packets(&mut s, 1, vec![subscribe("telemetry/#", 1)], now);
    store.commit_all(&mut s, now);
    consumer.drain();
    publisher.drain();
    packets(&mut s, 2, vec![publish("telemetry/a", 1, 3)], now);
    store.fail_all(&mut s, now, true);
    assert!(matches!(
        publisher.drain().as_slice(),
        [Outbound::PubAck {
            packet_id: 3,
            reason: ReasonCode::QuotaExceeded
        }]
    ));
    assert!(consumer.drain().is_empty());
}

#[test]
fn saguin_from_takes_earliest_an_offset_or_a_time() {
    assert_eq!(parse_from("earliest"), Ok(Seek::Earliest));
    assert_eq!(parse_from("42"), Ok(Seek::Offset(42)));
    assert_eq!(parse_from("0"), Ok(Seek::Offset(1)));
    assert_eq!(
        parse_from("2026-12-01T10:00:00Z"),
        Ok(Seek::Time(1_796_119_200_000_000_000))
    );
    assert!(parse_from("yesterday").is_err());
}

#[test]
fn a_bridge_skips_what_arrived_over_a_bridge_and_keeps_its_place_past_its_session() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut bridge_request = request("bridge:cloud", true, 0);
    bridge_request.bridge = Some("cloud".into());
    let mut bridge = connect_as(&mut s, 1, bridge_request.clone(), now);
    packets(&mut s, 1, vec![subscribe("telemetry/#", 1)], now);
    let mut inbound_request = request("bridge:edge", true, 0);
    inbound_request.bridge = Some("edge".into());
    let mut inbound = connect_as(&mut s, 2, inbound_request, now);
    let mut local = connect(&mut s, 3, "sensor", true, now);
    store.commit_all(&mut s, now);
    bridge.drain();
    inbound.drain();
    local.drain();
    packets(&mut s, 2, vec![publish("telemetry/from-remote", 1, 1)], now);
    packets(&mut s, 3, vec![publish("telemetry/local", 1, 1)], now);
    store.commit_all(&mut s, now);
    assert_eq!(store.channel[0].bridge.as_deref(), Some("edge"));
    assert_eq!(store.channel[1].bridge, None);
    // Only the local record goes out again.
    let out = bridge.drain();
    assert_eq!(channel_deliveries(&out), vec![(2, None)]);
    let acks = publish_ids(&out)
        .into_iter()
        .map(|packet_id| Inbound::PubAck {
            packet_id,
            reason: ReasonCode::Success,
        })
        .collect();
    packets(&mut s, 1, acks, now);
    closed(&mut s, 1, now);
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    let saved: Vec<(String, u64, Option<u32>)> = intents
        .iter()
        .flat_map(|i| i.writes.iter())
        .filter_map(|w| match w {
            Write::SavePosition(p) => Some((p.reader.to_string(), p.offset, p.session_expiry)),
            Write::DropPosition(r) => panic!("the bridge's place was dropped: {r}"),
            _ => None,
        })
        .collect();
    assert_eq!(saved, vec![("bridge:cloud".to_owned(), 3, None)]);
    // Connecting again, it resumes there rather than at the end.
    packets(&mut s, 3, vec![publish("telemetry/local", 1, 2)], now);
    let mut sink = FakeStore {
        channel: store.channel.clone(),
        ..FakeStore::default()
    };
    sink.commit_all(&mut s, now);
    let mut bridge = connect_as(&mut s, 4, bridge_request, now);
    packets(&mut s, 4, vec![subscribe("telemetry/#", 1)], now);
    sink.commit_all(&mut s, now);
    sink.answer_reads(&mut s, 1, now);
    assert_eq!(channel_deliveries(&bridge.drain()), vec![(3, None)]);
}

#[test]
fn a_shared_group_over_a_channel_hands_each_record_to_one_member_and_takes_back_a_leavers() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut a = connect(&mut s, 1, "worker-a", true, now);
    let mut b = connect(&mut s, 2, "worker-b", true, now);
    let mut publisher = connect(&mut s, 3, "writer", true, now);
    packets(&mut s, 1, vec![subscribe("$share/g/telemetry/#", 1)], now);
    packets(&mut s, 2, vec![subscribe("$share/g/telemetry/#", 1)], now);
    store.commit_all(&mut s, now);
    a.drain();
    b.drain();
    let burst: Vec<Inbound> = (1..=6).map(|i| publish("telemetry/a", 1, i)).collect();
    packets(&mut s, 3, burst, now);
    store.commit_all(&mut s, now);
    publisher.drain();
    let got_a: Vec<u64> = channel_deliveries(&a.drain())
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    let got_b: Vec<u64> = channel_deliveries(&b.drain())
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    let mut all: Vec<u64> = got_a.iter().chain(&got_b).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (1..=6).collect::<Vec<u64>>(), "each record once");
    assert_eq!(got_a.len(), 3);
    // `a` goes away without acknowledging: its records go to `b`.
    s.handle(
        Event::Closed {
            connection: 1,
            reason: CloseReason::Network,
            disconnect_reason: None,
        },
        now,
    );
    store.commit_all(&mut s, now);
    store.answer_reads(&mut s, 1, now);
    let again: Vec<u64> = channel_deliveries(&b.drain())
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    for offset in &got_a {
        assert!(
            again.contains(offset),
            "{offset} returned to the group: {again:?}"
        );
    }
}
