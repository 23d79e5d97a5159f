//! Runtime node control, as the admin API does it: drain, disable and enable a
//! node, add one, remove one (drain, then remove). Node state lives in the
//! service's `NodePool`, which the router reads too.
//!
//! Each change takes [`SwitchHandle::control`] (no reload runs meanwhile), is
//! applied, recorded as a runtime change against the node's entry in the
//! config file and saved to the data directory, so that reloads and restarts
//! keep it (`ops::runtime_state`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::runtime_state::RuntimeStore;
use crate::config::{Config, NodeConfig};
use crate::link::supervisor::Supervisor;
use crate::link::{self, Running, Service};
use crate::route::AdminState;

/// What the admin API and reload act on: the running services, the task
/// supervisor and the config they run. Cheap to clone.
#[derive(Clone)]
pub struct SwitchHandle {
    pub services: Arc<[Running]>,
    pub supervisor: Arc<Supervisor>,
    /// The config file as last loaded (reload replaces it): what the services
    /// run, before the operators' runtime changes.
    pub config: Arc<Mutex<Config>>,
    /// The file reload reads; `None` for a config given in memory.
    pub source: Arc<Mutex<Option<PathBuf>>>,
    /// The operators' runtime changes. Its lock serialises reloads and the
    /// admin API's node changes: one at a time, each applied whole.
    pub control: Arc<tokio::sync::Mutex<RuntimeStore>>,
    /// Nodes being drained away (service, index), until their removal ends.
    pub(crate) removing: Arc<Mutex<HashSet<(String, usize)>>>,
    /// The store-and-forward queue, when there is a store.
    pub saf: Option<Arc<super::saf::SafView>>,
    /// The admin listener's TLS, once it serves HTTPS (reload re-reads it).
    pub admin_tls: Arc<std::sync::OnceLock<Arc<crate::tls::AdminTls>>>,
    /// The admin audit (changes, refused tokens, reads of card
    /// transactions): in the store when there is one, always in the log.
    pub audit: Arc<super::admin_audit::Audit>,
    /// The admin listener's tokens, once it serves (reload re-reads them).
    pub admin_credentials: Arc<std::sync::OnceLock<Arc<super::admin_auth::Credentials>>>,
    /// The journal, when there is a store and `journal.enabled`: admin
    /// actions are recorded in it.
    pub journal: Option<crate::journal::Journal>,
}

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
    /// The request is not allowed by the config (403): a node outside
    /// `back.allowed_networks`.
    #[error("{0}")]
    NotAllowed(String),
    /// The request conflicts with the current state (409).
    #[error("{0}")]
    Conflict(String),
    /// The change cannot apply to a running switch (409).
    #[error("{0}: restart needed")]
    RestartNeeded(String),
    /// The change applies, but a restart would undo it (500).
    #[error("{done}, but the runtime state was not saved ({reason}): a restart would undo it")]
    NotSaved {
        done: String,
        #[source]
        reason: super::runtime_state::StateFileError,
    },
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
            .view()
            .pool
            .index_of(node.as_bytes())
            .ok_or_else(|| ControlError::NoNode {
                service: service.name().to_string(),
                node: node.to_string(),
            })
    }

    /// Drain (no new requests, in-flight finish), disable (the same, out of
    /// service), force offline (in-flight declined at once, their timeout
    /// reversals stored) or enable (from disabled: back through slow start).
    pub async fn set_node_admin(
        &self,
        service: &str,
        node: &str,
        admin: AdminState,
    ) -> Result<(), ControlError> {
        let mut control = self.control.lock().await;
        let svc = &self.running(service)?.service;
        let index = self.node_index(svc, node)?;
        if self.removals_of(service).contains(&index) {
            return Err(ControlError::Conflict(format!(
                "node `{node}` is being removed"
            )));
        }
        if !svc.set_node_admin(index, admin, Instant::now()) {
            return Err(ControlError::Conflict(format!("node `{node}` is removed")));
        }
        tracing::info!(service, node, ?admin, "node admin state set");
        let now = runtime_entry(svc, index).ok_or_else(|| ControlError::NoNode {
            service: service.to_string(),
            node: node.to_string(),
        })?;
        self.record(&mut control, service, node, Some(now))
            .await
            .map_err(|reason| ControlError::NotSaved {
                done: format!("node `{node}` of `{service}`: {admin:?}"),
                reason,
            })
    }

    /// Adds a node and starts its connections. Returns its index.
    pub async fn add_node(&self, service: &str, cfg: NodeConfig) -> Result<usize, ControlError> {
        let mut control = self.control.lock().await;
        let running = self.running(service)?;
        let svc = &running.service;
        if svc.view().config.f37_stamp.is_some() {
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
        // Before anything connects: an operator's token must not be able to
        // send card data to a host the config file does not allow.
        self.check_allowed(service, &cfg)?;
        let index = svc
            .view()
            .pool
            .add_node(cfg.clone(), Instant::now())
            .map_err(|e| match e {
                crate::link::back::pool::NodeChangeError::BadId(_) => {
                    ControlError::Invalid(e.to_string())
                }
                _ => ControlError::Conflict(e.to_string()),
            })?;
        link::start_node(&self.supervisor, svc, index);
        let id = cfg.id.clone();
        self.record(&mut control, service, &id, Some(cfg))
            .await
            .map_err(|reason| ControlError::NotSaved {
                done: format!("node `{id}` added to `{service}`"),
                reason,
            })?;
        Ok(index)
    }

    /// Drains a node, waits for its in-flight requests (at most the request
    /// timeout plus `extra`), declines what is left, then removes it and
    /// closes its connections. Nothing in flight is lost. The lock is held
    /// only to start the removal: reloads and other changes go on during the
    /// drain.
    pub async fn remove_node(
        &self,
        service: &str,
        node: &str,
        extra: Duration,
    ) -> Result<(), ControlError> {
        let (index, saved) = {
            let mut control = self.control.lock().await;
            let svc = Arc::clone(&self.running(service)?.service);
            let index = self.node_index(&svc, node)?;
            if self.removals_of(service).contains(&index) {
                return Err(ControlError::Conflict(format!(
                    "node `{node}` is already being removed"
                )));
            }
            let live = svc
                .view()
                .pool
                .nodes()
                .iter()
                .filter(|n| !n.is_removed())
                .count();
            if live <= 1 {
                return Err(ControlError::Conflict(format!(
                    "node `{node}` is the last node of service `{service}`"
                )));
            }
            svc.set_node_admin(index, AdminState::Drain, Instant::now());
            self.begin_removal(service, index);
            (index, self.record(&mut control, service, node, None).await)
        };
        self.finish_removal(service, index, extra).await;
        saved.map_err(|reason| ControlError::NotSaved {
            done: format!("node `{node}` drained and removed from `{service}`"),
            reason,
        })
    }

    /// Records what node `node` is now (`None`: removed) as a runtime
    /// change against its entry in the config file, and saves it.
    async fn record(
        &self,
        control: &mut RuntimeStore,
        service: &str,
        node: &str,
        now: Option<NodeConfig>,
    ) -> Result<(), super::runtime_state::StateFileError> {
        let file = self.file_entry(service, node);
        control.state.note(service, node, file.as_ref(), now);
        control.save().await.inspect_err(|e| {
            tracing::error!(service, node, error = %e, "runtime state not saved");
        })
    }

    /// Refuses a node outside the service's `back.allowed_networks` (by
    /// default the configured nodes' own addresses), as the config file
    /// last loaded has them.
    fn check_allowed(&self, service: &str, cfg: &NodeConfig) -> Result<(), ControlError> {
        let config = self.config.lock().unwrap_or_else(|p| p.into_inner());
        let Some(index) = config.services.iter().position(|s| s.name == service) else {
            return Err(ControlError::NoService(service.to_string()));
        };
        let back = &config.services[index].back;
        if back.allows(cfg.address) {
            return Ok(());
        }
        let nets: Vec<String> = back
            .allowed_networks()
            .iter()
            .map(ToString::to_string)
            .collect();
        Err(ControlError::NotAllowed(format!(
            "node `{}` at {}: outside service[{index}].back.allowed_networks ({}); allow its network in the config file first",
            cfg.id,
            cfg.address,
            nets.join(", ")
        )))
    }

    /// Node `node`'s entry in the config file last loaded.
    fn file_entry(&self, service: &str, node: &str) -> Option<NodeConfig> {
        let config = self.config.lock().unwrap_or_else(|p| p.into_inner());
        config
            .services
            .iter()
            .find(|s| s.name == service)?
            .back
            .nodes
            .iter()
            .find(|n| n.id == node)
            .cloned()
    }

    /// The indices of `service`'s nodes being drained away.
    pub fn removals_of(&self, service: &str) -> Vec<usize> {
        self.removing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(s, _)| s == service)
            .map(|&(_, i)| i)
            .collect()
    }

    /// Notes that node `index` is being drained away; [`Self::finish_removal`]
    /// ends it.
    pub fn begin_removal(&self, service: &str, index: usize) {
        self.removing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((service.to_string(), index));
    }

    /// The end of a removal: waits for node `index`'s in-flight requests (at
    /// most the request timeout plus `extra`), declines what is left, marks
    /// it removed and closes its connections.
    pub async fn finish_removal(&self, service: &str, index: usize, extra: Duration) {
        let Ok(running) = self.running(service) else {
            return;
        };
        let svc = Arc::clone(&running.service);
        let deadline = tokio::time::Instant::now() + svc.live().longest_timeout() + extra;
        while svc.view().pool.outstanding(index) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Anything still in flight gets its decline now, before the links go.
        svc.set_node_admin(index, AdminState::ForcedOffline, Instant::now());
        let _ = svc.view().pool.remove_node(index, Instant::now());
        self.supervisor
            .end_scope(&link::node_scope(svc.name(), index));
        self.removing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(service.to_string(), index));
    }
}

/// A live node as a config entry: its address, and its weight, priority and
/// admin state as they are now.
pub(crate) fn runtime_entry(svc: &Service, index: usize) -> Option<NodeConfig> {
    let node = svc.view().pool.node(index)?;
    let st = svc.view().pool.status(index, Instant::now())?;
    Some(NodeConfig {
        id: node.config.id.clone(),
        address: node.config.address,
        weight: st.weight,
        priority: st.priority,
        admin: st.admin,
    })
}
