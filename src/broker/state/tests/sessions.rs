//! Connections and sessions: takeover, flow control, the QoS flows,
//! retained messages, the broadcast log, expiry and Wills, restore.

use super::*;
use crate::storage::kept::Kept;

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
    assert!(!slow.rx.ended(), "a slow QoS 0 consumer is not cut");
    assert_eq!(s.connection_count(), 3);
    // slow got CONNACK + SUBACK + 2 publishes before its queue was full.
    let slow_out = slow.drain();
    assert_eq!(publish_ids(&slow_out).len(), 2);
    assert_eq!(s.metrics.dropped_count(DropReason::SlowConsumer), 8);
}

/// `limits.max_queued_bytes` bounds QoS 0 to a client that does not read
/// too, at no less than 1 MiB (a bound of 0 keeps no session's queue but
/// must not drop a burst to a client that reads): deliveries go while
/// what waits for its writer counts less than the bound, then are dropped
/// and counted, and go again once its writer has written them.
#[test]
fn a_client_is_sent_no_more_unacknowledged_than_max_inflight_messages_whatever_it_asked() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_inflight_messages: 5,
        ..Limits::default()
    });
    // MQTT 5 without a Receive Maximum (65,535), MQTT 5 asking for 3,
    // MQTT 3.1.1, which cannot ask, and the broker's own bridge, whose
    // window is its own.
    let wide = ConnectRequest {
        receive_maximum: u16::MAX,
        ..request("wide", true, 0)
    };
    let narrow = ConnectRequest {
        receive_maximum: 3,
        ..request("narrow", true, 0)
    };
    let bridge = ConnectRequest {
        receive_maximum: 300,
        bridge: Some("cloud".into()),
        ..request("bridge:cloud", true, 0)
    };
    let mut clients = [
        connect_as(&mut s, 1, wide, now),
        connect_as(&mut s, 2, narrow, now),
        connect_with(&mut s, 3, "old", true, false, now),
        connect_as(&mut s, 4, bridge, now),
    ];
    for conn in 1..=4 {
        packets(&mut s, conn, vec![subscribe("t", 1)], now);
    }
    let _publisher = connect(&mut s, 5, "publisher", true, now);
    for id in 1..=20 {
        packets(&mut s, 5, vec![publish("t", 1, id)], now);
    }
    let sent: Vec<usize> = clients
        .iter_mut()
        .map(|c| publish_ids(&c.drain()).len())
        .collect();
    assert_eq!(sent, [5, 3, 5, 20]);
    // An acknowledgement lets one more out, never past the window.
    packets(
        &mut s,
        1,
        vec![Inbound::PubAck {
            packet_id: 1,
            reason: ReasonCode::Success,
        }],
        now,
    );
    assert_eq!(publish_ids(&clients[0].drain()).len(), 1);
}

#[test]
fn qos0_to_a_client_that_does_not_read_is_held_to_the_byte_bound() {
    const EACH: u32 = 300 * 1024;
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_queued_bytes: Some(0),
        ..Limits::default()
    });
    let mut slow = connect(&mut s, 1, "slow", true, now);
    packets(&mut s, 1, vec![subscribe("t", 0)], now);
    let _ = slow.drain();
    let _p = connect(&mut s, 2, "p", true, now);
    // Topic and payload: 300 KiB.
    let payload = Bytes::from(vec![b'x'; EACH as usize - 1]);
    let large = || {
        Inbound::Publish(InboundPublish {
            packet_id: 0,
            qos: 0,
            retain: false,
            dup: false,
            topic: ByteStr::from("t"),
            payload: payload.clone(),
            properties: MessageProperties::default(),
        })
    };
    packets(&mut s, 2, (0..6).map(|_| large()).collect(), now);
    // 0, 300, 600 and 900 KiB waiting: four go; 1,200 KiB reached the bound.
    assert_eq!(publish_ids(&slow.drain()).len(), 4);
    assert_eq!(slow.rx.qos0_waiting(), 4 * EACH);
    assert_eq!(s.metrics.dropped_count(DropReason::SlowConsumer), 2);
    // Taken from the queue is not written: still held.
    packets(&mut s, 2, vec![large()], now);
    assert_eq!(s.metrics.dropped_count(DropReason::SlowConsumer), 3);
    // The writer asks for more once it has written what it took.
    assert!(slow.drain().is_empty());
    packets(&mut s, 2, vec![large()], now);
    assert_eq!(publish_ids(&slow.drain()).len(), 1, "written: room again");
    assert!(!slow.rx.ended(), "a slow QoS 0 consumer is not cut");
}

