//! The secrets a config names by file or variable rather than holding: the admin token
//! (`admin.token_file`) and the keys stored answers are sealed with (`store.encrypt`),
//! read when the config is loaded (and again on every reload).

use std::path::Path;
use std::sync::Arc;

use super::error::CompileError;
use super::listen::Admin;
use super::raw::store::{ClearRecords as RawClearRecords, RawEncrypt, RawKeySource};
use super::raw::RawAdmin;
use crate::store::seal::{ClearRecords, KeyRing};

/// `admin:` with its token read from `token_file` (relative to the config) when given.
pub(super) fn compile_admin(a: RawAdmin, base: &Path) -> Result<Admin, CompileError> {
    let err = |m: String| CompileError::new("admin.token_file", m);
    let token = match (a.token, a.token_file) {
        (Some(_), Some(_)) => {
            return Err(CompileError::new(
                "admin",
                "give `token` or `token_file`, not both",
            ))
        }
        (token, None) => {
            if let Some(why) = token.as_deref().and_then(unsendable) {
                return Err(CompileError::new("admin.token", why));
            }
            token
        }
        (None, Some(file)) => {
            let text = std::fs::read_to_string(base.join(&file))
                .map_err(|e| err(format!("{file}: {e}")))?;
            let token = text.trim();
            if token.is_empty() {
                return Err(err(format!("{file} is empty")));
            }
            if let Some(why) = unsendable(token) {
                return Err(err(format!("{file}: {why}")));
            }
            Some(token.to_owned())
        }
    };
    Ok(Admin {
        listen: a.listen,
        token,
    })
}

/// Why no request could present `token` (compared with what follows `Bearer ` in its
/// `Authorization` field), if none could: HTTP strips a field value's blanks at its ends,
/// and the comparison reads visible ASCII only. Such a token would lock everyone out.
fn unsendable(token: &str) -> Option<String> {
    if token.trim() != token {
        return Some("the admin token has blanks at its ends, which HTTP strips".into());
    }
    if !token.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return Some(
            "the admin token is sent in an Authorization field: visible ASCII and spaces only"
                .into(),
        );
    }
    None
}

/// `store.encrypt`: the keys read from their files and variables, the first sealing, and
/// whether records in clear are still read (`clear_records`, `accept` unless written).
pub(super) fn compile_encrypt(e: RawEncrypt, base: &Path) -> Result<Arc<KeyRing>, CompileError> {
    let err = |m: String| CompileError::new("store.encrypt", m);
    let mut sources = Vec::new();
    if e.key_file.is_some() || e.key_env.is_some() {
        sources.push(RawKeySource {
            file: e.key_file,
            env: e.key_env,
        });
    }
    sources.extend(e.keys.unwrap_or_default());
    let mut keys = Vec::with_capacity(sources.len());
    for source in sources {
        let (what, data) = match (source.file, source.env) {
            (Some(file), None) => {
                let data =
                    std::fs::read(base.join(&file)).map_err(|e| err(format!("{file}: {e}")))?;
                (file, data)
            }
            (None, Some(var)) => {
                let data = std::env::var(&var)
                    .map_err(|_| err(format!("environment variable {var} is not set")))?;
                (format!("${var}"), data.into_bytes())
            }
            _ => {
                return Err(err(
                    "each key is `file: PATH` or `env: VARIABLE`, one of them".into(),
                ))
            }
        };
        keys.push(crate::store::seal::parse_key(&data).map_err(|m| err(format!("{what}: {m}")))?);
    }
    let clear_records = match e.clear_records {
        None | Some(RawClearRecords::Accept) => ClearRecords::Accept,
        Some(RawClearRecords::Refuse) => ClearRecords::Refuse,
    };
    KeyRing::new(keys)
        .map(|ring| Arc::new(ring.with_clear_records(clear_records)))
        .map_err(err)
}
