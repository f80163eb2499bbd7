//! Secrets redacted by type.
//!
//! Whatever is a secret - private key bytes, password hashes and salts, the
//! rules of an ACL file - is held in a [`Secret`], whose `Debug`, `Display`
//! and `Serialize` all write `<redacted>`. Redaction is therefore decided by
//! the schema, where the value is declared, rather than by a list of key
//! names an output routine has to remember. Paths to files holding secrets
//! (`tls.key`, `auth.password_file`) are not secrets and are printed.

use std::fmt;

/// What every rendering of a secret shows.
pub const REDACTED: &str = "<redacted>";

/// A value that is never printed, logged or serialized.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    pub fn new(value: T) -> Secret<T> {
        Secret(value)
    }

    /// The value itself, for the code that has to use it (a TLS acceptor, a
    /// password check). Never format what this returns.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T> serde::Serialize for Secret<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rendering_is_redacted() {
        let secret = Secret::new("hunter2".to_string());
        assert_eq!(format!("{secret:?}"), REDACTED);
        assert_eq!(format!("{secret}"), REDACTED);
        assert_eq!(serde_json::to_string(&secret).unwrap(), "\"<redacted>\"");
        assert_eq!(secret.expose(), "hunter2");
    }
}
