//! One uncontended lock run, taken as `locked-run NAME -- true` takes it, on the project's own
//! Redis client or on the `redis` crate's async connection, so that bench/bench.py can time the
//! two side by side in fresh processes ("The redis crate against the own client" in
//! bench/RESULTS.md).
//!
//!     client_cost MODE redis://HOST:PORT NAME
//!
//! MODE:
//! - `own`: `Node` (src/redis/node/mod.rs) over the own RESP client: `HELLO 3` and the acquire's
//!   EVALSHA in one write, EVAL on NOSCRIPT, then the release's EVALSHA.
//! - `redis-crate`: the crate's `MultiplexedConnection` (1.x has no other async connection;
//!   `ConnectionManager` wraps this one) and `redis::Script`, set up for the fewest round trips:
//!   RESP2 and no `CLIENT SETINFO`, so the crate sends nothing before the acquire and the run
//!   makes the same round trips as `own`. The crate's best case.
//! - `redis-crate-resp3`: the same with RESP3, which locked-run's waiters need (the release
//!   message arrives on the connection that sends the acquire): the crate sends `HELLO 3` as
//!   a round trip of its own before the acquire.
//!
//! Both modes use the same scripts, keys and arguments as src/redis/lock.rs, the same
//! current_thread runtime as locked-run, and the same way of running `true`
//! (`std::process::Command`), so that what differs between them is the client. Exits 0 once
//! the grant and the release were both confirmed; otherwise 1, with a message. With
//! `CLIENT_COST_VMHWM` set, prints the process's peak RSS (`VmHWM: N kB`) to stderr at the end:
//! wait4's `ru_maxrss` cannot tell it, as it counts the spawning process's memory too.

use std::process::{Command, ExitCode};
use std::time::Duration;

use locked_run::internals::LockName;
use locked_run::internals::redis::Keys;
use locked_run::internals::redis::Node;
use locked_run::internals::redis::resp::Reply;
use locked_run::internals::redis::scripts::{ACQUIRE, RELEASE};
use locked_run::internals::{hostname, wall_clock_ms};

/// locked-run's `--connect-timeout` and request limits are of this order; nothing here waits.
const TIMEOUT: Duration = Duration::from_secs(5);
/// locked-run's default `--ttl`.
const TTL_MS: &str = "30000";

/// The keys and arguments of one run's acquire and release, as `ServerLock` builds them.
struct Run {
    keys: Keys,
    token: String,
    host: String,
    pid: String,
    command: String,
    since: String,
}

impl Run {
    fn new(name: &str) -> Result<Run, String> {
        let name = LockName::new(name)?;
        Ok(Run {
            keys: Keys::of(&name),
            token: uuid::Uuid::new_v4().to_string(),
            host: hostname(),
            pid: std::process::id().to_string(),
            command: "true".to_owned(),
            since: wall_clock_ms().to_string(),
        })
    }

    fn acquire_keys(&self) -> [&str; 8] {
        let k = &self.keys;
        [
            &k.lock,
            &k.fence,
            &k.holder,
            &k.holders,
            &k.holders_meta,
            &k.queue,
            &k.queue_alive,
            &k.gone,
        ]
    }

    /// A waiting run's: mode `queue` (fair waiting), and its keep-alive.
    fn acquire_args(&self) -> [&str; 8] {
        [
            &self.token,
            TTL_MS,
            &self.host,
            &self.pid,
            &self.command,
            &self.since,
            "queue",
            "2000",
        ]
    }

    fn release_keys(&self) -> [&str; 5] {
        let k = &self.keys;
        [&k.lock, &k.holder, &k.queue, &k.queue_alive, &k.gone]
    }

    /// Keep 0 (delete now), PUBLISH the release as a single server does, bury nothing.
    fn release_args(&self) -> [&str; 5] {
        [&self.token, "0", &self.keys.channel, "PUBLISH", "0"]
    }
}

/// The command, run and waited for the same way in every mode.
fn run_true() -> Result<(), String> {
    let status = Command::new("true")
        .status()
        .map_err(|e| format!("cannot run true: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("true ended with {status}"))
    }
}

async fn own(url: &str, run: &Run) -> Result<(), String> {
    let node = Node::open(url, TIMEOUT, None)?;
    let reply = node
        .eval(
            &ACQUIRE,
            &run.acquire_keys(),
            &run.acquire_args(),
            TIMEOUT,
            None,
        )
        .await
        .map_err(|e| e.to_string())?;
    let granted = reply.items().first().and_then(Reply::as_int) == Some(1)
        && reply.items().get(1).and_then(Reply::as_int).is_some();
    if !granted {
        return Err(format!("the acquire was not granted: {reply:?}"));
    }
    run_true()?;
    let reply = node
        .eval(
            &RELEASE,
            &run.release_keys(),
            &run.release_args(),
            TIMEOUT,
            None,
        )
        .await
        .map_err(|e| e.to_string())?;
    if reply.as_int() != Some(1) {
        return Err(format!("the release found the lock not ours: {reply:?}"));
    }
    Ok(())
}

async fn redis_crate(url: &str, run: &Run, protocol: redis::ProtocolVersion) -> Result<(), String> {
    use redis::IntoConnectionInfo;

    let info = url.into_connection_info().map_err(|e| e.to_string())?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(protocol)
        .set_skip_set_lib_name();
    let client =
        redis::Client::open(info.set_redis_settings(settings)).map_err(|e| e.to_string())?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    let mut con = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;

    // Script::new hashes the source (the own client has the SHA1s written out); invoke_async
    // sends EVALSHA and, on NOSCRIPT, SCRIPT LOAD and EVALSHA again.
    let acquire = redis::Script::new(ACQUIRE.source);
    let mut invocation = acquire.prepare_invoke();
    for key in run.acquire_keys() {
        invocation.key(key);
    }
    for arg in run.acquire_args() {
        invocation.arg(arg);
    }
    let reply: Vec<redis::Value> = invocation
        .invoke_async(&mut con)
        .await
        .map_err(|e| format!("the acquire failed: {e}"))?;
    let granted = matches!(
        reply.as_slice(),
        [redis::Value::Int(1), redis::Value::Int(_)]
    );
    if !granted {
        return Err(format!("the acquire was not granted: {reply:?}"));
    }
    run_true()?;
    let release = redis::Script::new(RELEASE.source);
    let mut invocation = release.prepare_invoke();
    for key in run.release_keys() {
        invocation.key(key);
    }
    for arg in run.release_args() {
        invocation.arg(arg);
    }
    let released: i64 = invocation
        .invoke_async(&mut con)
        .await
        .map_err(|e| format!("the release failed: {e}"))?;
    if released != 1 {
        return Err(format!("the release found the lock not ours: {released}"));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, url, name] = args.as_slice() else {
        eprintln!("usage: client_cost own|redis-crate|redis-crate-resp3 redis://HOST:PORT NAME");
        return ExitCode::from(2);
    };
    // locked-run's runtime (src/open.rs).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("client_cost: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let run = Run::new(name)?;
        match mode.as_str() {
            "own" => own(url, &run).await,
            "redis-crate" => redis_crate(url, &run, redis::ProtocolVersion::RESP2).await,
            "redis-crate-resp3" => redis_crate(url, &run, redis::ProtocolVersion::RESP3).await,
            other => Err(format!("unknown mode {other:?}")),
        }
    });
    if std::env::var_os("CLIENT_COST_VMHWM").is_some() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        if let Some(line) = status.lines().find(|l| l.starts_with("VmHWM:")) {
            eprintln!("{line}");
        }
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("client_cost {mode}: {e}");
            ExitCode::FAILURE
        }
    }
}
