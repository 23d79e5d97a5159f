//! Reading captures: pcap or pcapng (isoswitch, tcpdump, Wireshark) through
//! pcap-file, packets through etherparse, then TCP reassembly per connection
//! and direction (out of order, retransmitted and overlapping segments), then
//! frames cut with a spec's length prefix. This file reads the formats into
//! TCP segments; `read/streams.rs` reassembles them, `read/frames.rs` cuts
//! the frames.

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use pcap_file::DataLink;
use pcap_file::PcapError;
use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::PcapNgParser;
use pcap_file::pcapng::blocks::Block;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;

mod frames;
mod streams;

pub use frames::{
    CapturedFrame, FrameCut, StreamProblem, TimedFrame, frames, guess_spec, timeline,
};
pub use streams::{Connection, Stream, connections, reassemble};

/// Why a capture could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a pcap or pcapng file (magic {magic:02x?})")]
    NotACapture { path: String, magic: Vec<u8> },
    #[error("{path}: packet {packet}: {source}")]
    Pcap {
        path: String,
        packet: usize,
        source: pcap_file::PcapError,
    },
}

/// One TCP segment as captured.
#[derive(Clone, Debug)]
pub struct Segment {
    /// Since the Unix epoch.
    pub at: Duration,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub syn: bool,
    pub ack: bool,
    pub fin: bool,
    pub rst: bool,
    pub payload: Vec<u8>,
}

/// What was in a capture file.
#[derive(Clone, Debug, Default)]
pub struct Packets {
    /// Packets in the file (pcapng: packet blocks).
    pub packets: usize,
    /// Packets that are not TCP over IP (ARP, UDP, unsupported link types...).
    pub skipped: usize,
    pub segments: Vec<Segment>,
    /// The file ends part-way into the record after its `packets`, as a
    /// capture does when its writer was stopped mid-write (tcpdump killed):
    /// the packets before the cut are read, the partial record is not.
    pub cut_short: bool,
}

/// Reads every TCP segment of a pcap or pcapng file.
pub fn read_file(path: &Path) -> Result<Packets, ReadError> {
    let name = path.display().to_string();
    let mut data = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(|source| ReadError::Io {
            path: name.clone(),
            source,
        })?;
    read_bytes(&name, &data)
}

/// What to tell a user whose capture was cut short after `after` packets
/// (see [`Packets::cut_short`]).
pub fn cut_note(path: &Path, after: usize) -> String {
    format!(
        "{}: the file ends part-way into the record after packet {after} (a capture stopped mid-write?): the {after} packets before the cut are read",
        path.display()
    )
}

/// Reads every TCP segment of a pcap or pcapng image.
pub fn read_bytes(name: &str, data: &[u8]) -> Result<Packets, ReadError> {
    let magic = data.get(..4).unwrap_or(data);
    match magic {
        [0x0A, 0x0D, 0x0D, 0x0A] => read_pcapng(name, data),
        [0xA1, 0xB2, 0xC3, 0xD4]
        | [0xD4, 0xC3, 0xB2, 0xA1]
        | [0xA1, 0xB2, 0x3C, 0x4D]
        | [0x4D, 0x3C, 0xB2, 0xA1] => read_pcap(name, data),
        _ => Err(ReadError::NotACapture {
            path: name.to_string(),
            magic: magic.to_vec(),
        }),
    }
}

// The slice parsers rather than pcap-file's readers: the image is in memory
// already, and each reader zeroes an 8 MB buffer of its own first (most of
// what reading a small capture cost).
fn read_pcap(name: &str, data: &[u8]) -> Result<Packets, ReadError> {
    let err = |packet, source| ReadError::Pcap {
        path: name.to_string(),
        packet,
        source: at_end(source),
    };
    let (mut rest, parser) = PcapParser::new(data).map_err(|e| err(0, e))?;
    let link = parser.header().datalink;
    let mut out = Packets::default();
    while !rest.is_empty() {
        let Some((next, p)) = record(parser.next_packet(rest), &mut out, err)? else {
            break;
        };
        out.packets += 1;
        rest = next;
        match segment(link, p.timestamp, &p.data) {
            Some(s) => out.segments.push(s),
            None => out.skipped += 1,
        }
    }
    Ok(out)
}

/// The next record, or `None` where the image ends part-way into one (noted
/// in [`Packets::cut_short`]); any other failure names the packet.
fn record<T>(
    read: Result<T, PcapError>,
    out: &mut Packets,
    err: impl Fn(usize, PcapError) -> ReadError,
) -> Result<Option<T>, ReadError> {
    match read {
        Ok(r) => Ok(Some(r)),
        Err(PcapError::IncompleteBuffer) => {
            out.cut_short = true;
            Ok(None)
        }
        Err(e) => Err(err(out.packets + 1, e)),
    }
}

