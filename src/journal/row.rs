//! An [`Exchange`] made a [`NewRow`], on the message path as the exchange
//! completes: each message parsed once (one pass finds every field kept),
//! a fixed list of fields written into the row's inline buffers (no
//! allocation), the PAN masked by the one masking rule (`iso8583::mask`,
//! first 6 and last 4). No other field is ever read, so no track data
//! (F35, F36, F45), PIN block (F52), EMV data (F55), MAC (F64, F128) or key
//! material can reach the store. The messages' buffers are let go at once,
//! not held until the writer's next batch.

use std::fmt::Write;

use bytes::Bytes;

use super::{AnsweredBy, Exchange, Link};
use crate::iso8583::{Bitmap, Data, FieldRef, Message, Mti, Spec, is_sensitive};
use crate::route::{Checked, DeclineReason};
use crate::store::journal::{NewRow, Short};

/// The network-management code of an echo test (keep-alive): not journaled.
const ECHO_F70: &[u8] = b"301";

/// The fields a row reads, F70 to tell a keep-alive. A journaled service's
/// router indexes them in every message it checks (`Router::index_also`).
pub const READ: [u16; 12] = [2, 4, 7, 11, 32, 33, 37, 39, 41, 42, 49, 70];

const fn wanted() -> Bitmap {
    let mut words = [0u64; 3];
    let mut k = 0;
    while k < READ.len() {
        let i = (READ[k] - 1) as usize;
        words[i / 64] |= 1u64 << (63 - i % 64);
        k += 1;
    }
    Bitmap(words)
}
const WANTED: Bitmap = wanted();

/// Where a request's [`READ`] fields start, as the router's check of it
/// found them, and its MTI: kept with the request while it is in flight
/// (28 bytes), so that its row reads those fields where they lie instead
/// of walking the whole request again (`scripts/path-ir.sh` with
/// `PATH_JOURNAL=1`: that walk was about half the row's cost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestAt {
    mti: Mti,
    /// In [`READ`]'s order; 0 = absent (no field starts at 0: the MTI and
    /// bitmap come first).
    starts: [u16; READ.len()],
}

/// Each field's place in [`READ`] plus one, by field number (0: not read).
const SLOT: [u8; 193] = {
    let mut slot = [0u8; 193];
    let mut k = 0;
    while k < READ.len() {
        slot[READ[k] as usize] = k as u8 + 1;
        k += 1;
    }
    slot
};

impl RequestAt {
    /// `checked` must have been indexed with [`READ`] (the router's
    /// `index_also`): a field it did not index would read as absent.
    /// `None` for a request longer than 64 KiB (its row walks it again).
    pub fn of(checked: &Checked<'_>) -> Option<RequestAt> {
        if u16::try_from(checked.msg.payload().len()).is_err() {
            return None;
        }
        let mut starts = [0u16; READ.len()];
        for (id, at) in checked.index.starts() {
            let slot = SLOT.get(usize::from(id)).map_or(0, |&s| usize::from(s));
            if let Some(start) = slot.checked_sub(1).and_then(|i| starts.get_mut(i)) {
                *start = u16::try_from(at).unwrap_or(0);
            }
        }
        Some(RequestAt {
            mti: checked.msg.mti(),
            starts,
        })
    }

    fn start(&self, id: u16) -> Option<usize> {
        let i = usize::from(*SLOT.get(usize::from(id))?).checked_sub(1)?;
        self.starts
            .get(i)
            .filter(|&&at| at != 0)
            .map(|&at| usize::from(at))
    }
}

/// Fields read from one message, shown (masked) inline. None is sensitive
/// but F2; a custom spec that flags another sensitive gets it masked all
/// the same (`show`).
#[derive(Default)]
struct Read {
    mti: Short<8>,
    pan: Short<24>,
    f4: Short<16>,
    f7: Short<12>,
    f11: Short<12>,
    f32: Short<16>,
    f33: Short<16>,
    f37: Short<16>,
    f39: Short<8>,
    f41: Short<16>,
    f42: Short<24>,
    f49: Short<8>,
    keepalive: bool,
}

