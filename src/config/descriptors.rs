//! The descriptor budget: how many open files the switch holds at its
//! limits, by what for, and how many of the process's open-file limit are
//! left for client connections once everything else is reserved.
//!
//! Clients are the only descriptors an outsider opens. Left unchecked they
//! take the last ones, and then a node that restarts cannot be reconnected
//! for as long as the clients stay: the switch refuses clients past
//! [`DescriptorNeed::client_budget`] at accept instead, so node links, peer
//! links, the admin listener, captures and the files it reads always find
//! theirs.

use super::{AdminConfig, CheckKind, Config, FrontConfig, ServiceConfig};

/// Per capturing service: the file being written and its O_DIRECT twin, and
/// the directory read at start.
pub const CAPTURE_PER_SERVICE: u64 = 3;

/// Files the switch opens besides sockets and captures: the config and the
/// token file read again on reload, spec files, the runtime state store.
pub const FILES: u64 = 8;

/// The process itself (stdio, the runtime's epoll and wake-up descriptors,
/// signal pipes: about 10 measured), with room for a client refused at
/// accept, which takes a descriptor until it is closed a moment later.
pub const PROCESS: u64 = 24;

/// Open files at the configuration's limits, by what holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DescriptorNeed {
    /// Client connections: every listen front's `max_connections`.
    pub clients: u64,
    /// Listening sockets: listen fronts, simplex in-link listeners, admin.
    pub listeners: u64,
    /// Node connections: nodes × `connections_per_node`, plus one per node for
    /// `tcp` health checks (a connect each round).
    pub node_links: u64,
    /// Simplex out and in links, connect-front links.
    pub peer_links: u64,
    /// The admin listener's connections: `admin.max_connections` and
    /// `admin.probe_slots`, reserved whole, the 503s given a moment to be
    /// read ([`AdminConfig::LINGERING`]), the one being accepted, and its
    /// thread's copy of the listener, poller and waker.
    pub admin: u64,
    /// Capture files ([`CAPTURE_PER_SERVICE`] per capturing service).
    pub capture: u64,
    /// [`FILES`] and [`PROCESS`].
    pub process: u64,
}

impl DescriptorNeed {
    pub fn of(config: &Config) -> DescriptorNeed {
        let mut need = DescriptorNeed {
            admin: config.admin.as_ref().map_or(0, |a| {
                (a.max_connections + a.probe_slots + AdminConfig::LINGERING) as u64 + 4
            }),
            listeners: u64::from(config.admin.is_some()),
            process: FILES + PROCESS,
            ..DescriptorNeed::default()
        };
        for svc in &config.services {
            need.add_service(svc);
        }
        need
    }

    fn add_service(&mut self, svc: &ServiceConfig) {
        let count = |n: usize| n as u64;
        match &svc.front {
            FrontConfig::Listen(f) => {
                self.clients += count(f.max_connections);
                self.listeners += 1;
            }
            FrontConfig::Simplex(f) => {
                self.peer_links += count(f.links + f.max_in_links());
                self.listeners += 1;
            }
            FrontConfig::Connect(f) => self.peer_links += count(f.links),
        }
        let checks = u64::from(svc.back.health.check == CheckKind::Tcp);
        self.node_links +=
            count(svc.back.nodes.len()) * (count(svc.back.connections_per_node) + checks);
        if svc.capture.as_ref().is_some_and(|c| c.enabled) {
            self.capture += CAPTURE_PER_SERVICE;
        }
    }

    /// Everything at the limits.
    pub fn total(&self) -> u64 {
        self.clients + self.reserved()
    }

    /// Everything but the clients: what must be there whatever they do.
    pub fn reserved(&self) -> u64 {
        self.listeners
            + self.node_links
            + self.peer_links
            + self.admin
            + self.capture
            + self.process
    }

    /// Client connections the open-file limit `limit` leaves once the rest is
    /// reserved (at most what the fronts allow).
    pub fn client_budget(&self, limit: u64) -> u64 {
        limit.saturating_sub(self.reserved()).min(self.clients)
    }

