//! A client's request made ready for hyper's HTTP/1.1 client connection (or, from that,
//! for an HTTP/2 one: [`to_http2`]), and the checks on the answer head that hyper's client
//! leaves to its user.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Uri, Version};
use http_body::Body;

use crate::proxy::body::ProxyBody;
use crate::proxy::headers::{
    is_chunked_alone, strip_hop_by_hop, Forwarding, CLIENT_CLAIMS, X_FORWARDED_FOR,
    X_FORWARDED_HOST, X_FORWARDED_PROTO, X_ORIGINAL_URL, X_REWRITE_URL,
};

/// Rewrites `parts` into the request the upstream gets: origin form (what an HTTP/1.1
/// origin server expects; HTTP/2 clients send the absolute form), HTTP/1.1, the client's
/// fields without hop-by-hop ones (`Upgrade` kept for a forwarded protocol switch),
/// without `Expect` (answered here, not forwarded) and without framing fields (hyper writes
/// those for the body actually sent); `Host` kept, or `fallback_host` when the client sent
/// none (HTTP/2's `:authority`, or the upstream's for HTTP/1.0); `X-Forwarded-For`
/// appended to, `X-Forwarded-Proto` and `X-Forwarded-Host` set, and the client's
/// `Forwarded` (RFC 7239, which says the same and which some upstreams read first, Spring's
/// `ForwardedHeaderFilter` among them) removed, and so are the other fields apps read a
/// client's scheme, port or address from ([`CLIENT_CLAIMS`]: `X-Forwarded-Ssl`, `-Scheme`,
/// `-Port`, `-Protocol`, `Front-End-Https`, `X-Real-IP`, `True-Client-IP`,
/// `CF-Connecting-IP`, `Client-IP`, `Fly-Client-IP` and the like), so a client cannot name its own scheme,
/// host or address to the upstream. From a trusted peer
/// ([`Hop::trusted_peer`](crate::proxy::headers::Hop::trusted_peer)) the
/// scheme its hop wrote goes on instead of ours ([`trusted_scheme`]): it saw the client's,
/// this proxy only its own; and its [`CLIENT_CLAIMS`] go on as it sent them, as its
/// `X-Forwarded-For` does (appended to): they are its word on the client. Nor can a client name its own path: `X-Original-URL` and
/// `X-Rewrite-URL`, which IIS's URL Rewrite, the apps behind it and old Symfony dispatch
/// by instead of the target, are removed, so the upstream runs the path that was
/// routed. Trailer fields the client
/// declared in `Trailer` are declared again, less those only a header section may carry:
/// hyper sends only declared trailers.
///
/// A client that asked for trailers (`TE: trailers`) has the proxy ask for them too:
/// `TE` is hop-by-hop (RFC 9110 §10.1.4), but a proxy that can pass trailers on may send
/// its own, and this one passes them on to that client. hyper's HTTP/1.1 server (and so
/// many Rust upstreams) sends trailers only when asked. It goes as `TE: trailers` with
/// the `TE` connection option §10.1.4 requires beside it; the return says it went, for
/// [`to_http2`], whose `TE` stands alone.
pub fn prepare(
    parts: &mut http::request::Parts,
    body: &ProxyBody,
    forwarding: &Forwarding<'_>,
    fallback_host: impl FnOnce() -> Option<HeaderValue>,
) -> bool {
    if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = Uri::try_from(target).unwrap_or_else(|_| Uri::from_static("/"));
    }
    parts.version = Version::HTTP_11;
    let headers = &mut parts.headers;
    let mut seen = Seen::default();
    for name in headers.keys() {
        match name.as_str() {
            "host" => seen.host = true,
            "content-length" => seen.remove |= 1,
            "expect" => seen.remove |= 2,
            "x-forwarded-proto" => seen.remove |= 4,
            "x-forwarded-host" => seen.remove |= 8,
            "forwarded" => seen.remove |= 16,
            "x-original-url" | "x-rewrite-url" => seen.remove |= 32,
            // CLIENT_CLAIMS, spelled out: a string match on the path every request
            // takes (`only_a_trusted_peers_client_claims_go_on` holds the two together).
            "x-forwarded-ssl"
            | "x-forwarded-scheme"
            | "x-forwarded-port"
            | "x-forwarded-protocol"
            | "front-end-https"
            | "x-real-ip"
            | "true-client-ip"
            | "cf-connecting-ip"
            | "fastly-client-ip"
            | "client-ip"
            | "x-client-ip"
            | "x-cluster-client-ip"
            | "x-forwarded"
            | "forwarded-for"
            | "x-appengine-user-ip"
            | "fly-client-ip" => seen.remove |= 64,
            "x-forwarded-for" => seen.forwarded_for = true,
            "cookie" => seen.cookie = true,
            _ => {}
        }
    }
    if seen.cookie {
        join_cookies(headers);
    }
    let stripped = strip_hop_by_hop(headers, forwarding.hop.upgrade);
    // A trusted peer's scheme goes on instead of ours. Read after the hop-by-hop fields
    // went: one its `Connection` named was for this hop only.
    let their_proto = if forwarding.hop.trusted_peer && seen.remove & 4 != 0 {
        trusted_scheme(headers)
    } else {
        None
    };
    // Only those present: each removal hashes its name.
    if seen.remove & 1 != 0 {
        headers.remove(header::CONTENT_LENGTH);
    }
    if seen.remove & 2 != 0 {
        headers.remove(header::EXPECT);
    }
    if seen.remove & 4 != 0 {
        headers.remove(&X_FORWARDED_PROTO);
    }
    if seen.remove & 8 != 0 {
        headers.remove(&X_FORWARDED_HOST);
    }
    if seen.remove & 16 != 0 {
        headers.remove(header::FORWARDED);
    }
    if seen.remove & 32 != 0 {
        headers.remove(&X_ORIGINAL_URL);
        headers.remove(&X_REWRITE_URL);
    }
    if seen.remove & 64 != 0 && !forwarding.hop.trusted_peer {
        for name in &CLIENT_CLAIMS {
            headers.remove(name);
        }
    }
    let forwarded_for = if seen.forwarded_for {
        let mut list = Vec::new();
        for previous in headers.get_all(&X_FORWARDED_FOR) {
            list.extend_from_slice(previous.as_bytes());
            list.extend_from_slice(b", ");
        }
        list.extend_from_slice(forwarding.client_ip.as_bytes());
        HeaderValue::from_bytes(&list).unwrap_or_else(|_| forwarding.client_ip.clone())
    } else {
        forwarding.client_ip.clone()
    };
    headers.insert(X_FORWARDED_FOR.clone(), forwarded_for);
    headers.insert(
        X_FORWARDED_PROTO.clone(),
        HeaderValue::from_static(their_proto.unwrap_or(forwarding.proto)),
    );
    let host = if seen.host {
        headers.get(header::HOST).cloned()
    } else {
        let host = fallback_host();
        if let Some(host) = &host {
            headers.insert(header::HOST, host.clone());
        }
        host
    };
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST.clone(), host);
    }
    if body.is_end_stream() {
        // Servers may insist on a length for these methods even when it is zero (411).
        if matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
    } else if body.size_hint().exact().is_none() {
        // Said here: hyper would send a GET's streamed body as no body at all.
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        if let Some(trailers) = stripped.declared_trailers {
            headers.insert(header::TRAILER, trailers);
        }
    }
    if stripped.te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        // Appended: a forwarded protocol switch has its `Connection: upgrade` there.
        headers.append(header::CONNECTION, HeaderValue::from_static("te"));
    }
    stripped.te_trailers
}

