//! A service's node plan: the nodes it should have (the file's, with the
//! operators' runtime changes laid over them) against the running pool, as
//! steps (add, remove, move, reweigh, admin state), checked whole before the
//! first applies. A reload and a start both plan this way; what else a
//! reload reads, checks and applies is in [`super`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ReloadError, ReloadReport};
use crate::config::{NodeConfig, ServiceConfig};
use crate::link::{self, Service};
use crate::ops::control::{ControlError, SwitchHandle};
use crate::ops::runtime_state::{Decision, NodeRecord, RuntimeChange, decide};
use crate::route::AdminState;

/// A node of the running pool (tombstones left out), as a config entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveNode {
    pub index: usize,
    pub entry: NodeConfig,
    /// Being drained away by an earlier removal.
    pub removing: bool,
}

/// The running pool's nodes: address as configured, weight, priority and
/// admin state as they are now.
pub fn live_nodes(service: &Service, removing: &[usize]) -> Vec<LiveNode> {
    service
        .view()
        .pool
        .nodes()
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.is_removed())
        .filter_map(|(index, _)| {
            Some(LiveNode {
                index,
                entry: crate::ops::control::runtime_entry(service, index)?,
                removing: removing.contains(&index),
            })
        })
        .collect()
}

/// Node slots left for nodes added or moved (indices are never reused).
pub(super) fn free_slots(service: &Service) -> usize {
    (service.view().config.back.nodes.len() + link::back::pool::SPARE_NODE_SLOTS)
        .saturating_sub(service.view().pool.nodes().len())
}

/// One change to a running pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Add(NodeConfig),
    /// Drain, then remove.
    Remove {
        index: usize,
        id: String,
    },
    /// A new address is a new node: the old one drains away.
    Move {
        index: usize,
        from: SocketAddr,
        to: NodeConfig,
    },
    Reweigh {
        index: usize,
        id: String,
        from: (u32, u32),
        to: (u32, u32),
    },
    Admin {
        index: usize,
        id: String,
        from: AdminState,
        to: AdminState,
    },
}

/// What a reload (or a start) does to one service's pool.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NodePlan {
    pub steps: Vec<Step>,
    /// Nodes the service has afterwards.
    pub nodes: usize,
    pub kept: Vec<RuntimeChange>,
    pub overridden: Vec<RuntimeChange>,
}

/// The nodes a service should have: the file's, with each runtime change
/// laid over its node unless the file changed that node's entry since.
fn wanted_nodes(
    service: &str,
    file: &[NodeConfig],
    records: &BTreeMap<String, NodeRecord>,
    plan: &mut NodePlan,
) -> Vec<NodeConfig> {
    let mut wanted = file.to_vec();
    for (id, record) in records {
        let entry = file.iter().find(|n| n.id == *id);
        match decide(record, entry) {
            Decision::Override => {
                plan.overridden
                    .push(RuntimeChange::overridden(service, id, record, entry));
            }
            Decision::Keep => {
                plan.kept.push(RuntimeChange::kept(service, id, record));
                wanted.retain(|n| n.id != *id);
                wanted.extend(record.runtime.clone());
            }
        }
    }
    wanted
}

/// The runtime changes of `svc` that may still apply: a node the operators
/// added or moved through the API to an address outside
/// `back.allowed_networks` (the list narrowed since) is not brought back;
/// its file entry, if any, stands. Each one left out is logged.
pub fn within_allowed(
    svc: &ServiceConfig,
    records: &BTreeMap<String, NodeRecord>,
) -> BTreeMap<String, NodeRecord> {
    let mut kept = records.clone();
    kept.retain(|id, record| {
        let Some(runtime) = &record.runtime else {
            return true;
        };
        let in_file = svc
            .back
            .nodes
            .iter()
            .any(|n| n.id == *id && n.address == runtime.address);
        let allowed = in_file || svc.back.allows(runtime.address);
        if !allowed {
            tracing::error!(service = %svc.name, node = %id, address = %runtime.address, "runtime change not applied: the node's address is outside back.allowed_networks");
        }
        allowed
    });
    kept
}

