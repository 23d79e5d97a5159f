//! The UnionPay simulator against a member side played by hand: the test listens
//! for the simulator's in links and connects out links to it, over real sockets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use isoswitch::iso8583::{Decoded, Message, Spec, samples};
use isoswitch::sim::cups::{CUPS_ID, CupsSim, CupsSimConfig, run};
use isoswitch::sim::ledger::LateApprovals;
use isoswitch::sim::node::Delay;
use isoswitch::wire::{CupsHeader, Frame, FrameCodec, Header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

const WAIT: Duration = Duration::from_secs(2);
const MEMBER_ID: &str = "03105840";

fn spec() -> Arc<Spec> {
    Arc::new(Spec::builtin("cups").expect("builtin cups spec"))
}

/// What happens on the member's in-link listener, by in-link index.
#[derive(Debug)]
enum Event {
    Opened(usize),
    Frame(usize, Frame),
    Closed(usize),
}

/// The member side: accepts the simulator's in links and reports what arrives.
struct Member {
    spec: Arc<Spec>,
    addr: SocketAddr,
    events: mpsc::UnboundedReceiver<Event>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl Member {
    async fn start() -> Member {
        let spec = spec();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        let framing = spec.framing();
        let acceptor = tokio::spawn(async move {
            let mut index = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                let i = index;
                index += 1;
                let _ = tx.send(Event::Opened(i));
                tokio::spawn(async move {
                    let mut frames =
                        FramedRead::new(stream, FrameCodec::new(framing.prefix, framing.max_frame));
                    while let Some(Ok(f)) = frames.next().await {
                        if tx.send(Event::Frame(i, f)).is_err() {
                            return;
                        }
                    }
                    let _ = tx.send(Event::Closed(i));
                });
            }
        });
        Member {
            spec,
            addr,
            events,
            acceptor,
        }
    }

    fn config(&self, links: usize) -> CupsSimConfig {
        CupsSimConfig::new("127.0.0.1:0".parse().unwrap(), self.addr, links)
    }

    async fn event(&mut self) -> Event {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("an in-link event in time")
            .expect("the acceptor runs")
    }

    /// Waits for `n` in links to be opened (other events are dropped).
    async fn opened(&mut self, n: usize) {
        let mut seen = 0;
        while seen < n {
            if let Event::Opened(_) = self.event().await {
                seen += 1;
            }
        }
    }

    /// The next message on any in link, skipping keep-alives and link events.
    async fn message(&mut self) -> (usize, Bytes) {
        loop {
            if let Event::Frame(i, Frame::Message(p)) = self.event().await {
                return (i, p);
            }
        }
    }

    /// Answers (F39 00, on `out`) every message arriving until none has for
    /// `quiet`; returns how many of each MTI came.
    async fn answer_until_quiet(
        &mut self,
        out: &mut TcpStream,
        quiet: Duration,
    ) -> std::collections::BTreeMap<String, u64> {
        let mut seen = std::collections::BTreeMap::new();
        while let Ok(Some(ev)) = tokio::time::timeout(quiet, self.events.recv()).await {
            if let Event::Frame(_, Frame::Message(p)) = ev {
                let msg = Message::parse(&self.spec, p).unwrap();
                *seen.entry(msg.mti().to_string()).or_default() += 1;
                send(out, &answer(&msg, "00")).await;
            }
        }
        seen
    }

    /// Messages arriving until none has for `quiet`.
    async fn messages_until_quiet(&mut self, quiet: Duration) -> Vec<Bytes> {
        let mut out = Vec::new();
        while let Ok(Some(ev)) = tokio::time::timeout(quiet, self.events.recv()).await {
            if let Event::Frame(_, Frame::Message(p)) = ev {
                out.push(p);
            }
        }
        out
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn out_link(sim: &CupsSim) -> TcpStream {
    let before = sim
        .stats()
        .out_links_up
        .load(std::sync::atomic::Ordering::Relaxed);
    let s = TcpStream::connect(sim.accept_addr()).await.unwrap();
    eventually("out link accepted", || {
        sim.stats()
            .out_links_up
            .load(std::sync::atomic::Ordering::Relaxed)
            > before
    })
    .await;
    s
}

async fn send(link: &mut TcpStream, payload: &[u8]) {
    let mut frame = format!("{:04}", payload.len()).into_bytes();
    frame.extend_from_slice(payload);
    link.write_all(&frame).await.unwrap();
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn load(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(std::sync::atomic::Ordering::Relaxed)
}

fn cups_header(msg: &Message<'_>) -> CupsHeader {
    match msg.envelope().header {
        Some(Header::Cups(h)) => h,
        other => panic!("expected a CUPS header, got {other:?}"),
    }
}

fn text(msg: &Message<'_>, id: u16) -> String {
    let f = msg
        .field(id)
        .unwrap()
        .unwrap_or_else(|| panic!("F{id} present"));
    String::from_utf8(f.data().to_vec()).unwrap()
}

/// A member 0200 (from the member to UnionPay) with its own STAN and RRN.
fn member_request(spec: &Spec, stan: &str, rrn: &str) -> Vec<u8> {
    let mut d = samples::purchase(spec);
    d.set_text(11, stan);
    d.set_text(37, rrn);
    spec.encode(&d).unwrap()
}

/// A member 0820 with `f70`.
fn member_0820(spec: &Spec, stan: &str, f70: &str) -> Vec<u8> {
    let mut d: Decoded = samples::echo(spec);
    d.set_text(11, stan);
    d.set_text(70, f70);
    spec.encode(&d).unwrap()
}

fn answer(msg: &Message<'_>, code: &str) -> Bytes {
    isoswitch::sim::answer::answer(msg.spec(), msg, code).unwrap()
}

#[tokio::test]
async fn member_requests_answered_on_any_in_link() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let sim = CupsSim::start(spec.clone(), member.config(2))
        .await
        .unwrap();
    member.opened(2).await;
    let mut out1 = out_link(&sim).await;
    let _out2 = out_link(&sim).await;

    let rrns = ["NODE01000001", "NODE01000002"];
    send(&mut out1, &member_request(&spec, "000101", rrns[0])).await;
    let (link_a, a) = member.message().await;
    let a = Message::parse(&spec, a).unwrap();
    send(&mut out1, &member_request(&spec, "000102", rrns[1])).await;
    let (link_b, b) = member.message().await;
    let b = Message::parse(&spec, b).unwrap();

    for (resp, rrn, stan) in [(&a, rrns[0], "000101"), (&b, rrns[1], "000102")] {
        assert_eq!(resp.mti().as_str(), "0210");
        assert_eq!(text(resp, 37), rrn, "F37 comes back unchanged");
        assert_eq!(text(resp, 11), stan);
        assert_eq!(text(resp, 39), "00");
        let h = cups_header(resp);
        assert_eq!(h.destination_id(), MEMBER_ID, "header IDs swapped");
        assert_eq!(h.source_id(), CUPS_ID);
        assert_eq!(h.total_length(), Some(resp.payload().len()));
        for secret in [35, 52, 128] {
            assert!(!resp.has_field(secret), "F{secret} not echoed");
        }
    }
    // Each answer's in link is drawn at random: over 32 more answers both
    // links carry some (all on one would be a 1-in-2-billion chance).
    let mut used = [false; 2];
    used[link_a] = true;
    used[link_b] = true;
    for i in 0..32 {
        let stan = format!("{:06}", 200 + i);
        send(&mut out1, &member_request(&spec, &stan, "NODE01000003")).await;
        let (link, _) = member.message().await;
        used[link] = true;
    }
    assert_eq!(used, [true, true], "answers spread over the in links");
    let report = sim.stop().await;
    assert_eq!(report.member_requests, 34);
    assert_eq!(report.member_requests_answered, 34);
    assert_eq!(report.out_links_accepted, 2);
    assert_eq!(report.in_links_up, 2);
}

#[tokio::test]
async fn member_answers_wait_out_the_delay() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let mut cfg = member.config(1);
    cfg.delay = Delay::parse("150ms").unwrap();
    let sim = CupsSim::start(spec.clone(), cfg).await.unwrap();
    member.opened(1).await;
    let mut out = out_link(&sim).await;
    let sent = Instant::now();
    send(&mut out, &member_request(&spec, "000201", "NODE02000001")).await;
    let (_, resp) = member.message().await;
    let resp = Message::parse(&spec, resp).unwrap();
    assert!(sent.elapsed() >= Duration::from_millis(140));
    assert_eq!(text(&resp, 37), "NODE02000001");
    sim.stop().await;
}

#[tokio::test]
async fn member_0820s_get_0830s_on_an_in_link() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let sim = CupsSim::start(spec.clone(), member.config(2))
        .await
        .unwrap();
    member.opened(2).await;
    let mut out = out_link(&sim).await;
    for (stan, f70) in [("000301", "001"), ("000302", "301"), ("000303", "002")] {
        send(&mut out, &member_0820(&spec, stan, f70)).await;
        let (_, resp) = member.message().await;
        let resp = Message::parse(&spec, resp).unwrap();
        assert_eq!(resp.mti().as_str(), "0830");
        assert_eq!(text(&resp, 11), stan);
        assert_eq!(text(&resp, 70), f70);
        assert_eq!(text(&resp, 39), "00");
        assert_eq!(cups_header(&resp).source_id(), CUPS_ID);
    }
    assert_eq!(load(&sim.stats().network_answered), 3);
    sim.stop().await;
}

#[tokio::test]
async fn the_switchs_0830_to_an_echo_is_counted() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let sim = CupsSim::start(spec.clone(), member.config(1))
        .await
        .unwrap();
    member.opened(1).await;
    let mut out = out_link(&sim).await;
    assert!(sim.send_echo());
    let (_, echo) = member.message().await;
    let echo = Message::parse(&spec, echo).unwrap();
    assert_eq!(echo.mti().as_str(), "0820");
    assert_eq!(text(&echo, 70), "301");
    assert_eq!(cups_header(&echo).destination_id(), MEMBER_ID);
    // The switch answers UnionPay's echo itself, on an out link.
    let spec = &spec;
    let resp = spec.respond(&echo.decode().unwrap(), "00").unwrap();
    send(&mut out, &spec.encode(&resp).unwrap()).await;
    eventually("echo answered", || load(&sim.stats().echo_answered) == 1).await;
    let report = sim.stop().await;
    assert_eq!((report.echo_sent, report.echo_answered), (1, 1));
    assert_eq!(report.mismatched, 0);
}

