//! `tls` tables: what a link or the admin listener needs to speak TLS, and
//! loading it from PEM files into rustls configurations.
//!
//! Two shapes: [`TlsServer`] where the switch accepts (a listen front, a
//! simplex front's in links, `[admin]`), and [`TlsClient`] where it connects
//! (node links, simplex out links, connect links). Both are read from files
//! each time [`TlsServer::load`] / [`TlsClient::load`] runs, so a reload
//! picks up renewed certificates. Errors name the config key and the file,
//! never what is in it: a key file's content is never printed.
//!
//! rustls with the `ring` provider: no OpenSSL, no cmake. TLS 1.2 is the
//! lowest version offered; TLS 1.3 is preferred whenever both sides have it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde::{Deserialize, Serialize};

use crate::util::duration;

mod files;
use files::{cert_info, read_chain, read_crls, read_key, read_roots};
pub use files::{now_s, rfc3339};

/// The lowest TLS version a link accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3 (1.3 chosen whenever the peer has it).
    #[default]
    #[serde(rename = "1.2")]
    V1_2,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    V1_3,
}

impl TlsVersion {
    fn versions(self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static BOTH: [&rustls::SupportedProtocolVersion; 2] =
            [&rustls::version::TLS13, &rustls::version::TLS12];
        static ONLY_13: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        match self {
            TlsVersion::V1_2 => &BOTH,
            TlsVersion::V1_3 => &ONLY_13,
        }
    }
}

fn default_handshake_timeout() -> Duration {
    Duration::from_secs(10)
}

/// The server side: the switch's certificate, and optionally the clients'
/// CA and the names a client certificate must carry (mutual TLS).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsServer {
    /// PEM certificate chain the switch presents, leaf first.
    pub cert: PathBuf,
    /// PEM private key of `cert` (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates client certificates must chain to. Set, a client
    /// without a valid certificate is refused in the handshake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// Names a client certificate must carry, as its subject CN or one of its
    /// subject alternative names (DNS, IP, e-mail, URI); empty accepts any
    /// certificate `client_ca` signed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_names: Vec<String>,
    /// PEM files of certificate revocation lists (one or more `X509 CRL`
    /// each) issued by the CAs of `client_ca`: a client certificate they
    /// revoke is refused in the handshake. Read again at each reload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_crl: Vec<PathBuf>,
    /// `"1.2"` (default) or `"1.3"`.
    #[serde(default)]
    pub min_version: TlsVersion,
    /// Time a new connection has to finish its handshake.
    #[serde(default = "default_handshake_timeout", with = "duration")]
    pub handshake_timeout: Duration,
}

/// The client side: the CA the peer's certificate must chain to, the name it
/// must carry, and optionally the switch's own certificate.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsClient {
    /// PEM CA certificates the peer's certificate must chain to.
    pub ca: PathBuf,
    /// PEM certificate chain presented when the peer asks (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// The name the peer's certificate must carry; default the IP address
    /// connected to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    #[serde(default)]
    pub min_version: TlsVersion,
    #[serde(default = "default_handshake_timeout", with = "duration")]
    pub handshake_timeout: Duration,
}

/// Why TLS material cannot be used: the key, the file, what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key}: {}: {reason}", file.display())]
    File {
        key: String,
        file: PathBuf,
        reason: String,
    },
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: TlsReason },
}

/// Why a TLS setting (not a file) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsReason {
    /// A rule stated at its check (`cert and key go together`).
    #[error("{0}")]
    Rule(&'static str),
    /// rustls refuses the protocol versions `min_version` allows.
    #[error(transparent)]
    Versions(rustls::Error),
    /// rustls cannot verify clients against the CA and its revocation lists.
    #[error("cannot be used: {0}")]
    Revocation(#[source] rustls::server::VerifierBuilderError),
}

/// One certificate a link presents, for status and the expiry metric.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CertInfo {
    /// The config key of the certificate (`service[0].front.tls.cert`).
    pub key: String,
    pub file: PathBuf,
    pub subject: String,
    /// Start of validity, seconds since the Unix epoch.
    pub not_before: i64,
    /// Expiry, seconds since the Unix epoch.
    pub not_after: i64,
}

/// One CRL file a server table reads, for `check`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrlInfo {
    /// `service[0].front.tls.client_crl[0]`.
    pub key: String,
    pub file: PathBuf,
    /// The earliest `nextUpdate` of its lists (seconds since the Unix
    /// epoch): past it, the CA has published a newer list.
    pub next_update: Option<i64>,
}

/// A loaded server side: what rustls accepts with, and the certificate shown.
#[derive(Clone, Debug)]
pub struct LoadedServer {
    pub config: Arc<ServerConfig>,
    pub cert: CertInfo,
    /// The certificates of `client_ca`.
    pub cas: Vec<CertInfo>,
    /// The `client_crl` files.
    pub crls: Vec<CrlInfo>,
}

