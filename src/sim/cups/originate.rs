//! What UnionPay originates: issuer requests (`0100`) from a template
//! encoded once and patched per request, echo tests and key resets, paced
//! at a rate, each registered as outstanding before it goes out on an in
//! link. How the simulator answers what the member sends is in [`super`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use super::{Key, Kind, Pending, Shared, key, key_of};
use crate::iso8583::{Decoded, Message, Mti, Spec, samples};
use crate::sim::answer::{self, response_mti};
use crate::sim::peer::Pacer;
use crate::sim::writer::{Outbound, Patch};

impl Shared {
    /// The next STAN, 1..=999999 then round again. A STAN that comes round
    /// while its last use is still outstanding is refused by [`Shared::expect`].
    pub(super) fn next_stan(&self) -> [u8; 6] {
        let s = self
            .stan
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s % 999_999 + 1)
            })
            .map_or(1, |prev| prev % 999_999 + 1);
        let mut out = [b'0'; 6];
        crate::wire::write_ascii_decimal(&mut out, u64::from(s));
        out
    }

    /// One issuer request on the next in link.
    pub(super) fn send_issuer_request(&self) -> bool {
        let f7 = transmission_time();
        let f11 = self.next_stan();
        let mut f37 = [b'0'; 12];
        f37[..6].copy_from_slice(&f7[4..]);
        f37[6..].copy_from_slice(&f11);
        let Some(t) = &self.issuer else {
            return false;
        };
        let mut patch = Patch::default();
        if patch.overwrite(t.f7.start, &f7).is_err()
            || patch.overwrite(t.f11.start, &f11).is_err()
            || patch.overwrite(t.f37.start, &f37).is_err()
        {
            return false;
        }
        let k = key(&f7, &f11, &t.f32, &t.f33);
        let out = Outbound::Message(t.payload.clone(), patch);
        self.send_expected(out, k, Kind::Issuer, t.response)
    }

    pub(super) fn send_echo(&self) -> bool {
        let sent = self
            .network_request(None, None)
            .is_some_and(|(payload, k, response)| {
                self.send_expected(Outbound::message(payload), k, Kind::Echo, response)
            });
        if sent {
            self.stats.echo_sent.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    /// A key reset started by UnionPay: `0800` F70 `101`, the `0810`
    /// expected on an out link.
    pub(super) fn send_key_reset(&self) -> bool {
        let sent = self
            .network_request(Mti::new(*b"0800"), Some("101"))
            .is_some_and(|(payload, k, response)| {
                self.send_expected(Outbound::message(payload), k, Kind::KeyReset, response)
            });
        if sent {
            self.stats.key_resets_sent.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    /// Registers a request of UnionPay's as outstanding and writes it on an
    /// in link; `false` (and forgotten) when no in link takes it.
    pub(super) fn send_expected(&self, out: Outbound, k: Key, kind: Kind, response: Mti) -> bool {
        let pending = Pending { kind, response };
        if !self
            .outstanding
            .expect(k.clone(), pending, self.cfg.timeout)
        {
            return false;
        }
        let sent = self.send_in(out);
        if !sent {
            self.outstanding.forget(&k);
        }
        sent
    }

    /// Network management from UnionPay: the spec's echo test (`0820` F70
    /// `301`: F7, F11, F33, F53, F100), or that with another MTI and F70.
    pub(super) fn network_request(
        &self,
        mti: Option<Mti>,
        f70: Option<&str>,
    ) -> Option<(Bytes, Key, Mti)> {
        let spec = &*self.spec;
        let mut d = samples::echo(spec);
        d.envelope = from_cups_envelope(spec);
        if let Some(mti) = mti {
            d.mti = mti;
        }
        if let Some(f70) = f70 {
            d.set_text(70, f70);
        }
        let f7 = transmission_time();
        let f11 = self.next_stan();
        for (id, text) in [(7, &f7[..]), (11, &f11[..])] {
            if spec.field(id).is_some() {
                d.set_text(id, String::from_utf8_lossy(text));
            }
        }
        for id in [53, 100] {
            if let (Some(_), Some(v)) = (spec.field(id), samples::value(id)) {
                d.set(id, v);
            }
        }
        let response = response_mti(d.mti)?;
        let payload = Bytes::from(spec.encode(&d).ok()?);
        let msg = Message::parse(spec, payload.clone()).ok()?;
        let k = key_of(&msg)?;
        Some((payload, k, response))
    }
}

/// What UnionPay originates at a rate.
#[derive(Clone, Copy, Debug)]
pub(super) enum Originated {
    Issuer,
    Advice,
}

impl Originated {
    /// Sends one; counted sent or unsent.
    fn send(self, shared: &Shared) {
        let stats = &shared.stats;
        match self {
            Originated::Issuer => {
                let counter = if shared.send_issuer_request() {
                    &stats.sent
                } else {
                    &stats.unsent
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Originated::Advice => drop(shared.send_advice()),
        }
    }
}

/// Starts a key reset every `every` for `duration` (none once origination
/// stops).
pub(super) async fn reset_keys(
    shared: Arc<Shared>,
    every: Duration,
    shutdown: watch::Receiver<bool>,
) {
    let stop_at = shared.base.checked_add(shared.cfg.duration);
    crate::sim::peer::every_until(every, stop_at, shutdown, || {
        shared
            .originating
            .issue(|| shared.send_key_reset())
            .is_some()
    })
    .await;
}

/// Sends `what` at `rate` a second for `duration`.
pub(super) async fn originate(
    shared: Arc<Shared>,
    rate: f64,
    what: Originated,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(mut pacer) = Pacer::new(rate) else {
        return;
    };
    let stop_at = Instant::now().checked_add(shared.cfg.duration);
    let mut issued = 0;
    loop {
        tokio::select! {
            _ = pacer.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = Instant::now();
        if stop_at.is_some_and(|s| now >= s) {
            return;
        }
        let owed = pacer.owed(now, issued);
        issued += owed;
        let gate_open = shared.originating.issue(|| {
            for _ in 0..owed {
                what.send(&shared);
            }
        });
        if gate_open.is_none() {
            return;
        }
    }
}

/// The issuer request, encoded once; each request patches F7, F11 and F37.
pub(super) struct IssuerTemplate {
    payload: Bytes,
    response: Mti,
    f7: std::ops::Range<usize>,
    f11: std::ops::Range<usize>,
    f37: std::ops::Range<usize>,
    f32: Vec<u8>,
    f33: Vec<u8>,
}

impl IssuerTemplate {
    /// An `0100` authorisation from UnionPay to the member: the sample purchase
    /// with the header turned around.
    pub(super) fn new(spec: &Spec) -> Result<IssuerTemplate, String> {
        let mti = Mti::new(*b"0100").ok_or("bad MTI")?;
        let mut d: Decoded = samples::purchase(spec);
        d.mti = mti;
        d.envelope = from_cups_envelope(spec);
        d.set_text(7, "0000000000");
        d.set_text(11, "000000");
        d.set_text(37, "000000000000");
        let payload = Bytes::from(spec.encode(&d).map_err(|e| e.to_string())?);
        let msg = Message::parse(spec, payload.clone()).map_err(|e| e.to_string())?;
        let ascii = |id: u16, len: usize| -> Result<std::ops::Range<usize>, String> {
            match msg.field(id) {
                Ok(Some(f)) if f.data().len() == len && f.data().iter().all(|&b| b == b'0') => {
                    Ok(f.range())
                }
                _ => Err(format!(
                    "spec `{}` needs F{id} as {len} ASCII characters",
                    spec.name()
                )),
            }
        };
        let data = |id: u16| -> Vec<u8> {
            match msg.field(id) {
                Ok(Some(f)) => f.data().to_vec(),
                _ => Vec::new(),
            }
        };
        Ok(IssuerTemplate {
            f7: ascii(7, 10)?,
            f11: ascii(11, 6)?,
            f37: ascii(37, 12)?,
            f32: data(32),
            f33: data(33),
            response: response_mti(mti).ok_or("0100 has no response MTI")?,
            payload,
        })
    }
}

/// The sample envelope turned around: from UnionPay to the member.
pub(super) fn from_cups_envelope(spec: &Spec) -> Vec<u8> {
    let mut env = samples::envelope(spec);
    answer::turn_envelope(spec.envelope(), &mut env);
    env
}

/// F7 now: `MMDDhhmmss`, UTC.
pub(super) fn transmission_time() -> [u8; 10] {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    crate::iso8583::transmission_date_time(secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::cups::CUPS_ID;

    #[test]
    fn transmission_time_is_ten_digits() {
        let f7 = transmission_time();
        assert!(f7.iter().all(u8::is_ascii_digit));
    }

    #[test]
    fn issuer_template_is_an_0100_from_unionpay() {
        let spec = Spec::builtin("cups").unwrap();
        let t = IssuerTemplate::new(&spec).unwrap();
        let msg = Message::parse(&spec, t.payload.clone()).unwrap();
        assert_eq!(msg.mti().as_str(), "0100");
        assert_eq!(t.response.as_str(), "0110");
        let Some(crate::wire::Header::Cups(h)) = msg.envelope().header else {
            panic!("a CUPS header");
        };
        assert_eq!(h.source_id(), CUPS_ID);
        assert_eq!((t.f7.len(), t.f11.len(), t.f37.len()), (10, 6, 12));
        assert!(!t.f32.is_empty() && !t.f33.is_empty());
        // A spec with BCD F11 (POS) cannot carry the simulator's requests.
        let binary = Spec::builtin("cup-pos").unwrap();
        assert!(IssuerTemplate::new(&binary).is_err());
    }
}