#[tokio::test]
async fn issuer_requests_matched_declined_and_doubled() {
    let mut member = Member::start().await;
    let mut cfg = member.config(2);
    cfg.rate = Some(25.0);
    cfg.duration = Duration::from_millis(400);
    let sim = CupsSim::start(member.spec.clone(), cfg).await.unwrap();
    member.opened(2).await;
    let mut outs = [out_link(&sim).await, out_link(&sim).await];

    let requests = member
        .messages_until_quiet(Duration::from_millis(300))
        .await;
    let n = requests.len();
    assert!(n >= 3, "got {n} issuer requests");
    let spec: &Spec = &member.spec;
    let mut stans = std::collections::HashSet::new();
    for (i, payload) in requests.iter().enumerate() {
        let req = Message::parse(spec, payload.clone()).unwrap();
        assert_eq!(req.mti().as_str(), "0100");
        assert!(stans.insert(text(&req, 11)), "unique F11");
        assert_eq!(text(&req, 37).len(), 12);
        assert_eq!(cups_header(&req).source_id(), CUPS_ID);
        // The first is declined, the rest approved; answers alternate out links.
        let code = if i == 0 { "05" } else { "00" };
        send(&mut outs[i % 2], &answer(&req, code)).await;
    }
    // Answered twice: the second answer matches nothing outstanding.
    let last = Message::parse(spec, requests[n - 1].clone()).unwrap();
    send(&mut outs[0], &answer(&last, "00")).await;
    let stats = sim.stats();
    eventually("every answer counted", || {
        load(&stats.answered) + load(&stats.declined) + load(&stats.mismatched) == n as u64 + 1
    })
    .await;
    let report = sim.stop().await;
    assert_eq!(report.sent, n as u64);
    assert_eq!(report.answered, n as u64 - 1);
    assert_eq!(report.declined, 1);
    assert_eq!(report.mismatched, 1);
    assert_eq!(report.unanswered, 0);
    assert_eq!(report.unsent, 0);
}

