//! See `isoswitch::fuzzing::mask` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| isoswitch::fuzzing::mask(data));
