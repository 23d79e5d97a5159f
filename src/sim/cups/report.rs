//! What the simulated UnionPay counts, and its report.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sim::ledger::{AdviceBook, AdviceReport, CodeCounts, ReversalBook, ReversalReport};
use crate::sim::peer::lock;

/// Counters a test can read while the simulator runs.
#[derive(Debug, Default)]
pub struct CupsSimStats {
    /// Links whose TLS handshake failed.
    pub tls_refused: AtomicU64,
    /// Issuer requests written on an in link.
    pub sent: AtomicU64,
    /// Issuer requests not sent: no live in link, every queue full, or too many
    /// outstanding.
    pub unsent: AtomicU64,
    /// Responses to issuer requests with F39 `00`.
    pub answered: AtomicU64,
    /// Responses to issuer requests with another F39.
    pub declined: AtomicU64,
    /// Responses matching nothing outstanding (unknown, or answered already) or
    /// with the wrong MTI.
    pub mismatched: AtomicU64,
    /// Issuer requests without a response within `timeout`.
    pub unanswered: AtomicU64,
    /// Member requests (not network management) read on out links.
    pub member_requests: AtomicU64,
    /// Member requests whose response was written on an in link.
    pub member_requests_answered: AtomicU64,
    /// Network-management requests (`0820`, `0800`) read on out links.
    pub network_requests: AtomicU64,
    /// Their responses (`0830`, `0810`) written on an in link.
    pub network_answered: AtomicU64,
    /// Responses (to member or network requests) dropped: no live in link, or
    /// every in-link queue full, or too many waiting out their delay.
    pub responses_unsent: AtomicU64,
    /// `0000` frames read on any link.
    pub keepalives_received: AtomicU64,
    /// `0000` frames written on idle in links.
    pub keepalives_sent: AtomicU64,
    /// `0820` echo tests written on an in link.
    pub echo_sent: AtomicU64,
    /// `0830`s read on an out link matching an echo test.
    pub echo_answered: AtomicU64,
    /// Echo tests without an `0830` within `timeout`.
    pub echo_unanswered: AtomicU64,
    /// In-link connections made.
    pub in_links_opened: AtomicU64,
    /// In links live now.
    pub in_links_up: AtomicU64,
    /// Out-link connections accepted (and kept).
    pub out_links_accepted: AtomicU64,
    /// Out links live now.
    pub out_links_up: AtomicU64,
    /// Out links closed at once because too many were open.
    pub out_links_refused: AtomicU64,
    /// Frames that did not parse, or prefixes that could not be trusted.
    pub bad_frames: AtomicU64,
    /// Message frames the switch wrote on an in link (it should only read them).
    pub unexpected_on_in_links: AtomicU64,
    /// Frames read on an out link before its sign-on (`require_sign_on`):
    /// refused, never answered.
    pub unsigned_frames: AtomicU64,
    /// Sign-on 0820s answered (`require_sign_on`).
    pub sign_ons: AtomicU64,
    /// Times every out link was dropped at once (`drop_out_links_every`).
    pub out_link_drops: AtomicU64,
    /// Answers to member requests written on an in link to another host than
    /// the out link the request came on (another switch instance), by
    /// `"from->to"` host pair.
    pub crossed: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Late approvals of member requests and the member's reversals of them.
    pub reversals: ReversalBook,
    /// The member's advices (`0120`/`0220`) read on out links.
    pub member_advices: AdviceBook,
    /// The member's key requests (`0820` F70 `1xx`), by F70.
    pub member_key_requests: CodeCounts,
    /// UnionPay's own advices: sent (first time), repeats sent,
    /// acknowledged, unacknowledged after every repeat, and not sent (no
    /// in link could take one).
    pub advices_sent: AtomicU64,
    pub advice_repeats_sent: AtomicU64,
    pub advices_acknowledged: AtomicU64,
    pub advices_unacknowledged: AtomicU64,
    pub advices_unsent: AtomicU64,
    /// Key resets (`0800` F70 `101`) sent, answered (`0810` on an out link),
    /// unanswered within `timeout`, and the F39s of the answers.
    pub key_resets_sent: AtomicU64,
    pub key_resets_answered: AtomicU64,
    pub key_resets_unanswered: AtomicU64,
    pub key_reset_f39: CodeCounts,
}

