//! What a direct link's owner keeps of its writing side ([`LinkWriter`]),
//! and how a writer task's end ends the link ([`WriterGone`]).

use super::*;

/// What a link's owner (the task that reads it) keeps of its writing side:
/// awaited, it ends when the link can write no more (a write failed, or
/// the writer task ended); [`LinkWriter::finish`] and [`LinkWriter::abort`]
/// end the link.
#[derive(Debug)]
pub struct LinkWriter(pub(super) Owner);

#[derive(Debug)]
pub(super) enum Owner {
    /// A queue link's writer task.
    Task(JoinHandle<io::Result<()>>),
    /// A direct link, whose writer task comes and goes.
    Direct(Arc<Direct>),
}

impl Future for LinkWriter {
    type Output = io::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Owner::Task(task) => Pin::new(task)
                .poll(cx)
                .map(|joined| joined.unwrap_or_else(|e| Err(io::Error::other(e)))),
            Owner::Direct(d) => {
                d.owner.register(cx.waker());
                if !d.ended.load(Ordering::Acquire) {
                    return Poll::Pending;
                }
                Poll::Ready(match d.lock().failed {
                    Some(kind) => Err(kind.into()),
                    None => Ok(()),
                })
            }
        }
    }
}

impl LinkWriter {
    /// Whether the link can write no more.
    pub fn is_finished(&self) -> bool {
        match &self.0 {
            Owner::Task(task) => task.is_finished(),
            Owner::Direct(d) => d.ended.load(Ordering::Acquire),
        }
    }

    /// Lets what the link's senders sent go out: waits, at most `linger`,
    /// until every sender is gone and all of it is written (or a write
    /// failed), then ends the link.
    pub async fn finish(&mut self, linger: std::time::Duration) {
        let drained = std::future::poll_fn(|cx| match &mut self.0 {
            Owner::Task(task) => Pin::new(task).poll(cx).map(drop),
            Owner::Direct(d) => {
                d.owner.register(cx.waker());
                if d.drained() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
        });
        let _ = tokio::time::timeout(linger, drained).await;
        self.abort();
    }

    /// Ends the link now: nothing more goes out, and a writer task still
    /// writing is stopped.
    pub fn abort(&self) {
        match &self.0 {
            Owner::Task(task) => task.abort(),
            Owner::Direct(d) => {
                d.ended.store(true, Ordering::Release);
                // Taken under the lock, aborted outside it: the task's guard
                // takes the lock when it is dropped.
                let writer = d.lock().writer.take();
                if let Some(writer) = writer {
                    writer.abort();
                }
            }
        }
    }
}

impl Direct {
    /// Every sender is gone and all they sent is written, or the link
    /// ended: its owner has nothing left to wait for.
    fn drained(&self) -> bool {
        if self.ended.load(Ordering::Acquire) {
            return true;
        }
        let st = self.lock();
        st.failed.is_some()
            || (self.senders.load(Ordering::Acquire) == 0
                && !st.busy
                && st.pending.is_empty()
                && st.queue.is_empty())
    }
}

/// The end of a writer task, however it ends: a write that failed ends the
/// link (senders get `Closed`, as from a channel), and so does a task
/// stopped before it handed the link back (aborted, or its runtime gone).
pub(super) struct WriterGone {
    pub(super) d: Arc<Direct>,
    /// It handed the link back (or left it idle) and cleared its handle.
    pub(super) returned: bool,
}

impl WriterGone {
    /// The task handed the link back itself: nothing to end.
    pub(super) fn returned(&mut self) {
        self.returned = true;
    }
}

impl Drop for WriterGone {
    fn drop(&mut self) {
        if self.returned {
            return;
        }
        self.d.ended.store(true, Ordering::Release);
        self.d.lock().writer = None;
        self.d.owner.wake();
    }
}
