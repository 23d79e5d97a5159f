//! `[service.timeouts]` per flow and `[service.integrity]`: what the switch
//! does when it answers for a node, and what it owes afterwards
//! (docs/integrity.md).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Reason, duration, invalid};
use crate::route::{OnTimeout, Timeout, TimeoutPolicy};

/// `[service.timeouts]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutConfig {
    /// A request unanswered this long is timed out (the default of every
    /// flow).
    #[serde(default = "defaults::request_timeout", with = "duration")]
    pub request: Duration,
    /// What the switch does then: `decline` (F39 of `declines.timeout`) or
    /// `silent` (the sender's own timer decides).
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Per MTI pattern (`"01x0"`, `x` any digit): a deadline (`"10s"`) or a
    /// table (`{ after = "25s", on_timeout = "silent" }`). The most specific
    /// pattern wins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_mti: BTreeMap<String, TimeoutRule>,
    /// Simplex and duplex fronts: what the switch does when a node's own
    /// request to the peer times out (same deadlines). `silent` by default:
    /// the peer may answer on a link another switch instance holds, and
    /// only the node can know it was answered.
    #[serde(default = "defaults::node_on_timeout")]
    pub node_on_timeout: OnTimeout,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        TimeoutConfig {
            request: defaults::request_timeout(),
            on_timeout: OnTimeout::default(),
            by_mti: BTreeMap::new(),
            node_on_timeout: defaults::node_on_timeout(),
        }
    }
}

/// One `by_mti` entry: a deadline, or a deadline and an action.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TimeoutRule {
    After(#[serde(with = "duration")] Duration),
    Full {
        #[serde(with = "duration")]
        after: Duration,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        on_timeout: Option<OnTimeout>,
    },
}

impl TimeoutConfig {
    /// The policy of requests from the front (`node = false`) or of a node's
    /// own requests to the peer (`node = true`).
    pub fn policy(&self, node: bool) -> Result<TimeoutPolicy, ConfigError> {
        let action = if node {
            self.node_on_timeout
        } else {
            self.on_timeout
        };
        let default = Timeout {
            after: self.request,
            action,
        };
        let rules = self.by_mti.iter().map(|(pattern, rule)| {
            let timeout = match *rule {
                TimeoutRule::After(after) => Timeout { after, action },
                TimeoutRule::Full { after, on_timeout } => Timeout {
                    after,
                    action: on_timeout.unwrap_or(action),
                },
            };
            (pattern.as_str(), timeout)
        });
        TimeoutPolicy::new(default, rules)
            .map_err(|e| invalid(format!("timeouts.by_mti.{}", e.0), e))
    }

    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if self.request.is_zero() {
            return Err(invalid(format!("{key}.request"), "must be > 0"));
        }
        for (pattern, rule) in &self.by_mti {
            let key = format!("{key}.by_mti.{pattern}");
            if crate::route::MtiPattern::parse(pattern).is_none() {
                return Err(invalid(
                    key,
                    "not an MTI pattern: four characters, each a digit or x, such as 01x0",
                ));
            }
            let after = match rule {
                TimeoutRule::After(a) | TimeoutRule::Full { after: a, .. } => *a,
            };
            if after.is_zero() {
                return Err(invalid(key, "must be > 0"));
            }
        }
        Ok(())
    }
}

