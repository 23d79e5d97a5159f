//! Replaying a capture as a peer of the switch: replay plays one end of the
//! captured links — UnionPay on a simplex front, VISA on a connect front —
//! whichever end opened each TCP connection. It accepts the connections the
//! switch opens to the peer (`accept`: out links, duplex links) and opens the
//! connections the peer opened to the switch (`connect`: in links), sends on
//! each the requests the peer sent on its captured counterpart, and matches
//! the answers on any of these links (a simplex answer comes back on another
//! connection than its request) by response MTI, F11 and F41.
//!
//! The switch's own requests reaching the peer (echo tests, sign-ons, node
//! acquirer requests) are answered, so the links stay up: with the answer the
//! capture holds for the same key (the request's F37 node stamp put back, so
//! the switch can route it), else, for network management, an approval made
//! from the request; others are left unanswered. They are counted
//! (`unsolicited`), not compared: what they carry comes from the nodes and the
//! switch, not from the capture.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedRead;

use super::read::{CapturedFrame, Connection, frames};
use super::replay::{Clock, Key, ReplayOptions, Report, compare, key_of};
use crate::iso8583::Spec;
use crate::wire::{Frame, FrameCodec};

/// The peer's links: which captured connections to play and how.
pub struct PeerLinks {
    /// Connections the switch opened to the peer, by their captured server
    /// port, and the listener the switch now connects to instead.
    pub accept: Vec<(u16, TcpListener)>,
    /// Connections the peer opened to the switch, by their captured server
    /// port, and where to open them now.
    pub connect: Vec<(u16, SocketAddr)>,
}

/// One captured connection as the peer played it.
struct Script {
    number: usize,
    /// The peer accepted it (the switch connected).
    accepted: bool,
    /// Captured server port: which listener or target it belongs to.
    port: u16,
    requests: Vec<Request>,
    /// The peer sent messages on it in the capture (a simplex out link: no).
    sends: bool,
}

struct Request {
    at: Duration,
    /// Answers the peer had received (on any link) before it sent this one.
    after_answers: usize,
    frame: Bytes,
    key: Key,
    label: String,
}

/// What the links share while the replay runs.
struct Session {
    spec: Arc<Spec>,
    state: Mutex<State>,
    /// Answers received so far (requests wait on it to keep the captured order).
    answers: watch::Sender<usize>,
    /// Writers of the links the peer sends on, for answers to the switch.
    senders: Mutex<Vec<mpsc::UnboundedSender<Bytes>>>,
    next_sender: AtomicUsize,
}

#[derive(Default)]
struct State {
    /// Key → requests (by index) waiting for that answer, oldest first.
    waiting: HashMap<Key, VecDeque<usize>>,
    got: Vec<Option<Bytes>>,
    /// The answers the peer gave in the capture, by key.
    own_answers: HashMap<Key, VecDeque<Bytes>>,
    report: Report,
}

