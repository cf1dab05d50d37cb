//! Method-override headers: the method a framework runs a `POST` as when one of them names
//! another (Rack, Express's `method-override`, Symfony and ASP.NET run `POST` with
//! `X-HTTP-Method-Override: DELETE` as a DELETE). What a POST is routed by too, and part of
//! every key's operation (`crate::key::derive`).

use http::{HeaderMap, HeaderName, Method};

use super::is_safe;

/// The headers frameworks read as the method to run a request as (Rack, Express's
/// `method-override`, Symfony and ASP.NET run `POST` with `X-HTTP-Method-Override: DELETE`
/// as a DELETE): part of every key's operation, and what a POST is routed by too.
pub static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The methods a `POST` names in its override headers ([`METHOD_OVERRIDES`]), upper-cased
/// as the frameworks read them, in the order sent; none for another method (frameworks
/// honour overrides on POST only), nor for a value that is no method or a safe one. A value
/// is a comma list: each element (without the spaces around it) is a method named, since
/// Express runs the first (`DELETE, POST` is a DELETE) and another framework may run
/// another.
pub fn overridden_methods<'h>(
    method: &Method,
    headers: &'h HeaderMap,
) -> impl Iterator<Item = Method> + 'h {
    // One pass over the names sent (a handful) costs less than three hashed look-ups.
    let post =
        *method == Method::POST && headers.keys().any(|sent| METHOD_OVERRIDES.contains(sent));
    METHOD_OVERRIDES
        .iter()
        .filter(move |_| post)
        .flat_map(|name| headers.get_all(name))
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .filter_map(|element| {
            let upper = element.trim_ascii().to_ascii_uppercase();
            Method::from_bytes(&upper).ok()
        })
        .filter(|m| !is_safe(m) && *m != Method::POST)
}
