//! Append channels: publishes answered after their commit, consumers
//! reading at their own pace, gaps, exactly-once holds, where a consumer
//! starts and the position written for it, bridges and shared groups.

use super::*;

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

/// `telemetry` and `count - 1` more append channels, all empty.
fn channels_state(count: usize) -> BrokerState {
    let mut s = state_with(Limits::default());
    let channels = (0..count)
        .map(|i| RestoredChannel {
            name: match i {
                0 => "telemetry".into(),
                i => format!("more{i}").into(),
            },
            kind: saguin_format::model::ChannelKind::Append,
            queue: None,
            next: 1,
            positions: Vec::new(),
            holds: Vec::new(),
        })
        .collect();
    s.restore(
        Restored {
            channels,
            ..Restored::default()
        },
        Instant::now(),
    );
    let mut none = Vec::new();
    s.take_intents(&mut none);
    s
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

/// A broker started before its device's clock was set stamps what it
/// receives after the clock is set with the clock's time, not with the
/// start's; a clock set back is not followed, so receipt times never step
/// back; message ids keep the run's first half throughout.
#[test]
fn receipt_times_follow_the_system_clock_forward_and_never_step_back() {
    use std::sync::atomic::Ordering::Relaxed;
    let start = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut publisher = connect(&mut s, 2, "writer", true, start);
    let second = std::time::Duration::from_secs(1);
    const SECOND: i64 = 1_000_000_000;
    let started_at = 1_700_000_000 * SECOND;
    let mut publish_at = |s: &mut BrokerState, id: u16, now: Instant| {
        packets(s, 2, vec![publish("telemetry/a", 1, id)], now);
        store.commit_all(s, now);
        assert_eq!(puback_ids(&publisher.drain()), vec![id]);
        store.channel.last().cloned().expect("stored")
    };
    let before = publish_at(&mut s, 1, start);
    // The state's clock, started at `started_at` a moment after `start`.
    assert_eq!(before.timestamp, s.receipt_time(start));
    assert!(before.timestamp <= started_at);
    // NTP sets the clock a year ahead a second after the start.
    let set = started_at + YEAR;
    s.follow_wall_clock(start + second, set);
    assert_eq!(s.metrics.clock_steps.load(Relaxed), 1);
    let after = publish_at(&mut s, 2, start + 2 * second);
    assert_eq!(after.timestamp, set + SECOND);
    // Set back an hour: not followed.
    s.follow_wall_clock(start + 3 * second, set + 2 * SECOND - 3_600 * SECOND);
    assert_eq!(s.metrics.receipt_clock_ahead_ms.load(Relaxed), 3_600_000);
    let back = publish_at(&mut s, 3, start + 4 * second);
    assert_eq!(back.timestamp, set + 3 * SECOND, "never steps back");
    assert_eq!(s.metrics.clock_steps.load(Relaxed), 1);
    for record in [&before, &after, &back] {
        assert_eq!(record.message_id[..8], started_at.to_be_bytes());
    }
}

/// The places written for client `client_id`'s consumers, in order.
fn places_written<'a>(
    store: &'a FakeStore,
    client_id: &str,
) -> impl Iterator<Item = &'a crate::storage::contract::Position> {
    let reader = crate::storage::contract::Reader::mqtt(client_id).unwrap();
    store.writes.iter().filter_map(move |w| match w {
        Write::SavePosition(p) if p.reader == reader => Some(p),
        _ => None,
    })
}

