//! The password file and the ACL file, parsed and validated once here for
//! both the broker and `check-config`. What they decide - whether a
//! password is right, whether the ACL allows an access - is the broker's:
//! [`crate::broker::auth`].
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
//! not only to anonymous clients. A `deny` that matches wins
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

use super::secret::Secret;
use crate::topic::validate_filter;

/// Largest password or ACL file read.
const MAX_AUTH_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Why a password file without users is refused where anonymous clients
/// are not welcome (at startup and at a reload).
pub const EMPTY_PASSWORD_FILE: &str =
    "holds no users and allow_anonymous is false; no client could connect";

/// Iterations above this are refused: a CONNECT pays them.
pub const MAX_PBKDF2_ITERATIONS: u32 = 10_000_000;

pub(crate) const SHA512_LEN: usize = 64;

/// A problem in a password or ACL file: the 1-based line and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineProblem {
    pub line: usize,
    pub message: String,
}

#[derive(Clone, PartialEq, Eq)]
pub(crate) enum HashScheme {
    /// `$7$`: PBKDF2-HMAC-SHA512.
    Pbkdf2Sha512 { iterations: u32 },
    /// `$6$`: SHA-512(password ‖ salt).
    Sha512,
}

/// One user's stored hash, as the file gives it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct StoredHash {
    pub(crate) scheme: HashScheme,
    pub(crate) salt: Vec<u8>,
    pub(crate) hash: Vec<u8>,
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

    /// `user`'s stored hash, for the broker's password checks.
    pub(crate) fn stored(&self, user: &str) -> Option<&StoredHash> {
        self.entries.expose().get(user)
    }
}

/// mosquitto_passwd's default PBKDF2 iteration count, and the salt length
/// it writes: what `saguin passwd` writes unless told otherwise.
pub const DEFAULT_PBKDF2_ITERATIONS: u32 = 101;
pub(crate) const SALT_LEN: usize = 12;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grant {
    Read,
    Write,
    ReadWrite,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) grant: Grant,
    pub(crate) filter: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct AclRules {
    /// `topic` lines before the first `user` line.
    pub(crate) everyone: Vec<Rule>,
    /// `topic` lines after `user NAME`.
    pub(crate) users: HashMap<String, Vec<Rule>>,
    /// `pattern` lines, wherever they are.
    pub(crate) patterns: Vec<Rule>,
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

    /// The rules, for the broker's decisions.
    pub(crate) fn rules(&self) -> &AclRules {
        self.rules.expose()
    }

    /// Number of rules (`topic` and `pattern` lines).
    pub fn rule_count(&self) -> usize {
        let rules = self.rules.expose();
        rules.everyone.len()
            + rules.patterns.len()
            + rules.users.values().map(Vec::len).sum::<usize>()
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

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Sha512;

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
}
