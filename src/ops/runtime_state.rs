//! What operators changed through the admin API (drain, disable, enable, add,
//! remove), kept across reloads and restarts, HAProxy's server-state-file
//! style.
//!
//! Each change is recorded per node with the node's entry in the config file
//! as it was when the change was made. A reload, or a start, keeps the change
//! unless the file's entry for that node now differs from the recorded one:
//! then the file wins and the record is dropped. A routine reload therefore
//! never re-enables a node taken out during an incident, and an edit to that
//! node's entry in the file is still obeyed.
//!
//! The records live in the data directory as `runtime-state.json`, rewritten
//! atomically (temp file, fsync, rename, fsync of the directory) on every
//! change.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::NodeConfig;
use crate::route::AdminState;

/// The file in the data directory.
pub const FILE_NAME: &str = "runtime-state.json";

/// The format of [`FILE_NAME`]; a file of another version is refused.
const VERSION: u32 = 1;

/// One node's runtime change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRecord {
    /// The node's entry in the config file when the change was made; `None`
    /// when the file had no such node (it was added at runtime).
    pub file: Option<NodeConfig>,
    /// What the operator made of it; `None` when it was removed.
    pub runtime: Option<NodeConfig>,
    /// When the change was made (RFC 3339, UTC), for the people reading it.
    pub changed_at: String,
}

/// Every runtime change, by service, then node ID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeState {
    pub version: u32,
    pub services: BTreeMap<String, BTreeMap<String, NodeRecord>>,
}

impl Default for RuntimeState {
    fn default() -> Self {
        Self::new()
    }
}

/// What happens to a runtime change when the file is (re)loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The file did not change the node's entry: the operator's change stays.
    Keep,
    /// The file changed the node's entry since the change was made: the file wins.
    Override,
}

/// The rule: a runtime change survives unless the file changed its node's
/// entry since the change was recorded.
pub fn decide(record: &NodeRecord, file_now: Option<&NodeConfig>) -> Decision {
    if record.file.as_ref() == file_now {
        Decision::Keep
    } else {
        Decision::Override
    }
}

impl RuntimeState {
    pub fn new() -> RuntimeState {
        RuntimeState {
            version: VERSION,
            services: BTreeMap::new(),
        }
    }

    /// The records of one service (empty when it has none).
    pub fn of(&self, service: &str) -> &BTreeMap<String, NodeRecord> {
        static NONE: BTreeMap<String, NodeRecord> = BTreeMap::new();
        self.services.get(service).unwrap_or(&NONE)
    }

    /// Records that the operator made `runtime` of node `id` (`None`:
    /// removed), whose file entry is `file`. A change that leaves the node as
    /// the file has it is no runtime change: its record goes.
    pub fn note(
        &mut self,
        service: &str,
        id: &str,
        file: Option<&NodeConfig>,
        runtime: Option<NodeConfig>,
    ) {
        let records = self.services.entry(service.to_string()).or_default();
        let file = file.cloned();
        if file == runtime {
            records.remove(id);
        } else {
            records.insert(
                id.to_string(),
                NodeRecord {
                    file,
                    runtime,
                    changed_at: now_rfc3339(),
                },
            );
        }
        if records.is_empty() {
            self.services.remove(service);
        }
    }

    /// Drops the record of node `id` (the file overrode it).
    pub fn forget(&mut self, service: &str, id: &str) {
        if let Some(records) = self.services.get_mut(service) {
            records.remove(id);
            if records.is_empty() {
                self.services.remove(service);
            }
        }
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// The runtime changes of a running switch and where they are saved (no
/// file: a switch without a data directory keeps them for its own life).
/// Held under [`crate::ops::run::SwitchHandle::control`].
#[derive(Debug, Default)]
pub struct RuntimeStore {
    pub state: RuntimeState,
    pub file: Option<StateFile>,
}

impl RuntimeStore {
    /// Writes the state to its file, off the runtime's worker threads (the
    /// write waits for the disk twice).
    pub async fn save(&self) -> Result<(), StateFileError> {
        let Some(file) = self.file.clone() else {
            return Ok(());
        };
        let state = self.state.clone();
        let path = file.path().to_path_buf();
        tokio::task::spawn_blocking(move || file.save(&state))
            .await
            .map_err(|e| StateFileError::Write {
                path,
                source: std::io::Error::other(e.to_string()),
            })?
    }
}

/// A runtime change as a reload or a start reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeChange {
    pub service: String,
    pub node: String,
    /// What the operator made of the node: `drain`, `removed`, `added at
    /// 10.0.0.4:7000 weight 1`, ...
    pub change: String,
    /// For an overridden change, how the file's entry changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl RuntimeChange {
    pub fn kept(service: &str, id: &str, record: &NodeRecord) -> RuntimeChange {
        RuntimeChange {
            service: service.to_string(),
            node: id.to_string(),
            change: describe(record),
            file: None,
        }
    }

    pub fn overridden(
        service: &str,
        id: &str,
        record: &NodeRecord,
        file_now: Option<&NodeConfig>,
    ) -> RuntimeChange {
        RuntimeChange {
            file: Some(difference(record.file.as_ref(), file_now)),
            ..Self::kept(service, id, record)
        }
    }
}

impl std::fmt::Display for RuntimeChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: node {} {}", self.service, self.node, self.change)?;
        if let Some(file) = &self.file {
            write!(f, " (file: {file})")?;
        }
        Ok(())
    }
}

