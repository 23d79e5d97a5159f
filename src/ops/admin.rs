//! The admin HTTP listener (`[admin]`): health probes, Prometheus metrics, the
//! status API and page, the connection table, runtime node control, reload,
//! and the store-and-forward queue (list, retry now, drop with a reason).
//!
//! **It cannot hurt card traffic.** It serves on a thread and runtime of its
//! own, at most `admin.max_connections` connections served at once (one peer
//! address at most `admin.max_connections_per_peer`; past them a few probe
//! slots answer `/healthz` and `/readyz`, and 503 the rest at once: see
//! [`super::admin_probe`]), and cuts slow clients: headers within
//! `header_timeout` (also the idle limit of a kept-alive connection), the
//! whole request and its answer within `request_timeout`, at most
//! `max_requests_per_connection` requests per connection, 2 MB of body
//! (see [`super::admin_serve`]). A change (drain, disable, enable, add,
//! remove, reload) runs on the switch's runtime, so what it starts (a node's
//! connections, a reload's removals) belongs to the switch and not to this
//! thread. Stopping the switch cuts every admin connection.
//!
//! **Access.** Every endpoint wants `Authorization: Bearer TOKEN` except GET
//! on the configured open paths (`/healthz`, `/readyz` and `/metrics` by
//! default; only those and `/` can be opened, see
//! [`AdminConfig::OPENABLE`]). Two tokens ([`super::admin_auth`]): `read`
//! for GET and HEAD, `operate` for everything; a read token on a change
//! gets 403. Every request that changes something (any method but GET and
//! HEAD) wants the operate token and `Content-Type: application/json`, body
//! or not, so a browser's cross-site "simple request" can never reach one.
//! A missing or wrong token gets 401 (logged at WARN with the peer's
//! address, rate-limited), a change without the JSON content type 415, bad
//! input 400 with the reason, as JSON `{"error": "..."}`. Every change is
//! logged at INFO with the peer's address, the role and the outcome.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::admin_audit::Refusal;
use super::admin_auth::{CredentialError, Credentials, Role};
use super::admin_journal;
use super::admin_serve::{self, Limits};
use super::control::ControlError;
use super::control::SwitchHandle;
use super::reload::ReloadError;
use super::saf::{self, SafQuery};
use super::status::{connections_of, status_of};
use crate::config::{AdminConfig, NodeConfig};
use crate::link::log_limit::{LogKind, LogLimit, LogPeer};
use crate::route::AdminState;
use crate::store::StoreError;

pub use super::admin_auth::{TOKEN_CREDENTIAL, TOKEN_ENV};
/// The largest request body read.
pub const BODY_LIMIT: usize = 2 << 20;
/// Refused-token lines per peer and second (and accept failures a
/// second); the rest are counted.
const REFUSALS_PER_SECOND: u32 = 5;

