//! The routes a vector runs on and the bytes it sends there: the proxy's configuration,
//! [`Route`], and [`build`], which fills in a vector's placeholders for a route.

use crate::corpus::On;

pub(crate) const CONFIG: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
    max_body: 64B
  - name: open
    match: { path: /stream }
    idempotency: off
"#;

/// A route a vector runs on: its path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Route {
    Open,
    Orders,
}

impl Route {
    pub(crate) fn path(self) -> &'static str {
        match self {
            Route::Open => "/stream",
            Route::Orders => "/orders",
        }
    }
}

impl On {
    pub(crate) fn routes(self) -> &'static [Route] {
        match self {
            On::Open => &[Route::Open],
            On::Orders => &[Route::Orders],
            On::Both => &[Route::Open, Route::Orders],
        }
    }
}

/// The bytes of `raw` for `route`: `$P` and `$K` filled in, and the generated vectors
/// (too long to write out) built.
pub(crate) fn build(raw: &[u8], route: Route) -> Vec<u8> {
    let path = route.path();
    let generated = match raw {
        b"$LONG_TARGET" => Some(format!(
            "POST {path}?{} HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
            "q".repeat(70_000)
        )),
        // Far over hyper's 400 KiB read buffer for a head.
        b"$LONG_HEAD" => Some(format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\n$KX-Long: {}\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
            "h".repeat(512 * 1024)
        )),
        // Over the proxy's 128 KiB (`H1_BUFFER`), within hyper's default.
        b"$BIG_HEAD" => Some(format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\n$KX-Long: {}\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
            "h".repeat(200 * 1024)
        )),
        b"$LONG_EXT" => Some(format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;ext={}\r\nabc\r\n0\r\n\r\n",
            "e".repeat(64 * 1024)
        )),
        _ => None,
    };
    let raw = generated.as_ref().map_or(raw, |g| g.as_bytes());
    let mut out = Vec::with_capacity(raw.len() + 64);
    let mut keys = 0;
    let mut i = 0;
    while i < raw.len() {
        match &raw[i..] {
            [b'$', b'P', ..] => {
                out.extend_from_slice(path.as_bytes());
                i += 2;
            }
            [b'$', b'K', ..] => {
                keys += 1;
                out.extend_from_slice(format!("Idempotency-Key: k{keys}\r\n").as_bytes());
                i += 2;
            }
            [b, ..] => {
                out.push(*b);
                i += 1;
            }
            [] => unreachable!(),
        }
    }
    out
}
