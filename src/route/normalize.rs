//! One spelling of a path: what routes match and what is forwarded, so that `/api//orders`,
//! `/api/./orders`, `/api/%6Frders` and `/api/x/../orders` cannot step around a route
//! written for `/api/orders` while the upstream reads them as that very path.
//!
//! Percent-escapes of unreserved characters are decoded and the others' hex digits
//! upper-cased (RFC 3986 §6.2.2), the characters a path carries only escaped but hyper
//! takes raw (UTF-8, `|`, `[`, …) escaped, repeated slashes merged, then dot segments removed
//! (§5.2.4). Forms that cannot be normalised without guessing how the upstream reads them
//! are refused: an encoded `/` or `\`, an encoded NUL, a `%` that is not an escape, a
//! raw backslash (which some servers take for a slash), a dot segment only a lenient UTF-8
//! decoder or a second decode reads (`%C0%AE%C0%AE`, `%252E%252E`, `x%C0%AF..`; a name
//! such as `%C0%AF`, EUC-KR `유`, or `a%252Fb` passes, but is routed as such a reader
//! reads it too: [`normal_forms`]), and a dot segment with
//! parameters (`..;x`, `.;`, `%2E%2E%3B`): Java servers drop a segment's `;` parameters
//! before they remove dot segments, so `/api/x/..;/orders` is `/api/orders` to them and a
//! segment named `..;` to others.
//!
//! Other `;` parameters stay in the path: they are forwarded as sent (a `jsessionid` must
//! reach the upstream), and routes match the path without them
//! ([`PathPattern::matches`](crate::route::PathPattern::matches)). An encoded `;` (`%3B`)
//! is not a parameter delimiter: servers that read parameters split on a raw `;` before
//! they decode (Tomcat, Jetty, Spring), so `%3B` is left as the escape it is.
//!
//! An escaped sub-delimiter, `:` or `@` (`%3A`, `%40`, `%2B`, …, not `%3B`) stays escaped
//! in the normal form, which is forwarded, but routes match it decoded
//! ([`NormalForms::decoded`]): Go, Spring, ASP.NET, Django and nginx decode it before they
//! route, so `/v1/orders%3Acancel` is their `/v1/orders:cancel` handler; Express routes
//! the escape as sent, so that reading is checked too.
//!
//! Nearly every path is already normal; those are borrowed, never copied.
//!
//! ```
//! use std::borrow::Cow;
//! use idemgate::route::normalize::{normalize_path, PathError};
//! assert!(matches!(normalize_path("/api/orders"), Ok(Cow::Borrowed("/api/orders"))));
//! for spelling in ["/api//orders", "/api/./orders", "/api/%6Frders", "/api/x/../orders"] {
//!     assert_eq!(normalize_path(spelling).unwrap(), "/api/orders");
//! }
//! assert_eq!(normalize_path("/api%2Forders"), Err(PathError::EncodedSlash));
//! assert_eq!(normalize_path("/api/x/..;/orders"), Err(PathError::DotSegmentWithParams));
//! ```

use std::borrow::Cow;

/// Why a path cannot be normalised safely; each is a 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%2F`: a slash inside a segment, which upstreams read either way.
    #[error("the path has an encoded slash (%2F)")]
    EncodedSlash,
    /// `%5C`: a backslash, which some upstreams read as a slash.
    #[error("the path has an encoded backslash (%5C)")]
    EncodedBackslash,
    /// `%00`.
    #[error("the path has an encoded NUL (%00)")]
    EncodedNul,
    /// A `%` not followed by two hex digits.
    #[error("the path has a % that is not a percent-escape")]
    BadEscape,
    /// A raw `\`.
    #[error("the path has a backslash")]
    Backslash,
    /// A `.` or `..` segment with `;` parameters (`..;x`, `%2E%2E%3B`), which upstreams
    /// read either as a dot segment or as a name.
    #[error("the path has a dot segment with ;parameters")]
    DotSegmentWithParams,
    /// A dot segment that overlong UTF-8 forms make (`%C0%AE%C0%AE`, `x%C0%AF..`): no
    /// character to a strict decoder, `.` or `/` to the lenient ones old Java and IIS
    /// servers had.
    #[error("the path has a dot segment only a lenient UTF-8 decoder reads")]
    OverlongUtf8,
    /// A dot segment an upstream that decodes twice reads: dots escaped twice
    /// (`%252E%252E`), or cut out of a name by a slash escaped twice (`x%252F..`).
    #[error("the path has a dot segment only a second decode reads")]
    DoubleEscape,
    /// A character only an upstream that decodes twice or a lenient UTF-8 decoder reads (a
    /// slash `%252F` or `%C0%AF`, a letter `%256F` or `%C1%AF`) that, read so, puts the
    /// request on another route or under other protection ([`NormalForms::lenient`]; found
    /// where it is routed).
    #[error("the path has a character only some decoders read (%252F, %256F, %C0%AF), and read so it is another route's")]
    LenientReadingMovesRoute,
    /// An escaped sub-delimiter, `:` or `@` (`%3A`, `%40`, `%2B`, …) that puts the request
    /// on one route decoded, as most upstreams route it, and on another route or under
    /// other protection as sent, as Express routes it ([`NormalForms::decoded`]; found
    /// where it is routed).
    #[error("the path has an escaped sub-delimiter, ':' or '@' (%3A, %40, %2B, …), and it is one route's decoded (as most upstreams route it) but another route's as sent (as Express routes it)")]
    EscapedReadingMovesRoute,
}

