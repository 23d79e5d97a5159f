//! Hot reload (SIGHUP, `POST /api/v1/reload`): read and validate the config
//! file; if it is invalid, or changes what cannot change live, refuse and keep
//! running the old one. Otherwise apply the node changes (add, remove after a
//! drain, address, weight, priority, admin state) and the health thresholds,
//! without touching any link the change does not concern.
//!
//! A reload is all or nothing: every service is planned and every node change
//! checked before the first is applied, so a refusal changes nothing. Reloads
//! and the admin API's node changes take one lock ([`SwitchHandle::control`]):
//! two reloads never interleave, and no API change lands in the middle of one.
//!
//! What operators changed through the API survives (`ops::runtime_state`):
//! the nodes a reload aims for are the file's, with each runtime change laid
//! over its node unless the file changed that node's entry since. The report
//! names every runtime change kept and every one the file overrode.
//!
//! What applies live: the node pool, health thresholds and check timing,
//! timeouts (per MTI too) and decline codes (for the requests that come after
//! the reload),
//! `correlation.max_in_flight`, and a listen front's connection and in-flight
//! limits (for the connections accepted after it). Keys read from the
//! service's fixed config (the rest of the front, spec, the correlation key,
//! write queues, balancing, rules, F37 stamp, the health check kind,
//! `[service.integrity]`), `data_dir` and `[store]` are refused with "restart
//! needed", named.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod nodes;

use nodes::free_slots;
pub use nodes::{
    LiveNode, NodePlan, Stage, Step, apply_step, check_plan, live_nodes, plan_nodes, within_allowed,
};

use super::control::{ControlError, SwitchHandle};
use super::runtime_state::{RuntimeChange, RuntimeStore};
use crate::config::{Config, ServiceConfig};
use crate::link::Service;

/// Why a reload was refused; the old config keeps running, untouched.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("no config file to reload (the switch runs a config given in memory)")]
    NoSource,
    #[error("{0}")]
    Invalid(String),
    #[error("{0}: restart needed")]
    RestartNeeded(String),
    /// The change conflicts with the running state (a node still being
    /// removed, a service left without nodes).
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Apply(#[from] ControlError),
}

/// What a reload changed, one line per change, and what became of the
/// operators' runtime changes.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ReloadReport {
    pub changes: Vec<String>,
    /// Runtime changes kept: the file did not change their node's entry.
    #[serde(default)]
    pub kept: Vec<RuntimeChange>,
    /// Runtime changes the file overrode: it changed their node's entry.
    #[serde(default)]
    pub overridden: Vec<RuntimeChange>,
    /// Why the runtime state could not be saved (the reload applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_saved: Option<String>,
}

impl fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.changes.is_empty() {
            f.write_str("no change")?;
        } else {
            f.write_str(&self.changes.join("; "))?;
        }
        let list = |items: &[RuntimeChange]| {
            items
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        if !self.kept.is_empty() {
            write!(f, "; runtime changes kept: {}", list(&self.kept))?;
        }
        if !self.overridden.is_empty() {
            write!(
                f,
                "; runtime changes overridden by the file: {}",
                list(&self.overridden)
            )?;
        }
        if let Some(why) = &self.not_saved {
            write!(f, "; runtime state not saved: {why}")?;
        }
        Ok(())
    }
}

/// Reloads from the file the switch was started with.
pub async fn reload(handle: &SwitchHandle) -> Result<ReloadReport, ReloadError> {
    // Taken before the file is read: of two reloads, the second reads the
    // file after the first has applied it.
    let mut control = handle.control.lock().await;
    let path = handle
        .source
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or(ReloadError::NoSource)?;
    let new = Config::load(&path)
        .map_err(|e| ReloadError::Invalid(format!("{}: {e}", path.display())))?;
    apply_under(handle, &mut control, new).await
}

/// Applies a validated config to the running switch, or refuses it whole.
pub async fn apply(handle: &SwitchHandle, new: Config) -> Result<ReloadReport, ReloadError> {
    let mut control = handle.control.lock().await;
    apply_under(handle, &mut control, new).await
}

