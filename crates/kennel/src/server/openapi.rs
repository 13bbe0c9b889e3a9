//! The OpenAPI document, generated from the same Rust types the server uses.

use utoipa::OpenApi;

use super::{runs, session_routes, sessions};
use crate::api;

#[derive(OpenApi)]
#[openapi(
    info(title = "Kennel", description = "Run untrusted code in disposable sandboxes."),
    paths(
        runs::create_run,
        session_routes::create,
        session_routes::list,
        session_routes::show,
        session_routes::remove,
        session_routes::exec,
        session_routes::write_file,
        session_routes::read_file,
        session_routes::delete_file,
        session_routes::list_files,
    ),
    components(schemas(
        api::RunSpec, api::LimitsSpec, api::RunResult, api::CollectedFile, api::Content,
        api::Isolation, api::SeccompInfo, api::LandlockInfo, api::LimitsInfo, api::Language,
        api::SessionSpec, api::ExecSpec, api::ExecResult, api::Interpreter, sessions::SessionInfo,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as served at `/openapi.json` and committed as `docs/openapi.json`.
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let mut text = doc
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    /// The committed document is the one the code generates: regenerate it with
    /// `kennel openapi > docs/openapi.json` after changing the API.
    #[test]
    fn committed_openapi_matches_the_code() {
        let committed = include_str!("../../../../docs/openapi.json");
        assert!(
            committed == super::document(),
            "docs/openapi.json is stale: run `kennel openapi > docs/openapi.json`"
        );
    }
}