/// The normal form of `path` (a request path without the query): borrowed when it is
/// already normal. A path that does not start with `/` (`*`, or none) is left alone.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    normal_forms(path).map(|forms| forms.strict)
}

/// A path's normal form, forwarded; where it has an escaped sub-delimiter, `:` or `@`, the
/// reading routes match; and where a lenient reader sees a character the routes do not,
/// the normal form of the path as that reader reads it.
#[derive(Debug)]
pub struct NormalForms<'a> {
    /// What is forwarded and keyed ([`normalize_path`]), and what routes match where there
    /// is no [`decoded`](Self::decoded) reading (where there is, it is checked as another
    /// reading: Express routes it).
    pub strict: Cow<'a, str>,
    /// `strict` as an upstream that decodes twice, or an old lenient UTF-8 decoder, reads
    /// it, normalised; only for a path with a character only such a reader sees (a slash
    /// `%252F` or `%C0%AF`, a letter `%256F`, a `;` `%253B`, …), which passes in a name (a
    /// Jenkins branch `feature%252Fbar`, EUC-KR `유`) but would make `/api%252Forders`
    /// step around a route for `/api/orders`: the request is routed by both readings, and
    /// refused where the lenient one is protected by another rule.
    pub lenient: Option<String>,
    /// `strict` with its escaped sub-delimiters, `:` and `@` decoded (`%3A` is `:`, `%40`
    /// `@`; not `%3B`, see the module docs), where it has any: what routes match, as Go,
    /// Spring, ASP.NET, Django and nginx decode them before they route, so that
    /// `/v1/orders%3Acancel` cannot step around a route written for `/v1/orders:cancel`.
    /// Express routes the path as sent, escapes and all, so `strict` is then routed too:
    /// refused where it is another route's, and run under the fallback where it is no
    /// route's and the decoded route enforces nothing. Keys keep `strict` (the payload
    /// fingerprint holds the path forwarded): `%3A` and `:` are two payloads, as two
    /// spellings an upstream may tell apart.
    pub decoded: Option<String>,
}

