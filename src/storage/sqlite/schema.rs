//! The schema: eleven STRICT tables at
//! `user_version` 20, created in one transaction with the version and the
//! meta row, so a file can never hold one without the other.
//!
//! Indexes beside the primary keys ([`INDEXES`]) are not part of what the
//! version states: each is derived from its table's rows, so a file an
//! earlier build of version 20 wrote without one is the same data, and
//! opening it for writing creates what it lacks (once, logged) rather than
//! refusing it. A build that does not know an index still reads and writes
//! a file holding it: SQLite keeps an index whoever writes the table. The
//! version changes only when rows would be read differently, which is
//! exactly when old files must stop opening.
//!
//! Conventions every table follows:
//! - timestamps are unix nanoseconds, `0` = unset (never a date in 1754);
//! - `headers` is the record's User Properties as a JSON array of
//!   `[name, value]` pairs in the publisher's order, `NULL` when it has none;
//! - `props` is the five publish properties as one JSON object, `NULL` when
//!   none is set; correlation data in it is base64;
//! - `size` is [`Record::accounted_size`](saguin_format::model::Record::accounted_size)
//!   as the store computed it on the way in, so a removal gives back exactly
//!   what the write counted (sizes are never computed in SQL);
//! - nothing uses `INSERT OR REPLACE`: the primary key on `(channel, offset)`
//!   makes a reused offset a failed insert rather than a silent overwrite.

use std::path::Path;

/// The record columns as a literal, for `concat!` into statements that are
/// prepared once.
macro_rules! record_columns {
    () => {
        "message_id, topic, timestamp, headers, payload, props, retain, bridge, client_id, qos, shared_copy, owed_to, size"
    };
}
pub(crate) use record_columns;

/// The record columns a served value is made from, in the order
/// [`super::row::with_served_at`] reads them: a record's less its
/// message id, publisher, bridge, sharing marks and size, which the broker
/// does not serve.
macro_rules! served_columns {
    () => {
        "topic, timestamp, headers, payload, props, retain, qos"
    };
}
pub(crate) use served_columns;

use rusqlite::{Connection, OptionalExtension};

use super::SqliteOpenError;

/// The one schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = 20;

/// The page size pinned on a database saguin creates: a bound in pages rounds the same on every machine.
pub const PAGE_SIZE: u64 = 4096;

/// The record columns shared by `records`, `latest_values`, `queue_items`
/// and `held_publishes`, in the order [`super::row`] binds and reads them.
pub const RECORD_COLUMNS: &str = record_columns!();

const RECORD_COLUMN_DDL: &str = "
    message_id BLOB NOT NULL,
    topic TEXT NOT NULL,
    timestamp INTEGER NOT NULL,
    headers TEXT,
    payload BLOB NOT NULL,
    props TEXT,
    retain INTEGER NOT NULL,
    bridge TEXT,
    client_id TEXT NOT NULL,
    qos INTEGER NOT NULL,
    shared_copy INTEGER NOT NULL,
    owed_to TEXT,
    size INTEGER NOT NULL";

/// The eleven tables.
pub const TABLES: [&str; 11] = [
    "meta",
    "channels",
    "records",
    "latest_values",
    "queue_items",
    "positions",
    "held_publishes",
    "sessions",
    "session_inflight",
    "share_groups",
    "share_returned",
];

/// An index beside the primary keys: its name and what it is on.
pub struct Index {
    pub name: &'static str,
    /// `ON <table> (<columns>)`.
    pub on: &'static str,
}

impl Index {
    /// The statement that creates it, `IF NOT EXISTS` so it is also what
    /// brings a file an earlier build wrote up to date.
    pub fn create_sql(&self) -> String {
        format!("CREATE INDEX IF NOT EXISTS {} {}", self.name, self.on)
    }

    /// Its statement as SQLite keeps it in `sqlite_schema` (the clause
    /// `IF NOT EXISTS` removed): what a file holding this definition of it
    /// reads back.
    fn kept_sql(&self) -> String {
        format!("CREATE INDEX {} {}", self.name, self.on)
    }
}

/// The indexes beside the primary keys.
///
/// `latest_values_by_offset`: a latest channel's changes since an offset
/// (a consumer resuming, `sqlite dump --from`, a trim's oldest value) are
/// a range of it, not a scan of every topic. It also carries `deleted`
/// and `size`, so a channel's open sums its bytes and counts its values
/// and markers from the index alone, without visiting every row (a third
/// of the time at 10,000 values); an entry changes whenever those do, as
/// its offset changes with every write of the row. Files an earlier build
/// wrote hold it on `(channel, offset)` only, and are given this one at
/// open.
pub const INDEXES: [Index; 1] = [Index {
    name: "latest_values_by_offset",
    on: "ON latest_values (channel, offset, deleted, size)",
}];