/// Plans one service: what it should have (see [`wanted_nodes`]) against
/// what runs. Touches nothing.
pub fn plan_nodes(
    service: &str,
    file: &[NodeConfig],
    records: &BTreeMap<String, NodeRecord>,
    live: &[LiveNode],
) -> Result<NodePlan, ReloadError> {
    let mut plan = NodePlan::default();
    let wanted = wanted_nodes(service, file, records, &mut plan);
    plan.nodes = wanted.len();
    for want in &wanted {
        let Some(l) = live.iter().find(|l| l.entry.id == want.id) else {
            plan.steps.push(Step::Add(want.clone()));
            continue;
        };
        if l.removing {
            return Err(ReloadError::Conflict(format!(
                "service `{service}`: node `{}` is still being removed; reload again once it is gone",
                want.id
            )));
        }
        let (index, id) = (l.index, want.id.clone());
        if l.entry.address != want.address {
            plan.steps.push(Step::Move {
                index,
                from: l.entry.address,
                to: want.clone(),
            });
            continue;
        }
        let (from, to) = (
            (l.entry.weight, l.entry.priority),
            (want.weight, want.priority),
        );
        if from != to {
            plan.steps.push(Step::Reweigh {
                index,
                id: id.clone(),
                from,
                to,
            });
        }
        if l.entry.admin != want.admin {
            plan.steps.push(Step::Admin {
                index,
                id,
                from: l.entry.admin,
                to: want.admin,
            });
        }
    }
    for l in live {
        if !l.removing && !wanted.iter().any(|w| w.id == l.entry.id) {
            plan.steps.push(Step::Remove {
                index: l.index,
                id: l.entry.id.clone(),
            });
        }
    }
    Ok(plan)
}

/// Refuses a plan the running service cannot take, before anything applies.
pub fn check_plan(
    service: &str,
    stamped: bool,
    free_slots: usize,
    plan: &NodePlan,
) -> Result<(), ReloadError> {
    if plan.nodes == 0 {
        return Err(ReloadError::Conflict(format!(
            "service `{service}` would be left without a node"
        )));
    }
    let mut new_slots = 0;
    for step in &plan.steps {
        let (cfg, weight) = match step {
            Step::Add(cfg) | Step::Move { to: cfg, .. } => (Some(cfg), cfg.weight),
            Step::Reweigh { to, .. } => (None, to.0),
            _ => continue,
        };
        if weight == 0 {
            return Err(ReloadError::Invalid(format!(
                "service `{service}`: a node's weight must be at least 1"
            )));
        }
        let Some(cfg) = cfg else { continue };
        if stamped {
            // The F37 stamp table is fixed at start (stamps route responses
            // statelessly, across switch instances).
            return Err(ReloadError::RestartNeeded(format!(
                "service `{service}`: node `{}` is new or moved, and the service stamps F37 with node IDs",
                cfg.id
            )));
        }
        cfg.id
            .parse::<crate::route::NodeId>()
            .map_err(|e| ReloadError::Invalid(format!("service `{service}`: node id: {e}")))?;
        new_slots += 1;
    }
    if new_slots > free_slots {
        return Err(ReloadError::RestartNeeded(format!(
            "service `{service}`: {new_slots} nodes to add, {free_slots} free node slots ({} runtime adds per process)",
            link::back::pool::SPARE_NODE_SLOTS
        )));
    }
    Ok(())
}

/// Where a plan is applied: to a pool about to start (no connection yet), or
/// to a running switch.
#[derive(Clone, Copy)]
pub enum Stage<'a> {
    Starting,
    Running(&'a SwitchHandle),
}

