//! "Verify says OK, serve refuses" must be impossible: the
//! memory provider loads its snapshot directory through the scan
//! `saguin snapshot verify` runs, and this holds the two to one verdict.
//! Every case is the golden directory (`fixtures/f21/dir`) with one thing
//! done to it: each file of `fixtures/damaged/f21` put in place of the
//! file of its kind, special files and an oversize file where a channel
//! file belongs, and the manifest's cases. For each, the real binary's
//! `snapshot verify --json` exits non-zero exactly when
//! `MemoryProvider::load_snapshot_dir` refuses, and both name the same
//! problems with the same words, file by file. `saguin migrate to-sqlite`
//! is held to the same verdict: it carries a directory verify accepts, and
//! refuses one verify does not (exit 3) naming every problem verify
//! names, before it writes anything.
//!
//! One difference is by design: a damaged manifest is a file that fails
//! verification (verify exits 1 naming it) while the broker starts on the
//! directory with that same problem as a warning: the
//! manifest holds no records, and refusing to start over it would be the
//! worst trade in the design.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use saguin::storage::memory::{LoadOptions, LoadReport, MemoryConfig, MemoryProvider};
use saguin::storage::read::F21_DEFAULT_MAX_BYTES;
use saguin_format::f21::{self, SnapshotFile};
use saguin_format::model::ChannelKind;
use serde_json::Value;

const BEGAN_AT: i64 = 1_767_225_600_000_000_000;

