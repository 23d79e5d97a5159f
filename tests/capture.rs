//! Capture from the running switch: real sockets, real simulated nodes, the
//! capture files read back with isoswitch's own reader.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use isoswitch::capture::read;
use isoswitch::iso8583::{Spec, Value, samples};
use isoswitch::wire::Frame;

const TEST_TIMEOUT: Duration = Duration::from_secs(30);
const PAN: &str = "6222021234567890123";

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "isoswitch-capture-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn capture_toml(dir: &Path, extra: &str) -> String {
    format!(
        "[service.capture]\ndirectory = \"{}\"\n{extra}\n",
        dir.display()
    )
}

/// A purchase from terminal `tid` with STAN `stan`.
fn purchase(spec: &Spec, tid: &str, stan: u32) -> Vec<u8> {
    let mut d = samples::purchase(spec);
    d.set_text(11, format!("{stan:06}"));
    d.set_text(41, tid);
    let payload = spec.encode(&d).unwrap();
    RawClient::frame(spec, &payload)
}

fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for f in std::fs::read_dir(dir).unwrap() {
        out.extend(std::fs::read(f.unwrap().path()).unwrap());
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Sends `n` purchases over one client link, the first one split in two
/// writes with a pause, then a keep-alive; returns the answers.
async fn traffic(front: std::net::SocketAddr, spec: &Spec, n: u32) -> usize {
    let mut client = RawClient::connect(front, spec).await;
    let first = purchase(spec, "10000001", 1);
    client.send_raw(&first[..20]).await;
    // The scenario, not a wait: a frame split across two writes.
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.send_raw(&first[20..]).await;
    for i in 2..=n {
        let tid = format!("1000000{}", i % 3 + 1);
        client.send_raw(&purchase(spec, &tid, i)).await;
    }
    client.send_raw(&[0, 0]).await; // a keep-alive (binary2 prefix)
    let mut answered = 0;
    for _ in 0..n {
        if client.recv().await.is_some() {
            answered += 1;
        }
    }
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_capture_has_every_message_once_and_no_pan() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = temp_dir("masked");
        let spec = spec("cup-pos");
        let (_nodes, switch) = Rig::on("cup-pos")
            .nodes(2)
            .service(&capture_toml(&dir, ""))
            .back("connections_per_node = 1")
            .start()
            .await;
        wait_connected(service(&switch), 1).await;
        let client_port = front(&switch).port();
        let answered = traffic(front(&switch), &spec, 12).await;
        assert_eq!(answered, 12);
        let dropped = service(&switch)
            .view()
            .links
            .capture
            .as_ref()
            .expect("capture on")
            .dropped();
        switch.stop().await;
        assert_eq!(dropped, 0);

        let bytes = all_bytes(&dir);
        assert!(!bytes.is_empty(), "a capture was written");
        assert!(
            !contains(&bytes, PAN.as_bytes()),
            "PAN in clear (ASCII) in the capture"
        );
        assert!(
            !contains(&bytes, &[0x62, 0x22, 0x02, 0x12, 0x34, 0x56, 0x78, 0x90]),
            "PAN in clear (BCD) in the capture"
        );
        assert!(
            !contains(&bytes, b"\x12\x34\x56\x78\x9A\xBC\xDE\xF0"),
            "PIN block in the capture"
        );

        let files = std::fs::read_dir(&dir)
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect::<Vec<_>>();
        assert_eq!(files.len(), 1);
        let packets = read::read_file(&files[0]).unwrap();
        let conns = read::connections(&packets.segments);
        let clients: Vec<_> = conns
            .iter()
            .filter(|c| c.server.port() == client_port)
            .collect();
        assert_eq!(clients.len(), 1, "one client connection");
        assert!(clients[0].saw_syn);
        let (to_switch, cut) = read::frames(&spec, &clients[0].to_server);
        assert!(cut.is_none(), "{cut:?}");
        let messages: Vec<_> = to_switch
            .iter()
            .filter(|f| matches!(f.frame, Frame::Message(_)))
            .collect();
        assert_eq!(messages.len(), 12, "every request once");
        assert_eq!(to_switch.len(), 13, "and the keep-alive");
        // The split frame kept its two segments.
        let client_segments = packets
            .segments
            .iter()
            .filter(|s| s.dst.port() == client_port && !s.payload.is_empty())
            .count();
        assert!(client_segments >= 2);
        let first_segment = packets
            .segments
            .iter()
            .find(|s| s.dst.port() == client_port && !s.payload.is_empty())
            .unwrap();
        assert_eq!(
            first_segment.payload.len(),
            20,
            "the first write of the split frame is its own segment"
        );
        // Masked, lengths kept: the PAN keeps first 6 / last 4.
        let Frame::Message(p) = &messages[0].frame else {
            unreachable!()
        };
        let d = spec.decode(p).unwrap();
        assert_eq!(
            d.get(2).and_then(Value::as_text),
            Some("6222020000000000123")
        );
        let (answers, _) = read::frames(&spec, &clients[0].to_client);
        assert_eq!(answers.len(), 12, "every answer once");
        // Node side: every request and answer once, across the node connections.
        let node_conns: Vec<_> = conns
            .iter()
            .filter(|c| c.server.port() != client_port)
            .collect();
        let count = |f: fn(&read::Connection) -> &read::Stream| -> usize {
            node_conns
                .iter()
                .map(|c| {
                    read::frames(&spec, f(c))
                        .0
                        .iter()
                        .filter(|fr| match &fr.frame {
                            Frame::Message(p) => spec.layout(p).is_ok_and(|l| {
                                l.mti.as_str() == "0200" || l.mti.as_str() == "0210"
                            }),
                            _ => false,
                        })
                        .count()
                })
                .sum()
        };
        assert_eq!(count(|c| &c.to_server), 12, "requests to the nodes");
        assert_eq!(count(|c| &c.to_client), 12, "answers from the nodes");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test timed out");
}

/// Capture files hold client addresses, F14 and the like in clear (and all
/// card data with `clear = true`): the directory the switch creates is the
/// owner's alone (0700), and so is every file (0600), whatever the umask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_files_and_their_directory_are_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = temp_dir("modes").join("new");
        let spec = spec("cup-pos");
        let (_nodes, switch) = Rig::on("cup-pos")
            .service(&capture_toml(&dir, "clear = true"))
            .back("connections_per_node = 1")
            .start()
            .await;
        wait_connected(service(&switch), 1).await;
        assert_eq!(traffic(front(&switch), &spec, 3).await, 3);
        switch.stop().await;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "capture directory");
        let files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect();
        assert!(!files.is_empty(), "a capture was written");
        for f in &files {
            assert_eq!(mode(f), 0o600, "{}", f.display());
        }
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_capture_needs_the_flag_and_keeps_the_pan() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = temp_dir("clear");
        let spec = spec("cup-pos");
        let (_nodes, switch) = Rig::on("cup-pos")
            .service(&capture_toml(&dir, "clear = true"))
            .back("connections_per_node = 1")
            .start()
            .await;
        wait_connected(service(&switch), 1).await;
        assert_eq!(traffic(front(&switch), &spec, 2).await, 2);
        switch.stop().await;
        let bytes = all_bytes(&dir);
        assert!(
            contains(&bytes, PAN.as_bytes()) || contains(&bytes, &[0x62, 0x22, 0x02, 0x12, 0x34]),
            "clear capture keeps the PAN"
        );
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_capture_queue_drops_and_counts_but_every_request_is_answered() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = temp_dir("full");
        let spec = spec("cup-pos");
        let (_nodes, switch) = Rig::on("cup-pos")
            .service(&capture_toml(&dir, "queue = 1"))
            .back("connections_per_node = 1")
            .start()
            .await;
        wait_connected(service(&switch), 1).await;
        // Many small reads and writes against a queue of one event.
        let mut answered = 0;
        for _ in 0..5 {
            answered += traffic(front(&switch), &spec, 40).await;
        }
        assert_eq!(answered, 200, "capture never holds the message path");
        let dropped = service(&switch)
            .view()
            .links
            .capture
            .as_ref()
            .expect("capture on")
            .dropped();
        switch.stop().await;
        assert!(dropped > 0, "drops are counted");
        // What was written still reads (gaps and all) and holds no PAN.
        let bytes = all_bytes(&dir);
        assert!(!contains(&bytes, PAN.as_bytes()));
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test timed out");
}

