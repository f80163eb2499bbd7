//! TLS, mutual TLS, passwords and the ACL through the real broker.

mod broker_support;

use std::sync::Arc;

use base64::Engine as _;
use broker_support::*;
use saguin::broker::codec::{Packet, ReasonCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn password_line(user: &str, password: &str) -> String {
    password_line_of(user, password, 101)
}

fn password_line_of(user: &str, password: &str, iterations: u32) -> String {
    let salt = b"saguin-test-salt";
    let mut hash = [0u8; 64];
    pbkdf2::pbkdf2_hmac::<sha2::Sha512>(password.as_bytes(), salt, iterations, &mut hash);
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "{user}:$7${iterations}${}${}\n",
        b64.encode(salt),
        b64.encode(hash)
    )
}

fn auth_broker() -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let passwords = password_line("alice", "wonderland") + &password_line("bob", "builder");
    write_file(dir.path(), "passwords", passwords.as_bytes());
    write_file(
        dir.path(),
        "acl",
        b"topic read public/#\nuser alice\ntopic readwrite alice/#\ntopic write public/#\ntopic deny alice/secret\nuser bob\ntopic read alice/#\n",
    );
    Broker::start_in(
        dir,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: false\n  password_file: passwords\n  acl_file: acl\n",
    )
}

fn user(name: &str, password: &str) -> ConnectOpts {
    let mut o = ConnectOpts::clean();
    o.username = Some(name.into());
    o.password = Some(password.into());
    o
}

#[tokio::test]
async fn passwords_accept_and_refuse() {
    let broker = auth_broker();
    for version in [v4(), v5()] {
        let mut c = Raw::tcp(broker.addr(), version).await;
        assert_eq!(
            c.connect("ok", user("alice", "wonderland")).await.reason,
            ReasonCode::Success
        );
        let mut c = Raw::tcp(broker.addr(), version).await;
        let ack = c.connect("bad", user("alice", "guess")).await;
        assert_eq!(
            ack.reason,
            ReasonCode::BadUserNameOrPassword,
            "{version} (3.1.1 return code 4)"
        );
        assert!(c.expect_close().await.is_empty());
        let mut c = Raw::tcp(broker.addr(), version).await;
        let ack = c.connect("anon", ConnectOpts::clean()).await;
        assert_eq!(
            ack.reason,
            ReasonCode::NotAuthorized,
            "{version}: anonymous refused (3.1.1 code 5)"
        );
    }
    let log = broker.log_text();
    assert!(
        !log.contains("wonderland") && !log.contains("guess") && !log.contains("$7$"),
        "secrets in the log:\n{log}"
    );
}

fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the broker's threads")
        .count()
}

/// A burst of CONNECTs with passwords is checked on a thread for each
/// CPU: the broker grows by those threads, where the runtime's pool of
/// blocking threads (which keeps a thread ten seconds after its last
/// task) grew by one for each check waiting.
#[tokio::test]
async fn a_burst_of_password_checks_runs_a_cpu_at_a_time() {
    const DEVICES: usize = 32;
    // The same salt and password for every user: one line's hash, made
    // once, costly enough (a few ms a check) that the checks overlap.
    let line = password_line_of("device", "secret", 4_000);
    let hash = line.split_once(':').expect("user:hash").1;
    let passwords: String = (0..DEVICES).map(|i| format!("d{i}:{hash}")).collect();
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "passwords", passwords.as_bytes());
    let broker = Broker::start_in(
        dir,
        "listeners:\n  - name: mqtt\n    bind: 127.0.0.1:0\nauth:\n  allow_anonymous: false\n  password_file: passwords\n",
    );
    let before = threads_of(broker.child.id());
    let addr = broker.addr();
    let connects: Vec<_> = (0..DEVICES)
        .map(|i| {
            tokio::spawn(async move {
                let mut c = Raw::tcp(addr, v4()).await;
                let ack = c
                    .connect(&format!("d{i}"), user(&format!("d{i}"), "secret"))
                    .await;
                (ack.reason, c)
            })
        })
        .collect();
    let mut clients = Vec::new();
    for connect in connects {
        let (reason, client) = connect.await.expect("connect");
        assert_eq!(reason, ReasonCode::Success);
        clients.push(client);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let grown = threads_of(broker.child.id()).saturating_sub(before);
    assert!(
        grown <= cpus + 1,
        "{grown} threads more after {DEVICES} password checks, with {cpus} CPUs"
    );
}

