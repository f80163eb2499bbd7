//! Codec tests: the specifications' example bytes, remaining-length
//! boundaries, round trips of every packet type in both versions, every
//! refusal, every split point of a stream, and property tests.
//!
//! Over 1,500 lines: every test builds its packets with the builder
//! functions at the top and checks both protocol versions against the
//! same builders, so the codec's tests stay one file the way the codec is
//! one module; split by packet kind when a kind's tests need builders of
//! their own.

use bytes::{BufMut, Bytes, BytesMut};

use super::*;

const MAX: u32 = PROTOCOL_MAX_PACKET_SIZE;

fn v311_connect() -> Connect {
    Connect {
        protocol: ProtocolVersion::V311,
        clean_start: true,
        keep_alive: 60,
        client_id: "c1".into(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
    }
}

fn v5_connect() -> Connect {
    Connect {
        protocol: ProtocolVersion::V5,
        ..v311_connect()
    }
}

fn enc(packet: &Packet, version: ProtocolVersion) -> BytesMut {
    let mut buf = BytesMut::new();
    encode(packet, version, &mut buf).expect("encodes");
    assert_eq!(
        buf.len(),
        encoded_len(packet, version).unwrap(),
        "encoded_len agrees"
    );
    buf
}

/// A server-side decoder that has already seen a CONNECT of `version`.
fn server_after_connect(version: ProtocolVersion) -> FrameDecoder {
    let connect = Connect {
        protocol: version,
        ..v311_connect()
    };
    let mut d = FrameDecoder::server(MAX);
    let mut buf = enc(&Packet::Connect(connect), version);
    assert!(matches!(d.decode(&mut buf), Ok(Some(Packet::Connect(_)))));
    assert_eq!(d.version(), Some(version));
    d
}

/// The decoder that receives `packet`: a server for what clients send, a
/// client for what servers send.
fn receiver_for(packet: &Packet, version: ProtocolVersion) -> FrameDecoder {
    match packet {
        Packet::Connect(_) => FrameDecoder::server(MAX),
        // Only a server sends subscription identifiers.
        Packet::Publish(p) if !p.properties.subscription_identifiers.is_empty() => {
            FrameDecoder::client(MAX, version)
        }
        p if p.packet_type().is_client_to_server() => server_after_connect(version),
        _ => FrameDecoder::client(MAX, version),
    }
}

fn round_trip(packet: &Packet, version: ProtocolVersion) {
    let mut buf = enc(packet, version);
    let mut d = receiver_for(packet, version);
    let decoded = d.decode(&mut buf);
    assert_eq!(decoded, Ok(Some(packet.clone())), "{version}");
    assert!(buf.is_empty());
}

/// Decodes `bytes` on a server that has seen CONNECT of `version`.
fn server_decode(version: ProtocolVersion, bytes: &[u8]) -> Result<Option<Packet>, DecodeError> {
    let mut d = server_after_connect(version);
    d.decode(&mut BytesMut::from(bytes))
}

fn client_decode(version: ProtocolVersion, bytes: &[u8]) -> Result<Option<Packet>, DecodeError> {
    FrameDecoder::client(MAX, version).decode(&mut BytesMut::from(bytes))
}

fn first_decode(bytes: &[u8]) -> Result<Option<Packet>, DecodeError> {
    FrameDecoder::server(MAX).decode(&mut BytesMut::from(bytes))
}

fn user(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

// ---------------------------------------------------------------------------
// The specifications' examples, byte for byte.

/// MQTT 3.1.1 §3.1.2.10's variable header (name "MQTT", level 4, flags
/// 0xCE, keep alive 10) with a payload in the order of §3.1.3.
const V311_CONNECT: &[u8] = &[
    0x10, 29, // CONNECT, remaining length
    0x00, 0x04, b'M', b'Q', b'T', b'T', // protocol name
    0x04, // level
    0xCE, // user name, password, will QoS 1, will flag, clean session
    0x00, 0x0A, // keep alive 10
    0x00, 0x03, b'a', b'b', b'c', // client id
    0x00, 0x01, b'w', // will topic
    0x00, 0x03, b'b', b'y', b'e', // will payload
    0x00, 0x01, b'u', // user name
    0x00, 0x01, b'p', // password
];

fn v311_connect_example() -> Connect {
    Connect {
        protocol: ProtocolVersion::V311,
        clean_start: true,
        keep_alive: 10,
        client_id: "abc".into(),
        will: Some(LastWill {
            topic: ByteStr::from_static("w"),
            payload: Bytes::from_static(b"bye"),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: WillProperties::default(),
        }),
        username: Some("u".into()),
        password: Some(Bytes::from_static(b"p")),
        properties: ConnectProperties::default(),
    }
}

#[test]
fn v311_connect_matches_the_specification() {
    assert_eq!(
        first_decode(V311_CONNECT),
        Ok(Some(Packet::Connect(v311_connect_example())))
    );
    assert_eq!(
        &enc(
            &Packet::Connect(v311_connect_example()),
            ProtocolVersion::V311
        )[..],
        V311_CONNECT
    );
}

/// MQTT 5.0 §3.1.2.12's variable header example: level 5, flags 0xCE,
/// keep alive 10, properties: Session Expiry Interval 10.
#[test]
fn v5_connect_variable_header_matches_the_specification() {
    let mut connect = v311_connect_example();
    connect.protocol = ProtocolVersion::V5;
    connect.properties.session_expiry_interval = Some(10);
    let bytes = enc(&Packet::Connect(connect.clone()), ProtocolVersion::V5);
    assert_eq!(
        &bytes[2..18],
        &[
            0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0xCE, 0x00, 0x0A, 0x05, 0x11, 0x00, 0x00,
            0x00, 0x0A
        ]
    );
    // Empty will properties come right after the client id.
    assert_eq!(&bytes[18..24], &[0x00, 0x03, b'a', b'b', b'c', 0x00]);
    assert_eq!(first_decode(&bytes), Ok(Some(Packet::Connect(connect))));
}

/// MQTT 3.1.1 §3.3.2.3: PUBLISH "a/b", packet identifier 10.
#[test]
fn v311_publish_example() {
    let bytes = [
        0x32, 0x09, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, b'h', b'i',
    ];
    let publish = Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: ByteStr::from_static("a/b"),
        packet_id: 10,
        properties: PublishProperties::default(),
        payload: Bytes::from_static(b"hi"),
    };
    assert_eq!(
        server_decode(ProtocolVersion::V311, &bytes),
        Ok(Some(Packet::Publish(publish.clone())))
    );
    assert_eq!(
        &enc(&Packet::Publish(publish), ProtocolVersion::V311)[..],
        &bytes
    );
}

#[test]
fn fixed_byte_forms() {
    let v4 = ProtocolVersion::V311;
    let v5 = ProtocolVersion::V5;
    assert_eq!(&enc(&Packet::PingReq, v4)[..], &[0xC0, 0x00]);
    assert_eq!(&enc(&Packet::PingResp, v5)[..], &[0xD0, 0x00]);
    let disconnect = Packet::Disconnect(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION));
    assert_eq!(&enc(&disconnect, v4)[..], &[0xE0, 0x00]);
    assert_eq!(&enc(&disconnect, v5)[..], &[0xE0, 0x00]);
    let with_will = Packet::Disconnect(Disconnect::new(ReasonCode::DisconnectWithWillMessage));
    assert_eq!(&enc(&with_will, v5)[..], &[0xE0, 0x01, 0x04]);
    // PUBREL's fixed header is 0x62 (reserved flags 0010).
    assert_eq!(
        &enc(&Packet::PubRel(PubAck::new(7)), v4)[..],
        &[0x62, 0x02, 0x00, 0x07]
    );
    // MQTT 5 short forms: Success without properties is 2 bytes; a reason
    // without properties is 3.
    assert_eq!(
        &enc(&Packet::PubAck(PubAck::new(7)), v5)[..],
        &[0x40, 0x02, 0x00, 0x07]
    );
    let mut nms = PubAck::new(7);
    nms.reason = ReasonCode::NoMatchingSubscribers;
    assert_eq!(
        &enc(&Packet::PubAck(nms.clone()), v5)[..],
        &[0x40, 0x03, 0x00, 0x07, 0x10]
    );
    // On 3.1.1 the reason does not exist.
    assert_eq!(
        &enc(&Packet::PubAck(nms), v4)[..],
        &[0x40, 0x02, 0x00, 0x07]
    );
    // 3.1.1 CONNACK: session present, return code.
    let connack = Packet::ConnAck(ConnAck {
        session_present: true,
        reason: ReasonCode::Banned,
        properties: ConnAckProperties::default(),
    });
    assert_eq!(&enc(&connack, v4)[..], &[0x20, 0x02, 0x01, 0x05]);
    assert_eq!(&enc(&connack, v5)[..], &[0x20, 0x03, 0x01, 0x8A, 0x00]);
    let suback = Packet::SubAck(SubAck {
        packet_id: 1,
        reasons: vec![ReasonCode::GrantedQoS1, ReasonCode::QuotaExceeded],
        properties: AckProperties::default(),
    });
    assert_eq!(&enc(&suback, v4)[..], &[0x90, 0x04, 0x00, 0x01, 0x01, 0x80]);
    assert_eq!(
        &enc(&suback, v5)[..],
        &[0x90, 0x05, 0x00, 0x01, 0x00, 0x01, 0x97]
    );
    // The short forms decode.
    assert_eq!(
        client_decode(v5, &[0x40, 0x02, 0x00, 0x07]),
        Ok(Some(Packet::PubAck(PubAck::new(7))))
    );
    assert_eq!(
        server_decode(v5, &[0xE0, 0x00]),
        Ok(Some(Packet::Disconnect(Disconnect::new(
            ReasonCode::Success
        ))))
    );
    assert_eq!(
        server_decode(v5, &[0xE0, 0x01, 0x04]),
        Ok(Some(Packet::Disconnect(Disconnect::new(
            ReasonCode::DisconnectWithWillMessage
        ))))
    );
    let auth = Packet::Auth(Auth {
        reason: ReasonCode::Success,
        properties: AuthProperties::default(),
    });
    assert_eq!(&enc(&auth, v5)[..], &[0xF0, 0x00]);
    assert_eq!(server_decode(v5, &[0xF0, 0x00]), Ok(Some(auth)));
}