/// `[service.integrity]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IntegrityConfig {
    /// A node's approval that comes after the switch answered for it:
    /// `reverse` (a reversal advice to the node, held in store-and-forward
    /// until acknowledged) or `log` (counted and logged only).
    #[serde(default)]
    pub late_approval: LateApproval,
    /// Whether the switch stores a reversal at once whenever it declines or
    /// stays silent for an approvable request whose outcome at the host is
    /// unknown (a timeout, a node connection lost, a shutdown): an acquirer's
    /// timeout reversal. A late answer attaches to it. With `false`, only a
    /// late approval the switch reads is reversed. Needs
    /// `late_approval = "reverse"` and a store.
    #[serde(default = "defaults::timeout_reversal")]
    pub timeout_reversal: bool,
    /// How long a timeout reversal waits in the store before it is first
    /// sent: the host's late answer in that time completes it (an
    /// approval's F38 and amount) or cancels it (a decline: nothing to
    /// reverse, recorded and never sent). Durable from the start either way.
    #[serde(default = "defaults::timeout_reversal_hold", with = "duration")]
    pub timeout_reversal_hold: Duration,
    /// How long a request the switch answered for its node is remembered.
    #[serde(default = "defaults::late_window", with = "duration")]
    pub late_window: Duration,
    /// The most requests remembered at once; past it, new ones are not (and
    /// are counted).
    #[serde(default = "defaults::late_capacity")]
    pub late_capacity: usize,
    /// F39 codes that approve; absent: the dialect's (`[integrity]` of the
    /// spec, `00`, `10`, `11` in the shipped ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_codes: Option<Vec<String>>,
    /// Advices (0120/0220/0420) from the front: `forward` (the switch never
    /// answers one itself: with no node or on a timeout it stays silent and
    /// the sender repeats) or `store-and-forward` (stored durably, then
    /// acknowledged by the switch, then delivered to a node with repeats).
    #[serde(default)]
    pub advices: Advices,
    /// A repeat (0201, 0401, 0421) of a request sent within this long goes
    /// to the node that had the original. `0s` turns it off.
    #[serde(default = "defaults::repeat_window", with = "duration")]
    pub repeat_window: Duration,
    /// The most requests remembered for repeats.
    #[serde(default = "defaults::repeat_capacity")]
    pub repeat_capacity: usize,
    /// Whether the switch may answer for a node at all: `answer` (declines
    /// and acknowledgements as configured) or `silent` (never: for links
    /// whose messages carry a MAC the switch cannot make).
    #[serde(default)]
    pub switch_made: SwitchMadePolicy,
    /// Simplex and duplex fronts: the nodes that own the institution's keys,
    /// by ID, in order of preference. The peer's key exchange and cut-over
    /// (the spec's `[integrity] institution_f70`) go to the first of them
    /// that is up, never balanced: a key reset must land on the host that
    /// keeps the keys, and always the same one while it is up, or hosts
    /// would hold different working keys. Empty (the default): every node,
    /// in the order `[service.back]` lists them, so the first listed
    /// healthy node owns the keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_nodes: Vec<String>,
    /// A request (0100, 0200 and their advices' originals, not a repeat)
    /// whose correlation key and `duplicate_fields` match one answered
    /// within this long is a duplicate: it never reaches a node, and gets
    /// `duplicates`. One that matches a request still in flight waits for
    /// that request's answer. `0s` turns it off.
    #[serde(default = "defaults::duplicate_window", with = "duration")]
    pub duplicate_window: Duration,
    /// What a duplicate gets: `replay` (the first answer, as it was sent;
    /// 94 when that answer came from the switch or is no longer held) or
    /// `decline` (94, "duplicate transmission").
    #[serde(default)]
    pub duplicates: DuplicateAction,
    /// The fields that make two requests with one correlation key the same
    /// transaction.
    #[serde(default = "defaults::duplicate_fields")]
    pub duplicate_fields: Vec<u16>,
    /// The most requests remembered for duplicates.
    #[serde(default = "defaults::duplicate_capacity")]
    pub duplicate_capacity: usize,
    /// Bytes of answers held for replay, in all (a ring: the oldest are
    /// written over, and their duplicates declined instead).
    #[serde(default = "defaults::duplicate_replay_bytes")]
    pub duplicate_replay_bytes: usize,
}

