//! idemgate: a reverse proxy that makes the non-idempotent endpoints of an existing
//! application idempotent. Duplicate requests execute upstream once; every repeat gets the
//! stored answer of the first.
//!
//! The pipeline lives in [`proxy`]; keys in [`key`] (over [`canonical`] forms); claims in
//! [`store`]; configuration in [`config`]; the proxy's own answers in [`error`].

#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]
#![warn(missing_docs)]
// Module docs are the code's map for contributors and link the private submodules that do
// the work; `cargo doc --document-private-items` renders them (scripts/test checks that every
// link resolves).
#![allow(rustdoc::private_intra_doc_links)]

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
