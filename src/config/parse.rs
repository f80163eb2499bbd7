//! YAML to typed settings, walking a `serde_norway::Value` by hand so that
//! every problem is collected with its YAML path instead of stopping at the
//! first, and unknown keys are errors.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_norway::Value;

use super::auth::{AclFile, PasswordFile};
use super::units::{parse_duration, parse_size};
use super::*;

/// Collected problems plus what relative paths resolve against.
pub(crate) struct Ctx {
    pub problems: Vec<Problem>,
    base: PathBuf,
}

impl Ctx {
    pub fn problem(&mut self, path: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.to_string(),
            message: message.into(),
        });
    }
}

/// The problem a YAML parser error makes. A whole number beyond 64 bits is
/// no YAML error but a value no key takes; the parser's own text for it
/// ("invalid type: integer `N` as u128, expected any YAML value") is
/// rewritten to say so at its key path.
fn yaml_problem(error: &str) -> Problem {
    const MARK: &str = "invalid type: integer `";
    let out_of_range = error.find(MARK).and_then(|at| {
        let path = match &error[..at] {
            "" => "",
            before => before.strip_suffix(": ")?,
        };
        let (number, rest) = error[at + MARK.len()..].split_once('`')?;
        (rest.starts_with(" as u128") || rest.starts_with(" as i128"))
            .then(|| (path.to_string(), number.to_string()))
    });
    match out_of_range {
        Some((path, number)) => Problem {
            message: if number.starts_with('-') {
                format!(
                    "the number {number} is too small: no key takes a whole number below {}",
                    i64::MIN
                )
            } else {
                format!(
                    "the number {number} is too large: no key takes a whole number above {}",
                    u64::MAX
                )
            },
            path,
        },
        None => Problem {
            path: String::new(),
            message: format!("not valid YAML: {error}"),
        },
    }
}

pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

pub(super) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// The keys of one YAML mapping, taken one by one; whatever is left at the
/// end is an unknown key.
pub(super) struct Fields<'a> {
    pub(super) path: String,
    entries: BTreeMap<String, &'a Value>,
    order: Vec<String>,
}

