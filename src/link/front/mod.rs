//! The client side of a service: where its requests come from. A `listen`
//! front accepts clients (POS controllers, ATMs, internal apps), with
//! admission (the descriptor budget, fair shares, the client's own
//! descriptor) before a request is taken; a `simplex` front (UnionPay's
//! split links) and a `connect` front (VISA's and Mastercard's duplex links)
//! keep a link set of their own; a OneConnect listen front carries each
//! request on a node connection of its own.

pub mod admission;
pub mod duplex;
pub mod link_set;
pub mod listen;
pub mod oneconnect;
pub mod out_links;
pub mod simplex;