#[tokio::test]
async fn acl_publish_and_subscribe() {
    let broker = auth_broker();
    let mut bob = Raw::tcp(broker.addr(), v5()).await;
    bob.connect("bob", user("bob", "builder")).await;
    assert_eq!(
        bob.subscribe(1, "alice/#", 1).await,
        vec![ReasonCode::GrantedQoS1]
    );
    // Denied subscribe: 0x87 (v5) / 0x80 (3.1.1).
    assert_eq!(
        bob.subscribe(2, "private/#", 1).await,
        vec![ReasonCode::NotAuthorized]
    );
    let mut bob4 = Raw::tcp(broker.addr(), v4()).await;
    bob4.connect("bob4", user("bob", "builder")).await;
    assert_eq!(
        bob4.subscribe(1, "private/#", 1).await,
        vec![ReasonCode::UnspecifiedError]
    );

    let mut alice = Raw::tcp(broker.addr(), v5()).await;
    alice.connect("alice", user("alice", "wonderland")).await;
    alice
        .publish_acked("alice/news", b"allowed", 1, false, 1)
        .await;
    assert_eq!(&bob.next_publish(true).await.payload[..], b"allowed");
    // Denied publish at QoS 1: PUBACK 0x87, nothing routed.
    alice.publish("alice/secret", b"denied", 1, false, 2).await;
    match alice.recv().await {
        Some(Packet::PubAck(a)) => {
            assert_eq!((a.packet_id, a.reason), (2, ReasonCode::NotAuthorized))
        }
        other => panic!("expected PUBACK 0x87, got {other:?}"),
    }
    // Denied at QoS 2 still completes: PUBREC 0x87.
    alice.publish("elsewhere/x", b"denied", 2, false, 3).await;
    match alice.recv().await {
        Some(Packet::PubRec(a)) => {
            assert_eq!((a.packet_id, a.reason), (3, ReasonCode::NotAuthorized))
        }
        other => panic!("expected PUBREC 0x87, got {other:?}"),
    }
    // 3.1.1: a plain acknowledgement, and the handshake completes.
    let mut alice4 = Raw::tcp(broker.addr(), v4()).await;
    alice4.connect("alice4", user("alice", "wonderland")).await;
    alice4
        .publish_acked("alice/secret", b"denied", 2, false, 4)
        .await;
    alice4
        .publish_acked("elsewhere/y", b"denied", 1, false, 5)
        .await;
    bob.expect_nothing().await;
}

#[tokio::test]
async fn another_principal_cannot_take_over_a_session() {
    let broker = auth_broker();
    let mut alice = Raw::tcp(broker.addr(), v5()).await;
    let mut opts = user("alice", "wonderland");
    opts.clean_start = false;
    opts.properties.session_expiry_interval = Some(600);
    alice.connect("shared-id", opts).await;
    let mut bob = Raw::tcp(broker.addr(), v5()).await;
    let ack = bob.connect("shared-id", user("bob", "builder")).await;
    assert_eq!(ack.reason, ReasonCode::NotAuthorized);
    // Alice's connection is untouched.
    alice.send(Packet::PingReq).await;
    assert!(matches!(alice.recv().await, Some(Packet::PingResp)));
}

struct Pki {
    ca_pem: String,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "saguin test CA");
        let ca = params.self_signed(&ca_key).unwrap();
        Pki {
            ca_pem: ca.pem(),
            ca,
            ca_key,
        }
    }

    fn leaf(&self, name: &str, server: bool) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        if server {
            params
                .subject_alt_names
                .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
        }
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn tls_broker(pki: &Pki, mtls: bool) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pki.leaf("localhost", true);
    write_file(dir.path(), "server.pem", cert.as_bytes());
    write_file(dir.path(), "server.key", key.as_bytes());
    write_file(dir.path(), "ca.pem", pki.ca_pem.as_bytes());
    let client_ca = if mtls { ", client_ca: ca.pem" } else { "" };
    Broker::start_in(
        dir,
        &format!(
            "listeners:\n  - name: mqtts\n    bind: 127.0.0.1:0\n    tls: {{ cert: server.pem, key: server.key{client_ca} }}\n    handshake_timeout: 2s\nauth:\n  allow_anonymous: true\n"
        ),
    )
}

