//! Extraction of fields by JSON pointer.

use super::*;

fn extract_one(body: &str, pointer: &str) -> Option<String> {
    let found = extract_fields(body.as_bytes(), &[ptr(pointer)]).unwrap();
    found
        .into_iter()
        .next()
        .unwrap()
        .map(|v| String::from_utf8(v).unwrap())
}

#[test]
fn extracts_nested_object_values_in_canonical_form() {
    let body = r#"{"order": {"customer": {"name": "Ann", "id": 10.0}, "total": 1.50}}"#;
    assert_eq!(
        extract_one(body, "/order/customer").as_deref(),
        Some(r#"{"id":1e1,"name":"Ann"}"#)
    );
    assert_eq!(extract_one(body, "/order/total").as_deref(), Some("15e-1"));
    assert_eq!(
        extract_one(body, "/order/customer/name").as_deref(),
        Some(r#""Ann""#)
    );
}

#[test]
fn extracts_array_elements_by_index() {
    let body = r#"{"items": [{"sku": "a"}, {"sku": "b", "qty": 2}], "tags": ["x", ["y"]]}"#;
    assert_eq!(extract_one(body, "/items/1/sku").as_deref(), Some(r#""b""#));
    assert_eq!(
        extract_one(body, "/items/1").as_deref(),
        Some(r#"{"qty":2e0,"sku":"b"}"#)
    );
    assert_eq!(extract_one(body, "/tags/1/0").as_deref(), Some(r#""y""#));
    assert_eq!(extract_one(body, "/items/2"), None);
    // Leading zeros and "-" never name an existing element.
    assert_eq!(extract_one(body, "/items/01"), None);
    assert_eq!(extract_one(body, "/items/-"), None);
    assert_eq!(extract_one(r#"{"0": 1}"#, "/0").as_deref(), Some("1e0"));
}

#[test]
fn missing_paths_yield_none() {
    let body = r#"{"a": {"b": [1, 2]}, "c": "str"}"#;
    assert_eq!(extract_one(body, "/x"), None);
    assert_eq!(extract_one(body, "/a/x"), None);
    assert_eq!(extract_one(body, "/a/b/5"), None);
    assert_eq!(extract_one(body, "/c/0"), None);
    assert_eq!(extract_one(body, "/a/b/0/x"), None);
}

#[test]
fn escaped_tokens_match_keys_containing_slash_and_tilde() {
    let body = r#"{"a/b": 1, "c~d": {"e": 2}, "a": {"b": 3}}"#;
    assert_eq!(extract_one(body, "/a~1b").as_deref(), Some("1e0"));
    assert_eq!(extract_one(body, "/c~0d/e").as_deref(), Some("2e0"));
    assert_eq!(extract_one(body, "/a/b").as_deref(), Some("3e0"));
}

#[test]
fn pointer_tokens_match_keys_after_json_unescaping() {
    let body = r#"{"k\u00e9y": {"\"q\"": true}}"#;
    assert_eq!(extract_one(body, "/kéy/\"q\"").as_deref(), Some("true"));
}

#[test]
fn root_pointer_extracts_the_canonical_document() {
    assert_eq!(
        extract_one(r#" {"b": [1.0], "a": null} "#, "").as_deref(),
        Some(r#"{"a":null,"b":[1e0]}"#)
    );
}

#[test]
fn several_pointers_are_answered_in_order() {
    let body = r#"{"x": 1, "y": {"z": [true, false]}}"#;
    let found = extract_fields(
        body.as_bytes(),
        &[ptr("/y/z/1"), ptr("/nope"), ptr("/x"), ptr("/x")],
    )
    .unwrap();
    assert_eq!(
        found,
        vec![
            Some(b"false".to_vec()),
            None,
            Some(b"1e0".to_vec()),
            Some(b"1e0".to_vec())
        ]
    );
}

#[test]
fn duplicate_keys_keep_every_occurrence_in_input_order() {
    assert_eq!(
        extract_one(r#"{"a": 1, "a": 2}"#, "/a").as_deref(),
        Some("1e0,2e0")
    );
    assert_eq!(
        extract_one(r#"{"a": {"b": [1, ","]}, "a": {"b": "x"}}"#, "/a/b").as_deref(),
        Some(r#"[1e0,","],"x""#)
    );
    assert_ne!(
        extract_one(r#"{"a": 1, "a": 2}"#, "/a"),
        extract_one(r#"{"a": 2, "a": 1}"#, "/a")
    );
}

#[test]
fn invalid_json_after_the_match_is_still_an_error() {
    let err = extract_fields(br#"{"a": 1, "b": tru}"#, &[ptr("/a")]).unwrap_err();
    assert!(matches!(err, JsonError::Invalid(_)));
    assert_eq!(
        extract_fields(br#"{"a": 1} x"#, &[ptr("/a")]),
        Err(JsonError::Invalid(9))
    );
}

#[test]
fn extraction_enforces_the_depth_limit() {
    let deep = "[".repeat(10_000);
    assert_eq!(
        extract_fields(deep.as_bytes(), &[ptr("/0")]),
        Err(JsonError::TooDeep)
    );
}

#[test]
fn no_pointers_still_validates() {
    assert_eq!(extract_fields(b"[1, 2]", &[]), Ok(vec![]));
    assert!(extract_fields(b"[1, 2,]", &[]).is_err());
}

/// A last-wins parser reads `{"order":{"id":1},"order":{}}` as an order without an id: a
/// repeated parent yields every occurrence's result, a missing one as an empty entry.
#[test]
fn a_repeated_parent_keeps_every_occurrence_missing_ones_included() {
    let id = |body: &str| extract_one(body, "/order/id");
    let single = id(r#"{"order":{"id":1}}"#);
    assert_eq!(single.as_deref(), Some("1e0"));
    for repeated in [
        r#"{"order":{"id":1},"order":{}}"#,
        r#"{"order":{"id":1},"order":null}"#,
        r#"{"order":{},"order":{"id":1}}"#,
        r#"{"order":{"id":1},"order":{"id":1}}"#,
    ] {
        assert_ne!(id(repeated), single, "{repeated}");
    }
    assert_eq!(
        id(r#"{"order":{"id":1},"order":{}}"#).as_deref(),
        Some("1e0,")
    );
    assert_eq!(
        id(r#"{"order":[],"order":{"id":1}}"#).as_deref(),
        Some(",1e0")
    );
    assert_ne!(
        id(r#"{"order":{"id":1},"order":{}}"#),
        id(r#"{"order":{},"order":{"id":1}}"#)
    );
    // No occurrence has it: absent, as with one parent.
    assert_eq!(id(r#"{"order":{},"order":{"x":1}}"#), None);
    // Deeper and through arrays alike.
    assert_ne!(
        extract_one(r#"{"a":{"b":[{"c":1}],"b":[]}}"#, "/a/b/0/c"),
        extract_one(r#"{"a":{"b":[{"c":1}]}}"#, "/a/b/0/c")
    );
}

/// Go, Json.NET and case-insensitive Jackson match `PaymentOrderNo` to the field
/// `paymentOrderNo`, the last one winning: beside an exact match it is another occurrence,
/// marked `~`, in input order.
#[test]
fn a_name_equal_but_for_case_is_another_occurrence() {
    let po = |body: &str| extract_one(body, "/paymentOrderNo");
    let single = po(r#"{"paymentOrderNo":"PO-1"}"#);
    let both = po(r#"{"paymentOrderNo":"PO-1","PaymentOrderNo":"PO-2"}"#);
    assert_ne!(both, single);
    assert_eq!(both.as_deref(), Some(r#""PO-1",~"PO-2""#));
    assert_ne!(
        both,
        po(r#"{"PaymentOrderNo":"PO-2","paymentOrderNo":"PO-1"}"#)
    );
    // Only a case-insensitive app reads it: alone it is absent, as ever.
    assert_eq!(po(r#"{"PaymentOrderNo":"PO-2"}"#), None);
    // A parent equal but for case, and the Kelvin sign.
    assert_ne!(
        extract_one(r#"{"Order":{"id":2},"order":{"id":1}}"#, "/order/id"),
        extract_one(r#"{"order":{"id":1}}"#, "/order/id")
    );
    assert_ne!(
        extract_one(r#"{"key":1,"\u212Aey":2}"#, "/key"),
        extract_one(r#"{"key":1}"#, "/key")
    );
    // A parent equal but for case that holds no such field is an occurrence too, and not
    // the same as an exact parent without it.
    let id = |body: &str| extract_one(body, "/order/id");
    assert_ne!(
        id(r#"{"order":{"id":1},"Order":{}}"#),
        id(r#"{"order":{"id":1},"order":{}}"#)
    );
    assert_ne!(
        id(r#"{"order":{"id":1},"Order":{}}"#),
        id(r#"{"order":{"id":1}}"#)
    );
}
