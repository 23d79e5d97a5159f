//! The daily reconciliation report, aggregated in one pass over the day's
//! rows (memory bounded by the number of service/node groups, not rows):
//! exchanges by outcome, switch-made declines by reason, late approvals with
//! their reversal's state, p50/p99 latency.

use std::collections::BTreeMap;

use serde::Serialize;

use super::journal::ReportInput;
use super::saf::UnixMillis;

/// The report for one period, per service and node.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub since: UnixMillis,
    pub until: UnixMillis,
    pub groups: Vec<ReportGroup>,
}

/// One service and node (`-`: none, a request no node took).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReportGroup {
    pub service: String,
    pub node: String,
    pub exchanges: u64,
    pub by_outcome: BTreeMap<String, u64>,
    /// Switch-made answers (and unanswered requests) by reason.
    pub by_reason: BTreeMap<String, u64>,
    pub late: LateSummary,
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
}

/// Late answers and what became of their reversals.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LateSummary {
    pub total: u64,
    /// With a reversal stored, by the reversal's state (`delivered`: the
    /// host acknowledged it).
    pub reversals: BTreeMap<String, u64>,
    /// Late answers with no reversal (declines, `late_approval = "log"`, a
    /// reversal that could not be stored).
    pub not_reversed: u64,
}

/// A group as it accumulates: its counts and its latencies.
type Building = (ReportGroup, Option<hdrhistogram::Histogram<u64>>);

/// Accumulates [`ReportInput`] rows.
pub struct ReportBuilder {
    since: UnixMillis,
    until: UnixMillis,
    /// By service and node.
    groups: BTreeMap<(String, String), Building>,
}

impl ReportBuilder {
    pub fn new(since: UnixMillis, until: UnixMillis) -> Self {
        ReportBuilder {
            since,
            until,
            groups: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, row: ReportInput) {
        let node = row.node.unwrap_or_else(|| "-".to_string());
        let (g, hist) = self
            .groups
            .entry((row.service.clone(), node.clone()))
            .or_insert_with(|| {
                let group = ReportGroup {
                    service: row.service.clone(),
                    node,
                    ..ReportGroup::default()
                };
                // 1 us to 1 h, 3 significant digits.
                (
                    group,
                    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).ok(),
                )
            });
        g.exchanges += 1;
        *g.by_outcome.entry(row.outcome.clone()).or_default() += 1;
        if row.outcome != "answered" && !row.late {
            let reason = row.reason.unwrap_or_else(|| row.outcome.clone());
            *g.by_reason.entry(reason).or_default() += 1;
        }
        if row.late {
            g.late.total += 1;
            match (row.reversal_id, row.reversal_state) {
                (Some(_), Some(state)) => *g.late.reversals.entry(state).or_default() += 1,
                // The SAF record is gone (retention) or not visible.
                (Some(_), None) => *g.late.reversals.entry("unknown".into()).or_default() += 1,
                (None, _) => g.late.not_reversed += 1,
            }
        }
        if let (Some(h), Some(us)) = (hist.as_mut(), row.latency_us)
            && !row.late
        {
            let _ = h.record(u64::try_from(us).unwrap_or(0).max(1));
        }
    }

    pub fn finish(self) -> Report {
        let groups = self
            .groups
            .into_values()
            .map(|(mut g, h)| {
                if let Some(h) = h.filter(|h| !h.is_empty()) {
                    g.p50_us = Some(h.value_at_quantile(0.50));
                    g.p99_us = Some(h.value_at_quantile(0.99));
                }
                g
            })
            .collect();
        Report {
            since: self.since,
            until: self.until,
            groups,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(node: Option<&str>, outcome: &str, reason: Option<&str>, late: bool) -> ReportInput {
        ReportInput {
            service: "pos".into(),
            node: node.map(str::to_string),
            outcome: outcome.into(),
            reason: reason.map(str::to_string),
            late,
            reversal_id: late.then_some(7),
            reversal_state: late.then(|| "delivered".to_string()),
            latency_us: Some(1_000),
        }
    }

    #[test]
    fn groups_count_outcomes_reasons_and_reversals() {
        let mut b = ReportBuilder::new(0, 10);
        b.add(input(Some("01"), "answered", None, false));
        b.add(input(Some("01"), "switch-made", Some("timeout"), false));
        b.add(input(Some("01"), "late", None, true));
        b.add(input(None, "unroutable", Some("no_healthy_node"), false));
        let r = b.finish();
        assert_eq!(r.groups.len(), 2);
        let g = r.groups.iter().find(|g| g.node == "01").expect("node 01");
        assert_eq!(g.exchanges, 3);
        assert_eq!(g.by_outcome["switch-made"], 1);
        assert_eq!(g.by_reason["timeout"], 1);
        assert_eq!(g.late.reversals["delivered"], 1);
        assert!(g.p50_us.is_some_and(|p| (995..=1005).contains(&p)));
    }
}
