//! The VISA simulator as a test oracle, against a bank played by hand over
//! real sockets: it must sign on before sending, answer the bank on another
//! link, and catch every lost, doubled or crossed answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use isoswitch::iso8583::{Decoded, Spec, Value};
use isoswitch::sim::visa::{Dial, VisaSim, VisaSimConfig};
use isoswitch::wire::{Frame, FrameCodec, VisaHeader};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

const WAIT: Duration = Duration::from_secs(3);

fn spec() -> Arc<Spec> {
    Arc::new(Spec::builtin("visa-base1").expect("builtin visa spec"))
}

/// The bank's side: accepts the simulator's links, reports each message with
/// the index of the link it came on, and writes on any link.
struct Bank {
    spec: Arc<Spec>,
    addr: SocketAddr,
    frames: mpsc::UnboundedReceiver<(usize, Bytes)>,
    links: mpsc::UnboundedReceiver<OwnedWriteHalf>,
    writers: Vec<OwnedWriteHalf>,
}

impl Bank {
    async fn start() -> Bank {
        let spec = spec();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (frames_tx, frames) = mpsc::unbounded_channel();
        let (links_tx, links) = mpsc::unbounded_channel();
        let framing = spec.framing();
        tokio::spawn(async move {
            let mut index = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let (read, write) = stream.into_split();
                let _ = links_tx.send(write);
                let (tx, i) = (frames_tx.clone(), index);
                index += 1;
                tokio::spawn(async move {
                    let codec = FrameCodec::new(framing.prefix, framing.max_frame);
                    let mut frames = FramedRead::new(read, codec);
                    while let Some(Ok(f)) = frames.next().await {
                        if let Frame::Message(p) = f
                            && tx.send((i, p)).is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Bank {
            spec,
            addr,
            frames,
            links,
            writers: Vec::new(),
        }
    }

    async fn wait_links(&mut self, n: usize) {
        while self.writers.len() < n {
            let w = tokio::time::timeout(WAIT, self.links.recv()).await;
            self.writers.push(w.expect("the simulator dials").unwrap());
        }
    }

    async fn next(&mut self) -> (usize, Decoded) {
        let (link, p) = tokio::time::timeout(WAIT, self.frames.recv())
            .await
            .expect("a frame in time")
            .expect("bank up");
        (
            link,
            self.spec.decode(&p).expect("the simulator's frames parse"),
        )
    }

    async fn send_on(&mut self, link: usize, d: &Decoded) {
        let payload = self.spec.encode(d).unwrap();
        let mut frame = bytes::BytesMut::new();
        self.spec
            .framing()
            .prefix
            .encode(payload.len(), &mut frame)
            .unwrap();
        frame.extend_from_slice(&payload);
        self.writers[link].write_all(&frame).await.unwrap();
    }
}

fn text(d: &Decoded, id: u16) -> String {
    d.get(id)
        .and_then(Value::as_text)
        .unwrap_or_default()
        .to_string()
}

/// The bank's answer: response MTI, station IDs swapped, fields echoed, F39.
fn respond(req: &Decoded, f39: &str) -> Decoded {
    let mut env = req.envelope.clone();
    VisaHeader::swap_ids_in_place(&mut env);
    let mut d = Decoded::new(env, req.mti.response().unwrap());
    for (id, v) in &req.fields {
        d.set(*id, v.clone());
    }
    d.set_text(39, f39);
    d
}

fn sim_config(bank: SocketAddr) -> VisaSimConfig {
    let mut cfg = VisaSimConfig::new(Dial::Connect(bank), 2);
    cfg.rate = Some(200.0);
    cfg.count = Some(6);
    cfg.timeout = Duration::from_millis(800);
    cfg.echo_interval = Duration::ZERO;
    cfg.keepalive_idle = Duration::ZERO;
    // No retry while the bank takes its time: the bank sees each frame once.
    cfg.sign_on_retry = Duration::from_secs(10);
    cfg
}

/// Sign-on first on each link; six issuer requests answered once, twice,
/// crossed, declined, and not at all; a bank request answered on the other
/// link; an echo answered on its own link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signs_on_checks_answers_and_answers_on_another_link() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut bank = Bank::start().await;
        let sim = VisaSim::start(spec(), sim_config(bank.addr)).await.unwrap();
        bank.wait_links(2).await;

        // Each link signs on before anything else on it; the bank answers
        // each sign-on on the other link (the simulator matches by F7 + F11).
        // A link signed on may carry requests while the other still signs on.
        let mut signed = std::collections::HashSet::new();
        let mut early = Vec::new();
        while signed.len() < 2 {
            let (link, m) = bank.next().await;
            if m.mti.as_str() != "0800" {
                assert!(
                    signed.contains(&link),
                    "{} before the sign-on of link {link}",
                    m.mti
                );
                early.push((link, m));
                continue;
            }
            assert_eq!(text(&m, 70), "001");
            assert!(signed.insert(link), "one sign-on per link");
            bank.send_on(1 - link, &respond(&m, "00")).await;
        }

        // Six issuer requests, each treated differently.
        let mut requests = Vec::new();
        let mut early = early.into_iter();
        while requests.len() < 6 {
            let (link, m) = match early.next() {
                Some(frame) => frame,
                None => bank.next().await,
            };
            assert!(["0100", "0200"].contains(&m.mti.as_str()), "{}", m.mti);
            for id in [2, 4, 7, 11, 37, 41] {
                assert!(m.get(id).is_some(), "F{id} in the issuer request");
            }
            requests.push((link, m));
        }
        let (l, r) = &requests[0];
        bank.send_on(*l, &respond(r, "00")).await;
        let (l, r) = &requests[1];
        bank.send_on(*l, &respond(r, "00")).await;
        bank.send_on(1 - *l, &respond(r, "00")).await;
        let (l, r) = &requests[2];
        let mut crossed = respond(r, "00");
        crossed.set_text(37, "CROSSED00001");
        bank.send_on(*l, &crossed).await;
        let (l, r) = &requests[3];
        bank.send_on(*l, &respond(r, "05")).await;

        // A request from the bank's node 01 on link 0: answered on link 1.
        let mut ours = isoswitch::iso8583::samples::purchase(&bank.spec);
        ours.retain(|id| [2, 3, 4, 7, 11, 32, 37, 41, 42, 49].contains(&id));
        ours.set_text(11, "424242");
        ours.set_text(37, "123456789001");
        bank.send_on(0, &ours).await;
        // An echo test on link 1: answered on link 1.
        let mut echo = isoswitch::iso8583::samples::echo(&bank.spec);
        echo.set_text(11, "515151");
        bank.send_on(1, &echo).await;
        let mut got = 0;
        while got < 2 {
            let (link, m) = bank.next().await;
            match m.mti.as_str() {
                "0210" => {
                    assert_eq!(link, 1, "the answer takes the other link");
                    assert_eq!(text(&m, 11), "424242");
                    assert_eq!(text(&m, 37), "123456789001");
                    assert_eq!(text(&m, 39), "00");
                    assert_eq!(text(&m, 38).len(), 6, "an approval code");
                    assert_eq!(m.envelope[5..8], ours.envelope[8..11], "IDs swapped");
                }
                "0810" => {
                    assert_eq!(link, 1, "network management stays on its link");
                    assert_eq!(text(&m, 11), "515151");
                    assert_eq!(text(&m, 39), "00");
                }
                other => panic!("unexpected {other}"),
            }
            got += 1;
        }

        eventually("every request answered", || sim.outstanding() == 0).await;
        let r = sim.stop().await;
        assert_eq!(r.sign_ons_sent, 2, "{r}");
        assert_eq!(r.sign_ons_approved, 2, "{r}");
        assert_eq!(r.issuer_sent, 6, "{r}");
        assert_eq!(r.issuer_approved, 2, "{r}");
        assert_eq!(r.doubled, 1, "{r}");
        assert_eq!(r.wrong_key, 1, "{r}");
        assert_eq!(r.issuer_declined, 1, "{r}");
        assert_eq!(r.issuer_unanswered, 2, "{r}");
        assert_eq!(
            (r.bank_requests, r.bank_answered_on_other_link),
            (1, 1),
            "{r}"
        );
        assert_eq!(r.stamps.get("01"), Some(&1), "{r}");
        assert_eq!(r.network_answered, 1, "{r}");
        assert!(!r.is_clean());
        assert_eq!((r.lost(), r.doubled_or_crossed()), (2, 2));
    })
    .await
    .expect("in time");
}

/// Nothing goes on a link before its sign-on is approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_issuer_request_before_sign_on() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut bank = Bank::start().await;
        let mut cfg = sim_config(bank.addr);
        cfg.sign_on_retry = Duration::from_millis(100);
        let sim = VisaSim::start(spec(), cfg).await.unwrap();
        bank.wait_links(2).await;
        // Refused sign-ons are retried; no issuer request meanwhile.
        for _ in 0..4 {
            let (link, m) = bank.next().await;
            assert_eq!(m.mti.as_str(), "0800");
            bank.send_on(link, &respond(&m, "91")).await;
        }
        assert_eq!(sim.issuer_sent(), 0);
        assert_eq!(sim.links(), (2, 0));
        let r = sim.stop().await;
        assert!(r.sign_ons_sent >= 4, "{r}");
        assert_eq!(r.sign_ons_approved, 0, "{r}");
    })
    .await
    .expect("in time");
}