/// Plays the peer of `conns` (the whole capture; links are picked by port).
pub async fn replay_peer(
    spec: Arc<Spec>,
    conns: &[Connection],
    links: PeerLinks,
    opts: &ReplayOptions,
) -> Report {
    let accept_ports: Vec<u16> = links.accept.iter().map(|(p, _)| *p).collect();
    let connect_ports: Vec<u16> = links.connect.iter().map(|(p, _)| *p).collect();
    let played: Vec<&Connection> = conns
        .iter()
        .filter(|c| {
            accept_ports.contains(&c.server.port()) || connect_ports.contains(&c.server.port())
        })
        .collect();
    let (scripts, expected, own_answers) = script(&spec, &played, &accept_ports);
    let total: usize = scripts.iter().map(|s| s.requests.len()).sum();
    let (answers, _) = watch::channel(0usize);
    let session = Arc::new(Session {
        spec: Arc::clone(&spec),
        state: Mutex::new(State {
            got: vec![None; total],
            own_answers,
            ..State::default()
        }),
        answers,
        senders: Mutex::new(Vec::new()),
        next_sender: AtomicUsize::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    let mut report = Report::default();
    let opened = match open_links(&session, &scripts, links, opts, &mut tasks).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let origin = scripts
        .iter()
        .filter_map(|s| s.requests.first().map(|r| r.at))
        .min()
        .unwrap_or_default();
    let clock = Clock::new(origin, opts);
    // Each link sends its requests in captured order; indices are global.
    let mut senders = tokio::task::JoinSet::new();
    let mut first = 0;
    for (script, tx) in scripts.iter().zip(opened) {
        let n = script.requests.len();
        let requests: Vec<(usize, Bytes, Key, Duration, usize)> = script
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    first + i,
                    r.frame.clone(),
                    r.key.clone(),
                    r.at,
                    r.after_answers,
                )
            })
            .collect();
        first += n;
        report.connections += 1;
        let session = Arc::clone(&session);
        let clock = clock.clone();
        let timeout = opts.timeout;
        senders.spawn(async move {
            let mut answered = session.answers.subscribe();
            let mut sent = 0;
            for (i, frame, key, at, after) in requests {
                let _ = tokio::time::timeout(timeout, answered.wait_for(|n| *n >= after)).await;
                clock.wait_until(at).await;
                clock.pace().await;
                session.lock().waiting.entry(key).or_default().push_back(i);
                if tx.send(frame).is_err() {
                    break;
                }
                sent += 1;
            }
            sent
        });
    }
    while let Some(r) = senders.join_next().await {
        report.replayed += r.unwrap_or(0);
    }
    // The remaining answers, each within the timeout of the one before.
    let mut answered = session.answers.subscribe();
    loop {
        if session.lock().waiting.values().all(VecDeque::is_empty) {
            break;
        }
        match tokio::time::timeout(opts.timeout, answered.changed()).await {
            Ok(Ok(())) => {}
            _ => break,
        }
    }
    tasks.abort_all();
    session
        .senders
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    let mut state = std::mem::take(&mut *session.lock());
    let got = std::mem::take(&mut state.got);
    let requests = scripts.iter().flat_map(|s| {
        s.requests
            .iter()
            .map(move |r| (format!("connection {} {}", s.number, r.label), r))
    });
    let mut expected = expected;
    for ((what, r), answer) in requests.zip(got) {
        let wanted = expected.get_mut(&r.key).and_then(VecDeque::pop_front);
        let outcome = compare(&spec, wanted.as_deref(), answer.as_deref(), &opts.ignore);
        state.report.tally(&what, outcome);
    }
    report.add(state.report);
    report
}

impl Session {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One frame from the switch on any link: an answer to one of the
    /// peer's requests, or a request of the switch's to answer.
    fn take(&self, payload: Bytes, link: &mpsc::UnboundedSender<Bytes>, link_sends: bool) {
        let Some((key, is_request)) = key_of(&self.spec, &payload) else {
            let mut s = self.lock();
            s.report.unexpected += 1;
            s.report
                .details
                .push("an answer that does not decode".into());
            return;
        };
        if is_request {
            let answer = self.answer(&payload, &key);
            let mut s = self.lock();
            s.report.unsolicited += 1;
            drop(s);
            if let Some(a) = answer {
                self.send_answer(a, link, link_sends);
            }
            return;
        }
        let mut s = self.lock();
        match s.waiting.get_mut(&key).and_then(VecDeque::pop_front) {
            Some(i) => {
                if let Some(slot) = s.got.get_mut(i) {
                    *slot = Some(payload);
                }
                drop(s);
                self.answers.send_modify(|n| *n += 1);
            }
            None => {
                s.report.unexpected += 1;
                s.report.details.push(format!(
                    "an answer {} F11={} F41={} matches no replayed request",
                    key.mti, key.stan, key.terminal
                ));
            }
        }
    }

