//! An [`Exchange`] made a [`JournalRow`]: the request and answer parsed off
//! the message path, a fixed list of fields read, the PAN masked by the one
//! masking rule (`iso8583::mask`, first 6 and last 4). No other field is
//! ever read, so no track data (F35, F36, F45), PIN block (F52), EMV data
//! (F55), MAC (F64, F128) or key material can reach the store.

use bytes::Bytes;

use super::{AnsweredBy, Exchange};
use crate::iso8583::{Message, Spec};
use crate::route::DeclineReason;
use crate::store::journal::JournalRow;

/// The fields a row keeps, besides the PAN. None is sensitive; a custom spec
/// that flags one of them sensitive gets it masked all the same.
const KEPT: [u16; 10] = [4, 7, 11, 32, 33, 37, 39, 41, 42, 49];

/// The network-management code of an echo test (keep-alive): not journaled.
const ECHO_F70: &[u8] = b"301";

/// Fields read from one message, shown (masked) as text.
#[derive(Debug, Default)]
struct Read {
    mti: Option<String>,
    pan: Option<String>,
    kept: [Option<String>; KEPT.len()],
    keepalive: bool,
}

impl Read {
    fn of(spec: &Spec, payload: &Bytes) -> Read {
        let Ok(msg) = Message::parse(spec, payload.clone()) else {
            return Read::default();
        };
        let text = |id: u16| {
            msg.field(id)
                .ok()
                .flatten()
                .map(|f| crate::store::saf::clip(&f.show().to_string()))
        };
        let mti = msg.mti();
        let keepalive = mti.is_network_management()
            && msg
                .field(70)
                .ok()
                .flatten()
                .is_some_and(|f| f.eq_logical(ECHO_F70));
        Read {
            mti: Some(mti.as_str().to_string()),
            // F2 is always sensitive: `show` masks it as a PAN.
            pan: text(2),
            kept: KEPT.map(text),
            keepalive,
        }
    }

    fn get(&self, id: u16) -> Option<String> {
        let at = KEPT.iter().position(|&k| k == id)?;
        self.kept[at].clone()
    }
}

/// The row of `ex`; `None` for an echo test (keep-alive).
pub fn build(ex: &Exchange) -> Option<JournalRow> {
    let req = Read::of(&ex.spec, &ex.request);
    let resp = ex
        .response
        .as_ref()
        .map(|r| Read::of(&ex.spec, r))
        .unwrap_or_default();
    if req.keepalive {
        return None;
    }
    // What the request lacks (a bad one, unreadable) the answer may say.
    let either = |id: u16| req.get(id).or_else(|| resp.get(id));
    let repeat = req.mti.as_deref().is_some_and(|m| {
        m.as_bytes()
            .get(3)
            .is_some_and(|d| (d - b'0') % 2 == 1 && d.is_ascii_digit())
    });
    let duplicate = ex.answered_by == AnsweredBy::Switch(DeclineReason::Duplicate);
    let unroutable = ex.answered_by == AnsweredBy::Switch(DeclineReason::NoHealthyNode);
    Some(JournalRow {
        id: 0,
        t_in: ex.t_in,
        t_out: ex.t_out,
        service: ex.service.to_string(),
        front: ex.front.to_string(),
        link: ex.link.text(),
        node: ex.node.map(|n| n.as_str().to_string()),
        origin: if ex.from_node { "node" } else { "front" }.to_string(),
        mti: req.mti.clone().unwrap_or_else(|| "????".to_string()),
        mti_out: resp.mti.clone(),
        f11: either(11),
        f7: either(7),
        f37_in: req.get(37),
        f37_out: resp.get(37),
        f41: either(41),
        f42: either(42),
        f32: either(32),
        f33: either(33),
        pan: req.pan.clone().or_else(|| resp.pan.clone()),
        f4: either(4),
        f49: either(49),
        f39: resp.get(39),
        answered_by: ex.answered_by.who().to_string(),
        reason: ex.answered_by.reason().map(str::to_string),
        outcome: outcome(ex, duplicate, unroutable).to_string(),
        latency_us: ex
            .latency_us
            .map(|us| i64::try_from(us).unwrap_or(i64::MAX)),
        late: ex.late,
        duplicate,
        repeat,
        unroutable,
        bad: ex.bad.map(|b| b.as_str().to_string()),
        reversal_id: ex.reversal_id,
        reversal_state: None,
        reversal_answer: None,
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
        assert_eq!(row.mti, "0200");
        assert_eq!(row.mti_out.as_deref(), Some("0210"));
        assert_eq!(row.f11.as_deref(), Some("000123"));
        assert_eq!(row.f37_in.as_deref(), Some("123456789012"));
        assert_eq!(row.f41.as_deref(), Some("TERM0001"));
        assert_eq!(row.f39.as_deref(), Some("00"));
        assert_eq!(row.pan.as_deref(), Some("621234*********4567"));
        assert_eq!(
            (row.answered_by.as_str(), row.outcome.as_str()),
            ("node", "answered")
        );
        assert_eq!(row.node.as_deref(), Some("01"));
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
    fn switch_made_duplicate_bad_and_repeat_are_flagged() {
        let spec = spec();
        let req = request(&spec, "0200", &[]);
        let made = |by| build(&exchange(&spec, req.clone(), None, by)).expect("row");
        let timeout = made(AnsweredBy::Switch(DeclineReason::Timeout));
        assert_eq!(timeout.answered_by, "switch");
        assert_eq!(timeout.reason.as_deref(), Some("timeout"));
        assert_eq!(timeout.outcome, "switch-made");
        let dup = made(AnsweredBy::Switch(DeclineReason::Duplicate));
        assert!(dup.duplicate && dup.outcome == "duplicate");
        let none = made(AnsweredBy::Switch(DeclineReason::NoHealthyNode));
        assert!(none.unroutable && none.outcome == "unroutable");
        let mut bad = exchange(
            &spec,
            Bytes::from_static(b"\x00garbage"),
            None,
            AnsweredBy::Nobody("dropped"),
        );
        bad.bad = Some(BadOutcome::Dropped);
        let bad = build(&bad).expect("row");
        assert_eq!((bad.mti.as_str(), bad.outcome.as_str()), ("????", "bad"));
        assert!(bad.pan.is_none());
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
