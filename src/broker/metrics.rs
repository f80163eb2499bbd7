//! Process-local counters, shared by the broker state and connection tasks,
//! rendered in Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::views::{ChannelView, ProviderView};
use crate::storage::contract::{FaultKind, Health, ProviderKind};

/// Why a connection ended (a label of `saguin_disconnects_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// DISCONNECT 0x00 (or any reason but 0x04) from the client.
    ClientDisconnect,
    /// DISCONNECT 0x04: disconnect with Will.
    ClientDisconnectWithWill,
    /// The peer closed the socket or it failed.
    Network,
    /// Nothing received within 1.5 times the keep alive.
    KeepAlive,
    /// Bytes that are not MQTT.
    Malformed,
    /// Valid MQTT used against the rules of the protocol.
    Protocol,
    /// A packet larger than the maximum packet size.
    PacketTooLarge,
    /// Its outbound queue was full.
    SlowConsumer,
    /// Another connection took over its client identifier.
    TakenOver,
    /// The broker is shutting down.
    Shutdown,
    /// CONNECT refused (authentication, identifier, version).
    ConnectRefused,
    /// No CONNECT in time, or a TLS handshake that failed or timed out.
    Handshake,
    /// A write the client's packet caused failed, and an MQTT 3.1.1 client
    /// has no reason code to be told so with.
    Storage,
}

impl CloseReason {
    pub const ALL: [CloseReason; 13] = [
        CloseReason::ClientDisconnect,
        CloseReason::ClientDisconnectWithWill,
        CloseReason::Network,
        CloseReason::KeepAlive,
        CloseReason::Malformed,
        CloseReason::Protocol,
        CloseReason::PacketTooLarge,
        CloseReason::SlowConsumer,
        CloseReason::TakenOver,
        CloseReason::Shutdown,
        CloseReason::ConnectRefused,
        CloseReason::Handshake,
        CloseReason::Storage,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CloseReason::ClientDisconnect => "client_disconnect",
            CloseReason::ClientDisconnectWithWill => "client_disconnect_with_will",
            CloseReason::Network => "network",
            CloseReason::KeepAlive => "keep_alive_timeout",
            CloseReason::Malformed => "malformed_packet",
            CloseReason::Protocol => "protocol_error",
            CloseReason::PacketTooLarge => "packet_too_large",
            CloseReason::SlowConsumer => "slow_consumer",
            CloseReason::TakenOver => "session_taken_over",
            CloseReason::Shutdown => "server_shutting_down",
            CloseReason::ConnectRefused => "connect_refused",
            CloseReason::Handshake => "handshake",
            CloseReason::Storage => "storage_failure",
        }
    }

    /// The reason string sent with a server's DISCONNECT.
    pub fn describe(self) -> &'static str {
        match self {
            CloseReason::ClientDisconnect | CloseReason::ClientDisconnectWithWill => "disconnected",
            CloseReason::Network => "connection lost",
            CloseReason::KeepAlive => "nothing received within 1.5 times the keep alive",
            CloseReason::Malformed => "malformed packet",
            CloseReason::Protocol => "protocol error",
            CloseReason::PacketTooLarge => "packet larger than the maximum packet size",
            CloseReason::SlowConsumer => "outbound queue full",
            CloseReason::TakenOver => "another connection took over the session",
            CloseReason::Shutdown => "server shutting down",
            CloseReason::ConnectRefused => "connect refused",
            CloseReason::Handshake => "no CONNECT in time",
            CloseReason::Storage => "the broker could not store what the packet asked for",
        }
    }

    /// Does the server publish the connection's Will when it ends this way?
    pub fn sends_will(self) -> bool {
        !matches!(
            self,
            CloseReason::ClientDisconnect | CloseReason::Shutdown | CloseReason::TakenOver
        )
    }
}

/// Why a message was not delivered to a session (`saguin_dropped_messages_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The session's queue was at `max_queued_messages`, or the message
    /// would take it past `max_queued_bytes`.
    QueueFull,
    /// Its message expiry interval passed while queued.
    Expired,
    /// Larger than the client's maximum packet size.
    TooLarge,
    /// QoS 0 for a session without a connection.
    Offline,
    /// The receiving connection was too slow and was closed.
    SlowConsumer,
    /// An inbound QoS 2 publish its publisher did not release (PUBREL)
    /// within `broker.exactly_once.expires_after`, or before its session ended: a
    /// broadcast one was routed already, one into a channel never becomes
    /// a record.
    ExactlyOnceExpired,
    /// A QoS 0 publish whose retained value or log entry could not be
    /// stored (QoS 1/2 publishers are told with a reason code instead).
    StorageFailed,
}

impl DropReason {
    pub const ALL: [DropReason; 7] = [
        DropReason::QueueFull,
        DropReason::Expired,
        DropReason::TooLarge,
        DropReason::Offline,
        DropReason::SlowConsumer,
        DropReason::ExactlyOnceExpired,
        DropReason::StorageFailed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::Expired => "expired",
            DropReason::TooLarge => "too_large",
            DropReason::Offline => "offline_qos0",
            DropReason::SlowConsumer => "slow_consumer",
            DropReason::ExactlyOnceExpired => "exactly_once_expired",
            DropReason::StorageFailed => "storage_failed",
        }
    }
}

/// The broker's counters and gauges.
#[derive(Debug)]
pub struct Metrics {
    pub connections: AtomicI64,
    /// Connections parked while their clients are quiet (`broker::parking`).
    pub connections_parked: AtomicI64,
    pub sessions: AtomicI64,
    pub subscriptions: AtomicI64,
    pub retained: AtomicI64,
    pub messages_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    dropped: [AtomicU64; DropReason::ALL.len()],
    disconnects: [AtomicU64; CloseReason::ALL.len()],
    /// Each provider's failures by kind (`saguin_storage_errors_total`)
    /// and its health (`saguin_provider_failed`, `saguin_provider_no_space`).
    providers: Mutex<BTreeMap<String, ProviderSeries>>,
    /// The append and latest channels' series, by channel name.
    channels: Mutex<BTreeMap<String, ChannelSeries>>,
    /// Every served channel's kind and provider (`saguin_channel_info`),
    /// by channel name.
    channel_info: Mutex<BTreeMap<String, ChannelInfo>>,
    /// The queue channels' series, by channel name.
    queues: Mutex<BTreeMap<String, QueueSeries>>,
    /// Reads of each channel's store for its consumers, by channel name
    /// (`saguin_channel_reads_total`): each its reader's to count.
    reads: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    /// Each configured bridge's counters, by name (`saguin_bridge_*`).
    bridges: Mutex<BTreeMap<String, Arc<BridgeMetrics>>>,
    /// Each memory provider's snapshot generations (`saguin_snapshot_*`).
    snapshots: Mutex<BTreeMap<String, Arc<SnapshotMetrics>>>,
    /// The longest an acknowledgement taken for writing (a flush of
    /// in-flight tables and cursors) waited for its commit, in
    /// microseconds (`saguin_ack_store_wait_seconds_max`).
    ack_store_wait_max_us: AtomicU64,
    /// The retention sweeps' counters, by [`RETENTION_SWEEPS`] index.
    retention: [SweepSeries; RETENTION_SWEEPS.len()],
    pub started: std::time::Instant,
    /// When the broker task last finished a turn of its loop, in
    /// milliseconds since `started`: `/healthz` answers from its age.
    heartbeat_ms: AtomicU64,
    /// True from the moment every listener accepts until the shutdown
    /// begins: `/readyz` answers 503 outside it.
    serving: AtomicBool,
    /// Steps forward of the system clock of a second or more the broker's
    /// receipt clock followed (`saguin_clock_steps_total`).
    pub clock_steps: AtomicU64,
    /// How far the receipt clock is ahead of the system clock, in
    /// milliseconds (`saguin_receipt_clock_ahead_seconds`).
    pub receipt_clock_ahead_ms: AtomicU64,
}

