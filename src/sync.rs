//! Locking that survives a panic elsewhere.
//!
//! Every mutex in the proxy guards state that each holder leaves consistent before anything
//! that can panic (a map insert, a counter, a list push), so a lock poisoned by a panicking
//! task is taken over instead of failing every later request.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering it if a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