#[tokio::test]
async fn unanswered_requests_time_out_and_late_answers_mismatch() {
    let mut member = Member::start().await;
    let mut cfg = member.config(1);
    cfg.rate = Some(20.0);
    cfg.duration = Duration::from_millis(150);
    cfg.timeout = Duration::from_millis(200);
    let sim = CupsSim::start(member.spec.clone(), cfg).await.unwrap();
    member.opened(1).await;
    let mut out = out_link(&sim).await;
    let requests = member
        .messages_until_quiet(Duration::from_millis(300))
        .await;
    assert!(!requests.is_empty());
    let stats = sim.stats();
    eventually("all timed out", || {
        load(&stats.unanswered) == requests.len() as u64
    })
    .await;
    let late = Message::parse(&member.spec, requests[0].clone()).unwrap();
    send(&mut out, &answer(&late, "00")).await;
    eventually("late answer counted", || load(&stats.mismatched) == 1).await;
    let report = sim.stop().await;
    assert_eq!(report.sent, requests.len() as u64);
    assert_eq!(report.answered, 0);
    assert!(
        report
            .to_string()
            .contains(&format!("unanswered {}", requests.len()))
    );
}

#[tokio::test]
async fn keep_alives_on_idle_in_links_and_counted_on_out_links() {
    let mut member = Member::start().await;
    let mut cfg = member.config(2);
    cfg.keepalive_idle = Duration::from_millis(100);
    let sim = CupsSim::start(member.spec.clone(), cfg).await.unwrap();
    let mut kept_alive = [false; 2];
    while !kept_alive.iter().all(|&k| k) {
        if let Event::Frame(i, Frame::KeepAlive) = member.event().await {
            kept_alive[i] = true;
        }
    }
    let mut out = out_link(&sim).await;
    out.write_all(b"00000000").await.unwrap();
    eventually("keep-alives read", || {
        load(&sim.stats().keepalives_received) == 2
    })
    .await;
    assert!(load(&sim.stats().keepalives_sent) >= 2);
    sim.stop().await;
}

