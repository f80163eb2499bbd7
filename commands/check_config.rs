//! `saguin check-config`: validate a configuration and print it resolved.
//!
//! It runs the very loader `saguin serve` runs ([`Config::load`]), so a
//! configuration this command accepts is one the broker accepts.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use saguin::config::{Config, ConfigError};

use crate::exit;

/// Validate a configuration, open every file it names but the databases, and
/// optionally print the fully resolved configuration. The help text is in
/// `AFTER_HELP` / `AFTER_LONG_HELP` because the subcommand's own summary
/// line comes from the command tree.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP, after_long_help = AFTER_LONG_HELP)]
pub struct Args {
    /// The configuration file (YAML). Without it, the embedded default: one
    /// listener on 127.0.0.1:1883, anonymous, nothing kept.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the fully resolved configuration on stdout as one YAML (the
    /// default) or JSON document.
    #[arg(
        long,
        value_name = "FORMAT",
        num_args = 0..=1,
        default_missing_value = "yaml",
        value_enum
    )]
    pub output: Option<OutputFormat>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Yaml,
    Json,
}

const AFTER_HELP: &str = "\
Exit status: 0 valid, 1 invalid or refused by `saguin serve`, 2 usage \
error, 3 the file cannot be read.

Examples:
  saguin check-config --config /etc/saguin/saguin.yaml
  saguin check-config --config saguin.yaml --output json
  diff <(saguin check-config --config active.yaml --output) \\
       <(saguin check-config --config standby.yaml --output)";

const AFTER_LONG_HELP: &str = "\
It runs the loader `saguin serve` runs, so a configuration it accepts is one \
the broker serves. Every problem is reported on stderr with its YAML path, \
one a line, for example:

  saguin.yaml: channels[2].storage: no provider named \"db2\" (providers: mem, db)

A valid configuration `saguin serve` would still refuse answers 1 as well, \
each setting named by YAML path on stderr. This build serves every setting \
it accepts - channels of all three kinds among them - so that list is \
empty.

The password file, the ACL file and every TLS certificate and key are opened \
and parsed. The databases and snapshot directories are not opened and no \
address is bound, so the configuration of a running broker can be checked.

Warnings go to stderr and leave the exit status as it is: a listener \
certificate that has expired or is not valid yet; a provider in use \
whose directory is on tmpfs or ramfs, whose files a reboot or a power cut \
takes whatever the provider commits; and a sqlite provider on NFS or SMB, \
where its write-ahead log cannot be trusted.

Without --output, a summary goes to stdout: what each channel's durability \
is (memory: the last successful snapshot, or not kept without a \
snapshot_dir; sqlite: every commit, less about one flush_interval on a power \
cut), what each provider's max_bytes came to (pages of 4096 bytes, the \
reserve of max_message_size + max_header_bytes, where publishes stop), and \
\"this configuration keeps nothing\" when so. With --output the resolved \
configuration is the only thing on stdout and the summary goes to stderr.

The resolved document (YAML, or JSON with --output json): every default \
filled in; sizes in bytes; durations in humantime's normal form (150ms, 1h, \
7days); relative paths resolved against the configuration file's \
directory; keys sorted; listeners, providers and channels sorted by name; \
absent optional values null. It is configuration only: what the named \
files hold (private keys, password hashes, ACL rules) is never printed. It \
loads back as a configuration, and two equivalent configurations print the \
same document, so a diff shows only real differences.

Decisions: auth.allow_anonymous is true only in the embedded default and \
false when a file omits it; a file that leaves it false must name a \
password_file. A listener on port 0 gets a port from the system. A \
provider no channel or broker store names is inert.

Exit status: 0 valid; 1 invalid, or a setting `saguin serve` refuses \
(each problem on stderr); 2 usage error; 3 the configuration file itself \
cannot be read.

Examples:

  Check a configuration before a restart:
    saguin check-config --config /etc/saguin/saguin.yaml

  Prove an active broker and its standby are configured alike:
    diff <(saguin check-config --config active.yaml --output) \\
         <(saguin check-config --config standby.yaml --output)

  The resolved configuration as JSON, for a script:
    saguin check-config --config saguin.yaml --output json

  What the broker runs without --config:
    saguin check-config --output";