// ---------------------------------------------------------------------------
// Remaining length.

fn publish_with_body(body_len: usize) -> Publish {
    // topic "t" (3 bytes) + payload; QoS 0, 3.1.1.
    Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: ByteStr::from_static("t"),
        packet_id: 0,
        properties: PublishProperties::default(),
        payload: Bytes::from(vec![0xAB; body_len - 3]),
    }
}

#[test]
fn remaining_length_boundaries() {
    for (body, header) in [
        (127usize, &[0x7Fu8][..]),
        (128, &[0x80, 0x01]),
        (16_383, &[0xFF, 0x7F]),
        (16_384, &[0x80, 0x80, 0x01]),
        (2_097_151, &[0xFF, 0xFF, 0x7F]),
        (2_097_152, &[0x80, 0x80, 0x80, 0x01]),
    ] {
        let packet = Packet::Publish(publish_with_body(body));
        let bytes = enc(&packet, ProtocolVersion::V311);
        assert_eq!(bytes[0], 0x30);
        assert_eq!(&bytes[1..1 + header.len()], header, "{body}");
        assert_eq!(bytes.len(), 1 + header.len() + body);
        round_trip(&packet, ProtocolVersion::V311);
    }
    // The largest remaining length, checked from the header alone.
    let header = check_fixed_header(
        &[0x30, 0xFF, 0xFF, 0xFF, 0x7F],
        MAX,
        Some(ProtocolVersion::V5),
        Role::Server,
    )
    .unwrap()
    .unwrap();
    assert_eq!(header.remaining_len, 268_435_455);
    assert_eq!(header.header_len, 5);
    assert_eq!(header.frame_len() as u32, PROTOCOL_MAX_PACKET_SIZE);
    // A fifth length byte is malformed.
    assert_eq!(
        server_decode(ProtocolVersion::V5, &[0x30, 0xFF, 0xFF, 0xFF, 0x80, 0x01]),
        Err(DecodeError::MalformedRemainingLength)
    );
    assert_eq!(
        server_decode(ProtocolVersion::V5, &[0x30, 0xFF, 0xFF, 0xFF, 0xFF]),
        Err(DecodeError::MalformedRemainingLength)
    );
    // Not minimally encoded.
    assert_eq!(
        server_decode(ProtocolVersion::V5, &[0xC0, 0x80, 0x00]),
        Err(DecodeError::MalformedRemainingLength)
    );
    // Incomplete length bytes are just incomplete.
    assert_eq!(
        server_decode(ProtocolVersion::V5, &[0x30, 0xFF, 0xFF]),
        Ok(None)
    );
    assert_eq!(server_decode(ProtocolVersion::V5, &[]), Ok(None));
}

#[test]
fn oversized_packet_is_refused_from_its_header() {
    let mut d = server_after_connect(ProtocolVersion::V5);
    d.max_packet_size = 1024;
    // Only the fixed header of a 2 MB PUBLISH has arrived.
    let mut buf = BytesMut::from(&[0x30u8, 0x80, 0x80, 0x80, 0x01][..]);
    let err = d.decode(&mut buf).unwrap_err();
    assert_eq!(
        err,
        DecodeError::PacketTooLarge {
            packet: PacketType::Publish,
            size: 5 + 2_097_152,
            max: 1024
        }
    );
    assert_eq!(err.reason_code(), ReasonCode::PacketTooLarge);
    // Nothing was reserved for the refused body.
    assert!(buf.capacity() < 1024);
    // Exactly at the cap is accepted.
    let packet = Packet::Publish(publish_with_body(1024 - 3));
    let mut buf = enc(&packet, ProtocolVersion::V5);
    buf.truncate(buf.len()); // whole
    let mut d = server_after_connect(ProtocolVersion::V5);
    d.max_packet_size = buf.len() as u32;
    assert!(d.decode(&mut buf).unwrap().is_some());
}

#[test]
fn incomplete_body_reserves_room_once_the_size_is_known() {
    let packet = Packet::Publish(publish_with_body(10_000));
    let bytes = enc(&packet, ProtocolVersion::V5);
    let mut d = server_after_connect(ProtocolVersion::V5);
    let mut buf = BytesMut::from(&bytes[..10]);
    assert_eq!(d.decode(&mut buf), Ok(None));
    assert_eq!(buf.len(), 10, "nothing consumed");
    assert!(buf.capacity() >= bytes.len());
    // A claimed 2 MB frame under a 4 MB cap reserves a bounded step, not
    // what the peer claims.
    let mut d = server_after_connect(ProtocolVersion::V5);
    d.max_packet_size = 4 << 20;
    let mut buf = BytesMut::from(&[0x30u8, 0x80, 0x80, 0x80, 0x01, 0, 1, b't'][..]);
    assert_eq!(d.decode(&mut buf), Ok(None));
    assert!(buf.capacity() <= 128 * 1024, "{}", buf.capacity());
}

/// A short PUBLISH's topic and payload are its own, not part of the read
/// buffer: a message kept for later keeps no other packet's bytes alive.
/// A long one is split off the buffer that grew to hold it.
#[test]
fn a_short_publish_is_copied_out_of_the_read_buffer_a_long_one_split_off_it() {
    for (body, copied) in [(100, true), (64 * 1024, false)] {
        let mut buf = enc(
            &Packet::Publish(publish_with_body(body)),
            ProtocolVersion::V5,
        );
        // A PINGREQ read with it.
        buf.extend_from_slice(&[0xC0, 0]);
        let read = buf.as_ptr_range();
        let mut d = server_after_connect(ProtocolVersion::V5);
        let Ok(Some(Packet::Publish(p))) = d.decode(&mut buf) else {
            panic!("a PUBLISH of {body}");
        };
        assert_eq!(p.payload.len(), body - 3);
        let in_read = (
            read.contains(&p.topic.as_ptr()),
            read.contains(&p.payload.as_ptr()),
        );
        assert_eq!(in_read, (!copied, !copied), "a body of {body}");
        assert_eq!(d.decode(&mut buf), Ok(Some(Packet::PingReq)));
    }
}

// ---------------------------------------------------------------------------
// Round trips of every packet type.

