//! The store-and-forward queue as operators see it: what it owes (pending
//! entries and dead letters per service and kind), sampled from the store
//! once a second by a task of its own and cached (a scrape or the status
//! page reads the cache, never the store, and the message path never waits
//! for either), and the entries as the admin API lists them and acts on
//! them (retry now, drop with a reason).
//!
//! A listing never carries a payload: the store's rows have none, and the
//! PAN is the masked form the store keeps (first 6 and last 4 at most).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use crate::store::{
    Direction, SafFilter, SafId, SafKind, SafOwed, SafPolicy, SafRow, SafState, Store, StoreError,
    UnixMillis, now_millis,
};

/// How often the stats are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// A sample the store has not answered within this is given up (the store
/// is slow or away); the previous one stays, and ages.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Between two warnings that the store cannot be sampled.
const COMPLAIN_EVERY: Duration = Duration::from_secs(30);

/// Entries a listing returns unless `limit` says otherwise, and at most.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;
/// The longest drop reason taken, in characters.
pub const MAX_REASON: usize = 200;
/// A run of this many digits in a reason is taken for a card number and
/// left out of the store and the log.
const PAN_LIKE_DIGITS: usize = 12;

/// The store as the admin API and the metrics see it.
pub struct SafView {
    pub store: Store,
    /// The delivery loop's wake-up: an entry retried now goes at once.
    wake: Arc<Notify>,
    latest: Mutex<Option<Arc<SafSample>>>,
}

/// One reading of what the queue owes.
#[derive(Debug)]
pub struct SafSample {
    /// When the store answered.
    pub taken: Instant,
    /// Per service and kind, only those with pending entries or dead letters.
    pub groups: Vec<SafOwed>,
}

/// What is owed for one service and kind (all zero: nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owed {
    pub pending: u64,
    /// Of those, leased for an attempt right now.
    pub in_flight: u64,
    pub oldest_pending_age_ms: Option<i64>,
    pub dead: u64,
}

impl Owed {
    /// These and `other` together; the oldest age is the older of the two.
    pub fn plus(self, other: Owed) -> Owed {
        Owed {
            pending: self.pending + other.pending,
            in_flight: self.in_flight + other.in_flight,
            oldest_pending_age_ms: self.oldest_pending_age_ms.max(other.oldest_pending_age_ms),
            dead: self.dead + other.dead,
        }
    }

    fn of(g: &SafOwed) -> Owed {
        Owed {
            pending: g.pending,
            in_flight: g.in_flight,
            oldest_pending_age_ms: g.oldest_pending_age_ms,
            dead: g.dead,
        }
    }
}

/// One service's share of a sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceSaf {
    pub reversals: Owed,
    pub advices: Owed,
}

impl ServiceSaf {
    pub fn of(&self, kind: SafKind) -> Owed {
        match kind {
            SafKind::Reversal => self.reversals,
            SafKind::Advice => self.advices,
        }
    }

    pub fn total(&self) -> Owed {
        self.reversals.plus(self.advices)
    }
}

impl SafSample {
    /// Each service's share; a service that owes nothing is absent.
    pub fn by_service(&self) -> HashMap<&str, ServiceSaf> {
        let mut out: HashMap<&str, ServiceSaf> = HashMap::new();
        for g in &self.groups {
            let s = out.entry(g.service.as_str()).or_default();
            let slot = match g.kind {
                SafKind::Reversal => &mut s.reversals,
                SafKind::Advice => &mut s.advices,
            };
            *slot = slot.plus(Owed::of(g));
        }
        out
    }
}

impl SafView {
    pub fn new(store: Store, wake: Arc<Notify>) -> SafView {
        SafView {
            store,
            wake,
            latest: Mutex::new(None),
        }
    }

    /// The last sample the store answered; none before the first.
    pub fn latest(&self) -> Option<Arc<SafSample>> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn keep(&self, sample: SafSample) {
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(sample));
    }

    /// Entries as `query` asks, newest first.
    pub async fn list(&self, query: &SafQuery) -> Result<Vec<SafEntryView>, StoreError> {
        let filter = SafFilter {
            state: query.state,
            service: query.service.clone(),
            limit: query.limit,
        };
        let rows = self.store.saf_list(filter).await?;
        Ok(rows.iter().map(SafEntryView::from).collect())
    }

    /// Makes entry `id` due now and wakes the delivery loop.
    pub async fn retry_now(&self, id: SafId) -> Result<(), StoreError> {
        self.store.saf_retry_now(id, now_millis()).await?;
        self.wake.notify_one();
        Ok(())
    }

    /// Gives entry `id` up, recording `reason` (already [`clean_reason`]ed).
    pub async fn drop_entry(&self, id: SafId, reason: &str) -> Result<(), StoreError> {
        self.store.saf_drop(id, now_millis(), reason).await
    }
}

