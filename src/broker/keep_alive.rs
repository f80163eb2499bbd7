//! One timer for every connection's keep alive (MQTT-3.1.2-24: a client
//! silent for one and a half times its keep alive is closed).
//!
//! Each connection's task held a tokio `Sleep` of its own, reset at every
//! read: 112 B of every connection's future, which put an idle
//! connection's task in a 512 B allocation where 384 B now hold it. A
//! connection now notes when it last heard its client in its link
//! ([`ConnectionLink::heard`], one atomic store a read), and this timer
//! keeps one entry a connection, ordered by when that connection's
//! silence would end as far as the timer last looked. When an entry comes
//! due the timer reads what the connection last heard:
//!
//! - silent for its whole limit: the connection is told
//!   ([`ConnectionLink::tell_silent`] wakes its task) and the entry goes;
//! - heard since: the entry comes back at the end of the new silence;
//! - not timed just now ([`NOT_TIMED`]: its reader is paused, or its
//!   packets wait for room in the state's queue): the entry comes back a
//!   whole limit later, and the connection restarts its silence when it
//!   reads again.
//!
//! So a busy connection costs the timer one look a keep-alive period, not
//! one a packet, and a silent client is still closed exactly at its limit.
//!
//! An entry holds its link weakly: once the connection and the state have
//! let go of the link, the entry is dropped when it comes due, or sooner
//! by a sweep. A sweep keeps the entries whose link lives and runs each
//! time the entries have doubled since the last, so connections that come
//! and go do not pile up behind long keep alives.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::link::{ConnectionLink, Outlet};

/// [`ConnectionLink::heard`] while the client's silence does not count.
pub const NOT_TIMED: u64 = u64::MAX;
/// Entries the timer keeps beyond twice those the last sweep left before
/// it sweeps again.
const SWEEP_SLACK: usize = 64;

/// The timer every connection of a broker shares. Its task ends when the
/// last handle to it is dropped.
#[derive(Debug)]
pub struct KeepAliveTimer {
    entries: Mutex<Entries>,
    /// Wakes the timer's task: an entry came before the one it sleeps
    /// for, or the timer was dropped.
    wake: Arc<Notify>,
    /// What the timer's time counts from.
    epoch: Instant,
}

#[derive(Debug, Default)]
struct Entries {
    due: BinaryHeap<Reverse<Entry>>,
    /// How many entries the last sweep left.
    swept_to: usize,
}

/// One connection's silence as far as the timer last looked.
#[derive(Debug)]
struct Entry {
    /// When its silence ends, in the timer's time.
    at: u64,
    limit: u64,
    link: Weak<ConnectionLink>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.cmp(&other.at)
    }
}

impl KeepAliveTimer {
    /// A timer, its task spawned on the current runtime.
    pub fn start() -> Arc<KeepAliveTimer> {
        let wake = Arc::new(Notify::new());
        let timer = Arc::new(KeepAliveTimer {
            entries: Mutex::default(),
            wake: wake.clone(),
            epoch: Instant::now(),
        });
        tokio::spawn(run(Arc::downgrade(&timer), wake));
        timer
    }

