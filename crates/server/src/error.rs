//! Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}` with the
//! HTTP status a client library maps to the same exception OpenAI's API would raise.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request cannot be served as it is.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400 naming the parameter at fault.
    pub fn param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            code: Some("invalid_value"),
            ..Self::invalid(message)
        }
    }

    /// 400: the prompt does not fit the context.
    pub fn context_length(prompt: usize, max_len: usize) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            param: Some("messages".into()),
            ..Self::invalid(format!(
                "This model's maximum context length is {max_len} tokens; the prompt has \
                 {prompt} tokens"
            ))
        }
    }

    /// 404: a model this server does not serve.
    pub fn unknown_model(name: &str, served: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            message: format!("The model `{name}` does not exist; this server serves `{served}`"),
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404: no such path.
    pub fn not_found(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            message: format!("Unknown path {path}"),
            param: None,
            code: Some("unknown_url"),
        }
    }

    /// 503: the queue of waiting requests is full.
    pub fn queue_full(capacity: usize) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            message: format!(
                "The server is busy: {capacity} requests are already waiting; retry later"
            ),
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 503: the engine is gone (it failed, or the server is shutting down).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: Some("engine_unavailable"),
        }
    }

    /// 500: generation failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
