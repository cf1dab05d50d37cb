//! What is refused, and the limits: invalid documents, nesting depth, array indexes.

use super::*;

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
