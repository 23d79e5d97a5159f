//! `GET /metrics`: the switch's counters in the Prometheus text format, read
//! at scrape time from the same atomics the router writes (`ServiceCounters`,
//! `NodeCounters`): nothing is counted twice. Names follow HAProxy's exporter
//! so operators recognise them: `isoswitch_service_*` (HAProxy's `frontend`)
//! and `isoswitch_server_*` (a channel node) with `service` and `server`
//! labels. The store-and-forward queue (`isoswitch_saf_*`) is the exception:
//! it comes from the store, so it is read from the stats a task samples once
//! a second ([`super::saf`]), never from the store at scrape time.

mod integrity;
mod store;
mod tls;

use std::sync::atomic::Ordering;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::control::SwitchHandle;
use crate::link::Service;
use crate::link::back::pool::{Node, NodeStatus};
use crate::link::front::out_links::OutLinks;
use crate::link::io::conns::ConnKind;
use crate::route::DeclineReason;

/// Node states, each exported as `isoswitch_server_state{state=…}` 0/1.
const NODE_STATES: [&str; 6] = ["up", "down", "draining", "disabled", "ejected", "removed"];

type Labels = Vec<(&'static str, String)>;

// Each family is declared beside the reader of its value, so a name and
// its value cannot drift apart (as two lists zipped by position could).
/// A per-service counter's value.
type ReadService = fn(&Service) -> u64;
/// A link-set gauge's value (simplex and connect fronts).
type ReadLinks = fn(&OutLinks) -> usize;
/// A per-node counter's value.
type ReadServer = fn(&Node) -> u64;
/// A per-node gauge's value, from the node and its status read once.
type ReadServerGauge = fn(&Node, &NodeStatus) -> f64;

/// The whole exposition, as `/metrics` serves it.
pub fn render(handle: &SwitchHandle) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SwitchMetrics(handle.clone())));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// The Prometheus text format 0.0.4 (what `promtool check metrics` and
/// scrapers that do not ask for OpenMetrics read) from the OpenMetrics text the
/// encoder writes: counter families are named with their `_total` suffix in
/// `HELP` and `TYPE`, and the `# EOF` and `# UNIT` lines go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{p}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A label value as the exposition formats want it: the encoder writes
/// values as given, so a `"`, `\\` or newline in one would end the label early
/// (`server="x",y="z"`) or break the whole scrape. Config load and the API
/// already refuse such names; this keeps the exposition sound regardless.
fn label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

struct SwitchMetrics(SwitchHandle);

impl std::fmt::Debug for SwitchMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SwitchMetrics")
    }
}

/// One metric family: its samples are label sets and values.
struct Family<T> {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, T)>,
}

impl<T> Family<T> {
    fn new(name: &'static str, help: &'static str, kind: MetricType) -> Self {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }
}

fn counter(name: &'static str, help: &'static str) -> Family<u64> {
    Family::new(name, help, MetricType::Counter)
}

fn gauge(name: &'static str, help: &'static str) -> Family<f64> {
    Family::new(name, help, MetricType::Gauge)
}

fn encode_counters(enc: &mut DescriptorEncoder, f: &Family<u64>) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(f.name, f.help, None, f.kind)?;
    for (labels, v) in &f.samples {
        let mut fam = m.encode_family(labels)?;
        fam.encode_counter::<NoLabelSet, _, u64>(v, None)?;
    }
    Ok(())
}

fn encode_gauges(enc: &mut DescriptorEncoder, f: &Family<f64>) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(f.name, f.help, None, f.kind)?;
    for (labels, v) in &f.samples {
        let mut fam = m.encode_family(labels)?;
        fam.encode_gauge(v)?;
    }
    Ok(())
}

