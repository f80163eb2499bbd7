//! `$SYS/broker/#`: the broker's statistics, published every
//! [`SYS_INTERVAL`](super::SYS_INTERVAL) at QoS 0 and sent to a new `$SYS`
//! subscription at once.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use super::BrokerState;
use crate::broker::message::{Message, MessageProperties};

impl BrokerState {
    /// The `$SYS/broker/...` statistics as messages.
    pub(super) fn sys_messages(&self, now: Instant) -> Vec<Arc<Message>> {
        let m = &self.metrics;
        let values = [
            ("$SYS/broker/version", self.version.clone()),
            (
                "$SYS/broker/uptime",
                format!("{} seconds", m.started.elapsed().as_secs()),
            ),
            (
                "$SYS/broker/clients/connected",
                m.connections.load(Relaxed).to_string(),
            ),
            (
                "$SYS/broker/messages/received",
                m.messages_received.load(Relaxed).to_string(),
            ),
            (
                "$SYS/broker/messages/sent",
                m.messages_sent.load(Relaxed).to_string(),
            ),
            (
                "$SYS/broker/subscriptions/count",
                m.subscriptions.load(Relaxed).to_string(),
            ),
            (
                "$SYS/broker/retained messages/count",
                self.retained.len().to_string(),
            ),
        ];
        values
            .into_iter()
            .map(|(topic, value)| {
                Arc::new(Message {
                    topic: topic.into(),
                    payload: Bytes::from(value),
                    qos: 0,
                    retain: false,
                    properties: MessageProperties::default(),
                    received_at: now,
                    channel_offset: None,
                    wire: Default::default(),
                })
            })
            .collect()
    }

    /// Publish the `$SYS` statistics: QoS 0, not retained, not counted,
    /// delivered only to matching subscriptions the ACL allows.
    pub fn publish_sys(&mut self, now: Instant) {
        for message in self.sys_messages(now) {
            let mut deliveries = self.deliveries_of(&message, None);
            for d in deliveries.drain(..) {
                self.deliver(
                    d.session,
                    message.clone(),
                    0,
                    false,
                    d.subscription_ids,
                    true,
                    None,
                    now,
                );
            }
            self.scratch_deliveries = deliveries;
        }
        self.close_doomed(now);
    }
}
