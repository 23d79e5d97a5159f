//! `isoswitch load` end to end: the binary against an in-process channel node.

use isoswitch::iso8583::SpecFiles;
use std::net::SocketAddr;
use std::sync::Arc;

use isoswitch::iso8583::Spec;
use isoswitch::sim::node::{NodeSim, NodeSimConfig};

async fn load(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
        .arg("load")
        .args(args)
        .env("ISOSWITCH_LOG", "warn")
        .output()
        .await
        .expect("the isoswitch binary runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_reports_json_against_a_node() {
    let spec = Arc::new(Spec::resolve("cups").unwrap());
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let node = NodeSim::start(any, spec, NodeSimConfig::new("01"))
        .await
        .unwrap();
    let target = node.addr.to_string();
    let out = load(&[
        "--target",
        &target,
        "--spec",
        "cups",
        "--clients",
        "4",
        "--in-flight",
        "2",
        "--duration",
        "1s",
        "--json",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}\nstdout {stdout}\nstderr {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Not a terminal: no progress line.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON report");
    assert!(report["answered"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["timeouts"].as_u64(), Some(0), "{report}");
    assert_eq!(report["mismatches"].as_u64(), Some(0), "{report}");
    assert!(report["throughput_per_s"].as_f64().unwrap() > 0.0);
    assert!(report["latency_us"]["p99"].as_u64().unwrap() > 0);
    let requests = report["requests"].as_u64().unwrap();
    assert_eq!(
        requests,
        report["answered"].as_u64().unwrap() + report["declined"].as_u64().unwrap()
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_fails_when_requests_time_out() {
    // A node that answers nothing: every request times out, exit status 1.
    let spec = Arc::new(Spec::resolve("cups").unwrap());
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut cfg = NodeSimConfig::new("01");
    cfg.fail_rate = 1.0;
    let node = NodeSim::start(any, spec, cfg).await.unwrap();
    let target = node.addr.to_string();
    let out = load(&[
        "--target",
        &target,
        "--spec",
        "cups",
        "--clients",
        "1",
        "--in-flight",
        "1",
        "--duration",
        "300ms",
        "--timeout",
        "200ms",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("timeouts ") && !stdout.contains("timeouts 0"),
        "{stdout}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_names_an_unreachable_target() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let out = load(&["--target", &addr, "--spec", "cups", "--duration", "100ms"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_list_spreads_the_clients_over_the_nodes() {
    // Five clients over three nodes in turn: 2, 2 and 1 connections, and
    // every node answers some of the load.
    let spec = Arc::new(Spec::resolve("cups").unwrap());
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut nodes = Vec::new();
    for id in ["01", "02", "03"] {
        let node = NodeSim::start(any, spec.clone(), NodeSimConfig::new(id))
            .await
            .unwrap();
        nodes.push(node);
    }
    let targets = nodes
        .iter()
        .map(|n| n.addr.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let args = [
        "--target",
        &targets,
        "--spec",
        "cups",
        "--clients",
        "5",
        "--in-flight",
        "1",
        "--duration",
        "500ms",
        "--json",
    ];
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), load(&args))
        .await
        .expect("the load run ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON report");
    assert_eq!(report["connects"].as_u64(), Some(5), "{report}");
    let connections: Vec<u64> = nodes
        .iter()
        .map(|n| {
            n.stats
                .connections
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .collect();
    assert_eq!(connections, [2, 2, 1]);
    let answered: u64 = nodes
        .iter()
        .map(|n| {
            let a = n.stats.answered.load(std::sync::atomic::Ordering::Relaxed);
            assert!(a > 0, "node {} answered nothing", n.addr);
            a
        })
        .sum();
    assert_eq!(Some(answered), report["requests"].as_u64(), "{report}");
    for n in nodes {
        n.stop().await;
    }
}
