//! The configuration: one YAML file into typed, validated, resolved
//! settings. Every key is documented in [`reference`] (rendered as the
//! `saguin-config(5)` man page, `man/saguin-config.5`); a commented example
//! is `fixtures/config/example.yaml`.
//!
//! [`Config::load`] is the only loader: `saguin serve` and
//! `saguin check-config` both call it, so "check-config says OK, serve
//! refuses" cannot happen. Loading reads the YAML,
//! fills every default, runs every cross-check, and opens and parses every
//! file the configuration names except the databases: the password file, the
//! ACL file, TLS certificates and keys. Every problem is collected, each with
//! its YAML path (`channels[2].storage: no provider named "db2"`), rather
//! than stopping at the first.
//!
//! Decisions this module makes where MQTT and the storage rules leave a choice (documented in
//! `docs` of each field and in `man saguin-check-config`):
//!
//! - `auth.allow_anonymous` defaults to `true` only in the embedded default;
//!   a configuration file that omits it gets `false`, and such a file must
//!   then name a `password_file`, or no client could ever connect.
//! - A listener `bind` with port 0 is accepted: the system picks a free port
//!   (what tests and ephemeral deployments need); the broker reports it.
//!   check-config never binds, because the broker it checks may be running.
//! - Relative paths resolve against the directory of the configuration file.
//! - A provider no channel, `retained_storage` or `session_storage` names is
//!   inert: valid, and said so
//!   in the summary.
//! - An absent `max_bytes` means no bound and no reserve.

pub mod auth;
pub mod bridge;
mod names;
mod output;
mod parse;
pub mod reference;
mod secret;
mod summary;
#[cfg(test)]
mod tests;
mod tls;
pub mod units;
mod unserved;
mod validate;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use auth::{AclFile, PasswordFile};
pub use names::{
    channel_file_name, check_channel_name, CHANNEL_NAME_MAX_BYTES, FILE_NAME_MAX_BYTES,
    MAX_SERVED_CHANNELS,
};
pub use secret::Secret;
pub use summary::{ChannelLines, CHANNELS_STATED_ONE_BY_ONE};
pub use tls::TlsMaterial;
pub use unserved::Unserved;

/// SQLite page size on a database saguin creates: bounds are computed in these pages.
pub const SQLITE_PAGE_SIZE: u64 = 4096;

/// The largest configuration file read, so a wrong `--config` (a disk image,
/// `/dev/zero`) is refused instead of read into memory.
pub const MAX_CONFIG_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// A fully resolved, validated configuration. Every default is filled in;
/// every provider a channel or the broker names exists; every file named has
/// been opened and parsed.
#[derive(Debug, Clone)]
pub struct Config {
    /// MQTT listeners, in the order the file gives them.
    pub listeners: Vec<Listener>,
    pub auth: Auth,
    /// Storage providers, in the order the file gives them (YAML key `storage`).
    pub storage: Vec<Provider>,
    /// Channels, in the order the file gives them.
    pub channels: Vec<Channel>,
    pub broker: Broker,
    pub limits: Limits,
    pub metrics: Metrics,
    pub log: Log,
    /// Bridges into other brokers, in the order the file gives them.
    pub bridges: Vec<bridge::Bridge>,
    /// Where the configuration came from: the file, or `None` for the
    /// embedded default.
    pub origin: Option<PathBuf>,
}

/// One MQTT listener (`listeners[i]`).
#[derive(Debug, Clone)]
pub struct Listener {
    /// Unique among listeners; used in logs and metrics.
    pub name: String,
    /// Address to listen on. Port 0 lets the system choose.
    pub bind: SocketAddr,
    /// TLS on this listener; `None` is plain TCP.
    pub tls: Option<TlsSettings>,
    /// Time a new connection has to finish its TLS handshake and send
    /// CONNECT before it is closed. Default 10s.
    pub handshake_timeout: Duration,
}

