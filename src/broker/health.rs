//! `/healthz` and `/readyz` on the metrics listener: what a supervisor
//! (a Kubernetes probe, a load balancer, `saguin status`) asks of a
//! running broker.
//!
//! - **Live** (`/healthz`): the broker task - the single writer every
//!   client event, commit and tick goes through - finished a turn of its
//!   loop within [`LIVENESS_LIMIT`]. An idle loop still turns at its
//!   500 ms tick, so an old heartbeat means the loop is wedged, not
//!   quiet: a restart is the cure. The systemd watchdog is pinged from
//!   the same place for the same reason.
//! - **Ready** (`/readyz`): every provider was locked, opened and recovered
//!   and every listener bound (the broker serves), the shutdown has not
//!   begun, and no provider has failed (an I/O error, a failed fsync or a
//!   read-only file system: its writes are refused until a restart). A
//!   provider without room is still ready: it takes writes again by
//!   itself once there is room, and its readers go on.
//!
//! Both answers are plain text, one line per fact, so a probe's log shows
//! why.

use std::fmt::Write as _;
use std::time::Duration;

use super::metrics::ProviderHealth;
use crate::storage::contract::Health;

/// How long the broker loop may go without finishing a turn before the
/// broker counts as not live: twenty of its idle ticks. A turn that waits
/// on storage (a sqlite provider's full queue, a disk that stalls) takes
/// milliseconds on a working disk and a capture of a thousand channels'
/// snapshot state a few hundred; ten seconds is past anything but a
/// wedged loop, yet three failed probes ten seconds apart restart it about
/// as soon as systemd's `WatchdogSec=30s` would.
pub const LIVENESS_LIMIT: Duration = Duration::from_secs(10);

/// An HTTP status and a text body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    pub fn reason_phrase(&self) -> &'static str {
        match self.status {
            200 => "OK",
            404 => "Not Found",
            405 => "Method Not Allowed",
            503 => "Service Unavailable",
            _ => "",
        }
    }
}

/// `/healthz`, given how long ago the broker loop last finished a turn.
pub fn liveness(since_last_turn: Duration) -> Answer {
    let ago = format!("{:.3}s", since_last_turn.as_secs_f64());
    if since_last_turn <= LIVENESS_LIMIT {
        Answer {
            status: 200,
            body: format!("live: the broker loop turned {ago} ago\n"),
        }
    } else {
        Answer {
            status: 503,
            body: format!(
                "not live: the broker loop has not turned for {ago} (the limit is {}s)\n",
                LIVENESS_LIMIT.as_secs()
            ),
        }
    }
}

/// `/readyz`, given whether the broker serves (every provider recovered,
/// every listener bound, no shutdown begun) and each provider's health.
pub fn readiness(serving: bool, providers: &[ProviderHealth]) -> Answer {
    let failed = providers
        .iter()
        .any(|p| matches!(p.health, Health::Failed { .. }));
    let ready = serving && !failed;
    let mut body = String::from(if ready { "ready\n" } else { "not ready\n" });
    if !serving {
        body.push_str("broker: not serving (starting or stopping)\n");
    }
    for p in providers {
        let _ = match &p.health {
            Health::Writing => writeln!(body, "provider {}: writing", p.provider),
            Health::NoSpace => writeln!(
                body,
                "provider {}: no space on its file system; writes that need room are refused with 0x83 until there is some",
                p.provider
            ),
            Health::Failed { kind, detail } => writeln!(
                body,
                "provider {}: failed ({}): {detail}; every write is refused until a restart",
                p.provider,
                kind.label()
            ),
        };
    }
    Answer {
        status: if ready { 200 } else { 503 },
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::contract::FaultKind;

    fn provider(name: &str, health: Health) -> ProviderHealth {
        ProviderHealth {
            provider: name.to_owned(),
            health,
        }
    }

    #[test]
    fn live_while_the_loop_turned_within_the_limit() {
        let answer = liveness(Duration::from_millis(400));
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, "live: the broker loop turned 0.400s ago\n");
        assert_eq!(liveness(LIVENESS_LIMIT).status, 200);
    }

    #[test]
    fn not_live_once_the_loop_has_not_turned_for_longer_than_the_limit() {
        let answer = liveness(LIVENESS_LIMIT + Duration::from_millis(1));
        assert_eq!(answer.status, 503);
        assert_eq!(
            answer.body,
            "not live: the broker loop has not turned for 10.001s (the limit is 10s)\n"
        );
    }

    #[test]
    fn ready_while_serving_with_every_provider_writing_or_short_of_room() {
        let answer = readiness(
            true,
            &[
                provider("db", Health::Writing),
                provider("edge", Health::NoSpace),
            ],
        );
        assert_eq!(answer.status, 200);
        assert!(answer.body.starts_with("ready\nprovider db: writing\n"));
        assert!(answer.body.contains("provider edge: no space"));
    }

    #[test]
    fn a_failed_provider_is_not_ready_and_named_with_why() {
        let answer = readiness(
            true,
            &[
                provider("db", Health::Writing),
                provider(
                    "edge",
                    Health::Failed {
                        kind: FaultKind::Io,
                        detail: "writing /var/lib/saguin/edge.db: EIO".into(),
                    },
                ),
            ],
        );
        assert_eq!(answer.status, 503);
        assert_eq!(
            answer.body,
            "not ready\nprovider db: writing\nprovider edge: failed (io): writing /var/lib/saguin/edge.db: EIO; every write is refused until a restart\n"
        );
    }

    #[test]
    fn not_ready_before_serving_or_once_stopping() {
        let answer = readiness(false, &[provider("db", Health::Writing)]);
        assert_eq!(answer.status, 503);
        assert!(answer
            .body
            .starts_with("not ready\nbroker: not serving (starting or stopping)\n"));
    }
}
