//! SCRAM-SHA-512 (RFC 5802, RFC 7677's construction with SHA-512), the
//! server side of MQTT 5 enhanced authentication (MQTT 5 4.12). A password
//! file's `$7$ITERATIONS$SALT$HASH` entry is PBKDF2-HMAC-SHA512(password,
//! salt, iterations) with a 64-byte output: exactly SCRAM's SaltedPassword,
//! so the file serves both user name/password and SCRAM. `$6$` entries
//! cannot: their users fail SCRAM as a wrong password would. SCRAM-SHA-256
//! would need PBKDF2-SHA256 of the password, which the file does not hold,
//! so it is not offered.
//!
//! No channel binding (`n,,` or `y,,` only); an authorisation identity
//! other than the user is refused. An unknown user runs the exchange
//! against a made-up salt and fails at the proof, so the exchange does not
//! say which users exist. Nothing here logs, and no proof or key leaves.

use base64::Engine as _;
use pbkdf2::hmac::{Hmac, Mac};
use sha2::{Digest, Sha512};

use crate::config::auth::{HashScheme, PasswordFile};

/// The Authentication Method name.
pub const SCRAM_SHA_512: &str = "SCRAM-SHA-512";

type HmacSha512 = Hmac<Sha512>;

/// Why an exchange failed (never with the client's secrets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// The message is not SCRAM's syntax, or asks for what is not offered.
    Malformed(&'static str),
    /// The proof does not match (wrong password, unknown user, a `$6$`
    /// entry).
    BadProof,
}

/// An exchange after the server-first message, waiting for client-final.
pub struct ScramServer {
    user: String,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    /// SaltedPassword, or `None` when the user cannot pass (unknown, `$6$`).
    salted: Option<Vec<u8>>,
}

impl std::fmt::Debug for ScramServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramServer")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha512::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// A SCRAM `saslname`: `=2C` is `,` and `=3D` is `=`; any other `=` is an
/// error.
fn unescape(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i..i + 3)
            .ok_or(ScramError::Malformed("bad escape"))?;
        match code {
            "=2C" => out.push(','),
            "=3D" => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

impl ScramServer {
    /// Take the client-first message; answer the server-first message.
    /// `server_nonce` must be fresh and random (printable, no `,`).
    pub fn start(
        file: &PasswordFile,
        client_first: &[u8],
        server_nonce: &str,
    ) -> Result<(ScramServer, Vec<u8>), ScramError> {
        let text =
            std::str::from_utf8(client_first).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let mut parts = text.splitn(3, ',');
        let flag = parts.next().unwrap_or("");
        let authzid = parts.next().ok_or(ScramError::Malformed("no GS2 header"))?;
        let bare = parts
            .next()
            .ok_or(ScramError::Malformed("no client-first-bare"))?;
        if flag != "n" && flag != "y" {
            return Err(ScramError::Malformed("channel binding is not offered"));
        }
        let mut fields = bare.split(',');
        let user = fields
            .next()
            .and_then(|f| f.strip_prefix("n="))
            .ok_or(ScramError::Malformed("no user name"))?;
        let user = unescape(user)?;
        let client_nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .filter(|n| !n.is_empty())
            .ok_or(ScramError::Malformed("no client nonce"))?;
        if !authzid.is_empty() && authzid != format!("a={user}") {
            return Err(ScramError::Malformed("another authorisation identity"));
        }
        let stored = file
            .stored(&user)
            .filter(|s| matches!(s.scheme, HashScheme::Pbkdf2Sha512 { .. }) && s.hash.len() == 64);
        let (salt, iterations, salted) = match stored {
            Some(s) => {
                let HashScheme::Pbkdf2Sha512 { iterations } = s.scheme else {
                    unreachable!("filtered above")
                };
                (s.salt.clone(), iterations, Some(s.hash.clone()))
            }
            // The same shape as a real entry, derived from the name so a
            // repeated try looks the same.
            None => {
                let salt = Sha512::digest(format!("saguin-scram-unknown:{user}").as_bytes())[..12]
                    .to_vec();
                (salt, crate::config::auth::DEFAULT_PBKDF2_ITERATIONS, None)
            }
        };
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!("r={nonce},s={},i={iterations}", b64().encode(&salt));
        let server = ScramServer {
            user,
            gs2_header: format!("{flag},{authzid},"),
            client_first_bare: bare.to_owned(),
            server_first: server_first.clone(),
            nonce,
            salted,
        };
        Ok((server, server_first.into_bytes()))
    }

    /// The user the exchange is about.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Take the client-final message; on a good proof, answer the
    /// server-final message (`v=` the server signature).
    pub fn finish(self, client_final: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text =
            std::str::from_utf8(client_final).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof"))?;
        let mut fields = without_proof.split(',');
        let binding = fields
            .next()
            .and_then(|f| f.strip_prefix("c="))
            .ok_or(ScramError::Malformed("no channel binding field"))?;
        let nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .ok_or(ScramError::Malformed("no nonce"))?;
        if binding != b64().encode(self.gs2_header.as_bytes()) {
            return Err(ScramError::Malformed("channel binding differs"));
        }
        if nonce != self.nonce {
            return Err(ScramError::Malformed("nonce differs"));
        }
        let proof = b64()
            .decode(proof)
            .map_err(|_| ScramError::Malformed("proof is not base64"))?;
        let Some(salted) = self.salted else {
            return Err(ScramError::BadProof);
        };
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let client_key_expected = hmac(&salted, b"Client Key");
        let stored_key = Sha512::digest(&client_key_expected);
        let signature = hmac(&stored_key, auth_message.as_bytes());
        if proof.len() != signature.len() {
            return Err(ScramError::BadProof);
        }
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let matches = Sha512::digest(&client_key)
            .iter()
            .zip(stored_key.iter())
            .fold(0u8, |diff, (a, b)| diff | std::hint::black_box(a ^ b))
            == 0;
        if !matches {
            return Err(ScramError::BadProof);
        }
        let server_key = hmac(&salted, b"Server Key");
        let server_signature = hmac(&server_key, auth_message.as_bytes());
        Ok(format!("v={}", b64().encode(server_signature)).into_bytes())
    }
}

/// A fresh server nonce: 18 random bytes, base64.
pub fn server_nonce() -> Result<String, String> {
    let mut bytes = [0u8; 18];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| "the system's random number generator failed".to_string())?;
    Ok(b64().encode(bytes))
}