async fn apply_under(
    handle: &SwitchHandle,
    control: &mut RuntimeStore,
    new: Config,
) -> Result<ReloadReport, ReloadError> {
    let old = handle
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    check_live(&old, &new)?;
    // Certificates and keys read again, all before any is used: a renewed
    // file that does not load refuses the reload and changes nothing.
    let certificates = reread_tls(handle)?;
    // Every service planned and checked before any is touched.
    let mut plans = Vec::with_capacity(new.services.len());
    for svc in &new.services {
        let service = Arc::clone(&handle.running(&svc.name)?.service);
        let removing = handle.removals_of(&svc.name);
        let live = live_nodes(&service, &removing);
        let records = within_allowed(svc, control.state.of(&svc.name));
        let plan = plan_nodes(&svc.name, &svc.back.nodes, &records, &live)?;
        check_plan(
            &svc.name,
            svc.f37_stamp.is_some(),
            free_slots(&service),
            &plan,
        )?;
        plans.push((service, plan));
    }
    let mut report = ReloadReport::default();
    install_tls(handle, certificates, &mut report);
    for (svc, (service, plan)) in new.services.iter().zip(plans) {
        apply_live_settings(&service, svc, &mut report);
        for step in plan.steps {
            apply_step(Stage::Running(handle), &service, step, &mut report);
        }
        for c in &plan.overridden {
            control.state.forget(&c.service, &c.node);
        }
        report.kept.extend(plan.kept);
        report.overridden.extend(plan.overridden);
    }
    *handle.config.lock().unwrap_or_else(|p| p.into_inner()) = new;
    if !report.overridden.is_empty()
        && let Err(e) = control.save().await
    {
        tracing::error!(error = %e, "reload: runtime state not saved");
        report.not_saved = Some(e.to_string());
    }
    tracing::info!(%report, "config reloaded");
    Ok(report)
}

/// Every service's and the admin's TLS files, and the admin tokens, read
/// again.
struct Certificates {
    services: Vec<crate::tls::Reread>,
    admin: Option<crate::config::tls::LoadedServer>,
    tokens: Option<(super::admin_auth::Tokens, Duration)>,
}

fn reread_tls(handle: &SwitchHandle) -> Result<Certificates, ReloadError> {
    let invalid = |e: crate::config::tls::TlsError| ReloadError::Invalid(e.to_string());
    let services = handle
        .services
        .iter()
        .map(|r| r.service.view().links.tls.reread())
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    let admin = match handle.admin_tls.get() {
        Some(a) => Some(a.side.reread().map_err(invalid)?),
        None => None,
    };
    // The tokens as the running admin config names them (`[admin]` itself
    // changes only with a restart).
    let admin_config = handle
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .admin
        .clone();
    let tokens = match (handle.admin_credentials.get(), admin_config) {
        (Some(_), Some(cfg)) => Some((
            super::admin_auth::Credentials::reread(&cfg)
                .map_err(|e| ReloadError::Invalid(e.to_string()))?,
            cfg.token_rotation_window,
        )),
        _ => None,
    };
    Ok(Certificates {
        services,
        admin,
        tokens,
    })
}

/// New connections from here on use the certificates read; links up keep
/// the sessions they have.
fn install_tls(handle: &SwitchHandle, certs: Certificates, report: &mut ReloadReport) {
    let mut any = false;
    for (r, reread) in handle.services.iter().zip(certs.services) {
        any |= !r.service.view().links.tls.certs().is_empty()
            || r.service.view().links.tls.back.is_some()
            || r.service.view().links.tls.out_links.is_some();
        r.service.view().links.tls.install(reread);
    }
    if let (Some(a), Some(loaded)) = (handle.admin_tls.get(), certs.admin) {
        a.side.install(loaded);
        any = true;
    }
    if any {
        report
            .changes
            .push("TLS certificates and keys read again".into());
    }
    if let (Some(creds), Some((tokens, window))) = (handle.admin_credentials.get(), certs.tokens)
        && creds.install(tokens, window, Instant::now())
    {
        tracing::warn!(
            window = %crate::util::duration::format(window),
            "admin tokens rotated: the previous ones work until the window ends"
        );
        report.changes.push(format!(
            "admin tokens rotated (the previous ones work for {})",
            crate::util::duration::format(window)
        ));
    }
}

/// Refuses changes that need a restart, naming the first key that differs.
fn check_live(old: &Config, new: &Config) -> Result<(), ReloadError> {
    if old.admin != new.admin {
        return Err(ReloadError::RestartNeeded("admin".into()));
    }
    if old.data_dir != new.data_dir {
        return Err(ReloadError::RestartNeeded("data_dir".into()));
    }
    let (a, b) = (&old.store, &new.store);
    if (&a.url, a.queue, a.batch, &a.saf) != (&b.url, b.queue, b.batch, &b.saf) {
        return Err(ReloadError::RestartNeeded("store".into()));
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
        // Read per request from the running service (`Service::reload_live`).
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

/// Timeouts, decline codes, health thresholds and timing, the in-flight cap
/// and a listen front's limits: set whatever they were.
fn apply_live_settings(service: &Service, svc: &ServiceConfig, report: &mut ReloadReport) {
    service.view().pool.set_health_config(svc.back.health.state);
    if service.live().timeouts.default_timeout().after != svc.timeouts.request {
        report.changes.push(format!(
            "{}: timeouts.request {:?} -> {:?}",
            svc.name,
            service.live().timeouts.default_timeout().after,
            svc.timeouts.request
        ));
    }
    // The file was validated whole before anything applied (patterns of
    // `timeouts.by_mti` included), so this cannot fail; if it did, the old
    // settings stay.
    if let Err(e) = service.reload_live(svc) {
        tracing::error!(service = %svc.name, error = %e, "reload: live settings kept as they were");
    }
}
