//! The demo's ATM scenario: ATMs through the `atm` service's OneConnect front
//! (each transaction: connect, one request, its answer, close) to three ATM
//! hosts that echo no key field, so only one request per node connection at
//! a time can bring each answer back. Its own row in the demo's summary.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::config::Config;
use crate::iso8583::Spec;
use crate::ops::run::Switch;
use crate::sim::load::{self, LoadConfig, LoadCounters, LoadReport};
use crate::sim::node::{Delay, NodeOptions, NodeSim, NodeSimConfig};

/// The service's name in the embedded default.
pub const SERVICE: &str = "atm";
/// ATMs transacting at once, and their pause between transactions.
const ATMS: usize = 20;
const THINK: Duration = Duration::from_millis(50);

pub struct AtmHosts {
    hosts: Vec<NodeSim>,
}

impl AtmHosts {
    /// Starts the hosts and points the `atm` service of `cfg` at them (and its
    /// front at a free port). Without that service there is no ATM scenario.
    pub async fn start(spec: &Arc<Spec>, cfg: &mut Config) -> Result<Option<AtmHosts>, String> {
        let Some(svc) = cfg.services.iter_mut().find(|s| s.name == SERVICE) else {
            return Ok(None);
        };
        let any: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
        let mut hosts = Vec::new();
        for node in &mut svc.back.nodes {
            let mut c = NodeSimConfig::new(&node.id);
            c.delay = Delay::parse("0..20ms")?;
            let host = NodeSim::start_with(any, Arc::clone(spec), c, NodeOptions { no_key: true })
                .await
                .map_err(|e| e.to_string())?;
            node.address = host.addr;
            hosts.push(host);
        }
        if let crate::config::FrontConfig::Listen(l) = &mut svc.front {
            l.listen = any;
        }
        Ok(Some(AtmHosts { hosts }))
    }

    /// Starts the ATMs for `seconds` against the switch's `atm` front.
    pub fn spawn(
        &self,
        spec: &Arc<Spec>,
        switch: &Switch,
        seconds: u64,
    ) -> Result<tokio::task::JoinHandle<Result<LoadReport, String>>, String> {
        let front = switch
            .services
            .iter()
            .find(|r| r.service.name() == SERVICE)
            .map(|r| r.front_addr)
            .ok_or("the switch runs no atm service")?;
        let mut cfg = LoadConfig::new(front);
        cfg.clients = ATMS;
        cfg.connection_per_request = true;
        cfg.think = THINK;
        cfg.duration = Duration::from_secs(seconds);
        cfg.timeout = Duration::from_secs(3);
        let spec = Arc::clone(spec);
        Ok(tokio::spawn(async move {
            load::run(spec, cfg, Arc::new(LoadCounters::default())).await
        }))
    }

    /// The summary row; true when every ATM got its own answer.
    pub fn summary(&self, switch: &Switch, report: &LoadReport) -> bool {
        let max = switch
            .service(SERVICE)
            .map_or(0, |s| s.view().config.back.connections_per_node);
        let accepted: Vec<String> = self
            .hosts
            .iter()
            .map(|h| h.stats.connections.load(Ordering::Relaxed).to_string())
            .collect();
        println!(
            "ATM (OneConnect) requests {} answered {} declined {} timeouts {} mismatches {} | {} connects | host connections {} (pool max {max} each)",
            report.requests,
            report.answered,
            report.declined,
            report.timeouts,
            report.mismatches,
            report.connects,
            accepted.join("/"),
        );
        report.timeouts == 0
            && report.mismatches == 0
            && report.connections_lost == 0
            && report.answered + report.declined == report.requests
    }

    pub async fn stop(self) {
        for h in self.hosts {
            h.stop().await;
        }
    }
}
