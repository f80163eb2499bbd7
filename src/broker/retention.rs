//! Retention: the task that removes from the front of each append channel
//! what its `retention_bytes` and `retention_age` no longer keep, and
//! forgets the deletion markers of each latest channel its
//! `retention_deletions` and `retention_age` no longer keep (its costs:
//! docs/benchmarks.md, "Storage providers").
//!
//! - By size every [`SIZE_SWEEP_PERIOD`] (one second), over the append
//!   channels with a `retention_bytes` and the latest channels with a
//!   `retention_deletions`. A channel under its bound is settled from the
//!   byte or marker count it already keeps, reading nothing, which is what
//!   lets the period be one second at any channel count
//!   ([`contract::sweep_by_size`], [`contract::sweep_deletions_by_count`]).
//! - By age every tenth of the shortest `retention_age` any channel
//!   configures, never more often than every [`MIN_AGE_SWEEP_PERIOD`]
//!   ([`age_sweep_period`]): a record turns old with nothing written to its
//!   channel, so this sweep has to look, and on sqlite that is a read per
//!   append channel (a latest channel's markers are walked in memory). The
//!   cutoff is now - retention_age; a record or marker with no timestamp
//!   (0) is never too old and stops the walk ([`contract::sweep_by_age`],
//!   [`contract::sweep_deletions_by_age`]).
//!
//! A latest channel's values are never removed: forgetting markers raises
//! its floor past the last one forgotten, and a consumer whose position
//! is below it is sent every current value again (`state::channel`). The
//! `saguin_retention_*` series count both kinds under the sweep that
//! removed them: records removed and markers forgotten.
//!
//! The first pass of each runs as soon as the task starts, so a channel
//! that came back over its bound is trimmed before the first period ends.
//! Sweeps run on the blocking pool (a sqlite removal is a transaction on
//! the provider's writer), one at a time: the next waits for the last to
//! finish, and a late tick is delayed rather than caught up in a burst.
//! Each removal raises the channel's floor in the same operation (the
//! stores do that) and is logged at DEBUG; a sweep a channel's store
//! refused is logged at WARN, counted in
//! `saguin_storage_errors_total{provider,kind}` and tried again at the next
//! tick. Retention does not use the provider's reserve: a delete frees
//! room rather than needing it.
//!
//! Retention is the one writer beside the persisters: its removals do not
//! travel the state's intents (`docs/design.md` storage rule 6). Why that
//! is safe - the store orders its writes, a removal and an append commute,
//! the floor reaches the state as an event, no room is needed - is
//! `docs/design.md`, "Who touches storage".

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saguin_format::model::UnixNanos;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};

use super::metrics::Metrics;
use super::providers::ServedChannel;
use super::state::Event;
use crate::config::units::format_duration;
use crate::storage::contract::{
    self, AppendStore, ChannelStore, LatestStore, Retention, SweepReport,
};

/// How often the channels with a `retention_bytes` are swept.
pub const SIZE_SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// The age sweep never runs more often than this, however short the
/// shortest `retention_age`.
pub const MIN_AGE_SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// The age sweep's period for channels retaining `ages`: a tenth of the
/// shortest, at least [`MIN_AGE_SWEEP_PERIOD`]. `None` without any.
pub fn age_sweep_period(ages: impl IntoIterator<Item = Duration>) -> Option<Duration> {
    ages.into_iter()
        .min()
        .map(|shortest| (shortest / 10).max(MIN_AGE_SWEEP_PERIOD))
}

/// The running retention task. [`RetentionTask::stop`] before the
/// providers close, so no sweep writes into a closed provider; dropped
/// instead, the task is aborted.
pub struct RetentionTask {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl RetentionTask {
    /// Stops the task, waiting for a sweep that is running to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            if let Err(err) = task.await {
                tracing::error!(error = %err, "the retention task failed");
            }
        }
    }
}

