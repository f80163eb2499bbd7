//! Exactly-once publishes held until their PUBREL (`held_publishes`), in the
//! database of the channel they are for. A hold carries no offset: one
//! assigned before the release could be passed by a consumer while the row
//! still waited. Its release is one relief transaction - the record written
//! at the channel's next offset and the row deleted - so there is never a
//! moment with both or with neither.

use std::sync::Arc;

use rusqlite::OptionalExtension;
use saguin_format::model::{Record, UnixNanos};

use super::channel::{publish_counters, write_counter_rows, Pending};
use super::row::{record_at, Encoded};
use super::schema::record_columns;
use super::{Shared, SqliteProvider};
use crate::storage::contract::{self, HeldPublish, HeldPublishStore, StorageError};

pub(crate) struct Held {
    shared: Arc<Shared>,
}

const SQL_ONE: &str = concat!(
    "SELECT held_at, ",
    record_columns!(),
    " FROM held_publishes WHERE channel = ?1 AND holder_client_id = ?2 AND packet_id = ?3"
);

pub(crate) const SQL_ALL: &str = concat!(
    "SELECT channel, holder_client_id, packet_id, held_at, ",
    record_columns!(),
    " FROM held_publishes ORDER BY channel, holder_client_id, packet_id"
);

impl Held {
    pub fn new(shared: Arc<Shared>) -> Held {
        Held { shared }
    }
}

impl HeldPublishStore for Held {
    fn hold(&self, mut held: HeldPublish) -> contract::Result<()> {
        contract::check_hold(&held)?;
        // A held publish takes its offset at its release, never before.
        held.record.offset = 0;
        // The release is a relief write, so a hold is bounded like the
        // publish it is: refused while publishes are, or a QoS 2 publisher
        // could fill the reserve through the back door.
        self.shared
            .refuse_if_publishes_are(held.record.accounted_size())?;
        let encoded = Encoded::new(&held.record);
        let mut w = self.shared.writer()?;
        let result = w.txn(false, |conn| {
            let p = encoded.params();
            conn.prepare_cached(concat!(
                "INSERT INTO held_publishes (channel, holder_client_id, packet_id, held_at, ",
                record_columns!(),
                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
                 ON CONFLICT (channel, holder_client_id, packet_id) DO UPDATE SET held_at = excluded.held_at,
                     message_id = excluded.message_id, topic = excluded.topic, timestamp = excluded.timestamp,
                     headers = excluded.headers, payload = excluded.payload, props = excluded.props,
                     retain = excluded.retain, bridge = excluded.bridge, client_id = excluded.client_id,
                     qos = excluded.qos, shared_copy = excluded.shared_copy, owed_to = excluded.owed_to,
                     size = excluded.size"
            ))?
            .execute(rusqlite::params![
                held.channel, held.client_id, held.packet_id, held.held_at, p[0], p[1], p[2], p[3], p[4], p[5],
                p[6], p[7], p[8], p[9], p[10], p[11], p[12]
            ])
        });
        result.map(|_| ()).map_err(|e| {
            self.shared.write_error(
                Some(w.conn()),
                format!(
                    "channel {}: holding packet {} of {}",
                    held.channel, held.packet_id, held.client_id
                ),
                encoded.size,
                &e,
            )
        })
    }

    fn release(
        &self,
        channel: &str,
        client_id: &str,
        packet_id: u16,
    ) -> contract::Result<Option<Record>> {
        let target = SqliteProvider::target_of(&self.shared, channel).ok_or_else(|| {
            StorageError::Invalid {
                what: format!("channel {channel}: releasing packet {packet_id} of {client_id}"),
                detail: "the channel is not open in this provider".into(),
            }
        })?;
        let mut w = self.shared.writer()?;
        let mut pending = vec![(Arc::clone(&target), Pending::of(&*target))];
        let result = w.txn(true, |conn| {
            let row = conn
                .prepare_cached(SQL_ONE)?
                .query_row(rusqlite::params![channel, client_id, packet_id], |r| record_at(r, 1, 0))
                .optional()?;
            let Some(mut stored) = row else {
                return Ok(None);
            };
            // A latest channel's empty payload deletes, taking no offset
            // when the topic held nothing (offset 0).
            stored.offset = target.stage(conn, &mut pending[0].1, &stored)?.unwrap_or(0);
            conn.prepare_cached(
                "DELETE FROM held_publishes WHERE channel = ?1 AND holder_client_id = ?2 AND packet_id = ?3",
            )?
            .execute(rusqlite::params![channel, client_id, packet_id])?;
            write_counter_rows(conn, &pending)?;
            Ok(Some(stored))
        });
        match result {
            Ok(Some(stored)) => {
                publish_counters(pending);
                Ok(Some(stored))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.shared.write_error(
                Some(w.conn()),
                format!("channel {channel}: releasing packet {packet_id} of {client_id}"),
                0,
                &e,
            )),
        }
    }

    fn drop_hold(&self, channel: &str, client_id: &str, packet_id: u16) -> contract::Result<bool> {
        let mut w = self.shared.writer()?;
        w.txn(false, |conn| {
            conn.prepare_cached(
                "DELETE FROM held_publishes WHERE channel = ?1 AND holder_client_id = ?2 AND packet_id = ?3",
            )?
            .execute(rusqlite::params![channel, client_id, packet_id])
        })
        .map(|n| n > 0)
        .map_err(|e| {
            self.shared.write_error(
                Some(w.conn()),
                format!("channel {channel}: dropping packet {packet_id} of {client_id}"),
                0,
                &e,
            )
        })
    }

    fn expire_older_than(&self, cutoff: UnixNanos) -> contract::Result<u64> {
        let mut w = self.shared.writer()?;
        w.txn(false, |conn| {
            conn.prepare_cached("DELETE FROM held_publishes WHERE held_at < ?1")?
                .execute([cutoff])
        })
        .map(|n| n as u64)
        .map_err(|e| {
            self.shared
                .write_error(Some(w.conn()), "expiring held publishes".into(), 0, &e)
        })
    }

    fn held(&self) -> contract::Result<Vec<HeldPublish>> {
        self.shared
            .read(|| "reading held publishes".into(), all_held)
    }
}

/// Every held exactly-once publish, by channel, holder and packet id (the
/// held-publish store's `held`, and `saguin sqlite dump`'s).
pub fn all_held(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<HeldPublish>> {
    let mut stmt = conn.prepare_cached(SQL_ALL)?;
    let rows = stmt.query_map([], |r| {
        Ok(HeldPublish {
            channel: r.get(0)?,
            client_id: r.get(1)?,
            packet_id: r.get(2)?,
            held_at: r.get(3)?,
            record: record_at(r, 4, 0)?,
        })
    })?;
    rows.collect()
}
