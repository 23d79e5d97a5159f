//! Frames out of reassembled streams: each direction cut with a spec's
//! length prefix (and where the cut failed), the frames of all connections
//! on one timeline, and the dialect guessed from the first frames when none
//! is given.

use std::time::Duration;

use super::{Connection, Stream};
use crate::iso8583::Spec;
use crate::wire::prefix::split_frame;
use crate::wire::{Frame, WireError};

/// One frame cut from a reassembled direction.
#[derive(Clone, Debug)]
pub struct CapturedFrame {
    /// When its last byte had arrived.
    pub at: Duration,
    /// Stream offset of its length prefix.
    pub offset: usize,
    pub frame: Frame,
}

/// Cuts a direction into frames. Stops at a prefix that cannot be trusted or
/// at a frame cut short by the end of the capture (the error says which).
pub fn frames(spec: &Spec, stream: &Stream) -> (Vec<CapturedFrame>, Option<FrameCut>) {
    let framing = spec.framing();
    let mut out = Vec::new();
    let mut at = 0;
    while at < stream.bytes.len() {
        match split_frame(framing.prefix, &stream.bytes[at..], framing.max_frame) {
            Ok(Some(f)) => {
                out.push(CapturedFrame {
                    at: stream.time_at(at + f.consumed),
                    offset: at,
                    frame: f.to_frame(),
                });
                at += f.consumed;
            }
            Ok(None) => {
                let left = stream.bytes.len() - at;
                return (out, Some(FrameCut::Truncated { offset: at, left }));
            }
            Err(e) => return (out, Some(FrameCut::Untrusted(e.shifted(at)))),
        }
    }
    (out, None)
}

/// Why a direction's frames stop before its end.
#[derive(Clone, Debug, thiserror::Error)]
pub enum FrameCut {
    #[error("the capture ends inside a frame at stream offset {offset} ({left} bytes captured)")]
    Truncated { offset: usize, left: usize },
    #[error("{0}")]
    Untrusted(WireError),
}

/// Every frame of a capture, both directions of every connection, in time order.
#[derive(Clone, Debug)]
pub struct TimedFrame {
    pub at: Duration,
    /// Index into the connections.
    pub conn: usize,
    pub from_client: bool,
    pub frame: CapturedFrame,
}

/// Problems found while cutting frames, per connection and direction.
#[derive(Clone, Debug)]
pub struct StreamProblem {
    pub conn: usize,
    pub from_client: bool,
    pub what: String,
}

/// Frames of every connection merged by time (stable: ties keep stream order).
pub fn timeline(spec: &Spec, conns: &[Connection]) -> (Vec<TimedFrame>, Vec<StreamProblem>) {
    let mut all = Vec::new();
    let mut problems = Vec::new();
    for (i, c) in conns.iter().enumerate() {
        for (from_client, stream) in [(true, &c.to_server), (false, &c.to_client)] {
            let (fs, cut) = frames(spec, stream);
            if let Some(&(offset, len)) = stream.gaps.first() {
                problems.push(StreamProblem {
                    conn: i,
                    from_client,
                    what: format!("{len} bytes at stream offset {offset} were not captured; reassembly stops there"),
                });
            }
            if let Some(cut) = cut {
                problems.push(StreamProblem {
                    conn: i,
                    from_client,
                    what: cut.to_string(),
                });
            }
            all.extend(fs.into_iter().map(|f| TimedFrame {
                at: f.at,
                conn: i,
                from_client,
                frame: f,
            }));
        }
    }
    all.sort_by_key(|f| f.at);
    (all, problems)
}

/// Guesses the spec of a capture: the built-in spec under which the most
/// frames decode (ties: fewer problems), among the connections of `port` if given.
pub fn guess_spec(conns: &[Connection]) -> Option<Spec> {
    let mut best: Option<(usize, Spec)> = None;
    for name in Spec::builtin_names() {
        let Some(spec) = Spec::builtin(name) else {
            continue;
        };
        let mut score = 0usize;
        for c in conns {
            for s in [&c.to_server, &c.to_client] {
                let (fs, cut) = frames(&spec, s);
                if cut.is_some() {
                    continue;
                }
                score += fs
                    .iter()
                    .filter(|f| match &f.frame {
                        Frame::Message(p) => spec.decode(p).is_ok(),
                        _ => false,
                    })
                    .count();
            }
        }
        if score > 0 && best.as_ref().is_none_or(|(b, _)| score > *b) {
            best = Some((score, spec));
        }
    }
    best.map(|(_, s)| s)
}
