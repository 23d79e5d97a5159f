//! A link set's out links, shared by the simplex and the connect fronts:
//! each link is kept connected (with backoff, TLS when configured), signed
//! on before it carries anything, echo-tested while idle, and its unwritten
//! frames handed to the other links when it dies. On a duplex link the
//! same task reads the peer's frames.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;

use super::out_links::*;
use crate::capture::{Opened, Tapped};
use crate::config::{LinkSet, SignOn};
use crate::link::back::node::Backoff;
use crate::link::io::timer::{ReadTimer, in_frame};
use crate::link::io::writer::{Outbound, run_writer_until};
use crate::link::log_limit::{LogKind, LogPeer};
use crate::link::service::Service;
use crate::wire::{Frame, FrameCodec};

pub(super) fn spawn_links(
    service: &Arc<Service>,
    set: &LinkSet,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) {
    let (rebuild, _) = watch::channel(0u64);
    let rebuild = Arc::new(rebuild);
    tasks.spawn(sweep_waiting(Arc::clone(service), shutdown.clone()));
    for link in 0..set.links {
        tasks.spawn(keep_out_link(
            Arc::clone(service),
            set.clone(),
            link,
            Arc::clone(&rebuild),
            shutdown.clone(),
        ));
    }
}

/// Lists a peer link in the service's connection table while it lives.
pub(super) fn register_link(
    service: &Service,
    stream: &TcpStream,
    kind: crate::link::io::conns::ConnKind,
) -> Option<crate::link::io::conns::Registered> {
    let (peer, local) = (stream.peer_addr().ok()?, stream.local_addr().ok()?);
    Some(
        service
            .links
            .table
            .register(service.links.next_conn_id(), kind, None, peer, local),
    )
}

pub(super) fn out_links(service: &Service) -> Option<&Arc<OutLinks>> {
    service.side.out_links()
}

/// How often frames waiting for a signed-on out link are retried and expired.
const SWEEP_EVERY: Duration = Duration::from_millis(20);

/// Retries the frames waiting for a usable out link (a writer queue may have
/// drained) and drops those past their deadline, counting them.
async fn sweep_waiting(service: Arc<Service>, mut shutdown: watch::Receiver<bool>) {
    let Some(links) = out_links(&service).cloned() else {
        return;
    };
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*shutdown.borrow() {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => continue,
        }
        let done = links.flush(Instant::now(), true);
        if done.requests_expired > 0 {
            service
                .counters
                .peer
                .node_requests_expired
                .fetch_add(done.requests_expired, Ordering::Relaxed);
        }
        if done.requests_expired + done.answers_expired > 0 {
            tracing::warn!(
                service = service.name(),
                requests = done.requests_expired,
                answers = done.answers_expired,
                "no signed-on out link within the request timeout: frames dropped"
            );
        }
    }
}

/// How long a dead out link's writer has to hand back its queue.
const WRITER_STOP_GRACE: Duration = Duration::from_millis(500);

async fn keep_out_link(
    service: Arc<Service>,
    front: LinkSet,
    link: usize,
    rebuild: Arc<watch::Sender<u64>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let seed = (link as u64) << 40 ^ 0xA5A5_5A5A;
    let mut backoff = Backoff::new(front.reconnect_min, front.reconnect_max, seed);
    let mut rebuild_rx = rebuild.subscribe();
    while !*shutdown.borrow() {
        let connect =
            tokio::time::timeout(front.connect_timeout, TcpStream::connect(front.connect)).await;
        let secured = match connect {
            Ok(Ok(stream)) => out_link_handshake(&service, &front, link, stream).await,
            _ => None,
        };
        if let Some(stream) = secured {
            backoff.reset();
            rebuild_rx.mark_unchanged();
            let why = run_out_link(
                &service,
                &front,
                link,
                stream,
                &mut rebuild_rx,
                &mut shutdown,
            )
            .await;
            if why == OutLinkEnd::Shutdown {
                tracing::info!(service = service.name(), link, "out link closed: shutdown");
            } else {
                tracing::warn!(
                    service = service.name(),
                    link,
                    reason = why.as_str(),
                    "out link down"
                );
            }
            if why == OutLinkEnd::Broken && front.rebuild_group {
                rebuild.send_modify(|g| *g += 1);
            }
        }
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay()) => {}
            _ = shutdown.changed() => {}
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutLinkEnd {
    Broken,
    Rebuild,
    Shutdown,
}

impl OutLinkEnd {
    fn as_str(self) -> &'static str {
        match self {
            OutLinkEnd::Broken => "broken",
            OutLinkEnd::Rebuild => "group rebuild",
            OutLinkEnd::Shutdown => "shutdown",
        }
    }
}

