//! Hot reload (SIGHUP, `POST /api/v1/reload`): read and validate the config
//! file; if it is invalid, or changes what cannot change live, refuse and keep
//! running the old one. Otherwise apply the node changes (add, remove after a
//! drain, address, weight, priority, admin state) and the health thresholds,
//! without touching any link the change does not concern.
//!
//! What applies live: the node pool, health thresholds and check timing,
//! timeouts and decline codes (for the requests that come after the reload),
//! `correlation.max_in_flight`, and a listen front's connection and in-flight
//! limits (for the connections accepted after it). Keys read from the
//! service's fixed config (the rest of the front, spec, the correlation key,
//! write queues, balancing, rules, F37 stamp, the health check kind) are
//! refused with "restart needed", named.

use std::fmt;
use std::time::{Duration, Instant};

use super::config::{Config, NodeConfig, ServiceConfig};
use super::control::ControlError;
use super::run::SwitchHandle;
use crate::route::AdminState;

/// Why a reload was refused; the old config keeps running.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("no config file to reload (the switch runs a config given in memory)")]
    NoSource,
    #[error("{0}")]
    Invalid(String),
    #[error("{0}: restart needed")]
    RestartNeeded(String),
    #[error("{0}")]
    Apply(#[from] ControlError),
}

/// What a reload changed, one line per change.
#[derive(Debug, Default, serde::Serialize)]
pub struct ReloadReport {
    pub changes: Vec<String>,
}

impl fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.changes.is_empty() {
            return f.write_str("no change");
        }
        f.write_str(&self.changes.join("; "))
    }
}

/// Reloads from the file the switch was started with.
pub async fn reload(handle: &SwitchHandle) -> Result<ReloadReport, ReloadError> {
    let path = handle
        .source
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or(ReloadError::NoSource)?;
    let new = Config::load(&path)
        .map_err(|e| ReloadError::Invalid(format!("{}: {e}", path.display())))?;
    apply(handle, new).await
}

/// Applies a validated config to the running switch, or refuses it whole.
pub async fn apply(handle: &SwitchHandle, new: Config) -> Result<ReloadReport, ReloadError> {
    let old = handle
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    check_live(&old, &new)?;
    let mut report = ReloadReport::default();
    let mut removals = Vec::new();
    for svc in &new.services {
        plan_service(handle, svc, &mut report, &mut removals)?;
    }
    *handle.config.lock().unwrap_or_else(|p| p.into_inner()) = new;
    for (service, node) in removals {
        report
            .changes
            .push(format!("{service}: node {node} draining, then removed"));
        let h = handle.clone();
        tokio::spawn(async move {
            if let Err(e) = h.remove_node(&service, &node, Duration::from_secs(1)).await {
                tracing::error!(service, node, error = %e, "reload: node removal failed");
            }
        });
    }
    tracing::info!(%report, "config reloaded");
    Ok(report)
}

/// Refuses changes that need a restart, naming the first key that differs.
fn check_live(old: &Config, new: &Config) -> Result<(), ReloadError> {
    if old.admin != new.admin {
        return Err(ReloadError::RestartNeeded("admin".into()));
    }
    let names = |c: &Config| {
        c.services
            .iter()
            .map(|s| s.name.clone())
            .collect::<Vec<_>>()
    };
    if names(old) != names(new) {
        return Err(ReloadError::RestartNeeded(format!(
            "service: the list of services changed ({:?} -> {:?})",
            names(old),
            names(new)
        )));
    }
    for (i, (a, b)) in old.services.iter().zip(&new.services).enumerate() {
        let (a, b) = (fixed_part(a)?, fixed_part(b)?);
        if let Some(key) = first_difference(&a, &b, "") {
            return Err(ReloadError::RestartNeeded(format!("service[{i}].{key}")));
        }
    }
    Ok(())
}

/// A service config without what reload can change: nodes and the health
/// thresholds (the check kind and timing stay).
fn fixed_part(svc: &ServiceConfig) -> Result<serde_json::Value, ReloadError> {
    let mut v = serde_json::to_value(svc).map_err(|e| ReloadError::Invalid(e.to_string()))?;
    if let Some(top) = v.as_object_mut() {
        // Read per request from the running service (`Service::set_live`).
        top.remove("timeouts");
        top.remove("declines");
        if let Some(c) = top.get_mut("correlation").and_then(|c| c.as_object_mut()) {
            c.remove("max_in_flight");
        }
        // A listen front's limits, read per accepted connection.
        if let Some(front) = top.get_mut("front").and_then(|f| f.as_object_mut()) {
            for key in crate::link::service::ListenLimits::KEYS {
                front.remove(key);
            }
        }
    }
    if let Some(back) = v.get_mut("back").and_then(|b| b.as_object_mut()) {
        back.remove("node");
        back.remove("nodes");
        if let Some(health) = back.get_mut("health").and_then(|h| h.as_object_mut()) {
            // The check kind stays; its interval and timeout apply live.
            health.retain(|k, _| k == "check");
        }
    }
    Ok(v)
}

fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> Option<String> {
    use serde_json::Value::Object;
    match (a, b) {
        (Object(x), Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let null = serde_json::Value::Null;
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                first_difference(x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), &path)
            })
        }
        _ if a == b => None,
        _ => Some(if at.is_empty() {
            "(root)".into()
        } else {
            at.to_string()
        }),
    }
}

/// Applies one service's node and health changes; queues removals.
fn plan_service(
    handle: &SwitchHandle,
    svc: &ServiceConfig,
    report: &mut ReloadReport,
    removals: &mut Vec<(String, String)>,
) -> Result<(), ReloadError> {
    let running = handle.running(&svc.name)?;
    let service = &running.service;
    let pool = &service.pool;
    let now = Instant::now();
    let stamped = svc.f37_stamp.is_some();
    // Refuse before changing anything.
    for (i, n) in svc.back.nodes.iter().enumerate() {
        let live = pool.index_of(n.id.as_bytes()).and_then(|x| pool.node(x));
        let moved = live.is_some_and(|l| l.config.address != n.address);
        if stamped && (live.is_none() || moved) {
            return Err(ReloadError::RestartNeeded(format!(
                "service `{}`: back.node[{i}] (`{}`) is new or moved, and the service stamps F37 with node IDs",
                svc.name, n.id
            )));
        }
    }
    pool.set_health_config(svc.back.health.state);
    if service.request_timeout() != svc.timeouts.request {
        report.changes.push(format!(
            "{}: timeouts.request {:?} -> {:?}",
            svc.name,
            service.request_timeout(),
            svc.timeouts.request
        ));
    }
    service.set_live(&svc.timeouts, svc.declines);
    let health = &svc.back.health;
    service.set_checks_and_cap(
        health.interval,
        health.timeout,
        svc.correlation.max_in_flight,
    );
    if let crate::config::FrontConfig::Listen(front) = &svc.front {
        service.set_listen_limits(front);
    }
    for n in &svc.back.nodes {
        match pool.index_of(n.id.as_bytes()) {
            None => {
                handle.add_node(&svc.name, n.clone())?;
                report
                    .changes
                    .push(format!("{}: node {} added", svc.name, n.id));
            }
            Some(index) => {
                let live = pool.node(index).map(|l| l.config.clone());
                match live {
                    Some(l) if l.address != n.address => {
                        // A new address is a new node: the old one drains away.
                        report.changes.push(format!(
                            "{}: node {} moves {} -> {}",
                            svc.name, n.id, l.address, n.address
                        ));
                        replace_node(handle, &svc.name, index, n.clone())?;
                    }
                    _ => update_node(handle, &svc.name, index, n, now, report)?,
                }
            }
        }
    }
    for n in pool.nodes().iter().filter(|n| !n.is_removed()) {
        if !svc.back.nodes.iter().any(|c| c.id == n.config.id) {
            removals.push((svc.name.clone(), n.config.id.clone()));
        }
    }
    Ok(())
}

fn update_node(
    handle: &SwitchHandle,
    service: &str,
    index: usize,
    n: &NodeConfig,
    now: Instant,
    report: &mut ReloadReport,
) -> Result<(), ReloadError> {
    let svc = &handle.running(service)?.service;
    let Some(st) = svc.pool.status(index, now) else {
        return Ok(());
    };
    if st.weight != n.weight || st.priority != n.priority {
        svc.pool.reconfigure(index, n.weight, n.priority);
        report.changes.push(format!(
            "{service}: node {} weight {} -> {}, priority {} -> {}",
            n.id, st.weight, n.weight, st.priority, n.priority
        ));
    }
    if st.admin != n.admin {
        handle.set_node_admin(service, &n.id, n.admin)?;
        report.changes.push(format!(
            "{service}: node {} admin {:?} -> {:?}",
            n.id, st.admin, n.admin
        ));
    }
    Ok(())
}

/// A node whose address changed: the old entry drains and is removed in the
/// background; the new one takes its ID at once.
fn replace_node(
    handle: &SwitchHandle,
    service: &str,
    old: usize,
    cfg: NodeConfig,
) -> Result<(), ReloadError> {
    let svc = std::sync::Arc::clone(&handle.running(service)?.service);
    svc.set_node_admin(old, AdminState::Drain, Instant::now());
    svc.pool
        .remove_node_later(old)
        .map_err(|e| ControlError::Conflict(e.to_string()))?;
    handle.add_node(service, cfg)?;
    let (h, service) = (handle.clone(), service.to_string());
    tokio::spawn(async move {
        h.finish_removal(&service, old, Duration::from_secs(1))
            .await
    });
    Ok(())
}
