//! OneConnect pools (`mode = "oneconnect"` on a `listen` front): for nodes and
//! dialects that echo no usable key. Each node connection carries ONE request
//! at a time, so its next frame is that request's answer and no correlation
//! key is needed. Up to `connections_per_node` connections per node open on
//! demand, are reused for the next request, and close after an idle timeout.
//!
//! Each request is carried by its own task, owned by the pool's [`JoinSet`]:
//! it waits (until the request's deadline) for a free connection on an eligible
//! node, writes the request, reads the one answer and hands it to the client
//! that sent it. The task does not depend on the client: if the client has
//! gone, the answer is counted and dropped, and the connection goes back to
//! the pool clean. A connection whose request passed its deadline unanswered
//! is closed, never reused (its late answer would reach the next client).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;

use super::admission::client::ClientLink;
use crate::config::CheckKind;
use crate::link::back::health::{self, Probe};
use crate::link::back::oneconnect_pool::{Carrying, PooledConn};
pub use crate::link::back::oneconnect_pool::{OneConnect, OneConnectCounters};
use crate::link::back::pool::Picked;
use crate::link::io::writer::{Outbound, Patch, encode_into};
use crate::link::netmgmt::NmKind;
use crate::link::service::{Checked, Invalid, Origin, Service};
use crate::route::oneconnect::Lease;
use crate::route::{DeclineReason, OnTimeout};
use crate::wire::{Frame, FrameCodec};

/// Why an exchange on a connection ended without an answer.
enum Failed {
    Deadline,
    Broken(String),
}

impl OneConnect {
    /// The pool's part of a service's stats line: per node, connections open
    /// and idle; then what the pool did.
    pub fn stats_line(&self, service: &Service) -> String {
        let c = &service.counters.oneconnect;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let nodes: Vec<String> = service
            .pool
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{}:{}/{}idle", n.config.id, self.open(i), self.idle(i)))
            .collect();
        format!(
            " oneconnect [{}] opened {} reused {} waited {} wait_timeouts {} closed idle/deadline/broken {}/{}/{} connect_failures {} answers_dropped {}",
            nodes.join(" "),
            get(&c.opened),
            get(&c.reused),
            get(&c.waited),
            get(&c.wait_timeouts),
            get(&c.closed_idle),
            get(&c.closed_deadline),
            get(&c.closed_broken),
            get(&c.connect_failures),
            get(&c.answers_dropped),
        )
    }

    fn release(&self, node: usize, conn: PooledConn) {
        self.slots().release(node, conn, Instant::now());
        self.freed.notify_waiters();
    }