impl<'a> Fields<'a> {
    /// `value` as a mapping, or a problem. A null (an empty section) is an
    /// empty mapping.
    pub(super) fn of(ctx: &mut Ctx, path: &str, value: &'a Value) -> Option<Fields<'a>> {
        let mut fields = Fields {
            path: path.to_string(),
            entries: BTreeMap::new(),
            order: Vec::new(),
        };
        match value {
            Value::Null => Some(fields),
            Value::Mapping(map) => {
                for (key, v) in map {
                    match key {
                        Value::String(k) => {
                            fields.order.push(k.clone());
                            fields.entries.insert(k.clone(), v);
                        }
                        other => ctx.problem(
                            path,
                            format!("a key must be a string, not {}", describe(other)),
                        ),
                    }
                }
                Some(fields)
            }
            other => {
                ctx.problem(
                    path,
                    format!("expected a mapping, found {}", describe(other)),
                );
                None
            }
        }
    }

    /// The value of `key`, if present and not null.
    pub(super) fn take(&mut self, key: &str) -> Option<(String, &'a Value)> {
        let value = self.entries.remove(key)?;
        let path = join(&self.path, key);
        match value {
            Value::Null => None,
            v => Some((path, v)),
        }
    }

    /// Report every key not taken. `known` lists the keys this mapping takes.
    pub(super) fn finish(self, ctx: &mut Ctx, known: &[&str]) {
        for key in self.order {
            if self.entries.contains_key(&key) {
                ctx.problem(
                    &join(&self.path, &key),
                    format!("unknown key (known here: {})", known.join(", ")),
                );
            }
        }
    }

    /// Report `keys` present here as belonging to another kind.
    fn refuse_for_kind(&mut self, ctx: &mut Ctx, keys: &[&str], why: &str) {
        for key in keys {
            if self.entries.remove(*key).is_some() {
                ctx.problem(&join(&self.path, key), why);
            }
        }
    }
}

pub(super) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "nothing".to_string(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Sequence(_) => "a list".to_string(),
        Value::Mapping(_) => "a mapping".to_string(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

pub(super) fn string(ctx: &mut Ctx, path: &str, value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        // A YAML scalar like `7` or `true` used as a name is written back
        // as the text the operator typed.
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        other => {
            ctx.problem(
                path,
                format!("expected a string, found {}", describe(other)),
            );
            None
        }
    }
}

pub(super) fn name(ctx: &mut Ctx, path: &str, value: &Value, what: &str) -> Option<String> {
    let name = string(ctx, path, value)?;
    if name.is_empty() {
        ctx.problem(path, format!("a {what} name cannot be empty"));
        return None;
    }
    if name.chars().any(char::is_control) {
        ctx.problem(
            path,
            format!("{what} name {name:?} contains a control character"),
        );
        return None;
    }
    Some(name)
}

fn size(ctx: &mut Ctx, path: &str, value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => match n.as_u64() {
            Some(v) => Some(v),
            None => {
                ctx.problem(
                    path,
                    format!("invalid size {n}: expected a whole number of bytes"),
                );
                None
            }
        },
        Value::String(s) => match parse_size(s) {
            Ok(v) => Some(v),
            Err(e) => {
                ctx.problem(path, e);
                None
            }
        },
        other => {
            ctx.problem(
                path,
                format!(
                    "expected a size such as 256KiB, 4GiB or 1000, found {}",
                    describe(other)
                ),
            );
            None
        }
    }
}

/// A memory provider's `snapshot_debounce` and `snapshot_max_delay`:
/// each a duration or `none`, 250ms and 2s when absent. Both `none` is
/// shutdown only; a debounce with no maximum is refused (a provider that
/// is never quiet would never be written); tuning with no `snapshot_dir`
/// is refused (there is nowhere to write).
fn snapshot_schedule(
    ctx: &mut Ctx,
    f: &mut Fields,
    path: &str,
    has_dir: bool,
) -> Option<SnapshotSchedule> {
    let defaults = SnapshotSchedule::default();
    // A duration written with no directory is tuning of nothing; `none`
    // (what --output writes for such a provider) says no more than absence.
    let mut given = false;
    let mut take = |ctx: &mut Ctx, key: &str, default: Option<Duration>| match f.take(key) {
        None => Some((default, None)),
        Some((p, Value::String(s))) if s == "none" => Some((None, Some(p))),
        Some((p, v)) => {
            given = true;
            duration(ctx, &p, v).map(|d| (Some(d), Some(p)))
        }
    };
    let debounce = take(ctx, "snapshot_debounce", defaults.debounce);
    let max_delay = take(ctx, "snapshot_max_delay", defaults.max_delay);
    let ((debounce, debounce_path), (max_delay, max_delay_path)) = (debounce?, max_delay?);
    let at = |p: &Option<String>, key: &str| p.clone().unwrap_or_else(|| join(path, key));
    if given && !has_dir {
        ctx.problem(
            &at(&debounce_path.or(max_delay_path), "snapshot_debounce"),
            "a snapshot schedule needs a snapshot_dir to write to",
        );
        return None;
    }
    if !has_dir {
        return Some(SnapshotSchedule::SHUTDOWN_ONLY);
    }
    if let Some(d) = debounce {
        if d < SNAPSHOT_DEBOUNCE_MIN {
            ctx.problem(
                &at(&debounce_path, "snapshot_debounce"),
                format!(
                    "{} is below 1ms (write none for no quiet gap)",
                    units::format_duration(d)
                ),
            );
            return None;
        }
    }
    match (debounce, max_delay) {
        (Some(d), None) => {
            ctx.problem(
                &at(&max_delay_path, "snapshot_max_delay"),
                format!(
                    "none beside snapshot_debounce {} would never write a provider that is never quiet; give a maximum delay, or snapshot_debounce: none as well (written only at shutdown)",
                    units::format_duration(d)
                ),
            );
            None
        }
        (_, Some(m)) if m.is_zero() || m > SNAPSHOT_MAX_DELAY_MAX => {
            ctx.problem(
                &at(&max_delay_path, "snapshot_max_delay"),
                format!(
                    "{} is outside 1ms..=1h (it is how much a crash may lose; write none for only at shutdown)",
                    units::format_duration(m)
                ),
            );
            None
        }
        (Some(d), Some(m)) if d > m => {
            ctx.problem(
                &at(&debounce_path, "snapshot_debounce"),
                format!(
                    "{} is longer than snapshot_max_delay {}; the maximum delay would always come first",
                    units::format_duration(d),
                    units::format_duration(m)
                ),
            );
            None
        }
        (debounce, max_delay) => Some(SnapshotSchedule {
            debounce,
            max_delay,
        }),
    }
}

/// A size, or `none` (absent).
fn optional_size(ctx: &mut Ctx, path: &str, value: &Value) -> Option<u64> {
    if matches!(value, Value::String(s) if s == "none") {
        return None;
    }
    size(ctx, path, value)
}

pub(super) fn duration(ctx: &mut Ctx, path: &str, value: &Value) -> Option<Duration> {
    match value {
        Value::String(s) => match parse_duration(s) {
            Ok(d) => Some(d),
            Err(e) => {
                ctx.problem(path, e);
                None
            }
        },
        Value::Number(n) => {
            ctx.problem(
                path,
                format!("invalid duration {n}: give a unit, e.g. {n}ms or {n}s"),
            );
            None
        }
        other => {
            ctx.problem(
                path,
                format!(
                    "expected a duration such as 150ms, 30s or 7d, found {}",
                    describe(other)
                ),
            );
            None
        }
    }
}

/// A session expiry: MQTT carries it as a four-byte count of seconds, so
/// a fraction would be rounded where the operator cannot see it (a larger
/// figure is past every duration's bound, `units::DURATION_MAX`).
pub(super) fn session_expiry(ctx: &mut Ctx, path: &str, value: &Value) -> Option<Duration> {
    let d = duration(ctx, path, value)?;
    if d.subsec_nanos() != 0 {
        ctx.problem(
            path,
            "must be whole seconds (MQTT counts session expiry in seconds)",
        );
        return None;
    }
    Some(d)
}

pub(super) fn positive_duration(ctx: &mut Ctx, path: &str, value: &Value) -> Option<Duration> {
    let d = duration(ctx, path, value)?;
    if d.is_zero() {
        ctx.problem(path, "must be longer than zero");
        return None;
    }
    Some(d)
}

pub(super) fn boolean(ctx: &mut Ctx, path: &str, value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        other => {
            ctx.problem(
                path,
                format!("expected true or false, found {}", describe(other)),
            );
            None
        }
    }
}

pub(super) fn integer(ctx: &mut Ctx, path: &str, value: &Value, min: u64, max: u64) -> Option<u64> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if (min..=max).contains(&n) => Some(n),
        Some(n) => {
            ctx.problem(path, format!("{n} is outside {min}..={max}"));
            None
        }
        None => {
            ctx.problem(
                path,
                format!(
                    "expected a whole number in {min}..={max}, found {}",
                    describe(value)
                ),
            );
            None
        }
    }
}

