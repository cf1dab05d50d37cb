//! `trusted_proxies:`, `session_cookies:` and `credential_headers:` compiled into the
//! [`Identity`] that tells callers apart: which peers may name the client in
//! `X-Forwarded-For`, which cookies name a session, and which headers carry a credential.

use std::sync::Arc;

use http::HeaderName;

use super::error::CompileError;
use super::raw::Parsed;
use crate::key::identity::{Cidr, Identity};

/// How callers are told apart; without `session_cookies` or `credential_headers`, their
/// default lists.
pub(super) fn compile_identity(
    trusted_proxies: Option<Vec<Parsed<Cidr>>>,
    session_cookies: Option<Vec<String>>,
    credential_headers: Option<Vec<String>>,
) -> Result<Arc<Identity>, CompileError> {
    let session_cookies = match session_cookies {
        Some(names) => {
            if let Some(bad) = names.iter().find(|n| !is_cookie_name(n)) {
                return Err(CompileError::new(
                    "session_cookies",
                    format!("{bad:?} is not a cookie name"),
                )
                .within(bad.as_str()));
            }
            names
        }
        None => Identity::default().session_cookies,
    };
    let credential_headers = match credential_headers {
        Some(names) => names
            .iter()
            .map(|n| {
                HeaderName::from_bytes(n.as_bytes()).map_err(|_| {
                    CompileError::new("credential_headers", format!("{n:?} is not a header name"))
                        .within(n.as_str())
                })
            })
            .collect::<Result<_, _>>()?,
        None => Identity::default().credential_headers,
    };
    Ok(Arc::new(Identity {
        trusted_proxies: trusted_proxies
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.0)
            .collect(),
        session_cookies,
        credential_headers,
    }))
}

/// RFC 6265 cookie-name: a token (visible ASCII but separators).
fn is_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
}
