//! Requests refused before routing: what HTTP/1.1 requires a server to refuse (RFC 9112
//! §3.2: no `Host` field, more than one, or one that is not one host; the target `*` on
//! another method than OPTIONS, §3.2.4), a method with a lower-case letter (which some
//! upstreams upper-case, so it would reach them as a method no route saw), a path that has no
//! one safe normal form ([`normalize_target`]), and what this proxy
//! does not forward (a `CONNECT` tunnel; a transfer coding besides `chunked`, RFC 9112
//! §6.1: hyper itself answers 400 to codings that do not end in `chunked`, so the ones
//! seen here are like `gzip, chunked`). Each of them would otherwise be routed or framed
//! one way here and another way upstream: the route chosen by one `Host` while the
//! upstream reads the other, or a gzip-coded body forwarded as if it were plain.

use std::borrow::Cow;

use http::header::{HOST, TRANSFER_ENCODING};
use http::uri::PathAndQuery;
use http::{HeaderValue, Method, Request, Uri, Version};

use crate::config::{Config, Protection, FALLBACK_ROUTE};
use crate::error::ProxyError;
use crate::proxy::headers::is_chunked_alone;
use crate::route::normalize::{normal_forms, PathError};
use crate::route::Overrides;

/// The host the request is routed by, or why it is refused: its target's authority when
/// it has one (an absolute-form target, RFC 9112 §3.2.2, or HTTP/2's `:authority`), else
/// its `Host` field. The `Host` field is checked either way; [`host_from_target`] then
/// makes it the authority the request was routed by.
pub fn admit<B>(request: &Request<B>) -> Result<Option<&str>, ProxyError> {
    // RFC 9110 §9.1: method names are case-sensitive, and every registered one is upper
    // case. But Django and Werkzeug (Flask) upper-case the method they are given: a `post`
    // would run their POST view while neither a route nor `defaults.key` took it for one.
    if request
        .method()
        .as_str()
        .bytes()
        .any(|b| b.is_ascii_lowercase())
    {
        return Err(ProxyError::BadRequest(
            "the method has a lower-case letter; method names are upper case".into(),
        ));
    }
    if request.method() == Method::CONNECT {
        return Err(ProxyError::NotImplemented(
            "CONNECT is not forwarded: this is a reverse proxy, not a tunnel",
        ));
    }
    // RFC 9112 §3.2.4, RFC 9113 §8.3.1: the asterisk form is OPTIONS's alone; another
    // method with it has no resource to act on, and would reach the upstream as `POST *`.
    if request.uri().path() == "*" && request.method() != Method::OPTIONS {
        return Err(ProxyError::BadRequest(
            "only OPTIONS may have the target `*`".into(),
        ));
    }
    let mut hosts = request.headers().get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::BadRequest(
            "the request has more than one Host field".into(),
        ));
    }
    if host.is_none() && request.version() == Version::HTTP_11 {
        return Err(ProxyError::BadRequest(
            "an HTTP/1.1 request must have a Host field".into(),
        ));
    }
    let not_a_host = || ProxyError::BadRequest("the request's Host is not one host[:port]".into());
    let host = match host {
        Some(value) => Some(host_value(value.as_bytes()).ok_or_else(not_a_host)?),
        None => None,
    };
    // The target's authority, by the same rule, wins over the field.
    let host = match request.uri().authority() {
        Some(authority) => Some(host_value(authority.as_str().as_bytes()).ok_or_else(not_a_host)?),
        None => host,
    };
    // One look-up, whether the request has the field or not.
    let codings = request.headers().get_all(TRANSFER_ENCODING);
    if codings.iter().next().is_some() && !is_chunked_alone(codings.iter().map(|v| v.as_bytes())) {
        return Err(ProxyError::NotImplemented(
            "the only transfer coding forwarded is chunked",
        ));
    }
    Ok(host)
}

