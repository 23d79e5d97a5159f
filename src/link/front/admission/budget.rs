//! The client descriptor budget: client connections the whole process may
//! hold at once, shared by every listen front. What the open-file limit
//! leaves once node links, peer links, the admin listener, captures and files
//! are reserved (`config::descriptors`): a client past it is refused at
//! accept, so a node that restarts always finds descriptors to be
//! reconnected with.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Client connections open across the process, and how many may be.
#[derive(Debug)]
pub struct ClientBudget {
    limit: usize,
    open: AtomicUsize,
}

/// One client connection's share of the budget, given back on drop (when its
/// task ends and its socket is closed).
#[derive(Debug)]
pub struct ClientPermit(Arc<ClientBudget>);

impl ClientBudget {
    pub fn new(limit: usize) -> Arc<ClientBudget> {
        Arc::new(ClientBudget {
            limit,
            open: AtomicUsize::new(0),
        })
    }

    /// No budget: the fronts' own limits only (a switch started without
    /// `run`, such as one inside tests).
    pub fn unlimited() -> Arc<ClientBudget> {
        ClientBudget::new(usize::MAX)
    }

    /// A share for one more client, unless the budget is spent.
    pub fn try_admit(self: &Arc<Self>) -> Option<ClientPermit> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()?;
        Some(ClientPermit(Arc::clone(self)))
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Client connections holding a share now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_refused_past_the_limit_and_come_back_on_drop() {
        let budget = ClientBudget::new(2);
        let a = budget.try_admit().expect("first");
        let b = budget.try_admit().expect("second");
        assert!(budget.try_admit().is_none(), "spent");
        assert_eq!(budget.open(), 2);
        drop(a);
        let c = budget.try_admit().expect("given back");
        drop((b, c));
        assert_eq!(budget.open(), 0);
        assert!(ClientBudget::unlimited().try_admit().is_some());
    }
}
