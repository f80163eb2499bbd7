//! Background snapshots: each memory provider with a snapshot directory
//! writes a generation of it a quiet `snapshot_debounce` after its last
//! change, and at the latest `snapshot_max_delay` after the first change
//! since its last generation (`storage::generation`, `format/FORMAT.md`
//! §4). What a crash loses is what changed after the last generation that
//! committed: at most the maximum delay and one generation's write.
//!
//! Who does what:
//!
//! - The broker task notices changes (each provider counts its stores'
//!   changes; one atomic load a turn), keeps each provider's [`Schedule`]
//!   on its own clock, and, when a generation is due, captures it:
//!   [`Generations::capture`] copies the counters, positions and shared
//!   record handles of the stores that changed - of an append channel,
//!   only the handles of the records appended since the last capture. The
//!   broker task is the one writer of a memory provider's stores, so the
//!   capture is the provider's state at one moment of the broker's order -
//!   a frozen view that copies no record and costs a walk of pointers over
//!   what changed, not over what the channels hold. Its cost is measured
//!   (`saguin_snapshot_capture_seconds`).
//! - A thread of the provider's own ([`SnapshotWriter`]) completes each
//!   append channel's copy from the records it held from the last capture,
//!   then encodes and writes the generation. The broker task never waits for it: one
//!   generation is out at a time, and changes meanwhile wait for the next.
//! - A generation that fails (a file, or its manifest) leaves the previous
//!   one current; each file's failure is logged once when it starts failing
//!   and once when it is written again, every failed write is counted, and
//!   the stores it did not write are written again at the next attempt, no
//!   sooner than the maximum delay (at least a second) after the failure.
//! - At a graceful stop the writer is stopped (its generation finished)
//!   and the providers' close writes the last generation: whatever changed
//!   since the last one, nothing when nothing did.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::metrics::{Metrics, SnapshotMetrics};
use crate::config::SnapshotSchedule;
use crate::storage::contract::{self, FaultKind};
use crate::storage::generation::{Generations, Job, Outcome};
use crate::storage::memory::MemoryProvider;
use crate::storage::snapshot_write::Unobserved;

/// The least gap between a failed generation and the next attempt.
const RETRY_AT_LEAST: Duration = Duration::from_secs(1);

/// When a provider's next generation is due. Pure: it is told of changes
/// and of generations starting and ending, with the time each happened.
#[derive(Clone, Debug)]
pub struct Schedule {
    schedule: SnapshotSchedule,
    /// The first change no capture holds yet.
    first_change: Option<Instant>,
    /// The latest change seen.
    last_change: Option<Instant>,
    /// A generation is being written: the next waits for it.
    writing: bool,
    /// After a failed generation, no attempt before this.
    retry_at: Option<Instant>,
}

impl Schedule {
    pub fn new(schedule: SnapshotSchedule) -> Schedule {
        Schedule {
            schedule,
            first_change: None,
            last_change: None,
            writing: false,
            retry_at: None,
        }
    }

    /// Something changed at `now`.
    pub fn changed(&mut self, now: Instant) {
        self.first_change.get_or_insert(now);
        self.last_change = Some(now);
    }

    /// When the next generation is to be captured: `None` with nothing
    /// changed, while one is being written, or with background snapshots
    /// off.
    pub fn due_at(&self) -> Option<Instant> {
        let max_delay = self.schedule.max_delay?;
        if self.writing {
            return None;
        }
        let first = self.first_change?;
        let latest = first + max_delay;
        let due = match (self.schedule.debounce, self.last_change) {
            (Some(debounce), Some(last)) => (last + debounce).min(latest),
            _ => latest,
        };
        Some(self.retry_at.map_or(due, |retry| due.max(retry)))
    }

    /// A generation was captured: it holds every change until now.
    pub fn started(&mut self) {
        self.writing = true;
        self.first_change = None;
        self.last_change = None;
    }

    /// The generation ended at `now`. One that failed is to be tried
    /// again: its stores count as changed, no sooner than the retry gap -
    /// unless it gave up the snapshot room for the retry to write into
    /// (`into_room`), which is then due as any change is.
    pub fn finished(&mut self, now: Instant, failed: bool, into_room: bool) {
        self.writing = false;
        if failed {
            let gap = self
                .schedule
                .max_delay
                .unwrap_or(RETRY_AT_LEAST)
                .max(RETRY_AT_LEAST);
            self.retry_at = (!into_room).then(|| now + gap);
            self.changed(now);
        } else {
            self.retry_at = None;
        }
    }

    /// True while a generation is being written.
    pub fn is_writing(&self) -> bool {
        self.writing
    }
}