#[tokio::test]
async fn closed_in_links_are_reopened_and_out_links_closed_on_demand() {
    let mut member = Member::start().await;
    let sim = CupsSim::start(member.spec.clone(), member.config(2))
        .await
        .unwrap();
    member.opened(2).await;
    assert_eq!(sim.close_in_links(1), 1);
    let (mut closed, mut reopened) = (false, false);
    while !(closed && reopened) {
        match member.event().await {
            Event::Closed(i) => {
                assert!(i < 2);
                closed = true;
            }
            Event::Opened(i) => {
                assert_eq!(i, 2);
                reopened = true;
            }
            Event::Frame(..) => {}
        }
    }
    let stats = sim.stats();
    eventually("two in links up", || load(&stats.in_links_up) == 2).await;
    assert_eq!(load(&stats.in_links_opened), 3);

    let mut out = out_link(&sim).await;
    assert_eq!(sim.close_out_links(5), 1);
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(WAIT, out.read(&mut buf))
        .await
        .unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "the out link is closed");
    eventually("no out link up", || load(&stats.out_links_up) == 0).await;
    sim.stop().await;
}

#[tokio::test]
async fn bad_frames_are_counted_without_harm() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let sim = CupsSim::start(spec.clone(), member.config(1))
        .await
        .unwrap();
    member.opened(1).await;
    let mut out = out_link(&sim).await;
    // A frame that is no message: counted, the link stays up.
    send(&mut out, b"hello").await;
    // A response to nothing: mismatched.
    let req = member_request(&spec, "000401", "NODE04000001");
    let req = Message::parse(&spec, Bytes::from(req)).unwrap();
    send(&mut out, &answer(&req, "00")).await;
    send(&mut out, &member_request(&spec, "000402", "NODE04000002")).await;
    let (_, resp) = member.message().await;
    let resp = Message::parse(&spec, resp).unwrap();
    assert_eq!(text(&resp, 37), "NODE04000002");
    let stats = sim.stats();
    assert_eq!(load(&stats.bad_frames), 1);
    assert_eq!(load(&stats.mismatched), 1);
    // A prefix that cannot be trusted closes that link only.
    out.write_all(b"00x1").await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(WAIT, out.read(&mut buf))
        .await
        .unwrap();
    assert!(matches!(n, Ok(0) | Err(_)));
    eventually("bad prefix counted", || load(&stats.bad_frames) == 2).await;
    let mut again = out_link(&sim).await;
    send(&mut again, &member_request(&spec, "000403", "NODE04000003")).await;
    let (_, resp) = member.message().await;
    let resp = Message::parse(&spec, resp).unwrap();
    assert_eq!(text(&resp, 37), "NODE04000003");
    sim.stop().await;
}

