//! `saguin serve` on its storage providers, as a process: the lock refuses
//! a second broker at once naming the holder; a file that cannot be loaded
//! stops the start naming it, before any listener is bound; a graceful stop
//! writes the snapshot directory `snapshot verify` accepts and the next
//! start loads; sqlite is checkpointed and its lock let go.

mod broker_support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use broker_support::volume::memory_backed_dir;
use broker_support::{Broker, WAIT};
use serde_json::Value;

const RETAINED_FILE: &str = "%24saguin%2Fretained.snapshot";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A port nobody listens on: bound on port 0, then let go.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

/// A configuration on `port` with `storage` (YAML list items) and `broker`
/// (YAML keys under `broker:`).
fn config(port: u16, storage: &str, broker: &str) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:{port}\n\
         auth:\n  allow_anonymous: true\n\
         storage:\n{storage}\
         broker:\n{broker}"
    )
}

fn memory_provider(dir: &Path, extra: &str) -> String {
    format!(
        "  - name: mem\n    kind: memory\n    snapshot_dir: {}\n{extra}",
        dir.display()
    )
}

fn sqlite_provider(db: &Path) -> String {
    format!(
        "  - name: db\n    kind: sqlite\n    file_path: {}\n",
        db.display()
    )
}

const BOTH_ON_MEM: &str = "  retained_storage: mem\n  session_storage: mem\n";
const BOTH_ON_DB: &str = "  retained_storage: db\n  session_storage: db\n";

/// `saguin serve --config` on `yaml` (written into `dir`), run to its exit.
fn serve_once(dir: &Path, yaml: &str) -> Output {
    let path = dir.join("second.yaml");
    std::fs::write(&path, yaml).expect("write config");
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .timeout(WAIT)
        .output()
        .expect("run saguin serve")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn saguin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(args)
        .timeout(WAIT)
        .output()
        .expect("run saguin")
}

/// A start refused before any listener was bound: exit 3, the error names
/// `names`, nothing listened, and the configured port is still free.
fn assert_refused_before_listening(out: &Output, port: u16, names: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(3), "stderr: {err}");
    for name in names {
        assert!(err.contains(name), "{name:?} not named; stderr: {err}");
    }
    assert!(!err.contains("msg=\"listening\""), "stderr: {err}");
    TcpListener::bind(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("port {port} was left bound: {e}; stderr: {err}"));
}

fn assert_second_broker_refused(
    yaml_for_second: &str,
    lock: &Path,
    provider: &str,
    first: &Broker,
) {
    let work = tempfile::tempdir().expect("tempdir");
    let out = serve_once(work.path(), yaml_for_second);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "stderr: {err}");
    assert!(
        err.contains(&format!("storage provider {provider}")),
        "stderr: {err}"
    );
    assert!(
        err.contains(&lock.display().to_string()),
        "lock path not named; stderr: {err}"
    );
    assert!(
        err.contains(&format!("pid {}", first.child.id())),
        "holder pid not named; stderr: {err}"
    );
    assert!(!err.contains("msg=\"listening\""), "stderr: {err}");
}

#[test]
fn a_second_broker_on_a_memory_snapshot_dir_is_refused_naming_the_holder() {
    let data = tempfile::tempdir().expect("tempdir");
    let snap = data.path().join("snap");
    let storage = memory_provider(&snap, "");
    let mut first = Broker::start(&config(0, &storage, BOTH_ON_MEM));
    assert_second_broker_refused(
        &config(0, &storage, BOTH_ON_MEM),
        &snap.join("saguin.lock"),
        "mem",
        &first,
    );
    assert_eq!(first.terminate(), Some(0), "{}", first.log_text());
}