/// Samples the queue's stats every [`SAMPLE_EVERY`] until `stop`; the first
/// at once, so that a scrape soon after start has them. The query runs on
/// the store's one writer, between the batches that carry reversals and
/// advices; it reads only pending and dead rows, and should that still be
/// slow (a large backlog) the next sample waits `PACE` (20) times as long as
/// it took, so sampling never takes more than a small share of the
/// writer's time.
pub async fn sample_forever(view: Arc<SafView>, mut stop: watch::Receiver<bool>) {
    let mut complained = None::<Instant>;
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        let started = Instant::now();
        let asked = view.store.saf_owed_by(now_millis());
        let outcome = tokio::time::timeout(SAMPLE_TIMEOUT, asked).await;
        wait = next_wait(started.elapsed());
        let why = match outcome {
            Ok(Ok(groups)) => {
                view.keep(SafSample {
                    taken: Instant::now(),
                    groups,
                });
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {SAMPLE_TIMEOUT:?}"),
        };
        if complained.is_none_or(|t: Instant| t.elapsed() >= COMPLAIN_EVERY) {
            tracing::warn!(error = %why, "store-and-forward stats not sampled: the metrics keep the last sample (isoswitch_saf_sample_age_seconds)");
            complained = Some(Instant::now());
        }
    }
}

/// How often completed entries past `store.saf.keep` are deleted.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Entries deleted in one transaction: the writer's other requests (the
/// reversals and advices it stores) wait at most one such batch.
const PRUNE_BATCH: usize = 1000;

/// Deletes delivered and dropped entries older than `policy.keep`, every
/// [`PRUNE_EVERY`] until `stop`, in batches of [`PRUNE_BATCH`] with a
/// yield between them; a failed round is logged and tried next time.
pub async fn prune_forever(store: Store, policy: SafPolicy, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(PRUNE_EVERY) => {}
            _ = stop.changed() => return,
        }
        match prune_once(&store, &policy, now_millis()).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(deleted = n, keep = ?policy.keep, "store-and-forward: completed entries past their keep deleted")
            }
            Err(e) => {
                tracing::warn!(error = %e, "store-and-forward: completed entries not pruned this round")
            }
        }
    }
}

/// One pruning round as of `now`: batches until one comes back short.
pub async fn prune_once(
    store: &Store,
    policy: &SafPolicy,
    now: UnixMillis,
) -> Result<u64, StoreError> {
    let before = policy.prune_before(now);
    let mut deleted = 0;
    loop {
        let n = store.saf_prune(before, PRUNE_BATCH).await?;
        deleted += n;
        if n < PRUNE_BATCH as u64 {
            return Ok(deleted);
        }
        tokio::task::yield_now().await;
    }
}

/// A slow sample is followed by a wait this many times as long as it took.
const PACE: u32 = 20;

/// The wait before the next sample, after one that took `took`.
fn next_wait(took: Duration) -> Duration {
    SAMPLE_EVERY.max(took.saturating_mul(PACE))
}

/// `GET /api/v1/saf`'s query: `state` (pending, dead, delivered, dropped or
/// all; pending by default: what is still owed), `service`, `limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafQuery {
    pub state: Option<SafState>,
    pub service: Option<String>,
    pub limit: usize,
}

impl Default for SafQuery {
    fn default() -> Self {
        SafQuery {
            state: Some(SafState::Pending),
            service: None,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// Why an operator's SAF request was refused; each names what it concerns
/// (values escaped: they come from a URL or a body).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SafInputError {
    #[error("state: `{0}` is not pending, dead, delivered, dropped or all")]
    State(String),
    #[error("limit: `{0}` is not a number within 1..={MAX_LIMIT}")]
    Limit(String),
    #[error("service: `{0}` is not a service name")]
    Service(String),
    #[error("`{0}`: expected state, service or limit")]
    Parameter(String),
    #[error("reason: required (why the entry is given up; it is logged)")]
    ReasonMissing,
    #[error("reason: {0} characters; at most {MAX_REASON}")]
    ReasonTooLong(usize),
    #[error("body: {0} (expected {{\"reason\": \"why it is given up\"}})")]
    Body(String),
    #[error("id: `{0}` is not an entry id")]
    Id(String),
}

fn escaped(value: &str) -> String {
    value.escape_debug().to_string()
}

impl SafQuery {
    /// Reads a URL query string; the error names the parameter.
    pub fn parse(query: Option<&str>) -> Result<SafQuery, SafInputError> {
        let mut q = SafQuery::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "state" if value == "all" => q.state = None,
                "state" => {
                    q.state = Some(
                        value
                            .parse()
                            .map_err(|_| SafInputError::State(escaped(value)))?,
                    );
                }
                "limit" => {
                    q.limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| SafInputError::Limit(escaped(value)))?;
                }
                "service" if valid_name(value) => q.service = Some(value.to_string()),
                "service" => return Err(SafInputError::Service(escaped(value))),
                other => return Err(SafInputError::Parameter(escaped(other))),
            }
        }
        Ok(q)
    }

    /// The query string that asks for `self` (what `ctl saf` sends).
    pub fn to_query(&self) -> String {
        let state = self.state.map_or("all", SafState::as_str);
        let mut out = format!("state={state}&limit={}", self.limit);
        if let Some(s) = &self.service {
            out.push_str(&format!("&service={s}"));
        }
        out
    }
}

