//! Snapshot directories: the manifest, one format 21 file per channel, writing and loading.
