//! End-to-end: what operators change through the admin API survives reloads
//! (SIGHUP and `POST /api/v1/reload`) and restarts of the real `isoswitch
//! run` binary, unless the config file changed that node's entry; a reload is
//! refused whole or applied whole; concurrent reloads take turns. And what
//! the systemd unit relies on: the admin token from the unit's credential,
//! the data directory from `StateDirectory=`, a private one or none. Simulated
//! nodes answer on 127.0.0.1; every switch has its own data directory.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use isoswitch::cli::ctl::request;
use isoswitch::iso8583::Spec;
use isoswitch::ops::reload::ReloadReport;
use isoswitch::ops::status::{NodeStatusView, Status};
use isoswitch::sim::node::{Delay, NodeSim, NodeSimConfig};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const TOKEN: &str = "runtime-state-token-0123456789";
/// Every test's own deadline.
const TEST_LIMIT: Duration = Duration::from_secs(90);

async fn node_sim(spec: &Arc<Spec>, id: &str) -> NodeSim {
    let cfg = NodeSimConfig {
        id: id.into(),
        delay: Delay::NONE,
        fail_rate: 0.0,
        originate: None,
    };
    NodeSim::start("127.0.0.1:0".parse().unwrap(), Arc::clone(spec), cfg)
        .await
        .expect("node starts")
}

/// One service's TOML: a `cup-pos` listen front in front of `nodes` (ID,
/// address, weight), with `extra` service keys.
fn service_toml(name: &str, extra: &str, nodes: &[(&str, SocketAddr, u32)]) -> String {
    let mut toml = format!(
        "[[service]]\nname = \"{name}\"\nspec = \"cup-pos\"\n{extra}\n\
         [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n\
         [service.back]\nalgorithm = \"weighted\"\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n"
    );
    for (id, addr, weight) in nodes {
        toml.push_str(&format!(
            "[[service.back.node]]\nid = \"{id}\"\naddress = \"{addr}\"\nweight = {weight}\n"
        ));
    }
    toml
}

/// The switch's config file, its admin API and its data directory.
struct Rig {
    scratch: Scratch,
    admin: SocketAddr,
    config: PathBuf,
    data_dir: PathBuf,
}

impl Rig {
    fn new(test: &str) -> Rig {
        let scratch = Scratch::new(&format!("runtime-state-{test}"));
        write_secret(&scratch.join("token"), &format!("{TOKEN}\n"));
        Rig {
            admin: free_addr(),
            config: scratch.join("isoswitch.toml"),
            data_dir: scratch.join("data"),
            scratch,
        }
    }

    /// Writes the config file: the admin table (its token in a file), then
    /// `services`.
    fn write(&self, services: &str) {
        let token_file = format!(
            "token_file = \"{}\"\n",
            self.scratch.join("token").display()
        );
        self.write_with(&token_file, services);
    }

    /// Writes the config file: the admin table with `admin_extra` lines, then
    /// `services`.
    fn write_with(&self, admin_extra: &str, services: &str) {
        let toml = format!(
            "[admin]\nlisten = \"{}\"\n{admin_extra}{services}",
            self.admin
        );
        std::fs::write(&self.config, toml).expect("write config");
    }

    /// `isoswitch run` on the config and the data directory, once its admin
    /// API answers.
    async fn start(&self) -> Switch {
        self.spawn(TOKEN, |cmd| {
            cmd.arg("--data-dir").arg(&self.data_dir);
        })
        .await
    }

