//! The Grafana dashboard and the Prometheus alerting rules under
//! `docs/monitoring/` name only metrics a real broker exports - one with a
//! memory provider writing snapshots, a sqlite provider, a channel of each
//! kind and a bridge, so every family is declared - and the rules file has
//! the fields Prometheus's rule schema requires.

mod broker_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use broker_support::*;
use serde_json::Value as Json;
use serde_norway::Value as Yaml;

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/monitoring")
        .join(file)
}

/// Every metric family a broker with every kind of provider, channel and
/// a bridge declares in `/metrics` (`# TYPE` lines).
fn exported_families() -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on the bridge's remote: the bridge retries, and its
    // families are declared all the same.
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         metrics:\n  bind: 127.0.0.1:0\n\
         storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: {}\n    max_bytes: 64MiB\n\
         \x20 - name: db\n    kind: sqlite\n    file_path: {}\n    max_bytes: 1GiB\n\
         channels:\n  - name: telemetry\n    kind: append\n    storage: db\n\
         \x20 - name: alarms\n    kind: append\n    storage: mem\n\
         \x20 - name: devices\n    kind: latest\n    storage: db\n\
         \x20 - name: jobs\n    kind: queue\n    storage: db\n\
         broker:\n  session_storage: db\n  retained_storage: mem\n\
         bridges:\n  - name: cloud\n    address: {unreachable}\n    out: [{{ channel: telemetry, remote_prefix: up/ }}]\n",
        dir.path().join("snapshots").display(),
        dir.path().join("saguin.db").display(),
    );
    let broker = Broker::start_in(dir, &yaml);
    let text = metrics_text(&broker);
    let families: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    // The families the rules and the dashboard lean on most are there.
    for family in [
        "saguin_provider_bytes",
        "saguin_provider_max_bytes",
        "saguin_snapshot_unsaved_seconds",
        "saguin_queue_dead_lettered_total",
        "saguin_bridge_lag_seconds",
        "saguin_channel_info",
    ] {
        assert!(families.contains(family), "{family} not exported:\n{text}");
    }
    families
}

/// The `saguin_*` metric names in a PromQL expression or a template.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("saguin_") {
        let before = rest[..at].chars().last();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // Part of a longer identifier (`my_saguin_x`) is not a name.
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_dashboard_and_the_rules_name_only_metrics_the_broker_exports() {
    let families = exported_families();
    let check = |what: &str, text: &str| -> usize {
        let names = metric_names(text);
        for name in &names {
            assert!(
                families.contains(name),
                "{what}: {name} is not a metric the broker exports ({text})"
            );
        }
        names.len()
    };

    // The dashboard: every query of every panel and template variable.
    let dashboard: Json = serde_json::from_str(
        &std::fs::read_to_string(monitoring("saguin-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        panels += 1;
        let title = panel["title"].as_str().expect("a panel has a title");
        let targets = panel["targets"].as_array().expect("a panel has targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("a target has an expr");
            assert!(
                check(&format!("panel {title}"), expr) > 0,
                "panel {title} queries no saguin metric: {expr}"
            );
        }
    }
    assert!(panels >= 20, "only {panels} panels");
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = variable["definition"].as_str() {
            check("a template variable", definition);
        }
    }

    // The rules: the schema Prometheus reads, and their expressions.
    let rules: Yaml =
        serde_norway::from_str(&std::fs::read_to_string(monitoring("saguin-alerts.yml")).unwrap())
            .expect("the rules file is YAML");
    let groups = rules["groups"].as_sequence().expect("groups: a list");
    let mut seen_groups = BTreeSet::new();
    let mut alerts = BTreeSet::new();
    let mut used = BTreeSet::new();
    for group in groups {
        let name = group["name"].as_str().expect("groups[].name");
        assert!(seen_groups.insert(name.to_owned()), "group {name} twice");
        let group_rules = group["rules"].as_sequence().expect("groups[].rules");
        assert!(!group_rules.is_empty(), "group {name} has no rules");
        for rule in group_rules {
            let alert = rule["alert"].as_str().expect("rules[].alert");
            assert!(alerts.insert(alert.to_owned()), "alert {alert} twice");
            let expr = rule["expr"].as_str().expect("rules[].expr");
            let duration = rule["for"].as_str().expect("rules[].for");
            assert!(
                duration == "0m" || humantime::parse_duration(duration).is_ok(),
                "{alert}: for: {duration:?}"
            );
            let labels = rule["labels"].as_mapping().expect("rules[].labels");
            let severity = labels
                .get("severity")
                .and_then(Yaml::as_str)
                .expect("labels.severity");
            assert!(
                ["critical", "warning", "info"].contains(&severity),
                "{alert}: severity {severity}"
            );
            let annotations = rule["annotations"]
                .as_mapping()
                .expect("rules[].annotations");
            for key in ["summary", "description"] {
                let text = annotations
                    .get(key)
                    .and_then(Yaml::as_str)
                    .unwrap_or_else(|| panic!("{alert}: annotations.{key}"));
                used.extend(metric_names(text));
                check(&format!("{alert} {key}"), text);
            }
            let names = metric_names(expr);
            // `up` is Prometheus's own; every other rule is on a saguin metric.
            assert!(
                !names.is_empty() || expr.starts_with("up{"),
                "{alert} names no saguin metric: {expr}"
            );
            check(alert, expr);
            used.extend(names);
        }
    }
    // What an operator must hear about is covered.
    for family in [
        "saguin_consumer_lag",
        "saguin_storage_errors_total",
        "saguin_provider_max_bytes",
        "saguin_provider_failed",
        "saguin_provider_held_to_disk",
        "saguin_dropped_messages_total",
        "saguin_queue_dead_lettered_total",
        "saguin_snapshot_age_seconds",
        "saguin_snapshot_unsaved_seconds",
    ] {
        assert!(used.contains(family), "no rule watches {family}");
    }
}

#[test]
fn metric_names_are_found_whole_in_expressions() {
    assert_eq!(
        metric_names("saguin_provider_bytes / saguin_provider_max_bytes > 0.9"),
        ["saguin_provider_bytes", "saguin_provider_max_bytes"]
    );
    assert_eq!(
        metric_names("sum by (x) (rate(saguin_a_total{k=\"saguin_b\"}[5m]))"),
        ["saguin_a_total", "saguin_b"]
    );
    assert!(metric_names("my_saguin_x + up").is_empty());
}

/// Where Prometheus's own checker is installed, it accepts the rules
/// (PromQL, templates) and their unit tests pass
/// (`docs/monitoring/saguin-alerts.test.yml`: each alert fires on the
/// series of a broker in trouble, and not on a quiet one).
#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let installed = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        say_skipped(
            "promtool_accepts_the_rules_and_their_unit_tests_pass",
            "promtool not installed (Debian's prometheus package holds it; .ci/run fetches it)",
        );
        return;
    }
    let dir = monitoring("");
    for args in [
        ["check", "rules", "saguin-alerts.yml"],
        ["test", "rules", "saguin-alerts.test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
