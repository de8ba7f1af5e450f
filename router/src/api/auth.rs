//! `--api-key`: every route but `/health` and the chat page's files wants
//! `Authorization: Bearer KEY`; anything else gets a 401 in OpenAI's error shape.
//!
//! The key is compared with `subtle`'s constant-time equality, so the time a refusal takes
//! does not tell an attacker how many leading bytes were right. (Only the key's length can
//! leak, and a length says nothing useful about a random key.) Unknown paths are refused
//! too: without the key a client learns nothing, not even which routes exist.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::api::page;
use crate::error::ApiError;
use crate::state::AppState;

/// The routes served without a key: load balancers probe `/health`, and the page's files
/// are static (the page asks for the key before it calls the API).
fn is_open(path: &str, web_ui: bool) -> bool {
    path == "/health" || (web_ui && page::ROUTES.contains(&path))
}

/// The middleware: passes the request on, or answers 401.
pub async fn require_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = &state.api_key else {
        return next.run(req).await;
    };
    if is_open(req.uri().path(), state.web_ui) {
        return next.run(req).await;
    }
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match check(header, key.as_bytes()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Whether an `Authorization` header value carries `key` as a bearer token.
fn check(header: Option<&[u8]>, key: &[u8]) -> Result<(), ApiError> {
    let Some(value) = header else {
        return Err(ApiError::Unauthorized(
            "this server needs an API key: send `Authorization: Bearer KEY`".into(),
        ));
    };
    let token = value
        .split_at_checked(7)
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|(_, token)| token.trim_ascii());
    let Some(token) = token else {
        return Err(ApiError::Unauthorized(
            "the `Authorization` header must be `Bearer KEY`".into(),
        ));
    };
    match bool::from(token.ct_eq(key)) {
        true => Ok(()),
        false => Err(ApiError::Unauthorized("incorrect API key".into())),
    }
}

/// True when `host` (the `--host` flag) is reachable only from this machine.
pub fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_key_passes() {
        assert_eq!(check(Some(b"Bearer sk-1"), b"sk-1"), Ok(()));
        assert_eq!(check(Some(b"bearer  sk-1 "), b"sk-1"), Ok(()));
        for (header, message) in [
            (
                None,
                "this server needs an API key: send `Authorization: Bearer KEY`",
            ),
            (Some(&b"Bearer sk-2"[..]), "incorrect API key"),
            (Some(b"Bearer sk-1x"), "incorrect API key"),
            (Some(b"Bearer "), "incorrect API key"),
            (
                Some(b"Basic sk-1"),
                "the `Authorization` header must be `Bearer KEY`",
            ),
            (
                Some(b"sk-1"),
                "the `Authorization` header must be `Bearer KEY`",
            ),
        ] {
            assert_eq!(check(header, b"sk-1").unwrap_err().message(), message);
        }
    }

    #[test]
    fn health_and_the_page_are_open() {
        assert!(is_open("/health", false));
        assert!(is_open("/", true) && is_open("/ui/chat.js", true));
        assert!(!is_open("/", false));
        assert!(!is_open("/metrics", true) && !is_open("/v1/models", true));
    }

    #[test]
    fn loopback_hosts() {
        for host in ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["0.0.0.0", "::", "10.0.0.1", "example.com"] {
            assert!(!is_loopback(host), "{host}");
        }
    }
}
