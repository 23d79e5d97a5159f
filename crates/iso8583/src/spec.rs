//! Specs: one set of types describing every dialect, loaded from TOML
//! (`specs/*.toml`), validated at load, with per-field lookup tables precomputed
//! so that the message hot path does no hashing and no allocation.

use serde::{Deserialize, Serialize};

use super::error::{FieldReason, IsoError, KeyError, KeyReason, LengthReason, SpecError};
use super::mti::Mti;
use isoswitch_wire::{EnvelopeSpec, LengthPrefix};

mod cross;
mod integrity;
mod subelements;
pub(crate) use cross::{Cross, NOT_A_DIGIT, PREFIX_VALUE};
pub use integrity::{Integrity, RepeatKeys, SafAnswerClass, SafAnswerCodes};
use integrity::{IntegrityFile, validate_integrity};
use subelements::SubelementsFile;
pub use subelements::{LayoutError, Subelement, SubelementError, SubelementLayout, Subelements};

/// Highest field id (fields 129..=192 live in the tertiary bitmap).
pub const MAX_FIELD: u16 = 192;

/// How the MTI is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MtiEncoding {
    /// Four ASCII digits.
    Ascii,
    /// Two bytes BCD.
    Bcd,
    /// Four EBCDIC digits (0xF0..0xF9).
    Ebcdic,
}

/// How each bitmap is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BitmapEncoding {
    /// 8 raw bytes per bitmap.
    Binary,
    /// 16 ASCII hex digits per bitmap (upper case on output, either case on input).
    Hex,
}

/// Fixed or variable length, and for variable, how many digits the length has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    Fixed,
    Llvar,
    Lllvar,
    Llllvar,
}

impl Format {
    /// Decimal digits of the length prefix (0 for fixed).
    pub const fn digits(self) -> usize {
        match self {
            Format::Fixed => 0,
            Format::Llvar => 2,
            Format::Lllvar => 3,
            Format::Llllvar => 4,
        }
    }

    /// `fixed`, `LL`, `LLL`, `LLLL`: for messages.
    pub const fn label(self) -> &'static str {
        match self {
            Format::Fixed => "fixed",
            Format::Llvar => "LL",
            Format::Lllvar => "LLL",
            Format::Llllvar => "LLLL",
        }
    }
}

/// What a field's `length` (and its length prefix) counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unit {
    /// Digits / characters: BCD nibbles, or ASCII / EBCDIC characters.
    Digits,
    /// Bytes on the wire (for BCD: packed bytes, two nibbles each).
    Bytes,
    /// Bits (binary data only; a whole number of bytes).
    Bits,
}

/// How a field's content is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Data {
    /// One byte per character. Read as Latin-1 so that every byte round-trips.
    Ascii,
    /// Packed nibbles, read as hex digits 0-9 / A-F (track 2 holds `D`).
    Bcd,
    /// One EBCDIC (code page 037) byte per character.
    Ebcdic,
    /// Raw bytes.
    Binary,
}

/// Where the pad nibble of an odd-length BCD value goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Align {
    /// Value first, pad nibble after (e.g. a PAN `...123F`).
    Left,
    /// Pad nibble first, then the value (e.g. an amount `0840`).
    #[default]
    Right,
}

/// How a variable-length prefix is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LengthEncoding {
    /// One ASCII digit per digit of the format (LL = 2 bytes).
    Ascii,
    /// Packed BCD, right-aligned (LL = 1 byte, LLL / LLLL = 2 bytes).
    Bcd,
    /// Big-endian binary (LL = 1 byte, LLL / LLLL = 2 bytes).
    Binary,
    /// One EBCDIC digit per digit of the format.
    Ebcdic,
}

impl LengthEncoding {
    pub const fn label(self) -> &'static str {
        match self {
            LengthEncoding::Ascii => "ASCII",
            LengthEncoding::Bcd => "BCD",
            LengthEncoding::Binary => "binary",
            LengthEncoding::Ebcdic => "EBCDIC",
        }
    }
}

/// How a sensitive field is shown unless revealed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mask {
    /// First 6 and last 4 characters in clear (a PAN of 13+ characters), the rest `*`.
    Pan,
    /// Nothing but the length.
    #[default]
    Full,
}

