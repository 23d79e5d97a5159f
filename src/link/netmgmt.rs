//! Network-management messages the switch makes itself: echo tests to nodes
//! (health checks), and sign-on, sign-off and echo tests on peer links.
//!
//! Each is made, not copied: from the service's `[service.network]` template
//! (MTI, envelope IDs, fixed fields; defaults per dialect and front), with
//! F7 = the time of sending in UTC, F11 = the next STAN of the service, and
//! F70 = the dialect's code for the kind of message. A peer or node that
//! checks F7 against its clock, or STANs for repeats, sees what it expects.
//!
//! It also says whose network management is whose ([`NmScope`]): the link's
//! own (sign-on, sign-off, echo test), which the switch answers, or the
//! institution's (key exchange, cut-over: the spec's `[integrity]
//! institution_f70`), which a key node answers; and how a node's own
//! network management finds its way back ([`node_nm_key`]).

use std::time::SystemTime;

use bytes::Bytes;

pub use super::front::out_links::NmKind;
use crate::config::{FrontConfig, NetworkConfig, ServiceConfig};
use crate::iso8583::{Decoded, FieldCodes, IsoError, Message, Mti, Spec};
use crate::route::CorrelationKey;
use crate::wire::Tpdu;
use crate::wire::header::{Fresh, FreshError, Setting};

/// Whose a network-management message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NmScope {
    /// The link's own: sign-on, sign-off, echo test, or no F70 at all. The
    /// switch answers it; no host needs to know.
    Link,
    /// The institution's: key exchange, cut-over. A host must see it (a new
    /// working key the hosts never get breaks every MAC and PIN after it).
    Institution,
}

/// The scope of a network-management message, by an allowlist: the link's
/// own when it has no F70 or its F70 is one of `link_f70` (sign-on,
/// sign-off, echo test, packed for the dialect's F70 at start, so compared
/// as the text `decode` shows in any encoding); every other code is the
/// institution's (key exchange, cut-over, and any code the dialect does not
/// name), and goes to a key node: the switch never answers 00 for a key no
/// host has. `None`: the dialect's F70 is no network management code, and
/// every message is the link's.
pub fn scope(msg: &Message<'_>, link_f70: Option<&FieldCodes>) -> NmScope {
    match (link_f70, msg.field(70)) {
        (Some(link), Ok(Some(f70))) if !link.matches(&f70) => NmScope::Institution,
        _ => NmScope::Link,
    }
}

/// The correlation key of a node's own network-management request to the
/// peer, and of the peer's answer: F11 + F7 + F70 (text forms). Such a
/// request carries no F37, so no stamp can route its answer; its STAN and
/// transmission time, which the answer echoes, name it. `None` without F11
/// or F7.
pub fn node_nm_key(msg: &Message<'_>) -> Option<CorrelationKey> {
    let text =
        |id: u16| -> Option<Vec<u8>> { Some(msg.field(id).ok().flatten()?.logical().collect()) };
    let (f11, f7) = (text(11)?, text(7)?);
    let f70 = text(70).unwrap_or_default();
    nm_key_of_parts(&f11, &f7, &f70)
}

fn nm_key_of_parts(f11: &[u8], f7: &[u8], f70: &[u8]) -> Option<CorrelationKey> {
    let mut b = CorrelationKey::builder();
    // Every other key starts with two MTI digits: this one cannot equal one.
    b.append(b"NM");
    for part in [f11, f7, f70] {
        b.append(part);
    }
    b.build().ok()
}

/// A service's network-management requests, ready to stamp with a time and
/// a STAN.
#[derive(Clone, Debug)]
pub struct NetworkTemplate {
    mti: Mti,
    envelope: Vec<u8>,
    /// Fixed fields, text form, ascending by id.
    fields: Vec<(u16, String)>,
    sign_on_f70: String,
    sign_off_f70: String,
    echo_f70: String,
}

/// A `[service.network]` setting that cannot be used, naming its key.
#[derive(Debug, thiserror::Error)]
#[error("network.{key}: {reason}")]
pub struct TemplateError {
    pub key: String,
    pub reason: TemplateReason,
}