/// [`normalize_path`], the lenient reading of a path with a character only lenient
/// readers see ([`NormalForms::lenient`]), and the decoded reading of one with an escaped
/// sub-delimiter, `:` or `@` ([`NormalForms::decoded`]). A path without a `%` costs what
/// it did.
///
/// ```
/// use idemgate::route::normalize::normal_forms;
/// let forms = normal_forms("/api%252Forders").unwrap();
/// assert_eq!(forms.strict, "/api%252Forders");
/// assert_eq!(forms.lenient.as_deref(), Some("/api/orders"));
/// assert_eq!(normal_forms("/api/orders").unwrap().lenient, None);
/// let forms = normal_forms("/v1/orders%3acancel").unwrap();
/// assert_eq!(forms.strict, "/v1/orders%3Acancel");
/// assert_eq!(forms.decoded.as_deref(), Some("/v1/orders:cancel"));
/// ```
pub fn normal_forms(path: &str) -> Result<NormalForms<'_>, PathError> {
    if !path.starts_with('/') || is_normal(path.as_bytes())? {
        let strict = Cow::Borrowed(path);
        return Ok(NormalForms {
            strict,
            lenient: None,
            decoded: None,
        });
    }
    let (decoded, escapes) = decode(path.as_bytes())?;
    // Raw bytes are UTF-8 (a `str`), so only an escape can be overlong.
    let hidden = escapes.any && check_escapes(&decoded)?;
    let normal = remove_dot_segments(&decoded)?;
    let lenient = match hidden {
        // Decoded as routes read `:` (`%253A` is `:` to it); most such paths have none.
        true => {
            read_leniently_path(normal.as_bytes())?.map(|read| match decode_sub_delims(&read) {
                Cow::Borrowed(_) => read,
                Cow::Owned(decoded) => decoded,
            })
        }
        false => None,
    };
    // Looked for only where `decode` met one; a `..` may have removed it since.
    let decoded = match escapes.sub_delims {
        true => match decode_sub_delims(&normal) {
            Cow::Borrowed(_) => None,
            Cow::Owned(decoded) => Some(decoded),
        },
        false => None,
    };
    let strict = match normal == path {
        true => Cow::Borrowed(path),
        false => Cow::Owned(normal),
    };
    Ok(NormalForms {
        strict,
        lenient,
        decoded,
    })
}

/// One look at each byte: whether the path has nothing to decode, merge or remove.
fn is_normal(path: &[u8]) -> Result<bool, PathError> {
    let mut normal = true;
    for (i, &b) in path.iter().enumerate() {
        match b {
            b'\\' => return Err(PathError::Backslash),
            b'%' => normal = false,
            b if must_escape(b) => normal = false,
            b'/' => {
                // An empty segment, or one of one or two dots ending the path, a segment or
                // its name (`..;x`, refused on the slow path).
                let rest = &path[i + 1..];
                let dots = rest.iter().take(2).take_while(|&&b| b == b'.').count();
                if rest.first() == Some(&b'/')
                    || (dots > 0 && matches!(rest.get(dots), None | Some(b'/' | b';')))
                {
                    normal = false;
                }
            }
            _ => {}
        }
    }
    Ok(normal)
}

/// A byte a path may carry only percent-encoded (RFC 3986 §3.3) that hyper still takes raw
/// (the `http` crate accepts `"`, `{`, `}`, `[`, `]`, `^`, `|` and UTF-8 in a target, as
/// clients send them): servers decode the escape and the raw byte to the same path, so the
/// normal form escapes it, as routes write it.
fn must_escape(b: u8) -> bool {
    !b.is_ascii() || matches!(b, b'"' | b'{' | b'}' | b'[' | b']' | b'^' | b'|' | b'`')
}

/// Appends the escape of `b`, its hex upper case.
fn push_escape(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
}

/// Unreserved characters (RFC 3986 §2.3): the only ones whose escape means the same as the
/// character itself.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The characters besides unreserved ones a path segment may carry raw (RFC 3986 `pchar`:
/// sub-delimiters, `:`, `@`), but `;`: their escape means the character to most upstreams
/// but not to all (Express routes `%3A` as sent), so it is read both ways
/// ([`NormalForms::decoded`]). `;` is left out because servers that split parameters off
/// do so on the raw `;` before they decode (the module docs).
fn is_decoded_sub_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b'=' | b':' | b'@'
    )
}

/// `normal` (a normal path: ASCII, hex upper case but after a `%25`) with the escapes of
/// [`is_decoded_sub_delim`] characters decoded, borrowed where it has none. One pass,
/// escape by escape, so `%253A` stays as it is: a `%` then `3A`.
fn decode_sub_delims(normal: &str) -> Cow<'_, str> {
    let bytes = normal.as_bytes();
    // Allocated at the first escape decoded; `copied` is how much of `normal` it holds.
    let mut out: Option<String> = None;
    let (mut at, mut copied) = (0, 0);
    while at < bytes.len() {
        match escaped(bytes, at) {
            Some(b) if is_decoded_sub_delim(b) => {
                let out = out.get_or_insert_with(|| String::with_capacity(normal.len()));
                out.push_str(&normal[copied..at]);
                out.push(char::from(b));
                at += 3;
                copied = at;
            }
            Some(_) => at += 3,
            None => at += 1,
        }
    }
    match out {
        Some(mut out) => {
            out.push_str(&normal[copied..]);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(normal),
    }
}

