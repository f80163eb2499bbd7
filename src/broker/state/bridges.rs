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
    positions: HashMap<(u16, String), u64>,
    /// A bridge's unreleased QoS 2 publishes into channels (packet id,
    /// channel index, when held), by its client id, while its session is
    /// away: the remote's PUBREL may come on the bridge's next connection,
    /// or after a restart.
    holds: HashMap<Arc<str>, Vec<BridgeHold>>,
}

/// A held exactly-once publish into a channel: its packet id, the
/// channel's index, and when it was held.
pub(super) type BridgeHold = (u16, u16, Instant);

impl Bridges {
    /// Where bridge `bridge`'s reader stood in `channel` when its session
    /// went away (or as stored at the start).
    pub(super) fn position(&self, channel: u16, bridge: &str) -> Option<u64> {
        self.positions.get(&(channel, bridge.to_owned())).copied()
    }

    /// Keep where bridge `bridge`'s reader stands in `channel` for its
    /// next connection.
    pub(super) fn keep_position(&mut self, channel: u16, bridge: &str, offset: u64) {
        self.positions.insert((channel, bridge.to_owned()), offset);
    }

    /// Keep the unreleased holds of the bridge with client id `client_id`
    /// until it connects again.
    pub(super) fn keep_holds(&mut self, client_id: Arc<str>, holds: Vec<BridgeHold>) {
        self.holds.insert(client_id, holds);
    }

    /// A hold found at the start for the bridge with client id
    /// `client_id`, kept for its first connection.
    pub(super) fn add_hold(&mut self, client_id: &str, hold: BridgeHold) {
        self.holds.entry(client_id.into()).or_default().push(hold);
    }

    /// The holds kept for `client_id`, now that it is back.
    pub(super) fn take_holds(&mut self, client_id: &str) -> Option<Vec<BridgeHold>> {
        self.holds.remove(client_id)
    }
}