    fn close(&self, service: &Service, node: usize) {
        self.slots().closed(node);
        self.freed.notify_waiters();
        if let Some(n) = service.pool.node(node) {
            n.counters.disconnects.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Starts the pool's background work: marks the nodes reachable (connections
/// open on demand) and spawns [`maintain`] and, when configured, the checks.
/// Every task spawned here runs until shutdown: the supervisor takes an
/// earlier end for a crash, so a check that is not configured is not started
/// (the check kind takes a restart to change).
pub fn start(
    service: &Arc<Service>,
    oc: &Arc<OneConnect>,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) {
    let now = Instant::now();
    let checked = service.config.back.health.check != CheckKind::None;
    for node in 0..service.pool.nodes().len() {
        service.pool.set_reachable(node, true, now);
        if !checked {
            continue;
        }
        let (svc, stop) = (Arc::clone(service), shutdown.clone());
        match service.config.back.health.check {
            CheckKind::Tcp => tasks.spawn(health::run(svc, node, ConnectThroughPool, stop)),
            CheckKind::Echo => {
                let probe = EchoOnPooledConnection(Arc::clone(oc));
                tasks.spawn(health::run(svc, node, probe, stop))
            }
            CheckKind::None => continue,
        };
    }
    tasks.spawn(maintain(
        Arc::clone(service),
        Arc::clone(oc),
        shutdown.clone(),
    ));
}

/// A request from a front client in `oneconnect` mode: validated here, carried
/// by its own task. Returns false when the client must be closed.
pub fn on_request(
    service: &Arc<Service>,
    oc: &Arc<OneConnect>,
    client: &ClientLink,
    payload: Bytes,
    now: Instant,
) -> bool {
    // Validated in full like every request, but no key field is required:
    // the answer is the one the pool connection carries next.
    let mti = match check_request(service, payload.clone()) {
        Ok(mti) => mti,
        Err(why) => return service.bad_request(client, &payload, &why, now),
    };
    service.counters.requests.fetch_add(1, Ordering::Relaxed);
    let Some(slot) = client.take_slot() else {
        service.counters.over_share.fetch_add(1, Ordering::Relaxed);
        let origin = Origin::Client {
            conn: client.conn,
            tx: client.tx.clone(),
            slot: None,
        };
        service.decline(origin, &payload, DeclineReason::QueueFull);
        return true;
    };
    let origin = Origin::Client {
        conn: client.conn,
        tx: client.tx.clone(),
        slot: Some(slot),
    };
    if service.links.is_draining() {
        service.decline(origin, &payload, DeclineReason::Shutdown);
        return true;
    }
    // A timed-out request's pooled connection is closed, so its late answer
    // is never read: the host's own timeout handling applies (docs/integrity.md).
    let deadline = now + service.live().timeouts.of(&mti).after;
    oc.carrying.fetch_add(1, Ordering::Relaxed);
    let carrying = Carrying(Arc::clone(oc));
    let task = carry(
        Arc::clone(service),
        Arc::clone(oc),
        payload,
        origin,
        now,
        deadline,
    );
    oc.tasks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .spawn(async move {
            task.await;
            drop(carrying);
        });
    true
}

/// One attempt of a message the switch owes (a reversal, a stored advice)
/// on a OneConnect service: carried like a request, on a pool connection
/// to node `only` (or any), by a task of the pool; its answer completes the
/// store entry, none schedules the next attempt. `wait` bounds the
/// exchange (the MTI's timeout, at most half the entry's lease).
pub fn send_owed(
    service: &Arc<Service>,
    oc: &Arc<OneConnect>,
    entry: &crate::store::ClaimedSaf,
    payload: Bytes,
    only: Option<usize>,
    wait: Duration,
) {
    let owed = (entry.id, entry.kind, entry.attempt, entry.expires_at);
    oc.carrying.fetch_add(1, Ordering::Relaxed);
    let carrying = Carrying(Arc::clone(oc));
    let (service, pool) = (Arc::clone(service), Arc::clone(oc));
    let deadline = Instant::now() + wait;
    oc.tasks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .spawn(async move {
            carry_owed(service, pool, payload, owed, only, deadline).await;
            drop(carrying);
        });
}

type Owed = (crate::store::SafId, crate::store::SafKind, u32, i64);

async fn carry_owed(
    service: Arc<Service>,
    oc: Arc<OneConnect>,
    payload: Bytes,
    owed: Owed,
    only: Option<usize>,
    deadline: Instant,
) {
    let (id, _, attempt, expires_at) = owed;
    let failed = |reason| {
        service
            .owed()
            .attempt_failed(id, attempt, expires_at, reason)
    };
    let Ok(msg) = service.check(payload.clone()) else {
        return failed(DeclineReason::BadMessage);
    };
    let (picked, conn) = match lease(&service, &oc, &msg, deadline, only).await {
        Ok(leased) => leased,
        Err(reason) => return failed(reason),
    };
    let node = picked.node();
    // An owed message is not the node's load to balance.
    drop(picked);
    let expected = response_mti(&msg.msg.mti().digits());
    match exchange(
        &service,
        conn,
        &payload,
        Patch::default(),
        expected,
        deadline,
    )
    .await
    {
        Ok((conn, response)) => {
            oc.release(node, conn);
            match crate::iso8583::Message::parse(service.spec(), response) {
                Ok(answer) => service.owed().answered(owed, &answer),
                Err(_) => failed(DeclineReason::BadMessage),
            }
        }
        Err(f) => {
            oc.close(&service, node);
            failed(match f {
                Failed::Deadline => DeclineReason::Timeout,
                Failed::Broken(_) => DeclineReason::NodeLost,
            });
        }
    }
}

/// Ingress validation of a OneConnect request: no key field is required,
/// since the answer is whatever the request's pool connection carries next.
fn check_request(service: &Service, payload: Bytes) -> Result<[u8; 4], Invalid> {
    let checked = service.check(payload)?;
    let mti = checked.msg.mti();
    if !mti.is_request() {
        return Err(Invalid::NotARequest(mti));
    }
    service.router.check_accepted(&checked)?;
    Ok(mti.digits())
}

/// Picks a node for `req` (rules, sticky key, algorithm) among those
/// `usable` accepts, as the keyed path picks.
fn pick<'s>(
    service: &'s Service,
    req: &Checked<'_>,
    now: Instant,
    usable: impl Fn(usize) -> bool,
) -> Result<Picked<'s>, crate::link::back::pool::PickError> {
    let mti = req.msg.mti().digits();
    let texts = service.router.rule_texts(req);
    let sticky = service.router.sticky_key(req);
    service
        .pool
        .pick_where(&mti, |id| texts.get(id), sticky, now, usable)
}

/// True if some node `usable` accepts could take `req` now.
fn any_eligible(
    service: &Service,
    req: &Checked<'_>,
    now: Instant,
    usable: impl Fn(usize) -> bool,
) -> bool {
    let mti = req.msg.mti().digits();
    let texts = service.router.rule_texts(req);
    service
        .pool
        .any_eligible(&mti, |id| texts.get(id), now, usable)
}

/// Carries one request: a connection, the write, the one answer.
async fn carry(
    service: Arc<Service>,
    oc: Arc<OneConnect>,
    request: Bytes,
    origin: Origin,
    start: Instant,
    deadline: Instant,
) {
    let Ok(msg) = service.check(request.clone()) else {
        return; // validated once already by on_request
    };
    let (picked, conn) = match lease(&service, &oc, &msg, deadline, None).await {
        Ok(leased) => leased,
        Err(reason) => {
            service.decline(origin, &request, reason);
            return;
        }
    };
    let node = picked.node();
    let patch = match service.stamp_patch(&msg, node) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(service = service.name(), error = %e, "F37 stamp failed");
            drop(picked);
            oc.release(node, conn);
            service.decline(origin, &request, DeclineReason::NoHealthyNode);
            return;
        }
    };
    let expected = response_mti(&msg.msg.mti().digits());
    match exchange(&service, conn, &request, patch, expected, deadline).await {
        Ok((conn, response)) => {
            let now = Instant::now();
            picked.finished(true, now.saturating_duration_since(start), now);
            service.counters.answered.fetch_add(1, Ordering::Relaxed);
            oc.release(node, conn);
            if !deliver(&service, &oc, origin, &request, response.clone()) {
                crate::link::service::oneconnect_undelivered(&service, &request, node, &response);
            }
        }
        Err(failed) => {
            let now = Instant::now();
            picked.finished(false, now.saturating_duration_since(start), now);
            let reason = match failed {
                Failed::Deadline => {
                    oc.counters(&service)
                        .closed_deadline
                        .fetch_add(1, Ordering::Relaxed);
                    DeclineReason::Timeout
                }
                Failed::Broken(why) => {
                    oc.counters(&service)
                        .closed_broken
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(service = service.name(), node, reason = %why, "oneconnect node connection closed");
                    DeclineReason::NodeLost
                }
            };
            oc.close(&service, node);
            // The request went out: the host may have approved it.
            crate::link::service::oneconnect_unknown(&service, &request, node, reason);
            let timeout = service.live().timeouts.of(&msg.msg.mti().digits());
            if reason == DeclineReason::Timeout && timeout.action == OnTimeout::Silent {
                // The sender's own timer decides, as on any front.
                service
                    .made
                    .counters
                    .silent_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            service.decline(origin, &request, reason);
        }
    }
}

