//! What a service's front kind adds to the routing core: nothing for a plain
//! listen front; the node connection pool of a OneConnect front; the out
//! links and the F37 stamp table of a simplex or duplex front (the peer
//! side). They exclude one another, so a service holds one.

use std::sync::Arc;
use std::time::Instant;

use crate::config::ServiceConfig;
use crate::link::back::oneconnect_pool::OneConnect;
use crate::link::front::out_links::OutLinks;
use crate::route::{StampTable, node::NodeId};

use super::ServiceError;

/// The front-specific part of a service.
pub enum FrontSide {
    /// A listen front: requests are keyed and multiplexed over the node
    /// connections.
    Listen,
    /// A listen front in `oneconnect` mode: one request at a time per client,
    /// over a pool of node connections.
    OneConnect(Arc<OneConnect>),
    /// A simplex or duplex front: links to a peer (UnionPay, VISA).
    Peer(PeerSide),
}

/// The peer side of a simplex or duplex front.
pub struct PeerSide {
    /// The out links every frame to the peer can use.
    pub out_links: Arc<OutLinks>,
    /// The F37 node stamps, when configured: which node a peer's response
    /// goes back to.
    pub(super) stamps: Option<StampTable>,
}

impl FrontSide {
    pub fn for_service(config: &ServiceConfig, now: Instant) -> Result<FrontSide, ServiceError> {
        if let Some(oneconnect) = OneConnect::for_service(config)? {
            return Ok(FrontSide::OneConnect(oneconnect));
        }
        let Some(set) = config.front.link_set() else {
            return Ok(FrontSide::Listen);
        };
        let out_links = Arc::new(OutLinks::new(
            set.links,
            set.sign_on,
            config.timeouts.request,
            now,
        ));
        let stamps = match &config.f37_stamp {
            Some(stamp) => {
                let ids: Vec<NodeId> = config.back.node_ids()?;
                Some(StampTable::new(*stamp, &ids)?)
            }
            None => None,
        };
        Ok(FrontSide::Peer(PeerSide { out_links, stamps }))
    }

    /// The out links of a simplex or duplex front.
    pub fn out_links(&self) -> Option<&Arc<OutLinks>> {
        match self {
            FrontSide::Peer(p) => Some(&p.out_links),
            _ => None,
        }
    }

    /// The node connection pool of a OneConnect front.
    pub fn oneconnect(&self) -> Option<&Arc<OneConnect>> {
        match self {
            FrontSide::OneConnect(oc) => Some(oc),
            _ => None,
        }
    }
}