/// What the simulated UnionPay saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CupsReport {
    pub sent: u64,
    pub answered: u64,
    pub declined: u64,
    pub mismatched: u64,
    pub unanswered: u64,
    pub unsent: u64,
    pub member_requests: u64,
    pub member_requests_answered: u64,
    pub keepalives_received: u64,
    pub echo_sent: u64,
    pub echo_answered: u64,
    pub in_links_up: u64,
    pub out_links_accepted: u64,
    pub bad_frames: u64,
    pub unsigned_frames: u64,
    pub sign_ons: u64,
    pub out_link_drops: u64,
    /// Member answers that went to another host than their request came
    /// from, by `"from->to"` (see [`CupsSimStats::crossed`]).
    pub crossed: std::collections::BTreeMap<String, u64>,
    pub network_requests: u64,
    pub network_answered: u64,
    pub responses_unsent: u64,
    pub reversals: ReversalReport,
    pub member_advices: AdviceReport,
    pub member_key_requests: std::collections::BTreeMap<String, u64>,
    pub advices_sent: u64,
    pub advice_repeats_sent: u64,
    pub advices_acknowledged: u64,
    pub advices_unacknowledged: u64,
    pub advices_unsent: u64,
    pub key_resets_sent: u64,
    pub key_resets_answered: u64,
    pub key_resets_unanswered: u64,
    pub key_reset_f39: std::collections::BTreeMap<String, u64>,
}

impl CupsReport {
    pub(super) fn from_stats(s: &CupsSimStats) -> CupsReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CupsReport {
            sent: get(&s.sent),
            answered: get(&s.answered),
            declined: get(&s.declined),
            mismatched: get(&s.mismatched),
            unanswered: get(&s.unanswered),
            unsent: get(&s.unsent),
            member_requests: get(&s.member_requests),
            member_requests_answered: get(&s.member_requests_answered),
            keepalives_received: get(&s.keepalives_received),
            echo_sent: get(&s.echo_sent),
            echo_answered: get(&s.echo_answered),
            in_links_up: get(&s.in_links_up),
            out_links_accepted: get(&s.out_links_accepted),
            bad_frames: get(&s.bad_frames),
            unsigned_frames: get(&s.unsigned_frames),
            sign_ons: get(&s.sign_ons),
            out_link_drops: get(&s.out_link_drops),
            crossed: lock(&s.crossed).clone(),
            network_requests: get(&s.network_requests),
            network_answered: get(&s.network_answered),
            responses_unsent: get(&s.responses_unsent),
            reversals: s.reversals.report(),
            member_advices: s.member_advices.report(),
            member_key_requests: s.member_key_requests.snapshot(),
            advices_sent: get(&s.advices_sent),
            advice_repeats_sent: get(&s.advice_repeats_sent),
            advices_acknowledged: get(&s.advices_acknowledged),
            advices_unacknowledged: get(&s.advices_unacknowledged),
            advices_unsent: get(&s.advices_unsent),
            key_resets_sent: get(&s.key_resets_sent),
            key_resets_answered: get(&s.key_resets_answered),
            key_resets_unanswered: get(&s.key_resets_unanswered),
            key_reset_f39: s.key_reset_f39.snapshot(),
        }
    }
}

impl std::fmt::Display for CupsReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} answered {} declined {} mismatched {} unanswered {} unsent {} \
             member_requests {} member_requests_answered {} keepalives_received {} \
             echo_sent {} echo_answered {} in_links_up {} out_links_accepted {} bad_frames {} \
             unsigned_frames {} sign_ons {} | {} | member {} | own advices {} repeats {} \
             acknowledged {} unacknowledged {} unsent {} | key resets {} answered {} unanswered {}",
            self.sent,
            self.answered,
            self.declined,
            self.mismatched,
            self.unanswered,
            self.unsent,
            self.member_requests,
            self.member_requests_answered,
            self.keepalives_received,
            self.echo_sent,
            self.echo_answered,
            self.in_links_up,
            self.out_links_accepted,
            self.bad_frames,
            self.unsigned_frames,
            self.sign_ons,
            self.reversals,
            self.member_advices,
            self.advices_sent,
            self.advice_repeats_sent,
            self.advices_acknowledged,
            self.advices_unacknowledged,
            self.advices_unsent,
            self.key_resets_sent,
            self.key_resets_answered,
            self.key_resets_unanswered,
        )
    }
}
