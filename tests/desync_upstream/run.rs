//! Running one vector row: the proxy's config, the three requests (the vector's, another
//! caller's, the same key again), and the checks that classify what each caller got.

use crate::client::{exchange, find, Reply};
use crate::common;
use crate::corpus::{Conn, Outcome, Vector};
use crate::upstream::{Step, Upstream};

/// `orders` is protected by a required client key; `plain` is not protected. Every final
/// status class an upstream answer can have is stored, so that each well-formed answer of
/// the corpus can be checked byte for byte in its replay.
fn config(vector: &Vector) -> String {
    format!(
        r#"
defaults:
  upstream_timeout: {t}
  background_timeout: {t}
  max_body: 32MiB
  replay_statuses: [2xx, 3xx, 4xx]
routes:
  - name: orders
    match: {{ methods: [POST], path: "/orders/*" }}
    key: {{ header: Idempotency-Key, required: true }}
  - name: plain
    match: {{ path: "/plain/*" }}
    idempotency: off
"#,
        t = vector.upstream_timeout
    )
}

/// The vector request, its follow-up of another caller, and (protected) its repeat.
pub(crate) async fn run(vector: &'static Vector, protected: bool) {
    let upstream = Upstream::start(vector).await;
    let proxy = common::start_proxy(upstream.addr, &config(vector)).await;
    let body = vec![b'{'; vector.body];
    let (path, key) = if protected {
        ("/orders/vector", Some("vector-key"))
    } else {
        ("/plain/vector", None)
    };
    let mut fields = vec![("x-vector", "1"), ("x-req", "vector")];
    if let Some(key) = key {
        fields.push(("idempotency-key", key));
    }
    let expected = if protected {
        vector.protected.expect("a protected outcome")
    } else {
        vector.plain
    };

    // 1. The vector request: one exact outcome.
    let reply = exchange(proxy.addr, vector.method, path, &fields, &body).await;
    check_outcome(&reply, vector.method, expected);
    let carried = upstream.request("vector");
    if !vector.early {
        assert_eq!(
            carried.body_len, vector.body,
            "the request body went out whole"
        );
    }
    let carried = carried.conn;

    // 2. Another caller's request gets its own answer; the connection the vector came on
    //    serves it only if the vector left it clean.
    match vector.conn {
        // An upload answered early goes on after its answer: its connection serves another
        // request only once the rest went out (a request never waits behind another's).
        Conn::Reused if vector.early => upstream.early_body_read(carried, vector.body).await,
        Conn::Reused => {}
        Conn::ClosedByProxy => {
            if matches!(vector.script()[..], [.., Step::AwaitRelease, _]) {
                upstream.release();
            }
            upstream.closed_by_proxy(carried).await;
        }
        Conn::ClosedByUpstream => {}
    }
    let (next_path, next_fields): (&str, Vec<(&str, &str)>) = if protected {
        (
            "/orders/next",
            vec![("x-req", "next"), ("idempotency-key", "next-key")],
        )
    } else {
        ("/plain/next", vec![("x-req", "next")])
    };
    let next = exchange(proxy.addr, "POST", next_path, &next_fields, b"{}").await;
    assert_eq!(
        (next.status, next.text().as_str(), next.whole),
        (201, "answer to next", true),
        "the next caller got its own answer: {next:?}"
    );
    assert!(next.after.is_empty(), "nothing after its answer: {next:?}");
    let next_conn = upstream.request("next").conn;
    match vector.conn {
        Conn::Reused => assert_eq!(next_conn, carried, "the clean connection was reused"),
        _ => assert_ne!(
            next_conn, carried,
            "the vector's connection was never reused"
        ),
    }

    // 3. The same key again is never executed twice.
    if let Some(key) = key {
        let again = exchange(proxy.addr, vector.method, path, &fields, &body).await;
        match expected {
            Outcome::Answer(status, body) => {
                assert!(again.replayed(), "a replay: {again:?}");
                assert_answer(&again, vector.method, status, body);
            }
            Outcome::Failed | Outcome::TimedOut => {
                assert_eq!(again.status, 409, "{again:?}");
                assert_eq!(again.problem(), "urn:idemgate:problem:outcome-unknown");
            }
            Outcome::Cut(..) | Outcome::NoAnswer => {
                unreachable!("a protected answer is read whole or refused")
            }
        }
        assert_eq!(upstream.executed_for(key), 1, "executed once");
    }
    let expected_connections = if vector.conn == Conn::Reused { 1 } else { 2 };
    assert_eq!(
        upstream.connections(),
        expected_connections,
        "upstream connections opened"
    );
}

/// A whole answer with this status and body, framed by one plain length when it has a
/// body, and nothing after it.
fn assert_answer(reply: &Reply, method: &str, status: u16, body: &[u8]) {
    assert_eq!(
        (reply.status, String::from_utf8_lossy(&reply.body)),
        (status, String::from_utf8_lossy(body)),
        "{reply:?}"
    );
    let bodiless = method == "HEAD" || status == 204 || status == 304;
    if let (Some(length), false) = (reply.field("content-length"), bodiless) {
        // `Content-Length = 1*DIGIT` (RFC 9110 §8.6). RFC 9112 §6.3 (5): a list of equal
        // lengths is processed as that one length; a proxy that forwards the list leaves
        // each client to read it its own way.
        assert!(
            length.bytes().all(|b| b.is_ascii_digit()) && length.parse() == Ok(body.len()),
            "one plain length: {reply:?}"
        );
    }
    assert!(reply.whole && reply.after.is_empty(), "{reply:?}");
}

fn check_outcome(reply: &Reply, method: &str, expected: Outcome) {
    assert!(
        find(&reply.body, b"forged").is_none() && find(&reply.after, b"forged").is_none(),
        "forged bytes reached the caller: {reply:?}"
    );
    assert!(
        !reply.replayed(),
        "the first answer is no replay: {reply:?}"
    );
    match expected {
        Outcome::Answer(status, body) => assert_answer(reply, method, status, body),
        Outcome::NoAnswer => {
            assert_eq!(reply.status, 0, "no answer at all: {reply:?}");
        }
        Outcome::Cut(status, body) => {
            assert_eq!((reply.status, &reply.body[..]), (status, body), "{reply:?}");
            assert!(
                !reply.whole,
                "the caller sees the body cut short: {reply:?}"
            );
        }
        Outcome::Failed => {
            assert_eq!(reply.status, 502, "{reply:?}");
            assert_eq!(reply.problem(), "urn:idemgate:problem:upstream-failed");
        }
        Outcome::TimedOut => {
            assert_eq!(reply.status, 504, "{reply:?}");
            assert_eq!(reply.problem(), "urn:idemgate:problem:upstream-timeout");
        }
    }
}
