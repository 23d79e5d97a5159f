//! End-to-end: bad input and faults never cost a good request. Real sockets on
//! 127.0.0.1, simulated nodes, the switch in-process.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use isoswitch::iso8583::{Message, Spec, Value, samples};
use isoswitch::link::Service;
use isoswitch::sim::nac::{self, NacSimConfig};
use isoswitch::sim::node::Delay;

/// Every test here ends within this, whatever happens.
const TEST_LIMIT: Duration = Duration::from_secs(60);

async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(TEST_LIMIT, f)
        .await
        .expect("test finished in time");
}

/// A POS 0200 with STAN `stan` and terminal ID `TID{stan}`.
fn pos_request(spec: &Spec, stan: u32) -> Vec<u8> {
    let mut d = samples::purchase(spec);
    d.set_text(11, format!("{stan:06}"));
    d.set_text(41, format!("T{stan:07}"));
    spec.encode(&d).expect("encodes")
}

/// The ways a request can be broken after its key fields.
#[derive(Clone, Copy, Debug)]
enum Poison {
    /// F55's length runs past the end of the message.
    F55PastTheEnd,
    /// Bytes after the last field.
    TrailingBytes,
    /// A bitmap bit for a field that is not there (F62 between F60 and F64).
    MissingField,
}

const POISONS: [Poison; 3] = [
    Poison::F55PastTheEnd,
    Poison::TrailingBytes,
    Poison::MissingField,
];

fn poison(spec: &Spec, stan: u32, kind: Poison) -> Vec<u8> {
    let mut bytes = pos_request(spec, stan);
    let msg = Message::parse(spec, Bytes::from(bytes.clone())).unwrap();
    match kind {
        Poison::F55PastTheEnd => {
            let at = msg.field(55).unwrap().unwrap().prefix_at();
            // LLL as two BCD bytes: 0999.
            bytes[at] = 0x09;
            bytes[at + 1] = 0x99;
        }
        Poison::TrailingBytes => bytes.extend_from_slice(b"JUNK"),
        Poison::MissingField => {
            // Bit 62 is in byte 7 of the primary bitmap (bits 57..64), mask 0x04.
            let bitmap_at = msg.layout().bitmap_at;
            bytes[bitmap_at + 7] |= 0x04;
        }
    }
    let whole = Message::parse(spec, Bytes::from(bytes.clone()))
        .and_then(|m| m.index(&isoswitch::iso8583::Bitmap::default()));
    assert!(whole.is_err(), "{kind:?} is really broken");
    bytes
}

fn text(spec: &Spec, payload: &Bytes, id: u16) -> Option<String> {
    let d = spec.decode(payload).ok()?;
    match d.get(id)? {
        Value::Text(t) => Some(t.clone()),
        Value::Binary(_) => None,
    }
}

fn nodes_received(nodes: &[isoswitch::sim::node::NodeSim]) -> (u64, u64) {
    let requests = nodes
        .iter()
        .map(|n| n.stats.requests.load(Ordering::Relaxed))
        .sum();
    let bad = nodes
        .iter()
        .map(|n| n.stats.bad.load(Ordering::Relaxed))
        .sum();
    (requests, bad)
}

fn all_eligible(svc: &Service) -> bool {
    let now = Instant::now();
    (0..svc.view().pool.nodes().len()).all(|i| svc.view().pool.eligible(i, now))
}