/// The TLS handshake of an out link when the front has a `tls` table; a
/// failure is counted and logged (rate-limited), and the link retries.
async fn out_link_handshake(
    service: &Service,
    front: &LinkSet,
    link: usize,
    stream: TcpStream,
) -> Option<crate::tls::LinkStream> {
    let _ = stream.set_nodelay(true);
    let tls = service.links.tls.out_links.as_ref();
    match crate::link::io::secure::connect(service.handshake_book(), tls, stream, front.connect)
        .await
    {
        Ok(s) => Some(s),
        Err(why) => {
            if service.links.log_limit.allow(
                LogKind::TlsHandshake,
                LogPeer::Ip(front.connect.ip()),
                Instant::now(),
            ) {
                tracing::warn!(
                    service = service.name(),
                    link,
                    reason = why.as_str(),
                    "out link TLS handshake failed"
                );
            }
            None
        }
    }
}

async fn run_out_link(
    service: &Arc<Service>,
    front: &LinkSet,
    link: usize,
    stream: crate::tls::LinkStream,
    rebuild: &mut watch::Receiver<u64>,
    shutdown: &mut watch::Receiver<bool>,
) -> OutLinkEnd {
    let Some(links) = out_links(service) else {
        return OutLinkEnd::Shutdown;
    };
    let registered = register_link(
        service,
        stream.tcp(),
        crate::link::io::conns::ConnKind::OutLink,
    );
    let tap = service.links.tap(stream.tcp(), Opened::BySwitch);
    crate::link::io::secure::show(&stream, registered.as_ref().map(|r| &*r.entry));
    let (read, write) = stream.into_split();
    let entry = registered.as_ref().map(|r| Arc::clone(&r.entry));
    let read = crate::link::io::conns::Counted::new(Tapped::reader(read, &tap), entry.clone());
    let write = Tapped::writer(write, &tap);
    let (tx, rx) = mpsc::channel(front.write_queue);
    let prefix = service.spec().framing().prefix;
    let (stop_writer, stop_rx) = watch::channel(false);
    let mut writer = tokio::spawn(run_writer_until(write, prefix, rx, stop_rx, entry));
    // Nothing waiting goes out here: only once this connection is signed on.
    links.set_link(link, Some(tx.clone()));
    tracing::info!(service = service.name(), link, "out link up");
    let mut frames = FramedRead::new(
        read,
        FrameCodec::new(prefix, service.spec().framing().max_frame),
    );
    let tick_every =
        (front.keepalive_idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(tick_every);
    let mut last_sign_on: Option<Instant> = None;
    let mut last_echo = Instant::now();
    let mut writer_done = None;
    // Duplex links read the peer's frames; a frame started must finish.
    let mut timer = ReadTimer::new(Duration::ZERO, front.partial_frame_timeout, Instant::now());
    let end = loop {
        tokio::select! {
            item = frames.next() => {
                timer.frame(Instant::now());
                if let Some(r) = &registered {
                    r.entry.received();
                }
                match item {
                    Some(Ok(Frame::KeepAlive)) if front.duplex => {
                        links.in_stats.keepalives_in.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Ok(Frame::Message(p))) if front.duplex => {
                        links.in_stats.frames_in.fetch_add(1, Ordering::Relaxed);
                        if let Some(peer) = service.peer() {
                            peer.on_frame(p, Instant::now());
                        }
                    }
                    Some(Ok(Frame::KeepAlive | Frame::SessionControl(_))) => {}
                    Some(Ok(Frame::Message(p))) => {
                        links.stats[link].unexpected_in.fetch_add(1, Ordering::Relaxed);
                        if let Some(peer) = service.peer() {
                            peer.log_unexpected_on_out_link(link, p);
                        }
                    }
                    Some(Err(_)) | None => break OutLinkEnd::Broken,
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if front.duplex && timer.check(in_frame(&frames), now).is_some() {
                    break OutLinkEnd::Broken;
                }
                if needs_sign_on(front.sign_on, links, link)
                    && last_sign_on.is_none_or(|t| now.duration_since(t) >= front.sign_on_retry)
                {
                    last_sign_on = Some(now);
                    send_nm(service, links, link, NmKind::SignOn);
                }
                if !front.echo_interval.is_zero()
                    && now.duration_since(last_echo) >= front.echo_interval
                    && links.signed_on(link)
                {
                    last_echo = now;
                    send_nm(service, links, link, NmKind::Echo);
                }
                if links.idle_for(link) >= front.keepalive_idle
                    && links.send_signed_on(link, Outbound::KeepAlive).is_some()
                {
                    links.stats[link].keepalives_out.fetch_add(1, Ordering::Relaxed);
                }
            }
            res = &mut writer => {
                writer_done = Some(res);
                break OutLinkEnd::Broken;
            }
            _ = rebuild.changed() => break OutLinkEnd::Rebuild,
            _ = shutdown.changed() => break OutLinkEnd::Shutdown,
        }
    };
    let signed_on = links.usable(link);
    // Down first: nothing else is queued on this link after its sign-off.
    links.set_link(link, None);
    if end == OutLinkEnd::Shutdown && front.sign_on != SignOn::None && signed_on {
        // Sign off, and give the writer a moment to flush it.
        match service.made.network_request(
            service.spec(),
            NmKind::SignOff,
            service.made.next_stan(),
        ) {
            Ok(p) => {
                let _ = tx.try_send(LinkFrame::own(Outbound::message(p)));
            }
            Err(e) => {
                tracing::error!(service = service.name(), error = %e, "cannot build a sign-off")
            }
        }
    }
    // What is queued now: all a writer that never ends takes down with it.
    let queued = tx.max_capacity() - tx.capacity();
    drop(tx);
    if end != OutLinkEnd::Shutdown {
        // The link is gone: frames not yet written go out on the other links.
        let _ = stop_writer.send(true);
    }
    let finished = match writer_done {
        Some(res) => Ok(res),
        None => tokio::time::timeout(WRITER_STOP_GRACE, &mut writer).await,
    };
    match finished {
        Ok(Ok((_, mut rest))) => requeue(service, links, &mut rest),
        _ => {
            writer.abort();
            // Not silent: a socket the peer stopped reading held the writer
            // in a write past the grace period.
            tracing::warn!(
                service = service.name(),
                link,
                queued,
                "out link writer did not stop in time: the frames queued on it are lost"
            );
        }
    }
    end
}

/// Passes the unwritten frames of a dead out link to the signed-on ones (or
/// the waiting queue), each keeping its deadline. Its own network management
/// requests (sign-on, echo) and keep-alives belonged to that connection and
/// are dropped; frames already past their deadline are dropped and counted.
pub(super) fn requeue(service: &Service, links: &OutLinks, rest: &mut mpsc::Receiver<LinkFrame>) {
    // Closed first: a sender still holding this queue now fails over to another
    // link instead of queueing a frame nobody will read.
    rest.close();
    let (mut moved, mut refused) = (0u64, 0u64);
    let mut expired = Flushed::default();
    let now = Instant::now();
    while let Ok(frame) = rest.try_recv() {
        if frame.carry.is_none() {
            continue;
        }
        if links.stale(&frame, now) {
            expired.count_expired(frame.carry);
            continue;
        }
        if links.queue_frame(frame).is_ok() {
            moved += 1;
        } else {
            refused += 1;
        }
    }
    if refused > 0 {
        service
            .counters
            .undeliverable
            .fetch_add(refused, Ordering::Relaxed);
        tracing::warn!(
            service = service.name(),
            refused,
            "frames of a dead out link dropped: the waiting queue is full"
        );
    }
    links
        .parked_dropped
        .fetch_add(expired.answers_expired, Ordering::Relaxed);
    service
        .counters
        .peer
        .node_requests_expired
        .fetch_add(expired.requests_expired, Ordering::Relaxed);
    if moved > 0 {
        tracing::info!(
            service = service.name(),
            moved,
            "frames of a dead out link moved to signed-on links or waiting for one"
        );
    }
}

fn needs_sign_on(policy: SignOn, links: &OutLinks, link: usize) -> bool {
    match policy {
        SignOn::None => false,
        SignOn::PerLink => !links.signed_on(link),
        // One link signs the group on: the lowest-numbered link that is up.
        SignOn::PerGroup => {
            !links.group_signed_on.load(Ordering::Acquire)
                && (0..links.len()).find(|&i| links.is_up(i)) == Some(link)
        }
    }
}

fn send_nm(service: &Service, links: &OutLinks, link: usize, kind: NmKind) {
    let stan = service.made.next_stan();
    match service.made.network_request(service.spec(), kind, stan) {
        Ok(payload) => {
            // A sign-on is the one frame an unsigned link carries.
            let out = Outbound::message(payload);
            let sent = if kind == NmKind::SignOn {
                links.send_on(link, out)
            } else {
                links.send_signed_on(link, out)
            };
            if let Some(generation) = sent {
                links.expect_nm_answer(stan, link, generation);
            }
        }
        Err(e) => {
            tracing::error!(service = service.name(), error = %e, ?kind, "cannot build network management request")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn frame(n: u8) -> Outbound {
        Outbound::message(Bytes::from(vec![n]))
    }

    /// Before: frames moved off a dead link started a new deadline, so a node
    /// request stuck behind a stalled link could reach the peer long after the
    /// node had given up on it. Now the deadline runs from when it first left.
    #[test]
    fn a_dead_links_frames_keep_their_deadlines() {
        let toml = "[[service]]\nname = \"up\"\nspec = \"cups\"\nf37_stamp = { offset = 10, width = 2 }\n\
             [service.front]\nkind = \"simplex\"\nconnect = \"127.0.0.1:9\"\nlisten = \"127.0.0.1:0\"\nlinks = 2\n\
             member_id = \"03105840\"\npeer_id = \"00010000\"\n\
             [service.timeouts]\nrequest = \"50ms\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n";
        let cfg = crate::config::Config::from_toml(toml).unwrap();
        let spec = crate::iso8583::Spec::builtin("cups").unwrap();
        let svc = Service::new(cfg.services[0].clone(), spec, Instant::now()).unwrap();
        let links = svc.side.out_links().unwrap();
        let t0 = Instant::now() - Duration::from_millis(100);
        let (tx, mut rest) = mpsc::channel(8);
        for (carry, n) in [
            (Some(Carry::Request), 1),
            (Some(Carry::Answer), 2),
            (None, 3),
        ] {
            let out = frame(n);
            tx.try_send(LinkFrame {
                since: t0,
                carry,
                out,
            })
            .unwrap();
        }
        tx.try_send(LinkFrame {
            since: Instant::now(),
            carry: Some(Carry::Request),
            out: frame(4),
        })
        .unwrap();
        requeue(&svc, links, &mut rest);
        assert_eq!(
            svc.counters
                .peer
                .node_requests_expired
                .load(Ordering::Relaxed),
            1
        );
        assert_eq!(links.parked_dropped.load(Ordering::Relaxed), 1);
        assert_eq!(links.waiting(), 1, "only the fresh request waits");
        assert!(
            tx.try_send(LinkFrame::own(frame(5))).is_err(),
            "the dead queue is closed"
        );
    }
}
