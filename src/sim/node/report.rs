//! What the node counts ([`NodeSimStats`], read by tests while it runs) and
//! how it prints them on exit ([`summary`], [`summary_json`]): the node's
//! bookkeeping, apart from how it answers.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::sim::ledger::{AdviceBook, CodeCounts, ReversalBook};

/// Counters a test can read while the node runs.
#[derive(Debug, Default)]
pub struct NodeSimStats {
    /// Connections accepted over the run.
    pub connections: AtomicU64,
    /// Connections whose TLS handshake failed.
    pub tls_refused: AtomicU64,
    /// Connections open now, and the most open at once.
    pub held: AtomicU64,
    pub peak_held: AtomicU64,
    /// Requests (network management among them; reversals and advices are
    /// in their own books), those answered, and those left unanswered
    /// (`fail_rate`, or any answer past the node's capacity).
    pub requests: AtomicU64,
    pub answered: AtomicU64,
    pub unanswered: AtomicU64,
    pub bad: AtomicU64,
    /// Node-originated requests sent.
    pub originated: AtomicU64,
    /// Responses to them with F39 00, and with another F39.
    pub originated_answered: AtomicU64,
    pub originated_declined: AtomicU64,
    /// Responses that match no request this node has outstanding (another
    /// node's, or a second answer).
    pub foreign_responses: AtomicU64,
    /// Node-originated requests unanswered within their timeout.
    pub originated_unanswered: AtomicU64,
    /// Responses to node-originated requests that came back on another
    /// connection than their request left on (behind F37 stamping, often
    /// another switch instance's): matched by STAN all the same.
    pub originated_answered_elsewhere: AtomicU64,
    /// Late approvals and the reversals that came for them, per chain.
    pub reversals: ReversalBook,
    /// Advices acknowledged, their repeats and duplicates.
    pub advices: AdviceBook,
    /// Key-management requests received (network management with F70
    /// `1xx`), by F70; answered `0810` / `0830` F39 `00` like any other.
    pub key_resets: CodeCounts,
    /// Key requests this node sent ([`KeyRequests`]), the answers that came
    /// back to it, and those that never came.
    pub key_requests_sent: AtomicU64,
    pub key_requests_answered: AtomicU64,
    pub key_requests_unanswered: AtomicU64,
    /// Requests with a repeat MTI (`0101`, `0201`, `0401`), and of those the
    /// repeats of a request the node had already answered.
    pub repeat_requests: AtomicU64,
    pub repeats_of_answered: AtomicU64,
    /// Terminals' reversal requests (0400, 0401).
    pub terminal_reversals: AtomicU64,
    /// ...whose original this node answered.
    pub terminal_reversals_of_answered: AtomicU64,
    /// Requests declined late on purpose (`late_declines`).
    pub declined_late: AtomicU64,
    /// Reversals (0420) of an advice (0220 / 0120) that came before any
    /// message of that advice: delivered out of order.
    pub reversals_before_their_advice: AtomicU64,
}

/// One line of a node's counters, as `sim node` prints them on exit.
pub fn summary(s: &NodeSimStats) -> String {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    format!(
        "connections {} held {} peak {} requests {} answered {} unanswered {} bad {} | originated {} answered {} declined {} unanswered {} foreign {} elsewhere {} | {} | {} | key resets {:?} key requests {}/{} unanswered {} | repeats {} of answered {}",
        get(&s.connections),
        get(&s.held),
        get(&s.peak_held),
        get(&s.requests),
        get(&s.answered),
        get(&s.unanswered),
        get(&s.bad),
        get(&s.originated),
        get(&s.originated_answered),
        get(&s.originated_declined),
        get(&s.originated_unanswered),
        get(&s.foreign_responses),
        get(&s.originated_answered_elsewhere),
        s.reversals.report(),
        s.advices.report(),
        s.key_resets.snapshot(),
        get(&s.key_requests_answered),
        get(&s.key_requests_sent),
        get(&s.key_requests_unanswered),
        get(&s.repeat_requests),
        get(&s.repeats_of_answered),
    )
}

/// [`summary`] as one JSON object.
pub fn summary_json(s: &NodeSimStats) -> String {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    serde_json::json!({
        "connections": get(&s.connections),
        "requests": get(&s.requests),
        "answered": get(&s.answered),
        "unanswered": get(&s.unanswered),
        "bad": get(&s.bad),
        "originated": get(&s.originated),
        "originated_answered": get(&s.originated_answered),
        "originated_declined": get(&s.originated_declined),
        "originated_unanswered": get(&s.originated_unanswered),
        "foreign_responses": get(&s.foreign_responses),
        "originated_answered_elsewhere": get(&s.originated_answered_elsewhere),
        "reversals": s.reversals.report(),
        "advices": s.advices.report(),
        "key_resets": s.key_resets.snapshot(),
        "key_requests": {
            "sent": get(&s.key_requests_sent),
            "answered": get(&s.key_requests_answered),
            "unanswered": get(&s.key_requests_unanswered),
        },
        "repeat_requests": get(&s.repeat_requests),
        "repeats_of_answered": get(&s.repeats_of_answered),
        "terminal_reversals": get(&s.terminal_reversals),
        "terminal_reversals_of_answered": get(&s.terminal_reversals_of_answered),
        "reversals_before_their_advice": get(&s.reversals_before_their_advice),
        "declined_late": get(&s.declined_late),
    })
    .to_string()
}
