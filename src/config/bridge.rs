//! `bridges`: MQTT links into an existing broker cluster (`docs/operations.md`,
//! "Bridges"; the broker's side in `src/broker/bridge/`).
//!
//! A bridge is parsed here with every default filled in, its password file
//! read and its TLS files turned into a ready rustls client configuration,
//! so `check-config` and `serve` refuse the same file for the same reason.
//! What needs the rest of the configuration (the channels a rule names, a
//! 3.1.1 loop) is judged in [`cross_check`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_norway::Value;

use super::parse::{
    boolean, duration, file_path, index, integer, join, name, one_of, positive_duration, required,
    sequence, string, Ctx, Fields,
};
use super::secret::Secret;
use super::{Channel, ChannelKindConfig};

/// Largest password file read: a password is bytes, not a document.
const MAX_PASSWORD_FILE_BYTES: u64 = 64 * 1024;

/// One bridge (`bridges[i]`).
#[derive(Debug, Clone)]
pub struct Bridge {
    /// One topic level; its stored reader is `bridge:<name>`.
    pub name: String,
    /// `host:port` of each remote broker, in the order given.
    pub addresses: Vec<String>,
    /// false: the first address is the primary, returned to after a
    /// failover; true: each reconnect tries the next one.
    pub round_robin: bool,
    pub protocol: BridgeProtocol,
    /// The client id at the remote; default `<hostname>.<name>`.
    pub client_id: String,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// What `password_file` holds (its first line).
    pub password: Option<Secret<Vec<u8>>>,
    /// SHA-256 of the password file's bytes, for `file_sha256`.
    pub password_sha256: Option<String>,
    pub tls: Option<BridgeTls>,
    pub keepalive: Duration,
    /// The remote session's expiry: what the remote keeps for `in` while
    /// the link is down (MQTT 5; a 3.1.1 bridge asks for clean session 0).
    pub session_expiry: Duration,
    /// MQTT 3.1.1 only: announce protocol level `4 | 0x80`, so a Mosquitto
    /// remote does not send back what the bridge published.
    pub try_private: bool,
    pub reconnect: Reconnect,
    /// Unacknowledged sends towards the remote, capped by its Receive
    /// Maximum; also the Receive Maximum announced to it.
    pub max_inflight: u16,
    /// The oldest unanswered send waits this long before the bridge
    /// reconnects and resends.
    pub ack_timeout: Duration,
    pub out: Vec<OutRule>,
    pub inbound: Vec<InRule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BridgeProtocol {
    Mqtt311,
    Mqtt5,
}

impl BridgeProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            BridgeProtocol::Mqtt311 => "mqtt311",
            BridgeProtocol::Mqtt5 => "mqtt5",
        }
    }
}

/// Jittered exponential backoff between connection attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    pub base: Duration,
    pub cap: Duration,
}

/// `bridges[i].tls`: the files read and checked at load time.
#[derive(Debug, Clone)]
pub struct BridgeTls {
    /// PEM CA certificates the remote's certificate must chain to.
    pub ca: PathBuf,
    /// Client certificate and key (mutual TLS), both or neither.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name the remote's certificate must carry; default: the host of
    /// the address connected to.
    pub server_name: Option<String>,
    /// Built from the files; a secret because it may hold the private key.
    pub client_config: Secret<Arc<rustls::ClientConfig>>,
    /// SHA-256 of each file read, by path.
    pub digests: Vec<(PathBuf, String)>,
}

/// `bridges[i].out[j]`: a channel forwarded to the remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutRule {
    pub channel: String,
    /// Put before each record's topic at the remote.
    pub remote_prefix: String,
    /// 0 (at most once) or 1 (at least once).
    pub qos: u8,
    pub retain: RetainMode,
    /// Where a bridge with no stored position starts.
    pub from: StartFrom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainMode {
    AsPublished,
    Never,
}

