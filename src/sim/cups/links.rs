//! UnionPay's links: the out links it accepts and reads (the member writes),
//! the in links it keeps open and writes (the member reads), and how an
//! answer finds an in link.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;

use super::{IN_LINK_QUEUE, OUT_LINKS_PER_IN_LINK, Shared, Tally};
use crate::iso8583::Message;
use crate::sim::answer;
use crate::sim::original::OriginalKey;
use crate::sim::peer::{RECONNECT_MIN, keep_dialled, lock};
use crate::sim::writer::{Outbound, run_writer};
use crate::wire::{Frame, FrameCodec};

/// A live in link, as senders see it.
pub(super) struct InLink {
    pub(super) id: u64,
    /// The switch host it connects to.
    pub(super) host: std::net::IpAddr,
    pub(super) tx: mpsc::Sender<Outbound>,
    /// Microseconds since `Shared::base` of the last frame queued on it.
    pub(super) last_sent: Arc<AtomicU64>,
    pub(super) close: Arc<Notify>,
}

/// A live out link, as `close_out_links` sees it.
pub(super) struct OutLink {
    pub(super) id: u64,
    pub(super) close: Arc<Notify>,
}

/// Which in links an answer may go out on.
#[derive(Clone, Copy, Debug)]
pub(super) enum To {
    /// One to this switch host if there is one (network management: the
    /// instance that asked), else any.
    Host(Option<IpAddr>),
    /// Any (a member answer, as UnionPay sends them): the in link is drawn at
    /// random (`draw`), owing nothing to where the request came from. A round
    /// robin here locked in phase with a node's own round robin over its
    /// connections to two instances, so that no answer ever crossed. `from`
    /// is the host the request came from, for counting answers that crossed
    /// to another instance.
    Any { from: Option<IpAddr>, draw: u64 },
}

/// Closes up to `n` of `links`, oldest first; how many were told to close.
pub(super) fn close_links<T>(
    links: &Mutex<Vec<T>>,
    n: usize,
    close: impl Fn(&T) -> &Arc<Notify>,
) -> usize {
    let links = lock(links);
    let mut closed = 0;
    for l in links.iter().take(n) {
        close(l).notify_one();
        closed += 1;
    }
    closed
}

