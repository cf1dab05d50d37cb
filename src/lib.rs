//! idemgate: a reverse proxy that makes the non-idempotent endpoints of an existing
//! application idempotent. Duplicate requests execute upstream once; every repeat gets the
//! stored answer of the first.
//!
//! # Map
//!
//! A request's way through the code, in order:
//!
//! 1. [`server`] accepts the connection (hyper-util serves HTTP/1.1 and HTTP/2; [`tls`]
//!    terminates TLS) and hands each request to [`proxy::Proxy`].
//! 2. [`proxy::admission`] refuses what no upstream should see; [`route`] matches the
//!    normalised path, host and method to a configured route.
//! 3. Unprotected routes stream through [`proxy::passthrough`]. Protected ones run
//!    [`proxy::protected`]: buffer the body, derive the key ([`key`], over the
//!    [`canonical`] forms of body and query, scoped to the caller by `key::identity`),
//!    claim it in the [`store`], then forward ([`proxy::upstream`]), wait for the owner, or
//!    replay; finally settle the claim with the answer or the failure. `idempotency:
//!    observe` routes take [`proxy::observe`] instead: the same store work, no enforcement.
//! 4. Everything the proxy answers itself is a [`error::ProxyError`], one status each,
//!    rendered as problem+json.
//!
//! Around it: [`config`] turns `proxy.yaml` into the runtime configuration (reloaded on
//! SIGHUP); [`metrics`] is the Prometheus registry; [`admin`] serves `/metrics`, health and
//! key inspection; [`explain`] answers `idemgate explain`. The binary (`src/main.rs`) parses
//! the command line, starts the listeners and handles signals.

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
mod signal;
pub mod store;
mod sync;
pub mod tls;
