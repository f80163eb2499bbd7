//! Migration and backup throughput, on real disk (release build):
//!
//! - `migrate to-sqlite` of one append channel of N records with 128-byte
//!   payloads, and `migrate to-snapshots` back (target: 300,000 records/s
//!   each way, counts-out verification included);
//! - `sqlite backup` of a database of about M MiB, in MB/s, beside a bare
//!   `VACUUM INTO` of the same file in the same run (which neither fsyncs
//!   nor verifies).
//!
//! Run: `cargo bench --bench migrate`. Sizes: `SAGUIN_BENCH_RECORDS`
//! (default 1,000,000), `SAGUIN_BENCH_BACKUP_MIB` (default 1024). The work
//! directory is `SAGUIN_BENCH_DIR`, else a temporary directory under
//! `target/` (real disk, not a tmpfs `/tmp`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::Bytes;
use comfy_table::Table;
use saguin::storage::backup;
use saguin::storage::migrate::{self, Destination, NoProgress, Source};
use saguin::storage::sqlite::{SqliteOptions, SqliteProvider};
use saguin_format::channel_name::{encode_file_name, MANIFEST_FILE};
use saguin_format::f21::{self, ChannelFile, Manifest, ManifestEntry, SnapshotFile};
use saguin_format::model::{ChannelKind, Record};

/// User plus system CPU seconds this process has used: the figure that
/// does not depend on what else the machine is running.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Wall and CPU seconds of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    let out = f();
    (out, wall.elapsed().as_secs_f64(), cpu_seconds() - cpu)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn work_dir() -> tempfile::TempDir {
    let base = std::env::var_os("SAGUIN_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&base).expect("create the bench directory");
    tempfile::Builder::new()
        .prefix("bench-migrate-")
        .tempdir_in(base)
        .expect("bench temp dir")
}

/// A snapshot directory holding one append channel of `n` records.
fn snapshot_dir(dir: &Path, n: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let at = 1_767_225_600_000_000_000i64;
    let mut c = ChannelFile::new("telemetry", ChannelKind::Append);
    c.records.reserve(n as usize);
    let payload = Bytes::from(vec![b'x'; 128]);
    for offset in 1..=n {
        let mut r = Record::new("telemetry/site-1/sensor", payload.clone());
        r.offset = offset;
        r.timestamp = at + offset as i64;
        r.client_id = "sensor-1".into();
        r.qos = 1;
        r.message_id[..8].copy_from_slice(&offset.to_be_bytes());
        c.bytes += r.accounted_size();
        c.records.push(r);
    }
    c.next = n + 1;
    let manifest = SnapshotFile::Manifest(Manifest {
        began_at: at,
        channels: vec![ManifestEntry {
            channel: "telemetry".into(),
            file_name: encode_file_name("telemetry"),
            kind: ChannelKind::Append,
        }],
        retained: false,
        sessions: false,
        broadcast: false,
    });
    std::fs::write(dir.join(MANIFEST_FILE), f21::encode(&manifest, at)).unwrap();
    std::fs::write(
        dir.join(encode_file_name("telemetry")),
        f21::encode(&SnapshotFile::Channel(c), at),
    )
    .unwrap();
}

/// A database of about `mib` MiB: one append channel of 1 KiB records,
/// written through the schema in large transactions.
fn big_database(db: &Path, mib: u64) -> u64 {
    SqliteProvider::open(SqliteOptions::new("bench", db))
        .unwrap()
        .close_for_bench();
    let mut conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;")
        .unwrap();
    // About 1,350 bytes a row on disk: the 1 KiB payload, the other
    // columns, and the primary key's index.
    let rows = mib * 1024 * 1024 / 1350;
    let payload = vec![b'y'; 1024];
    // The channel's bytes are what its records count for (`size`), as the
    // provider keeps them and as `sqlite verify` checks.
    conn.execute(
        "INSERT INTO channels (name, kind, next, floor, bytes) VALUES ('bulk', 'append', ?1, 1, ?2)",
        [rows + 1, rows * 1030],
    )
    .unwrap();
    let mut offset = 1u64;
    while offset <= rows {
        let tx = conn.transaction().unwrap();
        {
            let mut stmt = tx
                .prepare(
                    "INSERT INTO records (channel, offset, message_id, topic, timestamp, headers, payload, props, retain, bridge, client_id, qos, shared_copy, owed_to, size)
                     VALUES ('bulk', ?1, ?2, 'bulk/t', 0, NULL, ?3, NULL, 0, NULL, 'c', 1, 0, NULL, 1030)",
                )
                .unwrap();
            let end = (offset + 50_000).min(rows + 1);
            while offset < end {
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&offset.to_be_bytes());
                stmt.execute(rusqlite::params![offset, &id[..], &payload])
                    .unwrap();
                offset += 1;
            }
        }
        tx.commit().unwrap();
    }
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    drop(conn);
    std::fs::metadata(db).unwrap().len()
}

