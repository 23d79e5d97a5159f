//! Capture and replay.
//!
//! - Writing: each connection of a capturing service gets a [`ConnTap`]; its
//!   reading and writing halves are wrapped in [`Tapped`], which copies what
//!   was actually read or written into the connection's bounded [`Staged`]
//!   batch (never waiting: past its bound a copy is dropped and counted) and
//!   queues one notice per batch. One writer task per service
//!   ([`writer::run`]) takes the batches, masks the messages ([`mask`]), wraps the bytes in synthetic
//!   Ethernet/IP/TCP packets with the connection's real addresses ([`tcp`]) and
//!   writes rotating pcapng files ([`mod@file`]).
//! - Reading: [`read`] takes pcap or pcapng (isoswitch, tcpdump, Wireshark),
//!   reassembles each TCP stream and cuts it into frames.
//! - Replay: [`replay`] sends the client side of captured connections to a
//!   target and compares the answers with the captured ones.

pub mod disk;
pub mod file;
pub mod mask;
pub mod peer;
pub mod read;
pub mod replay;
pub mod tap;
pub mod tcp;
pub mod writer;

pub use tap::{Capture, ConnTap, Event, Opened, Staged, Tapped};
