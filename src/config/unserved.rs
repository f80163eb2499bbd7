//! What a valid configuration asks for that `saguin serve` does not serve
//! yet. One list, so `check-config` and `serve` agree by construction:
//! check-config reports each entry and answers "no"; serve refuses to start.
//!
//! Append channels are served. Latest and queue channels are not: a broker
//! that accepted them would announce a durability it does not deliver
//! (invariant 14), so each is listed by its YAML path.

use std::fmt;

use super::{ChannelKindConfig, Config};

/// One setting `serve` refuses, with its YAML path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unserved {
    /// The YAML path, with the item's name where it has one
    /// (`channels[1] (devices)`).
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
        .filter(|(_, channel)| !matches!(channel.kind, ChannelKindConfig::Append))
        .map(|(i, channel)| Unserved {
            path: format!("channels[{i}] ({})", channel.name),
            reason:
                "latest and queue channels are not served by this build (append channels are); \
                     `saguin serve` refuses this configuration",
        })
        .collect()
}
