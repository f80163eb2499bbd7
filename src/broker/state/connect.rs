//! CONNECT: client identifiers, session ownership, takeover, a session
//! begun or resumed (and stored before its CONNACK), and the resend of
//! unfinished exchanges on resume.

use crate::broker::lazy::Lazy;
use crate::broker::long_lived;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::time::Instant;

use super::intent::{Parked, Role, StorageFailure, Write};
use super::session::{InflightEntry, InflightPhase, Session};
use super::{
    BrokerState, ConnAckExtras, ConnectRequest, Connection, ConnectionHandle, KeepAlive, Outbound,
    ReasonCode,
};
use crate::broker::metrics::CloseReason;
use crate::broker::subscriptions::SessionKey;

impl BrokerState {
    pub(super) fn on_connect(
        &mut self,
        connection: u64,
        request: ConnectRequest,
        handle: ConnectionHandle,
        now: Instant,
    ) {
        if self.shutting_down {
            let _ = handle.send(Outbound::Disconnect {
                reason: ReasonCode::ServerShuttingDown,
                reason_string: Some(CloseReason::Shutdown.describe()),
            });
            return;
        }
        let principal = request.principal.clone();
        let refuse = |handle: &ConnectionHandle, code: ReasonCode, client_id: &str, why: &str| {
            tracing::info!(
                client_id,
                principal = principal.as_deref().unwrap_or("(anonymous)"),
                reason = %format!("0x{:02X}", code.as_u8()),
                "connection refused: {why}"
            );
            let _ = handle.send(Outbound::refusing_connack(code));
        };
        let keep_alive =
            KeepAlive::grant(self.limits.max_keep_alive, request.v5, request.keep_alive);
        if keep_alive == KeepAlive::Refused {
            self.metrics.disconnected(CloseReason::ConnectRefused);
            refuse(
                &handle,
                ReasonCode::ClientIdentifierNotValid,
                &request.client_id,
                "MQTT 3.1.1 keep alive above limits.max_keep_alive (or 0)",
            );
            return;
        }
        let mut assigned = None;
        let client_id: Arc<str> = if request.client_id.is_empty() {
            if !request.v5 && !request.clean_start {
                self.metrics.disconnected(CloseReason::ConnectRefused);
                refuse(
                    &handle,
                    ReasonCode::ClientIdentifierNotValid,
                    "",
                    "an empty client id needs clean session 1",
                );
                return;
            }
            let id: Arc<str> =
                format!("saguin-{}-{}", self.sessions.next_assigned_id, connection).into();
            self.sessions.next_assigned_id += 1;
            assigned = Some(id.clone());
            id
        } else {
            request.client_id.clone()
        };
        // 3.1.1 clean session 0 keeps the session as long as the broker allows.
        let wanted_expiry = if request.v5 {
            request.session_expiry
        } else if request.clean_start {
            0
        } else {
            u32::MAX
        };
        let expiry = wanted_expiry.min(self.limits.max_session_expiry);

        // The timer may not have run yet: a Will whose delay passed, or a
        // session whose expiry passed, is settled before this CONNECT sees it.
        if let Some(key) = self.sessions.of_client(&client_id) {
            self.settle_due(key, now);
        }
        // The session kept for the client, when it goes on.
        let mut present = None;
        if let Some(key) = self.sessions.of_client(&client_id) {
            let (owner_differs, old_connection, ends_with_connection) = {
                let s = &self.sessions.by_key[&key];
                (
                    s.principal != request.principal,
                    s.connection().or(s.connecting()),
                    s.expiry_interval == 0,
                )
            };
            if owner_differs {
                self.metrics.disconnected(CloseReason::ConnectRefused);
                refuse(
                    &handle,
                    ReasonCode::NotAuthorized,
                    &client_id,
                    "the session belongs to another principal",
                );
                return;
            }
            if let Some(old) = old_connection {
                // Takeover: the old connection's Will goes now unless its
                // delay is running and the session continues.
                if let Some(conn) = self.connections.get_mut(&old) {
                    if let Some(will) = conn.will.take() {
                        if will.delay == 0 || request.clean_start || ends_with_connection {
                            let principal = self.sessions.by_key[&key].principal.clone();
                            self.publish_will(&will, principal.as_deref(), &client_id, now);
                        }
                    }
                }
                self.detach_connection(
                    old,
                    CloseReason::TakenOver,
                    Some(ReasonCode::SessionTakenOver),
                );
            }
            // A session with expiry 0 ends with its connection (MQTT 5
            // 3.1.2.11.2; 3.1.1 clean session 1), and a takeover closes that
            // connection: the new one starts afresh.
            if request.clean_start || (old_connection.is_some() && ends_with_connection) {
                self.end_session(key, now);
            } else {
                present = Some(key);
            }
        }
        let session_present = present.is_some();
        if !session_present
            && expiry > 0
            && self.sessions.stored_count() >= self.limits.max_sessions
        {
            self.metrics.disconnected(CloseReason::ConnectRefused);
            tracing::warn!(
                client_id = %client_id,
                max_sessions = self.limits.max_sessions,
                "connection refused: limits.max_sessions persistent sessions are kept already"
            );
            // What ending an old session staged still has to be written.
            self.persist.seal_background();
            refuse(
                &handle,
                ReasonCode::QuotaExceeded,
                &client_id,
                "limits.max_sessions reached",
            );
            return;
        }

        let key = if let Some(key) = present {
            key
        } else {
            let key = self.sessions.next_key;
            self.sessions.next_key += 1;
            // Long-lived, as the connection's entry below: made in pages
            // the short-lived blocks of a CONNECT do not share.
            let session = long_lived::make(|| {
                Box::new(Session::new(client_id.clone(), request.principal.clone()))
            });
            self.sessions.insert(key, session);
            self.metrics.sessions.fetch_add(1, Relaxed);
            key
        };
        self.sessions.attach(key);
        let receive_maximum = if request.bridge.is_some() {
            // The broker's own bridge: its window is its `max_inflight`
            // and the reservoir read ahead of the remote's, not a client's.
            request.receive_maximum.max(1)
        } else if request.v5 {
            request
                .receive_maximum
                .min(self.limits.max_inflight_messages)
                .max(1)
        } else {
            self.limits.max_inflight_messages.max(1)
        };
        let was_stored = {
            let session = self.sessions.by_key.get_mut(&key).expect("inserted above");
            session.set_connecting(Some(connection));
            session.set_bridge(request.bridge.clone());
            session.expiry_interval = expiry;
            session.expires_at = None;
            session.window = receive_maximum;
            // A new connection before the Will delay passed cancels the Will.
            session.set_pending_will(None);
            session.stored
        };
        self.sessions.set_stored(key, expiry > 0);
        let entry = long_lived::make(|| {
            Box::new(Connection {
                handle,
                session: key,
                v5: request.v5,
                receive_maximum,
                maximum_packet_size: request
                    .maximum_packet_size
                    .and_then(std::num::NonZeroU32::new),
                will: request.will.map(Box::new),
                answers: Lazy::new(),
                dropped_qos0: 0,
                sent: 0,
                retained_backlog: Lazy::new(),
            })
        });
        self.connections.insert(connection, entry);
        self.metrics.connections.fetch_add(1, Relaxed);
        if expiry > 0 {
            // Session begun or resumed: stored before the CONNACK says so.
            self.stage_session(key, now);
        } else if was_stored {
            // A stored session resumed with expiry 0 now ends with this
            // connection: nothing of it outlives the broker any more.
            self.persist
                .stage(Role::Sessions, Write::RemoveSession(client_id.to_string()));
        }
        // A basis for response topics; the ACL applies to it as to any
        // topic (grant `response/%c/#`).
        let response_information = (request.v5 && request.request_response_information)
            .then(|| Arc::<str>::from(format!("response/{client_id}/")));
        let extras = (assigned.is_some()
            || response_information.is_some()
            || request.authentication.is_some())
        .then(|| {
            Box::new(ConnAckExtras {
                assigned_client_id: assigned,
                response_information,
                authentication: request.authentication.clone(),
            })
        });
        let ack = Outbound::ConnAck {
            session_present,
            reason: ReasonCode::Success,
            session_expiry: (request.v5 && expiry != wanted_expiry).then_some(expiry),
            receive_maximum: self.limits.receive_maximum,
            maximum_packet_size: self.limits.max_packet_size,
            topic_alias_maximum: self.limits.topic_alias_maximum,
            server_keep_alive: match keep_alive {
                KeepAlive::Held {
                    seconds,
                    server_keep_alive: true,
                } => Some(seconds),
                _ => None,
            },
            extras,
        };
        let parked = Parked::ConnAck {
            connection,
            key,
            ack,
            replay: session_present,
        };
        self.park_or_answer(connection, parked, now);
        if request.bridge.is_some() {
            self.resume_bridge_holds(connection, key, now);
        }
    }

