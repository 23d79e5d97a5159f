//! The processes of a bench run and where they run: node simulators, the
//! switch, HAProxy, each a child process, optionally pinned to CPUs with
//! `taskset`; and the CPU time a process spent, from `/proc/PID/stat`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A set of CPU numbers, as `taskset -c` and `Cpus_allowed_list` write them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CpuSet(Vec<usize>);

impl CpuSet {
    /// `0-1,4` → {0, 1, 4}.
    pub(crate) fn parse(list: &str) -> Result<CpuSet, String> {
        let mut cpus = Vec::new();
        for part in list.trim().split(',').filter(|p| !p.is_empty()) {
            let bad = || format!("`{list}`: a CPU list is like `0`, `0-3` or `0,2`");
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let lo: usize = lo.trim().parse().map_err(|_| bad())?;
            let hi: usize = hi.trim().parse().map_err(|_| bad())?;
            if hi < lo || hi - lo > 4096 {
                return Err(bad());
            }
            cpus.extend(lo..=hi);
        }
        cpus.sort_unstable();
        cpus.dedup();
        if cpus.is_empty() {
            return Err(format!("`{list}`: no CPU in the list"));
        }
        Ok(CpuSet(cpus))
    }

    /// The CPUs this process may run on (`Cpus_allowed_list` in
    /// `/proc/self/status`): a container's cpuset, not `0..nproc`.
    pub(crate) fn allowed() -> Option<CpuSet> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
        CpuSet::parse(line).ok()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Comma-separated, for `taskset -c`.
    pub(crate) fn list(&self) -> String {
        self.0
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Which CPUs run the proxy under test (the switch or HAProxy) and which run
/// the load side (load generator and node simulators).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pinning {
    pub(crate) load: CpuSet,
    pub(crate) proxy: CpuSet,
}

impl Pinning {
    /// The given lists, or the allowed CPUs split in two: the proxy gets the
    /// upper half (rounded down), the load side the rest, since it runs the
    /// load generator and every node. `None` with one CPU: nothing to split.
    pub(crate) fn choose(
        allowed: &CpuSet,
        proxy: Option<&str>,
        load: Option<&str>,
    ) -> Result<Option<Pinning>, String> {
        let given = |s: Option<&str>| s.map(CpuSet::parse).transpose();
        match (given(proxy)?, given(load)?) {
            (Some(proxy), Some(load)) => Ok(Some(Pinning { load, proxy })),
            (Some(proxy), None) => {
                let rest: Vec<usize> = allowed
                    .0
                    .iter()
                    .copied()
                    .filter(|c| !proxy.0.contains(c))
                    .collect();
                let load = if rest.is_empty() {
                    allowed.clone()
                } else {
                    CpuSet(rest)
                };
                Ok(Some(Pinning { load, proxy }))
            }
            (None, Some(_)) => Err("--load-cpus needs --proxy-cpus".into()),
            (None, None) if allowed.len() < 2 => Ok(None),
            (None, None) => {
                let split = allowed.len() - allowed.len() / 2;
                Ok(Some(Pinning {
                    load: CpuSet(allowed.0[..split].to_vec()),
                    proxy: CpuSet(allowed.0[split..].to_vec()),
                }))
            }
        }
    }
}

/// Whether `program` is installed and usable: it runs with `args` and
/// succeeds, its output thrown away.
pub(crate) fn answers(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub(crate) fn taskset_available() -> bool {
    answers("taskset", &["-V"])
}

/// A tool run beside the load (strace, perf stat, tcpdump) that writes its
/// result when interrupted. Killed if dropped while still running.
pub(crate) struct Sidecar {
    pub(crate) child: Child,
    name: &'static str,
}

impl Sidecar {
    pub(crate) fn new(child: Child, name: &'static str) -> Sidecar {
        Sidecar { child, name }
    }

    /// SIGINT (the tool writes what it has and exits), then up to 5 s for it
    /// to end; killed after that.
    pub(crate) async fn interrupt(&mut self) -> Result<(), String> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(format!("{} did not stop within 5 s of SIGINT", self.name))
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Pins this process (its threads started from now on inherit it) to `cpus`.
pub(crate) fn pin_self(cpus: &CpuSet) -> Result<(), String> {
    let status = Command::new("taskset")
        .args(["-p", "-c", &cpus.list(), &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("taskset: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("taskset -p -c {} failed: {status}", cpus.list()))
    }
}

/// `program`, under `taskset -c` when given CPUs. taskset execs the program,
/// so the child's PID is the program's.
fn command(program: &Path, cpus: Option<&CpuSet>) -> Command {
    match cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpus.list()).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// utime + stime of a process over all its threads, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (utime, stime) = parse_user_system(stat)?;
    Some(utime + stime)
}

/// utime and stime (clock ticks) from a `/proc/PID/stat` line.
fn parse_user_system(stat: &str) -> Option<(u64, u64)> {
    // Fields after the command name, which may hold spaces and parentheses.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime, stime))
}

/// What a process spent, over all its threads: CPU in user space and in
/// the kernel (clock ticks), and how often its threads were switched out
/// (voluntarily: went to sleep waiting for I/O; or preempted). Per message,
/// the switches count the wake-ups a proxy pays for, which no amount of
/// user-space work saves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub user: u64,
    pub system: u64,
    pub switches: u64,
}

impl Usage {
    /// What was spent between `self` (earlier) and `later`.
    pub(crate) fn until(self, later: Usage) -> Usage {
        Usage {
            user: later.user.saturating_sub(self.user),
            system: later.system.saturating_sub(self.system),
            switches: later.switches.saturating_sub(self.switches),
        }
    }
}

/// [`Usage`] of process `pid` now. Threads that exited are in the process's
/// CPU times but not in the switches (a proxy keeps its threads).
pub(crate) fn usage(pid: u32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (user, system) = parse_user_system(&stat)?;
    let mut switches = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
            switches += parse_switches(&status);
        }
    }
    Some(Usage {
        user,
        system,
        switches,
    })
}

/// Voluntary + involuntary context switches from a `/proc/.../status`.
fn parse_switches(status: &str) -> u64 {
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        })
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .sum()
}

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ): 100 on Linux.
pub(crate) const TICKS_PER_S: f64 = 100.0;

