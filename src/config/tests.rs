//! One test per rule and cross-check of the loader.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::broker::auth::Access;

/// A listener and anonymous access, so a snippet is about what it adds.
const BASE: &str =
    "listeners: [{name: mqtt, bind: \"127.0.0.1:1883\"}]\nauth: {allow_anonymous: true}\n";

fn origin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/config/good/inline.yaml")
}

fn load(yaml: &str) -> Result<Config, ConfigError> {
    Config::from_yaml_str(yaml, &origin())
}

fn ok(yaml: &str) -> Config {
    match load(yaml) {
        Ok(c) => c,
        Err(e) => panic!("refused: {:#?}", e.problems()),
    }
}

fn with_base(extra: &str) -> String {
    format!("{BASE}{extra}")
}

/// The problems as `path: message` lines.
fn problems(yaml: &str) -> Vec<String> {
    match load(yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.problems().iter().map(ToString::to_string).collect(),
    }
}

/// Exactly one problem, at `path`, whose message contains `needle`.
fn one_problem(yaml: &str, path: &str, needle: &str) {
    let found = problems(yaml);
    assert_eq!(found.len(), 1, "{found:#?}");
    let line = &found[0];
    if !path.is_empty() {
        assert!(line.starts_with(&format!("{path}: ")), "{line}");
    }
    assert!(line.contains(needle), "{line}");
}

fn sqlite(name: &str, extra: &str) -> String {
    format!("  - {{name: {name}, kind: sqlite, file_path: /srv/{name}.db{extra}}}\n")
}

#[test]
fn the_embedded_default_is_one_anonymous_listener_that_keeps_nothing() {
    let config = Config::embedded_default();
    assert_eq!(config.listeners.len(), 1);
    assert_eq!(config.listeners[0].bind.to_string(), "127.0.0.1:1883");
    assert!(config.auth.allow_anonymous);
    assert!(config.storage.is_empty() && config.channels.is_empty());
    assert!(!config.keeps_anything());
    assert!(config.origin.is_none());
    assert!(config.durability_summary()[0].contains("keeps nothing"));
}

#[test]
fn defaults_are_filled_in() {
    let config = ok(&with_base(&format!(
        "storage:\n{}channels:\n  - {{name: jobs, kind: queue, storage: db}}\n",
        sqlite("db", "")
    )));
    let listener = &config.listeners[0];
    assert_eq!(listener.handshake_timeout, Duration::from_secs(10));
    assert!(listener.tls.is_none());
    let Provider::Sqlite(db) = &config.storage[0] else {
        panic!("not sqlite")
    };
    assert_eq!(db.flush_interval, Duration::from_millis(150));
    assert_eq!(db.publish_commit_interval, None);
    assert_eq!(db.publish_commit_max_records, 256);
    assert_eq!(db.read_connections, 4);
    assert_eq!(db.checkpoint_room, 64 << 20);
    assert_eq!(db.max_bytes, None);
    let queue = config.channels[0].queue().expect("a queue");
    assert_eq!(queue.lease, Duration::from_secs(30));
    assert_eq!(queue.max_attempts, 5);
    assert_eq!(queue.backoff, [1, 5, 30].map(Duration::from_secs).to_vec());
    assert_eq!(queue.dlq_retention_bytes, None);
    assert_eq!(queue.max_held_per_worker, 64);
    assert_eq!(config.channels[0].dlq_name().as_deref(), Some("jobs.dlq"));
    assert_eq!(config.broker.retained_storage, None);
    assert_eq!(
        config.broker.session.ack_commit_interval,
        Duration::from_millis(200)
    );
    assert_eq!(
        config.broker.exactly_once.expires_after,
        Duration::from_secs(3600)
    );
    assert_eq!(
        config.limits,
        Limits {
            max_message_size: 262_144,
            max_header_bytes: 8192,
            max_session_expiry: Duration::from_secs(7 * 86_400),
            max_connections: 10_000,
            receive_maximum: 64,
            max_inflight_messages: 64,
            max_queued_messages: 1000,
            max_queued_bytes: None,
            max_subscriptions_per_session: 100,
            max_sessions: 100_000,
            max_retained: 100_000,
            max_keep_alive: 0,
        }
    );
    assert_eq!(config.metrics.bind, None);
    assert_eq!(config.log.level, LogLevel::Info);
    assert_eq!(config.log.format, LogFormat::Logfmt);
    assert_eq!(config.reserve_bytes(), 270_336);
}

#[test]
fn anonymous_access_is_off_by_default_in_a_file_and_then_needs_a_password_file() {
    one_problem(
        "listeners: [{name: mqtt, bind: \"127.0.0.1:1883\"}]\n",
        "auth",
        "no client could connect",
    );
    let config = ok("listeners: [{name: mqtt, bind: \"127.0.0.1:1883\"}]\nauth: {password_file: ../files/passwords}\n");
    assert!(!config.auth.allow_anonymous);
    let passwords = config.auth.passwords.as_ref().expect("parsed");
    assert_eq!(passwords.len(), 2);
    assert!(crate::broker::auth::check_password(
        passwords,
        "alice",
        b"alice-pw"
    ));
    assert!(!crate::broker::auth::check_password(
        passwords, "alice", b"bob-pw"
    ));
}

#[test]
fn the_acl_file_is_parsed_for_the_broker() {
    let config = ok(&with_base("").replace(
        "auth: {allow_anonymous: true}",
        "auth: {allow_anonymous: true, acl_file: ../files/acl}",
    ));
    let acl = config.auth.acl.as_ref().expect("parsed");
    assert!(crate::broker::auth::acl::allows(
        acl,
        Some("alice"),
        "c",
        "telemetry/x",
        Access::Write
    ));
    assert!(!crate::broker::auth::acl::allows(
        acl,
        Some("alice"),
        "c",
        "telemetry/secret",
        Access::Read
    ));
    assert!(crate::broker::auth::acl::allows(
        acl,
        None,
        "dev1",
        "devices/dev1/temp",
        Access::Write
    ));
    assert!(crate::broker::auth::acl::allows(
        acl,
        None,
        "c",
        "public/a",
        Access::Read
    ));
}

#[test]
fn tls_files_are_loaded_into_a_server_configuration() {
    let config = ok(&with_base("").replace(
        "bind: \"127.0.0.1:1883\"}",
        "bind: \"127.0.0.1:8883\", tls: {cert: ../files/server.pem, key: ../files/server.key, client_ca: ../files/ca.pem}}",
    ));
    let tls = config.listeners[0].tls.as_ref().expect("tls");
    assert_eq!(tls.material.chain_len, 1);
    assert_eq!(tls.material.client_ca_len, 1);
    assert!(tls.cert.is_absolute());
    assert!(format!("{config:?}").contains("<redacted>"));
}