impl Drop for RetentionTask {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Starts retention over `channels` (those with neither bound are left
/// alone), on the current tokio runtime. Each removal's new floor is told
/// to the state on `floors`.
pub fn spawn(
    channels: Vec<ServedChannel>,
    metrics: Arc<Metrics>,
    floors: mpsc::UnboundedSender<Event>,
) -> RetentionTask {
    let sweeper = Arc::new(Sweeper::new(channels, metrics, floors));
    let age_period = age_sweep_period(
        sweeper
            .by_age
            .iter()
            .map(|(_, r)| r)
            .chain(sweeper.deletions_by_age.iter().map(|(_, r)| r))
            .filter_map(|r| r.age),
    );
    if !sweeper.sizes_anything() && age_period.is_none() {
        return RetentionTask {
            stop: None,
            task: None,
        };
    }
    tracing::info!(
        by_size = sweeper.by_size.len() + sweeper.deletions_by_count.len(),
        size_every = %format_duration(SIZE_SWEEP_PERIOD),
        by_age = sweeper.by_age.len() + sweeper.deletions_by_age.len(),
        age_every = %age_period.map(format_duration).unwrap_or_else(|| "never".to_owned()),
        "retention"
    );
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(run(sweeper, age_period, stopped));
    RetentionTask {
        stop: Some(stop),
        task: Some(task),
    }
}

/// Which of the two sweeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sweep {
    Size,
    Age,
}

impl Sweep {
    fn label(self) -> &'static str {
        match self {
            Sweep::Size => "size",
            Sweep::Age => "age",
        }
    }
}

async fn run(
    sweeper: Arc<Sweeper>,
    age_period: Option<Duration>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut by_size = sweeper.sizes_anything().then(|| ticker(SIZE_SWEEP_PERIOD));
    let mut by_age = age_period.map(ticker);
    // The first tick of each completes at once: the first passes run
    // before the task ever looks at its stop signal.
    if let Some(ticks) = &mut by_size {
        ticks.tick().await;
        sweep(&sweeper, Sweep::Size).await;
    }
    if let Some(ticks) = &mut by_age {
        ticks.tick().await;
        sweep(&sweeper, Sweep::Age).await;
    }
    loop {
        let which = tokio::select! {
            // Stop first: with sweeps slower than their period a tick is
            // always ready, and the stop must still be seen.
            biased;
            _ = &mut stopped => break,
            () = next_tick(&mut by_size) => Sweep::Size,
            () = next_tick(&mut by_age) => Sweep::Age,
        };
        sweep(&sweeper, which).await;
    }
}

fn ticker(period: Duration) -> Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticks
}

