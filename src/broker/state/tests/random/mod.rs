//! Random runs: a few clients and the broker's own bridge doing whatever
//! a client may send, in any order (reading what they are sent or not),
//! one of them denied some of each by the ACL, against the state over the
//! real persisters and readers of a provider ([`backing`]: a bounded
//! memory provider, which fills, or a sqlite file whose disk fails as the
//! run plans), with commits and reads answered late, all at once or a few
//! at a time, one by one or gathered into groups as a persister's thread
//! gathers them, or with one persister lagging behind the others, clients
//! coming back and sending again what MQTT asks them to, the clock moving, retention trimming, and the broker killed
//! and started again from what the provider holds. Each run must end
//! without a panic. At every step what the state sends each connection
//! keeps two rules of MQTT (no more unacknowledged deliveries than the
//! connection's window, no packet id reused while its delivery is
//! unacknowledged), its gauges of connections, sessions and subscriptions
//! say what it holds, and every publish acknowledged into the append
//! channel is stored, held for its release, or counted as let go
//! unreleased. At the end, once every client has answered everything, no
//! connected session is owed anything more, every publish a connected
//! client sent was answered to its end, and no read or write is asked for
//! without end.
//!
//! `PROPTEST_CASES=30000 cargo test --release --lib random::` searches
//! longer; the runs below it are what such searches found.

use std::collections::HashMap;
use std::future::Future;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;

use super::latest_and_queues::read_from;
use super::*;
use crate::storage::contract::ChannelStore;
use backing::{Backing, Life};

mod backing;

/// Three clients and a bridge.
const CLIENTS: usize = 4;

/// The client that is the broker's own bridge "edge", connected as its link
/// connects it: MQTT 5, a new session each time, its window its own. What
/// it publishes into a channel carries its name, its places in channels
/// are kept as the reader `bridge:edge` while it is away, and it is not
/// handed what arrived over a bridge.
const BRIDGE: usize = 3;

/// Whether a publish to `topic` goes into a channel.
fn in_a_channel(topic: &str) -> bool {
    ["telemetry/", "devices/", "jobs/"]
        .iter()
        .any(|channel| topic.starts_with(channel))
}

/// The client id client `client` connects with.
fn client_id(client: usize) -> String {
    match client {
        BRIDGE => format!("{}edge", crate::broker::bridge::CLIENT_ID_PREFIX),
        _ => format!("c{client}"),
    }
}

/// What the clients publish to: broadcast topics, each kind of channel,
/// and a name the broker keeps for itself.
const TOPICS: [&str; 8] = [
    "a/b",
    "a/c",
    "telemetry/x",
    "telemetry/y",
    "devices/k1",
    "devices/k2",
    "jobs/j",
    "$SYS/x",
];

/// What they subscribe to, shared groups over each kind among them.
const FILTERS: [&str; 10] = [
    "a/#",
    "+/b",
    "#",
    "telemetry/#",
    "devices/#",
    "jobs/#",
    "$share/g/a/#",
    "$share/g/telemetry/#",
    "$share/g/jobs/#",
    "telemetry/x",
];

/// Where a channel subscription asks to start (`saguin-from`).
const FROM: [&str; 4] = ["earliest", "2", "2020-01-01T00:00:00Z", "later"];

/// An ACL that denies some of everything to one client, `c1`: a
/// publish to `a/c`, a subscription to `+/b`, a delivery from
/// `devices/k2` and anything of the queue's.
struct Acl;

impl Authorizer for Acl {
    fn is_active(&self) -> bool {
        true
    }
    fn can_publish(&self, _: Option<&str>, client_id: &str, topic: &str) -> bool {
        client_id != "c1" || !(topic == "a/c" || topic.starts_with("jobs/"))
    }
    fn can_subscribe(&self, _: Option<&str>, client_id: &str, filter: &str) -> bool {
        client_id != "c1" || !(filter == "+/b" || filter.contains("jobs/"))
    }
    fn can_receive(&self, _: Option<&str>, client_id: &str, topic: &str) -> bool {
        client_id != "c1" || topic != "devices/k2"
    }
}

