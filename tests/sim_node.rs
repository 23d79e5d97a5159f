//! The channel node simulator as a financial switch's oracle, over real
//! sockets, with the switch played by hand: late approvals and their
//! reversals per chain, ignored reversals, advices and their repeats, key
//! exchange, the node's own key requests, and repeated requests.
//!
//! The reversals here are built by the test, F90 written out digit by digit
//! (MTI, F11, F7, F32 and F33 in 11 digits each), not with the simulators'
//! own F90 code: the two must agree.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use isoswitch::iso8583::{Decoded, Message, Mti, Spec, samples};
use isoswitch::sim::ledger::LateApprovals;
use isoswitch::sim::node::{Finance, KeyRequests, NodeOptions, NodeSim, NodeSimConfig};
use isoswitch::wire::{Frame, FrameCodec};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::codec::FramedRead;

const WAIT: Duration = Duration::from_secs(5);

fn spec(name: &str) -> Arc<Spec> {
    Arc::new(Spec::builtin(name).expect("builtin spec"))
}

async fn node(spec: &Arc<Spec>, finance: Finance) -> NodeSim {
    NodeSim::start_financial(
        "127.0.0.1:0".parse().unwrap(),
        Arc::clone(spec),
        NodeSimConfig::new("01"),
        NodeOptions::default(),
        finance,
    )
    .await
    .expect("node starts")
}

/// One connection to the node, as the switch holds it.
struct Conn {
    spec: Arc<Spec>,
    read: FramedRead<OwnedReadHalf, FrameCodec>,
    write: OwnedWriteHalf,
}

impl Conn {
    async fn open(node: &NodeSim, spec: &Arc<Spec>) -> Conn {
        let (read, write) = TcpStream::connect(node.addr).await.unwrap().into_split();
        let f = spec.framing();
        Conn {
            spec: Arc::clone(spec),
            read: FramedRead::new(read, FrameCodec::new(f.prefix, f.max_frame)),
            write,
        }
    }

    async fn send(&mut self, d: &Decoded) {
        let payload = self.spec.encode(d).unwrap();
        let mut frame = BytesMut::new();
        self.spec
            .framing()
            .prefix
            .encode(payload.len(), &mut frame)
            .unwrap();
        frame.extend_from_slice(&payload);
        self.write.write_all(&frame).await.unwrap();
    }

    /// The next message the node writes.
    async fn next(&mut self) -> Bytes {
        loop {
            let frame = tokio::time::timeout(WAIT, self.read.next())
                .await
                .expect("a message in time")
                .expect("the connection is open")
                .expect("a frame");
            if let Frame::Message(p) = frame {
                return p;
            }
        }
    }
}

fn text(msg: &Message<'_>, id: u16) -> String {
    let f = msg.field(id).unwrap();
    let f = f.unwrap_or_else(|| panic!("F{id} present"));
    String::from_utf8(f.logical().collect()).unwrap()
}

fn mti(s: &str) -> Mti {
    s.parse().unwrap()
}

/// The sample purchase with `stan` (and terminal `f41`).
fn purchase(spec: &Spec, stan: &str, f41: &str) -> Decoded {
    let mut d = samples::purchase(spec);
    d.set_text(11, stan);
    d.set_text(41, f41);
    d
}

