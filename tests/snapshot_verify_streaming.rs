//! `saguin snapshot verify` scans with [`snapshot_dir::scan_checking`],
//! which drops each record once checked; the loader scans with
//! [`snapshot_dir::scan`], which keeps them. Both run the one decoder, so
//! on every directory they must report the same findings and the same
//! verdict: here the golden directory, and the golden directory with each
//! damaged format 21 file put in place of the file of its kind.

use std::path::{Path, PathBuf};

use saguin::storage::snapshot_dir::{self, FileOutcome, ScanOptions};
use saguin_format::f21::SnapshotFile;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn copy_golden(to: &Path) {
    for e in std::fs::read_dir(fixtures().join("f21/dir")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Findings and per-file outcomes, as text, for comparison.
fn summary(dir: &Path, checking: bool) -> (bool, Vec<String>, Vec<String>) {
    let opts = ScanOptions::default();
    let report = if checking {
        snapshot_dir::scan_checking(dir, &opts)
    } else {
        snapshot_dir::scan(dir, &opts)
    }
    .expect("the directory scans");
    let files = report
        .files
        .iter()
        .map(|f| match &f.outcome {
            FileOutcome::Decoded { header, file } => {
                format!("{} ok {:?} {}", f.name, header, file.kind())
            }
            FileOutcome::Failed(p) => format!("{} failed {p}", f.name),
            FileOutcome::NotConfigured => format!("{} not configured", f.name),
            FileOutcome::NotCurrent => format!("{} not current", f.name),
        })
        .collect();
    let findings = report.findings.iter().map(|f| f.to_string()).collect();
    (report.is_loadable(), files, findings)
}

#[test]
fn checking_scan_agrees_with_the_loading_scan_on_every_damage() {
    let golden = tempfile::tempdir().unwrap();
    copy_golden(golden.path());
    let (loadable, ..) = summary(golden.path(), false);
    assert!(loadable, "the golden directory loads");
    assert_eq!(summary(golden.path(), true), summary(golden.path(), false));

    let mut cases = 0;
    for e in std::fs::read_dir(fixtures().join("damaged/f21")).unwrap() {
        let damaged = e.unwrap().path();
        let name = damaged.file_name().unwrap().to_str().unwrap().to_owned();
        // Put the damaged file where a file of its kind belongs.
        let target = match damaged.extension().and_then(|x| x.to_str()) {
            Some("snapshot") => "telemetry.snapshot",
            Some("manifest") => "saguin.manifest",
            Some("sessions") => "saguin.sessions",
            Some("broadcast") => "saguin.broadcast",
            _ => continue,
        };
        let dir = tempfile::tempdir().unwrap();
        copy_golden(dir.path());
        std::fs::copy(&damaged, dir.path().join(target)).unwrap();
        let loading = summary(dir.path(), false);
        let checking = summary(dir.path(), true);
        assert_eq!(checking, loading, "{name}: the scans disagree");
        cases += 1;
    }
    assert!(cases > 30, "only {cases} damaged files");
}

#[test]
fn the_checking_scan_keeps_no_record() {
    let dir = tempfile::tempdir().unwrap();
    copy_golden(dir.path());
    let report = snapshot_dir::scan_checking(dir.path(), &ScanOptions::default()).unwrap();
    let mut channels = 0;
    for f in &report.files {
        if let FileOutcome::Decoded { file, .. } = &f.outcome {
            match file {
                SnapshotFile::Channel(c) => {
                    channels += 1;
                    assert!(c.records.is_empty() && c.items.is_empty());
                }
                SnapshotFile::Retained(r) => assert!(r.records.is_empty()),
                SnapshotFile::Broadcast(b) => assert!(b.messages.is_empty()),
                _ => {}
            }
        }
    }
    assert!(channels > 0);
}
