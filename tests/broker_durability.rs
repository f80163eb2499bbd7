//! What a provider promises survives a restart, through the wire: retained
//! messages, a persistent session with its subscriptions, QoS 1 and 2
//! messages queued for it offline and others in flight - same packet
//! identifiers, DUP on resend, a QoS 2 exchange past PUBREC owing its
//! PUBREL. A memory provider with a snapshot directory keeps them across
//! SIGTERM, and across kill -9 once a generation holds them; a sqlite
//! provider across kill -9.

mod broker_support;

use std::path::Path;

use broker_support::*;
use saguin::broker::codec::{Packet, PubAck, QoS};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn memory_config(dir: &Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         storage:\n  - name: mem\n    kind: memory\n    snapshot_dir: {}\n\
         broker:\n  retained_storage: mem\n  session_storage: mem\n",
        dir.join("snapshots").display()
    )
}

fn sqlite_config(dir: &Path) -> String {
    format!(
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: true\n\
         storage:\n  - name: db\n    kind: sqlite\n    file_path: {}\n\
         broker:\n  retained_storage: db\n  session_storage: db\n",
        dir.join("saguin.db").display()
    )
}

/// What the subscriber holds before the stop: packet ids of t/1 (QoS 1,
/// unacknowledged), t/2 (QoS 2, PUBREC sent, PUBCOMP owed) and t/3 (QoS 1,
/// unacknowledged); t/4 and t/5 wait behind the full window, t/6 was
/// published while it was away.
struct Before {
    t1: u16,
    t2: u16,
    t3: u16,
}

/// DISCONNECT, then wait for the broker to close the connection: by then
/// it has handled the disconnect and queued the session's write.
async fn leave(c: &mut Raw<tokio::net::TcpStream>) {
    c.send(Packet::Disconnect(saguin::broker::codec::Disconnect::new(
        saguin::broker::codec::ReasonCode::Success,
    )))
    .await;
    c.expect_close().await;
}

/// A new persistent session's CONNACK comes after its own write commits,
/// and a client's CONNACK waits on the writes queued before it that
/// clients wait on: every publish and every such session write is stored
/// once this returns. A departed client's write is one nobody waits on,
/// which a sqlite provider serves after those (the persister's turns), so
/// this is no fence for it: [`wait_in_db`] waits for that write itself.
async fn fence(broker: &Broker) {
    let mut f = Raw::tcp(broker.addr(), v5()).await;
    let id = format!("fence-{}", std::process::id());
    f.connect(&id, ConnectOpts::persistent(1)).await;
    leave(&mut f).await;
}