fn socket_addr(ctx: &mut Ctx, path: &str, value: &Value) -> Option<SocketAddr> {
    let text = string(ctx, path, value)?;
    match text.trim().parse::<SocketAddr>() {
        Ok(addr) => {
            let ip = addr.ip();
            if ip.is_multicast() || ip == std::net::IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
                ctx.problem(
                    path,
                    format!("{addr} is not a unicast address; nothing can listen on it"),
                );
                return None;
            }
            Some(addr)
        }
        Err(_) => {
            ctx.problem(
                path,
                format!(
                    "invalid socket address {text:?} (expected IP:PORT, e.g. 127.0.0.1:1883 or [::]:8883; host names are not resolved)"
                ),
            );
            None
        }
    }
}

pub(super) fn file_path(ctx: &mut Ctx, path: &str, value: &Value) -> Option<PathBuf> {
    let text = string(ctx, path, value)?;
    if text.is_empty() {
        ctx.problem(path, "a path cannot be empty");
        return None;
    }
    if text.contains('\0') {
        ctx.problem(path, "a path cannot contain NUL");
        return None;
    }
    let p = PathBuf::from(&text);
    Some(fold(&if p.is_absolute() { p } else { ctx.base.join(p) }))
}

/// `.` removed and `..` folded into its parent, lexically: one spelling per
/// path, so two configurations naming one file resolve to the same text.
pub(crate) fn fold(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                // `/..` is `/`.
                Some(Component::RootDir) | Some(Component::Prefix(_)) => {}
                _ => out.push(".."),
            },
            other => out.push(other.as_os_str()),
        }
    }
    out
}

pub(super) fn one_of<T: Copy>(
    ctx: &mut Ctx,
    path: &str,
    value: &Value,
    choices: &[(&str, T)],
) -> Option<T> {
    let text = string(ctx, path, value)?;
    match choices.iter().find(|(n, _)| *n == text) {
        Some((_, v)) => Some(*v),
        None => {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            ctx.problem(path, format!("{text:?} is not one of {}", names.join(", ")));
            None
        }
    }
}

pub(super) fn sequence<'a>(ctx: &mut Ctx, path: &str, value: &'a Value) -> &'a [Value] {
    match value {
        Value::Sequence(items) => items,
        other => {
            ctx.problem(path, format!("expected a list, found {}", describe(other)));
            &[]
        }
    }
}

const TOP_KEYS: &[&str] = &[
    "listeners",
    "auth",
    "storage",
    "channels",
    "broker",
    "limits",
    "metrics",
    "log",
    "bridges",
    "file_sha256",
];

/// Parse, resolve and validate. `embedded` selects the embedded default's
/// defaults (anonymous allowed).
pub(crate) fn parse(
    text: &str,
    origin: Option<PathBuf>,
    base: &Path,
    embedded: bool,
) -> Result<Config, ConfigError> {
    let mut ctx = Ctx {
        problems: Vec::new(),
        base: base.to_path_buf(),
    };
    let invalid = |problems| ConfigError::Invalid {
        origin: origin.clone(),
        problems,
    };
    let mut document: Value = match serde_norway::from_str(text) {
        Ok(v) => v,
        Err(e) => return Err(invalid(vec![yaml_problem(&e.to_string())])),
    };
    if let Err(e) = document.apply_merge() {
        return Err(invalid(vec![Problem {
            path: String::new(),
            message: format!("YAML merge key: {e}"),
        }]));
    }
    let Some(mut top) = Fields::of(&mut ctx, "", &document) else {
        return Err(invalid(ctx.problems));
    };

    let listeners = match top.take("listeners") {
        Some((path, v)) => listeners(&mut ctx, &path, v),
        None => Vec::new(),
    };
    let auth = auth(&mut ctx, top.take("auth"), embedded);
    let (storage, provider_names) = match top.take("storage") {
        Some((path, v)) => providers(&mut ctx, &path, v),
        None => (Vec::new(), Vec::new()),
    };
    let channels = match top.take("channels") {
        Some((path, v)) => channels(&mut ctx, &path, v),
        None => Vec::new(),
    };
    let broker = broker(&mut ctx, top.take("broker"));
    let limits = limits(&mut ctx, top.take("limits"));
    let metrics = metrics(&mut ctx, top.take("metrics"));
    let log = log(&mut ctx, top.take("log"));
    let bridges = match top.take("bridges") {
        Some((path, v)) => bridge::bridges(&mut ctx, &path, v),
        None => Vec::new(),
    };
    file_sha256(&mut ctx, top.take("file_sha256"));
    top.finish(&mut ctx, TOP_KEYS);

    let parsed = validate::Parsed {
        listeners,
        auth,
        storage,
        provider_names,
        channels,
        broker,
        limits,
        metrics,
        log,
        bridges,
    };
    validate::cross_check(&mut ctx, &parsed);
    if !ctx.problems.is_empty() {
        return Err(invalid(ctx.problems));
    }
    Ok(Config {
        listeners: parsed.listeners.into_iter().map(|(_, l)| l).collect(),
        auth: parsed.auth,
        storage: parsed.storage.into_iter().map(|(_, p)| p).collect(),
        channels: parsed.channels.into_iter().map(|(_, c)| c).collect(),
        broker: parsed.broker,
        limits: parsed.limits,
        metrics: parsed.metrics,
        log: parsed.log,
        bridges: parsed.bridges.into_iter().map(|(_, b)| b).collect(),
        origin,
    })
}

const LISTENER_KEYS: &[&str] = &["name", "bind", "tls", "handshake_timeout"];
const TLS_KEYS: &[&str] = &["cert", "key", "client_ca"];