impl Default for IntegrityConfig {
    fn default() -> Self {
        IntegrityConfig {
            late_approval: LateApproval::default(),
            timeout_reversal: defaults::timeout_reversal(),
            timeout_reversal_hold: defaults::timeout_reversal_hold(),
            late_window: defaults::late_window(),
            late_capacity: defaults::late_capacity(),
            approval_codes: None,
            advices: Advices::default(),
            repeat_window: defaults::repeat_window(),
            repeat_capacity: defaults::repeat_capacity(),
            switch_made: SwitchMadePolicy::default(),
            key_nodes: Vec::new(),
            duplicate_window: defaults::duplicate_window(),
            duplicates: DuplicateAction::default(),
            duplicate_fields: defaults::duplicate_fields(),
            duplicate_capacity: defaults::duplicate_capacity(),
            duplicate_replay_bytes: defaults::duplicate_replay_bytes(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LateApproval {
    #[default]
    Reverse,
    Log,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Advices {
    #[default]
    Forward,
    StoreAndForward,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DuplicateAction {
    #[default]
    Replay,
    Decline,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SwitchMadePolicy {
    #[default]
    Answer,
    Silent,
}

impl IntegrityConfig {
    /// `node_ids`: the IDs of the service's nodes, which `key_nodes` must
    /// name.
    pub(super) fn validate(&self, key: &str, node_ids: &[&str]) -> Result<(), ConfigError> {
        for (i, id) in self.key_nodes.iter().enumerate() {
            let key = format!("{key}.key_nodes[{i}]");
            if !node_ids.contains(&id.as_str()) {
                return Err(invalid(key, Reason::UnknownNode(id.clone())));
            }
            if self.key_nodes[..i].contains(id) {
                return Err(invalid(key, Reason::ListedTwice(id.clone())));
            }
        }
        if let Some(codes) = &self.approval_codes {
            if codes.is_empty() {
                return Err(invalid(
                    format!("{key}.approval_codes"),
                    "empty: no answer would ever approve; leave it out for the dialect's",
                ));
            }
            for (i, c) in codes.iter().enumerate() {
                if c.len() != 2 || !c.bytes().all(|b| b.is_ascii_alphanumeric()) {
                    return Err(invalid(
                        format!("{key}.approval_codes[{i}]"),
                        Reason::NotAResponseCode(c.clone()),
                    ));
                }
            }
        }
        if self.late_capacity == 0 {
            return Err(invalid(format!("{key}.late_capacity"), "must be > 0"));
        }
        if self.repeat_capacity == 0 {
            return Err(invalid(format!("{key}.repeat_capacity"), "must be > 0"));
        }
        if self.duplicate_capacity == 0 {
            return Err(invalid(format!("{key}.duplicate_capacity"), "must be > 0"));
        }
        if !self.duplicate_window.is_zero() && self.duplicate_fields.is_empty() {
            return Err(invalid(
                format!("{key}.duplicate_fields"),
                "empty: every request with one correlation key would be the same; set duplicate_window = \"0s\" to turn duplicates off",
            ));
        }
        for (i, &id) in self.duplicate_fields.iter().enumerate() {
            if !(2..=128).contains(&id) {
                return Err(invalid(
                    format!("{key}.duplicate_fields[{i}]"),
                    Reason::NotADataField(id),
                ));
            }
        }
        Ok(())
    }
}

mod defaults {
    use std::time::Duration;

    pub fn timeout_reversal() -> bool {
        true
    }

    pub fn timeout_reversal_hold() -> Duration {
        Duration::from_secs(2)
    }

    use crate::route::OnTimeout;

    pub fn request_timeout() -> Duration {
        Duration::from_secs(3)
    }
    pub fn node_on_timeout() -> OnTimeout {
        OnTimeout::Silent
    }
    pub fn late_window() -> Duration {
        Duration::from_secs(300)
    }
    pub fn late_capacity() -> usize {
        100_000
    }
    pub fn repeat_window() -> Duration {
        Duration::from_secs(30)
    }
    pub fn repeat_capacity() -> usize {
        1_000_000
    }
    pub fn duplicate_window() -> Duration {
        Duration::from_secs(300)
    }
    pub fn duplicate_fields() -> Vec<u16> {
        vec![7, 11, 32, 33, 41]
    }
    pub fn duplicate_capacity() -> usize {
        1_000_000
    }
    pub fn duplicate_replay_bytes() -> usize {
        64 << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_mti_takes_a_deadline_or_a_table() {
        let t: TimeoutConfig = toml::from_str(
            "request = \"3s\"\nby_mti = { \"01x0\" = \"10s\", \"0100\" = { after = \"25s\", on_timeout = \"silent\" } }",
        )
        .unwrap();
        let p = t.policy(false).unwrap();
        assert_eq!(
            p.of(b"0100"),
            Timeout {
                after: Duration::from_secs(25),
                action: OnTimeout::Silent
            }
        );
        assert_eq!(
            p.of(b"0120"),
            Timeout {
                after: Duration::from_secs(10),
                action: OnTimeout::Decline
            }
        );
        assert_eq!(p.of(b"0200").after, Duration::from_secs(3));
        assert_eq!(
            t.policy(true).unwrap().of(b"0200").action,
            OnTimeout::Silent,
            "node requests are silent by default"
        );
    }

    #[test]
    fn bad_patterns_and_zero_deadlines_are_named() {
        let t: TimeoutConfig = toml::from_str("by_mti = { \"01y0\" = \"10s\" }").unwrap();
        let err = t.validate("service[0].timeouts").unwrap_err().to_string();
        assert!(err.contains("by_mti.01y0"), "{err}");
        let t: TimeoutConfig = toml::from_str("by_mti = { \"0100\" = \"0s\" }").unwrap();
        let err = t.validate("service[0].timeouts").unwrap_err().to_string();
        assert!(
            err.starts_with("service[0].timeouts.by_mti.0100: must be > 0"),
            "{err}"
        );
    }

    #[test]
    fn integrity_defaults_and_refusals() {
        let i: IntegrityConfig = toml::from_str("").unwrap();
        assert_eq!(i.late_approval, LateApproval::Reverse);
        assert_eq!(i.advices, Advices::Forward);
        assert_eq!(i.late_window, Duration::from_secs(300));
        let i: IntegrityConfig = toml::from_str("approval_codes = [\"00\", \"0\"]").unwrap();
        let err = i
            .validate("service[0].integrity", &["01"])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("service[0].integrity.approval_codes[1]"),
            "{err}"
        );
        assert!(toml::from_str::<IntegrityConfig>("advices = \"store-and-forward\"").is_ok());
    }

    #[test]
    fn key_nodes_default_to_every_node_and_must_name_nodes() {
        let i: IntegrityConfig = toml::from_str("").unwrap();
        assert!(i.key_nodes.is_empty(), "empty: every node, in order");
        let i: IntegrityConfig = toml::from_str("key_nodes = [\"02\", \"01\"]").unwrap();
        assert!(i.validate("service[0].integrity", &["01", "02"]).is_ok());
        let i: IntegrityConfig = toml::from_str("key_nodes = [\"01\", \"09\"]").unwrap();
        let err = i
            .validate("service[0].integrity", &["01", "02"])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("service[0].integrity.key_nodes[1]: `09`"),
            "{err}"
        );
        let i: IntegrityConfig = toml::from_str("key_nodes = [\"01\", \"01\"]").unwrap();
        let err = i
            .validate("service[0].integrity", &["01"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key_nodes[1]") && err.contains("twice"),
            "{err}"
        );
    }
}
