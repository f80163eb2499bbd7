//! The `saguin` binary: the clap tree and one module per subcommand. Thin:
//! every command calls into the library.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The broker's heap holds a memory channel's records, millions of small
/// allocations made and freed on whichever thread runs the state: glibc's
/// per-thread arenas grow such a heap a page range at a time and take their
/// slowest path once it is large (see docs/benchmarks.md).
///
/// mimalloc, built without transparent huge pages (`no_thp` in Cargo.toml),
/// as the decisions in `src/broker/mod.rs` say, and asked for each block
/// the way its size classes are filled ([`allocator`]).
#[global_allocator]
static ALLOCATOR: allocator::Allocator = allocator::Allocator;

pub use allocator::release_free_memory;

mod allocator;
mod bench;
mod check_config;
mod docs;
mod lock;
mod migrate;
mod output;
mod passwd;
mod serve;
mod snapshot;
mod sqlite;
mod status;

/// Exit codes, the same for every command (the README's "Commands").
pub mod exit {
    /// Success; the file, configuration or lock is valid / free.
    pub const OK: u8 = 0;
    /// The answer is "no": a file failed verification, the configuration is
    /// invalid, the lock is held.
    pub const NO: u8 = 1;
    /// Command-line usage error (also clap's own).
    pub const USAGE: u8 = 2;
    /// Could not do the work: I/O error, permission, source missing,
    /// destination exists, lock held by a running broker.
    pub const CANNOT: u8 = 3;
}

/// The exit status every command shares, for `--help` and the man page.
const EXIT_STATUS_HELP: &str = "\
Exit status, the same for every command:
  0  success; the file, configuration or lock is valid / free
  1  the answer is \"no\": a file failed verification, the configuration is invalid, the lock is held
  2  command-line usage error
  3  could not do the work: I/O error, permission, source missing, destination exists,
     lock held by a running broker

Human output goes to stdout as tables and one line per problem; --json prints one JSON
document on stdout (NDJSON where it streams), diagnostics on stderr. Readers of the JSON
must ignore fields they do not know.";

/// An MQTT broker whose data lives in durable channels, and the operator's
/// toolkit for that data.
#[derive(Parser, Debug)]
#[command(
    name = "saguin",
    version,
    propagate_version = true,
    after_long_help = EXIT_STATUS_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Commands,
}

#[derive(Subcommand, Debug)]
pub enum Commands {
    /// Serve MQTT.
    Serve(serve::Args),
    /// Validate a configuration, and print it fully resolved.
    CheckConfig(check_config::Args),
    /// Inspect and verify snapshot files and directories.
    #[command(subcommand)]
    Snapshot(snapshot::Command),
    /// Read and back up a sqlite provider's database.
    #[command(subcommand)]
    Sqlite(sqlite::Command),
    /// Move a provider's data to another provider kind.
    #[command(subcommand)]
    Migrate(migrate::Command),
    /// Tell whether a provider's lock is held, and by whom.
    #[command(subcommand)]
    Lock(lock::Command),
    /// Add, change or delete a user in a password file (mosquitto_passwd's format).
    #[command(long_about = passwd::LONG_ABOUT)]
    Passwd(passwd::Args),
    /// Ask a running broker how it is, over its metrics listener.
    #[command(long_about = status::LONG_ABOUT)]
    Status(status::Args),
    /// Measure what this machine and its disk cost the configured providers.
    #[command(long_about = bench::LONG_ABOUT)]
    Bench(bench::Args),
    /// Write the man pages and shell completions (for building the project).
    #[command(hide = true)]
    GenerateDocs(docs::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Commands::Serve(args) => serve::run(args),
        Commands::CheckConfig(args) => check_config::run(args),
        Commands::Snapshot(cmd) => snapshot::run(cmd),
        Commands::Sqlite(cmd) => sqlite::run(cmd),
        Commands::Migrate(cmd) => migrate::run(cmd),
        Commands::Lock(cmd) => lock::run(cmd),
        Commands::Passwd(args) => passwd::run(args),
        Commands::Status(args) => status::run(args),
        Commands::Bench(args) => bench::run(args),
        Commands::GenerateDocs(args) => docs::run(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) if is_broken_pipe(&err) => ExitCode::from(exit::OK),
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "saguin: {}", error_line(&err));
            ExitCode::from(exit::CANNOT)
        }
    }
}

/// The error and its causes on one line, each cause once: an error whose
/// own text already ends with its cause's (rusqlite's conversion and
/// SQLite errors, and ours that name their source) would otherwise say it
/// twice.
fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let said = if line.is_empty() {
            cause.to_string()
        } else {
            format!(": {cause}")
        };
        if !line.ends_with(&said) {
            line.push_str(&said);
        }
    }
    line
}

/// `saguin ... | head` closing the pipe early is not a failure. The write
/// error reaches here as an `io::Error`, or inside a `serde_json::Error`
/// (JSON written straight to stdout), whose source chain skips the
/// `io::Error` itself, so both are asked.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        let kind = cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| {
                cause
                    .downcast_ref::<serde_json::Error>()
                    .and_then(serde_json::Error::io_error_kind)
            });
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading the rows: {source}")]
    struct NamesItsSource {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn an_error_line_says_each_cause_once() {
        let err = anyhow::Error::new(NamesItsSource {
            source: std::io::Error::other("disk on fire"),
        })
        .context("sqlite dump saguin.db");
        assert_eq!(
            error_line(&err),
            "sqlite dump saguin.db: reading the rows: disk on fire"
        );
        let plain = anyhow::Error::new(std::io::Error::other("gone")).context("open x");
        assert_eq!(error_line(&plain), "open x: gone");
    }

    /// Each command's `--help` and man page say more than its line in the
    /// list of commands: a long description set on its arguments would be
    /// replaced by the one-line doc of the variant that names them, so it
    /// is set on the variant.
    #[test]
    fn every_command_says_more_than_its_one_line() {
        use clap::CommandFactory;
        fn leaves(cmd: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
            for sub in cmd.get_subcommands() {
                leaves(sub, format!("{path} {}", sub.get_name()), out);
            }
            if cmd.get_subcommands().next().is_none() {
                out.push((path, cmd.clone()));
            }
        }
        let mut all = Vec::new();
        leaves(&Cli::command(), "saguin".into(), &mut all);
        let terse: Vec<&str> = all
            .iter()
            .filter(|(path, cmd)| {
                path != "saguin generate-docs"
                    && path != "saguin help"
                    && !path.starts_with("saguin help ")
                    && cmd.get_long_about().is_none()
                    && cmd.get_after_long_help().is_none()
            })
            .map(|(path, _)| path.as_str())
            .collect();
        assert!(terse.is_empty(), "{terse:?}");
    }
}