/// What [`decode`] met: any escape, and any escape of an [`is_decoded_sub_delim`]
/// character.
#[derive(Default)]
struct Escapes {
    any: bool,
    sub_delims: bool,
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes escapes of unreserved characters, upper-cases the hex of the others, escapes
/// the bytes a path carries only escaped ([`must_escape`]), refuses the unsafe ones; and
/// what escapes `path` had.
fn decode(path: &[u8]) -> Result<(Vec<u8>, Escapes), PathError> {
    let mut out = Vec::with_capacity(path.len());
    let mut escapes = Escapes::default();
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    path.get(i + 1).copied().and_then(hex_value),
                    path.get(i + 2).copied().and_then(hex_value),
                ) else {
                    return Err(PathError::BadEscape);
                };
                escapes.any = true;
                let byte = hi << 4 | lo;
                match byte {
                    b'/' => return Err(PathError::EncodedSlash),
                    b'\\' => return Err(PathError::EncodedBackslash),
                    0 => return Err(PathError::EncodedNul),
                    b if is_unreserved(b) => out.push(b),
                    _ => {
                        escapes.sub_delims |= is_decoded_sub_delim(byte);
                        out.push(b'%');
                        out.push(path[i + 1].to_ascii_uppercase());
                        out.push(path[i + 2].to_ascii_uppercase());
                    }
                }
                i += 3;
            }
            b'\\' => return Err(PathError::Backslash),
            b if must_escape(b) => {
                push_escape(&mut out, b);
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok((out, escapes))
}

/// Refuses, in a [`decode`]d path (every byte past ASCII escaped, hex upper-cased but for
/// the two characters after a `%25`), a dot segment only some decoders see: a piece of a
/// segment that the lenient UTF-8 decoders of old Java and IIS servers, or an upstream that
/// decodes twice, read as `.` or `..` (then `;` parameters or not), because one of its
/// dots is an overlong `.` (`%C0%AE`, or escaped twice, `%25C0%25AE`), a `%252E` or an
/// overlong `%` before `2E` (`%C0%A52E`), its `;` is one only such a reader sees
/// (`..%253Bx`, `..%C0%BBx`), or because such a reader sees a `/` or `\` beside it that
/// the routes do not (`%C0%AF`, `%C1%9C`, `%252F`, `%255C`): `/api/x%C0%AF..%C0%AForders`
/// is `/api/orders` to it.
///
/// Everything else passes, since these bytes are also what legacy multibyte encodings
/// percent-encode, and a 400 would break the apps that read them so: `%C0%AF` is `유`
/// in EUC-KR (a Korean JSP app with `URIEncoding="EUC-KR"` reads it so), `政` in EUC-JP,
/// `蜡` in GBK; `%C0%BA` `은`, `%C1%AA` `联`, `%C0%AE` `윙`, `%C0%A5` `웹`. `%252F` and `%255C`
/// pass in a name too: they are how Jenkins and others keep a slash inside one segment
/// through proxies. Such a slash, or any character only such a reader sees (`%256Frders`,
/// `%C1%AFrders`: `orders` to it), must still not move a request off its route, so this
/// returns whether the path has one: the path is then routed as the lenient reader reads
/// it too ([`NormalForms::lenient`]).
fn check_escapes(path: &[u8]) -> Result<bool, PathError> {
    let mut hidden = false;
    for segment in path.split(|&b| b == b'/') {
        if segment.contains(&b'%') {
            hidden |= check_hidden_dot_segments(segment)?;
        }
    }
    Ok(hidden)
}

/// The byte an escape at `at` of `s` stands for.
fn escaped(s: &[u8], at: usize) -> Option<u8> {
    match s.get(at..at + 3)? {
        [b'%', hi, lo] => Some(hex_value(*hi)? << 4 | hex_value(*lo)?),
        _ => None,
    }
}

/// The byte escaped once (`%HH`) or twice (`%25HH`) at `at` of `s`, and the escape's
/// length: a byte of what an upstream that decodes twice reads.
fn escaped_once_or_twice(s: &[u8], at: usize) -> Option<(u8, usize)> {
    match escaped(s, at)? {
        0x25 => match s.get(at + 3..at + 5) {
            Some(&[hi, lo]) => Some((hex_value(hi)? << 4 | hex_value(lo)?, 5)),
            _ => None,
        },
        b => Some((b, 3)),
    }
}

