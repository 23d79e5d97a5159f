//! No card data at rest, end to end: the `isoswitch` binary stores what it
//! owes (an advice it acknowledged in `store-and-forward` mode, the
//! reversal of a late approval) for a card whose messages carry its PAN,
//! track 2, track 3, a PIN block and EMV data with a track 2 equivalent
//! (tag 57). While both are owed, every file of the data directory (the
//! store, its WAL, the journal, the key file) and the switch's log are
//! scanned as bytes: no PAN (ASCII or BCD, either nibble phase), no track,
//! no PIN block. Then the advice's host comes up and gets the advice with
//! its PAN, and without its track, PIN block or tag 57.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use isoswitch::iso8583::{Message, Spec, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "common/owed.rs"]
mod owed;
#[path = "common/procs.rs"]
mod procs;
mod store_support;
use owed::*;
use procs::*;

const PAN: &str = "6222021234567890123";
const TRACK2: &str = "6222021234567890123D2812101123456789";
const PIN_BLOCK: [u8; 8] = [0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE, 0xF0];

fn spec() -> Spec {
    Spec::builtin("cup-pos").expect("cup-pos")
}

/// Hex digits as bytes (two a byte; the first nibble of an odd count alone).
fn bcd(digits: &str) -> Vec<u8> {
    let nibble = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("{c}"),
    };
    digits
        .as_bytes()
        .chunks(2)
        .map(|p| (nibble(p[0]) << 4) | p.get(1).map_or(0, |&c| nibble(c)))
        .collect()
}

/// The fixture purchase as `mti` with STAN `stan`, its EMV data carrying a
/// track 2 equivalent (tag 57) too, framed (binary2).
fn message(mti: &str, stan: &str) -> Vec<u8> {
    let spec = spec();
    let hex = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/cup-pos/purchase-request.hex"
    ))
    .expect("fixture");
    let digits: String = hex
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .collect();
    let framed = bcd(&digits.to_uppercase());
    let mut d = spec.decode(&framed[2..]).expect("the fixture decodes");
    assert_eq!(d.get(2).and_then(Value::as_text), Some(PAN));
    assert_eq!(d.get(35).and_then(Value::as_text), Some(TRACK2));
    assert_eq!(d.get(52).and_then(Value::as_binary), Some(&PIN_BLOCK[..]));
    d.mti = mti.parse().expect("an MTI");
    d.set_text(11, stan);
    let mut emv = d.get(55).and_then(Value::as_binary).expect("F55").to_vec();
    emv.extend_from_slice(&[0x57, 0x12]);
    emv.extend_from_slice(&bcd(TRACK2));
    d.set_binary(55, emv);
    let payload = spec.encode(&d).expect("encodes");
    let mut out = u16::try_from(payload.len())
        .expect("short")
        .to_be_bytes()
        .to_vec();
    out.extend_from_slice(&payload);
    out
}

async fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await?;
    let mut payload = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut payload).await?;
    Ok(payload)
}

/// Sends one framed message and reads the answer's MTI and F39.
async fn exchange(to: SocketAddr, framed: &[u8]) -> (String, String) {
    let mut s = TcpStream::connect(to).await.expect("connect");
    s.write_all(framed).await.expect("write");
    let answer = read_frame(&mut s).await.expect("an answer");
    let spec = spec();
    let msg = Message::parse(&spec, Bytes::from(answer)).expect("parses");
    let f39 = msg
        .field(39)
        .ok()
        .flatten()
        .map(|f| f.logical().map(char::from).collect())
        .unwrap_or_default();
    (msg.mti().as_str().to_string(), f39)
}

