//! What the demo shows: a progress line a second from the services'
//! counters, and the summary at the end, with a row per scenario and the
//! verdict (nothing lost, nothing doubled). The scenario itself is in
//! [`super`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{ChannelNode, NODES};
use crate::link::Service;
use crate::route::DeclineReason;
use crate::sim::cups::CupsReport;
use crate::sim::nac::NacReport;

/// The summary's row of what the switch owed: late approvals (by the
/// nodes' own books) reversed and acknowledged, and UnionPay's key resets
/// reaching the key node and answered.
pub(super) fn integrity_row(
    nodes: &[ChannelNode],
    pos: &Service,
    cups: &CupsReport,
) -> ScenarioRow {
    let c = &pos.view().made.counters;
    let late: u64 = nodes.iter().map(ChannelNode::late_approvals).sum();
    let reversed = c.late_reversed.load(Ordering::Relaxed);
    let acked = c.reversals_acknowledged.load(Ordering::Relaxed);
    let at_key_node = nodes.first().map_or(0, ChannelNode::key_resets);
    let elsewhere: u64 = nodes.iter().skip(1).map(ChannelNode::key_resets).sum();
    ScenarioRow {
        label: "integrity",
        // Reversed counts every approval that came after the switch had
        // answered for its node: the nodes' late share, and approvals racing
        // a decline (a node forced offline, a timeout by a hair).
        line: format!(
            "late approvals {late} (nodes' books), approvals after a switch decline reversed {reversed}, acknowledged {acked} | key resets sent {}, at key node 01 {at_key_node} (elsewhere {elsewhere}), answered {}",
            cups.key_resets_sent, cups.key_resets_answered
        ),
        // A late approval not reversed, or a reversal not acknowledged, is
        // money astray.
        lost: late.saturating_sub(reversed) + reversed.saturating_sub(acked),
        doubled: 0,
    }
}

/// Cumulative counters at one instant.
pub(super) struct Snapshot {
    /// Requests routed to each node, both services.
    per_node: [u64; NODES],
    messages: u64,
}

impl Snapshot {
    pub(super) fn take(services: &[&Arc<Service>]) -> Snapshot {
        let mut per_node = [0u64; NODES];
        let mut messages = 0;
        for s in services {
            for (slot, n) in per_node.iter_mut().zip(s.view().pool.nodes()) {
                *slot += n.counters.sent.load(Ordering::Relaxed);
            }
            let c = &s.view().counters;
            messages +=
                c.requests.load(Ordering::Relaxed) + c.peer.node_requests.load(Ordering::Relaxed);
        }
        Snapshot { per_node, messages }
    }
}

pub(super) fn progress_line(
    t: u64,
    last: &Snapshot,
    now: &Snapshot,
    services: &[&Arc<Service>],
) -> String {
    let delta: Vec<u64> = now
        .per_node
        .iter()
        .zip(last.per_node)
        .map(|(a, b)| a - b)
        .collect();
    let total: u64 = delta.iter().sum::<u64>().max(1);
    let share: Vec<String> = delta
        .iter()
        .enumerate()
        .map(|(i, d)| format!("{:02} {:>3}%", i + 1, d * 100 / total))
        .collect();
    let in_flight: usize = services.iter().map(|s| s.in_flight()).sum();
    let declines: u64 = services
        .iter()
        .map(|s| s.view().counters.declined_total())
        .sum();
    format!(
        "t={t:>3}s  {:>6} msg/s  in flight {:>4}  share [{}]  declines {declines}",
        now.messages - last.messages,
        in_flight,
        share.join("  ")
    )
}

/// A scenario's own row in the summary, and what it adds to the verdict.
pub struct ScenarioRow {
    pub label: &'static str,
    pub line: String,
    pub lost: u64,
    pub doubled: u64,
}

/// Prints the summary; true when nothing was lost and nothing doubled.
pub(super) fn summary(
    nodes: &[ChannelNode],
    services: &[&Arc<Service>],
    nac: &NacReport,
    cups: &CupsReport,
    rows: &[ScenarioRow],
) -> bool {
    let [pos, unionpay, ..] = services else {
        return false;
    };
    println!("\n== summary");
    println!("node   POS requests   UnionPay requests   own requests (answered/declined)");
    for (i, n) in nodes.iter().enumerate() {
        let sent = |s: &Service| {
            s.view().pool.nodes()[i]
                .counters
                .sent
                .load(Ordering::Relaxed)
        };
        let own = n.own_requests();
        println!(
            "{:<6} {:>12}   {:>17}   {:>6} ({}/{})",
            n.id,
            sent(pos),
            sent(unionpay),
            own[0],
            own[1],
            own[2]
        );
    }
    println!("\nPOS NAC      {nac}");
    println!(
        "UnionPay     issuer sent {} answered {} declined {} mismatched {} unanswered {} | member requests {} answered {}",
        cups.sent,
        cups.answered,
        cups.declined,
        cups.mismatched,
        cups.unanswered,
        cups.member_requests,
        cups.member_requests_answered
    );
    let own: [u64; 5] = nodes
        .iter()
        .map(ChannelNode::own_requests)
        .fold([0; 5], |mut acc, o| {
            for (a, b) in acc.iter_mut().zip(o) {
                *a += b;
            }
            acc
        });
    println!(
        "nodes' own   sent {} answered {} declined {} unanswered {} foreign {}",
        own[0], own[1], own[2], own[3], own[4]
    );
    for r in rows {
        println!("{:<12} {}", r.label, r.line);
    }
    let reasons: Vec<String> = DeclineReason::ALL
        .iter()
        .map(|&r| {
            let n: u64 = services.iter().map(|s| s.view().counters.declined(r)).sum();
            format!("{} {n}", r.as_str())
        })
        .collect();
    println!("declines     {}", reasons.join(", "));
    let lost = nac.unanswered + cups.unanswered + own[3] + rows.iter().map(|r| r.lost).sum::<u64>();
    let doubled =
        nac.mismatched + cups.mismatched + own[4] + rows.iter().map(|r| r.doubled).sum::<u64>();
    println!("lost = {lost}, answered twice or crossed = {doubled}");
    lost == 0 && doubled == 0
}
