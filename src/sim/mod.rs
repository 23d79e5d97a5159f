//! Simulators: a channel node, a POS network controller, UnionPay's side of a
//! simplex link set, VISA's side of duplex links and a load generator.
//! They speak through real sockets and check what they get back.

pub mod answer;
pub mod cups;
pub mod ledger;
pub mod load;
pub mod nac;
pub mod node;
pub mod original;
pub mod peer;
pub mod visa;
pub mod writer;

use bytes::Bytes;

use crate::iso8583::{Data, FieldDef, Mti, Spec, Value, samples};

/// Waits up to `grace` for every task of `tasks` to end after a shutdown
/// signal, then aborts what is left and reaps it: a simulator's stop never
/// hangs on a task that does not listen.
pub async fn join_within(tasks: &mut tokio::task::JoinSet<()>, grace: std::time::Duration) {
    let drained =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// Answers waiting out their delay, at most this many per simulator.
pub const MAX_DELAYED: usize = 10_000;

/// Answers a simulator sends after a delay: each waits in its own task, at
/// most [`MAX_DELAYED`] at once, and none is sent once the simulator stops.
#[derive(Debug, Default)]
pub struct DelayedAnswers {
    waiting: std::sync::atomic::AtomicUsize,
}

impl DelayedAnswers {
    /// Runs `send` after `delay` unless `shutdown` turns true first. `false`
    /// (nothing scheduled) when [`MAX_DELAYED`] answers are already waiting:
    /// the caller counts the answer unsent.
    pub fn send_after(
        self: &std::sync::Arc<Self>,
        delay: std::time::Duration,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
        send: impl FnOnce() + Send + 'static,
    ) -> bool {
        use std::sync::atomic::Ordering;
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= MAX_DELAYED {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let me = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            let due = tokio::select! {
                _ = tokio::time::sleep(delay) => true,
                _ = shutdown.wait_for(|stop| *stop) => false,
            };
            me.waiting.fetch_sub(1, Ordering::Relaxed);
            if due {
                send();
            }
        });
        true
    }
}

/// Whether a simulator originates requests. [`OriginateGate::close`] returns
/// only once no request is part-way out, so whatever was issued is by then in
/// the simulator's outstanding table: a caller that closes the gate and then
/// waits for that table to empty cannot miss a request issued in between (and
/// count it unanswered at the stop). Without the wait, a sender preempted
/// between its check and its send issued one request after the close.
#[derive(Debug)]
pub struct OriginateGate {
    open: std::sync::atomic::AtomicBool,
    issuing: std::sync::Mutex<()>,
}

impl OriginateGate {
    pub fn new(open: bool) -> OriginateGate {
        OriginateGate {
            open: std::sync::atomic::AtomicBool::new(open),
            issuing: std::sync::Mutex::new(()),
        }
    }

