//! Reading a `tls` table's files: certificate chains (refused when a
//! certificate is expired or not yet valid), private keys (refused when
//! group or others may read them), CA certificates (their expiry kept for
//! the metric), and certificate revocation lists. Errors name the config
//! key and the file, never what a file holds.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use super::{CertInfo, TlsError, file_error};

/// A PEM error in our words: the parser's own messages may quote a line of
/// the file, and a key file's lines are secret.
fn pem_reason(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match e {
        Error::Io(io) => io.to_string(),
        Error::NoItemsFound => "no PEM item of the expected kind".into(),
        _ => "not valid PEM".into(),
    }
}

/// Seconds since the Unix epoch, now.
pub fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A time as RFC 3339 (UTC, seconds).
pub fn rfc3339(t: i64) -> String {
    match u64::try_from(t) {
        Ok(s) => humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(s)).to_string(),
        Err(_) => format!("{t} s before 1970"),
    }
}

/// Every certificate of a PEM file, at least one.
pub fn read_certs(key: &str, file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| file_error(key, file, pem_reason(&e)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(key, file, pem_reason(&e)))?;
    if certs.is_empty() {
        return Err(file_error(key, file, "no CERTIFICATE in the file"));
    }
    Ok(certs)
}

/// A certificate chain the switch presents: each certificate must be valid
/// now (a peer would refuse it otherwise, and `check` must say so).
pub fn read_chain(key: &str, file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = read_certs(key, file)?;
    let now = now_s();
    for (i, der) in chain.iter().enumerate() {
        let info = cert_info(key, file, der)?;
        let which = match i {
            0 => "the certificate".to_string(),
            n => format!("certificate {} of the chain", n + 1),
        };
        if now > info.not_after {
            return Err(file_error(
                key,
                file,
                format!("{which} expired on {}", rfc3339(info.not_after)),
            ));
        }
        if now < info.not_before {
            return Err(file_error(
                key,
                file,
                format!("{which} is not valid before {}", rfc3339(info.not_before)),
            ));
        }
    }
    Ok(chain)
}

/// A private key, refused when group or others may read its file.
pub fn read_key(key: &str, file: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let meta = std::fs::metadata(file).map_err(|e| file_error(key, file, e.to_string()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(file_error(
            key,
            file,
            format!("mode {mode:04o}: group or others may read it (chmod 600)"),
        ));
    }
    PrivateKeyDer::from_pem_file(file).map_err(|e| file_error(key, file, pem_reason(&e)))
}

/// CA certificates for verifying peers, and what each is (for the expiry
/// metric: an expired CA certificate is not refused here, as the peers'
/// chains decide, but it is exported and `check` warns of it).
pub fn read_roots(key: &str, file: &Path) -> Result<(Arc<RootCertStore>, Vec<CertInfo>), TlsError> {
    let mut roots = RootCertStore::empty();
    let mut infos = Vec::new();
    for cert in read_certs(key, file)? {
        infos.push(cert_info(key, file, &cert)?);
        roots
            .add(cert)
            .map_err(|e| file_error(key, file, format!("not a usable CA certificate: {e}")))?;
    }
    Ok((Arc::new(roots), infos))
}

/// The CRLs of one file.
pub struct Crls {
    pub lists: Vec<CertificateRevocationListDer<'static>>,
    /// Each list's issuer, as [`CertInfo::subject`] shows a subject.
    pub issuers: Vec<String>,
    /// The earliest next update among them.
    pub next_update: Option<i64>,
}

/// The CRLs of a PEM file (one or more `X509 CRL` items).
pub fn read_crls(key: &str, file: &Path) -> Result<Crls, TlsError> {
    let crls = CertificateRevocationListDer::pem_file_iter(file)
        .map_err(|e| file_error(key, file, pem_reason(&e)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(key, file, pem_reason(&e)))?;
    if crls.is_empty() {
        return Err(file_error(key, file, "no X509 CRL in the file"));
    }
    let mut next = None::<i64>;
    let mut issuers = Vec::new();
    for crl in &crls {
        let (_, parsed) = x509_parser::parse_x509_crl(crl.as_ref())
            .map_err(|_| file_error(key, file, "not a valid X.509 CRL"))?;
        issuers.push(parsed.issuer().to_string());
        if let Some(t) = parsed.next_update() {
            let t = t.timestamp();
            next = Some(next.map_or(t, |n| n.min(t)));
        }
    }
    Ok(Crls {
        lists: crls,
        issuers,
        next_update: next,
    })
}

/// What a certificate is, for status, the metrics and the checks above.
pub fn cert_info(key: &str, file: &Path, der: &CertificateDer<'_>) -> Result<CertInfo, TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|_| file_error(key, file, "a certificate is not valid X.509"))?;
    Ok(CertInfo {
        key: key.to_string(),
        file: file.to_path_buf(),
        subject: cert.subject().to_string(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    })
}
