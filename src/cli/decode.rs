//! `isoswitch decode`: a protocol dissector for framed ISO 8583 messages.
//!
//! Input is one or more frames (length prefix + payload) as the spec frames them,
//! given as hex (`--hex`, or a file / stdin holding only hex digits, whitespace
//! and `#` comments) or as raw bytes. Each frame is cut with the spec's prefix
//! and maximum frame length, and each message is shown field by field, sensitive
//! fields masked unless `--reveal`.
//!
//! Errors name the frame, its stream offset and the field, using the typed
//! errors' `Display`; decoding goes on with the next frame after a message that
//! cannot be decoded (its frame boundary is known), and stops at a length prefix
//! that cannot be trusted. Any error makes the exit status 1.

/// `decode --pcap`: the messages of a capture file.
mod json;
mod pcap;
mod subelements;

use json::json_message;

use std::fmt;
use std::io::{self, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::iso8583::SpecFiles;
use crate::iso8583::{BitmapEncoding, Data, FieldDef, FieldRef, IsoError, Layout, Mti, Spec};
use crate::wire::envelope::Rejected;
use crate::wire::prefix::split_frame;
use crate::wire::visa::VisaReject;
use crate::wire::{Header, LengthPrefix, WireError};

/// `isoswitch decode`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Input: --hex HEX, or FILE, or `-` / nothing for stdin. A file whose content is only \
hex digits, whitespace and `#` comments is read as hex, anything else as raw bytes \
(--raw forces raw bytes).

Text output shows, per frame: number, stream offset, prefix and length; the \
envelope (TPDU, CUPS / POS / VISA header, reject and original header); the MTI; \
the bitmaps; every field with its payload offset, name, length and value. \
--json prints one object per message per line (keep-alive and session-control \
frames are not messages and print nothing): \
{\"mti\",\"tpdu\",\"header\",\"fields\":{\"2\":...}}, binary values as upper-case hex.

Sensitive fields are masked: those the spec flags, and PAN, track data, PIN \
block, EMV data and MACs whatever the spec says (a spec that leaves them \
unflagged gets a warning). A PAN shows its first 6 and last 4 digits, anything \
else only its length. --reveal shows them in clear: test systems only.

Exit status 1 if any frame or message cannot be decoded (after printing what \
decoded before it).")]
pub struct DecodeArgs {
    /// Dialect: a builtin spec (cups, cup-pos, visa-base1, mastercard,
    /// iso87ascii, iso87binary, iso93binary) or a spec file. With --pcap: guessed when not given.
    #[arg(long, required_unless_present = "pcap")]
    pub spec: Option<String>,
    /// A pcap or pcapng capture (isoswitch, tcpdump, Wireshark): TCP streams
    /// are reassembled and each message shown with time, direction and
    /// connection.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["hex", "file", "raw"])]
    pub pcap: Option<PathBuf>,
    /// With --pcap: the switch config, to pick each connection's spec by its
    /// server port.
    #[arg(long, value_name = "FILE", requires = "pcap")]
    pub config: Option<PathBuf>,
    /// Framed messages as hex digits (spaces and newlines allowed).
    #[arg(long, value_name = "HEX", conflicts_with_all = ["file", "raw"])]
    pub hex: Option<String>,
    /// File of framed messages (hex text or raw bytes); `-` or nothing: stdin.
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// One JSON object per message per line.
    #[arg(long)]
    pub json: bool,
    /// Show sensitive fields in clear (test systems only).
    #[arg(long)]
    pub reveal: bool,
    /// Read FILE / stdin as raw bytes even if it looks like hex text.
    #[arg(long)]
    pub raw: bool,
}

/// How to show what is decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// One JSON object per message per line instead of the text dissection.
    pub json: bool,
    /// Show sensitive fields in clear.
    pub reveal: bool,
}

/// What a run of [`decode_stream`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Frames cut from the input (keep-alives included).
    pub frames: usize,
    /// Messages decoded completely.
    pub messages: usize,
    /// Frames or messages that could not be decoded.
    pub errors: usize,
}

/// Why hex input could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HexError {
    /// A character that is not a hex digit, whitespace or part of a `#` comment.
    BadChar {
        offset: usize,
        line: usize,
        column: usize,
        byte: u8,
    },
    /// An odd number of hex digits: the last byte is half there.
    OddDigits { digits: usize },
}

