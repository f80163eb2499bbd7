//! Bridges into other MQTT brokers (`bridges` in the configuration).
//!
//! A bridge is two MQTT clients joined inside the broker process: a
//! [`local`] connection to the broker state, made of events on the broker
//! task's queue rather than a socket, and a [`remote`] one, written on the
//! project's codec over TCP or TLS. [`link`] joins them: what the state
//! delivers from an `out` channel goes to the remote and is acknowledged to
//! the state only once the remote acknowledged it; what the remote sends
//! for an `in` rule is published into a channel and acknowledged to the
//! remote only once the state acknowledged it, which it does after commit.
//!
//! The local connection is marked as the bridge's
//! (`ConnectRequest::bridge`): its records carry the bridge's name, its
//! place in each channel is the reader `bridge:<name>`, stored every
//! `broker.session.ack_commit_interval`, when it goes away and at
//! shutdown, kept past its session, and it is never handed a record that
//! arrived over a bridge (one hop).
//!
//! [`Bridges::start`] runs each bridge on a thread of its own, under a
//! [`supervise::Supervisor`] that starts its link again after a panic;
//! [`Bridges::stop`] ends them before the state shuts down, so their
//! positions are stored with the rest.

mod link;
mod local;
mod remote;
mod supervise;

pub(crate) use supervise::panic_message;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::metrics::{BridgeMetrics, CloseReason, Metrics};
use super::state::Event;
use super::views::ChannelView;
use crate::config::bridge::Bridge;
use crate::storage::contract::{Position, Reader};

/// The user property naming the channel of a record sent out (MQTT 5),
/// beside `saguin-offset`: together they let a consumer deduplicate.
pub const CHANNEL_PROPERTY: &str = "saguin-channel";

/// Every bridge's connection inside the process has client id and
/// principal `bridge:<name>`. The whole prefix is refused to the network
/// (see [`is_reserved`]).
pub const CLIENT_ID_PREFIX: &str = "bridge:";

/// Whether a network CONNECT's client id, or its user name, is one of the
/// bridges' own. A stranger under `bridge:<name>` would take over that
/// bridge's session, or hold one the bridge is then refused (another
/// principal's), and as that principal would have the bridge's ACL; the
/// whole prefix and not only the configured names, so a bridge added
/// later inherits nothing a stranger left.
pub fn is_reserved(name: &str) -> bool {
    name.starts_with(CLIENT_ID_PREFIX)
}

/// How long a stop waits for a bridge to say goodbye to both sides.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// What every bridge task shares.
pub(crate) struct Shared {
    pub events: mpsc::Sender<Event>,
    /// The generation numbers connections are named by (the listeners'
    /// counter: one space of names).
    pub generation: Arc<AtomicU64>,
    pub metrics: Arc<Metrics>,
    /// The channels served, seen for the stored positions and the lag
    /// gauges.
    pub channels: HashMap<String, ChannelView>,
    /// `Limits::outbound_queue`: a writer says it drained below half of it.
    pub outbound_queue: usize,
}

/// The running bridges.
pub struct Bridges {
    stop: watch::Sender<bool>,
    tasks: Vec<(String, oneshot::Receiver<()>)>,
}

impl Bridges {
    /// State each bridge's direction, guarantee and lag, and start it.
    pub fn start(
        bridges: &[Bridge],
        events: mpsc::Sender<Event>,
        generation: Arc<AtomicU64>,
        metrics: Arc<Metrics>,
        channels: HashMap<String, ChannelView>,
        outbound_queue: usize,
    ) -> Bridges {
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            events,
            generation,
            metrics,
            channels,
            outbound_queue,
        });
        let mut tasks = Vec::new();
        for bridge in bridges {
            let stored = stored_positions(bridge, &shared.channels);
            log_startup(bridge, &stored, &shared.channels);
            let bridge_arc = Arc::new(bridge.clone());
            let supervised = || Supervised {
                bridge: bridge_arc.clone(),
                shared: shared.clone(),
                stop: stop_rx.clone(),
                stored: stored.clone(),
            };
            tasks.push((bridge.name.clone(), spawn(&bridge.name, supervised)));
        }
        Bridges { stop, tasks }
    }

    /// End every bridge: DISCONNECT to the remote (which keeps the
    /// session), the local connection closed so its positions are stored.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for (name, mut task) in self.tasks {
            if tokio::time::timeout(STOP_TIMEOUT, &mut task).await.is_err() {
                // Its thread ends with the process.
                tracing::warn!(bridge = %name, "bridge did not stop in time; abandoned");
            }
        }
    }
}

