//! A bridge's supervisor: its link is run again after a panic, as after a
//! network failure, until the broker stops.
//!
//! A panic in a link would otherwise end its thread (or its task) with a
//! message on stderr only: nothing logged, nothing counted, and the bridge
//! never running again while the broker goes on serving without it. Here
//! the panic is caught where the run is polled, logged at ERROR with the
//! bridge's name and the panic's message, counted in
//! `saguin_bridge_failures_total`, and a fresh run is made after the
//! bridge's reconnect backoff (`reconnect.base` doubling up to
//! `reconnect.cap`). A stop ends the wait at once.

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tokio::time::Instant;

use super::remote::Backoff;
use crate::broker::metrics::BridgeMetrics;

/// Runs one bridge's link again each time it fails.
pub(super) struct Supervisor {
    /// The bridge's name, for the log.
    pub name: String,
    /// Where failures are counted (`failures`).
    pub metrics: Arc<BridgeMetrics>,
    /// The wait before each restart: the bridge's reconnect policy.
    pub backoff: Backoff,
    /// A run that lasted this long was healthy: the next failure waits
    /// the backoff's base again rather than where earlier failures left it.
    pub healthy_after: std::time::Duration,
    /// The broker's stop: true once the bridges are to end.
    pub stop: watch::Receiver<bool>,
}

impl Supervisor {
    /// Run what `make` makes until a run returns (runs return only when
    /// the bridge is stopped) or the stop. A run that panics (or a `make`
    /// that does) is logged and counted, `after_failure` cleans up what it
    /// left, and after the backoff `make` is asked for a fresh run.
    pub async fn run<R, A>(
        mut self,
        mut make: impl FnMut() -> R,
        mut after_failure: impl FnMut() -> A,
    ) where
        R: Future<Output = ()>,
        A: Future<Output = ()>,
    {
        loop {
            let started = Instant::now();
            let outcome = match catch_unwind(AssertUnwindSafe(&mut make)) {
                Ok(run) => CatchPanic(Box::pin(run)).await,
                Err(panic) => Err(panic),
            };
            let Err(panic) = outcome else {
                return;
            };
            let message = panic_message(panic.as_ref());
            self.metrics.failures.fetch_add(1, Relaxed);
            if started.elapsed() >= self.healthy_after {
                self.backoff.reset();
            }
            let delay = self.backoff.next_delay();
            let retry_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            let stopping = *self.stop.borrow();
            if stopping {
                tracing::error!(bridge = %self.name, panic = %message,
                    "bridge failed while stopping; not started again");
            } else {
                tracing::error!(bridge = %self.name, panic = %message, retry_ms,
                    "bridge failed; started again in {retry_ms} ms");
            }
            after_failure().await;
            if stopping {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                // An error is the sender gone: the bridges are gone too.
                _ = self.stop.wait_for(|stopped| *stopped) => return,
            }
        }
    }
}

/// A run, its panic caught where it is polled: `Err` with the panic's
/// payload. The run is never polled again after a panic, only dropped, so
/// nothing it left half changed is used again; what it shares with the
/// rest of the broker is atomics, channels and mutexes that do not
/// poison, and what it held in the broker state is let go by
/// `after_failure`.
struct CatchPanic<F>(Pin<Box<F>>);

impl<F: Future<Output = ()>> Future for CatchPanic<F> {
    type Output = Result<(), Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let run = self.get_mut().0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| run.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// What a panic said: `panic!` with a literal carries a `&str`, with a
/// format a `String`; anything else has no message to give.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::sync::mpsc;

    const BASE: Duration = Duration::from_secs(5);
    const CAP: Duration = Duration::from_secs(60);

    fn supervisor(stop: watch::Receiver<bool>) -> (Supervisor, Arc<BridgeMetrics>) {
        let metrics = Arc::new(BridgeMetrics::default());
        let supervisor = Supervisor {
            name: "cloud".to_owned(),
            metrics: metrics.clone(),
            backoff: Backoff::new(BASE, CAP, 7),
            healthy_after: CAP,
            stop,
        };
        (supervisor, metrics)
    }

