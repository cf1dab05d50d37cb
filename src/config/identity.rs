//! `trusted_proxies:` and `session_cookies:` compiled into the [`Identity`] that tells
//! callers apart: which peers may name the client in `X-Forwarded-For`, and which cookies
//! name a session.

use std::sync::Arc;

use super::error::CompileError;
use super::raw::Parsed;
use crate::key::identity::{Cidr, Identity};

/// How callers are told apart; without `session_cookies`, the default cookie names.
pub(super) fn compile_identity(
    trusted_proxies: Option<Vec<Parsed<Cidr>>>,
    session_cookies: Option<Vec<String>>,
) -> Result<Arc<Identity>, CompileError> {
    let session_cookies = match session_cookies {
        Some(names) => {
            if let Some(bad) = names.iter().find(|n| !is_cookie_name(n)) {
                return Err(CompileError::new(
                    "session_cookies",
                    format!("{bad:?} is not a cookie name"),
                    "session_cookies",
                ));
            }
            names
        }
        None => Identity::default().session_cookies,
    };
    Ok(Arc::new(Identity {
        trusted_proxies: trusted_proxies
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.0)
            .collect(),
        session_cookies,
    }))
}

/// RFC 6265 cookie-name: a token (visible ASCII but separators).
fn is_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
}