/// A persistent consumer gone away keeps its place in `telemetry`; a clock
/// stepped forward writes that place again at the next flush, in the new
/// time, so a restart does not count the step against its expiry.
#[test]
fn a_detached_consumers_place_is_written_again_in_a_clock_stepped_forward() {
    let start = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut consumer = connect(&mut s, 1, "reader", false, start);
    packets(&mut s, 1, vec![subscribe("telemetry/#", 1)], start);
    store.commit_all(&mut s, start);
    consumer.drain();
    closed(&mut s, 1, start);
    s.flush(start);
    store.commit_all(&mut s, start);
    let places = |store: &FakeStore| -> Vec<i64> {
        places_written(store, "reader")
            .map(|p| p.saved_at)
            .collect()
    };
    let before = places(&store).len();
    assert!(before >= 1, "its place is kept");
    // A flush with nothing moved writes nothing.
    let second = std::time::Duration::from_secs(1);
    s.flush(start + second);
    store.commit_all(&mut s, start + second);
    assert_eq!(places(&store).len(), before);
    // NTP sets the clock a year ahead.
    let later = start + 10 * second;
    clock_set_a_year_ahead(&mut s, &mut store, later);
    let after = places(&store);
    assert_eq!(after.len(), before + 1, "written again");
    assert_eq!(*after.last().unwrap(), s.receipt_time(later));
}

/// A flush writes the places of the consumers connected: one that
/// consumes from its SUBSCRIBE on, and one that comes back to a session
/// that consumed before. A detached one's place was written as it went.
#[test]
fn a_flush_writes_the_places_connected_consumers_moved() {
    let start = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let places = |store: &FakeStore| -> Vec<u64> {
        places_written(store, "reader").map(|p| p.offset).collect()
    };
    let mut consumer = connect(&mut s, 1, "reader", false, start);
    let mut publisher = connect(&mut s, 2, "writer", true, start);
    packets(&mut s, 1, vec![subscribe("telemetry/#", 1)], start);
    store.commit_all(&mut s, start);
    consumer.drain();
    let mut send = |s: &mut BrokerState, store: &mut FakeStore, id: u16| {
        packets(s, 2, vec![publish("telemetry/a", 1, id)], start);
        store.commit_all(s, start);
        publisher.drain();
    };
    send(&mut s, &mut store, 1);
    let acks = acks_of(&consumer.drain());
    packets(&mut s, 1, acks, start);
    s.flush(start);
    store.commit_all(&mut s, start);
    assert_eq!(
        places(&store).last(),
        Some(&2),
        "past the record it acknowledged"
    );

    closed(&mut s, 1, start);
    store.commit_all(&mut s, start);
    let written = places(&store).len();
    send(&mut s, &mut store, 2);
    s.flush(start);
    store.commit_all(&mut s, start);
    assert_eq!(
        places(&store).len(),
        written,
        "a detached consumer did not move"
    );

    let mut back = connect(&mut s, 3, "reader", false, start);
    store.commit_all(&mut s, start);
    let acks = acks_of(&back.drain());
    assert_eq!(acks.len(), 1, "the record sent while it was away");
    packets(&mut s, 3, acks, start);
    s.flush(start);
    store.commit_all(&mut s, start);
    assert_eq!(places(&store).last(), Some(&3), "written once it is back");
}

/// The lag gauge looks at every consumer of every channel: at every tick
/// up to `LAG_AT_EVERY_TICK` of either, and past that once every
/// `LAG_INTERVAL`.
#[test]
fn the_lag_gauge_is_worked_out_less_often_past_many_consumers_or_channels() {
    use crate::broker::state::positions::{LAG_AT_EVERY_TICK, LAG_INTERVAL};
    let lag = |s: &BrokerState| -> String {
        let text = s.metrics.render();
        text.lines()
            .find(|l| l.starts_with("saguin_consumer_lag{channel=\"telemetry\"}"))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_owned())
            .unwrap_or_default()
    };
    for (channels, consumers) in [
        (1, 2),
        (1, LAG_AT_EVERY_TICK + 1),
        (LAG_AT_EVERY_TICK + 1, 2),
    ] {
        let start = Instant::now();
        let mut s = channels_state(channels);
        let mut store = FakeStore::default();
        let mut publisher = connect(&mut s, 1, "writer", true, start);
        for i in 0..consumers {
            let conn = i as u64 + 2;
            let _ = connect(&mut s, conn, &format!("reader-{i}"), false, start);
            packets(&mut s, conn, vec![subscribe("telemetry/#", 1)], start);
            store.commit_all(&mut s, start);
            closed(&mut s, conn, start);
        }
        store.commit_all(&mut s, start);
        s.tick(start);
        assert_eq!(lag(&s), "0");
        // The readers are away: each is one record behind.
        packets(&mut s, 1, vec![publish("telemetry/a", 1, 1)], start);
        store.commit_all(&mut s, start);
        publisher.drain();
        let soon = start + Duration::from_secs(1);
        s.tick(soon);
        let expected = if consumers.max(channels) > LAG_AT_EVERY_TICK {
            "0"
        } else {
            "1"
        };
        assert_eq!(
            lag(&s),
            expected,
            "{consumers} consumers of {channels} channels, a tick later"
        );
        s.tick(start + LAG_INTERVAL);
        assert_eq!(
            lag(&s),
            "1",
            "{consumers} consumers of {channels} channels, {LAG_INTERVAL:?} later"
        );
    }
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
    subscribe_to_from("telemetry/#", from)
}