#[derive(Clone, Debug)]
enum Op {
    Connect {
        client: usize,
        v5: bool,
        clean: bool,
        receive_maximum: u16,
        /// A Will, with its delay in seconds.
        will: Option<u32>,
    },
    Publish {
        client: usize,
        topic: usize,
        qos: u8,
        retain: bool,
        packet_id: u16,
        empty: bool,
        /// Message Expiry Interval, seconds.
        expiry: Option<u32>,
        /// Sent this many times in one read, with packet ids counting up.
        times: u16,
    },
    /// An answer as a client may send it, right or wrong.
    Answer {
        client: usize,
        kind: u8,
        packet_id: u16,
    },
    /// The right answer to everything the client is owed one for.
    AnswerAll {
        client: usize,
    },
    Subscribe {
        client: usize,
        filter: usize,
        qos: u8,
        from: Option<usize>,
        /// No Local, Retain As Published, Retain Handling and a
        /// Subscription Identifier, as MQTT 5 may ask.
        options: (bool, bool, u8, Option<u32>),
    },
    Unsubscribe {
        client: usize,
        filter: usize,
    },
    Ping {
        client: usize,
    },
    Disconnect {
        client: usize,
        expiry: Option<u32>,
    },
    /// The socket failed.
    Lost {
        client: usize,
    },
    /// Every write and read asked for answered, until none is.
    Settle,
    /// The same, each persister handed all of its writes waiting before it
    /// runs any: on sqlite they share groups (a group commit of publishes,
    /// a transaction of several packets' session writes; a group whose
    /// commit fails answers each packet alone) in the order its thread
    /// takes them.
    SettleTogether,
    /// The first few writes asked for answered, the rest left waiting.
    SettleSome(usize),
    /// The persister of the oldest write waiting is slow: every write to
    /// the others is answered, each persister's in order, and its own
    /// wait (each role has a persister of its own, answering apart).
    Lag,
    Tick {
        seconds: u16,
    },
    /// Retention removes the append channel's oldest records down to
    /// `keep` bytes, and the state is told its new floor.
    Trim {
        keep: u64,
    },
    /// The broker is killed and started again.
    Restart,
    /// The client stops reading what it is sent, or reads again.
    Stall {
        client: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let client = 0..CLIENTS;
    prop_oneof![
        1 => (
            client.clone(),
            any::<bool>(),
            any::<bool>(),
            1..4u16,
            proptest::option::of(0..90u32)
        )
            .prop_map(
            |(client, v5, clean, receive_maximum, will)| Op::Connect {
                client,
                v5,
                clean,
                receive_maximum,
                will
            }
        ),
        3 => (
            (client.clone(), 0..TOPICS.len(), 0..3u8, any::<bool>()),
            (
                1..5u16,
                proptest::bool::weighted(0.1),
                proptest::option::weighted(0.2, 0..200u32),
                proptest::sample::select(vec![1u16, 1, 1, 3])
            )
        )
            .prop_map(
                |((client, topic, qos, retain), (packet_id, empty, expiry, times))| {
                    Op::Publish {
                        client,
                        topic,
                        qos,
                        retain,
                        packet_id,
                        empty,
                        expiry,
                        times,
                    }
                }
            ),
        1 => (client.clone(), 0..4u8, 1..5u16).prop_map(|(client, kind, packet_id)| Op::Answer {
            client,
            kind,
            packet_id
        }),
        3 => client.clone().prop_map(|client| Op::AnswerAll { client }),
        2 => (
            client.clone(),
            0..FILTERS.len(),
            0..3u8,
            proptest::option::weighted(0.3, 0..FROM.len()),
            (
                proptest::bool::weighted(0.2),
                proptest::bool::weighted(0.2),
                proptest::sample::select(vec![0u8, 0, 1, 2]),
                proptest::option::weighted(0.2, 1..3u32)
            )
        )
            .prop_map(|(client, filter, qos, from, options)| Op::Subscribe {
                client,
                filter,
                qos,
                from,
                options
            }),
        1 => (client.clone(), 0..FILTERS.len())
            .prop_map(|(client, filter)| Op::Unsubscribe { client, filter }),
        1 => client.clone().prop_map(|client| Op::Ping { client }),
        1 => (client.clone(), proptest::option::of(0..600u32))
            .prop_map(|(client, expiry)| Op::Disconnect { client, expiry }),
        1 => client.prop_map(|client| Op::Lost { client }),
        2 => Just(Op::Settle),
        2 => Just(Op::SettleTogether),
        1 => (1..4usize).prop_map(Op::SettleSome),
        1 => Just(Op::Lag),
        1 => (0..400u16).prop_map(|seconds| Op::Tick { seconds }),
        1 => (0..300u64).prop_map(|keep| Op::Trim { keep }),
        1 => Just(Op::Restart),
        1 => (0..CLIENTS).prop_map(|client| Op::Stall { client }),
    ]
}

/// One client as the run drives it, with what it is owed answers for.
#[derive(Default)]
struct Peer {
    /// Its connection, while it has one, and the connection's end of the
    /// link.
    connection: Option<(u64, crate::broker::link::Outlet)>,
    /// Most unacknowledged deliveries its connection may be sent.
    window: usize,
    /// Its connection speaks MQTT 5 (what only MQTT 5 carries is sent only
    /// then, as the connection's codec would).
    v5: bool,
    /// Deliveries of QoS 1 and 2 it was sent and has not answered, by
    /// packet id, with their QoS. Any answer naming one counts it answered
    /// here, right or not, so the window is never checked for more than
    /// the broker owes.
    unanswered: HashMap<u16, u8>,
    /// Packet ids it answered with a PUBACK or PUBCOMP before it had read
    /// a delivery under them (a client that stopped reading may answer
    /// anything): the broker may take such an answer as the answer to a
    /// delivery still unread, which then never counts as unanswered.
    answered_unread: std::collections::HashSet<u16>,
    /// The same, answered only by the right answer: what it still owes the
    /// broker.
    owed: HashMap<u16, u8>,
    /// Its QoS 2 publishes the broker answered with PUBREC.
    to_release: Vec<u16>,
    /// Deliveries the broker sent PUBREL for.
    to_complete: Vec<u16>,
    /// It reads nothing of what its connection is sent.
    stalled: bool,
    /// Every PUBLISH it was sent: packet id and DUP.
    received: Vec<(u16, bool)>,
    /// The topic of each QoS 1 or 2 publish it sent, by packet id and QoS
    /// (an answer names its exchange by both), until the broker answers
    /// it.
    published: HashMap<(u16, u8), &'static str>,
    /// Those of them made before its latest CONNECT: over when the broker
    /// answers that it begins a session afresh (a client need not wait for
    /// the CONNACK to publish).
    before_connect: Vec<(u16, u8)>,
    /// QoS 2 exchanges already counted as stored by their PUBREC.
    counted: std::collections::HashSet<(u16, u8)>,
}

struct Run {
    state: BrokerState,
    backing: Backing,
    life: Life,
    /// Hands writes to the persisters.
    runtime: tokio::runtime::Runtime,
    /// Writes asked for and not yet answered, oldest first.
    intents: Vec<Intent>,
    peers: Vec<Peer>,
    next_connection: u64,
    now: Instant,
    limits: Limits,
    /// Publishes into the append channel the broker acknowledged as
    /// stored.
    acknowledged: u64,
    /// Unreleased QoS 2 holds let go by their expiry in states before the
    /// last restart (counted, as the state counts them).
    expired_before: u64,
}

impl Run {
    fn new() -> Run {
        Run::on(Backing::Memory)
    }

