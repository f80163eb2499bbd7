//! Test-only MBMQTT01 writers: a raw payload builder that can write any
//! bytes (valid or not), and V1/V2 encoders (the library only writes V3).

#![allow(dead_code)]

use saguin_format::mbmqtt::{
    seal, Detach, Inflight, Message, Phase, Principal, RetainedMessage, Session, Snapshot,
    Subscription,
};

/// A payload under construction; `marks` records the payload offset of
/// every field boundary, for truncation tests.
#[derive(Default)]
pub struct Raw {
    pub out: Vec<u8>,
    pub marks: Vec<usize>,
}

impl Raw {
    pub fn new() -> Raw {
        Raw::default()
    }
    fn mark(&mut self) {
        self.marks.push(self.out.len());
    }
    pub fn u8(&mut self, v: u8) -> &mut Raw {
        self.mark();
        self.out.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Raw {
        self.mark();
        self.out.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Raw {
        self.mark();
        self.out.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Raw {
        self.u32(b.len() as u32);
        self.mark();
        self.out.extend_from_slice(b);
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Raw {
        self.bytes(s.as_bytes())
    }
    /// A V3 message (with QoS).
    pub fn msg3(&mut self, topic: &str, payload: &[u8], retain: u8, qos: u8) -> &mut Raw {
        self.str(topic).bytes(payload).u8(retain).u8(qos)
    }
    /// A legacy message (no QoS byte).
    pub fn msg_legacy(&mut self, topic: &str, payload: &[u8], retain: u8) -> &mut Raw {
        self.str(topic).bytes(payload).u8(retain)
    }
    pub fn seal(&self, version: u16) -> Vec<u8> {
        seal(version, &self.out)
    }
}

/// Encode `snapshot` in the layout of `version` (1 or 2), which only
/// carries what that version can: legacy messages, no phases, no inbound
/// QoS 2 list, and (V1) no principal or detach time.
pub fn encode_legacy(version: u16, snapshot: &Snapshot) -> Raw {
    assert!(version == 1 || version == 2);
    let mut w = Raw::new();
    w.u32(u32::from(version));
    w.u32(snapshot.sessions.len() as u32);
    for s in &snapshot.sessions {
        w.str(&s.client_id);
        if version == 2 {
            match &s.principal {
                Principal::Named(n) => w.str(n),
                Principal::LegacyAnonymous => panic!("V2 sessions have a principal"),
            };
            match s.detach {
                Detach::Millis(ms) => w.str(&ms.to_string()),
                Detach::Unknown => panic!("V2 sessions have a detach time"),
            };
        }
        w.u16(s.next_packet_id);
        w.u32(s.subscriptions.len() as u32);
        for sub in &s.subscriptions {
            w.str(&sub.filter).u8(sub.qos);
        }
        assert!(s.inbound_qos2.is_empty());
        w.u32(s.inflight.len() as u32);
        for i in &s.inflight {
            assert_eq!(i.phase, Phase::AwaitPuback);
            let m = i
                .message
                .as_ref()
                .expect("legacy inflight carries a message");
            w.u16(i.packet_id);
            w.msg_legacy(&m.topic, &m.payload, u8::from(m.retain));
        }
        w.u32(s.pending.len() as u32);
        for m in &s.pending {
            w.msg_legacy(&m.topic, &m.payload, u8::from(m.retain));
        }
    }
    w.u32(snapshot.retained.len() as u32);
    for r in &snapshot.retained {
        w.str(&r.topic).bytes(&r.payload).u8(r.qos);
    }
    w
}

/// Encode a V3 snapshot with the raw builder (field marks recorded). The
/// bytes must equal the library encoder's.
pub fn encode_v3_raw(snapshot: &Snapshot) -> Raw {
    let mut w = Raw::new();
    w.u32(3);
    w.u32(snapshot.sessions.len() as u32);
    for s in &snapshot.sessions {
        w.str(&s.client_id);
        match &s.principal {
            Principal::Named(n) => w.str(n),
            Principal::LegacyAnonymous => panic!("V3 principal"),
        };
        match s.detach {
            Detach::Millis(ms) => w.str(&ms.to_string()),
            Detach::Unknown => panic!("V3 detach"),
        };
        w.u16(s.next_packet_id);
        w.u32(s.subscriptions.len() as u32);
        for sub in &s.subscriptions {
            w.str(&sub.filter).u8(sub.qos);
        }
        w.u32(s.inbound_qos2.len() as u32);
        for id in &s.inbound_qos2 {
            w.u16(*id);
        }
        w.u32(s.inflight.len() as u32);
        for i in &s.inflight {
            w.u16(i.packet_id).u8(i.phase.code());
            if let Some(m) = &i.message {
                w.msg3(&m.topic, &m.payload, u8::from(m.retain), m.qos);
            }
        }
        w.u32(s.pending.len() as u32);
        for m in &s.pending {
            w.msg3(&m.topic, &m.payload, u8::from(m.retain), m.qos);
        }
    }
    w.u32(snapshot.retained.len() as u32);
    for r in &snapshot.retained {
        w.str(&r.topic).bytes(&r.payload).u8(r.qos);
    }
    w
}

pub fn msg(topic: &str, payload: &[u8], retain: bool, qos: u8) -> Message {
    Message {
        topic: topic.into(),
        payload: payload.to_vec(),
        retain,
        qos,
    }
}

/// The V3 golden model: every part of the format in use, two sessions.
pub fn golden_v3() -> Snapshot {
    Snapshot {
        version_read: 3,
        sessions: vec![
            Session {
                client_id: "sensor-17".into(),
                principal: Principal::Named("plant-a".into()),
                detach: Detach::Millis(1_767_225_600_000),
                next_packet_id: 42,
                subscriptions: vec![
                    Subscription {
                        filter: "cmd/sensor-17/#".into(),
                        qos: 2,
                    },
                    Subscription {
                        filter: "fleet/+/config".into(),
                        qos: 1,
                    },
                    Subscription {
                        filter: "time".into(),
                        qos: 0,
                    },
                ],
                inbound_qos2: vec![7, 9],
                inflight: vec![
                    Inflight {
                        packet_id: 39,
                        phase: Phase::AwaitPuback,
                        message: Some(msg("cmd/sensor-17/reboot", b"now", false, 1)),
                    },
                    Inflight {
                        packet_id: 40,
                        phase: Phase::AwaitPubrec,
                        message: Some(msg("cmd/sensor-17/fw", &[0, 1, 2, 0xff], true, 2)),
                    },
                    Inflight {
                        packet_id: 41,
                        phase: Phase::AwaitPubcomp,
                        message: None,
                    },
                ],
                pending: vec![
                    msg("fleet/a/config", b"{\"rate\":5}", false, 1),
                    msg("cmd/sensor-17/led", b"on", false, 2),
                ],
            },
            Session {
                client_id: "dashboard".into(),
                principal: Principal::Named(String::new()),
                detach: Detach::Millis(0),
                next_packet_id: 1,
                subscriptions: vec![],
                inbound_qos2: vec![],
                inflight: vec![],
                pending: vec![],
            },
        ],
        retained: vec![
            RetainedMessage {
                topic: "fleet/a/config".into(),
                payload: b"{\"rate\":5}".to_vec(),
                qos: 1,
            },
            RetainedMessage {
                topic: "status/héllo".into(),
                payload: vec![],
                qos: 2,
            },
        ],
    }
}

/// The V2 golden model as a V2 writer would hold it (QoS 0/1, phases all
/// AwaitPuback, no inbound list).
pub fn golden_v2() -> Snapshot {
    Snapshot {
        version_read: 2,
        sessions: vec![
            Session {
                client_id: "meter-3".into(),
                principal: Principal::Named("utility".into()),
                detach: Detach::Millis(1_700_000_000_123),
                next_packet_id: 65535,
                subscriptions: vec![
                    Subscription {
                        filter: "meter/3/#".into(),
                        qos: 1,
                    },
                    Subscription {
                        filter: "broadcast".into(),
                        qos: 0,
                    },
                ],
                inbound_qos2: vec![],
                inflight: vec![Inflight {
                    packet_id: 65534,
                    phase: Phase::AwaitPuback,
                    message: Some(msg("meter/3/tariff", b"peak", true, 1)),
                }],
                pending: vec![
                    msg("meter/3/read", b"", false, 1),
                    msg("broadcast", b"maintenance 02:00", false, 1),
                ],
            },
            Session {
                client_id: "meter-4".into(),
                principal: Principal::Named("utility".into()),
                detach: Detach::Millis(5),
                next_packet_id: 3,
                subscriptions: vec![Subscription {
                    filter: "meter/4/#".into(),
                    qos: 1,
                }],
                inbound_qos2: vec![],
                inflight: vec![],
                pending: vec![],
            },
        ],
        retained: vec![RetainedMessage {
            topic: "broadcast".into(),
            payload: b"hello".to_vec(),
            qos: 0,
        }],
    }
}

/// The V1 golden model: like V2 with no principal or detach time.
pub fn golden_v1() -> Snapshot {
    Snapshot {
        version_read: 1,
        sessions: vec![Session {
            client_id: "legacy-1".into(),
            principal: Principal::LegacyAnonymous,
            detach: Detach::Unknown,
            next_packet_id: 10,
            subscriptions: vec![Subscription {
                filter: "legacy/#".into(),
                qos: 1,
            }],
            inbound_qos2: vec![],
            inflight: vec![
                Inflight {
                    packet_id: 8,
                    phase: Phase::AwaitPuback,
                    message: Some(msg("legacy/a", b"1", false, 1)),
                },
                Inflight {
                    packet_id: 9,
                    phase: Phase::AwaitPuback,
                    message: Some(msg("legacy/b", b"2", true, 1)),
                },
            ],
            pending: vec![msg("legacy/c", b"3", false, 1)],
        }],
        retained: vec![RetainedMessage {
            topic: "legacy/r".into(),
            payload: b"kept".to_vec(),
            qos: 1,
        }],
    }
}
