//! What a running broker says about itself, asked over its metrics
//! listener (`saguin status`): `/healthz`, `/readyz` and `/metrics`,
//! fetched with a plain HTTP/1.1 GET and read into one [`Status`].
//!
//! The Prometheus text is parsed here rather than matched line by line, so
//! the same reader serves the command and the tests that check what the
//! dashboards and alerting rules name.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long to wait for the endpoint to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one answer may take: a scrape reads every channel's counters.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The most an answer may hold: a broker with many thousands of channels.
const MAX_ANSWER: u64 = 64 * 1024 * 1024;

/// Why the endpoint could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("metrics endpoint {endpoint}: cannot resolve it: {source}")]
    Resolve {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("metrics endpoint {endpoint}: cannot reach it: {source}")]
    Connect {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("metrics endpoint {endpoint}{path}: {source}")]
    Exchange {
        endpoint: String,
        path: &'static str,
        source: std::io::Error,
    },
    #[error("metrics endpoint {endpoint}{path}: not a saguin broker's answer ({detail})")]
    NotHttp {
        endpoint: String,
        path: &'static str,
        detail: String,
    },
    #[error("metrics endpoint {endpoint}{path}: HTTP {status}, not a saguin broker's answer ({first_line})")]
    Status {
        endpoint: String,
        path: &'static str,
        status: u16,
        first_line: String,
    },
    #[error("metrics endpoint {endpoint}/metrics: line {line}: {detail}")]
    Parse {
        endpoint: String,
        line: usize,
        detail: String,
    },
}

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of a Prometheus text exposition, in order; `# HELP` and
/// `# TYPE` lines and blank lines are skipped. Errors name the line.
pub fn parse_text(text: &str) -> Result<Vec<Sample>, (usize, String)> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        samples.push(parse_sample(line).map_err(|detail| (i + 1, detail))?);
    }
    Ok(samples)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| format!("no value: {line:?}"))?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return Err(format!("not a metric name: {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let mut end = None;
        loop {
            // A label name, `="`, its value with escapes, `"`, then `,` or `}`.
            while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
                chars.next();
            }
            match chars.peek() {
                Some((i, '}')) => {
                    end = Some(*i);
                    break;
                }
                None => break,
                _ => {}
            }
            let mut label = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                label.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {label:?} without a quoted value"));
            }
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(other) => value.push(other),
                        None => break,
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return Err(format!("label {label:?}: value not closed"));
            }
            labels.push((label.trim().to_owned(), value));
        }
        let end = end.ok_or_else(|| "labels not closed with }".to_owned())?;
        rest = &after[end + 1..];
    }
    let value_text = rest
        .split_whitespace()
        .next()
        .ok_or_else(|| format!("{name}: no value"))?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse::<f64>()
            .map_err(|_| format!("{name}: value {v:?} is not a number"))?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// An HTTP answer: its status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    pub status: u16,
    pub body: String,
}

/// `GET path` from `endpoint` (`HOST:PORT`), one request per connection,
/// as the metrics listener serves them.
pub fn http_get(endpoint: &str, path: &'static str) -> Result<HttpAnswer, FetchError> {
    let addrs: Vec<SocketAddr> = endpoint
        .to_socket_addrs()
        .map_err(|source| FetchError::Resolve {
            endpoint: endpoint.to_owned(),
            source,
        })?
        .collect();
    let mut last_error = None;
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_error = Some(e),
        }
    }
    let Some(mut stream) = stream else {
        return Err(FetchError::Connect {
            endpoint: endpoint.to_owned(),
            source: last_error
                .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address")),
        });
    };
    let exchange = |source| FetchError::Exchange {
        endpoint: endpoint.to_owned(),
        path,
        source,
    };
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(exchange)?;
    stream
        .set_write_timeout(Some(ANSWER_TIMEOUT))
        .map_err(exchange)?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {endpoint}\r\nUser-Agent: saguin-status\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(exchange)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut raw)
        .map_err(exchange)?;
    let not_http = |detail: &str| FetchError::NotHttp {
        endpoint: endpoint.to_owned(),
        path,
        detail: detail.to_owned(),
    };
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| not_http("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| not_http("headers not UTF-8"))?;
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| not_http(status_line))?;
    let body = String::from_utf8_lossy(&raw[head_end + 4..]).into_owned();
    Ok(HttpAnswer { status, body })
}