#[test]
fn unknown_keys_are_errors_at_every_level() {
    one_problem(
        &with_base("limits: {foo: 1}\n"),
        "limits.foo",
        "unknown key",
    );
    one_problem(&with_base("colour: blue\n"), "colour", "unknown key");
    one_problem(
        &with_base("log: {level: info, colour: red}\n"),
        "log.colour",
        "unknown key",
    );
    one_problem(
        &with_base("broker: {session: {x: 1}}\n"),
        "broker.session.x",
        "unknown key",
    );
    one_problem(
        &with_base(&format!("storage:\n{}", sqlite("db", ", journal: wal"))),
        "storage[0].journal",
        "unknown key",
    );
}

#[test]
fn listener_rules() {
    one_problem(
        "listeners: [{name: a, bind: x}]\nauth: {allow_anonymous: true}\n",
        "listeners[0].bind",
        "invalid socket address \"x\"",
    );
    one_problem(
        "listeners: [{name: a, bind: \"127.0.0.1:1\"}, {name: a, bind: \"127.0.0.1:2\"}]\nauth: {allow_anonymous: true}\n",
        "listeners[1].name",
        "duplicate listener name \"a\" (also listeners[0])",
    );
    one_problem(
        "listeners: [{name: a, bind: \"[::]:1883\"}, {name: b, bind: \"127.0.0.1:1883\"}]\nauth: {allow_anonymous: true}\n",
        "listeners[1].bind",
        "overlapping address",
    );
    // An IPv4-mapped IPv6 address binds the IPv4 address it maps.
    one_problem(
        "listeners: [{name: a, bind: \"[::ffff:127.0.0.1]:1883\"}, {name: b, bind: \"127.0.0.1:1883\"}]\nauth: {allow_anonymous: true}\n",
        "listeners[1].bind",
        "overlapping address",
    );
    one_problem(
        "listeners: [{name: m, bind: \"127.0.0.1:9464\"}]\nauth: {allow_anonymous: true}\nmetrics: {bind: \"[::ffff:127.0.0.1]:9464\"}\n",
        "metrics.bind",
        "overlapping address",
    );
    // Port 0: the system picks a free port for each; no conflict.
    let config = ok("listeners: [{name: a, bind: \"127.0.0.1:0\"}, {name: b, bind: \"127.0.0.1:0\"}]\nauth: {allow_anonymous: true}\n");
    assert_eq!(config.listeners[1].bind.port(), 0);
    // Different addresses, one port: fine.
    ok("listeners: [{name: a, bind: \"127.0.0.1:1883\"}, {name: b, bind: \"127.0.0.2:1883\"}]\nauth: {allow_anonymous: true}\n");
    one_problem(
        "auth: {allow_anonymous: true}\n",
        "listeners",
        "no listener is configured",
    );
    one_problem(
        &with_base("metrics: {bind: \"0.0.0.0:1883\"}\n"),
        "metrics.bind",
        "listeners[0].bind",
    );
    let config = ok(&with_base("metrics: {bind: \"127.0.0.1:9464\"}\n"));
    assert_eq!(config.metrics.bind.map(|a| a.port()), Some(9464));
    one_problem(
        &with_base("").replace("}]", ", handshake_timeout: 0s}]"),
        "listeners[0].handshake_timeout",
        "longer than zero",
    );
}

#[test]
fn the_channels_served_are_capped_dead_letter_channels_counted() {
    let channels = |append: usize, queues: usize| {
        let mut yaml = format!("storage:\n{}channels:\n", sqlite("db", ""));
        for i in 0..append {
            yaml.push_str(&format!("  - {{name: a{i}, kind: append, storage: db}}\n"));
        }
        for i in 0..queues {
            yaml.push_str(&format!("  - {{name: q{i}, kind: queue, storage: db}}\n"));
        }
        with_base(&yaml)
    };
    let config = ok(&channels(MAX_SERVED_CHANNELS, 0));
    assert_eq!(config.channels.len(), MAX_SERVED_CHANNELS);
    assert_eq!(config.served_channels(), MAX_SERVED_CHANNELS);
    one_problem(
        &channels(MAX_SERVED_CHANNELS + 1, 0),
        "channels",
        &format!("make 10001 to serve; the limit is {MAX_SERVED_CHANNELS}"),
    );
    // Each queue brings its dead-letter channel.
    assert_eq!(
        ok(&channels(MAX_SERVED_CHANNELS - 2, 1)).served_channels(),
        MAX_SERVED_CHANNELS
    );
    one_problem(
        &channels(MAX_SERVED_CHANNELS - 1, 1),
        "channels",
        "10000 channels configured and a dead-letter channel for each of 1 queues make 10001",
    );
}

#[test]
fn a_channel_must_name_an_existing_provider() {
    one_problem(
        &with_base(&format!(
            "storage:\n{}channels:\n  - {{name: a, kind: append, storage: db}}\n  - {{name: b, kind: append, storage: db}}\n  - {{name: c, kind: append, storage: db2}}\n",
            sqlite("db", "")
        )),
        "channels[2].storage",
        "no provider named \"db2\"",
    );
    one_problem(
        &with_base("broker: {session_storage: db}\n"),
        "broker.session_storage",
        "no provider named \"db\"",
    );
    // `none` is the absence of a provider.
    let config = ok(&with_base("broker: {retained_storage: none}\n"));
    assert_eq!(config.broker.retained_storage, None);
}

#[test]
fn sqlite_bounds_round_to_pages_and_keep_twice_the_reserve() {
    let yaml = |max: &str| {
        with_base(&format!(
            "storage:\n{}",
            sqlite("db", &format!(", max_bytes: {max}"))
        ))
    };
    one_problem(
        &yaml("4000"),
        "storage[0].max_bytes",
        "rounds down to 0 pages",
    );
    // Reserve: 262144 + 8192 = 270336 = 66 pages exactly; twice is 540672.
    one_problem(
        &yaml("540671"),
        "storage[0].max_bytes",
        "540671 bytes (131 pages of 4096) is below twice the reserve: the reserve is 270336 bytes",
    );
    let config = ok(&yaml("540672"));
    let bound = config.storage[0]
        .bound(config.reserve_bytes())
        .expect("bounded");
    assert_eq!(bound.pages, Some(132));
    assert_eq!(bound.reserve_bytes, 270_336);
    assert_eq!(bound.publish_limit_bytes, 270_336);
    // A reserve that is not a whole number of pages rounds up.
    let config = ok(&format!(
        "{}limits: {{max_message_size: 1000, max_header_bytes: 100}}\n",
        yaml("10MB")
    ));
    let Provider::Sqlite(db) = &config.storage[0] else {
        panic!()
    };
    let bound = config.storage[0]
        .bound(config.reserve_bytes())
        .expect("bounded");
    assert_eq!(bound.max_bytes, 10_000_000);
    assert_eq!(bound.pages, Some(2441));
    assert_eq!(bound.effective_bytes, 2441 * 4096);
    assert_eq!(bound.reserve_bytes, 4096);
    assert_eq!(db.page_ceilings(config.reserve_bytes()), Some((2440, 2441)));
    // The reserve follows the limits: a bigger message size refuses the bound.
    one_problem(
        &format!("{}limits: {{max_message_size: 100MiB}}\n", yaml("128MiB")),
        "storage[0].max_bytes",
        "below twice the reserve",
    );
}

