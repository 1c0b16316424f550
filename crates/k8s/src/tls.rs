//! HTTPS for the scheduler's debug endpoint.
//!
//! With `--http-auth delegated` callers send bearer tokens, so the endpoint
//! speaks TLS: from `--tls-cert-file`/`--tls-private-key-file` when given
//! (re-read when either file changes, so a rotated Secret is picked up
//! without a restart), otherwise from a self-signed certificate made at
//! start, as kube-scheduler does. The kubelet's HTTPS probes and the
//! apiserver's service proxy do not verify the serving certificate;
//! clients that do are given the CA (`gpusched explain
//! --certificate-authority`).

use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// How the debug endpoint serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Tls {
    /// Plain HTTP.
    #[default]
    Off,
    /// A certificate made at start for these DNS names (and loopback).
    SelfSigned(Vec<String>),
    /// Certificate chain and private key in PEM files.
    Files {
        /// The certificate chain (leaf first).
        cert: PathBuf,
        /// The private key (PKCS#8, PKCS#1 or SEC1).
        key: PathBuf,
    },
}

impl Tls {
    /// The scheduler's rule for its flags: certificate files when given
    /// (both or neither), else a self-signed certificate whenever callers
    /// send bearer tokens (`--http-auth delegated`), else plain HTTP.
    /// `names`: the DNS names a self-signed certificate carries.
    pub fn from_flags(
        auth: crate::debug::HttpAuth,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        names: Vec<String>,
    ) -> anyhow::Result<Tls> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Tls::Files { cert, key }),
            (Some(_), None) => anyhow::bail!("--tls-cert-file needs --tls-private-key-file"),
            (None, Some(_)) => anyhow::bail!("--tls-private-key-file needs --tls-cert-file"),
            (None, None) if auth == crate::debug::HttpAuth::Delegated => Ok(Tls::SelfSigned(names)),
            (None, None) => Ok(Tls::Off),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The key pair of `cert` + `key`, each named in errors.
