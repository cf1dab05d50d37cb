//! Header hygiene between client and upstream: hop-by-hop headers removed (RFC 9110 §7.6.1,
//! including every header named in `Connection`), `Host` kept, `X-Forwarded-*` added.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one connection, never forwarded.
const HOP_BY_HOP: [HeaderName; 8] = [
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
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most requests carry no `Connection` header (HTTP/2 never does): skip the list then.
    if headers.contains_key(header::CONNECTION) {
        let listed: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .filter(|name| !(keep_upgrade && name == header::UPGRADE))
            .collect();
        for name in listed {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
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
    client_ip: IpAddr,
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
    // Written into a stack buffer: this runs for every request.
    let mut buf = [0u8; 64];
    let len = {
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        let _ = std::io::Write::write_fmt(&mut cursor, format_args!("{client_ip}"));
        cursor.position() as usize
    };
    let ip = &buf[..len];
    let value = match headers.get(&X_FORWARDED_FOR) {
        Some(previous) => {
            let mut joined = Vec::with_capacity(previous.len() + 2 + ip.len());
            joined.extend_from_slice(previous.as_bytes());
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(ip);
            HeaderValue::from_maybe_shared(bytes::Bytes::from(joined))
        }
        None => HeaderValue::from_bytes(ip),
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
        prepare_request(&mut h, None, "127.0.0.1".parse().unwrap(), "http", false);
        assert_eq!(h[&X_FORWARDED_FOR], "203.0.113.9, 127.0.0.1");
        assert_eq!(h[&X_FORWARDED_HOST], "shop.example");
        assert_eq!(h[&X_FORWARDED_PROTO], "http");
        assert_eq!(h[header::HOST], "shop.example");
    }
}
