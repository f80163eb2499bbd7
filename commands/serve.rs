//! `saguin serve`: run the broker.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use saguin::broker::logfmt::Logfmt;
use saguin::broker::server;
use saguin::config::{Config, ConfigError, LogFormat, LogLevel};

use crate::exit;

/// Serve MQTT on the configured listeners until SIGTERM or SIGINT.
#[derive(clap::Args, Debug)]
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("saguin")
        .build()
        .context("start the async runtime")?;
    runtime.block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<u8> {
    let origin = config
        .origin
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "embedded default".into());
    tracing::info!(version = env!("CARGO_PKG_VERSION"), config = %origin, "starting");
    let unserved = config.unserved();
    if !unserved.is_empty() {
        // Invariant 14: durability is stated only where it is provided. A
        // broker that accepted these settings would announce a durability
        // it does not deliver, so it refuses them by name instead.
        for item in &unserved {
            tracing::error!(path = %item.path, "{}", item.reason);
        }
        eprintln!(
            "saguin: this build serves broadcast topics, with retained messages and sessions in memory; \
             it does not yet keep channels, retained messages or sessions in a storage provider. \
             Remove the settings above to serve without them."
        );
        return Ok(exit::CANNOT);
    }
    if !config.keeps_anything() {
        tracing::warn!("nothing is kept: retained messages, sessions and queued messages live in memory only and are lost when the broker stops");
    }
    for line in config.durability_summary() {
        tracing::info!(detail = %line, "durability");
    }
    let server = match server::prepare(&config).await {
        Ok(server) => server,
        Err(err) => {
            tracing::error!(error = %err, "cannot start");
            eprintln!("saguin: {err}");
            return Ok(exit::CANNOT);
        }
    };
    server::run(server, shutdown_signal()).await;
    Ok(exit::OK)
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!(signal = "SIGINT", "signal received"),
        _ = term => tracing::info!(signal = "SIGTERM", "signal received"),
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