/// What a writer does after writing `n` packets of `conn`.
fn fast_written(s: &BrokerState, conn: u64, n: usize) {
    let c = &s.connections[&conn];
    c.handle
        .written
        .fetch_add(n as u32, std::sync::atomic::Ordering::Relaxed);
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
    assert!(!p.rx.ended(), "never cut for its own acknowledgements");
    assert!(p.rx.paused(), "its reader is paused instead");
    let acks = p
        .drain()
        .iter()
        .filter(|o| matches!(o, Outbound::PubAck { .. }))
        .count();
    assert_eq!(acks, 20, "every acknowledgement is kept");
    fast_written(&s, 1, 21);
    s.handle(Event::Drained { connection: 1 }, now);
    assert!(!p.rx.paused(), "drained: reading again");
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
fn a_queue_is_bounded_by_the_bytes_of_its_topics_and_payloads() {
    let now = Instant::now();
    // Topic "t" (1 B) and payloads of 4, 4, 4, 1 and 20 bytes: 5, 5, 5, 2
    // and 21 bytes against a bound of 12.
    let mut s = state_with(Limits {
        max_queued_bytes: Some(12),
        ..Limits::default()
    });
    let mut store = FakeStore::default();
    let _c = connect(&mut s, 1, "c", false, now);
    packets(&mut s, 1, vec![subscribe("t", 1)], now);
    store.commit_all(&mut s, now);
    closed(&mut s, 1, now);
    let payload_publish = |payload: &'static [u8], id: u16| match publish("t", 1, id) {
        Inbound::Publish(p) => Inbound::Publish(InboundPublish {
            payload: Bytes::from_static(payload),
            ..p
        }),
        other => other,
    };
    let _p = connect(&mut s, 2, "p", true, now);
    packets(
        &mut s,
        2,
        vec![
            payload_publish(b"aaaa", 1),
            payload_publish(b"bbbb", 2),
            payload_publish(b"cccc", 3),
            payload_publish(b"d", 4),
            payload_publish(&[b'e'; 20], 5),
        ],
        now,
    );
    store.commit_all(&mut s, now);
    let key = s.sessions.of_client("c").unwrap();
    assert_eq!(s.sessions.by_key[&key].pending.bytes(), 12);
    let mut c = connect(&mut s, 3, "c", false, now);
    store.commit_all(&mut s, now);
    let out = c.drain();
    let payloads: Vec<Bytes> = published(&out).into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        payloads,
        [&b"aaaa"[..], b"bbbb", b"d"],
        "what fits is kept, in order; what would not fit is dropped, a later smaller one kept"
    );
    assert_eq!(s.metrics.dropped_count(DropReason::QueueFull), 2);
    assert_eq!(
        s.sessions.by_key[&key].pending.bytes(),
        0,
        "what left the queue is no longer counted"
    );
    // The bound is whole again once those left the queue.
    let acks = publish_ids(&out)
        .into_iter()
        .map(|packet_id| Inbound::PubAck {
            packet_id,
            reason: ReasonCode::Success,
        })
        .collect();
    packets(&mut s, 3, acks, now);
    closed(&mut s, 3, now);
    packets(
        &mut s,
        2,
        vec![payload_publish(b"ffff", 6), payload_publish(b"gggggg", 7)],
        now,
    );
    store.commit_all(&mut s, now);
    let mut c = connect(&mut s, 4, "c", false, now);
    store.commit_all(&mut s, now);
    let payloads: Vec<Bytes> = published(&c.drain()).into_iter().map(|(p, _)| p).collect();
    assert_eq!(payloads, [&b"ffff"[..], b"gggggg"]);
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

