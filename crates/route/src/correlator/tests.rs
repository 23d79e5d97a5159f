//! Tests of `correlator`.

use super::*;
use crate::integrity::Duplicate;
use std::sync::atomic::Ordering;

fn key(parts: &[&[u8]]) -> CorrelationKey {
    parts
        .iter()
        .fold(CorrelationKey::builder(), |b, p| b.push(p))
        .build()
        .unwrap()
}

fn k(n: u32) -> CorrelationKey {
    key(&[b"T0000001", format!("{n:06}").as_bytes()])
}

fn table(capacity: usize) -> Correlator<u32> {
    Correlator::new(CorrelatorConfig {
        capacity,
        recent_capacity: 4,
        recent_ttl: Duration::from_secs(60),
    })
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn key_parts_of_every_length_are_copied_whole() {
    // Each length takes its own way in `copy_part` (bytes, 4s, 8s, memcpy).
    let src: Vec<u8> = (1..=60).collect();
    for n in 0..=60 {
        let part = &src[..n];
        let k = key(&[b"02", part]);
        let mut want = vec![2, b'0', b'2', n as u8];
        want.extend_from_slice(part);
        assert_eq!(k.as_bytes(), &want[..], "part of {n} bytes");
    }
    // Past 64 bytes in all: refused, as before.
    let b = CorrelationKey::builder().push(&src[..60]).push(b"abc");
    assert!(b.build().is_err());
}

#[test]
fn key_parts_are_unambiguous() {
    assert_ne!(key(&[b"12", b"3"]), key(&[b"1", b"23"]));
    assert_ne!(key(&[b"", b"1"]), key(&[b"1"]));
    assert_eq!(key(&[b"AB", b"CD"]), key(&[b"AB", b"CD"]));
    assert_eq!(key(&[b"AB", b"CD"]).as_bytes(), b"\x02AB\x02CD");
    assert_eq!(
        format!("{:?}", key(&[b"T1", b"000123"])),
        "CorrelationKey(T1|000123)"
    );
    // F7 + F11 + F32 + F33 fits with room to spare.
    let host = key(&[b"0101123045", b"000123", b"12345678901", b"10987654321"]);
    assert_eq!(host.as_bytes().len(), 42);
    // Exactly 64 fits, 65 does not.
    assert!(CorrelationKey::builder().push(&[b'x'; 63]).build().is_ok());
    assert_eq!(
        CorrelationKey::builder().push(&[b'x'; 64]).build(),
        Err(KeyTooLong)
    );
    assert_eq!(
        CorrelationKey::builder()
            .push(&[b'x'; 300])
            .push(b"")
            .build(),
        Err(KeyTooLong)
    );
    assert_eq!(
        CorrelationKey::builder()
            .push(&[b'x'; 40])
            .push(&[b'y'; 40])
            .push(b"z")
            .build(),
        Err(KeyTooLong)
    );
}

#[test]
fn insert_then_take() {
    let t0 = Instant::now();
    let mut c = table(8);
    assert!(c.is_empty());
    c.insert(k(1), 10, 7, t0 + ms(100)).unwrap();
    assert!(c.contains(&k(1)));
    assert_eq!(c.via(&k(1)), Some(7));
    assert_eq!(c.len(), 1);
    assert_eq!(c.take(&k(1), t0), Ok(10));
    assert_eq!(
        c.take(&k(1), t0),
        Err(Miss::Unknown),
        "answered twice: not delivered twice"
    );
    assert!(c.is_empty() && c.next_deadline().is_none());
    let s = c.stats();
    assert_eq!((s.inserted, s.answered, s.unknown), (1, 1, 1));
}

#[test]
fn duplicate_in_flight_is_refused_and_the_first_kept() {
    let t0 = Instant::now();
    let mut c = table(8);
    c.insert(k(1), 10, 7, t0 + ms(100)).unwrap();
    assert_eq!(
        c.insert(k(1), 11, 8, t0 + ms(500)),
        Err(Rejected {
            error: CorrelateError::Duplicate,
            value: 11
        })
    );
    assert_eq!(c.via(&k(1)), Some(7));
    assert_eq!(c.next_deadline(), Some(t0 + ms(100)));
    assert_eq!(c.take(&k(1), t0), Ok(10));
    // Not in flight any more: the key may be used again.
    c.insert(k(1), 12, 7, t0 + ms(100)).unwrap();
    assert_eq!(c.stats().duplicates, 1);
}

#[test]
fn full_is_refused_until_room() {
    let t0 = Instant::now();
    let mut c = table(2);
    c.insert(k(1), 1, 0, t0).unwrap();
    c.insert(k(2), 2, 0, t0).unwrap();
    assert_eq!(
        c.insert(k(3), 3, 0, t0).unwrap_err().error,
        CorrelateError::Full
    );
    assert_eq!(
        c.insert(k(1), 4, 0, t0).unwrap_err().error,
        CorrelateError::Duplicate,
        "duplicate wins over full"
    );
    assert_eq!(c.take(&k(1), t0), Ok(1));
    c.insert(k(3), 3, 0, t0).unwrap();
    assert_eq!((c.stats().full, c.len()), (1, 2));
    let mut zero = table(0);
    assert_eq!(
        zero.insert(k(1), 1, 0, t0).unwrap_err().error,
        CorrelateError::Full
    );
}

#[test]
fn slots_are_reused_and_the_deadline_list_stays_linked() {
    let t0 = Instant::now();
    let mut c = table(4);
    for round in 0..50u32 {
        for n in 0..4 {
            c.insert(k(round * 4 + n), n, 0, t0 + ms(u64::from(round)))
                .unwrap();
        }
        // Take from the middle, the head and the tail of the list.
        assert_eq!(c.take(&k(round * 4 + 2), t0), Ok(2));
        assert_eq!(c.take(&k(round * 4), t0), Ok(0));
        assert_eq!(c.take(&k(round * 4 + 3), t0), Ok(3));
        assert_eq!(c.next_deadline(), Some(t0 + ms(u64::from(round))));
        let mut out = Vec::new();
        assert_eq!(c.expire(t0 + ms(u64::from(round)), &mut out), 1);
        assert_eq!(out[0].1, 1);
        assert!(c.is_empty() && c.next_deadline().is_none());
    }
    assert!(c.slab.len() <= 4, "slots are reused, not grown");
}

fn shards(capacity: usize) -> Shards<u32> {
    Shards::new(CorrelatorConfig {
        capacity,
        recent_capacity: 4096,
        recent_ttl: Duration::from_secs(60),
    })
}

#[test]
fn shards_share_one_capacity() {
    let t0 = Instant::now();
    let s = shards(3);
    let results: Vec<_> = (0..5)
        .map(|n| s.insert(k(n), n, 0, t0 + ms(100)).map_err(|r| r.error))
        .collect();
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3);
    assert_eq!(
        results
            .iter()
            .filter(|r| **r == Err(CorrelateError::Full))
            .count(),
        2
    );
    assert_eq!(s.len(), 3);
    // A duplicate is told apart from a full table.
    assert_eq!(
        s.insert(k(0), 9, 0, t0).map_err(|r| r.error),
        Err(CorrelateError::Duplicate)
    );
    assert_eq!(s.take(&k(0), t0), Ok(0));
    assert!(s.insert(k(7), 7, 0, t0 + ms(100)).is_ok());
    assert_eq!(s.len(), 3);
    let st = s.stats();
    assert_eq!(
        (st.inserted, st.full, st.duplicates, st.answered),
        (4, 2, 1, 1)
    );
}