/// A served channel's kind and the provider holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelInfo {
    pub kind: saguin_format::model::ChannelKind,
    pub provider: String,
}

/// One provider's health as a scrape reads it: what `/readyz` answers from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderHealth {
    pub provider: String,
    pub health: Health,
}

/// The two retention sweeps, as `saguin_retention_*{sweep}` labels them.
pub const RETENTION_SWEEPS: [&str; 2] = ["size", "age"];

/// One retention sweep's counters (`saguin_retention_*`).
#[derive(Debug, Default)]
struct SweepSeries {
    passes: AtomicU64,
    removed_records: AtomicU64,
    removed_bytes: AtomicU64,
    /// Nanoseconds: every pass together, the last and the longest.
    total_nanos: AtomicU64,
    last_nanos: AtomicU64,
    max_nanos: AtomicU64,
}

/// What is rendered for one provider.
#[derive(Default)]
struct ProviderSeries {
    /// By [`FaultKind`] as an index.
    errors: [u64; FaultKind::ALL.len()],
    view: Option<ProviderView>,
}

impl std::fmt::Debug for ProviderSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderSeries")
            .field("errors", &self.errors)
            .finish()
    }
}

/// What is rendered for one channel: its store's counters, read at each
/// scrape, and what the broker reports about its consumers.
#[derive(Clone, Default)]
struct ChannelSeries {
    /// Set by [`Metrics::register_channel`]; a channel only reported on
    /// (a gap, a lag) before it was registered has none yet.
    store: Option<ChannelView>,
    /// `saguin_consumer_gap_total`.
    gaps: u64,
    /// `saguin_consumer_lag`.
    lag: u64,
}

impl std::fmt::Debug for ChannelSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelSeries")
            .field("store", &self.store.as_ref().map(|s| s.name().to_owned()))
            .field("gaps", &self.gaps)
            .field("lag", &self.lag)
            .finish()
    }
}

/// A channel's counters as read for one scrape.
struct ChannelSample {
    name: String,
    counters: Option<[u64; 4]>,
    gaps: u64,
    lag: u64,
}

/// The per-channel gauges read from the store, in the order of
/// [`ChannelSample::counters`].
const CHANNEL_GAUGES: [(&str, &str); 4] = [
    (
        "saguin_channel_records",
        "Records an append channel holds; topics holding a value in a latest channel.",
    ),
    (
        "saguin_channel_bytes",
        "Bytes a channel's records count for (what an append channel's retention_bytes and max_bytes bound).",
    ),
    (
        "saguin_channel_next",
        "The offset a channel's next record (a latest channel's next change) takes.",
    ),
    (
        "saguin_channel_floor",
        "The oldest offset of a channel that can still be read; retention raises it.",
    ),
];