/// Why a `[service.network]` setting cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateReason {
    #[error("`{0}` is not a network-management request MTI such as 0800 or 0820")]
    NotANetworkMti(String),
    /// A `fields` key that names no field of the service's spec.
    #[error("spec `{0}` has no such field")]
    NoSuchField(String),
    #[error("F7, F11 and F70 are made per message")]
    MadePerMessage,
    /// The template does not encode in the spec (checked at start).
    #[error(transparent)]
    Encode(IsoError),
    #[error("`{0}` is not a TPDU: 10 hex digits starting 60")]
    NotATpdu(String),
    /// The scheme header's own refusal of an id or header setting.
    #[error("`{}` is not {}", .0.value, .0.needs)]
    Header(#[source] FreshError),
}

fn bad(key: impl Into<String>, reason: TemplateReason) -> TemplateError {
    TemplateError {
        key: key.into(),
        reason,
    }
}

/// 0800, the echo request of a dialect that names none.
const ECHO_REQUEST: Mti = match Mti::new(*b"0800") {
    Some(m) => m,
    None => panic!("0800 is four digits"),
};

impl NetworkTemplate {
    /// The template of `service`: its `[service.network]` table over the
    /// defaults of its dialect and front.
    pub fn for_service(service: &ServiceConfig, spec: &Spec) -> Result<Self, TemplateError> {
        let cfg = &service.network;
        let net = spec.network();
        let mti = match &cfg.mti {
            Some(text) => text
                .as_bytes()
                .try_into()
                .ok()
                .and_then(Mti::new)
                .filter(|m| m.is_request() && m.is_network_management())
                .ok_or_else(|| bad("mti", TemplateReason::NotANetworkMti(text.clone())))?,
            None => net.echo_mti.unwrap_or(ECHO_REQUEST),
        };
        // UnionPay's links name both institutions in the header and in F33 /
        // F100; the simplex front knows them.
        let ids = match &service.front {
            FrontConfig::Simplex(f) => Some((f.member_id.clone(), f.peer_id.clone())),
            _ => None,
        };
        let envelope = envelope(spec, cfg, ids.as_ref())?;
        let mut fields = default_fields(spec, ids.as_ref());
        for (key, value) in &cfg.fields {
            let id: u16 = key
                .trim_start_matches(['F', 'f'])
                .parse()
                .ok()
                .filter(|id| spec.field(*id).is_some())
                .ok_or_else(|| {
                    bad(
                        format!("fields.{key}"),
                        TemplateReason::NoSuchField(spec.name().to_string()),
                    )
                })?;
            if matches!(id, 7 | 11 | 70) {
                return Err(bad(format!("fields.{key}"), TemplateReason::MadePerMessage));
            }
            fields.retain(|(f, _)| *f != id);
            fields.push((id, value.clone()));
        }
        fields.sort_by_key(|(id, _)| *id);
        let template = NetworkTemplate {
            mti,
            envelope,
            fields,
            sign_on_f70: net.sign_on_f70.clone().unwrap_or_else(|| "001".into()),
            sign_off_f70: net.sign_off_f70.clone().unwrap_or_else(|| "002".into()),
            echo_f70: net.echo_f70.clone().unwrap_or_else(|| "301".into()),
        };
        // Fail at start, not at the first echo: the template must encode.
        template
            .build(spec, NmKind::Echo, 1, SystemTime::UNIX_EPOCH)
            .map_err(|e| bad("fields", TemplateReason::Encode(e)))?;
        Ok(template)
    }

    /// The message of `kind` with STAN `stan`, sent at `at`.
    pub fn build(
        &self,
        spec: &Spec,
        kind: NmKind,
        stan: u32,
        at: SystemTime,
    ) -> Result<Bytes, IsoError> {
        let mut d = Decoded::new(self.envelope.clone(), self.mti);
        let mut set = |id: u16, v: String| {
            if spec.field(id).is_some() {
                d.set_text(id, v);
            }
        };
        set(7, transmission_time(at));
        set(11, format!("{:06}", stan % 1_000_000));
        // A POS sign-in (no F70 in the dialect) says what it is in F60 instead.
        if spec.network().echo_f70.is_some() || spec.field(60).is_none() {
            let f70 = match kind {
                NmKind::SignOn => &self.sign_on_f70,
                NmKind::SignOff => &self.sign_off_f70,
                NmKind::Echo => &self.echo_f70,
            };
            set(70, f70.clone());
        }
        for (id, v) in &self.fields {
            set(*id, v.clone());
        }
        Ok(Bytes::from(spec.encode(&d)?))
    }
}

