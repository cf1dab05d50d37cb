//! The stored response's encoding: what goes in comes out, sealed or not.

use super::*;

#[test]
fn repeated_headers_survive_in_order() {
    let mut h = HeaderMap::new();
    h.append("set-cookie", HeaderValue::from_static("a=1"));
    h.append("set-cookie", HeaderValue::from_static("b=2"));
    h.insert("content-type", HeaderValue::from_static("application/json"));
    let r = StoredResponse::new(StatusCode::CREATED, &h, b"{}");
    let back = r.headers();
    let cookies: Vec<_> = back.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert_eq!(back["content-type"], "application/json");
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(&r.body()[..], b"{}");
}

#[test]
fn encoding_round_trips_binary_bodies() {
    let mut h = HeaderMap::new();
    h.insert("x-a", HeaderValue::from_static("1"));
    let body: Vec<u8> = (0..=255).collect();
    let r = StoredResponse::new(StatusCode::OK, &h, &body);
    let fingerprint = Digest([9; 32]);
    let back = StoredResponse::decode(fingerprint, r.encode()).unwrap();
    assert_eq!(back.status(), r.status());
    assert_eq!(back.body(), r.body());
    assert_eq!(back.headers(), r.headers());
    assert_eq!(back.fingerprint(), fingerprint);
    assert_eq!(r.with_fingerprint(fingerprint), back);
    assert!(StoredResponse::decode(fingerprint, b"\x02junk").is_none());
    // A head longer than the record is malformed, not a panic.
    let mut cut = back.encode().to_vec();
    cut.truncate(16);
    assert!(StoredResponse::decode(fingerprint, &cut).is_none());
}

#[test]
fn stamping_a_shared_record_leaves_the_other_holders_alone() {
    let r = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), b"x");
    let body = r.body();
    let kept = r.clone();
    let stamped = r.with_fingerprint(Digest([3; 32]));
    assert_eq!(stamped.fingerprint(), Digest([3; 32]));
    assert_eq!(kept.fingerprint(), Digest::NONE);
    assert_eq!(&body[..], b"x");
    assert_eq!(stamped.body(), kept.body());
}

#[test]
fn sealed_records_hide_status_headers_and_body_and_open_for_their_key_only() {
    let mut h = HeaderMap::new();
    h.append(
        "set-cookie",
        HeaderValue::from_static("session=s3cr3t-cookie"),
    );
    let plain = StoredResponse::new(StatusCode::CREATED, &h, b"{\"token\":\"s3cr3t-body\"}")
        .with_fingerprint(Digest([5; 32]));
    let ring = KeyRing::new(vec![[9; 32]]).unwrap();
    let key = Digest([1; 32]);
    let sealed = plain.seal(&ring, key);
    assert!(sealed.is_sealed() && !plain.is_sealed());
    let bytes = sealed.encode();
    for secret in [&b"s3cr3t"[..], b"set-cookie"] {
        assert!(!bytes.windows(secret.len()).any(|w| w == secret));
    }
    assert_eq!(sealed.fingerprint(), Digest([5; 32]));
    assert_eq!(sealed.stored_at(), plain.stored_at());
    assert!(sealed.cost() > plain.cost(), "the sealed size is charged");
    // Through a store's encoding and back, then opened.
    let back = StoredResponse::decode(sealed.fingerprint(), sealed.encode()).unwrap();
    let opened = back.open(Some(&ring), key).unwrap();
    assert_eq!(opened, plain);
    assert_eq!(opened.headers()["set-cookie"], "session=s3cr3t-cookie");
    // Another store key, no ring, or a plain record.
    assert_eq!(
        sealed.clone().open(Some(&ring), Digest([2; 32])),
        Err(SealError::Corrupt)
    );
    assert_eq!(sealed.clone().open(None, key), Err(SealError::NoKeys));
    assert_eq!(plain.clone().open(Some(&ring), key).unwrap(), plain);
}

#[test]
fn the_stored_body_does_not_share_the_source_buffer() {
    let socket_buffer = Bytes::from(vec![7u8; 64 * 1024]);
    let r = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), &socket_buffer[..10]);
    assert_eq!(r.cost(), 10 + ENTRY_OVERHEAD);
    drop(socket_buffer);
    assert_eq!(&r.body()[..], &[7u8; 10]);
}
