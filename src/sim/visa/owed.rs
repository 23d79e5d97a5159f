//! What the simulated VISA books of the money it is owed and the keys it
//! exchanges: the bank's reversals of its late approvals, read by its own
//! F90 reading and answered (or ignored, as a test asks), and the key
//! exchanges it starts.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::{Kind, Pending, Shared, answer, mti};
use crate::iso8583::Message;
use crate::sim::ledger::Taken;

impl Shared {
    /// The bank's reversal (`0420`, repeated as `0421`) of an approval of
    /// ours: booked in its chain ([`crate::sim::ledger::ReversalBook::take`])
    /// and answered `0430` on any link, unless it is one of the first
    /// `ignore_reversals` of its chain; F39 `30` when F90 names nothing.
    pub(super) fn on_reversal(&self, msg: &Message<'_>) {
        let book = &self.stats.reversals;
        let code = match book.take(msg, self.cfg.ignore_reversals) {
            Taken::Ignored => return,
            Taken::Answer(_) => "00",
            Taken::Unreadable => "30",
        };
        let Ok(resp) = answer(&self.spec, msg, code) else {
            self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if self.send_where(&resp, |_| true).is_some() {
            book.answered();
        }
    }

    /// A key exchange of VISA's (`0800` F70 `key_reset_f70`) on a
    /// signed-on link; its `0810` may come back on any link.
    fn send_key_reset(&self) -> bool {
        let mti = self
            .spec
            .network()
            .echo_mti
            .unwrap_or_else(|| mti(*b"0800"));
        let Some(response) = crate::sim::answer::response_mti(mti) else {
            return false;
        };
        let (mut d, key, _) = self.fresh(mti);
        d.set_text(70, self.cfg.key_reset_f70.clone());
        let Ok(payload) = self.spec.encode(&d).map(Bytes::from) else {
            return false;
        };
        let pending = Pending {
            kind: Kind::KeyReset,
            response,
        };
        let sent = self.send_expected(&payload, key, pending, |l| {
            l.signed_on.load(Ordering::Relaxed)
        });
        if sent {
            self.stats.key_resets_sent.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }
}

/// Starts a key exchange every `every` until `duration` has passed (none
/// while paused; a tick with no signed-on link is skipped).
pub(super) async fn reset_keys(
    shared: Arc<Shared>,
    every: Duration,
    shutdown: watch::Receiver<bool>,
) {
    let stop_at = shared.base.checked_add(shared.cfg.duration);
    crate::sim::peer::every_until(every, stop_at, shutdown, || {
        if !shared.paused.load(Ordering::Relaxed) {
            shared.send_key_reset();
        }
        true
    })
    .await;
}
