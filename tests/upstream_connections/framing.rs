//! Answers framed oddly by the upstream: bytes past an answer's end never reach another
//! request, chunked and close-delimited answers arrive whole, and an ambiguous framing is a
//! 502 that holds the key.

use crate::common::{post, start_proxy};
use crate::{scripted_upstream, KEEP_IDLE, OK, ROUTES};

/// An upstream that sends more than its answer's framing covers (here a whole second
/// answer) must not have those bytes read as the answer to the next request, whoever sends
/// it: the connection is dropped instead of pooled.
#[tokio::test]
async fn bytes_past_an_answers_end_never_reach_another_request() {
    let (upstream, seen) = scripted_upstream(|n| match n {
        0 => (
            vec![b"HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{\"ok\":true}HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nforged!"],
            false,
        ),
        _ => (vec![OK], false),
    })
    .await;
    let proxy = start_proxy(upstream, &format!("{KEEP_IDLE}{ROUTES}")).await;
    let first = post(proxy.addr, "/plain/1", &[], "{}").await;
    assert_eq!(first.status, 201);
    assert_eq!(&first.body[..], b"{\"ok\":true}");
    for i in 0..3 {
        let key = format!("after-stray-{i}");
        let next = post(
            proxy.addr,
            &format!("/orders/{i}"),
            &[("idempotency-key", &key)],
            "{}",
        )
        .await;
        assert_eq!(next.status, 201, "{:?}", next.body);
        assert_eq!(&next.body[..], b"{\"ok\":true}");
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 4);
    assert_eq!(
        seen.connections, 2,
        "the connection with stray bytes was not reused, the next one was"
    );
}

/// Chunked answers (split mid-size-line and mid-CRLF, with an extension and trailers) and
/// answers delimited by the upstream closing arrive whole, on both paths; a chunked answer
/// keeps its connection, a close-delimited one does not.
#[tokio::test]
async fn chunked_and_close_delimited_answers_arrive_whole() {
    let (upstream, seen) = scripted_upstream(|n| match n {
        0 | 2 => (
            vec![
                b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n5;x=y\r\nhel",
                b"lo\r\n6\r",
                b"\n world\r\n0\r\nx-sum: 1\r\n\r\n",
            ],
            false,
        ),
        1 => (
            vec![
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ",
                b"close",
            ],
            true,
        ),
        _ => (vec![OK], false),
    })
    .await;
    let proxy = start_proxy(upstream, &format!("{KEEP_IDLE}{ROUTES}")).await;
    let chunked = post(proxy.addr, "/plain/a", &[], "{}").await;
    assert_eq!(chunked.status, 201);
    assert_eq!(&chunked.body[..], b"hello world");
    let closed = post(proxy.addr, "/plain/b", &[], "{}").await;
    assert_eq!(closed.status, 200);
    assert_eq!(&closed.body[..], b"until close");
    let key = [("idempotency-key", "chunked-stored")];
    let stored = post(proxy.addr, "/orders/c", &key, "{}").await;
    assert_eq!(stored.status, 201);
    assert_eq!(&stored.body[..], b"hello world");
    let replay = post(proxy.addr, "/orders/c", &key, "{}").await;
    assert!(replay.replayed());
    assert_eq!(&replay.body[..], b"hello world");
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.requests.len(),
        3,
        "the replay did not reach the upstream"
    );
    assert_eq!(
        seen.connections, 2,
        "the chunked answer kept its connection for the next request; the close-delimited one ended it"
    );
}

/// An answer whose framing is ambiguous (two different lengths) is a 502, never a guess.
/// The upstream got the request and may have run it, so the key is held: the retry is
/// answered "outcome unknown", not executed.
#[tokio::test]
async fn an_ambiguously_framed_answer_is_a_502_and_holds_the_key() {
    let (upstream, seen) = scripted_upstream(|n| match n {
        0 => (
            vec![b"HTTP/1.1 201 Created\r\ncontent-length: 3\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"],
            false,
        ),
        _ => (vec![OK], false),
    })
    .await;
    let proxy = start_proxy(upstream, ROUTES).await;
    let key = [("idempotency-key", "ambiguous")];
    let first = post(proxy.addr, "/orders/1", &key, "{}").await;
    assert_eq!(first.status, 502, "{:?}", first.body);
    let retry = post(proxy.addr, "/orders/1", &key, "{}").await;
    assert_eq!(retry.status, 409, "{:?}", retry.body);
    assert_eq!(retry.json()["type"], "urn:idemgate:problem:outcome-unknown");
    // Another key goes out on a fresh connection: the broken one was not reused.
    let other = post(
        proxy.addr,
        "/orders/1",
        &[("idempotency-key", "next")],
        "{}",
    )
    .await;
    assert_eq!(other.status, 201, "{:?}", other.body);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 2);
    assert_eq!(seen.connections, 2);
}

/// An answer with both `Content-Length` and `Transfer-Encoding`, or with a transfer coding
/// the proxy does not decode, is a 502 (as nginx answers), never forwarded: kept with its
/// stale length it reached the client truncated or not at all, and a protected key stored
/// it, so every retry replayed the loss. The upstream did get the request, so the key is
/// held as an unknown outcome: the retry is told so, not run again.
#[tokio::test]
async fn an_answer_framed_both_ways_or_otherwise_coded_is_a_502_and_holds_the_key() {
    let (upstream, seen) = scripted_upstream(|n| match n {
        0 | 4 => (
            vec![b"HTTP/1.1 201 Created\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
            false,
        ),
        2 => (
            vec![b"HTTP/1.1 201 Created\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"],
            false,
        ),
        _ => (vec![OK], false),
    })
    .await;
    let proxy = start_proxy(upstream, ROUTES).await;
    for (n, key) in ["both-framings", "gzip-coded"].into_iter().enumerate() {
        let key = [("idempotency-key", key)];
        let first = post(proxy.addr, "/orders/1", &key, "{}").await;
        assert_eq!(first.status, 502, "{:?}", first.body);
        let retry = post(proxy.addr, "/orders/1", &key, "{}").await;
        assert_eq!(retry.status, 409, "{:?}", retry.body);
        assert_eq!(retry.json()["type"], "urn:idemgate:problem:outcome-unknown");
        // The next request, on another key, is answered well (upstream answer 1 or 3).
        let other = [(
            "idempotency-key",
            if n == 0 { "after-1" } else { "after-2" },
        )];
        let next = post(proxy.addr, "/orders/1", &other, "{}").await;
        assert_eq!(next.status, 201, "{:?}", next.body);
        assert_eq!(&next.body[..], b"{\"ok\":true}");
    }
    let passed = post(proxy.addr, "/plain/1", &[], "{}").await;
    assert_eq!(passed.status, 502, "{:?}", passed.body);
    assert_eq!(seen.lock().unwrap().requests.len(), 5);
}