/// A label value as the Prometheus text format requires: backslash,
/// double quote and line feed escaped.
pub(super) fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            connections: AtomicI64::new(0),
            connections_parked: AtomicI64::new(0),
            sessions: AtomicI64::new(0),
            subscriptions: AtomicI64::new(0),
            retained: AtomicI64::new(0),
            messages_received: AtomicU64::new(0),
            messages_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            dropped: Default::default(),
            disconnects: Default::default(),
            providers: Default::default(),
            reads: Default::default(),
            snapshots: Default::default(),
            channels: Default::default(),
            queues: Default::default(),
            bridges: Default::default(),
            ack_store_wait_max_us: AtomicU64::new(0),
            retention: Default::default(),
            started: std::time::Instant::now(),
            heartbeat_ms: AtomicU64::new(0),
            serving: AtomicBool::new(false),
            channel_info: Default::default(),
            clock_steps: AtomicU64::new(0),
            receipt_clock_ahead_ms: AtomicU64::new(0),
        }
    }

    /// The broker task finished a turn of its loop now.
    pub fn heartbeat(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.heartbeat_ms.fetch_max(ms, Relaxed);
    }

    /// When the broker task last finished a turn (the start until its
    /// first).
    pub fn last_heartbeat(&self) -> std::time::Instant {
        self.started + std::time::Duration::from_millis(self.heartbeat_ms.load(Relaxed))
    }

    /// Every listener accepts (true), or the shutdown has begun (false).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Relaxed);
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(Relaxed)
    }

    /// Each registered provider's health, read from it now, by name.
    pub fn provider_health(&self) -> Vec<ProviderHealth> {
        let views: Vec<(String, Option<ProviderView>)> = lock(&self.providers)
            .iter()
            .map(|(name, p)| (name.clone(), p.view.clone()))
            .collect();
        // Read outside the lock: a provider answers from its own.
        views
            .into_iter()
            .map(|(provider, view)| ProviderHealth {
                provider,
                health: view.map_or(Health::Writing, |v| v.health()),
            })
            .collect()
    }

    /// Names a served channel's kind and provider (`saguin_channel_info`).
    pub fn register_channel_info(&self, name: &str, info: ChannelInfo) {
        lock(&self.channel_info).insert(name.to_owned(), info);
    }

    pub fn dropped(&self, reason: DropReason) {
        self.dropped_many(reason, 1);
    }

    pub fn dropped_many(&self, reason: DropReason, count: u64) {
        self.dropped[reason as usize].fetch_add(count, Relaxed);
    }

    pub fn dropped_count(&self, reason: DropReason) -> u64 {
        self.dropped[reason as usize].load(Relaxed)
    }

    pub fn disconnected(&self, reason: CloseReason) {
        self.disconnects[reason as usize].fetch_add(1, Relaxed);
    }

    pub fn disconnect_count(&self, reason: CloseReason) -> u64 {
        self.disconnects[reason as usize].load(Relaxed)
    }

    /// A flush of acknowledgements committed `waited` after it was taken
    /// for writing.
    pub fn acknowledgements_stored(&self, waited: std::time::Duration) {
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.ack_store_wait_max_us.fetch_max(micros, Relaxed);
    }

    /// The longest wait [`Metrics::acknowledgements_stored`] has seen.
    pub fn ack_store_wait_max(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.ack_store_wait_max_us.load(Relaxed))
    }

    /// A pass of the retention sweep `sweep` (one of [`RETENTION_SWEEPS`])
    /// took `took` and removed `records` records of `bytes` bytes over
    /// every channel it swept.
    pub fn retention_swept(
        &self,
        sweep: &str,
        took: std::time::Duration,
        records: u64,
        bytes: u64,
    ) {
        let Some(i) = RETENTION_SWEEPS.iter().position(|s| *s == sweep) else {
            return;
        };
        let series = &self.retention[i];
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        series.passes.fetch_add(1, Relaxed);
        series.removed_records.fetch_add(records, Relaxed);
        series.removed_bytes.fetch_add(bytes, Relaxed);
        series.total_nanos.fetch_add(nanos, Relaxed);
        series.last_nanos.store(nanos, Relaxed);
        series.max_nanos.fetch_max(nanos, Relaxed);
    }

    /// Registers a memory provider's snapshot metrics, rendered at every
    /// scrape.
    pub fn register_snapshots(&self, provider: &str, metrics: Arc<SnapshotMetrics>) {
        lock(&self.snapshots).insert(provider.to_owned(), metrics);
    }

    /// A storage operation on `provider` failed with `kind` (a write, a
    /// read, a sweep, a snapshot: whatever was counted as failing).
    pub fn storage_error(&self, provider: &str, kind: FaultKind) {
        let mut providers = lock(&self.providers);
        let series = providers.entry(provider.to_owned()).or_default();
        series.errors[kind as usize] += 1;
    }

    /// Failures of `provider` so far, of every kind.
    pub fn storage_error_count(&self, provider: &str) -> u64 {
        lock(&self.providers)
            .get(provider)
            .map_or(0, |p| p.errors.iter().sum())
    }

    /// Failures of `provider` of `kind` so far.
    pub fn storage_error_count_of(&self, provider: &str, kind: FaultKind) -> u64 {
        lock(&self.providers)
            .get(provider)
            .map_or(0, |p| p.errors[kind as usize])
    }

    /// Names a provider so its series are rendered (its error counters as
    /// 0) before it ever fails, its gauges and health read from `view` at
    /// each scrape. A provider closed and dropped reads as writing.
    pub fn register_provider(&self, provider: &str, view: ProviderView) {
        lock(&self.providers)
            .entry(provider.to_owned())
            .or_default()
            .view = Some(view);
    }

    /// Names a served channel whose counters are read from its store at
    /// each scrape: an append or a latest channel's
    /// `saguin_channel_records` (a latest channel's topics holding a
    /// value), `_bytes`, `_next`, `_floor`, with its
    /// `saguin_consumer_gap_total` and `saguin_consumer_lag` rendered (as
    /// 0) from now on; a queue's `saguin_queue_depth`, with its other
    /// `saguin_queue_*` counters. Registering a name again replaces its
    /// store and keeps its counts.
    pub fn register_channel(&self, name: &str, view: ChannelView) {
        if view.kind() == saguin_format::model::ChannelKind::Queue {
            self.queue_series(name, |q| q.store = Some(view));
            return;
        }
        lock(&self.channels)
            .entry(name.to_owned())
            .or_default()
            .store = Some(view);
    }

    /// The counters of bridge `name`, registered (and rendered from then
    /// on) at its first call.
    pub fn bridge(&self, name: &str) -> std::sync::Arc<BridgeMetrics> {
        let mut bridges = self
            .bridges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        bridges.entry(name.to_owned()).or_default().clone()
    }

    /// A consumer of `channel` was told of a gap (`saguin_consumer_gap_total`).
    pub fn consumer_gap(&self, channel: &str) {
        lock(&self.channels)
            .entry(channel.to_owned())
            .or_default()
            .gaps += 1;
    }

    /// The count of reads of `channel` made for its consumers
    /// (`saguin_channel_reads_total`), for its reader to add to without a
    /// lock or a look-up: a series from the start, so a rate has one
    /// before the first read.
    pub fn channel_reads(&self, channel: &str) -> Arc<AtomicU64> {
        lock(&self.reads)
            .entry(channel.to_owned())
            .or_default()
            .clone()
    }

    /// Reads of `channel` made so far.
    pub fn channel_read_count(&self, channel: &str) -> u64 {
        lock(&self.reads)
            .get(channel)
            .map_or(0, |n| n.load(Relaxed))
    }

    /// Gaps consumers of `channel` were told of so far.
    pub fn consumer_gap_count(&self, channel: &str) -> u64 {
        lock(&self.channels).get(channel).map_or(0, |c| c.gaps)
    }

    /// The most records any consumer of `channel` is behind
    /// (`saguin_consumer_lag`).
    pub fn set_consumer_lag(&self, channel: &str, lag: u64) {
        lock(&self.channels)
            .entry(channel.to_owned())
            .or_default()
            .lag = lag;
    }

    /// Every channel's series, the stores read outside the lock so a
    /// scrape never holds a publisher's report up behind a store.
    fn channel_samples(&self) -> Vec<ChannelSample> {
        let series: Vec<(String, ChannelSeries)> = lock(&self.channels)
            .iter()
            .map(|(name, c)| (name.clone(), c.clone()))
            .collect();
        series
            .into_iter()
            .map(|(name, c)| ChannelSample {
                name: escape_label(&name),
                counters: c.store.and_then(|s| s.counters()).map(|c| {
                    // The order of CHANNEL_GAUGES.
                    [c.records, c.bytes, c.next, c.floor]
                }),
                gaps: c.gaps,
                lag: c.lag,
            })
            .collect()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        let gauge = |out: &mut String, name: &str, help: &str, value: i64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        gauge(
            &mut out,
            "saguin_connections",
            "Connected MQTT clients.",
            self.connections.load(Relaxed),
        );
        gauge(
            &mut out,
            "saguin_connections_parked",
            "Connected clients quiet long enough that their connections wait without a task of their own.",
            self.connections_parked.load(Relaxed),
        );
        gauge(
            &mut out,
            "saguin_sessions",
            "Sessions, connected or not.",
            self.sessions.load(Relaxed),
        );
        gauge(
            &mut out,
            "saguin_subscriptions",
            "Subscriptions of all sessions.",
            self.subscriptions.load(Relaxed),
        );
        gauge(
            &mut out,
            "saguin_retained_messages",
            "Retained messages.",
            self.retained.load(Relaxed),
        );
        counter(
            &mut out,
            "saguin_messages_received_total",
            "PUBLISH packets received from clients.",
            self.messages_received.load(Relaxed),
        );
        counter(
            &mut out,
            "saguin_messages_sent_total",
            "PUBLISH packets sent to clients ($SYS excluded).",
            self.messages_sent.load(Relaxed),
        );
        counter(
            &mut out,
            "saguin_bytes_received_total",
            "Bytes read from client connections.",
            self.bytes_received.load(Relaxed),
        );
        counter(
            &mut out,
            "saguin_bytes_sent_total",
            "Bytes written to client connections.",
            self.bytes_sent.load(Relaxed),
        );
        let _ = writeln!(out, "# HELP saguin_dropped_messages_total Messages not delivered to a session, by reason.\n# TYPE saguin_dropped_messages_total counter");
        for reason in DropReason::ALL {
            let _ = writeln!(
                out,
                "saguin_dropped_messages_total{{reason=\"{}\"}} {}",
                reason.label(),
                self.dropped_count(reason)
            );
        }
        let _ = writeln!(out, "# HELP saguin_disconnects_total Connections ended, by reason.\n# TYPE saguin_disconnects_total counter");
        for reason in CloseReason::ALL {
            let _ = writeln!(
                out,
                "saguin_disconnects_total{{reason=\"{}\"}} {}",
                reason.label(),
                self.disconnect_count(reason)
            );
        }
        let _ = writeln!(
            out,
            "# HELP saguin_ack_store_wait_seconds_max The longest, since the broker started, that acknowledgements, in-flight tables and cursors taken for writing (every broker.session.ack_commit_interval) waited for their commit.\n# TYPE saguin_ack_store_wait_seconds_max gauge\nsaguin_ack_store_wait_seconds_max {:.6}",
            self.ack_store_wait_max().as_secs_f64()
        );
        self.render_providers(&mut out);
        let channels = self.channel_samples();
        for (i, (name, help)) in CHANNEL_GAUGES.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for c in &channels {
                if let Some(counters) = c.counters {
                    let _ = writeln!(out, "{name}{{channel=\"{}\"}} {}", c.name, counters[i]);
                }
            }
        }
        let _ = writeln!(out, "# HELP saguin_consumer_gap_total Gaps consumers of a channel were told of: records retention removed before they were delivered.\n# TYPE saguin_consumer_gap_total counter");
        for c in &channels {
            let _ = writeln!(
                out,
                "saguin_consumer_gap_total{{channel=\"{}\"}} {}",
                c.name, c.gaps
            );
        }
        let _ = writeln!(out, "# HELP saguin_consumer_lag The most records any consumer of a channel is behind its next offset.\n# TYPE saguin_consumer_lag gauge");
        for c in &channels {
            let _ = writeln!(
                out,
                "saguin_consumer_lag{{channel=\"{}\"}} {}",
                c.name, c.lag
            );
        }
        let reads: Vec<(String, u64)> = lock(&self.reads)
            .iter()
            .map(|(name, n)| (escape_label(name), n.load(Relaxed)))
            .collect();
        let _ = writeln!(out, "# HELP saguin_channel_reads_total Reads of a channel's store for its consumers: a window of records each, one for every consumer at the same place (a memory channel's are lookups in memory, a sqlite channel's are read transactions).\n# TYPE saguin_channel_reads_total counter");
        for (channel, n) in &reads {
            let _ = writeln!(
                out,
                "saguin_channel_reads_total{{channel=\"{channel}\"}} {n}"
            );
        }
        let info: Vec<(String, ChannelInfo)> = lock(&self.channel_info)
            .iter()
            .map(|(name, info)| (escape_label(name), info.clone()))
            .collect();
        let _ = writeln!(out, "# HELP saguin_channel_info Every channel served, with its kind (append, latest, queue; a queue's dead-letter channel is an append channel) and the provider holding it; always 1.\n# TYPE saguin_channel_info gauge");
        for (channel, info) in &info {
            let _ = writeln!(
                out,
                "saguin_channel_info{{channel=\"{channel}\",kind=\"{}\",provider=\"{}\"}} 1",
                info.kind.as_str(),
                escape_label(&info.provider)
            );
        }
        self.render_queues(&mut out);
        self.render_bridges(&mut out);
        render_snapshots(&mut out, &lock(&self.snapshots));
        self.render_retention(&mut out);
        counter(
            &mut out,
            "saguin_clock_steps_total",
            "Steps forward of a second or more of the system clock that the broker's receipt clock (the time records are stamped with) followed.",
            self.clock_steps.load(Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP saguin_receipt_clock_ahead_seconds How far the broker's receipt clock is ahead of the system clock: 0 but after the system clock was set back while the broker ran, or started behind the last time the storage was in use.\n# TYPE saguin_receipt_clock_ahead_seconds gauge\nsaguin_receipt_clock_ahead_seconds {:.3}",
            self.receipt_clock_ahead_ms.load(Relaxed) as f64 / 1000.0
        );
        counter(
            &mut out,
            "saguin_uptime_seconds",
            "Seconds since the broker started.",
            self.started.elapsed().as_secs(),
        );
        out
    }
}

