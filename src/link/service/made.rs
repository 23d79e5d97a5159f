//! What the switch says itself rather than relays, and what it owes for it:
//! its network management (sign-on, sign-off, echo tests to nodes and peers,
//! each with a STAN of its own), the books of what it answered for its nodes
//! (late answers, repeats), and the store-and-forward outbox its reversals
//! and acknowledged advices go to.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::config::DuplicateAction;
use crate::config::{IntegrityConfig, ServiceConfig};
use crate::iso8583::{FieldCodes, IsoError, Spec};
use crate::link::front::out_links::NmKind;
use crate::link::netmgmt::NetworkTemplate;
use crate::route::integrity::{DuplicateBook, LateBook, RepeatBook, SafAnswers};
use crate::store::{SafPolicy, Store};

/// The switch's own messages and promises for one service.
pub struct SwitchMade {
    network: NetworkTemplate,
    next_stan: AtomicU64,
    /// `[service.integrity]`, fixed at start.
    pub integrity: IntegrityConfig,
    /// F39 codes that approve: the service's, else the dialect's, packed
    /// once in the spec's F39 encoding (an EBCDIC "00" is `F0 F0`).
    pub approval_codes: FieldCodes,
    /// How a host's answer to an owed message is taken, by its F39.
    pub saf_answers: SafAnswers,
    /// The F70 codes that are the link's own (sign-on, sign-off, echo:
    /// the spec's `[network]` codes, else 001, 002, 301), packed for its
    /// F70. Every other F70 is the institution's and goes to a key node.
    /// None when the dialect has no F70 or says its F70 is no network
    /// management code (`institution_f70 = []`): then the switch answers
    /// every network management message itself.
    pub link_f70: Option<FieldCodes>,
    /// Requests the switch answered for a node (or let expire in silence).
    pub late: LateBook,
    /// Which node each request went to, for its repeats.
    pub repeats: RepeatBook,
    /// What requests are known by for their duplicates, and how their
    /// answers are kept (the correlation table keeps them).
    pub duplicates: DuplicateBook,
    /// Approvals written to clients that had closed their sending side,
    /// waiting to be checked for the client's reset.
    pub(super) uncertain: std::sync::Mutex<Vec<super::undelivered::Uncertain>>,
    /// Where what the switch owes goes; none without a store.
    saf: OnceLock<SafOutbox>,
    pub counters: std::sync::Arc<IntegrityCounters>,
}

/// The durable queue of what the switch owes, as this instance sees it.
pub struct SafOutbox {
    pub store: Store,
    /// This instance's name in the store's leases.
    pub owner: String,
    pub policy: SafPolicy,
    /// Wakes the delivery loop when an entry was stored.
    pub wake: std::sync::Arc<Notify>,
}

/// What the switch did about answers it gave for its nodes.
#[derive(Debug, Default)]
pub struct IntegrityCounters {
    /// Requests timed out in silence (`on_timeout = "silent"`).
    pub silent_timeouts: AtomicU64,
    /// Late approvals a reversal was stored for.
    pub late_reversed: AtomicU64,
    /// Timeout reversals stored: the switch answered for the host with the
    /// outcome unknown (timeout, node lost, shutdown).
    pub timeout_reversals: AtomicU64,
    /// Approvals in time whose answer could not be delivered (the client
    /// gone, its queue full): reversed at the node.
    pub undelivered_reversed: AtomicU64,
    /// Late approvals of requests that move no money (`no_reversal_f3`):
    /// not reversed.
    pub late_not_monetary: AtomicU64,
    /// Late approvals only logged (`late_approval = "log"`).
    pub late_logged: AtomicU64,
    /// Late approvals that could not be reversed: no store, a full store
    /// queue, a store error or a reversal that could not be built (each
    /// logged at ERROR with its masked keys, for reconciliation).
    pub late_unreversed: AtomicU64,
    /// Reversals of late approvals held in memory, offered to the store
    /// until it takes them (a store away or full): what a crash now would
    /// leave to the logs. A gauge: up when offered, down when stored or
    /// given up.
    pub reversals_awaiting_store: AtomicU64,
    /// Late answers that did not approve (nothing to reverse).
    pub late_declines: AtomicU64,
    /// Late answers to a request already reversed.
    pub late_again: AtomicU64,
    /// Timeout reversals cancelled before delivery: the host's late answer
    /// declined their original. Shared with the store task that cancels.
    pub timeout_reversals_cancelled: std::sync::Arc<AtomicU64>,
    /// Reversal advices put on the wire (each 0420 and 0421 sent).
    pub reversals_sent: AtomicU64,
    /// Reversals the host acknowledged (its 0430).
    pub reversals_acknowledged: AtomicU64,
    /// Advices stored and acknowledged by the switch (store-and-forward).
    pub advices_stored: AtomicU64,
    /// Advices a host acknowledged after the switch stored them.
    pub advices_delivered: AtomicU64,
    /// Advices the switch did not answer itself (`advices = "forward"`: no
    /// node, a timeout), or could not store: the sender repeats.
    pub advices_unanswered: AtomicU64,
    /// Advices in `store-and-forward` mode that could not be stored without
    /// sensitive authentication data (PAN only in track data, F55 not
    /// TLV): forwarded to a node instead, never acknowledged by the switch.
    pub advices_unstorable: AtomicU64,
    /// Reversal requests (0400, 0401) from a sender that got no host's
    /// answer: left unanswered by the switch (the sender repeats).
    pub reversals_unanswered: AtomicU64,
    /// Switch-made answers not sent because `switch_made = "silent"`.
    pub switch_made_withheld: AtomicU64,
    /// Repeats (0201) of an original the switch reversed: declined by the
    /// switch, never relayed.
    pub repeats_of_reversed: AtomicU64,
    /// Approvals written to closing clients that could not be checked for
    /// a reset (too many waiting): neither confirmed nor reversed.
    pub uncertain_unchecked: AtomicU64,
    /// Duplicates of an answered request given its first answer again.
    pub duplicates_replayed: AtomicU64,
    /// Duplicates declined 94 (`duplicates = "decline"`, an answer the
    /// switch made, or one no longer held).
    pub duplicates_declined: AtomicU64,
    /// Duplicates and repeats of a request in flight that waited for its
    /// answer.
    pub duplicates_waited: AtomicU64,
    /// Repeats sent to the node that had the original.
    pub repeats_same_node: AtomicU64,
    /// Repeats whose original's node could not take them (declined as no
    /// node, never sent to another).
    pub repeats_node_gone: AtomicU64,
    /// Answers to owed messages that completed them but are flagged for
    /// reconciliation (`saf_reconcile` codes: 25, 94).
    pub saf_answers_reconcile: AtomicU64,
    /// Answers to owed messages that leave them to be tried again
    /// (`saf_retry` codes: 91, 96, MAC and format errors, no F39).
    pub saf_answers_retry: AtomicU64,
    /// Answers to owed messages that refused them: each a dead letter.
    pub saf_answers_dead: AtomicU64,
    /// Delivery attempts of owed messages (first sends and repeats).
    pub saf_sent: AtomicU64,
    /// Owed messages sent as repeats (MTI ending in 1).
    pub saf_repeats: AtomicU64,
}

