//! Inbound PUBLISH and the QoS flows (PUBACK, PUBREC, PUBREL, PUBCOMP),
//! routing, and the delivery windows: each session's in-flight table is
//! bounded by its client's Receive Maximum, the rest waits in its queue.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use super::intent::{Parked, ParkedPublish, Role, StorageFailure, Write};
use super::session::{InflightEntry, InflightPhase, Pending, QueuedMessage};
use super::{BrokerState, Inbound, InboundPublish, Outbound, ReasonCode};
use crate::broker::codec::{self, ByteStr, ProtocolVersion, PublishParts, QoS};
use crate::broker::link::Sent;
use crate::broker::message::{DecimalBuf, Message};
use crate::broker::metrics::{CloseReason, DropReason};
use crate::broker::subscriptions::{merge_matches, Delivery, SessionKey};
use crate::storage::kept::Kept;

impl BrokerState {
    pub(super) fn on_packet(&mut self, connection: u64, packet: Inbound, now: Instant) {
        let Some(conn) = self.connections.get(&connection) else {
            return;
        };
        let key = conn.session;
        let v5 = conn.v5;
        match packet {
            Inbound::Publish(publish) => {
                let answers_pending = !conn.answers.is_empty();
                self.on_publish(connection, key, v5, answers_pending, publish, now)
            }
            Inbound::PubAck { packet_id, reason } => {
                let session = self
                    .sessions
                    .by_key
                    .get_mut(&key)
                    .expect("connected session");
                // A broadcast delivery's exchange ends here, with one
                // look-up; a channel record's takes the longer way.
                let broadcast = session.inflight.remove_if(packet_id, |e| {
                    matches!(e.phase, InflightPhase::AwaitPuback) && e.channel.is_none()
                });
                if let Some(entry) = broadcast {
                    self.exchange_ended(key, entry);
                    self.free_window(key, now);
                    return;
                }
                let session = self
                    .sessions
                    .by_key
                    .get_mut(&key)
                    .expect("connected session");
                let acked = match session.inflight.get_mut(packet_id) {
                    Some(e) if matches!(e.phase, InflightPhase::AwaitPuback) => Some(e.channel),
                    _ => None,
                };
                if let Some(channel) = acked {
                    // A queue's delivery is resolved or released by it.
                    if let Some((channel, offset)) =
                        channel.filter(|(c, _)| self.channels.is_queue(*c))
                    {
                        self.queues.acked(key, channel, offset, packet_id, reason);
                    }
                    self.finish_exchange(key, packet_id);
                    self.free_window(key, now);
                }
            }
            Inbound::PubRec {
                packet_id,
                reason: code,
            } => {
                let session = self
                    .sessions
                    .by_key
                    .get_mut(&key)
                    .expect("connected session");
                match session.inflight.get_mut(packet_id) {
                    Some(entry) if matches!(entry.phase, InflightPhase::AwaitPubrec) => {
                        if code.is_error() {
                            // v5: the receiver refused it; the exchange ends here.
                            self.finish_exchange(key, packet_id);
                            self.free_window(key, now);
                        } else {
                            entry.phase = InflightPhase::AwaitPubcomp;
                            entry.queued = None;
                            let logged = entry.log_offset.is_some();
                            if logged {
                                self.persist.mark_dirty(key);
                            }
                            self.reply(
                                connection,
                                Outbound::PubRel {
                                    packet_id,
                                    reason: ReasonCode::Success,
                                },
                                now,
                            );
                        }
                    }
                    Some(entry) if matches!(entry.phase, InflightPhase::AwaitPubcomp) => {
                        self.reply(
                            connection,
                            Outbound::PubRel {
                                packet_id,
                                reason: ReasonCode::Success,
                            },
                            now,
                        );
                    }
                    Some(_) => {
                        self.doom(connection, CloseReason::Protocol, ReasonCode::ProtocolError)
                    }
                    None => self.reply(
                        connection,
                        Outbound::PubRel {
                            packet_id,
                            reason: ReasonCode::PacketIdentifierNotFound,
                        },
                        now,
                    ),
                }
            }
            Inbound::PubComp { packet_id } => {
                let session = self
                    .sessions
                    .by_key
                    .get_mut(&key)
                    .expect("connected session");
                let ended = session.inflight.remove_if(packet_id, |e| {
                    matches!(e.phase, InflightPhase::AwaitPubcomp)
                });
                if let Some(entry) = ended {
                    self.exchange_ended(key, entry);
                    self.free_window(key, now);
                }
            }
            Inbound::PubRel { packet_id } => {
                let session = self
                    .sessions
                    .by_key
                    .get_mut(&key)
                    .expect("connected session");
                // A PUBREL for nothing held allocates nothing.
                let (known, channel) = match session.rare.allocated_mut() {
                    Some(rare) => (
                        rare.inbound_qos2.remove(&packet_id).is_some(),
                        rare.channel_holds.remove(&packet_id),
                    ),
                    None => (false, None),
                };
                if let (true, Some(channel)) = (known, channel) {
                    // The held record takes its offset now, and the
                    // PUBCOMP waits until it has.
                    let client_id = session.client_id.to_string();
                    self.persist.stage(
                        Role::Channel(channel),
                        Write::Release {
                            client_id,
                            packet_id,
                        },
                    );
                } else if known && session.stored {
                    // The hold goes before the PUBCOMP says the exchange is
                    // over: a hold left behind would swallow the id's next use.
                    let client_id = session.client_id.to_string();
                    self.persist.stage(
                        Role::Sessions,
                        Write::DropHold {
                            client_id,
                            packet_id,
                        },
                    );
                }
                if known {
                    self.park_or_answer(
                        connection,
                        Parked::PubComp {
                            connection,
                            packet_id,
                        },
                        now,
                    );
                } else {
                    self.reply(
                        connection,
                        Outbound::PubComp {
                            packet_id,
                            reason: ReasonCode::PacketIdentifierNotFound,
                        },
                        now,
                    );
                }
            }
            Inbound::Subscribe {
                packet_id,
                subscription_id,
                user_properties,
                filters,
            } => self.on_subscribe(
                connection,
                key,
                packet_id,
                subscription_id,
                &user_properties,
                filters,
                now,
            ),
            Inbound::Unsubscribe { packet_id, filters } => {
                self.on_unsubscribe(connection, key, packet_id, filters, now)
            }
            Inbound::PingReq => self.reply(connection, Outbound::PingResp, now),
            Inbound::Disconnect {
                reason: code,
                session_expiry,
            } => {
                if let Some(asked) = session_expiry {
                    let session = self
                        .sessions
                        .by_key
                        .get_mut(&key)
                        .expect("connected session");
                    if session.expiry_interval == 0 && asked != 0 {
                        // MQTT 5 3.14.2.2.2: a session that was to end with
                        // the connection cannot be made to outlive it here.
                        self.doom(connection, CloseReason::Protocol, ReasonCode::ProtocolError);
                        return;
                    }
                    session.expiry_interval = asked.min(self.limits.max_session_expiry);
                }
                let close_reason = if code == ReasonCode::DisconnectWithWillMessage {
                    CloseReason::ClientDisconnectWithWill
                } else {
                    CloseReason::ClientDisconnect
                };
                self.close(connection, close_reason, None, now);
            }
        }
    }