/// TLS settings of a listener (`listeners[i].tls`). The files have been read
/// and parsed; `material` holds the result.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1). The path is not a secret;
    /// the key it holds is, and lives only in `material`.
    pub key: PathBuf,
    /// PEM CA certificates clients must present a certificate from (mTLS);
    /// `None`: no client certificate is asked for.
    pub client_ca: Option<PathBuf>,
    /// What the files held, ready to serve with.
    pub material: TlsMaterial,
}

/// `auth`.
#[derive(Debug, Clone)]
pub struct Auth {
    /// Whether a client without a username may connect. Default: `true` in
    /// the embedded default only, `false` in a configuration file.
    pub allow_anonymous: bool,
    /// mosquitto_passwd-format password file.
    pub password_file: Option<PathBuf>,
    /// mosquitto acl_file-format ACL file. Absent: every client may read and
    /// write every topic.
    pub acl_file: Option<PathBuf>,
    /// The parsed password file, present exactly when `password_file` is.
    pub passwords: Option<Arc<PasswordFile>>,
    /// The parsed ACL file, present exactly when `acl_file` is.
    pub acl: Option<Arc<AclFile>>,
}

/// A storage provider (`storage[i]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    Memory(MemoryProvider),
    Sqlite(SqliteProvider),
}

/// `kind: memory`: records in memory, written to a snapshot directory when
/// one is configured: in the background while it serves, and at shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryProvider {
    pub name: String,
    /// Where snapshots are written and read at startup. `None`: nothing is
    /// kept across a restart.
    pub snapshot_dir: Option<PathBuf>,
    /// Bound on the bytes the provider's channels hold, reserve included. `None`: unbounded.
    pub max_bytes: Option<u64>,
    /// When a snapshot generation is written while the broker serves.
    pub snapshots: SnapshotSchedule,
    /// Room kept allocated in the snapshot_dir (`saguin.room`) for the
    /// generation that finds the file system full; 0 keeps none (always 0
    /// without a snapshot_dir). Default 64 MiB.
    pub snapshot_room: u64,
}

/// When a memory provider writes a snapshot generation while it serves:
/// a quiet `debounce` after the last change, and at the latest `max_delay`
/// after the first change since the last generation. Both `None`: only at
/// shutdown. `max_delay` is the crash window the startup states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotSchedule {
    /// `None`: no quiet trigger, a generation `max_delay` after the first
    /// change.
    pub debounce: Option<Duration>,
    /// `None` (with `debounce` `None` too): no background snapshots.
    pub max_delay: Option<Duration>,
}

impl SnapshotSchedule {
    /// Background snapshots off: written at shutdown only.
    pub const SHUTDOWN_ONLY: SnapshotSchedule = SnapshotSchedule {
        debounce: None,
        max_delay: None,
    };

    /// True when generations are written while the broker serves.
    pub fn is_background(&self) -> bool {
        self.max_delay.is_some()
    }
}

impl Default for SnapshotSchedule {
    /// 250 ms quiet, at most 2 s: the legacy broker's own debounce.
    fn default() -> Self {
        SnapshotSchedule {
            debounce: Some(Duration::from_millis(250)),
            max_delay: Some(Duration::from_secs(2)),
        }
    }
}

/// `kind: sqlite`: one SQLite database in WAL mode, synchronous=NORMAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteProvider {
    pub name: String,
    /// The database file.
    pub file_path: PathBuf,
    /// Bound on the database file, applied as `PRAGMA max_page_count` in
    /// pages of [`SQLITE_PAGE_SIZE`]. `None`: SQLite's own limit.
    pub max_bytes: Option<u64>,
    /// How often the write-ahead log is fsynced when something was committed
    /// since the last fsync. 10ms..=1s, default 150ms.
    pub flush_interval: Duration,
    /// `None`: a publish never waits for company (group commit only of the
    /// publishes that arrive during a commit). A duration (<= 1s): a publish
    /// transaction waits this long for more, or for `publish_commit_max_records`.
    pub publish_commit_interval: Option<Duration>,
    /// Most records in one publish transaction. Default 256.
    pub publish_commit_max_records: u32,
    /// Read-only connections beside the writer; 0 puts every read on the
    /// writer. Default 4.
    pub read_connections: u32,
    /// Room kept allocated beside the database (`<file_path>-room`) for
    /// the checkpoint that finds the file system full; 0 keeps none.
    /// Default 64 MiB.
    pub checkpoint_room: u64,
}

