//! Who may do what on the dashboard, and the guard on every action that changes state.
//!
//! Two rules. A *viewer* is what the caller may do: with tokens required, the role of the
//! caller's token decides it (see [`set_viewer`]), and a viewer whose role may not use the
//! API's requeue, purge and seek routes is shown no destructive buttons (the API refuses such
//! calls from it anyway, since every action goes through the API with the caller's own
//! token). And every action is a `POST` that carries the page's CSRF token twice, in a
//! `SameSite=Strict` cookie and in the `X-Comb-Csrf` header htmx adds to each request (or, for
//! the sign-in and sign-out forms, a hidden field): another site can make a browser send the
//! cookie, but it can neither read it nor add a custom header without a CORS preflight, which
//! Comb does not answer. A present `Origin` must also name this host.

use axum::http::{HeaderMap, HeaderValue, Method, header};

use crate::auth::Principal;

/// Name of the cookie and header carrying the CSRF token.
pub(crate) const CSRF_COOKIE: &str = "comb_csrf";
pub(crate) const CSRF_HEADER: &str = "x-comb-csrf";

/// Name of the cookie keeping a signed-in operator's bearer token.
pub(crate) const TOKEN_COOKIE: &str = "comb_token";

/// Set on each page request the session guard admitted, from the verified token's role, and
/// removed from whatever the client sent: `modify` or `look`. Absent: tokens are not
/// required, and everyone may do everything.
const VIEWER_HEADER: &str = "x-comb-viewer";

/// The API routes the pages' actions call (requeue, purge, seek): a role that may use them
/// all is shown the buttons.
const ACTIONS: [&str; 3] = [
    "/api/v1/dlq/requeue",
    "/api/v1/dlq/purge",
    "/api/v1/consumer-groups/group/queues/queue/seek",
];

/// What the caller may do on the pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Viewer {
    /// Requeue, purge, seek: actions that change the broker's state.
    pub can_modify: bool,
    /// Signed in with a token (tokens are required): the pages offer to sign out.
    pub signed_in: bool,
}

/// The caller's powers, as the session guard found them (see [`set_viewer`]).
pub(crate) fn viewer(headers: &HeaderMap) -> Viewer {
    match headers.get(VIEWER_HEADER) {
        None => Viewer {
            can_modify: true,
            signed_in: false,
        },
        Some(v) => Viewer {
            can_modify: v.as_bytes() == b"modify",
            signed_in: true,
        },
    }
}

/// Records what the caller may do: nothing said when tokens are not required (`None`),
/// else what the token's role allows. Whatever the client sent under that name is dropped.
pub(crate) fn set_viewer(headers: &mut HeaderMap, principal: Option<&Principal>) {
    headers.remove(VIEWER_HEADER);
    if let Some(p) = principal {
        let modify = ACTIONS.iter().all(|a| p.may(&Method::POST, a));
        let value = if modify { "modify" } else { "look" };
        headers.insert(VIEWER_HEADER, HeaderValue::from_static(value));
    }
}

/// The value of cookie `name`, if the request carries it.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value)
}

/// The CSRF token the request's cookie carries, if any.
pub(crate) fn csrf_cookie(headers: &HeaderMap) -> Option<String> {
    cookie(headers, CSRF_COOKIE)
        .filter(|v| valid_token(v))
        .map(str::to_string)
}

/// The bearer token a signed-in operator's cookie keeps, if any.
pub(crate) fn token_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, TOKEN_COOKIE).filter(|t| !t.is_empty())
}

/// Whether a token can be kept in a cookie as it is: a JWT's characters, short enough for
/// every browser's cookie limit.
pub(crate) fn fits_a_cookie(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 3_800
        && token.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'+' | b'/' | b'=')
        })
}

/// The `Set-Cookie` keeping `token` (which [`fits_a_cookie`]) for this browser session, or
/// ending it (`None`): never readable by scripts, never sent by other sites' pages, and only
/// over TLS when the server serves TLS.
pub(crate) fn token_cookie_header(token: Option<&str>, tls: bool) -> HeaderValue {
    let secure = if tls { "; Secure" } else { "" };
    let cookie = match token {
        Some(t) => format!("{TOKEN_COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict{secure}"),
        None => format!("{TOKEN_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{secure}"),
    };
    HeaderValue::from_str(&cookie).expect("a token that fits a cookie")
}

/// The token a page embeds: the cookie's, or a new one (then `Set-Cookie` carries it).
pub(crate) fn page_token(headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    match csrf_cookie(headers) {
        Some(token) => (token, None),
        None => {
            let token = uuid::Uuid::new_v4().simple().to_string();
            let cookie = format!("{CSRF_COOKIE}={token}; Path=/; SameSite=Strict; HttpOnly");
            let value = HeaderValue::from_str(&cookie).expect("ascii cookie");
            (token, Some(value))
        }
    }
}

