//! `saguin serve` refuses settings it does not serve yet (channels), naming
//! each one, rather than announcing a durability it would not deliver
//! (invariant 14); `check-config` reports the same settings and exits 1, so
//! the two agree.

use std::process::Command;

#[test]
fn channels_are_refused_by_name_and_stored_broker_state_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("saguin.yaml");
    std::fs::write(
        &config,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
             auth:\n  allow_anonymous: true\n\
             storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
             channels:\n  - name: telemetry\n    kind: append\n    storage: db\n\
             broker:\n  session_storage: db\n",
            dir.path().join("saguin.db").display()
        ),
    )
    .expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run saguin serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    assert!(
        stderr.contains("channels[0] (telemetry)"),
        "stderr: {stderr}"
    );
    assert!(
        !stderr.contains("broker.session_storage"),
        "session_storage is served, not refused; stderr: {stderr}"
    );
    assert!(!stderr.contains("listening"), "stderr: {stderr}");
    assert!(
        !dir.path().join("saguin.db").exists(),
        "nothing is created for a refused configuration"
    );
    assert!(
        !dir.path().join("saguin.db.lock").exists(),
        "no provider is opened for a refused configuration"
    );
}

/// Check-config calls a configuration valid only when serve runs
/// it; one function decides for both.
#[test]
fn check_config_agrees_with_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("saguin.yaml");
    std::fs::write(
        &config,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
             auth:\n  allow_anonymous: true\n\
             storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
             channels:\n  - name: telemetry\n    kind: append\n    storage: db\n\
             \x20 - name: jobs\n    kind: queue\n    storage: db\n",
            dir.path().join("saguin.db").display()
        ),
    )
    .expect("write config");
    for output in [&[][..], &["--output"][..], &["--output", "json"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
            .arg("check-config")
            .arg("--config")
            .arg(&config)
            .args(output)
            .output()
            .expect("run saguin check-config");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{output:?}: {stderr}");
        for needle in [
            "channels[0] (telemetry)",
            "channels[1] (jobs)",
            "2 settings `saguin serve` refuses",
        ] {
            assert!(
                stderr.contains(needle),
                "{output:?}: {needle} missing: {stderr}"
            );
        }
    }
    let serve = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run saguin serve");
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("channels[1] (jobs)"), "{stderr}");
}
