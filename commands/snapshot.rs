//! `saguin snapshot inspect|verify`.

use std::path::PathBuf;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Show what a snapshot directory, format 21 file or MBMQTT01 file holds.
    Inspect(InspectArgs),
    /// Decode and validate snapshot files as the broker does at startup.
    Verify(VerifyArgs),
}

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A snapshot directory, a format 21 file, or an MBMQTT01 broker.snapshot.
    pub path: PathBuf,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// List records.
    #[arg(long)]
    pub records: bool,
    /// At most this many records per channel.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Only this channel.
    #[arg(long, value_name = "NAME")]
    pub channel: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Snapshot directories or files.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print nothing; the exit code answers.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(_cmd: Command) -> anyhow::Result<u8> {
    anyhow::bail!("snapshot is not available in this build yet")
}