#[test]
fn memory_bounds_keep_twice_the_reserve() {
    let yaml = |max: &str| {
        with_base(&format!(
            "storage:\n  - {{name: m, kind: memory, max_bytes: {max}}}\n"
        ))
    };
    one_problem(
        &yaml("540671"),
        "storage[0].max_bytes",
        "below twice the reserve",
    );
    let config = ok(&yaml("540672"));
    let bound = config.storage[0]
        .bound(config.reserve_bytes())
        .expect("bounded");
    assert_eq!(bound.pages, None);
    assert_eq!(bound.publish_limit_bytes, 540_672 - 270_336);
    assert_eq!(ok(&yaml("none")).storage[0].max_bytes(), None);
}

#[test]
fn sqlite_intervals_are_bounded() {
    let yaml = |extra: &str| with_base(&format!("storage:\n{}", sqlite("db", extra)));
    one_problem(
        &yaml(", flush_interval: 9ms"),
        "storage[0].flush_interval",
        "outside 10ms..=1s",
    );
    one_problem(
        &yaml(", flush_interval: 1001ms"),
        "storage[0].flush_interval",
        "outside 10ms..=1s",
    );
    ok(&yaml(", flush_interval: 10ms"));
    ok(&yaml(", flush_interval: 1s"));
    one_problem(
        &yaml(", publish_commit_interval: 1001ms"),
        "storage[0].publish_commit_interval",
        "longer than 1s",
    );
    let config = ok(&yaml(
        ", publish_commit_interval: 1s, publish_commit_max_records: 64, read_connections: 0",
    ));
    let Provider::Sqlite(db) = &config.storage[0] else {
        panic!()
    };
    assert_eq!(db.publish_commit_interval, Some(Duration::from_secs(1)));
    assert_eq!(db.publish_commit_max_records, 64);
    assert_eq!(db.read_connections, 0);
    // Zero is written `none`.
    let config = ok(&yaml(", publish_commit_interval: 0s"));
    let Provider::Sqlite(db) = &config.storage[0] else {
        panic!()
    };
    assert_eq!(db.publish_commit_interval, None);
    one_problem(
        &yaml(", publish_commit_max_records: 0"),
        "storage[0].publish_commit_max_records",
        "outside 1..=",
    );
    one_problem(
        &yaml(", read_connections: 65"),
        "storage[0].read_connections",
        "outside 0..=64",
    );
    for (written, bytes) in [("0", 0), ("8MiB", 8 << 20), ("1GiB", 1 << 30)] {
        let config = ok(&yaml(&format!(", checkpoint_room: {written}")));
        let Provider::Sqlite(db) = &config.storage[0] else {
            panic!()
        };
        assert_eq!(db.checkpoint_room, bytes, "{written}");
    }
    one_problem(
        &yaml(", checkpoint_room: 1025MiB"),
        "storage[0].checkpoint_room",
        "above 1GiB",
    );
    one_problem(
        &yaml(", checkpoint_room: lots"),
        "storage[0].checkpoint_room",
        "",
    );
}

#[test]
fn providers_do_not_share_names_or_places() {
    one_problem(
        &with_base(&format!(
            "storage:\n{}{}",
            sqlite("db", ""),
            sqlite("db", "").replace("db.db", "other.db")
        )),
        "storage[1].name",
        "duplicate provider name \"db\" (also storage[0])",
    );
    one_problem(
        &with_base(&format!(
            "storage:\n{}{}",
            sqlite("a", ""),
            sqlite("b", "").replace("b.db", "a.db")
        )),
        "storage[1].file_path",
        "two providers cannot share a database",
    );
    one_problem(
        &with_base("storage:\n  - {name: a, kind: memory, snapshot_dir: /srv/s}\n  - {name: b, kind: memory, snapshot_dir: /srv/./s}\n"),
        "storage[1].snapshot_dir",
        "is also storage[0]",
    );
    one_problem(
        &with_base("storage:\n  - {name: a, kind: memory, snapshot_dir: /srv/s}\n  - {name: b, kind: sqlite, file_path: /srv/s}\n"),
        "storage[1].file_path",
        "is also storage[0]",
    );
    // A file_path that is a directory cannot be a database.
    let dir = tempfile::tempdir().expect("temp dir");
    one_problem(
        &with_base(&format!(
            "storage:\n  - {{name: a, kind: sqlite, file_path: {}}}\n",
            dir.path().display()
        )),
        "storage[0].file_path",
        "is a directory",
    );
}

#[test]
fn channel_name_rules() {
    let yaml = |name: &str| {
        with_base(&format!(
            "storage:\n{}channels:\n  - {{name: '{name}', kind: append, storage: db}}\n",
            sqlite("db", "")
        ))
    };
    for (name, why) in [
        (".", "cannot be a channel name"),
        ("..", "cannot be a channel name"),
        ("a/b", "one topic level"),
        ("a+", "wildcard"),
        ("#", "wildcard"),
        ("$x", "starts with '$'"),
    ] {
        one_problem(&yaml(name), "channels[0].name", why);
    }
    one_problem(
        &yaml(&"n".repeat(129)),
        "channels[0].name",
        "129 bytes; the limit is 128",
    );
    one_problem(
        &yaml(&".".repeat(74)),
        "channels[0].name",
        "up to 256 bytes",
    );
    ok(&yaml(&"n".repeat(128)));
    ok(&yaml("a.b"));
    ok(&yaml("..."));
}

#[test]
fn dead_letter_channels_stay_with_their_queue() {
    let channels = |list: &str| {
        with_base(&format!(
            "storage:\n{}{}channels:\n{list}",
            sqlite("db", ""),
            sqlite("db2", "")
        ))
    };
    one_problem(
        &channels("  - {name: jobs, kind: queue, storage: db}\n  - {name: jobs.dlq, kind: append, storage: db2}\n"),
        "channels[1].name",
        "dead-letter channel of queue \"jobs\"",
    );
    one_problem(
        &channels(&format!(
            "  - {{name: {}, kind: queue, storage: db}}\n",
            "q".repeat(125)
        )),
        "channels[0].name",
        "would be 129 bytes",
    );
    one_problem(
        &channels(
            "  - {name: a, kind: append, storage: db}\n  - {name: a, kind: latest, storage: db2}\n",
        ),
        "channels[1].name",
        "duplicate channel name \"a\" (also channels[0])",
    );
}

