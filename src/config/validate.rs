//! Cross-checks: what no single key can be judged on alone.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};

use super::names::{
    check_channel_name, served_channels, CHANNEL_NAME_MAX_BYTES, MAX_SERVED_CHANNELS,
};
use super::parse::{join, Ctx};
use super::*;

/// What the parser produced, each item with its index in the file so a
/// problem can name `channels[2]` even when an earlier item was refused.
pub(crate) struct Parsed {
    pub listeners: Vec<(usize, Listener)>,
    pub auth: Auth,
    pub storage: Vec<(usize, Provider)>,
    /// Every provider name given, including providers refused for another
    /// reason, for judging references to them.
    pub provider_names: Vec<String>,
    pub channels: Vec<(usize, Channel)>,
    pub broker: Broker,
    pub limits: Limits,
    pub metrics: Metrics,
    pub log: Log,
    pub bridges: Vec<(usize, bridge::Bridge)>,
}

pub(crate) fn cross_check(ctx: &mut Ctx, parsed: &Parsed) {
    reachability(ctx, parsed);
    listeners(ctx, parsed);
    providers(ctx, parsed);
    channels(ctx, parsed);
    broker(ctx, parsed);
    bridge::cross_check(ctx, &parsed.bridges, &parsed.channels);
}

/// A configuration nobody can connect to is refused with the reason.
fn reachability(ctx: &mut Ctx, parsed: &Parsed) {
    // Only when the section parsed without problems: a listener refused
    // for its own reasons is already reported.
    let listener_problems = ctx.problems.iter().any(|p| p.path.starts_with("listeners"));
    if parsed.listeners.is_empty() && !listener_problems {
        ctx.problem(
            "listeners",
            "no listener is configured; no client could connect",
        );
    }
    let auth = &parsed.auth;
    // An auth section refused for its own reasons is already reported.
    let auth_problems = ctx.problems.iter().any(|p| p.path.starts_with("auth"));
    if !auth.allow_anonymous && !auth_problems {
        match (&auth.password_file, &auth.passwords) {
            (None, _) => ctx.problem(
                "auth",
                "allow_anonymous is false (the default in a configuration file) and no password_file is set; no client could connect (set auth.allow_anonymous: true or name a password_file)",
            ),
            (Some(_), Some(passwords)) if passwords.is_empty() => ctx.problem(
                "auth.password_file",
                super::auth::EMPTY_PASSWORD_FILE,
            ),
            _ => {}
        }
    }
}

fn listeners(ctx: &mut Ctx, parsed: &Parsed) {
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, listener) in &parsed.listeners {
        if let Some(first) = names.get(listener.name.as_str()) {
            ctx.problem(
                &format!("listeners[{i}].name"),
                format!(
                    "duplicate listener name {:?} (also listeners[{first}])",
                    listener.name
                ),
            );
        } else {
            names.insert(&listener.name, *i);
        }
    }
    // Each listener against the ones before it, through indexes by port
    // and by exact address, so a configuration of many listeners is
    // checked in linear time; the first earlier listener it conflicts with
    // is named.
    let mut first_on_port: HashMap<u16, (usize, SocketAddr)> = HashMap::new();
    let mut first_unspecified_on_port: HashMap<u16, (usize, SocketAddr)> = HashMap::new();
    let mut first_at: HashMap<(IpAddr, u16), (usize, SocketAddr)> = HashMap::new();
    for (i, a) in &parsed.listeners {
        let port = a.bind.port();
        if port == 0 {
            continue;
        }
        let same_address = first_at.get(&(address(a.bind), port)).copied();
        let conflict = if unspecified(a.bind.ip()) {
            first_on_port.get(&port).copied()
        } else {
            [same_address, first_unspecified_on_port.get(&port).copied()]
                .into_iter()
                .flatten()
                .min_by_key(|(j, _)| *j)
        };
        if let Some((j, b)) = conflict {
            ctx.problem(
                &format!("listeners[{i}].bind"),
                format!(
                    "{} cannot be bound beside listeners[{j}].bind {b}: the same port on an overlapping address",
                    a.bind
                ),
            );
        }
        first_on_port.entry(port).or_insert((*i, a.bind));
        first_at
            .entry((address(a.bind), port))
            .or_insert((*i, a.bind));
        if unspecified(a.bind.ip()) {
            first_unspecified_on_port
                .entry(port)
                .or_insert((*i, a.bind));
        }
    }
    if let Some(metrics) = parsed.metrics.bind {
        for (i, listener) in &parsed.listeners {
            if binds_conflict(metrics, listener.bind) {
                ctx.problem(
                    "metrics.bind",
                    format!(
                        "{metrics} cannot be bound beside listeners[{i}].bind {}: the same port on an overlapping address",
                        listener.bind
                    ),
                );
            }
        }
    }
}

