//! Supervision: every background task of the switch belongs to one
//! [`Supervisor`]. Critical tasks (accept loops, node connection keepers, the
//! timeout sweeper, health checkers) are restarted with backoff when they end
//! while the switch is not stopping, logged at ERROR each time; task sets that
//! cannot be restarted in place (a link set's tasks) make the switch fatal, so
//! `isoswitch run` exits non-zero and the service manager restarts it. Nothing
//! ends silently. Stopping uses the same tree: one cancellation token, scoped
//! children (e.g. one per node, cancelled when the node is removed).
//!
//! Every task runs on the runtime the supervisor was built on (the switch's),
//! whichever thread asks: the admin listener serves on a runtime of its own,
//! and a node it adds must not live and die with that one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::task::{AbortHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// First restart delay; doubles per consecutive failure up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A task that ran this long before ending starts its backoff afresh.
const HEALTHY_RUN: Duration = Duration::from_secs(30);

pub struct Supervisor {
    cancel: CancellationToken,
    tracker: TaskTracker,
    /// The running instance of each named task, for fault injection.
    running: Mutex<HashMap<String, AbortHandle>>,
    /// Child tokens by scope (e.g. `svc/node/3`), cancelled to stop a group.
    scopes: Mutex<HashMap<String, CancellationToken>>,
    restarts: AtomicU64,
    fatal: watch::Sender<Option<String>>,
    /// The switch's runtime (`None` only when built outside any runtime:
    /// tasks then go to whichever runtime spawns them).
    runtime: Option<Handle>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Supervisor {
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            running: Mutex::default(),
            scopes: Mutex::default(),
            restarts: AtomicU64::new(0),
            fatal: watch::channel(None).0,
            runtime: Handle::try_current().ok(),
        }
    }
}

impl Supervisor {
    pub fn new() -> Arc<Supervisor> {
        Arc::new(Supervisor::default())
    }

