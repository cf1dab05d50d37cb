//! Deletes expired rows: every `reap_every`, batches of [`BATCH`] rows until a batch comes
//! back short, so one pass never holds many locks or a long transaction. Expired rows
//! already count as gone to every claim; the reaper only keeps the table from growing.
//! Every replica runs one; they skip the rows another is deleting.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;
use std::time::Duration;

use crate::store::StoreError;

/// Rows deleted by one statement.
pub(super) const BATCH: i64 = 500;

/// A store whose expired rows can be deleted.
pub(super) trait Reap: Send + Sync + 'static {
    /// Deletes up to [`BATCH`] expired rows (of the dedupe table or the hit counters) and
    /// says how many.
    fn reap_batch(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The count of rows deleted so far, which [`reap`] adds to.
    fn reaped(&self) -> &AtomicU64;
}

/// Runs the reaper of `store` until the store is gone.
pub(super) async fn reap<S: Reap>(store: Weak<S>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        loop {
            let Some(store) = store.upgrade() else {
                return;
            };
            match store.reap_batch().await {
                Ok(n) => {
                    store.reaped().fetch_add(n, Ordering::Relaxed);
                    if n < BATCH as u64 {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "could not delete expired rows");
                    break;
                }
            }
        }
    }
}
