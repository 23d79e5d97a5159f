use super::*;
use bytes::Bytes;

const SIGN_ON: &[u8] = b"001";
const ECHO: &[u8] = b"301";

fn frame(n: u8) -> Outbound {
    Outbound::message(Bytes::from(vec![n]))
}

fn links(n: usize) -> OutLinks {
    OutLinks::new(n, SignOn::PerLink, Duration::from_secs(10), Instant::now())
}

/// Connects `link` with a writer queue of `cap`; returns the queue's reader
/// and the STAN of the sign-on queued on it (already read off the queue).
fn connect(l: &OutLinks, link: usize, cap: usize, stan: u32) -> mpsc::Receiver<LinkFrame> {
    let (tx, mut rx) = mpsc::channel(cap);
    l.set_link(link, Some(tx));
    let generation = l.send_on(link, frame(0)).expect("sign-on queued");
    l.expect_nm_answer(stan, link, generation);
    assert!(
        matches!(rx.try_recv(), Ok(LinkFrame { out: Outbound::Message(p, _), .. }) if p[..] == [0])
    );
    rx
}

fn sign_on(l: &OutLinks, stan: u32) -> bool {
    l.nm_answered(stan, SIGN_ON, true, SIGN_ON, ECHO)
}

#[test]
fn nothing_but_the_sign_on_goes_on_an_unsigned_link() {
    let l = links(2);
    let mut rx = connect(&l, 0, 8, 1);
    let now = Instant::now();
    assert_eq!(l.answer(frame(1), now), Ok(Queued::Waiting));
    assert_eq!(l.send(frame(2), now), Ok(Queued::Waiting));
    assert_eq!(l.send_signed_on(0, Outbound::KeepAlive), None);
    assert!(rx.try_recv().is_err(), "nothing before the 0830");
    assert_eq!(l.up(), (1, 0));
    assert!(sign_on(&l, 1));
    let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(got.len(), 2, "both sent once signed on, in order");
    assert_eq!(l.waiting(), 0);
    assert_eq!(l.up(), (1, 1));
}

#[test]
fn an_0830_to_an_earlier_connection_signs_nothing_on() {
    let l = links(1);
    let _old = connect(&l, 0, 8, 1);
    l.set_link(0, None);
    let mut rx = connect(&l, 0, 8, 2);
    // The old connection's sign-on is answered after the link reconnected.
    assert!(sign_on(&l, 1));
    assert_eq!(l.answer(frame(1), Instant::now()), Ok(Queued::Waiting));
    assert!(
        rx.try_recv().is_err(),
        "the new connection is not signed on"
    );
    assert!(sign_on(&l, 2));
    assert!(rx.try_recv().is_ok());
}

/// Before: a link coming up took every parked frame on its own queue and
/// dropped what did not fit. Now what does not fit keeps waiting.
#[test]
fn waiting_frames_beyond_a_full_queue_wait_not_drop() {
    let l = links(1);
    let mut rx = connect(&l, 0, 4, 1);
    let now = Instant::now();
    for i in 0..10 {
        assert_eq!(l.answer(frame(i), now), Ok(Queued::Waiting));
    }
    assert!(sign_on(&l, 1));
    let mut got = Vec::new();
    while got.len() < 10 {
        let before = got.len();
        while let Ok(LinkFrame {
            out: Outbound::Message(p, _),
            ..
        }) = rx.try_recv()
        {
            got.push(p[0]);
        }
        assert!(got.len() > before, "progress on every flush");
        l.flush(now, true);
    }
    assert_eq!(got, (0..10).collect::<Vec<_>>(), "all, in order");
    assert_eq!(l.parked_dropped.load(Ordering::Relaxed), 0);
    assert_eq!(l.parked_sent.load(Ordering::Relaxed), 10);
}

#[test]
fn waiting_frames_expire_at_their_deadline_and_are_counted() {
    let l = OutLinks::new(
        1,
        SignOn::PerLink,
        Duration::from_millis(50),
        Instant::now(),
    );
    let t0 = Instant::now();
    assert_eq!(l.answer(frame(1), t0), Ok(Queued::Waiting));
    assert_eq!(l.send(frame(2), t0), Ok(Queued::Waiting));
    assert_eq!(l.flush(t0 + Duration::from_millis(10), true).sent, 0);
    assert_eq!(l.waiting(), 2, "still within the deadline");
    let done = l.flush(t0 + Duration::from_millis(60), true);
    assert_eq!((done.answers_expired, done.requests_expired), (1, 1));
    assert_eq!(l.waiting(), 0);
}

#[test]
fn the_waiting_queue_is_bounded() {
    let l = links(1);
    let now = Instant::now();
    for _ in 0..PARK_CAPACITY {
        assert_eq!(l.answer(frame(0), now), Ok(Queued::Waiting));
    }
    assert_eq!(l.answer(frame(0), now), Err(NoOutLink));
    assert_eq!(l.park_refused.load(Ordering::Relaxed), 1);
}

/// Before: a frame that found no usable link, then parked just after a
/// link signed on and flushed, stayed parked until the next link came up
/// (which, with every link up, was never). This is that interleaving.
#[test]
fn a_frame_parked_while_a_link_signs_on_is_not_left_behind() {
    let l = links(1);
    let mut rx = connect(&l, 0, 8, 1);
    let answer = LinkFrame {
        since: Instant::now(),
        carry: Some(Carry::Answer),
        out: frame(1),
    };
    let Err(answer) = l.send_usable(answer) else {
        panic!("no usable link yet");
    };
    assert!(
        sign_on(&l, 1),
        "the link signs on and flushes: nothing waits yet"
    );
    assert_eq!(l.wait(answer), Ok(Queued::Waiting));
    assert!(rx.try_recv().is_ok(), "the frame was left waiting");
    assert_eq!(l.waiting(), 0);
}
