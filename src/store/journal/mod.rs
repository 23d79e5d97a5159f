//! The journal in the store: one row per exchange (`journal`), one per
//! admin action (`admin_log`), the filters a query takes, and the SQL both
//! backends share; the row on its way in ([`insert`]). The rows as read
//! back are with the store's other rows (`store/rows.rs`), re-exported here
//! under the journal's name. The rows arrive masked: the journal (`crate::journal::row`
//! on the message path, `crate::journal::raw` on its writer) is the only
//! producer, and it reads a fixed list of fields (docs/journal.md).

use serde::Serialize;

use crate::store::saf::UnixMillis;

pub(crate) mod insert;

/// The rows as read: their home is [`crate::store::rows`].
pub use crate::store::rows::{AdminRow, JournalRow, ReportInput};
pub use insert::{NewRow, Short};

/// `--outcome`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum OutcomeFilter {
    /// Every answer the switch made (declines of any reason).
    SwitchMade,
    Late,
    Reversed,
    Bad,
    Duplicate,
    Unroutable,
    Repeat,
}

/// An `outcome` filter that names none of [`OutcomeFilter`]'s outcomes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("outcome `{0}`: one of switch-made, late, reversed, bad, duplicate, unroutable, repeat")]
pub struct UnknownOutcome(pub String);

impl std::str::FromStr for OutcomeFilter {
    type Err = UnknownOutcome;
    fn from_str(s: &str) -> Result<Self, UnknownOutcome> {
        Ok(match s {
            "switch-made" => OutcomeFilter::SwitchMade,
            "late" => OutcomeFilter::Late,
            "reversed" => OutcomeFilter::Reversed,
            "bad" => OutcomeFilter::Bad,
            "duplicate" => OutcomeFilter::Duplicate,
            "unroutable" => OutcomeFilter::Unroutable,
            "repeat" => OutcomeFilter::Repeat,
            other => return Err(UnknownOutcome(other.to_string())),
        })
    }
}

impl OutcomeFilter {
    fn condition(self) -> &'static str {
        match self {
            OutcomeFilter::SwitchMade => "j.answered_by = 'switch'",
            OutcomeFilter::Late => "j.late = 1",
            OutcomeFilter::Reversed => "j.reversal_id IS NOT NULL",
            OutcomeFilter::Bad => "j.bad IS NOT NULL",
            OutcomeFilter::Duplicate => "j.duplicate = 1",
            OutcomeFilter::Unroutable => "j.unroutable = 1",
            OutcomeFilter::Repeat => "j.repeat = 1",
        }
    }
}

/// What a journal query selects. Every field narrows; none set: all rows.
#[derive(Clone, Debug, Default)]
pub struct JournalFilter {
    pub since: Option<UnixMillis>,
    pub until: Option<UnixMillis>,
    /// F37, as received or as answered.
    pub rrn: Option<String>,
    pub stan: Option<String>,
    /// F41.
    pub terminal: Option<String>,
    pub node: Option<String>,
    pub service: Option<String>,
    pub outcome: Option<OutcomeFilter>,
    /// Most rows returned.
    pub limit: usize,
    /// Newest first (the status page), else oldest first.
    pub newest_first: bool,
}

/// A bound parameter of a built query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Param {
    Int(i64),
    Text(String),
}

/// The columns a query reads, in [`JournalRow`]'s order, `saf` joined.
pub const ROW_COLUMNS: &str = "j.id, j.t_in, j.t_out, j.service, j.front, j.link, j.node, \
     j.origin, j.mti, j.mti_out, j.f11, j.f7, j.f37_in, j.f37_out, j.f41, j.f42, j.f32, j.f33, \
     j.pan, j.f4, j.f49, j.f39, j.answered_by, j.reason, j.outcome, j.latency_us, j.late, \
     j.duplicate, j.repeat, j.unroutable, j.bad, j.reversal_id, s.state, s.answer";

pub const ADMIN_INSERT: &str = "INSERT INTO admin_log (at, peer, action, method, path, status, \
     outcome) VALUES ($1, $2, $3, $4, $5, $6, $7)";

pub const ADMIN_COLUMNS: &str = "id, at, peer, action, method, path, status, outcome";

/// Deletes the oldest rows before `$1`, at most `$2` of them: one short
/// transaction per batch, so retention never holds the write lock long.
pub const PURGE_JOURNAL: &str = "DELETE FROM journal WHERE id IN \
     (SELECT id FROM journal WHERE t_in < $1 ORDER BY t_in LIMIT $2)";
