//! Reading `If-Match` (RFC 9110 §13.1.1) for `DELETE /keys/{digest}`: `*`, or a list of
//! entity tags, of which the strong ones this proxy wrote name the records to delete.

use http::{header, HeaderMap};

use crate::store::Revision;

/// What a `DELETE` asks of the record it removes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Condition {
    /// No `If-Match`, or `If-Match: *`: whichever live record the key holds.
    Any,
    /// Only a record one of these names. A weak tag is left out (`If-Match` compares
    /// strongly), as is a tag this proxy never wrote: neither names a record, and a list of
    /// nothing else (or of no tag at all) is met by none.
    OneOf(Vec<Revision>),
}

/// The request's condition; `None` if its `If-Match` is neither `*` nor a list of entity
/// tags.
pub(super) fn condition(headers: &HeaderMap) -> Option<Condition> {
    let mut fields = headers.get_all(header::IF_MATCH).iter().peekable();
    if fields.peek().is_none() {
        return Some(Condition::Any);
    }
    let mut elements = Vec::new();
    for field in fields {
        elements.extend(list(field.as_bytes())?);
    }
    // A field with no tag in it (`If-Match:` from a script whose tag came out empty) is a
    // list of none: not `*`, and no tag of it matches, so the condition is false (RFC 9110
    // §13.1.1), met by no record. Read as no condition, it would delete whatever the key
    // holds now.
    if elements.contains(&&b"*"[..]) {
        // `*` stands alone: `If-Match = "*" / #entity-tag`.
        return (elements.len() == 1).then_some(Condition::Any);
    }
    let strong = elements
        .into_iter()
        .filter(|tag| !tag.starts_with(b"W/"))
        .filter_map(|tag| Revision::from_etag(std::str::from_utf8(tag).ok()?));
    Some(Condition::OneOf(strong.collect()))
}

/// The elements of one field's comma-separated list (RFC 9110 §5.6.1, empty elements
/// skipped), each `*` or an entity tag as written (`W/` included); `None` if the field is
/// not such a list.
fn list(field: &[u8]) -> Option<Vec<&[u8]>> {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let mut elements = Vec::new();
    let mut i = 0;
    loop {
        while field.get(i).is_some_and(|b| ows(b) || *b == b',') {
            i += 1;
        }
        if i == field.len() {
            return Some(elements);
        }
        let start = i;
        if field[i] == b'*' {
            i += 1;
        } else {
            if field[i..].starts_with(b"W/") {
                i += 2;
            }
            if field.get(i) != Some(&b'"') {
                return None;
            }
            i += 1;
            // etagc: `!`, `#`..`~`, obs-text.
            while field
                .get(i)
                .is_some_and(|&b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80)
            {
                i += 1;
            }
            if field.get(i) != Some(&b'"') {
                return None;
            }
            i += 1;
        }
        elements.push(&field[start..i]);
        while field.get(i).is_some_and(ows) {
            i += 1;
        }
        if i < field.len() && field[i] != b',' {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OwnerToken;
    use http::HeaderValue;

    fn condition_of(fields: &[&str]) -> Option<Condition> {
        let mut headers = HeaderMap::new();
        for field in fields {
            headers.append(header::IF_MATCH, HeaderValue::from_str(field).unwrap());
        }
        condition(&headers)
    }

    #[test]
    fn no_field_or_a_star_is_any_record() {
        assert_eq!(condition_of(&[]), Some(Condition::Any));
        assert_eq!(condition_of(&["*"]), Some(Condition::Any));
        assert_eq!(condition_of(&[" * "]), Some(Condition::Any));
    }

    #[test]
    fn strong_tags_this_proxy_wrote_name_their_records() {
        let a = Revision::new("done", 5, None);
        let b = Revision::new("failed", 6, Some(OwnerToken(7)));
        let (ta, tb) = (a.etag(), b.etag());
        assert_eq!(
            condition_of(&[&ta]),
            Some(Condition::OneOf(vec![a])),
            "one tag"
        );
        let listed = format!("\"other,tag\" , {ta},,W/{tb}");
        assert_eq!(
            condition_of(&[&listed, &tb]),
            Some(Condition::OneOf(vec![a, b])),
            "a list over two fields; the weak copy and a foreign tag name nothing"
        );
        assert_eq!(
            condition_of(&[&format!("W/{ta}")]),
            Some(Condition::OneOf(vec![])),
            "a weak tag never matches"
        );
    }

    /// A field with no tag in it is a list of none (RFC 9110 §13.1.1: neither `*` nor a
    /// listed tag, the condition is false): it names no record, rather than any.
    #[test]
    fn a_field_of_no_tag_names_no_record() {
        for no_tag in ["", " ", ",", " , ,\t"] {
            assert_eq!(
                condition_of(&[no_tag]),
                Some(Condition::OneOf(vec![])),
                "{no_tag:?}"
            );
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "abc",
            "\"open",
            "\"a\" \"b\"",
            "*, \"a\"",
            "W/abc",
            "\"a\"b",
        ] {
            assert_eq!(condition_of(&[bad]), None, "{bad}");
        }
    }
}
