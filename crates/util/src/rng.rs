//! The one pseudo-random generator of isoswitch (SplitMix64) and a stable
//! 64-bit hash.
//!
//! Every random choice in the tree draws from an [`Rng`]: the balancer's
//! power-of-two choices and slow-start ramp, reconnect jitter, the simulators'
//! delays, fail rates and message mix. An `Rng` takes no entropy from the
//! environment: whoever builds one passes a seed, so a test replays exactly
//! the same choices. Only a process that wants different runs to differ asks
//! the switch's `util::rng::entropy_seed` (it reads the clock: not here). Not cryptographic: nothing here guards a
//! secret.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// SplitMix64 (Steele, Lea, Flood 2014): one add and a three-step mix per draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

/// The golden-ratio increment of SplitMix64 (2^64 / φ).
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijective avalanche mix of 64 bits.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable hash of a sequence of byte parts (FNV-1a, then [`mix64`]).
///
/// Stable across processes, builds and machines (unlike std's `RandomState`),
/// so two switch instances hash a sticky key to the same node. Each part is
/// followed by its length so `("ab","c")` and `("a","bc")` differ.
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
        h ^= part.len() as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(h)
}

impl Rng {
    /// A generator whose whole future is fixed by `seed` (any value, 0 too).
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// A number in `0..n` (Lemire's multiply-shift; bias below 2^-32 for any
    /// `n` a node pool can have). Returns 0 when `n` is 0.
    #[inline]
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// A number in `0..n` for a 64-bit range (Lemire's multiply-shift, bias
    /// below `n / 2^64`). Returns 0 when `n` is 0.
    #[inline]
    pub fn below_u64(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p` (`p <= 0` or NaN: never; `p >= 1`: always).
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A uniform duration in `[lo, hi]`, to the microsecond; `lo` when the
    /// range is empty or reversed.
    pub fn duration_between(&mut self, lo: Duration, hi: Duration) -> Duration {
        if hi <= lo {
            return lo;
        }
        let span = u64::try_from((hi - lo).as_micros()).unwrap_or(u64::MAX);
        lo + Duration::from_micros(self.below_u64(span.saturating_add(1)))
    }

    /// A float in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `base` scaled by a uniform factor in `[1 - ratio, 1 + ratio]`; `ratio`
    /// is clamped to `[0, 1]` (a NaN ratio counts as 0). Used to spread health
    /// checks and reconnects so nodes are not hit in lock-step.
    pub fn jitter(&mut self, base: Duration, ratio: f64) -> Duration {
        let ratio = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        let factor = 1.0 - ratio + 2.0 * ratio * self.unit();
        Duration::try_from_secs_f64(base.as_secs_f64() * factor).unwrap_or(base)
    }
}

/// The same SplitMix64 stream as [`Rng`], drawn from any number of threads
/// at once without a lock: SplitMix64's state only ever advances by a fixed
/// step, so one atomic add hands each draw its own state. Seeded alike, the
/// draws are those of an [`Rng`] (in whatever order the threads take them).
#[derive(Debug)]
pub struct SharedRng {
    state: AtomicU64,
}

impl SharedRng {
    pub fn new(seed: u64) -> Self {
        Self {
            state: AtomicU64::new(seed),
        }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&self) -> u64 {
        mix64(
            self.state
                .fetch_add(GOLDEN, Ordering::Relaxed)
                .wrapping_add(GOLDEN),
        )
    }

    /// A number in `0..n`, as [`Rng::below`].
    #[inline]
    pub fn below(&self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

impl Clone for SharedRng {
    fn clone(&self) -> Self {
        Self::new(self.state.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_rng_draws_the_same_stream() {
        let mut a = Rng::new(7);
        let b = SharedRng::new(7);
        for n in [1usize, 2, 3, 10, 1000] {
            assert_eq!(a.next_u64(), b.next_u64());
            assert_eq!(a.below(n), b.below(n));
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::new(7);
        let mut seen = [0u32; 5];
        for _ in 0..5000 {
            let x = r.below(5);
            assert!(x < 5);
            seen[x] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn pinned_sequence() {
        // SplitMix64 from seed 0: the published reference values. A change
        // here changes every seeded test and every replayed simulation.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn below_u64_unit_and_chance_stay_in_range() {
        let mut r = Rng::new(11);
        for n in [1u64, 2, 3, 1000, u64::MAX] {
            for _ in 0..1000 {
                assert!(r.below_u64(n) < n);
            }
        }
        assert_eq!(r.below_u64(0), 0);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
        assert!((0..1000).all(|_| !r.chance(0.0) && r.chance(1.0) && !r.chance(f64::NAN)));
        let hits = (0..10_000).filter(|_| r.chance(0.25)).count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
    }

    #[test]
    fn duration_between_stays_in_range() {
        let mut r = Rng::new(5);
        let (lo, hi) = (Duration::from_millis(10), Duration::from_millis(200));
        let mut seen_low = false;
        for _ in 0..10_000 {
            let d = r.duration_between(lo, hi);
            assert!(d >= lo && d <= hi, "{d:?}");
            seen_low |= d < Duration::from_millis(20);
        }
        assert!(seen_low);
        assert_eq!(r.duration_between(hi, lo), hi);
        assert_eq!(r.duration_between(lo, lo), lo);
    }

    #[test]
    fn jitter_stays_within_ratio() {
        let mut r = Rng::new(3);
        let base = Duration::from_secs(10);
        for _ in 0..1000 {
            let d = r.jitter(base, 0.2);
            assert!(
                d >= Duration::from_secs(8) && d <= Duration::from_secs(12),
                "{d:?}"
            );
        }
        assert_eq!(r.jitter(base, 0.0), base);
        assert_eq!(r.jitter(base, f64::NAN), base);
        assert!(r.jitter(base, 5.0) <= Duration::from_secs(20));
    }

    #[test]
    fn stable_hash_separates_parts_and_is_fixed() {
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        assert_eq!(stable_hash(&[b"01", b"key"]), stable_hash(&[b"01", b"key"]));
        // Pinned so a change of the function (which would move every sticky
        // key in a rolling upgrade) is a deliberate one.
        assert_eq!(stable_hash(&[]), mix64(0xCBF2_9CE4_8422_2325));
    }
}