/// Turns a request [`prepare`] made for HTTP/1.1 into one for an HTTP/2 connection: the
/// `Host` it carries becomes `:authority` (RFC 9113 §8.3.1: a client that makes HTTP/2
/// requests uses `:authority`, not `Host`), `scheme` becomes `:scheme`, and the framing
/// fields HTTP/2 forbids go (`Transfer-Encoding`; with `te_trailers`, the `Connection: te`
/// [`prepare`] sent beside its `TE: trailers`, which stays: RFC 9113 §8.2.2 allows it
/// alone, and gRPC servers require it). hyper's HTTP/2 client takes both pseudo-fields from an
/// absolute URI. An error: the `Host` is no authority (HTTP/1.1 servers may accept one,
/// `:authority` cannot carry it).
pub fn to_http2(
    parts: &mut http::request::Parts,
    scheme: &http::uri::Scheme,
    te_trailers: bool,
) -> Result<(), String> {
    parts.version = Version::HTTP_2;
    parts.headers.remove(header::TRANSFER_ENCODING);
    if te_trailers {
        // Its only one: `prepare` sends `Connection` otherwise for an upgrade alone, which
        // never goes to an HTTP/2 upstream.
        parts.headers.remove(header::CONNECTION);
    }
    let Some(host) = parts.headers.remove(header::HOST) else {
        return Err("a request without a host cannot go to an HTTP/2 upstream".into());
    };
    let authority = http::uri::Authority::try_from(host.as_bytes())
        .map_err(|_| "the request's Host is not a host[:port]".to_string())?;
    let target = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    parts.uri = Uri::builder()
        .scheme(scheme.clone())
        .authority(authority)
        .path_and_query(target)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// What [`prepare`] looks for in one pass over the field names.
#[derive(Default)]
struct Seen {
    host: bool,
    /// Which of the fields that are never forwarded as they came are there: bit 0
    /// `Content-Length`, 1 `Expect`, 2 `X-Forwarded-Proto`, 3 `X-Forwarded-Host`, 4
    /// `Forwarded`, 5 `X-Original-URL` or `X-Rewrite-URL`, 6 one of [`CLIENT_CLAIMS`]
    /// (forwarded as they came from a trusted peer).
    remove: u8,
    forwarded_for: bool,
    /// A `Cookie` field (an HTTP/2 client may have split its cookies into several).
    cookie: bool,
}

/// The scheme a trusted peer's own hop wrote in `X-Forwarded-Proto`: the last element of
/// its last field, as it appends its own after any the client sent (HAProxy's
/// `add-header`, a list), and the client's would come first, where most apps read. `None`
/// when that is no scheme: ours goes then. Only the scheme: its `X-Forwarded-Host` and
/// `Forwarded` would name a host that routes and keys, read from `Host`, never saw, so
/// that two tenants behind one balancer could share a key there.
fn trusted_scheme(headers: &HeaderMap) -> Option<&'static str> {
    let last = headers.get_all(&X_FORWARDED_PROTO).iter().next_back()?;
    let element = last.as_bytes().rsplit(|&b| b == b',').next()?.trim_ascii();
    if element.eq_ignore_ascii_case(b"https") {
        Some("https")
    } else if element.eq_ignore_ascii_case(b"http") {
        Some("http")
    } else {
        None
    }
}

