//! What the broker keeps of a bridge's session while it is away: its
//! places in channels and its unreleased exactly-once publishes into them.
//! A bridge's connection is made inside the broker and comes back under
//! the same name, so these wait for it rather than for a stored session.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

#[derive(Debug, Default)]
pub(super) struct Bridges {
    /// Where each bridge's reader stands in each channel, by channel index
    /// and bridge name, while its session is away.
    pub positions: HashMap<(u16, String), u64>,
    /// A bridge's unreleased QoS 2 publishes into channels (packet id,
    /// channel index, when held), by its client id, while its session is
    /// away: the remote's PUBREL may come on the bridge's next connection,
    /// or after a restart.
    pub holds: HashMap<Arc<str>, Vec<(u16, u16, Instant)>>,
}