async fn prepare(broker: &Broker) -> Before {
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    p.connect("pub", ConnectOpts::clean()).await;
    p.publish_acked("r/1", b"one", 1, true, 1).await;
    p.publish_acked("r/2", b"two", 1, true, 2).await;

    let mut s = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::persistent(3600);
    opts.properties.receive_maximum = Some(3);
    let ack = s.connect("sub", opts).await;
    assert!(!ack.session_present);
    s.subscribe(1, "t/#", 2).await;

    p.publish_acked("t/1", b"1", 1, false, 3).await;
    p.publish_acked("t/2", b"2", 2, false, 4).await;
    p.publish_acked("t/3", b"3", 1, false, 5).await;
    let m1 = s.next_publish(false).await;
    let m2 = s.next_publish(false).await;
    let m3 = s.next_publish(false).await;
    assert_eq!((&*m1.topic, &*m2.topic, &*m3.topic), ("t/1", "t/2", "t/3"));
    assert_eq!(m2.qos, QoS::ExactlyOnce);
    s.send(Packet::PubRec(PubAck::new(m2.packet_id))).await;
    match s.recv().await {
        Some(Packet::PubRel(r)) => assert_eq!(r.packet_id, m2.packet_id),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    p.publish_acked("t/4", b"4", 1, false, 6).await;
    p.publish_acked("t/5", b"5", 2, false, 7).await;
    // The window is full: nothing more arrives (a ping answers first).
    s.send(Packet::PingReq).await;
    assert!(matches!(s.recv().await, Some(Packet::PingResp)));
    leave(&mut s).await;
    p.publish_acked("t/6", b"6", 1, false, 8).await;
    p.disconnect().await;
    fence(broker).await;
    Before {
        t1: m1.packet_id,
        t2: m2.packet_id,
        t3: m3.packet_id,
    }
}

async fn check(broker: &Broker, before: Before) {
    let mut s = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::persistent(3600);
    opts.properties.receive_maximum = Some(3);
    let ack = s.connect("sub", opts).await;
    assert!(ack.session_present, "the session came back");
    match s.recv().await {
        Some(Packet::Publish(p)) => {
            assert_eq!((&*p.topic, p.packet_id, p.dup), ("t/1", before.t1, true));
            assert_eq!(&p.payload[..], b"1");
            s.send(Packet::PubAck(PubAck::new(p.packet_id))).await;
        }
        other => panic!("expected t/1 again, got {other:?}"),
    }
    match s.recv().await {
        Some(Packet::PubRel(r)) => {
            assert_eq!(r.packet_id, before.t2, "the QoS 2 exchange owes its PUBREL");
            s.send(Packet::PubComp(PubAck::new(r.packet_id))).await;
        }
        other => panic!("expected PUBREL, got {other:?}"),
    }
    match s.recv().await {
        Some(Packet::Publish(p)) => {
            assert_eq!((&*p.topic, p.packet_id, p.dup), ("t/3", before.t3, true));
            s.send(Packet::PubAck(PubAck::new(p.packet_id))).await;
        }
        other => panic!("expected t/3 again, got {other:?}"),
    }
    let mut rest = Vec::new();
    while rest.len() < 3 {
        match s.recv().await {
            Some(Packet::Publish(p)) => {
                assert!(!p.dup);
                match p.qos {
                    QoS::ExactlyOnce => s.send(Packet::PubRec(PubAck::new(p.packet_id))).await,
                    _ => s.send(Packet::PubAck(PubAck::new(p.packet_id))).await,
                }
                rest.push((p.topic.to_string(), p.qos));
            }
            Some(Packet::PubRel(r)) => s.send(Packet::PubComp(PubAck::new(r.packet_id))).await,
            other => panic!("expected the queued messages, got {other:?}"),
        }
    }
    assert_eq!(
        rest,
        vec![
            ("t/4".to_owned(), QoS::AtLeastOnce),
            ("t/5".to_owned(), QoS::ExactlyOnce),
            ("t/6".to_owned(), QoS::AtLeastOnce)
        ]
    );
    s.send(Packet::PingReq).await;
    loop {
        match s.recv().await {
            Some(Packet::PubRel(r)) => s.send(Packet::PubComp(PubAck::new(r.packet_id))).await,
            Some(Packet::PingResp) => break,
            other => panic!("nothing more is owed, got {other:?}"),
        }
    }

    let mut r = Raw::tcp(broker.addr(), v5()).await;
    r.connect("reader", ConnectOpts::clean()).await;
    r.subscribe(1, "r/#", 1).await;
    let mut retained = [r.next_publish(true).await, r.next_publish(true).await];
    retained.sort_by(|a, b| a.topic.cmp(&b.topic));
    assert_eq!(&*retained[0].topic, "r/1");
    assert_eq!(&retained[0].payload[..], b"one");
    assert_eq!(&*retained[1].topic, "r/2");
    assert!(retained.iter().all(|m| m.retain));
}

#[test]
fn a_memory_provider_keeps_sessions_and_retained_messages_across_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_config(dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    let before = runtime().block_on(prepare(&broker));
    assert_eq!(broker.terminate(), Some(0));
    let broker = broker.restart(&yaml);
    runtime().block_on(check(&broker, before));
}

/// A memory provider whose generations are written in the background
/// keeps, across kill -9, what its last generation holds: once the
/// generation holds every change (`saguin_snapshot_unsaved_seconds` 0),
/// the sessions, what each is owed (the broadcast log's messages, written
/// into the file from the store's own records) and the retained messages
/// all come back, as across SIGTERM.
#[test]
fn a_memory_provider_keeps_what_its_last_generation_holds_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}metrics:\n  bind: 127.0.0.1:0\n",
        memory_config(dir.path())
    );
    let mut broker = Broker::start_in(dir, &yaml);
    let before = runtime().block_on(prepare(&broker));
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = metrics_text(&broker);
        let unsaved = text
            .lines()
            .find_map(|l| l.strip_prefix("saguin_snapshot_unsaved_seconds{provider=\"mem\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if unsaved == Some(0.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no generation came to hold every change: {text}"
        );
        std::thread::yield_now();
    }
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    let broker = broker.restart(&yaml);
    runtime().block_on(check(&broker, before));
}

