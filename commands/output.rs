//! Output pieces every command shares, so tables and times read the same
//! in each command's human and JSON output.

use std::borrow::Cow;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};
use saguin_format::f21::time::format_unix_nanos;
use saguin_format::f21::{Session, Will};
use saguin_format::model::{PublishProps, Record, UserProperty};
use serde_json::{json, Value};

/// An empty table in the style every human summary uses.
pub fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    t
}

/// A count with its thousands set apart, as the docs write them:
/// `182,406`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
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
    time_string(nanos).map_or(Value::Null, Value::String)
}

/// A Unix-nanosecond time as RFC 3339, `None` when unset (0).
pub fn time_string(nanos: i64) -> Option<String> {
    (nanos != 0).then(|| format_unix_nanos(nanos))
}

/// A payload as text when it is UTF-8 with nothing unprintable, else `None`.
pub fn payload_text(payload: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(payload).ok()?;
    s.chars()
        .all(|c| !c.is_control() || c == '\n' || c == '\t')
        .then_some(s)
}

/// A message's payload, user properties and publish properties as JSON:
/// the part a record, a held publish and a Will share, so a reader parses
/// them alike. The payload is always given in hex, and as text too when it
/// is UTF-8 with nothing unprintable (`payload_text` is `null` otherwise).
#[derive(serde::Serialize)]
pub struct MessageJson<'a> {
    pub payload_bytes: usize,
    pub payload_text: Option<&'a str>,
    pub payload_hex: String,
    /// `[{"name", "value"}]` in the publisher's order, repeats kept.
    pub user_properties: Vec<UserPropertyJson<'a>>,
    pub properties: PropertiesJson<'a>,
}

#[derive(serde::Serialize)]
pub struct UserPropertyJson<'a> {
    pub name: &'a str,
    pub value: &'a str,
}

/// The five publish properties, each `null` when unset.
#[derive(serde::Serialize)]
pub struct PropertiesJson<'a> {
    pub content_type: Option<&'a str>,
    pub response_topic: Option<&'a str>,
    pub correlation_data_hex: Option<String>,
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
}

impl<'a> MessageJson<'a> {
    pub fn new(
        payload: &'a [u8],
        props: &'a PublishProps,
        user_properties: &'a [UserProperty],
    ) -> MessageJson<'a> {
        MessageJson {
            payload_bytes: payload.len(),
            payload_text: payload_text(payload),
            payload_hex: hex::encode(payload),
            user_properties: user_properties
                .iter()
                .map(|p| UserPropertyJson {
                    name: &p.name,
                    value: &p.value,
                })
                .collect(),
            properties: PropertiesJson {
                content_type: props.content_type.as_deref(),
                response_topic: props.response_topic.as_deref(),
                correlation_data_hex: props.correlation_data.as_ref().map(hex::encode),
                payload_format_indicator: props.payload_format_indicator,
                message_expiry_interval: props.message_expiry_interval,
            },
        }
    }
}

/// RECORD: the one JSON shape of a stored record, printed by
/// `snapshot inspect` and `sqlite dump` alike - `{"offset", "message_id"
/// (hex), "time" (RFC 3339, null when unset), "time_unix_nanos", "topic",
/// "qos", "retain", "client_id", "bridge", "shared_copy", "owed_to",
/// "payload_bytes", "payload_text", "payload_hex", "user_properties",
/// "properties"}`, with `"deleted"` for a latest channel's row (a
/// deletion's marker is `true`) and `"attempts"`, `"first_delivered"`,
/// `"last_delivered"` for a queue's item.
#[derive(serde::Serialize)]
pub struct RecordJson<'a> {
    pub offset: u64,
    pub message_id: String,
    pub time: Option<String>,
    pub time_unix_nanos: i64,
    pub topic: &'a str,
    pub qos: u8,
    pub retain: bool,
    pub client_id: &'a str,
    pub bridge: Option<&'a str>,
    pub shared_copy: bool,
    pub owed_to: Option<&'a str>,
    #[serde(flatten)]
    pub message: MessageJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<bool>,
    #[serde(flatten)]
    pub delivery: Option<DeliveryJson>,
}

/// What survives about a queue item's deliveries.
#[derive(serde::Serialize)]
pub struct DeliveryJson {
    pub attempts: u32,
    pub first_delivered: Option<String>,
    pub last_delivered: Option<String>,
}

impl<'a> RecordJson<'a> {
    pub fn new(r: &'a Record) -> RecordJson<'a> {
        RecordJson {
            offset: r.offset,
            message_id: hex::encode(r.message_id),
            time: time_string(r.timestamp),
            time_unix_nanos: r.timestamp,
            topic: &r.topic,
            qos: r.qos,
            retain: r.retain,
            client_id: &r.client_id,
            bridge: r.bridge.as_deref(),
            shared_copy: r.shared_copy,
            owed_to: r.owed_to.as_deref(),
            message: MessageJson::new(&r.payload, &r.props, &r.user_properties),
            deleted: None,
            delivery: None,
        }
    }

    /// A latest channel's row: `deleted` says whether it is a marker.
    pub fn latest_row(mut self, deleted: bool) -> RecordJson<'a> {
        self.deleted = Some(deleted);
        self
    }

