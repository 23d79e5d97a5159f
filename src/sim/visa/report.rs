//! What the simulated VISA counts, and its report.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sim::ledger::{CodeCounts, ReversalBook, ReversalReport};

/// Counters a test can read while the simulator runs.
#[derive(Debug, Default)]
pub struct VisaSimStats {
    /// Issuer requests written on a link.
    pub issuer_sent: AtomicU64,
    /// Their answers with F39 `00`, and with another F39.
    pub issuer_approved: AtomicU64,
    pub issuer_declined: AtomicU64,
    /// Issuer requests without an answer within `timeout`.
    pub issuer_unanswered: AtomicU64,
    /// Answers found by F7 + F11 whose MTI, F4, F32, F37 or F41 differ.
    pub wrong_key: AtomicU64,
    /// A second answer to a request already answered.
    pub doubled: AtomicU64,
    /// An answer to a request that had expired.
    pub late: AtomicU64,
    /// An answer matching nothing ever sent.
    pub unknown: AtomicU64,
    /// Requests from the bank's nodes (not network management).
    pub bank_requests: AtomicU64,
    /// Their answers written, and how many of those on another link.
    pub bank_answered: AtomicU64,
    pub bank_answered_on_other_link: AtomicU64,
    /// Answers to the bank that found no link up and waited for one.
    pub answers_parked: AtomicU64,
    /// Answers to the bank dropped: every queue full, too many parked, or
    /// parked longer than `timeout`.
    pub answers_unsent: AtomicU64,
    /// The bank's `0800`s, by kind, and the `0810`s written for them.
    pub network_requests: AtomicU64,
    pub bank_sign_ons: AtomicU64,
    pub bank_sign_offs: AtomicU64,
    pub bank_echoes: AtomicU64,
    pub network_answered: AtomicU64,
    /// The bank's `0800`s read on a link being dropped with no link up: left
    /// unanswered, as the exchange belongs to a link that is gone.
    pub network_link_gone: AtomicU64,
    /// Our sign-ons written, approved, and answered with another F39.
    pub sign_ons_sent: AtomicU64,
    pub sign_ons_approved: AtomicU64,
    pub sign_ons_refused: AtomicU64,
    /// Our echo tests written, answered, and unanswered within `timeout`.
    pub echo_sent: AtomicU64,
    pub echo_answered: AtomicU64,
    pub echo_unanswered: AtomicU64,
    pub keepalives_received: AtomicU64,
    pub keepalives_sent: AtomicU64,
    /// Links opened (dialled or accepted), up now, refused at accept, and
    /// closed on demand ([`VisaSim::close_links`]).
    pub links_opened: AtomicU64,
    pub links_up: AtomicU64,
    pub links_refused: AtomicU64,
    pub links_dropped: AtomicU64,
    /// Frames that did not parse, prefixes that could not be trusted, stalled
    /// partial frames.
    pub bad_frames: AtomicU64,
    /// Reject messages (header bit 0x80) received.
    pub rejects: AtomicU64,
    /// Late approvals of the bank's requests and the bank's reversals of them.
    pub reversals: ReversalBook,
    /// Our key exchanges written, answered (by F39) and unanswered.
    pub key_resets_sent: AtomicU64,
    pub key_resets_answered: AtomicU64,
    pub key_resets_unanswered: AtomicU64,
    pub key_reset_f39: CodeCounts,
    /// The bank's own key requests (F70 1xx), by F70.
    pub bank_key_requests: CodeCounts,
}

/// What the simulated VISA saw. `lost` and `doubled` are the verdict: a run is
/// clean when both are zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VisaReport {
    pub issuer_sent: u64,
    pub issuer_approved: u64,
    pub issuer_declined: u64,
    pub issuer_unanswered: u64,
    pub wrong_key: u64,
    pub doubled: u64,
    pub late: u64,
    pub unknown: u64,
    pub bank_requests: u64,
    pub bank_answered: u64,
    pub bank_answered_on_other_link: u64,
    pub answers_parked: u64,
    pub answers_unsent: u64,
    pub network_requests: u64,
    pub network_answered: u64,
    pub sign_ons_sent: u64,
    pub sign_ons_approved: u64,
    pub echo_sent: u64,
    pub echo_answered: u64,
    pub keepalives_received: u64,
    pub links_opened: u64,
    pub links_up: u64,
    pub links_dropped: u64,
    pub bad_frames: u64,
    pub rejects: u64,
    /// Bank requests per F37 stamp (the node ID the switch wrote).
    pub stamps: BTreeMap<String, u64>,
    pub reversals: ReversalReport,
    pub key_resets_sent: u64,
    pub key_resets_answered: u64,
    pub key_resets_unanswered: u64,
    pub key_reset_f39: BTreeMap<String, u64>,
    pub bank_key_requests: BTreeMap<String, u64>,
}

