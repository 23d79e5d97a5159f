//! System calls per message: `strace -c -f -p PID` on a proxy while the load
//! runs, its summary table read back and divided by the messages answered;
//! and the same counted in the kernel by `perf stat` on the syscall
//! tracepoints, which does not stop the process at every call as strace does.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::procs::{Sidecar, TempFile};

/// Calls per system call name, from `strace -c`'s summary, largest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts(pub(crate) Vec<(String, u64)>);

impl Counts {
    /// Every call: perf's own count (`all`) when there is one, else the sum.
    pub(crate) fn total(&self) -> u64 {
        match self.0.iter().find(|(n, _)| n == "all") {
            Some((_, all)) => *all,
            None => self.0.iter().map(|(_, n)| n).sum(),
        }
    }

    pub(crate) fn get(&self, name: &str) -> u64 {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, c)| *c)
    }
}

/// Reads `strace -c`'s table:
///
/// ```text
/// % time     seconds  usecs/call     calls    errors syscall
/// ------ ----------- ----------- --------- --------- ----------------
///  45.10    0.310000          12     25000           sendto
/// ...
/// 100.00    0.687000           8     80000        12 total
/// ```
///
/// The errors column may be empty, so the calls are the fourth column and the
/// name the last; the `total` line is left out (it is the sum).
pub(crate) fn parse_summary(text: &str) -> Counts {
    let mut counts: Vec<(String, u64)> = text
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 5 || cols[0].parse::<f64>().is_err() {
                return None;
            }
            let name = *cols.last()?;
            let calls = cols[3].parse::<u64>().ok()?;
            (name != "total").then(|| (name.to_string(), calls))
        })
        .collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Counts(counts)
}

pub(crate) fn available() -> bool {
    super::procs::answers("strace", &["-V"])
}

/// strace attached to every thread of a process, counting its system calls
/// until [`Tracer::finish`].
pub(crate) struct Tracer {
    strace: Sidecar,
    out: TempFile,
}

impl Tracer {
    pub(crate) async fn attach(pid: u32, label: &str) -> Result<Tracer, String> {
        let out = TempFile::write(&format!("isoswitch-bench-strace-{label}"), "txt", "")?;
        let child = Command::new("strace")
            .args(["-c", "-f", "-qq", "-o"])
            .arg(&out.path)
            .arg("-p")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start strace: {e}"))?;
        let mut tracer = Tracer {
            strace: Sidecar::new(child, "strace"),
            out,
        };
        // Attaching stops each thread once; give it time before the load.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(Some(status)) = tracer.strace.child.try_wait() {
            return Err(format!(
                "strace -p {pid} ended at once ({status}): {}",
                tracer.stderr()
            ));
        }
        Ok(tracer)
    }

    fn stderr(&mut self) -> String {
        use std::io::Read;
        let mut s = String::new();
        if let Some(e) = self.strace.child.stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s.trim().to_string()
    }

    /// Detaches (SIGINT makes strace write its summary) and reads the counts.
    pub(crate) async fn finish(mut self) -> Result<Counts, String> {
        self.strace.interrupt().await?;
        read(&self.out.path)
    }
}

/// The system calls `perf stat` counts one by one (when the kernel has their
/// tracepoint), beside `raw_syscalls:sys_enter`, every call.
const PERF_CALLS: [&str; 13] = [
    "sendto",
    "recvfrom",
    "write",
    "writev",
    "sendmsg",
    "read",
    "readv",
    "recvmsg",
    "epoll_wait",
    "epoll_pwait",
    "futex",
    "sched_yield",
    "clock_gettime",
];

pub(crate) fn perf_available() -> bool {
    super::procs::answers(
        "perf",
        &["stat", "-e", "raw_syscalls:sys_enter", "--", "true"],
    )
}

/// `perf stat` counting a process's system calls until
/// [`PerfCounter::finish`].
pub(crate) struct PerfCounter {
    perf: Sidecar,
    out: TempFile,
}