impl Metrics {
    /// `saguin_retention_*{sweep}`, both sweeps (0 included, as for a
    /// broker whose channels configure no bound).
    fn render_retention(&self, out: &mut String) {
        type Sample = fn(&SweepSeries) -> String;
        let families: [(&str, &str, &str, Sample); 6] = [
            ("saguin_retention_sweeps_total", "counter", "Passes of a retention sweep (size: every second over the append channels with a retention_bytes and the latest channels with a retention_deletions; age: over those with a retention_age).",
                |s| s.passes.load(Relaxed).to_string()),
            ("saguin_retention_removed_records_total", "counter", "Records retention removed from the front of append channels, and deletion markers it forgot in latest channels.",
                |s| s.removed_records.load(Relaxed).to_string()),
            ("saguin_retention_removed_bytes_total", "counter", "Bytes of the records and markers retention removed.",
                |s| s.removed_bytes.load(Relaxed).to_string()),
            ("saguin_retention_sweep_seconds_total", "counter", "Time the retention sweeps took, off the broker's loop: its rate is the share of a core they cost.",
                |s| format!("{:.6}", s.total_nanos.load(Relaxed) as f64 / 1e9)),
            ("saguin_retention_sweep_seconds", "gauge", "How long the last pass of a retention sweep took.",
                |s| format!("{:.6}", s.last_nanos.load(Relaxed) as f64 / 1e9)),
            ("saguin_retention_sweep_seconds_max", "gauge", "The longest pass of a retention sweep since the broker started.",
                |s| format!("{:.6}", s.max_nanos.load(Relaxed) as f64 / 1e9)),
        ];
        for (name, kind, help, sample) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (sweep, series) in RETENTION_SWEEPS.iter().zip(&self.retention) {
                let _ = writeln!(out, "{name}{{sweep=\"{sweep}\"}} {}", sample(series));
            }
        }
    }

    /// `saguin_storage_errors_total{provider,kind}`, every kind of every
    /// provider (0 included, so a rate has a series before the first
    /// failure), the two health gauges, and each provider's kind, bytes and
    /// bound, read from each provider now.
    fn render_providers(&self, out: &mut String) {
        let views: Vec<ProviderViewed> = lock(&self.providers)
            .iter()
            .map(|(name, p)| (name.clone(), p.errors, p.view.clone()))
            .collect();
        // Read outside the lock: a provider answers from its own.
        let providers: Vec<ProviderSample> = views
            .into_iter()
            .map(|(name, errors, view)| {
                let gauges = view.and_then(|v| v.read());
                ProviderSample {
                    name: escape_label(&name),
                    errors,
                    health: gauges
                        .as_ref()
                        .map_or(Health::Writing, |g| g.health.clone()),
                    kind: gauges.as_ref().map(|g| g.kind),
                    bytes: gauges.as_ref().map(|g| g.bytes),
                    max_bytes: gauges.as_ref().and_then(|g| g.max_bytes),
                    checkpoint_room: gauges.as_ref().and_then(|g| g.checkpoint_room),
                }
            })
            .collect();
        let _ = writeln!(out, "# HELP saguin_storage_errors_total Storage operations that failed, by provider and kind: full (a configured max_bytes), no_space (the file system: ENOSPC, EDQUOT, EFBIG), io (EIO), read_only (EROFS), fsync (a failed fsync), snapshot (a memory provider's snapshot not written), other.\n# TYPE saguin_storage_errors_total counter");
        for p in &providers {
            for kind in FaultKind::ALL {
                let _ = writeln!(
                    out,
                    "saguin_storage_errors_total{{provider=\"{}\",kind=\"{}\"}} {}",
                    p.name,
                    kind.label(),
                    p.errors[kind as usize]
                );
            }
        }
        let _ = writeln!(out, "# HELP saguin_provider_failed 1 while a provider refuses every write until a restart (an I/O error, a failed fsync or a read-only file system met it), else 0.\n# TYPE saguin_provider_failed gauge");
        for p in &providers {
            let _ = writeln!(
                out,
                "saguin_provider_failed{{provider=\"{}\"}} {}",
                p.name,
                u8::from(matches!(p.health, Health::Failed { .. }))
            );
        }
        let _ = writeln!(out, "# HELP saguin_provider_no_space 1 while the file system under a provider has had no room for its last write that needed some, else 0.\n# TYPE saguin_provider_no_space gauge");
        for p in &providers {
            let _ = writeln!(
                out,
                "saguin_provider_no_space{{provider=\"{}\"}} {}",
                p.name,
                u8::from(p.health == Health::NoSpace)
            );
        }
        let _ = writeln!(out, "# HELP saguin_provider_info Every storage provider the broker uses, with its kind (memory, sqlite); always 1.\n# TYPE saguin_provider_info gauge");
        for p in &providers {
            if let Some(kind) = p.kind {
                let kind = match kind {
                    ProviderKind::Memory => "memory",
                    ProviderKind::Sqlite => "sqlite",
                };
                let _ = writeln!(
                    out,
                    "saguin_provider_info{{provider=\"{}\",kind=\"{kind}\"}} 1",
                    p.name
                );
            }
        }
        // The gauges a provider has or lacks (unbounded, no room): each
        // with its help, and a sample for every provider that has it.
        type Pick = fn(&ProviderSample) -> Option<u64>;
        let optional: [(&str, &str, Pick); 4] = [
            ("saguin_provider_bytes", "Bytes counted against a provider's max_bytes: a memory provider's records, a sqlite provider's pages.", |p| p.bytes),
            ("saguin_provider_max_bytes", "A provider's configured max_bytes; publishes are refused (0x97) once they would take its last reserve bytes. Absent when the provider is unbounded.", |p| p.max_bytes),
            ("saguin_provider_checkpoint_room_bytes", "The room a sqlite provider keeps allocated beside its database for the checkpoint that finds its file system full: checkpoint_room while whole, more while it grows with what a write-ahead log another process's reader keeps from being copied adds beyond the database, less while given up in part or whole (the provider then keeps at most what it holds), 0 before it first fits. Absent for a provider that keeps none.", |p| p.checkpoint_room.map(|r| r.kept_bytes)),
            ("saguin_provider_held_to_disk", "1 while a sqlite provider keeps at most what it held when its file system filled (publishes beyond refused with 0x83; removals make room for them), until its checkpoint's room is taken back whole, or at most what its checkpoint's room covers while another process's reader keeps its write-ahead log from being copied, else 0. Absent for a provider that keeps no room.", |p| p.checkpoint_room.map(|r| u64::from(r.held_to_disk))),
        ];
        for (name, help, pick) in optional {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for p in &providers {
                if let Some(value) = pick(p) {
                    let _ = writeln!(out, "{name}{{provider=\"{}\"}} {value}", p.name);
                }
            }
        }
    }
}

