//! saguin: an MQTT broker whose data lives in durable channels, and the
//! operator's toolkit for that data.
//!
//! - [`storage`]: the one storage layer (memory and sqlite providers,
//!   snapshot directories, the lock), used by every command, and by the
//!   broker for its channels of every kind - append, latest and queue -
//!   and for the retained messages and sessions of the providers
//!   `broker.retained_storage` and `broker.session_storage` name.
//! - [`broker`]: the MQTT server, its metrics and health endpoints, and
//!   the client `saguin status` asks them with.
//! - [`config`]: the YAML configuration, validated and resolved.
//! - [`topic`]: MQTT topic name and filter rules, for the broker and storage.
//!
//! The invariants comments cite by number are listed in `format/FORMAT.md`
//! §7; the architecture in one page is `docs/design.md`.

pub mod broker;
pub mod config;
pub mod storage;
pub mod topic;

/// The record and channel model every format and store shares (from
/// `saguin-format`).
pub use saguin_format::model;
