//! TLS at run time: the loaded configurations of each link kind (swapped
//! whole on reload: new connections take the new certificates, established
//! ones keep their session), the handshakes with their timeout and failure
//! counts, and the split stream the link tasks read and write.
//!
//! The config tables and their loading are in `config::tls`.

pub mod failures;
pub mod stream;
pub mod tools;

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls_pki_types::ServerName;
use serde::Serialize;
use tokio::net::TcpStream;

use crate::config::tls::{
    CertInfo, LoadedClient, LoadedServer, TlsClient, TlsError, TlsServer, back_key, front_key,
    in_links_key,
};
use crate::config::{FrontConfig, ServiceConfig};
pub use failures::{Failure, Handshakes, Side};
pub use stream::{LinkRead, LinkStream, LinkWrite, TlsTcp};

/// What a TLS link negotiated, for the connection table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TlsInfo {
    pub version: String,
    pub cipher: String,
    /// The peer certificate's subject, when it presented one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_subject: Option<String>,
}

impl TlsInfo {
    pub fn of(stream: &TlsTcp) -> TlsInfo {
        let (_, state) = stream.get_ref();
        TlsInfo {
            version: state
                .protocol_version()
                .map_or_else(String::new, version_name),
            cipher: state
                .negotiated_cipher_suite()
                .map_or_else(String::new, |c| format!("{:?}", c.suite())),
            peer_subject: state
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| crate::config::tls::subject_of(c.as_ref())),
        }
    }
}

fn version_name(v: rustls::ProtocolVersion) -> String {
    match v {
        rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3".into(),
        rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2".into(),
        other => format!("{other:?}"),
    }
}

/// Where the switch accepts TLS: a front, a peer's in links, the admin.
pub struct ServerSide {
    table: TlsServer,
    key: String,
    loaded: ArcSwap<LoadedServer>,
}

impl ServerSide {
    pub fn load(table: &TlsServer, key: &str) -> Result<ServerSide, TlsError> {
        Ok(ServerSide {
            loaded: ArcSwap::from_pointee(table.load(key)?),
            table: table.clone(),
            key: key.to_string(),
        })
    }

    /// Reads the files again; nothing changes until [`ServerSide::install`].
    pub fn reread(&self) -> Result<LoadedServer, TlsError> {
        self.table.load(&self.key)
    }

    pub fn install(&self, loaded: LoadedServer) {
        self.loaded.store(Arc::new(loaded));
    }

    pub fn cert(&self) -> CertInfo {
        self.loaded.load().cert.clone()
    }

    /// The certificates of `client_ca`.
    pub fn cas(&self) -> Vec<CertInfo> {
        self.loaded.load().cas.clone()
    }

    /// The `client_crl` files.
    pub fn crls(&self) -> Vec<crate::config::tls::CrlInfo> {
        self.loaded.load().crls.clone()
    }

    /// The server handshake on an accepted connection, within the table's
    /// `handshake_timeout`.
    pub async fn accept(&self, tcp: TcpStream) -> Result<TlsTcp, Failure> {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&self.loaded.load().config));
        match tokio::time::timeout(self.table.handshake_timeout, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Ok(s.into()),
            Ok(Err(e)) => Err(Failure::of(&e)),
            Err(_) => Err(Failure::Timeout),
        }
    }
}

/// Where the switch connects over TLS: node links, a peer's out links.
pub struct ClientSide {
    table: TlsClient,
    key: String,
    loaded: ArcSwap<LoadedClient>,
}

impl ClientSide {
    pub fn load(table: &TlsClient, key: &str) -> Result<ClientSide, TlsError> {
        Ok(ClientSide {
            loaded: ArcSwap::from_pointee(table.load(key)?),
            table: table.clone(),
            key: key.to_string(),
        })
    }

    pub fn reread(&self) -> Result<LoadedClient, TlsError> {
        self.table.load(&self.key)
    }

    pub fn install(&self, loaded: LoadedClient) {
        self.loaded.store(Arc::new(loaded));
    }

