//! `saguin status`: what a running broker says about itself, over its
//! metrics listener.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use saguin::broker::status::{self, FetchError, Status};

use crate::exit;
use crate::output::table;

/// Ask a running broker how it is: live, ready, its providers, channels and
/// connections.
#[derive(clap::Args, Debug)]
#[command(after_help = STATUS_EXAMPLES)]
#[command(group(clap::ArgGroup::new("endpoint").required(true).args(["metrics", "config"])))]
pub struct Args {
    /// The broker's metrics listener, HOST:PORT (its metrics.bind).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Read the listener's address from this configuration's metrics.bind
    /// (only that key is read; check-config validates the rest).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What `saguin status --help` and its man page say of it.
pub const LONG_ABOUT: &str = "\
Ask a running broker how it is, over its metrics listener (metrics.bind): \
GET /healthz, /readyz and /metrics, read into one summary. Nothing is sent \
over MQTT and nothing is opened on disk: it is safe at any time, and needs \
no access to the broker's files.

The summary line says whether the broker is live (its loop turned within the \
last 10 s) and ready (every provider recovered, every listener bound, not \
stopping, no provider failed), how long it has run, its connections, \
sessions, subscriptions and retained messages, and the messages received \
and sent. Then a table of the storage providers (kind, bytes, max_bytes and \
the share used, health, storage errors, and for a memory provider with a \
snapshot_dir its snapshot generation, how old it is and how long its oldest \
unsaved change has waited: what a crash now would lose), a table of the \
channels (kind, provider, records - a latest channel's topics with a value - \
bytes, next, floor, the most records any consumer is behind, and for a \
queue its depth, records in flight and dead-lettered), the bridges if any, \
and one line per problem: a provider failed or without room, the loop not \
turning, messages dropped, the system clock behind the broker's receipt \
clock.

--json prints one document: {\"endpoint\", \"live\", \"liveness\" (the \
/healthz line), \"ready\", \"readiness\" (the /readyz lines), \
\"uptime_seconds\", \"connections\", \"sessions\", \"subscriptions\", \
\"retained_messages\", \"messages_received\", \"messages_sent\", \
\"dropped_messages\": {REASON: count}, \"receipt_clock_ahead_seconds\" \
(how far the broker's receipt clock is ahead of the system clock), \"providers\": [{\"name\", \"kind\", \
\"bytes\", \"max_bytes\" (null: unbounded), \"failed\", \"no_space\", \"held_to_disk\", \
\"storage_errors\": {KIND: count}, \"snapshot\": null | {\"generation\", \
\"age_seconds\" (null: none yet), \"unsaved_seconds\" (null: written at \
shutdown only), \"failures\", \"room_bytes\" (null: no snapshot room)}}], \"channels\": [{\"name\", \"kind\", \"provider\", \
\"records\", \"bytes\", \"next\", \"floor\", \"consumer_lag\", \"consumer_gaps\", \
\"queue\": null | {\"depth\", \"in_flight\", \"attempts\", \"lease_expired\", \
\"dead_lettered\"}}], \"bridges\": [{\"name\", \"connected\", \"inflight\", \
\"sent\", \"acked\", \"lag_records\"}], \"error\": null}; a figure the broker \
does not report is null, an empty list []. When there is no status to show \
(exit 3; 1 for a configuration that is not YAML or whose metrics.bind is \
not IP:PORT), --json still prints one document, as `lock status --json` \
does: {\"endpoint\" (null: none was read from the configuration), \"live\": \
null, \"ready\": null, \"error\"}; the error is on stderr as well. Readers \
ignore fields they do not know.

With --config, only metrics.bind is read: 0.0.0.0 and :: are asked on the \
loopback address, and a port of 0 (chosen by the system at startup, named in \
the broker's `listening` log line) must be given with --metrics.

Exit status: 0 the broker is live and ready; 1 it answered and is not live \
or not ready (each reason printed); 3 the endpoint cannot be reached or did \
not answer as a saguin broker, or the configuration names no metrics \
listener; 2 usage.";

const STATUS_EXAMPLES: &str = "\
Examples:
  saguin status --metrics 127.0.0.1:9464
  saguin status --config /etc/saguin/saguin.yaml
  saguin status --metrics 127.0.0.1:9464 --json | jq '.channels[] | select(.consumer_lag > 1000)'";

pub fn run(args: Args) -> anyhow::Result<u8> {
    let endpoint = match (&args.metrics, &args.config) {
        (Some(addr), _) => endpoint_of(addr),
        (None, Some(path)) => match endpoint_from_config(path) {
            Ok(endpoint) => endpoint,
            Err((code, why)) => return refuse(args.json, None, &why, code),
        },
        (None, None) => unreachable!("clap requires --metrics or --config"),
    };
    let status = match status::fetch(&endpoint) {
        Ok(status) => status,
        Err(err) => return refuse(args.json, Some(&endpoint), &why_not(&err), exit::CANNOT),
    };
    let code = if status.live && status.ready {
        exit::OK
    } else {
        exit::NO
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = Answered {
            status: &status,
            error: None,
        };
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        print_human(&mut out, &status)?;
    }
    Ok(code)
}

/// The document of a broker that answered: its status, and `"error": null`
/// so that every document --json prints has the field.
#[derive(serde::Serialize)]
struct Answered<'a> {
    #[serde(flatten)]
    status: &'a Status,
    error: Option<String>,
}

/// The document printed when there is no status to show: as `lock status
/// --json` does, what is known (the endpoint, once there is one) and why,
/// with `live` and `ready` null rather than false, as nobody said so.
#[derive(serde::Serialize)]
struct Unanswered<'a> {
    endpoint: Option<&'a str>,
    live: Option<bool>,
    ready: Option<bool>,
    error: &'a str,
}

/// Says why on stderr, and with --json on stdout as well, so that a
/// script reading stdout is never left with nothing to parse.
fn refuse(json: bool, endpoint: Option<&str>, why: &str, code: u8) -> anyhow::Result<u8> {
    if json {
        let mut out = std::io::stdout().lock();
        let doc = Unanswered {
            endpoint,
            live: None,
            ready: None,
            error: why,
        };
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    }
    eprintln!("saguin: {why}");
    Ok(code)
}

/// The error in an operator's words. A read that runs out of time reports
/// EAGAIN ("Resource temporarily unavailable") on Unix, which says nothing
/// of a wait: an endpoint that took the connection and stayed silent (a
/// stopped process, another service on the port) is named as such.
fn why_not(err: &FetchError) -> String {
    match err {
        FetchError::Exchange {
            endpoint,
            path,
            source,
        } if matches!(
            source.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) =>
        {
            format!(
                "metrics endpoint {endpoint}{path}: accepted the connection but did not answer within {} s",
                status::ANSWER_TIMEOUT.as_secs()
            )
        }
        err => err.to_string(),
    }
}

/// `HOST:PORT` as given, without a scheme or a path an operator may paste.
fn endpoint_of(addr: &str) -> String {
    let addr = addr
        .strip_prefix("http://")
        .unwrap_or(addr)
        .trim_end_matches("/metrics")
        .trim_end_matches('/');
    addr.to_owned()
}

/// The metrics listener a configuration file names, or the exit code and
/// why not.
fn endpoint_from_config(path: &Path) -> Result<String, (u8, String)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        (
            exit::CANNOT,
            format!("configuration {}: {e}", path.display()),
        )
    })?;
    let doc: serde_norway::Value = serde_norway::from_str(&text).map_err(|e| {
        (
            exit::NO,
            format!("configuration {}: not YAML: {e}", path.display()),
        )
    })?;
    let bind = doc.get("metrics").and_then(|m| m.get("bind"));
    let Some(bind) = bind.filter(|b| !b.is_null()) else {
        return Err((
            exit::CANNOT,
            format!(
                "configuration {}: metrics.bind is not set, so the broker serves no metrics endpoint to ask; set it (a restart takes it) or give --metrics",
                path.display()
            ),
        ));
    };
    let addr: SocketAddr = bind.as_str().and_then(|b| b.parse().ok()).ok_or_else(|| {
        (
            exit::NO,
            format!(
                "configuration {}: metrics.bind: {bind:?} is not IP:PORT",
                path.display()
            ),
        )
    })?;
    if addr.port() == 0 {
        return Err((
            exit::CANNOT,
            format!(
                "configuration {}: metrics.bind has port 0: the system chose the port when the broker started (its `listening` log line for listener metrics names it); give it with --metrics",
                path.display()
            ),
        ));
    }
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(SocketAddr::new(ip, addr.port()).to_string())
}

