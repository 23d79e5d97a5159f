//! The `listen` front: clients (POS network controllers, internal apps) connect to
//! the switch; each request is balanced on its own and each answer goes back on
//! the connection that carried the request.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::admission::budget::ClientPermit;
use super::admission::client::{ClientLink, InFlightLimit, canonical_peer};
use crate::capture::{Opened, Tapped};
use crate::config::ListenFront;
use crate::link::io::conns::{ConnKind, Counted, Registered};
use crate::link::io::direct::{self, LinkWriter, Residence, start_writer};
use crate::link::io::frames::LeanFrames;
use crate::link::io::timer::{Read, ReadTimer, TimedFrames};
use crate::link::log_limit::{LogKind, LogPeer};
use crate::link::service::{Refusal, Service};
use crate::wire::{Frame, FrameCodec};

/// Connections open per source IP and in total, to enforce the front's limits.
#[derive(Debug, Default)]
struct Admission {
    per_source: HashMap<IpAddr, Source>,
    total: usize,
}

/// One source IP's open connections and the in-flight limit they share.
#[derive(Debug)]
struct Source {
    connections: usize,
    in_flight: Arc<InFlightLimit>,
}

/// Releases a client's admission slot when its task ends, however it ends.
struct Admitted {
    table: Arc<Mutex<Admission>>,
    ip: IpAddr,
    /// The in-flight limit shared by every connection from this source.
    source_in_flight: Arc<InFlightLimit>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.total = t.total.saturating_sub(1);
        if let Some(src) = t.per_source.get_mut(&self.ip) {
            src.connections = src.connections.saturating_sub(1);
            if src.connections == 0 {
                t.per_source.remove(&self.ip);
            }
        }
    }
}

/// Backoff of an accept loop whose accepts fail (EMFILE and friends): it
/// must neither spin nor write a line every few milliseconds.
pub(in crate::link) struct AcceptBackoff(std::time::Duration);

impl AcceptBackoff {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(50);
    const MAX: std::time::Duration = std::time::Duration::from_secs(1);

    pub(in crate::link) fn new() -> AcceptBackoff {
        AcceptBackoff(Self::FIRST)
    }

    /// An accept succeeded: the next failure backs off from the start.
    pub(in crate::link) fn reset(&mut self) {
        self.0 = Self::FIRST;
    }

    /// An accept failed: logs it (rate-limited) and waits, longer each time
    /// in a row.
    pub(in crate::link) async fn failed(
        &mut self,
        service: &Service,
        what: &str,
        e: &std::io::Error,
    ) {
        if service
            .links
            .log_limit
            .allow(LogKind::AcceptFailed, LogPeer::Service, Instant::now())
        {
            tracing::warn!(service = service.name(), error = %e, retry_in = ?self.0, "{what}: accept failed");
        }
        tokio::time::sleep(self.next()).await;
    }

    /// The wait after this failure; the next one waits twice as long, up to
    /// a second.
    fn next(&mut self) -> std::time::Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        wait
    }
}

fn admit(
    front: &ListenFront,
    table: &Arc<Mutex<Admission>>,
    ip: IpAddr,
) -> Result<Admitted, Refusal> {
    let ip = ip.to_canonical();
    if !front.allow.is_empty() && !front.allow.iter().any(|net| net.contains(&ip)) {
        return Err(Refusal::NotAllowed);
    }
    let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
    if t.total >= front.max_connections {
        return Err(Refusal::TooMany);
    }
    let from_source = t.per_source.entry(ip).or_insert_with(|| Source {
        connections: 0,
        in_flight: InFlightLimit::new(front.max_in_flight_per_source),
    });
    if from_source.connections >= front.max_per_source {
        return Err(Refusal::TooManyFromSource);
    }
    from_source.connections += 1;
    let source_in_flight = Arc::clone(&from_source.in_flight);
    t.total += 1;
    Ok(Admitted {
        table: Arc::clone(table),
        ip,
        source_in_flight,
    })
}

/// Binds the front's address. Split from [`serve`] so a caller learns of a bad
/// address at start-up, and tests can bind port 0.
pub async fn bind(front: &ListenFront) -> std::io::Result<TcpListener> {
    TcpListener::bind(front.listen).await
}