    pub fn cert(&self) -> Option<CertInfo> {
        self.loaded.load().cert.clone()
    }

    /// The certificates of `ca`.
    pub fn cas(&self) -> Vec<CertInfo> {
        self.loaded.load().cas.clone()
    }

    /// The client handshake to `addr`: the peer's certificate must carry
    /// `server_name`, or else the IP address connected to.
    pub async fn connect(&self, tcp: TcpStream, addr: SocketAddr) -> Result<TlsTcp, Failure> {
        let loaded = self.loaded.load();
        let name = loaded
            .server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&loaded.config));
        match tokio::time::timeout(self.table.handshake_timeout, connector.connect(name, tcp)).await
        {
            Ok(Ok(s)) => Ok(s.into()),
            Ok(Err(e)) => Err(Failure::of(&e)),
            Err(_) => Err(Failure::Timeout),
        }
    }
}

/// The TLS sides of one service, loaded at start.
#[derive(Default)]
pub struct ServiceTls {
    /// A listen front's clients.
    pub front: Option<ServerSide>,
    /// A simplex front's in links.
    pub in_links: Option<ServerSide>,
    /// Out links of a simplex front, links of a connect front.
    pub out_links: Option<ClientSide>,
    /// Node links.
    pub back: Option<ClientSide>,
    pub handshakes: Handshakes,
}

/// Certificates re-read for a reload, installed only once all have loaded.
pub struct Reread {
    front: Option<LoadedServer>,
    in_links: Option<LoadedServer>,
    out_links: Option<LoadedClient>,
    back: Option<LoadedClient>,
}

impl ServiceTls {
    /// Loads the tables of service `index` of the config.
    pub fn load(svc: &ServiceConfig, index: usize) -> Result<ServiceTls, TlsError> {
        let mut tls = ServiceTls::default();
        match &svc.front {
            FrontConfig::Listen(f) => {
                tls.front = f
                    .tls
                    .as_ref()
                    .map(|t| ServerSide::load(t, &front_key(index)))
                    .transpose()?;
            }
            FrontConfig::Simplex(f) => {
                tls.out_links = f
                    .tls
                    .as_ref()
                    .map(|t| ClientSide::load(t, &front_key(index)))
                    .transpose()?;
                tls.in_links = f
                    .in_tls
                    .as_ref()
                    .map(|t| ServerSide::load(t, &in_links_key(index)))
                    .transpose()?;
            }
            FrontConfig::Connect(f) => {
                tls.out_links = f
                    .tls
                    .as_ref()
                    .map(|t| ClientSide::load(t, &front_key(index)))
                    .transpose()?;
            }
        }
        tls.back = svc
            .back
            .tls
            .as_ref()
            .map(|t| ClientSide::load(t, &back_key(index)))
            .transpose()?;
        Ok(tls)
    }

    /// Reads every certificate and key again; an error changes nothing.
    pub fn reread(&self) -> Result<Reread, TlsError> {
        Ok(Reread {
            front: self.front.as_ref().map(ServerSide::reread).transpose()?,
            in_links: self.in_links.as_ref().map(ServerSide::reread).transpose()?,
            out_links: self
                .out_links
                .as_ref()
                .map(ClientSide::reread)
                .transpose()?,
            back: self.back.as_ref().map(ClientSide::reread).transpose()?,
        })
    }

    /// New connections from now on use `r`; links up keep their sessions.
    pub fn install(&self, r: Reread) {
        if let (Some(s), Some(l)) = (&self.front, r.front) {
            s.install(l);
        }
        if let (Some(s), Some(l)) = (&self.in_links, r.in_links) {
            s.install(l);
        }
        if let (Some(s), Some(l)) = (&self.out_links, r.out_links) {
            s.install(l);
        }
        if let (Some(s), Some(l)) = (&self.back, r.back) {
            s.install(l);
        }
    }

