//! Time each message spends inside a proxy, read off the wire: tcpdump on
//! the loopback while one open-loop row runs through the proxy, then every
//! message's four legs (client → proxy, proxy → node, node → proxy, proxy →
//! client) matched by its STAN (F11), which neither proxy changes.
//!
//! The latency rows subtract the direct row's p99 from the proxy row's, and
//! on a small machine both are set by how the load generator and the nodes
//! share their CPU: a proxy adds two hops to schedule there. The time between
//! a leg entering a proxy and leaving it is the proxy's alone: its wake-up,
//! its work, and anything else its CPU ran meanwhile.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::capture::read::{self, Packets};
use crate::iso8583::{Message, Spec};
use crate::wire::Frame;

use super::procs::{Sidecar, TempFile};

pub(crate) fn available() -> bool {
    super::procs::answers("tcpdump", &["--version"])
}

/// tcpdump on `lo`, keeping the segments that carry bytes on `ports`.
pub(crate) struct Tcpdump {
    tcpdump: Sidecar,
    out: TempFile,
    stderr: TempFile,
}

impl Tcpdump {
    pub(crate) async fn start(ports: &[u16], label: &str) -> Result<Tcpdump, String> {
        let out = TempFile::write(&format!("isoswitch-bench-dwell-{label}"), "pcap", "")?;
        // tcpdump run as root drops to its own user before it opens the file:
        // let it create the file rather than open one root made (the
        // TempFile still removes it at the end).
        let _ = std::fs::remove_file(&out.path);
        let stderr = TempFile::write(&format!("isoswitch-bench-dwell-{label}"), "err", "")?;
        let err_file = std::fs::File::create(&stderr.path)
            .map_err(|e| format!("{}: {e}", stderr.path.display()))?;
        let child = Command::new("tcpdump")
            // -B: a 64 MiB kernel buffer, so that a burst is not dropped
            // while tcpdump waits for its CPU.
            .args(["-i", "lo", "-s", "0", "-B", "65536", "-n", "-w"])
            .arg(&out.path)
            .arg(filter(ports))
            .stdout(Stdio::null())
            .stderr(err_file)
            .spawn()
            .map_err(|e| format!("cannot start tcpdump: {e}"))?;
        let mut dump = Tcpdump {
            tcpdump: Sidecar::new(child, "tcpdump"),
            out,
            stderr,
        };
        // tcpdump says "listening on lo" once its filter is in place.
        for _ in 0..50 {
            if let Ok(Some(status)) = dump.tcpdump.child.try_wait() {
                return Err(format!(
                    "tcpdump ended at once ({status}): {}",
                    dump.errors()
                ));
            }
            if dump.errors().contains("listening on") {
                return Ok(dump);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "tcpdump did not start within 5 s: {}",
            dump.errors()
        ))
    }

    fn errors(&self) -> String {
        std::fs::read_to_string(&self.stderr.path).unwrap_or_default()
    }

    /// Stops tcpdump (SIGINT: it flushes the file and prints its counts) and
    /// reads the capture; also the packets the kernel dropped, when it says.
    pub(crate) async fn finish(mut self) -> Result<(Packets, Option<u64>), String> {
        self.tcpdump.interrupt().await?;
        let path = &self.out.path;
        let packets = read::read_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((packets, dropped(&self.errors())))
    }
}

/// TCP on any of `ports`, segments with a payload only (pure ACKs are most
/// of the packets and carry nothing to time).
fn filter(ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(|p| format!("port {p}")).collect();
    format!(
        "tcp and ({}) and (((ip[2:2] - ((ip[0]&0xf)<<2)) - ((tcp[12]&0xf0)>>2)) != 0)",
        ports.join(" or ")
    )
}