impl fmt::Display for HexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            HexError::BadChar {
                offset,
                line,
                column,
                byte,
            } => write!(
                f,
                "hex input at offset {offset} (line {line}, column {column}): byte {byte:#04x} \
                 is not a hex digit"
            ),
            HexError::OddDigits { digits } => write!(
                f,
                "hex input: odd number of hex digits ({digits}), the last byte is incomplete"
            ),
        }
    }
}

impl std::error::Error for HexError {}

/// Reads hex text: hex digits (either case), ASCII whitespace, and `#` comments
/// running to the end of their line.
pub fn parse_hex(text: &[u8]) -> Result<Vec<u8>, HexError> {
    let mut out = Vec::with_capacity(text.len() / 2);
    let mut high: Option<u8> = None;
    let mut digits = 0usize;
    let mut in_comment = false;
    let (mut line, mut line_start) = (1usize, 0usize);
    for (offset, &byte) in text.iter().enumerate() {
        if byte == b'\n' {
            in_comment = false;
            line += 1;
            line_start = offset + 1;
            continue;
        }
        if in_comment || byte.is_ascii_whitespace() {
            continue;
        }
        if byte == b'#' {
            in_comment = true;
            continue;
        }
        let Some(nibble) = hex_value(byte) else {
            return Err(HexError::BadChar {
                offset,
                line,
                column: offset - line_start + 1,
                byte,
            });
        };
        digits += 1;
        match high.take() {
            None => high = Some(nibble),
            Some(h) => out.push((h << 4) | nibble),
        }
    }
    if high.is_some() {
        return Err(HexError::OddDigits { digits });
    }
    Ok(out)
}

