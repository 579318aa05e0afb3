//! Signing in to the dashboard when tokens are required: the operator pastes a bearer token
//! once (`/sign-in`), the server verifies it with the same code as the API and keeps it in an
//! `HttpOnly`, `SameSite=Strict` cookie until sign-out. Every page request then passes
//! [`guard`]: the token (from an `Authorization: Bearer` header, else the cookie) must allow
//! the page by the API's own role and queue rules; the pages call the API with it. A missing,
//! expired or refused token leads back to the sign-in page with a sentence saying why, never
//! to a JSON error. Nothing of a token is ever written into a page.

use askama::Template;
use axum::Form;
use axum::extract::{Query, Request, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::access::{self, Refusal};
use super::{Notice, enc, rendered};
use crate::auth::{Denied, bearer};
use crate::http::State;

/// Why the sign-in page is shown: a fixed set, so a link can say why without carrying text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// No token yet.
    SignIn,
    /// The token is not valid (expired, not yet valid, wrong key or issuer).
    Invalid,
    /// The token's role may not view the dashboard.
    Role,
    /// The token is limited to some queues, and the page spans others.
    Scope,
    /// The operator signed out.
    SignedOut,
    /// The sign-in form did not come from this server's page.
    Form,
    /// The token cannot be kept in a cookie.
    TooLong,
}

impl Why {
    const ALL: [Why; 7] = [
        Why::SignIn,
        Why::Invalid,
        Why::Role,
        Why::Scope,
        Why::SignedOut,
        Why::Form,
        Why::TooLong,
    ];

    fn code(self) -> &'static str {
        match self {
            Why::SignIn => "sign-in",
            Why::Invalid => "invalid",
            Why::Role => "role",
            Why::Scope => "scope",
            Why::SignedOut => "signed-out",
            Why::Form => "form",
            Why::TooLong => "too-long",
        }
    }

    fn parse(code: &str) -> Option<Why> {
        Why::ALL.into_iter().find(|w| w.code() == code)
    }

    fn text(self) -> &'static str {
        match self {
            Why::SignIn => "This server requires a bearer token: paste one to see its pages.",
            Why::Invalid => {
                "That token is not valid (it may have expired, or be signed by another key or issuer). Paste a valid one."
            }
            Why::Role => "That token's role may not view the dashboard: it needs a reader's role.",
            Why::Scope => {
                "That token is limited to some queues, and this page spans others. Open a queue's own page (/queues/NAME), or sign in with another token."
            }
            Why::SignedOut => "You are signed out.",
            Why::Form => "The form expired or did not come from this server: try again.",
            Why::TooLong => {
                "That token is too long to keep in a browser cookie: send it in an Authorization header instead."
            }
        }
    }

    /// Whether the message reports a failure (shown as an alert) rather than a state.
    fn is_error(self) -> bool {
        !matches!(self, Why::SignIn | Why::SignedOut)
    }
}

#[derive(Template)]
#[template(path = "dashboard/sign_in.html")]
struct SignInPage<'a> {
    title: &'a str,
    csrf: &'a str,
    next: &'a str,
    message: Option<&'a str>,
    error: bool,
}

/// `?next=…&why=…` of the sign-in page.
#[derive(Deserialize, Default)]
pub(crate) struct Shown {
    #[serde(default)]
    next: String,
    #[serde(default)]
    why: String,
}

/// The sign-in form.
#[derive(Deserialize)]
pub(crate) struct SignInForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
    #[serde(default)]
    csrf: String,
}

/// The sign-out form.
#[derive(Deserialize)]
pub(crate) struct SignOutForm {
    #[serde(default)]
    csrf: String,
}

/// A path of this server to go back to after signing in: anything else (another host, a
/// scheme-relative `//host`) becomes `/`.
fn local(next: &str) -> &str {
    let ok = next.starts_with('/')
        && !next.starts_with("//")
        && !next.contains(['\\', '\r', '\n'])
        && !next.starts_with("/sign-");
    if ok { next } else { "/" }
}

/// The sign-in page, with the CSRF cookie minted if needed.
fn page(headers: &HeaderMap, next: &str, why: Option<Why>, status: StatusCode) -> Response {
    let (csrf, set_cookie) = access::page_token(headers);
    let page = SignInPage {
        title: "Sign in",
        csrf: &csrf,
        next: local(next),
        message: why.map(Why::text),
        error: why.is_some_and(Why::is_error),
    };
    let mut response = rendered(page.render());
    *response.status_mut() = status;
    let out = response.headers_mut();
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(cookie) = set_cookie {
        out.append(header::SET_COOKIE, cookie);
    }
    response
}

/// Whether the server serves TLS (the token cookie is then `Secure`).
fn tls(state: &State) -> bool {
    state.config.tls.tls_cert.is_some()
}

/// `GET /sign-in`.
pub(crate) async fn show(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Query(shown): Query<Shown>,
) -> Response {
    if state.auth.is_none() {
        return Redirect::to("/").into_response();
    }
    page(
        &headers,
        &shown.next,
        Why::parse(&shown.why),
        StatusCode::OK,
    )
}

