//! Who may do what on the dashboard, and the guard on every action that changes state.
//!
//! Two rules. A *viewer* is what the caller may do: a read-only viewer is shown no
//! destructive buttons (and the API refuses such calls from it anyway, since every action
//! goes through the API with the caller's own credentials). And every action is a `POST`
//! that carries the page's CSRF token twice, in a `SameSite=Strict` cookie and in the
//! `X-Comb-Csrf` header htmx adds to each request: another site can make a browser send the
//! cookie, but it can neither read it nor add a custom header without a CORS preflight, which
//! Comb does not answer. A present `Origin` must also name this host.

use axum::http::{HeaderMap, HeaderValue, header};

/// Name of the cookie and header carrying the CSRF token.
pub(crate) const CSRF_COOKIE: &str = "comb_csrf";
pub(crate) const CSRF_HEADER: &str = "x-comb-csrf";

/// What the caller may do on the pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Viewer {
    /// Requeue, purge, seek: actions that change the broker's state.
    pub can_modify: bool,
}

/// The caller's powers. Authentication is off in this build, so everyone may do everything;
/// once bearer tokens with roles exist, this is the one place that maps the request's role
/// to a [`Viewer`] (read-only → `can_modify: false`).
pub(crate) fn viewer(_headers: &HeaderMap) -> Viewer {
    Viewer { can_modify: true }
}

/// The CSRF token the request's cookie carries, if any.
pub(crate) fn csrf_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == CSRF_COOKIE)
        .map(|(_, value)| value.to_string())
        .filter(|v| valid_token(v))
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
}

/// Checks that a state-changing request comes from a dashboard page of this host and that
/// the caller may change state.
pub(crate) fn check_action(headers: &HeaderMap) -> Result<(), Refusal> {
    let cookie = csrf_cookie(headers).ok_or(Refusal::Csrf)?;
    let sent = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or(Refusal::Csrf)?;
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
    if !viewer(headers).can_modify {
        return Err(Refusal::ReadOnly);
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
    fn a_page_reuses_a_valid_cookie_and_mints_one_otherwise() {
        let (token, set) = page_token(&headers(&[("cookie", &format!("comb_csrf={T}"))]));
        assert_eq!((token.as_str(), set), (T, None));
        let (token, set) = page_token(&headers(&[("cookie", "comb_csrf=<script>")]));
        assert!(valid_token(&token));
        assert!(set.unwrap().to_str().unwrap().contains("SameSite=Strict"));
    }
}
