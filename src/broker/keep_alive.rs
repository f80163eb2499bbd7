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
/// The longest a client is quiet before its connection parks: devices
/// that speak more often than this stay served by a task of their own.
pub const PARK_AFTER_MAX: Duration = Duration::from_secs(10);

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
    link: Weak<ConnectionLink>,
    /// Its silence limit in milliseconds ([`Entry::limit`]): one and a
    /// half keep alives is at most 98,302,500. The entries are the
    /// timer's heap, one a connection, parked or not: kept to 24 bytes.
    limit_ms: u32,
    /// The low bits of the link's parking round the entry belongs to
    /// ([`round_of`]): one of an earlier round was replaced when the
    /// client was heard after a park.
    round: u16,
    parking: Parking,
}

impl Entry {
    fn new(at: u64, limit: Limit, link: &Outlet, parking: Parking, round: u32) -> Self {
        Entry {
            at,
            link: Arc::downgrade(&link.link()),
            limit_ms: limit.0,
            round: round_of(round),
            parking,
        }
    }

    /// Its silence limit, in the timer's time.
    fn limit(&self) -> u64 {
        Limit(self.limit_ms).nanos()
    }
}

/// A silence limit as an entry keeps it: whole milliseconds, rounded up so
/// no client is told silent before its limit.
#[derive(Debug, Clone, Copy)]
struct Limit(u32);

impl Limit {
    fn of(limit: Duration) -> Self {
        let ms = limit.as_nanos().div_ceil(1_000_000);
        Limit(u32::try_from(ms).unwrap_or(u32::MAX))
    }

    fn nanos(self) -> u64 {
        u64::from(self.0) * 1_000_000
    }
}

/// The part of a parking round an entry keeps. A round's entry is due
/// within a third of its limit, long before 65,536 rounds more could
/// come round to the same low bits.
fn round_of(round: u32) -> u16 {
    round as u16
}