    fn on(backing: Backing) -> Run {
        let limits = Limits {
            receive_maximum: 3,
            max_inflight_messages: 3,
            max_queued_messages: 8,
            max_subscriptions_per_session: 6,
            max_retained: 4,
            max_session_expiry: 300,
            exactly_once_expires_after: Duration::from_secs(120),
            // A client that stops reading fills its writer's queue soon.
            outbound_queue: 4,
            ..Limits::default()
        };
        let metrics = Arc::new(Metrics::new());
        let life = Life::open(&backing, &metrics);
        let now = Instant::now();
        let state = Run::start(&limits, &metrics, &life, now);
        let mut run = Run {
            state,
            backing,
            life,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime"),
            intents: Vec::new(),
            peers: (0..CLIENTS).map(|_| Peer::default()).collect(),
            next_connection: 1,
            now,
            limits,
            acknowledged: 0,
            expired_before: 0,
        };
        run.settle();
        run
    }

    /// A state rebuilt from what the provider holds, as a start builds it.
    fn start(limits: &Limits, metrics: &Arc<Metrics>, life: &Life, now: Instant) -> BrokerState {
        let mut state = BrokerState::new(
            limits.clone(),
            metrics.clone(),
            Arc::new(Acl),
            super::super::clock::ReceiptClock::new(now, 1_700_000_000_000_000_000),
        );
        crate::broker::persister::read_retained(&*life.provider, &mut |value| {
            state.restore_retained(value, now)
        })
        .unwrap();
        // As the server starts: the sessions built while the log is read.
        let mut sessions = None;
        let restored =
            crate::broker::persister::read_restored(&*life.provider, &life.served, &mut |stored| {
                sessions = Some(state.restore_sessions(stored, now))
            })
            .unwrap();
        state.restore_rest(restored, sessions.expect("the sessions were read"), now);
        life.serving();
        state
    }

    /// The broker is killed and started again: what was answered is what
    /// the provider holds, what was not is lost with the process, and every
    /// client's connection ends with it.
    fn restart(&mut self) {
        self.intents.clear();
        for peer in &mut self.peers {
            // What its session holds survives; its connection does not.
            let mut published = std::mem::take(&mut peer.published);
            published.retain(|&(_, qos), _| qos == 2);
            *peer = Peer {
                published,
                counted: std::mem::take(&mut peer.counted),
                ..Peer::default()
            };
        }
        self.expired_before += self.expired_holds();
        let metrics = Arc::new(Metrics::new());
        if self.backing.reopens() {
            // The file is let go before it is opened again, as a process
            // that ends lets go of it.
            self.life.close();
            self.life = Life::open(&self.backing, &metrics);
        }
        self.state = Run::start(&self.limits, &metrics, &self.life, self.now);
        self.settle();
    }

    /// Hand a write to its persister and give the state its answer.
    fn commit(&mut self, intent: Intent) {
        let role = intent.role.index();
        self.hand(intent);
        self.run_role(role);
    }

    /// Hand a write to its persister: a memory provider's answers as it is
    /// handed the write, a sqlite provider's once it runs it
    /// ([`Run::run_role`]).
    fn hand(&mut self, intent: Intent) {
        match wait(&self.runtime, self.life.persisters.submit(intent)) {
            Ok(Some(answer)) => self.state.handle(answer, self.now),
            Ok(None) => {}
            Err(gone) => panic!("a persister is gone: {gone:?}"),
        }
    }

    /// The persister of role `index` runs every group of writes it was
    /// handed, as its thread would take them, and the state is given each
    /// group's answers in one turn, as the broker task takes those ready.
    fn run_role(&mut self, index: usize) {
        while let Some(answers) = self.life.persisters.step(index) {
            self.state.handle_all(answers, self.now);
        }
    }

    /// Answer the first `most` writes waiting, and every read. `together`:
    /// each persister is handed all of its writes before it runs any, so
    /// they share groups; otherwise each is answered before the next is
    /// handed over.
    fn answer(&mut self, most: usize, together: bool) -> bool {
        self.state.take_intents(&mut self.intents);
        let mut reads = Vec::new();
        self.state.take_reads(&mut reads);
        let taken = self.intents.len().min(most);
        let answered = taken + reads.len();
        let intents: Vec<Intent> = self.intents.drain(..taken).collect();
        if together {
            for intent in intents {
                self.hand(intent);
            }
            // Rounds as a provider's thread runs them: each role's next
            // group, the channels' publish groups stored together.
            while let Some(rounds) = self.life.persisters.step_round() {
                for answers in rounds {
                    self.state.handle_all(answers, self.now);
                }
            }
        } else {
            for intent in intents {
                self.commit(intent);
            }
        }
        for read in reads {
            let result = read_from(&self.life.stores[usize::from(read.channel)], &read);
            self.state.handle(
                Event::ChannelRead {
                    ticket: read.ticket,
                    result,
                },
                self.now,
            );
        }
        answered > 0
    }

    /// Answer and deliver until the state asks for nothing more, each
    /// write answered before the next is handed over: a state that keeps
    /// asking (a read answered, asked for again, without end) fails the
    /// run.
    fn settle(&mut self) {
        self.settle_as(false);
    }

    /// [`Run::settle`], the writes handed over as [`Run::answer`]'s
    /// `together` says.
    fn settle_as(&mut self, together: bool) {
        let mut rounds = 0;
        while self.answer(usize::MAX, together) {
            self.deliver();
            rounds += 1;
            assert!(
                rounds < 10_000,
                "the state keeps asking for writes or reads"
            );
        }
        self.deliver();
    }

    fn packets(&mut self, client: usize, packets: Vec<Inbound>) {
        let Some((connection, _)) = &self.peers[client].connection else {
            return;
        };
        let connection = *connection;
        self.state.handle(
            Event::Packets {
                connection,
                packets,
                read_order: 0,
            },
            self.now,
        );
    }