/// The client side, for tests: RFC 5802 computed independently of the
/// server's code paths (from the password, through PBKDF2).
#[cfg(test)]
pub(crate) mod client {
    use super::*;

    pub fn first(user: &str, nonce: &str) -> String {
        format!("n,,n={user},r={nonce}")
    }

    /// client-final for `server_first`, and the server signature expected.
    pub fn last(password: &str, client_first: &str, server_first: &str) -> (String, String) {
        let bare = client_first.strip_prefix("n,,").unwrap();
        let mut nonce = "";
        let mut salt = Vec::new();
        let mut iterations = 0;
        for field in server_first.split(',') {
            match field.split_at(2) {
                ("r=", v) => nonce = v,
                ("s=", v) => salt = b64().decode(v).unwrap(),
                ("i=", v) => iterations = v.parse().unwrap(),
                _ => {}
            }
        }
        let mut salted = [0u8; 64];
        pbkdf2::pbkdf2_hmac::<Sha512>(password.as_bytes(), &salt, iterations, &mut salted);
        let without_proof = format!("c={},r={nonce}", b64().encode("n,,"));
        let auth_message = format!("{bare},{server_first},{without_proof}");
        let client_key = hmac(&salted, b"Client Key");
        let stored_key = Sha512::digest(&client_key);
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = hmac(&salted, b"Server Key");
        let expected = format!(
            "v={}",
            b64().encode(hmac(&server_key, auth_message.as_bytes()))
        );
        (
            format!("{without_proof},p={}", b64().encode(proof)),
            expected,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> PasswordFile {
        let alice = crate::broker::auth::hash_password(b"wonderland", 101).unwrap();
        PasswordFile::parse(&format!("alice:{alice}\n")).unwrap()
    }

    fn run(user: &str, password: &str) -> Result<(), ScramError> {
        let file = file();
        let first = client::first(user, "cnonce123");
        let (server, server_first) = ScramServer::start(&file, first.as_bytes(), "snonce456")?;
        let server_first = String::from_utf8(server_first).unwrap();
        assert!(
            server_first.starts_with("r=cnonce123snonce456,s="),
            "{server_first}"
        );
        let (last, expected) = client::last(password, &first, &server_first);
        let server_final = server.finish(last.as_bytes())?;
        assert_eq!(String::from_utf8(server_final).unwrap(), expected);
        Ok(())
    }

    #[test]
    fn the_right_password_passes_and_the_server_proves_itself() {
        assert_eq!(run("alice", "wonderland"), Ok(()));
    }

    #[test]
    fn a_wrong_password_or_an_unknown_user_fails_at_the_proof() {
        assert_eq!(run("alice", "Wonderland"), Err(ScramError::BadProof));
        assert_eq!(run("mallory", "x"), Err(ScramError::BadProof));
    }

    #[test]
    fn a_tampered_nonce_or_binding_is_refused() {
        let file = file();
        let first = client::first("alice", "c1");
        let (server, server_first) = ScramServer::start(&file, first.as_bytes(), "s1").unwrap();
        let (last, _) = client::last(
            "wonderland",
            &first,
            &String::from_utf8(server_first).unwrap(),
        );
        let tampered = last.replace("r=c1s1", "r=c1s2");
        assert!(matches!(
            server.finish(tampered.as_bytes()),
            Err(ScramError::Malformed(_))
        ));
    }

    #[test]
    fn channel_binding_and_bad_messages_are_refused() {
        let file = file();
        for bad in [
            "p=tls-unique,,n=alice,r=x",
            "n,,r=x",
            "n,,n=alice",
            "n,a=bob,n=alice,r=x",
            "n,,n=al=ice,r=x",
        ] {
            assert!(
                ScramServer::start(&file, bad.as_bytes(), "s").is_err(),
                "{bad}"
            );
        }
        let (server, _) = ScramServer::start(&file, b"n,,n=al=3Dice,r=x", "s").unwrap();
        assert_eq!(server.user(), "al=ice");
    }
}
