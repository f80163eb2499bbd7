//! `saguin bench`: what this machine and its disk cost the providers a
//! configuration names, measured in scratch directories beside their data,
//! and what that means for the configuration.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use saguin::broker::bench::{self as publish_bench, channel_name, Load, PublishCosts};
use saguin::config::{self, Config, ConfigError, Provider, SnapshotSchedule};
use saguin::storage::bench::{self as disk, Latencies, Scratch, SnapshotWrite};
use saguin::storage::file_system::{self, Unkept};
use saguin::storage::lock::{self, LockState};
use saguin::storage::sqlite::{Capacity, WAL_RESTART_BYTES};
use serde_json::{json, Value};

use crate::exit;
use crate::output::{grouped, table};

/// What `--dir` is measured as: a sqlite provider with the defaults, and a
/// memory provider of this bound.
const DIR_MAX_BYTES: u64 = 256 << 20;
/// The most a full run writes for the snapshot rate (a quick one 16 MiB).
const SNAPSHOT_SAMPLE: u64 = 256 << 20;
const SNAPSHOT_SAMPLE_QUICK: u64 = 16 << 20;
/// The fewest channel files a generation is sampled with for what a file
/// costs apart from its bytes (more when the provider holds more
/// channels).
const FILES_SAMPLE: usize = 1_000;
/// The most publishes the fast publishers make in all: about 32 MiB of
/// 128-byte payloads. The scratch provider has no bound, and what they
/// store is RAM (memory) or disk (sqlite) beside a live broker's: about 60
/// MiB of a memory provider's records, where five seconds of publishing
/// as fast as they went held 663 MiB.
const FAST_MAX_PUBLISHES: u64 = 250_000;
/// What a graceful stop waits for connections before it writes.
const DRAIN: Duration = Duration::from_secs(5);

/// What `saguin bench --help` and its man page say of it.
pub const LONG_ABOUT: &str = "\
Measure what this machine and disk cost the configured providers.

For each storage provider of --config (or, with --dir, for that directory \
as a sqlite provider with the defaults and a memory provider of 256 MiB), \
in a scratch directory made beside its data on the same file system and \
removed after - never inside a memory provider's snapshot directory, and \
never touching a provider's own files:

- fsync: 4 KiB written and fdatasync'ed, again and again: p50, p99, max.

- snapshot (memory with a snapshot_dir): a provider of up to 256 MiB (16 \
MiB with --quick), held in this process's RAM, written as one snapshot \
generation: bytes a second; then \
a generation of as many channels as the provider holds (at least 1,000), \
one small record each: what each file costs apart from its bytes (its \
write, its share of the generation's sync and its rename), in time and in \
CPU.

- publish: a broker started in this process on the provider's settings \
(flush_interval, publish_commit_interval, ..., the snapshot schedule; but \
no checkpoint_room or snapshot_room, which would take that much more of \
the file system), as \
many append channels as the configuration puts on the provider (one with \
--dir), MQTT 3.1.1 clients over 127.0.0.1, each publish to the next \
channel in turn (a provider sustains about half as many publishes spread \
over 10,000 channels as to one): one publisher paced to 5,000 QoS 1 \
publishes a second for 5 s (1,000 for 1 s with --quick), each publish's \
time to its PUBACK; then 4 publishers (2) with 64 publishes in flight each \
for 5 s (1 s) or 250,000 publishes in all, whichever comes first (the \
scratch provider has no bound, and what it holds is this machine's RAM \
or disk): publishes acknowledged a second.

Then what that means: a sqlite provider's power-cut loss (its \
flush_interval and an fsync), a memory provider's crash loss (its \
snapshot_max_delay and the write of a full provider: a file for each of \
its channels and max_bytes at the measured rate, 256 MiB where it has \
none) and how long its stop \
takes when full (that write, after the 5 s connection drain) against the \
supervisor's stop timeout (--timeout-stop), and each provider's sustained \
publish rate.

--quick takes under 10 s for a configuration of two providers on a local \
disk; a memory provider of many channels adds the three generations of \
its channels' files and the scratch broker's stop, which writes a file \
for each channel published to (4-8 s at 10,000 channels on a virtio \
disk). A progress line shows on a terminal, nothing when piped.

Exit 0 when measured (whatever it found), 1 when the configuration is \
invalid, 3 when a directory is a memory provider's snapshot directory (a \
live broker's is named with its holder), cannot be written, or a \
measurement failed.