impl RetainMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RetainMode::AsPublished => "as_published",
            RetainMode::Never => "never",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    Earliest,
    Next,
}

impl StartFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            StartFrom::Earliest => "earliest",
            StartFrom::Next => "next",
        }
    }
}

/// `bridges[i].in[j]`: a remote filter brought into a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InRule {
    /// Subscribed to at the remote.
    pub filter: String,
    /// Stripped from each remote topic.
    pub remote_prefix: String,
    /// Put before what is left; the local topic's first level is a channel.
    pub local_prefix: String,
    pub qos: u8,
}

impl InRule {
    /// The local topic of a message that arrived on `remote_topic`, or
    /// `None` when it does not start with `remote_prefix`.
    pub fn local_topic(&self, remote_topic: &str) -> Option<String> {
        let rest = remote_topic.strip_prefix(self.remote_prefix.as_str())?;
        Some(format!("{}{rest}", self.local_prefix))
    }
}

impl OutRule {
    /// The filter, at the remote, every topic this rule sends falls under.
    pub fn remote_filter(&self) -> String {
        format!("{}{}/#", self.remote_prefix, self.channel)
    }
}

const BRIDGE_KEYS: &[&str] = &[
    "name",
    "address",
    "round_robin",
    "protocol",
    "client_id",
    "username",
    "password_file",
    "tls",
    "keepalive",
    "session_expiry",
    "try_private",
    "reconnect",
    "max_inflight",
    "ack_timeout",
    "out",
    "in",
];
const TLS_KEYS: &[&str] = &["ca", "cert", "key", "server_name"];
const OUT_KEYS: &[&str] = &["channel", "remote_prefix", "qos", "retain", "from"];
const IN_KEYS: &[&str] = &["filter", "remote_prefix", "local_prefix", "qos"];

pub(super) fn bridges(ctx: &mut Ctx, path: &str, value: &Value) -> Vec<(usize, Bridge)> {
    let mut out = Vec::new();
    for (i, item) in sequence(ctx, path, value).iter().enumerate() {
        let path = index(path, i);
        if let Some(bridge) = bridge(ctx, &path, item) {
            out.push((i, bridge));
        }
    }
    out
}