/// What must never be at rest: the PAN and the track data in ASCII and in
/// BCD in both nibble phases, the PIN block in binary and as hex text.
fn needles() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("PAN ascii".to_string(), PAN.as_bytes().to_vec()),
        ("track 2 ascii".into(), TRACK2.as_bytes().to_vec()),
        ("PIN block".into(), PIN_BLOCK.to_vec()),
        ("PIN block hex".into(), b"123456789ABCDEF0".to_vec()),
    ];
    for (what, digits) in [("PAN", &PAN[..16]), ("track 2 tail", &TRACK2[20..])] {
        out.push((format!("{what} bcd"), bcd(&digits[..14])));
        out.push((format!("{what} bcd, odd phase"), bcd(&digits[1..15])));
    }
    out
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn assert_nothing_at_rest(files: &[PathBuf]) {
    let needles = needles();
    for f in files {
        let bytes = std::fs::read(f).unwrap_or_default();
        for (what, n) in &needles {
            assert!(
                !bytes.windows(n.len()).any(|w| w == &n[..]),
                "{what} in {} ({} bytes)",
                f.display(),
                bytes.len()
            );
        }
    }
}

/// What the advice's host saw of each advice: F2, and whether F35, F36,
/// F52 or a tag 57 came with it.
#[derive(Debug, Default)]
struct Seen {
    pans: Vec<String>,
    sad: Vec<String>,
}

