//! Directed routing: send some messages only to some nodes.
//!
//! A rule matches on the MTI (exact, or a pattern with `x` for any digit:
//! `"02xx"`) and/or on field prefixes (F3 starting with `"31"`); every
//! condition given must hold. It names the node ids allowed. Rules are tried
//! in order and the first match wins; when none matches, every node is
//! allowed. A matched rule is binding: if none of its nodes is pickable the
//! request is declined rather than sent elsewhere.
//!
//! Field values are compared as the caller's accessor returns them: give it
//! the field's value in its textual form (ASCII digits for `n` fields), without
//! any length prefix. An empty prefix matches any value: "field present".
//!
//! ```toml
//! [[rules]]
//! mti = "02xx"
//! fields = [{ field = 3, prefix = "31" }]   # balance inquiry
//! nodes = ["03"]
//! ```

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::node::NodeId;

/// One rule as written in config.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// `"0200"` or a pattern such as `"02xx"` / `"x8x0"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mti: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldPrefix>,
    /// Node ids that may receive the matching messages.
    pub nodes: Vec<NodeId>,
}

/// "Field `field` starts with `prefix`."
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FieldPrefix {
    pub field: u16,
    pub prefix: String,
}

/// A rule that cannot be compiled; `rule` is its 0-based position.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RuleError {
    #[error("rules[{rule}].mti `{value}` is not 4 characters of digits or `x`")]
    BadMti { rule: usize, value: String },
    #[error("rules[{rule}].fields: field {field} is out of range 2..=192")]
    BadField { rule: usize, field: u16 },
    #[error("rules[{rule}].nodes is empty")]
    NoNodes { rule: usize },
    #[error("rules[{rule}].nodes names `{node}`, which is not a node of this pool")]
    UnknownNode { rule: usize, node: NodeId },
}

/// An MTI pattern: each position a digit or any (`x`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MtiPattern([Option<u8>; 4]);

impl MtiPattern {
    /// Parses `"0200"`, `"02xx"`, `"x8x0"` (`X` works too).
    pub fn parse(text: &str) -> Option<Self> {
        let b = text.as_bytes();
        if b.len() != 4 {
            return None;
        }
        let mut out = [None; 4];
        for (slot, &c) in out.iter_mut().zip(b) {
            *slot = match c {
                b'0'..=b'9' => Some(c),
                b'x' | b'X' => None,
                _ => return None,
            };
        }
        Some(Self(out))
    }

    #[inline]
    pub fn matches(&self, mti: &[u8; 4]) -> bool {
        self.0
            .iter()
            .zip(mti)
            .all(|(want, got)| want.is_none_or(|w| w == *got))
    }
}

#[derive(Clone, Debug)]
struct Rule {
    mti: Option<MtiPattern>,
    fields: Vec<(u16, Box<[u8]>)>,
    /// Node indices, ascending, without repeats.
    nodes: Box<[usize]>,
}

/// Compiled rules of one pool.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

