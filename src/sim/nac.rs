//! `isoswitch sim nac`: a POS network controller. Many terminals, each with its
//! own TPDU source address and terminal ID (F41), share a few uplinks; each
//! terminal keeps one request in flight, as a POS does. Every response must come
//! back on the uplink that carried its request, with the TPDU swapped and the
//! response MTI, matching a request that terminal sent.
//!
//! Besides purchases ([`NacTraffic`]), a share of a terminal's messages can be
//! advices (`0220`, the purchase's fields) that expect an `0230`: one
//! unacknowledged within the timeout is repeated as `0221` (same F11), a few
//! times at most. Advices are delivered at least once, so an extra `0230`
//! for an advice already acknowledged (or given up) is counted apart, not as
//! a mismatch. Terminals can also sign in (`0800`) periodically; the `0810`s
//! are counted. None of these count among the purchases' answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;

use std::collections::{HashSet, VecDeque};

mod report;

pub use report::{NacCounters, NacReport};

use crate::iso8583::{Decoded, Message, Mti, Spec, samples};
use crate::sim::answer::response_mti;
use crate::sim::peer::lock;
use crate::sim::writer::{Outbound, Patch, run_writer};
use crate::wire::{Frame, FrameCodec, Tpdu};

#[derive(Clone, Debug)]
pub struct NacSimConfig {
    pub target: SocketAddr,
    /// Distinguishes NACs sharing TPDU addresses: the first two digits of F41.
    pub nac_id: u8,
    pub uplinks: usize,
    pub terminals: usize,
    /// Total requests per second across all terminals; `None` = as fast as answered.
    pub rate: Option<f64>,
    pub duration: Duration,
    /// A request unanswered this long counts as unanswered.
    pub timeout: Duration,
}

/// What terminals send besides purchases. The default is purchases only.
#[derive(Clone, Copy, Debug, Default)]
pub struct NacTraffic {
    /// Share of a terminal's transactions (0..=1) sent as advices (`0220`).
    pub advice_share: f64,
    /// An advice unacknowledged within the timeout is repeated (`0221`) at
    /// most this many times.
    pub advice_repeats: u32,
    /// Each terminal signs in (`0800`) at its start and then this often.
    pub sign_in_every: Option<Duration>,
}

/// Advice keys remembered per uplink once sent, to tell an extra `0230`
/// (at-least-once delivery) from one that matches nothing.
const RECENT_ADVICES: usize = 16_384;

type Counters = NacCounters;

/// The outcome a terminal waits for.
enum Outcome {
    Answered,
    Declined,
    Mismatched,
}

/// A terminal's message: F41 and F11.
type Key = ([u8; 8], [u8; 3]);

/// A message in flight: the TPDU and MTI its answer must carry.
struct Expected {
    tpdu: Tpdu,
    mti: Mti,
    done: oneshot::Sender<Outcome>,
}

/// Requests in flight on one uplink.
type Waiting = Mutex<HashMap<Key, Expected>>;

struct Uplink {
    tx: mpsc::Sender<Outbound>,
    waiting: Waiting,
    /// Advices sent lately on this uplink.
    recent_advices: Mutex<(HashSet<Key>, VecDeque<Key>)>,
}

impl Uplink {
    fn new(tx: mpsc::Sender<Outbound>) -> Uplink {
        Uplink {
            tx,
            waiting: Mutex::new(HashMap::new()),
            recent_advices: Mutex::new((HashSet::new(), VecDeque::new())),
        }
    }

    fn expect(&self, key: Key, tpdu: Tpdu, mti: Mti) -> oneshot::Receiver<Outcome> {
        let (done, outcome) = oneshot::channel();
        let expected = Expected { tpdu, mti, done };
        lock(&self.waiting).insert(key, expected);
        outcome
    }

    fn forget(&self, key: &Key) {
        lock(&self.waiting).remove(key);
    }