--json prints one document: `{\"quick\", \"cpus\", \
\"timeout_stop_seconds\", \"targets\": [{\"provider\", \"kind\": \
\"memory\"|\"sqlite\", \"dir\", \"memory_backed\": \
null|\"tmpfs\"|\"ramfs\", \"over_network\": null|\"nfs\"|\"smb\", \
\"fsync\": null|{\"samples\",\"p50_ms\",\"p99_ms\",\"max_ms\"}, \
\"snapshot\": \
null|{\"accounted_bytes\",\"file_bytes\",\"seconds\",\"bytes_per_second\"}, \
\"channel_files\": n, \"ext4_without_journal\": null|bool, \"snapshot_files\": \
null|{\"files\",\"seconds\",\"per_file_ms\",\"cpu_per_file_ms\"}, \"publish\": \
{\"payload_bytes\",\"channels\",\"paced_rate\",\"paced_count\",\"puback_p50_ms\", \
\"puback_p99_ms\",\"puback_max_ms\",\"fast_acknowledged\",\"fast_seconds\", \
\"sustained_per_second\"}, \"means\": \
{\"power_cut_loss_ms\": null|n, \"crash_loss_ms\": null|n, \
\"full_shutdown_seconds\": null|n, \"shutdown_fits\": null|bool, \
\"full_bytes\": null|n, \
\"file_system\": \
null|{\"free_bytes\",\"held_bytes\",\"needs_bytes\",\"fits\"}, \
\"sustained_per_second\"}}]}`. Readers must ignore fields they do not \
know.";

/// `saguin bench`'s arguments.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// The configuration whose providers are measured.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "dir",
        required_unless_present = "dir"
    )]
    pub config: Option<PathBuf>,
    /// Measure this directory's disk instead (it must not be a memory
    /// provider's snapshot directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// A run under 10 seconds: fewer samples, shorter publishing (a
    /// provider of thousands of channels takes longer).
    #[arg(long)]
    pub quick: bool,
    /// The supervisor's stop timeout the shutdown is held to, in seconds
    /// (systemd's TimeoutStopSec; 90 is its default).
    #[arg(long, value_name = "SECONDS", default_value_t = 90)]
    pub timeout_stop: u64,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

const EXAMPLES: &str = "\
Examples:
  saguin bench --config /etc/saguin/saguin.yaml --quick
  saguin bench --dir /var/lib/saguin --json";

/// One provider to measure: where, and the settings it runs on.
struct Target {
    provider: Provider,
    /// The directory the scratch directory is made in.
    parent: Option<PathBuf>,
    /// Whether that directory is where the provider's promise does not
    /// hold, asked once.
    file_system: Option<Unkept>,
    /// The channels the configuration puts on the provider: a memory
    /// provider's generation writes a file for each that changed.
    channel_files: usize,
    /// Whether a memory provider's snapshot directory is on ext4 without
    /// a journal, where a generation makes its files from the ones it
    /// replaced (spares); `None` for any other provider, or when it cannot
    /// be told.
    without_journal: Option<bool>,
}

impl Target {
    fn new(provider: Provider, parent: Option<PathBuf>, channel_files: usize) -> Target {
        let file_system = parent.as_deref().and_then(file_system::unkept);
        let without_journal = match &provider {
            Provider::Memory(m) if m.snapshot_dir.is_some() => {
                parent.as_deref().and_then(file_system::without_journal)
            }
            _ => None,
        };
        Target {
            provider,
            parent,
            file_system,
            channel_files,
            without_journal,
        }
    }
}

