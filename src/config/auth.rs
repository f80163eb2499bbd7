//! The password file and the ACL file, parsed once here for both the broker
//! and `check-config`.
//!
//! **Password file**: mosquitto_passwd's format, one `user:hash` a line.
//! Read: `$7$ITERATIONS$SALT$HASH` (PBKDF2-HMAC-SHA512, salt and hash in
//! standard base64, the hash 64 bytes) and the older `$6$SALT$HASH`
//! (SHA-512 of password then salt). Empty lines and lines starting with `#`
//! are skipped. Refused, each by line number: a line without `:`, an empty
//! user name, a duplicate user, a plain-text password, an unknown hash type
//! (`$8$` argon2 included), bad base64, a hash that is not 64 bytes, and
//! iterations outside 1..=10,000,000 (a bound so a damaged file cannot make
//! every CONNECT cost minutes).
//!
//! **ACL file**: mosquitto's acl_file syntax.
//!
//! ```text
//! # comment
//! topic read sensors/#          # before any `user` line: applies to everyone
//! user alice
//! topic readwrite alice/#       # applies to alice
//! topic deny alice/secret
//! pattern write devices/%c/out  # %c client id, %u user name: applies to everyone
//! ```
//!
//! `topic [read|write|readwrite|deny] FILTER` (access defaults to
//! readwrite); `pattern` is the same with `%u` and `%c` substituted and
//! applies to every client wherever it appears, as in mosquitto. Unlike
//! mosquitto, `topic` lines before the first `user` line apply to everyone,
//! not only to anonymous clients (SAGUIN.md §3). A `deny` that matches wins
//! over any grant; with no matching grant the answer is no. A pattern is
//! not applied for a user name or client id containing `/`, `+` or `#` (a
//! client id `a/#` must not widen `devices/%c`); a deny pattern in that case
//! denies. A filter whose first level is a wildcard does not match topics
//! starting with `$`. A filter containing spaces must give its access word
//! (`topic readwrite my topic`), so a misspelt access word is an error
//! rather than a topic.
//!
//! Neither file's contents - hashes, salts, rules - is ever printed or
//! logged: they sit in [`Secret`]s, and problems name the line, never its
//! text.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use sha2::{Digest, Sha512};

use super::secret::Secret;
use crate::topic::{filter_covers, validate_filter};

/// Largest password or ACL file read.
const MAX_AUTH_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Why a password file without users is refused where anonymous clients
/// are not welcome (at startup and at a reload).
pub const EMPTY_PASSWORD_FILE: &str =
    "holds no users and allow_anonymous is false; no client could connect";

/// Iterations above this are refused: a CONNECT pays them.
pub const MAX_PBKDF2_ITERATIONS: u32 = 10_000_000;

const SHA512_LEN: usize = 64;

/// A problem in a password or ACL file: the 1-based line and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineProblem {
    pub line: usize,
    pub message: String,
}

#[derive(Clone, PartialEq, Eq)]
enum HashScheme {
    /// `$7$`: PBKDF2-HMAC-SHA512.
    Pbkdf2Sha512 { iterations: u32 },
    /// `$6$`: SHA-512(password ‖ salt).
    Sha512,
}

#[derive(Clone, PartialEq, Eq)]
struct StoredHash {
    scheme: HashScheme,
    salt: Vec<u8>,
    hash: Vec<u8>,
}

impl StoredHash {
    fn derive(&self, password: &[u8]) -> Vec<u8> {
        match self.scheme {
            HashScheme::Pbkdf2Sha512 { iterations } => {
                let mut out = vec![0u8; self.hash.len()];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, &self.salt, iterations, &mut out);
                out
            }
            HashScheme::Sha512 => {
                let mut hasher = Sha512::new();
                hasher.update(password);
                hasher.update(&self.salt);
                hasher.finalize().to_vec()
            }
        }
    }
}

