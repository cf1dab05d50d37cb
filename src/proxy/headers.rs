//! Header hygiene between client and upstream: hop-by-hop headers removed (RFC 9110 §7.6.1,
//! including every header named in `Connection`), `Host` kept, `X-Forwarded-*` added.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const HOP_BY_HOP_COUNT: usize = 8;

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
];

/// The `X-Forwarded-*` headers.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// See [`X_FORWARDED_FOR`].
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// See [`X_FORWARDED_FOR`].
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Removes hop-by-hop headers. With `keep_upgrade`, `Upgrade` and `Connection: upgrade`
/// survive, since forwarding a protocol switch is exactly what they are for.
///
/// This runs on every request and every answer, so it looks before it removes: one pass
/// over the few names a message has says which hop-by-hop headers are there (a removal
/// hashes its name), and the common `Connection` tokens (`keep-alive`, `close`,
/// `upgrade`) are recognised without building a header name for them.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Bit i: HOP_BY_HOP[i] is present; bit UPGRADE_BIT: `Upgrade` is.
    const UPGRADE_BIT: usize = HOP_BY_HOP_COUNT;
    let mut present = 0u32;
    for name in headers.keys() {
        // A `match` on the (always lowercase) name compiles to a length switch and one
        // comparison, cheaper than comparing with each name in turn.
        let bit = match name.as_str() {
            "connection" => 0,
            "keep-alive" => 1,
            "proxy-connection" => 2,
            "proxy-authenticate" => 3,
            "proxy-authorization" => 4,
            "te" => 5,
            "trailer" => 6,
            "transfer-encoding" => 7,
            "upgrade" => UPGRADE_BIT,
            _ => continue,
        };
        present |= 1 << bit;
    }
    if present == 0 {
        return;
    }
    // HOP_BY_HOP[0] is `Connection`: the headers it names go too.
    let mut listed = Vec::new();
    if present & 1 != 0 {
        for token in headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
        {
            let known = ["keep-alive", "close", "upgrade", ""]
                .iter()
                .any(|t| token.eq_ignore_ascii_case(t));
            if !known {
                if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                    listed.push(name);
                }
            }
        }
    }
    for name in listed {
        headers.remove(name);
    }
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
}

/// Whether an HTTP/1.1 request asks to switch protocols (e.g. WebSocket).
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Prepares request headers for the upstream: hop-by-hop removed, `Expect` answered here
/// rather than forwarded, `Host` kept (filled from the URI for HTTP/2 clients), and
/// `X-Forwarded-For` appended, `X-Forwarded-Proto`/`-Host` set.
pub fn prepare_request(
    headers: &mut HeaderMap,
    authority: Option<&http::uri::Authority>,
    client_ip: &HeaderValue,
    proto: &'static str,
    upgrade: bool,
) {
    strip_hop_by_hop(headers, upgrade);
    headers.remove(header::EXPECT);
    if !headers.contains_key(header::HOST) {
        if let Some(value) = authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
            headers.insert(header::HOST, value);
        }
    }
    let ip = client_ip.as_bytes();
    let value = match headers.get(&X_FORWARDED_FOR) {
        Some(previous) => {
            let mut joined = Vec::with_capacity(previous.len() + 2 + ip.len());
            joined.extend_from_slice(previous.as_bytes());
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(ip);
            HeaderValue::from_maybe_shared(bytes::Bytes::from(joined))
        }
        None => Ok(client_ip.clone()),
    };
    if let Ok(value) = value {
        headers.insert(X_FORWARDED_FOR.clone(), value);
    }
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
    if let Some(host) = headers.get(header::HOST).cloned() {
        headers.insert(X_FORWARDED_HOST.clone(), host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("shop.example"));
        h.insert(&X_FORWARDED_FOR, HeaderValue::from_static("203.0.113.9"));
        let ip = HeaderValue::from_static("127.0.0.1");
        prepare_request(&mut h, None, &ip, "http", false);
        assert_eq!(h[&X_FORWARDED_FOR], "203.0.113.9, 127.0.0.1");
        assert_eq!(h[&X_FORWARDED_HOST], "shop.example");
        assert_eq!(h[&X_FORWARDED_PROTO], "http");
        assert_eq!(h[header::HOST], "shop.example");
    }
}
