//! Process-local counters, shared by the broker state and connection tasks,
//! rendered in Prometheus text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

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
    /// The session's offline/pending queue was at `max_queued_messages`.
    QueueFull,
    /// Its message expiry interval passed while queued.
    Expired,
    /// Larger than the client's maximum packet size.
    TooLarge,
    /// QoS 0 for a session without a connection.
    Offline,
    /// The receiving connection was too slow and was closed.
    SlowConsumer,
    /// An inbound QoS 2 hold not released by PUBREL within
    /// `exactly_once.expires_after` (the message itself was routed).
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
    pub sessions: AtomicI64,
    pub subscriptions: AtomicI64,
    pub retained: AtomicI64,
    pub messages_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    dropped: [AtomicU64; DropReason::ALL.len()],
    disconnects: [AtomicU64; CloseReason::ALL.len()],
    /// Failed storage writes by provider name (`saguin_storage_errors_total`).
    storage_errors: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    pub started: std::time::Instant,
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
            sessions: AtomicI64::new(0),
            subscriptions: AtomicI64::new(0),
            retained: AtomicI64::new(0),
            messages_received: AtomicU64::new(0),
            messages_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            dropped: Default::default(),
            disconnects: Default::default(),
            storage_errors: Default::default(),
            started: std::time::Instant::now(),
        }
    }

    pub fn dropped(&self, reason: DropReason) {
        self.dropped[reason as usize].fetch_add(1, Relaxed);
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

    /// A write to `provider` failed.
    pub fn storage_error(&self, provider: &str) {
        let mut errors = self
            .storage_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *errors.entry(provider.to_owned()).or_default() += 1;
    }

    /// Failed writes to `provider` so far.
    pub fn storage_error_count(&self, provider: &str) -> u64 {
        let errors = self
            .storage_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        errors.get(provider).copied().unwrap_or(0)
    }

    /// Names a provider so its error counter is rendered (as 0) before it
    /// ever fails.
    pub fn register_provider(&self, provider: &str) {
        let mut errors = self
            .storage_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        errors.entry(provider.to_owned()).or_default();
    }

    /// Names an append channel whose counters (`saguin_channel_records`,
    /// `_bytes`, `_next`, `_floor`) are read from its store at each scrape.
    pub fn register_channel(
        &self,
        _name: &str,
        _store: std::sync::Arc<dyn crate::storage::contract::AppendStore>,
    ) {
    }

    /// A consumer of `channel` was told of a gap (`saguin_consumer_gap_total`).
    pub fn consumer_gap(&self, _channel: &str) {}

    /// The most records any consumer of `channel` is behind
    /// (`saguin_consumer_lag`).
    pub fn set_consumer_lag(&self, _channel: &str, _lag: u64) {}

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
        let _ = writeln!(out, "# HELP saguin_storage_errors_total Storage writes that failed, by provider.\n# TYPE saguin_storage_errors_total counter");
        {
            let errors = self
                .storage_errors
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for (provider, count) in errors.iter() {
                let _ = writeln!(
                    out,
                    "saguin_storage_errors_total{{provider=\"{}\"}} {count}",
                    provider.replace('\\', "\\\\").replace('"', "\\\"")
                );
            }
        }
        counter(
            &mut out,
            "saguin_uptime_seconds",
            "Seconds since the broker started.",
            self.started.elapsed().as_secs(),
        );
        out
    }
}
