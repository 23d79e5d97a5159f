//! Runtime node control, shared by the admin API and config reload: drain,
//! disable and enable a node, add one, remove one (drain, then remove). Node
//! state lives in the service's `NodePool`, which the router reads too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::NodeConfig;
use super::run::SwitchHandle;
use crate::link::{self, Running, Service};
use crate::route::AdminState;

/// Why a control request was refused. Each maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no service `{0}`")]
    NoService(String),
    #[error("service `{service}` has no node `{node}`")]
    NoNode { service: String, node: String },
    /// The request itself is wrong (400).
    #[error("{0}")]
    Invalid(String),
    /// The request conflicts with the current state (409).
    #[error("{0}")]
    Conflict(String),
    /// The change cannot apply to a running switch (409).
    #[error("{0}: restart needed")]
    RestartNeeded(String),
}

impl SwitchHandle {
    pub fn running(&self, service: &str) -> Result<&Running, ControlError> {
        self.services
            .iter()
            .find(|r| r.service.name() == service)
            .ok_or_else(|| ControlError::NoService(service.to_string()))
    }

    fn node_index(&self, service: &Service, node: &str) -> Result<usize, ControlError> {
        service
            .pool
            .index_of(node.as_bytes())
            .ok_or_else(|| ControlError::NoNode {
                service: service.name().to_string(),
                node: node.to_string(),
            })
    }

    /// Drain (no new requests, in-flight finish), disable (in-flight declined
    /// at once) or enable (back through slow start).
    pub fn set_node_admin(
        &self,
        service: &str,
        node: &str,
        admin: AdminState,
    ) -> Result<(), ControlError> {
        let svc = &self.running(service)?.service;
        let index = self.node_index(svc, node)?;
        if !svc.set_node_admin(index, admin, Instant::now()) {
            return Err(ControlError::Conflict(format!("node `{node}` is removed")));
        }
        tracing::info!(service, node, ?admin, "node admin state set");
        Ok(())
    }

    /// Adds a node and starts its connections. Returns its index.
    pub fn add_node(&self, service: &str, cfg: NodeConfig) -> Result<usize, ControlError> {
        let running = self.running(service)?;
        let svc = &running.service;
        if svc.config.f37_stamp.is_some() {
            // The F37 stamp table is fixed at start (stamps route responses
            // statelessly, across switch instances).
            return Err(ControlError::RestartNeeded(format!(
                "service `{service}` stamps F37 with node IDs; adding node `{}`",
                cfg.id
            )));
        }
        if cfg.weight == 0 {
            return Err(ControlError::Invalid("weight: must be at least 1".into()));
        }
        let index = svc
            .pool
            .add_node(cfg, Instant::now())
            .map_err(|e| match e {
                crate::link::pool::NodeChangeError::BadId(_) => {
                    ControlError::Invalid(e.to_string())
                }
                _ => ControlError::Conflict(e.to_string()),
            })?;
        link::start_node(&self.supervisor, svc, index);
        Ok(index)
    }

    /// Drains a node, waits for its in-flight requests (at most the request
    /// timeout plus `extra`), declines what is left, then removes it and
    /// closes its connections. Nothing in flight is lost.
    pub async fn remove_node(
        &self,
        service: &str,
        node: &str,
        extra: Duration,
    ) -> Result<(), ControlError> {
        let svc = Arc::clone(&self.running(service)?.service);
        let index = self.node_index(&svc, node)?;
        let live = svc.pool.nodes().iter().filter(|n| !n.is_removed()).count();
        if live <= 1 {
            return Err(ControlError::Conflict(format!(
                "node `{node}` is the last node of service `{service}`"
            )));
        }
        svc.set_node_admin(index, AdminState::Drain, Instant::now());
        self.finish_removal(service, index, extra).await;
        Ok(())
    }

    /// The end of a removal: waits for node `index`'s in-flight requests (at
    /// most the request timeout plus `extra`), declines what is left, marks
    /// it removed and closes its connections.
    pub async fn finish_removal(&self, service: &str, index: usize, extra: Duration) {
        let Ok(running) = self.running(service) else {
            return;
        };
        let svc = Arc::clone(&running.service);
        let deadline = tokio::time::Instant::now() + svc.request_timeout() + extra;
        while svc.pool.outstanding(index) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Anything still in flight gets its decline now, before the links go.
        svc.set_node_admin(index, AdminState::Disabled, Instant::now());
        let _ = svc.pool.remove_node(index, Instant::now());
        self.supervisor
            .end_scope(&link::node_scope(svc.name(), index));
    }
}
