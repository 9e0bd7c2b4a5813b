//! One Redis server: its address (printable without the password), a lazily opened connection
//! that is dropped after any failure so the next attempt starts fresh, script calls with EVALSHA
//! and an EVAL fallback, and release subscriptions.

use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSubStream};
use redis::{AsyncConnectionConfig, IntoConnectionInfo, ServerErrorKind, Value};

use crate::backend::{BackendError, Wakeups};
use crate::lease::show;
use crate::scripts::Script;

/// A Redis server reached through one URL.
pub struct Node {
    client: redis::Client,
    address: String,
    connect_timeout: Duration,
    conn: std::sync::Mutex<Option<MultiplexedConnection>>,
}

impl Node {
    /// Parses `url` (`redis://` or `redis+unix://`). A password missing from the URL is taken
    /// from `REDISCLI_AUTH`, as `redis-cli` does. Errors are usage errors, never printing the
    /// password.
    pub fn open(url: &str, connect_timeout: Duration) -> Result<Node, String> {
        let parsed = redis::parse_redis_url(url)
            .filter(|u| matches!(u.scheme(), "redis" | "redis+unix"))
            .ok_or_else(|| bad_url(url))?;
        let address = redact(&parsed);
        if parsed.scheme() == "redis" && parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("the Redis URL {address} has no host"));
        }
        let mut info = parsed.into_connection_info().map_err(|e| {
            format!(
                "the Redis URL {address} is not valid: {}",
                e.detail().unwrap_or("bad URL")
            )
        })?;
        let mut settings = info.redis_settings().clone().set_skip_set_lib_name();
        if settings.password().is_none() {
            if let Some(password) = std::env::var("REDISCLI_AUTH")
                .ok()
                .filter(|p| !p.is_empty())
            {
                settings = settings.set_password(password);
            }
        }
        info = info.set_redis_settings(settings);
        let client = redis::Client::open(info)
            .map_err(|_| format!("the Redis URL {address} is not valid"))?;
        Ok(Node {
            client,
            address,
            connect_timeout,
            conn: std::sync::Mutex::new(None),
        })
    }

    /// The URL without its password, for messages.
    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Forget the connection: the next call opens a fresh one.
    fn forget(&self) {
        self.slot().take();
    }

    /// The connection slot; never held across an `.await`.
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn connection(
        &self,
        timeout: Duration,
    ) -> Result<MultiplexedConnection, redis::RedisError> {
        if let Some(conn) = self.slot().as_ref() {
            return Ok(conn.clone());
        }
        let timeout = timeout.min(self.connect_timeout);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None);
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        *self.slot() = Some(conn.clone());
        Ok(conn)
    }

    /// Runs `f` on the connection within `timeout`. After any failure, and when the caller
    /// gives up on the attempt before it ends (a timeout around it, a signal), the connection
    /// is dropped, so the next attempt starts on a fresh one rather than behind a stuck reply.
    async fn with_connection<T, F, Fut>(&self, timeout: Duration, f: F) -> Result<T, BackendError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, redis::RedisError>>,
    {
        let mut unfinished = Unfinished(Some(self));
        let attempt = async {
            let conn = self.connection(timeout).await?;
            f(conn).await
        };
        let result = match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(value)) => {
                unfinished.0 = None;
                return Ok(value);
            }
            Ok(Err(error)) => self.classify(&error),
            Err(_) => BackendError::Transient(format!(
                "Redis at {} did not answer within {}",
                self.address,
                show(timeout)
            )),
        };
        Err(result)
    }

    /// Runs a script: EVALSHA, and EVAL when the server does not know it (restarted, flushed).
    pub async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        timeout: Duration,
    ) -> Result<Value, BackendError> {
        self.with_connection(timeout, |mut conn| async move {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&script.sha1).arg(keys.len()).arg(keys).arg(args);
            match cmd.query_async::<Value>(&mut conn).await {
                Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(script.source).arg(keys.len()).arg(keys).arg(args);
                    cmd.query_async::<Value>(&mut conn).await
                }
                other => other,
            }
        })
        .await
    }

    /// Runs a pipeline (status queries).
    pub async fn query(
        &self,
        pipe: &redis::Pipeline,
        timeout: Duration,
    ) -> Result<Vec<Value>, BackendError> {
        self.with_connection(timeout, |mut conn| async move {
            pipe.query_async::<Vec<Value>>(&mut conn).await
        })
        .await
    }

    /// Subscribes to `channel` on a connection of its own; the server has confirmed the
    /// subscription when this returns.
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription, BackendError> {
        let timeout = self.connect_timeout;
        let attempt = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok::<_, redis::RedisError>(pubsub.into_on_message())
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(stream)) => Ok(Subscription {
                stream,
                address: self.address.clone(),
            }),
            Ok(Err(error)) => Err(self.classify(&error)),
            Err(_) => Err(BackendError::Transient(format!(
                "Redis at {} did not confirm the subscription within {}",
                self.address,
                show(timeout)
            ))),
        }
    }

    /// Turns a client error into a message that names the server (never its password) and
    /// says whether retrying can help.
    pub fn classify(&self, error: &redis::RedisError) -> BackendError {
        let address = &self.address;
        if error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
        {
            return BackendError::Transient(format!(
                "cannot reach Redis at {address}: {}",
                io_reason(error)
            ));
        }
        let code = error.code().unwrap_or("ERR");
        let detail = error.detail().unwrap_or("").trim();
        // A server that is starting, busy with a script, or failing over may answer properly
        // in a moment: worth retrying (while waiting; at first contact it is 69 all the same).
        if matches!(
            code,
            "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN"
        ) {
            return BackendError::Transient(format!(
                "Redis at {address} is not ready: {code} {detail}"
            ));
        }
        // An unauthenticated client may not even send a long command: Redis answers with a
        // protocol error instead of NOAUTH.
        let kind = if detail.contains("unauthenticated") {
            "NOAUTH"
        } else {
            code
        };
        let hint = match kind {
            "READONLY" => "; point --url at the primary, not a replica",
            "NOPERM" => {
                "; the Redis user needs EVAL, EVALSHA, PUBLISH and SUBSCRIBE on the lock's keys (see the README's ACL section)"
            }
            "NOAUTH" | "WRONGPASS" => {
                "; the server requires a password: give it in the URL through LOCKED_RUN_URL, or in REDISCLI_AUTH"
            }
            "OOM" => {
                "; the server is out of memory (maxmemory reached): free memory or raise maxmemory"
            }
            "WRONGTYPE" => {
                "; another program uses this key for something else: pick another NAME or remove the key"
            }
            _ => "",
        };
        BackendError::Refused(format!("Redis at {address} refused: {code} {detail}{hint}"))
    }
}