/// Run a bridge on a thread of its own, with a runtime of its own, and
/// say when it ended. Its round trips with the remote are then not queued
/// behind the broker task and the connections on the shared runtime, and
/// it may pause while its window is full (see `Link::pause_for_acks`).
/// Without a thread or a runtime (the process is out of them), it runs as
/// a task on the shared runtime instead, without the pauses. Either way
/// its link is supervised: a panic in it does not end the bridge.
fn spawn(name: &str, supervised: impl Fn() -> Supervised) -> oneshot::Receiver<()> {
    let (done_tx, done) = oneshot::channel();
    let (back_tx, back) = oneshot::channel::<(Supervised, oneshot::Sender<()>)>();
    let on_thread = supervised();
    let thread_name = name.to_owned();
    let spawned = std::thread::Builder::new()
        .name(format!("bridge-{name}"))
        .spawn(move || {
            tight_timers();
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => {
                    drop(back_tx);
                    runtime.block_on(on_thread.run(true));
                    let _ = done_tx.send(());
                }
                Err(e) => {
                    tracing::warn!(bridge = %thread_name, error = %e, "no runtime for the bridge's thread; it runs on the broker's");
                    let _ = back_tx.send((on_thread, done_tx));
                }
            }
        });
    match spawned {
        Ok(_) => {
            tokio::spawn(async move {
                if let Ok((supervised, done_tx)) = back.await {
                    run_shared(supervised, done_tx).await;
                }
            });
            done
        }
        Err(e) => {
            tracing::warn!(bridge = %name, error = %e, "no thread for the bridge; it runs on the broker's runtime");
            let (done_tx, done) = oneshot::channel();
            tokio::spawn(run_shared(supervised(), done_tx));
            done
        }
    }
}

/// Run a bridge on the shared runtime, where it must never pause.
async fn run_shared(supervised: Supervised, done: oneshot::Sender<()>) {
    supervised.run(false).await;
    let _ = done.send(());
}

/// What one bridge's runs are made of: each of its links, the first and
/// every one made again after a failure, is made from this.
struct Supervised {
    bridge: Arc<Bridge>,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    /// The positions read at the start, for the first link. A link made
    /// again reads them anew: the failed one may have moved them.
    stored: Vec<Option<u64>>,
}

impl Supervised {
    /// Run the bridge's link until the stop, again after each panic,
    /// waiting the bridge's reconnect backoff in between.
    async fn run(self, own_thread: bool) {
        let Supervised {
            bridge,
            shared,
            stop,
            stored,
        } = self;
        let metrics = shared.metrics.bridge(&bridge.name);
        let slot = Arc::new(LocalSlot::default());
        let supervisor = supervise::Supervisor {
            name: bridge.name.clone(),
            metrics: metrics.clone(),
            backoff: link::reconnect_backoff(&bridge),
            // A link that ran for as long as the longest wait was
            // healthy: its failure starts the backoff over.
            healthy_after: bridge.reconnect.cap,
            stop: stop.clone(),
        };
        let mut first = Some(stored);
        let make = || {
            let stored = first
                .take()
                .unwrap_or_else(|| stored_positions(&bridge, &shared.channels));
            link::Link::new(
                bridge.clone(),
                shared.clone(),
                stop.clone(),
                stored,
                slot.clone(),
            )
            .own_thread(own_thread)
            .run()
        };
        let after_failure = || close_left(&shared.events, &slot, &metrics);
        supervisor.run(make, after_failure).await;
    }
}

/// The connection a bridge's link last made to the state, left where the
/// bridge's supervisor finds it once the link failed.
///
/// The state learns that a bridge's connection ended only from its link
/// (`Local::close`), or when a delivery to it finds its queue gone, or
/// when another connection takes its client id over. A link that panicked
/// is dropped without a word; with an idle channel nothing is delivered,
/// and the next link takes the client id over only once its remote is
/// back, so the dead connection could stay registered - its session, its
/// deliveries in flight, its places in the channels not stored - for as
/// long as the remote is away. The supervisor closes it instead.
///
/// The number is not cleared when the state or the link ends the
/// connection: a close of a connection the state no longer has is
/// ignored, and connection numbers are never used twice.
#[derive(Debug, Default)]
pub(super) struct LocalSlot(Mutex<Option<u64>>);

impl LocalSlot {
    pub fn set(&self, connection: u64) {
        *self.lock() = Some(connection);
    }

    fn take(&self) -> Option<u64> {
        self.lock().take()
    }

    fn lock(&self) -> MutexGuard<'_, Option<u64>> {
        // The slot holds a number, consistent whatever panicked.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Clean up after a link that failed: the state is told its connection
/// ended as a failed socket's would (`Network`), which ends the bridge's
/// session the way any of its connections' ends does - its places in the
/// channels stored, its unreleased QoS 2 holds kept for the next
/// connection, what was in flight sent again from the position. Its
/// gauges read as the link's own end leaves them.
async fn close_left(events: &mpsc::Sender<Event>, slot: &LocalSlot, metrics: &BridgeMetrics) {
    metrics.connected.store(0, Relaxed);
    metrics.inflight.store(0, Relaxed);
    if let Some(connection) = slot.take() {
        // An error is the broker task gone: no connection is left to close.
        let _ = events
            .send(Event::Closed {
                connection,
                reason: CloseReason::Network,
                disconnect_reason: None,
            })
            .await;
    }
}

/// The bridge's pauses are tens of microseconds: the kernel's default
/// timer slack for a thread (50 µs) would double them, and cost the rate
/// they are meant to keep. A failure leaves the default.
fn tight_timers() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes a value and touches no memory of
    // ours; it sets the slack of the calling thread only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong, 0, 0, 0);
    }
}