/// A running broker as its metrics listener reports it: the document
/// `saguin status --json` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Status {
    /// The endpoint asked, `HOST:PORT`.
    pub endpoint: String,
    /// `/healthz` answered 200: the broker loop turned lately.
    pub live: bool,
    /// `/healthz`'s answer, one line.
    pub liveness: String,
    /// `/readyz` answered 200: serving, and no provider failed.
    pub ready: bool,
    /// `/readyz`'s answer, line by line.
    pub readiness: Vec<String>,
    pub uptime_seconds: u64,
    pub connections: u64,
    pub sessions: u64,
    pub subscriptions: u64,
    pub retained_messages: u64,
    pub messages_received: u64,
    pub messages_sent: u64,
    /// `saguin_dropped_messages_total` by reason.
    pub dropped_messages: BTreeMap<String, u64>,
    /// How far the broker's receipt clock is ahead of the system clock
    /// (`saguin_receipt_clock_ahead_seconds`); `null` from a broker that
    /// does not say.
    pub receipt_clock_ahead_seconds: Option<f64>,
    pub providers: Vec<ProviderStatus>,
    pub channels: Vec<ChannelStatus>,
    pub bridges: Vec<BridgeStatus>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ProviderStatus {
    pub name: String,
    /// `memory` or `sqlite`.
    pub kind: Option<String>,
    pub bytes: Option<u64>,
    /// `null` when unbounded.
    pub max_bytes: Option<u64>,
    pub failed: bool,
    pub no_space: bool,
    /// A sqlite provider keeps at most what it held when its file system
    /// filled (`saguin_provider_held_to_disk`).
    pub held_to_disk: bool,
    /// `saguin_storage_errors_total` by kind.
    pub storage_errors: BTreeMap<String, u64>,
    /// A memory provider with a snapshot directory; `null` otherwise.
    pub snapshot: Option<SnapshotStatus>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SnapshotStatus {
    pub generation: u64,
    /// How old the current generation's state is; `null` with none yet.
    pub age_seconds: Option<f64>,
    /// What a crash now would lose; `null` for a provider written only
    /// at shutdown.
    pub unsaved_seconds: Option<f64>,
    /// Files that could not be written since the start.
    pub failures: u64,
    /// What of its snapshot room is allocated; `null` keeping none.
    pub room_bytes: Option<u64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ChannelStatus {
    pub name: String,
    /// `append`, `latest` or `queue`.
    pub kind: Option<String>,
    pub provider: Option<String>,
    /// An append channel's records, a latest channel's topics with a
    /// value; `null` for a queue (see `queue.depth`).
    pub records: Option<u64>,
    pub bytes: Option<u64>,
    pub next: Option<u64>,
    pub floor: Option<u64>,
    /// The most records any consumer is behind `next`.
    pub consumer_lag: Option<u64>,
    /// Gaps consumers were told of since the start.
    pub consumer_gaps: Option<u64>,
    pub queue: Option<QueueStatus>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueStatus {
    pub depth: u64,
    pub in_flight: u64,
    pub attempts: u64,
    pub lease_expired: u64,
    pub dead_lettered: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BridgeStatus {
    pub name: String,
    pub connected: bool,
    pub inflight: u64,
    pub sent: u64,
    pub acked: u64,
    /// Records of every forwarded channel the remote has not acknowledged.
    pub lag_records: u64,
}

/// Asks `endpoint` (`HOST:PORT`) for `/healthz`, `/readyz` and `/metrics`.
pub fn fetch(endpoint: &str) -> Result<Status, FetchError> {
    // Each answer is checked before the next request: an endpoint that is
    // not a saguin broker is named by the first path it does not serve.
    let get = |path: &'static str, allowed: &[u16]| {
        let answer = http_get(endpoint, path)?;
        if allowed.contains(&answer.status) {
            Ok(answer)
        } else {
            Err(FetchError::Status {
                endpoint: endpoint.to_owned(),
                path,
                status: answer.status,
                first_line: answer.body.lines().next().unwrap_or_default().to_owned(),
            })
        }
    };
    let healthz = get("/healthz", &[200, 503])?;
    let readyz = get("/readyz", &[200, 503])?;
    let metrics = get("/metrics", &[200])?;
    let samples = parse_text(&metrics.body).map_err(|(line, detail)| FetchError::Parse {
        endpoint: endpoint.to_owned(),
        line,
        detail,
    })?;
    if !samples.iter().any(|s| s.name == "saguin_uptime_seconds") {
        return Err(FetchError::NotHttp {
            endpoint: endpoint.to_owned(),
            path: "/metrics",
            detail: "its /metrics has no saguin_uptime_seconds".into(),
        });
    }
    Ok(Status::from_samples(
        endpoint,
        &healthz,
        &readyz,
        &Samples(samples),
    ))
}

/// Samples looked up by name and label.
struct Samples(Vec<Sample>);

impl Samples {
    fn family<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| s.name == name)
    }

    fn scalar(&self, name: &str) -> u64 {
        self.family(name).next().map_or(0, |s| as_count(s.value))
    }

    /// The value of `name` whose `label` is `value`.
    fn by(&self, name: &str, label: &str, value: &str) -> Option<f64> {
        self.family(name)
            .find(|s| s.label(label) == Some(value))
            .map(|s| s.value)
    }

    fn count_by(&self, name: &str, label: &str, value: &str) -> Option<u64> {
        self.by(name, label, value).map(as_count)
    }

    /// Every value `label` takes in `name`, in order of first appearance.
    fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut seen = Vec::new();
        for s in self.family(name) {
            if let Some(v) = s.label(label) {
                if !seen.iter().any(|x| x == v) {
                    seen.push(v.to_owned());
                }
            }
        }
        seen
    }
}

