use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn legacy_default() -> Schedule {
    Schedule::new(SnapshotSchedule::default())
}

#[test]
fn a_quiet_debounce_after_the_last_change_and_never_past_the_maximum_delay() {
    let t0 = Instant::now();
    let mut s = legacy_default();
    assert_eq!(s.due_at(), None, "nothing changed");
    s.changed(t0);
    assert_eq!(s.due_at(), Some(t0 + ms(250)));
    s.changed(t0 + ms(100));
    assert_eq!(s.due_at(), Some(t0 + ms(350)), "the quiet gap starts again");
    // A change every 100 ms is never quiet: the maximum delay after the
    // first change decides.
    for i in 2..30 {
        s.changed(t0 + ms(100 * i));
    }
    assert_eq!(s.due_at(), Some(t0 + ms(2000)));
}

#[test]
fn a_generation_being_written_holds_the_next_and_changes_meanwhile_count_from_then() {
    let t0 = Instant::now();
    let mut s = legacy_default();
    s.changed(t0);
    s.started();
    assert!(s.is_writing());
    assert_eq!(s.due_at(), None);
    // Changes while it is written: the next generation's window starts at
    // the first of them, and waits for the write to end.
    s.changed(t0 + ms(300));
    s.changed(t0 + ms(400));
    assert_eq!(s.due_at(), None);
    s.finished(t0 + ms(3000), false, false);
    assert_eq!(
        s.due_at(),
        Some(t0 + ms(650)),
        "already due: the window was spent writing"
    );
    s.started();
    s.finished(t0 + ms(3100), false, false);
    assert_eq!(s.due_at(), None, "nothing changed since");
}

#[test]
fn a_failed_generation_is_tried_again_no_sooner_than_the_maximum_delay() {
    let t0 = Instant::now();
    let mut s = legacy_default();
    s.changed(t0);
    s.started();
    s.finished(t0 + ms(10), true, false);
    assert_eq!(s.due_at(), Some(t0 + ms(2010)));
    // A shorter maximum delay still waits a second between attempts.
    let mut s = Schedule::new(SnapshotSchedule {
        debounce: Some(ms(5)),
        max_delay: Some(ms(50)),
    });
    s.changed(t0);
    s.started();
    s.finished(t0, true, false);
    s.changed(t0 + ms(10));
    assert_eq!(s.due_at(), Some(t0 + ms(1000)));
    // One that lands clears the wait.
    s.started();
    s.finished(t0 + ms(1000), false, false);
    s.changed(t0 + ms(1001));
    assert_eq!(s.due_at(), Some(t0 + ms(1006)));
}

#[test]
fn a_generation_that_gave_up_the_snapshot_room_is_tried_again_as_any_change() {
    let t0 = Instant::now();
    let mut s = Schedule::new(SnapshotSchedule {
        debounce: Some(ms(5)),
        max_delay: Some(ms(50)),
    });
    s.changed(t0);
    s.started();
    s.finished(t0 + ms(10), true, true);
    // Due a debounce after the failure, not a second.
    assert_eq!(s.due_at(), Some(t0 + ms(15)));
}

#[test]
fn without_a_debounce_only_the_maximum_delay_and_without_either_never() {
    let t0 = Instant::now();
    let mut s = Schedule::new(SnapshotSchedule {
        debounce: None,
        max_delay: Some(Duration::from_secs(30)),
    });
    s.changed(t0);
    s.changed(t0 + ms(10));
    assert_eq!(s.due_at(), Some(t0 + Duration::from_secs(30)));
    let mut s = Schedule::new(SnapshotSchedule::SHUTDOWN_ONLY);
    s.changed(t0);
    assert_eq!(s.due_at(), None);
}

#[test]
fn what_a_crash_would_lose_starts_at_the_oldest_change_no_committed_generation_holds() {
    let mut unsaved = Unsaved::default();
    assert_eq!(unsaved.since(), None);
    unsaved.changed(100);
    unsaved.changed(150);
    assert_eq!(unsaved.since(), Some(100));
    // Captured: still lost by a crash until the generation commits, and
    // changes meanwhile wait for the next one.
    unsaved.captured();
    unsaved.changed(200);
    assert_eq!(unsaved.since(), Some(100));
    unsaved.finished(false);
    assert_eq!(unsaved.since(), Some(200));
    // A failed generation leaves its changes unsaved, the oldest first.
    unsaved.captured();
    unsaved.changed(300);
    unsaved.finished(true);
    assert_eq!(unsaved.since(), Some(200));
    unsaved.captured();
    unsaved.finished(false);
    assert_eq!(unsaved.since(), None);
    // A capture that found nothing changed after all.
    unsaved.changed(400);
    unsaved.nothing_changed();
    assert_eq!(unsaved.since(), None);
}
