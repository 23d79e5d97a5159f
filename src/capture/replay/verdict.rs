//! A replay's verdict: each replayed answer compared field by field with
//! the captured one (both masked first), and the outcomes tallied into the
//! [`Report`]. How requests are planned, paced and sent is in [`super`].

use crate::capture::mask::mask_payload;
use crate::iso8583::{Decoded, Spec};

/// One request's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Matched,
    /// The answer differs: the first differences, masked.
    Differs(Vec<FieldDiff>),
    /// No answer within the timeout (the capture had one).
    Missing,
    /// An answer came, the capture had none.
    Unexpected,
    /// Neither the capture nor the target answered.
    Unanswered,
}

/// One differing field (0 = the MTI), values shown masked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDiff {
    pub field: u16,
    pub captured: String,
    pub replayed: String,
}

/// What a replay found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub connections: usize,
    pub replayed: usize,
    pub matched: usize,
    pub differing: usize,
    pub missing: usize,
    /// Answers that match no replayed request, or requests the capture did
    /// not see answered that the target answered.
    pub unexpected: usize,
    /// Requests the target itself sent (not compared).
    pub unsolicited: usize,
    /// Requests unanswered both in the capture and now (not a difference).
    pub unanswered: usize,
    /// Connections that could not be opened.
    pub connect_errors: usize,
    /// The first differences, for the report: (connection, request, diffs).
    pub details: Vec<String>,
}

impl Report {
    /// Whether the target answered as captured.
    pub fn is_clean(&self) -> bool {
        self.differing == 0 && self.missing == 0 && self.unexpected == 0 && self.connect_errors == 0
    }

    /// Counts one request's outcome, with a detail line for a difference.
    pub(in crate::capture) fn tally(&mut self, what: &str, outcome: Outcome) {
        match outcome {
            Outcome::Matched => self.matched += 1,
            Outcome::Differs(diffs) => {
                self.differing += 1;
                let shown: Vec<String> = diffs
                    .iter()
                    .take(MAX_DIFFS)
                    .map(|d| {
                        let name = if d.field == 0 {
                            "MTI".to_string()
                        } else {
                            format!("F{}", d.field)
                        };
                        format!("{name} captured {} replayed {}", d.captured, d.replayed)
                    })
                    .collect();
                self.details
                    .push(format!("{what}: differs: {}", shown.join("; ")));
            }
            Outcome::Missing => {
                self.missing += 1;
                self.details.push(format!("{what}: no answer"));
            }
            Outcome::Unexpected => {
                self.unexpected += 1;
                self.details
                    .push(format!("{what}: answered, the capture has no answer"));
            }
            Outcome::Unanswered => self.unanswered += 1,
        }
    }

    pub(in crate::capture) fn add(&mut self, other: Report) {
        self.connections += other.connections;
        self.replayed += other.replayed;
        self.matched += other.matched;
        self.differing += other.differing;
        self.missing += other.missing;
        self.unexpected += other.unexpected;
        self.unsolicited += other.unsolicited;
        self.unanswered += other.unanswered;
        self.connect_errors += other.connect_errors;
        self.details.extend(other.details);
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "replayed {} requests on {} connections: matched {}, differing {}, missing {}, unexpected {} (unanswered in capture and replay {}, target-originated {}, connect errors {})",
            self.replayed,
            self.connections,
            self.matched,
            self.differing,
            self.missing,
            self.unexpected,
            self.unanswered,
            self.unsolicited,
            self.connect_errors
        )?;
        for d in self.details.iter().take(MAX_DETAILS) {
            writeln!(f, "  {d}")?;
        }
        if self.details.len() > MAX_DETAILS {
            writeln!(f, "  ... {} more", self.details.len() - MAX_DETAILS)?;
        }
        Ok(())
    }
}

const MAX_DETAILS: usize = 20;
/// Field differences shown per request.
const MAX_DIFFS: usize = 5;

/// Compares a captured answer with a replayed one, both masked first (a
/// masked capture holds masked values; the replayed answer is masked the same
/// way so that only real differences show).
pub fn compare(
    spec: &Spec,
    captured: Option<&[u8]>,
    replayed: Option<&[u8]>,
    ignore: &[u16],
) -> Outcome {
    let (c, r) = match (captured, replayed) {
        (None, None) => return Outcome::Unanswered,
        (Some(_), None) => return Outcome::Missing,
        (None, Some(_)) => return Outcome::Unexpected,
        (Some(c), Some(r)) => (c, r),
    };
    let decode = |b: &[u8]| -> Option<Decoded> {
        let mut m = b.to_vec();
        mask_payload(spec, &mut m).ok()?;
        spec.decode(&m).ok()
    };
    let (Some(c), Some(r)) = (decode(c), decode(r)) else {
        return Outcome::Differs(vec![FieldDiff {
            field: 0,
            captured: "(undecodable)".into(),
            replayed: "(undecodable)".into(),
        }]);
    };
    let mut diffs = Vec::new();
    if c.mti != r.mti {
        diffs.push(FieldDiff {
            field: 0,
            captured: c.mti.to_string(),
            replayed: r.mti.to_string(),
        });
    }
    let mut ids: Vec<u16> = c
        .fields
        .iter()
        .chain(&r.fields)
        .map(|(id, _)| *id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids.into_iter().filter(|id| !ignore.contains(id)) {
        let (cv, rv) = (c.get(id), r.get(id));
        if cv == rv {
            continue;
        }
        let show = |v: Option<&crate::iso8583::Value>| match (v, spec.field(id)) {
            (Some(v), Some(def)) => format!("{:?}", v.show(def).to_string()),
            (Some(_), None) => "(present)".into(),
            (None, _) => "(absent)".into(),
        };
        diffs.push(FieldDiff {
            field: id,
            captured: show(cv),
            replayed: show(rv),
        });
    }
    if diffs.is_empty() {
        Outcome::Matched
    } else {
        Outcome::Differs(diffs)
    }
}