impl Collector for SwitchMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let now = Instant::now();
        let mut svc_counters: Vec<(Family<u64>, ReadService)> = vec![
            (
                counter(
                    "isoswitch_service_requests",
                    "Requests accepted from the front.",
                ),
                |s| s.view().counters.requests.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_responses",
                    "Node responses delivered to the front.",
                ),
                |s| s.view().counters.answered.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_late_responses",
                    "Node responses that came after their request was declined; dropped.",
                ),
                |s| s.view().counters.late_responses.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_unknown_responses",
                    "Node responses that match no request; dropped.",
                ),
                |s| s.view().counters.unknown_responses.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_bad_messages",
                    "Messages that could not be parsed.",
                ),
                |s| s.view().counters.bad_messages.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_bad_frames",
                    "Frames whose length prefix could not be trusted.",
                ),
                |s| s.view().counters.bad_frames.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_undeliverable",
                    "Answers with no live link to go to.",
                ),
                |s| s.view().counters.undeliverable.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_keepalives",
                    "Keep-alive frames received from clients.",
                ),
                |s| s.view().counters.keep_alives.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_connections_accepted",
                    "Client connections accepted.",
                ),
                |s| s.view().counters.clients_accepted.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_over_share",
                    "Requests declined because their client was over its in-flight share.",
                ),
                |s| s.view().counters.over_share.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_undeclinable",
                    "Requests too broken to answer with a decline (dropped).",
                ),
                |s| s.view().counters.undeclinable.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_panic_routed",
                    "Requests routed while no node was healthy (panic mode).",
                ),
                |s| s.view().pool.panic_picks(),
            ),
            (
                counter(
                    "isoswitch_service_node_requests",
                    "Node-originated requests queued for the peer (simplex and connect fronts).",
                ),
                |s| s.view().counters.peer.node_requests.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_service_node_requests_unsent",
                    "Node-originated requests declined at once: no out link could take them and the waiting queue was full.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .node_requests_unsent
                        .load(Ordering::Relaxed)
                },
            ),
            (
                counter(
                    "isoswitch_service_node_requests_expired",
                    "Node-originated requests dropped: no signed-on out link before their deadline.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .node_requests_expired
                        .load(Ordering::Relaxed)
                },
            ),
            (
                counter(
                    "isoswitch_service_stamp_mismatches",
                    "Node-stamped F37 values that did not name the sending node.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .stamp_mismatches
                        .load(Ordering::Relaxed)
                },
            ),
            (
                counter(
                    "isoswitch_service_peer_responses",
                    "Peer responses routed to a node by their F37 stamp.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .peer_responses
                        .load(Ordering::Relaxed)
                },
            ),
            (
                counter(
                    "isoswitch_service_unroutable_responses",
                    "Peer responses whose F37 stamp names no live node; dropped.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .unroutable_responses
                        .load(Ordering::Relaxed)
                },
            ),
            (
                counter(
                    "isoswitch_service_network_answered",
                    "The peer's network management requests answered by the switch.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .network_answered
                        .load(Ordering::Relaxed)
                },
            ),
            (
                counter(
                    "isoswitch_service_key_exchange_to_nodes",
                    "The peer's key exchange and cut-over requests sent to a key node.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .key_exchange_to_nodes
                        .load(Ordering::Relaxed)
                },
            ),
            (
                counter(
                    "isoswitch_service_key_exchange_unsent",
                    "The peer's key exchange and cut-over requests that reached no key node.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .key_exchange_unsent
                        .load(Ordering::Relaxed)
                },
            ),
            (
                counter(
                    "isoswitch_service_node_key_exchange",
                    "Nodes' own key exchange and cut-over requests sent to the peer.",
                ),
                |s| {
                    s.view()
                        .counters
                        .peer
                        .node_key_exchange
                        .load(Ordering::Relaxed)
                },
            ),
        ];
        let mut bytes = counter(
            "isoswitch_service_bytes",
            "Bytes read and written on the service's connections (clients, nodes, peer links), by direction.",
        );
        let mut link_state = gauge(
            "isoswitch_link_state",
            "1 for each link's current state (connecting, up, signed-on, down) on simplex and connect fronts.",
        );
        let mut bad_requests = counter(
            "isoswitch_service_bad_requests",
            "Client requests that failed ingress validation, by outcome (on_bad_message).",
        );
        let mut declines = counter(
            "isoswitch_service_declines",
            "Requests the switch answered itself (F39 decline), by reason.",
        );
        let mut refused = counter(
            "isoswitch_service_connections_refused",
            "Client connections refused at accept, by reason: not_allowed (allow list), max_connections, max_per_source, shutdown, descriptors (the clients' share of the open-file limit is in use).",
        );
        let mut budget = gauge(
            "isoswitch_client_descriptor_budget",
            "Client connections the open-file limit leaves once node links, peer links, admin, captures and files are reserved (shared by every listen front).",
        );
        let mut svc_gauges: Vec<Family<f64>> = vec![gauge(
            "isoswitch_service_in_flight",
            "Requests waiting for a node's answer.",
        )];
        let mut conns = gauge(
            "isoswitch_service_current_connections",
            "Open connections, by kind (client, node, out-link, in-link).",
        );
        let mut links: [(Family<f64>, ReadLinks); 4] = [
            (
                gauge(
                    "isoswitch_link_set_links",
                    "Links of the service's link set (simplex and connect fronts).",
                ),
                |o| o.len(),
            ),
            (gauge("isoswitch_link_set_up", "Links up."), |o| o.up().0),
            (
                gauge(
                    "isoswitch_link_set_usable",
                    "Links up and signed on (able to carry traffic).",
                ),
                |o| o.up().1,
            ),
            (
                gauge(
                    "isoswitch_link_set_waiting",
                    "Frames waiting for a usable out link.",
                ),
                |o| o.waiting(),
            ),
        ];
        let mut parked = counter(
            "isoswitch_link_set_waited",
            "Frames that waited for a usable out link, by outcome: sent, dropped at their deadline (answers), refused (waiting queue full).",
        );
        let mut srv_counters: Vec<(Family<u64>, ReadServer)> = vec![
            (
                counter("isoswitch_server_requests", "Requests sent to the node."),
                |n| n.counters.sent.load(Ordering::Relaxed),
            ),
            (
                counter("isoswitch_server_responses", "Requests the node answered."),
                |n| n.counters.answered.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_server_failures",
                    "Requests the node did not answer (timeout, connection lost, disabled).",
                ),
                |n| n.counters.declined.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_server_connects",
                    "Connections to the node opened.",
                ),
                |n| n.counters.connects.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_server_disconnects",
                    "Connections to the node closed.",
                ),
                |n| n.counters.disconnects.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_server_connect_failures",
                    "Connection attempts to the node that failed or timed out.",
                ),
                |n| n.counters.connect_failures.load(Ordering::Relaxed),
            ),
            (
                counter(
                    "isoswitch_server_ejections_capped",
                    "Passive ejections due but refused by max_ejection_percent.",
                ),
                |n| n.counters.ejections_capped.load(Ordering::Relaxed),
            ),
        ];
        let mut srv_gauges: Vec<(Family<f64>, ReadServerGauge)> = vec![
            (
                gauge(
                    "isoswitch_server_in_flight",
                    "Requests waiting for this node.",
                ),
                |n, _| n.outstanding() as f64,
            ),
            (
                gauge(
                    "isoswitch_server_current_connections",
                    "Connections to the node up.",
                ),
                |n, _| n.live_conns() as f64,
            ),
            (
                gauge("isoswitch_server_weight", "Configured weight."),
                |_, st| f64::from(st.weight),
            ),
            (
                gauge(
                    "isoswitch_server_effective_weight",
                    "Weight the balancer uses now (0 when not eligible; ramps in slow start).",
                ),
                |_, st| f64::from(st.effective_weight),
            ),
            (
                gauge(
                    "isoswitch_server_latency_ewma_seconds",
                    "Peak-EWMA latency estimate.",
                ),
                |_, st| st.latency.as_secs_f64(),
            ),
        ];
        let mut states = gauge(
            "isoswitch_server_state",
            "1 for the node's current state: up, down, draining, disabled, ejected, removed.",
        );
        let mut hist = Vec::new();
        for r in self.0.services.iter() {
            let s = &r.service;
            let sl = || vec![("service", label_value(s.name()))];
            let c = &s.view().counters;
            for (f, read) in &mut svc_counters {
                f.samples.push((sl(), read(s)));
            }
            for (outcome, v) in [
                ("declined", &c.bad_declined),
                ("dropped", &c.bad_dropped),
                ("closed", &c.bad_closed),
            ] {
                let mut l = sl();
                l.push(("outcome", outcome.to_string()));
                bad_requests.samples.push((l, v.load(Ordering::Relaxed)));
            }
            for (dir, v) in [
                ("in", &s.view().links.table.traffic.bytes_in),
                ("out", &s.view().links.table.traffic.bytes_out),
            ] {
                let mut l = sl();
                l.push(("direction", dir.to_string()));
                bytes.samples.push((l, v.load(Ordering::Relaxed)));
            }
            if let Some(out) = &s.view().side.out_links() {
                for (link, st) in out.stats.iter().enumerate() {
                    let now_state = st.state().as_str();
                    for state in ["connecting", "up", "signed-on", "down"] {
                        let mut l = sl();
                        l.push(("link", link.to_string()));
                        l.push(("state", state.to_string()));
                        let on = if state == now_state { 1.0 } else { 0.0 };
                        link_state.samples.push((l, on));
                    }
                }
            }
            for why in crate::link::service::Refusal::ALL {
                let mut l = sl();
                l.push(("reason", why.as_str().to_string()));
                refused.samples.push((l, c.refused(why)));
            }
            for reason in DeclineReason::ALL {
                let mut l = sl();
                l.push(("reason", reason.as_str().to_string()));
                declines.samples.push((l, c.declined(reason)));
            }
            svc_gauges[0].samples.push((sl(), s.in_flight() as f64));
            for (kind, name) in [
                (ConnKind::Client, "client"),
                (ConnKind::Node, "node"),
                (ConnKind::OutLink, "out-link"),
                (ConnKind::InLink, "in-link"),
            ] {
                let mut l = sl();
                l.push(("kind", name.to_string()));
                conns
                    .samples
                    .push((l, s.view().links.table.count(kind) as f64));
            }
            if let Some(out) = &s.view().side.out_links() {
                for (f, read) in &mut links {
                    f.samples.push((sl(), read(out) as f64));
                }
                for (outcome, v) in [
                    ("sent", &out.parked_sent),
                    ("dropped", &out.parked_dropped),
                    ("refused", &out.park_refused),
                ] {
                    let mut l = sl();
                    l.push(("outcome", outcome.to_string()));
                    parked.samples.push((l, v.load(Ordering::Relaxed)));
                }
            }
            node_samples(
                s,
                now,
                &mut srv_counters,
                &mut srv_gauges,
                &mut states,
                &mut hist,
            );
        }
        // One budget for the process: every service shares it.
        if let Some(r) = self.0.services.first() {
            let b = r.service.view().links.budget();
            if b.limit() != usize::MAX {
                budget.samples.push((Vec::new(), b.limit() as f64));
            }
        }
        for (f, _) in &svc_counters {
            encode_counters(&mut enc, f)?;
        }
        encode_counters(&mut enc, &declines)?;
        encode_counters(&mut enc, &refused)?;
        encode_gauges(&mut enc, &budget)?;
        encode_counters(&mut enc, &bad_requests)?;
        encode_counters(&mut enc, &bytes)?;
        encode_counters(&mut enc, &parked)?;
        encode_gauges(&mut enc, &link_state)?;
        for f in svc_gauges
            .iter()
            .chain([&conns])
            .chain(links.iter().map(|(f, _)| f))
        {
            encode_gauges(&mut enc, f)?;
        }
        for (f, _) in &srv_counters {
            encode_counters(&mut enc, f)?;
        }
        for f in srv_gauges.iter().map(|(f, _)| f).chain([&states]) {
            encode_gauges(&mut enc, f)?;
        }
        let mut m = enc.encode_descriptor(
            "isoswitch_server_response_time_seconds",
            "Time from sending a request to the node to its answer.",
            None,
            MetricType::Histogram,
        )?;
        for (labels, (sum, count, buckets)) in &hist {
            let mut fam = m.encode_family(labels)?;
            fam.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?;
        }
        integrity::encode(&mut enc, &self.0)?;
        store::encode_saf(&mut enc, &self.0)?;
        tls::encode(&mut enc, &self.0)?;
        store::encode_journal(&mut enc, &self.0)?;
        store::encode_audit(&mut enc, &self.0)?;
        let mut m = enc.encode_descriptor(
            "isoswitch_supervisor_restarts",
            "Critical tasks restarted after ending unexpectedly.",
            None,
            MetricType::Counter,
        )?;
        m.encode_counter::<NoLabelSet, _, u64>(&self.0.supervisor.restarts(), None)?;
        Ok(())
    }
}

