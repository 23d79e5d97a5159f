//! Synthetic Ethernet/IP/TCP packets for one captured connection, built with
//! etherparse: the connection's real addresses and ports, a handshake, and
//! sequence/acknowledgement numbers that advance with the bytes, so that
//! Wireshark and tshark reassemble each direction as one stream.

use std::net::{IpAddr, SocketAddr};

use etherparse::PacketBuilder;

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
}

impl TcpFlow {
    /// A flow whose initial sequence numbers come from `isn` (any value; the
    /// connection ID keeps them distinct between connections).
    pub fn new(client: SocketAddr, server: SocketAddr, isn: u32) -> TcpFlow {
        TcpFlow {
            client: canonical(client),
            server: canonical(server),
            client_next: isn,
            server_next: isn.wrapping_mul(2_654_435_761).wrapping_add(1),
        }
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
        let (src, dst, smac, dmac) = if from_client {
            (self.client, self.server, CLIENT_MAC, SERVER_MAC)
        } else {
            (self.server, self.client, SERVER_MAC, CLIENT_MAC)
        };
        let eth = PacketBuilder::ethernet2(smac, dmac);
        let ip = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), TTL),
            (s, d) => eth.ipv6(v6(s), v6(d), TTL),
        };
        let tcp = ip.tcp(src.port(), dst.port(), seq, WINDOW);
        let tcp = match flags {
            Flags::Syn => tcp.syn(),
            Flags::SynAck => tcp.syn().ack(ack),
            Flags::Ack => tcp.ack(ack),
            Flags::Data => tcp.psh().ack(ack),
            Flags::Fin => tcp.fin().ack(ack),
        };
        let mut out = Vec::with_capacity(tcp.size(payload.len()));
        // Writing to a Vec only fails on a payload too long for IP, which
        // MAX_SEGMENT rules out; an empty packet would be skipped by readers.
        let _ = tcp.write(&mut out, payload);
        out
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
    fn ipv6_flows_build() {
        let c: SocketAddr = "[::1]:40000".parse().unwrap();
        let s: SocketAddr = "[::1]:5000".parse().unwrap();
        let mut f = TcpFlow::new(c, s, 1);
        assert_eq!(tcp(&f.data(true, b"a")[0]).4, b"a");
    }
}
