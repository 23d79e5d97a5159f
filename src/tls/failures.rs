//! Handshake failures, counted by reason for the metrics and logged at a
//! limited rate: a scanner or a misconfigured client retrying every second
//! must not flood the log.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a handshake failed, as operators act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The client sent no certificate where one is required.
    NoCertificate,
    /// The peer's certificate does not chain to the configured CA (or is
    /// otherwise invalid).
    BadCertificate,
    /// The peer's certificate has expired or is not yet valid.
    Expired,
    /// The peer's certificate is on a `client_crl` list.
    Revoked,
    /// A valid client certificate whose names are not in `client_names`, or a
    /// server certificate without the expected name.
    NameNotAllowed,
    /// No TLS version or cipher suite in common.
    Incompatible,
    /// The peer sent an alert (it refused our certificate, most often).
    PeerAlert,
    /// Not TLS at all (a plain client on a TLS port).
    NotTls,
    /// The handshake did not finish within `handshake_timeout`.
    Timeout,
    /// The connection broke during the handshake.
    Io,
}

impl Failure {
    pub const ALL: [Failure; 10] = [
        Failure::NoCertificate,
        Failure::BadCertificate,
        Failure::Expired,
        Failure::Revoked,
        Failure::NameNotAllowed,
        Failure::Incompatible,
        Failure::PeerAlert,
        Failure::NotTls,
        Failure::Timeout,
        Failure::Io,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Failure::NoCertificate => "no-certificate",
            Failure::BadCertificate => "bad-certificate",
            Failure::Expired => "expired-certificate",
            Failure::Revoked => "revoked-certificate",
            Failure::NameNotAllowed => "name-not-allowed",
            Failure::Incompatible => "incompatible",
            Failure::PeerAlert => "peer-alert",
            Failure::NotTls => "not-tls",
            Failure::Timeout => "timeout",
            Failure::Io => "io",
        }
    }

    /// The reason of a failed handshake's error.
    pub fn of(e: &std::io::Error) -> Failure {
        use rustls::{CertificateError as C, Error as E};
        let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
            return match e.kind() {
                std::io::ErrorKind::InvalidData => Failure::NotTls,
                _ => Failure::Io,
            };
        };
        match tls {
            E::NoCertificatesPresented => Failure::NoCertificate,
            E::InvalidCertificate(C::Expired | C::NotValidYet)
            | E::InvalidCertificate(C::ExpiredContext { .. })
            | E::InvalidCertificate(C::NotValidYetContext { .. }) => Failure::Expired,
            E::InvalidCertificate(C::Revoked) => Failure::Revoked,
            E::InvalidCertificate(
                C::ApplicationVerificationFailure
                | C::NotValidForName
                | C::NotValidForNameContext { .. },
            ) => Failure::NameNotAllowed,
            E::InvalidCertificate(_) => Failure::BadCertificate,
            E::PeerIncompatible(_) | E::NoApplicationProtocol => Failure::Incompatible,
            E::AlertReceived(_) => Failure::PeerAlert,
            E::InvalidMessage(_)
            | E::InappropriateMessage { .. }
            | E::InappropriateHandshakeMessage { .. } => Failure::NotTls,
            E::PeerMisbehaved(_) => Failure::Incompatible,
            _ => Failure::Io,
        }
    }
}

/// Where the switch shook hands: as the server (a client, a peer's in link,
/// an admin client) or as the client (a node, a peer's out link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Accept,
    Connect,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Accept => "accept",
            Side::Connect => "connect",
        }
    }
}

/// Handshakes of one service (or the admin listener): done, and failed by
/// side and reason.
#[derive(Debug, Default)]
pub struct Handshakes {
    pub accepted: AtomicU64,
    pub connected: AtomicU64,
    failed: [[AtomicU64; Failure::ALL.len()]; 2],
}

impl Handshakes {
    pub fn succeeded(&self, side: Side) {
        match side {
            Side::Accept => &self.accepted,
            Side::Connect => &self.connected,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub fn failed(&self, side: Side, why: Failure) {
        self.failed[side as usize][why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Every (side, reason, count), zeros included: the metric exists before
    /// the first failure.
    pub fn failures(&self) -> Vec<(Side, Failure, u64)> {
        [Side::Accept, Side::Connect]
            .into_iter()
            .flat_map(|side| {
                Failure::ALL.into_iter().map(move |f| {
                    (
                        side,
                        f,
                        self.failed[side as usize][f as usize].load(Ordering::Relaxed),
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_reasons_operators_act_on() {
        let tls = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        assert_eq!(
            Failure::of(&tls(rustls::Error::NoCertificatesPresented)),
            Failure::NoCertificate
        );
        assert_eq!(
            Failure::of(&tls(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))),
            Failure::BadCertificate
        );
        assert_eq!(
            Failure::of(&tls(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure
            ))),
            Failure::NameNotAllowed
        );
        assert_eq!(
            Failure::of(&std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            Failure::Io
        );
    }

    #[test]
    fn counts_are_kept_per_side_and_reason() {
        let h = Handshakes::default();
        h.failed(Side::Accept, Failure::NoCertificate);
        h.failed(Side::Accept, Failure::NoCertificate);
        h.failed(Side::Connect, Failure::Timeout);
        let all = h.failures();
        assert_eq!(all.len(), 2 * Failure::ALL.len());
        assert!(all.contains(&(Side::Accept, Failure::NoCertificate, 2)));
        assert!(all.contains(&(Side::Connect, Failure::Timeout, 1)));
        assert!(all.contains(&(Side::Connect, Failure::NoCertificate, 0)));
    }
}