type Histogram = (f64, u64, Vec<(f64, u64)>);

fn node_samples(
    s: &Service,
    now: Instant,
    counters: &mut [(Family<u64>, ReadServer)],
    gauges: &mut [(Family<f64>, ReadServerGauge)],
    states: &mut Family<f64>,
    hist: &mut Vec<(Labels, Histogram)>,
) {
    let nodes = s.view().pool.nodes();
    for (index, n) in nodes.iter().enumerate() {
        let Some(st) = s.view().pool.status(index, now) else {
            continue;
        };
        let nl = || {
            vec![
                ("service", label_value(s.name())),
                ("server", label_value(&n.config.id)),
            ]
        };
        for (f, read) in counters.iter_mut() {
            f.samples.push((nl(), read(n)));
        }
        for (f, read) in gauges.iter_mut() {
            f.samples.push((nl(), read(n, &st)));
        }
        for state in NODE_STATES {
            let mut l = nl();
            l.push(("state", state.to_string()));
            states
                .samples
                .push((l, if st.state() == state { 1.0 } else { 0.0 }));
        }
        hist.push((nl(), n.counters.latency.snapshot()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_cannot_leave_their_quotes() {
        assert_eq!(label_value("n.1_a-b"), "n.1_a-b");
        assert_eq!(label_value("x\",y=\"z"), "x\\\",y=\\\"z");
        assert_eq!(label_value("a\\b\nc"), "a\\\\b\\nc");
    }

    #[test]
    fn prometheus_text_names_counters_with_total_and_drops_eof() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{s=\"x\"} 3\n\
                  # HELP b_in_flight In flight.\n# TYPE b_in_flight gauge\nb_in_flight 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{s=\"x\"} 3\n\
             # HELP b_in_flight In flight.\n# TYPE b_in_flight gauge\nb_in_flight 1\n"
        );
    }
}
