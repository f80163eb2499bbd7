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
use crate::broker::subscriptions::SubOptions;

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
            self.commit(s, intents, now);
        }
    }

    /// Answer `intents`, taken from the state earlier, in order.
    fn commit(&mut self, s: &mut BrokerState, intents: Vec<Intent>, now: Instant) {
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
                    Write::DropChannelHold {
                        client_id,
                        packet_id,
                    } => {
                        self.holds.remove(&(client_id.clone(), *packet_id));
                        Written::Done
                    }
                    _ => Written::Done,
                }
            })
            .collect()
    }

    fn store_in_channel(&mut self, mut record: saguin_format::model::Record) -> Written {
        record.offset = self.channel.len() as u64 + 1;
        self.channel.push(record.clone());
        Written::Stored(0, Arc::new(record))
    }

    /// Answer every read the state asked for from channel 0, whose records
    /// below `floor` are gone.
    fn answer_reads(&mut self, s: &mut BrokerState, floor: u64, now: Instant) -> usize {
        let mut reads = Vec::new();
        s.take_reads(&mut reads);
        let count = reads.len();
        for read in reads {
            let from = match read.from {
                Seek::Offset(from) => from,
                // The oldest held: no gap to tell.
                Seek::Earliest => floor,
                other => panic!("{other:?} is not sought here"),
            };
            let start = from.max(floor);
            let records = self
                .channel
                .iter()
                .filter(|r| r.offset >= start)
                .take(read.max)
                .cloned()
                .map(Arc::new)
                .collect();
            s.handle(
                Event::ChannelRead {
                    ticket: read.ticket,
                    result: Ok(ReadWindow {
                        start,
                        floor: (start > from).then_some(start),
                        records,
                        next: None,
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
            read_order: 0,
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
            retained: vec![Arc::new(record(0, 0))],
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
        properties: MessageProperties::from(crate::broker::codec::PublishProperties {
            message_expiry_interval: Some(seconds),
            ..Default::default()
        }),
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

#[test]
fn restored_sessions_are_owed_what_the_log_holds_for_them_from_their_cursors() {
    use crate::storage::contract::{SessionEntry, SubscriptionEntry};
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_queued_messages: 2,
        ..Limits::default()
    });
    let session = |client_id: &str, filter: &str| SessionEntry {
        client_id: client_id.into(),
        principal: None,
        expiry_interval: 300,
        detached_at: 1_700_000_000_000_000_000,
        subscriptions: vec![SubscriptionEntry {
            filter: filter.into(),
            qos: 1,
            no_local: false,
            retain_as_published: false,
            retain_handling: 0,
            subscription_id: None,
            log_offset: 1,
        }],
        will: None,
        window: 10,
        inflight: Vec::new(),
    };
    let record = |offset: u64, topic: &str, owed_to: Option<&str>| saguin_format::model::Record {
        offset,
        qos: 1,
        timestamp: 1_700_000_000_000_000_000,
        owed_to: owed_to.map(str::to_owned),
        ..saguin_format::model::Record::new(topic, Bytes::from(format!("{offset}")))
    };
    let summary = s.restore(
        Restored {
            sessions: vec![
                session("all", "dev/#"),
                session("late", "dev/+"),
                session("one", "dev/one"),
                session("quiet", "other"),
            ],
            // `late` was sent everything before offset 3.
            cursors: vec![
                ("all".into(), 1),
                ("late".into(), 3),
                ("one".into(), 1),
                ("quiet".into(), 1),
            ],
            log: vec![
                record(1, "dev/one", None),
                record(2, "dev/two", None),
                // A copy kept for `one` alone (a message it was owed when
                // others were not): nobody else is offered it.
                record(3, "dev/one", Some("one")),
                record(4, "dev/three", None),
                record(5, "dev/one", None),
            ],
            log_next: 6,
            ..Restored::default()
        },
        now,
    );
    assert_eq!(summary.sessions, 4);
    let owed = |s: &BrokerState, client_id: &str| -> Vec<u64> {
        let key = s.by_client_id[client_id];
        s.sessions[&key]
            .pending
            .iter()
            .filter_map(|q| q.log_offset)
            .collect()
    };
    // At most `max_queued_messages` each, the oldest first.
    assert_eq!(owed(&s, "all"), vec![1, 2]);
    assert_eq!(owed(&s, "late"), vec![4, 5]);
    assert_eq!(owed(&s, "one"), vec![1, 3]);
    assert!(owed(&s, "quiet").is_empty());
    assert_eq!(summary.queued, 6);
    assert_eq!(
        s.log_references(),
        vec![(1, 2), (2, 1), (3, 1), (4, 1), (5, 1)]
    );
}

// ---- append channels ------------------------------------------------------

/// A state serving one append channel, `telemetry`, with `next` as given.
fn channel_state(limits: Limits, next: u64) -> BrokerState {
    let mut s = state_with(limits);
    s.restore(
        Restored {
            channels: vec![RestoredChannel {
                name: "telemetry".into(),
                kind: saguin_format::model::ChannelKind::Append,
                queue: None,
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
fn a_consumer_behind_its_window_is_sent_the_tail_from_memory_in_order_without_a_hole() {
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
    // Acknowledging frees the window: the rest comes from the records the
    // channel kept as they were committed, not from a read, and was not
    // queued for the consumer. The last window is left unacknowledged.
    while got.len() < 25 {
        packets(&mut s, 1, acks_of(&out), now);
        assert_eq!(store.answer_reads(&mut s, 1, now), 0, "no read");
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

/// `telemetry` holding records 1..=`records`, published by connection 2.
fn channel_holding(records: u16, now: Instant) -> (BrokerState, FakeStore) {
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    let burst: Vec<Inbound> = (1..=records)
        .map(|i| publish("telemetry/a", 1, i))
        .collect();
    packets(&mut s, 2, burst, now);
    store.commit_all(&mut s, now);
    publisher.drain();
    (s, store)
}

/// A SUBSCRIBE of `telemetry/#` at QoS 1 with `saguin-from: from`.
fn subscribe_from(from: &str) -> Inbound {
    let mut packet = subscribe("telemetry/#", 1);
    if let Inbound::Subscribe {
        user_properties, ..
    } = &mut packet
    {
        user_properties.push((FROM_PROPERTY.into(), from.into()));
    }
    packet
}

#[test]
fn records_removed_before_a_consumer_got_them_are_announced_as_a_gap() {
    let now = Instant::now();
    let (mut s, mut store) = channel_holding(8, now);
    let mut consumer = connect(&mut s, 1, "reader", true, now);
    packets(&mut s, 1, vec![subscribe_from("2")], now);
    store.commit_all(&mut s, now);
    // Retention removed 1..=5: the floor is 6.
    store.answer_reads(&mut s, 6, now);
    let got = channel_deliveries(&consumer.drain());
    assert_eq!(got[0], (6, Some("2-5".to_owned())));
    assert_eq!(got[1], (7, None));
    assert_eq!(got[2], (8, None));
    assert_eq!(got.len(), 3);
}

/// Every delivery in `out` acknowledged.
fn acks_of(out: &[Outbound]) -> Vec<Inbound> {
    publish_ids(out)
        .into_iter()
        .map(|packet_id| Inbound::PubAck {
            packet_id,
            reason: ReasonCode::Success,
        })
        .collect()
}

/// `telemetry` holding records 1..=`records` committed before any
/// consumer came (so none is kept in memory), then the persistent QoS 1
/// consumers `readers` (connections 3, 4, ..., Receive Maximum 10 each)
/// subscribed from offset 1: every record takes a read. The reads their
/// SUBSCRIBEs asked for are left for the caller to answer.
fn consumers_behind_the_tail(
    readers: &[&str],
    records: u16,
    now: Instant,
) -> (BrokerState, FakeStore, Vec<Client>) {
    let (mut s, mut store) = channel_holding(records, now);
    let clients = (3..)
        .zip(readers)
        .map(|(conn, id)| {
            let mut client = connect(&mut s, conn, id, false, now);
            packets(&mut s, conn, vec![subscribe_from("1")], now);
            store.commit_all(&mut s, now);
            client.drain();
            client
        })
        .collect();
    (s, store, clients)
}

fn offsets_of(out: &[Outbound]) -> Vec<u64> {
    channel_deliveries(out)
        .into_iter()
        .map(|(o, _)| o)
        .collect()
}

#[test]
fn a_consumer_behind_the_tail_reads_from_the_store_one_window_at_a_time() {
    let now = Instant::now();
    let (mut s, mut store, clients) = consumers_behind_the_tail(&["reader"], 25, now);
    let mut consumer = clients.into_iter().next().expect("reader");
    let mut got = Vec::new();
    let mut reads = Vec::new();
    while got.len() < 25 {
        reads.push(store.answer_reads(&mut s, 1, now));
        let out = consumer.drain();
        got.extend(offsets_of(&out));
        packets(&mut s, 3, acks_of(&out), now);
    }
    assert_eq!(got, (1..=25).collect::<Vec<u64>>());
    // The first read asks for the room's worth; once the records' size is
    // known a read asks for more, and the last window needs none.
    assert_eq!(reads, vec![1, 1, 0]);
}

#[test]
fn consumers_near_each_other_share_one_read_and_a_read_runs_past_the_room() {
    let now = Instant::now();
    let (mut s, mut store, clients) = consumers_behind_the_tail(&["first", "second"], 40, now);
    let mut clients = clients.into_iter();
    let mut first = clients.next().expect("first");
    let mut second = clients.next().expect("second");

    // Both start at offset 1: the second waits for the read the first
    // asked for, which asks for its room's worth (nothing says yet how
    // large the channel's records are).
    let mut reads = Vec::new();
    s.take_reads(&mut reads);
    assert_eq!(reads.iter().map(|r| r.max).collect::<Vec<_>>(), vec![10]);
    s.reads = reads;
    assert_eq!(store.answer_reads(&mut s, 1, now), 1);
    let out_first = first.drain();
    let out_second = second.drain();
    assert_eq!(offsets_of(&out_first), (1..=10).collect::<Vec<u64>>());
    assert_eq!(offsets_of(&out_second), (1..=10).collect::<Vec<u64>>());
    // Each record's message built once for both.
    let message = |out: &[Outbound], i: usize| match &out[i] {
        Outbound::Publish { message, .. } => message.clone(),
        other => panic!("{other:?}"),
    };
    assert!(Arc::ptr_eq(
        &message(&out_first, 0),
        &message(&out_second, 0)
    ));

    // Small records: the next read asks for more than the room, and the
    // second, behind it, is handed what it found with no read of its own.
    packets(&mut s, 3, acks_of(&out_first), now);
    let mut reads = Vec::new();
    s.take_reads(&mut reads);
    assert_eq!(reads.len(), 1);
    assert!(reads[0].max > 10, "asked for {}", reads[0].max);
    s.reads = reads;
    store.answer_reads(&mut s, 1, now);
    let out_first = first.drain();
    assert_eq!(offsets_of(&out_first), (11..=20).collect::<Vec<u64>>());
    packets(&mut s, 4, acks_of(&out_second), now);
    assert_eq!(store.answer_reads(&mut s, 1, now), 0, "no read");
    assert_eq!(offsets_of(&second.drain()), (11..=20).collect::<Vec<u64>>());

    // What did not fit is handed on from memory when the room comes back.
    packets(&mut s, 3, acks_of(&out_first), now);
    assert_eq!(store.answer_reads(&mut s, 1, now), 0, "no read");
    assert_eq!(offsets_of(&first.drain()), (21..=30).collect::<Vec<u64>>());
}

#[test]
fn consumers_at_one_place_read_once_and_a_failed_read_is_tried_again_for_each() {
    let now = Instant::now();
    let readers = ["a", "b", "c", "d"];
    let (mut s, mut store, mut clients) = consumers_behind_the_tail(&readers, 5, now);
    // Four consumers at offset 1: one read.
    let mut reads = Vec::new();
    s.take_reads(&mut reads);
    assert_eq!(reads.len(), 1);
    let read = reads.remove(0);
    s.handle(
        Event::ChannelRead {
            ticket: read.ticket,
            result: Err(StorageFailure {
                full: false,
                message: "disk I/O error".into(),
            }),
        },
        now,
    );
    for client in &mut clients {
        assert!(offsets_of(&client.drain()).is_empty());
    }
    // The tick tries again: still one read for the four, and each is sent
    // every record once.
    s.tick(now + Duration::from_secs(1));
    assert_eq!(store.answer_reads(&mut s, 1, now), 1);
    for client in &mut clients {
        assert_eq!(offsets_of(&client.drain()), (1..=5).collect::<Vec<u64>>());
    }
}

#[test]
fn records_retention_removed_are_not_handed_on_from_memory_but_told_as_a_gap() {
    let now = Instant::now();
    let (mut s, mut store, clients) = consumers_behind_the_tail(&["reader"], 40, now);
    let mut consumer = clients.into_iter().next().expect("reader");
    // Two windows read; the second read found 11..=40 (more than the
    // room, the records' size known by then), of which 11..=20 were sent.
    assert_eq!(store.answer_reads(&mut s, 1, now), 1);
    let out = consumer.drain();
    packets(&mut s, 3, acks_of(&out), now);
    assert_eq!(store.answer_reads(&mut s, 1, now), 1);
    let out = consumer.drain();
    assert_eq!(offsets_of(&out), (11..=20).collect::<Vec<u64>>());
    packets(&mut s, 3, acks_of(&out), now);
    assert_eq!(store.answer_reads(&mut s, 1, now), 0, "kept");
    let out = consumer.drain();
    assert_eq!(offsets_of(&out), (21..=30).collect::<Vec<u64>>());
    s.handle(
        Event::FloorRaised {
            channel: "telemetry".into(),
            floor: 36,
        },
        now,
    );
    packets(&mut s, 3, acks_of(&out), now);
    assert_eq!(
        store.answer_reads(&mut s, 36, now),
        1,
        "read, not remembered"
    );
    let got = channel_deliveries(&consumer.drain());
    assert_eq!(got[0], (36, Some("31-35".to_owned())));
    assert_eq!(
        got[1..].iter().map(|(o, _)| *o).collect::<Vec<u64>>(),
        (37..=40).collect::<Vec<u64>>()
    );
}

/// A consumer (connection 1) of `telemetry` at `consumer_qos` and a
/// publisher (connection 2) whose QoS 2 publish `packet_id` into it was
/// held and PUBRECed.
fn channel_hold(
    consumer_qos: u8,
    packet_id: u16,
    now: Instant,
) -> (BrokerState, FakeStore, Client, Client) {
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut consumer = connect(&mut s, 1, "reader", true, now);
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    packets(&mut s, 1, vec![subscribe("telemetry/#", consumer_qos)], now);
    store.commit_all(&mut s, now);
    consumer.drain();
    publisher.drain();
    packets(&mut s, 2, vec![publish("telemetry/a", 2, packet_id)], now);
    store.commit_all(&mut s, now);
    let out = publisher.drain();
    assert!(
        matches!(
            out.as_slice(),
            [Outbound::PubRec { packet_id: id, reason: ReasonCode::Success }] if *id == packet_id
        ),
        "{out:?}"
    );
    assert!(store.channel.is_empty(), "held without an offset");
    assert_eq!(store.holds.len(), 1);
    (s, store, consumer, publisher)
}

#[test]
fn a_qos2_publish_into_a_channel_is_held_until_its_release_and_stored_once() {
    let now = Instant::now();
    let (mut s, mut store, mut consumer, mut publisher) = channel_hold(2, 9, now);
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
fn an_unreleased_hold_in_a_channel_expires_is_counted_and_never_becomes_a_record() {
    let now = Instant::now();
    let (mut s, mut store, mut consumer, mut publisher) = channel_hold(1, 4, now);
    let soon = now + Duration::from_secs(10);
    s.tick(soon);
    store.commit_all(&mut s, soon);
    assert_eq!(store.holds.len(), 1, "not yet expired");
    s.next_exactly_once_sweep = None;
    let later = now + Duration::from_secs(3601);
    s.tick(later);
    store.commit_all(&mut s, later);
    assert!(store.holds.is_empty(), "the channel's hold is dropped");
    assert_eq!(s.metrics.dropped_count(DropReason::ExactlyOnceExpired), 1);
    // Its late release is answered as unknown and writes nothing.
    packets(&mut s, 2, vec![Inbound::PubRel { packet_id: 4 }], later);
    store.commit_all(&mut s, later);
    assert!(matches!(
        publisher.drain().as_slice(),
        [Outbound::PubComp {
            packet_id: 4,
            reason: ReasonCode::PacketIdentifierNotFound
        }]
    ));
    assert!(store.channel.is_empty(), "no record from an expired hold");
    assert!(channel_deliveries(&consumer.drain()).is_empty());
}

#[test]
fn a_failed_channel_write_answers_its_reason_counts_a_qos0_drop_and_delivers_nothing() {
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
    // A QoS 0 publish has nobody to tell: it is counted, never silent.
    assert_eq!(s.metrics.dropped_count(DropReason::StorageFailed), 0);
    packets(&mut s, 2, vec![publish("telemetry/a", 0, 0)], now);
    store.fail_all(&mut s, now, false);
    assert!(publisher.drain().is_empty());
    assert!(consumer.drain().is_empty());
    assert_eq!(s.metrics.dropped_count(DropReason::StorageFailed), 1);
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
    packets(&mut s, 1, acks_of(&out), now);
    closed(&mut s, 1, now);
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    assert!(
        !intents
            .iter()
            .flat_map(|i| i.writes.iter())
            .any(|w| matches!(w, Write::DropPosition(_))),
        "the bridge's place was dropped"
    );
    let saved = positions_saved(&intents);
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
fn a_bridges_qos2_hold_outlives_its_connection_and_is_named_again_on_the_next() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut bridge_request = request("bridge:cloud", true, 0);
    bridge_request.bridge = Some("cloud".into());
    let mut bridge = connect_as(&mut s, 1, bridge_request.clone(), now);
    store.commit_all(&mut s, now);
    bridge.drain();
    packets(&mut s, 1, vec![publish("telemetry/a", 2, 7)], now);
    store.commit_all(&mut s, now);
    assert!(matches!(
        bridge.drain().as_slice(),
        [Outbound::PubRec { packet_id: 7, .. }]
    ));
    closed(&mut s, 1, now);
    store.commit_all(&mut s, now);
    assert!(
        !store
            .writes
            .iter()
            .any(|w| matches!(w, Write::DropChannelHold { .. })),
        "the hold waits for the remote's release"
    );
    assert_eq!(store.holds.len(), 1);
    // The next connection is told of it, and its PUBREL writes it once.
    let mut bridge = connect_as(&mut s, 2, bridge_request, now);
    store.commit_all(&mut s, now);
    let out = bridge.drain();
    assert!(
        matches!(
            out.as_slice(),
            [
                Outbound::ConnAck { .. },
                Outbound::PubRec {
                    packet_id: 7,
                    reason: ReasonCode::Success
                }
            ]
        ),
        "{out:?}"
    );
    packets(&mut s, 2, vec![Inbound::PubRel { packet_id: 7 }], now);
    store.commit_all(&mut s, now);
    assert!(matches!(
        bridge.drain().as_slice(),
        [Outbound::PubComp {
            packet_id: 7,
            reason: ReasonCode::Success
        }]
    ));
    assert_eq!(store.channel.len(), 1);
    assert_eq!(store.channel[0].bridge.as_deref(), Some("cloud"));
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

// ---- latest and queue channels -------------------------------------------

use crate::storage::contract::{ChannelStore, Provider as _};
use saguin_format::model::ChannelKind;

/// The persisters and readers of a few real memory channels, answering the
/// state's intents and reads as the server does, with one kind of write
/// failed on demand.
struct MemoryChannels {
    stores: Vec<ChannelStore>,
    /// Writes of this name fail (as a full provider would) while set.
    fail: Option<&'static str>,
}

impl MemoryChannels {
    /// Channels of `kinds` in one memory provider; a queue is followed by
    /// its dead-letter channel, as the broker serves it.
    fn open(kinds: &[(&str, ChannelKind)]) -> (MemoryChannels, Vec<RestoredChannel>) {
        let provider =
            crate::storage::memory::MemoryProvider::new(crate::storage::memory::MemoryConfig {
                name: "mem".into(),
                max_bytes: None,
                reserve: 0,
            })
            .unwrap();
        let mut stores = Vec::new();
        for (name, kind) in kinds {
            let store = provider.open_channel(name, *kind).unwrap();
            let dead_letter = store.as_queue().map(|q| q.dead_letter());
            stores.push(store);
            if let Some(d) = dead_letter {
                stores.push(ChannelStore::Append(d));
            }
        }
        let restored = stores
            .iter()
            .enumerate()
            .map(|(i, store)| RestoredChannel {
                name: store.name().into(),
                kind: store.kind(),
                next: 1,
                queue: store.as_queue().map(|_| QueueSetup {
                    lease: Duration::from_secs(30),
                    dead_letter: Some(i as u16 + 1),
                }),
                positions: Vec::new(),
                holds: Vec::new(),
            })
            .collect();
        (MemoryChannels { stores, fail: None }, restored)
    }

    fn queue(&self, index: usize) -> &Arc<dyn crate::storage::contract::QueueStore> {
        self.stores[index].as_queue().unwrap()
    }

    fn apply(
        &self,
        index: u16,
        write: &Write,
    ) -> Result<Written, crate::storage::contract::StorageError> {
        let name = match write {
            Write::Lease { .. } => "lease",
            Write::Resolve { .. } => "resolve",
            Write::ReleaseLease { .. } => "release",
            Write::Append(_) => "append",
            _ => "other",
        };
        if self.fail == Some(name) {
            return Err(crate::storage::contract::StorageError::ProviderFull {
                provider: "mem".into(),
                size: 1,
                used: 1,
                limit: 1,
            });
        }
        let store = &self.stores[index as usize];
        Ok(match (write, store) {
            (Write::Append(r), ChannelStore::Append(s)) => {
                Written::Stored(index, Arc::new(s.append(r.clone())?))
            }
            (Write::Append(r), ChannelStore::Latest(s)) => {
                Written::Stored(index, Arc::new(s.set(r.clone())?))
            }
            (Write::Append(r), ChannelStore::Queue(s)) => {
                Written::Stored(index, Arc::new(s.enqueue(r.clone())?))
            }
            (Write::SavePosition(p), ChannelStore::Latest(s)) => {
                s.save_position(p.clone())?;
                Written::Done
            }
            (
                Write::Lease {
                    offset,
                    holder,
                    lease_until,
                    now,
                },
                ChannelStore::Queue(s),
            ) => Written::Leased(
                index,
                Box::new(s.lease(*offset, holder, *lease_until, *now)?),
            ),
            (Write::Resolve { delivery_id, epoch }, ChannelStore::Queue(s)) => {
                Written::Resolved(index, *delivery_id, s.resolve(*delivery_id, *epoch)?)
            }
            (
                Write::ReleaseLease {
                    delivery_id,
                    epoch,
                    now,
                    reason,
                },
                ChannelStore::Queue(s),
            ) => Written::Released(
                index,
                *delivery_id,
                s.release(*delivery_id, *epoch, *now, reason)?,
            ),
            _ => Written::Done,
        })
    }

    /// Write `intents` (taken from the state earlier) and answer them.
    fn commit(&self, s: &mut BrokerState, intents: Vec<Intent>, now: Instant) {
        for intent in intents {
            let result = match intent.role {
                Role::Channel(i) => intent
                    .writes
                    .iter()
                    .map(|w| self.apply(i, w))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| StorageFailure {
                        full: e.is_full(),
                        message: e.to_string(),
                    }),
                _ => Ok(vec![Written::Done; intent.writes.len()]),
            };
            s.handle(
                Event::Committed {
                    ticket: intent.ticket,
                    result,
                },
                now,
            );
        }
    }

    /// Answer every intent and read until the state asks for nothing more.
    fn settle(&self, s: &mut BrokerState, now: Instant) {
        loop {
            let mut intents = Vec::new();
            s.take_intents(&mut intents);
            let mut reads = Vec::new();
            s.take_reads(&mut reads);
            if intents.is_empty() && reads.is_empty() {
                return;
            }
            self.commit(s, intents, now);
            for read in reads {
                if self.fail == Some("values") && read.from == Seek::Current {
                    let result = Err(StorageFailure {
                        full: false,
                        message: "unreadable".into(),
                    });
                    s.handle(
                        Event::ChannelRead {
                            ticket: read.ticket,
                            result,
                        },
                        now,
                    );
                    continue;
                }
                let result = match &self.stores[read.channel as usize] {
                    ChannelStore::Append(st) => {
                        crate::broker::reader::read_window(&**st, read.from, read.max)
                    }
                    ChannelStore::Latest(st) => crate::broker::reader::read_latest(
                        &**st,
                        read.from,
                        &read.filters,
                        read.max,
                    ),
                    ChannelStore::Queue(st) => {
                        crate::broker::reader::read_queue(&**st, read.from, read.max)
                    }
                }
                .map_err(|e| StorageFailure {
                    full: false,
                    message: e.to_string(),
                });
                s.handle(
                    Event::ChannelRead {
                        ticket: read.ticket,
                        result,
                    },
                    now,
                );
            }
        }
    }
}

fn kinds_state(kinds: &[(&str, ChannelKind)]) -> (BrokerState, MemoryChannels) {
    let (channels, restored) = MemoryChannels::open(kinds);
    let mut s = state();
    s.restore(
        Restored {
            channels: restored,
            ..Restored::default()
        },
        Instant::now(),
    );
    let mut none = Vec::new();
    s.take_intents(&mut none);
    (s, channels)
}

fn publish_payload(topic: &str, payload: &'static [u8], id: u16) -> Inbound {
    Inbound::Publish(InboundPublish {
        packet_id: id,
        qos: 1,
        retain: false,
        dup: false,
        topic: ByteStr::from(topic),
        payload: Bytes::from_static(payload),
        properties: MessageProperties::default(),
    })
}

fn subscribe_with(filter: &str, qos: u8, retain_handling: u8) -> Inbound {
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
                retain_handling,
                subscription_id: None,
            },
        )],
    }
}

/// The PUBLISHes in `out`: topic, payload, retain flag and packet id.
fn deliveries(out: &[Outbound]) -> Vec<(String, Bytes, bool, u16)> {
    out.iter()
        .filter_map(|o| match o {
            Outbound::Publish {
                message,
                retain,
                packet_id,
                ..
            } => Some((
                message.topic.to_string(),
                message.payload.clone(),
                *retain,
                *packet_id,
            )),
            _ => None,
        })
        .collect()
}

fn puback(packet_id: u16, reason: ReasonCode) -> Inbound {
    Inbound::PubAck { packet_id, reason }
}

#[test]
fn a_latest_subscriber_gets_the_current_values_with_retain_then_changes_and_deletions() {
    let now = Instant::now();
    let (mut s, store) = kinds_state(&[("devices", ChannelKind::Latest)]);
    let mut publisher = connect(&mut s, 1, "writer", true, now);
    packets(
        &mut s,
        1,
        vec![
            publish_payload("devices/a", b"1", 1),
            publish_payload("devices/a", b"2", 2),
            publish_payload("devices/b", b"3", 3),
            publish_payload("other/x", b"-", 4),
        ],
        now,
    );
    store.settle(&mut s, now);
    assert_eq!(puback_ids(&publisher.drain()), vec![1, 2, 3, 4]);
    let mut reader = connect(&mut s, 2, "reader", true, now);
    packets(&mut s, 2, vec![subscribe_with("devices/#", 0, 0)], now);
    store.settle(&mut s, now);
    let got = deliveries(&reader.drain());
    assert_eq!(
        got,
        vec![
            ("devices/a".into(), Bytes::from_static(b"2"), true, 0),
            ("devices/b".into(), Bytes::from_static(b"3"), true, 0),
        ],
        "the current values, retain set, replaced ones once"
    );
    packets(
        &mut s,
        1,
        vec![
            publish_payload("devices/b", b"", 5),
            publish_payload("devices/c", b"4", 6),
            // Deleting what holds nothing changes nothing and tells nobody.
            publish_payload("devices/zzz", b"", 7),
        ],
        now,
    );
    store.settle(&mut s, now);
    assert_eq!(puback_ids(&publisher.drain()), vec![5, 6, 7]);
    assert_eq!(
        deliveries(&reader.drain()),
        vec![
            ("devices/b".into(), Bytes::new(), false, 0),
            ("devices/c".into(), Bytes::from_static(b"4"), false, 0),
        ],
        "changes after, a deletion as an empty payload"
    );
    // Retain Handling 2: no current values, the changes only.
    let mut quiet = connect(&mut s, 3, "quiet", true, now);
    packets(&mut s, 3, vec![subscribe_with("devices/#", 0, 2)], now);
    store.settle(&mut s, now);
    assert!(deliveries(&quiet.drain()).is_empty());
    packets(&mut s, 1, vec![publish_payload("devices/a", b"5", 8)], now);
    store.settle(&mut s, now);
    assert_eq!(
        deliveries(&quiet.drain()),
        vec![("devices/a".into(), Bytes::from_static(b"5"), false, 0)]
    );
}

#[test]
fn a_durable_latest_consumer_resumes_with_what_changed_while_it_was_away() {
    let now = Instant::now();
    let (mut s, store) = kinds_state(&[("devices", ChannelKind::Latest)]);
    let mut publisher = connect(&mut s, 1, "writer", true, now);
    for (i, t) in ["devices/1", "devices/2", "devices/3"].iter().enumerate() {
        packets(
            &mut s,
            1,
            vec![publish_payload(t, b"old", i as u16 + 1)],
            now,
        );
    }
    store.settle(&mut s, now);
    let mut reader = connect(&mut s, 2, "durable", false, now);
    packets(&mut s, 2, vec![subscribe_with("devices/#", 1, 0)], now);
    store.settle(&mut s, now);
    let values = deliveries(&reader.drain());
    assert_eq!(values.len(), 3);
    for (_, _, _, id) in &values {
        packets(&mut s, 2, vec![puback(*id, ReasonCode::Success)], now);
    }
    closed(&mut s, 2, now);
    store.settle(&mut s, now);
    packets(
        &mut s,
        1,
        vec![
            publish_payload("devices/1", b"new", 10),
            publish_payload("devices/2", b"", 11),
            publish_payload("devices/4", b"new", 12),
        ],
        now,
    );
    store.settle(&mut s, now);
    publisher.drain();
    let mut reader = connect(&mut s, 3, "durable", false, now);
    store.settle(&mut s, now);
    let resumed: Vec<(String, Bytes, bool)> = deliveries(&reader.drain())
        .into_iter()
        .map(|(t, p, r, _)| (t, p, r))
        .collect();
    assert_eq!(
        resumed,
        vec![
            ("devices/1".into(), Bytes::from_static(b"new"), false),
            ("devices/2".into(), Bytes::new(), false),
            ("devices/4".into(), Bytes::from_static(b"new"), false),
        ],
        "exactly the changes, the deletion as an empty payload"
    );
}

/// The position stored for `reader` in latest channel 0, if any.
fn latest_position(store: &MemoryChannels, reader: &str) -> Option<u64> {
    let reader = crate::storage::contract::Reader::mqtt(reader).unwrap();
    store.stores[0]
        .as_latest()
        .unwrap()
        .position(&reader)
        .unwrap()
        .map(|p| p.offset)
}

#[test]
fn a_durable_latest_consumers_start_is_written_with_its_subscribe_as_the_first_offset() {
    let now = Instant::now();
    let (mut s, store) = kinds_state(&[("devices", ChannelKind::Latest)]);
    let mut publisher = connect(&mut s, 1, "writer", true, now);
    let burst = ["devices/a", "devices/b", "devices/c"]
        .iter()
        .zip(1..)
        .map(|(topic, id)| publish_payload(topic, b"v", id))
        .collect();
    packets(&mut s, 1, burst, now);
    store.settle(&mut s, now);
    publisher.drain();
    let mut durable = connect_as(&mut s, 2, request("durable", false, 3600), now);
    let mut quiet = connect_as(&mut s, 3, request("quiet", false, 3600), now);
    store.settle(&mut s, now);
    durable.drain();
    quiet.drain();
    packets(&mut s, 2, vec![subscribe_with("devices/#", 1, 0)], now);
    // Retain Handling 2: owed no values, it starts at `next`.
    packets(&mut s, 3, vec![subscribe_with("devices/#", 1, 2)], now);
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    assert_eq!(
        positions_saved(&intents),
        vec![
            ("mqtt:durable".to_owned(), 1, Some(3600)),
            ("mqtt:quiet".to_owned(), 4, Some(3600)),
        ],
        "written with the SUBSCRIBE, before the values are read"
    );
    assert!(
        !suback_sent(&durable.drain()),
        "no SUBACK before its start is stored"
    );
    store.commit(&mut s, intents, now);
    store.settle(&mut s, now);
    let values = deliveries(&durable.drain());
    assert_eq!(values.len(), 3);
    assert!(deliveries(&quiet.drain()).is_empty());
    // Out and unanswered: killed now, it resumes from the first offset.
    s.flush(now);
    store.settle(&mut s, now);
    assert_eq!(latest_position(&store, "durable"), Some(1));
    assert_eq!(latest_position(&store, "quiet"), Some(4));
    for (_, _, _, id) in &values {
        packets(&mut s, 2, vec![puback(*id, ReasonCode::Success)], now);
    }
    s.flush(now);
    store.settle(&mut s, now);
    assert_eq!(latest_position(&store, "durable"), Some(4));
}

#[test]
fn current_values_whose_read_failed_are_read_again_at_the_tick_and_no_position_passes_them() {
    let now = Instant::now();
    let (mut s, mut store) = kinds_state(&[("devices", ChannelKind::Latest)]);
    let mut publisher = connect(&mut s, 1, "writer", true, now);
    packets(
        &mut s,
        1,
        vec![
            publish_payload("devices/a", b"1", 1),
            publish_payload("devices/b", b"2", 2),
        ],
        now,
    );
    store.settle(&mut s, now);
    publisher.drain();
    let mut reader = connect(&mut s, 2, "durable", false, now);
    store.fail = Some("values");
    packets(&mut s, 2, vec![subscribe_with("devices/#", 1, 0)], now);
    store.settle(&mut s, now);
    // A change meanwhile waits for the values; the position written with
    // the SUBSCRIBE, the first offset, stays while what the consumer is
    // owed is unknown.
    packets(&mut s, 1, vec![publish_payload("devices/c", b"3", 3)], now);
    s.flush(now);
    store.settle(&mut s, now);
    publisher.drain();
    assert!(deliveries(&reader.drain()).is_empty());
    assert_eq!(latest_position(&store, "durable"), Some(1));
    store.fail = None;
    let later = now + Duration::from_secs(1);
    s.tick(later);
    store.settle(&mut s, later);
    let got = deliveries(&reader.drain());
    let topics: Vec<(&str, bool)> = got.iter().map(|d| (d.0.as_str(), d.2)).collect();
    assert_eq!(
        topics,
        [
            ("devices/a", true),
            ("devices/b", true),
            ("devices/c", true),
            ("devices/c", false)
        ],
        "the values, read again, then the change that waited for them"
    );
    // Out and unanswered: the position stays at the lowest value.
    s.flush(later);
    store.settle(&mut s, later);
    assert_eq!(latest_position(&store, "durable"), Some(1));
    for (_, _, _, id) in &got {
        packets(&mut s, 2, vec![puback(*id, ReasonCode::Success)], later);
    }
    s.flush(later);
    store.settle(&mut s, later);
    assert_eq!(latest_position(&store, "durable"), Some(4));
}

/// A queue `jobs` (channel 0) with its dead-letter channel (1), `max`
/// attempts and a backoff of 1s then 5s.
fn queue_state(max_attempts: u32) -> (BrokerState, MemoryChannels) {
    let (s, store) = kinds_state(&[("jobs", ChannelKind::Queue)]);
    store.queue(0).set_max_attempts(max_attempts);
    store
        .queue(0)
        .set_backoff(vec![Duration::from_secs(1), Duration::from_secs(5)]);
    (s, store)
}

fn enqueue(s: &mut BrokerState, store: &MemoryChannels, conn: u64, n: u16, now: Instant) {
    let payloads: [&'static [u8]; 4] = [b"j1", b"j2", b"j3", b"j4"];
    for i in 0..n {
        packets(
            s,
            conn,
            vec![publish_payload(
                "jobs/work",
                payloads[i as usize % 4],
                100 + i,
            )],
            now,
        );
    }
    store.settle(s, now);
}

#[test]
fn queue_records_go_to_one_worker_each_spread_and_bounded_by_the_window() {
    let now = Instant::now();
    let (mut s, store) = queue_state(5);
    let mut producer = connect(&mut s, 1, "producer", true, now);
    let mut a = connect(&mut s, 2, "worker-a", true, now);
    let mut b = connect(&mut s, 3, "worker-b", true, now);
    packets(&mut s, 2, vec![subscribe("jobs/#", 1)], now);
    packets(&mut s, 3, vec![subscribe("jobs/#", 1)], now);
    store.settle(&mut s, now);
    a.drain();
    b.drain();
    // 24 jobs, two windows of 10: 20 out, 4 wait.
    for i in 0..24u16 {
        packets(
            &mut s,
            1,
            vec![publish_payload("jobs/x", b"job", 200 + i)],
            now,
        );
    }
    store.settle(&mut s, now);
    assert_eq!(puback_ids(&producer.drain()).len(), 24);
    let to_a = deliveries(&a.drain());
    let to_b = deliveries(&b.drain());
    assert_eq!(
        (to_a.len(), to_b.len()),
        (10, 10),
        "spread, each within its window"
    );
    let out = s.queue_in_flight("jobs");
    assert_eq!(out.len(), 20);
    let mut offsets: Vec<u64> = out.iter().map(|(o, _)| *o).collect();
    offsets.dedup();
    assert_eq!(offsets.len(), 20, "no record with two workers");
    // Each PUBACK resolves one and lets one more out.
    for (_, _, _, id) in &to_a {
        packets(&mut s, 2, vec![puback(*id, ReasonCode::Success)], now);
    }
    store.settle(&mut s, now);
    assert_eq!(
        deliveries(&a.drain()).len() + deliveries(&b.drain()).len(),
        4
    );
    assert_eq!(store.queue(0).depth(), 14);
    assert_eq!(s.queue_in_flight("jobs").len(), 14);
}

#[test]
fn a_refused_job_is_retried_after_its_backoff_on_the_injected_clock_and_dead_lettered_when_spent() {
    let start = Instant::now();
    let (mut s, store) = queue_state(3);
    let _producer = connect(&mut s, 1, "producer", true, start);
    let mut worker = connect(&mut s, 2, "worker", true, start);
    let mut dlq = connect(&mut s, 3, "dlq-reader", true, start);
    packets(&mut s, 2, vec![subscribe("jobs/#", 1)], start);
    packets(&mut s, 3, vec![subscribe("jobs.dlq/#", 1)], start);
    store.settle(&mut s, start);
    worker.drain();
    dlq.drain();
    enqueue(&mut s, &store, 1, 1, start);
    let mut now = start;
    // Attempt 1 at 0s, refused; backoff 1s. Attempt 2 at 1s, refused;
    // backoff 5s. Attempt 3 at 6s, refused: spent.
    for (attempt, gap) in [(1u32, 1u64), (2, 5), (3, 0)] {
        let got = deliveries(&worker.drain());
        assert_eq!(got.len(), 1, "attempt {attempt} delivered");
        packets(
            &mut s,
            2,
            vec![puback(got[0].3, ReasonCode::UnspecifiedError)],
            now,
        );
        store.settle(&mut s, now);
        if gap == 0 {
            break;
        }
        // Not before the gap has passed, on the state's clock.
        s.tick(now + Duration::from_millis(gap * 1000 - 1));
        store.settle(&mut s, now + Duration::from_millis(gap * 1000 - 1));
        assert!(deliveries(&worker.drain()).is_empty(), "not before the gap");
        now += Duration::from_secs(gap);
        s.tick(now);
        store.settle(&mut s, now);
    }
    assert_eq!(store.queue(0).depth(), 0);
    let dead = store.stores[1].as_append().unwrap().read_from(1).unwrap();
    assert_eq!(dead.len(), 1);
    let header = |name: &str| {
        dead[0]
            .user_properties
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.value.clone())
    };
    assert_eq!(header("saguin-attempts").as_deref(), Some("3"));
    assert!(header("saguin-first-delivered").is_some_and(|v| !v.is_empty()));
    assert!(header("saguin-last-delivered").is_some_and(|v| !v.is_empty()));
    assert!(header("saguin-dlq-reason").is_some_and(|v| v.contains("0x80")));
    assert_eq!(s.metrics.queue_dead_lettered_count("jobs"), 1);
    // The dead-letter channel's consumer is handed it.
    let out = dlq.drain();
    assert_eq!(channel_deliveries(&out), vec![(1, None)]);
    assert_eq!(
        deliveries(&out)[0].0,
        "jobs.dlq/work",
        "on the dead-letter channel's topic"
    );
}

#[test]
fn an_expired_lease_counts_an_attempt_and_the_late_answer_changes_nothing() {
    let start = Instant::now();
    let (mut s, store) = queue_state(5);
    let _producer = connect(&mut s, 1, "producer", true, start);
    let mut slow = connect(&mut s, 2, "slow", true, start);
    packets(&mut s, 2, vec![subscribe("jobs/#", 1)], start);
    store.settle(&mut s, start);
    slow.drain();
    enqueue(&mut s, &store, 1, 1, start);
    let first = deliveries(&slow.drain());
    assert_eq!(first.len(), 1);
    // Just before the lease (30s) ends nothing happens.
    let before = start + Duration::from_secs(29);
    s.tick(before);
    store.settle(&mut s, before);
    assert_eq!(s.queue_in_flight("jobs").len(), 1);
    let mut fast = connect(&mut s, 3, "fast", true, before);
    packets(&mut s, 3, vec![subscribe("jobs/#", 1)], before);
    store.settle(&mut s, before);
    assert!(
        deliveries(&fast.drain()).is_empty(),
        "held by the slow worker"
    );
    // At 30s it is released (attempt 1 spent), available after 1s.
    let expired = start + Duration::from_secs(30);
    s.tick(expired);
    store.settle(&mut s, expired);
    assert!(s.queue_in_flight("jobs").is_empty());
    assert_eq!(store.queue(0).items().unwrap()[0].attempts, 1);
    let retry = expired + Duration::from_secs(1);
    s.tick(retry);
    store.settle(&mut s, retry);
    let again = deliveries(&fast.drain()).len() + deliveries(&slow.drain()).len();
    assert_eq!(again, 1, "retried once, after the backoff");
    let holder = s.queue_in_flight("jobs");
    // The slow worker's late PUBACK for its superseded delivery does nothing.
    packets(
        &mut s,
        2,
        vec![puback(first[0].3, ReasonCode::Success)],
        retry,
    );
    store.settle(&mut s, retry);
    assert_eq!(s.queue_in_flight("jobs"), holder);
    assert_eq!(store.queue(0).depth(), 1);
}

#[test]
fn a_worker_going_away_releases_what_it_held() {
    let now = Instant::now();
    let (mut s, store) = queue_state(5);
    let _producer = connect(&mut s, 1, "producer", true, now);
    let mut w = connect(&mut s, 2, "w", true, now);
    packets(&mut s, 2, vec![subscribe("jobs/#", 1)], now);
    store.settle(&mut s, now);
    enqueue(&mut s, &store, 1, 3, now);
    assert_eq!(deliveries(&w.drain()).len(), 3);
    closed(&mut s, 2, now);
    store.settle(&mut s, now);
    assert!(s.queue_in_flight("jobs").is_empty());
    let items = store.queue(0).items().unwrap();
    assert_eq!(items.len(), 3);
    assert!(items.iter().all(|i| i.attempts == 1));
}

#[test]
fn a_failed_dead_letter_move_leaves_the_record_held_with_its_attempts_and_is_tried_again() {
    let now = Instant::now();
    let (mut s, mut store) = queue_state(1);
    let _producer = connect(&mut s, 1, "producer", true, now);
    let mut w = connect(&mut s, 2, "w", true, now);
    packets(&mut s, 2, vec![subscribe("jobs/#", 1)], now);
    store.settle(&mut s, now);
    enqueue(&mut s, &store, 1, 1, now);
    let got = deliveries(&w.drain());
    store.fail = Some("release");
    packets(
        &mut s,
        2,
        vec![puback(got[0].3, ReasonCode::UnspecifiedError)],
        now,
    );
    store.settle(&mut s, now);
    let dlq = store.stores[1].as_append().unwrap();
    assert_eq!((dlq.next(), store.queue(0).depth()), (1, 1), "neither half");
    assert_eq!(store.queue(0).items().unwrap()[0].attempts, 1);
    assert_eq!(
        s.queue_in_flight("jobs").len(),
        1,
        "still held, never offered twice"
    );
    store.fail = None;
    s.tick(now);
    store.settle(&mut s, now);
    assert_eq!(store.queue(0).depth(), 0);
    assert_eq!(dlq.next(), 2, "moved at offset 1: no hole");
}

#[test]
fn a_durable_consumers_start_is_written_with_its_subscribe_and_its_suback_waits() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 5);
    let mut store = FakeStore::default();
    let mut durable = connect_as(&mut s, 1, request("durable", false, 3600), now);
    let mut brief = connect(&mut s, 2, "brief", true, now);
    store.commit_all(&mut s, now);
    durable.drain();
    brief.drain();
    packets(&mut s, 1, vec![subscribe("telemetry/#", 1)], now);
    packets(&mut s, 2, vec![subscribe("telemetry/#", 1)], now);
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    let saved = positions_saved(&intents);
    // Only the session that outlives its connection keeps a position.
    assert_eq!(saved, vec![("mqtt:durable".to_owned(), 5, Some(3600))]);
    assert!(
        !suback_sent(&durable.drain()),
        "no SUBACK before its start is stored"
    );
    store.commit(&mut s, intents, now);
    assert!(suback_sent(&durable.drain()));
    // Written once: the flush finds it unmoved.
    s.flush(now);
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    assert!(!intents
        .iter()
        .flat_map(|i| i.writes.iter())
        .any(|w| matches!(w, Write::SavePosition(_))));
}

#[test]
fn an_earliest_start_is_stored_as_the_first_offset_until_its_read_finds_it() {
    let now = Instant::now();
    let (mut s, mut store) = channel_holding(8, now);
    let mut durable = connect_as(&mut s, 1, request("durable", false, 3600), now);
    store.commit_all(&mut s, now);
    durable.drain();
    packets(&mut s, 1, vec![subscribe_from("earliest")], now);
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    // Killed now, it resumes from the first record held, not at `next`.
    assert_eq!(
        positions_saved(&intents),
        vec![("mqtt:durable".to_owned(), 1, Some(3600))]
    );
    assert!(!suback_sent(&durable.drain()));
    store.commit(&mut s, intents, now);
    // Retention removed 1..=3: the read finds the oldest held, 4, and
    // that is written at once.
    store.answer_reads(&mut s, 4, now);
    let out = durable.drain();
    assert!(out.iter().any(|o| matches!(o, Outbound::SubAck { .. })));
    assert_eq!(
        channel_deliveries(&out)[0],
        (4, None),
        "no gap for earliest"
    );
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    assert_eq!(
        positions_saved(&intents),
        vec![("mqtt:durable".to_owned(), 4, Some(3600))]
    );
}

fn suback_sent(out: &[Outbound]) -> bool {
    out.iter().any(|o| matches!(o, Outbound::SubAck { .. }))
}

/// The positions `intents` save: reader, offset and session expiry.
fn positions_saved(intents: &[Intent]) -> Vec<(String, u64, Option<u32>)> {
    intents
        .iter()
        .flat_map(|i| i.writes.iter())
        .filter_map(|w| match w {
            Write::SavePosition(p) => Some((p.reader.to_string(), p.offset, p.session_expiry)),
            _ => None,
        })
        .collect()
}

/// The connection and session tables hold an entry per client; a field
/// most clients never use (a Will) is boxed so it does not size them all.
#[test]
fn the_connection_and_session_tables_entries_stay_small() {
    let connection = std::mem::size_of::<super::Connection>();
    assert!(
        connection <= 256,
        "a connection entry is {connection} bytes"
    );
    let session = std::mem::size_of::<super::session::Session>();
    assert!(session <= 384, "a session entry is {session} bytes");
}

/// A retained publish's topic and payload arrive as slices of the
/// connection's read buffer: the stored record and the retained index
/// share one copy of their own, and neither pins that buffer.
#[test]
fn a_retained_message_shares_its_own_bytes_with_its_stored_record() {
    let now = Instant::now();
    let mut s = state();
    let mut c = connect(&mut s, 1, "c", true, now);
    let _ = c.drain();
    let read_buffer = Bytes::from(b"....r/1payload....".to_vec());
    let in_buffer = |bytes: &[u8]| read_buffer.as_ptr_range().contains(&bytes.as_ptr());
    let publish = Inbound::Publish(InboundPublish {
        packet_id: 1,
        qos: 1,
        retain: true,
        dup: false,
        topic: ByteStr::from_utf8(read_buffer.slice(4..7)).unwrap(),
        payload: read_buffer.slice(7..14),
        properties: MessageProperties::default(),
    });
    packets(&mut s, 1, vec![publish], now);
    let mut intents = Vec::new();
    s.take_intents(&mut intents);
    let stored = intents
        .iter()
        .flat_map(|i| &i.writes)
        .find_map(|w| match w {
            Write::SetRetained(record) => Some(record.payload.clone()),
            _ => None,
        })
        .expect("the retained write");
    assert_eq!(stored, "payload");
    assert!(
        !in_buffer(&stored),
        "the stored record pins the read buffer"
    );
    FakeStore::default().commit(&mut s, intents, now);
    let mut held = Vec::new();
    s.retained.matching("r/1", &mut held);
    let [message] = held.as_slice() else {
        panic!("{} retained messages", held.len());
    };
    assert!(!in_buffer(message.topic.as_bytes()) && !in_buffer(&message.payload));
    assert_eq!(
        message.payload.as_ptr(),
        stored.as_ptr(),
        "the index and the record hold one copy"
    );
}
