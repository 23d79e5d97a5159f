//! How people name what they look for in the journal: times (`--since`,
//! `?since=`), days (`report --day`) and the filter of a URL query string.
//! Shared by the `journal` command and `GET /api/v1/journal`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store::journal::{JournalFilter, OutcomeFilter, UnknownOutcome};

/// Rows a query returns by default, and at most.
pub const DEFAULT_LIMIT: usize = 1000;
pub const MAX_LIMIT: usize = 100_000;

const DAY_MS: i64 = 86_400_000;

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A time or a day that does not read as one; it carries the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("`{0}`: too large for Unix milliseconds")]
    TooLarge(String),
    #[error(
        "`{}`: not a time (2026-12-04T10:00:00Z, 2026-12-04, Unix ms, or 2h for two hours ago)",
        .0.escape_debug()
    )]
    NotATime(String),
    #[error("day `{}`: write YYYY-MM-DD", .0.escape_debug())]
    NotADay(String),
}

/// A journal query string that does not read as a filter; each variant
/// names the parameter at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// `since` or `until`.
    #[error("{param}: {source}")]
    Time {
        param: &'static str,
        #[source]
        source: TimeError,
    },
    #[error("outcome: {0}")]
    Outcome(#[source] UnknownOutcome),
    #[error("limit: `{0}` is not within 1..={MAX_LIMIT}")]
    Limit(String),
    #[error(
        "`{}`: expected since, until, rrn, stan, terminal, node, service, outcome, order or limit",
        .0.escape_debug()
    )]
    UnknownParam(String),
}

/// A time: RFC 3339 (`2026-12-04T10:00:00Z`, or with a space, UTC), a day
/// (`2026-12-04`, its midnight UTC), Unix milliseconds, or a duration ago
/// (`15m`, `2h`, `1d`).
pub fn parse_time(text: &str, now: SystemTime) -> Result<i64, TimeError> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<i64>()
            .map_err(|_| TimeError::TooLarge(text.to_string()));
    }
    if let Ok(ago) = crate::util::duration::parse(text) {
        return Ok(millis(now.checked_sub(ago).unwrap_or(UNIX_EPOCH)));
    }
    let full = if text.len() == 10 {
        format!("{text}T00:00:00Z")
    } else {
        text.to_string()
    };
    humantime::parse_rfc3339_weak(&full)
        .map(millis)
        .map_err(|_| TimeError::NotATime(text.to_string()))
}

/// A day's bounds `[midnight, next midnight)` UTC; `None`: today.
pub fn day_bounds(day: Option<&str>, now: SystemTime) -> Result<(i64, i64), TimeError> {
    let start = match day {
        Some(d) if d.len() == 10 => parse_time(d, now)?,
        Some(d) => return Err(TimeError::NotADay(d.to_string())),
        None => millis(now).div_euclid(DAY_MS) * DAY_MS,
    };
    Ok((start, start + DAY_MS))
}

/// The day a time falls on, `YYYY-MM-DD` (UTC).
pub fn day_of(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()[..10].to_string()
}

/// A time for people: `2026-12-04T10:00:00.123Z`.
pub fn show_time(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0));
    humantime::format_rfc3339_millis(t).to_string()
}

/// Decodes `%XX` and `+` in a query value.
fn unescape(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() && value.is_char_boundary(i + 3) => {
                match u8::from_str_radix(&value[i + 1..i + 3], 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The filter of `GET /api/v1/journal?since=..&until=..&rrn=..&stan=..&
/// terminal=..&node=..&service=..&outcome=..&limit=..`; errors name the
/// parameter.
pub fn filter_of_query(query: Option<&str>, now: SystemTime) -> Result<JournalFilter, QueryError> {
    let mut f = JournalFilter {
        limit: DEFAULT_LIMIT,
        ..JournalFilter::default()
    };
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let value = unescape(raw);
        let time = |param: &'static str| {
            parse_time(&value, now).map_err(|source| QueryError::Time { param, source })
        };
        match key {
            "since" => f.since = Some(time("since")?),
            "until" => f.until = Some(time("until")?),
            "rrn" => f.rrn = Some(value),
            "stan" => f.stan = Some(value),
            "terminal" => f.terminal = Some(value),
            "node" => f.node = Some(value),
            "service" => f.service = Some(value),
            "outcome" => {
                f.outcome = Some(
                    value
                        .parse::<OutcomeFilter>()
                        .map_err(QueryError::Outcome)?,
                )
            }
            "order" if value == "newest" => f.newest_first = true,
            "order" if value == "oldest" => f.newest_first = false,
            "limit" => {
                f.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| QueryError::Limit(value.clone()))?;
            }
            other => return Err(QueryError::UnknownParam(other.to_string())),
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_days_and_queries_are_read() {
        let now = UNIX_EPOCH + Duration::from_secs(1_764_842_400); // 2025-12-04T10:00:00Z
        assert_eq!(parse_time("2025-12-04", now), Ok(1_764_806_400_000));
        assert_eq!(
            parse_time("2025-12-04T10:00:00Z", now),
            Ok(1_764_842_400_000)
        );
        assert_eq!(parse_time("1h", now), Ok(1_764_838_800_000));
        assert_eq!(parse_time("1764842400000", now), Ok(1_764_842_400_000));
        assert!(parse_time("yesterday", now).is_err());
        assert_eq!(
            day_bounds(None, now),
            Ok((1_764_806_400_000, 1_764_892_800_000))
        );
        assert_eq!(day_of(1_764_842_400_000), "2025-12-04");
        let f = filter_of_query(
            Some("rrn=123456789012&outcome=late&since=2025-12-04T10%3A00%3A00Z&limit=5"),
            now,
        )
        .expect("filter");
        assert_eq!(f.rrn.as_deref(), Some("123456789012"));
        assert_eq!(f.outcome, Some(OutcomeFilter::Late));
        assert_eq!(f.since, Some(1_764_842_400_000));
        assert_eq!(f.limit, 5);
        let e = filter_of_query(Some("outcome=weird"), now).unwrap_err();
        assert!(e.to_string().starts_with("outcome:"), "{e}");
        assert!(filter_of_query(Some("pan=4"), now).is_err());
        assert_eq!(unescape("a%2"), "a%2");
    }
}
