//! A listener's TLS files, read and parsed into a ready rustls server
//! configuration at load time, so `check-config` and `serve` refuse the same
//! certificate for the same reason.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::secret::Secret;

/// Largest PEM file read: a chain of certificates is kilobytes.
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// What a listener's TLS files hold.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The server configuration built from `cert`, `key` and `client_ca`:
    /// TLS 1.2 and 1.3, ring, client certificates required when
    /// `client_ca` is set. The broker clones it to add ALPN if it wants.
    /// A secret because it holds the private key.
    pub server_config: Secret<Arc<ServerConfig>>,
    /// Certificates in the `cert` chain.
    pub chain_len: usize,
    /// CA certificates in `client_ca` (0 without one).
    pub client_ca_len: usize,
    /// SHA-256 (hex) of each file's bytes: `cert`, `key`, `client_ca`.
    /// Printed by `check-config --output` in place of the content.
    pub cert_sha256: String,
    pub key_sha256: String,
    pub client_ca_sha256: Option<String>,
    /// When each certificate of the `cert` chain is valid, leaf first;
    /// `None` for a certificate whose dates could not be read (rustls
    /// accepted it, so it is not refused for that).
    pub cert_validity: Vec<Option<Validity>>,
}

/// A certificate's validity period, Unix seconds, both ends inclusive
/// (RFC 5280 §4.1.2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("server_config", &self.server_config)
            .field("chain_len", &self.chain_len)
            .field("client_ca_len", &self.client_ca_len)
            .field("cert_validity", &self.cert_validity)
            .finish()
    }
}

/// A problem with one of the three files: which key (`cert`, `key`,
/// `client_ca`) and what.
pub(crate) struct TlsProblem {
    pub key: &'static str,
    pub message: String,
}

fn problem(key: &'static str, message: String) -> TlsProblem {
    TlsProblem { key, message }
}

