//! Header hygiene between client and upstream: hop-by-hop headers removed (RFC 9110 §7.6.1,
//! including every header named in `Connection`), `Host` kept, `X-Forwarded-*` added.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const HOP_BY_HOP_COUNT: usize = 9;

/// Headers that describe one connection, never forwarded (in the order of the bits
/// [`strip_hop_by_hop`] keeps).
static HOP_BY_HOP: [HeaderName; HOP_BY_HOP_COUNT] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    HeaderName::from_static("http2-settings"),
];

/// The `X-Forwarded-*` headers.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// See [`X_FORWARDED_FOR`].
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// See [`X_FORWARDED_FOR`].
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// The path a request was sent to before a front server rewrote it, which IIS's URL
/// Rewrite sets and the apps behind it (and old Symfony) dispatch by instead of the
/// target: never a client's to say.
pub static X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
/// See [`X_ORIGINAL_URL`] (Zend's and old Symfony's spelling).
pub static X_REWRITE_URL: HeaderName = HeaderName::from_static("x-rewrite-url");

/// What other proxies tell an app of its client's scheme, port and address, besides the
/// `X-Forwarded-*` fields this proxy sets: Rack reads `X-Forwarded-Ssl` and
/// `X-Forwarded-Scheme` before `X-Forwarded-Proto`, gunicorn's `secure_scheme_headers`
/// `X-Forwarded-Protocol` and Microsoft's `Front-End-Https`; apps take `X-Real-IP`
/// (nginx's), `True-Client-IP` (Cloudflare's, Akamai's), `CF-Connecting-IP`,
/// `Fastly-Client-IP`, `Client-IP` (Rails's `remote_ip`), `X-Client-IP`,
/// `X-Cluster-Client-IP`, `X-Forwarded` or `Forwarded-For` (Node's `request-ip` reads
/// each of these address fields but `Client-IP`), `X-AppEngine-User-IP` (Google App
/// Engine's) or `Fly-Client-IP` (Fly.io's) for the client. A peer in `trusted_proxies` may say them; from any other
/// they are a client naming itself.
pub static CLIENT_CLAIMS: [HeaderName; 16] = [
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-protocol"),
    HeaderName::from_static("front-end-https"),
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("true-client-ip"),
    HeaderName::from_static("cf-connecting-ip"),
    HeaderName::from_static("fastly-client-ip"),
    HeaderName::from_static("client-ip"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("x-cluster-client-ip"),
    HeaderName::from_static("x-forwarded"),
    HeaderName::from_static("forwarded-for"),
    HeaderName::from_static("x-appengine-user-ip"),
    HeaderName::from_static("fly-client-ip"),
];

/// What [`strip_hop_by_hop`] removed that its caller may send again on its own terms.
#[derive(Debug, Default)]
pub struct Stripped {
    /// The names the message declared in `Trailer` that may go on
    /// ([`is_forwardable_trailer`]), as one value. `Trailer` is end-to-end (RFC 9110
    /// §6.6.2) but only true of a body whose framing can carry trailers, which the caller
    /// knows and this does not; and hyper sends only the trailer fields it names.
    pub declared_trailers: Option<HeaderValue>,
    /// `TE` listed `trailers`: the sender can take trailers on this hop (§10.1.4).
    pub te_trailers: bool,
}

/// Removes hop-by-hop headers, `Trailer` among them (see [`Stripped`] for putting it
/// back). With `keep_upgrade`, `Upgrade` and `Connection: upgrade` survive, since
/// forwarding a protocol switch is exactly what they are for.
///
/// This runs on every request and every answer, so it looks before it removes: one pass
/// over the few names a message has says which hop-by-hop headers are there (a removal
/// hashes its name), and the common `Connection` tokens (`keep-alive`, `close`,
/// `upgrade`) are recognised without building a header name for them. A message with
/// neither `Trailer` nor `TE` costs nothing more for the [`Stripped`] it returns.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) -> Stripped {
    let mut present = 0u32;
    for name in headers.keys() {
        if let Some(bit) = hop_by_hop_bit(name.as_str()) {
            present |= 1 << bit;
        }
    }
    if present == 0 {
        return Stripped::default();
    }
    // Read before `Connection` is: `TE` must be named there (§10.1.4), and is then
    // removed with the other headers it names.
    let te_trailers = present & (1 << TE_BIT) != 0 && asks_for_trailers(headers);
    // HOP_BY_HOP[0] is `Connection`: the headers it names go too.
    let mut listed = Vec::new();
    if present & 1 != 0 {
        for token in headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
        {
            // `Host` is for every recipient (RFC 9110 §7.6.1 forbids naming such a field):
            // dropped, the upstream would get an HTTP/1.1 request without one, read by its
            // default host rather than the one the request was routed by.
            if !is_connection_option(token) && !token.eq_ignore_ascii_case(b"host") {
                if let Ok(name) = HeaderName::from_bytes(token) {
                    listed.push(name);
                }
            }
        }
    }
    for name in listed {
        headers.remove(name);
    }
    // Read after: a `Trailer` that `Connection` named was for the last hop only.
    let declared_trailers = (present & (1 << TRAILER_BIT) != 0)
        .then(|| forwardable_trailer_names(headers))
        .flatten();
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else if present & (1 << UPGRADE_BIT) != 0 {
        headers.remove(header::UPGRADE);
    }
    Stripped {
        declared_trailers,
        te_trailers,
    }
}

