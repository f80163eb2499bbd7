//! `saguin serve` under a supervisor, as a process: systemd's notify
//! protocol spoken to a fake `NOTIFY_SOCKET`, and SIGHUP.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// A broker started as a process.
struct Served {
    child: Option<Child>,
    pid: libc::pid_t,
    /// Where stderr goes when it is a file, so the log can be read at the
    /// moment a notification arrives.
    log: Option<PathBuf>,
}

impl Served {
    /// Started with `stderr` (a file in `dir` when `None`).
    fn start(dir: &Path, config: &Path, env: &[(&str, &str)], stderr: Option<Stdio>) -> Served {
        let (stderr, log) = match stderr {
            Some(stderr) => (stderr, None),
            None => {
                let log = dir.join("serve.log");
                let file = std::fs::File::create(&log).expect("create the log file");
                (Stdio::from(file), Some(log))
            }
        };
        let child = Command::new(env!("CARGO_BIN_EXE_saguin"))
            .args(["serve", "--config"])
            .arg(config)
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn saguin serve");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid");
        Served {
            child: Some(child),
            pid,
            log,
        }
    }

    fn log_text(&self) -> String {
        self.log
            .as_ref()
            .and_then(|log| std::fs::read_to_string(log).ok())
            .unwrap_or_default()
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        assert_eq!(unsafe { libc::kill(self.pid, signal) }, 0, "kill");
    }

    /// Waits (bounded) for the exit status.
    fn wait_exit(&mut self) -> Option<i32> {
        let mut child = self.child.take().expect("not yet waited for");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(WAIT) {
            Ok(status) => status.expect("wait").code(),
            Err(_) => {
                self.signal(libc::SIGKILL);
                panic!("saguin serve did not exit: {}", self.log_text());
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Lines of `stderr`, as they come, on a channel.
fn lines_of(stderr: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Lines until one satisfies `wanted` (bounded); every line read is kept
/// in `log`.
fn line_until(
    lines: &mpsc::Receiver<String>,
    log: &mut Vec<String>,
    wanted: impl Fn(&str) -> bool,
) -> String {
    loop {
        match lines.recv_timeout(WAIT) {
            Ok(line) => {
                log.push(line.clone());
                if wanted(&line) {
                    return line;
                }
            }
            Err(_) => panic!("the line never came; log:\n{}", log.join("\n")),
        }
    }
}

/// The next notification datagram, or a panic showing the log.
fn next_notification(supervisor: &UnixDatagram, served: &Served) -> String {
    let mut buf = [0u8; 4096];
    match supervisor.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(err) => panic!(
            "no notification ({err}); the broker's log:\n{}",
            served.log_text()
        ),
    }
}

/// Notifications until one satisfies `wanted`, which is returned; the
/// skipped ones are appended to `seen`.
fn notification_until(
    supervisor: &UnixDatagram,
    served: &Served,
    seen: &mut Vec<String>,
    wanted: impl Fn(&str) -> bool,
) -> String {
    loop {
        let message = next_notification(supervisor, served);
        if wanted(&message) {
            return message;
        }
        seen.push(message);
    }
}

fn listening_addr(log: &str) -> Option<std::net::SocketAddr> {
    log.lines()
        .find(|l| l.contains("msg=\"listening\"") && l.contains("listener=mqtt"))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("addr="))?
        .parse()
        .ok()
}

fn fake_supervisor(dir: &Path) -> (UnixDatagram, PathBuf) {
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind the fake notify socket");
    socket.set_read_timeout(Some(WAIT)).expect("read timeout");
    (socket, path)
}

#[test]
fn ready_comes_after_the_listeners_watchdog_pings_and_stopping_at_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("saguin.yaml");
    std::fs::write(
        &config,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
         auth:\n  allow_anonymous: true\n\
         storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: snapshots\n\
         broker:\n  retained_storage: mem\n  session_storage: mem\n",
    )
    .expect("write the configuration");
    let (supervisor, socket) = fake_supervisor(dir.path());
    let mut served = Served::start(
        dir.path(),
        &config,
        &[
            ("NOTIFY_SOCKET", socket.to_str().expect("utf-8 path")),
            // A ping every 100 ms.
            ("WATCHDOG_USEC", "200000"),
        ],
        None,
    );

    let mut before_ready = Vec::new();
    notification_until(&supervisor, &served, &mut before_ready, |m| {
        m.lines().any(|l| l == "READY=1")
    });
    // READY=1 only once the listener is bound: its line is already logged
    // and the port already accepts.
    let log = served.log_text();
    let addr = listening_addr(&log)
        .unwrap_or_else(|| panic!("READY=1 before the listening line; log:\n{log}"));
    std::net::TcpStream::connect(addr).expect("the listener accepts at READY=1");
    assert!(
        log.contains("msg=\"state restored\""),
        "READY=1 before the state was restored; log:\n{log}"
    );
    // The startup said what it was doing, and no ping came before READY.
    assert!(
        before_ready
            .iter()
            .any(|m| m.starts_with("STATUS=") && m.contains("recovering the storage providers")),
        "{before_ready:?}"
    );
    assert!(
        !before_ready.iter().any(|m| m.contains("WATCHDOG=1")),
        "{before_ready:?}"
    );

    // The watchdog pings, and keeps pinging.
    let mut skipped = Vec::new();
    for _ in 0..2 {
        notification_until(&supervisor, &served, &mut skipped, |m| m == "WATCHDOG=1");
    }

    served.signal(libc::SIGTERM);
    let stopping = notification_until(&supervisor, &served, &mut skipped, |m| {
        m.lines().any(|l| l == "STOPPING=1")
    });
    assert!(stopping.contains("STATUS=SIGTERM received"), "{stopping}");
    // The shutdown's progress follows as STATUS= lines, to its end.
    let mut during_stop = Vec::new();
    notification_until(&supervisor, &served, &mut during_stop, |m| {
        m == "STATUS=every storage provider closed"
    });
    assert!(
        during_stop
            .iter()
            .any(|m| m.starts_with("STATUS=") && m.contains("snapshot")),
        "no snapshot progress among {during_stop:?}"
    );
    assert_eq!(served.wait_exit(), Some(0), "{}", served.log_text());
}

#[test]
fn an_unusable_notify_socket_is_logged_and_the_broker_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("saguin.yaml");
    std::fs::write(
        &config,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n",
    )
    .expect("write the configuration");
    let mut served = Served::start(
        dir.path(),
        &config,
        &[("NOTIFY_SOCKET", "relative/notify.sock")],
        Some(Stdio::piped()),
    );
    let stderr = served.child.as_mut().and_then(|c| c.stderr.take());
    let lines = lines_of(stderr.expect("stderr"));
    let mut log = Vec::new();
    let warning = line_until(&lines, &mut log, |l| {
        l.contains("cannot notify the supervisor")
    });
    assert!(warning.contains("relative/notify.sock"), "{warning}");
    line_until(&lines, &mut log, |l| listening_addr(l).is_some());
    served.signal(libc::SIGTERM);
    assert_eq!(served.wait_exit(), Some(0), "{}", log.join("\n"));
}

