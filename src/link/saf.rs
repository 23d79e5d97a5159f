//! Store-and-forward delivery: one loop per switch instance takes what is due
//! from the store (a lease, so that with a shared PostgreSQL store exactly one
//! instance sends an entry at a time, and another takes it over once the
//! holder's lease runs out), sends each entry to its node or peer, and
//! registers it in its service's correlation table. The answer completes the
//! entry ([`super::service`]'s `deliver`); no answer by the deadline, or no
//! way to send, schedules the next attempt with backoff, until the entry's
//! max age makes it a dead letter. An attempt after the first goes out as a
//! repeat (MTI ending in 1: 0421, 0221): at least once, with repeats the
//! hosts can recognise.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use super::io::writer::Outbound;
use super::service::{Origin, Pending, Service, record_attempt, record_dead};
use crate::iso8583::{Mti, RepeatKeys, Spec, transmission_date_time};
use crate::route::OnTimeout;
use crate::store::{
    AfterFailure, ClaimedSaf, Direction, SafKind, SafPolicy, Store, repeat_mti, saf::now_millis,
};

/// Entries taken from the store at once.
const CLAIM_BATCH: usize = 64;
/// How often the loop looks for due entries when nothing woke it (retries
/// come due on their own).
const POLL: Duration = Duration::from_millis(500);

/// Delivers what every service of this instance owes, until `shutdown`.
pub async fn run(services: Vec<Arc<Service>>, mut shutdown: watch::Receiver<bool>) {
    let Some(outbox) = services.iter().find_map(|s| s.made.saf()) else {
        return;
    };
    let (store, owner, policy, wake) = (
        outbox.store.clone(),
        outbox.owner.clone(),
        outbox.policy.clone(),
        Arc::clone(&outbox.wake),
    );
    let by_name: HashMap<String, Arc<Service>> = services
        .into_iter()
        .map(|s| (s.name().to_string(), s))
        .collect();
    release_own_leases(&store, &owner).await;
    let mut complained = None::<Instant>;
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.changed() => return,
        }
        loop {
            let claimed = match store
                .saf_claim(&owner, now_millis(), CLAIM_BATCH, policy.lease)
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    // A store outage: what is owed waits in the store.
                    if complained.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::warn!(error = %e, "store-and-forward: cannot take due entries; they wait in the store");
                        complained = Some(Instant::now());
                    }
                    break;
                }
            };
            let full = claimed.len() == CLAIM_BATCH;
            for entry in claimed {
                send(&by_name, &store, &owner, &policy, entry, Instant::now());
            }
            if !full {
                break;
            }
        }
    }
}

/// At start, what this instance leased before it last stopped is due again
/// at once: a kill -9 leaves the leases of attempts in flight, and waiting
/// for them to run out (`saf.lease`) would hold a reversal back for nothing.
/// Each goes out again as a repeat, since its attempt may have reached the
/// host. A store that cannot do it now only delays them to the lease's end.
async fn release_own_leases(store: &Store, owner: &str) {
    match store.saf_release_leases(owner).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            owner,
            entries = n,
            "store-and-forward: leases of this instance's previous run released; those entries are due now"
        ),
        Err(e) => tracing::warn!(
            owner,
            error = %e,
            "store-and-forward: cannot release the previous run's leases; its entries wait for them to run out"
        ),
    }
}

/// One attempt of `entry`, claimed by the caller, by its service's outbox:
/// what the delivery loop does with each entry it claims, for a caller with
/// a clock of its own (`inproc::Rig`): the attempt's wait in the correlation
/// table is counted from `at`. Nothing is sent without an outbox. An entry
/// for any node (an advice's first attempt) is pinned to its node by a
/// store write first, and sent after it on the real clock, as in the loop.
pub fn send_claimed(svc: &Arc<Service>, entry: ClaimedSaf, at: Instant) {
    let Some(outbox) = svc.made.saf() else {
        return;
    };
    let services = HashMap::from([(svc.name().to_string(), Arc::clone(svc))]);
    let (store, owner, policy) = (&outbox.store, &outbox.owner, &outbox.policy);
    send(&services, store, owner, policy, entry, at);
}

