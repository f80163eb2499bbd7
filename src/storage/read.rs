//! Bounded reading of a file from disk: file type checked with lstat first, size limit before reading.
