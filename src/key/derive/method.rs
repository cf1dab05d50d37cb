//! The operation a request names: its method, and the method a framework runs it as when
//! a method-override header names another (Rack, Express's `method-override`, Symfony and
//! ASP.NET run `POST` with `X-HTTP-Method-Override: DELETE` as a DELETE).

use std::borrow::Cow;

use http::{HeaderMap, Method};

use crate::route::Overrides;

/// The method, then a `\nname: VALUE` line per override value sent (`overrides`, those
/// `headers` holds), the whole value upper-cased as the frameworks read it: two values a
/// framework could read as different methods (`DELETE, PUT` and `DELETE`) are two
/// operations. A method has no space or newline and a header value no newline, so no two
/// operations write the same bytes; without an override it is the method alone, so keys
/// of requests without one do not change.
pub(super) fn operation<'r>(
    method: &'r Method,
    headers: &HeaderMap,
    overrides: Overrides,
) -> Cow<'r, [u8]> {
    debug_assert_eq!(overrides, Overrides::find(headers), "overrides not found");
    let method = method.as_str().as_bytes();
    if overrides.is_none() {
        return Cow::Borrowed(method);
    }
    let mut out = method.to_vec();
    for (name, value) in overrides.values(headers) {
        out.push(b'\n');
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend(value.as_bytes().iter().map(u8::to_ascii_uppercase));
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operation<'r>(method: &'r Method, headers: &HeaderMap) -> Cow<'r, [u8]> {
        super::operation(method, headers, Overrides::find(headers))
    }

    #[test]
    fn an_override_is_read_in_any_case_and_only_when_sent() {
        let mut headers = HeaderMap::new();
        assert_eq!(&*operation(&Method::POST, &headers), b"POST");
        headers.insert("x-http-method-override", "delete".parse().unwrap());
        let lower = operation(&Method::POST, &headers).into_owned();
        headers.insert("x-http-method-override", "DELETE".parse().unwrap());
        assert_eq!(operation(&Method::POST, &headers), lower);
        assert_eq!(&*lower, b"POST\nx-http-method-override: DELETE");
        headers.insert("x-http-method-override", "DELETE, PUT".parse().unwrap());
        assert_ne!(operation(&Method::POST, &headers), lower);
        headers.insert("x-http-method-override", "DELETE".parse().unwrap());
        headers.insert("x-method-override", "PUT".parse().unwrap());
        assert_ne!(operation(&Method::POST, &headers), lower);
    }
}
