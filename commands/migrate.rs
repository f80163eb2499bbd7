//! `saguin migrate`.

use std::path::PathBuf;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Move a memory provider's snapshot directory into a new sqlite database.
    ToSqlite { snapshot_dir: PathBuf, db: PathBuf },
    /// Move a sqlite database into a new snapshot directory.
    ToSnapshots { db: PathBuf, snapshot_dir: PathBuf },
    /// Import a legacy MBMQTT01 broker.snapshot.
    FromMbmqtt {
        broker_snapshot: PathBuf,
        #[arg(
            long,
            value_name = "DB",
            conflicts_with = "to_snapshots",
            required_unless_present = "to_snapshots"
        )]
        to_sqlite: Option<PathBuf>,
        #[arg(long, value_name = "DIR")]
        to_snapshots: Option<PathBuf>,
    },
}

pub fn run(_cmd: Command) -> anyhow::Result<u8> {
    anyhow::bail!("migrate is not available in this build yet")
}