fn client_config(pki: &Pki, identity: Option<(String, String)>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pki.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = rustls_pemfile::certs(&mut cert.as_bytes())
                .map(|c| c.unwrap())
                .collect();
            let key = rustls_pemfile::private_key(&mut key.as_bytes())
                .unwrap()
                .unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    Arc::new(config)
}

async fn tls_connect(
    broker: &Broker,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(broker.listeners["mqtts"]).await?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
        .unwrap()
        .to_owned();
    tokio::time::timeout(WAIT, connector.connect(name, tcp))
        .await
        .expect("handshake timeout")
}

/// Payloads large enough to be written from the message beside their
/// header reach TLS subscribers of both versions byte for byte, one after
/// another and each whole.
#[tokio::test]
async fn large_payloads_cross_tls_whole() {
    let pki = Pki::new();
    let broker = tls_broker(&pki, false);
    let mut subscribers = Vec::new();
    for (id, version) in [("tls-big-5", v5()), ("tls-big-4", v4())] {
        let stream = tls_connect(&broker, client_config(&pki, None))
            .await
            .unwrap();
        let mut sub = Raw::new(stream, version);
        sub.connect(id, ConnectOpts::clean()).await;
        sub.subscribe(1, "tls/big", 1).await;
        subscribers.push(sub);
    }
    let stream = tls_connect(&broker, client_config(&pki, None))
        .await
        .unwrap();
    let mut publisher = Raw::new(stream, v4());
    publisher.connect("tls-big-pub", ConnectOpts::clean()).await;
    let payloads: Vec<Vec<u8>> = [20_000usize, 64, 150_000]
        .iter()
        .enumerate()
        .map(|(k, &len)| (0..len).map(|b| ((b + k) % 251) as u8).collect())
        .collect();
    for (k, payload) in payloads.iter().enumerate() {
        publisher
            .publish_acked("tls/big", payload, 1, false, k as u16 + 1)
            .await;
    }
    for sub in &mut subscribers {
        for payload in &payloads {
            assert!(sub.next_publish(true).await.payload[..] == payload[..]);
        }
    }
}

#[tokio::test]
async fn tls_pub_sub() {
    let pki = Pki::new();
    let broker = tls_broker(&pki, false);
    let stream = tls_connect(&broker, client_config(&pki, None))
        .await
        .unwrap();
    let mut sub = Raw::new(stream, v5());
    sub.connect("tls-sub", ConnectOpts::clean()).await;
    sub.subscribe(1, "tls/t", 1).await;
    let stream = tls_connect(&broker, client_config(&pki, None))
        .await
        .unwrap();
    let mut publisher = Raw::new(stream, v4());
    publisher.connect("tls-pub", ConnectOpts::clean()).await;
    publisher
        .publish_acked("tls/t", b"encrypted", 1, false, 1)
        .await;
    assert_eq!(&sub.next_publish(true).await.payload[..], b"encrypted");
    // Plain MQTT on the TLS port gets nothing and is closed by the deadline.
    // (At most a TLS alert comes back, then the close.)
    let mut plain = TcpStream::connect(broker.listeners["mqtts"]).await.unwrap();
    plain.write_all(&[0xC0, 0x00]).await.unwrap();
    let mut sink = Vec::new();
    let read = tokio::time::timeout(WAIT, plain.read_to_end(&mut sink)).await;
    assert!(read.is_ok(), "plain MQTT on the TLS port is closed");
}