/// A reversal (`0420`, or `0421` when `repeat`) of `original` as the switch
/// sends it: the original's identifying fields, F39 a reason code, and F90.
fn reversal(spec: &Spec, original: &Decoded, repeat: bool) -> Decoded {
    let mut r = original.clone();
    r.retain(|id| [2, 3, 4, 7, 11, 12, 13, 32, 33, 37, 41, 42, 49].contains(&id));
    r.mti = mti(if repeat { "0421" } else { "0420" });
    let get = |id: u16| {
        original
            .get(id)
            .and_then(|v| v.as_text())
            .unwrap_or("")
            .to_string()
    };
    let f90 = format!(
        "{}{:0>6}{:0>10}{:0>11}{:0>11}",
        original.mti,
        get(11),
        get(7),
        get(32),
        get(33)
    );
    assert_eq!(f90.len(), 42);
    r.set_text(39, "68");
    if spec.field(90).is_some() {
        r.set_text(90, f90);
    }
    r
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// POS terminals number their STANs on their own: two terminals' purchases
/// with one STAN, both approved late; the switch reverses one terminal's.
/// The late answer comes after an echo sent later (it waited out
/// `late_by`); the reversal chain (0420, then two 0421) is answered 0430
/// each time and counted once, against the late approval; the other
/// terminal's late approval is never reversed.
#[tokio::test]
async fn late_approvals_are_recorded_and_their_reversals_counted_per_chain() {
    let spec = spec("cup-pos");
    let late = LateApprovals {
        share: 1.0,
        by: Duration::from_millis(300),
    };
    let finance = Finance {
        late: Some(late),
        ..Finance::default()
    };
    let node = node(&spec, finance).await;
    let mut conn = Conn::open(&node, &spec).await;
    let a = purchase(&spec, "000101", "TERM0001");
    let b = purchase(&spec, "000101", "TERM0002");
    conn.send(&a).await;
    conn.send(&b).await;
    // A sign-in is no approval: answered at once, ahead of the late two.
    let mut sign_in = samples::echo(&spec);
    sign_in.set_text(11, "000102");
    sign_in.set_text(41, "TERM0001");
    conn.send(&sign_in).await;
    let first = conn.next().await;
    let first = Message::parse(&spec, first).unwrap();
    assert_eq!(
        first.mti().as_str(),
        "0810",
        "the sign-in's answer came first"
    );
    for _ in 0..2 {
        let late = conn.next().await;
        let late = Message::parse(&spec, late).unwrap();
        assert_eq!(
            (late.mti().as_str(), text(&late, 39)),
            ("0210", "00".into())
        );
    }
    let book = &node.stats.reversals;
    assert_eq!(book.report().late_approvals, 2);

    conn.send(&reversal(&spec, &a, false)).await;
    conn.send(&reversal(&spec, &a, true)).await;
    conn.send(&reversal(&spec, &a, true)).await;
    for _ in 0..3 {
        let answer = conn.next().await;
        let answer = Message::parse(&spec, answer).unwrap();
        assert_eq!(answer.mti().as_str(), "0430");
        assert_eq!(text(&answer, 39), "00");
        assert_eq!(text(&answer, 41), "TERM0001");
        assert_eq!(text(&answer, 90).len(), 42, "F90 echoed");
    }
    let r = book.report();
    assert_eq!((r.received, r.repeats, r.answered), (1, 2, 3), "{r:?}");
    assert_eq!(
        (r.chains, r.chains_late, r.chains_not_late),
        (1, 1, 0),
        "{r:?}"
    );
    assert_eq!(r.duplicate_chains, 0);
    assert_eq!(r.late_never_reversed, 1, "terminal 2's approval: {r:?}");
    node.stop().await;
}

/// A reversal of an approval answered in time, and of one never seen, are
/// counted as reversals of something not approved late; a second 0420 for
/// an original already reversed is a duplicate chain; a reversal whose F90
/// names nothing is answered F39 30.
#[tokio::test]
async fn reversals_of_what_was_not_approved_late_are_told_apart() {
    let spec = spec("cups");
    let node = node(&spec, Finance::default()).await;
    let mut conn = Conn::open(&node, &spec).await;
    let in_time = purchase(&spec, "000201", "12345678");
    conn.send(&in_time).await;
    let answer = conn.next().await;
    assert_eq!(
        Message::parse(&spec, answer).unwrap().mti().as_str(),
        "0210"
    );
    let unknown = purchase(&spec, "000202", "12345678");
    conn.send(&reversal(&spec, &in_time, false)).await;
    conn.send(&reversal(&spec, &unknown, false)).await;
    conn.send(&reversal(&spec, &in_time, false)).await;
    let mut bad = reversal(&spec, &unknown, false);
    bad.set_text(
        90,
        "0200 is not the rest of F90 ".repeat(2)[..42].to_string(),
    );
    conn.send(&bad).await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = conn.next().await;
        codes.push(text(&Message::parse(&spec, answer).unwrap(), 39));
    }
    assert_eq!(codes, ["00", "00", "00", "30"]);
    let r = node.stats.reversals.report();
    assert_eq!(
        (r.chains, r.chains_late, r.chains_not_late),
        (2, 0, 2),
        "{r:?}"
    );
    assert_eq!((r.duplicate_chains, r.unreadable), (1, 1), "{r:?}");
    assert_eq!((r.late_approvals, r.late_never_reversed), (0, 0));
    node.stop().await;
}