    /// The `isoswitch run` command on the config, without the environment
    /// systemd would set.
    fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_isoswitch"));
        cmd.args(["run", "--config"])
            .arg(&self.config)
            .env("ISOSWITCH_LOG", "info")
            .env_remove("STATE_DIRECTORY")
            .env_remove("CREDENTIALS_DIRECTORY")
            .env_remove("ISOSWITCH_ADMIN_TOKEN")
            .kill_on_drop(true);
        cmd
    }

    /// [`Rig::command`] with `more` arguments or environment, once its admin
    /// API answers to `token`.
    async fn spawn(&self, token: &str, more: impl FnOnce(&mut Command)) -> Switch {
        let mut cmd = self.command();
        more(&mut cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the switch");
        let (tx, log) = mpsc::unbounded_channel();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let switch = Switch {
            child,
            log,
            base: format!("http://{}", self.admin),
            token: token.to_string(),
        };
        // Until it answers or exits: the test's own limit bounds the wait,
        // not a count of tries (a loaded machine starts a debug build slowly;
        // a fixed 10 s failed once in CI beside a release build).
        let mut switch = switch;
        loop {
            if let Ok((200, _)) = switch.call("GET", "/api/v1/status", None).await {
                return switch;
            }
            if let Ok(Some(status)) = switch.child.try_wait() {
                let mut lines = Vec::new();
                while let Ok(line) = switch.log.try_recv() {
                    lines.push(line);
                }
                panic!(
                    "the switch exited ({status}) before its admin API answered:\n{}",
                    lines.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A running `isoswitch run`, killed when dropped.
struct Switch {
    child: Child,
    log: mpsc::UnboundedReceiver<String>,
    base: String,
    token: String,
}

impl Switch {
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, String), String> {
        request(&self.base, method, path, Some(&self.token), body)
            .await
            .map_err(|e| e.to_string())
    }

    async fn ok(&self, method: &str, path: &str, body: Option<String>) -> String {
        let (code, text) = self
            .call(method, path, body)
            .await
            .expect("admin API reachable");
        assert!((200..300).contains(&code), "{method} {path}: {code} {text}");
        text
    }

    async fn node(&self, service: &str, node: &str, action: &str) {
        self.ok(
            "POST",
            &format!("/api/v1/services/{service}/nodes/{node}/{action}"),
            None,
        )
        .await;
    }

    async fn add(&self, service: &str, node: &str, addr: SocketAddr) {
        let body = format!("{{\"id\": \"{node}\", \"address\": \"{addr}\", \"weight\": 1}}");
        self.ok(
            "POST",
            &format!("/api/v1/services/{service}/nodes"),
            Some(body),
        )
        .await;
    }

    async fn reload(&self) -> ReloadReport {
        serde_json::from_str(&self.ok("POST", "/api/v1/reload", None).await).expect("a report")
    }

    /// The live nodes of `service` (removed ones left out), by ID.
    async fn nodes(&self, service: &str) -> Vec<NodeStatusView> {
        let status: Status =
            serde_json::from_str(&self.ok("GET", "/api/v1/status", None).await).unwrap();
        let mut nodes: Vec<NodeStatusView> = status
            .services
            .into_iter()
            .find(|s| s.name == service)
            .expect("the service")
            .nodes
            .into_iter()
            .filter(|n| n.state != "removed")
            .collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        nodes
    }

    /// `id: admin/weight` for every live node, for comparisons.
    async fn summary(&self, service: &str) -> Vec<String> {
        self.nodes(service)
            .await
            .iter()
            .map(|n| format!("{}: {}/{}", n.id, n.admin, n.weight))
            .collect()
    }

    fn signal(&self, name: &str) {
        let pid = self.child.id().expect("running").to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} {pid}");
    }

    /// The next log line that contains `text`.
    async fn logged(&mut self, text: &str) -> String {
        while let Some(line) = self.log.recv().await {
            if line.contains(text) {
                return line;
            }
        }
        panic!("the switch ended without logging `{text}`");
    }

    /// SIGKILL: nothing is saved on the way out.
    async fn kill(mut self) {
        self.child.kill().await.expect("kill -9");
    }
}

fn lines(changes: &[isoswitch::ops::runtime_state::RuntimeChange]) -> Vec<String> {
    changes.iter().map(ToString::to_string).collect()
}

/// The case: a node drained during an incident stays drained through
/// SIGHUP, an API reload and a restart; a node added through the API stays
/// too; an edit to a node's entry in the file overrides its runtime change,
/// and the report says which were kept and which overridden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_changes_survive_reloads_and_restarts_until_the_file_changes_them() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let mut sims = Vec::new();
        for id in ["01", "02", "03", "04"] {
            sims.push(node_sim(&spec, id).await);
        }
        let addr = |i: usize| sims[i].addr;
        let rig = Rig::new("survive");
        let file = |weight_02| {
            service_toml(
                "pos",
                "",
                &[
                    ("01", addr(0), 1),
                    ("02", addr(1), weight_02),
                    ("03", addr(2), 1),
                ],
            )
        };
        rig.write(&file(1));
        let mut switch = rig.start().await;
        assert_eq!(
            switch.summary("pos").await,
            ["01: enabled/1", "02: enabled/1", "03: enabled/1"]
        );

        // An incident: 02 drained, 04 added.
        switch.node("pos", "02", "drain").await;
        switch.add("pos", "04", addr(3)).await;
        let changed = [
            "01: enabled/1",
            "02: drain/1",
            "03: enabled/1",
            "04: enabled/1",
        ];
        assert_eq!(switch.summary("pos").await, changed);
        let state = rig.data_dir.join("runtime-state.json");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&state)
                .expect("state saved")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "runtime-state.json is private");
        }

        // A routine SIGHUP, the file unchanged: both changes stay.
        switch.signal("HUP");
        let line = switch.logged("SIGHUP:").await;
        assert!(
            line.contains("config reloaded")
                && line.contains("runtime changes kept: pos: node 02 drain; pos: node 04 added at"),
            "{line}"
        );
        assert_eq!(switch.summary("pos").await, changed);

        // The same through the API, with a structured report.
        let report = switch.reload().await;
        assert!(report.changes.is_empty(), "{report}");
        assert_eq!(lines(&report.kept).len(), 2, "{report}");
        assert!(report.overridden.is_empty(), "{report}");

        // The file changes 02's entry: the file wins over the drain, and the
        // report says so; 04 is not 02's business and stays.
        rig.write(&file(2));
        let report = switch.reload().await;
        assert_eq!(
            lines(&report.overridden),
            ["pos: node 02 drain (file: weight 1 -> 2)"],
            "{report}"
        );
        assert_eq!(
            lines(&report.kept),
            [format!(
                "pos: node 04 added at {} weight 1 priority 0 enabled",
                addr(3)
            )],
            "{report}"
        );
        assert!(
            report
                .changes
                .contains(&"pos: node 02 admin Drain -> Enabled".to_string()),
            "{report}"
        );
        assert_eq!(
            switch.summary("pos").await,
            [
                "01: enabled/1",
                "02: enabled/2",
                "03: enabled/1",
                "04: enabled/1"
            ]
        );

        // Another incident, then the process dies: the restart keeps it.
        switch.node("pos", "03", "disable").await;
        let before = switch.summary("pos").await;
        assert_eq!(
            before,
            [
                "01: enabled/1",
                "02: enabled/2",
                "03: disabled/1",
                "04: enabled/1"
            ]
        );
        switch.kill().await;
        let mut switch = rig.start().await;
        assert_eq!(
            switch.summary("pos").await,
            before,
            "the restart keeps them"
        );
        let line = switch.logged("node 03 disabled").await;
        assert!(line.contains("runtime change kept"), "{line}");

        // The file now lists 04 itself, at weight 2: the file wins over the
        // node the API added, and says how.
        let with_04 = format!(
            "{}[[service.back.node]]\nid = \"04\"\naddress = \"{}\"\nweight = 2\n",
            file(2),
            addr(3)
        );
        rig.write(&with_04);
        let report = switch.reload().await;
        assert_eq!(
            lines(&report.overridden),
            [format!(
                "pos: node 04 added at {0} weight 1 priority 0 enabled (file: now has it at {0} weight 2 priority 0 enabled)",
                addr(3)
            )],
            "{report}"
        );
        assert_eq!(lines(&report.kept), ["pos: node 03 disabled"], "{report}");
        assert_eq!(
            report.changes,
            ["pos: node 04 weight 1 -> 2, priority 0 -> 0"],
            "{report}"
        );

        // A node of the file removed through the API stays removed.
        switch
            .ok("DELETE", "/api/v1/services/pos/nodes/04", None)
            .await;
        switch.signal("HUP");
        let line = switch.logged("SIGHUP:").await;
        assert!(
            line.contains("config reloaded")
                && line.contains("runtime changes kept: pos: node 03 disabled; pos: node 04 removed"),
            "{line}"
        );
        assert_eq!(
            switch.summary("pos").await,
            ["01: enabled/1", "02: enabled/2", "03: disabled/1"]
        );
        let saved: isoswitch::ops::runtime_state::RuntimeState =
            serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
        let records = saved.of("pos");
        assert_eq!(records.keys().collect::<Vec<_>>(), ["03", "04"], "{saved:?}");
        assert_eq!(records["04"].runtime, None, "{saved:?}");
        switch.kill().await;
    })
    .await
    .expect("test within its time limit");
}