/// One provider's generations and the thread that writes them.
pub struct SnapshotWriter {
    name: String,
    provider: Arc<MemoryProvider>,
    /// Held by the writing thread for the length of a write: a capture
    /// (which the schedule never asks for while one is written) and the
    /// shutdown's last generation wait for it.
    generations: Arc<Mutex<Generations>>,
    schedule: SnapshotSchedule,
    jobs: Mutex<Option<std_mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Where the thread says what each generation came to, once the
    /// broker task listens ([`Snapshots::new`]); until then, and after,
    /// what it wrote waits in `unread`.
    tell: Arc<Mutex<Option<(usize, Tell)>>>,
    unread: Arc<Mutex<Vec<Written>>>,
    metrics: Arc<SnapshotMetrics>,
    /// The broker's metrics, where each failed file is also counted as a
    /// storage error of kind `snapshot` (set by [`Self::report_to`]).
    broker_metrics: Mutex<Option<Arc<Metrics>>>,
    /// Files whose last write failed: logged when they start failing and
    /// when they are written again, not at every attempt.
    failing: Mutex<BTreeSet<String>>,
}

/// Where a writer's thread says what each generation came to, with the
/// index of its provider.
type Tell = mpsc::UnboundedSender<(usize, Written)>;

/// What the writing thread says of one generation.
pub struct Written {
    pub outcome: Outcome,
    pub elapsed: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SnapshotWriter {
    /// The writer of `provider`'s `generations`, its thread started when
    /// `schedule` writes in the background.
    pub fn start(
        name: &str,
        provider: Arc<MemoryProvider>,
        generations: Generations,
        schedule: SnapshotSchedule,
    ) -> Arc<SnapshotWriter> {
        let metrics = Arc::new(SnapshotMetrics::default());
        let committed = generations.committed();
        metrics.set_committed(committed.generation, committed.captured_at);
        if let Some(kept) = generations.room_kept() {
            metrics.set_room(kept);
        }
        let generations = Arc::new(Mutex::new(generations));
        let writer = Arc::new(SnapshotWriter {
            name: name.to_owned(),
            provider,
            generations: generations.clone(),
            schedule,
            jobs: Mutex::new(None),
            thread: Mutex::new(None),
            tell: Arc::default(),
            unread: Arc::default(),
            metrics,
            broker_metrics: Mutex::new(None),
            failing: Mutex::new(BTreeSet::new()),
        });
        if schedule.is_background() {
            let (jobs, queued) = std_mpsc::channel::<Job>();
            let (tell, unread) = (writer.tell.clone(), writer.unread.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("saguin-snapshot-{name}"))
                .spawn(move || {
                    for job in queued {
                        let started = std::time::Instant::now();
                        let outcome = lock(&generations).write(job, &Unobserved);
                        let written = Written {
                            outcome,
                            elapsed: started.elapsed(),
                        };
                        let unsent = match lock(&tell).as_ref() {
                            Some((index, tx)) => tx.send((*index, written)).err().map(|e| e.0 .1),
                            None => Some(written),
                        };
                        lock(&unread).extend(unsent);
                    }
                });
            match spawned {
                Ok(handle) => {
                    *lock(&writer.jobs) = Some(jobs);
                    *lock(&writer.thread) = Some(handle);
                }
                Err(e) => {
                    tracing::error!(provider = %name, error = %e,
                        "cannot start the snapshot writer thread; this provider is written at shutdown only");
                }
            }
        }
        writer
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn metrics(&self) -> &Arc<SnapshotMetrics> {
        &self.metrics
    }

    /// Exports this provider's `saguin_snapshot_*` series in `metrics`, and
    /// counts each failed file there as a storage error.
    pub fn report_to(&self, metrics: Arc<Metrics>) {
        metrics.register_snapshots(&self.name, self.metrics.clone());
        *lock(&self.broker_metrics) = Some(metrics);
    }

    /// One snapshot file (or manifest) of this provider could not be
    /// written.
    pub fn count_failure(&self) {
        self.metrics.failures.fetch_add(1, Ordering::Relaxed);
        if let Some(metrics) = lock(&self.broker_metrics).as_ref() {
            metrics.storage_error(&self.name, FaultKind::Snapshot);
        }
    }

    pub fn schedule(&self) -> SnapshotSchedule {
        self.schedule
    }

    /// The provider's count of changes, to compare turn by turn.
    pub fn changes(&self) -> u64 {
        self.provider.changes()
    }

    /// Whether a store changed since it was last written or captured
    /// (at startup: a store with no file yet, or one whose file is behind).
    pub fn has_changes(&self) -> bool {
        lock(&self.generations).has_changes(&self.provider)
    }

    /// True while a thread writes this provider's generations.
    fn runs(&self) -> bool {
        lock(&self.thread).is_some()
    }

    /// Tells the thread where to say what each generation came to.
    fn tell_to(&self, index: usize, tx: Tell) {
        *lock(&self.tell) = Some((index, tx));
    }

    /// Captures the generation due and hands it to the thread; false when
    /// nothing changed after all (or the thread is gone).
    pub fn submit(&self) -> bool {
        let started = std::time::Instant::now();
        let job = {
            let mut generations = lock(&self.generations);
            generations.capture(&self.provider, contract::now_nanos())
        };
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.metrics
            .last_capture_nanos
            .store(took, Ordering::Relaxed);
        self.metrics
            .max_capture_nanos
            .fetch_max(took, Ordering::Relaxed);
        let Some(job) = job else {
            return false;
        };
        tracing::debug!(provider = %self.name, stores = job.stores(), capture_us = took / 1000,
            "snapshot generation captured");
        lock(&self.jobs)
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok())
    }

    /// Takes in what a generation came to: logs each file's change of
    /// state, counts, and says whether it failed.
    pub fn settled(&self, written: &Written) -> bool {
        let report = &written.outcome.report;
        let metrics = &self.metrics;
        let mut failing = lock(&self.failing);
        for file in &report.written {
            metrics.files_written.fetch_add(1, Ordering::Relaxed);
            metrics
                .bytes_written
                .fetch_add(file.bytes, Ordering::Relaxed);
            if failing.remove(&file.name) {
                tracing::info!(provider = %self.name, file = %file.file_name, store = %file.name,
                    "snapshot file written again after failing");
            }
        }
        for failed in &report.failed {
            self.count_failure();
            if failing.insert(failed.name.clone()) {
                tracing::error!(provider = %self.name, path = %failed.path.display(),
                    error = %failed.error,
                    "snapshot file could not be written: its previous generation's file stands, and it is tried again at the next generation");
            }
        }
        if let Some(kept) = written.outcome.room_kept {
            metrics.set_room(kept);
        }
        let write_nanos = u64::try_from(written.elapsed.as_nanos()).unwrap_or(u64::MAX);
        metrics
            .last_write_nanos
            .store(write_nanos, Ordering::Relaxed);
        metrics
            .max_write_nanos
            .fetch_max(write_nanos, Ordering::Relaxed);
        if let Some(committed) = &written.outcome.committed {
            metrics.generations.fetch_add(1, Ordering::Relaxed);
            metrics.set_committed(committed.generation, committed.captured_at);
            tracing::debug!(provider = %self.name, generation = committed.generation,
                captured_at = committed.captured_at,
                files = report.written.len().saturating_sub(1), removed = written.outcome.removed,
                elapsed_ms = written.elapsed.as_millis() as u64, "snapshot generation committed");
        }
        !report.failed.is_empty()
    }

    /// Stops the thread once it has written what it was given: no
    /// generation is out when this returns. Blocking; idempotent.
    pub fn stop(&self) {
        drop(lock(&self.jobs).take());
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
        *lock(&self.tell) = None;
        // What the thread wrote that the broker task did not read.
        let unread = std::mem::take(&mut *lock(&self.unread));
        for written in &unread {
            self.settled(written);
        }
    }

    /// The generations, for the shutdown's last one (after [`Self::stop`]).
    pub fn generations(&self) -> MutexGuard<'_, Generations> {
        lock(&self.generations)
    }

