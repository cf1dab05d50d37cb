//! The corpus's terms: what a vector row is (the upstream's script, the outcome it must have
//! on each route, what becomes of its connection), the row every vector starts from
//! (`BASE`), and the bytes the rows are written with (`OK`, the `forged!` answer).
//!
//! The rows themselves, one test module each, are in `main.rs`.

use crate::upstream::{send, Step};

/// A whole answer a desynchronised parser would take for the next caller's.
macro_rules! forged {
    () => {
        "HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\nforged"
    };
}
pub(crate) const FORGED_LEN: usize = forged!().len();
pub(crate) use forged;

/// A well-formed answer of a vector row (what a clean exchange stores).
pub(crate) const OK: &[u8] =
    b"HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";
const OK_BODY: &[u8] = b"{\"ok\":true}";

/// What the caller of a vector request gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Outcome {
    /// The upstream's answer, whole: this status and body (stored on a protected route).
    Answer(u16, &'static [u8]),
    /// The upstream's head with a body cut short (an unprotected, streamed answer), then
    /// the connection closes: this status and the body bytes that came.
    Cut(u16, &'static [u8]),
    /// The proxy's own 502 `upstream-failed`: the request went out, the answer is unusable.
    Failed,
    /// The proxy's own 504 `upstream-timeout`: no final answer within `upstream_timeout`.
    TimedOut,
    /// The caller's connection closes without a byte of answer (an unprotected answer
    /// whose body broke before any of it could be forwarded).
    NoAnswer,
}

/// What becomes of the upstream connection that carried the vector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Conn {
    /// It was left clean and serves the next request.
    Reused,
    /// The proxy closes it (it is never used again).
    ClosedByProxy,
    /// The upstream closed it.
    ClosedByUpstream,
}

pub(crate) struct Vector {
    /// Method of the vector request.
    pub(crate) method: &'static str,
    /// The upstream's answer.
    pub(crate) script: fn() -> Vec<Step>,
    /// The answer goes out before the request body was read (drained after it).
    pub(crate) early: bool,
    /// Request body size.
    pub(crate) body: usize,
    /// The route's `upstream_timeout` (and `background_timeout`).
    pub(crate) upstream_timeout: &'static str,
    /// Its outcome on the protected route (`None`: the method is never protected).
    pub(crate) protected: Option<Outcome>,
    /// Its outcome on the unprotected route.
    pub(crate) plain: Outcome,
    /// Its connection afterwards.
    pub(crate) conn: Conn,
}

pub(crate) const BASE: Vector = Vector {
    method: "POST",
    script: || vec![send(OK)],
    early: false,
    body: 2,
    upstream_timeout: "10s",
    protected: Some(Outcome::Answer(201, OK_BODY)),
    plain: Outcome::Answer(201, OK_BODY),
    conn: Conn::Reused,
};

impl Vector {
    pub(crate) fn script(&self) -> Vec<Step> {
        (self.script)()
    }
}
