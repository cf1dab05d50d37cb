//! The body's media type: one byte string sent as JSON and as something else is two
//! requests to an app that parses only JSON-typed bodies (Express's `express.json()`
//! leaves a `text/plain` body unread and answers 400 where it needs it).
use super::*;

fn fields_rule() -> KeyRule {
    KeyRule {
        source: KeySource::Fields(vec!["/amount".parse().unwrap()]),
        required: true,
        scope: default_scope(),
        payload: Box::new(FingerprintRule::standard()),
    }
}

/// Both keys and the payload fingerprint of a `header:` key for `body` sent with `pairs`.
fn keys(pairs: &[(&'static str, &'static str)], body: &[u8]) -> [Digest; 3] {
    let mut h = with(pairs);
    h.insert("idempotency-key", HeaderValue::from_static("k1"));
    let v = view(&h, body);
    let key = |rule: &KeyRule| derive_key(rule, &v, None).unwrap().key().unwrap();
    [
        key(&fingerprint_rule()).key,
        key(&fields_rule()).key,
        key(&header_rule(true)).fingerprint,
    ]
}

const JSON: &[(&str, &str)] = &[("content-type", "application/json")];

#[test]
fn a_json_body_not_typed_as_json_is_another_request() {
    let body = br#"{"amount":5}"#;
    let json = keys(JSON, body);
    for other in [
        &[("content-type", "text/plain")][..],
        &[("content-type", "text/plain; charset=utf-8")],
        &[("content-type", "application/x-www-form-urlencoded")],
        &[("content-type", "application/octet-stream")],
        &[("content-type", "")],
        &[],
    ] {
        let keys = keys(other, body);
        for i in 0..3 {
            assert_ne!(keys[i], json[i], "{other:?}, key {i}");
        }
    }
    assert_ne!(
        keys(&[("content-type", "text/plain")], body),
        keys(&[], body)
    );
}

#[test]
fn every_json_media_type_keys_alike() {
    let body = br#"{"amount":5}"#;
    let json = keys(JSON, body);
    for same in [
        "application/json; charset=utf-8",
        "Application/JSON",
        " application/json ;charset=UTF-8",
        "application/problem+json",
        "application/vnd.api+json",
    ] {
        let pairs = [("content-type", same)];
        assert_eq!(keys(&pairs, body), json, "{same}");
    }
}

/// Keys stored before the media type counted must still be found: JSON- and form-typed
/// bodies, and bodiless requests whatever they say, keep the digests they always had.
#[test]
fn json_and_form_typed_and_empty_bodies_keep_their_digests() {
    let prefix = |d: Digest| d.to_hex()[..16].to_owned();
    assert_eq!(
        keys(JSON, br#"{"amount":5}"#).map(prefix),
        ["35970ab8b0e77bca", "e6d8d471bce8b37d", "ab30d91d6d9eeec9"]
    );
    let form = with(&[("content-type", "application/x-www-form-urlencoded")]);
    assert_eq!(
        prefix(fingerprint_key(&view(&form, b"amount=5"))),
        "0916dadf51db5da7"
    );
    for bodiless in [HeaderMap::new(), with(&[("content-type", "text/plain")])] {
        assert_eq!(
            prefix(fingerprint_key(&view(&bodiless, b""))),
            "a725a121b475d439"
        );
    }
}