fn bridge(ctx: &mut Ctx, path: &str, item: &Value) -> Option<Bridge> {
    let mut f = Fields::of(ctx, path, item)?;
    let bridge_name = required(ctx, &mut f, "name", |ctx, p, v| name(ctx, p, v, "bridge"));
    if let Some(n) = &bridge_name {
        if let Err(why) = check_bridge_name(n) {
            ctx.problem(&join(path, "name"), why);
        }
    }
    let addresses = required(ctx, &mut f, "address", addresses).unwrap_or_default();
    let round_robin = f
        .take("round_robin")
        .and_then(|(p, v)| boolean(ctx, &p, v))
        .unwrap_or(false);
    // `None` when the protocol written is refused: nothing that depends on
    // it is judged then.
    let (protocol, protocol_given) = match f.take("protocol") {
        None => (Some(BridgeProtocol::Mqtt5), false),
        Some((p, v)) => (
            one_of(
                ctx,
                &p,
                v,
                &[
                    ("mqtt311", BridgeProtocol::Mqtt311),
                    ("mqtt5", BridgeProtocol::Mqtt5),
                ],
            ),
            true,
        ),
    };
    let client_id = f.take("client_id").and_then(|(p, v)| {
        let id = string(ctx, &p, v)?;
        if id.is_empty() || id.contains('\0') || id.len() > 65535 {
            ctx.problem(
                &p,
                "a client id is 1 to 65535 bytes without NUL (the remote keeps the bridge's session under it)",
            );
            return None;
        }
        Some(id)
    });
    let username = f.take("username").and_then(|(p, v)| string(ctx, &p, v));
    let mut password_file = None;
    let mut password = None;
    let mut password_sha256 = None;
    if let Some((p, v)) = f.take("password_file") {
        if let Some(file) = file_path(ctx, &p, v) {
            match super::read_bounded(&file, MAX_PASSWORD_FILE_BYTES) {
                Ok(bytes) => {
                    password_sha256 = Some(super::sha256_hex(&bytes));
                    // The first line, without its line ending: what an
                    // operator's `echo secret > file` wrote.
                    let first = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
                    let first = first.strip_suffix(b"\r").unwrap_or(first);
                    if first.is_empty() {
                        ctx.problem(
                            &p,
                            format!(
                                "{}: the first line is empty; it holds the password",
                                file.display()
                            ),
                        );
                    }
                    password = Some(Secret::new(first.to_vec()));
                }
                Err(why) => ctx.problem(&p, why),
            }
            password_file = Some(file);
        }
        if username.is_none() {
            ctx.problem(
                &p,
                "a password needs a username (MQTT sends no password without one)",
            );
        }
    }
    let tls = f.take("tls").and_then(|(p, v)| tls(ctx, &p, v));
    let keepalive = f
        .take("keepalive")
        .and_then(|(p, v)| seconds_u16(ctx, &p, v))
        .unwrap_or(Duration::from_secs(60));
    let session_expiry = f
        .take("session_expiry")
        .and_then(|(p, v)| super::parse::session_expiry(ctx, &p, v))
        .unwrap_or(Duration::from_secs(86_400));
    let try_private = match f.take("try_private") {
        // An MQTT 5 bridge keeps its own messages from coming back with No
        // Local; the private protocol level is a 3.1.1 announcement, so
        // the key would change nothing there.
        Some((p, _)) if protocol == Some(BridgeProtocol::Mqtt5) => {
            ctx.problem(
                &p,
                format!(
                    "only an mqtt311 bridge announces the private protocol level; {} is mqtt5{}, whose subscriptions use No Local instead",
                    join(path, "protocol"),
                    if protocol_given { "" } else { " (the default)" }
                ),
            );
            true
        }
        Some((p, v)) => boolean(ctx, &p, v).unwrap_or(true),
        None => true,
    };
    let reconnect = f
        .take("reconnect")
        .and_then(|(p, v)| reconnect(ctx, &p, v))
        .unwrap_or(Reconnect {
            base: Duration::from_secs(5),
            cap: Duration::from_secs(30),
        });
    let max_inflight = f
        .take("max_inflight")
        .and_then(|(p, v)| integer(ctx, &p, v, 1, 65535))
        .map_or(20, |n| n as u16);
    let ack_timeout = f
        .take("ack_timeout")
        .and_then(|(p, v)| positive_duration(ctx, &p, v))
        .unwrap_or(Duration::from_secs(30));
    let out_rules = match f.take("out") {
        Some((p, v)) => sequence(ctx, &p, v)
            .iter()
            .enumerate()
            .filter_map(|(j, item)| out_rule(ctx, &index(&p, j), item))
            .collect(),
        None => Vec::new(),
    };
    let in_rules = match f.take("in") {
        Some((p, v)) => sequence(ctx, &p, v)
            .iter()
            .enumerate()
            .filter_map(|(j, item)| in_rule(ctx, &index(&p, j), item))
            .collect::<Vec<_>>(),
        None => Vec::new(),
    };
    f.finish(ctx, BRIDGE_KEYS);
    let bridge_name = bridge_name?;
    if addresses.is_empty() {
        return None;
    }
    let client_id = client_id.unwrap_or_else(|| format!("{}.{bridge_name}", hostname()));
    Some(Bridge {
        name: bridge_name,
        addresses,
        round_robin,
        protocol: protocol.unwrap_or(BridgeProtocol::Mqtt5),
        client_id,
        username,
        password_file,
        password,
        password_sha256,
        tls,
        keepalive,
        session_expiry,
        try_private,
        reconnect,
        max_inflight,
        ack_timeout,
        out: out_rules,
        inbound: in_rules,
    })
}

