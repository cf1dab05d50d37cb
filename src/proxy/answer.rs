//! Bodies read with a bound. The owner's upstream answer: up to `max_answer` bytes it is
//! buffered whole (to be stored and replayed); past that it streams on to its client, the
//! part already read first, so memory stays bounded whatever the upstream sends. Streaming
//! on, it is an upstream stream like a pass-through answer: cut off once the upstream sends
//! nothing for `connections.upstream_read_timeout` (its `upstream_timeout` ended with the
//! head), trailers filtered ([`ProxyBody::upstream`]). The trailers of an answer read whole
//! are kept, filtered alike, and count toward the bound and the budget as its body does
//! (so a gRPC call's `grpc-status` is stored and replayed, and huge trailers stream on
//! like a huge body). The same bound lets an observed request larger than `max_body` go on
//! unchanged. What is buffered is taken from the process's [`Budget`], and from the share
//! of the client connection the request came on, as it comes; a body that finds no room in
//! either streams on past the part read, as one over the bound does.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use std::sync::Arc;

use super::body::forwardable;
use super::body::{BodyError, Joined, ProxyBody, ReadGap};
use super::budget::{Budget, Charge, ConnBuffers, Refusal, Short};
use super::headers::{declare_trailers, strip_hop_by_hop, trailer_names_kept};
use super::replay::IDEMPOTENT_REPLAYED;
use crate::error::ProxyError;

/// An upstream answer as the owner got it.
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers, hop-by-hop ones removed.
    pub headers: HeaderMap,
    /// Its body.
    pub body: AnswerBody,
    /// The trailers of a body read whole, filtered as a streamed answer's; they go to the
    /// client after it.
    pub trailers: Option<HeaderMap>,
    /// What a body read whole (and its trailers) holds of the budget, kept apart from it:
    /// the owner hands it on to the copy its client is answered from, which may outlive
    /// the body ([`super::settlement`]). Nothing for a body that streams on, whose part
    /// read holds its own.
    pub charge: Charge,
}

/// A body read with a bound.
pub enum AnswerBody {
    /// Read whole: at most the bound.
    Whole(Bytes),
    /// Larger than the bound: streams on, the part read so far first (an answer with its
    /// [`ReadGap`] as its bound between two parts).
    TooLarge(ProxyBody),
}