/// What was measured of one target.
struct Measured {
    fsync: Option<Latencies>,
    snapshot: Option<SnapshotWrite>,
    /// A generation of many channel files of one record each.
    snapshot_files: Option<SnapshotWrite>,
    publish: PublishCosts,
    load: Load,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    let targets = match targets(&args) {
        Ok(t) => t,
        Err(code) => return Ok(code),
    };
    let progress = Progress::new(args.json);
    let mut results = Vec::new();
    for target in &targets {
        match measure(target, args.quick, &progress) {
            Ok(m) => results.push((target, m)),
            Err(e) => {
                progress.finish();
                eprintln!("saguin: bench {}: {e:#}", target.provider.name());
                return Ok(exit::CANNOT);
            }
        }
    }
    progress.finish();
    let timeout_stop = Duration::from_secs(args.timeout_stop);
    if args.json {
        let doc = json!({
            "quick": args.quick,
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "timeout_stop_seconds": args.timeout_stop,
            "targets": results.iter().map(|(t, m)| target_json(t, m, timeout_stop)).collect::<Vec<_>>(),
        });
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        print_human(&results, timeout_stop)?;
    }
    Ok(exit::OK)
}

/// The providers to measure, or the exit code that refuses.
fn targets(args: &Args) -> Result<Vec<Target>, u8> {
    if let Some(dir) = &args.dir {
        // Absolute, as a configuration's paths are once loaded: the
        // scratch configuration's paths are read against its own place.
        let dir = &match std::path::absolute(dir) {
            Ok(dir) => dir,
            Err(e) => {
                eprintln!("saguin: bench --dir {}: {e}", dir.display());
                return Err(exit::CANNOT);
            }
        };
        refuse_snapshot_dir(dir)?;
        let mut targets = Vec::new();
        for kind in ["sqlite", "memory"] {
            match dir_provider(kind, dir) {
                Ok(provider) => targets.push(Target::new(provider, Some(dir.clone()), 0)),
                Err(e) => {
                    eprintln!("saguin: bench --dir {}: {e:#}", dir.display());
                    return Err(exit::CANNOT);
                }
            }
        }
        return Ok(targets);
    }
    let path = args.config.as_ref().ok_or(exit::USAGE)?;
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(ConfigError::Invalid { problems, .. }) => {
            eprintln!(
                "saguin: configuration {} is invalid ({} problem(s)):",
                path.display(),
                problems.len()
            );
            for p in &problems {
                eprintln!("  {p}");
            }
            return Err(exit::NO);
        }
        Err(e) => {
            eprintln!("saguin: {e}");
            return Err(exit::CANNOT);
        }
    };
    let mut targets = Vec::new();
    for provider in &config.storage {
        let parent = match provider {
            Provider::Memory(m) => m
                .snapshot_dir
                .as_deref()
                .map(|d| d.parent().unwrap_or(Path::new("/")).to_path_buf()),
            Provider::Sqlite(s) => {
                Some(s.file_path.parent().unwrap_or(Path::new("/")).to_path_buf())
            }
        };
        if let Some(parent) = &parent {
            refuse_snapshot_dir(parent)?;
        }
        let channel_files = config.channels_of(provider.name()).count();
        targets.push(Target::new(provider.clone(), parent, channel_files));
    }
    if targets.is_empty() {
        eprintln!(
            "saguin: configuration {} names no storage provider: nothing to measure",
            path.display()
        );
        return Err(exit::NO);
    }
    Ok(targets)
}

/// The provider of `kind` that `--dir` measures, on the settings a
/// configuration that names only its place would give it.
fn dir_provider(kind: &str, dir: &Path) -> anyhow::Result<Provider> {
    let place = match kind {
        "sqlite" => "file_path: bench.db".to_owned(),
        _ => format!("snapshot_dir: snapshots, max_bytes: {DIR_MAX_BYTES}"),
    };
    // A configuration `serve` would take: a listener and a way in for
    // clients, though the bench serves none.
    let yaml = format!(
        "listeners: [{{name: bench, bind: \"127.0.0.1:0\"}}]\n\
         auth: {{allow_anonymous: true}}\n\
         storage:\n  - {{name: {kind}, kind: {kind}, {place}}}\n"
    );
    Config::from_yaml_str(&yaml, &dir.join("bench.yaml"))
        .map_err(|e| anyhow::anyhow!("the {kind} provider's configuration: {e}"))?
        .storage
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("the {kind} provider's configuration names no provider"))
}

