//! Synthetic Ethernet/IP/TCP packets for one captured connection, built with
//! etherparse's headers (TCP checksum left zero, see [`TcpFlow`]'s packets): the connection's real addresses and ports, a handshake, and
//! sequence/acknowledgement numbers that advance with the bytes, so that
//! Wireshark and tshark reassemble each direction as one stream.

use std::net::{IpAddr, SocketAddr};

use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header, Ipv6Header, TcpHeader};

/// Largest TCP payload put in one synthetic packet (fits the IPv4 total length).
pub const MAX_SEGMENT: usize = 65_000;
/// MACs of the two ends: locally administered, client ...01, server ...02.
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const TTL: u8 = 64;
const WINDOW: u16 = 65_535;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flags {
    Syn,
    SynAck,
    Ack,
    Data,
    Fin,
}

/// One TCP connection as the capture shows it: who opened it, and the next
/// sequence number of each side.
#[derive(Clone, Debug)]
pub struct TcpFlow {
    pub client: SocketAddr,
    pub server: SocketAddr,
    client_next: u32,
    server_next: u32,
    /// The headers of a data packet from each side (`[from server, from
    /// client]`), built once with etherparse: each data packet copies its
    /// side's and patches the lengths, the IPv4 checksum and the sequence
    /// numbers, rather than building the headers anew.
    templates: [Template; 2],
}

/// Ethernet + IP + TCP headers of one side's data packets, as etherparse
/// builds them for an empty payload and sequence numbers 0.
#[derive(Clone, Debug)]
struct Template {
    bytes: [u8; TEMPLATE_MAX],
    len: usize,
    v4: bool,
}

/// Ethernet (14) + IPv6 (40) + TCP without options (20).
const TEMPLATE_MAX: usize = 14 + 40 + 20;
/// Where the IP header starts (after the Ethernet header).
const IP_AT: usize = 14;

impl TcpFlow {
    /// A flow whose initial sequence numbers come from `isn` (any value; the
    /// connection ID keeps them distinct between connections).
    pub fn new(client: SocketAddr, server: SocketAddr, isn: u32) -> TcpFlow {
        let mut flow = TcpFlow {
            client: canonical(client),
            server: canonical(server),
            client_next: isn,
            server_next: isn.wrapping_mul(2_654_435_761).wrapping_add(1),
            templates: [Template::EMPTY, Template::EMPTY],
        };
        flow.templates = [false, true].map(|from_client| flow.template(from_client));
        flow
    }

    /// Etherparse's headers of a data packet from one side, with an empty
    /// payload and sequence numbers 0.
    fn template(&self, from_client: bool) -> Template {
        let mut built = Vec::with_capacity(TEMPLATE_MAX);
        self.packet_into(from_client, Flags::Data, 0, 0, &[], &mut built);
        let mut t = Template::EMPTY;
        t.len = built.len().min(TEMPLATE_MAX);
        t.bytes[..t.len].copy_from_slice(&built[..t.len]);
        t.v4 = self.client.is_ipv4() && self.server.is_ipv4();
        t
    }

    /// SYN, SYN-ACK, ACK, ending at the current sequence numbers (so a
    /// handshake can be replayed for a flow already under way, e.g. at the top
    /// of a new capture file).
    pub fn handshake(&self) -> Vec<Vec<u8>> {
        let c = self.client_next.wrapping_sub(1);
        let s = self.server_next.wrapping_sub(1);
        vec![
            self.packet(true, Flags::Syn, c, 0, &[]),
            self.packet(false, Flags::SynAck, s, self.client_next, &[]),
            self.packet(true, Flags::Ack, self.client_next, self.server_next, &[]),
        ]
    }

    /// Data from one side, cut into packets of at most [`MAX_SEGMENT`] bytes.
    pub fn data(&mut self, from_client: bool, bytes: &[u8]) -> Vec<Vec<u8>> {
        bytes
            .chunks(MAX_SEGMENT)
            .map(|chunk| {
                let (seq, ack) = self.numbers(from_client);
                let p = self.packet(from_client, Flags::Data, seq, ack, chunk);
                self.advance(from_client, chunk.len() as u32);
                p
            })
            .collect()
    }

