//! `saguin serve`: run the broker.

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
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    let config = match &args.config {
        None => Config::embedded_default(),
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
    let unserved = unserved_storage(&config);
    if !unserved.is_empty() {
        // Invariant 14: durability is stated only where it is provided. A
        // broker that accepted these settings would announce a durability
        // it does not deliver, so it refuses them by name instead.
        for (path, what) in &unserved {
            tracing::error!(path = %path, "{what}");
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
    let memory =
        |name: &str| -> anyhow::Result<std::sync::Arc<dyn saguin::storage::contract::Provider>> {
            let provider = saguin::storage::memory::MemoryProvider::new(
                saguin::storage::memory::MemoryConfig {
                    name: name.to_owned(),
                    max_bytes: None,
                    reserve: saguin::storage::contract::reserve_for(
                        config.limits.max_message_size,
                        config.limits.max_header_bytes,
                    ),
                },
            )?;
            Ok(provider)
        };
    let sessions = memory("sessions (memory, not kept)")?;
    let retained = memory("retained (memory, not kept)")?;
    let server = match server::prepare(&config, sessions, retained).await {
        Ok(server) => server,
        Err(err) => {
            tracing::error!(error = %err, "cannot start");
            eprintln!("saguin: {err}");
            return Ok(exit::CANNOT);
        }
    };
    if let Err(err) = server::run(server, shutdown_signal()).await {
        eprintln!("saguin: {err}");
        return Ok(exit::CANNOT);
    }
    Ok(exit::OK)
}

/// The settings that ask the broker to keep something in a storage
/// provider, which this build does not do yet: each with its YAML path.
fn unserved_storage(config: &Config) -> Vec<(String, &'static str)> {
    let mut unserved: Vec<(String, &'static str)> = config
        .channels
        .iter()
        .enumerate()
        .map(|(i, channel)| {
            (
                format!("channels[{i}] ({})", channel.name),
                "channels are not served by this build",
            )
        })
        .collect();
    if config.broker.retained_storage.is_some() {
        unserved.push((
            "broker.retained_storage".into(),
            "retained messages are not kept in a provider by this build",
        ));
    }
    if config.broker.session_storage.is_some() {
        unserved.push((
            "broker.session_storage".into(),
            "persistent sessions are not kept in a provider by this build",
        ));
    }
    unserved
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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},rustls=warn")));
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
