//! The connection to Redis: one server through redis-rs's self-reconnecting
//! `ConnectionManager`, or a cluster connected on first use; both multiplexed, so clones
//! share one socket, and both carry RESP3 pushes (the completion notifications).

use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::Value;
use tokio::sync::OnceCell;

/// The store's connection, of either kind.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    // Connected on first use, so a cluster that is down at start does not stop the proxy.
    Cluster(Arc<(ClusterClient, OnceCell<ClusterConnection>)>),
}

/// A usable connection of either kind (cheap clones of the shared, multiplexed one).
pub(crate) enum Handle {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// The connection to send on; a cluster connects on first use.
    pub(crate) async fn handle(&self) -> redis::RedisResult<Handle> {
        Ok(match self {
            Self::Single(c) => Handle::Single(c.clone()),
            Self::Cluster(cluster) => {
                let (client, cell) = &**cluster;
                let conn = cell
                    .get_or_try_init(|| client.get_async_connection())
                    .await?;
                Handle::Cluster(conn.clone())
            }
        })
    }
}

impl Handle {
    pub(crate) async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Self::Single(c) => c.subscribe(channel).await,
            Self::Cluster(c) => c.subscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Self::Single(c) => c.unsubscribe(channel).await,
            Self::Cluster(c) => c.unsubscribe(channel).await,
        }
    }
}

impl redis::aio::ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