/// A parsed password file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswordFile {
    entries: Secret<HashMap<String, StoredHash>>,
    /// SHA-256 of the file's bytes, hex: printed by `check-config --output`
    /// so two deployments' files can be compared without showing them.
    sha256: String,
}

impl PasswordFile {
    /// Read and parse `path`. Errors name the path and a line, never its text.
    pub fn load(path: &Path) -> Result<PasswordFile, Vec<String>> {
        let bytes = super::read_bounded(path, MAX_AUTH_FILE_BYTES).map_err(|e| vec![e])?;
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            vec![format!(
                "{}: not UTF-8 text (invalid byte at offset {})",
                path.display(),
                e.valid_up_to()
            )]
        })?;
        PasswordFile::parse(text).map_err(|problems| {
            problems
                .into_iter()
                .map(|p| format!("{} line {}: {}", path.display(), p.line, p.message))
                .collect()
        })
    }

    /// Parse the text of a password file; every bad line is reported.
    pub fn parse(text: &str) -> Result<PasswordFile, Vec<LineProblem>> {
        let mut entries: HashMap<String, StoredHash> = HashMap::new();
        let mut first_line: HashMap<String, usize> = HashMap::new();
        let mut problems = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = raw.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fail = |message: String| {
                problems.push(LineProblem {
                    line: line_no,
                    message,
                })
            };
            let Some((user, hash)) = line.split_once(':') else {
                fail("no ':' between the user name and the hash".to_string());
                continue;
            };
            if user.is_empty() {
                fail("empty user name".to_string());
                continue;
            }
            match parse_hash(hash) {
                Ok(stored) => {
                    if let Some(first) = first_line.get(user) {
                        fail(format!("user {user:?} again (first on line {first})"));
                        continue;
                    }
                    first_line.insert(user.to_string(), line_no);
                    entries.insert(user.to_string(), stored);
                }
                Err(message) => fail(format!("user {user:?}: {message}")),
            }
        }
        if problems.is_empty() {
            Ok(PasswordFile {
                entries: Secret::new(entries),
                sha256: super::sha256_hex(text.as_bytes()),
            })
        } else {
            Err(problems)
        }
    }

    /// SHA-256 of the file's bytes, lowercase hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// How many users the file holds.
    pub fn len(&self) -> usize {
        self.entries.expose().len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.expose().is_empty()
    }

    /// Whether `user` is in the file.
    pub fn contains(&self, user: &str) -> bool {
        self.entries.expose().contains_key(user)
    }

    /// Whether `password` is `user`'s. The hash comparison takes the same
    /// time wherever the first difference is, and an unknown user costs a
    /// derivation too, so timing tells neither.
    pub fn check(&self, user: &str, password: &[u8]) -> bool {
        match self.entries.expose().get(user) {
            Some(stored) => constant_time_eq(&stored.derive(password), &stored.hash),
            None => {
                let dummy = StoredHash {
                    scheme: HashScheme::Pbkdf2Sha512 { iterations: 101 },
                    salt: vec![0; 12],
                    hash: vec![0; SHA512_LEN],
                };
                let _ = constant_time_eq(&dummy.derive(password), &dummy.hash);
                false
            }
        }
    }
}

/// mosquitto_passwd's default PBKDF2 iteration count, and the salt length
/// it writes: what `saguin passwd` writes unless told otherwise.
pub const DEFAULT_PBKDF2_ITERATIONS: u32 = 101;
const SALT_LEN: usize = 12;

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
    let hash = stored.derive(password);
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(format!(
        "$7${iterations}${}${}",
        b64.encode(salt),
        b64.encode(hash)
    ))
}

/// Whether the hash field of a password file line is one this file format
/// reads (`$7$` or `$6$`, well formed); a plain-text password is not.
pub fn is_hashed(field: &str) -> bool {
    parse_hash(field).is_ok()
}

