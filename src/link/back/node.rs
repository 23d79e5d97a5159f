//! Node connections: K per node, each kept up by its own task with exponential
//! backoff and jitter, each with one writer task and one reader loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::codec::FramedRead;

use super::pool::ConnHandle;
use crate::capture::{Opened, Tapped};
use crate::link::io::direct::{self, Residence, start_writer};
use crate::link::io::timer::{ReadTimer, in_frame};
use crate::link::log_limit::{LogKind, LogPeer};
use crate::link::service::Service;
use crate::wire::{Frame, FrameCodec};

/// Keeps connection `slot` of `node` up until `shutdown` turns true.
pub async fn keep_connected(
    service: Arc<Service>,
    node: usize,
    slot: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(addr) = service.pool.node(node).map(|n| n.config.address) else {
        return;
    };
    let back = service.config.back.clone();
    let mut backoff = Backoff::new(back.reconnect_min, back.reconnect_max, seed(node, slot));
    while !*shutdown.borrow() {
        let attempt = tokio::time::timeout(back.connect_timeout, TcpStream::connect(addr)).await;
        match attempt {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                let tls = service.links.tls.back.as_ref();
                match crate::link::io::secure::connect(service.handshake_book(), tls, stream, addr)
                    .await
                {
                    Ok(link) => {
                        backoff.reset();
                        run_connection(&service, node, slot, link, &mut shutdown).await;
                    }
                    Err(why) => {
                        let why = format!("TLS handshake failed: {}", why.as_str());
                        connect_failed(&service, node, slot, &why);
                    }
                }
            }
            Ok(Err(e)) => connect_failed(&service, node, slot, &e.to_string()),
            Err(_) => connect_failed(&service, node, slot, "timed out"),
        }
        let wait = backoff.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
    }
}

async fn run_connection(
    service: &Arc<Service>,
    node: usize,
    slot: usize,
    stream: crate::tls::LinkStream,
    shutdown: &mut watch::Receiver<bool>,
) {
    let id = service.links.next_conn_id();
    let (peer, local) = (stream.tcp().peer_addr(), stream.tcp().local_addr());
    let registered = match (peer, local) {
        (Ok(p), Ok(l)) => Some(service.links.table.register(
            id,
            crate::link::io::conns::ConnKind::Node,
            Some(node_name(service, node)),
            p,
            l,
        )),
        _ => None,
    };
    let tap = service.links.tap(stream.tcp(), Opened::BySwitch);
    crate::link::io::secure::show(&stream, registered.as_ref().map(|r| &*r.entry));
    let (read, write) = stream.into_split();
    let entry = registered.as_ref().map(|r| Arc::clone(&r.entry));
    let read = crate::link::io::conns::Counted::new(Tapped::reader(read, &tap), entry.clone());
    let prefix = service.spec().framing().prefix;
    let queue = service.config.back.write_queue;
    let (tx, mut writer) = start_writer(write, &tap, prefix, queue, entry, Residence::Resident);
    let handle = ConnHandle { id, tx };
    service
        .pool
        .set_conn(node, slot, Some(handle), Instant::now());
    if let Some(n) = service.pool.node(node) {
        n.counters
            .connects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    tracing::info!(service = service.name(), node = %node_name(service, node), slot, conn = id, "node connection up");
    let codec = FrameCodec::new(prefix, service.spec().framing().max_frame);
    let mut frames = FramedRead::new(read, codec);
    // A node that stalls inside a frame holds every response behind it: close
    // the connection (its requests are declined) instead of waiting. Nodes
    // may be quiet for long: no idle timeout.
    let mut timer = ReadTimer::new(
        Duration::ZERO,
        service.config.back.partial_frame_timeout,
        Instant::now(),
    );
    let mut tick = tokio::time::interval(timer.tick_period());
    // Made once, and frames polled first: see `front::serve_client`.
    let stopping = shutdown.changed();
    tokio::pin!(stopping);
    let why = loop {
        tokio::select! {
            biased;
            item = frames.next() => {
                // One clock read per frame serves the timer and the answer's latency.
                let now = Instant::now();
                timer.frame(now);
                if let Some(r) = &registered {
                    r.entry.received();
                }
                match item {
                    Some(Ok(Frame::Message(payload))) => {
                        // Answers read together leave together (see front.rs).
                        let more = direct::frame_ready(&frames);
                        direct::corked(more, || service.on_node_frame(node, id, payload, now));
                    }
                    // It may end a burst whose answers were held back.
                    Some(Ok(Frame::KeepAlive | Frame::SessionControl(_))) => direct::flush_corked(),
                    Some(Err(e)) => break format!("bad frame: {e}"),
                    None => break "closed by node".to_string(),
                }
            }
            _ = tick.tick() => {
                if let Some(t) = timer.check(in_frame(&frames), Instant::now()) {
                    break t.as_str().to_string();
                }
            }
            res = &mut writer => break format!("writer ended: {res:?}"),
            _ = &mut stopping => break "shutdown".to_string(),
        }
    };
    direct::flush_corked();
    writer.abort();
    service.pool.set_conn(node, slot, None, Instant::now());
    if let Some(n) = service.pool.node(node) {
        n.counters
            .disconnects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let declined = service.connection_lost(id, Instant::now());
    if why == "shutdown" {
        tracing::info!(service = service.name(), node = %node_name(service, node), slot, conn = id, "node connection closed: shutdown");
    } else {
        tracing::warn!(service = service.name(), node = %node_name(service, node), slot, conn = id, reason = %why, declined, "node connection down");
    }
}

/// A failed connect is what an operator needs to see first when a node is
/// unreachable: WARN, rate-limited per node (K slots retry with backoff).
fn connect_failed(service: &Service, node: usize, slot: usize, why: &str) {
    if let Some(n) = service.pool.node(node) {
        n.counters
            .connect_failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if service
        .links
        .log_limit
        .allow(LogKind::NodeConnect, LogPeer::Node(node), Instant::now())
    {
        tracing::warn!(service = service.name(), node = %node_name(service, node), slot, error = %why, "node connect failed");
    }
}

fn node_name(service: &Service, node: usize) -> String {
    service
        .pool
        .node(node)
        .map_or_else(|| node.to_string(), |n| n.config.id.clone())
}

fn seed(node: usize, slot: usize) -> u64 {
    crate::util::rng::entropy_seed() ^ ((node as u64) << 32) ^ (slot as u64)
}

/// Exponential backoff with full jitter in [d/2, d].
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
    rng: crate::util::Rng,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            min,
            max,
            current: min,
            rng: crate::util::Rng::new(seed),
        }
    }

    pub fn reset(&mut self) {
        self.current = self.min;
    }

    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        let half = d / 2;
        let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let extra = self.rng.below_u64(jitter_ns);
        self.current = (self.current * 2).min(self.max);
        half + Duration::from_nanos(extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_max_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 42);
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            let d = b.next_delay();
            ceilings.push(d);
        }
        assert!(
            ceilings[0] >= Duration::from_millis(50) && ceilings[0] <= Duration::from_millis(100)
        );
        assert!(
            ceilings[1] >= Duration::from_millis(100) && ceilings[1] <= Duration::from_millis(200)
        );
        assert!(ceilings.iter().all(|d| *d <= Duration::from_secs(1)));
        assert!(ceilings[7] >= Duration::from_millis(500));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
