//! Path normalisation, pinned: what is decoded, merged, removed, kept as sent and refused.

use super::*;

fn norm(path: &str) -> String {
    normalize_path(path).unwrap().into_owned()
}

#[test]
fn normal_paths_are_borrowed() {
    for path in [
        "/",
        "/api/orders",
        "/api/orders/",
        "/.well-known/x",
        "/a/..b/c.",
        "/a-b_c~d",
        "*",
        "",
    ] {
        assert!(
            matches!(normalize_path(path), Ok(Cow::Borrowed(p)) if p == path),
            "{path}"
        );
    }
    // Escapes already in normal form come back borrowed too.
    assert!(matches!(normalize_path("/caf%C3%A9"), Ok(Cow::Borrowed(_))));
}

#[test]
fn dot_segments_follow_rfc_3986() {
    // RFC 3986 §5.2.4 and §5.4 examples, as absolute paths.
    assert_eq!(norm("/a/b/c/./../../g"), "/a/g");
    assert_eq!(norm("/mid/content=5/../6"), "/mid/6");
    assert_eq!(norm("/a/b/.."), "/a/");
    assert_eq!(norm("/a/b/."), "/a/b/");
    assert_eq!(norm("/.."), "/");
    assert_eq!(norm("/../../g"), "/g");
    assert_eq!(norm("/a/./b/../../c/"), "/c/");
    assert_eq!(norm("/./"), "/");
}

#[test]
fn repeated_slashes_merge() {
    assert_eq!(norm("//api//orders"), "/api/orders");
    assert_eq!(norm("/api/orders//"), "/api/orders/");
    assert_eq!(norm("///"), "/");
}

#[test]
fn unreserved_escapes_decode_and_others_are_upper_cased() {
    assert_eq!(norm("/api/%6Frders"), "/api/orders");
    assert_eq!(norm("/api/%6frders"), "/api/orders");
    assert_eq!(norm("/%7Euser/%2e%2E/x"), "/x");
    assert_eq!(norm("/caf%c3%a9"), "/caf%C3%A9");
    assert_eq!(norm("/a%20b%3Fc%25"), "/a%20b%3Fc%25");
    // `%25` stays an escape: no double decoding.
    assert_eq!(norm("/%256F"), "/%256F");
}

/// What a path carries only escaped, but hyper takes raw, is its escape: one path to
/// routes however the client spelled it.
#[test]
fn raw_characters_a_path_carries_escaped_are_escaped() {
    assert_eq!(norm("/caf\u{e9}"), "/caf%C3%A9");
    assert_eq!(norm("/a|b/[c]^\"{d}\""), "/a%7Cb/%5Bc%5D%5E%22%7Bd%7D%22");
    assert_eq!(norm("/x/../caf\u{e9}%C3%A9"), "/caf%C3%A9%C3%A9");
    assert_eq!(norm("/caf\u{e9}"), norm("/caf%c3%a9"));
}

#[test]
fn unsafe_forms_are_refused() {
    assert_eq!(normalize_path("/a%2Fb"), Err(PathError::EncodedSlash));
    assert_eq!(normalize_path("/a%2fb"), Err(PathError::EncodedSlash));
    assert_eq!(normalize_path("/a%5cb"), Err(PathError::EncodedBackslash));
    assert_eq!(normalize_path("/a%00"), Err(PathError::EncodedNul));
    assert_eq!(normalize_path("/a%zz"), Err(PathError::BadEscape));
    assert_eq!(normalize_path("/a%4"), Err(PathError::BadEscape));
    assert_eq!(normalize_path("/a%"), Err(PathError::BadEscape));
    assert_eq!(normalize_path("/a\\b"), Err(PathError::Backslash));
    assert_eq!(normalize_path("/a/..\\b"), Err(PathError::Backslash));
}

/// An overlong `/`, `\` or NUL, or a slash escaped twice, in a name: a character of a
/// legacy encoding there (EUC-KR `유`), left as sent.
#[test]
fn overlong_slashes_and_nul_in_a_name_pass() {
    for path in [
        "/a%C0%AFb",
        "/a%c1%9cb",
        "/%C0%80",
        "/%C0%AF%C0%AF",
        "/a%E0%80%AFb",
        "/a%E0%81%9Cb",
        "/a%F0%80%80%AFb",
        "/a%C0%AF.b",
        "/a%252F...%252Fb",
    ] {
        assert!(normalize_path(path).is_ok(), "{path}");
    }
}