/// A bridge name is one topic level and a valid reader identifier.
fn check_bridge_name(name: &str) -> Result<(), String> {
    for (what, c) in [
        ("'/' (a bridge name is one topic level)", '/'),
        ("'+' (a wildcard)", '+'),
        ("'#' (a wildcard)", '#'),
        ("NUL", '\0'),
    ] {
        if name.contains(c) {
            return Err(format!("bridge name {name:?} contains {what}"));
        }
    }
    crate::storage::contract::Reader::bridge(name)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes and the result is cut at the first NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "saguin".to_owned();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(h) if !h.is_empty() => h.to_owned(),
        _ => "saguin".to_owned(),
    }
}

/// One `host:port` or a list of them.
fn addresses(ctx: &mut Ctx, path: &str, value: &Value) -> Option<Vec<String>> {
    let items: Vec<(String, &Value)> = match value {
        Value::Sequence(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| (index(path, i), v))
            .collect(),
        other => vec![(path.to_owned(), other)],
    };
    if items.is_empty() {
        ctx.problem(path, "at least one host:port");
        return None;
    }
    let mut out = Vec::new();
    for (p, v) in items {
        let Some(text) = string(ctx, &p, v) else {
            continue;
        };
        match split_host_port(&text) {
            Some(_) => out.push(text),
            None => ctx.problem(
                &p,
                format!(
                    "{text:?} is not host:port (e.g. emqx-a:8883, 10.0.0.5:1883 or [::1]:1883)"
                ),
            ),
        }
    }
    Some(out)
}

/// `host:port` split, the host without IPv6 brackets; `None` when either
/// part is missing or the port is no number.
pub fn split_host_port(text: &str) -> Option<(&str, u16)> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(char::is_whitespace) {
        return None;
    }
    Some((host, port))
}

fn seconds_u16(ctx: &mut Ctx, path: &str, value: &Value) -> Option<Duration> {
    let d = duration(ctx, path, value)?;
    if d.as_secs() > u64::from(u16::MAX) || d.subsec_nanos() != 0 {
        ctx.problem(path, "whole seconds, at most 65535 (MQTT's Keep Alive)");
        return None;
    }
    Some(d)
}

fn reconnect(ctx: &mut Ctx, path: &str, value: &Value) -> Option<Reconnect> {
    let mut f = Fields::of(ctx, path, value)?;
    let base = f
        .take("base")
        .and_then(|(p, v)| positive_duration(ctx, &p, v))
        .unwrap_or(Duration::from_secs(5));
    let cap = f
        .take("cap")
        .and_then(|(p, v)| positive_duration(ctx, &p, v))
        .unwrap_or(Duration::from_secs(30));
    f.finish(ctx, &["base", "cap"]);
    if cap < base {
        ctx.problem(
            &join(path, "cap"),
            "shorter than base: the backoff could never grow",
        );
        return None;
    }
    Some(Reconnect { base, cap })
}

