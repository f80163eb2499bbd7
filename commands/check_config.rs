//! `saguin check-config`: validate a configuration and print it resolved.

use std::path::PathBuf;

/// Validate a configuration, open every file it names but the databases, and
/// optionally print the fully resolved configuration.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The configuration file (YAML); without it, the embedded default.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the fully resolved configuration on stdout.
    #[arg(long, value_name = "FORMAT", num_args = 0..=1, default_missing_value = "yaml")]
    pub output: Option<String>,
}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("check-config is not available in this build yet")
}
