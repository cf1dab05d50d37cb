//! The hand-written HTTP/1.1 upstream client, opt-in (`connections.upstream_http1:
//! idemgate`; hyper's client connections are the default until this one's fuzz and
//! differential proofs are in, issue 24).
//!
//! The wire format is sans IO, in pure functions over a byte buffer that the proofs can
//! call directly: the answer head ([`head::parse_head`]), the answer body
//! ([`decoder::Decoder`]) and the request head ([`encode::encode_head`]).
//! Kept is the rule that keeps a pooled connection in step with the upstream: it is reused
//! only after an answer whose end its framing marked, with no byte left over.

pub(crate) mod decoder;
pub(crate) mod encode;
pub(crate) mod head;
