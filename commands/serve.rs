//! `saguin serve`: run the broker.

use std::net::SocketAddr;
use std::path::PathBuf;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use saguin::broker::auth_files::AuthFiles;
use saguin::broker::logfmt::Logfmt;
use saguin::broker::notify::{Notifier, Watchdog};
use saguin::broker::providers::{Providers, ShutdownStatus};
use saguin::broker::{retention, server};
use saguin::config::{ChannelLines, Config, ConfigError, LogFormat, LogLevel};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::exit;

/// Serve MQTT on the configured listeners until SIGTERM or SIGINT; SIGHUP
/// reloads the password and ACL files.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP, after_long_help = AFTER_LONG_HELP)]
pub struct Args {
    /// The configuration file (YAML). Without it: one listener on
    /// 127.0.0.1:1883, anonymous, everything in memory, nothing kept.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Serve the embedded default on this address (IP:PORT, e.g.
    /// 0.0.0.0:1884; port 0 lets the system choose) instead of
    /// 127.0.0.1:1883. Only without --config: a configuration file names
    /// its own listeners, and the flag is refused rather than merged.
    #[arg(long, value_name = "ADDR", conflicts_with = "config")]
    pub bind: Option<SocketAddr>,
}

const AFTER_HELP: &str = "\
Exit status: 0 stopped by SIGTERM or SIGINT with everything written, 1 the \
configuration is invalid, 2 usage error, 3 the broker could not start, a \
snapshot file could not be written at the stop, or a provider failed while \
serving (what its disk did not write may be lost).

Examples:
  saguin serve
  saguin serve --config /etc/saguin/saguin.yaml";

const AFTER_LONG_HELP: &str = "\
What is served: broadcast topics, with retained messages and sessions kept \
in the providers broker.retained_storage and broker.session_storage name, \
and channels of every kind - append, latest and queue (with its \
dead-letter channel <queue>.dlq) - each in the provider its storage names. \
A setting this build accepts but does not serve would be refused before \
anything is opened, naming it by YAML path, and `saguin check-config` \
reports the same settings and exits 1; this build has none.

Startup: every storage provider a channel, broker.retained_storage or \
broker.session_storage names is locked (a provider another live broker \
holds is refused at once, naming the provider, the lock file and its \
holder's pid, host and start), opened and recovered before any listener is \
bound. A memory provider loads its snapshot_dir's current generation with \
the checks `saguin snapshot verify` makes, each file held to eight times the provider's \
max_bytes (at least 64 MiB; 4 GiB when unbounded); sqlite checks its schema \
version. Both drop the positions of consumers whose session expired while \
the broker was down, logging how many per channel. Then each append channel \
is opened in its provider (one stored there as another kind stops the \
start, naming the channel and the provider) and its max_bytes set. A \
damaged, truncated or foreign-version file stops the start naming it, and \
nothing is bound. What each provider keeps, its durability and what its \
bound came to are logged once, then one `channel` line per channel: its \
provider and durability, records, next, floor, bytes, max_bytes, \
retention_bytes and retention_age.

Retention: while serving, the channels with a retention_bytes are swept \
every second (a channel under its bound is settled from the byte count it \
keeps, reading nothing) and those with a retention_age every tenth of the \
shortest retention_age, never more often than every second; a record with \
no timestamp is never too old. Each sweep removes from the oldest record \
and raises the channel's floor in the same write.

Append channels: a PUBLISH whose topic's first level names an append \
channel is a record at the channel's next offset, PUBACKed once committed \
(PUBREC once held, PUBCOMP once written for QoS 2); a record that would \
cross max_bytes is refused with 0x97, a failed write with 0x83 (an MQTT \
3.1.1 publisher is disconnected instead). A SUBSCRIBE to a filter whose \
first level is the channel's name makes the session a consumer: it \
resumes at its stored position, else at next, unless the MQTT 5 User \
Property saguin-from says earliest, an offset or an RFC 3339 time. Each \
delivery carries the User Property saguin-offset, and the first after \
records retention removed carries saguin-gap: FROM-TO; an MQTT 3.1.1 \
consumer, which has no properties, gets each message as it was published \
(its gaps are still counted in saguin_consumer_gap_total). $share/G/<channel>/# \
is one group with one place in the channel, each record to one member.

Disk faults: a sqlite provider whose file system has no room when the \
broker starts stops the start (exit 3), naming the lack of room: opening \
writes the write-ahead log's index; a supervisor restarting it brings the \
broker up once there is room. One whose file system has no room (ENOSPC, \
EDQUOT, the file size limit) refuses the writes that need room with 0x83 - \
not 0x97, which is kept for a configured max_bytes - and takes them again \
by itself the moment there is room, with no restart. An I/O error, a failed \
fsync or a read-only file system fails the provider instead: every write to \
it is refused with 0x83 until the broker is restarted (SQLite's recovery \
runs at the open), because after a failed fsync the disk may hold less than \
a later fsync claims; reads, consumers and acknowledgements of what is \
stored go on where the disk still reads. An MQTT 3.1.1 publisher is \
disconnected without an acknowledgement in either case. Other providers, \
their channels and broadcast topics are not affected, and the broker never \
exits over a fault. Each change of a provider's health is logged once \
(\"no space left for the storage provider\", \"has room again\", \"storage \
provider failed\"), never once per write, and shown in /metrics as \
saguin_provider_no_space and saguin_provider_failed; every failed operation \
counts in saguin_storage_errors_total{provider,kind}, kind one of full, \
no_space, io, read_only, fsync, snapshot, other. Commits acknowledged within \
the last flush_interval that a failing disk never wrote are lost as on a \
power cut.

