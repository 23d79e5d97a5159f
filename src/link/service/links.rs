//! A service's connections and what admits them: the table the admin API
//! lists, connection IDs, the process's client descriptor budget, capture
//! taps, the drain flag that turns new requests away at shutdown, and the
//! per-peer limits on warnings.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::net::TcpStream;

use crate::capture::{Capture, ConnTap, Opened};
use crate::link::front::admission::budget::ClientBudget;
use crate::link::io::conns::ConnTable;
use crate::link::log_limit::LogLimit;

/// Warnings of one kind about one peer written per second; the rest are
/// counted and summed up in one line.
const LOG_LINES_PER_SECOND: u32 = 5;

/// The connections of one service.
pub struct Links {
    /// Live connections, for the admin API's connection table.
    pub table: Arc<ConnTable>,
    next_conn_id: AtomicU64,
    /// The process's client descriptor budget, shared by every listen front
    /// (set before the service starts; unlimited by default).
    budget: Arc<ClientBudget>,
    /// pcapng capture of this service's connections, when on (set before the
    /// service starts).
    pub capture: Option<Capture>,
    /// Shutting down: new requests are declined, answers still flow.
    draining: AtomicBool,
    /// Rate limits of per-message warnings, per peer.
    pub log_limit: LogLimit,
    /// TLS of the front, the peer links and the node links (set before the
    /// service starts; none by default).
    pub tls: crate::tls::ServiceTls,
}

impl Default for Links {
    fn default() -> Links {
        Links {
            table: Arc::default(),
            next_conn_id: AtomicU64::new(1),
            budget: ClientBudget::unlimited(),
            capture: None,
            draining: AtomicBool::new(false),
            log_limit: LogLimit::new(LOG_LINES_PER_SECOND),
            tls: crate::tls::ServiceTls::default(),
        }
    }
}

impl Links {
    /// A process-unique connection ID.
    pub fn next_conn_id(&self) -> u64 {
        self.next_conn_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Shares the process's client descriptor budget (before the service
    /// starts).
    pub fn set_budget(&mut self, budget: Arc<ClientBudget>) {
        self.budget = budget;
    }

    /// The process's client descriptor budget.
    pub fn budget(&self) -> &Arc<ClientBudget> {
        &self.budget
    }

    /// A capture tap for a new connection, or `None` when this service does
    /// not capture.
    pub fn tap(&self, stream: &TcpStream, opened: Opened) -> Option<ConnTap> {
        self.capture.as_ref()?.tap(stream, opened)
    }

    /// Starts a graceful shutdown: from now on new requests get the `shutdown`
    /// decline at once, while those in flight still get their node's answer.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
