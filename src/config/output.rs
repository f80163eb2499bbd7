//! The resolved configuration as one document (`check-config --output`).
//!
//! The contract, so `diff` between two deployments shows only real
//! differences:
//! - every key of every section, defaults filled in; an absent optional
//!   value is `null` (`publish_commit_interval` writes `none`, its own word);
//! - sizes as whole bytes, durations in humantime's normal form (`150ms`,
//!   `1h`, `7days`, `1m 30s`), addresses as `IP:PORT`, relative paths
//!   resolved against the configuration file's directory;
//! - keys sorted; listeners, providers and channels sorted by name (their
//!   order in the file means nothing); a queue's backoff keeps its order;
//! - `file_sha256`: for every file the configuration names and read, the
//!   SHA-256 of its bytes, by path, so a diff shows differing password, ACL
//!   or certificate files without showing them; recomputed on every load
//!   (a `file_sha256` in an input document must be a mapping of path to
//!   64 hex digits, and is otherwise ignored);
//! - configuration only: what the named files hold - private keys, password
//!   hashes, ACL rules - is never part of it. Those are held in
//!   [`Secret`](super::Secret)s, which render as `<redacted>` in every
//!   `Debug`, `Display` and `Serialize`, so no output path can leak them.
//!
//! The document loads back (YAML or JSON, which is YAML) into the same
//! configuration.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::units::format_duration;
use super::*;

pub(crate) fn resolved(config: &Config) -> Value {
    let mut listeners: Vec<&Listener> = config.listeners.iter().collect();
    listeners.sort_by(|a, b| a.name.cmp(&b.name));
    let mut storage: Vec<&Provider> = config.storage.iter().collect();
    storage.sort_by(|a, b| a.name().cmp(b.name()));
    let mut channels: Vec<&Channel> = config.channels.iter().collect();
    channels.sort_by(|a, b| a.name.cmp(&b.name));
    let mut bridges: Vec<&bridge::Bridge> = config.bridges.iter().collect();
    bridges.sort_by(|a, b| a.name.cmp(&b.name));

    let document = json!({
        "listeners": listeners.iter().map(|l| listener(l)).collect::<Vec<_>>(),
        "auth": {
            "allow_anonymous": config.auth.allow_anonymous,
            "password_file": opt_path(config.auth.password_file.as_deref()),
            "acl_file": opt_path(config.auth.acl_file.as_deref()),
        },
        "storage": storage.iter().map(|p| provider(p)).collect::<Vec<_>>(),
        "channels": channels.iter().map(|c| channel(c)).collect::<Vec<_>>(),
        "broker": {
            "retained_storage": config.broker.retained_storage,
            "session_storage": config.broker.session_storage,
            "session": {
                "ack_commit_interval": duration(config.broker.session.ack_commit_interval),
            },
            "exactly_once": {
                "expires_after": duration(config.broker.exactly_once.expires_after),
            },
            "topic_aliases": config.broker.topic_aliases,
        },
        "limits": {
            "max_message_size": config.limits.max_message_size,
            "max_header_bytes": config.limits.max_header_bytes,
            "max_session_expiry": duration(config.limits.max_session_expiry),
            "max_connections": config.limits.max_connections,
            "receive_maximum": config.limits.receive_maximum,
            "max_inflight_messages": config.limits.max_inflight_messages,
            "max_queued_messages": config.limits.max_queued_messages,
            "max_queued_bytes": config.limits.max_queued_bytes,
            "max_subscriptions_per_session": config.limits.max_subscriptions_per_session,
            "max_sessions": config.limits.max_sessions,
            "max_retained": config.limits.max_retained,
            "max_keep_alive": config.limits.max_keep_alive,
        },
        "metrics": {
            "bind": config.metrics.bind.map(|a| a.to_string()),
        },
        "log": {
            "level": config.log.level.as_str(),
            "format": config.log.format.as_str(),
        },
        "bridges": bridges.iter().map(|b| bridge(b)).collect::<Vec<_>>(),
        "file_sha256": config
            .file_digests()
            .into_iter()
            .map(|(p, digest)| (path(&p), Value::String(digest)))
            .collect::<Map<String, Value>>(),
    });
    sorted(document)
}

fn listener(l: &Listener) -> Value {
    json!({
        "name": l.name,
        "bind": l.bind.to_string(),
        "tls": l.tls.as_ref().map(|t| json!({
            "cert": path(&t.cert),
            "key": path(&t.key),
            "client_ca": opt_path(t.client_ca.as_deref()),
        })),
        "handshake_timeout": duration(l.handshake_timeout),
    })
}