impl Answer {
    /// This answer as the owner's, to be stored and replayed: without the upstream's own
    /// `Idempotent-Replayed`, as a header or a trailer (read whole, or streamed on and
    /// declared in `Trailer`). The proxy alone says an answer is a replay: one run now
    /// that said so would look replayed to its client, and stored, would carry it into
    /// every replay beside the proxy's own. Any other answer (unclaimed, passed through,
    /// observed) goes to its client untouched: the proxy says nothing of it. (An observed
    /// owner's is stored too; a replay once enforcement is on puts its own header over the
    /// upstream's, but an upstream trailer of that name stays.)
    pub fn owned(mut self) -> Self {
        self.headers.remove(&IDEMPOTENT_REPLAYED);
        if let Some(trailers) = &mut self.trailers {
            trailers.remove(&IDEMPOTENT_REPLAYED);
            if trailers.is_empty() {
                self.trailers = None;
            }
        }
        if let AnswerBody::TooLarge(body) = self.body {
            undeclare_replayed(&mut self.headers);
            self.body = AnswerBody::TooLarge(ProxyBody::boxed(body.map_frame(|frame| {
                match frame.into_trailers() {
                    Ok(mut trailers) => {
                        trailers.remove(&IDEMPOTENT_REPLAYED);
                        Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                }
            })));
        }
        self
    }

    /// The answer for the client, its body holding the answer's charge until it is sent
    /// or dropped.
    pub fn into_response(self) -> Response<ProxyBody> {
        match self.body {
            AnswerBody::Whole(bytes) => {
                let body = self.charge.attach(bytes);
                whole(self.status, self.headers, body, self.trailers)
            }
            AnswerBody::TooLarge(body) => {
                let mut response = Response::new(body);
                *response.status_mut() = self.status;
                *response.headers_mut() = self.headers;
                response
            }
        }
    }
}

/// An answer held whole (the owner's, or a replay), its `trailers` after the body and named
/// in a `Trailer` field.
pub fn whole(
    status: StatusCode,
    mut headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
) -> Response<ProxyBody> {
    let body = match trailers {
        None => ProxyBody::full(body),
        Some(trailers) => {
            declare_trailers(&mut headers, &trailers);
            ProxyBody::full_with_trailers(body, trailers)
        }
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// Takes `Idempotent-Replayed` out of the `Trailer` field of `headers`, which a streamed
/// answer keeps as the upstream declared it.
fn undeclare_replayed(headers: &mut HeaderMap) {
    match trailer_names_kept(headers, |name| *name != IDEMPOTENT_REPLAYED) {
        Some(kept) => headers.insert(http::header::TRAILER, kept),
        None => headers.remove(http::header::TRAILER),
    };
}

/// Reads `response`'s body, whole if it is at most `max` bytes (its trailers counted) and
/// `budget` and the connection `conn` counts have room for it, with its trailers. A body
/// that breaks off is an
/// [`ProxyError::UpstreamFailed`]: the request went out. A larger one (or one without
/// room) streams on as an upstream answer, cut off once the upstream sends nothing for the
/// body's [`ReadGap`]: no timer covers it any more, and a stalled upstream would hold its
/// client (and its connection) forever. An owner's answer is then made [`Answer::owned`].
pub async fn read<B>(
    response: Response<B>,
    max: usize,
    budget: &Arc<Budget>,
    conn: &Arc<ConnBuffers>,
) -> Result<Answer, ProxyError>
where
    B: Body<Data = Bytes> + ReadGap + Send + Unpin + 'static,
    B::Error: Into<BodyError> + std::fmt::Display,
{
    let (mut head, body) = response.into_parts();
    let declared = strip_hop_by_hop(&mut head.headers, false).declared_trailers;
    let gap = body.read_gap();
    let stream_on = |rest| ProxyBody::upstream(rest, gap);
    let (body, trailers, charge) =
        bounded_then(body, max, (budget, conn), Refusal::Answer, stream_on)
            .await
            .map_err(|e| ProxyError::UpstreamFailed(e.to_string()))?;
    // Streaming on, its trailers are still to come: declared as the upstream declared
    // them, as a pass-through answer's are (an HTTP/1.1 client gets only declared ones).
    // One read whole declares those it kept ([`whole`]).
    if let (AnswerBody::TooLarge(_), Some(declared)) = (&body, declared) {
        head.headers.insert(http::header::TRAILER, declared);
    }
    Ok(Answer {
        status: head.status,
        headers: head.headers,
        body,
        trailers,
        charge,
    })
}

/// Reads a request's `body` whole if it is at most `max` bytes and `budget` and the
/// connection `conn` counts have room for it; past that, a body that streams on with the
/// part already read first. A declared length over the bound streams at once, without
/// buffering `max` first.
pub async fn bounded<B>(
    body: B,
    max: usize,
    budget: &Arc<Budget>,
    conn: &Arc<ConnBuffers>,
) -> Result<AnswerBody, B::Error>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    let account = (budget, conn);
    let read = bounded_then(body, max, account, Refusal::RequestBody, ProxyBody::boxed).await?;
    Ok(match read {
        (AnswerBody::Whole(body), _, charge) => AnswerBody::Whole(charge.attach(body)),
        (too_large, _, _) => too_large,
    })
}

/// [`bounded`], the body past the bound made into a [`ProxyBody`] by `stream_on`. What it
/// holds stays within `max` ([`Joined`]) and is taken from `budget` and the connection's
/// share; the frame that would pass the bound, or finds no room, is not copied in but
/// streams on after the part read before it (which keeps its bytes of the budget until it
/// has gone). The trailers of a body read whole come beside it, filtered, counted toward
/// `max` and charged as data (each field as a stored record holds it); trailers without
/// room stream on after the body read, which then was not read whole. A body read whole
/// comes with the charge that pays for it, apart from it; one that streams on, with none.
async fn bounded_then<B>(
    mut body: B,
    max: usize,
    (budget, conn): (&Arc<Budget>, &Arc<ConnBuffers>),
    what: Refusal,
    stream_on: impl FnOnce(Prefixed<B>) -> ProxyBody,
) -> Result<(AnswerBody, Option<HeaderMap>, Charge), B::Error>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    let declared = body.size_hint().exact();
    if declared.is_some_and(|n| n > max as u64) {
        let streamed = stream_on(Prefixed {
            prefix: [None, None],
            trailers: None,
            rest: body,
        });
        return Ok((AnswerBody::TooLarge(streamed), None, Charge::unbounded()));
    }
    let mut joined = Joined::new(declared, max, budget.charge(conn));
    let mut trailers = None;
    let past = loop {
        let Some(frame) = body.frame().await else {
            let (whole, charge) = joined.into_parts();
            return Ok((AnswerBody::Whole(whole), trailers, charge));
        };
        let data = match frame?.into_data() {
            Ok(data) => data,
            // A request read whole goes on without its trailers: they are not kept.
            Err(_) if what != Refusal::Answer => continue,
            Err(frame) => {
                let Some(kept) = frame.into_trailers().ok().and_then(forwardable) else {
                    continue;
                };
                let size = fields_size(&kept);
                let short = if joined.len() + size > max {
                    None
                } else {
                    match joined.charge_more(size) {
                        Ok(()) => {
                            trailers = Some(kept);
                            continue;
                        }
                        Err(short) => Some(short),
                    }
                };
                if let Some(short) = short {
                    refused(budget, what, short);
                }
                let read = joined.into_bytes();
                let streamed = stream_on(Prefixed {
                    prefix: [(!read.is_empty()).then_some(read), None],
                    trailers: Some(kept),
                    rest: body,
                });
                return Ok((AnswerBody::TooLarge(streamed), None, Charge::unbounded()));
            }
        };
        if joined.len() + data.len() > max {
            break data;
        }
        if let Err((data, short)) = joined.push(data) {
            refused(budget, what, short);
            break data;
        }
    };
    let read = joined.into_bytes();
    let streamed = stream_on(Prefixed {
        prefix: [(!read.is_empty()).then_some(read), Some(past)],
        trailers: None,
        rest: body,
    });
    Ok((AnswerBody::TooLarge(streamed), None, Charge::unbounded()))
}

/// Counts and logs a body that found no room under the limit `short`.
fn refused(budget: &Budget, what: Refusal, short: Short) {
    budget.refused(what, short);
    tracing::warn!(
        body = what.as_str(),
        limit = short.as_str(),
        "no room left under the buffer limit: this body streams on unbuffered \
         (an owner's answer is recorded as executed, not stored)"
    );
}

/// What `fields` weigh against the bound: what a stored record holds for each, its name and
/// value with their lengths.
fn fields_size(fields: &HeaderMap) -> usize {
    fields
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum()
}

/// `prefix` (the part read within the bound, then the frame that passed it), then
/// `trailers` already read, then the rest of the body it was read from.
struct Prefixed<B> {
    prefix: [Option<Bytes>; 2],
    trailers: Option<HeaderMap>,
    rest: B,
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BodyError>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.prefix.iter_mut().find_map(Option::take) {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Pin::new(&mut this.rest)
            .poll_frame(cx)
            .map(|frame| frame.map(|result| result.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.iter().all(Option::is_none)
            && self.trailers.is_none()
            && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self.prefix.iter().flatten().map(|c| c.len() as u64).sum();
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + read);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + read);
        }
        hint
    }
}

#[cfg(test)]
mod tests;
