//! The store contracts both providers implement (RFC 0004 "What a store is asked for").
