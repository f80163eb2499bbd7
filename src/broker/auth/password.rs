//! Password checks against the password file, and new entries for it.

use base64::Engine as _;
use sha2::{Digest, Sha512};

use crate::config::auth::{
    HashScheme, PasswordFile, StoredHash, MAX_PBKDF2_ITERATIONS, SALT_LEN, SHA512_LEN,
};

/// The stored hash's derivation of `password`: for `$7$`, PBKDF2-HMAC-SHA512
/// over the salt and iterations the file gives.
fn derive(stored: &StoredHash, password: &[u8]) -> Vec<u8> {
    match stored.scheme {
        HashScheme::Pbkdf2Sha512 { iterations } => {
            let mut out = vec![0u8; stored.hash.len()];
            pbkdf2::pbkdf2_hmac::<Sha512>(password, &stored.salt, iterations, &mut out);
            out
        }
        HashScheme::Sha512 => {
            let mut hasher = Sha512::new();
            hasher.update(password);
            hasher.update(&stored.salt);
            hasher.finalize().to_vec()
        }
    }
}

/// Whether `password` is `user`'s. The hash comparison takes the same time
/// wherever the first difference is, and an unknown user costs a
/// derivation too, so timing tells neither.
pub fn check_password(file: &PasswordFile, user: &str, password: &[u8]) -> bool {
    match file.stored(user) {
        Some(stored) => constant_time_eq(&derive(stored, password), &stored.hash),
        None => {
            let dummy = StoredHash {
                scheme: HashScheme::Pbkdf2Sha512 { iterations: 101 },
                salt: vec![0; SALT_LEN],
                hash: vec![0; SHA512_LEN],
            };
            let _ = constant_time_eq(&derive(&dummy, password), &dummy.hash);
            false
        }
    }
}

/// Hash `password` into the `$7$iterations$salt$hash` field of a
/// mosquitto_passwd line (PBKDF2-HMAC-SHA512, a fresh 12-byte random salt,
/// standard base64), which [`PasswordFile`] reads.
pub fn hash_password(password: &[u8], iterations: u32) -> Result<String, String> {
    if !(1..=MAX_PBKDF2_ITERATIONS).contains(&iterations) {
        return Err(format!(
            "iteration count {iterations} is outside 1..={MAX_PBKDF2_ITERATIONS}"
        ));
    }
    let mut salt = [0u8; SALT_LEN];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut salt)
        .map_err(|_| "the system's random number generator failed".to_string())?;
    let stored = StoredHash {
        scheme: HashScheme::Pbkdf2Sha512 { iterations },
        salt: salt.to_vec(),
        hash: vec![0; SHA512_LEN],
    };
    let hash = derive(&stored, password);
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(format!(
        "$7${iterations}${}${}",
        b64.encode(salt),
        b64.encode(hash)
    ))
}

/// Compare without an early exit, so the time taken does not say how many
/// leading bytes matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= std::hint::black_box(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::auth::is_hashed;

    /// `mosquitto_passwd`-compatible $7$ line for `password`.
    fn pbkdf2_line(user: &str, password: &str, iterations: u32) -> String {
        let salt = b"0123456789ab";
        let mut out = [0u8; 64];
        pbkdf2::pbkdf2_hmac::<Sha512>(password.as_bytes(), salt, iterations, &mut out);
        let b64 = base64::engine::general_purpose::STANDARD;
        format!(
            "{user}:$7${iterations}${}${}",
            b64.encode(salt),
            b64.encode(out)
        )
    }

    #[test]
    fn hash_password_writes_lines_the_file_reads() {
        let field = hash_password(b"s3cret", 101).unwrap();
        assert!(field.starts_with("$7$101$"), "{field}");
        let again = hash_password(b"s3cret", 101).unwrap();
        assert_ne!(field, again, "a fresh salt each time");
        let file = PasswordFile::parse(&format!("alice:{field}\nbob:{again}\n")).unwrap();
        assert!(check_password(&file, "alice", b"s3cret"));
        assert!(!check_password(&file, "alice", b"S3cret"));
        assert!(is_hashed(&field));
        assert!(!is_hashed("s3cret"));
        assert!(hash_password(b"x", 0).is_err());
    }

    #[test]
    fn pbkdf2_and_sha512_lines_check_passwords() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let salt = b"saltsaltsalt";
        let mut hasher = Sha512::new();
        hasher.update(b"pw6");
        hasher.update(salt);
        let sha6 = format!(
            "bob:$6${}${}",
            b64.encode(salt),
            b64.encode(hasher.finalize())
        );
        let text = format!(
            "# users\n{}\n\n{sha6}\r\n",
            pbkdf2_line("alice", "s3cret", 101)
        );
        let file = PasswordFile::parse(&text).unwrap();
        assert_eq!(file.len(), 2);
        assert!(check_password(&file, "alice", b"s3cret"));
        assert!(!check_password(&file, "alice", b"s3cret "));
        assert!(!check_password(&file, "alice", b""));
        assert!(check_password(&file, "bob", b"pw6"));
        assert!(!check_password(&file, "bob", b"s3cret"));
        assert!(!check_password(&file, "carol", b"s3cret"));
        assert!(file.contains("alice") && !file.contains("carol"));
    }

    #[test]
    fn a_known_mosquitto_passwd_line_verifies() {
        // User "test", password "test", 101 iterations, the hash computed
        // independently by `openssl kdf -keylen 64 -kdfopt digest:SHA512 ... PBKDF2`.
        let line = "test:$7$101$B8rkFZb0JoDNgUeA$wX5cM7WJH3I6E0vK5HwtsCBOT+JrcEnBzvqRkxBq4/fGNlFh9XrFMRZF/aKX7gVrdZXj486o+9AsXuzfa80GWw==";
        let file = PasswordFile::parse(line).unwrap();
        assert!(check_password(&file, "test", b"test"));
        assert!(!check_password(&file, "test", b"Test"));
    }
}