/// A file header cut short by the end of the image: the end of file
/// pcap-file's readers report for it. (A packet or block cut short after the
/// header is not an error: see [`Packets::cut_short`].)
fn at_end(e: PcapError) -> PcapError {
    match e {
        PcapError::IncompleteBuffer => {
            PcapError::IoError(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
        }
        e => e,
    }
}

fn read_pcapng(name: &str, data: &[u8]) -> Result<Packets, ReadError> {
    let err = |packet, source| ReadError::Pcap {
        path: name.to_string(),
        packet,
        source: at_end(source),
    };
    let (mut rest, mut parser) = PcapNgParser::new(data).map_err(|e| err(0, e))?;
    let mut out = Packets::default();
    // Per interface of the current section: link type and timestamp unit.
    let mut interfaces: Vec<(DataLink, TsUnit)> = Vec::new();
    while !rest.is_empty() {
        let Some((next, block)) = record(parser.next_block(rest), &mut out, err)? else {
            break;
        };
        rest = next;
        match block {
            Block::SectionHeader(_) => interfaces.clear(),
            Block::InterfaceDescription(idb) => {
                let unit = idb
                    .options
                    .iter()
                    .find_map(|o| match o {
                        InterfaceDescriptionOption::IfTsResol(r) => Some(TsUnit(*r)),
                        _ => None,
                    })
                    .unwrap_or(TsUnit(6));
                interfaces.push((idb.linktype, unit));
            }
            Block::EnhancedPacket(epb) => {
                out.packets += 1;
                let Some(&(link, unit)) = interfaces.get(epb.interface_id as usize) else {
                    out.skipped += 1;
                    continue;
                };
                // pcap-file hands the raw timestamp over as nanoseconds.
                let at = unit.scale(epb.timestamp.as_nanos() as u64);
                match segment(link, at, &epb.data) {
                    Some(s) => out.segments.push(s),
                    None => out.skipped += 1,
                }
            }
            Block::SimplePacket(spb) => {
                out.packets += 1;
                let link = interfaces.first().map_or(DataLink::ETHERNET, |i| i.0);
                match segment(link, Duration::ZERO, &spb.data) {
                    Some(s) => out.segments.push(s),
                    None => out.skipped += 1,
                }
            }
            Block::Packet(pb) => {
                out.packets += 1;
                let Some(&(link, unit)) = interfaces.get(usize::from(pb.interface_id)) else {
                    out.skipped += 1;
                    continue;
                };
                let at = unit.scale(pb.timestamp);
                match segment(link, at, &pb.data) {
                    Some(s) => out.segments.push(s),
                    None => out.skipped += 1,
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// pcapng `if_tsresol`: 10^-n seconds, or 2^-n with the high bit set.
#[derive(Clone, Copy, Debug)]
struct TsUnit(u8);

impl TsUnit {
    fn scale(self, raw: u64) -> Duration {
        let exp = u32::from(self.0 & 0x7F);
        if self.0 & 0x80 != 0 {
            let per_sec = 1u128.checked_shl(exp).unwrap_or(1);
            let nanos = u128::from(raw) * 1_000_000_000 / per_sec;
            return Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        }
        let per_sec = 10u128.checked_pow(exp).unwrap_or(1);
        let secs = u128::from(raw) / per_sec;
        let frac = u128::from(raw) % per_sec;
        let nanos = frac * 1_000_000_000 / per_sec;
        Duration::new(
            u64::try_from(secs).unwrap_or(u64::MAX),
            u32::try_from(nanos).unwrap_or(0),
        )
    }
}

/// The TCP segment in one packet, if it holds one.
fn segment(link: DataLink, at: Duration, data: &[u8]) -> Option<Segment> {
    let sliced = match link {
        DataLink::ETHERNET => SlicedPacket::from_ethernet(data).ok()?,
        DataLink::LINUX_SLL => SlicedPacket::from_linux_sll(data).ok()?,
        // SLL2: 20-byte header, protocol at offset 0.
        DataLink::LINUX_SLL2 => SlicedPacket::from_ip(data.get(20..)?).ok()?,
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => SlicedPacket::from_ip(data).ok()?,
        // BSD loopback: a 4-byte address family, then IP.
        DataLink::NULL | DataLink::LOOP => SlicedPacket::from_ip(data.get(4..)?).ok()?,
        _ => return None,
    };
    let (src_ip, dst_ip): (IpAddr, IpAddr) = match sliced.net.as_ref()? {
        NetSlice::Ipv4(v4) => (
            v4.header().source_addr().into(),
            v4.header().destination_addr().into(),
        ),
        NetSlice::Ipv6(v6) => (
            v6.header().source_addr().into(),
            v6.header().destination_addr().into(),
        ),
        NetSlice::Arp(_) => return None,
    };
    let TransportSlice::Tcp(tcp) = sliced.transport.as_ref()? else {
        return None;
    };
    Some(Segment {
        at,
        src: SocketAddr::new(src_ip, tcp.source_port()),
        dst: SocketAddr::new(dst_ip, tcp.destination_port()),
        seq: tcp.sequence_number(),
        syn: tcp.syn(),
        ack: tcp.ack(),
        fin: tcp.fin(),
        rst: tcp.rst(),
        payload: tcp.payload().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(at: u64, seq: u32, payload: &[u8]) -> Segment {
        Segment {
            at: Duration::from_millis(at),
            src: "127.0.0.1:40000".parse().unwrap(),
            dst: "127.0.0.1:5000".parse().unwrap(),
            seq,
            syn: false,
            ack: true,
            fin: false,
            rst: false,
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn reassembles_out_of_order_retransmitted_and_overlapping() {
        let mut syn = seg(0, 99, b"");
        syn.syn = true;
        syn.ack = false;
        let segs = [
            syn,
            seg(1, 100, b"abc"),
            seg(2, 106, b"ghi"),  // ahead: waits
            seg(3, 100, b"abc"),  // retransmission
            seg(4, 104, b"efgh"), // overlaps what waits, ahead too
            seg(5, 102, b"cdef"), // overlaps both sides, fills the hole
            seg(6, 109, b"jk"),
        ];
        let refs: Vec<&Segment> = segs.iter().collect();
        let s = reassemble(&refs);
        assert_eq!(s.bytes, b"abcdefghijk");
        assert_eq!(s.retransmitted, 1);
        assert_eq!(s.out_of_order, 2);
        assert!(s.gaps.is_empty());
        assert_eq!(s.time_at(3), Duration::from_millis(1));
        assert_eq!(
            s.time_at(9),
            Duration::from_millis(5),
            "complete when the hole filled"
        );
    }

    #[test]
    fn without_handshake_starts_at_the_lowest_sequence_number() {
        let segs = [seg(1, 5, b"fg"), seg(2, 0, b"abcde")];
        let refs: Vec<&Segment> = segs.iter().collect();
        assert_eq!(reassemble(&refs).bytes, b"abcdefg");
        let wrap = [seg(1, 0, b"cd"), seg(2, u32::MAX - 1, b"ab")];
        let refs: Vec<&Segment> = wrap.iter().collect();
        assert_eq!(reassemble(&refs).bytes, b"abcd", "across the 2^32 wrap");
    }

    #[test]
    fn a_missing_segment_is_a_gap() {
        let segs = [seg(1, 0, b"ab"), seg(2, 4, b"ef")];
        let refs: Vec<&Segment> = segs.iter().collect();
        let s = reassemble(&refs);
        assert_eq!(s.bytes, b"ab");
        assert_eq!(s.gaps, vec![(2, 2)]);
    }

    #[test]
    fn a_capture_cut_short_keeps_the_packets_before_the_cut() {
        for file in ["pos-tcpdump.pcap", "unionpay.pcapng"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/captures")
                .join(file);
            let whole_image = std::fs::read(path).unwrap();
            let whole = read_bytes(file, &whole_image).unwrap();
            assert!(!whole.cut_short, "{file}");
            // The last record (a packet in both files) loses its last bytes.
            let cut = read_bytes(file, &whole_image[..whole_image.len() - 3]).unwrap();
            assert!(cut.cut_short, "{file}");
            assert_eq!(cut.packets, whole.packets - 1, "{file}");
            assert_eq!(cut.segments.len() + cut.skipped, cut.packets, "{file}");
            let kept = cut.segments.len();
            for (a, b) in cut.segments.iter().zip(&whole.segments[..kept]) {
                assert_eq!((a.seq, &a.payload), (b.seq, &b.payload), "{file}");
            }
        }
    }

    #[test]
    fn a_capture_cut_inside_its_file_header_is_an_error() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/captures/pos-tcpdump.pcap");
        let image = std::fs::read(path).unwrap();
        match read_bytes("short", &image[..10]) {
            Err(ReadError::Pcap {
                packet: 0, source, ..
            }) => {
                assert!(matches!(source, PcapError::IoError(_)), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_socket_talking_to_itself_carries_its_bytes_once() {
        let mut s = seg(1, 0, b"abc");
        s.dst = s.src;
        let conns = connections(&[s]);
        assert_eq!(conns.len(), 1);
        assert_eq!(conns[0].to_server.bytes, b"abc");
        assert!(conns[0].to_client.bytes.is_empty(), "not twice");
    }

    #[test]
    fn garbage_is_not_a_capture() {
        assert!(matches!(
            read_bytes("x", b"hello world"),
            Err(ReadError::NotACapture { .. })
        ));
        assert!(read_bytes("x", &[0x0A, 0x0D, 0x0D, 0x0A, 1, 2]).is_err());
    }
}
