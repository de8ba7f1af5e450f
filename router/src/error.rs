//! One error type for the HTTP boundary, rendered in OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    /// The client's request is wrong; `param` names the offending field when there is one.
    BadRequest {
        message: String,
        param: Option<String>,
    },
    /// The `model` field names a model this router does not serve.
    ModelNotFound(String),
    /// No or a wrong `Authorization: Bearer` key (`--api-key`).
    Unauthorized(String),
    /// No such route.
    NotFound(String),
    PayloadTooLarge(String),
    MethodNotAllowed(String),
    /// Too many requests in flight (`--max-requests`); sent with `Retry-After: 1`.
    Overloaded(String),
    /// No worker can take the request (none ready, or the one serving it died); sent with
    /// `Retry-After: 1` (a worker restarts or reconnects within seconds).
    Unavailable(String),
    /// The request ran past `--request-timeout` (aborted in the worker).
    Timeout(String),
    /// Our fault.
    Internal(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: None,
        }
    }

    /// A bad value in the field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    /// This error as one prompt's of a batch (a /v1/completions `prompt` list): the
    /// message says which; an error that named no field names `prompt`.
    pub fn in_prompt(self, index: usize) -> Self {
        match self {
            Self::BadRequest { message, param } => Self::BadRequest {
                message: format!("`prompt[{index}]`: {message}"),
                param: Some(param.unwrap_or_else(|| "prompt".into())),
            },
            other => other,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::ModelNotFound(_) | Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::BadRequest { message, .. } => message,
            Self::ModelNotFound(m)
            | Self::Unauthorized(m)
            | Self::NotFound(m)
            | Self::PayloadTooLarge(m)
            | Self::MethodNotAllowed(m)
            | Self::Overloaded(m)
            | Self::Unavailable(m)
            | Self::Timeout(m)
            | Self::Internal(m) => m,
        }
    }

    /// The `error` object of OpenAI's error body (also sent as an SSE event mid-stream).
    pub fn body(&self) -> serde_json::Value {
        let (kind, code, param) = match self {
            Self::BadRequest { param, .. } => ("invalid_request_error", None, param.clone()),
            Self::ModelNotFound(_) => (
                "invalid_request_error",
                Some("model_not_found"),
                Some("model".into()),
            ),
            Self::Unauthorized(_) => ("invalid_request_error", Some("invalid_api_key"), None),
            Self::NotFound(_) => ("invalid_request_error", Some("not_found"), None),
            Self::PayloadTooLarge(_) => ("invalid_request_error", Some("payload_too_large"), None),
            Self::MethodNotAllowed(_) => {
                ("invalid_request_error", Some("method_not_allowed"), None)
            }
            Self::Overloaded(_) => ("rate_limit_exceeded", Some("too_many_requests"), None),
            Self::Unavailable(_) => ("server_error", Some("service_unavailable"), None),
            Self::Timeout(_) => ("timeout", Some("request_timeout"), None),
            Self::Internal(_) => ("server_error", None, None),
        };
        let body = ErrorBody {
            error: ErrorObject {
                message: self.message().to_string(),
                kind,
                param,
                code,
            },
        };
        serde_json::to_value(body).expect("an error body always serializes")
    }
}

/// Every error response's body (and a stream's error event).
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    error: ErrorObject,
}

#[derive(Serialize, ToSchema)]
struct ErrorObject {
    message: String,
    /// `invalid_request_error`, `rate_limit_exceeded`, `timeout` or `server_error`.
    #[serde(rename = "type")]
    kind: &'static str,
    /// The request field at fault, when there is one.
    param: Option<String>,
    /// A machine-readable code (`invalid_api_key`, `model_not_found`, ...).
    code: Option<&'static str>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        if let Self::Overloaded(_) | Self::Unavailable(_) = self {
            // In-flight requests finish, and workers come back, within seconds.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Self::Unauthorized(_) = self {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_request_names_the_param() {
        let e = ApiError::invalid("top_p", "`top_p` must be in (0, 1]; got 1.5");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let body = e.body();
        assert_eq!(body["error"]["param"], "top_p");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(
            body["error"]["message"],
            "`top_p` must be in (0, 1]; got 1.5"
        );
        assert!(body["error"]["code"].is_null());
    }

    #[test]
    fn statuses_follow_the_variant() {
        assert_eq!(
            ApiError::ModelNotFound("x".into()).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            ApiError::ModelNotFound("x".into()).body()["error"]["code"],
            "model_not_found"
        );
        assert_eq!(
            ApiError::PayloadTooLarge("x".into()).status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        let unavailable = ApiError::Unavailable("x".into());
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(unavailable.into_response().headers()["retry-after"], "1");
        let overloaded = ApiError::Overloaded("x".into());
        assert_eq!(overloaded.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(overloaded.body()["error"]["type"], "rate_limit_exceeded");
        assert_eq!(overloaded.body()["error"]["code"], "too_many_requests");
        assert_eq!(overloaded.into_response().headers()["retry-after"], "1");
        let timeout = ApiError::Timeout("x".into());
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(timeout.body()["error"]["type"], "timeout");
        assert_eq!(
            ApiError::Internal("x".into()).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