/// `ignore_reversals` 2: the 0420 and the first 0421 of a chain go
/// unanswered, the second 0421 is answered, and so is the next chain's
/// third message only. The answers that come are exactly those, in order.
#[tokio::test]
async fn ignored_reversals_make_the_switch_repeat() {
    let spec = spec("cups");
    let finance = Finance {
        ignore_reversals: 2,
        ..Finance::default()
    };
    let node = node(&spec, finance).await;
    let mut conn = Conn::open(&node, &spec).await;
    let original = purchase(&spec, "000301", "12345678");
    conn.send(&reversal(&spec, &original, false)).await;
    conn.send(&reversal(&spec, &original, true)).await;
    conn.send(&reversal(&spec, &original, true)).await;
    let mut echo = samples::echo(&spec);
    echo.set_text(11, "000399");
    conn.send(&echo).await;
    let answers: Vec<String> = {
        let mut out = Vec::new();
        for _ in 0..2 {
            let answer = conn.next().await;
            out.push(Message::parse(&spec, answer).unwrap().mti().to_string());
        }
        out
    };
    assert_eq!(
        answers,
        ["0430", "0830"],
        "one 0430, then the echo's answer"
    );
    let r = node.stats.reversals.report();
    assert_eq!(
        (r.received, r.repeats, r.ignored, r.answered),
        (1, 2, 2, 1),
        "{r:?}"
    );
    assert_eq!(r.chains, 1);
    node.stop().await;
}

/// Advices are acknowledged (0220 → 0230, 0221 → 0230); a repeat of one
/// already acknowledged is a duplicate, counted, not refused.
#[tokio::test]
async fn advices_are_acknowledged_and_repeats_counted() {
    let spec = spec("cups");
    let node = node(&spec, Finance::default()).await;
    let mut conn = Conn::open(&node, &spec).await;
    let mut a = purchase(&spec, "000401", "12345678");
    a.mti = mti("0220");
    let mut a_again = a.clone();
    a_again.mti = mti("0221");
    let mut b = purchase(&spec, "000402", "12345678");
    b.mti = mti("0121");
    for d in [&a, &a_again, &b] {
        conn.send(d).await;
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        let answer = conn.next().await;
        let answer = Message::parse(&spec, answer).unwrap();
        got.push((answer.mti().to_string(), text(&answer, 11)));
    }
    assert_eq!(
        got,
        [
            ("0230".to_string(), "000401".to_string()),
            ("0230".into(), "000401".into()),
            ("0130".into(), "000402".into()),
        ]
    );
    let r = node.stats.advices.report();
    assert_eq!((r.received, r.repeats, r.duplicates), (1, 2, 1), "{r:?}");
    assert_eq!((r.distinct, r.answered), (2, 3), "{r:?}");
    assert_eq!(load(&node.stats.requests), 0, "advices are not requests");
    node.stop().await;
}

/// Key exchange reaches the node as network management: answered 0830 /
/// 0810 F39 00 with F70 echoed, key resets (F70 1xx) counted by value, an
/// echo test not among them.
#[tokio::test]
async fn key_exchange_is_answered_and_counted_by_f70() {
    let spec = spec("iso87ascii");
    let node = node(&spec, Finance::default()).await;
    let mut conn = Conn::open(&node, &spec).await;
    for (stan, m, f70) in [
        ("000501", "0820", "101"),
        ("000502", "0800", "161"),
        ("000503", "0820", "101"),
        ("000504", "0800", "301"),
    ] {
        let mut d = samples::echo(&spec);
        d.mti = mti(m);
        d.set_text(11, stan);
        d.set_text(70, f70);
        conn.send(&d).await;
        let answer = conn.next().await;
        let answer = Message::parse(&spec, answer).unwrap();
        let want = if m == "0820" { "0830" } else { "0810" };
        assert_eq!(answer.mti().as_str(), want);
        assert_eq!(
            (text(&answer, 39), text(&answer, 70)),
            ("00".into(), f70.into())
        );
    }
    let resets = node.stats.key_resets.snapshot();
    assert_eq!(
        resets.into_iter().collect::<Vec<_>>(),
        [("101".to_string(), 2), ("161".to_string(), 1)]
    );
    node.stop().await;
}