/// [`hop_by_hop_bit`] of `TE`.
const TE_BIT: usize = 5;
/// [`hop_by_hop_bit`] of `Trailer`.
const TRAILER_BIT: usize = 6;

/// Whether the message's `TE` lists `trailers` (a `;q=` after it allowed).
fn asks_for_trailers(headers: &HeaderMap) -> bool {
    headers.get_all(header::TE).iter().any(|v| {
        v.as_bytes().split(|&b| b == b',').any(|t| {
            let coding = t.split(|&b| b == b';').next().unwrap_or(t);
            coding.trim_ascii().eq_ignore_ascii_case(b"trailers")
        })
    })
}

/// The names of the message's `Trailer` fields that may go on ([`is_forwardable_trailer`]),
/// as one value; `None` if none may.
fn forwardable_trailer_names(headers: &HeaderMap) -> Option<HeaderValue> {
    trailer_names_kept(headers, is_forwardable_trailer)
}

/// The names of the message's `Trailer` fields that `keep` keeps (valid names only), as
/// one value; `None` if it keeps none.
pub fn trailer_names_kept(
    headers: &HeaderMap,
    keep: impl Fn(&HeaderName) -> bool,
) -> Option<HeaderValue> {
    let names: Vec<&str> = headers
        .get_all(header::TRAILER)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .map(str::trim)
        .filter(|name| HeaderName::from_bytes(name.as_bytes()).is_ok_and(|n| keep(&n)))
        .collect();
    if names.is_empty() {
        return None;
    }
    HeaderValue::from_str(&names.join(", ")).ok()
}

/// The bit of a hop-by-hop header in [`strip_hop_by_hop`]'s scan: `i` for `HOP_BY_HOP[i]`,
/// [`UPGRADE_BIT`] for `Upgrade`; `None` for every other name (lowercase, as
/// [`HeaderName`] keeps it). The one list of hop-by-hop names the code matches on.
fn hop_by_hop_bit(name: &str) -> Option<usize> {
    // A `match` on the name compiles to a length switch and one comparison, cheaper than
    // comparing with each name in turn.
    Some(match name {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        // Connection-specific by definition (RFC 7540 §3.2.1), named in `Connection` or not.
        "http2-settings" => 8,
        "upgrade" => UPGRADE_BIT,
        _ => return None,
    })
}

/// [`hop_by_hop_bit`] of `Upgrade`, after the bits of [`HOP_BY_HOP`].
const UPGRADE_BIT: usize = HOP_BY_HOP_COUNT;

/// Whether `name` (lowercase, as [`HeaderName`] keeps it) is a hop-by-hop header that
/// [`strip_hop_by_hop`] removes without `keep_upgrade`, `Connection` and `Upgrade` included.
pub fn is_hop_by_hop(name: &str) -> bool {
    hop_by_hop_bit(name).is_some()
}

