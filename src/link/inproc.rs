//! The switch's per-message path in one process, without sockets, for the
//! benchmarks and the allocation test: a real [`Service`] built from a
//! config, whose node connections are channels the rig drains instead of
//! TCP writers. A request goes the way a front reader sends it (frame cut →
//! [`Service::on_request`]: validation, key, pick, stamp, correlator insert,
//! node queue) and is then encoded as the node writer encodes it; a response
//! goes the way a node reader sends it ([`Service::on_node_frame`]: validation,
//! key, correlator take, health, client queue) and is encoded as the client
//! writer encodes it. Only the sockets and the tasks around them are left out.
//!
//! The rig keeps its own clock ([`Rig::now`], moved by [`Rig::advance`]) and
//! hands it to every call into the service, since every timing decision there
//! (deadlines, the sweep, late answers, the duplicate window, repeats,
//! ejection) takes the caller's `now`: a test steps past a deadline to the
//! millisecond and sleeps for none of it. A rig is built from a typed
//! [`ServiceConfig`] ([`Rig::from_config`]) or from TOML ([`Rig::new`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tokio_util::codec::Decoder;

use super::back::pool::ConnHandle;
use super::front::admission::client::{ClientLink, InFlightLimit};
use super::io::writer::{Outbound, encode_into};
use super::service::Service;
use crate::config::{Config, ServiceConfig};
use crate::iso8583::{MtiEncoding, Spec};
use crate::journal::{Entry, Journal};
use crate::wire::{Frame, FrameCodec, LengthPrefix};

/// Queue depth of the rig's channels: the most requests a caller may leave
/// unanswered at once.
pub const RIG_QUEUE: usize = 4096;

/// The read buffer's size. As in a reader, frames are cut off it and shared
/// with the path (the correlator keeps each request); once it is used up,
/// `bytes` reclaims it in place or replaces it (in the allocation test
/// about every second buffer is replaced: counted apart there).
pub const READ_BUFFER: usize = 64 * 1024;

/// One service with channel-backed node connections and one client.
pub struct Rig {
    pub service: Arc<Service>,
    client: ClientLink,
    client_rx: mpsc::Receiver<Outbound>,
    nodes: Vec<mpsc::Receiver<Outbound>>,
    prefix: LengthPrefix,
    codec: FrameCodec,
    /// Bytes as a reader would have them after `read`, cut into frames.
    inbound: BytesMut,
    /// Bytes as a writer would write them.
    outbound: BytesMut,
    /// With [`Rig::with_journal`]: the rows the path queued for the
    /// journal's writer.
    journal: Option<mpsc::Receiver<Entry>>,
    /// The sweeper's scratch for [`Rig::expire`] and [`Rig::expire_all`].
    expired: Vec<(crate::route::CorrelationKey, crate::link::service::Pending)>,
    /// The rig's clock: what every call into the service is told the time
    /// is. Set at construction; only [`Rig::advance`] moves it.
    now: Instant,
    /// [`Rig::on_wall_clock`]: each message reads the time, as a reader
    /// does per frame, instead of the rig's clock.
    wall_clock: bool,
}

/// Why a rig could not be built or a message did not go through.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    #[error("config: {0}")]
    Config(String),
    #[error("frame: {0}")]
    Frame(String),
    #[error("no frame came out where one was expected: {0}")]
    Nothing(&'static str),
}

impl Rig {
    /// The first service of `toml`, its nodes connected through channels.
    pub fn new(toml: &str) -> Result<Rig, RigError> {
        let cfg = Config::from_toml(toml).map_err(|e| RigError::Config(e.to_string()))?;
        let svc_cfg = cfg
            .services
            .into_iter()
            .next()
            .ok_or(RigError::Config("no [[service]]".into()))?;
        Rig::from_config(svc_cfg)
    }