/// On a log that answers an entry with its own handle on it (a memory
/// store's), the message a persistent session is owed shares that entry's
/// topic and payload rather than holding the publish's copy beside it,
/// and is delivered from them.
#[test]
fn a_message_owed_on_a_log_that_shares_its_entry_is_held_once() {
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore {
        log_handles: Some(Vec::new()),
        ..FakeStore::default()
    };
    let mut sub = connect(&mut s, 1, "sub", false, now);
    packets(&mut s, 1, vec![subscribe("t/#", 1)], now);
    store.commit_all(&mut s, now);
    closed(&mut s, 1, now);
    store.commit_all(&mut s, now);
    sub.drain();
    let _publisher = connect(&mut s, 2, "pub", true, now);
    packets(&mut s, 2, vec![publish("t/1", 1, 1)], now);
    store.commit_all(&mut s, now);
    let entry = store.log_handles.as_ref().unwrap()[0].clone();
    assert_eq!(Kept::count(&entry), 3, "the store's, the message's, this");

    let mut sub = connect(&mut s, 3, "sub", false, now);
    store.commit_all(&mut s, now);
    let sent = sub.drain();
    let [Outbound::Publish {
        message, packet_id, ..
    }] = sent
        .iter()
        .filter(|o| matches!(o, Outbound::Publish { .. }))
        .collect::<Vec<_>>()[..]
    else {
        panic!("{sent:?}");
    };
    assert_eq!((&*message.topic, &message.payload[..]), ("t/1", &b"p"[..]));
    assert_eq!(
        message.payload.as_ptr(),
        entry.payload().as_ptr(),
        "not a copy"
    );
    assert_eq!(message.topic.as_ptr(), entry.topic().as_ptr());
    let packet_id = *packet_id;
    drop(sent);
    packets(
        &mut s,
        3,
        vec![Inbound::PubAck {
            packet_id,
            reason: ReasonCode::Success,
        }],
        now,
    );
    store.commit_all(&mut s, now);
    assert_eq!(Kept::count(&entry), 2, "the message let go");
}