/// In-flight rows of `client` in the database, read beside the broker.
fn inflight_rows(db: &Path, client: &str) -> i64 {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.query_row(
        "SELECT count(*) FROM session_inflight WHERE client_id = ?1",
        [client],
        |r| r.get(0),
    )
    .unwrap_or(0)
}

/// Waits until `settled` holds of the database `db`, looking again each
/// time a file of its directory is written (inotify), for at most 30 s: a
/// write nobody waits on has no answer to wait for (see [`fence`]), but its
/// commit writes the database's log.
fn wait_in_db(db: &Path, what: &str, settled: impl Fn(&Path) -> bool) {
    use std::os::unix::ffi::OsStrExt;
    let dir = std::ffi::CString::new(db.parent().expect("a directory").as_os_str().as_bytes())
        .expect("a path without NUL");
    // SAFETY: plain system calls on a descriptor this function owns and
    // closes; the path is NUL-terminated.
    let watch = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    assert!(
        watch >= 0,
        "inotify_init1: {}",
        std::io::Error::last_os_error()
    );
    let added = unsafe {
        libc::inotify_add_watch(
            watch,
            dir.as_ptr(),
            libc::IN_MODIFY | libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE,
        )
    };
    assert!(
        added >= 0,
        "inotify_add_watch: {}",
        std::io::Error::last_os_error()
    );
    // Watched before the first look: no write between a look and the wait
    // goes unseen.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !settled(db) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(
            !left.is_zero(),
            "{what} was not stored in {} within 30 s",
            db.display()
        );
        let mut ready = libc::pollfd {
            fd: watch,
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
        if unsafe { libc::poll(&mut ready, 1, timeout) } > 0 {
            // The events themselves say nothing more than "look again".
            let mut events = [0u8; 4096];
            while unsafe { libc::read(watch, events.as_mut_ptr().cast(), events.len()) } > 0 {}
        }
    }
    unsafe { libc::close(watch) };
}

/// Whether `client`'s session is recorded as gone away.
fn detached_in_db(db: &Path, client: &str) -> bool {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.query_row(
        "SELECT detached_at FROM sessions WHERE client_id = ?1",
        [client],
        |r| r.get::<_, i64>(0),
    )
    .is_ok_and(|at| at != 0)
}

#[test]
fn a_sqlite_provider_keeps_sessions_and_retained_messages_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path());
    let db = dir.path().join("saguin.db");
    let mut broker = Broker::start_in(dir, &yaml);
    // Every PUBACKed publish is stored when acknowledged; the subscriber's
    // in-flight table is written when it goes, and `prepare` ends with a
    // fence behind that write.
    let before = runtime().block_on(prepare(&broker));
    wait_in_db(&db, "sub's departure", |db| detached_in_db(db, "sub"));
    assert_eq!(inflight_rows(&db, "sub"), 3);
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    let broker = broker.restart(&yaml);
    runtime().block_on(check(&broker, before));
}