fn rich_v5_packets() -> Vec<Packet> {
    let mut connect = v5_connect();
    connect.clean_start = false;
    connect.keep_alive = 0;
    connect.client_id = String::new();
    connect.username = None;
    connect.password = Some(Bytes::from_static(b"\x00\xFFsecret"));
    connect.will = Some(LastWill {
        topic: ByteStr::from_static("dev/1/status"),
        payload: Bytes::from_static(b"offline"),
        qos: QoS::ExactlyOnce,
        retain: true,
        properties: WillProperties {
            will_delay_interval: Some(30),
            payload_format_indicator: Some(PayloadFormat::Utf8),
            message_expiry_interval: Some(3600),
            content_type: Some("text/plain".into()),
            response_topic: Some("dev/1/resp".into()),
            correlation_data: Some(Bytes::from_static(b"\x01\x02")),
            user_properties: vec![user("a", "1"), user("a", "2")],
        },
    });
    connect.properties = ConnectProperties {
        session_expiry_interval: Some(u32::MAX),
        receive_maximum: Some(10),
        maximum_packet_size: Some(65_536),
        topic_alias_maximum: Some(5),
        request_response_information: Some(true),
        request_problem_information: Some(false),
        user_properties: vec![user("k", "v"), user("", "")],
        authentication_method: Some("SCRAM-SHA-1".into()),
        authentication_data: Some(Bytes::from_static(b"client-first")),
    };
    let connack = ConnAck {
        session_present: true,
        reason: ReasonCode::Success,
        properties: ConnAckProperties {
            session_expiry_interval: Some(60),
            receive_maximum: Some(64),
            maximum_qos: Some(QoS::AtLeastOnce),
            retain_available: Some(true),
            maximum_packet_size: Some(262_144),
            assigned_client_identifier: Some("auto-1".into()),
            topic_alias_maximum: Some(16),
            reason_string: Some("welcome".into()),
            user_properties: vec![user("x", "y")],
            wildcard_subscription_available: Some(true),
            subscription_identifiers_available: Some(true),
            shared_subscription_available: Some(false),
            server_keep_alive: Some(30),
            response_information: Some("resp/".into()),
            server_reference: Some("other:1883".into()),
            authentication_method: Some("SCRAM-SHA-1".into()),
            authentication_data: Some(Bytes::from_static(b"server-final")),
        },
    };
    let publish_out = Publish {
        dup: true,
        qos: QoS::ExactlyOnce,
        retain: true,
        topic: ByteStr::from_static("telemetry/dev1/temp"),
        packet_id: 65_535,
        properties: PublishProperties {
            payload_format_indicator: Some(PayloadFormat::Unspecified),
            message_expiry_interval: Some(0),
            topic_alias: Some(3),
            response_topic: Some(ByteStr::from_static("reply/here")),
            correlation_data: Some(Bytes::from_static(b"corr")),
            user_properties: vec![user("saguin-offset", "42"), user("saguin-offset", "43")],
            subscription_identifiers: vec![1, 268_435_455, 128],
            content_type: Some(ByteStr::from_static("application/json")),
        },
        payload: Bytes::from_static(b"{\"t\":21.5}"),
    };
    let mut publish_in = publish_out.clone();
    publish_in.properties.subscription_identifiers.clear();
    let alias_only = Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: ByteStr::default(),
        packet_id: 0,
        properties: PublishProperties {
            topic_alias: Some(3),
            ..PublishProperties::default()
        },
        payload: Bytes::new(),
    };
    let ack = |reason| PubAck {
        packet_id: 9,
        reason,
        properties: AckProperties {
            reason_string: Some("why".into()),
            user_properties: vec![user("u", "p")],
        },
    };
    let subscribe = Subscribe {
        packet_id: 2,
        filters: vec![
            SubscribeFilter {
                filter: "telemetry/#".into(),
                options: SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    no_local: true,
                    retain_as_published: true,
                    retain_handling: RetainHandling::DoNotSend,
                },
            },
            SubscribeFilter {
                filter: "$share/workers/jobs/+".into(),
                options: SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: RetainHandling::OnNewSubscribe,
                },
            },
        ],
        properties: SubscribeProperties {
            subscription_identifier: Some(268_435_455),
            user_properties: vec![user("saguin-from", "earliest")],
        },
    };
    vec![
        Packet::Connect(connect),
        Packet::ConnAck(connack),
        Packet::Publish(publish_out),
        Packet::Publish(publish_in),
        Packet::Publish(alias_only),
        Packet::PubAck(ack(ReasonCode::QuotaExceeded)),
        Packet::PubRec(ack(ReasonCode::NoMatchingSubscribers)),
        Packet::PubRel(ack(ReasonCode::PacketIdentifierNotFound)),
        Packet::PubComp(ack(ReasonCode::Success)),
        Packet::PubAck(PubAck {
            packet_id: 1,
            reason: ReasonCode::ImplementationSpecificError,
            properties: AckProperties::default(),
        }),
        Packet::Subscribe(subscribe),
        Packet::SubAck(SubAck {
            packet_id: 2,
            reasons: vec![
                ReasonCode::GrantedQoS2,
                ReasonCode::SharedSubscriptionsNotSupported,
            ],
            properties: AckProperties {
                reason_string: Some("partly".into()),
                user_properties: vec![],
            },
        }),
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 3,
            filters: vec!["a/+".into(), "$share/g/#".into()],
            properties: UnsubscribeProperties {
                user_properties: vec![user("a", "b")],
            },
        }),
        Packet::UnsubAck(UnsubAck {
            packet_id: 3,
            reasons: vec![ReasonCode::Success, ReasonCode::NoSubscriptionExisted],
            properties: AckProperties::default(),
        }),
        Packet::PingReq,
        Packet::PingResp,
        Packet::Disconnect(Disconnect {
            reason: ReasonCode::SessionTakenOver,
            properties: DisconnectProperties {
                session_expiry_interval: Some(0),
                reason_string: Some("taken over".into()),
                user_properties: vec![user("a", "b")],
                server_reference: Some("elsewhere".into()),
            },
        }),
        Packet::Auth(Auth {
            reason: ReasonCode::ContinueAuthentication,
            properties: AuthProperties {
                authentication_method: Some("SCRAM-SHA-1".into()),
                authentication_data: Some(Bytes::from_static(b"data")),
                reason_string: None,
                user_properties: vec![],
            },
        }),
    ]
}

fn v311_packets() -> Vec<Packet> {
    vec![
        Packet::Connect(v311_connect_example()),
        Packet::Connect(v311_connect()),
        Packet::ConnAck(ConnAck {
            session_present: false,
            reason: ReasonCode::ClientIdentifierNotValid,
            properties: ConnAckProperties::default(),
        }),
        Packet::Publish(Publish {
            dup: true,
            qos: QoS::ExactlyOnce,
            retain: true,
            topic: ByteStr::from_static("a/b"),
            packet_id: 1,
            properties: PublishProperties::default(),
            payload: Bytes::from_static(b"x"),
        }),
        Packet::Publish(publish_with_body(3)),
        Packet::PubAck(PubAck::new(1)),
        Packet::PubRec(PubAck::new(2)),
        Packet::PubRel(PubAck::new(3)),
        Packet::PubComp(PubAck::new(4)),
        Packet::Subscribe(Subscribe {
            packet_id: 5,
            filters: vec![
                SubscribeFilter {
                    filter: "a/#".into(),
                    options: SubscriptionOptions {
                        qos: QoS::AtLeastOnce,
                        ..SubscriptionOptions::default()
                    },
                },
                SubscribeFilter {
                    filter: "+".into(),
                    options: SubscriptionOptions::default(),
                },
            ],
            properties: SubscribeProperties::default(),
        }),
        Packet::SubAck(SubAck {
            packet_id: 5,
            reasons: vec![ReasonCode::GrantedQoS1, ReasonCode::UnspecifiedError],
            properties: AckProperties::default(),
        }),
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 6,
            filters: vec!["a/#".into()],
            properties: UnsubscribeProperties::default(),
        }),
        Packet::UnsubAck(UnsubAck {
            packet_id: 6,
            reasons: vec![],
            properties: AckProperties::default(),
        }),
        Packet::PingReq,
        Packet::PingResp,
        Packet::Disconnect(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION)),
    ]
}

#[test]
fn every_packet_type_round_trips_in_v5() {
    let packets = rich_v5_packets();
    let mut seen = std::collections::HashSet::new();
    for packet in &packets {
        seen.insert(packet.packet_type() as u8);
        round_trip(packet, ProtocolVersion::V5);
    }
    assert_eq!(seen.len(), 15, "all fifteen types");
}

#[test]
fn every_packet_type_round_trips_in_v311() {
    let packets = v311_packets();
    let mut seen = std::collections::HashSet::new();
    for packet in &packets {
        seen.insert(packet.packet_type() as u8);
        round_trip(packet, ProtocolVersion::V311);
    }
    assert_eq!(seen.len(), 14, "all types but AUTH");
}

#[test]
fn auth_does_not_exist_in_v311() {
    let auth = Packet::Auth(Auth {
        reason: ReasonCode::Success,
        properties: AuthProperties::default(),
    });
    assert!(matches!(
        encode(&auth, ProtocolVersion::V311, &mut BytesMut::new()),
        Err(EncodeError::NotInVersion { .. })
    ));
    assert_eq!(
        server_decode(ProtocolVersion::V311, &[0xF0, 0x00]),
        Err(DecodeError::ReservedPacketType {
            nibble: 15,
            byte: 0xF0
        })
    );
}

#[test]
fn v5_only_fields_are_dropped_on_v311() {
    // Encoding a v5-shaped packet for 3.1.1 keeps only what 3.1.1 has.
    let mut ack = PubAck::new(5);
    ack.reason = ReasonCode::QuotaExceeded;
    ack.properties.reason_string = Some("full".into());
    let bytes = enc(&Packet::PubAck(ack), ProtocolVersion::V311);
    assert_eq!(&bytes[..], &[0x40, 0x02, 0x00, 0x05]);
}

// ---------------------------------------------------------------------------
// Split points: incomplete input is Ok(None) and decodes the same once whole.

#[test]
fn every_split_point_decodes_the_same() {
    for version in [ProtocolVersion::V311, ProtocolVersion::V5] {
        let connect = Packet::Connect(Connect {
            protocol: version,
            ..v311_connect_example()
        });
        let packets: Vec<Packet> = std::iter::once(connect)
            .chain(
                match version {
                    ProtocolVersion::V5 => rich_v5_packets(),
                    ProtocolVersion::V311 => v311_packets(),
                }
                .into_iter()
                .filter(|p| {
                    p.packet_type().is_client_to_server() && p.packet_type() != PacketType::Connect
                })
                .filter(|p| match p {
                    Packet::Publish(p) => p.properties.subscription_identifiers.is_empty(),
                    _ => true,
                }),
            )
            .collect();
        let mut stream = BytesMut::new();
        for p in &packets {
            encode(p, version, &mut stream).unwrap();
        }
        let stream = stream.freeze();
        for split in 0..=stream.len() {
            let mut d = FrameDecoder::server(MAX);
            let mut buf = BytesMut::from(&stream[..split]);
            let mut got = Vec::new();
            while let Some(p) = d.decode(&mut buf).expect("valid stream") {
                got.push(p);
            }
            // Only whole frames were taken; the partial one waits intact.
            assert!(buf.len() <= split);
            buf.extend_from_slice(&stream[split..]);
            while let Some(p) = d.decode(&mut buf).expect("valid stream") {
                got.push(p);
            }
            assert!(buf.is_empty());
            assert_eq!(got, packets, "{version} split at {split}");
        }
    }
}

// ---------------------------------------------------------------------------
// Refusals.

/// Builds a packet from its first byte and body, computing the length.
fn frame(first: u8, body: &[u8]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    buf.put_u8(first);
    wire::put_var_int(&mut buf, body.len());
    buf.put_slice(body);
    buf.to_vec()
}