fn tls(ctx: &mut Ctx, path: &str, value: &Value) -> Option<BridgeTls> {
    let mut f = Fields::of(ctx, path, value)?;
    let ca = required(ctx, &mut f, "ca", file_path);
    let cert = f.take("cert").and_then(|(p, v)| file_path(ctx, &p, v));
    let key = f.take("key").and_then(|(p, v)| file_path(ctx, &p, v));
    let server_name = f.take("server_name").and_then(|(p, v)| {
        let name = string(ctx, &p, v)?;
        match rustls::pki_types::ServerName::try_from(name.clone()) {
            Ok(_) => Some(name),
            Err(_) => {
                ctx.problem(&p, format!("{name:?} is no DNS name or IP address"));
                None
            }
        }
    });
    f.finish(ctx, TLS_KEYS);
    if cert.is_some() != key.is_some() {
        ctx.problem(
            path,
            "cert and key go together (a client certificate needs its key)",
        );
        return None;
    }
    let ca = ca?;
    let mut digests = Vec::new();
    let mut roots = rustls::RootCertStore::empty();
    match super::tls::read_certs(&ca, &mut None) {
        Ok(certs) => {
            for (i, c) in certs.into_iter().enumerate() {
                if let Err(e) = roots.add(c) {
                    ctx.problem(
                        &join(path, "ca"),
                        format!(
                            "{}: certificate {} is not a usable CA certificate: {e}",
                            ca.display(),
                            i + 1
                        ),
                    );
                }
            }
        }
        Err(why) => {
            ctx.problem(&join(path, "ca"), why);
            return None;
        }
    }
    if let Ok(bytes) = super::read_bounded(&ca, 1024 * 1024) {
        digests.push((ca.clone(), super::sha256_hex(&bytes)));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = match rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
    {
        Ok(b) => b.with_root_certificates(roots),
        Err(e) => {
            ctx.problem(path, format!("no usable TLS protocol version: {e}"));
            return None;
        }
    };
    let config = match (&cert, &key) {
        (Some(cert), Some(key)) => {
            let mut cert_digest = None;
            let mut key_digest = None;
            let chain = super::tls::read_certs(cert, &mut cert_digest)
                .map_err(|why| ctx.problem(&join(path, "cert"), why))
                .ok();
            let private = super::tls::read_key(key, &mut key_digest, "bridge")
                .map_err(|why| ctx.problem(&join(path, "key"), why))
                .ok();
            digests.extend(cert_digest.map(|d| (cert.clone(), d)));
            digests.extend(key_digest.map(|d| (key.clone(), d)));
            let (chain, private) = (chain?, private?);
            match builder.with_client_auth_cert(chain, private) {
                Ok(config) => config,
                Err(e) => {
                    ctx.problem(
                        &join(path, "key"),
                        format!(
                            "{}: the key cannot be used with the certificate in {}: {e}",
                            key.display(),
                            cert.display()
                        ),
                    );
                    return None;
                }
            }
        }
        _ => builder.with_no_client_auth(),
    };
    Some(BridgeTls {
        ca,
        cert,
        key,
        server_name,
        client_config: Secret::new(Arc::new(config)),
        digests,
    })
}

/// A topic prefix: no wildcard, no NUL (`sites/17/`, or empty).
fn prefix(ctx: &mut Ctx, path: &str, value: &Value) -> Option<String> {
    let text = string(ctx, path, value)?;
    if text.contains(['+', '#', '\0']) {
        ctx.problem(
            path,
            format!("{text:?}: a topic prefix has no wildcard or NUL"),
        );
        return None;
    }
    Some(text)
}

fn out_rule(ctx: &mut Ctx, path: &str, item: &Value) -> Option<OutRule> {
    let mut f = Fields::of(ctx, path, item)?;
    let channel = required(ctx, &mut f, "channel", string);
    let remote_prefix = f
        .take("remote_prefix")
        .map_or(Some(String::new()), |(p, v)| prefix(ctx, &p, v));
    let qos = match f.take("qos") {
        Some((p, v)) => match integer(ctx, &p, v, 0, 2) {
            Some(2) => {
                ctx.problem(
                    &p,
                    "an outbound bridge sends at QoS 0 or 1: a resend after a crash under a packet identifier the remote still holds would be dropped there as a duplicate",
                );
                None
            }
            q => q.map(|q| q as u8),
        },
        None => Some(1),
    };
    let retain = f
        .take("retain")
        .map_or(Some(RetainMode::AsPublished), |(p, v)| {
            one_of(
                ctx,
                &p,
                v,
                &[
                    ("as_published", RetainMode::AsPublished),
                    ("never", RetainMode::Never),
                ],
            )
        });
    let from = f.take("from").map_or(Some(StartFrom::Earliest), |(p, v)| {
        one_of(
            ctx,
            &p,
            v,
            &[("earliest", StartFrom::Earliest), ("next", StartFrom::Next)],
        )
    });
    f.finish(ctx, OUT_KEYS);
    // A bad value is reported; the default stands in for it so the
    // cross-checks still see this rule at its index.
    Some(OutRule {
        channel: channel.unwrap_or_default(),
        remote_prefix: remote_prefix.unwrap_or_default(),
        qos: qos.unwrap_or(1),
        retain: retain.unwrap_or(RetainMode::AsPublished),
        from: from.unwrap_or(StartFrom::Earliest),
    })
}

fn in_rule(ctx: &mut Ctx, path: &str, item: &Value) -> Option<InRule> {
    let mut f = Fields::of(ctx, path, item)?;
    let filter = required(ctx, &mut f, "filter", |ctx, p, v| {
        let filter = string(ctx, p, v)?;
        match crate::topic::validate_filter(&filter) {
            Ok(()) if crate::topic::split_shared(&filter).is_none() => Some(filter),
            Ok(()) => {
                ctx.problem(
                    p,
                    format!(
                        "{filter:?}: a bridge subscribes with a plain filter, not a shared one"
                    ),
                );
                None
            }
            Err(e) => {
                ctx.problem(p, format!("{filter:?}: {}", e.why()));
                None
            }
        }
    });
    let remote_prefix = f
        .take("remote_prefix")
        .map_or(Some(String::new()), |(p, v)| prefix(ctx, &p, v));
    let local_prefix = f
        .take("local_prefix")
        .map_or(Some(String::new()), |(p, v)| prefix(ctx, &p, v));
    let qos = f
        .take("qos")
        .map_or(Some(1), |(p, v)| integer(ctx, &p, v, 0, 2).map(|q| q as u8));
    f.finish(ctx, IN_KEYS);
    let rule = InRule {
        filter: filter.unwrap_or_default(),
        remote_prefix: remote_prefix.unwrap_or_default(),
        local_prefix: local_prefix.unwrap_or_default(),
        qos: qos.unwrap_or(1),
    };
    if !rule.filter.is_empty() && !rule.filter.starts_with(rule.remote_prefix.as_str()) {
        ctx.problem(
            &join(path, "remote_prefix"),
            format!(
                "{:?} does not begin the filter {:?}, so it could not be stripped from what arrives",
                rule.remote_prefix, rule.filter
            ),
        );
    }
    Some(rule)
}

/// What needs the rest of the configuration: unique names, the channels a
/// rule names, a 3.1.1 loop.
pub(super) fn cross_check(
    ctx: &mut Ctx,
    bridges: &[(usize, Bridge)],
    channels: &[(usize, Channel)],
) {
    let channel = |name: &str| channels.iter().map(|(_, c)| c).find(|c| c.name == name);
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, bridge) in bridges {
        let path = format!("bridges[{i}]");
        if let Some(first) = names.get(bridge.name.as_str()) {
            ctx.problem(
                &join(&path, "name"),
                format!(
                    "duplicate bridge name {:?} (also bridges[{first}])",
                    bridge.name
                ),
            );
        } else {
            names.insert(&bridge.name, *i);
        }
        if bridge.out.is_empty() && bridge.inbound.is_empty() {
            ctx.problem(&path, "neither out nor in: the bridge would carry nothing");
        }
        let mut out_channels: HashMap<&str, usize> = HashMap::new();
        for (j, rule) in bridge.out.iter().enumerate() {
            let p = format!("{path}.out[{j}].channel");
            if let Some(first) = out_channels.insert(&rule.channel, j) {
                ctx.problem(
                    &p,
                    format!("channel {:?} is already forwarded by out[{first}]: one place per channel and bridge", rule.channel),
                );
            }
            match channel(&rule.channel) {
                // Reported where it was parsed.
                None if rule.channel.is_empty() => {}
                None => ctx.problem(&p, format!("no channel named {:?}", rule.channel)),
                Some(c) if matches!(c.kind, ChannelKindConfig::Queue(_)) => ctx.problem(
                    &p,
                    format!("{:?} is a queue channel: its records are jobs for workers, not a log to forward (append or latest)", rule.channel),
                ),
                Some(_) => {}
            }
        }
        for (j, rule) in bridge.inbound.iter().enumerate() {
            let p = format!("{path}.in[{j}]");
            if rule.filter.is_empty() {
                continue;
            }
            let local = rule.local_topic(&rule.filter).unwrap_or_default();
            let first = local.split('/').next().unwrap_or_default();
            match channel(first) {
                Some(c) if !matches!(c.kind, ChannelKindConfig::Queue(_)) => {}
                Some(_) => ctx.problem(
                    &join(&p, "local_prefix"),
                    format!("what arrives lands in {first:?}, a queue channel; an inbound bridge writes into an append or latest channel"),
                ),
                None if first.contains(['+', '#']) => ctx.problem(
                    &join(&p, "local_prefix"),
                    format!("the local topics ({local:?}) would start with a wildcard level; local_prefix must name an append or latest channel"),
                ),
                None => ctx.problem(
                    &join(&p, "local_prefix"),
                    format!("what arrives would land under {first:?}, which is no channel; the first level of local_prefix (or of the filter after remote_prefix) must be an append or latest channel"),
                ),
            }
            if bridge.protocol == BridgeProtocol::Mqtt311 && !bridge.try_private {
                if let Some((k, out)) = bridge
                    .out
                    .iter()
                    .enumerate()
                    .find(|(_, o)| filters_overlap(&rule.filter, &o.remote_filter()))
                {
                    ctx.problem(
                        &join(&p, "filter"),
                        format!(
                            "{:?} overlaps what out[{k}] sends ({:?}): on MQTT 3.1.1 without try_private the remote sends the bridge's own messages back (a loop); set try_private: true or use protocol: mqtt5",
                            rule.filter,
                            out.remote_filter()
                        ),
                    );
                }
            }
        }
    }
}