fn parse_hash(field: &str) -> Result<StoredHash, String> {
    if !field.starts_with('$') {
        return Err(
            "not a hashed password (plain text?); hash the file with mosquitto_passwd -U"
                .to_string(),
        );
    }
    let parts: Vec<&str> = field.split('$').collect();
    // parts[0] is the empty string before the leading '$'.
    let scheme = parts.get(1).copied().unwrap_or("");
    match scheme {
        "7" => {
            let [_, _, iterations, salt, hash] = parts.as_slice() else {
                return Err(format!(
                    "a $7$ hash has 4 '$'-separated fields ($7$iterations$salt$hash); this one has {}",
                    parts.len().saturating_sub(1)
                ));
            };
            let iterations: u32 = iterations
                .parse()
                .map_err(|_| "the iteration count is not a number".to_string())?;
            if !(1..=MAX_PBKDF2_ITERATIONS).contains(&iterations) {
                return Err(format!(
                    "iteration count {iterations} is outside 1..={MAX_PBKDF2_ITERATIONS}"
                ));
            }
            Ok(StoredHash {
                scheme: HashScheme::Pbkdf2Sha512 { iterations },
                salt: decode("salt", salt)?,
                hash: decode_hash(hash)?,
            })
        }
        "6" => {
            let [_, _, salt, hash] = parts.as_slice() else {
                return Err(format!(
                    "a $6$ hash has 3 '$'-separated fields ($6$salt$hash); this one has {}",
                    parts.len().saturating_sub(1)
                ));
            };
            Ok(StoredHash {
                scheme: HashScheme::Sha512,
                salt: decode("salt", salt)?,
                hash: decode_hash(hash)?,
            })
        }
        other => Err(format!(
            "hash type ${other}$ is not supported; saguin reads $7$ (PBKDF2-SHA512) and $6$ (SHA-512)"
        )),
    }
}

fn decode(what: &str, text: &str) -> Result<Vec<u8>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text))
        .map_err(|_| format!("the {what} is not base64"))?;
    if bytes.is_empty() {
        return Err(format!("the {what} is empty"));
    }
    Ok(bytes)
}