/// The scenario: 30 broken requests from one terminal while a NAC runs
/// at 100 req/s. Before ingress validation they were forwarded, never
/// answered, and their timeouts ejected every healthy node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_declined_never_forwarded_and_costs_no_good_request() {
    bounded(async {
        let spec = spec("cup-pos");
        // No echo checks, so that the nodes' request counts are the NAC's.
        let back = "[service.back.health]\ncheck = \"none\"\nejection_threshold = 2";
        let (nodes, switch) = Rig::on("cup-pos").nodes(3).back(back).start().await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;

        let nac = {
            let spec = spec.clone();
            let target = front(&switch);
            tokio::spawn(nac::run(
                spec,
                NacSimConfig {
                    target,
                    nac_id: 1,
                    uplinks: 2,
                    terminals: 50,
                    rate: Some(100.0),
                    duration: Duration::from_secs(3),
                    timeout: Duration::from_secs(3),
                },
            ))
        };

        let mut bad = RawClient::connect(front(&switch), &spec).await;
        for i in 0..30u32 {
            let stan = 900_000 + i;
            let kind = POISONS[i as usize % POISONS.len()];
            bad.send_raw(&RawClient::frame(&spec, &poison(&spec, stan, kind)))
                .await;
            let answer = bad.recv().await.expect("every poison request is answered");
            let msg = Message::parse(&spec, answer.clone()).expect("the decline parses");
            assert_eq!(msg.mti().as_str(), "0210", "{kind:?}");
            assert_eq!(text(&spec, &answer, 39).as_deref(), Some("30"), "{kind:?}");
            assert_eq!(
                text(&spec, &answer, 11),
                Some(format!("{stan:06}")),
                "{kind:?}: the decline echoes the STAN"
            );
            assert_eq!(
                text(&spec, &answer, 41),
                Some(format!("T{stan:07}")),
                "{kind:?}: and the terminal"
            );
            // Pacing, not a wait: the poison spread over the NAC's run.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let report = nac.await.unwrap().unwrap();
        assert!(report.sent > 100, "{report}");
        assert_eq!(report.answered, report.sent, "{report}");
        assert_eq!(report.declined, 0, "{report}");
        assert_eq!(report.unanswered, 0, "{report}");
        let (received, unparsable) = nodes_received(&nodes);
        assert_eq!(unparsable, 0, "no poison reached a node");
        assert_eq!(
            received, report.sent,
            "the nodes saw only the NAC's requests"
        );
        assert_eq!(svc.view().counters.bad_messages.load(Ordering::Relaxed), 30);
        assert_eq!(svc.view().counters.bad_declined.load(Ordering::Relaxed), 30);
        assert!(all_eligible(&svc), "no healthy node was ejected");
        switch.stop().await;
    })
    .await;
}

/// `close` means close for every bad request, including a well-formed
/// response a client has no business sending and garbage that parses as an
/// MTI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_policy_closes_on_every_bad_request() {
    bounded(async {
        let spec = spec("cup-pos");
        let front_extra = "on_bad_message = \"close\"";
        let (_nodes, switch) = Rig::on("cup-pos").front(front_extra).start().await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;

        let mut response = samples::purchase(&spec);
        response.mti = isoswitch::iso8583::Mti::new(*b"0210").unwrap();
        let response = spec.encode(&response).unwrap();
        // TPDU, POS header, then a "BCD MTI" 0x02 0x00 and a bitmap of zeros.
        let garbage =
            b"\x60\x00\x03\x00\x00\x60\x31\x00\x31\x07\x30\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00";
        for bytes in [
            response.as_slice(),
            garbage.as_slice(),
            &poison(&spec, 1, Poison::TrailingBytes),
        ] {
            let mut c = RawClient::connect(front(&switch), &spec).await;
            c.send_raw(&RawClient::frame(&spec, bytes)).await;
            assert!(c.closed_by_peer().await, "closed");
        }
        assert_eq!(svc.view().counters.bad_closed.load(Ordering::Relaxed), 3);
        switch.stop().await;
    })
    .await;
}

/// `drop` keeps the link and answers nothing to the bad request; the next
/// good request on the same link is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_policy_keeps_the_link() {
    bounded(async {
        let spec = spec("cup-pos");
        let front_extra = "on_bad_message = \"drop\"";
        let back = "[service.back.health]\ncheck = \"none\"";
        let (nodes, switch) = Rig::on("cup-pos")
            .front(front_extra)
            .back(back)
            .start()
            .await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let mut c = RawClient::connect(front(&switch), &spec).await;
        c.send_raw(&RawClient::frame(
            &spec,
            &poison(&spec, 7, Poison::F55PastTheEnd),
        ))
        .await;
        c.send_raw(&RawClient::frame(&spec, &pos_request(&spec, 8)))
            .await;
        let answer = c.recv().await.expect("the good request is answered");
        assert_eq!(text(&spec, &answer, 11).as_deref(), Some("000008"));
        assert_eq!(text(&spec, &answer, 39).as_deref(), Some("00"));
        assert_eq!(svc.view().counters.bad_dropped.load(Ordering::Relaxed), 1);
        assert_eq!(nodes_received(&nodes), (1, 0));
        switch.stop().await;
    })
    .await;
}