/// A provider's failures, by [`FaultKind`] as an index.
type ProviderErrors = [u64; FaultKind::ALL.len()];

/// A provider's name, failures and view, copied out of the lock before
/// the provider is read.
type ProviderViewed = (String, ProviderErrors, Option<ProviderView>);

/// One provider as one scrape reads it.
struct ProviderSample {
    /// Escaped for a label.
    name: String,
    errors: ProviderErrors,
    health: Health,
    /// `None` once the provider was closed and dropped.
    kind: Option<ProviderKind>,
    bytes: Option<u64>,
    max_bytes: Option<u64>,
    checkpoint_room: Option<crate::storage::contract::CheckpointRoom>,
}

/// What the broker exports about one provider's snapshots.
#[derive(Debug, Default)]
pub struct SnapshotMetrics {
    /// The generation the directory holds.
    pub generation: AtomicU64,
    /// Its moment, unix nanoseconds (0: none yet).
    pub captured_at: AtomicU64,
    /// Files written, and files that failed, since the start.
    pub files_written: AtomicU64,
    pub failures: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Generations committed since the start.
    pub generations: AtomicU64,
    /// The last capture's and the last write's duration, nanoseconds.
    pub last_capture_nanos: AtomicU64,
    pub last_write_nanos: AtomicU64,
    /// The longest capture and the longest write since the start,
    /// nanoseconds.
    pub max_capture_nanos: AtomicU64,
    pub max_write_nanos: AtomicU64,
    /// Unix nanoseconds of the oldest change no committed generation holds
    /// (0: every change is in the current generation). Kept by the broker
    /// task for providers written in the background.
    pub unsaved_since: AtomicU64,
    /// True for a provider whose generations are written in the
    /// background: only its `saguin_snapshot_unsaved_seconds` is rendered
    /// (one written at shutdown only holds nothing of what a crash loses).
    pub background: AtomicBool,
    /// What of the snapshot room is allocated, plus one (0: the provider
    /// keeps none), as the last generation left it.
    room_kept_plus_one: AtomicU64,
}

impl SnapshotMetrics {
    /// What of the snapshot room is allocated now.
    pub(super) fn set_room(&self, kept: u64) {
        self.room_kept_plus_one
            .store(kept.saturating_add(1), Relaxed);
    }

    /// What of the snapshot room is allocated; `None` for a provider that
    /// keeps none.
    fn room(&self) -> Option<u64> {
        self.room_kept_plus_one.load(Relaxed).checked_sub(1)
    }

    pub(super) fn set_committed(&self, generation: u64, captured_at: i64) {
        self.generation.store(generation, Relaxed);
        self.captured_at
            .store(u64::try_from(captured_at).unwrap_or(0), Relaxed);
    }
}

