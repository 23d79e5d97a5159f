//! When to try an owed message again, when to give up, and what MTI a repeat
//! carries. Pure: times come in as arguments, so tests use fake clocks.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::rows::ClaimedSaf;
use super::saf::UnixMillis;
use crate::util::duration;

/// `[store.saf]`: retry timing and limits for store-and-forward delivery.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SafPolicy {
    /// Wait after the first failed attempt; doubles after each further one.
    #[serde(default = "defaults::retry", with = "duration")]
    pub retry: Duration,
    /// The longest wait between two attempts (the backoff's cap).
    #[serde(default = "defaults::retry_max", with = "duration")]
    pub retry_max: Duration,
    /// No attempt starts this long after the entry was stored: it becomes a
    /// dead letter.
    #[serde(default = "defaults::max_age", with = "duration")]
    pub max_age: Duration,
    /// Attempts after which an entry is a dead letter (none: only `max_age`).
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// How long one instance holds an entry for one attempt; another instance
    /// may take it after that (the holder died). Longer than a send plus the
    /// wait for its answer.
    #[serde(default = "defaults::lease", with = "duration")]
    pub lease: Duration,
    /// Delivered and dropped entries are deleted this long after they were
    /// completed: the history an operator can list. Pending entries and
    /// dead letters are never deleted by age.
    #[serde(default = "defaults::keep", with = "duration")]
    pub keep: Duration,
}

mod defaults {
    use std::time::Duration;
    pub fn retry() -> Duration {
        Duration::from_secs(30)
    }
    pub fn retry_max() -> Duration {
        Duration::from_secs(600)
    }
    pub fn max_age() -> Duration {
        Duration::from_secs(24 * 3600)
    }
    pub fn lease() -> Duration {
        Duration::from_secs(60)
    }
    pub fn keep() -> Duration {
        Duration::from_secs(7 * 24 * 3600)
    }
}

impl Default for SafPolicy {
    fn default() -> Self {
        SafPolicy {
            retry: defaults::retry(),
            retry_max: defaults::retry_max(),
            max_age: defaults::max_age(),
            max_attempts: None,
            lease: defaults::lease(),
            keep: defaults::keep(),
        }
    }
}

/// What to do with an entry whose attempt failed (no answer, link down).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try again at this time.
    RetryAt(UnixMillis),
    /// Park it as a dead letter, for this reason.
    Dead(String),
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl SafPolicy {
    pub fn validate(&self) -> Result<(), StoreError> {
        let bad = |key, reason: &str| {
            Err(StoreError::BadConfig {
                key,
                reason: reason.to_string(),
            })
        };
        if self.retry.is_zero() {
            return bad("store.saf.retry", "must be more than 0s");
        }
        if self.retry_max < self.retry {
            return bad("store.saf.retry_max", "must be at least store.saf.retry");
        }
        if self.max_age.is_zero() {
            return bad("store.saf.max_age", "must be more than 0s");
        }
        if self.max_attempts == Some(0) {
            return bad("store.saf.max_attempts", "must be at least 1");
        }
        if self.lease.is_zero() {
            return bad("store.saf.lease", "must be more than 0s");
        }
        if self.keep.is_zero() {
            return bad("store.saf.keep", "must be more than 0s");
        }
        Ok(())
    }

    /// The max-age deadline of an entry stored at `created_at`.
    pub fn expires_at(&self, created_at: UnixMillis) -> UnixMillis {
        created_at.saturating_add(millis(self.max_age))
    }

    /// Entries completed before this, as of `now`, are past `keep`.
    pub fn prune_before(&self, now: UnixMillis) -> UnixMillis {
        now.saturating_sub(millis(self.keep))
    }

    /// Until when a lease taken at `now` holds.
    pub fn lease_until(&self, now: UnixMillis) -> UnixMillis {
        now.saturating_add(millis(self.lease))
    }

    /// The wait after attempt `attempt` (from 1) failed: `retry`, doubled
    /// for each attempt after the first, at most `retry_max`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        self.retry
            .checked_mul(1u32 << doublings.min(31))
            .map_or(self.retry_max, |d| d.min(self.retry_max))
    }

    /// After attempt `attempt` failed at `now`: when to try again, or dead
    /// when the attempts are used up or the next one would start past the
    /// deadline.
    pub fn after_failure(
        &self,
        attempt: u32,
        now: UnixMillis,
        expires_at: UnixMillis,
    ) -> AfterFailure {
        if let Some(max) = self.max_attempts
            && attempt >= max
        {
            return AfterFailure::Dead(format!("{attempt} attempts (store.saf.max_attempts)"));
        }
        let next = now.saturating_add(millis(self.backoff(attempt)));
        if next >= expires_at {
            return AfterFailure::Dead(format!(
                "max age {} reached after {attempt} attempts (store.saf.max_age)",
                duration::format(self.max_age)
            ));
        }
        AfterFailure::RetryAt(next)
    }

    /// Before sending a claimed entry at `now`: the dead-letter reason if it
    /// must not go out (past its deadline, or attempts used up, e.g. after a
    /// claim by an instance that then died).
    pub fn refuse_send(&self, entry: &ClaimedSaf, now: UnixMillis) -> Option<String> {
        if now >= entry.expires_at {
            return Some(format!(
                "max age {} reached before attempt {} (store.saf.max_age)",
                duration::format(self.max_age),
                entry.attempt
            ));
        }
        match self.max_attempts {
            Some(max) if entry.attempt > max => {
                Some(format!("{max} attempts (store.saf.max_attempts)"))
            }
            _ => None,
        }
    }
}

/// An MTI that cannot be turned into its repeat.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("mti `{mti}`: {reason}")]
pub struct MtiError {
    pub mti: String,
    pub reason: &'static str,
}

