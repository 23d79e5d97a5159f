//! A tiny seeded pseudo-random generator (SplitMix64) and a stable 64-bit hash.
//!
//! `route/` takes no entropy from the environment: whoever builds a
//! [`Balancer`](super::Balancer) passes a seed, so a test replays exactly the
//! same choices. Not cryptographic; good enough for power-of-two choices and
//! for spreading timers with jitter.

use std::time::Duration;

/// SplitMix64 (Steele, Lea, Flood 2014): one add and a three-step mix per draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

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
    /// A generator whose whole future is fixed by `seed`.
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

#[cfg(test)]
mod tests {
    use super::*;

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
