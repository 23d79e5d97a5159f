//! Unit tests of the simulated VISA's message building and answers.

use super::*;

fn spec() -> Spec {
    Spec::builtin("visa-base1").unwrap()
}

#[test]
fn answer_turns_a_bank_request_around() {
    let spec = spec();
    let req = crate::sim::sample_request(&spec, "0200").unwrap();
    let msg = Message::parse(&spec, req).unwrap();
    let resp = Message::parse(&spec, answer(&spec, &msg, "00").unwrap()).unwrap();
    assert_eq!(resp.mti().as_str(), "0210");
    for id in [2, 3, 4, 7, 11, 32, 37, 41] {
        assert_eq!(logical(&resp, id), logical(&msg, id), "F{id} echoed");
    }
    assert_eq!(logical(&resp, 39), b"00");
    assert_eq!(logical(&resp, 38).len(), 6, "an approval code");
    let (Some(crate::wire::Header::Visa(q)), Some(crate::wire::Header::Visa(r))) =
        (msg.envelope().header, resp.envelope().header)
    else {
        panic!("VISA headers");
    };
    assert_eq!(r.source_id(), q.destination_id());
    assert_eq!(r.destination_id(), q.source_id());
}

#[test]
fn answer_keeps_no_secrets() {
    let spec = spec();
    let d = crate::iso8583::samples::purchase(&spec);
    let msg = Message::parse(&spec, Bytes::from(spec.encode(&d).unwrap())).unwrap();
    assert!(msg.has_field(35) && msg.has_field(52));
    let resp = Message::parse(&spec, answer(&spec, &msg, "05").unwrap()).unwrap();
    for id in [35, 52, 128] {
        assert!(!resp.has_field(id), "F{id} not echoed");
    }
    assert!(!resp.has_field(38), "no approval code on a decline");
}

#[test]
fn answering_a_response_is_an_error() {
    let spec = spec();
    let req = crate::sim::sample_request(&spec, "0210").unwrap();
    let msg = Message::parse(&spec, req).unwrap();
    assert!(answer(&spec, &msg, "00").is_err());
}

#[test]
fn keys_join_f7_and_f11() {
    let spec = spec();
    let mut d = crate::iso8583::samples::echo(&spec);
    d.set_text(7, "1203045959");
    d.set_text(11, "000042");
    let msg = Message::parse(&spec, Bytes::from(spec.encode(&d).unwrap())).unwrap();
    assert_eq!(key_of(&msg), Some(1_203_045_959_000_042));
}

#[test]
fn done_is_bounded_and_remembers_answers() {
    let mut done = Done::default();
    for k in 0..(MAX_DONE as u64 + 10) {
        done.insert(k, k % 2 == 0);
    }
    assert_eq!(done.keys.len(), MAX_DONE);
    assert!(!done.keys.contains_key(&0), "oldest forgotten");
    assert_eq!(done.keys.get(&(MAX_DONE as u64 + 8)), Some(&true));
}

#[test]
fn a_non_visa_spec_is_refused() {
    let cups = Spec::builtin("cups").unwrap();
    assert!(check_spec(&cups).is_err());
    assert!(check_spec(&spec()).is_ok());
}

#[test]
fn report_verdict() {
    let mut r = VisaReport {
        issuer_sent: 3,
        issuer_approved: 3,
        ..VisaReport::default()
    };
    assert!(r.is_clean());
    assert!(r.to_string().starts_with("issuer sent 3 approved 3"));
    assert!(r.to_json().contains("\"issuer_sent\":3"));
    r.doubled = 1;
    assert!(!r.is_clean());
}