#[test]
fn shards_hand_each_entry_out_once() {
    let t0 = Instant::now();
    let s = shards(1000);
    for n in 0..300 {
        s.insert(k(n), n, u64::from(n % 3), t0 + ms(u64::from(n)))
            .unwrap();
    }
    let mut out = Vec::new();
    assert_eq!(s.take_via(1, t0, &mut out), 100);
    assert!(out.iter().all(|(_, v)| v % 3 == 1));
    out.clear();
    assert_eq!(s.next_deadline(), Some(t0));
    assert_eq!(s.expire(t0 + ms(149), &mut out), 100, "n % 3 != 1, n < 150");
    assert_eq!(s.take(&k(1), t0), Err(Miss::Late), "declined: late");
    assert_eq!(s.take(&k(150), t0), Ok(150));
    out.clear();
    assert_eq!(s.drain(t0, &mut out), 99);
    assert!(s.is_empty());
    let mut seen: Vec<u32> = out.iter().map(|(_, v)| *v).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 99);
}

#[test]
fn expire_in_deadline_order() {
    let t0 = Instant::now();
    let mut c = table(16);
    for (n, d) in [(1, 300), (2, 100), (3, 200), (4, 100), (5, 900)] {
        c.insert(k(n), n, 0, t0 + ms(d)).unwrap();
    }
    assert_eq!(c.next_deadline(), Some(t0 + ms(100)));
    let mut out = Vec::new();
    assert_eq!(c.expire(t0 + ms(99), &mut out), 0);
    assert_eq!(c.expire(t0 + ms(300), &mut out), 4);
    let order: Vec<u32> = out.iter().map(|(_, v)| *v).collect();
    assert_eq!(order, [2, 4, 3, 1], "by deadline, ties by insertion");
    assert_eq!(out[0].0, k(2));
    assert_eq!(c.next_deadline(), Some(t0 + ms(900)));
    // A taken entry is not expired later.
    assert_eq!(
        c.take(&k(5), t0 + ms(950)),
        Ok(5),
        "response beats the sweep: delivered"
    );
    out.clear();
    assert_eq!(c.expire(t0 + ms(10_000), &mut out), 0);
    assert_eq!(c.stats().expired, 4);
}

