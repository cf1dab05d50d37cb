//! The stored response's encoding: what goes in comes out, sealed or not.

use super::*;
use crate::store::seal::ClearRecords;

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

/// A store writer who changes a sealed record's clear fingerprint (to the next request's, or
/// to none, which matches every payload) would turn a 422 into a replay: the seal binds it,
/// with the status copy and the time stored.
#[test]
fn a_sealed_record_whose_clear_fields_changed_does_not_open() {
    let plain = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), b"{\"id\":1}")
        .with_fingerprint(Digest([5; 32]));
    let ring = KeyRing::new(vec![[9; 32]]).unwrap();
    let key = Digest([1; 32]);
    let sealed = plain.seal(&ring, key);
    assert_eq!(sealed.encode()[0], SEALED);
    for fingerprint in [Digest::NONE, Digest([6; 32])] {
        let moved = StoredResponse::decode(fingerprint, sealed.encode()).unwrap();
        assert_eq!(moved.open(Some(&ring), key), Err(SealError::Corrupt));
    }
    for at in [STATUS_AT + 1, STORED_AT + 7] {
        let mut bytes = sealed.encode().to_vec();
        bytes[at - VERSION_AT] ^= 1;
        let changed = StoredResponse::decode(Digest([5; 32]), &bytes).unwrap();
        assert_eq!(changed.open(Some(&ring), key), Err(SealError::Corrupt));
    }
    // Nor is it read as the earlier, unbound format.
    let mut bytes = sealed.encode().to_vec();
    bytes[0] = SEALED_UNBOUND;
    let downgraded = StoredResponse::decode(Digest::NONE, &bytes).unwrap();
    assert_eq!(downgraded.open(Some(&ring), key), Err(SealError::Corrupt));
}

/// A record as builds before the fingerprint was bound sealed it (version 2).
fn sealed_unbound(plain: &StoredResponse, ring: &KeyRing, key: Digest) -> StoredResponse {
    let r = &plain.record;
    let mut record = r[..VERSION_AT].to_vec();
    record.push(SEALED_UNBOUND);
    record.extend_from_slice(&r[STATUS_AT..HEAD_LEN_AT]);
    let mut plaintext = r[STATUS_AT..STORED_AT].to_vec();
    plaintext.extend_from_slice(&r[HEAD_LEN_AT..]);
    ring.seal(
        &associated::<UNBOUND_AAD>(key, &r[STORED_AT..HEAD_LEN_AT]),
        &plaintext,
        &mut record,
    );
    StoredResponse::checked(record).unwrap()
}

/// `clear_records: accept` (the default) reads records in clear and those sealed by earlier
/// builds; `refuse` reads neither, and still opens what is sealed now.
#[test]
fn a_ring_that_refuses_clear_records_opens_only_bound_seals() {
    let plain = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), b"{\"id\":1}")
        .with_fingerprint(Digest([5; 32]));
    let key = Digest([1; 32]);
    let accepting = KeyRing::new(vec![[9; 32]]).unwrap();
    assert_eq!(accepting.clear_records(), ClearRecords::Accept);
    let refusing = KeyRing::new(vec![[9; 32]])
        .unwrap()
        .with_clear_records(ClearRecords::Refuse);
    let older = sealed_unbound(&plain, &accepting, key);
    assert!(older.is_sealed());
    let sealed = plain.seal(&accepting, key);

    assert_eq!(plain.clone().open(Some(&accepting), key).unwrap(), plain);
    assert_eq!(older.clone().open(Some(&accepting), key).unwrap(), plain);
    assert_eq!(sealed.clone().open(Some(&accepting), key).unwrap(), plain);

    assert_eq!(
        plain.clone().open(Some(&refusing), key),
        Err(SealError::InClear)
    );
    assert_eq!(
        older.clone().open(Some(&refusing), key),
        Err(SealError::FingerprintUnbound)
    );
    assert_eq!(sealed.open(Some(&refusing), key).unwrap(), plain);
    // Without store.encrypt, nothing is refused for being in clear.
    assert_eq!(plain.clone().open(None, key).unwrap(), plain);
}

#[test]
fn the_stored_body_does_not_share_the_source_buffer() {
    let socket_buffer = Bytes::from(vec![7u8; 64 * 1024]);
    let r = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), &socket_buffer[..10]);
    assert_eq!(r.cost(), 10 + ENTRY_OVERHEAD);
    drop(socket_buffer);
    assert_eq!(&r.body()[..], &[7u8; 10]);
}

/// Opening a sealed record copies no more than its size, which a replay is charged
/// before it opens it.
#[test]
fn an_opened_record_is_no_larger_than_the_sealed_one() {
    let r = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), &[7; 100]);
    let ring = KeyRing::new(vec![[1; 32]]).unwrap();
    let sealed = r.seal(&ring, Digest([1; 32]));
    let kept = sealed.clone();
    let opened = sealed.open(Some(&ring), Digest([1; 32])).unwrap();
    assert!(
        opened.size() < kept.size(),
        "opening copies at most the sealed size"
    );
}
