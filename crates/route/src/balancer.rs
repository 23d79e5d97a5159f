//! Choosing a node for each request.
//!
//! A [`Balancer`] picks among the nodes of one pool, given a snapshot
//! ([`NodeView`]) of each. Only *pickable* nodes are considered (eligible and
//! effective weight above 0). Then, in order:
//!
//! 1. **Subset**: [`Balancer::pick_in`] restricts the choice to the nodes a
//!    [`RuleSet`](super::RuleSet) selected.
//! 2. **Priority groups**: nodes are grouped by priority; the highest group
//!    with at least `min_active` pickable nodes is used, else the next one
//!    down, else every pickable node. With one priority this is a no-op.
//! 3. **Algorithm** ([`Algorithm`]) among what is left.
//!
//! **Slow start** works under every algorithm. A node coming back has a ramp
//! ([`NodeView::ramp`], 10% → 100% over `slow_start`):
//!
//! - weighted, least outstanding and peak EWMA scale the node's weight by it
//!   ([`NodeView::milli_weight`], so a node of weight 1 ramps too);
//! - round robin, which ignores weights, skips a warming node at its turn
//!   with probability 1 − ramp (drawn from the seeded RNG), so it takes about
//!   `ramp / (ramp + n − 1)` of a pool of `n`;
//! - sticky gives a warming node the share `ramp` of the keys it owns, the
//!   others going where they would go without it. Which keys is fixed per
//!   (node, key) by a hash, not drawn: a key moves back to the node once,
//!   when the ramp passes it, and never flaps.
//!
//! A pick allocates nothing once the scratch buffers have grown to the pool
//! size (done up front by [`Balancer::with_capacity`]). A pool has a handful
//! of nodes, so picks are linear scans.
//!
//! [`SharedBalancer`] is the same balancer for many threads at once: its
//! state is atomics, so worker threads picking for one pool never wait on a
//! lock (see its doc for what concurrency may and may not change).

use serde::{Deserialize, Serialize};

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

use super::health::RAMP_FULL;
use super::node::NodeView;
use super::rng::{SharedRng, stable_hash};

/// The balancing algorithm of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Each pickable node in turn; weights are ignored.
    #[default]
    RoundRobin,
    /// Smooth weighted round robin (nginx): weights 5:1:1 give `a a b a c a a`.
    Weighted,
    /// Fewest requests in flight relative to weight: `(outstanding+1)/weight`;
    /// ties go round robin.
    LeastOutstanding,
    /// Power of two choices: two random candidates, the one with the lower
    /// `peak-EWMA latency × (outstanding+1) / weight` wins.
    PeakEwma,
    /// Rendezvous (highest random weight) hashing of the request's key (e.g.
    /// F41): a key stays on its node while that node is pickable, and losing a
    /// node moves only its own keys. Weights are ignored; a node in slow start
    /// takes back a growing, fixed share of its keys. Without a key it falls
    /// back to round robin.
    Sticky,
}

/// Balancing settings of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BalancerConfig {
    pub algorithm: Algorithm,
    /// A priority group is used only if at least this many of its nodes are
    /// pickable. 0 behaves as 1.
    pub min_active: usize,
}

impl Default for BalancerConfig {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::RoundRobin,
            min_active: 1,
        }
    }
}

/// Picks nodes for one pool from any number of threads at once, without a
/// lock: the per-algorithm state lives in atomics.
///
/// - The rotation (round robin, tie-breaking, sticky without a key) is one
///   atomic "last picked"; a round-robin pick commits its choice with a
///   compare-and-swap and rescans if another thread moved it first, so
///   concurrent picks form exactly the sequence some serial order would.
/// - Smooth weighted round robin keeps one atomic `current` per node: a pick
///   adds each candidate's weight and takes the total from the winner. The
///   sum over the nodes stays zero whatever the interleaving, so a node's
///   share follows its weight; only the order within a cycle can differ
///   from the serial one.
/// - The random draws (peak EWMA's two choices, slow start under round
///   robin) come from one [`SharedRng`] stream.
///
/// Each caller brings its scratch space (candidate indices), so a pick
/// allocates nothing once that has grown to the pool size. [`Balancer`] is
/// the same with its scratch inside, for one owner.
#[derive(Debug)]
pub struct SharedBalancer {
    cfg: BalancerConfig,
    /// Last node picked by rotation; [`NONE`] before the first pick.
    last: AtomicUsize,
    /// Smooth weighted round robin `current_weight` per node index.
    current: Box<[AtomicI64]>,
    rng: SharedRng,
}