/// What a provider's `max_bytes` came to, computed by [`Provider::bound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The figure the operator wrote, in bytes.
    pub max_bytes: u64,
    /// The bound actually enforced: `max_bytes` for memory, rounded down to
    /// whole pages for sqlite.
    pub effective_bytes: u64,
    /// sqlite only: `PRAGMA max_page_count` at full (relief) ceiling.
    pub pages: Option<u64>,
    /// Held back from publishes, carved out of the bound: one largest record
    /// with its headers (rounded up to pages on sqlite).
    pub reserve_bytes: u64,
    /// Where publishes stop: `effective_bytes - reserve_bytes`.
    pub publish_limit_bytes: u64,
}

/// A channel (`channels[i]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    /// The channel's name: the first topic level of its topics.
    pub name: String,
    /// Append, latest or queue, with a queue's settings.
    pub kind: ChannelKindConfig,
    /// The provider's name; guaranteed to name one of `Config::storage`.
    pub storage: String,
    /// Append channels: oldest records are removed past this many bytes.
    pub retention_bytes: Option<u64>,
    /// Append channels: records older than this are removed. Latest
    /// channels: deletion markers older than this are forgotten.
    pub retention_age: Option<Duration>,
    /// Latest channels: at most this many deletion markers are kept, the
    /// oldest forgotten first.
    pub retention_deletions: Option<u64>,
    /// Append and queue channels: publishes are refused (0x97) past this.
    pub max_bytes: Option<u64>,
}

/// A channel's kind (`channels[i].kind`) and what only that kind has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelKindConfig {
    Append,
    Latest,
    Queue(QueueSettings),
}

/// Settings only a queue channel has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// How long a worker holds a job before it counts as an attempt. Default 30s.
    pub lease: Duration,
    /// Attempts before the job moves to the dead-letter channel. Default 5.
    pub max_attempts: u32,
    /// Gap before attempt n+1 is `backoff[n-1]`; the last entry repeats; an
    /// empty list retries at once. Default [1s, 5s, 30s].
    pub backoff: Vec<Duration>,
    /// Retention bound of the dead-letter channel `<name>.dlq`. `None`: unbounded.
    pub dlq_retention_bytes: Option<u64>,
    /// Jobs one worker holds at once, whatever the Receive Maximum it
    /// asked for. Default 64.
    pub max_held_per_worker: u16,
}

/// `broker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// Provider of the retained store. `None`: memory, not kept.
    pub retained_storage: Option<String>,
    /// Provider of persistent sessions and the broadcast log. `None`: memory,
    /// not kept.
    pub session_storage: Option<String>,
    pub session: SessionSettings,
    pub exactly_once: ExactlyOnce,
    /// Outbound MQTT 5 topic aliases, per connection, for clients that
    /// announce a Topic Alias Maximum. Default true.
    pub topic_aliases: bool,
}

/// `broker.session`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// How often consumer positions are stored. Default 200ms.
    pub ack_commit_interval: Duration,
}

/// `broker.exactly_once`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExactlyOnce {
    /// An unreleased QoS 2 publish is dropped and counted after this. Default 1h.
    pub expires_after: Duration,
}

