//! Format 21 throughput and decode memory: one append channel of
//! 1,000,000 records with 128-byte payloads, encoded and decoded (with the
//! semantic pass). Prints a table; FORMAT.md §6 records the figures.
//!
//! `cargo bench -p saguin-format --bench f21` (release profile). Set
//! `SAGUIN_BENCH_RECORDS` to change the record count, and
//! `SAGUIN_BENCH_WRITE=<path>` to only write the channel file there (a large
//! input for `saguin snapshot verify`, or for profiling the decoder with
//! `SAGUIN_BENCH_MEMORY_CHILD=<path>`, which only reads and decodes it).

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use saguin_format::f21::{self, ChannelFile, Position, SnapshotFile};
use saguin_format::model::{ChannelKind, Record, UserProperty};

const PAYLOAD_LEN: usize = 128;
const ROUNDS: usize = 5;
const CHILD_ENV: &str = "SAGUIN_BENCH_MEMORY_CHILD";

fn record_count() -> usize {
    std::env::var("SAGUIN_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// A channel shaped like telemetry: a topic per sensor, a client per
/// sensor, receipt times, one record in 16 carrying a User Property.
fn channel(records: usize) -> ChannelFile {
    let payload = Bytes::from(vec![0x5a; PAYLOAD_LEN]);
    let base = 1_767_225_600_000_000_000i64;
    let mut c = ChannelFile::new("telemetry", ChannelKind::Append);
    c.records = (0..records)
        .map(|i| {
            let sensor = i % 1000;
            let mut r = Record::new(
                format!("telemetry/sensor-{sensor:04}/temp"),
                payload.clone(),
            );
            r.offset = i as u64 + 1;
            r.message_id[..8].copy_from_slice(&(i as u64).to_le_bytes());
            r.timestamp = base + i as i64 * 1_000;
            r.client_id = format!("sensor-{sensor:04}");
            r.qos = 1;
            if i % 16 == 0 {
                r.user_properties.push(UserProperty {
                    name: "unit".into(),
                    value: "C".into(),
                });
            }
            r
        })
        .collect();
    c.next = records as u64 + 1;
    c.bytes = c.records.iter().map(Record::accounted_size).sum();
    c.positions.push(Position {
        reader: "mqtt:dashboard".into(),
        offset: c.next / 2,
        saved_at: base,
        session_expiry: Some(3600),
    });
    c
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The child: read the file (as a stream, or whole first), decode it,
/// report the resident peak against the resident size before the read, as `baseline_kib peak_kib
/// after_drop_kib` (the last: resident once the file buffer is dropped).
fn memory_child(path: &str) {
    let baseline = status_kib("VmRSS:");
    let mode = std::env::var("SAGUIN_BENCH_MEMORY_MODE").unwrap_or_default();
    let raw = match mode.as_str() {
        "stream" => Vec::new(),
        _ => std::fs::read(path).expect("read the bench file"),
    };
    let decoded = match mode.as_str() {
        "copy" => {
            let decoded = f21::decode(&raw).expect("the bench file decodes");
            drop(raw);
            decoded
        }
        // What `saguin snapshot verify` does: the decoder reading the file
        // as a stream, with a sink that drops each record once checked.
        "stream" => {
            let mut file = std::fs::File::open(path).expect("open the bench file");
            let len = file.metadata().expect("the bench file's length").len() as usize;
            let mut tally = f21::Tally::default();
            let decoded = f21::decode_stream(&mut file, len, None, &mut tally)
                .expect("the bench file decodes");
            black_box(tally);
            decoded
        }
        // The whole file with a sink that drops each record once checked.
        "tally" => {
            let shared = Bytes::from(raw);
            let mut tally = f21::Tally::default();
            let decoded = f21::decode_with(&shared, &mut tally).expect("the bench file decodes");
            black_box(tally);
            decoded
        }
        _ => f21::decode_bytes(Bytes::from(raw)).expect("the bench file decodes"),
    };
    let peak = status_kib("VmHWM:");
    let after = status_kib("VmRSS:");
    black_box(&decoded);
    println!("{baseline} {peak} {after}");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`),
/// which a machine shared with other work does not inflate the way it
/// inflates wall time.
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let nanos = text
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(nanos)
}

/// Best wall time, median wall time, best on-CPU time.
fn time<T>(mut f: impl FnMut() -> T) -> (Duration, Duration, Duration) {
    let mut times = Vec::with_capacity(ROUNDS);
    let mut cpu = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let start_cpu = thread_cpu();
        let out = f();
        cpu.push(thread_cpu().saturating_sub(start_cpu));
        times.push(start.elapsed());
        drop(black_box(out));
    }
    let best = *times.iter().min().expect("rounds");
    let best_cpu = *cpu.iter().min().expect("rounds");
    (best, median(times), best_cpu)
}

fn main() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        memory_child(&path);
        return;
    }
    let n = record_count();
    let file = SnapshotFile::Channel(channel(n));
    let bytes = f21::encode(&file, 1);
    if let Ok(path) = std::env::var("SAGUIN_BENCH_WRITE") {
        std::fs::write(&path, &bytes).expect("write the channel file");
        println!("wrote {} bytes to {path}", bytes.len());
        return;
    }
    let size = bytes.len();
    let mb = size as f64 / 1e6;

    let encoding = time(|| f21::encode(&file, 1));
    let shared = Bytes::from(bytes.clone());
    let decoding = time(|| f21::decode_bytes(shared.clone()).expect("decodes"));
    let copying = time(|| f21::decode(&bytes).expect("decodes"));
    let tallying = time(|| {
        let mut tally = f21::Tally::default();
        f21::decode_with(&shared, &mut tally).expect("decodes");
        tally
    });
    let streaming = time(|| {
        let mut tally = f21::Tally::default();
        f21::decode_stream(&mut &bytes[..], size, None, &mut tally).expect("decodes");
        tally
    });
    let crc = time(|| crc32c::crc32c(&bytes));
    drop(file);

    // Decode memory in a fresh process, so nothing this one allocated
    // above is counted or reused.
    let dir = std::env::temp_dir().join(format!("saguin-f21-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench temp dir");
    let path = dir.join("telemetry.snapshot");
    std::fs::write(&path, &bytes).expect("write the bench file");
    drop(bytes);
    let measure = |mode: &str| {
        let out = std::process::Command::new(std::env::current_exe().expect("own path"))
            .env(CHILD_ENV, &path)
            .env("SAGUIN_BENCH_MEMORY_MODE", mode)
            .output()
            .expect("run the memory child");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let v: Vec<u64> = text
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        (
            at(1).saturating_sub(at(0)) * 1024,
            at(2).saturating_sub(at(0)) * 1024,
        )
    };
    let (shared_peak, shared_after) = measure("shared");
    let (copy_peak, copy_after) = measure("copy");
    let (tally_peak, _) = measure("tally");
    let (stream_peak, _) = measure("stream");
    let _ = std::fs::remove_dir_all(&dir);

    let row = |what: &str, (best, median, cpu): (Duration, Duration, Duration)| {
        println!(
            "| {what:<34} | {:>8.1} | {:>9.1} | {:>8.0} | {:>11.0} | {:>7.1} | {:>10.0} |",
            best.as_secs_f64() * 1e3,
            median.as_secs_f64() * 1e3,
            mb / best.as_secs_f64(),
            n as f64 / best.as_secs_f64(),
            cpu.as_secs_f64() * 1e3,
            mb / cpu.as_secs_f64(),
        )
    };
    println!(
        "format 21 channel file: {n} records x {PAYLOAD_LEN}-byte payloads, {size} bytes ({:.1} bytes/record), best and median of {ROUNDS}",
        size as f64 / n as f64
    );
    println!(
        "| {:<34} | {:>8} | {:>9} | {:>8} | {:>11} | {:>7} | {:>10} |",
        "operation", "best ms", "median ms", "MB/s", "records/s", "CPU ms", "MB/s (CPU)"
    );
    println!(
        "|{}|{}|{}|{}|{}|{}|{}|",
        "-".repeat(36),
        "-".repeat(10),
        "-".repeat(11),
        "-".repeat(10),
        "-".repeat(13),
        "-".repeat(9),
        "-".repeat(12)
    );
    row("encode", encoding);
    row("decode + validate (decode_bytes)", decoding);
    row("decode + validate (decode)", copying);
    row("decode + validate (Tally)", tallying);
    row("decode_stream (Tally, verify)", streaming);
    row("CRC32C alone", crc);
    let ratio = |b: u64| b as f64 / size as f64;
    println!(
        "decode memory, fresh process, file read then decoded: decode_bytes peak {:.1} MB ({:.2}x the file), {:.1} MB held after; \
         decode peak {:.1} MB ({:.2}x), {:.1} MB ({:.2}x) held once the file buffer is dropped; \
         decode_with(Tally) peak {:.1} MB ({:.2}x); decode_stream(Tally) (verify) from the file peak {:.1} MB ({:.3}x); \
         size_of::<Record>() = {} bytes",
        shared_peak as f64 / 1e6,
        ratio(shared_peak),
        shared_after as f64 / 1e6,
        copy_peak as f64 / 1e6,
        ratio(copy_peak),
        copy_after as f64 / 1e6,
        ratio(copy_after),
        tally_peak as f64 / 1e6,
        ratio(tally_peak),
        stream_peak as f64 / 1e6,
        ratio(stream_peak),
        std::mem::size_of::<Record>(),
    );
}