/// A persistent publisher's QoS 2 exchange, PUBREC received, survives the
/// restart: its PUBREL is answered as known (0x00, not 0x92) and the
/// message was routed once.
async fn qos2_publisher_before(broker: &Broker) {
    let mut sub = Raw::tcp(broker.addr(), v5()).await;
    sub.connect("watcher", ConnectOpts::persistent(3600)).await;
    sub.subscribe(1, "q2/#", 2).await;
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    p.connect("q2pub", ConnectOpts::persistent(3600)).await;
    p.publish("q2/once", b"x", 2, false, 42).await;
    match p.recv().await {
        Some(Packet::PubRec(r)) => assert_eq!(r.packet_id, 42),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    let m = sub.next_publish(true).await;
    assert_eq!(&*m.topic, "q2/once");
    leave(&mut p).await;
    leave(&mut sub).await;
    fence(broker).await;
}

async fn qos2_publisher_after(broker: &Broker) {
    let mut p = Raw::tcp(broker.addr(), v5()).await;
    let ack = p.connect("q2pub", ConnectOpts::persistent(3600)).await;
    assert!(ack.session_present);
    // The client resends its PUBLISH (DUP): a PUBREC, not a second routing.
    p.send(Packet::Publish(saguin::broker::codec::Publish {
        dup: true,
        qos: QoS::ExactlyOnce,
        retain: false,
        topic: "q2/once".into(),
        packet_id: 42,
        properties: Default::default(),
        payload: bytes::Bytes::from_static(b"x"),
    }))
    .await;
    match p.recv().await {
        Some(Packet::PubRec(r)) => assert_eq!(r.packet_id, 42),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    p.send(Packet::PubRel(PubAck::new(42))).await;
    match p.recv().await {
        Some(Packet::PubComp(c)) => {
            assert_eq!(c.packet_id, 42);
            assert_eq!(
                c.reason,
                saguin::broker::codec::ReasonCode::Success,
                "the hold came back"
            );
        }
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    let mut sub = Raw::tcp(broker.addr(), v5()).await;
    let ack = sub.connect("watcher", ConnectOpts::persistent(3600)).await;
    assert!(ack.session_present);
    // Delivered once before the restart: nothing owed now.
    sub.send(Packet::PingReq).await;
    assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
}

#[test]
fn a_qos2_hold_survives_sigterm_on_memory() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_config(dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    runtime().block_on(qos2_publisher_before(&broker));
    assert_eq!(broker.terminate(), Some(0));
    let broker = broker.restart(&yaml);
    runtime().block_on(qos2_publisher_after(&broker));
}

#[test]
fn a_qos2_hold_survives_kill_9_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = sqlite_config(dir.path());
    let db = dir.path().join("saguin.db");
    let mut broker = Broker::start_in(dir, &yaml);
    runtime().block_on(qos2_publisher_before(&broker));
    wait_in_db(&db, "watcher's departure", |db| {
        detached_in_db(db, "watcher")
    });
    broker.child.kill().unwrap();
    broker.child.wait().unwrap();
    let broker = broker.restart(&yaml);
    runtime().block_on(qos2_publisher_after(&broker));
}

/// A retained message on a topic starting with `$` (not `$SYS`, which is
/// the broker's) comes back too: `#` alone would not have reached it.
#[test]
fn a_dollar_topics_retained_message_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = memory_config(dir.path());
    let mut broker = Broker::start_in(dir, &yaml);
    runtime().block_on(async {
        let mut p = Raw::tcp(broker.addr(), v5()).await;
        p.connect("pub", ConnectOpts::clean()).await;
        p.publish_acked("$site/state", b"up", 1, true, 1).await;
    });
    assert_eq!(broker.terminate(), Some(0));
    let broker = broker.restart(&yaml);
    runtime().block_on(async {
        let mut r = Raw::tcp(broker.addr(), v5()).await;
        r.connect("reader", ConnectOpts::clean()).await;
        r.subscribe(1, "$site/#", 1).await;
        let m = r.next_publish(true).await;
        assert_eq!((&*m.topic, &m.payload[..]), ("$site/state", &b"up"[..]));
        assert!(m.retain);
    });
}

/// A broker on sqlite or on memory in a fresh directory, and its
/// configuration.
fn start_on(sqlite: bool) -> (Broker, String) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = if sqlite {
        sqlite_config(dir.path())
    } else {
        memory_config(dir.path())
    };
    (Broker::start_in(dir, &yaml), yaml)
}

