//! `GET /`: one small server-rendered status page (services, nodes, links and
//! their counters) that reloads itself every two seconds. No script.

use std::fmt::Write;

use super::status::Status;
use crate::journal::params::show_time;
use crate::store::journal::JournalRow;

/// The page for `status`, with the journal's latest exchanges (masked)
/// when the caller presented a token (`None`: a note says they need it).
pub fn render(status: &Status, latest: Option<&[JournalRow]>) -> String {
    let mut h = String::with_capacity(4096);
    h.push_str(concat!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"refresh\" content=\"2\"><title>isoswitch</title><style>",
        "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}",
        "table{border-collapse:collapse;margin:.5em 0 1.5em}",
        "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}",
        "th:first-child,td:first-child{text-align:left}",
        ".up{background:#dfd}.draining{background:#ffd}.disabled,.removed{background:#ddd}",
        ".down,.ejected{background:#fdd}",
        "</style></head><body><h1>isoswitch</h1>"
    ));
    let _ = write!(h, "<p>task restarts: {}</p>", status.restarts);
    for s in &status.services {
        let declined: u64 = s.declined.values().sum();
        let _ = write!(
            h,
            "<h2 id=\"svc-{n}\">{n}</h2><p>{front} front on {addr}: {req} requests, {ans} answered, \
             {declined} declined, {inf} in flight, {late} late, {cl} clients</p>",
            n = esc(&s.name),
            front = esc(&s.front),
            addr = esc(&s.front_address),
            req = s.requests,
            ans = s.answered,
            inf = s.in_flight,
            late = s.late_responses,
            cl = s.clients,
        );
        if let Some(l) = &s.links {
            let _ = write!(
                h,
                "<p>links: {} of {} up, {} signed on, {} in links</p>",
                l.up, l.links, l.signed_on, l.in_links
            );
        }
        h.push_str(
            "<table><tr><th>node</th><th>address</th><th>state</th><th>weight</th>\
             <th>conns</th><th>in flight</th><th>sent</th><th>answered</th><th>failed</th>\
             <th>latency ms</th></tr>",
        );
        for n in &s.nodes {
            let _ = write!(
                h,
                "<tr class=\"{st}\" data-node=\"{id}\"><td>{id}</td><td>{addr}</td>\
                 <td class=\"state\">{st}</td><td>{ew}/{w}</td><td>{c}</td><td>{inf}</td>\
                 <td>{sent}</td><td>{ans}</td><td>{failed}</td><td>{lat:.1}</td></tr>",
                st = esc(&n.state),
                id = esc(&n.id),
                addr = esc(&n.address),
                ew = n.effective_weight,
                w = n.weight,
                c = n.connections,
                inf = n.in_flight,
                sent = n.sent,
                ans = n.answered,
                failed = n.failed,
                lat = n.latency_ewma_ms,
            );
        }
        h.push_str("</table>");
    }
    saf_table(&mut h, status);
    journal_table(&mut h, status, latest);
    h.push_str("</body></html>\n");
    h
}

/// The journal writer's counters and the latest exchanges, masked as
/// stored (the PAN first 6 / last 4).
fn journal_table(h: &mut String, status: &Status, latest: Option<&[JournalRow]>) {
    let Some(j) = &status.journal else { return };
    let today: Vec<String> = j
        .today
        .iter()
        .map(|(k, v)| format!("{} {v}", esc(k)))
        .collect();
    let today = if today.is_empty() {
        "none".to_string()
    } else {
        today.join(", ")
    };
    let _ = write!(
        h,
        "<h2>journal</h2><p>{} rows written, {} admin, {} dropped (queue full), {} failed, \
         {} purged, {} not written while paused{}; queue {}/{}</p><p>today's exceptions (UTC, this instance): {today}</p>\
         <table><tr><th>time in</th><th>service</th><th>node</th>\
         <th>MTI</th><th>F11</th><th>F41</th><th>PAN</th><th>F4</th><th>F39</th><th>by</th>\
         <th>outcome</th><th>reason</th></tr>",
        j.written,
        j.admin_written,
        j.dropped,
        j.failed,
        j.purged,
        j.paused_rows,
        if j.paused {
            " (PAUSED by the disk guard: journal.max_size or journal.min_free)"
        } else {
            ""
        },
        j.queued,
        j.queue
    );
    let Some(latest) = latest else {
        h.push_str(
            "</table><p>The latest exchanges are shown to a request with the admin token \
             (Authorization: Bearer).</p>",
        );
        return;
    };
    let o = |v: &Option<String>| esc(v.as_deref().unwrap_or("-"));
    for r in latest {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            show_time(r.t_in),
            esc(&r.service),
            o(&r.node),
            esc(&r.mti),
            o(&r.f11),
            o(&r.f41),
            o(&r.pan),
            o(&r.f4),
            o(&r.f39),
            esc(&r.answered_by),
            esc(&r.outcome),
            o(&r.reason),
        );
    }
    h.push_str("</table>");
}

