//! Ending connections and sessions: the Will (with its delay), a
//! persistent session recorded as detached, a session's end, the timers
//! (Will delays, expiry, unreleased QoS 2 holds) and server shutdown.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::intent::{Role, Write};
use super::session::PendingWill;
use super::{BrokerState, Connection, Outbound, ReasonCode, WillRequest};
use crate::broker::message::Message;
use crate::broker::metrics::{CloseReason, DropReason};
use crate::broker::subscriptions::SessionKey;

impl BrokerState {
    /// Drop the connection from the state and tell its tasks to finish: send
    /// DISCONNECT `code` first. A disconnect the broker decides is logged
    /// with its reason.
    pub(super) fn detach_connection(
        &mut self,
        connection: u64,
        reason: CloseReason,
        code: Option<ReasonCode>,
    ) -> Option<Box<Connection>> {
        let mut conn = self.connections.remove(&connection)?;
        if let Some(answers) = conn.answers.take() {
            self.persist.orphan_answers(answers);
        }
        // A latest channel's current values it had not sent yet.
        if let Some(unsent) = conn.retained_backlog.take() {
            self.values_not_sent(conn.session, unsent);
        }
        self.metrics.connections.fetch_sub(1, Relaxed);
        self.metrics.disconnected(reason);
        if conn.dropped_qos0 > 0 {
            tracing::info!(client_id = %self.client_id_of(&conn), dropped = conn.dropped_qos0, "QoS 0 messages were dropped for this client while it did not read");
        }
        if code.is_some() || matches!(reason, CloseReason::Storage) {
            tracing::info!(
                client_id = %self.client_id_of(&conn),
                reason = reason.label(),
                code = %code.map(|c| format!("0x{:02X}", c.as_u8())).unwrap_or_else(|| "none (MQTT 3.1.1)".into()),
                "disconnecting client"
            );
        }
        if let Some(code) = code {
            // The connection's last packet: nothing waits behind it.
            let _ = conn.handle.send(Outbound::Disconnect {
                reason: code,
                reason_string: Some(reason.describe()),
            });
        }
        // The writer finishes what is queued and closes when the state's
        // end of the link (held only here) is dropped; a paused reader is
        // let go.
        conn.handle.set_paused(false);
        if let Some(session) = self.sessions.by_key.get_mut(&conn.session) {
            if session.connection() == Some(connection) {
                session.set_connection(None);
            }
            if session.connecting() == Some(connection) {
                session.set_connecting(None);
            }
        }
        Some(conn)
    }

    /// End `connection` for `reason`: Will handling, then the session either
    /// ends or waits for its expiry (recorded as detached when stored).
    pub(super) fn close(
        &mut self,
        connection: u64,
        reason: CloseReason,
        code: Option<ReasonCode>,
        now: Instant,
    ) {
        let Some(mut conn) = self.detach_connection(connection, reason, code) else {
            return;
        };
        let key = conn.session;
        self.worker_gone(key);
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        let will = conn
            .will
            .take()
            .filter(|_| reason.sends_will() && !self.shutting_down);
        let expiry = session.expiry_interval;
        if let Some(will) = will {
            if will.delay == 0 || expiry == 0 {
                let principal = session.principal.clone();
                let client_id = session.client_id.clone();
                self.publish_will(&will, principal.as_deref(), &client_id, now);
            } else {
                let message = Self::will_message(&will, now);
                let delay = will.delay.min(expiry);
                let session = self.sessions.by_key.get_mut(&key).expect("checked above");
                session.set_pending_will(Some(Box::new(PendingWill {
                    message,
                    publish_at: now + Duration::from_secs(u64::from(delay)),
                    will: *will,
                })));
            }
        }
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        if session.connection().is_some() || session.connecting().is_some() {
            return;
        }
        if expiry == 0 {
            self.end_session(key, now);
        } else {
            session.expires_at = Some(now + Duration::from_secs(u64::from(expiry)));
            let stored = session.stored;
            self.sessions.detach(key);
            self.unindex_consumers(key);
            if stored {
                // Recorded as detached, with its Will and its place in the log.
                self.stage_session(key, now);
                self.persist.seal_background();
            }
        }
    }

