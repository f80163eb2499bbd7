//! `broker_session.rs` once more, with sessions and retained messages kept in
//! a sqlite provider: `broker_support` reads this target's name.

#[path = "broker_session.rs"]
mod on_sqlite;