fn admin_word(a: AdminState) -> &'static str {
    match a {
        AdminState::Enabled => "enabled",
        AdminState::Drain => "drain",
        AdminState::Disabled => "disabled",
        AdminState::ForcedOffline => "forced-offline",
    }
}

fn entry_words(n: &NodeConfig) -> String {
    format!(
        "{} weight {} priority {} {}",
        n.address,
        n.weight,
        n.priority,
        admin_word(n.admin)
    )
}

/// What a record changed, in a few words.
fn describe(record: &NodeRecord) -> String {
    match (&record.file, &record.runtime) {
        (_, None) => "removed".into(),
        (None, Some(r)) => format!("added at {}", entry_words(r)),
        (Some(f), Some(r))
            if f.address == r.address && (f.weight, f.priority) == (r.weight, r.priority) =>
        {
            admin_word(r.admin).into()
        }
        (Some(_), Some(r)) => format!("set to {}", entry_words(r)),
    }
}

/// How a node's file entry changed between two loads.
fn difference(then: Option<&NodeConfig>, now: Option<&NodeConfig>) -> String {
    match (then, now) {
        (None, Some(n)) => format!("now has it at {}", entry_words(n)),
        (Some(_), None) => "no longer has it".into(),
        (None, None) => "unchanged".into(),
        (Some(a), Some(b)) => {
            let mut parts = Vec::new();
            if a.address != b.address {
                parts.push(format!("address {} -> {}", a.address, b.address));
            }
            if a.weight != b.weight {
                parts.push(format!("weight {} -> {}", a.weight, b.weight));
            }
            if a.priority != b.priority {
                parts.push(format!("priority {} -> {}", a.priority, b.priority));
            }
            if a.admin != b.admin {
                parts.push(format!(
                    "admin {} -> {}",
                    admin_word(a.admin),
                    admin_word(b.admin)
                ));
            }
            if parts.is_empty() {
                "unchanged".into()
            } else {
                parts.join(", ")
            }
        }
    }
}

/// Why the runtime state file cannot be read or written; each names it.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: not a runtime state file ({source}); repair it, or remove it to start from the config file alone"
    )]
    Invalid {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path}: not a runtime state file (version {found}, this switch reads {VERSION}); repair it, or remove it to start from the config file alone"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `runtime-state.json` in a data directory.
#[derive(Clone, Debug)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn in_dir(dir: &Path) -> StateFile {
        StateFile {
            path: dir.join(FILE_NAME),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recorded changes; none when the file does not exist.
    pub fn load(&self) -> Result<RuntimeState, StateFileError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RuntimeState::new()),
            Err(source) => {
                return Err(StateFileError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let state: RuntimeState =
            serde_json::from_str(&text).map_err(|source| StateFileError::Invalid {
                path: self.path.clone(),
                source,
            })?;
        if state.version != VERSION {
            return Err(StateFileError::Version {
                path: self.path.clone(),
                found: state.version,
            });
        }
        Ok(state)
    }

    /// Replaces the file with `state`, atomically: a crash leaves the old file
    /// or the new one, never a part of either.
    pub fn save(&self, state: &RuntimeState) -> Result<(), StateFileError> {
        let write_err = |source| StateFileError::Write {
            path: self.path.clone(),
            source,
        };
        let text = serde_json::to_vec_pretty(state).map_err(|e| write_err(e.into()))?;
        let temp = self.path.with_extension("json.tmp");
        let mut file = private_file(&temp).map_err(write_err)?;
        file.write_all(&text).map_err(write_err)?;
        file.write_all(b"\n").map_err(write_err)?;
        file.sync_all().map_err(write_err)?;
        drop(file);
        std::fs::rename(&temp, &self.path).map_err(write_err)?;
        // The rename is durable once the directory is.
        if let Some(dir) = self.path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(write_err)?;
        }
        Ok(())
    }
}

