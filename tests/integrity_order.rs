//! What the switch owes, in order and to the right host, with real
//! processes: the `isoswitch` binary with its SQLite store, `sim node`
//! hosts that keep their own books (which advices they booked, which
//! reversals came before the advice they reverse, which answers they gave
//! late), and the store read with rusqlite from outside.
//!
//! - A terminal's 0420 that voids its 0220 reaches the host after the 0220,
//!   even when the 0220's first attempt went unanswered.
//! - Every repeat of an advice goes to the node its first attempt went to.
//! - A timeout reversal whose original the host declined late is cancelled
//!   before it is sent.
//!
//! No assertion is on timing: where a case waits for the switch, it polls
//! the store within the case's own timeout.

use std::time::Duration;

#[path = "common/owed.rs"]
mod owed;
#[path = "common/procs.rs"]
mod procs;
use owed::*;
use procs::*;

/// A switch for cup-pos terminals in front of `nodes`, advices stored and
/// forwarded; SAF retries every 500 ms.
fn advices_toml(listen: std::net::SocketAddr, nodes: &[std::net::SocketAddr]) -> String {
    pos_toml(listen, nodes, "500ms", "advices = \"store-and-forward\"")
}

/// A cup-pos message `mti` from terminal `T0000001` with STAN `stan`, and
/// its F7 (the sample's).
fn terminal_message(mti: &str, stan: &str) -> (Vec<u8>, String) {
    let spec = isoswitch::iso8583::Spec::builtin("cup-pos").expect("cup-pos");
    let payload = pos_request(mti, stan, "000000");
    let d = spec.decode(&payload).expect("decodes");
    let f7 = d.get(7).and_then(|v| v.as_text()).unwrap_or_default();
    (payload, f7.to_string())
}

/// The terminal's 0420 that voids its advice 0220 `stan` (sent at `f7`):
/// a new STAN, F90 naming the 0220.
fn voiding(stan: &str, f7: &str, own_stan: &str) -> Vec<u8> {
    let spec = isoswitch::iso8583::Spec::builtin("cup-pos").expect("cup-pos");
    let (payload, _) = terminal_message("0420", own_stan);
    let mut d = spec.decode(&payload).expect("decodes");
    let f32 = d.get(32).and_then(|v| v.as_text()).unwrap_or_default();
    let f90 = format!("0220{stan}{f7:0>10}{f32:0>11}{:0>11}", "");
    d.set_text(90, f90);
    d.set_text(39, "17");
    spec.encode(&d).expect("encodes")
}

/// Ten 0220 advices, each followed at once by the 0420 that voids it. The
/// host leaves the first message of every advice unanswered, so each 0220
/// needs a second attempt (0221) while its 0420 is already stored: the
/// switch holds every 0420 back until its 0220 is delivered. The host's
/// own book says whether any reversal came before the advice it reverses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reversal_of_an_advice_waits_until_the_advice_is_delivered() {
    within(Duration::from_secs(90), async {
        let addr = free_addr();
        let host = node("cup-pos", "01", addr, "0ms", &["--ignore-advices", "1"]).await;
        let listen = free_addr();
        let data = data_dir("order-switch");
        let _switch = switch(
            "order-switch",
            &advices_toml(listen, &[addr]),
            &data,
            listen,
        )
        .await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        let wait = Duration::from_secs(5);
        for i in 0..10u32 {
            let stan = format!("{:06}", 500 + i);
            let (advice, f7) = terminal_message("0220", &stan);
            let acked = ask(&mut s, &advice, wait).await;
            assert_eq!(acked, Some(("0230".into(), "00".into())), "advice {stan}");
            let void = voiding(&stan, &f7, &format!("{:06}", 600 + i));
            let acked = ask(&mut s, &void, wait).await;
            assert_eq!(acked, Some(("0430".into(), "00".into())), "void {stan}");
        }
        let rows = store_settles(&data, Duration::from_millis(500), |rows| {
            rows.len() == 20 && rows.iter().all(|r| r.state == "delivered")
        })
        .await;
        for pair in rows.chunks(2) {
            let [advice, void] = pair else { continue };
            assert_eq!(advice.mti, "0220", "{advice:?}");
            assert_eq!(void.mti, "0420", "{void:?}");
            assert!(advice.original.is_some(), "{advice:?}");
            assert_eq!(advice.original, void.original, "one original: {pair:?}");
            assert_eq!(advice.attempts, 2, "0220 unanswered, then 0221: {advice:?}");
        }
        let r = books(host).await;
        eprintln!("host: {r}");
        assert_eq!(r["reversals_before_their_advice"], 0, "{r}");
        assert_eq!(sub(&r, "advices", "distinct"), 10, "{r}");
        assert_eq!(sub(&r, "reversals", "chains"), 10, "{r}");
    })
    .await;
}

