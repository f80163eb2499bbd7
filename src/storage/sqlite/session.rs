//! Persistent MQTT sessions on sqlite: a `sessions` row per session (its
//! subscriptions as one JSON array, its Will as one JSON object) and a
//! `session_inflight` row per message on the wire, written and removed
//! together in one transaction. A session's ending takes its broadcast-log
//! cursor (a `positions` row) in that same transaction.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension};
use saguin_format::model::UserProperty;

use super::row::{headers_from_json, headers_json, props_from_json, props_json};
use super::Shared;
use crate::storage::contract::{
    self, InflightEntry, InflightPhase, SessionEntry, SessionStore, ShareGroupKey, StorageError,
    SubscriptionEntry, WillEntry, BROADCAST_LOG_NAME,
};

const SQL_SESSION: &str =
    "SELECT client_id, principal, expiry_interval, detached_at, subscriptions, will, window
     FROM sessions WHERE client_id = ?1";
/// Every session in the table's own order: a restart's read, which takes
/// them in any order (by client id, the scan went through the key's index
/// to each row, 20-30 ms more at 100,000 sessions).
const SQL_SESSIONS: &str =
    "SELECT client_id, principal, expiry_interval, detached_at, subscriptions, will, window
     FROM sessions";
const SQL_SESSIONS_BY_CLIENT_ID: &str =
    "SELECT client_id, principal, expiry_interval, detached_at, subscriptions, will, window
     FROM sessions ORDER BY client_id";
const SQL_COUNT_SESSIONS: &str = "SELECT count(*) FROM sessions";
const SQL_INFLIGHT: &str = "SELECT log_offset, packet_id, qos, phase, share_group, share_filter
     FROM session_inflight WHERE client_id = ?1 ORDER BY seq";
const SQL_ALL_INFLIGHT: &str =
    "SELECT client_id, log_offset, packet_id, qos, phase, share_group, share_filter
     FROM session_inflight ORDER BY client_id, seq";