/// A reload refused by its second service changes nothing in the first:
/// neither when the second service stamps F37 (a new node needs a restart)
/// nor when a runtime change would leave it without a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refused_part_way_changes_nothing() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let mut sims = Vec::new();
        for id in ["01", "02", "03"] {
            sims.push(node_sim(&spec, id).await);
        }
        let (a, b, c) = (sims[0].addr, sims[1].addr, sims[2].addr);
        let rig = Rig::new("partway");
        let stamp = "f37_stamp = { offset = 10, width = 2 }";
        let file = |weight_01,
                    stamped_nodes: &[(&str, SocketAddr, u32)],
                    plain_nodes: &[(&str, SocketAddr, u32)]| {
            format!(
                "{}{}{}",
                service_toml("first", "", &[("01", a, weight_01), ("02", b, 1)]),
                service_toml("stamped", stamp, stamped_nodes),
                service_toml("plain", "", plain_nodes),
            )
        };
        let plain = [("01", a, 1), ("02", b, 1)];
        rig.write(&file(1, &[("01", a, 1)], &plain));
        let switch = rig.start().await;
        let first = switch.summary("first").await;
        assert_eq!(first, ["01: enabled/1", "02: enabled/1"]);

        // The first service's weight changes, the stamped one gains a node.
        rig.write(&file(5, &[("01", a, 1), ("02", c, 1)], &plain));
        let (code, body) = switch.call("POST", "/api/v1/reload", None).await.unwrap();
        assert_eq!(code, 409, "{body}");
        assert!(
            body.contains("stamps F37") && body.contains("restart needed"),
            "{body}"
        );
        assert_eq!(switch.summary("first").await, first, "nothing applied");
        assert_eq!(switch.summary("stamped").await, ["01: enabled/1"]);

        // 02 removed from `plain` through the API; the file then drops 01:
        // `plain` would keep no node, so the whole reload is refused.
        switch
            .ok("DELETE", "/api/v1/services/plain/nodes/02", None)
            .await;
        rig.write(&file(5, &[("01", a, 1)], &[("02", b, 1)]));
        let (code, body) = switch.call("POST", "/api/v1/reload", None).await.unwrap();
        assert_eq!(code, 409, "{body}");
        assert!(body.contains("without a node"), "{body}");
        assert_eq!(switch.summary("first").await, first, "nothing applied");
        assert_eq!(switch.summary("plain").await, ["01: enabled/1"]);

        // Fixed, it applies whole.
        rig.write(&file(5, &[("01", a, 1)], &plain));
        let report = switch.reload().await;
        assert_eq!(
            report.changes,
            ["first: node 01 weight 1 -> 5, priority 0 -> 0"],
            "{report}"
        );
        assert_eq!(lines(&report.kept), ["plain: node 02 removed"], "{report}");
        switch.kill().await;
    })
    .await
    .expect("test within its time limit");
}

