//! The sqlite provider (schema version 20).
