//! MQTT 5 features through the real broker, one behaviour per test:
//! outbound topic aliases, Server Keep Alive, a close that delivers its
//! reason code to a client still writing, refusals the client and the log
//! both see, and Request/Response Information.

mod broker_support;

use broker_support::*;
use bytes::Bytes;
use saguin::broker::codec::{
    self, ByteStr, Packet, ProtocolVersion, Publish, PublishProperties, QoS, ReasonCode,
};
use tokio::net::TcpStream;

type Client = Raw<TcpStream>;

async fn subscriber(broker: &Broker, id: &str, alias_maximum: Option<u16>) -> Client {
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.properties.topic_alias_maximum = alias_maximum;
    let ack = c.connect(id, opts).await;
    assert_eq!(ack.reason, ReasonCode::Success, "{ack:?}");
    assert_eq!(c.subscribe(1, "a/#", 0).await, vec![ReasonCode::Success]);
    c
}

async fn publisher(broker: &Broker) -> Client {
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect("pub", ConnectOpts::clean()).await;
    assert_eq!(ack.reason, ReasonCode::Success, "{ack:?}");
    c
}

/// Publish QoS 1 (acknowledged) so the message has been routed before the
/// next step.
async fn send(p: &mut Client, topic: &str, id: u16) {
    p.publish_acked(topic, topic.as_bytes(), 1, false, id).await;
}

/// (topic as sent, alias as sent, payload) of the next PUBLISH.
async fn next(c: &mut Client) -> (String, Option<u16>, Bytes) {
    let p = c.next_publish(true).await;
    (p.topic.to_string(), p.properties.topic_alias, p.payload)
}

// ------------------------------------------------------------ topic aliases

/// MQTT 5 3.3.2.3.4: a topic is sent once with its alias, then as the alias
/// alone; with every alias taken the least recently sent topic's is given
/// to the new topic; no alias is above the client's Topic Alias Maximum.
#[tokio::test]
async fn aliases_are_assigned_and_reused_within_the_clients_maximum() {
    let broker = Broker::anonymous();
    let mut s = subscriber(&broker, "sub", Some(2)).await;
    let mut p = publisher(&broker).await;
    let steps: [(&str, &str, Option<u16>); 6] = [
        ("a/1", "a/1", Some(1)),
        ("a/2", "a/2", Some(2)),
        ("a/1", "", Some(1)),
        // a/2 is now the least recently sent: a/3 takes its alias.
        ("a/3", "a/3", Some(2)),
        ("a/1", "", Some(1)),
        ("a/2", "a/2", Some(2)),
    ];
    for (i, (topic, sent_topic, alias)) in steps.into_iter().enumerate() {
        send(&mut p, topic, i as u16 + 1).await;
        let (got_topic, got_alias, payload) = next(&mut s).await;
        assert_eq!(payload, topic.as_bytes(), "step {i}");
        assert_eq!(got_topic, sent_topic, "step {i}: topic");
        assert_eq!(got_alias, alias, "step {i}: alias");
        assert!(got_alias.is_some_and(|a| (1..=2).contains(&a)));
    }
}

/// MQTT 5 3.3.2.3.4: the mapping does not carry over to a new connection,
/// even of the same session.
#[tokio::test]
async fn aliases_start_afresh_on_a_new_connection() {
    let broker = Broker::anonymous();
    let mut p = publisher(&broker).await;
    for round in 0..2u16 {
        let mut s = subscriber(&broker, "sub", Some(4)).await;
        send(&mut p, "a/x", round * 2 + 1).await;
        assert_eq!(
            next(&mut s).await.0,
            "a/x",
            "round {round}: full topic first"
        );
        send(&mut p, "a/x", round * 2 + 2).await;
        assert_eq!(next(&mut s).await.0, "", "round {round}: alias alone after");
        s.disconnect().await;
    }
}

/// A client announcing no Topic Alias Maximum gets full topics only.
#[tokio::test]
async fn no_aliases_for_a_client_without_a_topic_alias_maximum() {
    let broker = Broker::anonymous();
    let mut s = subscriber(&broker, "sub", None).await;
    let mut p = publisher(&broker).await;
    for id in 1..=3 {
        send(&mut p, "a/same", id).await;
        assert_eq!(next(&mut s).await, ("a/same".into(), None, "a/same".into()));
    }
}

