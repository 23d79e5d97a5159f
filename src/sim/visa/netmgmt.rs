//! The network's link management: its own sign-ons and echo tests on each
//! link, and the bank's network management (sign-on, sign-off, echo, key
//! requests), answered on the link it came on. Where the member's sign-on
//! opens a link (Mastercard), this is where the link opens and closes.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{Kind, NmKind, Pending, Shared, answer, lock, logical, mti};
use crate::iso8583::Message;
use crate::sim::ledger::is_key_management;

impl Shared {
    /// A sign-on or echo test (`0800` with F70) on link `link`.
    pub(super) fn send_network(&self, link: u64, kind: NmKind) -> bool {
        let net = self.spec.network();
        let mti = net.echo_mti.unwrap_or_else(|| mti(*b"0800"));
        let Some(response) = answer::response_mti(mti) else {
            return false;
        };
        let f70 = match kind {
            NmKind::SignOn => net.sign_on_f70.clone().unwrap_or_else(|| "001".into()),
            NmKind::Echo => net.echo_f70.clone().unwrap_or_else(|| "301".into()),
        };
        let (mut d, key, _) = self.fresh(mti);
        d.set_text(70, f70);
        let Ok(payload) = self.spec.encode(&d).map(Bytes::from) else {
            return false;
        };
        let pending = Pending {
            kind: match kind {
                NmKind::SignOn => Kind::SignOn { link },
                NmKind::Echo => Kind::Echo,
            },
            response,
        };
        if !self.send_expected(&payload, key, pending, |l| l.id == link) {
            return false;
        }
        let sent = match kind {
            NmKind::SignOn => &self.stats.sign_ons_sent,
            NmKind::Echo => &self.stats.echo_sent,
        };
        sent.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The bank's `0800`: answered `0810` F39 `00` on the link it came on (a
    /// link-level exchange), or any link if that one is gone.
    pub(super) fn on_network_request(&self, link: u64, msg: &Message<'_>) {
        let stats = &self.stats;
        stats.network_requests.fetch_add(1, Ordering::Relaxed);
        let net = self.spec.network();
        let f70 = logical(msg, 70);
        let is = |v: &Option<String>, dflt: &str| f70 == v.as_deref().unwrap_or(dflt).as_bytes();
        if is(&net.sign_on_f70, "001") {
            stats.bank_sign_ons.fetch_add(1, Ordering::Relaxed);
            self.member_signed(link, true);
        } else if is(&net.sign_off_f70, "002") {
            stats.bank_sign_offs.fetch_add(1, Ordering::Relaxed);
            self.member_signed(link, false);
        } else if is(&net.echo_f70, "301") {
            stats.bank_echoes.fetch_add(1, Ordering::Relaxed);
        } else if is_key_management(&f70) {
            stats.bank_key_requests.add(&f70);
        }
        let Ok(resp) = answer(&self.spec, msg, "00") else {
            stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let sent = self.send_where(&resp, |l| l.id == link).is_some()
            || self.send_where(&resp, |_| true).is_some();
        let counter = if sent {
            &stats.network_answered
        } else if lock(&self.links).is_empty() {
            &stats.network_link_gone
        } else {
            &stats.answers_unsent
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The member signed link `link` on or off. Where the member's sign-on
    /// is what opens a link (Mastercard), the link carries the network's
    /// requests from its sign-on to its sign-off.
    fn member_signed(&self, link: u64, on: bool) {
        if self.network.signs_on() {
            return;
        }
        if let Some(l) = lock(&self.links).iter().find(|l| l.id == link) {
            l.signed_on.store(on, Ordering::Relaxed);
        }
    }
}