/// `accept_mti` limits the request classes routed: others get the
/// format-error decline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_outside_accept_mti_are_declined() {
    bounded(async {
        let spec = spec("cup-pos");
        let service_extra = "accept_mti = [\"02x0\"]";
        let back = "[service.back.health]\ncheck = \"none\"";
        let (nodes, switch) = Rig::on("cup-pos")
            .service(service_extra)
            .back(back)
            .start()
            .await;
        wait_connected(service(&switch), 2).await;
        let mut c = RawClient::connect(front(&switch), &spec).await;
        let mut auth = samples::purchase(&spec);
        auth.mti = isoswitch::iso8583::Mti::new(*b"0100").unwrap();
        c.send_raw(&RawClient::frame(&spec, &spec.encode(&auth).unwrap()))
            .await;
        let answer = c.recv().await.expect("answered");
        let msg = Message::parse(&spec, answer.clone()).unwrap();
        assert_eq!(msg.mti().as_str(), "0110");
        assert_eq!(text(&spec, &answer, 39).as_deref(), Some("30"));
        c.send_raw(&RawClient::frame(&spec, &pos_request(&spec, 9)))
            .await;
        let answer = c.recv().await.expect("answered");
        assert_eq!(text(&spec, &answer, 39).as_deref(), Some("00"));
        assert_eq!(nodes_received(&nodes).0, 1);
        switch.stop().await;
    })
    .await;
}

/// Nodes that answer echoes as slowly as transactions fail every active
/// check at once: in panic mode the pool keeps routing to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_mode_routes_when_every_check_fails() {
    for panic_mode in [true, false] {
        bounded(async {
            let spec = spec("cup-pos");
            let back = format!(
                "[service.back.health]\ncheck = \"echo\"\ninterval = \"50ms\"\ntimeout = \"20ms\"\nfall = 1\npanic_mode = {panic_mode}"
            );
            let (_nodes, switch) = Rig::on("cup-pos").nodes(2).delay("100ms").back(&back).start().await;
            let svc = service(&switch).clone();
            wait_connected(&svc, 2).await;
            wait_until("every check failed", || !(0..2).any(|i| svc.view().pool.eligible(i, Instant::now()))).await;
            let mut c = RawClient::connect(front(&switch), &spec).await;
            c.send_raw(&RawClient::frame(&spec, &pos_request(&spec, 1)))
                .await;
            let answer = c.recv().await.expect("answered");
            let want = if panic_mode { "00" } else { "91" };
            assert_eq!(text(&spec, &answer, 39).as_deref(), Some(want), "panic_mode = {panic_mode}");
            assert_eq!(svc.view().pool.panic_picks() > 0, panic_mode);
            switch.stop().await;
        })
        .await;
    }
}

/// One client cannot take every in-flight slot: past its share its requests
/// are declined at once, and another client is served as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_take_every_slot() {
    bounded(async {
        let spec = spec("cup-pos");
        let front_extra = "max_in_flight_per_connection = 10\nmax_in_flight_per_source = 15";
        let (_nodes, switch) = Rig::on("cup-pos")
            .nodes(2)
            .delay("300ms")
            .front(front_extra)
            .start()
            .await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let mut greedy = RawClient::connect(front(&switch), &spec).await;
        for stan in 1..=50 {
            greedy
                .send_raw(&RawClient::frame(&spec, &pos_request(&spec, stan)))
                .await;
        }
        let mut codes = std::collections::BTreeMap::<String, u32>::new();
        for _ in 0..50 {
            let answer = greedy.recv().await.expect("answered");
            *codes
                .entry(text(&spec, &answer, 39).unwrap_or_default())
                .or_default() += 1;
        }
        assert_eq!(codes.get("00"), Some(&10), "{codes:?}");
        assert_eq!(codes.get("96"), Some(&40), "{codes:?}");
        assert_eq!(svc.view().counters.over_share.load(Ordering::Relaxed), 40);

        // Same source, two connections: 15 together.
        let mut a = RawClient::connect(front(&switch), &spec).await;
        let mut b = RawClient::connect(front(&switch), &spec).await;
        for stan in 100..110 {
            a.send_raw(&RawClient::frame(&spec, &pos_request(&spec, stan)))
                .await;
        }
        wait_until("a's ten in flight", || svc.in_flight() == 10).await;
        for stan in 200..210 {
            b.send_raw(&RawClient::frame(&spec, &pos_request(&spec, stan)))
                .await;
        }
        let mut b_ok = 0;
        for _ in 0..10 {
            let answer = b.recv().await.expect("answered");
            b_ok += u32::from(text(&spec, &answer, 39).as_deref() == Some("00"));
        }
        assert_eq!(b_ok, 5, "the source's share is 15, a holds 10");
        for _ in 0..10 {
            let answer = a.recv().await.expect("answered");
            assert_eq!(text(&spec, &answer, 39).as_deref(), Some("00"));
        }
        switch.stop().await;
    })
    .await;
}

