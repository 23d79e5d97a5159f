//! The `listen` front: clients (POS network controllers, internal apps) connect to
//! the switch; each request is balanced on its own and each answer goes back on
//! the connection that carried the request.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;

use super::service::Service;
use super::timer::{ReadTimer, in_frame};
use super::writer::run_coalescing_writer;
use crate::capture::{Opened, Tapped};
use crate::ops::config::ListenFront;
use crate::wire::{Frame, FrameCodec};

/// Connections open per source IP and in total, to enforce the front's limits.
#[derive(Debug, Default)]
struct Admission {
    per_source: HashMap<IpAddr, usize>,
    total: usize,
}

/// Releases a client's admission slot when its task ends, however it ends.
struct Admitted {
    table: Arc<Mutex<Admission>>,
    ip: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.total = t.total.saturating_sub(1);
        if let Some(n) = t.per_source.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                t.per_source.remove(&self.ip);
            }
        }
    }
}

/// Why a client was refused at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    NotAllowed,
    TooMany,
    TooManyFromSource,
}

fn admit(
    front: &ListenFront,
    table: &Arc<Mutex<Admission>>,
    ip: IpAddr,
) -> Result<Admitted, Refused> {
    if !front.allow.is_empty() && !front.allow.iter().any(|net| net.contains(&ip)) {
        return Err(Refused::NotAllowed);
    }
    let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
    if t.total >= front.max_connections {
        return Err(Refused::TooMany);
    }
    let from_source = t.per_source.entry(ip).or_insert(0);
    if *from_source >= front.max_per_source {
        return Err(Refused::TooManyFromSource);
    }
    *from_source += 1;
    t.total += 1;
    Ok(Admitted {
        table: Arc::clone(table),
        ip,
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
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(service = service.name(), error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if service.is_draining() {
            // Shutting down: no new clients.
            service
                .counters
                .clients_refused
                .fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        match admit(&front, &table, peer.ip()) {
            Ok(slot) => {
                service
                    .counters
                    .clients_accepted
                    .fetch_add(1, Ordering::Relaxed);
                let svc = Arc::clone(&service);
                let f = front.clone();
                let sd = shutdown.clone();
                tokio::spawn(async move {
                    serve_client(svc, f, stream, peer, sd).await;
                    drop(slot);
                });
            }
            Err(why) => {
                service
                    .counters
                    .clients_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = service.name(), %peer, reason = ?why, "client refused");
                drop(stream);
            }
        }
    }
}

async fn serve_client(
    service: Arc<Service>,
    front: ListenFront,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    let conn = service.next_conn_id();
    let _ = stream.set_nodelay(true);
    let tap = service.capture_tap(&stream, Opened::ByPeer);
    let (read, write) = stream.into_split();
    let (read, write) = (Tapped::reader(read, &tap), Tapped::writer(write, &tap));
    let (tx, rx) = mpsc::channel(front.write_queue);
    let prefix = service.spec.framing().prefix;
    let mut writer = tokio::spawn(run_coalescing_writer(write, prefix, rx));
    let codec = FrameCodec::new(prefix, service.spec.framing().max_frame);
    let mut frames = FramedRead::new(read, codec);
    tracing::debug!(service = service.name(), %peer, conn, "client connected");
    let mut timer = ReadTimer::new(
        front.idle_timeout,
        front.partial_frame_timeout,
        Instant::now(),
    );
    let mut tick = tokio::time::interval(timer.tick_period());
    let why = loop {
        let item = tokio::select! {
            item = frames.next() => item,
            _ = tick.tick() => {
                match timer.check(in_frame(&frames), Instant::now()) {
                    Some(t) => break t.as_str().to_string(),
                    None => continue,
                }
            }
            res = &mut writer => break format!("writer ended: {res:?}"),
            _ = shutdown.changed() => break "shutdown".to_string(),
        };
        timer.frame(Instant::now());
        match item {
            Some(Ok(Frame::Message(payload))) => {
                if !service.on_request(conn, &tx, payload, Instant::now()) {
                    break "unparsable message".to_string();
                }
            }
            Some(Ok(Frame::KeepAlive | Frame::SessionControl(_))) => {
                service.counters.keep_alives.fetch_add(1, Ordering::Relaxed);
            }
            Some(Err(e)) => {
                service.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                break format!("untrusted frame: {e}");
            }
            None => break "closed by client".to_string(),
        }
    };
    // Answers still in flight for this client have nowhere to go once the queue
    // closes; they are counted as undeliverable when they arrive.
    drop(tx);
    if !writer.is_finished() {
        // Let queued answers (e.g. the decline for the bad message) flush briefly.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(200), &mut writer).await;
        writer.abort();
    }
    tracing::info!(service = service.name(), %peer, conn, reason = %why, "client disconnected");
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

    #[test]
    fn admission_enforces_allow_list_and_limits() {
        let f = front(&["127.0.0.0/8"], 3, 2);
        let table = Arc::new(Mutex::new(Admission::default()));
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo2: IpAddr = "127.0.0.2".parse().unwrap();
        let outside: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(admit(&f, &table, outside).err(), Some(Refused::NotAllowed));
        let a = admit(&f, &table, lo).unwrap();
        let _b = admit(&f, &table, lo).unwrap();
        assert_eq!(
            admit(&f, &table, lo).err(),
            Some(Refused::TooManyFromSource)
        );
        let _c = admit(&f, &table, lo2).unwrap();
        assert_eq!(admit(&f, &table, lo2).err(), Some(Refused::TooMany));
        drop(a);
        assert!(admit(&f, &table, lo).is_ok());
    }
}
