//! `isoswitch ctl`, signals, and a failed start.

use super::*;

/// `isoswitch ctl` over the API: the status table, the connection table,
/// a drain, JSON for scripts, and a refusal without the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_shows_tables_and_drains_a_node() {
    use isoswitch::cli::ctl::{CtlArgs, CtlCommand, execute};
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let (_nodes, switch) = admin_rig(&spec, 2, Delay::NONE, "ctl").await;
        wait_connected(service(&switch), 2).await;
        let args = |command, json| CtlArgs {
            admin: Api::of(&switch).base,
            json,
            token: Some(TOKEN.into()),
            command,
            tls: Default::default(),
        };
        let table = execute(&args(CtlCommand::Status, false)).await.unwrap();
        assert!(table.contains("NODE   ADDRESS"), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.trim_start().starts_with("02 ") && l.contains(" up ")),
            "{table}"
        );
        let conns = execute(&args(CtlCommand::Conns, false)).await.unwrap();
        assert_eq!(
            conns.lines().filter(|l| l.contains(" node ")).count(),
            4,
            "{conns}"
        );
        let drain = CtlCommand::Drain {
            service: "svc".into(),
            node: "02".into(),
        };
        execute(&args(drain, false)).await.unwrap();
        let json = execute(&args(CtlCommand::Status, true)).await.unwrap();
        let status: Status = serde_json::from_str(&json).unwrap();
        assert_eq!(status.services[0].nodes[1].state, "draining");
        let mut anonymous = args(CtlCommand::Status, false);
        anonymous.token = None;
        let err = execute(&anonymous).await.unwrap_err().to_string();
        assert!(err.contains("HTTP 401"), "{err}");
        switch.stop().await;
    })
    .await
    .expect("test within its time limit");
}

/// `isoswitch ctl health`, the container image's HEALTHCHECK: no token on the
/// open probe paths; `--ready` fails with the reason while no node can take
/// traffic; an admin listener that is not there fails too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_health_probes_without_a_token() {
    use isoswitch::cli::ctl::{CtlArgs, CtlCommand, execute};
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let (_nodes, switch) = admin_rig(&spec, 2, Delay::NONE, "health").await;
        let api = Api::of(&switch);
        let probe = |admin: &str, ready| CtlArgs {
            admin: admin.to_string(),
            json: false,
            token: None,
            command: CtlCommand::Health { ready },
            tls: Default::default(),
        };
        assert_eq!(execute(&probe(&api.base, false)).await.unwrap(), "ok\n");
        wait_connected(service(&switch), 2).await;
        let ready = loop {
            match execute(&probe(&api.base, true)).await {
                Ok(text) => break text,
                Err(e) => assert!(e.to_string().contains("HTTP 503"), "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(ready, "ready\n");
        api.node("01", "disable").await;
        api.node("02", "disable").await;
        let err = execute(&probe(&api.base, true))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("HTTP 503") && err.contains("no healthy node"),
            "{err}"
        );
        // Alive all the same: /healthz says the process answers, nothing more.
        assert_eq!(execute(&probe(&api.base, false)).await.unwrap(), "ok\n");
        let gone = format!("http://{}", switch.admin_addr().expect("admin listener"));
        switch.stop().await;
        assert!(execute(&probe(&gone, false)).await.is_err());
    })
    .await
    .expect("test within its time limit");
}

