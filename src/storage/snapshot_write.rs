//! Writing a snapshot directory at shutdown: copy under the lock, write after it, manifest first.