    pub(super) fn will_message(will: &WillRequest, now: Instant) -> Arc<Message> {
        Arc::new(Message {
            topic: will.topic.clone(),
            payload: will.payload.clone(),
            qos: will.qos,
            retain: will.retain,
            properties: will.properties.clone(),
            received_at: now,
            channel_offset: None,
            wire: Default::default(),
        })
    }

    pub(super) fn publish_will(
        &mut self,
        will: &WillRequest,
        principal: Option<&str>,
        client_id: &str,
        now: Instant,
    ) {
        if self.shutting_down {
            return;
        }
        if self.authorizer.is_active()
            && !self
                .authorizer
                .can_publish(principal, client_id, &will.topic)
        {
            return;
        }
        let message = Self::will_message(will, now);
        self.publish_message(message, client_id, now);
    }

    /// Forget a session: its subscriptions, queues, stored record and any
    /// pending Will (published now, as the session ends before its delay).
    pub(super) fn end_session(&mut self, key: SessionKey, now: Instant) {
        self.forget_worker(key);
        for raw in self.groups.joined_by(key) {
            self.leave_group(key, &raw);
        }
        self.unindex_consumers(key);
        let Some(mut session) = self.sessions.remove(key) else {
            return;
        };
        // Its QoS 2 publishes it never released end with it, as they do
        // when their hold expires, counted the same way; a bridge's in a
        // channel wait for its next connection instead. One still being
        // written was never answered PUBREC: its writes are answered as
        // any publish's whose connection is gone.
        let unreleased = session
            .rare
            .inbound_qos2
            .keys()
            .filter(|id| session.bridge().is_none() || !session.rare.channel_holds.contains_key(id))
            .filter(|id| !session.rare.writing.contains_key(id))
            .count();
        self.metrics
            .dropped_many(DropReason::ExactlyOnceExpired, unreleased as u64);
        for channel in &mut self.channels.all {
            channel.consumers.remove(&key);
        }
        self.end_consumers(key, &session, now);
        self.metrics.sessions.fetch_sub(1, Relaxed);
        self.sessions.detached.remove(key, session.next_due());
        for (raw, sub) in session.subscriptions.iter() {
            self.metrics.subscriptions.fetch_sub(1, Relaxed);
            self.unindex_subscription(key, raw, sub);
        }
        let held = session
            .inflight
            .iter()
            .filter_map(|e| e.log_offset)
            .chain(session.pending.iter().filter_map(|q| q.log_offset()))
            .collect::<Vec<_>>();
        for offset in held {
            self.persist.unhold_log(None, offset);
        }
        if session.stored {
            let client_id = session.client_id.to_string();
            let mut holds: Vec<u16> = session
                .rare
                .inbound_qos2
                .keys()
                .filter(|id| !session.rare.channel_holds.contains_key(id))
                .copied()
                .collect();
            holds.sort_unstable();
            for packet_id in holds {
                self.persist.stage(
                    Role::Sessions,
                    Write::DropHold {
                        client_id: client_id.clone(),
                        packet_id,
                    },
                );
            }
            self.persist
                .stage(Role::Sessions, Write::RemoveSession(client_id));
        }
        if let Some(will) = session.take_pending_will() {
            if !self.shutting_down {
                self.publish_message(will.message, &session.client_id, now);
            }
        }
    }

    // ---- time -----------------------------------------------------------

    /// What [`tick`](Self::tick) would do for one detached session at `now`:
    /// publish its Will when the delay passed, end it when it expired.
    pub(super) fn settle_due(&mut self, key: SessionKey, now: Instant) {
        if !self.sessions.detached.contains(key) {
            return;
        }
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        let will = session
            .take_pending_will_if(|w| w.publish_at <= now)
            .map(|w| w.message);
        let expired = session.expires_at.is_some_and(|at| at <= now);
        let client_id = session.client_id.clone();
        let stored = session.stored;
        if let Some(will) = will {
            self.publish_message(will, &client_id, now);
            if stored && !expired {
                self.stage_session(key, now);
            }
        }
        if expired {
            self.end_session(key, now);
        } else if self.sessions.detached.contains(key) {
            self.sessions.detach(key);
        }
    }