fn listeners(ctx: &mut Ctx, path: &str, value: &Value) -> Vec<(usize, Listener)> {
    let mut out = Vec::new();
    for (i, item) in sequence(ctx, path, value).iter().enumerate() {
        let path = index(path, i);
        let Some(mut f) = Fields::of(ctx, &path, item) else {
            continue;
        };
        let name = required(ctx, &mut f, "name", |ctx, p, v| name(ctx, p, v, "listener"));
        let bind = required(ctx, &mut f, "bind", socket_addr);
        let tls = f.take("tls").and_then(|(p, v)| tls(ctx, &p, v));
        // A bad value is reported; the default stands in for it so the
        // cross-checks still see this listener.
        let handshake_timeout = f
            .take("handshake_timeout")
            .and_then(|(p, v)| positive_duration(ctx, &p, v))
            .or(Some(Duration::from_secs(10)));
        f.finish(ctx, LISTENER_KEYS);
        if let (Some(name), Some(bind), Some(handshake_timeout)) = (name, bind, handshake_timeout) {
            out.push((
                i,
                Listener {
                    name,
                    bind,
                    tls,
                    handshake_timeout,
                },
            ));
        }
    }
    out
}

/// A required key: a problem when absent.
pub(super) fn required<T>(
    ctx: &mut Ctx,
    f: &mut Fields<'_>,
    key: &str,
    read: impl FnOnce(&mut Ctx, &str, &Value) -> Option<T>,
) -> Option<T> {
    match f.take(key) {
        Some((p, v)) => read(ctx, &p, v),
        None => {
            ctx.problem(&join(&f.path, key), "required");
            None
        }
    }
}

fn tls(ctx: &mut Ctx, path: &str, value: &Value) -> Option<TlsSettings> {
    let mut f = Fields::of(ctx, path, value)?;
    let cert = required(ctx, &mut f, "cert", file_path);
    let key = required(ctx, &mut f, "key", file_path);
    let (client_ca, client_ca_ok) = match f.take("client_ca") {
        Some((p, v)) => {
            let ca = file_path(ctx, &p, v);
            let ok = ca.is_some();
            (ca, ok)
        }
        None => (None, true),
    };
    f.finish(ctx, TLS_KEYS);
    let (cert, key) = (cert?, key?);
    if !client_ca_ok {
        return None;
    }
    match tls::load(&cert, &key, client_ca.as_deref()) {
        Ok(material) => Some(TlsSettings {
            cert,
            key,
            client_ca,
            material,
        }),
        Err(problems) => {
            for p in problems {
                ctx.problem(&join(path, p.key), p.message);
            }
            None
        }
    }
}

const AUTH_KEYS: &[&str] = &["allow_anonymous", "password_file", "acl_file"];

fn auth(ctx: &mut Ctx, section: Option<(String, &Value)>, embedded: bool) -> Auth {
    let mut auth = Auth {
        allow_anonymous: embedded,
        password_file: None,
        acl_file: None,
        passwords: None,
        acl: None,
    };
    let Some((path, value)) = section else {
        return auth;
    };
    let Some(mut f) = Fields::of(ctx, &path, value) else {
        return auth;
    };
    if let Some(b) = f
        .take("allow_anonymous")
        .and_then(|(p, v)| boolean(ctx, &p, v))
    {
        auth.allow_anonymous = b;
    }
    if let Some((p, v)) = f.take("password_file") {
        if let Some(file) = file_path(ctx, &p, v) {
            match PasswordFile::load(&file) {
                Ok(passwords) => auth.passwords = Some(Arc::new(passwords)),
                Err(problems) => problems.into_iter().for_each(|m| ctx.problem(&p, m)),
            }
            auth.password_file = Some(file);
        }
    }
    if let Some((p, v)) = f.take("acl_file") {
        if let Some(file) = file_path(ctx, &p, v) {
            match AclFile::load(&file) {
                Ok(acl) => auth.acl = Some(Arc::new(acl)),
                Err(problems) => problems.into_iter().for_each(|m| ctx.problem(&p, m)),
            }
            auth.acl_file = Some(file);
        }
    }
    f.finish(ctx, AUTH_KEYS);
    auth
}

const MEMORY_KEYS: &[&str] = &[
    "name",
    "kind",
    "snapshot_dir",
    "max_bytes",
    "snapshot_debounce",
    "snapshot_max_delay",
    "snapshot_room",
];
/// What only a memory provider has.
const MEMORY_ONLY: &[&str] = &[
    "snapshot_dir",
    "snapshot_debounce",
    "snapshot_max_delay",
    "snapshot_room",
];
/// Bounds of a memory provider's snapshot schedule: a debounce below a
/// millisecond is no debounce, and a maximum delay past an hour is a
/// crash window nobody means (`none` says "only at shutdown" plainly).
pub(crate) const SNAPSHOT_DEBOUNCE_MIN: Duration = Duration::from_millis(1);
pub(crate) const SNAPSHOT_MAX_DELAY_MAX: Duration = Duration::from_secs(3600);
const SQLITE_KEYS: &[&str] = &[
    "name",
    "kind",
    "file_path",
    "max_bytes",
    "flush_interval",
    "publish_commit_interval",
    "publish_commit_max_records",
    "read_connections",
    "checkpoint_room",
];
const SQLITE_ONLY: &[&str] = &[
    "file_path",
    "flush_interval",
    "publish_commit_interval",
    "publish_commit_max_records",
    "read_connections",
    "checkpoint_room",
];

/// Bounds of the sqlite flush and group commit intervals.
pub(crate) const FLUSH_INTERVAL_MIN: Duration = Duration::from_millis(10);
pub(crate) const FLUSH_INTERVAL_MAX: Duration = Duration::from_secs(1);
pub(crate) const PUBLISH_COMMIT_INTERVAL_MAX: Duration = Duration::from_secs(1);
/// Read connections beyond this buy nothing on the machines saguin targets
/// and cost a file handle and a page cache each.
pub(crate) const READ_CONNECTIONS_MAX: u64 = 64;
/// The most room a provider keeps for what it must write when its file
/// system is full: a sqlite provider's checkpoint copies at most about its
/// log's 64 MiB, and a memory provider's larger stores are better given a
/// file system with room than a room of their size.
pub(crate) const ROOM_MAX: u64 = 1 << 30;
/// The room a memory provider with a snapshot_dir keeps by default, as a
/// sqlite provider's checkpoint room.
pub(crate) const SNAPSHOT_ROOM_DEFAULT: u64 = crate::storage::sqlite::CHECKPOINT_ROOM_DEFAULT;

