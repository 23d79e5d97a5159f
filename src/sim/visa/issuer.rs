//! The simulator as acquirer for the bank's cards: issuer requests (`0100` /
//! `0200`) sent at a rate on signed-on links, each registered as
//! outstanding (its answer is checked by F4, F32, F37 and F41). The
//! network management, the owed messages and the links are their own files.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::watch;

use super::{CHECKED, Kind, Pending, Shared};
use crate::sim::answer;
use crate::sim::peer::Pacer;

impl Shared {
    /// One issuer request (the bank's card, VISA acquiring) on a signed-on
    /// link. `false` when no link could take it (nothing is counted then: the
    /// request is sent later).
    pub(super) fn send_issuer_request(&self) -> bool {
        let mtis = &self.cfg.mtis;
        let Some(&mti) =
            mtis.get(self.next_mti.fetch_add(1, Ordering::Relaxed) % mtis.len().max(1))
        else {
            return false;
        };
        let Some(response) = answer::response_mti(mti) else {
            return false;
        };
        let (mut d, key, stan) = self.fresh(mti);
        let amount = 100 + u64::from(stan % 100_000);
        // F37: a retrieval reference of our own, unique per request.
        let card = self.network.card();
        let rrn = format!(
            "{}{:05}{stan:06}",
            card.rrn_letter,
            (key / 1_000_000) % 100_000
        );
        // Only fields whose VISA encoding is settled (see the module notes).
        d.set_text(2, card.pan);
        d.set_text(3, "000000");
        d.set_text(4, format!("{amount:012}"));
        d.set_text(12, "120000");
        d.set_text(13, "1203");
        d.set_text(14, "2812");
        d.set_text(32, card.acquirer);
        d.set_text(37, rrn.clone());
        d.set_text(41, card.terminal);
        d.set_text(42, card.merchant);
        d.set_text(49, "840");
        let payload = match self.spec.encode(&d) {
            Ok(p) => Bytes::from(p),
            Err(e) => {
                tracing::error!(error = %e, "sim visa: cannot build an issuer request");
                return false;
            }
        };
        let echoed = CHECKED
            .iter()
            .filter_map(|&id| {
                let v = d.get(id)?.as_text()?;
                Some((id, v.as_bytes().to_vec()))
            })
            .collect();
        let pending = Pending {
            kind: Kind::Issuer { echoed },
            response,
        };
        let sent = self.send_expected(&payload, key, pending, |l| {
            l.signed_on.load(Ordering::Relaxed)
        });
        if sent {
            self.stats.issuer_sent.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }
}

/// Sends issuer requests at `rate` until `count` are sent or `duration` has
/// passed. Requests no link can take wait for one (they are not dropped).
pub(super) async fn originate(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let Some(mut pacer) = shared.cfg.rate.and_then(Pacer::new) else {
        return;
    };
    let stop_at = shared.base.checked_add(shared.cfg.duration);
    let limit = shared.cfg.count.unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            _ = pacer.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = Instant::now();
        let sent = shared.stats.issuer_sent.load(Ordering::Relaxed);
        if stop_at.is_some_and(|s| now >= s) || sent >= limit {
            return;
        }
        if shared.paused.load(Ordering::Relaxed) {
            pacer.restart();
            continue;
        }
        let owed = pacer.owed(now, sent).min(limit - sent);
        for _ in 0..owed {
            if !shared.send_issuer_request() {
                break;
            }
        }
    }
}
