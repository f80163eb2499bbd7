//! What a valid configuration asks for that `saguin serve` does not serve
//! yet. One list, so `check-config` and `serve` agree by construction:
//! check-config reports each entry and answers "no"; serve refuses to start.
//!
//! Channels are not served by this build: a broker that accepted them would
//! announce a durability it does not deliver (invariant 14), so every
//! channel, of every kind, is listed by its YAML path.

use std::fmt;

use super::Config;

/// One setting `serve` refuses, with its YAML path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unserved {
    /// The YAML path, with the item's name where it has one
    /// (`channels[0] (telemetry)`).
    pub path: String,
    /// Why, as a sentence fragment an operator can act on.
    pub reason: &'static str,
}

impl fmt::Display for Unserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

pub(crate) fn unserved(config: &Config) -> Vec<Unserved> {
    config
        .channels
        .iter()
        .enumerate()
        .map(|(i, channel)| Unserved {
            path: format!("channels[{i}] ({})", channel.name),
            reason:
                "channels are not served by this build; `saguin serve` refuses this configuration",
        })
        .collect()
}
