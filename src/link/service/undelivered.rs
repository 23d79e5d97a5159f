//! Approvals the switch cannot show were received, and outcomes it never
//! sees, on the paths that end without a late answer to find: an approval
//! in time its sender never got (queue full, link gone, or written to a
//! client that closed its socket whole), and a OneConnect exchange cut off
//! after its request went out. Each is reversed at its node, as a late
//! approval is (docs/integrity.md).

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;

use super::Service;
use super::owed::Cause;
use crate::config::LateApproval;
use crate::iso8583::Message;
use crate::route::integrity::{self, LateEntry, Said};
use crate::route::{CorrelationKey, DeclineReason};

/// `request` read, when its outcome can move money: an authorization or
/// financial request outside `no_reversal_f3`.
fn moving_money<'s>(svc: &'s Service, request: &Bytes) -> Option<Message<'s>> {
    let msg = Message::parse(svc.spec(), request.clone()).ok()?;
    (integrity::is_approvable(msg.mti())
        && integrity::moves_money(&msg, &svc.spec().integrity().no_reversal_f3))
    .then_some(msg)
}

/// The node approved `request` in time (`answer`), and its sender never got
/// the approval: reversed at that node, as a late approval would be.
/// Returns the late book's entry for it.
fn reverse_undelivered(
    svc: &Service,
    (node, request): (usize, &Bytes),
    answer: &Message<'_>,
    now: Instant,
) -> Option<LateEntry> {
    if !integrity::approves(answer, &svc.made.approval_codes)
        || svc.made.integrity.late_approval != LateApproval::Reverse
    {
        return None;
    }
    moving_money(svc, request)?;
    let Some(to) = svc.owed().toward_node(node) else {
        svc.owed().unreversed(answer, "its node is gone");
        return None;
    };
    if svc.made.saf().is_none() {
        svc.owed()
            .unreversed(answer, "no store (set data_dir or [store])");
        return None;
    }
    let entry = LateEntry::new(
        svc.owed().stamped(request, node),
        node,
        Said::Undelivered,
        now,
    );
    svc.owed()
        .owe_reversal(&entry, to, (Cause::Undelivered, answer), None);
    Some(entry.with_timeout_reversal())
}

/// The node approved `request` in time, but its answer could not be
/// delivered (the client gone, its write queue full): reversed at that
/// node, and remembered so that a repeat of it is not relayed.
pub(super) fn undelivered(
    svc: &Service,
    key: &CorrelationKey,
    sent: (usize, &Bytes),
    response: &Message<'_>,
    now: Instant,
) {
    if let Some(entry) = reverse_undelivered(svc, sent, response, now) {
        svc.made.late.record(*key, entry);
    }
}

/// A OneConnect node's approval in time that its client never got (the
/// client gone, its queue full): reversed at that node (OneConnect
/// dialects echo no usable key: nothing to remember it by).
pub fn oneconnect_undelivered(svc: &Service, request: &Bytes, node: usize, response: &Bytes) {
    if let Ok(answer) = Message::parse(svc.spec(), response.clone()) {
        reverse_undelivered(svc, (node, request), &answer, Instant::now());
    }
}

/// A OneConnect exchange ended without the node's answer after the
/// request went out (its deadline passed, or the connection broke): the
/// host's outcome is unknown, and its late answer will never be read (the
/// connection is closed), so a timeout reversal is the only way the money
/// comes back. Stored to that node, as for any front; the repeat and late
/// books are not used (OneConnect dialects echo no usable key).
pub fn oneconnect_unknown(svc: &Service, request: &Bytes, node: usize, reason: DeclineReason) {
    if !svc.owed().timeout_reversals_on() {
        return;
    }
    let (Some(msg), Some(to)) = (moving_money(svc, request), svc.owed().toward_node(node)) else {
        return;
    };
    let said = Said::Declined(reason);
    let entry = LateEntry::new(
        svc.owed().stamped(request, node),
        node,
        said,
        Instant::now(),
    );
    svc.owed()
        .owe_reversal(&entry, to, (Cause::Timeout(reason), &msg), None);
}

/// How long after an approval was written to a client that had closed its
/// sending side the switch looks for the client's reset: a client that
/// closed the socket whole answers the write with one within a round trip.
pub(super) const RESET_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Approvals waiting for their check at most; past it one is not checked
/// (counted as unchecked).
const UNCERTAIN_MAX: usize = 10_000;

/// An approval written to a client whose reader had seen the end of its
/// stream, to check for the client's reset at `due`.
pub struct Uncertain {
    due: Instant,
    key: CorrelationKey,
    node: usize,
    request: Bytes,
    response: Bytes,
    tx: crate::link::io::direct::LinkTx,
}

/// The node approved in time and the answer was written, but to a client
/// that had closed its sending side: if it closed the socket whole, the
/// approval was never read. Checked at [`RESET_WAIT`] by
/// [`check_uncertain`]; reversed then as [`undelivered`] if the client
/// reset the connection.
pub(super) fn delivered_uncertain(
    svc: &Service,
    key: &CorrelationKey,
    (node, request): (usize, &Bytes),
    response: &Message<'_>,
    tx: crate::link::io::direct::LinkTx,
    now: Instant,
) {
    if !integrity::approves(response, &svc.made.approval_codes) {
        return;
    }
    let mut waiting = svc.made.uncertain.lock().unwrap_or_else(|p| p.into_inner());
    if waiting.len() >= UNCERTAIN_MAX {
        svc.made
            .counters
            .uncertain_unchecked
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    waiting.push(Uncertain {
        due: now + RESET_WAIT,
        key: *key,
        node,
        request: request.clone(),
        response: response.payload().clone(),
        tx,
    });
}

/// The approvals written to closing clients whose check is due: each one
/// whose client reset the connection is reversed as undelivered.
pub(super) fn check_uncertain(svc: &Service, now: Instant) {
    let due: Vec<Uncertain> = {
        let mut waiting = svc.made.uncertain.lock().unwrap_or_else(|p| p.into_inner());
        if waiting.is_empty() {
            return;
        }
        let (due, later) = waiting.drain(..).partition(|u| u.due <= now);
        *waiting = later;
        due
    };
    for u in due {
        if !u.tx.peer_reset() {
            continue;
        }
        if let Ok(response) = Message::parse(svc.spec(), u.response) {
            undelivered(svc, &u.key, (u.node, &u.request), &response, now);
        }
    }
}
