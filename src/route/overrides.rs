//! Method-override headers: the method a framework runs a `POST` as when one of them names
//! another (Rack, Express's `method-override`, Symfony and ASP.NET run `POST` with
//! `X-HTTP-Method-Override: DELETE` as a DELETE). What a POST is routed by too, and part of
//! every key's operation (`crate::key::derive`).
//!
//! A request's header names are looked through for them once ([`Overrides::find`]); routing
//! and key derivation read the values of those found, without allocating.

use http::{HeaderMap, HeaderName, HeaderValue, Method};

/// The headers frameworks read as the method to run a request as.
pub static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// Which of the [`METHOD_OVERRIDES`] a request sends, a bit each. It borrows nothing, so
/// the handler finds it once and hands it on to routing and to key derivation after the
/// request has moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides(u8);

impl Overrides {
    /// No override header sent.
    pub const NONE: Self = Self(0);

    /// The override headers `headers` holds.
    pub fn find(headers: &HeaderMap) -> Self {
        // One pass over the names sent (a handful) costs less than three hashed look-ups.
        let mut sent = 0;
        for name in headers.keys() {
            if let Some(i) = METHOD_OVERRIDES.iter().position(|o| o == name) {
                sent |= 1 << i;
            }
        }
        Self(sent)
    }

    /// Whether none is sent.
    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// Each value of the override headers sent, with its header's name: in the order of
    /// [`METHOD_OVERRIDES`], each header's values in the order sent.
    pub fn values(
        self,
        headers: &HeaderMap,
    ) -> impl Iterator<Item = (&'static HeaderName, &HeaderValue)> {
        METHOD_OVERRIDES
            .iter()
            .enumerate()
            .filter(move |(i, _)| self.0 & (1 << i) != 0)
            .flat_map(move |(_, name)| headers.get_all(name).iter().map(move |v| (name, v)))
    }

    /// The methods of `listed` the values name, in the order sent. A value is a comma list
    /// and each element (without the spaces around it) is a method named: Express runs the
    /// first (`DELETE, POST` is a DELETE), another framework may run another. Frameworks
    /// upper-case what they read, and `listed` holds upper-case methods only, so an element
    /// is compared to each ignoring ASCII case, never copied; one longer than all of them
    /// names none.
    pub fn methods<'a>(
        self,
        headers: &'a HeaderMap,
        listed: &'a [Method],
    ) -> impl Iterator<Item = &'a Method> + 'a {
        self.values(headers)
            .flat_map(|(_, value)| value.as_bytes().split(|&b| b == b','))
            .filter_map(move |element| {
                let element = element.trim_ascii();
                listed
                    .iter()
                    .find(|m| element.eq_ignore_ascii_case(m.as_str().as_bytes()))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_element_of_each_value_names_a_listed_method_in_any_case() {
        let listed = [Method::DELETE, Method::PUT];
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "text/plain".parse().unwrap());
        assert_eq!(Overrides::find(&headers), Overrides::NONE);
        headers.append("x-method-override", "put".parse().unwrap());
        headers.append("x-http-method-override", "PATCH ,delete".parse().unwrap());
        headers.append(
            "x-http-method-override",
            "GET, POST,,DELETEX".parse().unwrap(),
        );
        let found = Overrides::find(&headers);
        assert!(!found.is_none());
        let named: Vec<_> = found.methods(&headers, &listed).collect();
        assert_eq!(named, [&Method::DELETE, &Method::PUT]);
        let names: Vec<_> = found.values(&headers).map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "x-http-method-override",
                "x-http-method-override",
                "x-method-override"
            ]
        );
        assert_eq!(Overrides::NONE.methods(&headers, &listed).count(), 0);
    }
}