/// `broker` stopped as each provider is tested against (kill -9 on
/// sqlite, SIGTERM on memory, whose snapshot is written at the stop) and
/// started again on its directory.
fn restart_after_stop(mut broker: Broker, yaml: &str, sqlite: bool) -> Broker {
    if sqlite {
        broker.child.kill().unwrap();
        broker.child.wait().unwrap();
    } else {
        assert_eq!(broker.terminate(), Some(0));
    }
    broker.restart(yaml)
}

/// Retained messages held two ways come back as they were published, live
/// and after a kill -9 on sqlite or SIGTERM on memory: one with MQTT 5
/// properties (kept whole) and plain ones at each QoS (held as their bytes,
/// or the memory store's records, and rebuilt when sent).
#[test]
fn retained_messages_with_and_without_properties_come_back_as_published() {
    use saguin::broker::codec::PublishProperties;

    async fn publish(broker: &Broker) {
        let mut p = Raw::tcp(broker.addr(), v5()).await;
        p.connect("pub", ConnectOpts::clean()).await;
        let properties = PublishProperties {
            user_properties: vec![("site".into(), "north".into())],
            content_type: Some("text/plain".into()),
            ..PublishProperties::default()
        };
        p.publish_props("kept/a", b"with", 1, true, 1, properties)
            .await;
        match p.recv().await {
            Some(Packet::PubAck(a)) => assert_eq!(a.packet_id, 1),
            other => panic!("expected PUBACK, got {other:?}"),
        }
        p.publish_acked("kept/b/deep", b"plain two", 2, true, 2)
            .await;
        p.publish_acked("kept/c", b"plain one", 1, true, 3).await;
        p.publish_acked("kept/gone", b"x", 1, true, 4).await;
        p.publish_acked("kept/gone", b"", 1, true, 5).await;
        leave(&mut p).await;
    }

    async fn check(broker: &Broker) {
        let mut r = Raw::tcp(broker.addr(), v5()).await;
        r.connect("reader", ConnectOpts::clean()).await;
        r.subscribe(1, "kept/#", 2).await;
        let mut got = Vec::new();
        // Not acknowledged: several QoS 2 exchanges would interleave, and a
        // clean session owes nothing once it leaves.
        for _ in 0..3 {
            got.push(r.next_publish(false).await);
        }
        got.sort_by(|a, b| a.topic.cmp(&b.topic));
        let seen: Vec<(&str, &[u8], QoS, bool)> = got
            .iter()
            .map(|m| (&*m.topic, &m.payload[..], m.qos, m.retain))
            .collect();
        assert_eq!(
            seen,
            [
                ("kept/a", &b"with"[..], QoS::AtLeastOnce, true),
                ("kept/b/deep", &b"plain two"[..], QoS::ExactlyOnce, true),
                ("kept/c", &b"plain one"[..], QoS::AtLeastOnce, true),
            ]
        );
        assert_eq!(
            got[0].properties.user_properties,
            [("site".to_owned(), "north".to_owned())]
        );
        assert_eq!(
            got[0].properties.content_type.as_deref(),
            Some("text/plain")
        );
        for plain in &got[1..] {
            assert!(plain.properties.user_properties.is_empty());
            assert_eq!(plain.properties.content_type, None);
        }
        // The deleted topic's message is not among what came before a
        // ping's answer: every retained message went out at the SUBACK.
        let after = r.round_trip().await;
        assert!(
            !after.iter().any(|p| matches!(p, Packet::Publish(_))),
            "{after:?}"
        );
        leave(&mut r).await;
    }

    // On memory the plain ones are held as the store's own records, live
    // and after the restart; on sqlite as the index's own bytes.
    for sqlite in [true, false] {
        let (broker, yaml) = start_on(sqlite);
        runtime().block_on(async {
            publish(&broker).await;
            check(&broker).await;
        });
        let broker = restart_after_stop(broker, &yaml, sqlite);
        runtime().block_on(check(&broker));
    }
}