#[tokio::test]
async fn mtls_requires_a_client_certificate() {
    let pki = Pki::new();
    let broker = tls_broker(&pki, true);
    let identity = pki.leaf("device-1", false);
    let stream = tls_connect(&broker, client_config(&pki, Some(identity)))
        .await
        .unwrap();
    let mut c = Raw::new(stream, v5());
    assert_eq!(
        c.connect("mtls", ConnectOpts::clean()).await.reason,
        ReasonCode::Success
    );

    // Without a certificate: the handshake (or the first read) fails.
    let refused = match tls_connect(&broker, client_config(&pki, None)).await {
        Err(_) => true,
        Ok(stream) => {
            let mut c = Raw::new(stream, v5());
            c.send(Packet::PingReq).await;
            matches!(c.recv_within(WAIT).await, Ok(None))
        }
    };
    assert!(
        refused,
        "a client without a certificate must not get through"
    );
    // A certificate from another CA is refused too.
    let other = Pki::new();
    let refused =
        match tls_connect(&broker, client_config(&pki, Some(other.leaf("x", false)))).await {
            Err(_) => true,
            Ok(stream) => {
                let mut c = Raw::new(stream, v5());
                c.send(Packet::PingReq).await;
                matches!(c.recv_within(WAIT).await, Ok(None))
            }
        };
    assert!(refused);
}

#[tokio::test]
async fn mosquitto_clients_with_password() {
    if !have_mosquitto_clients("mosquitto_clients_with_password") {
        return;
    }
    let broker = auth_broker();
    let port = broker.port().to_string();
    let out = std::process::Command::new("mosquitto_pub")
        .args([
            "-p", &port, "-u", "alice", "-P", "nope", "-t", "alice/x", "-m", "m",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a bad password is refused");
    let out = std::process::Command::new("mosquitto_pub")
        .args([
            "-p",
            &port,
            "-u",
            "alice",
            "-P",
            "wonderland",
            "-t",
            "alice/x",
            "-m",
            "m",
            "-q",
            "1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A TLS ClientHello naming the server by IP address in its SNI extension,
/// as OpenSSL-based clients (`mosquitto_pub -h 127.0.0.1 --cafile ...`)
/// send it; RFC 6066 allows only host names there.
fn client_hello_with_ip_sni(ip: &str) -> Vec<u8> {
    let mut sni = vec![0x00];
    sni.extend((ip.len() as u16).to_be_bytes());
    sni.extend(ip.as_bytes());
    let mut sni_list = (sni.len() as u16).to_be_bytes().to_vec();
    sni_list.extend(sni);
    let mut extensions = vec![0x00, 0x00];
    extensions.extend((sni_list.len() as u16).to_be_bytes());
    extensions.extend(sni_list);
    // supported_versions: TLS 1.3.
    extensions.extend([0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
    let mut body = vec![0x03, 0x03];
    body.extend([7u8; 32]);
    body.push(0); // no session id
    body.extend([0x00, 0x02, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend([0x01, 0x00]); // null compression
    body.extend((extensions.len() as u16).to_be_bytes());
    body.extend(extensions);
    let mut handshake = vec![0x01];
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend((handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

/// A TLS client that names the broker by IP address in SNI is not
/// a WARN line per connection.
#[tokio::test]
async fn tls_client_connecting_by_ip_logs_no_warning_per_connection() {
    let pki = Pki::new();
    let mut broker = tls_broker(&pki, false);
    for _ in 0..3 {
        let mut stream = TcpStream::connect(broker.listeners["mqtts"]).await.unwrap();
        stream
            .write_all(&client_hello_with_ip_sni("127.0.0.1"))
            .await
            .unwrap();
        // The broker has parsed the hello once it answers or hangs up.
        let mut buf = [0u8; 512];
        let _ = tokio::time::timeout(WAIT, stream.read(&mut buf)).await;
    }
    assert_eq!(broker.terminate(), Some(0));
    // stderr is one ordered stream: once the shutdown's line is read, every
    // line about the connections before it has been read too.
    broker.wait_log(|l| l.contains("signal received"));
    let log = broker.log_text();
    assert!(
        !log.lines()
            .any(|l| l.contains("level=WARN") && l.contains("rustls")),
        "a WARN for a client naming the broker by IP:\n{log}"
    );
}
