//! The routing decisions of one service, without I/O: what a message must
//! be to pass ingress validation, the correlation key that ties a response
//! to its request, the F37 node stamp a request carries to its node, and
//! the TPDU a response goes back with. `link::Service` applies them to live
//! links; unit tests here run them on bytes alone.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{CorrelationKey, F37Stamp, KeyTooLong, MtiPattern, NodeId, StampError};
use isoswitch_iso8583::{Bitmap, FieldIndex, IsoError, Message, Mti, Spec};
use isoswitch_wire::{Patch, Tpdu};

/// One part of a correlation key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub enum KeyPart {
    /// The TPDU destination and source addresses, order-insensitive, so a host
    /// that swaps them and one that echoes them both match.
    Tpdu,
    Field(u16),
}

/// A correlation key part that is neither `tpdu` nor a field number.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a key part: use `tpdu` or a field number 2..=192 such as `F11`")]
pub struct KeyPartError(String);

impl TryFrom<String> for KeyPart {
    type Error = KeyPartError;
    fn try_from(s: String) -> Result<Self, KeyPartError> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("tpdu") {
            return Ok(KeyPart::Tpdu);
        }
        let digits = t.strip_prefix(['F', 'f']).unwrap_or(t);
        match digits.parse::<u16>() {
            Ok(n) if (2..=192).contains(&n) => Ok(KeyPart::Field(n)),
            _ => Err(KeyPartError(s)),
        }
    }
}

impl From<KeyPart> for String {
    fn from(p: KeyPart) -> String {
        match p {
            KeyPart::Tpdu => "tpdu".into(),
            KeyPart::Field(n) => format!("F{n}"),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TpduPolicy {
    /// The request's TPDU with destination and source swapped.
    #[default]
    Swap,
    /// The request's TPDU unchanged.
    Echo,
    /// Whatever the node sent.
    Node,
}

/// The correlation key when the config names none.
pub fn default_key(spec: &Spec) -> Vec<KeyPart> {
    let has = |id| spec.field(id).is_some();
    if spec.envelope().tpdu {
        // POS through a NAC: many NACs and uplinks share TPDU addresses, so the
        // terminal ID and STAN make the key unique.
        vec![KeyPart::Tpdu, KeyPart::Field(41), KeyPart::Field(11)]
    } else if has(32) && has(33) {
        // UnionPay: a request and its response share F7 + F11 + F32 + F33.
        vec![
            KeyPart::Field(7),
            KeyPart::Field(11),
            KeyPart::Field(32),
            KeyPart::Field(33),
        ]
    } else {
        vec![KeyPart::Field(11), KeyPart::Field(41)]
    }
}

/// Why a message failed ingress validation.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    /// It does not parse in full against the service's spec.
    #[error(transparent)]
    Malformed(#[from] IsoError),
    /// A client may send only requests.
    #[error("MTI {0} is not a request")]
    NotARequest(Mti),
    /// A request of a class the service does not route (`accept_mti`).
    #[error("MTI {0} is not accepted by this service")]
    NotAccepted(Mti),
    /// A request with none of the fields of its correlation key (a frame
    /// with a request MTI and nothing else, say) could not be told apart from
    /// others when its answer comes back. (A key field may be absent, F33 from
    /// a VISA request for one, as long as another is there.)
    #[error("MTI {0} carries no field of the correlation key")]
    NoKeyField(Mti),
}

/// A message that passed ingress validation, with its routing fields found
/// in the same pass.
pub struct Checked<'s> {
    pub msg: Message<'s>,
    pub index: FieldIndex,
}

impl Checked<'_> {
    pub fn field(&self, id: u16) -> Option<isoswitch_iso8583::FieldRef<'_>> {
        self.msg.indexed(&self.index, id)
    }

    /// The data of field `id` (as [`Checked::field`] has it), read straight
    /// off the index.
    #[inline]
    pub fn field_data(&self, id: u16) -> Option<&[u8]> {
        self.msg.indexed_data(&self.index, id)
    }
}