impl RuleSet {
    /// Compiles `rules` against the pool's node ids (`ids[i]` is node `i`).
    pub fn compile(rules: &[RuleConfig], ids: &[NodeId]) -> Result<Self, RuleError> {
        let mut out = Vec::with_capacity(rules.len());
        for (r, cfg) in rules.iter().enumerate() {
            let mti = match &cfg.mti {
                None => None,
                Some(text) => Some(MtiPattern::parse(text).ok_or_else(|| RuleError::BadMti {
                    rule: r,
                    value: text.clone(),
                })?),
            };
            let mut fields = Vec::with_capacity(cfg.fields.len());
            for f in &cfg.fields {
                if !(2..=192).contains(&f.field) {
                    return Err(RuleError::BadField {
                        rule: r,
                        field: f.field,
                    });
                }
                fields.push((f.field, f.prefix.as_bytes().into()));
            }
            if cfg.nodes.is_empty() {
                return Err(RuleError::NoNodes { rule: r });
            }
            let mut nodes = Vec::with_capacity(cfg.nodes.len());
            for node in &cfg.nodes {
                let i = ids
                    .iter()
                    .position(|id| id == node)
                    .ok_or(RuleError::UnknownNode {
                        rule: r,
                        node: *node,
                    })?;
                nodes.push(i);
            }
            nodes.sort_unstable();
            nodes.dedup();
            out.push(Rule {
                mti,
                fields,
                nodes: nodes.into_boxed_slice(),
            });
        }
        Ok(Self { rules: out })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// The node indices allowed for this message by the first matching rule,
    /// or `None` when no rule matches (all nodes allowed). `field(n)` returns
    /// field `n`'s value, or `None` if absent (an absent field fails its
    /// condition).
    pub fn select<'f, F>(&self, mti: &[u8; 4], field: F) -> Option<&[usize]>
    where
        F: Fn(u16) -> Option<&'f [u8]>,
    {
        self.select_rule(mti, field).map(|(_, nodes)| nodes)
    }

    /// Like [`select`](Self::select), also giving the matching rule's index
    /// (for logs and metrics).
    pub fn select_rule<'f, F>(&self, mti: &[u8; 4], field: F) -> Option<(usize, &[usize])>
    where
        F: Fn(u16) -> Option<&'f [u8]>,
    {
        self.rules.iter().enumerate().find_map(|(i, rule)| {
            let mti_ok = rule.mti.is_none_or(|p| p.matches(mti));
            let fields_ok = || {
                rule.fields
                    .iter()
                    .all(|(n, prefix)| field(*n).is_some_and(|v| v.starts_with(prefix)))
            };
            (mti_ok && fields_ok()).then_some((i, &rule.nodes[..]))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::{Algorithm, Balancer, BalancerConfig};
    use crate::node::NodeView;

    fn ids() -> Vec<NodeId> {
        ["01", "02", "03", "04"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect()
    }

    fn rules(text: &str) -> Vec<RuleConfig> {
        #[derive(Deserialize)]
        struct File {
            rules: Vec<RuleConfig>,
        }
        toml::from_str::<File>(text).unwrap().rules
    }

    fn fields<'a>(f3: &'a [u8], f41: Option<&'a [u8]>) -> impl Fn(u16) -> Option<&'a [u8]> {
        move |n| match n {
            3 => Some(f3),
            41 => f41,
            _ => None,
        }
    }

    #[test]
    fn mti_patterns() {
        let p = MtiPattern::parse("02xx").unwrap();
        assert!(p.matches(b"0200") && p.matches(b"0210") && !p.matches(b"0100"));
        assert!(MtiPattern::parse("x8X0").unwrap().matches(b"0800"));
        assert!(MtiPattern::parse("0200").unwrap().matches(b"0200"));
        assert!(!MtiPattern::parse("0200").unwrap().matches(b"0201"));
        for bad in ["020", "02000", "02a0", "", "02*x", "٠٢٠٠"] {
            assert_eq!(MtiPattern::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn first_match_wins() {
        let set = RuleSet::compile(
            &rules(
                r#"
                [[rules]]
                mti = "02xx"
                fields = [{ field = 3, prefix = "31" }]
                nodes = ["03"]

                [[rules]]
                mti = "02xx"
                nodes = ["01", "02", "01"]

                [[rules]]
                fields = [{ field = 41, prefix = "" }]
                nodes = ["04"]
                "#,
            ),
            &ids(),
        )
        .unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(set.select(b"0200", fields(b"310000", None)), Some(&[2][..]));
        assert_eq!(
            set.select_rule(b"0200", fields(b"000000", None)),
            Some((1, &[0, 1][..]))
        );
        assert_eq!(
            set.select(b"0100", fields(b"310000", Some(b"T1"))),
            Some(&[3][..])
        );
        assert_eq!(
            set.select(b"0100", fields(b"310000", None)),
            None,
            "F41 absent"
        );
        assert_eq!(set.select(b"0800", |_| None), None);
        assert!(RuleSet::default().select(b"0200", |_| None).is_none());
    }

    #[test]
    fn compile_errors_name_the_rule() {
        let ids = ids();
        let e = RuleSet::compile(&rules("[[rules]]\nmti = \"2x\"\nnodes = [\"01\"]"), &ids);
        assert!(matches!(e, Err(RuleError::BadMti { rule: 0, .. })));
        let e = RuleSet::compile(
            &rules("[[rules]]\nnodes = [\"01\"]\n[[rules]]\nnodes = [\"09\"]"),
            &ids,
        );
        assert_eq!(
            e.unwrap_err().to_string(),
            "rules[1].nodes names `09`, which is not a node of this pool"
        );
        let e = RuleSet::compile(&rules("[[rules]]\nnodes = []"), &ids);
        assert_eq!(e.unwrap_err(), RuleError::NoNodes { rule: 0 });
        let e = RuleSet::compile(
            &rules("[[rules]]\nfields = [{ field = 0, prefix = \"1\" }]\nnodes = [\"01\"]"),
            &ids,
        );
        assert_eq!(e.unwrap_err(), RuleError::BadField { rule: 0, field: 0 });
    }

    #[test]
    fn rules_restrict_the_pick() {
        let ids = ids();
        let nodes: Vec<NodeView> = ids.iter().map(|&id| NodeView::healthy(id, 1, 0)).collect();
        let set = RuleSet::compile(
            &rules("[[rules]]\nmti = \"02xx\"\nnodes = [\"02\", \"04\"]"),
            &ids,
        )
        .unwrap();
        let mut b = Balancer::new(
            BalancerConfig {
                algorithm: Algorithm::RoundRobin,
                min_active: 1,
            },
            9,
        );
        let mut seen = [0; 4];
        for _ in 0..8 {
            let i = match set.select(b"0200", |_| None) {
                Some(allowed) => b.pick_in(&nodes, allowed, None),
                None => b.pick(&nodes, None),
            };
            seen[i.unwrap()] += 1;
        }
        assert_eq!(seen, [0, 4, 0, 4]);
        // The rule binds: its nodes down means no pick, not another node.
        let mut down = nodes.clone();
        down[1].eligible = false;
        down[3].eligible = false;
        let allowed = set.select(b"0200", |_| None).unwrap();
        assert_eq!(b.pick_in(&down, allowed, None), None);
    }
}