/// The advice's host: answers every request 00 with the simulators'
/// builder, recording what each advice carried.
async fn recording_host(at: SocketAddr, seen: Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind(at).await.expect("bind the host");
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            let spec = spec();
            while let Ok(payload) = read_frame(&mut s).await {
                let Ok(msg) = Message::parse(&spec, Bytes::from(payload)) else {
                    continue;
                };
                if msg.mti().class() == 2 && msg.mti().function() == 2 {
                    let mut seen = seen.lock().expect("seen");
                    let text = |id| -> Option<String> {
                        Some(msg.field(id).ok()??.logical().map(char::from).collect())
                    };
                    seen.pans.push(text(2).unwrap_or_default());
                    for id in [35, 36, 45, 52] {
                        if text(id).is_some() {
                            seen.sad.push(format!("F{id}"));
                        }
                    }
                    let tag57 = [&[0x57, 0x12][..], &bcd(TRACK2)].concat();
                    if let Ok(Some(emv)) = msg.field(55)
                        && emv.data().windows(tag57.len()).any(|w| w == &tag57[..])
                    {
                        seen.sad.push("tag 57".into());
                    }
                }
                let Ok(answer) = isoswitch::sim::answer::answer(&spec, &msg, "00") else {
                    continue;
                };
                let mut framed = u16::try_from(answer.len())
                    .expect("short")
                    .to_be_bytes()
                    .to_vec();
                framed.extend_from_slice(&answer);
                if s.write_all(&framed).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_switch_owes_is_kept_without_card_data_and_delivered_with_its_pan() {
    within(Duration::from_secs(120), async {
        // The late service's host approves every purchase 1 s late and
        // never answers a reversal: its reversal stays owed.
        let late_node = free_addr();
        let _late = node(
            "cup-pos",
            "01",
            late_node,
            "0ms",
            &["--late-share", "1", "--late-by", "1s", "--ignore-reversals", "1000"],
        )
        .await;
        // The advice's host is down until the scan is done.
        let advice_host = free_addr();
        let (late, advices) = (free_addr(), free_addr());
        let data = data_dir("at-rest-switch");
        let toml = format!(
            "[journal]\nenabled = true\n\
             [store.saf]\nretry = \"300ms\"\nretry_max = \"300ms\"\n\
             [[service]]\nname = \"late\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{late}\"\n\
             [service.back]\nconnections_per_node = 1\n\
             [service.timeouts]\nrequest = \"500ms\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"{late_node}\"\n\
             [[service]]\nname = \"advices\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{advices}\"\n\
             [service.back]\nconnections_per_node = 1\nreconnect_min = \"50ms\"\nreconnect_max = \"200ms\"\n\
             [service.integrity]\nadvices = \"store-and-forward\"\n\
             [[service.back.node]]\nid = \"02\"\naddress = \"{advice_host}\"\n"
        );
        let switch = switch("at-rest-switch", &toml, &data, late).await;
        wait_listening(advices).await;
        // The purchase: the switch declines it at 500 ms (68); the host's
        // approval at 1 s is reversed, and the reversal stays owed.
        assert_eq!(exchange(late, &message("0200", "000101")).await, ("0210".into(), "68".into()));
        // The advice: stored, then acknowledged by the switch.
        assert_eq!(exchange(advices, &message("0220", "000102")).await, ("0230".into(), "00".into()));
        store_settles(&data, Duration::from_millis(500), |rows| {
            count(rows, "reversal", "pending") == 1 && count(rows, "advice", "pending") == 1
        })
        .await;
        let mut files = Vec::new();
        files_under(Path::new(&data), &mut files);
        assert!(files.iter().any(|f| f.ends_with("isoswitch.db")), "{files:?}");
        assert!(files.iter().any(|f| f.ends_with("store.key")), "{files:?}");
        files.push(switch.log.clone());
        eprintln!("scanned: {files:?}");
        assert_nothing_at_rest(&files);

        // The host comes up: the advice reaches it with its PAN only.
        let seen = Arc::new(Mutex::new(Seen::default()));
        let host = tokio::spawn(recording_host(advice_host, Arc::clone(&seen)));
        store_settles(&data, Duration::from_millis(500), |rows| {
            count(rows, "advice", "delivered") == 1
        })
        .await;
        host.abort();
        let seen = seen.lock().expect("seen");
        assert!(!seen.pans.is_empty(), "{seen:?}");
        assert!(seen.pans.iter().all(|p| p == PAN), "{seen:?}");
        assert!(seen.sad.is_empty(), "the host got {:?}", seen.sad);
        // Still nothing at rest once delivered.
        let mut files = Vec::new();
        files_under(Path::new(&data), &mut files);
        files.push(switch.log.clone());
        assert_nothing_at_rest(&files);
    })
    .await;
}

/// The same with the store in PostgreSQL (over TLS, as the tests' server
/// only takes): the data directory, the log, and every row of the tables
/// the store writes (`saf`, `journal`, `admin_log`, as PostgreSQL's binary
/// COPY gives them: bytea columns as their raw bytes) hold no PAN, track or
/// PIN block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_at_rest_in_postgresql_either() {
    within(Duration::from_secs(120), async {
        let server = tokio::task::spawn_blocking(store_support::pg::PgServer::shared)
            .await
            .expect("start PostgreSQL");
        let url = server.fresh_db("at_rest").await;
        let key = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("at-rest-pg-{}.key", std::process::id()));
        let _ = std::fs::remove_file(&key);
        isoswitch::store::seal::Keyring::create(&key).expect("a key file");
        let late_node = free_addr();
        let _late = node(
            "cup-pos",
            "01",
            late_node,
            "0ms",
            &[
                "--late-share",
                "1",
                "--late-by",
                "1s",
                "--ignore-reversals",
                "1000",
            ],
        )
        .await;
        let (late, advices) = (free_addr(), free_addr());
        let data = data_dir("at-rest-pg-switch");
        let toml = format!(
            "[store]\nurl = \"{url}\"\nkey_file = \"{}\"\nca_file = \"{}\"\n\
             [journal]\nenabled = true\n\
             [store.saf]\nretry = \"300ms\"\nretry_max = \"300ms\"\n\
             [[service]]\nname = \"late\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{late}\"\n\
             [service.back]\nconnections_per_node = 1\n\
             [service.timeouts]\nrequest = \"500ms\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"{late_node}\"\n\
             [[service]]\nname = \"advices\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{advices}\"\n\
             [service.back]\nconnections_per_node = 1\n\
             [service.integrity]\nadvices = \"store-and-forward\"\n\
             [[service.back.node]]\nid = \"02\"\naddress = \"{}\"\n",
            key.display(),
            store_support::pg::ca_of(&url).display(),
            free_addr(),
        );
        let switch = switch("at-rest-pg-switch", &toml, &data, late).await;
        wait_listening(advices).await;
        assert_eq!(
            exchange(late, &message("0200", "000201")).await,
            ("0210".into(), "68".into())
        );
        assert_eq!(
            exchange(advices, &message("0220", "000202")).await,
            ("0230".into(), "00".into())
        );
        let db = store_support::pg::connect(&url).await;
        // Both owed, and the exchanges journaled, before the scan.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let owed: i64 = db
                .query_one("SELECT count(*) FROM saf WHERE state = 'pending'", &[])
                .await
                .expect("count saf")
                .get(0);
            let journaled: i64 = db
                .query_one("SELECT count(*) FROM journal", &[])
                .await
                .expect("count journal")
                .get(0);
            if owed == 2 && journaled >= 2 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "owed {owed}, journaled {journaled}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let dump = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("at-rest-pg-{}.dump", std::process::id()));
        let mut bytes = Vec::new();
        for table in ["saf", "journal", "admin_log"] {
            use futures_util::TryStreamExt;
            let copy = db
                .copy_out(&format!(
                    "COPY (SELECT * FROM {table}) TO STDOUT (FORMAT binary)"
                ))
                .await
                .expect("copy out");
            let chunks: Vec<Bytes> = copy.try_collect().await.expect("the table's rows");
            assert!(!chunks.is_empty(), "{table} dumped");
            for c in chunks {
                bytes.extend_from_slice(&c);
            }
        }
        // The dump holds the rows as stored: the masked PAN is there.
        let masked = format!("{}*********{}", &PAN[..6], &PAN[15..]);
        assert!(
            bytes.windows(masked.len()).any(|w| w == masked.as_bytes()),
            "no masked PAN in the tables' rows: the scan would prove nothing"
        );
        std::fs::write(&dump, &bytes).expect("write the dump");
        let mut files = vec![dump.clone(), switch.log.clone()];
        files_under(Path::new(&data), &mut files);
        eprintln!("scanned: {files:?} ({} bytes of rows)", bytes.len());
        assert_nothing_at_rest(&files);
        let _ = std::fs::remove_file(&dump);
    })
    .await;
}