/// SQLite: forgets the oldest parts (at most 64 a batch) whose rows are
/// all older than `$1` and gone.
pub const PURGE_PARTS: &str = "DELETE FROM journal_part WHERE part IN \
     (SELECT part FROM journal_part ORDER BY part LIMIT 64) AND t_max < $1 \
     AND NOT EXISTS (SELECT 1 FROM journal j WHERE j.part = journal_part.part)";
pub const PURGE_ADMIN: &str = "DELETE FROM admin_log WHERE id IN \
     (SELECT id FROM admin_log WHERE at < $1 ORDER BY at LIMIT $2)";
/// The backend a query is spelled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The partial index `journal_f37_out`'s condition, as the query must
    /// repeat it for the planner to use that index: F37 answered differs
    /// from F37 received (the switch stamped it, or the node changed it).
    /// Rows whose F37 comes back unchanged, nearly all of them, cost that
    /// index nothing.
    pub fn f37_out_differs(self) -> &'static str {
        match self {
            Dialect::Sqlite => "j.f37_out IS NOT j.f37_in",
            Dialect::Postgres => "j.f37_out IS DISTINCT FROM j.f37_in",
        }
    }
}

/// The query for `filter`, `$n` placeholders, and its parameters.
pub fn select(filter: &JournalFilter, dialect: Dialect) -> (String, Vec<Param>) {
    // SQLite's key indexes lead with the journal part (its migration 5): a
    // query by key seeks it once per part whose times overlap the range.
    // CROSS JOIN keeps `journal_part` the outer loop; the RRN's two lookups
    // sit in the join, each with the part, so each uses its index.
    let by_part = dialect == Dialect::Sqlite && (filter.rrn.is_some() || filter.terminal.is_some());
    let mut sql = format!("SELECT {ROW_COLUMNS} FROM ");
    let mut params = Vec::new();
    let mut bind = |sql: &mut String, cond: &str, p: Param| {
        params.push(p);
        sql.push_str(&cond.replace('?', &format!("${}", params.len())));
    };
    match (&filter.rrn, by_part) {
        (Some(r), true) => {
            sql.push_str("journal_part p CROSS JOIN journal j ON ");
            bind(
                &mut sql,
                "(j.part = p.part AND j.f37_in = ?)",
                Param::Text(r.clone()),
            );
            let differs = format!(
                " OR (j.part = p.part AND j.f37_out = ? AND {})",
                dialect.f37_out_differs()
            );
            bind(&mut sql, &differs, Param::Text(r.clone()));
        }
        (None, true) => sql.push_str("journal_part p CROSS JOIN journal j ON j.part = p.part"),
        (_, false) => sql.push_str("journal j"),
    }
    sql.push_str(" LEFT JOIN saf s ON s.id = j.reversal_id WHERE 1 = 1");
    if let Some(t) = filter.since {
        bind(&mut sql, " AND j.t_in >= ?", Param::Int(t));
        if by_part {
            bind(&mut sql, " AND p.t_max >= ?", Param::Int(t));
        }
    }
    if let Some(t) = filter.until {
        bind(&mut sql, " AND j.t_in < ?", Param::Int(t));
        if by_part {
            bind(&mut sql, " AND p.t_min < ?", Param::Int(t));
        }
    }
    if let Some(r) = filter.rrn.as_ref().filter(|_| !by_part) {
        // Twice the same value: each placeholder is bound once.
        bind(&mut sql, " AND (j.f37_in = ?", Param::Text(r.clone()));
        let differs = format!(" OR (j.f37_out = ? AND {}))", dialect.f37_out_differs());
        bind(&mut sql, &differs, Param::Text(r.clone()));
    }
    if let Some(s) = &filter.stan {
        bind(&mut sql, " AND j.f11 = ?", Param::Text(s.clone()));
    }
    if let Some(t) = &filter.terminal {
        bind(&mut sql, " AND j.f41 = ?", Param::Text(t.clone()));
    }
    if let Some(n) = &filter.node {
        bind(&mut sql, " AND j.node = ?", Param::Text(n.clone()));
    }
    if let Some(s) = &filter.service {
        bind(&mut sql, " AND j.service = ?", Param::Text(s.clone()));
    }
    if let Some(o) = filter.outcome {
        sql.push_str(" AND ");
        sql.push_str(o.condition());
    }
    let order = if filter.newest_first { "DESC" } else { "ASC" };
    let limit = i64::try_from(filter.limit.max(1)).unwrap_or(i64::MAX);
    sql.push_str(&format!(" ORDER BY j.t_in {order}, j.id {order}"));
    bind(&mut sql, " LIMIT ?", Param::Int(limit));
    (sql, params)
}

