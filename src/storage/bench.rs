//! What a disk costs the storage layer, measured in a scratch directory on
//! it (`saguin bench`): how long an fsync takes, and how fast a memory
//! provider's snapshot generation is written. Nothing here touches a
//! provider's own files.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use saguin_format::model::{ChannelKind, Record, UnixNanos};

use super::contract::{AppendStore, Provider};
use super::generation::{Committed, Generations};
use super::memory::{MemoryConfig, MemoryProvider};
use super::snapshot_write::{SnapshotOptions, Unobserved};

/// Durations sorted, with their quantiles.
#[derive(Clone, Debug)]
pub struct Latencies {
    sorted: Vec<Duration>,
}

impl Latencies {
    pub fn new(mut samples: Vec<Duration>) -> Latencies {
        samples.sort_unstable();
        Latencies { sorted: samples }
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The `q` quantile (0..=1), nearest rank; zero with no sample.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((self.sorted.len() as f64 * q).ceil() as usize).clamp(1, self.sorted.len());
        self.sorted[rank - 1]
    }

    pub fn max(&self) -> Duration {
        self.sorted.last().copied().unwrap_or_default()
    }
}

/// `samples` times: 4 KiB written at the end of a file in `dir` and
/// `fdatasync`ed, the cost every sqlite flush and every snapshot file pays
/// at least once. `progress` is told after each.
pub fn fsync_latency(
    dir: &Path,
    samples: usize,
    mut progress: impl FnMut(),
) -> std::io::Result<Latencies> {
    let path = dir.join("fsync.probe");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)?;
    let block = vec![0x5au8; 4096];
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        times.push(start.elapsed());
        progress();
    }
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(Latencies::new(times))
}

/// One snapshot generation written.
#[derive(Clone, Copy, Debug)]
pub struct SnapshotWrite {
    /// What the provider's records count for (`max_bytes` counts this).
    pub accounted_bytes: u64,
    /// The files' bytes on the disk.
    pub file_bytes: u64,
    /// The files written: one a channel, the provider's own and the
    /// manifest.
    pub files: usize,
    pub elapsed: Duration,
    /// This process's CPU over the write (user and system, its exited
    /// threads' included): on ext4 without a journal making each file
    /// is the kernel's work, as long as the write.
    pub cpu: Duration,
}