    /// PUBREC for an exactly-once publish already held: what a duplicate
    /// PUBLISH, or a bridge finding its holds again, is answered.
    pub(super) fn reply_held(&mut self, connection: u64, packet_id: u16, now: Instant) {
        self.reply(
            connection,
            Outbound::PubRec {
                packet_id,
                reason: ReasonCode::Success,
            },
            now,
        );
    }

    /// An exchange ended: `key`'s window has room. Promoted once the
    /// acknowledgements in a row are handled (see [`BrokerState::handle`]).
    fn free_window(&mut self, key: SessionKey, now: Instant) {
        if self.window_freed.is_some_and(|due| due != key) {
            self.promote_due(now);
        }
        self.window_freed = Some(key);
    }

    /// Answer a packet that writes nothing: at once, or behind the answers
    /// its connection still waits for (a CONNACK above all).
    pub(super) fn reply(&mut self, connection: u64, packet: Outbound, now: Instant) {
        if self.must_queue(connection) {
            self.park_or_answer(connection, Parked::Reply { connection, packet }, now);
        } else {
            self.send(connection, packet);
        }
    }

    /// An exchange ended (PUBACK, PUBCOMP, a refusing PUBREC): its log
    /// entry is no longer held by this session.
    fn finish_exchange(&mut self, key: SessionKey, packet_id: u16) {
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        if let Some(entry) = session.inflight.remove(packet_id) {
            self.exchange_ended(key, entry);
        }
    }