Snapshots: a memory provider's snapshot_dir holds one generation at every \
instant - its state at one moment - and the startup line of the load \
names the generation and how old it is. While serving, a generation is \
written snapshot_debounce (250ms) after the provider goes quiet and at \
most snapshot_max_delay (2s) after its first change, so a kill -9, an OOM \
kill or a power cut loses what changed in the last snapshot_max_delay and \
the time one generation takes to write; both none writes only at the stop. \
The broker's loop copies the changed stores' state (their counters and \
positions, and handles on their records: no record is copied) and a \
thread of the provider's own writes it: only the channels, retained store \
and sessions that changed since the last generation, each under a name no \
generation used before, then the manifest that commits them. A file that \
cannot be written (a full disk, a permission, an I/O error) leaves its \
previous generation's file listed, is logged once when it starts failing \
and once when it is written again, counts in \
saguin_storage_errors_total{kind=\"snapshot\"}, and is tried again at the \
next generation, no sooner than snapshot_max_delay (at least a second) \
later; the broker serves on. saguin_snapshot_generation, \
saguin_snapshot_age_seconds, saguin_snapshot_capture_seconds and \
saguin_snapshot_write_seconds say how it goes, and \
saguin_snapshot_unsaved_seconds what a crash now would lose. To copy a snapshot_dir \
while the broker runs, copy it (cp -r, rsync, tar) and run `saguin \
snapshot verify` on the copy: exit 0 means one whole generation, exit 1 \
means a generation committed during the copy, which is then refused \
naming the file; copy again. A file-system snapshot needs no check.

Stopping: at SIGTERM or SIGINT the broker stops accepting and retention \
stops, then finishes the snapshot generation being written and writes each \
memory provider's last one (whatever changed since the one before: each \
file to a temporary name, a few at a time; all of them made durable \
together, then renamed; the directory fsynced; the manifest last), checkpoints and closes each \
sqlite provider, and lets every lock go, logging each file written and \
each failure by name and the total time. A further signal meanwhile logs \
what is still being written.

Reloading: at SIGHUP (systemctl reload) the files auth.password_file and \
auth.acl_file name are read again, as Mosquitto does, and put in force \
together: the next CONNECT is checked against the new password file, and \
every publish, subscription and delivery after it against the new ACL; \
clients already connected stay connected. A file that cannot be read or \
parsed (or a password file left without users where allow_anonymous is \
false) keeps both files in force as they were, and each problem is logged \
by file and line. No other key is re-read: listeners, TLS material, \
storage and limits change only with a restart. Without either file a \
SIGHUP is logged and changes nothing.

