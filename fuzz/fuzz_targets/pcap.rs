//! See `isoswitch::fuzzing::pcap` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| isoswitch::fuzzing::pcap(data));
