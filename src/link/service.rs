//! A running service: the routing decisions of `route/` applied to live links.
//! Front readers hand requests to [`Service::on_request`]; node readers hand
//! responses to [`Service::on_node_frame`]; a sweeper declines what expires.
//! Every request accepted from a front gets exactly one answer: the correlator
//! hands each entry out once, to a response, a timeout or a dead connection.
//!
//! The service is the routing core; around it, each in a file of its own:
//! [`LiveSettings`] (what a reload changes, swapped whole), [`FrontSide`]
//! (what the front kind adds: the OneConnect pool, or the [`peer`] side of a
//! simplex or duplex front), [`Links`] (its connections and what admits
//! them), [`SwitchMade`] (the switch's own messages) and [`ServiceCounters`].

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;

use super::back::pool::NodePool;
use super::netmgmt::{NetworkTemplate, TemplateError};
use crate::config::{ConfigError, ServiceConfig};
use crate::iso8583::{Message, Spec};
use crate::route::Router;
use crate::route::{
    Algorithm, CorrelatorConfig, OnTimeout, RouterConfig, RouterError, Shards, StampError,
};

mod answer;
mod counters;
mod ending;
mod facts;
mod journaled;
mod keys;
mod links;
mod live;
mod made;
mod origin;
mod owed;
pub mod peer;
mod request;
mod seen;
mod side;
mod undelivered;

pub use counters::{PeerCounters, Refusal, ServiceCounters};
pub use facts::RequestFacts;
pub use journaled::JournalTap;
pub use links::Links;
pub use live::{ListenLimits, LiveSettings};
pub use made::{IntegrityCounters, SafOutbox, SwitchMade};
pub use origin::Origin;
pub use owed::AnswerFrom;
pub(crate) use owed::{record_attempt, record_dead};
pub use seen::SameRequest;
pub use side::{FrontSide, PeerSide};
pub(crate) use undelivered::{oneconnect_undelivered, oneconnect_unknown};

