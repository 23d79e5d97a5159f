//! Deadlines, late answers and the duplicate window, end to end in process
//! (`isoswitch::link::inproc::Rig`: the real service, its node connections
//! channels) on the rig's clock: a case steps to a deadline to the
//! millisecond with `Rig::advance` and runs the sweeper with `Rig::expire`.
//! None sleeps. What needs the sockets, the tasks or a simulator's own books
//! stays in tests/integrity.rs and tests/mblb.rs.
//!
//! Cases that touch no store run on tokio's paused clock too, so nothing
//! the service might schedule on tokio's timers runs in real time; the ones
//! with a store keep the real clock, since their wait is on the store's
//! writer thread, which a paused clock would jump past.

use std::sync::atomic::Ordering;
use std::time::Duration;

use isoswitch::config::TimeoutRule;
use isoswitch::route::{AdminState, DeclineReason, OnTimeout};
use isoswitch::store::{Direction, SafKind, SafState};

#[path = "common/clock.rs"]
mod clock;
#[path = "common/owed.rs"]
mod owed;
#[path = "common/procs.rs"]
mod procs;
use clock::*;

const MS: Duration = Duration::from_millis(1);
/// `PosToml`'s deadline of a purchase (02x0).
const PURCHASE: Duration = Duration::from_millis(500);

/// A purchase no node answers is declined with the timeout code (68) at
/// its deadline exactly: not a millisecond before, and once.
#[tokio::test(start_paused = true)]
async fn an_unanswered_purchase_is_declined_68_at_its_deadline_not_before() {
    bounded(async {
        let mut rig = rig(pos_config(1));
        to_node(&mut rig, &purchase(1));
        rig.advance(PURCHASE - MS);
        assert_eq!(rig.expire(), 0, "1 ms before its deadline");
        assert_eq!(said(&mut rig), None);
        assert_eq!(rig.service.in_flight(), 1);
        rig.advance(MS);
        assert_eq!(rig.expire(), 1, "at its deadline");
        assert_eq!(
            answered(&mut rig, "the decline"),
            ("0210".into(), "68".into())
        );
        let counters = rig.service.view().counters;
        assert_eq!(counters.declined(DeclineReason::Timeout), 1);
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 0, "declined once");
        assert_eq!(said(&mut rig), None);
    })
    .await;
}

/// The node's approval a millisecond before the deadline is relayed, and
/// the deadline then passes with nothing to decline.
#[tokio::test(start_paused = true)]
async fn an_approval_a_millisecond_before_the_deadline_is_relayed() {
    bounded(async {
        let mut rig = rig(pos_config(1));
        let (node, got) = to_node(&mut rig, &purchase(1));
        rig.advance(PURCHASE - MS);
        let approval = answer(&rig, &got, "00");
        assert_eq!(
            relay(&mut rig, node, &approval),
            ("0210".into(), "00".into())
        );
        rig.advance(MS);
        assert_eq!(rig.expire(), 0);
        assert_eq!(said(&mut rig), None, "no decline after the answer");
        let counters = rig.service.view().counters;
        assert_eq!(counters.declined(DeclineReason::Timeout), 0);
        assert_eq!(counters.answered.load(Ordering::Relaxed), 1);
    })
    .await;
}

/// Deadlines follow the MTI: with purchases given 10 s, an authorization
/// (0100, the 500 ms default) is declined at 500 ms while the purchase sent
/// with it waits for its own 10 s.
#[tokio::test(start_paused = true)]
async fn each_flow_is_declined_at_its_own_deadline() {
    bounded(async {
        let cfg = owed::PosToml::in_process(1)
            .purchase_timeout("10s")
            .service_config();
        let mut rig = rig(cfg);
        to_node(&mut rig, &request("0100", 1));
        to_node(&mut rig, &purchase(2));
        rig.advance(Duration::from_millis(500));
        assert_eq!(rig.expire(), 1);
        assert_eq!(
            answered(&mut rig, "the 0100's"),
            ("0110".into(), "68".into())
        );
        rig.advance(Duration::from_secs(10) - Duration::from_millis(500) - MS);
        assert_eq!(rig.expire(), 0, "the purchase 1 ms before its 10 s");
        rig.advance(MS);
        assert_eq!(rig.expire(), 1);
        assert_eq!(
            answered(&mut rig, "the 0200's"),
            ("0210".into(), "68".into())
        );
    })
    .await;
}

