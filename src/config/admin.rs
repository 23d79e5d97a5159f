//! `[admin]`: the admin HTTP listener's keys (docs/config.md): where it
//! listens, its two credentials (`read` and `operate`) and how they rotate,
//! what may go without a token, how many connections it serves and how
//! long each may take, the audit's retention, and the lockout of a peer
//! that keeps presenting wrong tokens.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Reason, duration, invalid, tls};

/// `[admin]`: the admin HTTP listener. See docs/config.md.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Where the admin API listens; loopback by default.
    #[serde(default = "defaults::listen")]
    pub listen: SocketAddr,
    /// A file holding the `operate` token (first line): every endpoint,
    /// changes included. Without it the token comes from the systemd
    /// credential `admin-token`, then `ISOSWITCH_ADMIN_TOKEN`; with none the
    /// switch refuses to start the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// A file holding the `read` token (first line): GET and HEAD only, a
    /// change answers 403. Without it: the credential `admin-read-token`,
    /// then `ISOSWITCH_ADMIN_READ_TOKEN`; with none, there is no read token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_token_file: Option<PathBuf>,
    /// After a reload read a changed token, the previous one still works
    /// this long: time to hand the new one to every client.
    #[serde(default = "defaults::token_rotation_window", with = "duration")]
    pub token_rotation_window: Duration,
    /// Read-only paths served to GET without the token (for probes and
    /// scrapers): only [`AdminConfig::OPENABLE`] can be listed.
    #[serde(default = "defaults::open_paths")]
    pub open_paths: Vec<String>,
    /// Admin connections served at once; past it a connection takes a
    /// probe slot or gets a 503. With `probe_slots`, the admin's share of
    /// the switch's file descriptors.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// Connections one peer address is served at once (at most
    /// `max_connections`); past it, its connections take the probe slots.
    #[serde(default = "defaults::max_connections_per_peer")]
    pub max_connections_per_peer: usize,
    /// Connections held past the caps to answer `/healthz` and `/readyz`
    /// (a 503 to anything else); past them, a 503 at once.
    #[serde(default = "defaults::probe_slots")]
    pub probe_slots: usize,
    /// Time a connection in a probe slot has for its request line and
    /// headers: how long a probe can wait behind slow clients.
    #[serde(default = "defaults::probe_timeout", with = "duration")]
    pub probe_timeout: Duration,
    /// Time a client has to send a request's headers, counted from the
    /// connection's start or the previous answer: also the idle limit of a
    /// kept-alive connection.
    #[serde(default = "defaults::header_timeout", with = "duration")]
    pub header_timeout: Duration,
    /// Time for a whole request: its body, the work, and the client taking
    /// the answer (a client that stops reading is cut after it).
    #[serde(default = "defaults::request_timeout", with = "duration")]
    pub request_timeout: Duration,
    /// Requests on one kept-alive connection; the last answer closes it.
    #[serde(default = "defaults::max_requests_per_connection")]
    pub max_requests_per_connection: usize,
    /// Admin audit rows (changes, refused tokens, reads of card
    /// transactions) older than this are deleted. 400 days by default: PCI
    /// DSS 10.5.1 asks for twelve months, with margin.
    #[serde(default = "defaults::audit_retain", with = "duration")]
    pub audit_retain: Duration,
    /// Refused tokens from one peer address, within `lockout`, before that
    /// peer gets 429 for every request that needs a token, for `lockout`.
    #[serde(default = "defaults::max_refused_tokens")]
    pub max_refused_tokens: u32,
    /// How long a peer past `max_refused_tokens` is locked out; also the
    /// window its refusals are counted in.
    #[serde(default = "defaults::lockout", with = "duration")]
    pub lockout: Duration,
    /// `[admin.tls]`: serve HTTPS (docs/tls.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<tls::TlsServer>,
}

mod defaults {
    use std::time::Duration;