impl SwitchMade {
    /// Fails when an approval code is not a value of the spec's F39
    /// (`check` says so first, naming the key).
    pub fn new(
        network: NetworkTemplate,
        config: &ServiceConfig,
        spec: &Spec,
    ) -> Result<SwitchMade, IsoError> {
        let integrity = config.integrity.clone();
        let texts = integrity
            .approval_codes
            .as_deref()
            .unwrap_or(&spec.integrity().approval_codes);
        let approval_codes = spec.field_codes(39, texts)?;
        let saf_answers = SafAnswers::of(spec)?;
        let net = spec.network();
        let link_codes = [
            net.sign_on_f70.as_deref().unwrap_or("001"),
            net.sign_off_f70.as_deref().unwrap_or("002"),
            net.echo_f70.as_deref().unwrap_or("301"),
        ];
        let link_f70 = match spec.field(70) {
            Some(_) if !spec.integrity().institution_f70.is_empty() => {
                Some(spec.field_codes(70, &link_codes)?)
            }
            _ => None,
        };
        Ok(SwitchMade {
            network,
            // Each instance starts its STANs somewhere else: two instances
            // behind one address sign on to the same peer, and a sign-on
            // answer that reaches the other instance must not match one of
            // its own (docs/ha.md).
            next_stan: AtomicU64::new(crate::util::rng::entropy_seed() % 999_999),
            late: LateBook::new(integrity.late_window, integrity.late_capacity),
            repeats: RepeatBook::new(integrity.repeat_window, integrity.repeat_capacity),
            duplicates: DuplicateBook::new(
                integrity.duplicate_window,
                integrity.duplicate_capacity,
                match integrity.duplicates {
                    DuplicateAction::Replay => integrity.duplicate_replay_bytes,
                    DuplicateAction::Decline => 0,
                },
            ),
            integrity,
            approval_codes,
            saf_answers,
            link_f70,
            uncertain: std::sync::Mutex::default(),
            saf: OnceLock::new(),
            counters: std::sync::Arc::default(),
        })
    }

    /// A STAN for a switch-made message (1..=999999, then round again).
    pub fn next_stan(&self) -> u32 {
        (self.next_stan.fetch_add(1, Ordering::Relaxed) % 999_999 + 1) as u32
    }

    /// A network-management request (sign-on, sign-off or echo test) from
    /// the service's template, dated now.
    pub fn network_request(&self, spec: &Spec, kind: NmKind, stan: u32) -> Result<Bytes, IsoError> {
        self.network
            .build(spec, kind, stan, std::time::SystemTime::now())
    }

    /// Gives the service its store-and-forward outbox (once, at start).
    pub fn set_saf(&self, outbox: SafOutbox) -> bool {
        self.saf.set(outbox).is_ok()
    }

    pub fn saf(&self) -> Option<&SafOutbox> {
        self.saf.get()
    }

    /// Forgets what is past its window in every book.
    pub fn sweep(&self, now: Instant) {
        self.late.sweep(now);
        self.repeats.sweep(now);
    }
}