#[test]
fn a_broker_that_cannot_bind_its_listener_never_says_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The port is held here, so the broker's bind fails after its
    // providers are recovered: READY=1 sent any earlier than the bind would
    // arrive before the exit.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let port = held.local_addr().expect("addr").port();
    let config = dir.path().join("saguin.yaml");
    std::fs::write(
        &config,
        format!(
            "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:{port}\n\
             auth:\n  allow_anonymous: true\n\
             storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: snapshots\n\
             broker:\n  retained_storage: mem\n  session_storage: mem\n"
        ),
    )
    .expect("write the configuration");
    let (supervisor, socket) = fake_supervisor(dir.path());
    let mut served = Served::start(
        dir.path(),
        &config,
        &[("NOTIFY_SOCKET", socket.to_str().expect("utf-8 path"))],
        None,
    );
    assert_eq!(served.wait_exit(), Some(3), "{}", served.log_text());
    // Everything it sent is queued on the socket by now.
    supervisor.set_nonblocking(true).expect("nonblocking");
    let mut sent = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = supervisor.recv(&mut buf) {
        sent.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(
        sent.iter().any(|m| m.starts_with("STATUS=")),
        "the start said nothing: {sent:?}"
    );
    assert!(
        !sent.iter().any(|m| m.lines().any(|l| l == "READY=1")),
        "READY=1 from a broker that never listened: {sent:?}"
    );
    drop(held);
}

