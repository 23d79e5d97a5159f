//! What the store holds and does, as metrics: the store-and-forward queue
//! (from the sample a task takes once a second, never from the store at
//! scrape time), the journal's rows and its disk guard, and the admin
//! audit.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::{counter, encode_counters, encode_gauges, gauge, label_value};
use crate::ops::control::SwitchHandle;
use crate::ops::saf::{SafSample, ServiceSaf};
use crate::store::SafKind;

/// The store-and-forward queue, when there is a store. What it owes
/// (depth, oldest age, dead letters) comes from the last sample (taken once
/// a second by its own task, never here): zero for a service or kind that
/// owes nothing, absent before the first sample. Deliveries and repeats are
/// this instance's own counters, so that with a shared PostgreSQL store the
/// instances' rates add up.
pub(super) fn encode_saf(enc: &mut DescriptorEncoder, handle: &SwitchHandle) -> std::fmt::Result {
    let Some(view) = handle.saf.as_ref() else {
        return Ok(());
    };
    let mut delivered = counter(
        "isoswitch_saf_delivered",
        "Store-and-forward entries this instance delivered (a host or the peer answered), by kind.",
    );
    let mut sent = counter(
        "isoswitch_saf_sent",
        "Store-and-forward delivery attempts this instance put on the wire (first sends and repeats).",
    );
    let mut repeats = counter(
        "isoswitch_saf_repeats",
        "Store-and-forward attempts after an entry's first, sent as repeats (MTI ending in 1: 0421, 0221).",
    );
    for r in handle.services.iter() {
        let s = &r.service;
        let c = &s.view().made.counters;
        let sl = || vec![("service", label_value(s.name()))];
        for (kind, v) in [
            ("reversal", &c.reversals_acknowledged),
            ("advice", &c.advices_delivered),
        ] {
            let mut l = sl();
            l.push(("kind", kind.to_string()));
            delivered.samples.push((l, v.load(Ordering::Relaxed)));
        }
        sent.samples
            .push((sl(), c.saf_sent.load(Ordering::Relaxed)));
        repeats
            .samples
            .push((sl(), c.saf_repeats.load(Ordering::Relaxed)));
    }
    for f in [&delivered, &sent, &repeats] {
        encode_counters(enc, f)?;
    }
    match view.latest() {
        Some(sample) => encode_owed(enc, handle, &sample),
        None => Ok(()),
    }
}

/// The journal's writer: rows written, dropped by a full queue, failed,
/// purged, and its queue's depth (`isoswitch_journal_*`, docs/journal.md).
pub(super) fn encode_journal(
    enc: &mut DescriptorEncoder,
    handle: &SwitchHandle,
) -> std::fmt::Result {
    let Some(j) = handle.journal.as_ref() else {
        return Ok(());
    };
    let c = &j.counters;
    let one = |name, help, v: &AtomicU64| {
        let mut f = counter(name, help);
        f.samples.push((Vec::new(), v.load(Ordering::Relaxed)));
        f
    };
    for f in [
        one(
            "isoswitch_journal_written",
            "Exchange rows the journal committed.",
            &c.written,
        ),
        one(
            "isoswitch_journal_admin_written",
            "Admin rows the journal committed before the admin audit had its own writer (now always 0; see isoswitch_admin_audit_written).",
            &c.admin_written,
        ),
        one(
            "isoswitch_journal_dropped",
            "Journal rows lost to a full queue (journal.queue): the writer was behind. Never waited for on the message path.",
            &c.dropped,
        ),
        one(
            "isoswitch_journal_failed",
            "Journal rows lost to a failed insert (the store refused their batch; logged).",
            &c.failed,
        ),
        one(
            "isoswitch_journal_purged",
            "Rows deleted by retention (journal.retain) and by the disk guard (the oldest days, past journal.max_size or journal.min_free): journal rows (the admin audit has admin.audit_retain). On PostgreSQL, the rows of the whole days retention dropped, as the server's statistics count them.",
            &c.purged,
        ),
        one(
            "isoswitch_journal_paused",
            "Journal rows not written because the disk guard had paused the journal (past journal.max_size or journal.min_free with only today's rows left): lost to the journal, while SAF keeps writing.",
            &c.paused_rows,
        ),
    ] {
        encode_counters(enc, &f)?;
    }
    let mut depth = gauge(
        "isoswitch_journal_queue_depth",
        "Journal rows waiting for the writer, out of journal.queue.",
    );
    depth.samples.push((Vec::new(), j.queued() as f64));
    encode_gauges(enc, &depth)?;
    let mut paused = gauge(
        "isoswitch_journal_disk_paused",
        "1 while the disk guard pauses the journal (past journal.max_size or journal.min_free); it resumes by itself when space returns.",
    );
    paused.samples.push((
        Vec::new(),
        if c.paused.load(Ordering::Relaxed) {
            1.0
        } else {
            0.0
        },
    ));
    encode_gauges(enc, &paused)
}

