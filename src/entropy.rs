//! Seeds from the clock, for processes that want different runs to differ
//! (the pure crates take every seed as an argument, so tests replay exactly).
//! Reached as `crate::util::rng::entropy_seed`.

use std::sync::atomic::{AtomicU64, Ordering};

use isoswitch_util::rng::{GOLDEN, Rng, mix64};

/// A seed that differs per call and per run: the clock's nanoseconds mixed
/// with a process-wide counter (two calls in the same nanosecond still
/// differ). For processes only; tests pass fixed seeds.
pub fn entropy_seed() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    mix64(nanos ^ mix64(CALLS.fetch_add(1, Ordering::Relaxed).wrapping_add(GOLDEN)))
}

/// A generator seeded by [`entropy_seed`]: different every time.
pub fn rng_from_entropy() -> Rng {
    Rng::new(entropy_seed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_seeds_differ() {
        let seeds: std::collections::HashSet<u64> = (0..100).map(|_| entropy_seed()).collect();
        assert_eq!(seeds.len(), 100);
    }
}