fn provider(p: &Provider) -> Value {
    match p {
        Provider::Memory(m) => json!({
            "name": m.name,
            "kind": "memory",
            "snapshot_dir": opt_path(m.snapshot_dir.as_deref()),
            "max_bytes": m.max_bytes,
            "snapshot_debounce": m.snapshots.debounce.map(duration).unwrap_or_else(|| "none".to_string()),
            "snapshot_max_delay": m.snapshots.max_delay.map(duration).unwrap_or_else(|| "none".to_string()),
            "snapshot_room": m.snapshot_room,
        }),
        Provider::Sqlite(s) => json!({
            "name": s.name,
            "kind": "sqlite",
            "file_path": path(&s.file_path),
            "max_bytes": s.max_bytes,
            "flush_interval": duration(s.flush_interval),
            "publish_commit_interval": s
                .publish_commit_interval
                .map(duration)
                .unwrap_or_else(|| "none".to_string()),
            "publish_commit_max_records": s.publish_commit_max_records,
            "read_connections": s.read_connections,
            "checkpoint_room": s.checkpoint_room,
        }),
    }
}

fn channel(c: &Channel) -> Value {
    let mut out = json!({
        "name": c.name,
        "kind": c.kind_name(),
        "storage": c.storage,
    });
    let Value::Object(map) = &mut out else {
        return out;
    };
    // Only the keys this kind has, so the document loads back.
    match &c.kind {
        ChannelKindConfig::Append => {
            map.insert("retention_bytes".into(), json!(c.retention_bytes));
            map.insert("retention_age".into(), json!(c.retention_age.map(duration)));
            map.insert("max_bytes".into(), json!(c.max_bytes));
        }
        ChannelKindConfig::Latest => {
            map.insert("retention_age".into(), json!(c.retention_age.map(duration)));
            map.insert("retention_deletions".into(), json!(c.retention_deletions));
        }
        ChannelKindConfig::Queue(q) => {
            map.insert("max_bytes".into(), json!(c.max_bytes));
            map.insert("lease".into(), json!(duration(q.lease)));
            map.insert("max_attempts".into(), json!(q.max_attempts));
            map.insert(
                "backoff".into(),
                json!(q.backoff.iter().copied().map(duration).collect::<Vec<_>>()),
            );
            map.insert("dlq_retention_bytes".into(), json!(q.dlq_retention_bytes));
            map.insert("max_held_per_worker".into(), json!(q.max_held_per_worker));
        }
    }
    out
}

/// A bridge's rules keep their order (the first matching `in` rule maps a
/// topic); the password is never part of it, its file's digest is.
fn bridge(b: &bridge::Bridge) -> Value {
    json!({
        "name": b.name,
        "address": b.addresses,
        "round_robin": b.round_robin,
        "protocol": b.protocol.as_str(),
        "client_id": b.client_id,
        "username": b.username,
        "password_file": opt_path(b.password_file.as_deref()),
        "tls": b.tls.as_ref().map(|t| json!({
            "ca": path(&t.ca),
            "cert": opt_path(t.cert.as_deref()),
            "key": opt_path(t.key.as_deref()),
            "server_name": t.server_name,
        })),
        "keepalive": duration(b.keepalive),
        "session_expiry": duration(b.session_expiry),
        // An mqtt5 bridge refuses the key, so the document leaves it empty
        // there and still loads back.
        "try_private": (b.protocol == bridge::BridgeProtocol::Mqtt311).then_some(b.try_private),
        "reconnect": {
            "base": duration(b.reconnect.base),
            "cap": duration(b.reconnect.cap),
        },
        "max_inflight": b.max_inflight,
        "ack_timeout": duration(b.ack_timeout),
        "out": b.out.iter().map(|o| json!({
            "channel": o.channel,
            "remote_prefix": o.remote_prefix,
            "qos": o.qos,
            "retain": o.retain.as_str(),
            "from": o.from.as_str(),
        })).collect::<Vec<_>>(),
        "in": b.inbound.iter().map(|i| json!({
            "filter": i.filter,
            "remote_prefix": i.remote_prefix,
            "local_prefix": i.local_prefix,
            "qos": i.qos,
        })).collect::<Vec<_>>(),
    })
}

fn duration(d: Duration) -> String {
    format_duration(d)
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn opt_path(p: Option<&Path>) -> Value {
    p.map(|p| Value::String(path(p))).unwrap_or(Value::Null)
}

/// Keys sorted at every level, whatever order serde_json's map keeps.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::new();
            for (k, v) in entries {
                out.insert(k, sorted(v));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