/// Service names as a query may carry them, unescaped: letters, digits and
/// `._-` (what config names use).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// One entry as `GET /api/v1/saf` lists it. Times are UTC, RFC 3339. No
/// payload, ever.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SafEntryView {
    pub id: i64,
    pub service: String,
    /// to_node, to_peer or to_any_node.
    pub direction: String,
    /// The node a `to_node` entry goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// reversal or advice.
    pub kind: String,
    /// The MTI as first sent (repeats end in 1).
    pub mti: String,
    pub f11: Option<String>,
    pub f37: Option<String>,
    pub f7: Option<String>,
    /// First 6 and last 4 digits at most, as the store keeps it.
    pub pan_masked: Option<String>,
    /// The original transaction it is about (`F41/F11/F7/F32`): entries
    /// with the same original are delivered in the order stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<String>,
    /// Attempts started so far.
    pub attempts: u32,
    pub next_attempt_at: String,
    pub state: String,
    pub last_error: Option<String>,
    pub created_at: String,
    /// No attempt starts after this: the entry becomes a dead letter.
    pub expires_at: String,
    /// The instance holding it for an attempt right now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// The instance that completed it (delivered, dead or dropped): in a
    /// pair, which one delivered what the other stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_by: Option<String>,
    /// The host's answer (delivered entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Why it is dead or dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<&SafRow> for SafEntryView {
    fn from(r: &SafRow) -> Self {
        let (direction, node) = match &r.direction {
            Direction::ToNode(n) => ("to_node", Some(n.clone())),
            Direction::ToPeer => ("to_peer", None),
            Direction::ToAnyNode => ("to_any_node", None),
        };
        let now = now_millis();
        // A lease that ran out is no one's any more.
        let leased = r.lease_until.is_some_and(|t| t > now);
        SafEntryView {
            id: r.id.0,
            service: r.service.clone(),
            direction: direction.to_string(),
            node,
            kind: r.kind.as_str().to_string(),
            mti: r.mti.clone(),
            f11: r.keys.f11.clone(),
            f37: r.keys.f37.clone(),
            f7: r.keys.f7.clone(),
            pan_masked: r.keys.pan_masked.clone(),
            original: r.keys.original.clone(),
            attempts: r.attempts,
            next_attempt_at: rfc3339(r.next_attempt_at),
            state: r.state.as_str().to_string(),
            last_error: r.last_error.clone(),
            created_at: rfc3339(r.created_at),
            expires_at: rfc3339(r.expires_at),
            lease_owner: r.lease_owner.clone().filter(|_| leased),
            completed_at: r.completed_at.map(rfc3339),
            completed_by: r.completed_by.clone(),
            answer: r.answer.clone(),
            reason: r.reason.clone(),
        }
    }
}

/// A store time as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: UnixMillis) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// Reads back an [`rfc3339`] time.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(text).ok()
}

/// An operator's drop reason, fit to store and log: trimmed, required, at
/// most [`MAX_REASON`] characters; control characters become spaces (no
/// forged log lines) and a run of 12 or more digits (a card number typed
/// in) is left out.
pub fn clean_reason(raw: &str) -> Result<String, SafInputError> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(SafInputError::ReasonMissing);
    }
    let count = trimmed.chars().count();
    if count > MAX_REASON {
        return Err(SafInputError::ReasonTooLong(count));
    }
    let mut out = String::with_capacity(trimmed.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        if digits.len() >= PAN_LIKE_DIGITS {
            out.push_str("[digits left out]");
        } else {
            out.push_str(digits);
        }
        digits.clear();
    };
    for c in trimmed.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        flush(&mut digits, &mut out);
        out.push(if c.is_control() { ' ' } else { c });
    }
    flush(&mut digits, &mut out);
    Ok(out)
}