/// Where a connection's entry stands on parking it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parking {
    /// It does not park (TLS).
    Never,
    /// It is to be told once its client has been quiet for [`park_after`]
    /// since it was last heard.
    Due,
    /// It was told for the hearing whose silence ends at the entry's `at`.
    Told,
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

    /// Watch `link`'s client, heard now, for silences of `limit`; told to
    /// park after quiet spells when it `parks`.
    pub fn watch(&self, link: &Outlet, limit: Duration, parks: bool) {
        let now = self.now();
        link.heard.store(now, Release);
        let parking = match parks {
            true => Parking::Due,
            false => Parking::Never,
        };
        self.arm(link, now, limit, parking, link.park_round());
    }

    /// `link`'s client was heard now. Told silent in the meantime (the
    /// read came as the timer looked), it is watched again.
    pub fn heard(&self, link: &Outlet, limit: Duration) {
        let now = self.now();
        link.heard.store(now, Release);
        if link.take_silent() {
            // Told silent, the entry went: back as a timed one only (a
            // client heard at its limit is not one to park).
            self.arm(link, now, limit, Parking::Never, link.park_round());
        } else if let Some(round) = link.next_park_round() {
            // Heard after it was told to park: to be told again after the
            // same quiet from now, where the entry told would look next
            // only at the end of its silence. A new round's entry replaces
            // it.
            self.arm(link, now, limit, Parking::Due, round);
        }
    }

    /// An entry for `link`, heard at `heard`, in parking `round`: due when
    /// it is to be told to park, or else when its silence ends.
    fn arm(&self, link: &Outlet, heard: u64, limit: Duration, parking: Parking, round: u32) {
        let limit = Limit::of(limit);
        let quiet = match parking {
            Parking::Due => park_after(limit.nanos()),
            Parking::Never | Parking::Told => limit.nanos(),
        };
        self.push(Entry::new(
            heard.saturating_add(quiet),
            limit,
            link,
            parking,
            round,
        ));
    }

    /// `link`'s client's silence does not count until it is heard again.
    pub fn not_timed(&self, link: &ConnectionLink) {
        link.heard.store(NOT_TIMED, Release);
    }

    /// Keep `entry`, waking the timer's task when it comes first.
    fn push(&self, entry: Entry) {
        let first = {
            let mut entries = self.entries();
            let first = entries.due.peek().is_none_or(|Reverse(e)| entry.at < e.at);
            entries.due.push(Reverse(entry));
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
        let mut park = Vec::new();
        let next = {
            let mut entries = self.entries();
            while entries.due.peek().is_some_and(|Reverse(e)| e.at <= now) {
                let Some(Reverse(entry)) = entries.due.pop() else {
                    break;
                };
                let Some(link) = entry.link.upgrade() else {
                    continue;
                };
                if entry.round != round_of(link.park_round()) {
                    // Replaced by the entry of a later round.
                    continue;
                }
                let heard = link.heard.load(Acquire);
                if heard == NOT_TIMED {
                    // Busy: neither silent nor quiet.
                    let at = now.saturating_add(entry.limit());
                    entries.due.push(Reverse(Entry { at, ..entry }));
                    continue;
                }
                let silent_at = heard.saturating_add(entry.limit());
                if silent_at <= now {
                    silent.push(link);
                    continue;
                }
                let park_at = heard.saturating_add(park_after(entry.limit()));
                let (at, parking) = match entry.parking {
                    Parking::Due if park_at <= now => {
                        link.told_to_park();
                        park.push(link);
                        (silent_at, Parking::Told)
                    }
                    Parking::Due => (park_at, Parking::Due),
                    other => (silent_at, other),
                };
                entries.due.push(Reverse(Entry {
                    at,
                    parking,
                    ..entry
                }));
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
        for link in park {
            link.tell_park();
        }
        next
    }
}

impl Drop for KeepAliveTimer {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

/// How long a client with silences of `limit` is quiet before its
/// connection parks.
fn park_after(limit: u64) -> u64 {
    (limit / 3).min(nanos(PARK_AFTER_MAX))
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

    /// The timer's heap holds an entry for every connection, parked or
    /// not.
    #[test]
    fn an_entry_stays_small() {
        assert!(std::mem::size_of::<Entry>() <= 24);
    }

    /// A limit kept in milliseconds is never shorter than the one given,
    /// and the longest keep alive's fits.
    #[test]
    fn a_limit_is_kept_rounded_up() {
        assert_eq!(
            Limit::of(Duration::from_millis(1500)).nanos(),
            1_500_000_000
        );
        assert_eq!(
            Limit::of(Duration::from_nanos(1_000_001)).nanos(),
            2_000_000
        );
        let longest = Duration::from_secs(u64::from(u16::MAX)).mul_f64(1.5);
        assert_eq!(Limit::of(longest).nanos(), nanos(longest));
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
        timer.watch(&outlet, Duration::from_secs(3), false);
        told_silent_after(&outlet, Duration::from_secs(3)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn each_time_a_client_is_heard_its_silence_starts_again() {
        let timer = KeepAliveTimer::start();
        let (_handle, outlet) = link();
        let limit = Duration::from_millis(1500);
        timer.watch(&outlet, limit, false);
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
        timer.watch(&outlet, limit, false);
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
        timer.watch(&outlet, limit, false);
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
        timer.watch(&kept, long, false);
        for _ in 0..10 * SWEEP_SLACK {
            // The connection and the state let go of the link.
            let (_handle, outlet) = link();
            timer.watch(&outlet, long, false);
        }
        // The sweep runs when the timer next looks.
        let (_short, short) = link();
        timer.watch(&short, Duration::from_secs(1), false);
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
        assert!(silent(&short));
        let entries = timer.entries();
        assert!(entries.due.len() <= 2, "{} entries", entries.due.len());
    }

    fn told_to_park(outlet: &Outlet) -> bool {
        outlet.take_park()
    }

    /// A quiet client's connection is told to park after half its keep
    /// alive (capped), once for each time it is heard, and still told
    /// silent at its limit.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_told_to_park_once_a_hearing() {
        let timer = KeepAliveTimer::start();
        let (_handle, outlet) = link();
        // Keep alive 4 s: silent at 6 s, parked after 2 s.
        let limit = Duration::from_secs(6);
        timer.watch(&outlet, limit, true);
        tokio::time::advance(Duration::from_millis(1999)).await;
        settle().await;
        assert!(!told_to_park(&outlet), "told before its time");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert!(told_to_park(&outlet), "not told at half its keep alive");
        // Not told again while its client says nothing...
        tokio::time::advance(Duration::from_millis(3000)).await;
        settle().await;
        assert!(!told_to_park(&outlet));
        // ...until it is heard: then once more, after the same quiet.
        timer.heard(&outlet, limit);
        tokio::time::advance(Duration::from_millis(2000)).await;
        settle().await;
        assert!(told_to_park(&outlet), "not told again once heard");
        assert!(!silent(&outlet));
        told_silent_after(&outlet, Duration::from_secs(4)).await;
        assert!(!told_to_park(&outlet));
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_keep_alive_parks_after_the_cap() {
        let timer = KeepAliveTimer::start();
        let (_handle, outlet) = link();
        timer.watch(&outlet, Duration::from_secs(90), true);
        tokio::time::advance(PARK_AFTER_MAX).await;
        settle().await;
        assert!(told_to_park(&outlet));
    }

    /// A device with a keep alive of 60 s pings every minute: it parks 10 s
    /// after each ping, not at the end of the silence the entry told
    /// looks at next.
    #[tokio::test(start_paused = true)]
    async fn a_client_heard_after_it_parked_parks_again_after_the_same_quiet() {
        let timer = KeepAliveTimer::start();
        let (_handle, outlet) = link();
        let limit = Duration::from_secs(90);
        timer.watch(&outlet, limit, true);
        for ping in 0..3 {
            tokio::time::advance(Duration::from_millis(9_999)).await;
            settle().await;
            assert!(!told_to_park(&outlet), "told before its quiet, ping {ping}");
            tokio::time::advance(Duration::from_millis(1)).await;
            settle().await;
            assert!(told_to_park(&outlet), "not told 10 s after ping {ping}");
            tokio::time::advance(Duration::from_secs(50)).await;
            settle().await;
            assert!(!told_to_park(&outlet));
            timer.heard(&outlet, limit);
        }
        // One entry, however many rounds.
        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        assert!(told_to_park(&outlet));
        tokio::time::advance(Duration::from_secs(90)).await;
        settle().await;
        assert_eq!(timer.entries().due.len(), 0, "told silent, its entry went");
        assert!(silent(&outlet));
    }

    /// A connection that does not park (TLS) is never told, and a client
    /// heard every moment is never quiet enough.
    #[tokio::test(start_paused = true)]
    async fn neither_a_connection_that_does_not_park_nor_a_busy_one_is_told() {
        let timer = KeepAliveTimer::start();
        let (_h1, never) = link();
        let (_h2, busy) = link();
        let limit = Duration::from_secs(6);
        timer.watch(&never, limit, false);
        timer.watch(&busy, limit, true);
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(1500)).await;
            timer.heard(&never, limit);
            timer.heard(&busy, limit);
            settle().await;
            assert!(!told_to_park(&busy));
        }
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
        assert!(!told_to_park(&never));
        assert!(told_to_park(&busy));
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