/// A loaded client side.
#[derive(Clone, Debug)]
pub struct LoadedClient {
    pub config: Arc<ClientConfig>,
    /// The switch's own certificate, when it presents one.
    pub cert: Option<CertInfo>,
    pub server_name: Option<ServerName<'static>>,
    /// The certificates of `ca`.
    pub cas: Vec<CertInfo>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsServer {
    /// Checks what needs no file: names without a CA are a mistake.
    pub fn validate(&self, key: &str) -> Result<(), TlsError> {
        if !self.client_names.is_empty() && self.client_ca.is_none() {
            return Err(invalid(
                format!("{key}.client_names"),
                "needs client_ca (names are checked on verified client certificates)",
            ));
        }
        if !self.client_crl.is_empty() && self.client_ca.is_none() {
            return Err(invalid(
                format!("{key}.client_crl"),
                "needs client_ca (revocation is checked on verified client certificates)",
            ));
        }
        if self.handshake_timeout.is_zero() {
            return Err(invalid(format!("{key}.handshake_timeout"), "must be > 0"));
        }
        Ok(())
    }

    /// Reads the files and builds the rustls server configuration. `key` is
    /// the table's config key (`service[0].front.tls`).
    pub fn load(&self, key: &str) -> Result<LoadedServer, TlsError> {
        self.validate(key)?;
        let cert_key = format!("{key}.cert");
        let chain = read_chain(&cert_key, &self.cert)?;
        let info = cert_info(&cert_key, &self.cert, &chain[0])?;
        let private = read_key(&format!("{key}.key"), &self.key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(self.min_version.versions())
            .map_err(|e| invalid(format!("{key}.min_version"), TlsReason::Versions(e)))?;
        let (mut cas, mut crls) = (Vec::new(), Vec::new());
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let ca_key = format!("{key}.client_ca");
                let (roots, infos) = read_roots(&ca_key, ca)?;
                let mut lists = Vec::new();
                for (i, file) in self.client_crl.iter().enumerate() {
                    let crl_key = format!("{key}.client_crl[{i}]");
                    let read = read_crls(&crl_key, file)?;
                    if let Some(issuer) = read
                        .issuers
                        .iter()
                        .find(|i| !infos.iter().any(|ca| &ca.subject == *i))
                    {
                        return Err(file_error(
                            &crl_key,
                            file,
                            format!("a list issued by {issuer}, not by a certificate of {ca_key}"),
                        ));
                    }
                    crls.push(CrlInfo {
                        key: crl_key,
                        file: file.clone(),
                        next_update: read.next_update,
                    });
                    lists.extend(read.lists);
                }
                cas = infos;
                // Revocation is checked on every certificate of the chain
                // below the CA; one whose issuer has no list here is refused
                // (its status is unknown): fail closed.
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                    .with_crls(lists)
                    .build()
                    .map_err(|e| {
                        if self.client_crl.is_empty() {
                            file_error(&ca_key, ca, e.to_string())
                        } else {
                            invalid(format!("{key}.client_crl"), TlsReason::Revocation(e))
                        }
                    })?;
                builder.with_client_cert_verifier(Arc::new(NamedClients {
                    inner: verifier,
                    names: self.client_names.clone(),
                }))
            }
        };
        let config = builder
            .with_single_cert(chain, private)
            .map_err(|e| file_error(&format!("{key}.key"), &self.key, key_reason(&e)))?;
        Ok(LoadedServer {
            config: Arc::new(config),
            cert: info,
            cas,
            crls,
        })
    }
}

impl TlsClient {
    pub fn validate(&self, key: &str) -> Result<(), TlsError> {
        if self.cert.is_some() != self.key.is_some() {
            return Err(invalid(
                format!("{key}.{}", if self.cert.is_some() { "key" } else { "cert" }),
                "cert and key go together",
            ));
        }
        if let Some(name) = &self.server_name {
            ServerName::try_from(name.as_str()).map_err(|_| {
                invalid(format!("{key}.server_name"), "not a DNS name or IP address")
            })?;
        }
        if self.handshake_timeout.is_zero() {
            return Err(invalid(format!("{key}.handshake_timeout"), "must be > 0"));
        }
        Ok(())
    }

