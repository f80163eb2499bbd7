//! Memory provider figures: a shutdown's cost, many channels rather than
//! one large one, removing a record, the retention sweep. Run with `cargo bench --bench storage_memory`; set TMPDIR
//! to real storage (a tmpfs measures the page cache, where fsync does
//! nothing). `SAGUIN_BENCH_QUICK=1` runs the small sizes only;
//! `SAGUIN_BENCH_ONLY` runs one section: `one` (one large channel),
//! `shutdown`, `trim`, `sweep`, `changed` (a generation after changes in
//! one channel of many) or `spread` (after one record in each of many).
//!
//! Figures from one run (`cargo bench --bench storage_memory`): a KVM guest
//! with 2 vCPUs of an AMD EPYC and 24 GB, ext4 on a virtio disk, Linux
//! 6.18, rustc 1.95, shared with other builds throughout (load average
//! 9-11 on 2 CPUs), so wall-clock CPU work reads 3-4x its idle figure; the
//! "write CPU" column is the process's CPU time for the same write.
//!
//! One append channel, 128-byte payloads; the plain write+fsync of the same
//! bytes alternates with the snapshot write in the same run:
//!
//! | records   | copy (under the lock) | write  | write CPU | file bytes  | write+fsync | ratio |
//! |-----------|-----------------------|--------|-----------|-------------|-------------|-------|
//! | 1,000     | 5.0us                 | 35.9ms | 1.6ms     | 219,104     | 8.0ms       | 4.50x |
//! | 10,000    | 48.7us                | 39.1ms | 3.4ms     | 2,190,104   | 11.9ms      | 3.29x |
//! | 100,000   | 1.5ms                 | 102ms  | 20.7ms    | 21,900,104  | 57.1ms      | 1.79x |
//! | 1,000,000 | 32.6ms                | 615ms  | 196ms     | 219,000,104 | 306ms       | 2.01x |
//!
//! The small rows are four syncs (manifest, directory, channel file,
//! directory) against one. A whole shutdown, 8 records a channel, its
//! files synced together (on a 2-vCPU Intel Xeon guest, TMPDIR on an ext4
//! image with a journal; docs/benchmarks.md, "Storage providers", has
//! them beside each file synced on its own):
//!
//! | channels | shutdown | per channel |
//! |----------|----------|-------------|
//! | 10       | 3.0-4.3ms | 0.3-0.4ms  |
//! | 100      | 5.8-6.8ms | 58-68us    |
//! | 1,000    | 39-43ms   | 39-43us    |
//! | 10,000   | 391-431ms | 39-43us    |
//!
//! A generation after one record appended to each of 10,000 channels:
//! its capture, what the broker's loop spends, 3.8-3.9ms after the first
//! (8.9-12.7ms, every channel copied whole), on the AMD EPYC guest.
//!
//! One record trimmed from the front of a long channel (amortised over
//! batches, compaction of the dead prefix included): 10,000 records 192ns,
//! 100,000 148ns, 800,000 278ns - flat in the length; the cost is freeing
//! the record (its topic, client id, payload and handle), which is the point
//! of clearing it. One retention pass with nothing to remove, by size / by
//! age: 10 channels 90ns / 170ns, 100 591ns / 1.8us, 1,000 9.1us / 18.1us,
//! 10,000 184us / 254us.

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use saguin::model::{ChannelKind, Record};
use saguin::storage::contract::{sweep_by_age, sweep_by_size, AppendStore, Provider, Retention};
use saguin::storage::generation::{save_snapshot, write_snapshot, Committed, Generations};
use saguin::storage::memory::{MemoryConfig, MemoryProvider};
use saguin::storage::snapshot_write::{copy_provider, SnapshotOptions, Unobserved};

fn provider() -> Arc<MemoryProvider> {
    MemoryProvider::new(MemoryConfig {
        name: "bench".into(),
        max_bytes: None,
        reserve: 0,
    })
    .expect("provider")
}

fn record(i: u64) -> Record {
    let mut r = Record::new("telemetry/device/temp", vec![(i % 251) as u8; 128]);
    r.timestamp = 1_700_000_000_000_000_000 + i as i64;
    r.client_id = "bench-client".into();
    r.qos = 1;
    r.message_id = [(i % 256) as u8; 16];
    r
}

fn append(p: &MemoryProvider, name: &str) -> Arc<dyn AppendStore> {
    p.open_channel(name, ChannelKind::Append)
        .expect("open")
        .as_append()
        .expect("append")
        .clone()
}