/// `broker.topic_aliases: false` turns outbound aliases off.
#[tokio::test]
async fn aliases_can_be_turned_off() {
    let broker = Broker::plain("auth:\n  allow_anonymous: true\nbroker:\n  topic_aliases: false\n");
    let mut s = subscriber(&broker, "sub", Some(8)).await;
    let mut p = publisher(&broker).await;
    for id in 1..=3 {
        send(&mut p, "a/same", id).await;
        assert_eq!(next(&mut s).await.1, None);
    }
}

/// What aliases save on a fan-out of long topics: the bytes a subscriber
/// receives for the same messages with aliases on and off.
#[tokio::test]
async fn aliases_save_bytes_on_a_fan_out_with_long_topics() {
    async fn received_bytes(broker: &Broker) -> usize {
        let mut subs = Vec::new();
        for i in 0..4 {
            subs.push(subscriber(broker, &format!("sub{i}"), Some(16)).await);
        }
        let mut p = publisher(broker).await;
        let topics: Vec<String> = (0..8)
            .map(|t| {
                format!(
                    "a/site-0042/building-north/floor-07/room-{t:03}/sensor/temperature/celsius"
                )
            })
            .collect();
        let mut total = 0;
        let mut id = 0u16;
        for round in 0..50 {
            for topic in &topics {
                id += 1;
                p.publish_props(
                    topic,
                    format!("{round}").as_bytes(),
                    0,
                    false,
                    id,
                    PublishProperties::default(),
                )
                .await;
            }
        }
        for s in &mut subs {
            for _ in 0..topics.len() * 50 {
                let publish = s.next_publish(false).await;
                total += wire_bytes(&Packet::Publish(publish), v5()).len();
            }
        }
        total
    }
    let on = received_bytes(&Broker::anonymous()).await;
    let off = received_bytes(&Broker::plain(
        "auth:\n  allow_anonymous: true\nbroker:\n  topic_aliases: false\n",
    ))
    .await;
    eprintln!(
        "fan-out of 400 messages on 8 topics of 74 bytes to 4 subscribers: {off} bytes without aliases, {on} with ({:.1}% saved)",
        100.0 * (off - on) as f64 / off as f64
    );
    assert!(on * 2 < off, "aliases on: {on} bytes, off: {off} bytes");
}

// ---------------------------------------------------------- Server Keep Alive

fn capped(seconds: u16) -> Broker {
    Broker::plain(&format!(
        "auth:\n  allow_anonymous: true\nlimits:\n  max_keep_alive: {seconds}\n"
    ))
}

async fn connack_for(broker: &Broker, version: ProtocolVersion, keep_alive: u16) -> codec::ConnAck {
    let mut c = Raw::tcp(broker.addr(), version).await;
    let mut opts = ConnectOpts::clean();
    opts.keep_alive = keep_alive;
    c.connect(&format!("ka-{keep_alive}"), opts).await
}

/// MQTT 5 3.2.2.3.14: more than the cap, or 0, is answered with the cap as
/// Server Keep Alive; within it, nothing is said.
#[tokio::test]
async fn server_keep_alive_is_given_when_the_client_asks_for_more_or_none() {
    let broker = capped(30);
    for (asked, told) in [(60, Some(30)), (0, Some(30)), (30, None), (5, None)] {
        let ack = connack_for(&broker, v5(), asked).await;
        assert_eq!(ack.reason, ReasonCode::Success);
        assert_eq!(ack.properties.server_keep_alive, told, "asked {asked}");
    }
    let uncapped = Broker::anonymous();
    let ack = connack_for(&uncapped, v5(), 0).await;
    assert_eq!(ack.properties.server_keep_alive, None, "0: no cap");
}

