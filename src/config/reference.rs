//! The configuration reference: every key with its type, default, bounds
//! and meaning, rendered as the `saguin-config(5)` man page by
//! `saguin generate-docs`. Bounds come from the parser's own constants, so
//! the page cannot drift from what is enforced; a unit test fails when the
//! resolved document (every key, defaults filled in) has a key this list
//! does not document.

use super::auth::MAX_PBKDF2_ITERATIONS;
use super::parse::{
    DEFAULT_BACKOFF, DEFAULT_LEASE, DEFAULT_MAX_HELD_PER_WORKER, FLUSH_INTERVAL_MAX,
    FLUSH_INTERVAL_MIN, MAX_ATTEMPTS_MAX, MIN_CONNECT_PACKET, MQTT_MAX_PACKET,
    PUBLISH_COMMIT_INTERVAL_MAX, READ_CONNECTIONS_MAX,
};
use super::units::{format_duration, DURATION_MAX_TEXT};
use super::{CHANNEL_NAME_MAX_BYTES, FILE_NAME_MAX_BYTES, MAX_SERVED_CHANNELS};
use crate::storage::contract::DEFAULT_MAX_ATTEMPTS;

/// One configuration key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDoc {
    /// YAML path; `[]` marks a list's items (`listeners[].bind`).
    pub path: &'static str,
    /// What the value is written as.
    pub kind: &'static str,
    /// The default, or "required" / "none".
    pub default: String,
    /// What is accepted, beyond the type.
    pub bounds: String,
    /// What it is for, in one sentence.
    pub meaning: &'static str,
}

fn key(
    path: &'static str,
    kind: &'static str,
    default: impl Into<String>,
    bounds: impl Into<String>,
    meaning: &'static str,
) -> KeyDoc {
    KeyDoc {
        path,
        kind,
        default: default.into(),
        bounds: bounds.into(),
        meaning,
    }
}

const SIZE: &str = "size";
const DURATION: &str = "duration";
const PATH: &str = "path";