const CHANNELS: [(&str, ChannelKind); 3] = [
    ("telemetry", ChannelKind::Append),
    ("state", ChannelKind::Latest),
    ("jobs", ChannelKind::Queue),
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn copy_golden(to: &Path) {
    for e in std::fs::read_dir(fixtures().join("f21/dir")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// What `saguin snapshot verify --json DIR` said.
#[derive(Debug)]
struct Verified {
    exit: i32,
    /// Every `FAIL` as (path, message): refused files under their own
    /// path, findings across files under the directory's.
    failures: BTreeSet<(String, String)>,
    warnings: BTreeSet<String>,
    /// The warnings (the broker's view) whose verdict is FAIL: records gone.
    losses: BTreeSet<String>,
}

fn verify(dir: &Path) -> Verified {
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["snapshot", "verify", "--json"])
        .arg(dir)
        .output()
        .expect("run saguin snapshot verify");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify --json printed no JSON document ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut failures = BTreeSet::new();
    for r in doc["results"].as_array().unwrap() {
        if r["status"] != "ok" {
            failures.insert((text(&r["path"]), text(&r["problem"]["message"])));
        }
    }
    let mut warnings = BTreeSet::new();
    let mut losses = BTreeSet::new();
    for f in doc["findings"].as_array().unwrap() {
        if f["severity"] == "warning" && f["verdict"] == "fail" {
            losses.insert(text(&f["message"]));
        }
        match f["severity"].as_str() {
            Some("error") => {
                failures.insert((text(&f["path"]), text(&f["message"])));
            }
            Some("warning") => {
                warnings.insert(text(&f["message"]));
            }
            _ => {}
        }
    }
    let exit = out.status.code().expect("verify exited by itself");
    assert_eq!(doc["exit_code"], exit, "the document's exit_code");
    Verified {
        exit,
        failures,
        warnings,
        losses,
    }
}

/// What the memory provider's load said: its report, or every problem as
/// (path, detail).
fn load(dir: &Path) -> Result<LoadReport, BTreeSet<(String, String)>> {
    let provider = MemoryProvider::new(MemoryConfig {
        name: "mem".into(),
        max_bytes: None,
        reserve: 0,
    })
    .unwrap();
    let options = LoadOptions {
        channels: CHANNELS.iter().map(|(n, k)| (n.to_string(), *k)).collect(),
        retained: true,
        sessions: true,
        now: BEGAN_AT + 2_000_000_000,
        max_session_expiry: 7 * 86_400,
        max_file_bytes: F21_DEFAULT_MAX_BYTES,
    };
    provider.load_snapshot_dir(dir, &options).map_err(|e| {
        e.problems
            .iter()
            .map(|p| (p.path.display().to_string(), p.detail.clone()))
            .collect()
    })
}

/// What `saguin migrate to-sqlite DIR DB` did: its exit code, what it
/// said on stderr, and what it left where the database was to go.
struct Migrated {
    exit: i32,
    stderr: String,
    left: Vec<String>,
}

fn migrate(dir: &Path) -> Migrated {
    let dest = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["migrate", "to-sqlite"])
        .arg(dir)
        .arg(dest.path().join("saguin.db"))
        .output()
        .expect("run saguin migrate to-sqlite");
    let mut left: Vec<String> = std::fs::read_dir(dest.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    Migrated {
        exit: out.status.code().expect("migrate exited by itself"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        left,
    }
}

/// Holds the migration to verify's verdict: it carries what verify accepts
/// and refuses, naming the same problems and writing nothing, what verify
/// does not.
fn judge_migrate(name: &str, dir: &Path, v: &Verified) -> Vec<String> {
    let m = migrate(dir);
    let mut wrong = Vec::new();
    if v.exit == 0 {
        if m.exit != 0 || m.left != ["saguin.db", "saguin.db.lock"] {
            wrong.push(format!(
                "{name}: verify exits 0 and migrate exits {} leaving {:?}: {}",
                m.exit, m.left, m.stderr
            ));
        }
        return wrong;
    }
    if m.exit != 3 || !m.left.is_empty() {
        wrong.push(format!(
            "{name}: verify exits {} and migrate exits {} (not 3, a source that does not verify) leaving {:?}: {}",
            v.exit, m.exit, m.left, m.stderr
        ));
    }
    for (_, problem) in &v.failures {
        if !m.stderr.contains(problem.as_str()) {
            wrong.push(format!(
                "{name}: verify names {problem:?}, migrate does not: {}",
                m.stderr
            ));
        }
    }
    for loss in &v.losses {
        if !m.stderr.contains(loss.as_str()) {
            wrong.push(format!(
                "{name}: verify names the loss {loss:?}, migrate does not: {}",
                m.stderr
            ));
        }
    }
    wrong
}

/// How a case must come out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Verify exits 0 and the directory loads.
    Loads,
    /// Verify exits non-zero and the load is refused.
    Refused,
    /// The manifest is damaged: verify fails it, the load warns of it.
    ManifestWarning,
    /// The manifest says records are gone: the load warns of it and
    /// serves what is left; verify answers no (exit 1) with the same
    /// sentence, because a copy that lost records is not one to keep.
    LoadsWithLoss,
}

/// Runs one case; returns every way the two disagree (empty when they do
/// not) and the verdict reached.
fn judge(name: &str, dir: &Path, expected: Verdict) -> Vec<String> {
    let v = verify(dir);
    let loaded = load(dir);
    let mut wrong = judge_migrate(name, dir, &v);
    match (&loaded, expected) {
        (Err(problems), Verdict::Refused) => {
            if v.exit == 0 {
                wrong.push(format!(
                    "{name}: verify exits 0 and the load is refused: {problems:#?}"
                ));
            }
            if *problems != v.failures {
                wrong.push(format!(
                    "{name}: verify names {:#?}\nthe load names {problems:#?}",
                    v.failures
                ));
            }
        }
        (Ok(report), Verdict::Loads) => {
            if v.exit != 0 {
                wrong.push(format!(
                    "{name}: the directory loads and verify exits {}: {:#?}",
                    v.exit, v.failures
                ));
            }
            let load_warnings: BTreeSet<String> = report.warnings.iter().cloned().collect();
            if load_warnings != v.warnings {
                wrong.push(format!(
                    "{name}: verify warns {:#?}\nthe load warns {load_warnings:#?}",
                    v.warnings
                ));
            }
        }
        (Ok(report), Verdict::ManifestWarning) => {
            let manifest = dir.join("saguin.manifest").display().to_string();
            let failed: Vec<&(String, String)> = v.failures.iter().collect();
            match failed.as_slice() {
                [(path, problem)] if *path == manifest && v.exit == 1 => {
                    if !report.warnings.iter().any(|w| w.contains(problem.as_str())) {
                        wrong.push(format!(
                            "{name}: verify fails the manifest with {problem:?}, which no warning of the load names: {:#?}",
                            report.warnings
                        ));
                    }
                }
                _ => wrong.push(format!(
                    "{name}: verify must fail the manifest alone, exit 1; it exits {} naming {:#?}",
                    v.exit, v.failures
                )),
            }
            let load_warnings: BTreeSet<String> = report.warnings.iter().cloned().collect();
            if load_warnings != v.warnings {
                wrong.push(format!(
                    "{name}: verify warns {:#?}\nthe load warns {load_warnings:#?}",
                    v.warnings
                ));
            }
        }
        (Ok(report), Verdict::LoadsWithLoss) => {
            let load_warnings: BTreeSet<String> = report.warnings.iter().cloned().collect();
            if v.exit != 1 || !v.failures.is_empty() || v.losses.is_empty() {
                wrong.push(format!(
                    "{name}: verify must exit 1 on the loss alone; it exits {} naming {:#?} and the losses {:#?}",
                    v.exit, v.failures, v.losses
                ));
            }
            if !v.losses.is_subset(&load_warnings) || load_warnings != v.warnings {
                wrong.push(format!(
                    "{name}: verify warns {:#?} (losses {:#?})\nthe load warns {load_warnings:#?}",
                    v.warnings, v.losses
                ));
            }
        }
        (loaded, expected) => wrong.push(format!(
            "{name}: expected {expected:?}; verify exits {} naming {:#?}, the load gives {:?}",
            v.exit,
            v.failures,
            loaded.as_ref().map(|r| &r.warnings)
        )),
    }
    wrong
}

/// The golden file a damaged fixture replaces, by the kind its name says.
fn replaced_by(fixture: &str) -> &'static str {
    if fixture.ends_with(".manifest") {
        "saguin.manifest"
    } else if fixture.ends_with(".sessions") {
        "saguin.sessions"
    } else if fixture.ends_with(".broadcast") {
        "saguin.broadcast"
    } else {
        // Every damaged `.snapshot` fixture is (or was) the append channel
        // `telemetry`'s file.
        "telemetry.snapshot"
    }
}

#[test]
fn every_damaged_fixture_in_the_directory_gets_one_verdict() {
    let damaged = fixtures().join("damaged/f21");
    let mut names: Vec<String> = std::fs::read_dir(&damaged)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "EXPECTED")
        .collect();
    names.sort();
    assert!(names.len() >= 60, "the damaged corpus: {names:?}");
    let mut disagreements = Vec::new();
    for name in &names {
        let d = tempfile::tempdir().unwrap();
        copy_golden(d.path());
        let target = replaced_by(name);
        std::fs::copy(damaged.join(name), d.path().join(target)).unwrap();
        let expected = if target == "saguin.manifest" {
            Verdict::ManifestWarning
        } else {
            Verdict::Refused
        };
        disagreements.extend(judge(&format!("{name} as {target}"), d.path(), expected));
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Rewrites one golden file through the format, keeping its moment, so
/// the change is one the checksum cannot see.
fn rewrite(dir: &Path, name: &str, change: impl FnOnce(&mut SnapshotFile)) {
    let p = dir.join(name);
    let (header, mut file) = f21::decode(&std::fs::read(&p).unwrap()).unwrap();
    change(&mut file);
    std::fs::write(
        &p,
        f21::encode_with_writer(&file, &header.writer, header.written_at),
    )
    .unwrap();
}

#[test]
fn special_files_oversize_files_and_the_manifest_cases_get_one_verdict() {
    type Mutation = fn(&Path);
    use Verdict::*;
    let cases: Vec<(&str, Verdict, Mutation)> = vec![
        ("as written", Loads, |_| {}),
        ("a listed channel file missing", LoadsWithLoss, |d| {
            std::fs::remove_file(d.join("state.snapshot")).unwrap()
        }),
        ("a leftover temporary file", Loads, |d| {
            std::fs::write(d.join("jobs.snapshot.tmp"), b"half").unwrap()
        }),
        ("no manifest", Loads, |d| {
            std::fs::remove_file(d.join("saguin.manifest")).unwrap()
        }),
        (
            "a channel written before the manifest's moment",
            LoadsWithLoss,
            |d| {
                let p = d.join("jobs.snapshot");
                let (_, file) = f21::decode(&std::fs::read(&p).unwrap()).unwrap();
                std::fs::write(
                    p,
                    f21::encode_with_writer(&file, "0123456789ab", BEGAN_AT - 1),
                )
                .unwrap();
            },
        ),
        (
            "a channel written after the manifest's moment",
            Loads,
            |d| {
                let p = d.join("state.snapshot");
                let (_, file) = f21::decode(&std::fs::read(&p).unwrap()).unwrap();
                std::fs::write(
                    p,
                    f21::encode_with_writer(&file, "0123456789ab", BEGAN_AT + 1),
                )
                .unwrap();
            },
        ),
        ("a truncated manifest", ManifestWarning, |d| {
            std::fs::write(d.join("saguin.manifest"), b"\x89SAGUIN\n").unwrap()
        }),
        ("a channel file's checksum flipped", Refused, |d| {
            let p = d.join("telemetry.snapshot");
            let mut b = std::fs::read(&p).unwrap();
            let last = b.len() - 1;
            b[last] ^= 1;
            std::fs::write(p, b).unwrap();
        }),
        ("two damaged files, both named", Refused, |d| {
            for name in ["state.snapshot", "%24saguin%2Fretained.snapshot"] {
                let p = d.join(name);
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() / 2]).unwrap();
            }
        }),
        (
            "a channel's file under another channel's name",
            Refused,
            |d| {
                std::fs::copy(d.join("telemetry.snapshot"), d.join("state.snapshot")).unwrap();
            },
        ),
        ("the broadcast log missing", Refused, |d| {
            std::fs::remove_file(d.join("saguin.broadcast")).unwrap()
        }),
        ("a sessions file that does not fit its log", Refused, |d| {
            rewrite(d, "saguin.broadcast", |f| {
                if let SnapshotFile::Broadcast(b) = f {
                    // Every message and cursor gone: the sessions'
                    // in-flight entries now point past the log's end.
                    b.messages.clear();
                    b.cursors.clear();
                    b.held.clear();
                    b.next = 1;
                    b.floor = 1;
                    b.bytes = 0;
                }
            })
        }),
        ("a position whose reader holds a NUL", Refused, |d| {
            rewrite(d, "telemetry.snapshot", |f| {
                if let SnapshotFile::Channel(c) = f {
                    c.positions[0].reader = "mqtt:sensor\0a".into();
                }
            })
        }),
        (
            "a dead-letter reader longer than a client id may be",
            Refused,
            |d| {
                rewrite(d, "jobs.snapshot", |f| {
                    if let SnapshotFile::Channel(c) = f {
                        if let Some(dlq) = &mut c.dead_letter {
                            dlq.positions[0].reader = format!("bridge:{}", "x".repeat(65_536));
                        }
                    }
                })
            },
        ),
        (
            "a broadcast cursor whose reader holds a NUL",
            Refused,
            |d| {
                rewrite(d, "saguin.broadcast", |f| {
                    if let SnapshotFile::Broadcast(b) = f {
                        b.cursors[0].reader = "mqtt:\0".into();
                    }
                })
            },
        ),
        ("a FIFO as a channel file", Refused, |d| {
            std::fs::remove_file(d.join("jobs.snapshot")).unwrap();
            mkfifo(&d.join("jobs.snapshot"));
        }),
        ("a FIFO as the sessions file", Refused, |d| {
            std::fs::remove_file(d.join("saguin.sessions")).unwrap();
            mkfifo(&d.join("saguin.sessions"));
        }),
        ("a symlink as a channel file", Refused, |d| {
            std::fs::rename(d.join("jobs.snapshot"), d.join("elsewhere")).unwrap();
            std::os::unix::fs::symlink(d.join("elsewhere"), d.join("jobs.snapshot")).unwrap();
        }),
        ("a directory as a channel file", Refused, |d| {
            std::fs::remove_file(d.join("jobs.snapshot")).unwrap();
            std::fs::create_dir(d.join("jobs.snapshot")).unwrap();
        }),
        ("a channel file past the size limit", Refused, |d| {
            // Sparse: the size is refused from fstat before a byte is read.
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("telemetry.snapshot"))
                .unwrap();
            f.set_len(F21_DEFAULT_MAX_BYTES + 1).unwrap();
        }),
        ("a legacy MBMQTT01 file as a channel file", Refused, |d| {
            std::fs::copy(
                fixtures().join("mbmqtt/broker-v3.snapshot"),
                d.join("telemetry.snapshot"),
            )
            .unwrap();
        }),
    ];
    let mut disagreements = Vec::new();
    for (name, expected, mutate) in cases {
        let d = tempfile::tempdir().unwrap();
        copy_golden(d.path());
        mutate(d.path());
        disagreements.extend(judge(name, d.path(), expected));
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

#[test]
fn a_file_of_a_store_the_provider_does_not_keep_is_not_read() {
    // Verify reads every file; a provider reads only what it keeps, so a
    // damaged file of a channel the configuration dropped, or of a
    // retained store or sessions kept on another provider, does not stop
    // it ("a file nobody asked for - nothing").
    let d = tempfile::tempdir().unwrap();
    copy_golden(d.path());
    for name in ["saguin.sessions", "%24saguin%2Fretained.snapshot"] {
        std::fs::write(d.path().join(name), b"junk").unwrap();
    }
    std::fs::write(d.path().join("dropped.snapshot"), b"junk").unwrap();
    assert_eq!(verify(d.path()).exit, 1);
    let provider = MemoryProvider::new(MemoryConfig {
        name: "mem".into(),
        max_bytes: None,
        reserve: 0,
    })
    .unwrap();
    let report = provider
        .load_snapshot_dir(
            d.path(),
            &LoadOptions {
                channels: CHANNELS.iter().map(|(n, k)| (n.to_string(), *k)).collect(),
                retained: false,
                sessions: false,
                now: BEGAN_AT,
                max_session_expiry: 7 * 86_400,
                max_file_bytes: F21_DEFAULT_MAX_BYTES,
            },
        )
        .unwrap();
    assert_eq!(
        report.ignored_files,
        [
            "%24saguin%2Fretained.snapshot",
            "dropped.snapshot",
            "saguin.broadcast",
            "saguin.sessions"
        ]
    );
    assert_eq!(report.loaded.len(), 3);
}

/// Issue 26, item 1: an append channel's file with floor 4, next 13 and
/// records at 5, 6, 8, 9 and 12 was accepted by `snapshot verify` and the
/// loader and refused late by `migrate to-sqlite`, from the destination's
/// own check. An append channel loses records from the front only, so a
/// hole is damage (FORMAT.md §7, invariant 1): all three refuse it, name
/// it in the same words, and the migration writes nothing.
#[test]
fn a_hole_between_floor_and_next_gets_one_verdict_from_verify_the_loader_and_migrate() {
    let d = tempfile::tempdir().unwrap();
    copy_golden(d.path());
    rewrite(d.path(), "telemetry.snapshot", |f| {
        if let SnapshotFile::Channel(c) = f {
            c.floor = 4;
            c.next = 13;
            c.records.truncate(5);
            for (record, offset) in c.records.iter_mut().zip([5, 6, 8, 9, 12]) {
                record.offset = offset;
            }
            c.bytes = c
                .records
                .iter()
                .map(saguin_format::model::Record::accounted_size)
                .sum();
        }
    });
    let disagreements = judge("a hole", d.path(), Verdict::Refused);
    assert!(disagreements.is_empty(), "{disagreements:#?}");
    let hole = "records 4..4 are missing between the floor 4 and next 13";
    let v = verify(d.path());
    assert!(
        v.failures.iter().any(|(_, m)| m.contains(hole)),
        "{:#?}",
        v.failures
    );
    let m = migrate(d.path());
    assert_eq!(m.exit, 3, "{}", m.stderr);
    assert!(m.stderr.contains(hole), "{}", m.stderr);
    assert!(m.left.is_empty(), "migrate wrote {:?}", m.left);
}