/// Joins the request's `Cookie` fields into one, with `; ` between them. RFC 9113 §8.2.3:
/// an HTTP/2 client may send its cookies as separate fields, which MUST be joined before
/// they go into HTTP/1.1; RFC 6265 §5.4 allows one `Cookie` field there, and an app that
/// reads only the first would miss the rest.
fn join_cookies(headers: &mut HeaderMap) {
    let mut fields = headers.get_all(header::COOKIE).iter();
    if fields.nth(1).is_none() {
        return;
    }
    let mut joined = Vec::new();
    for (i, value) in headers.get_all(header::COOKIE).iter().enumerate() {
        if i > 0 {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(value.as_bytes());
    }
    // Made of valid values and "; ", so valid itself.
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, value);
    }
}

/// The checks on an answer head that hyper's client leaves to its user, in one pass over
/// its fields (this runs on every answer). An error says why the answer is refused
/// although hyper took it; the request went out, so its outcome is unknown:
/// - `101 Switching Protocols` to a request that asked for no upgrade (RFC 9110 §15.2.2:
///   a server switches only to a protocol the client named). hyper hands such a head over
///   as an answer; passed on, the client got a 101 it never asked for, and a protected
///   route released its key (101 is no replayable status), so a retry ran again.
/// - framed both ways, or with a transfer coding besides `chunked` (RFC 9112 §6.3 says
///   to treat both as an error: they may be an attempt to desynchronise, and gzip under
///   the chunks would reach the client unmarked). Bodiless answers end at their head
///   whatever they say.
///
/// An answer it keeps has one `Content-Length` at most: see [`one_content_length`].
pub fn check_answer(
    method: &Method,
    status: StatusCode,
    headers: &mut HeaderMap,
    upgrade_asked: bool,
) -> Result<(), &'static str> {
    if status == StatusCode::SWITCHING_PROTOCOLS && !upgrade_asked {
        return Err("the upstream switched protocols unasked");
    }
    let mut coded = false;
    let mut lengths = 0;
    let mut plain = true;
    for (name, value) in headers.iter() {
        if name == header::CONTENT_LENGTH {
            lengths += 1;
            plain &= !value.is_empty() && value.as_bytes().iter().all(u8::is_ascii_digit);
        } else if name == header::TRANSFER_ENCODING {
            coded = true;
        }
    }
    if coded && !bodiless(method, status) {
        let codings = headers.get_all(header::TRANSFER_ENCODING);
        if lengths > 0 || !is_chunked_alone(codings.iter().map(|v| v.as_bytes())) {
            return Err("the upstream's answer is framed both ways or coded besides chunked");
        }
    }
    if lengths > 1 || !plain {
        one_content_length(headers);
    }
    Ok(())
}

