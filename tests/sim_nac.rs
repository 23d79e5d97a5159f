//! The POS network controller simulator against a switch played by hand,
//! over real sockets: advices repeated until acknowledged, sign-ins, and
//! exactly-once counting of purchases beside them.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use isoswitch::iso8583::{Message, Spec};
use isoswitch::sim::nac::{NacCounters, NacReport, NacSimConfig, NacTraffic, run_mixed};
use isoswitch::wire::{Frame, FrameCodec};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::codec::FramedRead;

/// What the hand-played switch read: MTI, F11, F41, F60.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    mti: String,
    stan: String,
    terminal: String,
    f60: Option<String>,
}

/// How the switch answers one message: the answers to write (none, one, or
/// the same one twice).
type Policy = Box<dyn FnMut(&Seen) -> Vec<Answer> + Send>;

#[derive(Clone, Copy, Debug)]
enum Answer {
    /// The simulators' answer, F39 00.
    Approve,
    /// That answer with another MTI.
    WithMti(&'static str),
}

/// A switch that accepts the NAC's uplinks and answers per its policy.
struct HandSwitch {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl HandSwitch {
    async fn start(spec: Arc<Spec>, policy: Policy) -> HandSwitch {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let policy = Arc::new(Mutex::new(policy));
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (spec, policy, log) = (Arc::clone(&spec), Arc::clone(&policy), log.clone());
                tokio::spawn(serve(spec, stream, policy, log));
            }
        });
        HandSwitch { addr, seen, task }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn count(&self, mti: &str) -> u64 {
        self.seen().iter().filter(|s| s.mti == mti).count() as u64
    }
}