/// `limits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Payload and topic of the largest message, bytes. Default 256KiB.
    /// The broker enforces only the sum with `max_header_bytes`, as its
    /// Maximum Packet Size, which the loader holds to at least the
    /// smallest CONNECT.
    pub max_message_size: u64,
    /// Room for user properties and other headers of one message, bytes.
    /// Default 8KiB.
    pub max_header_bytes: u64,
    /// Longest session expiry a client may ask for. Default 7d.
    pub max_session_expiry: Duration,
    /// Default 10000.
    pub max_connections: u32,
    /// MQTT 5 Receive Maximum the broker announces. Default 64.
    pub receive_maximum: u16,
    /// QoS 1/2 messages sent to one client and not yet acknowledged: an
    /// MQTT 5 client's Receive Maximum is lowered to it. Default
    /// `receive_maximum`.
    pub max_inflight_messages: u16,
    /// Per session, QoS 1/2 messages waiting (offline or beyond the
    /// window). Default 1000.
    pub max_queued_messages: u32,
    /// Per session, the bytes of their topics and payloads. Default none.
    pub max_queued_bytes: Option<u64>,
    /// Default 100.
    pub max_subscriptions_per_session: u32,
    /// Persistent sessions kept; a CONNECT that would start one more is
    /// refused (CONNACK 0x97). Default 100000.
    pub max_sessions: u32,
    /// Retained topics; a retained publish to a new topic beyond it is
    /// refused (0x97), replacing or deleting one is not. Default 100000.
    pub max_retained: u32,
    /// Cap on keep alive, seconds, sent to MQTT 5 clients as Server Keep
    /// Alive; 0: the client's own value is used. Default 0.
    pub max_keep_alive: u16,
}

/// `metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    /// Prometheus text format at `/metrics`, and `/healthz` and `/readyz`
    /// (`broker::health`); `None`: off.
    pub bind: Option<SocketAddr>,
}

/// `log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Log {
    pub level: LogLevel,
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Logfmt,
    Json,
}

/// One thing wrong with a configuration: where (a YAML path such as
/// `channels[2].storage`, or `""` for the document) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file itself could not be read (missing, permission, not a
    /// regular file, too large). `check-config` exits 3.
    #[error("configuration {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    /// The configuration was read and is invalid; every problem found.
    /// `check-config` exits 1.
    #[error("configuration {}: {} problem(s), the first: {}", origin_label(origin), problems.len(), problems.first().map(ToString::to_string).unwrap_or_default())]
    Invalid {
        origin: Option<PathBuf>,
        problems: Vec<Problem>,
    },
}

fn origin_label(origin: &Option<PathBuf>) -> String {
    origin
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "(embedded default)".to_string())
}

impl ConfigError {
    /// Every problem (empty for [`ConfigError::Unreadable`]).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Unreadable { .. } => &[],
            ConfigError::Invalid { problems, .. } => problems,
        }
    }
}

/// The embedded default's YAML: one listener on 127.0.0.1:1883, anonymous,
/// no channels, everything in memory, nothing kept.
pub const EMBEDDED_DEFAULT_YAML: &str = "\
listeners:
  - name: mqtt
    bind: 127.0.0.1:1883
auth:
  allow_anonymous: true
";