/// Moved from tests/mblb.rs, where it waited out 150 ms deadlines against
/// nodes answering after 400 ms: each request of a node slower than the
/// timeout gets exactly one answer, the switch's 68, and the node's late
/// answers are counted and never reach the client.
#[tokio::test(start_paused = true)]
async fn timeouts_are_declined_once_and_late_responses_are_dropped() {
    bounded(async {
        let mut cfg = pos_config(2);
        // Passive ejection off: this case is about timeouts alone.
        cfg.back.health.state.ejection_threshold = 0;
        let mut rig = rig(cfg);
        let sent: Vec<_> = (1..=10)
            .map(|stan| to_node(&mut rig, &purchase(stan)))
            .collect();
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 10);
        for _ in 0..10 {
            assert_eq!(answered(&mut rig, "a decline").1, "68");
        }
        for (node, got) in &sent {
            let late = answer(&rig, got, "00");
            rig.node_frame(*node, &late).expect("a frame");
        }
        assert_eq!(said(&mut rig), None, "no late answer reaches the client");
        let counters = rig.service.view().counters;
        assert_eq!(counters.declined(DeclineReason::Timeout), 10);
        assert_eq!(late_responses(&rig), 10);
    })
    .await;
}

/// Moved from tests/mblb.rs (it waited out a 150 ms silent timeout against
/// a node answering at 400 ms): a purchase the switch let expire in
/// silence, then its repeat (0201), which goes to the same node; the
/// node's approval of the original comes while the repeat is in flight and
/// reaches the terminal as the repeat's answer. The node's answer to the
/// repeat then finds no request: it must not be taken for a late approval
/// of the original, since the terminal has the approval.
#[tokio::test(start_paused = true)]
async fn an_approval_relayed_for_a_repeat_is_never_reversed() {
    bounded(async {
        let mut cfg = pos_config(2);
        cfg.timeouts.on_timeout = OnTimeout::Silent;
        // The repeat waits longer than the original, so that the original's
        // answer comes while the repeat is in flight.
        let repeat_waits = TimeoutRule::After(Duration::from_secs(3));
        cfg.timeouts.by_mti.insert("0201".into(), repeat_waits);
        let mut rig = rig(cfg);
        let (node, original) = to_node(&mut rig, &purchase(1));
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 1);
        assert_eq!(said(&mut rig), None, "silent");
        let made = std::sync::Arc::clone(&rig.service.view().made.counters);
        assert_eq!(made.silent_timeouts.load(Ordering::Relaxed), 1);
        let (repeat_node, repeat) = to_node(&mut rig, &request("0201", 1));
        assert_eq!(repeat_node, node, "a repeat goes to its original's node");
        let approval = answer(&rig, &original, "00");
        let to_terminal = relay(&mut rig, node, &approval);
        assert_eq!(
            to_terminal,
            ("0210".into(), "00".into()),
            "the repeat's answer"
        );
        let answer_to_repeat = answer(&rig, &repeat, "00");
        rig.node_frame(node, &answer_to_repeat).expect("a frame");
        assert_eq!(said(&mut rig), None, "one answer to the terminal");
        let made = std::sync::Arc::clone(&rig.service.view().made.counters);
        assert_eq!(
            made.late_unreversed.load(Ordering::Relaxed),
            0,
            "taken for a late approval"
        );
        assert_eq!(
            made.late_reversed.load(Ordering::Relaxed),
            0,
            "reversed what the terminal has"
        );
    })
    .await;
}

/// The host approves after the switch declined (`timeout_reversal` off, so
/// only an approval read is reversed): the approval goes nowhere, and one
/// reversal (0420) is owed to the node that approved, in the store; a
/// second late approval of it is only counted (never twice).
#[tokio::test]
async fn a_late_approval_is_reversed_once_at_the_node_that_approved() {
    bounded(async {
        let mut cfg = pos_config(2);
        cfg.integrity.timeout_reversal = false;
        let mut rig = rig(cfg);
        let (store, stored) = owe_into_store(&rig, "late-approval").await;
        let (node, got) = to_node(&mut rig, &purchase(1));
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 1);
        assert_eq!(answered(&mut rig, "the decline").1, "68");
        rig.advance(Duration::from_secs(1));
        let approval = answer(&rig, &got, "00");
        rig.node_frame(node, &approval).expect("a frame");
        assert_eq!(said(&mut rig), None, "a late approval is not relayed");
        stored.notified().await;
        let made = std::sync::Arc::clone(&rig.service.view().made.counters);
        assert_eq!(made.late_reversed.load(Ordering::Relaxed), 1);
        rig.node_frame(node, &approval).expect("a frame");
        assert_eq!(made.late_again.load(Ordering::Relaxed), 1);
        let rows = owed_rows(&store).await;
        assert_eq!(rows.len(), 1, "one reversal: {rows:?}");
        assert_eq!(
            (rows[0].kind, rows[0].mti.as_str()),
            (SafKind::Reversal, "0420")
        );
        assert_eq!(rows[0].direction, Direction::ToNode(node_id(&rig, node)));
        assert_eq!(rows[0].state, SafState::Pending);
        assert_eq!(rows[0].keys.f11.as_deref(), Some("000001"));
    })
    .await;
}