/// A client that closes its sending side still gets every answer in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_client_gets_its_answers() {
    bounded(async {
        use tokio::io::AsyncWriteExt;
        let spec = spec("cup-pos");
        let (_nodes, switch) = Rig::on("cup-pos").delay("500ms").start().await;
        wait_connected(service(&switch), 2).await;
        let mut c = RawClient::connect(front(&switch), &spec).await;
        for stan in 1..=3 {
            c.send_raw(&RawClient::frame(&spec, &pos_request(&spec, stan)))
                .await;
        }
        c.stream.shutdown().await.expect("half close");
        let mut stans = Vec::new();
        for _ in 0..3 {
            let answer = c.recv().await.expect("answered after half close");
            assert_eq!(text(&spec, &answer, 39).as_deref(), Some("00"));
            stans.push(text(&spec, &answer, 11).unwrap_or_default());
        }
        stans.sort();
        assert_eq!(stans, ["000001", "000002", "000003"]);
        assert!(c.closed_by_peer().await, "then the switch closes");
        switch.stop().await;
    })
    .await;
}

/// An IPv4 client of a dual-stack (`[::]`) listener arrives v4-mapped and
/// must match IPv4 allow rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_listener_admits_ipv4_clients_by_ipv4_rules() {
    bounded(async {
        let spec = spec("cup-pos");
        let nodes = start_nodes(&spec, 1, Delay::NONE).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let mut cfg = Rig::on("cup-pos")
            .front("allow = [\"127.0.0.0/8\"]")
            .config(&addrs);
        if let isoswitch::config::FrontConfig::Listen(l) = &mut cfg.services[0].front {
            l.listen = "[::]:0".parse().unwrap();
        }
        let switch = start_switch(&cfg).await;
        wait_connected(service(&switch), 2).await;
        let port = front(&switch).port();
        let mut c = RawClient::connect(format!("127.0.0.1:{port}").parse().unwrap(), &spec).await;
        c.send_raw(&RawClient::frame(&spec, &pos_request(&spec, 5)))
            .await;
        let answer = c.recv().await.expect("admitted and answered");
        assert_eq!(text(&spec, &answer, 39).as_deref(), Some("00"));
        switch.stop().await;
    })
    .await;
}

/// A client that resets its connection mid-frame is a disconnect, not a bad
/// frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_a_disconnect_not_a_bad_frame() {
    bounded(async {
        let spec = spec("cup-pos");
        let (_nodes, switch) = Rig::on("cup-pos").start().await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let mut c = RawClient::connect(front(&switch), &spec).await;
        let frame = RawClient::frame(&spec, &pos_request(&spec, 1));
        c.send_raw(&frame[..10]).await;
        // Linger 0 makes the close an RST. (Deprecated because a non-zero
        // linger blocks the thread on drop; zero does not.)
        #[allow(deprecated)]
        c.stream.set_linger(Some(Duration::ZERO)).expect("linger 0");
        drop(c);
        wait_until("client gone", || {
            svc.view().counters.clients_closed.load(Ordering::Relaxed) == 1
        })
        .await;
        assert_eq!(svc.view().counters.bad_frames.load(Ordering::Relaxed), 0);
        switch.stop().await;
    })
    .await;
}

/// A client that keeps exactly its share in flight (it sends its next
/// request as each answer arrives) is never declined: its place is given
/// back before it can read the answer, not after the switch has finished
/// journaling and counting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_at_its_share_is_never_declined() {
    bounded(async {
        let spec = spec("cup-pos");
        let front_extra = "max_in_flight_per_connection = 4\nmax_in_flight_per_source = 4";
        let (_nodes, switch) = Rig::on("cup-pos").nodes(2).front(front_extra).start().await;
        let svc = service(&switch).clone();
        wait_connected(&svc, 2).await;
        let mut client = RawClient::connect(front(&switch), &spec).await;
        let (share, total) = (4u32, 2000u32);
        for stan in 1..=share {
            client
                .send_raw(&RawClient::frame(&spec, &pos_request(&spec, stan)))
                .await;
        }
        let mut codes = std::collections::BTreeMap::<String, u32>::new();
        for next in share + 1..=total + share {
            let answer = client.recv().await.expect("answered");
            *codes
                .entry(text(&spec, &answer, 39).unwrap_or_default())
                .or_default() += 1;
            if next <= total {
                client
                    .send_raw(&RawClient::frame(&spec, &pos_request(&spec, next)))
                    .await;
            }
        }
        assert_eq!(codes.get("00"), Some(&total), "{codes:?}");
        assert_eq!(svc.view().counters.over_share.load(Ordering::Relaxed), 0);
        switch.stop().await;
    })
    .await;
}
