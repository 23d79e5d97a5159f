//! Spec-driven ISO 8583 messages. Pure: no I/O, no clocks, no global state.
//!
//! - [`Spec`]: one set of types for every dialect, loaded from `specs/*.toml`
//!   (seven are built in), validated at load, with per-field lookup tables.
//! - [`Message`]: a zero-copy view over a payload (`Bytes`): envelope, MTI and
//!   bitmaps found eagerly, fields lazily; [`RoutingView`] in one pass; in-place
//!   patching ([`patch_fixed`], [`stamp`], [`Spec::swap_envelope`]). No heap
//!   allocation on this path.
//! - [`Decoded`]: full decode into ordered fields and [`Spec::encode`] back,
//!   byte-identical for canonical input.
//! - Masking: every `Display` / `Debug` of field data masks sensitive fields
//!   ([`is_sensitive`]: the spec's flag, and PAN, track data, PIN block, EMV
//!   data and MACs whatever the spec says) unless explicitly revealed
//!   ([`Shown::reveal`]).

#![forbid(unsafe_code)]

mod codec;
mod codes;
mod datetime;
mod decoded;
mod error;
mod mask;
mod message;
mod mti;
mod nom_form;
mod sad;
#[doc(hidden)]
pub mod samples;
mod spec;

pub use codec::ebcdic;
/// For the switch's capture masking walk, which crosses fixed fields by the
/// spec's step table as [`Message::index`] does.
#[doc(hidden)]
pub use codec::span as field_span;
pub use codes::FieldCodes;
pub use datetime::{civil_from_days, transmission_date_time};
pub use decoded::{Decoded, ShownMessage, Value};
pub use error::{FieldReason, IsoError, KeyError, KeyReason, LengthReason, SpecError, ValueReason};
pub use mask::{ALWAYS_SENSITIVE, Shown, is_sensitive, mask_of, unflagged_sensitive};
pub use message::{Bitmap, FieldIndex, FieldRef, Layout, Message, RoutingView, patch_fixed, stamp};
pub use mti::Mti;
/// The field walk written with nom's primitives, for `benches/codec.rs`.
#[doc(hidden)]
pub use nom_form::validate as validate_nom_form;
pub use sad::{
    EMV_FIELD, SAD_EMV_TAGS, SAD_FIELDS, SadError, Stripped, strip_sad, strip_sensitive_subelements,
};
#[doc(hidden)]
pub use spec::Step;
pub use spec::{
    Align, BitmapEncoding, BitmapSpec, Data, FieldDef, Format, Framing, Integrity, LayoutError,
    LengthEncoding, MAX_FIELD, Mask, MtiEncoding, MtiSpec, Network, RepeatKeys, SafAnswerClass,
    SafAnswerCodes, Spec, Subelement, SubelementError, SubelementLayout, Subelements, Unit,
};

#[cfg(test)]
mod tests;