/// The client is held to the Server Keep Alive: silent past one and a half
/// times it, it is disconnected with 0x8D although it asked for an hour.
#[tokio::test]
async fn server_keep_alive_is_enforced() {
    let broker = capped(1);
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.keep_alive = 3600;
    let ack = c.connect("sleepy", opts).await;
    assert_eq!(ack.properties.server_keep_alive, Some(1));
    match c.expect_close().await.last() {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::KeepAliveTimeout),
        other => panic!("expected DISCONNECT 0x8D, got {other:?}"),
    }
}

/// MQTT 3.1.1 cannot be told another keep alive: asking for more than the
/// cap is refused with return code 2, and the log says why.
#[tokio::test]
async fn a_311_client_over_the_keep_alive_cap_is_refused() {
    let broker = capped(30);
    let ack = connack_for(&broker, v4(), 60).await;
    assert_eq!(ack.reason, ReasonCode::ClientIdentifierNotValid);
    let line = broker.wait_log(|l| l.contains("connection refused") && l.contains("ka-60"));
    assert!(line.contains("max_keep_alive"), "{line}");
    let ack = connack_for(&broker, v4(), 10).await;
    assert_eq!(ack.reason, ReasonCode::Success);
}

// --------------------------------------------- a close that delivers its reason

const RUNS: usize = 100;

/// QoS 2 PUBLISHes with fresh packet ids, never released.
fn qos2_flood() -> impl FnMut() -> Vec<u8> + Send + 'static {
    let mut id = 0u16;
    move || {
        let mut bytes = Vec::new();
        for _ in 0..16 {
            id = id.wrapping_add(1).max(1);
            bytes.extend(wire_bytes(
                &Packet::Publish(Publish {
                    dup: false,
                    qos: QoS::ExactlyOnce,
                    retain: false,
                    topic: ByteStr::from("flood"),
                    packet_id: id,
                    properties: PublishProperties::default(),
                    payload: Bytes::from_static(b"x"),
                }),
                v5(),
            ));
        }
        bytes
    }
}

/// PINGREQs, as fast as the socket takes them.
fn pings() -> impl FnMut() -> Vec<u8> + Send + 'static {
    || wire_bytes(&Packet::PingReq, v5()).repeat(64)
}

async fn connected(broker: &Broker, id: &str, opts: ConnectOpts) -> TcpStream {
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let ack = c.connect(id, opts).await;
    assert_eq!(ack.reason, ReasonCode::Success, "{ack:?}");
    c.stream
}

/// A client flooding unreleased QoS 2 past the Receive Maximum reads
/// DISCONNECT 0x93 although it never stops writing.
#[tokio::test]
async fn a_client_still_writing_reads_receive_maximum_exceeded() {
    let broker = Broker::anonymous();
    for run in 0..RUNS {
        let stream = connected(&broker, &format!("flood-{run}"), ConnectOpts::clean()).await;
        let goodbye = read_goodbye_while_writing(stream, v5(), qos2_flood()).await;
        assert_eq!(
            goodbye.map(|d| d.reason),
            Some(ReasonCode::ReceiveMaximumExceeded),
            "run {run}"
        );
    }
}

/// A client still writing when another connection takes its client id
/// over reads DISCONNECT 0x8E.
#[tokio::test]
async fn a_client_still_writing_reads_session_taken_over() {
    let broker = Broker::anonymous();
    for run in 0..RUNS {
        let id = format!("taken-{run}");
        let stream = connected(&broker, &id, ConnectOpts::clean()).await;
        let mut new = Raw::tcp(broker.addr(), v5()).await;
        let ack = new.connect(&id, ConnectOpts::clean()).await;
        assert_eq!(ack.reason, ReasonCode::Success);
        // The old client only now starts writing, and reads only after
        // 256 KiB more: its DISCONNECT waits in its socket meanwhile.
        let goodbye =
            read_goodbye_while_writing_lagging(stream, v5(), pings(), None, 256 * 1024).await;
        assert_eq!(
            goodbye.map(|d| d.reason),
            Some(ReasonCode::SessionTakenOver),
            "run {run}: {}",
            broker.log_text()
        );
    }
}

