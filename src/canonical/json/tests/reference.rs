//! serde_json as an independent reference, and random spellings of one document.

use super::*;

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
    r#"{"k": "\n", "L": "\t", "kk": "\u2028\u2029"}"#,
    r#"{"b": {"Id": 1, "id": 2}, "a": [{"k": 0, "K": 1, "\u212a": 2}]}"#,
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
/// Nor does it keep the order of names equal but for case, which is data to us.
fn serde_respells(doc: &str) -> bool {
    doc.contains("9007199254740993") || canon(doc).contains("{ ")
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
        if serde_respells(doc) {
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
        if serde_respells(doc) {
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