fn as_count(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value as u64
    } else {
        0
    }
}

impl Status {
    fn from_samples(
        endpoint: &str,
        healthz: &HttpAnswer,
        readyz: &HttpAnswer,
        samples: &Samples,
    ) -> Status {
        let mut provider_names = samples.label_values("saguin_provider_failed", "provider");
        for name in samples.label_values("saguin_snapshot_generation", "provider") {
            if !provider_names.contains(&name) {
                provider_names.push(name);
            }
        }
        provider_names.sort();
        let providers = provider_names
            .into_iter()
            .map(|name| {
                let storage_errors = samples
                    .family("saguin_storage_errors_total")
                    .filter(|s| s.label("provider") == Some(name.as_str()))
                    .filter_map(|s| Some((s.label("kind")?.to_owned(), as_count(s.value))))
                    .collect();
                let snapshot = samples
                    .count_by("saguin_snapshot_generation", "provider", &name)
                    .map(|generation| SnapshotStatus {
                        generation,
                        age_seconds: samples
                            .by("saguin_snapshot_age_seconds", "provider", &name)
                            .filter(|age| *age >= 0.0),
                        unsaved_seconds: samples.by(
                            "saguin_snapshot_unsaved_seconds",
                            "provider",
                            &name,
                        ),
                        failures: samples
                            .count_by("saguin_snapshot_failures_total", "provider", &name)
                            .unwrap_or(0),
                        room_bytes: samples.count_by(
                            "saguin_snapshot_room_bytes",
                            "provider",
                            &name,
                        ),
                    });
                ProviderStatus {
                    kind: samples
                        .family("saguin_provider_info")
                        .find(|s| s.label("provider") == Some(name.as_str()))
                        .and_then(|s| s.label("kind"))
                        .map(str::to_owned),
                    bytes: samples.count_by("saguin_provider_bytes", "provider", &name),
                    max_bytes: samples.count_by("saguin_provider_max_bytes", "provider", &name),
                    failed: samples
                        .count_by("saguin_provider_failed", "provider", &name)
                        .is_some_and(|v| v == 1),
                    no_space: samples
                        .count_by("saguin_provider_no_space", "provider", &name)
                        .is_some_and(|v| v == 1),
                    held_to_disk: samples
                        .count_by("saguin_provider_held_to_disk", "provider", &name)
                        .is_some_and(|v| v == 1),
                    storage_errors,
                    snapshot,
                    name,
                }
            })
            .collect();
        let mut channel_names = samples.label_values("saguin_channel_info", "channel");
        for family in ["saguin_channel_records", "saguin_queue_depth"] {
            for name in samples.label_values(family, "channel") {
                if !channel_names.contains(&name) {
                    channel_names.push(name);
                }
            }
        }
        channel_names.sort();
        let channels = channel_names
            .into_iter()
            .map(|name| {
                let info = samples
                    .family("saguin_channel_info")
                    .find(|s| s.label("channel") == Some(name.as_str()));
                let count = |family: &str| samples.count_by(family, "channel", &name);
                let queue = count("saguin_queue_depth").map(|depth| QueueStatus {
                    depth,
                    in_flight: count("saguin_queue_in_flight").unwrap_or(0),
                    attempts: count("saguin_queue_attempts_total").unwrap_or(0),
                    lease_expired: count("saguin_queue_lease_expired_total").unwrap_or(0),
                    dead_lettered: count("saguin_queue_dead_lettered_total").unwrap_or(0),
                });
                ChannelStatus {
                    kind: info.and_then(|s| s.label("kind")).map(str::to_owned),
                    provider: info.and_then(|s| s.label("provider")).map(str::to_owned),
                    records: count("saguin_channel_records"),
                    bytes: count("saguin_channel_bytes"),
                    next: count("saguin_channel_next"),
                    floor: count("saguin_channel_floor"),
                    consumer_lag: count("saguin_consumer_lag"),
                    consumer_gaps: count("saguin_consumer_gap_total"),
                    queue,
                    name,
                }
            })
            .collect();
        let bridges = samples
            .label_values("saguin_bridge_connected", "bridge")
            .into_iter()
            .map(|name| {
                let count = |family: &str| samples.count_by(family, "bridge", &name).unwrap_or(0);
                BridgeStatus {
                    connected: count("saguin_bridge_connected") == 1,
                    inflight: count("saguin_bridge_inflight"),
                    sent: count("saguin_bridge_sent_total"),
                    acked: count("saguin_bridge_acked_total"),
                    lag_records: samples
                        .family("saguin_bridge_lag_records")
                        .filter(|s| s.label("bridge") == Some(name.as_str()))
                        .map(|s| as_count(s.value))
                        .sum(),
                    name,
                }
            })
            .collect();
        Status {
            endpoint: endpoint.to_owned(),
            live: healthz.status == 200,
            liveness: healthz.body.lines().next().unwrap_or_default().to_owned(),
            ready: readyz.status == 200,
            readiness: readyz.body.lines().map(str::to_owned).collect(),
            uptime_seconds: samples.scalar("saguin_uptime_seconds"),
            connections: samples.scalar("saguin_connections"),
            sessions: samples.scalar("saguin_sessions"),
            subscriptions: samples.scalar("saguin_subscriptions"),
            retained_messages: samples.scalar("saguin_retained_messages"),
            messages_received: samples.scalar("saguin_messages_received_total"),
            messages_sent: samples.scalar("saguin_messages_sent_total"),
            dropped_messages: samples
                .family("saguin_dropped_messages_total")
                .filter_map(|s| Some((s.label("reason")?.to_owned(), as_count(s.value))))
                .collect(),
            receipt_clock_ahead_seconds: samples
                .family("saguin_receipt_clock_ahead_seconds")
                .next()
                .map(|s| s.value),
            providers,
            channels,
            bridges,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_labels_escapes_and_no_labels_are_read() {
        let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total 3\n\
                    b{channel=\"q\\\"uo\\\\te\\nd\",kind=\"io\"} 1.5\nc{} -1\n\n";
        let samples = parse_text(text).unwrap();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].name, "a_total");
        assert_eq!(samples[0].value, 3.0);
        assert_eq!(samples[1].label("channel"), Some("q\"uo\\te\nd"));
        assert_eq!(samples[1].label("kind"), Some("io"));
        assert_eq!(samples[1].value, 1.5);
        assert_eq!(samples[2].labels, vec![]);
        assert_eq!(samples[2].value, -1.0);
    }

    #[test]
    fn a_line_that_is_not_a_sample_is_named_by_number() {
        assert_eq!(
            parse_text("a 1\nb{x=\"1\" 2\n").unwrap_err().0,
            2,
            "an unclosed label set"
        );
        assert_eq!(parse_text("a one\n").unwrap_err().0, 1);
        assert_eq!(parse_text("ok 1\n\nbad-name 1\n").unwrap_err().0, 3);
    }

    #[test]
    fn a_status_is_read_from_the_families_the_broker_exports() {
        let metrics = Metrics::new();
        let text = metrics.render();
        let samples = Samples(parse_text(&text).unwrap());
        let status = Status::from_samples(
            "127.0.0.1:9464",
            &HttpAnswer {
                status: 200,
                body: "live: the broker loop turned 0.100s ago\n".into(),
            },
            &HttpAnswer {
                status: 503,
                body: "not ready\nbroker: not serving (starting or stopping)\n".into(),
            },
            &samples,
        );
        assert!(status.live);
        assert!(!status.ready);
        assert_eq!(status.readiness.len(), 2);
        assert_eq!(status.dropped_messages.len(), 7);
        assert!(status.providers.is_empty());
        assert!(status.channels.is_empty());
    }

    use crate::broker::metrics::Metrics;
}