    /// Publish Wills whose delay passed and end sessions that expired.
    pub fn tick(&mut self, now: Instant) {
        let mut wills = Vec::new();
        let mut expired = Vec::new();
        let due = self.sessions.detached.take_due(now);
        for &key in &due {
            let Some(session) = self.sessions.by_key.get_mut(&key) else {
                continue;
            };
            if let Some(will) = session.take_pending_will_if(|w| w.publish_at <= now) {
                wills.push((key, session.client_id.clone(), will.message));
            }
            if session.expires_at.is_some_and(|at| at <= now) {
                expired.push(key);
            }
        }
        wills.sort_by(|a, b| a.2.topic.cmp(&b.2.topic));
        for (key, client_id, will) in wills {
            self.publish_message(will, &client_id, now);
            if self.sessions.by_key.get(&key).is_some_and(|s| s.stored) && !expired.contains(&key) {
                // Its record no longer carries the Will.
                self.stage_session(key, now);
            }
        }
        expired.sort_unstable();
        for key in expired {
            self.end_session(key, now);
        }
        // Those still detached (a Will published before the expiry) are
        // due again at their next moment.
        for key in due {
            if self.sessions.detached.contains(key) {
                self.sessions.detach(key);
            }
        }
        self.retry_values();
        self.publish_consumer_lag(now);
        self.pump_stalled(now);
        self.run_pumps(now);
        self.tick_queues(now);
        // Unreleased QoS 2 holds: looked at once a minute at most.
        if self.next_exactly_once_sweep.is_none_or(|at| at <= now) {
            self.next_exactly_once_sweep = Some(now + Duration::from_secs(60));
            if let Some(cutoff) = now.checked_sub(self.limits.exactly_once_expires_after) {
                let mut dropped = Vec::new();
                for key in self.sessions.take_holding() {
                    let Some(session) = self.sessions.by_key.get_mut(&key) else {
                        continue;
                    };
                    let mut gone: Vec<u16> = session
                        .rare
                        .inbound_qos2
                        .iter()
                        .filter(|(_, at)| **at <= cutoff)
                        .map(|(id, _)| *id)
                        .collect();
                    gone.sort_unstable();
                    for id in &gone {
                        session.rare.inbound_qos2.remove(id);
                        self.metrics.dropped(DropReason::ExactlyOnceExpired);
                    }
                    for id in gone {
                        let client_id = session.client_id.to_string();
                        match session.rare.channel_holds.remove(&id) {
                            Some(channel) => dropped.push((Role::Channel(channel), client_id, id)),
                            None if session.stored => dropped.push((Role::Sessions, client_id, id)),
                            None => {}
                        }
                    }
                    if !session.rare.inbound_qos2.is_empty() {
                        self.sessions.still_holding(key);
                    }
                }
                for (role, client_id, packet_id) in dropped {
                    let write = if role == Role::Sessions {
                        Write::DropHold {
                            client_id,
                            packet_id,
                        }
                    } else {
                        Write::DropChannelHold {
                            client_id,
                            packet_id,
                        }
                    };
                    self.persist.stage(role, write);
                }
            }
        }
        self.persist.seal_background();
        self.close_doomed(now);
    }

    /// Server shutdown: no Will is published; every v5 client gets
    /// DISCONNECT 0x8B; every connection is told to close; every stored
    /// session is written as detached with its place in the log, and the
    /// log lets go of what nobody holds.
    pub fn shutdown(&mut self, now: Instant) {
        self.shutting_down = true;
        let mut connections: Vec<u64> = self.connections.keys().copied().collect();
        connections.sort_unstable();
        for connection in connections {
            if let Some(mut conn) = self.detach_connection(
                connection,
                CloseReason::Shutdown,
                Some(ReasonCode::ServerShuttingDown),
            ) {
                conn.will = None;
            }
        }
        // A stored session whose Will is forgotten here is written again;
        // every other changed session is written by the flush below, and
        // one that did not change is already stored as it is (rewriting
        // them all cost a restart of 50,000 sessions 26 s to stop).
        let mut stored: Vec<SessionKey> = Vec::new();
        for (key, session) in self.sessions.by_key.iter_mut() {
            if session.take_pending_will().is_some()
                && session.stored
                && session.expiry_interval > 0
            {
                stored.push(*key);
            }
        }
        stored.sort_unstable();
        for key in stored {
            self.stage_session(key, now);
        }
        self.flush(now);
        self.persist.seal_background();
    }
}