#[tokio::test]
async fn run_reports_after_its_duration() {
    let mut member = Member::start().await;
    let mut cfg = member.config(1);
    cfg.duration = Duration::from_millis(300);
    let started = Instant::now();
    let running = tokio::spawn(run(member.spec.clone(), cfg));
    member.opened(1).await;
    let report = running.await.unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(report.in_links_up, 1);
    assert_eq!(report.sent, 0);
}

#[tokio::test]
async fn start_refuses_a_spec_that_cannot_carry_issuer_requests() {
    let mut cfg = CupsSimConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:9".parse().unwrap(),
        1,
    );
    cfg.rate = Some(1.0);
    let pos = Arc::new(Spec::builtin("cup-pos").unwrap());
    assert!(CupsSim::start(pos, cfg).await.is_err());
}

/// With `require_sign_on`, an out link carries nothing before its sign-on:
/// a request and a keep-alive sent first are refused (counted, unanswered);
/// after the 0820 F70 001 and its 0830, the link's traffic is answered. A
/// second out link is not signed on by the first one's sign-on.
#[tokio::test]
async fn traffic_before_an_out_links_sign_on_is_refused() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let mut cfg = member.config(1);
    cfg.require_sign_on = true;
    let sim = CupsSim::start(spec.clone(), cfg).await.unwrap();
    member.opened(1).await;
    let mut out = out_link(&sim).await;
    send(&mut out, &member_request(&spec, "000401", "000000000401")).await;
    out.write_all(b"0000").await.unwrap();
    eventually("two refused", || load(&sim.stats().unsigned_frames) == 2).await;
    send(&mut out, &member_0820(&spec, "000402", "001")).await;
    let (_, resp) = member.message().await;
    let resp = Message::parse(&spec, resp).unwrap();
    assert_eq!(
        (resp.mti().as_str(), text(&resp, 70)),
        ("0830", "001".into())
    );
    send(&mut out, &member_request(&spec, "000403", "000000000403")).await;
    let (_, resp) = member.message().await;
    let resp = Message::parse(&spec, resp).unwrap();
    assert_eq!(
        text(&resp, 11),
        "000403",
        "the refused 000401 was never answered"
    );
    let mut other = out_link(&sim).await;
    send(&mut other, &member_request(&spec, "000404", "000000000404")).await;
    eventually("refused on the unsigned link", || {
        load(&sim.stats().unsigned_frames) == 3
    })
    .await;
    let report = sim.stop().await;
    assert_eq!(report.member_requests, 1, "{report}");
    assert_eq!(report.sign_ons, 1, "{report}");
}

/// A reversal of the member request `original` as the switch writes it on
/// an out link: the original's identifying fields, F39 a reason code, and
/// F90 written out by hand (MTI, F11, F7, F32 and F33 in 11 digits each).
fn member_reversal(spec: &Spec, original: &[u8], repeat: bool) -> Vec<u8> {
    let msg = Message::parse(spec, Bytes::from(original.to_vec())).unwrap();
    let f90 = format!(
        "{}{}{}{:0>11}{:0>11}",
        msg.mti(),
        text(&msg, 11),
        text(&msg, 7),
        text(&msg, 32),
        text(&msg, 33)
    );
    let mut d = msg.decode().unwrap();
    d.retain(|id| [2, 3, 4, 7, 11, 12, 13, 32, 33, 37, 41, 42, 49].contains(&id));
    d.mti = if repeat { "0421" } else { "0420" }.parse().unwrap();
    d.set_text(39, "68");
    d.set_text(90, f90);
    spec.encode(&d).unwrap()
}