    /// One data packet for `payload` (at most [`MAX_SEGMENT`] bytes) built
    /// into `out` (cleared first), so that a writer can reuse one buffer for
    /// every packet. Returns where the payload starts in `out`.
    pub fn data_into(&mut self, from_client: bool, payload: &[u8], out: &mut Vec<u8>) -> usize {
        let payload = &payload[..payload.len().min(MAX_SEGMENT)];
        let (seq, ack) = self.numbers(from_client);
        out.clear();
        let start = self.templates[usize::from(from_client)].put(seq, ack, payload.len(), out);
        out.extend_from_slice(payload);
        self.advance(from_client, payload.len() as u32);
        start
    }

    /// Bytes one side sent that the capture lost: the sequence number moves on
    /// without a packet, as a real capture that missed a segment.
    pub fn skip(&mut self, from_client: bool, len: u64) {
        self.advance(from_client, len as u32);
    }

    /// FIN from each side and the last ACK.
    pub fn close(&mut self) -> Vec<Vec<u8>> {
        let (cs, ca) = self.numbers(true);
        let fin1 = self.packet(true, Flags::Fin, cs, ca, &[]);
        self.advance(true, 1);
        let (ss, sa) = self.numbers(false);
        let fin2 = self.packet(false, Flags::Fin, ss, sa, &[]);
        self.advance(false, 1);
        let (cs, ca) = self.numbers(true);
        let last = self.packet(true, Flags::Ack, cs, ca, &[]);
        vec![fin1, fin2, last]
    }

    fn numbers(&self, from_client: bool) -> (u32, u32) {
        if from_client {
            (self.client_next, self.server_next)
        } else {
            (self.server_next, self.client_next)
        }
    }

    fn advance(&mut self, from_client: bool, n: u32) {
        let next = if from_client {
            &mut self.client_next
        } else {
            &mut self.server_next
        };
        *next = next.wrapping_add(n);
    }

    fn packet(
        &self,
        from_client: bool,
        flags: Flags,
        seq: u32,
        ack: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        self.packet_into(from_client, flags, seq, ack, payload, &mut out);
        out
    }

    fn packet_into(
        &self,
        from_client: bool,
        flags: Flags,
        seq: u32,
        ack: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) {
        let (src, dst, smac, dmac) = if from_client {
            (self.client, self.server, CLIENT_MAC, SERVER_MAC)
        } else {
            (self.server, self.client, SERVER_MAC, CLIENT_MAC)
        };
        let mut tcp = TcpHeader::new(src.port(), dst.port(), seq, WINDOW);
        match flags {
            Flags::Syn => tcp.syn = true,
            Flags::SynAck => (tcp.syn, tcp.ack) = (true, true),
            Flags::Ack => tcp.ack = true,
            Flags::Data => (tcp.psh, tcp.ack) = (true, true),
            Flags::Fin => (tcp.fin, tcp.ack) = (true, true),
        }
        if tcp.ack {
            tcp.acknowledgment_number = ack;
        }
        // The TCP checksum stays zero: computing it over every payload cost
        // more than the rest of the headers, and Wireshark and tshark do not
        // check it by default (a zero checksum means "not computed"; the
        // stream reassembles the same). The IPv4 header checksum is kept.
        let tcp_len = tcp.header_len() + payload.len();
        out.reserve(14 + 40 + tcp_len);
        let v4 = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some((s.octets(), d.octets())),
            _ => None,
        };
        let ether_type = if v4.is_some() {
            EtherType::IPV4
        } else {
            EtherType::IPV6
        };
        let eth = Ethernet2Header {
            source: smac,
            destination: dmac,
            ether_type,
        };
        out.extend_from_slice(&eth.to_bytes());
        // Writing to a Vec cannot fail; MAX_SEGMENT keeps lengths in range.
        match v4 {
            Some((s, d)) => {
                if let Ok(ip) = Ipv4Header::new(tcp_len as u16, TTL, IpNumber::TCP, s, d) {
                    let _ = ip.write(out);
                }
            }
            None => {
                let ip = Ipv6Header {
                    traffic_class: 0,
                    flow_label: Default::default(),
                    payload_length: tcp_len as u16,
                    next_header: IpNumber::TCP,
                    hop_limit: TTL,
                    source: v6(src.ip()),
                    destination: v6(dst.ip()),
                };
                let _ = ip.write(out);
            }
        }
        let _ = tcp.write(out);
        out.extend_from_slice(payload);
    }
}

