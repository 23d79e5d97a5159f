//! Errors of the message layer. None of them carries field contents: a message
//! names a field id, an offset and lengths, never data (see masking).

use thiserror::Error;

use isoswitch_wire::WireError;

/// Why a payload could not be read, or a message could not be built or patched.
/// Offsets are relative to the payload (the frame without its length prefix).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum IsoError {
    /// The envelope (TPDU, scheme header) before the MTI is malformed.
    #[error("envelope: {0}")]
    Envelope(#[from] WireError),

    /// Not enough bytes for a part of the message.
    #[error("{what} at offset {offset}: truncated (need {need} bytes, have {have})")]
    Truncated {
        what: &'static str,
        offset: usize,
        need: usize,
        have: usize,
    },

    /// The MTI holds something other than four decimal digits.
    #[error("MTI at offset {offset}: byte {byte:#04x} is not a {encoding} digit")]
    BadMti {
        offset: usize,
        byte: u8,
        encoding: &'static str,
    },

    /// A hex bitmap holds a byte that is not a hex digit.
    #[error("bitmap at offset {offset}: byte {byte:#04x} is not a hex digit")]
    BadBitmap { offset: usize, byte: u8 },

    /// The bitmap announces a field the spec does not define (its length is unknown,
    /// so nothing after it can be found).
    #[error("field {id} at offset {offset}: present in the bitmap but not defined by the spec")]
    UndefinedField { id: u16, offset: usize },

    /// Not enough bytes for a field's length prefix or data.
    #[error("field {id} at offset {offset}: truncated (need {need} bytes, have {have})")]
    FieldTruncated {
        id: u16,
        offset: usize,
        need: usize,
        have: usize,
    },

    /// A variable-length prefix holds a byte that is not a digit of its encoding.
    #[error(
        "field {id} at offset {offset}: {format} length byte {byte:#04x} is not a {encoding} digit"
    )]
    BadLengthDigit {
        id: u16,
        offset: usize,
        format: &'static str,
        byte: u8,
        encoding: &'static str,
    },

    /// A variable-length prefix announces more than the field's maximum.
    #[error("field {id} at offset {offset}: {format} length {len} exceeds max {max}")]
    LengthTooLong {
        id: u16,
        offset: usize,
        format: &'static str,
        len: usize,
        max: usize,
    },

    /// A length counted in bits that is not a whole number of bytes.
    #[error("field {id} at offset {offset}: length {len} bits is not a whole number of bytes")]
    PartialByte { id: u16, offset: usize, len: usize },

    /// A field id outside 1..=192, or one the spec does not define.
    #[error("field {id}: not defined by the spec")]
    NoSuchField { id: u16 },

    /// A value does not fit its field definition (wrong kind, width or characters).
    /// The reason never quotes the value.
    #[error("field {id}: {reason}")]
    BadValue { id: u16, reason: ValueReason },

    /// The fields of a [`super::Decoded`] are not in strictly ascending id order.
    #[error("field {id}: fields must be in strictly ascending id order without duplicates")]
    FieldOrder { id: u16 },

    /// A response was asked of a message that is not a request.
    #[error("MTI {mti}: not a request, it has no response")]
    NotARequest { mti: super::Mti },

    /// Bytes follow the last field the bitmap announces.
    #[error("offset {offset}: {len} bytes after the last field")]
    TrailingBytes { offset: usize, len: usize },

    /// The message would be longer than the spec's `max_frame`.
    #[error("message of {len} bytes exceeds max_frame {max}")]
    TooLong { len: usize, max: usize },

    /// An in-place patch was given a range that is not the field's place in the buffer.
    #[error(
        "field {id}: range {start}..{end} is not a valid place in a buffer of {len} bytes for this field"
    )]
    BadRange {
        id: u16,
        start: usize,
        end: usize,
        len: usize,
    },

    /// An in-place patch was asked of a variable-length field.
    #[error("field {id}: only fixed-length fields can be patched in place")]
    NotFixed { id: u16 },
}

/// Why a spec could not be loaded. Every variant names the spec (its `name`, or the
/// path / `<toml>` before the name is known) and the field id or key at fault.
#[derive(Debug, Error)]
pub enum SpecError {
    #[error("spec {spec}: {source}")]
    Toml {
        spec: String,
        #[source]
        source: toml::de::Error,
    },

    #[error("spec {spec}: cannot read: {source}")]
    Io {
        spec: String,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "spec {name_or_path}: no builtin spec of that name (builtins: {builtins}) and no such file"
    )]
    NotFound {
        name_or_path: String,
        builtins: String,
    },

    #[error("spec {spec}: key {key}: {reason}")]
    BadKey {
        spec: String,
        key: &'static str,
        reason: KeyReason,
    },

    #[error("spec {spec}: field {id}: defined twice")]
    DuplicateField { spec: String, id: u16 },

    #[error("spec {spec}: field {id}: id out of range ({reason})")]
    FieldIdOutOfRange {
        spec: String,
        id: u16,
        reason: &'static str,
    },

    #[error("spec {spec}: field {id}: bad length: {reason}")]
    BadLength {
        spec: String,
        id: u16,
        reason: LengthReason,
    },

    #[error("spec {spec}: field {id}: {reason}")]
    BadField {
        spec: String,
        id: u16,
        reason: FieldReason,
    },

    #[error("spec {spec}: [bitmap] tertiary = true needs secondary = true")]
    TertiaryWithoutSecondary { spec: String },
}