/// `[framing]`: how frames are cut from the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Framing {
    pub prefix: LengthPrefix,
    /// Largest payload (frame without its length prefix) accepted or produced.
    pub max_frame: usize,
}

/// `[mti]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MtiSpec {
    pub encoding: MtiEncoding,
}

fn yes() -> bool {
    true
}

/// `[bitmap]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BitmapSpec {
    pub encoding: BitmapEncoding,
    /// Bit 1 announces a secondary bitmap (fields 65..=128). Default true.
    #[serde(default = "yes")]
    pub secondary: bool,
    /// Bit 65 announces a tertiary bitmap (fields 129..=192); field 65 then does not
    /// exist. Default false.
    #[serde(default)]
    pub tertiary: bool,
}

impl BitmapSpec {
    /// Bytes of one bitmap on the wire.
    pub const fn width(&self) -> usize {
        match self.encoding {
            BitmapEncoding::Binary => 8,
            BitmapEncoding::Hex => 16,
        }
    }
}

/// `[network]`: network-management facts the switch needs per link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Network {
    /// MTI of the echo test (e.g. 0800 or 0820).
    pub echo_mti: Option<Mti>,
    /// F70 of the echo test (e.g. `301`).
    pub echo_f70: Option<String>,
    /// F70 of sign-on (e.g. `001`).
    pub sign_on_f70: Option<String>,
    /// F70 of sign-off (e.g. `002`).
    pub sign_off_f70: Option<String>,
    /// Fields a switch-made response copies from its request (ascending).
    pub echo_fields: Vec<u16>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkFile {
    echo_mti: Option<String>,
    echo_f70: Option<String>,
    sign_on_f70: Option<String>,
    sign_off_f70: Option<String>,
    #[serde(default)]
    echo_fields: Vec<u16>,
}

/// `[defaults]`: values fields inherit unless they say otherwise.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    length_encoding: Option<LengthEncoding>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FieldFile {
    id: u16,
    name: String,
    format: Format,
    length: usize,
    unit: Option<Unit>,
    data: Data,
    align: Option<Align>,
    pad: Option<char>,
    length_encoding: Option<LengthEncoding>,
    #[serde(default)]
    sensitive: bool,
    mask: Option<Mask>,
    subelements: Option<SubelementsFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    name: String,
    #[serde(default)]
    description: String,
    framing: Framing,
    #[serde(default)]
    envelope: EnvelopeSpec,
    mti: MtiSpec,
    bitmap: BitmapSpec,
    #[serde(default)]
    network: NetworkFile,
    #[serde(default)]
    integrity: IntegrityFile,
    #[serde(default)]
    defaults: Defaults,
    #[serde(rename = "field", default)]
    fields: Vec<FieldFile>,
}

/// One field of a spec, validated, with what the hot path needs precomputed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDef {
    pub id: u16,
    pub name: String,
    pub format: Format,
    /// The fixed length, or the maximum, in `unit`s.
    pub length: usize,
    pub unit: Unit,
    pub data: Data,
    /// BCD only: where the pad nibble of an odd digit count goes.
    pub align: Align,
    /// BCD only: the pad nibble written (0x0..=0xF). Any nibble is accepted on input.
    pub pad: u8,
    /// Variable-length fields only.
    pub length_encoding: Option<LengthEncoding>,
    pub sensitive: bool,
    pub mask: Mask,
    /// Text fields only: the tag-length-value layout of the content, for
    /// display (`decode`); the codec carries the field whole.
    pub subelements: Option<Subelements>,
    /// Bytes of the length prefix (0 for fixed).
    pub(crate) prefix_len: usize,
    /// Bytes of the data of a fixed field (0 for variable).
    pub(crate) fixed_len: usize,
}

impl FieldDef {
    pub fn is_fixed(&self) -> bool {
        self.format == Format::Fixed
    }

    /// Bytes of the length prefix (0 for fixed).
    pub fn prefix_len(&self) -> usize {
        self.prefix_len
    }

