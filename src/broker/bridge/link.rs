//! One bridge at work: its local connection and its remote one, joined.
//!
//! **Out.** The local connection consumes each `out` channel; every
//! delivery the state hands it is sent to the remote under the rule's
//! prefix, and the delivery is acknowledged to the state only when the
//! remote acknowledged the send (reason < 0x80), so the state's position -
//! the lowest delivery not acknowledged - passes a record only once it and
//! everything before it reached the remote. Deliveries wait here for the
//! remote's window; what is here is bounded by the local Receive Maximum,
//! since the state sends no more than that unacknowledged.
//!
//! **The reservoir.** The local Receive Maximum is the remote's window and
//! [`RESERVOIR`] more: when the remote acknowledges a send, the next one
//! goes at once from what waits here, while the acknowledgement makes its
//! way through the state's queue and the state refills what was taken.
//! With the local window only as large as the remote's, every send waited
//! for that turn through the state, whose queue it shares with every
//! publisher: the bridge's rate was its window over that turn, not over
//! the remote's round trip.
//!
//! **Acknowledgements to the state** go in batches of [`ACK_BATCH`] while
//! the reservoir is at least half full, at once when it runs lower, and
//! every tick whatever their number. A consumer behind reads the channel
//! in windows of the room its acknowledgements made, so one acknowledged
//! at a time cost a read per record (a transaction on sqlite); a batch
//! makes one read of the batch. The position lags by the batch, never
//! leads: an acknowledgement held here is of a record the remote has.
//!
//! **Remote down.** The local connection stays: nothing is acknowledged,
//! the state's window fills and it stops sending, so what the bridge holds
//! stays bounded by the window while the channel is the backlog. The sends
//! in flight are sent again, DUP set, on the next connection. (Closing the
//! local side instead would bring the same records back from the stored
//! position, but would also throw away the inbound exchanges that still
//! wait for their commit.)
//!
//! **In.** A remote PUBLISH is published on the local connection under the
//! rule's mapping and the remote's packet id, and acknowledged to the
//! remote only after the state acknowledged the local publish: QoS 1 with
//! PUBACK once the record committed, QoS 2 with PUBREC once its hold
//! committed, the remote's PUBREL passed on, and PUBCOMP once the record
//! was written from the hold. A hold outlives the bridge's connection and
//! a restart; the state names each one again (a PUBREC) when the bridge
//! connects, and the remote's PUBREL, which carries the same packet id,
//! releases it. A refusal (0x97, a full channel) is not passed on: the
//! remote keeps the message and it is published here again after the
//! reconnect backoff's base.
//!
//! **A remote that forgot its session** (CONNACK without Session Present)
//! sends no PUBREL and expects no answer for what it sent before: the
//! holds of those exchanges are released here, and what still waits for a
//! commit is finished without answering it. A new PUBLISH under the packet
//! id of such an exchange waits until it is finished.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::num::NonZeroU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::local::{Consume, Local, LocalGone};
use super::remote::{Backoff, ConnectFailure, Remote};
use super::{LocalSlot, Shared, CHANNEL_PROPERTY};
use crate::broker::codec::{
    Packet, PubAck, Publish, PublishProperties, QoS, ReasonCode, RetainHandling, Subscribe,
    SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use crate::broker::message::DecimalBuf;
use crate::broker::metrics::BridgeMetrics;
use crate::broker::state::{Inbound, InboundPublish, Outbound, GAP_PROPERTY, OFFSET_PROPERTY};
use crate::broker::views::ChannelView;
use crate::config::bridge::{Bridge, BridgeProtocol, RetainMode};

/// How often timers (keep alive, ack timeout, retries, lag) are looked at.
const TICK: Duration = Duration::from_millis(100);
/// How often the lag gauges are computed.
const LAG_EVERY: Duration = Duration::from_secs(1);
/// Time for a look whether the primary address accepts TCP again.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Wait before the local connection is made again after the broker closed it.
const LOCAL_RETRY: Duration = Duration::from_secs(1);
/// Deliveries the state may hand the bridge beyond the remote's window, so
/// the remote's window is refilled without waiting for the state (memory:
/// this many records more held here, each one the state holds anyway as
/// sent and not acknowledged).
pub(super) const RESERVOIR: usize = 256;
/// Acknowledgements to the state held back until this many (see above).
const ACK_BATCH: usize = RESERVOIR / 4;
/// Pauses shorter than this are not taken: they would cost more than the
/// wake-ups they save.
const MIN_PAUSE: Duration = Duration::from_micros(20);
/// The longest pause with the remote's window full.
const MAX_PAUSE: Duration = Duration::from_micros(200);

/// A delivery of the state on its way to the remote.
struct OutSend {
    /// The state's packet id (0 for QoS 0).
    local_id: u16,
    /// Index of the `out` rule.
    rule: usize,
    offset: Option<u64>,
    publish: Publish,
    /// When the state accepted the record (for the lag in seconds).
    received_at: Instant,
    sent_at: Option<Instant>,
}

/// A remote PUBLISH on its way into a channel, under the remote's packet
/// id (the local exchange uses the same one).
struct InEntry {
    /// The QoS the remote sent it at (1 or 2): what the remote is owed.
    remote_qos: u8,
    /// What is published locally; `None` for a hold the state named on
    /// connect, of which only the release is left.
    publish: Option<InboundPublish>,
    stage: InStage,
    /// The remote came back without its session: nothing of this
    /// exchange is answered there.
    orphan: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InStage {
    /// Published locally, the state's acknowledgement awaited.
    Local,
    /// The record committed at QoS 1: the remote is owed PUBACK (when the
    /// link was down).
    Stored,
    /// Held (QoS 2): the remote is owed PUBREC and releases it with PUBREL.
    Held,
    /// PUBREL passed to the state, its PUBCOMP awaited.
    Releasing,
    /// Refused locally; published again at this time.
    Refused(Instant),
}

pub(super) struct Link {
    bridge: Arc<Bridge>,
    shared: Arc<Shared>,
    metrics: Arc<BridgeMetrics>,
    stop: watch::Receiver<bool>,
    local: Option<Local>,
    /// Where the local connection's number is left for the bridge's
    /// supervisor, which closes it should this link fail.
    local_slot: Arc<LocalSlot>,
    local_retry_at: Instant,
    remote: Option<Remote>,
    reconnect_at: Instant,
    backoff: Backoff,
    /// Where the next connection attempt starts in `addresses`.
    next_address: usize,
    /// The address the remote connection was made to, once there was one.
    connected_to: usize,
    connected_before: bool,
    /// Connected to a secondary address without `round_robin`: whether the
    /// primary accepts TCP again, looked at every `reconnect.cap`.
    primary_probe: Option<tokio::task::JoinHandle<bool>>,
    next_probe: Instant,
    /// The remote's window: `max_inflight` capped by its Receive Maximum.
    window: usize,
    /// The time from a send to its PUBACK, averaged (zero until measured).
    round_trip: Duration,
    /// Runs on a thread of its own: it may pause that thread.
    own_thread: bool,
    // Out.
    seq: u64,
    pending: VecDeque<(u64, OutSend)>,
    inflight: BTreeMap<u64, OutSend>,
    by_remote_id: HashMap<u16, u64>,
    next_remote_id: u16,
    blocked: VecDeque<(Instant, OutSend)>,
    /// Deliveries too large for the remote, to acknowledge to the state.
    skipped_sends: Vec<OutSend>,
    /// Per `out` rule: the offset after the last one acknowledged.
    acked_next: Vec<Option<u64>>,
    /// Per `out` rule: its channel is a latest channel.
    latest: Vec<bool>,
    /// Packets for the state, sent as one event at the end of the turn.
    to_local: Vec<Inbound>,
    /// Acknowledgements of deliveries the remote has (or that were
    /// skipped), for the state: held back for a batch.
    acks: Vec<u16>,
    // In.
    inbound: HashMap<u16, InEntry>,
    /// Remote publishes whose packet id a forgotten exchange still uses,
    /// each marked when the remote forgot it too.
    deferred: VecDeque<(Publish, bool)>,
    /// The remote's session was made anew on the latest connection: a
    /// hold the state names from before belongs to no exchange there.
    remote_fresh: bool,
    last_sent: Instant,
    last_received: Instant,
    next_lag: Instant,
}

impl Link {
    pub fn new(
        bridge: Arc<Bridge>,
        shared: Arc<Shared>,
        stop: watch::Receiver<bool>,
        stored: Vec<Option<u64>>,
        local_slot: Arc<LocalSlot>,
    ) -> Link {
        let metrics = shared.metrics.bridge(&bridge.name);
        let latest = bridge
            .out
            .iter()
            .map(|r| {
                shared
                    .channels
                    .get(&r.channel)
                    .is_some_and(|c| c.kind() == saguin_format::model::ChannelKind::Latest)
            })
            .collect();
        let now = Instant::now();
        Link {
            backoff: reconnect_backoff(&bridge),
            window: usize::from(bridge.max_inflight),
            round_trip: Duration::ZERO,
            own_thread: false,
            bridge,
            shared,
            metrics,
            stop,
            local: None,
            local_slot,
            local_retry_at: now,
            remote: None,
            reconnect_at: now,
            next_address: 0,
            connected_to: 0,
            connected_before: false,
            primary_probe: None,
            next_probe: now,
            seq: 0,
            pending: VecDeque::new(),
            inflight: BTreeMap::new(),
            by_remote_id: HashMap::new(),
            next_remote_id: 1,
            blocked: VecDeque::new(),
            skipped_sends: Vec::new(),
            acked_next: stored,
            latest,
            to_local: Vec::new(),
            acks: Vec::new(),
            inbound: HashMap::new(),
            deferred: VecDeque::new(),
            remote_fresh: false,
            last_sent: now,
            last_received: now,
            next_lag: now,
        }
    }

    /// Whether this link runs on a thread nothing else runs on.
    pub fn own_thread(mut self, own: bool) -> Link {
        self.own_thread = own;
        self
    }

    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if *self.stop.borrow() {
                break;
            }
            // A paused local side (the state's answers pile up) stops the
            // remote being read; the tick looks again.
            let paused = self.local.as_ref().is_some_and(|l| l.paused());
            let mut remote_turn = false;
            tokio::select! {
                biased;
                _ = self.stop.changed() => break,
                answers = recv_local(&mut self.local) => match answers {
                    Ok(answers) => {
                        for answer in answers {
                            self.on_local(answer).await;
                        }
                    }
                    Err(gone) => self.local_lost(gone).await,
                },
                packet = recv_remote(&mut self.remote), if !paused && self.local.is_some() => match packet {
                    Ok(packet) => {
                        remote_turn = true;
                        self.last_received = Instant::now();
                        self.on_remote(packet).await;
                        // Whatever else already arrived, in the same turn:
                        // its acknowledgements reach the state as one event.
                        while let Some(next) = self.remote.as_mut().and_then(Remote::decoded) {
                            match next {
                                Ok(packet) => self.on_remote(packet).await,
                                Err(why) => {
                                    self.remote_lost(&why);
                                    break;
                                }
                            }
                        }
                    }
                    Err(why) => self.remote_lost(&why),
                },
                _ = tick.tick() => self.on_tick().await,
            }
            self.flush().await;
            if remote_turn {
                self.pause_for_acks();
            }
        }
        // The acknowledgements of this last turn move the position too:
        // the state first, so a remote that stopped reading cannot keep
        // them from the position stored at shutdown.
        self.release_acks();
        self.flush_local().await;
        self.flush_remote().await;
        self.metrics.connected.store(0, Relaxed);
        if let Some(remote) = self.remote.take() {
            remote.close().await;
        }
        if let Some(local) = self.local.take() {
            local.close().await;
        }
    }

    // ---- connections ----

    async fn on_tick(&mut self) {
        let now = Instant::now();
        self.release_acks();
        if self.remote.is_none() && now >= self.reconnect_at {
            self.connect_remote().await;
        }
        if self.local.is_none() && self.remote.is_some() && now >= self.local_retry_at {
            self.connect_local().await;
        }
        self.check_remote(now);
        self.probe_primary(now).await;
        self.retry_blocked(now);
        self.retry_inbound(now).await;
        self.pump();
        self.ack_skipped().await;
        if now >= self.next_lag {
            self.next_lag = now + LAG_EVERY;
            self.publish_lag(now);
        }
    }

    async fn connect_remote(&mut self) {
        let addresses = &self.bridge.addresses;
        let start = if self.bridge.round_robin {
            self.next_address
        } else {
            0
        };
        for k in 0..addresses.len() {
            let i = (start + k) % addresses.len();
            let address = addresses[i].clone();
            let mut stop = self.stop.clone();
            let attempt = tokio::select! {
                _ = stop.changed() => return,
                attempt = Remote::connect(&self.bridge, &address) => attempt,
            };
            match attempt {
                Ok(remote) => {
                    // Another broker than the last one (not one cluster)
                    // knows nothing of the exchanges the last one had.
                    let moved = self.connected_before && i != self.connected_to;
                    self.connected_before = true;
                    self.next_address = i + 1;
                    self.connected_to = i;
                    self.next_probe = Instant::now() + self.bridge.reconnect.cap;
                    if let Some(refusal) = self.refusal(&remote) {
                        self.metrics.connect_attempt("refused");
                        self.metrics.refused("maximum_qos");
                        tracing::error!(bridge = %self.bridge.name, address = %address, reason = %refusal, "bridge refused the remote");
                        remote.close().await;
                        continue;
                    }
                    self.metrics.connect_attempt("ok");
                    self.connected(remote, moved);
                    return;
                }
                Err(ConnectFailure::Refused(code)) => {
                    self.metrics.connect_attempt("refused");
                    self.metrics
                        .refused(&format!("connack_0x{:02X}", code.as_u8()));
                    tracing::warn!(bridge = %self.bridge.name, address = %address, reason = %format!("0x{:02X}", code.as_u8()), "bridge connection refused by the remote");
                }
                Err(ConnectFailure::Failed(why)) => {
                    self.metrics.connect_attempt("failed");
                    tracing::warn!(bridge = %self.bridge.name, address = %address, error = %why, "bridge cannot reach the remote");
                }
            }
        }
        let delay = self.backoff.next_delay();
        self.reconnect_at = Instant::now() + delay;
        tracing::debug!(bridge = %self.bridge.name, retry_ms = delay.as_millis() as u64, "bridge reconnects later");
    }

    /// Without `round_robin` the first address is the primary: connected
    /// to another, the bridge looks every `reconnect.cap` whether the
    /// primary accepts connections again, and once it does, leaves the
    /// secondary (DISCONNECT, its session kept there) to connect to it.
    async fn probe_primary(&mut self, now: Instant) {
        let on_secondary = self.remote.is_some()
            && !self.bridge.round_robin
            && self.bridge.addresses.len() > 1
            && self.connected_to != 0;
        if !on_secondary {
            if let Some(probe) = self.primary_probe.take() {
                probe.abort();
            }
            return;
        }
        match &self.primary_probe {
            None if now >= self.next_probe => {
                self.next_probe = now + self.bridge.reconnect.cap;
                let primary = self.bridge.addresses[0].clone();
                self.primary_probe = Some(tokio::spawn(async move {
                    let Some((host, port)) = crate::config::bridge::split_host_port(&primary)
                    else {
                        return false;
                    };
                    let connect = tokio::net::TcpStream::connect((host, port));
                    matches!(
                        tokio::time::timeout(PROBE_TIMEOUT, connect).await,
                        Ok(Ok(_))
                    )
                }));
            }
            Some(probe) if probe.is_finished() => {
                let up = match self.primary_probe.take() {
                    Some(probe) => probe.await.unwrap_or(false),
                    None => false,
                };
                if up {
                    tracing::info!(bridge = %self.bridge.name, address = %self.bridge.addresses[0],
                        "bridge's primary address is reachable again; it leaves the secondary for it");
                    if let Some(remote) = self.remote.take() {
                        // What is in flight there goes to the primary.
                        self.metrics.connected.store(0, Relaxed);
                        remote.close().await;
                    }
                    self.reconnect_at = now;
                }
            }
            _ => {}
        }
    }

    /// No silent downgrade: a remote whose Maximum QoS is below a rule's.
    fn refusal(&self, remote: &Remote) -> Option<String> {
        let max = remote.granted.maximum_qos;
        let out = self
            .bridge
            .out
            .iter()
            .enumerate()
            .find(|(_, r)| r.qos > max);
        let inbound = self
            .bridge
            .inbound
            .iter()
            .enumerate()
            .find(|(_, r)| r.qos > max);
        match (out, inbound) {
            (Some((j, r)), _) => Some(format!(
                "its Maximum QoS is {max}, below qos {} of out[{j}] ({})",
                r.qos, r.channel
            )),
            (None, Some((j, r))) => Some(format!(
                "its Maximum QoS is {max}, below qos {} of in[{j}] ({})",
                r.qos, r.filter
            )),
            (None, None) => None,
        }
    }

    fn connected(&mut self, mut remote: Remote, moved: bool) {
        self.backoff.reset();
        let granted = remote.granted;
        self.window = usize::from(self.bridge.max_inflight.min(granted.receive_maximum)).max(1);
        self.round_trip = Duration::ZERO;
        tracing::info!(bridge = %self.bridge.name, address = %remote.address, protocol = %remote.version,
            session_present = granted.session_present, window = self.window, "bridge connected");
        self.metrics.connected.store(1, Relaxed);
        self.remote_fresh = !granted.session_present || moved;
        if !self.remote_fresh {
            // The remote sends again what it was not answered.
            self.deferred.retain(|(_, orphan)| *orphan);
        } else {
            self.remote_forgot();
        }
        if !self.bridge.inbound.is_empty() {
            let filters = self
                .bridge
                .inbound
                .iter()
                .map(|r| SubscribeFilter {
                    filter: r.filter.clone(),
                    options: SubscriptionOptions {
                        qos: QoS::from_u8(r.qos).unwrap_or(QoS::AtLeastOnce),
                        // Loops: nothing the bridge published comes back.
                        no_local: true,
                        retain_as_published: true,
                        retain_handling: RetainHandling::OnNewSubscribe,
                    },
                })
                .collect();
            remote.queue(&Packet::Subscribe(Subscribe {
                packet_id: 1,
                filters,
                properties: SubscribeProperties::default(),
            }));
        }
        // What was in flight goes again, in its order, DUP set.
        let inflight = std::mem::take(&mut self.inflight);
        for (seq, mut send) in inflight.into_iter().rev() {
            send.publish.dup = send.publish.qos != QoS::AtMostOnce;
            send.sent_at = None;
            self.pending.push_front((seq, send));
        }
        self.by_remote_id.clear();
        let now = Instant::now();
        self.last_sent = now;
        self.last_received = now;
        self.remote = Some(remote);
    }

    fn remote_lost(&mut self, why: &str) {
        if self.remote.take().is_none() {
            return;
        }
        self.metrics.connected.store(0, Relaxed);
        let delay = self.backoff.next_delay();
        self.reconnect_at = Instant::now() + delay;
        tracing::warn!(bridge = %self.bridge.name, error = %why, inflight = self.inflight.len(),
            retry_ms = delay.as_millis() as u64, "bridge lost the remote; the position holds");
    }

    async fn connect_local(&mut self) {
        let consume: Vec<Consume> = self
            .bridge
            .out
            .iter()
            .zip(self.latest.iter().zip(&self.acked_next))
            .map(|(r, (latest, position))| {
                let earliest = r.from == crate::config::bridge::StartFrom::Earliest;
                Consume {
                    channel: r.channel.clone(),
                    qos: r.qos,
                    earliest: earliest && !latest,
                    latest: latest.then_some(earliest && position.is_none()),
                }
            })
            .collect();
        let receive_maximum =
            u16::try_from(usize::from(self.bridge.max_inflight) + RESERVOIR).unwrap_or(u16::MAX);
        match Local::connect(
            &self.bridge.name,
            receive_maximum,
            &consume,
            self.shared.events.clone(),
            &self.shared.generation,
            self.shared.outbound_queue,
        )
        .await
        {
            Ok(local) => {
                self.local_slot.set(local.connection);
                self.local = Some(local);
                self.release_orphans();
            }
            Err(LocalGone::Stopped) => {}
            Err(LocalGone::Closed(why)) => {
                tracing::error!(bridge = %self.bridge.name, error = %why, "bridge cannot connect to the broker");
                self.local_retry_at = Instant::now() + LOCAL_RETRY;
            }
        }
    }

    async fn local_lost(&mut self, gone: LocalGone) {
        self.local = None;
        if *self.stop.borrow() {
            return;
        }
        if let LocalGone::Closed(why) = gone {
            tracing::warn!(bridge = %self.bridge.name, error = %why, "bridge's connection to the broker ended; it starts again from the stored position");
        }
        // Every exchange named the old connection's packet ids: the state
        // sends the records again from its position, and the remote sends
        // again what it was not answered once it is reconnected.
        self.to_local.clear();
        self.acks.clear();
        self.pending.clear();
        self.inflight.clear();
        self.by_remote_id.clear();
        self.blocked.clear();
        self.local_lost_inbound();
        self.metrics.inflight.store(0, Relaxed);
        if let Some(remote) = self.remote.take() {
            self.metrics.connected.store(0, Relaxed);
            remote.close().await;
        }
        self.local_retry_at = Instant::now() + LOCAL_RETRY;
        self.reconnect_at = Instant::now() + LOCAL_RETRY;
    }

    /// Keep alive both ways, and the oldest send's ack timeout.
    fn check_remote(&mut self, now: Instant) {
        let Some(remote) = self.remote.as_mut() else {
            return;
        };
        let keep_alive = remote
            .granted
            .keep_alive
            .map_or(self.bridge.keepalive, |s| Duration::from_secs(u64::from(s)));
        if !keep_alive.is_zero() {
            if now.duration_since(self.last_received) > keep_alive + keep_alive / 2 {
                self.remote_lost("nothing received within 1.5 times the keep alive");
                return;
            }
            if now.duration_since(self.last_sent) >= keep_alive {
                remote.queue(&Packet::PingReq);
                self.last_sent = now;
            }
        }
        let oldest = self.inflight.values().filter_map(|s| s.sent_at).min();
        if let Some(sent_at) = oldest {
            if now.duration_since(sent_at) >= self.bridge.ack_timeout {
                tracing::warn!(bridge = %self.bridge.name, inflight = self.inflight.len(),
                    ack_timeout_ms = self.bridge.ack_timeout.as_millis() as u64,
                    "bridge send unanswered past ack_timeout; reconnecting to send it again");
                self.remote_lost("ack timeout");
                // At once: the remote is there, it only stopped answering.
                self.reconnect_at = now;
            }
        }
    }

    /// Write what the remote is owed, then hand the state what this turn
    /// owes it. The remote first: the state's queue may make the bridge
    /// wait, and the sends of this turn need not wait with it.
    async fn flush(&mut self) {
        self.flush_remote().await;
        if self.acks.len() >= ACK_BATCH || self.pending.len() < RESERVOIR / 2 {
            self.release_acks();
        }
        self.flush_local().await;
    }

    async fn flush_remote(&mut self) {
        if let Some(remote) = self.remote.as_mut().filter(|r| r.has_queued()) {
            self.last_sent = Instant::now();
            match tokio::time::timeout(self.bridge.ack_timeout, remote.flush()).await {
                Ok(Ok(())) => {}
                Ok(Err(why)) => self.remote_lost(&why),
                Err(_) => self.remote_lost("the remote does not read what it is sent"),
            }
        }
    }

    async fn flush_local(&mut self) {
        if !self.to_local.is_empty() {
            let packets = std::mem::take(&mut self.to_local);
            if let Some(local) = &self.local {
                if let Err(gone) = local.send(packets).await {
                    self.local_lost(gone).await;
                }
            }
        }
    }

    /// With the remote's window full and records waiting, the next send
    /// waits for a PUBACK anyway: the bridge pauses an eighth of the round
    /// trip before it looks again, and then answers every PUBACK that
    /// arrived meanwhile in one turn and one write. Waiting on the socket
    /// instead, the bridge was woken for each segment the remote wrote -
    /// a wake-up the remote pays for in its write, on a loaded machine as
    /// much as the message itself - and answered one or two at a time.
    /// The pause costs at most an eighth of the window's round trip in
    /// rate; it is taken on the bridge's own thread (see [`super`]), which
    /// nothing else runs on.
    fn pause_for_acks(&self) {
        if !self.own_thread
            || self.remote.is_none()
            || self.inflight.len() < self.window
            || self.pending.is_empty()
        {
            return;
        }
        let pause = (self.round_trip / 8).min(MAX_PAUSE);
        if pause >= MIN_PAUSE {
            std::thread::sleep(pause);
        }
    }

    // ---- out ----

    async fn on_local(&mut self, answer: Outbound) {
        match answer {
            Outbound::Publish {
                packet_id,
                qos,
                retain,
                message,
                expiry,
                ..
            } => {
                self.delivered(packet_id, qos, retain, &message, expiry)
                    .await
            }
            Outbound::PubAck { packet_id, reason } => self.local_stored(packet_id, reason),
            Outbound::PubRec { packet_id, reason } => self.local_held(packet_id, reason),
            Outbound::PubComp { packet_id, .. } => self.local_released(packet_id),
            Outbound::PubRel { .. }
            | Outbound::PingResp
            | Outbound::UnsubAck { .. }
            | Outbound::Auth { .. }
            | Outbound::ConnAck { .. } => {}
            Outbound::SubAck {
                packet_id, reasons, ..
            } => {
                let rule = usize::from(packet_id).saturating_sub(1);
                if let (Some(r), Some(code)) = (self.bridge.out.get(rule), reasons.first()) {
                    if code.is_error() {
                        tracing::error!(bridge = %self.bridge.name, channel = %r.channel, reason = %format!("0x{:02X}", code.as_u8()), "the broker refused the bridge's subscription to its channel");
                    }
                }
            }
            Outbound::Disconnect { reason, .. } => {
                self.local_lost(LocalGone::Closed(format!(
                    "DISCONNECT 0x{:02X}",
                    reason.as_u8()
                )))
                .await;
            }
        }
    }

    async fn delivered(
        &mut self,
        local_id: u16,
        qos: u8,
        retain: bool,
        message: &crate::broker::message::Message,
        expiry: Option<u32>,
    ) {
        let topic = message.topic.as_str();
        let first = topic.split('/').next().unwrap_or(topic);
        let Some(rule_index) = self.bridge.out.iter().position(|r| r.channel == first) else {
            self.metrics.skipped("no_rule");
            self.ack_local(local_id, qos).await;
            return;
        };
        let rule = &self.bridge.out[rule_index];
        let user = &message.properties.user_properties;
        // One hop across brokers too: a record another saguin's bridge
        // sent here carries `saguin-channel` from that bridge (MQTT 5),
        // and going out again would start a loop between the two.
        if user.iter().any(|(k, _)| k == CHANNEL_PROPERTY) {
            self.metrics.skipped("looped");
            self.ack_local(local_id, qos).await;
            return;
        }
        let offset = message.channel_offset.map(NonZeroU64::get).or_else(|| {
            user.iter()
                .find(|(k, _)| k == OFFSET_PROPERTY)
                .and_then(|(_, v)| v.parse::<u64>().ok())
        });
        if let Some((_, gap)) = user.iter().find(|(k, _)| k == GAP_PROPERTY) {
            if let Some((from, to)) = gap
                .split_once('-')
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
            {
                self.metrics
                    .gap_records
                    .fetch_add(to.saturating_sub(from) + 1, Relaxed);
                tracing::warn!(bridge = %self.bridge.name, channel = %rule.channel, from, to, "bridge gap");
            }
        }
        // MQTT 3.1.1 carries no properties: none are built for it.
        let properties = if self.bridge.protocol == BridgeProtocol::Mqtt5 {
            let mut properties = PublishProperties::clone(&message.properties);
            properties.topic_alias = None;
            properties.subscription_identifiers.clear();
            properties.message_expiry_interval = expiry;
            let mut digits = DecimalBuf::default();
            if let Some((key, value)) = message.offset_property(&mut digits) {
                properties
                    .user_properties
                    .push((key.to_owned(), value.to_owned()));
            }
            properties
                .user_properties
                .push((CHANNEL_PROPERTY.to_owned(), rule.channel.clone()));
            properties
        } else {
            Default::default()
        };
        // A latest channel's changes are values: each goes out retained, a
        // deletion (an empty payload) as the empty retained publish that
        // deletes the remote's value.
        let retain = (retain || self.latest[rule_index]) && rule.retain == RetainMode::AsPublished;
        let publish = Publish {
            dup: false,
            qos: QoS::from_u8(qos).unwrap_or(QoS::AtMostOnce),
            retain,
            topic: format!("{}{topic}", rule.remote_prefix).into(),
            packet_id: 0,
            properties,
            payload: message.payload.clone(),
        };
        if qos == 0 {
            // At most once: sent when the link is up, not kept when it is
            // down (the state sends QoS 0 as fast as it is taken).
            match self
                .remote
                .as_mut()
                .map(|r| r.queue(&Packet::Publish(publish)))
            {
                Some(true) => {
                    self.metrics.sent.fetch_add(1, Relaxed);
                }
                Some(false) => self.too_large(rule_index, offset),
                None => self.metrics.skipped("offline_qos0"),
            }
            return;
        }
        self.seq += 1;
        let send = OutSend {
            local_id,
            rule: rule_index,
            offset,
            publish,
            received_at: message.received_at,
            sent_at: None,
        };
        self.pending.push_back((self.seq, send));
        self.pump();
        // A record too large for the remote was skipped by the pump: its
        // acknowledgement goes back at once.
        self.ack_skipped().await;
    }

    fn too_large(&self, rule: usize, offset: Option<u64>) {
        self.metrics.skipped("too_large");
        tracing::warn!(bridge = %self.bridge.name, channel = %self.bridge.out[rule].channel,
            offset = offset.unwrap_or(0), "bridge skipped a record larger than the remote's Maximum Packet Size");
    }

    /// Send what waits, as far as the remote's window allows.
    fn pump(&mut self) {
        let Some(remote) = self.remote.as_mut() else {
            return;
        };
        while self.inflight.len() < self.window {
            let Some((seq, mut send)) = self.pending.pop_front() else {
                break;
            };
            // A resend keeps its packet id (the remote's session may hold
            // it); resends leave first, so no fresh send has taken it.
            let fresh = send.publish.packet_id == 0;
            if fresh || self.by_remote_id.contains_key(&send.publish.packet_id) {
                let Some(id) = free_id(&mut self.next_remote_id, |id| {
                    self.by_remote_id.contains_key(&id)
                }) else {
                    self.pending.push_front((seq, send));
                    break;
                };
                send.publish.packet_id = id;
            }
            if !remote.queue_publish(&send.publish) {
                self.skipped_sends.push(send);
                continue;
            }
            if fresh {
                self.metrics.sent.fetch_add(1, Relaxed);
            } else {
                self.metrics.resent.fetch_add(1, Relaxed);
            }
            send.sent_at = Some(Instant::now());
            self.by_remote_id.insert(send.publish.packet_id, seq);
            self.inflight.insert(seq, send);
        }
        self.metrics
            .inflight
            .store(self.inflight.len() as i64, Relaxed);
    }

    async fn ack_skipped(&mut self) {
        for send in std::mem::take(&mut self.skipped_sends) {
            self.too_large(send.rule, send.offset);
            self.ack_local(send.local_id, 1).await;
        }
    }

    async fn ack_local(&mut self, local_id: u16, qos: u8) {
        if qos == 0 {
            return;
        }
        if self.local.is_some() {
            self.acks.push(local_id);
        }
    }

    /// Hand every held acknowledgement to the state with this turn.
    fn release_acks(&mut self) {
        self.to_local
            .extend(self.acks.drain(..).map(|packet_id| Inbound::PubAck {
                packet_id,
                reason: ReasonCode::Success,
            }));
    }

    /// The remote answered a send.
    async fn remote_acked(&mut self, packet_id: u16, reason: ReasonCode) {
        let Some(seq) = self.by_remote_id.remove(&packet_id) else {
            return;
        };
        let Some(mut send) = self.inflight.remove(&seq) else {
            return;
        };
        if let Some(sent_at) = send.sent_at {
            let sample = sent_at.elapsed();
            self.round_trip = if self.round_trip.is_zero() {
                sample
            } else {
                (self.round_trip * 7 + sample) / 8
            };
        }
        if reason.is_error() {
            let code = format!("0x{:02X}", reason.as_u8());
            self.metrics.refused(&code);
            tracing::warn!(bridge = %self.bridge.name, channel = %self.bridge.out[send.rule].channel,
                offset = send.offset.unwrap_or(0), reason = %code, state = "blocked",
                retry_ms = self.bridge.reconnect.base.as_millis() as u64,
                "the remote refused a record; the position holds and it is sent again");
            send.publish.packet_id = 0;
            send.publish.dup = false;
            send.sent_at = None;
            self.blocked
                .push_back((Instant::now() + self.bridge.reconnect.base, send));
            return;
        }
        self.metrics.acked.fetch_add(1, Relaxed);
        if let Some(offset) = send.offset {
            let next = &mut self.acked_next[send.rule];
            *next = Some(next.map_or(offset + 1, |n| n.max(offset + 1)));
        }
        self.ack_local(send.local_id, 1).await;
        self.pump();
        self.ack_skipped().await;
    }

    fn retry_blocked(&mut self, now: Instant) {
        while self.blocked.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, send)) = self.blocked.pop_front() {
                self.seq += 1;
                self.pending.push_front((self.seq, send));
            }
        }
    }

    fn publish_lag(&self, now: Instant) {
        for (i, rule) in self.bridge.out.iter().enumerate() {
            let held = self
                .pending
                .iter()
                .map(|(_, s)| s)
                .chain(self.inflight.values())
                .chain(self.blocked.iter().map(|(_, s)| s))
                .filter(|s| s.rule == i);
            let (mut lowest, mut oldest) = (None::<u64>, None::<Instant>);
            for s in held {
                if let Some(o) = s.offset {
                    lowest = Some(lowest.map_or(o, |l| l.min(o)));
                }
                oldest = Some(oldest.map_or(s.received_at, |t| t.min(s.received_at)));
            }
            let Some((next, floor)) = self
                .shared
                .channels
                .get(&rule.channel)
                .and_then(ChannelView::bounds)
            else {
                continue;
            };
            let position = lowest.or(self.acked_next[i]).unwrap_or(floor.max(1));
            let records = next.saturating_sub(position);
            let seconds = match (records, oldest) {
                (0, _) => 0.0,
                (_, Some(t)) => now.saturating_duration_since(t).as_secs_f64(),
                (_, None) => 0.0,
            };
            self.metrics.set_lag(&rule.channel, records, seconds);
        }
    }

    // ---- in ----

    async fn on_remote(&mut self, packet: Packet) {
        match packet {
            Packet::PubAck(ack) => self.remote_acked(ack.packet_id, ack.reason).await,
            Packet::Publish(publish) => {
                self.metrics.received.fetch_add(1, Relaxed);
                self.remote_published(publish, false);
            }
            Packet::PubRel(rel) => self.remote_released(rel.packet_id),
            Packet::PubRec(rec) => {
                // The bridge sends at QoS 0 or 1 only; a PUBREC is the
                // remote's mistake, answered so its exchange can end.
                self.answer_remote(Packet::PubRel(PubAck::new(rec.packet_id)));
            }
            Packet::SubAck(ack) => {
                for (rule, code) in self.bridge.inbound.iter().zip(ack.reasons.iter()) {
                    let granted = match code {
                        ReasonCode::Success => Some(0),
                        ReasonCode::GrantedQoS1 => Some(1),
                        ReasonCode::GrantedQoS2 => Some(2),
                        _ => None,
                    };
                    match granted {
                        Some(q) if q >= rule.qos => {}
                        Some(q) => {
                            self.metrics.refused("suback_downgrade");
                            tracing::error!(bridge = %self.bridge.name, filter = %rule.filter, asked = rule.qos, granted = q,
                                "the remote granted a lower QoS than the rule's; messages arrive at the lower QoS");
                        }
                        None => {
                            let code = format!("0x{:02X}", code.as_u8());
                            self.metrics.refused(&format!("suback_{code}"));
                            tracing::error!(bridge = %self.bridge.name, filter = %rule.filter, reason = %code, "the remote refused the bridge's subscription");
                        }
                    }
                }
            }
            Packet::Disconnect(d) => {
                self.remote_lost(&format!(
                    "DISCONNECT 0x{:02X} from the remote",
                    d.reason.as_u8()
                ));
            }
            Packet::PingResp | Packet::PubComp(_) | Packet::UnsubAck(_) | Packet::Auth(_) => {}
            other => self.remote_lost(&format!(
                "unexpected {} from the remote",
                other.packet_type()
            )),
        }
    }

    fn answer_remote(&mut self, packet: Packet) {
        if let Some(remote) = self.remote.as_mut() {
            remote.queue(&packet);
        }
    }

    /// A PUBLISH from the remote (`orphan`: one of a session the remote
    /// has forgotten since, which waited for its packet id).
    fn remote_published(&mut self, publish: Publish, orphan: bool) {
        let remote_qos = publish.qos.as_u8();
        let id = publish.packet_id;
        if remote_qos > 0 {
            if let Some(entry) = self.inbound.get(&id) {
                if entry.orphan {
                    // The id is still that of an exchange the remote forgot.
                    self.deferred.push_back((publish, orphan));
                } else if matches!(entry.stage, InStage::Stored | InStage::Held) {
                    // A resend of one already committed.
                    self.answer_stored(id);
                }
                // Else a resend of one on its way: answered when it is.
                return;
            }
        }
        let topic = publish.topic.as_str();
        let mapped = self
            .bridge
            .inbound
            .iter()
            .find(|r| crate::topic::filter_matches(&r.filter, topic))
            .and_then(|r| Some((r.local_topic(topic)?, r.qos)));
        let Some((local_topic, rule_qos)) = mapped else {
            self.metrics.skipped("no_rule");
            tracing::warn!(bridge = %self.bridge.name, topic, "bridge received a topic no in rule maps; acknowledged and dropped");
            if !orphan {
                self.answer_unstored(id, remote_qos);
            }
            return;
        };
        let mut properties = publish.properties;
        properties.topic_alias = None;
        properties.subscription_identifiers.clear();
        let local_qos = remote_qos.min(rule_qos);
        let inbound = InboundPublish {
            packet_id: if local_qos > 0 { id } else { 0 },
            qos: local_qos,
            retain: publish.retain,
            dup: false,
            topic: local_topic.into(),
            payload: publish.payload,
            properties: properties.into(),
        };
        if local_qos == 0 {
            self.publish_local(inbound);
            // At most once was asked for: the remote is answered now.
            if !orphan {
                self.answer_unstored(id, remote_qos);
            }
            return;
        }
        self.inbound.insert(
            id,
            InEntry {
                remote_qos,
                publish: Some(inbound),
                stage: InStage::Local,
                orphan,
            },
        );
        self.publish_entry(id);
    }

    /// Publish entry `id` on the local connection.
    fn publish_entry(&mut self, id: u16) {
        let Some(entry) = self.inbound.get_mut(&id) else {
            return;
        };
        let Some(publish) = entry.publish.clone() else {
            return;
        };
        entry.stage = InStage::Local;
        self.publish_local(publish);
    }

    fn publish_local(&mut self, publish: InboundPublish) {
        if self.local.is_some() {
            self.to_local.push(Inbound::Publish(publish));
        }
    }

    /// PUBACK (QoS 1) or PUBREC (QoS 2) for entry `id`, which is stored
    /// or held: when the link is up (else the remote sends it again).
    fn answer_stored(&mut self, id: u16) {
        let Some(entry) = self.inbound.get(&id) else {
            return;
        };
        if entry.orphan || self.remote.is_none() {
            return;
        }
        if entry.remote_qos == 1 {
            self.inbound.remove(&id);
            self.answer_remote(Packet::PubAck(PubAck::new(id)));
        } else {
            self.answer_remote(Packet::PubRec(PubAck::new(id)));
        }
    }

    /// Answer a message nothing is stored for (QoS 0 here, or no rule).
    /// A QoS 2 exchange ends with the PUBREL, which the state answers for
    /// an id it does not hold.
    fn answer_unstored(&mut self, id: u16, remote_qos: u8) {
        match remote_qos {
            1 => self.answer_remote(Packet::PubAck(PubAck::new(id))),
            2 => self.answer_remote(Packet::PubRec(PubAck::new(id))),
            _ => {}
        }
    }

    fn refused(&mut self, id: u16, reason: ReasonCode) {
        let Some(entry) = self.inbound.get_mut(&id) else {
            return;
        };
        // No acknowledgement: the remote keeps the message, and it is
        // published here again later.
        entry.stage = InStage::Refused(Instant::now() + self.bridge.reconnect.base);
        let topic = entry.publish.as_ref().map_or("", |p| p.topic.as_str());
        tracing::warn!(bridge = %self.bridge.name, topic, reason = %format!("0x{:02X}", reason.as_u8()),
            retry_ms = self.bridge.reconnect.base.as_millis() as u64,
            "the broker refused a message from the remote; the remote is not acknowledged and it is published again");
    }

    /// The state answered a QoS 1 publish of the bridge (PUBACK).
    fn local_stored(&mut self, id: u16, reason: ReasonCode) {
        self.local_committed(id, reason, InStage::Stored);
    }

    /// The state holds a QoS 2 publish of the bridge (PUBREC): one just
    /// published, or one it kept from before this connection.
    fn local_held(&mut self, id: u16, reason: ReasonCode) {
        if self.inbound.contains_key(&id) {
            self.local_committed(id, reason, InStage::Held);
        } else if !reason.is_error() {
            // Held before this connection. The remote releases it with
            // PUBREL, unless its session is newer than the hold.
            let orphan = self.remote_fresh;
            self.inbound.insert(
                id,
                InEntry {
                    remote_qos: 2,
                    publish: None,
                    stage: InStage::Held,
                    orphan,
                },
            );
            if orphan {
                self.release_local(id);
            }
        }
    }

    /// The state answered entry `id`'s publish: refused, or committed as
    /// `stage` (stored, or held), and then answered to the remote - unless
    /// the remote forgot it, which finishes it here.
    fn local_committed(&mut self, id: u16, reason: ReasonCode, stage: InStage) {
        let Some(entry) = self.inbound.get_mut(&id) else {
            return;
        };
        // Else already committed, or being released.
        if entry.stage != InStage::Local {
            return;
        }
        if reason.is_error() {
            self.refused(id, reason);
            return;
        }
        entry.stage = stage;
        match (entry.orphan, stage) {
            (false, _) => self.answer_stored(id),
            (true, InStage::Held) => self.release_local(id),
            (true, _) => self.finished(id),
        }
    }

    /// PUBREL for entry `id` to the state.
    fn release_local(&mut self, id: u16) {
        if let Some(entry) = self.inbound.get_mut(&id) {
            entry.stage = InStage::Releasing;
        }
        if self.local.is_some() {
            self.to_local.push(Inbound::PubRel { packet_id: id });
        }
    }

    /// The remote released a QoS 2 message it had a PUBREC for.
    fn remote_released(&mut self, id: u16) {
        match self.inbound.get(&id).map(|e| (e.stage, e.orphan)) {
            Some((InStage::Held, false)) => self.release_local(id),
            // Written at QoS 1 here (the rule's): nothing left to do.
            Some((InStage::Stored, false)) => {
                self.inbound.remove(&id);
                self.answer_remote(Packet::PubComp(PubAck::new(id)));
            }
            // Released already as forgotten, yet the remote knew it (one
            // cluster behind two addresses): it gets its PUBCOMP.
            Some((InStage::Releasing, true)) => {
                if let Some(entry) = self.inbound.get_mut(&id) {
                    entry.orphan = false;
                }
            }
            // A hold this bridge does not know of (released already, or
            // never made: the state says which), or a resend.
            None => {
                self.inbound.insert(
                    id,
                    InEntry {
                        remote_qos: 2,
                        publish: None,
                        stage: InStage::Releasing,
                        orphan: false,
                    },
                );
                self.release_local(id);
            }
            Some(_) => {}
        }
    }

    /// The state answered a PUBREL (PUBCOMP): the record is written, or
    /// there was no hold left to write.
    fn local_released(&mut self, id: u16) {
        let Some(entry) = self.inbound.get(&id) else {
            return;
        };
        if entry.stage != InStage::Releasing {
            return;
        }
        if !entry.orphan {
            // When the link is down, the remote sends its PUBREL again.
            self.answer_remote(Packet::PubComp(PubAck::new(id)));
        }
        self.finished(id);
    }

    /// Entry `id` is done; a remote publish that waited for its id goes on.
    fn finished(&mut self, id: u16) {
        self.inbound.remove(&id);
        let waiting: VecDeque<(Publish, bool)> = {
            let (ready, rest) = std::mem::take(&mut self.deferred)
                .into_iter()
                .partition(|(p, _)| p.packet_id == id);
            self.deferred = rest;
            ready
        };
        for (publish, orphan) in waiting {
            self.remote_published(publish, orphan);
        }
    }

    /// The remote came back without its session: what it sent before is
    /// answered to nobody. Committed QoS 1 records are done; holds are
    /// released now (the remote gave the message up, or lost it, either
    /// way it is written once here); what waits for a commit is finished.
    fn remote_forgot(&mut self) {
        for (_, orphan) in &mut self.deferred {
            *orphan = true;
        }
        let mut ids: Vec<u16> = self.inbound.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(entry) = self.inbound.get_mut(&id) else {
                continue;
            };
            entry.orphan = true;
            match entry.stage {
                InStage::Stored => self.finished(id),
                InStage::Held => self.release_local(id),
                InStage::Local | InStage::Releasing | InStage::Refused(_) => {}
            }
        }
    }

    /// The local connection ended: its exchanges went with it. What the
    /// remote still has goes again when it resends it (the remote is
    /// closed too); holds are the state's and it names them again. What
    /// the remote forgot is kept here: published again, or released again.
    fn local_lost_inbound(&mut self) {
        let now = Instant::now();
        self.deferred.clear();
        self.inbound
            .retain(|_, e| e.orphan && e.stage != InStage::Stored);
        for entry in self.inbound.values_mut() {
            let unstored = matches!(entry.stage, InStage::Local | InStage::Refused(_));
            entry.stage = if unstored && entry.publish.is_some() {
                InStage::Refused(now)
            } else {
                InStage::Releasing
            };
        }
    }

    /// PUBREL again for every forgotten hold being released (a new local
    /// connection: the state answers one it no longer holds too).
    fn release_orphans(&mut self) {
        let mut ids: Vec<u16> = self
            .inbound
            .iter()
            .filter(|(_, e)| e.orphan && e.stage == InStage::Releasing)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            self.release_local(id);
        }
    }

    async fn retry_inbound(&mut self, now: Instant) {
        let due: Vec<u16> = self
            .inbound
            .iter()
            .filter(|(_, e)| matches!(e.stage, InStage::Refused(at) if at <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.publish_entry(id);
        }
    }
}

/// The wait between a bridge's attempts: `reconnect.base` doubling up to
/// `reconnect.cap`, drawn from a sequence of the bridge's own, so bridges
/// that lost the same remote at once do not come back at once.
pub(super) fn reconnect_backoff(bridge: &Bridge) -> Backoff {
    let seed = bridge.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) ^ u64::from(std::process::id());
    Backoff::new(bridge.reconnect.base, bridge.reconnect.cap, seed)
}

/// The next packet id not in use, from `next` on (1..=65535).
fn free_id(next: &mut u16, used: impl Fn(u16) -> bool) -> Option<u16> {
    for _ in 0..u16::MAX {
        let id = *next;
        *next = if *next == u16::MAX { 1 } else { *next + 1 };
        if !used(id) {
            return Some(id);
        }
    }
    None
}

async fn recv_local(local: &mut Option<Local>) -> Result<Vec<Outbound>, LocalGone> {
    match local {
        Some(local) => local.recv().await,
        None => std::future::pending().await,
    }
}

async fn recv_remote(remote: &mut Option<Remote>) -> Result<Packet, String> {
    match remote {
        Some(remote) => remote.recv().await,
        None => std::future::pending().await,
    }
}
