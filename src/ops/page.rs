//! `GET /`: one small server-rendered status page (services, nodes, links and
//! their counters) that reloads itself every two seconds. No script.

use std::fmt::Write;

use super::status::Status;

/// The page for `status`.
pub fn render(status: &Status) -> String {
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
    h.push_str("</body></html>\n");
    h
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

    #[test]
    fn escapes_names() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