impl OneConnect {
    fn counters<'s>(&self, service: &'s Service) -> &'s OneConnectCounters {
        &service.counters.oneconnect
    }
}

/// Hands the answer to the client that sent the request, or counts it
/// dropped (false: the client never got it).
fn deliver(
    service: &Service,
    oc: &OneConnect,
    origin: Origin,
    request: &[u8],
    response: Bytes,
) -> bool {
    let Origin::Client { conn, tx, slot } = origin else {
        return true;
    };
    drop(slot); // free before the client can read the answer
    let patch = service.router.response_tpdu_patch(request);
    if tx.try_send(Outbound::Message(response, patch)).is_err() {
        service
            .counters
            .undeliverable
            .fetch_add(1, Ordering::Relaxed);
        oc.counters(service)
            .answers_dropped
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            service = service.name(),
            conn,
            "client gone before its answer: answer dropped"
        );
        return false;
    }
    true
}

/// A connection for `msg` on a node the balancer picks among those with room,
/// waiting for one to free up until `deadline`; else the decline reason.
async fn lease<'s>(
    service: &'s Service,
    oc: &OneConnect,
    msg: &Checked<'_>,
    deadline: Instant,
    only: Option<usize>,
) -> Result<(Picked<'s>, PooledConn), DeclineReason> {
    let allowed = |n: usize| only.is_none_or(|o| o == n);
    let counters = oc.counters(service);
    // Nodes a connect failed to, for this request: try the others.
    let mut failed: Vec<usize> = Vec::new();
    let mut waited = false;
    loop {
        let freed = oc.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let now = Instant::now();
        let leased = {
            let mut slots = oc.slots();
            let picked = pick(service, msg, now, |n| {
                allowed(n) && !failed.contains(&n) && slots.has_room(n)
            });
            // A pick the slots cannot lease for is dropped: given back.
            picked.ok().and_then(|picked| {
                let lease = slots.lease(picked.node())?;
                Some((picked, lease))
            })
        };
        match leased {
            Some((picked, Lease::Reuse(conn))) => {
                if conn.clean() {
                    counters.reused.fetch_add(1, Ordering::Relaxed);
                    return Ok((picked, conn));
                }
                // Closed by the node while idle, or stray bytes: never reuse.
                let node = picked.node();
                drop((conn, picked));
                counters.closed_broken.fetch_add(1, Ordering::Relaxed);
                oc.close(service, node);
            }
            Some((picked, Lease::Open)) => match open(service, picked.node(), deadline).await {
                Ok(conn) => {
                    counters.opened.fetch_add(1, Ordering::Relaxed);
                    return Ok((picked, conn));
                }
                Err(e) => {
                    let node = picked.node();
                    counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(service = service.name(), node, error = %e, "oneconnect connect failed");
                    picked.finished(false, Duration::ZERO, Instant::now());
                    oc.slots().closed(node);
                    oc.freed.notify_waiters();
                    failed.push(node);
                }
            },
            None => {
                if !any_eligible(service, msg, now, |n| allowed(n) && !failed.contains(&n)) {
                    let reason = if failed.is_empty() {
                        DeclineReason::NoHealthyNode
                    } else {
                        DeclineReason::NodeLost
                    };
                    return Err(reason);
                }
                if !waited {
                    waited = true;
                    counters.waited.fetch_add(1, Ordering::Relaxed);
                }
                let until = tokio::time::Instant::from_std(deadline);
                if tokio::time::timeout_at(until, freed).await.is_err() {
                    counters.wait_timeouts.fetch_add(1, Ordering::Relaxed);
                    return Err(DeclineReason::Timeout);
                }
            }
        }
    }
}