/// F7, transmission date and time, as MMDDhhmmss in UTC.
pub fn transmission_time(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    String::from_utf8_lossy(&crate::iso8583::transmission_date_time(secs)).into_owned()
}

/// Fields every switch-made request of this dialect carries by default.
fn default_fields(spec: &Spec, ids: Option<&(String, String)>) -> Vec<(u16, String)> {
    let mut fields = Vec::new();
    let has = |id| spec.field(id).is_some();
    if let Some((member, peer)) = ids {
        // UnionPay: forwarding institution, security control, receiving institution.
        if has(33) {
            fields.push((33, member.clone()));
        }
        if has(53) {
            fields.push((53, "0".repeat(16)));
        }
        if has(100) {
            fields.push((100, peer.clone()));
        }
    }
    if has(41) && spec.envelope().tpdu {
        // The switch's own terminal ID keeps its echoes apart from POS traffic.
        fields.push((41, "ISOSWTCH".into()));
    }
    if has(60) && spec.network().echo_f70.is_none() {
        // UnionPay POS sign-in: transaction type 00, batch 000000, code 003.
        fields.push((60, "00000000003".into()));
    }
    fields
}

/// The envelope of switch-made requests: TPDU and header with the configured
/// (or the front's) IDs.
fn envelope(
    spec: &Spec,
    cfg: &NetworkConfig,
    ids: Option<&(String, String)>,
) -> Result<Vec<u8>, TemplateError> {
    let env = spec.envelope();
    let mut out = Vec::new();
    if env.tpdu {
        let text = cfg.tpdu.as_deref().unwrap_or("6000000000");
        let raw = hex(text)
            .filter(|b| b.len() == Tpdu::LEN && b[0] == Tpdu::ID)
            .ok_or_else(|| bad("tpdu", TemplateReason::NotATpdu(text.to_string())))?;
        out.extend_from_slice(&raw);
    }
    let dest = cfg
        .destination_id
        .clone()
        .or_else(|| ids.map(|(_, peer)| peer.clone()));
    let source = cfg
        .source_id
        .clone()
        .or_else(|| ids.map(|(member, _)| member.clone()));
    let settings = Fresh {
        destination_id: dest.as_deref(),
        source_id: source.as_deref(),
        header_hex: cfg.pos_header.as_deref(),
    };
    let header = env.header.fresh(&settings).map_err(|e| {
        let key = match e.setting {
            Setting::DestinationId => "destination_id",
            Setting::SourceId => "source_id",
            Setting::HeaderHex => "pos_header",
        };
        bad(key, TemplateReason::Header(e))
    })?;
    if let Some(header) = header {
        out.extend_from_slice(header.as_bytes());
    }
    Ok(out)
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::iso8583::Message;

    fn service(toml_extra: &str, spec: &str, front: &str) -> ServiceConfig {
        let toml = format!(
            "[[service]]\nname = \"s\"\nspec = \"{spec}\"\n{toml_extra}\n{front}\n[service.back]\n[[service.back.node]]\nid = \"01\"\naddress = \"127.0.0.1:1\"\n"
        );
        Config::from_toml(&toml)
            .unwrap_or_else(|e| panic!("{e}\n{toml}"))
            .services
            .remove(0)
    }

    const LISTEN: &str = "[service.front]\nkind = \"listen\"\nlisten = \"127.0.0.1:0\"";

    fn field(spec: &Spec, msg: &Bytes, id: u16) -> String {
        let m = Message::parse(spec, msg.clone()).unwrap();
        m.field(id)
            .unwrap()
            .map(|f| f.logical().map(char::from).collect())
            .unwrap_or_default()
    }

    /// An 0800 of `spec` with F70 `f70` (none for `None`), parsed.
    fn nm(spec: &Spec, f70: Option<&str>) -> Bytes {
        let mut d = crate::iso8583::samples::echo(spec);
        d.remove(70);
        if let Some(f70) = f70 {
            d.set_text(70, f70);
        }
        Bytes::from(spec.encode(&d).unwrap())
    }

    /// Whole codes, read as text whatever F70's encoding (ASCII on CUPS,
    /// BCD on VISA): the link's three are the switch's, every other code
    /// (key exchange, cut-over, a code nobody listed) the institution's.
    #[test]
    fn only_sign_on_sign_off_and_echo_are_the_links() {
        for name in ["cups", "visa-base1"] {
            let spec = Spec::builtin(name).unwrap();
            let link = spec.field_codes(70, &["001", "002", "301"]).unwrap();
            let scope_of =
                |f70| scope(&Message::parse(&spec, nm(&spec, f70)).unwrap(), Some(&link));
            for f70 in ["101", "161", "201", "999", "000", "010"] {
                assert_eq!(scope_of(Some(f70)), NmScope::Institution, "{name} {f70}");
            }
            for f70 in [Some("001"), Some("002"), Some("301"), None] {
                assert_eq!(scope_of(f70), NmScope::Link, "{name} {f70:?}");
            }
            // A dialect whose F70 is no network management code.
            let m = Message::parse(&spec, nm(&spec, Some("101"))).unwrap();
            assert_eq!(scope(&m, None), NmScope::Link);
        }
    }

    /// The link codes the service is built with, on a real message.
    #[test]
    fn a_cups_key_reset_is_the_institutions_and_an_echo_the_links() {
        let spec = Spec::builtin("cups").unwrap();
        let cfg = service("", "cups", LISTEN);
        let made = crate::link::service::SwitchMade::new(
            NetworkTemplate::for_service(&cfg, &spec).unwrap(),
            &cfg,
            &spec,
        )
        .unwrap();
        let list = made.link_f70.as_ref();
        let mut d = crate::iso8583::samples::echo(&spec);
        let echo = spec.encode(&d).unwrap();
        d.set_text(70, "101");
        let reset = spec.encode(&d).unwrap();
        let msg = |b: Vec<u8>| Message::parse(&spec, Bytes::from(b)).unwrap();
        assert_eq!(scope(&msg(echo), list), NmScope::Link);
        assert_eq!(scope(&msg(reset), list), NmScope::Institution);
        assert!(
            Spec::builtin("cup-pos")
                .unwrap()
                .integrity()
                .institution_f70
                .is_empty(),
            "POS sign-in has no F70"
        );
    }

    /// A node's 0820 and the peer's 0830 share F11 + F7 + F70; another
    /// STAN, time or code is another request.
    #[test]
    fn a_node_request_and_its_answer_share_the_key() {
        let spec = Spec::builtin("cups").unwrap();
        let mut d = crate::iso8583::samples::echo(&spec);
        d.mti = Mti::new(*b"0820").unwrap();
        d.set_text(7, "1204113000");
        d.set_text(11, "100001");
        d.set_text(70, "101");
        let req = spec.encode(&d).unwrap();
        let answer = spec.respond(&d, "00").unwrap();
        let answer = spec.encode(&answer).unwrap();
        let key =
            |b: &Vec<u8>| node_nm_key(&Message::parse(&spec, Bytes::from(b.clone())).unwrap());
        assert!(key(&req).is_some());
        assert_eq!(key(&req), key(&answer));
        for (id, other) in [(7, "1204113001"), (11, "100002"), (70, "161")] {
            let mut e = d.clone();
            e.set_text(id, other);
            assert_ne!(key(&req), key(&spec.encode(&e).unwrap()), "F{id}");
        }
        // Not a generic key: those start with MTI digits.
        assert_ne!(key(&req).unwrap().as_bytes()[1..3], *b"08");
        d.remove(7);
        assert!(key(&spec.encode(&d).unwrap()).is_none(), "no F7, no key");
    }

    #[test]
    fn time_and_stan_are_made_per_message() {
        let spec = Spec::builtin("iso87ascii").unwrap();
        let t = NetworkTemplate::for_service(&service("", "iso87ascii", LISTEN), &spec).unwrap();
        // 2026-12-03 03:03:20 UTC.
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_267_000);
        let a = t.build(&spec, NmKind::Echo, 41, at).unwrap();
        let b = t
            .build(
                &spec,
                NmKind::SignOn,
                42,
                at + std::time::Duration::from_secs(61),
            )
            .unwrap();
        assert_eq!(field(&spec, &a, 7), "1203030320");
        assert_eq!(field(&spec, &b, 7), "1203030421");
        assert_eq!(
            (field(&spec, &a, 11), field(&spec, &b, 11)),
            ("000041".into(), "000042".into())
        );
        assert_eq!(
            (field(&spec, &a, 70), field(&spec, &b, 70)),
            ("301".into(), "001".into())
        );
    }

    #[test]
    fn unionpay_ids_come_from_the_front_and_config_overrides_them() {
        let spec = Spec::builtin("cups").unwrap();
        let simplex = "[service.front]\nkind = \"simplex\"\nlisten = \"127.0.0.1:0\"\nconnect = \"127.0.0.1:1\"\nlinks = 2\nmember_id = \"03105840\"\npeer_id = \"00010000\"\n";
        let svc = service("f37_stamp = { offset = 0, width = 2 }", "cups", simplex);
        let t = NetworkTemplate::for_service(&svc, &spec).unwrap();
        let m = t
            .build(&spec, NmKind::SignOn, 7, SystemTime::now())
            .unwrap();
        let header = crate::wire::CupsHeader::parse(&m).unwrap();
        assert_eq!(header.destination_id().trim_end(), "00010000");
        assert_eq!(header.source_id().trim_end(), "03105840");
        assert_eq!(field(&spec, &m, 33), "03105840");
        assert_eq!(field(&spec, &m, 100), "00010000");
        assert_eq!(Message::parse(&spec, m).unwrap().mti().as_str(), "0820");

        let svc = service(
            "f37_stamp = { offset = 0, width = 2 }\n[service.network]\nsource_id = \"99999999\"\nfields = { F33 = \"99999999\" }",
            "cups",
            simplex,
        );
        let t = NetworkTemplate::for_service(&svc, &spec).unwrap();
        let m = t.build(&spec, NmKind::Echo, 8, SystemTime::now()).unwrap();
        assert_eq!(
            crate::wire::CupsHeader::parse(&m)
                .unwrap()
                .source_id()
                .trim_end(),
            "99999999"
        );
        assert_eq!(field(&spec, &m, 33), "99999999");
    }

    #[test]
    fn every_builtin_dialect_has_a_template_and_bad_settings_name_their_key() {
        for name in Spec::builtin_names() {
            let spec = Spec::builtin(name).unwrap();
            if crate::config::unswitchable(&spec).is_some() {
                continue; // decode, capture and replay only
            }
            let t = NetworkTemplate::for_service(&service("", name, LISTEN), &spec)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let m = t.build(&spec, NmKind::Echo, 1, SystemTime::now()).unwrap();
            let msg = Message::parse(&spec, m).unwrap();
            assert!(msg.mti().is_network_management(), "{name}");
            assert!(msg.validate().is_ok(), "{name}");
        }
        let spec = Spec::builtin("iso87ascii").unwrap();
        for (extra, key) in [
            ("mti = \"0200\"", "network.mti"),
            ("fields = { F11 = \"000001\" }", "network.fields.F11"),
            ("fields = { F199 = \"x\" }", "network.fields.F199"),
        ] {
            let svc = service(&format!("[service.network]\n{extra}"), "iso87ascii", LISTEN);
            let err = NetworkTemplate::for_service(&svc, &spec)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(key), "{extra}: {err}");
        }
        let svc = service(
            "[service.network]\nfields = { F11 = \"000001\" }",
            "iso87ascii",
            LISTEN,
        );
        let err = NetworkTemplate::for_service(&svc, &spec).unwrap_err();
        assert!(
            matches!(err.reason, TemplateReason::MadePerMessage),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "network.fields.F11: F7, F11 and F70 are made per message"
        );
    }
}
