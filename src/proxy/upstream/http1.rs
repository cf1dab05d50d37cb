//! The hand-written HTTP/1.1 upstream client, opt-in (`connections.upstream_http1:
//! idemgate`): hyper's client connections stay the default until this one's fuzz and
//! differential proofs are in (issue 24).
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

use super::pool::{Handshake, Leased};
use crate::error::ProxyError;
use connection::Connection;

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

#[cfg(test)]
mod tests;
