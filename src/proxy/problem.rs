//! A [`ProxyError`] as the answer the client gets: its problem+json (RFC 9457), built by
//! [`ProxyError::problem_parts`], in the proxy's body type. Kept here, not in the error
//! module, so errors do not depend on the proxy's bodies.

use http::Response;

use super::body::ProxyBody;
use crate::error::ProxyError;

impl ProxyError {
    /// The problem+json answer.
    pub fn into_response(self) -> Response<ProxyBody> {
        let (status, headers, body) = self.problem_parts();
        let mut response = Response::new(ProxyBody::full(body));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}
