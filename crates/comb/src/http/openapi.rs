//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 description, checked against [`super::routes`].

use axum::http::header;
use axum::response::IntoResponse;

/// The document, kept beside this file.
pub(crate) const DOCUMENT: &str = include_str!("openapi.json");

/// Serves the document as JSON.
pub(crate) async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn document_describes_exactly_the_routes_served() {
        let doc: serde_json::Value = serde_json::from_str(DOCUMENT).expect("valid JSON");
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                    documented.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        let served: BTreeSet<(String, String)> = super::super::routes()
            .into_iter()
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(documented, served);
    }
}