/// Whether a `Connection` token is a connection option rather than the name of a header
/// to remove (`keep-alive`, `close`, `upgrade`, or empty between commas).
fn is_connection_option(token: &[u8]) -> bool {
    token.is_empty()
        || token.eq_ignore_ascii_case(b"keep-alive")
        || token.eq_ignore_ascii_case(b"close")
        || token.eq_ignore_ascii_case(b"upgrade")
}

/// Whether every token of a `Connection` value is a connection option: then dropping the
/// field drops all it governs.
pub fn connection_names_no_header(value: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .all(|token| is_connection_option(token.trim_ascii()))
}

/// Whether any of a message's `Connection` fields names other headers, which must then be
/// removed with it ([`strip_hop_by_hop`]); every field counts, not just the first.
pub fn connection_names_headers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| !connection_names_no_header(v.as_bytes()))
}

/// Whether an HTTP/1.1 request asks to switch protocols (e.g. WebSocket) to a protocol
/// whose switch this proxy forwards: any but HTTP itself ([`upgrades_to_http`]).
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && connection_has(headers, "upgrade")
        && !upgrades_to_http(headers)
}

/// Whether `Upgrade` offers HTTP itself (`h2c`, `h2`, their drafts' `h2c-14`, `HTTP/2.0`):
/// a switch the proxy never forwards. An upstream that took it (Jetty's h2c upgrade does,
/// for one) would give the client an HTTP connection of its own spliced past the proxy, on
/// which every request, to protected routes too, runs unseen ("h2c smuggling"). Such a
/// request goes on as a plain one, without its upgrade fields.
fn upgrades_to_http(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|protocol| {
            let protocol = protocol.trim_ascii();
            let name = protocol.split(|&b| b == b'/').next().unwrap_or(protocol);
            name.trim_ascii()
        })
        .any(|name| name.eq_ignore_ascii_case(b"http") || names_http2(name))
}

/// `h2c`, `h2`, or one of their drafts' names (`h2c-14` … `h2c-17`, `h2-14`), which
/// servers still upgrade on: Apache's mod_http2 takes `h2c-14` and `h2c-16`, Jetty
/// `h2c-14` to `h2c-17` when configured with them.
fn names_http2(name: &[u8]) -> bool {
    let base = match name.iter().position(|&b| b == b'-') {
        Some(dash) => &name[..dash],
        None => name,
    };
    base.eq_ignore_ascii_case(b"h2c") || base.eq_ignore_ascii_case(b"h2")
}

/// Whether any `Connection` field lists `option` (`close`, `upgrade`, …).
pub fn connection_has(headers: &HeaderMap, option: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(option))
}

/// One element of a `Content-Length` list (`5` of `5, 5`): digits, ASCII whitespace
/// around them allowed (as hyper's client reads it: a no-break space is no whitespace to
/// it but a byte that makes the field invalid). The one rule for reading a length, in the
/// answer parser and the answer writer, so the writer never refuses a length the parser
/// let through.
pub fn parse_length(item: &[u8]) -> Option<u64> {
    let digits = item.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// What the proxy adds to a request it forwards.
#[derive(Debug, Clone, Copy)]
pub struct Forwarding<'a> {
    /// The TCP peer's address, appended to the `X-Forwarded-For` received (as nginx's
    /// `$proxy_add_x_forwarded_for`): the right-most entry is always one this proxy saw,
    /// and an upstream reads the client as idemgate does, right to left past its proxies.
    pub client_ip: &'a HeaderValue,
    /// `http` or `https`, for `X-Forwarded-Proto`.
    pub proto: &'static str,
    /// What the request's handler decided.
    pub hop: Hop,
}

/// What a request's handler decided about how it goes on, beyond its head: passed per
/// request, as a reload may change whether its peer is trusted between two requests on one
/// connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hop {
    /// A protocol switch is forwarded: `Upgrade` is kept and `Connection: upgrade` sent.
    pub upgrade: bool,
    /// The TCP peer is in `trusted_proxies` of the config serving the request: the scheme
    /// it sent in `X-Forwarded-Proto` goes on (a TLS-terminating balancer's `https` is the
    /// scheme the client used; ours would say `http` and send the app into redirect loops).
    pub trusted_peer: bool,
}