/// No node picked yet.
const NONE: usize = usize::MAX;

impl Clone for SharedBalancer {
    fn clone(&self) -> Self {
        Self {
            cfg: self.cfg,
            last: AtomicUsize::new(self.last.load(Ordering::Relaxed)),
            current: self
                .current
                .iter()
                .map(|c| AtomicI64::new(c.load(Ordering::Relaxed)))
                .collect(),
            rng: self.rng.clone(),
        }
    }
}

impl SharedBalancer {
    /// A balancer for up to `nodes` node indices (indices past it still get
    /// picked, but smooth weighted sees them with no memory), whose random
    /// choices are fixed by `seed`.
    pub fn new(cfg: BalancerConfig, seed: u64, nodes: usize) -> Self {
        Self {
            cfg,
            last: AtomicUsize::new(NONE),
            current: (0..nodes).map(|_| AtomicI64::new(0)).collect(),
            rng: SharedRng::new(seed),
        }
    }

    pub fn config(&self) -> BalancerConfig {
        self.cfg
    }

    /// How many node indices the weighted state covers.
    pub fn capacity(&self) -> usize {
        self.current.len()
    }

    /// Forgets rotation and weighted state (after the node list changed).
    pub fn reset(&self) {
        self.last.store(NONE, Ordering::Relaxed);
        self.current
            .iter()
            .for_each(|c| c.store(0, Ordering::Relaxed));
    }

    /// Picks among all nodes. Returns an index into `nodes`, or `None` when no
    /// node is pickable. `key` is used by [`Algorithm::Sticky`] only.
    pub fn pick(
        &self,
        nodes: &[NodeView],
        key: Option<&[u8]>,
        scratch: &mut Vec<usize>,
    ) -> Option<usize> {
        scratch.clear();
        scratch.extend((0..nodes.len()).filter(|&i| nodes[i].pickable()));
        self.choose(nodes, key, scratch)
    }

    /// Picks among the nodes whose indices are in `allowed` (e.g. from
    /// [`RuleSet::select`](super::RuleSet::select)). Indices out of range and
    /// repeats are ignored.
    pub fn pick_in(
        &self,
        nodes: &[NodeView],
        allowed: &[usize],
        key: Option<&[u8]>,
        scratch: &mut Vec<usize>,
    ) -> Option<usize> {
        scratch.clear();
        scratch.extend(
            allowed
                .iter()
                .copied()
                .filter(|&i| nodes.get(i).is_some_and(NodeView::pickable)),
        );
        scratch.sort_unstable();
        scratch.dedup();
        self.choose(nodes, key, scratch)
    }

    fn choose(
        &self,
        nodes: &[NodeView],
        key: Option<&[u8]>,
        scratch: &mut Vec<usize>,
    ) -> Option<usize> {
        keep_priority_group(nodes, scratch, self.cfg.min_active);
        let candidates = &scratch[..];
        let picked = match candidates.len() {
            0 => return None,
            1 => candidates[0],
            _ => match (self.cfg.algorithm, key) {
                (Algorithm::RoundRobin, _) | (Algorithm::Sticky, None) => {
                    // Commits its own choice to `last`.
                    return Some(self.round_robin(nodes, candidates));
                }
                (Algorithm::Weighted, _) => self.smooth_weighted(nodes, candidates),
                (Algorithm::LeastOutstanding, _) => self.least_outstanding(nodes, candidates),
                (Algorithm::PeakEwma, _) => self.peak_ewma(nodes, candidates),
                (Algorithm::Sticky, Some(key)) => rendezvous(nodes, candidates, key),
            },
        };
        self.last.store(picked, Ordering::Relaxed);
        Some(picked)
    }

    /// Where the rotation starts after `last`: the first candidate above it,
    /// wrapping.
    fn rotation_start(candidates: &[usize], last: usize) -> usize {
        candidates
            .iter()
            .position(|&i| last == NONE || i > last)
            .unwrap_or(0)
    }

