//! End-to-end: operating a live switch through its admin API, under NAC load,
//! over real sockets on 127.0.0.1.

mod api;
#[path = "../common/mod.rs"]
mod common;
mod ctl;
mod reload;
mod roles;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use isoswitch::cli::ctl::request;
use isoswitch::config::{AdminConfig, Config};
use isoswitch::iso8583::Spec;
use isoswitch::ops::run::Switch;
use isoswitch::ops::status::{ConnectionView, Status};
use isoswitch::route::DeclineReason;
use isoswitch::sim::nac::{self, NacReport, NacSimConfig};
use isoswitch::sim::node::{Delay, NodeSim, NodeSimConfig};

const TOKEN: &str = "test-token-0123456789abcdef";
/// Every test's own deadline.
const TEST_LIMIT: Duration = Duration::from_secs(60);

/// A temp file unique to this test process and `name`.
fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("isoswitch-admin-{}-{name}", std::process::id()));
    write_secret(&path, text);
    path
}

fn admin_config(test: &str) -> AdminConfig {
    AdminConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        token_file: Some(temp_file(&format!("{test}.token"), &format!("{TOKEN}\n"))),
        // Tests here refuse tokens on purpose, many from one address; the
        // lockout has its own test (tests/admin_flood.rs).
        max_refused_tokens: 1_000_000,
        ..AdminConfig::default()
    }
}

struct Api {
    base: String,
}

impl Api {
    fn of(switch: &Switch) -> Api {
        Api {
            base: format!("http://{}", switch.admin_addr().expect("admin listener")),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<String>) -> (u16, String) {
        request(&self.base, method, path, Some(TOKEN), body)
            .await
            .expect("admin API reachable")
    }

    async fn ok(&self, method: &str, path: &str, body: Option<String>) -> String {
        let (status, text) = self.call(method, path, body).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {text}"
        );
        text
    }

    async fn status(&self) -> Status {
        serde_json::from_str(&self.ok("GET", "/api/v1/status", None).await).unwrap()
    }

    async fn connection_ids(&self) -> Vec<u64> {
        let rows: Vec<ConnectionView> =
            serde_json::from_str(&self.ok("GET", "/api/v1/connections", None).await).unwrap();
        let mut ids: Vec<u64> = rows.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids
    }

    async fn node(&self, node: &str, action: &str) {
        self.ok(
            "POST",
            &format!("/api/v1/services/svc/nodes/{node}/{action}"),
            None,
        )
        .await;
    }
}

async fn node_sim(spec: &Arc<Spec>, id: &str, delay: Delay) -> NodeSim {
    let cfg = NodeSimConfig {
        id: id.into(),
        delay,
        fail_rate: 0.0,
        originate: None,
    };
    NodeSim::start("127.0.0.1:0".parse().unwrap(), Arc::clone(spec), cfg)
        .await
        .expect("node starts")
}

/// `n` nodes answering after `delay` behind a `cup-pos` listen service with
/// the admin API on (its token file named after `test`).
async fn admin_rig(
    spec: &Arc<Spec>,
    n: usize,
    delay: Delay,
    test: &str,
) -> (Vec<NodeSim>, isoswitch::ops::run::Switch) {
    let nodes = start_nodes(spec, n, delay).await;
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let mut cfg = Rig::on("cup-pos").config(&addrs);
    cfg.admin = Some(admin_config(test));
    let switch = start_switch(&cfg).await;
    (nodes, switch)
}

fn nac_load(
    spec: &Arc<Spec>,
    target: SocketAddr,
    seconds: u64,
) -> tokio::task::JoinHandle<NacReport> {
    let spec = Arc::clone(spec);
    tokio::spawn(async move {
        nac::run(
            spec,
            NacSimConfig {
                target,
                nac_id: 1,
                uplinks: 2,
                terminals: 100,
                rate: Some(300.0),
                duration: Duration::from_secs(seconds),
                timeout: Duration::from_secs(5),
            },
        )
        .await
        .expect("NAC runs")
    })
}

fn requests_of(node: &NodeSim) -> u64 {
    node.stats.requests.load(Ordering::Relaxed)
}

/// The value of the sample `name{labels}` in a Prometheus exposition.
fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name_and_labels} in\n{text}"))
}

fn file_config(
    nodes: &[SocketAddr],
    weight_02: u32,
    listen: &str,
    token_file: &std::path::Path,
) -> String {
    let mut toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n\
         [[service]]\nname = \"svc\"\nspec = \"cup-pos\"\n\
         [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
         [service.back]\nalgorithm = \"weighted\"\n",
        token_file.display()
    );
    for (i, addr) in nodes.iter().enumerate() {
        let weight = if i == 1 { weight_02 } else { 1 };
        toml.push_str(&format!(
            "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{addr}\"\nweight = {weight}\n",
            i + 1
        ));
    }
    toml
}
