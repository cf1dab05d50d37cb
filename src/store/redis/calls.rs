//! How one Redis store operation goes over the connection: bounded by the store timeout
//! (either failure a store error), and made once more if the connection dropped under the
//! first attempt, which every operation sent this way is safe to repeat, or if the server
//! refused it as a replica (the connection is then left for the primary).

use redis::Value;

use super::RedisStore;
use crate::store::StoreError;

impl RedisStore {
    /// Runs one script invocation under the store timeout. A connection that dropped since
    /// the last call is retried once on the fresh connection: every script is safe to run
    /// twice (a repeated claim recognises its own token, the others are fenced).
    pub(super) async fn run(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        self.run_raw(invocation)
            .await?
            .map_err(|e| StoreError::Unavailable(e.to_string()))
    }

    /// [`RedisStore::run`], with an error answer of the server left to the caller.
    pub(super) async fn run_raw(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<redis::RedisResult<Value>, StoreError> {
        let call = async {
            let result = self
                .retried(|| async {
                    invocation
                        .invoke_async(&mut self.conn.handle().await?)
                        .await
                })
                .await;
            match result {
                Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => Ok(Err(e)),
                other => other.map(Ok),
            }
        };
        self.bounded(call).await
    }

    /// `call`, made again once if the connection dropped under the first attempt, and once
    /// if the server refused it as one that cannot take writes (a primary demoted by a
    /// failover, `Conn::leave_if_not_writable`), after leaving that connection. A refused
    /// command did not run, so sending it again is safe even where a repeat would not be;
    /// the second attempt may find the left connection closing under it, hence the retry
    /// on a dropped connection after it too: four attempts at most, all within the one
    /// store timeout [`RedisStore::bounded`] puts on them.
    pub(super) async fn retried<T, F, Fut>(&self, call: F) -> redis::RedisResult<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let (mut dropped, mut refused) = (false, false);
        loop {
            match call().await {
                Err(e) if !dropped && (e.is_connection_dropped() || e.is_io_error()) => {
                    tracing::debug!(error = %e, "redis connection dropped; retrying once");
                    dropped = true;
                }
                Err(e) if !refused && self.conn.leave_if_not_writable(&e).await => {
                    refused = true;
                    // A dropped connection after this is the one just left, not a new fault.
                    dropped = false;
                }
                other => return other,
            }
        }
    }

    /// Sends one command under the store timeout, retried once on a dropped connection like
    /// [`RedisStore::run`] (the caller makes sure it is safe to send twice). An error
    /// answer of the server is left to the caller.
    pub(super) async fn query_raw(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<redis::RedisResult<Value>, StoreError> {
        let call = async {
            let result = self
                .retried(|| async {
                    cmd.query_async::<Value>(&mut self.conn.handle().await?)
                        .await
                })
                .await;
            match result {
                Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => Ok(Err(e)),
                other => other.map(Ok),
            }
        };
        self.bounded(call).await
    }

    /// Bounds one store operation by the store timeout; either failure is a store error.
    pub(super) async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {:?}",
                self.timeout
            ))),
        }
    }
}
