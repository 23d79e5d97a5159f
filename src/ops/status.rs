//! What the switch shows of itself: the status of every service (nodes,
//! link sets, counters) and the connection table, as `GET /api/v1/status`,
//! `GET /api/v1/connections`, the status page and `isoswitch ctl` read them.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::control::SwitchHandle;
use super::saf::ServiceSaf;
use crate::config::FrontConfig;
use crate::link::Service;
use crate::link::service::IntegrityCounters;
use crate::route::DeclineReason;

/// `GET /api/v1/status`.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Status {
    pub services: Vec<ServiceStatus>,
    /// Critical tasks restarted so far.
    pub restarts: u64,
    /// The certificates the switch presents, with their expiry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls: Vec<crate::tls::CertStatus>,
    /// The journal's writer; absent without a journal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<JournalStatus>,
}

/// The journal writer's counters (docs/journal.md).
#[derive(Debug, Default, Serialize, serde::Deserialize)]
pub struct JournalStatus {
    pub written: u64,
    pub admin_written: u64,
    /// Rows lost to a full queue.
    pub dropped: u64,
    /// Rows lost to a failed insert.
    pub failed: u64,
    pub purged: u64,
    /// The disk guard has paused the journal (docs/journal.md, "The disk").
    #[serde(default)]
    pub paused: bool,
    /// Rows not written while it was paused.
    #[serde(default)]
    pub paused_rows: u64,
    pub queued: usize,
    pub queue: usize,
    /// Today's exceptions (UTC) this instance journaled, by outcome.
    #[serde(default)]
    pub today: std::collections::BTreeMap<String, u64>,
}

