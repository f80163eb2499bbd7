//! `saguin serve` refuses settings that ask it to keep something in a
//! storage provider it does not yet keep there, naming each one, rather than
//! announcing a durability it would not deliver (invariant 14).

use std::process::Command;

#[test]
fn channels_and_stored_broker_state_are_refused_by_name() {
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
        stderr.contains("broker.session_storage"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("listening"), "stderr: {stderr}");
    assert!(
        !dir.path().join("saguin.db").exists(),
        "nothing is created for a refused configuration"
    );
}
