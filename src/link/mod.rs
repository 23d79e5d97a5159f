//! Tokio I/O: listeners, node connections, writer tasks, health checks. Thin: it
//! reads frames, asks the service (and through it `route/`) where they go, and
//! writes them.

pub mod client;
pub mod decline;
pub mod front;
pub mod log_limit;
pub mod netmgmt;
pub mod node;
pub mod oneconnect;
pub mod pool;
pub mod service;
pub mod simplex;
pub mod timer;
pub mod writer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::ops::config::{CheckKind, FrontConfig};
pub use service::Service;

/// How often expired requests are swept and declined. Bounds how late a timeout
/// decline can be.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(10);

/// A started service: its shared state and the address its front listens on
/// (for a simplex front, where the peer's in links connect).
pub struct Running {
    pub service: Arc<Service>,
    pub front_addr: std::net::SocketAddr,
}

/// Binds the front, then spawns the front, the node connections, the sweeper and
/// the health checks of `service` into `tasks`.
pub async fn start(
    service: Arc<Service>,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) -> std::io::Result<Running> {
    let front_addr = match service.config.front.clone() {
        FrontConfig::Listen(front) => {
            let listener = front::bind(&front).await?;
            let addr = listener.local_addr()?;
            tasks.spawn(front::serve(
                Arc::clone(&service),
                front,
                listener,
                shutdown.clone(),
            ));
            addr
        }
        FrontConfig::Simplex(front) => {
            simplex::start(Arc::clone(&service), front, tasks, shutdown).await?
        }
        front @ FrontConfig::Connect(_) => {
            let set = front
                .link_set()
                .ok_or_else(|| std::io::Error::other("a connect front has a link set"))?;
            simplex::start_connect(Arc::clone(&service), set, tasks, shutdown)
        }
    };
    if let Some(oc) = &service.oneconnect {
        // Connections open on demand, one request at a time each.
        oneconnect::start(&service, oc, tasks, shutdown);
        tasks.spawn(sweep(Arc::clone(&service), shutdown.clone()));
        return Ok(Running {
            service,
            front_addr,
        });
    }
    for node in 0..service.pool.nodes().len() {
        for slot in 0..service.config.back.connections_per_node {
            tasks.spawn(node::keep_connected(
                Arc::clone(&service),
                node,
                slot,
                shutdown.clone(),
            ));
        }
        tasks.spawn(check_health(Arc::clone(&service), node, shutdown.clone()));
    }
    tasks.spawn(sweep(Arc::clone(&service), shutdown.clone()));
    Ok(Running {
        service,
        front_addr,
    })
}

async fn sweep(service: Arc<Service>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut scratch = Vec::new();
    let mut last_flush = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                service.expire(now, &mut scratch);
                if now.saturating_duration_since(last_flush) >= Duration::from_secs(1) {
                    // Say how many warnings a burst that stopped suppressed.
                    service.log_limit.flush(now);
                    last_flush = now;
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Active health checks of one node: a TCP connect or the spec's echo test.
async fn check_health(service: Arc<Service>, node: usize, mut shutdown: watch::Receiver<bool>) {
    let cfg = service.config.back.health.clone();
    if cfg.check == CheckKind::None {
        return;
    }
    let Some(addr) = service.pool.node(node).map(|n| n.config.address) else {
        return;
    };
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let ok = match cfg.check {
            CheckKind::Tcp => matches!(
                tokio::time::timeout(cfg.timeout, tokio::net::TcpStream::connect(addr)).await,
                Ok(Ok(_))
            ),
            CheckKind::Echo => match service.send_echo(node, Instant::now(), cfg.timeout) {
                // The sweeper drops the waiter at the deadline: Err = no echo.
                Some(rx) => rx.await.is_ok(),
                None => false,
            },
            CheckKind::None => return,
        };
        service.pool.record_check(node, ok, Instant::now());
    }
}