/// Sets the `Host` field to the target's authority, if the request has one (after
/// [`admit`] took it). RFC 9112 §3.2.2: a proxy that receives an absolute-form target
/// ignores the `Host` field and replaces it with the target's host; an HTTP/2 `Host` that
/// differs from `:authority` is malformed (RFC 9113 §8.3.1) and goes the same way. The
/// route was chosen by the authority, so the upstream reads the host it was routed by.
pub fn host_from_target<B>(request: &mut Request<B>) {
    let Some(authority) = request.uri().authority() else {
        return;
    };
    // `admit` checked it is one host[:port], so it is a valid field value.
    if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
        request.headers_mut().insert(HOST, value);
    }
}

/// A `Host` value that is one host and an optional port (RFC 9110 §7.2 `uri-host [ ":"
/// port ]`, or empty): a name of letters, digits, `-`, `.`, `_`, `~`, or a bracketed IPv6
/// literal, then at most `:` and a port number. Anything else (a list, a space, userinfo, a
/// path, sub-delimiters, percent-escapes, non-ASCII, an empty label) is a 400 by RFC 9112
/// §3.2, since routes would match it differently from how the upstream reads it.
fn host_value(value: &[u8]) -> Option<&str> {
    if value.is_empty() {
        // RFC 9112 §3.2: the empty Host of a target without an authority.
        return Some("");
    }
    let port = if value[0] == b'[' {
        let end = value.iter().position(|&b| b == b']')?;
        std::str::from_utf8(&value[1..end])
            .ok()?
            .parse::<std::net::Ipv6Addr>()
            .ok()?;
        match &value[end + 1..] {
            [] => None,
            [b':', port @ ..] => Some(port),
            _ => return None,
        }
    } else {
        let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
        let name = &value[..end];
        if name.is_empty() || !name.iter().all(|&b| NAME_BYTES[usize::from(b)]) {
            return None;
        }
        // An empty label (`pay.example..`, `.pay.example`, `pay..example`) has no one
        // reading: nginx refuses it, other servers strip the dots and read `pay.example`,
        // which a route for that host must then not miss. A fully qualified name's one
        // trailing dot is the name ([`crate::route::host_name`]).
        let labels = name.strip_suffix(b".").unwrap_or(name);
        if labels.split(|&b| b == b'.').any(<[u8]>::is_empty) {
            return None;
        }
        value.get(end + 1..)
    };
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.len() <= 5
            && port.iter().all(u8::is_ascii_digit)
            && std::str::from_utf8(port).ok()?.parse::<u16>().is_ok();
        if !valid {
            return None;
        }
    }
    // ASCII only, so UTF-8.
    std::str::from_utf8(value).ok()
}

/// The bytes of a host name (reg-name's unreserved characters), looked up rather than
/// compared in turn: this runs on every request.
static NAME_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~');
        b += 1;
    }
    table
};

/// How a request's path is read besides as it is forwarded, where it differs
/// ([`NormalForms`](crate::route::normalize::NormalForms)): what [`route`] routes it by and checks.
#[derive(Debug, Default)]
pub struct Readings {
    /// [`NormalForms::decoded`](crate::route::normalize::NormalForms::decoded): routed by, where the path has an escaped sub-delimiter,
    /// `:` or `@`.
    pub decoded: Option<String>,
    /// [`NormalForms::lenient`](crate::route::normalize::NormalForms::lenient).
    pub lenient: Option<String>,
}

impl Readings {
    /// The path routes match: the decoded reading where there is one, else the path as
    /// forwarded (`forwarded`, the request's normalised path).
    pub fn routed<'a>(&'a self, forwarded: &'a str) -> &'a str {
        self.decoded.as_deref().unwrap_or(forwarded)
    }
}

