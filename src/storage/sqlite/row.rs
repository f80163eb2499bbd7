//! A record to and from the columns of [`super::schema::RECORD_COLUMNS`].
//!
//! Headers are JSON text because a sqlite provider is one an operator opens
//! with the `sqlite3` shell, and headers are where they look when a message
//! did not arrive as expected. A record carrying none stores NULL.

use base64::Engine as _;
use bytes::Bytes;
use rusqlite::types::{Type, ValueRef};
use rusqlite::{Row, ToSql};
use saguin_format::model::{PublishProps, Record, UserProperty};

use crate::storage::contract::ServedValue;

/// The five publish properties as the `props` column's JSON object.
#[derive(serde::Serialize, serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PropsJson {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    response_topic: Option<String>,
    /// base64 (standard alphabet, padded): correlation data is arbitrary bytes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    correlation_data: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    payload_format_indicator: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    message_expiry_interval: Option<u32>,
}

/// The `headers` column: `[[name, value], ...]` or NULL.
pub fn headers_json(headers: &[UserProperty]) -> Option<String> {
    if headers.is_empty() {
        return None;
    }
    let pairs: Vec<[&str; 2]> = headers
        .iter()
        .map(|p| [p.name.as_str(), p.value.as_str()])
        .collect();
    serde_json::to_string(&pairs).ok()
}

pub fn headers_from_json(text: &str) -> Result<Vec<UserProperty>, String> {
    let pairs: Vec<[String; 2]> = serde_json::from_str(text)
        .map_err(|e| format!("headers are not a JSON array of [name, value] pairs: {e}"))?;
    Ok(pairs
        .into_iter()
        .map(|[name, value]| UserProperty { name, value })
        .collect())
}

/// The `props` column: one JSON object, or NULL when nothing is set.
pub fn props_json(props: &PublishProps) -> Option<String> {
    if props.is_empty() {
        return None;
    }
    let json = PropsJson {
        content_type: props.content_type.clone(),
        response_topic: props.response_topic.clone(),
        correlation_data: props
            .correlation_data
            .as_ref()
            .map(|d| base64::engine::general_purpose::STANDARD.encode(d)),
        payload_format_indicator: props.payload_format_indicator,
        message_expiry_interval: props.message_expiry_interval,
    };
    serde_json::to_string(&json).ok()
}

pub fn props_from_json(text: &str) -> Result<PublishProps, String> {
    let json: PropsJson = serde_json::from_str(text)
        .map_err(|e| format!("props are not the publish-properties object: {e}"))?;
    let correlation_data = match json.correlation_data {
        Some(b64) => Some(Bytes::from(
            base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| format!("props.correlation_data is not base64: {e}"))?,
        )),
        None => None,
    };
    Ok(PublishProps {
        content_type: json.content_type,
        response_topic: json.response_topic,
        correlation_data,
        payload_format_indicator: json.payload_format_indicator,
        message_expiry_interval: json.message_expiry_interval,
    })
}

/// A record ready to bind: the JSON columns encoded once.
pub struct Encoded<'a> {
    pub record: &'a Record,
    payload: &'a [u8],
    headers: Option<String>,
    props: Option<String>,
    /// [`Record::accounted_size`], the one size function.
    pub size: u64,
}

impl<'a> Encoded<'a> {
    pub fn new(record: &'a Record) -> Encoded<'a> {
        Encoded {
            record,
            payload: &record.payload,
            headers: headers_json(&record.user_properties),
            props: props_json(&record.props),
            size: record.accounted_size(),
        }
    }

    /// The 13 values of `RECORD_COLUMNS`, in order.
    pub fn params(&self) -> [&dyn ToSql; 13] {
        let r = self.record;
        [
            &r.message_id as &dyn ToSql,
            &r.topic,
            &r.timestamp,
            &self.headers,
            &self.payload as &dyn ToSql,
            &self.props,
            &r.retain,
            &r.bridge,
            &r.client_id,
            &r.qos,
            &r.shared_copy,
            &r.owed_to,
            &self.size as &dyn ToSql,
        ]
    }
}

fn corrupt(column: usize, detail: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, Type::Text, detail.into())
}