impl Shared {
    pub(super) fn now_micros(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Queues `item` on the next live in link (round-robin) that can take it.
    pub(super) fn send_in(&self, item: Outbound) -> bool {
        self.send_in_where(item, &self.next_in, |_| true).is_some()
    }

    /// Queues `item` on the next live in link (round-robin) to `host`, or on
    /// any in link if none goes there: network management answers go back
    /// to the switch instance that asked, as UnionPay answers the front-end
    /// processor that signed a link on.
    pub(super) fn send_in_to_host(&self, item: Outbound, host: Option<std::net::IpAddr>) -> bool {
        match host {
            Some(h) if lock(&self.in_links).iter().any(|l| l.host == h) => self
                .send_in_where(item, &self.next_in, |l| l.host == h)
                .is_some(),
            _ => self.send_in(item),
        }
    }

    /// Queues `item` on the next live in link (round-robin) that `pick`
    /// allows and can take it; the host it went to.
    pub(super) fn send_in_where(
        &self,
        item: Outbound,
        cursor: &AtomicUsize,
        pick: impl Fn(&InLink) -> bool,
    ) -> Option<std::net::IpAddr> {
        let turn = cursor.fetch_add(1, Ordering::Relaxed) as u64;
        self.send_in_from(item, turn, pick)
    }

    /// Queues `item` on the first in link from `start` (modulo the number of
    /// links) that `pick` allows and can take it; the host it went to.
    pub(super) fn send_in_from(
        &self,
        mut item: Outbound,
        start: u64,
        pick: impl Fn(&InLink) -> bool,
    ) -> Option<std::net::IpAddr> {
        let links = lock(&self.in_links);
        let n = links.len();
        if n == 0 {
            return None;
        }
        let start = (start % n as u64) as usize;
        for k in 0..n {
            let link = &links[(start + k) % n];
            if !pick(link) {
                continue;
            }
            match link.tx.try_send(item) {
                Ok(()) => {
                    link.last_sent.store(self.now_micros(), Ordering::Relaxed);
                    return Some(link.host);
                }
                Err(
                    mpsc::error::TrySendError::Full(it) | mpsc::error::TrySendError::Closed(it),
                ) => {
                    item = it;
                }
            }
        }
        None
    }

    /// A frame on an out link that has not signed on: its sign-on 0820 is
    /// answered (after `sign_on_delay`) and signs the link on; anything else is
    /// refused and counted.
    pub(super) fn before_sign_on(
        self: &Arc<Shared>,
        payload: Bytes,
        signed_on: &Arc<std::sync::atomic::AtomicBool>,
        from: Option<IpAddr>,
    ) {
        let answer = Message::parse(&self.spec, payload).ok().and_then(|msg| {
            let sign_on = msg.mti().is_network_management()
                && msg.mti().is_request()
                && matches!(msg.field(70), Ok(Some(f)) if f.eq_logical(b"001"));
            if !sign_on {
                return None;
            }
            answer::answer(&self.spec, &msg, "00").ok()
        });
        let Some(answer) = answer else {
            self.stats.unsigned_frames.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.stats.network_requests.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::clone(self);
        let signed_on = Arc::clone(signed_on);
        let delay = self.cfg.sign_on_delay;
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            // Signed on before the 0830 leaves: whatever the switch writes
            // after reading it is read after this.
            signed_on.store(true, Ordering::Release);
            shared.stats.sign_ons.fetch_add(1, Ordering::Relaxed);
            shared.deliver(answer, Tally::Network, To::Host(from), None);
        });
    }

    /// Writes a response on an in link and counts it under `tally`; a late
    /// approval is recorded first (before the switch can have it).
    pub(super) fn deliver(
        &self,
        response: Bytes,
        tally: Tally,
        to: To,
        approved_late: Option<OriginalKey>,
    ) {
        if let Some(key) = approved_late {
            self.stats.reversals.approved_late(key);
        }
        let out = Outbound::message(response);
        let sent = match to {
            To::Host(host) => self.send_in_to_host(out, host),
            To::Any { from, draw } => match self.send_in_from(out, draw, |_| true) {
                Some(host) => {
                    if let Some(from) = from.filter(|f| *f != host) {
                        *lock(&self.stats.crossed)
                            .entry(format!("{from}->{host}"))
                            .or_default() += 1;
                    }
                    true
                }
                None => false,
            },
        };
        let stats = &self.stats;
        match (sent, tally) {
            (false, _) => drop(stats.responses_unsent.fetch_add(1, Ordering::Relaxed)),
            (true, Tally::Member) => {
                stats
                    .member_requests_answered
                    .fetch_add(1, Ordering::Relaxed);
            }
            (true, Tally::Network) => drop(stats.network_answered.fetch_add(1, Ordering::Relaxed)),
            (true, Tally::Reversal) => stats.reversals.answered(),
            (true, Tally::Advice) => stats.member_advices.answered(),
        }
    }

