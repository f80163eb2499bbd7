//! `saguin serve --bind ADDR`: the embedded default on another address
//! without writing a configuration, as `mosquitto -p` does; refused beside
//! `--config`, which names its own listeners.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn serve_bind_moves_the_embedded_default_off_1883() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["serve", "--bind", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn saguin serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    let addr = loop {
        match rx.recv_timeout(WAIT) {
            Ok(line) => {
                log.push(line.clone());
                if line.contains("msg=\"listening\"") {
                    let addr = line
                        .split_whitespace()
                        .find_map(|f| f.strip_prefix("addr="))
                        .expect("an addr field")
                        .parse::<std::net::SocketAddr>()
                        .expect("an address");
                    break addr;
                }
            }
            Err(_) => {
                let _ = child.kill();
                panic!("saguin serve --bind did not listen: {log:#?}");
            }
        }
    };
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    assert_ne!(addr.port(), 1883);
    assert_ne!(addr.port(), 0);
    std::net::TcpStream::connect(addr).expect("the listener accepts");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn serve_bind_with_a_configuration_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("saguin.yaml");
    std::fs::write(
        &config,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["serve", "--bind", "127.0.0.1:0", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--bind") && stderr.contains("--config"),
        "{stderr}"
    );
    for bad in ["1883", "localhost:1883", "nonsense"] {
        let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
            .args(["serve", "--bind", bad])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}