/// One row per service: what the switch owes (store-and-forward) and what
/// it did about late approvals. A service with dead letters shows red.
fn saf_table(h: &mut String, status: &Status) {
    h.push_str(
        "<h2 id=\"saf\">store-and-forward</h2><table><tr><th>service</th><th>pending</th>\
         <th>reversals</th><th>advices</th><th>oldest s</th><th>dead letters</th>\
         <th>in attempt</th><th>late reversed</th><th>late logged</th><th>not reversed</th>\
         <th>reversals sent</th><th>acknowledged</th></tr>",
    );
    for s in &status.services {
        let i = &s.integrity;
        let cells = match &i.saf {
            Some(q) => format!(
                "<td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td class=\"dead\">{}</td><td>{}</td>",
                q.pending,
                q.reversals_pending,
                q.advices_pending,
                q.oldest_age_s,
                q.dead_letters,
                q.in_flight
            ),
            None => "<td colspan=\"6\">no store</td>".to_string(),
        };
        let class = match &i.saf {
            Some(q) if q.dead_letters > 0 => "down",
            Some(q) if q.pending > 0 => "draining",
            _ => "up",
        };
        let _ = write!(
            h,
            "<tr class=\"{class}\" data-saf=\"{n}\"><td>{n}</td>{cells}<td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td></tr>",
            i.late_reversed,
            i.late_logged,
            i.late_unreversed,
            i.reversals_sent,
            i.reversals_acknowledged,
            n = esc(&s.name),
        );
    }
    h.push_str("</table>");
}

/// HTML-escapes text from config (service and node names, addresses).
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::status::{IntegrityStatus, SafStatus, ServiceStatus};

    fn service(saf: Option<SafStatus>) -> ServiceStatus {
        ServiceStatus {
            name: "pos<1>".into(),
            front: "listen".into(),
            front_address: "127.0.0.1:1".into(),
            requests: 0,
            answered: 0,
            declined: Default::default(),
            refused: Default::default(),
            in_flight: 0,
            late_responses: 0,
            unknown_responses: 0,
            bad_messages: 0,
            bad_frames: 0,
            clients: 0,
            nodes: Vec::new(),
            links: None,
            integrity: IntegrityStatus {
                late_reversed: 12,
                reversals_acknowledged: 11,
                saf,
                ..IntegrityStatus::default()
            },
        }
    }

    #[test]
    fn a_saf_row_per_service_red_with_dead_letters() {
        let queue = SafStatus {
            pending: 4,
            reversals_pending: 3,
            advices_pending: 1,
            oldest_age_s: 61.4,
            dead_letters: 2,
            ..SafStatus::default()
        };
        let page = render(
            &Status {
                services: vec![service(Some(queue)), service(None)],
                restarts: 0,
                tls: Vec::new(),
                journal: None,
            },
            Some(&[]),
        );
        assert!(
            page.contains("<tr class=\"down\" data-saf=\"pos&lt;1&gt;\"><td>pos&lt;1&gt;</td><td>4</td><td>3</td><td>1</td><td>61</td><td class=\"dead\">2</td>"),
            "{page}"
        );
        assert!(
            page.contains("<td colspan=\"6\">no store</td><td>12</td>"),
            "{page}"
        );
        assert!(page.contains("<td>11</td></tr>"), "{page}");
    }

    #[test]
    fn the_journal_shows_its_counts_and_latest_rows_masked() {
        let mut today = std::collections::BTreeMap::new();
        today.insert("switch-made".to_string(), 3);
        let status = Status {
            services: vec![],
            restarts: 0,
            tls: Vec::new(),
            journal: Some(super::super::status::JournalStatus {
                written: 10,
                dropped: 1,
                today,
                ..Default::default()
            }),
        };
        let row = JournalRow {
            service: "pos".into(),
            mti: "0200".into(),
            pan: Some("622202*********0123".into()),
            answered_by: "switch".into(),
            outcome: "switch-made".into(),
            reason: Some("timeout".into()),
            ..JournalRow::default()
        };
        let page = render(&status, Some(std::slice::from_ref(&row)));
        assert!(
            page.contains("10 rows written, 0 admin, 1 dropped"),
            "{page}"
        );
        assert!(
            page.contains("today's exceptions (UTC, this instance): switch-made 3"),
            "{page}"
        );
        assert!(page.contains("<td>622202*********0123</td>"), "{page}");
        assert!(page.contains("<td>timeout</td></tr>"), "{page}");
        // Without a token: the counts, never a row.
        let page = render(&status, None);
        assert!(page.contains("10 rows written"), "{page}");
        assert!(!page.contains("622202"), "{page}");
        assert!(
            page.contains("shown to a request with the admin token"),
            "{page}"
        );
    }

    #[test]
    fn escapes_names() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