#[test]
fn keys_belong_to_their_channel_kind() {
    let one = |channel: &str, path: &str, needle: &str| {
        one_problem(
            &with_base(&format!(
                "storage:\n{}channels:\n  - {channel}\n",
                sqlite("db", "")
            )),
            path,
            needle,
        )
    };
    one(
        "{name: a, kind: append, storage: db, lease: 1s}",
        "channels[0].lease",
        "only a queue channel",
    );
    one(
        "{name: a, kind: latest, storage: db, max_bytes: 1MiB}",
        "channels[0].max_bytes",
        "no max_bytes",
    );
    one(
        "{name: a, kind: latest, storage: db, retention_bytes: 1MiB}",
        "channels[0].retention_bytes",
        "only an append channel",
    );
    one(
        "{name: a, kind: queue, storage: db, retention_age: 1d}",
        "channels[0].retention_age",
        "no retention_age",
    );
    one(
        "{name: a, kind: queue, storage: db, max_attempts: 0}",
        "channels[0].max_attempts",
        "outside 1..=1000",
    );
    one(
        "{name: a, kind: queue, storage: db, max_held_per_worker: 0}",
        "channels[0].max_held_per_worker",
        "outside 1..=65535",
    );
    one(
        "{name: a, kind: append, storage: db, max_held_per_worker: 8}",
        "channels[0].max_held_per_worker",
        "only a queue channel",
    );
    one(
        "{name: a, kind: queue, storage: db, lease: 0s}",
        "channels[0].lease",
        "longer than zero",
    );
    one(
        "{name: a, kind: queue, storage: db, backoff: [1s, x]}",
        "channels[0].backoff[1]",
        "invalid duration",
    );
    one(
        "{name: a, kind: append, storage: db, retention_bytes: 2GiB, max_bytes: 1GiB}",
        "channels[0].retention_bytes",
        "more than max_bytes",
    );
    one(
        "{name: a, kind: fifo, storage: db}",
        "channels[0].kind",
        "not one of append, latest, queue",
    );
    one(
        "{name: a, kind: append, storage: db, retention_deletions: 10}",
        "channels[0].retention_deletions",
        "only a latest channel",
    );
    one(
        "{name: a, kind: queue, storage: db, retention_deletions: 10}",
        "channels[0].retention_deletions",
        "only a latest channel",
    );
    one(
        "{name: a, kind: latest, storage: db, retention_deletions: -1}",
        "channels[0].retention_deletions",
        "expected a whole number",
    );
    one(
        "{name: a, kind: latest, storage: db, retention_deletions: lots}",
        "channels[0].retention_deletions",
        "expected a whole number",
    );
    let config = ok(&with_base(&format!(
        "storage:\n{}channels:\n  - {{name: a, kind: queue, storage: db, backoff: [], max_bytes: 1MB, dlq_retention_bytes: 64MiB, max_held_per_worker: 1000}}\n  - {{name: b, kind: latest, storage: db, retention_age: 30d, retention_deletions: 100000}}\n  - {{name: c, kind: latest, storage: db, retention_deletions: none}}\n",
        sqlite("db", "")
    )));
    assert_eq!(config.channels[1].retention_deletions, Some(100_000));
    assert_eq!(config.channels[2].retention_deletions, None);
    let queue = config.channels[0].queue().expect("queue");
    assert!(queue.backoff.is_empty());
    assert_eq!(queue.dlq_retention_bytes, Some(64 << 20));
    assert_eq!(queue.max_held_per_worker, 1000);
    assert_eq!(config.channels[0].max_bytes, Some(1_000_000));
    assert_eq!(
        config.channels[1].retention_age,
        Some(Duration::from_secs(30 * 86_400))
    );
}

#[test]
fn the_outbound_window_is_the_inbound_one_unless_set() {
    let window = |limits: &str| {
        ok(&with_base(&format!("limits: {{{limits}}}\n")))
            .limits
            .max_inflight_messages
    };
    assert_eq!(window("receive_maximum: 100"), 100);
    assert_eq!(
        window("receive_maximum: 100, max_inflight_messages: 20"),
        20
    );
    assert_eq!(window("max_inflight_messages: 1000"), 1000);
}

#[test]
fn limits_are_checked_against_mqtt() {
    let one = |limits: &str, path: &str, needle: &str| {
        one_problem(&with_base(&format!("limits: {{{limits}}}\n")), path, needle)
    };
    one(
        "receive_maximum: 0",
        "limits.receive_maximum",
        "outside 1..=65535",
    );
    one(
        "receive_maximum: 65536",
        "limits.receive_maximum",
        "outside 1..=65535",
    );
    one(
        "max_inflight_messages: 0",
        "limits.max_inflight_messages",
        "outside 1..=65535",
    );
    one(
        "max_message_size: 256MiB",
        "limits.max_message_size",
        "MQTT's largest packet",
    );
    one(
        "max_session_expiry: 1500ms",
        "limits.max_session_expiry",
        "whole seconds",
    );
    one(
        "max_session_expiry: 200years",
        "limits.max_session_expiry",
        "longer than 4294967295s",
    );
    assert_eq!(
        ok(&with_base("limits: {max_session_expiry: 4294967295s}\n"))
            .limits
            .max_session_expiry,
        Duration::from_secs(u64::from(u32::MAX))
    );
    one(
        "max_connections: 0",
        "limits.max_connections",
        "outside 1..=",
    );
    one(
        "max_subscriptions_per_session: 0",
        "limits.max_subscriptions_per_session",
        "outside 1..=",
    );
    let config = ok(&with_base(
        "limits: {max_queued_messages: 0, max_message_size: 1MB, max_session_expiry: 1h}\n",
    ));
    assert_eq!(config.limits.max_queued_messages, 0);
    assert_eq!(config.limits.max_message_size, 1_000_000);
    assert_eq!(config.limits.max_session_expiry, Duration::from_secs(3600));
    one("max_queued_bytes: lots", "limits.max_queued_bytes", "lots");
    one(
        "max_queued_bytes: -1",
        "limits.max_queued_bytes",
        "whole number of bytes",
    );
    let queued_bytes = |value: &str| {
        ok(&with_base(&format!(
            "limits: {{max_queued_bytes: {value}}}\n"
        )))
        .limits
        .max_queued_bytes
    };
    assert_eq!(queued_bytes("16MiB"), Some(16 << 20));
    assert_eq!(queued_bytes("0"), Some(0));
    assert_eq!(queued_bytes("none"), None);
}