/// Load and check the files; every problem found, or the material.
pub(crate) fn load(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<TlsMaterial, Vec<TlsProblem>> {
    let mut problems = Vec::new();
    let mut digests = [None, None, None];
    let chain = match read_certs(cert, &mut digests[0]) {
        Ok(chain) => Some(chain),
        Err(message) => {
            problems.push(problem("cert", message));
            None
        }
    };
    let private_key = match read_key(key, &mut digests[1], "listener") {
        Ok(k) => Some(k),
        Err(message) => {
            problems.push(problem("key", message));
            None
        }
    };
    let roots = match client_ca {
        None => None,
        Some(path) => match read_certs(path, &mut digests[2]) {
            Ok(certs) => Some(certs),
            Err(message) => {
                problems.push(problem("client_ca", message));
                None
            }
        },
    };
    let (Some(chain), Some(private_key)) = (chain, private_key) else {
        return Err(problems);
    };
    if client_ca.is_some() && roots.is_none() {
        return Err(problems);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = match ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
    {
        Ok(b) => b,
        Err(e) => {
            problems.push(problem(
                "cert",
                format!("no usable TLS protocol version: {e}"),
            ));
            return Err(problems);
        }
    };
    let chain_len = chain.len();
    let cert_validity = chain.iter().map(|c| validity(c.as_ref())).collect();
    let [cert_sha256, key_sha256, client_ca_sha256] = digests;
    let mut client_ca_len = 0;
    let builder = match roots {
        None => builder.with_no_client_auth(),
        Some(roots) => {
            client_ca_len = roots.len();
            let mut store = RootCertStore::empty();
            for (i, ca) in roots.into_iter().enumerate() {
                if let Err(e) = store.add(ca) {
                    problems.push(problem(
                        "client_ca",
                        format!(
                            "{}: certificate {} is not a usable CA certificate: {e}",
                            client_ca.unwrap_or(Path::new("")).display(),
                            i + 1
                        ),
                    ));
                }
            }
            if !problems.is_empty() {
                return Err(problems);
            }
            match WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider).build() {
                Ok(verifier) => builder.with_client_cert_verifier(verifier),
                Err(e) => {
                    problems.push(problem(
                        "client_ca",
                        format!(
                            "{}: cannot verify clients with these certificates: {e}",
                            client_ca.unwrap_or(Path::new("")).display()
                        ),
                    ));
                    return Err(problems);
                }
            }
        }
    };
    match builder.with_single_cert(chain, private_key) {
        Ok(config) => Ok(TlsMaterial {
            server_config: Secret::new(Arc::new(config)),
            chain_len,
            client_ca_len,
            cert_sha256: cert_sha256.unwrap_or_default(),
            key_sha256: key_sha256.unwrap_or_default(),
            client_ca_sha256,
            cert_validity,
        }),
        Err(rustls::Error::InconsistentKeys(_)) => {
            problems.push(problem(
                "key",
                format!(
                    "{}: the private key does not belong to the certificate in {}",
                    key.display(),
                    cert.display()
                ),
            ));
            Err(problems)
        }
        Err(e) => {
            problems.push(problem(
                "key",
                format!(
                    "{}: the private key cannot be used with the certificate: {e}",
                    key.display()
                ),
            ));
            Err(problems)
        }
    }
}

pub(super) fn read_certs(
    path: &Path,
    digest: &mut Option<String>,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = super::read_bounded(path, MAX_PEM_BYTES)?;
    *digest = Some(super::sha256_hex(&bytes));
    let mut certs = Vec::new();
    for (i, item) in rustls_pemfile::certs(&mut bytes.as_slice()).enumerate() {
        match item {
            Ok(cert) => certs.push(cert),
            Err(e) => {
                return Err(format!(
                    "{}: PEM block {} is not a readable certificate: {e}",
                    path.display(),
                    i + 1
                ))
            }
        }
    }
    if certs.is_empty() {
        return Err(format!(
            "{}: no certificate found (expected PEM \"BEGIN CERTIFICATE\" blocks)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The one private key in `path`; `holder` (a listener, a bridge) is who
/// the refusal of a file with several says takes exactly one.
pub(super) fn read_key(
    path: &Path,
    digest: &mut Option<String>,
    holder: &str,
) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = super::read_bounded(path, MAX_PEM_BYTES)?;
    *digest = Some(super::sha256_hex(&bytes));
    let mut keys = 0usize;
    let mut first = None;
    for item in rustls_pemfile::read_all(&mut bytes.as_slice()) {
        match item {
            Ok(rustls_pemfile::Item::Pkcs1Key(k)) => {
                keys += 1;
                first.get_or_insert(PrivateKeyDer::Pkcs1(k));
            }
            Ok(rustls_pemfile::Item::Pkcs8Key(k)) => {
                keys += 1;
                first.get_or_insert(PrivateKeyDer::Pkcs8(k));
            }
            Ok(rustls_pemfile::Item::Sec1Key(k)) => {
                keys += 1;
                first.get_or_insert(PrivateKeyDer::Sec1(k));
            }
            Ok(_) => {}
            // The error never quotes the file: it holds a private key.
            Err(_) => {
                return Err(format!(
                    "{}: not readable as PEM (a damaged block)",
                    path.display()
                ))
            }
        }
    }
    match (keys, first) {
        (1, Some(key)) => Ok(key),
        (0, _) | (_, None) => Err(format!(
            "{}: no private key found (expected a PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" block)",
            path.display()
        )),
        (n, _) => Err(format!(
            "{}: {n} private keys; a {holder} takes exactly one",
            path.display()
        )),
    }
}

/// The validity period of a DER certificate, or `None` when its dates
/// cannot be read. Walks only as far as `tbsCertificate.validity`
/// (RFC 5280 §4.1): every length is bounded by the bytes left.
pub(crate) fn validity(der: &[u8]) -> Option<Validity> {
    const SEQUENCE: u8 = 0x30;
    const VERSION_TAG: u8 = 0xa0;
    let (tag, certificate, _) = der_item(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, mut tbs, _) = der_item(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    // [0] version (optional), serialNumber, signature, issuer, validity.
    let (tag, _, rest) = der_item(tbs)?;
    if tag == VERSION_TAG {
        tbs = rest;
    }
    for _ in 0..3 {
        let (_, _, rest) = der_item(tbs)?;
        tbs = rest;
    }
    let (tag, validity, _) = der_item(tbs)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, not_before, rest) = der_item(validity)?;
    let not_before = der_time(tag, not_before)?;
    let (tag, not_after, _) = der_item(rest)?;
    let not_after = der_time(tag, not_after)?;
    Some(Validity {
        not_before,
        not_after,
    })
}

/// One DER item: its tag, its content, and what follows it.
fn der_item(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let (len_bytes, after) = rest.split_at_checked(count)?;
        rest = after;
        len_bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b))
    };
    let (content, after) = rest.split_at_checked(len)?;
    Some((tag, content, after))
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950..2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`) as Unix seconds.
fn der_time(tag: u8, content: &[u8]) -> Option<i64> {
    const UTC_TIME: u8 = 0x17;
    const GENERALIZED_TIME: u8 = 0x18;
    let text = std::str::from_utf8(content).ok()?;
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy: i64 = digits.get(..2)?.parse().ok()?;
            (
                if yy < 50 { 2000 + yy } else { 1900 + yy },
                digits.get(2..)?,
            )
        }
        (GENERALIZED_TIME, 14) => (digits.get(..4)?.parse().ok()?, digits.get(4..)?),
        _ => return None,
    };
    let field = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
    }

    #[test]
    fn both_time_forms_are_read() {
        assert_eq!(der_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(der_time(0x18, b"20000301000000Z"), Some(11_017 * 86_400));
        assert_eq!(der_time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(der_time(0x17, b"7001010000Z"), None);
        assert_eq!(der_time(0x17, b"701301000000Z"), None);
    }

    #[test]
    fn the_fixture_certificate_has_dates_and_damage_is_none() {
        let pem = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/config/files/server.pem"
        ))
        .expect("fixture");
        let der = rustls_pemfile::certs(&mut pem.as_slice())
            .next()
            .expect("a certificate")
            .expect("readable");
        let v = validity(der.as_ref()).expect("dates");
        assert!(v.not_before < v.not_after);
        for cut in [0, 1, 10, 100, der.len() / 2] {
            let _ = validity(der.get(..cut).unwrap_or_default());
        }
        assert_eq!(validity(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