    /// Take what the state queued for each connection, as its writer
    /// would, checking the rules of what a connection is sent; a
    /// connection the state let go of (or told to go) ends, as its task
    /// would.
    fn deliver(&mut self) {
        let mut resending = false;
        for client in 0..CLIENTS {
            let mut ended = false;
            let peer = &mut self.peers[client];
            let Some((connection, outlet)) = &peer.connection else {
                continue;
            };
            if peer.stalled {
                continue;
            }
            let connection = *connection;
            let mut taken = std::collections::VecDeque::new();
            let mut resent = Vec::new();
            let cx = Context::from_waker(Waker::noop());
            match outlet.poll_take(&cx, &mut taken) {
                Poll::Ready(false) => ended = true,
                Poll::Ready(true) | Poll::Pending => {}
            }
            outlet
                .written
                .fetch_add(taken.len() as u32, std::sync::atomic::Ordering::Relaxed);
            let drained = outlet
                .want_drained
                .swap(false, std::sync::atomic::Ordering::Relaxed);
            for packet in taken {
                match packet {
                    Outbound::Publish {
                        packet_id,
                        qos: 1..=2,
                        dup,
                        ..
                    } => {
                        let qos = match &packet {
                            Outbound::Publish { qos, .. } => *qos,
                            _ => unreachable!(),
                        };
                        assert!(
                            dup || !peer.unanswered.contains_key(&packet_id),
                            "client {client}: packet id {packet_id} sent again while unanswered"
                        );
                        // An answer it sent on this connection before it
                        // read the delivery may answer a resent one too:
                        // the broker resends at the CONNACK, and takes the
                        // answer after.
                        if !peer.answered_unread.remove(&packet_id) {
                            peer.unanswered.insert(packet_id, qos);
                        }
                        peer.owed.insert(packet_id, qos);
                        peer.received.push((packet_id, dup));
                        assert!(
                            peer.unanswered.len() <= peer.window,
                            "client {client}: {} deliveries unanswered, window {}",
                            peer.unanswered.len(),
                            peer.window
                        );
                    }
                    // A QoS 1 publish is stored by its PUBACK, a QoS 2 one
                    // by its PUBREC: held until its release, which the hold
                    // outlives a restart to wait for.
                    // The exchange of a QoS 2 publish goes on to its
                    // PUBCOMP: a publish under its packet id meanwhile is a
                    // duplicate of it.
                    Outbound::PubAck { packet_id, reason }
                    | Outbound::PubRec { packet_id, reason } => {
                        let qos = if matches!(packet, Outbound::PubAck { .. }) {
                            1
                        } else {
                            2
                        };
                        let stored = (reason as u8) < 0x80;
                        let exchange = (packet_id, qos);
                        // MQTT 3.1.1 has no refusing PUBREC: a refused QoS 2
                        // publish is released like any other.
                        let goes_on = qos == 2 && (stored || !peer.v5);
                        let topic = match goes_on {
                            true => peer.published.get(&exchange).copied(),
                            false => peer.published.remove(&exchange),
                        };
                        let first = stored && peer.counted.insert(exchange);
                        if first && topic.is_some_and(|t| t.starts_with("telemetry/")) {
                            self.acknowledged += 1;
                        }
                        if goes_on {
                            peer.to_release.push(packet_id);
                        }
                        if qos == 1 {
                            peer.counted.remove(&exchange);
                        }
                    }
                    Outbound::PubComp { packet_id, .. } => {
                        peer.published.remove(&(packet_id, 2));
                        peer.counted.remove(&(packet_id, 2));
                    }
                    Outbound::PubRel { packet_id, .. } => peer.to_complete.push(packet_id),
                    Outbound::ConnAck { reason, .. } if reason != ReasonCode::Success => {
                        ended = true
                    }
                    // A session begun afresh holds none of the exchanges
                    // of an earlier one. A session resumed is sent again
                    // each QoS 2 publish not yet answered PUBREC, marked
                    // DUP, and the PUBREL of each that was, as MQTT asks
                    // of a client.
                    Outbound::ConnAck {
                        session_present, ..
                    } => {
                        let mut earlier = std::mem::take(&mut peer.before_connect);
                        earlier.sort_unstable();
                        for exchange in earlier {
                            // A bridge's session is new each time, but its
                            // holds in channels outlive it.
                            let kept = session_present
                                || (client == BRIDGE
                                    && peer
                                        .published
                                        .get(&exchange)
                                        .is_some_and(|t| in_a_channel(t)));
                            if !kept {
                                peer.published.remove(&exchange);
                                peer.counted.remove(&exchange);
                            } else if peer.counted.contains(&exchange) {
                                peer.to_release.push(exchange.0);
                            } else if let Some(topic) = peer.published.get(&exchange) {
                                resent.push(Inbound::Publish(InboundPublish {
                                    packet_id: exchange.0,
                                    qos: exchange.1,
                                    retain: false,
                                    dup: true,
                                    topic: ByteStr::from(*topic),
                                    payload: Bytes::from_static(b"a payload of some bytes"),
                                    properties: MessageProperties::default(),
                                }));
                            }
                        }
                    }
                    Outbound::Disconnect { .. } => ended = true,
                    _ => {}
                }
            }
            if drained {
                self.state.handle(Event::Drained { connection }, self.now);
            }
            if ended {
                self.close(client, CloseReason::Protocol);
            } else if !resent.is_empty() {
                self.packets(client, resent);
                resending = true;
            }
        }
        // What the state answered them is read at once, as it would be.
        if resending {
            self.deliver();
        }
    }

    fn expired_holds(&self) -> u64 {
        self.state
            .metrics
            .dropped_count(crate::broker::metrics::DropReason::ExactlyOnceExpired)
    }