/// Puts the request's path in its one normal form ([`normal_forms`]) before it is
/// routed and forwarded, so what the upstream reads is what was matched; the query is
/// left alone. Only methods that routes can apply to are touched: safe methods always
/// pass through, so theirs reach the upstream as sent.
///
/// Returns the path's other [`Readings`], for [`route`] to route it by too. A path
/// without a `%` has none, and costs no allocation.
pub fn normalize_target<B>(request: &mut Request<B>) -> Result<Readings, ProxyError> {
    if crate::route::is_safe(request.method()) {
        return Ok(Readings::default());
    }
    let forms = normal_forms(request.uri().path()).map_err(ProxyError::BadPath)?;
    let readings = Readings {
        decoded: forms.decoded,
        lenient: forms.lenient,
    };
    let normal = match forms.strict {
        Cow::Borrowed(_) => return Ok(readings),
        Cow::Owned(normal) => normal,
    };
    let target = match request.uri().query() {
        Some(query) => format!("{normal}?{query}"),
        None => normal,
    };
    let mut parts = request.uri().clone().into_parts();
    parts.path_and_query = Some(
        PathAndQuery::try_from(target)
            .map_err(|e| ProxyError::BadRequest(format!("the normalised path: {e}")))?,
    );
    *request.uri_mut() = Uri::from_parts(parts)
        .map_err(|e| ProxyError::BadRequest(format!("the normalised path: {e}")))?;
    Ok(readings)
}

/// The route a request whose normalised path is `path` belongs to and its protection
/// ([`Config::route_for`], by [`Readings::routed`]), or a refusal where another of its
/// `readings`, from [`normalize_target`], the same override-aware look-up would protect by
/// another rule.
///
/// The path as sent, where it is routed decoded: Express runs `/v1/orders%3Acancel` under
/// `/v1/{action}` while most upstreams run the `/v1/orders:cancel` route it is routed by.
/// Where that reading is no route's, so the fallback's, and the decoded route enforces
/// nothing (`idempotency: off`, or observed during a rollout), the request is run under
/// the fallback's rule, as before routes read escapes decoded: Express runs it unrouted,
/// which the fallback protects, and to the others it is a dedupe they did not ask for,
/// which is safer than refusing every client that escapes `:` (`encodeURIComponent`).
///
/// The lenient reading, compared with the rule the request is run under (the decoded
/// route's, or the fallback's as above): an upstream that decodes twice runs
/// `/api%252Forders` as `/api/orders`, whose required key or ttl the fallback would step
/// around, and `/files/7%252Fpublish` under an unprotected `/files/{name}` as
/// `/files/7/publish`, which the fallback's key protects. That reading is rare and no
/// browser sends it, so there the request is refused rather than run under the fallback.
///
/// It passes as routed where the other reading enforces nothing (no route, an unprotected
/// or observed one), where both readings are one route (a Jenkins branch
/// `/job/x/job/feature%252Fbar/build` under `/job/*`, `/users/a%40b/orders` under
/// `/users/{email}/orders`), and where the other one falls to the fallback while the
/// routed one enforces a route of its own (the same branch under `/job/{name}/build`, an
/// EUC-KR word under `/board/{name}/write`, `%3Acancel` under a `:cancel` route: that
/// route's rule holds).
pub fn route<'c>(
    config: &'c Config,
    host: Option<&str>,
    method: &Method,
    headers: &http::HeaderMap,
    overrides: Overrides,
    path: &str,
    readings: &Readings,
) -> Result<(&'c str, &'c Protection), ProxyError> {
    if host.is_none_or(str::is_empty)
        && binds_a_host(config, method, headers, overrides, path, readings)
    {
        return Err(ProxyError::HostRequired);
    }
    let mut routed = config.route_for(host, method, headers, overrides, readings.routed(path));
    // The path as sent is another reading only where it was not routed by.
    if readings.decoded.is_some() {
        let sent = config.route_for(host, method, headers, overrides, path);
        if sent.0 == FALLBACK_ROUTE && sent.1.enforces() && !routed.1.enforces() {
            routed = sent;
        } else if moves(sent, routed) {
            return Err(ProxyError::BadPath(PathError::EscapedReadingMovesRoute));
        }
    }
    if let Some(lenient) = readings.lenient.as_deref() {
        let read = config.route_for(host, method, headers, overrides, lenient);
        if moves(read, routed) {
            return Err(ProxyError::BadPath(PathError::LenientReadingMovesRoute));
        }
    }
    Ok(routed)
}

