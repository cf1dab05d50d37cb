//! Test helpers: a real upstream on 127.0.0.1:0 that counts what it executes, an in-process
//! idemgate on 127.0.0.1:0, and a small HTTP client. No mocks: everything crosses sockets.
//!
//! One job per module: `upstream.rs` the counting upstream, `recorder.rs` the recording
//! one, `proxy.rs` idemgate in process or as a process, `client.rs` the requests, `goaway.rs` an HTTP/2 server that refuses every stream; the
//! database and Redis servers have a module each, and `relay.rs` a relay a test steers
//! between a proxy and its store, `shared_store.rs` scenarios run alike on every shared
//! store. Every item is re-exported here, so tests
//! write `common::post`.
#![allow(dead_code)]

pub mod mariadb_server;
pub mod postgres_server;
pub mod redis_server;
pub mod relay;
pub mod shared_store;
pub mod unprivileged;

mod client;
mod goaway;
mod proxy;
mod recorder;
mod upstream;

// Each test binary uses a part of these: the re-exports it leaves unused are expected there,
// as the dead code allowed above is.
#[allow(unused_imports)]
pub use {client::*, goaway::*, proxy::*, recorder::*, upstream::*};
