//! `saguin serve`: run the broker.

use std::path::PathBuf;

/// Serve MQTT on the configured listeners until SIGTERM or SIGINT.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The configuration file (YAML). Without it: one listener on
    /// 127.0.0.1:1883, anonymous, everything in memory, nothing kept.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("serve is not available in this build yet")
}
