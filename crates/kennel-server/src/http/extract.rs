//! Extractors whose rejections come back in the API's error shape.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body whose rejections (malformed JSON, unknown fields, wrong types, too large) come
/// back as our error shape, with serde's message naming the problem.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // Only a JSON content type: a web page can send `text/plain`, a form's types or none
        // to any origin without a preflight, so reading those as JSON would let it act.
        let json = is_json(req.headers());
        // Read all the same, so that the connection stays usable for the client's next
        // request (hyper closes one whose request body was left unread).
        let ApiBytes(body) = ApiBytes::from_request(req, state).await?;
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON sent as `Content-Type: application/json` (with curl: \
                 --json '{...}', or -H 'Content-Type: application/json')",
            ));
        }
        parse_json(&body).map(ApiJson)
    }
}

/// Whether the request says its body is JSON: `application/json` or `application/*+json`,
/// with any parameters (`; charset=utf-8`), in any case.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let essence = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence
        .strip_prefix("application/")
        .is_some_and(|sub| sub == "json" || (sub.ends_with("+json") && !sub.contains('/')))
}

/// Parses a JSON body; the error names the field at fault (`limits.timeout: ...`).
fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = match e.path().to_string() {
            path if path == "." => String::new(),
            path => format!("`{path}`: "),
        };
        ApiError::bad_request(format!("invalid JSON body: {at}{}", e.inner()))
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    Ok(value)
}

/// A path parameter whose rejections (bad percent-encoding, say) come back as our error shape.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|r| rejected(r.status(), r.body_text()))
    }
}

/// A query string whose rejections (`?stream=maybe`) come back as our error shape.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|r| rejected(r.status(), r.body_text()))
    }
}

/// An extractor's rejection in our shape: the client's fault stays a 400, a bug a 500.
fn rejected(status: StatusCode, text: String) -> ApiError {
    if status.is_client_error() {
        ApiError::bad_request(text.to_lowercase())
    } else {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", text)
    }
}

/// A raw body whose rejections (too large, unreadable) come back as our error shape.
#[derive(Debug)]
pub struct ApiBytes(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        axum::body::Bytes::from_request(req, state)
            .await
            .map(ApiBytes)
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    let msg = "the request body is larger than this server's max_body";
                    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", msg)
                } else {
                    ApiError::bad_request(rejection.body_text())
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, value.parse().unwrap());
        h
    }

    #[test]
    fn only_json_content_types_are_json() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/merge-patch+json",
        ] {
            assert!(is_json(&with(ok)), "{ok}");
        }
        for bad in [
            "text/plain",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonp",
            "text/json",
            "",
        ] {
            assert!(!is_json(&with(bad)), "{bad}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }
}