impl Drop for HandSwitch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    spec: Arc<Spec>,
    stream: tokio::net::TcpStream,
    policy: Arc<Mutex<Policy>>,
    log: Arc<Mutex<Vec<Seen>>>,
) {
    let (read, mut write) = stream.into_split();
    let f = spec.framing();
    let mut frames = FramedRead::new(read, FrameCodec::new(f.prefix, f.max_frame));
    while let Some(Ok(frame)) = frames.next().await {
        let Frame::Message(payload) = frame else {
            continue;
        };
        let msg = Message::parse(&spec, payload).expect("the NAC sends messages");
        let text = |id: u16| {
            msg.field(id)
                .unwrap()
                .map(|f| String::from_utf8(f.logical().collect()).unwrap())
        };
        let seen = Seen {
            mti: msg.mti().to_string(),
            stan: text(11).expect("F11"),
            terminal: text(41).expect("F41"),
            f60: text(60),
        };
        log.lock().unwrap().push(seen.clone());
        let answers = (policy.lock().unwrap())(&seen);
        let mut out = BytesMut::new();
        for a in answers {
            let mut d = isoswitch::sim::answer::response_fields(&spec, &msg, "00").unwrap();
            if let Answer::WithMti(m) = a {
                d.mti = m.parse().unwrap();
            }
            let payload = spec.encode(&d).unwrap();
            f.prefix.encode(payload.len(), &mut out).unwrap();
            out.extend_from_slice(&payload);
        }
        if !out.is_empty() && write.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn config(target: SocketAddr, terminals: usize, rate: Option<f64>, ms: u64) -> NacSimConfig {
    NacSimConfig {
        target,
        nac_id: 7,
        uplinks: 1,
        terminals,
        rate,
        duration: Duration::from_millis(ms),
        timeout: Duration::from_millis(200),
    }
}

async fn run(spec: &Arc<Spec>, cfg: NacSimConfig, traffic: NacTraffic) -> NacReport {
    let counters = Arc::new(NacCounters::default());
    tokio::time::timeout(
        Duration::from_secs(20),
        run_mixed(Arc::clone(spec), cfg, traffic, counters),
    )
    .await
    .expect("the NAC ends in time")
    .expect("the NAC runs")
}

fn pos() -> Arc<Spec> {
    Arc::new(Spec::builtin("cup-pos").expect("builtin spec"))
}

/// An advice unacknowledged within the timeout is repeated as 0221 with its
/// F11 and F41; the repeat's acknowledgement counts, and a second 0230 for
/// it is an extra acknowledgement (at-least-once), not a mismatch.
#[tokio::test]
async fn advices_are_repeated_until_acknowledged() {
    let spec = pos();
    let policy: Policy = Box::new(|s: &Seen| match (s.mti.as_str(), s.stan.as_str()) {
        ("0220", "000001") => vec![],
        ("0221", "000001") => vec![Answer::Approve, Answer::Approve],
        _ => vec![Answer::Approve],
    });
    let switch = HandSwitch::start(spec.clone(), policy).await;
    let traffic = NacTraffic {
        advice_share: 1.0,
        advice_repeats: 2,
        sign_in_every: None,
    };
    let report = run(&spec, config(switch.addr, 1, None, 300), traffic).await;
    let seen = switch.seen();
    assert_eq!(
        (seen[0].mti.as_str(), seen[1].mti.as_str()),
        ("0220", "0221")
    );
    assert_eq!(
        (&seen[0].stan, &seen[0].terminal),
        (&seen[1].stan, &seen[1].terminal)
    );
    let advices = switch.count("0220");
    assert!(advices >= 2, "more advices after the first: {seen:?}");
    assert_eq!(report.advices_sent, advices, "{report}");
    assert_eq!(report.advice_repeats, 1, "{report}");
    assert_eq!(report.advice_acks, advices, "{report}");
    assert_eq!(report.advice_acks_extra, 1, "{report}");
    assert_eq!(report.advices_unacknowledged, 0, "{report}");
    assert_eq!((report.sent, report.answered, report.mismatched), (0, 0, 0));
}

/// An advice never acknowledged is repeated `advice_repeats` times, then
/// given up and counted.
#[tokio::test]
async fn unacknowledged_advices_are_given_up_after_their_repeats() {
    let spec = pos();
    let switch = HandSwitch::start(spec.clone(), Box::new(|_: &Seen| vec![])).await;
    let traffic = NacTraffic {
        advice_share: 1.0,
        advice_repeats: 2,
        sign_in_every: None,
    };
    let report = run(&spec, config(switch.addr, 1, None, 50), traffic).await;
    let mtis: Vec<String> = switch.seen().into_iter().map(|s| s.mti).collect();
    assert_eq!(mtis, ["0220", "0221", "0221"]);
    assert_eq!(
        (
            report.advices_sent,
            report.advice_repeats,
            report.advice_acks
        ),
        (1, 2, 0),
        "{report}"
    );
    assert_eq!(report.advices_unacknowledged, 1, "{report}");
}

/// Purchases, advices and sign-ins mixed: every purchase answered exactly
/// once and counted as such, every advice acknowledged and counted apart,
/// every sign-in (0800 with F60 network code 003) answered by an 0810.
#[tokio::test]
async fn purchases_advices_and_sign_ins_are_counted_apart() {
    let spec = pos();
    let switch = HandSwitch::start(spec.clone(), Box::new(|_: &Seen| vec![Answer::Approve])).await;
    let traffic = NacTraffic {
        advice_share: 0.5,
        advice_repeats: 1,
        sign_in_every: Some(Duration::from_millis(100)),
    };
    let mut cfg = config(switch.addr, 4, Some(200.0), 400);
    cfg.uplinks = 2;
    cfg.timeout = Duration::from_secs(2);
    let report = run(&spec, cfg, traffic).await;
    assert_eq!(report.sent, switch.count("0200"), "{report}");
    assert_eq!(report.answered, report.sent, "{report}");
    assert_eq!(report.advices_sent, switch.count("0220"), "{report}");
    assert_eq!(report.advice_acks, report.advices_sent, "{report}");
    assert_eq!(report.sign_ins_sent, switch.count("0800"), "{report}");
    assert_eq!(report.sign_ins_answered, report.sign_ins_sent, "{report}");
    assert!(
        report.sign_ins_sent >= 4,
        "each terminal signs in: {report}"
    );
    assert!(report.sent > 0 && report.advices_sent > 0, "{report}");
    let zero = (report.declined, report.mismatched, report.unanswered);
    assert_eq!(zero, (0, 0, 0), "{report}");
    assert_eq!(report.advice_repeats + report.advices_unacknowledged, 0);
    for s in switch.seen().iter().filter(|s| s.mti == "0800") {
        assert_eq!(s.f60.as_deref(), Some("00000001003"), "a sign-in");
    }
}

/// An answer with the wrong MTI is a mismatch: an advice acknowledgement
/// (0230) is no answer to a purchase.
#[tokio::test]
async fn an_advice_ack_is_no_purchase_answer() {
    let spec = pos();
    let switch = HandSwitch::start(
        spec.clone(),
        Box::new(|_: &Seen| vec![Answer::WithMti("0230")]),
    )
    .await;
    let report = run(
        &spec,
        config(switch.addr, 1, None, 50),
        NacTraffic::default(),
    )
    .await;
    assert!(report.sent > 0, "{report}");
    assert_eq!(report.mismatched, report.sent, "{report}");
    assert_eq!(report.answered + report.declined, 0, "{report}");
}