fn print_human(out: &mut impl Write, status: &Status) -> std::io::Result<()> {
    writeln!(
        out,
        "saguin at {}: {}, {}; up {}; {} connection(s), {} session(s), {} subscription(s), {} retained message(s); {} message(s) received, {} sent",
        status.endpoint,
        if status.live { "live" } else { "NOT LIVE" },
        if status.ready { "ready" } else { "NOT READY" },
        humantime::format_duration(std::time::Duration::from_secs(status.uptime_seconds)),
        status.connections,
        status.sessions,
        status.subscriptions,
        status.retained_messages,
        status.messages_received,
        status.messages_sent,
    )?;
    if !status.providers.is_empty() {
        let mut providers = table();
        providers.set_header(vec![
            "provider",
            "kind",
            "bytes",
            "max_bytes",
            "used",
            "health",
            "errors",
            "snapshot",
        ]);
        for p in &status.providers {
            let used = match (p.bytes, p.max_bytes) {
                (Some(bytes), Some(max)) if max > 0 => {
                    format!("{:.1}%", bytes as f64 * 100.0 / max as f64)
                }
                _ => "-".into(),
            };
            let health = if p.failed {
                "FAILED"
            } else if p.no_space {
                "NO SPACE"
            } else if p.held_to_disk {
                "HELD (file system full)"
            } else {
                "writing"
            };
            let snapshot = p.snapshot.as_ref().map_or_else(
                || "-".to_owned(),
                |s| {
                    let mut text = format!("generation {}", s.generation);
                    if let Some(age) = s.age_seconds {
                        text.push_str(&format!(", {age:.1}s old"));
                    }
                    if let Some(unsaved) = s.unsaved_seconds {
                        text.push_str(&format!(", {unsaved:.1}s unsaved"));
                    }
                    if s.failures > 0 {
                        text.push_str(&format!(", {} file(s) failed", s.failures));
                    }
                    text
                },
            );
            providers.add_row(vec![
                p.name.clone(),
                dash(p.kind.as_deref()),
                p.bytes.map_or_else(|| "-".into(), size),
                p.max_bytes.map_or_else(|| "-".into(), size),
                used,
                health.to_owned(),
                p.storage_errors.values().sum::<u64>().to_string(),
                snapshot,
            ]);
        }
        writeln!(out, "{providers}")?;
    }
    if !status.channels.is_empty() {
        let mut channels = table();
        channels.set_header(vec![
            "channel", "kind", "provider", "records", "bytes", "next", "floor", "lag", "queue",
        ]);
        for c in &status.channels {
            let number = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
            let queue = c.queue.as_ref().map_or_else(
                || "-".to_owned(),
                |q| {
                    format!(
                        "depth {}, {} in flight, {} dead-lettered",
                        q.depth, q.in_flight, q.dead_lettered
                    )
                },
            );
            channels.add_row(vec![
                c.name.clone(),
                dash(c.kind.as_deref()),
                dash(c.provider.as_deref()),
                number(c.records),
                c.bytes.map_or_else(|| "-".into(), size),
                number(c.next),
                number(c.floor),
                number(c.consumer_lag),
                queue,
            ]);
        }
        writeln!(out, "{channels}")?;
    }
    if !status.bridges.is_empty() {
        let mut bridges = table();
        bridges.set_header(vec![
            "bridge",
            "connected",
            "in flight",
            "sent",
            "acked",
            "lag records",
        ]);
        for b in &status.bridges {
            bridges.add_row(vec![
                b.name.clone(),
                if b.connected { "yes" } else { "NO" }.to_owned(),
                b.inflight.to_string(),
                b.sent.to_string(),
                b.acked.to_string(),
                b.lag_records.to_string(),
            ]);
        }
        writeln!(out, "{bridges}")?;
    }
    if !status.live {
        writeln!(out, "{}: {}", status.endpoint, status.liveness)?;
    }
    for line in status.readiness.iter().skip(1) {
        if !line.ends_with(": writing") {
            writeln!(out, "{}: {line}", status.endpoint)?;
        }
    }
    let dropped: Vec<String> = status
        .dropped_messages
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    if !dropped.is_empty() {
        writeln!(
            out,
            "{}: messages dropped since the start: {}",
            status.endpoint,
            dropped.join(", ")
        )?;
    }
    if let Some(ahead) = status.receipt_clock_ahead_seconds.filter(|a| *a >= 1.0) {
        writeln!(
            out,
            "{}: the system clock is {} behind the broker's receipt clock (set back, or not set yet): records are stamped by the broker's clock until the system clock passes it",
            status.endpoint,
            humantime::format_duration(std::time::Duration::from_secs(ahead as u64))
        )?;
    }
    Ok(())
}

fn dash(text: Option<&str>) -> String {
    text.unwrap_or("-").to_owned()
}

/// Bytes with a binary unit, as the configuration writes sizes.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