    /// Bytes of the data of a fixed field (`None` for variable).
    pub fn fixed_len(&self) -> Option<usize> {
        self.is_fixed().then_some(self.fixed_len)
    }

    /// Data bytes for `units` units, or `None` for a bit count that is not whole bytes.
    pub(crate) fn wire_len(&self, units: usize) -> Option<usize> {
        match (self.data, self.unit) {
            (Data::Bcd, Unit::Digits) => Some(units.div_ceil(2)),
            (_, Unit::Bits) => units.is_multiple_of(8).then_some(units / 8),
            _ => Some(units),
        }
    }

    /// Largest value a prefix of this field's format and encoding can hold.
    fn prefix_capacity(format: Format, enc: LengthEncoding) -> usize {
        match (enc, format) {
            (_, Format::Fixed) => 0,
            (LengthEncoding::Binary, Format::Llvar) => 0xFF,
            (LengthEncoding::Binary, _) => 0xFFFF,
            (_, f) => 10usize.pow(f.digits() as u32) - 1,
        }
    }

    fn prefix_bytes(format: Format, enc: LengthEncoding) -> usize {
        let d = format.digits();
        match enc {
            LengthEncoding::Ascii | LengthEncoding::Ebcdic => d,
            LengthEncoding::Bcd => d.div_ceil(2),
            LengthEncoding::Binary => {
                if d <= 2 {
                    1
                } else {
                    2
                }
            }
        }
    }
}

/// A validated dialect description. Build with [`Spec::from_toml`], [`Spec::load`],
/// [`Spec::builtin`] or [`Spec::resolve`].
#[derive(Clone, Debug)]
pub struct Spec {
    name: String,
    description: String,
    framing: Framing,
    envelope: EnvelopeSpec,
    mti: MtiSpec,
    bitmap: BitmapSpec,
    network: Network,
    integrity: Integrity,
    fields: Vec<FieldDef>,
    /// `slot[id]` = index into `fields` + 1, or 0: no hashing on the hot path.
    slot: [u8; MAX_FIELD as usize + 1],
    /// `step[id]`: how the routing walk crosses field `id` without reading
    /// its definition ([`Step`]), dense so one cache line covers 16 fields.
    step: [u32; MAX_FIELD as usize + 1],
    /// `cross[id]`: everything the whole-message index needs to cross
    /// field `id` (`Message::index`), 256 long so that a `u8` id needs no
    /// bounds check.
    cross: Box<[Cross; 256]>,
}

/// What [`Spec::step`] says of a field: the bytes a fixed field spans, or
/// one of these two markers.
pub struct Step;

impl Step {
    /// No such field in this spec.
    pub const UNDEFINED: u32 = u32::MAX;
    /// A variable field: its length prefix must be read.
    pub const VARIABLE: u32 = u32::MAX - 1;
}

/// The specs shipped in `specs/`, embedded at build time.
const BUILTINS: [(&str, &str); 7] = [
    ("cups", include_str!("../../../specs/cups.toml")),
    ("cup-pos", include_str!("../../../specs/cup-pos.toml")),
    ("visa-base1", include_str!("../../../specs/visa-base1.toml")),
    ("iso87ascii", include_str!("../../../specs/iso87ascii.toml")),
    (
        "iso87binary",
        include_str!("../../../specs/iso87binary.toml"),
    ),
    (
        "iso93binary",
        include_str!("../../../specs/iso93binary.toml"),
    ),
    ("mastercard", include_str!("../../../specs/mastercard.toml")),
];

impl Spec {
    /// Parses and validates a spec from TOML text.
    pub fn from_toml(text: &str) -> Result<Spec, SpecError> {
        Self::from_toml_named(text, "<toml>")
    }

    /// [`Spec::from_toml`], naming `origin` (a file, a builtin) in errors.
    pub fn from_toml_named(text: &str, origin: &str) -> Result<Spec, SpecError> {
        let file: SpecFile = toml::from_str(text).map_err(|source| SpecError::Toml {
            spec: origin.to_string(),
            source,
        })?;
        Spec::validate(file)
    }