/// Each `out` rule's stored position, where its channel is served.
fn stored_positions(bridge: &Bridge, channels: &HashMap<String, ChannelView>) -> Vec<Option<u64>> {
    let reader = Reader::bridge(&bridge.name).ok();
    bridge
        .out
        .iter()
        .map(|rule| {
            let position = position_in(channels.get(&rule.channel)?, reader.as_ref()?)?;
            Some(position.offset)
        })
        .collect()
}

fn position_in(channel: &ChannelView, reader: &Reader) -> Option<Position> {
    channel.position(reader).ok().flatten()
}

fn log_startup(bridge: &Bridge, stored: &[Option<u64>], channels: &HashMap<String, ChannelView>) {
    let direction = match (bridge.out.is_empty(), bridge.inbound.is_empty()) {
        (false, false) => "out and in",
        (false, true) => "out",
        (true, false) => "in",
        (true, true) => "none",
    };
    let mut guarantee = Vec::new();
    let mut lag = Vec::new();
    for (rule, position) in bridge.out.iter().zip(stored) {
        guarantee.push(format!(
            "out {}: {}",
            rule.channel,
            if rule.qos == 0 {
                "at most once (qos 0): records sent while the remote is down are not kept for it"
            } else {
                "at least once from the stored position: duplicates after a restart, never a loss"
            }
        ));
        if let Some((next, floor)) = channels.get(&rule.channel).and_then(ChannelView::bounds) {
            let start = match (position, rule.from) {
                (Some(p), _) => *p,
                (None, crate::config::bridge::StartFrom::Earliest) => floor.max(1),
                (None, crate::config::bridge::StartFrom::Next) => next,
            };
            lag.push(format!(
                "{}={}{}",
                rule.channel,
                next.saturating_sub(start),
                if position.is_some() {
                    ""
                } else {
                    " (no stored position)"
                }
            ));
        }
    }
    for rule in &bridge.inbound {
        guarantee.push(format!(
            "in {}: {}",
            rule.filter,
            if rule.qos == 0 {
                "at most once (qos 0)"
            } else {
                "the remote is acknowledged only after the record committed"
            }
        ));
    }
    tracing::info!(
        bridge = %bridge.name,
        address = %bridge.addresses.join(","),
        protocol = bridge.protocol.as_str(),
        direction,
        guarantee = %guarantee.join("; "),
        lag_records = %lag.join(","),
        "bridge"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::state::{AllowAll, BrokerState, Limits};
    use tokio::time::Instant;

    /// A link that panics is dropped with its connection to the state, and
    /// nothing tells the state: the connection stays registered. What the
    /// supervisor does after the failure closes it, once.
    #[tokio::test]
    async fn the_connection_a_failed_link_left_is_closed_in_the_state() {
        let now = Instant::now();
        let mut state = BrokerState::new(
            Limits::default(),
            Arc::new(Metrics::new()),
            Arc::new(AllowAll),
            crate::broker::state::clock::ReceiptClock::new(now, 1_700_000_000_000_000_000),
        );
        let (events, mut queue) = mpsc::channel(16);
        let generation = AtomicU64::new(1);
        let (local, ()) = tokio::join!(
            local::Local::connect("cloud", 10, &[], events.clone(), &generation, 100),
            async {
                let connect = queue.recv().await.expect("the bridge's CONNECT");
                state.handle(connect, now);
            }
        );
        let local = local.expect("the state accepted the bridge");
        let slot = LocalSlot::default();
        slot.set(local.connection);
        assert_eq!(state.connection_count(), 1);

        // What unwinding a panicked link does to its connection.
        drop(local);
        assert!(
            queue.try_recv().is_err(),
            "a dropped connection says nothing"
        );
        assert_eq!(state.connection_count(), 1, "the state still holds it");

        let metrics = BridgeMetrics::default();
        metrics.connected.store(1, Relaxed);
        metrics.inflight.store(5, Relaxed);
        close_left(&events, &slot, &metrics).await;
        let close = queue.try_recv().expect("the supervisor closes it");
        state.handle(close, now);
        assert_eq!(state.connection_count(), 0);
        assert_eq!(state.session_count(), 0, "the bridge's session ended");
        assert_eq!(metrics.connected.load(Relaxed), 0);
        assert_eq!(metrics.inflight.load(Relaxed), 0);

        close_left(&events, &slot, &metrics).await;
        assert!(queue.try_recv().is_err(), "closed once");
    }
}
