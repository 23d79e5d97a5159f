//! TLS for the command-line tools (`ctl`, and with the `tools` feature the
//! simulators and `load`): the `--tls-*` flags, and the handshake on a
//! connection a tool opens or accepts. The files are read with the switch's
//! loader (`config::tls`), errors naming the flag; the link code is the
//! tools' own. It lives here, not under `sim`, because `ctl` is part of the
//! production binary and `sim` is not; what only the simulators use (the
//! server side, both sides at once) is built with the `tools` feature only.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

#[cfg(feature = "tools")]
use crate::config::tls::TlsServer;
use crate::config::tls::{TlsClient, TlsError, TlsVersion};
use crate::tls::LinkStream;

/// `--tls-*` flags that do not make a handshake; each variant names the
/// flags (the loader's errors name the `--tls.*` key and the file).
#[derive(Debug, thiserror::Error)]
pub enum TlsFlagsError {
    #[error("--tls-ca: needed to verify the server")]
    NoCa,
    #[error("--tls-cert and --tls-key: needed to accept TLS")]
    NoCertKey,
    #[error(transparent)]
    Load(#[from] TlsError),
}

/// `--tls-ca`, `--tls-cert`, `--tls-key`, `--tls-server-name`: TLS is on
/// when any is given.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TlsFlags {
    /// PEM CA the other side's certificate must chain to. Where this tool
    /// accepts, clients must then present a certificate it signed.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate chain this tool presents (needed where it accepts).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Name the server's certificate must carry (default: the IP connected to).
    #[arg(long)]
    pub tls_server_name: Option<String>,
}

impl TlsFlags {
    fn any(&self) -> bool {
        self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_key.is_some()
            || self.tls_server_name.is_some()
    }

    /// The client side, when TLS is on.
    pub fn client(&self) -> Result<Option<Arc<Connector>>, TlsFlagsError> {
        if !self.any() {
            return Ok(None);
        }
        let ca = self.tls_ca.clone().ok_or(TlsFlagsError::NoCa)?;
        let table = TlsClient {
            ca,
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            server_name: self.tls_server_name.clone(),
            min_version: TlsVersion::V1_2,
            handshake_timeout: std::time::Duration::from_secs(10),
        };
        let loaded = table.load("--tls")?;
        Ok(Some(Arc::new(Connector {
            connector: tokio_rustls::TlsConnector::from(loaded.config),
            name: loaded.server_name,
        })))
    }

    /// The server side, when TLS is on.
    #[cfg(feature = "tools")]
    pub fn server(&self) -> Result<Option<Arc<Acceptor>>, TlsFlagsError> {
        if !self.any() {
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (self.tls_cert.clone(), self.tls_key.clone()) else {
            return Err(TlsFlagsError::NoCertKey);
        };
        let table = TlsServer {
            cert,
            key,
            client_ca: self.tls_ca.clone(),
            client_names: Vec::new(),
            client_crl: Vec::new(),
            min_version: TlsVersion::V1_2,
            handshake_timeout: std::time::Duration::from_secs(10),
        };
        let loaded = table.load("--tls")?;
        Ok(Some(Arc::new(Acceptor(tokio_rustls::TlsAcceptor::from(
            loaded.config,
        )))))
    }
}

/// Both sides, for a simulator that accepts and connects (UnionPay: the
/// switch's out links come in, its in links go out).
#[cfg(feature = "tools")]
#[derive(Clone, Debug, Default)]
pub struct SimTls {
    pub server: Option<Arc<Acceptor>>,
    pub client: Option<Arc<Connector>>,
}

#[cfg(feature = "tools")]
impl TlsFlags {
    /// Both sides from one set of flags: --tls-cert/--tls-key are presented
    /// either way, --tls-ca verifies the switch either way.
    pub fn both(&self) -> Result<SimTls, TlsFlagsError> {
        Ok(SimTls {
            server: self.server()?,
            client: self.client()?,
        })
    }
}

/// A simulator's client handshake.
pub struct Connector {
    connector: tokio_rustls::TlsConnector,
    name: Option<ServerName<'static>>,
}

/// A simulator's server handshake.
#[cfg(feature = "tools")]
pub struct Acceptor(tokio_rustls::TlsAcceptor);

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connector")
    }
}

#[cfg(feature = "tools")]
impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Acceptor")
    }
}

/// Connects to `addr` (TCP, no delay), with the handshake when `tls` is on.
#[cfg(feature = "tools")]
pub async fn connect(tls: Option<&Connector>, addr: SocketAddr) -> std::io::Result<LinkStream> {
    let tcp = TcpStream::connect(addr).await?;
    let _ = tcp.set_nodelay(true);
    secure_connect(tls, tcp, addr).await
}

/// The client handshake on a connected stream, when `tls` is on.
pub async fn secure_connect(
    tls: Option<&Connector>,
    tcp: TcpStream,
    addr: SocketAddr,
) -> std::io::Result<LinkStream> {
    let Some(c) = tls else {
        return Ok(LinkStream::Plain(tcp));
    };
    let name = c
        .name
        .clone()
        .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
    let s = c.connector.connect(name, tcp).await?;
    Ok(LinkStream::Tls(Box::new(s.into())))
}

/// The server handshake on an accepted stream, when `tls` is on.
#[cfg(feature = "tools")]
pub async fn accept(tls: Option<&Acceptor>, tcp: TcpStream) -> std::io::Result<LinkStream> {
    let _ = tcp.set_nodelay(true);
    match tls {
        None => Ok(LinkStream::Plain(tcp)),
        Some(a) => {
            let s = tokio::time::timeout(std::time::Duration::from_secs(10), a.0.accept(tcp))
                .await
                .map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake")
                })??;
            Ok(LinkStream::Tls(Box::new(s.into())))
        }
    }
}