#[test]
fn every_problem_is_reported_not_only_the_first() {
    let found = problems(
        "listeners: [{name: a, bind: x}]\nauth: {allow_anonymous: maybe}\nlimits: {foo: 1, receive_maximum: 0}\nlog: {level: loud}\n",
    );
    let paths: Vec<&str> = found
        .iter()
        .map(|l| l.split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(
        paths,
        [
            "listeners[0].bind",
            "auth.allow_anonymous",
            "limits.receive_maximum",
            "limits.foo",
            "log.level"
        ],
        "{found:#?}"
    );
}

#[test]
fn yaml_errors_and_shapes_are_problems_too() {
    let found = problems("listeners: [\n");
    assert!(found[0].starts_with("not valid YAML"), "{found:?}");
    one_problem("- a\n", "", "expected a mapping");
    // An empty document is an empty configuration: no listener.
    let found = problems("");
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("listeners: no listener is configured"));
    assert!(found[1].starts_with("auth: allow_anonymous is false"));
    // Anchors and merge keys work.
    let config = ok("listeners:\n  - &first {name: a, bind: \"127.0.0.1:0\", handshake_timeout: 5s}\n  - {<<: *first, name: b}\nauth: {allow_anonymous: true}\n");
    assert_eq!(config.listeners[1].name, "b");
    assert_eq!(
        config.listeners[1].handshake_timeout,
        Duration::from_secs(5)
    );
}

#[test]
fn sizes_and_durations_accept_units_and_none() {
    let config = ok(&with_base(&format!(
        "storage:\n{}channels:\n  - {{name: t, kind: append, storage: db, retention_bytes: 1GB, retention_age: none, max_bytes: 2GiB}}\n",
        sqlite("db", ", max_bytes: 4GiB, flush_interval: 1s")
    )));
    assert_eq!(config.storage[0].max_bytes(), Some(4 << 30));
    assert_eq!(config.channels[0].retention_bytes, Some(1_000_000_000));
    assert_eq!(config.channels[0].retention_age, None);
    one_problem(
        &with_base("broker: {session: {ack_commit_interval: 200}}\n"),
        "broker.session.ack_commit_interval",
        "give a unit",
    );
}

#[test]
fn durability_is_stated_per_channel_and_inert_providers_are_named() {
    let config = ok(&with_base(&format!(
        "storage:\n{}  - {{name: mem, kind: memory}}\n  - {{name: snap, kind: memory, snapshot_dir: /srv/snap, max_bytes: 1MiB}}\n{}channels:\n  - {{name: a, kind: append, storage: db}}\n  - {{name: b, kind: latest, storage: mem}}\n  - {{name: c, kind: queue, storage: snap}}\n",
        sqlite("db", ", flush_interval: 50ms, max_bytes: 1GiB"),
        sqlite("spare", "")
    )));
    let lines = config.durability_summary();
    let text = lines.join("\n");
    assert!(!text.contains("keeps nothing"), "{text}");
    assert!(text.contains("channel a (append) on provider db (sqlite): every commit is kept (in /srv/db.db), less about one flush_interval (50ms) on a power cut"), "{text}");
    assert!(
        text.contains("channel b (latest) on provider mem (memory): not kept"),
        "{text}"
    );
    assert!(text.contains("channel c (queue, with its dead-letter channel c.dlq) on provider snap (memory): kept as of the last snapshot generation (written to /srv/snap 250ms after the last change, at most 2s after a change); a crash, an OOM kill or a power cut loses up to the last 2s"), "{text}");
    assert!(text.contains("provider spare (sqlite): inert"), "{text}");
    assert!(
        text.contains("provider db (sqlite): max_bytes 1073741824 = 262144 pages of 4096 bytes"),
        "{text}"
    );
    assert!(
        text.contains("provider snap (memory): max_bytes 1048576 bytes; reserve 270336 bytes"),
        "{text}"
    );
    assert!(
        text.contains("provider mem (memory): no max_bytes"),
        "{text}"
    );
    assert!(
        text.contains("retained messages: memory, not kept"),
        "{text}"
    );
    assert!(config.is_inert("spare") && !config.is_inert("db"));

    // Only memory without snapshots: nothing is kept, and it is said first.
    let config = ok(&with_base("storage:\n  - {name: mem, kind: memory}\nchannels:\n  - {name: a, kind: append, storage: mem}\n"));
    assert!(config.durability_summary()[0].starts_with("this configuration keeps nothing"));
    // An inert sqlite provider keeps nothing either.
    let config = ok(&with_base(&format!("storage:\n{}", sqlite("db", ""))));
    assert!(!config.keeps_anything());
    // A broker store alone keeps something.
    let config = ok(&with_base(&format!(
        "storage:\n{}broker: {{session_storage: db}}\n",
        sqlite("db", "")
    )));
    assert!(config.keeps_anything());
}

/// A start states each channel up to 100 served (a queue's dead-letter
/// channel counted), past that a sentence for each provider's channels and
/// each channel's own sentence kept for the debug level.
#[test]
fn a_start_states_many_channels_a_provider_at_a_time() {
    let channels = |append: usize, queues: usize| {
        let mut yaml = format!(
            "storage:\n{}  - {{name: mem, kind: memory}}\nchannels:\n  - {{name: m, kind: latest, storage: mem, retention_deletions: 5}}\n",
            sqlite("db", "")
        );
        for i in 0..append {
            yaml.push_str(&format!("  - {{name: a{i}, kind: append, storage: db}}\n"));
        }
        for i in 0..queues {
            yaml.push_str(&format!("  - {{name: q{i}, kind: queue, storage: db}}\n"));
        }
        ok(&with_base(&yaml))
    };
    // 1 + 49 + 2 × 25 = 100 served: each stated, nothing left for debug.
    let config = channels(49, 25);
    assert_eq!(config.served_channels(), CHANNELS_STATED_ONE_BY_ONE);
    let (stated, lines) = config.durability_at_start();
    assert_eq!(stated, config.durability_summary());
    assert_eq!(lines, ChannelLines::Each);

    // One more append channel: a sentence for each provider.
    let config = channels(50, 25);
    let (stated, lines) = config.durability_at_start();
    assert_eq!(lines, ChannelLines::ByProvider);
    let each = config.channel_durability();
    let text = stated.join("\n");
    assert!(!text.contains("channel a0"), "{text}");
    assert!(text.contains("75 channels (50 append, 25 queue, each with its dead-letter channel) on provider db (sqlite): every commit is kept"), "{text}");
    assert!(
        text.contains("0 of them with bounds of their own"),
        "{text}"
    );
    assert!(
        text.contains("1 channel (1 latest) on provider mem (memory): not kept"),
        "{text}"
    );
    assert!(
        text.contains("1 of them with bounds of their own"),
        "{text}"
    );
    assert!(
        text.contains("provider db (sqlite): no max_bytes"),
        "{text}"
    );
    assert!(
        text.contains("retained messages: memory, not kept"),
        "{text}"
    );
    assert_eq!(each.len(), 76);
    assert!(
        each.iter().any(|l| l.starts_with(
            "channel q24 (queue, with its dead-letter channel q24.dlq) on provider db"
        )),
        "{each:?}"
    );
    // check-config still states every channel.
    assert_eq!(
        config
            .durability_summary()
            .iter()
            .filter(|l| l.starts_with("channel "))
            .count(),
        76
    );
}

