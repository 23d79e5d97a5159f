//! An [`Exchange`] taken for the journal on the message path as it
//! completes ([`take`], [`take_answered`]): the fields a row keeps copied
//! as they lie, from where the router found them (no field read again, no
//! text made), the PAN masked by the one masking rule (`iso8583::mask`,
//! first 6 and last 4), into a fixed-size [`RawRow`] (no allocation). The
//! journal's writer makes its texts ([`RawRow::row`]). No other field is
//! ever read, so no track data (F35, F36, F45), PIN block (F52), EMV data
//! (F55), MAC (F64, F128) or key material can reach the store. The
//! messages' buffers are let go at once, not held until the writer's next
//! batch.

use std::ops::Range;

use bytes::Bytes;

use super::Exchange;
use super::raw::{Fields, Raw, RawRow};
use super::text::shown;
use crate::iso8583::{Bitmap, FieldRef, Message, Mti, Spec};
use crate::route::Checked;

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

/// Where a request's [`READ`] fields lie, as the router's check of it
/// found them (length prefix to end), and its MTI: kept with the request
/// while it is in flight (52 bytes), so that its row copies those fields
/// where they lie instead of walking the whole request again, or even
/// reading their length prefixes (`scripts/path-ir.sh` with
/// `PATH_JOURNAL=1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestAt {
    mti: Mti,
    /// In [`READ`]'s order; `(0, 0)` = absent (no field starts at 0: the
    /// MTI and bitmap come first).
    spans: [(u16, u16); READ.len()],
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
        let mut spans = [(0u16, 0u16); READ.len()];
        for (id, at) in checked.index.ranges() {
            let slot = SLOT.get(usize::from(id)).map_or(0, |&s| usize::from(s));
            if let Some(span) = slot.checked_sub(1).and_then(|i| spans.get_mut(i)) {
                // Within the payload, which is under 64 KiB.
                *span = (
                    u16::try_from(at.start).unwrap_or(0),
                    u16::try_from(at.end).unwrap_or(0),
                );
            }
        }
        Some(RequestAt {
            mti: checked.msg.mti(),
            spans,
        })
    }

    fn range(&self, id: u16) -> Option<Range<usize>> {
        let i = usize::from(*SLOT.get(usize::from(id))?).checked_sub(1)?;
        self.spans
            .get(i)
            .filter(|&&(start, _)| start != 0)
            .map(|&(start, end)| usize::from(start)..usize::from(end))
    }
}

/// The bytes `field` takes in `payload`, its length prefix included.
fn wire<'p>(payload: &'p [u8], field: Option<FieldRef<'_>>) -> Option<&'p [u8]> {
    let f = field?;
    payload.get(f.prefix_at()..f.range().end)
}

/// The request's fields into `out`; `false` for an echo test (no row).
/// `get` finds a field's bytes as they lie (length prefix included).
fn take_request<'p>(
    spec: &Spec,
    mti: Option<Mti>,
    get: impl Fn(u16) -> Option<&'p [u8]>,
    out: &mut Fields,
) -> bool {
    if mti.is_some_and(|m| m.is_network_management())
        && get(70)
            .and_then(|w| spec.field_at(w, 70, 0))
            .is_some_and(|f| f.eq_logical(ECHO_F70))
    {
        return false;
    }
    out.mti = mti;
    // F2 is always sensitive: `show` masks it as a PAN, here.
    shown(&mut out.pan, get(2).and_then(|w| spec.field_at(w, 2, 0)));
    out.f4 = Raw::take(spec, 4, get(4));
    out.f7 = Raw::take(spec, 7, get(7));
    out.f11 = Raw::take(spec, 11, get(11));
    out.f32 = Raw::take(spec, 32, get(32));
    out.f33 = Raw::take(spec, 33, get(33));
    out.f37_in = Raw::take(spec, 37, get(37));
    out.f41 = Raw::take(spec, 41, get(41));
    out.f42 = Raw::take(spec, 42, get(42));
    out.f49 = Raw::take(spec, 49, get(49));
    true
}

/// The answer's fields into `out`, given the request's already there: of
/// the answer a row keeps its MTI, F37 and F39, and any other field only
/// where the request lacks it, so only those are looked up.
fn take_answer<'p>(
    spec: &Spec,
    mti: Option<Mti>,
    get: impl Fn(u16) -> Option<&'p [u8]>,
    out: &mut Fields,
) {
    out.mti_out = mti;
    out.f37_out = Raw::take(spec, 37, get(37));
    out.f39 = Raw::take(spec, 39, get(39));
    if out.pan.is_null() {
        shown(&mut out.pan, get(2).and_then(|w| spec.field_at(w, 2, 0)));
    }
    fn lacked<'p, const M: usize>(
        slot: &mut Raw<M>,
        spec: &Spec,
        id: u16,
        get: &impl Fn(u16) -> Option<&'p [u8]>,
    ) {
        if slot.is_absent() {
            *slot = Raw::take(spec, id, get(id));
        }
    }
    lacked(&mut out.f4, spec, 4, &get);
    lacked(&mut out.f7, spec, 7, &get);
    lacked(&mut out.f11, spec, 11, &get);
    lacked(&mut out.f32, spec, 32, &get);
    lacked(&mut out.f33, spec, 33, &get);
    lacked(&mut out.f41, spec, 41, &get);
    lacked(&mut out.f42, spec, 42, &get);
    lacked(&mut out.f49, spec, 49, &get);
}