/// On a store that answers a retained value with its own handle on it (a
/// memory store), the index holds that handle: the message is held once.
/// One with properties is kept whole all the same, and a replaced or
/// deleted message's handle is let go.
#[test]
fn a_retained_message_the_store_shares_is_held_as_its_handle() {
    let now = Instant::now();
    let mut s = state();
    let mut store = FakeStore {
        retained_handles: Some(Vec::new()),
        ..FakeStore::default()
    };
    let mut c = connect(&mut s, 1, "c", true, now);
    packets(&mut s, 1, vec![publish_retained("r/1", 1, 1, true)], now);
    store.commit_all(&mut s, now);
    let first = store.retained_handles.as_ref().unwrap()[0].clone();
    assert_eq!(Kept::count(&first), 3, "the store's, the index's, this");
    let mut held = Vec::new();
    s.retained.matching("r/#", &mut |found| held.push(found));
    let [Retained::Held { leaf, .. }] = held.as_slice() else {
        panic!("{held:?}");
    };
    assert_eq!(
        leaf.payload().as_ptr(),
        first.payload().as_ptr(),
        "not a copy"
    );
    drop(held);

    // Replaced by a message with properties: kept whole, the handle let go.
    let mut with_expiry = publish_retained("r/1", 1, 2, true);
    if let Inbound::Publish(p) = &mut with_expiry {
        p.properties.message_expiry_interval = Some(60);
    }
    packets(&mut s, 1, vec![with_expiry], now);
    store.commit_all(&mut s, now);
    assert_eq!(Kept::count(&first), 2, "the store's and this");
    let second = store.retained_handles.as_ref().unwrap()[1].clone();
    assert_eq!(Kept::count(&second), 2, "not held by the index");
    let mut held = Vec::new();
    s.retained.matching("r/1", &mut |found| held.push(found));
    assert!(
        matches!(held.as_slice(), [Retained::Whole(m)] if m.properties.message_expiry_interval == Some(60))
    );

    // A deletion lets the index's handle go.
    packets(&mut s, 1, vec![publish_retained("r/2", 1, 3, true)], now);
    store.commit_all(&mut s, now);
    let third = store.retained_handles.as_ref().unwrap()[2].clone();
    assert_eq!(Kept::count(&third), 3);
    let mut delete = publish_retained("r/2", 1, 4, true);
    if let Inbound::Publish(p) = &mut delete {
        p.payload = Bytes::new();
    }
    packets(&mut s, 1, vec![delete], now);
    store.commit_all(&mut s, now);
    assert_eq!(Kept::count(&third), 2);
    assert_eq!(s.retained_count(), 1);
    let acks = c
        .drain()
        .iter()
        .filter(|o| {
            matches!(
                o,
                Outbound::PubAck {
                    reason: ReasonCode::Success,
                    ..
                }
            )
        })
        .count();
    assert_eq!(acks, 4);

    // A restart's read lends a handle: held as it, not copied.
    let mut restarted = state();
    let kept = Kept::new(&saguin_format::model::Record::new("t/1", "v"));
    restarted.restore_retained(kept.served(), now);
    restarted.retained.pack();
    assert_eq!(Kept::count(&kept), 2);
    assert_eq!(restarted.retained_count(), 1);
    let mut held = Vec::new();
    restarted
        .retained
        .matching("t/1", &mut |found| held.push(found));
    let [Retained::Held { leaf, .. }] = held.as_slice() else {
        panic!("{held:?}");
    };
    assert_eq!(leaf.payload().as_ptr(), kept.payload().as_ptr());
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
            log: [record(1, 1), record(2, 2), record(3, 2)]
                .iter()
                .map(Kept::new)
                .collect(),
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

/// The cap counts the sessions kept as they come and go: restored ones,
/// one that a clean start ends, one that expires.
#[test]
fn a_kept_session_that_ends_frees_its_place_under_the_cap() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_sessions: 2,
        ..Limits::default()
    });
    let mut store = FakeStore::default();
    let unix_now = s.receipt_time(now);
    let mut sessions = vec![stored_session("r1", "t"), stored_session("r2", "t")];
    // Expiry 300 s: "r2" went away 200 s before, and has 100 s left.
    sessions[0].detached_at = unix_now;
    sessions[1].detached_at = unix_now - 200_000_000_000;
    s.restore(
        Restored {
            sessions,
            ..Restored::default()
        },
        now,
    );
    let mut attempt = |s: &mut BrokerState, conn: u64, id: &str, clean: bool, at: Instant| {
        let mut c = connect(s, conn, id, clean, at);
        store.commit_all(s, at);
        let reason = match c.drain().first() {
            Some(Outbound::ConnAck { reason, .. }) => *reason,
            other => panic!("expected a CONNACK, got {other:?}"),
        };
        closed(s, conn, at);
        store.commit_all(s, at);
        reason
    };
    assert_eq!(
        attempt(&mut s, 1, "c", false, now),
        ReasonCode::QuotaExceeded
    );
    // "r1" starts clean: its kept session ends, and the clean one with
    // its connection.
    assert_eq!(attempt(&mut s, 2, "r1", true, now), ReasonCode::Success);
    assert_eq!(attempt(&mut s, 3, "c", false, now), ReasonCode::Success);
    assert_eq!(
        attempt(&mut s, 4, "d", false, now),
        ReasonCode::QuotaExceeded
    );
    // "r2" expires: its place is free.
    let later = now + Duration::from_secs(100);
    s.tick(later);
    assert_eq!(attempt(&mut s, 5, "d", false, later), ReasonCode::Success);
    assert_eq!(
        attempt(&mut s, 6, "e", false, later),
        ReasonCode::QuotaExceeded
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

/// A clean client on connection 1 subscribed to every Will (`will/#`).
fn will_watcher(s: &mut BrokerState, store: &mut FakeStore, now: Instant) -> Client {
    let mut watcher = connect(s, 1, "watcher", true, now);
    packets(s, 1, vec![subscribe("will/#", 1)], now);
    store.commit_all(s, now);
    watcher.drain();
    watcher
}

/// A v5 CONNECT of a session that outlives its connection by `expiry`
/// seconds, with a Will (`will/<id>`, "gone") delayed by `delay`.
fn with_will(id: &str, expiry: u32, delay: u32) -> ConnectRequest {
    let mut r = request(id, false, expiry);
    r.will = Some(WillRequest {
        topic: ByteStr::from(format!("will/{id}")),
        payload: Bytes::from_static(b"gone"),
        qos: 1,
        retain: false,
        properties: MessageProperties::default(),
        delay,
    });
    r
}

/// MQTT 5 3.1.3.2.2: the Will of a session that outlives its connection
/// is published once the Will Delay Interval has passed, not before; a
/// reconnect within the delay cancels it.
#[test]
fn a_will_waits_for_its_delay_and_a_reconnect_cancels_it() {
    let t0 = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut watcher = will_watcher(&mut s, &mut store, t0);
    let _late = connect_as(&mut s, 2, with_will("late", 60, 1), t0);
    let _never = connect_as(&mut s, 3, with_will("never", 60, 2), t0);
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

/// A detached session is looked at when it is due, not at every tick: one
/// whose Will went at its delay is due again at its expiry, and ends then.
#[test]
fn a_session_whose_will_went_at_its_delay_still_ends_at_its_expiry() {
    let t0 = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut watcher = will_watcher(&mut s, &mut store, t0);
    let _device = connect_as(&mut s, 2, with_will("device", 5, 1), t0);
    store.commit_all(&mut s, t0);
    closed(&mut s, 2, t0);
    store.commit_all(&mut s, t0);
    assert_eq!(s.session_count(), 2);

    for (at, wills, sessions) in [
        (Duration::from_millis(999), 0, 2),
        (Duration::from_secs(1), 1, 2),
        (Duration::from_millis(4_999), 0, 2),
        (Duration::from_secs(5), 0, 1),
        (Duration::from_secs(60), 0, 1),
    ] {
        s.tick(t0 + at);
        store.commit_all(&mut s, t0 + at);
        assert_eq!(published(&watcher.drain()).len(), wills, "Wills at {at:?}");
        assert_eq!(s.session_count(), sessions, "sessions at {at:?}");
    }
}

/// A restored session is due at the expiry it had left when the broker
/// stopped, counted from its `detached_at`, each at its own.
#[test]
fn restored_sessions_end_at_the_expiry_each_had_left() {
    let now = Instant::now();
    let mut s = state();
    let unix_now = s.receipt_time(now);
    let away_for = |secs: i64| unix_now - secs * 1_000_000_000;
    let mut sessions = Vec::new();
    // Expiry 300 s: away 200 s (100 s left), 100 s (200 s left), 0 s.
    for (id, away) in [("a", 200), ("b", 100), ("c", 0)] {
        let mut entry = stored_session(id, "t");
        entry.detached_at = away_for(away);
        sessions.push(entry);
    }
    s.restore(
        Restored {
            sessions,
            ..Restored::default()
        },
        now,
    );
    for (at, left) in [(99, 3), (100, 2), (199, 2), (200, 1), (299, 1), (300, 0)] {
        let at = now + Duration::from_secs(at);
        s.tick(at);
        assert_eq!(s.session_count(), left, "at {at:?}");
    }
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

/// A persistent session as storage holds it, detached, with one QoS 1
/// subscription to `filter` sent everything before log offset 1.
pub(super) fn stored_session(
    client_id: &str,
    filter: &str,
) -> crate::storage::contract::SessionEntry {
    use crate::storage::contract::{SessionEntry, SubscriptionEntry};
    SessionEntry {
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
    }
}

#[test]
fn restored_sessions_are_owed_what_the_log_holds_for_them_from_their_cursors() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_queued_messages: 2,
        ..Limits::default()
    });
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
                stored_session("all", "dev/#"),
                stored_session("late", "dev/+"),
                stored_session("one", "dev/one"),
                stored_session("quiet", "other"),
            ],
            // `late` was sent everything before offset 3.
            cursors: vec![
                ("all".into(), 1),
                ("late".into(), 3),
                ("one".into(), 1),
                ("quiet".into(), 1),
            ],
            log: [
                record(1, "dev/one", None),
                record(2, "dev/two", None),
                // A copy kept for `one` alone (a message it was owed when
                // others were not): nobody else is offered it.
                record(3, "dev/one", Some("one")),
                record(4, "dev/three", None),
                record(5, "dev/one", None),
            ]
            .iter()
            .map(Kept::new)
            .collect(),
            log_next: 6,
            ..Restored::default()
        },
        now,
    );
    assert_eq!(summary.sessions, 4);
    let owed = |s: &BrokerState, client_id: &str| -> Vec<u64> {
        let key = s.sessions.of_client(client_id).unwrap();
        s.sessions.by_key[&key]
            .pending
            .iter()
            .filter_map(|q| q.log_offset())
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

#[test]
fn restored_sessions_are_owed_no_more_than_their_byte_bound() {
    let now = Instant::now();
    let mut s = state_with(Limits {
        max_queued_bytes: Some(17),
        ..Limits::default()
    });
    // Topic "d/x" (3 B) and payloads of 5, 10, 1 and 2 bytes: 8, 13, 4
    // and 5 bytes against a bound of 17.
    let record = |offset: u64, payload_len: usize| saguin_format::model::Record {
        offset,
        qos: 1,
        timestamp: 1_700_000_000_000_000_000,
        ..saguin_format::model::Record::new("d/x", Bytes::from(vec![b'x'; payload_len]))
    };
    let summary = s.restore(
        Restored {
            sessions: vec![stored_session("c", "d/#")],
            cursors: vec![("c".into(), 1)],
            log: [record(1, 5), record(2, 10), record(3, 1), record(4, 2)]
                .iter()
                .map(Kept::new)
                .collect(),
            log_next: 5,
            ..Restored::default()
        },
        now,
    );
    let key = s.sessions.of_client("c").unwrap();
    let pending = &s.sessions.by_key[&key].pending;
    let owed: Vec<u64> = pending.iter().filter_map(|q| q.log_offset()).collect();
    assert_eq!(owed, vec![1, 3, 4], "the record that would not fit is left");
    assert_eq!(pending.bytes(), 17);
    assert_eq!(summary.queued, 3);
    assert_eq!(s.log_references(), vec![(1, 1), (3, 1), (4, 1)]);
}

/// When the persistent session `c` went away, as its last record written
/// says.
fn detached_at_written(store: &FakeStore) -> i64 {
    store
        .writes
        .iter()
        .rev()
        .find_map(|w| match w {
            Write::SaveSession(e) if e.client_id == "c" => Some(e.detached_at),
            _ => None,
        })
        .expect("a record of c")
}

/// A detached session's record says when it went away whenever it is
/// written, and a clock stepped forward writes it again in the new time:
/// a restart then counts its expiry from its disconnection, not from the
/// step (`state::clock`).
#[test]
fn a_detached_sessions_record_is_written_again_in_a_clock_stepped_forward() {
    let start = Instant::now();
    let mut s = state();
    let mut store = FakeStore::default();
    let mut c = connect(&mut s, 1, "c", false, start);
    store.commit_all(&mut s, start);
    c.drain();
    closed(&mut s, 1, start);
    store.commit_all(&mut s, start);
    let went_away = detached_at_written(&store);
    assert_eq!(went_away, s.receipt_time(start));
    // NTP sets the clock a year ahead ten seconds later.
    let later = start + Duration::from_secs(10);
    let written_before = store.writes.len();
    clock_set_a_year_ahead(&mut s, &mut store, later);
    assert!(store.writes.len() > written_before, "written again");
    assert_eq!(detached_at_written(&store), went_away + YEAR);
    assert_eq!(
        s.receipt_time(later) - detached_at_written(&store),
        10_000_000_000
    );
}