    /// `entry`, taken out of `key`'s in-flight table, ended.
    fn exchange_ended(&mut self, key: SessionKey, entry: InflightEntry) {
        if let Some(offset) = entry.log_offset {
            self.persist.unhold_log(Some(key), offset);
        }
        if let Some((channel, offset)) = entry.channel {
            self.channel_acknowledged(key, channel, offset);
        }
    }

    fn on_publish(
        &mut self,
        connection: u64,
        key: SessionKey,
        v5: bool,
        // Answers of this connection still wait for a commit: this one
        // waits behind them.
        answers_pending: bool,
        publish: InboundPublish,
        now: Instant,
    ) {
        self.received += 1;
        let InboundPublish {
            packet_id,
            qos,
            retain,
            dup: _,
            topic,
            payload,
            properties,
        } = publish;
        let session = self.sessions.by_key.get(&key).expect("connected session");
        if qos == 2 && session.rare.inbound_qos2.contains_key(&packet_id) {
            // Method B: already routed; a duplicate only gets PUBREC, once
            // its writes are answered: the answer they get, on this
            // connection too.
            let writing = self
                .sessions
                .by_key
                .get_mut(&key)
                .and_then(|s| s.rare.allocated_mut())
                .and_then(|rare| rare.writing.get_mut(&packet_id));
            match writing {
                Some(asked) => *asked = true,
                None => self.reply_held(connection, packet_id, now),
            }
            return;
        }
        // `$SYS/...` is the broker's own: clients are refused as by the ACL.
        let allowed = !topic.starts_with("$SYS")
            && (!self.authorizer.is_active()
                || self.authorizer.can_publish(
                    session.principal.as_deref(),
                    &session.client_id,
                    &topic,
                ));
        let stored_session = session.stored;
        // A retained publish to a new topic past limits.max_retained is
        // refused: no client grows the broker without bound.
        let over_retained = allowed
            && retain
            && !payload.is_empty()
            && self.retained.len() >= self.limits.max_retained
            && !self.retained.contains(&topic);
        if over_retained {
            tracing::warn!(client_id = %session.client_id, max_retained = self.limits.max_retained, "retained publish refused: limits.max_retained topics are retained already");
            self.refuse_publish(connection, qos, packet_id, ReasonCode::QuotaExceeded);
            return;
        }
        let message = Arc::new(Message {
            topic,
            payload,
            qos,
            retain,
            properties,
            received_at: now,
            channel_offset: None,
            wire: Default::default(),
        });
        if allowed {
            if let Some(channel) = self.channels.of_topic(&message.topic) {
                self.stage_channel_publish(key, channel, packet_id, &message, now);
                let parked = ParkedPublish::unrouted(
                    connection,
                    key,
                    packet_id,
                    message,
                    ReasonCode::Success,
                );
                self.park_or_answer(connection, parked, now);
                return;
            }
        }
        if qos == 2 && (allowed || !v5) {
            // A denied 3.1.1 QoS 2 still completes the handshake: keep the id
            // so a duplicate gets PUBREC and PUBREL gets PUBCOMP.
            let session = self
                .sessions
                .hold_inbound(key, packet_id, now)
                .expect("connected session");
            if v5 && session.rare.inbound_qos2.len() > usize::from(self.limits.receive_maximum) {
                self.doom(
                    connection,
                    CloseReason::Protocol,
                    ReasonCode::ReceiveMaximumExceeded,
                );
                return;
            }
            session.rare.writing.insert(packet_id, false);
            if stored_session {
                // The hold is stored before PUBREC: a restart between the
                // two must still know the id was routed.
                let client_id = self.sessions.by_key[&key].client_id.clone();
                let held = self.held_publish(&client_id, packet_id, &message, now);
                self.persist.stage(Role::Sessions, Write::Hold(held));
            }
        }
        if !allowed {
            let parked = ParkedPublish::unrouted(
                connection,
                key,
                packet_id,
                message,
                ReasonCode::NotAuthorized,
            );
            self.park_or_answer(connection, parked, now);
            return;
        }
        let parts = self.stage_publish(message, Some(key), "", now);
        let publish = ParkedPublish {
            connection: Some(connection),
            packet_id,
            qos,
            message: parts.message,
            publisher: Some(key),
            deliveries: parts.deliveries,
            logged: parts.logged,
            retain_change: parts.retain_change,
            retained_kept: None,
            logged_kept: None,
            code: ReasonCode::Success,
        };
        if answers_pending || self.persist.has_staged() {
            self.park_or_answer(connection, Parked::Publish(Box::new(publish)), now);
        } else {
            // Nothing to store: routed and answered at once.
            self.answer_publish(publish, None, None, now);
        }
    }