    pub fn is_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Closes the gate and waits out an `issue` under way (a few microseconds:
    /// issuing never awaits).
    pub fn close(&self) {
        self.open.store(false, std::sync::atomic::Ordering::Release);
        drop(self.issuing.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Runs `issue` if the gate is open; a `close` meanwhile waits for it.
    pub fn issue<R>(&self, issue: impl FnOnce() -> R) -> Option<R> {
        let _issuing = self.issuing.lock().unwrap_or_else(|p| p.into_inner());
        self.is_open().then(issue)
    }
}

/// Fields of the generated load requests: what a switch routes on, plus PAN and
/// amount; padding fields are added to reach a size.
const LEAN_FIELDS: [u16; 16] = [2, 3, 4, 7, 11, 12, 13, 22, 25, 32, 33, 37, 41, 42, 49, 100];

/// A typical request of `mti` (e.g. `0200`) for `spec`.
pub fn sample_request(spec: &Spec, mti: &str) -> Result<Bytes, String> {
    sized_request(spec, mti, 0)
}

/// A typical request padded with private-use data to about `size` payload bytes
/// (exactly, where the spec has a variable field to pad with). `size` 0 = no
/// padding.
pub fn sized_request(spec: &Spec, mti: &str, size: usize) -> Result<Bytes, String> {
    let digits: [u8; 4] = mti
        .as_bytes()
        .try_into()
        .map_err(|_| format!("`{mti}` is not a four-digit MTI"))?;
    let mti = Mti::new(digits).ok_or_else(|| format!("`{mti}` is not a four-digit MTI"))?;
    // A lean request (key fields, amount, PAN) so that small sizes are reachable.
    let mut d = samples::purchase(spec);
    d.retain(|id| LEAN_FIELDS.contains(&id));
    d.mti = mti;
    let base = spec.encode(&d).map_err(|e| e.to_string())?;
    if size <= base.len() {
        return Ok(Bytes::from(base));
    }
    // Fill private-use fields one after another; each field's own length prefix
    // and bitmap bit cost a few bytes, so measure after each and correct.
    for (id, def) in padding_fields(spec) {
        for _ in 0..3 {
            let len = spec.encode(&d).map_err(|e| e.to_string())?.len();
            if len == size {
                break;
            }
            let current = d.get(id).map_or(0, value_bytes);
            let want_bytes = (current + size).saturating_sub(len);
            let units = if def.data == Data::Bcd {
                want_bytes * 2
            } else {
                want_bytes
            };
            let fill = units.min(def.length);
            if fill == 0 {
                d.remove(id);
                continue;
            }
            d.set(id, padding(def, fill));
        }
    }
    spec.encode(&d).map(Bytes::from).map_err(|e| e.to_string())
}

/// Encoded bytes of a value (BCD text packs two digits a byte).
fn value_bytes(v: &Value) -> usize {
    match v {
        Value::Binary(b) => b.len(),
        Value::Text(t) if t.bytes().all(|c| c.is_ascii_digit()) => t.len().div_ceil(2),
        Value::Text(t) => t.len(),
    }
}

/// Variable, non-secret private-use fields a request can be padded with.
fn padding_fields(spec: &Spec) -> impl Iterator<Item = (u16, &FieldDef)> {
    [48, 62, 63, 61, 57, 58, 59]
        .into_iter()
        .filter_map(|id| spec.field(id).map(|d| (id, d)))
        .filter(|(_, d)| !d.is_fixed() && !crate::iso8583::is_sensitive(d))
}

fn padding(def: &FieldDef, len: usize) -> Value {
    match def.data {
        Data::Binary => Value::binary(vec![0x20; len]),
        Data::Bcd => Value::text("0".repeat(len)),
        _ => Value::text("P".repeat(len)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_requests_hit_their_size() {
        for name in ["cup-pos", "cups", "iso87ascii", "iso87binary"] {
            let spec = Spec::builtin(name).unwrap();
            for size in [250, 1300] {
                let r = sized_request(&spec, "0200", size).unwrap();
                assert!(
                    r.len().abs_diff(size) <= 4,
                    "{name} {size}: got {}",
                    r.len()
                );
            }
        }
    }

    /// A close while a request is being issued returns only after it: the
    /// request is then counted, so a stop that waits for the outstanding
    /// table to empty waits for it too. (With a flag alone, the issue could
    /// finish after the close, and the stop counted it unanswered.)
    #[test]
    fn closing_the_gate_waits_for_the_request_under_way() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Barrier};
        let gate = Arc::new(OriginateGate::new(true));
        let counted = Arc::new(AtomicBool::new(false));
        let entered = Arc::new(Barrier::new(2));
        let issuer = {
            let (gate, counted, entered) = (gate.clone(), counted.clone(), entered.clone());
            std::thread::spawn(move || {
                gate.issue(|| {
                    entered.wait();
                    // Long enough for the close below to be waiting.
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    counted.store(true, Ordering::SeqCst);
                })
            })
        };
        entered.wait();
        gate.close();
        assert!(counted.load(Ordering::SeqCst), "close returned mid-issue");
        assert_eq!(issuer.join().unwrap(), Some(()));
        assert_eq!(gate.issue(|| ()), None, "a closed gate issues nothing");
        gate.open();
        assert_eq!(gate.issue(|| 7), Some(7));
    }

    /// An answer delayed an hour goes out after the hour, not before: on the
    /// paused runtime clock, so the hour takes no real time.
    #[tokio::test(start_paused = true)]
    async fn a_delayed_answer_waits_out_its_delay() {
        use std::sync::Arc;
        use std::time::Duration;
        let delayed = Arc::new(DelayedAnswers::default());
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let (sent, mut answers) = tokio::sync::mpsc::unbounded_channel();
        let hour = Duration::from_secs(3600);
        let from = tokio::time::Instant::now();
        assert!(delayed.send_after(hour, shutdown, move || {
            let _ = sent.send(tokio::time::Instant::now());
        }));
        let at = answers.recv().await.expect("the answer is sent");
        assert!(at - from >= hour, "sent after {:?}", at - from);
        assert!(answers.recv().await.is_none(), "once");
    }

    /// Delayed answers are sent after their delay, not after a stop, and
    /// past the bound nothing more is scheduled until one has gone. The
    /// clock is paused: the hour-long waits below are never reached, and the
    /// polls cost no real time.
    #[tokio::test(start_paused = true)]
    async fn delayed_answers_are_bounded_and_end_with_the_simulator() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Duration;
        let delayed = Arc::new(DelayedAnswers::default());
        let sent = Arc::new(AtomicUsize::new(0));
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let count = || {
            let sent = sent.clone();
            move || {
                sent.fetch_add(1, Ordering::SeqCst);
            }
        };
        let hour = Duration::from_secs(3600);
        // Bounded: the waits below would hang on a broken DelayedAnswers.
        let run = async {
            assert!(delayed.send_after(Duration::ZERO, shutdown.clone(), count()));
            while sent.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            for _ in 0..MAX_DELAYED {
                assert!(delayed.send_after(hour, shutdown.clone(), count()));
            }
            let over = delayed.send_after(Duration::ZERO, shutdown.clone(), count());
            assert!(!over, "over the bound");
            stop.send(true).unwrap();
            while delayed.waiting.load(Ordering::SeqCst) > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("within 30 s");
        assert_eq!(sent.load(Ordering::SeqCst), 1, "nothing after the stop");
    }
}