/// Accepts clients until `shutdown` turns true.
pub async fn serve(
    service: Arc<Service>,
    front: ListenFront,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let table = Arc::new(Mutex::new(Admission::default()));
    let mut backoff = AcceptBackoff::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, canonical_peer(peer)),
            Err(e) => {
                backoff.failed(&service, "clients", &e).await;
                continue;
            }
        };
        backoff.reset();
        // Limits as last reloaded; the rest of the front is fixed.
        let front = service.live().listen_front(&front);
        match admission(&service, &front, &table, peer.ip()) {
            Ok((slot, permit)) => {
                service
                    .counters
                    .clients_accepted
                    .fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve_client(Box::new(Accepted {
                    service: Arc::clone(&service),
                    front: ClientSettings::of(&front),
                    stream,
                    peer,
                    shutdown: shutdown.clone(),
                    held: (slot, permit),
                })));
            }
            Err(why) => {
                // Closed at once: the descriptor the accept took comes back
                // before the next accept.
                drop(stream);
                refused(&service, peer, why);
            }
        }
    }
}

/// Whether a client may stay: the switch is not stopping, the front's limits
/// admit it, and the process's client descriptor budget has room.
fn admission(
    service: &Service,
    front: &ListenFront,
    table: &Arc<Mutex<Admission>>,
    ip: IpAddr,
) -> Result<(Admitted, ClientPermit), Refusal> {
    if service.links.is_draining() {
        return Err(Refusal::Shutdown);
    }
    let slot = admit(front, table, ip)?;
    let permit = service
        .links
        .budget()
        .try_admit()
        .ok_or(Refusal::Descriptors)?;
    Ok((slot, permit))
}

/// Counts a refused client by reason and logs it (rate-limited).
fn refused(service: &Service, peer: SocketAddr, why: Refusal) {
    service.counters.clients_refused[why as usize].fetch_add(1, Ordering::Relaxed);
    if why == Refusal::Shutdown
        || !service
            .links
            .log_limit
            .allow(LogKind::Refused, LogPeer::Ip(peer.ip()), Instant::now())
    {
        return;
    }
    if why == Refusal::Descriptors {
        let budget = service.links.budget();
        tracing::warn!(service = service.name(), %peer, open = budget.open(), budget = budget.limit(), "client refused: the clients' share of the open-file limit is in use (raise LimitNOFILE)");
    } else {
        tracing::warn!(service = service.name(), %peer, reason = why.as_str(), "client refused");
    }
}

/// What a client's task keeps of its front, taken when it is accepted (a
/// reload applies to clients accepted after it). Not the whole
/// [`ListenFront`]: every client task would carry the front's allow list and
/// TLS table for as long as it lives.
#[derive(Clone, Copy, Debug)]
struct ClientSettings {
    write_queue: usize,
    max_in_flight: usize,
    idle_timeout: std::time::Duration,
    partial_frame_timeout: std::time::Duration,
}

impl ClientSettings {
    fn of(front: &ListenFront) -> ClientSettings {
        ClientSettings {
            write_queue: front.write_queue,
            max_in_flight: front.max_in_flight_per_connection,
            idle_timeout: front.idle_timeout,
            partial_frame_timeout: front.partial_frame_timeout,
        }
    }
}

/// What the accept loop hands a client's task. Boxed: an async fn keeps
/// its arguments' storage for as long as it runs, so the task's future
/// keeps 8 bytes of this for the connection's life, not these fields
/// (a tokio task is its future, cache-line aligned: every byte of it is
/// paid by each of a front's thousands of quiet terminals).
struct Accepted {
    service: Arc<Service>,
    front: ClientSettings,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
    /// The front's admission slot and the descriptor budget's permit, given
    /// back when the task ends.
    held: (Admitted, ClientPermit),
}

/// A client's reader, as [`serve_client`] frames it.
type ClientFrames = TimedFrames<Counted<Tapped<crate::tls::LinkRead>>>;

/// A connected client, between its setup and its end.
struct Connected {
    service: Arc<Service>,
    client: ClientLink,
    frames: ClientFrames,
    writer: LinkWriter,
    registered: Registered,
    shutdown: watch::Receiver<bool>,
    held: (Admitted, ClientPermit),
}

/// A client's task: its setup, its read loop, then its end. Each step is a
/// future of its own, so the setup's (a TLS handshake's) and the end's
/// (a linger timer's) do not sit beside the read loop's for the
/// connection's life; the end's is boxed, made only when the client goes.
async fn serve_client(accepted: Box<Accepted>) {
    let Some(mut connected) = connect(accepted).await else {
        return;
    };
    let why = connected.read().await;
    Box::pin(connected.end(why)).await;
}