/// Member requests approved late are recorded; the member's reversals come
/// on out links and are answered 0430 on an in link, the first of each
/// chain left unanswered (`ignore_reversals` 1), and booked per chain: one
/// for the late approval, one for a request UnionPay never saw. The
/// member's key request (0820 F70 101) is answered at once, ahead of the
/// late approval, and counted.
#[tokio::test]
async fn late_member_approvals_and_their_reversals_on_out_links() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let mut cfg = member.config(2);
    cfg.late = Some(LateApprovals {
        share: 1.0,
        by: Duration::from_millis(300),
    });
    cfg.ignore_reversals = 1;
    let sim = CupsSim::start(spec.clone(), cfg).await.unwrap();
    member.opened(2).await;
    let mut out = out_link(&sim).await;
    let late = member_request(&spec, "000701", "NODE07000001");
    send(&mut out, &late).await;
    send(&mut out, &member_0820(&spec, "000702", "101")).await;
    let (_, key) = member.message().await;
    let key = Message::parse(&spec, key).unwrap();
    assert_eq!((key.mti().as_str(), text(&key, 70)), ("0830", "101".into()));
    let (_, approval) = member.message().await;
    let approval = Message::parse(&spec, approval).unwrap();
    assert_eq!(
        (approval.mti().as_str(), text(&approval, 11)),
        ("0210", "000701".into())
    );
    assert_eq!(sim.report().reversals.late_approvals, 1);

    let never_seen = member_request(&spec, "000703", "NODE07000003");
    for original in [&late, &never_seen] {
        send(&mut out, &member_reversal(&spec, original, false)).await;
        send(&mut out, &member_reversal(&spec, original, true)).await;
        let (_, answer) = member.message().await;
        let answer = Message::parse(&spec, answer).unwrap();
        let want = Message::parse(&spec, Bytes::from(original.clone())).unwrap();
        assert_eq!(answer.mti().as_str(), "0430");
        assert_eq!(text(&answer, 11), text(&want, 11));
        assert_eq!(cups_header(&answer).source_id(), CUPS_ID);
    }
    let report = sim.stop().await;
    let r = &report.reversals;
    assert_eq!(
        (r.received, r.repeats, r.ignored, r.answered),
        (2, 2, 2, 2),
        "{r:?}"
    );
    assert_eq!(
        (r.chains, r.chains_late, r.chains_not_late),
        (2, 1, 1),
        "{r:?}"
    );
    assert_eq!((r.duplicate_chains, r.late_never_reversed), (0, 0), "{r:?}");
    assert_eq!(
        report.member_requests, 1,
        "reversals are not member requests"
    );
    assert_eq!(report.member_key_requests.get("101"), Some(&1));
}

/// UnionPay's own advices go out on an in link and wait for their
/// acknowledgement on an out link: an 0220 unacknowledged is repeated as
/// 0221 (same F11), and the repeat's 0230 settles it; an 0420 reversal
/// advice names in F90 the 0200 it reverses and carries F39 98; an advice
/// never acknowledged is given up after its repeats.
#[tokio::test]
async fn own_advices_are_repeated_until_acknowledged() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let mut cfg = member.config(1);
    cfg.advice_mtis = vec!["0220".parse().unwrap(), "0420".parse().unwrap()];
    cfg.advice_repeats = 1;
    cfg.timeout = Duration::from_millis(300);
    let sim = CupsSim::start(spec.clone(), cfg).await.unwrap();
    member.opened(1).await;
    let mut out = out_link(&sim).await;
    let stats = sim.stats();

    assert!(sim.send_advice());
    let (_, advice) = member.message().await;
    let advice = Message::parse(&spec, advice).unwrap();
    assert_eq!(advice.mti().as_str(), "0220");
    assert_eq!(cups_header(&advice).source_id(), CUPS_ID);
    assert_eq!(text(&advice, 37).len(), 12);
    for secret in [35, 52, 128] {
        assert!(!advice.has_field(secret), "F{secret} in an advice");
    }
    let (_, repeat) = member.message().await;
    let repeat = Message::parse(&spec, repeat).unwrap();
    assert_eq!(repeat.mti().as_str(), "0221");
    assert_eq!(text(&repeat, 11), text(&advice, 11));
    send(&mut out, &answer(&repeat, "00")).await;
    eventually("the repeat acknowledged", || {
        load(&stats.advices_acknowledged) == 1
    })
    .await;

    assert!(sim.send_advice());
    let (_, reversal) = member.message().await;
    let reversal = Message::parse(&spec, reversal).unwrap();
    assert_eq!(reversal.mti().as_str(), "0420");
    let f90 = format!(
        "0200{}{}{:0>11}{:0>11}",
        text(&reversal, 11),
        text(&reversal, 7),
        text(&reversal, 32),
        text(&reversal, 33)
    );
    assert_eq!(text(&reversal, 90), f90);
    assert_eq!(text(&reversal, 39), "98");
    send(&mut out, &answer(&reversal, "00")).await;
    eventually("the reversal advice acknowledged", || {
        load(&stats.advices_acknowledged) == 2
    })
    .await;

    assert!(sim.send_advice());
    let (_, ignored) = member.message().await;
    let (_, ignored_again) = member.message().await;
    let ignored = Message::parse(&spec, ignored).unwrap();
    let ignored_again = Message::parse(&spec, ignored_again).unwrap();
    assert_eq!(
        (ignored.mti().as_str(), ignored_again.mti().as_str()),
        ("0220", "0221")
    );
    eventually("given up", || load(&stats.advices_unacknowledged) == 1).await;
    let report = sim.stop().await;
    assert_eq!(
        (report.advices_sent, report.advice_repeats_sent),
        (3, 2),
        "{report}"
    );
    assert_eq!(report.advices_acknowledged, 2, "{report}");
    assert_eq!(report.mismatched, 0, "{report}");
}

