//! How long a request waits for its node, and what the switch does when it
//! has waited long enough: per flow, because networks give each flow a window
//! of its own (VISA stands in for an issuer after 10 s on POS and 25 s on
//! ATM), and a switch-made decline that comes before the network's own
//! stand-in pre-empts it.
//!
//! A [`TimeoutPolicy`] is the service's default (`timeouts.request`,
//! `timeouts.on_timeout`) plus rules by MTI pattern (`timeouts.by_mti`,
//! `"01x0"`: `x` is any digit). The most specific pattern that matches wins
//! (the one with the fewest `x`), so `"0100"` beats `"01x0"` beats `"0xx0"`
//! whatever order the file lists them in; patterns equally specific are
//! tried in text order.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rules::MtiPattern;

/// What the switch does when a request's deadline passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnTimeout {
    /// Answer the sender with the `timeout` decline (F39 68 by default).
    #[default]
    Decline,
    /// Answer nothing: the sender's own timer decides (a network's
    /// stand-in, a terminal's reversal). The request is still remembered as
    /// timed out, so a late approval is reversed.
    Silent,
}

/// The deadline and the action of one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeout {
    pub after: Duration,
    pub action: OnTimeout,
}

/// The timeouts of a service, by MTI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeoutPolicy {
    default: Timeout,
    /// Most specific first.
    rules: Vec<(MtiPattern, Timeout)>,
}

/// An MTI pattern that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an MTI pattern (four characters, each a digit or x)")]
pub struct BadPattern(pub String);

impl TimeoutPolicy {
    /// `rules` as `(pattern text, deadline, action)`, in any order.
    pub fn new<'a>(
        default: Timeout,
        rules: impl IntoIterator<Item = (&'a str, Timeout)>,
    ) -> Result<TimeoutPolicy, BadPattern> {
        let mut parsed = Vec::new();
        for (text, timeout) in rules {
            let pattern = MtiPattern::parse(text).ok_or_else(|| BadPattern(text.to_string()))?;
            let wild = text.bytes().filter(|b| matches!(b, b'x' | b'X')).count();
            parsed.push((wild, text.to_ascii_lowercase(), pattern, timeout));
        }
        parsed.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Ok(TimeoutPolicy {
            default,
            rules: parsed.into_iter().map(|(_, _, p, t)| (p, t)).collect(),
        })
    }

    /// One deadline and action for everything.
    pub fn uniform(default: Timeout) -> TimeoutPolicy {
        TimeoutPolicy {
            default,
            rules: Vec::new(),
        }
    }

    /// The timeout of a request with this MTI (four ASCII digits).
    #[inline]
    pub fn of(&self, mti: &[u8; 4]) -> Timeout {
        self.rules
            .iter()
            .find(|(p, _)| p.matches(mti))
            .map_or(self.default, |&(_, t)| t)
    }

    /// The service's default (`timeouts.request` and `timeouts.on_timeout`).
    pub fn default_timeout(&self) -> Timeout {
        self.default
    }

    /// The longest deadline any flow gets: how long a graceful stop waits.
    pub fn longest(&self) -> Duration {
        self.rules
            .iter()
            .map(|(_, t)| t.after)
            .fold(self.default.after, Duration::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64, action: OnTimeout) -> Timeout {
        Timeout {
            after: Duration::from_secs(secs),
            action,
        }
    }

    #[test]
    fn the_most_specific_pattern_wins_whatever_the_order() {
        let p = TimeoutPolicy::new(
            t(3, OnTimeout::Decline),
            [
                ("0xx0", t(7, OnTimeout::Decline)),
                ("01x0", t(10, OnTimeout::Silent)),
                ("0100", t(25, OnTimeout::Silent)),
                ("04x0", t(30, OnTimeout::Decline)),
            ],
        )
        .unwrap();
        assert_eq!(p.of(b"0100"), t(25, OnTimeout::Silent));
        assert_eq!(p.of(b"0120"), t(10, OnTimeout::Silent));
        assert_eq!(p.of(b"0200"), t(7, OnTimeout::Decline));
        assert_eq!(p.of(b"0420"), t(30, OnTimeout::Decline));
        assert_eq!(
            p.of(b"0201"),
            t(3, OnTimeout::Decline),
            "a repeat is its own MTI"
        );
        assert_eq!(p.longest(), Duration::from_secs(30));
    }

    #[test]
    fn a_bad_pattern_is_named() {
        let err = TimeoutPolicy::new(
            t(3, OnTimeout::Decline),
            [("01y0", t(1, OnTimeout::Silent))],
        )
        .unwrap_err();
        assert_eq!(err, BadPattern("01y0".into()));
    }
}