    /// One of the specs shipped in `specs/` (see [`Spec::builtin_names`]).
    pub fn builtin(name: &str) -> Option<Spec> {
        let (_, text) = BUILTINS.iter().find(|(n, _)| *n == name)?;
        // The builtins are tested to load; a broken one is reported as absent.
        Self::from_toml_named(text, name).ok()
    }

    /// Names of the builtin specs.
    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTINS.iter().map(|(n, _)| *n)
    }

    /// A builtin spec by name, parsed (its error, if it is broken); `None`
    /// if no builtin has that name. Specs from files are the switch's
    /// business (`SpecFiles` in the isoswitch crate): this crate does no I/O.
    pub fn builtin_checked(name: &str) -> Option<Result<Spec, SpecError>> {
        let (name, text) = BUILTINS.iter().find(|(n, _)| *n == name)?;
        Some(Self::from_toml_named(text, name))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    pub fn envelope(&self) -> EnvelopeSpec {
        self.envelope
    }

    pub fn mti_encoding(&self) -> MtiEncoding {
        self.mti.encoding
    }

    pub fn bitmap(&self) -> BitmapSpec {
        self.bitmap
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    pub fn integrity(&self) -> &Integrity {
        &self.integrity
    }

    /// All fields, ascending by id.
    pub fn fields(&self) -> &[FieldDef] {
        &self.fields
    }

    /// How the routing walk crosses field `id` (see [`Step`]).
    #[inline]
    #[doc(hidden)]
    pub fn step(&self, id: u16) -> u32 {
        self.step
            .get(id as usize)
            .copied()
            .unwrap_or(Step::UNDEFINED)
    }

    /// How the whole-message index crosses each field, by id (see [`Cross`]).
    #[inline]
    pub(crate) fn cross(&self) -> &[Cross; 256] {
        &self.cross
    }

    /// The definition of field `id`, by table lookup.
    #[inline]
    pub fn field(&self, id: u16) -> Option<&FieldDef> {
        let slot = *self.slot.get(id as usize)?;
        if slot == 0 {
            return None;
        }
        self.fields.get(slot as usize - 1)
    }

    /// Bytes of the MTI on the wire.
    pub fn mti_len(&self) -> usize {
        match self.mti.encoding {
            MtiEncoding::Bcd => 2,
            MtiEncoding::Ascii | MtiEncoding::Ebcdic => 4,
        }
    }

    fn validate(file: SpecFile) -> Result<Spec, SpecError> {
        let spec = file.name.clone();
        let bad_key = |key: &'static str, reason: KeyReason| SpecError::BadKey {
            spec: spec.clone(),
            key,
            reason,
        };
        if file.name.trim().is_empty() {
            return Err(bad_key("name", KeyReason::Empty));
        }
        if file.framing.max_frame == 0 {
            return Err(bad_key("framing.max_frame", KeyReason::Zero));
        }
        let bitmap = file.bitmap;
        if bitmap.tertiary && !bitmap.secondary {
            return Err(SpecError::TertiaryWithoutSecondary { spec });
        }

        let mut fields = Vec::with_capacity(file.fields.len());
        let mut slot = [0u8; MAX_FIELD as usize + 1];
        for f in file.fields {
            let def = validate_field(&spec, bitmap, file.defaults, f)?;
            let id = def.id as usize;
            if slot[id] != 0 {
                return Err(SpecError::DuplicateField { spec, id: def.id });
            }
            slot[id] = 1; // placeholder; indices assigned after sorting
            fields.push(def);
        }
        fields.sort_by_key(|d| d.id);
        let mut step = [Step::UNDEFINED; MAX_FIELD as usize + 1];
        let mut cross = Box::new([Cross::UNDEFINED; 256]);
        for (i, d) in fields.iter().enumerate() {
            cross[d.id as usize] = Cross::of(d);
            // At most 191 fields (ids 2..=192), so the index fits a u8.
            slot[d.id as usize] = (i + 1) as u8;
            step[d.id as usize] = match d.length_encoding {
                Some(_) => Step::VARIABLE,
                // A fixed field longer than a u32 could hold fails the walk's
                // bounds check anyway; saturate below the markers.
                None => u32::try_from(d.fixed_len)
                    .map_or(Step::VARIABLE - 1, |n| n.min(Step::VARIABLE - 1)),
            };
        }

        let n = file.network;
        let echo_mti = match &n.echo_mti {
            None => None,
            Some(s) => Some(
                s.parse::<Mti>()
                    .map_err(|_| bad_key("network.echo_mti", KeyReason::NotAnMti(s.clone())))?,
            ),
        };
        for (key, value) in [
            ("network.echo_f70", &n.echo_f70),
            ("network.sign_on_f70", &n.sign_on_f70),
            ("network.sign_off_f70", &n.sign_off_f70),
        ] {
            if let Some(v) = value {
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad_key(key, KeyReason::NotANumber(v.clone())));
                }
                let Some(f70) = fields.iter().find(|d| d.id == 70) else {
                    return Err(bad_key(key, KeyReason::FieldUndefined(70)));
                };
                if f70.is_fixed() && v.len() != f70.length {
                    return Err(bad_key(
                        key,
                        KeyReason::DoesNotFit {
                            value: v.clone(),
                            id: 70,
                            length: f70.length,
                        },
                    ));
                }
            }
        }
        let mut echo_fields = n.echo_fields.clone();
        echo_fields.sort_unstable();
        echo_fields.dedup();
        for &id in &echo_fields {
            if slot.get(id as usize).copied().unwrap_or(0) == 0 {
                return Err(bad_key(
                    "network.echo_fields",
                    KeyReason::FieldUndefined(id),
                ));
            }
        }

        let integrity =
            validate_integrity(&file.integrity, &slot).map_err(|KeyError { key, reason }| {
                SpecError::BadKey {
                    spec: spec.clone(),
                    key,
                    reason,
                }
            })?;

        Spec {
            name: file.name,
            description: file.description,
            framing: file.framing,
            envelope: file.envelope,
            mti: file.mti,
            bitmap,
            network: Network {
                echo_mti,
                echo_f70: n.echo_f70,
                sign_on_f70: n.sign_on_f70,
                sign_off_f70: n.sign_off_f70,
                echo_fields,
            },
            integrity,
            fields,
            slot,
            step,
            cross,
        }
        .with_codes_checked(file.integrity.approval_codes.is_some())
    }

    /// The integrity codes are compared with messages as values of their
    /// fields (F39, F70): each must be one. The default approval codes are
    /// checked only where a spec names its own (a spec whose F39 is not two
    /// characters serves decode only, and says so elsewhere).
    fn with_codes_checked(self, own_approval_codes: bool) -> Result<Spec, SpecError> {
        let bad = |key: &'static str, e: IsoError| SpecError::BadKey {
            spec: self.name.clone(),
            key,
            reason: KeyReason::NotAFieldValue(e),
        };
        if own_approval_codes && self.field(39).is_some() {
            self.field_codes(39, &self.integrity.approval_codes)
                .map_err(|e| bad("integrity.approval_codes", e))?;
            let a = &self.integrity.saf_answers;
            for (key, codes) in [
                ("integrity.saf_done", &a.done),
                ("integrity.saf_reconcile", &a.reconcile),
                ("integrity.saf_retry", &a.retry),
            ] {
                self.field_codes(39, codes).map_err(|e| bad(key, e))?;
            }
        }
        if self.field(70).is_some() {
            self.field_codes(70, &self.integrity.institution_f70)
                .map_err(|e| bad("integrity.institution_f70", e))?;
        }
        Ok(self)
    }
}