/// One attempt of one entry; `at` is the message path's clock, the store's
/// times stay on the wall clock.
fn send(
    services: &HashMap<String, Arc<Service>>,
    store: &Store,
    owner: &str,
    policy: &SafPolicy,
    entry: ClaimedSaf,
    at: Instant,
) {
    let now = now_millis();
    if let Some(why) = policy.refuse_send(&entry, now) {
        return record_dead(store, entry.id, why);
    }
    let Some(svc) = services.get(&entry.service) else {
        // Stored by a service this instance does not run (yet): another
        // instance may; try again later.
        let next = now.saturating_add(millis(policy.backoff(entry.attempt)));
        return record_attempt(store, owner, entry.id, next, "no such service here");
    };
    let payload = match as_sent(svc, &entry) {
        Ok(p) => p,
        Err(why) => return record_dead(store, entry.id, why.to_string()),
    };
    let sent = match (&entry.direction, svc.side.oneconnect()) {
        (Direction::ToPeer, _) => to_peer(svc, &entry, payload, at),
        (to, Some(oc)) => via_oneconnect(svc, oc, &entry, payload, to, policy),
        (Direction::ToNode(id), None) => to_node(svc, &entry, payload, id, at),
        (Direction::ToAnyNode, None) => match pick_node(svc, &entry, at) {
            Ok(node) => {
                let (store, owner) = (store.clone(), owner.to_string());
                let (svc, policy) = (Arc::clone(svc), policy.clone());
                tokio::spawn(pin_then_send(
                    svc, store, owner, policy, entry, payload, node,
                ));
                return;
            }
            Err(why) => Err(why),
        },
    };
    sent_or_failed(svc, store, owner, policy, &entry, sent);
}

/// Counts an attempt that went out, or schedules the next one (or makes the
/// entry a dead letter) when it could not.
fn sent_or_failed(
    svc: &Service,
    store: &Store,
    owner: &str,
    policy: &SafPolicy,
    entry: &ClaimedSaf,
    sent: Result<(), &str>,
) {
    let now = now_millis();
    let c = &svc.made.counters;
    match sent {
        Ok(()) => {
            c.saf_sent.fetch_add(1, Ordering::Relaxed);
            if entry.kind == SafKind::Reversal {
                c.reversals_sent.fetch_add(1, Ordering::Relaxed);
            }
            if entry.attempt > 1 {
                c.saf_repeats.fetch_add(1, Ordering::Relaxed);
            }
        }
        Err(why) => match policy.after_failure(entry.attempt, now, entry.expires_at) {
            AfterFailure::RetryAt(next) => record_attempt(store, owner, entry.id, next, why),
            AfterFailure::Dead(reason) => record_dead(store, entry.id, reason),
        },
    }
}

/// The node the balancer would give an entry for any node now.
fn pick_node(svc: &Service, entry: &ClaimedSaf, now: Instant) -> Result<String, &'static str> {
    let mti: [u8; 4] = entry
        .mti
        .as_bytes()
        .try_into()
        .map_err(|_| "stored MTI is not 4 digits")?;
    let (picked, _conn) = svc
        .pool
        .pick(&mti, |_| None, None, now)
        .map_err(|_| "no node can take it")?;
    svc.pool
        .node(picked.node())
        .map(|n| n.id.to_string())
        .ok_or("no node can take it")
}

/// An entry for any node (a client's advice) goes to one node for good:
/// the one picked for its first attempt is written to the store before
/// anything is sent, so every repeat (0221) reaches the host that may have
/// booked the first, whichever instance sends it. A store that cannot
/// record it sends nothing: the lease runs out and the entry is tried
/// again.
async fn pin_then_send(
    svc: Arc<Service>,
    store: Store,
    owner: String,
    policy: SafPolicy,
    entry: ClaimedSaf,
    payload: Bytes,
    node: String,
) {
    match store.saf_pin(entry.id, &owner, &node).await {
        Ok(true) => {
            let sent = to_node(&svc, &entry, payload, &node, Instant::now());
            sent_or_failed(&svc, &store, &owner, &policy, &entry, sent);
        }
        Ok(false) => {
            tracing::info!(id = %entry.id, "store-and-forward: entry moved on before its node was recorded; not sent")
        }
        Err(e) => {
            tracing::warn!(id = %entry.id, error = %e, "store-and-forward: cannot record the entry's node; not sent, tried again when its lease runs out")
        }
    }
}

