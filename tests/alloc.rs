//! The per-message path allocates nothing once warm: 10,000 request/response
//! pairs per dialect through the switch's real code (`link::inproc::Rig`:
//! frame cut, `Service::on_request`, node queue, writer encode, then
//! `Service::on_node_frame` and the client's), counted by a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use isoswitch::link::inproc::{READ_BUFFER, Rig, purchase_frames, purchase_round, service_toml};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
/// Allocations of a fresh read buffer (`READ_BUFFER` bytes) or of the
/// 40-byte header `bytes` gives a buffer once frames cut off it are shared.
static BUFFER_REFILLS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Only the measuring thread counts: the test harness may allocate elsewhere.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note(size: usize) {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        if size == READ_BUFFER || size == 40 {
            BUFFER_REFILLS.fetch_add(1, Ordering::SeqCst);
            return;
        }
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f` on this thread, and read-buffer refills apart.
fn allocations_and_refills(f: impl FnOnce()) -> (usize, usize) {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let refills = BUFFER_REFILLS.load(Ordering::SeqCst);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    (
        ALLOCATIONS.load(Ordering::SeqCst) - before,
        BUFFER_REFILLS.load(Ordering::SeqCst) - refills,
    )
}

fn allocations(f: impl FnOnce()) -> usize {
    allocations_and_refills(f).0
}

#[test]
fn counter_sees_allocations() {
    assert!(allocations(|| drop(black_box(vec![1u8; 16]))) >= 1);
}

/// Drives request/response pairs through the switch's real per-message path
/// (frame cut, validation, key, pick, stamp, correlator, node queue, writer
/// encode, and back) and counts heap allocations once it is warm.
fn allocations_per_pair(
    spec: &str,
    stamp: bool,
    pairs: usize,
    journal: bool,
) -> (usize, usize, usize) {
    const DISTINCT: usize = 256;
    let mut rig = Rig::new(&service_toml(spec, stamp)).expect("rig");
    if journal {
        rig = rig.with_journal().expect("journal");
    }
    let requests = purchase_frames(rig.service.spec(), DISTINCT).expect("frames");
    // Warm up: the correlator, the queues and the buffers grow to their peak,
    // and each request's answer is made once, outside the count.
    let mut answers = Vec::with_capacity(DISTINCT);
    for req in &requests {
        let (node, bytes) = rig.request(req).expect("routes").expect("to a node");
        let bytes = bytes.to_vec();
        let answer = rig.answer_frame(&bytes).expect("answer");
        let to_client = rig.response(node, &answer).expect("answered");
        assert!(!to_client.is_empty());
        answers.push(answer);
    }
    // Each round the same STANs as new transactions (another F7, or F41):
    // the same frames again would be duplicates, answered by the switch
    // from its duplicate book and never sent to a node.
    let spec = std::sync::Arc::clone(rig.service.spec());
    let rounds: Vec<_> = (1..=(4 + pairs.div_ceil(DISTINCT)) as u32)
        .map(|r| purchase_round(&spec, DISTINCT, r).expect("frames"))
        .collect();
    for round in &rounds[..4] {
        for (req, answer) in round.iter().zip(&answers) {
            let (node, _) = rig.request(req).expect("routes").expect("to a node");
            rig.response(node, answer).expect("answered");
        }
        rig.drain_journal();
    }
    let mut bytes_read = 0;
    let mut rows = 0;
    let (n, refills) = allocations_and_refills(|| {
        for i in 0..pairs {
            let k = i % DISTINCT;
            let request = &rounds[4 + i / DISTINCT][k];
            bytes_read += request.len() + answers[k].len();
            let (node, bytes) = rig.request(request).expect("routes").expect("to a node");
            black_box(bytes);
            black_box(rig.response(node, &answers[k]).expect("answered"));
            // The journal's writer takes the rows as they come, as the
            // switch's does (the queue's blocks are reused, not made anew).
            if k == DISTINCT - 1 {
                rows += rig.drain_journal();
            }
        }
    });
    if journal {
        assert_eq!(rows + rig.drain_journal(), pairs, "a row per exchange");
    }
    let c = &rig.service.view().counters;
    assert_eq!(
        c.answered.load(Ordering::Relaxed) as usize,
        pairs + 5 * DISTINCT,
        "every request answered by its node"
    );
    assert_eq!(c.declined_total(), 0);
    (n, refills, bytes_read)
}

#[test]
fn request_and_response_path_allocates_nothing_per_message() {
    // With the journal on (the default), each exchange's row is taken on
    // the path into a fixed-size entry: no allocation per row either.
    for journal in [false, true] {
        for (spec, stamp) in [("cups", true), ("cup-pos", false), ("visa-base1", true)] {
            check_pairs(spec, stamp, journal);
        }
    }
}

fn check_pairs(spec: &str, stamp: bool, journal: bool) {
    let pairs = 10_000;
    let (n, refills, bytes_read) = allocations_per_pair(spec, stamp, pairs, journal);
    // The row allocates nothing; the journal's queue (tokio's mpsc) holds
    // its entries in blocks of 32 slots, and makes a new block when it
    // cannot reuse one the writer has emptied: at most one per 32 rows.
    let queue_blocks = if journal { pairs / 32 } else { 0 };
    assert!(
        n <= queue_blocks,
        "{spec} (journal {journal}): {n} heap allocations over {pairs} request/response pairs"
    );
    // The read buffer is the one thing renewed, as a reader renews it:
    // at most once per buffer's worth of bytes read (plus its header),
    // never per message.
    let buffers = bytes_read.div_ceil(READ_BUFFER);
    assert!(
        refills <= 2 * buffers,
        "{spec}: {refills} read-buffer allocations for {buffers} buffers' worth of bytes"
    );
}
