//! The `simplex` front: UnionPay's split links. The switch connects N out links
//! to the peer and only writes on them; the peer connects N in links to the
//! switch and only writes on them. A response usually arrives on a different TCP
//! connection from the one its request left on, so nothing here is tied to a
//! connection: out links are a pool, in links are sources.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::codec::FramedRead;

use super::link_set::{out_links, register_link, spawn_links};
use crate::capture::{Opened, Tapped};
use crate::config::{FrontConfig, SimplexFront};
use crate::link::io::timer::{ReadTimeout, ReadTimer, in_frame};
use crate::link::log_limit::{LogKind, LogPeer};
use crate::link::service::Service;
use crate::wire::{Frame, FrameCodec};

/// Spawns the out links and the in-link listener of a simplex front.
pub async fn start(
    service: Arc<Service>,
    front: SimplexFront,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(front.listen).await?;
    let addr = listener.local_addr()?;
    let set = FrontConfig::Simplex(front.clone())
        .link_set()
        .ok_or_else(|| std::io::Error::other("a simplex front has a link set"))?;
    spawn_links(&service, &set, tasks, shutdown);
    tasks.spawn(accept_in_links(
        Arc::clone(&service),
        front,
        listener,
        shutdown.clone(),
    ));
    Ok(addr)
}
async fn accept_in_links(
    service: Arc<Service>,
    front: SimplexFront,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(links) = out_links(&service).cloned() else {
        return;
    };
    let mut backoff = super::listen::AcceptBackoff::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                backoff.failed(&service, "in links", &e).await;
                continue;
            }
        };
        backoff.reset();
        let allowed = front.allow.is_empty() || front.allow.iter().any(|n| n.contains(&peer.ip()));
        let open = links.in_stats.open.load(Ordering::Relaxed);
        if !allowed || open >= front.max_in_links() {
            links.in_stats.refused.fetch_add(1, Ordering::Relaxed);
            // A peer retrying a link it may not have does so every few
            // milliseconds: a line per attempt would flood the log.
            if service.links.log_limit.allow(
                LogKind::InLinkRefused,
                LogPeer::Ip(peer.ip()),
                Instant::now(),
            ) {
                tracing::warn!(service = service.name(), %peer, allowed, open, "in link refused");
            }
            continue;
        }
        links.in_stats.accepted.fetch_add(1, Ordering::Relaxed);
        links.in_stats.open.fetch_add(1, Ordering::Relaxed);
        tracing::info!(service = service.name(), %peer, "in link up");
        let svc = Arc::clone(&service);
        let f = front.clone();
        let sd = shutdown.clone();
        let l = Arc::clone(&links);
        tokio::spawn(async move {
            let why = run_in_link(&svc, &f, stream, sd).await;
            l.in_stats.open.fetch_sub(1, Ordering::Relaxed);
            tracing::warn!(service = svc.name(), %peer, reason = %why, "in link down");
        });
    }
}

async fn run_in_link(
    service: &Arc<Service>,
    front: &SimplexFront,
    stream: TcpStream,
    mut shutdown: watch::Receiver<bool>,
) -> String {
    let Some(links) = out_links(service) else {
        return "no front".into();
    };
    let prefix = service.spec().framing().prefix;
    let registered = register_link(service, &stream, crate::link::io::conns::ConnKind::InLink);
    let tap = service.links.tap(&stream, Opened::ByPeer);
    let peer = stream.peer_addr().unwrap_or(front.listen);
    let Some(stream) = crate::link::io::secure::accept(
        service.handshake_book(),
        service.links.tls.in_links.as_ref(),
        stream,
        peer,
        registered.as_ref().map(|r| &*r.entry),
    )
    .await
    else {
        return "TLS handshake failed".into();
    };
    // The switch never writes on an in link; the write half is held, not
    // dropped: dropping a plain one would send the peer a FIN.
    let (read, _held_write) = stream.into_split();
    let entry = registered.as_ref().map(|r| Arc::clone(&r.entry));
    let mut frames = FramedRead::new(
        crate::link::io::conns::Counted::new(Tapped::reader(read, &tap), entry),
        FrameCodec::new(prefix, service.spec().framing().max_frame),
    );
    let mut timer = ReadTimer::new(
        front.in_link_silence,
        front.partial_frame_timeout,
        Instant::now(),
    );
    let mut tick = tokio::time::interval(timer.tick_period());
    loop {
        let item = tokio::select! {
            item = frames.next() => item,
            _ = tick.tick() => {
                match timer.check(in_frame(&frames), Instant::now()) {
                    Some(ReadTimeout::Idle) => {
                        links.in_stats.closed_silent.fetch_add(1, Ordering::Relaxed);
                        return "silent too long".into();
                    }
                    Some(t) => return t.as_str().into(),
                    None => continue,
                }
            }
            _ = shutdown.changed() => return "shutdown".into(),
        };
        timer.frame(Instant::now());
        if let Some(r) = &registered {
            r.entry.received();
        }
        match item {
            Some(Ok(Frame::KeepAlive)) => {
                links.in_stats.keepalives_in.fetch_add(1, Ordering::Relaxed);
            }
            Some(Ok(Frame::Message(p))) => {
                links.in_stats.frames_in.fetch_add(1, Ordering::Relaxed);
                if let Some(peer) = service.peer() {
                    peer.on_frame(p, Instant::now());
                }
            }
            Some(Ok(Frame::SessionControl(_))) => {}
            Some(Err(e)) => {
                service.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                return format!("untrusted frame: {e}");
            }
            None => return "closed by peer".into(),
        }
    }
}