    /// The CA certificates this service verifies peers with, by link kind.
    pub fn cas(&self) -> Vec<(&'static str, CertInfo)> {
        let mut all = Vec::new();
        let servers = [("front", &self.front), ("in-links", &self.in_links)];
        for (link, side) in servers {
            if let Some(s) = side {
                all.extend(s.cas().into_iter().map(|c| (link, c)));
            }
        }
        let clients = [("out-links", &self.out_links), ("back", &self.back)];
        for (link, side) in clients {
            if let Some(s) = side {
                all.extend(s.cas().into_iter().map(|c| (link, c)));
            }
        }
        all
    }

    /// The `client_crl` files this service reads.
    pub fn crls(&self) -> Vec<crate::config::tls::CrlInfo> {
        [&self.front, &self.in_links]
            .into_iter()
            .flatten()
            .flat_map(ServerSide::crls)
            .collect()
    }

    /// The certificates this service presents, by link kind.
    pub fn certs(&self) -> Vec<(&'static str, CertInfo)> {
        let mut all = Vec::new();
        if let Some(s) = &self.front {
            all.push(("front", s.cert()));
        }
        if let Some(s) = &self.in_links {
            all.push(("in-links", s.cert()));
        }
        if let Some(c) = self.out_links.as_ref().and_then(ClientSide::cert) {
            all.push(("out-links", c));
        }
        if let Some(c) = self.back.as_ref().and_then(ClientSide::cert) {
            all.push(("back", c));
        }
        all
    }
}

/// The admin listener's TLS and its handshakes.
pub struct AdminTls {
    pub side: ServerSide,
    pub handshakes: Handshakes,
}

/// A certificate the switch presents, with its expiry, as status shows it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct CertStatus {
    /// The service, or `admin`.
    pub service: String,
    /// front, in-links, out-links, back or admin.
    pub link: String,
    /// The config key it was loaded from.
    pub key: String,
    pub file: String,
    pub subject: String,
    /// Expiry, seconds since the Unix epoch.
    pub not_after: i64,
    /// Seconds left until expiry (negative once expired).
    pub expires_in_s: i64,
}

/// Every CA certificate the switch verifies peers with (`ca`,
/// `client_ca`): each service's, then the admin's.
pub fn ca_statuses<'a>(
    services: impl Iterator<Item = (&'a str, &'a ServiceTls)>,
    admin: Option<&AdminTls>,
) -> Vec<CertStatus> {
    let mut all: Vec<CertStatus> = services
        .flat_map(|(name, tls)| {
            tls.cas()
                .into_iter()
                .map(move |(link, c)| status_row(name, link, c))
                .collect::<Vec<_>>()
        })
        .collect();
    if let Some(a) = admin {
        all.extend(
            a.side
                .cas()
                .into_iter()
                .map(|c| status_row("admin", "admin", c)),
        );
    }
    all
}

fn status_row(service: &str, link: &str, c: CertInfo) -> CertStatus {
    CertStatus {
        service: service.to_string(),
        link: link.to_string(),
        key: c.key,
        file: c.file.display().to_string(),
        subject: c.subject,
        not_after: c.not_after,
        expires_in_s: seconds_left(c.not_after),
    }
}

/// Every certificate the switch presents: each service's, then the admin's.
pub fn cert_statuses<'a>(
    services: impl Iterator<Item = (&'a str, &'a ServiceTls)>,
    admin: Option<&AdminTls>,
) -> Vec<CertStatus> {
    let row = status_row;
    let mut all: Vec<CertStatus> = services
        .flat_map(|(name, tls)| {
            tls.certs()
                .into_iter()
                .map(move |(link, c)| row(name, link, c))
                .collect::<Vec<_>>()
        })
        .collect();
    if let Some(a) = admin {
        all.push(row("admin", "admin", a.side.cert()));
    }
    all
}

/// Seconds from now until `not_after` (negative once expired).
pub fn seconds_left(not_after: i64) -> i64 {
    not_after.saturating_sub(crate::config::tls::now_s())
}