/// `field`'s masked text into `out`: as `show` writes it (masked when
/// sensitive, binary as hex, control characters escaped). A plain field of
/// printable ASCII, nearly every one, is copied as it is without going
/// through `Display` a character at a time (the same text).
fn shown<const N: usize>(out: &mut Short<N>, field: Option<FieldRef<'_>>) {
    let Some(f) = field else { return };
    let def = f.def();
    if def.id == 2
        && def.data != Data::Binary
        && let Some(masked) = masked_pan(f.logical())
    {
        *out = masked;
        return;
    }
    if !is_sensitive(def) && def.data != Data::Binary {
        // ASCII data is its own logical text: checked and copied as a slice.
        let plain = if def.data == Data::Ascii {
            Short::printable_slice(f.data())
        } else {
            Short::printable(f.logical())
        };
        if let Some(plain) = plain {
            *out = plain;
            return;
        }
    }
    *out = Short::empty();
    let _ = write!(out, "{}", f.show());
}

/// Shortest PAN `show` masks as first 6 + last 4 (a shorter one is shown
/// as `[masked n chars]`, left to `show`).
const PAN_MIN: usize = 13;

/// A text PAN masked byte by byte as `show` masks it (the one rule,
/// `iso8583::mask`: first 6 and last 4 kept where alphanumeric, `*` for
/// every other character), without `Display`'s character-at-a-time
/// formatting; the test `the_fast_pan_mask_is_shows_mask` holds the two
/// equal.
fn masked_pan<const N: usize>(pan: impl ExactSizeIterator<Item = u8>) -> Option<Short<N>> {
    let n = pan.len();
    if n < PAN_MIN {
        return None;
    }
    Short::printable(pan.enumerate().map(|(i, b)| {
        let clear = (i < 6 || i >= n - 4) && b.is_ascii_alphanumeric();
        if clear { b } else { b'*' }
    }))
}

impl Read {
    /// One pass over `payload`; a message that does not pass whole (a bad
    /// request) is read field by field, as far as it goes.
    fn of(spec: &Spec, payload: &Bytes) -> Read {
        let Ok(msg) = Message::parse(spec, payload.clone()) else {
            return Read::default();
        };
        match msg.index(&WANTED) {
            Ok(index) => Read::fields(msg.mti(), |id| msg.indexed(&index, id)),
            Err(_) => Read::fields(msg.mti(), |id| msg.field(id).ok().flatten()),
        }
    }

    /// [`Read::of`] a request whose fields the router found (`at`): each
    /// read where it starts, nothing walked.
    fn at(spec: &Spec, payload: &Bytes, at: &RequestAt) -> Read {
        Read::fields(at.mti, |id| spec.field_at(payload, id, at.start(id)?))
    }

    /// The fields of an answer a row keeps, given its request's (see
    /// [`build_answered`]).
    fn answer_of(checked: &Checked<'_>, req: &Read) -> Read {
        let msg = &checked.msg;
        let get = |id: u16| {
            msg.indexed(&checked.index, id)
                .or_else(|| msg.field(id).ok().flatten())
        };
        let mut r = Read {
            mti: Short::new(msg.mti().as_str()),
            ..Read::default()
        };
        shown(&mut r.f37, get(37));
        shown(&mut r.f39, get(39));
        // Of the rest, only what the request lacks reaches the row (`either`),
        // so only that is looked up.
        let lacked = |known: bool, id: u16| if known { None } else { get(id) };
        shown(&mut r.pan, lacked(!req.pan.is_null(), 2));
        shown(&mut r.f4, lacked(!req.f4.is_null(), 4));
        shown(&mut r.f7, lacked(!req.f7.is_null(), 7));
        shown(&mut r.f11, lacked(!req.f11.is_null(), 11));
        shown(&mut r.f32, lacked(!req.f32.is_null(), 32));
        shown(&mut r.f33, lacked(!req.f33.is_null(), 33));
        shown(&mut r.f41, lacked(!req.f41.is_null(), 41));
        shown(&mut r.f42, lacked(!req.f42.is_null(), 42));
        shown(&mut r.f49, lacked(!req.f49.is_null(), 49));
        r
    }

    fn fields<'m>(mti: Mti, get: impl Fn(u16) -> Option<FieldRef<'m>>) -> Read {
        let mut r = Read {
            mti: Short::new(mti.as_str()),
            keepalive: mti.is_network_management()
                && get(70).is_some_and(|f| f.eq_logical(ECHO_F70)),
            ..Read::default()
        };
        // F2 is always sensitive: `show` masks it as a PAN.
        shown(&mut r.pan, get(2));
        shown(&mut r.f4, get(4));
        shown(&mut r.f7, get(7));
        shown(&mut r.f11, get(11));
        shown(&mut r.f32, get(32));
        shown(&mut r.f33, get(33));
        shown(&mut r.f37, get(37));
        shown(&mut r.f39, get(39));
        shown(&mut r.f41, get(41));
        shown(&mut r.f42, get(42));
        shown(&mut r.f49, get(49));
        r
    }
}