#[test]
fn late_versus_unknown() {
    let t0 = Instant::now();
    let mut c = table(16);
    c.insert(k(1), 1, 0, t0 + ms(100)).unwrap();
    let mut out = Vec::new();
    c.expire(t0 + ms(100), &mut out);
    assert_eq!(c.take(&k(1), t0 + ms(150)), Err(Miss::Late));
    assert_eq!(
        c.take(&k(1), t0 + ms(200)),
        Err(Miss::Late),
        "still late, still not delivered"
    );
    assert_eq!(c.take(&k(9), t0 + ms(200)), Err(Miss::Unknown));
    // Past the TTL it is forgotten.
    assert_eq!(
        c.take(&k(1), t0 + ms(100) + Duration::from_secs(60)),
        Err(Miss::Unknown)
    );
    let s = c.stats();
    assert_eq!((s.late, s.unknown), (2, 2));
}

#[test]
fn recent_set_is_bounded() {
    let t0 = Instant::now();
    let mut c = table(16); // recent_capacity 4
    for n in 0..6 {
        c.insert(k(n), n, 0, t0).unwrap();
        assert_eq!(c.cancel(&k(n), t0), Some(n));
    }
    assert_eq!(c.cancel(&k(0), t0), None);
    assert_eq!(c.recent.len(), 4);
    assert_eq!(c.recent_order.len(), 4);
    assert_eq!(c.take(&k(0), t0), Err(Miss::Unknown), "oldest forgotten");
    assert_eq!(c.take(&k(1), t0), Err(Miss::Unknown));
    assert_eq!(c.take(&k(5), t0), Err(Miss::Late));
    // The same key declined twice: the older record must not erase the newer.
    c.insert(k(5), 5, 0, t0).unwrap();
    c.cancel(&k(5), t0 + ms(10)).unwrap();
    for n in 6..9 {
        c.insert(k(n), n, 0, t0).unwrap();
        c.cancel(&k(n), t0 + ms(10)).unwrap();
    }
    assert_eq!(c.take(&k(5), t0 + ms(10)), Err(Miss::Late));
    // Off entirely.
    let mut off = Correlator::new(CorrelatorConfig {
        recent_capacity: 0,
        ..CorrelatorConfig::default()
    });
    off.insert(k(1), 1, 0, t0).unwrap();
    off.cancel(&k(1), t0).unwrap();
    assert_eq!(off.take(&k(1), t0), Err(Miss::Unknown));
    // Shrinking the limit trims.
    c.set_config(CorrelatorConfig {
        recent_capacity: 1,
        ..*c.config()
    });
    assert_eq!(c.recent_order.len(), 1);
}