#[test]
fn a_second_broker_on_a_sqlite_database_is_refused_naming_the_holder() {
    let data = tempfile::tempdir().expect("tempdir");
    let db = data.path().join("saguin.db");
    let storage = sqlite_provider(&db);
    let mut first = Broker::start(&config(0, &storage, BOTH_ON_DB));
    assert_second_broker_refused(
        &config(0, &storage, "  session_storage: db\n"),
        &data.path().join("saguin.db.lock"),
        "db",
        &first,
    );
    assert_eq!(first.terminate(), Some(0), "{}", first.log_text());
    // Checkpointed at close (TRUNCATE): the main file is complete alone.
    let wal = data.path().join("saguin.db-wal");
    assert!(
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "the write-ahead log was not checkpointed"
    );
    // And the lock was let go: a new broker takes it.
    let mut again = Broker::start(&config(0, &storage, BOTH_ON_DB));
    assert_eq!(again.terminate(), Some(0), "{}", again.log_text());
}

/// A first start makes a sqlite provider's database directory (0700), as
/// it makes a snapshot directory: a unit's StateDirectory exists, a
/// directory under it named for the database does not. A path through a
/// file stops the start naming the directory, with no listener.
#[test]
fn a_first_start_makes_the_databases_directory_and_a_file_in_its_way_stops_it() {
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().expect("tempdir");
    let dir = data.path().join("state").join("db");
    let storage = sqlite_provider(&dir.join("saguin.db"));
    let mut broker = Broker::start(&config(0, &storage, BOTH_ON_DB));
    let mode = std::fs::metadata(&dir).expect("made").permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    assert!(dir.join("saguin.db").is_file());
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());

    let file = data.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("write");
    let port = free_port();
    let storage = sqlite_provider(&file.join("saguin.db"));
    let out = serve_once(data.path(), &config(port, &storage, BOTH_ON_DB));
    assert_refused_before_listening(
        &out,
        port,
        &[
            "storage provider db",
            "database's directory",
            &file.display().to_string(),
        ],
    );
}

/// A provider whose files are on tmpfs is served, and the start says that
/// a reboot or a power cut takes what it keeps.
#[test]
fn a_start_on_a_memory_backed_file_system_says_what_a_reboot_takes() {
    let Some(volatile) =
        memory_backed_dir("a_start_on_a_memory_backed_file_system_says_what_a_reboot_takes")
    else {
        return;
    };
    let snap = volatile.path().join("snap");
    // No room kept: a container's /dev/shm may be 64 MiB in all.
    let storage = memory_provider(&snap, "    snapshot_room: 0\n");
    let mut broker = Broker::start(&config(0, &storage, BOTH_ON_MEM));
    let line =
        broker.wait_log(|l| l.contains("level=WARN") && l.contains("storage[0].snapshot_dir"));
    assert!(
        line.contains("is on tmpfs") && line.contains("lost at a reboot or a power cut"),
        "{line}"
    );
    assert_eq!(broker.terminate(), Some(0), "{}", broker.log_text());
}

#[test]
fn a_damaged_or_truncated_snapshot_file_stops_the_start_naming_it_with_no_listener() {
    for damaged in [
        "truncated-at-record-2-397.snapshot",
        "bitflip-body.snapshot",
    ] {
        let data = tempfile::tempdir().expect("tempdir");
        let snap = data.path().join("snap");
        std::fs::create_dir(&snap).unwrap();
        let file = snap.join(RETAINED_FILE);
        std::fs::copy(fixtures().join("damaged/f21").join(damaged), &file).unwrap();
        let port = free_port();
        let out = serve_once(
            data.path(),
            &config(port, &memory_provider(&snap, ""), BOTH_ON_MEM),
        );
        assert_refused_before_listening(&out, port, &["mem", &file.display().to_string()]);
    }
}