/// What a [`Router`] is built from (the service's config, as `link` reads it).
#[derive(Clone, Debug, Default)]
pub struct RouterConfig {
    /// The correlation key; empty = [`default_key`] of the spec.
    pub key: Vec<KeyPart>,
    /// Fields the directed rules compare.
    pub rule_fields: Vec<u16>,
    /// `accept_mti` patterns; empty = every request MTI.
    pub accept_mti: Vec<String>,
    pub f37_stamp: Option<F37Stamp>,
    pub tpdu_on_response: TpduPolicy,
    /// The field sticky balancing hashes, when the algorithm is sticky.
    pub sticky_field: Option<u16>,
}

/// Why a [`Router`] cannot be built from its config.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("directed rules look at {0} distinct fields; at most {max} are supported", max = FieldTexts::MAX)]
    TooManyRuleFields(usize),
    #[error("correlation key, rules and routing read {0} distinct fields; at most {max} are supported", max = FieldIndex::CAPACITY)]
    TooManyFields(usize),
    #[error("accept_mti: `{0}` is not an MTI pattern")]
    BadMtiPattern(String),
}

/// One service's routing decisions. See the module doc.
#[derive(Debug)]
pub struct Router {
    spec: Arc<Spec>,
    key_parts: Vec<KeyPart>,
    /// Fields read from every message, found while it is validated.
    wanted: Bitmap,
    accept_mti: Vec<MtiPattern>,
    rule_fields: Vec<u16>,
    f37_stamp: Option<F37Stamp>,
    tpdu_on_response: TpduPolicy,
    sticky_field: Option<u16>,
}

/// A correlation key could not be made of a message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("no TPDU for the correlation key")]
    NoTpdu,
    #[error(transparent)]
    TooLong(#[from] KeyTooLong),
}

impl Router {
    pub fn new(cfg: RouterConfig, spec: Arc<Spec>) -> Result<Router, RouterError> {
        let key_parts = if cfg.key.is_empty() {
            default_key(&spec)
        } else {
            cfg.key
        };
        let mut rule_fields = cfg.rule_fields;
        rule_fields.sort_unstable();
        rule_fields.dedup();
        if rule_fields.len() > FieldTexts::MAX {
            return Err(RouterError::TooManyRuleFields(rule_fields.len()));
        }
        let mut wanted = Bitmap::default();
        let key_fields = key_parts.iter().filter_map(|p| match p {
            KeyPart::Field(id) => Some(*id),
            KeyPart::Tpdu => None,
        });
        // F11, F37, F39, F41, F70: STAN, stamp, response code, terminal and
        // network-management code, read by routing, sign-on and logs.
        for id in key_fields
            .chain(rule_fields.iter().copied())
            .chain([11, 37, 39, 41, 70])
            .chain(cfg.sticky_field)
        {
            wanted.set(id);
        }
        let wanted_count = wanted.iter().count();
        if wanted_count > FieldIndex::CAPACITY {
            return Err(RouterError::TooManyFields(wanted_count));
        }
        let accept_mti = cfg
            .accept_mti
            .iter()
            .map(|t| MtiPattern::parse(t).ok_or_else(|| RouterError::BadMtiPattern(t.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Router {
            spec,
            key_parts,
            wanted,
            accept_mti,
            rule_fields,
            f37_stamp: cfg.f37_stamp,
            tpdu_on_response: cfg.tpdu_on_response,
            sticky_field: cfg.sticky_field,
        })
    }

    pub fn spec(&self) -> &Arc<Spec> {
        &self.spec
    }

    /// Indexes `ids` too, in the same pass, in every message checked from
    /// now on, so that a reader of every exchange (the journal) finds them
    /// without walking the message again. Before the first message: `&mut`.
    /// False, and nothing changed, when routing's fields and these do not
    /// fit one [`FieldIndex`] together.
    pub fn index_also(&mut self, ids: &[u16]) -> bool {
        let mut wanted = self.wanted;
        for &id in ids {
            wanted.set(id);
        }
        if wanted.iter().count() > FieldIndex::CAPACITY {
            return false;
        }
        self.wanted = wanted;
        true
    }

    /// Checks a message in full against the service's spec and finds its
    /// routing fields, in one pass. Allocates nothing.
    #[inline]
    pub fn check<'s>(&'s self, payload: Bytes) -> Result<Checked<'s>, Invalid> {
        let msg = Message::parse(&self.spec, payload)?;
        let index = msg.index(&self.wanted)?;
        Ok(Checked { msg, index })
    }