/// The machine's load average (1, 5, 15 minutes), as `/proc/loadavg` says.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

pub(crate) fn free_port() -> Result<SocketAddr, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map_err(|e| e.to_string())
}

/// A child killed and reaped when dropped.
pub(crate) struct Proc {
    child: Child,
    _files: Option<ProcFiles>,
}

/// What a child reads from disk, removed when it is gone.
enum ProcFiles {
    Config { _file: TempFile },
    Switch { _files: SwitchFiles },
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it ended already (a HAProxy that refused its config).
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `isoswitch sim node` in its own process.
pub(crate) fn start_node(
    spec: &str,
    id: &str,
    cpus: Option<&CpuSet>,
) -> Result<(Proc, SocketAddr), String> {
    let listen = free_port()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = command(&exe, cpus)
        .args(["sim", "node", "--spec", spec, "--id", id, "--listen"])
        .arg(listen.to_string())
        .env("ISOSWITCH_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start node {id}: {e}"))?;
    Ok((
        Proc {
            child,
            _files: None,
        },
        listen,
    ))
}

/// The switch's config for the bench: one keyed `listen` front balancing
/// per message over the nodes, two connections per node. With
/// `integrity_off`, the per-request integrity books are off: no node
/// remembered for repeats, no answered-for request for late approvals
/// (logged, not reversed). The store still opens in the data directory,
/// as it does for the integrity-on switch; nothing on the message path
/// touches it when nothing is late. The journal is on, as shipped, unless
/// `journal_off` (`[journal] enabled = false`: the routing core alone).
/// With `max_clients`, the front's limits
/// (`max_connections`, `max_per_source`, `max_in_flight_per_source`) admit
/// that many clients, all from 127.0.0.1, with one request in flight each.
pub(crate) fn switch_toml(
    spec: &str,
    front: SocketAddr,
    nodes: &[SocketAddr],
    integrity_off: bool,
    journal_off: bool,
    max_clients: Option<usize>,
) -> String {
    let mut toml = format!(
        "[[service]]\nname = \"bench\"\nspec = \"{spec}\"\n[service.front]\nkind = \"listen\"\nlisten = \"{front}\"\n"
    );
    if let Some(n) = max_clients {
        let n = n.max(1) + 16;
        toml.push_str(&format!(
            "max_connections = {n}\nmax_per_source = {n}\nmax_in_flight_per_source = {}\n",
            n * 4
        ));
    }
    toml.push_str("[service.back]\nconnections_per_node = 2\n");
    if integrity_off {
        toml.push_str(
            "[service.integrity]\nlate_approval = \"log\"\nlate_window = \"0s\"\nrepeat_window = \"0s\"\n",
        );
    }
    for (i, a) in nodes.iter().enumerate() {
        toml.push_str(&format!(
            "[[service.back.node]]\nid = \"{:02}\"\naddress = \"{a}\"\n",
            i + 1
        ));
    }
    if journal_off {
        toml.push_str("[journal]\nenabled = false\n");
    }
    toml
}