/// A `.` or `..` that a lenient decoder or a second decode cuts out of a name with a
/// slash or backslash only it sees (`/api/x%C0%AF..%C0%AForders` is `/api/orders` to it).
#[test]
fn dot_segments_between_slashes_only_some_decoders_read_are_refused() {
    for path in [
        "/a/..%C0%AFb",
        "/a/x%C0%AF..",
        "/a/x%C0%AF..%C0%AFb",
        "/a/x%C1%9C.%C1%9Cb",
        "/a/x%E0%80%AF..;y",
        "/a/x%C0%AF..;y%C0%AFb",
    ] {
        assert_eq!(normalize_path(path), Err(PathError::OverlongUtf8), "{path}");
    }
    for path in ["/a/..%252Fb", "/a/x%255C..%255Cb", "/a/x%252f.."] {
        assert_eq!(normalize_path(path), Err(PathError::DoubleEscape), "{path}");
    }
}

/// A segment that a lenient UTF-8 decoder (`%C0%AE`) or a second decode (`%252E`)
/// reads as `.` or `..`, with or without parameters.
#[test]
fn dot_segments_only_a_lenient_or_second_decode_reads_are_refused() {
    for path in [
        "/%C0%AE",
        "/a/%C0%AE%C0%AE/b",
        "/a/%c0%ae./b",
        "/%E0%80%AE",
        "/%F0%80%80%AE",
        "/a/%C0%AE%252E/b",
        "/a/%C0%A52E/b",
        "/a/%C0%AE;x/b",
    ] {
        assert_eq!(normalize_path(path), Err(PathError::OverlongUtf8), "{path}");
    }
    for path in [
        "/%252E%252E/a",
        "/x/%252e",
        "/a/.%252E/b",
        "/a/%252E./b",
        "/a/%2E%252E/b",
        "/a/%252E%252E;x/b",
        "/a/%252E%252E%253Bx/b",
        "/a/%252E%3B/b",
    ] {
        assert_eq!(normalize_path(path), Err(PathError::DoubleEscape), "{path}");
    }
}

/// Legacy multibyte encodings whose bytes look like an overlong UTF-8 lead: EUC-KR
/// `은` `을`, GBK `联` `连`, Shift_JIS half-width katakana and `E0` row kanji, and the
/// EUC-KR and GBK characters an overlong `.` or `%` spells, inside a name.
#[test]
fn legacy_multibyte_characters_pass() {
    for path in [
        "/board/%C0%BA",
        "/board/%c0%bb",
        "/%C1%AA%C1%AC",
        "/%C0%B2%C0%B3",
        "/%E0%40%E0%9F",
        "/%F0%80",
        "/%C0%AE%B0%A1",
        "/%B0%A1%C0%AE",
        "/%C0%A5%B0%B3%B9%DF",
        "/%C0%A5",
        "/a/%C0%AE%C0%AE%C0%AE/b",
    ] {
        assert!(normalize_path(path).is_ok(), "{path}");
    }
}

/// A slash or backslash escaped twice carries one inside a segment (Jenkins), and a dot
/// escaped twice in a name is no dot segment however often it is decoded.
#[test]
fn twice_escaped_slashes_and_dots_in_a_name_pass_as_sent() {
    for path in [
        "/job/x/job/feature%252Fbar/build",
        "/job/x/job/feature%252fbar/build",
        "/a%255Cb",
        "/files/v1%252E2",
        "/a/%252E%252E%252E/b",
        "/a/%252Ex/b",
        "/a/x%252E/b",
    ] {
        assert!(
            matches!(normalize_path(path), Ok(Cow::Borrowed(p)) if p == path),
            "{path}"
        );
    }
}

/// One character however decoded: a Latin-1 or UTF-8 letter, a literal `%`.
#[test]
fn escapes_of_one_character_however_decoded_pass() {
    for path in [
        "/%C0",
        "/%C0x",
        "/caf%E9",
        "/%C3%A9",
        "/%E0%A4%85",
        "/100%25",
        "/%2541",
    ] {
        assert!(normalize_path(path).is_ok(), "{path}");
    }
}

#[test]
fn dot_segments_with_params_are_refused() {
    for path in [
        "/api/x/..;/orders",
        "/api/x/..;jsessionid=1/orders",
        "/api/orders/.;/",
        "/api/orders/.;x",
        "/..;",
        "/api/x/%2E%2E;/orders",
        "/api/x/.%2e;/orders",
        "/api/x/..%3B/orders",
        "/api/x/%2e%2e%3b/orders",
        "/api/x/%2E%3Bx",
        // Even where a later `..` would remove it.
        "/api/..;/x/../orders",
        "/api/x/..;/../orders",
    ] {
        assert_eq!(
            normalize_path(path),
            Err(PathError::DotSegmentWithParams),
            "{path}"
        );
    }
}

