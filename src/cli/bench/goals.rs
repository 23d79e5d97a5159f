//! The goal lines of `isoswitch bench` (issue 24's bar): each goal the run
//! measured, with its value, the goal, and whether it is met. Read off the
//! summary's `key = median` lines, so that a goal is judged on exactly what
//! the summary prints.

/// Which side of the goal a value must fall on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

/// One goal and what the run measured for it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct GoalLine {
    pub(super) what: String,
    pub(super) measured: f64,
    pub(super) bound: Bound,
}

impl GoalLine {
    fn new(what: impl Into<String>, measured: f64, bound: Bound) -> GoalLine {
        GoalLine {
            what: what.into(),
            measured,
            bound,
        }
    }

    /// A value that is not a number (a ratio over nothing) meets no goal.
    pub(super) fn met(&self) -> bool {
        match self.bound {
            Bound::AtMost(g) => self.measured <= g,
            Bound::AtLeast(g) => self.measured >= g,
        }
    }

    pub(super) fn render(&self) -> String {
        let (sign, goal) = match self.bound {
            Bound::AtMost(g) => ("≤", g),
            Bound::AtLeast(g) => ("≥", g),
        };
        format!(
            "- {}: {} (goal {sign} {}): **{}**",
            self.what,
            trim(self.measured),
            trim(goal),
            if self.met() { "met" } else { "not met" }
        )
    }
}

/// Two decimals, without trailing zeros: 0.9, 1.48, 6, 0.
fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Client counts from which the many-terminals goals apply.
const MANY: usize = 8_000;

/// Every goal the summary `lines` have the figures for, in the order.
pub(super) fn evaluate(lines: &[(String, String)]) -> Vec<GoalLine> {
    let get = |key: &str| -> Option<f64> {
        lines
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.parse().ok())
    };
    // The `@suffix`es of keys starting with `prefix`, in order of appearance.
    let suffixes = |prefix: &str| -> Vec<String> {
        lines
            .iter()
            .filter_map(|(k, _)| k.strip_prefix(prefix))
            .map(str::to_string)
            .collect()
    };
    let mut goals = Vec::new();
    for (q, name) in [("p50", "p50"), ("p99", "p99")] {
        for r in suffixes(&format!("dwell_{q}_us.switch@")) {
            if let (Some(sw), Some(ha)) = (
                get(&format!("dwell_{q}_us.switch@{r}")),
                get(&format!("dwell_{q}_us.haproxy@{r}")),
            ) {
                goals.push(GoalLine::new(
                    format!("time inside the proxy at {r} req/s, {name}, switch ÷ HAProxy"),
                    sw / ha,
                    Bound::AtMost(1.0),
                ));
            }
        }
    }
    for at in suffixes("ratio.cpu_switch_over_haproxy@") {
        if let Some(v) = get(&format!("ratio.cpu_switch_over_haproxy@{at}")) {
            let at = if at == "saturation" {
                at
            } else {
                format!("{at} req/s")
            };
            goals.push(GoalLine::new(
                format!("CPU per message at {at}, switch ÷ HAProxy"),
                v,
                Bound::AtMost(0.9),
            ));
        }
    }
    if let Some(v) = get("ratio.saturation_switch_over_direct_all") {
        goals.push(GoalLine::new(
            "saturation, switch ÷ the cluster without a balancer",
            v,
            Bound::AtLeast(1.0),
        ));
    }
    if let Some(v) = get("errors.all_rows") {
        goals.push(GoalLine::new(
            "requests lost or doubled, all rows",
            v,
            Bound::AtMost(0.0),
        ));
    }
    goals.extend(many_terminals(lines, &get, &suffixes));
    goals
}

fn many_terminals(
    lines: &[(String, String)],
    get: &dyn Fn(&str) -> Option<f64>,
    suffixes: &dyn Fn(&str) -> Vec<String>,
) -> Vec<GoalLine> {
    let mut goals = Vec::new();
    let counts: Vec<usize> = suffixes("clients.cpu_us_per_msg.switch@")
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    let fewest = counts.iter().copied().min();
    let nodes = get("clients.nodes");
    for n in counts.iter().copied().filter(|n| *n >= MANY) {
        if let Some(v) = get(&format!("ratio.clients_cpu_switch_over_haproxy@{n}")) {
            goals.push(GoalLine::new(
                format!("{n} clients: CPU per message, switch ÷ HAProxy"),
                v,
                Bound::AtMost(0.8),
            ));
        }
        if let Some(v) = get(&format!("ratio.clients_rss_switch_over_haproxy@{n}")) {
            goals.push(GoalLine::new(
                format!("{n} clients: RSS, switch ÷ HAProxy"),
                v,
                Bound::AtMost(0.5),
            ));
        }
        if let (Some(c), Some(nodes)) = (
            get(&format!("clients.node_connections.switch@{n}")),
            nodes.filter(|n| *n > 0.0),
        ) {
            goals.push(GoalLine::new(
                format!("{n} clients: the switch's connections per node"),
                c / nodes,
                Bound::AtMost(2.0),
            ));
        }
        if let Some(f) = fewest.filter(|f| *f < n)
            && let (Some(many), Some(few)) = (
                get(&format!("clients.cpu_us_per_msg.switch@{n}")),
                get(&format!("clients.cpu_us_per_msg.switch@{f}")),
            )
        {
            goals.push(GoalLine::new(
                format!("switch CPU per message, {n} clients ÷ {f} clients"),
                many / few,
                Bound::AtMost(1.2),
            ));
        }
    }
    let bad: Vec<f64> = lines
        .iter()
        .filter(|(k, _)| k.starts_with("clients.lost.") || k.starts_with("clients.doubled."))
        .filter_map(|(_, v)| v.parse().ok())
        .collect();
    if !bad.is_empty() {
        goals.push(GoalLine::new(
            "many terminals: requests lost or doubled, all rows",
            bad.iter().sum(),
            Bound::AtMost(0.0),
        ));
    }
    goals
}

