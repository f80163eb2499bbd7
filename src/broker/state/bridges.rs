//! What the broker keeps of a bridge's session while it is away: its
//! places in channels and its unreleased exactly-once publishes into them.
//! A bridge's connection is made inside the broker and comes back under
//! the same name, so these wait for it rather than for a stored session.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use crate::broker::subscriptions::SessionKey;

#[derive(Debug, Default)]
pub(super) struct Bridges {
    /// Where each bridge's reader stands in each channel, by channel index
    /// and bridge name, while its session is away.
    positions: HashMap<(u16, String), u64>,
    /// A bridge's unreleased QoS 2 publishes into channels, by its client
    /// id, while its session is away: the remote's PUBREL may come on the
    /// bridge's next connection, or after a restart.
    holds: HashMap<Arc<str>, Vec<BridgeHold>>,
    /// The client id of each bridge session that ended while holds of it
    /// were still being written, with their packet ids: their answers name
    /// the session that is gone.
    ended: HashMap<SessionKey, (Arc<str>, Vec<u16>)>,
}

/// A held exactly-once publish into a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct BridgeHold {
    pub packet_id: u16,
    /// The channel's index.
    pub channel: u16,
    pub held_at: Instant,
    /// Its hold is still being written: the bridge's next connection is
    /// answered PUBREC for it once it is stored, not before.
    pub writing: bool,
}

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

    /// Keep the unreleased holds of the bridge session `key`, with client
    /// id `client_id`, until it connects again.
    pub(super) fn keep_holds(
        &mut self,
        key: SessionKey,
        client_id: Arc<str>,
        holds: Vec<BridgeHold>,
    ) {
        let writing: Vec<u16> = holds
            .iter()
            .filter(|h| h.writing)
            .map(|h| h.packet_id)
            .collect();
        if !writing.is_empty() {
            self.ended.insert(key, (client_id.clone(), writing));
        }
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

    /// The write of hold `packet_id` of the ended bridge session `key` was
    /// answered: the bridge's client id, to find the hold by. A hold still
    /// kept here is stored (`stored`), or let go.
    pub(super) fn hold_written(
        &mut self,
        key: SessionKey,
        packet_id: u16,
        stored: bool,
    ) -> Option<Arc<str>> {
        let (client_id, writing) = self.ended.get_mut(&key)?;
        let at = writing.iter().position(|id| *id == packet_id)?;
        writing.swap_remove(at);
        let client_id = client_id.clone();
        if writing.is_empty() {
            self.ended.remove(&key);
        }
        if let Some(holds) = self.holds.get_mut(&client_id) {
            match stored {
                true => holds
                    .iter_mut()
                    .filter(|h| h.packet_id == packet_id)
                    .for_each(|h| h.writing = false),
                false => holds.retain(|h| h.packet_id != packet_id),
            }
        }
        Some(client_id)
    }
}
