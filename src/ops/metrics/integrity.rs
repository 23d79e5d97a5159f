//! The message path's integrity counters: late approvals by action,
//! reversals and advices, and the reversals held in memory for the store.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::DescriptorEncoder;

use super::{Family, counter, encode_counters, encode_gauges, gauge, label_value};
use crate::link::service::IntegrityCounters;
use crate::ops::control::SwitchHandle;

/// Which of a service's integrity counters a family shows.
type ReadCounter = fn(&IntegrityCounters) -> &AtomicU64;

/// What the switch did about the answers it gave for its nodes: late
/// approvals by action, reversals, advices (counters of the message path).
pub(super) fn encode(enc: &mut DescriptorEncoder, handle: &SwitchHandle) -> std::fmt::Result {
    let mut late = counter(
        "isoswitch_late_approvals",
        "Approvals that came after the switch had answered for the node (declined or let expire), by action: reversed (a reversal stored for delivery), logged (late_approval = \"log\"), unreversed (could not be reversed: no store, store full or failing; logged at ERROR for reconciliation), not_monetary (a balance inquiry and the like, integrity.no_reversal_f3: nothing to reverse). A late approval covered by the request's timeout reversal counts as reversed.",
    );
    let mut single: Vec<(Family<u64>, ReadCounter)> = vec![
        (
            counter(
                "isoswitch_late_declines",
                "Late answers that did not approve: nothing to reverse.",
            ),
            |c| &c.late_declines,
        ),
        (
            counter(
                "isoswitch_timeout_reversals_cancelled",
                "Timeout reversals dropped before delivery: the host's late answer declined their original, so nothing was reversed.",
            ),
            |c| c.timeout_reversals_cancelled.as_ref(),
        ),
        (
            counter(
                "isoswitch_late_answers_after_reversal",
                "Late answers to a request already reversed: not reversed again.",
            ),
            |c| &c.late_again,
        ),
        (
            counter(
                "isoswitch_reversals_sent",
                "Reversal advices sent from the store-and-forward queue (each 0420 and each repeat 0421).",
            ),
            |c| &c.reversals_sent,
        ),
        (
            counter(
                "isoswitch_reversals_acknowledged",
                "Reversals a host or the peer acknowledged (its 0430): the entry is delivered.",
            ),
            |c| &c.reversals_acknowledged,
        ),
        (
            counter(
                "isoswitch_timeout_reversals",
                "Timeout reversals stored: the switch declined or let expire an approvable request whose outcome at the host was unknown (a timeout, a node connection lost, a shutdown); a late answer attaches to it (integrity.timeout_reversal).",
            ),
            |c| &c.timeout_reversals,
        ),
        (
            counter(
                "isoswitch_undelivered_approvals_reversed",
                "Approvals a node sent in time that could not be delivered (the client gone, its write queue full): the terminal never saw them, so each is reversed at that node.",
            ),
            |c| &c.undelivered_reversed,
        ),
        (
            counter(
                "isoswitch_reversal_requests_unanswered",
                "Reversal requests (0400, 0401) that got no host's answer (a timeout, no node, a lost connection): the switch never answers one itself, so the sender repeats it.",
            ),
            |c| &c.reversals_unanswered,
        ),
        (
            counter(
                "isoswitch_repeats_of_reversed",
                "Repeats (0201) of an original the switch had reversed: declined by the switch, never relayed to a host that could approve them.",
            ),
            |c| &c.repeats_of_reversed,
        ),
        (
            counter(
                "isoswitch_uncertain_approvals_unchecked",
                "Approvals written to clients that had closed their sending side but not checked for the client's reset (over 10,000 waiting): neither confirmed read nor reversed; reconcile them from the journal.",
            ),
            |c| &c.uncertain_unchecked,
        ),
        (
            counter(
                "isoswitch_switch_made_withheld",
                "Answers the switch would have made itself but did not send (integrity.switch_made = \"silent\").",
            ),
            |c| &c.switch_made_withheld,
        ),
    ];
    let mut advices = counter(
        "isoswitch_advices",
        "Advices (0120/0220/0420 from clients) by outcome: stored (durably, then acknowledged by the switch; integrity.advices = \"store-and-forward\"), delivered (a host acknowledged a stored one), unanswered (no node or a timeout in forward mode, or the store could not take it: the sender repeats), forwarded (store-and-forward mode, but its PAN is only in track data or its F55 is not TLV: it cannot be stored without sensitive authentication data, so it went to a node as in forward mode).",
    );
    let mut duplicates = counter(
        "isoswitch_duplicates",
        "Requests that were the same as one answered within integrity.duplicate_window (same correlation key and duplicate_fields), none of them sent to a node, by outcome: replayed (the first answer sent again), declined (94: duplicates = \"decline\", the first answer was the switch's or is no longer held), waited (arrived while the first was in flight, a repeat too, and got its answer).",
    );
    let mut forgotten = counter(
        "isoswitch_duplicate_answers_forgotten",
        "Answers kept for duplicates that were forgotten before integrity.duplicate_window ended, or never kept, by reason: full (the table at integrity.duplicate_capacity forgot its oldest), written_over (found written over in the replay ring: the duplicate was declined 94), too_long (over a quarter of a shard's ring: never kept to replay).",
    );
    let mut host_answers = counter(
        "isoswitch_owed_host_answers",
        "Hosts' answers to owed messages (reversals, stored advices) that did not simply complete them, by class of their F39 (the dialect's saf_reconcile / saf_retry codes): reconcile (completed, flagged for reconciliation: 25, 94), retry (tried again: 91, 96, MAC and format errors, no F39), dead (refused: a dead letter at once).",
    );
    for r in handle.services.iter() {
        let s = &r.service;
        let c = &s.view().made.counters;
        for (class, v) in [
            ("reconcile", &c.saf_answers_reconcile),
            ("retry", &c.saf_answers_retry),
            ("dead", &c.saf_answers_dead),
        ] {
            let l = vec![
                ("service", label_value(s.name())),
                ("class", class.to_string()),
            ];
            host_answers.samples.push((l, v.load(Ordering::Relaxed)));
        }
        let sl = || vec![("service", label_value(s.name()))];
        let labelled = |key: &'static str, value: &str| {
            let mut l = sl();
            l.push((key, value.to_string()));
            l
        };
        for (action, v) in [
            ("reversed", &c.late_reversed),
            ("logged", &c.late_logged),
            ("unreversed", &c.late_unreversed),
            ("not_monetary", &c.late_not_monetary),
        ] {
            late.samples
                .push((labelled("action", action), v.load(Ordering::Relaxed)));
        }
        for (outcome, v) in [
            ("replayed", &c.duplicates_replayed),
            ("declined", &c.duplicates_declined),
            ("waited", &c.duplicates_waited),
        ] {
            duplicates
                .samples
                .push((labelled("outcome", outcome), v.load(Ordering::Relaxed)));
        }
        let kept = &s.view().made.duplicates.counters;
        for (reason, v) in [
            ("full", &kept.overflow),
            ("written_over", &kept.overwritten),
            ("too_long", &kept.too_long),
        ] {
            forgotten
                .samples
                .push((labelled("reason", reason), v.load(Ordering::Relaxed)));
        }
        for (outcome, v) in [
            ("stored", &c.advices_stored),
            ("delivered", &c.advices_delivered),
            ("unanswered", &c.advices_unanswered),
            ("forwarded", &c.advices_unstorable),
        ] {
            advices
                .samples
                .push((labelled("outcome", outcome), v.load(Ordering::Relaxed)));
        }
        for (f, read) in &mut single {
            f.samples.push((sl(), read(c).load(Ordering::Relaxed)));
        }
    }
    encode_counters(enc, &late)?;
    for (f, _) in &single {
        encode_counters(enc, f)?;
    }
    encode_counters(enc, &advices)?;
    encode_counters(enc, &duplicates)?;
    encode_counters(enc, &forgotten)?;
    encode_counters(enc, &host_answers)?;
    let mut awaiting = gauge(
        "isoswitch_reversals_awaiting_store",
        "Reversals of late approvals held in memory and offered to the store again until it takes them (the store away or full); each is logged, masked, for reconciliation should the switch die first.",
    );
    for r in handle.services.iter() {
        let s = &r.service;
        let v = s
            .view()
            .made
            .counters
            .reversals_awaiting_store
            .load(Ordering::Relaxed);
        awaiting
            .samples
            .push((vec![("service", label_value(s.name()))], v as f64));
    }
    encode_gauges(enc, &awaiting)
}