/// Whether a route bound to a host matches a request that names none, by any reading of
/// its path and by its method or (a `POST`) one its overrides name, as [`route`] reads
/// them. Routes match such a request to no host, but the upstream serves it from its
/// default host, which may be the route's: routed past it, a `PUT` the route protects
/// would run unprotected. A safe method passes through whatever its route, and a route
/// that does not enforce binds nothing.
fn binds_a_host(
    config: &Config,
    method: &Method,
    headers: &http::HeaderMap,
    overrides: Overrides,
    path: &str,
    readings: &Readings,
) -> bool {
    if crate::route::is_safe(method) {
        return false;
    }
    let paths = [
        Some(path),
        readings.decoded.as_deref(),
        readings.lenient.as_deref(),
    ];
    config
        .routes
        .iter()
        // Only a route that enforces has anything to step around: one that is off, or
        // only observes, forwards the request whichever route it falls to.
        .filter(|route| route.matcher.host.is_some() && route.protection.enforces())
        .any(|route| {
            let listed = &route.matcher.methods;
            let named =
                *method == Method::POST && overrides.methods(headers, listed).next().is_some();
            (listed.contains(method) || named)
                && paths
                    .iter()
                    .flatten()
                    .any(|p| route.matcher.path.matches(p))
        })
}