    /// Runs `task` on the switch's runtime, from any thread or runtime (the
    /// admin listener hands its changes over with this).
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            Some(rt) => rt.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Runs `task` on the switch's runtime, tracked: [`Supervisor::stop`]
    /// waits for it.
    fn track<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match &self.runtime {
            Some(rt) => drop(self.tracker.spawn_on(task, rt)),
            None => drop(self.tracker.spawn(task)),
        }
    }

    /// A stop signal in the form the link tasks take (`true` = stop), fed by
    /// the root token.
    pub fn shutdown(&self) -> watch::Receiver<bool> {
        self.watch_of(self.cancel.clone())
    }

    /// The root token: cancelled when the switch stops.
    pub fn token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// The token of scope `name`: cancelled when the scope is ended or the
    /// switch stops.
    pub fn scope_token(&self, name: &str) -> CancellationToken {
        self.lock_scopes()
            .entry(name.to_string())
            .or_insert_with(|| self.cancel.child_token())
            .clone()
    }

    /// A stop signal for scope `name`, in the form the link tasks take.
    pub fn scope(&self, name: &str) -> watch::Receiver<bool> {
        self.watch_of(self.scope_token(name))
    }

    /// Stops every task of scope `name` (e.g. a removed node's connections).
    pub fn end_scope(&self, name: &str) {
        if let Some(t) = self.lock_scopes().remove(name) {
            t.cancel();
        }
    }

    /// A `watch` receiver that turns true when `token` is cancelled.
    pub fn watch_of(&self, token: CancellationToken) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(token.is_cancelled());
        self.track(async move {
            token.cancelled().await;
            let _ = tx.send(true);
        });
        rx
    }

    fn lock_scopes(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.scopes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, AbortHandle>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_stopping(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Restarts so far, all tasks together.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Runs the task `make` builds until `stop` is cancelled; whenever it
    /// ends before that (returned, panicked or killed), logs it at ERROR and
    /// starts a fresh one after a backoff. (The token, not a `watch` copy of
    /// it, decides: a task that saw its own stop signal first must not look
    /// like a failure.)
    pub fn spawn_critical<F, Fut>(
        self: &Arc<Self>,
        name: String,
        stop: CancellationToken,
        mut make: F,
    ) where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let sup = Arc::clone(self);
        self.track(async move {
            let mut backoff = BACKOFF_MIN;
            loop {
                let started = tokio::time::Instant::now();
                let task = tokio::spawn(make());
                sup.lock_running().insert(name.clone(), task.abort_handle());
                let outcome = task.await;
                if stop.is_cancelled() {
                    break;
                }
                let how = match outcome {
                    Ok(()) => "returned".to_string(),
                    Err(e) if e.is_panic() => "panicked".to_string(),
                    Err(_) => "was killed".to_string(),
                };
                if started.elapsed() >= HEALTHY_RUN {
                    backoff = BACKOFF_MIN;
                }
                sup.restarts.fetch_add(1, Ordering::Relaxed);
                tracing::error!(task = %name, how, restart_in = ?backoff, "critical task ended unexpectedly; restarting");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.cancelled() => break,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            sup.lock_running().remove(&name);
        });
    }

    /// Watches a set of tasks that cannot be restarted one by one (a link
    /// set's): if one ends before the switch stops, the switch is fatal.
    pub fn watch_set(self: &Arc<Self>, name: String, mut set: JoinSet<()>) {
        let sup = Arc::clone(self);
        self.track(async move {
            loop {
                tokio::select! {
                    next = set.join_next() => match next {
                        None => return,
                        Some(outcome) => {
                            if sup.is_stopping() {
                                continue;
                            }
                            let why = format!("a task of `{name}` ended unexpectedly: {outcome:?}");
                            tracing::error!(task = %name, ?outcome, "critical task ended unexpectedly; the switch must restart");
                            sup.fatal.send_replace(Some(why));
                        }
                    },
                    _ = sup.cancel.cancelled() => {
                        // Stopping: give the set its grace, then abort what is left.
                        let _ = tokio::time::timeout(Duration::from_secs(2), async {
                            while set.join_next().await.is_some() {}
                        }).await;
                        set.abort_all();
                        return;
                    }
                }
            }
        });
    }

    /// Resolves with the reason when the switch can no longer run as
    /// configured (see [`Supervisor::watch_set`]).
    pub async fn fatal(&self) -> String {
        let mut rx = self.fatal.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// Fault injection (tests, drills): aborts the running instance of every
    /// task whose name is `name` or starts with `name/`, as if it had died.
    /// Returns how many were killed.
    pub fn kill(&self, name: &str) -> usize {
        let running = self.lock_running();
        let mut killed = 0;
        for (task, handle) in running.iter() {
            let matches = task == name
                || task
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('/'));
            if matches {
                handle.abort();
                killed += 1;
            }
        }
        killed
    }

    /// Names of the supervised tasks running now.
    pub fn task_names(&self) -> Vec<String> {
        let mut names: Vec<_> = self.lock_running().keys().cloned().collect();
        names.sort();
        names
    }

    /// Signals every task to stop, without waiting.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Signals every task to stop and waits up to `grace` for them.
    pub async fn stop(&self, grace: Duration) {
        self.cancel.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            let left = self.task_names();
            tracing::warn!(?left, "tasks still running after the stop grace; aborting");
            for h in self.lock_running().values() {
                h.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// The runtime's clock is paused (the restart backoff passes at once),
    /// and each start is an event the test awaits.
    #[tokio::test(start_paused = true)]
    async fn a_killed_task_is_restarted_and_stop_ends_it() {
        let sup = Supervisor::new();
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let task_stop = sup.shutdown();
        sup.spawn_critical("svc/sweeper".into(), sup.token(), move || {
            let _ = started.send(());
            let mut sd = task_stop.clone();
            async move {
                let _ = sd.wait_for(|v| *v).await;
            }
        });
        let limit = Duration::from_secs(5);
        tokio::time::timeout(limit, starts.recv()).await.unwrap();
        assert_eq!(sup.kill("svc"), 1);
        tokio::time::timeout(limit, starts.recv()).await.unwrap();
        assert_eq!(sup.restarts(), 1);
        tokio::time::timeout(limit, sup.stop(limit)).await.unwrap();
        assert!(starts.try_recv().is_err(), "no third start");
        assert!(sup.task_names().is_empty());
    }

    /// A task that keeps ending is restarted after BACKOFF_MIN, then twice
    /// as long each time up to BACKOFF_MAX: measured on the paused runtime
    /// clock, so the minute of backoff below takes no real time.
    #[tokio::test(start_paused = true)]
    async fn restarts_back_off_doubling_up_to_the_cap() {
        let sup = Supervisor::new();
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        sup.spawn_critical("svc/flaky".into(), sup.token(), move || {
            let _ = started.send(tokio::time::Instant::now());
            async {}
        });
        let mut at = starts.recv().await.unwrap();
        let mut want = BACKOFF_MIN;
        for _ in 0..9 {
            let next = starts.recv().await.unwrap();
            let waited = next - at;
            // The timer wheel ticks in milliseconds.
            assert!(
                waited >= want && waited <= want + Duration::from_millis(2),
                "waited {waited:?} for {want:?}"
            );
            at = next;
            want = (want * 2).min(BACKOFF_MAX);
        }
        assert_eq!(want, BACKOFF_MAX, "the cap was reached");
        sup.stop(Duration::from_secs(5)).await;
    }

    /// A task that ends on its own stop signal at shutdown is not a failure,
    /// however the wake-ups interleave (it once raced its wrapper's copy of
    /// the signal and was logged as "ended unexpectedly").
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_ending_at_stop_are_not_restarted() {
        for _ in 0..50 {
            let sup = Supervisor::new();
            for i in 0..8 {
                let stop = sup.shutdown();
                sup.spawn_critical(format!("svc/t{i}"), sup.token(), move || {
                    let mut sd = stop.clone();
                    async move {
                        let _ = sd.wait_for(|v| *v).await;
                    }
                });
            }
            tokio::task::yield_now().await;
            sup.stop(Duration::from_secs(5)).await;
            assert_eq!(sup.restarts(), 0);
        }
    }

    /// A task started from another runtime's thread (as the admin listener
    /// adds a node) runs on the supervisor's runtime: it outlives the other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_started_from_another_runtime_outlive_it() {
        let sup = Supervisor::new();
        let go = Arc::new(tokio::sync::Notify::new());
        let done = Arc::new(AtomicUsize::new(0));
        let (s, g, d) = (Arc::clone(&sup), Arc::clone(&go), Arc::clone(&done));
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let stop = s.token();
                s.spawn_critical("svc/node/3/conn/0".into(), stop.clone(), move || {
                    let (g, d, stop) = (Arc::clone(&g), Arc::clone(&d), stop.clone());
                    async move {
                        g.notified().await;
                        d.fetch_add(1, Ordering::SeqCst);
                        stop.cancelled().await;
                    }
                });
            });
            // The other runtime ends here, and every task it runs with it.
        })
        .join()
        .unwrap();
        go.notify_one();
        tokio::time::timeout(Duration::from_secs(5), async {
            while done.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the task runs after the other runtime ended");
        assert_eq!(sup.restarts(), 0);
        sup.stop(Duration::from_secs(5)).await;
    }

    #[tokio::test]
    async fn a_set_task_ending_early_is_fatal() {
        let sup = Supervisor::new();
        let mut set = JoinSet::new();
        set.spawn(async {});
        sup.watch_set("svc/links".into(), set);
        let why = tokio::time::timeout(Duration::from_secs(5), sup.fatal())
            .await
            .unwrap();
        assert!(why.contains("svc/links"), "{why}");
    }

    #[tokio::test]
    async fn ending_a_scope_stops_only_its_tasks() {
        let sup = Supervisor::new();
        let mut a = sup.scope("svc/node/0");
        let b = sup.scope("svc/node/1");
        sup.end_scope("svc/node/0");
        tokio::time::timeout(Duration::from_secs(5), a.wait_for(|v| *v))
            .await
            .unwrap()
            .unwrap();
        assert!(!*b.borrow());
    }
}