/// The node's own key requests: an 0820 F70 101 with F7 and F11, no F37,
/// on its connections in turn. An 0830 on another connection is matched by
/// F11 + F7; one with the right F11 and another F7 is foreign; a request
/// never answered counts as unanswered after the timeout.
#[tokio::test]
async fn key_requests_are_matched_by_f11_and_f7() {
    let spec = spec("cups");
    let finance = Finance {
        key_requests: Some(KeyRequests {
            every: Duration::from_millis(50),
            timeout: Duration::from_secs(1),
            stan_base: 100_000,
        }),
        ..Finance::default()
    };
    let node = node(&spec, finance).await;
    let mut one = Conn::open(&node, &spec).await;
    let mut two = Conn::open(&node, &spec).await;
    eventually("both connections held", || load(&node.stats.held) == 2).await;
    // The first two key requests, one on each connection.
    let (a, b) = tokio::join!(one.next(), two.next());
    node.stop_originating();
    let mut requests = Vec::new();
    for payload in [a, b] {
        let req = Message::parse(&spec, payload).unwrap();
        assert_eq!((req.mti().as_str(), text(&req, 70)), ("0820", "101".into()));
        assert_eq!(text(&req, 7).len(), 10);
        assert!(text(&req, 11).starts_with('1'), "the node's STAN range");
        assert!(!req.has_field(37), "no F37");
        requests.push(req.decode().unwrap());
    }
    let stats = &node.stats;
    // The first answered on the other connection than it came on.
    let mut answer = requests[0].clone();
    answer.mti = mti("0830");
    answer.set_text(39, "00");
    two.send(&answer).await;
    // The second answered with its F11 but another F7: not the node's.
    let mut wrong = requests[1].clone();
    wrong.mti = mti("0830");
    wrong.set_text(39, "00");
    wrong.set_text(7, "0101000000");
    one.send(&wrong).await;
    eventually("both answers read", || {
        load(&stats.key_requests_answered) + load(&stats.foreign_responses) == 2
    })
    .await;
    assert_eq!(load(&stats.key_requests_answered), 1);
    let sent = load(&stats.key_requests_sent);
    eventually("the rest expired", || {
        load(&stats.key_requests_unanswered) == sent - 1
    })
    .await;
    assert_eq!(node.outstanding(), 0);
    node.stop().await;
}

/// Requests with a repeat MTI are counted, and whether the node had
/// answered the original (same F11, F7, F41): a 0201 of an answered 0200
/// is, a 0201 of a STAN never seen is not.
#[tokio::test]
async fn repeats_are_counted_with_whether_the_first_was_answered() {
    let spec = spec("cups");
    let node = node(&spec, Finance::default()).await;
    let mut conn = Conn::open(&node, &spec).await;
    let first = purchase(&spec, "000601", "12345678");
    let mut repeat = first.clone();
    repeat.mti = mti("0201");
    let mut stranger = purchase(&spec, "000602", "12345678");
    stranger.mti = mti("0201");
    for d in [&first, &repeat, &stranger] {
        conn.send(d).await;
        let answer = conn.next().await;
        assert_eq!(
            Message::parse(&spec, answer).unwrap().mti().as_str(),
            "0210"
        );
    }
    let s = &node.stats;
    assert_eq!(load(&s.repeat_requests), 2);
    assert_eq!(load(&s.repeats_of_answered), 1);
    assert_eq!((load(&s.requests), load(&s.answered)), (3, 3));
    node.stop().await;
}

/// The node's `--json` report carries every book.
#[tokio::test]
async fn the_json_report_carries_the_books() {
    let spec = spec("cups");
    let node = node(&spec, Finance::default()).await;
    let json: serde_json::Value =
        serde_json::from_str(&isoswitch::sim::node::summary_json(&node.stats)).unwrap();
    for key in [
        "reversals",
        "advices",
        "key_resets",
        "key_requests",
        "repeat_requests",
        "repeats_of_answered",
    ] {
        assert!(json.get(key).is_some(), "{key} in {json}");
    }
    assert_eq!(json["reversals"]["chains_not_late"], 0);
    node.stop().await;
}

/// The simulators' store-and-forward flags are checked before anything
/// starts: a bad value is refused with the flag named.
#[tokio::test]
async fn bad_store_and_forward_flags_are_refused_by_name() {
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "sim",
                "node",
                "--listen",
                "127.0.0.1:0",
                "--spec",
                "cups",
                "--late-share",
                "1.5",
            ],
            "--late-share",
        ),
        (
            &[
                "sim",
                "node",
                "--listen",
                "127.0.0.1:0",
                "--spec",
                "cups",
                "--key-request-every",
                "0s",
            ],
            "--key-request-every",
        ),
        (
            &[
                "sim",
                "nac",
                "--connect",
                "127.0.0.1:9",
                "--advice-share",
                "1.5",
            ],
            "--advice-share",
        ),
        (
            &[
                "sim",
                "cups",
                "--accept",
                "127.0.0.1:0",
                "--connect",
                "127.0.0.1:9",
                "--advice-mti",
                "0200",
            ],
            "--advice-mti",
        ),
        (
            &[
                "sim",
                "cups",
                "--accept",
                "127.0.0.1:0",
                "--connect",
                "127.0.0.1:9",
                "--late-share",
                "2",
            ],
            "--late-share",
        ),
    ];
    for (args, flag) in cases {
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
            .args(args)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(WAIT, run)
            .await
            .unwrap_or_else(|_| panic!("{args:?} should be refused at once"))
            .expect("the binary runs");
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}