#[test]
fn take_via_returns_only_that_connection() {
    let t0 = Instant::now();
    let mut c = table(16);
    c.insert(k(1), 1, 100, t0 + ms(300)).unwrap();
    c.insert(k(2), 2, 200, t0 + ms(100)).unwrap();
    c.insert(k(3), 3, 100, t0 + ms(100)).unwrap();
    let mut out = Vec::new();
    assert_eq!(c.take_via(100, t0, &mut out), 2);
    let vals: Vec<u32> = out.iter().map(|(_, v)| *v).collect();
    assert_eq!(vals, [3, 1]);
    assert_eq!(c.len(), 1);
    assert_eq!(c.take(&k(1), t0), Err(Miss::Late));
    assert_eq!(c.take_via(100, t0, &mut out), 0);
    out.clear();
    assert_eq!(c.expire(t0 + ms(1000), &mut out), 1);
    assert_eq!(out[0].1, 2);
    assert_eq!(c.stats().node_lost, 2);
}

#[test]
fn drain_empties_everything() {
    let t0 = Instant::now();
    let mut c = table(16);
    for n in 0..5 {
        c.insert(k(n), n, u64::from(n), t0 + ms(u64::from(10 - n)))
            .unwrap();
    }
    let mut out = Vec::new();
    assert_eq!(c.drain(t0, &mut out), 5);
    assert!(c.is_empty() && c.next_deadline().is_none());
    let vals: Vec<u32> = out.iter().map(|(_, v)| *v).collect();
    assert_eq!(vals, [4, 3, 2, 1, 0]);
    assert_eq!(c.stats().cancelled, 5);
}

#[test]
fn config_parses() {
    let c: CorrelatorConfig = toml::from_str("capacity = 10\nrecent_ttl = \"30s\"").unwrap();
    assert_eq!(c.capacity, 10);
    assert_eq!(c.recent_ttl, Duration::from_secs(30));
    assert_eq!(
        c.recent_capacity,
        CorrelatorConfig::default().recent_capacity
    );
}

/// A table keeping answers for a window of 300 s, and the book that says
/// what requests are known by.
fn keeping(capacity: usize) -> (Shards<u32>, crate::integrity::DuplicateBook) {
    let book = crate::integrity::DuplicateBook::new(Duration::from_secs(300), capacity, 1 << 20);
    let cfg = CorrelatorConfig {
        capacity: 64,
        recent_capacity: 64,
        recent_ttl: Duration::from_secs(60),
    };
    (Shards::with_keeping(cfg, Arc::clone(book.keeping())), book)
}

#[test]
fn an_answered_key_stays_for_its_duplicates() {
    let t0 = Instant::now();
    let (s, book) = keeping(100);
    let first = book.fingerprint([&b"TERM0001"[..]]);
    let other = book.fingerprint([&b"TERM0002"[..]]);
    let look = |t| (first, Some(t));
    s.register(k(1), look(t0), 1, 0, t0 + ms(100)).unwrap();
    let v = s.take_answered(&k(1), b"0210-approved", t0).unwrap();
    assert_eq!((v, s.len(), s.answered()), (1, 0, 1));
    // A duplicate is refused registration, and gets the answer.
    let refused = s.register(k(1), look(t0), 2, 0, t0 + ms(100));
    assert_eq!(refused.map_err(|r| r.error), Err(CorrelateError::Duplicate));
    let later = t0 + Duration::from_secs(300);
    assert_eq!(
        s.seen(&k(1), first, later),
        Some(Duplicate::Replay(b"0210-approved".to_vec()))
    );
    assert_eq!(s.seen(&k(1), first, later + ms(1)), None, "past the window");
    assert_eq!(s.seen(&k(2), first, t0), None, "another key");
    assert_eq!(s.seen(&k(1), other, t0), None, "another transaction");
    // A repeat is not looked up: it goes to the host. Its answer is kept
    // in turn; one its sender never got is withheld: declined.
    s.register(k(1), (first, None), 3, 0, t0 + ms(100)).unwrap();
    assert_eq!(s.take_answered(&k(1), b"0211", t0), Ok(3));
    s.withhold(&k(1), other);
    assert_eq!(
        s.seen(&k(1), first, t0),
        Some(Duplicate::Replay(b"0211".to_vec())),
        "another transaction's withholding touches nothing"
    );
    s.withhold(&k(1), first);
    assert_eq!(s.seen(&k(1), first, t0), Some(Duplicate::Answered));
    // Past the window, the sweep forgets it.
    let mut out = Vec::new();
    assert_eq!(s.answered(), 2);
    assert_eq!(s.expire(later + ms(1), &mut out), 0);
    assert_eq!(s.answered(), 0);
    assert_eq!(s.seen(&k(1), first, later + ms(1)), None);
}