/// The record in `RECORD_COLUMNS` starting at column `first`, given the
/// offset it is stored at. Every column is checked, never assumed.
pub fn record_at(row: &Row<'_>, first: usize, offset: u64) -> rusqlite::Result<Record> {
    // Read in place: the sixteen bytes are copied, not allocated.
    let id = row.get_ref(first)?;
    let id = id.as_blob().map_err(|_| {
        corrupt(
            first,
            format!("message_id is {:?}, not a blob", id.data_type()),
        )
    })?;
    let message_id: [u8; 16] = id
        .try_into()
        .map_err(|_| corrupt(first, format!("message_id is {} bytes, not 16", id.len())))?;
    let headers: Option<String> = row.get(first + 3)?;
    let user_properties = user_properties_of(headers.as_deref(), first + 3)?;
    let props: Option<String> = row.get(first + 5)?;
    let props = props_of(props.as_deref(), first + 5)?;
    let payload: Vec<u8> = row.get(first + 4)?;
    let qos = qos_at(row, first + 9)?;
    Ok(Record {
        offset,
        message_id,
        topic: row.get(first + 1)?,
        timestamp: row.get(first + 2)?,
        user_properties,
        payload: Bytes::from(payload),
        props: props.into(),
        retain: row.get(first + 6)?,
        bridge: row.get(first + 7)?,
        client_id: row.get(first + 8)?,
        qos,
        shared_copy: row.get(first + 10)?,
        owed_to: row.get(first + 11)?,
    })
}

/// The value in `served_columns!` starting at column `first`, given the
/// offset it is stored at, lent to `each` straight from the row: nothing
/// is made for it but the properties of a value that has some. Every
/// column read is checked, as in [`record_at`].
pub fn with_served_at(
    row: &Row<'_>,
    first: usize,
    offset: u64,
    each: &mut dyn FnMut(ServedValue<'_>),
) -> rusqlite::Result<()> {
    let text = |column: usize| -> rusqlite::Result<Option<&str>> {
        match row.get_ref(column)? {
            ValueRef::Null => Ok(None),
            ValueRef::Text(bytes) => std::str::from_utf8(bytes)
                .map(Some)
                .map_err(|e| corrupt(column, format!("not UTF-8: {e}"))),
            other => Err(corrupt(
                column,
                format!("{:?}, not text", other.data_type()),
            )),
        }
    };
    let topic = text(first)?.ok_or_else(|| corrupt(first, "the topic is NULL".into()))?;
    let user_properties = user_properties_of(text(first + 2)?, first + 2)?;
    let props = props_of(text(first + 4)?, first + 4)?;
    let payload = row.get_ref(first + 3)?;
    let payload = payload.as_blob().map_err(|_| {
        corrupt(
            first + 3,
            format!("payload is {:?}, not a blob", payload.data_type()),
        )
    })?;
    let qos = qos_at(row, first + 6)?;
    each(ServedValue {
        offset,
        topic,
        payload,
        timestamp: row.get(first + 1)?,
        qos,
        retain: row.get(first + 5)?,
        props: &props,
        user_properties: &user_properties,
        kept: None,
    });
    Ok(())
}

/// The `headers` column at `column` as user properties (none for NULL).
fn user_properties_of(headers: Option<&str>, column: usize) -> rusqlite::Result<Vec<UserProperty>> {
    headers.map_or(Ok(Vec::new()), |text| {
        headers_from_json(text).map_err(|e| corrupt(column, e))
    })
}

/// The `props` column at `column` as publish properties (none for NULL).
fn props_of(props: Option<&str>, column: usize) -> rusqlite::Result<PublishProps> {
    props.map_or(Ok(PublishProps::default()), |text| {
        props_from_json(text).map_err(|e| corrupt(column, e))
    })
}

/// The `qos` column at `column`, refused unless 0, 1 or 2.
fn qos_at(row: &Row<'_>, column: usize) -> rusqlite::Result<u8> {
    let qos: u8 = row.get(column)?;
    if qos > 2 {
        return Err(corrupt(column, format!("qos {qos} is not 0, 1 or 2")));
    }
    Ok(qos)
}

/// The stored size column (column `first + 12` of the record columns).
pub fn size_at(row: &Row<'_>, first: usize) -> rusqlite::Result<u64> {
    row.get(first + 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_order_and_repeats_and_props_round_trip() {
        let headers = vec![
            UserProperty {
                name: "a".into(),
                value: "1".into(),
            },
            UserProperty {
                name: "a".into(),
                value: "2".into(),
            },
        ];
        let text = headers_json(&headers).unwrap();
        assert_eq!(text, r#"[["a","1"],["a","2"]]"#);
        assert_eq!(headers_from_json(&text).unwrap(), headers);
        assert_eq!(headers_json(&[]), None);

        let props = PublishProps {
            correlation_data: Some(Bytes::from_static(&[0, 255, 7])),
            payload_format_indicator: Some(1),
            ..Default::default()
        };
        let text = props_json(&props).unwrap();
        assert!(text.contains("\"correlation_data\":\"AP8H\""), "{text}");
        assert_eq!(props_from_json(&text).unwrap(), props);
        assert_eq!(props_json(&PublishProps::default()), None);
        assert!(props_from_json(r#"{"nonsense":1}"#).is_err());
        assert!(headers_from_json("{}").is_err());
    }
}