/// Whether an answer with `status` to `method` ends at its head, whatever follows it
/// (RFC 9110 §6.4.1): HTTP/1.1 frames it so; HTTP/2 leaves it to the endpoints.
pub fn bodiless(method: &Method, status: StatusCode) -> bool {
    *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// Makes an answer's `Content-Length` one number. hyper's client reads a list of equal
/// lengths (`1,1`, or the field twice) as that one length, as RFC 9112 §6.3 allows, but
/// leaves the field as it came; passed on (and stored, and replayed), a stricter client
/// downstream might refuse the list or read it otherwise. So the list goes on as the one
/// value; a field that is not a length at all (only a bodiless answer, which hyper does
/// not frame by it, gets that far) goes on not at all.
fn one_content_length(headers: &mut HeaderMap) {
    let mut length = None;
    let mut agreed = true;
    for field in &headers.get_all(header::CONTENT_LENGTH) {
        for item in field.as_bytes().split(|&b| b == b',') {
            let n = std::str::from_utf8(item.trim_ascii())
                .ok()
                .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|t| t.parse::<u64>().ok());
            match (n, length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(seen)) if n == seen => {}
                _ => agreed = false,
            }
        }
    }
    match length.filter(|_| agreed) {
        Some(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        None => {
            headers.remove(header::CONTENT_LENGTH);
        }
    }
}

/// Whether the upstream lets the connection carry another request after this answer.
pub fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    let mut close = false;
    let mut keep_alive = false;
    for value in headers.get_all(header::CONNECTION) {
        for token in value
            .as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
        {
            close |= token.eq_ignore_ascii_case(b"close");
            keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
        }
    }
    !close && (version == Version::HTTP_11 || keep_alive)
}