/// `checkpoint_room` or `snapshot_room`: a size, 0 keeping none, at most
/// [`ROOM_MAX`].
fn room_size(ctx: &mut Ctx, path: &str, value: &Value) -> Option<u64> {
    size(ctx, path, value).and_then(|bytes| {
        if bytes > ROOM_MAX {
            ctx.problem(
                path,
                format!("{bytes} bytes is above 1GiB; a room covers what must still be written when the file system is full (a checkpoint of the write-ahead log, started again at 64MiB; a snapshot generation's changed files)"),
            );
            None
        } else {
            Some(bytes)
        }
    })
}

#[derive(Clone, Copy)]
enum ProviderKind {
    Memory,
    Sqlite,
}

/// The providers that parsed, and the name of every provider item that has
/// one (so a channel naming a provider refused for another reason is not
/// also told the provider does not exist).
fn providers(ctx: &mut Ctx, path: &str, value: &Value) -> (Vec<(usize, Provider)>, Vec<String>) {
    let mut out = Vec::new();
    let mut seen_names = Vec::new();
    for (i, item) in sequence(ctx, path, value).iter().enumerate() {
        let path = index(path, i);
        let Some(mut f) = Fields::of(ctx, &path, item) else {
            continue;
        };
        let name = required(ctx, &mut f, "name", |ctx, p, v| name(ctx, p, v, "provider"));
        seen_names.extend(name.clone());
        if name.as_deref() == Some("none") {
            ctx.problem(
                &join(&path, "name"),
                "\"none\" cannot name a provider: broker.retained_storage: none means no provider",
            );
        }
        let kind = required(ctx, &mut f, "kind", |ctx, p, v| {
            one_of(
                ctx,
                p,
                v,
                &[
                    ("memory", ProviderKind::Memory),
                    ("sqlite", ProviderKind::Sqlite),
                ],
            )
        });
        let max_bytes = f
            .take("max_bytes")
            .and_then(|(p, v)| optional_size(ctx, &p, v));
        let provider = match kind {
            Some(ProviderKind::Memory) => {
                f.refuse_for_kind(
                    ctx,
                    SQLITE_ONLY,
                    "only a sqlite provider has this key (this one is kind: memory)",
                );
                let snapshot_dir = f
                    .take("snapshot_dir")
                    .and_then(|(p, v)| file_path(ctx, &p, v));
                let snapshots = snapshot_schedule(ctx, &mut f, &path, snapshot_dir.is_some());
                let snapshot_room = match f.take("snapshot_room") {
                    None if snapshot_dir.is_some() => Some(SNAPSHOT_ROOM_DEFAULT),
                    None => Some(0),
                    Some((p, v)) => room_size(ctx, &p, v).and_then(|bytes| {
                        if bytes > 0 && snapshot_dir.is_none() {
                            ctx.problem(&p, "a snapshot room needs a snapshot_dir to keep it in");
                            None
                        } else {
                            Some(bytes)
                        }
                    }),
                };
                f.finish(ctx, MEMORY_KEYS);
                match (name, snapshots, snapshot_room) {
                    (Some(name), Some(snapshots), Some(snapshot_room)) => {
                        Some(Provider::Memory(MemoryProvider {
                            name,
                            snapshot_dir,
                            max_bytes,
                            snapshots,
                            snapshot_room,
                        }))
                    }
                    _ => None,
                }
            }
            Some(ProviderKind::Sqlite) => {
                f.refuse_for_kind(
                    ctx,
                    MEMORY_ONLY,
                    "only a memory provider has this key (this one is kind: sqlite)",
                );
                let file_path = required(ctx, &mut f, "file_path", file_path);
                let flush_interval = match f.take("flush_interval") {
                    None => Some(Duration::from_millis(150)),
                    Some((p, v)) => duration(ctx, &p, v).and_then(|d| {
                        if (FLUSH_INTERVAL_MIN..=FLUSH_INTERVAL_MAX).contains(&d) {
                            Some(d)
                        } else {
                            ctx.problem(
                                &p,
                                format!(
                                    "{} is outside 10ms..=1s (the write-ahead log is fsynced this often)",
                                    units::format_duration(d)
                                ),
                            );
                            None
                        }
                    }),
                };
                let publish_commit_interval = match f.take("publish_commit_interval") {
                    None => Some(None),
                    Some((_, Value::String(s))) if s == "none" => Some(None),
                    Some((p, v)) => duration(ctx, &p, v).and_then(|d| {
                        if d > PUBLISH_COMMIT_INTERVAL_MAX {
                            ctx.problem(
                                &p,
                                format!(
                                    "{} is longer than 1s; every connection pays this wait per publish (write none to commit at once)",
                                    units::format_duration(d)
                                ),
                            );
                            None
                        } else if d.is_zero() {
                            // Waiting zero for company is not waiting: the
                            // same setting as none, written one way.
                            Some(None)
                        } else {
                            Some(Some(d))
                        }
                    }),
                };
                let publish_commit_max_records = f
                    .take("publish_commit_max_records")
                    .map(|(p, v)| integer(ctx, &p, v, 1, u64::from(u32::MAX)))
                    .unwrap_or(Some(256));
                let read_connections = f
                    .take("read_connections")
                    .map(|(p, v)| integer(ctx, &p, v, 0, READ_CONNECTIONS_MAX))
                    .unwrap_or(Some(4));
                let checkpoint_room = match f.take("checkpoint_room") {
                    None => Some(crate::storage::sqlite::CHECKPOINT_ROOM_DEFAULT),
                    Some((p, v)) => room_size(ctx, &p, v),
                };
                f.finish(ctx, SQLITE_KEYS);
                match (
                    name,
                    file_path,
                    flush_interval,
                    publish_commit_interval,
                    publish_commit_max_records,
                    read_connections,
                    checkpoint_room,
                ) {
                    (
                        Some(name),
                        Some(file_path),
                        Some(flush_interval),
                        Some(publish_commit_interval),
                        Some(max_records),
                        Some(reads),
                        Some(checkpoint_room),
                    ) => Some(Provider::Sqlite(SqliteProvider {
                        name,
                        file_path,
                        max_bytes,
                        flush_interval,
                        publish_commit_interval,
                        publish_commit_max_records: u32::try_from(max_records).unwrap_or(u32::MAX),
                        read_connections: u32::try_from(reads).unwrap_or(u32::MAX),
                        checkpoint_room,
                    })),
                    _ => None,
                }
            }
            None => {
                // Without a kind, the other keys cannot be judged; only
                // report the kind.
                None
            }
        };
        if let Some(p) = provider {
            out.push((i, p));
        }
    }
    (out, seen_names)
}