    /// [`Shared::deliver`] after `delay` (at once when zero).
    pub(super) fn deliver_after(
        self: &Arc<Shared>,
        response: Bytes,
        delay: Duration,
        tally: Tally,
        to: To,
        approved_late: Option<OriginalKey>,
    ) {
        if delay.is_zero() {
            self.deliver(response, tally, to, approved_late);
            return;
        }
        let shared = Arc::clone(self);
        let send = move || shared.deliver(response, tally, to, approved_late);
        if !self.delayed.send_after(delay, self.shutdown.clone(), send) {
            self.stats.responses_unsent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Accepts the switch's out links and reads each until it closes.
pub(super) async fn accept_out_links(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    let max = shared
        .cfg
        .links
        .max(1)
        .saturating_mul(OUT_LINKS_PER_IN_LINK);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(RECONNECT_MIN).await;
                    continue;
                };
                if lock(&shared.out_links).len() >= max {
                    shared.stats.out_links_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, max, "sim cups: out link refused, too many open");
                    drop(stream);
                    continue;
                }
                conns.spawn(serve_out_link(Arc::clone(&shared), stream, shutdown.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Reads one out link: UnionPay never writes on it.
async fn serve_out_link(
    shared: Arc<Shared>,
    stream: TcpStream,
    mut shutdown: watch::Receiver<bool>,
) {
    // The switch instance this out link comes from.
    let from = stream.peer_addr().ok().map(|a| a.ip());
    let stream = match crate::tls::tools::accept(shared.cfg.tls.server.as_deref(), stream).await {
        Ok(s) => s,
        Err(e) => {
            shared.stats.tls_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "sim cups: out link TLS handshake failed");
            return;
        }
    };
    let id = shared.next_link_id.fetch_add(1, Ordering::Relaxed);
    let close = Arc::new(Notify::new());
    {
        let mut links = lock(&shared.out_links);
        links.push(OutLink {
            id,
            close: Arc::clone(&close),
        });
        shared
            .stats
            .out_links_accepted
            .fetch_add(1, Ordering::Relaxed);
        shared.stats.out_links_up.fetch_add(1, Ordering::Relaxed);
    }
    let framing = shared.spec.framing();
    let mut frames = FramedRead::new(stream, FrameCodec::new(framing.prefix, framing.max_frame));
    let mut rng = crate::util::rng::rng_from_entropy();
    let signed_on = Arc::new(std::sync::atomic::AtomicBool::new(
        !shared.cfg.require_sign_on,
    ));
    // A frame begun must end within this (a stalled peer cannot hold a buffer).
    let partial_limit = shared.cfg.timeout.max(Duration::from_secs(1));
    let mut closing = false;
    loop {
        let partial = frames.decoder().in_frame() || !frames.read_buffer().is_empty();
        let next = async {
            if partial {
                tokio::time::timeout(partial_limit, frames.next())
                    .await
                    .ok()
            } else {
                Some(frames.next().await)
            }
        };
        let frame = tokio::select! {
            f = next => f,
            _ = close.notified(), if !closing => {
                // A graceful close: half-close our side and keep reading until the
                // switch closes too, so nothing it already wrote is lost.
                closing = true;
                let _ = frames.get_mut().shutdown().await;
                lock(&shared.out_links).retain(|l| l.id != id);
                shared.stats.out_links_up.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            _ = shutdown.changed() => break,
        };
        match frame {
            Some(Some(Ok(_))) if !signed_on.load(Ordering::Acquire) => {
                if let Some(Some(Ok(Frame::Message(payload)))) = frame {
                    shared.before_sign_on(payload, &signed_on, from);
                } else {
                    shared.stats.unsigned_frames.fetch_add(1, Ordering::Relaxed);
                }
            }
            Some(Some(Ok(Frame::Message(payload)))) => shared.on_out_link(payload, &mut rng, from),
            Some(Some(Ok(Frame::KeepAlive))) => {
                shared
                    .stats
                    .keepalives_received
                    .fetch_add(1, Ordering::Relaxed);
            }
            Some(Some(Ok(Frame::SessionControl(_)))) => {
                shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            }
            Some(Some(Err(e))) => {
                // The prefix cannot be trusted: this link only is closed.
                tracing::debug!(error = %e, "sim cups: out link closed on a bad frame");
                shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                break;
            }
            Some(None) => break,
            None => {
                tracing::debug!("sim cups: out link closed, a partial frame stalled");
                shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
    if !closing {
        let mut links = lock(&shared.out_links);
        links.retain(|l| l.id != id);
        shared.stats.out_links_up.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Keeps one in link open: connects, serves it until it closes, waits a short
/// backoff, connects again.
pub(super) async fn keep_in_link(
    shared: Arc<Shared>,
    target: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    keep_dialled(
        target,
        "sim cups: in link",
        shutdown,
        |stream, mut shutdown| {
            let shared = Arc::clone(&shared);
            async move { serve_in_link(&shared, stream, target.ip(), &mut shutdown).await }
        },
    )
    .await;
}

/// Serves one connected in link until it closes, is closed on demand, or the
/// simulator stops.
async fn serve_in_link(
    shared: &Arc<Shared>,
    stream: TcpStream,
    host: IpAddr,
    shutdown: &mut watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let Ok(peer) = stream.peer_addr() else {
        return;
    };
    let tls = shared.cfg.tls.client.as_deref();
    let stream = match crate::tls::tools::secure_connect(tls, stream, peer).await {
        Ok(s) => s,
        Err(e) => {
            shared.stats.tls_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "sim cups: in link TLS handshake failed");
            return;
        }
    };
    let (read, write) = stream.into_split();
    let framing = shared.spec.framing();
    let (tx, rx) = mpsc::channel(IN_LINK_QUEUE);
    let mut writer = tokio::spawn(run_writer(write, framing.prefix, rx));
    let id = shared.next_link_id.fetch_add(1, Ordering::Relaxed);
    let close = Arc::new(Notify::new());
    let last_sent = Arc::new(AtomicU64::new(shared.now_micros()));
    {
        let mut links = lock(&shared.in_links);
        links.push(InLink {
            id,
            host,
            tx: tx.clone(),
            last_sent: Arc::clone(&last_sent),
            close: Arc::clone(&close),
        });
        shared.stats.in_links_opened.fetch_add(1, Ordering::Relaxed);
        shared.stats.in_links_up.fetch_add(1, Ordering::Relaxed);
    }
    let mut frames = FramedRead::new(read, FrameCodec::new(framing.prefix, framing.max_frame));
    let idle = shared.cfg.keepalive_idle;
    let mut closing = false;
    loop {
        let keepalive_due = (!idle.is_zero())
            .then(|| shared.base + Duration::from_micros(last_sent.load(Ordering::Relaxed)) + idle);
        let keepalive = async {
            match keepalive_due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = keepalive => {
                let now = shared.now_micros();
                let last = last_sent.load(Ordering::Relaxed);
                let idle_us = u64::try_from(idle.as_micros()).unwrap_or(u64::MAX);
                if now.saturating_sub(last) >= idle_us {
                    // A full queue is traffic enough: no keep-alive needed.
                    if tx.try_send(Outbound::KeepAlive).is_ok() {
                        shared.stats.keepalives_sent.fetch_add(1, Ordering::Relaxed);
                    }
                    last_sent.store(now, Ordering::Relaxed);
                }
            }
            frame = frames.next() => match frame {
                Some(Ok(Frame::KeepAlive)) => {
                    shared.stats.keepalives_received.fetch_add(1, Ordering::Relaxed);
                }
                Some(Ok(_)) => {
                    shared.stats.unexpected_on_in_links.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(_)) => {
                    shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                None => break,
            },
            _ = &mut writer => break,
            _ = close.notified() => {
                closing = true;
                break;
            }
            _ = shutdown.changed() => break,
        }
    }
    {
        let mut links = lock(&shared.in_links);
        links.retain(|l| l.id != id);
        shared.stats.in_links_up.fetch_sub(1, Ordering::Relaxed);
    }
    if closing && !writer.is_finished() {
        // A graceful close on demand: no new frames, flush what is queued,
        // then FIN (the writer shuts the write half down when its queue closes).
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
    }
    writer.abort();
}

/// Closes every out link at once, every `every`, as a lost line to all of
/// them would.
pub(super) async fn drop_out_links(
    shared: Arc<Shared>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let n = close_links(&shared.out_links, usize::MAX, |l| &l.close);
                shared.stats.out_link_drops.fetch_add(1, Ordering::Relaxed);
                tracing::info!(closed = n, "sim cups: every out link dropped");
            }
            _ = shutdown.changed() => return,
        }
    }
}
