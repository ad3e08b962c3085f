//! Credentials generated on first start into the data dir: a self-signed CA, a serving
//! certificate for the loopback names and the listen address, and a bearer token. Every file is
//! written atomically (temp file, fsync, rename, fsync of the directory); the directory is 0700,
//! keys and the token 0600 (tightened on every start if something loosened them).

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// Errors while creating or loading credentials.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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

/// Writes `data` to `path` atomically and durably, the file having `mode` from its creation.
///
/// # Flow
/// A temp file unique to this call (`.NAME.<random>.tmp` next to `path`, created with
/// `O_CREAT|O_EXCL` and `mode`, so never shared with another target or another writer and never
/// readable with a looser mode), write, fsync, rename over `path`, fsync the directory.
///
/// # Errors
/// `Write` with the path; `path` then still holds its previous content (or does not exist), and
/// the temp file is removed.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), PkiError> {
    let err = |source| PkiError::Write { path: path.to_owned(), source };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or_else(|| Path::new("."));
    let name = path.file_name().ok_or_else(|| err(io::Error::new(io::ErrorKind::InvalidInput, "the path names no file")))?;
    let (tmp, mut f) = create_temp(dir, name, mode).map_err(err)?;
    let written = f.write_all(data).and_then(|()| f.sync_all());
    drop(f);
    let renamed = written.and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = renamed {
        let _ = fs::remove_file(&tmp);
        return Err(err(e));
    }
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)
}

/// Creates a new temp file for `name` in `dir` with `mode`.
fn create_temp(dir: &Path, name: &OsStr, mode: u32) -> io::Result<(PathBuf, fs::File)> {
    for _ in 0..8 {
        let tmp = dir.join(format!(".{}.{:016x}.tmp", name.to_string_lossy(), rand::random::<u64>()));
        match fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, "no unused temp file name after 8 tries"))
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

    #[test]
    fn two_targets_and_concurrent_writers_never_share_a_temp_file() {
        let t = tempfile::tempdir().unwrap();
        // Old code: `a.key` and `a.crt` both used `a.tmp`; concurrent writers of one file too.
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let dir = t.path().to_owned();
                std::thread::spawn(move || {
                    let target = dir.join(if i % 2 == 0 { "a.key" } else { "a.crt" });
                    let body = format!("{i}").repeat(10_000);
                    for _ in 0..20 {
                        write_atomic(&target, body.as_bytes(), 0o600).unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        for f in ["a.key", "a.crt"] {
            let text = fs::read_to_string(t.path().join(f)).unwrap();
            let first = &text[..text.len() / 10_000];
            assert_eq!(text, first.repeat(10_000), "{f} holds one whole write");
        }
        let left: Vec<_> =
            fs::read_dir(t.path()).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp")).collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