fn ddl() -> String {
    format!(
        "
CREATE TABLE meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    schema_version INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE channels (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('append', 'latest', 'queue')),
    next INTEGER NOT NULL CHECK (next >= 1),
    floor INTEGER NOT NULL CHECK (floor >= 1 AND floor <= next),
    bytes INTEGER NOT NULL CHECK (bytes >= 0)
) STRICT;

CREATE TABLE records (
    channel TEXT NOT NULL,
    offset INTEGER NOT NULL,{RECORD_COLUMN_DDL},
    PRIMARY KEY (channel, offset)
) STRICT;

CREATE TABLE latest_values (
    channel TEXT NOT NULL,
    offset INTEGER NOT NULL,
    deleted INTEGER NOT NULL,{RECORD_COLUMN_DDL},
    PRIMARY KEY (channel, topic)
) STRICT;

CREATE TABLE queue_items (
    channel TEXT NOT NULL,
    offset INTEGER NOT NULL,{RECORD_COLUMN_DDL},
    attempts INTEGER NOT NULL,
    first_delivered INTEGER NOT NULL,
    last_delivered INTEGER NOT NULL,
    PRIMARY KEY (channel, offset)
) STRICT;

CREATE TABLE positions (
    channel TEXT NOT NULL,
    reader TEXT NOT NULL,
    offset INTEGER NOT NULL,
    saved_at INTEGER NOT NULL,
    session_expiry INTEGER,
    PRIMARY KEY (channel, reader)
) STRICT;

CREATE TABLE held_publishes (
    channel TEXT NOT NULL,
    holder_client_id TEXT NOT NULL,
    packet_id INTEGER NOT NULL,
    held_at INTEGER NOT NULL,{RECORD_COLUMN_DDL},
    PRIMARY KEY (channel, holder_client_id, packet_id)
) STRICT;

CREATE TABLE sessions (
    client_id TEXT PRIMARY KEY,
    principal TEXT,
    expiry_interval INTEGER NOT NULL,
    detached_at INTEGER NOT NULL,
    subscriptions TEXT NOT NULL,
    will TEXT,
    window INTEGER NOT NULL
) STRICT;

CREATE TABLE session_inflight (
    client_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    packet_id INTEGER NOT NULL,
    qos INTEGER NOT NULL,
    phase TEXT NOT NULL CHECK (phase IN ('awaiting_ack', 'awaiting_comp')),
    share_group TEXT,
    share_filter TEXT,
    PRIMARY KEY (client_id, seq),
    UNIQUE (client_id, packet_id)
) STRICT;

CREATE TABLE share_groups (
    group_name TEXT NOT NULL,
    filter TEXT NOT NULL,
    cursor INTEGER NOT NULL,
    PRIMARY KEY (group_name, filter)
) STRICT;

CREATE TABLE share_returned (
    group_name TEXT NOT NULL,
    filter TEXT NOT NULL,
    log_offset INTEGER NOT NULL,
    PRIMARY KEY (group_name, filter, log_offset)
) STRICT;
"
    )
}

/// Whether `conn`'s database holds any table at all.
fn has_tables(conn: &Connection) -> rusqlite::Result<bool> {
    let n: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
        [],
        |r| r.get(0),
    )?;
    Ok(n > 0)
}

/// Refuses, by reading only, a database of another schema version or one
/// holding tables it states no version for. Run before anything is set on
/// the file (WAL mode rewrites the header): a refused database is left
/// byte for byte as it was found, the evidence of what it is.
pub fn refuse_foreign(conn: &Connection, path: &Path) -> Result<i64, SqliteOpenError> {
    let sqlite_err = |source| SqliteOpenError::Sqlite {
        path: path.to_path_buf(),
        context: "reading the schema version",
        source,
    };
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sqlite_err)?;
    if version == SCHEMA_VERSION {
        return Ok(version);
    }
    if version != 0 {
        return Err(refusal(conn, path, version));
    }
    if has_tables(conn).map_err(sqlite_err)? {
        return Err(SqliteOpenError::Unversioned {
            path: path.to_path_buf(),
        });
    }
    Ok(version)
}

