//! `saguin sqlite dump|backup`.

use std::path::PathBuf;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Show what a sqlite provider's database holds (read-only).
    Dump(DumpArgs),
    /// Take an online, consistent, verified copy of a database.
    Backup(BackupArgs),
}

#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    pub db: PathBuf,
    /// One JSON document on stdout.
    #[arg(long, conflicts_with = "ndjson")]
    pub json: bool,
    /// One JSON object per line on stdout.
    #[arg(long)]
    pub ndjson: bool,
    /// List this channel's records.
    #[arg(long, value_name = "NAME")]
    pub channel: Option<String>,
    /// First offset to list.
    #[arg(long, value_name = "OFFSET")]
    pub from: Option<u64>,
    /// At most this many records.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
}

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    pub db: PathBuf,
    pub dest: PathBuf,
}

pub fn run(_cmd: Command) -> anyhow::Result<u8> {
    anyhow::bail!("sqlite is not available in this build yet")
}