/// The goal lines under their heading; nothing when no goal was measured.
pub(super) fn print(lines: &[(String, String)]) {
    let goals = evaluate(lines);
    if goals.is_empty() {
        return;
    }
    let met = goals.iter().filter(|g| g.met()).count();
    println!(
        "\n## Goals (issue 24; medians of this run): {met} of {} met\n",
        goals.len()
    );
    for g in &goals {
        println!("{}", g.render());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_bound_is_met_on_its_edge_and_never_by_nan() {
        assert!(GoalLine::new("x", 0.9, Bound::AtMost(0.9)).met());
        assert!(!GoalLine::new("x", 0.91, Bound::AtMost(0.9)).met());
        assert!(GoalLine::new("x", 1.0, Bound::AtLeast(1.0)).met());
        assert!(!GoalLine::new("x", 0.99, Bound::AtLeast(1.0)).met());
        assert!(!GoalLine::new("x", f64::NAN, Bound::AtMost(1.0)).met());
        assert!(!GoalLine::new("x", f64::NAN, Bound::AtLeast(1.0)).met());
        let r = GoalLine::new("CPU", 1.1, Bound::AtMost(0.9)).render();
        assert_eq!(r, "- CPU: 1.1 (goal ≤ 0.9): **not met**");
        let r = GoalLine::new("lost", 0.0, Bound::AtMost(0.0)).render();
        assert_eq!(r, "- lost: 0 (goal ≤ 0): **met**");
    }

    #[test]
    fn throughput_goals_come_from_the_summary_lines() {
        let l = lines(&[
            ("cpu_us_per_msg.switch@saturation", "14.6"),
            ("ratio.cpu_switch_over_haproxy@saturation", "1.19"),
            ("ratio.cpu_switch_over_haproxy@10000", "0.85"),
            ("ratio.cpu_switch_over_haproxy@30000", "1.10"),
            ("ratio.saturation_switch_over_direct_all", "0.91"),
            ("errors.all_rows", "0"),
            ("dwell_p50_us.switch@10000", "80"),
            ("dwell_p50_us.haproxy@10000", "100"),
            ("dwell_p99_us.switch@10000", "1201"),
            ("dwell_p99_us.haproxy@10000", "1177"),
        ]);
        let g = evaluate(&l);
        let verdicts: Vec<(&str, bool)> = g.iter().map(|g| (g.what.as_str(), g.met())).collect();
        assert_eq!(
            verdicts,
            vec![
                (
                    "time inside the proxy at 10000 req/s, p50, switch ÷ HAProxy",
                    true
                ),
                (
                    "time inside the proxy at 10000 req/s, p99, switch ÷ HAProxy",
                    false
                ),
                ("CPU per message at saturation, switch ÷ HAProxy", false),
                ("CPU per message at 10000 req/s, switch ÷ HAProxy", true),
                ("CPU per message at 30000 req/s, switch ÷ HAProxy", false),
                ("saturation, switch ÷ the cluster without a balancer", false),
                ("requests lost or doubled, all rows", true),
            ]
        );
        assert!((g[0].measured - 0.8).abs() < 1e-9);
    }

    #[test]
    fn many_terminal_goals_apply_from_8000_clients() {
        let l = lines(&[
            ("clients.nodes", "3"),
            ("clients.cpu_us_per_msg.switch@50", "24"),
            ("clients.cpu_us_per_msg.switch@1000", "30"),
            ("clients.cpu_us_per_msg.switch@8000", "28"),
            ("ratio.clients_cpu_switch_over_haproxy@8000", "0.75"),
            ("ratio.clients_rss_switch_over_haproxy@8000", "16.5"),
            ("clients.node_connections.switch@8000", "6"),
            ("clients.lost.switch@8000", "0"),
            ("clients.doubled.switch@8000", "0"),
            ("clients.lost.haproxy@8000", "0"),
            ("clients.doubled.haproxy@8000", "0"),
        ]);
        let g = evaluate(&l);
        let verdicts: Vec<(String, f64, bool)> = g
            .iter()
            .map(|g| {
                (
                    g.what.clone(),
                    (g.measured * 100.0).round() / 100.0,
                    g.met(),
                )
            })
            .collect();
        assert_eq!(
            verdicts,
            vec![
                (
                    "8000 clients: CPU per message, switch ÷ HAProxy".into(),
                    0.75,
                    true
                ),
                ("8000 clients: RSS, switch ÷ HAProxy".into(), 16.5, false),
                (
                    "8000 clients: the switch's connections per node".into(),
                    2.0,
                    true
                ),
                (
                    "switch CPU per message, 8000 clients ÷ 50 clients".into(),
                    1.17,
                    true
                ),
                (
                    "many terminals: requests lost or doubled, all rows".into(),
                    0.0,
                    true
                ),
            ]
        );
        // One doubled answer anywhere fails the line.
        let mut l = l;
        l.push(("clients.doubled.haproxy@50".into(), "1".into()));
        let last = evaluate(&l).pop().unwrap();
        assert!(!last.met(), "{last:?}");
        // Nothing measured, no goal lines.
        assert!(evaluate(&[]).is_empty());
    }
}
