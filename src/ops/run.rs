//! `isoswitch run`: start every configured service and keep them up until
//! Ctrl-C, printing one stats line per service at an interval.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;

use super::config::Config;
use super::supervisor::Supervisor;
use crate::link::{self, Running, Service};

/// Services started from one config.
pub struct Switch {
    pub services: Vec<Running>,
    handle: SwitchHandle,
    admin_addr: Option<SocketAddr>,
}

/// What the admin API and reload act on: the running services, the task
/// supervisor and the config they run. Cheap to clone.
#[derive(Clone)]
pub struct SwitchHandle {
    pub services: Arc<[Running]>,
    pub supervisor: Arc<Supervisor>,
    /// The config the services run now (reload replaces it).
    pub config: Arc<Mutex<Config>>,
    /// The file reload reads; `None` for a config given in memory.
    pub source: Arc<Mutex<Option<PathBuf>>>,
}

/// Errors starting a switch, naming the service.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("service `{service}`: {reason}")]
    Service { service: String, reason: String },
    #[error("service `{service}`: cannot listen: {source}")]
    Bind {
        service: String,
        source: std::io::Error,
    },
    #[error("admin: {0}")]
    Admin(String),
    /// A critical task ended and could not be restarted in place.
    #[error("stopped: {0}")]
    Fatal(String),
}

impl Switch {
    /// Starts every service of `config`, and the admin listener if configured.
    /// On error, whatever was started is stopped again.
    pub async fn start(config: &Config) -> Result<Switch, StartError> {
        let supervisor = Supervisor::new();
        match Self::start_under(config, &supervisor).await {
            Ok(switch) => Ok(switch),
            Err(e) => {
                supervisor.stop(Duration::from_secs(2)).await;
                Err(e)
            }
        }
    }

    async fn start_under(
        config: &Config,
        supervisor: &Arc<Supervisor>,
    ) -> Result<Switch, StartError> {
        let supervisor = Arc::clone(supervisor);
        let mut services = Vec::new();
        for svc in &config.services {
            let spec = svc.load_spec().map_err(|e| StartError::Service {
                service: svc.name.clone(),
                reason: e.to_string(),
            })?;
            let mut service =
                Service::new(svc.clone(), spec, Instant::now()).map_err(|reason| {
                    StartError::Service {
                        service: svc.name.clone(),
                        reason,
                    }
                })?;
            let capture = crate::capture::writer::attach(&mut service);
            let service = Arc::new(service);
            if let Some(capture) = capture {
                // One writer per service, owned by the supervisor: it cannot
                // restart (it owns the files), so an early end is fatal.
                let mut set = tokio::task::JoinSet::new();
                set.spawn(capture.run(Arc::clone(&service), supervisor.shutdown()));
                supervisor.watch_set(format!("{}/capture", svc.name), set);
            }
            let running =
                link::start(service, &supervisor)
                    .await
                    .map_err(|source| StartError::Bind {
                        service: svc.name.clone(),
                        source,
                    })?;
            tracing::info!(service = %svc.name, front = %running.front_addr, "service started");
            services.push(running);
        }
        let handle = SwitchHandle {
            services: services.clone().into(),
            supervisor,
            config: Arc::new(Mutex::new(config.clone())),
            source: Arc::default(),
        };
        let admin_addr = match &config.admin {
            Some(admin) => Some(
                super::admin::start(admin, handle.clone())
                    .await
                    .map_err(StartError::Admin)?,
            ),
            None => None,
        };
        Ok(Switch {
            services,
            handle,
            admin_addr,
        })
    }

