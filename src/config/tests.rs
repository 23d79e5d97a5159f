//! The config's loading, defaults, environment overrides and validation.

use std::time::Duration;

use super::*;

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
address = "127.0.0.1:7001"
"#;

fn error_of(toml: &str) -> String {
    match Config::from_toml(toml) {
        Ok(_) => panic!("accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn embedded_default_is_valid() {
    let cfg = Config::embedded_default().unwrap();
    assert_eq!(cfg.services.len(), 4);
    assert!(matches!(cfg.services[1].front, FrontConfig::Simplex(_)));
    assert!(matches!(cfg.services[2].front, FrontConfig::Connect(_)));
    assert!(
        matches!(&cfg.services[3].front, FrontConfig::Listen(l) if l.mode == ListenMode::Oneconnect)
    );
}

#[test]
fn defaults_fill_in() {
    let cfg = Config::from_toml(MINIMAL).unwrap();
    let svc = &cfg.services[0];
    assert_eq!(svc.back.connections_per_node, 2);
    assert_eq!(svc.timeouts.request, Duration::from_secs(3));
    assert_eq!(svc.correlation.tpdu_on_response, TpduPolicy::Swap);
    let FrontConfig::Listen(l) = &svc.front else {
        panic!("listen front")
    };
    assert_eq!(l.max_per_source, 64);
}

#[test]
fn errors_name_the_key() {
    let dup =
        format!("{MINIMAL}[[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:7002\"\n");
    assert_eq!(
        error_of(&dup),
        "service[0].back.node[1].id: duplicate node id `01`"
    );
    let bad_key = MINIMAL.replace("[service.back]", "[service.back]\nconnections_per_node = 0");
    assert!(error_of(&bad_key).starts_with("service[0].back.connections_per_node"));
    let no_field = format!("{MINIMAL}[service.correlation]\nkey = [\"F41\", \"F150\"]\n");
    assert!(error_of(&no_field).contains("service[0].correlation.key[1]"));
    let bad_part = format!("{MINIMAL}[service.correlation]\nkey = [\"nonsense\"]\n");
    assert!(error_of(&bad_part).contains("not a key part"));
    let unknown_spec = MINIMAL.replace("cup-pos", "no-such-spec");
    assert!(error_of(&unknown_spec).starts_with("service[0].spec"));
    let unknown_key = MINIMAL.replace("[service.back]", "[service.back]\nconections_per_node = 2");
    assert!(error_of(&unknown_key).contains("conections_per_node"));
}

/// Names go unescaped into metrics labels, logs and URLs: a quote or
/// label syntax in one is refused at load, wherever it came from.
#[test]
fn names_outside_the_safe_alphabet_are_refused_with_the_key() {
    let node = |id: &str| {
        format!(
            "{MINIMAL}[[service.back.node]]\nid = {}\naddress = \"127.0.0.1:7002\"\n",
            toml::Value::String(id.into())
        )
    };
    for bad in ["x\",y=\"z", "\"", "a b", "n/1", "123456789"] {
        let err = error_of(&node(bad));
        assert!(
            err.starts_with("service[0].back.node[1].id: ") && err.contains("a letter, a digit"),
            "{bad:?}: {err}"
        );
    }
    for bad in ["x\",y=\"z", "po\"s", "", &"s".repeat(33)] {
        let toml = MINIMAL.replace(
            "name = \"pos\"",
            &format!("name = {}", toml::Value::String(bad.into())),
        );
        let err = error_of(&toml);
        assert!(err.starts_with("service[0].name: "), "{bad:?}: {err}");
    }
    let odd = MINIMAL
        .replace("name = \"pos\"", "name = \"pos.east-1_a\"")
        .replace("id = \"01\"", "id = \"n.1_a-b\"");
    assert!(Config::from_toml(&odd).is_ok(), "`.`, `-` and `_` are fine");
    let env = env_error_of(
        MINIMAL,
        &[("ISOSWITCH__SERVICE__0__BACK__NODE__0__ID", "x\",y=\"z")],
    );
    assert!(
        env.contains("ISOSWITCH__SERVICE__0__BACK__NODE__0__ID")
            && env.contains("service[0].back.node[0].id"),
        "{env}"
    );
}

#[test]
fn simplex_needs_an_f37_stamp_that_fits_the_node_ids() {
    let simplex = r#"
[[service]]
name = "up"
spec = "cups"
[service.front]
kind = "simplex"
connect = "127.0.0.1:9001"
listen = "127.0.0.1:9101"
links = 2
member_id = "03105840"
peer_id = "00010000"
[service.back]
[[service.back.node]]
id = "001"
address = "127.0.0.1:7001"
"#;
    assert!(error_of(simplex).starts_with("service[0].f37_stamp"));
    let narrow = simplex.replace(
        "name = \"up\"",
        "name = \"up\"\nf37_stamp = { offset = 10, width = 2 }",
    );
    assert!(
        error_of(&narrow).starts_with("service[0].f37_stamp"),
        "{}",
        error_of(&narrow)
    );
    let fits = narrow.replace("id = \"001\"", "id = \"01\"");
    assert!(Config::from_toml(&fits).is_ok());
}

fn env(vars: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<Vec<_>>()
        .into_iter()
}

fn env_error_of(toml: &str, vars: &[(&str, &str)]) -> String {
    match Config::from_toml_with_env(toml, env(vars)) {
        Ok(_) => panic!("accepted {vars:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn environment_overrides_reach_into_lists() {
    let vars = [
        ("ISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST", "5s"),
        ("ISOSWITCH__SERVICE__0__BACK__NODE__0__WEIGHT", "3"),
        ("ISOSWITCH__SERVICE__0__BACK__CONNECTIONS_PER_NODE", "4"),
        ("ISOSWITCH__SERVICE__0__BACK__HEALTH__RISE", "7"),
        ("OTHER__THING", "ignored"),
    ];
    let cfg = Config::from_toml_with_env(MINIMAL, env(&vars)).unwrap();
    let svc = &cfg.services[0];
    assert_eq!(svc.timeouts.request, Duration::from_secs(5));
    assert_eq!(svc.back.nodes[0].weight, 3);
    assert_eq!(svc.back.connections_per_node, 4);
    assert_eq!(svc.back.health.state.rise, 7);

    let err = env_error_of(MINIMAL, &[("ISOSWITCH__SERVICE__3__NAME", "x")]);
    assert!(
        err.contains("ISOSWITCH__SERVICE__3__NAME") && err.contains("index 3"),
        "{err}"
    );
}

#[test]
fn environment_strings_stay_strings() {
    let vars = [
        ("ISOSWITCH__SERVICE__0__BACK__NODE__0__ID", "01"),
        ("ISOSWITCH__SERVICE__0__NAME", "007"),
        ("ISOSWITCH__SERVICE__0__DECLINES__TIMEOUT", "05"),
    ];
    let cfg = Config::from_toml_with_env(MINIMAL, env(&vars)).unwrap();
    let svc = &cfg.services[0];
    assert_eq!(svc.back.nodes[0].id, "01");
    assert_eq!(svc.name, "007");
    assert_eq!(
        svc.declines.code(crate::route::DeclineReason::Timeout),
        *b"05"
    );
}

#[test]
fn environment_errors_name_the_variable() {
    let err = env_error_of(
        MINIMAL,
        &[("ISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST", "soon")],
    );
    assert!(
        err.starts_with(
            "ISOSWITCH__SERVICE__0__TIMEOUTS__REQUEST (sets service[0].timeouts.request)"
        ),
        "{err}"
    );
    let err = env_error_of(
        MINIMAL,
        &[("ISOSWITCH__SERVICE__0__CORRELATION__MAX_IN_FLIGHT", "0")],
    );
    assert!(
        err.starts_with("ISOSWITCH__SERVICE__0__CORRELATION__MAX_IN_FLIGHT"),
        "{err}"
    );
    let err = env_error_of(
        MINIMAL,
        &[("ISOSWITCH__SERVICE__0__BACK__HEALTH__RYSE", "2")],
    );
    assert!(
        err.starts_with("ISOSWITCH__SERVICE__0__BACK__HEALTH__RYSE") && err.contains("ryse"),
        "{err}"
    );
    // An error the file makes still blames the file's key.
    let bad_file = MINIMAL.replace("127.0.0.1:7001", "127.0.0.1:70000");
    let err = env_error_of(&bad_file, &[("ISOSWITCH__SERVICE__0__NAME", "x")]);
    assert!(err.starts_with("service[0].back.node[0].address"), "{err}");
}

#[test]
fn unknown_keys_are_refused_at_every_level() {
    let at = |table: &str, key: &str| -> String {
        let toml = if table.is_empty() {
            format!("{key} = 1\n{MINIMAL}")
        } else if MINIMAL.contains(&format!("{table}\n")) {
            MINIMAL.replace(&format!("{table}\n"), &format!("{table}\n{key} = 1\n"))
        } else {
            format!("{MINIMAL}{table}\n{key} = 1\n")
        };
        error_of(&toml)
    };
    for (table, path) in [
        ("", ""),
        ("[[service]]", "service[0]"),
        ("[service.front]", "service[0].front"),
        ("[service.back]", "service[0].back"),
        ("[[service.back.node]]", "service[0].back.node[0]"),
        ("[service.back.health]", "service[0].back.health"),
        ("[service.correlation]", "service[0].correlation"),
        ("[service.timeouts]", "service[0].timeouts"),
        ("[service.declines]", "service[0].declines"),
    ] {
        let err = at(table, "typo_key");
        assert!(
            err.starts_with(path) && err.contains("typo_key"),
            "{table}: {err}"
        );
    }
}

#[test]
fn typed_values_name_their_key() {
    let cases = [
        (
            MINIMAL.replace(
                "[service.back]",
                "[service.timeouts]\nrequest = \"3 parsecs\"\n[service.back]",
            ),
            "service[0].timeouts.request",
        ),
        (
            MINIMAL.replace(
                "kind = \"listen\"",
                "kind = \"listen\"\nallow = [\"10.0.0.0/33\"]",
            ),
            "service[0].front.allow[0]",
        ),
        (
            MINIMAL.replace("127.0.0.1:7001", "127.0.0.1"),
            "service[0].back.node[0].address",
        ),
        (
            MINIMAL.replace("127.0.0.1:6000", "localhost:port"),
            "service[0].front.listen",
        ),
        (
            format!("{MINIMAL}[service.declines]\ntimeout = \"911\"\n"),
            "service[0].declines.timeout",
        ),
        (
            MINIMAL.replace("[service.back]", "[service.back]\nalgorithm = \"fastest\""),
            "service[0].back.algorithm",
        ),
        (
            MINIMAL.replace(
                "kind = \"listen\"",
                "kind = \"listen\"\non_bad_message = \"explode\"",
            ),
            "service[0].front.on_bad_message",
        ),
        (
            MINIMAL.replace(
                "kind = \"listen\"",
                "kind = \"listen\"\nmax_connections = \"many\"",
            ),
            "service[0].front.max_connections",
        ),
    ];
    for (toml, key) in cases {
        let err = error_of(&toml);
        assert!(err.starts_with(key), "{key}: {err}");
    }
    let bad_health = format!("{MINIMAL}[service.back.health]\nbase_ejection = \"often\"\n");
    let err = error_of(&bad_health);
    assert!(
        err.starts_with("service[0].back.health") && err.contains("base_ejection"),
        "{err}"
    );
}

#[test]
fn host_names_are_resolved_at_load() {
    let named = MINIMAL.replace("127.0.0.1:7001", "localhost:7001");
    let cfg = Config::from_toml_with_env(&named, env(&[])).unwrap();
    let addr = cfg.services[0].back.nodes[0].address;
    assert!(addr.ip().is_loopback() && addr.port() == 7001, "{addr}");
    assert_eq!(
        host_port::resolve("[::1]:7001").unwrap(),
        "[::1]:7001".parse().unwrap()
    );
    assert!(
        host_port::resolve("localhost:65536")
            .unwrap_err()
            .to_string()
            .contains("port")
    );
    assert!(
        host_port::resolve(":7001")
            .unwrap_err()
            .to_string()
            .contains("no host")
    );
}

#[test]
fn limits_that_refuse_everything_are_refused() {
    for (table, key, path) in [
        (
            "[service.correlation]",
            "max_in_flight",
            "service[0].correlation.max_in_flight",
        ),
        (
            "[service.back]",
            "write_queue",
            "service[0].back.write_queue",
        ),
        (
            "[service.back]",
            "connections_per_node",
            "service[0].back.connections_per_node",
        ),
        (
            "[service.front]",
            "max_connections",
            "service[0].front.max_connections",
        ),
        (
            "[service.front]",
            "max_per_source",
            "service[0].front.max_per_source",
        ),
        (
            "[service.front]",
            "write_queue",
            "service[0].front.write_queue",
        ),
    ] {
        let toml = if MINIMAL.contains(&format!("{table}\n")) {
            MINIMAL.replace(&format!("{table}\n"), &format!("{table}\n{key} = 0\n"))
        } else {
            format!("{MINIMAL}{table}\n{key} = 0\n")
        };
        let err = error_of(&toml);
        assert!(err.starts_with(path), "{key}: {err}");
    }
}

#[test]
fn effective_config_prints_every_default() {
    let simplex = r#"
[[service]]
name = "up"
spec = "cups"
f37_stamp = { offset = 10, width = 2 }
[service.front]
kind = "simplex"
connect = "127.0.0.1:9001"
listen = "127.0.0.1:9101"
links = 3
member_id = "03105840"
peer_id = "00010000"
[service.back]
[[service.back.node]]
id = "01"
address = "127.0.0.1:7001"
"#;
    let cfg = Config::from_toml_with_env(simplex, env(&[])).unwrap();
    let text = toml::to_string_pretty(&cfg.effective()).unwrap();
    assert!(text.contains("max_in_links = 3"), "{text}");
    assert!(text.contains("\"F7\""), "{text}");
    for key in [
        "max_in_flight",
        "tpdu_on_response",
        "ejection_threshold",
        "slow_start",
    ] {
        assert!(text.contains(key), "{key} missing:\n{text}");
    }
    // What check prints loads back to the same configuration.
    let again = Config::from_toml_with_env(&text, env(&[])).unwrap();
    assert_eq!(toml::to_string_pretty(&again).unwrap(), text);
    // The switch cannot acknowledge a peer's advice: refused by key.
    let stored = simplex.replace(
        "[service.back]\n",
        "[service.integrity]\nadvices = \"store-and-forward\"\n[service.back]\n",
    );
    let err = Config::from_toml_with_env(&stored, env(&[])).unwrap_err();
    assert!(err.to_string().contains("integrity.advices"), "{err}");
}

/// Only read-only paths can be opened: a path that changes the switch in
/// `open_paths` is refused at load, named by its index.
#[test]
fn only_read_only_paths_can_be_opened() {
    let with = |admin: &str| format!("[admin]\n{admin}\n{MINIMAL}");
    let err = error_of(&with(
        "open_paths = [\"/healthz\", \"/metrics\", \"/api/v1/reload\"]",
    ));
    assert!(
        err.starts_with("admin.open_paths[2]: `/api/v1/reload` cannot be opened"),
        "{err}"
    );
    let err = error_of(&with(
        "open_paths = [\"/api/v1/services/pos/nodes/01/disable\"]",
    ));
    assert!(err.starts_with("admin.open_paths[0]: "), "{err}");
    for bad in [
        "max_connections = 0",
        "header_timeout = \"0s\"",
        "request_timeout = \"0s\"",
        "max_requests_per_connection = 0",
    ] {
        let key = bad.split(' ').next().unwrap_or_default();
        let err = error_of(&with(bad));
        assert!(err.starts_with(&format!("admin.{key}: ")), "{err}");
    }
    let cfg = Config::from_toml_with_env(&with("open_paths = [\"/\"]"), env(&[])).unwrap();
    assert_eq!(cfg.admin.unwrap().open_paths, ["/"]);
    let cfg = Config::from_toml_with_env(&with(""), env(&[])).unwrap();
    let admin = cfg.admin.clone().unwrap();
    assert_eq!(admin, AdminConfig::default());
    assert_eq!(admin.open_paths, ["/healthz", "/readyz", "/metrics"]);
    assert_eq!(admin.max_connections, 64);
}

#[test]
fn key_parts_parse_both_forms() {
    assert_eq!(KeyPart::try_from("tpdu".to_string()), Ok(KeyPart::Tpdu));
    assert_eq!(KeyPart::try_from("F41".to_string()), Ok(KeyPart::Field(41)));
    assert_eq!(KeyPart::try_from("11".to_string()), Ok(KeyPart::Field(11)));
    assert!(KeyPart::try_from("F1".to_string()).is_err());
    assert_eq!(String::from(KeyPart::Field(7)), "F7");
}

#[test]
fn a_spec_with_a_3_digit_action_code_is_refused_on_a_service() {
    let toml = "[[service]]\nname = \"iso93\"\nspec = \"iso93binary\"\n\
                [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n\
                [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n";
    let e = Config::from_toml(toml).unwrap_err().to_string();
    assert!(e.starts_with("service[0].spec:"), "{e}");
    assert!(e.contains("F39 is 3 characters"), "{e}");
}

#[test]
fn reasons_are_typed_and_keep_the_refusing_layers_error() {
    let invalid = |toml: &str| match Config::from_toml(toml) {
        Err(ConfigError::Invalid { key, reason }) => (key, reason),
        other => panic!("not an invalid value: {other:?}"),
    };
    let (key, reason) = invalid(&MINIMAL.replace("\"cup-pos\"", "\"no-such-spec\""));
    assert_eq!(key, "service[0].spec");
    assert!(
        matches!(
            *reason,
            Reason::Spec(crate::iso8583::SpecError::NotFound { .. })
        ),
        "{reason}"
    );
    assert!(
        reason
            .to_string()
            .starts_with("spec no-such-spec: no builtin spec"),
        "{reason}"
    );
    let (key, reason) =
        invalid(&MINIMAL.replace("127.0.0.1:7001\"", "127.0.0.1:7001\"\nweight = 0"));
    assert_eq!(key, "service[0].back.node[0].weight");
    assert!(matches!(*reason, Reason::Rule(_)), "{reason:?}");
    let dup =
        format!("{MINIMAL}[[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:7002\"\n");
    let (_, reason) = invalid(&dup);
    assert!(
        matches!(&*reason, Reason::DuplicateNode(id) if id == "01"),
        "{reason:?}"
    );
    // Set by a variable: the same typed reason, blamed on the variable.
    match Config::from_toml_with_env(
        MINIMAL,
        env(&[("ISOSWITCH__SERVICE__0__CORRELATION__MAX_IN_FLIGHT", "0")]),
    ) {
        Err(ConfigError::Env { var, key, reason }) => {
            assert_eq!(var, "ISOSWITCH__SERVICE__0__CORRELATION__MAX_IN_FLIGHT");
            assert_eq!(key, "service[0].correlation.max_in_flight");
            assert!(matches!(*reason, Reason::Rule(_)), "{reason:?}");
        }
        other => panic!("not blamed on the variable: {other:?}"),
    }
}

/// `capture.clear` exists only in builds with the `tools` feature: the
/// default build (this test's) takes it, the production one refuses it
/// naming the key (also driven on the binary by
/// scripts/checks/production-build.sh).
#[test]
fn capture_clear_needs_the_tools_feature() {
    let toml = format!("{MINIMAL}[service.capture]\ndirectory = \"/tmp/c\"\nclear = true\n");
    match (Config::from_toml(&toml), cfg!(feature = "tools")) {
        (Ok(cfg), true) => {
            assert!(cfg.services[0].capture.as_ref().is_some_and(|c| c.clear));
        }
        (Err(e), false) => {
            let e = e.to_string();
            assert!(e.starts_with("service[0].capture.clear:"), "{e}");
            assert!(e.contains("`tools` feature"), "{e}");
        }
        (Ok(_), false) => panic!("accepted without the tools feature"),
        (Err(e), true) => panic!("refused with the tools feature: {e}"),
    }
}

/// Issue 41: a client cannot read a PostgreSQL server's filesystem, so
/// `journal.min_free` and a `max_size` given as a share of it are refused
/// with a PostgreSQL store, naming the key; `max_size` in bytes holds.
#[test]
fn a_postgres_store_refuses_what_only_a_local_filesystem_can_hold() {
    let pg = "[store]\nurl = \"postgres://switch@127.0.0.1:5432/isoswitch\"\n";
    let with = |journal: &str| format!("{pg}[journal]\n{journal}\n{MINIMAL}");
    assert!(error_of(&with("min_free = 1048576")).contains("journal.min_free"));
    assert!(error_of(&with("max_size = \"20%\"")).contains("journal.max_size"));
    Config::from_toml(&with("max_size = 1048576")).expect("max_size in bytes, on PostgreSQL");
    Config::from_toml(&format!(
        "[journal]\nmin_free = \"10%\"\nmax_size = \"20%\"\n{MINIMAL}"
    ))
    .expect("both, on SQLite");
}

/// A config error is returned through every check and wrapped with a path
/// or a service name by the commands that load one: it stays well under
/// clippy's result_large_err (128 bytes), its reason boxed.
#[test]
fn a_config_error_stays_small() {
    assert!(std::mem::size_of::<ConfigError>() <= 96);
}