fn load(cert: &Path, key: &Path) -> anyhow::Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("--tls-cert-file {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--tls-cert-file {}: not PEM certificates", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "--tls-cert-file {}: no CERTIFICATE block",
        cert.display()
    );
    let private = PrivateKeyDer::from_pem_file(key).with_context(|| {
        format!(
            "--tls-private-key-file {}: no PEM private key (PKCS#8, RSA or EC)",
            key.display()
        )
    })?;
    let ck = CertifiedKey::from_der(chain, private, &provider()).with_context(|| {
        format!(
            "--tls-private-key-file {} does not match --tls-cert-file {}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(ck)
}

fn self_signed(names: &[String]) -> anyhow::Result<(CertifiedKey, String)> {
    let mut sans: Vec<String> = names.to_vec();
    sans.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
    sans.sort();
    sans.dedup();
    let certified = rcgen::generate_simple_self_signed(sans)
        .context("making the self-signed serving certificate")?;
    let pem = certified.cert.pem();
    let chain = vec![certified.cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let ck = CertifiedKey::from_der(chain, key, &provider())
        .context("loading the self-signed serving certificate")?;
    Ok((ck, pem))
}

/// Modification times of the certificate and key files.
type Stamp = Option<(SystemTime, SystemTime)>;

fn mtimes(cert: &Path, key: &Path) -> Stamp {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(cert)?, m(key)?))
}

/// Serves the files' key pair, re-reading them when a modification time
/// changes; a pair that fails to load keeps the previous one (logged).
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

impl Reloading {
    fn current(&self) -> Arc<CertifiedKey> {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let now = mtimes(&self.cert, &self.key);
        if now.is_some() && now != cur.0 {
            match load(&self.cert, &self.key) {
                Ok(ck) => {
                    tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                    *cur = (now, Arc::new(ck));
                }
                Err(e) => {
                    tracing::warn!("keeping the previous serving certificate: {e:#}");
                    cur.0 = now;
                }
            }
        }
        cur.1.clone()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The acceptor for `tls` (None for [`Tls::Off`]), and the self-signed
/// certificate's PEM when one was made. Errors name the flag and the file.
pub fn acceptor(tls: &Tls) -> anyhow::Result<Option<(tokio_rustls::TlsAcceptor, Option<String>)>> {
    let (resolver, pem): (Arc<dyn ResolvesServerCert>, Option<String>) = match tls {
        Tls::Off => return Ok(None),
        Tls::SelfSigned(names) => {
            let (ck, pem) = self_signed(names)?;
            (Arc::new(Fixed(Arc::new(ck))), Some(pem))
        }
        Tls::Files { cert, key } => {
            let ck = load(cert, key)?;
            (
                Arc::new(Reloading {
                    cert: cert.clone(),
                    key: key.clone(),
                    current: Mutex::new((mtimes(cert, key), Arc::new(ck))),
                }),
                None,
            )
        }
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some((
        tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        pem,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, c.cert.pem()).unwrap();
        std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
        (cert, key, c.cert.pem())
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.crt");
        let e = acceptor(&Tls::Files {
            cert: missing.clone(),
            key: missing.clone(),
        })
        .err()
        .unwrap();
        assert!(format!("{e:#}").contains("--tls-cert-file"), "{e:#}");
        assert!(format!("{e:#}").contains("nope.crt"), "{e:#}");

        let (cert, _, _) = write_pair(dir.path(), "a");
        let other = rcgen::generate_simple_self_signed(vec!["b".into()]).unwrap();
        let key = dir.path().join("other.key");
        std::fs::write(&key, other.signing_key.serialize_pem()).unwrap();
        let e = acceptor(&Tls::Files {
            cert: cert.clone(),
            key,
        })
        .err()
        .unwrap();
        assert!(format!("{e:#}").contains("does not match"), "{e:#}");

        let garbage = dir.path().join("garbage.key");
        std::fs::write(&garbage, "hello").unwrap();
        let e = acceptor(&Tls::Files { cert, key: garbage }).err().unwrap();
        assert!(format!("{e:#}").contains("garbage.key"), "{e:#}");
    }

    #[test]
    fn rotated_files_are_served_and_a_broken_rotation_keeps_the_old_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, _) = write_pair(dir.path(), "first");
        let ck = load(&cert, &key).unwrap();
        let r = Reloading {
            cert: cert.clone(),
            key: key.clone(),
            current: Mutex::new((mtimes(&cert, &key), Arc::new(ck))),
        };
        let first = r.current().cert[0].clone();
        assert_eq!(r.current().cert[0], first, "unchanged files: same pair");
        // a rotation (new mtime)
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (_, _, _) = write_pair(dir.path(), "second");
        let bump = SystemTime::now() + std::time::Duration::from_secs(5);
        for p in [&cert, &key] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(bump)
                .unwrap();
        }
        let second = r.current().cert[0].clone();
        assert_ne!(second, first, "the rotated pair is served");
        // a half-written rotation keeps serving the last good pair
        std::fs::write(&key, "partial").unwrap();
        let f = std::fs::File::options().write(true).open(&key).unwrap();
        f.set_modified(bump + std::time::Duration::from_secs(5))
            .unwrap();
        assert_eq!(r.current().cert[0], second);
    }

    #[test]
    fn flags_choose_files_then_self_signed_for_tokens_then_plain() {
        use crate::debug::HttpAuth;
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(
            Tls::from_flags(HttpAuth::None, p("c"), p("k"), vec![]).unwrap(),
            Tls::Files {
                cert: "c".into(),
                key: "k".into()
            }
        );
        assert_eq!(
            Tls::from_flags(HttpAuth::Delegated, None, None, vec!["s".into()]).unwrap(),
            Tls::SelfSigned(vec!["s".into()])
        );
        assert_eq!(
            Tls::from_flags(HttpAuth::None, None, None, vec![]).unwrap(),
            Tls::Off
        );
        let e = Tls::from_flags(HttpAuth::Delegated, p("c"), None, vec![]).unwrap_err();
        assert!(e.to_string().contains("--tls-private-key-file"), "{e}");
    }

    #[test]
    fn self_signed_names_loopback_and_the_given_names() {
        let (ck, pem) = self_signed(&["sched-0".into()]).unwrap();
        assert_eq!(ck.cert.len(), 1);
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    }
}