#[test]
fn the_resolved_document_is_sorted_and_loads_back() {
    let config = ok(&with_base(&format!(
        "storage:\n{}  - {{name: a_mem, kind: memory}}\nchannels:\n  - {{name: z, kind: append, storage: db, retention_age: 90s}}\n  - {{name: b, kind: queue, storage: a_mem, backoff: [2s, 1s]}}\n  - {{name: c, kind: latest, storage: db, retention_deletions: 500}}\n",
        sqlite("db", ", publish_commit_interval: 5ms")
    )));
    let doc = config.resolved();
    assert_eq!(doc["channels"][1]["name"], "c");
    assert_eq!(doc["channels"][1]["retention_deletions"], 500);
    assert!(doc["channels"][1]["retention_age"].is_null());
    assert!(
        config
            .durability_summary()
            .iter()
            .any(|l| l.contains("channel c")
                && l.contains("deletions past the newest 500 forgotten")),
        "{:?}",
        config.durability_summary()
    );
    assert_eq!(doc["storage"][0]["name"], "a_mem");
    assert_eq!(doc["channels"][0]["name"], "b");
    assert_eq!(
        doc["channels"][0]["backoff"],
        serde_json::json!(["2s", "1s"])
    );
    assert_eq!(doc["channels"][2]["retention_age"], "1m 30s");
    assert_eq!(doc["storage"][1]["publish_commit_interval"], "5ms");
    let keys: Vec<&String> = doc.as_object().expect("a map").keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    let text = serde_norway::to_string(&doc).expect("yaml");
    let again = Config::from_yaml_str(&text, &origin()).expect("loads back");
    assert_eq!(again.resolved(), doc);
}

#[test]
fn relative_paths_resolve_against_the_file() {
    let config = ok(&with_base(
        "storage:\n  - {name: db, kind: sqlite, file_path: data/../data/./saguin.db}\n",
    ));
    let Provider::Sqlite(db) = &config.storage[0] else {
        panic!()
    };
    let dir = origin()
        .parent()
        .expect("a directory")
        .canonicalize()
        .expect("exists");
    assert_eq!(db.file_path, dir.join("data/saguin.db"));
}

#[test]
fn load_reads_files_and_tells_unreadable_from_invalid() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, with_base("")).expect("write");
    let config = Config::load(&path).expect("valid");
    assert_eq!(config.origin.as_deref(), Some(path.as_path()));
    assert!(matches!(
        Config::load(dir.path().join("missing.yaml")),
        Err(ConfigError::Unreadable { .. })
    ));
    assert!(matches!(
        Config::load(dir.path()),
        Err(ConfigError::Unreadable { .. })
    ));
    std::fs::write(&path, b"\xff").expect("write");
    assert!(matches!(
        Config::load(&path),
        Err(ConfigError::Invalid { .. })
    ));
}

#[test]
fn serve_serves_every_channel_kind() {
    let config = ok(&with_base(&format!(
        "storage:\n{}channels:\n  - {{name: telemetry, kind: append, storage: db}}\n  - {{name: devices, kind: latest, storage: db}}\n  - {{name: jobs, kind: queue, storage: db}}\n",
        sqlite("db", "")
    )));
    let unserved: Vec<String> = config.unserved().iter().map(ToString::to_string).collect();
    assert!(unserved.is_empty(), "{unserved:#?}");
}

/// The reference entry of `path`.
fn documented(path: &str) -> reference::KeyDoc {
    reference::keys()
        .into_iter()
        .find(|k| k.path == path)
        .unwrap_or_else(|| panic!("{path} is not documented"))
}

#[test]
fn a_database_may_not_be_a_file_another_provider_keeps_beside_its_own() {
    let two = |a: &str, b: &str| {
        with_base(&format!(
            "storage:\n  - {{name: p, kind: sqlite, file_path: {a}}}\n  - {{name: q, kind: sqlite, file_path: {b}}}\n"
        ))
    };
    for (suffix, what) in [
        (
            "-wal",
            "the write-ahead log of storage[0].file_path /srv/a.db",
        ),
        (
            "-shm",
            "the write-ahead log's index of storage[0].file_path",
        ),
        ("-journal", "the rollback journal of storage[0].file_path"),
        ("-room", "the checkpoint's room of storage[0].file_path"),
        (".lock", "the lock of storage[0].file_path /srv/a.db"),
        (
            ".lock-journal",
            "the lock's rollback journal of storage[0].file_path",
        ),
        (
            ".lock-wal",
            "the lock's write-ahead log of storage[0].file_path",
        ),
    ] {
        one_problem(
            &two("/srv/a.db", &format!("/srv/a.db{suffix}")),
            "storage[1].file_path",
            what,
        );
    }
    // Whichever comes first in the file, the one on the other's file is named.
    one_problem(
        &two("/srv/a.db-wal", "/srv/a.db"),
        "storage[0].file_path",
        "/srv/a.db-wal is the write-ahead log of storage[1].file_path /srv/a.db; two providers cannot share a database",
    );
    // A snapshot directory's lock is the memory provider's.
    one_problem(
        &with_base("storage:\n  - {name: m, kind: memory, snapshot_dir: /srv/snap}\n  - {name: q, kind: sqlite, file_path: /srv/snap/saguin.lock}\n"),
        "storage[1].file_path",
        "is the lock of storage[0].snapshot_dir /srv/snap",
    );
    one_problem(
        &with_base("storage:\n  - {name: q, kind: sqlite, file_path: /srv/snap/saguin.lock-journal}\n  - {name: m, kind: memory, snapshot_dir: /srv/snap}\n"),
        "storage[0].file_path",
        "the lock's rollback journal of storage[1].snapshot_dir",
    );
    // A name that merely begins like a sidecar is another database.
    ok(&two("/srv/a.db", "/srv/a.db-wal2"));
    ok(&two("/srv/a.db", "/srv/a.dbx"));
}

