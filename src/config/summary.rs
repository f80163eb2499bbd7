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

pub(crate) fn durability_summary(config: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    if !config.keeps_anything() {
        lines.push(
            "this configuration keeps nothing: every channel, retained message and session is lost at every restart".to_string(),
        );
    }
    let providers: std::collections::HashMap<&str, &Provider> =
        config.storage.iter().map(|p| (p.name(), p)).collect();
    let used = config.used_providers();
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
