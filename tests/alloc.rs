//! The routing path allocates nothing: `Message::parse` + `routing_view()` of a
//! CUPS 0200 and a POS 0200, field lookups, and the in-place patches (F37 stamp,
//! TPDU swap, fixed-field patch), counted by a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use isoswitch::iso8583::{Message, patch_fixed, samples, stamp};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Only the measuring thread counts: the test harness may allocate elsewhere.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.load(Ordering::SeqCst) - before
}

#[test]
fn counter_sees_allocations() {
    assert!(allocations(|| drop(black_box(vec![1u8; 16]))) >= 1);
}

#[test]
fn routing_path_makes_no_heap_allocation() {
    // Build everything with encode before counting.
    let (cups, cups_payload) = samples::cups_0200();
    let (pos, pos_payload) = samples::pos_0200();
    let cups_bytes = Bytes::from(cups_payload.clone());
    let pos_bytes = Bytes::from(pos_payload.clone());
    // Promote to shared storage now, so that clones inside are refcount bumps.
    let cups_again = cups_bytes.clone();
    let mut cups_buf = cups_payload.clone();
    let mut pos_buf = pos_payload.clone();
    let f11 = pos.field(11).expect("F11 defined");
    let mut wanted = isoswitch::iso8583::Bitmap::default();
    for id in [7, 11, 32, 33, 37, 41] {
        wanted.set(id);
    }

    let n = allocations(|| {
        let msg = Message::parse(&cups, cups_bytes).expect("CUPS 0200 parses");
        let view = msg.routing_view().expect("CUPS routing view");
        assert!(view.f37.is_some() && view.f11.is_some() && view.f32.is_some());
        assert!(msg.mti().is_request());
        let f41 = msg.field(41).expect("F41").expect("present");
        black_box(f41.data());

        let again = Message::parse(&cups, cups_again.clone()).expect("parses again");
        black_box(again.routing_view().expect("view"));

        let msg = Message::parse(&pos, pos_bytes).expect("POS 0200 parses");
        let pos_view = msg.routing_view().expect("POS routing view");
        assert!(pos_view.tpdu.is_some() && pos_view.f41.is_some());
        black_box(msg.mti().response());

        // F37 node stamp, in place.
        let f37 = view.f37.clone().expect("F37");
        stamp(&mut cups_buf, f37.clone(), 10, b"07").expect("stamp");
        cups.stamp_f37(&mut cups_buf, f37, 8, b"N1")
            .expect("stamp_f37");

        // TPDU swap and a fixed-field patch, in place.
        assert!(pos.swap_tpdu(&mut pos_buf));
        let r = pos_view.f11.clone().expect("F11");
        patch_fixed(&mut pos_buf, f11, r, b"000042").expect("patch F11");

        // A view over a mutable buffer (no Bytes at all).
        black_box(pos.routing_view(&pos_buf).expect("view of patched buffer"));

        // Ingress validation with the routing fields indexed, and lookups
        // through the index.
        let msg = Message::parse(&cups, cups_again.clone()).expect("parses");
        let index = msg.index(&wanted).expect("a whole message");
        black_box(msg.indexed(&index, 37).expect("F37").data());
        black_box(msg.indexed(&index, 33).expect("F33").data());
    });
    assert_eq!(n, 0, "heap allocations on the routing path");
    let f37 = cups.routing_view(&cups_buf).unwrap().f37.unwrap();
    assert_eq!(&cups_buf[f37], b"12345678N107");
}