    /// The first candidate after the last pick, wrapping, that takes its
    /// turn: a node in slow start lets its turn pass with probability
    /// 1 − ramp. If every candidate lets it pass, the first one takes it.
    /// The pick moves `last` only if no other pick moved it meanwhile;
    /// otherwise it starts over from where that one left it.
    fn round_robin(&self, nodes: &[NodeView], candidates: &[usize]) -> usize {
        let n = candidates.len();
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let start = Self::rotation_start(candidates, last);
            let picked = (0..n)
                .map(|k| candidates[(start + k) % n])
                .find(|&i| self.takes_turn(&nodes[i]))
                .unwrap_or(candidates[start]);
            match self.last.compare_exchange_weak(
                last,
                picked,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return picked,
                Err(moved) => last = moved,
            }
        }
    }

    /// Does `node` take its round-robin turn? Always unless warming; a
    /// warming node with probability ramp. Draws only for warming nodes, so
    /// a pool at full strength uses no randomness.
    fn takes_turn(&self, node: &NodeView) -> bool {
        !node.warming() || self.rng.below(usize::from(RAMP_FULL)) < usize::from(node.ramp)
    }

    fn smooth_weighted(&self, nodes: &[NodeView], candidates: &[usize]) -> usize {
        let mut total: i64 = 0;
        let mut best = candidates[0];
        let mut best_current = i64::MIN;
        for &i in candidates {
            let w = i64::try_from(nodes[i].milli_weight()).unwrap_or(i64::MAX);
            total = total.saturating_add(w);
            let Some(current) = self.current.get(i) else {
                continue;
            };
            let now = current.fetch_add(w, Ordering::Relaxed).saturating_add(w);
            if now > best_current {
                best = i;
                best_current = now;
            }
        }
        if let Some(current) = self.current.get(best) {
            current.fetch_sub(total, Ordering::Relaxed);
        }
        best
    }

    fn least_outstanding(&self, nodes: &[NodeView], candidates: &[usize]) -> usize {
        // Scan in rotation order from after the last pick, so ties rotate.
        let start = Self::rotation_start(candidates, self.last.load(Ordering::Relaxed));
        let n = candidates.len();
        let mut best = candidates[start];
        for k in 1..n {
            let i = candidates[(start + k) % n];
            // (o_i+1)/w_i < (o_b+1)/w_b, cross-multiplied (all fit in u128).
            let lhs =
                (u128::from(nodes[i].outstanding) + 1) * u128::from(nodes[best].milli_weight());
            let rhs =
                (u128::from(nodes[best].outstanding) + 1) * u128::from(nodes[i].milli_weight());
            if lhs < rhs {
                best = i;
            }
        }
        best
    }

    fn peak_ewma(&self, nodes: &[NodeView], candidates: &[usize]) -> usize {
        let n = candidates.len();
        let a = self.rng.below(n);
        let mut b = self.rng.below(n - 1);
        if b >= a {
            b += 1;
        }
        let (a, b) = (candidates[a], candidates[b]);
        if ewma_cost(&nodes[a]) <= ewma_cost(&nodes[b]) {
            a
        } else {
            b
        }
    }
}

/// Narrows `candidates` to the highest priority group with at least
/// `min_active` members; leaves it whole if none has.
fn keep_priority_group(nodes: &[NodeView], candidates: &mut Vec<usize>, min_active: usize) {
    let min_active = min_active.max(1);
    // Exclusive upper bound on the priority being tried (u64: above any u32).
    let mut ceiling = u64::from(u32::MAX) + 1;
    loop {
        let Some(p) = candidates
            .iter()
            .map(|&i| nodes[i].priority)
            .filter(|&p| u64::from(p) < ceiling)
            .max()
        else {
            return; // no group qualifies: any pickable node
        };
        if ceiling > u64::from(u32::MAX) && candidates.iter().all(|&i| nodes[i].priority == p) {
            return; // a single group
        }
        let members = candidates
            .iter()
            .filter(|&&i| nodes[i].priority == p)
            .count();
        if members >= min_active {
            candidates.retain(|&i| nodes[i].priority == p);
            return;
        }
        ceiling = u64::from(p);
    }
}