/// A CONNECT (MQTT 3.1.1, clean session) as `user`; the CONNACK's return
/// code (0 accepted, 4 bad user name or password).
fn connect_as(addr: std::net::SocketAddr, user: &str, password: &str) -> u8 {
    use std::io::{Read, Write};
    let mut body = Vec::new();
    body.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0b1100_0010, 0, 30]);
    for field in ["reload-test", user, password] {
        body.extend_from_slice(&u16::try_from(field.len()).unwrap().to_be_bytes());
        body.extend_from_slice(field.as_bytes());
    }
    let mut packet = vec![0x10, u8::try_from(body.len()).expect("a short CONNECT")];
    packet.extend_from_slice(&body);
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("read timeout");
    stream.write_all(&packet).expect("send CONNECT");
    let mut connack = [0u8; 4];
    stream.read_exact(&mut connack).expect("a CONNACK");
    assert_eq!(connack[..2], [0x20, 2], "not a CONNACK: {connack:?}");
    connack[3]
}

fn password_line(user: &str, password: &str) -> String {
    let hash = saguin::broker::auth::hash_password(password.as_bytes(), 101).expect("hash");
    format!("{user}:{hash}\n")
}

#[test]
fn sighup_reloads_the_password_file_and_a_broken_one_keeps_the_old() {
    let dir = tempfile::tempdir().expect("tempdir");
    let passwords = dir.path().join("passwords");
    std::fs::write(&passwords, password_line("alice", "wonderland")).expect("write");
    std::fs::write(dir.path().join("acl"), "topic readwrite #\n").expect("write");
    let config = dir.path().join("saguin.yaml");
    std::fs::write(
        &config,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\n\
         auth:\n  allow_anonymous: false\n  password_file: passwords\n  acl_file: acl\n",
    )
    .expect("write the configuration");
    let mut served = Served::start(dir.path(), &config, &[], Some(Stdio::piped()));
    let stderr = served.child.as_mut().and_then(|c| c.stderr.take());
    let lines = lines_of(stderr.expect("stderr"));
    let mut log = Vec::new();
    let listening = line_until(&lines, &mut log, |l| listening_addr(l).is_some());
    let addr = listening_addr(&listening).expect("an address");
    assert_eq!(connect_as(addr, "alice", "wonderland"), 0);
    assert_eq!(
        connect_as(addr, "bob", "builder"),
        4,
        "bob before he is added"
    );

    // bob is added; after SIGHUP he logs in.
    let mut both = password_line("alice", "wonderland");
    both.push_str(&password_line("bob", "builder"));
    std::fs::write(&passwords, &both).expect("write");
    served.signal(libc::SIGHUP);
    let reloaded = line_until(&lines, &mut log, |l| {
        l.contains("msg=\"reloaded\"") && l.contains("key=password_file")
    });
    assert!(
        reloaded.contains("entries=2") && reloaded.contains("changed=true"),
        "{reloaded}"
    );
    line_until(&lines, &mut log, |l| {
        l.contains("msg=\"reloaded\"") && l.contains("key=acl_file")
    });
    assert_eq!(
        connect_as(addr, "bob", "builder"),
        0,
        "bob after the reload"
    );

    // A broken file: refused by name and line, the old one stays in force.
    std::fs::write(&passwords, "carol\n").expect("write");
    served.signal(libc::SIGHUP);
    let refused = line_until(&lines, &mut log, |l| l.contains("reload refused"));
    assert!(refused.contains("level=ERROR"), "{refused}");
    let problem = log
        .iter()
        .find(|l| l.contains("cannot reload"))
        .unwrap_or_else(|| panic!("no problem line; log:\n{}", log.join("\n")));
    assert!(
        problem.contains(&passwords.display().to_string()) && problem.contains("line 1"),
        "{problem}"
    );
    assert_eq!(
        connect_as(addr, "bob", "builder"),
        0,
        "the old file in force"
    );
    assert_eq!(connect_as(addr, "carol", "x"), 4);

    served.signal(libc::SIGTERM);
    assert_eq!(served.wait_exit(), Some(0), "{}", log.join("\n"));
}

#[test]
fn sighup_without_auth_files_is_logged_and_the_broker_serves_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("saguin.yaml");
    std::fs::write(
        &config,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n",
    )
    .expect("write the configuration");
    let mut served = Served::start(dir.path(), &config, &[], Some(Stdio::piped()));
    let stderr = served.child.as_mut().and_then(|c| c.stderr.take());
    let lines = lines_of(stderr.expect("stderr"));
    let mut log = Vec::new();
    let listening = line_until(&lines, &mut log, |l| listening_addr(l).is_some());
    let addr = listening_addr(&listening).expect("an address");
    served.signal(libc::SIGHUP);
    line_until(&lines, &mut log, |l| l.contains("nothing to reload"));
    assert_eq!(connect_as(addr, "anyone", "x"), 0, "still serving");
    served.signal(libc::SIGTERM);
    assert_eq!(served.wait_exit(), Some(0), "{}", log.join("\n"));
}