    /// A bridge's session is made anew on each connection; the QoS 2
    /// publishes it left held are its again, each said with a PUBREC (the
    /// answer it had when it was held), so the bridge knows what waits
    /// for its release.
    fn resume_bridge_holds(&mut self, connection: u64, key: SessionKey, now: Instant) {
        let Some(session) = self.sessions.by_key.get(&key) else {
            return;
        };
        let Some(mut holds) = self.bridges.take_holds(&session.client_id) else {
            return;
        };
        holds.sort_unstable();
        for hold in &holds {
            let session = self
                .sessions
                .hold_inbound(key, hold.packet_id, hold.held_at)
                .expect("looked up above");
            session
                .rare
                .channel_holds
                .insert(hold.packet_id, hold.channel);
            if hold.writing {
                // Answered as its write is.
                session.rare.writing.insert(hold.packet_id, true);
            }
        }
        for hold in holds.into_iter().filter(|h| !h.writing) {
            self.reply_held(connection, hold.packet_id, now);
        }
    }

    /// The session write of a CONNECT was answered.
    pub(super) fn answer_connect(
        &mut self,
        connection: u64,
        key: SessionKey,
        ack: Outbound,
        replay: bool,
        failure: Option<StorageFailure>,
        now: Instant,
    ) {
        let current = self
            .sessions
            .by_key
            .get(&key)
            .is_some_and(|s| s.connecting() == Some(connection));
        if !current || !self.connections.contains_key(&connection) {
            // Taken over or closed while its session was being written.
            return;
        }
        if let Some(failure) = failure {
            let conn = &self.connections[&connection];
            tracing::warn!(client_id = %self.client_id_of(conn), error = %failure.message, "connection refused: its session could not be stored");
            if conn.v5 {
                if let Outbound::ConnAck { extras, .. } = ack {
                    let mut refusal = Outbound::refusing_connack(failure.reason_code());
                    // The refusal names the identifier it assigned, and
                    // nothing else the success would have said.
                    let assigned_client_id = extras.and_then(|e| e.assigned_client_id);
                    if let Outbound::ConnAck { extras, .. } = &mut refusal {
                        *extras = assigned_client_id.map(|id| {
                            Box::new(ConnAckExtras {
                                assigned_client_id: Some(id),
                                ..ConnAckExtras::default()
                            })
                        });
                    }
                    self.send(connection, refusal);
                }
            }
            // Nothing of a session that could not be stored stays in memory
            // either: it ends with this connection, without its Will.
            if let Some(conn) = self.connections.get_mut(&connection) {
                conn.will = None;
            }
            if let Some(session) = self.sessions.by_key.get_mut(&key) {
                session.expiry_interval = 0;
            }
            self.sessions.set_stored(key, false);
            self.doomed.push((connection, CloseReason::Storage, None));
            return;
        }
        if let Some(session) = self.sessions.by_key.get_mut(&key) {
            session.set_connecting(None);
            session.set_connection(Some(connection));
            if !session.consumers.is_empty() {
                self.channels.attached.insert(key);
                self.channels.back.push(key);
                self.index_consumers(key);
                // Moved by a read answered while it was away, perhaps.
                self.place_moved(key);
            }
        }
        self.send(connection, ack);
        if replay {
            self.replay(connection, key, now);
        }
        self.promote(key, now);
    }