#[test]
fn a_symlink_whose_target_does_not_exist_yet_is_its_target() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().canonicalize().expect("canonical");
    std::os::unix::fs::symlink("a.db", d.join("l.db")).expect("symlink");
    let yaml = with_base(&format!(
        "storage:\n  - {{name: p, kind: sqlite, file_path: {0}/a.db}}\n  - {{name: q, kind: sqlite, file_path: {0}/l.db}}\n",
        d.display()
    ));
    one_problem(
        &yaml,
        "storage[1].file_path",
        &format!(
            "{}/l.db is also storage[0] (file_path); two providers cannot share a database",
            d.display()
        ),
    );
    // A link to where the other's write-ahead log goes is refused as well.
    std::os::unix::fs::symlink(d.join("a.db-wal"), d.join("w.db")).expect("symlink");
    one_problem(
        &yaml.replace("l.db", "w.db"),
        "storage[1].file_path",
        "is the write-ahead log of storage[0].file_path",
    );
    // A chain of links, and a snapshot directory behind one.
    std::os::unix::fs::symlink("l.db", d.join("ll.db")).expect("symlink");
    one_problem(
        &yaml.replace("l.db", "ll.db"),
        "storage[1].file_path",
        "two providers cannot share a database",
    );
    // A snapshot directory behind a dangling link is the same place, and
    // a link serve would not create the directory through.
    std::os::unix::fs::symlink("snap", d.join("to-snap")).expect("symlink");
    let found = problems(&with_base(&format!(
        "storage:\n  - {{name: a, kind: memory, snapshot_dir: {0}/snap}}\n  - {{name: b, kind: memory, snapshot_dir: {0}/to-snap}}\n",
        d.display()
    )));
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].starts_with("storage[1].snapshot_dir: ")
            && found[0].contains("is also storage[0] (snapshot_dir)"),
        "{found:#?}"
    );
    assert!(found[1].contains("is a symlink"), "{found:#?}");
    // A loop of links ends; it is no other provider's place.
    std::os::unix::fs::symlink("loop2", d.join("loop1")).expect("symlink");
    std::os::unix::fs::symlink("loop1", d.join("loop2")).expect("symlink");
    ok(&yaml.replace("l.db", "loop1"));
}

#[test]
fn every_duration_has_an_upper_bound_named_with_its_key() {
    const HUGE: &str = "18446744073709551615s";
    let bound = "is longer than 4294967295s (about 136 years)";
    let storage = "storage: [{name: m, kind: memory}]\n";
    for (yaml, path) in [
        (
            with_base("").replace("}]", &format!(", handshake_timeout: {HUGE}}}]")),
            "listeners[0].handshake_timeout",
        ),
        (
            with_base(&format!("{storage}channels: [{{name: q, kind: queue, storage: m, lease: {HUGE}}}]\n")),
            "channels[0].lease",
        ),
        (
            with_base(&format!("{storage}channels: [{{name: q, kind: queue, storage: m, backoff: [1s, {HUGE}]}}]\n")),
            "channels[0].backoff[1]",
        ),
        (
            with_base(&format!("{storage}channels: [{{name: t, kind: append, storage: m, retention_age: {HUGE}}}]\n")),
            "channels[0].retention_age",
        ),
        (
            with_base(&format!("broker: {{session: {{ack_commit_interval: {HUGE}}}}}\n")),
            "broker.session.ack_commit_interval",
        ),
        (
            with_base(&format!("broker: {{exactly_once: {{expires_after: {HUGE}}}}}\n")),
            "broker.exactly_once.expires_after",
        ),
        (
            with_base(&format!("limits: {{max_session_expiry: {HUGE}}}\n")),
            "limits.max_session_expiry",
        ),
    ] {
        one_problem(&yaml, path, bound);
    }
    let bridge = |keys: &str| {
        with_base(&format!(
            "{storage}channels: [{{name: t, kind: append, storage: m}}]\nbridges: [{{name: b, address: \"r:1883\", out: [{{channel: t}}], {keys}}}]\n"
        ))
    };
    let found = problems(&bridge(&format!(
        "reconnect: {{base: {HUGE}, cap: {HUGE}}}, ack_timeout: {HUGE}, session_expiry: {HUGE}"
    )));
    for path in [
        "bridges[0].reconnect.base",
        "bridges[0].reconnect.cap",
        "bridges[0].ack_timeout",
        "bridges[0].session_expiry",
    ] {
        assert!(
            found
                .iter()
                .any(|l| l.starts_with(&format!("{path}: ")) && l.contains(bound)),
            "{path}: {found:#?}"
        );
    }
    // The bound itself is accepted, and written back unchanged.
    let config = ok(&bridge("reconnect: {base: 4294967295s, cap: 4294967295s}"));
    assert_eq!(config.bridges[0].reconnect.cap, units::DURATION_MAX);
    let text = serde_norway::to_string(&config.resolved()).expect("yaml");
    let again = Config::from_yaml_str(&text, &origin()).expect("loads back");
    assert_eq!(again.resolved(), config.resolved());
    for key in [
        "listeners[].handshake_timeout",
        "channels[].lease",
        "bridges[].reconnect.cap",
        "bridges[].ack_timeout",
    ] {
        assert!(
            documented(key).bounds.contains("at most 4294967295s"),
            "{key}"
        );
    }
}

#[test]
fn the_message_and_header_limits_must_leave_room_for_a_connect() {
    let limits = |l: &str| with_base(&format!("limits: {{{l}}}\n"));
    one_problem(
        &limits("max_message_size: 1, max_header_bytes: 0"),
        "limits.max_message_size",
        "1 + limits.max_header_bytes 0 = 1 bytes is the largest packet the broker accepts, and the smallest CONNECT (MQTT 5, empty client id) is 15 bytes",
    );
    one_problem(
        &limits("max_message_size: 7, max_header_bytes: 7"),
        "limits.max_message_size",
        "at least 15",
    );
    let config = ok(&limits("max_message_size: 7, max_header_bytes: 8"));
    assert_eq!(
        crate::broker::server::limits_from(&config).max_packet_size,
        15
    );
    // Either alone at its lower edge leaves the other's default room.
    ok(&limits("max_message_size: 1"));
    ok(&limits("max_header_bytes: 0"));
    assert!(documented("limits.max_message_size")
        .bounds
        .contains("at least 15 bytes"));
    assert!(documented("limits.max_message_size")
        .meaning
        .contains("Neither is enforced alone"));
}

#[test]
fn the_reference_states_the_bounds_the_loader_enforces() {
    for key in ["max_sessions", "max_retained"] {
        one_problem(
            &with_base(&format!("limits: {{{key}: 0}}\n")),
            &format!("limits.{key}"),
            "0 is outside 1..=4294967295",
        );
        assert_eq!(
            documented(&format!("limits.{key}")).bounds,
            "1..=4294967295"
        );
    }
    // 64 two-byte characters are 128 bytes, and 384 once percent-encoded.
    let name = "é".repeat(64);
    one_problem(
        &with_base(&format!(
            "storage: [{{name: m, kind: memory}}]\nchannels: [{{name: {name}, kind: append, storage: m}}]\n"
        )),
        "channels[0].name",
        "once percent-encoded",
    );
    let text = documented("channels[].name").bounds;
    assert!(
        text.contains("at most 221 once percent-encoded")
            && text.contains("at most 73 bytes of others"),
        "{text}"
    );
    ok(&with_base(&format!(
        "storage: [{{name: m, kind: memory}}]\nchannels: [{{name: {}, kind: append, storage: m}}]\n",
        "é".repeat(36)
    )));
}

