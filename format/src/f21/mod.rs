//! Format 21: saguin snapshot files (channel files, manifest, retained store, sessions, broadcast log).