impl Config {
    /// Read, validate and resolve the configuration file at `path`, opening
    /// every file it names except the databases.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let bytes = read_config_file(path)?;
        let text = String::from_utf8(bytes).map_err(|e| ConfigError::Invalid {
            origin: Some(path.to_path_buf()),
            problems: vec![Problem {
                path: String::new(),
                message: format!(
                    "not UTF-8 text (invalid byte at offset {})",
                    e.utf8_error().valid_up_to()
                ),
            }],
        })?;
        Config::from_yaml_str(&text, path)
    }

    /// Validate and resolve YAML text that came from `origin` (a path; its
    /// directory is where relative paths in the text resolve from).
    pub fn from_yaml_str(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        // Relative paths resolve against the file's directory, made
        // absolute so the broker, check-config and a diff of two resolved
        // configurations all see the same path whatever the working
        // directory was.
        let dir = origin.parent().unwrap_or(Path::new(""));
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let base = dir.canonicalize().unwrap_or_else(|_| {
            std::env::current_dir()
                .map(|cwd| parse::fold(&cwd.join(dir)))
                .unwrap_or_else(|_| dir.to_path_buf())
        });
        parse::parse(text, Some(origin.to_path_buf()), &base, false)
    }

    /// The configuration `saguin serve` runs without `--config`.
    pub fn embedded_default() -> Config {
        match parse::parse(EMBEDDED_DEFAULT_YAML, None, Path::new(""), true) {
            Ok(config) => config,
            // The text is a constant checked by a unit test; failing here
            // is a build defect, not an input error.
            Err(err) => panic!("the embedded default configuration is invalid: {err}"),
        }
    }

    /// The embedded default with its one listener on `bind` instead of
    /// 127.0.0.1:1883 (`saguin serve --bind`).
    pub fn embedded_default_on(bind: SocketAddr) -> Config {
        let mut config = Config::embedded_default();
        for listener in &mut config.listeners {
            listener.bind = bind;
        }
        config
    }

    /// The provider called `name`.
    pub fn provider(&self, name: &str) -> Option<&Provider> {
        self.storage.iter().find(|p| p.name() == name)
    }

    /// The channel called `name`.
    pub fn channel(&self, name: &str) -> Option<&Channel> {
        self.channels.iter().find(|c| c.name == name)
    }

    /// The channels stored by provider `name`, in configuration order.
    pub fn channels_of<'a>(&'a self, provider: &'a str) -> impl Iterator<Item = &'a Channel> + 'a {
        self.channels.iter().filter(move |c| c.storage == provider)
    }

    /// The reserve a bounded provider holds back before rounding: one
    /// largest record with its headers.
    pub fn reserve_bytes(&self) -> u64 {
        crate::storage::contract::reserve_for(
            self.limits.max_message_size,
            self.limits.max_header_bytes,
        )
    }

    /// Whether a provider is named by no channel and neither broker store:
    /// inert, nothing is created for it.
    pub fn is_inert(&self, provider: &str) -> bool {
        self.channels.iter().all(|c| c.storage != provider)
            && self.broker.retained_storage.as_deref() != Some(provider)
            && self.broker.session_storage.as_deref() != Some(provider)
    }

    /// Whether anything at all survives a restart: some channel or broker
    /// store is on sqlite or on memory with a snapshot directory.
    pub fn keeps_anything(&self) -> bool {
        let used = self.used_providers();
        self.storage
            .iter()
            .any(|p| used.contains(p.name()) && p.keeps_anything())
    }

    /// The names of the providers some channel or broker store names (the
    /// ones that are not inert), collected once so a large configuration
    /// is judged in linear time.
    pub(crate) fn used_providers(&self) -> std::collections::HashSet<&str> {
        self.channels
            .iter()
            .map(|c| c.storage.as_str())
            .chain(self.broker.retained_storage.as_deref())
            .chain(self.broker.session_storage.as_deref())
            .collect()
    }

    /// What each channel's durability is and what each size bound came to,
    /// one sentence a line (invariant 14). The broker states
    /// these once at startup; check-config prints them.
    pub fn durability_summary(&self) -> Vec<String> {
        summary::durability_summary(self, ChannelLines::Each)
    }

    /// The channels a broker serves: each configured, and a dead-letter
    /// channel for each queue.
    pub fn served_channels(&self) -> usize {
        names::served_channels(&self.channels)
    }

    /// The durability summary as a broker's start states it: past
    /// [`CHANNELS_STATED_ONE_BY_ONE`] channels served, a provider's
    /// channels in one sentence ([`ChannelLines::at_start`]), each
    /// channel's own then left to [`Config::channel_durability`].
    pub fn durability_at_start(&self) -> (Vec<String>, ChannelLines) {
        let lines = ChannelLines::at_start(self.served_channels());
        (summary::durability_summary(self, lines), lines)
    }

    /// Each channel's durability, a sentence a channel, as
    /// [`Config::durability_summary`] states it.
    pub fn channel_durability(&self) -> Vec<String> {
        summary::channel_durability(self)
    }

    /// The fully resolved configuration as one document: every default
    /// filled, sizes in bytes, durations in humantime form, keys sorted,
    /// lists of named things sorted by name, secrets redacted by type. The
    /// YAML or JSON rendering of it loads back to the same configuration.
    pub fn resolved(&self) -> serde_json::Value {
        output::resolved(self)
    }

    /// What is valid but worth an operator's attention, each with its YAML
    /// path: a listener certificate that has expired or is not valid yet at
    /// `now` (Unix seconds). Clients will refuse such a certificate; the
    /// broker still serves it, so it is a warning, not a problem.
    pub fn warnings(&self, now: i64) -> Vec<Problem> {
        let mut out = Vec::new();
        for (i, listener) in self.listeners.iter().enumerate() {
            let Some(tls) = &listener.tls else { continue };
            for (n, validity) in tls.material.cert_validity.iter().enumerate() {
                let Some(v) = validity else { continue };
                let state = if now > v.not_after {
                    "expired"
                } else if now < v.not_before {
                    "is not valid yet"
                } else {
                    continue;
                };
                out.push(Problem {
                    path: format!("listeners[{i}].tls.cert"),
                    message: format!(
                        "{}: certificate {} of the chain {state}: valid from {} until {}",
                        tls.cert.display(),
                        n + 1,
                        unix_seconds_text(v.not_before),
                        unix_seconds_text(v.not_after)
                    ),
                });
            }
        }
        out
    }

    /// Each provider in use whose files are where its promise does not
    /// hold, with its YAML path and the warning
    /// [`crate::storage::file_system::Unkept::warning`] words. Asks the
    /// file system (the directory, or the nearest one above it that
    /// exists); `serve` logs these at startup, `check-config` warns of
    /// them.
    pub fn unkept_providers(&self) -> Vec<Problem> {
        let used = self.used_providers();
        let mut out = Vec::new();
        for (i, provider) in self.storage.iter().enumerate() {
            if !used.contains(provider.name()) {
                continue;
            }
            let (key, dir) = match provider {
                Provider::Sqlite(s) => ("file_path", crate::storage::parent_of(&s.file_path)),
                Provider::Memory(m) => match &m.snapshot_dir {
                    Some(dir) => ("snapshot_dir", dir.clone()),
                    None => continue,
                },
            };
            let sqlite = matches!(provider, Provider::Sqlite(_));
            let Some(message) = crate::storage::file_system::unkept(&dir)
                .and_then(|u| u.warning(&dir, provider.name(), sqlite))
            else {
                continue;
            };
            out.push(Problem {
                path: format!("storage[{i}].{key}"),
                message,
            });
        }
        out
    }

    /// Every file the configuration names and has read (password file, ACL
    /// file, certificates, keys), with the SHA-256 of its bytes as read.
    pub fn file_digests(&self) -> std::collections::BTreeMap<PathBuf, String> {
        let mut out = std::collections::BTreeMap::new();
        if let (Some(path), Some(file)) = (&self.auth.password_file, &self.auth.passwords) {
            out.insert(path.clone(), file.sha256().to_string());
        }
        if let (Some(path), Some(file)) = (&self.auth.acl_file, &self.auth.acl) {
            out.insert(path.clone(), file.sha256().to_string());
        }
        for tls in self.listeners.iter().filter_map(|l| l.tls.as_ref()) {
            out.insert(tls.cert.clone(), tls.material.cert_sha256.clone());
            out.insert(tls.key.clone(), tls.material.key_sha256.clone());
            if let (Some(path), Some(digest)) = (&tls.client_ca, &tls.material.client_ca_sha256) {
                out.insert(path.clone(), digest.clone());
            }
        }
        for bridge in &self.bridges {
            if let (Some(path), Some(digest)) = (&bridge.password_file, &bridge.password_sha256) {
                out.insert(path.clone(), digest.clone());
            }
            for (path, digest) in bridge.tls.iter().flat_map(|t| t.digests.iter()) {
                out.insert(path.clone(), digest.clone());
            }
        }
        out
    }

    /// What this configuration asks for that `saguin serve` refuses, each
    /// with its YAML path; empty when serve runs it. `check-config` reports
    /// the same list, so the two cannot disagree.
    pub fn unserved(&self) -> Vec<Unserved> {
        unserved::unserved(self)
    }
}

