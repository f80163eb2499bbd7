//! `saguin lock status`.

use std::path::PathBuf;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Free, held (by whom, since when), or left by a process that is gone.
    Status {
        /// A database, a lock file, or a snapshot directory.
        path: PathBuf,
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(_cmd: Command) -> anyhow::Result<u8> {
    anyhow::bail!("lock status is not available in this build yet")
}
