//! The chat page at `/`: an HTML page, its stylesheet and its script, all our own and
//! embedded in the binary (no CDN, no build step). The page talks to the server only through
//! the public API, so the files themselves reveal nothing and are served without a key;
//! `--no-web-ui` leaves these routes out (404).

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/chat.js");
const STYLE: &str = include_str!("page/chat.css");

/// The page's routes: what an auth layer lets through without a key.
pub const ROUTES: [&str; 3] = ["/", "/ui/chat.js", "/ui/chat.css"];

/// Scripts, styles and connections from this origin only: a second wall behind the page's
/// rule that text is never parsed as HTML (an injected `<script>` or `onerror=` would not run).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            ROUTES[0],
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            ROUTES[1],
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            ROUTES[2],
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // Revalidated on every load: a new binary's page is never mixed with an old script.
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(INDEX.contains(r#"<script src="/ui/chat.js">"#));
        assert!(INDEX.contains(r#"href="/ui/chat.css""#));
        for file in [INDEX, SCRIPT, STYLE] {
            assert!(!file.contains("http://") && !file.contains("https://"));
        }
    }

    #[test]
    fn the_script_never_parses_text_as_html() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!SCRIPT.contains(sink), "chat.js uses {sink}");
        }
    }
}