impl Provider {
    pub fn name(&self) -> &str {
        match self {
            Provider::Memory(m) => &m.name,
            Provider::Sqlite(s) => &s.name,
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            Provider::Memory(_) => "memory",
            Provider::Sqlite(_) => "sqlite",
        }
    }

    pub fn max_bytes(&self) -> Option<u64> {
        match self {
            Provider::Memory(m) => m.max_bytes,
            Provider::Sqlite(s) => s.max_bytes,
        }
    }

    /// Whether what this provider holds survives a restart.
    pub fn keeps_anything(&self) -> bool {
        match self {
            Provider::Memory(m) => m.snapshot_dir.is_some(),
            Provider::Sqlite(_) => true,
        }
    }

    /// What `max_bytes` comes to with `reserve` (= max_message_size +
    /// max_header_bytes): pages and reserve on sqlite. `None` when unbounded.
    pub fn bound(&self, reserve: u64) -> Option<Bound> {
        match self {
            Provider::Memory(m) => m.max_bytes.map(|max| Bound {
                max_bytes: max,
                effective_bytes: max,
                pages: None,
                reserve_bytes: reserve,
                publish_limit_bytes: max.saturating_sub(reserve),
            }),
            Provider::Sqlite(s) => s.max_bytes.map(|max| {
                let pages = max / SQLITE_PAGE_SIZE;
                let effective = pages * SQLITE_PAGE_SIZE;
                let reserve_pages = reserve.div_ceil(SQLITE_PAGE_SIZE);
                let reserve_bytes = reserve_pages.saturating_mul(SQLITE_PAGE_SIZE);
                Bound {
                    max_bytes: max,
                    effective_bytes: effective,
                    pages: Some(pages),
                    reserve_bytes,
                    publish_limit_bytes: effective.saturating_sub(reserve_bytes),
                }
            }),
        }
    }
}

