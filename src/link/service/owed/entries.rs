//! The store-and-forward entries of a service: an advice stored before
//! it is acknowledged (store-and-forward mode), and what the answer to an
//! owed message, or its missing answer, does to its entry (completed,
//! attempted again, or a dead letter).

use std::sync::atomic::Ordering;

use super::*;

impl Owed<'_> {
    /// An advice from the front in `store-and-forward` mode: stripped of its
    /// sensitive authentication data (track, PIN block, the EMV track
    /// equivalents: `iso8583::strip_sad`), stored and synced, then acknowledged
    /// by the switch (0x30, F39 00), then delivered to a node from the queue. A
    /// store that cannot take it means no acknowledgement: the sender repeats.
    /// One that cannot be stored without its SAD (its PAN only in the track,
    /// F55 not TLV) is given back, to be forwarded as in `forward` mode.
    pub(in crate::link::service) fn store_advice(
        &self,
        req: &Checked<'_>,
        origin: Origin,
    ) -> Result<(), Origin> {
        let svc = self.svc;
        let c = &svc.made.counters;
        let Some(outbox) = svc.made.saf() else {
            c.advices_unanswered.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let payload = req.msg.payload().clone();
        let mut decoded = match req.msg.decode() {
            Ok(d) => d,
            Err(_) => {
                c.advices_unanswered.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        };
        let kept = crate::iso8583::strip_sad(&mut decoded)
            .and_then(|_| crate::iso8583::strip_sensitive_subelements(svc.spec(), &mut decoded))
            .map_err(|e| e.to_string())
            .and_then(|_| svc.spec().encode(&decoded).map_err(|e| e.to_string()));
        let kept = match kept {
            Ok(k) => k,
            Err(why) => {
                c.advices_unstorable.fetch_add(1, Ordering::Relaxed);
                tracing::info!(service = svc.name(), why, message = %summary(&req.msg), "advice not storable without its sensitive authentication data: forwarded, not acknowledged by the switch");
                return Err(origin);
            }
        };
        let now = now_millis();
        let entry = NewSafEntry {
            service: svc.name().to_string(),
            direction: Direction::ToAnyNode,
            kind: SafKind::Advice,
            mti: req.msg.mti().as_str().to_string(),
            payload: kept,
            keys: self.keys_of(&decoded),
            created_at: now,
            expires_at: outbox.policy.expires_at(now),
            first_attempt_at: now,
        };
        let ack = match outbox.store.saf_submit(entry) {
            Ok(ack) => ack,
            Err(e) => {
                c.advices_unanswered.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = svc.name(), error = %e, message = %summary(&req.msg), "advice not stored: not acknowledged (the sender repeats)");
                return Ok(());
            }
        };
        let acknowledgement =
            crate::link::decline::build(svc.spec(), &payload, *b"00").map(|resp| {
                let patch = svc.router.response_tpdu_patch(&payload);
                Outbound::Message(resp, patch)
            });
        let wake = std::sync::Arc::clone(&outbox.wake);
        let service = svc.name().to_string();
        let what = summary(&req.msg);
        // Journaled once stored and acknowledged: the switch answered it.
        let journaled = origin.journal_link().and_then(|link| {
            let seen = Seen::new(link, &payload, AnsweredBy::Stored);
            let response = match &acknowledgement {
                Ok(Outbound::Message(resp, _)) => Some(resp.clone()),
                _ => None,
            };
            let seen = Seen { response, ..seen };
            svc.exchange_of(seen, std::time::Instant::now())
                .map(|(j, ex)| (j.clone(), ex))
        });
        svc.made
            .counters
            .advices_stored
            .fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            match ack.await {
                Ok(id) => {
                    wake.notify_one();
                    if let (Origin::Client { tx, slot, .. }, Ok(out)) = (origin, acknowledgement) {
                        drop(slot); // free before the client can read the acknowledgement
                        let _ = tx.try_send(out);
                    }
                    if let Some((journal, ex)) = journaled {
                        journal.exchange(ex);
                    }
                    tracing::debug!(service, %id, message = %what, "advice stored and acknowledged");
                }
                Err(e) => {
                    tracing::warn!(service, error = %e, message = %what, "advice not stored: not acknowledged (the sender repeats)");
                }
            }
        });
        Ok(())
    }

    /// The host answered an owed message (`entry`: its id, kind, attempt and
    /// deadline). Its F39 decides, by the dialect's classes
    /// (`route::integrity::SafAnswers`): done completes the entry; reconcile
    /// completes it flagged (`reason`); retry counts as an unanswered attempt
    /// (the next one is scheduled, or it is a dead letter past its limits);
    /// any other code makes it a dead letter at once. Only a host's "done"
    /// closes what the switch owes.
    pub(crate) fn answered(&self, entry: (SafId, SafKind, u32, i64), answer: &Message<'_>) {
        let svc = self.svc;
        let (id, kind, attempt, expires_at) = entry;
        let Some(outbox) = svc.made.saf() else {
            return;
        };
        let f39 = answer
            .field(39)
            .ok()
            .flatten()
            .map(|f| f.show().to_string())
            .unwrap_or_default();
        let said = format!("{} F39 {f39}", answer.mti());
        let c = &svc.made.counters;
        let class = svc.made.saf_answers.class(answer);
        let flag = match class {
            SafAnswerClass::Done => None,
            SafAnswerClass::Reconcile => {
                c.saf_answers_reconcile.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = svc.name(), %id, answer = %said, "owed message taken with a code to reconcile");
                Some(format!("reconcile: the host answered {f39}"))
            }
            SafAnswerClass::Retry => {
                c.saf_answers_retry.fetch_add(1, Ordering::Relaxed);
                let why = format!("the host answered {said}");
                failed(outbox, svc.name(), id, attempt, expires_at, &why);
                return;
            }
            SafAnswerClass::Dead => {
                c.saf_answers_dead.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service = svc.name(), %id, answer = %said, "owed message refused by the host: a dead letter");
                record_dead(&outbox.store, id, format!("the host refused it: {said}"));
                return;
            }
        };
        let counter = match kind {
            SafKind::Reversal => &c.reversals_acknowledged,
            SafKind::Advice => &c.advices_delivered,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let store = outbox.store.clone();
        let owner = outbox.owner.clone();
        let service = svc.name().to_string();
        tokio::spawn(async move {
            if let Err(e) = store
                .saf_completed(id, &owner, now_millis(), &said, flag.as_deref())
                .await
            {
                tracing::warn!(service, %id, error = %e, "owed message answered, but the store did not record it: it will be sent again (a repeat)");
            }
        });
    }

    /// An owed message went unanswered (no answer in time, the connection
    /// lost): its entry waits for the next attempt, or becomes a dead letter.
    pub(crate) fn attempt_failed(
        &self,
        id: SafId,
        attempt: u32,
        expires_at: i64,
        reason: DeclineReason,
    ) {
        let svc = self.svc;
        if let Some(outbox) = svc.made.saf() {
            failed(outbox, svc.name(), id, attempt, expires_at, reason.as_str());
        }
    }
}

