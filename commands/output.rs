//! Output pieces every command shares, so tables and times read the same
//! in each command's human and JSON output.

use std::borrow::Cow;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};
use saguin_format::f21::time::format_unix_nanos;
use saguin_format::f21::{Session, Will};
use saguin_format::model::{PublishProps, UserProperty};
use serde_json::{json, Value};

/// An empty table in the style every human summary uses.
pub fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    t
}

/// A Unix-nanosecond time as RFC 3339, `-` when unset (0).
pub fn time_text(nanos: i64) -> String {
    if nanos == 0 {
        "-".into()
    } else {
        format_unix_nanos(nanos)
    }
}

/// A Unix-nanosecond time as an RFC 3339 string, `null` when unset (0).
pub fn time_json(nanos: i64) -> Value {
    if nanos == 0 {
        Value::Null
    } else {
        json!(format_unix_nanos(nanos))
    }
}

/// A payload as text when it is UTF-8 with nothing unprintable, else `None`.
pub fn payload_text(payload: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(payload).ok()?;
    s.chars()
        .all(|c| !c.is_control() || c == '\n' || c == '\t')
        .then_some(s)
}

/// Add a message's payload (text when it is UTF-8, always hex), its
/// properties and its user properties to the object `v`: the one shape a
/// record, a held publish and a Will share, so a reader parses them alike.
pub fn extend_message_json(
    v: &mut Value,
    payload: &[u8],
    props: &PublishProps,
    user_properties: &[UserProperty],
) {
    if let Some(o) = v.as_object_mut() {
        o.insert("payload_bytes".into(), json!(payload.len()));
        o.insert("payload_text".into(), json!(payload_text(payload)));
        o.insert("payload_hex".into(), json!(hex::encode(payload)));
        o.insert(
            "user_properties".into(),
            Value::Array(
                user_properties
                    .iter()
                    .map(|p| json!({"name": p.name, "value": p.value}))
                    .collect(),
            ),
        );
        o.insert(
            "properties".into(),
            json!({
                "content_type": props.content_type,
                "response_topic": props.response_topic,
                "correlation_data_hex": props.correlation_data.as_ref().map(hex::encode),
                "payload_format_indicator": props.payload_format_indicator,
                "message_expiry_interval": props.message_expiry_interval,
            }),
        );
    }
}

/// A session's Will in full.
pub fn will_json(w: &Will) -> Value {
    let mut v = json!({
        "topic": w.topic,
        "qos": w.qos,
        "retain": w.retain,
        "delay_interval": w.delay_interval,
    });
    extend_message_json(&mut v, &w.payload, &w.props, &w.user_properties);
    v
}

/// A persistent session in full - its subscriptions with every option, its
/// in-flight entries, its Will - the one shape `snapshot inspect` and
/// `sqlite dump` print a session in.
pub fn session_json(s: &Session) -> Value {
    json!({
        "client_id": s.client_id,
        "principal": s.principal,
        "expiry_interval": s.expiry_interval,
        "detached_at": time_json(s.detached_at),
        "window": s.window,
        "will": s.will.as_ref().map(will_json),
        "subscriptions": s.subscriptions.iter().map(|sub| json!({
            "filter": sub.filter, "qos": sub.qos, "no_local": sub.no_local,
            "retain_as_published": sub.retain_as_published, "retain_handling": sub.retain_handling,
            "subscription_id": sub.subscription_id, "log_offset": sub.log_offset,
        })).collect::<Vec<_>>(),
        "inflight": s.inflight.iter().map(|e| json!({
            "log_offset": e.log_offset, "packet_id": e.packet_id, "qos": e.qos,
            "phase": e.phase.as_str(),
            "shared_group": e.shared_group.as_ref().map(|g| json!({"group": g.group, "filter": g.filter})),
        })).collect::<Vec<_>>(),
    })
}

/// Text from a client or a file (a client id, topic, filter, user property,
/// principal) made safe to print on a terminal: every control character -
/// C0 (ESC, a line break), DEL and C1 - as a Rust escape (`\u{1b}`, `\n`),
/// and the backslash itself doubled so an escape cannot be forged. An ESC
/// sequence in a topic would otherwise clear or rewrite the operator's
/// screen. Human output only: JSON output carries the text exactly
/// (serde_json escapes control characters itself).
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() || c == '\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`escaped`], owned, for a table cell.
pub fn cell(text: &str) -> String {
    escaped(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(escaped("sensors/17/temp"), Cow::Borrowed(_)));
        assert_eq!(escaped("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escaped("line\nbreak\ttab"), "line\\nbreak\\ttab");
        assert_eq!(escaped("c1\u{9b}x\u{7f}"), "c1\\u{9b}x\\u{7f}");
        assert_eq!(escaped("back\\slash"), "back\\\\slash");
        assert_eq!(escaped("température/°C"), "température/°C");
    }
}
