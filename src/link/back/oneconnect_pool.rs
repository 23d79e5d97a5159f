//! The state of a OneConnect pool (`mode = "oneconnect"`): its counters,
//! its node connections and the requests it carries. The tasks that use it
//! live in `oneconnect.rs`; `Service` holds the pool without knowing them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;

use crate::config::{FrontConfig, ListenMode, OneConnectConfig, ServiceConfig};
use crate::route::oneconnect::OneConnectSlots;
use crate::wire::FrameCodec;

/// What a OneConnect pool did, beside the service's usual counters.
#[derive(Debug, Default)]
pub struct OneConnectCounters {
    /// Node connections opened, and connects that failed.
    pub opened: AtomicU64,
    pub connect_failures: AtomicU64,
    /// Requests sent on a connection an earlier request used.
    pub reused: AtomicU64,
    /// Requests that had to wait for a free connection, and those whose
    /// deadline passed while waiting (declined `timeout`).
    pub waited: AtomicU64,
    pub wait_timeouts: AtomicU64,
    /// Connections closed: idle too long, request past its deadline, broken
    /// (closed by the node, unexpected bytes, write error).
    pub closed_idle: AtomicU64,
    pub closed_deadline: AtomicU64,
    pub closed_broken: AtomicU64,
    /// Answers that arrived after their client had gone: counted, dropped.
    pub answers_dropped: AtomicU64,
}

/// A node connection of the pool while it is idle (or leased to a request).
pub(in crate::link) struct PooledConn {
    pub(in crate::link) node: usize,
    pub(in crate::link) frames: FramedRead<TcpStream, FrameCodec>,
}

impl PooledConn {
    /// True if nothing arrived while the connection sat idle: not closed by the
    /// node, no stray bytes (which would be taken for the next answer).
    pub(in crate::link) fn clean(&self) -> bool {
        if !self.frames.read_buffer().is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(
            self.frames.get_ref().try_read(&mut probe),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        )
    }
}

/// The pool of one service.
pub struct OneConnect {
    pub(in crate::link) cfg: OneConnectConfig,
    pub(in crate::link) slots: Mutex<OneConnectSlots<PooledConn>>,
    /// Signalled whenever a slot frees up, for requests waiting for one.
    pub(in crate::link) freed: Notify,
    /// The request tasks; reaped by [`maintain`].
    pub(in crate::link) tasks: Mutex<JoinSet<()>>,
    /// Requests being carried (a graceful stop waits for them).
    pub(in crate::link) carrying: AtomicUsize,
}

/// Counts a request as carried for as long as its task lives.
pub(in crate::link) struct Carrying(pub(in crate::link) Arc<OneConnect>);

impl Drop for Carrying {
    fn drop(&mut self) {
        self.0.carrying.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A OneConnect front whose pool connections would never idle out.
#[derive(Debug, thiserror::Error)]
#[error("front.oneconnect.idle_timeout: must be > 0")]
pub struct IdleTimeoutZero;

impl OneConnect {
    /// The pool of `config`'s service, if its front is in `oneconnect` mode.
    pub fn for_service(config: &ServiceConfig) -> Result<Option<Arc<OneConnect>>, IdleTimeoutZero> {
        let FrontConfig::Listen(front) = &config.front else {
            return Ok(None);
        };
        if front.mode != ListenMode::Oneconnect {
            return Ok(None);
        }
        if front.oneconnect.idle_timeout.is_zero() {
            return Err(IdleTimeoutZero);
        }
        Ok(Some(Arc::new(OneConnect {
            cfg: front.oneconnect,
            slots: Mutex::new(OneConnectSlots::new(
                config.back.nodes.len(),
                config.back.connections_per_node,
            )),
            freed: Notify::new(),
            tasks: Mutex::new(JoinSet::new()),
            carrying: AtomicUsize::new(0),
        })))
    }

    pub(in crate::link) fn slots(&self) -> std::sync::MutexGuard<'_, OneConnectSlots<PooledConn>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections of `node` open now (leased or idle).
    pub fn open(&self, node: usize) -> usize {
        self.slots().open(node)
    }

    /// Connections of `node` idle in the pool now.
    pub fn idle(&self, node: usize) -> usize {
        self.slots().idle(node)
    }

    /// Requests being carried now.
    pub fn in_flight(&self) -> usize {
        self.carrying.load(Ordering::Relaxed)
    }

    /// Request tasks not yet reaped.
    pub fn tasks(&self) -> usize {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
