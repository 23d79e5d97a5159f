//! Serde for `host:port` keys: an IP address, or a host name resolved when the
//! configuration is loaded (the first address the resolver gives).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error};

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    resolve(&text).map_err(D::Error::custom)
}

pub fn serialize<S: Serializer>(addr: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
    addr.serialize(s)
}

static IP_ONLY: AtomicBool = AtomicBool::new(false);

/// Refuses host names from now on in this process (the config fuzzer must
/// not send DNS queries).
pub fn resolve_ip_only() {
    IP_ONLY.store(true, Ordering::Relaxed);
}

/// Why an address does not read as `host:port`; each names the text.
#[derive(Debug, thiserror::Error)]
pub enum AddrError {
    #[error("`{0}` is not host:port")]
    NotHostPort(String),
    #[error("`{text}`: port `{port}` is not 0..=65535")]
    Port { text: String, port: String },
    #[error("`{0}` has no host")]
    NoHost(String),
    #[error("`{0}`: host names are not resolved here")]
    NamesOff(String),
    #[error("cannot resolve `{host}`: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("`{0}` resolves to no address")]
    NoAddress(String),
}

/// `127.0.0.1:7001`, `[::1]:7001` or `localhost:7001`.
pub fn resolve(text: &str) -> Result<SocketAddr, AddrError> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(AddrError::NotHostPort(text.to_string()));
    };
    let port: u16 = port.parse().map_err(|_| AddrError::Port {
        text: text.to_string(),
        port: port.to_string(),
    })?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(AddrError::NoHost(text.to_string()));
    }
    if IP_ONLY.load(Ordering::Relaxed) {
        return Err(AddrError::NamesOff(text.to_string()));
    }
    let mut addrs = (host, port)
        .to_socket_addrs()
        .map_err(|source| AddrError::Resolve {
            host: host.to_string(),
            source,
        })?;
    addrs
        .next()
        .ok_or_else(|| AddrError::NoAddress(host.to_string()))
}
