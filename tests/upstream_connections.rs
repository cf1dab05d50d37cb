//! The upstream side of the proxy: kept-alive connections are reused, requests go out in
//! origin form with a `Host`, a connection the upstream closed while idle is never used
//! for a request (nor does a request sent on it execute twice), the proxy closes idle
//! connections before the upstream's keep-alive timeout does; `upstream_timeout` covers
//! the body too.
//!
//! The upstream here is a raw TCP server, so the test sees exactly what went over the wire.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{post, start_proxy};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

const ROUTES: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: "/orders/*" }
    key: { header: Idempotency-Key, required: true }
  - name: plain
    match: { path: "/plain/*" }
    idempotency: off
"#;

/// For the tests that count connections to see them reused: an idle timeout no pause
/// between their requests reaches, however busy the machine.
const KEEP_IDLE: &str = "connections: { upstream_idle_timeout: 1h }\n";

/// What the raw upstream saw.
#[derive(Default)]
struct Seen {
    connections: usize,
    /// Request line and `Host` of every request, in order.
    requests: Vec<(String, Option<String>)>,
}

/// Reads one request (line, headers, `Content-Length` body) and returns its request line
/// and `Host`; `None` once the proxy closed the connection.
async fn read_request(read: &mut BufReader<OwnedReadHalf>) -> Option<(String, Option<String>)> {
    let mut line = String::new();
    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
        return None;
    }
    let (mut length, mut host) = (0usize, None);
    loop {
        let mut header = String::new();
        read.read_line(&mut header).await.unwrap();
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap(),
            "host" => host = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    let mut body = vec![0u8; length];
    read.read_exact(&mut body).await.unwrap();
    Some((line.trim_end().to_owned(), host))
}

/// A raw HTTP/1.1 upstream answering `201 {"ok":true}` with keep-alive. With
/// `close_after_each`, it closes a connection after one answer, once the test notifies
/// `close`, without having said so in a `Connection` header (as a server whose keep-alive
/// timeout ran out does), and reports each close on the returned channel.
async fn raw_upstream(
    close_after_each: bool,
    close: Arc<Notify>,
) -> (SocketAddr, Arc<Mutex<Seen>>, mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (closed_tx, closed_rx) = mpsc::unbounded_channel();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            record.lock().unwrap().connections += 1;
            let record = Arc::clone(&record);
            let closed_tx = closed_tx.clone();
            let close = Arc::clone(&close);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                while let Some(request) = read_request(&mut read).await {
                    record.lock().unwrap().requests.push(request);
                    let answer = "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";
                    write.write_all(answer.as_bytes()).await.unwrap();
                    if close_after_each {
                        close.notified().await;
                        let _ = write.shutdown().await;
                        drop(write);
                        drop(read);
                        let _ = closed_tx.send(());
                        return;
                    }
                }
            });
        }
    });
    (addr, seen, closed_rx)
}