    pub fn listen() -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], 9090))
    }
    pub fn open_paths() -> Vec<String> {
        vec!["/healthz".into(), "/readyz".into(), "/metrics".into()]
    }
    pub fn max_connections() -> usize {
        64
    }
    pub fn max_connections_per_peer() -> usize {
        16
    }
    pub fn probe_slots() -> usize {
        8
    }
    pub fn probe_timeout() -> Duration {
        Duration::from_millis(500)
    }
    pub fn header_timeout() -> Duration {
        Duration::from_secs(5)
    }
    pub fn request_timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn max_requests_per_connection() -> usize {
        100
    }
    pub fn token_rotation_window() -> Duration {
        Duration::from_secs(10 * 60)
    }
    pub fn audit_retain() -> Duration {
        Duration::from_secs(400 * 24 * 3600)
    }
    /// PCI DSS 8.3.4: lock out after not more than 10 invalid attempts...
    pub fn max_refused_tokens() -> u32 {
        10
    }
    /// ...for at least 30 minutes.
    pub fn lockout() -> Duration {
        Duration::from_secs(30 * 60)
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: defaults::listen(),
            token_file: None,
            read_token_file: None,
            token_rotation_window: defaults::token_rotation_window(),
            open_paths: defaults::open_paths(),
            max_connections: defaults::max_connections(),
            max_connections_per_peer: defaults::max_connections_per_peer(),
            probe_slots: defaults::probe_slots(),
            probe_timeout: defaults::probe_timeout(),
            header_timeout: defaults::header_timeout(),
            request_timeout: defaults::request_timeout(),
            max_requests_per_connection: defaults::max_requests_per_connection(),
            audit_retain: defaults::audit_retain(),
            max_refused_tokens: defaults::max_refused_tokens(),
            lockout: defaults::lockout(),
            tls: None,
        }
    }
}

/// The shortest audit retention accepted.
const MIN_AUDIT_RETAIN: Duration = Duration::from_secs(24 * 3600);

impl AdminConfig {
    /// The paths `open_paths` may list: read-only ones. Nothing that changes
    /// the switch can be opened, and even these need the token for anything
    /// but GET.
    pub const OPENABLE: [&'static str; 4] = ["/healthz", "/readyz", "/metrics", "/"];
    /// Connections answered 503 past the caps that are given a moment to
    /// read it before they are closed (holding no probe slot); past these,
    /// they are closed at once.
    pub const LINGERING: usize = 32;

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (i, path) in self.open_paths.iter().enumerate() {
            if !Self::OPENABLE.contains(&path.as_str()) {
                return Err(invalid(
                    format!("admin.open_paths[{i}]"),
                    Reason::NotOpenable {
                        path: path.clone(),
                        openable: Self::OPENABLE.join(", "),
                    },
                ));
            }
        }
        if !(1..=65_536).contains(&self.max_connections) {
            return Err(invalid("admin.max_connections", "must be within 1..=65536"));
        }
        if self.max_connections_per_peer == 0 {
            return Err(invalid("admin.max_connections_per_peer", "must be > 0"));
        }
        if !(1..=1024).contains(&self.probe_slots) {
            return Err(invalid("admin.probe_slots", "must be within 1..=1024"));
        }
        if self.probe_timeout.is_zero() || self.probe_timeout > Duration::from_secs(5) {
            return Err(invalid(
                "admin.probe_timeout",
                "must be > 0 and at most 5s (a probe waits this long behind slow clients)",
            ));
        }
        if self.max_requests_per_connection == 0 {
            return Err(invalid("admin.max_requests_per_connection", "must be > 0"));
        }
        if self.header_timeout.is_zero() {
            return Err(invalid("admin.header_timeout", "must be > 0"));
        }
        if self.request_timeout.is_zero() {
            return Err(invalid("admin.request_timeout", "must be > 0"));
        }
        if self.audit_retain < MIN_AUDIT_RETAIN {
            return Err(invalid(
                "admin.audit_retain",
                "must be at least 1d (PCI DSS 10.5.1 asks for 12 months)",
            ));
        }
        if self.max_refused_tokens == 0 {
            return Err(invalid("admin.max_refused_tokens", "must be > 0"));
        }
        if self.lockout.is_zero() {
            return Err(invalid("admin.lockout", "must be > 0"));
        }
        if self.token_file.is_some() && self.token_file == self.read_token_file {
            return Err(invalid(
                "admin.read_token_file",
                "is admin.token_file: the read and operate tokens must differ",
            ));
        }
        Ok(())
    }
}
