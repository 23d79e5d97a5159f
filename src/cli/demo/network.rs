//! The demo's card-network scenarios: the network simulator (`sim network`)
//! playing VISA (BASE I) or Mastercard on duplex links that the switch's
//! `visa` / `mastercard` service dials, both directions at once: the
//! network's issuer requests for the bank's cards go to the three channel
//! nodes (their ports for that network), the nodes' own requests go to the
//! network with their ID stamped in F37, and the network answers each on a
//! link other than the one it came on.
//!
//! The embedded default has the `visa` service; the `mastercard` one is the
//! same service on the `mastercard` dialect, signing its links on with the
//! member's DE 33, added by [`NetworkScenario::place`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::config::{Config, FrontConfig};
use crate::iso8583::Spec;
use crate::iso8583::SpecFiles;
use crate::link::Service;
use crate::sim::node::{Delay, NodeSim, NodeSimConfig, NodeSimStats, Originate};
use crate::sim::visa::{Dial, VisaSim, VisaSimConfig};

/// The network's issuer requests per second.
pub const ISSUER_RATE: f64 = 100.0;
/// Each node's own requests to the network per second.
pub const NODE_RATE: f64 = 20.0;

/// A card network of the demo: its row label, the switch's service for it
/// and its dialect.
#[derive(Clone, Copy, Debug)]
pub struct CardNetwork {
    pub label: &'static str,
    pub service: &'static str,
    pub spec: &'static str,
}

pub const VISA: CardNetwork = CardNetwork {
    label: "VISA",
    service: "visa",
    spec: "visa-base1",
};

pub const MASTERCARD: CardNetwork = CardNetwork {
    label: "Mastercard",
    service: "mastercard",
    spec: "mastercard",
};

/// The member's customer ID the `mastercard` service signs on with (DE 33).
const MEMBER_ID: &str = "001234";

/// A network and its side of the three channel nodes.
pub struct NetworkScenario {
    network: CardNetwork,
    spec: Arc<Spec>,
    sim: VisaSim,
    /// Each node's VISA port while it is alive.
    nodes: Vec<Option<NodeSim>>,
    addrs: Vec<SocketAddr>,
    /// Each node's counters over its lives.
    stats: Vec<Vec<Arc<NodeSimStats>>>,
}

impl NetworkScenario {
    /// Starts `nodes` node ports for `network` and the network itself, its
    /// issuer requests held until [`NetworkScenario::go`].
    pub async fn start(network: CardNetwork, nodes: usize) -> Result<NetworkScenario, String> {
        let spec = Arc::new(Spec::resolve(network.spec).map_err(|e| e.to_string())?);
        let any: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
        let mut s = NetworkScenario {
            sim: VisaSim::start(spec.clone(), sim_config(any))
                .await
                .map_err(|e| format!("sim network ({}): {e}", network.label))?,
            network,
            spec,
            nodes: Vec::new(),
            addrs: Vec::new(),
            stats: Vec::new(),
        };
        for i in 0..nodes {
            let node = s.start_node(i, any).await?;
            s.addrs.push(node.addr);
            s.stats.push(vec![Arc::clone(&node.stats)]);
            s.nodes.push(Some(node));
        }
        Ok(s)
    }

    async fn start_node(&self, i: usize, at: SocketAddr) -> Result<NodeSim, String> {
        let mut c = NodeSimConfig::new(&format!("{:02}", i + 1));
        c.delay = Delay::parse("0..20ms").unwrap_or(Delay::NONE);
        c.originate = Some(Originate {
            mti: "0200".into(),
            rate: NODE_RATE,
            stan_base: (i as u32 + 1) * 100_000,
            timeout: Duration::from_secs(5),
        });
        NodeSim::start(at, self.spec.clone(), c)
            .await
            .map_err(|e| format!("{} node {:02}: {e}", self.network.label, i + 1))
    }

    /// Points the network's service at the network and the nodes' ports
    /// for it; the `mastercard` service is first made from the `visa` one.
    pub fn place(&self, cfg: &mut Config) -> Result<(), String> {
        let addr = self.sim.local_addr().ok_or("sim network has no address")?;
        if !cfg.services.iter().any(|s| s.name == self.network.service) {
            let mut svc = cfg
                .services
                .iter()
                .find(|s| s.name == VISA.service)
                .ok_or("the embedded config lacks its visa service")?
                .clone();
            svc.name = self.network.service.to_string();
            svc.spec = self.network.spec.to_string();
            svc.network = Default::default();
            svc.network.fields.insert("F33".into(), MEMBER_ID.into());
            cfg.services.push(svc);
        }
        let svc = cfg
            .services
            .iter_mut()
            .find(|s| s.name == self.network.service)
            .ok_or("the demo config lacks the network's service")?;
        if let FrontConfig::Connect(c) = &mut svc.front {
            c.connect = addr;
        }
        for (node, a) in svc.back.nodes.iter_mut().zip(&self.addrs) {
            node.address = *a;
        }
        Ok(())
    }