    /// The exchanges of a session that ended with its connection are over
    /// unanswered, but for a bridge's in channels, which outlive it.
    fn forget_ended_exchanges(&mut self, client: usize) {
        if self.state.sessions.of_client(&client_id(client)).is_none() {
            let peer = &mut self.peers[client];
            let bridge = client == BRIDGE;
            peer.published
                .retain(|_, topic| bridge && in_a_channel(topic));
            let published = &peer.published;
            peer.counted
                .retain(|exchange| published.contains_key(exchange));
        }
    }

    fn close(&mut self, client: usize, reason: CloseReason) {
        let peer = &mut self.peers[client];
        let Some((connection, _)) = peer.connection.take() else {
            return;
        };
        peer.unanswered.clear();
        peer.answered_unread.clear();
        peer.owed.clear();
        peer.to_release.clear();
        peer.to_complete.clear();
        self.state.handle(
            Event::Closed {
                connection,
                reason,
                disconnect_reason: None,
            },
            self.now,
        );
        self.forget_ended_exchanges(client);
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Connect {
                client,
                v5,
                clean,
                receive_maximum,
                will,
            } => {
                // A new connection for a client id takes over the old one,
                // whose socket the broker then closes.
                let connection = self.next_connection;
                self.next_connection += 1;
                let (handle, outlet) = crate::broker::link::link();
                let old = self.peers[client].connection.replace((connection, outlet));
                let peer = &mut self.peers[client];
                peer.unanswered.clear();
                peer.answered_unread.clear();
                peer.owed.clear();
                peer.to_release.clear();
                peer.to_complete.clear();
                // A QoS 1 publish is answered on its connection or not at
                // all; a QoS 2 exchange is its session's.
                peer.published.retain(|&(_, qos), _| qos == 2);
                peer.before_connect = peer.published.keys().copied().collect();
                let bridge = client == BRIDGE;
                let v5 = v5 || bridge;
                let clean = clean || bridge;
                let will = will.filter(|_| !bridge);
                let inflight = usize::from(self.limits.max_inflight_messages);
                peer.window = match (bridge, v5) {
                    (true, _) => usize::from(receive_maximum),
                    (false, true) => usize::from(receive_maximum).min(inflight),
                    (false, false) => inflight,
                };
                peer.v5 = v5;
                let will = will.map(|delay| WillRequest {
                    topic: ByteStr::from(TOPICS[client % TOPICS.len()]),
                    payload: Bytes::from_static(b"gone"),
                    qos: 1,
                    retain: false,
                    properties: MessageProperties::default(),
                    delay: if v5 { delay } else { 0 },
                });
                let request = ConnectRequest {
                    v5,
                    client_id: client_id(client).into(),
                    clean_start: clean,
                    keep_alive: 60,
                    principal: bridge.then(|| client_id(client).into()),
                    will,
                    session_expiry: if clean && v5 { 0 } else { 300 },
                    receive_maximum,
                    maximum_packet_size: None,
                    request_response_information: false,
                    authentication: None,
                    bridge: bridge.then(|| "edge".into()),
                };
                self.state.handle(
                    Event::Connect {
                        connection,
                        request: Box::new(request),
                        handle,
                    },
                    self.now,
                );
                if let Some((old, _)) = old {
                    self.state.handle(
                        Event::Closed {
                            connection: old,
                            reason: CloseReason::TakenOver,
                            disconnect_reason: None,
                        },
                        self.now,
                    );
                }
                if bridge {
                    // Its link consumes the append channel from its
                    // earliest record (or its kept place) and the latest
                    // channel from its current values.
                    let consume =
                        |packet_id, filter: &str, from: Option<&str>| Inbound::Subscribe {
                            packet_id,
                            subscription_id: None,
                            user_properties: from
                                .map(|f| vec![(FROM_PROPERTY.to_owned(), f.to_owned())])
                                .unwrap_or_default(),
                            filters: vec![(
                                filter.into(),
                                SubOptions {
                                    qos: 1,
                                    no_local: false,
                                    retain_as_published: true,
                                    retain_handling: 0,
                                    subscription_id: None,
                                },
                            )],
                        };
                    self.packets(
                        client,
                        vec![
                            consume(1, "telemetry/#", Some("earliest")),
                            consume(2, "devices/#", None),
                        ],
                    );
                }
            }
            Op::Publish {
                client,
                topic,
                qos,
                retain,
                packet_id,
                empty,
                expiry,
                times,
            } => {
                let payload = match empty {
                    true => Bytes::new(),
                    false => Bytes::from_static(b"a payload of some bytes"),
                };
                let properties = match (self.peers[client].v5, expiry) {
                    (true, Some(seconds)) => {
                        MessageProperties::from(crate::broker::codec::PublishProperties {
                            message_expiry_interval: Some(seconds),
                            ..Default::default()
                        })
                    }
                    _ => MessageProperties::default(),
                };
                // A packet id in an exchange not yet over is not used again
                // (MQTT's rule for a client): such a publish is not sent.
                let peer = &mut self.peers[client];
                let free: Vec<u16> = (0..times)
                    .map(|i| if qos == 0 { 0 } else { packet_id + i })
                    .filter(|&id| id == 0 || !peer.published.keys().any(|(p, _)| *p == id))
                    .collect();
                if qos > 0 && peer.connection.is_some() {
                    for &id in &free {
                        peer.published.insert((id, qos), TOPICS[topic]);
                    }
                }
                let publishes = free
                    .into_iter()
                    .map(|id| {
                        Inbound::Publish(InboundPublish {
                            packet_id: id,
                            qos,
                            retain,
                            dup: false,
                            topic: ByteStr::from(TOPICS[topic]),
                            payload: payload.clone(),
                            properties: properties.clone(),
                        })
                    })
                    .collect();
                self.packets(client, publishes);
            }
            Op::Answer {
                client,
                kind,
                packet_id,
            } => {
                let answer = match kind {
                    0 => Inbound::PubAck {
                        packet_id,
                        reason: ReasonCode::Success,
                    },
                    1 => Inbound::PubRec {
                        packet_id,
                        reason: ReasonCode::Success,
                    },
                    2 => Inbound::PubRel { packet_id },
                    _ => Inbound::PubComp { packet_id },
                };
                // Whatever it answers may free its window: counted as
                // freed, so the check never asks more than the broker owes.
                let peer = &mut self.peers[client];
                if matches!(kind, 0 | 3) && peer.unanswered.remove(&packet_id).is_none() {
                    peer.answered_unread.insert(packet_id);
                }
                match (kind, peer.owed.get(&packet_id)) {
                    (0, Some(1)) | (1, Some(2)) => {
                        peer.owed.remove(&packet_id);
                    }
                    (3, _) => peer.to_complete.retain(|id| *id != packet_id),
                    _ => {}
                }
                self.packets(client, vec![answer]);
            }
            Op::AnswerAll { client } => {
                let peer = &mut self.peers[client];
                let mut answers = Vec::new();
                for (&packet_id, &qos) in &peer.owed {
                    answers.push(match qos {
                        1 => Inbound::PubAck {
                            packet_id,
                            reason: ReasonCode::Success,
                        },
                        _ => Inbound::PubRec {
                            packet_id,
                            reason: ReasonCode::Success,
                        },
                    });
                }
                peer.unanswered.retain(|_, qos| *qos == 2);
                peer.owed.clear();
                for packet_id in peer.to_release.drain(..) {
                    answers.push(Inbound::PubRel { packet_id });
                }
                for packet_id in peer.to_complete.drain(..) {
                    peer.unanswered.remove(&packet_id);
                    answers.push(Inbound::PubComp { packet_id });
                }
                if !answers.is_empty() {
                    self.packets(client, answers);
                }
            }
            Op::Subscribe {
                client,
                filter,
                qos,
                from,
                options: (no_local, retain_as_published, retain_handling, subscription_id),
            } => {
                let user_properties = from
                    .map(|f| vec![(FROM_PROPERTY.to_owned(), FROM[f].to_owned())])
                    .unwrap_or_default();
                let options = match self.peers[client].v5 {
                    true => SubOptions {
                        qos,
                        no_local,
                        retain_as_published,
                        retain_handling,
                        subscription_id,
                    },
                    false => sub_options(qos),
                };
                self.packets(
                    client,
                    vec![Inbound::Subscribe {
                        packet_id: 9,
                        subscription_id: options.subscription_id,
                        user_properties,
                        filters: vec![(FILTERS[filter].into(), options)],
                    }],
                );
            }
            Op::Unsubscribe { client, filter } => self.packets(
                client,
                vec![Inbound::Unsubscribe {
                    packet_id: 10,
                    filters: vec![FILTERS[filter].into()],
                }],
            ),
            Op::Ping { client } => self.packets(client, vec![Inbound::PingReq]),
            Op::Disconnect { client, expiry } => {
                self.packets(
                    client,
                    vec![Inbound::Disconnect {
                        reason: ReasonCode::Success,
                        session_expiry: expiry,
                    }],
                );
                self.close(client, CloseReason::ClientDisconnect);
            }
            Op::Lost { client } => self.close(client, CloseReason::Network),
            Op::Settle => self.settle(),
            Op::SettleTogether => self.settle_as(true),
            Op::Lag => {
                self.state.take_intents(&mut self.intents);
                let slow = self.intents.first().map(|i| i.role);
                let (waiting, answered): (Vec<_>, Vec<_>) = std::mem::take(&mut self.intents)
                    .into_iter()
                    .partition(|i| Some(i.role) == slow);
                self.intents = waiting;
                for intent in answered {
                    self.commit(intent);
                }
            }
            Op::SettleSome(most) => {
                self.answer(most, false);
            }
            Op::Restart => self.restart(),
            Op::Stall { client } => {
                let peer = &mut self.peers[client];
                peer.stalled = !peer.stalled;
            }
            Op::Trim { keep } => {
                let ChannelStore::Append(telemetry) = &self.life.stores[0] else {
                    unreachable!("the first channel is an append channel")
                };
                // A sweep the disk fails removes nothing, and retention
                // tries again at its next.
                let removed = telemetry.trim(0, Some(keep)).map_or(0, |r| r.records);
                if removed > 0 {
                    self.state.handle(
                        Event::FloorRaised {
                            channel: telemetry.name().into(),
                            floor: telemetry.floor(),
                        },
                        self.now,
                    );
                }
            }
            Op::Tick { seconds } => {
                self.now += Duration::from_secs(u64::from(seconds));
                self.state.tick(self.now);
                self.state.flush(self.now);
            }
        }
        self.deliver();
        self.check_gauges();
    }