const CHANNEL_KEYS: &[&str] = &[
    "name",
    "kind",
    "storage",
    "retention_bytes",
    "retention_age",
    "retention_deletions",
    "max_bytes",
    "lease",
    "max_attempts",
    "backoff",
    "dlq_retention_bytes",
    "max_held_per_worker",
];
const QUEUE_ONLY: &[&str] = &[
    "lease",
    "max_attempts",
    "backoff",
    "dlq_retention_bytes",
    "max_held_per_worker",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum ChannelKind {
    Append,
    Latest,
    Queue,
}

fn channels(ctx: &mut Ctx, path: &str, value: &Value) -> Vec<(usize, Channel)> {
    let mut out = Vec::new();
    for (i, item) in sequence(ctx, path, value).iter().enumerate() {
        let path = index(path, i);
        let Some(mut f) = Fields::of(ctx, &path, item) else {
            continue;
        };
        let name = required(ctx, &mut f, "name", string);
        let kind = required(ctx, &mut f, "kind", |ctx, p, v| {
            one_of(
                ctx,
                p,
                v,
                &[
                    ("append", ChannelKind::Append),
                    ("latest", ChannelKind::Latest),
                    ("queue", ChannelKind::Queue),
                ],
            )
        });
        let storage = required(ctx, &mut f, "storage", string);
        let Some(kind) = kind else {
            continue;
        };
        let kind_word = match kind {
            ChannelKind::Append => "append",
            ChannelKind::Latest => "latest",
            ChannelKind::Queue => "queue",
        };
        if kind != ChannelKind::Queue {
            f.refuse_for_kind(
                ctx,
                QUEUE_ONLY,
                &format!("only a queue channel has this key (this one is kind: {kind_word})"),
            );
        }
        if kind != ChannelKind::Append {
            f.refuse_for_kind(
                ctx,
                &["retention_bytes"],
                &format!(
                    "only an append channel has retention_bytes (a {kind_word} channel {})",
                    if kind == ChannelKind::Queue {
                        "holds unresolved work, bounded by max_bytes"
                    } else {
                        "keeps one value per topic and has no size bound"
                    }
                ),
            );
        }
        if kind == ChannelKind::Queue {
            f.refuse_for_kind(
                ctx,
                &["retention_age"],
                "a queue channel holds unresolved work and has no retention_age (bound it with max_bytes)",
            );
        }
        if kind != ChannelKind::Latest {
            f.refuse_for_kind(
                ctx,
                &["retention_deletions"],
                &format!(
                    "only a latest channel has retention_deletions ({} channel keeps no deletion markers)",
                    if kind == ChannelKind::Queue { "a queue" } else { "an append" }
                ),
            );
        }
        if kind == ChannelKind::Latest {
            f.refuse_for_kind(
                ctx,
                &["max_bytes"],
                "a latest channel keeps one value per topic and has no max_bytes (its values count against the provider's bound)",
            );
        }
        let retention_bytes = f
            .take("retention_bytes")
            .and_then(|(p, v)| optional_size(ctx, &p, v));
        let retention_age = match f.take("retention_age") {
            Some((_, Value::String(s))) if s == "none" => None,
            Some((p, v)) => positive_duration(ctx, &p, v),
            None => None,
        };
        let retention_deletions = match f.take("retention_deletions") {
            Some((_, Value::String(s))) if s == "none" => None,
            Some((p, v)) => integer(ctx, &p, v, 0, u64::MAX),
            None => None,
        };
        let max_bytes = f
            .take("max_bytes")
            .and_then(|(p, v)| optional_size(ctx, &p, v));
        let kind_config = match kind {
            ChannelKind::Append => Some(ChannelKindConfig::Append),
            ChannelKind::Latest => Some(ChannelKindConfig::Latest),
            ChannelKind::Queue => queue_settings(ctx, &mut f).map(ChannelKindConfig::Queue),
        };
        f.finish(ctx, CHANNEL_KEYS);
        if let (Some(name), Some(kind), Some(storage)) = (name, kind_config, storage) {
            out.push((
                i,
                Channel {
                    name,
                    kind,
                    storage,
                    retention_bytes,
                    retention_age,
                    retention_deletions,
                    max_bytes,
                },
            ));
        }
    }
    out
}

/// Most attempts a queue may be configured with: each is a delivery and a
/// lease, so a larger figure is a typo rather than a policy.
pub(crate) const MAX_ATTEMPTS_MAX: u64 = 1000;

/// A queue's `lease` when the channel names none.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// A queue's `max_held_per_worker` when the channel names none: the
/// broker's default window (`limits.max_inflight_messages`). It stays
/// when a site widens that window for its subscribers, so a worker's
/// share of a backlog, and what its going away costs in attempts, does
/// not widen with it.
pub(crate) const DEFAULT_MAX_HELD_PER_WORKER: u16 = 64;

/// A queue's `backoff` when the channel names none: the gap before
/// attempt 2, 3 and every later one.
pub(crate) const DEFAULT_BACKOFF: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
];

