//! Requests refused before routing: what HTTP/1.1 requires a server to refuse (RFC 9112
//! §3.2: no `Host` field, more than one, or one that is not a host) and what this proxy
//! does not forward (a `CONNECT` tunnel; a transfer coding besides `chunked`, RFC 9112
//! §6.1: hyper itself answers 400 to codings that do not end in `chunked`, so the ones
//! seen here are like `gzip, chunked`). Each of them would otherwise be routed or framed
//! one way here and another way upstream: the route chosen by one `Host` while the
//! upstream reads the other, or a gzip-coded body forwarded as if it were plain.

use http::header::{HOST, TRANSFER_ENCODING};
use http::{Method, Request, Version};

use crate::error::ProxyError;
use crate::proxy::headers::is_chunked_alone;

/// The host the request is routed by (its `Host` field, else its target's authority), or
/// why it is refused.
pub fn admit<B>(request: &Request<B>) -> Result<Option<&str>, ProxyError> {
    if request.method() == Method::CONNECT {
        return Err(ProxyError::NotImplemented(
            "CONNECT is not forwarded: this is a reverse proxy, not a tunnel",
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
    let host = match host {
        Some(value) => Some(host_value(value.as_bytes()).ok_or_else(|| {
            ProxyError::BadRequest("the request's Host field is not a host".into())
        })?),
        None => request.uri().host(),
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

/// A `Host` value as RFC 9110 §7.2 has it (`uri-host [ ":" port ]`, or empty), checked
/// byte by byte: anything else (a space, a list, userinfo, a path, non-ASCII) is a 400 by
/// RFC 9112 §3.2, since routes would match it differently from how the upstream reads it.
fn host_value(value: &[u8]) -> Option<&str> {
    if value.iter().all(|&b| HOST_BYTES[usize::from(b)]) {
        // ASCII only, so UTF-8.
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

/// The bytes a `Host` value may hold (reg-name's unreserved, sub-delims and `%`; IP
/// literals' brackets; the port's colon), looked up rather than compared in turn: this
/// runs on every request.
static HOST_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b':'
                    | b'['
                    | b']'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        b += 1;
    }
    table
};

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
            b"user@pay.example",
            b"pay.example/orders",
            b"pay.example\xe9",
            b"pay example",
        ] {
            let mut r = request("POST", Version::HTTP_11, &[]);
            r.headers_mut()
                .insert(HOST, http::HeaderValue::from_bytes(bad).unwrap());
            assert_eq!(refusal(&r), 400, "{:?}", String::from_utf8_lossy(bad));
        }
        for good in [
            "pay.example:8443",
            "[::1]:80",
            "10.0.0.1",
            "xn--bcher-kva.example",
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
}