/// Opens a new pool connection to `node`, within the connect timeout and the
/// request's deadline.
async fn open(service: &Service, node: usize, deadline: Instant) -> std::io::Result<PooledConn> {
    let addr = service
        .pool
        .node(node)
        .map(|n| n.config.address)
        .ok_or_else(|| std::io::Error::other("no such node"))?;
    let until = deadline.min(Instant::now() + service.config.back.connect_timeout);
    let stream = tokio::time::timeout_at(
        tokio::time::Instant::from_std(until),
        TcpStream::connect(addr),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    if let Some(n) = service.pool.node(node) {
        n.counters.connects.fetch_add(1, Ordering::Relaxed);
    }
    let framing = service.spec().framing();
    Ok(PooledConn {
        node,
        frames: FramedRead::new(stream, FrameCodec::new(framing.prefix, framing.max_frame)),
    })
}

/// The response MTI a request's answer carries (0200 → 0210, 0800 → 0810).
fn response_mti(request: &[u8; 4]) -> [u8; 4] {
    let mut m = *request;
    m[2] = m[2].wrapping_add(1);
    m
}

/// Writes `request` on `conn` and reads its one answer, by `deadline`. The
/// connection comes back only with an answer; on failure it is dropped
/// (closed).
async fn exchange(
    service: &Service,
    mut conn: PooledConn,
    request: &Bytes,
    patch: Patch,
    expected: [u8; 4],
    deadline: Instant,
) -> Result<(PooledConn, Bytes), Failed> {
    let until = tokio::time::Instant::from_std(deadline);
    let mut buf = BytesMut::new();
    encode_into(
        service.spec().framing().prefix,
        &Outbound::Message(request.clone(), patch),
        &mut buf,
    )
    .map_err(|e| Failed::Broken(format!("cannot frame the request: {e}")))?;
    match tokio::time::timeout_at(until, conn.frames.get_mut().write_all(&buf)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(Failed::Broken(format!("write failed: {e}"))),
        Err(_) => return Err(Failed::Deadline),
    }
    loop {
        let frame = match tokio::time::timeout_at(until, conn.frames.next()).await {
            Err(_) => return Err(Failed::Deadline),
            Ok(None) => return Err(Failed::Broken("closed by node".into())),
            Ok(Some(Err(e))) => return Err(Failed::Broken(format!("bad frame: {e}"))),
            Ok(Some(Ok(f))) => f,
        };
        let Frame::Message(payload) = frame else {
            continue; // keep-alives carry no answer
        };
        let mti = service
            .check(payload.clone())
            .map(|m| m.msg.mti().digits())
            .map_err(|e| Failed::Broken(format!("bad answer: {e}")))?;
        if mti != expected {
            // Not this request's answer: nothing on this connection can be
            // trusted to be the next client's either.
            service.counters.unexpected.fetch_add(1, Ordering::Relaxed);
            return Err(Failed::Broken(format!(
                "answer MTI {} to a {} request",
                String::from_utf8_lossy(&mti),
                String::from_utf8_lossy(&expected)
            )));
        }
        return Ok((conn, payload));
    }
}

/// Closes connections idle too long and reaps finished request tasks (a panic
/// in one is logged, not lost). At shutdown closes the idle connections and
/// waits for the requests in flight (each ends by its deadline).
pub async fn maintain(
    service: Arc<Service>,
    oc: Arc<OneConnect>,
    mut shutdown: watch::Receiver<bool>,
) {
    let period = (oc.cfg.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut expired = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => break,
        }
        oc.slots()
            .expire_idle(Instant::now(), oc.cfg.idle_timeout, &mut expired);
        close_all(&service, &oc, &mut expired, IdleClose::Timeout);
        reap(&service, &oc);
    }
    oc.slots().drain_idle(&mut expired);
    close_all(&service, &oc, &mut expired, IdleClose::Shutdown);
    let mut left = std::mem::take(&mut *oc.tasks.lock().unwrap_or_else(|p| p.into_inner()));
    while let Some(done) = left.join_next().await {
        log_task_end(&service, done);
    }
}