impl PerfCounter {
    pub(crate) async fn attach(pid: u32, label: &str) -> Result<PerfCounter, String> {
        let out = TempFile::write(&format!("isoswitch-bench-perf-{label}"), "csv", "")?;
        let mut events = vec!["raw_syscalls:sys_enter".to_string()];
        events.extend(
            PERF_CALLS
                .iter()
                .filter(|c| {
                    Path::new(&format!(
                        "/sys/kernel/tracing/events/syscalls/sys_enter_{c}"
                    ))
                    .exists()
                })
                .map(|c| format!("syscalls:sys_enter_{c}")),
        );
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-o"])
            .arg(&out.path)
            .arg("-e")
            .arg(events.join(","))
            .arg("-p")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start perf: {e}"))?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(PerfCounter {
            perf: Sidecar::new(child, "perf stat"),
            out,
        })
    }

    pub(crate) async fn finish(mut self) -> Result<Counts, String> {
        self.perf.interrupt().await?;
        let text = std::fs::read_to_string(&self.out.path)
            .map_err(|e| format!("{}: {e}", self.out.path.display()))?;
        let counts = parse_perf(&text);
        if counts.0.is_empty() {
            return Err(format!("perf stat counted nothing: {}", text.trim()));
        }
        Ok(counts)
    }
}

/// Reads `perf stat -x ,`: `count,unit,event,...` per line. Every call
/// (`raw_syscalls:sys_enter`) is named `all`; the others by their call.
pub(crate) fn parse_perf(text: &str) -> Counts {
    Counts(
        text.lines()
            .filter_map(|line| {
                let mut cols = line.split(',');
                let count = cols.next()?.trim().parse::<u64>().ok()?;
                let event = cols.nth(1)?.trim();
                let name = if event == "raw_syscalls:sys_enter" {
                    "all"
                } else {
                    event.strip_prefix("syscalls:sys_enter_")?
                };
                Some((name.to_string(), count))
            })
            .collect(),
    )
}

fn read(path: &Path) -> Result<Counts, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let counts = parse_summary(&text);
    if counts.0.is_empty() {
        return Err(format!("strace wrote no summary: {}", text.trim()));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 45.10    0.310000          12     25000           sendto
 30.00    0.200000           7     30000      1200 recvfrom
  5.00    0.010000           3      4000           epoll_wait
  0.00    0.000000           0         1           futex
------ ----------- ----------- --------- --------- ----------------
100.00    0.520000           8     59001      1200 total
";

    #[test]
    fn summary_reads_calls_with_or_without_errors() {
        let c = parse_summary(SAMPLE);
        assert_eq!(c.get("sendto"), 25_000);
        assert_eq!(c.get("recvfrom"), 30_000);
        assert_eq!(c.get("futex"), 1);
        assert_eq!(c.get("total"), 0);
        assert_eq!(c.total(), 59_001);
        assert_eq!(c.0[0].0, "recvfrom", "largest first");
    }

    #[test]
    fn perf_csv_reads_every_call_and_each_call() {
        let text = "# started on Thu Dec  3 07:36:46 2026\n\n\
                    148,,raw_syscalls:sys_enter,1463815,100.00,,\n\
                    3,,syscalls:sys_enter_write,1463815,100.00,,\n\
                    <not counted>,,syscalls:sys_enter_futex,0,100.00,,\n";
        let c = parse_perf(text);
        assert_eq!(c.get("all"), 148);
        assert_eq!(c.get("write"), 3);
        assert_eq!(c.get("futex"), 0);
        assert_eq!(c.0.len(), 2);
    }

    #[test]
    fn no_table_no_counts() {
        assert!(
            parse_summary("strace: attach: ptrace(PTRACE_SEIZE, 1): Operation not permitted\n")
                .0
                .is_empty()
        );
    }
}