    /// The peer's answer to a request of the switch, framed: the captured one
    /// for this key with the request's F37 (the switch's node stamp), else an
    /// approval for network management.
    fn answer(&self, request: &[u8], key: &Key) -> Option<Bytes> {
        let spec = &self.spec;
        let req = spec.decode(request).ok()?;
        let captured = self
            .lock()
            .own_answers
            .get_mut(key)
            .and_then(VecDeque::pop_front);
        let answer = match captured.and_then(|c| spec.decode(&c).ok()) {
            Some(mut a) => {
                if let Some(stamp) = req.get(37).cloned().filter(|_| a.get(37).is_some()) {
                    a.set(37, stamp);
                }
                a
            }
            None if req.mti.is_network_management() => spec.respond(&req, "00").ok()?,
            None => return None,
        };
        let payload = spec.encode(&answer).ok()?;
        let mut out = BytesMut::new();
        spec.framing().prefix.encode(payload.len(), &mut out).ok()?;
        out.extend_from_slice(&payload);
        Some(out.freeze())
    }

    /// On the link the request came on if the peer sends there (duplex),
    /// else on the next link it sends on (simplex: out link in, in link out).
    fn send_answer(&self, frame: Bytes, link: &mpsc::UnboundedSender<Bytes>, link_sends: bool) {
        if link_sends && link.send(frame.clone()).is_ok() {
            return;
        }
        let senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        if senders.is_empty() {
            return;
        }
        let at = self.next_sender.fetch_add(1, Ordering::Relaxed);
        for k in 0..senders.len() {
            if senders[(at + k) % senders.len()]
                .send(frame.clone())
                .is_ok()
            {
                return;
            }
        }
    }
}

type Expected = HashMap<Key, VecDeque<Bytes>>;

/// The scripts of the played connections (accepted ones first, in captured
/// order), the answers the peer received in the capture, by key, and the
/// answers it gave.
fn script(
    spec: &Spec,
    played: &[&Connection],
    accept_ports: &[u16],
) -> (Vec<Script>, Expected, HashMap<Key, VecDeque<Bytes>>) {
    let mut expected: Expected = HashMap::new();
    let mut own: HashMap<Key, VecDeque<Bytes>> = HashMap::new();
    let mut answer_times = Vec::new();
    let mut sent: Vec<(usize, Vec<CapturedFrame>, bool)> = Vec::new();
    for (i, c) in played.iter().enumerate() {
        let accepted = accept_ports.contains(&c.server.port());
        // The peer is the server of an accepted connection, the client of the others.
        let (out, inn) = if accepted {
            (&c.to_client, &c.to_server)
        } else {
            (&c.to_server, &c.to_client)
        };
        for f in frames(spec, inn).0 {
            if let Frame::Message(p) = &f.frame
                && let Some((k, false)) = key_of(spec, p)
            {
                answer_times.push(f.at);
                expected.entry(k).or_default().push_back(p.clone());
            }
        }
        let out = frames(spec, out).0;
        let sends = out.iter().any(|f| matches!(f.frame, Frame::Message(_)));
        sent.push((i, out, sends));
    }
    let mut scripts = Vec::new();
    for (i, out, sends) in sent {
        let c = played[i];
        let mut requests = Vec::new();
        for f in out {
            let Frame::Message(p) = &f.frame else {
                continue;
            };
            match key_of(spec, p) {
                Some((key, true)) => {
                    let mut frame = BytesMut::new();
                    if spec.framing().prefix.encode(p.len(), &mut frame).is_err() {
                        continue;
                    }
                    frame.extend_from_slice(p);
                    let mti = spec
                        .layout(p)
                        .map(|l| l.mti.to_string())
                        .unwrap_or_default();
                    requests.push(Request {
                        at: f.at,
                        after_answers: answer_times.iter().filter(|&&t| t < f.at).count(),
                        frame: frame.freeze(),
                        label: format!("{mti} F11={} F41={}", key.stan, key.terminal),
                        key,
                    });
                }
                Some((key, false)) => own.entry(key).or_default().push_back(p.clone()),
                None => {}
            }
        }
        scripts.push(Script {
            number: c.number,
            accepted: accept_ports.contains(&c.server.port()),
            port: c.server.port(),
            requests,
            sends,
        });
    }
    scripts.sort_by_key(|s| (!s.accepted, s.port, played_at(played, s.number)));
    (scripts, expected, own)
}

