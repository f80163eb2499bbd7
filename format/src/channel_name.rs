//! Channel names to file names and back (RFC 0004 "One file per channel, and the manifest").