/// Reloads at once (API calls and a SIGHUP) take turns: the one that comes
/// first adds the file's new node, the others find nothing to do, and none
/// fails on the node the first added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reloads_take_turns() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let mut sims = Vec::new();
        for id in ["01", "02", "03", "04", "05", "06"] {
            sims.push(node_sim(&spec, id).await);
        }
        let ids = ["01", "02", "03", "04", "05", "06"];
        let nodes: Vec<(&str, SocketAddr, u32)> = ids
            .iter()
            .zip(&sims)
            .map(|(id, s)| (*id, s.addr, 1))
            .collect();
        let rig = Rig::new("concurrent");
        rig.write(&service_toml("pos", "", &nodes[..2]));
        let mut switch = rig.start().await;
        // Four new nodes in the file, reloaded by eight callers at once.
        rig.write(&service_toml("pos", "", &nodes));
        let switch_ref = &switch;
        let calls =
            (0..8).map(|_| async move { switch_ref.call("POST", "/api/v1/reload", None).await });
        switch.signal("HUP");
        let answers = futures_util::future::join_all(calls).await;
        let mut added = 0;
        for answer in answers {
            let (code, body) = answer.expect("admin API reachable");
            assert_eq!(code, 200, "{body}");
            let report: ReloadReport = serde_json::from_str(&body).unwrap();
            added += report
                .changes
                .iter()
                .filter(|c| c.contains("added"))
                .count();
        }
        let line = switch.logged("SIGHUP:").await;
        assert!(line.contains("config reloaded"), "{line}");
        added += line.matches("added").count();
        assert_eq!(added, 4, "each new node added once, by one reload");
        assert_eq!(switch.nodes("pos").await.len(), 6);
        switch.kill().await;
    })
    .await
    .expect("test within its time limit");
}

