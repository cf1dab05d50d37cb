//! Several requests on one HTTP/2 connection with their DATA frames interleaved: each
//! must reach the HTTP/1.1 upstream as its own request with its own body, and each
//! stream must get its own answer back (a stream answered with another's body is the
//! desync that stores one caller's answer under another's key). Seen by
//! `common::start_upstream`, whose `/orders…` answers carry the body it read.

use crate::common;
use crate::frames::{frame, header_block, DATA, END_HEADERS, END_STREAM};
use crate::run::H2;

/// The protected route, and an `idempotency: off` route the test upstream also echoes.
const CONFIG: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
    max_body: 64B
  - name: open
    match: { path: /orders/open }
    idempotency: off
"#;

/// One request of an interleaved run: its stream, path, key (none on the open route)
/// and body.
pub(crate) struct Req {
    pub(crate) stream: u32,
    pub(crate) path: &'static str,
    pub(crate) key: Option<&'static str>,
    pub(crate) body: &'static [u8],
}

/// Sends the HEADERS of every request of `reqs`, then their bodies as DATA frames of
/// `piece` bytes taken from each stream in turn, and gives each stream's status and the
/// body the upstream said it read; with the upstream, to count executions.
pub(crate) async fn run_interleaved(
    reqs: &[Req],
    piece: usize,
) -> (Vec<(Option<u16>, Option<String>)>, common::Upstream) {
    let upstream = common::start_upstream().await;
    let proxy = common::start_proxy(upstream.addr, CONFIG).await;
    let mut h2 = H2::open(proxy.addr).await;
    let mut out = Vec::new();
    for r in reqs {
        let mut fields = vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":authority".to_vec(), b"a".to_vec()),
            (b":path".to_vec(), r.path.as_bytes().to_vec()),
            (
                b"content-length".to_vec(),
                r.body.len().to_string().into_bytes(),
            ),
        ];
        if let Some(key) = r.key {
            fields.push((b"idempotency-key".to_vec(), key.as_bytes().to_vec()));
        }
        out.extend(frame(
            crate::frames::HEADERS,
            END_HEADERS,
            r.stream,
            &header_block(&fields),
        ));
    }
    let mut at = 0;
    while reqs.iter().any(|r| r.body.len() > at) {
        for r in reqs.iter().filter(|r| r.body.len() > at) {
            let end = (at + piece).min(r.body.len());
            let last = if end == r.body.len() { END_STREAM } else { 0 };
            out.extend(frame(DATA, last, r.stream, &r.body[at..end]));
        }
        at += piece;
    }
    h2.send(&out).await;
    let streams: Vec<u32> = reqs.iter().map(|r| r.stream).collect();
    let answers = h2
        .answers(&streams)
        .await
        .into_iter()
        .map(|(status, body)| {
            let read = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["body"].as_str().map(str::to_owned));
            (status, read)
        })
        .collect();
    (answers, upstream)
}
