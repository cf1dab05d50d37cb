//! Issue 24: the classic request-smuggling and desync vectors, sent as raw bytes to a
//! running idemgate, with what crossed it seen on the wire by an upstream of this test's
//! own ([`wire::start_wire`]), which parses HTTP/1.1 strictly and records every request.
//!
//! The corpus is data (the tables [`corpus::FRAMING`], [`corpus::HEAD`],
//! [`corpus::CHUNKS`], [`corpus::PIPELINE`] and [`corpus::REFUSED_BEFORE_THE_BODY`]): a
//! name, the raw bytes, and the one outcome RFC 9112 asks for, so a future parser can be
//! run over the same tables. Each vector runs on a fresh proxy in
//! front of a fresh recorder, on the streamed route (`/stream`, `idempotency: off`), on
//! the protected route (`/orders`, `Idempotency-Key` required, body buffered up to
//! `max_body`), or on both. A loop test per table runs every vector and lists every one
//! that failed, by name, before it fails; another writes each vector byte by byte and at
//! seeded cut points and checks the verdict is the one-write verdict.
//!
//! One job per module: `corpus.rs` the vector tables, `build.rs` the routes and a vector's
//! bytes for one, `wire.rs` the strict recorder upstream, `run.rs` running a vector and
//! judging its verdict; the tests are here.

#[path = "../common/mod.rs"]
mod common;

mod build;
mod corpus;
mod run;
mod wire;

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use build::build;
use corpus::{Vector, CHUNKS, FRAMING, HEAD, PIPELINE, REFUSED_BEFORE_THE_BODY};
use run::{expected, run, run_paced, HANG};
use wire::{find, start_wire, Event};