pub(crate) fn read_statements() -> Vec<String> {
    vec![
        SQL_SESSION.into(),
        SQL_SESSIONS.into(),
        SQL_COUNT_SESSIONS.into(),
        SQL_INFLIGHT.into(),
        SQL_ALL_INFLIGHT.into(),
    ]
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscriptionJson {
    filter: String,
    qos: u8,
    no_local: bool,
    retain_as_published: bool,
    retain_handling: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subscription_id: Option<u32>,
    log_offset: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WillJson {
    topic: String,
    /// base64: a Will payload is arbitrary bytes.
    payload: String,
    qos: u8,
    retain: bool,
    delay_interval: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    props: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user_properties: Option<serde_json::Value>,
}

/// The `subscriptions` column: one JSON array, every option the SUBSCRIBE
/// carried. The migrations write and read the column through this too.
pub(crate) fn subscriptions_json(subs: &[SubscriptionEntry]) -> String {
    let list: Vec<SubscriptionJson> = subs
        .iter()
        .map(|s| SubscriptionJson {
            filter: s.filter.clone(),
            qos: s.qos,
            no_local: s.no_local,
            retain_as_published: s.retain_as_published,
            retain_handling: s.retain_handling,
            subscription_id: s.subscription_id,
            log_offset: s.log_offset,
        })
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// The `will` column: one JSON object, the payload base64.
pub(crate) fn will_json(will: &WillEntry) -> String {
    let json = WillJson {
        topic: will.topic.clone(),
        payload: base64::engine::general_purpose::STANDARD.encode(&will.payload),
        qos: will.qos,
        retain: will.retain,
        delay_interval: will.delay_interval,
        props: props_json(&will.props).and_then(|t| serde_json::from_str(&t).ok()),
        user_properties: headers_json(&will.user_properties)
            .and_then(|t| serde_json::from_str(&t).ok()),
    };
    serde_json::to_string(&json).unwrap_or_default()
}

/// The `subscriptions` column read back.
pub(crate) fn subscriptions_from_json(text: &str) -> Result<Vec<SubscriptionEntry>, String> {
    let list: Vec<SubscriptionJson> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(list
        .into_iter()
        .map(|s| SubscriptionEntry {
            filter: s.filter,
            qos: s.qos,
            no_local: s.no_local,
            retain_as_published: s.retain_as_published,
            retain_handling: s.retain_handling,
            subscription_id: s.subscription_id,
            log_offset: s.log_offset,
        })
        .collect())
}

/// The `will` column read back.
pub(crate) fn will_from_json(text: &str) -> Result<WillEntry, String> {
    let json: WillJson =
        serde_json::from_str(text).map_err(|e| format!("will is not the will object: {e}"))?;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(json.payload.as_bytes())
        .map_err(|e| format!("will.payload is not base64: {e}"))?;
    let props = match json.props {
        Some(v) => props_from_json(&v.to_string())?,
        None => Default::default(),
    };
    let user_properties: Vec<UserProperty> = match json.user_properties {
        Some(v) => headers_from_json(&v.to_string())?,
        None => Vec::new(),
    };
    Ok(WillEntry {
        topic: json.topic,
        payload: Bytes::from(payload),
        qos: json.qos,
        retain: json.retain,
        delay_interval: json.delay_interval,
        props,
        user_properties,
    })
}

fn corrupt(column: usize, detail: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, detail.into())
}

/// A `sessions` row's own columns, its in-flight entries not yet read.
fn session_at(row: &rusqlite::Row<'_>) -> rusqlite::Result<SessionEntry> {
    let client_id: String = row.get(0)?;
    let subs_text: String = row.get(4)?;
    let subscriptions = subscriptions_from_json(&subs_text)
        .map_err(|e| corrupt(4, format!("subscriptions of {client_id}: {e}")))?;
    let will: Option<String> = row.get(5)?;
    let will = match will {
        Some(text) => Some(
            will_from_json(&text).map_err(|e| corrupt(5, format!("will of {client_id}: {e}")))?,
        ),
        None => None,
    };
    Ok(SessionEntry {
        principal: row.get(1)?,
        expiry_interval: row.get(2)?,
        detached_at: row.get(3)?,
        subscriptions,
        will,
        window: row.get(6)?,
        inflight: Vec::new(),
        client_id,
    })
}

/// A `session_inflight` row from its `log_offset` column on (the columns
/// of [`SQL_INFLIGHT`], after any before them).
fn inflight_at(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<InflightEntry> {
    let phase: String = row.get(first + 3)?;
    let phase = match phase.as_str() {
        "awaiting_ack" => InflightPhase::AwaitingAck,
        "awaiting_comp" => InflightPhase::AwaitingComp,
        other => return Err(corrupt(first + 3, format!("in-flight phase {other:?}"))),
    };
    let group: Option<String> = row.get(first + 4)?;
    let filter: Option<String> = row.get(first + 5)?;
    Ok(InflightEntry {
        log_offset: row.get(first)?,
        packet_id: row.get(first + 1)?,
        qos: row.get(first + 2)?,
        phase,
        shared_group: match (group, filter) {
            (Some(group), Some(filter)) => Some(ShareGroupKey { group, filter }),
            _ => None,
        },
    })
}

/// One session with its in-flight entries, read on `conn`.
fn session_of(conn: &Connection, client_id: &str) -> rusqlite::Result<Option<SessionEntry>> {
    let Some(mut session) = conn
        .prepare_cached(SQL_SESSION)?
        .query_row([client_id], session_at)
        .optional()?
    else {
        return Ok(None);
    };
    session.inflight = conn
        .prepare_cached(SQL_INFLIGHT)?
        .query_map([client_id], |r| inflight_at(r, 0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some(session))
}

/// Every session on `conn` with its in-flight entries, read as `sql`
/// lists the sessions: the in-flight table in one pass, then the
/// sessions, rather than a query of the in-flight table for each session
/// (100,000 of them took a restart 60 ms). An in-flight row whose
/// session is gone is not read, as it was not before.
fn sessions_listed(conn: &Connection, sql: &str) -> rusqlite::Result<Vec<SessionEntry>> {
    let mut inflight: HashMap<String, Vec<InflightEntry>> = HashMap::new();
    let mut stmt = conn.prepare_cached(SQL_ALL_INFLIGHT)?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let entry = inflight_at(row, 1)?;
        inflight.entry(row.get(0)?).or_default().push(entry);
    }
    // Made at its size: grown as it was read, the list was copied whole
    // at each doubling (a fifth of reading 100,000 sessions).
    let count: usize = conn
        .prepare_cached(SQL_COUNT_SESSIONS)?
        .query_row([], |r| r.get(0))?;
    let mut sessions = Vec::with_capacity(count);
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let mut session = session_at(row)?;
        session.inflight = inflight.remove(&session.client_id).unwrap_or_default();
        sessions.push(session);
    }
    Ok(sessions)
}

/// Every persistent session in the database behind `conn`, decoded as the
/// provider decodes them (subscriptions, Will, in-flight entries), ordered
/// by client id: for readers outside a provider, such as `sqlite dump`.
pub fn read_sessions(conn: &Connection) -> rusqlite::Result<Vec<SessionEntry>> {
    sessions_listed(conn, SQL_SESSIONS_BY_CLIENT_ID)
}

/// Writes one session - its row and its in-flight entries, replacing
/// whatever was stored under its client id - inside the open transaction:
/// the session store's save, and a migration's copy.
pub(crate) fn write_session(conn: &Connection, session: &SessionEntry) -> rusqlite::Result<()> {
    let subs = subscriptions_json(&session.subscriptions);
    let will = session.will.as_ref().map(will_json);
    conn.prepare_cached(
        "INSERT INTO sessions (client_id, principal, expiry_interval, detached_at, subscriptions, will, window)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (client_id) DO UPDATE SET principal = excluded.principal,
             expiry_interval = excluded.expiry_interval, detached_at = excluded.detached_at,
             subscriptions = excluded.subscriptions, will = excluded.will, window = excluded.window",
    )?
    .execute(rusqlite::params![
        session.client_id,
        session.principal,
        session.expiry_interval,
        session.detached_at,
        subs,
        will,
        session.window
    ])?;
    conn.prepare_cached("DELETE FROM session_inflight WHERE client_id = ?1")?
        .execute([&session.client_id])?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO session_inflight (client_id, seq, log_offset, packet_id, qos, phase, share_group, share_filter)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (seq, e) in session.inflight.iter().enumerate() {
        let phase = match e.phase {
            InflightPhase::AwaitingAck => "awaiting_ack",
            InflightPhase::AwaitingComp => "awaiting_comp",
        };
        insert.execute(rusqlite::params![
            session.client_id,
            seq as i64,
            e.log_offset,
            e.packet_id,
            e.qos,
            phase,
            e.shared_group.as_ref().map(|k| k.group.as_str()),
            e.shared_group.as_ref().map(|k| k.filter.as_str()),
        ])?;
    }
    Ok(())
}

pub(crate) struct Sessions {
    shared: Arc<Shared>,
}

impl Sessions {
    pub fn new(shared: Arc<Shared>) -> Sessions {
        Sessions { shared }
    }
}

impl SessionStore for Sessions {
    fn save(&self, session: SessionEntry) -> contract::Result<()> {
        if session.inflight.len() > usize::from(session.window) {
            return Err(StorageError::Invalid {
                what: format!("session {}", session.client_id),
                detail: format!(
                    "{} messages in flight is more than its window of {}",
                    session.inflight.len(),
                    session.window
                ),
            });
        }
        let mut w = self.shared.writer()?;
        let result = w.txn(true, |conn| write_session(conn, &session));
        result.map_err(|e| {
            self.shared.write_error(
                Some(w.conn()),
                format!("session {}: saving", session.client_id),
                0,
                &e,
            )
        })
    }

    fn get(&self, client_id: &str) -> contract::Result<Option<SessionEntry>> {
        self.shared.read(
            || format!("session {client_id}: reading"),
            |conn| session_of(conn, client_id),
        )
    }

    fn remove(&self, client_id: &str) -> contract::Result<bool> {
        let cursor = format!("mqtt:{client_id}");
        let mut w = self.shared.writer()?;
        w.txn(true, |conn| {
            let n = conn
                .prepare_cached("DELETE FROM sessions WHERE client_id = ?1")?
                .execute([client_id])?;
            conn.prepare_cached("DELETE FROM session_inflight WHERE client_id = ?1")?
                .execute([client_id])?;
            conn.prepare_cached("DELETE FROM positions WHERE channel = ?1 AND reader = ?2")?
                .execute(rusqlite::params![BROADCAST_LOG_NAME, cursor])?;
            Ok(n > 0)
        })
        .map_err(|e| {
            self.shared.write_error(
                Some(w.conn()),
                format!("session {client_id}: ending"),
                0,
                &e,
            )
        })
    }

    fn sessions(&self) -> contract::Result<Vec<SessionEntry>> {
        self.shared.read(
            || "reading sessions".into(),
            |conn| sessions_listed(conn, SQL_SESSIONS),
        )
    }
}