Under systemd: with NOTIFY_SOCKET set, serve sends STATUS= lines while it \
starts and stops (the files still being written), READY=1 once every \
provider is recovered and every listener bound, STOPPING=1 at the first \
SIGTERM or SIGINT, and, when WATCHDOG_USEC is set, WATCHDOG=1 every half \
of it from the broker's own loop, so a wedged broker is restarted. \
NOTIFY_SOCKET is a socket path or, starting with '@', an abstract socket \
name; one that cannot be used is logged and the broker serves without \
it. A hardened unit file is fixtures/systemd/saguin.service.

Health: with metrics.bind set, the metrics listener answers GET /metrics \
(Prometheus text), GET /healthz - 200 while the broker's loop has turned \
within the last 10 s, 503 once it has not (it turns at least every 500 ms \
when idle, so a wedged loop, which a restart mends) - and GET /readyz - \
200 once every provider is recovered and every listener bound, 503 before, \
while stopping, and while a provider has failed, each provider named on a \
line of its own with its state. saguin status reads all three. For \
Kubernetes: liveness on /healthz, readiness on /readyz (docs/operations.md).";

pub fn run(args: Args) -> anyhow::Result<u8> {
    let config = match &args.config {
        None => match args.bind {
            Some(bind) => Config::embedded_default_on(bind),
            None => Config::embedded_default(),
        },
        Some(path) => match Config::load(path) {
            Ok(config) => config,
            Err(ConfigError::Invalid { origin, problems }) => {
                let origin = origin
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "(embedded default)".into());
                eprintln!(
                    "saguin: configuration {origin} is invalid ({} problem(s)):",
                    problems.len()
                );
                for problem in &problems {
                    eprintln!("  {problem}");
                }
                return Ok(exit::NO);
            }
            Err(err) => return Err(err).context("load the configuration"),
        },
    };
    init_logging(&config);
    // Reading the configuration held every event of its YAML at once:
    // about 26 MB of pages touched for 10,000 channels, all freed by now.
    // Given back before the start builds its stores among them, where
    // the broker then held 3-5 MB more for as long as it ran.
    crate::release_free_memory();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("saguin")
        .on_thread_park(worker_going_idle)
        .build()
        .context("start the async runtime")?;
    runtime.block_on(serve(config))
}

/// How often at most a worker going idle gives back what it freed.
const IDLE_RELEASE_EVERY: Duration = Duration::from_millis(100);

/// A worker with nothing to run gives the pages freed since it last looked
/// back to the system, at most once every [`IDLE_RELEASE_EVERY`] (a
/// collection takes about 0.4 µs, measured with a heap of 2 GB). mimalloc
/// returns a thread's empty pages only when that thread allocates or
/// collects, and blocks freed by other threads wait for their owner to
/// look: when the connections of a burst of devices go quiet and park
/// (their tasks, states and socket registrations freed on whichever
/// worker ran them last), the workers that allocated them are idle and
/// look no more, so the memory stayed resident (1,490 B a parked
/// connection at 10,000 against about 880 B with this; once a second
/// left the last 1 s of parks resident, 1,255 B at 5,000 against about
/// 930 B).
fn worker_going_idle() {
    thread_local! {
        static RELEASED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }
    RELEASED.with(|released| {
        let now = Instant::now();
        if released
            .get()
            .is_none_or(|at| now.duration_since(at) >= IDLE_RELEASE_EVERY)
        {
            released.set(Some(now));
            crate::release_free_memory();
        }
    });
}