#[test]
fn other_params_are_kept_as_sent() {
    for path in [
        "/api/orders;jsessionid=ABC",
        "/api/orders;a=1;b=2/items",
        "/;jsessionid=ABC",
        "/api/...;x",
        "/api/x;../orders",
        "/api/;..",
    ] {
        assert!(
            matches!(normalize_path(path), Ok(Cow::Borrowed(p)) if p == path),
            "{path}"
        );
    }
    assert_eq!(norm("/api//orders;x=%6F"), "/api/orders;x=o");
    assert_eq!(norm("/api/x/../orders;x"), "/api/orders;x");
    // An encoded `;` is not a delimiter: it stays the escape it is.
    assert_eq!(norm("/api/orders%3bx"), "/api/orders%3Bx");
    assert_eq!(norm("/api/x%3B/../orders"), "/api/orders");
}

#[test]
fn normalising_twice_changes_nothing() {
    for path in [
        "/a//b/./c/../%64",
        "/x/%2e%2e/%2e/y/",
        "/caf%c3%a9//",
        "/../a/..",
    ] {
        let once = norm(path);
        assert!(
            matches!(normalize_path(&once), Ok(Cow::Borrowed(_))),
            "{path} -> {once}"
        );
    }
}

/// A `;` only a lenient decoder (`%C0%BB`) or a second decode (`%253B`) reads, after plain
/// dots: `..;x` to such a reader, and `..` to a Java server that then drops the parameter.
#[test]
fn dot_segments_with_params_only_a_lenient_or_second_decode_reads_are_refused() {
    for path in [
        "/a/..%C0%BBx/b",
        "/a/.%c0%bb/b",
        "/a/..%E0%80%BB",
        "/a/x%C0%AF..%C0%BBx/b",
    ] {
        assert_eq!(normalize_path(path), Err(PathError::OverlongUtf8), "{path}");
    }
    for path in ["/a/..%253Bx/b", "/a/.%253b/b", "/a/..%253B"] {
        assert_eq!(normalize_path(path), Err(PathError::DoubleEscape), "{path}");
    }
    // A name, however it is read.
    for path in ["/a/x..%253Bx/b", "/a/...%C0%BBx/b", "/a/%C0%BB../b"] {
        assert!(normalize_path(path).is_ok(), "{path}");
    }
}

/// An overlong form escaped twice (`%25C0%25AE`), or half of it (`%C0%25AE`): a dot or
/// slash to an upstream that decodes twice with a lenient UTF-8 decoder.
#[test]
fn overlong_forms_escaped_twice_that_make_a_dot_segment_are_refused() {
    for path in [
        "/a/%25C0%25AE%25C0%25AE/b",
        "/a/%25c0%25ae./b",
        "/a/%C0%25AE%25C0%AE/b",
        "/a/x%25C0%25AF..%25C0%25AFb",
        "/a/..%25C0%25BB/b",
    ] {
        assert_eq!(normalize_path(path), Err(PathError::OverlongUtf8), "{path}");
    }
    // In a name they pass, as sent.
    for path in [
        "/a/%25C0%25AEx/b",
        "/a/x%25C0%25AFb",
        "/a/%25C0%25AE%25C0%25AE%25C0%25AE",
    ] {
        assert!(
            matches!(normalize_path(path), Ok(Cow::Borrowed(p)) if p == path),
            "{path}"
        );
    }
}

fn lenient(path: &str) -> Option<String> {
    normal_forms(path).unwrap().lenient
}

/// Where a decoder that decodes twice or reads overlong forms sees a slash the routes do
/// not, the path as it reads it is normalised too, for the routes to be matched on both.
#[test]
fn a_slash_only_some_decoders_read_gives_the_lenient_reading() {
    for path in [
        "/api%252Forders",
        "/api%252forders",
        "/api%C0%AForders",
        "/api%c0%afOrders",
        "/api%E0%80%AForders",
        "/api%F0%80%80%AForders",
        "/api%C1%9Corders",
        "/api%255Corders",
        "/api%C0%A52Forders",
        "/api%25C0%25AForders",
        "/api%252F%252Forders",
        "/x/../api%252Forders",
        "/ap%2569%252Forders",
        "/ap%C1%A9%C0%AForders",
    ] {
        assert_eq!(
            lenient(path).map(|p| p.to_ascii_lowercase()),
            Some("/api/orders".into()),
            "{path}"
        );
    }
    // The strict reading is the normal form as ever.
    let forms = normal_forms("/job/x/job/feature%252Fbar/build").unwrap();
    assert!(matches!(
        forms.strict,
        Cow::Borrowed("/job/x/job/feature%252Fbar/build")
    ));
    assert_eq!(
        forms.lenient.as_deref(),
        Some("/job/x/job/feature/bar/build")
    );
    // `%C0%BA` is `:` to that reader, raw as routes write it.
    assert_eq!(lenient("/board/%C0%AF%C0%BA").as_deref(), Some("/board/:"));
    assert_eq!(
        lenient("/api%252Forders%252F").as_deref(),
        Some("/api/orders/")
    );
    assert_eq!(
        lenient("/a%252Fcaf%C3%A9%253B").as_deref(),
        Some("/a/caf%C3%A9;")
    );
    assert_eq!(lenient("/a%252F%25C3%25A9").as_deref(), Some("/a/%C3%A9"));
}

