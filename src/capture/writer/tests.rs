//! Tests of `writer`.

use std::time::SystemTime;

use super::*;
use crate::capture::read;
use crate::capture::tap::Staged;
use crate::iso8583::samples;
use bytes::{Bytes, BytesMut};

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "isoswitch-writer-{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn recorder(dir: &std::path::Path, max_file_bytes: u64, max_files: usize) -> Recorder {
    let spec = Arc::new(Spec::builtin("iso87ascii").unwrap());
    let cfg = WriterConfig {
        rotation: Rotation {
            directory: dir.to_path_buf(),
            prefix: "isoswitch-t".into(),
            max_file_bytes,
            max_files,
            max_total_bytes: u64::MAX,
        },
        clear: false,
    };
    Recorder::new(spec, &cfg).unwrap()
}

fn framed(spec: &Spec, stan: u32) -> Vec<u8> {
    let mut d = samples::purchase(spec);
    d.set_text(11, format!("{stan:06}"));
    let p = spec.encode(&d).unwrap();
    let mut out = BytesMut::new();
    spec.framing().prefix.encode(p.len(), &mut out).unwrap();
    out.extend_from_slice(&p);
    out.to_vec()
}

fn open(r: &mut Recorder, conn: u64) {
    r.record(Event::Open {
        conn,
        client: "127.0.0.1:40000".parse().unwrap(),
        server: "127.0.0.1:5000".parse().unwrap(),
        at: SystemTime::now(),
        staged: None,
    })
    .unwrap();
}

fn data(r: &mut Recorder, conn: u64, offset: u64, bytes: &[u8]) {
    r.record(Event::Data {
        conn,
        from_client: true,
        offset,
        bytes: Bytes::copy_from_slice(bytes),
        at: SystemTime::now(),
    })
    .unwrap();
}

