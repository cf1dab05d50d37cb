//! Records with trailers: they round-trip in clear and sealed, records without them keep
//! the layout every earlier build wrote, and no truncated or corrupted record panics.

use super::*;

fn grpc_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t.append("grpc-message", HeaderValue::from_static("s3cr3t-done"));
    t.append("x-note", HeaderValue::from_static("a"));
    t.append("x-note", HeaderValue::from_static("b"));
    t
}

fn trailed() -> StoredResponse {
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    StoredResponse::with_trailers(StatusCode::OK, &h, b"hello", Some(&grpc_trailers()))
        .with_fingerprint(Digest([5; 32]))
}

#[test]
fn trailers_round_trip_after_the_body_through_a_stores_encoding() {
    let r = trailed();
    assert_eq!(r.encode()[0], TRAILED);
    let back = StoredResponse::decode(Digest([5; 32]), r.encode()).unwrap();
    assert_eq!(back, r);
    assert_eq!(back.trailers(), Some(grpc_trailers()));
    let notes: Vec<_> = back
        .trailers()
        .unwrap()
        .get_all("x-note")
        .iter()
        .cloned()
        .collect();
    assert_eq!(notes, ["a", "b"]);
    let (status, headers, body) = back.parts();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers.len(), 1);
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(&body[..], b"hello");
    assert_eq!(back.body(), body);
    assert!(back.cost() > StoredResponse::new(status, &headers, &body).cost());
}

/// A record without trailers is byte for byte what builds before trailers wrote (version 1),
/// so each reads the other's; an empty trailers map is no trailers.
#[test]
fn a_record_without_trailers_keeps_version_one_exactly() {
    let mut h = HeaderMap::new();
    h.insert("x-a", HeaderValue::from_static("1"));
    for trailers in [None, Some(&HeaderMap::new())] {
        let r = StoredResponse::with_trailers(StatusCode::CREATED, &h, b"ok", trailers);
        let mut expected = vec![1, 0, 201];
        expected.extend_from_slice(&r.encode()[3..11]);
        expected.extend_from_slice(&[0, 0, 0, 10, 0, 3, b'x', b'-', b'a', 0, 0, 0, 1, b'1']);
        expected.extend_from_slice(b"ok");
        assert_eq!(r.encode(), &expected[..]);
        assert_eq!(r.trailers(), None);
        // Built a moment later: all but the time it was made (bytes 3..11, ms) is equal.
        let plain =
            StoredResponse::new(StatusCode::CREATED, &h, b"ok").with_fingerprint(Digest::NONE);
        assert_eq!(r.encode()[..3], plain.encode()[..3]);
        assert_eq!(r.encode()[11..], plain.encode()[11..]);
    }
    let ring = KeyRing::new(vec![[9; 32]]).unwrap();
    let sealed = StoredResponse::new(StatusCode::OK, &h, b"ok").seal(&ring, Digest([1; 32]));
    assert_eq!(sealed.encode()[0], SEALED);
}

/// Sealed, the trailers are ciphertext; they come back when the record opens, for its key
/// only, and the version byte is bound like the rest of the clear part.
#[test]
fn sealed_trailers_are_hidden_and_open_for_their_key_only() {
    let plain = trailed();
    let ring = KeyRing::new(vec![[9; 32]]).unwrap();
    let key = Digest([1; 32]);
    let sealed = plain.seal(&ring, key);
    assert_eq!(sealed.encode()[0], SEALED_TRAILED);
    assert!(sealed.is_sealed());
    let bytes = sealed.encode();
    for secret in [&b"s3cr3t"[..], b"grpc-status"] {
        assert!(!bytes.windows(secret.len()).any(|w| w == secret));
    }
    let back = StoredResponse::decode(Digest([5; 32]), bytes).unwrap();
    let opened = back.open(Some(&ring), key).unwrap();
    assert_eq!(opened, plain);
    assert_eq!(opened.trailers(), Some(grpc_trailers()));
    assert_eq!(
        sealed.clone().open(Some(&ring), Digest([2; 32])),
        Err(SealError::Corrupt)
    );
    // Read as a record without trailers, it does not open.
    let mut downgraded = bytes.to_vec();
    downgraded[0] = SEALED;
    let downgraded = StoredResponse::decode(Digest([5; 32]), &downgraded).unwrap();
    assert_eq!(downgraded.open(Some(&ring), key), Err(SealError::Corrupt));
}

/// Reads every part of a record, as a replay and the admin view do.
fn read_all(r: &StoredResponse) {
    let _ = (
        r.status(),
        r.stored_at(),
        r.headers(),
        r.trailers(),
        r.body(),
    );
    let _ = (r.parts(), r.cost(), format!("{r:?}"));
}

/// Every truncation of a record, in clear or sealed, with trailers or not, decodes to
/// `None` or to a record whose every part reads without a panic; one cut inside its head
/// or trailers is refused.
#[test]
fn truncated_records_are_refused_or_read_without_panic() {
    let ring = KeyRing::new(vec![[9; 32]]).unwrap();
    let key = Digest([1; 32]);
    let plain = trailed();
    let records = [
        plain.clone(),
        plain.seal(&ring, key),
        StoredResponse::new(StatusCode::OK, &grpc_trailers(), b"body"),
    ];
    for record in &records {
        let bytes = record.encode();
        let body_from = bytes.len() - record.opened(&ring, key).body().len();
        for cut in 0..bytes.len() {
            match StoredResponse::decode(Digest([5; 32]), &bytes[..cut]) {
                Some(r) => {
                    read_all(&r);
                    if let Ok(opened) = r.open(Some(&ring), key) {
                        read_all(&opened);
                    }
                    assert!(
                        record.is_sealed() || cut >= body_from,
                        "cut at {cut} inside the head or trailers was read"
                    );
                }
                None => assert!(record.is_sealed() || cut < body_from, "cut at {cut}"),
            }
        }
    }
}

impl StoredResponse {
    /// Opened under `ring` if sealed, for the tests' arithmetic.
    fn opened(&self, ring: &KeyRing, key: Digest) -> StoredResponse {
        self.clone().open(Some(ring), key).unwrap()
    }
}

/// Every byte of a record changed to a few values (lengths made huge, versions swapped,
/// names made invalid) decodes to `None` or to a record that reads without a panic.
#[test]
fn corrupted_records_are_refused_or_read_without_panic() {
    let plain = trailed();
    let bytes = plain.encode();
    for at in 0..bytes.len() {
        for value in [0x00, 0x01, 0x04, 0x05, 0x7f, 0xff] {
            let mut corrupt = bytes.to_vec();
            corrupt[at] = value;
            if let Some(r) = StoredResponse::decode(Digest([5; 32]), &corrupt) {
                read_all(&r);
            }
        }
    }
    // A trailers length past the end of the record, and one that wraps.
    let head_end = HEAD_AT + plain.head_len() - VERSION_AT;
    for len in [u32::MAX, bytes.len() as u32] {
        let mut corrupt = bytes.to_vec();
        corrupt[head_end..head_end + 4].copy_from_slice(&len.to_be_bytes());
        assert!(StoredResponse::decode(Digest([5; 32]), &corrupt).is_none());
    }
}