/// Create the schema on an empty database, or check an existing one states
/// version 20. `created_by` and `created_at` go into the meta row.
pub fn apply_or_check(
    conn: &mut Connection,
    path: &Path,
    created_by: &str,
    created_at: i64,
) -> Result<(), SqliteOpenError> {
    if refuse_foreign(conn, path)? == SCHEMA_VERSION {
        check_tables(conn, path)?;
        return add_missing_indexes(conn, path);
    }
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|source| SqliteOpenError::Sqlite {
            path: path.to_path_buf(),
            context: "creating the schema",
            source,
        })?;
    let created = tx
        .execute_batch(&ddl())
        .and_then(|()| {
            INDEXES
                .iter()
                .try_for_each(|index| tx.execute_batch(&index.create_sql()))
        })
        .and_then(|()| {
            tx.execute(
                "INSERT INTO meta (id, schema_version, created_by, created_at) VALUES (1, ?1, ?2, ?3)",
                rusqlite::params![SCHEMA_VERSION, created_by, created_at],
            )
        })
        // `user_version` is in the database header, so it commits with the
        // tables or not at all.
        .and_then(|_| tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}")))
        .and_then(|()| tx.commit());
    created.map_err(|source| SqliteOpenError::Sqlite {
        path: path.to_path_buf(),
        context: "creating the schema",
        source,
    })
}

/// Whether the schema holds a `kind` (`table`, `index`) called `name`.
fn in_schema(conn: &Connection, kind: &str, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT 1 FROM sqlite_schema WHERE type = ?1 AND name = ?2",
        [kind, name],
        |r| r.get::<_, i64>(0),
    )
    .optional()
    .map(|found| found.is_some())
}

/// Creates the [`INDEXES`] a version-20 file lacks, and builds again the
/// ones it holds by another definition (an earlier build's, or a later
/// one's after a downgrade: either reads the same rows), in one
/// transaction.
fn add_missing_indexes(conn: &mut Connection, path: &Path) -> Result<(), SqliteOpenError> {
    let sqlite_err = |source| SqliteOpenError::Sqlite {
        path: path.to_path_buf(),
        context: "creating the indexes an earlier build did not",
        source,
    };
    let mut changes = Vec::new();
    for index in &INDEXES {
        match file_index_sql(conn, index.name).map_err(sqlite_err)? {
            None => changes.push((index, false)),
            Some(kept) if kept != index.kept_sql() => changes.push((index, true)),
            Some(_) => {}
        }
    }
    if changes.is_empty() {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sqlite_err)?;
    for (index, earlier) in &changes {
        if *earlier {
            tx.execute_batch(&format!("DROP INDEX {}", index.name))
                .map_err(sqlite_err)?;
        }
        tx.execute_batch(&index.create_sql()).map_err(sqlite_err)?;
    }
    tx.commit().map_err(sqlite_err)?;
    for (index, earlier) in changes {
        if earlier {
            tracing::info!(file = %path.display(), index = index.name, on = index.on,
                "built an index again that the file held by another build's definition");
        } else {
            tracing::info!(file = %path.display(), index = index.name,
                "created an index the file lacked (written by an earlier build of schema 20)");
        }
    }
    Ok(())
}

/// The statement `sqlite_schema` keeps for the index called `name`, if the
/// file holds one.
fn file_index_sql(conn: &Connection, name: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT sql FROM sqlite_schema WHERE type = 'index' AND name = ?1",
        [name],
        |r| r.get(0),
    )
    .optional()
}

/// A version-20 file must hold every table; one that does not was damaged
/// or edited, and is refused by name rather than half used.
fn check_tables(conn: &Connection, path: &Path) -> Result<(), SqliteOpenError> {
    let mut missing = Vec::new();
    for table in TABLES {
        let found = in_schema(conn, "table", table).map_err(|source| SqliteOpenError::Sqlite {
            path: path.to_path_buf(),
            context: "reading the schema",
            source,
        })?;
        if !found {
            missing.push(table);
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(SqliteOpenError::MissingTables {
            path: path.to_path_buf(),
            tables: missing.join(", "),
        })
    }
}

/// The refusal of a file stating another version, naming who created it
/// when its meta row can be read.
fn refusal(conn: &Connection, path: &Path, version: i64) -> SqliteOpenError {
    let creator = conn
        .query_row(
            "SELECT created_by, created_at FROM meta WHERE id = 1",
            [],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
        )
        .ok();
    SqliteOpenError::SchemaVersion {
        path: path.to_path_buf(),
        version,
        created_by: creator.as_ref().map(|(by, _)| by.clone()),
        created_at: creator.map(|(_, at)| at),
    }
}

/// Who created the database and when, from its meta row.
pub fn creator(conn: &Connection) -> rusqlite::Result<(String, i64)> {
    conn.query_row(
        "SELECT created_by, created_at FROM meta WHERE id = 1",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Every table's row count, in [`TABLES`] order: what a backup compares
/// between its source and its copy.
pub fn row_counts(conn: &Connection) -> rusqlite::Result<Vec<(String, u64)>> {
    TABLES
        .iter()
        .map(|t| {
            let n: i64 =
                conn.query_row(&format!("SELECT count(*) FROM \"{t}\""), [], |r| r.get(0))?;
            Ok(((*t).to_owned(), n.max(0) as u64))
        })
        .collect()
}