/// A request the switch declined is remembered for `late_window`: the
/// host's approval at the window's last millisecond is reversed, one a
/// millisecond later is not known any more (logged and counted as a late
/// response, as any stray).
#[tokio::test]
async fn a_late_approval_is_reversed_within_late_window_only() {
    bounded(async {
        let window = Duration::from_secs(30);
        let mut cfg = pos_config(1);
        cfg.integrity.timeout_reversal = false;
        cfg.integrity.late_window = window;
        let mut rig = rig(cfg);
        let (store, stored) = owe_into_store(&rig, "late-window").await;
        let (node, first) = to_node(&mut rig, &purchase(1));
        let (_, second) = to_node(&mut rig, &purchase(2));
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 2);
        rig.advance(window);
        rig.node_frame(node, &answer(&rig, &first, "00"))
            .expect("a frame");
        stored.notified().await;
        rig.advance(MS);
        rig.expire();
        rig.node_frame(node, &answer(&rig, &second, "00"))
            .expect("a frame");
        let made = std::sync::Arc::clone(&rig.service.view().made.counters);
        assert_eq!(made.late_reversed.load(Ordering::Relaxed), 1);
        assert_eq!(made.late_unreversed.load(Ordering::Relaxed), 0);
        assert_eq!(late_responses(&rig), 2, "both counted late");
        let rows = owed_rows(&store).await;
        assert_eq!(rows.len(), 1, "the first one's reversal only: {rows:?}");
        assert_eq!(rows[0].keys.f11.as_deref(), Some("000001"));
    })
    .await;
}

/// The host declines after the switch declined: nothing to reverse,
/// counted, nothing stored.
#[tokio::test]
async fn a_late_decline_is_never_reversed() {
    bounded(async {
        let mut cfg = pos_config(1);
        cfg.integrity.timeout_reversal = false;
        let mut rig = rig(cfg);
        let (store, _stored) = owe_into_store(&rig, "late-decline").await;
        let (node, got) = to_node(&mut rig, &purchase(1));
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 1);
        assert_eq!(answered(&mut rig, "the decline").1, "68");
        let decline = answer(&rig, &got, "05");
        rig.node_frame(node, &decline).expect("a frame");
        assert_eq!(said(&mut rig), None);
        let made = std::sync::Arc::clone(&rig.service.view().made.counters);
        assert_eq!(made.late_declines.load(Ordering::Relaxed), 1);
        assert_eq!(made.late_reversed.load(Ordering::Relaxed), 0);
        assert_eq!(owed_rows(&store).await.len(), 0, "nothing owed");
    })
    .await;
}

/// With `timeout_reversal` (the default) the switch owes a reversal the
/// moment it declines a purchase whose outcome is unknown; the host's late
/// approval attaches to it: counted as reversed, never a second chain.
#[tokio::test]
async fn a_timeout_reversal_covers_the_late_approval() {
    bounded(async {
        let mut rig = rig(pos_config(1));
        let (store, stored) = owe_into_store(&rig, "timeout-reversal").await;
        let (node, got) = to_node(&mut rig, &purchase(1));
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 1);
        assert_eq!(answered(&mut rig, "the decline").1, "68");
        stored.notified().await;
        let made = std::sync::Arc::clone(&rig.service.view().made.counters);
        assert_eq!(made.timeout_reversals.load(Ordering::Relaxed), 1);
        let approval = answer(&rig, &got, "00");
        rig.node_frame(node, &approval).expect("a frame");
        assert_eq!(said(&mut rig), None);
        assert_eq!(made.late_reversed.load(Ordering::Relaxed), 1);
        let rows = owed_rows(&store).await;
        assert_eq!(rows.len(), 1, "one chain: {rows:?}");
        assert_eq!(
            (rows[0].kind, rows[0].mti.as_str()),
            (SafKind::Reversal, "0420")
        );
    })
    .await;
}