/// Clients still writing when the server shuts down all read DISCONNECT
/// 0x8B: one shutdown, a hundred clients.
#[tokio::test]
async fn clients_still_writing_read_server_shutting_down() {
    let mut broker = Broker::anonymous();
    let (start, start_rx) = tokio::sync::watch::channel(false);
    let (writing, mut writing_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::new();
    for run in 0..RUNS {
        let stream = connected(&broker, &format!("busy-{run}"), ConnectOpts::clean()).await;
        readers.push(tokio::spawn(read_goodbye_while_writing_after(
            stream,
            v5(),
            pings(),
            Some(WriteGate {
                start: start_rx.clone(),
                writing: writing.clone(),
            }),
        )));
    }
    // Every client busy writing, then the shutdown.
    start.send(true).expect("gate");
    for _ in 0..RUNS {
        tokio::time::timeout(WAIT, writing_rx.recv())
            .await
            .expect("every client writes")
            .expect("writers alive");
    }
    let terminated = tokio::task::spawn_blocking(move || {
        let code = broker.terminate();
        (code, broker)
    });
    let (code, broker) = terminated.await.expect("terminate");
    assert_eq!(code, Some(0));
    let log = broker.log_text();
    for (run, reader) in readers.into_iter().enumerate() {
        let goodbye = reader.await.expect("reader");
        assert_eq!(
            goodbye.map(|d| d.reason),
            Some(ReasonCode::ServerShuttingDown),
            "client {run}: {}",
            log.lines()
                .filter(|l| !l.contains("busy-"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

// ------------------------------------------------------------------ refusals

/// Over `limits.max_connections` a CONNECT is answered, not left in the
/// listen queue: CONNACK 0x97 (3.1.1: return code 3), then the close; the
/// log names the client. A freed slot is taken by the next newcomer.
#[tokio::test]
async fn over_max_connections_is_answered_0x97_and_closed() {
    let broker = Broker::plain("auth:\n  allow_anonymous: true\nlimits:\n  max_connections: 1\n");
    let mut first = Raw::tcp(broker.addr(), v5()).await;
    assert_eq!(
        first.connect("first", ConnectOpts::clean()).await.reason,
        ReasonCode::Success
    );
    for (version, expected) in [
        (v5(), ReasonCode::QuotaExceeded),
        (v4(), ReasonCode::ServerUnavailable),
    ] {
        let mut extra = Raw::tcp(broker.addr(), version).await;
        let ack = extra.connect("extra", ConnectOpts::clean()).await;
        assert_eq!(ack.reason, expected, "{version:?}");
        assert!(extra.expect_close().await.is_empty());
    }
    let line = broker.wait_log(|l| l.contains("limits.max_connections reached"));
    assert!(line.contains("client_id=extra"), "{line}");
    assert!(line.contains("0x97"), "{line}");
    // The slot frees when the first connection has ended: each try until
    // then is answered 0x97 at once; none waits in the listen queue.
    first.disconnect().await;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let mut again = Raw::tcp(broker.addr(), v5()).await;
        let ack = again.connect("again", ConnectOpts::clean()).await;
        if ack.reason == ReasonCode::Success {
            break;
        }
        assert_eq!(ack.reason, ReasonCode::QuotaExceeded);
        assert!(std::time::Instant::now() < deadline, "the slot never freed");
    }
}

/// A refused CONNECT is logged with the client id, the principal and the
/// reason code: bad credentials and a takeover by another principal.
#[tokio::test]
async fn refused_connects_are_logged_with_client_principal_and_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lines = [
        format!(
            "alice:{}",
            saguin::broker::auth::hash_password(b"alice-pw", 101).unwrap()
        ),
        format!(
            "bob:{}",
            saguin::broker::auth::hash_password(b"bob-pw", 101).unwrap()
        ),
    ]
    .join("\n");
    write_file(dir.path(), "passwords", lines.as_bytes());
    let broker = Broker::start_in(
        dir,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: false\n  password_file: passwords\n",
    );
    let login = |user: &str, password: &str| {
        let mut o = ConnectOpts::clean();
        o.username = Some(user.into());
        o.password = Some(password.into());
        o
    };
    let mut wrong = Raw::tcp(broker.addr(), v5()).await;
    let ack = wrong.connect("dev-1", login("alice", "not-it")).await;
    assert_eq!(ack.reason, ReasonCode::BadUserNameOrPassword);
    let line = broker.wait_log(|l| l.contains("connection refused") && l.contains("dev-1"));
    assert!(line.contains("principal=alice"), "{line}");
    assert!(line.contains("0x86"), "{line}");
    assert!(
        !broker.log_text().contains("not-it"),
        "no password in the log"
    );

    let mut owner = Raw::tcp(broker.addr(), v5()).await;
    let ack = owner
        .connect("dev-2", {
            let mut o = login("alice", "alice-pw");
            o.properties.session_expiry_interval = Some(300);
            o.clean_start = false;
            o
        })
        .await;
    assert_eq!(ack.reason, ReasonCode::Success);
    let mut thief = Raw::tcp(broker.addr(), v5()).await;
    let ack = thief.connect("dev-2", login("bob", "bob-pw")).await;
    assert_eq!(ack.reason, ReasonCode::NotAuthorized);
    let line = broker.wait_log(|l| l.contains("connection refused") && l.contains("dev-2"));
    assert!(line.contains("principal=bob"), "{line}");
    assert!(line.contains("0x87"), "{line}");
}

// ------------------------------------------------- Request/Response Information

/// MQTT 5 3.1.2.11.7 / 3.2.2.3.15: asked for, CONNACK carries Response
/// Information (`response/<client id>/`); not asked for, it does not.
#[tokio::test]
async fn response_information_is_given_when_asked_for() {
    let broker = Broker::anonymous();
    let mut asking = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.properties.request_response_information = Some(true);
    let ack = asking.connect("asker", opts).await;
    assert_eq!(
        ack.properties.response_information.as_deref(),
        Some("response/asker/")
    );
    let mut quiet = Raw::tcp(broker.addr(), v5()).await;
    let ack = quiet.connect("quiet", ConnectOpts::clean()).await;
    assert_eq!(ack.properties.response_information, None);
}

// --------------------------------------------- enhanced authentication (SCRAM)

/// RFC 5802's client, computed here from the password.
mod scram_client {
    use base64::Engine as _;
    use pbkdf2::hmac::{Hmac, Mac};
    use sha2::{Digest, Sha512};

    fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
        let mut mac = Hmac::<Sha512>::new_from_slice(key).unwrap();
        mac.update(data);
        mac.finalize().into_bytes().to_vec()
    }

    /// client-final for `server_first`, and the server-final expected.
    pub fn last(password: &str, client_first_bare: &str, server_first: &str) -> (String, String) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let (mut nonce, mut salt, mut iterations) = ("", Vec::new(), 0);
        for field in server_first.split(',') {
            match field.split_at(2) {
                ("r=", v) => nonce = v,
                ("s=", v) => salt = b64.decode(v).unwrap(),
                ("i=", v) => iterations = v.parse().unwrap(),
                _ => {}
            }
        }
        let mut salted = [0u8; 64];
        pbkdf2::pbkdf2_hmac::<Sha512>(password.as_bytes(), &salt, iterations, &mut salted);
        let without_proof = format!("c={},r={nonce}", b64.encode("n,,"));
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_key = hmac(&salted, b"Client Key");
        let signature = hmac(&Sha512::digest(&client_key), auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = hmac(&salted, b"Server Key");
        let expected = format!(
            "v={}",
            b64.encode(hmac(&server_key, auth_message.as_bytes()))
        );
        (format!("{without_proof},p={}", b64.encode(proof)), expected)
    }
}

fn password_broker() -> Broker {
    let dir = tempfile::tempdir().expect("temp dir");
    let line = format!(
        "alice:{}\n",
        saguin::broker::auth::hash_password(b"wonder land", 101).unwrap()
    );
    write_file(dir.path(), "passwords", line.as_bytes());
    Broker::start_in(
        dir,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: false\n  password_file: passwords\nlog:\n  level: debug\n",
    )
}

/// Run SCRAM-SHA-512 as `alice` with `password`: the CONNACK, and the
/// server-final message a right password must produce.
async fn scram_connect(
    broker: &Broker,
    client_id: &str,
    password: &str,
) -> (codec::ConnAck, String) {
    let (_, ack, expected) = scram_connected(broker, client_id, password).await;
    (ack, expected)
}

const CLIENT_FIRST_BARE: &str = "n=alice,r=fyko+d2lbbFgONRv9qkxdawL";

async fn scram_connected(
    broker: &Broker,
    client_id: &str,
    password: &str,
) -> (Client, codec::ConnAck, String) {
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let bare = CLIENT_FIRST_BARE;
    let mut opts = ConnectOpts::clean();
    opts.properties.authentication_method = Some("SCRAM-SHA-512".into());
    opts.properties.authentication_data = Some(Bytes::from(format!("n,,{bare}")));
    c.send_connect(client_id, opts).await;
    let server_first = match c.recv().await {
        Some(Packet::Auth(auth)) => {
            assert_eq!(auth.reason, ReasonCode::ContinueAuthentication);
            assert_eq!(
                auth.properties.authentication_method.as_deref(),
                Some("SCRAM-SHA-512")
            );
            String::from_utf8(auth.properties.authentication_data.unwrap().to_vec()).unwrap()
        }
        other => panic!("expected AUTH, got {other:?}"),
    };
    let (last, expected) = scram_client::last(password, bare, &server_first);
    c.send(Packet::Auth(codec::Auth {
        reason: ReasonCode::ContinueAuthentication,
        properties: codec::AuthProperties {
            authentication_method: Some("SCRAM-SHA-512".into()),
            authentication_data: Some(Bytes::from(last)),
            ..Default::default()
        },
    }))
    .await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => (c, ack, expected),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

fn auth(reason: ReasonCode, data: String) -> Packet {
    Packet::Auth(codec::Auth {
        reason,
        properties: codec::AuthProperties {
            authentication_method: Some("SCRAM-SHA-512".into()),
            authentication_data: Some(Bytes::from(data)),
            ..Default::default()
        },
    })
}

/// Re-authenticate on `c` (MQTT 5 4.12.1): AUTH 0x19, the challenge, the
/// proof; returns what the broker answers it with, and the server-final
/// message a right password produces.
async fn reauthenticate(c: &mut Client, password: &str) -> (Option<Packet>, String) {
    c.send(auth(
        ReasonCode::ReAuthenticate,
        format!("n,,{CLIENT_FIRST_BARE}"),
    ))
    .await;
    let server_first = match c.recv().await {
        Some(Packet::Auth(a)) if a.reason == ReasonCode::ContinueAuthentication => {
            String::from_utf8(a.properties.authentication_data.unwrap().to_vec()).unwrap()
        }
        other => panic!("expected AUTH 0x18, got {other:?}"),
    };
    let (last, expected) = scram_client::last(password, CLIENT_FIRST_BARE, &server_first);
    c.send(auth(ReasonCode::ContinueAuthentication, last)).await;
    (c.recv().await, expected)
}

/// MQTT 5 4.12.1: a SCRAM client re-authenticates on its live connection
/// (AUTH 0x00 with the server signature, the connection still serving); a
/// wrong password on re-authentication is DISCONNECT 0x87 (0x86 is not a
/// DISCONNECT reason).
#[tokio::test]
async fn a_scram_client_re_authenticates_on_its_connection() {
    let broker = password_broker();
    let (mut c, ack, _) = scram_connected(&broker, "reauth", "wonder land").await;
    assert_eq!(ack.reason, ReasonCode::Success);
    for _ in 0..2 {
        let (answer, expected) = reauthenticate(&mut c, "wonder land").await;
        match answer {
            Some(Packet::Auth(a)) => {
                assert_eq!(a.reason, ReasonCode::Success);
                assert_eq!(
                    a.properties.authentication_data.as_deref(),
                    Some(expected.as_bytes())
                );
            }
            other => panic!("expected AUTH 0x00, got {other:?}"),
        }
        c.send(Packet::PingReq).await;
        assert_eq!(c.recv().await, Some(Packet::PingResp), "still serving");
    }
    let (answer, _) = reauthenticate(&mut c, "wrong").await;
    match answer {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::NotAuthorized),
        other => panic!("expected DISCONNECT 0x87, got {other:?}"),
    }
    assert!(!broker.log_text().contains("wonder land"));
}

/// AUTH on a connection whose CONNECT named no Authentication Method is a
/// protocol error: DISCONNECT 0x82.
#[tokio::test]
async fn auth_without_enhanced_authentication_is_a_protocol_error() {
    let broker = Broker::anonymous();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    assert_eq!(
        c.connect("plain", ConnectOpts::clean()).await.reason,
        ReasonCode::Success
    );
    c.send(auth(ReasonCode::ReAuthenticate, "n,,n=alice,r=x".into()))
        .await;
    match c.expect_close().await.last() {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::ProtocolError),
        other => panic!("expected DISCONNECT 0x82, got {other:?}"),
    }
}

/// MQTT 5 4.12: SCRAM-SHA-512 against a password-file `$7$` entry succeeds,
/// and the CONNACK carries the server's signature.
#[tokio::test]
async fn a_scram_exchange_against_a_password_file_user_succeeds() {
    let broker = password_broker();
    let (ack, expected) = scram_connect(&broker, "scram-ok", "wonder land").await;
    assert_eq!(ack.reason, ReasonCode::Success);
    assert_eq!(
        ack.properties.authentication_method.as_deref(),
        Some("SCRAM-SHA-512")
    );
    assert_eq!(
        ack.properties.authentication_data.as_deref(),
        Some(expected.as_bytes())
    );
}

/// A wrong password fails with 0x86, and neither the password nor the
/// proof appears in the log.
#[tokio::test]
async fn a_scram_exchange_with_a_wrong_password_fails_0x86_and_logs_no_secret() {
    let broker = password_broker();
    let (ack, _) = scram_connect(&broker, "scram-bad", "wonderland").await;
    assert_eq!(ack.reason, ReasonCode::BadUserNameOrPassword);
    broker.wait_log(|l| l.contains("connection refused") && l.contains("scram-bad"));
    let log = broker.log_text();
    assert!(
        !log.contains("wonderland") && !log.contains("wonder land"),
        "{log}"
    );
    assert!(
        !log.contains("p=") && !log.contains("v="),
        "no proof or signature: {log}"
    );
}

/// An Authentication Method other than SCRAM-SHA-512 is still 0x8C.
#[tokio::test]
async fn an_unknown_authentication_method_is_0x8c() {
    let broker = password_broker();
    let mut c = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = ConnectOpts::clean();
    opts.properties.authentication_method = Some("SCRAM-SHA-256".into());
    let ack = c.connect("other-method", opts).await;
    assert_eq!(ack.reason, ReasonCode::BadAuthenticationMethod);
}

/// A session resumed by a client that now names a smaller Receive Maximum
/// is resent what that window takes, the rest one at a time as it
/// acknowledges: MQTT 5 counts a resent PUBLISH against the Receive
/// Maximum the client just gave (MQTT-3.3.4-9).
#[tokio::test]
async fn a_session_resumed_under_a_smaller_receive_maximum_is_resent_within_it() {
    let broker = Broker::anonymous();
    let connect = |receive_maximum| {
        let mut opts = ConnectOpts::persistent(300);
        opts.properties.receive_maximum = Some(receive_maximum);
        opts
    };
    let mut sub = Raw::tcp(broker.addr(), v5()).await;
    sub.connect("resumer", connect(3)).await;
    sub.subscribe(1, "t/#", 1).await;
    let mut publisher = Raw::tcp(broker.addr(), v4()).await;
    publisher.connect("pub", ConnectOpts::clean()).await;
    for id in 1..=3u16 {
        publisher
            .publish_acked("t/x", &id.to_be_bytes(), 1, false, id)
            .await;
    }
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(sub.next_publish(false).await);
    }
    drop(sub);
    let mut sub = Raw::tcp(broker.addr(), v5()).await;
    let ack = sub.connect("resumer", connect(1)).await;
    assert!(ack.session_present);
    for sent in &first {
        let again = sub.next_publish(false).await;
        assert!(again.dup);
        assert_eq!(
            (again.packet_id, &again.payload),
            (sent.packet_id, &sent.payload)
        );
        sub.expect_nothing().await;
        sub.ack_publish(&again).await;
    }
    sub.expect_nothing().await;
}