/// Registers the connection, runs the TLS handshake if the front has one,
/// and sets up the client's reader and writer. `None` when the handshake
/// failed (counted and logged).
async fn connect(accepted: Box<Accepted>) -> Option<Connected> {
    let Accepted {
        service,
        front,
        stream,
        peer,
        shutdown,
        held,
    } = *accepted;
    let conn = service.links.next_conn_id();
    let local = stream.local_addr().unwrap_or(peer);
    let registered = service
        .links
        .table
        .register(conn, ConnKind::Client, None, peer, local);
    let _ = stream.set_nodelay(true);
    let tap = service.links.tap(&stream, Opened::ByPeer);
    let stream = match service.links.tls.front.as_ref() {
        None => crate::tls::LinkStream::Plain(stream),
        // Boxed: a handshake's future inline would size every client's.
        Some(side) => {
            Box::pin(crate::link::io::secure::accept(
                service.handshake_book(),
                Some(side),
                stream,
                peer,
                Some(&registered.entry),
            ))
            .await?
        }
    };
    let (read, write) = stream.into_split();
    let read = Counted::new(
        Tapped::reader(read, &tap),
        Some(Arc::clone(&registered.entry)),
    );
    let prefix = service.spec().framing().prefix;
    let (tx, writer) = start_writer(
        write,
        &tap,
        prefix,
        front.write_queue,
        Some(Arc::clone(&registered.entry)),
        Residence::WhileBusy,
    );
    let client = ClientLink {
        conn,
        peer,
        tx,
        in_flight: InFlightLimit::new(front.max_in_flight),
        source_in_flight: Arc::clone(&held.0.source_in_flight),
    };
    registered.entry.track_in_flight(client.in_flight.clone());
    let codec = FrameCodec::new(prefix, service.spec().framing().max_frame);
    let frames = LeanFrames::new(read, codec);
    tracing::debug!(service = service.name(), %peer, conn, "client connected");
    let now = Instant::now();
    let timer = ReadTimer::new(front.idle_timeout, front.partial_frame_timeout, now);
    Some(Connected {
        service,
        client,
        frames: TimedFrames::new(frames, timer, now),
        writer,
        registered,
        shutdown,
        held,
    })
}

impl Connected {
    /// Reads and handles the client's frames until it goes, a read
    /// timeout passes, its writer fails or the switch stops.
    async fn read(&mut self) -> Ended {
        let Connected {
            service,
            client,
            frames,
            writer,
            registered,
            shutdown,
            ..
        } = self;
        // Made once: a fresh `changed()` per frame would join and leave the
        // watch's waiter list (a lock each way) for every message.
        let stopping = shutdown.changed();
        tokio::pin!(stopping);
        loop {
            // Frames first: when one is ready the other branches are not polled.
            // A client cannot starve them: the socket's reads spend tokio's
            // cooperative budget, and a spent budget reads as pending.
            let item = tokio::select! {
                biased;
                read = frames.next() => match read {
                    Read::Frame(item) => item,
                    Read::TimedOut(t) => return Ended::Other(t.as_str().to_string()),
                },
                res = &mut *writer => return Ended::Other(format!("writer ended: {res:?}")),
                _ = &mut stopping => return Ended::Other("shutdown".to_string()),
            };
            // One clock read per frame serves the timer and the request's timing.
            let now = Instant::now();
            frames.frame(now);
            registered.entry.received();
            match item {
                Some(Ok(Frame::Message(payload))) => {
                    // A request with another behind it in the read buffer holds
                    // its writes back until the last one (one write per link).
                    let more = direct::frame_ready(frames.framed());
                    let keep = direct::corked(more, || match service.side.oneconnect() {
                        Some(oc) => {
                            super::oneconnect::on_request(service, oc, client, payload, now)
                        }
                        None => service.on_request(client, payload, now),
                    });
                    if !keep {
                        return Ended::Other("bad request (on_bad_message = close)".into());
                    }
                }
                Some(Ok(Frame::KeepAlive | Frame::SessionControl(_))) => {
                    // It may end a burst whose requests were held back.
                    direct::flush_corked();
                    service.counters.keep_alives.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(e)) if is_disconnect(&e) => {
                    return Ended::Other(format!("disconnected: {e}"));
                }
                Some(Err(e)) => {
                    service.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                    return Ended::Other(format!("untrusted frame: {e}"));
                }
                None => return Ended::HalfClosed,
            }
        }
    }

