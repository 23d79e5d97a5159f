//! What a simulated node sends of its own: requests it originates (acquirer
//! traffic toward a peer through a simplex or duplex service) and key
//! requests (`0820` F70 `101`), each of which must come back to this node,
//! and the counting of their answers and expiries.

use super::*;

/// A response to a node-originated request, read on connection `conn`: it
/// must be one of ours, on whichever connection it comes.
pub(super) fn originated_response(shared: &Shared, msg: &Message<'_>, conn: u64) {
    let stats = &shared.stats;
    let stan = msg.field(11).ok().flatten().and_then(|f| {
        f.logical().try_fold(0u32, |n, d| {
            d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
        })
    });
    let mine = stan.and_then(|s| lock(&shared.outstanding).remove(&s));
    let Some((_, sent_on)) = mine else {
        stats.foreign_responses.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if sent_on != conn {
        stats
            .originated_answered_elsewhere
            .fetch_add(1, Ordering::Relaxed);
    }
    let approved = msg
        .field(39)
        .ok()
        .flatten()
        .is_some_and(|f| f.eq_logical(b"00"));
    let counter = if approved {
        &stats.originated_answered
    } else {
        &stats.originated_declined
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// An `0810`/`0830`: the answer to one of the node's key requests, matched by
/// F11 + F7, on whichever connection it comes.
pub(super) fn key_request_response(shared: &Shared, msg: &Message<'_>) {
    let stats = &shared.stats;
    let mine = key_request_key(msg).and_then(|k| lock(&shared.key_requests).remove(&k));
    let counter = if mine.is_some() {
        &stats.key_requests_answered
    } else {
        &stats.foreign_responses
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// F11 and F7 of a key request or its answer.
fn key_request_key(msg: &Message<'_>) -> Option<(u32, [u8; 10])> {
    let logical = |id: u16| -> Option<Vec<u8>> {
        let f: Vec<u8> = msg.field(id).ok().flatten()?.logical().collect();
        f.iter().all(u8::is_ascii_digit).then_some(f)
    };
    let stan = std::str::from_utf8(&logical(11)?).ok()?.parse().ok()?;
    Some((stan, logical(7)?.try_into().ok()?))
}

/// Sends a key request every `k.every` on the node's connections in turn,
/// and expires the unanswered.
pub(super) async fn request_keys(
    shared: Arc<Shared>,
    k: KeyRequests,
    mut shutdown: watch::Receiver<bool>,
) {
    let every = k.every.max(Duration::from_millis(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep = tokio::time::interval(
        (k.timeout / 4).clamp(Duration::from_millis(5), Duration::from_millis(100)),
    );
    loop {
        tokio::select! {
            // Held, like originated requests, while origination is stopped.
            _ = tick.tick() => drop(shared.originating.issue(|| send_key_request(&shared, &k))),
            _ = sweep.tick() => expire_key_requests(&shared, k.timeout),
            _ = shutdown.changed() => return,
        }
    }
}

/// One `0820` F70 `101` with F7 now and the node's next STAN, no F37.
fn send_key_request(shared: &Shared, k: &KeyRequests) {
    let conn = {
        let conns = lock(&shared.conns);
        if conns.is_empty() {
            return;
        }
        let turn = shared.next_key_conn.fetch_add(1, Ordering::Relaxed);
        conns[turn % conns.len()].1.clone()
    };
    let spec = &*shared.spec;
    let stan = shared.next_stan(k.stan_base);
    let f7 = crate::iso8583::transmission_date_time(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    let mut d = samples::echo(spec);
    d.mti = Mti::new(*b"0820").unwrap_or(d.mti);
    d.remove(37);
    d.set_text(7, String::from_utf8_lossy(&f7));
    d.set_text(11, format!("{stan:06}"));
    d.set_text(70, "101");
    let Ok(payload) = spec.encode(&d) else {
        shared.stats.bad.fetch_add(1, Ordering::Relaxed);
        return;
    };
    lock(&shared.key_requests).insert((stan, f7), Instant::now());
    if conn
        .try_send(Outbound::message(Bytes::from(payload)))
        .is_ok()
    {
        shared
            .stats
            .key_requests_sent
            .fetch_add(1, Ordering::Relaxed);
    } else {
        lock(&shared.key_requests).remove(&(stan, f7));
    }
}

fn expire_key_requests(shared: &Shared, timeout: Duration) {
    let now = Instant::now();
    let mut out = lock(&shared.key_requests);
    let before = out.len();
    out.retain(|_, sent| now.duration_since(*sent) < timeout);
    let expired = (before - out.len()) as u64;
    shared
        .stats
        .key_requests_unanswered
        .fetch_add(expired, Ordering::Relaxed);
}

/// Sends node-originated requests at a rate, round robin over the node's
/// connections, and expires the unanswered.
pub(super) async fn originate(
    shared: Arc<Shared>,
    o: Originate,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(mut next) = Originator::new(&shared.spec, &o) else {
        return;
    };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / o.rate.max(0.01)));
    // A busy runtime delays ticks; it must not then fire a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        expire_originated(&shared, o.timeout);
        if shared.originating.issue(|| next.issue(&shared, &o)) == Some(Err(Unsendable)) {
            return;
        }
    }
}

/// The template's F11 cannot hold a STAN: origination stops.
#[derive(Debug, PartialEq, Eq)]
struct Unsendable;

/// How a six-digit F11 is written on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DigitForm {
    /// Six ASCII digits.
    Ascii,
    /// Six EBCDIC digits (Mastercard, 0xF0..0xF9).
    Ebcdic,
    /// Three BCD bytes.
    Bcd,
}

impl DigitForm {
    fn of(spec: &Spec, wire_len: usize) -> DigitForm {
        match spec.field(11).map(|d| d.data) {
            Some(crate::iso8583::Data::Ebcdic) => DigitForm::Ebcdic,
            _ if wire_len == 6 => DigitForm::Ascii,
            _ => DigitForm::Bcd,
        }
    }

    fn encode(self, digits: &str) -> Vec<u8> {
        match self {
            DigitForm::Ascii => digits.as_bytes().to_vec(),
            DigitForm::Ebcdic => digits.bytes().map(|d| 0xF0 | (d - b'0')).collect(),
            DigitForm::Bcd => digits
                .as_bytes()
                .chunks(2)
                .map(|p| ((p[0] - b'0') << 4) | (p[1] - b'0'))
                .collect(),
        }
    }
}

/// The next node-originated request: the template with its STAN.
struct Originator {
    template: Bytes,
    f11: std::ops::Range<usize>,
    /// How F11's six digits are written.
    f11_form: DigitForm,
    next_conn: usize,
}

impl Originator {
    fn new(spec: &Spec, o: &Originate) -> Option<Originator> {
        let template = crate::sim::sample_request(spec, &o.mti).ok()?;
        let msg = Message::parse(spec, template.clone()).ok()?;
        let f11 = msg.field(11).ok().flatten()?.range();
        Some(Originator {
            f11_form: DigitForm::of(spec, f11.len()),
            template,
            f11,
            next_conn: 0,
        })
    }

    /// Sends one request on the next connection, recorded as outstanding
    /// before it leaves.
    fn issue(&mut self, shared: &Shared, o: &Originate) -> Result<(), Unsendable> {
        let (conn_id, conn) = {
            let conns = lock(&shared.conns);
            if conns.is_empty() {
                return Ok(());
            }
            self.next_conn = self.next_conn.wrapping_add(1);
            let (id, tx) = &conns[self.next_conn % conns.len()];
            (*id, tx.clone())
        };
        let stan = shared.next_stan(o.stan_base);
        let digits = format!("{stan:06}");
        let encoded = self.f11_form.encode(&digits);
        let mut patch = Patch::default();
        if patch.overwrite(self.f11.start, &encoded).is_err() {
            return Err(Unsendable);
        }
        lock(&shared.outstanding).insert(stan, (Instant::now(), conn_id));
        if conn
            .try_send(Outbound::Message(self.template.clone(), patch))
            .is_ok()
        {
            shared.stats.originated.fetch_add(1, Ordering::Relaxed);
        } else {
            lock(&shared.outstanding).remove(&stan);
        }
        Ok(())
    }
}

fn expire_originated(shared: &Shared, timeout: Duration) {
    let now = Instant::now();
    let mut out = lock(&shared.outstanding);
    let before = out.len();
    out.retain(|_, (sent, _)| now.duration_since(*sent) < timeout);
    let expired = (before - out.len()) as u64;
    shared
        .stats
        .originated_unanswered
        .fetch_add(expired, Ordering::Relaxed);
}
