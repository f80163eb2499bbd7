//! What a configuration keeps and what its bounds came to, in sentences
//! (invariant 14: durability is exactly the provider's
//! promise, stated where it is claimed).

use super::units::format_duration;
use super::*;

/// The provider's promise, as a clause.
fn promise(provider: &Provider) -> String {
    match provider {
        Provider::Memory(MemoryProvider {
            snapshot_dir: Some(dir),
            snapshots,
            ..
        }) => match snapshots.max_delay {
            None => format!(
                "kept as of the last successful snapshot (written at shutdown to {}); a crash, an OOM kill or a power cut loses everything since",
                dir.display()
            ),
            Some(max_delay) => format!(
                "kept as of the last snapshot generation (written to {} {}, at most {} after a change); a crash, an OOM kill or a power cut loses up to the last {} and one generation's write",
                dir.display(),
                snapshots.debounce.map_or_else(
                    || "at the maximum delay".to_owned(),
                    |d| format!("{} after the last change", format_duration(d))
                ),
                format_duration(max_delay),
                format_duration(max_delay)
            ),
        },
        Provider::Memory(MemoryProvider {
            snapshot_dir: None, ..
        }) => "not kept: memory with no snapshot_dir, lost at every restart".to_string(),
        Provider::Sqlite(s) => format!(
            "every commit is kept (in {}), less about one flush_interval ({}) on a power cut",
            s.file_path.display(),
            format_duration(s.flush_interval)
        ),
    }
}

fn store_line(config: &Config, what: &str, provider: Option<&str>) -> String {
    match provider.and_then(|name| config.provider(name)) {
        Some(p) => format!(
            "{what}: provider {} ({}): {}",
            p.name(),
            p.kind_name(),
            promise(p)
        ),
        None => format!("{what}: memory, not kept: lost at every restart"),
    }
}

/// A channel's own bounds, as a trailing clause (empty when it has none).
fn channel_bounds(channel: &Channel) -> String {
    let mut parts = Vec::new();
    if let Some(bytes) = channel.retention_bytes {
        parts.push(format!("oldest records removed past {bytes} bytes"));
    }
    let latest = matches!(channel.kind, super::ChannelKindConfig::Latest);
    if let Some(age) = channel.retention_age {
        parts.push(if latest {
            format!("deletions older than {} forgotten", format_duration(age))
        } else {
            format!("records older than {} removed", format_duration(age))
        });
    }
    if let Some(count) = channel.retention_deletions {
        parts.push(format!("deletions past the newest {count} forgotten"));
    }
    if let Some(bytes) = channel.max_bytes {
        parts.push(format!("publishes refused past {bytes} bytes"));
    }
    if let Some(bytes) = channel.queue().and_then(|q| q.dlq_retention_bytes) {
        parts.push(format!("dead letters removed past {bytes} bytes"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("; {}", parts.join(", "))
    }
}

/// How many channels a broker's start states one by one. Past it, each
/// provider's channels are stated in one line, and each channel's own lines
/// go to the debug level: ten thousand lines at every start bury the rest
/// of the log, and journald's default rate limit (10,000 messages in 30 s)
/// would drop what follows them, `listening` included.
pub const CHANNELS_STATED_ONE_BY_ONE: usize = 100;

/// Each channel's durability, one sentence a channel.
pub(crate) fn channel_durability(config: &Config) -> Vec<String> {
    let providers: std::collections::HashMap<&str, &Provider> =
        config.storage.iter().map(|p| (p.name(), p)).collect();
    let mut lines = Vec::with_capacity(config.channels.len());
    for channel in &config.channels {
        let Some(provider) = providers.get(channel.storage.as_str()) else {
            continue;
        };
        let dlq = channel
            .dlq_name()
            .map(|d| format!(", with its dead-letter channel {d}"))
            .unwrap_or_default();
        lines.push(format!(
            "channel {} ({}{dlq}) on provider {} ({}): {}{}",
            channel.name,
            channel.kind_name(),
            provider.name(),
            provider.kind_name(),
            promise(provider),
            channel_bounds(channel)
        ));
    }
    lines
}

/// The channels' durability a provider at a time: how many of each kind
/// it keeps, its promise, and how many have bounds of their own.
fn channel_durability_by_provider(config: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    for provider in &config.storage {
        let mut kinds: Vec<(&str, usize)> = Vec::new();
        let mut channels = 0;
        let mut bounded = 0;
        for channel in config
            .channels
            .iter()
            .filter(|c| c.storage == provider.name())
        {
            channels += 1;
            bounded += usize::from(!channel_bounds(channel).is_empty());
            let kind = channel.kind_name();
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((kind, 1)),
            }
        }
        if channels == 0 {
            continue;
        }
        let kinds: Vec<String> = kinds
            .iter()
            .map(|(kind, n)| match *kind {
                "queue" => format!("{n} queue, each with its dead-letter channel"),
                _ => format!("{n} {kind}"),
            })
            .collect();
        lines.push(format!(
            "{channels} channel{} ({}) on provider {} ({}): {}; {bounded} of them with bounds of their own (each channel's line is at the debug level)",
            if channels == 1 { "" } else { "s" },
            kinds.join(", "),
            provider.name(),
            provider.kind_name(),
            promise(provider),
        ));
    }
    lines
}

/// How a summary states the channels' durability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelLines {
    /// A sentence for each channel.
    Each,
    /// A sentence for each provider's channels.
    ByProvider,
}