/// An entry id as the path gives it (`42`, or `#42` as the store prints it).
pub fn parse_id(text: &str) -> Result<SafId, SafInputError> {
    text.strip_prefix('#')
        .unwrap_or(text)
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .map(SafId)
        .ok_or_else(|| SafInputError::Id(escaped(text)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SafKeys;

    #[test]
    fn queries_are_read_with_their_defaults_and_refused_by_name() {
        assert_eq!(SafQuery::parse(None), Ok(SafQuery::default()));
        let q = SafQuery::parse(Some("state=dead&limit=5&service=pos")).expect("query");
        assert_eq!(q.state, Some(SafState::Dead));
        assert_eq!((q.limit, q.service.as_deref()), (5, Some("pos")));
        assert_eq!(
            SafQuery::parse(Some("state=all")).map(|q| q.state),
            Ok(None)
        );
        for (bad, names) in [
            ("state=lost", "state"),
            ("limit=0", "limit"),
            ("limit=1001", "limit"),
            ("limit=x", "limit"),
            ("service=a%22b", "service"),
            ("payload=1", "payload"),
        ] {
            let e = SafQuery::parse(Some(bad)).expect_err(bad);
            assert!(e.to_string().contains(names), "{bad}: {e}");
        }
        let q = SafQuery::parse(Some("state=dropped&limit=7&service=atm")).expect("query");
        assert_eq!(SafQuery::parse(Some(&q.to_query())), Ok(q));
    }

    #[test]
    fn reasons_are_required_limited_and_cleaned() {
        assert!(clean_reason("  ").is_err());
        assert!(clean_reason(&"x".repeat(MAX_REASON + 1)).is_err());
        assert_eq!(
            clean_reason(&"é".repeat(MAX_REASON)).map(|r| r.chars().count()),
            Ok(MAX_REASON)
        );
        assert_eq!(
            clean_reason(" host booked it\nFAKE log line\t ").as_deref(),
            Ok("host booked it FAKE log line")
        );
        assert_eq!(
            clean_reason("card 4761739001010119 ref 123456").as_deref(),
            Ok("card [digits left out] ref 123456")
        );
    }

    #[test]
    fn a_slow_sample_spaces_the_next() {
        assert_eq!(next_wait(Duration::from_millis(3)), SAMPLE_EVERY);
        assert_eq!(
            next_wait(Duration::from_millis(200)),
            Duration::from_secs(4)
        );
    }

    #[test]
    fn ids_are_read_with_or_without_the_hash() {
        assert_eq!(parse_id("42"), Ok(SafId(42)));
        assert_eq!(parse_id("#7"), Ok(SafId(7)));
        assert!(parse_id("0").is_err());
        assert!(parse_id("x").is_err());
    }

    fn row() -> SafRow {
        SafRow {
            id: SafId(3),
            service: "pos".into(),
            direction: Direction::ToNode("02".into()),
            kind: SafKind::Reversal,
            mti: "0420".into(),
            keys: SafKeys {
                f11: Some("000123".into()),
                f37: Some("R1".into()),
                f7: Some("1204114300".into()),
                pan_masked: Some("476173******0119".into()),
                original: None,
            },
            state: SafState::Pending,
            created_at: 1_000,
            expires_at: 86_401_000,
            attempts: 2,
            next_attempt_at: 61_000,
            last_error: Some("timeout".into()),
            lease_owner: Some("host/1".into()),
            lease_until: Some(2_000),
            completed_at: None,
            completed_by: None,
            answer: None,
            reason: None,
        }
    }

    #[test]
    fn an_entry_is_shown_without_payload_with_utc_times() {
        let view = SafEntryView::from(&row());
        assert_eq!(view.node.as_deref(), Some("02"));
        assert_eq!(view.next_attempt_at, "1970-01-01T00:01:01.000Z");
        // The lease ran out long ago: no one holds it.
        assert_eq!(view.lease_owner, None);
        let json = serde_json::to_value(&view).expect("json");
        assert!(json.get("payload").is_none(), "{json}");
        assert_eq!(json["pan_masked"], "476173******0119");
        assert_eq!(json["direction"], "to_node");
        let back: SafEntryView = serde_json::from_value(json).expect("reads back");
        assert_eq!(back, view);
        assert!(parse_rfc3339(&view.created_at).is_some());
    }

    #[test]
    fn a_sample_splits_by_service_and_kind() {
        let owed = |kind, pending| SafOwed {
            service: "pos".into(),
            kind,
            pending,
            in_flight: 1,
            oldest_pending_age_ms: Some(pending as i64 * 1000),
            dead: 1,
        };
        let sample = SafSample {
            taken: Instant::now(),
            groups: vec![owed(SafKind::Reversal, 3), owed(SafKind::Advice, 2)],
        };
        let by = sample.by_service();
        let pos = &by["pos"];
        assert_eq!(pos.of(SafKind::Reversal).pending, 3);
        let total = pos.total();
        assert_eq!((total.pending, total.in_flight, total.dead), (5, 2, 2));
        assert_eq!(total.oldest_pending_age_ms, Some(3000));
        assert!(!by.contains_key("atm"));
    }
}