/// The `saguin_snapshot_*` families, one series per provider.
fn render_snapshots(out: &mut String, providers: &BTreeMap<String, Arc<SnapshotMetrics>>) {
    let now = crate::storage::contract::now_nanos();
    type Sample = fn(&SnapshotMetrics, i64) -> String;
    let families: [(&str, &str, &str, Sample); 10] = [
        ("saguin_snapshot_generation", "gauge", "The snapshot generation the provider's directory holds.",
            |m, _| m.generation.load(Relaxed).to_string()),
        ("saguin_snapshot_age_seconds", "gauge", "How old the state the current snapshot generation holds is; it grows while nothing changes (saguin_snapshot_unsaved_seconds is what a crash would lose). -1 with no generation yet.",
            |m, now| match m.captured_at.load(Relaxed) {
                0 => "-1".to_owned(),
                at => format!("{:.3}", (now.saturating_sub(at as i64)).max(0) as f64 / 1e9),
            }),
        ("saguin_snapshot_generations_total", "counter", "Snapshot generations committed since the broker started.",
            |m, _| m.generations.load(Relaxed).to_string()),
        ("saguin_snapshot_files_written_total", "counter", "Snapshot files written since the broker started.",
            |m, _| m.files_written.load(Relaxed).to_string()),
        ("saguin_snapshot_bytes_written_total", "counter", "Bytes of snapshot files written since the broker started.",
            |m, _| m.bytes_written.load(Relaxed).to_string()),
        ("saguin_snapshot_failures_total", "counter", "Snapshot files (and manifests) that could not be written; each leaves the previous generation's file current.",
            |m, _| m.failures.load(Relaxed).to_string()),
        ("saguin_snapshot_capture_seconds", "gauge", "How long the broker's loop spent capturing the last generation's state.",
            |m, _| format!("{:.6}", m.last_capture_nanos.load(Relaxed) as f64 / 1e9)),
        ("saguin_snapshot_capture_seconds_max", "gauge", "The longest the broker's loop spent capturing a generation's state since it started.",
            |m, _| format!("{:.6}", m.max_capture_nanos.load(Relaxed) as f64 / 1e9)),
        ("saguin_snapshot_write_seconds", "gauge", "How long the last generation took to write, off the broker's loop.",
            |m, _| format!("{:.6}", m.last_write_nanos.load(Relaxed) as f64 / 1e9)),
        ("saguin_snapshot_write_seconds_max", "gauge", "The longest a generation took to write since the broker started: with snapshot_max_delay, the crash window.",
            |m, _| format!("{:.6}", m.max_write_nanos.load(Relaxed) as f64 / 1e9)),
    ];
    for (name, kind, help, sample) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (provider, m) in providers {
            let _ = writeln!(
                out,
                "{name}{{provider=\"{}\"}} {}",
                escape_label(provider),
                sample(m, now)
            );
        }
    }
    let _ = writeln!(out, "# HELP saguin_snapshot_room_bytes What of a memory provider's snapshot room is allocated: snapshot_room while whole, less while given up to a generation that found the file system full, before it is first taken (after a generation) and while it does not fit. Only for providers that keep one.\n# TYPE saguin_snapshot_room_bytes gauge");
    for (provider, m) in providers {
        if let Some(kept) = m.room() {
            let _ = writeln!(
                out,
                "saguin_snapshot_room_bytes{{provider=\"{}\"}} {kept}",
                escape_label(provider)
            );
        }
    }
    let _ = writeln!(out, "# HELP saguin_snapshot_unsaved_seconds How long the oldest change no committed snapshot generation holds has waited: what a crash now would lose. 0 when the current generation holds every change. Only for providers written in the background.\n# TYPE saguin_snapshot_unsaved_seconds gauge");
    for (provider, m) in providers {
        if !m.background.load(Relaxed) {
            continue;
        }
        let seconds = match m.unsaved_since.load(Relaxed) {
            0 => 0.0,
            at => now.saturating_sub(at as i64).max(0) as f64 / 1e9,
        };
        let _ = writeln!(
            out,
            "saguin_snapshot_unsaved_seconds{{provider=\"{}\"}} {seconds:.3}",
            escape_label(provider)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_metrics_render_one_series_per_provider_with_its_label_escaped() {
        let m = Arc::new(SnapshotMetrics::default());
        m.set_committed(7, crate::storage::contract::now_nanos() - 1_500_000_000);
        m.failures.fetch_add(2, Relaxed);
        let mut providers = BTreeMap::new();
        providers.insert("m\"1".to_owned(), m);
        let mut out = String::new();
        render_snapshots(&mut out, &providers);
        assert!(
            out.contains("saguin_snapshot_generation{provider=\"m\\\"1\"} 7"),
            "{out}"
        );
        assert!(
            out.contains("saguin_snapshot_failures_total{provider=\"m\\\"1\"} 2"),
            "{out}"
        );
        let age: f64 = out
            .lines()
            .find(|l| l.starts_with("saguin_snapshot_age_seconds{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!((1.5..60.0).contains(&age), "{age}");
        assert!(out.contains("# TYPE saguin_snapshot_capture_seconds_max gauge"));
    }
    use crate::storage::contract::{AppendStore, ChannelStore, Provider};
    use crate::storage::memory::{MemoryConfig, MemoryProvider};
    use saguin_format::model::{ChannelKind, Record};

    fn append(provider: &MemoryProvider, name: &str) -> Arc<dyn AppendStore> {
        provider
            .open_channel(name, ChannelKind::Append)
            .expect("open")
            .as_append()
            .expect("append")
            .clone()
    }

    /// What the broker registers for an append store.
    fn view(store: &Arc<dyn AppendStore>) -> ChannelView {
        ChannelView::of(&ChannelStore::Append(store.clone()))
    }

    /// The lines of `text` that are samples of `family` (not HELP/TYPE).
    fn samples<'a>(text: &'a str, family: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| {
                l.starts_with(&format!("{family}{{")) || l.starts_with(&format!("{family} "))
            })
            .collect()
    }

    #[test]
    fn a_registered_channel_is_rendered_from_its_store_at_each_scrape() {
        let provider = MemoryProvider::unbounded();
        let store = append(&provider, "telemetry");
        let metrics = Metrics::new();
        metrics.register_channel("telemetry", view(&store));
        let text = metrics.render();
        for (family, kind) in [
            ("saguin_channel_records", "gauge"),
            ("saguin_channel_bytes", "gauge"),
            ("saguin_channel_next", "gauge"),
            ("saguin_channel_floor", "gauge"),
            ("saguin_consumer_gap_total", "counter"),
            ("saguin_consumer_lag", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# HELP {family} ")),
                "{family}: {text}"
            );
            assert!(
                text.contains(&format!("# TYPE {family} {kind}\n")),
                "{family}: {text}"
            );
        }
        assert_eq!(
            samples(&text, "saguin_channel_records"),
            ["saguin_channel_records{channel=\"telemetry\"} 0"]
        );
        assert_eq!(
            samples(&text, "saguin_channel_next"),
            ["saguin_channel_next{channel=\"telemetry\"} 1"]
        );
        assert_eq!(
            samples(&text, "saguin_consumer_gap_total"),
            ["saguin_consumer_gap_total{channel=\"telemetry\"} 0"]
        );
        assert_eq!(
            samples(&text, "saguin_consumer_lag"),
            ["saguin_consumer_lag{channel=\"telemetry\"} 0"]
        );

        for i in 0..3 {
            store
                .append(Record::new("telemetry", format!("r{i}")))
                .unwrap();
        }
        store.trim(2, None).unwrap();
        metrics.consumer_gap("telemetry");
        metrics.consumer_gap("telemetry");
        metrics.set_consumer_lag("telemetry", 7);
        metrics.set_consumer_lag("telemetry", 2);
        let text = metrics.render();
        assert_eq!(
            samples(&text, "saguin_channel_records"),
            ["saguin_channel_records{channel=\"telemetry\"} 2"]
        );
        assert_eq!(
            samples(&text, "saguin_channel_bytes"),
            [format!(
                "saguin_channel_bytes{{channel=\"telemetry\"}} {}",
                store.bytes()
            )]
        );
        assert_eq!(
            samples(&text, "saguin_channel_next"),
            ["saguin_channel_next{channel=\"telemetry\"} 4"]
        );
        assert_eq!(
            samples(&text, "saguin_channel_floor"),
            ["saguin_channel_floor{channel=\"telemetry\"} 2"]
        );
        assert_eq!(
            samples(&text, "saguin_consumer_gap_total"),
            ["saguin_consumer_gap_total{channel=\"telemetry\"} 2"]
        );
        assert_eq!(
            samples(&text, "saguin_consumer_lag"),
            ["saguin_consumer_lag{channel=\"telemetry\"} 2"],
            "a gauge: the last value set"
        );
        assert_eq!(metrics.consumer_gap_count("telemetry"), 2);
    }

    #[test]
    fn channels_render_in_name_order_and_only_registered_ones_have_store_gauges() {
        let provider = MemoryProvider::unbounded();
        let metrics = Metrics::new();
        metrics.register_channel("b", view(&append(&provider, "b")));
        metrics.register_channel("a", view(&append(&provider, "a")));
        // Reported on before any registration: counted, no store to read.
        metrics.consumer_gap("unregistered");
        let text = metrics.render();
        assert_eq!(
            samples(&text, "saguin_channel_floor"),
            [
                "saguin_channel_floor{channel=\"a\"} 1",
                "saguin_channel_floor{channel=\"b\"} 1"
            ]
        );
        assert_eq!(
            samples(&text, "saguin_consumer_gap_total"),
            [
                "saguin_consumer_gap_total{channel=\"a\"} 0",
                "saguin_consumer_gap_total{channel=\"b\"} 0",
                "saguin_consumer_gap_total{channel=\"unregistered\"} 1",
            ]
        );
    }

    #[test]
    fn label_values_are_escaped_as_the_text_format_requires() {
        assert_eq!(escape_label("plain"), "plain");
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("line\nfeed"), "line\\nfeed");
        let provider = MemoryProvider::unbounded();
        let metrics = Metrics::new();
        let name = "q\"uo\\te\nd";
        metrics.register_channel(name, view(&append(&provider, name)));
        metrics.storage_error("db\"2", FaultKind::Io);
        let text = metrics.render();
        assert!(
            text.contains("saguin_channel_next{channel=\"q\\\"uo\\\\te\\nd\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("saguin_storage_errors_total{provider=\"db\\\"2\",kind=\"io\"} 1"),
            "{text}"
        );
        assert!(
            text.lines()
                .all(|l| l.starts_with('#') || l.starts_with("saguin_")),
            "no sample spans two lines: {text}"
        );
    }

    #[test]
    fn providers_report_kind_bytes_and_bound_and_channels_their_kind() {
        let provider: Arc<dyn Provider> = MemoryProvider::new(MemoryConfig {
            name: "mem".into(),
            max_bytes: Some(1 << 20),
            reserve: 1024,
        })
        .unwrap();
        let devices = provider
            .open_channel("devices", ChannelKind::Latest)
            .unwrap();
        devices
            .as_latest()
            .unwrap()
            .set(Record::new("devices/d1", b"on".to_vec()))
            .unwrap();
        let metrics = Metrics::new();
        metrics.register_provider("mem", ProviderView::of(&provider));
        metrics.register_channel("devices", ChannelView::of(&devices));
        metrics.register_channel_info(
            "devices",
            ChannelInfo {
                kind: ChannelKind::Latest,
                provider: "mem".into(),
            },
        );
        let text = metrics.render();
        assert_eq!(
            samples(&text, "saguin_provider_info"),
            ["saguin_provider_info{provider=\"mem\",kind=\"memory\"} 1"]
        );
        assert_eq!(
            samples(&text, "saguin_provider_max_bytes"),
            ["saguin_provider_max_bytes{provider=\"mem\"} 1048576"]
        );
        assert_eq!(
            samples(&text, "saguin_provider_bytes"),
            [format!(
                "saguin_provider_bytes{{provider=\"mem\"}} {}",
                provider.bytes()
            )]
        );
        assert!(provider.bytes() > 0);
        assert_eq!(
            samples(&text, "saguin_channel_records"),
            ["saguin_channel_records{channel=\"devices\"} 1"]
        );
        assert_eq!(
            samples(&text, "saguin_channel_info"),
            ["saguin_channel_info{channel=\"devices\",kind=\"latest\",provider=\"mem\"} 1"]
        );
        assert_eq!(
            metrics.provider_health(),
            [ProviderHealth {
                provider: "mem".into(),
                health: Health::Writing
            }]
        );
    }

    #[test]
    fn without_channels_the_families_are_described_and_empty() {
        let text = Metrics::new().render();
        assert!(
            text.contains("# TYPE saguin_channel_records gauge\n"),
            "{text}"
        );
        assert!(samples(&text, "saguin_channel_records").is_empty());
        assert!(samples(&text, "saguin_consumer_gap_total").is_empty());
    }

    #[test]
    fn a_bridges_failures_are_counted_under_its_name_from_zero() {
        let metrics = Metrics::new();
        let cloud = metrics.bridge("cloud");
        metrics.bridge("edge");
        let text = metrics.render();
        assert!(
            text.contains("# TYPE saguin_bridge_failures_total counter\n"),
            "{text}"
        );
        assert_eq!(
            samples(&text, "saguin_bridge_failures_total"),
            [
                "saguin_bridge_failures_total{bridge=\"cloud\"} 0",
                "saguin_bridge_failures_total{bridge=\"edge\"} 0",
            ]
        );
        cloud.failures.fetch_add(1, Relaxed);
        let text = metrics.render();
        assert_eq!(
            samples(&text, "saguin_bridge_failures_total"),
            [
                "saguin_bridge_failures_total{bridge=\"cloud\"} 1",
                "saguin_bridge_failures_total{bridge=\"edge\"} 0",
            ]
        );
    }
}

/// What is rendered for one queue: its depth, read from the store at each
/// scrape, and what the broker counts of its deliveries.
#[derive(Clone, Default)]
struct QueueSeries {
    store: Option<ChannelView>,
    in_flight: u64,
    attempts: u64,
    lease_expired: u64,
    dead_lettered: u64,
}

/// One queue family: its name, type, help and how a series yields it.
type QueueFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&QueueSeries) -> Option<u64>,
);

