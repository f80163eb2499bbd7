//! Every saguin configuration the repository holds is checked with
//! `saguin check-config`: the YAML files under `docs/` and `fixtures/`, and
//! the configuration blocks of the README and the pages under `docs/`
//! (```` ```yaml file=NAME.yaml ````). The good ones must be valid, and the
//! ones under `fixtures/config/bad/` refused (each with its `.expected`
//! problems, which `tests/config_check.rs` compares line by line).

use std::path::{Path, PathBuf};
use std::process::Command;

/// YAML files that are not saguin configurations, and why.
const NOT_CONFIGURATIONS: &[(&str, &str)] = &[
    (
        "docs/monitoring/saguin-alerts.yml",
        "Prometheus alerting rules, checked by tests/monitoring.rs",
    ),
    (
        "docs/monitoring/saguin-alerts.test.yml",
        "promtool's unit tests of those rules, run by tests/monitoring.rs",
    ),
];

fn top() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check_config(path: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["check-config", "--config"])
        .arg(path)
        .output()
        .expect("run saguin check-config");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = walkdir::WalkDir::new(dir)
        .into_iter()
        .map(|e| e.expect("walk").into_path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_configuration_file_under_docs_and_fixtures_is_checked() {
    let mut valid = 0;
    let mut refused = 0;
    for path in yaml_files(&top().join("docs"))
        .into_iter()
        .chain(yaml_files(&top().join("fixtures")))
    {
        let relative = path
            .strip_prefix(top())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if NOT_CONFIGURATIONS.iter().any(|(p, _)| *p == relative) {
            continue;
        }
        let (code, stderr) = check_config(&path);
        if relative.starts_with("fixtures/config/bad/") {
            assert_eq!(code, 1, "{relative} must be refused: {stderr}");
            assert!(
                path.with_extension("expected").exists(),
                "{relative} has no .expected beside it"
            );
            refused += 1;
        } else {
            assert_eq!(code, 0, "{relative} is not valid: {stderr}");
            valid += 1;
        }
    }
    assert!(valid >= 4, "only {valid} valid configurations found");
    assert!(refused >= 15, "only {refused} refused configurations found");
}

#[test]
fn every_configuration_block_of_the_pages_is_valid() {
    let mut pages = vec![top().join("README.md")];
    pages.extend(
        std::fs::read_dir(top().join("docs"))
            .expect("docs/")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            let Some(info) = line.strip_prefix("```") else {
                continue;
            };
            let block: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            let Some(name) = info
                .split_whitespace()
                .find_map(|w| w.strip_prefix("file="))
                .filter(|n| n.ends_with(".yaml"))
            else {
                continue;
            };
            let path = dir.path().join(format!("{checked}-{name}"));
            std::fs::write(&path, block.join("\n") + "\n").unwrap();
            let (code, stderr) = check_config(&path);
            assert_eq!(code, 0, "{} {name}: {stderr}", page.display());
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} configuration blocks found");
}
