//! [`ProxyBody`]'s frames, trailers filtered, and [`Joined`]'s buffer.

use super::*;
use http::HeaderValue;

/// One data frame, then `trailers`.
fn with_trailers(trailers: &[(&'static str, &'static str)]) -> ProxyBody {
    let mut map = HeaderMap::new();
    for (name, value) in trailers {
        map.append(*name, HeaderValue::from_static(value));
    }
    let frames = [
        Frame::data(Bytes::from_static(b"hello")),
        Frame::trailers(map),
    ];
    let stream = futures_util::stream::iter(frames.map(Ok::<_, BodyError>));
    ProxyBody::upstream(http_body_util::StreamBody::new(stream), None)
}

/// An upstream's trailers go on without a length, a cookie, a client address or a
/// connection field: a client that merges them into the head would take them as the
/// answer's own.
#[tokio::test]
async fn an_answers_trailers_lose_header_only_and_forwarding_fields() {
    let body = with_trailers(&[
        ("x-checksum", "1"),
        ("content-length", "5"),
        ("set-cookie", "a=b"),
        ("x-checksum", "2"),
        ("x-forwarded-for", "10.0.0.1"),
        ("connection", "close"),
    ]);
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(collected.to_bytes(), "hello");
    let kept: Vec<_> = trailers
        .iter()
        .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
        .collect();
    assert_eq!(kept, [("x-checksum", "1"), ("x-checksum", "2")]);
}

/// A body of one frame is that frame, not a copy of it: the hot path of every
/// protected request.
#[test]
fn a_body_of_one_frame_is_kept_without_a_copy() {
    let frame = Bytes::from(vec![7u8; 1000]);
    let mut joined = Joined::new(Some(1000), 4096, Charge::unbounded());
    joined.push(Bytes::new()).unwrap();
    joined.push(frame.clone()).unwrap();
    joined.push(Bytes::new()).unwrap();
    let whole = joined.into_bytes();
    assert_eq!(whole.as_ptr(), frame.as_ptr());
    assert_eq!(whole.len(), 1000);
}

/// Many small frames are copied into one buffer that never grows past the limit.
#[test]
fn small_frames_are_joined_in_one_buffer_within_the_limit() {
    for declared in [None, Some(10_000)] {
        let mut joined = Joined::new(declared, 10_000, Charge::unbounded());
        for i in 0..10_000u32 {
            joined.push(Bytes::from(vec![i as u8])).unwrap();
            assert!(joined.copied.capacity() <= 10_000, "{declared:?}");
        }
        let whole = joined.into_bytes();
        assert_eq!(whole.len(), 10_000);
        assert!(whole.iter().enumerate().all(|(i, b)| *b == i as u8));
    }
}

/// A body holds no byte the budget did not give: a frame with no room is handed back,
/// and the bytes come back when the body drops.
#[test]
fn a_body_takes_what_it_holds_from_the_budget() {
    let metrics = crate::metrics::Metrics::new();
    let budget = Budget::new(20_000, 100_000, metrics.buffers());
    let mut joined = Joined::new(None, 100_000, budget.charge(&Arc::default()));
    joined.push(Bytes::from(vec![1u8; 6000])).unwrap();
    assert_eq!(budget.held(), 6000);
    // The growth step (8 KiB) fits, then 16 KiB does, then nothing past 20 000.
    joined.push(Bytes::from(vec![2u8; 1000])).unwrap();
    assert_eq!(budget.held(), 8192);
    joined.push(Bytes::from(vec![3u8; 9000])).unwrap();
    assert_eq!(budget.held(), 16_384);
    let (refused, short) = joined.push(Bytes::from(vec![4u8; 5000])).unwrap_err();
    assert_eq!((refused.len(), short), (5000, Short::Total));
    assert_eq!(budget.held(), 16_384);
    // Room for the data alone, though not for a doubling.
    joined.push(Bytes::from(vec![5u8; 3000])).unwrap();
    assert_eq!(budget.held(), 19_000);
    let whole = joined.into_bytes();
    assert_eq!(whole.len(), 19_000);
    assert_eq!(budget.held(), 19_000);
    drop(whole);
    assert_eq!(budget.held(), 0);
}

/// Trailers of which nothing may go on end the body without a trailers frame.
#[tokio::test]
async fn trailers_left_empty_are_not_sent() {
    let body = with_trailers(&[("content-length", "5")]);
    let collected = body.collect().await.unwrap();
    assert!(collected.trailers().is_none());
    assert_eq!(collected.to_bytes(), "hello");
}
