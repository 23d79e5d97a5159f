//! The `connect` front: VISA's and Mastercard's duplex links. The switch
//! connects every link, and each carries both directions: the network's
//! requests and answers come in on the links the switch's own go out on.
//! The links are a link set, as a simplex front's out links are.

use std::sync::Arc;

use tokio::sync::watch;

use super::link_set::spawn_links;
use crate::config::LinkSet;
use crate::link::service::Service;

/// Spawns the duplex links of a `connect` front (VISA): the switch connects
/// them, and every link carries both directions. Returns the peer's address.
pub fn start_connect(
    service: Arc<Service>,
    set: LinkSet,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) -> std::net::SocketAddr {
    spawn_links(&service, &set, tasks, shutdown);
    set.connect
}