impl ChannelLines {
    /// How a broker's start states `channels` channels.
    pub fn at_start(channels: usize) -> ChannelLines {
        if channels > CHANNELS_STATED_ONE_BY_ONE {
            ChannelLines::ByProvider
        } else {
            ChannelLines::Each
        }
    }
}

pub(crate) fn durability_summary(config: &Config, channel_lines: ChannelLines) -> Vec<String> {
    let mut lines = Vec::new();
    if !config.keeps_anything() {
        lines.push(
            "this configuration keeps nothing: every channel, retained message and session is lost at every restart".to_string(),
        );
    }
    let used = config.used_providers();
    lines.extend(match channel_lines {
        ChannelLines::Each => channel_durability(config),
        ChannelLines::ByProvider => channel_durability_by_provider(config),
    });
    lines.push(store_line(
        config,
        "retained messages",
        config.broker.retained_storage.as_deref(),
    ));
    lines.push(store_line(
        config,
        "persistent sessions and the broadcast log",
        config.broker.session_storage.as_deref(),
    ));
    let reserve = config.reserve_bytes();
    for provider in &config.storage {
        if !used.contains(provider.name()) {
            lines.push(format!(
                "provider {} ({}): inert: no channel or broker store names it; nothing is opened or created for it",
                provider.name(),
                provider.kind_name()
            ));
            continue;
        }
        lines.push(match provider.bound(reserve) {
            None => format!(
                "provider {} ({}): no max_bytes, no bound and no reserve",
                provider.name(),
                provider.kind_name()
            ),
            Some(bound) => match bound.pages {
                Some(pages) => format!(
                    "provider {} (sqlite): max_bytes {} = {pages} pages of {SQLITE_PAGE_SIZE} bytes ({} bytes); reserve {} bytes ({} pages: max_message_size {} + max_header_bytes {}, rounded up); publishes stop at {} bytes ({} pages); the bound is the database file's, and its -wal file grows beside it until a checkpoint",
                    provider.name(),
                    bound.max_bytes,
                    bound.effective_bytes,
                    bound.reserve_bytes,
                    bound.reserve_bytes / SQLITE_PAGE_SIZE,
                    config.limits.max_message_size,
                    config.limits.max_header_bytes,
                    bound.publish_limit_bytes,
                    bound.publish_limit_bytes / SQLITE_PAGE_SIZE,
                ),
                None => format!(
                    "provider {} (memory): max_bytes {} bytes; reserve {} bytes (max_message_size {} + max_header_bytes {}); publishes stop at {} bytes",
                    provider.name(),
                    bound.max_bytes,
                    bound.reserve_bytes,
                    config.limits.max_message_size,
                    config.limits.max_header_bytes,
                    bound.publish_limit_bytes,
                ),
            },
        });
    }
    lines
}