#[tokio::test]
async fn sequential_requests_share_one_kept_alive_upstream_connection() {
    let (upstream, seen, _) = raw_upstream(false, Arc::default()).await;
    let proxy = start_proxy(upstream, &format!("{KEEP_IDLE}{ROUTES}")).await;
    for i in 0..10 {
        let key = format!("reuse-{i}");
        let protected = post(
            proxy.addr,
            &format!("/orders/{i}?x=1"),
            &[("idempotency-key", &key)],
            "{}",
        )
        .await;
        assert_eq!(protected.status, 201);
        let plain = post(proxy.addr, &format!("/plain/{i}"), &[], "{}").await;
        assert_eq!(plain.status, 201);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 20);
    assert_eq!(
        seen.connections, 1,
        "every request reused the first connection"
    );
    // Origin form, as an HTTP/1.1 origin server expects; never the absolute form.
    assert_eq!(seen.requests[0].0, "POST /orders/0?x=1 HTTP/1.1");
    assert_eq!(seen.requests[1].0, "POST /plain/0 HTTP/1.1");
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_not_used() {
    let close = Arc::new(Notify::new());
    let (upstream, seen, mut closed) = raw_upstream(true, Arc::clone(&close)).await;
    let proxy = start_proxy(upstream, ROUTES).await;
    for i in 0..6 {
        let answer = if i % 2 == 0 {
            let key = format!("closed-{i}");
            post(
                proxy.addr,
                &format!("/orders/{i}"),
                &[("idempotency-key", &key)],
                "{}",
            )
            .await
        } else {
            post(proxy.addr, &format!("/plain/{i}"), &[], "{}").await
        };
        assert_eq!(answer.status, 201, "request {i}: {:?}", answer.body);
        // The upstream closes the connection only now, after the proxy took it back into
        // its pool; the next request goes out once it is closed, so the pool holds a dead
        // connection when it comes.
        close.notify_one();
        closed.recv().await.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.requests.len(),
        6,
        "each request reached the upstream once"
    );
    assert_eq!(seen.connections, 6);
}

/// How an idle stretch of a connection to [`keep_alive_upstream`] ended, with the number of
/// the connection (from 0, in the order accepted).
#[derive(Debug, PartialEq)]
enum IdleEnd {
    /// The proxy closed it.
    ClosedByProxy(usize),
    /// The upstream's keep-alive timeout ran out first and the upstream closed it.
    TimedOut(usize),
}

/// A raw HTTP/1.1 upstream with a keep-alive timeout, as app servers have: it answers
/// `201 {"ok":true}` without a `Connection` field and closes a connection that sends no
/// request for `keep_alive`. Reports how each connection ended, and records the number of
/// the connection each request came on, with its request line.
async fn keep_alive_upstream(
    keep_alive: Duration,
) -> (
    SocketAddr,
    Arc<Mutex<Vec<(usize, String)>>>,
    mpsc::UnboundedReceiver<IdleEnd>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let (ends_tx, ends) = mpsc::unbounded_channel();
    let record = Arc::clone(&requests);
    tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((stream, _)) = listener.accept().await {
            let connection = accepted;
            accepted += 1;
            let record = Arc::clone(&record);
            let ends_tx = ends_tx.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                loop {
                    match tokio::time::timeout(keep_alive, read_request(&mut read)).await {
                        Ok(Some((line, _))) => {
                            record.lock().unwrap().push((connection, line));
                            write.write_all(OK).await.unwrap();
                        }
                        Ok(None) => {
                            let _ = ends_tx.send(IdleEnd::ClosedByProxy(connection));
                            return;
                        }
                        Err(_) => {
                            let _ = write.shutdown().await;
                            let _ = ends_tx.send(IdleEnd::TimedOut(connection));
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, requests, ends)
}

/// The next connection end [`keep_alive_upstream`] reports.
async fn next_end(ends: &mut mpsc::UnboundedReceiver<IdleEnd>) -> IdleEnd {
    tokio::time::timeout(Duration::from_secs(10), ends.recv())
        .await
        .expect("hang guard: no connection ended")
        .unwrap()
}

/// An upstream that closes idle connections itself races the proxy's next request on one:
/// a request written as the close comes fails after it went out, which the proxy cannot
/// tell from one the upstream read, so a protected key is held as outcome-unknown (its
/// retries answered 409) and an unprotected request is a 502. With
/// `connections.upstream_idle_timeout` below the upstream's keep-alive timeout, the proxy
/// closes the idle connection first and the next request goes out on a new one.
///
/// The upstream's keep-alive is gunicorn's 2 s, the proxy's idle timeout 100 ms. Each next
/// request is sent once the upstream saw the proxy close the idle connection (an idle time
/// past the proxy's timeout and within the upstream's), so no sleep decides anything: the
/// 2 s only bound how long a failing run takes.
#[tokio::test]
async fn idle_connections_close_before_the_upstreams_keep_alive_so_requests_take_new_ones() {
    let (upstream, requests, mut ends) = keep_alive_upstream(Duration::from_secs(2)).await;
    let routes = format!("connections: {{ upstream_idle_timeout: 100ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;

    let first = post(
        proxy.addr,
        "/orders/1",
        &[("idempotency-key", "idle-1")],
        "{}",
    )
    .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(next_end(&mut ends).await, IdleEnd::ClosedByProxy(0));

    let second = post(
        proxy.addr,
        "/orders/2",
        &[("idempotency-key", "idle-2")],
        "{}",
    )
    .await;
    assert_eq!(second.status, 201, "{:?}", second.body);
    assert_eq!(next_end(&mut ends).await, IdleEnd::ClosedByProxy(1));

    let plain = post(proxy.addr, "/plain/3", &[], "{}").await;
    assert_eq!(plain.status, 201, "{:?}", plain.body);

    // Each request executed once, each on a connection of its own.
    assert_eq!(
        *requests.lock().unwrap(),
        [
            (0, "POST /orders/1 HTTP/1.1".to_owned()),
            (1, "POST /orders/2 HTTP/1.1".to_owned()),
            (2, "POST /plain/3 HTTP/1.1".to_owned()),
        ]
    );
    // The keys were completed with their answers, not held as outcome-unknown.
    let again = post(
        proxy.addr,
        "/orders/1",
        &[("idempotency-key", "idle-1")],
        "{}",
    )
    .await;
    assert_eq!(again.status, 201, "{:?}", again.body);
    assert!(again.replayed());
    assert_eq!(requests.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_request_without_host_gets_the_upstreams() {
    let (upstream, seen, _) = raw_upstream(false, Arc::default()).await;
    let proxy = start_proxy(upstream, ROUTES).await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"POST /plain/old HTTP/1.0\r\ncontent-length: 2\r\n\r\nhi",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.0 201"), "{answer}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests[0].0, "POST /plain/old HTTP/1.1");
    assert_eq!(
        seen.requests[0].1.as_deref(),
        Some(upstream.to_string().as_str())
    );
}

/// `upstream_timeout` bounds the whole answer a protected request's client waits for, body
/// included: an upstream that sends its head and then stalls mid-body gets the client a
/// 504, and `background_timeout` bounds the owner's wait after it; the key is held, since
/// the request went out.
#[tokio::test]
async fn an_upstream_stalling_mid_body_times_out_and_holds_the_key() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let executed = Arc::new(Mutex::new(0usize));
    let count = Arc::clone(&executed);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                if read_request(&mut read).await.is_none() {
                    return;
                }
                let first = {
                    let mut n = count.lock().unwrap();
                    *n += 1;
                    *n == 1
                };
                // The first answer stops after half its body, until the proxy gives up.
                let body: &[u8] = if first { b"{\"ok\"" } else { b"{\"ok\":true}" };
                write
                    .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n")
                    .await
                    .unwrap();
                write.write_all(body).await.unwrap();
                let mut rest = Vec::new();
                let _ = read.read_to_end(&mut rest).await;
            });
        }
    });
    let routes = format!(
        "defaults: {{ upstream_timeout: 300ms, background_timeout: 600ms, wait_timeout: 50ms }}\n{ROUTES}"
    );
    let proxy = start_proxy(upstream, &routes).await;
    let key = [("idempotency-key", "stall")];
    // Hang guard only: without a timeout on the body this would never answer.
    let stalled = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        post(proxy.addr, "/orders/1", &key, "{}"),
    )
    .await
    .expect("the proxy never gave up on the stalled body");
    assert_eq!(stalled.status, 504, "{:?}", stalled.body);
    // The request went out and may have run: retries are never executed again. While the
    // owner waits on in the background they hear it is in flight; once it gave up, that its
    // outcome is unknown.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let held = loop {
        let retry = post(proxy.addr, "/orders/1", &key, "{}").await;
        assert_eq!(retry.status, 409, "{:?}", retry.body);
        if retry.json()["type"] != "urn:idemgate:problem:in-flight" {
            break retry;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never gave up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(held.json()["type"], "urn:idemgate:problem:outcome-unknown");
    assert_eq!(*executed.lock().unwrap(), 1);
}

