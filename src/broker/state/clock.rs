//! The broker's clock for the times it stores: a record's receipt time, a
//! position's or a hold's `saved_at`, a lease's end, a session's expiry.
//!
//! It runs on the monotonic clock the state is handed (`now`), from a
//! wall-clock reading it is based on, so the state stays deterministic.
//! Leases, session and message expiries are counted on the monotonic clock
//! itself within a run and do not move with this one. What the system
//! clock does is followed in one direction only:
//!
//! - **Forward, at once.** A device without a battery-backed clock starts
//!   at 1970 (or at the last time saved to disk) and is set by NTP a while
//!   later, often long after the broker started. A clock fixed at the
//!   start would stamp every record of the run decades in the past, and
//!   retention by age, which cuts by the system clock, would remove each
//!   of them at its next sweep. The broker task hands the state the system
//!   clock twice a second ([`BrokerState::follow_wall_clock`]); a clock
//!   found ahead is taken, and a step of a second or more is logged and
//!   counted (`saguin_clock_steps_total`).
//! - **Never back.** A system clock set back (it ran ahead) is not
//!   followed within a run: a retry's backoff or a record's place in time
//!   would move by the step, and a receipt time earlier than the one
//!   before it would hide records from a seek by time and hold up
//!   retention. The broker's clock runs on from where it was, logged once
//!   and shown in `saguin_receipt_clock_ahead_seconds`; records are then
//!   removed by age that much later (never sooner). The next start goes
//!   on from the latest time the storage holds, so the same holds until
//!   the system clock passes it.
//! - **Not behind the storage.** At a start the clock is never behind the
//!   latest time the storage holds ([`ReceiptClock::starting`], from
//!   `Providers::last_recorded_time`: an append channel's newest record,
//!   which a power cut keeps, and each provider's lock's start or stop),
//!   so records received before a clock without a battery is set are
//!   stamped after the ones before them, not in 1970.
//!
//! [`BrokerState::follow_wall_clock`]: super::BrokerState::follow_wall_clock

use std::time::Duration;

use saguin_format::model::UnixNanos;

use crate::storage::lock::rfc3339;
use tokio::time::Instant;

/// The least step of the system clock that is logged and counted; smaller
/// differences are taken (forward) or left (back) in silence.
pub const STEP_LOGGED: Duration = Duration::from_secs(1);

/// The state's clock: `base_unix` at `base`, on from there by the
/// monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct ReceiptClock {
    base: Instant,
    base_unix: UnixNanos,
    /// The system clock was last found behind this one by a step worth
    /// logging (logged once until it catches up).
    behind: bool,
}

/// What a look at the system clock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followed {
    /// Within a second of this clock, or ahead by less (and taken).
    Steady,
    /// Ahead by this much, a second or more: taken.
    Forward(Duration),
    /// Behind by this much, a second or more, first seen now: not taken.
    Behind(Duration),
    /// Caught up again after being behind.
    CaughtUp,
}

impl ReceiptClock {
    pub fn new(base: Instant, base_unix: UnixNanos) -> ReceiptClock {
        ReceiptClock {
            base,
            base_unix,
            behind: false,
        }
    }

    /// The clock at a start, `now`: the system clock, `wall`, unless the
    /// storage holds a later time (`floor`), which it then starts just
    /// after, saying so once. Just after by a few random milliseconds:
    /// the start's time is the first half of every message id the run
    /// makes, and two starts from the same floor (the second after a kill
    /// that stored nothing) must not make the same ids.
    pub fn starting(now: Instant, wall: UnixNanos, floor: Option<UnixNanos>) -> ReceiptClock {
        match floor {
            Some(floor) if floor > wall => {
                let behind = Duration::from_nanos((floor - wall) as u64);
                // Less than a step is said of a clock that runs (a
                // virtual machine's clock sync): not of the clock at all.
                let told = behind >= STEP_LOGGED;
                if told {
                    tracing::warn!(
                        system_clock = %rfc3339(wall),
                        storage_last_used = %rfc3339(floor),
                        behind = %humantime::format_duration(Duration::from_secs(behind.as_secs())),
                        "the system clock is behind the last time the storage was in use: receipt times go on from that time until the system clock passes it (is the clock set? a device without a battery-backed clock starts at 1970 until NTP sets it)"
                    );
                }
                ReceiptClock {
                    base: now,
                    base_unix: floor.saturating_add(after_floor()),
                    behind: told,
                }
            }
            _ => ReceiptClock::new(now, wall),
        }
    }

    /// What the clock read when it was last based on the system clock.
    pub fn base_unix(&self) -> UnixNanos {
        self.base_unix
    }

    /// Unix nanoseconds at `now`.
    pub fn unix_at(&self, now: Instant) -> UnixNanos {
        match now.checked_duration_since(self.base) {
            Some(d) => self
                .base_unix
                .saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            None => self.base_unix.saturating_sub(
                i64::try_from(self.base.duration_since(now).as_nanos()).unwrap_or(i64::MAX),
            ),
        }
    }