/// More retained messages than a restart hands over in one batch come
/// back each once: after SIGTERM on memory and kill -9 on sqlite.
#[test]
fn retained_messages_beyond_one_batch_come_back_each_once() {
    const COUNT: u16 = 3_000;
    for sqlite in [false, true] {
        let (broker, yaml) = start_on(sqlite);
        runtime().block_on(async {
            let mut p = Raw::tcp(broker.addr(), v5()).await;
            p.connect("pub", ConnectOpts::clean()).await;
            for i in 0..COUNT {
                p.publish_acked(&format!("fleet/{i}/state"), b"up", 1, true, i + 1)
                    .await;
            }
            leave(&mut p).await;
        });
        let broker = restart_after_stop(broker, &yaml, sqlite);
        runtime().block_on(async {
            let mut r = Raw::tcp(broker.addr(), v5()).await;
            r.connect("reader", ConnectOpts::clean()).await;
            r.subscribe(1, "fleet/#", 0).await;
            let mut topics = std::collections::BTreeSet::new();
            for _ in 0..COUNT {
                let m = r.next_publish(false).await;
                assert!(m.retain, "{}", m.topic);
                assert!(topics.insert(m.topic.to_string()), "twice: {}", m.topic);
            }
            let expected: std::collections::BTreeSet<String> =
                (0..COUNT).map(|i| format!("fleet/{i}/state")).collect();
            assert_eq!(topics, expected, "sqlite: {sqlite}");
        });
    }
}

/// `limits.max_queued_bytes` bounds what an offline session is kept, live
/// (the messages beyond are dropped and counted) and when a restart owes it
/// the log again: four of eight 254-byte messages (topic and payload) fit
/// 1 KiB, on sqlite after kill -9 and on memory after SIGTERM.
#[test]
fn a_sessions_byte_bound_holds_live_and_across_a_restart() {
    const PAYLOAD: usize = 250;
    for sqlite in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let base = if sqlite {
            sqlite_config(dir.path())
        } else {
            memory_config(dir.path())
        };
        let yaml =
            format!("{base}limits:\n  max_queued_bytes: 1KiB\nmetrics:\n  bind: 127.0.0.1:0\n");
        let broker = Broker::start_in(dir, &yaml);
        runtime().block_on(async {
            let mut s = Raw::tcp(broker.addr(), v5()).await;
            s.connect("slow", ConnectOpts::persistent(600)).await;
            s.subscribe(1, "qb/#", 1).await;
            leave(&mut s).await;
            let mut p = Raw::tcp(broker.addr(), v5()).await;
            p.connect("pub", ConnectOpts::clean()).await;
            for i in 0..8u8 {
                p.publish_acked("qb/t", &[i; PAYLOAD], 1, false, u16::from(i) + 1)
                    .await;
            }
            leave(&mut p).await;
            fence(&broker).await;
        });
        let dropped = metric_sample(
            &metrics_text(&broker),
            "saguin_dropped_messages_total{reason=\"queue_full\"}",
        );
        assert_eq!(dropped, Some(4), "sqlite {sqlite}: the four beyond 1 KiB");
        let broker = restart_after_stop(broker, &yaml, sqlite);
        runtime().block_on(async {
            let mut s = Raw::tcp(broker.addr(), v5()).await;
            let ack = s.connect("slow", ConnectOpts::persistent(600)).await;
            assert!(ack.session_present);
            let mut firsts = Vec::new();
            for _ in 0..4 {
                let m = s.next_publish(true).await;
                assert_eq!(m.payload.len(), PAYLOAD);
                firsts.push(m.payload[0]);
            }
            assert_eq!(
                firsts,
                [0, 1, 2, 3],
                "sqlite {sqlite}: the oldest, in order"
            );
            // Nothing more was kept: the next message is one sent now.
            let mut p = Raw::tcp(broker.addr(), v5()).await;
            p.connect("pub", ConnectOpts::clean()).await;
            p.publish_acked("qb/now", b"now", 1, false, 1).await;
            let m = s.next_publish(true).await;
            assert_eq!(
                (&*m.topic, m.payload.len()),
                ("qb/now", 3),
                "sqlite {sqlite}"
            );
        });
    }
}
