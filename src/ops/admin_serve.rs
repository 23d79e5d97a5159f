//! How the admin listener serves, so that no admin client can hurt card
//! traffic: a thread and a single-threaded runtime of its own (a /metrics
//! flood or a slow client takes no worker time from the message path), at
//! most `admin.max_connections` connections served (a peer address at most
//! `admin.max_connections_per_peer` of them), past which a few probe slots
//! answer `/healthz` and `/readyz` and a 503 everything else (see
//! [`super::admin_probe`]), and timeouts that cut slow clients: headers within
//! `header_timeout` (also the idle limit between kept-alive requests), the
//! whole request and the client taking its answer within `request_timeout`,
//! `max_requests_per_connection` requests per connection. When the switch
//! stops, every admin connection is cut at once.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, header};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::config::AdminConfig;
use crate::link::log_limit::{LogKind, LogLimit, LogPeer};
use crate::tls::{AdminTls, Side};

use super::admin_audit::Audit;
use super::admin_probe::{self, Admission, Prefixed, ProbeSlot};

/// Connections that may wait in the kernel's accept queue for the accept
/// loop (which takes them as fast as it can, cap or not).
const BACKLOG: u32 = 1024;
/// A pause after a failed accept (e.g. out of files), not to spin on it.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The limits one admin connection is served under.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    pub probe_slots: usize,
    pub probe_timeout: Duration,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub max_requests_per_connection: usize,
}

impl Limits {
    pub fn of(cfg: &AdminConfig) -> Limits {
        Limits {
            max_connections: cfg.max_connections,
            max_connections_per_peer: cfg.max_connections_per_peer,
            probe_slots: cfg.probe_slots,
            probe_timeout: cfg.probe_timeout,
            header_timeout: cfg.header_timeout,
            request_timeout: cfg.request_timeout,
            max_requests_per_connection: cfg.max_requests_per_connection,
        }
    }
}

/// Binds `addr` with a backlog deep enough for the clients waiting past the
/// cap. Called on the switch's runtime; the listener is handed to the admin
/// thread in std form.
pub async fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)?.into_std()
}

/// Starts the admin thread serving `listener` (a copy of it: a restarted
/// thread serves the same socket) until `stop`. Returns a future that ends
/// when the thread has ended; dropping it stops the thread.
pub fn spawn_thread(
    listener: &std::net::TcpListener,
    app: Router,
    limits: Limits,
    log_limit: Arc<LogLimit>,
    audit: Arc<Audit>,
    tls: Option<Arc<AdminTls>>,
    stop: CancellationToken,
) -> io::Result<impl Future<Output = ()> + Send + use<>> {
    let listener = listener.try_clone()?;
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<()>();
    let thread_stop = stop.clone();
    std::thread::Builder::new()
        .name("isoswitch-admin".into())
        .spawn(move || {
            // Dropped when the thread ends, however it ends.
            let _ended = ended_tx;
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "admin: cannot build its runtime");
                    return;
                }
            };
            let flushed = Flushed { log_limit, audit };
            rt.block_on(serve(listener, app, limits, flushed, tls, thread_stop));
            // Dropping the runtime cuts every admin connection still open.
            rt.shutdown_background();
        })?;
    let guard = stop.drop_guard();
    Ok(async move {
        let _stop_on_drop = guard;
        let _ = ended_rx.await;
    })
}

/// What the admin thread flushes once a second: the log lines `log_limit`
/// held back, and the refused tokens the audit counted.
struct Flushed {
    log_limit: Arc<LogLimit>,
    audit: Arc<Audit>,
}

/// The accept loop: every connection is taken at once and sorted by
/// [`Admission`] (served, a probe slot, or a 503). Once a second it flushes
/// the log limit and the audit's refusals.
async fn serve(
    listener: std::net::TcpListener,
    app: Router,
    limits: Limits,
    flushed: Flushed,
    tls: Option<Arc<AdminTls>>,
    stop: CancellationToken,
) {
    let log_limit = Arc::clone(&flushed.log_limit);
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "admin: cannot serve the listener");
            return;
        }
    };
    let admission = Admission::new(
        limits.max_connections,
        limits.max_connections_per_peer,
        limits.probe_slots,
    );
    // Ends with this thread's runtime.
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let now = Instant::now();
            flushed.log_limit.flush(now);
            flushed.audit.flush(now);
        }
    });
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.cancelled() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                if let Some(slot) = admission.serve(peer.ip()) {
                    let app = app.clone();
                    let (tls, log_limit) = (tls.clone(), Arc::clone(&log_limit));
                    tokio::spawn(async move {
                        match tls {
                            None => serve_connection(stream, peer, app, limits).await,
                            Some(tls) => {
                                if let Some(s) = handshake(&tls, &log_limit, stream, peer).await {
                                    serve_connection(s, peer, app, limits).await;
                                }
                            }
                        }
                        drop(slot);
                    });
                    continue;
                }
                if log_limit.allow(LogKind::Refused, LogPeer::Ip(peer.ip()), Instant::now()) {
                    tracing::warn!(
                        %peer,
                        "admin: at admin.max_connections or the peer's \
                         admin.max_connections_per_peer: answering probes only"
                    );
                }
                let slot = tokio::select! {
                    slot = admission.probe_slot() => slot,
                    _ = stop.cancelled() => return,
                };
                let Some(slot) = slot else { return };
                let app = app.clone();
                let (tls, log_limit) = (tls.clone(), Arc::clone(&log_limit));
                tokio::spawn(async move {
                    let deadline = tokio::time::Instant::now() + limits.probe_timeout;
                    match tls {
                        None => serve_probe(stream, peer, app, limits, deadline, slot).await,
                        Some(tls) => {
                            let shaken = tokio::time::timeout_at(
                                deadline,
                                handshake(&tls, &log_limit, stream, peer),
                            );
                            if let Ok(Some(s)) = shaken.await {
                                serve_probe(s, peer, app, limits, deadline, slot).await;
                            }
                        }
                    }
                });
            }
            Err(e) => {
                let now = Instant::now();
                if log_limit.allow(LogKind::AdminAccept, LogPeer::Service, now) {
                    tracing::warn!(error = %e, "admin: cannot accept a connection");
                }
                tokio::select! {
                    _ = tokio::time::sleep(ACCEPT_PAUSE) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    }
}