fn ewma_cost(node: &NodeView) -> f64 {
    let latency = node.latency.as_nanos() as f64;
    // An idle node decays towards zero latency; keep a floor of 1 ns so
    // outstanding requests still count.
    latency.max(1.0) * (f64::from(node.outstanding) + 1.0) / (node.milli_weight().max(1) as f64)
}

/// The highest-scoring candidate for `key` that accepts it; a node in slow
/// start accepts only its ramp's share of keys. If none accepts (all
/// warming), the highest-scoring one.
fn rendezvous(nodes: &[NodeView], candidates: &[usize], key: &[u8]) -> usize {
    // Node ids are distinct, so equal scores (a 2^-64 event) are the only
    // tie; `>=` keeps the last, which is still deterministic.
    let mut top: Option<(u64, usize)> = None;
    let mut accepted: Option<(u64, usize)> = None;
    for &i in candidates {
        let score = stable_hash(&[nodes[i].id.as_bytes(), key]);
        if top.is_none_or(|(s, _)| score >= s) {
            top = Some((score, i));
        }
        if accepts_key(&nodes[i], key) && accepted.is_none_or(|(s, _)| score >= s) {
            accepted = Some((score, i));
        }
    }
    accepted.or(top).map_or(candidates[0], |(_, i)| i)
}

/// Does `node` take `key` at its ramp? A fixed draw per (node, key) in
/// 0..1000, so a key accepted at one ramp is accepted at every higher one.
fn accepts_key(node: &NodeView, key: &[u8]) -> bool {
    if !node.warming() {
        return true;
    }
    let draw = stable_hash(&[b"slow-start", node.id.as_bytes(), key]) % u64::from(RAMP_FULL);
    draw < u64::from(node.ramp)
}

/// A [`SharedBalancer`] with its scratch space, for one owner (tests, tools,
/// a single-threaded pool).
#[derive(Clone, Debug)]
pub struct Balancer {
    shared: SharedBalancer,
    /// Candidate indices of the current pick, ascending.
    scratch: Vec<usize>,
}

impl Balancer {
    /// A balancer whose random choices are fixed by `seed`.
    pub fn new(cfg: BalancerConfig, seed: u64) -> Self {
        Self::with_capacity(cfg, seed, 0)
    }

    /// Same, with scratch space for `nodes` nodes so no pick allocates.
    pub fn with_capacity(cfg: BalancerConfig, seed: u64, nodes: usize) -> Self {
        Self {
            shared: SharedBalancer::new(cfg, seed, nodes),
            scratch: Vec::with_capacity(nodes),
        }
    }

    pub fn config(&self) -> BalancerConfig {
        self.shared.cfg
    }

    /// Forgets rotation and weighted state (after the node list changed).
    pub fn reset(&mut self) {
        self.shared.reset();
    }

    /// Smooth weighted state sized to the pool: a pool of another size
    /// starts its schedule over.
    fn fit(&mut self, nodes: usize) {
        if self.shared.cfg.algorithm == Algorithm::Weighted && self.shared.current.len() != nodes {
            self.shared.current = (0..nodes).map(|_| AtomicI64::new(0)).collect();
        }
    }

    /// Picks among all nodes. Returns an index into `nodes`, or `None` when no
    /// node is pickable. `key` is used by [`Algorithm::Sticky`] only.
    pub fn pick(&mut self, nodes: &[NodeView], key: Option<&[u8]>) -> Option<usize> {
        self.fit(nodes.len());
        self.shared.pick(nodes, key, &mut self.scratch)
    }

    /// Picks among the nodes whose indices are in `allowed` (e.g. from
    /// [`RuleSet::select`](super::RuleSet::select)). Indices out of range and
    /// repeats are ignored.
    pub fn pick_in(
        &mut self,
        nodes: &[NodeView],
        allowed: &[usize],
        key: Option<&[u8]>,
    ) -> Option<usize> {
        self.fit(nodes.len());
        self.shared.pick_in(nodes, allowed, key, &mut self.scratch)
    }
}

#[cfg(test)]
mod tests;