/// Why a stored entry cannot be sent again: it becomes a dead letter, with
/// this as its reason.
#[derive(Debug, thiserror::Error)]
enum Unsendable {
    #[error("stored message does not decode: {0}")]
    Decode(#[source] crate::iso8583::IsoError),
    #[error(transparent)]
    RepeatMti(#[from] crate::store::MtiError),
    #[error("repeat MTI {mti}: {reason}")]
    BadRepeat { mti: String, reason: String },
    #[error("repeat does not encode: {0}")]
    Encode(#[source] crate::iso8583::IsoError),
}

/// The entry's message as this attempt sends it: the first as stored, any
/// later one as a repeat.
fn as_sent(svc: &Service, entry: &ClaimedSaf) -> Result<Bytes, Unsendable> {
    if entry.attempt <= 1 {
        return Ok(Bytes::from(entry.payload.clone()));
    }
    let secs = u64::try_from(now_millis() / 1000).unwrap_or_default();
    repeat_of(svc.spec(), entry, secs, fresh_stan)
}

/// A repeat of `entry`: the repeat MTI (0421, 0221), and where the dialect
/// wants them (`integrity.repeat_keys = "fresh"`), a STAN from `stan` and
/// F7 = `now_secs`; otherwise the first attempt's F11 and F7.
fn repeat_of(
    spec: &Spec,
    entry: &ClaimedSaf,
    now_secs: u64,
    stan: impl FnOnce() -> u32,
) -> Result<Bytes, Unsendable> {
    let mut d = spec.decode(&entry.payload).map_err(Unsendable::Decode)?;
    let repeat = repeat_mti(&entry.mti)?;
    d.mti = repeat.parse::<Mti>().map_err(|e| Unsendable::BadRepeat {
        reason: e.to_string(),
        mti: repeat,
    })?;
    if spec.integrity().repeat_keys == RepeatKeys::Fresh {
        let f7 = transmission_date_time(now_secs);
        d.set_text(7, String::from_utf8_lossy(&f7).into_owned());
        d.set_text(11, format!("{:06}", stan()));
    }
    spec.encode(&d).map(Bytes::from).map_err(Unsendable::Encode)
}

/// The switch's own STAN sequence, for repeats with fresh keys: 1 to
/// 999999, starting where the second of the day puts it, so that a restart
/// does not begin again at the numbers it just used.
fn fresh_stan() -> u32 {
    static NEXT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let start = || {
        let second_of_day = (now_millis() / 1000).rem_euclid(86_400);
        AtomicU32::new(u32::try_from(second_of_day * 11).unwrap_or_default())
    };
    NEXT.get_or_init(start).fetch_add(1, Ordering::Relaxed) % 999_999 + 1
}

/// Sends on a OneConnect service: its nodes have no standing connection
/// to send on, so a pool task carries the attempt as it carries a request.
fn via_oneconnect(
    svc: &Arc<Service>,
    oc: &Arc<super::front::oneconnect::OneConnect>,
    entry: &ClaimedSaf,
    payload: Bytes,
    to: &Direction,
    policy: &SafPolicy,
) -> Result<(), &'static str> {
    let only = match to {
        Direction::ToNode(id) => Some(
            svc.pool
                .index_of(id.as_bytes())
                .ok_or("node is not configured")?,
        ),
        _ => None,
    };
    let mti: [u8; 4] = entry
        .mti
        .as_bytes()
        .try_into()
        .map_err(|_| "stored MTI is not 4 digits")?;
    let wait = svc.live().timeouts.of(&mti).after.min(policy.lease / 2);
    super::front::oneconnect::send_owed(svc, oc, entry, payload, only, wait);
    Ok(())
}

/// Sends to node `id` and waits for its answer in the correlation table.
fn to_node(
    svc: &Service,
    entry: &ClaimedSaf,
    payload: Bytes,
    id: &str,
    now: Instant,
) -> Result<(), &'static str> {
    let checked = svc
        .check(payload.clone())
        .map_err(|_| "stored message is invalid")?;
    let node = svc
        .pool
        .index_of(id.as_bytes())
        .ok_or("node is not configured")?;
    let conn = svc
        .pool
        .node(node)
        .and_then(|n| n.live_conn())
        .ok_or("node is not connected")?;
    register(svc, entry, &checked, payload.clone(), node, conn.id, now)?;
    let key = svc.router.key_of(&checked).map_err(|_| "no key")?;
    if conn.tx.try_send(Outbound::message(payload)).is_err() {
        svc.in_flight.cancel(&key, now);
        return Err("node connection queue full");
    }
    Ok(())
}

/// Sends to the peer on a signed-on out link.
fn to_peer(
    svc: &Service,
    entry: &ClaimedSaf,
    payload: Bytes,
    now: Instant,
) -> Result<(), &'static str> {
    let out = svc.side.out_links().ok_or("the service has no peer")?;
    let checked = svc
        .check(payload.clone())
        .map_err(|_| "stored message is invalid")?;
    register(svc, entry, &checked, payload.clone(), usize::MAX, 0, now)?;
    let key = svc.router.key_of(&checked).map_err(|_| "no key")?;
    if out.send(Outbound::message(payload), now).is_err() {
        svc.in_flight.cancel(&key, now);
        return Err("no out link can take it");
    }
    Ok(())
}