    /// How far this clock is ahead of `wall`, the system clock read at
    /// `now` (zero when it is not).
    pub fn ahead_of(&self, now: Instant, wall: UnixNanos) -> Duration {
        Duration::from_nanos(self.unix_at(now).saturating_sub(wall).max(0) as u64)
    }

    /// Takes the system clock, `wall` at `now`, when it is ahead; leaves
    /// it when it is behind (see the module documentation).
    pub fn follow(&mut self, now: Instant, wall: UnixNanos) -> Followed {
        let mine = self.unix_at(now);
        if wall >= mine {
            self.base = now;
            self.base_unix = wall;
            let step = Duration::from_nanos((wall - mine) as u64);
            let was_behind = std::mem::replace(&mut self.behind, false);
            return if step >= STEP_LOGGED {
                Followed::Forward(step)
            } else if was_behind {
                Followed::CaughtUp
            } else {
                Followed::Steady
            };
        }
        let gap = Duration::from_nanos(mine.saturating_sub(wall) as u64);
        if gap >= STEP_LOGGED && !self.behind {
            self.behind = true;
            return Followed::Behind(gap);
        }
        Followed::Steady
    }
}

/// Nanoseconds after the floor a start goes on from: random, 1 to 2^24
/// (about 17 ms).
fn after_floor() -> i64 {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (random & ((1 << 24) - 1)) as i64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000_000;

    #[test]
    fn a_clock_found_ahead_is_taken_and_a_step_of_a_second_is_told() {
        let start = Instant::now();
        let mut clock = ReceiptClock::new(start, 100 * SECOND);
        let later = start + Duration::from_secs(10);
        assert_eq!(clock.unix_at(later), 110 * SECOND);
        // A few milliseconds of drift: taken, not told.
        assert_eq!(
            clock.follow(later, 110 * SECOND + 5_000_000),
            Followed::Steady
        );
        assert_eq!(clock.unix_at(later), 110 * SECOND + 5_000_000);
        // NTP sets a clock that started at 1970: decades ahead, taken.
        let set = 1_796_000_000 * SECOND;
        assert_eq!(
            clock.follow(later, set),
            Followed::Forward(Duration::from_nanos(
                (set - 110 * SECOND - 5_000_000) as u64
            ))
        );
        assert_eq!(clock.unix_at(later + Duration::from_secs(1)), set + SECOND);
    }

    #[test]
    fn a_clock_set_back_is_not_followed_and_is_told_once_until_it_catches_up() {
        let start = Instant::now();
        let mut clock = ReceiptClock::new(start, 1_000 * SECOND);
        let later = start + Duration::from_secs(5);
        // Set back an hour: this clock runs on, and says so once.
        let back = 1_005 * SECOND - 3_600 * SECOND;
        assert_eq!(
            clock.follow(later, back),
            Followed::Behind(Duration::from_secs(3_600))
        );
        assert_eq!(clock.unix_at(later), 1_005 * SECOND);
        assert_eq!(clock.ahead_of(later, back), Duration::from_secs(3_600));
        let after = later + Duration::from_secs(1);
        assert_eq!(clock.follow(after, back + SECOND), Followed::Steady);
        assert_eq!(clock.unix_at(after), 1_006 * SECOND, "never steps back");
        // The system clock passes it again (set forward once more).
        assert_eq!(clock.follow(after, 1_006 * SECOND), Followed::CaughtUp);
        assert_eq!(clock.ahead_of(after, 1_006 * SECOND), Duration::ZERO);
        // Less than a second behind is left in silence.
        assert_eq!(
            clock.follow(after + Duration::from_secs(1), 1_006 * SECOND + SECOND / 2),
            Followed::Steady
        );
    }

    #[test]
    fn a_start_is_never_behind_the_last_time_the_storage_was_in_use() {
        let now = Instant::now();
        let at = |floor| ReceiptClock::starting(now, 50 * SECOND, floor).unix_at(now);
        assert_eq!(at(None), 50 * SECOND);
        assert_eq!(at(Some(40 * SECOND)), 50 * SECOND);
        // Just after the floor, and not where the last start from it was.
        let after = (70 * SECOND + 1..=70 * SECOND + (1 << 24)).contains(&at(Some(70 * SECOND)));
        assert!(after);
        let starts: std::collections::HashSet<i64> =
            (0..8).map(|_| at(Some(70 * SECOND))).collect();
        assert!(starts.len() > 1, "{starts:?}");
        // Said once at the start, not again at the first look.
        let mut clock = ReceiptClock::starting(now, 50 * SECOND, Some(70 * SECOND));
        assert_eq!(clock.follow(now, 50 * SECOND), Followed::Steady);
        assert!(clock.ahead_of(now, 50 * SECOND) > Duration::from_secs(20));
        assert_eq!(clock.follow(now, 71 * SECOND), Followed::CaughtUp);
    }
}
