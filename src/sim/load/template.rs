//! The requests a load client sends: templates built once from the spec's
//! sample messages (one per size of the mix, with where F7, F11, F37 and
//! F41 lie), picked by share, and varied per request (STAN, RRN, terminal,
//! transmission time) by patches, without re-encoding.

use bytes::Bytes;

use super::LoadConfig;
use crate::iso8583::{Message, Spec};
use crate::sim::writer::Patch;
use crate::util::Rng;

pub(crate) struct Template {
    pub(crate) payload: Bytes,
    /// Offset and width of F11: 6 for ASCII digits, 3 for BCD.
    pub(crate) f11: usize,
    pub(crate) f11_width: usize,
    /// Offsets of F37 (12 characters) and F41 (8), where the template
    /// carries them as text, for `vary_keys`.
    pub(crate) f37: Option<usize>,
    pub(crate) f41: Option<usize>,
    /// Offset and width of F7 (10 ASCII digits or 5 BCD bytes): changed
    /// each time a slot's STANs come round again, so a STAN sent again is a
    /// new transaction, not a duplicate the switch answers from its book.
    pub(crate) f7: Option<(usize, usize)>,
    pub(crate) share: u32,
}

pub(super) fn templates(spec: &Spec, cfg: &LoadConfig) -> Result<Vec<Template>, String> {
    cfg.mix
        .sizes()
        .into_iter()
        .map(|(size, share)| {
            let payload = with_f7(spec, crate::sim::sized_request(spec, &cfg.mti, size)?)?;
            let msg = Message::parse(spec, payload.clone()).map_err(|e| e.to_string())?;
            let f11 = msg
                .field(11)
                .map_err(|e| e.to_string())?
                .ok_or("the request template has no F11")?;
            if !matches!(f11.range().len(), 3 | 6) {
                return Err("F11 must be n6 as 6 ASCII digits or 3 BCD bytes".into());
            }
            let text_at = |id: u16, width: usize| {
                msg.field(id).ok().flatten().and_then(|f| {
                    let r = f.range();
                    let text = payload.get(r.clone())?;
                    (r.len() == width && text.iter().all(u8::is_ascii_graphic)).then_some(r.start)
                })
            };
            let f7 = msg
                .field(7)
                .ok()
                .flatten()
                .map(|f| f.range())
                .filter(|r| matches!(r.len(), 10 | 5))
                .map(|r| (r.start, r.len()));
            Ok(Template {
                f7,
                f11: f11.range().start,
                f11_width: f11.range().len(),
                f37: text_at(37, 12),
                f41: text_at(41, 8),
                payload,
                share,
            })
        })
        .collect()
}

/// The template with an F7 where the dialect defines one: a STAN sent
/// again in another run (or once a slot's STANs come round) must be a new
/// transaction, not a duplicate the switch answers from its book.
fn with_f7(spec: &Spec, payload: Bytes) -> Result<Bytes, String> {
    if spec.field(7).is_none() {
        return Ok(payload);
    }
    let mut d = spec.decode(&payload).map_err(|e| e.to_string())?;
    if d.get(7).is_some() {
        return Ok(payload);
    }
    d.set_text(7, "0000000000");
    spec.encode(&d).map(Bytes::from).map_err(|e| e.to_string())
}

pub(crate) fn pick_template<'t>(
    templates: &'t [Template],
    total: u32,
    rng: &mut Rng,
) -> &'t Template {
    let mut x = rng.below_u64(u64::from(total.max(1))) as u32;
    for t in templates {
        if x < t.share {
            return t;
        }
        x -= t.share;
    }
    &templates[0]
}

/// F41 `T` and the client's number; F37 the client's number and the STAN,
/// so that every request's RRN differs and each client is a terminal.
pub(super) fn vary_keys(patch: &mut Patch, t: &Template, terminal: u32, stan: u32) {
    if let Some(at) = t.f41 {
        let mut f41 = *b"T0000000";
        put_digits(&mut f41[1..], terminal);
        let _ = patch.overwrite(at, &f41);
    }
    if let Some(at) = t.f37 {
        let mut f37 = [b'0'; 12];
        put_digits(&mut f37[..6], terminal);
        put_digits(&mut f37[6..], stan);
        let _ = patch.overwrite(at, &f37);
    }
}

/// F7 = `secs` (since the epoch) as MMDDhhmmss, in the template's
/// encoding.
pub(super) fn vary_f7(patch: &mut Patch, t: &Template, secs: u64) {
    let Some((at, width)) = t.f7 else { return };
    let f7 = crate::iso8583::transmission_date_time(secs);
    if width == 10 {
        let _ = patch.overwrite(at, &f7);
    } else {
        let mut bcd = [0u8; 5];
        for (i, b) in bcd.iter_mut().enumerate() {
            *b = ((f7[2 * i] - b'0') << 4) | (f7[2 * i + 1] - b'0');
        }
        let _ = patch.overwrite(at, &bcd);
    }
}

/// `n`'s last `out.len()` decimal digits into `out`, zero-padded.
fn put_digits(out: &mut [u8], mut n: u32) {
    for d in out.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// F11 both ways a spec may encode it: six ASCII digits and three BCD bytes.
pub(crate) fn stan_bytes(stan: u32) -> ([u8; 6], [u8; 3]) {
    let mut ascii = [b'0'; 6];
    crate::wire::write_ascii_decimal(&mut ascii, u64::from(stan));
    let mut bcd = [0u8; 3];
    for (i, b) in bcd.iter_mut().enumerate() {
        *b = ((ascii[2 * i] - b'0') << 4) | (ascii[2 * i + 1] - b'0');
    }
    (ascii, bcd)
}

/// The STAN value of a raw F11 in either encoding.
pub(crate) fn stan_value(raw: &[u8]) -> Option<u32> {
    let digit = |d: u8| (d <= 9).then_some(u32::from(d));
    match raw.len() {
        6 => raw.iter().try_fold(0u32, |n, &b| {
            b.is_ascii_digit().then(|| n * 10 + u32::from(b - b'0'))
        }),
        3 => raw.iter().try_fold(0u32, |n, &b| {
            Some(n * 100 + digit(b >> 4)? * 10 + digit(b & 0x0F)?)
        }),
        _ => None,
    }
}