/// Applies one planned step. A checked plan does not fail here; if a step
/// still does, it is logged and reported, and the others apply.
pub fn apply_step(stage: Stage<'_>, service: &Arc<Service>, step: Step, report: &mut ReloadReport) {
    let name = service.name().to_string();
    let now = Instant::now();
    match step {
        Step::Add(cfg) => {
            let id = cfg.id.clone();
            match add(stage, service, cfg) {
                Ok(()) => report.changes.push(format!("{name}: node {id} added")),
                Err(e) => failed(report, &name, &id, "add", &e.to_string()),
            }
        }
        Step::Remove { index, id } => {
            remove(stage, service, index);
            report.changes.push(match stage {
                Stage::Starting => format!("{name}: node {id} removed"),
                Stage::Running(_) => format!("{name}: node {id} draining, then removed"),
            });
        }
        Step::Move { index, from, to } => {
            let id = to.id.clone();
            let line = format!("{name}: node {id} moves {from} -> {}", to.address);
            // The old entry drains, frees the ID at once, and goes.
            service.set_node_admin(index, AdminState::Drain, now);
            if let Err(e) = service.view().pool.remove_node_later(index) {
                return failed(report, &name, &id, "move", &e.to_string());
            }
            remove(stage, service, index);
            match add(stage, service, to) {
                Ok(()) => report.changes.push(line),
                Err(e) => failed(report, &name, &id, "move", &e.to_string()),
            }
        }
        Step::Reweigh {
            index,
            id,
            from,
            to,
        } => {
            service.view().pool.reconfigure(index, to.0, to.1);
            report.changes.push(format!(
                "{name}: node {id} weight {} -> {}, priority {} -> {}",
                from.0, to.0, from.1, to.1
            ));
        }
        Step::Admin {
            index,
            id,
            from,
            to,
        } => {
            service.set_node_admin(index, to, now);
            report
                .changes
                .push(format!("{name}: node {id} admin {from:?} -> {to:?}"));
        }
    }
}

fn failed(report: &mut ReloadReport, service: &str, node: &str, what: &str, why: &str) {
    tracing::error!(service, node, error = %why, "{what} failed after the plan was checked");
    report
        .changes
        .push(format!("{service}: node {node} {what} FAILED: {why}"));
}

/// Adds a node; on a running switch, starts its connections (at start,
/// `link::start` starts every node).
fn add(stage: Stage<'_>, service: &Arc<Service>, cfg: NodeConfig) -> Result<(), ControlError> {
    let index = service
        .view()
        .pool
        .add_node(cfg, Instant::now())
        .map_err(|e| ControlError::Conflict(e.to_string()))?;
    if let Stage::Running(handle) = stage {
        link::start_node(&handle.supervisor, service, index);
    }
    Ok(())
}

