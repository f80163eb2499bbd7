//! SUBSCRIBE and UNSUBSCRIBE (stored before they are acknowledged, for a
//! persistent session), and the retained messages a subscription is owed,
//! sent paced by the client's window and its writer.

use std::sync::atomic::Ordering::Relaxed;

use tokio::time::Instant;

use super::consumer::{seek_of, ConsumerStart};
use super::intent::Parked;
use super::session::{QueuedMessage, SessionSubscription};
use super::{BrokerState, ReasonCode, RetainedDue};
use crate::broker::metrics::CloseReason;
use crate::broker::subscriptions::{SessionKey, SubOptions};
use crate::topic;

impl BrokerState {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_subscribe(
        &mut self,
        connection: u64,
        key: SessionKey,
        packet_id: u16,
        subscription_id: Option<u32>,
        user_properties: &[(String, String)],
        filters: Vec<(String, SubOptions)>,
        now: Instant,
    ) {
        let mut reasons = Vec::with_capacity(filters.len());
        let mut retained_for: Vec<(String, SubOptions)> = Vec::new();
        let mut undo = Vec::new();
        let mut consumers: Vec<ConsumerStart> = Vec::new();
        // The first refusal's why, for the SUBACK's reason string.
        let mut refusal: Option<String> = None;
        let seek = seek_of(user_properties);
        for (raw, mut options) in filters {
            options.subscription_id = subscription_id;
            let parsed = match topic::parse_filter(&raw) {
                Ok(p) => p,
                Err(_) => {
                    reasons.push(ReasonCode::TopicFilterInvalid);
                    continue;
                }
            };
            let channel = self.channels.of_topic(parsed.filter);
            if let Some(channel) = channel {
                // A queue's job is leased until its PUBACK, so a worker
                // takes jobs at QoS 1; granting QoS 0 and sending at 1
                // would break the grant (MQTT-3.8.4-8 in 3.1.1).
                let seek = match &seek {
                    Ok(_) if options.qos == 0 && self.channels.is_queue(channel) => Err(format!(
                        "{raw}: a queue's worker subscribes at QoS 1 or 2, as each job is leased until its PUBACK"
                    )),
                    Ok(seek) => Ok(*seek),
                    Err(why) => Err(why.clone()),
                };
                let seek = match seek {
                    Ok(seek) => seek,
                    Err(why) => {
                        let client_id = &self.sessions.by_key[&key].client_id;
                        tracing::warn!(client_id = %client_id, filter = %raw, error = %why, "subscription to a channel refused");
                        reasons.push(ReasonCode::ImplementationSpecificError);
                        refusal.get_or_insert(why);
                        continue;
                    }
                };
                let group = parsed
                    .share_group
                    .map(|_| (raw.clone(), parsed.filter.to_owned()));
                if group.is_some() || !consumers.iter().any(|c| c.channel == channel) {
                    consumers.push(ConsumerStart {
                        channel,
                        seek,
                        group,
                        stored: None,
                    });
                }
            }
            if parsed.share_group.is_some() && options.no_local {
                // MQTT 5 3.8.3.1: No Local on a shared subscription.
                self.undo_subscriptions(key, undo);
                self.doom(connection, CloseReason::Protocol, ReasonCode::ProtocolError);
                return;
            }
            let log_next = self.persist.log_next;
            let session = self
                .sessions
                .by_key
                .get_mut(&key)
                .expect("connected session");
            if self.authorizer.is_active()
                && !self.authorizer.can_subscribe(
                    session.principal.as_deref(),
                    &session.client_id,
                    parsed.filter,
                )
            {
                reasons.push(ReasonCode::NotAuthorized);
                continue;
            }
            let existed = session.subscriptions.contains_key(&raw);
            if !existed && session.subscriptions.len() >= self.limits.max_subscriptions_per_session
            {
                reasons.push(ReasonCode::QuotaExceeded);
                continue;
            }
            let previous =
                session.subscribe(&raw, SessionSubscription::new(&raw, options, log_next));
            if previous.is_none() {
                self.metrics.subscriptions.fetch_add(1, Relaxed);
            }
            undo.push((raw.clone(), previous));
            self.index_subscription(key, parsed.share_group, parsed.filter, options);
            reasons.push(ReasonCode::from_u8(options.qos).unwrap_or(ReasonCode::UnspecifiedError));
            let wants_retained = match options.retain_handling {
                0 => true,
                1 => !existed,
                _ => false,
            };
            // A latest channel's current values come as retained messages do.
            let values = channel.is_none_or(|c| self.channels.is_latest(c));
            if wants_retained && parsed.share_group.is_none() && values {
                retained_for.push((parsed.filter.to_owned(), options));
            }
        }
        if self.sessions.by_key[&key].stored && !undo.is_empty() {
            self.stage_session(key, now);
        }
        for start in &mut consumers {
            let values_owed = retained_for
                .iter()
                .any(|(filter, _)| self.channels.of_topic(filter) == Some(start.channel));
            self.stage_start(key, start, values_owed, now);
        }
        self.park_or_answer(
            connection,
            Parked::SubAck {
                connection,
                key,
                packet_id,
                reasons,
                reason_string: refusal.map(String::into_boxed_str),
                retained_for,
                undo,
                consumers,
            },
            now,
        );
    }