pub fn run(args: Args) -> anyhow::Result<u8> {
    let origin = match &args.config {
        Some(path) => path.display().to_string(),
        None => "(embedded default)".to_string(),
    };
    let loaded = match &args.config {
        Some(path) => Config::load(path),
        None => Ok(Config::embedded_default()),
    };
    let config = match loaded {
        Ok(config) => config,
        Err(ConfigError::Unreadable { path, reason }) => {
            let mut err = std::io::stderr().lock();
            writeln!(err, "saguin: configuration {}: {reason}", path.display())?;
            return Ok(exit::CANNOT);
        }
        Err(ConfigError::Invalid { problems, .. }) => {
            let mut err = std::io::stderr().lock();
            for problem in &problems {
                writeln!(err, "{origin}: {problem}")?;
            }
            writeln!(
                err,
                "saguin: {origin}: {} problem{}; the configuration is invalid",
                problems.len(),
                if problems.len() == 1 { "" } else { "s" }
            )?;
            return Ok(exit::NO);
        }
    };

    let summary = config.durability_summary();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let mut warnings = config.warnings(now);
    warnings.extend(config.unkept_providers());
    let unserved = config.unserved();
    let verdict = if unserved.is_empty() {
        "valid"
    } else {
        "valid, but `saguin serve` refuses it (below)"
    };
    match args.output {
        Some(format) => {
            let document = config.resolved();
            let text = match format {
                OutputFormat::Yaml => serde_norway::to_string(&document)
                    .context("render the configuration as YAML")?,
                OutputFormat::Json => {
                    let mut text = serde_json::to_string_pretty(&document)
                        .context("render the configuration as JSON")?;
                    text.push('\n');
                    text
                }
            };
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
            let mut err = std::io::stderr().lock();
            writeln!(err, "{origin}: {verdict}")?;
            for line in &summary {
                writeln!(err, "{line}")?;
            }
        }
        None => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{origin}: {verdict}")?;
            if !config.storage.is_empty() {
                writeln!(out, "{}", providers_table(&config))?;
            }
            for line in &summary {
                writeln!(out, "{line}")?;
            }
            out.flush()?;
        }
    }
    let mut err = std::io::stderr().lock();
    for warning in &warnings {
        writeln!(err, "{origin}: warning: {warning}")?;
    }
    if unserved.is_empty() {
        return Ok(exit::OK);
    }
    for item in &unserved {
        writeln!(err, "{origin}: {item}")?;
    }
    writeln!(
        err,
        "saguin: {origin}: {} setting{} `saguin serve` refuses; remove {} to serve this configuration",
        unserved.len(),
        if unserved.len() == 1 { "" } else { "s" },
        if unserved.len() == 1 { "it" } else { "them" }
    )?;
    Ok(exit::NO)
}

/// `names` joined by commas, a new line begun before one would pass
/// [`NAMES_LINE_WIDTH`]: the table lays a cell out in time that grows with
/// the square of its longest line, and a provider of ten thousand channels
/// on one line took most of a second.
fn names_in_lines(names: &[&str]) -> String {
    let mut out = String::new();
    let mut line = 0;
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            // Room for the comma that ends the line if the next breaks it.
            if line + 2 + name.len() + 1 > NAMES_LINE_WIDTH {
                out.push_str(",\n");
                line = 0;
            } else {
                out.push_str(", ");
                line += 2;
            }
        }
        out.push_str(name);
        line += name.len();
    }
    out
}

/// The widest line of channel names in the providers table, in bytes.
const NAMES_LINE_WIDTH: usize = 72;

fn providers_table(config: &Config) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_BORDERS_ONLY);
    table.set_header([
        "provider",
        "kind",
        "channels",
        "max_bytes",
        "reserve",
        "publishes stop at",
    ]);
    let reserve = config.reserve_bytes();
    // Channels grouped by provider once, so a large configuration is
    // tabled in linear time.
    let mut by_provider: HashMap<&str, Vec<&str>> = HashMap::new();
    for channel in &config.channels {
        by_provider
            .entry(channel.storage.as_str())
            .or_default()
            .push(channel.name.as_str());
    }
    for provider in &config.storage {
        let channels = by_provider
            .get(provider.name())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let named_by_broker = config.broker.retained_storage.as_deref() == Some(provider.name())
            || config.broker.session_storage.as_deref() == Some(provider.name());
        let channels = if channels.is_empty() && !named_by_broker {
            "(inert)".to_string()
        } else if channels.is_empty() {
            "-".to_string()
        } else {
            names_in_lines(channels)
        };
        let (max, reserve, stop) = match provider.bound(reserve) {
            None => ("none".to_string(), "-".to_string(), "-".to_string()),
            Some(b) => match b.pages {
                Some(pages) => (
                    format!("{} ({pages} pages)", b.max_bytes),
                    format!(
                        "{} ({} pages)",
                        b.reserve_bytes,
                        b.reserve_bytes / saguin::config::SQLITE_PAGE_SIZE
                    ),
                    b.publish_limit_bytes.to_string(),
                ),
                None => (
                    b.max_bytes.to_string(),
                    b.reserve_bytes.to_string(),
                    b.publish_limit_bytes.to_string(),
                ),
            },
        };
        table.add_row([
            provider.name().to_string(),
            provider.kind_name().to_string(),
            channels,
            max,
            reserve,
            stop,
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_are_laid_in_lines_no_wider_than_the_table_takes() {
        assert_eq!(names_in_lines(&[]), "");
        assert_eq!(names_in_lines(&["a", "b", "c"]), "a, b, c");
        let names: Vec<String> = (0..10_000).map(|i| format!("channel-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let laid = names_in_lines(&names);
        assert!(laid.lines().all(|line| line.len() <= NAMES_LINE_WIDTH));
        assert!(laid.lines().count() > 10_000 * 12 / NAMES_LINE_WIDTH);
        let again: Vec<&str> = laid
            .lines()
            .flat_map(|line| line.split(", "))
            .map(|name| name.trim_end_matches(','))
            .collect();
        assert_eq!(again, names);
        // A name wider than a line has a line of its own.
        let wide = "w".repeat(NAMES_LINE_WIDTH + 5);
        assert_eq!(
            names_in_lines(&["a", &wide, "b"]),
            format!("a,\n{wide},\nb")
        );
    }
}
