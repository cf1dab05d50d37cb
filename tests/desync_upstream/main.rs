//! The upstream side of issue 24: the classic HTTP/1.1 response-desync vectors, each sent
//! by a raw upstream in answer to one request, through idemgate's pooled upstream
//! connections (hyper's client parses the answers).
//!
//! A response desync on a pooled connection is the worst thing this product can do: bytes
//! of one answer read as the answer to the next request, of another caller, and stored
//! under that caller's key for a day. So every vector is checked three ways:
//! 1. the caller of the vector request gets one exact outcome (the upstream's answer, or
//!    the proxy's own problem+json);
//! 2. the next request, of another caller, gets its own answer (the upstream names the
//!    request it answers), and the connection that carried the vector serves it only if
//!    the vector left it clean; a poisoned one is closed by the proxy;
//! 3. on a protected route, the same key again is never executed twice: a replay of the
//!    stored answer, byte for byte, or the outcome-unknown 409 after a broken answer.
//!
//! Every malformed answer carries, where a parser could take its bytes for the next
//! answer, a whole forged answer (`forged`): reaching any caller, it would show.
//!
//! Each row says why its outcome is the one RFC 9110/9112 make correct, as hyper 1.x (the
//! proxy's upstream parser) behaves when run, with the proxy's own checks on the answer
//! head (`src/proxy/upstream/request.rs`: an unasked 101 refused, a list of lengths sent
//! on as one).
//!
//! The target is split by job: `corpus.rs` (what a vector row is, and its base), `upstream.rs`
//! (the raw upstream), `client.rs` (the raw client), `run.rs` (running a row and classifying
//! what happened); the rows, one test module each, are here.

#[path = "../common/mod.rs"]
mod common;

mod client;
mod corpus;
mod run;
mod upstream;

use std::time::Duration;

use corpus::{forged, Conn, Outcome, Vector, BASE, FORGED_LEN, OK};
use run::run;
use upstream::{send, Step};

/// Hang guard of every wait: a test that reaches it fails with the reason.
const HANG_GUARD: Duration = Duration::from_secs(10);

