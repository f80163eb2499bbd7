//! Byte-exact encoders and decoders of every file saguin keeps on disk or
//! reads from another broker. Bounded and validating; no file system, no async.
//!
//! `FORMAT.md` beside this crate documents every layout byte by byte.

pub mod channel_name;
pub mod f21;
pub mod mbmqtt;
pub mod model;

/// The revision of the build, stamped into every file it writes: the git
/// commit (`git rev-parse --short=12 HEAD`) when built from a checkout,
/// `v<crate version>` otherwise. Read by `build.rs`, never hand-kept.
pub const REVISION: &str = env!("SAGUIN_REVISION");