fn journal_status(switch: &SwitchHandle) -> Option<JournalStatus> {
    let j = switch.journal.as_ref()?;
    let c = &j.counters;
    let get = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    Some(JournalStatus {
        written: get(&c.written),
        admin_written: get(&c.admin_written) + get(&switch.audit.counters.written),
        dropped: get(&c.dropped),
        failed: get(&c.failed),
        purged: get(&c.purged),
        paused: c.paused.load(Ordering::Relaxed),
        paused_rows: get(&c.paused_rows),
        queued: j.queued(),
        queue: j.capacity(),
        today: c.today(crate::journal::now_millis()),
    })
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ServiceStatus {
    pub name: String,
    pub front: String,
    pub front_address: String,
    pub requests: u64,
    pub answered: u64,
    pub declined: std::collections::BTreeMap<String, u64>,
    /// Client connections refused at accept, by reason (listen fronts).
    #[serde(default)]
    pub refused: std::collections::BTreeMap<String, u64>,
    pub in_flight: usize,
    pub late_responses: u64,
    pub unknown_responses: u64,
    pub bad_messages: u64,
    pub bad_frames: u64,
    pub clients: usize,
    pub nodes: Vec<NodeStatusView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub links: Option<LinksStatus>,
    /// What the switch owes for the answers it gave (late approvals,
    /// reversals, advices) and its store-and-forward queue.
    #[serde(default)]
    pub integrity: IntegrityStatus,
}

/// A service's late approvals, reversals and store-and-forward queue.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
pub struct IntegrityStatus {
    pub late_reversed: u64,
    pub late_logged: u64,
    pub late_unreversed: u64,
    pub reversals_sent: u64,
    pub reversals_acknowledged: u64,
    pub advices_stored: u64,
    pub advices_delivered: u64,
    pub advices_unanswered: u64,
    /// From the last stats sample; absent without a store (or before the
    /// first sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saf: Option<SafStatus>,
}

/// What one service's store-and-forward queue owes.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
pub struct SafStatus {
    /// Entries still owed.
    pub pending: u64,
    pub reversals_pending: u64,
    pub advices_pending: u64,
    /// Of the pending, leased for an attempt right now.
    pub in_flight: u64,
    /// Age of the oldest pending entry, seconds (0 when none).
    pub oldest_age_s: f64,
    pub dead_letters: u64,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct NodeStatusView {
    pub id: String,
    pub index: usize,
    pub address: String,
    /// up, down, draining, disabled, ejected, removed.
    pub state: String,
    pub admin: String,
    pub weight: u32,
    pub effective_weight: u32,
    pub priority: u32,
    pub connections: usize,
    pub in_flight: usize,
    pub sent: u64,
    pub answered: u64,
    pub failed: u64,
    pub latency_ewma_ms: f64,
    pub ejected: bool,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct LinksStatus {
    pub links: usize,
    pub up: usize,
    pub signed_on: usize,
    /// Links the peer opened to the switch (simplex in links); 0 on a
    /// duplex `connect` front.
    #[serde(default)]
    pub in_links: usize,
}

/// The status of every service, as the API and the page show it.
pub fn status_of(switch: &SwitchHandle) -> Status {
    let now = Instant::now();
    let sample = switch.saf.as_ref().and_then(|v| v.latest());
    let by = sample.as_ref().map(|s| s.by_service());
    let services = switch
        .services
        .iter()
        .map(|r| {
            let mut st = service_status(&r.service, r.front_addr, now);
            st.integrity.saf = by.as_ref().map(|by| {
                let none = ServiceSaf::default();
                saf_status(by.get(r.service.name()).unwrap_or(&none))
            });
            st
        })
        .collect();
    Status {
        services,
        restarts: switch.supervisor.restarts(),
        tls: crate::tls::cert_statuses(
            switch
                .services
                .iter()
                .map(|r| (r.service.name(), &r.service.view().links.tls)),
            switch.admin_tls.get().map(|a| &**a),
        ),
        journal: journal_status(switch),
    }
}

fn service_status(s: &Service, front_addr: SocketAddr, now: Instant) -> ServiceStatus {
    let c = &s.view().counters;
    let nodes = s
        .view()
        .pool
        .nodes()
        .iter()
        .enumerate()
        .filter_map(|(index, n)| {
            let st = s.view().pool.status(index, now)?;
            Some(NodeStatusView {
                id: n.config.id.clone(),
                index,
                address: n.config.address.to_string(),
                state: st.state().into(),
                admin: format!("{:?}", st.admin).to_lowercase(),
                weight: st.weight,
                effective_weight: st.effective_weight,
                priority: st.priority,
                connections: n.live_conns(),
                in_flight: n.outstanding(),
                sent: n.counters.sent.load(Ordering::Relaxed),
                answered: n.counters.answered.load(Ordering::Relaxed),
                failed: n.counters.declined.load(Ordering::Relaxed),
                latency_ewma_ms: st.latency.as_secs_f64() * 1e3,
                ejected: st.ejected,
            })
        })
        .collect();
    let links = s.view().side.out_links().map(|out| {
        let (up, signed_on) = out.up();
        LinksStatus {
            links: out.len(),
            up,
            signed_on,
            in_links: s
                .view()
                .links
                .table
                .count(crate::link::io::conns::ConnKind::InLink),
        }
    });
    ServiceStatus {
        name: s.name().into(),
        front: match &s.view().config.front {
            FrontConfig::Listen(_) => "listen",
            FrontConfig::Simplex(_) => "simplex",
            FrontConfig::Connect(_) => "connect",
        }
        .into(),
        front_address: front_addr.to_string(),
        requests: c.requests.load(Ordering::Relaxed),
        answered: c.answered.load(Ordering::Relaxed),
        declined: DeclineReason::ALL
            .iter()
            .map(|&r| (r.as_str().to_string(), c.declined(r)))
            .collect(),
        refused: crate::link::service::Refusal::ALL
            .iter()
            .map(|&r| (r.as_str().to_string(), c.refused(r)))
            .collect(),
        in_flight: s.in_flight(),
        late_responses: c.late_responses.load(Ordering::Relaxed),
        unknown_responses: c.unknown_responses.load(Ordering::Relaxed),
        bad_messages: c.bad_messages.load(Ordering::Relaxed),
        bad_frames: c.bad_frames.load(Ordering::Relaxed),
        clients: s
            .view()
            .links
            .table
            .count(crate::link::io::conns::ConnKind::Client),
        nodes,
        links,
        integrity: integrity_status(&s.view().made.counters),
    }
}

fn integrity_status(c: &IntegrityCounters) -> IntegrityStatus {
    let n = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    IntegrityStatus {
        late_reversed: n(&c.late_reversed),
        late_logged: n(&c.late_logged),
        late_unreversed: n(&c.late_unreversed),
        reversals_sent: n(&c.reversals_sent),
        reversals_acknowledged: n(&c.reversals_acknowledged),
        advices_stored: n(&c.advices_stored),
        advices_delivered: n(&c.advices_delivered),
        advices_unanswered: n(&c.advices_unanswered),
        saf: None,
    }
}

fn saf_status(saf: &ServiceSaf) -> SafStatus {
    let total = saf.total();
    SafStatus {
        pending: total.pending,
        reversals_pending: saf.reversals.pending,
        advices_pending: saf.advices.pending,
        in_flight: total.in_flight,
        oldest_age_s: total.oldest_pending_age_ms.unwrap_or(0) as f64 / 1e3,
        dead_letters: total.dead,
    }
}

/// One row of `GET /api/v1/connections`.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ConnectionView {
    pub id: u64,
    pub service: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub peer: String,
    pub local: String,
    pub age_ms: u64,
    pub messages_in: u64,
    #[serde(default)]
    pub messages_out: u64,
    #[serde(default)]
    pub bytes_in: u64,
    #[serde(default)]
    pub bytes_out: u64,
    /// A client's requests in flight (absent for node and peer links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<usize>,
    pub idle_ms: u64,
    /// What TLS negotiated; absent on a plain link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::tls::TlsInfo>,
}

pub fn connections_of(switch: &SwitchHandle) -> Vec<ConnectionView> {
    let now = Instant::now();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    switch
        .services
        .iter()
        .flat_map(|r| {
            let name = r.service.name().to_string();
            r.service
                .view()
                .links
                .table
                .snapshot()
                .into_iter()
                .map(move |e| ConnectionView {
                    id: e.id,
                    service: name.clone(),
                    kind: serde_json::to_value(e.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    node: e.node.clone(),
                    peer: e.peer.to_string(),
                    local: e.local.to_string(),
                    age_ms: ms(now.saturating_duration_since(e.opened)),
                    messages_in: e.messages_in(),
                    messages_out: e.messages_out(),
                    bytes_in: e.bytes_in(),
                    bytes_out: e.bytes_out(),
                    in_flight: e.in_flight(),
                    idle_ms: ms(e.idle(now)),
                    tls: e.tls().cloned(),
                })
        })
        .collect()
}