    /// Waits until every link is up and signed on, both ways, and every node
    /// has a connection; then lets the network's requests go.
    pub async fn go(&self, svc: &Service) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let nodes_up = svc.view().pool.nodes().iter().all(|n| n.live_conns() > 0);
            let links = svc.view().side.out_links().map_or((0, 0), |l| l.up());
            let ours = self.sim.links();
            let want = svc.view().side.out_links().map_or(0, |l| l.len());
            if nodes_up && links.1 == want && ours == (want, want) {
                self.sim.resume();
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} not ready after 10 s: nodes up {nodes_up}, links {links:?}, the network's {ours:?}",
                    self.network.label
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Drops one link, gracefully (nothing in flight is lost); the switch
    /// dials it again and both sides sign it on.
    pub fn drop_link(&self) {
        self.sim.close_links(1);
    }

    /// Node `i`'s port for the network dies.
    pub async fn kill(&mut self, i: usize) {
        if let Some(n) = self.nodes.get_mut(i).and_then(Option::take) {
            n.stop().await;
        }
    }

    /// Node `i`'s port for the network is back at its address.
    pub async fn revive(&mut self, i: usize) -> Result<(), String> {
        let at = *self.addrs.get(i).ok_or("no such node")?;
        let node = self.start_node(i, at).await?;
        if let Some(s) = self.stats.get_mut(i) {
            s.push(Arc::clone(&node.stats));
        }
        if let Some(slot) = self.nodes.get_mut(i) {
            *slot = Some(node);
        }
        Ok(())
    }

    /// No new requests either way (answers keep coming).
    pub fn stop_originating(&self) {
        self.sim.pause();
        for n in self.nodes.iter().flatten() {
            n.stop_originating();
        }
    }

    /// Requests either way still waiting for their answer.
    pub fn outstanding(&self) -> usize {
        self.sim.outstanding()
            + self
                .nodes
                .iter()
                .flatten()
                .map(|n| n.outstanding())
                .sum::<usize>()
    }

    /// (originated, answered, declined, unanswered, foreign) of the nodes'
    /// own requests, over all their lives.
    fn own_requests(&self) -> [u64; 5] {
        let mut t = [0u64; 5];
        for s in self.stats.iter().flatten() {
            let v = [
                &s.originated,
                &s.originated_answered,
                &s.originated_declined,
                &s.originated_unanswered,
                &s.foreign_responses,
            ];
            for (slot, c) in t.iter_mut().zip(v) {
                *slot += c.load(Ordering::Relaxed);
            }
        }
        t
    }

    /// The summary row, with what it adds to the lost and the doubled.
    pub fn row(&self, svc: &Service) -> super::ScenarioRow {
        let r = self.sim.report();
        let own = self.own_requests();
        let per_node: Vec<String> = svc
            .view()
            .pool
            .nodes()
            .iter()
            .map(|n| format!("{} {}", n.id, n.counters.sent.load(Ordering::Relaxed)))
            .collect();
        let line = format!(
            "issuer sent {} answered {} declined {} unanswered {} doubled/crossed {} (nodes {}) \
             | nodes' requests {} answered {} declined {} unanswered {} foreign {}, \
             answered {} on another link | links dropped/dialled {}/{} sign-ons {}",
            r.issuer_sent,
            r.issuer_approved,
            r.issuer_declined,
            r.issuer_unanswered,
            r.doubled_or_crossed(),
            per_node.join(" / "),
            own[0],
            own[1],
            own[2],
            own[3],
            own[4],
            r.bank_answered_on_other_link,
            r.links_dropped,
            r.links_opened,
            // VISA signs its links on; Mastercard counts the member's.
            r.sign_ons_approved
                .max(self.sim.stats().bank_sign_ons.load(Ordering::Relaxed)),
        );
        super::ScenarioRow {
            label: self.network.label,
            line,
            lost: r.lost() + own[3],
            doubled: r.doubled_or_crossed() + own[4],
        }
    }

    /// Stops the network and the nodes' ports for it.
    pub async fn stop(self) {
        self.sim.stop().await;
        for n in self.nodes.into_iter().flatten() {
            n.stop().await;
        }
    }
}

fn sim_config(accept: SocketAddr) -> VisaSimConfig {
    let mut c = VisaSimConfig::new(Dial::Accept(accept), 2);
    c.rate = Some(ISSUER_RATE);
    // Paced by the demo: held until the links are ready, paused at the end.
    c.duration = Duration::from_secs(24 * 3600);
    c.paused = true;
    c.timeout = Duration::from_secs(3);
    c.echo_interval = Duration::from_secs(5);
    c
}