impl SqliteProvider {
    /// `PRAGMA max_page_count` for publishes (reserve held back) and for
    /// relief operations (the whole bound): `(publish, relief)`.
    pub fn page_ceilings(&self, reserve: u64) -> Option<(u64, u64)> {
        let pages = self.max_bytes? / SQLITE_PAGE_SIZE;
        let reserve_pages = reserve.div_ceil(SQLITE_PAGE_SIZE);
        Some((pages.saturating_sub(reserve_pages), pages))
    }
}

impl Channel {
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            ChannelKindConfig::Append => "append",
            ChannelKindConfig::Latest => "latest",
            ChannelKindConfig::Queue(_) => "queue",
        }
    }

    pub fn queue(&self) -> Option<&QueueSettings> {
        match &self.kind {
            ChannelKindConfig::Queue(q) => Some(q),
            _ => None,
        }
    }

    /// The dead-letter channel's name for a queue: `<name>.dlq`, on the same
    /// provider and in the same file.
    pub fn dlq_name(&self) -> Option<String> {
        self.queue()
            .map(|_| crate::storage::contract::dead_letter_name(&self.name))
    }
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Logfmt => "logfmt",
            LogFormat::Json => "json",
        }
    }
}

/// Read the configuration file, refusing what is not a regular file or is
/// larger than [`MAX_CONFIG_FILE_BYTES`] before reading it.
fn read_config_file(path: &Path) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    let unreadable = |reason: String| ConfigError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| unreadable(e.to_string()))?;
    let meta = file.metadata().map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".to_string()));
    }
    if meta.len() > MAX_CONFIG_FILE_BYTES {
        return Err(unreadable(format!(
            "{} bytes, larger than the {} bytes a configuration may be",
            meta.len(),
            MAX_CONFIG_FILE_BYTES
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(e.to_string()))?;
    Ok(bytes)
}

/// Read a file the configuration names, refusing what is not a regular file
/// or is larger than `limit` before reading it. The error names the path and
/// never the contents.
/// Unix seconds as RFC 3339 (`2026-01-01T00:00:00Z`).
fn unix_seconds_text(seconds: i64) -> String {
    match u64::try_from(seconds) {
        Ok(s) => humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(s))
            .to_string(),
        Err(_) => format!("{seconds} (Unix seconds)"),
    }
}

/// SHA-256 of `bytes` as lowercase hex: the digest of a named file that
/// `check-config --output` prints in place of its content.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

pub(crate) fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    if meta.len() > limit {
        return Err(format!(
            "{}: {} bytes, more than the {limit} bytes such a file may be",
            path.display(),
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "{}: more than the {limit} bytes such a file may be",
            path.display()
        ));
    }
    Ok(bytes)
}
