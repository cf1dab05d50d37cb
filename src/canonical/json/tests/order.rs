//! Member order against a reference stable sort, and the remembered-order shortcut.

use super::*;

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

/// Go's `encoding/json`, Json.NET and case-insensitive Jackson match member names ignoring
/// case and keep the last: members whose names fold alike keep their input order, and so
/// does the rest of their object, marked by a space after `{` that no sorted object has.
#[test]
fn names_equal_but_for_case_keep_their_order() {
    assert_ne!(
        canon(r#"{"Amount":1,"amount":2}"#),
        canon(r#"{"amount":2,"Amount":1}"#)
    );
    assert_eq!(
        canon(r#"{"b":0,"amount":2,"Amount":1}"#),
        r#"{ "b":0,"amount":2e0,"Amount":1e0}"#
    );
    // The Kelvin sign folds to `k`, `ſ` to `s`, escaped or not.
    assert_ne!(
        canon(r#"{"\u212Aey":1,"key":2}"#),
        canon(r#"{"key":2,"\u212Aey":1}"#)
    );
    assert_ne!(
        canon("{\"\u{17F}ku\":1,\"SKU\":2}"),
        canon("{\"SKU\":2,\"\u{17F}ku\":1}")
    );
    // Nested objects, and inside arrays, each by its own names.
    assert_eq!(
        canon(r#"[{"o":{"ID":1,"id":2},"b":1,"a":0}]"#),
        r#"[{"a":0,"b":1e0,"o":{ "ID":1e0,"id":2e0}}]"#
    );
    // Repeated identical names, and names differing otherwise, are sorted as ever.
    assert_eq!(
        canon(r#"{"b":1,"a":1,"a":2}"#),
        r#"{"a":1e0,"a":2e0,"b":1e0}"#
    );
    assert_eq!(
        canon(r#"{"idX":1,"Id":2,"ids":3}"#),
        r#"{"Id":2e0,"idX":1e0,"ids":3e0}"#
    );
}

/// An object whose names fold alike is not a sorted object, even to the remembered orders:
/// a like object after it is sorted as ever, and it is not taken for one before it.
#[test]
fn case_variants_do_not_disturb_remembered_orders() {
    assert_eq!(
        canon(r#"[{"b":1,"a":2},{"b":1,"B":2},{"b":1,"a":2}]"#),
        r#"[{"a":2e0,"b":1e0},{ "b":1e0,"B":2e0},{"a":2e0,"b":1e0}]"#
    );
}

/// Every body without such names keeps exactly the form (and so the digest) it had.
#[test]
fn bodies_without_case_variants_keep_their_form() {
    assert_eq!(
        canon(r#"{"Zeta":1,"alpha":{"B":[true],"a":null},"Alpha2":"x"}"#),
        r#"{"Alpha2":"x","Zeta":1e0,"alpha":{"B":[true],"a":null}}"#
    );
}