impl VisaReport {
    pub(super) fn from_stats(s: &VisaSimStats, stamps: BTreeMap<String, u64>) -> VisaReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VisaReport {
            issuer_sent: get(&s.issuer_sent),
            issuer_approved: get(&s.issuer_approved),
            issuer_declined: get(&s.issuer_declined),
            issuer_unanswered: get(&s.issuer_unanswered),
            wrong_key: get(&s.wrong_key),
            doubled: get(&s.doubled),
            late: get(&s.late),
            unknown: get(&s.unknown),
            bank_requests: get(&s.bank_requests),
            bank_answered: get(&s.bank_answered),
            bank_answered_on_other_link: get(&s.bank_answered_on_other_link),
            answers_parked: get(&s.answers_parked),
            answers_unsent: get(&s.answers_unsent),
            network_requests: get(&s.network_requests),
            network_answered: get(&s.network_answered),
            sign_ons_sent: get(&s.sign_ons_sent),
            sign_ons_approved: get(&s.sign_ons_approved),
            echo_sent: get(&s.echo_sent),
            echo_answered: get(&s.echo_answered),
            keepalives_received: get(&s.keepalives_received),
            links_opened: get(&s.links_opened),
            links_up: get(&s.links_up),
            links_dropped: get(&s.links_dropped),
            bad_frames: get(&s.bad_frames),
            rejects: get(&s.rejects),
            stamps,
            reversals: s.reversals.report(),
            key_resets_sent: get(&s.key_resets_sent),
            key_resets_answered: get(&s.key_resets_answered),
            key_resets_unanswered: get(&s.key_resets_unanswered),
            key_reset_f39: s.key_reset_f39.snapshot(),
            bank_key_requests: s.bank_key_requests.snapshot(),
        }
    }

    /// Issuer requests and key exchanges that got no answer.
    pub fn lost(&self) -> u64 {
        self.issuer_unanswered + self.key_resets_unanswered
    }

    /// Answers that should not have come: second, crossed (wrong key) or
    /// matching nothing sent.
    pub fn doubled_or_crossed(&self) -> u64 {
        self.doubled + self.wrong_key + self.unknown
    }

    /// Nothing lost, nothing doubled or crossed.
    pub fn is_clean(&self) -> bool {
        self.lost() == 0 && self.doubled_or_crossed() == 0
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

impl std::fmt::Display for VisaReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "issuer sent {} approved {} declined {} unanswered {} wrong_key {} doubled {} late {} unknown {} \
             | bank requests {} answered {} (on another link {}) parked {} unsent {} \
             | network {} answered {} | sign-ons {}/{} echo {}/{} \
             | links opened {} up {} dropped {} | bad_frames {} rejects {}",
            self.issuer_sent,
            self.issuer_approved,
            self.issuer_declined,
            self.issuer_unanswered,
            self.wrong_key,
            self.doubled,
            self.late,
            self.unknown,
            self.bank_requests,
            self.bank_answered,
            self.bank_answered_on_other_link,
            self.answers_parked,
            self.answers_unsent,
            self.network_requests,
            self.network_answered,
            self.sign_ons_approved,
            self.sign_ons_sent,
            self.echo_answered,
            self.echo_sent,
            self.links_opened,
            self.links_up,
            self.links_dropped,
            self.bad_frames,
            self.rejects,
        )?;
        if !self.stamps.is_empty() {
            let s: Vec<String> = self
                .stamps
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            write!(f, " | stamps {}", s.join(" "))?;
        }
        if self.key_resets_sent > 0 {
            write!(
                f,
                " | key exchanges {}/{} {:?}",
                self.key_resets_answered, self.key_resets_sent, self.key_reset_f39
            )?;
        }
        if !self.bank_key_requests.is_empty() {
            write!(f, " | bank key requests {:?}", self.bank_key_requests)?;
        }
        let r = &self.reversals;
        if r.late_approvals + r.received + r.repeats > 0 {
            write!(
                f,
                " | late approvals {} reversals {}+{} repeats, chains {} (never reversed {})",
                r.late_approvals, r.received, r.repeats, r.chains, r.late_never_reversed
            )?;
        }
        Ok(())
    }
}
