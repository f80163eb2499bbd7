//! `saguin lock status`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use comfy_table::Table;
use saguin::storage::lock::{self, Holder, LockState};

use crate::exit;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    // Exit 0: free (including a stale lock left by a process that is gone);
    // 1: held; 3: cannot tell.
    /// Free, held (by whom, since when), or stale: left by a process that
    /// died holding it.
    ///
    /// A holder that lets the lock go cleanly records when, and the lock is
    /// then "free (last released by pid N on HOST at T)". A lock whose
    /// holder is gone from this host without having recorded a release is
    /// "stale": that process crashed or was killed. Both are free to take.
    /// Exit 0 free or stale, 1 held, 3 cannot tell.
    Status {
        /// A database, a lock file, or a snapshot directory.
        path: PathBuf,
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: Command) -> anyhow::Result<u8> {
    match cmd {
        Command::Status { path, json } => status(&path, json),
    }
}

/// Which lock a PATH names: a directory is a snapshot directory, a file named
/// `*.lock` is the lock itself, anything else a database beside its lock.
fn lock_path_for(path: &Path) -> anyhow::Result<PathBuf> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("lock status {}", path.display()))?;
    if meta.is_dir() {
        return Ok(lock::lock_path_for_snapshot_dir(path));
    }
    if path.extension().is_some_and(|e| e == "lock") {
        return Ok(path.to_path_buf());
    }
    Ok(lock::lock_path_for_database(path))
}

#[derive(serde::Serialize)]
struct StatusDoc<'a> {
    /// The path asked about.
    path: String,
    /// The lock file it resolves to.
    lock: String,
    /// "free", "stale", "held" or "unknown".
    state: &'a str,
    /// The holder (held) or last holder (free, stale) row, when readable.
    holder: Option<HolderDoc>,
    /// The pid owning the lock per the operating system, when held.
    holder_pid: Option<u32>,
    /// Why the state is "unknown".
    error: Option<String>,
}

#[derive(serde::Serialize)]
struct HolderDoc {
    pid: u32,
    host: String,
    since: String,
    since_unix_ns: i64,
    revision: String,
    /// When the holder let the lock go cleanly; null while held and when it
    /// died holding it.
    released: Option<String>,
}

impl From<&Holder> for HolderDoc {
    fn from(h: &Holder) -> Self {
        HolderDoc {
            pid: h.pid,
            host: h.host.clone(),
            since: h.since_rfc3339(),
            since_unix_ns: h.since_unix_ns,
            revision: h.revision.clone(),
            released: (h.released_unix_ns != 0)
                .then(|| saguin_format::f21::time::format_unix_nanos(h.released_unix_ns)),
        }
    }
}

fn status(path: &Path, json: bool) -> anyhow::Result<u8> {
    let lock_path = match lock_path_for(path) {
        Ok(p) => p,
        Err(err) if json => {
            print_json(&StatusDoc {
                path: path.display().to_string(),
                lock: String::new(),
                state: "unknown",
                holder: None,
                holder_pid: None,
                error: Some(format!("{err:#}")),
            })?;
            eprintln!("saguin: {err:#}");
            return Ok(exit::CANNOT);
        }
        Err(err) => return Err(err),
    };
    let probed = lock::probe(&lock_path);
    let (state, holder, holder_pid, code, line) = match &probed {
        Ok(LockState::Free { last_holder }) => (
            "free",
            last_holder.as_ref(),
            None,
            exit::OK,
            match last_holder {
                Some(h) if h.released_unix_ns != 0 => format!(
                    "free (last released by pid {} on {} at {})",
                    h.pid,
                    h.host,
                    saguin_format::f21::time::format_unix_nanos(h.released_unix_ns)
                ),
                Some(h) => format!("free (last held by {h})"),
                None => "free".to_string(),
            },
        ),
        Ok(LockState::Stale { last_holder }) => (
            "stale",
            Some(last_holder),
            None,
            exit::OK,
            format!(
                "free: stale lock left by pid {} on {}, which died holding it (held since {})",
                last_holder.pid,
                last_holder.host,
                last_holder.since_rfc3339()
            ),
        ),
        Ok(LockState::Held { holder, holder_pid }) => (
            "held",
            holder.as_ref(),
            *holder_pid,
            exit::NO,
            match (holder, holder_pid) {
                (Some(h), _) => format!("held by {h}"),
                (None, Some(pid)) => format!("held by pid {pid} (holder row not readable)"),
                (None, None) => "held (holder row not readable)".to_string(),
            },
        ),
        Err(err) => (
            "unknown",
            None,
            None,
            exit::CANNOT,
            format!("cannot tell: {err}"),
        ),
    };
    if json {
        print_json(&StatusDoc {
            path: path.display().to_string(),
            lock: lock_path.display().to_string(),
            state,
            holder: holder.map(HolderDoc::from),
            holder_pid,
            error: probed.as_ref().err().map(ToString::to_string),
        })?;
        if let Err(err) = &probed {
            eprintln!("saguin: {err}");
        }
        return Ok(code);
    }
    let mut table = Table::new();
    table.set_header(vec!["lock", "state", "pid", "host", "since", "revision"]);
    let pid = holder.map(|h| h.pid).or(holder_pid);
    table.add_row(vec![
        lock_path.display().to_string(),
        state.to_string(),
        pid.map_or_else(|| "-".to_string(), |p| p.to_string()),
        holder.map_or_else(|| "-".to_string(), |h| h.host.clone()),
        holder.map_or_else(|| "-".to_string(), Holder::since_rfc3339),
        holder.map_or_else(|| "-".to_string(), |h| h.revision.clone()),
    ]);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{table}")?;
    writeln!(out, "{}: {line}", lock_path.display())?;
    Ok(code)
}

fn print_json(doc: &StatusDoc<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, doc)?;
    writeln!(out)?;
    Ok(())
}
