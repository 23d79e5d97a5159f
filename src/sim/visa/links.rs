//! VISA's duplex links: dialled or accepted, each signed on, polled when
//! idle and echoed; how a frame finds a link, and how an answer to the bank
//! waits for one when none is up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;

use super::{ACCEPT_FACTOR, CLOSE_GRACE, Dial, LINK_QUEUE, MAX_PARKED, NmKind, STOP_GRACE, Shared};
use crate::sim::original::OriginalKey;
use crate::sim::peer::{RECONNECT_MIN, keep_dialled, lock};
use crate::sim::writer::{Outbound, run_writer};
use crate::wire::{Frame, FrameCodec};

/// A live link, as senders see it.
pub(super) struct LinkHandle {
    pub(super) id: u64,
    pub(super) tx: mpsc::Sender<Outbound>,
    pub(super) signed_on: Arc<AtomicBool>,
    /// Microseconds since `Shared::base` of the last frame queued on it.
    pub(super) last_sent: Arc<AtomicU64>,
    pub(super) close: Arc<Notify>,
}

impl Shared {
    pub(super) fn now_micros(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Queues `payload` on one link chosen by `pick` among the live ones, in
    /// round-robin order; a full queue moves on. Returns the link's ID.
    pub(super) fn send_where(
        &self,
        payload: &Bytes,
        pick: impl Fn(&LinkHandle) -> bool,
    ) -> Option<u64> {
        let links = lock(&self.links);
        let n = links.len();
        if n == 0 {
            return None;
        }
        let start = self.next_link.fetch_add(1, Ordering::Relaxed) % n;
        for k in 0..n {
            let link = &links[(start + k) % n];
            if !pick(link) {
                continue;
            }
            if link.tx.try_send(Outbound::message(payload.clone())).is_ok() {
                link.last_sent.store(self.now_micros(), Ordering::Relaxed);
                return Some(link.id);
            }
        }
        None
    }

    /// Writes an answer to the bank on a link other than `came_on` (on that
    /// one only when it is the only link up). With no link up it waits for
    /// one ([`Shared::flush_parked`]), as a peer holds answers over a
    /// reconnect.
    pub(super) fn deliver(&self, came_on: u64, resp: &Bytes) {
        if self.try_deliver(came_on, resp) {
            return;
        }
        {
            // Under the parked lock (then the links lock): a link coming up
            // now flushes after this, so nothing parked is left behind.
            let mut parked = lock(&self.parked);
            if lock(&self.links).is_empty() {
                let counter = if parked.len() < MAX_PARKED {
                    parked.push_back((Instant::now(), came_on, resp.clone()));
                    &self.stats.answers_parked
                } else {
                    &self.stats.answers_unsent
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        // A link is up (every queue was full, or it just came up): once more.
        if !self.try_deliver(came_on, resp) {
            self.stats.answers_unsent.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn try_deliver(&self, came_on: u64, resp: &Bytes) -> bool {
        let stats = &self.stats;
        let sent = self
            .send_where(resp, |l| l.id != came_on)
            .or_else(|| self.send_where(resp, |l| l.id == came_on));
        let Some(on) = sent else {
            return false;
        };
        stats.bank_answered.fetch_add(1, Ordering::Relaxed);
        if on != came_on {
            stats
                .bank_answered_on_other_link
                .fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// A link came up: the parked answers still worth sending go out; those
    /// older than `timeout` (the bank has given up on them) are dropped.
    pub(super) fn flush_parked(&self) {
        let parked: Vec<_> = lock(&self.parked).drain(..).collect();
        for (at, came_on, resp) in parked {
            if at.elapsed() > self.cfg.timeout || !self.try_deliver(came_on, &resp) {
                self.stats.answers_unsent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// [`Shared::deliver`] after `delay`; a late approval is booked as it
    /// leaves (before the bank can have it, so before any reversal of it).
    pub(super) fn deliver_later(
        self: &Arc<Shared>,
        came_on: u64,
        resp: Bytes,
        delay: Duration,
        approved_late: Option<OriginalKey>,
    ) {
        let shared = Arc::clone(self);
        let send = move || {
            if let Some(key) = approved_late {
                shared.stats.reversals.approved_late(key);
            }
            shared.deliver(came_on, &resp);
        };
        if !self.delayed.send_after(delay, self.shutdown.clone(), send) {
            self.stats.answers_unsent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Accepts the bank's links and serves each until it closes.
pub(super) async fn accept_links(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    let max = shared.cfg.links.max(1).saturating_mul(ACCEPT_FACTOR);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(RECONNECT_MIN).await;
                    continue;
                };
                if conns.len() >= max {
                    shared.stats.links_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, max, "sim visa: link refused, too many open");
                    drop(stream);
                    continue;
                }
                let (s, mut sd) = (Arc::clone(&shared), shutdown.clone());
                conns.spawn(async move { serve_link(&s, stream, &mut sd).await });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    // Each link task saw the same shutdown: let them finish their close.
    crate::sim::join_within(&mut conns, STOP_GRACE).await;
}

/// Keeps one dialled link up: connects, serves it until it closes, waits a
/// short backoff, connects again.
pub(super) async fn keep_link(shared: Arc<Shared>, shutdown: watch::Receiver<bool>) {
    let Dial::Connect(addr) = shared.cfg.dial else {
        return;
    };
    keep_dialled(addr, "sim visa", shutdown, |stream, mut shutdown| {
        let shared = Arc::clone(&shared);
        async move { serve_link(&shared, stream, &mut shutdown).await }
    })
    .await;
}

/// Why a link's read loop ended.
#[derive(Debug, PartialEq, Eq)]
enum LinkEnd {
    Closed,
    Broken,
    Shutdown,
}

/// Serves one link until it closes, is dropped on demand, or the simulator
/// stops: reads and dispatches frames; signs on, polls and echoes on time.
async fn serve_link(shared: &Arc<Shared>, stream: TcpStream, shutdown: &mut watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let tls = &shared.cfg.tls;
    let secured = match shared.cfg.dial {
        Dial::Accept(_) => crate::tls::tools::accept(tls.server.as_deref(), stream).await,
        Dial::Connect(addr) => {
            crate::tls::tools::secure_connect(tls.client.as_deref(), stream, addr).await
        }
    };
    let stream = match secured {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "sim visa: TLS handshake failed");
            return;
        }
    };
    let (read, write) = stream.into_split();
    let framing = shared.spec.framing();
    let (tx, rx) = mpsc::channel(LINK_QUEUE);
    let mut writer = tokio::spawn(run_writer(write, framing.prefix, rx));
    let id = shared.next_link_id.fetch_add(1, Ordering::Relaxed);
    let close = Arc::new(Notify::new());
    let signed_on = Arc::new(AtomicBool::new(!shared.cfg.sign_on));
    let last_sent = Arc::new(AtomicU64::new(shared.now_micros()));
    lock(&shared.links).push(LinkHandle {
        id,
        tx,
        signed_on: Arc::clone(&signed_on),
        last_sent: Arc::clone(&last_sent),
        close: Arc::clone(&close),
    });
    let stats = &shared.stats;
    stats.links_opened.fetch_add(1, Ordering::Relaxed);
    stats.links_up.fetch_add(1, Ordering::Relaxed);
    shared.flush_parked();
    let unregister = || {
        let mut links = lock(&shared.links);
        let before = links.len();
        links.retain(|l| l.id != id);
        if links.len() < before {
            stats.links_up.fetch_sub(1, Ordering::Relaxed);
        }
    };
    let cfg = &shared.cfg;
    let mut last_sign_on = None;
    let mut last_echo = Instant::now();
    if cfg.sign_on && shared.network.signs_on() && shared.send_network(id, NmKind::SignOn) {
        last_sign_on = Some(Instant::now());
    }
    let mut frames = FramedRead::new(read, FrameCodec::new(framing.prefix, framing.max_frame));
    let mut rng = crate::util::rng::rng_from_entropy();
    // A frame begun must end within this (a stalled peer cannot hold a buffer).
    let partial_limit = cfg.timeout.max(Duration::from_secs(1));
    let mut partial_since: Option<Instant> = None;
    let mut closing_since: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = loop {
        tokio::select! {
            frame = frames.next() => match frame {
                Some(Ok(Frame::Message(p))) => shared.on_frame(id, p, &mut rng),
                Some(Ok(Frame::KeepAlive)) => {
                    stats.keepalives_received.fetch_add(1, Ordering::Relaxed);
                }
                // Session control is link-level and carries no message.
                Some(Ok(Frame::SessionControl(_))) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "sim visa: link closed on a bad frame");
                    stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                    break LinkEnd::Broken;
                }
                None => break LinkEnd::Closed,
            },
            _ = tick.tick() => {
                let now = Instant::now();
                let partial = frames.decoder().in_frame() || !frames.read_buffer().is_empty();
                match (partial, partial_since) {
                    (false, _) => partial_since = None,
                    (true, None) => partial_since = Some(now),
                    (true, Some(t)) if now.duration_since(t) > partial_limit => {
                        stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                        break LinkEnd::Broken;
                    }
                    (true, Some(_)) => {}
                }
                if let Some(t) = closing_since {
                    if now.duration_since(t) > CLOSE_GRACE {
                        break LinkEnd::Closed;
                    }
                    continue;
                }
                on_tick(shared, id, &signed_on, &last_sent, &mut last_sign_on, &mut last_echo, now);
            }
            res = &mut writer, if closing_since.is_none() => {
                tracing::debug!(result = ?res, "sim visa: link writer ended");
                break LinkEnd::Broken;
            }
            _ = close.notified(), if closing_since.is_none() => {
                // A graceful drop: no new frames, the queue flushes, then FIN;
                // keep reading until the bank closes its side too.
                closing_since = Some(Instant::now());
                stats.links_dropped.fetch_add(1, Ordering::Relaxed);
                unregister();
            }
            _ = shutdown.changed() => break LinkEnd::Shutdown,
        }
    };
    unregister();
    if end != LinkEnd::Broken && !writer.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
    }
    writer.abort();
    tracing::debug!(link = id, end = ?end, "sim visa: link down");
}

/// Link housekeeping: poll when idle, retry an unanswered sign-on, echo.
fn on_tick(
    shared: &Shared,
    id: u64,
    signed_on: &AtomicBool,
    last_sent: &AtomicU64,
    last_sign_on: &mut Option<Instant>,
    last_echo: &mut Instant,
    now: Instant,
) {
    let cfg = &shared.cfg;
    let idle = cfg.keepalive_idle;
    if !idle.is_zero() {
        let since = shared
            .now_micros()
            .saturating_sub(last_sent.load(Ordering::Relaxed));
        if Duration::from_micros(since) >= idle {
            let links = lock(&shared.links);
            if let Some(l) = links.iter().find(|l| l.id == id)
                && l.tx.try_send(Outbound::KeepAlive).is_ok()
            {
                shared.stats.keepalives_sent.fetch_add(1, Ordering::Relaxed);
            }
            last_sent.store(shared.now_micros(), Ordering::Relaxed);
        }
    }
    if cfg.sign_on
        && shared.network.signs_on()
        && !signed_on.load(Ordering::Relaxed)
        && last_sign_on.is_none_or(|t| now.duration_since(t) >= cfg.sign_on_retry)
    {
        *last_sign_on = Some(now);
        shared.send_network(id, NmKind::SignOn);
    }
    if !cfg.echo_interval.is_zero() && now.duration_since(*last_echo) >= cfg.echo_interval {
        *last_echo = now;
        shared.send_network(id, NmKind::Echo);
    }
}