#[test]
fn rotation_keeps_the_newest_files_each_reassembling_alone() {
    let dir = temp_dir("rotate");
    let spec = Spec::builtin("iso87ascii").unwrap();
    let mut r = recorder(&dir, 4096, 2);
    open(&mut r, 1);
    let mut offset = 0;
    for stan in 0..100 {
        let f = framed(&spec, stan);
        data(&mut r, 1, offset, &f);
        offset += f.len() as u64;
    }
    r.finish().unwrap();
    let files = super::super::file::list(&dir, "isoswitch-t").unwrap();
    assert_eq!(files.len(), 2, "the oldest were deleted");
    for f in &files {
        let p = read::read_file(f).unwrap();
        let c = read::connections(&p.segments);
        assert_eq!(c.len(), 1);
        assert!(c[0].saw_syn, "each file starts with a handshake");
        assert!(c[0].to_server.gaps.is_empty(), "{:?}", c[0].to_server.gaps);
        let (frames, cut) = read::frames(&spec, &c[0].to_server);
        assert!(cut.is_none() && !frames.is_empty());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dropped_event_leaves_a_gap_and_blanks_what_follows() {
    let dir = temp_dir("gap");
    let spec = Spec::builtin("iso87ascii").unwrap();
    let mut r = recorder(&dir, 1 << 20, 4);
    open(&mut r, 7);
    let a = framed(&spec, 1);
    let b = framed(&spec, 2);
    data(&mut r, 7, 0, &a);
    // The event with `b` was dropped; the next one arrives.
    data(&mut r, 7, (a.len() + b.len()) as u64, &a);
    r.finish().unwrap();
    let files = super::super::file::list(&dir, "isoswitch-t").unwrap();
    let p = read::read_file(&files[0]).unwrap();
    let c = read::connections(&p.segments);
    let s = &c[0].to_server;
    assert_eq!(s.bytes.len(), a.len(), "reassembly stops at the gap");
    assert_eq!(s.gaps.len(), 1);
    let after: Vec<u8> = p
        .segments
        .iter()
        .rev()
        .find(|s| !s.payload.is_empty())
        .unwrap()
        .payload
        .clone();
    assert!(after.iter().all(|&b| b == 0), "after a gap: blanked");
    let _ = std::fs::remove_dir_all(&dir);
}

const PAN: &[u8] = b"6222021234567890123";

fn ms(n: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(n)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_staged_batch_keeps_each_reads_packet_and_time_in_order_and_the_close_last() {
    let dir = temp_dir("batch");
    let spec = Spec::builtin("iso87ascii").unwrap();
    let mut r = recorder(&dir, 1 << 20, 4);
    let (a, b, answer) = (framed(&spec, 1), framed(&spec, 2), framed(&spec, 3));
    assert!(contains(&a, PAN), "the sample carries the PAN");
    let staged = Arc::new(Staged::new(64));
    r.record(Event::Open {
        conn: 3,
        client: "127.0.0.1:40000".parse().unwrap(),
        server: "127.0.0.1:5000".parse().unwrap(),
        at: ms(0),
        staged: Some(Arc::clone(&staged)),
    })
    .unwrap();
    // A request split over two reads, an answer in between (by time),
    // a second request whole.
    staged.push(true, 0, &a[..10], ms(1));
    staged.push(true, 10, &a[10..], ms(3));
    staged.push(false, 0, &answer, ms(2));
    staged.push(true, a.len() as u64, &b, ms(4));
    r.record(Event::Ready { conn: 3 }).unwrap();
    // Staged after the last `Ready`: the close takes it before the FINs.
    staged.push(false, answer.len() as u64, &answer, ms(5));
    r.record(Event::Close { conn: 3, at: ms(6) }).unwrap();
    assert_eq!(r.open_connections(), 0);
    r.finish().unwrap();

    let files = super::super::file::list(&dir, "isoswitch-t").unwrap();
    let p = read::read_file(&files[0]).unwrap();
    let data: Vec<(u64, usize, bool)> = p
        .segments
        .iter()
        .filter(|s| !s.payload.is_empty())
        .map(|s| {
            (
                s.at.as_millis() as u64,
                s.payload.len(),
                s.src.port() == 40000,
            )
        })
        .collect();
    // The first read of the split request waits for the rest of its
    // frame (masking needs the whole message), so it follows the answer
    // in the file, with its own time.
    assert_eq!(
        data,
        [
            (2, answer.len(), false),
            (1, 10, true),
            (3, a.len() - 10, true),
            (4, b.len(), true),
            (5, answer.len(), false),
        ],
        "one packet per read or write, each with its own time"
    );
    let last_data = p
        .segments
        .iter()
        .rposition(|s| !s.payload.is_empty())
        .unwrap();
    let first_fin = p.segments.iter().position(|s| s.fin).unwrap();
    assert!(
        last_data < first_fin,
        "the close comes after every staged byte"
    );
    let c = read::connections(&p.segments);
    let (frames, cut) = read::frames(&spec, &c[0].to_server);
    assert!(cut.is_none());
    assert_eq!(frames.len(), 2);
    assert_eq!(c[0].to_server.bytes.len(), a.len() + b.len());
    let all: Vec<u8> = p.segments.iter().flat_map(|s| s.payload.clone()).collect();
    assert!(
        !contains(&all, PAN),
        "masked on both paths (split and whole)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_read_ending_inside_a_frame_writes_the_whole_frames_and_keeps_the_rest() {
    let dir = temp_dir("partial");
    let spec = Spec::builtin("iso87ascii").unwrap();
    let mut r = recorder(&dir, 1 << 20, 4);
    open(&mut r, 4);
    let (a, b) = (framed(&spec, 1), framed(&spec, 2));
    let both: Vec<u8> = a.iter().chain(&b).copied().collect();
    let cut = a.len() + 7;
    data(&mut r, 4, 0, &both[..cut]);
    data(&mut r, 4, cut as u64, &both[cut..]);
    r.finish().unwrap();
    let files = super::super::file::list(&dir, "isoswitch-t").unwrap();
    let p = read::read_file(&files[0]).unwrap();
    let sizes: Vec<usize> = p
        .segments
        .iter()
        .filter(|s| !s.payload.is_empty())
        .map(|s| s.payload.len())
        .collect();
    assert_eq!(sizes, [a.len(), 7, b.len() - 7]);
    let c = read::connections(&p.segments);
    let (frames, cut) = read::frames(&spec, &c[0].to_server);
    assert!(cut.is_none() && frames.len() == 2);
    assert!(!contains(&c[0].to_server.bytes, PAN));
    let _ = std::fs::remove_dir_all(&dir);
}