impl Template {
    const EMPTY: Template = Template {
        bytes: [0; TEMPLATE_MAX],
        len: 0,
        v4: true,
    };

    /// Appends the headers of a data packet carrying `payload_len` bytes
    /// (at most [`MAX_SEGMENT`]) at `seq`, acknowledging `ack`; returns
    /// where the payload goes.
    fn put(&self, seq: u32, ack: u32, payload_len: usize, out: &mut Vec<u8>) -> usize {
        let at = out.len();
        out.extend_from_slice(&self.bytes[..self.len]);
        let h = &mut out[at..];
        let (ip_len, tcp_at) = if self.v4 {
            (20, IP_AT + 20)
        } else {
            (40, IP_AT + 40)
        };
        // The TCP header of a data packet has no options: 20 bytes.
        let tcp_len = (20 + payload_len) as u16;
        if self.v4 {
            let total = tcp_len + ip_len as u16;
            h[IP_AT + 2..IP_AT + 4].copy_from_slice(&total.to_be_bytes());
            h[IP_AT + 10..IP_AT + 12].fill(0);
            let sum = etherparse::checksum::Sum16BitWords::new()
                .add_slice(&h[IP_AT..IP_AT + ip_len])
                .ones_complement();
            // Summed as native-endian words (etherparse's `calc_header_checksum`
            // then swaps to big-endian for the wire): the native bytes are the
            // wire bytes.
            h[IP_AT + 10..IP_AT + 12].copy_from_slice(&sum.to_ne_bytes());
        } else {
            h[IP_AT + 4..IP_AT + 6].copy_from_slice(&tcp_len.to_be_bytes());
        }
        h[tcp_at + 4..tcp_at + 8].copy_from_slice(&seq.to_be_bytes());
        h[tcp_at + 8..tcp_at + 12].copy_from_slice(&ack.to_be_bytes());
        at + self.len
    }
}

/// IPv4-mapped IPv6 addresses become IPv4, so both ends have one family.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