    fn advice_sent(&self, key: Key) {
        let mut guard = lock(&self.recent_advices);
        let (set, order) = &mut *guard;
        if set.insert(key) {
            order.push_back(key);
        }
        while order.len() > RECENT_ADVICES {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
    }

    fn advice_was_sent(&self, key: &Key) -> bool {
        lock(&self.recent_advices).0.contains(key)
    }
}

/// A message template and where to patch it per terminal and per message.
#[derive(Clone)]
struct Template {
    payload: Bytes,
    f11: std::ops::Range<usize>,
    f41: std::ops::Range<usize>,
    /// The MTI of its answer.
    answer: Mti,
}

impl Template {
    /// The template with the terminal's TPDU, STAN and F41.
    fn patched(&self, term: &Terminal, stan: &[u8; 3]) -> Option<Outbound> {
        let mut patch = Patch::default();
        let ok = patch.overwrite(0, &term.tpdu.to_bytes()).is_ok()
            && patch.overwrite(self.f11.start, stan).is_ok()
            && patch.overwrite(self.f41.start, &term.f41).is_ok();
        ok.then(|| Outbound::Message(self.payload.clone(), patch))
    }
}

/// Every template a terminal sends from.
#[derive(Clone)]
struct Templates {
    purchase: Template,
    advice: Template,
    advice_repeat: Template,
    sign_in: Template,
}

/// Runs the NAC to completion and reports.
pub async fn run(spec: Arc<Spec>, cfg: NacSimConfig) -> std::io::Result<NacReport> {
    run_with(spec, cfg, Arc::new(NacCounters::default())).await
}

/// [`run`], with counters the caller can watch while it runs.
pub async fn run_with(
    spec: Arc<Spec>,
    cfg: NacSimConfig,
    counters: Arc<NacCounters>,
) -> std::io::Result<NacReport> {
    run_mixed(spec, cfg, NacTraffic::default(), counters).await
}

/// [`run_with`], the terminals sending `traffic` besides purchases.
pub async fn run_mixed(
    spec: Arc<Spec>,
    cfg: NacSimConfig,
    traffic: NacTraffic,
    counters: Arc<NacCounters>,
) -> std::io::Result<NacReport> {
    run_tls(spec, cfg, traffic, counters, None).await
}

/// [`run_mixed`], the uplinks over TLS when `tls` is given.
pub async fn run_tls(
    spec: Arc<Spec>,
    cfg: NacSimConfig,
    traffic: NacTraffic,
    counters: Arc<NacCounters>,
    tls: Option<Arc<crate::tls::tools::Connector>>,
) -> std::io::Result<NacReport> {
    let templates = templates(&spec).map_err(std::io::Error::other)?;
    let mut uplinks = Vec::with_capacity(cfg.uplinks);
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..cfg.uplinks.max(1) {
        let stream = crate::tls::tools::connect(tls.as_deref(), cfg.target).await?;
        let (read, write) = stream.into_split();
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(run_writer(write, spec.framing().prefix, rx));
        let uplink = Arc::new(Uplink::new(tx));
        readers.spawn(read_uplink(
            Arc::clone(&spec),
            read,
            Arc::clone(&uplink),
            Arc::clone(&counters),
        ));
        uplinks.push(uplink);
    }
    let stop_at = Instant::now() + cfg.duration;
    let per_terminal = cfg
        .rate
        .map(|r| Duration::from_secs_f64(cfg.terminals as f64 / r.max(0.001)));
    let mut terminals = tokio::task::JoinSet::new();
    for t in 0..cfg.terminals {
        let uplink = Arc::clone(&uplinks[t % uplinks.len()]);
        let term = Terminal::new(cfg.nac_id, t);
        // Terminals start spread over one period, as real ones are: all of
        // them firing at the same instant would make the traffic one burst.
        let first_send = Instant::now()
            + per_terminal.map_or(Duration::ZERO, |p| {
                p.mul_f64(t as f64 / cfg.terminals as f64)
            });
        let setup = TerminalSetup {
            templates: templates.clone(),
            uplink,
            counters: Arc::clone(&counters),
            first_send,
            stop_at,
            pace: per_terminal,
            timeout: cfg.timeout,
            traffic,
        };
        terminals.spawn(run_terminal(term, setup));
    }
    while terminals.join_next().await.is_some() {}
    readers.abort_all();
    Ok(counters.report())
}

struct Terminal {
    tpdu: Tpdu,
    f41: [u8; 8],
    stan: u32,
}

/// The TPDU a host's answer to `sent` carries: the addresses trade places
/// (written here, not taken from the switch's TPDU code: this is the check).
fn answer_tpdu(sent: Tpdu) -> Tpdu {
    Tpdu {
        id: sent.id,
        destination: sent.source,
        source: sent.destination,
    }
}

impl Terminal {
    fn new(nac: u8, index: usize) -> Terminal {
        // Source address: the terminal's line number as four BCD digits, as a NAC
        // numbers its POS lines. Several NACs use the same addresses.
        let line = (index % 10_000) as u16;
        let bcd = |v: u16| ((v / 10) << 4 | (v % 10)) as u8;
        let tpdu = Tpdu {
            id: Tpdu::ID,
            destination: [0x00, 0x03],
            source: [bcd(line / 100), bcd(line % 100)],
        };
        let mut f41 = [b'0'; 8];
        let id = format!("{:02}{:06}", nac % 100, index % 1_000_000);
        f41.copy_from_slice(id.as_bytes());
        Terminal { tpdu, f41, stan: 0 }
    }

