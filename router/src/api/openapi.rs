//! `GET /openapi.json`: the OpenAPI 3.1 description of every route, its request body and its
//! error body, generated from the request types themselves (`utoipa`'s `ToSchema` derive),
//! so it cannot drift from what the parser accepts.
//!
//! The two OpenAI endpoints read one JSON object into two types (the endpoint's own fields
//! and `CommonParams`, see `openai::parse_body`); their body schema is the two derived
//! object schemas merged into one, unknown keys refused as the parser refuses them.

use std::sync::OnceLock;

use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa::openapi::path::{HttpMethod, OperationBuilder};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{AdditionalProperties, Schema};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, Paths, Ref, RefOr,
    Required, ResponseBuilder,
};
use utoipa::{PartialSchema, ToSchema};

use crate::api::native::{DetokenizeRequest, GenerateRequest, TokenizeRequest};
use crate::api::openai::{ChatRequest, CommonParams, CompletionRequest};
use crate::error::ErrorBody;

/// A route: method, path, summary, and its body's schema (None: no body).
type Route = (
    HttpMethod,
    &'static str,
    &'static str,
    Option<RefOr<Schema>>,
);

fn routes() -> Vec<Route> {
    use HttpMethod::{Get, Post};
    vec![
        (
            Post,
            "/v1/chat/completions",
            "OpenAI chat completions (SSE with `stream`)",
            Some(merged(ChatRequest::schema(), CommonParams::schema())),
        ),
        (
            Post,
            "/v1/completions",
            "OpenAI completions (SSE with `stream`)",
            Some(merged(CompletionRequest::schema(), CommonParams::schema())),
        ),
        (Get, "/v1/models", "The served model names", None),
        (
            Get,
            "/v1/models/{id}",
            "One served model (404 listing them)",
            None,
        ),
        (
            Post,
            "/tokenize",
            "Text or messages to token ids (vLLM)",
            Some(reference::<TokenizeRequest>()),
        ),
        (
            Post,
            "/detokenize",
            "Token ids to text (vLLM)",
            Some(reference::<DetokenizeRequest>()),
        ),
        (
            Post,
            "/generate",
            "SGLang's native generate",
            Some(reference::<GenerateRequest>()),
        ),
        (
            Get,
            "/health",
            "200 when every worker is ready, else 503 (no key needed)",
            None,
        ),
        (Get, "/metrics", "Prometheus text", None),
        (Get, "/openapi.json", "This document", None),
        (Get, "/", "The chat page, when served (no key needed)", None),
    ]
}

/// The document, built once.
pub fn document() -> &'static OpenApi {
    static DOC: OnceLock<OpenApi> = OnceLock::new();
    DOC.get_or_init(build)
}

pub async fn serve() -> Response {
    Json(document()).into_response()
}

fn build() -> OpenApi {
    let mut schemas = Vec::new();
    TokenizeRequest::schemas(&mut schemas);
    ChatRequest::schemas(&mut schemas);
    CompletionRequest::schemas(&mut schemas);
    CommonParams::schemas(&mut schemas);
    GenerateRequest::schemas(&mut schemas);
    ErrorBody::schemas(&mut schemas);
    let components = ComponentsBuilder::new()
        .schemas_from_iter(schemas)
        .schema(TokenizeRequest::name(), TokenizeRequest::schema())
        .schema(DetokenizeRequest::name(), DetokenizeRequest::schema())
        .schema(GenerateRequest::name(), GenerateRequest::schema())
        .schema(ErrorBody::name(), ErrorBody::schema())
        .build();
    let mut paths = Paths::new();
    for (method, path, summary, body) in routes() {
        paths.add_path_operation(path, vec![method], operation(summary, body));
    }
    let info = InfoBuilder::new()
        .title("minisgl-router")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "OpenAI-compatible HTTP API; docs/api.md describes each parameter and limit. With \
             --api-key every route but /health and the chat page wants `Authorization: Bearer`.",
        ))
        .build();
    OpenApiBuilder::new()
        .info(info)
        .paths(paths)
        .components(Some(components))
        .build()
}

fn operation(summary: &str, body: Option<RefOr<Schema>>) -> utoipa::openapi::path::Operation {
    let error = ResponseBuilder::new()
        .description("An error in OpenAI's shape (400, 401, 404, 413, 429, 503, 504)")
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(reference::<ErrorBody>()))
                .build(),
        )
        .build();
    let mut op = OperationBuilder::new()
        .summary(Some(summary))
        .response("200", ResponseBuilder::new().description("OK").build())
        .response("default", error);
    if let Some(schema) = body {
        let content = ContentBuilder::new().schema(Some(schema)).build();
        op = op.request_body(Some(
            RequestBodyBuilder::new()
                .content("application/json", content)
                .required(Some(Required::True))
                .build(),
        ));
    }
    op.build()
}

fn reference<T: ToSchema>() -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(T::name()))
}

/// One object schema with the properties and required fields of both (each derived from a
/// type that refuses unknown keys, as the merged body does).
fn merged(endpoint: RefOr<Schema>, common: RefOr<Schema>) -> RefOr<Schema> {
    let (RefOr::T(Schema::Object(mut own)), RefOr::T(Schema::Object(shared))) = (endpoint, common)
    else {
        unreachable!("request types derive object schemas");
    };
    own.properties.extend(shared.properties);
    own.required.extend(shared.required);
    own.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
    RefOr::T(Schema::Object(own))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn doc() -> Value {
        serde_json::to_value(document()).unwrap()
    }

    #[test]
    #[ignore = "prints the document: cargo test openapi::tests::print -- --ignored --nocapture"]
    fn print() {
        println!("{}", serde_json::to_string_pretty(&doc()).unwrap());
    }

    #[test]
    fn every_route_is_described() {
        let doc = doc();
        let paths = doc["paths"].as_object().unwrap();
        for (_, path, _, _) in routes() {
            assert!(paths.contains_key(path), "{path}");
        }
        assert_eq!(doc["openapi"], "3.1.0");
    }

    #[test]
    fn bodies_come_from_the_request_types() {
        let doc = doc();
        let chat = &doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
            ["application/json"]["schema"];
        let props = chat["properties"].as_object().unwrap();
        // The endpoint's fields and the common ones, in one object that refuses others.
        for field in [
            "model",
            "messages",
            "max_completion_tokens",
            "temperature",
            "stop",
            "n",
        ] {
            assert!(props.contains_key(field), "{field}");
        }
        assert_eq!(chat["additionalProperties"], false);
        let required: Vec<&str> = chat["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(required, ["model", "messages"]);
        let completion = &doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]
            ["application/json"]["schema"];
        assert!(completion["properties"]["prompt"].is_object());
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for name in [
            "ChatMessage",
            "Tool",
            "MessageToolCall",
            "Stop",
            "GenerateRequest",
            "TokenizeRequest",
            "ErrorBody",
        ] {
            assert!(schemas.contains_key(name), "{name}");
        }
    }
}