    /// [`Router::check`], handing the result to `f` by reference: the
    /// checked message (a few hundred bytes of field index) is built once in
    /// this frame and never moved, where returning it would copy it at every
    /// `Result` it passes through. The per-message paths use this.
    #[inline]
    pub fn with_checked<'s, R>(
        &'s self,
        payload: Bytes,
        f: impl FnOnce(&Checked<'s>) -> R,
    ) -> Result<R, Invalid> {
        let msg = Message::parse(&self.spec, payload)?;
        let mut checked = Checked {
            msg,
            index: FieldIndex::default(),
        };
        checked.msg.index_into(&self.wanted, &mut checked.index)?;
        Ok(f(&checked))
    }

    /// [`Router::check_request`] in the style of [`Router::with_checked`].
    #[inline]
    pub fn with_request<'s, R>(
        &'s self,
        payload: Bytes,
        f: impl FnOnce(&Checked<'s>) -> R,
    ) -> Result<R, Invalid> {
        self.with_checked(payload, |checked| {
            self.check_front_request(checked)?;
            Ok(f(checked))
        })?
    }

    /// [`Router::check`], plus what a request from a front must be: a
    /// request of an MTI the service accepts, with a key.
    #[inline]
    pub fn check_request<'s>(&'s self, payload: Bytes) -> Result<Checked<'s>, Invalid> {
        let checked = self.check(payload)?;
        self.check_front_request(&checked)?;
        Ok(checked)
    }

    /// What a checked message from a front must also be: a request the
    /// service routes.
    fn check_front_request(&self, checked: &Checked<'_>) -> Result<(), Invalid> {
        let mti = checked.msg.mti();
        if !mti.is_request() {
            return Err(Invalid::NotARequest(mti));
        }
        self.check_routable(checked)
    }

    /// What a request must be to be routed: of an MTI the service accepts,
    /// and carrying at least one field of its correlation key (network
    /// management excepted).
    pub fn check_routable(&self, req: &Checked<'_>) -> Result<(), Invalid> {
        self.check_accepted(req)?;
        let mti = req.msg.mti();
        let has_key_field = self.key_parts.iter().any(|part| match part {
            KeyPart::Field(id) => req.msg.has_field(*id),
            KeyPart::Tpdu => false,
        });
        if !mti.is_network_management() && !has_key_field {
            return Err(Invalid::NoKeyField(mti));
        }
        Ok(())
    }

    /// A request of an MTI the service accepts (`accept_mti`).
    pub fn check_accepted(&self, req: &Checked<'_>) -> Result<(), Invalid> {
        let mti = req.msg.mti();
        let digits = mti.digits();
        if !self.accept_mti.is_empty() && !self.accept_mti.iter().any(|p| p.matches(&digits)) {
            return Err(Invalid::NotAccepted(mti));
        }
        Ok(())
    }

    /// The correlation key of a request or its response. The message class
    /// (first two MTI digits) keeps a reversal or a network message apart
    /// from a purchase that shares its key fields.
    pub fn key_of(&self, checked: &Checked<'_>) -> Result<CorrelationKey, KeyError> {
        let mti = checked.msg.mti().digits();
        self.key_as(checked, [mti[0], mti[1]])
    }

    /// The key `checked` would have with the MTI version and class `class`
    /// (two digits): a reversal (04xx) under its original's class (02) is
    /// the key its original was answered under, when the dialect's
    /// reversals carry the original's identifying fields (a terminal's 0400
    /// carries its purchase's STAN and terminal ID).
    pub fn key_as(
        &self,
        checked: &Checked<'_>,
        class: [u8; 2],
    ) -> Result<CorrelationKey, KeyError> {
        let msg = &checked.msg;
        let mut b = CorrelationKey::builder();
        b.append(&class);
        for part in &self.key_parts {
            match part {
                KeyPart::Tpdu => {
                    let t = msg.tpdu().ok_or(KeyError::NoTpdu)?;
                    // Order-insensitive, so swapped and echoed TPDUs both match.
                    let (a, c) = (t.destination, t.source);
                    let (lo, hi) = if a <= c { (a, c) } else { (c, a) };
                    b.append(&lo);
                    b.append(&hi);
                }
                KeyPart::Field(id) => {
                    b.append(checked.field(*id).map_or(&[][..], |f| f.data()));
                }
            }
        }
        Ok(b.build()?)
    }

    /// The bytes sticky balancing hashes, when it is on.
    pub fn sticky_key<'m>(&self, req: &'m Checked<'_>) -> Option<&'m [u8]> {
        req.field(self.sticky_field?).map(|f| f.data())
    }

    /// The text forms of the fields directed rules compare.
    pub fn rule_texts(&self, req: &Checked<'_>) -> FieldTexts {
        FieldTexts::of(req, &self.rule_fields)
    }

    /// The F37 edit that stamps `node` into a request (none when stamping is
    /// off). The text form is stamped, then written back in the field's
    /// encoding (EBCDIC on VISA), so node IDs are the same characters on
    /// every link.
    pub fn f37_patch(&self, req: &Checked<'_>, node: &NodeId) -> Result<Patch, StampError> {
        let mut patch = Patch::default();
        let Some(stamp) = &self.f37_stamp else {
            return Ok(patch);
        };
        let f37 = req.field(37).ok_or(StampError::NoF37)?;
        let (mut window, len) = f37_text(&f37);
        stamp.stamp(&mut window[..len], node)?;
        if f37.def().data == isoswitch_iso8583::Data::Ebcdic {
            for b in &mut window[..len] {
                *b = isoswitch_iso8583::ebcdic::from_ascii(*b);
            }
        }
        patch.overwrite(f37.range().start, &window[..len])?;
        Ok(patch)
    }

    /// The TPDU edit for a response to `request`, by the service's policy.
    pub fn response_tpdu_patch(&self, request: &[u8]) -> Patch {
        let mut patch = Patch::default();
        if !self.spec.envelope().tpdu {
            return patch;
        }
        // `Tpdu::parse` without its error (a `String` it would drop): a
        // short request or a wrong ID byte gets no edit either way.
        let Some(&raw) = request.first_chunk::<{ Tpdu::LEN }>() else {
            return patch;
        };
        if raw[0] != Tpdu::ID {
            return patch;
        }
        let t = Tpdu::from_bytes(raw);
        let tpdu = match self.tpdu_on_response {
            TpduPolicy::Swap => t.swapped(),
            TpduPolicy::Echo => t,
            TpduPolicy::Node => return patch,
        };
        // Offset 0 and five bytes always fit a patch slot.
        let _ = patch.overwrite(0, &tpdu.to_bytes());
        patch
    }
}