fn decode_hash(text: &str) -> Result<Vec<u8>, String> {
    let hash = decode("hash", text)?;
    if hash.len() != SHA512_LEN {
        return Err(format!(
            "the hash is {} bytes; a SHA-512 hash is {SHA512_LEN}",
            hash.len()
        ));
    }
    Ok(hash)
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

/// What a client asks to do with a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Subscribe to it / receive it.
    Read,
    /// Publish to it.
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grant {
    Read,
    Write,
    ReadWrite,
    Deny,
}

impl Grant {
    fn grants(self, access: Access) -> bool {
        matches!(
            (self, access),
            (Grant::ReadWrite, _) | (Grant::Read, Access::Read) | (Grant::Write, Access::Write)
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    grant: Grant,
    filter: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct AclRules {
    /// `topic` lines before the first `user` line.
    everyone: Vec<Rule>,
    /// `topic` lines after `user NAME`.
    users: HashMap<String, Vec<Rule>>,
    /// `pattern` lines, wherever they are.
    patterns: Vec<Rule>,
}

/// A parsed ACL file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFile {
    rules: Secret<AclRules>,
    /// SHA-256 of the file's bytes, hex (see [`PasswordFile`]).
    sha256: String,
}

impl AclFile {
    /// Read and parse `path`. Errors name the path and a line, never its text.
    pub fn load(path: &Path) -> Result<AclFile, Vec<String>> {
        let bytes = super::read_bounded(path, MAX_AUTH_FILE_BYTES).map_err(|e| vec![e])?;
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            vec![format!(
                "{}: not UTF-8 text (invalid byte at offset {})",
                path.display(),
                e.valid_up_to()
            )]
        })?;
        AclFile::parse(text).map_err(|problems| {
            problems
                .into_iter()
                .map(|p| format!("{} line {}: {}", path.display(), p.line, p.message))
                .collect()
        })
    }

    /// Parse the text of an ACL file; every bad line is reported.
    pub fn parse(text: &str) -> Result<AclFile, Vec<LineProblem>> {
        let mut rules = AclRules::default();
        let mut current_user: Option<String> = None;
        let mut problems = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (keyword, rest) = match line.split_once(char::is_whitespace) {
                Some((k, r)) => (k, r.trim()),
                None => (line, ""),
            };
            let mut fail = |message: &str| {
                problems.push(LineProblem {
                    line: line_no,
                    message: message.to_string(),
                })
            };
            match keyword {
                "user" => {
                    if rest.is_empty() {
                        fail("'user' without a user name");
                    } else {
                        rules.users.entry(rest.to_string()).or_default();
                        current_user = Some(rest.to_string());
                    }
                }
                "topic" | "pattern" => {
                    let rule = match parse_rule(rest) {
                        Ok(rule) => rule,
                        Err(message) => {
                            fail(&format!("'{keyword}': {message}"));
                            continue;
                        }
                    };
                    if keyword == "pattern" {
                        rules.patterns.push(rule);
                    } else if let Some(user) = &current_user {
                        rules.users.entry(user.clone()).or_default().push(rule);
                    } else {
                        rules.everyone.push(rule);
                    }
                }
                _ => fail("unknown keyword; a line starts with user, topic or pattern"),
            }
        }
        if problems.is_empty() {
            Ok(AclFile {
                rules: Secret::new(rules),
                sha256: super::sha256_hex(text.as_bytes()),
            })
        } else {
            Err(problems)
        }
    }

    /// SHA-256 of the file's bytes, lowercase hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Number of rules (`topic` and `pattern` lines).
    pub fn rule_count(&self) -> usize {
        let rules = self.rules.expose();
        rules.everyone.len()
            + rules.patterns.len()
            + rules.users.values().map(Vec::len).sum::<usize>()
    }

    /// Whether the client (`user` `None` when anonymous) may `access`
    /// `topic`. `topic` is a topic name for a publish or a delivery, or the
    /// filter of a SUBSCRIBE: a filter is allowed when a grant covers all of
    /// it and no deny covers it; each message delivered through it should
    /// be checked again by topic name.
    pub fn allows(&self, user: Option<&str>, client_id: &str, topic: &str, access: Access) -> bool {
        let rules = self.rules.expose();
        let user_rules = user
            .and_then(|u| rules.users.get(u))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let mut granted = false;
        for rule in rules.everyone.iter().chain(user_rules) {
            if filter_covers(&rule.filter, topic) {
                if rule.grant == Grant::Deny {
                    return false;
                }
                granted |= rule.grant.grants(access);
            }
        }
        for rule in &rules.patterns {
            match substitute(&rule.filter, user, client_id) {
                Substituted::Filter(filter) => {
                    if filter_covers(&filter, topic) {
                        if rule.grant == Grant::Deny {
                            return false;
                        }
                        granted |= rule.grant.grants(access);
                    }
                }
                // An anonymous client has no %u: the pattern is not about it.
                Substituted::NotApplicable => {}
                // Fail closed: a deny that a crafted id could dodge denies.
                Substituted::Unsafe if rule.grant == Grant::Deny => return false,
                Substituted::Unsafe => {}
            }
        }
        granted
    }
}

fn parse_rule(rest: &str) -> Result<Rule, String> {
    let (first, after) = match rest.split_once(char::is_whitespace) {
        Some((f, a)) => (f, a.trim()),
        None => (rest, ""),
    };
    let access = match first {
        "read" => Some(Grant::Read),
        "write" => Some(Grant::Write),
        "readwrite" => Some(Grant::ReadWrite),
        "deny" => Some(Grant::Deny),
        _ => None,
    };
    let (grant, filter) = match access {
        Some(grant) => (grant, after),
        None if after.is_empty() => (Grant::ReadWrite, rest),
        None => {
            return Err("the access word is not one of read, write, readwrite, deny".to_string())
        }
    };
    if filter.is_empty() {
        return Err("no topic filter".to_string());
    }
    validate_filter(filter).map_err(|e| e.to_string())?;
    Ok(Rule {
        grant,
        filter: filter.to_string(),
    })
}