fn queue_settings(ctx: &mut Ctx, f: &mut Fields<'_>) -> Option<QueueSettings> {
    let lease = f
        .take("lease")
        .map(|(p, v)| positive_duration(ctx, &p, v))
        .unwrap_or(Some(DEFAULT_LEASE));
    let max_attempts = f
        .take("max_attempts")
        .map(|(p, v)| integer(ctx, &p, v, 1, MAX_ATTEMPTS_MAX))
        .unwrap_or(Some(u64::from(
            crate::storage::contract::DEFAULT_MAX_ATTEMPTS,
        )));
    let backoff = match f.take("backoff") {
        None => Some(DEFAULT_BACKOFF.to_vec()),
        Some((p, v)) => {
            let items = sequence(ctx, &p, v);
            let mut gaps = Some(Vec::with_capacity(items.len()));
            for (i, item) in items.iter().enumerate() {
                match duration(ctx, &index(&p, i), item) {
                    Some(d) => {
                        if let Some(g) = gaps.as_mut() {
                            g.push(d);
                        }
                    }
                    None => gaps = None,
                }
            }
            if matches!(v, Value::Sequence(_)) {
                gaps
            } else {
                None
            }
        }
    };
    let dlq_retention_bytes = f
        .take("dlq_retention_bytes")
        .and_then(|(p, v)| optional_size(ctx, &p, v));
    let max_held_per_worker = f
        .take("max_held_per_worker")
        .map(|(p, v)| integer(ctx, &p, v, 1, u64::from(u16::MAX)))
        .unwrap_or(Some(u64::from(DEFAULT_MAX_HELD_PER_WORKER)));
    Some(QueueSettings {
        lease: lease?,
        max_attempts: u32::try_from(max_attempts?).unwrap_or(u32::MAX),
        backoff: backoff?,
        dlq_retention_bytes,
        max_held_per_worker: u16::try_from(max_held_per_worker?).unwrap_or(u16::MAX),
    })
}

const BROKER_KEYS: &[&str] = &[
    "retained_storage",
    "session_storage",
    "session",
    "exactly_once",
    "topic_aliases",
];

fn broker(ctx: &mut Ctx, section: Option<(String, &Value)>) -> Broker {
    let mut broker = Broker {
        retained_storage: None,
        session_storage: None,
        session: SessionSettings {
            ack_commit_interval: Duration::from_millis(200),
        },
        exactly_once: ExactlyOnce {
            expires_after: Duration::from_secs(3600),
        },
        topic_aliases: true,
    };
    let Some((path, value)) = section else {
        return broker;
    };
    let Some(mut f) = Fields::of(ctx, &path, value) else {
        return broker;
    };
    let provider_ref = |ctx: &mut Ctx, f: &mut Fields<'_>, key: &str| {
        f.take(key)
            .and_then(|(p, v)| string(ctx, &p, v))
            .filter(|s| s != "none")
    };
    broker.retained_storage = provider_ref(ctx, &mut f, "retained_storage");
    broker.session_storage = provider_ref(ctx, &mut f, "session_storage");
    if let Some((p, v)) = f.take("session") {
        if let Some(mut s) = Fields::of(ctx, &p, v) {
            if let Some(d) = s
                .take("ack_commit_interval")
                .and_then(|(p, v)| positive_duration(ctx, &p, v))
            {
                broker.session.ack_commit_interval = d;
            }
            s.finish(ctx, &["ack_commit_interval"]);
        }
    }
    if let Some((p, v)) = f.take("exactly_once") {
        if let Some(mut s) = Fields::of(ctx, &p, v) {
            if let Some(d) = s
                .take("expires_after")
                .and_then(|(p, v)| positive_duration(ctx, &p, v))
            {
                broker.exactly_once.expires_after = d;
            }
            s.finish(ctx, &["expires_after"]);
        }
    }
    if let Some(on) = f
        .take("topic_aliases")
        .and_then(|(p, v)| boolean(ctx, &p, v))
    {
        broker.topic_aliases = on;
    }
    f.finish(ctx, BROKER_KEYS);
    broker
}

const LIMITS_KEYS: &[&str] = &[
    "max_message_size",
    "max_header_bytes",
    "max_session_expiry",
    "max_connections",
    "receive_maximum",
    "max_inflight_messages",
    "max_queued_messages",
    "max_queued_bytes",
    "max_subscriptions_per_session",
    "max_sessions",
    "max_retained",
    "max_keep_alive",
];

/// MQTT's largest packet: the Remaining Length's maximum, 268,435,455.
pub(crate) const MQTT_MAX_PACKET: u64 = 268_435_455;

/// The smallest CONNECT a client can send: MQTT 5 with an empty client id
/// and nothing optional is 15 bytes (fixed header 2, protocol name 6,
/// level 1, flags 1, keep alive 2, property length 1, client id 2); MQTT
/// 3.1.1's is 14. `max_message_size + max_header_bytes` must hold it.
pub(crate) const MIN_CONNECT_PACKET: u64 = 15;

