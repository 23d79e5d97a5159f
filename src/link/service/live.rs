//! What a reload changes in a running service, in one value: the timeouts
//! per flow, the F39 codes of switch-made answers, a listen front's limits
//! and the active health checks' timing. The service holds it behind an
//! `ArcSwap`: the message path reads a snapshot without a lock, and a reload
//! swaps it whole, so a request never sees half of one reload.

use std::time::Duration;

use crate::config::{ConfigError, FrontConfig, ListenFront, ServiceConfig};
use crate::route::{DeclineCodes, DeclineReason, TimeoutPolicy};

/// The settings a reload may change, as the service runs them now.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveSettings {
    /// How long a request waits for its node's answer, and what the switch
    /// does then, per MTI (`timeouts`).
    pub timeouts: TimeoutPolicy,
    /// The same for a node's own requests to the peer (simplex and duplex
    /// fronts; `timeouts.node_on_timeout`).
    pub node_timeouts: TimeoutPolicy,
    /// The F39 codes of switch-made answers (`declines`).
    pub declines: DeclineCodes,
    /// A listen front's connection and in-flight limits, read once per
    /// accepted connection (those open keep the share they were given).
    pub listen_limits: Option<ListenLimits>,
    /// Active health checks: how often, and how long one may take.
    pub check_interval: Duration,
    pub check_timeout: Duration,
}

impl LiveSettings {
    /// The live part of `config` (validated: a pattern that does not parse
    /// is an error here too, named).
    pub fn of(config: &ServiceConfig) -> Result<LiveSettings, ConfigError> {
        Ok(LiveSettings {
            timeouts: config.timeouts.policy(false)?,
            node_timeouts: config.timeouts.policy(true)?,
            declines: config.declines,
            listen_limits: match &config.front {
                FrontConfig::Listen(l) => Some(ListenLimits::of(l)),
                _ => None,
            },
            check_interval: config.back.health.interval,
            check_timeout: config.back.health.timeout,
        })
    }

    /// The longest any request may wait: how long a graceful stop or a node
    /// removal waits for what is in flight.
    pub fn longest_timeout(&self) -> Duration {
        self.timeouts.longest().max(self.node_timeouts.longest())
    }

    /// The F39 code of a switch-made answer.
    pub fn decline_code(&self, reason: DeclineReason) -> [u8; 2] {
        self.declines.code(reason)
    }

    /// `front` with its limits as last reloaded (connections in total and
    /// per source, in-flight shares): a new connection is admitted and given
    /// its share by these.
    pub fn listen_front(&self, front: &ListenFront) -> ListenFront {
        let mut front = front.clone();
        if let Some(l) = self.listen_limits {
            l.apply(&mut front);
        }
        front
    }
}

/// The limits of a listen front that a reload may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenLimits {
    pub max_connections: usize,
    pub max_per_source: usize,
    pub max_in_flight_per_connection: usize,
    pub max_in_flight_per_source: usize,
}

impl ListenLimits {
    /// The keys of `[service.front]` these are (reload compares the rest).
    pub const KEYS: [&'static str; 4] = [
        "max_connections",
        "max_per_source",
        "max_in_flight_per_connection",
        "max_in_flight_per_source",
    ];

    fn of(f: &ListenFront) -> ListenLimits {
        ListenLimits {
            max_connections: f.max_connections,
            max_per_source: f.max_per_source,
            max_in_flight_per_connection: f.max_in_flight_per_connection,
            max_in_flight_per_source: f.max_in_flight_per_source,
        }
    }

    fn apply(self, f: &mut ListenFront) {
        f.max_connections = self.max_connections;
        f.max_per_source = self.max_per_source;
        f.max_in_flight_per_connection = self.max_in_flight_per_connection;
        f.max_in_flight_per_source = self.max_in_flight_per_source;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reloaded_listen_front_keeps_its_address_and_takes_the_new_limits() {
        let toml = "[[service]]\nname = \"pos\"\nspec = \"cup-pos\"\n\
             [service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"\nmax_connections = 7\n\
             [[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:9\"\n";
        let cfg = crate::config::Config::from_toml(toml).expect("config");
        let svc = &cfg.services[0];
        let live = LiveSettings::of(svc).unwrap();
        let FrontConfig::Listen(mut started) = svc.front.clone() else {
            panic!("a listen front");
        };
        started.max_connections = 1000;
        let front = live.listen_front(&started);
        assert_eq!(front.max_connections, 7);
        assert_eq!(front.listen, started.listen);
        assert_eq!(live.longest_timeout(), svc.timeouts.request);
    }
}