/// The MTI of a repeat: the last digit (ISO 8583:1987 "message origin") goes
/// from an original to its repeat, 0 -> 1 (acquirer), 2 -> 3 (issuer),
/// 4 -> 5 (other): `0420` -> `0421`, `0120` -> `0121`, `0220` -> `0221`. An MTI
/// that already is a repeat stays as it is. Works on the 4-character text;
/// ASCII or BCD on the wire is the caller's business.
pub fn repeat_mti(mti: &str) -> Result<String, MtiError> {
    let refuse = |reason| MtiError {
        mti: mti.to_string(),
        reason,
    };
    let bytes = mti.as_bytes();
    if bytes.len() != 4 || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(refuse("not 4 digits"));
    }
    let repeat = match bytes[3] {
        b'0' => b'1',
        b'2' => b'3',
        b'4' => b'5',
        d @ (b'1' | b'3' | b'5') => d,
        _ => return Err(refuse("origin digit is not 0-5")),
    };
    Ok(format!("{}{}", &mti[..3], char::from(repeat)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::saf::{Direction, SafId, SafKind};

    const S: i64 = 1_000;

    fn policy() -> SafPolicy {
        SafPolicy {
            retry: Duration::from_secs(10),
            retry_max: Duration::from_secs(60),
            max_age: Duration::from_secs(300),
            max_attempts: None,
            lease: Duration::from_secs(20),
            keep: Duration::from_secs(3600),
        }
    }

    #[test]
    fn history_is_kept_for_keep_and_keep_is_never_zero() {
        let p = policy();
        assert_eq!(p.prune_before(10_000 * S), 6_400 * S);
        assert_eq!(
            p.prune_before(0),
            -3_600 * S,
            "nothing completed is that old"
        );
        let zero = SafPolicy {
            keep: Duration::ZERO,
            ..p
        };
        let e = zero.validate().unwrap_err().to_string();
        assert!(e.contains("store.saf.keep"), "{e}");
        assert_eq!(
            SafPolicy::default().keep,
            Duration::from_secs(7 * 24 * 3600)
        );
    }

    fn claimed(attempt: u32, expires_at: UnixMillis) -> ClaimedSaf {
        ClaimedSaf {
            id: SafId(1),
            service: "cups".into(),
            direction: Direction::ToPeer,
            kind: SafKind::Reversal,
            mti: "0420".into(),
            payload: vec![0],
            attempt,
            created_at: 0,
            expires_at,
            lease_until: 0,
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = policy();
        let waits: Vec<u64> = (1..=6).map(|a| p.backoff(a).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 60, 60, 60]);
        assert_eq!(p.backoff(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn a_failure_is_retried_after_the_backoff() {
        let p = policy();
        let expires = p.expires_at(0);
        assert_eq!(expires, 300 * S);
        assert_eq!(
            p.after_failure(1, 5 * S, expires),
            AfterFailure::RetryAt(15 * S)
        );
        assert_eq!(
            p.after_failure(3, 100 * S, expires),
            AfterFailure::RetryAt(140 * S)
        );
    }

    #[test]
    fn an_attempt_that_would_start_past_the_deadline_makes_it_dead() {
        let p = policy();
        let expires = p.expires_at(0);
        assert_eq!(
            p.after_failure(5, 239 * S, expires),
            AfterFailure::RetryAt(299 * S)
        );
        assert!(
            matches!(p.after_failure(5, 240 * S, expires), AfterFailure::Dead(r) if r.contains("max age 5m"))
        );
    }

    #[test]
    fn max_attempts_makes_it_dead() {
        let p = SafPolicy {
            max_attempts: Some(3),
            ..policy()
        };
        assert!(matches!(
            p.after_failure(2, 0, 300 * S),
            AfterFailure::RetryAt(_)
        ));
        assert!(
            matches!(p.after_failure(3, 0, 300 * S), AfterFailure::Dead(r) if r.contains("3 attempts"))
        );
        assert!(p.refuse_send(&claimed(3, 300 * S), 0).is_none());
        assert!(p.refuse_send(&claimed(4, 300 * S), 0).is_some());
    }

    #[test]
    fn nothing_is_sent_past_the_deadline() {
        let p = policy();
        assert!(p.refuse_send(&claimed(2, 300 * S), 300 * S - 1).is_none());
        assert!(p.refuse_send(&claimed(2, 300 * S), 300 * S).is_some());
    }

    #[test]
    fn the_lease_runs_from_now() {
        assert_eq!(policy().lease_until(7 * S), 27 * S);
    }

    #[test]
    fn repeats_set_the_origin_digit() {
        for (original, repeat) in [
            ("0420", "0421"),
            ("0120", "0121"),
            ("0220", "0221"),
            ("0422", "0423"),
            ("0421", "0421"),
        ] {
            assert_eq!(repeat_mti(original).as_deref(), Ok(repeat));
        }
        assert_eq!(
            repeat_mti("0426").map_err(|e| e.reason),
            Err("origin digit is not 0-5")
        );
        assert_eq!(repeat_mti("042").map_err(|e| e.reason), Err("not 4 digits"));
        assert_eq!(
            repeat_mti("04A0").map_err(|e| e.reason),
            Err("not 4 digits")
        );
    }

    #[test]
    fn validation_names_the_key() {
        let p = SafPolicy {
            retry_max: Duration::from_secs(1),
            ..policy()
        };
        assert!(matches!(
            p.validate(),
            Err(StoreError::BadConfig {
                key: "store.saf.retry_max",
                ..
            })
        ));
        assert!(policy().validate().is_ok());
        assert!(SafPolicy::default().validate().is_ok());
    }
}