/// An attempt that got no answer (timeout, lost connection): the next one
/// is scheduled, or the entry is a dead letter.
pub(in crate::link::service) fn failed(
    outbox: &SafOutbox,
    service: &str,
    id: SafId,
    attempt: u32,
    expires_at: i64,
    why: &str,
) {
    let now = now_millis();
    match outbox.policy.after_failure(attempt, now, expires_at) {
        AfterFailure::RetryAt(next) => {
            record_attempt(&outbox.store, &outbox.owner, id, next, why);
        }
        AfterFailure::Dead(reason) => {
            tracing::warn!(service, %id, reason, "owed message given up: a dead letter");
            record_dead(&outbox.store, id, reason);
        }
    }
}

pub(crate) fn record_attempt(store: &Store, owner: &str, id: SafId, next: i64, why: &str) {
    let (store, owner, why) = (store.clone(), owner.to_string(), why.to_string());
    tokio::spawn(async move {
        if let Err(e) = store.saf_attempted(id, &owner, next, &why).await {
            tracing::warn!(%id, error = %e, "store-and-forward: attempt not recorded (the lease runs out and it is tried again)");
        }
    });
}

pub(crate) fn record_dead(store: &Store, id: SafId, reason: String) {
    let store = store.clone();
    tokio::spawn(async move {
        if let Err(e) = store.saf_dead(id, now_millis(), &reason).await {
            tracing::warn!(%id, error = %e, "store-and-forward: dead letter not recorded");
        }
    });
}
