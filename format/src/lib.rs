//! Byte-exact encoders and decoders of every file saguin keeps on disk or
//! reads from another broker. Bounded and validating; no file system, no async.
//!
//! `FORMAT.md` beside this crate documents every layout byte by byte.

pub mod channel_name;
pub mod f21;
pub mod mbmqtt;
pub mod model;