#[test]
fn a_file_larger_than_the_provider_bound_allows_is_not_read() {
    // max_bytes 1 MiB: each file may be at most the 64 MiB floor, far below
    // the 4 GiB `snapshot verify` reads by default. A sparse file costs no disk.
    let data = tempfile::tempdir().expect("tempdir");
    let snap = data.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let file = snap.join(RETAINED_FILE);
    let limit: u64 = 64 * 1024 * 1024;
    std::fs::File::create(&file)
        .unwrap()
        .set_len(limit + 1)
        .unwrap();
    let port = free_port();
    let out = serve_once(
        data.path(),
        &config(
            port,
            &memory_provider(&snap, "    max_bytes: 1MiB\n"),
            BOTH_ON_MEM,
        ),
    );
    assert_refused_before_listening(
        &out,
        port,
        &[&file.display().to_string(), &format!("{limit}-byte limit")],
    );
}

#[test]
fn a_foreign_version_or_damaged_database_stops_the_start_naming_it_with_no_listener() {
    let foreign = std::fs::read(fixtures().join("sqlite/schema5.db")).unwrap();
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect();
    for (case, bytes, words) in [
        ("foreign version", foreign, "schema version 5"),
        ("damaged", garbage, "not a database"),
    ] {
        let data = tempfile::tempdir().expect("tempdir");
        let db = data.path().join("saguin.db");
        std::fs::write(&db, &bytes).unwrap();
        let port = free_port();
        let out = serve_once(
            data.path(),
            &config(port, &sqlite_provider(&db), BOTH_ON_DB),
        );
        assert_refused_before_listening(&out, port, &["db", &db.display().to_string(), words]);
        assert_eq!(
            std::fs::read(&db).unwrap(),
            bytes,
            "{case}: the refused database was changed"
        );
    }
}

/// A retained row whose QoS no value can have, as a damaged or foreign
/// writer could leave it: the restart that reads it stops naming the
/// database and what the row holds, before any listener is bound, and
/// leaves the file as it was.
#[test]
fn a_retained_row_that_cannot_be_a_value_stops_the_start_naming_it_with_no_listener() {
    let data = tempfile::tempdir().expect("tempdir");
    let db = data.path().join("saguin.db");
    let yaml = config(free_port(), &sqlite_provider(&db), BOTH_ON_DB);
    let mut first = Broker::start(&yaml);
    publish_retained_and_wait(first.addr(), "site/1/state");
    assert_eq!(first.terminate(), Some(0));
    let raw = rusqlite::Connection::open(&db).unwrap();
    raw.execute_batch("UPDATE latest_values SET qos = 7")
        .unwrap();
    drop(raw);
    let bytes = std::fs::read(&db).unwrap();

    let port = free_port();
    let out = serve_once(
        data.path(),
        &config(port, &sqlite_provider(&db), BOTH_ON_DB),
    );
    assert_refused_before_listening(
        &out,
        port,
        &["db", &db.display().to_string(), "qos 7 is not 0, 1 or 2"],
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        bytes,
        "the refused database was changed"
    );
}

