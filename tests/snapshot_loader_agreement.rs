//! "verify says OK, serve refuses" must be impossible (SAGUIN.md §6.2): the
//! directory scan `saguin snapshot verify` runs and the memory provider's
//! loader must reach the same verdict on every directory. Each case below is
//! the golden directory with one thing done to it.

use std::collections::BTreeSet;
use std::path::Path;

use saguin::storage::memory::{LoadOptions, MemoryConfig, MemoryProvider};
use saguin::storage::snapshot_dir::{self, ScanOptions};
use saguin_format::model::ChannelKind;

const BEGAN_AT: i64 = 1_767_225_600_000_000_000;

fn copy_golden(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/f21/dir");
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

const CHANNELS: [(&str, ChannelKind); 3] = [
    ("telemetry", ChannelKind::Append),
    ("state", ChannelKind::Latest),
    ("jobs", ChannelKind::Queue),
];

fn verdicts(dir: &Path) -> (bool, Result<(), String>) {
    let scan_opts = ScanOptions {
        channels: Some(
            CHANNELS
                .iter()
                .map(|(n, _)| n.to_string())
                .collect::<BTreeSet<_>>(),
        ),
        ..ScanOptions::default()
    };
    let scanned = snapshot_dir::scan(dir, &scan_opts)
        .map(|r| r.is_loadable())
        .unwrap_or(false);
    let provider = MemoryProvider::new(MemoryConfig {
        name: "mem".into(),
        max_bytes: None,
        reserve: 0,
    })
    .unwrap();
    let load_opts = LoadOptions {
        channels: CHANNELS.iter().map(|(n, k)| (n.to_string(), *k)).collect(),
        retained: true,
        sessions: true,
        now: BEGAN_AT + 2_000_000_000,
        max_session_expiry: 7 * 86_400,
    };
    let loaded = provider
        .load_snapshot_dir(dir, &load_opts)
        .map(|_| ())
        .map_err(|e| e.to_string());
    (scanned, loaded)
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn scan_and_load_agree() {
    type Mutation = fn(&Path);
    let cases: Vec<(&str, bool, Mutation)> = vec![
        ("as written", true, |_| {}),
        ("a listed channel file missing", true, |d| {
            std::fs::remove_file(d.join("state.snapshot")).unwrap()
        }),
        ("a leftover temporary file", true, |d| {
            std::fs::write(d.join("jobs.snapshot.tmp"), b"half").unwrap()
        }),
        ("no manifest", true, |d| {
            std::fs::remove_file(d.join("saguin.manifest")).unwrap()
        }),
        ("a damaged manifest", true, |d| {
            std::fs::write(d.join("saguin.manifest"), b"\x89SAGUIN\n").unwrap()
        }),
        ("an unconfigured damaged channel file", true, |d| {
            std::fs::write(d.join("dropped.snapshot"), b"junk").unwrap()
        }),
        ("a channel file's checksum flipped", false, |d| {
            let p = d.join("telemetry.snapshot");
            let mut b = std::fs::read(&p).unwrap();
            let last = b.len() - 1;
            b[last] ^= 1;
            std::fs::write(p, b).unwrap();
        }),
        ("a channel file truncated", false, |d| {
            let p = d.join("state.snapshot");
            let b = std::fs::read(&p).unwrap();
            std::fs::write(&p, &b[..b.len() / 2]).unwrap();
        }),
        ("a channel file of another format version", false, |d| {
            let p = d.join("telemetry.snapshot");
            let mut b = std::fs::read(&p).unwrap();
            b[8..12].copy_from_slice(&20u32.to_le_bytes());
            std::fs::write(p, b).unwrap();
        }),
        (
            "a channel's file under another channel's name",
            false,
            |d| {
                std::fs::copy(d.join("telemetry.snapshot"), d.join("state.snapshot")).unwrap();
            },
        ),
        ("the broadcast log missing", false, |d| {
            std::fs::remove_file(d.join("saguin.broadcast")).unwrap()
        }),
        ("the sessions file damaged", false, |d| {
            std::fs::write(d.join("saguin.sessions"), b"\x89SAGUIN\n\x15\0\0\0").unwrap()
        }),
        ("a FIFO as a channel file", false, |d| {
            std::fs::remove_file(d.join("jobs.snapshot")).unwrap();
            mkfifo(&d.join("jobs.snapshot"));
        }),
        ("a symlink as a channel file", false, |d| {
            std::fs::rename(d.join("jobs.snapshot"), d.join("elsewhere")).unwrap();
            std::os::unix::fs::symlink(d.join("elsewhere"), d.join("jobs.snapshot")).unwrap();
        }),
        ("a directory as a channel file", false, |d| {
            std::fs::remove_file(d.join("jobs.snapshot")).unwrap();
            std::fs::create_dir(d.join("jobs.snapshot")).unwrap();
        }),
        ("a legacy MBMQTT01 file as a channel file", false, |d| {
            std::fs::copy(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mbmqtt/broker-v3.snapshot"),
                d.join("telemetry.snapshot"),
            )
            .unwrap();
        }),
    ];
    let mut disagreements = Vec::new();
    for (name, loadable, mutate) in cases {
        let d = tempfile::tempdir().unwrap();
        copy_golden(d.path());
        mutate(d.path());
        let (scanned, loaded) = verdicts(d.path());
        if scanned != loadable {
            disagreements.push(format!(
                "{name}: verify says loadable={scanned}, expected {loadable}"
            ));
        }
        if loaded.is_ok() != scanned {
            disagreements.push(format!(
                "{name}: verify says loadable={scanned}, the memory provider's load says {loaded:?}"
            ));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}
