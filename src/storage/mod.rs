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