/// The code point and length of an overlong UTF-8 form escaped at `at` of `s` (`C0`/`C1`
/// then a continuation, `E0` then `80`–`9F`, `F0` then `80`–`8F`, then continuations),
/// each byte escaped once or twice (`%25C0%25AE`): what a decoder that does not refuse
/// overlong forms reads there, after a second decode if it makes one.
fn overlong(s: &[u8], at: usize) -> Option<(u32, usize)> {
    let (lead, mut end) = escaped_once_or_twice(s, at)?;
    let (len, second) = match lead {
        0xC0 | 0xC1 => (2, 0xBF),
        0xE0 => (3, 0x9F),
        0xF0 => (4, 0x8F),
        _ => return None,
    };
    end += at;
    let mut code = u32::from(lead & (0x7F >> len));
    for n in 1..len {
        let last = if n == 1 { second } else { 0xBF };
        let (byte, step) =
            escaped_once_or_twice(s, end).filter(|(b, _)| (0x80..=last).contains(b))?;
        code = code << 6 | u32::from(byte & 0x3F);
        end += step;
    }
    Some((code, end - at))
}

/// Refuses a piece of `segment` that, read leniently or decoded twice, is `.` or `..`,
/// perhaps with `;` parameters, where that reading is not the strict one (see
/// [`check_escapes`]): a piece between two separators only the lenient reader sees, or
/// with a dot only it sees. A segment of plain dots is left to [`remove_dot_segments`].
/// Returns whether the segment has any character only that reader sees.
fn check_hidden_dot_segments(segment: &[u8]) -> Result<bool, PathError> {
    let mut piece = Piece::default();
    let mut hidden = false;
    let mut at = 0;
    while at < segment.len() {
        let (c, len, how) = read_leniently(segment, at);
        at += len;
        hidden |= how.is_some();
        match c {
            0x2F | 0x5C if how.is_some() => {
                piece.end(how)?;
                piece = Piece {
                    hidden: how,
                    ..Piece::default()
                };
            }
            _ if piece.params => {}
            0x2E => {
                piece.dots += 1;
                piece.hide(how);
            }
            // A `;` only a lenient reader sees after dots makes them a dot segment with
            // parameters to it alone (`..%253Bx`), which a Java server then reads as `..`.
            0x3B => {
                piece.params = true;
                piece.hide(how);
            }
            _ => piece.named = true,
        }
    }
    piece.end(None)?;
    Ok(hidden)
}

/// A piece of a segment as the most lenient reader splits it.
#[derive(Default)]
struct Piece {
    /// Its dots before any `;`.
    dots: usize,
    /// Whether it holds anything but dots before any `;`.
    named: bool,
    /// Whether a `;` began its parameters.
    params: bool,
    /// What only the lenient reader sees in it or at its start, an overlong form first.
    hidden: Option<PathError>,
}

impl Piece {
    fn hide(&mut self, how: Option<PathError>) {
        if self.hidden != Some(PathError::OverlongUtf8) {
            self.hidden = how.or(self.hidden);
        }
    }

    /// Ends the piece (at a separator only the lenient reader sees, `how`, or at the
    /// segment's end): an error if it is a dot segment to that reader alone.
    fn end(mut self, how: Option<PathError>) -> Result<(), PathError> {
        self.hide(how);
        match self.hidden {
            Some(error) if !self.named && (1..=2).contains(&self.dots) => Err(error),
            _ => Ok(()),
        }
    }
}

/// The character at `at` of `segment` as the most lenient reader takes it, its length, and
/// what makes it hidden from the routes, if anything: an overlong form, or a `%` (escaped or
/// overlong) before two hex digits that a second decode reads as one escape.
fn read_leniently(segment: &[u8], at: usize) -> (u32, usize, Option<PathError>) {
    if segment[at] != b'%' {
        return (u32::from(segment[at]), 1, None);
    }
    let (c, len, how) = match overlong(segment, at) {
        Some((c, len)) => (c, len, Some(PathError::OverlongUtf8)),
        None => match escaped(segment, at) {
            Some(b) => (u32::from(b), 3, None),
            None => (u32::from(b'%'), 1, None),
        },
    };
    if c == 0x25 {
        if let Some(b) = segment
            .get(at + len..at + len + 2)
            .and_then(|hex| Some(hex_value(hex[0])? << 4 | hex_value(hex[1])?))
        {
            return (u32::from(b), len + 2, how.or(Some(PathError::DoubleEscape)));
        }
    }
    (c, len, how)
}