    /// Reads the files and builds the rustls client configuration.
    pub fn load(&self, key: &str) -> Result<LoadedClient, TlsError> {
        self.validate(key)?;
        let ca_key = format!("{key}.ca");
        let (roots, cas) = read_roots(&ca_key, &self.ca)?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(self.min_version.versions())
            .map_err(|e| invalid(format!("{key}.min_version"), TlsReason::Versions(e)))?
            .with_root_certificates(roots);
        let (config, cert) = match (&self.cert, &self.key) {
            (Some(cert), Some(private)) => {
                let cert_key = format!("{key}.cert");
                let chain = read_chain(&cert_key, cert)?;
                let info = cert_info(&cert_key, cert, &chain[0])?;
                let private_key = read_key(&format!("{key}.key"), private)?;
                let config = builder
                    .with_client_auth_cert(chain, private_key)
                    .map_err(|e| file_error(&format!("{key}.key"), private, key_reason(&e)))?;
                (config, Some(info))
            }
            _ => (builder.with_no_client_auth(), None),
        };
        let server_name = match &self.server_name {
            Some(n) => Some(
                ServerName::try_from(n.clone())
                    .map_err(|_| invalid(format!("{key}.server_name"), "not a DNS name or IP"))?,
            ),
            None => None,
        };
        Ok(LoadedClient {
            config: Arc::new(config),
            cert,
            server_name,
            cas,
        })
    }
}

impl TlsError {
    /// The config key at fault.
    pub fn key(&self) -> String {
        match self {
            TlsError::File { key, .. } | TlsError::Invalid { key, .. } => key.clone(),
        }
    }

    /// What is wrong, with the file when one is at fault.
    pub fn reason(&self) -> String {
        match self {
            TlsError::File { file, reason, .. } => format!("{}: {reason}", file.display()),
            TlsError::Invalid { reason, .. } => reason.to_string(),
        }
    }
}

/// The config key of each table: where a service's TLS tables sit.
pub fn front_key(service: usize) -> String {
    format!("service[{service}].front.tls")
}

pub fn in_links_key(service: usize) -> String {
    format!("service[{service}].front.in_tls")
}

pub fn back_key(service: usize) -> String {
    format!("service[{service}].back.tls")
}

pub const ADMIN_KEY: &str = "admin.tls";

/// Checks every `tls` table of `config` for what needs no file (files are
/// read when the switch starts and at each reload).
pub fn validate(config: &super::Config) -> Result<(), TlsError> {
    use super::FrontConfig;
    if let Some(t) = config.admin.as_ref().and_then(|a| a.tls.as_ref()) {
        t.validate(ADMIN_KEY)?;
    }
    for (i, svc) in config.services.iter().enumerate() {
        match &svc.front {
            FrontConfig::Listen(f) => {
                if let Some(t) = &f.tls {
                    t.validate(&front_key(i))?;
                }
                if f.mode == super::ListenMode::Oneconnect && svc.back.tls.is_some() {
                    return Err(invalid(
                        back_key(i),
                        "not supported with mode = \"oneconnect\" yet (docs/tls.md)",
                    ));
                }
            }
            FrontConfig::Simplex(f) => {
                if let Some(t) = &f.tls {
                    t.validate(&front_key(i))?;
                }
                if let Some(t) = &f.in_tls {
                    t.validate(&in_links_key(i))?;
                }
            }
            FrontConfig::Connect(f) => {
                if let Some(t) = &f.tls {
                    t.validate(&front_key(i))?;
                }
            }
        }
        if let Some(t) = &svc.back.tls {
            t.validate(&back_key(i))?;
        }
    }
    Ok(())
}

fn invalid(key: impl Into<String>, reason: impl Into<TlsReason>) -> TlsError {
    TlsError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

impl From<&'static str> for TlsReason {
    fn from(rule: &'static str) -> Self {
        TlsReason::Rule(rule)
    }
}

pub(crate) fn file_error(key: &str, file: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::File {
        key: key.to_string(),
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

/// rustls's reason a key was refused, without the key.
fn key_reason(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InconsistentKeys(_) => "the key does not match the certificate".into(),
        _ => "the key cannot be used with the certificate (unsupported or malformed)".into(),
    }
}

/// The subject DN of a DER certificate, for the connection table.
pub fn subject_of(der: &[u8]) -> Option<String> {
    x509_parser::parse_x509_certificate(der)
        .ok()
        .map(|(_, c)| c.subject().to_string())
}

/// The names a certificate answers to: its subject CNs and its subject
/// alternative names.
pub fn names_of(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(n) | GeneralName::RFC822Name(n) | GeneralName::URI(n) => {
                    names.push((*n).to_string())
                }
                GeneralName::IPAddress(ip) => {
                    if let Ok(a) = <[u8; 4]>::try_from(*ip) {
                        names.push(std::net::Ipv4Addr::from(a).to_string());
                    } else if let Ok(a) = <[u8; 16]>::try_from(*ip) {
                        names.push(std::net::Ipv6Addr::from(a).to_string());
                    }
                }
                _ => {}
            }
        }
    }
    names
}

/// A client verifier that, past the chain, wants one of the allowed names:
/// a certificate from the right CA but for another party is refused in the
/// handshake, as the security team expects, not after it.
#[derive(Debug)]
struct NamedClients {
    inner: Arc<dyn ClientCertVerifier>,
    names: Vec<String>,
}

impl ClientCertVerifier for NamedClients {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.names.is_empty()
            || names_of(end_entity.as_ref())
                .iter()
                .any(|n| self.names.contains(n))
        {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests;