/// A memory provider's snapshot directory holds the provider's own files
/// and no others: no scratch directory is made in one, live or not.
fn refuse_snapshot_dir(dir: &Path) -> Result<(), u8> {
    if !disk::is_snapshot_dir(dir) {
        return Ok(());
    }
    let holder = match lock::probe(&lock::lock_path_for_snapshot_dir(dir)) {
        Ok(LockState::Held {
            holder: Some(h), ..
        }) => format!(
            ", held by a running broker (pid {} on {} since {})",
            h.pid,
            h.host,
            h.since_rfc3339()
        ),
        Ok(LockState::Held { .. }) => ", held by a running broker".to_owned(),
        _ => String::new(),
    };
    eprintln!(
        "saguin: bench: {} is a memory provider's snapshot directory{holder}; nothing but its provider's files belongs in it: give its parent directory",
        dir.display()
    );
    Err(exit::CANNOT)
}

fn measure(target: &Target, quick: bool, progress: &Progress) -> anyhow::Result<Measured> {
    let name = target.provider.name().to_owned();
    let say = |what: &str| progress.say(&format!("{name}: {what}"));
    let scratch = match &target.parent {
        Some(parent) => {
            if !parent.exists() {
                anyhow::bail!(
                    "{} does not exist yet: `saguin serve` makes it at its first start; make it, \
                     on the file system it will be on, to measure that, or measure a directory \
                     with --dir",
                    parent.display()
                );
            }
            disk::writable(parent).with_context(|| format!("write in {}", parent.display()))?;
            Some(
                Scratch::new(parent)
                    .with_context(|| format!("make a scratch directory in {}", parent.display()))?,
            )
        }
        None => None,
    };
    let fsync = match &scratch {
        Some(s) => {
            let samples = if quick { 100 } else { 1_000 };
            say(&format!("{samples} fsyncs of 4 KiB"));
            Some(disk::fsync_latency(s.path(), samples, || progress.tick())?)
        }
        None => None,
    };
    let snapshot = match (&target.provider, &scratch) {
        (Provider::Memory(m), Some(s)) if m.snapshot_dir.is_some() => {
            let cap = if quick {
                SNAPSHOT_SAMPLE_QUICK
            } else {
                SNAPSHOT_SAMPLE
            };
            let bytes = m.max_bytes.unwrap_or(cap).min(cap);
            say(&format!("a snapshot generation of {} MiB", bytes >> 20));
            let dir = s.path().join("generation");
            Some(disk::snapshot_write(&dir, bytes, 8)?)
        }
        _ => None,
    };
    let snapshot_files = match (&snapshot, &scratch) {
        (Some(_), Some(s)) => {
            let files = target.channel_files.max(FILES_SAMPLE);
            say(&format!("a snapshot generation of {files} channel files"));
            Some(disk::snapshot_files(&s.path().join("files"), files)?)
        }
        _ => None,
    };
    let load = if quick {
        Load {
            paced_rate: 1_000.0,
            paced_for: Duration::from_secs(1),
            fast_publishers: 2,
            fast_for: Duration::from_secs(1),
            fast_max: FAST_MAX_PUBLISHES,
            payload: 128,
            channels: target.channel_files.max(1),
        }
    } else {
        Load {
            paced_rate: 5_000.0,
            paced_for: Duration::from_secs(5),
            fast_publishers: 4,
            fast_for: Duration::from_secs(5),
            fast_max: FAST_MAX_PUBLISHES,
            payload: 128,
            channels: target.channel_files.max(1),
        }
    };
    let config = scratch_config(
        &target.provider,
        scratch.as_ref().map(Scratch::path),
        load.channels,
    )?;
    let publish = publish_bench::publish_costs(&config, load, &|what| say(what)).map_err(|e| {
        anyhow::anyhow!("publishing through a broker on the provider's settings: {e}")
    })?;
    Ok(Measured {
        fsync,
        snapshot,
        snapshot_files,
        publish,
        load,
    })
}

