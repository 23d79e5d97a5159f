//! `isoswitch run`: start every configured service and keep them up until
//! Ctrl-C, printing one stats line per service at an interval.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::config::Config;
use crate::link::{self, Running, Service};

/// Services started from one config.
pub struct Switch {
    pub services: Vec<Running>,
    tasks: JoinSet<()>,
    shutdown: watch::Sender<bool>,
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
}

impl Switch {
    /// Starts every service of `config`.
    pub async fn start(config: &Config) -> Result<Switch, StartError> {
        let (shutdown, rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
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
                tasks.spawn(capture.run(Arc::clone(&service), rx.clone()));
            }
            let running = link::start(service, &mut tasks, &rx)
                .await
                .map_err(|source| StartError::Bind {
                    service: svc.name.clone(),
                    source,
                })?;
            tracing::info!(service = %svc.name, front = %running.front_addr, "service started");
            services.push(running);
        }
        Ok(Switch {
            services,
            tasks,
            shutdown,
        })
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
            .map(|r| r.service.config.timeouts.request)
            .max()
            .unwrap_or_default();
        self.stop_within(grace).await;
    }

    /// [`Switch::stop`] with an explicit grace period.
    pub async fn stop_within(mut self, grace: Duration) {
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
        let _ = self.shutdown.send(true);
        let deadline = tokio::time::sleep(Duration::from_secs(2));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = self.tasks.join_next() => if next.is_none() { break },
                _ = &mut deadline => { self.tasks.abort_all(); break }
            }
        }
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
    format!(
        "{} requests {} answered {} declined {} in_flight {} late {} unknown {} bad {} nodes [{}]",
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
    stats_every: Duration,
) -> Result<(), StartError> {
    let switch = Switch::start(config).await?;
    let mut tick = tokio::time::interval(stats_every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                for r in &switch.services {
                    tracing::info!("{}", stats_line(&r.service));
                }
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = terminated() => break,
        }
    }
    tracing::info!("shutting down: declining new requests, answering those in flight");
    switch.stop().await;
    Ok(())
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