/// A message's fields taken by `take` (its MTI and a finder of its
/// fields' bytes), parsing it once: one pass finds every field a row
/// keeps; a message that does not pass whole (a bad request) is read
/// field by field, as far as it goes. Nothing for one that does not parse.
fn parsed<'p, R>(
    spec: &Spec,
    payload: &'p Bytes,
    take: impl FnOnce(Option<Mti>, &dyn Fn(u16) -> Option<&'p [u8]>) -> R,
) -> R {
    let Ok(msg) = Message::parse(spec, payload.clone()) else {
        return take(None, &|_| None);
    };
    match msg.index(&WANTED) {
        Ok(index) => take(Some(msg.mti()), &|id| {
            wire(payload, msg.indexed(&index, id))
        }),
        Err(_) => take(Some(msg.mti()), &|id| {
            wire(payload, msg.field(id).ok().flatten())
        }),
    }
}

/// The row of `ex`, taken; `None` for an echo test (keep-alive).
pub fn take(ex: Exchange) -> Option<RawRow> {
    take_with(ex, |spec, response, fields| {
        if let Some(r) = response {
            parsed(spec, r, |mti, get| take_answer(spec, mti, get, fields));
        }
    })
}

/// The row of `ex`, answered by `response` as the router parsed and
/// indexed it (`ex.response` is not read): the answer's fields are copied
/// where the router found them, and looked up where it did not index them.
pub fn take_answered(ex: Exchange, response: &Checked<'_>) -> Option<RawRow> {
    take_with(ex, |spec, _, fields| {
        let msg = &response.msg;
        let payload: &[u8] = msg.payload();
        let get = |id: u16| {
            wire(
                payload,
                msg.indexed(&response.index, id)
                    .or_else(|| msg.field(id).ok().flatten()),
            )
        };
        take_answer(spec, Some(msg.mti()), get, fields);
    })
}

/// The row of `ex`, with the answer taken by `answer` once the request is
/// taken (and found not to be a keep-alive).
fn take_with(
    ex: Exchange,
    answer: impl FnOnce(&Spec, Option<&Bytes>, &mut Fields),
) -> Option<RawRow> {
    let Exchange {
        spec,
        service,
        front,
        link,
        node,
        from_node,
        t_in,
        t_out,
        latency_us,
        request,
        request_at,
        response,
        answered_by,
        late,
        reversal_id,
        bad,
    } = ex;
    let mut fields = Fields::ABSENT;
    let kept = match &request_at {
        Some(at) => take_request(
            &spec,
            Some(at.mti),
            |id| request.get(at.range(id)?),
            &mut fields,
        ),
        None => parsed(&spec, &request, |mti, get| {
            take_request(&spec, mti, get, &mut fields)
        }),
    };
    if !kept {
        return None;
    }
    answer(&spec, response.as_ref(), &mut fields);
    Some(RawRow {
        spec,
        service,
        front,
        link,
        node,
        from_node,
        t_in,
        t_out,
        latency_us,
        answered_by,
        late,
        reversal_id,
        bad,
        fields,
    })
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use crate::journal::AnsweredBy;
    use crate::store::journal::Short;
    use std::sync::Arc;

    use super::*;
    use crate::journal::raw::link_text;
    use crate::route::DeclineReason;
    use crate::store::journal::NewRow;

    /// The row of `ex` as the writer makes it of what the path took.
    fn build(ex: Exchange) -> Option<NewRow> {
        take(ex).map(|r| r.row())
    }

    fn build_answered(ex: Exchange, response: &Checked<'_>) -> Option<NewRow> {
        take_answered(ex, response).map(|r| r.row())
    }
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
        let row = build(exchange(&spec, req, Some(resp), AnsweredBy::Node)).expect("row");
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
            let from_bytes = build(exchange(&spec, req.clone(), Some(resp), AnsweredBy::Node));
            let from_index = build_answered(exchange(&spec, req, None, AnsweredBy::Node), &checked);
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
                let (a, b) = (format!("{:?}", build(walked)), format!("{:?}", build(kept)));
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
                    // Taken on the path as it lies, its text made by the
                    // writer: the same text.
                    let lies = wire(msg.payload(), Some(f.clone()));
                    let raw = Raw::<24>::take(&spec, *id, lies);
                    assert_eq!(raw.text::<24>(&spec, *id).get(), slow.get(), "{name} F{id}");
                    // A slot too short to hold it as it lies: its text is
                    // made on the path, clipped as the column clips it.
                    let mut clipped = Short::<6>::NULL;
                    shown(&mut clipped, Some(f.clone()));
                    let raw = Raw::<6>::take(&spec, *id, lies);
                    assert_eq!(
                        raw.text::<6>(&spec, *id).get(),
                        clipped.get(),
                        "{name} F{id}"
                    );
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
        let made = |by| build(exchange(&spec, req.clone(), None, by)).expect("row");
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
        let bad = build(bad).expect("row");
        assert_eq!((bad.mti.text(), bad.outcome.text()), ("????", "bad"));
        assert!(bad.pan.is_null());
        let rep = build(exchange(
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
        assert!(build(exchange(&spec, echo, None, AnsweredBy::Node)).is_none());
        let sign_on = request(&spec, "0800", &[(70, "001")]);
        assert!(build(exchange(&spec, sign_on, None, AnsweredBy::Node)).is_some());
    }
}
