//! The admin HTTP listener (`[admin]`): health probes, Prometheus metrics, the
//! status API and page, the connection table, runtime node control and
//! reload. Every endpoint but the configured open paths (`/healthz` and
//! `/metrics` by default) wants `Authorization: Bearer TOKEN`; a missing or
//! wrong token gets 401, bad input 400 with the reason, as JSON
//! `{"error": "..."}`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::config::{AdminConfig, NodeConfig};
use super::control::ControlError;
use super::reload::ReloadError;
use super::run::SwitchHandle;
use crate::config::FrontConfig;
use crate::link::Service;
use crate::route::{AdminState, DeclineReason};

/// The environment variable that holds the token when no `token_file` is set.
pub const TOKEN_ENV: &str = "ISOSWITCH_ADMIN_TOKEN";

#[derive(Clone)]
struct Admin {
    switch: SwitchHandle,
    token: Arc<str>,
    open_paths: Arc<[String]>,
}

/// Reads the token: `token_file`'s first line, else `ISOSWITCH_ADMIN_TOKEN`.
pub fn load_token(cfg: &AdminConfig) -> Result<String, String> {
    let token = match &cfg.token_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("admin.token_file: {}: {e}", path.display()))?
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string(),
        None => std::env::var(TOKEN_ENV)
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    if token.len() < 16 {
        return Err(format!(
            "admin.token_file: set a token of at least 16 characters there or in {TOKEN_ENV}"
        ));
    }
    Ok(token)
}

/// Binds the admin listener and serves it under the switch's supervisor.
pub async fn start(cfg: &AdminConfig, switch: SwitchHandle) -> Result<SocketAddr, String> {
    let token = load_token(cfg)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| format!("admin.listen: {}: {e}", cfg.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let admin = Admin {
        switch: switch.clone(),
        token: token.into(),
        open_paths: cfg.open_paths.clone().into(),
    };
    let app = router(admin);
    let sup = Arc::clone(&switch.supervisor);
    let first = Arc::new(std::sync::Mutex::new(Some(listener)));
    let stop = sup.shutdown();
    sup.spawn_critical("admin".into(), sup.token(), move || {
        let listener = first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (app, mut stop) = (app.clone(), stop.clone());
        async move {
            let listener = match listener {
                Some(l) => l,
                None => match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(%addr, error = %e, "admin: cannot listen again");
                        return;
                    }
                },
            };
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await
            {
                tracing::error!(error = %e, "admin listener failed");
            }
        }
    });
    tracing::info!(%addr, "admin listener up");
    Ok(addr)
}

fn router(admin: Admin) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(status))
        .route("/api/v1/connections", get(connections))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/services/{service}/nodes", post(add_node))
        .route(
            "/api/v1/services/{service}/nodes/{node}",
            axum::routing::delete(remove_node),
        )
        .route(
            "/api/v1/services/{service}/nodes/{node}/{action}",
            post(node_action),
        )
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            admin.clone(),
            authorize,
        ))
        .with_state(admin)
}

/// 401 unless the request carries the token (open paths excepted).
async fn authorize(State(admin): State<Admin>, req: Request, next: Next) -> Response {
    if admin.open_paths.iter().any(|p| p == req.uri().path()) {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(t) if same(t.as_bytes(), admin.token.as_bytes()) => next.run(req).await,
        Some(_) => unauthorized("wrong token"),
        None => unauthorized("missing bearer token (Authorization: Bearer TOKEN)"),
    }
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unauthorized(why: &str) -> Response {
    let mut r = error(StatusCode::UNAUTHORIZED, why);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    r
}

fn error(status: StatusCode, why: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct Body {
        error: String,
    }
    (status, axum::Json(Body { error: why.into() })).into_response()
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        let status = match self {
            ControlError::NoService(_) | ControlError::NoNode { .. } => StatusCode::NOT_FOUND,
            ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
            ControlError::Conflict(_) | ControlError::RestartNeeded(_) => StatusCode::CONFLICT,
        };
        error(status, self.to_string())
    }
}