    /// A rig for one service's config as it is: a test sets the keys it is
    /// about as typed fields instead of writing TOML. The config is taken as
    /// given (a loaded one was validated; a test's edits are its own).
    pub fn from_config(svc_cfg: ServiceConfig) -> Result<Rig, RigError> {
        let spec: Spec = svc_cfg
            .load_spec()
            .map_err(|e| RigError::Config(e.to_string()))?;
        let now = Instant::now();
        let service = Arc::new(
            Service::new(svc_cfg, spec, now).map_err(|e| RigError::Config(e.to_string()))?,
        );
        let mut nodes = Vec::new();
        for index in 0..service.pool.nodes().len() {
            let (tx, rx) = mpsc::channel(RIG_QUEUE);
            let handle = ConnHandle {
                id: 1_000_000 + index as u64,
                tx: tx.into(),
            };
            service.pool.set_conn(index, 0, Some(handle), now);
            nodes.push(rx);
        }
        let (tx, client_rx) = mpsc::channel(RIG_QUEUE);
        let client = ClientLink {
            conn: service.links.next_conn_id(),
            peer: SocketAddr::from(([127, 0, 0, 1], 40_000)),
            tx: tx.into(),
            in_flight: InFlightLimit::new(RIG_QUEUE),
            source_in_flight: InFlightLimit::new(RIG_QUEUE),
        };
        let framing = service.spec().framing();
        Ok(Rig {
            client,
            client_rx,
            nodes,
            prefix: framing.prefix,
            codec: FrameCodec::new(framing.prefix, framing.max_frame),
            inbound: BytesMut::with_capacity(READ_BUFFER),
            outbound: BytesMut::with_capacity(64 * 1024),
            expired: Vec::new(),
            journal: None,
            service,
            now,
            wall_clock: false,
        })
    }

    /// The same rig telling the service the real time at each message, as
    /// the front and node readers do (one clock read per frame): what the
    /// path benchmark counts. A test's rig keeps its own clock.
    pub fn on_wall_clock(mut self) -> Rig {
        self.wall_clock = true;
        self
    }

    /// The time a message is handled at: the rig's clock, or the wall
    /// clock's ([`Rig::on_wall_clock`]).
    #[inline]
    fn message_time(&self) -> Instant {
        if self.wall_clock {
            Instant::now()
        } else {
            self.now
        }
    }

    /// The same rig with the journal on, as `[journal] enabled = true` has
    /// it: each exchange becomes a row on the message path and is queued
    /// for the journal's writer. Here the rig drains the queue
    /// ([`Rig::drain_journal`]) and nothing is stored. What is left on the
    /// path is the row's cost to the workers.
    pub fn with_journal(mut self) -> Result<Rig, RigError> {
        let (journal, rx) = Journal::channel(RIG_QUEUE);
        // Before any message, as `run` does: the router then indexes the
        // row's fields too.
        Arc::get_mut(&mut self.service)
            .ok_or(RigError::Config(
                "the rig's service is already shared".into(),
            ))?
            .set_journal(journal);
        self.journal = Some(rx);
        Ok(self)
    }

    /// Drops the rows queued since the last call, the writer's side of the
    /// queue; how many there were.
    pub fn drain_journal(&mut self) -> usize {
        let Some(rx) = self.journal.as_mut() else {
            return 0;
        };
        let mut rows = 0;
        while rx.try_recv().is_ok() {
            rows += 1;
        }
        rows
    }

    /// A request frame (length prefix included) from the client: routed and
    /// encoded for its node. Returns the node it went to and the bytes its
    /// writer would write (a switch-made decline goes to the client instead:
    /// then `None`, and [`Rig::client_bytes`] has it).
    // Never inlined: scripts/path-ir.sh counts this function inclusively by
    // its symbol, which cross-crate LTO would otherwise dissolve into the bench.
    #[inline(never)]
    pub fn request(&mut self, frame: &[u8]) -> Result<Option<(usize, &[u8])>, RigError> {
        let payload = self.cut(frame)?;
        let now = self.message_time();
        self.service.on_request(&self.client, payload, now);
        for (node, rx) in self.nodes.iter_mut().enumerate() {
            if let Ok(out) = rx.try_recv() {
                self.outbound.clear();
                encode_into(self.prefix, &out, &mut self.outbound)
                    .map_err(|e| RigError::Frame(e.to_string()))?;
                return Ok(Some((node, &self.outbound[..])));
            }
        }
        Ok(None)
    }

