//! UnionPay's part in a financial switch's store and forward: the member's
//! reversals and advices it books and answers, and the advices it sends of
//! its own and repeats until acknowledged.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::links::To;
use super::{Key, Kind, Pending, Shared, Tally, from_cups_envelope, key_of, transmission_time};
use crate::iso8583::{Decoded, Message, Mti, samples};
use crate::sim::answer::{self, response_mti};
use crate::sim::ledger::Taken;
use crate::sim::original::{OriginalData, OriginalKey};
use crate::sim::writer::Outbound;
use crate::util::rng::Rng;

impl Shared {
    /// One advice of UnionPay's (the next of `advice_mtis`) on an in link:
    /// its acknowledgement is expected on an out link, and it is repeated
    /// when none comes within `timeout`.
    pub(super) fn send_advice(&self) -> bool {
        let mtis = &self.cfg.advice_mtis;
        let turn = self.next_advice.fetch_add(1, Ordering::Relaxed);
        let built = mtis
            .get(turn % mtis.len().max(1))
            .and_then(|&mti| self.advice(mti));
        let Some((first, repeat, k, response)) = built else {
            self.stats.advices_unsent.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let kind = Kind::Advice {
            repeat,
            repeats_left: self.cfg.advice_repeats,
        };
        let sent = self.send_expected(Outbound::message(first), k, kind, response);
        let counter = if sent {
            &self.stats.advices_sent
        } else {
            &self.stats.advices_unsent
        };
        counter.fetch_add(1, Ordering::Relaxed);
        sent
    }

    /// An advice from UnionPay and its repeat: the purchase's fields less
    /// the secret ones, F7 now, a fresh F11 and F37; a reversal advice
    /// (`0420`) names in F90 an `0200` of UnionPay's with the same F7, F11,
    /// F32 and F33, and carries F39 `98` (the issuer did not answer).
    pub(super) fn advice(&self, mti: Mti) -> Option<(Bytes, Bytes, Key, Mti)> {
        let spec = &*self.spec;
        let mut d: Decoded = samples::purchase(spec);
        d.retain(|id| !answer::NOT_ECHOED.contains(&id));
        d.mti = mti;
        d.envelope = from_cups_envelope(spec);
        let f7 = transmission_time();
        let f11 = self.next_stan();
        let mut f37 = [b'0'; 12];
        f37[..6].copy_from_slice(&f7[4..]);
        f37[6..].copy_from_slice(&f11);
        for (id, value) in [(7, &f7[..]), (11, &f11[..]), (37, &f37[..])] {
            d.set_text(id, String::from_utf8_lossy(value));
        }
        if mti.class() == 4 {
            let original = self.original_of(&d)?;
            d.set_text(90, original.to_digits());
            d.set_text(39, "98");
        }
        let first = Bytes::from(spec.encode(&d).ok()?);
        let [v, c, f, o] = mti.digits();
        d.mti = Mti::new([v, c, f, o + 1])?;
        let repeat = Bytes::from(spec.encode(&d).ok()?);
        let msg = Message::parse(spec, first.clone()).ok()?;
        Some((first, repeat, key_of(&msg)?, response_mti(mti)?))
    }

    /// F90 for a reversal advice carrying `d`'s fields: the `0200` those
    /// fields came from.
    pub(super) fn original_of(&self, d: &Decoded) -> Option<OriginalData> {
        let mut original = d.clone();
        original.mti = Mti::new(*b"0200")?;
        let payload = Bytes::from(self.spec.encode(&original).ok()?);
        OriginalData::of_original(&Message::parse(&self.spec, payload).ok()?).ok()
    }

    /// The member's reversal (`0420`/`0421`): booked in its chain and
    /// answered `0430` on an in link, unless it is one of the first
    /// `ignore_reversals` of its chain; F39 `30` when F90 names nothing.
    pub(super) fn on_reversal(
        self: &Arc<Shared>,
        msg: &Message<'_>,
        rng: &mut Rng,
        from: Option<IpAddr>,
    ) {
        let code = match self.stats.reversals.take(msg, self.cfg.ignore_reversals) {
            Taken::Ignored => return,
            Taken::Answer(_) => "00",
            Taken::Unreadable => "30",
        };
        self.answer_member(msg, code, Tally::Reversal, rng, from);
    }

    /// The member's advice: booked and acknowledged on an in link.
    pub(super) fn on_member_advice(
        self: &Arc<Shared>,
        msg: &Message<'_>,
        rng: &mut Rng,
        from: Option<IpAddr>,
    ) {
        match OriginalKey::of_message(msg) {
            Ok(key) => {
                self.stats.member_advices.advice(key, msg.mti().is_repeat());
            }
            Err(_) => {
                self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.answer_member(msg, "00", Tally::Advice, rng, from);
    }

    /// Answers a member message after the usual delay, on any in link.
    pub(super) fn answer_member(
        self: &Arc<Shared>,
        msg: &Message<'_>,
        code: &str,
        tally: Tally,
        rng: &mut Rng,
        from: Option<IpAddr>,
    ) {
        let response = match answer::answer(&self.spec, msg, code) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "sim cups: cannot answer a member message");
                self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let to = To::Any {
            from,
            draw: rng.next_u64(),
        };
        self.deliver_after(response, self.cfg.delay.sample(rng), tally, to, None);
    }

    /// Repeats an unacknowledged advice; one that no in link takes is
    /// tried again at its next deadline.
    pub(super) fn repeat_advice(&self, k: Key, repeat: Bytes, repeats_left: u32, response: Mti) {
        let sent = self.send_in(Outbound::message(repeat.clone()));
        if sent {
            self.stats
                .advice_repeats_sent
                .fetch_add(1, Ordering::Relaxed);
        }
        let pending = Pending {
            kind: Kind::Advice {
                repeat,
                repeats_left: repeats_left - u32::from(sent),
            },
            response,
        };
        self.outstanding.renew(k, pending, self.cfg.timeout);
    }
}