/// `isoswitch run` in its own process ([`switch_toml`]).
pub(crate) fn start_switch(
    spec: &str,
    nodes: &[SocketAddr],
    threads: Option<usize>,
    cpus: Option<&CpuSet>,
    integrity_off: bool,
    journal_off: bool,
    max_clients: Option<usize>,
) -> Result<(Proc, SocketAddr), String> {
    let front = free_port()?;
    // Files of their own: the switches run side by side.
    let stem = match (integrity_off, journal_off) {
        (true, _) => "isoswitch-bench-integrity-off",
        (false, true) => "isoswitch-bench-journal-off",
        (false, false) => "isoswitch-bench",
    };
    let files = SwitchFiles::write(
        stem,
        &switch_toml(spec, front, nodes, integrity_off, journal_off, max_clients),
    )?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = command(&exe, cpus);
    files.run_args(&mut cmd);
    if let Some(n) = threads {
        cmd.arg("--worker-threads").arg(n.to_string());
    }
    let child = cmd
        .env("ISOSWITCH_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the switch: {e}"))?;
    Ok((
        Proc {
            child,
            _files: Some(ProcFiles::Switch { _files: files }),
        },
        front,
    ))
}

/// HAProxy in TCP mode, round robin over the nodes: it balances connections,
/// not messages. `threads` sets `nbthread` (HAProxy's default: one per CPU
/// it may run on). `maxconn`: client connections at once ([`HAPROXY_MAXCONN`]
/// for the throughput rows).
pub(crate) fn haproxy_cfg(
    front: SocketAddr,
    nodes: &[SocketAddr],
    threads: Option<usize>,
    maxconn: usize,
) -> String {
    let mut cfg = format!("global\n  maxconn {maxconn}\n");
    if let Some(n) = threads {
        cfg.push_str(&format!("  nbthread {}\n", n.max(1)));
    }
    cfg.push_str(&format!(
        "defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n\
         frontend f\n  bind {front}\n  default_backend b\nbackend b\n  balance roundrobin\n"
    ));
    for (i, a) in nodes.iter().enumerate() {
        cfg.push_str(&format!("  server n{i} {a}\n"));
    }
    cfg
}

/// HAProxy's `maxconn` in the throughput rows. maxconn sizes HAProxy's file
/// descriptor need (about twice maxconn, one per client and one per server
/// connection); 10000 asks for more than a hard limit of 20000, and HAProxy
/// 2.6 then refuses to start.
pub(crate) const HAPROXY_MAXCONN: usize = 4000;

/// The open files HAProxy asks for with `maxconn` (two per connection, and
/// some for listeners, servers and its own use): more than the hard limit
/// and it refuses to start.
pub(crate) fn haproxy_files(maxconn: usize) -> u64 {
    2 * maxconn as u64 + 100
}

pub(crate) fn start_haproxy(
    nodes: &[SocketAddr],
    threads: Option<usize>,
    cpus: Option<&CpuSet>,
    maxconn: usize,
) -> Result<(Proc, SocketAddr), String> {
    let front = free_port()?;
    let config = TempFile::write(
        "isoswitch-bench-haproxy",
        "cfg",
        &haproxy_cfg(front, nodes, threads, maxconn),
    )?;
    let child = command(Path::new("haproxy"), cpus)
        .arg("-f")
        .arg(&config.path)
        .arg("-q")
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    Ok((
        Proc {
            child,
            _files: Some(ProcFiles::Config { _file: config }),
        },
        front,
    ))
}

pub(crate) struct TempFile {
    pub(crate) path: std::path::PathBuf,
}