    /// A response frame from `node`: correlated and encoded for the client.
    /// Returns the bytes the client's writer would write.
    // Never inlined: scripts/path-ir.sh counts this function inclusively by
    // its symbol, which cross-crate LTO would otherwise dissolve into the bench.
    #[inline(never)]
    pub fn response(&mut self, node: usize, frame: &[u8]) -> Result<&[u8], RigError> {
        let payload = self.cut(frame)?;
        let now = self.message_time();
        self.service
            .on_node_frame(node, 1_000_000 + node as u64, payload, now);
        self.client_bytes()?
            .ok_or(RigError::Nothing("no answer queued for the client"))?;
        Ok(&self.outbound[..])
    }

    /// A frame from `node` that owes the client nothing: a late answer, an
    /// answer to a repeat already answered, a stray. Whatever the service
    /// queues for the client waits in [`Rig::client_bytes`].
    pub fn node_frame(&mut self, node: usize, frame: &[u8]) -> Result<(), RigError> {
        let payload = self.cut(frame)?;
        self.service
            .on_node_frame(node, 1_000_000 + node as u64, payload, self.now);
        Ok(())
    }

    /// One attempt of an owed message addressed to a node (a reversal, a
    /// pinned advice) that the caller claimed from the service's store, made
    /// as the delivery loop (`link::saf`) makes it, at the rig's clock:
    /// registered in the correlation table until the rig's clock passes its
    /// wait, and queued for its node ([`Rig::node_bytes`]). The node's answer
    /// ([`Rig::node_frame`]) completes it or schedules the next attempt. (An
    /// advice's first attempt is pinned by a store write first, then sent on
    /// the real clock: see `saf::send_claimed`.)
    pub fn send_owed(&mut self, entry: crate::store::ClaimedSaf) {
        super::saf::send_claimed(&self.service, entry, self.now);
    }

    /// The next frame queued for a node outside [`Rig::request`] (an owed
    /// message): which node, and the bytes its writer would write.
    pub fn node_bytes(&mut self) -> Result<Option<(usize, &[u8])>, RigError> {
        let queued = self
            .nodes
            .iter_mut()
            .enumerate()
            .find_map(|(node, rx)| rx.try_recv().ok().map(|out| (node, out)));
        let Some((node, out)) = queued else {
            return Ok(None);
        };
        self.outbound.clear();
        encode_into(self.prefix, &out, &mut self.outbound)
            .map_err(|e| RigError::Frame(e.to_string()))?;
        Ok(Some((node, &self.outbound[..])))
    }

    /// The rig's clock: the time the service was last told.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Moves the rig's clock on by `by`. Nothing runs by itself: what falls
    /// due is acted on by the next call (the sweep is [`Rig::expire`]).
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    /// Runs the sweeper once at the rig's clock, as the service's sweeper
    /// task (`link::sweep`) does: declines what has passed its deadline (a
    /// timeout: the switch answers for its node) and forgets the late and
    /// repeat records past their windows. Returns how many were declined;
    /// the declines wait in [`Rig::client_bytes`].
    pub fn expire(&mut self) -> usize {
        let declined = self.service.expire(self.now, &mut self.expired);
        // The task does this once a second; a test's sweep is a whole tick.
        self.service.made.sweep(self.now);
        declined
    }