/// Whether a request carries a credential whose scheme authenticates the connection rather
/// than the request: NTLM and Negotiate (IIS's Windows authentication). The upstream runs
/// every later request on that connection as the user who authenticated it, whoever sent
/// it, so the connection is never pooled for another request. This breaks the NTLM
/// handshake (its last step must come on the connection of its challenge): it fails as a
/// `401`, never as another caller's answer.
pub fn authenticates_connection(headers: &HeaderMap) -> bool {
    headers.get_all(header::AUTHORIZATION).iter().any(|value| {
        let value = value.as_bytes().trim_ascii_start();
        let scheme = value
            .split(|b| b.is_ascii_whitespace())
            .next()
            .unwrap_or_default();
        scheme.eq_ignore_ascii_case(b"ntlm") || scheme.eq_ignore_ascii_case(b"negotiate")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::headers::Hop;

    fn with_lengths(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::CONTENT_LENGTH, HeaderValue::from_str(v).unwrap());
        }
        headers
    }

    fn lengths(headers: &HeaderMap) -> Vec<&str> {
        headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn a_list_of_one_length_goes_on_as_that_length() {
        for list in [&["1,1"][..], &["1", "1"], &["1 , 1,1"], &["0001"]] {
            let mut headers = with_lengths(list);
            check_answer(&Method::POST, StatusCode::OK, &mut headers, false).unwrap();
            let expected: &[&str] = if list == ["0001"] { &["0001"] } else { &["1"] };
            assert_eq!(lengths(&headers), expected, "{list:?}");
        }
    }

    #[test]
    fn a_length_that_is_no_number_is_dropped() {
        for list in [&["1,2"][..], &["1", "2"], &["+1"], &["1,"], &[""], &["x"]] {
            let mut headers = with_lengths(list);
            check_answer(&Method::HEAD, StatusCode::OK, &mut headers, false).unwrap();
            assert!(lengths(&headers).is_empty(), "{list:?}");
        }
    }

    #[test]
    fn an_unasked_protocol_switch_is_refused() {
        let mut headers = HeaderMap::new();
        let switch = StatusCode::SWITCHING_PROTOCOLS;
        assert!(check_answer(&Method::POST, switch, &mut headers, false).is_err());
        assert!(check_answer(&Method::GET, switch, &mut headers, true).is_ok());
        assert!(check_answer(&Method::POST, StatusCode::CREATED, &mut headers, false).is_ok());
    }

    #[test]
    fn an_answer_framed_both_ways_or_coded_otherwise_is_refused() {
        let mut both = with_lengths(&["3"]);
        both.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert!(check_answer(&Method::POST, StatusCode::OK, &mut both, false).is_err());
        // A bodiless answer ends at its head whatever it says.
        assert!(check_answer(&Method::HEAD, StatusCode::OK, &mut both, false).is_ok());
        let mut gzip = HeaderMap::new();
        gzip.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        assert!(check_answer(&Method::POST, StatusCode::OK, &mut gzip, false).is_err());
        let mut chunked = HeaderMap::new();
        chunked.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert!(check_answer(&Method::POST, StatusCode::OK, &mut chunked, false).is_ok());
    }

    /// `headers` made ready for the upstream from a peer trusted or not.
    fn prepared(headers: &[(&str, &str)], trusted_peer: bool) -> HeaderMap {
        let mut request = http::Request::get("/").header(header::HOST, "backend:8080");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        let client_ip = HeaderValue::from_static("10.0.0.1");
        let forwarding = Forwarding {
            client_ip: &client_ip,
            proto: "http",
            hop: Hop {
                upgrade: false,
                trusted_peer,
            },
        };
        prepare(&mut parts, &ProxyBody::empty(), &forwarding, || None);
        parts.headers
    }

    /// A trusted peer's scheme goes on, as the last element its own hop appended; its host
    /// and `Forwarded` never do (routes and keys read `Host`), nor any other peer's.
    #[test]
    fn only_a_trusted_peers_own_scheme_goes_on() {
        let balancer = [
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "shop.example"),
            ("forwarded", "proto=https;host=shop.example"),
        ];
        for trusted_peer in [true, false] {
            let h = prepared(&balancer, trusted_peer);
            let proto = if trusted_peer { "https" } else { "http" };
            assert_eq!(h.get_all(&X_FORWARDED_PROTO).iter().count(), 1);
            assert_eq!(h[&X_FORWARDED_PROTO], proto, "trusted: {trusted_peer}");
            assert_eq!(h[&X_FORWARDED_HOST], "backend:8080");
            assert!(!h.contains_key(header::FORWARDED));
            assert_eq!(h[&X_FORWARDED_FOR], "10.0.0.1");
        }
        // The client's own comes first, the balancer's appended after it, as a second
        // field or in one list: the balancer's goes on.
        let appended = [
            ("x-forwarded-proto", "http"),
            ("x-forwarded-proto", "https"),
        ];
        assert_eq!(prepared(&appended, true)[&X_FORWARDED_PROTO], "https");
        let listed = [("x-forwarded-proto", "javascript, HTTPS ")];
        assert_eq!(prepared(&listed, true)[&X_FORWARDED_PROTO], "https");
        // No scheme, or one its `Connection` named (for the hop to here): ours.
        let bogus = [("x-forwarded-proto", "https, gopher")];
        assert_eq!(prepared(&bogus, true)[&X_FORWARDED_PROTO], "http");
        let hop = [
            ("connection", "x-forwarded-proto"),
            ("x-forwarded-proto", "https"),
        ];
        assert_eq!(prepared(&hop, true)[&X_FORWARDED_PROTO], "http");
    }

    /// What a client says of its own scheme, port or address in the fields Rack and
    /// others read besides `X-Forwarded-Proto` goes on from a trusted peer only.
    #[test]
    fn only_a_trusted_peers_client_claims_go_on() {
        let names = [
            "x-forwarded-ssl",
            "x-forwarded-scheme",
            "x-forwarded-port",
            "x-forwarded-protocol",
            "front-end-https",
            "x-real-ip",
            "true-client-ip",
            "cf-connecting-ip",
            "fastly-client-ip",
            "client-ip",
            "x-client-ip",
            "x-cluster-client-ip",
            "x-forwarded",
            "forwarded-for",
            "x-appengine-user-ip",
            "fly-client-ip",
        ];
        let claims: Vec<_> = names.iter().map(|&n| (n, "on")).collect();
        let from_trusted = prepared(&claims, true);
        let from_client = prepared(&claims, false);
        for name in names {
            assert_eq!(from_trusted[name], "on", "{name}");
            assert!(!from_client.contains_key(name), "{name}");
        }
    }
}