/// `POST /sign-in`: keeps a valid token of a reader's role in the cookie and goes back to the
/// page asked for; shows the form again, saying why, otherwise.
pub(crate) async fn sign_in(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> Response {
    let Some(auth) = &state.auth else {
        return Redirect::to("/").into_response();
    };
    let next = local(&form.next);
    if access::check_form(&headers, &form.csrf).is_err() {
        return page(&headers, next, Some(Why::Form), StatusCode::FORBIDDEN);
    }
    let token = form.token.trim();
    let refused = match auth.identify(token) {
        Ok(p) if !p.may(&Method::GET, "/") => Some(Why::Role),
        Ok(_) if !access::fits_a_cookie(token) => Some(Why::TooLong),
        Ok(_) => None,
        Err(Denied::NoRole) => Some(Why::Role),
        Err(_) => Some(Why::Invalid),
    };
    if let Some(why) = refused {
        return page(&headers, next, Some(why), StatusCode::UNAUTHORIZED);
    }
    let mut response = Redirect::to(next).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        access::token_cookie_header(Some(token), tls(&state)),
    );
    response
}

/// `POST /sign-out`: forgets the token and shows the sign-in page.
pub(crate) async fn sign_out(
    AxumState(state): AxumState<State>,
    headers: HeaderMap,
    Form(form): Form<SignOutForm>,
) -> Response {
    if let Err(refusal) = access::check_form(&headers, &form.csrf) {
        return Notice::refused(refusal);
    }
    let mut response =
        Redirect::to(&format!("/sign-in?why={}", Why::SignedOut.code())).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        access::token_cookie_header(None, tls(&state)),
    );
    response
}

/// Paths served to anyone: signing in and out, and the static assets.
fn open(path: &str) -> bool {
    path == "/sign-in" || path == "/sign-out" || path.starts_with("/assets/")
}

/// Admits a page request by the caller's token when tokens are required (the page's own
/// role and queue rules, as the API's), recording what the caller may do
/// ([`access::set_viewer`]) and handing the token on to the page's API calls; leads anyone
/// else to the sign-in page.
pub(crate) async fn guard(
    AxumState(state): AxumState<State>,
    mut request: Request,
    next: Next,
) -> Response {
    access::set_viewer(request.headers_mut(), None);
    let Some(auth) = state.auth.clone() else {
        return next.run(request).await;
    };
    if open(request.uri().path()) {
        return next.run(request).await;
    }
    let headers = request.headers();
    let (token, from_cookie) = match bearer(
        headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    ) {
        Some(t) => (t.to_string(), false),
        None => match access::token_cookie(headers) {
            Some(t) => (t.to_string(), true),
            None => return away(&request, Why::SignIn, None),
        },
    };
    let method = request.method().clone();
    let why = match auth.check(&method, request.uri().path(), &token) {
        Ok(principal) => {
            let headers = request.headers_mut();
            access::set_viewer(headers, Some(&principal));
            if from_cookie && let Ok(v) = HeaderValue::from_str(&format!("Bearer {token}")) {
                headers.insert(header::AUTHORIZATION, v);
            }
            return next.run(request).await;
        }
        Err(Denied::MissingToken | Denied::InvalidToken) => Why::Invalid,
        Err(Denied::NoRole) => Why::Role,
        // Pages are reads: a role refused a page may not view the dashboard; refused an
        // action (a `POST`), it may only look.
        Err(Denied::RoleTooLow) if is_read(&method) => Why::Role,
        Err(Denied::RoleTooLow) => return Notice::refused(Refusal::ReadOnly),
        Err(Denied::OutOfScope) if is_read(&method) => Why::Scope,
        Err(Denied::OutOfScope) => return Notice::refused(Refusal::OutOfScope),
    };
    // A cookie's token that is no longer valid is forgotten.
    let forget = (from_cookie && why == Why::Invalid).then(|| tls(&state));
    away(&request, why, forget)
}

fn is_read(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// Sends the caller to the sign-in page, then back to where it was: a redirect for a page,
/// `HX-Redirect` for an htmx request (which would otherwise swap the sign-in page into a
/// fragment), a notice for an action. With `forget_cookie` (whether the server serves TLS),
/// the token cookie is ended too.
fn away(request: &Request, why: Why, forget_cookie: Option<bool>) -> Response {
    let headers = request.headers();
    let htmx = headers.contains_key("hx-request");
    let here = if htmx {
        // The page the fragment belongs to, from htmx's own header (a full URL).
        headers
            .get("hx-current-url")
            .and_then(|v| v.to_str().ok())
            .and_then(|u| u.split_once("://"))
            .and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_string()))
            .unwrap_or_else(|| "/".to_string())
    } else {
        request
            .uri()
            .path_and_query()
            .map_or("/".to_string(), |p| p.as_str().to_string())
    };
    let to = format!("/sign-in?why={}&next={}", why.code(), enc(local(&here)));
    let mut response = if htmx {
        let mut r = StatusCode::UNAUTHORIZED.into_response();
        if let Ok(v) = HeaderValue::from_str(&to) {
            r.headers_mut().insert("hx-redirect", v);
        }
        r
    } else if is_read(request.method()) {
        Redirect::to(&to).into_response()
    } else {
        Notice::refused(Refusal::SignedOut)
    };
    if let Some(tls) = forget_cookie {
        response
            .headers_mut()
            .append(header::SET_COOKIE, access::token_cookie_header(None, tls));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_gone_back_to() {
        assert_eq!(local("/queues/q?x=1"), "/queues/q?x=1");
        for bad in [
            "//evil.example/",
            "https://evil.example/",
            "evil",
            "/\\evil",
            "/sign-in",
        ] {
            assert_eq!(local(bad), "/", "{bad}");
        }
    }

    #[test]
    fn every_reason_reads_back_from_its_code() {
        for why in Why::ALL {
            assert_eq!(Why::parse(why.code()), Some(why));
        }
        assert_eq!(Why::parse("<script>"), None);
    }
}