    /// What `/metrics` says of connections, sessions and subscriptions is
    /// what the state holds, and every publish into the append channel
    /// acknowledged as stored is in it or held for its release (retention
    /// removes records, but not the offsets they took).
    fn check_gauges(&self) {
        let ChannelStore::Append(telemetry) = &self.life.stores[0] else {
            unreachable!("the first channel is an append channel")
        };
        let held = self
            .life
            .unplanned(|| self.life.provider.held_publishes().and_then(|h| h.held()))
            .expect("holds")
            .iter()
            .filter(|h| h.channel == telemetry.name())
            .count() as u64;
        // A hold its client never released expires, counted (of any
        // topic: the check is looser by those of other topics).
        let expired = self.expired_before + self.expired_holds();
        assert!(
            telemetry.next() - 1 + held + expired >= self.acknowledged,
            "{} publishes acknowledged, {} stored, {held} held and {expired} expired",
            self.acknowledged,
            telemetry.next() - 1
        );
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = &self.state.metrics;
        assert_eq!(
            metrics.connections.load(Relaxed),
            self.state.connection_count() as i64,
            "connections"
        );
        assert_eq!(
            metrics.sessions.load(Relaxed),
            self.state.session_count() as i64,
            "sessions"
        );
        let subscriptions: usize = self
            .state
            .sessions
            .by_key
            .values()
            .map(|s| s.subscriptions.len())
            .sum();
        assert_eq!(
            metrics.subscriptions.load(Relaxed),
            subscriptions as i64,
            "subscriptions"
        );
    }