/// The normal form of `normal` (a normal path with a character only a lenient reader
/// sees) as the most lenient reader reads it: what only it reads as a `/` or `\` is a
/// `/`, what it reads as an unreserved character or a `;` is that character (`%2569` is
/// `i`, `%253B` is `;`), anything else it alone reads is the one escape of what it reads
/// (`%25C3%25A9` is `%C3%A9`), and the rest is as the routes read it. `None` if it reads
/// no such character there after all (one in a segment a `..` removed).
fn read_leniently_path(normal: &[u8]) -> Result<Option<String>, PathError> {
    let mut read = Vec::with_capacity(normal.len());
    let mut hidden = false;
    for (n, segment) in normal.split(|&b| b == b'/').enumerate() {
        if n > 0 {
            read.push(b'/');
        }
        let mut at = 0;
        while at < segment.len() {
            let (c, len, how) = read_leniently(segment, at);
            let sent = &segment[at..at + len];
            // A byte, or (an overlong form that is not an overlong `%` before two hex
            // digits) a code point.
            let code_point = overlong(segment, at) == Some((c, len));
            hidden |= how.is_some();
            match (how, u8::try_from(c)) {
                (None, _) => read.extend_from_slice(sent),
                (Some(_), Ok(b'/' | b'\\')) => read.push(b'/'),
                // A `;` raw, as the reader that sees it splits parameters off there: routes
                // then match the path without them (`/api/orders%253Bx` is `/api/orders`).
                (Some(_), Ok(b)) if is_unreserved(b) || b == b';' => read.push(b),
                (Some(_), Ok(b)) if b.is_ascii() || !code_point => push_escape(&mut read, b),
                (Some(_), _) => match char::from_u32(c) {
                    Some(c) => {
                        for &b in c.encode_utf8(&mut [0; 4]).as_bytes() {
                            push_escape(&mut read, b);
                        }
                    }
                    None => read.extend_from_slice(sent),
                },
            }
            at += len;
        }
    }
    if !hidden {
        return Ok(None);
    }
    remove_dot_segments(&read).map(Some)
}

/// Merges repeated slashes and removes `.` and `..` segments (RFC 3986 §5.2.4; `..` above
/// the root stays at the root). A path ending in a slash, `.` or `..` ends in a slash.
/// Refuses a dot segment with parameters anywhere in `path`, even one a later `..` removes:
/// a server that drops parameters first reads that `..` differently.
fn remove_dot_segments(path: &[u8]) -> Result<String, PathError> {
    let mut out = String::with_capacity(path.len());
    // Where each segment kept so far starts in `out` (at its slash).
    let mut starts: Vec<usize> = Vec::new();
    let mut trailing = false;
    // The path starts with '/', so the first piece is empty.
    let mut pieces = path.split(|&b| b == b'/').skip(1).peekable();
    while let Some(piece) = pieces.next() {
        if is_dot_with_params(piece) {
            return Err(PathError::DotSegmentWithParams);
        }
        let last = pieces.peek().is_none();
        match piece {
            b"" | b"." => {}
            b".." => {
                if let Some(start) = starts.pop() {
                    out.truncate(start);
                }
            }
            _ => {
                starts.push(out.len());
                out.push('/');
                // The path is ASCII: a URI's bytes, escapes decoded only to ASCII, the others
                // escaped.
                out.push_str(std::str::from_utf8(piece).unwrap_or_default());
                trailing = false;
                continue;
            }
        }
        if last {
            trailing = true;
        }
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    Ok(out)
}

/// `.` or `..` then parameters, a `;` or its escape (upper-cased by [`decode`]): Tomcat
/// splits on the raw `;` only, but a server that decodes first would take `..%3B` for `..;`.
fn is_dot_with_params(piece: &[u8]) -> bool {
    let name = piece
        .strip_prefix(b"..")
        .or_else(|| piece.strip_prefix(b"."));
    name.is_some_and(|params| params.starts_with(b";") || params.starts_with(b"%3B"))
}

#[cfg(test)]
mod tests;
