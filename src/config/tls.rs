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
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("server_config", &self.server_config)
            .field("chain_len", &self.chain_len)
            .field("client_ca_len", &self.client_ca_len)
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
    let chain = match read_certs(cert) {
        Ok(chain) => Some(chain),
        Err(message) => {
            problems.push(problem("cert", message));
            None
        }
    };
    let private_key = match read_key(key) {
        Ok(k) => Some(k),
        Err(message) => {
            problems.push(problem("key", message));
            None
        }
    };
    let roots = match client_ca {
        None => None,
        Some(path) => match read_certs(path) {
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

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = super::read_bounded(path, MAX_PEM_BYTES)?;
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

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = super::read_bounded(path, MAX_PEM_BYTES)?;
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
            "{}: {n} private keys; a listener takes exactly one",
            path.display()
        )),
    }
}