/// Names `trailers` in a `Trailer` field of `headers`: hyper's HTTP/1.1 server sends only
/// the trailer fields its answer declared (and only to a request with `TE: trailers`).
pub fn declare_trailers(headers: &mut HeaderMap, trailers: &HeaderMap) {
    let names: Vec<&str> = trailers.keys().map(HeaderName::as_str).collect();
    if let Ok(value) = HeaderValue::from_str(&names.join(", ")) {
        headers.insert(header::TRAILER, value);
    }
}

/// Whether a trailer field may go on: not a hop-by-hop one (RFC 9110 §7.6.1), nor one only
/// a header section may carry (§6.5.1: framing, routing, authentication, request
/// modifiers, what the content is), nor one that says where a request came from
/// (`X-Forwarded-*`, `Forwarded`, [`CLIENT_CLAIMS`]) or which path it is for
/// (`X-Original-URL`, `X-Rewrite-URL`). A recipient that merges
/// trailers into the header section would otherwise take them as the message's own: a
/// second `Host`, a length, a client address.
pub fn is_forwardable_trailer(name: &HeaderName) -> bool {
    let name = name.as_str();
    !is_hop_by_hop(name)
        && !matches!(
            name,
            "host"
                | "content-length"
                | "content-type"
                | "content-encoding"
                | "content-range"
                | "authorization"
                | "cookie"
                | "set-cookie"
                | "expect"
                | "max-forwards"
                | "range"
                | "cache-control"
                | "forwarded"
                | "x-forwarded-for"
                | "x-forwarded-proto"
                | "x-forwarded-host"
                | "x-original-url"
                | "x-rewrite-url"
        )
        && !CLIENT_CLAIMS.iter().any(|claim| claim.as_str() == name)
}

