//! saguin: an MQTT broker whose data lives in durable channels, and the
//! operator's toolkit for that data.
//!
//! - [`storage`]: the one storage layer (memory and sqlite providers,
//!   snapshot directories, the lock), used by the broker and every command.
//! - [`broker`]: the MQTT server.
//! - [`config`]: the YAML configuration, validated and resolved.

pub mod broker;
pub mod config;
pub mod storage;
pub mod topic;

/// The build's own revision, as recorded in every file it writes.
pub use saguin_format::model;