/// What a snapshot directory holds, by `snapshot inspect --json`: per file
/// its role and the contents that identify what was kept.
fn holdings(dir: &Path) -> Vec<(String, Value)> {
    let out = saguin(&[
        "snapshot",
        "inspect",
        "--json",
        "--records",
        &dir.display().to_string(),
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    doc["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter(|f| f["role"] != "manifest" && f["status"] != "not-current")
        .map(|f| {
            let c = &f["contents"];
            let kept = match f["role"].as_str() {
                Some("retained") => Value::from(
                    c["records"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| {
                            serde_json::json!([
                                r["topic"],
                                r["payload_hex"],
                                r["qos"],
                                r["client_id"]
                            ])
                        })
                        .collect::<Vec<_>>(),
                ),
                Some("sessions") => Value::from(
                    c["sessions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s["client_id"].clone())
                        .collect::<Vec<_>>(),
                ),
                Some("broadcast") => serde_json::json!({
                    "floor": c["floor"], "next": c["next"], "records": c["record_count"],
                    "held": c["held"].as_array().map(Vec::len),
                }),
                other => panic!("unexpected file role {other:?} in {}", dir.display()),
            };
            // By what it holds: the name a generation gave it without the
            // generation's number.
            let name = f["name"].as_str().unwrap().to_owned();
            let name = saguin_format::channel_name::split_generation_file_name(&name)
                .map_or(name, |(base, _)| base);
            (name, kept)
        })
        .collect()
}

/// Publishes a retained message at QoS 1 and waits for its PUBACK: once it
/// returns, the provider holds the message.
fn publish_retained_and_wait(addr: std::net::SocketAddr, topic: &str) {
    use broker_support::{v5, ConnectOpts, Raw};
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut client = Raw::tcp(addr, v5()).await;
            client.connect("keeper", ConnectOpts::clean()).await;
            client.publish_acked(topic, b"kept", 1, true, 1).await;
        });
}

fn verify_accepts(dir: &Path) {
    let out = saguin(&["snapshot", "verify", &dir.display().to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "verify: {text}{}", stderr(&out));
    assert!(!text.contains("WARN"), "verify warned: {text}");
}

#[test]
fn a_graceful_stop_writes_the_snapshot_verify_accepts_and_a_restart_loads_it() {
    let data = tempfile::tempdir().expect("tempdir");
    let snap = data.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    // What a provider holds at its first start: the golden directory's
    // retained values, sessions and broadcast log (its manifest and channel
    // files are not this provider's).
    let golden = fixtures().join("f21/dir");
    for name in [RETAINED_FILE, "saguin.sessions", "saguin.broadcast"] {
        std::fs::copy(golden.join(name), snap.join(name)).unwrap();
    }
    let before = holdings(&snap);
    let yaml = config(0, &memory_provider(&snap, ""), BOTH_ON_MEM);

    let mut first = Broker::start(&yaml);
    assert_eq!(first.terminate(), Some(0), "{}", first.log_text());
    let log = first.log_text();
    // The stop commits the directory's first generation: the sessions
    // pair written again (the restore ended a session that expired while
    // the broker was down), the retained store, unchanged, listed under the
    // name it had.
    for file in ["saguin.1.broadcast", "saguin.1.sessions", "saguin.manifest"] {
        assert!(
            log.contains(&format!(
                "msg=\"snapshot file written\" provider=mem dir={} file={file}",
                snap.display()
            )),
            "{file} not logged; log: {log}"
        );
    }
    assert!(snap.join(RETAINED_FILE).is_file(), "log: {log}");
    assert!(
        !log.contains(&format!("file={RETAINED_FILE}")),
        "the retained store was written again; log: {log}"
    );
    assert!(log.contains("msg=\"storage closed\""), "log: {log}");
    verify_accepts(&snap);
    let written = holdings(&snap);
    // Everything the provider held went back into the directory: the
    // retained values exactly; sessions and the log as the load kept them
    // (a session expired while down is gone).
    let by_name = |h: &[(String, Value)], name: &str| {
        h.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} missing from {h:?}"))
    };
    assert_eq!(
        by_name(&written, RETAINED_FILE),
        by_name(&before, RETAINED_FILE)
    );
    assert!(!by_name(&written, RETAINED_FILE)
        .as_array()
        .unwrap()
        .is_empty());
    let kept = by_name(&written, "saguin.sessions");
    let had = by_name(&before, "saguin.sessions");
    assert!(
        kept.as_array()
            .unwrap()
            .iter()
            .all(|c| had.as_array().unwrap().contains(c)),
        "sessions {kept} not among {had}"
    );
    // The broker lets go of log messages no session it holds is owed; it
    // invents none.
    let logged = by_name(&written, "saguin.broadcast")["records"].as_u64();
    let was = by_name(&before, "saguin.broadcast")["records"].as_u64();
    assert!(
        logged <= was,
        "broadcast records {logged:?}, before {was:?}"
    );

    // The restart loads what was written, with nothing to warn about, and
    // writes it back unchanged.
    let mut second = Broker::start(&yaml);
    let log = second.log_text();
    assert!(
        log.contains("msg=\"snapshot loaded\" provider=mem"),
        "log: {log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("level=WARN") && l.contains("provider=mem")),
        "the restart warned: {log}"
    );
    assert_eq!(second.terminate(), Some(0), "{}", second.log_text());
    verify_accepts(&snap);
    assert_eq!(holdings(&snap), written);
}

#[test]
fn a_snapshot_that_cannot_be_written_is_named_and_the_exit_is_not_zero() {
    let data = tempfile::tempdir().expect("tempdir");
    let snap = data.path().join("snap");
    let mut broker = Broker::start(&config(0, &memory_provider(&snap, ""), BOTH_ON_MEM));
    // The directory goes away under the running broker and a plain file
    // takes its name: no generation can be written, and a retained message
    // published after makes sure the stop has one to write.
    std::fs::rename(&snap, data.path().join("moved")).unwrap();
    std::fs::write(&snap, b"not a directory").unwrap();
    publish_retained_and_wait(broker.addr(), "kept/after/the/move");
    assert_eq!(broker.terminate(), Some(3), "{}", broker.log_text());
    let log = broker.log_text();
    assert!(
        log.contains(&format!("snapshot {}", snap.display())) && log.contains("not a directory"),
        "the failure is not named: {log}"
    );
    assert!(log.contains("storage closed with failures"), "log: {log}");
}

#[test]
fn a_second_signal_during_a_long_stop_says_what_is_still_being_written() {
    let data = tempfile::tempdir().expect("tempdir");
    let snap = data.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    // The manifest is written last, to saguin.manifest.tmp; a FIFO there
    // holds the stop inside that write until this test reads it.
    let fifo = snap.join("saguin.manifest.tmp");
    // Written only at the stop, so no generation is written before it.
    let mut broker = Broker::start(&config(
        0,
        &memory_provider(
            &snap,
            "    snapshot_debounce: none\n    snapshot_max_delay: none\n",
        ),
        BOTH_ON_MEM,
    ));
    // Made once the broker started: a start removes a temporary file a
    // commit left behind.
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let pid = broker.child.id() as i32;
    let sigterm = || {
        // SAFETY: signalling the child this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    };
    sigterm();
    broker.wait_log(|l| l.contains("signal received"));
    // The first signal is taken; each further one is answered with a line
    // saying what the stop is writing. Answers are awaited one at a time
    // (two signals in flight together would be delivered as one) until
    // the stop is held in the manifest's write.
    let mut answered = 0;
    let said = loop {
        sigterm();
        answered += 1;
        let lines = broker.wait_log_count(|l| l.contains("still writing"), answered);
        let last = lines.last().expect("answered").clone();
        if last.contains("writing saguin.manifest") {
            break last;
        }
        assert!(
            answered < 1000,
            "the stop never reached the manifest: {last}"
        );
    };
    assert!(said.contains("storage provider mem"), "{said}");
    // Let the write through: the bytes go into the pipe, whose fsync fails,
    // so the manifest is a named failure, the generation does not commit
    // and the stop exits 3.
    let mut reader = std::fs::File::open(&fifo).unwrap();
    let mut sink = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut sink).unwrap();
    assert!(!sink.is_empty());
    assert_eq!(broker.terminate(), Some(3), "{}", broker.log_text());
    let log = broker.log_text();
    assert!(
        log.contains(&format!(
            "snapshot {}",
            snap.join("saguin.manifest").display()
        )),
        "{log}"
    );
    // Nothing lists the generation's files: they went with it.
    let left: Vec<String> = std::fs::read_dir(&snap)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".snapshot") || n.ends_with(".sessions"))
        .collect();
    assert!(left.is_empty(), "{left:?}: {log}");
}
