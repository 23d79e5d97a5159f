//! TLS to PostgreSQL over rustls (the switch's own TLS stack): a
//! [`MakeTlsConnect`] for tokio-postgres with libpq's `sslmode=verify-full`
//! semantics. The server's chain must lead to a CA of `store.ca_file` and
//! its certificate must name the host of `store.url` (a DNS name or an IP
//! address in its subject alternative names); TLS 1.2 or 1.3 only.
//!
//! Channel binding (`tls-server-end-point`, RFC 5929) is offered, so a
//! server that has it uses SCRAM-SHA-256-PLUS: the password exchange is then
//! bound to the certificate the switch verified.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ring::digest;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_rustls::TlsConnector;

use super::error::StoreError;

/// The connector: cheap to clone (the rustls configuration is shared).
#[derive(Clone)]
pub struct PgTls {
    config: Arc<ClientConfig>,
    /// The CA file it trusts, for messages.
    pub ca_file: PathBuf,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "verify-full (CA {})", self.ca_file.display())
    }
}

fn bad_ca(file: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::BadConfig {
        key: "store.ca_file",
        reason: format!("{}: {}", file.display(), reason.into()),
    }
}

impl PgTls {
    /// Trusts the CA certificates (PEM) in `file`, and nothing else.
    pub fn from_ca_file(file: &Path) -> Result<PgTls, StoreError> {
        let certs = CertificateDer::pem_file_iter(file)
            .map_err(|e| bad_ca(file, pem_reason(&e)))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad_ca(file, pem_reason(&e)))?;
        if certs.is_empty() {
            return Err(bad_ca(file, "no CERTIFICATE in the file"));
        }
        let mut roots = RootCertStore::empty();
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| bad_ca(file, format!("not a usable CA certificate: {e}")))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad_ca(file, e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(PgTls {
            config: Arc::new(config),
            ca_file: file.to_path_buf(),
        })
    }
}

/// A PEM error in our words (the parser's may quote a line of the file).
fn pem_reason(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match e {
        Error::Io(io) => io.to_string(),
        Error::NoItemsFound => "no CERTIFICATE in the file".into(),
        _ => "not valid PEM".into(),
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgTlsConnect, io::Error> {
        let name = ServerName::try_from(domain)
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("`{domain}` is not a DNS name or IP address to verify"),
                )
            })?
            .to_owned();
        Ok(PgTlsConnect {
            connector: TlsConnector::from(Arc::clone(&self.config)),
            name,
        })
    }
}

/// One connection's handshake, to the server named `name`.
pub struct PgTlsConnect {
    connector: TlsConnector,
    name: ServerName<'static>,
}

type Handshake<S> = Pin<Box<dyn Future<Output = io::Result<PgTlsStream<S>>> + Send>>;

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = io::Error;
    type Future = Handshake<S>;

    fn connect(self, stream: S) -> Handshake<S> {
        Box::pin(async move {
            let tls = self.connector.connect(self.name, stream).await?;
            Ok(PgTlsStream(Box::new(tls)))
        })
    }
}

/// The encrypted stream.
pub struct PgTlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| end_point_hash(leaf.as_ref()))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

/// RFC 5929 `tls-server-end-point`: the certificate hashed with its
/// signature's hash, SHA-256 for anything weaker. `None` for a signature
/// whose hash this does not know (Ed25519 has none): no binding offered.
fn end_point_hash(der: &[u8]) -> Option<Vec<u8>> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let oid = cert.signature_algorithm.algorithm.to_id_string();
    let algorithm = match oid.as_str() {
        // SHA-1 or SHA-256 with RSA, ECDSA with SHA-1 or SHA-256
        "1.2.840.113549.1.1.5"
        | "1.2.840.113549.1.1.11"
        | "1.2.840.10045.4.1"
        | "1.2.840.10045.4.3.2" => &digest::SHA256,
        "1.2.840.113549.1.1.12" | "1.2.840.10045.4.3.3" => &digest::SHA384,
        "1.2.840.113549.1.1.13" | "1.2.840.10045.4.3.4" => &digest::SHA512,
        _ => return None,
    };
    Some(digest::digest(algorithm, der).as_ref().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_file_is_refused_naming_the_key() {
        let dir = std::env::temp_dir().join(format!("pg-tls-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let empty = dir.join("empty.pem");
        let _ = std::fs::write(&empty, b"not pem\n");
        for file in [dir.join("absent.pem"), empty] {
            match PgTls::from_ca_file(&file) {
                Err(e @ StoreError::BadConfig { key, .. }) => {
                    assert_eq!(key, "store.ca_file");
                    assert!(e.to_string().contains(&*file.to_string_lossy()), "{e}");
                }
                other => panic!("{}: {other:?}", file.display()),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