fn io_reason(error: &redis::RedisError) -> String {
    if error.is_timeout() {
        "timed out".into()
    } else {
        error.to_string()
    }
}

fn bad_url(url: &str) -> String {
    if url.starts_with("rediss://") {
        return "rediss:// (TLS) is not supported by this version of locked-run; use redis:// over a trusted network or a tunnel".into();
    }
    if url.starts_with("file://") {
        return "file:// (the host-local backend) is not supported by this version of locked-run"
            .into();
    }
    let shown = match redis::parse_redis_url(url) {
        Some(parsed) => redact(&parsed),
        None if url.contains('@') => "(a URL with credentials, not shown)".to_owned(),
        None => format!("{url:?}"),
    };
    format!(
        "{shown} is not a supported Redis URL: use redis://[user[:password]@]host[:port][/db] \
         or redis+unix:///path/to/socket"
    )
}

/// The URL with any password removed, so it can be printed.
pub fn redact(url: &url::Url) -> String {
    let mut url = url.clone();
    if url.password().is_some() {
        let _ = url.set_password(None);
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| k != "pass" && k != "password")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if pairs.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
    }
    url.to_string()
}

/// Forgets the node's connection when dropped before being disarmed.
struct Unfinished<'a>(Option<&'a Node>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.0 {
            node.forget();
        }
    }
}

/// Release messages on one server's channel.
pub struct Subscription {
    stream: PubSubStream,
    address: String,
}

impl Wakeups for Subscription {
    async fn next(&mut self) -> Result<(), BackendError> {
        match self.stream.next().await {
            Some(_) => Ok(()),
            None => Err(BackendError::Transient(format!(
                "lost the subscription connection to Redis at {}",
                self.address
            ))),
        }
    }
}
