//! Rate limits for per-message warnings: one client sending garbage must not
//! flood the log (and the disk, and the path that writes it). Per kind of
//! event and per peer, the first `LogLimit::per_second` lines of a second
//! are written; the rest are counted, and one line says how many were
//! suppressed when the second is over.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a rate-limited line is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogKind {
    /// A request that failed ingress validation.
    BadMessage,
    /// A frame whose length prefix could not be trusted.
    BadFrame,
    /// A request declined because its client is over its in-flight share.
    OverShare,
    /// A response that matched no request, or came late.
    StrayResponse,
    /// An answer that could not be delivered (client gone or not reading).
    Undeliverable,
    /// A node connection attempt that failed.
    NodeConnect,
    /// A client refused at accept.
    Refused,
    /// An admin request with a missing or wrong token.
    AdminToken,
    /// An admin connection that could not be accepted (e.g. out of files).
    AdminAccept,
    /// An accept that failed (out of descriptors, most often).
    AcceptFailed,
    /// A peer's in link refused (not allowed, or one too many).
    InLinkRefused,
    /// A TLS handshake that failed.
    TlsHandshake,
}

impl LogKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LogKind::BadMessage => "bad message",
            LogKind::BadFrame => "bad frame",
            LogKind::OverShare => "over in-flight share",
            LogKind::StrayResponse => "stray response",
            LogKind::Undeliverable => "undeliverable answer",
            LogKind::NodeConnect => "node connect failure",
            LogKind::Refused => "client refused",
            LogKind::AdminToken => "admin token refused",
            LogKind::AdminAccept => "admin accept failure",
            LogKind::AcceptFailed => "accept failed",
            LogKind::InLinkRefused => "in link refused",
            LogKind::TlsHandshake => "TLS handshake failure",
        }
    }
}

/// Who a line is about: a client IP, or a node of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogPeer {
    Ip(IpAddr),
    Node(usize),
    /// The service as a whole (e.g. a simplex peer's links).
    Service,
}

#[derive(Debug)]
struct Window {
    start: Instant,
    written: u32,
    suppressed: u64,
}

/// Per kind and peer, at most `per_second` lines a second.
#[derive(Debug)]
pub struct LogLimit {
    per_second: u32,
    windows: Mutex<HashMap<(LogKind, LogPeer), Window>>,
}

/// Peers tracked at once; past it, quiet entries are forgotten first.
const MAX_TRACKED: usize = 4096;
const SECOND: Duration = Duration::from_secs(1);

impl LogLimit {
    pub fn new(per_second: u32) -> LogLimit {
        LogLimit {
            per_second,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Whether to write this line. When a new second starts for this kind and
    /// peer after lines were suppressed, says how many first.
    pub fn allow(&self, kind: LogKind, peer: LogPeer, now: Instant) -> bool {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.len() >= MAX_TRACKED && !windows.contains_key(&(kind, peer)) {
            windows.retain(|_, w| now.saturating_duration_since(w.start) < SECOND);
            if windows.len() >= MAX_TRACKED {
                // Under a storm from many peers at once: keep memory bounded
                // and log nothing new until the table drains.
                return false;
            }
        }
        let w = windows.entry((kind, peer)).or_insert(Window {
            start: now,
            written: 0,
            suppressed: 0,
        });
        if now.saturating_duration_since(w.start) >= SECOND {
            report_suppressed(kind, peer, w.suppressed);
            *w = Window {
                start: now,
                written: 0,
                suppressed: 0,
            };
        }
        if w.written < self.per_second {
            w.written += 1;
            true
        } else {
            w.suppressed += 1;
            false
        }
    }

    /// Reports what was suppressed in windows that are over, and forgets
    /// them. Called about once a second by the service's sweeper, so that the
    /// count of a burst that stopped still reaches the log.
    pub fn flush(&self, now: Instant) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows.retain(|&(kind, peer), w| {
            if now.saturating_duration_since(w.start) < SECOND {
                return true;
            }
            report_suppressed(kind, peer, w.suppressed);
            false
        });
    }
}

fn report_suppressed(kind: LogKind, peer: LogPeer, suppressed: u64) {
    if suppressed > 0 {
        tracing::warn!(kind = kind.as_str(), peer = ?peer, suppressed, "suppressed {suppressed} similar lines in the last second");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_lines_pass_then_the_rest_is_counted_per_peer_and_kind() {
        let limit = LogLimit::new(3);
        let t0 = Instant::now();
        let a = LogPeer::Ip("10.0.0.1".parse().unwrap());
        let b = LogPeer::Ip("10.0.0.2".parse().unwrap());
        let passed = (0..100)
            .filter(|_| limit.allow(LogKind::BadMessage, a, t0))
            .count();
        assert_eq!(passed, 3);
        assert!(limit.allow(LogKind::BadMessage, b, t0), "another peer");
        assert!(limit.allow(LogKind::BadFrame, a, t0), "another kind");
        let later = t0 + SECOND;
        assert!(limit.allow(LogKind::BadMessage, a, later), "a new second");
        limit.flush(later + SECOND);
        assert!(
            limit.windows.lock().unwrap().is_empty(),
            "flushed windows are forgotten"
        );
    }

    #[test]
    fn the_table_stays_bounded() {
        let limit = LogLimit::new(1);
        let t0 = Instant::now();
        for i in 0..(MAX_TRACKED + 100) {
            let _ = limit.allow(LogKind::BadMessage, LogPeer::Node(i), t0);
        }
        assert!(limit.windows.lock().unwrap().len() <= MAX_TRACKED);
        // Once the old windows are over, new peers are tracked again.
        assert!(limit.allow(LogKind::BadMessage, LogPeer::Node(usize::MAX), t0 + SECOND));
    }
}
