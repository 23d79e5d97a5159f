//! A direct link's writer task: what it writes while the link is busy,
//! and how it hands the link back.

use super::*;

/// Moves what senders queued behind what the writer has not encoded yet.
fn take_queue(st: &mut DirectState, batch: &mut VecDeque<Outbound>) {
    if batch.is_empty() {
        std::mem::swap(&mut st.queue, batch);
    } else {
        batch.extend(st.queue.drain(..));
    }
}

/// Encodes frames from `batch` into `buf` up to [`BATCH_BYTES`]; the rest
/// waits for the next write. Returns how many.
fn encode_batch(prefix: LengthPrefix, batch: &mut VecDeque<Outbound>, buf: &mut BytesMut) -> u64 {
    let mut frames = 0;
    while buf.len() < BATCH_BYTES {
        let Some(item) = batch.pop_front() else { break };
        push(prefix, &item, buf);
        frames += 1;
    }
    frames
}

/// Gives back a queue's slots once it is empty and larger than an idle
/// link needs.
fn settle_queue(q: &mut VecDeque<Outbound>) {
    if q.is_empty() && q.capacity() > IDLE_QUEUE {
        *q = VecDeque::new();
    }
}

/// The writer task of a direct link, spawned by the sender that handed it
/// the link: writes the remainder and what queues behind it, and hands the
/// link back once the queue is empty. Then it ends, unless the link is
/// resident or coalescing: such a writer waits to be handed the link
/// again. A failed write ends the link.
pub(super) fn run_direct_writer(d: Arc<Direct>) -> impl Future<Output = ()> {
    // Made before the task's first poll: a task aborted before it ran drops
    // its future, and with it this guard.
    let mut gone = WriterGone {
        d: Arc::clone(&d),
        returned: false,
    };
    async move {
        match write_direct(&d).await {
            // The guard ends the link as the task ends.
            Err(e) => _ = d.lock().failed.get_or_insert(e.kind()),
            Ok(()) => gone.returned(),
        }
    }
}

/// Runs a direct link's busy periods; `Ok` once it handed the link back
/// and its handle is cleared (the task then ends).
async fn write_direct(d: &Direct) -> io::Result<()> {
    let mut buf = BytesMut::new();
    // Frames taken from the queue and not yet encoded (a batch past
    // BATCH_BYTES leaves the rest for the next write).
    let mut batch = VecDeque::new();
    loop {
        loop {
            // The remainder a sender began goes before anything queued: those
            // frames were queued after it marked the link busy.
            let (counted, closing, mut futile) = {
                let mut st = d.lock();
                if let Some(kind) = st.failed {
                    return Err(kind.into());
                }
                let closing = d.senders.load(Ordering::Acquire) == 0;
                if !st.busy {
                    // A waiting writer's stale wake-up: the link is idle, its
                    // held-back bytes (if any) are its senders' to write.
                    // Unless every sender is gone: then they are this task's.
                    if closing && st.pending.is_empty() {
                        st.writer = None;
                        return Ok(());
                    }
                    if !closing {
                        break;
                    }
                    st.busy = true;
                }
                buf.extend_from_slice(&st.pending);
                settle(&mut st.pending, true);
                take_queue(&mut st, &mut batch);
                (buf.len(), closing, st.futile)
            };
            let mut frames = encode_batch(d.prefix, &mut batch, &mut buf);
            if frames > 0 && buf.len() < BATCH_BYTES && !closing {
                // A frame handed over on a loaded link, or a probe: let the
                // ready readers run first; what they queue joins this write.
                tokio::task::yield_now().await;
                take_queue(&mut d.lock(), &mut batch);
                let gained = encode_batch(d.prefix, &mut batch, &mut buf);
                futile = if gained > 0 {
                    0
                } else {
                    futile.saturating_add(1)
                };
                frames += gained;
            }
            write_all(&d.sock, &buf).await?;
            if let Some(conn) = &d.conn {
                conn.wrote(frames, (buf.len() - counted) as u64);
            }
            let mut st = d.lock();
            st.futile = futile;
            if !st.pending.is_empty()
                || st.failed.is_some()
                || !st.queue.is_empty()
                || !batch.is_empty()
            {
                // More to write: queued meanwhile, left past the batch, or
                // handed over again (the link was idle when this wake began:
                // a stale wake-up).
                drop(st);
                settle(&mut buf, false);
                continue;
            }
            st.busy = false;
            st.coalescing = futile < FUTILE_WAITS;
            settle_queue(&mut st.queue);
            let stays = !closing && (d.resident || st.coalescing);
            if !stays {
                // Handed back under the lock with the handle cleared: the
                // next hand-over spawns a new writer.
                st.writer = None;
            }
            drop(st);
            if closing || d.senders.load(Ordering::Acquire) == 0 {
                d.owner.wake();
            }
            if !stays {
                return Ok(());
            }
            settle_queue(&mut batch);
            settle(&mut buf, true);
            break;
        }
        d.wake.notified().await;
    }
}

/// Writes all of `buf`, waiting for the socket to take more when it is full.
async fn write_all(sock: &OwnedWriteHalf, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match sock.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => sock.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