    /// Resend the unfinished exchanges in their original order, as many
    /// as the client's window takes now ([`Inflight::resume`]; the rest
    /// follow as it acknowledges, before anything new): PUBLISH with DUP=1
    /// and the same packet id, or PUBREL for those awaiting PUBCOMP.
    fn replay(&mut self, connection: u64, key: SessionKey, now: Instant) {
        let window = self.connections.get(&connection).map_or(0, |c| c.window());
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        session.inflight.resume(window);
        let packets: Vec<Outbound> = session
            .inflight
            .iter()
            .filter(|entry| !entry.unsent)
            .map(|entry| resent(entry, now))
            .collect();
        for packet in packets {
            self.send(connection, packet);
        }
    }
}

/// An unfinished exchange sent again on a new connection. A resent
/// PUBLISH carries the expiry left at `now` (MQTT-3.3.2-6); one whose
/// lifetime ran out while in flight is still resent, as its delivery had
/// started (MQTT-4.4.0-1), with 0 left.
pub(super) fn resent(entry: &InflightEntry, now: Instant) -> Outbound {
    match (&entry.phase, &entry.queued) {
        (InflightPhase::AwaitPubcomp, _) | (_, None) => Outbound::PubRel {
            packet_id: entry.packet_id,
            reason: ReasonCode::Success,
        },
        (_, Some(q)) => Outbound::Publish {
            packet_id: entry.packet_id,
            qos: q.qos,
            retain: q.retain,
            dup: true,
            message: q.message.clone(),
            subscription_ids: q.subscription_ids.to_vec(),
            expiry: q.message.expiry_left(now).unwrap_or(Some(0)),
            sys: false,
        },
    }
}