enum IdleClose {
    Timeout,
    Shutdown,
}

/// Closes idle connections taken out of the pool (their slots are already free).
fn close_all(service: &Service, oc: &OneConnect, conns: &mut Vec<PooledConn>, why: IdleClose) {
    for conn in conns.drain(..) {
        let node = conn.node;
        drop(conn);
        if matches!(why, IdleClose::Timeout) {
            oc.counters(service)
                .closed_idle
                .fetch_add(1, Ordering::Relaxed);
        }
        if let Some(n) = service.pool.node(node) {
            n.counters.disconnects.fetch_add(1, Ordering::Relaxed);
        }
    }
    oc.freed.notify_waiters();
}

fn reap(service: &Service, oc: &OneConnect) {
    let mut tasks = oc.tasks.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(done) = tasks.try_join_next() {
        log_task_end(service, done);
    }
}

fn log_task_end(service: &Service, done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        tracing::error!(service = service.name(), error = %e, "oneconnect request task panicked");
    }
}

/// The `tcp` check of a OneConnect node: a connect through the pool's
/// connector (as a request's connection is opened), then closed.
struct ConnectThroughPool;

impl Probe for ConnectThroughPool {
    async fn check(&self, service: &Service, node: usize, deadline: Instant) -> Option<bool> {
        Some(open(service, node, deadline).await.is_ok())
    }
}