async fn serve(config: Config) -> anyhow::Result<u8> {
    let origin = config
        .origin
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "embedded default".into());
    tracing::info!(version = env!("CARGO_PKG_VERSION"), config = %origin, "starting");
    let signals = Signals::install().context("install the SIGTERM and SIGINT handlers")?;
    // Caught from the start: a SIGHUP while starting is answered once the
    // broker serves, never by the default disposition killing it.
    let hangup = signal(SignalKind::hangup()).context("install the SIGHUP handler")?;
    let supervisor = supervisor_from_env();
    let unserved = config.unserved();
    if !unserved.is_empty() {
        // Invariant 14: durability is stated only where it is provided. A
        // broker that accepted these settings would announce a durability
        // it does not deliver, so it refuses them by name instead.
        for item in &unserved {
            tracing::error!(path = %item.path, "{}", item.reason);
        }
        eprintln!(
            "saguin: this build does not serve the settings above; remove them to serve this \
             configuration."
        );
        return Ok(exit::CANNOT);
    }
    tell(
        &supervisor,
        "locking, opening and recovering the storage providers",
    );
    let providers = match open_providers(&config) {
        Ok(providers) => providers,
        Err(code) => return Ok(code),
    };
    if !config.keeps_anything() {
        tracing::warn!("nothing is kept: channels, retained messages, sessions and queued messages live in memory only and are lost when the broker stops");
    }
    let (stated, channel_lines) = config.durability_at_start();
    for line in stated {
        tracing::info!(detail = %line, "durability");
    }
    // Made only when logged: ten thousand sentences left in the allocator
    // as the broker starts serving are MiBs of its resident set.
    if channel_lines == ChannelLines::ByProvider && tracing::enabled!(tracing::Level::DEBUG) {
        for line in config.channel_durability() {
            tracing::debug!(detail = %line, "durability");
        }
    }
    for problem in config.unkept_providers() {
        tracing::warn!(path = %problem.path, "{}", problem.message);
    }
    providers.log_startup();
    tell(
        &supervisor,
        "restoring the broker state and binding the listeners",
    );
    let mut server = match server::prepare(
        &config,
        providers.sessions(),
        providers.retained(),
        providers.channels(),
        tokio::task::block_in_place(|| providers.last_recorded_time()),
    )
    .await
    {
        Ok(server) => server,
        Err(err) => {
            tracing::error!(error = %err, "cannot start");
            eprintln!("saguin: {err}");
            // Nothing was served, so nothing changed: the providers close
            // and let their locks go without rewriting a snapshot.
            drop(providers);
            return Ok(exit::CANNOT);
        }
    };
    // The state is built: what restoring it freed goes back now, not at
    // whatever later moment the allocator would purge it.
    crate::release_free_memory();
    server.snapshots = saguin::broker::snapshots::Snapshots::new(
        &providers.snapshot_writers(),
        tokio::time::Instant::now(),
    );
    for writer in providers.snapshot_writers() {
        writer.report_to(server.metrics.clone());
    }
    let retention = retention::spawn(
        providers.channels(),
        server.metrics.clone(),
        server.readers.answers(),
    );
    if let Some(supervisor) = &supervisor {
        server.watchdog = match Watchdog::from_env(supervisor.clone()) {
            Ok(watchdog) => watchdog,
            Err(err) => {
                tracing::warn!(error = %err, "the supervisor's watchdog is not kept");
                None
            }
        };
        if let Some(watchdog) = &server.watchdog {
            tracing::info!(
                every_ms = watchdog.interval().as_millis() as u64,
                "pinging the supervisor's watchdog from the broker task"
            );
        }
        // Every provider is recovered and every listener bound: only now.
        supervisor.ready(&format!(
            "serving on {} listener(s)",
            server.listeners.len()
        ));
    }
    tokio::spawn(reload_at_hangup(hangup, server.auth.clone()));
    let status = ShutdownStatus::reporting_to(supervisor.clone());
    let shutdown = first_signal_then_watch(signals, status.clone(), supervisor.clone());
    let served = server::run(server, shutdown).await;
    // No sweep may write into a provider that is closing: the one running
    // finishes, and no other starts.
    retention.stop().await;
    if let Err(err) = &served {
        eprintln!("saguin: {err}");
        if let Some(supervisor) = &supervisor {
            supervisor.stopping(&format!("stopping after a failure: {err}"));
        }
    }
    // Even after a failure while serving, what the providers hold is what
    // clients were told is stored: write it out and let the locks go.
    let closed = close_providers(providers, &status);
    if closed && served.is_ok() {
        Ok(exit::OK)
    } else {
        Ok(exit::CANNOT)
    }
}

/// The supervisor `NOTIFY_SOCKET` names, if any. One that cannot be used
/// is logged and the broker serves without it (the supervisor then acts on
/// the READY=1 it never gets).
fn supervisor_from_env() -> Option<Arc<Notifier>> {
    match Notifier::from_env() {
        Ok(Some(notifier)) => {
            tracing::info!(
                socket = %std::env::var(saguin::broker::notify::NOTIFY_SOCKET).unwrap_or_default(),
                "notifying the supervisor"
            );
            Some(notifier)
        }
        Ok(None) => None,
        Err(err) => {
            tracing::warn!(error = %err, "cannot notify the supervisor");
            None
        }
    }
}

