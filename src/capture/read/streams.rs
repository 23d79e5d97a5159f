//! TCP reassembly: the segments of a capture grouped into connections, and
//! each direction put back in order (out of order, retransmitted and
//! overlapping segments; a missing one is a gap), with the time each byte
//! arrived.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use super::Segment;

/// One direction of a connection, reassembled.
#[derive(Clone, Debug, Default)]
pub struct Stream {
    pub bytes: Vec<u8>,
    /// `(end offset, time)`: the bytes up to `end` were there at `time`.
    pub marks: Vec<(usize, Duration)>,
    /// Bytes never captured: `(offset, length)`. Reassembly stops at the first.
    pub gaps: Vec<(usize, u64)>,
    /// Segments that brought nothing new (retransmissions).
    pub retransmitted: usize,
    /// Segments that arrived before the bytes ahead of them.
    pub out_of_order: usize,
}

impl Stream {
    /// When the byte at `offset` (exclusive end) had arrived.
    pub fn time_at(&self, end: usize) -> Duration {
        let i = self.marks.partition_point(|&(e, _)| e < end);
        self.marks
            .get(i)
            .or(self.marks.last())
            .map_or(Duration::ZERO, |m| m.1)
    }
}

/// One TCP connection of a capture.
#[derive(Clone, Debug)]
pub struct Connection {
    /// 1-based, in order of first packet.
    pub number: usize,
    /// The end that connected (sent the SYN), or the likeliest one.
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// Whether the handshake was captured (else the client was guessed).
    pub saw_syn: bool,
    pub first_at: Duration,
    pub to_server: Stream,
    pub to_client: Stream,
}

/// Groups segments into connections and reassembles both directions.
pub fn connections(segments: &[Segment]) -> Vec<Connection> {
    // A connection is its 4-tuple; a SYN on a tuple that already carried data
    // and closed starts a new one (short connections reusing a port).
    let mut by_tuple: HashMap<(SocketAddr, SocketAddr), usize> = HashMap::new();
    let mut groups: Vec<Vec<&Segment>> = Vec::new();
    let mut closed: Vec<bool> = Vec::new();
    for s in segments {
        let key = ordered(s.src, s.dst);
        let fresh_syn = s.syn && !s.ack;
        let idx = match by_tuple.get(&key) {
            Some(&i) if !(fresh_syn && closed[i]) => i,
            _ => {
                groups.push(Vec::new());
                closed.push(false);
                by_tuple.insert(key, groups.len() - 1);
                groups.len() - 1
            }
        };
        if s.fin || s.rst {
            closed[idx] = true;
        }
        groups[idx].push(s);
    }
    groups
        .into_iter()
        .enumerate()
        .filter_map(|(i, segs)| build_connection(i + 1, &segs))
        .collect()
}

fn ordered(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b { (a, b) } else { (b, a) }
}

fn build_connection(number: usize, segs: &[&Segment]) -> Option<Connection> {
    let first = segs.first()?;
    let syn = segs.iter().find(|s| s.syn && !s.ack);
    let (client, server) = match syn {
        Some(s) => (s.src, s.dst),
        // No handshake: the end on the higher (ephemeral) port is the client.
        None if first.src.port() > first.dst.port() => (first.src, first.dst),
        None => (first.dst, first.src),
    };
    let half = |src: SocketAddr| -> Vec<&Segment> {
        segs.iter().copied().filter(|s| s.src == src).collect()
    };
    // A socket talking to itself: its two directions cannot be told apart,
    // so every segment is the client's (rather than every byte twice).
    let to_client = if server == client {
        Stream::default()
    } else {
        reassemble(&half(server))
    };
    Some(Connection {
        number,
        client,
        server,
        saw_syn: syn.is_some(),
        first_at: first.at,
        to_server: reassemble(&half(client)),
        to_client,
    })
}

/// Reassembles one direction from its segments in capture order.
pub fn reassemble(segs: &[&Segment]) -> Stream {
    let mut out = Stream::default();
    let Some(base) = initial_seq(segs) else {
        return out;
    };
    let mut next = 0u64;
    let mut pending: BTreeMap<u64, &[u8]> = BTreeMap::new();
    for s in segs {
        if s.payload.is_empty() {
            continue;
        }
        let off = u64::from(s.seq.wrapping_sub(base));
        let end = off + s.payload.len() as u64;
        if end <= next {
            out.retransmitted += 1;
            continue;
        }
        if off > next {
            out.out_of_order += 1;
            let keep = pending.get(&off).is_none_or(|p| p.len() < s.payload.len());
            if keep {
                pending.insert(off, &s.payload);
            }
            continue;
        }
        take(&mut out, &mut next, off, &s.payload);
        // What was waiting for these bytes may now follow.
        while let Some((&o, &p)) = pending.first_key_value() {
            if o > next {
                break;
            }
            pending.pop_first();
            take(&mut out, &mut next, o, p);
        }
        out.marks.push((out.bytes.len(), s.at));
    }
    if let Some((&o, _)) = pending.first_key_value() {
        out.gaps.push((out.bytes.len(), o - next));
    }
    out
}

/// Appends what `payload` at `off` holds past `next`.
fn take(out: &mut Stream, next: &mut u64, off: u64, payload: &[u8]) {
    let skip = usize::try_from(*next - off).unwrap_or(usize::MAX);
    if let Some(new) = payload.get(skip..) {
        out.bytes.extend_from_slice(new);
        *next += new.len() as u64;
    }
}

/// Sequence number of the first byte: after the SYN if captured, else the
/// lowest data sequence number (modulo 2^32, relative to the first seen).
fn initial_seq(segs: &[&Segment]) -> Option<u32> {
    if let Some(s) = segs.iter().find(|s| s.syn) {
        return Some(s.seq.wrapping_add(1));
    }
    let first = segs.iter().find(|s| !s.payload.is_empty())?.seq;
    segs.iter()
        .filter(|s| !s.payload.is_empty())
        .map(|s| s.seq)
        .min_by_key(|&q| q.wrapping_sub(first) as i32)
}