/// The `echo` check of a OneConnect node: the spec's echo test on a pooled
/// connection, one at a time like any request. A node whose connections are
/// all busy gets no verdict this round: it is evidently answering.
struct EchoOnPooledConnection(Arc<OneConnect>);

impl Probe for EchoOnPooledConnection {
    async fn check(&self, service: &Service, node: usize, deadline: Instant) -> Option<bool> {
        echo(service, &self.0, node, deadline).await
    }
}

/// One echo test on a pool connection of `node`; `None` if all are busy.
async fn echo(service: &Service, oc: &OneConnect, node: usize, deadline: Instant) -> Option<bool> {
    let lease = oc.slots().lease(node)?;
    let conn = match lease {
        Lease::Reuse(c) if c.clean() => c,
        Lease::Reuse(_) => {
            oc.close(service, node);
            return Some(false);
        }
        Lease::Open => match open(service, node, deadline).await {
            Ok(c) => {
                oc.counters(service).opened.fetch_add(1, Ordering::Relaxed);
                c
            }
            Err(_) => {
                oc.slots().closed(node);
                oc.freed.notify_waiters();
                return Some(false);
            }
        },
    };
    let Ok(payload) =
        service
            .made
            .network_request(service.spec(), NmKind::Echo, service.made.next_stan())
    else {
        oc.release(node, conn);
        return Some(false);
    };
    let expected = service
        .check(payload.clone())
        .map(|m| response_mti(&m.msg.mti().digits()))
        .unwrap_or(*b"0810");
    match exchange(
        service,
        conn,
        &payload,
        Patch::default(),
        expected,
        deadline,
    )
    .await
    {
        Ok((conn, _)) => {
            oc.release(node, conn);
            Some(true)
        }
        Err(_) => {
            oc.close(service, node);
            Some(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_mti_is_the_request_class_plus_ten() {
        assert_eq!(&response_mti(b"0200"), b"0210");
        assert_eq!(&response_mti(b"0800"), b"0810");
        assert_eq!(&response_mti(b"0420"), b"0430");
    }
}