impl std::fmt::Debug for QueueSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSeries")
            .field("in_flight", &self.in_flight)
            .field("attempts", &self.attempts)
            .field("dead_lettered", &self.dead_lettered)
            .finish()
    }
}

impl Metrics {
    fn queue_series(&self, channel: &str, change: impl FnOnce(&mut QueueSeries)) {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(queues.entry(channel.to_owned()).or_default());
    }

    /// Records of `channel` out with a worker now (`saguin_queue_in_flight`).
    pub fn set_queue_in_flight(&self, channel: &str, count: u64) {
        self.queue_series(channel, |q| q.in_flight = count);
    }

    /// A record of `channel` was leased: one attempt (`saguin_queue_attempts_total`).
    pub fn queue_attempt(&self, channel: &str) {
        self.queue_series(channel, |q| q.attempts += 1);
    }

    /// A lease of `channel` ran out (`saguin_queue_lease_expired_total`).
    pub fn queue_lease_expired(&self, channel: &str) {
        self.queue_series(channel, |q| q.lease_expired += 1);
    }

    /// A record of `channel` moved to its dead-letter channel
    /// (`saguin_queue_dead_lettered_total`).
    pub fn queue_dead_lettered(&self, channel: &str) {
        self.queue_series(channel, |q| q.dead_lettered += 1);
    }

    /// Dead-lettered records of `channel` so far.
    pub fn queue_dead_lettered_count(&self, channel: &str) -> u64 {
        self.queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(channel)
            .map_or(0, |q| q.dead_lettered)
    }

    fn render_queues(&self, out: &mut String) {
        // Copied out, so the stores are read outside the lock.
        let series: Vec<(String, QueueSeries)> = self
            .queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(n, q)| {
                (
                    n.replace('\\', "\\\\")
                        .replace('"', "\\\"")
                        .replace('\n', "\\n"),
                    q.clone(),
                )
            })
            .collect();
        let families: [QueueFamily; 5] = [
            (
                "saguin_queue_depth",
                "gauge",
                "Unresolved records a queue holds, out with a worker or not.",
                |q| q.store.as_ref().and_then(ChannelView::queue_depth),
            ),
            (
                "saguin_queue_in_flight",
                "gauge",
                "Records of a queue out with a worker now.",
                |q| Some(q.in_flight),
            ),
            (
                "saguin_queue_attempts_total",
                "counter",
                "Deliveries of a queue's records to workers, each an attempt.",
                |q| Some(q.attempts),
            ),
            (
                "saguin_queue_lease_expired_total",
                "counter",
                "Deliveries of a queue whose lease ran out before the worker answered.",
                |q| Some(q.lease_expired),
            ),
            (
                "saguin_queue_dead_lettered_total",
                "counter",
                "Records of a queue moved to its dead-letter channel.",
                |q| Some(q.dead_lettered),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (channel, q) in &series {
                if let Some(v) = value(q) {
                    let _ = writeln!(out, "{name}{{channel=\"{channel}\"}} {v}");
                }
            }
        }
    }
}

