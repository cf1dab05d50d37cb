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
use super::headers::{declare_trailers, strip_hop_by_hop};
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
    let Some(declared) = headers.get(http::header::TRAILER) else {
        return;
    };
    let names = declared.to_str().unwrap_or("").split(',').map(str::trim);
    let kept: Vec<&str> = names
        .filter(|name| !name.eq_ignore_ascii_case(IDEMPOTENT_REPLAYED.as_str()))
        .collect();
    match http::HeaderValue::from_str(&kept.join(", ")) {
        Ok(value) if !kept.is_empty() => headers.insert(http::header::TRAILER, value),
        _ => headers.remove(http::header::TRAILER),
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
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A budget that never runs out in these tests.
    fn budget() -> Arc<Budget> {
        Budget::new(
            usize::MAX,
            usize::MAX,
            crate::metrics::Metrics::new().buffers(),
        )
    }

    /// A body of prepared frames (data, then perhaps trailers), with no declared length.
    struct Chunks(VecDeque<Frame<Bytes>>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BodyError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(Ok))
        }
    }

    impl ReadGap for Chunks {
        fn read_gap(&self) -> Option<std::time::Duration> {
            None
        }
    }

    /// Prepared chunks, then nothing ever, with a read gap of one second.
    struct Stalls(VecDeque<Bytes>);

    impl Body for Stalls {
        type Data = Bytes;
        type Error = BodyError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
            match self.get_mut().0.pop_front() {
                Some(c) => Poll::Ready(Some(Ok(Frame::data(c)))),
                None => Poll::Pending,
            }
        }
    }

    impl ReadGap for Stalls {
        fn read_gap(&self) -> Option<std::time::Duration> {
            Some(std::time::Duration::from_secs(1))
        }
    }

    fn chunks(parts: &[&'static [u8]]) -> Response<Chunks> {
        Response::new(Chunks(
            parts
                .iter()
                .map(|p| Frame::data(Bytes::from_static(p)))
                .collect(),
        ))
    }

    async fn all_of(body: ProxyBody) -> Vec<u8> {
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn an_answer_within_the_bound_is_read_whole() {
        let answer = read(chunks(&[b"hel", b"lo"]), 5, &budget(), &Arc::default())
            .await
            .unwrap();
        assert!(matches!(answer.body, AnswerBody::Whole(ref b) if &b[..] == b"hello"));
    }

    /// Past the bound the answer streams on, byte for byte, the part read first.
    #[tokio::test]
    async fn a_larger_answer_streams_on_whole() {
        let answer = read(
            chunks(&[b"abc", b"def", b"ghi"]),
            4,
            &budget(),
            &Arc::default(),
        )
        .await
        .unwrap();
        let AnswerBody::TooLarge(body) = answer.body else {
            panic!("read whole past the bound");
        };
        assert_eq!(all_of(body).await, b"abcdefghi");
    }

    /// An answer within the bound that the budget has no room for streams on whole, the
    /// part read first, which holds its bytes of the budget until it has gone.
    #[tokio::test]
    async fn an_answer_without_room_in_the_budget_streams_on_whole() {
        let metrics = crate::metrics::Metrics::new();
        let budget = Budget::new(5, 5, metrics.buffers());
        let answer = read(
            chunks(&[b"abc", b"def", b"ghi"]),
            100,
            &budget,
            &Arc::default(),
        )
        .await
        .unwrap();
        let AnswerBody::TooLarge(body) = answer.body else {
            panic!("read whole past the budget");
        };
        assert_eq!(budget.held(), 3);
        assert_eq!(all_of(body).await, b"abcdefghi");
        assert_eq!(budget.held(), 0);
        let text = metrics.render(Default::default());
        assert!(
            text.contains(r#"idemgate_buffer_refusals_total{what="answer"} 1"#),
            "{text}"
        );
    }

    /// A declared length over the bound streams at once.
    #[tokio::test]
    async fn a_declared_length_over_the_bound_is_not_buffered() {
        let full = http_body_util::Full::new(Bytes::from_static(b"0123456789"))
            .map_err(|never: std::convert::Infallible| -> BodyError { match never {} });
        let AnswerBody::TooLarge(body) =
            bounded(full, 4, &budget(), &Arc::default()).await.unwrap()
        else {
            panic!("read whole past the bound");
        };
        assert_eq!(all_of(body).await, b"0123456789");
    }

    /// Past the bound no timer covers the answer any more: an upstream that stops sending
    /// ends the stream with an error after its read gap, the part that came first.
    #[tokio::test(start_paused = true)]
    async fn a_larger_answer_that_stalls_is_cut_off_after_its_read_gap() {
        let parts = [b"abc", b"def"].map(|p| Bytes::from_static(p));
        let answer = read(
            Response::new(Stalls(parts.into())),
            4,
            &budget(),
            &Arc::default(),
        )
        .await
        .unwrap();
        let AnswerBody::TooLarge(mut body) = answer.body else {
            panic!("read whole past the bound");
        };
        let mut got = Vec::new();
        // A hang guard only (the clock is paused: it passes at once when nothing else can).
        let end = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            loop {
                match body.frame().await {
                    Some(Ok(frame)) => got.extend_from_slice(&frame.into_data().unwrap()),
                    other => break other,
                }
            }
        })
        .await
        .expect("hang guard: the stalled answer was never cut off");
        assert_eq!(got, b"abcdef");
        assert!(
            matches!(end, Some(Err(BodyError::UpstreamStalled(gap))) if gap.as_secs() == 1),
            "{end:?}"
        );
    }

    /// `hello`, then the trailers `grpc-status: 0`, `grpc-message: <message>` and a
    /// `set-cookie`, which only a header section may carry.
    fn grpc(message: &str) -> Response<Chunks> {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.insert("grpc-message", message.parse().unwrap());
        trailers.insert("set-cookie", "a=b".parse().unwrap());
        Response::new(Chunks(
            [
                Frame::data(Bytes::from_static(b"hello")),
                Frame::trailers(trailers),
            ]
            .into(),
        ))
    }

    /// What `grpc(message)`'s kept trailers weigh.
    fn grpc_weight(message: &str) -> usize {
        6 + "grpc-status".len() + 1 + 6 + "grpc-message".len() + message.len()
    }

    /// An answer read whole keeps its trailers, filtered, and holds their bytes of the
    /// budget beside its body's until both have gone.
    #[tokio::test]
    async fn an_answer_read_whole_keeps_its_trailers_charged_as_its_body() {
        let metrics = crate::metrics::Metrics::new();
        let budget = Budget::new(1 << 20, 1 << 20, metrics.buffers());
        let answer = read(grpc("ok"), 100, &budget, &Arc::default())
            .await
            .unwrap();
        assert!(matches!(answer.body, AnswerBody::Whole(ref b) if &b[..] == b"hello"));
        let trailers = answer.trailers.clone().expect("trailers kept");
        let names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["grpc-status", "grpc-message"]);
        assert_eq!(budget.held(), (5 + grpc_weight("ok")) as u64);
        let collected = answer.into_response().into_body().collect().await.unwrap();
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "hello");
        assert_eq!(budget.held(), 0);
    }

    /// Trailers count toward `max_answer`: past it, the answer streams on (not stored), its
    /// trailers after the body.
    #[tokio::test]
    async fn trailers_past_the_bound_stream_the_answer_on_with_them() {
        let message = "m".repeat(200);
        let max = 5 + grpc_weight(&message) - 1;
        let answer = read(grpc(&message), max, &budget(), &Arc::default())
            .await
            .unwrap();
        let AnswerBody::TooLarge(body) = answer.body else {
            panic!("read whole past the bound");
        };
        assert!(answer.trailers.is_none());
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers streamed on");
        assert_eq!(trailers["grpc-message"], message.as_str());
        assert!(!trailers.contains_key("set-cookie"));
        assert_eq!(collected.to_bytes(), "hello");
        // One byte more and it is read whole.
        let answer = read(grpc(&message), max + 1, &budget(), &Arc::default())
            .await
            .unwrap();
        assert!(matches!(answer.body, AnswerBody::Whole(_)));
    }

    /// Trailers the budget has no room for stream the answer on, as a body would.
    #[tokio::test]
    async fn trailers_without_room_in_the_budget_stream_the_answer_on() {
        let metrics = crate::metrics::Metrics::new();
        let budget = Budget::new(64, 64, metrics.buffers());
        let message = "m".repeat(100);
        let answer = read(grpc(&message), 1 << 20, &budget, &Arc::default())
            .await
            .unwrap();
        let AnswerBody::TooLarge(body) = answer.body else {
            panic!("read whole past the budget");
        };
        assert_eq!(budget.held(), 5);
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
        drop(collected);
        assert_eq!(budget.held(), 0);
        let text = metrics.render(Default::default());
        assert!(
            text.contains(r#"idemgate_buffer_refusals_total{what="answer"} 1"#),
            "{text}"
        );
    }
}