enum Substituted {
    Filter(String),
    /// `%u` for an anonymous client.
    NotApplicable,
    /// A value containing `/`, `+` or `#` would change the filter's shape.
    Unsafe,
}

/// `%u` and `%c` replaced.
fn substitute(filter: &str, user: Option<&str>, client_id: &str) -> Substituted {
    let unsafe_value = |v: &str| v.contains(['/', '+', '#']);
    let mut out = filter.to_string();
    if filter.contains("%u") {
        let Some(user) = user else {
            return Substituted::NotApplicable;
        };
        if unsafe_value(user) {
            return Substituted::Unsafe;
        }
        out = out.replace("%u", user);
    }
    if filter.contains("%c") {
        if unsafe_value(client_id) {
            return Substituted::Unsafe;
        }
        out = out.replace("%c", client_id);
    }
    Substituted::Filter(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(file.check("alice", b"s3cret"));
        assert!(!file.check("alice", b"S3cret"));
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
        assert!(file.check("alice", b"s3cret"));
        assert!(!file.check("alice", b"s3cret "));
        assert!(!file.check("alice", b""));
        assert!(file.check("bob", b"pw6"));
        assert!(!file.check("bob", b"s3cret"));
        assert!(!file.check("carol", b"s3cret"));
        assert!(file.contains("alice") && !file.contains("carol"));
    }

    #[test]
    fn a_known_mosquitto_passwd_line_verifies() {
        // User "test", password "test", 101 iterations, the hash computed
        // independently by `openssl kdf -keylen 64 -kdfopt digest:SHA512 ... PBKDF2`.
        let line = "test:$7$101$B8rkFZb0JoDNgUeA$wX5cM7WJH3I6E0vK5HwtsCBOT+JrcEnBzvqRkxBq4/fGNlFh9XrFMRZF/aKX7gVrdZXj486o+9AsXuzfa80GWw==";
        let file = PasswordFile::parse(line).unwrap();
        assert!(file.check("test", b"test"));
        assert!(!file.check("test", b"Test"));
    }

    #[test]
    fn every_bad_password_line_is_reported_by_number_without_its_text() {
        let good = pbkdf2_line("alice", "pw", 5);
        let text = [
            good.as_str(),                   // 1
            "no colon here",                 // 2
            ":$7$1$c2FsdA==$aGFzaA==",       // 3
            "carol:plaintextsecret",         // 4
            "dave:$8$argon",                 // 5
            "erin:$7$0$c2FsdA==$aGFzaA==",   // 6
            "frank:$7$10$!!!$aGFzaA==",      // 7
            "gina:$7$10$c2FsdA==$aGFzaA==",  // 8 (hash too short)
            good.as_str(),                   // 9 duplicate
            "hank:$7$ten$c2FsdA==$aGFzaA==", // 10
            "ivan:$6$onlyone",               // 11
        ]
        .join("\n");
        let problems = PasswordFile::parse(&text).unwrap_err();
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        let all = format!("{problems:?}");
        assert!(!all.contains("plaintextsecret"), "{all}");
        assert!(problems[2].message.contains("mosquitto_passwd -U"));
        assert!(problems[3].message.contains("$8$"));
        assert!(problems[4].message.contains("outside 1..="));
        assert!(problems[5].message.contains("salt is not base64"));
        assert!(problems[6].message.contains("SHA-512 hash is 64"));
        assert!(problems[7].message.contains("first on line 1"));
    }

    #[test]
    fn debug_never_shows_hashes() {
        let file = PasswordFile::parse(&pbkdf2_line("alice", "pw", 5)).unwrap();
        let shown = format!("{file:?}");
        assert!(
            shown.contains("<redacted>") && !shown.contains("alice"),
            "{shown}"
        );
    }

    const ACL: &str = "\
# everyone
topic read public/#
topic deny public/private

user alice
topic readwrite alice/#
topic write shared/in
topic deny alice/secret

user bob
topic bob/+/x

pattern write devices/%c/out
pattern read users/%u/#
";

    #[test]
    fn acl_rules_apply_to_the_right_clients() {
        let acl = AclFile::parse(ACL).unwrap();
        assert_eq!(acl.rule_count(), 8);
        use Access::*;
        // Lines before any user apply to everyone, anonymous included.
        assert!(acl.allows(None, "c1", "public/news", Read));
        assert!(acl.allows(Some("bob"), "c1", "public/news", Read));
        assert!(!acl.allows(None, "c1", "public/news", Write));
        assert!(!acl.allows(Some("alice"), "c1", "public/private", Read));
        // User sections.
        assert!(acl.allows(Some("alice"), "c1", "alice/a/b", Write));
        assert!(acl.allows(Some("alice"), "c1", "alice", Read));
        assert!(!acl.allows(Some("alice"), "c1", "alice/secret", Read));
        assert!(acl.allows(Some("alice"), "c1", "shared/in", Write));
        assert!(!acl.allows(Some("alice"), "c1", "shared/in", Read));
        assert!(!acl.allows(Some("bob"), "c1", "alice/a", Read));
        assert!(acl.allows(Some("bob"), "c1", "bob/q/x", Write));
        assert!(!acl.allows(Some("bob"), "c1", "bob/q/y", Write));
        // Patterns apply to everyone, substituted.
        assert!(acl.allows(None, "dev7", "devices/dev7/out", Write));
        assert!(!acl.allows(None, "dev7", "devices/dev8/out", Write));
        assert!(acl.allows(Some("carol"), "x", "users/carol/inbox", Read));
        assert!(!acl.allows(None, "x", "users/carol/inbox", Read));
        // A client id that would widen a pattern does not match it.
        assert!(!acl.allows(None, "+", "devices/anything/out", Write));
        assert!(!acl.allows(None, "a/b", "devices/a/b/out", Write));
        // Subscription filters: covered or not.
        assert!(acl.allows(None, "c", "public/+", Read));
        assert!(!acl.allows(None, "c", "#", Read));
        assert!(!acl.allows(Some("alice"), "c", "alice/secret", Read));
    }

    #[test]
    fn bad_acl_lines_are_reported_by_number() {
        let text = "topic read a/#\nuser\nsubscribe x\ntopic rw a b\ntopic read a/#/b\ntopic read\npattern write a+\n";
        let problems = AclFile::parse(text).unwrap_err();
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, vec![2, 3, 4, 5, 6, 7]);
        assert!(problems[2].message.contains("access word"));
        assert!(problems[3].message.contains("'#' must be"));
        assert!(problems[4].message.contains("no topic filter"));
        assert!(problems[5].message.contains("'+' must be"));
    }

    #[test]
    fn a_deny_pattern_that_cannot_be_evaluated_denies() {
        use Access::*;
        let acl = AclFile::parse("topic readwrite #\npattern deny private/%c/#\n").unwrap();
        assert!(acl.allows(Some("alice"), "c", "public/x", Read));
        assert!(!acl.allows(Some("alice"), "c", "private/c/x", Read));
        // A client id with a wildcard cannot be substituted safely: denied.
        assert!(!acl.allows(Some("alice"), "c/#", "public/x", Read));
        // %u for an anonymous client: the pattern is not about it.
        let acl = AclFile::parse("topic readwrite #\npattern deny private/%u/#\n").unwrap();
        assert!(acl.allows(None, "c", "private/alice/x", Read));
        assert!(!acl.allows(Some("alice"), "c", "private/alice/x", Read));
    }
}