/// An answer withheld (its sender gone) says whether a duplicate from
/// another connection was sent it first: then a terminal has it, and the
/// switch must not reverse it as undelivered.
#[test]
fn withholding_an_answer_says_whether_a_duplicate_got_it_first() {
    let t0 = Instant::now();
    let (s, book) = keeping(100);
    let first = book.fingerprint([&b"TERM0001"[..]]);
    s.register(k(1), (first, Some(t0)), 1, 0, t0 + ms(100))
        .unwrap();
    assert_eq!(s.take_answered(&k(1), b"0210-approved", t0), Ok(1));
    assert!(!s.withhold(&k(1), first), "no duplicate was sent it");
    assert_eq!(s.seen(&k(1), first, t0), Some(Duplicate::Answered));

    s.register(k(2), (first, Some(t0)), 2, 0, t0 + ms(100))
        .unwrap();
    assert_eq!(s.take_answered(&k(2), b"0210-approved", t0), Ok(2));
    assert_eq!(
        s.seen(&k(2), first, t0),
        Some(Duplicate::Replay(b"0210-approved".to_vec()))
    );
    assert!(s.withhold(&k(2), first), "a duplicate was sent it first");
    assert_eq!(s.seen(&k(2), first, t0), Some(Duplicate::Answered));
}

#[test]
fn another_transaction_of_an_answered_key_hides_it_until_it_leaves() {
    let t0 = Instant::now();
    let (s, book) = keeping(100);
    let first = book.fingerprint([&b"1206101112"[..]]);
    let second = book.fingerprint([&b"1206101113"[..]]);
    s.register(k(1), (first, Some(t0)), 1, 0, t0 + ms(100))
        .unwrap();
    assert_eq!(s.take_answered(&k(1), b"first", t0), Ok(1));
    // The same key, another F7: a new transaction, in flight.
    s.register(k(1), (second, Some(t0)), 2, 0, t0 + ms(100))
        .unwrap();
    let replay = |id| s.seen(&k(1), id, t0);
    assert_eq!(replay(first), Some(Duplicate::Replay(b"first".to_vec())));
    assert_eq!(replay(second), None, "in flight: it waits, no replay");
    // Declined before it was sent: the first's answer is back in place.
    assert_eq!(s.cancel(&k(1), t0), Some(2));
    assert_eq!(replay(first), Some(Duplicate::Replay(b"first".to_vec())));
    // Answered by the switch (its deadline): declined from now on.
    s.register(k(1), (second, Some(t0)), 3, 0, t0 + ms(100))
        .unwrap();
    let mut out = Vec::new();
    assert_eq!(s.expire(t0 + ms(100), &mut out), 1);
    assert_eq!(replay(second), Some(Duplicate::Answered));
    assert_eq!(replay(first), None, "the newest answer of a key is kept");
    assert_eq!(s.answered(), 2);
}

/// Keys that land in the same shard of `s` as `first`.
fn same_shard(s: &Shards<u32>, first: &CorrelationKey) -> impl Iterator<Item = CorrelationKey> {
    let shard = s.shard_number_of(first);
    let keys = (1000u32..).map(|n| key(&[&n.to_le_bytes()]));
    keys.filter(move |k| s.shard_number_of(k) == shard)
}