    /// What `check` and `run` say when `limit` (the open-file limit the switch
    /// runs under) cannot hold everything at the limits.
    pub fn warning(&self, limit: u64) -> Option<String> {
        let need = self.total();
        if need <= limit {
            return None;
        }
        let parts = format!(
            "{} clients, {} node links, {} peer links, {} admin, {} capture, {} listeners, files and process",
            self.clients,
            self.node_links,
            self.peer_links,
            self.admin,
            self.capture,
            self.listeners + self.process
        );
        let reserved = self.reserved();
        Some(if reserved >= limit {
            format!(
                "at its limits the switch holds up to {need} open files ({parts}), and even without \
                 clients it needs {reserved}, more than the open-file limit {limit} (ulimit -n / \
                 LimitNOFILE): node and peer links will fail to connect and every client is \
                 refused; raise the limit"
            )
        } else {
            format!(
                "at its limits the switch holds up to {need} open files ({parts}), more than the \
                 open-file limit {limit} (ulimit -n / LimitNOFILE): clients past {} are refused at \
                 accept (reason `descriptors`) so that node and peer links keep theirs; raise the \
                 limit or lower max_connections",
                self.client_budget(limit)
            )
        })
    }
}

/// The open-file limit (RLIMIT_NOFILE): soft, hard.
pub fn open_file_limit() -> std::io::Result<(u64, u64)> {
    rlimit::getrlimit(rlimit::Resource::NOFILE)
}

/// Raises the soft open-file limit to the hard one (what `run` does at
/// start, so a service manager's `LimitNOFILE` is the limit); returns the
/// limit the switch now runs under.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let toml = format!(
            "{extra}\n[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\nmax_connections = 100\n\
             [service.back]\nconnections_per_node = 2\n[service.back.health]\ncheck = \"tcp\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n\
             [[service.back.node]]\nid = \"02\"\naddress = \"127.0.0.1:9\"\n\
             [[service]]\nname = \"up\"\nspec = \"cups\"\nf37_stamp = {{ offset = 10, width = 2 }}\n\
             [service.front]\nkind = \"simplex\"\nconnect = \"127.0.0.1:9\"\nlisten = \"127.0.0.1:0\"\n\
             links = 4\nmember_id = \"1\"\npeer_id = \"2\"\n\
             [service.capture]\ndirectory = \"/tmp/x\"\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n"
        );
        Config::from_toml_with_env(&toml, std::iter::empty()).unwrap()
    }

    #[test]
    fn every_holder_is_counted() {
        let need = DescriptorNeed::of(&config("[admin]\nlisten = \"127.0.0.1:0\""));
        assert_eq!(need.clients, 100);
        assert_eq!(need.listeners, 3, "listen front, in-link listener, admin");
        // pos: 2 nodes x (2 connections + 1 tcp check); up: 1 node x 2 (echo).
        assert_eq!(need.node_links, 6 + 2);
        assert_eq!(need.peer_links, 4 + 4, "out links and in links");
        assert_eq!(
            need.admin,
            64 + 8 + 32 + 4,
            "admin.max_connections and probe_slots by default"
        );
        assert_eq!(need.capture, CAPTURE_PER_SERVICE);
        assert_eq!(need.process, FILES + PROCESS);
        assert_eq!(need.total(), need.clients + need.reserved());
        let without_admin = DescriptorNeed::of(&config(""));
        assert_eq!(without_admin.admin, 0);
        assert_eq!(without_admin.listeners, 2);
    }

    #[test]
    fn clients_get_what_the_rest_leaves() {
        let need = DescriptorNeed::of(&config(""));
        let reserved = need.reserved();
        assert_eq!(need.client_budget(1_000_000), 100, "the fronts' own cap");
        assert_eq!(need.client_budget(reserved + 30), 30);
        assert_eq!(need.client_budget(reserved / 2), 0);
        assert!(need.warning(1_000_000).is_none());
        let short = need.warning(reserved + 30).unwrap();
        assert!(
            short.contains("clients past 30 are refused") && short.contains("descriptors"),
            "{short}"
        );
        let none = need.warning(reserved / 2).unwrap();
        assert!(none.contains("even without clients"), "{none}");
    }
}