impl TempFile {
    pub(crate) fn write(stem: &str, ext: &str, text: &str) -> Result<TempFile, String> {
        let path = std::env::temp_dir().join(format!("{stem}-{}.{ext}", std::process::id()));
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(TempFile { path })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An `isoswitch run` child's config file and a data directory of its own
/// (the switch creates it): no run inherits another's runtime state, and
/// nothing is written where the bench was started. Both removed when dropped.
pub(crate) struct SwitchFiles {
    config: TempFile,
    data_dir: std::path::PathBuf,
}

impl SwitchFiles {
    pub(crate) fn write(stem: &str, toml: &str) -> Result<SwitchFiles, String> {
        let data_dir = std::env::temp_dir().join(format!("{stem}-{}.data", std::process::id()));
        // A directory left by a run that was killed: start afresh.
        let _ = std::fs::remove_dir_all(&data_dir);
        Ok(SwitchFiles {
            config: TempFile::write(stem, "toml", toml)?,
            data_dir,
        })
    }

    /// `run --config FILE --data-dir DIR`.
    pub(crate) fn run_args(&self, cmd: &mut Command) {
        cmd.args(["run", "--config"])
            .arg(&self.config.path)
            .arg("--data-dir")
            .arg(&self.data_dir);
    }
}

impl Drop for SwitchFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_taskset_writes_them() {
        assert_eq!(CpuSet::parse("0-1,4").unwrap().list(), "0,1,4");
        assert_eq!(CpuSet::parse("3\n").unwrap().list(), "3");
        assert_eq!(CpuSet::parse("2,0-2").unwrap().list(), "0,1,2");
        assert!(CpuSet::parse("").is_err());
        assert!(CpuSet::parse("1-0").is_err());
        assert!(CpuSet::parse("a").is_err());
    }

    #[test]
    fn two_cpus_give_one_to_the_proxy_and_one_to_the_load() {
        let two = CpuSet::parse("0-1").unwrap();
        let p = Pinning::choose(&two, None, None).unwrap().unwrap();
        assert_eq!((p.load.list(), p.proxy.list()), ("0".into(), "1".into()));
        let four = CpuSet::parse("0-3").unwrap();
        let p = Pinning::choose(&four, None, None).unwrap().unwrap();
        assert_eq!(
            (p.load.list(), p.proxy.list()),
            ("0,1".into(), "2,3".into())
        );
        let three = CpuSet::parse("4-6").unwrap();
        let p = Pinning::choose(&three, None, None).unwrap().unwrap();
        assert_eq!((p.load.list(), p.proxy.list()), ("4,5".into(), "6".into()));
        let one = CpuSet::parse("0").unwrap();
        assert_eq!(Pinning::choose(&one, None, None).unwrap(), None);
    }

    #[test]
    fn given_proxy_cpus_leave_the_rest_to_the_load() {
        let four = CpuSet::parse("0-3").unwrap();
        let p = Pinning::choose(&four, Some("0"), None).unwrap().unwrap();
        assert_eq!(
            (p.load.list(), p.proxy.list()),
            ("1,2,3".into(), "0".into())
        );
        let p = Pinning::choose(&four, Some("1"), Some("1"))
            .unwrap()
            .unwrap();
        assert_eq!((p.load.list(), p.proxy.list()), ("1".into(), "1".into()));
        assert!(Pinning::choose(&four, None, Some("1")).is_err());
    }

    #[test]
    fn usage_sums_switches_over_threads() {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(parse_switches(status), 127);
        assert_eq!(parse_switches("garbage"), 0);
        let now = usage(std::process::id()).unwrap();
        assert!(now.switches > 0, "this test's threads have slept: {now:?}");
        let later = Usage {
            user: now.user + 3,
            system: now.system + 1,
            switches: now.switches + 10,
        };
        assert_eq!(
            now.until(later),
            Usage {
                user: 3,
                system: 1,
                switches: 10
            }
        );
    }

    #[test]
    fn cpu_ticks_skip_a_command_name_with_spaces() {
        let stat = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 3 0";
        assert_eq!(parse_cpu_ticks(stat), Some(22));
        assert!(cpu_ticks(std::process::id()).is_some());
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn integrity_off_turns_the_books_off_and_parses() {
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let n: SocketAddr = "127.0.0.1:1001".parse().unwrap();
        let on = switch_toml("cups", a, &[n], false, false, None);
        assert!(!on.contains("[service.integrity]"), "{on}");
        let off = switch_toml("cups", a, &[n], true, false, None);
        let cfg = crate::config::Config::from_toml(&off).unwrap();
        let i = &cfg.services[0].integrity;
        assert_eq!(i.late_approval, crate::config::LateApproval::Log);
        assert!(
            i.late_window.is_zero() && i.repeat_window.is_zero(),
            "{i:?}"
        );
        assert_eq!(cfg.services[0].back.nodes.len(), 1);
    }

    #[test]
    fn the_journal_is_on_as_shipped_unless_turned_off() {
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let n: SocketAddr = "127.0.0.1:1001".parse().unwrap();
        let on =
            crate::config::Config::from_toml(&switch_toml("cups", a, &[n], false, false, None));
        assert!(on.unwrap().journal.enabled);
        let off = switch_toml("cups", a, &[n], false, true, None);
        let off = crate::config::Config::from_toml(&off).unwrap();
        assert!(!off.journal.enabled);
        assert!(off.services[0].integrity.late_approval != crate::config::LateApproval::Log);
    }

    #[test]
    fn haproxy_gets_the_switch_thread_count() {
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let n: SocketAddr = "127.0.0.1:1001".parse().unwrap();
        let cfg = haproxy_cfg(a, &[n, n], Some(2), HAPROXY_MAXCONN);
        assert!(cfg.contains("\n  nbthread 2\n"), "{cfg}");
        assert!(cfg.contains("mode tcp"));
        assert!(cfg.contains("server n1 127.0.0.1:1001"));
        assert!(!haproxy_cfg(a, &[n], None, 100).contains("nbthread"));
    }
}