/// A table at its capacity of answers forgets its oldest, never the
/// newest: duplicates come for the newest (a terminal resends within
/// seconds). Each shard holds its share.
#[test]
fn a_full_table_of_answers_forgets_its_oldest() {
    let t0 = Instant::now();
    // Two answers a shard.
    let (s, book) = keeping(2 * SHARDS);
    let id = book.fingerprint([&b"a"[..]]);
    let keys: Vec<_> = same_shard(&s, &k(1)).take(3).collect();
    for (n, key) in keys.iter().enumerate() {
        s.register(*key, (id, Some(t0)), n as u32, 0, t0 + ms(100))
            .unwrap();
        assert_eq!(s.take_answered(key, b"0210", t0), Ok(n as u32));
    }
    assert_eq!(s.answered(), 2);
    assert_eq!(book.counters.overflow.load(Ordering::Relaxed), 1);
    assert_eq!(s.seen(&keys[0], id, t0), None, "the oldest forgotten");
    for key in &keys[1..] {
        assert_eq!(
            s.seen(key, id, t0),
            Some(Duplicate::Replay(b"0210".to_vec()))
        );
    }
    // Without a fingerprint, nothing is kept.
    let (s, _) = keeping(2);
    s.insert(k(1), 1, 0, t0).unwrap();
    assert_eq!(s.take(&k(1), t0), Ok(1));
    assert_eq!((s.answered(), s.len()), (0, 0));
}

/// An answer written over in its shard's ring before its window ends is
/// declined, never replayed from stale bytes; one too long for the ring is
/// never kept.
#[test]
fn an_answer_written_over_is_declined_not_replayed() {
    let t0 = Instant::now();
    // 256 bytes of ring a shard: a key and its answer of 64 bytes at most.
    let book = crate::integrity::DuplicateBook::new(Duration::from_secs(300), 1000, 256 * SHARDS);
    let cfg = CorrelatorConfig {
        capacity: 64,
        ..CorrelatorConfig::default()
    };
    let s = Shards::with_keeping(cfg, Arc::clone(book.keeping()));
    let id = book.fingerprint([&b"a"[..]]);
    let answer = |key: &CorrelationKey, bytes: &[u8]| {
        s.register(*key, (id, Some(t0)), 0, 0, t0 + ms(100))
            .unwrap();
        assert_eq!(s.take_answered(key, bytes, t0), Ok(0));
    };
    let first = k(1);
    answer(&first, &[7; 8]);
    assert_eq!(s.seen(&first, id, t0), Some(Duplicate::Replay(vec![7; 8])));
    // More answers through its shard wrap the ring.
    for (n, key) in same_shard(&s, &first).take(40).enumerate() {
        answer(&key, &[n as u8; 8]);
    }
    assert_eq!(s.seen(&first, id, t0), Some(Duplicate::Answered));
    assert_eq!(book.counters.overwritten.load(Ordering::Relaxed), 1);
    let long = k(2);
    answer(&long, &[1; 60]);
    assert_eq!(s.seen(&long, id, t0), Some(Duplicate::Answered));
    assert_eq!(book.counters.too_long.load(Ordering::Relaxed), 1);
}