/// The admin rows since `since`, newest first, at most `limit`.
pub fn select_admin(since: Option<UnixMillis>, limit: usize) -> (String, Vec<Param>) {
    let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
    (
        format!(
            "SELECT {ADMIN_COLUMNS} FROM admin_log WHERE at >= $1 ORDER BY at DESC, id DESC LIMIT $2"
        ),
        vec![Param::Int(since.unwrap_or(0)), Param::Int(limit)],
    )
}

/// The columns a report pass reads, one row per exchange of the period.
pub const REPORT_SQL: &str = "SELECT j.service, j.node, j.outcome, j.reason, j.late, \
     j.reversal_id, s.state, j.latency_us, j.t_in FROM journal j LEFT JOIN saf s ON s.id = j.reversal_id \
     WHERE j.t_in >= $1 AND j.t_in < $2";

/// SQLite spells placeholders `?n`; `$n` reads the same there, but one
/// rule for both keeps the statements comparable.
pub fn sqlite_placeholders(sql: &str) -> String {
    sql.replace('$', "?")
}

/// A row as read, to insert again (tests, imports). Here, not beside
/// [`NewRow`]: that module must not depend on this one (no module cycle).
impl From<&JournalRow> for NewRow {
    fn from(r: &JournalRow) -> NewRow {
        fn o(s: &Option<String>) -> Option<&str> {
            s.as_deref()
        }
        NewRow {
            t_in: r.t_in,
            t_out: r.t_out,
            service: Some(std::sync::Arc::from(r.service.as_str())),
            front: Short::new(&r.front),
            link: Short::new(&r.link),
            node: Short::opt(o(&r.node)),
            origin: Short::new(&r.origin),
            mti: Short::new(&r.mti),
            mti_out: Short::opt(o(&r.mti_out)),
            f11: Short::opt(o(&r.f11)),
            f7: Short::opt(o(&r.f7)),
            f37_in: Short::opt(o(&r.f37_in)),
            f37_out: Short::opt(o(&r.f37_out)),
            f41: Short::opt(o(&r.f41)),
            f42: Short::opt(o(&r.f42)),
            f32: Short::opt(o(&r.f32)),
            f33: Short::opt(o(&r.f33)),
            pan: Short::opt(o(&r.pan)),
            f4: Short::opt(o(&r.f4)),
            f49: Short::opt(o(&r.f49)),
            f39: Short::opt(o(&r.f39)),
            answered_by: Short::new(&r.answered_by),
            reason: Short::opt(o(&r.reason)),
            outcome: Short::new(&r.outcome),
            latency_us: r.latency_us,
            late: r.late,
            duplicate: r.duplicate,
            repeat: r.repeat,
            unroutable: r.unroutable,
            bad: Short::opt(o(&r.bad)),
            reversal_id: r.reversal_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_binds_each_value_once_in_order() {
        let (sql, params) = select(
            &JournalFilter {
                rrn: Some("123456789012".into()),
                stan: Some("000042".into()),
                outcome: Some(OutcomeFilter::Late),
                limit: 10,
                ..JournalFilter::default()
            },
            Dialect::Postgres,
        );
        assert!(
            sql.contains(
                "(j.f37_in = $1 OR (j.f37_out = $2 AND j.f37_out IS DISTINCT FROM j.f37_in))"
            ),
            "{sql}"
        );
        assert!(sql.contains("j.f11 = $3"), "{sql}");
        assert!(sql.contains("j.late = 1"), "{sql}");
        assert!(sql.ends_with("LIMIT $4"), "{sql}");
        assert_eq!(params.len(), 4);
        assert_eq!(params[3], Param::Int(10));
        // SQLite looks the RRN up part by part, in the join.
        let (sql, params) = select(
            &JournalFilter {
                rrn: Some("123456789012".into()),
                since: Some(5),
                stan: Some("000042".into()),
                limit: 10,
                ..JournalFilter::default()
            },
            Dialect::Sqlite,
        );
        assert!(
            sql.contains(
                "FROM journal_part p CROSS JOIN journal j ON (j.part = p.part AND j.f37_in = $1) \
                 OR (j.part = p.part AND j.f37_out = $2 AND j.f37_out IS NOT j.f37_in) LEFT JOIN"
            ),
            "{sql}"
        );
        assert!(
            sql.contains("j.t_in >= $3 AND p.t_max >= $4 AND j.f11 = $5"),
            "{sql}"
        );
        assert_eq!(params.len(), 6);
        assert!("nope".parse::<OutcomeFilter>().is_err());
        assert_eq!(
            "switch-made".parse::<OutcomeFilter>(),
            Ok(OutcomeFilter::SwitchMade)
        );
    }
}