/// Why the admin listener cannot start, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Credentials(#[from] CredentialError),
    #[error("{0}")]
    Tls(#[from] crate::config::tls::TlsError),
    #[error("admin.listen: {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[derive(Clone)]
struct Admin {
    switch: SwitchHandle,
    credentials: Arc<Credentials>,
    open_paths: Arc<[String]>,
    /// Refused tokens, per peer (the accept loop shares it and flushes it).
    log_limit: Arc<LogLimit>,
}

/// Binds the admin listener and serves it on its own thread, under the
/// switch's supervisor (restarted if the thread dies; stopped with the
/// switch).
pub async fn start(cfg: &AdminConfig, switch: SwitchHandle) -> Result<SocketAddr, AdminError> {
    let credentials = Arc::new(Credentials::load(cfg)?);
    let _ = switch.admin_credentials.set(Arc::clone(&credentials));
    let bind_error = |source| AdminError::Bind {
        addr: cfg.listen,
        source,
    };
    let tls = match &cfg.tls {
        Some(t) => {
            let side = crate::tls::ServerSide::load(t, crate::config::tls::ADMIN_KEY)?;
            let tls = Arc::new(crate::tls::AdminTls {
                side,
                handshakes: crate::tls::Handshakes::default(),
            });
            let _ = switch.admin_tls.set(Arc::clone(&tls));
            Some(tls)
        }
        None => None,
    };
    let listener = admin_serve::bind(cfg.listen).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let limits = Limits::of(cfg);
    let log_limit = Arc::new(LogLimit::new(REFUSALS_PER_SECOND));
    let app = router(
        Admin {
            switch: switch.clone(),
            credentials,
            open_paths: cfg.open_paths.clone().into(),
            log_limit: Arc::clone(&log_limit),
        },
        limits.request_timeout,
    );
    let sup = Arc::clone(&switch.supervisor);
    let audit = Arc::clone(&switch.audit);
    let root = sup.token();
    sup.spawn_critical("admin".into(), sup.token(), move || {
        let thread = admin_serve::spawn_thread(
            &listener,
            app.clone(),
            limits,
            Arc::clone(&log_limit),
            Arc::clone(&audit),
            tls.clone(),
            root.child_token(),
        );
        async move {
            match thread {
                Ok(ended) => ended.await,
                Err(e) => tracing::error!(error = %e, "admin: cannot start its thread"),
            }
        }
    });
    tracing::info!(%addr, max_connections = limits.max_connections, "admin listener up");
    Ok(addr)
}

fn router(admin: Admin, request_timeout: Duration) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(status))
        .route("/api/v1/connections", get(connections))
        .route("/api/v1/reload", post(reload))
        .route("/api/v1/saf", get(saf_list))
        .route("/api/v1/journal", get(journal_query))
        .route("/api/v1/saf/{id}/{action}", post(saf_action))
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
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(
            request_timeout,
            within_request_timeout,
        ))
        .layer(axum::middleware::from_fn(never_kept))
        .with_state(admin)
}

/// Every admin answer (the status page, the API's JSON, a refusal) is kept
/// by no cache and shown in no frame: what it says about the switch's
/// traffic must not outlive the request in a browser or a proxy. The page
/// has inline style and no script, and says so in its policy.
async fn never_kept(req: Request, next: Next) -> Response {
    use axum::http::header::{HeaderName, HeaderValue};
    let mut answer = next.run(req).await;
    let h = answer.headers_mut();
    for (name, value) in super::admin_probe::ALWAYS {
        h.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    answer
}

/// Cuts a request that takes longer than `admin.request_timeout` (a body
/// sent byte by byte included). A change already handed to the switch
/// carries on there.
async fn within_request_timeout(
    State(limit): State<Duration>,
    req: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(answer) => answer,
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not done within admin.request_timeout (a change already begun carries on)",
        ),
    }
}