/// A crash writes no core: the switch's core size limit is 0 and it is not
/// dumpable, so a SIGSEGV leaves nothing of the card data in flight on
/// disk (`--allow-core-dumps` is for debugging only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_writes_no_core() {
    within(Duration::from_secs(60), async {
        let listen = free_addr();
        let data = data_dir("no-core-switch");
        let toml = format!(
            "[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"{listen}\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"{}\"\n",
            free_addr()
        );
        let switch = switch("no-core-switch", &toml, &data, listen).await;
        let pid = switch.pid();
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
        let core = limits
            .lines()
            .find(|l| l.starts_with("Max core file size"))
            .expect("a core size line");
        assert_eq!(
            core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(),
            ["0", "0"],
            "{core}"
        );
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd");
        let cores = |dir: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.path())
                        .filter(|p| {
                            p.file_name()
                                .is_some_and(|n| n.to_string_lossy().starts_with("core"))
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let before = cores(&cwd);
        // Rust's runtime catches the first SIGSEGV (its stack-overflow
        // guard), puts the default action back and returns: a second one,
        // as a real fault repeating would be, ends the process.
        switch.signal("SEGV");
        // The first one handled: SIGSEGV no longer in the caught set
        // (SigCgt in /proc/PID/status, bit 10), or the process gone.
        let catches_segv = || {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|status| {
                    let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
                    u64::from_str_radix(mask.trim(), 16).ok()
                })
                .is_some_and(|mask| mask & (1 << (11 - 1)) != 0)
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while catches_segv() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the switch still catches SIGSEGV after the first one"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = std::process::Command::new("kill")
            .args(["-SEGV", &pid.to_string()])
            .status();
        let (status, _) = switch.finish().await;
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(11), "{status}");
        assert!(!status.core_dumped(), "{status}: a core was dumped");
        assert_eq!(cores(&cwd), before, "a core file in {}", cwd.display());
    })
    .await;
}