/// Why a service cannot be built from its config; each names its key.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Router(#[from] RouterError),
    #[error(transparent)]
    Stamp(#[from] StampError),
    #[error(transparent)]
    Network(#[from] TemplateError),
    #[error(transparent)]
    Pool(#[from] super::back::pool::PoolError),
    #[error(transparent)]
    OneConnect(#[from] super::back::oneconnect_pool::IdleTimeoutZero),
    /// The duplicate check's fields do not fit the field index beside
    /// routing's.
    #[error(
        "integrity.duplicate_fields: with the correlation key, rules and routing, more fields than one pass can index"
    )]
    TooManyFields,
    /// An approval code that is not a value of the spec's F39.
    #[error("integrity.approval_codes: {0}")]
    ApprovalCodes(#[from] crate::iso8583::IsoError),
}

/// A request in flight, as the correlator keeps it.
#[derive(Debug)]
pub struct Pending {
    pub origin: Origin,
    /// The request as received, to build a decline from.
    pub request: Bytes,
    /// What accepting it learnt: no ending parses it again.
    pub facts: RequestFacts,
    pub node: usize,
    pub sent_at: Instant,
    /// What the switch does if no answer comes by the deadline.
    pub on_timeout: OnTimeout,
    /// What makes it the same as another request, and who else waits for
    /// its answer.
    pub same: SameRequest,
}

pub use crate::route::{Checked, Invalid};

/// A service as `ops/` and the CLI see it ([`Service::view`]).
#[derive(Clone, Copy)]
pub struct ServiceView<'a> {
    pub config: &'a ServiceConfig,
    /// The nodes: admin state, health, counters (the admin API changes
    /// their state through it).
    pub pool: &'a NodePool,
    pub side: &'a FrontSide,
    pub links: &'a Links,
    pub made: &'a SwitchMade,
    pub counters: &'a ServiceCounters,
}

pub struct Service {
    pub(in crate::link) config: ServiceConfig,
    pub(in crate::link) pool: NodePool,
    /// Validation, correlation keys, stamps: the service's routing decisions.
    pub(in crate::link) router: Router,
    /// Requests in flight, by correlation key.
    pub(in crate::link) in_flight: Shards<Pending>,
    /// What a reload changes, read per request without a lock.
    live: ArcSwap<LiveSettings>,
    /// What the front kind adds: the OneConnect pool or the peer side.
    pub(in crate::link) side: FrontSide,
    /// The service's connections and what admits them.
    pub(in crate::link) links: Links,
    /// The switch's own messages.
    pub(in crate::link) made: SwitchMade,
    pub(in crate::link) counters: ServiceCounters,
    /// Where completed exchanges are recorded; none without a store.
    journal: std::sync::OnceLock<JournalTap>,
}

impl Service {
    pub fn new(config: ServiceConfig, spec: Spec, now: Instant) -> Result<Service, ServiceError> {
        let pool = NodePool::new(&config.name, &config.back, now)?;
        let spec = Arc::new(spec);
        let mut router = Router::new(
            RouterConfig {
                key: config.correlation.key.clone(),
                rule_fields: config
                    .back
                    .rules
                    .iter()
                    .flat_map(|r| r.fields.iter().map(|f| f.field))
                    .collect(),
                accept_mti: config.accept_mti.clone(),
                f37_stamp: config.f37_stamp,
                tpdu_on_response: config.correlation.tpdu_on_response,
                sticky_field: (config.back.algorithm == Algorithm::Sticky)
                    .then_some(config.back.sticky_field),
            },
            Arc::clone(&spec),
        )?;
        // The duplicate check reads its fields from the index validation
        // builds, in the same pass.
        let duplicates = &config.integrity;
        if !duplicates.duplicate_window.is_zero()
            && !router.index_also(&duplicates.duplicate_fields)
        {
            return Err(ServiceError::TooManyFields);
        }
        let mut made = SwitchMade::new(
            NetworkTemplate::for_service(&config, &spec)?,
            &config,
            &spec,
        )?;
        // The key holds its fields' bytes already (the router's key: the
        // configured one, else the dialect's): the fingerprint reads the rest.
        let key = match &config.correlation.key {
            k if k.is_empty() => crate::route::default_key(&spec),
            k => k.clone(),
        };
        let beside_key = duplicates.duplicate_fields.iter().copied();
        let beside_key = beside_key.filter(|&id| !key.contains(&crate::route::KeyPart::Field(id)));
        made.duplicates.tell_apart_by(beside_key.collect());
        // The correlation table keeps the answers duplicates get.
        let in_flight = Shards::with_keeping(
            CorrelatorConfig {
                capacity: config.correlation.max_in_flight,
                ..CorrelatorConfig::default()
            },
            Arc::clone(made.duplicates.keeping()),
        );
        Ok(Service {
            side: FrontSide::for_service(&config, now)?,
            live: ArcSwap::from_pointee(LiveSettings::of(&config)?),
            made,
            router,
            links: Links::default(),
            config,
            pool,
            in_flight,
            counters: ServiceCounters::default(),
            journal: std::sync::OnceLock::new(),
        })
    }

    /// What operators and their tools read of the service (`ops/`, the
    /// CLI): its config, nodes, connections, counters and the switch's
    /// books, by shared reference; the message path's fields stay inside
    /// `link/`.
    pub fn view(&self) -> ServiceView<'_> {
        ServiceView {
            config: &self.config,
            pool: &self.pool,
            side: &self.side,
            links: &self.links,
            made: &self.made,
            counters: &self.counters,
        }
    }

    /// Its connections' setup (the descriptor budget, TLS, capture), given
    /// once before it starts.
    pub fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }

    /// Where this service's TLS handshakes are counted and logged.
    pub fn handshake_book(&self) -> super::io::secure::HandshakeBook<'_> {
        super::io::secure::HandshakeBook {
            service: self.name(),
            handshakes: &self.links.tls.handshakes,
            log_limit: &self.links.log_limit,
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The service's dialect.
    pub fn spec(&self) -> &Arc<Spec> {
        self.router.spec()
    }

    /// The settings a reload changes, as they are now.
    pub fn live(&self) -> arc_swap::Guard<Arc<LiveSettings>> {
        self.live.load()
    }

    /// Applies a reloaded config's live part: requests already in flight
    /// keep the deadline they were given, connections already open the share
    /// they were given; what comes next uses the new settings. A lower
    /// `correlation.max_in_flight` keeps the requests in flight past it and
    /// declines new ones until there is room.
    pub fn reload_live(&self, config: &ServiceConfig) -> Result<(), ConfigError> {
        self.live.store(Arc::new(LiveSettings::of(config)?));
        self.in_flight.set_config(CorrelatorConfig {
            capacity: config.correlation.max_in_flight,
            ..CorrelatorConfig::default()
        });
        Ok(())
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.side.oneconnect().map_or(0, |oc| oc.in_flight())
    }

    /// Checks a message in full against the service's spec and finds its
    /// routing fields, in one pass (see [`Router::check`]).
    pub fn check<'s>(&'s self, payload: Bytes) -> Result<Checked<'s>, Invalid> {
        self.router.check(payload)
    }
}

/// MTI and the non-secret key fields of a message, for logs.
fn summary(msg: &Message<'_>) -> String {
    let text = |id: u16| {
        msg.field(id)
            .ok()
            .flatten()
            .map(|f| f.show().to_string())
            .unwrap_or_else(|| "-".into())
    };
    format!(
        "{} F11={} F37={} F41={}",
        msg.mti(),
        text(11),
        text(37),
        text(41)
    )
}

#[cfg(test)]
mod tests;
