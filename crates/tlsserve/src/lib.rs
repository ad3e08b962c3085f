//! HTTPS serving shared by virtplug's API server and its Redfish service, so both have one
//! implementation of what a client without credentials can make a server hold, and one CA.
//!
//! - [`conn`]: the TLS listener with its limits: handshake, request-head and idle timeouts, a
//!   connection cap beyond which clients get a 503 with `Retry-After`, accept backoff, the
//!   open-files limit raised, HTTP/1 or HTTP/2 by ALPN. [`serve`] runs any axum `Router` (or
//!   tower service of its shape) behind it.
//! - [`pki`]: the generated CA, the serving certificates it signs, the bearer token.
//! - [`server_config`] / [`load_server_config`]: a rustls configuration from a PEM certificate
//!   and key (generated, or given by the user as `--tls-cert/--tls-key`).
//! - [`files`]: private directories and files (0700/0600, owned by this user).

pub mod conn;
pub mod files;
pub mod pki;

use std::path::{Path, PathBuf};

pub use conn::{serve, serve_with_refusal, Limits, PeerCertificates, Refusal, DRAIN_LIMIT, DRAIN_TIMEOUT};

/// Errors building a TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} holds no PEM certificate (expected a `-----BEGIN CERTIFICATE-----` block): give the serving certificate chain")]
    NoCertificate { what: String },
    #[error("{what} holds no PEM private key (expected PKCS#8, PKCS#1 or SEC1): give the key of the serving certificate")]
    NoKey { what: String },
    #[error("{what} cannot be parsed as PEM")]
    Pem {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the certificate and key cannot serve TLS (does the key belong to the certificate?)")]
    Invalid(#[source] rustls::Error),
}

/// A rustls server configuration serving `cert_pem` (the certificate, then any intermediates)
/// with `key_pem`, without client certificates, offering ALPN `h2` and `http/1.1`.
///
/// # Errors
/// `NoCertificate`, `NoKey`, `Pem` for unusable PEM, `Invalid` when rustls refuses the pair.
pub fn server_config(cert_pem: &str, key_pem: &str) -> Result<rustls::ServerConfig, TlsError> {
    config_from(cert_pem, "the serving certificate", key_pem, "the serving key")
}

/// [`server_config`] from files: a user-given `--tls-cert` and `--tls-key`.
///
/// # Errors
/// As [`server_config`], naming the files; `Read` when one cannot be read.
pub fn load_server_config(cert_path: &Path, key_path: &Path) -> Result<rustls::ServerConfig, TlsError> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|source| TlsError::Read { path: p.to_owned(), source });
    let (cert_pem, key_pem) = (read(cert_path)?, read(key_path)?);
    config_from(&cert_pem, &format!("{} (--tls-cert)", cert_path.display()), &key_pem, &format!("{} (--tls-key)", key_path.display()))
}

/// [`server_config`] that also asks clients for a certificate signed by `client_ca_pem` (a
/// kube-aggregator's front-proxy CA): a client may present none, but one that presents another
/// fails the handshake. The verified chain reaches each request as
/// [`conn::PeerCertificates`].
///
/// # Errors
/// As [`server_config`]; `NoCertificate` when `client_ca_pem` holds no usable CA certificate.
pub fn server_config_with_client_ca(cert_pem: &str, key_pem: &str, client_ca_pem: &str) -> Result<rustls::ServerConfig, TlsError> {
    let what = "the client CA".to_owned();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut client_ca_pem.as_bytes()) {
        let cert = cert.map_err(|source| TlsError::Pem { what: what.clone(), source })?;
        roots.add(cert).map_err(TlsError::Invalid)?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate { what });
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder(std::sync::Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Invalid(rustls::Error::General(e.to_string())))?;
    let (certs, key) = pair(cert_pem, "the serving certificate", key_pem, "the serving key")?;
    let mut cfg =
        rustls::ServerConfig::builder().with_client_cert_verifier(verifier).with_single_cert(certs, key).map_err(TlsError::Invalid)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

type Pair = (Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>);

fn pair(cert_pem: &str, cert_what: &str, key_pem: &str, key_what: &str) -> Result<Pair, TlsError> {
    let certs = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem { what: cert_what.to_owned(), source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what: cert_what.to_owned() });
    }
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .map_err(|source| TlsError::Pem { what: key_what.to_owned(), source })?
        .ok_or_else(|| TlsError::NoKey { what: key_what.to_owned() })?;
    Ok((certs, key))
}

fn config_from(cert_pem: &str, cert_what: &str, key_pem: &str, key_what: &str) -> Result<rustls::ServerConfig, TlsError> {
    let (certs, key) = pair(cert_pem, cert_what, key_pem, key_what)?;
    let mut cfg = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key).map_err(TlsError::Invalid)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}
