//! Latest and queue channels over real memory stores.

use saguin_format::model::ChannelKind;

use super::*;
use crate::storage::contract::{ChannelStore, Provider as _};

/// Most jobs one worker of a test's queue holds: above the test clients'
/// window of 10, so only a worker that asks for more meets it.
const QUEUE_MAX_HELD_PER_WORKER: usize = 12;

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
        let provider = crate::storage::memory::MemoryProvider::unbounded();
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
                    max_held_per_worker: QUEUE_MAX_HELD_PER_WORKER,
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
                let result = read_from(&self.stores[read.channel as usize], &read);
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

/// What `read` finds in `store`, as the server's reader answers it.
pub(super) fn read_from(
    store: &ChannelStore,
    read: &ChannelRead,
) -> Result<ReadWindow, StorageFailure> {
    match store {
        ChannelStore::Append(st) => crate::broker::reader::read_window(&**st, read.from, read.max),
        ChannelStore::Latest(st) => {
            crate::broker::reader::read_latest(&**st, read.from, &read.filters, read.max)
        }
        ChannelStore::Queue(st) => crate::broker::reader::read_queue(&**st, read.from, read.max),
    }
    .map_err(|e| StorageFailure {
        full: false,
        message: e.to_string(),
    })
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

/// A latest channel's consumers, caught up, follow its changes: a change
/// is offered to those whose filters match it, and the others are passed
/// over without being looked at (thousands of devices each consuming its
/// own settings), their places written with the others passed over.
#[test]
fn a_caught_up_latest_consumer_is_passed_over_by_changes_it_does_not_match() {
    use crate::broker::state::positions::PASSED_OVER_INTERVAL;
    let now = Instant::now();
    let (mut s, store) = kinds_state(&[("devices", ChannelKind::Latest)]);
    let following = |s: &BrokerState| s.channels.all[0].followers.following_count();
    let mut publisher = connect(&mut s, 1, "writer", true, now);
    packets(
        &mut s,
        1,
        vec![
            publish_payload("devices/a", b"1", 1),
            publish_payload("devices/b", b"1", 2),
        ],
        now,
    );
    store.settle(&mut s, now);
    publisher.drain();
    let mut a = connect(&mut s, 2, "a", false, now);
    let mut b = connect(&mut s, 3, "b", false, now);
    packets(&mut s, 2, vec![subscribe_with("devices/a", 1, 0)], now);
    packets(&mut s, 3, vec![subscribe_with("devices/b", 1, 0)], now);
    store.settle(&mut s, now);
    for (reader, conn) in [(&mut a, 2), (&mut b, 3)] {
        let values = deliveries(&reader.drain());
        assert_eq!(values.len(), 1, "its current value");
        packets(
            &mut s,
            conn,
            vec![puback(values[0].3, ReasonCode::Success)],
            now,
        );
    }
    store.settle(&mut s, now);
    assert_eq!(following(&s), 2, "both caught up");

    let changes = (10..13)
        .map(|id| publish_payload("devices/b", b"2", id))
        .collect();
    packets(&mut s, 1, changes, now);
    store.settle(&mut s, now);
    assert_eq!(puback_ids(&publisher.drain()), vec![10, 11, 12]);
    assert!(deliveries(&a.drain()).is_empty());
    let to_b = deliveries(&b.drain());
    assert_eq!(to_b.len(), 3);
    for (_, _, _, id) in &to_b {
        packets(&mut s, 3, vec![puback(*id, ReasonCode::Success)], now);
    }
    // The tick pumps every connected consumer: one following has nothing
    // to read.
    s.tick(now + Duration::from_secs(1));
    let mut reads = Vec::new();
    s.take_reads(&mut reads);
    assert!(reads.is_empty(), "{reads:?}");
    assert_eq!(following(&s), 2, "a passed over, b sent what it matched");

    let later = now + PASSED_OVER_INTERVAL;
    s.flush(later);
    store.settle(&mut s, later);
    assert_eq!(latest_position(&store, "a"), Some(6), "past the changes");
    assert_eq!(latest_position(&store, "b"), Some(6));
    packets(
        &mut s,
        1,
        vec![publish_payload("devices/a", b"2", 13)],
        later,
    );
    store.settle(&mut s, later);
    assert_eq!(
        deliveries(&a.drain()),
        vec![("devices/a".into(), Bytes::from_static(b"2"), false, 2)],
        "its next change, in turn"
    );
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
fn a_worker_that_asks_for_a_wide_window_holds_no_more_than_the_queue_lets_one() {
    let now = Instant::now();
    let (mut s, store) = queue_state(5);
    let _producer = connect(&mut s, 1, "producer", true, now);
    // An MQTT 5 client that names no Receive Maximum: 65,535.
    let wide = ConnectRequest {
        receive_maximum: u16::MAX,
        ..request("wide", true, 0)
    };
    let mut wide_worker = connect_as(&mut s, 2, wide, now);
    packets(&mut s, 2, vec![subscribe("jobs/#", 1)], now);
    store.settle(&mut s, now);
    wide_worker.drain();
    enqueue(&mut s, &store, 1, 30, now);
    let first = deliveries(&wide_worker.drain());
    assert_eq!(
        first.len(),
        QUEUE_MAX_HELD_PER_WORKER,
        "held to the queue's bound"
    );
    // A worker joining later gets what is left, within its own window.
    let mut narrow = connect(&mut s, 3, "narrow", true, now);
    packets(&mut s, 3, vec![subscribe("jobs/#", 1)], now);
    store.settle(&mut s, now);
    assert_eq!(deliveries(&narrow.drain()).len(), 10);
    // Each answer lets one more out to the wide worker, never past the bound.
    packets(
        &mut s,
        2,
        vec![puback(first[0].3, ReasonCode::Success)],
        now,
    );
    packets(
        &mut s,
        2,
        vec![puback(first[1].3, ReasonCode::UnspecifiedError)],
        now,
    );
    store.settle(&mut s, now);
    assert_eq!(deliveries(&wide_worker.drain()).len(), 2);
    let held_by_wide = s
        .queue_in_flight("jobs")
        .iter()
        .filter(|(_, worker)| s.sessions.by_key[worker].client_id.as_ref() == "wide")
        .count();
    assert_eq!(held_by_wide, QUEUE_MAX_HELD_PER_WORKER);
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