    /// The provider written.
    pub fn provider(&self) -> &Arc<MemoryProvider> {
        &self.provider
    }

    /// Records what the shutdown's generation came to.
    pub fn record_committed(&self, generation: u64, captured_at: i64) {
        self.metrics.set_committed(generation, captured_at);
    }
}

/// One provider's background snapshots as the broker task drives them.
struct Driven {
    writer: Arc<SnapshotWriter>,
    schedule: Schedule,
    /// The provider's change count at the last look.
    seen: u64,
    /// What a crash would lose, for `saguin_snapshot_unsaved_seconds`.
    unsaved: Unsaved,
}

/// The oldest change a crash would lose, in Unix nanoseconds: of the
/// changes no capture holds yet, and of those the generation being written
/// holds (lost too until it commits).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Unsaved {
    pending: Option<i64>,
    writing: Option<i64>,
}

impl Unsaved {
    fn changed(&mut self, at: i64) {
        self.pending.get_or_insert(at);
    }

    /// A capture took every pending change.
    fn captured(&mut self) {
        self.writing = self.pending.take();
    }

    /// Nothing had changed after all.
    fn nothing_changed(&mut self) {
        self.pending = None;
    }

    /// The generation being written committed, or failed (its changes are
    /// pending again).
    fn finished(&mut self, failed: bool) {
        if let Some(writing) = self.writing.take() {
            if failed {
                self.pending = Some(self.pending.map_or(writing, |p| p.min(writing)));
            }
        }
    }