/// Why an action was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The request did not prove it comes from one of the dashboard's own pages.
    Csrf,
    /// The caller may only look.
    ReadOnly,
    /// The caller's token may not touch the queue (or the action spans queues).
    OutOfScope,
    /// Tokens are required and the request carries none that is valid.
    SignedOut,
}

/// Checks that a state-changing request comes from a dashboard page of this host and that
/// the caller may change state.
pub(crate) fn check_action(headers: &HeaderMap) -> Result<(), Refusal> {
    let sent = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or(Refusal::Csrf)?;
    check_form(headers, sent)?;
    if !viewer(headers).can_modify {
        return Err(Refusal::ReadOnly);
    }
    Ok(())
}

/// Checks that a form posted to this host (sign-in, sign-out) comes from one of its pages:
/// `sent`, the form's CSRF field, must be the page's cookie.
pub(crate) fn check_form(headers: &HeaderMap, sent: &str) -> Result<(), Refusal> {
    let cookie = csrf_cookie(headers).ok_or(Refusal::Csrf)?;
    if sent != cookie {
        return Err(Refusal::Csrf);
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest);
        if host.is_none() || origin_host != host {
            return Err(Refusal::Csrf);
        }
    }
    Ok(())
}

fn valid_token(token: &str) -> bool {
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const T: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn an_action_needs_the_cookie_and_the_same_header() {
        let ok = headers(&[("cookie", &format!("a=b; comb_csrf={T}")), (CSRF_HEADER, T)]);
        assert_eq!(check_action(&ok), Ok(()));
        let no_header = headers(&[("cookie", &format!("comb_csrf={T}"))]);
        assert_eq!(check_action(&no_header), Err(Refusal::Csrf));
        let no_cookie = headers(&[(CSRF_HEADER, T)]);
        assert_eq!(check_action(&no_cookie), Err(Refusal::Csrf));
        let other = "f123456789abcdef0123456789abcdef";
        let mismatch = headers(&[("cookie", &format!("comb_csrf={T}")), (CSRF_HEADER, other)]);
        assert_eq!(check_action(&mismatch), Err(Refusal::Csrf));
    }

    #[test]
    fn an_action_from_another_origin_is_refused() {
        let cookie = format!("comb_csrf={T}");
        let base = [
            ("cookie", cookie.as_str()),
            (CSRF_HEADER, T),
            ("host", "comb:6632"),
        ];
        let mut same = base.to_vec();
        same.push(("origin", "http://comb:6632"));
        assert_eq!(check_action(&headers(&same)), Ok(()));
        let mut other = base.to_vec();
        other.push(("origin", "https://evil.example"));
        assert_eq!(check_action(&headers(&other)), Err(Refusal::Csrf));
    }

    #[test]
    fn the_viewer_is_what_the_guard_set_and_nothing_the_client_sent() {
        let open = viewer(&HeaderMap::new());
        assert!(open.can_modify && !open.signed_in);
        let mut h = headers(&[(VIEWER_HEADER, "modify")]);
        set_viewer(&mut h, None);
        assert_eq!(viewer(&h), open, "a client's header is dropped");
        let look = viewer(&headers(&[(VIEWER_HEADER, "look")]));
        assert!(!look.can_modify && look.signed_in);
        // A read-only viewer's action is refused even with a valid CSRF pair.
        let cookie = format!("comb_csrf={T}");
        let h = headers(&[
            ("cookie", &cookie),
            (CSRF_HEADER, T),
            (VIEWER_HEADER, "look"),
        ]);
        assert_eq!(check_action(&h), Err(Refusal::ReadOnly));
    }

    #[test]
    fn the_token_cookie_is_http_only_strict_and_secure_over_tls() {
        let set = token_cookie_header(Some("a.b.c"), true);
        let set = set.to_str().unwrap();
        for part in ["comb_token=a.b.c", "HttpOnly", "SameSite=Strict", "Secure"] {
            assert!(set.contains(part), "{set}");
        }
        let plain = token_cookie_header(Some("a.b.c"), false);
        assert!(!plain.to_str().unwrap().contains("Secure"));
        assert!(
            token_cookie_header(None, false)
                .to_str()
                .unwrap()
                .contains("Max-Age=0")
        );
        let h = headers(&[("cookie", "x=1; comb_token=a.b.c")]);
        assert_eq!(token_cookie(&h), Some("a.b.c"));
        assert!(fits_a_cookie("eyJ.eyJ.sig-_"));
        assert!(!fits_a_cookie("a;b") && !fits_a_cookie("a b") && !fits_a_cookie(""));
    }

    #[test]
    fn a_page_reuses_a_valid_cookie_and_mints_one_otherwise() {
        let (token, set) = page_token(&headers(&[("cookie", &format!("comb_csrf={T}"))]));
        assert_eq!((token.as_str(), set), (T, None));
        let (token, set) = page_token(&headers(&[("cookie", "comb_csrf=<script>")]));
        assert!(valid_token(&token));
        assert!(set.unwrap().to_str().unwrap().contains("SameSite=Strict"));
    }
}