/// `decode --pcap` on a tcpdump capture (clear test data): the spec guessed,
/// every message once with its connection and direction, the PAN masked
/// unless --reveal.
#[test]
fn decode_pcap_reads_a_tcpdump_capture_and_masks_unless_revealed() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/captures/pos-tcpdump.pcap");
    let run = |reveal: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"));
        cmd.args(["decode", "--pcap"]).arg(&file).arg("--json");
        if reveal {
            cmd.arg("--reveal");
        }
        cmd.output().unwrap()
    };
    let out = run(false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spec guessed: cup-pos"), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 48);
    let requests = lines
        .iter()
        .filter(|m| m["direction"] == "client->server")
        .count();
    assert_eq!(requests, 24);
    assert!(
        lines
            .iter()
            .all(|m| m["conn"].is_u64() && m["time"].is_string())
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains(PAN), "masked by default");
    let revealed = String::from_utf8_lossy(&run(true).stdout).to_string();
    assert!(revealed.contains(PAN), "--reveal shows the PAN");
}

/// A capture whose writer was stopped mid-write (its last record cut short)
/// is read up to the cut, with a note: it used to fail as a whole, so
/// neither `decode --pcap` nor `replay` read any of it.
#[test]
fn decode_pcap_reads_a_capture_cut_short_up_to_the_cut() {
    let whole = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/captures/pos-tcpdump.pcap"),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("isoswitch-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cut.pcap");
    std::fs::write(&file, &whole[..whole.len() - 3]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_isoswitch"))
        .args(["decode", "--pcap"])
        .arg(&file)
        .arg("--json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("ends part-way into the record after packet 85"),
        "{stderr}"
    );
    assert!(stderr.contains("85 packets, 2 connections"), "{stderr}");
    // The record cut off carried no message: all 48 are still there.
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 48);
    let _ = std::fs::remove_dir_all(&dir);
}