    fn entries(&self) -> MutexGuard<'_, Entries> {
        // Nothing under the lock panics but an allocation failure; a heap
        // left as it was is still a heap.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Now, in the timer's time.
    fn now(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    /// Watch `link`'s client, heard now, for silences of `limit`.
    pub fn watch(&self, link: &Outlet, limit: Duration) {
        let now = self.now();
        link.heard.store(now, Release);
        self.arm(&link.link(), now, nanos(limit));
    }

    /// `link`'s client was heard now. Told silent in the meantime (the
    /// read came as the timer looked), it is watched again.
    pub fn heard(&self, link: &Outlet, limit: Duration) {
        let now = self.now();
        link.heard.store(now, Release);
        if link.take_silent() {
            self.arm(&link.link(), now, nanos(limit));
        }
    }

    /// `link`'s client's silence does not count until it is heard again.
    pub fn not_timed(&self, link: &ConnectionLink) {
        link.heard.store(NOT_TIMED, Release);
    }

    /// An entry for `link`'s silence heard at `heard`.
    fn arm(&self, link: &Arc<ConnectionLink>, heard: u64, limit: u64) {
        let at = heard.saturating_add(limit);
        let first = {
            let mut entries = self.entries();
            let first = entries.due.peek().is_none_or(|Reverse(e)| at < e.at);
            entries.due.push(Reverse(Entry {
                at,
                limit,
                link: Arc::downgrade(link),
            }));
            first
        };
        if first {
            self.wake.notify_one();
        }
    }

    /// Look at every entry due by now: tell the silent connections, put
    /// back the others. When the next entry is due, if any.
    fn look(&self) -> Option<Instant> {
        let now = self.now();
        let mut silent = Vec::new();
        let next = {
            let mut entries = self.entries();
            while entries.due.peek().is_some_and(|Reverse(e)| e.at <= now) {
                let Some(Reverse(entry)) = entries.due.pop() else {
                    break;
                };
                let Some(link) = entry.link.upgrade() else {
                    continue;
                };
                let at = match link.heard.load(Acquire) {
                    NOT_TIMED => now.saturating_add(entry.limit),
                    heard => heard.saturating_add(entry.limit),
                };
                if at <= now {
                    silent.push(link);
                } else {
                    entries.due.push(Reverse(Entry { at, ..entry }));
                }
            }
            if entries.due.len() > 2 * entries.swept_to + SWEEP_SLACK {
                entries.due.retain(|Reverse(e)| e.link.strong_count() > 0);
                entries.swept_to = entries.due.len();
            }
            entries
                .due
                .peek()
                .map(|Reverse(e)| self.epoch + Duration::from_nanos(e.at))
        };
        // Woken outside the timer's lock.
        for link in silent {
            link.tell_silent();
        }
        next
    }
}

impl Drop for KeepAliveTimer {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(NOT_TIMED - 1)
}

/// The timer's task: sleeps until the first entry is due or one comes
/// before it, and ends once the timer is dropped.
async fn run(timer: Weak<KeepAliveTimer>, wake: Arc<Notify>) {
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        // Listening before looking: an entry armed after the look wakes
        // this sleep.
        woken.as_mut().enable();
        let next = match timer.upgrade() {
            Some(timer) => timer.look(),
            None => return,
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = &mut woken => {}
                }
            }
            None => woken.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll};

    use crate::broker::link::link;

    fn silent(outlet: &crate::broker::link::Outlet) -> bool {
        let waker = std::task::Waker::noop();
        outlet.poll_silent(&Context::from_waker(waker)) == Poll::Ready(())
    }

    /// Let the timer's task run what is due at the paused clock's now.
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    /// The client is told silent exactly `after` from now, not a
    /// millisecond before.
    async fn told_silent_after(outlet: &Outlet, after: Duration) {
        tokio::time::advance(after - Duration::from_millis(1)).await;
        settle().await;
        assert!(!silent(outlet), "told silent before {after:?}");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert!(silent(outlet), "not told silent at {after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_told_exactly_at_its_limit() {
        let timer = KeepAliveTimer::start();
        let (_handle, outlet) = link();
        timer.watch(&outlet, Duration::from_secs(3));
        told_silent_after(&outlet, Duration::from_secs(3)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn each_time_a_client_is_heard_its_silence_starts_again() {
        let timer = KeepAliveTimer::start();
        let (_handle, outlet) = link();
        let limit = Duration::from_millis(1500);
        timer.watch(&outlet, limit);
        for _ in 0..4 {
            tokio::time::advance(Duration::from_millis(1400)).await;
            timer.heard(&outlet, limit);
            settle().await;
            assert!(!silent(&outlet));
        }
        told_silent_after(&outlet, limit).await;
    }

    #[tokio::test(start_paused = true)]
    async fn silence_while_not_timed_does_not_count() {
        let timer = KeepAliveTimer::start();
        let (_handle, outlet) = link();
        let limit = Duration::from_secs(1);
        timer.watch(&outlet, limit);
        timer.not_timed(&outlet);
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
        assert!(!silent(&outlet));
        timer.heard(&outlet, limit);
        told_silent_after(&outlet, limit).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_heard_after_it_was_told_silent_is_watched_again() {
        let timer = KeepAliveTimer::start();
        let (_handle, outlet) = link();
        let limit = Duration::from_secs(1);
        timer.watch(&outlet, limit);
        told_silent_after(&outlet, limit).await;
        timer.heard(&outlet, limit);
        assert!(!silent(&outlet));
        told_silent_after(&outlet, limit).await;
    }

    #[tokio::test(start_paused = true)]
    async fn connections_that_ended_are_swept_from_the_entries() {
        let timer = KeepAliveTimer::start();
        let long = Duration::from_secs(100_000);
        let (_kept, kept) = link();
        timer.watch(&kept, long);
        for _ in 0..10 * SWEEP_SLACK {
            // The connection and the state let go of the link.
            let (_handle, outlet) = link();
            timer.watch(&outlet, long);
        }
        // The sweep runs when the timer next looks.
        let (_short, short) = link();
        timer.watch(&short, Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
        assert!(silent(&short));
        let entries = timer.entries();
        assert!(entries.due.len() <= 2, "{} entries", entries.due.len());
    }

    #[tokio::test(start_paused = true)]
    async fn the_timers_task_ends_with_the_timer() {
        let timer = KeepAliveTimer::start();
        let task_alive = Arc::downgrade(&timer.wake);
        drop(timer);
        settle().await;
        assert!(task_alive.upgrade().is_none());
    }
}