/// Runs every vector of `group` on each of its routes in one write, at most 8 at once,
/// and fails listing every vector whose verdict is not the expected one.
async fn check_group(group: &'static [Vector]) {
    let mut runs = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(8));
    for vector in group {
        for &route in vector.on.routes() {
            let slots = Arc::clone(&slots);
            runs.spawn(async move {
                let _slot = slots.acquire_owned().await.unwrap();
                let seen = run(&build(vector.raw, route), route, &[]).await;
                (vector, route, seen)
            });
        }
    }
    let mut failures = Vec::new();
    while let Some(done) = runs.join_next().await {
        let (vector, route, seen) = done.unwrap();
        let want = expected(vector.expect, route, &seen);
        if seen != want {
            failures.push(format!(
                "{} on {}:\n    expected {want}\n    got      {seen}",
                vector.name,
                route.path()
            ));
        }
    }
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} failing vectors:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_vectors_get_their_one_outcome() {
    check_group(FRAMING).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_vectors_get_their_one_outcome() {
    check_group(HEAD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_before_the_body_vectors_get_their_one_outcome() {
    check_group(REFUSED_BEFORE_THE_BODY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_vectors_get_their_one_outcome() {
    check_group(CHUNKS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_vectors_get_their_one_outcome() {
    check_group(PIPELINE).await;
}

/// Where a split run cuts a vector: every byte its own write for a vector of up to
/// [`BYTE_BY_BYTE`] bytes, then a few sets of cut points drawn from a generator seeded by
/// the vector's name, so a failure reruns the same cuts.
fn cut_sets(name: &str, len: usize) -> Vec<Vec<usize>> {
    let mut sets = Vec::new();
    if len <= BYTE_BY_BYTE {
        sets.push((1..len).collect());
    }
    let mut state = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..RANDOM_SPLITS {
        let mut cuts: Vec<usize> = (0..1 + next() % 3)
            .map(|_| 1 + (next() as usize) % (len - 1))
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        sets.push(cuts);
    }
    sets
}

/// Vectors up to this long are also written one byte per write.
const BYTE_BY_BYTE: usize = 1024;

/// How many seeded sets of cut points each vector is written with.
const RANDOM_SPLITS: usize = 3;

/// Every vector reaches the same verdict written in pieces as in one write: the proxy's
/// reading does not depend on where reads end. The verdict compared is what the one-write
/// run showed, whether or not it is the expected one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_do_not_depend_on_how_the_bytes_are_split() {
    let mut runs = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(16));
    let groups = [FRAMING, HEAD, CHUNKS, PIPELINE, REFUSED_BEFORE_THE_BODY];
    for vector in groups.into_iter().flatten() {
        for &route in vector.on.routes() {
            let slots = Arc::clone(&slots);
            runs.spawn(async move {
                let bytes = build(vector.raw, route);
                let whole = {
                    let _slot = slots.acquire().await.unwrap();
                    run(&bytes, route, &[]).await
                };
                let mut differ = Vec::new();
                for cuts in cut_sets(vector.name, bytes.len()) {
                    let _slot = slots.acquire().await.unwrap();
                    let split = run(&bytes, route, &cuts).await;
                    if split != whole {
                        let shown = if cuts.len() + 1 == bytes.len() {
                            "every byte".to_owned()
                        } else {
                            format!("{cuts:?}")
                        };
                        differ.push(format!(
                            "{} on {} cut at {shown}:\n    one write {whole}\n    split     {split}",
                            vector.name,
                            route.path()
                        ));
                    }
                }
                differ
            });
        }
    }
    let mut failures = Vec::new();
    while let Some(done) = runs.join_next().await {
        failures.extend(done.unwrap());
    }
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} split runs differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The recorder itself: what the corpus relies on it to see. A request framed both ways
/// or coded twice, a bare LF or a second request behind a body is what a lenient upstream
/// could misread, so the recorder must flag it rather than read it one way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorder_flags_what_a_lenient_upstream_could_misread() {
    let cases: [(&[u8], &str); 6] = [
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "malformed: both Content-Length and Transfer-Encoding",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "malformed: a transfer coding besides one chunked",
        ),
        (
            b"POST /x HTTP/1.1\nHost: a\r\nContent-Length: 0\r\n\r\n",
            "malformed: a bare CR or LF in the head",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
            "malformed: chunk data without its CRLF",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET /y HTTP/1.1\r\nHost: a\r\n\r\n",
            "POST /x \"abc\"; GET /y \"\"",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nab",
            "partial: 50 bytes",
        ),
    ];
    for (bytes, want) in cases {
        let (wire, log) = start_wire().await;
        let mut stream = TcpStream::connect(wire).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut answers = Vec::new();
        tokio::time::timeout(HANG, stream.read_to_end(&mut answers))
            .await
            .expect("hang guard: the recorder did not close")
            .unwrap();
        // The recorder logs before it answers or closes: its close is the signal.
        let seen: Vec<String> = log
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|e| match e {
                Event::Request(w) => {
                    format!(
                        "{} {} {:?}",
                        w.method,
                        w.target,
                        String::from_utf8_lossy(&w.body)
                    )
                }
                Event::Malformed { why, .. } => format!("malformed: {why}"),
                Event::Partial { bytes, .. } => format!("partial: {bytes} bytes"),
            })
            .collect();
        assert_eq!(
            seen.join("; "),
            want,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

/// A request refused before its body was read, with a request pipelined behind it: the
/// verdict is the same when the rest of the body and the next request are written only
/// once the refusal has been read, so the proxy cannot have had them when it answered.
/// hyper keeps a connection whose handler answered with the body unread only if the rest
/// of the body was already buffered; the proxy's `Connection: close` on such refusals
/// makes the outcome one (refused, and nothing after it read) however the bytes arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_was_read_closes_however_the_body_arrives() {
    let mut failures = Vec::new();
    for vector in REFUSED_BEFORE_THE_BODY {
        for &route in vector.on.routes() {
            let bytes = build(vector.raw, route);
            // One byte of the refused request's body goes with its head; the rest after
            // the answer.
            let cut = find(&bytes, b"\r\n\r\n").unwrap() + 5;
            let seen = run_paced(&bytes, route, &[cut], true).await;
            let want = expected(vector.expect, route, &seen);
            if seen != want {
                failures.push(format!(
                    "{} on {}:\n    expected {want}\n    got      {seen}",
                    vector.name,
                    route.path()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
