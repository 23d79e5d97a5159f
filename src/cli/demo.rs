//! `isoswitch demo`: the whole switch on 127.0.0.1 in one process, on the
//! embedded default config. A simulated POS network controller (2 uplinks,
//! 200 terminals), a simulated UnionPay (8 in / 8 out links), a simulated
//! VISA and Mastercard (2 duplex links each, see `demo::network`) and ATMs through a OneConnect front
//! send traffic through the switch to three channel nodes. Through the admin
//! API, as an operator would: node 02 is drained (and a VISA link dropped),
//! node 01 disabled (in-flight finish) and node 03 forced offline (in-flight
//! declined and reversed), both re-enabled, a weight change is reloaded from the
//! config file, then node 03 is killed and brought back; the status table
//! from the API is printed at each step. One progress line a second, a
//! summary at the end with a row per scenario, and a non-zero exit status if
//! any request went unanswered or was answered twice.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::config::{AdminConfig, Config, FrontConfig};
use crate::iso8583::Spec;
use crate::iso8583::SpecFiles;
use crate::link::Service;
use crate::ops::run::Switch;
use crate::sim::cups::{CupsSim, CupsSimConfig};
use crate::sim::ledger::LateApprovals;
use crate::sim::nac::{self, NacCounters, NacSimConfig};
use crate::sim::node::{Finance, NodeOptions, NodeSim, NodeSimConfig, Originate};

mod files;
mod network;
mod report;

use files::{DemoFiles, DemoLog};
pub use report::ScenarioRow;
use report::{Snapshot, integrity_row, progress_line, summary};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Seconds of traffic.
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
}

const NODES: usize = 3;
const POS_RATE: f64 = 600.0;
const ISSUER_RATE: f64 = 150.0;
const NODE_ORIGINATE_RATE: f64 = 20.0;
/// Share of the POS approvals each node sends past the switch's 3 s
/// timeout: the terminal got a decline, so the switch must reverse them.
const LATE_SHARE: f64 = 0.003;
const LATE_BY: Duration = Duration::from_millis(3500);
/// UnionPay resets its working key this often; the reset must reach the
/// key node (01) and its 0830 go back to UnionPay.
const KEY_RESET_EVERY: Duration = Duration::from_secs(3);