/// The first of `a` and `b` that is not NULL.
fn either<const N: usize>(a: Short<N>, b: Short<N>) -> Short<N> {
    if a.is_null() { b } else { a }
}

fn link_text(link: Link) -> Short<24> {
    match link {
        // "client#" and the number's digits, without `write!`'s formatting
        // machinery: itoa writes only the digits the number has, two at a
        // time (scripts/path-ir.sh with PATH_JOURNAL=1).
        Link::Client(conn) => {
            let mut digits = itoa::Buffer::new();
            let text = b"client#"
                .iter()
                .chain(digits.format(conn).as_bytes())
                .copied();
            Short::printable(text).unwrap_or_else(|| Short::new("client#?"))
        }
        Link::Peer => Short::new("peer"),
        Link::Node => Short::new("node"),
        Link::Unknown => Short::new("-"),
    }
}

/// The row of `ex`; `None` for an echo test (keep-alive).
pub fn build(ex: &Exchange) -> Option<NewRow> {
    build_with(ex, |_| {
        ex.response
            .as_ref()
            .map(|r| Read::of(&ex.spec, r))
            .unwrap_or_default()
    })
}

/// The row of `ex`, answered by `response` as the router parsed and
/// indexed it (`ex.response` is not read). The same row as [`build`] of the
/// answer's bytes: of the answer, a row keeps its MTI, F37 and F39, and
/// any other field only where the request lacks it; those are read off
/// the index where the router kept them, and looked up otherwise.
pub fn build_answered(ex: &Exchange, response: &Checked<'_>) -> Option<NewRow> {
    build_with(ex, |req| Read::answer_of(response, req))
}

/// The row of `ex`, with the answer read by `response` once the request
/// is read (and found not to be a keep-alive).
fn build_with(ex: &Exchange, response: impl FnOnce(&Read) -> Read) -> Option<NewRow> {
    let req = match &ex.request_at {
        Some(at) => Read::at(&ex.spec, &ex.request, at),
        None => Read::of(&ex.spec, &ex.request),
    };
    if req.keepalive {
        return None;
    }
    let resp = response(&req);
    let repeat = req
        .mti
        .get()
        .and_then(|m| m.as_bytes().get(3))
        .is_some_and(|d| d.is_ascii_digit() && (d - b'0') % 2 == 1);
    let duplicate = ex.answered_by == AnsweredBy::Switch(DeclineReason::Duplicate);
    let unroutable = ex.answered_by == AnsweredBy::Switch(DeclineReason::NoHealthyNode);
    let mti = if req.mti.is_null() {
        Short::new("????")
    } else {
        req.mti
    };
    // What the request lacks (a bad one, unreadable) the answer may say.
    Some(NewRow {
        t_in: ex.t_in,
        t_out: ex.t_out,
        service: Some(ex.service.clone()),
        front: Short::new(ex.front),
        link: link_text(ex.link),
        node: Short::opt(ex.node.as_ref().map(|n| n.as_str())),
        origin: Short::new(if ex.from_node { "node" } else { "front" }),
        mti,
        mti_out: resp.mti,
        f11: either(req.f11, resp.f11),
        f7: either(req.f7, resp.f7),
        f37_in: req.f37,
        f37_out: resp.f37,
        f41: either(req.f41, resp.f41),
        f42: either(req.f42, resp.f42),
        f32: either(req.f32, resp.f32),
        f33: either(req.f33, resp.f33),
        pan: either(req.pan, resp.pan),
        f4: either(req.f4, resp.f4),
        f49: either(req.f49, resp.f49),
        f39: resp.f39,
        answered_by: Short::new(ex.answered_by.who()),
        reason: Short::opt(ex.answered_by.reason()),
        outcome: Short::new(outcome(ex, duplicate, unroutable)),
        latency_us: ex
            .latency_us
            .map(|us| i64::try_from(us).unwrap_or(i64::MAX)),
        late: ex.late,
        duplicate,
        repeat,
        unroutable,
        bad: Short::opt(ex.bad.map(|b| b.as_str())),
        reversal_id: ex.reversal_id,
    })
}