/// Whether a request only reads.
fn reads_only(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// GET on an open path goes through; anything else wants the token (401,
/// logged); a change wants `Content-Type: application/json` too (415); a
/// change is logged with its outcome.
async fn authorize(State(admin): State<Admin>, req: Request, next: Next) -> Response {
    let reads = reads_only(req.method());
    if reads && admin.open_paths.iter().any(|p| p == req.uri().path()) {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let shown = peer.map_or_else(|| "-".to_string(), |p| p.to_string());
    let now = Instant::now();
    let audit = &admin.switch.audit;
    if let Some(left) = audit.locked(peer.map(|p| p.ip()), now) {
        return locked_out(left);
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let role = presented.and_then(|t| admin.credentials.role_of(t, now));
    let refused = match (presented, role) {
        (_, Some(_)) => None,
        (Some(_), None) => Some("wrong token"),
        (None, None) => Some("missing bearer token (Authorization: Bearer TOKEN)"),
    };
    if let Some(why) = refused {
        let who = peer.map_or(LogPeer::Service, |p| LogPeer::Ip(p.ip()));
        if admin
            .log_limit
            .allow(LogKind::AdminToken, who, Instant::now())
        {
            tracing::warn!(peer = %shown, method = %req.method(), path = ?req.uri().path(), why, "admin: token refused");
        }
        // Counted per peer and written once a second with the count (PCI
        // DSS wants every refused access traceable; a flood must not fill
        // the disk): see `admin_audit`.
        let (method, path) = (req.method().as_str(), req.uri().path());
        if audit.refused(peer.map(|p| p.ip()), method, path, why, now) == Refusal::LockedOut {
            tracing::warn!(peer = %shown, "admin: peer locked out after too many refused tokens (admin.max_refused_tokens, admin.lockout)");
        }
        return unauthorized(why);
    }
    let role = role.unwrap_or(Role::Read);
    if reads {
        let (method, path) = (req.method().clone(), req.uri().path().to_string());
        let answer = next.run(req).await;
        if admin_journal::reads_card_data(&path) {
            let what = format!("role={}", role.as_str());
            let action = format!("read {path}");
            let status = answer.status();
            audit.record(admin_journal::row(
                &shown, action, &method, &path, status, &what,
            ));
        }
        return answer;
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let answer = if role < Role::Operate {
        error(
            StatusCode::FORBIDDEN,
            "the read token cannot change anything: a change wants the operate token",
        )
    } else if json_content_type(&req) {
        next.run(req).await
    } else {
        error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a change wants Content-Type: application/json (with or without a body)",
        )
    };
    let outcome = answer
        .extensions()
        .get::<Outcome>()
        .map_or("", |o| o.0.as_str());
    let role = role.as_str();
    tracing::info!(peer = %shown, role, %method, path = ?path, status = answer.status().as_u16(), outcome, "admin change");
    let action = admin_journal::action_of(&method, &path);
    let what = format!("role={role}; {outcome}");
    audit.record(admin_journal::row(
        &shown,
        action,
        &method,
        &path,
        answer.status(),
        &what,
    ));
    answer
}

/// 429 to a locked-out peer, with when to come back.
fn locked_out(left: Duration) -> Response {
    let mut r = error(
        StatusCode::TOO_MANY_REQUESTS,
        "too many refused tokens from this address: locked out (admin.lockout)",
    );
    let secs = left.as_secs().max(1).to_string();
    if let Ok(v) = header::HeaderValue::from_str(&secs) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// `Content-Type: application/json`, parameters (charset) allowed. A browser
/// cannot send it cross-site without a preflight the listener never grants.
fn json_content_type(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

fn unauthorized(why: &str) -> Response {
    let mut r = error(StatusCode::UNAUTHORIZED, why);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    r
}

/// What a change did or why it was refused, for the INFO line.
#[derive(Clone)]
struct Outcome(String);

fn with_outcome(mut r: Response, what: String) -> Response {
    r.extensions_mut().insert(Outcome(what));
    r
}

fn error(status: StatusCode, why: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct Body {
        error: String,
    }
    let why = why.into();
    let r = (status, axum::Json(Body { error: why.clone() })).into_response();
    with_outcome(r, why)
}

/// Runs a change on the switch's runtime: what it starts (a node's
/// connections, a reload's removals) must live with the switch, not with
/// the admin thread.
async fn on_switch<F, Fut>(admin: &Admin, change: F) -> Response
where
    F: FnOnce(SwitchHandle) -> Fut,
    Fut: std::future::Future<Output = Response> + Send + 'static,
{
    match admin
        .switch
        .supervisor
        .spawn(change(admin.switch.clone()))
        .await
    {
        Ok(answer) => answer,
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the change failed: {e}"),
        ),
    }
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        let status = match self {
            ControlError::NoService(_) | ControlError::NoNode { .. } => StatusCode::NOT_FOUND,
            ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
            ControlError::NotAllowed(_) => StatusCode::FORBIDDEN,
            ControlError::Conflict(_) | ControlError::RestartNeeded(_) => StatusCode::CONFLICT,
            ControlError::NotSaved { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        error(status, self.to_string())
    }
}

async fn readyz(State(admin): State<Admin>) -> Response {
    let now = Instant::now();
    let mut why = Vec::new();
    for r in admin.switch.services.iter() {
        let s = &r.service;
        let healthy = (0..s.view().pool.nodes().len()).any(|i| s.view().pool.eligible(i, now));
        if !healthy {
            why.push(format!("service `{}`: no healthy node", s.name()));
        }
        if let Some(out) = &s.view().side.out_links() {
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

async fn status(State(admin): State<Admin>) -> Response {
    axum::Json(status_of(&admin.switch)).into_response()
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
        "force-offline" => AdminState::ForcedOffline,
        "enable" => AdminState::Enabled,
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("action `{other}`: expected drain, disable, force-offline or enable"),
            );
        }
    };
    on_switch(&admin, move |switch| async move {
        match switch.set_node_admin(&service, &node, state).await {
            Ok(()) => ok(format!("node `{node}` of `{service}`: {action}")),
            Err(e) => e.into_response(),
        }
    })
    .await
}

fn ok(what: String) -> Response {
    #[derive(Serialize)]
    struct Done {
        ok: String,
    }
    with_outcome(axum::Json(Done { ok: what.clone() }).into_response(), what)
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
    on_switch(&admin, move |switch| async move {
        let (id, address) = (cfg.id.clone(), cfg.address);
        match switch.add_node(&service, cfg).await {
            Ok(index) => {
                let what =
                    format!("node `{id}` at {address} added to `{service}` at index {index}");
                (StatusCode::CREATED, ok(what)).into_response()
            }
            Err(e) => e.into_response(),
        }
    })
    .await
}

async fn remove_node(
    State(admin): State<Admin>,
    Path((service, node)): Path<(String, String)>,
) -> Response {
    on_switch(&admin, move |switch| async move {
        match switch
            .remove_node(&service, &node, Duration::from_secs(1))
            .await
        {
            Ok(()) => ok(format!(
                "node `{node}` drained and removed from `{service}`"
            )),
            Err(e) => e.into_response(),
        }
    })
    .await
}

async fn reload(State(admin): State<Admin>) -> Response {
    on_switch(&admin, |switch| async move {
        match super::reload::reload(&switch).await {
            Ok(report) => {
                let what = format!("reloaded: {report}");
                with_outcome(axum::Json(report).into_response(), what)
            }
            Err(e) => {
                let status = match e {
                    ReloadError::Invalid(_) | ReloadError::NoSource => StatusCode::BAD_REQUEST,
                    ReloadError::RestartNeeded(_) | ReloadError::Conflict(_) => {
                        StatusCode::CONFLICT
                    }
                    ReloadError::Apply(e) => return e.into_response(),
                };
                error(status, e.to_string())
            }
        }
    })
    .await
}

/// The status page. With `/` among the open paths it is served without a
/// token, but the journal's rows (masked PAN, terminal, amount) only to a
/// request that presents one (read or operate).
async fn status_page(State(admin): State<Admin>, headers: axum::http::HeaderMap) -> Html<String> {
    let status = status_of(&admin.switch);
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if token
        .and_then(|t| admin.credentials.role_of(t, Instant::now()))
        .is_none()
    {
        return Html(super::page::render(&status, None));
    }
    let latest = admin_journal::latest(admin.switch.journal.as_ref()).await;
    Html(super::page::render(&status, Some(&latest)))
}

/// Store errors as HTTP: an unknown entry 404, the wrong state 409, a store
/// that cannot take the request now 503.
fn store_error(e: StoreError) -> Response {
    let status = match e {
        StoreError::NotFound { .. } => StatusCode::NOT_FOUND,
        StoreError::WrongState { .. } => StatusCode::CONFLICT,
        StoreError::QueueFull { .. } | StoreError::Closed | StoreError::Unavailable { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

fn no_store() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no store: store-and-forward needs a data directory (--data-dir, data_dir) or [store] url",
    )
}

/// `GET /api/v1/saf?state=pending|dead|delivered|dropped|all&service=S&limit=N`:
/// entries newest first, never a payload. Token-only: it shows identifying
/// fields of card transactions (the PAN masked), so it is not an open path.
async fn saf_list(State(admin): State<Admin>, uri: axum::http::Uri) -> Response {
    let Some(view) = admin.switch.saf.clone() else {
        return no_store();
    };
    let query = match SafQuery::parse(uri.query()) {
        Ok(q) => q,
        Err(why) => return error(StatusCode::BAD_REQUEST, why.to_string()),
    };
    match view.list(&query).await {
        Ok(rows) => axum::Json(rows).into_response(),
        Err(e) => store_error(e),
    }
}

/// `GET /api/v1/journal?...`: see `admin_journal::query`.
async fn journal_query(State(admin): State<Admin>, uri: axum::http::Uri) -> Response {
    admin_journal::query(admin.switch.journal.as_ref(), uri.query()).await
}

/// `POST /api/v1/saf/{id}/retry` (due now) and `POST /api/v1/saf/{id}/drop`
/// with `{"reason": "..."}` (required; stored with the entry and logged
/// with the caller's address).
async fn saf_action(
    State(admin): State<Admin>,
    Path((id, action)): Path<(String, String)>,
    req: Request,
) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "-".to_string(), |c| c.0.to_string());
    let Some(view) = admin.switch.saf.clone() else {
        return no_store();
    };
    let id = match saf::parse_id(&id) {
        Ok(id) => id,
        Err(why) => return error(StatusCode::BAD_REQUEST, why.to_string()),
    };
    match action.as_str() {
        "retry" => match view.retry_now(id).await {
            Ok(()) => {
                tracing::info!(peer, %id, "saf entry made due now by an operator");
                ok(format!("saf entry {id} is due now"))
            }
            Err(e) => store_error(e),
        },
        "drop" => {
            let body = match axum::body::to_bytes(req.into_body(), BODY_LIMIT).await {
                Ok(b) => b,
                Err(e) => return error(StatusCode::BAD_REQUEST, format!("body: {e}")),
            };
            let reason = match drop_reason(&body) {
                Ok(r) => r,
                Err(why) => return error(StatusCode::BAD_REQUEST, why.to_string()),
            };
            match view.drop_entry(id, &reason).await {
                Ok(()) => {
                    tracing::warn!(peer, %id, reason, "saf entry dropped by an operator: it will not be delivered");
                    ok(format!("saf entry {id} dropped: {reason}"))
                }
                Err(e) => store_error(e),
            }
        }
        other => error(
            StatusCode::BAD_REQUEST,
            format!("action `{}`: expected retry or drop", other.escape_debug()),
        ),
    }
}

/// The `{"reason": "..."}` of a drop, cleaned ([`saf::clean_reason`]).
fn drop_reason(body: &[u8]) -> Result<String, saf::SafInputError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct DropBody {
        reason: String,
    }
    let parsed: DropBody =
        serde_json::from_slice(body).map_err(|e| saf::SafInputError::Body(e.to_string()))?;
    saf::clean_reason(&parsed.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drop_wants_a_reason_and_nothing_else() {
        assert_eq!(
            drop_reason(br#"{"reason": "host booked it\r\nforged"}"#).as_deref(),
            Ok("host booked it  forged")
        );
        for bad in [
            &br#"{}"#[..],
            br#"{"reason": "  "}"#,
            br#"{"reason": "x", "force": true}"#,
            b"",
            b"reason=x",
        ] {
            assert!(
                drop_reason(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn store_errors_map_to_statuses() {
        let id = crate::store::SafId(1);
        let status = |e| store_error(e).status();
        assert_eq!(status(StoreError::NotFound { id }), StatusCode::NOT_FOUND);
        assert_eq!(
            status(StoreError::WrongState {
                id,
                state: crate::store::SafState::Delivered,
                action: "drop",
                needs: "pending or dead",
            }),
            StatusCode::CONFLICT
        );
        assert_eq!(status(StoreError::Closed), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(no_store().status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
