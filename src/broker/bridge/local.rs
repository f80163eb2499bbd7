//! The bridge's connection to the broker state, made inside the process:
//! events on the broker task's queue instead of a socket, answers taken off
//! the connection's outbound queue as a socket writer would take them
//! (counted in `written`, `Drained` sent when the state waits for it).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::broker::metrics::CloseReason;
use crate::broker::state::{
    ConnectRequest, ConnectionHandle, Event, Inbound, Outbound, FROM_PROPERTY,
};
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
    outbound: mpsc::UnboundedReceiver<Outbound>,
    /// Packets taken off `outbound` so far, as a writer counts them.
    written: Arc<AtomicUsize>,
    want_drained: Arc<AtomicBool>,
    pub pause: watch::Receiver<bool>,
    kill: watch::Receiver<bool>,
    low_water: usize,
    batch: Vec<Outbound>,
}

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
        let (outbound_tx, outbound) = mpsc::unbounded_channel();
        let (kill_tx, kill) = watch::channel(false);
        let (pause_tx, pause) = watch::channel(false);
        let written = Arc::new(AtomicUsize::new(0));
        let want_drained = Arc::new(AtomicBool::new(false));
        let handle = ConnectionHandle {
            outbound: outbound_tx,
            written: written.clone(),
            foreign: Arc::new(AtomicUsize::new(0)),
            kill: kill_tx,
            pause: pause_tx,
            want_drained: want_drained.clone(),
        };
        let id = format!("{}{name}", super::CLIENT_ID_PREFIX);
        let request = ConnectRequest {
            v5: true,
            client_id: id.clone(),
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
            written,
            want_drained,
            pause,
            kill,
            low_water: (outbound_queue / 2).max(1),
            batch: Vec::new(),
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
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.outbound.recv()).await {
            Ok(Some(out)) => {
                self.written.fetch_add(1, Relaxed);
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
        tokio::select! {
            biased;
            _ = self.kill.changed() => return Err(LocalGone::Closed("closed by the broker".to_owned())),
            n = self.outbound.recv_many(&mut self.batch, 256) => {
                if n == 0 {
                    return Err(LocalGone::Closed("closed by the broker".to_owned()));
                }
                self.written.fetch_add(n, Relaxed);
                if self.outbound.len() < self.low_water && self.want_drained.swap(false, Relaxed) {
                    let _ = self.events.send(Event::Drained { connection: self.connection }).await;
                }
            }
        }
        Ok(std::mem::take(&mut self.batch))
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
            while self.outbound.recv().await.is_some() {}
        })
        .await;
    }
}
