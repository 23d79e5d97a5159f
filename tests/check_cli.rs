//! `isoswitch check` end to end: the binary, a config file, the environment.

use std::path::PathBuf;
use std::process::{Command, Output};

const MINIMAL: &str = r#"
[[service]]
name = "pos"
spec = "cup-pos"
[service.front]
kind = "listen"
listen = "127.0.0.1:6000"
[service.back]
[[service.back.node]]
id = "01"
address = "localhost:7001"
"#;

/// Writes `toml` to a file of its own and runs `isoswitch check` on it.
fn check(name: &str, toml: &str, env: &[(&str, &str)]) -> Output {
    let path: PathBuf = std::env::temp_dir().join(format!(
        "isoswitch-check-{}-{name}.toml",
        std::process::id()
    ));
    std::fs::write(&path, toml).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_isoswitch"));
    cmd.arg("check").arg("--config").arg(&path);
    // Only the variables this test sets.
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("ISOSWITCH__")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_file(&path);
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn check_prints_every_default_and_resolves_host_names() {
    let out = check("defaults", MINIMAL, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for key in [
        "key = [",
        "\"tpdu\"",
        "max_in_flight = 100000",
        "max_per_source = 64",
        "ejection_threshold = 5",
        "address = \"127.0.0.1:7001\"",
        "[service.declines]",
    ] {
        assert!(text.contains(key), "`{key}` missing:\n{text}");
    }
}

#[test]
fn check_refuses_a_typo_in_health_naming_the_key() {
    let toml = format!("{MINIMAL}[service.back.health]\nintervall = \"2s\"\n");
    let out = check("typo", &toml, &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("service[0].back.health") && err.contains("intervall"),
        "{err}"
    );
}

#[test]
fn check_names_the_environment_variable_at_fault() {
    let out = check(
        "env",
        MINIMAL,
        &[("ISOSWITCH__SERVICE__0__BACK__RECONNECT_MIN", "soon")],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(
            "ISOSWITCH__SERVICE__0__BACK__RECONNECT_MIN (sets service[0].back.reconnect_min)"
        ),
        "{err}"
    );
}

#[test]
fn check_warns_when_limits_exceed_the_open_file_limit() {
    let toml = MINIMAL.replace(
        "kind = \"listen\"",
        "kind = \"listen\"\nmax_connections = 1000000000",
    );
    let out = check("nofile", &toml, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning:") && err.contains("open-file limit"),
        "{err}"
    );
    let quiet = check("nofile-ok", MINIMAL, &[]);
    assert!(
        !stderr(&quiet).contains("open-file limit"),
        "{}",
        stderr(&quiet)
    );
}

#[test]
fn check_refuses_a_remote_store_in_clear_naming_allow_plaintext() {
    let store = "[store]\nurl = \"postgres://sw:Secr3t@10.9.8.7:5432/isw?sslmode=disable\"\nkey_file = \"/etc/isoswitch/store.key\"\n";
    let out = check("store-clear", &format!("{MINIMAL}{store}"), &[]);
    assert!(
        !out.status.success(),
        "a remote store in clear passed check"
    );
    let err = stderr(&out);
    assert!(err.contains("store.allow_plaintext"), "{err}");
    assert!(!err.contains("Secr3t"), "{err}");
    // Allowed in so many words, it passes.
    let out = check(
        "store-clear-allowed",
        &format!("{MINIMAL}{store}allow_plaintext = true\n"),
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // TLS (no sslmode) without the server's CA: named too.
    let tls = store.replace("?sslmode=disable", "");
    let out = check("store-no-ca", &format!("{MINIMAL}{tls}"), &[]);
    assert!(
        !out.status.success(),
        "a TLS store without a CA passed check"
    );
    assert!(stderr(&out).contains("store.ca_file"), "{}", stderr(&out));
}