    /// A publish refused before anything was written.
    fn refuse_publish(&mut self, connection: u64, qos: u8, packet_id: u16, code: ReasonCode) {
        match qos {
            1 => self.refuse_or_answer(
                connection,
                Outbound::PubAck {
                    packet_id,
                    reason: code,
                },
            ),
            2 => self.refuse_or_answer(
                connection,
                Outbound::PubRec {
                    packet_id,
                    reason: code,
                },
            ),
            _ => self.metrics.dropped(DropReason::QueueFull),
        }
    }

    /// Stage what a publish writes: its retained value and, when a
    /// persistent session is owed it at QoS 1/2, one broadcast log entry.
    /// `client_id` names the publisher when `publisher` is `None` (a Will);
    /// a client's publish looks its id up only when a record is written.
    fn stage_publish(
        &mut self,
        message: Arc<Message>,
        publisher: Option<SessionKey>,
        client_id: &str,
        now: Instant,
    ) -> ParkedPublishParts {
        let publisher_id = |this: &Self| -> Arc<str> {
            publisher
                .and_then(|k| this.sessions.by_key.get(&k))
                .map_or_else(|| Arc::from(client_id), |s| s.client_id.clone())
        };
        let retain_change = message.retain.then(|| !message.payload.is_empty());
        // Topic and payload are parts of one allocation, the rest of which
        // is the packet's other fields (a PUBLISH of 64 KiB or more: of the
        // connection's read buffer, `codec::frame`); a retained message may
        // live for months, so it gets bytes of its own, made once here and
        // shared by the stored record, the deliveries and the retained
        // index.
        let message = if retain_change == Some(true) {
            Arc::new(Message {
                topic: ByteStr::from(&*message.topic),
                payload: Bytes::copy_from_slice(&message.payload),
                ..Message::clone(&message)
            })
        } else {
            message
        };
        match retain_change {
            Some(true) => {
                let id = publisher_id(self);
                let record = self.record_of(&message, &id, now);
                self.persist
                    .stage(Role::Retained, Write::SetRetained(record));
            }
            Some(false) => self.persist.stage(
                Role::Retained,
                Write::DeleteRetained(message.topic.to_string()),
            ),
            None => {}
        }
        let deliveries = self.deliveries_of(&message, publisher);
        let logged = message.qos > 0
            && deliveries.iter().any(|d| {
                self.sessions
                    .owed_durably(d.session, d.qos.min(message.qos))
            });
        if logged {
            let id = publisher_id(self);
            let record = self.record_of(&message, &id, now);
            self.persist.stage(Role::Sessions, Write::AppendLog(record));
        }
        ParkedPublishParts {
            message,
            deliveries,
            logged,
            retain_change,
        }
    }

    /// The writes of QoS 2 publish `p` were answered, `stored` or not: it
    /// is no longer being written. The connection a duplicate of it came
    /// on since, when a later one than `p`'s, is owed the same answer.
    fn qos2_written(&mut self, p: &ParkedPublish, stored: bool) -> Option<u64> {
        let publisher = p.publisher?;
        let key = match self.sessions.by_key.contains_key(&publisher) {
            true => publisher,
            // A bridge's session that ended meanwhile: its hold waits for
            // the bridge's next connection, or has gone to it.
            false => {
                let client_id = self.bridges.hold_written(publisher, p.packet_id, stored)?;
                self.sessions.of_client(&client_id)?
            }
        };
        let session = self.sessions.by_key.get_mut(&key)?;
        let connection = session.connection();
        let rare = session.rare.allocated_mut()?;
        let asked = rare.writing.remove(&p.packet_id)?;
        if !stored && key != publisher {
            rare.inbound_qos2.remove(&p.packet_id);
            rare.channel_holds.remove(&p.packet_id);
        }
        connection.filter(|c| asked && Some(*c) != p.connection)
    }