    pub(super) fn on_unsubscribe(
        &mut self,
        connection: u64,
        key: SessionKey,
        packet_id: u16,
        filters: Vec<String>,
        now: Instant,
    ) {
        let mut reasons = Vec::with_capacity(filters.len());
        let mut undo = Vec::new();
        let mut channels = Vec::new();
        for raw in filters {
            match self.unsubscribe(key, &raw) {
                Some(sub) => {
                    if let Some(channel) = self.channels.of_topic(sub.filter(&raw)) {
                        channels.push((channel, raw.clone()));
                    }
                    undo.push((raw, sub));
                    reasons.push(ReasonCode::Success);
                }
                None => reasons.push(ReasonCode::NoSubscriptionExisted),
            }
        }
        if self.sessions.by_key[&key].stored && !undo.is_empty() {
            self.stage_session(key, now);
        }
        self.park_or_answer(
            connection,
            Parked::UnsubAck {
                connection,
                key,
                packet_id,
                reasons,
                undo,
                channels,
            },
            now,
        );
    }

    /// Remove subscription `raw` of session `key`; what it was, if any.
    fn unsubscribe(&mut self, key: SessionKey, raw: &str) -> Option<SessionSubscription> {
        let session = self.sessions.by_key.get_mut(&key)?;
        let sub = session.subscriptions.remove(raw)?;
        self.metrics.subscriptions.fetch_sub(1, Relaxed);
        self.unindex_subscription(key, raw, &sub);
        Some(sub)
    }

    /// A subscription of `key` joins the broadcast index, unless its
    /// filter is within a channel: a channel's records reach its consumers
    /// through the channel (`following.rs`), never through the broadcast
    /// index, so such a filter is not kept there too.
    pub(super) fn index_subscription(
        &mut self,
        key: SessionKey,
        share_group: Option<&str>,
        filter: &str,
        options: SubOptions,
    ) {
        if self.channels.of_topic(filter).is_none() {
            self.index.insert(share_group, filter, key, options);
        }
    }

    /// Subscription `raw` of `key` leaves the broadcast index, where it is
    /// unless it is within a channel ([`Self::index_subscription`]).
    pub(super) fn unindex_subscription(
        &mut self,
        key: SessionKey,
        raw: &str,
        sub: &SessionSubscription,
    ) {
        if self.channels.of_topic(sub.filter(raw)).is_none() {
            self.index
                .remove(sub.share_group(raw), sub.filter(raw), key);
        }
    }

    /// Put subscription `raw` back as it was before a write that failed.
    pub(super) fn resubscribe(&mut self, key: SessionKey, raw: String, sub: SessionSubscription) {
        if !self.sessions.by_key.contains_key(&key) {
            return;
        }
        self.index_subscription(key, sub.share_group(&raw), sub.filter(&raw), sub.options);
        let session = self.sessions.by_key.get_mut(&key).expect("looked up");
        if session.subscribe(&raw, sub).is_none() {
            self.metrics.subscriptions.fetch_add(1, Relaxed);
        }
    }