/// Two binds on one port conflict when their addresses are equal or either
/// is unspecified (0.0.0.0 or [::], which on Linux covers both families by
/// default). Port 0 never conflicts: each bind gets its own port.
fn binds_conflict(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() == 0 || a.port() != b.port() {
        return false;
    }
    let (x, y) = (address(a), address(b));
    x == y || unspecified(x) || unspecified(y)
}

/// The address a bind takes: an IPv4-mapped IPv6 address
/// (`[::ffff:127.0.0.1]`) is the IPv4 address it maps, which a bind of
/// that IPv4 address and port conflicts with.
fn address(bind: SocketAddr) -> IpAddr {
    bind.ip().to_canonical()
}

fn unspecified(ip: IpAddr) -> bool {
    ip.is_unspecified()
}

fn providers(ctx: &mut Ctx, parsed: &Parsed) {
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, provider) in &parsed.storage {
        if let Some(first) = names.get(provider.name()) {
            ctx.problem(
                &format!("storage[{i}].name"),
                format!(
                    "duplicate provider name {:?} (also storage[{first}])",
                    provider.name()
                ),
            );
        } else {
            names.insert(provider.name(), *i);
        }
    }

    // Two providers in one file or directory would each believe it is the
    // only writer (and each take the same lock). Nor may one provider's
    // place be a file another keeps beside its own: SQLite's sidecars of a
    // database, a lock (itself a SQLite database, with sidecars of its
    // own), a snapshot directory's lock. The owner deletes or rewrites
    // those files whatever they hold, so the other provider's data would
    // be lost, or the other provider would not open.
    let mut places: HashMap<PathBuf, (String, &'static str)> = HashMap::new();
    let mut beside: HashMap<PathBuf, (usize, String, &'static str, &Path)> = HashMap::new();
    for (i, provider) in &parsed.storage {
        let Some((key, place)) = place_of(provider) else {
            continue;
        };
        for (file, what) in files_beside(provider, place) {
            beside.entry(normalise(&file)).or_insert((
                *i,
                format!("storage[{i}].{key}"),
                what,
                place,
            ));
        }
    }
    for (i, provider) in &parsed.storage {
        let Some((key, place)) = place_of(provider) else {
            continue;
        };
        let path = format!("storage[{i}].{key}");
        let normal = normalise(place);
        if let Some((other, other_key)) = places.get(&normal) {
            ctx.problem(
                &path,
                format!(
                    "{} is also {other} ({other_key}); two providers cannot share a {}",
                    place.display(),
                    if key == "file_path" && *other_key == "file_path" {
                        "database"
                    } else {
                        "path"
                    }
                ),
            );
        } else {
            if let Some((_, owner, what, owner_place)) =
                beside.get(&normal).filter(|(j, ..)| j != i)
            {
                ctx.problem(
                    &path,
                    format!(
                        "{} is {what} of {owner} {}; two providers cannot share a database, or the files kept beside one",
                        place.display(),
                        owner_place.display()
                    ),
                );
            }
            places.insert(normal, (format!("storage[{i}]"), key));
        }
        match provider {
            Provider::Sqlite(s) if s.file_path.is_dir() => ctx.problem(
                &path,
                format!(
                    "{} is a directory; file_path names the database file",
                    s.file_path.display()
                ),
            ),
            Provider::Memory(m) => {
                // Judged as serve creates it: the path itself, a symlink
                // not followed (serve refuses one, even to a directory).
                let meta = m
                    .snapshot_dir
                    .as_ref()
                    .and_then(|dir| std::fs::symlink_metadata(dir).ok().map(|meta| (dir, meta)));
                match meta {
                    Some((dir, meta)) if meta.file_type().is_symlink() => ctx.problem(
                        &path,
                        format!(
                            "{} is a symlink; a snapshot directory is named as the directory itself (write the path it leads to)",
                            dir.display()
                        ),
                    ),
                    Some((dir, meta)) if !meta.is_dir() => ctx.problem(
                        &path,
                        format!("{} exists and is not a directory", dir.display()),
                    ),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    let reserve = parsed
        .limits
        .max_message_size
        .saturating_add(parsed.limits.max_header_bytes);
    for (i, provider) in &parsed.storage {
        let path = format!("storage[{i}].max_bytes");
        let Some(bound) = provider.bound(reserve) else {
            continue;
        };
        match provider {
            Provider::Sqlite(_) => {
                if bound.pages == Some(0) {
                    ctx.problem(
                        &path,
                        format!(
                            "{} bytes rounds down to 0 pages of {SQLITE_PAGE_SIZE} bytes (SQLite would read max_page_count = 0 as no bound at all)",
                            bound.max_bytes
                        ),
                    );
                } else if bound.effective_bytes < bound.reserve_bytes.saturating_mul(2) {
                    ctx.problem(
                        &path,
                        format!(
                            "{} bytes ({} pages of {SQLITE_PAGE_SIZE}) is below twice the reserve: the reserve is {} bytes (limits.max_message_size {} + limits.max_header_bytes {} = {reserve}, rounded up to {} pages), so max_bytes must be at least {} bytes",
                            bound.max_bytes,
                            bound.pages.unwrap_or(0),
                            bound.reserve_bytes,
                            parsed.limits.max_message_size,
                            parsed.limits.max_header_bytes,
                            bound.reserve_bytes / SQLITE_PAGE_SIZE,
                            bound.reserve_bytes.saturating_mul(2)
                        ),
                    );
                }
            }
            Provider::Memory(_) => {
                if bound.effective_bytes < reserve.saturating_mul(2) {
                    ctx.problem(
                        &path,
                        format!(
                            "{} bytes is below twice the reserve: the reserve is {reserve} bytes (limits.max_message_size {} + limits.max_header_bytes {}), so max_bytes must be at least {} bytes",
                            bound.max_bytes,
                            parsed.limits.max_message_size,
                            parsed.limits.max_header_bytes,
                            reserve.saturating_mul(2)
                        ),
                    );
                }
            }
        }
    }
}

/// The key and the place of a provider that keeps anything on disk.
fn place_of(provider: &Provider) -> Option<(&'static str, &Path)> {
    match provider {
        Provider::Memory(m) => m.snapshot_dir.as_deref().map(|dir| ("snapshot_dir", dir)),
        Provider::Sqlite(s) => Some(("file_path", s.file_path.as_path())),
    }
}

/// The files a provider keeps beside its place, each with what it is. For
/// a database, under both its configured and its resolved name: SQLite
/// names the sidecars after the file a symlink leads to, the lock is named
/// after the path as configured.
fn files_beside(provider: &Provider, place: &Path) -> Vec<(PathBuf, &'static str)> {
    use crate::storage::lock::{lock_path_for_database, lock_path_for_snapshot_dir};
    use crate::storage::sqlite::{sidecar_path, ROOM_SUFFIX, SIDECARS};
    let sidecar_of = |suffix: &str| match suffix {
        "-wal" => "the write-ahead log",
        "-shm" => "the write-ahead log's index",
        _ => "the rollback journal",
    };
    let lock_sidecar_of = |suffix: &str| match suffix {
        "-wal" => "the lock's write-ahead log",
        "-shm" => "the lock's write-ahead log index",
        _ => "the lock's rollback journal",
    };
    let mut out = Vec::new();
    let lock_with_sidecars = |lock: PathBuf, out: &mut Vec<(PathBuf, &'static str)>| {
        for suffix in SIDECARS {
            out.push((sidecar_path(&lock, suffix), lock_sidecar_of(suffix)));
        }
        out.push((lock, "the lock"));
    };
    match provider {
        Provider::Memory(_) => lock_with_sidecars(lock_path_for_snapshot_dir(place), &mut out),
        Provider::Sqlite(_) => {
            let resolved = normalise(place);
            for name in [place, resolved.as_path()] {
                for suffix in SIDECARS {
                    out.push((sidecar_path(name, suffix), sidecar_of(suffix)));
                }
                out.push((sidecar_path(name, ROOM_SUFFIX), "the checkpoint's room"));
                lock_with_sidecars(lock_path_for_database(name), &mut out);
            }
        }
    }
    out
}

/// Symlinks followed at the final component before giving up, as the
/// kernel's own limit on a path's links.
const MAX_SYMLINKS: u32 = 40;

/// A path with `.` removed and `..` folded lexically, then resolved through
/// the file system when it exists, so `a/./db` and `a/db` and a symlink to
/// it are one place. A symlink whose target does not exist yet is followed
/// too: a database or directory created there lands at the target, so it
/// is the target's place (the first start would otherwise serve two
/// providers on one file, and every later start refuse).
fn normalise(path: &Path) -> PathBuf {
    normalise_following(path, MAX_SYMLINKS)
}

fn normalise_following(path: &Path, links_left: u32) -> PathBuf {
    if let Ok(real) = path.canonicalize() {
        return real;
    }
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    // A dangling symlink: the place is where it leads, a relative target
    // read from the link's own (resolved) directory.
    if links_left > 0 {
        if let Ok(target) = std::fs::read_link(&out) {
            let target = match out.parent() {
                Some(dir) if target.is_relative() => dir
                    .canonicalize()
                    .unwrap_or_else(|_| dir.to_path_buf())
                    .join(target),
                _ => target,
            };
            return normalise_following(&target, links_left - 1);
        }
    }
    // An absent file in an existing directory: resolve the directory.
    if let (Some(parent), Some(file)) = (out.parent(), out.file_name()) {
        if let Ok(real_parent) = parent.canonicalize() {
            return real_parent.join(file);
        }
    }
    out
}

fn channels(ctx: &mut Ctx, parsed: &Parsed) {
    let mut names: HashMap<&str, usize> = HashMap::new();
    let provider_names: HashSet<&str> = parsed.provider_names.iter().map(String::as_str).collect();
    for (i, channel) in &parsed.channels {
        let path = format!("channels[{i}]");
        if let Err(reason) = check_channel_name(&channel.name) {
            ctx.problem(&join(&path, "name"), reason);
        }
        if let Some(first) = names.get(channel.name.as_str()) {
            ctx.problem(
                &join(&path, "name"),
                format!(
                    "duplicate channel name {:?} (also channels[{first}])",
                    channel.name
                ),
            );
        } else {
            names.insert(&channel.name, *i);
        }
        if !provider_names.contains(channel.storage.as_str()) {
            ctx.problem(
                &join(&path, "storage"),
                format!(
                    "no provider named {:?}{}",
                    channel.storage,
                    known_providers(parsed)
                ),
            );
        }
        if let (Some(retention), Some(max)) = (channel.retention_bytes, channel.max_bytes) {
            if retention > max {
                ctx.problem(
                    &join(&path, "retention_bytes"),
                    format!(
                        "{retention} bytes is more than max_bytes {max}: the channel would refuse publishes before retention removed anything"
                    ),
                );
            }
        }
    }
    let served = served_channels(parsed.channels.iter().map(|(_, c)| c));
    if served > MAX_SERVED_CHANNELS {
        ctx.problem(
            "channels",
            format!(
                "{} channels configured and a dead-letter channel for each of {} queues make {served} to serve; the limit is {MAX_SERVED_CHANNELS} (a channel is a topic's first level; the levels below it are free)",
                parsed.channels.len(),
                served - parsed.channels.len()
            ),
        );
    }
    // Dead-letter channels: `<queue>.dlq` lives in the queue's provider and
    // file, so a configured channel of that name would put it elsewhere (or
    // give it a second kind).
    for (i, channel) in &parsed.channels {
        let Some(dlq) = channel.dlq_name() else {
            continue;
        };
        let path = format!("channels[{i}].name");
        if dlq.len() > CHANNEL_NAME_MAX_BYTES {
            ctx.problem(
                &path,
                format!(
                    "the dead-letter channel name {dlq:?} would be {} bytes; the limit is {CHANNEL_NAME_MAX_BYTES}",
                    dlq.len()
                ),
            );
        }
        if let Some(j) = names.get(dlq.as_str()) {
            ctx.problem(
                &format!("channels[{j}].name"),
                format!(
                    "{dlq:?} is the dead-letter channel of queue {:?} (channels[{i}]); it is created beside the queue on provider {:?} and cannot be configured",
                    channel.name, channel.storage
                ),
            );
        }
    }
}

fn known_providers(parsed: &Parsed) -> String {
    if parsed.provider_names.is_empty() {
        " (no storage providers are configured)".to_string()
    } else {
        format!(" (providers: {})", parsed.provider_names.join(", "))
    }
}

fn broker(ctx: &mut Ctx, parsed: &Parsed) {
    for (key, name) in [
        ("retained_storage", &parsed.broker.retained_storage),
        ("session_storage", &parsed.broker.session_storage),
    ] {
        if let Some(name) = name {
            if !parsed.provider_names.contains(name) {
                ctx.problem(
                    &format!("broker.{key}"),
                    format!("no provider named {name:?}{}", known_providers(parsed)),
                );
            }
        }
    }
}