/// A SUBSCRIBE of `filter` at QoS 1 with `saguin-from: from`.
fn subscribe_to_from(filter: &str, from: &str) -> Inbound {
    let mut packet = subscribe(filter, 1);
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

/// `rounds` rounds of a record for each device `telemetry/d<d>` in
/// turn, each followed by one no device matches.
fn rounds_of_devices(rounds: usize, devices: usize) -> Vec<String> {
    let mut topics = Vec::new();
    for round in 0..rounds {
        for d in 0..devices {
            topics.push(format!("telemetry/d{d}"));
            topics.push(format!("telemetry/away-{round}"));
        }
    }
    topics
}

/// After a flush, the last place written for each device `dev-<d>` of
/// `devices` is `end`: each passed every record.
fn places_written_at_the_end(
    s: &mut BrokerState,
    store: &mut FakeStore,
    devices: usize,
    end: u64,
    now: Instant,
) {
    s.flush(now);
    store.commit_all(s, now);
    for d in 0..devices {
        let place = places_written(store, &format!("dev-{d}"))
            .last()
            .map(|p| p.offset);
        assert_eq!(place, Some(end), "dev-{d}");
    }
}

/// A record on each of `topics` in turn, from connection 2, committed:
/// offsets 1, 2, ... when the channel starts at 1.
fn publish_each(s: &mut BrokerState, store: &mut FakeStore, topics: &[String], now: Instant) {
    let burst = topics
        .iter()
        .zip(1..)
        .map(|(topic, id)| publish(topic, 1, id))
        .collect();
    packets(s, 2, burst, now);
    store.commit_all(s, now);
}

/// Device `d` (`dev-<d>`, persistent) connected on `conn` and subscribed
/// with `subscription`, its writes committed and what it was sent taken.
fn device_subscribed(
    s: &mut BrokerState,
    store: &mut FakeStore,
    d: usize,
    conn: u64,
    subscription: Inbound,
    now: Instant,
) -> Client {
    let mut client = connect(s, conn, &format!("dev-{d}"), false, now);
    packets(s, conn, vec![subscription], now);
    store.commit_all(s, now);
    client.drain();
    client
}

/// The offsets of the records on `telemetry/d<d>` among `topics` (as
/// [`publish_each`] numbers them), for each device `d` of `devices`.
fn offsets_of_each_device(topics: &[String], devices: usize) -> Vec<Vec<u64>> {
    (0..devices)
        .map(|d| {
            let mine = format!("telemetry/d{d}");
            (1..)
                .zip(topics)
                .filter(|(_, t)| **t == mine)
                .map(|(o, _)| o)
                .collect()
        })
        .collect()
}

/// Devices back at an old place at once (after a crash) join one read,
/// which is handed out to them together: each is sent exactly the records
/// it matches, in order, one whose room runs out the rest once it
/// acknowledges, and each place ends past every record.
#[test]
fn consumers_catching_up_together_are_each_sent_what_they_match_in_order() {
    use crate::broker::state::catch_up::TOGETHER_AT_LEAST;
    let now = Instant::now();
    let devices = TOGETHER_AT_LEAST + 2;
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    // Device 0 is sent more than twice its window of 10 first; then every
    // device in turn, and records no device matches between.
    let mut topics: Vec<String> = (0..25).map(|_| "telemetry/d0".to_owned()).collect();
    topics.extend(rounds_of_devices(4, devices));
    publish_each(&mut s, &mut store, &topics, now);
    publisher.drain();
    let expected = offsets_of_each_device(&topics, devices);
    let mut clients: Vec<(u64, Client)> = (0..devices)
        .map(|d| {
            let conn = 3 + d as u64;
            let subscription = subscribe_to_from(&format!("telemetry/d{d}"), "1");
            let client = device_subscribed(&mut s, &mut store, d, conn, subscription, now);
            (conn, client)
        })
        .collect();
    let mut reads = Vec::new();
    s.take_reads(&mut reads);
    assert_eq!(
        reads.len(),
        1,
        "one read, joined by every device: {reads:?}"
    );
    s.reads.waiting = reads;

    let mut got: Vec<Vec<u64>> = vec![Vec::new(); devices];
    for _ in 0..10 {
        store.answer_reads(&mut s, 1, now);
        for (d, (conn, client)) in clients.iter_mut().enumerate() {
            let out = client.drain();
            got[d].extend(offsets_of(&out));
            packets(&mut s, *conn, acks_of(&out), now);
        }
    }
    assert_eq!(got, expected);
    places_written_at_the_end(&mut s, &mut store, devices, topics.len() as u64 + 1, now);
}

/// Devices back in one turn at a place the channel's recent records still
/// hold (each reconnection handled as it comes, the writes of their
/// sessions answered together, as the server hands the state a turn's
/// storage answers) pass those records together, once, rather than each
/// alone: each is sent exactly the records it matches, in order, and each
/// place ends past every record.
#[test]
fn devices_back_in_one_turn_pass_the_recent_records_together() {
    use crate::broker::state::catch_up::TOGETHER_AT_LEAST;
    let now = Instant::now();
    let devices = TOGETHER_AT_LEAST + 2;
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut publisher = connect(&mut s, 2, "writer", true, now);
    for d in 0..devices {
        let conn = 3 + d as u64;
        let subscription = subscribe(&format!("telemetry/d{d}"), 1);
        device_subscribed(&mut s, &mut store, d, conn, subscription, now);
        closed(&mut s, conn, now);
        store.commit_all(&mut s, now);
    }
    // While they are away: each device's records, and records none of
    // them matches between.
    let topics = rounds_of_devices(3, devices);
    publish_each(&mut s, &mut store, &topics, now);
    publisher.drain();
    let expected = offsets_of_each_device(&topics, devices);

    let passes = s.channels.passes_together;
    let mut clients: Vec<(u64, Client)> = (0..devices)
        .map(|d| {
            let conn = 100 + d as u64;
            (conn, connect(&mut s, conn, &format!("dev-{d}"), false, now))
        })
        .collect();
    loop {
        let mut intents = Vec::new();
        s.take_intents(&mut intents);
        if intents.is_empty() {
            break;
        }
        let answers: Vec<Event> = intents
            .iter()
            .map(|intent| Event::Committed {
                ticket: intent.ticket,
                result: Ok(store.apply(intent)),
            })
            .collect();
        s.handle_all(answers, now);
    }
    assert_eq!(
        s.channels.passes_together,
        passes + 1,
        "the devices passed the records in one pass"
    );
    let mut reads = Vec::new();
    s.take_reads(&mut reads);
    assert!(
        reads.is_empty(),
        "the recent records served them: {reads:?}"
    );

    let mut got: Vec<Vec<u64>> = vec![Vec::new(); devices];
    for _ in 0..3 {
        for (d, (conn, client)) in clients.iter_mut().enumerate() {
            let out = client.drain();
            got[d].extend(offsets_of(&out));
            packets(&mut s, *conn, acks_of(&out), now);
        }
        store.commit_all(&mut s, now);
    }
    assert_eq!(got, expected);
    places_written_at_the_end(&mut s, &mut store, devices, topics.len() as u64 + 1, now);
}

/// A run of records handed to a consumer whose writer is gone closes its
/// connection, as a delivery sent alone would, and loses nothing: the
/// session comes back to every record from where it was.
#[test]
fn a_run_sent_to_a_gone_writer_closes_the_connection_and_loses_nothing() {
    let now = Instant::now();
    let (mut s, mut store, clients) = consumers_behind_the_tail(&["reader"], 8, now);
    drop(clients);
    let before = s
        .metrics
        .connections
        .load(std::sync::atomic::Ordering::Relaxed);
    store.answer_reads(&mut s, 1, now);
    assert!(!s.connections.contains_key(&3), "the connection is closed");
    assert_eq!(
        s.metrics
            .connections
            .load(std::sync::atomic::Ordering::Relaxed),
        before - 1
    );
    let mut consumer = connect(&mut s, 5, "reader", false, now);
    let mut got = Vec::new();
    while got.len() < 8 {
        store.answer_reads(&mut s, 1, now);
        store.commit_all(&mut s, now);
        let out = consumer.drain();
        assert!(!out.is_empty(), "stalled after {got:?}");
        got.extend(offsets_of(&out));
        packets(&mut s, 5, acks_of(&out), now);
    }
    got.dedup();
    assert_eq!(got, (1..=8).collect::<Vec<u64>>());
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
    s.reads.waiting = reads;
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
    s.reads.waiting = reads;
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

/// A state with one append channel, a publisher on connection 1, and
/// `send(topic)` publishing a QoS 1 record there and committing it.
fn publishing_state() -> (BrokerState, FakeStore, Client) {
    let start = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let publisher = connect(&mut s, 1, "writer", true, start);
    (s, FakeStore::default(), publisher)
}

fn send(s: &mut BrokerState, store: &mut FakeStore, publisher: &mut Client, topic: &str) {
    let now = Instant::now();
    packets(s, 1, vec![publish(topic, 1, 1)], now);
    store.commit_all(s, now);
    let _ = acks_of(&publisher.drain());
}

/// Records a consumer's filters do not match pass it by without moving
/// it; one that matches while it is away is sent once it is back, and
/// its place is written past everything it was passed over for.
#[test]
fn a_consumer_passed_over_is_sent_what_matched_it_while_it_was_away() {
    let start = Instant::now();
    let (mut s, mut store, mut publisher) = publishing_state();
    let mut reader = connect(&mut s, 2, "reader", false, start);
    packets(&mut s, 2, vec![subscribe("telemetry/x", 1)], start);
    store.commit_all(&mut s, start);
    reader.drain();
    send(&mut s, &mut store, &mut publisher, "telemetry/y");
    send(&mut s, &mut store, &mut publisher, "telemetry/y");
    assert!(channel_deliveries(&reader.drain()).is_empty());

    closed(&mut s, 2, start);
    store.commit_all(&mut s, start);
    assert_eq!(
        places_written(&store, "reader").last().map(|p| p.offset),
        Some(3),
        "written past the records it was passed over for"
    );
    send(&mut s, &mut store, &mut publisher, "telemetry/x");
    send(&mut s, &mut store, &mut publisher, "telemetry/y");

    let mut back = connect(&mut s, 3, "reader", false, start);
    store.commit_all(&mut s, start);
    let out = back.drain();
    assert_eq!(channel_deliveries(&out), vec![(3, None)]);
    packets(&mut s, 3, acks_of(&out), start);
    s.flush(start);
    store.commit_all(&mut s, start);
    assert_eq!(
        places_written(&store, "reader").last().map(|p| p.offset),
        Some(5)
    );
}

/// A record matching a consumer whose window is full waits for its room,
/// whatever came after it that the consumer does not match.
#[test]
fn a_record_that_found_a_full_window_is_sent_when_there_is_room() {
    let start = Instant::now();
    let (mut s, mut store, mut publisher) = publishing_state();
    let mut narrow = request("reader", false, 300);
    narrow.receive_maximum = 1;
    let mut reader = connect_as(&mut s, 2, narrow, start);
    packets(&mut s, 2, vec![subscribe("telemetry/x", 1)], start);
    store.commit_all(&mut s, start);
    reader.drain();
    send(&mut s, &mut store, &mut publisher, "telemetry/x");
    let first = reader.drain();
    assert_eq!(channel_deliveries(&first), vec![(1, None)]);
    send(&mut s, &mut store, &mut publisher, "telemetry/x");
    send(&mut s, &mut store, &mut publisher, "telemetry/y");
    assert!(channel_deliveries(&reader.drain()).is_empty(), "no room");

    packets(&mut s, 2, acks_of(&first), start);
    store.commit_all(&mut s, start);
    assert_eq!(channel_deliveries(&reader.drain()), vec![(2, None)]);
}

/// A filter added to a consumer starts with the records after it, as a
/// new consumer does: not with those the consumer was passed over for.
#[test]
fn a_filter_added_is_not_sent_what_came_before_it() {
    let start = Instant::now();
    let (mut s, mut store, mut publisher) = publishing_state();
    let mut reader = connect(&mut s, 2, "reader", false, start);
    packets(&mut s, 2, vec![subscribe("telemetry/x", 1)], start);
    store.commit_all(&mut s, start);
    send(&mut s, &mut store, &mut publisher, "telemetry/y");
    reader.drain();

    packets(&mut s, 2, vec![subscribe("telemetry/y", 1)], start);
    store.commit_all(&mut s, start);
    assert!(channel_deliveries(&reader.drain()).is_empty());
    send(&mut s, &mut store, &mut publisher, "telemetry/y");
    assert_eq!(channel_deliveries(&reader.drain()), vec![(2, None)]);
}

/// The channel's index of consumers' filters holds those of its connected
/// consumers only: an unsubscribed filter leaves it, a detached session's
/// leave it and come back with its connection, an ended session's go.
#[test]
fn the_consumers_filters_are_indexed_while_they_are_connected() {
    let start = Instant::now();
    let (mut s, mut store, _publisher) = publishing_state();
    let filters = |s: &BrokerState| s.channels.all[0].followers.filter_count();
    let _reader = connect(&mut s, 2, "reader", false, start);
    packets(
        &mut s,
        2,
        vec![
            subscribe("telemetry/x", 1),
            subscribe("telemetry/y", 1),
            subscribe("a/b", 1),
        ],
        start,
    );
    store.commit_all(&mut s, start);
    assert_eq!(filters(&s), 2);
    packets(
        &mut s,
        2,
        vec![Inbound::Unsubscribe {
            packet_id: 2,
            filters: vec!["telemetry/x".into()],
        }],
        start,
    );
    store.commit_all(&mut s, start);
    assert_eq!(filters(&s), 1);
    closed(&mut s, 2, start);
    store.commit_all(&mut s, start);
    assert_eq!(filters(&s), 0, "detached");
    let _back = connect(&mut s, 3, "reader", false, start);
    store.commit_all(&mut s, start);
    assert_eq!(filters(&s), 1, "connected again");

    let _other = connect(&mut s, 4, "other", true, start);
    packets(&mut s, 4, vec![subscribe("telemetry/#", 1)], start);
    store.commit_all(&mut s, start);
    assert_eq!(filters(&s), 2);
    closed(&mut s, 4, start);
    store.commit_all(&mut s, start);
    assert_eq!(filters(&s), 1, "the clean session ended");
}

/// A connected consumer's place moved only over records it does not match
/// is written once every `PASSED_OVER_INTERVAL`; moved by what it was sent
/// and acknowledged, at the next flush.
#[test]
fn a_place_moved_only_past_records_not_matched_is_written_less_often() {
    use crate::broker::state::positions::PASSED_OVER_INTERVAL;
    let start = Instant::now();
    let (mut s, mut store, mut publisher) = publishing_state();
    let places = |store: &FakeStore| -> Vec<u64> {
        places_written(store, "reader").map(|p| p.offset).collect()
    };
    let mut reader = connect(&mut s, 2, "reader", false, start);
    packets(&mut s, 2, vec![subscribe("telemetry/x", 1)], start);
    s.flush(start);
    store.commit_all(&mut s, start);
    assert_eq!(places(&store), vec![1], "its start");

    send(&mut s, &mut store, &mut publisher, "telemetry/y");
    send(&mut s, &mut store, &mut publisher, "telemetry/y");
    let soon = start + Duration::from_secs(1);
    // The tick pumps every connected consumer; one following has nothing
    // to read and is not moved by it.
    s.tick(soon);
    s.flush(soon);
    store.commit_all(&mut s, soon);
    assert_eq!(places(&store), vec![1], "passed over only");
    let later = start + PASSED_OVER_INTERVAL;
    s.flush(later);
    store.commit_all(&mut s, later);
    assert_eq!(places(&store), vec![1, 3]);

    send(&mut s, &mut store, &mut publisher, "telemetry/x");
    let out = reader.drain();
    assert_eq!(channel_deliveries(&out), vec![(3, None)]);
    packets(&mut s, 2, acks_of(&out), later);
    s.flush(later);
    store.commit_all(&mut s, later);
    assert_eq!(places(&store), vec![1, 3, 4], "past what it acknowledged");
}

/// A subscription within a channel is matched by the channel's consumers,
/// never by a broadcast message: it is not kept in the broadcast index,
/// made live or restored, and the subscriptions gauge counts it all the
/// same.
#[test]
fn a_channel_subscription_is_not_kept_in_the_broadcast_index() {
    use std::sync::atomic::Ordering::Relaxed;
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let _reader = connect(&mut s, 1, "reader", false, now);
    packets(
        &mut s,
        1,
        vec![subscribe("telemetry/#", 1), subscribe("news/#", 1)],
        now,
    );
    store.commit_all(&mut s, now);
    assert_eq!(s.index.len(), 1, "news/# alone");
    assert_eq!(s.metrics.subscriptions.load(Relaxed), 2);
    packets(
        &mut s,
        1,
        vec![Inbound::Unsubscribe {
            packet_id: 2,
            filters: vec!["telemetry/#".into(), "news/#".into()],
        }],
        now,
    );
    store.commit_all(&mut s, now);
    assert_eq!(s.index.len(), 0);
    assert_eq!(s.metrics.subscriptions.load(Relaxed), 0);

    let mut s = state();
    s.restore(
        Restored {
            sessions: vec![
                super::sessions::stored_session("device", "telemetry/device/#"),
                super::sessions::stored_session("dashboard", "news/#"),
            ],
            channels: vec![RestoredChannel {
                name: "telemetry".into(),
                kind: saguin_format::model::ChannelKind::Append,
                queue: None,
                next: 1,
                positions: Vec::new(),
                holds: Vec::new(),
            }],
            ..Restored::default()
        },
        now,
    );
    assert_eq!(s.index.len(), 1, "news/# alone, restored");
    assert_eq!(s.metrics.subscriptions.load(Relaxed), 2);
    // The device's session ends (a clean connection takes it over).
    let _device = connect(&mut s, 1, "device", true, now);
    store.commit_all(&mut s, now);
    assert_eq!(s.metrics.subscriptions.load(Relaxed), 1);
    assert_eq!(s.index.len(), 1);
}

/// A device consuming its commands holds room for its one consumer and
/// that consumer's one filter, and gives back the queue its CONNACK and
/// SUBACK waited in once they are answered: thousands of such devices
/// stay connected and quiet for hours.
#[test]
fn a_consuming_device_holds_room_for_what_it_has() {
    let now = Instant::now();
    let mut s = channel_state(Limits::default(), 1);
    let mut store = FakeStore::default();
    let mut device = connect(&mut s, 1, "device-7", false, now);
    store.commit_all(&mut s, now);
    packets(&mut s, 1, vec![subscribe("telemetry/device-7/#", 1)], now);
    store.commit_all(&mut s, now);
    assert!(suback_sent(&device.drain()));
    assert!(!s.connections[&1].answers.is_allocated());
    let key = s.connections[&1].session;
    let consumers = &s.sessions.by_key[&key].consumers;
    assert_eq!((consumers.len(), consumers.capacity()), (1, 1));
    let filters = &consumers[0].filters;
    assert_eq!((filters.len(), filters.capacity()), (1, 1));
}