/// Whether `other`, a request's route by another reading, protects it by another rule than
/// `routed`, the one it is run under ([`route`]).
fn moves(other: (&str, &Protection), routed: (&str, &Protection)) -> bool {
    // One name is one route, so one protection: names are unique, and the fallback's and
    // the unrouted one's are theirs alone.
    other.1.enforces() && other.0 != routed.0 && !(other.0 == FALLBACK_ROUTE && routed.1.enforces())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, version: Version, fields: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder()
            .method(method)
            .uri("/orders")
            .version(version);
        for (name, value) in fields {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    fn refusal(request: &Request<()>) -> u16 {
        admit(request).unwrap_err().status().as_u16()
    }

    #[test]
    fn one_host_routes_the_request() {
        let r = request("POST", Version::HTTP_11, &[("host", "pay.example")]);
        assert_eq!(admit(&r).unwrap(), Some("pay.example"));
    }

    #[test]
    fn two_host_fields_are_a_400() {
        let r = request(
            "POST",
            Version::HTTP_11,
            &[("host", "other.example"), ("host", "pay.example")],
        );
        assert_eq!(refusal(&r), 400);
        let r = request("POST", Version::HTTP_10, &[("host", "a"), ("host", "b")]);
        assert_eq!(refusal(&r), 400);
    }

    #[test]
    fn a_host_field_that_is_not_a_host_is_a_400() {
        for bad in [
            &b"pay.example, x"[..],
            b"pay.example,evil.example",
            b"pay.example;evil.example",
            b"pay.example:443,evil.example",
            b"user@pay.example",
            b"pay.example/orders",
            b"pay.example\xe9",
            b"pay example",
            b"pay.example:",
            b"pay.example:65536",
            b"pay.example:8a",
            b"pay%2eexample",
            b"pay!example",
            b"pay.example..",
            b".pay.example",
            b"pay..example:80",
            b".",
            b"[::1",
            b"[::1]x",
            b"[zz]",
            b":80",
        ] {
            let mut r = request("POST", Version::HTTP_11, &[]);
            r.headers_mut()
                .insert(HOST, http::HeaderValue::from_bytes(bad).unwrap());
            assert_eq!(refusal(&r), 400, "{:?}", String::from_utf8_lossy(bad));
        }
        for good in [
            "pay.example:8443",
            "[::1]:80",
            "[::1]",
            "10.0.0.1",
            "xn--bcher-kva.example",
            "pay.example.",
            "pay.example.:80",
            "",
        ] {
            let r = request("POST", Version::HTTP_11, &[("host", good)]);
            assert_eq!(admit(&r).unwrap(), Some(good));
        }
    }

    #[test]
    fn http_1_1_without_host_is_a_400_and_http_1_0_and_2_are_not() {
        assert_eq!(refusal(&request("GET", Version::HTTP_11, &[])), 400);
        assert_eq!(admit(&request("GET", Version::HTTP_10, &[])).unwrap(), None);
        assert_eq!(admit(&request("GET", Version::HTTP_2, &[])).unwrap(), None);
    }

    #[test]
    fn an_absolute_target_s_authority_is_the_host() {
        let mut r = Request::post("http://b.example:8080/orders")
            .header(HOST, "a.example")
            .body(())
            .unwrap();
        assert_eq!(admit(&r).unwrap(), Some("b.example:8080"));
        host_from_target(&mut r);
        assert_eq!(
            r.headers().get_all(HOST).iter().collect::<Vec<_>>(),
            ["b.example:8080"]
        );
        // The field is still checked, and so is the authority.
        let r = Request::post("http://b.example/orders")
            .header(HOST, "a.example, c.example")
            .body(())
            .unwrap();
        assert_eq!(refusal(&r), 400);
        let r = Request::post("http://user@b.example/orders")
            .header(HOST, "b.example")
            .body(())
            .unwrap();
        assert_eq!(refusal(&r), 400);
        // An origin-form target keeps its field.
        let mut r = Request::post("/orders")
            .header(HOST, "a.example")
            .body(())
            .unwrap();
        host_from_target(&mut r);
        assert_eq!(r.headers()[HOST], "a.example");
    }

    #[test]
    fn only_options_may_target_the_asterisk() {
        let r = Request::post("*").header(HOST, "a").body(()).unwrap();
        assert_eq!(refusal(&r), 400);
        let r = Request::options("*").header(HOST, "a").body(()).unwrap();
        assert_eq!(admit(&r).unwrap(), Some("a"));
    }

    #[test]
    fn a_method_with_a_lower_case_letter_is_a_400() {
        for method in ["post", "Post", "get", "purge"] {
            let r = request(method, Version::HTTP_11, &[("host", "h")]);
            assert_eq!(refusal(&r), 400, "{method}");
        }
        let r = request("PURGE", Version::HTTP_11, &[("host", "h")]);
        assert!(admit(&r).is_ok());
    }

    #[test]
    fn connect_is_a_501() {
        let r = request("CONNECT", Version::HTTP_11, &[("host", "10.0.0.1:443")]);
        assert_eq!(refusal(&r), 501);
    }

    #[test]
    fn only_chunked_is_forwarded_as_a_transfer_coding() {
        let host = ("host", "h");
        for ok in ["chunked", "Chunked", " chunked "] {
            let r = request("POST", Version::HTTP_11, &[host, ("transfer-encoding", ok)]);
            assert!(admit(&r).is_ok(), "{ok}");
        }
        for coding in ["gzip, chunked", "chunked, chunked", "identity", "gzip", ""] {
            let r = request(
                "POST",
                Version::HTTP_11,
                &[host, ("transfer-encoding", coding)],
            );
            assert_eq!(refusal(&r), 501, "{coding:?}");
        }
        let r = request(
            "POST",
            Version::HTTP_11,
            &[
                host,
                ("transfer-encoding", "gzip"),
                ("transfer-encoding", "chunked"),
            ],
        );
        assert_eq!(refusal(&r), 501);
    }

    #[test]
    fn a_path_is_forwarded_in_its_normal_form_with_its_query() {
        let mut r = Request::post("/api//x/../orders?b=%2F&a=1")
            .body(())
            .unwrap();
        normalize_target(&mut r).unwrap();
        assert_eq!(r.uri(), "/api/orders?b=%2F&a=1");
        let mut r = Request::post("http://pay.example/api/%6Frders")
            .body(())
            .unwrap();
        normalize_target(&mut r).unwrap();
        assert_eq!(r.uri(), "http://pay.example/api/orders");
        let mut r = Request::post("/api%2Forders").body(()).unwrap();
        assert_eq!(normalize_target(&mut r).unwrap_err().status().as_u16(), 400);
        // Safe methods always pass through, as sent.
        let mut r = Request::get("/files/a%2Fb/./c").body(()).unwrap();
        normalize_target(&mut r).unwrap();
        assert_eq!(r.uri(), "/files/a%2Fb/./c");
    }

    /// `/v1%252Forders%3Acancel` has both other readings: as sent (Express), decoded
    /// `/v1%252Forders:cancel` (routed by) and lenient `/v1/orders:cancel` (decoded twice).
    /// The as-sent one is checked first, and may hand the request to the fallback; the
    /// lenient one is then checked against the rule it is run under.
    #[test]
    fn both_readings_are_checked_the_escaped_one_first() {
        let route_of = |routes: &str| {
            let text = format!(
                "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nroutes:\n{routes}"
            );
            let config = Config::parse(&text, "proxy.yaml").unwrap();
            let mut r = Request::post("/v1%252Forders%3acancel").body(()).unwrap();
            let readings = normalize_target(&mut r).unwrap();
            assert_eq!(readings.decoded.as_deref(), Some("/v1%252Forders:cancel"));
            assert_eq!(readings.lenient.as_deref(), Some("/v1/orders:cancel"));
            let (method, headers) = (Method::POST, http::HeaderMap::new());
            let found = route(
                &config,
                None,
                &method,
                &headers,
                Overrides::NONE,
                r.uri().path(),
                &readings,
            );
            found.map(|(name, protection)| (name.to_owned(), protection.enforces()))
        };
        let decoded = |rule: &str| {
            format!(
                "  - name: decoded\n    match: {{ path: \"/v1%252Forders:cancel\" }}\n    {rule}\n"
            )
        };
        let keyed = "key: { header: K, required: true }";
        let sent = format!("  - name: sent\n    match: {{ path: \"/{{one}}\" }}\n    {keyed}\n");
        let lenient =
            format!("  - name: lenient\n    match: {{ path: /v1/orders:cancel }}\n    {keyed}\n");
        let moved = |found: Result<(String, bool), ProxyError>| match found {
            Err(ProxyError::BadPath(error)) => error,
            other => panic!("{other:?}"),
        };
        // Both others are other routes: the as-sent one's is the error.
        let found = route_of(&format!("{}{sent}{lenient}", decoded(keyed)));
        assert_eq!(moved(found), PathError::EscapedReadingMovesRoute);
        // The decoded route enforces nothing, the as-sent reading is the fallback's: run
        // under it, and the lenient reading is checked against it.
        let off = decoded("idempotency: off");
        assert_eq!(route_of(&off).unwrap(), (FALLBACK_ROUTE.to_owned(), true));
        let found = route_of(&format!("{off}{lenient}"));
        assert_eq!(moved(found), PathError::LenientReadingMovesRoute);
        // The decoded route enforces: it holds, against the fallback as sent, and the
        // lenient reading is checked against it.
        assert_eq!(
            route_of(&decoded(keyed)).unwrap(),
            ("decoded".to_owned(), true)
        );
        let found = route_of(&format!("{}{lenient}", decoded(keyed)));
        assert_eq!(moved(found), PathError::LenientReadingMovesRoute);
    }

    #[test]
    fn an_escaped_colon_is_forwarded_as_sent_and_routed_decoded() {
        let mut r = Request::post("/v1/x/../orders%3acancel?a=%3A")
            .body(())
            .unwrap();
        let readings = normalize_target(&mut r).unwrap();
        assert_eq!(r.uri(), "/v1/orders%3Acancel?a=%3A");
        assert_eq!(readings.routed(r.uri().path()), "/v1/orders:cancel");
        let mut r = Request::post("/v1/orders").body(()).unwrap();
        let readings = normalize_target(&mut r).unwrap();
        assert_eq!(readings.routed(r.uri().path()), "/v1/orders");
    }
}
