//! `replay --record`: what the replay sent and the target answered, written
//! as a capture of its own through the capture writer's [`Recorder`].

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use tokio::net::TcpStream;

use crate::capture::tap::Event;
use crate::capture::writer::Recorder;

/// `--record`: what the replay sent and the target answered, as a capture.
pub(super) struct Rec {
    recorder: Option<Arc<Mutex<Recorder>>>,
    conn: u64,
    offsets: Mutex<[u64; 2]>,
}

static RECORD_CONN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Rec {
    pub(super) fn open(recorder: Option<Arc<Mutex<Recorder>>>, stream: &TcpStream) -> Rec {
        let conn = RECORD_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let rec = Rec {
            recorder,
            conn,
            offsets: Mutex::new([0, 0]),
        };
        if let (Ok(client), Ok(server)) = (stream.local_addr(), stream.peer_addr()) {
            rec.event(Event::Open {
                conn,
                client,
                server,
                at: SystemTime::now(),
                staged: None,
            });
        }
        rec
    }

    pub(super) fn data(&self, from_client: bool, bytes: &[u8]) {
        if self.recorder.is_none() {
            return;
        }
        let offset = {
            let mut o = self.offsets.lock().unwrap_or_else(|p| p.into_inner());
            let slot = &mut o[usize::from(from_client)];
            let at = *slot;
            *slot += bytes.len() as u64;
            at
        };
        self.event(Event::Data {
            conn: self.conn,
            from_client,
            offset,
            bytes: Bytes::copy_from_slice(bytes),
            at: SystemTime::now(),
        });
    }

    fn event(&self, ev: Event) {
        if let Some(r) = &self.recorder {
            let mut r = r.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = r.record(ev) {
                tracing::error!(error = %e, "--record: cannot write the capture");
            }
        }
    }
}

impl Drop for Rec {
    fn drop(&mut self) {
        self.event(Event::Close {
            conn: self.conn,
            at: SystemTime::now(),
        });
    }
}
