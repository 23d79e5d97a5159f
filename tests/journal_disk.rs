//! The journal's disk guard with real processes on a filesystem of a few
//! MB that the test mounts (a tmpfs; root only: it fails, never skips,
//! where it cannot mount): filled under traffic, the journal pauses while
//! every request is still answered and the reversals the switch owes are
//! still stored and delivered; space back, the journal resumes by itself
//! (docs/journal.md, "The disk").

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[path = "common/owed.rs"]
mod owed;
#[path = "common/procs.rs"]
mod procs;
use owed::*;
use procs::*;

const MIB: u64 = 1 << 20;

/// A tmpfs of `size` mounted for the test; unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(name: &str, size: &str) -> Tmpfs {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-{}.mnt", std::process::id()));
        let _ = Command::new("umount").arg(&dir).output();
        std::fs::create_dir_all(&dir).expect("mount point");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Tmpfs(dir),
            Ok(o) => panic!(
                "this test mounts a {size} tmpfs at {} to fill it, and needs root (CAP_SYS_ADMIN) for that: mount said {}",
                dir.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => panic!("this test mounts a tmpfs and needs the mount command: {e}"),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn avail(path: &Path) -> u64 {
    let s = rustix::fs::statvfs(path).expect("statvfs");
    s.f_bavail * s.f_frsize
}

/// Exchange rows in the journal, as `isoswitch journal` reads them.
fn journal_rows(data: &str) -> usize {
    let out = Command::new(BIN)
        .args(["journal", "--data-dir", data, "--json", "--limit", "100000"])
        .output()
        .expect("isoswitch journal runs");
    assert!(
        out.status.success(),
        "journal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .expect("journal JSON")
        .as_array()
        .map_or(0, Vec::len)
}

async fn gauge(admin: std::net::SocketAddr, name: &str) -> f64 {
    metric_sum(&metrics(admin, &[name]).await, name, &[])
}

async fn wait_gauge(admin: std::net::SocketAddr, name: &str, value: f64) {
    let what = format!("{name} at {value}");
    metrics_hold(admin, &[name], &what, Duration::from_secs(60), |text| {
        metric_sum(text, name, &[]) == value
    })
    .await;
}

/// Waits until the journal holds `rows` rows; fails naming them after 60 s.
async fn journaled(data: &str, rows: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = journal_rows(data);
        if now >= rows {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} rows journaled, never {rows}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every late approval so far has landed, its reversal is a
/// row of the store, and the journal's queue is empty: what a phase of
/// this case leaves behind, as events instead of the nodes' --late-by.
async fn late_ones_landed(admin: std::net::SocketAddr, data: &str) {
    late_answers_in(admin).await;
    let name = "isoswitch_late_approvals";
    let reversed = metric_sum(
        &metrics(admin, &[name]).await,
        name,
        &["action=\"reversed\""],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stored = saf_rows(data)
            .iter()
            .filter(|r| r.kind == "reversal")
            .count();
        if stored as f64 >= reversed {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{stored} reversals stored, {reversed} late approvals reversed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_gauge(admin, "isoswitch_journal_queue_depth", 0.0).await;
}

/// Traffic with late approvals (the switch owes a reversal for each): a
/// quarter of the filesystem kept free (`min_free = "40%"` of 16 MB), then
/// a file fills it to 3 MB free. The journal pauses; a NAC's requests are
/// all answered, none journaled (counted in isoswitch_journal_paused_total);
/// the reversals of the late approvals are stored and delivered. The file
/// deleted, the journal resumes and journals the next NAC's exchanges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_pauses_the_journal_not_what_the_switch_owes() {
    within(Duration::from_secs(150), async {
        let disk = Tmpfs::mount("journal-disk", "16m");
        let data = disk.0.join("data").to_string_lossy().into_owned();
        let late = ["--late-share", "0.1", "--late-by", "1s"];
        let addrs = [free_addr(), free_addr()];
        let mut nodes = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            nodes.push(node("cup-pos", &format!("0{}", i + 1), *a, "2..10ms", &late).await);
        }
        let listen = free_addr();
        let (admin, admin_toml) = admin_toml("journal-disk");
        let toml = format!(
            "[journal]\nmin_free = \"40%\"\n{admin_toml}{}",
            pos_toml(listen, &addrs, "300ms", "")
        );
        let _switch = switch("journal-disk", &toml, &data, listen).await;

        // Each NAC its own terminals (--nac-id): the nodes' books would
        // take a repeated terminal and STAN for the same original.
        // 1. Space enough: journaled.
        let first = nac(
            "journal-disk-nac1",
            listen,
            50,
            ("2s", "5s"),
            &["--nac-id", "1"],
        )
        .report()
        .await;
        assert_exactly_once(&first);
        let sent1 = n(&first, "sent") as usize;
        journaled(&data, sent1).await;
        // The late approvals of this phase land, and their reversals.
        late_ones_landed(admin, &data).await;
        assert_eq!(gauge(admin, "isoswitch_journal_disk_paused").await, 0.0);
        let rows1 = journal_rows(&data);
        let reversals1 = saf_rows(&data)
            .iter()
            .filter(|r| r.kind == "reversal")
            .count();

        // 2. Fill the filesystem to 3 MB free: under min_free (6.4 MB).
        let filler = disk.0.join("filler");
        let size = avail(&disk.0).saturating_sub(3 * MIB);
        let file = std::fs::File::create(&filler).expect("filler");
        // tmpfs allocates on write: write it, not a sparse length.
        {
            use std::io::Write;
            let mut w = std::io::BufWriter::new(&file);
            let chunk = vec![0xA5u8; 64 * 1024];
            let mut left = size;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                w.write_all(&chunk[..n]).expect("fill");
                left -= n as u64;
            }
            w.flush().expect("fill");
        }
        // Closed: an open file keeps its space after it is deleted.
        drop(file);
        eprintln!("filled: {} bytes free", avail(&disk.0));
        wait_gauge(admin, "isoswitch_journal_disk_paused", 1.0).await;

        let second = nac(
            "journal-disk-nac2",
            listen,
            50,
            ("2s", "5s"),
            &["--nac-id", "2"],
        )
        .report()
        .await;
        assert_exactly_once(&second);
        let sent2 = n(&second, "sent") as usize;
        // Every one of them reached the writer and was counted, not written.
        wait_metric_sum(admin, "isoswitch_journal_paused", &[], sent2 as f64).await;
        // And so did this phase's late approvals.
        late_ones_landed(admin, &data).await;
        assert_eq!(journal_rows(&data), rows1, "nothing journaled while paused");
        // What the switch owes was stored while the journal was paused...
        let owed = saf_rows(&data)
            .iter()
            .filter(|r| r.kind == "reversal")
            .count();
        assert!(
            owed > reversals1,
            "reversals stored while the journal was paused: {reversals1} before, {owed} now"
        );
        // ...and delivered.
        store_settles(&data, Duration::from_millis(300), |rows| {
            rows.iter()
                .filter(|r| r.kind == "reversal")
                .all(|r| r.state == "delivered")
        })
        .await;

        // 3. Space back: the journal resumes by itself.
        std::fs::remove_file(&filler).expect("remove the filler");
        wait_gauge(admin, "isoswitch_journal_disk_paused", 0.0).await;
        let third = nac(
            "journal-disk-nac3",
            listen,
            50,
            ("1s", "5s"),
            &["--nac-id", "3"],
        )
        .report()
        .await;
        assert_exactly_once(&third);
        let sent3 = n(&third, "sent") as usize;
        journaled(&data, rows1 + sent3).await;

        // Every late approval was reversed, the paused phase's too: the
        // last ones' reversals delivered before the nodes close their books.
        late_ones_landed(admin, &data).await;
        store_settles(&data, Duration::from_millis(500), |rows| {
            rows.iter()
                .filter(|r| r.kind == "reversal")
                .all(|r| r.state == "delivered")
        })
        .await;
        let mut late_total = 0;
        for host in nodes {
            late_total += assert_reversed_exactly("node", &books(host).await);
        }
        let rows = store_settles(&data, Duration::from_millis(300), |rows| {
            count(rows, "reversal", "delivered") as u64 >= late_total
        })
        .await;
        assert_eq!(count(&rows, "reversal", "delivered") as u64, late_total);
    })
    .await;
}