    fn since(&self) -> Option<i64> {
        match (self.pending, self.writing) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Driven {
    /// Shows what a crash would lose in the provider's metrics.
    fn publish_unsaved(&self) {
        let since = self
            .unsaved
            .since()
            .map_or(0, |at| u64::try_from(at).unwrap_or(0).max(1));
        self.writer
            .metrics
            .unsaved_since
            .store(since, Ordering::Relaxed);
    }
}

/// Every provider's background snapshots, driven from the broker task.
#[derive(Default)]
pub struct Snapshots {
    driven: Vec<Driven>,
    /// What the writers' threads say, with the index of their provider.
    finished: Option<mpsc::UnboundedReceiver<(usize, Written)>>,
}

impl Snapshots {
    /// Background snapshots of the writers that write them. A provider
    /// whose stores changed before the start (no file yet, or one left
    /// behind) has its first generation due at once.
    pub fn new(writers: &[Arc<SnapshotWriter>], now: Instant) -> Snapshots {
        let (tx, rx) = mpsc::unbounded_channel();
        let driven: Vec<Driven> = writers
            .iter()
            .filter(|w| w.schedule().is_background() && w.runs())
            .enumerate()
            .map(|(i, w)| {
                w.tell_to(i, tx.clone());
                let mut schedule = Schedule::new(w.schedule());
                let mut unsaved = Unsaved::default();
                if w.has_changes() {
                    schedule.changed(now);
                    unsaved.changed(contract::now_nanos());
                }
                w.metrics.background.store(true, Ordering::Relaxed);
                let driven = Driven {
                    seen: w.changes(),
                    writer: w.clone(),
                    schedule,
                    unsaved,
                };
                driven.publish_unsaved();
                driven
            })
            .collect();
        Snapshots {
            finished: (!driven.is_empty()).then_some(rx),
            driven,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.driven.is_empty()
    }

    /// Looks at every provider's change count (after each turn of the
    /// broker task): a count that moved is a change now.
    pub fn observe(&mut self, now: Instant) {
        for d in &mut self.driven {
            let changes = d.writer.changes();
            if changes != d.seen {
                d.seen = changes;
                d.schedule.changed(now);
                if d.unsaved.pending.is_none() {
                    d.unsaved.changed(contract::now_nanos());
                    d.publish_unsaved();
                }
            }
        }
    }

    /// The earliest moment a generation is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.driven.iter().filter_map(|d| d.schedule.due_at()).min()
    }

    /// Captures and hands over every generation due at `now`.
    pub fn start_due(&mut self, now: Instant) {
        for d in &mut self.driven {
            if d.schedule.due_at().is_some_and(|due| due <= now) {
                // The count as the capture sees it: a change after this
                // look is a change for the next generation.
                d.seen = d.writer.changes();
                if d.writer.submit() {
                    d.schedule.started();
                    d.unsaved.captured();
                } else {
                    // Nothing changed after all: a position saved again at
                    // the place it had, say.
                    d.schedule = Schedule::new(d.writer.schedule());
                    d.unsaved.nothing_changed();
                }
                d.publish_unsaved();
            }
        }
    }

    /// The next generation a writer's thread finished, with its provider's
    /// index; pending for ever when no thread writes.
    pub async fn finished(&mut self) -> (usize, Written) {
        match self.finished.as_mut() {
            Some(rx) => match rx.recv().await {
                Some(done) => done,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// Takes in one finished generation at `now`.
    pub fn settle(&mut self, index: usize, written: Written, now: Instant) {
        if let Some(d) = self.driven.get_mut(index) {
            let failed = d.writer.settled(&written);
            d.schedule.finished(now, failed, written.outcome.room_given);
            d.unsaved.finished(failed);
            d.publish_unsaved();
        }
    }

    /// At the end of the broker task: every generation still being
    /// written is waited for and taken in.
    pub async fn drain(&mut self) {
        while self.driven.iter().any(|d| d.schedule.is_writing()) {
            let Some(rx) = self.finished.as_mut() else {
                return;
            };
            match rx.recv().await {
                Some((i, written)) => self.settle(i, written, Instant::now()),
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