    /// The first run panics; the second is made after the backoff, and
    /// runs until the stop. The panic is counted once, and what the failed
    /// run left is cleaned up once, before the restart.
    #[tokio::test(start_paused = true)]
    async fn a_run_that_panics_is_counted_and_started_again_after_the_backoff() {
        let (stop_tx, stop) = watch::channel(false);
        let (supervisor, metrics) = supervisor(stop.clone());
        let made = Arc::new(AtomicUsize::new(0));
        let cleaned = Arc::new(AtomicUsize::new(0));
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let failed_at = Arc::new(std::sync::Mutex::new(None));
        let make = {
            let (made, started_tx, stop) = (made.clone(), started_tx.clone(), stop.clone());
            move || {
                let n = made.fetch_add(1, Relaxed);
                let (started_tx, mut stop) = (started_tx.clone(), stop.clone());
                async move {
                    tokio::task::yield_now().await;
                    if n == 0 {
                        panic!("a link's first run fails");
                    }
                    let _ = started_tx.send(Instant::now());
                    let _ = stop.wait_for(|s| *s).await;
                }
            }
        };
        let after_failure = {
            let (cleaned, failed_at) = (cleaned.clone(), failed_at.clone());
            move || {
                cleaned.fetch_add(1, Relaxed);
                *failed_at.lock().unwrap() = Some(Instant::now());
                async {}
            }
        };
        let supervised = tokio::spawn(supervisor.run(make, after_failure));

        let restarted_at = started.recv().await.expect("the bridge was started again");
        assert_eq!(made.load(Relaxed), 2);
        assert_eq!(metrics.failures.load(Relaxed), 1, "the panic is counted");
        assert_eq!(cleaned.load(Relaxed), 1);
        let failed_at = failed_at
            .lock()
            .unwrap()
            .expect("cleaned up after the failure");
        let waited = restarted_at - failed_at;
        assert!(
            waited >= BASE / 2 && waited <= BASE,
            "the restart waited the backoff's first step: {waited:?}"
        );

        stop_tx.send(true).unwrap();
        supervised.await.expect("the supervisor ends at the stop");
        assert_eq!(
            made.load(Relaxed),
            2,
            "a run that returned is not made again"
        );
        assert_eq!(metrics.failures.load(Relaxed), 1);
    }

    /// Every run panics, and the backoff is an hour: a stop while the
    /// supervisor waits ends it at once, with no further run.
    #[tokio::test(start_paused = true)]
    async fn a_stop_during_the_backoff_ends_the_supervisor_at_once() {
        let (stop_tx, stop) = watch::channel(false);
        let (mut supervisor, metrics) = supervisor(stop);
        supervisor.backoff = Backoff::new(Duration::from_secs(3600), Duration::from_secs(3600), 7);
        let made = Arc::new(AtomicUsize::new(0));
        let (failed_tx, mut failed) = mpsc::unbounded_channel();
        let make = {
            let made = made.clone();
            move || {
                made.fetch_add(1, Relaxed);
                async { panic!("{}", String::from("every run fails")) }
            }
        };
        let after_failure = move || {
            let _ = failed_tx.send(());
            async {}
        };
        let supervised = tokio::spawn(supervisor.run(make, after_failure));

        failed.recv().await.expect("the first run failed");
        let asked = Instant::now();
        stop_tx.send(true).unwrap();
        supervised.await.expect("the supervisor ends at the stop");
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "the stop waited for the backoff: {:?}",
            asked.elapsed()
        );
        assert_eq!(
            made.load(Relaxed),
            1,
            "nothing is started again after a stop"
        );
        assert_eq!(metrics.failures.load(Relaxed), 1);
    }

    /// A failed run's cleanup still happens when the broker is stopping,
    /// and nothing is started again.
    #[tokio::test(start_paused = true)]
    async fn a_run_that_panics_while_stopping_is_cleaned_up_and_not_started_again() {
        let (stop_tx, stop) = watch::channel(false);
        let (supervisor, metrics) = supervisor(stop);
        stop_tx.send(true).unwrap();
        let made = Arc::new(AtomicUsize::new(0));
        let cleaned = Arc::new(AtomicUsize::new(0));
        let make = {
            let made = made.clone();
            move || -> std::future::Ready<()> {
                made.fetch_add(1, Relaxed);
                panic!("the link could not be made")
            }
        };
        let after_failure = {
            let cleaned = cleaned.clone();
            move || {
                cleaned.fetch_add(1, Relaxed);
                async {}
            }
        };
        supervisor.run(make, after_failure).await;
        assert_eq!(made.load(Relaxed), 1);
        assert_eq!(cleaned.load(Relaxed), 1);
        assert_eq!(metrics.failures.load(Relaxed), 1);
    }

    #[test]
    fn a_panics_message_is_its_text_whatever_form_it_took() {
        let literal = catch_unwind(|| panic!("literal")).unwrap_err();
        assert_eq!(panic_message(literal.as_ref()), "literal");
        let formatted = catch_unwind(|| panic!("formatted {}", 7)).unwrap_err();
        assert_eq!(panic_message(formatted.as_ref()), "formatted 7");
        let other = catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(other.as_ref()), "a panic without a message");
    }
}