/// A file only the switch's user can read, truncated.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let file = options.open(path)?;
    // A temp file left by a crash keeps its mode on open: set it again.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, port: u16, admin: AdminState) -> NodeConfig {
        NodeConfig {
            id: id.into(),
            address: format!("127.0.0.1:{port}").parse().unwrap(),
            weight: 1,
            priority: 0,
            admin,
        }
    }

    #[test]
    fn a_change_is_kept_while_the_file_entry_is_the_recorded_one() {
        let file = node("02", 7002, AdminState::Enabled);
        let record = NodeRecord {
            file: Some(file.clone()),
            runtime: Some(node("02", 7002, AdminState::Drain)),
            changed_at: String::new(),
        };
        assert_eq!(decide(&record, Some(&file)), Decision::Keep);
        let reweighed = NodeConfig {
            weight: 5,
            ..file.clone()
        };
        assert_eq!(decide(&record, Some(&reweighed)), Decision::Override);
        let moved = node("02", 7999, AdminState::Enabled);
        assert_eq!(decide(&record, Some(&moved)), Decision::Override);
        assert_eq!(decide(&record, None), Decision::Override);
    }

    #[test]
    fn an_added_node_is_kept_until_the_file_names_it() {
        let record = NodeRecord {
            file: None,
            runtime: Some(node("04", 7004, AdminState::Enabled)),
            changed_at: String::new(),
        };
        assert_eq!(decide(&record, None), Decision::Keep);
        let listed = node("04", 7004, AdminState::Enabled);
        assert_eq!(decide(&record, Some(&listed)), Decision::Override);
    }

    #[test]
    fn noting_the_file_state_again_drops_the_record() {
        let file = node("02", 7002, AdminState::Enabled);
        let mut state = RuntimeState::new();
        state.note(
            "pos",
            "02",
            Some(&file),
            Some(node("02", 7002, AdminState::Drain)),
        );
        assert_eq!(state.of("pos").len(), 1);
        assert_eq!(state.of("pos")["02"].file.as_ref(), Some(&file));
        state.note(
            "pos",
            "02",
            Some(&file),
            Some(node("02", 7002, AdminState::Disabled)),
        );
        assert_eq!(
            state.of("pos")["02"].runtime.as_ref().map(|r| r.admin),
            Some(AdminState::Disabled)
        );
        state.note("pos", "02", Some(&file), Some(file.clone()));
        assert!(state.services.is_empty(), "{state:?}");
        // Added, then removed: nothing left to remember.
        state.note(
            "pos",
            "04",
            None,
            Some(node("04", 7004, AdminState::Enabled)),
        );
        state.note("pos", "04", None, None);
        assert!(state.services.is_empty(), "{state:?}");
    }

    #[test]
    fn reports_say_what_changed_and_what_the_file_did() {
        let file = node("02", 7002, AdminState::Enabled);
        let record = NodeRecord {
            file: Some(file.clone()),
            runtime: Some(node("02", 7002, AdminState::Drain)),
            changed_at: String::new(),
        };
        let now = NodeConfig { weight: 3, ..file };
        let line = RuntimeChange::overridden("pos", "02", &record, Some(&now)).to_string();
        assert_eq!(line, "pos: node 02 drain (file: weight 1 -> 3)");
        let added = NodeRecord {
            file: None,
            runtime: Some(node("04", 7004, AdminState::Enabled)),
            changed_at: String::new(),
        };
        assert_eq!(
            RuntimeChange::kept("pos", "04", &added).to_string(),
            "pos: node 04 added at 127.0.0.1:7004 weight 1 priority 0 enabled"
        );
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_written_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            std::env::temp_dir().join(format!("isoswitch-runtime-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = StateFile::in_dir(&dir);
        assert_eq!(store.load().unwrap(), RuntimeState::new());
        let mut state = RuntimeState::new();
        state.note("pos", "04", None, Some(node("04", 7004, AdminState::Drain)));
        store.save(&state).unwrap();
        assert_eq!(store.load().unwrap(), state);
        let mode = std::fs::metadata(store.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!dir.join("runtime-state.json.tmp").exists());
        std::fs::write(store.path(), "{\"version\": 9, \"services\": {}}").unwrap();
        let err = store.load().unwrap_err();
        assert!(
            matches!(err, StateFileError::Version { found: 9, .. }),
            "{err}"
        );
        let err = err.to_string();
        assert!(
            err.contains("(version 9, this switch reads 1)") && err.contains("remove it"),
            "{err}"
        );
        std::fs::write(store.path(), "{").unwrap();
        let err = store.load().unwrap_err();
        assert!(matches!(err, StateFileError::Invalid { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