    /// A publish (from a client, or a Will) whose writes were answered.
    pub(super) fn answer_publish(
        &mut self,
        mut p: ParkedPublish,
        failure: Option<StorageFailure>,
        appended: Option<u64>,
        now: Instant,
    ) {
        let later = match p.qos {
            2 => self.qos2_written(&p, failure.is_none()),
            _ => None,
        };
        if let Some(failure) = failure {
            if let Some(offset) = appended {
                self.persist.release_unheld(offset);
            }
            if let (Some(connection), Some(key)) = (p.connection, p.publisher) {
                if p.qos == 2 {
                    if let Some(rare) = self
                        .sessions
                        .by_key
                        .get_mut(&key)
                        .and_then(|s| s.rare.allocated_mut())
                    {
                        rare.inbound_qos2.remove(&p.packet_id);
                        rare.channel_holds.remove(&p.packet_id);
                    }
                }
                let code = failure.reason_code();
                match p.qos {
                    1 => self.refuse_or_answer(
                        connection,
                        Outbound::PubAck {
                            packet_id: p.packet_id,
                            reason: code,
                        },
                    ),
                    2 => {
                        for connection in std::iter::once(connection).chain(later) {
                            self.refuse_or_answer(
                                connection,
                                Outbound::PubRec {
                                    packet_id: p.packet_id,
                                    reason: code,
                                },
                            );
                        }
                    }
                    _ => self.count_storage_drop(),
                }
            } else {
                self.count_storage_drop();
            }
            return;
        }
        match p.retain_change {
            Some(true) => match p.retained_kept {
                Some(kept) => self.retained.set_kept(&p.message, kept),
                None => self.retained.set(&p.message),
            },
            Some(false) => {
                self.retained.remove(&p.message.topic);
            }
            None => {}
        }
        if p.retain_change.is_some() {
            self.metrics
                .retained
                .store(self.retained.len() as i64, Relaxed);
        }
        if p.code == ReasonCode::Success {
            let offset = if p.logged { appended } else { None };
            if let Some(kept) = p.logged_kept.take() {
                share_logged(&mut p.message, &kept);
            }
            self.fan_out(&p.message, p.deliveries, offset, now);
        }
        if let Some(connection) = p.connection {
            match p.qos {
                1 => self.send(
                    connection,
                    Outbound::PubAck {
                        packet_id: p.packet_id,
                        reason: p.code,
                    },
                ),
                2 => self.send(
                    connection,
                    Outbound::PubRec {
                        packet_id: p.packet_id,
                        reason: p.code,
                    },
                ),
                _ => {}
            }
        }
        if let Some(later) = later {
            // Behind what that connection still waits for.
            self.reply(
                later,
                Outbound::PubRec {
                    packet_id: p.packet_id,
                    reason: p.code,
                },
                now,
            );
        }
    }

    /// Publish a message the broker itself originates (a Will): stored
    /// like a client's, routed once stored.
    pub(super) fn publish_message(&mut self, message: Arc<Message>, client_id: &str, now: Instant) {
        if let Some(channel) = self.channels.of_topic(&message.topic) {
            // A Will into a channel is a record like any other; nobody
            // waits for its answer, and a failure is counted.
            let record = self.record_of(&message, client_id, now);
            self.persist
                .stage(Role::Channel(channel), Write::Append(record));
            self.persist.seal(Parked::Publish(Box::new(ParkedPublish {
                connection: None,
                packet_id: 0,
                qos: 0,
                message,
                publisher: None,
                deliveries: Vec::new(),
                logged: false,
                retain_change: None,
                retained_kept: None,
                logged_kept: None,
                code: ReasonCode::Success,
            })));
            return;
        }
        let qos = message.qos;
        let parts = self.stage_publish(message, None, client_id, now);
        self.seal_or_answer(
            Parked::Publish(Box::new(ParkedPublish {
                connection: None,
                packet_id: 0,
                qos,
                message: parts.message,
                publisher: None,
                deliveries: parts.deliveries,
                logged: parts.logged,
                retain_change: parts.retain_change,
                retained_kept: None,
                logged_kept: None,
                code: ReasonCode::Success,
            })),
            now,
        );
    }

    // ---- routing ------------------------------------------------------