fn played_at(played: &[&Connection], number: usize) -> Duration {
    played
        .iter()
        .find(|c| c.number == number)
        .map_or(Duration::ZERO, |c| c.first_at)
}

/// Accepts the switch's connections (as many per port as the capture has),
/// then opens the peer's; each link gets a reader and a writer task. Returns
/// each script's writer, in script order. Links the switch opens beyond the
/// captured ones are served too (answers only).
async fn open_links(
    session: &Arc<Session>,
    scripts: &[Script],
    links: PeerLinks,
    opts: &ReplayOptions,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Result<Vec<mpsc::UnboundedSender<Bytes>>, Report> {
    let mut out: Vec<Option<mpsc::UnboundedSender<Bytes>>> = vec![None; scripts.len()];
    let mut failed = Report::default();
    for (port, listener) in links.accept {
        let wanted = scripts
            .iter()
            .enumerate()
            .filter(|(_, s)| s.accepted && s.port == port);
        let mut sends = false;
        for (i, s) in wanted {
            sends |= s.sends;
            match tokio::time::timeout(opts.timeout, listener.accept()).await {
                Ok(Ok((stream, _))) => out[i] = Some(start_link(session, stream, s.sends, tasks)),
                _ => failed.link_failed(
                    s.number,
                    format!("the switch did not connect to the peer's port {port} in time"),
                ),
            }
        }
        // Reconnects and links beyond the capture: served, nothing scripted.
        let session = Arc::clone(session);
        tasks.spawn(async move {
            let mut served = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                start_link(&session, stream, sends, &mut served);
            }
        });
    }
    for (port, target) in links.connect {
        let wanted = scripts
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.accepted && s.port == port);
        for (i, s) in wanted {
            match tokio::time::timeout(opts.timeout, TcpStream::connect(target)).await {
                Ok(Ok(stream)) => out[i] = Some(start_link(session, stream, s.sends, tasks)),
                Ok(Err(e)) => {
                    failed.link_failed(s.number, format!("cannot connect to {target}: {e}"))
                }
                Err(_) => failed.link_failed(s.number, format!("connect to {target} timed out")),
            }
        }
    }
    if failed.connect_errors > 0 {
        return Err(failed);
    }
    // Every script has a link: the ports not given were filtered out before.
    Ok(out.into_iter().flatten().collect())
}

impl Report {
    fn link_failed(&mut self, number: usize, why: String) {
        self.connect_errors += 1;
        self.details.push(format!("connection {number}: {why}"));
    }
}

/// Starts the reader and writer of one link; returns its writer's queue.
fn start_link(
    session: &Arc<Session>,
    stream: TcpStream,
    sends: bool,
    tasks: &mut tokio::task::JoinSet<()>,
) -> mpsc::UnboundedSender<Bytes> {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    if sends {
        session
            .senders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx.clone());
    }
    tasks.spawn(async move {
        while let Some(f) = rx.recv().await {
            if write.write_all(&f).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    });
    let framing = session.spec.framing();
    let mut frames = FramedRead::new(read, FrameCodec::new(framing.prefix, framing.max_frame));
    let session = Arc::clone(session);
    let back = tx.clone();
    tasks.spawn(async move {
        while let Some(Ok(f)) = frames.next().await {
            if let Frame::Message(p) = f {
                session.take(p, &back, sends);
            }
        }
    });
    tx
}