/// The admin audit (`isoswitch_admin_audit_*`, `isoswitch_admin_tokens_*`).
pub(super) fn encode_audit(enc: &mut DescriptorEncoder, handle: &SwitchHandle) -> std::fmt::Result {
    let c = &handle.audit.counters;
    for (name, help, v) in [
        (
            "isoswitch_admin_audit_written",
            "Admin audit rows the store committed (changes, reads of card transactions, refused tokens counted once a second per peer).",
            &c.written,
        ),
        (
            "isoswitch_admin_audit_lost",
            "Admin audit rows not stored (full queue or failed insert); the log has them.",
            &c.lost,
        ),
        (
            "isoswitch_admin_audit_purged",
            "Admin audit rows deleted by retention (admin.audit_retain).",
            &c.purged,
        ),
        (
            "isoswitch_admin_tokens_refused",
            "Requests refused for a missing or wrong admin token.",
            &c.refused,
        ),
        (
            "isoswitch_admin_locked_out",
            "Requests answered 429: their peer was locked out after admin.max_refused_tokens.",
            &c.locked_out,
        ),
    ] {
        let mut f = counter(name, help);
        f.samples.push((Vec::new(), v.load(Ordering::Relaxed)));
        encode_counters(enc, &f)?;
    }
    Ok(())
}

/// The gauges of what the queue owes, from `sample`.
fn encode_owed(
    enc: &mut DescriptorEncoder,
    handle: &SwitchHandle,
    sample: &SafSample,
) -> std::fmt::Result {
    let by = sample.by_service();
    let mut depth = gauge(
        "isoswitch_saf_depth",
        "Store-and-forward entries still owed (pending), by kind: reversal, advice. From the store: with a shared store every instance reports the same queue.",
    );
    let mut dead = gauge(
        "isoswitch_saf_dead_letters",
        "Entries parked as dead letters (past store.saf.max_age or max_attempts), waiting for an operator: isoswitch ctl saf --state dead.",
    );
    let mut oldest = gauge(
        "isoswitch_saf_oldest_age_seconds",
        "Age of the oldest pending store-and-forward entry (0 when none).",
    );
    let none = ServiceSaf::default();
    for r in handle.services.iter() {
        let name = r.service.name();
        let saf = by.get(name).unwrap_or(&none);
        let sl = || vec![("service", label_value(name))];
        for (kind, label) in [(SafKind::Reversal, "reversal"), (SafKind::Advice, "advice")] {
            let owed = saf.of(kind);
            let mut l = sl();
            l.push(("kind", label.to_string()));
            depth.samples.push((l.clone(), owed.pending as f64));
            dead.samples.push((l, owed.dead as f64));
        }
        let age_ms = saf.total().oldest_pending_age_ms.unwrap_or(0);
        oldest.samples.push((sl(), age_ms as f64 / 1e3));
    }
    for f in [&depth, &dead, &oldest] {
        encode_gauges(enc, f)?;
    }
    let mut m = enc.encode_descriptor(
        "isoswitch_saf_sample_age_seconds",
        "Seconds since the store last answered the query isoswitch_saf_depth, _dead_letters and _oldest_age_seconds come from (sampled every second; growing: the store is slow or away).",
        None,
        MetricType::Gauge,
    )?;
    m.encode_gauge(&sample.taken.elapsed().as_secs_f64())
}
