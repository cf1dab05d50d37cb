//! The request direction of the differential test of issue 24: every request the encoder
//! writes (random methods, targets, fields and bodies, framed by length, by chunks, or not
//! at all, as `BodyFraming::of` picks) is parsed back by hyper's server, which must see the
//! same method, target, fields (with the framing field the encoder adds), body and
//! trailers, and nothing after the request.
//!
//! The body is put on the wire as `upload.rs` does it: raw after a length, or in chunks
//! of `chunk_line`s, with the last chunk carrying the declared forwardable trailers.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, TRAILER, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::encode::{chunk_line, encode_head, write_field, BodyFraming};
use crate::proxy::body::{BodyError, ProxyBody};
use crate::proxy::headers::is_forwardable_trailer;

/// Longer than anything takes on a paused clock that only advances when all tasks wait.
const STUCK: Duration = Duration::from_secs(3600);

/// A request as the encoder gets it, and its body.
#[derive(Debug, Clone)]
struct Sent {
    parts: http::request::Parts,
    /// How the body is given to `BodyFraming::of`.
    given: Given,
    body: Vec<u8>,
    /// Where the body is cut into chunks (if it goes in chunks).
    cuts: Vec<usize>,
    trailers: HeaderMap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Given {
    /// A body of known length.
    Sized,
    /// A body whose length is unknown until its end.
    Unsized,
}

/// A body of unknown length.
struct Unsized(Option<Bytes>);

impl Body for Unsized {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Poll::Ready(self.get_mut().0.take().map(|data| Ok(Frame::data(data))))
    }
}

/// What a request looks like to whoever parsed it.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    method: Method,
    target: String,
    fields: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    trailers: Vec<(String, Vec<u8>)>,
}

fn fields(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut fields: Vec<_> = headers
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    fields.sort();
    fields
}

/// The request's bytes as the hand-written client sends them, and what it means.
fn encode(sent: &Sent) -> (Vec<u8>, Seen) {
    let body = Bytes::from(sent.body.clone());
    let given = match sent.given {
        Given::Sized => ProxyBody::full(body.clone()),
        Given::Unsized => ProxyBody::boxed(Unsized(Some(body.clone()))),
    };
    let framing = BodyFraming::of(&sent.parts.headers, &given);
    let mut wire = encode_head(&sent.parts, framing, 0);
    let mut expected = sent.parts.headers.clone();
    let mut trailers = HeaderMap::new();
    match framing {
        BodyFraming::None => assert!(body.is_empty(), "a body without framing"),
        BodyFraming::Length(n) => {
            assert_eq!(n, body.len() as u64, "the length said is the body's");
            expected
                .entry(CONTENT_LENGTH)
                .or_insert_with(|| HeaderValue::from(n));
            wire.extend_from_slice(&body);
        }
        BodyFraming::Chunked => {
            expected
                .entry(TRANSFER_ENCODING)
                .or_insert(HeaderValue::from_static("chunked"));
            let mut start = 0;
            for &cut in sent.cuts.iter().chain([&body.len()]) {
                if cut > start {
                    wire.extend_from_slice(&chunk_line(cut - start));
                    wire.extend_from_slice(&body[start..cut]);
                    wire.extend_from_slice(b"\r\n");
                    start = cut;
                }
            }
            let mut last = BytesMut::from(&b"0\r\n"[..]);
            for (name, value) in &sent.trailers {
                if is_forwardable_trailer(name) && sent.parts.headers.contains_key(TRAILER) {
                    write_field(&mut last, name.as_str().as_bytes(), value.as_bytes());
                    trailers.append(name.clone(), value.clone());
                }
            }
            last.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&last);
        }
    }
    let seen = Seen {
        method: sent.parts.method.clone(),
        target: sent
            .parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned(),
        fields: fields(&expected),
        body: body.to_vec(),
        trailers: fields(&trailers),
    };
    (wire.to_vec(), seen)
}