async fn readyz(State(admin): State<Admin>) -> Response {
    let now = Instant::now();
    let mut why = Vec::new();
    for r in admin.switch.services.iter() {
        let s = &r.service;
        let healthy = (0..s.pool.nodes().len()).any(|i| s.pool.eligible(i, now));
        if !healthy {
            why.push(format!("service `{}`: no healthy node", s.name()));
        }
        if let Some(out) = &s.out_links {
            let (_, usable) = out.up();
            if usable < out.len() {
                why.push(format!(
                    "service `{}`: {usable} of {} links signed on",
                    s.name(),
                    out.len()
                ));
            }
        }
    }
    if why.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", why.join("; ")),
        )
            .into_response()
    }
}

/// OpenMetrics when the scraper asks for it (Prometheus does), the classic
/// text format otherwise (promtool, curl).
async fn metrics(State(admin): State<Admin>, headers: axum::http::HeaderMap) -> Response {
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    match super::metrics::render(&admin.switch) {
        Ok(text) if openmetrics => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            super::metrics::to_prometheus_text(&text),
        )
            .into_response(),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics"),
    }
}

/// `GET /api/v1/status`.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Status {
    pub services: Vec<ServiceStatus>,
    /// Critical tasks restarted so far.
    pub restarts: u64,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ServiceStatus {
    pub name: String,
    pub front: String,
    pub front_address: String,
    pub requests: u64,
    pub answered: u64,
    pub declined: std::collections::BTreeMap<String, u64>,
    pub in_flight: usize,
    pub late_responses: u64,
    pub unknown_responses: u64,
    pub bad_messages: u64,
    pub bad_frames: u64,
    pub clients: usize,
    pub nodes: Vec<NodeStatusView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub links: Option<LinksStatus>,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct NodeStatusView {
    pub id: String,
    pub index: usize,
    pub address: String,
    /// up, down, draining, disabled, ejected, removed.
    pub state: String,
    pub admin: String,
    pub weight: u32,
    pub effective_weight: u32,
    pub priority: u32,
    pub connections: usize,
    pub in_flight: usize,
    pub sent: u64,
    pub answered: u64,
    pub failed: u64,
    pub latency_ewma_ms: f64,
    pub ejected: bool,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct LinksStatus {
    pub links: usize,
    pub up: usize,
    pub signed_on: usize,
}

/// The status of every service, as the API and the page show it.
pub fn status_of(switch: &SwitchHandle) -> Status {
    let now = Instant::now();
    let services = switch
        .services
        .iter()
        .map(|r| service_status(&r.service, r.front_addr, now))
        .collect();
    Status {
        services,
        restarts: switch.supervisor.restarts(),
    }
}

fn service_status(s: &Service, front_addr: SocketAddr, now: Instant) -> ServiceStatus {
    let c = &s.counters;
    let nodes = s
        .pool
        .nodes()
        .iter()
        .enumerate()
        .filter_map(|(index, n)| {
            let st = s.pool.status(index, now)?;
            Some(NodeStatusView {
                id: n.config.id.clone(),
                index,
                address: n.config.address.to_string(),
                state: st.state().into(),
                admin: format!("{:?}", st.admin).to_lowercase(),
                weight: st.weight,
                effective_weight: st.effective_weight,
                priority: st.priority,
                connections: n.live_conns(),
                in_flight: n.outstanding(),
                sent: n.counters.sent.load(Ordering::Relaxed),
                answered: n.counters.answered.load(Ordering::Relaxed),
                failed: n.counters.declined.load(Ordering::Relaxed),
                latency_ewma_ms: st.latency.as_secs_f64() * 1e3,
                ejected: st.ejected,
            })
        })
        .collect();
    let links = s.out_links.as_ref().map(|out| {
        let (up, signed_on) = out.up();
        LinksStatus {
            links: out.len(),
            up,
            signed_on,
        }
    });
    ServiceStatus {
        name: s.name().into(),
        front: match &s.config.front {
            FrontConfig::Listen(_) => "listen",
            FrontConfig::Simplex(_) => "simplex",
            FrontConfig::Connect(_) => "connect",
        }
        .into(),
        front_address: front_addr.to_string(),
        requests: c.requests.load(Ordering::Relaxed),
        answered: c.answered.load(Ordering::Relaxed),
        declined: DeclineReason::ALL
            .iter()
            .map(|&r| (r.as_str().to_string(), c.declined(r)))
            .collect(),
        in_flight: s.in_flight(),
        late_responses: c.late_responses.load(Ordering::Relaxed),
        unknown_responses: c.unknown_responses.load(Ordering::Relaxed),
        bad_messages: c.bad_messages.load(Ordering::Relaxed),
        bad_frames: c.bad_frames.load(Ordering::Relaxed),
        clients: s.conns.count(crate::link::conns::ConnKind::Client),
        nodes,
        links,
    }
}

async fn status(State(admin): State<Admin>) -> Response {
    axum::Json(status_of(&admin.switch)).into_response()
}

/// One row of `GET /api/v1/connections`.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ConnectionView {
    pub id: u64,
    pub service: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub peer: String,
    pub local: String,
    pub age_ms: u64,
    pub messages_in: u64,
    #[serde(default)]
    pub messages_out: u64,
    #[serde(default)]
    pub bytes_in: u64,
    #[serde(default)]
    pub bytes_out: u64,
    /// A client's requests in flight (absent for node and peer links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<usize>,
    pub idle_ms: u64,
}

pub fn connections_of(switch: &SwitchHandle) -> Vec<ConnectionView> {
    let now = Instant::now();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    switch
        .services
        .iter()
        .flat_map(|r| {
            let name = r.service.name().to_string();
            r.service
                .conns
                .snapshot()
                .into_iter()
                .map(move |e| ConnectionView {
                    id: e.id,
                    service: name.clone(),
                    kind: serde_json::to_value(e.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    node: e.node.clone(),
                    peer: e.peer.to_string(),
                    local: e.local.to_string(),
                    age_ms: ms(now.saturating_duration_since(e.opened)),
                    messages_in: e.messages_in(),
                    messages_out: e.messages_out(),
                    bytes_in: e.bytes_in(),
                    bytes_out: e.bytes_out(),
                    in_flight: e.in_flight(),
                    idle_ms: ms(e.idle(now)),
                })
        })
        .collect()
}

async fn connections(State(admin): State<Admin>) -> Response {
    axum::Json(connections_of(&admin.switch)).into_response()
}

async fn node_action(
    State(admin): State<Admin>,
    Path((service, node, action)): Path<(String, String, String)>,
) -> Response {
    let state = match action.as_str() {
        "drain" => AdminState::Drain,
        "disable" => AdminState::Disabled,
        "enable" => AdminState::Enabled,
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("action `{other}`: expected drain, disable or enable"),
            );
        }
    };
    match admin.switch.set_node_admin(&service, &node, state) {
        Ok(()) => ok(format!("node `{node}` of `{service}`: {action}")),
        Err(e) => e.into_response(),
    }
}