pub fn run(args: &DemoArgs) -> ExitCode {
    // The switch's own log (warnings when node 03 dies, sign-ons, reloads) goes
    // to a file named up front and kept after the demo: on the terminal its
    // lines would land between the rows of the tables a person is reading.
    let log = match DemoLog::create() {
        Ok(log) => log,
        Err(e) => {
            eprintln!("isoswitch demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("switch log: {} (kept after the demo)", log.path.display());
    let code = run_logged(args);
    println!("switch log: {}", log.path.display());
    code
}

fn run_logged(args: &DemoArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("isoswitch demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(demo(args.seconds.max(3))) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("isoswitch demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One channel node serving both channels: a POS port and a UnionPay port.
struct ChannelNode {
    id: String,
    pos: Option<NodeSim>,
    cups: Option<NodeSim>,
    pos_addr: SocketAddr,
    cups_addr: SocketAddr,
    /// Counters of its UnionPay side, kept across a restart.
    cups_stats: Vec<Arc<crate::sim::node::NodeSimStats>>,
    /// Counters of its POS side (late approvals), kept across a restart.
    pos_stats: Vec<Arc<crate::sim::node::NodeSimStats>>,
}

impl ChannelNode {
    async fn start(
        i: usize,
        pos_spec: &Arc<Spec>,
        cups_spec: &Arc<Spec>,
        at: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<ChannelNode, String> {
        let id = format!("{:02}", i + 1);
        let any: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
        let (pos_at, cups_at) = at.unwrap_or((any, any));
        let late = Finance {
            late: Some(LateApprovals {
                share: LATE_SHARE,
                by: LATE_BY,
            }),
            ..Finance::default()
        };
        let pos = NodeSim::start_financial(
            pos_at,
            pos_spec.clone(),
            Self::pos_config(&id),
            NodeOptions::default(),
            late,
        )
        .await
        .map_err(|e| e.to_string())?;
        let cups = NodeSim::start(cups_at, cups_spec.clone(), Self::cups_config(&id, i))
            .await
            .map_err(|e| e.to_string())?;
        Ok(ChannelNode {
            pos_addr: pos.addr,
            cups_addr: cups.addr,
            cups_stats: vec![Arc::clone(&cups.stats)],
            pos_stats: vec![Arc::clone(&pos.stats)],
            pos: Some(pos),
            cups: Some(cups),
            id,
        })
    }

    fn pos_config(id: &str) -> NodeSimConfig {
        let mut c = NodeSimConfig::new(id);
        c.delay =
            crate::sim::node::Delay::parse("0..20ms").unwrap_or(crate::sim::node::Delay::NONE);
        c
    }

    fn cups_config(id: &str, i: usize) -> NodeSimConfig {
        let mut c = Self::pos_config(id);
        c.originate = Some(Originate {
            mti: "0200".into(),
            rate: NODE_ORIGINATE_RATE,
            stan_base: (i as u32 + 1) * 100_000,
            timeout: Duration::from_secs(5),
        });
        c
    }

    async fn kill(&mut self) {
        if let Some(n) = self.pos.take() {
            n.stop().await;
        }
        if let Some(n) = self.cups.take() {
            n.stop().await;
        }
    }

    async fn revive(
        &mut self,
        i: usize,
        pos_spec: &Arc<Spec>,
        cups_spec: &Arc<Spec>,
    ) -> Result<(), String> {
        let again = ChannelNode::start(
            i,
            pos_spec,
            cups_spec,
            Some((self.pos_addr, self.cups_addr)),
        )
        .await?;
        self.cups_stats.extend(again.cups_stats);
        self.pos_stats.extend(again.pos_stats);
        self.pos = again.pos;
        self.cups = again.cups;
        Ok(())
    }

    fn stop_originating(&self) {
        if let Some(n) = &self.cups {
            n.stop_originating();
        }
    }

    fn outstanding(&self) -> usize {
        self.cups.as_ref().map_or(0, |n| n.outstanding())
    }

    /// POS approvals it sent late, over its lives (its own books).
    fn late_approvals(&self) -> u64 {
        self.pos_stats
            .iter()
            .map(|s| s.reversals.report().late_approvals)
            .sum()
    }

    /// UnionPay key resets (F70 101) that reached it, over its lives.
    fn key_resets(&self) -> u64 {
        self.cups_stats
            .iter()
            .map(|s| s.key_resets.snapshot().get("101").copied().unwrap_or(0))
            .sum()
    }

    /// (originated, answered, declined, unanswered, foreign) over its lives.
    fn own_requests(&self) -> [u64; 5] {
        let mut t = [0u64; 5];
        for s in &self.cups_stats {
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
}

async fn demo(seconds: u64) -> Result<bool, String> {
    let pos_spec = Arc::new(Spec::resolve("cup-pos").map_err(|e| e.to_string())?);
    let cups_spec = Arc::new(Spec::resolve("cups").map_err(|e| e.to_string())?);
    let mut nodes = Vec::new();
    for i in 0..NODES {
        nodes.push(ChannelNode::start(i, &pos_spec, &cups_spec, None).await?);
    }
    // The embedded default, on free ports so the demo runs beside anything.
    let mut cfg = Config::embedded_default().map_err(|e| e.to_string())?;
    let peer_accept = free_port()?;
    place(&mut cfg, &nodes, peer_accept)?;
    let mut visa = network::NetworkScenario::start(network::VISA, NODES).await?;
    visa.place(&mut cfg)?;
    let mut mastercard = network::NetworkScenario::start(network::MASTERCARD, NODES).await?;
    mastercard.place(&mut cfg)?;
    let atm = super::demo_atm::AtmHosts::start(&pos_spec, &mut cfg).await?;
    let files = DemoFiles::new()?;
    cfg.admin = Some(AdminConfig {
        listen: "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?,
        token_file: Some(files.token.clone()),
        ..AdminConfig::default()
    });
    cfg.data_dir = Some(files.data_dir.clone());
    // A reversal owed to a node that is down (03, killed) is tried again
    // after a second, not the default 30 s: the demo is short.
    cfg.store.saf.retry = Duration::from_secs(1);
    files.write_config(&cfg)?;
    let switch = Switch::start(&cfg).await.map_err(|e| e.to_string())?;
    switch.set_source(Some(files.config.clone()));
    let api = DemoApi {
        base: format!(
            "http://{}",
            switch
                .admin_addr()
                .ok_or("the demo starts its admin listener")?
        ),
        token: files.token_text.clone(),
    };
    let (pos, unionpay) = match (switch.service("pos"), switch.service("unionpay")) {
        (Some(p), Some(u)) => (Arc::clone(p), Arc::clone(u)),
        _ => return Err("the embedded config lacks its services".into()),
    };
    let pos_front = switch.services[0].front_addr;
    let in_links = switch.services[1].front_addr;
    let mut cups_cfg = CupsSimConfig::new(peer_accept, in_links, 8);
    cups_cfg.rate = Some(ISSUER_RATE);
    cups_cfg.duration = Duration::from_secs(seconds);
    cups_cfg.timeout = Duration::from_secs(3);
    cups_cfg.key_reset_every = Some(KEY_RESET_EVERY);
    let cups = CupsSim::start(cups_spec.clone(), cups_cfg)
        .await
        .map_err(|e| e.to_string())?;
    wait_ready(&pos, &unionpay).await?;
    let visa_svc = Arc::clone(
        switch
            .service(network::VISA.service)
            .ok_or("the embedded config lacks its visa service")?,
    );
    visa.go(&visa_svc).await?;
    let mastercard_svc = Arc::clone(
        switch
            .service(network::MASTERCARD.service)
            .ok_or("the demo config lacks its mastercard service")?,
    );
    mastercard.go(&mastercard_svc).await?;

    println!(
        "admin API on {} (ctl: ISOSWITCH_ADMIN_TOKEN={} isoswitch ctl --admin {} status)",
        api.base, api.token, api.base
    );
    println!(
        "isoswitch demo: POS NAC (2 uplinks, 200 terminals, {POS_RATE} req/s) and UnionPay (8 in / 8 out, {ISSUER_RATE} req/s) through the switch to {NODES} channel nodes, {seconds} s"
    );
    println!(
        "               and VISA and Mastercard (2 duplex links each, {} req/s to the nodes, {} req/s from each node)",
        network::ISSUER_RATE,
        network::NODE_RATE
    );
    let nac_counters = Arc::new(NacCounters::default());
    let nac = tokio::spawn(nac::run_with(
        pos_spec.clone(),
        NacSimConfig {
            target: pos_front,
            nac_id: 1,
            uplinks: 2,
            terminals: 200,
            rate: Some(POS_RATE),
            duration: Duration::from_secs(seconds),
            // Past the switch's own 3 s timeout: a terminal waits for the
            // switch's decline rather than racing it.
            timeout: Duration::from_secs(5),
        },
        Arc::clone(&nac_counters),
    ));
    let atm_task = match &atm {
        Some(a) => Some(a.spawn(&pos_spec, &switch, seconds)?),
        None => None,
    };

    let services = [&pos, &unionpay, &visa_svc];
    let step = |k: u64| (k * seconds / 6).max(1);
    let (drain_at, disable_at, enable_at, kill_at, revive_at) =
        (step(1), step(2), step(3), step(4), step(5));
    let mut last = Snapshot::take(&services);
    let started = Instant::now();
    for t in 1..=seconds {
        tokio::time::sleep_until((started + Duration::from_secs(t)).into()).await;
        let now = Snapshot::take(&services);
        println!("{}", progress_line(t, &last, &now, &services));
        last = now;
        if t == drain_at {
            println!("== t={t}s: draining node 02 (no new requests; in-flight ones finish)");
            api.node_everywhere("02", "drain").await?;
            println!(
                "== t={t}s: dropping a VISA and a Mastercard link (the switch dials each again and signs on)"
            );
            visa.drop_link();
            mastercard.drop_link();
            api.show().await?;
        } else if t == disable_at {
            println!(
                "== t={t}s: disabling node 01 (its in-flight requests finish), forcing node 03 offline (its in-flight requests are declined at once and reversed), enabling node 02"
            );
            api.node_everywhere("01", "disable").await?;
            api.node_everywhere("03", "force-offline").await?;
            api.node_everywhere("02", "enable").await?;
            api.show().await?;
        } else if t == enable_at {
            println!(
                "== t={t}s: enabling nodes 01 and 03; reloading the config file with node 03 at weight 3"
            );
            api.node_everywhere("01", "enable").await?;
            api.node_everywhere("03", "enable").await?;
            for svc in &mut cfg.services {
                if let Some(n) = svc.back.nodes.iter_mut().find(|n| n.id == "03") {
                    n.weight = 3;
                }
            }
            files.write_config(&cfg)?;
            println!("   reload: {}", api.call("POST", "/api/v1/reload").await?);
            api.show().await?;
        } else if t == kill_at {
            println!(
                "== t={t}s: killing node 03 (its in-flight requests get declines; clients stay connected)"
            );
            nodes[2].kill().await;
            visa.kill(2).await;
            mastercard.kill(2).await;
            api.show().await?;
        } else if t == revive_at {
            println!("== t={t}s: node 03 is back (rejoins after its health checks pass)");
            nodes[2].revive(2, &pos_spec, &cups_spec).await?;
            visa.revive(2).await?;
            mastercard.revive(2).await?;
            api.show().await?;
        }
    }

    let nac_report = nac
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    for n in &nodes {
        n.stop_originating();
    }
    visa.stop_originating();
    mastercard.stop_originating();
    let settle_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < settle_until
        && (cups.outstanding() > 0
            || nodes.iter().any(|n| n.outstanding() > 0)
            || visa.outstanding() > 0
            || mastercard.outstanding() > 0)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    settle_reversals(&nodes, &pos).await;
    let rows = [
        visa.row(&visa_svc),
        mastercard.row(&mastercard_svc),
        integrity_row(&nodes, &pos, &cups.report()),
    ];
    let mut ok = summary(&nodes, &services, &nac_report, &cups.report(), &rows);
    if let (Some(a), Some(t)) = (&atm, atm_task) {
        let report = t.await.map_err(|e| e.to_string())??;
        ok &= a.summary(&switch, &report);
    }
    // The journal is on by default: what the switch did, to reconcile.
    let db = files.data_dir.join(crate::store::config::DEFAULT_FILE);
    println!("\njournal      {} (kept after the demo)", db.display());
    println!(
        "             isoswitch journal report --data-dir {}",
        files.data_dir.display()
    );
    // The switch first (it signs off its links), then its peers.
    switch.stop().await;
    cups.stop().await;
    visa.stop().await;
    mastercard.stop().await;
    if let Some(a) = atm {
        a.stop().await;
    }
    for n in &mut nodes {
        n.kill().await;
    }
    Ok(ok)
}

/// Waits (at most `LATE_BY` and a few seconds) until every late approval
/// the nodes sent has been reversed and acknowledged.
async fn settle_reversals(nodes: &[ChannelNode], pos: &Service) {
    let c = &pos.view().made.counters;
    let until = Instant::now() + LATE_BY + Duration::from_secs(5);
    while Instant::now() < until {
        let late: u64 = nodes.iter().map(ChannelNode::late_approvals).sum();
        let reversed = c.late_reversed.load(Ordering::Relaxed);
        let acked = c.reversals_acknowledged.load(Ordering::Relaxed);
        if reversed >= late && acked >= reversed {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Points the embedded config at the demo's nodes and free ports.
fn place(cfg: &mut Config, nodes: &[ChannelNode], peer_accept: SocketAddr) -> Result<(), String> {
    let any: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
    for svc in &mut cfg.services {
        let pos = matches!(svc.front, FrontConfig::Listen(_));
        for (node, n) in svc.back.nodes.iter_mut().zip(nodes) {
            node.address = if pos { n.pos_addr } else { n.cups_addr };
        }
        match &mut svc.front {
            FrontConfig::Listen(l) => l.listen = any,
            FrontConfig::Simplex(s) => {
                s.listen = any;
                s.connect = peer_accept;
            }
            FrontConfig::Connect(c) => c.connect = peer_accept,
        }
    }
    Ok(())
}

fn free_port() -> Result<SocketAddr, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map_err(|e| e.to_string())
}

async fn wait_ready(pos: &Service, unionpay: &Service) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let nodes_up = [pos, unionpay]
            .iter()
            .all(|s| s.view().pool.nodes().iter().all(|n| n.live_conns() > 0));
        let links = unionpay.view().side.out_links().map_or((0, 0), |l| l.up());
        if nodes_up && links.1 == 8 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not ready after 10 s: nodes up {nodes_up}, UnionPay links {links:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The admin API as the demo's operator uses it.
struct DemoApi {
    base: String,
    token: String,
}

impl DemoApi {
    async fn call(&self, method: &str, path: &str) -> Result<String, String> {
        let (status, body) = super::ctl::request(&self.base, method, path, Some(&self.token), None)
            .await
            .map_err(|e| e.to_string())?;
        if !(200..300).contains(&status) {
            return Err(format!("{method} {path}: HTTP {status}: {body}"));
        }
        Ok(body)
    }

    /// The same node action on both services (a channel node serves both).
    async fn node_everywhere(&self, node: &str, action: &str) -> Result<(), String> {
        for service in ["pos", "unionpay"] {
            self.call(
                "POST",
                &format!("/api/v1/services/{service}/nodes/{node}/{action}"),
            )
            .await?;
        }
        Ok(())
    }

    async fn show(&self) -> Result<(), String> {
        let text = self.call("GET", "/api/v1/status").await?;
        let status = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        print!("{}", super::ctl::status_table(&status));
        Ok(())
    }
}