    /// The admin listener's address, when one is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    pub fn handle(&self) -> &SwitchHandle {
        &self.handle
    }

    /// The file a reload reads (what `run --config` loaded).
    pub fn set_source(&self, path: Option<PathBuf>) {
        *self.handle.source.lock().unwrap_or_else(|p| p.into_inner()) = path;
    }

    pub fn service(&self, name: &str) -> Option<&Arc<Service>> {
        self.services
            .iter()
            .map(|r| &r.service)
            .find(|s| s.name() == name)
    }

    /// Stops gracefully: new requests are declined with the `shutdown` code at
    /// once while those in flight get their answers, for at most the longest
    /// request timeout of any service; what is still in flight then is declined
    /// too; then links sign off and close. Every request accepted gets exactly
    /// one answer, shutdown included.
    pub async fn stop(self) {
        let grace = self
            .services
            .iter()
            .map(|r| r.service.request_timeout())
            .max()
            .unwrap_or_default();
        self.stop_within(grace).await;
    }

    /// [`Switch::stop`] with an explicit grace period.
    pub async fn stop_within(self, grace: Duration) {
        for r in &self.services {
            r.service.begin_drain();
        }
        let deadline = tokio::time::Instant::now() + grace;
        while self.services.iter().any(|r| r.service.in_flight() > 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let now = std::time::Instant::now();
        for r in &self.services {
            let declined = r.service.decline_all(now);
            if declined > 0 {
                tracing::warn!(
                    service = r.service.name(),
                    declined,
                    "in flight at the end of the grace period: declined"
                );
            }
        }
        // Let the writers flush the last answers before the links close.
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.handle.supervisor.stop(Duration::from_secs(2)).await;
    }
}

impl Drop for Switch {
    /// A switch dropped without [`Switch::stop`] still ends its tasks (links
    /// close; nothing waits for answers in flight).
    fn drop(&mut self) {
        self.handle.supervisor.cancel();
    }
}

/// One line of counters for a service.
pub fn stats_line(service: &Service) -> String {
    let c = &service.counters;
    let nodes: Vec<String> = service
        .pool
        .nodes()
        .iter()
        .map(|n| {
            format!(
                "{}:{}/{}c",
                n.config.id,
                n.counters.sent.load(Ordering::Relaxed),
                n.live_conns()
            )
        })
        .collect();
    let oneconnect = service
        .oneconnect
        .as_ref()
        .map_or_else(String::new, |oc| oc.stats_line(service));
    format!(
        "{} requests {} answered {} declined {} in_flight {} late {} unknown {} bad {} nodes [{}]{oneconnect}",
        service.name(),
        c.requests.load(Ordering::Relaxed),
        c.answered.load(Ordering::Relaxed),
        c.declined_total(),
        service.in_flight(),
        c.late_responses.load(Ordering::Relaxed),
        c.unknown_responses.load(Ordering::Relaxed),
        c.bad_messages.load(Ordering::Relaxed) + c.bad_frames.load(Ordering::Relaxed),
        nodes.join(" ")
    )
}

/// Runs until Ctrl-C.
pub async fn run_until_interrupted(
    config: &Config,
    source: Option<PathBuf>,
    stats_every: Duration,
) -> Result<(), StartError> {
    let switch = Switch::start(config).await?;
    switch.set_source(source);
    let mut tick = tokio::time::interval(stats_every);
    tick.tick().await;
    let mut hangups = hangups();
    let fatal = {
        let sup = Arc::clone(&switch.handle.supervisor);
        async move { sup.fatal().await }
    };
    tokio::pin!(fatal);
    let mut failed = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                for r in &switch.services {
                    tracing::info!("{}", stats_line(&r.service));
                }
            }
            _ = hangups.recv() => {
                match super::reload::reload(&switch.handle).await {
                    Ok(report) => tracing::info!(%report, "SIGHUP: config reloaded"),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: reload refused; the old config stays"),
                }
            }
            why = &mut fatal => { failed = Some(why); break }
            _ = tokio::signal::ctrl_c() => break,
            _ = terminated() => break,
        }
    }
    tracing::info!("shutting down: declining new requests, answering those in flight");
    switch.stop().await;
    match failed {
        Some(why) => Err(StartError::Fatal(why)),
        None => Ok(()),
    }
}

/// SIGHUP (what `systemctl reload` sends), on Unix; never elsewhere.
fn hangups() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                tokio::spawn(async move {
                    while hup.recv().await.is_some() {
                        if tx.send(()).await.is_err() {
                            return;
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler: reload only through the admin API")
            }
        }
    }
    #[cfg(not(unix))]
    drop(tx);
    rx
}

/// SIGTERM (what service managers send), on Unix; never elsewhere.
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            term.recv().await;
            return;
        }
    }
    std::future::pending::<()>().await
}