fn s(text: &[u8]) -> Vec<u8> {
    let mut out = (text.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(text);
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn connect_bytes(name: &[u8], level: u8, flags: u8, rest: &[u8]) -> Vec<u8> {
    frame(0x10, &cat(&[&s(name), &[level, flags, 0, 60], rest]))
}

#[track_caller]
fn refused(result: Result<Option<Packet>, DecodeError>, reason: ReasonCode) -> DecodeError {
    let err = result.expect_err("refused");
    assert_eq!(err.reason_code(), reason, "{err}");
    // Every error says what was wrong.
    assert!(!err.to_string().is_empty());
    err
}

const V4: ProtocolVersion = ProtocolVersion::V311;
const V5: ProtocolVersion = ProtocolVersion::V5;

#[test]
fn connect_refusals() {
    use ReasonCode as R;
    let cid = s(b"c");
    // Protocol name and level.
    let e = refused(
        first_decode(&connect_bytes(b"MQIsdp", 3, 2, &cid)),
        R::UnsupportedProtocolVersion,
    );
    assert_eq!(e, DecodeError::UnsupportedProtocolVersion { level: 3 });
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 6, 2, &cid)),
        R::UnsupportedProtocolVersion,
    );
    assert_eq!(e, DecodeError::UnsupportedProtocolVersion { level: 6 });
    let e = refused(
        first_decode(&connect_bytes(b"HTTP", 4, 2, &cid)),
        R::UnsupportedProtocolVersion,
    );
    assert!(matches!(e, DecodeError::InvalidProtocolName { .. }));
    // Reserved flag.
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 0b11, &cid)),
        R::MalformedPacket,
    );
    assert_eq!(e, DecodeError::ReservedConnectFlag);
    // Will QoS / retain without Will flag.
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 0b0000_1010, &cid)),
        R::MalformedPacket,
    );
    assert_eq!(e, DecodeError::WillFlagsWithoutWill);
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 5, 0b0010_0010, &cat(&[&[0], &cid]))),
        R::MalformedPacket,
    );
    assert_eq!(e, DecodeError::WillFlagsWithoutWill);
    // Will QoS 3.
    let will = cat(&[&cid, &s(b"w"), &s(b"x")]);
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 0b0001_1110, &will)),
        R::MalformedPacket,
    );
    assert_eq!(e, DecodeError::InvalidWillQoS);
    // Will topic with a wildcard.
    let will = cat(&[&cid, &s(b"w/#"), &s(b"x")]);
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 0b0000_0110, &will)),
        R::TopicNameInvalid,
    );
    assert!(matches!(e, DecodeError::InvalidTopicName { .. }));
    // Password without user name: refused on 3.1.1, allowed on 5.0.
    let pw = cat(&[&cid, &s(b"pw")]);
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 0b0100_0010, &pw)),
        R::MalformedPacket,
    );
    assert_eq!(e, DecodeError::PasswordWithoutUsername);
    let pw5 = cat(&[&[0], &cid, &s(b"pw")]);
    let Ok(Some(Packet::Connect(c))) = first_decode(&connect_bytes(b"MQTT", 5, 0b0100_0010, &pw5))
    else {
        panic!("v5 password without user name is allowed")
    };
    assert_eq!(c.password.as_deref(), Some(&b"pw"[..]));
    assert_eq!(c.username, None);
    // Trailing bytes after the payload.
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 2, &cat(&[&cid, &[9]]))),
        R::MalformedPacket,
    );
    assert!(matches!(e, DecodeError::TrailingBytes { count: 1, .. }));
    // Truncated client id.
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 2, &[0, 5, b'a'])),
        R::MalformedPacket,
    );
    assert!(matches!(
        e,
        DecodeError::Truncated {
            field: "client identifier",
            ..
        }
    ));
    // Client id with U+0000 and with a surrogate (CESU-8).
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 2, &s(b"a\0"))),
        R::MalformedPacket,
    );
    assert!(matches!(
        e,
        DecodeError::NullCharacter {
            field: "client identifier",
            at: 15,
            ..
        }
    ));
    let e = refused(
        first_decode(&connect_bytes(b"MQTT", 4, 2, &s(b"\xED\xA0\x80"))),
        R::MalformedPacket,
    );
    assert!(matches!(e, DecodeError::InvalidUtf8 { .. }));
    // CONNECT flags 0xC2 with a truncated user name.
    let e = refused(
        first_decode(&connect_bytes(
            b"MQTT",
            4,
            0xC2,
            &cat(&[&cid, &[0, 4, b'u']]),
        )),
        R::MalformedPacket,
    );
    assert!(matches!(
        e,
        DecodeError::Truncated {
            field: "user name",
            ..
        }
    ));
}

#[test]
fn connect_property_refusals() {
    use ReasonCode as R;
    let connect5 = |props: &[u8]| {
        let mut body = vec![props.len() as u8];
        body.extend_from_slice(props);
        body.extend_from_slice(&s(b"c"));
        first_decode(&connect_bytes(b"MQTT", 5, 2, &body))
    };
    assert!(connect5(&[]).unwrap().is_some());
    // Receive maximum 0.
    let e = refused(connect5(&[0x21, 0, 0]), R::ProtocolError);
    assert!(matches!(
        e,
        DecodeError::InvalidPropertyValue {
            property: "Receive Maximum",
            value: 0,
            ..
        }
    ));
    // Maximum packet size 0.
    let e = refused(connect5(&[0x27, 0, 0, 0, 0]), R::ProtocolError);
    assert!(matches!(
        e,
        DecodeError::InvalidPropertyValue {
            property: "Maximum Packet Size",
            ..
        }
    ));
    // Duplicate session expiry.
    let e = refused(
        connect5(&[0x11, 0, 0, 0, 1, 0x11, 0, 0, 0, 2]),
        R::ProtocolError,
    );
    assert!(matches!(
        e,
        DecodeError::DuplicateProperty {
            property: "Session Expiry Interval",
            ..
        }
    ));
    // Request problem information 2.
    let e = refused(connect5(&[0x17, 2]), R::ProtocolError);
    assert!(matches!(
        e,
        DecodeError::InvalidPropertyValue { value: 2, .. }
    ));
    // A PUBLISH-only property in CONNECT; an undefined identifier.
    let e = refused(connect5(&[0x23, 0, 1]), R::MalformedPacket);
    assert!(matches!(e, DecodeError::InvalidPropertyId { id: 0x23, .. }));
    let e = refused(connect5(&[0x7F, 0]), R::MalformedPacket);
    assert!(matches!(e, DecodeError::InvalidPropertyId { id: 0x7F, .. }));
    // Authentication data without a method.
    let e = refused(connect5(&[0x16, 0, 1, 9]), R::ProtocolError);
    assert!(matches!(e, DecodeError::AuthDataWithoutMethod { .. }));
    // User properties repeat freely, in order.
    let Ok(Some(Packet::Connect(c))) =
        connect5(&[0x26, 0, 1, b'a', 0, 1, b'1', 0x26, 0, 1, b'a', 0, 1, b'2'])
    else {
        panic!("user properties repeat")
    };
    assert_eq!(
        c.properties.user_properties,
        vec![user("a", "1"), user("a", "2")]
    );
    // Property length beyond the packet.
    let e = refused(connect5(&[0x11, 0, 0]), R::MalformedPacket);
    assert!(matches!(e, DecodeError::Truncated { .. }));
}

#[test]
fn first_packet_and_direction_refusals() {
    use ReasonCode as R;
    // Anything before CONNECT.
    let e = refused(first_decode(&[0xC0, 0x00]), R::ProtocolError);
    assert!(matches!(
        e,
        DecodeError::UnexpectedPacket {
            packet: PacketType::PingReq,
            ..
        }
    ));
    // A second CONNECT.
    let mut d = server_after_connect(V4);
    let mut buf = BytesMut::from(V311_CONNECT);
    let e = refused(d.decode(&mut buf), R::ProtocolError);
    assert!(matches!(
        e,
        DecodeError::UnexpectedPacket {
            packet: PacketType::Connect,
            ..
        }
    ));
    // Server-only packets from a client, client-only to a client.
    let e = refused(server_decode(V5, &[0xD0, 0x00]), R::ProtocolError);
    assert!(matches!(
        e,
        DecodeError::UnexpectedPacket {
            packet: PacketType::PingResp,
            ..
        }
    ));
    let e = refused(client_decode(V5, &[0xC0, 0x00]), R::ProtocolError);
    assert!(matches!(
        e,
        DecodeError::UnexpectedPacket {
            packet: PacketType::PingReq,
            ..
        }
    ));
    // Reserved type 0.
    let e = refused(server_decode(V5, &[0x00, 0x00]), R::MalformedPacket);
    assert_eq!(e, DecodeError::ReservedPacketType { nibble: 0, byte: 0 });
    // An HTTP request is refused at its first byte.
    let e = refused(first_decode(b"GET / HTTP/1.1\r\n"), R::MalformedPacket);
    assert!(matches!(e, DecodeError::InvalidFixedHeaderFlags { .. }));
}

#[test]
fn fixed_header_flag_refusals() {
    use ReasonCode as R;
    // PUBREL, SUBSCRIBE, UNSUBSCRIBE must carry 0010.
    for (first, packet) in [
        (0x60u8, PacketType::PubRel),
        (0x80, PacketType::Subscribe),
        (0xA0, PacketType::Unsubscribe),
    ] {
        for flags in [0u8, 1, 3, 0xF] {
            let e = refused(
                server_decode(V5, &[first | flags, 0x00]),
                R::MalformedPacket,
            );
            assert_eq!(e, DecodeError::InvalidFixedHeaderFlags { packet, flags });
        }
    }
    // Everything else must carry 0000.
    for first in [0x40u8, 0x50, 0x70, 0xC0, 0xE0, 0xF0] {
        let e = refused(
            server_decode(V5, &[first | 0x2, 0x02, 0, 1]),
            R::MalformedPacket,
        );
        assert!(matches!(
            e,
            DecodeError::InvalidFixedHeaderFlags { flags: 2, .. }
        ));
    }
    for first in [0x20u8, 0x90, 0xB0, 0xD0] {
        let e = refused(
            client_decode(V4, &[first | 0x1, 0x02, 0, 1]),
            R::MalformedPacket,
        );
        assert!(matches!(
            e,
            DecodeError::InvalidFixedHeaderFlags { flags: 1, .. }
        ));
    }
    let e = refused(first_decode(&[0x11, 0x00]), R::MalformedPacket);
    assert!(matches!(
        e,
        DecodeError::InvalidFixedHeaderFlags {
            packet: PacketType::Connect,
            ..
        }
    ));
}