/// The same purchase again within `duplicate_window` of its answer, up to
/// the window's last millisecond, never reaches a node and gets the first
/// answer; a millisecond past the window it is a new transaction, and goes
/// to the node.
#[tokio::test(start_paused = true)]
async fn a_duplicate_gets_the_first_answer_within_the_window_only() {
    bounded(async {
        let window = Duration::from_secs(60);
        let mut cfg = pos_config(1);
        cfg.integrity.duplicate_window = window;
        let mut rig = rig(cfg);
        let (node, got) = to_node(&mut rig, &purchase(7));
        let approval = answer(&rig, &got, "00");
        assert_eq!(relay(&mut rig, node, &approval).1, "00");
        rig.advance(window);
        rig.expire();
        assert_eq!(send(&mut rig, &purchase(7)), None, "not sent to the node");
        assert_eq!(
            answered(&mut rig, "the replay"),
            ("0210".into(), "00".into())
        );
        let made = std::sync::Arc::clone(&rig.service.view().made.counters);
        assert_eq!(made.duplicates_replayed.load(Ordering::Relaxed), 1);
        rig.advance(MS);
        rig.expire();
        let again = send(&mut rig, &purchase(7)).map(|(to, _)| to);
        assert_eq!(again, Some(node), "past the window: a new transaction");
        assert_eq!(made.duplicates_replayed.load(Ordering::Relaxed), 1);
        assert_eq!(rig.service.in_flight(), 1, "the new one waits for its node");
    })
    .await;
}

/// A repeat (0201) within `repeat_window` (30 s) of its original's answer
/// goes to the original's node or nowhere: with that node disabled it is
/// declined 91 up to the window's last millisecond, never sent to another
/// node; a millisecond later it is routed like a new request.
#[tokio::test(start_paused = true)]
async fn a_repeat_goes_to_its_originals_node_within_repeat_window_only() {
    bounded(async {
        let window = Duration::from_secs(30);
        let mut rig = rig(pos_config(2));
        let (node, got) = to_node(&mut rig, &purchase(1));
        let approval = answer(&rig, &got, "00");
        assert_eq!(relay(&mut rig, node, &approval).1, "00");
        let svc = std::sync::Arc::clone(&rig.service);
        assert!(svc.set_node_admin(node, AdminState::Disabled, rig.now()));
        rig.advance(window);
        rig.expire();
        assert_eq!(
            send(&mut rig, &request("0201", 1)),
            None,
            "not to another node"
        );
        assert_eq!(answered(&mut rig, "no node"), ("0210".into(), "91".into()));
        rig.advance(MS);
        rig.expire();
        let (to, _) = to_node(&mut rig, &request("0201", 1));
        assert_ne!(to, node, "past the window: routed as a new request");
    })
    .await;
}

/// Moved from tests/mblb.rs (a node answering after 300 ms kept the first
/// in flight there): another transaction under the key of one still in
/// flight (cup-pos: the same TPDU, F41 and F11, another F7) is declined
/// with the duplicate code (94) and never overwrites the first; the same
/// transaction sent again waits for the first one's answer and gets it
/// too. One request reaches the node.
#[tokio::test(start_paused = true)]
async fn a_key_in_flight_is_declined_94_unless_it_is_the_same_transaction() {
    bounded(async {
        let mut rig = rig(pos_config(1));
        let spec = std::sync::Arc::clone(rig.service.spec());
        let first = purchase(3);
        let mut other = spec.decode(&first[2..]).expect("decodes");
        other.set_text(7, "1206235959");
        let other = owed::framed(&spec.encode(&other).expect("encodes"));
        let (node, got) = to_node(&mut rig, &first);
        assert_eq!(send(&mut rig, &other), None, "not sent");
        let declined = answered(&mut rig, "another transaction's decline");
        assert_eq!(declined, ("0210".into(), "94".into()));
        assert_eq!(send(&mut rig, &first), None, "the same one waits");
        assert_eq!(said(&mut rig), None, "for the first one's answer");
        let approval = answer(&rig, &got, "00");
        assert_eq!(relay(&mut rig, node, &approval).1, "00", "the original");
        let again = answered(&mut rig, "the duplicate's answer");
        assert_eq!(again.1, "00", "and its duplicate");
        assert_eq!(said(&mut rig), None);
        assert!(
            rig.node_bytes().expect("encodes").is_none(),
            "one request at the node"
        );
    })
    .await;
}