    /// Undo a SUBSCRIBE whose write failed: each filter as it was before.
    pub(super) fn undo_subscriptions(
        &mut self,
        key: SessionKey,
        undo: Vec<(String, Option<SessionSubscription>)>,
    ) {
        for (raw, previous) in undo.into_iter().rev() {
            self.unsubscribe(key, &raw);
            if let Some(previous) = previous {
                self.resubscribe(key, raw, previous);
            }
        }
    }

    /// Queue the retained messages of `retained_for` (and `$SYS` values)
    /// for `connection` and send what its window and writer take now.
    pub(super) fn deliver_retained(
        &mut self,
        connection: u64,
        key: SessionKey,
        retained_for: Vec<(String, SubOptions)>,
        now: Instant,
    ) {
        // An answer parked behind a write is given after the write: the
        // client may have left by then (a DISCONNECT right after its
        // SUBSCRIBE) and a clean session ended with it.
        if retained_for.is_empty()
            || !self.connections.contains_key(&connection)
            || !self.sessions.by_key.contains_key(&key)
        {
            return;
        }
        let mut due = Vec::new();
        for (filter, options) in retained_for {
            let subscription_ids: Vec<u32> = options.subscription_id.into_iter().collect();
            self.retained.matching(&filter, &mut |message| {
                due.push(RetainedDue {
                    qos: options.qos.min(message.qos()),
                    message,
                    subscription_ids: subscription_ids.clone(),
                    sys: false,
                    channel: None,
                })
            });
            if filter.starts_with("$SYS") {
                for message in self.sys_messages(now) {
                    if topic::filter_matches(&filter, &message.topic) {
                        due.push(RetainedDue {
                            qos: 0,
                            message: message.into(),
                            subscription_ids: subscription_ids.clone(),
                            sys: true,
                            channel: None,
                        });
                    }
                }
            }
        }
        let session = &self.sessions.by_key[&key];
        let principal = session.principal.clone();
        let client_id = session.client_id.clone();
        if self.authorizer.is_active() {
            due.retain(|d| {
                self.authorizer
                    .can_receive(principal.as_deref(), &client_id, &d.message.topic())
            });
        }
        let Some(conn) = self.connections.get_mut(&connection) else {
            return;
        };
        conn.owe(due);
        self.send_retained_backlog(connection, now);
    }

    /// Send owed retained messages while there is room: QoS 0 while the
    /// writer keeps up, QoS 1/2 within the client's window. The rest waits
    /// for the writer to drain or an acknowledgement; none is dropped as an
    /// overflow.
    pub(super) fn send_retained_backlog(&mut self, connection: u64, now: Instant) {
        let mut sent_any = false;
        loop {
            let Some(conn) = self.connections.get(&connection) else {
                return;
            };
            let key = conn.session;
            let window = conn.window();
            let Some(front) = conn.retained_backlog.front() else {
                if sent_any {
                    // A latest channel's changes waited for these.
                    self.pump_all(key, now);
                }
                return;
            };
            if front.qos == 0 {
                if !self.has_room(connection) {
                    self.connections[&connection]
                        .handle
                        .want_drained
                        .store(true, Relaxed);
                    return;
                }
            } else {
                let session = &self.sessions.by_key[&key];
                if !session.pending.is_empty()
                    || self.queues.window_taken(key, &session.inflight) >= window
                {
                    return;
                }
            }
            let due = self
                .connections
                .get_mut(&connection)
                .and_then(|c| c.retained_backlog.pop_front())
                .expect("front checked above");
            sent_any = true;
            let queued = QueuedMessage {
                message: due.message.into_message(now),
                qos: due.qos,
                retain: true,
                subscription_ids: due.subscription_ids.into(),
                logged: None,
            };
            if queued.qos == 0 {
                self.transmit(connection, queued, 0, due.sys, now);
                if let Some((channel, offset)) = due.channel {
                    // Sent (or dropped and counted): no longer owed.
                    self.value_done(key, channel, offset);
                }
            } else if !self.start_exchange(key, connection, queued, due.channel, now) {
                if let Some((channel, offset)) = due.channel {
                    self.value_done(key, channel, offset);
                }
            }
            if self.doomed.iter().any(|(c, _, _)| *c == connection) {
                return;
            }
        }
    }
}