#[test]
fn publish_refusals() {
    use ReasonCode as R;
    let topic = s(b"a/b");
    // QoS 3.
    let e = refused(
        server_decode(V5, &frame(0x36, &cat(&[&topic, &[0, 1, 0]]))),
        R::MalformedPacket,
    );
    assert_eq!(
        e,
        DecodeError::InvalidQoS {
            packet: PacketType::Publish
        }
    );
    // DUP on QoS 0.
    let e = refused(server_decode(V4, &frame(0x38, &topic)), R::ProtocolError);
    assert_eq!(e, DecodeError::DupWithQoS0);
    // Packet identifier 0 on QoS 1.
    let e = refused(
        server_decode(V4, &frame(0x32, &cat(&[&topic, &[0, 0]]))),
        R::ProtocolError,
    );
    assert_eq!(
        e,
        DecodeError::ZeroPacketId {
            packet: PacketType::Publish
        }
    );
    // Wildcards in a topic name.
    for bad in [&b"a/+"[..], b"#", b"a/#"] {
        let e = refused(
            server_decode(V4, &frame(0x30, &s(bad))),
            R::TopicNameInvalid,
        );
        assert!(matches!(e, DecodeError::InvalidTopicName { .. }));
    }
    // Empty topic: never on 3.1.1, only with an alias on 5.0.
    let e = refused(server_decode(V4, &frame(0x30, &s(b""))), R::ProtocolError);
    assert_eq!(e, DecodeError::EmptyTopic);
    let e = refused(
        server_decode(V5, &frame(0x30, &cat(&[&s(b""), &[0]]))),
        R::ProtocolError,
    );
    assert_eq!(e, DecodeError::EmptyTopic);
    assert!(
        server_decode(V5, &frame(0x30, &cat(&[&s(b""), &[3, 0x23, 0, 1]])))
            .unwrap()
            .is_some()
    );
    // Topic alias 0.
    let e = refused(
        server_decode(V5, &frame(0x30, &cat(&[&topic, &[3, 0x23, 0, 0]]))),
        R::TopicAliasInvalid,
    );
    assert_eq!(e, DecodeError::TopicAliasZero);
    // Subscription identifier from a client; 0 from a server.
    let with_sub_id = frame(0x30, &cat(&[&topic, &[2, 0x0B, 5]]));
    let e = refused(server_decode(V5, &with_sub_id), R::ProtocolError);
    assert_eq!(e, DecodeError::SubscriptionIdFromClient);
    assert!(client_decode(V5, &with_sub_id).unwrap().is_some());
    let e = refused(
        client_decode(V5, &frame(0x30, &cat(&[&topic, &[2, 0x0B, 0]]))),
        R::ProtocolError,
    );
    assert!(matches!(
        e,
        DecodeError::InvalidPropertyValue {
            property: "Subscription Identifier",
            ..
        }
    ));
    // Several subscription identifiers towards a client are kept in order.
    let Ok(Some(Packet::Publish(p))) = client_decode(
        V5,
        &frame(0x30, &cat(&[&topic, &[5, 0x0B, 5, 0x0B, 0x80, 0x01]])),
    ) else {
        panic!()
    };
    assert_eq!(p.properties.subscription_identifiers, vec![5, 128]);
    // Duplicate topic alias; payload format 2; a CONNECT-only property.
    let e = refused(
        server_decode(
            V5,
            &frame(0x30, &cat(&[&topic, &[6, 0x23, 0, 1, 0x23, 0, 2]])),
        ),
        R::ProtocolError,
    );
    assert!(matches!(
        e,
        DecodeError::DuplicateProperty {
            property: "Topic Alias",
            ..
        }
    ));
    let e = refused(
        server_decode(V5, &frame(0x30, &cat(&[&topic, &[2, 0x01, 2]]))),
        R::ProtocolError,
    );
    assert!(matches!(
        e,
        DecodeError::InvalidPropertyValue {
            property: "Payload Format Indicator",
            ..
        }
    ));
    let e = refused(
        server_decode(V5, &frame(0x30, &cat(&[&topic, &[5, 0x11, 0, 0, 0, 1]]))),
        R::MalformedPacket,
    );
    assert!(matches!(e, DecodeError::InvalidPropertyId { id: 0x11, .. }));
    // A response topic with a wildcard.
    let e = refused(
        server_decode(V5, &frame(0x30, &cat(&[&topic, &[4, 0x08], &s(b"#")]))),
        R::ProtocolError,
    );
    assert!(matches!(e, DecodeError::InvalidResponseTopic { .. }));
    // A subscription identifier too long for a variable byte integer.
    let e = refused(
        client_decode(
            V5,
            &frame(0x30, &cat(&[&topic, &[5, 0x0B, 0xFF, 0xFF, 0xFF, 0xFF]])),
        ),
        R::MalformedPacket,
    );
    assert!(matches!(
        e,
        DecodeError::MalformedVariableByteInteger { .. }
    ));
    // Invalid UTF-8 in the topic, with its byte offset.
    let e = refused(
        server_decode(V4, &frame(0x30, &s(b"a\xFFb"))),
        R::MalformedPacket,
    );
    assert!(matches!(
        e,
        DecodeError::InvalidUtf8 {
            field: "topic name",
            at: 5,
            ..
        }
    ));
    // A body shorter than the topic it announces.
    let e = refused(
        server_decode(V4, &frame(0x30, &[0, 9, b'a'])),
        R::MalformedPacket,
    );
    assert!(matches!(
        e,
        DecodeError::Truncated {
            field: "topic name",
            ..
        }
    ));
}

/// The short-ack path takes exactly what the full decoder reads as a
/// success acknowledgement without properties, on both sides and in both
/// versions, and leaves everything else (refusals included) to it.
#[test]
fn short_acks_agree_with_the_full_decoder() {
    let decoders = || {
        [
            server_after_connect(V4),
            server_after_connect(V5),
            FrameDecoder::client(MAX, V4),
            FrameDecoder::client(MAX, V5),
            FrameDecoder::server(MAX),
            FrameDecoder::server(3),
        ]
    };
    for first in 0..=255u8 {
        for len in [0u8, 1, 2, 3] {
            for id in [0u16, 1, 0x1234, u16::MAX] {
                let [high, low] = id.to_be_bytes();
                let bytes = [first, len, high, low, 0xE0];
                for (mut short, mut full) in decoders().into_iter().zip(decoders()) {
                    let mut buf = BytesMut::from(&bytes[..]);
                    let taken = short.decode_short_ack(&mut buf);
                    let mut whole = BytesMut::from(&bytes[..]);
                    match taken {
                        Some(short) => {
                            assert_eq!(buf.len(), 1, "{bytes:02X?}");
                            let packet = full.decode(&mut whole).expect("valid").expect("whole");
                            assert_eq!(packet.packet_type(), short.packet_type());
                            let ack = match packet {
                                Packet::PubAck(a)
                                | Packet::PubRec(a)
                                | Packet::PubRel(a)
                                | Packet::PubComp(a) => a,
                                other => panic!("{other:?}"),
                            };
                            assert_eq!(ack, PubAck::new(short.packet_id()));
                            assert_eq!(whole, buf);
                        }
                        None => {
                            assert_eq!(buf.len(), bytes.len(), "{bytes:02X?}");
                            // Whatever the full decoder makes of it, it is
                            // no short acknowledgement.
                            let short_form = matches!(
                                full.decode(&mut whole),
                                Ok(Some(Packet::PubAck(ref a) | Packet::PubRec(ref a) | Packet::PubRel(ref a) | Packet::PubComp(ref a)))
                                    if *a == PubAck::new(a.packet_id) && whole.len() == 1
                            );
                            assert!(!short_form, "{bytes:02X?} not taken");
                        }
                    }
                }
            }
        }
    }
}

/// `encode_ack` writes what `encode_within` writes for the packet, and
/// refuses what it refuses.
#[test]
fn acks_encode_as_their_packets() {
    let reasons = [
        ReasonCode::Success,
        ReasonCode::NoMatchingSubscribers,
        ReasonCode::PacketIdentifierNotFound,
        ReasonCode::QuotaExceeded,
    ];
    for version in [V4, V5] {
        for id in [0u16, 1, 0x1234, u16::MAX] {
            for reason in reasons {
                for max in [3u32, 4, 5, MAX] {
                    let acks = [
                        (Ack::PubAck(id), Packet::PubAck as fn(PubAck) -> Packet),
                        (Ack::PubRec(id), Packet::PubRec),
                        (Ack::PubRel(id), Packet::PubRel),
                        (Ack::PubComp(id), Packet::PubComp),
                    ];
                    for (ack, make) in acks {
                        let packet = make(PubAck {
                            reason,
                            ..PubAck::new(id)
                        });
                        let mut want = BytesMut::new();
                        let wanted = encode_within(&packet, version, max, &mut want);
                        let mut got = BytesMut::new();
                        let result = encode_ack(ack, reason, version, max, &mut got);
                        assert_eq!(
                            result.is_ok(),
                            wanted.is_ok(),
                            "{packet:?} {version:?} {max}"
                        );
                        assert_eq!(got, want, "{packet:?} {version:?}");
                        assert_eq!(ack.packet_type(), packet.packet_type());
                    }
                }
            }
        }
    }
}

