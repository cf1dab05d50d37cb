//! HTTP/2 clients under abuse. The listener's limits against the known HTTP/2 attacks are
//! pinned here, each by a test that fails when its limit is lifted from the builder
//! (`src/server.rs`): rapid reset (CVE-2023-44487), streams reset for the client's errors,
//! CONTINUATION flood (CVE-2024-27316), a header list over `max_header_list_size`; and
//! PING and SETTINGS floods (CVE-2019-9512, -9515), which h2 bounds with no setting, by a
//! test that fails against a server reading past what it answered. And the proxy's own
//! part: owners whose clients left after their request went out run on (SPEC 5), so
//! resetting streams, or leaving connections, must not buy upstream calls without end;
//! and protected bodies sent slowly on many streams must not buy the whole buffer budget,
//! nor replays of a large stored answer left unread.
//!
//! One job per module: `wire.rs` a client connection written and read by hand, `frames.rs`
//! the frames (shared with tests/desync_h2), `limits.rs` the library's limits, `owners.rs`
//! owners that outlive their clients, `buffers.rs` one connection's share of the buffer
//! budget, `replays.rs` the copies replays hold against it, `answers.rs` the owners'
//! answers held by clients that do not read them.

#[path = "../common/mod.rs"]
mod common;

mod answers;
mod buffers;
#[allow(dead_code)]
#[path = "../desync_h2/frames.rs"]
mod frames;
mod limits;
mod owners;
mod replays;
mod wire;

use std::time::Duration;

use common::{start_proxy, start_upstream};
use frames::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wire::{CANCEL, ENHANCE_YOUR_CALM, H2, HANG};