    /// Half the runs begin with every client connected, so that more of
    /// what they then do reaches somebody.
    fn connect_everyone(&mut self) {
        for client in 0..CLIENTS {
            self.apply(connect(client, client % 2 == 0, 3));
        }
    }

    /// Every client answers everything and the writes settle, until
    /// nothing more happens; then the broker stops.
    fn finish(&mut self) {
        for peer in &mut self.peers {
            peer.stalled = false;
        }
        for _ in 0..20 {
            self.settle();
            for client in 0..CLIENTS {
                self.apply(Op::AnswerAll { client });
            }
        }
        // Clients that answer everything are owed nothing more: no message
        // waits in a connected session, or in its connection's backlog.
        for (client, peer) in self.peers.iter().enumerate() {
            let Some((connection, _)) = &peer.connection else {
                continue;
            };
            let Some(conn) = self.state.connections.get(connection) else {
                continue;
            };
            let session = &self.state.sessions.by_key[&conn.session];
            assert!(
                session.pending.is_empty() && session.inflight.is_empty(),
                "client {client}: {} messages still queued and {} in flight",
                session.pending.len(),
                session.inflight.len()
            );
            assert!(
                conn.retained_backlog.is_empty(),
                "client {client}: retained messages still owed"
            );
            // And every publish it sent was answered to its end.
            assert!(
                peer.published.is_empty(),
                "client {client}: publishes never answered to their end: {:?}",
                peer.published
            );
        }
        self.state.shutdown(self.now);
        self.settle();
    }
}

/// How many runs a search makes: `PROPTEST_CASES` (a longer search, run
/// by hand), or `default`. A failing run is shrunk to the few steps that
/// matter.
fn searched(default: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(default),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Runs `ops` on `run`, every client connected first when `connected`,
/// then lets every client answer everything.
fn drive(mut run: Run, connected: bool, ops: Vec<Op>) {
    if connected {
        run.connect_everyone();
    }
    for op in ops {
        run.apply(op);
    }
    run.finish();
}

proptest! {
    #![proptest_config(searched(128))]

    #[test]
    fn any_run_of_clients_keeps_each_window_and_never_reuses_an_unanswered_id(
        connected in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        drive(Run::new(), connected, ops);
    }
}

proptest! {
    // A sqlite file is opened at each start: fewer runs than on memory.
    #![proptest_config(searched(32))]

    #[test]
    fn any_run_on_a_sqlite_file_whose_disk_fails_acknowledges_only_what_it_stores(
        faults in backing::faults(),
        connected in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        drive(Run::on(Backing::sqlite(faults)), connected, ops);
    }
}

/// `future`'s outcome, waited for a bounded time.
fn wait<T>(runtime: &tokio::runtime::Runtime, future: impl Future<Output = T>) -> T {
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(60), future).await })
        .expect("a persister answers within a minute")
}

/// Runs `ops`, then lets every client answer everything.
fn run(ops: Vec<Op>) {
    drive(Run::new(), false, ops);
}

fn connect(client: usize, v5: bool, receive_maximum: u16) -> Op {
    Op::Connect {
        client,
        v5,
        clean: false,
        receive_maximum,
        will: None,
    }
}

fn publish(client: usize, topic: usize, qos: u8) -> Op {
    publish_as(client, topic, qos, 1)
}

fn publish_as(client: usize, topic: usize, qos: u8, packet_id: u16) -> Op {
    Op::Publish {
        client,
        topic,
        qos,
        retain: false,
        packet_id,
        empty: false,
        expiry: None,
        times: 1,
    }
}

fn subscribe(client: usize, filter: usize, qos: u8) -> Op {
    Op::Subscribe {
        client,
        filter,
        qos,
        from: None,
        options: (false, false, 0, None),
    }
}

/// A job leased for a worker takes its place in the worker's window while
/// the lease is written: a channel record due meanwhile waits.
#[test]
fn a_worker_with_a_window_of_one_is_sent_one_delivery_across_a_queue_and_a_channel() {
    run(vec![
        connect(2, false, 1),
        publish(2, 2, 1),
        publish(2, 6, 0),
        connect(1, true, 1),
        subscribe(1, 5, 1),
        subscribe(1, 3, 1),
    ]);
}

/// A latest channel's changes wait for the current values and retained
/// messages still owed on the connection, without reading the channel
/// again and again meanwhile, and follow once they are answered.
#[test]
fn a_latest_consumer_waiting_for_what_it_is_owed_reads_nothing_meanwhile() {
    run(vec![
        connect(0, true, 1),
        subscribe(0, 4, 0),
        Op::Publish {
            client: 0,
            topic: 0,
            qos: 2,
            retain: true,
            packet_id: 3,
            empty: false,
            expiry: None,
            times: 1,
        },
        publish(0, 4, 0),
        subscribe(0, 0, 1),
        subscribe(0, 0, 1),
        Op::Settle,
    ]);
}