/// The binary exits non-zero, and says so, when answers are lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_fails_on_loss() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut bank = Bank::start().await;
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
            .args(["sim", "visa", "--connect", &bank.addr.to_string()])
            .args([
                "--links",
                "1",
                "--no-sign-on",
                "--rate",
                "50",
                "--count",
                "5",
            ])
            .args(["--timeout", "300ms"])
            .env("ISOSWITCH_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the binary runs");
        bank.wait_links(1).await;
        let out = child.wait_with_output().await.unwrap();
        assert!(!out.status.success(), "loss must fail the run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("issuer sent 5 approved 0"), "{stdout}");
        assert!(stdout.contains("unanswered 5"), "{stdout}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("5 requests lost"), "{stderr}");
    })
    .await
    .expect("in time");
}

/// A bank request read on a link being dropped, with no other link up, is
/// answered once a link is back (dialled again), not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_waits_for_a_link_to_come_back() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut bank = Bank::start().await;
        let mut cfg = VisaSimConfig::new(Dial::Connect(bank.addr), 1);
        cfg.sign_on = false;
        cfg.echo_interval = Duration::ZERO;
        cfg.keepalive_idle = Duration::ZERO;
        let sim = VisaSim::start(spec(), cfg).await.unwrap();
        bank.wait_links(1).await;
        eventually("VISA's link up", || sim.links().0 > 0).await;
        // VISA drops its only link; the bank still sends on it, then closes.
        assert_eq!(sim.close_links(1), 1);
        eventually("VISA's link dropped", || sim.links().0 != 1).await;
        let mut ours = isoswitch::iso8583::samples::purchase(&bank.spec);
        ours.retain(|id| [2, 3, 4, 7, 11, 32, 37, 41, 42, 49].contains(&id));
        ours.set_text(11, "777777");
        bank.send_on(0, &ours).await;
        eventually("the bank's request at VISA", || {
            sim.stats()
                .bank_requests
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        })
        .await;
        bank.writers[0].shutdown().await.unwrap();
        // VISA dials again and the answer goes out on the new link.
        bank.wait_links(2).await;
        let (link, m) = bank.next().await;
        assert_eq!((link, m.mti.as_str()), (1, "0210"));
        assert_eq!(text(&m, 11), "777777");
        let r = sim.stop().await;
        assert_eq!(
            (r.answers_parked, r.bank_answered, r.answers_unsent),
            (1, 1, 0),
            "{r}"
        );
    })
    .await
    .expect("in time");
}

/// Polls `cond` until it holds; fails naming `what` after 10 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
