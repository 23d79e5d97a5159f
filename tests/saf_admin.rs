//! End-to-end: the store-and-forward queue seen and steered through the admin
//! API, `/metrics` and `isoswitch ctl saf`, on a real switch process with a
//! data directory (SQLite store), real `sim node` processes that approve half
//! their requests a second past the switch's timeout and never answer a
//! reversal (so every reversal stays pending), and a real `sim nac`. No
//! assertion is on timing: waits poll for a state, each bounded by the test's
//! own timeout.

use std::net::SocketAddr;
use std::time::Duration;

use isoswitch::cli::ctl::request;
use isoswitch::ops::saf::SafEntryView;
use isoswitch::ops::status::Status;

#[path = "common/procs.rs"]
mod procs;
use procs::*;

/// The token `admin_toml` writes.
const TOKEN: &str = "process-test-token";
const TEST_LIMIT: Duration = Duration::from_secs(120);

struct Api(String);

impl Api {
    async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        request(&self.0, method, path, Some(TOKEN), body.map(str::to_string))
            .await
            .expect("admin API reachable")
    }

    async fn entries(&self, query: &str) -> Vec<SafEntryView> {
        let (status, text) = self
            .call("GET", &format!("/api/v1/saf?{query}"), None)
            .await;
        assert_eq!(status, 200, "{text}");
        assert!(
            !text.contains("payload"),
            "a listing never shows a payload: {text}"
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    async fn entry(&self, id: i64) -> SafEntryView {
        self.entries("state=all&limit=1000")
            .await
            .into_iter()
            .find(|e| e.id == id)
            .unwrap_or_else(|| panic!("entry {id} is listed"))
    }
}

/// The value of the sample `series` (name and labels, exactly) in a scrape.
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `isoswitch ctl --admin ADMIN ARGS` with the token in its environment (or
/// none): exit success and stdout.
fn ctl(admin: SocketAddr, token: Option<&str>, args: &[&str]) -> (bool, String) {
    let base = format!("http://{admin}");
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["ctl", "--admin", &base]).args(args);
    match token {
        Some(t) => cmd.env("ISOSWITCH_ADMIN_TOKEN", t),
        None => cmd.env_remove("ISOSWITCH_ADMIN_TOKEN"),
    };
    let out = cmd.output().expect("ctl runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Polls `check` every 100 ms until it gives a value (the test's timeout
/// bounds it).
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..600 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_reversals_are_listed_counted_dropped_and_retried() {
    tokio::time::timeout(TEST_LIMIT, scenario())
        .await
        .expect("within the test's timeout");
}

async fn scenario() {
    let (_nodes, addrs) = start_nodes_with(
        "cup-pos",
        2,
        "0..10ms",
        &[
            "--late-share",
            "0.5",
            "--late-by",
            "1s",
            "--ignore-reversals",
            "1000",
        ],
    )
    .await;
    let listen = free_addr();
    let (admin, admin_toml) = admin_toml("saf-admin");
    let toml = format!(
        "{admin_toml}\n[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
         [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
         [service.back]\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n\
         [service.timeouts]\nrequest = \"300ms\"\n{}",
        nodes_toml(&addrs)
    );
    let config = write_config("saf-admin", &toml);
    let (config, data) = (config.to_string_lossy().into_owned(), data_dir("saf-admin"));
    let switch = Proc::spawn(
        "saf-admin-switch",
        &["run", "--config", &config, "--data-dir", &data],
    );
    wait_listening(listen).await;
    wait_listening(admin).await;
    let api = &Api(format!("http://{admin}"));

    // No token, no queue: reading and changing both want it.
    for (method, path) in [("GET", "/api/v1/saf"), ("POST", "/api/v1/saf/1/retry")] {
        let (status, text) = request(&api.0, method, path, None, None)
            .await
            .expect("reachable");
        assert_eq!(status, 401, "{method} {path} without a token: {text}");
    }

    let (l, rate) = (listen.to_string(), "50");
    let nac = Proc::spawn(
        "saf-admin-nac",
        &[
            "sim",
            "nac",
            "--connect",
            &l,
            "--spec",
            "cup-pos",
            "--rate",
            rate,
            "--duration",
            "3s",
            "--timeout",
            "5s",
            "--json",
        ],
    );
    let report = nac.report().await;
    assert!(n(&report, "sent") > 0, "{report}");

    // Late approvals become pending reversals, listed with masked PANs.
    let pending = until(
        "three reversals pending, each tried once",
        move || async move {
            let pending = api.entries("state=pending").await;
            (pending.iter().filter(|e| e.attempts >= 1).count() >= 3).then_some(pending)
        },
    )
    .await;
    for e in &pending {
        assert_eq!(
            (e.service.as_str(), e.kind.as_str()),
            ("pos", "reversal"),
            "{e:?}"
        );
        assert_eq!(e.mti, "0420", "{e:?}");
        assert_eq!(e.direction, "to_node", "{e:?}");
        let pan = e
            .pan_masked
            .as_deref()
            .unwrap_or_else(|| panic!("a PAN: {e:?}"));
        assert!(pan.contains('*'), "masked: {e:?}");
        assert!(
            pan.bytes().filter(u8::is_ascii_digit).count() <= 10,
            "{e:?}"
        );
    }

    // The metrics show the queue (from the sampler's cache) and the counters.
    until("isoswitch_saf_depth > 0", move || async move {
        let scrape = metrics(admin, &["isoswitch_saf_depth"]).await;
        sample(
            &scrape,
            "isoswitch_saf_depth{service=\"pos\",kind=\"reversal\"}",
        )
        .filter(|v| *v > 0.0)
    })
    .await;
    let scrape = metrics(admin, &["isoswitch_"]).await;
    let value = |series: &str| {
        sample(&scrape, series).unwrap_or_else(|| panic!("{series} in the scrape:\n{scrape}"))
    };
    assert!(value("isoswitch_late_approvals_total{service=\"pos\",action=\"reversed\"}") > 0.0);
    assert_eq!(
        value("isoswitch_late_approvals_total{service=\"pos\",action=\"unreversed\"}"),
        0.0
    );
    assert!(value("isoswitch_reversals_sent_total{service=\"pos\"}") > 0.0);
    assert!(value("isoswitch_saf_sent_total{service=\"pos\"}") > 0.0);
    assert_eq!(
        value("isoswitch_saf_delivered_total{service=\"pos\",kind=\"reversal\"}"),
        0.0
    );
    assert_eq!(
        value("isoswitch_reversals_acknowledged_total{service=\"pos\"}"),
        0.0
    );
    assert_eq!(
        value("isoswitch_saf_depth{service=\"pos\",kind=\"advice\"}"),
        0.0
    );
    assert_eq!(
        value("isoswitch_saf_dead_letters{service=\"pos\",kind=\"reversal\"}"),
        0.0
    );
    assert!(value("isoswitch_saf_oldest_age_seconds{service=\"pos\"}") >= 0.0);
    assert_eq!(
        value("isoswitch_advices_total{service=\"pos\",outcome=\"stored\"}"),
        0.0
    );

    let status: Status =
        serde_json::from_str(&api.call("GET", "/api/v1/status", None).await.1).expect("status");
    let queue = status.services[0].integrity.saf.as_ref().expect("a store");
    assert!(queue.reversals_pending > 0, "{queue:?}");

    // Drop one, with a reason: it is dropped, once.
    let dropped = pending[0].id;
    let path = format!("/api/v1/saf/{dropped}/drop");
    let (status, text) = api.call("POST", &path, Some("{}")).await;
    assert_eq!(status, 400, "a drop wants a reason: {text}");
    let reason = r#"{"reason": "booked by hand\nticket 4761739001010119"}"#;
    let (status, text) = api.call("POST", &path, Some(reason)).await;
    assert_eq!(status, 200, "{text}");
    let gone = api.entry(dropped).await;
    assert_eq!(gone.state, "dropped", "{gone:?}");
    assert_eq!(
        gone.reason.as_deref(),
        Some("booked by hand ticket [digits left out]"),
        "{gone:?}"
    );
    switch.wait_logged("dropped by an operator").await;
    let log = std::fs::read_to_string(&switch.log).expect("switch log");
    assert!(
        !log.contains("4761739001010119"),
        "a card number never reaches the log"
    );
    let (status, text) = api.call("POST", &path, Some(reason)).await;
    assert_eq!(status, 409, "dropped already: {text}");
    let listed = api.entries("state=dropped").await;
    assert!(listed.iter().any(|e| e.id == dropped), "{listed:?}");
    for action in ["retry", "drop"] {
        let (status, text) = api
            .call(
                "POST",
                &format!("/api/v1/saf/987654321/{action}"),
                Some(reason),
            )
            .await;
        assert_eq!(status, 404, "{action} of an unknown entry: {text}");
    }

    // Retry one whose next attempt is due in the future (after backoff): it
    // is tried again at once.
    let before = until("an entry between attempts", move || async move {
        let now = std::time::SystemTime::now();
        api.entries("state=pending").await.into_iter().find(|e| {
            e.id != dropped
                && e.attempts >= 1
                && e.lease_owner.is_none()
                && isoswitch::ops::saf::parse_rfc3339(&e.next_attempt_at).is_some_and(|t| t > now)
        })
    })
    .await;
    let (status, text) = api
        .call("POST", &format!("/api/v1/saf/{}/retry", before.id), None)
        .await;
    assert_eq!(status, 200, "{text}");
    let b = &before;
    until("the retried entry is attempted again", move || async move {
        let now = api.entry(b.id).await;
        (now.attempts > b.attempts || now.next_attempt_at < b.next_attempt_at).then_some(())
    })
    .await;

    // ctl: the table, a drop, and no token no answer.
    let (ok, out) = ctl(admin, Some(TOKEN), &["saf", "--state", "dropped"]);
    assert!(ok, "{out}");
    assert!(out.starts_with("    ID SERVICE"), "{out}");
    assert!(out.contains(&format!("{dropped:>6} pos")), "{out}");
    let third = pending
        .iter()
        .find(|e| e.id != dropped && e.id != before.id)
        .expect("a third entry");
    let id = third.id.to_string();
    let (ok, out) = ctl(
        admin,
        Some(TOKEN),
        &["saf", "drop", &id, "--reason", "duplicate"],
    );
    assert!(ok, "{out}");
    assert_eq!(api.entry(third.id).await.state, "dropped");
    let (ok, out) = ctl(admin, None, &["saf"]);
    assert!(!ok && out.contains("401"), "{out}");
}

/// A switch with no store (started in process, no data directory): the
/// queue's endpoints say so with 503, and /metrics has no `isoswitch_saf_*`
/// series (there is no queue), while the integrity counters are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_the_queue_endpoints_answer_503() {
    tokio::time::timeout(TEST_LIMIT, async {
        let (admin, admin_toml) = admin_toml("saf-nostore");
        let toml = format!(
            "{admin_toml}\n[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n\
             [service.back]\n[[service.back.node]]\nid = \"01\"\naddress = \"{}\"\n",
            free_addr()
        );
        let config = isoswitch::config::Config::from_toml(&toml).expect("config");
        let switch = isoswitch::ops::run::Switch::start(&config)
            .await
            .expect("switch starts");
        let api = Api(format!("http://{admin}"));
        for (method, path, body) in [
            ("GET", "/api/v1/saf", None),
            ("POST", "/api/v1/saf/1/retry", None),
            ("POST", "/api/v1/saf/1/drop", Some(r#"{"reason": "x"}"#)),
        ] {
            let (status, text) = api.call(method, path, body).await;
            assert_eq!(status, 503, "{method} {path}: {text}");
            assert!(text.contains("no store"), "{text}");
        }
        let scrape = metrics(admin, &["isoswitch_"]).await;
        assert!(!scrape.contains("isoswitch_saf_"), "{scrape}");
        assert!(
            scrape
                .contains("isoswitch_late_approvals_total{service=\"pos\",action=\"reversed\"} 0"),
            "{scrape}"
        );
        switch.stop().await;
    })
    .await
    .expect("within the test's timeout");
}
