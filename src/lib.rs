//! idemgate: a reverse proxy that makes the non-idempotent endpoints of an existing
//! application idempotent. Duplicate requests execute upstream once; every repeat gets the
//! stored answer of the first.
//!
//! The pipeline lives in [`proxy`]; keys in [`key`] (over [`canonical`] forms); claims in
//! [`store`]; configuration in [`config`]; the proxy's own answers in [`error`].

#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]
#![warn(missing_docs)]

pub mod admin;
pub mod canonical;
pub mod config;
pub mod error;
pub mod explain;
pub mod key;
pub mod metrics;
pub mod proxy;
pub mod route;
pub mod server;
pub mod store;
mod sync;
pub mod tls;
