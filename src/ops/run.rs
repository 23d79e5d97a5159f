//! `isoswitch run`: start every configured service and keep them up until
//! Ctrl-C, printing one stats line per service at an interval.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::control::SwitchHandle;
use super::data_dir::{DataDir, DataDirError};
use super::reload::{self, ReloadReport, Stage};
use super::runtime_state::{RuntimeStore, StateFile, StateFileError};
use crate::config::Config;
use crate::config::descriptors::{DescriptorNeed, open_file_limit, raise_open_file_limit};
use crate::link::front::admission::budget::ClientBudget;
use crate::link::service::SafOutbox;
use crate::link::supervisor::Supervisor;
use crate::link::{self, Running, Service};

/// Services started from one config.
pub struct Switch {
    pub services: Vec<Running>,
    handle: SwitchHandle,
    admin_addr: Option<SocketAddr>,
    /// Held (locked) for the switch's life.
    data_dir: Option<DataDir>,
    /// What the switch owes, kept durably; closed when it stops.
    store: Option<crate::store::Store>,
}

/// Why one service could not be started: its spec, its parts, its TLS
/// material, each error as its layer gave it.
#[derive(Debug, thiserror::Error)]
pub enum ServiceStartError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Build(#[from] crate::link::service::ServiceError),
    #[error(transparent)]
    Tls(#[from] crate::config::tls::TlsError),
}

/// Errors starting a switch, naming the service.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("service `{service}`: {source}")]
    Service {
        service: String,
        // Boxed: the errors of three layers, made once (clippy's
        // result_large_err).
        #[source]
        source: Box<ServiceStartError>,
    },
    #[error("service `{service}`: cannot listen: {source}")]
    Bind {
        service: String,
        source: std::io::Error,
    },
    #[error("admin: {0}")]
    Admin(#[from] super::admin::AdminError),
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error("runtime state: {0}")]
    RuntimeState(#[from] StateFileError),
    /// A recorded runtime change the service cannot take.
    #[error("runtime state: {path}: {reason}; remove it to start from the config file alone")]
    RuntimeChange { path: String, reason: String },
    /// The store of what the switch owes could not be opened.
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    /// A critical task ended and could not be restarted in place.
    #[error("stopped: {0}")]
    Fatal(String),
}

impl Switch {
    /// Starts every service of `config`, and the admin listener if configured.
    /// The runtime state is kept in `config.data_dir`, or, without one, for
    /// this run only. On error, whatever was started is stopped again.
    pub async fn start(config: &Config) -> Result<Switch, StartError> {
        Self::start_in(config, config.data_dir.as_deref()).await
    }

    /// [`Switch::start`] with the data directory given (`isoswitch run`
    /// resolves it from the flag, the config and the environment). The
    /// operators' runtime changes recorded there apply before any node
    /// connects, by the rule reload follows.
    pub async fn start_in(config: &Config, data_dir: Option<&Path>) -> Result<Switch, StartError> {
        let data_dir = data_dir.map(DataDir::open).transpose()?;
        let store = match &data_dir {
            Some(dir) => {
                let file = StateFile::in_dir(dir.path());
                RuntimeStore {
                    state: file.load()?,
                    file: Some(file),
                }
            }
            None => RuntimeStore::default(),
        };
        let owed = open_store(config, data_dir.as_ref().map(DataDir::path)).await?;
        let name = match &data_dir {
            Some(dir) => dir.instance_name(instance_name)?,
            None => instance_name(),
        };
        let owed_named = owed.clone().map(|s| (s, name));
        let supervisor = Supervisor::new();
        match Self::start_under(config, &supervisor, store, owed_named).await {
            Ok(mut switch) => {
                switch.data_dir = data_dir;
                switch.store = owed;
                Ok(switch)
            }
            Err(e) => {
                supervisor.stop(Duration::from_secs(2)).await;
                Err(e)
            }
        }
    }

    async fn start_under(
        config: &Config,
        supervisor: &Arc<Supervisor>,
        mut store: RuntimeStore,
        owed: Option<(crate::store::Store, String)>,
    ) -> Result<Switch, StartError> {
        let outbox = owed.map(|(store, name)| (store, name, Arc::new(tokio::sync::Notify::new())));
        let supervisor = Arc::clone(supervisor);
        let journal = outbox
            .as_ref()
            .filter(|_| config.journal.enabled)
            .map(|(store, _, _)| start_journal(&config.journal, store, &supervisor));
        let budget = client_budget(config);
        let mut services = Vec::new();
        let mut runtime = ReloadReport::default();
        for (index, svc) in config.services.iter().enumerate() {
            let refused = |e: ServiceStartError| StartError::Service {
                service: svc.name.clone(),
                source: Box::new(e),
            };
            let spec = svc.load_spec().map_err(|e| refused(e.into()))?;
            let mut service =
                Service::new(svc.clone(), spec, Instant::now()).map_err(|e| refused(e.into()))?;
            service.links_mut().set_budget(Arc::clone(&budget));
            service.links_mut().tls =
                crate::tls::ServiceTls::load(svc, index).map_err(|e| refused(e.into()))?;
            if let Some(journal) = &journal {
                service.set_journal(journal.clone());
            }
            if let Some((store, owner, wake)) = &outbox {
                service.view().made.set_saf(SafOutbox {
                    store: store.clone(),
                    owner: owner.clone(),
                    policy: config.store.saf.clone(),
                    wake: Arc::clone(wake),
                });
            } else if svc.integrity.late_approval == crate::config::LateApproval::Reverse {
                tracing::warn!(service = %svc.name, "no store (no data_dir, no [store]): late approvals will be logged and counted, not reversed");
            }
            let capture = crate::capture::writer::open(svc, Arc::clone(service.spec()));
            if let Some((capture, writer)) = capture {
                service.links_mut().capture = Some(capture);
                // One writer per service, owned by the supervisor: it cannot
                // restart (it owns the files), so an early end is fatal.
                let mut set = tokio::task::JoinSet::new();
                set.spawn(writer.run(supervisor.shutdown()));
                supervisor.watch_set(format!("{}/capture", svc.name), set);
            }
            let service = Arc::new(service);
            apply_runtime_state(&service, svc, &mut store, &mut runtime)?;
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
        let gone = forget_services_not_in(config, &mut store);
        if (gone || !runtime.overridden.is_empty())
            && let Err(e) = store.save().await
        {
            tracing::error!(error = %e, "runtime state not saved");
        }
        let saf_view = outbox.as_ref().map(|(store, _, wake)| {
            Arc::new(super::saf::SafView::new(store.clone(), Arc::clone(wake)))
        });
        if let Some(view) = &saf_view {
            // The metrics and the status page read the stats this task
            // caches: a scrape never waits for the store.
            let (view, stop) = (Arc::clone(view), supervisor.shutdown());
            supervisor.spawn_critical("saf-stats".into(), supervisor.token(), move || {
                super::saf::sample_forever(Arc::clone(&view), stop.clone())
            });
        }
        if let Some((store, _, _)) = &outbox {
            // Delivered and dropped entries leave after `store.saf.keep`: the
            // history does not grow without end.
            let (store, policy, stop) = (
                store.clone(),
                config.store.saf.clone(),
                supervisor.shutdown(),
            );
            supervisor.spawn_critical("saf-prune".into(), supervisor.token(), move || {
                super::saf::prune_forever(store.clone(), policy.clone(), stop.clone())
            });
        }
        if outbox.is_some() {
            // One delivery loop for every service of this instance: the
            // store's leases do not know services.
            let owing: Vec<Arc<Service>> =
                services.iter().map(|r| Arc::clone(&r.service)).collect();
            let stop = supervisor.shutdown();
            supervisor.spawn_critical("saf".into(), supervisor.token(), move || {
                link::saf::run(owing.clone(), stop.clone())
            });
        }
        // Always on, whether the journal is or not (PCI DSS 10.2).
        let audit = super::admin_audit::Audit::start(
            &config.admin.clone().unwrap_or_default(),
            outbox.as_ref().map(|(store, _, _)| store.clone()),
            &supervisor,
        );
        let handle = SwitchHandle {
            audit,
            services: services.clone().into(),
            supervisor,
            config: Arc::new(Mutex::new(config.clone())),
            source: Arc::default(),
            control: Arc::new(tokio::sync::Mutex::new(store)),
            removing: Arc::default(),
            saf: saf_view,
            admin_tls: Arc::default(),
            admin_credentials: Arc::default(),
            journal,
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
            data_dir: None,
            store: None,
        })
    }

    /// The data directory this switch holds, if it has one.
    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_ref().map(DataDir::path)
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
            .map(|r| r.service.live().longest_timeout())
            .max()
            .unwrap_or_default();
        self.stop_within(grace).await;
    }

    /// [`Switch::stop`] with an explicit grace period.
    pub async fn stop_within(self, grace: Duration) {
        for r in &self.services {
            r.service.view().links.begin_drain();
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
        if let Some(store) = self.store.clone()
            && let Err(e) = store.close().await
        {
            tracing::warn!(error = %e, "store not closed cleanly (what it acknowledged is durable)");
        }
    }
}

impl Drop for Switch {
    /// A switch dropped without [`Switch::stop`] still ends its tasks (links
    /// close; nothing waits for answers in flight).
    fn drop(&mut self) {
        self.handle.supervisor.cancel();
    }
}

/// The clients' share of the open-file limit the process runs under now:
/// what is left once node links, peer links, admin, captures and files are
/// reserved (`config::descriptors`). Shared by every listen front.
fn client_budget(config: &Config) -> Arc<ClientBudget> {
    let need = DescriptorNeed::of(config);
    match open_file_limit() {
        Ok((soft, _)) => {
            let clients = need.client_budget(soft);
            tracing::info!(
                open_file_limit = soft,
                reserved = need.reserved(),
                clients,
                "descriptor budget"
            );
            ClientBudget::new(usize::try_from(clients).unwrap_or(usize::MAX))
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit: clients limited by max_connections only");
            ClientBudget::unlimited()
        }
    }
}

/// What `isoswitch run` does about descriptors before it starts: raises the
/// soft open-file limit to the hard one, and warns as `check` does when the
/// config's limits exceed it.
pub fn prepare_open_file_limit(config: &Config) {
    match raise_open_file_limit() {
        Ok(limit) => {
            if let Some(warning) = DescriptorNeed::of(config).warning(limit) {
                tracing::warn!("{warning}");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
}

/// Lays the recorded runtime changes over a service about to start (no node
/// connected yet): the ones its file entry still matches are kept, the others
/// dropped, both logged.
fn apply_runtime_state(
    service: &Arc<Service>,
    svc: &crate::config::ServiceConfig,
    store: &mut RuntimeStore,
    report: &mut ReloadReport,
) -> Result<(), StartError> {
    let refused = |e: reload::ReloadError| StartError::RuntimeChange {
        path: store
            .file
            .as_ref()
            .map_or_else(String::new, |f| f.path().display().to_string()),
        reason: e.to_string(),
    };
    let live = reload::live_nodes(service, &[]);
    let records = reload::within_allowed(svc, store.state.of(&svc.name));
    let plan = reload::plan_nodes(&svc.name, &svc.back.nodes, &records, &live).map_err(refused)?;
    let free = link::back::pool::SPARE_NODE_SLOTS;
    reload::check_plan(&svc.name, svc.f37_stamp.is_some(), free, &plan).map_err(refused)?;
    for step in plan.steps {
        reload::apply_step(Stage::Starting, service, step, report);
    }
    for c in &plan.kept {
        tracing::warn!(change = %c, "runtime change kept (made through the admin API; its node's entry in the config file is unchanged)");
    }
    for c in &plan.overridden {
        tracing::warn!(change = %c, "runtime change dropped: the config file changed its node's entry");
        store.state.forget(&c.service, &c.node);
    }
    report.kept.extend(plan.kept);
    report.overridden.extend(plan.overridden);
    Ok(())
}

/// Drops the runtime changes of services the config no longer has (a
/// service renamed or removed, then a restart). True if there were any.
fn forget_services_not_in(config: &Config, store: &mut RuntimeStore) -> bool {
    let before = store.state.services.len();
    store.state.services.retain(|service, records| {
        let known = config.services.iter().any(|s| s.name == *service);
        if !known {
            tracing::warn!(
                service,
                nodes = records.len(),
                "runtime changes dropped: the config file has no such service"
            );
        }
        known
    });
    store.state.services.len() != before
}

/// Starts the journal's writer and retention tasks under the supervisor;
/// the handle goes to every service and to the admin API.
fn start_journal(
    cfg: &crate::config::journal::JournalConfig,
    store: &crate::store::Store,
    supervisor: &Arc<Supervisor>,
) -> crate::journal::Journal {
    use crate::journal::writer::{WriterTask, retain_forever};
    let (mut journal, rx) = crate::journal::Journal::channel(cfg.queue);
    journal.store = Some(store.clone());
    let task = WriterTask {
        rx: Arc::new(tokio::sync::Mutex::new(rx)),
        store: store.clone(),
        counters: Arc::clone(&journal.counters),
        batch_interval: cfg.batch_interval,
        stop: supervisor.token(),
    };
    supervisor.spawn_critical("journal".into(), supervisor.token(), move || {
        task.clone().run()
    });
    let guarded = store.clone();
    let (store, retain, counters, stop) = (
        store.clone(),
        cfg.retain,
        Arc::clone(&journal.counters),
        supervisor.token(),
    );
    supervisor.spawn_critical("journal-retention".into(), supervisor.token(), move || {
        retain_forever(store.clone(), retain, Arc::clone(&counters), stop.clone())
    });
    // The disk guard: on SQLite, `max_size` and the filesystem's
    // `min_free`; on a PostgreSQL server, whose disk is its own,
    // `max_size` alone (docs/journal.md, "The disk").
    let path = match guarded.location() {
        crate::store::Location::Sqlite(path) => Some(path.clone()),
        crate::store::Location::Postgres(_) => None,
    };
    let guard = crate::journal::guard::Guard {
        store: guarded.clone(),
        path,
        probe: Arc::new(crate::store::disk::Statvfs),
        cfg: cfg.clone(),
        counters: Arc::clone(&journal.counters),
        every: crate::journal::guard::GUARD_EVERY,
        stop: supervisor.token(),
    };
    supervisor.spawn_critical("journal-disk-guard".into(), supervisor.token(), move || {
        guard.clone().run()
    });
    journal
}

/// Opens the store of what the switch owes: where `[store]` says, else
/// SQLite in the data dir; none without either (a switch started in process
/// for a test).
async fn open_store(
    config: &Config,
    data_dir: Option<&Path>,
) -> Result<Option<crate::store::Store>, StartError> {
    let dir = match (data_dir, &config.store.url) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, Some(_)) => PathBuf::from("."),
        (None, None) => return Ok(None),
    };
    let store = crate::store::Store::open(&config.store, &dir).await?;
    tracing::info!(store = ?store.location(), "store open");
    Ok(Some(store))
}

/// A new instance name for the store's leases: host, process and start
/// time. Kept in the data directory once made ([`DataDir::instance_name`]),
/// so that a restart is the same owner and takes its leases back at once;
/// without a data directory, each process is a new owner and its
/// predecessor's leases run out (`saf.lease`).
fn instance_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let host = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "isoswitch".to_string()
    };
    format!(
        "{host}/{}/{}",
        std::process::id(),
        crate::store::saf::now_millis()
    )
}