    /// Lets every request in flight pass its deadline: each is declined as
    /// the sweeper declines it (a timeout: the switch answers for its
    /// node). Returns how many; the declines wait in [`Rig::client_bytes`].
    // Never inlined: scripts/path-ir.sh counts it by its symbol.
    #[inline(never)]
    // On the real clock, not the rig's: the bench's measure of the sweep is
    // left as it was. Tests step the rig's clock and call [`Rig::expire`].
    pub fn expire_all(&mut self) -> usize {
        let later = Instant::now() + Duration::from_secs(3600);
        self.service.expire(later, &mut self.expired)
    }

    /// The next frame queued for the client, encoded, if any.
    pub fn client_bytes(&mut self) -> Result<Option<&[u8]>, RigError> {
        let Ok(out) = self.client_rx.try_recv() else {
            return Ok(None);
        };
        self.outbound.clear();
        encode_into(self.prefix, &out, &mut self.outbound)
            .map_err(|e| RigError::Frame(e.to_string()))?;
        Ok(Some(&self.outbound[..]))
    }

    /// Cuts one frame the way a reader does: appended to the read buffer and
    /// split off it by the frame codec.
    fn cut(&mut self, frame: &[u8]) -> Result<Bytes, RigError> {
        self.inbound.extend_from_slice(frame);
        match self.codec.decode(&mut self.inbound) {
            Ok(Some(Frame::Message(payload))) => Ok(payload),
            Ok(Some(_)) => Err(RigError::Frame("not a message frame".into())),
            Ok(None) => Err(RigError::Frame("incomplete frame".into())),
            Err(e) => Err(RigError::Frame(e.to_string())),
        }
    }
}

/// A node's answer to `request` (a payload without its length prefix): the
/// same message with the response MTI, as a channel node that echoes every
/// field would send it. Built here, not by the switch's own decline code, so
/// the rig does not answer with what it measures.
pub fn echo_response(spec: &Spec, request: &[u8]) -> Option<Vec<u8>> {
    let layout = spec.layout(request).ok()?;
    let mut out = request.to_vec();
    let at = layout.mti_at;
    // The third MTI digit: 0 (request) → 1 (response). ASCII and EBCDIC
    // digits keep the digit in the low nibble; BCD packs digits 3-4 in the
    // second byte's high nibble.
    match spec.mti_encoding() {
        MtiEncoding::Bcd => *out.get_mut(at + 1)? |= 0x10,
        MtiEncoding::Ascii | MtiEncoding::Ebcdic => *out.get_mut(at + 2)? |= 0x01,
    }
    Some(out)
}

/// A `listen` service on `spec` in front of three nodes (never dialled: the
/// rig gives them channels), with the node ID stamped into F37 when `stamp`.
pub fn service_toml(spec: &str, stamp: bool) -> String {
    let stamp = if stamp {
        "f37_stamp = { offset = 10, width = 2 }\n"
    } else {
        ""
    };
    let mut toml = format!(
        "[[service]]\nname = \"path\"\nspec = \"{spec}\"\n{stamp}\
         [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\n"
    );
    for n in 1..=3 {
        toml += &format!("[[service.back.node]]\nid = \"0{n}\"\naddress = \"127.0.0.1:9\"\n");
    }
    toml
}

/// `n` distinct 0200 purchases for `spec` (STANs 1..=n), each as a frame
/// with its length prefix, and the rig's answers to them come from
/// [`Rig::answer_frame`].
pub fn purchase_frames(spec: &Spec, n: usize) -> Result<Vec<Vec<u8>>, RigError> {
    purchase_round(spec, n, 0)
}

