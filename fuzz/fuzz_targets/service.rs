//! See `isoswitch::fuzzing::service` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| isoswitch::fuzzing::service(data));