/// Only a host's "done" closes what the switch owes (docs/integrity.md,
/// Delivery): the node answers the reversal of a late approval 0430 F39
/// 96 (a "retry" code): the entry stays owed, the answer in its last
/// error; its next attempt goes as a repeat (0421) to the same node, and
/// the 00 to that one completes it.
#[tokio::test]
async fn a_hosts_96_to_a_reversal_does_not_close_it() {
    bounded(async {
        let mut cfg = pos_config(2);
        cfg.integrity.timeout_reversal = false;
        let mut rig = rig(cfg);
        let (store, stored) = owe_into_store(&rig, "reversal-96").await;
        let (node, got) = to_node(&mut rig, &purchase(1));
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 1);
        let approval = answer(&rig, &got, "00");
        rig.node_frame(node, &approval).expect("a frame");
        stored.notified().await;
        rig.send_owed(claim_due(&store, Duration::ZERO).await);
        let (to, reversal) = owed_at_node(&mut rig);
        assert_eq!((to, mti_of(&rig, &reversal).as_str()), (node, "0420"));
        rig.node_frame(to, &answer(&rig, &reversal, "96"))
            .expect("a frame");
        let made = std::sync::Arc::clone(&rig.service.view().made.counters);
        assert_eq!(made.saf_answers_retry.load(Ordering::Relaxed), 1);
        let row = row_when(&store, |r| r.last_error.is_some()).await;
        assert_eq!(row.state, SafState::Pending, "96 does not close it");
        assert_eq!(
            row.last_error.as_deref(),
            Some("the host answered 0430 F39 96")
        );
        // Past saf.retry and the attempt's lease, by the store's clock.
        rig.send_owed(claim_due(&store, Duration::from_secs(120)).await);
        let (to, repeat) = owed_at_node(&mut rig);
        assert_eq!((to, mti_of(&rig, &repeat).as_str()), (node, "0421"));
        rig.node_frame(to, &answer(&rig, &repeat, "00"))
            .expect("a frame");
        assert_eq!(made.reversals_acknowledged.load(Ordering::Relaxed), 1);
        let row = row_when(&store, |r| r.state != SafState::Pending).await;
        assert_eq!(row.state, SafState::Delivered);
        assert_eq!(
            (row.attempts, row.answer.as_deref()),
            (2, Some("0430 F39 00"))
        );
    })
    .await;
}

/// An attempt of an owed reversal that its node leaves unanswered waits
/// for the timeout of its MTI (`04x0`: 2 s) on the rig's clock, not a
/// millisecond less, and is then recorded as an attempt without an answer:
/// still owed, for the next attempt.
#[tokio::test]
async fn an_unanswered_reversal_attempt_ends_at_its_deadline_still_owed() {
    bounded(async {
        let mut cfg = pos_config(1);
        cfg.integrity.timeout_reversal = false;
        let mut rig = rig(cfg);
        let (store, stored) = owe_into_store(&rig, "reversal-unanswered").await;
        let (node, got) = to_node(&mut rig, &purchase(1));
        rig.advance(PURCHASE);
        assert_eq!(rig.expire(), 1);
        assert_eq!(answered(&mut rig, "the decline").1, "68");
        rig.node_frame(node, &answer(&rig, &got, "00"))
            .expect("a frame");
        stored.notified().await;
        rig.send_owed(claim_due(&store, Duration::ZERO).await);
        let (_, reversal) = owed_at_node(&mut rig);
        assert_eq!(mti_of(&rig, &reversal), "0420");
        rig.advance(Duration::from_secs(2) - MS);
        assert_eq!(rig.expire(), 0);
        assert_eq!(rig.service.in_flight(), 1, "the attempt waits 1 ms more");
        rig.advance(MS);
        rig.expire();
        assert_eq!(rig.service.in_flight(), 0, "the attempt is over");
        assert_eq!(said(&mut rig), None, "nothing to a client for it");
        let row = row_when(&store, |r| r.last_error.is_some()).await;
        assert_eq!((row.state, row.attempts), (SafState::Pending, 1));
    })
    .await;
}