mod prop {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert { key: u8, via: u8, ttl_ms: u16 },
        Take { key: u8 },
        Cancel { key: u8 },
        Advance { ms: u16 },
        TakeVia { via: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..24, 0u8..3, 0u16..500).prop_map(|(key, via, ttl_ms)| Op::Insert { key, via, ttl_ms }),
            2 => (0u8..24).prop_map(|key| Op::Take { key }),
            1 => (0u8..24).prop_map(|key| Op::Cancel { key }),
            2 => (0u16..300).prop_map(|ms| Op::Advance { ms }),
            1 => (0u8..3).prop_map(|via| Op::TakeVia { via }),
        ]
    }

    proptest! {
        /// Every accepted value comes out exactly once (take, expire,
        /// take_via, cancel or the final drain); refused values never
        /// do; Duplicate is returned exactly when the key is in flight.
        #[test]
        fn each_value_leaves_exactly_once(ops in proptest::collection::vec(op(), 0..300), cap in 1usize..16) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut c: Correlator<u32> = Correlator::new(CorrelatorConfig {
                capacity: cap,
                recent_capacity: 8,
                recent_ttl: Duration::from_millis(400),
            });
            // Model: key -> (value, via, deadline).
            let mut model: HashMap<u8, (u32, u8, Instant)> = HashMap::new();
            let mut accepted: Vec<u32> = Vec::new();
            let mut out_count: HashMap<u32, u32> = HashMap::new();
            let mut next = 0u32;
            let mut out = Vec::new();
            for op in ops {
                match op {
                    Op::Insert { key, via, ttl_ms } => {
                        next += 1;
                        let deadline = now + Duration::from_millis(u64::from(ttl_ms));
                        match c.insert(k(key.into()), next, via.into(), deadline) {
                            Ok(()) => {
                                prop_assert!(!model.contains_key(&key));
                                prop_assert!(model.len() < cap);
                                model.insert(key, (next, via, deadline));
                                accepted.push(next);
                            }
                            Err(Rejected { error: CorrelateError::Duplicate, value }) => {
                                prop_assert_eq!(value, next);
                                prop_assert!(model.contains_key(&key));
                            }
                            Err(Rejected { error: CorrelateError::Full, value }) => {
                                prop_assert_eq!(value, next);
                                prop_assert!(!model.contains_key(&key));
                                prop_assert_eq!(model.len(), cap);
                            }
                        }
                    }
                    Op::Take { key } => match c.take(&k(key.into()), now) {
                        Ok(v) => {
                            prop_assert_eq!(model.remove(&key).map(|m| m.0), Some(v));
                            *out_count.entry(v).or_default() += 1;
                        }
                        Err(_) => prop_assert!(!model.contains_key(&key)),
                    },
                    Op::Cancel { key } => match c.cancel(&k(key.into()), now) {
                        Some(v) => {
                            prop_assert_eq!(model.remove(&key).map(|m| m.0), Some(v));
                            *out_count.entry(v).or_default() += 1;
                            prop_assert_eq!(c.take(&k(key.into()), now), Err(Miss::Late));
                        }
                        None => prop_assert!(!model.contains_key(&key)),
                    },
                    Op::Advance { ms } => {
                        now += Duration::from_millis(u64::from(ms));
                        out.clear();
                        c.expire(now, &mut out);
                        let mut last = None;
                        for (_, v) in &out {
                            let (key, m) = model.iter().find(|(_, m)| m.0 == *v).map(|(k, m)| (*k, *m)).unwrap();
                            prop_assert!(m.2 <= now);
                            prop_assert!(last.is_none_or(|l| l <= m.2), "deadline order");
                            last = Some(m.2);
                            model.remove(&key);
                            *out_count.entry(*v).or_default() += 1;
                        }
                        prop_assert!(model.values().all(|m| m.2 > now));
                    }
                    Op::TakeVia { via } => {
                        out.clear();
                        c.take_via(via.into(), now, &mut out);
                        for (_, v) in &out {
                            let key = model.iter().find(|(_, m)| m.0 == *v).map(|(k, _)| *k).unwrap();
                            prop_assert_eq!(model[&key].1, via);
                            model.remove(&key);
                            *out_count.entry(*v).or_default() += 1;
                        }
                        prop_assert!(model.values().all(|m| m.1 != via));
                    }
                }
                prop_assert_eq!(c.len(), model.len());
                prop_assert!(c.recent.len() <= 8 && c.recent_order.len() <= 8);
            }
            out.clear();
            c.drain(now, &mut out);
            for (_, v) in &out {
                *out_count.entry(*v).or_default() += 1;
            }
            prop_assert!(c.is_empty());
            prop_assert_eq!(out_count.len(), accepted.len());
            for v in &accepted {
                prop_assert_eq!(out_count.get(v), Some(&1), "value {} out once", v);
            }
            let s = c.stats();
            prop_assert_eq!(s.inserted, accepted.len() as u64);
            prop_assert_eq!(s.answered + s.expired + s.node_lost + s.cancelled, s.inserted);
        }
    }
}