/// Whether `Transfer-Encoding` field values (all of a message's, in order) name `chunked`
/// alone: the one coding this proxy decodes, so the body it passes on is the body that
/// was sent. Empty list items are skipped, as RFC 9110 §5.6.1 allows, except as the last
/// item: hyper reads the last item as the final coding, so to it `chunked,` (or a last
/// field left empty) is no chunked body but one read to the close, and the two readings
/// of one answer would differ.
pub fn is_chunked_alone<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let mut codings = 0;
    let mut last_is_chunked = false;
    for item in values
        .into_iter()
        .flat_map(|value| value.split(|&b| b == b','))
    {
        let coding = item.trim_ascii();
        codings += usize::from(!coding.is_empty());
        last_is_chunked = coding.eq_ignore_ascii_case(b"chunked");
    }
    codings == 1 && last_is_chunked
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trailer naming the client (a recipient may merge it into the header section) never
    /// goes on, whichever proxy's spelling it takes.
    #[test]
    fn no_client_claim_goes_on_as_a_trailer() {
        let spellings = [
            "x-forwarded-protocol",
            "front-end-https",
            "cf-connecting-ip",
        ];
        let more = [
            "client-ip",
            "x-client-ip",
            "fastly-client-ip",
            "x-cluster-client-ip",
            "x-forwarded",
            "forwarded-for",
            "x-appengine-user-ip",
            "fly-client-ip",
        ];
        for name in spellings.into_iter().chain(more) {
            assert!(CLIENT_CLAIMS.iter().any(|n| n == name), "{name}");
        }
        for name in CLIENT_CLAIMS
            .iter()
            .chain([&X_FORWARDED_FOR, &X_FORWARDED_PROTO])
        {
            assert!(!is_forwardable_trailer(name), "{name}");
        }
    }

    #[test]
    fn connection_listed_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    /// `Trailer` goes as a hop-by-hop field does, its forwardable names given back to put
    /// again; `TE: trailers` is seen even when `Connection` names `TE`, as it must.
    #[test]
    fn declared_trailers_and_te_trailers_are_given_back() {
        assert_eq!(hop_by_hop_bit("te"), Some(TE_BIT));
        assert_eq!(hop_by_hop_bit("trailer"), Some(TRAILER_BIT));
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("TE"));
        h.insert(header::TE, HeaderValue::from_static("gzip, Trailers;q=1"));
        h.append(
            header::TRAILER,
            HeaderValue::from_static("x-sum, content-length"),
        );
        h.append(header::TRAILER, HeaderValue::from_static("grpc-status,te"));
        let stripped = strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
        assert!(stripped.te_trailers);
        assert_eq!(stripped.declared_trailers.unwrap(), "x-sum, grpc-status");
        // Named in `Connection`, `Trailer` was for the last hop only.
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("trailer"));
        h.insert(header::TRAILER, HeaderValue::from_static("x-sum"));
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        let stripped = strip_hop_by_hop(&mut h, false);
        assert!(stripped.declared_trailers.is_none() && !stripped.te_trailers);
        let mut h = HeaderMap::new();
        h.insert(header::TRAILER, HeaderValue::from_static("set-cookie"));
        assert!(strip_hop_by_hop(&mut h, false).declared_trailers.is_none());
    }

    #[test]
    fn a_connection_option_naming_host_keeps_it() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Host, x-a"));
        h.insert(header::HOST, HeaderValue::from_static("shop.example"));
        h.insert("x-a", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert_eq!(h[header::HOST], "shop.example");
    }

    #[test]
    fn a_lone_hop_by_hop_header_is_removed_and_the_rest_kept() {
        // Every name of the list, so the `match` in strip_hop_by_hop and HOP_BY_HOP cannot
        // drift apart (a name mapped to another's bit would survive here).
        for name in HOP_BY_HOP.iter().chain([&header::UPGRADE]) {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static("shop.example"));
            h.insert(name, HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut h, false);
            assert_eq!(h.len(), 1, "{name} survived");
            assert!(h.contains_key(header::HOST));
            assert!(
                is_hop_by_hop(name.as_str()),
                "{name} is not in is_hop_by_hop"
            );
        }
        assert!(!is_hop_by_hop("host"));
        assert!(connection_names_no_header(b"Keep-Alive, close,upgrade"));
        assert!(!connection_names_no_header(b"keep-alive, X-Secret"));
    }

    /// A second `Connection` field counts as much as the first: a check of only the first
    /// would forward the header the second one names.
    #[test]
    fn every_connection_field_is_looked_at() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        assert!(!connection_names_headers(&h));
        h.append(header::CONNECTION, HeaderValue::from_static("X-Secret"));
        h.insert("x-secret", HeaderValue::from_static("s"));
        assert!(connection_names_headers(&h));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty());
    }

    #[test]
    fn an_upgrade_to_http_itself_is_not_wanted() {
        for offer in ["h2c", "websocket, H2C", "HTTP/2.0", "h2", "http/1.1"] {
            let mut h = HeaderMap::new();
            h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            h.insert(header::UPGRADE, HeaderValue::from_str(offer).unwrap());
            assert!(!wants_upgrade(&h), "{offer}");
        }
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(&h));
    }

    /// The draft names of HTTP/2 (`h2c-14` … `h2c-17`, `h2-14`), which Apache's mod_http2,
    /// Jetty and others still upgrade on, are HTTP itself too.
    #[test]
    fn an_upgrade_to_a_draft_of_http2_is_not_wanted() {
        for offer in ["h2c-14", "h2c-16", "H2C-17", "websocket, h2c-14", "h2-14"] {
            let mut h = HeaderMap::new();
            h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            h.insert(header::UPGRADE, HeaderValue::from_str(offer).unwrap());
            assert!(!wants_upgrade(&h), "{offer}");
        }
    }

    #[test]
    fn upgrade_survives_only_when_forwarding_an_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        let mut kept = h.clone();
        strip_hop_by_hop(&mut kept, true);
        assert_eq!(kept[header::UPGRADE], "websocket");
        assert_eq!(kept[header::CONNECTION], "upgrade");
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty());
    }

    #[test]
    fn chunked_alone_is_chunked_as_hyper_reads_it_too() {
        let alone = |values: &[&str]| is_chunked_alone(values.iter().map(|v| v.as_bytes()));
        assert!(alone(&["chunked"]));
        assert!(alone(&["Chunked "]));
        assert!(alone(&[", chunked"]));
        assert!(alone(&["", "chunked"]));
        // hyper reads these as bodies to the close: its final coding is the empty one.
        assert!(!alone(&["chunked,"]));
        assert!(!alone(&["chunked , "]));
        assert!(!alone(&["chunked", ""]));
        assert!(!alone(&["chunked, chunked"]));
        assert!(!alone(&["gzip, chunked"]));
        assert!(!alone(&[""]));
    }
}
