//! The storage layer: channels, their providers, snapshot directories and
//! the lock. The file formats are specified
//! in `format/FORMAT.md`, the durability promises in `docs/operations.md`.

pub mod backup;
pub mod bench;
pub mod contract;
pub mod file_system;
pub mod generation;
pub mod kept;
pub mod lock;
pub mod memory;
pub mod migrate;
pub(crate) mod offers;
pub mod read;
pub(crate) mod room;
pub mod sample;
pub mod snapshot_dir;
pub mod snapshot_write;
pub mod spares;
pub mod sqlite;

use std::path::{Path, PathBuf};

/// The names in `dir`, sorted: what a test of a directory's files asks.
#[cfg(test)]
pub(crate) fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The directory `path` is in (`.` for a bare name).
pub(crate) fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Why the directory a destination would be written in cannot take it.
pub(crate) enum NoParent {
    /// Missing, or not a directory.
    Missing(PathBuf),
    /// It could not be looked at.
    Unreadable(PathBuf, std::io::Error),
}

/// Whether the directory `dest` would be written in is there: a typo in
/// the path is refused as such (not as the temporary file that could not
/// be made in it), and never becomes a new directory tree.
pub(crate) fn check_parent(dest: &Path) -> Result<(), NoParent> {
    let parent = parent_of(dest);
    match std::fs::metadata(&parent) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(NoParent::Missing(parent)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NoParent::Missing(parent)),
        Err(e) => Err(NoParent::Unreadable(parent, e)),
    }
}

/// A sqlite provider in `dir` and a memory provider, for tests that hold
/// both to one behaviour.
#[cfg(test)]
pub(crate) fn both_providers(dir: &std::path::Path) -> [std::sync::Arc<dyn contract::Provider>; 2] {
    let sqlite =
        sqlite::SqliteProvider::open(sqlite::SqliteOptions::new("db", dir.join("saguin.db")))
            .expect("open the sqlite provider");
    let memory = memory::MemoryProvider::unbounded();
    [std::sync::Arc::new(sqlite), memory]
}