/// What deploy/isoswitch.service relies on: without `token_file` the token is
/// the credential `$CREDENTIALS_DIRECTORY/admin-token`, before
/// `ISOSWITCH_ADMIN_TOKEN`; a `token_file` comes first; without `--data-dir`
/// or `data_dir` the state goes to `$STATE_DIRECTORY`'s first entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_systemd_the_token_is_the_credential_and_the_state_the_state_directory() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let sims = [node_sim(&spec, "01").await, node_sim(&spec, "02").await];
        let rig = Rig::new("systemd");
        let services = service_toml(
            "pos",
            "",
            &[("01", sims[0].addr, 1), ("02", sims[1].addr, 1)],
        );
        let credentials = rig.scratch.join("credentials");
        std::fs::create_dir(&credentials).unwrap();
        let credential = "credential-token-0123456789";
        write_secret(&credentials.join("admin-token"), &format!("{credential}\n"));
        let (state, other) = (rig.scratch.join("state"), rig.scratch.join("other"));
        let systemd = |cmd: &mut Command| {
            cmd.env("CREDENTIALS_DIRECTORY", &credentials)
                .env("ISOSWITCH_ADMIN_TOKEN", TOKEN)
                .env(
                    "STATE_DIRECTORY",
                    format!("{}:{}", state.display(), other.display()),
                );
        };

        rig.write_with("", &services);
        let switch = rig.spawn(credential, systemd).await;
        let (code, _) = request(&switch.base, "GET", "/api/v1/status", Some(TOKEN), None)
            .await
            .unwrap();
        assert_eq!(
            code, 401,
            "the credential comes before ISOSWITCH_ADMIN_TOKEN"
        );
        switch.node("pos", "02", "drain").await;
        assert!(
            state.join("runtime-state.json").is_file(),
            "state in $STATE_DIRECTORY"
        );
        assert!(!other.exists(), "only its first entry");
        switch.kill().await;

        rig.write(&services);
        let switch = rig.spawn(TOKEN, systemd).await;
        let (code, _) = request(
            &switch.base,
            "GET",
            "/api/v1/status",
            Some(credential),
            None,
        )
        .await
        .unwrap();
        assert_eq!(code, 401, "token_file comes before the credential");
        assert_eq!(
            switch.summary("pos").await,
            ["01: enabled/1", "02: drain/1"]
        );
        switch.kill().await;
    })
    .await
    .expect("test within its time limit");
}

/// A data directory that group or others can enter stops the start, and the
/// error names it and says what to do.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_others_can_enter_is_refused_with_its_path() {
    tokio::time::timeout(TEST_LIMIT, async {
        use std::os::unix::fs::PermissionsExt;
        let rig = Rig::new("open-dir");
        let node: SocketAddr = "127.0.0.1:9".parse().unwrap();
        rig.write(&service_toml("pos", "", &[("01", node, 1)]));
        std::fs::create_dir(&rig.data_dir).unwrap();
        std::fs::set_permissions(&rig.data_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = rig
            .command()
            .arg("--data-dir")
            .arg(&rig.data_dir)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run the switch");
        assert!(!out.status.success(), "{:?}", out.status);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let named = format!("{} has mode 0755", rig.data_dir.display());
        assert!(
            stderr.contains(&named) && stderr.contains("chmod 700"),
            "{stderr}"
        );
    })
    .await
    .expect("test within its time limit");
}
