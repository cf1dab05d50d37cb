//! Canonical spelling: key order, whitespace, numbers, strings, duplicate keys and
//! ignored fields.

use super::*;

#[test]
fn key_order_does_not_change_canonical_form() {
    let a = canon(r#"{"b":1,"a":{"y":true,"x":null},"c":[3,2]}"#);
    let b = canon(r#"{"c":[3,2],"a":{"x":null,"y":true},"b":1}"#);
    assert_eq!(a, b);
    assert_eq!(a, r#"{"a":{"x":null,"y":true},"b":1e0,"c":[3e0,2e0]}"#);
}

#[test]
fn whitespace_does_not_change_canonical_form() {
    let pretty = "\r\n{\n\t\"a\" :  [ 1 , {\"b\"\t:\"x y\" } ] ,\"c\":{ } , \"d\" : [ ]\n}\n ";
    assert_eq!(canon(pretty), r#"{"a":[1e0,{"b":"x y"}],"c":{},"d":[]}"#);
    assert_eq!(
        canon(pretty),
        canon(r#"{"a":[1,{"b":"x y"}],"c":{},"d":[]}"#)
    );
}

#[test]
fn array_order_is_significant() {
    assert_ne!(canon("[1,2]"), canon("[2,1]"));
}

#[test]
fn number_spellings_of_one_value_are_equal() {
    for spelling in [
        "1", "1.0", "10e-1", "1E0", "1e+0", "1e-0", "0.1e1", "100e-2", "1.000",
    ] {
        assert_eq!(canon(spelling), "1e0", "{spelling}");
    }
}

#[test]
fn numbers_normalize_to_significant_digits_and_exponent() {
    let cases = [
        ("1.50", "15e-1"),
        ("100", "1e2"),
        ("1e0", "1e0"),
        ("10E-1", "1e0"),
        ("-2.5e+3", "-25e2"),
        ("0.001", "1e-3"),
        ("0.0010", "1e-3"),
        ("120.0300", "12003e-2"),
        ("-7", "-7e0"),
        ("1e007", "1e7"),
        (
            "123456789012345678901234567890",
            "12345678901234567890123456789e1",
        ),
        ("0.000000000000000000000000000001", "1e-30"),
        ("2.5e-400", "25e-401"),
        ("1e999999999999999", "1e999999999999999"),
        ("1.5e-999999999999999", "15e-1000000000000000"),
    ];
    for (input, expected) in cases {
        assert_eq!(canon(input), expected, "{input}");
    }
}

#[test]
fn every_zero_is_plain_zero() {
    for spelling in ["0", "-0", "0.0", "-0.000", "0e5", "0E-7", "-0.0e+3"] {
        assert_eq!(canon(spelling), "0", "{spelling}");
    }
}

#[test]
fn distinct_numbers_stay_distinct() {
    let distinct = ["1", "-1", "1.1", "10", "0.1", "11", "1e1000", "1e-1000"];
    for (i, a) in distinct.iter().enumerate() {
        for b in &distinct[i + 1..] {
            assert_ne!(canon(a), canon(b), "{a} vs {b}");
        }
    }
}

#[test]
fn absurd_exponents_are_rejected_rather_than_saturated() {
    assert_eq!(err(b"1e1000000000000000"), JsonError::Invalid(17));
    assert!(matches!(
        err(b"[1e-99999999999999999999]"),
        JsonError::Invalid(_)
    ));
}

#[test]
fn number_grammar_is_strict() {
    for bad in [
        "01",
        "-01",
        "00",
        ".5",
        "+1",
        "1.",
        "-",
        "-a",
        "1e",
        "1e+",
        "1E-",
        "NaN",
        "Infinity",
        "-Infinity",
        "0x10",
        "1.5.2",
        "--1",
        "1.e5",
        "[1,-]",
        "[.1]",
    ] {
        assert!(
            matches!(err(bad.as_bytes()), JsonError::Invalid(_)),
            "{bad} should be invalid"
        );
    }
}

#[test]
fn unicode_escapes_equal_their_characters() {
    assert_eq!(canon(r#""\u0041""#), canon(r#""A""#));
    assert_eq!(canon(r#""\u00e9\u00E9""#), "\"éé\"");
    assert_eq!(canon(r#""\ud83d\ude00""#), "\"😀\"");
    assert_eq!(canon(r#""\uD83D\uDE00""#), canon("\"😀\""));
    assert_eq!(canon(r#""a\/b""#), "\"a/b\"");
    assert_eq!(canon(r#""\u20ac""#), "\"€\"");
}

#[test]
fn strings_are_re_escaped_minimally() {
    assert_eq!(canon(r#""\u000a\u000D\u0009""#), r#""\n\r\t""#);
    assert_eq!(canon(r#""\u0008\u000c""#), r#""\b\f""#);
    assert_eq!(canon(r#""\u0001\u001F""#), r#""\u0001\u001f""#);
    assert_eq!(canon(r#""\u0022\u005C""#), r#""\"\\""#);
    assert_eq!(canon(r#""\"\\""#), r#""\"\\""#);
    assert_eq!(canon(r#""\u007f""#), "\"\u{7f}\"");
    assert_eq!(canon(r#""x\ty""#), r#""x\ty""#);
}

#[test]
fn strings_without_escapes_are_copied_verbatim() {
    let s = "\"plain ASCII, ünïcødé, 😀 and DEL \u{7f} — long enough to cross several words\"";
    assert_eq!(canon(s), s);
}

/// Long strings take the memchr path: a raw control character, a non-ASCII character,
/// bad UTF-8, an escape or a missing quote must be found at every position there as in
/// the 8-byte loop.
#[test]
fn long_strings_are_checked_at_every_position() {
    let ok = |doc: &[u8]| canonical_json(doc, &IgnoreSet::default(), &mut Vec::new(), None).is_ok();
    for len in [9, 15, 16, 17, 31, 32, 33, 100] {
        for at in 0..len {
            let plain = "a".repeat(len);
            let quoted = format!("\"{plain}\"");
            assert_eq!(canon(&quoted), quoted);
            assert!(!ok(&quoted.as_bytes()[..len + 1]), "unterminated, {len}");

            for control in [0x00, 0x09, 0x0a, 0x1f] {
                let mut doc = quoted.clone().into_bytes();
                doc[1 + at] = control;
                assert!(!ok(&doc), "raw {control:#x} at {at} of {len}");
            }

            let accented = format!("\"{}é{}\"", &plain[..at], &plain[at + 1..]);
            assert_eq!(canon(&accented), accented);
            let mut broken = accented.clone().into_bytes();
            broken[2 + at] = b'a'; // the lead byte 0xC3 followed by ASCII
            assert!(!ok(&broken), "bad UTF-8 at {at} of {len}");

            let escaped = format!("\"{}\\u0041{}\"", &plain[..at], &plain[at..]);
            let expected = format!("\"{}A{}\"", &plain[..at], &plain[at..]);
            assert_eq!(canon(&escaped), expected);
        }
    }
}

#[test]
fn keys_are_unescaped_before_comparison_and_sorting() {
    assert_eq!(canon(r#"{"\u0062":1,"a":2}"#), r#"{"a":2e0,"b":1e0}"#);
    // Unescaped '"' (0x22) sorts before '#' (0x23) even though its escape '\' (0x5C) would not.
    assert_eq!(canon(r#"{"a#":1,"a\"":2}"#), r#"{"a\"":2e0,"a#":1e0}"#);
    assert_eq!(
        canon(r#"{"\u00e9":1,"z":2,"\n":3}"#),
        r#"{"\n":3e0,"z":2e0,"é":1e0}"#
    );
}

#[test]
fn keys_sort_by_bytes_not_by_length_or_case() {
    assert_eq!(
        canon(r#"{"b":0,"C":0,"aa":0,"a":0,"":0}"#),
        r#"{"":0,"C":0,"a":0,"aa":0,"b":0}"#
    );
}

#[test]
fn duplicate_keys_are_kept_in_input_order() {
    assert_eq!(
        canon(r#"{"a":2,"b":0,"a":1}"#),
        r#"{"a":2e0,"a":1e0,"b":0}"#
    );
    assert_ne!(canon(r#"{"a":1,"a":2}"#), canon(r#"{"a":2,"a":1}"#));
}

#[test]
fn large_duplicate_runs_keep_their_order() {
    let mut input = String::from("{");
    for i in 0..2000 {
        if i > 0 {
            input.push(',');
        }
        input.push_str(&format!(r#""k":{i},"j":{i}"#));
    }
    input.push('}');
    let mut expected = String::from("{");
    for key in ["j", "k"] {
        for i in 0..2000 {
            if expected.len() > 1 {
                expected.push(',');
            }
            let n = canon(&i.to_string());
            expected.push_str(&format!(r#""{key}":{n}"#));
        }
    }
    expected.push('}');
    assert_eq!(canon(&input), expected);
}

#[test]
fn nested_objects_are_sorted_independently() {
    assert_eq!(
        canon(r#"{"z":{"d":1,"c":{"f":1,"e":2}},"y":[{"b":1,"a":2},{"d":1,"c":2}]}"#),
        r#"{"y":[{"a":2e0,"b":1e0},{"c":2e0,"d":1e0}],"z":{"c":{"e":2e0,"f":1e0},"d":1e0}}"#
    );
}

#[test]
fn literals_and_top_level_scalars_are_kept() {
    assert_eq!(canon("true"), "true");
    assert_eq!(canon(" false "), "false");
    assert_eq!(canon("null"), "null");
    assert_eq!(canon(r#""s""#), r#""s""#);
    assert_eq!(canon("[true,false,null]"), "[true,false,null]");
}

#[test]
fn leading_byte_order_mark_is_skipped() {
    assert_eq!(
        canon_with(b"\xEF\xBB\xBF{\"a\":1}", &IgnoreSet::empty()).unwrap(),
        r#"{"a":1e0}"#
    );
}

#[test]
fn ignored_names_are_skipped_at_any_depth_and_case_insensitively() {
    let input =
        r#"{"a":{"b":[{"TimeStamp":1,"x":2}]},"ts":3,"LATITUDE":{"lat":1},"keep":{"LNG":1}}"#;
    assert_eq!(
        canon_with(input.as_bytes(), &IgnoreSet::defaults()).unwrap(),
        r#"{"a":{"b":[{"x":2e0}]},"keep":{}}"#
    );
}

#[test]
fn ignored_names_match_escaped_keys_after_unescaping() {
    assert_eq!(
        canon_with(br#"{"t\u0073":1,"a":2}"#, &IgnoreSet::defaults()).unwrap(),
        r#"{"a":2e0}"#
    );
}

#[test]
fn ignoring_a_field_makes_requests_that_differ_only_there_equal() {
    let ignore = IgnoreSet::defaults();
    let a = canon_with(br#"{"sku":"x","timestamp":"2024-01-01"}"#, &ignore).unwrap();
    let b = canon_with(br#"{"timestamp":"2025-12-31","sku":"x"}"#, &ignore).unwrap();
    assert_eq!(a, b);
}

#[test]
fn ignored_values_are_still_validated() {
    let ignore = IgnoreSet::defaults();
    assert!(canon_with(br#"{"ts":[1,],"a":1}"#, &ignore).is_err());
    assert!(canon_with(br#"{"ts":"\ud800","a":1}"#, &ignore).is_err());
    let deep = format!(r#"{{"ts":{}}}"#, "[".repeat(10_000));
    assert_eq!(
        canon_with(deep.as_bytes(), &ignore),
        Err(JsonError::TooDeep)
    );
}

#[test]
fn ignore_by_pointer_applies_only_at_that_path() {
    let ignore = IgnoreSet::new(Vec::<String>::new(), vec![ptr("/a/id")]);
    assert_eq!(
        canon_with(
            br#"{"a":{"id":1,"b":{"id":2}},"id":3,"c":{"a":{"id":4}}}"#,
            &ignore
        )
        .unwrap(),
        r#"{"a":{"b":{"id":2e0}},"c":{"a":{"id":4e0}},"id":3e0}"#
    );
}

#[test]
fn ignore_by_pointer_matches_escaped_tokens_and_array_elements() {
    let ignore = IgnoreSet::new(
        Vec::<String>::new(),
        vec![ptr("/a~1b"), ptr("/items/1"), ptr("/items/2/x")],
    );
    assert_eq!(
        canon_with(
            br#"{"a/b":1,"a":{"b":2},"items":[{"x":0},{"x":1},{"x":2,"y":2}]}"#,
            &ignore
        )
        .unwrap(),
        r#"{"a":{"b":2e0},"items":[{"x":0},{"y":2e0}]}"#
    );
}

#[test]
fn root_pointer_never_skips_the_document() {
    let ignore = IgnoreSet::new(Vec::<String>::new(), vec![ptr("")]);
    assert_eq!(canon_with(b"[1]", &ignore).unwrap(), "[1e0]");
}

#[test]
fn ignored_list_names_each_skipped_path_in_input_order() {
    let ignore = IgnoreSet::new(
        DEFAULT_NAMES_FOR_TESTS.iter().copied(),
        vec![ptr("/meta/request~1id"), ptr("/items/1")],
    );
    let input = r#"{
        "items": [{"sku": "a", "ts": 1}, {"sku": "b"}, {"sku": "c", "Lat": 2}],
        "meta": {"request/id": "r1", "client_time": {"lat": 1, "lng": 2}},
        "a~b": {"sent_at": 5},
        "TIMESTAMP": 0
    }"#;
    let (out, ignored) = explain(input, &ignore);
    assert_eq!(
        out,
        r#"{"a~b":{},"items":[{"sku":"a"},{"sku":"c"}],"meta":{}}"#
    );
    assert_eq!(
        ignored,
        [
            "/items/0/ts",
            "/items/1",
            "/items/2/Lat",
            "/meta/request~1id",
            "/meta/client_time",
            "/a~0b/sent_at",
            "/TIMESTAMP"
        ]
    );
}

const DEFAULT_NAMES_FOR_TESTS: &[&str] = crate::canonical::DEFAULT_IGNORED_FIELDS;

#[test]
fn reporting_ignored_fields_does_not_change_the_output() {
    let ignore = IgnoreSet::new(["ts"], vec![ptr("/a/0")]);
    let input = r#"{"a":[{"ts":1},2],"b":{"ts":{"x":1}},"c":"\u0041"}"#;
    let (explained, _) = explain(input, &ignore);
    assert_eq!(canon_with(input.as_bytes(), &ignore).unwrap(), explained);
}
