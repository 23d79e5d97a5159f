//! The daily reconciliation report, aggregated in one pass over the day's
//! rows (memory bounded by the number of service/node groups, not rows):
//! exchanges by outcome, switch-made declines by reason, late approvals with
//! their reversal's state, p50/p99 latency.

use std::collections::BTreeMap;

use serde::Serialize;

use super::rows::ReportInput;
use super::saf::UnixMillis;

/// The report for one period, per service and node.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub since: UnixMillis,
    pub until: UnixMillis,
    pub groups: Vec<ReportGroup>,
    /// Exchanges by outcome and hour of the period (index 0: the hour
    /// from `since`), every group together: the chart's series.
    pub by_hour: BTreeMap<String, Vec<u64>>,
}

/// Most hourly buckets a report keeps (a month); a longer period's later
/// hours count in the last.
pub const MAX_HOURS: usize = 31 * 24;

const HOUR_MS: i64 = 3_600_000;

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
    /// Every exchange in time (switch-made answers included).
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    /// The exchanges a node (or the peer) answered in time: a deadline the
    /// switch answered for is not the nodes' latency.
    pub answered_p50_us: Option<u64>,
    pub answered_p99_us: Option<u64>,
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
type Building = (ReportGroup, Latencies);

/// Every exchange's latency, and the node-answered ones'.
struct Latencies {
    all: Option<hdrhistogram::Histogram<u64>>,
    answered: Option<hdrhistogram::Histogram<u64>>,
}

impl Latencies {
    fn new() -> Latencies {
        // 1 us to 1 h, 3 significant digits.
        let h = || hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).ok();
        Latencies {
            all: h(),
            answered: h(),
        }
    }
}

/// p50 and p99 of a histogram that has values.
fn quantiles(h: Option<hdrhistogram::Histogram<u64>>) -> (Option<u64>, Option<u64>) {
    match h.filter(|h| !h.is_empty()) {
        Some(h) => (
            Some(h.value_at_quantile(0.50)),
            Some(h.value_at_quantile(0.99)),
        ),
        None => (None, None),
    }
}

/// Accumulates [`ReportInput`] rows.
pub struct ReportBuilder {
    since: UnixMillis,
    until: UnixMillis,
    /// By service and node.
    groups: BTreeMap<(String, String), Building>,
    by_hour: BTreeMap<String, Vec<u64>>,
    hours: usize,
}

impl ReportBuilder {
    pub fn new(since: UnixMillis, until: UnixMillis) -> Self {
        ReportBuilder {
            since,
            until,
            groups: BTreeMap::new(),
            by_hour: BTreeMap::new(),
            hours: usize::try_from(
                until
                    .saturating_sub(since)
                    .max(1)
                    .saturating_add(HOUR_MS - 1)
                    / HOUR_MS,
            )
            .unwrap_or(MAX_HOURS)
            .clamp(1, MAX_HOURS),
        }
    }

    pub fn add(&mut self, row: ReportInput) {
        let hour = usize::try_from(row.t_in.saturating_sub(self.since).max(0) / HOUR_MS)
            .unwrap_or(usize::MAX)
            .min(self.hours - 1);
        let hours = self.hours;
        self.by_hour
            .entry(row.outcome.clone())
            .or_insert_with(|| vec![0; hours])[hour] += 1;
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
                (group, Latencies::new())
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
        if let Some(us) = row.latency_us
            && !row.late
        {
            let us = u64::try_from(us).unwrap_or(0).max(1);
            if let Some(h) = hist.all.as_mut() {
                let _ = h.record(us);
            }
            // `answered`: a node's (or the peer's) answer in time.
            if row.outcome == "answered"
                && let Some(h) = hist.answered.as_mut()
            {
                let _ = h.record(us);
            }
        }
    }

    pub fn finish(self) -> Report {
        let groups = self
            .groups
            .into_values()
            .map(|(mut g, h)| {
                (g.p50_us, g.p99_us) = quantiles(h.all);
                (g.answered_p50_us, g.answered_p99_us) = quantiles(h.answered);
                g
            })
            .collect();
        Report {
            since: self.since,
            until: self.until,
            groups,
            by_hour: self.by_hour,
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
            t_in: 0,
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

    /// A node answers in 10 ms; the switch declines a share at its 1 s
    /// deadline: the answers' p99 is the node's, not the deadline.
    #[test]
    fn the_answers_latency_leaves_out_the_switchs_own() {
        let mut b = ReportBuilder::new(0, 10);
        for i in 0..100 {
            let mut row = if i % 10 == 0 {
                input(Some("01"), "switch-made", Some("timeout"), false)
            } else {
                input(Some("01"), "answered", None, false)
            };
            row.latency_us = Some(if i % 10 == 0 { 1_000_000 } else { 10_000 });
            b.add(row);
        }
        let r = b.finish();
        let g = &r.groups[0];
        let near = |v: Option<u64>, want: u64| v.is_some_and(|p| p.abs_diff(want) <= want / 100);
        assert!(near(g.answered_p50_us, 10_000), "{g:?}");
        assert!(near(g.answered_p99_us, 10_000), "{g:?}");
        assert!(near(g.p99_us, 1_000_000), "every exchange: {g:?}");
    }

    #[test]
    fn exchanges_count_under_their_hour() {
        let day = 24 * HOUR_MS;
        let mut b = ReportBuilder::new(day, 2 * day);
        for (t, outcome) in [
            (day, "answered"),
            (day + 2 * HOUR_MS + 5, "answered"),
            (2 * day - 1, "late"),
        ] {
            b.add(ReportInput {
                t_in: t,
                ..input(Some("01"), outcome, None, outcome == "late")
            });
        }
        let r = b.finish();
        assert_eq!(r.by_hour["answered"].len(), 24);
        assert_eq!(r.by_hour["answered"][0], 1);
        assert_eq!(r.by_hour["answered"][2], 1);
        assert_eq!(r.by_hour["late"][23], 1);
    }
}