/// What hyper's server makes of `wire`: the request, and whether the connection ended
/// cleanly after it (no byte past the request).
fn hyper_reads(wire: Vec<u8>) -> (Option<Seen>, bool) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let (mut client, server) = tokio::io::duplex(wire.len() + 64 * 1024);
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let service =
            hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let seen_tx = seen_tx.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let collected = body.collect().await.ok();
                    let _ = seen_tx.send(collected.map(|collected| Seen {
                        method: parts.method,
                        target: parts.uri.to_string(),
                        fields: fields(&parts.headers),
                        trailers: collected.trailers().map(fields).unwrap_or_default(),
                        body: collected.to_bytes().to_vec(),
                    }));
                    Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
                }
            });
        let connection = tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(server), service),
        );
        client.write_all(&wire).await.expect("room for the request");
        let seen = match tokio::time::timeout(STUCK, seen_rx.recv()).await {
            Ok(Some(seen)) => seen,
            _ => return (None, false),
        };
        // The answer, then the end: hyper must find nothing more to read.
        let mut answer = Vec::new();
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match client.read_buf(&mut answer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = client.shutdown().await;
        let clean = matches!(
            tokio::time::timeout(STUCK, connection).await,
            Ok(Ok(Ok(())))
        ) && seen_rx.try_recv().is_err();
        (seen, clean)
    })
}

fn method() -> impl Strategy<Value = Method> {
    prop::sample::select(vec![
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::OPTIONS,
        Method::from_bytes(b"PURGE").expect("a method"),
    ])
}

fn target() -> impl Strategy<Value = String> {
    let segment =
        prop::collection::vec(prop::sample::select(&b"az09-._~%41!$&'()*+,;=:@"[..]), 0..8);
    (
        prop::collection::vec(segment, 1..4),
        prop::option::of(prop::collection::vec(
            prop::sample::select(&b"az09=&/?%41"[..]),
            0..12,
        )),
    )
        .prop_map(|(segments, query)| {
            let mut target = String::new();
            for segment in segments {
                target.push('/');
                target.extend(segment.into_iter().map(char::from));
            }
            if let Some(query) = query {
                target.push('?');
                target.extend(query.into_iter().map(char::from));
            }
            target
        })
}

fn field() -> impl Strategy<Value = (HeaderName, HeaderValue)> {
    let name = prop::sample::select(vec![
        "host",
        "x-forwarded-for",
        "content-type",
        "x-app",
        "x-app",
        "idempotency-key",
        "accept",
    ]);
    // Field values as RFC 9110 §5.5 has them: no whitespace at either end.
    let value = (
        prop::collection::vec(prop::sample::select(&b"az09 \t\"',;=/\x80\xff"[..]), 0..12),
        prop::sample::select(&b"aZ9\xe9"[..]),
    )
        .prop_map(|(value, last)| {
            let start = value.iter().position(|&b| b != b' ' && b != b'\t');
            let mut value = value[start.unwrap_or(value.len())..].to_vec();
            value.push(last);
            value
        });
    (name, value).prop_map(|(name, value)| {
        (
            HeaderName::from_static(name),
            HeaderValue::from_bytes(&value).expect("a field value"),
        )
    })
}

fn sent() -> impl Strategy<Value = Sent> {
    (
        method(),
        target(),
        prop::collection::vec(field(), 0..5),
        prop::collection::vec(any::<u8>(), 0..40),
        // 0: no body; 1: length said; 2: sized body; 3: chunked said; 4: unsized body.
        0u8..5,
        prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        prop::collection::vec(
            prop::sample::select(vec![
                ("x-sum", "42"),
                ("grpc-status", "0"),
                ("host", "evil"),
            ]),
            0..3,
        ),
    )
        .prop_map(|(method, target, fields, mut body, kind, cuts, trailers)| {
            let mut request = http::Request::builder().method(method).uri(target);
            for (name, value) in fields {
                request = request.header(name, value);
            }
            let mut parts = request.body(()).expect("a request").into_parts().0;
            if kind == 0 {
                body.clear();
            }
            if kind == 1 {
                parts
                    .headers
                    .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
            }
            if kind == 3 {
                parts
                    .headers
                    .insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
            }
            let mut trailer_map = HeaderMap::new();
            if matches!(kind, 3 | 4) && !trailers.is_empty() {
                parts
                    .headers
                    .insert(TRAILER, HeaderValue::from_static("x-sum, grpc-status"));
                for (name, value) in trailers {
                    trailer_map.append(name, HeaderValue::from_static(value));
                }
            }
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
            at.sort_unstable();
            Sent {
                parts,
                given: if kind == 4 {
                    Given::Unsized
                } else {
                    Given::Sized
                },
                body,
                cuts: at,
                trailers: trailer_map,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    })]

    #[test]
    fn hyper_reads_every_encoded_request_as_it_was_meant(sent in sent()) {
        let (wire, meant) = encode(&sent);
        let (seen, clean) = hyper_reads(wire.clone());
        let shown = wire.escape_ascii().to_string();
        prop_assert_eq!(seen.as_ref(), Some(&meant), "{}", shown);
        prop_assert!(clean, "hyper found more than the request in {}", shown);
    }
}