#[test]
fn a_bridge_session_expiry_is_whole_seconds_like_the_limit() {
    let bridge = |keys: &str| {
        with_base(&format!(
            "storage: [{{name: m, kind: memory}}]\nchannels: [{{name: t, kind: append, storage: m}}]\nbridges: [{{name: b, address: \"r:1883\", out: [{{channel: t}}]{keys}}}]\n"
        ))
    };
    one_problem(
        &bridge(", session_expiry: 1500ms"),
        "bridges[0].session_expiry",
        "must be whole seconds",
    );
    let config = ok(&bridge(", session_expiry: 2s"));
    assert_eq!(config.bridges[0].session_expiry, Duration::from_secs(2));
}

#[test]
fn try_private_is_refused_on_an_mqtt5_bridge_naming_its_protocol() {
    let bridge = |keys: &str| {
        with_base(&format!(
            "storage: [{{name: m, kind: memory}}]\nchannels: [{{name: t, kind: append, storage: m}}]\nbridges: [{{name: b, address: \"r:1883\", out: [{{channel: t}}]{keys}}}]\n"
        ))
    };
    one_problem(
        &bridge(", protocol: mqtt5, try_private: true"),
        "bridges[0].try_private",
        "only an mqtt311 bridge announces the private protocol level; bridges[0].protocol is mqtt5, whose",
    );
    one_problem(
        &bridge(", try_private: false"),
        "bridges[0].try_private",
        "bridges[0].protocol is mqtt5 (the default)",
    );
    // A refused protocol is reported alone.
    one_problem(
        &bridge(", protocol: mqtt4, try_private: true"),
        "bridges[0].protocol",
        "not one of mqtt311, mqtt5",
    );
    let config = ok(&bridge(", protocol: mqtt311, try_private: false"));
    assert!(!config.bridges[0].try_private);
    // The resolved document leaves it empty on mqtt5, and loads back.
    for yaml in [bridge(""), bridge(", protocol: mqtt311")] {
        let config = ok(&yaml);
        let doc = config.resolved();
        assert_eq!(
            doc["bridges"][0]["try_private"].is_null(),
            config.bridges[0].protocol == bridge::BridgeProtocol::Mqtt5
        );
        let text = serde_norway::to_string(&doc).expect("yaml");
        let again = Config::from_yaml_str(&text, &origin()).expect("loads back");
        assert_eq!(again.resolved(), doc);
    }
}

#[test]
fn file_sha256_is_checked_for_shape_and_otherwise_ignored_as_documented() {
    one_problem(
        &with_base("file_sha256: {\"/x\": \"00\"}\n"),
        "file_sha256./x",
        "64 hex digits",
    );
    ok(&with_base(&format!(
        "file_sha256: {{\"/nowhere\": \"{}\"}}\n",
        "0".repeat(64)
    )));
    assert!(documented("file_sha256")
        .bounds
        .contains("must be a SHA-256 (64 hex digits) and is otherwise ignored"));
}

#[test]
fn a_number_beyond_64_bits_is_too_large_at_its_key_path() {
    one_problem(
        &with_base("storage: [{name: m, kind: memory, max_bytes: 18446744073709551616}]\n"),
        "storage[0].max_bytes",
        "the number 18446744073709551616 is too large",
    );
    one_problem(
        &with_base("limits:\n  max_connections: -99999999999999999999\n"),
        "limits.max_connections",
        "the number -99999999999999999999 is too small",
    );
}

#[test]
fn a_bridge_key_file_holding_two_keys_is_refused_as_a_bridge() {
    let files = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/config/files");
    let dir = tempfile::tempdir().expect("temp dir");
    let key = std::fs::read_to_string(files.join("server.key")).expect("key");
    let two = dir.path().join("two.key");
    std::fs::write(&two, format!("{key}{key}")).expect("write");
    let found = problems(&with_base(&format!(
        "storage: [{{name: m, kind: memory}}]\nchannels: [{{name: t, kind: append, storage: m}}]\nbridges: [{{name: b, address: \"r:1883\", out: [{{channel: t}}], tls: {{ca: {0}/ca.pem, cert: {0}/server.pem, key: {1}}}}}]\n",
        files.display(),
        two.display()
    )));
    assert!(
        found.len() == 1
            && found[0].starts_with("bridges[0].tls.key: ")
            && found[0].ends_with("2 private keys; a bridge takes exactly one"),
        "{found:#?}"
    );
}

#[test]
fn a_snapshot_dir_that_is_a_symlink_is_refused_as_serve_refuses_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().canonicalize().expect("canonical");
    std::fs::create_dir(d.join("real")).expect("mkdir");
    std::os::unix::fs::symlink("real", d.join("snap")).expect("symlink");
    let yaml = |name: &str| {
        with_base(&format!(
            "storage: [{{name: m, kind: memory, snapshot_dir: {}/{name}}}]\n",
            d.display()
        ))
    };
    one_problem(
        &yaml("snap"),
        "storage[0].snapshot_dir",
        "snap is a symlink; a snapshot directory is named as the directory itself",
    );
    ok(&yaml("real"));
    // One not created yet is created by serve; a file is no directory.
    ok(&yaml("later"));
    std::fs::write(d.join("file"), b"").expect("write");
    one_problem(
        &yaml("file"),
        "storage[0].snapshot_dir",
        "exists and is not a directory",
    );
}

#[test]
fn a_memory_provider_keeps_a_snapshot_room_only_with_a_directory() {
    let memory =
        |extra: &str| with_base(&format!("storage:\n  - {{name: m, kind: memory{extra}}}\n"));
    let room = |config: &Config| match &config.storage[0] {
        Provider::Memory(m) => m.snapshot_room,
        other => panic!("{other:?}"),
    };
    assert_eq!(room(&ok(&memory(", snapshot_dir: /srv/snap"))), 64 << 20);
    assert_eq!(room(&ok(&memory(""))), 0, "nothing to keep it in");
    assert_eq!(
        room(&ok(&memory(
            ", snapshot_dir: /srv/snap, snapshot_room: 8MiB"
        ))),
        8 << 20
    );
    assert_eq!(room(&ok(&memory(", snapshot_room: 0"))), 0);
    one_problem(
        &memory(", snapshot_room: 8MiB"),
        "storage[0].snapshot_room",
        "needs a snapshot_dir",
    );
    one_problem(
        &memory(", snapshot_dir: /srv/snap, snapshot_room: 2GiB"),
        "storage[0].snapshot_room",
        "above 1GiB",
    );
    one_problem(
        &with_base(
            "storage:\n  - {name: d, kind: sqlite, file_path: /srv/a.db, snapshot_room: 8MiB}\n",
        ),
        "storage[0].snapshot_room",
        "only a memory provider",
    );
}
