//! Tokio I/O: listeners, node connections, writer tasks, health checks. Thin: it
//! reads frames, asks the service (and through it `route/`) where they go, and
//! writes them.

pub mod back;
pub mod decline;
pub mod front;
#[cfg(feature = "tools")]
#[doc(hidden)]
pub mod inproc;
pub mod io;
pub mod log_limit;
pub mod netmgmt;
pub mod saf;
pub mod service;
pub mod supervisor;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::link::supervisor::Supervisor;

use crate::config::{CheckKind, FrontConfig};
pub use service::Service;

/// How often expired requests are swept and declined. Bounds how late a timeout
/// decline can be.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(10);

/// A started service: its shared state and the address its front listens on
/// (for a simplex front, where the peer's in links connect).
#[derive(Clone)]
pub struct Running {
    pub service: Arc<Service>,
    pub front_addr: std::net::SocketAddr,
}

/// Binds the front, then starts the front, the node connections, the sweeper
/// and the health checks of `service` under `sup`. Each task is named
/// `SERVICE/accept`, `SERVICE/sweeper`, `SERVICE/node/INDEX/conn/SLOT`,
/// `SERVICE/node/INDEX/health` (for [`Supervisor::kill`]); link-set tasks
/// (simplex, connect fronts) are watched as `SERVICE/links`.
pub async fn start(service: Arc<Service>, sup: &Arc<Supervisor>) -> std::io::Result<Running> {
    let name = service.name().to_string();
    let shutdown = sup.shutdown();
    let front_addr = match service.config.front.clone() {
        FrontConfig::Listen(front) => {
            let listener = front::listen::bind(&front).await?;
            let addr = listener.local_addr()?;
            start_accept(sup, &service, front, listener, addr);
            addr
        }
        FrontConfig::Simplex(front) => {
            let mut set = JoinSet::new();
            let addr =
                front::simplex::start(Arc::clone(&service), front, &mut set, &shutdown).await?;
            sup.watch_set(format!("{name}/links"), set);
            addr
        }
        front @ FrontConfig::Connect(_) => {
            let set = front
                .link_set()
                .ok_or_else(|| std::io::Error::other("a connect front has a link set"))?;
            let mut tasks = JoinSet::new();
            let addr =
                front::duplex::start_connect(Arc::clone(&service), set, &mut tasks, &shutdown);
            sup.watch_set(format!("{name}/links"), tasks);
            addr
        }
    };
    if let Some(oc) = service.side.oneconnect() {
        // Connections open on demand, one request at a time each; the pool's
        // health checks and maintenance cannot restart one by one.
        let mut set = JoinSet::new();
        front::oneconnect::start(&service, oc, &mut set, &shutdown);
        sup.watch_set(format!("{name}/oneconnect"), set);
    } else {
        // Nodes removed before the start (the operators' runtime state) stay
        // unconnected.
        for (node, n) in service.pool.nodes().iter().enumerate() {
            if !n.is_removed() {
                start_node(sup, &service, node);
            }
        }
    }
    let svc = Arc::clone(&service);
    let stop = shutdown.clone();
    sup.spawn_critical(format!("{name}/sweeper"), sup.token(), move || {
        sweep(Arc::clone(&svc), stop.clone())
    });
    Ok(Running {
        service,
        front_addr,
    })
}

/// The accept loop of a listen front. A restarted loop binds the address the
/// first one had (port 0 resolved); client links are tasks of their own and
/// survive it.
fn start_accept(
    sup: &Arc<Supervisor>,
    service: &Arc<Service>,
    front: crate::config::ListenFront,
    listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
) {
    let first = Arc::new(std::sync::Mutex::new(Some(listener)));
    let svc = Arc::clone(service);
    let stop = sup.shutdown();
    sup.spawn_critical(format!("{}/accept", service.name()), sup.token(), move || {
        let listener = first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (svc, front, stop) = (Arc::clone(&svc), front.clone(), stop.clone());
        async move {
            let listener = match listener {
                Some(l) => l,
                None => match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(service = svc.name(), %addr, error = %e, "cannot listen again");
                        return;
                    }
                },
            };
            front::listen::serve(svc, front, listener, stop).await;
        }
    });
}

/// Starts the connections and health check of node `node` in their own scope
/// (`SERVICE/node/INDEX`), which removing the node ends.
pub fn start_node(sup: &Arc<Supervisor>, service: &Arc<Service>, node: usize) {
    let scope = node_scope(service.name(), node);
    let token = sup.scope_token(&scope);
    let stop = sup.watch_of(token.clone());
    for slot in 0..service.config.back.connections_per_node {
        let (svc, st) = (Arc::clone(service), stop.clone());
        sup.spawn_critical(format!("{scope}/conn/{slot}"), token.clone(), move || {
            back::node::keep_connected(Arc::clone(&svc), node, slot, st.clone())
        });
    }
    let check = service.config.back.health.check;
    if check != CheckKind::None {
        let (svc, st) = (Arc::clone(service), stop.clone());
        sup.spawn_critical(format!("{scope}/health"), token, move || {
            let (svc, st) = (Arc::clone(&svc), st.clone());
            async move {
                match check {
                    CheckKind::Tcp => {
                        back::health::run(svc, node, back::health::TcpConnect, st).await
                    }
                    CheckKind::Echo => {
                        back::health::run(svc, node, back::health::EchoOnKeptConnection, st).await
                    }
                    CheckKind::None => {}
                }
            }
        });
    }
}

/// The supervisor scope of a node's tasks.
pub fn node_scope(service: &str, node: usize) -> String {
    format!("{service}/node/{node}")
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
                    service.links.log_limit.flush(now);
                    // Forget late and repeat records past their windows.
                    service.made.sweep(now);
                    last_flush = now;
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}
