//! The bridge's connection to the broker state, made inside the process:
//! events on the broker task's queue instead of a socket, answers taken off
//! the connection's outbound queue as a socket writer would take them
//! (counted in `written`, `Drained` sent when the state waits for it).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::broker::link::{self, Outlet};
use crate::broker::metrics::CloseReason;
use crate::broker::state::{ConnectRequest, Event, Inbound, Outbound, FROM_PROPERTY};
use crate::broker::subscriptions::SubOptions;

/// Time the state has to answer the bridge's CONNECT and SUBSCRIBE.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the local side is not (or no longer) connected.
#[derive(Debug)]
pub(super) enum LocalGone {
    /// The broker task is gone (shutdown).
    Stopped,
    /// The state refused or closed the connection.
    Closed(String),
}

/// One in-process connection of a bridge.
pub(super) struct Local {
    pub connection: u64,
    events: mpsc::Sender<Event>,
    /// The connection's end of its queue, counts and pause (`written`
    /// counts what was taken off `pending`, as a writer counts it).
    outbound: Outlet,
    /// Taken off the queue and not handed out yet.
    pending: VecDeque<Outbound>,
    low_water: usize,
}

/// Most answers handed out at a time.
const RECV_BATCH: usize = 256;

/// A channel the local side consumes, as the SUBSCRIBE states it.
pub(super) struct Consume {
    pub channel: String,
    pub qos: u8,
    /// `saguin-from: earliest` for an append channel the bridge has no
    /// stored position in (the state resumes a known one from its position
    /// whatever this says).
    pub earliest: bool,
    /// A latest channel, and whether the bridge starts with its current
    /// values (`from: earliest` and no stored position) or with what
    /// changes after its position or from now on.
    pub latest: Option<bool>,
}

impl Local {
    /// CONNECT as `bridge:<name>` (MQTT 5, so deliveries carry
    /// `saguin-offset`), then one SUBSCRIBE per channel consumed.
    pub async fn connect(
        name: &str,
        receive_maximum: u16,
        consume: &[Consume],
        events: mpsc::Sender<Event>,
        generation: &AtomicU64,
        outbound_queue: usize,
    ) -> Result<Local, LocalGone> {
        let connection = generation.fetch_add(1, Relaxed);
        let (handle, outbound) = link::link();
        let id = format!("{}{name}", super::CLIENT_ID_PREFIX);
        let request = ConnectRequest {
            v5: true,
            client_id: id.as_str().into(),
            clean_start: true,
            keep_alive: 0,
            principal: Some(id.as_str().into()),
            will: None,
            session_expiry: 0,
            receive_maximum: receive_maximum.max(1),
            maximum_packet_size: None,
            request_response_information: false,
            authentication: None,
            bridge: Some(name.into()),
        };
        events
            .send(Event::Connect {
                connection,
                request: Box::new(request),
                handle,
            })
            .await
            .map_err(|_| LocalGone::Stopped)?;
        let mut local = Local {
            connection,
            events,
            outbound,
            pending: VecDeque::new(),
            low_water: (outbound_queue / 2).max(1),
        };
        match local.handshake_answer().await? {
            Outbound::ConnAck { reason, .. } if !reason.is_error() => {}
            Outbound::ConnAck { reason, .. } => {
                return Err(LocalGone::Closed(format!(
                    "the broker refused the bridge's connection (0x{:02X})",
                    reason.as_u8()
                )))
            }
            other => {
                return Err(LocalGone::Closed(format!(
                    "the broker answered CONNECT with {other:?}"
                )))
            }
        }
        for (i, c) in consume.iter().enumerate() {
            let packet_id = u16::try_from(i + 1).unwrap_or(u16::MAX);
            let user_properties = if c.earliest {
                vec![(FROM_PROPERTY.to_owned(), "earliest".to_owned())]
            } else {
                Vec::new()
            };
            local
                .send(vec![Inbound::Subscribe {
                    packet_id,
                    subscription_id: None,
                    user_properties,
                    filters: vec![(
                        format!("{}/#", c.channel),
                        SubOptions {
                            qos: c.qos,
                            no_local: false,
                            // The rule decides whether the flag goes on.
                            retain_as_published: true,
                            // A latest channel's current values only when
                            // the bridge starts with them.
                            retain_handling: if c.latest == Some(false) { 2 } else { 0 },
                            subscription_id: None,
                        },
                    )],
                }])
                .await?;
        }
        Ok(local)
    }

    /// The state's answer to the CONNECT.
    async fn handshake_answer(&mut self) -> Result<Outbound, LocalGone> {
        let next = async {
            if self.pending.is_empty() && !self.outbound.take(&mut self.pending).await {
                return None;
            }
            self.pending.pop_front()
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, next).await {
            Ok(Some(out)) => {
                self.outbound.written.fetch_add(1, Relaxed);
                Ok(out)
            }
            Ok(None) => Err(LocalGone::Stopped),
            Err(_) => Err(LocalGone::Closed(
                "the broker did not answer the bridge's CONNECT".to_owned(),
            )),
        }
    }

    /// Hand packets to the state.
    pub async fn send(&self, packets: Vec<Inbound>) -> Result<(), LocalGone> {
        self.events
            .send(Event::Packets {
                connection: self.connection,
                packets,
                read_order: crate::broker::read_order::next_stamp(),
            })
            .await
            .map_err(|_| LocalGone::Stopped)
    }

    /// The next answers of the state, taken as a writer would take them.
    /// Cancel safe. `Err` when the state closed the connection.
    pub async fn recv(&mut self) -> Result<Vec<Outbound>, LocalGone> {
        let closed = || LocalGone::Closed("closed by the broker".to_owned());
        // Closed as soon as the state let go, before what it left queued.
        let (outbound, pending) = (&self.outbound, &mut self.pending);
        let open = poll_fn(|cx| {
            if outbound.ended() {
                return Poll::Ready(false);
            }
            if !pending.is_empty() {
                return Poll::Ready(true);
            }
            outbound.poll_take(cx, pending)
        })
        .await;
        if !open {
            return Err(closed());
        }
        let n = self.pending.len().min(RECV_BATCH);
        let batch: Vec<Outbound> = self.pending.drain(..n).collect();
        self.outbound.written.fetch_add(n as u32, Relaxed);
        let left = self.pending.len() + self.outbound.queued();
        if left < self.low_water && self.outbound.want_drained.swap(false, Relaxed) {
            let _ = self
                .events
                .send(Event::Drained {
                    connection: self.connection,
                })
                .await;
        }
        Ok(batch)
    }

    /// Whether the state paused the bridge's intake (its answers pile up).
    pub fn paused(&self) -> bool {
        self.outbound.paused()
    }

    /// Tell the state the connection ended, and wait until it closed it:
    /// by then it has staged the bridge's positions.
    pub async fn close(mut self) {
        if self
            .events
            .send(Event::Closed {
                connection: self.connection,
                reason: CloseReason::ClientDisconnect,
                disconnect_reason: None,
            })
            .await
            .is_err()
        {
            return;
        }
        let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            self.pending.clear();
            while self.outbound.take(&mut self.pending).await {
                self.pending.clear();
            }
        })
        .await;
    }
}
