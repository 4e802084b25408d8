//! GraphiQL, served whole by Stockguard: the page and its assets (the
//! production builds of GraphiQL and React, pinned, compiled into the binary
//! from `assets/graphiql/`), so it works without internet. The page carries
//! a Content-Security-Policy that allows this origin only, Subresource
//! Integrity hashes on its assets, and no inline script: its settings are
//! `data-` attributes that `init.js` reads. It opens on Stockguard's own
//! example operations ([`EXAMPLES`]) rather than GraphiQL's welcome text.

use axum::{
    extract::Path,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use base64::Engine as _;
use sha2::{Digest, Sha384};

/// The published versions the assets are.
const GRAPHIQL_VERSION: &str = "4.1.2";
const REACT_VERSION: &str = "18.3.1";

/// One asset: its name under `/graphiql/`, type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: $type,
            bytes: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/graphiql/", $name)),
        }
    };
}

const ASSETS: [Asset; 5] = [
    asset!("react.production.min.js", "text/javascript; charset=utf-8"),
    asset!("react-dom.production.min.js", "text/javascript; charset=utf-8"),
    asset!("graphiql.min.js", "text/javascript; charset=utf-8"),
    asset!("graphiql.min.css", "text/css; charset=utf-8"),
    asset!("init.js", "text/javascript; charset=utf-8"),
];

/// What the page may load: only from here. GraphiQL sets inline styles, and
/// its fonts and icons are `data:` URLs.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; font-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The document GraphiQL opens on (its `defaultQuery`, shown in a browser
/// that has no tabs of its own stored yet): Stockguard's example operations,
/// one named operation each, so the run button offers them by name.
pub(super) const EXAMPLES: &str = include_str!("examples.graphql");

/// The rendered page.
#[derive(Clone)]
pub(super) struct Page(String);

impl Page {
    /// The page for `/graphql` and `/graphql/ws`; `authorization`, when given,
    /// is sent by GraphiQL as the `Authorization` header (a development server's
    /// operator token).
    pub(super) fn new(authorization: Option<&str>) -> Self {
        let asset = |name: &str| format!("src=\"{}\" integrity=\"{}\"", path(name), integrity(name));
        let authorization =
            authorization.map(|value| format!(" data-authorization=\"{}\"", escape(value))).unwrap_or_default();
        Self(format!(
            r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Stockguard · GraphiQL</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{css}" integrity="{css_integrity}">
<style>html, body, #graphiql {{ height: 100%; margin: 0; }}</style>
</head>
<body>
<div id="graphiql" data-endpoint="/graphql" data-subscriptions="/graphql/ws"{authorization}
     data-default-query="{examples}">Loading GraphiQL…</div>
<script {react}></script>
<script {react_dom}></script>
<script {graphiql}></script>
<script {init}></script>
</body>
</html>
"#,
            css = path("graphiql.min.css"),
            css_integrity = integrity("graphiql.min.css"),
            react = asset("react.production.min.js"),
            react_dom = asset("react-dom.production.min.js"),
            graphiql = asset("graphiql.min.js"),
            init = asset("init.js"),
            examples = escape(EXAMPLES),
        ))
    }

    /// The page as a response, with its security headers.
    pub(super) fn response(&self) -> Response {
        let mut response = (StatusCode::OK, self.0.clone()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
        headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
        headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

/// The Subresource Integrity value of an asset.
fn integrity(name: &str) -> String {
    let bytes = ASSETS.iter().find(|asset| asset.name == name).map_or(&[][..], |asset| asset.bytes);
    format!("sha384-{}", base64::engine::general_purpose::STANDARD.encode(Sha384::digest(bytes)))
}

/// Where an asset is served: under its package's version, so a new version
/// is a new URL and the old one may be cached for good.
fn path(name: &str) -> String {
    let version = if name.starts_with("react") { REACT_VERSION } else { GRAPHIQL_VERSION };
    format!("/graphiql/{version}/{name}")
}

/// `GET /graphiql/{version}/{name}`.
pub(super) async fn asset(Path((version, name)): Path<(String, String)>) -> Response {
    match ASSETS.iter().find(|asset| asset.name == name && path(asset.name) == format!("/graphiql/{version}/{name}")) {
        Some(asset) => {
            let mut response = (StatusCode::OK, asset.bytes).into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=31536000, immutable"));
            headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
            response
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `value` safe inside a double-quoted HTML attribute.
fn escape(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets_each_with_its_hash() {
        let page = Page::new(Some("Bearer a.b.c")).0;
        assert!(!page.contains("unpkg") && !page.contains("https://"), "nothing from elsewhere");
        assert_eq!(page.matches("integrity=\"sha384-").count(), 5);
        assert!(page.contains("data-authorization=\"Bearer a.b.c\""));
        assert!(!page.contains("<script>"), "no inline script");
        assert!(!Page::new(None).0.contains("data-authorization"));
        for asset in &ASSETS {
            assert!(asset.bytes.len() > 100, "{} is compiled in", asset.name);
        }
    }

    #[test]
    fn the_page_opens_on_the_example_operations_escaped_whole() {
        let page = Page::new(None).0;
        let start = page.find("data-default-query=\"").expect("the attribute") + "data-default-query=\"".len();
        let value = &page[start..start + page[start..].find('"').expect("its end")];
        let unescaped = value.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&");
        assert_eq!(unescaped, EXAMPLES, "the attribute is the document, whole");
        for operation in
            ["query ListStock", "mutation CreateLocation", "mutation TransferStock", "mutation ReserveAcrossLocations"]
        {
            assert!(EXAMPLES.contains(operation), "{operation}");
        }
    }
}