const OK: &[u8] = b"HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";

/// What a scripted upstream sends for one request: the pieces of its answer (written apart,
/// so the proxy sees them in separate reads) and whether it closes the connection after.
type Script = fn(usize) -> (Vec<&'static [u8]>, bool);

/// A raw upstream that answers the n-th request it reads (over all its connections) with
/// `script(n)`.
async fn scripted_upstream(script: Script) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            record.lock().unwrap().connections += 1;
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                while let Some(request) = read_request(&mut read).await {
                    let n = {
                        let mut seen = record.lock().unwrap();
                        seen.requests.push(request);
                        seen.requests.len() - 1
                    };
                    let (pieces, close) = script(n);
                    for piece in pieces {
                        write.write_all(piece).await.unwrap();
                        write.flush().await.unwrap();
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    if close {
                        let _ = write.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

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

/// `CONNECT` is a 501 and never reaches the upstream. Forwarded (as `CONNECT /`), a 2xx
/// made the upstream connection a tunnel that went back to the pool, and the next client's
/// request was written into the tunnel.
#[tokio::test]
async fn connect_is_501_and_never_reaches_the_upstream() {
    let (upstream, seen) = scripted_upstream(|_| (vec![OK], false)).await;
    let proxy = start_proxy(upstream, ROUTES).await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nhost: 10.0.0.1:443\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 501"), "{answer}");
    assert!(
        answer.contains("urn:idemgate:problem:not-implemented"),
        "{answer}"
    );
    let next = post(proxy.addr, "/plain/after", &[], "{}").await;
    assert_eq!(next.status, 201);
    let seen = seen.lock().unwrap();
    let lines: Vec<_> = seen
        .requests
        .iter()
        .map(|(line, _)| line.as_str())
        .collect();
    assert_eq!(lines, ["POST /plain/after HTTP/1.1"]);
}

/// An answer over `max_answer` streams to its client after `upstream_timeout` ended with
/// its head: an upstream that stalls mid-body is cut off after
/// `connections.upstream_read_timeout`, as on a pass-through route, instead of holding the
/// client and the upstream connection forever. The client's answer ends short, the
/// upstream connection is closed, and the key keeps "executed, answer not stored": its
/// repeat is a 409, never a second run. (The gap is 300 ms; the 10 s bounds are hang
/// guards only.)
#[tokio::test]
async fn an_answer_over_max_answer_that_stalls_is_cut_off_and_not_run_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let executed = Arc::new(Mutex::new(0usize));
    let count = Arc::clone(&executed);
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                if read_request(&mut read).await.is_none() {
                    return;
                }
                *count.lock().unwrap() += 1;
                // 2 KiB of an announced 100,000 bytes, then nothing: more than max_answer,
                // so the proxy streams it on and stops buffering.
                write
                    .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 100000\r\n\r\n")
                    .await
                    .unwrap();
                write.write_all(&[b'x'; 2048]).await.unwrap();
                // Reports when the proxy lets go of the connection.
                let mut rest = Vec::new();
                let _ = read.read_to_end(&mut rest).await;
                let _ = closed_tx.send(());
            });
        }
    });
    let routes = format!(
        "defaults: {{ max_answer: 1KiB }}\nconnections: {{ upstream_read_timeout: 300ms }}\n{ROUTES}"
    );
    let proxy = start_proxy(upstream, &routes).await;
    let request = common::raw_post("/orders/big", &["idempotency-key: big-stall"], "{}");
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    client.write_all(&request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "hang guard: the client's answer never ended ({} bytes so far)",
        got.len()
    );
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body.len(), 2048, "the part that came, and no more");
    tokio::time::timeout(std::time::Duration::from_secs(10), closed.recv())
        .await
        .expect("hang guard: the upstream connection was never let go");
    let retry = post(
        proxy.addr,
        "/orders/big",
        &[("idempotency-key", "big-stall")],
        "{}",
    )
    .await;
    assert_eq!(retry.status, 409, "{:?}", retry.body);
    assert_eq!(
        retry.json()["type"],
        "urn:idemgate:problem:answer-not-stored"
    );
    assert_eq!(*executed.lock().unwrap(), 1);
}