/// Two hosts, each leaving the first message of an advice unanswered:
/// every advice's repeat must go where its first attempt went (a host that
/// got the 0220 is the one that may have booked it). Each is delivered at
/// its second attempt, and each host saw both messages of the advices it
/// got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_repeat_of_an_advice_goes_to_the_node_of_its_first_attempt() {
    within(Duration::from_secs(90), async {
        let addrs = [free_addr(), free_addr()];
        let mut hosts = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            let id = format!("0{}", i + 1);
            hosts.push(node("cup-pos", &id, *a, "0ms", &["--ignore-advices", "1"]).await);
        }
        let listen = free_addr();
        let data = data_dir("affinity-switch");
        let _switch = switch(
            "affinity-switch",
            &advices_toml(listen, &addrs),
            &data,
            listen,
        )
        .await;
        let mut s = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        for i in 0..20u32 {
            let (advice, _) = terminal_message("0220", &format!("{:06}", 700 + i));
            let acked = ask(&mut s, &advice, Duration::from_secs(5)).await;
            assert_eq!(acked, Some(("0230".into(), "00".into())));
        }
        let rows = store_settles(&data, Duration::from_millis(500), |rows| {
            rows.len() == 20 && rows.iter().all(|r| r.state == "delivered")
        })
        .await;
        for row in &rows {
            assert_eq!(row.attempts, 2, "one ignored, one answered: {row:?}");
            assert_eq!(
                row.direction, "to_node",
                "pinned at its first attempt: {row:?}"
            );
        }
        let mut distinct = 0;
        for host in hosts {
            let r = books(host).await;
            eprintln!("host: {r}");
            let advices = sub(&r, "advices", "distinct");
            assert_eq!(sub(&r, "advices", "repeats"), advices, "{r}");
            assert_eq!(sub(&r, "advices", "received"), advices, "{r}");
            distinct += advices;
        }
        assert_eq!(distinct, 20);
    })
    .await;
}

/// The hosts answer 10% of the purchases 1 s late, with a decline (F39 05).
/// The switch declined each at its 500 ms deadline and stored a timeout
/// reversal, held 2 s before its first attempt: the late decline cancels
/// it, so no reversal reaches a host, and the store records each as
/// dropped with the host's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_decline_cancels_its_timeout_reversal_before_it_is_sent() {
    within(Duration::from_secs(90), async {
        let addrs = [free_addr(), free_addr()];
        let mut hosts = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            let extra = ["--late-share", "0.1", "--late-by", "1s", "--late-declines"];
            hosts.push(node("cup-pos", &format!("0{}", i + 1), *a, "2..20ms", &extra).await);
        }
        let listen = free_addr();
        let data = data_dir("late-decline-switch");
        let toml = pos_toml(listen, &addrs, "500ms", "");
        let _switch = switch("late-decline-switch", &toml, &data, listen).await;
        let report = nac("late-decline-nac", listen, 100, ("3s", "5s"), &[])
            .report()
            .await;
        assert_exactly_once(&report);
        // Every late decline came within the NAC's drain: what the store
        // owes has settled once nothing is pending.
        let rows = store_settles(&data, Duration::from_millis(1000), |rows| {
            !rows.is_empty() && rows.iter().all(|r| r.state != "pending")
        })
        .await;
        let mut declined_late = 0;
        let mut books_of = Vec::new();
        for host in hosts {
            let r = books(host).await;
            eprintln!("host: {r}");
            declined_late += r["declined_late"].as_u64().expect("declined_late");
            books_of.push(r);
        }
        assert_eq!(
            rows.len() as u64,
            declined_late,
            "one timeout reversal each: {rows:?}"
        );
        for row in &rows {
            assert_eq!(
                (row.kind.as_str(), row.state.as_str()),
                ("reversal", "dropped"),
                "{row:?}"
            );
            let reason = row.reason.as_deref().unwrap_or_default();
            assert!(
                reason.contains("cancelled") && reason.contains("F39 05"),
                "{row:?}"
            );
            assert_eq!(row.attempts, 0, "never sent: {row:?}");
        }
        for r in &books_of {
            assert_eq!(
                sub(r, "reversals", "received"),
                0,
                "no reversal reached a host: {r}"
            );
        }
    })
    .await;
}
