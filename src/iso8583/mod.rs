//! Spec-driven ISO 8583 messages. Pure: no I/O, no clocks, no global state.
//!
//! - [`Spec`]: one set of types for every dialect, loaded from `specs/*.toml`
//!   (five are built in), validated at load, with per-field lookup tables.

mod error;
mod mti;
mod spec;

pub use error::{IsoError, SpecError};
pub use mti::Mti;
pub use spec::{
    Align, BitmapEncoding, BitmapSpec, Data, FieldDef, Format, Framing, LengthEncoding, MAX_FIELD,
    Mask, MtiEncoding, MtiSpec, Network, Spec, Unit,
};
