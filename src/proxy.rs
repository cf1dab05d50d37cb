//! The proxy pipeline. [`handler`] matches the route and picks a path: [`passthrough`]
//! streams unprotected requests untouched; [`protected`] runs the phases buffer → derive
//! key → claim → forward, wait or replay → complete or release.

pub mod body;
pub mod handler;
pub mod headers;
pub mod passthrough;
pub mod protected;
pub mod upstream;

pub use handler::Proxy;