/// A broker on the provider's own settings in `scratch`: one listener on
/// 127.0.0.1 port 0, anonymous, `channels` append channels on the
/// provider. It keeps no room (`checkpoint_room`, `snapshot_room`): the
/// room is for a file system found full, which nothing here measures, and
/// it would take up to 64 MiB more of the live data's file system.
fn scratch_config(
    provider: &Provider,
    scratch: Option<&Path>,
    channels: usize,
) -> anyhow::Result<Config> {
    let duration = |d: Duration| config::units::format_duration(d);
    let storage = match (provider, scratch) {
        (Provider::Sqlite(s), Some(dir)) => format!(
            "kind: sqlite, file_path: {}, flush_interval: {}, publish_commit_interval: {}, publish_commit_max_records: {}, read_connections: {}, checkpoint_room: 0",
            dir.join("bench.db").display(),
            duration(s.flush_interval),
            s.publish_commit_interval.map_or_else(|| "none".to_owned(), duration),
            s.publish_commit_max_records,
            s.read_connections,
        ),
        (Provider::Memory(m), Some(dir)) if m.snapshot_dir.is_some() => {
            let SnapshotSchedule { debounce, max_delay } = m.snapshots;
            let or_none = |d: Option<Duration>| d.map_or_else(|| "none".to_owned(), duration);
            format!(
                "kind: memory, snapshot_dir: {}, snapshot_debounce: {}, snapshot_max_delay: {}, snapshot_room: 0",
                dir.join("snapshots").display(),
                or_none(debounce),
                or_none(max_delay)
            )
        }
        _ => "kind: memory".to_owned(),
    };
    let name = provider.name();
    let mut yaml = format!(
        "listeners:\n  - {{name: bench, bind: \"127.0.0.1:0\"}}\n\
         auth: {{allow_anonymous: true}}\n\
         storage:\n  - {{name: {name}, {storage}}}\n\
         channels:\n"
    );
    for i in 0..channels.max(1) {
        yaml.push_str(&format!(
            "  - {{name: {}, kind: append, storage: {name}}}\n",
            channel_name(i)
        ));
    }
    let origin = scratch.map_or_else(|| PathBuf::from("bench.yaml"), |d| d.join("bench.yaml"));
    Config::from_yaml_str(&yaml, &origin)
        .map_err(|e| anyhow::anyhow!("the scratch configuration: {e}"))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// What the figures mean for the provider's settings.
struct Means {
    power_cut_loss: Option<Duration>,
    crash_loss: Option<Duration>,
    full_shutdown: Option<Duration>,
    shutdown_fits: Option<bool>,
    /// The bytes a full memory provider is figured with: its max_bytes,
    /// or 256 MiB where it has none.
    full_bytes: Option<u64>,
    /// A sqlite provider's file system against what it may take.
    file_system: Option<Capacity>,
}

fn means(target: &Target, m: &Measured, timeout_stop: Duration) -> Means {
    match &target.provider {
        Provider::Sqlite(s) => Means {
            // What a power cut can take: the commits since the last flush,
            // and the flush's own fsync.
            power_cut_loss: Some(
                s.flush_interval
                    + m.fsync
                        .as_ref()
                        .map_or(Duration::ZERO, |f| f.quantile(0.99)),
            ),
            crash_loss: Some(Duration::ZERO),
            full_shutdown: None,
            shutdown_fits: None,
            full_bytes: None,
            file_system: Capacity::of(
                &s.file_path,
                s.max_bytes,
                s.checkpoint_room,
                WAL_RESTART_BYTES,
            ),
        },
        Provider::Memory(mem) => {
            let bound = mem.max_bytes.unwrap_or(DIR_MAX_BYTES);
            // Its bytes at the measured rate, and its channels' files at
            // what each cost apart from its bytes.
            let files = m
                .snapshot_files
                .map_or(Duration::ZERO, |f| f.files_take(target.channel_files));
            let full_write = m
                .snapshot
                .map(|w| Duration::from_secs_f64(bound as f64 / w.rate()) + files);
            let crash_loss = match (mem.snapshot_dir.is_some(), mem.snapshots.max_delay) {
                (true, Some(max_delay)) => full_write.map(|w| max_delay + w),
                _ => None,
            };
            let full_shutdown = full_write.map(|w| DRAIN + w);
            Means {
                power_cut_loss: crash_loss,
                crash_loss,
                full_shutdown,
                shutdown_fits: full_shutdown.map(|s| s <= timeout_stop),
                full_bytes: full_write.map(|_| bound),
                file_system: None,
            }
        }
    }
}

fn target_json(target: &Target, m: &Measured, timeout_stop: Duration) -> Value {
    let means = means(target, m, timeout_stop);
    let p = &m.publish;
    json!({
        "provider": target.provider.name(),
        "kind": target.provider.kind_name(),
        "dir": target.parent.as_ref().map(|d| d.display().to_string()),
        "memory_backed": target.file_system.and_then(Unkept::in_memory),
        "over_network": target.file_system.and_then(Unkept::over_network),
        "fsync": m.fsync.as_ref().map(|f| json!({
            "samples": f.len(),
            "p50_ms": ms(f.quantile(0.5)),
            "p99_ms": ms(f.quantile(0.99)),
            "max_ms": ms(f.max()),
        })),
        "snapshot": m.snapshot.map(|w| json!({
            "accounted_bytes": w.accounted_bytes,
            "file_bytes": w.file_bytes,
            "seconds": w.elapsed.as_secs_f64(),
            "bytes_per_second": w.rate().round(),
        })),
        "channel_files": target.channel_files,
        "ext4_without_journal": target.without_journal,
        "snapshot_files": m.snapshot_files.map(|f| json!({
            "files": f.files,
            "seconds": f.elapsed.as_secs_f64(),
            "per_file_ms": ms(f.per_file()),
            "cpu_per_file_ms": ms(f.cpu_per_file()),
        })),
        "publish": {
            "payload_bytes": m.load.payload,
            "channels": m.load.channels,
            "paced_rate": m.load.paced_rate,
            "paced_count": p.paced.len(),
            "puback_p50_ms": ms(p.paced.quantile(0.5)),
            "puback_p99_ms": ms(p.paced.quantile(0.99)),
            "puback_max_ms": ms(p.paced.max()),
            "fast_acknowledged": p.fast_acknowledged,
            "fast_seconds": p.fast_elapsed.as_secs_f64(),
            "sustained_per_second": p.sustained.round(),
        },
        "means": {
            "power_cut_loss_ms": means.power_cut_loss.map(ms),
            "crash_loss_ms": means.crash_loss.map(ms),
            "full_shutdown_seconds": means.full_shutdown.map(|d| d.as_secs_f64()),
            "shutdown_fits": means.shutdown_fits,
            "full_bytes": means.full_bytes,
            "file_system": means.file_system.map(|c| json!({
                "free_bytes": c.free_bytes,
                "held_bytes": c.held_bytes,
                "needs_bytes": c.needs_bytes,
                "fits": c.fits(),
            })),
            "sustained_per_second": p.sustained.round(),
        },
    })
}

fn print_human(results: &[(&Target, Measured)], timeout_stop: Duration) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut t = table();
    t.set_header(vec![
        "provider",
        "fsync p50 / p99 / max",
        "snapshot write",
        "PUBACK p50 / p99 (paced)",
        "sustained",
    ]);
    for (target, m) in results {
        let p = &m.publish;
        t.add_row(vec![
            format!(
                "{} ({})",
                target.provider.name(),
                target.provider.kind_name()
            ),
            m.fsync.as_ref().map_or_else(
                || "-".to_owned(),
                |f| {
                    format!(
                        "{:.2} / {:.2} / {:.2} ms",
                        ms(f.quantile(0.5)),
                        ms(f.quantile(0.99)),
                        ms(f.max())
                    )
                },
            ),
            m.snapshot.map_or_else(
                || "-".to_owned(),
                |w| {
                    let per_file = m.snapshot_files.map_or_else(String::new, |f| {
                        format!(", {:.2} ms a file", ms(f.per_file()))
                    });
                    format!("{:.0} MiB/s{per_file}", w.rate() / (1 << 20) as f64)
                },
            ),
            format!(
                "{:.2} / {:.2} ms at {:.0}/s",
                ms(p.paced.quantile(0.5)),
                ms(p.paced.quantile(0.99)),
                m.load.paced_rate
            ),
            format!(
                "{} publishes/s{}",
                grouped(p.sustained.round() as u64),
                match m.load.channels {
                    1 => String::new(),
                    n => format!(" over {} channels", grouped(n as u64)),
                }
            ),
        ]);
    }
    writeln!(out, "{t}")?;
    for (target, m) in results {
        let means = means(target, m, timeout_stop);
        let name = target.provider.name();
        let sustained = grouped(m.publish.sustained.round() as u64);
        let warning = target
            .file_system
            .zip(target.parent.as_deref())
            .and_then(|(u, dir)| {
                u.warning(dir, name, matches!(target.provider, Provider::Sqlite(_)))
            });
        if let Some(warning) = warning {
            writeln!(out, "{name}: {warning}")?;
        }
        match &target.provider {
            Provider::Sqlite(s) => {
                writeln!(
                    out,
                    "{name}: a crash loses nothing acknowledged; a power cut loses up to about {:.0} ms of commits (flush_interval {} and an fsync at p99); {} QoS 1 publishes a second sustained",
                    means.power_cut_loss.map_or(0.0, ms),
                    config::units::format_duration(s.flush_interval),
                    sustained
                )?;
                if let Some(c) = means.file_system {
                    let mib = |b: u64| b as f64 / f64::from(1 << 20);
                    writeln!(
                        out,
                        "{name}: its file system has {:.0} MiB free and its files hold {:.0} MiB, for the {:.0} MiB it may take ({}, the write-ahead log's {:.0} MiB at most and the checkpoint's room of {:.0} MiB): {}",
                        mib(c.free_bytes),
                        mib(c.held_bytes),
                        mib(c.needs_bytes),
                        s.max_bytes.map_or_else(|| "what it holds, unbounded".to_owned(), |m| format!("max_bytes {:.0} MiB", mib(m))),
                        mib(Capacity::log_at_most(WAL_RESTART_BYTES)),
                        mib(s.checkpoint_room),
                        if c.fits() {
                            "it fits".to_owned()
                        } else {
                            format!("SHORT by {:.0} MiB: it runs out of room before its bound", mib(c.needs_bytes - c.free_bytes - c.held_bytes))
                        }
                    )?;
                }
            }
            Provider::Memory(mem) if mem.snapshot_dir.is_none() => writeln!(
                out,
                "{name}: keeps nothing (no snapshot_dir): everything is lost at every stop; {sustained} QoS 1 publishes a second sustained",
            )?,
            Provider::Memory(mem) => {
                let bound = mem.max_bytes.unwrap_or(DIR_MAX_BYTES);
                let bytes = match mem.max_bytes {
                    Some(_) => format!("{} MiB", bound >> 20),
                    None => format!("{} MiB, as it has no max_bytes", bound >> 20),
                };
                let full = match target.channel_files {
                    0 => bytes,
                    1 => format!("its channel's file and {bytes}"),
                    n => format!("its {} channels' files and {bytes}", grouped(n as u64)),
                };
                match means.crash_loss {
                    Some(loss) => writeln!(
                        out,
                        "{name}: a crash or power cut loses up to {:.1} s (snapshot_max_delay and the write of a full provider: {full})",
                        loss.as_secs_f64(),
                    )?,
                    None => writeln!(
                        out,
                        "{name}: written only at a graceful stop: a crash or power cut loses everything since the last one"
                    )?,
                }
                if let Some(f) = m.snapshot_files {
                    // What a planner adds channels by: a generation writes
                    // a file for each that changed, however small; and what
                    // of that is a CPU's.
                    let channels = target.channel_files.max(FILES_SAMPLE);
                    writeln!(
                        out,
                        "{name}: each channel adds about {:.2} ms to a generation that changes it, {:.2} ms of it CPU ({} channels: {:.1} s, {:.1} s of CPU)",
                        ms(f.per_file()),
                        ms(f.cpu_per_file()),
                        grouped(channels as u64),
                        f.files_take(channels).as_secs_f64(),
                        f.files_cpu(channels).as_secs_f64()
                    )?;
                    if target.without_journal == Some(true) {
                        writeln!(
                            out,
                            "{name}: its snapshot directory is on ext4 without a journal, where making a file passes over every inode removed in the last minute: generations there keep the files they replace as spares (saguin.<n>.spare, emptied when over 4 KiB) and make their files from them"
                        )?;
                    }
                }
                if let (Some(stop), Some(fits)) = (means.full_shutdown, means.shutdown_fits) {
                    writeln!(
                        out,
                        "{name}: a graceful stop of a full provider takes about {:.1} s (the 5 s drain, then the write of {full}), {} the stop timeout of {} s{}; {} QoS 1 publishes a second sustained",
                        stop.as_secs_f64(),
                        if fits { "within" } else { "PAST" },
                        timeout_stop.as_secs(),
                        if fits { "" } else { ": raise TimeoutStopSec or lower max_bytes, or the supervisor kills it mid-write" },
                        sustained
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// A progress line on a terminal, nothing when piped or for --json.
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(json: bool) -> Progress {
        Progress((!json && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {elapsed} {wide_msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        }))
    }

    fn say(&self, what: &str) {
        if let Some(b) = &self.0 {
            b.set_message(what.to_owned());
        }
    }

    fn tick(&self) {
        if let Some(b) = &self.0 {
            b.tick();
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scratch broker runs on the provider's settings, but keeps no
    /// room on the live data's file system, and serves the channels asked.
    #[test]
    fn a_scratch_configuration_keeps_the_providers_settings_and_no_room() {
        let d = tempfile::tempdir().unwrap();
        let yaml = format!(
            "listeners: [{{name: mqtt, bind: \"127.0.0.1:0\"}}]\n\
             auth: {{allow_anonymous: true}}\n\
             storage:\n  - {{name: db, kind: sqlite, file_path: {}, flush_interval: 40ms, checkpoint_room: 128MiB}}\n\
             \x20 - {{name: mem, kind: memory, snapshot_dir: {}, snapshot_max_delay: 3s, snapshot_room: 32MiB}}\n",
            d.path().join("saguin.db").display(),
            d.path().join("snapshots").display()
        );
        let config = Config::from_yaml_str(&yaml, &d.path().join("saguin.yaml")).unwrap();
        for provider in &config.storage {
            let scratch = scratch_config(provider, Some(d.path()), 3).unwrap();
            assert_eq!(scratch.channels.len(), 3);
            match (&scratch.storage[..], provider) {
                ([Provider::Sqlite(s)], Provider::Sqlite(_)) => {
                    assert_eq!(s.flush_interval, Duration::from_millis(40));
                    assert_eq!(s.checkpoint_room, 0);
                }
                ([Provider::Memory(m)], Provider::Memory(_)) => {
                    assert_eq!(m.snapshots.max_delay, Some(Duration::from_secs(3)));
                    assert_eq!(m.snapshot_room, 0);
                }
                (other, _) => panic!("the scratch of {} is {other:?}", provider.name()),
            }
        }
    }
}