/// The text form of F37 (12 characters at most) on the stack.
pub fn f37_text(f37: &isoswitch_iso8583::FieldRef<'_>) -> ([u8; 12], usize) {
    use isoswitch_iso8583::{Data, ebcdic};
    let mut text = [0u8; 12];
    // One character per byte (F37 is `an`, in ASCII or EBCDIC): what
    // `logical()` yields, without its per-byte match on the encoding.
    let data = f37.data();
    let n = data.len().min(text.len());
    match f37.def().data {
        Data::Ascii | Data::Binary => {
            text[..n].copy_from_slice(&data[..n]);
            return (text, n);
        }
        Data::Ebcdic => {
            for (dst, &b) in text.iter_mut().zip(data) {
                *dst = ebcdic::to_ascii(b);
            }
            return (text, n);
        }
        Data::Bcd => {}
    }
    let mut len = 0;
    for (dst, b) in text.iter_mut().zip(f37.logical()) {
        *dst = b;
        len += 1;
    }
    (text, len)
}

/// The text forms (ASCII digits for BCD, Latin-1 text) of the few fields that
/// directed rules compare with prefixes, decoded onto the stack: no allocation
/// per request.
pub struct FieldTexts {
    ids: [u16; FieldTexts::MAX],
    texts: [[u8; FieldTexts::TEXT]; FieldTexts::MAX],
    lens: [usize; FieldTexts::MAX],
    n: usize,
}

impl FieldTexts {
    pub const MAX: usize = 8;
    /// Rule prefixes are short; longer values are compared on their first bytes.
    const TEXT: usize = 32;

