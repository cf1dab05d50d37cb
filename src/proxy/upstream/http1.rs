//! The hand-written HTTP/1.1 upstream client, opt-in (`connections.upstream_http1:
//! idemgate`): hyper's client connections stay the default, as this one saves less than
//! the 10 % of proxy CPU per request issue 24 asks of protocol code of our own
//! (`benches/load/HTTP1.md`); its answer parsing is checked against hyper's client on the
//! same bytes (`differential_tests`, `fuzz_tests`).
//!
//! hyper's client runs each connection in a task of its own and passes the request, the
//! answer and every body chunk through channels to and from it; here the request is
//! written and the answer head read by the future that forwards it
//! ([`connection::Connection::exchange`]), and the answer's body is decoded by whoever
//! polls it ([`body::AnswerBody`]). Its connections are pooled as hyper's are
//! (`super::pool::Pool`, with [`Own`]): the same cap, order and idle expiry. Protocol
//! upgrades are handed to hyper's client (counted in
//! `idemgate_upstream_http1_handoffs_total`).
//!
//! The wire format is sans IO, in pure functions over a byte buffer that the proofs can
//! call directly: the answer head ([`head::parse_head`]), the answer body
//! ([`decoder::Decoder`]) and the request head ([`encode::encode_head`]).
//! Kept is the rule that keeps a pooled connection in step with the upstream: it is reused
//! only after an answer whose end its framing marked, with no byte left over, and once
//! the whole request went out.

pub(crate) mod body;
pub(crate) mod connection;
pub(crate) mod decoder;
pub(crate) mod encode;
pub(crate) mod head;
pub(crate) mod upload;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;

use super::pool::{Handshake, Leased, Pool};
use super::request;
use crate::error::ProxyError;
use crate::proxy::body::ProxyBody;
use body::AnswerBody;
use connection::Connection;
use decoder::Decoder;
use encode::{encode_head, BodyFraming};
use head::Head;
use upload::{declared_trailers, SendError, Upload, COALESCE_BODY};

/// The hand-written client's connections, for `super::pool::Pool`: nothing to negotiate,
/// and an idle one is usable while nothing arrived on it.
#[derive(Debug, Default)]
pub(crate) struct Own;

impl Handshake for Own {
    type Conn = Connection;

    async fn handshake(&self, io: Leased) -> Result<Connection, ProxyError> {
        Ok(Connection::new(io))
    }

    fn usable(conn: &mut Connection) -> bool {
        conn.is_idle_and_open()
    }
}

/// Sends a request that `request::prepare` made ready on a connection of `pool`, and
/// reads its answer head; the answer's body hands the connection back at its end and
/// finishes an upload the upstream answered early within `finish_within`. As on hyper's
/// connections: the request goes out again on another connection only if not a byte of
/// it went out on a reused one (the upstream closed it while it sat idle), and is
/// [`ProxyError::UpstreamUnreachable`] only if not a byte went out; `sending` is set
/// once it was handed to a connection. The answer head passes `request::check_answer`.
pub(super) async fn send(
    pool: &Arc<Pool<Own>>,
    parts: http::request::Parts,
    body: ProxyBody,
    sending: &AtomicBool,
    finish_within: Duration,
) -> Result<Response<AnswerBody>, ProxyError> {
    let framing = BodyFraming::of(&parts.headers, &body);
    let spare = match framing {
        BodyFraming::Length(n) if n <= COALESCE_BODY as u64 => n as usize,
        _ => 0,
    };
    let head = encode_head(&parts, framing, spare);
    let mut upload = Upload::new(head, framing, body, declared_trailers(&parts.headers));
    let method = parts.method;
    let authenticates = request::authenticates_connection(&parts.headers);
    loop {
        let checkout = pool.checkout().await?;
        let mut conn = checkout.conn;
        if !conn.is_idle_and_open() {
            // Closed before it took the request (or sent something unasked): an idle one
            // the upstream let go of, so another is taken; a new one means the upstream
            // turns connections away, and dialing again would only repeat that until the
            // deadline. Nothing was sent either way.
            if checkout.reused {
                continue;
            }
            return Err(ProxyError::UpstreamUnreachable(
                "the upstream closed a new connection".into(),
            ));
        }
        sending.store(true, Ordering::Relaxed);
        let head = match conn.exchange(&mut upload, &method).await {
            Ok(head) => head,
            // Not a byte went out, and the request is whole: the upstream closed this
            // connection while it sat idle. It goes out on another.
            Err(SendError::Unsent(_)) if checkout.reused && upload.repeatable() => {
                sending.store(false, Ordering::Relaxed);
                continue;
            }
            Err(SendError::Unsent(e)) => {
                tracing::warn!(error = %e, "upstream request not sent");
                return Err(ProxyError::UpstreamUnreachable(e.to_string()));
            }
            Err(SendError::Io(e)) => {
                tracing::warn!(error = %e, "upstream request failed");
                return Err(ProxyError::UpstreamFailed(e.to_string()));
            }
            Err(SendError::Body(e)) => return Err(super::body_failed(&e)),
        };
        let Head {
            mut parts,
            framing,
            keep_alive,
        } = head;
        if let Err(why) = request::check_answer(&method, parts.status, &mut parts.headers, false) {
            tracing::warn!(error = why, "upstream answer refused");
            return Err(ProxyError::UpstreamFailed(why.into()));
        }
        // A connection the request authenticated (NTLM) would run the next request, another
        // caller's, as this one's user: never pooled.
        let returning = (keep_alive && !authenticates).then(|| Arc::clone(pool));
        let body = AnswerBody::new(
            conn,
            Decoder::new(framing),
            Some(upload),
            returning,
            finish_within,
        );
        return Ok(Response::from_parts(parts, body));
    }
}

#[cfg(test)]
mod answer_grammar;
#[cfg(test)]
mod differential_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod request_tests;
#[cfg(test)]
mod tests;