#[test]
fn ack_refusals() {
    use ReasonCode as R;
    let e = refused(server_decode(V4, &[0x40, 0x02, 0, 0]), R::ProtocolError);
    assert_eq!(
        e,
        DecodeError::ZeroPacketId {
            packet: PacketType::PubAck
        }
    );
    let e = refused(
        server_decode(V4, &[0x40, 0x03, 0, 1, 0]),
        R::MalformedPacket,
    );
    assert!(matches!(
        e,
        DecodeError::TrailingBytes {
            count: 1,
            at: 4,
            ..
        }
    ));
    let e = refused(server_decode(V4, &[0x40, 0x01, 0]), R::MalformedPacket);
    assert!(matches!(e, DecodeError::Truncated { .. }));
    // A reason code not defined for PUBREL.
    let e = refused(
        server_decode(V5, &[0x62, 0x03, 0, 1, 0x10]),
        R::MalformedPacket,
    );
    assert_eq!(
        e,
        DecodeError::InvalidReasonCode {
            packet: PacketType::PubRel,
            code: 0x10,
            at: 4
        }
    );
    // A property PUBACK may not carry.
    let e = refused(
        server_decode(V5, &[0x40, 0x06, 0, 1, 0, 2, 0x23, 0]),
        R::MalformedPacket,
    );
    assert!(matches!(e, DecodeError::InvalidPropertyId { .. }));
    // Duplicate reason string.
    let e = refused(
        server_decode(
            V5,
            &frame(0x40, &[0, 1, 0, 8, 0x1F, 0, 1, b'a', 0x1F, 0, 1, b'b']),
        ),
        R::ProtocolError,
    );
    assert!(matches!(
        e,
        DecodeError::DuplicateProperty {
            property: "Reason String",
            ..
        }
    ));
    // PINGREQ with a body; DISCONNECT with a body on 3.1.1.
    let e = refused(server_decode(V5, &[0xC0, 0x01, 0]), R::MalformedPacket);
    assert!(matches!(e, DecodeError::TrailingBytes { .. }));
    let e = refused(server_decode(V4, &[0xE0, 0x01, 0]), R::MalformedPacket);
    assert!(matches!(e, DecodeError::TrailingBytes { .. }));
    // DISCONNECT with a reason only a CONNACK has; AUTH with a SUBACK code.
    let e = refused(server_decode(V5, &[0xE0, 0x01, 0x84]), R::MalformedPacket);
    assert!(matches!(
        e,
        DecodeError::InvalidReasonCode { code: 0x84, .. }
    ));
    let e = refused(server_decode(V5, &[0xF0, 0x01, 0x01]), R::MalformedPacket);
    assert!(matches!(
        e,
        DecodeError::InvalidReasonCode { code: 0x01, .. }
    ));
    // CONNACK reserved flags and an unknown 3.1.1 return code.
    let e = refused(
        client_decode(V4, &[0x20, 0x02, 0x02, 0x00]),
        R::MalformedPacket,
    );
    assert!(matches!(e, DecodeError::ReservedBits { value: 2, .. }));
    let e = refused(
        client_decode(V4, &[0x20, 0x02, 0x00, 0x06]),
        R::MalformedPacket,
    );
    assert!(matches!(e, DecodeError::InvalidReasonCode { code: 6, .. }));
    // CONNACK maximum QoS 2 is not a value a server may send.
    let e = refused(
        client_decode(V5, &[0x20, 0x05, 0, 0, 2, 0x24, 2]),
        R::ProtocolError,
    );
    assert!(matches!(
        e,
        DecodeError::InvalidPropertyValue {
            property: "Maximum QoS",
            ..
        }
    ));
    // SUBACK with a 3.1.1 code that does not exist.
    let e = refused(
        client_decode(V4, &[0x90, 0x03, 0, 1, 0x03]),
        R::MalformedPacket,
    );
    assert!(matches!(e, DecodeError::InvalidReasonCode { code: 3, .. }));
}

