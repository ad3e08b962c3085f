//! Credentials generated on first start into a data dir: a self-signed CA, a serving
//! certificate for the loopback names and the listen address, and a bearer token ([`ensure`]);
//! more serving certificates from the same CA for other services and names
//! ([`issue_serving_cert`]). Every file is written atomically ([`durable::write_atomic`]: temp
//! file, fsync, rename, fsync of the directory); the directories are 0700, keys and the token
//! 0600 (tightened on every start if something loosened them).
//!
//! # Concurrency
//! The CA is created, and serving certificates issued, under an exclusive lock (`flock`) on the
//! CA's directory itself (no lock file is left behind), so two services starting together (the API server and the Redfish
//! service in one `virtplug up`, or two processes) never write two different CAs, nor sign with
//! a key whose certificate another writer replaced.
//!
//! All functions block (key generation, fsync): async callers run them in `spawn_blocking`.

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
    #[error("cannot lock the directory {path} (it serialises creating the CA and issuing certificates)")]
    Lock {
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
    #[error("a serving certificate needs at least one DNS name or IP address")]
    NoNames,
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

fn gen(what: &'static str) -> impl Fn(rcgen::Error) -> PkiError {
    move |source| PkiError::Generate { what, source }
}

fn ca_params() -> Result<CertificateParams, PkiError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(gen("CA certificate"))?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "virtplug-ca");
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.not_after = rcgen::date_time_ymd(2125, 1, 1);
    Ok(p)
}