/// Registers an owed message in its service's correlation table, so its
/// answer finds it; it waits at most the flow's timeout, within the lease.
fn register(
    svc: &Service,
    entry: &ClaimedSaf,
    checked: &crate::route::Checked<'_>,
    payload: Bytes,
    node: usize,
    via: u64,
    now: Instant,
) -> Result<(), &'static str> {
    let key = svc
        .router
        .key_of(checked)
        .map_err(|_| "no correlation key")?;
    let mti = checked.msg.mti().digits();
    let outbox = svc.made.saf().ok_or("no store")?;
    let wait = svc
        .live()
        .timeouts
        .of(&mti)
        .after
        .min(outbox.policy.lease / 2);
    let pending = Pending {
        origin: Origin::Owed {
            id: entry.id,
            kind: entry.kind,
            attempt: entry.attempt,
            expires_at: entry.expires_at,
        },
        request: payload,
        facts: super::service::RequestFacts::own(checked.msg.mti()),
        node,
        sent_at: now,
        on_timeout: OnTimeout::Silent,
        same: Default::default(),
    };
    svc.in_flight
        .insert(key, pending, via, now + wait)
        .map_err(|_| "its key is in flight already")
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso8583::samples;

    fn entry(spec: &Spec) -> ClaimedSaf {
        let mut d = samples::purchase(spec);
        d.mti = "0420".parse().expect("mti");
        d.set_text(11, "000123");
        d.set_text(7, "0101120000");
        ClaimedSaf {
            id: crate::store::SafId(1),
            service: "s".into(),
            direction: Direction::ToPeer,
            kind: SafKind::Reversal,
            mti: "0420".into(),
            payload: spec.encode(&d).expect("encodes"),
            attempt: 2,
            created_at: 0,
            expires_at: 1,
            lease_until: 1,
        }
    }

    fn text(spec: &Spec, payload: &[u8], id: u16) -> String {
        let d = spec.decode(payload).expect("decodes");
        d.get(id)
            .and_then(|v| v.as_text())
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn a_repeat_keeps_f11_and_f7_unless_the_dialect_wants_them_fresh() {
        let spec = Spec::builtin("cups").expect("cups");
        let kept = repeat_of(&spec, &entry(&spec), 86_400 * 40, || 777).expect("repeat");
        assert_eq!(spec.decode(&kept).expect("decodes").mti.as_str(), "0421");
        assert_eq!(text(&spec, &kept, 11), "000123");
        assert_eq!(text(&spec, &kept, 7), "0101120000");

        let toml = include_str!("../../specs/cups.toml").replacen(
            "[integrity]\n",
            "[integrity]\nrepeat_keys = \"fresh\"\n",
            1,
        );
        let fresh_spec = Spec::from_toml(&toml).expect("spec with fresh repeat keys");
        assert_eq!(fresh_spec.integrity().repeat_keys, RepeatKeys::Fresh);
        // 1970-02-10 00:00:07 UTC.
        let fresh =
            repeat_of(&fresh_spec, &entry(&fresh_spec), 86_400 * 40 + 7, || 777).expect("repeat");
        assert_eq!(text(&fresh_spec, &fresh, 11), "000777");
        assert_eq!(text(&fresh_spec, &fresh, 7), "0210000007");
    }

    #[test]
    fn the_switchs_stans_stay_in_range() {
        for _ in 0..10 {
            assert!((1..=999_999).contains(&fresh_stan()));
        }
    }
}