/// Whether a file's content is hex text: only hex digits, whitespace and `#`
/// comments (an odd digit count still counts as hex, and fails in [`parse_hex`]).
pub fn looks_like_hex(content: &[u8]) -> bool {
    !matches!(parse_hex(content), Err(HexError::BadChar { .. }))
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Says on stderr which always-sensitive fields `spec` leaves without the
/// `sensitive` flag: they are masked all the same, but the spec is wrong.
pub fn warn_unflagged(spec: &Spec) {
    let missing = crate::iso8583::unflagged_sensitive(spec);
    if missing.is_empty() {
        return;
    }
    let list: Vec<String> = missing.iter().map(|id| format!("F{id}")).collect();
    eprintln!(
        "isoswitch decode: warning: spec `{}` does not flag {} sensitive; masked anyway \
         (PAN, track data, PIN block, EMV data and MACs always are; --reveal shows them)",
        spec.name(),
        list.join(", ")
    );
}

/// Runs `isoswitch decode`.
pub fn run(a: &DecodeArgs) -> ExitCode {
    if let Some(path) = &a.pcap {
        return pcap::run(a, path);
    }
    let spec = match Spec::resolve(a.spec.as_deref().unwrap_or_default()) {
        Ok(s) => s,
        Err(e) => return fail(&e.to_string()),
    };
    warn_unflagged(&spec);
    let input = match read_input(a) {
        Ok(bytes) => bytes,
        Err(e) => return fail(&e.to_string()),
    };
    if input.is_empty() {
        return fail("no input: nothing to decode");
    }
    let opts = Options {
        json: a.json,
        reveal: a.reveal,
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut errs = io::stderr();
    let result = decode_stream(&spec, &input, opts, &mut out, &mut errs).and_then(|summary| {
        out.flush()?;
        Ok(summary)
    });
    match result {
        Ok(summary) if summary.errors == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        // `isoswitch decode ... | head`: the reader left, nothing to report.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot write the output: {e}")),
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("isoswitch decode: {msg}");
    ExitCode::FAILURE
}

/// Why the input of `isoswitch decode` could not be read; each variant
/// names where it came from (`--hex`, the file, stdin).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("--hex: {0}")]
    HexFlag(#[source] HexError),
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read stdin: {0}")]
    Stdin(#[source] io::Error),
    /// Hex text in the file (its name) or stdin (`stdin`).
    #[error("{name}: {source}")]
    Hex {
        name: String,
        #[source]
        source: HexError,
    },
}

/// The bytes to decode: `--hex`, else FILE or stdin, hex text or raw.
fn read_input(a: &DecodeArgs) -> Result<Vec<u8>, InputError> {
    if let Some(hex) = &a.hex {
        return parse_hex(hex.as_bytes()).map_err(InputError::HexFlag);
    }
    let (name, content) = match &a.file {
        Some(path) if path.as_os_str() != "-" => {
            let content = std::fs::read(path).map_err(|source| InputError::Read {
                path: path.clone(),
                source,
            })?;
            (path.display().to_string(), content)
        }
        _ => {
            let mut content = Vec::new();
            io::stdin()
                .lock()
                .read_to_end(&mut content)
                .map_err(InputError::Stdin)?;
            ("stdin".to_string(), content)
        }
    };
    if a.raw || !looks_like_hex(&content) {
        return Ok(content);
    }
    parse_hex(&content).map_err(|source| InputError::Hex { name, source })
}

/// Cuts `input` into frames with the spec's prefix and maximum frame, and writes
/// each one (text, or JSON per message) to `out`; errors go to `errs`, each
/// naming the frame, its offset and the field. Stops at a length prefix that
/// cannot be trusted; goes on after a message that cannot be decoded.
pub fn decode_stream(
    spec: &Spec,
    input: &[u8],
    opts: Options,
    out: &mut impl Write,
    errs: &mut impl Write,
) -> io::Result<Summary> {
    let framing = spec.framing();
    let prefix = framing.prefix;
    let mut summary = Summary::default();
    let mut at = 0usize;
    while let Some(rest) = input.get(at..).filter(|r| !r.is_empty()) {
        let number = summary.frames + 1;
        let split = match split_frame(prefix, rest, framing.max_frame) {
            Ok(Some(split)) => Ok(split),
            Ok(None) => Err(truncated(prefix, rest, framing.max_frame, at)),
            Err(e) => Err(e.shifted(at)),
        };
        let split = match split {
            Ok(s) => s,
            Err(e) => {
                out.flush()?;
                writeln!(errs, "isoswitch decode: frame {number} at offset {at}: {e}")?;
                summary.errors += 1;
                break;
            }
        };
        summary.frames = number;
        let frame = FrameAt {
            number,
            offset: at,
            prefix,
            prefix_bytes: rest.get(..prefix.len()).unwrap_or_default(),
            payload: split.payload,
        };
        at += split.consumed;

        if split.header.session_control {
            if !opts.json {
                frame.write_head(out, "session control")?;
                kv(out, 2, "payload", Hex(frame.payload))?;
            }
            continue;
        }
        if split.payload.is_empty() {
            if !opts.json {
                frame.write_head(out, "keep-alive")?;
            }
            continue;
        }
        let result = if opts.json {
            json_message(spec, frame.payload, opts.reveal, out)
        } else {
            frame.write_head(out, "")?;
            text_message(spec, frame.payload, opts.reveal, out)
        };
        match result {
            Ok(Ok(())) => summary.messages += 1,
            Ok(Err(e)) => {
                out.flush()?;
                let payload_at = frame.offset + prefix.len();
                write!(
                    errs,
                    "isoswitch decode: frame {number} at offset {} (payload at {payload_at}): {e}",
                    frame.offset
                )?;
                match iso_offset(&e) {
                    Some(o) => writeln!(errs, "; stream offset {}", payload_at + o)?,
                    None => writeln!(errs)?,
                }
                summary.errors += 1;
            }
            Err(io) => return Err(io),
        }
    }
    Ok(summary)
}

/// The error for a frame that the input ends inside of.
fn truncated(prefix: LengthPrefix, rest: &[u8], max_frame: usize, at: usize) -> WireError {
    let need = match prefix.parse_header(rest, max_frame) {
        Ok(Some(h)) => prefix.len().saturating_add(h.payload_len),
        _ => {
            return WireError::Truncated {
                what: "length prefix",
                offset: at,
                need: prefix.len(),
                have: rest.len(),
            };
        }
    };
    WireError::Truncated {
        what: "frame",
        offset: at,
        need,
        have: rest.len(),
    }
}

/// The payload offset an [`IsoError`] names, if it names one.
fn iso_offset(e: &IsoError) -> Option<usize> {
    match e {
        IsoError::Envelope(w) => Some(w.offset()),
        IsoError::Truncated { offset, .. }
        | IsoError::BadMti { offset, .. }
        | IsoError::BadBitmap { offset, .. }
        | IsoError::UndefinedField { offset, .. }
        | IsoError::FieldTruncated { offset, .. }
        | IsoError::BadLengthDigit { offset, .. }
        | IsoError::LengthTooLong { offset, .. }
        | IsoError::PartialByte { offset, .. }
        | IsoError::TrailingBytes { offset, .. } => Some(*offset),
        _ => None,
    }
}

/// One frame cut from the input.
struct FrameAt<'a> {
    number: usize,
    offset: usize,
    prefix: LengthPrefix,
    prefix_bytes: &'a [u8],
    payload: &'a [u8],
}

impl FrameAt<'_> {
    fn write_head(&self, out: &mut impl Write, what: &str) -> io::Result<()> {
        if self.number > 1 {
            writeln!(out)?;
        }
        write!(
            out,
            "frame {}  offset {}  prefix {} ",
            self.number, self.offset, self.prefix
        )?;
        if self.prefix == LengthPrefix::Ascii4 {
            write!(out, "\"{}\"", String::from_utf8_lossy(self.prefix_bytes))?;
        } else {
            write!(out, "{}", Hex(self.prefix_bytes))?;
        }
        write!(out, "  length {}", self.payload.len())?;
        if !what.is_empty() {
            write!(out, "  {what}")?;
        }
        writeln!(out)
    }
}

/// Upper-case hex of bytes.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    Hex(bytes).to_string()
}

/// A decode error inside a message (`Ok(Err(_))`), or an output error (`Err(_)`).
type Shown = io::Result<Result<(), IsoError>>;

/// One message payload, dissected as text or one JSON line (for `--pcap`,
/// which prints its own frame heads).
pub(crate) fn write_message(
    spec: &Spec,
    payload: &[u8],
    opts: Options,
    out: &mut impl Write,
) -> Shown {
    if opts.json {
        json_message(spec, payload, opts.reveal, out)
    } else {
        text_message(spec, payload, opts.reveal, out)
    }
}

/// Key column of the text dissection.
const KEY: usize = 24;

fn kv(out: &mut impl Write, indent: usize, key: &str, value: impl fmt::Display) -> io::Result<()> {
    let width = KEY.saturating_sub(indent);
    writeln!(out, "{:indent$}{key:<width$}{value}", "")
}

fn text_message(spec: &Spec, payload: &[u8], reveal: bool, out: &mut impl Write) -> Shown {
    // The envelope first on its own, so that a bad body still shows it.
    let envelope = match spec.envelope().parse(payload) {
        Ok(env) => env,
        Err(e) => return Ok(Err(IsoError::Envelope(e))),
    };
    if let Some(t) = envelope.tpdu {
        kv(
            out,
            2,
            "TPDU",
            format_args!(
                "{t}  id {:02X}  destination {}  source {}",
                t.id,
                Hex(&t.destination),
                Hex(&t.source)
            ),
        )?;
    }
    if let Some(h) = &envelope.header {
        text_header(out, 2, h, Some(payload.len()))?;
    }
    if let Some(r) = &envelope.rejected {
        text_rejected(out, r)?;
    }
    let layout = match spec.layout(payload) {
        Ok(l) => l,
        Err(e) => return Ok(Err(e)),
    };
    kv(
        out,
        2,
        "MTI",
        format_args!("{}  {}", layout.mti, describe_mti(layout.mti)),
    )?;
    text_bitmaps(spec, &layout, out)?;
    text_fields(spec, &layout, payload, reveal, out)
}

fn text_bitmaps(spec: &Spec, layout: &Layout, out: &mut impl Write) -> io::Result<()> {
    let names = ["primary", "secondary", "tertiary"];
    let encoding = match spec.bitmap().encoding {
        BitmapEncoding::Binary => "binary",
        BitmapEncoding::Hex => "hex",
    };
    for (i, (word, name)) in layout
        .bitmap
        .0
        .iter()
        .zip(names)
        .take(usize::from(layout.bitmaps))
        .enumerate()
    {
        let key = if i == 0 { "bitmap" } else { "" };
        kv(
            out,
            2,
            key,
            format_args!("{word:016X}  {name} ({encoding})"),
        )?;
    }
    let ids: Vec<String> = layout.present.iter().map(|id| id.to_string()).collect();
    kv(out, 2, "fields", ids.join(" "))
}

fn text_fields(
    spec: &Spec,
    layout: &Layout,
    payload: &[u8],
    reveal: bool,
    out: &mut impl Write,
) -> Shown {
    let name_width = layout
        .present
        .iter()
        .filter_map(|id| spec.field(id))
        .map(|d| d.name.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, NAME_MAX);
    writeln!(
        out,
        "  {:<6}{:>6}  {:<name_width$}  {:>8}  value",
        "field", "offset", "name", "length"
    )?;
    let mut end = layout.fields_at;
    for id in layout.present.iter() {
        let field = match spec.field_in(layout, payload, id) {
            Ok(Some(f)) => f,
            // The bitmap says it is present, so `field_in` finds it or fails.
            Ok(None) => continue,
            Err(e) => return Ok(Err(e)),
        };
        end = field.range().end;
        let def = field.def();
        let name = short_name(&def.name, name_width);
        writeln!(
            out,
            "  {:<6}{:>6}  {name:<name_width$}  {:>8}  {}",
            format!("F{id}"),
            field.prefix_at(),
            length_label(def, field.units()),
            field.show().revealed(reveal)
        )?;
        subelements::text_subelements(out, &field, reveal)?;
    }
    Ok(check_end(payload, end))
}

/// Longest field name shown in full in the text dissection.
const NAME_MAX: usize = 44;

/// `name`, cut to `width` characters with a trailing `~` if longer.
fn short_name(name: &str, width: usize) -> String {
    if name.chars().count() <= width {
        return name.to_string();
    }
    let mut s: String = name.chars().take(width.saturating_sub(1)).collect();
    s.push('~');
    s
}

/// `12` for a fixed field, `LL 19` for a variable one.
fn length_label(def: &FieldDef, units: usize) -> String {
    if def.is_fixed() {
        units.to_string()
    } else {
        format!("{} {units}", def.format.label())
    }
}

fn check_end(payload: &[u8], end: usize) -> Result<(), IsoError> {
    if end < payload.len() {
        return Err(IsoError::TrailingBytes {
            offset: end,
            len: payload.len() - end,
        });
    }
    Ok(())
}

/// A scheme header as its own file describes it (`crates/wire/src/header/`).
fn text_header(
    out: &mut impl Write,
    indent: usize,
    header: &Header,
    frame_len: Option<usize>,
) -> io::Result<()> {
    let described = header.describe(frame_len);
    kv(out, indent, described.title, &described.summary)?;
    for (label, value) in &described.rows {
        kv(out, indent + 2, label, value)?;
    }
    Ok(())
}

fn text_rejected(out: &mut impl Write, r: &Rejected) -> io::Result<()> {
    if let Some(v) = &r.visa {
        kv(
            out,
            2,
            "VISA reject",
            format_args!("bitmap {}  reject code {}", Hex(&v.bitmap), Hex(&v.code)),
        )?;
    }
    kv(out, 2, "original header", "(of the rejected message)")?;
    text_header(out, 4, &r.original, None)
}

/// `1987 financial request, from acquirer`.
fn describe_mti(mti: Mti) -> String {
    let version = match mti.version() {
        0 => "1987",
        1 => "1993",
        2 => "2003",
        _ => "private",
    };
    let class = match mti.class() {
        1 => "authorization",
        2 => "financial",
        3 => "file action",
        4 => "reversal",
        5 => "reconciliation",
        6 => "administrative",
        7 => "fee collection",
        8 => "network management",
        _ => "reserved class",
    };
    let function = match mti.function() {
        0 => "request",
        1 => "request response",
        2 => "advice",
        3 => "advice response",
        4 => "notification",
        5 => "notification acknowledgement",
        6 => "instruction",
        7 => "instruction acknowledgement",
        _ => "reserved function",
    };
    let origin = match mti.origin() {
        0 => "acquirer",
        1 => "acquirer, repeat",
        2 => "issuer",
        3 => "issuer, repeat",
        4 => "other",
        5 => "other, repeat",
        _ => "reserved origin",
    };
    format!("{version} {class} {function}, from {origin}")
}