/// Why a spec key outside `[[field]]` holds a value the switch cannot use:
/// a closed set, so a caller (and a test) matches on the reason instead of
/// reading text. The values quoted are the spec's own (MTIs, codes, field
/// ids), never message data.
#[derive(Debug, Error)]
pub enum KeyReason {
    #[error("must not be empty")]
    Empty,
    #[error("must be at least 1")]
    Zero,
    /// Not four digits (the text as written).
    #[error("{0:?}: {msg}", msg = crate::mti::NOT_AN_MTI)]
    NotAnMti(String),
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("field {0} is not defined")]
    FieldUndefined(u16),
    #[error("{value:?} does not fit field {id} (length {length})")]
    DoesNotFit {
        value: String,
        id: u16,
        length: usize,
    },
    /// A code the key lists cannot be a value of the field it is compared
    /// with (F39, F70).
    #[error(transparent)]
    NotAFieldValue(IsoError),
    #[error("{0} is not a reversal request or advice (04x0)")]
    NotAReversal(crate::mti::Mti),
    #[error(
        "F{0} is sensitive authentication data (track, PIN block or EMV data): a reversal is stored until delivered and may not carry it"
    )]
    SensitiveField(u16),
    #[error("{0:?} is not a 2-character response code")]
    NotAResponseCode(String),
    #[error("{0:?} is in more than one of saf_done, saf_reconcile, saf_retry")]
    InSeveralClasses(String),
    #[error("{0:?} is not the start of a processing code: 1 to 6 digits")]
    NotAProcessingCode(String),
    #[error("empty: no host answer would ever complete what the switch owes")]
    NoDoneCode,
    #[error(
        "F{0}: not a field of this dialect, or sensitive authentication data a stored reversal may not carry"
    )]
    NotAnAnswerField(u16),
    #[error("field {0} (or F4, the amount it replaces) is not defined")]
    ReplacementUndefined(u16),
    #[error("\"fresh\" sets F7 and F11, and the spec does not define both")]
    FreshWithoutKeys,
    #[error("{0:?} is not a network management code (F70): 1 to 4 digits")]
    NotAnF70Code(String),
}

/// A spec key and why its value is refused, before the spec's name is
/// known to the caller ([`SpecError::BadKey`] adds it).
#[derive(Debug, Error)]
#[error("key {key}: {reason}")]
pub struct KeyError {
    pub key: &'static str,
    pub reason: KeyReason,
}

/// Why a `[[field]]`'s `length` cannot be used.
#[derive(Debug, Error)]
pub enum LengthReason {
    #[error("must be at least 1")]
    Zero,
    #[error("{0} exceeds 65535")]
    TooLong(usize),
    #[error("{0} bits is not a whole number of bytes")]
    NotWholeBytes(usize),
    /// A variable field's maximum the length prefix cannot count.
    #[error("max {length} does not fit a {encoding} {format} length (at most {cap})")]
    PrefixTooSmall {
        length: usize,
        encoding: &'static str,
        format: &'static str,
        cap: usize,
    },
}

/// Why a `[[field]]` definition cannot be used (its keys together).
#[derive(Debug, Error)]
pub enum FieldReason {
    #[error("name must not be empty")]
    NoName,
    #[error("unit = \"digits\" does not apply to binary data")]
    DigitsOfBinary,
    #[error("unit = \"bits\" applies to binary data only")]
    BitsOfText,
    #[error("align and pad apply to BCD data counted in digits only")]
    AlignNotBcdDigits,
    #[error("pad {0:?} is not a hex nibble")]
    PadNotANibble(char),
    #[error("length_encoding applies to variable fields only")]
    EncodingOfFixed,
    #[error("variable field needs length_encoding (or [defaults] length_encoding)")]
    NoLengthEncoding,
    #[error("mask given but sensitive is false")]
    MaskNotSensitive,
    #[error("mask = \"pan\" needs text or BCD data")]
    PanMaskOfBinary,
    #[error("subelements apply to ascii or ebcdic data only")]
    SubelementsOfBinary,
    #[error("subelements: {0}")]
    Subelements(#[source] crate::spec::LayoutError),
}

/// Why a value does not fit its field ([`IsoError::BadValue`]): counts and
/// positions only, never the value.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ValueReason {
    #[error("length {units}, fixed length is {length}")]
    NotFixedLength { units: usize, length: usize },
    #[error("length {units} exceeds max {max}")]
    TooLong { units: usize, max: usize },
    #[error("{0} bits is not a whole number of bytes")]
    BitsNotWholeBytes(usize),
    #[error("{0} hex digits is not a whole number of bytes")]
    HexDigitsNotWholeBytes(usize),
    /// The 1-based position of the digit.
    #[error("BCD digit {0} is not 0-9 or A-F")]
    NotBcd(usize),
    #[error("binary field given a text value")]
    TextForBinary,
    #[error("text field given a binary value")]
    BinaryForText,
    #[error("character outside the one-byte (Latin-1) range")]
    NotLatin1,
    #[error("the node stamp needs F37 as ASCII or EBCDIC text")]
    StampNotText,
}