/// An exclusive `flock` on the CA's directory, released when dropped (the descriptor closes).
struct CaLock(#[allow(dead_code)] fs::File);

fn lock_ca_dir(ca_dir: &Path) -> Result<CaLock, PkiError> {
    let err = |source| PkiError::Lock { path: ca_dir.to_owned(), source };
    let dir = fs::File::open(ca_dir).map_err(err)?;
    dir.lock().map_err(err)?;
    Ok(CaLock(dir))
}

/// The CA in `ca_dir` (`ca.crt`, `ca.key`), created if either is missing. Returns whether it
/// was created. The caller holds the directory's lock.
fn ensure_ca(ca_dir: &Path) -> Result<bool, PkiError> {
    let (crt, key) = (ca_dir.join("ca.crt"), ca_dir.join("ca.key"));
    if crt.exists() && key.exists() {
        return Ok(false);
    }
    let k = KeyPair::generate().map_err(gen("CA key"))?;
    let cert = ca_params()?.self_signed(&k).map_err(gen("CA certificate"))?;
    write_atomic(&key, k.serialize_pem().as_bytes(), 0o600)?;
    write_atomic(&crt, cert.pem().as_bytes(), 0o644)?;
    Ok(true)
}

/// Where a serving certificate lives: `server.crt`, `server.key`, and `server.sans` (the names
/// it covers, one a line).
struct ServingFiles {
    crt: PathBuf,
    key: PathBuf,
    sans: PathBuf,
}

impl ServingFiles {
    fn in_dir(dir: &Path) -> Self {
        ServingFiles { crt: dir.join("server.crt"), key: dir.join("server.key"), sans: dir.join("server.sans") }
    }

    /// Present, and recorded as covering every one of `names`.
    fn covers(&self, names: &[String]) -> bool {
        self.crt.exists()
            && self.key.exists()
            && fs::read_to_string(&self.sans).is_ok_and(|s| names.iter().all(|n| s.lines().any(|l| l == n)))
    }

    /// Signs a new key's certificate for `names` (subject `CN=common_name`) with the CA in
    /// `ca_dir` and writes the three files, the certificate and its names with `crt_mode`.
    fn issue(&self, ca_dir: &Path, common_name: &str, names: &[String], crt_mode: u32) -> Result<(), PkiError> {
        let ca_key_pair = KeyPair::from_pem(&read(&ca_dir.join("ca.key"))?).map_err(gen("CA key"))?;
        let issuer = Issuer::new(ca_params()?, ca_key_pair);
        let k = KeyPair::generate().map_err(gen("server key"))?;
        let mut p = CertificateParams::new(names.to_vec()).map_err(gen("server certificate"))?;
        p.distinguished_name.push(DnType::CommonName, common_name);
        p.not_after = rcgen::date_time_ymd(2125, 1, 1);
        let cert = p.signed_by(&k, &issuer).map_err(gen("server certificate"))?;
        write_atomic(&self.key, k.serialize_pem().as_bytes(), 0o600)?;
        write_atomic(&self.crt, cert.pem().as_bytes(), crt_mode)?;
        write_atomic(&self.sans, names.join("\n").as_bytes(), crt_mode)?;
        Ok(())
    }
}

/// Loads the credentials from `dir`, creating what is missing. The serving certificate is
/// re-issued (by the same CA) when it does not cover `listen_ip`.
///
/// # Errors
/// `Read`, `Write`, `Lock` or `Generate` naming the file or item; `Dir` when `dir` cannot be
/// made a private directory of this user.
pub fn ensure(dir: &Path, listen_ip: Option<IpAddr>) -> Result<Credentials, PkiError> {
    crate::files::private_dir(dir)?;
    let (ca_crt, ca_key, tok) = (dir.join("ca.crt"), dir.join("ca.key"), dir.join("token"));
    let serving = ServingFiles::in_dir(dir);
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    if let Some(ip) = listen_ip.filter(|ip| !ip.is_unspecified()) {
        if !names.contains(&ip.to_string()) {
            names.push(ip.to_string());
        }
    }
    {
        let _lock = lock_ca_dir(dir)?;
        if ensure_ca(dir)? || !serving.covers(&names) {
            serving.issue(dir, "virtplug-apiserver", &names, 0o644)?;
        }
    }
    if !tok.exists() {
        let bytes: [u8; 32] = rand::random();
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        write_atomic(&tok, token.as_bytes(), 0o600)?;
    }
    for secret in [&ca_key, &serving.key, &tok] {
        crate::files::tighten_existing(secret, 0o600)?;
    }
    Ok(Credentials {
        ca_pem: read(&ca_crt)?,
        cert_pem: read(&serving.crt)?,
        key_pem: read(&serving.key)?,
        token: read(&tok)?.trim().to_owned(),
    })
}

/// A serving certificate for `names` (DNS names or IP addresses, e.g. the Redfish service's
/// listen address and host names) signed by the CA in `ca_dir`, which is created there if
/// missing (the API server's `DATA_DIR/pki` when both run from one data dir, so clients trust
/// both through one CA). Returns `(cert_pem, key_pem)`, ready for [`crate::server_config`].
///
/// # Guarantees
/// `out_dir` is made a private directory (0700) and holds `server.crt`, `server.key`,
/// `server.sans` (0600 each) and `ca.crt` (0600, the CA that signed it, to hand to clients).
/// An existing certificate there is reused when it was signed by the CA now in `ca_dir` and
/// covers every one of `names`; otherwise a new key and certificate replace it. `out_dir` may be
/// `ca_dir` itself only for the names [`ensure`] would use, since both write `server.*`.
///
/// # Errors
/// `NoNames` for an empty `names`; `Generate` for a name that is neither a DNS name nor an IP
/// address; `Read`, `Write`, `Lock` or `Dir` naming the file.
pub fn issue_serving_cert(ca_dir: &Path, out_dir: &Path, names: &[String]) -> Result<(String, String), PkiError> {
    if names.is_empty() {
        return Err(PkiError::NoNames);
    }
    crate::files::private_dir(ca_dir)?;
    crate::files::private_dir(out_dir)?;
    let serving = ServingFiles::in_dir(out_dir);
    let issued_by = out_dir.join("ca.crt");
    {
        let _lock = lock_ca_dir(ca_dir)?;
        let created = ensure_ca(ca_dir)?;
        let ca_pem = read(&ca_dir.join("ca.crt"))?;
        let same_ca = !created && fs::read_to_string(&issued_by).is_ok_and(|pem| pem == ca_pem);
        if !same_ca || !serving.covers(names) {
            serving.issue(ca_dir, "virtplug", names, 0o600)?;
            write_atomic(&issued_by, ca_pem.as_bytes(), 0o600)?;
        }
    }
    for secret in [&ca_dir.join("ca.key"), &serving.key] {
        crate::files::tighten_existing(secret, 0o600)?;
    }
    Ok((read(&serving.crt)?, read(&serving.key)?))
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

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_serving_cert_for_other_names_is_signed_by_the_existing_ca_and_private() {
        let t = tempfile::tempdir().unwrap();
        let (pki, out) = (t.path().join("pki"), t.path().join("redfish/tls"));
        let creds = ensure(&pki, None).unwrap();
        let (crt, key) = issue_serving_cert(&pki, &out, &names(&["bmc.example", "192.0.2.7"])).unwrap();
        assert_ne!(crt, creds.cert_pem);
        assert_eq!(fs::read_to_string(out.join("ca.crt")).unwrap(), creds.ca_pem, "signed by the API server's CA");
        assert_eq!(fs::read_to_string(pki.join("ca.crt")).unwrap(), creds.ca_pem, "the CA is not replaced");
        assert_eq!(mode(&out), 0o700);
        for f in ["server.crt", "server.key", "server.sans", "ca.crt"] {
            assert_eq!(mode(&out.join(f)), 0o600, "{f}");
        }
        assert!(crate::server_config(&crt, &key).is_ok());
    }

    #[test]
    fn a_serving_cert_is_reused_while_it_covers_the_names_and_its_ca_is_current() {
        let t = tempfile::tempdir().unwrap();
        let (ca, out) = (t.path().join("ca"), t.path().join("out"));
        // No CA yet: created.
        let first = issue_serving_cert(&ca, &out, &names(&["a.test", "b.test"])).unwrap();
        assert!(ca.join("ca.key").exists());
        assert_eq!(issue_serving_cert(&ca, &out, &names(&["b.test"])).unwrap(), first, "a subset of the names: reused");
        let wider = issue_serving_cert(&ca, &out, &names(&["a.test", "c.test"])).unwrap();
        assert_ne!(wider, first, "a new name: re-issued");
        // A new CA (its files deleted and regenerated): the old certificate no longer verifies.
        fs::remove_file(ca.join("ca.key")).unwrap();
        let renewed = issue_serving_cert(&ca, &out, &names(&["a.test"])).unwrap();
        assert_ne!(renewed, wider, "re-issued by the new CA");
        assert_eq!(fs::read_to_string(out.join("ca.crt")).unwrap(), fs::read_to_string(ca.join("ca.crt")).unwrap());
    }

    #[test]
    fn bad_names_are_refused_and_nothing_is_written() {
        let t = tempfile::tempdir().unwrap();
        let (ca, out) = (t.path().join("ca"), t.path().join("out"));
        assert!(matches!(issue_serving_cert(&ca, &out, &[]), Err(PkiError::NoNames)));
        assert!(!out.join("server.crt").exists());
    }

    #[test]
    fn concurrent_first_starts_agree_on_one_ca() {
        let t = tempfile::tempdir().unwrap();
        let ca = t.path().join("pki");
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (ca, out) = (ca.clone(), t.path().join(format!("out{i}")));
                std::thread::spawn(move || {
                    issue_serving_cert(&ca, &out, &names(&["x.test"])).unwrap();
                    fs::read_to_string(out.join("ca.crt")).unwrap()
                })
            })
            .collect();
        let cas: Vec<String> = threads.into_iter().map(|th| th.join().unwrap()).collect();
        let now = fs::read_to_string(ca.join("ca.crt")).unwrap();
        assert!(cas.iter().all(|c| *c == now), "every certificate was signed by the one CA on disk");
    }
}