/// A key reset started by UnionPay (0800 F70 101) on an in link expects an
/// 0810 on an out link: answered ones are counted with their F39, one never
/// answered counts as unanswered after the timeout.
#[tokio::test]
async fn key_resets_expect_an_0810_on_an_out_link() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let mut cfg = member.config(1);
    cfg.timeout = Duration::from_millis(300);
    let sim = CupsSim::start(spec.clone(), cfg).await.unwrap();
    member.opened(1).await;
    let mut out = out_link(&sim).await;
    for code in ["00", "96"] {
        assert!(sim.send_key_reset());
        let (_, reset) = member.message().await;
        let reset = Message::parse(&spec, reset).unwrap();
        assert_eq!(
            (reset.mti().as_str(), text(&reset, 70)),
            ("0800", "101".into())
        );
        assert_eq!(cups_header(&reset).destination_id(), MEMBER_ID);
        send(&mut out, &answer(&reset, code)).await;
    }
    let stats = sim.stats();
    eventually("both answered", || load(&stats.key_resets_answered) == 2).await;
    assert!(sim.send_key_reset());
    eventually("the third unanswered", || {
        load(&stats.key_resets_unanswered) == 1
    })
    .await;
    let report = sim.stop().await;
    assert_eq!(report.key_resets_sent, 3, "{report}");
    let f39: Vec<(String, u64)> = report.key_reset_f39.into_iter().collect();
    assert_eq!(f39, [("00".to_string(), 1), ("96".to_string(), 1)]);
}

/// At a rate, advices and key resets go out on their own; every one
/// answered is settled, none is left.
#[tokio::test]
async fn paced_advices_and_key_resets_are_settled() {
    let mut member = Member::start().await;
    let spec = member.spec.clone();
    let mut cfg = member.config(1);
    cfg.advice_rate = Some(10.0);
    cfg.key_reset_every = Some(Duration::from_millis(100));
    cfg.duration = Duration::from_millis(350);
    let sim = CupsSim::start(spec.clone(), cfg).await.unwrap();
    member.opened(1).await;
    let mut out = out_link(&sim).await;
    // Both stop after the simulator's duration: quiet comes.
    let seen = tokio::time::timeout(
        Duration::from_secs(10),
        member.answer_until_quiet(&mut out, Duration::from_millis(400)),
    )
    .await
    .expect("quiet after the duration");
    sim.stop_originating();
    let report = sim.stop().await;
    assert!(report.advices_sent >= 2, "{report}");
    assert!(report.key_resets_sent >= 2, "{report}");
    assert_eq!(seen.get("0220"), Some(&report.advices_sent));
    assert_eq!(seen.get("0800"), Some(&report.key_resets_sent));
    assert_eq!(report.advices_acknowledged, report.advices_sent, "{report}");
    assert_eq!(
        report.key_resets_answered, report.key_resets_sent,
        "{report}"
    );
    assert_eq!(
        report.advices_unacknowledged + report.key_resets_unanswered,
        0
    );
}