    /// Every session `message` goes to: one delivery per session, at the
    /// highest matching QoS.
    pub(super) fn deliveries_of(
        &mut self,
        message: &Message,
        publisher: Option<SessionKey>,
    ) -> Vec<Delivery> {
        let mut matches = std::mem::take(&mut self.scratch_matches);
        let mut deliveries = std::mem::take(&mut self.scratch_deliveries);
        {
            let sessions = &self.sessions.by_key;
            self.index.matches(
                &message.topic,
                &|k| sessions.get(&k).is_some_and(|s| s.connection().is_some()),
                &mut matches,
            );
        }
        merge_matches(&mut matches, publisher, &mut deliveries);
        self.scratch_matches = matches;
        deliveries
    }

    /// Hand `message` to each of `deliveries`, the payload shared by `Arc`;
    /// persistent sessions owed it at QoS 1/2 hold its log entry `offset`.
    fn fan_out(
        &mut self,
        message: &Arc<Message>,
        mut deliveries: Vec<Delivery>,
        offset: Option<u64>,
        now: Instant,
    ) {
        for d in deliveries.drain(..) {
            let retain = d.retain_as_published && message.retain;
            let qos = d.qos.min(message.qos);
            let log_offset = offset.filter(|_| self.sessions.owed_durably(d.session, qos));
            self.deliver(
                d.session,
                message.clone(),
                qos,
                retain,
                d.subscription_ids,
                false,
                log_offset,
                now,
            );
        }
        if self.scratch_deliveries.capacity() < deliveries.capacity() {
            // Kept for the next publish: routing allocates nothing.
            self.scratch_deliveries = deliveries;
        }
        if let Some(offset) = offset {
            self.persist.release_unheld(offset);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn deliver(
        &mut self,
        key: SessionKey,
        message: Arc<Message>,
        qos: u8,
        retain: bool,
        subscription_ids: Vec<u32>,
        sys: bool,
        log_offset: Option<u64>,
        now: Instant,
    ) {
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        if self.authorizer.is_active()
            && !self.authorizer.can_receive(
                session.principal.as_deref(),
                &session.client_id,
                &message.topic,
            )
        {
            return;
        }
        let queued = QueuedMessage {
            message,
            qos,
            retain,
            subscription_ids: subscription_ids.into(),
            logged: QueuedMessage::logged_at(log_offset),
        };
        if qos == 0 {
            // The fan-out's hot path: no log entry, one look-up each of the
            // session (above) and the connection.
            match session.connection() {
                Some(connection) => self.transmit_qos0(connection, queued, sys, now),
                None => self.metrics.dropped(DropReason::Offline),
            }
            return;
        }
        // What holding the log entry leaves as it is, read now: the session
        // is looked up once more only to start the exchange.
        let connection = session.connection();
        let kept = session.expiry_interval > 0;
        let waiting = !session.pending.is_empty();
        let in_flight = self.queues.window_taken(key, &session.inflight);
        if let Some(offset) = log_offset {
            self.persist.hold_log(key, offset);
        }
        let Some(connection) = connection else {
            if kept {
                self.enqueue(key, queued);
            } else {
                self.metrics.dropped(DropReason::Offline);
            }
            return;
        };
        // Receive Maximum counts every exchange not yet finished by PUBACK,
        // PUBCOMP or a PUBREC >= 0x80 (MQTT 5 3.3.4); with messages already
        // waiting, this one waits behind them.
        self.start_exchange_if(
            key,
            connection,
            queued,
            None,
            |conn| !waiting && in_flight < conn.window(),
            now,
        );
    }

    /// Queue a QoS 1/2 message for a session (offline, or its window
    /// full), up to `limits.max_queued_messages` and
    /// `limits.max_queued_bytes`; more are dropped and counted.
    fn enqueue(&mut self, key: SessionKey, queued: QueuedMessage) {
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return;
        };
        if !session.pending.admits(&queued, self.limits.queue_bound()) {
            self.metrics.dropped(DropReason::QueueFull);
            if let Some(offset) = queued.log_offset() {
                self.persist.unhold_log(Some(key), offset);
            }
        } else {
            session.pending.push_back(queued);
        }
    }

    /// Put a QoS 1/2 message in flight (or drop it, as if delivered, when it
    /// expired or is too large for the client: then false). `channel` is
    /// the channel record it is, whose acknowledgement its consumer waits
    /// for. Every delivery of a fan-out at QoS 1/2 comes here: one look-up
    /// each of the connection and the session.
    pub(super) fn start_exchange(
        &mut self,
        key: SessionKey,
        connection: u64,
        queued: QueuedMessage,
        channel: Option<(u16, u64)>,
        now: Instant,
    ) -> bool {
        self.start_exchange_if(key, connection, queued, channel, |_| true, now)
    }

    /// [`BrokerState::start_exchange`] when `room` says the connection has
    /// room for it; queued for the session when not.
    fn start_exchange_if(
        &mut self,
        key: SessionKey,
        connection: u64,
        queued: QueuedMessage,
        channel: Option<(u16, u64)>,
        room: impl FnOnce(&super::Connection) -> bool,
        now: Instant,
    ) -> bool {
        let Some(conn) = self
            .connections
            .get_mut(&connection)
            .filter(|conn| room(conn))
        else {
            // No room, or going away: kept for the session.
            self.enqueue(key, queued);
            return true;
        };
        let Ok(expiry) = queued.message.expiry_left(now) else {
            return self.not_sent(key, &queued, DropReason::Expired);
        };
        if let Some(max) = conn.max_packet() {
            if delivery_len(&queued, conn.v5) > max as usize {
                return self.not_sent(key, &queued, DropReason::TooLarge);
            }
        }
        let Some(session) = self.sessions.by_key.get_mut(&key) else {
            return false;
        };
        let Some(packet_id) = session.inflight.allocate_id() else {
            self.enqueue(key, queued);
            return true;
        };
        let packet = Outbound::Publish {
            packet_id,
            qos: queued.qos,
            retain: queued.retain,
            dup: false,
            message: queued.message.clone(),
            subscription_ids: queued.subscription_ids.to_vec(),
            expiry,
            sys: false,
        };
        let logged = queued.logged.is_some();
        session
            .inflight
            .push(InflightEntry::sent(packet_id, queued, channel));
        if !conn.queue(packet, self.limits.outbound_queue) {
            self.doomed.push((connection, CloseReason::Network, None));
        }
        if logged {
            self.persist.mark_dirty(key);
        }
        true
    }

    /// A delivery that is not sent: counted and its log entry let go.
    fn not_sent(&mut self, key: SessionKey, queued: &QueuedMessage, why: DropReason) -> bool {
        self.metrics.dropped(why);
        if let Some(offset) = queued.log_offset() {
            self.persist.unhold_log(Some(key), offset);
        }
        false
    }

    /// Is the message still alive, and within the client's maximum packet
    /// size? Counts the drop when not.
    fn fits(&self, connection: u64, queued: &QueuedMessage, now: Instant) -> bool {
        if queued.message.expiry_left(now).is_err() {
            self.metrics.dropped(DropReason::Expired);
            return false;
        }
        if let Some(conn) = self.connections.get(&connection) {
            if let Some(max) = conn.max_packet() {
                let len = delivery_len(queued, conn.v5);
                if len > max as usize {
                    self.metrics.dropped(DropReason::TooLarge);
                    return false;
                }
            }
        }
        true
    }

    pub(super) fn transmit(
        &mut self,
        connection: u64,
        queued: QueuedMessage,
        packet_id: u16,
        sys: bool,
        now: Instant,
    ) {
        if packet_id == 0 && !self.fits(connection, &queued, now) {
            return;
        }
        let Ok(expiry) = queued.message.expiry_left(now) else {
            self.metrics.dropped(DropReason::Expired);
            return;
        };
        self.send(
            connection,
            Outbound::Publish {
                packet_id,
                qos: queued.qos,
                retain: queued.retain,
                dup: false,
                message: queued.message,
                subscription_ids: queued.subscription_ids.into_vec(),
                expiry,
                sys,
            },
        );
    }

    /// A QoS 0 delivery: sent when alive, within the client's maximum
    /// packet size and its writer keeping up; otherwise dropped and counted.
    /// One look-up of the connection: this is the fan-out's hot path.
    fn transmit_qos0(&mut self, connection: u64, queued: QueuedMessage, sys: bool, now: Instant) {
        let limit = self.limits.outbound_queue;
        let Some(conn) = self.connections.get_mut(&connection) else {
            return;
        };
        let Ok(expiry) = queued.message.expiry_left(now) else {
            self.metrics.dropped(DropReason::Expired);
            return;
        };
        if let Some(max) = conn.max_packet() {
            let len = delivery_len(&queued, conn.v5);
            if len > max as usize {
                self.metrics.dropped(DropReason::TooLarge);
                return;
            }
        }
        if conn.waiting() >= limit {
            // The client is not reading what it is sent (as Mosquitto does,
            // QoS 0 to it is dropped and counted, per client and overall).
            self.metrics.dropped(DropReason::SlowConsumer);
            conn.dropped_qos0 += 1;
            conn.handle.want_drained.store(true, Relaxed);
            return;
        }
        let packet = Outbound::Publish {
            packet_id: 0,
            qos: 0,
            retain: queued.retain,
            dup: false,
            message: queued.message,
            subscription_ids: queued.subscription_ids.into_vec(),
            expiry,
            sys,
        };
        match conn
            .handle
            .send_within(packet, self.limits.qos0_byte_bound())
        {
            Sent::Queued => conn.sent = conn.sent.wrapping_add(1),
            Sent::Full => {
                // As for a count reached: `limits.max_queued_bytes` bounds
                // what a client that does not read holds at QoS 0 too.
                self.metrics.dropped(DropReason::SlowConsumer);
                conn.dropped_qos0 += 1;
            }
            Sent::Gone => self.doomed.push((connection, CloseReason::Network, None)),
        }
    }

    /// Move pending messages into flight while the client's window allows,
    /// then whatever retained messages a SUBSCRIBE still owes.
    pub(super) fn promote(&mut self, key: SessionKey, now: Instant) {
        loop {
            let Some(session) = self.sessions.by_key.get_mut(&key) else {
                return;
            };
            let Some(connection) = session.connection() else {
                return;
            };
            let window = self.connections.get(&connection).map_or(0, |c| c.window());
            let unsent = session.inflight.unsent();
            let taken = self.queues.window_taken(key, &session.inflight);
            // What a resumption left unsent has a place counted but not
            // yet used.
            if unsent > 0 && taken - unsent < window {
                // What a resumption left unsent goes before anything new.
                let entry = session.inflight.take_unsent().expect("counted unsent");
                let packet = super::connect::resent(entry, now);
                self.send(connection, packet);
                continue;
            }
            if taken >= window {
                return;
            }
            // Every connect comes here: a session that never queued keeps
            // its queue unallocated.
            let Some(queued) = session.pending.allocated_mut().and_then(Pending::pop_front) else {
                self.send_retained_backlog(connection, now);
                self.pump_all(key, now);
                return;
            };
            self.start_exchange(key, connection, queued, None, now);
            if self.doomed.iter().any(|(c, _, _)| *c == connection) {
                return;
            }
        }
    }
}

/// What staging a publish decided.
pub(super) struct ParkedPublishParts {
    pub message: Arc<Message>,
    pub deliveries: Vec<Delivery>,
    pub logged: bool,
    pub retain_change: Option<bool>,
}

/// The bytes `queued` takes on the wire to a client: the message's
/// properties as the writer sends them, with this delivery's subscription
/// identifiers (the expiry left is of the same size as the interval).
fn delivery_len(queued: &QueuedMessage, v5: bool) -> usize {
    let mut offset = DecimalBuf::default();
    let parts = PublishParts {
        qos: QoS::from_u8(queued.qos).unwrap_or(QoS::ExactlyOnce),
        topic_len: queued.message.topic.len(),
        properties: &queued.message.properties,
        subscription_ids: &queued.subscription_ids,
        extra_user_property: queued.message.offset_property(&mut offset),
        payload_len: queued.message.payload.len(),
    };
    let version = if v5 {
        ProtocolVersion::V5
    } else {
        ProtocolVersion::V311
    };
    // A packet the encoder refuses cannot be sent either.
    codec::publish_len(&parts, version).unwrap_or(usize::MAX)
}

/// Gives `message` the topic and payload of the broadcast log's record of
/// it (`kept`, a memory log's), where nothing else holds the message yet:
/// a message owed to persistent sessions on the memory store is then held
/// once, not as the log's record beside the publish's own copy (its
/// packet's allocation and the share's header, about 130 bytes for a
/// 64-byte payload).
fn share_logged(message: &mut Arc<Message>, kept: &Kept) {
    let Some(message) = Arc::get_mut(message) else {
        return;
    };
    let Some((topic, payload)) = kept.topic_and_payload_shared() else {
        return;
    };
    if let Some(topic) = ByteStr::from_utf8(topic).filter(|t| *t == message.topic) {
        message.topic = topic;
        message.payload = payload;
    }
}
