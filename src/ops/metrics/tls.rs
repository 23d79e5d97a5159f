//! TLS metrics: each certificate's time to expiry (the alert's input) and
//! the handshakes of every service and of the admin listener, by side and
//! failure reason.

use std::sync::atomic::Ordering;

use prometheus_client::encoding::DescriptorEncoder;

use super::{counter, encode_counters, encode_gauges, gauge, label_value};
use crate::ops::control::SwitchHandle;
use crate::tls::{Handshakes, Side};

pub(super) fn encode(enc: &mut DescriptorEncoder, handle: &SwitchHandle) -> std::fmt::Result {
    let admin = handle.admin_tls.get();
    let services = handle
        .services
        .iter()
        .map(|r| (r.service.name(), &r.service.view().links.tls));
    let certs = crate::tls::cert_statuses(services, admin.map(|a| &**a));
    let mut expiry = gauge(
        "isoswitch_tls_cert_expiry_seconds",
        "Seconds until a certificate the switch presents expires (negative once expired), by service, link kind and config key.",
    );
    for c in &certs {
        expiry.samples.push((
            vec![
                ("service", label_value(&c.service)),
                ("link", label_value(&c.link)),
                ("key", label_value(&c.key)),
            ],
            c.expires_in_s as f64,
        ));
    }
    let mut ca_expiry = gauge(
        "isoswitch_tls_ca_expiry_seconds",
        "Seconds until a CA certificate the switch verifies peers with (ca, client_ca) expires (negative once expired), by service, link kind, config key and subject.",
    );
    let cas = crate::tls::ca_statuses(
        handle
            .services
            .iter()
            .map(|r| (r.service.name(), &r.service.view().links.tls)),
        admin.map(|a| &**a),
    );
    for c in &cas {
        ca_expiry.samples.push((
            vec![
                ("service", label_value(&c.service)),
                ("link", label_value(&c.link)),
                ("key", label_value(&c.key)),
                ("subject", label_value(&c.subject)),
            ],
            c.expires_in_s as f64,
        ));
    }
    let mut done = counter(
        "isoswitch_tls_handshakes",
        "TLS handshakes completed, by service and side (accept: the switch as server; connect: as client).",
    );
    let mut failed = counter(
        "isoswitch_tls_handshake_failures",
        "TLS handshakes that failed, by service, side and reason (no-certificate, bad-certificate, expired-certificate, revoked-certificate, name-not-allowed, incompatible, peer-alert, not-tls, timeout, io).",
    );
    let mut add = |name: &str, h: &Handshakes| {
        for (side, v) in [(Side::Accept, &h.accepted), (Side::Connect, &h.connected)] {
            let labels = vec![
                ("service", label_value(name)),
                ("side", side.as_str().to_string()),
            ];
            done.samples.push((labels, v.load(Ordering::Relaxed)));
        }
        for (side, why, n) in h.failures() {
            let labels = vec![
                ("service", label_value(name)),
                ("side", side.as_str().to_string()),
                ("reason", why.as_str().to_string()),
            ];
            failed.samples.push((labels, n));
        }
    };
    for r in handle.services.iter() {
        let tls = &r.service.view().links.tls;
        let on = tls.front.is_some()
            || tls.in_links.is_some()
            || tls.out_links.is_some()
            || tls.back.is_some();
        if on {
            add(r.service.name(), &tls.handshakes);
        }
    }
    if let Some(a) = admin {
        add("admin", &a.handshakes);
    }
    encode_gauges(enc, &expiry)?;
    encode_gauges(enc, &ca_expiry)?;
    encode_counters(enc, &done)?;
    encode_counters(enc, &failed)
}