fn limits(ctx: &mut Ctx, section: Option<(String, &Value)>) -> Limits {
    let mut limits = Limits {
        max_message_size: 256 * 1024,
        max_header_bytes: 8 * 1024,
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
    };
    let Some((path, value)) = section else {
        return limits;
    };
    let Some(mut f) = Fields::of(ctx, &path, value) else {
        return limits;
    };
    if let Some((p, v)) = f.take("max_message_size") {
        if let Some(n) = size(ctx, &p, v) {
            if (1..=MQTT_MAX_PACKET).contains(&n) {
                limits.max_message_size = n;
            } else {
                ctx.problem(
                    &p,
                    format!("{n} bytes is outside 1..={MQTT_MAX_PACKET} (MQTT's largest packet)"),
                );
            }
        }
    }
    if let Some((p, v)) = f.take("max_header_bytes") {
        if let Some(n) = size(ctx, &p, v) {
            if n <= MQTT_MAX_PACKET {
                limits.max_header_bytes = n;
            } else {
                ctx.problem(
                    &p,
                    format!("{n} bytes is more than {MQTT_MAX_PACKET} (MQTT's largest packet)"),
                );
            }
        }
    }
    if let Some((p, v)) = f.take("max_queued_bytes") {
        limits.max_queued_bytes = optional_size(ctx, &p, v);
    }
    if let Some(d) = f
        .take("max_session_expiry")
        .and_then(|(p, v)| session_expiry(ctx, &p, v))
    {
        limits.max_session_expiry = d;
    }
    let mut int = |ctx: &mut Ctx, key: &str, min: u64, max: u64| {
        f.take(key).and_then(|(p, v)| integer(ctx, &p, v, min, max))
    };
    if let Some(n) = int(ctx, "max_connections", 1, u64::from(u32::MAX)) {
        limits.max_connections = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(n) = int(ctx, "receive_maximum", 1, 65_535) {
        limits.receive_maximum = u16::try_from(n).unwrap_or(u16::MAX);
    }
    // Unless set, the window the broker asks of clients, applied in
    // return.
    limits.max_inflight_messages = int(ctx, "max_inflight_messages", 1, 65_535)
        .map_or(limits.receive_maximum, |n| {
            u16::try_from(n).unwrap_or(u16::MAX)
        });
    if let Some(n) = int(ctx, "max_queued_messages", 0, u64::from(u32::MAX)) {
        limits.max_queued_messages = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(n) = int(ctx, "max_subscriptions_per_session", 1, u64::from(u32::MAX)) {
        limits.max_subscriptions_per_session = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(n) = int(ctx, "max_sessions", 1, u64::from(u32::MAX)) {
        limits.max_sessions = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(n) = int(ctx, "max_retained", 1, u64::from(u32::MAX)) {
        limits.max_retained = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(n) = int(ctx, "max_keep_alive", 0, 65_535) {
        limits.max_keep_alive = u16::try_from(n).unwrap_or(u16::MAX);
    }
    f.finish(ctx, LIMITS_KEYS);
    // The broker accepts no packet larger than the sum (its Maximum Packet
    // Size), CONNECT included: below the smallest CONNECT every client is
    // closed before it could connect. A value refused above left its
    // default in place, which is never this small.
    let packet = limits
        .max_message_size
        .saturating_add(limits.max_header_bytes);
    if packet < MIN_CONNECT_PACKET {
        ctx.problem(
            &join(&path, "max_message_size"),
            format!(
                "{} + limits.max_header_bytes {} = {packet} bytes is the largest packet the broker accepts, and the smallest CONNECT (MQTT 5, empty client id) is {MIN_CONNECT_PACKET} bytes: no client could connect; the two must add up to at least {MIN_CONNECT_PACKET}",
                limits.max_message_size, limits.max_header_bytes
            ),
        );
    }
    limits
}

/// `file_sha256`, which `check-config --output` writes so the resolved
/// document loads back: digests of the named files, by path. They are
/// recomputed from the files on every load, so an input's are only checked
/// for shape (a SHA-256 is 64 hex digits; anything else is not what
/// `--output` wrote) and otherwise ignored.
fn file_sha256(ctx: &mut Ctx, section: Option<(String, &Value)>) {
    let Some((path, value)) = section else {
        return;
    };
    let Some(f) = Fields::of(ctx, &path, value) else {
        return;
    };
    for (key, v) in &f.entries {
        let digest = v
            .as_str()
            .filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()));
        if digest.is_none() {
            ctx.problem(&join(&path, key), "expected a SHA-256 as 64 hex digits");
        }
    }
}

fn metrics(ctx: &mut Ctx, section: Option<(String, &Value)>) -> Metrics {
    let mut metrics = Metrics { bind: None };
    let Some((path, value)) = section else {
        return metrics;
    };
    let Some(mut f) = Fields::of(ctx, &path, value) else {
        return metrics;
    };
    metrics.bind = f.take("bind").and_then(|(p, v)| socket_addr(ctx, &p, v));
    f.finish(ctx, &["bind"]);
    metrics
}

fn log(ctx: &mut Ctx, section: Option<(String, &Value)>) -> Log {
    let mut log = Log {
        level: LogLevel::Info,
        format: LogFormat::Logfmt,
    };
    let Some((path, value)) = section else {
        return log;
    };
    let Some(mut f) = Fields::of(ctx, &path, value) else {
        return log;
    };
    if let Some(level) = f.take("level").and_then(|(p, v)| {
        one_of(
            ctx,
            &p,
            v,
            &[
                ("error", LogLevel::Error),
                ("warn", LogLevel::Warn),
                ("info", LogLevel::Info),
                ("debug", LogLevel::Debug),
                ("trace", LogLevel::Trace),
            ],
        )
    }) {
        log.level = level;
    }
    if let Some(format) = f.take("format").and_then(|(p, v)| {
        one_of(
            ctx,
            &p,
            v,
            &[("logfmt", LogFormat::Logfmt), ("json", LogFormat::Json)],
        )
    }) {
        log.format = format;
    }
    f.finish(ctx, &["level", "format"]);
    log
}
