//! Credentials generated on first start into the data dir: a self-signed CA, a serving
//! certificate for the loopback names and the listen address, and a bearer token. Every file is
//! written atomically ([`durable::write_atomic`]: temp file, fsync, rename, fsync of the
//! directory); the directory is 0700, keys and the token 0600 (tightened on every start if
//! something loosened them).

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use durable::write_atomic;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// Errors while creating or loading credentials.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error(transparent)]
    Write(#[from] durable::WriteError),
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot generate the {what}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error(transparent)]
    Dir(#[from] crate::files::FileError),
}

/// The server's credentials, as PEM.
#[derive(Clone)]
pub struct Credentials {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub token: String,
}

fn read(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(|source| PkiError::Read { path: path.to_owned(), source })
}

fn ca_params() -> Result<CertificateParams, PkiError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|source| PkiError::Generate { what: "CA certificate", source })?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "virtplug-ca");
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.not_after = rcgen::date_time_ymd(2125, 1, 1);
    Ok(p)
}

/// Loads the credentials from `dir`, creating what is missing. The serving certificate is
/// re-issued (by the same CA) when it does not cover `listen_ip`.
///
/// # Errors
/// `Read`, `Write` or `Generate` naming the file or item.
pub fn ensure(dir: &Path, listen_ip: Option<IpAddr>) -> Result<Credentials, PkiError> {
    let gen = |what| move |source| PkiError::Generate { what, source };
    crate::files::private_dir(dir)?;
    let (ca_crt, ca_key, crt, key, tok, sans) = (
        dir.join("ca.crt"),
        dir.join("ca.key"),
        dir.join("server.crt"),
        dir.join("server.key"),
        dir.join("token"),
        dir.join("server.sans"),
    );
    if !ca_crt.exists() || !ca_key.exists() {
        let k = KeyPair::generate().map_err(gen("CA key"))?;
        let cert = ca_params()?.self_signed(&k).map_err(gen("CA certificate"))?;
        write_atomic(&ca_key, k.serialize_pem().as_bytes(), 0o600)?;
        write_atomic(&ca_crt, cert.pem().as_bytes(), 0o644)?;
        let _ = fs::remove_file(&crt);
    }
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    if let Some(ip) = listen_ip.filter(|ip| !ip.is_unspecified()) {
        if !names.contains(&ip.to_string()) {
            names.push(ip.to_string());
        }
    }
    let covered = fs::read_to_string(&sans).map(|s| names.iter().all(|n| s.lines().any(|l| l == n))).unwrap_or(false);
    if !crt.exists() || !key.exists() || !covered {
        let ca_key_pair = KeyPair::from_pem(&read(&ca_key)?).map_err(gen("CA key"))?;
        let issuer = Issuer::new(ca_params()?, ca_key_pair);
        let k = KeyPair::generate().map_err(gen("server key"))?;
        let mut p = CertificateParams::new(names.clone()).map_err(gen("server certificate"))?;
        p.distinguished_name.push(DnType::CommonName, "virtplug-apiserver");
        p.not_after = rcgen::date_time_ymd(2125, 1, 1);
        let cert = p.signed_by(&k, &issuer).map_err(gen("server certificate"))?;
        write_atomic(&key, k.serialize_pem().as_bytes(), 0o600)?;
        write_atomic(&crt, cert.pem().as_bytes(), 0o644)?;
        write_atomic(&sans, names.join("\n").as_bytes(), 0o644)?;
    }
    if !tok.exists() {
        let bytes: [u8; 32] = rand::random();
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        write_atomic(&tok, token.as_bytes(), 0o600)?;
    }
    for secret in [&ca_key, &key, &tok] {
        crate::files::tighten_existing(secret, 0o600)?;
    }
    Ok(Credentials { ca_pem: read(&ca_crt)?, cert_pem: read(&crt)?, key_pem: read(&key)?, token: read(&tok)?.trim().to_owned() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn credentials_are_private_and_no_temp_file_is_left() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("pki");
        let c = ensure(&dir, None).unwrap();
        assert_eq!(c.token.len(), 64);
        assert_eq!(mode(&dir), 0o700);
        for f in ["ca.key", "server.key", "token"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        }
        let mut names: Vec<String> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["ca.crt", "ca.key", "server.crt", "server.key", "server.sans", "token"]);
    }
}