/// The one word a report counts the exchange under.
fn outcome(ex: &Exchange, duplicate: bool, unroutable: bool) -> &'static str {
    if ex.late {
        "late"
    } else if ex.bad.is_some() {
        "bad"
    } else if duplicate {
        "duplicate"
    } else if unroutable {
        "unroutable"
    } else {
        match ex.answered_by {
            AnsweredBy::Node | AnsweredBy::Peer => "answered",
            AnsweredBy::Switch(_) => "switch-made",
            AnsweredBy::Stored => "stored",
            AnsweredBy::Withheld(_) | AnsweredBy::Nobody(_) => "unanswered",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::iso8583::{Decoded, Value};
    use crate::journal::{BadOutcome, Link};

    const PAN: &str = "6212345678901234567";

    fn spec() -> Arc<Spec> {
        Arc::new(Spec::builtin("cups").expect("cups"))
    }

    fn request(spec: &Spec, mti: &str, extra: &[(u16, &str)]) -> Bytes {
        let mut d = Decoded::new(
            crate::iso8583::samples::envelope(spec),
            mti.parse().expect("mti"),
        );
        for (id, v) in [
            (2, PAN),
            (3, "000000"),
            (4, "000000001000"),
            (7, "1204101010"),
            (11, "000123"),
            (32, "12345678"),
            (35, "6212345678901234567=2512101"),
            (37, "123456789012"),
            (41, "TERM0001"),
            (42, "MERCHANT0000001"),
            (49, "156"),
        ]
        .iter()
        .chain(extra)
        {
            if spec.field(*id).is_some() {
                d.set(*id, Value::Text((*v).to_string()));
            }
        }
        Bytes::from(spec.encode(&d).expect("encode"))
    }

    fn exchange(
        spec: &Arc<Spec>,
        request: Bytes,
        response: Option<Bytes>,
        by: AnsweredBy,
    ) -> Exchange {
        Exchange {
            spec: Arc::clone(spec),
            service: "pos".into(),
            front: "listen",
            link: Link::Client(3),
            node: Some(crate::route::NodeId::new(b"01").expect("id")),
            from_node: false,
            t_in: 1_000,
            t_out: 1_002,
            latency_us: Some(2_000),
            request,
            request_at: None,
            response,
            answered_by: by,
            late: false,
            reversal_id: None,
            bad: None,
        }
    }

    #[test]
    fn a_row_keeps_the_keys_and_masks_the_pan() {
        let spec = spec();
        let req = request(&spec, "0200", &[]);
        let resp = request(&spec, "0210", &[(39, "00")]);
        let row = build(&exchange(&spec, req, Some(resp), AnsweredBy::Node)).expect("row");
        assert_eq!(row.mti.get(), Some("0200"));
        assert_eq!(row.mti_out.get(), Some("0210"));
        assert_eq!(row.f11.get(), Some("000123"));
        assert_eq!(row.f37_in.get(), Some("123456789012"));
        assert_eq!(row.f41.get(), Some("TERM0001"));
        assert_eq!(row.f39.get(), Some("00"));
        assert_eq!(row.pan.get(), Some("621234*********4567"));
        assert_eq!(
            (row.answered_by.text(), row.outcome.text()),
            ("node", "answered")
        );
        assert_eq!(row.node.get(), Some("01"));
        let shown = format!(
            "{:?}",
            exchange(&spec, request(&spec, "0200", &[]), None, AnsweredBy::Node)
        );
        assert!(
            shown.contains("request_len") && !shown.contains("b\""),
            "{shown}"
        );
        let text = format!("{row:?}");
        assert!(!text.contains(PAN), "the PAN in clear: {text}");
        assert!(!text.contains("=2512"), "track 2 data: {text}");
    }

    #[test]
    fn a_client_link_is_named_by_its_number() {
        // As `write!` puts it into the same 24 bytes (the largest number clips).
        for conn in [0, 7, 10, 12_345, u64::MAX] {
            let mut written = Short::<24>::empty();
            write!(written, "client#{conn}").expect("write");
            assert_eq!(link_text(Link::Client(conn)).get(), written.get());
        }
    }

    /// A message of `mti` with exactly `fields` (those the spec defines).
    fn message(spec: &Spec, mti: &str, fields: &[(u16, &str)]) -> Bytes {
        let mut d = Decoded::new(
            crate::iso8583::samples::envelope(spec),
            mti.parse().expect("mti"),
        );
        for (id, v) in fields {
            if spec.field(*id).is_some() {
                d.set(*id, Value::Text((*v).to_string()));
            }
        }
        Bytes::from(spec.encode(&d).expect("encode"))
    }

    /// The row made off the router's parse and index of an answer equals
    /// the row made by parsing the answer's bytes again: with a request
    /// that has every field, and with ones that lack what the answer has.
    #[test]
    fn an_answer_read_off_the_routers_index_makes_the_same_row() {
        let spec = spec();
        let answer: &[(u16, &str)] = &[
            (2, PAN),
            (4, "000000002000"),
            (7, "1204101011"),
            (11, "000123"),
            (32, "87654321"),
            (33, "11112222"),
            (37, "000001234567"),
            (39, "05"),
            (41, "TERM0002"),
            (42, "MERCHANT0000002"),
            (49, "840"),
        ];
        let full = request(&spec, "0200", &[(33, "33334444")]);
        let bare = message(
            &spec,
            "0200",
            &[(3, "000000"), (11, "000123"), (37, "123456789012")],
        );
        let half = message(
            &spec,
            "0100",
            &[(2, PAN), (11, "000123"), (41, "TERM0001"), (49, "156")],
        );
        // The router indexes the key fields and these; other answers' fields
        // are looked up.
        let mut routed = Bitmap::default();
        for id in [11, 37, 39, 41, 70] {
            routed.set(id);
        }
        for (req, mti) in [(full, "0210"), (bare, "0210"), (half, "0110")] {
            let resp = message(&spec, mti, answer);
            let msg = Message::parse(&spec, resp.clone()).expect("answer parses");
            let index = msg.index(&routed).expect("answer is whole");
            let checked = Checked { msg, index };
            let from_bytes = build(&exchange(&spec, req.clone(), Some(resp), AnsweredBy::Node));
            let from_index =
                build_answered(&exchange(&spec, req, None, AnsweredBy::Node), &checked);
            let (a, b) = (format!("{from_bytes:?}"), format!("{from_index:?}"));
            assert_eq!(a, b);
            assert!(a.contains("\"05\""), "the answer's F39 is kept: {a}");
        }
    }

    /// A request's row read where the router found its fields (kept in
    /// flight as a `RequestAt`) equals the row of the request walked
    /// again, on every builtin spec, for a request with every field, ones
    /// lacking some, and network management (an echo test still makes no
    /// row).
    #[test]
    fn a_request_read_where_the_router_found_its_fields_makes_the_same_row() {
        for name in Spec::builtin_names() {
            let spec = Arc::new(Spec::builtin(name).expect("builtin"));
            let mut router =
                crate::route::Router::new(Default::default(), Arc::clone(&spec)).expect("router");
            assert!(router.index_also(&READ), "{name}");
            let encode = |d: &crate::iso8583::Decoded| Bytes::from(spec.encode(d).expect("encode"));
            let requests = [
                encode(&crate::iso8583::samples::purchase(&spec)),
                message(
                    &spec,
                    "0200",
                    &[(3, "000000"), (11, "000123"), (37, "123456789012")],
                ),
                message(
                    &spec,
                    "0100",
                    &[(2, PAN), (11, "000123"), (41, "TERM0001"), (49, "156")],
                ),
                message(
                    &spec,
                    "0800",
                    &[(7, "1204101010"), (11, "000124"), (70, "001")],
                ),
                encode(&crate::iso8583::samples::echo(&spec)),
            ];
            // The answer's side is `an_answer_read_off_the_routers_index_...`'s.
            for req in requests {
                let checked = router.check(req.clone()).expect("request checks");
                let at = RequestAt::of(&checked).expect("short enough");
                let walked = exchange(&spec, req.clone(), None, AnsweredBy::Node);
                let kept = Exchange {
                    request_at: Some(at),
                    ..exchange(&spec, req, None, AnsweredBy::Node)
                };
                let (a, b) = (
                    format!("{:?}", build(&walked)),
                    format!("{:?}", build(&kept)),
                );
                assert_eq!(a, b, "{name}");
            }
        }
    }

    #[test]
    fn the_fast_pan_mask_is_shows_mask() {
        let spec = spec();
        for pan in [
            "6212345678901",
            "621234567890123",
            PAN,
            "4111111111111111",
            "621234567890",
        ] {
            let bytes = request(&spec, "0200", &[(2, pan)]);
            let msg = Message::parse(&spec, bytes).expect("parse");
            let f = msg.field(2).expect("F2").expect("present");
            let mut fast = Short::<24>::NULL;
            shown(&mut fast, Some(f.clone()));
            let mut slow = Short::<24>::empty();
            write!(slow, "{}", f.show()).expect("write");
            assert_eq!(fast.get(), slow.get(), "{} chars", pan.len());
        }
    }

    /// Every field a row reads, in ASCII (cups), EBCDIC and BCD (VISA) and
    /// binary-bitmap ISO 87 specs, is shown as `show` writes it: printable
    /// text copied a field at a time, the PAN masked, odd BCD digits
    /// unpadded, control characters and overlong values through `show`.
    #[test]
    fn a_field_is_shown_as_show_writes_it_in_every_encoding() {
        let values: &[(u16, &[&str])] = &[
            (
                2,
                &["6212345678901", PAN, "4761739001010119", "62123456789"],
            ),
            (4, &["000000001000"]),
            (7, &["1204101010"]),
            (11, &["000123"]),
            (32, &["12345", "123456", "12345678901"]),
            (33, &["1", "00010000"]),
            (37, &["123456789012", "ABC 12\u{1}67890"]),
            (41, &["TERM0001", "T\u{7f}RM0001"]),
            (42, &["MERCHANT0000001", "ÄÖ ÉÈ"]),
            (49, &["840"]),
        ];
        for name in ["cups", "visa-base1", "iso87binary"] {
            let spec = Spec::builtin(name).expect(name);
            let mut compared = 0;
            for (id, texts) in values {
                for text in texts.iter() {
                    let mut d = Decoded::new(
                        crate::iso8583::samples::envelope(&spec),
                        "0200".parse().expect("mti"),
                    );
                    d.set(*id, Value::Text((*text).to_string()));
                    // A value this spec's field cannot hold is not sent.
                    let Ok(bytes) = spec.encode(&d) else { continue };
                    let msg = Message::parse(&spec, Bytes::from(bytes)).expect("parse");
                    let Some(f) = msg.field(*id).ok().flatten() else {
                        continue;
                    };
                    let mut fast = Short::<24>::NULL;
                    shown(&mut fast, Some(f.clone()));
                    let mut slow = Short::<24>::empty();
                    write!(slow, "{}", f.show()).expect("write");
                    assert_eq!(fast.get(), slow.get(), "{name} F{id} {text:?}");
                    compared += 1;
                }
            }
            assert!(compared >= 12, "{name}: only {compared} values encodable");
        }
    }

    #[test]
    fn switch_made_duplicate_bad_and_repeat_are_flagged() {
        let spec = spec();
        let req = request(&spec, "0200", &[]);
        let made = |by| build(&exchange(&spec, req.clone(), None, by)).expect("row");
        let timeout = made(AnsweredBy::Switch(DeclineReason::Timeout));
        assert_eq!(timeout.answered_by.text(), "switch");
        assert_eq!(timeout.reason.get(), Some("timeout"));
        assert_eq!(timeout.outcome.text(), "switch-made");
        let dup = made(AnsweredBy::Switch(DeclineReason::Duplicate));
        assert!(dup.duplicate && dup.outcome.text() == "duplicate");
        let none = made(AnsweredBy::Switch(DeclineReason::NoHealthyNode));
        assert!(none.unroutable && none.outcome.text() == "unroutable");
        let mut bad = exchange(
            &spec,
            Bytes::from_static(b"\x00garbage"),
            None,
            AnsweredBy::Nobody("dropped"),
        );
        bad.bad = Some(BadOutcome::Dropped);
        let bad = build(&bad).expect("row");
        assert_eq!((bad.mti.text(), bad.outcome.text()), ("????", "bad"));
        assert!(bad.pan.is_null());
        let rep = build(&exchange(
            &spec,
            request(&spec, "0201", &[]),
            None,
            AnsweredBy::Node,
        ))
        .expect("row");
        assert!(rep.repeat);
    }

    #[test]
    fn echo_tests_are_not_journaled_other_network_management_is() {
        let spec = spec();
        let echo = request(&spec, "0800", &[(70, "301")]);
        assert!(build(&exchange(&spec, echo, None, AnsweredBy::Node)).is_none());
        let sign_on = request(&spec, "0800", &[(70, "001")]);
        assert!(build(&exchange(&spec, sign_on, None, AnsweredBy::Node)).is_some());
    }
}
