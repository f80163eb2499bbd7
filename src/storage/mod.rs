//! The storage layer: channels, their providers, snapshot directories and
//! the lock. The file formats are specified
//! in `format/FORMAT.md`, the durability promises in `docs/operations.md`.

pub mod backup;
pub mod bench;
pub mod contract;
pub mod generation;
pub mod lock;
pub mod memory;
pub mod migrate;
pub mod read;
pub mod snapshot_dir;
pub mod snapshot_write;
pub mod sqlite;

/// A sqlite provider in `dir` and a memory provider, for tests that hold
/// both to one behaviour.
#[cfg(test)]
pub(crate) fn both_providers(dir: &std::path::Path) -> [std::sync::Arc<dyn contract::Provider>; 2] {
    let sqlite =
        sqlite::SqliteProvider::open(sqlite::SqliteOptions::new("db", dir.join("saguin.db")))
            .expect("open the sqlite provider");
    let memory = memory::MemoryProvider::new(memory::MemoryConfig {
        name: "mem".into(),
        max_bytes: None,
        reserve: 0,
    })
    .expect("make the memory provider");
    [std::sync::Arc::new(sqlite), memory]
}
