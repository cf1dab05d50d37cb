//! Canonical JSON: spelling, numbers, strings, ignored fields, limits, and extraction of
//! fields by pointer.

use super::*;

fn canon_with(input: &[u8], ignore: &IgnoreSet) -> Result<String, JsonError> {
    let mut out = Vec::new();
    canonical_json(input, ignore, &mut out, None)?;
    Ok(String::from_utf8(out).expect("canonical output is UTF-8"))
}

fn canon(input: &str) -> String {
    canon_with(input.as_bytes(), &IgnoreSet::empty()).unwrap_or_else(|e| panic!("{e} in {input:?}"))
}

fn err(input: &[u8]) -> JsonError {
    canon_with(input, &IgnoreSet::empty()).unwrap_err()
}

fn ptr(s: &str) -> JsonPointer {
    JsonPointer::parse(s).unwrap()
}

fn explain(input: &str, ignore: &IgnoreSet) -> (String, Vec<String>) {
    let mut out = Vec::new();
    let mut ignored = Vec::new();
    canonical_json(input.as_bytes(), ignore, &mut out, Some(&mut ignored)).unwrap();
    (String::from_utf8(out).unwrap(), ignored)
}

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
        canon(r#"{"b":0,"B":0,"aa":0,"a":0,"":0}"#),
        r#"{"":0,"B":0,"a":0,"aa":0,"b":0}"#
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

#[test]
fn invalid_json_is_rejected() {
    let cases: &[&[u8]] = &[
        b"",
        b"   ",
        b"{\"a\":1,}",
        b"[1,2,]",
        b"[,1]",
        b"{'a':1}",
        b"['a']",
        b"01",
        b"\"unterminated",
        b"{\"a\":\"unterminated}",
        b"\"\\ud800\"",
        b"\"\\udc00\"",
        b"\"\\ud800\\u0041\"",
        b"\"\\ud800x\"",
        b"\"tab\there\"",
        b"\"nl\nhere\"",
        b"{\"a\":1} x",
        b"{\"a\":1}}",
        b"[1]]",
        b"1 2",
        b"{\"a\" 1}",
        b"{\"a\":1 \"b\":2}",
        b"{a:1}",
        b"{\"a\"}",
        b"{\"a\":}",
        b"\"\\x\"",
        b"\"\\u12\"",
        b"\"\\u12g4\"",
        b"\"\\",
        b"tru",
        b"nul",
        b"True",
        b"[",
        b"{",
        b"\"\xff\"",
        b"\"\xc0\x80\"",
        b"\"\xed\xa0\x80\"",
        b"\"\xe2\x82\"",
        b"\"\xf4\x90\x80\x80\"",
        b"\"\x80\"",
        b"[1]\x00",
    ];
    for &input in cases {
        assert!(
            matches!(err(input), JsonError::Invalid(_)),
            "{:?} should be invalid",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn invalid_reports_the_offending_offset() {
    assert_eq!(err(b"[1,]"), JsonError::Invalid(3));
    assert_eq!(err(b"{\"a\":1} x"), JsonError::Invalid(8));
    assert_eq!(err(b"\"ab\x01\""), JsonError::Invalid(3));
    assert_eq!(err(b"\"abc"), JsonError::Invalid(4));
    assert_eq!(err(b""), JsonError::Invalid(0));
}

#[test]
fn output_is_appended_and_restored_on_error() {
    let mut out = b"prefix:".to_vec();
    canonical_json(b"[1]", &IgnoreSet::empty(), &mut out, None).unwrap();
    assert_eq!(out, b"prefix:[1e0]");
    let before = out.clone();
    assert!(canonical_json(b"{\"a\":[1,2", &IgnoreSet::empty(), &mut out, None).is_err());
    assert_eq!(out, before);
}

#[test]
fn nesting_up_to_max_depth_is_accepted() {
    let input = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert_eq!(canon(&input), input);
    let mut objects = String::new();
    for _ in 0..MAX_DEPTH {
        objects.push_str("{\"a\":");
    }
    objects.push('1');
    objects.push_str(&"}".repeat(MAX_DEPTH));
    assert!(canon_with(objects.as_bytes(), &IgnoreSet::empty()).is_ok());
}

#[test]
fn nesting_beyond_max_depth_is_too_deep() {
    let input = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert_eq!(err(input.as_bytes()), JsonError::TooDeep);
    let mut objects = String::new();
    for _ in 0..=MAX_DEPTH {
        objects.push_str("{\"a\":");
    }
    assert_eq!(err(objects.as_bytes()), JsonError::TooDeep);
}

#[test]
fn ten_thousand_deep_array_is_too_deep_without_crashing() {
    let input = "[".repeat(10_000);
    assert_eq!(err(input.as_bytes()), JsonError::TooDeep);
    let closed = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert_eq!(err(closed.as_bytes()), JsonError::TooDeep);
}

#[test]
fn max_depth_nesting_fits_in_a_small_thread_stack() {
    // Recursion is bounded by MAX_DEPTH; this pins down that its frames stay small enough
    // for worker threads (tokio's default stack is 2 MiB). Unoptimized, as tests run, the
    // full depth needs about 400 KiB; optimized, under 48 KiB.
    let mut input = String::new();
    for i in 0..MAX_DEPTH {
        input.push_str(if i % 2 == 0 { "{\"k\":" } else { "[" });
    }
    input.push('1');
    for i in (0..MAX_DEPTH).rev() {
        input.push(if i % 2 == 0 { '}' } else { ']' });
    }
    let worker = std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(move || {
            let deeper = format!("[{input}]");
            (canon(&input), err(deeper.as_bytes()))
        })
        .unwrap();
    let (ok, too_deep) = worker.join().unwrap();
    assert!(ok.starts_with(r#"{"k":[{"k":"#) && ok.contains("[1e0]"));
    assert_eq!(too_deep, JsonError::TooDeep);
}

#[test]
fn token_index_requires_plain_decimal() {
    assert!(token_is_index(b"0", 0));
    assert!(token_is_index(b"12", 12));
    assert!(!token_is_index(b"012", 12));
    assert!(!token_is_index(b"", 0));
    assert!(!token_is_index(b"-", 0));
    assert!(!token_is_index(b"1a", 1));
    assert!(!token_is_index(b"99999999999999999999999", 0));
}

/// Renders `members` the way the canonical form must: stably sorted by key bytes.
fn reference_object(members: &[(String, u32)]) -> String {
    let mut sorted: Vec<&(String, u32)> = members.iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let body: Vec<String> = sorted
        .iter()
        .map(|(k, v)| format!("\"{k}\":{}", canon(&v.to_string())))
        .collect();
    format!("{{{}}}", body.join(","))
}

fn render_object(members: &[(String, u32)]) -> String {
    let body: Vec<String> = members
        .iter()
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    format!("{{{}}}", body.join(","))
}

#[test]
fn member_order_matches_a_reference_stable_sort() {
    // Keys from a tiny alphabet share long prefixes, collide, repeat and run past 8 bytes,
    // which exercises the prefix sort, its refinement and the remembered shapes.
    let mut rng = Rng(7);
    for round in 0..300 {
        let size = match round % 4 {
            0 => rng.below(4) as usize,
            1 => rng.below(20) as usize,
            2 => rng.below(70) as usize,
            _ => 250 + rng.below(60) as usize,
        };
        let members: Vec<(String, u32)> = (0..size)
            .map(|i| {
                let len = rng.below(12) as usize;
                let key: String = (0..len)
                    .map(|_| ['a', 'b', '0'][rng.below(3) as usize])
                    .collect();
                (key, i as u32)
            })
            .collect();
        let expected = reference_object(&members);
        let input = render_object(&members);
        assert_eq!(canon(&input), expected, "{input}");
        // Again, and as several like objects in an array: the remembered order must hold.
        assert_eq!(canon(&input), expected, "{input}");
        let array = format!("[{input},{input},{input}]");
        assert_eq!(canon(&array), format!("[{expected},{expected},{expected}]"));
    }
}

#[test]
fn remembered_order_is_not_reused_for_keys_differing_past_eight_bytes() {
    let first = canon(r#"[{"zzzzzzzzB":1,"zzzzzzzzA":2},{"zzzzzzzzA":3,"zzzzzzzzB":4}]"#);
    assert_eq!(
        first,
        r#"[{"zzzzzzzzA":2e0,"zzzzzzzzB":1e0},{"zzzzzzzzA":3e0,"zzzzzzzzB":4e0}]"#
    );
    // Same 8-byte prefixes in the same positions as a remembered shape, other tails.
    assert_eq!(canon(r#"{"b":1,"a":2}"#), r#"{"a":2e0,"b":1e0}"#);
    assert_eq!(canon(r#"{"b1":1,"a":2}"#), r#"{"a":2e0,"b1":1e0}"#);
    assert_eq!(canon(r#"{"b":1,"a1":2}"#), r#"{"a1":2e0,"b":1e0}"#);
}

#[test]
fn remembered_order_needs_every_prefix_byte_and_member_count_to_match() {
    // Keys differing in one late byte: the first object's order is remembered, and the
    // second, out of order differently, must not borrow it.
    for (a, b, c) in [
        ("xxxxxxa", "xxxxxxb", "xxxxxxc"),
        ("xxxxxxxa", "xxxxxxxb", "xxxxxxxc"),
        ("a", "b", "c"),
    ] {
        let input = format!(r#"[{{"{c}":1,"{a}":2,"{b}":3}},{{"{b}":4,"{c}":5,"{a}":6}}]"#);
        let expected =
            format!(r#"[{{"{a}":2e0,"{b}":3e0,"{c}":1e0}},{{"{a}":6e0,"{b}":4e0,"{c}":5e0}}]"#);
        assert_eq!(canon(&input), expected);
    }
    assert_eq!(
        canon(r#"[{"ab":1,"aa":2},{"aa":3,"ab":4}]"#),
        r#"[{"aa":2e0,"ab":1e0},{"aa":3e0,"ab":4e0}]"#
    );
    assert_eq!(
        canon(r#"[{"b":1,"a":2,"c":3},{"b":1,"a":2},{"b":1,"a":2,"c":3,"d":4}]"#),
        r#"[{"a":2e0,"b":1e0,"c":3e0},{"a":2e0,"b":1e0},{"a":2e0,"b":1e0,"c":3e0,"d":4e0}]"#
    );
}

#[test]
fn keys_with_nul_bytes_sort_after_their_prefixes() {
    assert_eq!(
        canon(r#"{"a\u0000":1,"a":2,"a\u0000\u0000":3}"#),
        r#"{"a":2e0,"a\u0000":1e0,"a\u0000\u0000":3e0}"#
    );
}

#[test]
fn fresh_output_buffer_gets_the_same_bytes() {
    let input = r#"{"b":[1,2,{"d":"x","c":null}],"a":"y"}"#;
    let mut reused = Vec::with_capacity(4);
    canonical_json(input.as_bytes(), &IgnoreSet::empty(), &mut reused, None).unwrap();
    assert_eq!(reused, canon(input).as_bytes());
}

/// Hand-written documents covering the grammar; none has duplicate keys or numbers beyond f64
/// precision, so serde_json can serve as an independent reference.
const DOCS: &[&str] = &[
    "null",
    "true",
    "0",
    "-0.0",
    "3.14159",
    "1e300",
    "-2.5E-7",
    "123456789",
    r#""""#,
    r#""plain""#,
    r#""esc \" \\ \/ \b \f \n \r \t""#,
    r#""\u0000\u001f\u007f\u0080\uffff""#,
    r#""\ud834\udd1e and 𝄞""#,
    "\"ünïcødé ✓ 中文\"",
    "[]",
    "{}",
    "[[], {}, [[]], {\"\": {}}]",
    r#"{"b": 1, "a": 2, "c": 3}"#,
    r#"{"nested": {"z": [1, 2, {"y": null, "x": false}], "a": "s"}}"#,
    r#"[1, 1.0, 10e-1, 0.1e1, 100, 1e2, 0.001, -0]"#,
    r#"{"\u00e9": 1, "e": 2, "\u0065\u0301": 3}"#,
    r#"{"a\"b": 1, "a#b": 2, "a!b": 3, "a\\b": 4}"#,
    r#"{"order": {"id": "o-1", "items": [{"sku": "A", "qty": 2, "price": 9.99}], "total": 19.98}}"#,
    r#"{"k": "\n", "K": "\t", "kk": "\u2028\u2029"}"#,
    "  {  \"spaced\"  :  [  1  ,  2  ]  }  ",
    r#"[{"a": [{"b": [{"c": [{"d": []}]}]}]}]"#,
    r#"{"num": 6.02214076e23, "small": 1.25e-10, "neg": -273.15}"#,
    r#"{"": "", " ": " ", "  ": "  "}"#,
    r#"["\/", "/", "\u002f"]"#,
    r#"{"emoji": "😀", "escaped": "\ud83d\ude00"}"#,
    r#"{"z": 0, "y": 0.0, "x": -0, "w": 0e10}"#,
    r#"[true, false, null, "true", "null"]"#,
    "{\"big\": [1e-300, 9007199254740993, 18446744073709551615]}",
];

/// serde_json (without `arbitrary_precision`) rounds such numbers through `f64`; we don't.
fn beyond_f64(doc: &str) -> bool {
    doc.contains("9007199254740993")
}

#[test]
fn canonical_form_is_idempotent() {
    for doc in DOCS {
        let once = canon(doc);
        assert_eq!(canon(&once), once, "{doc}");
    }
}

#[test]
fn canonical_output_is_valid_json_for_serde() {
    for doc in DOCS {
        let once = canon(doc);
        let value: serde_json::Value = serde_json::from_str(&once)
            .unwrap_or_else(|e| panic!("{once} rejected by serde_json: {e}"));
        if beyond_f64(doc) {
            continue;
        }
        // Re-canonicalizing serde_json's own spelling of our output lands on our output again.
        assert_eq!(canon(&value.to_string()), once, "{doc}");
    }
}

#[test]
fn serde_json_spelling_of_the_input_has_the_same_canonical_form() {
    for doc in DOCS {
        let value: serde_json::Value = serde_json::from_str(doc).unwrap();
        if beyond_f64(doc) {
            continue;
        }
        assert_eq!(canon(&value.to_string()), canon(doc), "{doc}");
    }
}

#[test]
fn serde_json_agrees_on_what_is_valid() {
    let mut inputs: Vec<Vec<u8>> = DOCS.iter().map(|d| d.as_bytes().to_vec()).collect();
    for bad in [
        "[1,]",
        "{\"a\" 1}",
        "01",
        "\"\\ud800\"",
        "[1] 2",
        "{\"a\":1,}",
        "\"\t\"",
    ] {
        inputs.push(bad.as_bytes().to_vec());
    }
    for input in inputs {
        let ours = canon_with(&input, &IgnoreSet::empty()).is_ok();
        let theirs = serde_json::from_slice::<serde_json::Value>(&input).is_ok();
        assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(&input));
    }
}

/// Deterministic generator of documents and of different spellings of the same document.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }

    fn chance(&mut self, in_n: u64) -> bool {
        self.below(in_n) == 0
    }
}

enum Node {
    Null,
    Bool(bool),
    Num {
        negative: bool,
        digits: u64,
        exponent: i64,
    },
    Str(String),
    Arr(Vec<Node>),
    Obj(Vec<(String, Node)>),
}

const CHARS: &[char] = &[
    'a', 'b', 'Z', '0', ' ', '"', '\\', '/', '\n', '\t', '\u{1}', '\u{1f}', '\u{7f}', 'é', '€',
    '😀', '\u{2028}',
];

fn gen_string(rng: &mut Rng) -> String {
    (0..rng.below(6))
        .map(|_| CHARS[rng.below(CHARS.len() as u64) as usize])
        .collect()
}

fn gen_node(rng: &mut Rng, depth: u32) -> Node {
    let kinds = if depth >= 4 { 4 } else { 6 };
    match rng.below(kinds) {
        0 => Node::Null,
        1 => Node::Bool(rng.chance(2)),
        2 => {
            let digits = match rng.below(3) {
                0 => 0,
                1 => rng.below(1000),
                _ => rng.below(u64::MAX >> 12),
            };
            // Trailing zeros belong to the exponent, so each value has one representation.
            let digits = if digits % 10 == 0 && digits != 0 {
                digits + 1
            } else {
                digits
            };
            Node::Num {
                negative: rng.chance(2),
                digits,
                exponent: rng.below(41) as i64 - 20,
            }
        }
        3 => Node::Str(gen_string(rng)),
        4 => Node::Arr(
            (0..rng.below(5))
                .map(|_| gen_node(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut members: Vec<(String, Node)> = Vec::new();
            for _ in 0..rng.below(6) {
                let key = gen_string(rng);
                if members.iter().all(|(k, _)| *k != key) {
                    members.push((key, gen_node(rng, depth + 1)));
                }
            }
            Node::Obj(members)
        }
    }
}

fn ws(rng: &mut Rng, out: &mut String) {
    for _ in 0..rng.below(3) {
        out.push([' ', '\n', '\t', '\r'][rng.below(4) as usize]);
    }
}

fn spell_string(rng: &mut Rng, s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let must_escape = c == '"' || c == '\\' || (c as u32) < 0x20;
        if !must_escape && rng.chance(2) {
            out.push(c);
            continue;
        }
        match c {
            '"' if rng.chance(2) => out.push_str("\\\""),
            '\\' if rng.chance(2) => out.push_str("\\\\"),
            '/' if rng.chance(2) => out.push_str("\\/"),
            '\n' if rng.chance(2) => out.push_str("\\n"),
            '\t' if rng.chance(2) => out.push_str("\\t"),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if rng.chance(2) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            }
        }
    }
    out.push('"');
}

fn spell_number(rng: &mut Rng, negative: bool, digits: u64, exponent: i64, out: &mut String) {
    if negative && (digits != 0 || rng.chance(2)) {
        out.push('-');
    }
    if digits == 0 {
        out.push('0');
        if rng.chance(2) {
            out.push_str(&".000"[..2 + rng.below(3) as usize]);
        }
        if rng.chance(2) {
            out.push_str(&format!("e{}", rng.below(20)));
        }
        return;
    }
    let zeros = rng.below(3) as usize;
    let mut all = digits.to_string();
    all.push_str(&"0".repeat(zeros));
    let mut exponent = exponent - zeros as i64;
    if rng.chance(3) {
        // 0.000ddd form.
        let lead = rng.below(3) as usize;
        out.push_str("0.");
        out.push_str(&"0".repeat(lead));
        out.push_str(&all);
        exponent += (lead + all.len()) as i64;
    } else {
        let point = 1 + rng.below(all.len() as u64) as usize;
        out.push_str(&all[..point]);
        if point < all.len() {
            out.push('.');
            out.push_str(&all[point..]);
        }
        exponent += (all.len() - point) as i64;
    }
    if exponent != 0 || rng.chance(2) {
        out.push(if rng.chance(2) { 'e' } else { 'E' });
        if exponent >= 0 && rng.chance(2) {
            out.push('+');
        }
        out.push_str(&exponent.to_string());
    }
}

fn spell(rng: &mut Rng, node: &Node, out: &mut String) {
    ws(rng, out);
    match node {
        Node::Null => out.push_str("null"),
        Node::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Node::Num {
            negative,
            digits,
            exponent,
        } => spell_number(rng, *negative, *digits, *exponent, out),
        Node::Str(s) => spell_string(rng, s, out),
        Node::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                spell(rng, item, out);
            }
            ws(rng, out);
            out.push(']');
        }
        Node::Obj(members) => {
            let mut order: Vec<usize> = (0..members.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            out.push('{');
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                ws(rng, out);
                spell_string(rng, &members[i].0, out);
                ws(rng, out);
                out.push(':');
                spell(rng, &members[i].1, out);
            }
            ws(rng, out);
            out.push('}');
        }
    }
    ws(rng, out);
}

#[test]
fn random_spellings_of_one_document_canonicalize_equal() {
    let mut rng = Rng(42);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..400 {
        let doc = gen_node(&mut rng, 0);
        let mut first = String::new();
        spell(&mut rng, &doc, &mut first);
        let canonical = canon(&first);
        for _ in 0..4 {
            let mut other = String::new();
            spell(&mut rng, &doc, &mut other);
            assert_eq!(canon(&other), canonical, "{first}\n{other}");
        }
        assert_eq!(canon(&canonical), canonical);
        assert!(serde_json::from_str::<serde_json::Value>(&canonical).is_ok());
        seen.insert(canonical);
    }
    // Different documents must not collapse together (the generator does repeat small ones).
    assert!(seen.len() > 200, "only {} distinct forms", seen.len());
}

fn extract_one(body: &str, pointer: &str) -> Option<String> {
    let found = extract_fields(body.as_bytes(), &[ptr(pointer)]).unwrap();
    found
        .into_iter()
        .next()
        .unwrap()
        .map(|v| String::from_utf8(v).unwrap())
}

// === Extraction of fields by pointer ===

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
fn duplicate_keys_resolve_to_the_last_occurrence() {
    assert_eq!(
        extract_one(r#"{"a": 1, "a": 2}"#, "/a").as_deref(),
        Some("2e0")
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