#[test]
fn subscribe_refusals() {
    use ReasonCode as R;
    let sub = |version, filters: &[u8], props: &[u8]| {
        let body = match version {
            ProtocolVersion::V5 => cat(&[&[0, 1, props.len() as u8], props, filters]),
            ProtocolVersion::V311 => cat(&[&[0, 1], filters]),
        };
        server_decode(version, &frame(0x82, &body))
    };
    let f = |filter: &[u8], options: u8| cat(&[&s(filter), &[options]]);
    assert!(sub(V5, &f(b"a/#", 0x2E), &[]).unwrap().is_some());
    // No filters.
    for v in [V4, V5] {
        let e = refused(sub(v, &[], &[]), R::ProtocolError);
        assert_eq!(
            e,
            DecodeError::NoTopicFilters {
                packet: PacketType::Subscribe
            }
        );
    }
    // Reserved option bits: 6-7 on 5.0, 2-7 on 3.1.1.
    let e = refused(sub(V5, &f(b"a", 0x40), &[]), R::MalformedPacket);
    assert!(matches!(
        e,
        DecodeError::ReservedSubscriptionOptions { options: 0x40, .. }
    ));
    let e = refused(sub(V4, &f(b"a", 0x04), &[]), R::MalformedPacket);
    assert!(matches!(
        e,
        DecodeError::ReservedSubscriptionOptions { options: 0x04, .. }
    ));
    // QoS 3, retain handling 3.
    let e = refused(sub(V4, &f(b"a", 0x03), &[]), R::MalformedPacket);
    assert!(matches!(e, DecodeError::InvalidQoS { .. }));
    let e = refused(sub(V5, &f(b"a", 0x30), &[]), R::ProtocolError);
    assert!(matches!(e, DecodeError::InvalidRetainHandling { .. }));
    // Malformed filters.
    for bad in [&b"a/#/b"[..], b"a+", b"", b"sport/tennis#"] {
        let e = refused(sub(V4, &f(bad, 0), &[]), R::TopicFilterInvalid);
        assert!(matches!(e, DecodeError::InvalidTopicFilter { .. }), "{e}");
    }
    // A broken shared subscription that is no well-formed filter either.
    for bad in [&b"$share/g/a#"[..], b"$share/g+/a"] {
        let e = refused(sub(V5, &f(bad, 0), &[]), R::TopicFilterInvalid);
        assert!(
            matches!(e, DecodeError::InvalidSharedSubscription { .. }),
            "{e}"
        );
    }
    // A broken shared subscription that is a well-formed filter decodes:
    // the server refuses that filter alone in SUBACK.
    for form in [&b"$share//a"[..], b"$share/g"] {
        assert!(
            matches!(sub(V5, &f(form, 0), &[]), Ok(Some(Packet::Subscribe(_)))),
            "{form:?}"
        );
    }
    // No Local on a shared subscription.
    let e = refused(sub(V5, &f(b"$share/g/a", 0x04), &[]), R::ProtocolError);
    assert!(matches!(e, DecodeError::SharedSubscriptionNoLocal { .. }));
    // Subscription identifier 0, twice, or past the VBI range.
    let e = refused(sub(V5, &f(b"a", 0), &[0x0B, 0]), R::ProtocolError);
    assert!(matches!(
        e,
        DecodeError::InvalidPropertyValue {
            property: "Subscription Identifier",
            ..
        }
    ));
    let e = refused(sub(V5, &f(b"a", 0), &[0x0B, 1, 0x0B, 2]), R::ProtocolError);
    assert!(matches!(e, DecodeError::DuplicateProperty { .. }));
    let e = refused(
        sub(V5, &f(b"a", 0), &[0x0B, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
        R::MalformedPacket,
    );
    assert!(matches!(
        e,
        DecodeError::MalformedVariableByteInteger { .. }
    ));
    // Packet identifier 0.
    let e = refused(
        server_decode(V4, &frame(0x82, &cat(&[&[0, 0], &f(b"a", 0)]))),
        R::ProtocolError,
    );
    assert!(matches!(e, DecodeError::ZeroPacketId { .. }));
    // A filter without its options byte.
    let e = refused(sub(V4, &s(b"a"), &[]), R::MalformedPacket);
    assert!(matches!(
        e,
        DecodeError::Truncated {
            field: "subscription options",
            ..
        }
    ));
    // UNSUBSCRIBE: no filters, bad filter.
    let e = refused(server_decode(V4, &frame(0xA2, &[0, 1])), R::ProtocolError);
    assert_eq!(
        e,
        DecodeError::NoTopicFilters {
            packet: PacketType::Unsubscribe
        }
    );
    let e = refused(
        server_decode(V5, &frame(0xA2, &cat(&[&[0, 1, 0], &s(b"#/a")]))),
        R::TopicFilterInvalid,
    );
    assert!(matches!(e, DecodeError::InvalidTopicFilter { .. }));
}

// ---------------------------------------------------------------------------
// Encoding limits.

#[test]
fn encode_within_drops_diagnostics_first() {
    let mut ack = PubAck::new(1);
    ack.reason = ReasonCode::QuotaExceeded;
    ack.properties.reason_string = Some("x".repeat(100));
    ack.properties.user_properties = vec![user("k", "v")];
    let packet = Packet::PubAck(ack);
    let full = encoded_len(&packet, V5).unwrap();
    let mut buf = BytesMut::new();
    assert_eq!(encode_within(&packet, V5, full as u32, &mut buf), Ok(full));
    assert_eq!(buf.len(), full);
    let mut buf = BytesMut::new();
    assert_eq!(encode_within(&packet, V5, 10, &mut buf), Ok(5));
    assert_eq!(&buf[..], &[0x40, 0x03, 0x00, 0x01, 0x97]);
    // Too small even stripped: nothing written.
    let mut buf = BytesMut::new();
    assert!(matches!(
        encode_within(&packet, V5, 4, &mut buf),
        Err(EncodeError::PacketTooLarge {
            size: 5,
            max: 4,
            ..
        })
    ));
    assert!(buf.is_empty());
    // A PUBLISH is never cut down: the caller discards it.
    let publish = Packet::Publish(publish_with_body(100));
    assert!(matches!(
        encode_within(&publish, V5, 50, &mut buf),
        Err(EncodeError::PacketTooLarge { .. })
    ));
    assert!(buf.is_empty());
}

#[test]
fn encode_refusals() {
    let mut p = publish_with_body(10);
    p.qos = QoS::AtLeastOnce;
    assert_eq!(
        encode(&Packet::Publish(p.clone()), V4, &mut BytesMut::new()),
        Err(EncodeError::ZeroPacketId {
            packet: PacketType::Publish
        })
    );
    p.packet_id = 1;
    p.topic = ByteStr::from("t".repeat(70_000));
    assert!(matches!(
        encode(&Packet::Publish(p.clone()), V4, &mut BytesMut::new()),
        Err(EncodeError::FieldTooLong {
            field: "topic name",
            ..
        })
    ));
    p.topic = ByteStr::from_static("t");
    p.properties.subscription_identifiers = vec![MAX_VARIABLE_BYTE_INTEGER + 1];
    assert!(matches!(
        encode(&Packet::Publish(p), V5, &mut BytesMut::new()),
        Err(EncodeError::FieldTooLong {
            field: "Subscription Identifier",
            ..
        })
    ));
}

// ---------------------------------------------------------------------------
// Property tests.

mod generated {
    use super::*;
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        "[^\u{0}]{0,12}"
    }

    fn topic_name() -> impl Strategy<Value = String> {
        "[a-z0-9$/ é]{1,12}"
    }

    fn level() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z0-9 ]{0,5}", Just("+".to_owned())]
    }

    fn topic_filter() -> impl Strategy<Value = String> {
        (vec(level(), 1..4), any::<bool>(), any::<bool>()).prop_map(|(levels, hash, share)| {
            let mut f = levels.join("/");
            if f.is_empty() {
                f.push('e');
            }
            if hash {
                f.push_str("/#");
            }
            if share {
                f = format!("$share/grp/{f}");
            }
            f
        })
    }

    fn bytes_s() -> impl Strategy<Value = Bytes> {
        vec(any::<u8>(), 0..16).prop_map(Bytes::from)
    }

    fn users() -> impl Strategy<Value = UserProperties> {
        vec((text(), text()), 0..3)
    }

    fn qos() -> impl Strategy<Value = QoS> {
        prop_oneof![
            Just(QoS::AtMostOnce),
            Just(QoS::AtLeastOnce),
            Just(QoS::ExactlyOnce)
        ]
    }

    fn reason_in(packet: PacketType) -> impl Strategy<Value = ReasonCode> {
        let codes: Vec<ReasonCode> = (0..=255u8)
            .filter_map(ReasonCode::from_u8)
            .filter(|c| c.allowed_in(packet))
            .collect();
        proptest::sample::select(codes)
    }

    fn payload_format() -> impl Strategy<Value = Option<PayloadFormat>> {
        option::of(prop_oneof![
            Just(PayloadFormat::Unspecified),
            Just(PayloadFormat::Utf8)
        ])
    }

    fn ack_props() -> impl Strategy<Value = AckProperties> {
        (option::of(text()), users()).prop_map(|(reason_string, user_properties)| AckProperties {
            reason_string,
            user_properties,
        })
    }

    fn publish(v5: bool, to_client: bool) -> impl Strategy<Value = Publish> {
        (
            (
                any::<bool>(),
                qos(),
                any::<bool>(),
                topic_name(),
                1..=u16::MAX,
            ),
            (
                payload_format(),
                option::of(any::<u32>()),
                option::of(1..=u16::MAX),
                option::of(topic_name()),
                option::of(bytes_s()),
                users(),
                vec(1..=MAX_VARIABLE_BYTE_INTEGER, 0..3),
                option::of(text()),
            ),
            bytes_s(),
        )
            .prop_map(move |((dup, qos, retain, topic, id), props, payload)| {
                let properties = if v5 {
                    PublishProperties {
                        payload_format_indicator: props.0,
                        message_expiry_interval: props.1,
                        topic_alias: props.2,
                        response_topic: props.3.map(ByteStr::from),
                        correlation_data: props.4,
                        user_properties: props.5,
                        subscription_identifiers: if to_client { props.6 } else { Vec::new() },
                        content_type: props.7.map(ByteStr::from),
                    }
                } else {
                    PublishProperties::default()
                };
                let qos0 = qos == QoS::AtMostOnce;
                Publish {
                    dup: dup && !qos0,
                    qos,
                    retain,
                    topic: ByteStr::from(topic),
                    packet_id: if qos0 { 0 } else { id },
                    properties,
                    payload,
                }
            })
    }

    fn connect(v5: bool) -> impl Strategy<Value = Connect> {
        (
            (
                any::<bool>(),
                any::<u16>(),
                text(),
                option::of(text()),
                option::of(bytes_s()),
            ),
            option::of((
                topic_name(),
                bytes_s(),
                qos(),
                any::<bool>(),
                option::of(any::<u32>()),
                users(),
            )),
            (
                option::of(any::<u32>()),
                option::of(1..=u16::MAX),
                option::of(1..=u32::MAX),
                option::of(any::<u16>()),
                option::of(any::<bool>()),
                option::of(any::<bool>()),
                users(),
                option::of((text(), option::of(bytes_s()))),
            ),
        )
            .prop_map(
                move |((clean_start, keep_alive, client_id, username, password), will, p)| {
                    let (authentication_method, authentication_data) = match p.7 {
                        Some((m, d)) => (Some(m), d),
                        None => (None, None),
                    };
                    Connect {
                        protocol: if v5 {
                            ProtocolVersion::V5
                        } else {
                            ProtocolVersion::V311
                        },
                        clean_start,
                        keep_alive,
                        client_id,
                        // 3.1.1 has no password without a user name.
                        username: if !v5 && password.is_some() && username.is_none() {
                            Some(String::new())
                        } else {
                            username
                        },
                        password,
                        will: will.map(|(topic, payload, qos, retain, delay, user_properties)| {
                            LastWill {
                                topic: ByteStr::from(topic),
                                payload,
                                qos,
                                retain,
                                properties: if v5 {
                                    WillProperties {
                                        will_delay_interval: delay,
                                        user_properties,
                                        ..WillProperties::default()
                                    }
                                } else {
                                    WillProperties::default()
                                },
                            }
                        }),
                        properties: if v5 {
                            ConnectProperties {
                                session_expiry_interval: p.0,
                                receive_maximum: p.1,
                                maximum_packet_size: p.2,
                                topic_alias_maximum: p.3,
                                request_response_information: p.4,
                                request_problem_information: p.5,
                                user_properties: p.6,
                                authentication_method,
                                authentication_data,
                            }
                        } else {
                            ConnectProperties::default()
                        },
                    }
                },
            )
    }

    fn subscribe(v5: bool) -> impl Strategy<Value = Subscribe> {
        (
            1..=u16::MAX,
            vec(
                (topic_filter(), qos(), any::<bool>(), any::<bool>(), 0..3u8),
                1..4,
            ),
            option::of(1..=MAX_VARIABLE_BYTE_INTEGER),
            users(),
        )
            .prop_map(
                move |(packet_id, filters, sub_id, user_properties)| Subscribe {
                    packet_id,
                    filters: filters
                        .into_iter()
                        .map(|(filter, qos, nl, rap, rh)| {
                            let shared = topic::split_shared(&filter).is_some();
                            SubscribeFilter {
                                options: if v5 {
                                    SubscriptionOptions {
                                        qos,
                                        no_local: nl && !shared,
                                        retain_as_published: rap,
                                        retain_handling: RetainHandling::from_u8(rh)
                                            .unwrap_or_default(),
                                    }
                                } else {
                                    SubscriptionOptions {
                                        qos,
                                        ..SubscriptionOptions::default()
                                    }
                                },
                                filter,
                            }
                        })
                        .collect(),
                    properties: if v5 {
                        SubscribeProperties {
                            subscription_identifier: sub_id,
                            user_properties,
                        }
                    } else {
                        SubscribeProperties::default()
                    },
                },
            )
    }

    fn pub_ack(kind: PacketType, v5: bool) -> impl Strategy<Value = PubAck> {
        (1..=u16::MAX, reason_in(kind), ack_props()).prop_map(
            move |(packet_id, reason, properties)| {
                if v5 {
                    PubAck {
                        packet_id,
                        reason,
                        properties,
                    }
                } else {
                    PubAck::new(packet_id)
                }
            },
        )
    }

    /// Packets a client sends, as a server receives them.
    fn client_packet(v5: bool) -> impl Strategy<Value = Packet> {
        let unsubscribe = (1..=u16::MAX, vec(topic_filter(), 1..4), users()).prop_map(
            move |(packet_id, filters, u)| {
                Packet::Unsubscribe(Unsubscribe {
                    packet_id,
                    filters,
                    properties: UnsubscribeProperties {
                        user_properties: if v5 { u } else { Vec::new() },
                    },
                })
            },
        );
        let disconnect = (
            reason_in(PacketType::Disconnect),
            option::of(any::<u32>()),
            option::of(text()),
            users(),
        )
            .prop_map(move |(reason, sei, rs, u)| {
                Packet::Disconnect(if v5 {
                    Disconnect {
                        reason,
                        properties: DisconnectProperties {
                            session_expiry_interval: sei,
                            reason_string: rs,
                            user_properties: u,
                            server_reference: None,
                        },
                    }
                } else {
                    Disconnect::new(ReasonCode::NORMAL_DISCONNECTION)
                })
            });
        prop_oneof![
            publish(v5, false).prop_map(Packet::Publish),
            pub_ack(PacketType::PubAck, v5).prop_map(Packet::PubAck),
            pub_ack(PacketType::PubRec, v5).prop_map(Packet::PubRec),
            pub_ack(PacketType::PubRel, v5).prop_map(Packet::PubRel),
            pub_ack(PacketType::PubComp, v5).prop_map(Packet::PubComp),
            subscribe(v5).prop_map(Packet::Subscribe),
            unsubscribe,
            Just(Packet::PingReq),
            disconnect,
        ]
    }

    /// Packets a server sends, as a client receives them.
    fn server_packet(v5: bool) -> impl Strategy<Value = Packet> {
        let connack = (
            any::<bool>(),
            reason_in(PacketType::ConnAck),
            option::of(any::<u32>()),
            option::of(1..=u16::MAX),
            option::of(prop_oneof![Just(QoS::AtMostOnce), Just(QoS::AtLeastOnce)]),
            option::of(text()),
            users(),
        )
            .prop_map(move |(sp, reason, sei, rm, mq, aci, u)| {
                if v5 {
                    ConnAck {
                        session_present: sp,
                        reason,
                        properties: ConnAckProperties {
                            session_expiry_interval: sei,
                            receive_maximum: rm,
                            maximum_qos: mq,
                            assigned_client_identifier: aci,
                            user_properties: u,
                            ..ConnAckProperties::default()
                        },
                    }
                } else {
                    ConnAck {
                        session_present: sp,
                        reason: ReasonCode::from_v311_connack(reason.to_v311_connack())
                            .unwrap_or_default(),
                        properties: ConnAckProperties::default(),
                    }
                }
            });
        let suback = (
            1..=u16::MAX,
            vec(reason_in(PacketType::SubAck), 1..4),
            ack_props(),
        )
            .prop_map(move |(packet_id, reasons, properties)| {
                if v5 {
                    SubAck {
                        packet_id,
                        reasons,
                        properties,
                    }
                } else {
                    SubAck {
                        packet_id,
                        reasons: reasons
                            .into_iter()
                            .map(|r| {
                                ReasonCode::from_v311_suback(r.to_v311_suback()).unwrap_or_default()
                            })
                            .collect(),
                        properties: AckProperties::default(),
                    }
                }
            });
        let unsuback = (
            1..=u16::MAX,
            vec(reason_in(PacketType::UnsubAck), 1..4),
            ack_props(),
        )
            .prop_map(move |(packet_id, reasons, properties)| {
                if v5 {
                    UnsubAck {
                        packet_id,
                        reasons,
                        properties,
                    }
                } else {
                    UnsubAck {
                        packet_id,
                        reasons: Vec::new(),
                        properties: AckProperties::default(),
                    }
                }
            });
        prop_oneof![
            connack.prop_map(Packet::ConnAck),
            publish(v5, true).prop_map(Packet::Publish),
            suback.prop_map(Packet::SubAck),
            unsuback.prop_map(Packet::UnsubAck),
            Just(Packet::PingResp),
        ]
    }

    fn auth() -> impl Strategy<Value = Packet> {
        (
            reason_in(PacketType::Auth),
            option::of((text(), option::of(bytes_s()))),
            option::of(text()),
            users(),
        )
            .prop_map(|(reason, method, reason_string, user_properties)| {
                let (authentication_method, authentication_data) = match method {
                    Some((m, d)) => (Some(m), d),
                    None => (None, None),
                };
                Packet::Auth(Auth {
                    reason,
                    properties: AuthProperties {
                        authentication_method,
                        authentication_data,
                        reason_string,
                        user_properties,
                    },
                })
            })
    }

    /// Feeds `bytes` to a decoder until it stops; must never panic, and
    /// whatever decodes must re-encode to `encoded_len` bytes that decode to
    /// the same packet (the fuzz target's model check).
    fn drain(mut d: FrameDecoder, bytes: &[u8]) {
        let mut buf = BytesMut::from(bytes);
        loop {
            match d.decode(&mut buf) {
                Ok(Some(packet)) => {
                    let version = d.version().expect("known once a packet decoded");
                    let mut out = enc(&packet, version);
                    let state = match packet {
                        Packet::Connect(_) => None,
                        _ => Some(version),
                    };
                    let mut again = FrameDecoder::new(d.role(), MAX, state);
                    assert_eq!(again.decode(&mut out), Ok(Some(packet)));
                    assert!(out.is_empty());
                }
                Ok(None) => break,
                Err(e) => {
                    assert!(e.reason_code().is_error());
                    break;
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn v5_client_packets_round_trip(packet in client_packet(true)) {
            round_trip(&packet, V5);
        }

        #[test]
        fn v311_client_packets_round_trip(packet in client_packet(false)) {
            round_trip(&packet, V4);
        }

        #[test]
        fn v5_server_packets_round_trip(packet in server_packet(true)) {
            round_trip(&packet, V5);
        }

        #[test]
        fn v311_server_packets_round_trip(packet in server_packet(false)) {
            round_trip(&packet, V4);
        }

        /// `publish_len` measures from borrowed parts what `encode` writes
        /// for the packet built from them, the delivery's subscription
        /// identifiers added to the message's own.
        #[test]
        fn publish_len_is_the_written_length(
            (v5, publish) in any::<bool>().prop_flat_map(|v5| (Just(v5), publish(v5, true))),
            split in any::<prop::sample::Index>(),
        ) {
            let version = if v5 { V5 } else { V4 };
            let mut message = publish.clone();
            let ids = std::mem::take(&mut message.properties.subscription_identifiers);
            let (own, delivery) = ids.split_at(split.index(ids.len() + 1));
            message.properties.subscription_identifiers = own.to_vec();
            // The last User Property, if any, given as the extra one.
            let extra = message.properties.user_properties.pop();
            let parts = crate::broker::codec::PublishParts {
                extra_user_property: extra.as_ref().map(|(k, v)| (k.as_str(), v.as_str())),
                qos: message.qos,
                topic_len: message.topic.len(),
                properties: &message.properties,
                subscription_ids: delivery,
                payload_len: message.payload.len(),
            };
            let written = enc(&Packet::Publish(publish), version);
            prop_assert_eq!(crate::broker::codec::publish_len(&parts, version), Ok(written.len()));
        }

        /// `encode_publish` writes from borrowed parts exactly what
        /// `encode_within` writes for the packet built from them, the
        /// delivery's expiry, alias and subscription identifiers in place
        /// of the message's own; too large, it is refused the same way.
        #[test]
        fn encode_publish_writes_the_packet_built_from_its_parts(
            (v5, message, delivery) in any::<bool>().prop_flat_map(|v5| (Just(v5), publish(v5, true), publish(v5, true))),
            max in prop_oneof![Just(u32::MAX), 0u32..200],
        ) {
            let version = if v5 { V5 } else { V4 };
            // The message's last User Property, if any, given as the
            // extra one: written where it was.
            let mut shared = message.properties.clone();
            let extra = shared.user_properties.pop();
            let parts = crate::broker::codec::PublishRef {
                extra_user_property: extra.as_ref().map(|(k, v)| (k.as_str(), v.as_str())),
                dup: delivery.dup,
                qos: delivery.qos,
                retain: delivery.retain,
                topic: &message.topic,
                packet_id: delivery.packet_id,
                properties: &shared,
                message_expiry_interval: delivery.properties.message_expiry_interval,
                topic_alias: delivery.properties.topic_alias,
                subscription_ids: &delivery.properties.subscription_identifiers,
                payload: &message.payload,
            };
            let mut built = message.clone();
            built.dup = delivery.dup;
            built.qos = delivery.qos;
            built.retain = delivery.retain;
            built.packet_id = delivery.packet_id;
            built.properties.message_expiry_interval = delivery.properties.message_expiry_interval;
            built.properties.topic_alias = delivery.properties.topic_alias;
            built.properties.subscription_identifiers = delivery.properties.subscription_identifiers.clone();
            let built = Packet::Publish(built);
            let (mut expected, mut written) = (BytesMut::new(), BytesMut::new());
            let answer = crate::broker::codec::encode_within(&built, version, max, &mut expected);
            prop_assert_eq!(
                crate::broker::codec::encode_publish(&parts, version, max, &mut written),
                answer
            );
            prop_assert_eq!(written, expected);
        }

        #[test]
        fn connects_round_trip(packet in connect(true)) {
            round_trip(&Packet::Connect(packet), V5);
        }

        #[test]
        fn v311_connects_round_trip(packet in connect(false)) {
            round_trip(&Packet::Connect(packet), V4);
        }

        #[test]
        fn auth_round_trips(packet in auth()) {
            round_trip(&packet, V5);
        }

        #[test]
        fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..200)) {
            for version in [V4, V5] {
                drain(server_after_connect(version), &bytes);
                drain(FrameDecoder::client(MAX, version), &bytes);
            }
            drain(FrameDecoder::server(MAX), &bytes);
            drain(FrameDecoder::server(64), &bytes);
        }

        #[test]
        fn mutated_packets_never_panic(packet in client_packet(true), flips in vec((any::<proptest::sample::Index>(), any::<u8>()), 1..4), cut in any::<proptest::sample::Index>()) {
            let mut bytes = enc(&packet, V5).to_vec();
            for (at, value) in flips {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            let cut = cut.index(bytes.len() + 1);
            drain(server_after_connect(V5), &bytes[..cut]);
            drain(server_after_connect(V4), &bytes[..cut]);
        }

        #[test]
        fn mutated_connects_never_panic(packet in connect(true), at in any::<proptest::sample::Index>(), value in any::<u8>()) {
            let mut bytes = enc(&Packet::Connect(packet), V5).to_vec();
            let i = at.index(bytes.len());
            bytes[i] = value;
            drain(FrameDecoder::server(MAX), &bytes);
        }
    }
}
