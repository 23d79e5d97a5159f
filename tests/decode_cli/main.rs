//! `isoswitch decode` end to end, and the fixtures it ships with.
//!
//! The fixtures in `fixtures/<spec>/<name>.hex` are defined here, built with the
//! spec encoder, and checked by `fixtures_are_current`: they cannot drift from
//! the codec. After a deliberate change, rebuild them with
//! `ISOSWITCH_BLESS=1 cargo test --test decode_cli fixtures_are_current`.

mod bad_input;
mod binary;
mod fixtures;
mod in_process;