fn v6(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{SlicedPacket, TransportSlice};

    fn tcp(p: &[u8]) -> (u32, u32, bool, bool, Vec<u8>) {
        let s = SlicedPacket::from_ethernet(p).unwrap();
        let Some(TransportSlice::Tcp(t)) = s.transport else {
            panic!("not tcp")
        };
        (
            t.sequence_number(),
            t.acknowledgment_number(),
            t.syn(),
            t.fin(),
            t.payload().to_vec(),
        )
    }

    #[test]
    fn sequence_numbers_advance_with_the_bytes() {
        let c: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let s: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mut f = TcpFlow::new(c, s, 1000);
        let hs = f.handshake();
        let (syn_seq, _, syn, _, _) = tcp(&hs[0]);
        assert!(syn);
        let a = f.data(true, b"hello");
        let (seq, _, _, _, body) = tcp(&a[0]);
        assert_eq!(seq, syn_seq.wrapping_add(1), "data starts after the SYN");
        assert_eq!(body, b"hello");
        let b = f.data(true, b"xy");
        assert_eq!(tcp(&b[0]).0, seq + 5);
        let r = f.data(false, b"ok");
        assert_eq!(tcp(&r[0]).1, seq + 7, "the answer acknowledges all sent");
        let big = f.data(false, &vec![7u8; MAX_SEGMENT + 10]);
        assert_eq!(big.len(), 2);
        let fin = f.close();
        assert!(tcp(&fin[0]).3 && tcp(&fin[1]).3);
    }

    #[test]
    fn a_packet_built_into_a_reused_buffer_is_the_same_packet() {
        let c: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let s: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let (mut a, mut b) = (TcpFlow::new(c, s, 9), TcpFlow::new(c, s, 9));
        let mut buf = vec![0xAA; 3];
        for (from_client, payload) in [(true, &b"request"[..]), (false, b"answer"), (true, b"x")] {
            let at = b.data_into(from_client, payload, &mut buf);
            assert_eq!(a.data(from_client, payload), vec![buf.clone()]);
            assert_eq!(&buf[at..], payload);
        }
        assert_eq!(a.close(), b.close(), "both flows moved on alike");
    }

    /// The patched template is byte for byte the packet etherparse builds,
    /// for both families, both sides, and sizes from empty to the largest.
    #[test]
    fn a_data_packet_from_the_template_is_etherparses_packet() {
        let pairs = [
            ("127.0.0.1:40000", "127.0.0.1:5000"),
            ("10.1.2.3:65535", "192.168.200.7:1"),
            ("[::1]:40000", "[::1]:5000"),
            ("[2001:db8::1]:1234", "[fe80::2]:8583"),
            ("[::ffff:127.0.0.1]:40000", "127.0.0.1:5000"),
        ];
        let numbers = [
            (0u32, 0u32),
            (1, 2),
            (0x8000_0000, 0xFFFF_FFFF),
            (0xDEAD_BEEF, 7),
        ];
        for (c, s) in pairs {
            let flow = TcpFlow::new(c.parse().unwrap(), s.parse().unwrap(), 77);
            for from_client in [true, false] {
                for (seq, ack) in numbers {
                    for n in [0, 1, 19, 1400, MAX_SEGMENT - 1, MAX_SEGMENT] {
                        let payload: Vec<u8> = (0..n).map(|i| i as u8).collect();
                        let mut expected = Vec::new();
                        flow.packet_into(
                            from_client,
                            Flags::Data,
                            seq,
                            ack,
                            &payload,
                            &mut expected,
                        );
                        let mut got = vec![0xEE; 5];
                        let at =
                            flow.templates[usize::from(from_client)].put(seq, ack, n, &mut got);
                        got.extend_from_slice(&payload);
                        assert_eq!(&got[..5], &[0xEE; 5], "appended after what was there");
                        assert_eq!(
                            &got[5..],
                            &expected[..],
                            "{c} {s} {from_client} {seq} {ack} {n}"
                        );
                        assert_eq!(at, 5 + expected.len() - n, "the payload's place");
                    }
                }
            }
        }
    }

    #[test]
    fn the_template_keeps_the_ipv4_header_checksum_valid() {
        let c: SocketAddr = "10.0.0.1:40000".parse().unwrap();
        let s: SocketAddr = "10.0.0.2:5000".parse().unwrap();
        let mut f = TcpFlow::new(c, s, 5);
        let mut buf = Vec::new();
        for n in [0usize, 3, 1000, MAX_SEGMENT] {
            f.data_into(true, &vec![1u8; n], &mut buf);
            let ip = etherparse::Ipv4HeaderSlice::from_slice(&buf[14..]).unwrap();
            assert_eq!(ip.total_len() as usize, 40 + n);
            assert_eq!(ip.header_checksum(), ip.to_header().calc_header_checksum());
        }
    }

    #[test]
    fn ipv6_flows_build() {
        let c: SocketAddr = "[::1]:40000".parse().unwrap();
        let s: SocketAddr = "[::1]:5000".parse().unwrap();
        let mut f = TcpFlow::new(c, s, 1);
        assert_eq!(tcp(&f.data(true, b"a")[0]).4, b"a");
    }
}