/// `isoswitch run`: SIGHUP reloads the file (a weight change applies; an
/// invalid file is refused and the switch runs on), SIGTERM stops it with
/// exit status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_running_switch() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 3, Delay::NONE).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let token = temp_file("sighup.token", TOKEN);
        let admin = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let text = |weight| {
            file_config(&addrs, weight, "127.0.0.1:0", &token).replace(
                "listen = \"127.0.0.1:0\"\ntoken_file",
                &format!("listen = \"{admin}\"\ntoken_file"),
            )
        };
        let path = temp_file("sighup.toml", &text(1));
        let data_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("admin-sighup-{}.data", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
            .args(["run", "--config"])
            .arg(&path)
            .arg("--data-dir")
            .arg(&data_dir)
            .env("ISOSWITCH_LOG", "warn")
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run the switch");
        let api = Api {
            base: format!("http://{admin}"),
        };
        let weight_of_02 = || async {
            match request(&api.base, "GET", "/api/v1/status", Some(TOKEN), None).await {
                Ok((200, body)) => serde_json::from_str::<Status>(&body)
                    .ok()
                    .map(|s| s.services[0].nodes[1].weight),
                _ => None,
            }
        };
        let until = |want: u32| async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while weight_of_02().await != Some(want) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "weight of 02 never became {want}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        until(1).await;
        let hup = |pid: u32| {
            std::process::Command::new("kill")
                .args(["-HUP", &pid.to_string()])
                .status()
                .unwrap()
        };
        let pid = child.id().expect("running");
        let mut log = {
            use tokio::io::AsyncBufReadExt;
            tokio::io::BufReader::new(child.stderr.take().unwrap()).lines()
        };
        std::fs::write(&path, text(1).replace("weighted", "fastest")).unwrap();
        assert!(hup(pid).success());
        loop {
            let line = log
                .next_line()
                .await
                .unwrap()
                .expect("the switch logs the refusal");
            if line.contains("reload refused") {
                assert!(line.contains("fastest"), "{line}");
                break;
            }
        }
        assert_eq!(weight_of_02().await, Some(1), "the old config runs on");
        std::fs::write(&path, text(4)).unwrap();
        // The refused reload left the switch up; this one applies.
        assert!(hup(pid).success());
        until(4).await;
        assert!(child.try_wait().unwrap().is_none(), "still running");
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status}");
        std::fs::remove_dir_all(&data_dir).expect("the switch made its data directory");
    })
    .await
    .expect("test within its time limit");
}

/// A switch whose start fails (here: the admin address is taken) stops what
/// it had started: its front no longer accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_leaves_nothing_listening() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 1, Delay::NONE).await;
        let front_addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut cfg = Rig::on("cup-pos").config(&[nodes[0].addr]);
        if let isoswitch::config::FrontConfig::Listen(l) = &mut cfg.services[0].front {
            l.listen = front_addr;
        }
        let mut admin = admin_config("failed-start");
        admin.listen = taken.local_addr().unwrap();
        cfg.admin = Some(admin);
        let err = Switch::start(&cfg)
            .await
            .err()
            .expect("the admin address is taken");
        assert!(err.to_string().contains("admin.listen"), "{err}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(front_addr).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the front still accepts after a failed start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("test within its time limit");
}

/// A token rotated in its file works after SIGHUP, and the token it
/// replaced keeps working for `token_rotation_window`, then is refused:
/// clients are handed the new token without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_works_after_sighup_and_the_old_one_only_for_its_window() {
    tokio::time::timeout(TEST_LIMIT, async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 1, Delay::NONE).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let token = temp_file("rotate.token", TOKEN);
        let admin = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let text = file_config(&addrs, 1, "127.0.0.1:0", &token).replace(
            "listen = \"127.0.0.1:0\"\ntoken_file",
            &format!("listen = \"{admin}\"\ntoken_rotation_window = \"2s\"\ntoken_file"),
        );
        let path = temp_file("rotate.toml", &text);
        let data_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("admin-rotate-{}.data", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
            .args(["run", "--config"])
            .arg(&path)
            .arg("--data-dir")
            .arg(&data_dir)
            .env("ISOSWITCH_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("run the switch");
        let base = format!("http://{admin}");
        let code = |token: &'static str| {
            let base = base.clone();
            async move {
                match request(&base, "GET", "/api/v1/status", Some(token), None).await {
                    Ok((code, _)) => code,
                    Err(_) => 0,
                }
            }
        };
        let until = |token: &'static str, want: u16| {
            let code = &code;
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                loop {
                    let got = code(token).await;
                    if got == want {
                        return;
                    }
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "token {token}: HTTP {got}, never {want}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        until(TOKEN, 200).await;
        const NEW: &str = "the-rotated-admin-token-0002";
        assert_eq!(code(NEW).await, 401, "not yet the token");
        write_secret(&token, &format!("{NEW}\n"));
        let pid = child.id().expect("running");
        let hup = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(hup.success());
        until(NEW, 200).await;
        assert_eq!(code(TOKEN).await, 200, "the old token within its window");
        until(TOKEN, 401).await;
        assert_eq!(code(NEW).await, 200);
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status}");
        let _ = std::fs::remove_dir_all(&data_dir);
    })
    .await
    .expect("test within its time limit");
}
