//! systemd's service notification protocol (`sd_notify(3)`), for `saguin
//! serve` under a `Type=notify` unit.
//!
//! When `NOTIFY_SOCKET` is set, each notification is one datagram of
//! newline-separated `KEY=value` assignments sent to that unix socket: a
//! path, or an abstract socket name when it starts with `@`. What the broker
//! sends, and when:
//!
//! - `STATUS=` while it starts (locking and recovering the providers,
//!   restoring the state) and while it stops (every change of the
//!   [`ShutdownStatus`](super::providers::ShutdownStatus): which files are
//!   still being written);
//! - `READY=1` once every provider is recovered and every listener is bound,
//!   never before;
//! - `STOPPING=1` when the first SIGTERM or SIGINT arrives, or when the broker
//!   task fails;
//! - `WATCHDOG=1` every half of `WATCHDOG_USEC` when that is set (and
//!   `WATCHDOG_PID`, if set, is this process), sent by the broker task from
//!   its own loop: a broker task that stops turning stops the pings, and
//!   systemd restarts the service. The pings end with that loop at
//!   shutdown, after `STOPPING=1`: from then on the stop timeout
//!   (`TimeoutStopSec=`) is what bounds the broker, not the watchdog.
//!
//! Datagrams are sent without blocking: a supervisor that is not reading
//! never stalls the broker. A notification that cannot be sent is logged and
//! the broker goes on (systemd then acts on the missing READY or WATCHDOG).

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// The environment variable naming the supervisor's socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
/// The watchdog timeout in microseconds, set by systemd with `WatchdogSec=`.
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
/// The process the watchdog timeout is meant for, when set.
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// Why notifications cannot be sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("{NOTIFY_SOCKET}={0:?} is neither an absolute socket path nor an abstract name starting with '@'")]
    UnsupportedAddress(String),
    #[error("{NOTIFY_SOCKET}={target:?}: {source}")]
    Socket { target: String, source: io::Error },
    #[error("{WATCHDOG_USEC}={0:?} is not a positive number of microseconds")]
    BadWatchdog(String),
}