/// One line of counters for a service.
pub fn stats_line(service: &Service) -> String {
    let c = &service.view().counters;
    let nodes: Vec<String> = service
        .view()
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
        .view()
        .side
        .oneconnect()
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
    data_dir: &Path,
    stats_every: Duration,
) -> Result<(), StartError> {
    // Listening for the stop signals before starting, and for the whole
    // run: one that comes while the switch starts (opening and migrating a
    // large store, say) stops it once started, instead of being lost (SIGINT
    // comes in ignored to a process a script started with `&`) or killing
    // it midway; and none falls between two turns of the loop below.
    let mut stop = StopSignals::listen();
    prepare_open_file_limit(config);
    let switch = Switch::start_in(config, Some(data_dir)).await?;
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
            _ = stop.recv() => break,
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

/// Ctrl-C (SIGINT) and SIGTERM (what service managers send), registered
/// with the OS when made and kept for as long as this lives: a signal that
/// comes before [`StopSignals::recv`] is first awaited is kept, not lost.
struct StopSignals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn listen() -> StopSignals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind: SignalKind, name: &str| {
                signal(kind)
                    .map_err(|e| tracing::warn!(error = %e, "no {name} handler"))
                    .ok()
            };
            StopSignals {
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        StopSignals {}
    }

    /// The next stop signal; never, where none could be listened for.
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                if let Some(s) = s
                    && s.recv().await.is_some()
                {
                    return;
                }
                std::future::pending().await
            }
            tokio::select! {
                _ = next(&mut self.interrupt) => {}
                _ = next(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
