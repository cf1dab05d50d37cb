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
    let AnswerBody::TooLarge(body) = bounded(full, 4, &budget(), &Arc::default()).await.unwrap()
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