/// The median of `runs` timings of `f`.
fn median(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut times: Vec<Duration> = (0..runs).map(|_| f()).collect();
    times.sort();
    times[times.len() / 2]
}

fn fmt(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1_000.0 {
        format!("{ns:.0}ns")
    } else if ns < 1_000_000.0 {
        format!("{:.1}us", ns / 1_000.0)
    } else if ns < 1_000_000_000.0 {
        format!("{:.1}ms", ns / 1_000_000.0)
    } else {
        format!("{:.2}s", ns / 1_000_000_000.0)
    }
}

/// CPU time the whole process has used (every thread), so a figure taken
/// on a machine busy with other work can be read beside the wall clock.
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One write of `len` bytes and an fsync: the floor a snapshot write is
/// measured against.
fn sequential_write(dir: &Path, len: usize) -> Duration {
    let buf = vec![0x5au8; len];
    let path = dir.join("sequential.bin");
    let start = Instant::now();
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("open");
    f.write_all(&buf).expect("write");
    f.sync_all().expect("fsync");
    let t = start.elapsed();
    drop(f);
    let _ = std::fs::remove_file(&path);
    t
}

fn main() {
    let quick = std::env::var_os("SAGUIN_BENCH_QUICK").is_some();
    let only = std::env::var("SAGUIN_BENCH_ONLY").ok();
    let wanted = |section: &str| only.as_deref().is_none_or(|o| o == section);
    let base = tempfile::tempdir().expect("temporary directory");
    println!(
        "memory provider figures; TMPDIR={} ({} cores)",
        base.path().display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // --- one large channel: copy under the lock, write after it ---
    if wanted("one") {
        println!("\nsnapshot of one append channel, 128-byte payloads");
        println!(
            "{:>10} | {:>12} | {:>12} | {:>12} | {:>12} | {:>14} | {:>6}",
            "records", "copy (lock)", "write", "write CPU", "file bytes", "write+fsync", "ratio"
        );
        let sizes: &[u64] = if quick {
            &[1_000, 10_000]
        } else {
            &[1_000, 10_000, 100_000, 1_000_000]
        };
        for &n in sizes {
            let p = provider();
            let log = append(&p, "telemetry");
            for i in 0..n {
                log.append(record(i)).expect("append");
            }
            let options = SnapshotOptions::default();
            let runs = if n >= 1_000_000 { 3 } else { 5 };
            let copy_time = median(runs.max(7), || {
                let start = Instant::now();
                let copy = copy_provider(&p, &options, 1);
                let t = start.elapsed();
                black_box(&copy);
                t
            });
            let dir = base.path().join(format!("one-{n}"));
            // The snapshot write and the plain write+fsync of the same number
            // of bytes alternate, so both see the same disk and the same load.
            let mut write_times = Vec::new();
            let mut seq_times = Vec::new();
            let mut cpu_times = Vec::new();
            let mut file_bytes = 0;
            for _ in 0..runs {
                let copy = copy_provider(&p, &options, 1);
                let cpu = cpu_now();
                let start = Instant::now();
                let report = write_snapshot(&dir, &copy, &options);
                write_times.push(start.elapsed());
                cpu_times.push(cpu_now().saturating_sub(cpu));
                assert!(report.is_complete(), "{:?}", report.failed);
                drop(copy);
                file_bytes = report
                    .written
                    .iter()
                    .find(|w| w.name == "telemetry")
                    .map_or(0, |w| w.bytes);
                seq_times.push(sequential_write(base.path(), file_bytes as usize));
            }
            write_times.sort();
            seq_times.sort();
            let write_time = write_times[write_times.len() / 2];
            let seq = seq_times[seq_times.len() / 2];
            cpu_times.sort();
            println!(
                "{:>10} | {:>12} | {:>12} | {:>12} | {:>12} | {:>14} | {:>5.2}x",
                n,
                fmt(copy_time),
                fmt(write_time),
                fmt(cpu_times[cpu_times.len() / 2]),
                file_bytes,
                fmt(seq),
                write_time.as_secs_f64() / seq.as_secs_f64()
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    // --- many small channels: a whole graceful shutdown ---
    if wanted("shutdown") {
        println!("\nshutdown snapshot across channels, 8 records each (4 files at a time, one sync of the file system, 2 directory syncs, the manifest)");
        println!(
            "{:>10} | {:>12} | {:>12}",
            "channels", "shutdown", "per channel"
        );
        let counts: &[usize] = if quick {
            &[10, 100]
        } else {
            &[10, 100, 1_000, 10_000]
        };
        for &channels in counts {
            let p = provider();
            for c in 0..channels {
                let log = append(&p, &format!("ch{c:05}"));
                for i in 0..8 {
                    log.append(record(i)).expect("append");
                }
            }
            let dir = base.path().join(format!("many-{channels}"));
            let runs = if channels >= 10_000 { 3 } else { 5 };
            let t = median(runs, || {
                let start = Instant::now();
                let report = save_snapshot(&p, &dir, &SnapshotOptions::default(), 1);
                let t = start.elapsed();
                assert!(report.is_complete(), "{:?}", report.failed);
                t
            });
            println!(
                "{:>10} | {:>12} | {:>12}",
                channels,
                fmt(t),
                fmt(t / channels as u32)
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    // --- trim on a long channel: flat in the channel's length ---
    if wanted("trim") {
        println!(
            "\ntrim one record from the front of a long channel (amortised, compaction included)"
        );
        println!("{:>10} | {:>12}", "records", "per trim");
        let lengths: &[u64] = if quick {
            &[10_000, 100_000]
        } else {
            &[10_000, 100_000, 800_000]
        };
        for &n in lengths {
            let p = provider();
            let log = append(&p, "long");
            for i in 0..n {
                log.append(record(i)).expect("append");
            }
            // Batches of appends (untimed) then as many one-record trims
            // (timed), so the channel stays near its length and the dead
            // prefix crosses half of it - and is compacted - along the way.
            const BATCH: u64 = 1_000;
            let rounds = (3 * n / BATCH).max(20);
            let mut trimming = Duration::ZERO;
            let mut next = n;
            for _ in 0..rounds {
                for _ in 0..BATCH {
                    log.append(record(next)).expect("append");
                    next += 1;
                }
                let start = Instant::now();
                for _ in 0..BATCH {
                    let floor = log.floor();
                    black_box(log.trim(floor + 1, None).expect("trim"));
                }
                trimming += start.elapsed();
            }
            assert_eq!(log.record_count(), n);
            println!(
                "{:>10} | {:>12}",
                n,
                fmt(trimming / (rounds * BATCH) as u32)
            );
        }
    }

    // --- retention sweeps, steady state (nothing over the bound) ---
    if wanted("sweep") {
        println!("\none retention sweep pass, nothing to remove");
        println!("{:>10} | {:>12} | {:>12}", "channels", "by size", "by age");
        for &channels in &[10usize, 100, 1_000, 10_000] {
            let p = provider();
            let mut set = Vec::with_capacity(channels);
            for c in 0..channels {
                let log = append(&p, &format!("r{c:05}"));
                for i in 0..8 {
                    log.append(record(i)).expect("append");
                }
                set.push((
                    log,
                    Retention {
                        bytes: Some(1 << 30),
                        age: Some(Duration::from_secs(3600)),
                        deletions: None,
                    },
                ));
            }
            // Records are stamped in 2023; "now" is an hour after them.
            let now = 1_700_000_000_000_000_000 + 3_000_000_000_000;
            let runs = 21;
            let by_size = median(runs, || {
                let start = Instant::now();
                black_box(sweep_by_size(&set));
                start.elapsed()
            });
            let by_age = median(runs, || {
                let start = Instant::now();
                black_box(sweep_by_age(&set, now));
                start.elapsed()
            });
            println!(
                "{:>10} | {:>12} | {:>12}",
                channels,
                fmt(by_size),
                fmt(by_age)
            );
        }
    }

    // --- a generation after changes in one channel of many ---
    if wanted("changed") {
        println!(
        "\na snapshot generation after 1,000 changes in one channel of many, 10,000 records each (32-byte payloads)"
    );
        println!(
            "{:>10} | {:>14} | {:>12} | {:>14} | {:>12} | {:>12} | {:>6}",
            "channels",
            "full: capture",
            "full: write",
            "after: capture",
            "after: write",
            "after bytes",
            "share"
        );
        let many: &[usize] = if quick { &[100] } else { &[100, 1_000] };
        for &channels in many {
            let p = provider();
            let mut logs = Vec::with_capacity(channels);
            for c in 0..channels {
                let log = append(&p, &format!("g{c:05}"));
                for i in 0..10_000 {
                    let mut r = record(i);
                    r.payload = vec![(i % 251) as u8; 32].into();
                    log.append(r).expect("append");
                }
                logs.push(log);
            }
            let dir = base.path().join(format!("generations-{channels}"));
            let mut generations =
                Generations::new(&dir, SnapshotOptions::default(), Committed::default(), &p);
            // The first generation writes every channel: a full snapshot.
            let start = Instant::now();
            let job = generations.capture(&p, 1).expect("every channel is new");
            let full_capture = start.elapsed();
            let start = Instant::now();
            let outcome = generations.write(job, &Unobserved);
            let full_write = start.elapsed();
            assert!(outcome.report.is_complete(), "{:?}", outcome.report.failed);
            // 1,000 changes in one channel: the next generation writes it alone.
            let mut after_capture = Vec::new();
            let mut after_write = Vec::new();
            let mut after_bytes = 0;
            for round in 0..5u64 {
                for i in 0..1_000 {
                    let mut r = record(100_000 + round * 1_000 + i);
                    r.payload = vec![1; 32].into();
                    logs[0].append(r).expect("append");
                }
                let start = Instant::now();
                let job = generations
                    .capture(&p, 2 + round as i64)
                    .expect("one channel changed");
                after_capture.push(start.elapsed());
                assert_eq!(job.stores(), 1);
                let start = Instant::now();
                let outcome = generations.write(job, &Unobserved);
                after_write.push(start.elapsed());
                assert!(outcome.report.is_complete(), "{:?}", outcome.report.failed);
                after_bytes = outcome.report.written.iter().map(|w| w.bytes).sum::<u64>();
            }
            after_capture.sort();
            after_write.sort();
            let (capture, write) = (after_capture[2], after_write[2]);
            println!(
                "{:>10} | {:>14} | {:>12} | {:>14} | {:>12} | {:>12} | {:>5.2}%",
                channels,
                fmt(full_capture),
                fmt(full_write),
                fmt(capture),
                fmt(write),
                after_bytes,
                100.0 * (capture + write).as_secs_f64() / (full_capture + full_write).as_secs_f64()
            );
            drop(generations);
            drop(logs);
            drop(p);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    // --- a generation after one record in each of many channels ---
    if wanted("spread") {
        println!(
        "\na snapshot generation after one record appended to each of many channels, 8 records each before (the capture is what the broker's loop spends)"
    );
        println!(
            "{:>10} | {:>14} | {:>14} | {:>12} | {:>16}",
            "channels", "first: capture", "after: capture", "after: write", "after: write CPU"
        );
        let spread: &[usize] = if quick { &[1_000] } else { &[1_000, 10_000] };
        for &channels in spread {
            let p = provider();
            let logs: Vec<_> = (0..channels)
                .map(|c| {
                    let log = append(&p, &format!("s{c:05}"));
                    for i in 0..8 {
                        log.append(record(i)).expect("append");
                    }
                    log
                })
                .collect();
            let dir = base.path().join(format!("spread-{channels}"));
            let mut generations =
                Generations::new(&dir, SnapshotOptions::default(), Committed::default(), &p);
            let mut captures = Vec::new();
            let mut writes = Vec::new();
            let mut write_cpu = Vec::new();
            for round in 0..6u64 {
                if round > 0 {
                    for log in &logs {
                        log.append(record(8 + round)).expect("append");
                    }
                }
                let start = Instant::now();
                let job = generations
                    .capture(&p, 1 + round as i64)
                    .expect("every channel changed");
                captures.push(start.elapsed());
                assert_eq!(job.stores(), channels);
                let cpu = cpu_now();
                let start = Instant::now();
                let outcome = generations.write(job, &Unobserved);
                writes.push(start.elapsed());
                write_cpu.push(cpu_now().saturating_sub(cpu));
                assert!(outcome.report.is_complete(), "{:?}", outcome.report.failed);
            }
            let first = captures.remove(0);
            writes.remove(0);
            write_cpu.remove(0);
            captures.sort();
            writes.sort();
            write_cpu.sort();
            println!(
                "{:>10} | {:>14} | {:>14} | {:>12} | {:>16}",
                channels,
                fmt(first),
                fmt(captures[captures.len() / 2]),
                fmt(writes[writes.len() / 2]),
                fmt(write_cpu[write_cpu.len() / 2])
            );
            drop(generations);
            drop(logs);
            drop(p);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