    fn of(req: &Checked<'_>, ids: &[u16]) -> FieldTexts {
        let mut t = FieldTexts {
            ids: [0; Self::MAX],
            texts: [[0; Self::TEXT]; Self::MAX],
            lens: [0; Self::MAX],
            n: 0,
        };
        for &id in ids.iter().take(Self::MAX) {
            let Some(f) = req.field(id) else { continue };
            let slot = t.n;
            t.ids[slot] = id;
            for (dst, b) in t.texts[slot].iter_mut().zip(f.logical()) {
                *dst = b;
                t.lens[slot] += 1;
            }
            t.n += 1;
        }
        t
    }

    pub fn get(&self, id: u16) -> Option<&[u8]> {
        let i = self.ids[..self.n].iter().position(|&x| x == id)?;
        Some(&self.texts[i][..self.lens[i]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isoswitch_iso8583::{Decoded, samples};

    fn router(spec: &str, cfg: RouterConfig) -> Router {
        let spec = Arc::new(Spec::builtin(spec).expect("builtin spec"));
        Router::new(cfg, spec).expect("router")
    }

    fn encode(r: &Router, d: &Decoded) -> Bytes {
        Bytes::from(r.spec().encode(d).expect("encodes"))
    }

    /// The purchase's answer as a node would send it: response MTI, F39.
    fn answer_to(d: &Decoded) -> Decoded {
        let mut a = d.clone();
        a.mti = Mti::new(*b"0210").expect("MTI");
        a.set_text(39, "00");
        a
    }

    #[test]
    fn a_request_and_its_answer_share_one_key() {
        for spec in ["cups", "cup-pos", "visa-base1"] {
            let r = router(spec, RouterConfig::default());
            let req = samples::purchase(r.spec());
            let ans = answer_to(&req);
            let (q, a) = (encode(&r, &req), encode(&r, &ans));
            let kq = r
                .key_of(&r.check_request(q).expect("valid request"))
                .unwrap();
            let ka = r.key_of(&r.check(a).expect("valid answer")).unwrap();
            assert_eq!(kq, ka, "{spec}");
            let mut other = req.clone();
            other.set_text(11, "999999");
            let ko = r
                .key_of(&r.check(encode(&r, &other)).expect("valid"))
                .unwrap();
            assert_ne!(kq, ko, "{spec}: another STAN is another request");
        }
    }

    /// Fields asked for besides routing's are indexed from then on, routing
    /// still finds its own, and a set that would overflow the index is
    /// refused whole.
    #[test]
    fn fields_indexed_also_are_found_and_an_overflow_is_refused() {
        let mut r = router("cups", RouterConfig::default());
        let q = encode(&r, &samples::purchase(r.spec()));
        let before = r.check(q.clone()).expect("valid");
        assert!(before.field(4).is_none(), "F4 is not routing's");
        let key = r.key_of(&before).expect("key");
        assert!(r.index_also(&[2, 4, 7, 42, 49]));
        let after = r.check(q).expect("valid");
        for id in [2, 4, 7, 49] {
            assert!(after.field(id).is_some(), "F{id} indexed");
        }
        assert_eq!(r.key_of(&after).expect("key"), key);
        let many: Vec<u16> = (50..80).collect();
        assert!(!r.index_also(&many));
        let still = r
            .check(encode(&r, &samples::purchase(r.spec())))
            .expect("valid");
        assert!(still.field(4).is_some() && still.field(60).is_none());
    }

    #[test]
    fn the_pos_key_ignores_which_way_the_tpdu_points() {
        let r = router("cup-pos", RouterConfig::default());
        let req = samples::purchase(r.spec());
        let q = encode(&r, &req);
        let swapped = r.response_tpdu_patch(&q).applied_to(&q);
        assert_ne!(swapped[..5], q[..5], "the TPDU was swapped");
        let k1 = r.key_of(&r.check(q).unwrap()).unwrap();
        let k2 = r.key_of(&r.check(Bytes::from(swapped)).unwrap()).unwrap();
        assert_eq!(k1, k2);
    }

    #[test]
    fn response_tpdu_follows_the_policy() {
        let for_policy = |p| {
            let r = router(
                "cup-pos",
                RouterConfig {
                    tpdu_on_response: p,
                    ..RouterConfig::default()
                },
            );
            let q = encode(&r, &samples::purchase(r.spec()));
            (r.response_tpdu_patch(&q).applied_to(&q), q)
        };
        let (swapped, q) = for_policy(TpduPolicy::Swap);
        assert_eq!(swapped[0], q[0]);
        assert_eq!((&swapped[1..3], &swapped[3..5]), (&q[3..5], &q[1..3]));
        let (echoed, q) = for_policy(TpduPolicy::Echo);
        assert_eq!(echoed, q.to_vec());
        assert!(for_policy(TpduPolicy::Node).0 == for_policy(TpduPolicy::Node).1.to_vec());
        // No TPDU in the dialect: nothing to edit.
        let r = router("cups", RouterConfig::default());
        let q = encode(&r, &samples::purchase(r.spec()));
        assert!(r.response_tpdu_patch(&q).is_empty());
    }

    #[test]
    fn validation_says_what_is_wrong() {
        let r = router(
            "cups",
            RouterConfig {
                accept_mti: vec!["02x0".into()],
                ..RouterConfig::default()
            },
        );
        let req = samples::purchase(r.spec());
        let q = encode(&r, &req);
        assert!(r.check_request(q.clone()).is_ok());
        // Cut short: malformed.
        let short = q.slice(..q.len() - 3);
        assert!(matches!(r.check_request(short), Err(Invalid::Malformed(_))));
        // An answer is not a request.
        let a = encode(&r, &answer_to(&req));
        assert!(matches!(r.check_request(a), Err(Invalid::NotARequest(_))));
        // A reversal is outside accept_mti.
        let mut rev = req.clone();
        rev.mti = Mti::new(*b"0400").unwrap();
        assert!(matches!(
            r.check_request(encode(&r, &rev)),
            Err(Invalid::NotAccepted(_))
        ));
        // A request with no field of its key cannot be correlated.
        let mut bare = req.clone();
        bare.retain(|id| ![7, 11, 32, 33].contains(&id));
        assert!(matches!(
            r.check_request(encode(&r, &bare)),
            Err(Invalid::NoKeyField(_))
        ));
        // The per-message path's borrowing form gives the same verdicts, and
        // runs its closure only on a request it accepts.
        for payload in [
            q.clone(),
            short_of(&q),
            encode(&r, &answer_to(&req)),
            encode(&r, &rev),
            encode(&r, &bare),
        ] {
            let expected = r.check_request(payload.clone()).map(|c| r.key_of(&c).ok());
            let mut ran = false;
            let got = r.with_request(payload, |c| {
                ran = true;
                r.key_of(c).ok()
            });
            assert_eq!(format!("{got:?}"), format!("{expected:?}"));
            assert_eq!(ran, got.is_ok());
        }
    }

    fn short_of(q: &Bytes) -> Bytes {
        q.slice(..q.len() - 3)
    }

    #[test]
    fn f37_carries_the_node_id_in_the_fields_own_encoding() {
        for spec in ["cups", "visa-base1"] {
            let stamp = F37Stamp {
                offset: 10,
                width: 2,
            };
            let r = router(
                spec,
                RouterConfig {
                    f37_stamp: Some(stamp),
                    ..RouterConfig::default()
                },
            );
            let id = &NodeId::new(b"07").unwrap();
            let q = encode(&r, &samples::purchase(r.spec()));
            let checked = r.check_request(q.clone()).unwrap();
            let patch = r.f37_patch(&checked, id).unwrap();
            let stamped = Bytes::from(patch.applied_to(&q));
            let again = r.check(stamped).unwrap();
            let text: Vec<u8> = again.field(37).unwrap().logical().collect();
            assert_eq!(&text[10..12], b"07", "{spec}");
            assert_eq!(text.len(), 12);
        }
        // Stamping off: no edit.
        let r = router("cups", RouterConfig::default());
        let q = encode(&r, &samples::purchase(r.spec()));
        let checked = r.check_request(q).unwrap();
        let id = NodeId::new(b"07").unwrap();
        assert!(r.f37_patch(&checked, &id).unwrap().is_empty());
    }
}