trait CloseForBench {
    fn close_for_bench(self);
}
impl CloseForBench for SqliteProvider {
    fn close_for_bench(self) {
        use saguin::storage::contract::Provider;
        self.close().unwrap();
    }
}

fn main() {
    let records = env_u64("SAGUIN_BENCH_RECORDS", 1_000_000);
    let backup_mib = env_u64("SAGUIN_BENCH_BACKUP_MIB", 1024);
    let work = work_dir();
    let root = work.path();
    println!("work directory: {}", root.display());

    let mut table = Table::new();
    table.set_header(vec![
        "run",
        "size",
        "wall s",
        "CPU s",
        "rate (wall)",
        "rate (CPU)",
        "target",
    ]);
    let mut row =
        |run: &str, size: String, wall: f64, cpu: f64, amount: f64, unit: &str, target: &str| {
            table.add_row(vec![
                run.to_string(),
                size,
                format!("{wall:.2}"),
                format!("{cpu:.2}"),
                format!("{:.1} {unit}", amount / wall),
                format!("{:.1} {unit}", amount / cpu),
                target.to_string(),
            ]);
        };

    let src = root.join("snapshots");
    snapshot_dir(&src, records);
    let db = root.join("migrated.db");
    let (report, wall, cpu) = timed(|| {
        migrate::migrate(
            &Source::SnapshotDir(src.clone()),
            &Destination::Sqlite(db.clone()),
            &NoProgress,
        )
        .expect("to-sqlite")
    });
    assert!(report.is_complete(), "{:?}", report.units);
    let size = format!("{records} records x 128 B");
    row(
        "migrate to-sqlite (verified)",
        size.clone(),
        wall,
        cpu,
        records as f64,
        "records/s",
        ">= 300000 records/s",
    );

    let back = root.join("back");
    let (report, wall, cpu) = timed(|| {
        migrate::migrate(
            &Source::Sqlite(db.clone()),
            &Destination::SnapshotDir(back.clone()),
            &NoProgress,
        )
        .expect("to-snapshots")
    });
    assert!(report.is_complete(), "{:?}", report.units);
    row(
        "migrate to-snapshots (verified)",
        size,
        wall,
        cpu,
        records as f64,
        "records/s",
        ">= 300000 records/s",
    );
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&back);

    if backup_mib == 0 {
        println!("{table}");
        return;
    }
    let big = root.join("big.db");
    let bytes = big_database(&big, backup_mib);
    let size = format!("{:.0} MiB", bytes as f64 / 1048576.0);
    let copy = root.join("copy.db");
    let (report, wall, cpu) = timed(|| backup::backup(&big, &copy, &|_, _| {}).expect("backup"));
    row(
        "sqlite backup (fsync + verify)",
        size.clone(),
        wall,
        cpu,
        report.bytes as f64 / 1e6,
        "MB/s",
        "-",
    );
    let vacuumed = root.join("vacuum.db");
    let conn =
        rusqlite::Connection::open_with_flags(&big, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let ((), wall, cpu) = timed(|| {
        conn.execute("VACUUM INTO ?1", [vacuumed.to_str().unwrap()])
            .map(|_| ())
            .unwrap()
    });
    let vbytes = std::fs::metadata(&vacuumed).unwrap().len();
    row(
        "bare VACUUM INTO (no fsync, no verify)",
        size,
        wall,
        cpu,
        vbytes as f64 / 1e6,
        "MB/s",
        "-",
    );
    println!("{table}");
}
