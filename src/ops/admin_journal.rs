//! The admin API and the journal: every change, every read of card
//! transactions and every refused token is an admin row (time, peer,
//! action, status, outcome) of the admin audit (`super::admin_audit`), and
//! `GET /api/v1/journal` queries the exchanges (docs/journal.md).

use std::time::SystemTime;

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::journal::{AdminRow, Journal, now_millis};

/// The requests that read card transactions (masked) and so are audited
/// even though they change nothing: the journal, the SAF listing.
pub fn reads_card_data(path: &str) -> bool {
    matches!(path, "/api/v1/journal" | "/api/v1/saf")
}

/// The action a request names: `drain`, `disable`, `enable`, `add`,
/// `remove`, `reload`, `saf-retry`, `saf-drop`, or `METHOD path` for any
/// other.
pub fn action_of(method: &Method, path: &str) -> String {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("POST", ["api", "v1", "services", _, "nodes"]) => "add".into(),
        ("DELETE", ["api", "v1", "services", _, "nodes", _]) => "remove".into(),
        ("POST", ["api", "v1", "services", _, "nodes", _, action]) => (*action).into(),
        ("POST", ["api", "v1", "reload"]) => "reload".into(),
        ("POST", ["api", "v1", "saf", _, action]) => format!("saf-{action}"),
        (m, _) => format!("{m} {path}"),
    }
}

/// An admin request's audit row.
pub fn row(
    peer: &str,
    action: String,
    method: &Method,
    path: &str,
    status: StatusCode,
    outcome: &str,
) -> AdminRow {
    AdminRow {
        id: 0,
        at: now_millis(),
        peer: peer.to_string(),
        action,
        method: method.to_string(),
        path: crate::store::saf::clip(path),
        status: i64::from(status.as_u16()),
        outcome: crate::store::saf::clip(outcome),
    }
}

/// `GET /api/v1/journal?...`: the exchanges the filter selects
/// (`journal::params::filter_of_query`), oldest first unless
/// `order=newest`, as JSON. Token-only, like `/api/v1/saf`.
pub async fn query(journal: Option<&Journal>, query: Option<&str>) -> Response {
    let Some(store) = journal.and_then(|j| j.store.clone()) else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({
                "error": "no journal: it needs a store (data_dir or [store]) and journal.enabled"
            })),
        )
            .into_response();
    };
    let filter = match crate::journal::params::filter_of_query(query, SystemTime::now()) {
        Ok(f) => f,
        Err(why) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(serde_json::json!({ "error": why.to_string() })),
            )
                .into_response();
        }
    };
    match store.journal_query(filter).await {
        Ok(rows) => axum::Json(rows).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}

/// How many exchanges the status page shows.
pub const PAGE_ROWS: usize = 50;

/// The latest exchanges for the status page; none without a journal or
/// when the store does not answer within a second (the page never waits
/// long on the store).
pub async fn latest(journal: Option<&Journal>) -> Vec<crate::store::journal::JournalRow> {
    let Some(store) = journal.and_then(|j| j.store.clone()) else {
        return Vec::new();
    };
    let filter = crate::store::journal::JournalFilter {
        limit: PAGE_ROWS,
        newest_first: true,
        ..Default::default()
    };
    match tokio::time::timeout(
        std::time::Duration::from_secs(1),
        store.journal_query(filter),
    )
    .await
    {
        Ok(Ok(rows)) => rows,
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_named_from_the_path() {
        let post = Method::POST;
        assert_eq!(
            action_of(&post, "/api/v1/services/pos/nodes/01/drain"),
            "drain"
        );
        assert_eq!(action_of(&post, "/api/v1/services/pos/nodes"), "add");
        assert_eq!(
            action_of(&Method::DELETE, "/api/v1/services/pos/nodes/01"),
            "remove"
        );
        assert_eq!(action_of(&post, "/api/v1/reload"), "reload");
        assert_eq!(action_of(&post, "/api/v1/saf/12/drop"), "saf-drop");
        assert_eq!(
            action_of(&Method::GET, "/api/v1/status"),
            "GET /api/v1/status"
        );
    }
}
