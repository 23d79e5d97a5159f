//! The journal for people and scripts: rows as a table or CSV, and the
//! daily reconciliation report as a table (JSON comes from serde).

use std::fmt::Write;

use super::params::show_time;
use crate::store::journal::{AdminRow, JournalRow};
use crate::store::journal_report::Report;

fn opt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}

/// The flags of a row, comma-separated (`-` when none).
pub fn flags(r: &JournalRow) -> String {
    let mut f = Vec::new();
    if r.late {
        f.push("late".to_string());
    }
    if let Some(id) = r.reversal_id {
        let state = r.reversal_state.as_deref().unwrap_or("unknown");
        f.push(format!("reversed#{id}:{state}"));
    }
    if r.duplicate {
        f.push("duplicate".into());
    }
    if r.repeat {
        f.push("repeat".into());
    }
    if r.unroutable {
        f.push("unroutable".into());
    }
    if let Some(b) = &r.bad {
        f.push(format!("bad:{b}"));
    }
    if f.is_empty() {
        "-".into()
    } else {
        f.join(",")
    }
}

/// Rows as an aligned table.
pub fn table(rows: &[JournalRow]) -> String {
    let head = [
        "time_in", "service", "node", "link", "mti", "f11", "f37", "f41", "pan", "f4", "f39", "by",
        "reason", "outcome", "ms", "flags",
    ];
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                show_time(r.t_in),
                r.service.clone(),
                opt(&r.node).to_string(),
                r.link.clone(),
                r.mti.clone(),
                opt(&r.f11).to_string(),
                // As received; as sent when none came (the switch's stamp,
                // a node's own request).
                opt(if r.f37_in.is_some() {
                    &r.f37_in
                } else {
                    &r.f37_out
                })
                .to_string(),
                opt(&r.f41).to_string(),
                opt(&r.pan).to_string(),
                opt(&r.f4).to_string(),
                opt(&r.f39).to_string(),
                r.answered_by.clone(),
                opt(&r.reason).to_string(),
                r.outcome.clone(),
                r.latency_us
                    .map_or("-".into(), |us| format!("{:.1}", us as f64 / 1000.0)),
                flags(r),
            ]
        })
        .collect();
    align(&head, &lines)
}

fn align(head: &[&str], lines: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for l in lines {
        for (w, c) in width.iter_mut().zip(l) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let row = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut line = String::new();
        for (c, w) in cells.zip(&width) {
            let _ = write!(line, "{c:<w$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    };
    row(&mut out, &mut head.iter().copied());
    for l in lines {
        row(&mut out, &mut l.iter().map(String::as_str));
    }
    out
}

fn csv_cell(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// Rows as CSV, every column, a header first.
pub fn csv(rows: &[JournalRow]) -> String {
    let mut out = String::from(
        "id,t_in,t_out,service,front,link,node,origin,mti,mti_out,f11,f7,f37_in,f37_out,f41,f42,\
         f32,f33,pan,f4,f49,f39,answered_by,reason,outcome,latency_us,late,duplicate,repeat,\
         unroutable,bad,reversal_id,reversal_state\n",
    );
    let o = |v: &Option<String>| csv_cell(opt(v).trim_start_matches('-'));
    for r in rows {
        let cells = [
            r.id.to_string(),
            show_time(r.t_in),
            show_time(r.t_out),
            csv_cell(&r.service),
            csv_cell(&r.front),
            csv_cell(&r.link),
            o(&r.node),
            r.origin.clone(),
            csv_cell(&r.mti),
            o(&r.mti_out),
            o(&r.f11),
            o(&r.f7),
            o(&r.f37_in),
            o(&r.f37_out),
            o(&r.f41),
            o(&r.f42),
            o(&r.f32),
            o(&r.f33),
            o(&r.pan),
            o(&r.f4),
            o(&r.f49),
            o(&r.f39),
            r.answered_by.clone(),
            o(&r.reason),
            r.outcome.clone(),
            r.latency_us.map_or(String::new(), |v| v.to_string()),
            u8::from(r.late).to_string(),
            u8::from(r.duplicate).to_string(),
            u8::from(r.repeat).to_string(),
            u8::from(r.unroutable).to_string(),
            o(&r.bad),
            r.reversal_id.map_or(String::new(), |v| v.to_string()),
            o(&r.reversal_state),
        ];
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// Admin rows as a table.
pub fn admin_table(rows: &[AdminRow]) -> String {
    let head = ["at", "peer", "action", "status", "outcome"];
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|a| {
            vec![
                show_time(a.at),
                a.peer.clone(),
                a.action.clone(),
                a.status.to_string(),
                a.outcome.clone(),
            ]
        })
        .collect();
    align(&head, &lines)
}

fn counts(map: &std::collections::BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "-".into();
    }
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The report as a table for people.
pub fn report_table(r: &Report) -> String {
    let mut out = format!(
        "journal report {} .. {} (UTC)\n",
        show_time(r.since),
        show_time(r.until)
    );
    if r.groups.is_empty() {
        out.push_str("no exchanges\n");
        return out;
    }
    let head = [
        "service",
        "node",
        "exchanges",
        "by outcome",
        "switch-made by reason",
        "late",
        "reversals",
        "answered p50 ms",
        "answered p99 ms",
        "all p99 ms",
    ];
    let ms = |v: Option<u64>| v.map_or("-".into(), |us| format!("{:.1}", us as f64 / 1000.0));
    let lines: Vec<Vec<String>> = r
        .groups
        .iter()
        .map(|g| {
            let mut rev = counts(&g.late.reversals);
            if g.late.not_reversed > 0 {
                rev = format!("{rev} not_reversed={}", g.late.not_reversed);
            }
            vec![
                g.service.clone(),
                g.node.clone(),
                g.exchanges.to_string(),
                counts(&g.by_outcome),
                counts(&g.by_reason),
                g.late.total.to_string(),
                rev,
                ms(g.answered_p50_us),
                ms(g.answered_p99_us),
                ms(g.p99_us),
            ]
        })
        .collect();
    out.push_str(&align(&head, &lines));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The people's table shows F37 as received, else as sent (a node's
    /// own request, or the switch's stamp on a request that came without).
    #[test]
    fn the_table_shows_f37_as_sent_when_none_came() {
        let row = |f37_in: Option<&str>, f37_out: Option<&str>| JournalRow {
            service: "pos".into(),
            mti: "0200".into(),
            f37_in: f37_in.map(str::to_string),
            f37_out: f37_out.map(str::to_string),
            answered_by: "node".into(),
            outcome: "answered".into(),
            ..JournalRow::default()
        };
        let t = table(&[
            row(None, Some("S12345678901")),
            row(Some("433812000123"), Some("433812000199")),
        ]);
        assert!(t.contains("S12345678901"), "{t}");
        assert!(t.contains("433812000123"), "{t}");
        assert!(!t.contains("433812000199"), "as received wins: {t}");
    }
}