/// Whether some topic matches both filters (`a/#` matches `a` too).
pub fn filters_overlap(a: &str, b: &str) -> bool {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split('/').collect(), b.split('/').collect());
    for i in 0.. {
        match (a.get(i).copied(), b.get(i).copied()) {
            (Some("#"), _) | (_, Some("#")) | (None, None) => return true,
            (Some(l), Some(r)) if l == "+" || r == "+" || l == r => {}
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigError};

    const BASE: &str = "
listeners: [{ name: mqtt, bind: 127.0.0.1:0 }]
auth: { allow_anonymous: true }
storage: [{ name: mem, kind: memory }]
channels:
  - { name: telemetry, kind: append, storage: mem }
  - { name: commands, kind: append, storage: mem }
  - { name: jobs, kind: queue, storage: mem }
";

    fn load(dir: &std::path::Path, bridges: &str) -> Result<Config, ConfigError> {
        let path = dir.join("saguin.yaml");
        let text = format!("{BASE}bridges:\n{bridges}");
        std::fs::write(&path, &text).unwrap();
        Config::load(&path)
    }

    fn problems(dir: &std::path::Path, bridges: &str) -> Vec<String> {
        match load(dir, bridges) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems().iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_bridge_resolves_with_every_default_and_no_password() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cloud.pass"), "s3cret\n").unwrap();
        let config = load(
            dir.path(),
            "  - name: cloud
    address: emqx-a:8883
    username: site17
    password_file: cloud.pass
    out: [{ channel: telemetry, remote_prefix: sites/17/ }]
    in: [{ filter: sites/17/cmd/#, remote_prefix: sites/17/, local_prefix: commands/ }]
",
        )
        .unwrap();
        let b = &config.bridges[0];
        assert_eq!(b.addresses, vec!["emqx-a:8883"]);
        assert_eq!(b.protocol, BridgeProtocol::Mqtt5);
        assert!(b.client_id.ends_with(".cloud"));
        assert_eq!(b.password.as_ref().unwrap().expose(), b"s3cret");
        assert_eq!(b.max_inflight, 20);
        assert_eq!(b.out[0].qos, 1);
        assert_eq!(b.out[0].from, StartFrom::Earliest);
        assert_eq!(
            b.inbound[0].local_topic("sites/17/cmd/x").as_deref(),
            Some("commands/cmd/x")
        );
        let text = serde_json::to_string(&config.resolved()).unwrap();
        assert!(!text.contains("s3cret"));
        assert!(text.contains("cloud.pass"));
        let mut paths = Vec::new();
        collect("bridges[]", &config.resolved()["bridges"][0], &mut paths);
        let documented: Vec<&str> = super::super::reference::keys()
            .iter()
            .map(|k| k.path)
            .collect();
        for p in paths {
            let section = documented.iter().any(|d| d.starts_with(&format!("{p}.")));
            assert!(
                documented.contains(&p.as_str()) || section,
                "undocumented: {p}"
            );
        }
    }

    fn collect(prefix: &str, value: &serde_json::Value, out: &mut Vec<String>) {
        if let serde_json::Value::Object(map) = value {
            for (k, v) in map {
                let path = format!("{prefix}.{k}");
                out.push(path.clone());
                match v {
                    serde_json::Value::Array(items) => {
                        for item in items {
                            collect(&format!("{path}[]"), item, out);
                        }
                    }
                    other => collect(&path, other, out),
                }
            }
        }
    }

    #[test]
    fn refusals_name_their_yaml_path() {
        let dir = tempfile::tempdir().unwrap();
        let found = problems(
            dir.path(),
            "  - name: a
    address: r:1883
    out:
      - { channel: nope }
      - { channel: jobs }
      - { channel: telemetry, qos: 2 }
    in:
      - { filter: x/#, local_prefix: nowhere/ }
  - name: b
    address: r:1883
    protocol: mqtt311
    try_private: false
    password_file: missing.pass
    username: u
    out: [{ channel: telemetry, remote_prefix: up/ }]
    in: [{ filter: up/#, remote_prefix: up/, local_prefix: commands/ }]
  - name: c
    address: [r:1883]
    tls: { ca: missing-ca.pem }
    out: [{ channel: telemetry }]
",
        );
        let has = |path: &str, word: &str| {
            found
                .iter()
                .any(|p| p.starts_with(&format!("{path}:")) && p.contains(word))
        };
        assert!(
            has("bridges[0].out[0].channel", "no channel named"),
            "{found:#?}"
        );
        assert!(has("bridges[0].out[1].channel", "queue"), "{found:#?}");
        assert!(has("bridges[0].out[2].qos", "duplicate"), "{found:#?}");
        assert!(
            has("bridges[0].in[0].local_prefix", "no channel"),
            "{found:#?}"
        );
        assert!(
            has("bridges[1].password_file", "missing.pass"),
            "{found:#?}"
        );
        assert!(has("bridges[1].in[0].filter", "try_private"), "{found:#?}");
        assert!(has("bridges[2].tls.ca", "missing-ca.pem"), "{found:#?}");
    }

    #[test]
    fn overlap_is_judged_level_by_level() {
        assert!(filters_overlap("a/#", "a"));
        assert!(filters_overlap("a/+/c", "a/b/#"));
        assert!(filters_overlap("+/x", "a/x"));
        assert!(!filters_overlap("a/b", "a/c"));
        assert!(!filters_overlap("a/b/c", "a/b"));
        assert!(!filters_overlap("down/#", "up/telemetry/#"));
    }
}