/// Without a character only some decoders read there is no other reading to route:
/// nothing more is allocated.
#[test]
fn without_a_character_only_some_decoders_read_there_is_no_lenient_reading() {
    for path in [
        "/api/orders",
        "/api//orders",
        "/caf%C3%A9",
        "/100%25",
        "/100%25x",
        "*",
    ] {
        assert_eq!(lenient(path), None, "{path}");
    }
}

/// A letter or dot only a second decode or a lenient decoder reads is routed as read too:
/// `/api/%256Frders` is `/api/orders` to an upstream that decodes twice. A legacy
/// character (EUC-KR `은`, `%C0%BA`) gets a reading too, which routes where it does (a `:`,
/// raw as routes write it).
#[test]
fn a_letter_only_some_decoders_read_gives_the_lenient_reading() {
    for (path, read) in [
        ("/api/%256Frders", "/api/orders"),
        ("/api/%C1%AFrders", "/api/orders"),
        ("/a%2541", "/aA"),
        ("/a/%252E%252E%252E/b", "/a/.../b"),
        ("/board/%C0%BA", "/board/:"),
        ("/a%C0%AE%B0%A1", "/a.%B0%A1"),
        // A `;` raw, where that reader splits parameters off.
        ("/api/orders%253Bx", "/api/orders;x"),
        ("/api/orders%C0%BBx", "/api/orders;x"),
    ] {
        assert_eq!(lenient(path).as_deref(), Some(read), "{path}");
    }
}

fn decoded(path: &str) -> Option<String> {
    normal_forms(path).unwrap().decoded
}

/// An escaped sub-delimiter, `:` or `@` is the character to the upstreams that decode
/// before they route: the decoded reading has it raw, while the strict form, forwarded,
/// keeps the escape (upper-cased).
#[test]
fn escaped_sub_delimiters_colon_and_at_give_the_decoded_reading() {
    for (path, read) in [
        ("/v1/orders%3Acancel", "/v1/orders:cancel"),
        ("/v1/orders%3acancel", "/v1/orders:cancel"),
        ("/users/a%40b.com/orders", "/users/a@b.com/orders"),
        ("/x/%21%24%26%27%28%29%2A%2B%2C%3D%3A%40", "/x/!$&'()*+,=:@"),
        ("/v1//x/../orders%3A%63ancel", "/v1/orders:cancel"),
        ("/a;x%3Dy/b", "/a;x=y/b"),
        ("/caf%C3%A9%3Ax", "/caf%C3%A9:x"),
        ("/a%3Bb%3A", "/a%3Bb:"),
    ] {
        assert_eq!(decoded(path).as_deref(), Some(read), "{path}");
    }
    assert_eq!(norm("/v1/orders%3acancel"), "/v1/orders%3Acancel");
    assert!(matches!(
        normalize_path("/v1/orders%3Acancel"),
        Ok(Cow::Borrowed(_))
    ));
}

/// Without such an escape there is no decoded reading: `%3B` stays an escape (it is no
/// parameter delimiter), and so do `%25`, other reserved characters and UTF-8; `%2F`,
/// `%5C` and `%00` are still refused.
#[test]
fn other_escapes_give_no_decoded_reading() {
    for path in [
        "/v1/orders",
        "/v1/orders:cancel",
        "/a%3Bb",
        "/a%25",
        "/a%253A",
        "/caf%C3%A9",
        "/a%20b",
        "/a%3F%23",
        "/x%3A/..",
        "/%6Frders",
    ] {
        assert_eq!(decoded(path), None, "{path}");
    }
    for (path, error) in [
        ("/a%3A%2Fb", PathError::EncodedSlash),
        ("/a%40%5Cb", PathError::EncodedBackslash),
        ("/a%3A%00", PathError::EncodedNul),
    ] {
        assert_eq!(normal_forms(path).unwrap_err(), error, "{path}");
    }
}

/// A path with both kinds has both readings: the lenient one reads escaped sub-delimiters
/// decoded too, as an upstream that decodes twice does (`%253A` is `:` to it).
#[test]
fn the_lenient_reading_decodes_sub_delimiters_too() {
    let forms = normal_forms("/v1%252Forders%3Acancel").unwrap();
    assert_eq!(forms.strict, "/v1%252Forders%3Acancel");
    assert_eq!(forms.decoded.as_deref(), Some("/v1%252Forders:cancel"));
    assert_eq!(forms.lenient.as_deref(), Some("/v1/orders:cancel"));
    assert_eq!(
        lenient("/v1/orders%253Acancel").as_deref(),
        Some("/v1/orders:cancel")
    );
    assert_eq!(decoded("/v1/orders%253Acancel"), None);
}