/// A STATUS= line for the supervisor, where there is one.
fn tell(supervisor: &Option<Arc<Notifier>>, status: &str) {
    if let Some(supervisor) = supervisor {
        supervisor.status(status);
    }
}

/// Opens, locks and recovers the providers (blocking, before any listener
/// is bound), or says why not: the exit code is then the answer.
fn open_providers(config: &Config) -> Result<Providers, u8> {
    tokio::task::block_in_place(|| Providers::open(config)).map_err(|err| {
        tracing::error!(error = %err, "cannot start");
        eprintln!("saguin: {err}");
        exit::CANNOT
    })
}

/// Writes the snapshots, closes the providers and lets their locks go
/// (blocking). True when everything was written.
fn close_providers(providers: Providers, status: &ShutdownStatus) -> bool {
    let report = tokio::task::block_in_place(|| providers.close(status));
    for failure in &report.failures {
        eprintln!("saguin: {failure}");
    }
    report.is_complete()
}

/// SIGTERM and SIGINT, caught from before the first listener is bound: a
/// signal that arrives while the broker is starting is a request to stop
/// gracefully, never the default disposition killing it mid-start.
struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGTERM or SIGINT, by name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// The first SIGTERM or SIGINT; from then on every further one is answered
/// with what the shutdown is still doing, so an operator waiting on a long
/// snapshot write can see it is not stuck.
async fn first_signal_then_watch(
    mut signals: Signals,
    status: ShutdownStatus,
    supervisor: Option<Arc<Notifier>>,
) {
    let name = signals.next().await;
    tracing::info!(signal = name, "signal received");
    if let Some(supervisor) = &supervisor {
        supervisor.stopping(&format!("{name} received: stopping"));
    }
    status.set("stopping the broker: closing connections and handing state to the providers");
    tokio::spawn(async move {
        loop {
            let name = signals.next().await;
            tracing::warn!(signal = name, still = %status.get(), "shutting down; still writing");
        }
    });
}

/// At each SIGHUP, re-read the password and ACL files the configuration
/// names and put them in force together; a file that cannot be read or
/// parsed keeps the ones in force, and the log says why. No other key is
/// re-read.
async fn reload_at_hangup(mut hangup: Signal, auth: AuthFiles) {
    while hangup.recv().await.is_some() {
        if auth.is_empty() {
            tracing::info!(
                signal = "SIGHUP",
                "signal received; no password_file or acl_file is configured, so there is nothing to reload (other settings need a restart)"
            );
            continue;
        }
        tracing::info!(
            signal = "SIGHUP",
            "signal received; reloading the password and ACL files"
        );
        let files = auth.clone();
        match tokio::task::spawn_blocking(move || files.reload()).await {
            Ok(Ok(reloaded)) => {
                for (kind, file) in [
                    ("password_file", &reloaded.passwords),
                    ("acl_file", &reloaded.acl),
                ] {
                    if let Some(file) = file {
                        tracing::info!(key = kind, file = %file.path.display(), entries = file.entries,
                            sha256 = %file.sha256, changed = file.changed, "reloaded");
                    }
                }
            }
            Ok(Err(problems)) => {
                for problem in &problems {
                    tracing::error!(problem = %problem, "cannot reload");
                }
                tracing::error!(
                    problems = problems.len(),
                    "reload refused; the password and ACL files loaded before stay in force"
                );
            }
            Err(err) => {
                tracing::error!(error = %err, "reload failed; the files loaded before stay in force")
            }
        }
    }
}

fn init_logging(config: &Config) {
    let level = match config.log.level {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace => "trace",
    };
    // Payload-free by construction; RUST_LOG may narrow or widen it.
    // rustls warns from its message parser, once per connection, about an
    // IP address in a ClientHello's SNI (OpenSSL clients connecting by IP
    // send one); the handshake goes on without it, so that is not news.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{level},rustls=warn,rustls::msgs::handshake=error"
        ))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.log.format {
        LogFormat::Logfmt => builder.event_format(Logfmt).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}