    fn next_stan(&mut self) -> [u8; 3] {
        self.stan = self.stan % 999_999 + 1;
        let s = self.stan;
        let bcd = |v: u32| ((v / 10) << 4 | (v % 10)) as u8;
        [bcd(s / 10_000), bcd(s / 100 % 100), bcd(s % 100)]
    }
}

/// What a terminal runs with.
struct TerminalSetup {
    templates: Templates,
    uplink: Arc<Uplink>,
    counters: Arc<Counters>,
    first_send: Instant,
    stop_at: Instant,
    pace: Option<Duration>,
    timeout: Duration,
    traffic: NacTraffic,
}

/// How a terminal's wait for an answer ended.
enum Answer {
    Came(Outcome),
    TimedOut,
}

async fn run_terminal(mut term: Terminal, setup: TerminalSetup) {
    let mut rng = crate::util::rng::rng_from_entropy();
    let mut next_send = setup.first_send;
    let mut next_sign_in = setup.traffic.sign_in_every.map(|_| Instant::now());
    while Instant::now() < setup.stop_at {
        if let (Some(due), Some(every)) = (next_sign_in, setup.traffic.sign_in_every)
            && Instant::now() >= due
        {
            next_sign_in = Some(due + every);
            if !sign_in(&mut term, &setup).await {
                return;
            }
            continue;
        }
        if let Some(p) = setup.pace {
            tokio::time::sleep_until(next_send.into()).await;
            next_send += p;
        }
        let advice = setup.traffic.advice_share > 0.0 && rng.chance(setup.traffic.advice_share);
        let going = if advice {
            send_advice(&mut term, &setup).await
        } else {
            purchase(&mut term, &setup).await
        };
        if !going {
            return;
        }
    }
}

/// Queues `template` for the terminal with `stan`, its answer expected;
/// `None` when the uplink is gone.
async fn send(
    term: &Terminal,
    setup: &TerminalSetup,
    template: &Template,
    stan: [u8; 3],
) -> Option<oneshot::Receiver<Outcome>> {
    let out = template.patched(term, &stan)?;
    let key = (term.f41, stan);
    let outcome = setup
        .uplink
        .expect(key, answer_tpdu(term.tpdu), template.answer);
    if setup.uplink.tx.send(out).await.is_err() {
        setup.counters.uplinks_lost.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    Some(outcome)
}

/// Waits out the timeout for the answer to the terminal's `stan`.
async fn wait(
    term: &Terminal,
    setup: &TerminalSetup,
    stan: [u8; 3],
    outcome: oneshot::Receiver<Outcome>,
) -> Answer {
    match tokio::time::timeout(setup.timeout, outcome).await {
        Ok(Ok(outcome)) => Answer::Came(outcome),
        _ => {
            setup.uplink.forget(&(term.f41, stan));
            Answer::TimedOut
        }
    }
}

/// One purchase, counted exactly once. `false` when the uplink is gone.
async fn purchase(term: &mut Terminal, setup: &TerminalSetup) -> bool {
    let counters = &setup.counters;
    let stan = term.next_stan();
    let Some(outcome) = send(term, setup, &setup.templates.purchase, stan).await else {
        return false;
    };
    counters.sent.fetch_add(1, Ordering::Relaxed);
    let sent_at = Instant::now();
    let answer = wait(term, setup, stan, outcome).await;
    if let Answer::Came(Outcome::Answered | Outcome::Declined) = &answer {
        counters.record(sent_at.elapsed());
    }
    let counter = match answer {
        Answer::Came(Outcome::Answered) => &counters.answered,
        Answer::Came(Outcome::Declined) => &counters.declined,
        Answer::Came(Outcome::Mismatched) => &counters.mismatched,
        Answer::TimedOut => &counters.unanswered,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    true
}

/// One advice, repeated (same F11) until acknowledged or out of repeats.
/// `false` when the uplink is gone.
async fn send_advice(term: &mut Terminal, setup: &TerminalSetup) -> bool {
    let (counters, templates) = (&setup.counters, &setup.templates);
    let stan = term.next_stan();
    // Remembered from the start: an extra acknowledgement can come as soon
    // as the first one has.
    setup.uplink.advice_sent((term.f41, stan));
    let mut acked = false;
    for attempt in 0..=setup.traffic.advice_repeats {
        let (template, sent) = if attempt == 0 {
            (&templates.advice, &counters.advices_sent)
        } else {
            (&templates.advice_repeat, &counters.advice_repeats)
        };
        let Some(outcome) = send(term, setup, template, stan).await else {
            return false;
        };
        sent.fetch_add(1, Ordering::Relaxed);
        match wait(term, setup, stan, outcome).await {
            Answer::TimedOut => continue,
            Answer::Came(Outcome::Mismatched) => {
                counters.mismatched.fetch_add(1, Ordering::Relaxed);
            }
            // An acknowledgement is an acknowledgement, whatever its F39.
            Answer::Came(Outcome::Answered | Outcome::Declined) => {
                counters.advice_acks.fetch_add(1, Ordering::Relaxed);
                acked = true;
            }
        }
        break;
    }
    if !acked {
        counters
            .advices_unacknowledged
            .fetch_add(1, Ordering::Relaxed);
    }
    true
}

/// One sign-in. `false` when the uplink is gone.
async fn sign_in(term: &mut Terminal, setup: &TerminalSetup) -> bool {
    let counters = &setup.counters;
    let stan = term.next_stan();
    let Some(outcome) = send(term, setup, &setup.templates.sign_in, stan).await else {
        return false;
    };
    counters.sign_ins_sent.fetch_add(1, Ordering::Relaxed);
    let counter = match wait(term, setup, stan, outcome).await {
        Answer::Came(Outcome::Answered | Outcome::Declined) => &counters.sign_ins_answered,
        Answer::Came(Outcome::Mismatched) => &counters.mismatched,
        Answer::TimedOut => &counters.sign_ins_unanswered,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    true
}

async fn read_uplink(
    spec: Arc<Spec>,
    read: crate::tls::LinkRead,
    uplink: Arc<Uplink>,
    counters: Arc<Counters>,
) {
    let mut frames = FramedRead::new(
        read,
        FrameCodec::new(spec.framing().prefix, spec.framing().max_frame),
    );
    while let Some(frame) = frames.next().await {
        let payload = match frame {
            Ok(Frame::Message(p)) => p,
            Ok(_) => continue,
            Err(_) => break,
        };
        match classify(&spec, &uplink, payload) {
            Some(Matched::Waiting) => {}
            Some(Matched::ExtraAdviceAck) => {
                counters.advice_acks_extra.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                counters.mismatched.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    counters.uplinks_lost.fetch_add(1, Ordering::Relaxed);
}

/// What a response read on an uplink answered.
enum Matched {
    /// A message a terminal waits for (the outcome goes to it).
    Waiting,
    /// An advice sent on this uplink, no longer waited for (acknowledged,
    /// given up, or between a timeout and its repeat).
    ExtraAdviceAck,
}

/// Matches a response to a waiting terminal on this uplink; `None` if it matches
/// nothing here (it crossed from another uplink, or is garbage).
fn classify(spec: &Spec, uplink: &Uplink, payload: Bytes) -> Option<Matched> {
    let msg = Message::parse(spec, payload).ok()?;
    let f41: [u8; 8] = msg.field(41).ok()??.data().try_into().ok()?;
    let f11: [u8; 3] = msg.field(11).ok()??.data().try_into().ok()?;
    let tpdu = msg.tpdu()?;
    let Some(expected) = lock(&uplink.waiting).remove(&(f41, f11)) else {
        let advice_ack = msg.mti().function() == 3 && uplink.advice_was_sent(&(f41, f11));
        return advice_ack.then_some(Matched::ExtraAdviceAck);
    };
    let outcome = if tpdu != expected.tpdu || msg.mti() != expected.mti {
        Outcome::Mismatched
    } else if msg
        .field(39)
        .ok()
        .flatten()
        .is_some_and(|f| f.eq_logical(b"00"))
    {
        Outcome::Answered
    } else {
        Outcome::Declined
    };
    let _ = expected.done.send(outcome);
    Some(Matched::Waiting)
}

/// The purchase (`0200`), advice (`0220`, `0221`) and sign-in (`0800`)
/// templates: the advices carry the purchase's fields.
fn templates(spec: &Spec) -> Result<Templates, String> {
    let purchase = crate::sim::sample_request(spec, "0200")?;
    let purchase_fields = Message::parse(spec, purchase.clone())
        .and_then(|m| m.decode())
        .map_err(|e| e.to_string())?;
    let with_mti = |mti: &[u8; 4]| -> Result<Template, String> {
        let mut d = purchase_fields.clone();
        d.mti = Mti::new(*mti).ok_or("bad MTI")?;
        template(spec, &d)
    };
    Ok(Templates {
        purchase: template(spec, &purchase_fields)?,
        advice: with_mti(b"0220")?,
        advice_repeat: with_mti(b"0221")?,
        sign_in: template(spec, &sign_in_fields(spec)?)?,
    })
}

/// A POS sign-in: `0800` with F11, F41, F42, F60 (network code `003`) and
/// F63 (operator), as a terminal sends it to get its working keys.
fn sign_in_fields(spec: &Spec) -> Result<Decoded, String> {
    let mti = Mti::new(*b"0800").ok_or("bad MTI")?;
    let mut d = Decoded::new(samples::envelope(spec), mti);
    for id in [11, 41, 42] {
        if let Some(v) = samples::value(id) {
            d.set(id, v);
        }
    }
    for (id, text) in [(60, "00000001003"), (63, "001")] {
        if spec.field(id).is_some() {
            d.set_text(id, text);
        }
    }
    Ok(d)
}

fn template(spec: &Spec, d: &Decoded) -> Result<Template, String> {
    let payload = Bytes::from(spec.encode(d).map_err(|e| e.to_string())?);
    let msg = Message::parse(spec, payload.clone()).map_err(|e| e.to_string())?;
    let range = |id: u16| -> Result<std::ops::Range<usize>, String> {
        msg.field(id)
            .map_err(|e| e.to_string())?
            .map(|f| f.range())
            .ok_or_else(|| format!("spec `{}` sample has no F{id}", spec.name()))
    };
    let (f11, f41) = (range(11)?, range(41)?);
    if f11.len() != 3 || f41.len() != 8 || msg.tpdu().is_none() {
        return Err("sim nac needs a POS spec: TPDU, F11 BCD n6, F41 ans8".into());
    }
    let answer = response_mti(d.mti).ok_or("a template is a request")?;
    Ok(Template {
        payload,
        f11,
        f41,
        answer,
    })
}
