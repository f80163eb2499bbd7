//! The lock: one broker at a time per provider (RFC 0004 "One broker at a time: the lock").