/// One bridge's counters and gauges, shared by its task and the renderer.
#[derive(Debug, Default)]
pub struct BridgeMetrics {
    /// 1 while the remote connection is up.
    pub connected: AtomicI64,
    /// Sends towards the remote not yet acknowledged.
    pub inflight: AtomicI64,
    /// PUBLISHes sent to the remote (resends not included).
    pub sent: AtomicU64,
    /// Sends the remote acknowledged with a reason below 0x80.
    pub acked: AtomicU64,
    /// Sends repeated: after a reconnect, an ack timeout or a refusal.
    pub resent: AtomicU64,
    /// PUBLISHes received from the remote.
    pub received: AtomicU64,
    /// Records removed by retention before the bridge sent them.
    pub gap_records: AtomicU64,
    /// Times the bridge's link failed (a panic) and was let go, each one
    /// logged and followed by a new link after the reconnect backoff.
    pub failures: AtomicU64,
    /// Refusals by the remote (a PUBACK reason, a CONNACK reason, a Maximum
    /// QoS below the rule's), by reason label.
    refused: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    /// What was not forwarded, by reason (too large for the remote, no
    /// rule for a topic).
    skipped: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Connection attempts by result (`ok`, `failed`, `refused`).
    connects: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Per channel forwarded: records behind and the age of the oldest
    /// record not yet acknowledged, seconds.
    lag: std::sync::Mutex<std::collections::BTreeMap<String, (u64, f64)>>,
}

impl BridgeMetrics {
    pub fn refused(&self, reason: &str) {
        let mut m = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *m.entry(reason.to_owned()).or_default() += 1;
    }

    pub fn skipped(&self, reason: &'static str) {
        let mut m = self
            .skipped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *m.entry(reason).or_default() += 1;
    }

    pub fn skipped_count(&self, reason: &str) -> u64 {
        let m = self
            .skipped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.get(reason).copied().unwrap_or(0)
    }

    pub fn connect_attempt(&self, result: &'static str) {
        let mut m = self
            .connects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *m.entry(result).or_default() += 1;
    }

    pub fn set_lag(&self, channel: &str, records: u64, seconds: f64) {
        let mut m = self
            .lag
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.insert(channel.to_owned(), (records, seconds));
    }
}

/// A labelled counter's values, in label order.
fn by_label<K: AsRef<str>>(
    counts: &std::sync::Mutex<std::collections::BTreeMap<K, u64>>,
) -> Vec<(String, u64)> {
    counts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(k, n)| (k.as_ref().to_owned(), *n))
        .collect()
}

fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

impl Metrics {
    fn render_bridges(&self, out: &mut String) {
        let bridges: Vec<(String, std::sync::Arc<BridgeMetrics>)> = {
            let b = self
                .bridges
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            b.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        if bridges.is_empty() {
            return;
        }
        type Pick = fn(&BridgeMetrics) -> i64;
        let gauges: [(&str, &str, Pick); 2] = [
            (
                "saguin_bridge_connected",
                "1 while the bridge's remote connection is up.",
                |b| b.connected.load(Relaxed),
            ),
            (
                "saguin_bridge_inflight",
                "Sends towards the remote not yet acknowledged.",
                |b| b.inflight.load(Relaxed),
            ),
        ];
        for (name, help, pick) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (bridge, m) in &bridges {
                let _ = writeln!(out, "{name}{{bridge=\"{}\"}} {}", label(bridge), pick(m));
            }
        }
        type Count = fn(&BridgeMetrics) -> u64;
        let counters: [(&str, &str, Count); 6] = [
            (
                "saguin_bridge_sent_total",
                "PUBLISHes a bridge sent to its remote (resends excluded).",
                |b| b.sent.load(Relaxed),
            ),
            (
                "saguin_bridge_acked_total",
                "Sends the remote acknowledged with a reason below 0x80.",
                |b| b.acked.load(Relaxed),
            ),
            (
                "saguin_bridge_resent_total",
                "Sends repeated after a reconnect, an ack timeout or a refusal.",
                |b| b.resent.load(Relaxed),
            ),
            (
                "saguin_bridge_received_total",
                "PUBLISHes a bridge received from its remote.",
                |b| b.received.load(Relaxed),
            ),
            (
                "saguin_bridge_gap_records_total",
                "Records retention removed before the bridge sent them.",
                |b| b.gap_records.load(Relaxed),
            ),
            (
                "saguin_bridge_failures_total",
                "Failures of a bridge's link (a panic), each followed by a new link after the backoff.",
                |b| b.failures.load(Relaxed),
            ),
        ];
        for (name, help, pick) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (bridge, m) in &bridges {
                let _ = writeln!(out, "{name}{{bridge=\"{}\"}} {}", label(bridge), pick(m));
            }
        }
        let counted = |out: &mut String,
                       name: &str,
                       help: &str,
                       key: &str,
                       of: &dyn Fn(&BridgeMetrics) -> Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (bridge, m) in &bridges {
                for (value, n) in of(m) {
                    let _ = writeln!(
                        out,
                        "{name}{{bridge=\"{}\",{key}=\"{}\"}} {n}",
                        label(bridge),
                        label(&value)
                    );
                }
            }
        };
        counted(
            out,
            "saguin_bridge_refused_total",
            "Refusals by a bridge's remote, by reason.",
            "reason",
            &|m| by_label(&m.refused),
        );
        counted(
            out,
            "saguin_bridge_skipped_total",
            "Messages a bridge did not forward, by reason.",
            "reason",
            &|m| by_label(&m.skipped),
        );
        counted(
            out,
            "saguin_bridge_connects_total",
            "A bridge's connection attempts, by result.",
            "result",
            &|m| by_label(&m.connects),
        );
        let _ = writeln!(out, "# HELP saguin_bridge_lag_records Records of a channel the bridge's remote has not acknowledged.\n# TYPE saguin_bridge_lag_records gauge");
        let mut seconds = String::new();
        for (bridge, m) in &bridges {
            for (channel, (records, age)) in m
                .lag
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
            {
                let _ = writeln!(
                    out,
                    "saguin_bridge_lag_records{{bridge=\"{}\",channel=\"{}\"}} {records}",
                    label(bridge),
                    label(channel)
                );
                let _ = writeln!(
                    seconds,
                    "saguin_bridge_lag_seconds{{bridge=\"{}\",channel=\"{}\"}} {age:.3}",
                    label(bridge),
                    label(channel)
                );
            }
        }
        let _ = writeln!(out, "# HELP saguin_bridge_lag_seconds Age of the oldest record the bridge's remote has not acknowledged.\n# TYPE saguin_bridge_lag_seconds gauge");
        out.push_str(&seconds);
    }
}
