//! What a valid configuration asks for that `saguin serve` does not serve
//! yet. One list, so `check-config` and `serve` agree by construction:
//! check-config reports each entry and answers "no"; serve refuses to start.
//!
//! Every channel of every kind is served, so the list is empty: every
//! configuration `check-config` accepts is one `serve` serves. The
//! mechanism stays for the next setting a build accepts before it serves
//! it: a broker that accepted such a setting silently would announce what
//! it does not deliver (invariant 14).

use std::fmt;

use super::Config;

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

pub(crate) fn unserved(_config: &Config) -> Vec<Unserved> {
    Vec::new()
}