/// The purchases of [`purchase_frames`] sent again as new transactions:
/// round `round` changes a field the duplicate check tells transactions
/// apart by (`integrity.duplicate_fields`) that is not in the spec's
/// correlation key: F7 (the transmission time), or F41 where F7 is part of
/// the key (UnionPay). So a round is not taken for duplicates of the last
/// one, and the node's answers to round 0 still match every round.
pub fn purchase_round(spec: &Spec, n: usize, round: u32) -> Result<Vec<Vec<u8>>, RigError> {
    let mut d = crate::iso8583::samples::purchase(spec);
    let in_key = crate::route::default_key(spec).contains(&crate::route::KeyPart::Field(7));
    if in_key {
        d.set_text(41, format!("{:08}", round % 100_000_000));
    } else {
        d.set_text(7, format!("1206{:06}", round % 1_000_000));
    }
    (1..=n)
        .map(|stan| {
            d.set_text(11, format!("{:06}", stan % 1_000_000));
            let payload = spec
                .encode(&d)
                .map_err(|e| RigError::Frame(e.to_string()))?;
            frame(spec.framing().prefix, &payload)
        })
        .collect()
}

/// `payload` behind its length prefix.
pub fn frame(prefix: LengthPrefix, payload: &[u8]) -> Result<Vec<u8>, RigError> {
    let mut out = Vec::with_capacity(payload.len() + 4);
    prefix
        .encode(payload.len(), &mut out)
        .map_err(|e| RigError::Frame(e.to_string()))?;
    out.extend_from_slice(payload);
    Ok(out)
}

impl Rig {
    /// The frame a node sends back for the request frame it was written
    /// (`node_bytes`, as [`Rig::request`] returned them).
    pub fn answer_frame(&self, node_bytes: &[u8]) -> Result<Vec<u8>, RigError> {
        let spec = self.service.spec();
        let at = self.prefix.len();
        let payload = node_bytes
            .get(at..)
            .ok_or(RigError::Frame("shorter than its prefix".into()))?;
        let answer =
            echo_response(spec, payload).ok_or(RigError::Frame("request does not parse".into()))?;
        frame(self.prefix, &answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rig on `cups` with the default deadline (`timeouts.request`, 3 s)
    /// and one purchase in flight to a node.
    fn one_in_flight() -> Rig {
        let mut rig = Rig::new(&service_toml("cups", false)).expect("rig");
        let frames = purchase_frames(rig.service.spec(), 1).expect("frames");
        let sent = rig.request(&frames[0]).expect("routed");
        assert!(sent.is_some(), "at a node");
        rig
    }

    /// The sweep reads the rig's clock: nothing is due a millisecond before
    /// the deadline, the request is declined at it, and real time passing
    /// meanwhile changes nothing.
    #[test]
    fn the_sweep_runs_on_the_rigs_clock() {
        let mut rig = one_in_flight();
        let start = rig.now();
        rig.advance(Duration::from_millis(2_999));
        assert_eq!(rig.expire(), 0);
        assert_eq!(rig.now() - start, Duration::from_millis(2_999));
        assert!(rig.client_bytes().expect("encodes").is_none());
        rig.advance(Duration::from_millis(1));
        assert_eq!(rig.expire(), 1);
        assert!(
            rig.client_bytes().expect("encodes").is_some(),
            "the decline"
        );
        assert_eq!(rig.expire(), 0, "once");
    }

    /// A typed config builds the same rig as its TOML.
    #[test]
    fn from_config_takes_a_typed_service() {
        let cfg = Config::from_toml(&service_toml("cups", true)).expect("config");
        let svc = cfg.services.into_iter().next().expect("a service");
        let rig = Rig::from_config(svc).expect("rig");
        assert_eq!(rig.nodes.len(), 3);
        assert_eq!(rig.service.name(), "path");
    }

    /// The bench's sweep stays on the real clock (an hour past it): it
    /// declines what is in flight without moving the rig's clock.
    #[test]
    fn expire_all_declines_everything_in_flight() {
        let mut rig = one_in_flight();
        let before = rig.now();
        assert_eq!(rig.expire_all(), 1);
        assert!(rig.client_bytes().expect("encodes").is_some());
        assert_eq!(rig.now(), before);
    }
}
