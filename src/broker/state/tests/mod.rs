//! State tests: events in, packets and intents out, commits fed by hand on
//! an injected clock. The helpers every room's tests drive the state with
//! are here; the tests are by room: `sessions` (connections, sessions,
//! the QoS flows, retained messages, restore), `channels` (append
//! channels, their consumers and stored positions, bridges and shared
//! groups), `latest_and_queues` (latest and queue channels over real
//! memory stores).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::*;
use crate::broker::codec::ByteStr;
use crate::broker::message::MessageProperties;
use crate::broker::metrics::{CloseReason, DropReason, Metrics};
use crate::broker::subscriptions::SubOptions;
use crate::storage::contract::LentRecord;
use crate::storage::kept::Kept;

mod channels;
mod latest_and_queues;
mod random;
mod sessions;

struct Client {
    /// The connection's end of its link: what the state queued, and
    /// whether it paused the reader.
    rx: crate::broker::link::Outlet,
}

impl Client {
    fn drain(&mut self) -> Vec<Outbound> {
        let mut taken = std::collections::VecDeque::new();
        let waker = std::task::Waker::noop();
        let cx = std::task::Context::from_waker(waker);
        let _ = self.rx.poll_take(&cx, &mut taken);
        taken.into()
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
    /// When set, a retained value is answered with a handle on it, as a
    /// memory store answers: every handle handed out, in order.
    retained_handles: Option<Vec<crate::storage::kept::Kept>>,
    /// The same for a broadcast log entry.
    log_handles: Option<Vec<Kept>>,
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
                    Write::AppendLog(record) => {
                        self.next_offset += 1;
                        let kept = self.log_handles.as_mut().map(|handles| {
                            let kept = Kept::new(&saguin_format::model::Record {
                                offset: self.next_offset,
                                ..record.clone()
                            });
                            handles.push(kept.clone());
                            kept
                        });
                        Written::Appended(self.next_offset, kept)
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
                    Write::SetRetained(record) => match self.retained_handles.as_mut() {
                        Some(handles) => {
                            let kept = crate::storage::kept::Kept::new(record);
                            handles.push(kept.clone());
                            Written::Retained(kept)
                        }
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
                // Lent as a memory store lends its records.
                .map(|r| LentRecord::Kept(Kept::new(r)))
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

/// A year, in the nanoseconds stored times are kept in.
const YEAR: i64 = 365 * 86_400 * 1_000_000_000;

/// NTP sets the system clock a year ahead of the state's at `now`; the
/// flush after it, committed.
fn clock_set_a_year_ahead(s: &mut BrokerState, store: &mut FakeStore, now: Instant) {
    s.follow_wall_clock(now, s.receipt_time(now) + YEAR);
    s.flush(now);
    store.commit_all(s, now);
}

fn state_with(limits: Limits) -> BrokerState {
    BrokerState::new(
        limits,
        Arc::new(Metrics::new()),
        Arc::new(AllowAll),
        super::clock::ReceiptClock::new(Instant::now(), 1_700_000_000_000_000_000),
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
    let (handle, rx) = crate::broker::link::link();
    state.handle(
        Event::Connect {
            connection: conn,
            request: Box::new(request),
            handle,
        },
        now,
    );
    Client { rx }
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
        filters: vec![(filter.into(), sub_options(qos))],
    }
}

/// Subscription options with `qos` and nothing else.
fn sub_options(qos: u8) -> SubOptions {
    SubOptions {
        qos,
        no_local: false,
        retain_as_published: false,
        retain_handling: 0,
        subscription_id: None,
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

/// The offsets (and gaps) of the channel records in `out`, in order.
fn channel_deliveries(out: &[Outbound]) -> Vec<(u64, Option<String>)> {
    out.iter()
        .filter_map(|o| match o {
            Outbound::Publish { message, .. } => {
                let props = &message.properties.user_properties;
                let offset = match message.channel_offset {
                    Some(offset) => offset.get(),
                    None => props
                        .iter()
                        .find(|(k, _)| k == OFFSET_PROPERTY)?
                        .1
                        .parse()
                        .ok()?,
                };
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

/// The connection and session tables hold an entry per client, each
/// boxed (a table's spare room is a pointer a slot, not an entry); a part
/// most clients never use (a Will, the QoS 1/2 queues and tables, the
/// answers waiting for a commit) is boxed or lazy so it does not size
/// them all.
#[test]
fn the_connection_and_session_tables_entries_stay_small() {
    let connection = std::mem::size_of::<super::Connection>();
    // 64 B: the allocator's class below 80.
    assert!(connection <= 64, "a connection entry is {connection} bytes");
    let session = std::mem::size_of::<super::session::Session>();
    // 128 B: the allocator's class below 160.
    assert!(session <= 128, "a session entry is {session} bytes");
    // What a slot of each table holds.
    assert_eq!(std::mem::size_of::<Box<super::Connection>>(), 8);
    assert_eq!(std::mem::size_of::<Box<super::session::Session>>(), 8);
}

/// A message a session is owed is one entry of its queue, one a message
/// for each session owed it: a million messages queued for offline
/// devices are a million entries.
#[test]
fn a_queued_message_entry_stays_small() {
    let queued = std::mem::size_of::<super::session::QueuedMessage>();
    assert!(queued <= 40, "a queued message is {queued} bytes");
    let logged = super::session::QueuedMessage::logged_at(Some(7));
    assert_eq!(logged.map(std::num::NonZeroU64::get), Some(7));
}

/// An idle client, connected and acknowledged, leaves every lazy part of
/// its connection and its session unallocated.
#[test]
fn an_idle_clients_entries_hold_nothing_lazy() {
    let now = Instant::now();
    let mut s = state();
    for v5 in [false, true] {
        let conn = u64::from(v5) + 1;
        let id = if v5 { "idle-5" } else { "idle-3" };
        let mut c = connect_with(&mut s, conn, id, true, v5, now);
        assert!(matches!(
            c.drain()[..],
            [Outbound::ConnAck {
                reason: ReasonCode::Success,
                ..
            }]
        ));
        s.tick(now + Duration::from_secs(61));
        let connection = &s.connections[&conn];
        assert!(!connection.answers.is_allocated());
        assert!(!connection.retained_backlog.is_allocated());
        let session = &s.sessions.by_key[&connection.session];
        assert!(!session.inflight.is_allocated());
        assert!(!session.pending.is_allocated());
        assert!(!session.rare.is_allocated());
        assert!(!session.consumers.is_allocated());
    }
}

/// A device subscribed to its command topic holds room for that one
/// subscription in its session, not a B-tree's eleven.
#[test]
fn a_sessions_one_subscription_holds_room_for_one() {
    let now = Instant::now();
    let mut s = state();
    let mut c = connect(&mut s, 1, "device-7", true, now);
    let _ = c.drain();
    packets(&mut s, 1, vec![subscribe("cmd/device-7/#", 1)], now);
    let key = s.connections[&1].session;
    let crate::broker::small_map::SmallMap::Few(subscriptions) =
        &s.sessions.by_key[&key].subscriptions
    else {
        panic!("one subscription is a vector");
    };
    assert_eq!((subscriptions.len(), subscriptions.capacity()), (1, 1));
}

/// A subscription reads its filter and share group from its raw filter,
/// the key it is kept under, rather than keeping them twice.
#[test]
fn a_subscription_reads_its_filter_from_its_key() {
    use super::session::SessionSubscription;
    let options = sub_options(1);
    let plain = "cmd/device-7/#";
    let sub = SessionSubscription::new(plain, options, 3);
    assert_eq!((sub.filter(plain), sub.share_group(plain)), (plain, None));
    assert!(!sub.is_shared());
    let shared = "$share/workers/jobs/+";
    let sub = SessionSubscription::new(shared, options, 3);
    assert_eq!(sub.filter(shared), "jobs/+");
    assert_eq!(sub.share_group(shared), Some("workers"));
    assert!(sub.is_shared());
    assert!(std::mem::size_of::<SessionSubscription>() <= 24);
}

/// A retained publish's topic and payload arrive as slices of the
/// connection's read buffer: the stored record and the retained index
/// each hold bytes of their own, and neither pins that buffer.
#[test]
fn a_retained_message_pins_no_read_buffer() {
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
    s.retained.matching("r/1", &mut |found| held.push(found));
    let [message] = <[_; 1]>::try_from(held).expect("one retained message");
    let message = message.into_message(now);
    assert!(!in_buffer(message.topic.as_bytes()) && !in_buffer(&message.payload));
    assert_eq!(
        (&*message.topic, &message.payload[..]),
        ("r/1", &b"payload"[..])
    );
}