fn ok(what: String) -> Response {
    #[derive(Serialize)]
    struct Done {
        ok: String,
    }
    axum::Json(Done { ok: what }).into_response()
}

async fn add_node(
    State(admin): State<Admin>,
    Path(service): Path<String>,
    body: Bytes,
) -> Response {
    let cfg: NodeConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "body: {e} (expected {{\"id\": \"04\", \"address\": \"HOST:PORT\", \"weight\": 1}})"
                ),
            );
        }
    };
    let id = cfg.id.clone();
    match admin.switch.add_node(&service, cfg) {
        Ok(index) => (
            StatusCode::CREATED,
            ok(format!("node `{id}` added to `{service}` at index {index}")),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn remove_node(
    State(admin): State<Admin>,
    Path((service, node)): Path<(String, String)>,
) -> Response {
    match admin
        .switch
        .remove_node(&service, &node, Duration::from_secs(1))
        .await
    {
        Ok(()) => ok(format!(
            "node `{node}` drained and removed from `{service}`"
        )),
        Err(e) => e.into_response(),
    }
}

async fn reload(State(admin): State<Admin>) -> Response {
    match super::reload::reload(&admin.switch).await {
        Ok(report) => axum::Json(report).into_response(),
        Err(e) => {
            let status = match e {
                ReloadError::Invalid(_) | ReloadError::NoSource => StatusCode::BAD_REQUEST,
                ReloadError::RestartNeeded(_) => StatusCode::CONFLICT,
                ReloadError::Apply(e) => return e.into_response(),
            };
            error(status, e.to_string())
        }
    }
}

async fn status_page(State(admin): State<Admin>) -> Html<String> {
    Html(super::page::render(&status_of(&admin.switch)))
}