fn validate_field(
    spec: &str,
    bitmap: BitmapSpec,
    defaults: Defaults,
    f: FieldFile,
) -> Result<FieldDef, SpecError> {
    let id = f.id;
    let out_of_range = |reason| SpecError::FieldIdOutOfRange {
        spec: spec.to_string(),
        id,
        reason,
    };
    let bad = |reason: FieldReason| SpecError::BadField {
        spec: spec.to_string(),
        id,
        reason,
    };
    let bad_len = |reason: LengthReason| SpecError::BadLength {
        spec: spec.to_string(),
        id,
        reason,
    };
    match id {
        0 | 1 => {
            return Err(out_of_range(
                "field 1 is the secondary bitmap; ids start at 2",
            ));
        }
        65 if bitmap.tertiary => {
            return Err(out_of_range(
                "bit 65 announces the tertiary bitmap in this spec",
            ));
        }
        65..=128 if !bitmap.secondary => {
            return Err(out_of_range("ids above 64 need [bitmap] secondary = true"));
        }
        129..=MAX_FIELD if !bitmap.tertiary => {
            return Err(out_of_range("ids above 128 need [bitmap] tertiary = true"));
        }
        129..=MAX_FIELD | 2..=128 => {}
        _ => return Err(out_of_range("ids end at 192")),
    }
    if f.name.trim().is_empty() {
        return Err(bad(FieldReason::NoName));
    }

    let unit = match (f.data, f.unit) {
        (Data::Bcd, None) => Unit::Digits,
        (_, None) => Unit::Bytes,
        (Data::Binary, Some(Unit::Digits)) => {
            return Err(bad(FieldReason::DigitsOfBinary));
        }
        (Data::Ascii | Data::Ebcdic | Data::Bcd, Some(Unit::Bits)) => {
            return Err(bad(FieldReason::BitsOfText));
        }
        (_, Some(u)) => u,
    };

    let bcd_digits = f.data == Data::Bcd && unit == Unit::Digits;
    if !bcd_digits && (f.align.is_some() || f.pad.is_some()) {
        return Err(bad(FieldReason::AlignNotBcdDigits));
    }
    let pad = match f.pad {
        None => 0,
        Some(c) => c
            .to_digit(16)
            .map(|d| d as u8)
            .ok_or_else(|| bad(FieldReason::PadNotANibble(c)))?,
    };

    if f.length == 0 {
        return Err(bad_len(LengthReason::Zero));
    }
    if f.length > 0xFFFF {
        return Err(bad_len(LengthReason::TooLong(f.length)));
    }
    if unit == Unit::Bits && f.format == Format::Fixed && !f.length.is_multiple_of(8) {
        return Err(bad_len(LengthReason::NotWholeBytes(f.length)));
    }

    let length_encoding = match (f.format, f.length_encoding.or(defaults.length_encoding)) {
        (Format::Fixed, _) if f.length_encoding.is_some() => {
            return Err(bad(FieldReason::EncodingOfFixed));
        }
        (Format::Fixed, _) => None,
        (_, None) => {
            return Err(bad(FieldReason::NoLengthEncoding));
        }
        (format, Some(enc)) => {
            let cap = FieldDef::prefix_capacity(format, enc);
            if f.length > cap {
                return Err(bad_len(LengthReason::PrefixTooSmall {
                    length: f.length,
                    encoding: enc.label(),
                    format: format.label(),
                    cap,
                }));
            }
            Some(enc)
        }
    };

    let mask = match (f.sensitive, f.mask) {
        (false, Some(_)) => return Err(bad(FieldReason::MaskNotSensitive)),
        (_, Some(Mask::Pan)) if f.data == Data::Binary => {
            return Err(bad(FieldReason::PanMaskOfBinary));
        }
        (_, m) => m.unwrap_or_default(),
    };

    let subelements = match f.subelements {
        None => None,
        Some(_) if !matches!(f.data, Data::Ascii | Data::Ebcdic) => {
            return Err(bad(FieldReason::SubelementsOfBinary));
        }
        Some(file) => Some(
            Subelements::validate(file, f.length).map_err(|r| bad(FieldReason::Subelements(r)))?,
        ),
    };

    let prefix_len = length_encoding
        .map(|e| FieldDef::prefix_bytes(f.format, e))
        .unwrap_or(0);
    let mut def = FieldDef {
        id,
        name: f.name,
        format: f.format,
        length: f.length,
        unit,
        data: f.data,
        align: f.align.unwrap_or_default(),
        pad,
        length_encoding,
        sensitive: f.sensitive,
        mask,
        subelements,
        prefix_len,
        fixed_len: 0,
    };
    if def.is_fixed() {
        def.fixed_len = def.wire_len(def.length).unwrap_or(0);
    }
    Ok(def)
}

#[cfg(test)]
mod tests;
