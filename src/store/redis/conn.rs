//! The connection to Redis: one server through redis-rs's self-reconnecting
//! `ConnectionManager`, or a cluster connected on first use; both multiplexed, so clones
//! share one socket, and both carry RESP3 pushes (the completion notifications).
//!
//! A single server's connection is left (and made again) when the server answers as one
//! that cannot take writes: after a failover behind a DNS name or virtual IP the old
//! primary, now a replica, stays reachable on the connection already open, and redis-rs
//! reconnects only when a connection fails, so every claim would fail until a restart.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, Value};
use tokio::sync::{mpsc, OnceCell};

use super::RedisSettings;
use crate::store::StoreError;
use crate::sync::lock;

/// The least time between two connections left for answering as a replica: a name that
/// still leads to the demoted server reaches it again, and leaving it on every refused
/// write would cut the commands of every other request in flight on the shared connection.
const LEAVE_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// The store's connection, of either kind.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(Single),
    // Connected on first use, so a cluster that is down at start does not stop the proxy.
    Cluster(Arc<(ClusterClient, OnceCell<ClusterConnection>)>),
}

/// A usable connection of either kind (cheap clones of the shared, multiplexed one).
pub(crate) enum Handle {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// The connection `settings` describe, speaking RESP3 so that completion notifications
    /// arrive as pushes on `push_tx`. Nothing is sent yet: a server that is down at start
    /// fails requests until it is back instead of stopping the proxy.
    pub(crate) fn open(
        settings: &RedisSettings,
        push_tx: mpsc::UnboundedSender<PushInfo>,
    ) -> Result<Self, StoreError> {
        let bad = |e: redis::RedisError| StoreError::Unavailable(e.to_string());
        // redis-rs leaves Nagle on; every claim is a small write answered at once, so
        // delaying it only adds latency (and stalls the multiplexed connection).
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        Ok(if settings.cluster.is_empty() {
            let url = settings.url.as_deref().unwrap_or("redis://127.0.0.1:6379");
            let info = url.into_connection_info().map_err(bad)?;
            let resp3 = info
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            let info = info.set_redis_settings(resp3).set_tcp_settings(tcp);
            let client = match &settings.ca {
                Some(pem) => redis::Client::build_with_tls(info, tls_roots(pem)),
                None => redis::Client::open(info),
            }
            .map_err(bad)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(settings.timeout))
                .set_response_timeout(Some(settings.timeout))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_millis(500))
                .set_push_sender(push_tx)
                .set_automatic_resubscription();
            Conn::Single(Single {
                manager: ConnectionManager::new_lazy_with_config(client, config).map_err(bad)?,
                left_at: Arc::default(),
            })
        } else {
            let mut builder = ClusterClient::builder(settings.cluster.clone());
            if let Some(pem) = &settings.ca {
                builder = builder.certs(tls_roots(pem));
            }
            let client = builder
                .use_protocol(ProtocolVersion::RESP3)
                .tcp_settings(tcp)
                .connection_timeout(settings.timeout)
                .response_timeout(settings.timeout)
                .push_sender(push_tx)
                .build()
                .map_err(bad)?;
            Conn::Cluster(Arc::new((client, OnceCell::new())))
        })
    }

    /// The connection to send on; a cluster connects on first use.
    pub(crate) async fn handle(&self) -> redis::RedisResult<Handle> {
        Ok(match self {
            Self::Single(single) => Handle::Single(single.manager.clone()),
            Self::Cluster(cluster) => {
                let (client, cell) = &**cluster;
                let conn = cell
                    .get_or_try_init(|| client.get_async_connection())
                    .await?;
                Handle::Cluster(conn.clone())
            }
        })
    }

    /// Whether `error` says the server cannot take writes (a replica, or a server loading its
    /// data), and, if it does, leaves the single server's connection for a new one (at most
    /// once per [`LEAVE_AT_MOST_EVERY`]), so that the primary now behind its address is
    /// reached. A cluster follows its primaries itself (redis-rs refreshes its slot map on
    /// `READONLY`).
    ///
    /// The command refused this way did not run: a caller may send it again.
    pub(crate) async fn leave_if_not_writable(&self, error: &redis::RedisError) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        let Self::Single(single) = self else {
            return false;
        };
        // `LOADING` too: a demoted primary answers it while it loads the new primary's
        // data, and a restarted primary that answers it is reached again on a new
        // connection at no cost but one reconnect.
        let ErrorKind::Server(
            ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading,
        ) = error.kind()
        else {
            return false;
        };
        {
            let mut left_at = lock(&single.left_at);
            if left_at.is_some_and(|at| at.elapsed() < LEAVE_AT_MOST_EVERY) {
                // Left lately (perhaps under this very command): the retry goes out on the
                // new connection, or finds the server still refusing and fails.
                return true;
            }
            *left_at = Some(Instant::now());
        }
        tracing::warn!(error = %error, "redis cannot take writes here; reconnecting to reach the primary");
        // redis-rs offers no way to drop a connection that still works: `QUIT` has the
        // server close it, and the manager reconnects (to whatever the address leads to
        // now, resubscribing the channels it holds) as on any lost connection. Commands of
        // other requests sent after it never run and are retried as on a dropped
        // connection. `QUIT` is taken before `AUTH` and from a user whose ACL allows no
        // command; a server that refuses it keeps the connection, with a warning.
        let quit = redis::cmd("QUIT")
            .query_async::<Value>(&mut single.manager.clone())
            .await;
        if let Err(e) = quit {
            if !e.is_connection_dropped() && !e.is_io_error() {
                tracing::warn!(error = %e, "redis refused QUIT; the connection is kept");
            }
        }
        true
    }
}

/// A single server's self-reconnecting connection.
#[derive(Clone)]
pub(crate) struct Single {
    manager: ConnectionManager,
    /// When the connection was last left for answering as a replica.
    left_at: Arc<Mutex<Option<Instant>>>,
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

fn tls_roots(pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    }
}