/// One test per route for a vector row.
macro_rules! vector {
    ($(#[$meta:meta])* $name:ident, $row:expr) => {
        mod $name {
            use super::*;
            static ROW: Vector = $row;

            #[tokio::test]
            $(#[$meta])*
            async fn protected_route() {
                run(&ROW, true).await;
            }

            #[tokio::test]
            $(#[$meta])*
            async fn unprotected_route() {
                run(&ROW, false).await;
            }
        }
    };
    (unprotected $name:ident, $row:expr) => {
        mod $name {
            use super::*;
            static ROW: Vector = $row;

            #[tokio::test]
            async fn unprotected_route() {
                run(&ROW, false).await;
            }
        }
    };
}

// RFC 9110 §15.2: a client parses any number of 1xx before the final answer; hyper's
// client skips each one (role.rs, no count), so the final answer is the one stored, and the
// connection stays clean.
vector!(
    a_hundred_early_hints_then_the_answer,
    Vector {
        script: || {
            let mut hints =
                b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n".repeat(100);
            hints.extend_from_slice(OK);
            vec![send(hints)]
        },
        ..BASE
    }
);

// 1xx without end: hyper parses and drops each (its read buffer stays bounded) and never
// sees a final answer, so the proxy answers its own 504 at `upstream_timeout` and closes the
// connection (at `background_timeout` on the protected route, which holds the key: it went
// out). Nothing hangs past those bounds.
vector!(
    an_endless_storm_of_early_hints,
    Vector {
        script: || vec![Step::Storm],
        upstream_timeout: "1s",
        protected: Some(Outcome::TimedOut),
        plain: Outcome::TimedOut,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9110 §15.2.2 / §7.8: a server switches only to a protocol the client named in
// `Upgrade`; the proxy sent none, so a 101 is an invalid answer after the request went out:
// 502 with the key held (outcome unknown), the connection closed. The bytes after it are a
// forged answer.
vector!(
    switching_protocols_nobody_asked_for,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (1): an answer to HEAD ends at its head, whatever its length says. The
// bytes the upstream sent after it are no answer to anything: hyper finds them on an idle
// connection and closes it, so they never become the next caller's answer. (HEAD is a safe
// method: never protected.)
vector!(
    unprotected head_answered_with_body_bytes,
    Vector {
        method: "HEAD",
        body: 0,
        script: || {
            vec![send(format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {FORGED_LEN}\r\n\r\n{}",
                forged!()
            ))]
        },
        protected: None,
        plain: Outcome::Answer(200, b""),
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (1): a 204 ends at its head. Its bytes after it poison the connection,
// which is closed; the 204 itself is a well-formed answer, stored and replayed empty.
vector!(
    no_content_with_a_body,
    Vector {
        script: || {
            vec![send(format!(
                "HTTP/1.1 204 No Content\r\ncontent-length: {FORGED_LEN}\r\n\r\n{}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Answer(204, b"")),
        plain: Outcome::Answer(204, b""),
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (1): a 304 ends at its head; as 204.
vector!(
    not_modified_with_a_body,
    Vector {
        script: || {
            vec![send(format!(
                "HTTP/1.1 304 Not Modified\r\ncontent-length: {FORGED_LEN}\r\n\r\n{}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Answer(304, b"")),
        plain: Outcome::Answer(304, b""),
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (3): both framings may be a smuggling attempt and "ought to be handled as
// an error"; the proxy refuses it (502, key held) rather than forwarding a re-framed body.
// An unprotected caller gets the same 502: the head is refused before it is forwarded.
vector!(
    content_length_with_chunked,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
                "5\r\nhello\r\n0\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (5): a proxy that receives an invalid Content-Length in an answer closes
// the connection and sends 502.
vector!(
    two_different_content_lengths,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ncontent-length: 11\r\ncontent-length: 3\r\n\r\n",
                "{\"ok\":true}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// `Content-Length = 1*DIGIT` (RFC 9110 §8.6): `01` is 1, a valid answer.
vector!(
    content_length_with_a_leading_zero,
    Vector {
        script: || vec![send("HTTP/1.1 201 Created\r\ncontent-length: 01\r\n\r\nx")],
        protected: Some(Outcome::Answer(201, b"x")),
        plain: Outcome::Answer(201, b"x"),
        conn: Conn::Reused,
        ..BASE
    }
);

// `+1` is no `1*DIGIT`: invalid, RFC 9112 §6.3 (5): 502 and the connection closed.
vector!(
    content_length_with_a_plus_sign,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ncontent-length: +1\r\n\r\nx",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9110 §8.6 / RFC 9112 §6.3 (5): a list of equal values may be processed as that one
// value, and then the message is processed with it as its Content-Length: a proxy forwards
// `1`, never the list another client may read otherwise.
vector!(
    content_length_as_a_list,
    Vector {
        script: || vec![send("HTTP/1.1 201 Created\r\ncontent-length: 1,1\r\n\r\nx")],
        protected: Some(Outcome::Answer(201, b"x")),
        plain: Outcome::Answer(201, b"x"),
        conn: Conn::Reused,
        ..BASE
    }
);

// RFC 9112 §6.3 (4): with a final coding other than chunked the body runs to close, in a
// coding the proxy cannot decode or mark for its client: refused (502, key held); its
// connection cannot serve again.
vector!(
    transfer_encoding_xchunked,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: xchunked\r\n\r\n",
                "5\r\nhello\r\n0\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// As `xchunked`: chunked is not the final coding (RFC 9112 §6.1, §6.3 (4)).
vector!(
    transfer_encoding_chunked_then_identity,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked, identity\r\n\r\n",
                "5\r\nhello\r\n0\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// A chunk size that overflows: hyper's decoder fails. Protected: 502, key held. Unprotected:
// the head was handed on but the body failed before any byte, and the caller's connection
// ends without an answer (never a body that looks whole).
vector!(
    a_chunk_size_past_64_bits,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n",
                "1ffffffffffffffff\r\nhello\r\n0\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::NoAnswer,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §7.1.1: chunk extensions (quoted strings included) are ignored by a recipient
// that does not know them; the body and the connection are clean.
vector!(
    chunk_extensions,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n",
                "5;name=value;q=\"a;b\"\r\nhello\r\n6;x\r\n world\r\n0;end=1\r\n\r\n",
            ))]
        },
        protected: Some(Outcome::Answer(201, b"hello world")),
        plain: Outcome::Answer(201, b"hello world"),
        conn: Conn::Reused,
        ..BASE
    }
);

// RFC 9112 §7.1: chunk lines end in CRLF (the bare-LF leniency of §2.2 is for the head).
// hyper refuses the bare LF: 502 on the protected route; unprotected, the caller gets the
// chunks before it and no last chunk, so it sees the body cut off.
vector!(
    a_last_chunk_with_bare_line_feeds,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n",
                "5\r\nhello\r\n0\n\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Cut(201, b"hello"),
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §2.2: a recipient MAY take a bare LF as the end of a head line; hyper (httparse)
// does, and the answer is framed by its one Content-Length: valid, clean.
vector!(
    a_head_with_bare_line_feeds,
    Vector {
        script: || vec![send("HTTP/1.1 201 Created\ncontent-length: 5\n\nhello")],
        protected: Some(Outcome::Answer(201, b"hello")),
        plain: Outcome::Answer(201, b"hello"),
        conn: Conn::Reused,
        ..BASE
    }
);

// RFC 9112 §5.2: a proxy that receives obs-fold in an answer either replaces it with SP or
// answers 502; hyper refuses it. Here the fold hides a second Content-Length.
vector!(
    an_obs_folded_header,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\nx-folded: a\r\n content-length: 0\r\ncontent-length: 11\r\n\r\n",
                "{\"ok\":true}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9110 §5.5: NUL in a field value is invalid and dangerous; the message is refused:
// 502.
vector!(
    a_nul_in_a_header_value,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\nx-nul: a\0b\r\ncontent-length: 11\r\n\r\n",
                "{\"ok\":true}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// Bytes past the end of a whole answer, in the same read: hyper finds them once the answer
// is over and closes the connection; the answer itself is fine and stored.
vector!(
    another_answer_in_the_same_write,
    Vector {
        script: || vec![send([OK, forged!().as_bytes()].concat())],
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// The same bytes after the caller got its answer, with the connection idle in the pool:
// hyper reads them as unexpected and closes it. The test waits for that close before the
// next request: bytes that arrive after the next request went out cannot be told from its
// answer by any HTTP/1.1 client.
vector!(
    another_answer_after_the_answer_was_read,
    Vector {
        script: || vec![send(OK), Step::AwaitRelease, send(forged!())],
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// A truncated answer: never stored as complete. Protected: 502, key held (it went out).
// Unprotected: the head and the bytes that came reach the caller, and the connection ends
// short of the length, so the caller sees the cut.
vector!(
    a_content_length_longer_than_what_came_before_close,
    Vector {
        script: || {
            vec![
                send("HTTP/1.1 201 Created\r\ncontent-length: 100\r\n\r\n{\"partial\":"),
                Step::Close,
            ]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Cut(201, b"{\"partial\":"),
        conn: Conn::ClosedByUpstream,
        ..BASE
    }
);

// A chunked answer without its last chunk, then close (RFC 9112 §7.1: the body ends only
// with the zero-size chunk): cut short, never stored as complete. Protected: 502, key held.
// Unprotected: the head and the chunk that came reach the caller, and its body ends
// unterminated.
vector!(
    a_chunked_answer_closed_before_its_last_chunk,
    Vector {
        script: || {
            vec![
                send("HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\nb\r\n{\"partial\":\r\n"),
                Step::Close,
            ]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Cut(201, b"{\"partial\":"),
        conn: Conn::ClosedByUpstream,
        ..BASE
    }
);

// RFC 9112 §6.3 (8): no length, so the body runs to close; read whole, stored whole.
vector!(
    an_http_1_0_answer_read_to_close,
    Vector {
        script: || {
            vec![
                send("HTTP/1.0 201 Created\r\ncontent-type: text/plain\r\n\r\nwhole body, read to close"),
                Step::Close,
            ]
        },
        protected: Some(Outcome::Answer(201, b"whole body, read to close")),
        plain: Outcome::Answer(201, b"whole body, read to close"),
        conn: Conn::ClosedByUpstream,
        ..BASE
    }
);

// RFC 9112 §9.3: an HTTP/1.0 answer without `keep-alive` does not keep the connection; the
// proxy closes it though the upstream leaves it open.
vector!(
    an_http_1_0_answer_with_a_length_on_a_connection_left_open,
    Vector {
        script: || vec![send(
            "HTTP/1.0 201 Created\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"
        )],
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §9.6: after `Connection: close` nothing more is read on the connection; the
// forged answer after it must never be read, so the proxy closes it.
vector!(
    connection_close_then_more_bytes,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 11\r\n\r\n",
                "{\"ok\":true}",
                forged!()
            ))]
        },
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §9.5: a server may answer before it read the body (16 MiB here, more than the
// socket buffers hold); this upstream reads the rest afterwards, as it must to keep the
// connection. The answer is stored and the connection, drained, serves the next request.
vector!(
    an_answer_before_the_request_body_was_sent,
    Vector {
        early: true,
        body: 16 << 20,
        conn: Conn::Reused,
        ..BASE
    }
);