/// Every key, in the order the reference lists them.
pub fn keys() -> Vec<KeyDoc> {
    let flush = format!(
        "{}..={}",
        format_duration(FLUSH_INTERVAL_MIN),
        format_duration(FLUSH_INTERVAL_MAX)
    );
    let backoff = DEFAULT_BACKOFF.map(format_duration).join(", ");
    // Every duration is bounded; a key with no tighter bound of its own
    // says the general one.
    let longest = |before: &str| format!("{before}at most {DURATION_MAX_TEXT}");
    // What a channel's encoded name may take of a file name: the longest
    // name it is written under adds the suffix, the largest generation's
    // number and the temporary suffix.
    let encoded_max = {
        use saguin_format::channel_name::{MAX_GENERATION_INFIX_LEN, SNAPSHOT_SUFFIX, TEMP_SUFFIX};
        FILE_NAME_MAX_BYTES - SNAPSHOT_SUFFIX.len() - MAX_GENERATION_INFIX_LEN - TEMP_SUFFIX.len()
    };
    vec![
        key("listeners", "list", "required", "at least one", "The MQTT listeners."),
        key("listeners[].name", "string", "required", "unique among listeners", "Names the listener in logs and metrics."),
        key("listeners[].bind", "IP:PORT", "required", "port 0: the system picks one (logged at startup); two listeners may not share a port on overlapping addresses", "Where the listener accepts connections."),
        key("listeners[].tls", "mapping", "none (plain TCP)", "", "TLS on this listener; the files are read and checked at load time."),
        key("listeners[].tls.cert", PATH, "required with tls", "PEM certificate chain, leaf first; an expired or not-yet-valid certificate is a check-config warning", "The server certificate."),
        key("listeners[].tls.key", PATH, "required with tls", "PEM, exactly one PKCS#8, PKCS#1 or SEC1 key matching cert", "The server's private key (never printed)."),
        key("listeners[].tls.client_ca", PATH, "none", "PEM CA certificates", "Clients must present a certificate from one of these (mutual TLS)."),
        key("listeners[].handshake_timeout", DURATION, "10s", longest("above 0, "), "Time a new connection has to finish TLS and send CONNECT."),
        key("auth", "mapping", "", "", "Who may connect."),
        key("auth.allow_anonymous", "bool", "false (true in the embedded default)", "false requires a password_file with at least one user", "Whether a client without a username may connect."),
        key("auth.password_file", PATH, "none", format!("mosquitto_passwd format, $7$ (PBKDF2-SHA512, at most {MAX_PBKDF2_ITERATIONS} iterations) or $6$; written by saguin passwd"), "The users and their password hashes. Re-read at SIGHUP."),
        key("auth.acl_file", PATH, "none (everyone may read and write every topic)", "mosquitto acl_file syntax: user, topic, pattern lines", "Which topics each user may read and write. Re-read at SIGHUP."),
        key("storage", "list", "none", "", "Storage providers, each named by channels and broker stores."),
        key("storage[].name", "string", "required", "unique among providers", "Names the provider for channels[].storage and the broker stores."),
        key("storage[].kind", "memory | sqlite", "required", "", "Where the provider keeps its data."),
        key("storage[].snapshot_dir", PATH, "none (nothing kept across a restart)", "memory only; a directory or a path not created yet (created at startup), not a symlink; not shared with another provider, nor a file another sqlite provider keeps beside its database; another provider's file_path is not its lock saguin.lock (nor that lock's -wal, -shm or -journal)", "Where a memory provider writes its snapshot generations (in the background and at shutdown) and reads the last one at startup."),
        key("storage[].snapshot_debounce", "none | duration", "250ms", "memory with a snapshot_dir only; at least 1ms, not above snapshot_max_delay", "A snapshot generation is written this long after the last change, when the provider goes quiet; none: only at snapshot_max_delay."),
        key("storage[].snapshot_max_delay", "none | duration", "2s", "memory with a snapshot_dir only; 1ms..=1h; none only with snapshot_debounce: none", "A change is in a written generation at most this long after it (and the time one generation takes to write): what a crash or power cut may lose. none with snapshot_debounce: none: written only at shutdown, as Mosquitto does without autosave_interval."),
        key("storage[].snapshot_room", SIZE, "64MiB with a snapshot_dir, else 0", "memory with a snapshot_dir only (0 otherwise); at most 1GiB; 0 keeps none", "Room kept allocated in the snapshot_dir, in saguin.room, for the snapshot generation that finds the file system full: it is given up, the next generation writes into it (what a crash loses stays within a generation's retry), and it is taken back whole after a generation once the file system has that much free (docs/operations.md, Background snapshots). Size it to the largest store's file: a generation needs room for the files of the stores that changed beside the ones they replace. A file system that holds no block allocated ahead of writes (ZFS keeping zeros compressed) cannot keep it: the broker says so once; keep the room with a dataset reservation there and set 0."),
        key("storage[].file_path", PATH, "required for sqlite", "sqlite only; not a directory, not shared with another provider, nor a file another provider keeps beside its own: <file_path>-wal, -shm, -journal, -room, the lock <file_path>.lock (and its -wal, -shm, -journal), a snapshot_dir's saguin.lock; a symlink, even one whose target does not exist yet, is its target; its directory is created 0700 at startup when it does not exist, as a snapshot_dir is", "The sqlite database file (WAL mode). Its write-ahead log, <file_path>-wal beside it, holds what committed since the last checkpoint (once a second while commits come) and is written from its beginning again once it passes 64 MiB and a checkpoint has copied all of it, and its file is then cut back to 64 MiB, so under traffic that never stops its file stays near that size beyond max_bytes (72 MB at most in measured runs: docs/operations.md, Disk faults); shutdown empties it."),
        key("storage[].max_bytes", SIZE, "none (no bound, no reserve)", "sqlite: in 4096-byte pages, refused if it rounds to 0 pages or below twice the reserve (limits.max_message_size + limits.max_header_bytes)", "Bound on the bytes the provider holds, the reserve included."),
        key("storage[].flush_interval", DURATION, "150ms", flush.clone(), "sqlite: how often the write-ahead log is fsynced after a commit."),
        key("storage[].publish_commit_interval", "none | duration", "none", format!("at most {}", format_duration(PUBLISH_COMMIT_INTERVAL_MAX)), "sqlite: how long a publish transaction waits for company (group commit)."),
        key("storage[].publish_commit_max_records", "integer", "256", "1..=4294967295", "sqlite: most records in one publish transaction."),
        key("storage[].checkpoint_room", SIZE, "64MiB", "sqlite only; at most 1GiB; 0 keeps none", "Room kept allocated on the database's file system, in <file_path>-room, for the checkpoint (or the open) that finds the file system full: it is given up so the write-ahead log can be copied (or the database opened), the provider then keeps at most what it holds (publishes beyond refused with 0x83, removals making room for them) until the file system has this much free again (docs/operations.md, Disk faults). While another process's reader keeps the write-ahead log from being copied (a backup), the room grows with what the log adds beyond the database, and publishes beyond what it covers are refused with 0x83 where it cannot grow. With 0, a write-ahead log that took the last of the file system stops every write until room is made beside the provider. A file system that holds no block allocated ahead of writes (ZFS keeping zeros compressed) cannot keep it: the broker says so once; keep the room with a dataset reservation there and set 0."),
        key("storage[].read_connections", "integer", "4", format!("0..={READ_CONNECTIONS_MAX}"), "sqlite: read-only connections beside the writer; 0 puts every read on the writer."),
        key("channels", "list", "none", format!("at most {MAX_SERVED_CHANNELS}, counting a dead-letter channel for each queue"), "Durable channels; a topic whose first level is a channel's name belongs to it."),
        key("channels[].name", "string", "required", format!("one topic level, at most {CHANNEL_NAME_MAX_BYTES} bytes, and at most {encoded_max} once percent-encoded for its file name, where every byte outside A-Z a-z 0-9 _ - takes three (so at most {} bytes of others: a name of {CHANNEL_NAME_MAX_BYTES} bytes of multi-byte characters is refused); not . or .., no / + # or NUL, not starting with $; unique; not another queue's NAME.dlq", encoded_max / 3), "The channel's name: the first level of its topics."),
        key("channels[].kind", "append | latest | queue", "required", "", "A log, one value per topic, or work handed to one worker (docs/channels.md)."),
        key("channels[].storage", "string", "required", "the name of a storage provider", "The provider that keeps the channel."),
        key("channels[].retention_bytes", SIZE, "none", "append only; not above max_bytes", "Oldest records are removed past this many bytes, checked every second (from the byte count the channel keeps, reading nothing while under the bound)."),
        key("channels[].retention_age", DURATION, "none", longest("append and latest; above 0, "), "Append: records older than this are removed. Latest: deletion markers older than this are forgotten (values are never removed), raising the floor past them; a consumer whose position falls below the floor is sent every current value again (docs/channels.md). Checked every tenth of the shortest retention_age any channel has, at most once a second; a record with no timestamp is never too old and stops the walk."),
        key("channels[].retention_deletions", "integer", "none", "latest only; 0..=18446744073709551615", "At most this many deletion markers are kept, the oldest forgotten first, raising the floor past them, as retention_age does; checked every second from the count the channel keeps, reading nothing while under the bound."),
        key("channels[].max_bytes", SIZE, "none", "append and queue", "Publishes are refused past this many bytes (0x97)."),
        key("channels[].lease", DURATION, format_duration(DEFAULT_LEASE), longest("queue only; above 0, "), "How long a worker holds a job before it is retried."),
        key("channels[].max_attempts", "integer", DEFAULT_MAX_ATTEMPTS.to_string(), format!("queue only; 1..={MAX_ATTEMPTS_MAX}"), "Deliveries before a job moves to the dead-letter channel NAME.dlq."),
        key("channels[].backoff", "list of durations", format!("[{backoff}]"), longest("queue only; each "), "The gap before attempt n+1; the last gap repeats."),
        key("channels[].dlq_retention_bytes", SIZE, "none", "queue only", "Retention bound of the dead-letter channel NAME.dlq (same provider)."),
        key("channels[].max_held_per_worker", "integer", DEFAULT_MAX_HELD_PER_WORKER.to_string(), "queue only; 1..=65535", "Jobs one worker holds at once (sent and not yet answered): it is sent no more until it answers one. limits.max_inflight_messages and an MQTT 5 worker's Receive Maximum cap it too; this bounds one queue's workers below the broker's window (a worker that takes one job at a time: 1)."),
        key("broker", "mapping", "", "", "Broker-wide stores and timings."),
        key("broker.retained_storage", "string", "none (memory, not kept)", "the name of a storage provider", "The provider of the retained store."),
        key("broker.session_storage", "string", "none (memory, not kept)", "the name of a storage provider", "The provider of persistent sessions and the broadcast log."),
        key("broker.session.ack_commit_interval", DURATION, "200ms", longest("above 0, "), "How often durable consumers' positions are stored."),
        key("broker.exactly_once.expires_after", DURATION, "1h", longest("above 0, "), "An unreleased QoS 2 publish is dropped and counted after this."),
        key("broker.topic_aliases", "true | false", "true", "", "Outbound MQTT 5 topic aliases, per connection, up to the client's Topic Alias Maximum."),
        key("limits", "mapping", "", "", "Bounds on what clients may ask for."),
        key("limits.max_message_size", SIZE, "256KiB", format!("1..={MQTT_MAX_PACKET} bytes (MQTT's largest packet); with max_header_bytes at least {MIN_CONNECT_PACKET} bytes, the smallest CONNECT"), "With max_header_bytes, the largest packet accepted: max_message_size + max_header_bytes is the Maximum Packet Size announced to MQTT 5 clients, and any packet larger (PUBLISH, CONNECT, every kind) closes its connection. Neither is enforced alone: a PUBLISH whose payload and topic pass max_message_size is accepted while its whole packet fits the sum. The sum is also each bounded provider's reserve."),
        key("limits.max_header_bytes", SIZE, "8KiB", format!("at most {MQTT_MAX_PACKET} bytes; with max_message_size at least {MIN_CONNECT_PACKET} bytes"), "Room for user properties and other headers in the largest packet accepted: added to max_message_size (see there); not enforced alone."),
        key("limits.max_session_expiry", DURATION, "7d", "whole seconds, at most 4294967295 s", "Longest session expiry a client may ask for."),
        key("limits.max_connections", "integer", "10000", "1..=4294967295", "Most client connections open at once."),
        key("limits.receive_maximum", "integer", "64", "1..=65535", "The MQTT 5 Receive Maximum the broker announces: QoS 1/2 messages a client may send it unacknowledged. Unless limits.max_inflight_messages is set, also the most the broker sends a client unacknowledged."),
        key("limits.max_inflight_messages", "integer", "limits.receive_maximum", "1..=65535", "QoS 1/2 messages the broker sends one client and holds until acknowledged. An MQTT 3.1.1 client is sent this many; an MQTT 5 client the lesser of this and its Receive Maximum, which most libraries leave at 65,535 (one client that reads and does not acknowledge would otherwise hold 65,535 messages beside its queue's bound). A bridge's window is its own max_inflight."),
        key("limits.max_queued_messages", "integer", "1000", "0..=4294967295; 0 keeps none", "Per session, QoS 1/2 messages kept waiting for the client (offline, or beyond its window); more are dropped and counted (queue_full)."),
        key("limits.max_queued_bytes", SIZE, "none (bounded by count alone)", "0 keeps none (Mosquitto's 0 is no bound: here that is none)", "Per session, the bytes of the topics and payloads of the QoS 1/2 messages waiting, as max_queued_messages counts them; a message that would take a queue past it is dropped and counted (queue_full), one larger than it is never queued. QoS 0 to a connected client is dropped (slow_consumer) once its unwritten QoS 0 deliveries count this many bytes (at least 1 MiB, at most 1 GiB). Bounds what a slow or offline subscriber of large messages holds in memory (docs/operations.md, Sizing memory)."),
        key("limits.max_subscriptions_per_session", "integer", "100", "1..=4294967295", "Subscriptions one session may hold."),
        key("limits.max_sessions", "integer", "100000", "1..=4294967295", "Persistent sessions kept; a new one beyond is refused (CONNACK 0x97)."),
        key("limits.max_retained", "integer", "100000", "1..=4294967295", "Retained topics kept; a new one beyond is refused (0x97), replacing one is not."),
        key("limits.max_keep_alive", "integer (seconds)", "0 (the client's value)", "0..=65535 (MQTT's Keep Alive is 16 bits)", "Otherwise the cap on keep alive: an MQTT 5 client asking for more, or for 0, gets it as Server Keep Alive and is held to it; a 3.1.1 client asking for more, or for 0, is refused (return code 2)."),
        key("metrics.bind", "IP:PORT", "none (off)", "not a listener's port on an overlapping address", "Prometheus text format at /metrics; /healthz (live: the broker loop turned within 10 s) and /readyz (ready: serving, no provider failed) for probes; read by saguin status."),
        key("log.level", "error | warn | info | debug | trace", "info", "RUST_LOG overrides it", "Least severe log line written."),
        key("log.format", "logfmt | json", "logfmt", "", "How log lines are written (on stderr)."),
        key("bridges", "list", "none", "", "Links into other MQTT brokers (3.1.1 or 5): channels forwarded out at least once from a stored position, remote topics brought into channels."),
        key("bridges[].name", "string", "required", "one topic level, unique; its stored reader is bridge:NAME", "Names the bridge in logs, metrics and its channel positions; a position whose bridge left the configuration is dropped at startup. Its connection inside the broker has client id and principal bridge:NAME: a network CONNECT whose client id (0x85) or user name (0x86) begins bridge: is refused, for every name."),
        key("bridges[].address", "host:port | list", "required", "at least one", "The remote brokers, tried in order."),
        key("bridges[].round_robin", "true | false", "false", "", "false: the first address is the primary, tried first at every reconnect, and while connected to another the bridge looks every reconnect.cap whether it accepts connections again and returns to it; true: each reconnect starts at the address after the last that connected."),
        key("bridges[].protocol", "mqtt311 | mqtt5", "mqtt5", "", "The protocol spoken to the remote."),
        key("bridges[].client_id", "string", "HOSTNAME.NAME", "1..=65535 bytes; must be stable", "The client id at the remote, which keeps the bridge's session under it."),
        key("bridges[].username", "string", "none", "", "The user name given to the remote."),
        key("bridges[].password_file", PATH, "none", "needs username; its first line is the password", "Where the password sent to the remote is read from (never printed)."),
        key("bridges[].tls", "mapping", "none (plain TCP)", "", "TLS to the remote; the files are read and checked at load time."),
        key("bridges[].tls.ca", PATH, "required with tls", "PEM CA certificates", "The remote's certificate must chain to one of these."),
        key("bridges[].tls.cert", PATH, "none", "with key", "Client certificate chain for mutual TLS."),
        key("bridges[].tls.key", PATH, "none", "with cert", "The client certificate's private key (never printed)."),
        key("bridges[].tls.server_name", "string", "the host of the address", "a DNS name or IP address", "The name the remote's certificate must carry."),
        key("bridges[].keepalive", DURATION, "1m", "whole seconds, at most 65535 s", "MQTT Keep Alive towards the remote."),
        key("bridges[].session_expiry", DURATION, "1day", "whole seconds, at most 4294967295 s", "How long the remote keeps the bridge's session (its in subscriptions and what they queue) while the link is down."),
        key("bridges[].try_private", "true | false", "true with protocol: mqtt311", "protocol: mqtt311 only; refused beside protocol: mqtt5 (the default), whose subscriptions use No Local instead", "Announce protocol level 4|0x80 so a Mosquitto remote sends back nothing the bridge published (loop prevention)."),
        key("bridges[].reconnect.base", DURATION, "5s", longest("above 0, "), "First delay before a reconnect; doubled after each failure, with jitter."),
        key("bridges[].reconnect.cap", DURATION, "30s", longest("not below base, "), "Longest delay between reconnects."),
        key("bridges[].max_inflight", "integer", "20", "1..=65535", "Unacknowledged sends towards the remote, capped by its Receive Maximum."),
        key("bridges[].ack_timeout", DURATION, "30s", longest("above 0, "), "An unanswered send this old makes the bridge reconnect and resend with DUP."),
        key("bridges[].out", "list", "none", "", "Channels forwarded to the remote."),
        key("bridges[].out[].channel", "string", "required", "an append or latest channel, once per bridge", "The channel forwarded."),
        key("bridges[].out[].remote_prefix", "string", "\"\"", "no wildcard", "Put before each topic at the remote (telemetry/d1 -> sites/17/telemetry/d1)."),
        key("bridges[].out[].qos", "0 | 1", "1", "2 is refused", "1: at least once, the position passes a record only once the remote acknowledged it and everything before it; 0: at most once."),
        key("bridges[].out[].retain", "as_published | never", "as_published", "", "Whether the retain flag a record was published with is sent on. A latest channel's changes go out retained (a deletion as an empty retained publish, which deletes the remote's value) unless never."),
        key("bridges[].out[].from", "earliest | next", "earliest", "", "Where a bridge with no stored position starts: earliest is the first record, or a latest channel's current values; next is what comes after."),
        key("bridges[].in", "list", "none", "", "Remote topics brought into channels."),
        key("bridges[].in[].filter", "topic filter", "required", "not shared; begins with remote_prefix", "Subscribed to at the remote (MQTT 5: No Local, Retain As Published)."),
        key("bridges[].in[].remote_prefix", "string", "\"\"", "no wildcard", "Stripped from each remote topic."),
        key("bridges[].in[].local_prefix", "string", "\"\"", "the local topics' first level must be an append or latest channel", "Put before what is left of the topic."),
        key("bridges[].in[].qos", "0 | 1 | 2", "1", "the remote's Maximum QoS must allow it", "The QoS subscribed and published at; the remote is acknowledged only after the record commits (QoS 2: PUBREC once the publish is held, the record written at the remote's PUBREL)."),
        key("file_sha256", "mapping of path to hex", "", "written by check-config --output; on load each value must be a SHA-256 (64 hex digits) and is otherwise ignored: the digests are recomputed from the files", "The SHA-256 of every file the configuration names, as read."),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Every key path of a resolved document, lists written as `[]`.
    fn paths(prefix: &str, value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    if prefix == "file_sha256" {
                        continue;
                    }
                    out.push(path.clone());
                    paths(&path, v, out);
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    if item.is_object() {
                        paths(&format!("{prefix}[]"), item, out);
                    }
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_key_of_the_resolved_configuration_is_documented() {
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/config/example.yaml");
        let config = Config::load(fixture).expect("the example configuration loads");
        let mut found = Vec::new();
        paths("", &config.resolved(), &mut found);
        let documented: Vec<&str> = keys().iter().map(|k| k.path).collect();
        let missing: Vec<&String> = found
            .iter()
            .filter(|p| !documented.contains(&p.as_str()))
            .filter(|p| {
                // Sections: documented through their keys.
                !documented.iter().any(|d| d.starts_with(&format!("{p}.")))
            })
            .collect();
        assert!(missing.is_empty(), "undocumented keys: {missing:?}");
    }

    #[test]
    fn every_key_is_listed_once_with_a_meaning() {
        let all = keys();
        for (i, k) in all.iter().enumerate() {
            assert!(!k.meaning.is_empty(), "{}", k.path);
            assert!(
                all.iter().skip(i + 1).all(|other| other.path != k.path),
                "{} twice",
                k.path
            );
        }
    }
}
