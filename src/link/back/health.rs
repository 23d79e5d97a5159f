//! Active health checks: one runner for every kind of pool, over a [`Probe`]
//! that says how one node is checked once (as pingora keeps one background
//! health-check service over its `HealthCheck` trait).
//!
//! The runner owns the timing: a tick every `interval` (as last reloaded),
//! a deadline of `timeout` per check, the verdict recorded in the pool. A
//! probe owns only the check itself:
//!
//! | check | multiplex pool | OneConnect pool |
//! |---|---|---|
//! | `tcp` | a TCP connect to the node | the same, through the pool's connector |
//! | `echo` | the spec's echo test on a kept connection, registered like a request | an echo test on a pooled connection, one at a time like any request |
//! | `none` | no runner is started | the same |

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use crate::config::CheckKind;
use crate::link::Service;
use crate::link::io::writer::Outbound;
use crate::link::netmgmt::NmKind;
use crate::link::service::{Origin, Pending};
use crate::route::OnTimeout;

/// One way to check a node once.
pub trait Probe: Send + Sync + 'static {
    /// Checks `node` of `service` before `deadline`: `Some(true)` up,
    /// `Some(false)` down, `None` no verdict this round (e.g. every
    /// connection of a OneConnect node is busy carrying requests: it is
    /// evidently answering).
    fn check(
        &self,
        service: &Service,
        node: usize,
        deadline: Instant,
    ) -> impl Future<Output = Option<bool>> + Send;
}

/// A TCP connect to the node's address.
pub struct TcpConnect;

impl Probe for TcpConnect {
    async fn check(&self, service: &Service, node: usize, deadline: Instant) -> Option<bool> {
        let addr = service.pool.node(node)?.config.address;
        let wait = deadline.saturating_duration_since(Instant::now());
        let connected = tokio::time::timeout(wait, tokio::net::TcpStream::connect(addr)).await;
        Some(matches!(connected, Ok(Ok(_))))
    }
}

/// The spec's echo test on one of the node's kept connections; its answer
/// comes back through the correlator.
pub struct EchoOnKeptConnection;

impl Probe for EchoOnKeptConnection {
    async fn check(&self, service: &Service, node: usize, deadline: Instant) -> Option<bool> {
        Some(match send_echo(service, node, Instant::now(), deadline) {
            // The sweeper drops the waiter at the deadline: Err = no echo.
            Some(rx) => rx.await.is_ok(),
            None => false,
        })
    }
}

/// Sends an echo test to `node` over one of its connections and registers
/// it in the correlation table like a request, until `deadline`. The
/// receiver fires when the echo response arrives; it is dropped at the
/// deadline or when the connection is lost.
fn send_echo(
    service: &Service,
    node: usize,
    now: Instant,
    deadline: Instant,
) -> Option<oneshot::Receiver<()>> {
    let conn = service.pool.node(node)?.live_conn()?;
    let stan = service.made.next_stan();
    let payload = service
        .made
        .network_request(service.spec(), NmKind::Echo, stan)
        .ok()?;
    let checked = service.check(payload.clone()).ok()?;
    let key = service.router.key_of(&checked).ok()?;
    let (tx, rx) = oneshot::channel();
    let pending = Pending {
        origin: Origin::Check(tx),
        request: payload.clone(),
        facts: crate::link::service::RequestFacts::own(checked.msg.mti()),
        node,
        sent_at: now,
        on_timeout: OnTimeout::Silent,
        same: Default::default(),
    };
    service
        .in_flight
        .insert(key, pending, conn.id, deadline)
        .ok()?;
    conn.tx.try_send(Outbound::message(payload)).ok()?;
    Some(rx)
}

/// A health-check ticker: the first tick after one period (the caller has
/// just checked, or just started).
pub(crate) fn check_ticker(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// Checks `node` with `probe` every `interval` until `shutdown`, recording
/// each verdict in the pool. Interval and timeout are read again before
/// each check, so a reload applies from the next one.
pub async fn run<P: Probe>(
    service: Arc<Service>,
    node: usize,
    probe: P,
    mut shutdown: watch::Receiver<bool>,
) {
    if service.config.back.health.check == CheckKind::None {
        return;
    }
    let mut tick = check_ticker(service.live().check_interval);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let (interval, timeout) = (service.live().check_interval, service.live().check_timeout);
        if tick.period() != interval {
            tick = check_ticker(interval);
        }
        let deadline = Instant::now() + timeout;
        if let Some(ok) = probe.check(&service, node, deadline).await {
            service.pool.record_check(node, ok, Instant::now());
        }
    }
}