/// A connection in a probe slot: its request line by `deadline` (or until
/// the slot is wanted by a waiting connection); a probe is served (its
/// headers by `deadline` too, then closed), anything else gets the 503.
async fn serve_probe<S>(
    mut stream: S,
    peer: SocketAddr,
    app: Router,
    limits: Limits,
    deadline: tokio::time::Instant,
    slot: ProbeSlot,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let since = tokio::time::Instant::now();
    let line = tokio::select! {
        line = tokio::time::timeout_at(deadline, admin_probe::read_request_line(&mut stream)) => {
            line.ok().flatten()
        }
        _ = slot.wanted(since) => None,
    };
    match line {
        Some(line) if line.probe => {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let limits = Limits {
                header_timeout: left.max(Duration::from_millis(1)),
                max_requests_per_connection: 1,
                ..limits
            };
            serve_connection(Prefixed::new(line.bytes, stream), peer, app, limits).await;
            drop(slot);
        }
        Some(_) | None => {
            let by = tokio::time::Instant::now() + admin_probe::LINGER;
            if let Some(stream) = admin_probe::answer_busy(stream, by).await {
                slot.release_and_linger(stream).await;
            }
        }
    }
}

/// The HTTPS handshake of an admin client; a failure is counted and
/// logged (rate-limited).
async fn handshake(
    tls: &AdminTls,
    log_limit: &LogLimit,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<crate::tls::TlsTcp> {
    match tls.side.accept(stream).await {
        Ok(s) => {
            tls.handshakes.succeeded(Side::Accept);
            Some(s)
        }
        Err(why) => {
            let (h, side) = (&tls.handshakes, Side::Accept);
            crate::link::io::secure::handshake_failed("admin", h, log_limit, side, peer, why);
            None
        }
    }
}

/// One connection, HTTP/1.1 with keep-alive, under `limits`.
async fn serve_connection<S>(stream: S, peer: SocketAddr, app: Router, limits: Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(WriteDeadline::new(stream, limits.request_timeout));
    let app = TowerToHyperService::new(app);
    let served = AtomicUsize::new(0);
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        let last = served.fetch_add(1, Ordering::Relaxed) + 1 >= limits.max_requests_per_connection;
        let answer = hyper::service::Service::call(&app, req);
        async move {
            let mut resp = answer.await?;
            if last {
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, Infallible>(resp)
        }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(limits.max_requests_per_connection > 1)
        .serve_connection(io, service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "admin connection ended");
    }
}

/// A socket whose writes fail once they have made no progress for `limit`:
/// a client that stops reading its answer cannot hold its connection slot.
struct WriteDeadline<S> {
    stream: S,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> WriteDeadline<S> {
    fn new(stream: S, limit: Duration) -> WriteDeadline<S> {
        WriteDeadline {
            stream,
            limit,
            stalled: None,
        }
    }

    /// Arms the timer while the socket does not take bytes, disarms it when
    /// it does; an error once it runs out (the caller polls again when the
    /// timer wakes it).
    fn deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "admin client took no bytes within admin.request_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.deadline(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.deadline(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.deadline(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.deadline(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A peer that never reads: writes stop making progress, and fail after
    /// the limit instead of waiting forever.
    #[tokio::test]
    async fn writes_to_a_client_that_stops_reading_fail_after_the_limit() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut w = WriteDeadline::new(server, Duration::from_millis(200));
        let chunk = vec![0u8; 64 * 1024];
        let outcome = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Err(e) = w.write_all(&chunk).await {
                    return e;
                }
            }
        })
        .await
        .expect("the write fails instead of hanging");
        assert_eq!(outcome.kind(), io::ErrorKind::TimedOut);
        drop(client);
    }
}