    /// A queue's item, with its attempts and delivery times.
    pub fn queue_item(mut self, attempts: u32, first: i64, last: i64) -> RecordJson<'a> {
        self.delivery = Some(DeliveryJson {
            attempts,
            first_delivered: time_string(first),
            last_delivered: time_string(last),
        });
        self
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Add a message's payload, its properties and its user properties
/// ([`MessageJson`]) to the object `v`.
pub fn extend_message_json(
    v: &mut Value,
    payload: &[u8],
    props: &PublishProps,
    user_properties: &[UserProperty],
) {
    let message = serde_json::to_value(MessageJson::new(payload, props, user_properties));
    if let (Some(o), Ok(Value::Object(m))) = (v.as_object_mut(), message) {
        o.extend(m);
    }
}

/// A short cell for a payload in human output: text (quoted, cut at 64
/// characters) when it is printable UTF-8, else `hex:` and its first 32
/// bytes.
pub fn payload_cell(payload: &[u8]) -> String {
    const MAX: usize = 64;
    match payload_text(payload) {
        Some(s) => {
            let mut cut: String = s.chars().take(MAX).collect();
            cut = cut.replace('\n', "\\n").replace('\t', "\\t");
            if s.chars().count() > MAX {
                format!("{cut:?}…")
            } else {
                format!("{cut:?}")
            }
        }
        None => {
            let shown = payload.get(..MAX / 2).unwrap_or(payload);
            let mut h = format!("hex:{}", hex::encode(shown));
            if shown.len() < payload.len() {
                h.push('…');
            }
            h
        }
    }
}

/// A record's user properties and publish properties in one human cell.
pub fn props_cell(user_properties: &[UserProperty], props: &PublishProps) -> String {
    let mut parts = Vec::new();
    for p in user_properties {
        parts.push(format!("{}={}", escaped(&p.name), escaped(&p.value)));
    }
    if let Some(v) = &props.content_type {
        parts.push(format!("content-type={}", escaped(v)));
    }
    if let Some(v) = &props.response_topic {
        parts.push(format!("response-topic={}", escaped(v)));
    }
    if let Some(v) = &props.correlation_data {
        parts.push(format!("correlation-data=hex:{}", hex::encode(v)));
    }
    if let Some(v) = props.payload_format_indicator {
        parts.push(format!("payload-format={v}"));
    }
    if let Some(v) = props.message_expiry_interval {
        parts.push(format!("expiry={v}s"));
    }
    parts.join(", ")
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
    fn a_count_has_its_thousands_set_apart() {
        for (n, text) in [
            (0, "0"),
            (999, "999"),
            (1_000, "1,000"),
            (182_406, "182,406"),
            (1_234_567, "1,234,567"),
        ] {
            assert_eq!(grouped(n), text);
        }
    }

    /// RECORD has the keys its documentation lists, a latest row adds
    /// `deleted` and a queue item its deliveries, and nothing else.
    #[test]
    fn a_record_has_the_documented_keys() {
        let mut r = Record::new("t/1", bytes::Bytes::from_static(&[0, 0xff]));
        r.timestamp = 1_000_000_000;
        let keys = |v: Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let mut record = vec![
            "offset",
            "message_id",
            "time",
            "time_unix_nanos",
            "topic",
            "qos",
            "retain",
            "client_id",
            "bridge",
            "shared_copy",
            "owed_to",
            "payload_bytes",
            "payload_text",
            "payload_hex",
            "user_properties",
            "properties",
        ];
        record.sort();
        assert_eq!(keys(RecordJson::new(&r).to_value()), record);
        let mut latest = record.clone();
        latest.push("deleted");
        latest.sort();
        assert_eq!(
            keys(RecordJson::new(&r).latest_row(true).to_value()),
            latest
        );
        let mut item = record.clone();
        item.extend(["attempts", "first_delivered", "last_delivered"]);
        item.sort();
        let v = RecordJson::new(&r).queue_item(2, 5, 0).to_value();
        assert_eq!(v["attempts"], 2);
        assert_eq!(v["last_delivered"], Value::Null);
        assert_eq!(keys(v), item);
        let v = RecordJson::new(&r).to_value();
        assert_eq!(v["payload_text"], Value::Null);
        assert_eq!(v["payload_hex"], "00ff");
        assert_eq!(v["time"], "1970-01-01T00:00:01Z");
        assert_eq!(payload_cell(&r.payload), "hex:00ff");
        assert_eq!(payload_cell(b"21.5"), "\"21.5\"");
    }

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