async fn next_tick(ticks: &mut Option<Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// One sweep on the blocking pool, awaited, so the next cannot overlap it.
async fn sweep(sweeper: &Arc<Sweeper>, which: Sweep) {
    let sweeper = sweeper.clone();
    let swept =
        tokio::task::spawn_blocking(move || sweeper.sweep(which, contract::now_nanos())).await;
    if let Err(err) = swept {
        tracing::error!(sweep = which.label(), error = %err, "the retention sweep failed");
    }
}

/// The channels under retention, split by bound, and what a report needs
/// to name a channel's provider and floor.
struct Sweeper {
    by_size: Vec<(Arc<dyn AppendStore>, Retention)>,
    by_age: Vec<(Arc<dyn AppendStore>, Retention)>,
    /// Latest channels with a retention_deletions (the size sweep's).
    deletions_by_count: Vec<(Arc<dyn LatestStore>, Retention)>,
    /// Latest channels with a retention_age (the age sweep's).
    deletions_by_age: Vec<(Arc<dyn LatestStore>, Retention)>,
    /// Channel name → its provider's name and store.
    channels: HashMap<Arc<str>, (String, ChannelStore)>,
    metrics: Arc<Metrics>,
    /// The state, told each removal's floor (it lets go of the records it
    /// kept from reads below it).
    floors: mpsc::UnboundedSender<Event>,
    /// The sweeps (by kind, channel) whose last run failed.
    failing: Mutex<HashSet<(&'static str, String)>>,
}

impl Sweeper {
    fn new(
        served: Vec<ServedChannel>,
        metrics: Arc<Metrics>,
        floors: mpsc::UnboundedSender<Event>,
    ) -> Sweeper {
        let mut sweeper = Sweeper {
            by_size: Vec::new(),
            by_age: Vec::new(),
            deletions_by_count: Vec::new(),
            deletions_by_age: Vec::new(),
            channels: HashMap::new(),
            metrics,
            floors,
            failing: Mutex::new(HashSet::new()),
        };
        for channel in served {
            // Retention removes records of append channels (a queue's
            // dead-letter channel among them) and a latest channel's
            // deletion markers; a latest channel keeps every value and a
            // queue every unresolved record.
            let retention = channel.retention.clone();
            match &channel.store {
                ChannelStore::Append(store) => {
                    if retention.bytes.is_some() {
                        sweeper.by_size.push((store.clone(), retention.clone()));
                    }
                    if retention.age.is_some() {
                        sweeper.by_age.push((store.clone(), retention));
                    }
                }
                ChannelStore::Latest(store) => {
                    if retention.deletions.is_some() {
                        sweeper
                            .deletions_by_count
                            .push((store.clone(), retention.clone()));
                    }
                    if retention.age.is_some() {
                        sweeper.deletions_by_age.push((store.clone(), retention));
                    }
                }
                ChannelStore::Queue(_) => continue,
            }
            sweeper.channels.insert(
                channel.name,
                (channel.provider.name().to_owned(), channel.store),
            );
        }
        sweeper
    }

    /// Whether the size sweep has anything to look at.
    fn sizes_anything(&self) -> bool {
        !self.by_size.is_empty() || !self.deletions_by_count.is_empty()
    }

    /// One pass of `which` at `now` (blocking), every removal and failure
    /// reported.
    fn sweep(&self, which: Sweep, now: UnixNanos) -> SweepReport {
        let began = std::time::Instant::now();
        let mut report = match which {
            Sweep::Size => contract::sweep_by_size(&self.by_size),
            Sweep::Age => contract::sweep_by_age(&self.by_age, now),
        };
        let latest = match which {
            Sweep::Size => contract::sweep_deletions_by_count(&self.deletions_by_count),
            Sweep::Age => contract::sweep_deletions_by_age(&self.deletions_by_age, now),
        };
        report.removed.extend(latest.removed);
        report.failed.extend(latest.failed);
        let total = report.total();
        self.metrics
            .retention_swept(which.label(), began.elapsed(), total.records, total.bytes);
        for (channel, removed) in &report.removed {
            let served = self.channels.get_key_value(channel.as_str());
            let floor = served.and_then(|(_, (_, s))| match s {
                ChannelStore::Append(s) => Some(s.floor()),
                ChannelStore::Latest(s) => Some(s.floor()),
                ChannelStore::Queue(_) => None,
            });
            tracing::debug!(channel = %channel, sweep = which.label(), records = removed.records,
                bytes = removed.bytes, floor, "retention removed records");
            if let (Some((name, _)), Some(floor)) = (served, floor) {
                // A state that has stopped has nothing left to let go of.
                let _ = self.floors.send(Event::FloorRaised {
                    channel: name.clone(),
                    floor,
                });
            }
        }
        // Logged when a channel's sweep starts failing and when it stops,
        // not at every tick: a full disk fails every sweep until it has
        // room, and must not fill the log meanwhile.
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        for (channel, error) in &report.failed {
            let provider = self
                .channels
                .get(channel.as_str())
                .map_or("", |(provider, _)| provider.as_str());
            if failing.insert((which.label(), channel.clone())) {
                tracing::warn!(channel = %channel, provider = %provider, sweep = which.label(), error = %error,
                    "the retention sweep failed; it runs again at every tick, and says so when it succeeds");
            }
            self.metrics.storage_error(provider, error.kind());
        }
        failing.retain(|(label, channel)| {
            let still = *label != which.label() || report.failed.iter().any(|(c, _)| c == channel);
            if !still {
                tracing::info!(channel = %channel, sweep = label, "the retention sweep succeeds again");
            }
            still
        });
        drop(failing);
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::contract::Provider;
    use crate::storage::memory::MemoryProvider;
    use saguin_format::model::{ChannelKind, Record};

    const SECOND: i64 = 1_000_000_000;

    /// Where a test's sweeps tell floors nobody reads.
    fn floors() -> mpsc::UnboundedSender<Event> {
        mpsc::unbounded_channel().0
    }

    fn provider() -> Arc<MemoryProvider> {
        MemoryProvider::unbounded()
    }

    fn served(provider: &Arc<MemoryProvider>, name: &str, retention: Retention) -> ServedChannel {
        let store = provider
            .open_channel(name, ChannelKind::Append)
            .expect("open");
        ServedChannel {
            name: Arc::from(name),
            provider: provider.clone(),
            store,
            retention,
            queue: None,
        }
    }

    fn record(channel: &str, payload: &str, timestamp: i64) -> Record {
        Record {
            timestamp,
            ..Record::new(channel, payload.to_owned())
        }
    }

    #[test]
    fn the_age_sweep_runs_every_tenth_of_the_shortest_retention_never_under_a_second() {
        let s = Duration::from_secs;
        assert_eq!(age_sweep_period([]), None);
        assert_eq!(age_sweep_period([s(3600), s(7 * 86400)]), Some(s(360)));
        assert_eq!(age_sweep_period([s(10)]), Some(s(1)));
        assert_eq!(
            age_sweep_period([s(3), s(3600)]),
            Some(MIN_AGE_SWEEP_PERIOD)
        );
    }

    #[tokio::test]
    async fn a_channel_over_retention_bytes_is_trimmed_to_fit_and_its_floor_rises() {
        let p = provider();
        let bounded = served(&p, "telemetry", Retention::default());
        for i in 0..10 {
            bounded
                .store
                .as_append()
                .expect("append")
                .append(record("telemetry", &format!("payload {i:02}"), 0))
                .unwrap();
        }
        let one = bounded.store.as_append().expect("append").bytes() / 10;
        let limit = one * 4;
        let bounded = ServedChannel {
            retention: Retention {
                bytes: Some(limit),
                age: None,
                deletions: None,
            },
            ..bounded
        };
        let unbounded = served(&p, "other", Retention::default());
        unbounded
            .store
            .as_append()
            .expect("append")
            .append(record("other", "x", 0))
            .unwrap();
        let metrics = Arc::new(Metrics::new());
        let (floors, mut told) = mpsc::unbounded_channel();
        let task = spawn(
            vec![bounded.clone(), unbounded.clone()],
            metrics.clone(),
            floors,
        );
        task.stop().await;
        match told.try_recv() {
            Ok(Event::FloorRaised { channel, floor }) => {
                assert_eq!(
                    (&*channel, floor),
                    ("telemetry", 7),
                    "the state is told the floor"
                );
            }
            other => panic!("the state was told {other:?}"),
        }
        assert!(told.try_recv().is_err(), "nothing of the unbounded channel");
        let store = &bounded.store.as_append().expect("append");
        assert!(store.bytes() <= limit, "{} > {limit}", store.bytes());
        assert_eq!(store.record_count(), 4);
        assert_eq!(store.floor(), 7, "the floor rose over the six removed");
        assert_eq!(store.next(), 11, "next is untouched");
        assert_eq!(
            store.read_from(7).unwrap()[0].payload.as_ref(),
            b"payload 06"
        );
        assert_eq!(
            unbounded.store.as_append().expect("append").record_count(),
            1,
            "no bound, nothing removed"
        );
        assert_eq!(metrics.storage_error_count("mem"), 0);
        let text = metrics.render();
        for (series, value) in [
            ("saguin_retention_sweeps_total{sweep=\"size\"}", "1"),
            (
                "saguin_retention_removed_records_total{sweep=\"size\"}",
                "6",
            ),
            ("saguin_retention_sweeps_total{sweep=\"age\"}", "0"),
        ] {
            assert!(
                text.lines().any(|l| l == format!("{series} {value}")),
                "{series} {value} in:\n{text}"
            );
        }
    }

    #[tokio::test]
    async fn a_latest_channels_deletions_past_its_bound_are_forgotten_and_its_floor_told() {
        let p = provider();
        let store = p
            .open_channel("devices", ChannelKind::Latest)
            .expect("open");
        let latest = store.as_latest().expect("latest").clone();
        latest
            .set(record("devices/kept", "on", 1))
            .expect("a value that stays");
        for i in 0..5 {
            let topic = format!("devices/d{i}");
            latest.set(record(&topic, "on", 1)).expect("set");
            latest.set(record(&topic, "", 1)).expect("delete");
        }
        assert_eq!((latest.deletions(), latest.next()), (5, 12));
        let channel = ServedChannel {
            name: Arc::from("devices"),
            provider: p.clone(),
            store,
            retention: Retention {
                deletions: Some(2),
                ..Retention::default()
            },
            queue: None,
        };
        let metrics = Arc::new(Metrics::new());
        let (floors, mut told) = mpsc::unbounded_channel();
        let task = spawn(vec![channel], metrics.clone(), floors);
        task.stop().await;
        // The markers of d0..d2 (offsets 3, 5, 7) went: the floor is past
        // the last of them, above the value that stays current.
        match told.try_recv() {
            Ok(Event::FloorRaised { channel, floor }) => {
                assert_eq!((&*channel, floor), ("devices", 8));
            }
            other => panic!("the state was told {other:?}"),
        }
        assert_eq!((latest.deletions(), latest.floor()), (2, 8));
        assert_eq!(latest.get("devices/kept").unwrap().unwrap().offset, 1);
        let text = metrics.render();
        assert!(
            text.lines()
                .any(|l| l == "saguin_retention_removed_records_total{sweep=\"size\"} 3"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_record_with_timestamp_0_is_never_removed_by_age() {
        let p = provider();
        let channel = served(
            &p,
            "telemetry",
            Retention {
                bytes: None,
                age: Some(Duration::from_secs(60)),
                deletions: None,
            },
        );
        let now = contract::now_nanos();
        // Two ancient records, one with no timestamp, then an old one
        // behind it that the walk does not reach.
        for (payload, at) in [
            ("ancient", SECOND),
            ("unset", 0),
            ("old", now - 3600 * SECOND),
            ("new", now),
        ] {
            channel
                .store
                .as_append()
                .expect("append")
                .append(record("telemetry", payload, at))
                .unwrap();
        }
        let task = spawn(vec![channel.clone()], Arc::new(Metrics::new()), floors());
        task.stop().await;
        let kept: Vec<Vec<u8>> = channel
            .store
            .as_append()
            .expect("append")
            .read_from(channel.store.as_append().expect("append").floor())
            .unwrap()
            .iter()
            .map(|r| r.payload.to_vec())
            .collect();
        assert_eq!(kept, [b"unset".to_vec(), b"old".to_vec(), b"new".to_vec()]);
        assert_eq!(channel.store.as_append().expect("append").floor(), 2);

        // Alone, an unset timestamp stays at any age.
        let alone = served(
            &p,
            "unset",
            Retention {
                bytes: None,
                age: Some(Duration::from_secs(1)),
                deletions: None,
            },
        );
        alone
            .store
            .as_append()
            .expect("append")
            .append(record("unset", "x", 0))
            .unwrap();
        let sweeper = Sweeper::new(vec![alone.clone()], Arc::new(Metrics::new()), floors());
        let report = sweeper.sweep(Sweep::Age, i64::MAX);
        assert!(report.removed.is_empty() && report.failed.is_empty());
        assert_eq!(alone.store.as_append().expect("append").record_count(), 1);
    }

    #[test]
    fn a_refused_sweep_names_the_channel_and_counts_against_its_provider() {
        let p = provider();
        let channel = served(
            &p,
            "telemetry",
            Retention {
                bytes: Some(1),
                age: None,
                deletions: None,
            },
        );
        channel
            .store
            .as_append()
            .expect("append")
            .append(record("telemetry", "too big", 0))
            .unwrap();
        p.close().unwrap();
        let metrics = Arc::new(Metrics::new());
        let sweeper = Sweeper::new(vec![channel.clone()], metrics.clone(), floors());
        let report = sweeper.sweep(Sweep::Size, contract::now_nanos());
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].0, "telemetry");
        assert_eq!(metrics.storage_error_count("mem"), 1);
        assert_eq!(
            channel.store.as_append().expect("append").record_count(),
            1,
            "nothing went"
        );
    }

    #[tokio::test]
    async fn without_any_bound_there_is_nothing_to_run() {
        let p = provider();
        let channel = served(&p, "telemetry", Retention::default());
        let task = spawn(vec![channel], Arc::new(Metrics::new()), floors());
        assert!(task.task.is_none());
        task.stop().await;
    }
}
