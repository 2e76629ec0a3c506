//! OpenAPI documents of routes described by hand: the daemons' APIs, the manager's board,
//! the dashboard and the metrics beside the acquisition service's own (whose calls derive
//! theirs, with full schemas). A hand-described route names its method, what it does and
//! the media type of its answer; its bodies are free-form JSON, not a schema of their fields.

use std::sync::Arc;

use axum::{Json, Router};
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, InfoBuilder, ObjectBuilder, OpenApi, OpenApiBuilder, Required, ResponseBuilder, Type};

/// How a hand-described route is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    /// Changes something: takes an optional JSON body and, when a token is set, the token.
    Post,
    /// As `Post`.
    Put,
}

/// A route described by hand: its handler answers free-form JSON or text.
pub struct Described {
    pub path: &'static str,
    pub method: Method,
    pub summary: &'static str,
    /// The media type of its answer.
    pub answers: &'static str,
}

/// `/events`, which every daemon and the manager serve ([`crate::http::daemon_router`]).
pub const EVENTS: Described = Described { path: "/events", method: Method::Get, summary: "A page of the event channel from `since` (at most `limit`)", answers: "application/json" };

/// The name of the bearer token's security scheme in the documents.
const BEARER: &str = "bearer";

/// A document of the routes `routes` under `title`, with the bearer token as the security
/// scheme of every call that changes something.
pub fn document(title: &str, description: &str, routes: &[Described]) -> OpenApi {
    let info = InfoBuilder::new().title(title).version(env!("CARGO_PKG_VERSION")).description(Some(description)).build();
    with_bearer(with_described(OpenApiBuilder::new().info(info).build(), routes))
}

/// `router` serving `doc` at `/openapi.json`.
pub fn serve_document<S: Clone + Send + Sync + 'static>(router: Router<S>, doc: OpenApi) -> Router<S> {
    let doc = Arc::new(doc);
    router.route("/openapi.json", axum::routing::get(move || async move { Json(doc.as_ref().clone()) }))
}

/// Adds the routes `extra` describes to `doc`, each with its one answer, a free-form JSON
/// body for a call that changes something and, for a templated path, its path parameter.
pub(crate) fn with_described(mut doc: OpenApi, extra: &[Described]) -> OpenApi {
    for d in extra {
        let answer = ResponseBuilder::new().description(d.summary).content(d.answers, ContentBuilder::new().build()).build();
        let mut op = OperationBuilder::new().summary(Some(d.summary)).response("200", answer);
        for name in d.path.split('/').filter_map(|part| part.strip_prefix('{')?.strip_suffix('}')) {
            let string = ObjectBuilder::new().schema_type(Type::String).build();
            op = op.parameter(ParameterBuilder::new().name(name).parameter_in(ParameterIn::Path).required(Required::True).schema(Some(string)).build());
        }
        let method = match d.method {
            Method::Get => HttpMethod::Get,
            Method::Post => HttpMethod::Post,
            Method::Put => HttpMethod::Put,
        };
        if d.method != Method::Get {
            let object = ObjectBuilder::new().schema_type(Type::Object).build();
            let body = RequestBodyBuilder::new().content("application/json", ContentBuilder::new().schema(Some(object)).build()).required(Some(Required::False)).build();
            op = op.request_body(Some(body));
        }
        doc.paths.add_path_operation(d.path, vec![method], op.build());
    }
    doc
}

/// `doc` with the bearer token as its security scheme (`bearer`), which every call that
/// changes something (a POST or PUT) requires when a token is set.
pub(crate) fn with_bearer(mut doc: OpenApi) -> OpenApi {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(BEARER, SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    for item in doc.paths.paths.values_mut() {
        for op in [item.post.as_mut(), item.put.as_mut()].into_iter().flatten() {
            op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
        }
    }
    doc
}
