//! Regression tests: records that could never have been published, and held
//! broadcast publishes carrying log-only marks, are refused by the decoder
//! (and so by `snapshot verify` and the loader alike).

mod f21_common;

use f21_common::*;
use saguin_format::f21::*;

fn refused(file: SnapshotFile) -> String {
    let bytes = encode_fixture(&file, SHUTDOWN_AT);
    match decode(&bytes) {
        Ok(_) => panic!("decoded, but must be refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_channel_record_with_an_empty_topic_is_refused() {
    let mut c = append_channel();
    c.records[0].topic = String::new();
    let message = refused(SnapshotFile::Channel(c));
    assert!(message.contains("topic"), "{message}");
    assert!(message.contains("empty"), "{message}");
}

#[test]
fn a_channel_record_with_a_wildcard_topic_is_refused() {
    for topic in ["a/+/b", "a/#"] {
        let mut c = append_channel();
        c.records[0].topic = topic.into();
        let message = refused(SnapshotFile::Channel(c));
        assert!(message.contains("wildcard"), "{topic}: {message}");
    }
}

#[test]
fn a_retained_record_with_an_empty_topic_is_refused() {
    let mut r = retained();
    r.records[0].topic = String::new();
    let message = refused(SnapshotFile::Retained(r));
    assert!(message.contains("empty"), "{message}");
}

#[test]
fn a_will_with_a_wildcard_topic_is_refused() {
    let mut s = sessions();
    let session = s
        .sessions
        .iter_mut()
        .find(|s| s.will.is_some())
        .expect("a fixture session with a Will");
    session.will.as_mut().expect("will").topic = "dev/#".into();
    let message = refused(SnapshotFile::Sessions(s));
    assert!(message.contains("will.topic"), "{message}");
}

#[test]
fn a_held_broadcast_publish_owed_to_a_session_is_refused() {
    let mut b = broadcast();
    let held = b
        .held
        .first_mut()
        .expect("a fixture held broadcast publish");
    held.record.owed_to = Some("dev1".into());
    let message = refused(SnapshotFile::Broadcast(b));
    assert!(message.contains("owed_to"), "{message}");
}