/// Removes a node: at once before the start, after a drain on a running
/// switch.
fn remove(stage: Stage<'_>, service: &Arc<Service>, index: usize) {
    match stage {
        Stage::Starting => {
            let _ = service.view().pool.remove_node(index, Instant::now());
        }
        Stage::Running(handle) => {
            service.set_node_admin(index, AdminState::Drain, Instant::now());
            let (h, name) = (handle.clone(), service.name().to_string());
            h.begin_removal(&name, index);
            tokio::spawn(async move {
                h.finish_removal(&name, index, Duration::from_secs(1)).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, port: u16) -> NodeConfig {
        NodeConfig {
            id: id.into(),
            address: format!("127.0.0.1:{port}").parse().unwrap(),
            weight: 1,
            priority: 0,
            admin: AdminState::Enabled,
        }
    }

    fn live(entries: &[NodeConfig]) -> Vec<LiveNode> {
        entries
            .iter()
            .enumerate()
            .map(|(index, e)| LiveNode {
                index,
                entry: e.clone(),
                removing: false,
            })
            .collect()
    }

    fn record(file: Option<NodeConfig>, runtime: Option<NodeConfig>) -> NodeRecord {
        NodeRecord {
            file,
            runtime,
            changed_at: String::new(),
        }
    }

    fn drained(n: &NodeConfig) -> NodeConfig {
        NodeConfig {
            admin: AdminState::Drain,
            ..n.clone()
        }
    }

    #[test]
    fn an_unchanged_file_keeps_every_runtime_change() {
        let file = vec![node("01", 7001), node("02", 7002)];
        let added = node("04", 7004);
        let records = BTreeMap::from([
            (
                "02".to_string(),
                record(Some(file[1].clone()), Some(drained(&file[1]))),
            ),
            ("04".to_string(), record(None, Some(added.clone()))),
        ]);
        // Running: 02 drained, 04 added.
        let running = live(&[file[0].clone(), drained(&file[1]), added]);
        let plan = plan_nodes("pos", &file, &records, &running).unwrap();
        assert_eq!(plan.steps, vec![], "nothing to do: {plan:?}");
        assert_eq!(plan.nodes, 3);
        let kept: Vec<String> = plan.kept.iter().map(ToString::to_string).collect();
        assert_eq!(
            kept,
            [
                "pos: node 02 drain",
                "pos: node 04 added at 127.0.0.1:7004 weight 1 priority 0 enabled"
            ]
        );
        assert!(plan.overridden.is_empty());
    }

    #[test]
    fn a_file_change_to_the_node_overrides_its_runtime_change() {
        let before = vec![node("01", 7001), node("02", 7002)];
        let records = BTreeMap::from([(
            "02".to_string(),
            record(Some(before[1].clone()), Some(drained(&before[1]))),
        )]);
        let running = live(&[before[0].clone(), drained(&before[1])]);
        let mut after = before.clone();
        after[1].weight = 4;
        let plan = plan_nodes("pos", &after, &records, &running).unwrap();
        assert_eq!(
            plan.steps,
            vec![
                Step::Reweigh {
                    index: 1,
                    id: "02".into(),
                    from: (1, 0),
                    to: (4, 0)
                },
                Step::Admin {
                    index: 1,
                    id: "02".into(),
                    from: AdminState::Drain,
                    to: AdminState::Enabled
                },
            ]
        );
        assert_eq!(
            plan.overridden[0].to_string(),
            "pos: node 02 drain (file: weight 1 -> 4)"
        );
        assert!(plan.kept.is_empty());
    }

    #[test]
    fn a_node_removed_at_runtime_stays_removed_and_one_added_by_the_file_overrides() {
        let file = vec![node("01", 7001), node("02", 7002), node("03", 7003)];
        let records = BTreeMap::from([
            ("03".to_string(), record(Some(file[2].clone()), None)),
            ("04".to_string(), record(None, Some(node("04", 7004)))),
        ]);
        let running = live(&[file[0].clone(), file[1].clone(), node("04", 7004)]);
        // The file now lists 04 itself, at another address.
        let mut now = file.clone();
        now.push(node("04", 7104));
        let plan = plan_nodes("pos", &now, &records, &running).unwrap();
        assert_eq!(
            plan.steps,
            vec![Step::Move {
                index: 2,
                from: "127.0.0.1:7004".parse().unwrap(),
                to: node("04", 7104)
            }]
        );
        assert_eq!(plan.kept[0].to_string(), "pos: node 03 removed");
        assert_eq!(
            plan.overridden[0].to_string(),
            "pos: node 04 added at 127.0.0.1:7004 weight 1 priority 0 enabled (file: now has it at 127.0.0.1:7104 weight 1 priority 0 enabled)"
        );
    }

    #[test]
    fn nodes_the_file_drops_are_removed_and_a_node_still_going_blocks() {
        let file = vec![node("01", 7001)];
        let running = live(&[node("01", 7001), node("02", 7002)]);
        let plan = plan_nodes("pos", &file, &BTreeMap::new(), &running).unwrap();
        assert_eq!(
            plan.steps,
            vec![Step::Remove {
                index: 1,
                id: "02".into()
            }]
        );
        let mut going = running.clone();
        going[0].removing = true;
        let err = plan_nodes("pos", &file, &BTreeMap::new(), &going).unwrap_err();
        assert!(matches!(err, ReloadError::Conflict(_)), "{err}");
    }

    #[test]
    fn a_plan_is_checked_whole_before_anything_applies() {
        let add = |id: &str, port| NodePlan {
            steps: vec![Step::Add(node(id, port))],
            nodes: 2,
            ..NodePlan::default()
        };
        check_plan("pos", false, 1, &add("04", 7004)).unwrap();
        let err = check_plan("cups", true, 1, &add("04", 7004)).unwrap_err();
        assert!(
            matches!(&err, ReloadError::RestartNeeded(m) if m.contains("stamps F37")),
            "{err}"
        );
        let err = check_plan("pos", false, 0, &add("04", 7004)).unwrap_err();
        assert!(matches!(err, ReloadError::RestartNeeded(_)), "{err}");
        let err = check_plan("pos", false, 1, &add("0 x", 7004)).unwrap_err();
        assert!(matches!(err, ReloadError::Invalid(_)), "{err}");
        let empty = NodePlan::default();
        assert!(matches!(
            check_plan("pos", false, 1, &empty),
            Err(ReloadError::Conflict(_))
        ));
    }
}
