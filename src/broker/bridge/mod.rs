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
//! [`Bridges::start`] runs each bridge on a thread of its own;
//! [`Bridges::stop`] ends them before the state shuts down, so their
//! positions are stored with the rest.

mod link;
mod local;
mod remote;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::metrics::Metrics;
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
            let make = || {
                link::Link::new(
                    bridge_arc.clone(),
                    shared.clone(),
                    stop_rx.clone(),
                    stored.clone(),
                )
            };
            tasks.push((bridge.name.clone(), spawn(&bridge.name, make)));
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
/// a task on the shared runtime instead, without the pauses.
fn spawn(name: &str, make: impl Fn() -> link::Link) -> oneshot::Receiver<()> {
    let (done_tx, done) = oneshot::channel();
    let (back_tx, back) = oneshot::channel::<(link::Link, oneshot::Sender<()>)>();
    let link = make().own_thread(true);
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
                    runtime.block_on(link.run());
                    let _ = done_tx.send(());
                }
                Err(e) => {
                    tracing::warn!(bridge = %thread_name, error = %e, "no runtime for the bridge's thread; it runs on the broker's");
                    let _ = back_tx.send((link, done_tx));
                }
            }
        });
    match spawned {
        Ok(_) => {
            tokio::spawn(async move {
                if let Ok((link, done_tx)) = back.await {
                    run_shared(link, done_tx).await;
                }
            });
            done
        }
        Err(e) => {
            tracing::warn!(bridge = %name, error = %e, "no thread for the bridge; it runs on the broker's runtime");
            let (done_tx, done) = oneshot::channel();
            tokio::spawn(run_shared(make(), done_tx));
            done
        }
    }
}

/// Run a bridge on the shared runtime, where it must never pause.
async fn run_shared(link: link::Link, done: oneshot::Sender<()>) {
    link.own_thread(false).run().await;
    let _ = done.send(());
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
