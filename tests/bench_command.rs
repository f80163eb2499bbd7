//! `saguin bench`: its JSON document, that it leaves nothing behind, and
//! that it refuses a memory provider's snapshot directory.

mod broker_support;

use std::path::Path;
use std::process::{Command, Output};

use broker_support::volume::memory_backed_dir;
use broker_support::Broker;
use saguin::storage::file_system::{unkept, Unkept};
use serde_json::Value;

fn saguin(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .output()
        .expect("run saguin")
}

/// `saguin bench --config <config>` with `more` arguments.
fn bench_config(config: &Path, more: &[&str]) -> Output {
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["bench".as_ref(), "--config".as_ref(), config.as_os_str()];
    args.extend(more.iter().map(|a| std::ffi::OsStr::new(*a)));
    saguin(&args)
}

/// `saguin bench --config <config> --json` with `more` arguments, which
/// must measure (exit 0): its document.
fn bench_json(config: &Path, more: &[&str]) -> Value {
    let args: Vec<&str> = ["--json"].iter().chain(more).copied().collect();
    let out = bench_config(config, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `saguin bench --dir <dir> --quick`.
fn bench_dir_quick(dir: &Path) -> Output {
    saguin(&[
        "bench".as_ref(),
        "--dir".as_ref(),
        dir.as_os_str(),
        "--quick".as_ref(),
    ])
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_quick_run_measures_each_provider_in_a_scratch_directory_it_removes() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let config = d.path().join("saguin.yaml");
    std::fs::write(
        &config,
        format!(
            "listeners: [{{name: mqtt, bind: \"127.0.0.1:0\"}}]\n\
             auth: {{allow_anonymous: true}}\n\
             storage:\n  - {{name: mem, kind: memory, snapshot_dir: {}, max_bytes: 8MiB}}\n\
             \x20 - {{name: db, kind: sqlite, file_path: {}, flush_interval: 50ms}}\n\
             \x20 - {{name: scratchpad, kind: memory}}\n",
            data.join("snapshots").display(),
            data.join("saguin.db").display()
        ),
    )
    .unwrap();
    let doc = bench_json(&config, &["--quick", "--timeout-stop", "60"]);
    assert_eq!(doc["quick"], true);
    assert_eq!(doc["timeout_stop_seconds"], 60);
    assert!(doc["cpus"].as_u64().unwrap() >= 1);
    let targets = doc["targets"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = targets
        .iter()
        .map(|t| (t["provider"].as_str().unwrap(), t["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("mem", "memory"),
            ("db", "sqlite"),
            ("scratchpad", "memory")
        ]
    );
    let positive = |v: &Value| v.as_f64().is_some_and(|n| n > 0.0);
    for t in targets {
        let publish = &t["publish"];
        assert!(positive(&publish["sustained_per_second"]), "{t}");
        assert_eq!(publish["paced_count"], 1000, "{t}");
        // No channel configured on it: one.
        assert_eq!(publish["channels"], 1, "{t}");
        assert!(positive(&publish["puback_p99_ms"]), "{t}");
        assert!(
            publish["puback_p50_ms"].as_f64() <= publish["puback_p99_ms"].as_f64(),
            "{t}"
        );
    }
    // The memory provider with a directory: its disk and its snapshot rate.
    let mem = &targets[0];
    assert_eq!(mem["dir"], data.display().to_string());
    assert_eq!(
        mem["memory_backed"].as_str(),
        unkept(&data).and_then(Unkept::in_memory),
        "{mem}"
    );
    assert_eq!(mem["fsync"]["samples"], 100);
    assert!(positive(&mem["snapshot"]["bytes_per_second"]), "{mem}");
    assert!(mem["snapshot"]["accounted_bytes"].as_u64().unwrap() >= 8 << 20);
    assert!(positive(&mem["means"]["crash_loss_ms"]), "{mem}");
    assert!(mem["means"]["shutdown_fits"].is_boolean(), "{mem}");
    assert_eq!(mem["means"]["full_bytes"], 8 << 20, "{mem}");
    assert!(mem["means"]["power_cut_loss_ms"].as_f64() >= Some(2000.0));
    // sqlite: a power cut's loss is its flush interval and an fsync.
    let db = &targets[1];
    assert!(db["snapshot"].is_null());
    assert!(
        db["means"]["power_cut_loss_ms"].as_f64() >= Some(50.0),
        "{db}"
    );
    assert_eq!(db["means"]["crash_loss_ms"], 0.0);
    // Its file system against what it may take: unbounded, what it holds
    // (nothing yet), the log's 72 MiB and the room's 64.
    let fs = &db["means"]["file_system"];
    assert_eq!(
        fs["needs_bytes"],
        72 * 1024 * 1024 + 64 * 1024 * 1024,
        "{db}"
    );
    assert_eq!(fs["held_bytes"], 0, "{db}");
    assert!(fs["free_bytes"].as_u64().unwrap() > 0, "{db}");
    assert!(fs["fits"].is_boolean(), "{db}");
    assert!(mem["means"]["file_system"].is_null(), "{mem}");
    // Asked only of a memory provider's snapshot directory, where it is
    // told wherever the kernel lists its journals.
    let journal = &mem["ext4_without_journal"];
    assert!(journal.is_boolean() || journal.is_null(), "{mem}");
    assert!(db["ext4_without_journal"].is_null(), "{db}");
    // No directory, no disk to measure.
    let scratchpad = &targets[2];
    assert!(scratchpad["fsync"].is_null() && scratchpad["dir"].is_null());
    assert!(scratchpad["ext4_without_journal"].is_null());
    // Nothing left behind, and no provider file made.
    assert!(names(&data).is_empty(), "{:?}", names(&data));
}

#[test]
fn a_directory_is_measured_for_both_providers_on_their_default_settings() {
    let d = tempfile::tempdir().unwrap();
    // Named as an operator types it, from where they stand.
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .current_dir(d.path().parent().unwrap())
        .args(["bench", "--dir"])
        .arg(d.path().file_name().unwrap())
        .args(["--quick", "--json"])
        .output()
        .expect("run saguin");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let targets = doc["targets"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = targets
        .iter()
        .map(|t| (t["provider"].as_str().unwrap(), t["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("sqlite", "sqlite"), ("memory", "memory")]);
    for t in targets {
        assert_eq!(t["dir"], d.path().display().to_string(), "{t}");
        assert_eq!(t["fsync"]["samples"], 100, "{t}");
        assert!(
            t["publish"]["sustained_per_second"]
                .as_f64()
                .is_some_and(|n| n > 0.0),
            "{t}"
        );
    }
    // sqlite on its default flush interval, memory on its default
    // snapshot delay, and a snapshot written.
    assert!(targets[0]["means"]["power_cut_loss_ms"].as_f64() >= Some(150.0));
    assert_eq!(targets[0]["means"]["crash_loss_ms"], 0.0);
    assert!(targets[1]["means"]["power_cut_loss_ms"].as_f64() >= Some(2000.0));
    assert!(targets[1]["snapshot"]["accounted_bytes"].as_u64() > Some(0));
    // No configuration, no channel: what a file costs is sampled all the
    // same, for the planner.
    assert_eq!(targets[1]["channel_files"], 0);
    assert_eq!(targets[1]["means"]["full_bytes"], 256 << 20);
    assert!(targets[0]["means"]["full_bytes"].is_null());
    assert!(targets[1]["snapshot_files"]["files"].as_u64() > Some(1_000));
    assert!(targets[0]["snapshot_files"].is_null());
    assert!(names(d.path()).is_empty(), "{:?}", names(d.path()));
}

/// A memory provider's generation writes a file for each channel that
/// changed: the crash window and the stop count its channels' files, not
/// only its bytes.
#[test]
fn a_memory_providers_channels_each_add_their_file_to_its_crash_window() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let config = d.path().join("saguin.yaml");
    let channels: String = (0..1_500)
        .map(|i| format!("  - {{name: c{i}, kind: append, storage: mem}}\n"))
        .collect();
    std::fs::write(
        &config,
        format!(
            "listeners: [{{name: mqtt, bind: \"127.0.0.1:0\"}}]\n\
             auth: {{allow_anonymous: true}}\n\
             storage:\n  - {{name: mem, kind: memory, snapshot_dir: {}, snapshot_room: 0}}\n\
             channels:\n{channels}",
            data.join("snapshots").display(),
        ),
    )
    .unwrap();
    let doc = bench_json(&config, &["--quick"]);
    let mem = &doc["targets"][0];
    assert_eq!(mem["channel_files"], 1_500, "{mem}");
    // Published to as many channels as it holds, each in turn.
    assert_eq!(mem["publish"]["channels"], 1_500, "{mem}");
    // Sampled with a file for each channel, the provider's own and the
    // manifest.
    let files = &mem["snapshot_files"];
    assert!(files["files"].as_u64() > Some(1_500), "{mem}");
    let per_file = files["per_file_ms"].as_f64().unwrap();
    assert!(per_file > 0.0, "{mem}");
    assert!(files["cpu_per_file_ms"].as_f64() > Some(0.0), "{mem}");
    // No max_bytes: figured at 256 MiB.
    assert_eq!(mem["means"]["full_bytes"], 256 << 20, "{mem}");
    // snapshot_max_delay (2 s), the bytes, and 1,500 files.
    let crash = mem["means"]["crash_loss_ms"].as_f64().unwrap();
    assert!(crash >= 2_000.0 + 1_500.0 * per_file - 1.0, "{mem}");
    let stop = mem["means"]["full_shutdown_seconds"].as_f64().unwrap();
    assert!(
        stop * 1_000.0 >= 5_000.0 + 1_500.0 * per_file - 1.0,
        "{mem}"
    );

    let out = bench_config(&config, &["--quick"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "the write of a full provider: its 1,500 channels' files and 256 MiB, as it has no max_bytes)"
        ),
        "{text}"
    );
    assert!(text.contains(" publishes/s over 1,500 channels"), "{text}");
    assert!(
        text.contains("mem: each channel adds about ")
            && text.contains("to a generation that changes it, ")
            && text.contains(" ms of it CPU (1,500 channels: "),
        "{text}"
    );
    assert!(names(&data).is_empty(), "{:?}", names(&data));
}

#[test]
fn a_memory_providers_snapshot_directory_is_refused_naming_a_live_holder() {
    let d = tempfile::tempdir().unwrap();
    let snap = d.path().join("snapshots");
    let mut broker = Broker::start(&format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
         auth:\n  allow_anonymous: true\n\
         storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
         broker:\n  session_storage: mem\n",
        snap.display()
    ));
    let out = bench_dir_quick(&snap);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("is a memory provider's snapshot directory")
            && err.contains(&format!("pid {}", broker.child.id())),
        "{err}"
    );
    // Nothing of the bench's was made in it (the broker writes its own
    // generations meanwhile).
    assert!(
        !names(&snap).iter().any(|n| n.starts_with(".saguin-bench")),
        "{:?}",
        names(&snap)
    );
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
    // Stopped, it is still the provider's directory.
    let out = bench_dir_quick(&snap);
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn an_invalid_configuration_is_refused_with_its_problems() {
    let d = tempfile::tempdir().unwrap();
    let config = d.path().join("saguin.yaml");
    std::fs::write(
        &config,
        "listeners: [{name: mqtt, bind: \"127.0.0.1:0\"}]\nstorage:\n  - {name: db, kind: sqlite}\n",
    )
    .unwrap();
    let out = bench_config(&config, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("storage[0].file_path: required"));
    let out = saguin(&["bench".as_ref()]);
    assert_eq!(out.status.code(), Some(2), "neither --config nor --dir");
}

/// A provider whose directory a first start would make is not measured
/// somewhere else in its place: the bench names the directory and says
/// how to measure it, and makes nothing.
#[test]
fn a_directory_that_does_not_exist_yet_is_named_and_not_made() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("state");
    let config = d.path().join("saguin.yaml");
    std::fs::write(
        &config,
        format!(
            "listeners: [{{name: mqtt, bind: \"127.0.0.1:0\"}}]\nauth: {{allow_anonymous: true}}\n\
             storage:\n  - {{name: db, kind: sqlite, file_path: {}}}\n",
            missing.join("saguin.db").display()
        ),
    )
    .unwrap();
    let out = bench_config(&config, &["--quick"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!("{} does not exist yet", missing.display())),
        "{err}"
    );
    assert!(!missing.exists());
}

/// Providers on a file system that lives in memory are measured, and the
/// figures come under the warning serve and check-config give of them.
#[test]
fn a_provider_on_a_memory_backed_file_system_is_warned_of_above_its_figures() {
    let Some(volatile) = memory_backed_dir(
        "a_provider_on_a_memory_backed_file_system_is_warned_of_above_its_figures",
    ) else {
        return;
    };
    let config = volatile.path().join("saguin.yaml");
    std::fs::write(
        &config,
        format!(
            "listeners: [{{name: mqtt, bind: \"127.0.0.1:0\"}}]\n\
             auth: {{allow_anonymous: true}}\n\
             storage:\n  - {{name: mem, kind: memory, snapshot_dir: {}, max_bytes: 1MiB, snapshot_room: 0}}\n\
             \x20 - {{name: db, kind: sqlite, file_path: {}, checkpoint_room: 0}}\n",
            volatile.path().join("snap").display(),
            volatile.path().join("saguin.db").display()
        ),
    )
    .unwrap();
    let out = bench_config(&config, &["--quick"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["mem", "db"] {
        let warning = format!(
            "{name}: {} is on tmpfs, which lives in memory: what provider {name} keeps is lost at a reboot or a power cut",
            volatile.path().display()
        );
        assert!(text.contains(&warning), "{text}");
    }
    assert_eq!(names(volatile.path()), ["saguin.yaml"]);
}