/// tcpdump's closing line `N packets dropped by kernel`.
fn dropped(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find(|l| l.contains("dropped by kernel"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The four places a message is seen on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Leg {
    /// Client → proxy.
    RequestIn,
    /// Proxy → node.
    RequestOut,
    /// Node → proxy.
    AnswerIn,
    /// Proxy → client.
    AnswerOut,
}

/// Time inside the proxy per message, in µs, for every message whose four
/// legs were captured once each.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Dwell {
    /// Proxy → node minus client → proxy.
    pub(crate) request: Vec<u64>,
    /// Proxy → client minus node → proxy.
    pub(crate) answer: Vec<u64>,
    /// The two together: what the proxy added to the message's round trip.
    pub(crate) both: Vec<u64>,
    /// Messages seen on some legs but not all four (the capture's first and
    /// last moments, a dropped packet), or whose STAN was seen twice on a leg.
    pub(crate) unmatched: usize,
    /// Directions whose reassembly or framing stopped early.
    pub(crate) problems: usize,
}

impl Dwell {
    /// Matches the legs of a capture of one proxy: `front` is the proxy's
    /// listening address, `nodes` the nodes'. A frame's time is when its last
    /// byte was sent (on the loopback tcpdump stamps a packet as it is sent).
    pub(crate) fn measure(
        spec: &Spec,
        packets: &Packets,
        front: SocketAddr,
        nodes: &[SocketAddr],
    ) -> Dwell {
        let conns = read::connections(&packets.segments);
        let (frames, problems) = read::timeline(spec, &conns);
        // STAN → the time on each leg; a second sighting on a leg spoils it.
        let mut seen: HashMap<Vec<u8>, [Sighting; 4]> = HashMap::new();
        for f in &frames {
            let c = &conns[f.conn];
            let (src, dst) = if f.from_client {
                (c.client, c.server)
            } else {
                (c.server, c.client)
            };
            let leg = if dst == front {
                Leg::RequestIn
            } else if src == front {
                Leg::AnswerOut
            } else if nodes.contains(&dst) {
                Leg::RequestOut
            } else if nodes.contains(&src) {
                Leg::AnswerIn
            } else {
                continue;
            };
            let Frame::Message(payload) = &f.frame.frame else {
                continue;
            };
            let Some(stan) = stan(spec, payload) else {
                continue;
            };
            seen.entry(stan).or_default()[leg as usize].see(f.at);
        }
        let mut d = Dwell {
            problems: problems.len(),
            ..Dwell::default()
        };
        for legs in seen.values() {
            let at = |l: Leg| legs[l as usize].once();
            match (
                at(Leg::RequestIn),
                at(Leg::RequestOut),
                at(Leg::AnswerIn),
                at(Leg::AnswerOut),
            ) {
                (Some(a), Some(b), Some(c), Some(e)) if a <= b && c <= e => {
                    let request = micros(b - a);
                    let answer = micros(e - c);
                    d.request.push(request);
                    d.answer.push(answer);
                    d.both.push(request + answer);
                }
                _ => d.unmatched += 1,
            }
        }
        for v in [&mut d.request, &mut d.answer, &mut d.both] {
            v.sort_unstable();
        }
        d
    }

    pub(crate) fn messages(&self) -> usize {
        self.both.len()
    }
}

/// The value at quantile `q` of sorted samples (nearest rank).
pub(crate) fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

#[derive(Clone, Copy, Debug, Default)]
enum Sighting {
    #[default]
    Never,
    Once(Duration),
    Again,
}

impl Sighting {
    fn see(&mut self, at: Duration) {
        *self = match self {
            Sighting::Never => Sighting::Once(at),
            _ => Sighting::Again,
        };
    }

    fn once(&self) -> Option<Duration> {
        match self {
            Sighting::Once(at) => Some(*at),
            _ => None,
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// F11 as it is on the wire, or None for a message without one or that does
/// not parse (a proxy's decline of a garbled request is not timed).
fn stan(spec: &Spec, payload: &bytes::Bytes) -> Option<Vec<u8>> {
    let m = Message::parse(spec, payload.clone()).ok()?;
    let f = m.field(11).ok()??;
    Some(f.data().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::read::Segment;
    use crate::iso8583::samples;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    const FRONT: u16 = 26800;
    const NODE: u16 = 26801;
    const CLIENT: u16 = 40000;
    const LINK: u16 = 40001;

    /// A CUPS 0200 (or its 0210) with the given STAN, framed.
    fn framed(stan: &str, answer: bool) -> Vec<u8> {
        let spec = Spec::builtin("cups").unwrap();
        let mut d = samples::purchase(&spec);
        d.set_text(11, stan);
        if answer {
            d.mti = d.mti.response().unwrap();
        }
        let payload = spec.encode(&d).unwrap();
        let mut out = Vec::new();
        spec.framing()
            .prefix
            .encode(payload.len(), &mut out)
            .unwrap();
        out.extend_from_slice(&payload);
        out
    }

    struct Wire {
        segments: Vec<Segment>,
        seq: HashMap<(u16, u16), u32>,
    }

    impl Wire {
        fn new() -> Wire {
            Wire {
                segments: Vec::new(),
                seq: HashMap::new(),
            }
        }

        fn send(&mut self, us: u64, from: u16, to: u16, bytes: Vec<u8>) {
            let seq = self.seq.entry((from, to)).or_insert(1000);
            self.segments.push(Segment {
                at: Duration::from_micros(1_000_000 + us),
                src: addr(from),
                dst: addr(to),
                seq: *seq,
                syn: false,
                ack: true,
                fin: false,
                rst: false,
                payload: bytes.clone(),
            });
            *seq = seq.wrapping_add(bytes.len() as u32);
        }

        fn packets(self) -> Packets {
            Packets {
                packets: self.segments.len(),
                segments: self.segments,
                ..Packets::default()
            }
        }
    }

    /// One message through the proxy, its legs at the given µs.
    fn message(w: &mut Wire, stan: &str, legs: [u64; 4]) {
        w.send(legs[0], CLIENT, FRONT, framed(stan, false));
        w.send(legs[1], LINK, NODE, framed(stan, false));
        w.send(legs[2], NODE, LINK, framed(stan, true));
        w.send(legs[3], FRONT, CLIENT, framed(stan, true));
    }

    fn measure(w: Wire) -> Dwell {
        let spec = Spec::builtin("cups").unwrap();
        Dwell::measure(&spec, &w.packets(), addr(FRONT), &[addr(NODE)])
    }

    #[test]
    fn each_leg_is_timed_from_entering_the_proxy_to_leaving_it() {
        let mut w = Wire::new();
        message(&mut w, "000001", [0, 40, 200, 230]);
        message(&mut w, "000002", [100, 1100, 1300, 1310]);
        let d = measure(w);
        assert_eq!(d.request, [40, 1000]);
        assert_eq!(d.answer, [10, 30]);
        assert_eq!(d.both, [70, 1010]);
        assert_eq!((d.unmatched, d.problems), (0, 0));
    }

    #[test]
    fn a_message_missing_a_leg_or_seen_twice_on_one_is_not_timed() {
        let mut w = Wire::new();
        message(&mut w, "000001", [0, 40, 200, 230]);
        // Its answer left the proxy after the capture stopped.
        w.send(300, CLIENT, FRONT, framed("000002", false));
        w.send(340, LINK, NODE, framed("000002", false));
        w.send(400, NODE, LINK, framed("000002", true));
        // The same STAN twice from the client: which copy went on is unknown.
        message(&mut w, "000003", [500, 540, 600, 640]);
        w.send(700, CLIENT, FRONT, framed("000003", false));
        let d = measure(w);
        assert_eq!(d.both, [70]);
        assert_eq!(d.unmatched, 2);
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 0.999), Some(100));
        assert_eq!(quantile(&v, 0.0), Some(1));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn tcpdump_counts_are_read_from_its_closing_lines() {
        let err = "tcpdump: listening on lo, link-type EN10MB (Ethernet), snapshot length 262144 bytes\n\
                   112185 packets captured\n225264 packets received by filter\n3 packets dropped by kernel\n";
        assert_eq!(dropped(err), Some(3));
        assert_eq!(dropped("tcpdump: listening on lo"), None);
        assert_eq!(
            filter(&[26800, 26801]),
            "tcp and (port 26800 or port 26801) and (((ip[2:2] - ((ip[0]&0xf)<<2)) - ((tcp[12]&0xf0)>>2)) != 0)"
        );
    }
}