impl SnapshotWrite {
    /// Accounted bytes a second: what a provider of a given `max_bytes`
    /// is written at.
    pub fn rate(&self) -> f64 {
        self.accounted_bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The time a file took, bytes and all.
    pub fn per_file(&self) -> Duration {
        self.each(self.elapsed)
    }

    /// The CPU a file took, bytes and all.
    pub fn cpu_per_file(&self) -> Duration {
        self.each(self.cpu)
    }

    /// What `files` such files take at [`Self::per_file`].
    pub fn files_take(&self, files: usize) -> Duration {
        times(self.per_file(), files)
    }

    /// The CPU `files` such files take at [`Self::cpu_per_file`].
    pub fn files_cpu(&self, files: usize) -> Duration {
        times(self.cpu_per_file(), files)
    }

    /// `total` shared among the files written.
    fn each(&self, total: Duration) -> Duration {
        total / u32::try_from(self.files.max(1)).unwrap_or(u32::MAX)
    }
}

/// `each` taken `count` times.
fn times(each: Duration, count: usize) -> Duration {
    each * u32::try_from(count).unwrap_or(u32::MAX)
}

/// A memory provider filled for a sample generation.
struct Sample {
    provider: Arc<MemoryProvider>,
    /// Its append channels, `bench0`, `bench1`, ...
    stores: Vec<Arc<dyn AppendStore>>,
}

impl Sample {
    /// A memory provider of `channels` append channels (one at least).
    fn of(channels: usize) -> std::io::Result<Sample> {
        let provider = MemoryProvider::new(MemoryConfig {
            name: "bench".into(),
            max_bytes: None,
            reserve: 0,
        })
        .map_err(std::io::Error::other)?;
        let stores = (0..channels.max(1))
            .map(|c| {
                let store = provider
                    .open_channel(&format!("bench{c}"), ChannelKind::Append)
                    .map_err(std::io::Error::other)?;
                store
                    .as_append()
                    .cloned()
                    .ok_or_else(|| std::io::Error::other("not an append channel"))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Sample { provider, stores })
    }

    /// Records of about `bytes` more in each channel (one at least).
    fn fill(&self, bytes: u64) -> std::io::Result<()> {
        for (c, store) in self.stores.iter().enumerate() {
            fill(store.as_ref(), c, bytes)?;
        }
        Ok(())
    }

    /// The generations of its snapshot directory `dir`.
    fn generations(&self, dir: &Path) -> Generations {
        Generations::new(
            dir,
            SnapshotOptions::default(),
            Committed::default(),
            &self.provider,
        )
    }
}

/// Appends 1 KiB records to `store` until they count for `bytes` (one at
/// least).
fn fill(store: &dyn AppendStore, channel: usize, bytes: u64) -> std::io::Result<()> {
    let payload = bytes::Bytes::from(vec![0xa5u8; 1024]);
    let mut held = 0;
    let mut i: u64 = 0;
    while held < bytes.max(1) {
        let mut r = Record::new(format!("bench{channel}/device/{}", i % 64), payload.clone());
        r.client_id = "bench".into();
        r.timestamp = 1;
        r.qos = 1;
        held += r.accounted_size();
        store.append(r).map_err(std::io::Error::other)?;
        i += 1;
    }
    Ok(())
}

/// Writes what changed in `provider` as its next generation, captured at
/// `captured_at`, timed.
fn timed_generation(
    generations: &mut Generations,
    provider: &MemoryProvider,
    captured_at: UnixNanos,
) -> std::io::Result<SnapshotWrite> {
    let accounted_bytes = provider.bytes();
    let cpu_before = process_cpu()?;
    let start = Instant::now();
    let job = generations
        .capture(provider, captured_at)
        .ok_or_else(|| std::io::Error::other("nothing to write"))?;
    let outcome = generations.write(job, &Unobserved);
    let elapsed = start.elapsed();
    let cpu = process_cpu()?.saturating_sub(cpu_before);
    if let Some(failed) = outcome.report.failed.first() {
        return Err(std::io::Error::new(
            failed.error.kind(),
            format!("{}: {}", failed.path.display(), failed.error),
        ));
    }
    let file_bytes = outcome.report.written.iter().map(|w| w.bytes).sum();
    Ok(SnapshotWrite {
        accounted_bytes,
        file_bytes,
        files: outcome.report.written.len(),
        elapsed,
        cpu,
    })
}

/// This process's CPU so far, user and system, the threads that have
/// ended included (`getrusage(RUSAGE_SELF)`).
fn process_cpu() -> std::io::Result<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes the whole struct when it returns 0, and
    // it is read only then.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    Ok(time(usage.ru_utime) + time(usage.ru_stime))
}

/// Fills a memory provider with about `bytes` of 1 KiB records over
/// `channels` append channels and writes it to `dir` as one generation, the
/// way a broker's stop writes a full provider: every file to a temporary
/// name, made durable, renamed, the manifest last.
pub fn snapshot_write(dir: &Path, bytes: u64, channels: usize) -> std::io::Result<SnapshotWrite> {
    let sample = Sample::of(channels)?;
    sample.fill(bytes / sample.stores.len() as u64)?;
    timed_generation(&mut sample.generations(dir), &sample.provider, 1)
}

/// What a generation's files cost apart from their bytes: `channels`
/// channels of one 1 KiB record each, written as a generation, then a
/// record more in each and the next generation, and again, the third
/// timed, as a running broker's generation is when every channel changed:
/// a file each made, written and synced, seconds after the generation
/// before removed as many (which ext4 without a journal makes each new
/// file pay for), and the earlier generation's files removed.
pub fn snapshot_files(dir: &Path, channels: usize) -> std::io::Result<SnapshotWrite> {
    let sample = Sample::of(channels)?;
    let mut generations = sample.generations(dir);
    for captured_at in 1..=2 {
        sample.fill(1)?;
        timed_generation(&mut generations, &sample.provider, captured_at)?;
    }
    sample.fill(1)?;
    timed_generation(&mut generations, &sample.provider, 3)
}

/// True when `dir` is a memory provider's snapshot directory (it holds the
/// provider's lock file or a manifest): a scratch directory is never made
/// inside one, whether its broker runs or not.
pub fn is_snapshot_dir(dir: &Path) -> bool {
    use saguin_format::channel_name::{LOCK_FILE, MANIFEST_FILE};
    dir.join(LOCK_FILE).exists() || dir.join(MANIFEST_FILE).exists()
}

/// A directory made for one run inside `parent` (same file system), mode
/// 0700, removed with everything in it when dropped.
pub struct Scratch {
    path: std::path::PathBuf,
}

impl Scratch {
    pub fn new(parent: &Path) -> std::io::Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = parent.join(format!(".saguin-bench-{}-{stamp}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Scratch { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Whether `dir` takes a file at all (written, fsynced, removed): asked
/// before a run relies on it, so a read-only or full directory is named
/// at once.
pub fn writable(dir: &Path) -> std::io::Result<()> {
    let path = dir.join("write.probe");
    let mut f = File::create(&path)?;
    f.write_all(b"x")?;
    f.sync_all()?;
    drop(f);
    std::fs::remove_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let l = Latencies::new((1..=100).map(Duration::from_millis).collect());
        assert_eq!(l.quantile(0.5), Duration::from_millis(50));
        assert_eq!(l.quantile(0.99), Duration::from_millis(99));
        assert_eq!(l.max(), Duration::from_millis(100));
        assert_eq!(Latencies::new(Vec::new()).quantile(0.5), Duration::ZERO);
    }

    #[test]
    fn a_snapshot_write_is_one_whole_generation_of_the_bytes_asked() {
        let d = tempfile::tempdir().unwrap();
        let w = snapshot_write(d.path(), 256 * 1024, 2).unwrap();
        assert!(w.accounted_bytes >= 256 * 1024, "{w:?}");
        assert!(w.file_bytes > w.accounted_bytes, "{w:?}");
        let report = crate::storage::snapshot_dir::scan_checking(
            d.path(),
            &crate::storage::snapshot_dir::ScanOptions::default(),
        )
        .unwrap();
        assert!(report.findings.is_empty(), "{:?}", report.findings);
        assert_eq!(report.committed.generation, 1);
    }

    #[test]
    fn a_files_sample_writes_a_file_for_each_channel_of_one_record() {
        let d = tempfile::tempdir().unwrap();
        let w = snapshot_files(d.path(), 50).unwrap();
        let channel_files = std::fs::read_dir(d.path())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with("bench")
            })
            .count();
        assert_eq!(channel_files, 50);
        assert!(
            w.files > 50,
            "the manifest and the provider's files too: {w:?}"
        );
        // Three records of 1 KiB and their topics a channel, the third
        // generation's.
        assert!(
            w.accounted_bytes >= 150 * 1024 && w.accounted_bytes < 150 * 1200,
            "{w:?}"
        );
        // As many files as were written take the generation's time, but
        // for what dividing it by them left over.
        let left_over = w.elapsed - w.files_take(w.files);
        assert!(left_over < Duration::from_nanos(w.files as u64), "{w:?}");
        // Making, writing and syncing fifty files is the kernel's work at
        // the least, and is counted; shared among the files, it adds back
        // up as the time does.
        assert!(w.cpu > Duration::ZERO, "{w:?}");
        let cpu_left_over = w.cpu - w.files_cpu(w.files);
        assert!(
            cpu_left_over < Duration::from_nanos(w.files as u64),
            "{w:?}"
        );
    }

    #[test]
    fn the_process_cpu_counts_a_thread_that_has_ended() {
        // Work on a thread until the process's count has moved by a
        // millisecond, then let the thread end: what it spent stays in
        // the count.
        let counted_while_it_ran = std::thread::spawn(|| {
            let start = process_cpu().unwrap();
            loop {
                let now = process_cpu().unwrap();
                if now >= start + Duration::from_millis(1) {
                    return now;
                }
            }
        })
        .join()
        .unwrap();
        assert!(process_cpu().unwrap() >= counted_while_it_ran);
    }
}