/// A connection to the supervisor's notification socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    /// `NOTIFY_SOCKET` as given, for log lines.
    target: String,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` asks for: `Ok(None)` when it is unset
    /// or empty (not under a notify supervisor).
    pub fn from_env() -> Result<Option<Arc<Notifier>>, NotifyError> {
        match std::env::var(NOTIFY_SOCKET) {
            Ok(target) if !target.is_empty() => {
                Notifier::connect(&target).map(|n| Some(Arc::new(n)))
            }
            _ => Ok(None),
        }
    }

    /// A notifier sending to `target`: an absolute path, or `@name` for the
    /// abstract socket `name`.
    pub fn connect(target: &str) -> Result<Notifier, NotifyError> {
        let socket_error = |source| NotifyError::Socket {
            target: target.to_owned(),
            source,
        };
        let addr = if let Some(name) = target.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes()).map_err(socket_error)?
        } else if target.starts_with('/') {
            SocketAddr::from_pathname(target).map_err(socket_error)?
        } else {
            return Err(NotifyError::UnsupportedAddress(target.to_owned()));
        };
        let socket = UnixDatagram::unbound().map_err(socket_error)?;
        socket.set_nonblocking(true).map_err(socket_error)?;
        Ok(Notifier {
            socket,
            addr,
            target: target.to_owned(),
        })
    }

    /// Send one notification; a failure is logged, never fatal.
    fn send(&self, message: &str) {
        if let Err(err) = self.socket.send_to_addr(message.as_bytes(), &self.addr) {
            let what = message.split('\n').next().unwrap_or_default();
            tracing::warn!(socket = %self.target, message = what, error = %err, "cannot notify the supervisor");
        }
    }

    /// `STATUS=`: what the broker is doing, one line.
    pub fn status(&self, text: &str) {
        self.send(&format!("STATUS={}", one_line(text)));
    }

    /// `READY=1` with a status line: every provider is recovered and every
    /// listener bound.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// `STOPPING=1` with a status line: the broker is shutting down.
    pub fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    /// `WATCHDOG=1`: the broker task is turning.
    pub fn watchdog_ping(&self) {
        self.send("WATCHDOG=1");
    }
}

/// A status text on one line: a newline would start another assignment.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// The interval to ping at for `WATCHDOG_USEC` / `WATCHDOG_PID` as given:
/// half the timeout (as `sd_watchdog_enabled(3)` advises), or `None` when
/// no watchdog is asked of this process.
pub fn watchdog_interval(
    usec: Option<&str>,
    pid: Option<&str>,
    own_pid: u32,
) -> Result<Option<Duration>, NotifyError> {
    let Some(usec) = usec.filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    // A watchdog meant for another process (a parent that exported it) is
    // not this one's to keep.
    if let Some(pid) = pid.filter(|p| !p.is_empty()) {
        if pid.trim().parse::<u32>().ok() != Some(own_pid) {
            return Ok(None);
        }
    }
    match usec.trim().parse::<u64>() {
        Ok(us) if us > 0 => Ok(Some(Duration::from_micros(us) / 2)),
        _ => Err(NotifyError::BadWatchdog(usec.to_owned())),
    }
}

/// The pings the broker task owes the supervisor's watchdog.
#[derive(Debug)]
pub struct Watchdog {
    notifier: Arc<Notifier>,
    interval: Duration,
    next: Instant,
}

impl Watchdog {
    /// The watchdog `WATCHDOG_USEC` asks for, pinging through `notifier`.
    pub fn from_env(notifier: Arc<Notifier>) -> Result<Option<Watchdog>, NotifyError> {
        let usec = std::env::var(WATCHDOG_USEC).ok();
        let pid = std::env::var(WATCHDOG_PID).ok();
        let interval = watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id())?;
        Ok(interval.map(|interval| Watchdog::new(notifier, interval)))
    }

    /// Pings every `interval`, the first at once.
    pub fn new(notifier: Arc<Notifier>, interval: Duration) -> Watchdog {
        Watchdog {
            notifier,
            interval,
            next: Instant::now(),
        }
    }

    /// How often it pings.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Ping when one is due. Called by the broker task after each turn of
    /// its loop, so a busy loop pings as surely as an idle one.
    pub fn ping_if_due(&mut self, now: Instant) {
        if now >= self.next {
            self.notifier.watchdog_ping();
            self.next = now + self.interval;
        }
    }
}

/// Completes when `watchdog` has a ping due (never without a watchdog):
/// wakes an idle broker task to send it.
pub async fn ping_due(watchdog: &Option<Watchdog>) {
    match watchdog {
        Some(w) => tokio::time::sleep_until(w.next).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_pings_at_half_its_timeout() {
        assert_eq!(
            watchdog_interval(Some("30000000"), None, 7).unwrap(),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_interval(Some("30000000"), Some("7"), 7).unwrap(),
            Some(Duration::from_secs(15))
        );
    }

    #[test]
    fn no_watchdog_unless_asked_of_this_process() {
        assert_eq!(watchdog_interval(None, None, 7).unwrap(), None);
        assert_eq!(watchdog_interval(Some(""), None, 7).unwrap(), None);
        assert_eq!(
            watchdog_interval(Some("30000000"), Some("8"), 7).unwrap(),
            None
        );
    }

    #[test]
    fn a_bad_watchdog_timeout_is_named() {
        for bad in ["0", "-5", "soon"] {
            let err = watchdog_interval(Some(bad), None, 7).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn a_relative_or_foreign_address_is_refused() {
        for bad in ["relative/sock", "vsock:2:1234"] {
            let err = Notifier::connect(bad).unwrap_err();
            assert!(matches!(err, NotifyError::UnsupportedAddress(_)), "{err}");
        }
    }

    fn recv(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn notifications_reach_a_path_socket_one_datagram_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let supervisor = UnixDatagram::bind(&path).unwrap();
        supervisor
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let notifier = Notifier::connect(path.to_str().unwrap()).unwrap();
        notifier.status("recovering\nproviders");
        notifier.ready("serving");
        notifier.stopping("stopping");
        assert_eq!(recv(&supervisor), "STATUS=recovering providers");
        assert_eq!(recv(&supervisor), "READY=1\nSTATUS=serving");
        assert_eq!(recv(&supervisor), "STOPPING=1\nSTATUS=stopping");
    }

    #[test]
    fn notifications_reach_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("saguin-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let supervisor = UnixDatagram::bind_addr(&addr).unwrap();
        supervisor
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let notifier = Notifier::connect(&format!("@{name}")).unwrap();
        notifier.watchdog_ping();
        assert_eq!(recv(&supervisor), "WATCHDOG=1");
    }

    #[tokio::test]
    async fn a_watchdog_pings_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let supervisor = UnixDatagram::bind(&path).unwrap();
        supervisor.set_nonblocking(true).unwrap();
        let notifier = Arc::new(Notifier::connect(path.to_str().unwrap()).unwrap());
        let mut watchdog = Some(Watchdog::new(notifier, Duration::from_millis(20)));
        let w = watchdog.as_mut().unwrap();
        w.ping_if_due(Instant::now());
        w.ping_if_due(Instant::now());
        let mut buf = [0u8; 64];
        assert_eq!(supervisor.recv(&mut buf).unwrap(), b"WATCHDOG=1".len());
        let second = supervisor.recv(&mut buf);
        assert!(
            second.is_err(),
            "a second ping before the interval: {second:?}"
        );
        // The next ping is due once the interval has passed, and then sent.
        ping_due(&watchdog).await;
        watchdog.as_mut().unwrap().ping_if_due(Instant::now());
        assert_eq!(supervisor.recv(&mut buf).unwrap(), b"WATCHDOG=1".len());
    }
}