    /// Lets the answers still owed go out, then closes the client.
    async fn end(self, why: Ended) {
        let Connected {
            service,
            client,
            frames,
            mut writer,
            registered,
            shutdown: _,
            held,
        } = self;
        direct::flush_corked();
        drop(frames);
        if matches!(why, Ended::HalfClosed) {
            // Answers still owed go out, but may never be read: each approval
            // among them is checked for a reset afterwards (Service::deliver).
            client.tx.mark_peer_closed();
        }
        let (conn, peer) = (client.conn, client.peer);
        // The link ends once every sender is gone: ours, and the one each
        // request in flight holds until it is answered or declined.
        drop(client);
        let linger = match &why {
            // A client that closed its sending side may still be reading: every
            // answer in flight reaches it, until the last deadline has passed.
            Ended::HalfClosed => {
                service.live().longest_timeout() + crate::link::SWEEP_INTERVAL * 10
            }
            // Let queued answers (e.g. the decline for a bad request) flush briefly.
            Ended::Other(_) => std::time::Duration::from_millis(200),
        };
        writer.finish(linger).await;
        service
            .counters
            .clients_closed
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(service = service.name(), %peer, conn, reason = %why, "client disconnected");
        drop(registered);
        drop(held);
    }
}

/// Why a client's read side ended.
enum Ended {
    /// The client closed its sending side (or the whole connection).
    HalfClosed,
    Other(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::HalfClosed => f.write_str("closed by client"),
            Ended::Other(why) => f.write_str(why),
        }
    }
}

/// A transport error (a reset, an aborted connection) is the client going
/// away, not a frame that could not be trusted.
fn is_disconnect(e: &crate::wire::FrameError) -> bool {
    matches!(e, crate::wire::FrameError::Io(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn front(allow: &[&str], max: usize, per_source: usize) -> ListenFront {
        let toml = format!(
            "listen = \"127.0.0.1:0\"\nmax_connections = {max}\nmax_per_source = {per_source}\nallow = [{}]",
            allow
                .iter()
                .map(|a| format!("\"{a}\""))
                .collect::<Vec<_>>()
                .join(",")
        );
        toml::from_str(&toml).unwrap()
    }

    /// What one client connection holds, in bytes, as this build lays it
    /// out (`cargo test --lib per_client_sizes -- --nocapture`; numbers in
    /// docs/bench/memory-connection-churn-and-requests-in-flight.md). A
    /// tokio task is its future plus about 104 bytes of header and trailer,
    /// rounded up to 128 (its cell is cache-line aligned).
    #[test]
    fn per_client_sizes() {
        use std::mem::size_of;
        fn future_size<A, F: Future>(_: fn(A) -> F) -> usize {
            size_of::<F>()
        }
        let task = |future: usize| (future + 104).div_ceil(128) * 128;
        let client = future_size(serve_client);
        let sizes = [
            ("client task's future (serve_client)", client),
            ("  its task cell", task(client)),
            ("  Connected (what it keeps)", size_of::<Connected>()),
            ("  Accepted (boxed, until set up)", size_of::<Accepted>()),
            (
                "TimedFrames (reader, codec, timer)",
                size_of::<ClientFrames>(),
            ),
            ("  boxed Sleep", size_of::<tokio::time::Sleep>()),
            ("ClientLink", size_of::<ClientLink>()),
            (
                "ConnEntry (in an Arc)",
                size_of::<crate::link::io::conns::ConnEntry>(),
            ),
            ("InFlightLimit (in an Arc)", size_of::<InFlightLimit>()),
        ];
        for (what, n) in sizes.iter().chain(crate::link::io::direct::sizes().iter()) {
            println!("{what:<45} {n:>5}");
        }
    }

    #[test]
    fn failed_accepts_back_off_to_a_second_and_start_over_after_one_succeeds() {
        let ms = std::time::Duration::from_millis;
        let mut b = AcceptBackoff::new();
        let waits: Vec<_> = (0..7).map(|_| b.next()).collect();
        assert_eq!(
            waits,
            [
                ms(50),
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1000),
                ms(1000)
            ]
        );
        b.reset();
        assert_eq!(b.next(), ms(50));
    }

    #[test]
    fn admission_enforces_allow_list_and_limits() {
        let f = front(&["127.0.0.0/8"], 3, 2);
        let table = Arc::new(Mutex::new(Admission::default()));
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo2: IpAddr = "127.0.0.2".parse().unwrap();
        let outside: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(admit(&f, &table, outside).err(), Some(Refusal::NotAllowed));
        let a = admit(&f, &table, lo).unwrap();
        let _b = admit(&f, &table, lo).unwrap();
        assert_eq!(
            admit(&f, &table, lo).err(),
            Some(Refusal::TooManyFromSource)
        );
        let _c = admit(&f, &table, lo2).unwrap();
        assert_eq!(admit(&f, &table, lo2).err(), Some(Refusal::TooMany));
        drop(a);
        assert!(admit(&f, &table, lo).is_ok());
    }
}