/// A session resumed by a client that gives a smaller Receive Maximum than
/// before is resent what that window takes, then the rest, each as the one
/// before is answered, before anything new.
#[test]
fn a_session_resumed_under_a_smaller_receive_maximum_is_resent_what_its_window_takes() {
    let mut run = Run::new();
    for op in [
        connect(0, true, 3),
        subscribe(0, 0, 1),
        connect(1, false, 3),
        Op::Publish {
            client: 1,
            topic: 0,
            qos: 1,
            retain: false,
            packet_id: 1,
            empty: false,
            expiry: None,
            times: 3,
        },
        Op::Settle,
    ] {
        run.apply(op);
    }
    let first: Vec<u16> = run.peers[0].received.iter().map(|(id, _)| *id).collect();
    assert_eq!(first.len(), 3, "{first:?}");
    run.apply(connect(0, true, 1));
    run.apply(Op::Settle);
    let resent = |run: &Run| -> Vec<u16> {
        run.peers[0].received[3..]
            .iter()
            .map(|&(id, dup)| {
                assert!(dup, "a resent delivery is marked DUP");
                id
            })
            .collect()
    };
    assert_eq!(resent(&run), first[..1]);
    run.apply(Op::AnswerAll { client: 0 });
    run.apply(Op::Settle);
    assert_eq!(resent(&run), first[..2]);
    run.apply(Op::AnswerAll { client: 0 });
    run.apply(Op::Settle);
    assert_eq!(resent(&run), first);
    run.finish();
}

/// A job whose Message Expiry Interval ran out before its worker was sent
/// it is resolved and counted, not left holding the worker's window.
#[test]
fn an_expired_job_does_not_hold_its_workers_window() {
    let mut run = Run::new();
    for op in [
        connect(0, true, 1),
        Op::Publish {
            client: 0,
            topic: 6,
            qos: 0,
            retain: false,
            packet_id: 1,
            empty: false,
            expiry: Some(0),
            times: 1,
        },
        connect(2, false, 1),
        subscribe(2, 8, 1),
        publish(0, 6, 1),
        Op::Settle,
    ] {
        run.apply(op);
    }
    let expired = run
        .state
        .metrics
        .dropped_count(crate::broker::metrics::DropReason::Expired);
    assert_eq!(expired, 1);
    // The job after it reaches the worker.
    assert_eq!(run.peers[2].received.len(), 1);
    run.finish();
}

/// A QoS 2 publish into a channel its publisher never released ends with
/// its session, whether the session ends with its connection or with the
/// process, and is counted as one whose hold expired.
#[test]
fn an_unreleased_publish_is_counted_when_its_session_ends() {
    let held = |run: &mut Run| {
        run.apply(Op::Connect {
            client: 0,
            v5: false,
            clean: true,
            receive_maximum: 1,
            will: None,
        });
        run.apply(Op::Publish {
            client: 0,
            topic: 2,
            qos: 2,
            retain: false,
            packet_id: 1,
            empty: false,
            expiry: None,
            times: 1,
        });
        run.apply(Op::Settle);
        assert_eq!(run.peers[0].to_release, [1], "held and answered PUBREC");
    };
    let mut run = Run::new();
    held(&mut run);
    run.apply(Op::Lost { client: 0 });
    run.apply(Op::Settle);
    assert_eq!(run.expired_holds(), 1);
    held(&mut run);
    run.apply(Op::Restart);
    assert_eq!(run.expired_holds(), 1, "counted by the state started again");
    run.finish();
}

/// A client that comes back while the hold of its QoS 2 publish into a
/// channel is still being written, and sends the publish again, is not
/// answered PUBREC before the hold is stored: a PUBREC says it is.
#[test]
fn a_publish_sent_again_while_its_hold_is_written_is_answered_once_it_is_stored() {
    let mut run = Run::new();
    for op in [
        connect(0, true, 3),
        Op::Settle,
        publish_as(0, 2, 2, 1),
        connect(0, true, 3),
        Op::Lag,
    ] {
        run.apply(op);
    }
    run.finish();
}

/// A bridge that connects again while the hold of its QoS 2 publish into
/// a channel is being written is answered PUBREC for it only once it is
/// stored; the disk fails that write, and nothing is answered.
#[test]
fn a_bridge_back_while_its_hold_is_written_is_answered_as_the_write_is() {
    let fault = backing::Fault {
        role: crate::storage::sqlite::vfs::FileRole::Wal,
        op: crate::storage::sqlite::vfs::Op::Write,
        nth: 6,
        and_after: false,
        errno: libc::EIO,
    };
    let mut run = Run::on(Backing::sqlite(vec![fault]));
    for op in [
        connect(BRIDGE, true, 1),
        Op::Settle,
        publish_as(BRIDGE, 2, 2, 1),
        connect(BRIDGE, true, 1),
    ] {
        run.apply(op);
    }
    run.finish();
    assert_eq!(run.acknowledged, 0, "the hold was never stored");
}

/// A bridge that connects again while the hold of its QoS 2 publish into
/// a channel is being written, and sends it again, is answered PUBREC once
/// the hold is stored, though the answer to its broadcast publish before
/// it came first.
#[test]
fn a_bridge_back_while_its_hold_is_written_is_answered_once_it_is_stored() {
    let mut run = Run::new();
    run.connect_everyone();
    for op in [
        publish(BRIDGE, 0, 2),
        publish_as(BRIDGE, 2, 2, 2),
        connect(BRIDGE, false, 1),
    ] {
        run.apply(op);
    }
    run.finish();
    assert_eq!(run.acknowledged, 1);
}

/// A client that stopped reading connects again and, before it reads
/// the deliveries resent at the CONNACK, answers one of them: the broker
/// takes the answer for the resent delivery and fills the window again.
#[test]
fn a_resent_delivery_answered_before_it_is_read_frees_its_place_in_the_window() {
    let mut publish_three = publish(0, 2, 1);
    if let Op::Publish { times, .. } = &mut publish_three {
        *times = 3;
    }
    drive(
        Run::new(),
        true,
        vec![
            subscribe(1, 3, 1),
            publish_three,
            Op::Settle,
            Op::Stall { client: 1 },
            connect(1, false, 1),
            Op::Settle,
            Op::Answer {
                client: 1,
                kind: 0,
                packet_id: 1,
            },
            publish(0, 2, 1),
        ],
    );
}
