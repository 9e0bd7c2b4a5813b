//! `locked-run`: run a command under a distributed lease held in Redis, so that across a fleet
//! at most one copy of a job runs at a time.
//!
//! # Layout
//!
//! - [`cli`]: the command line (clap), value parsers, validation into a [`run::RunConfig`].
//! - [`name`]: lock names and the Redis keys derived from them.
//! - [`lease`]: the lease clock, a pure state machine, and the loop that keeps the lease.
//! - [`backend`]: the interface every backend implements (acquire, renew, release, wake-ups).
//! - [`scripts`]: the Lua scripts of the protocol.
//! - [`resp`]: a small RESP2 client (one connection, one request at a time).
//! - [`node`]: one Redis server: URL, connection, script calls, subscriptions, error messages.
//! - [`tls`]: TLS for `rediss://` (rustls).
//! - [`lock`]: the single-server backend ([`lock::ServerLock`]).
//! - [`library`]: the lock as a Rust type ([`Lock`]).
//! - [`redlock`]: Redlock over several servers, with monotonic fencing tokens.
//! - [`file`]: the host-local backend (`file:///DIR`): `flock(2)` and a durable fence counter.
//! - [`wait`]: waiting for a held lock without polling.
//! - [`child`]: finding, spawning, signalling and reaping the command.
//! - [`signals`]: the signals forwarded to the command or ending a wait.
//! - [`watcher`]: kills the job's process group should `locked-run` itself be SIGKILLed.
//! - [`run`]: the run loop tying these together.
//! - [`status`]: the `status` subcommand.
//! - [`release`]: the `release` subcommand (freeing a stuck lock).
//! - [`doctor`]: the `doctor` subcommand (checking the Redis setup).
//! - [`notify`]: `sd_notify` status and readiness for systemd units.
//! - [`exit`]: exit statuses, mapped to numbers in one place.
//! - [`log`]: stderr logging.

pub mod backend;
pub mod child;
pub mod cli;
pub mod doctor;
pub mod exit;
pub mod file;
pub mod lease;
pub mod library;
pub mod lock;
pub mod log;
pub mod name;
pub mod node;
pub mod notify;
pub mod redlock;
pub mod release;
pub mod resp;
pub mod run;
pub mod scripts;
pub mod signals;
pub mod status;
pub mod tls;
pub mod wait;
pub mod watcher;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

pub use crate::library::Lock;
use crate::lock::ServerLock;
pub use crate::redlock::Redlock;

use crate::cli::{Cli, Command, ConnArgs};
use crate::exit::{Codes, Exit, Failure};
use crate::lease::show;
use crate::name::LockName;
use crate::node::Node;

/// How a `locked-run` invocation ended, before it is turned into a process exit.
pub struct Outcome {
    pub result: Result<Exit, Failure>,
    pub codes: Codes,
    pub verbose: bool,
}

/// Runs what the command line asks for.
pub fn execute(cli: Cli) -> Outcome {
    match cli.into_command() {
        Command::Run { args, explicit } => run_command(args, explicit),
        Command::Release(args) => {
            let force = args.force;
            inspecting(
                &args.log,
                &args.conn,
                &args.name,
                "release",
                async |backend| match backend {
                    Opened::One(lock) => release::release(&lock, force).await,
                    Opened::Many(redlock) => release::release_redlock(&redlock, force).await,
                    Opened::File(url, name) => release::release_file(&url, &name, force),
                },
            )
        }
        Command::Status(args) => {
            let json = args.json;
            inspecting(
                &args.log,
                &args.conn,
                &args.name,
                "status",
                async |backend| match backend {
                    Opened::One(lock) => status::status(&lock, json).await,
                    Opened::Many(redlock) => status::status_redlock(&redlock, json).await,
                    Opened::File(url, name) => status::status_file(&url, &name, json),
                },
            )
        }
        Command::Doctor(args) => {
            log::init(&args.log);
            Outcome {
                result: doctor::doctor(&args),
                codes: Codes::default(),
                verbose: args.log.verbose > 0,
            }
        }
    }
}

/// `status` and `release`: looks at (or frees) the lock in the backend the URLs name.
fn inspecting(
    log: &cli::LogArgs,
    conn: &ConnArgs,
    name: &str,
    what: &str,
    act: impl AsyncFnOnce(Opened) -> Result<Exit, Failure>,
) -> Outcome {
    log::init(log);
    let result = open_backend(conn, name, what, conn.connect_timeout)
        .and_then(|backend| runtime()?.block_on(act(backend)));
    Outcome {
        result,
        codes: Codes::default(),
        verbose: log.verbose > 0,
    }
}

fn run_command(args: cli::RunArgs, explicit: bool) -> Outcome {
    log::init(&args.log);
    let verbose = args.log.verbose > 0;
    let result = args.config(explicit).and_then(|cfg| {
        let t = cfg.timings;
        if t.retry_window() < t.renew_every {
            tracing::info!(
                "a failed renewal can be retried for only {} before the kill signal (T - 2D - K - R), \
                 less than one renew interval ({})",
                show(t.retry_window()),
                show(t.renew_every)
            );
        }
        let program = Path::new(&cfg.command[0])
            .file_name()
            .map_or_else(|| cfg.command[0].to_string_lossy(), |n| n.to_string_lossy())
            .into_owned();
        let node_timeout = args.node_timeout(t.ttl);
        let opened = open_backend(&args.conn, cfg.name.as_str(), &program, node_timeout)?;
        if args.wait_replicas.is_some() {
            match opened {
                Opened::One(_) => {}
                Opened::Many(_) => return Err(Failure::usage(
                    "--wait-replicas is for one primary with replicas; Redlock's servers are independent primaries",
                )),
                Opened::File(..) => return Err(Failure::usage(
                    "--wait-replicas is for a Redis primary with replicas, not for file://",
                )),
            }
        }
        // 126/127 before anything is taken or created.
        log::set_lock(cfg.name.as_str());
        let path = child::resolve(&cfg.command[0])?;
        match opened {
            Opened::One(lock) => {
                let lock = match args.wait_replicas.filter(|&n| n > 0) {
                    Some(n) => lock.with_wait_replicas(n, args.wait_replicas_timeout),
                    None => *lock,
                };
                runtime()?.block_on(run::run(&lock, &cfg, &path))
            }
            Opened::Many(redlock) => runtime()?.block_on(run::run(&redlock, &cfg, &path)),
            Opened::File(url, name) => {
                let lock = file::FileLock::open(&url, name, &program)?;
                runtime()?.block_on(run::run(&lock, &cfg, &path))
            }
        }
    });
    Outcome {
        result,
        codes: args.codes(),
        verbose,
    }
}

/// The backend the URLs name: one server, Redlock over several, or a directory of this host
/// (its URL and the NAME: a run opens the lock file, `status` only looks).
enum Opened {
    One(Box<ServerLock>),
    Many(Redlock),
    File(String, LockName),
}

fn open_backend(
    conn: &ConnArgs,
    name: &str,
    command: &str,
    node_timeout: Duration,
) -> Result<Opened, Failure> {
    let name = LockName::new(name).map_err(Failure::usage)?;
    let nodes = match open_servers(conn)? {
        Servers::Dir(url) => return Ok(Opened::File(url, name)),
        Servers::Redis(nodes) => nodes,
    };
    if nodes.len() == 1 {
        let node = nodes.into_iter().next().expect("one node");
        return Ok(Opened::One(Box::new(ServerLock::on(node, name, command))));
    }
    for (i, node) in nodes.iter().enumerate() {
        if let Some(same) = nodes[..i].iter().find(|other| other.same_server(node)) {
            return Err(Failure::usage(format!(
                "{} is given twice (as {}): the same server counted twice would fake a Redlock quorum",
                node.address(),
                same.address()
            )));
        }
    }
    if nodes.len() < 3 {
        return Err(Failure::usage(format!(
            "{} Redis URLs given: Redlock needs at least 3 independent servers (a quorum of 2 out of 2 \
             survives no failure); give one URL for a single server, or 3 or more",
            nodes.len()
        )));
    }
    if nodes.len() % 2 == 0 {
        tracing::info!(
            "{} servers: a quorum is {}, so only {} may fail, no more than with {}",
            nodes.len(),
            nodes.len() / 2 + 1,
            nodes.len() / 2 - 1,
            nodes.len() - 1
        );
    }
    let locks = nodes
        .into_iter()
        .map(|node| ServerLock::on(node, name.clone(), command))
        .collect();
    Ok(Opened::Many(Redlock::new(locks, node_timeout)))
}

/// What the URLs name: a directory of this host (its `file://` URL), or Redis servers.
pub(crate) enum Servers {
    Dir(String),
    Redis(Vec<Node>),
}

/// Checks the URLs and the connection options together, and opens what they name (nothing is
/// connected yet): for a run, `status`, `release` and `doctor` alike.
pub(crate) fn open_servers(conn: &ConnArgs) -> Result<Servers, Failure> {
    let urls = conn.urls();
    let options = conn.tls();
    let rediss = urls.iter().any(|url| url.starts_with("rediss://"));
    if !rediss && (options.ca_cert.is_some() || options.cert.is_some() || options.key.is_some()) {
        // Ignoring them would leave a connection believed encrypted in plain text.
        return Err(Failure::usage(
            "--tls-ca-cert, --tls-cert and --tls-key are for rediss:// URLs, and none is given \
             (redis+sentinel:// and redis+cluster:// connect without TLS)",
        ));
    }
    if urls.iter().any(|url| file::is_file_url(url)) {
        if urls.len() > 1 {
            return Err(Failure::usage(
                "file:// keeps locks on this host only: it cannot be combined with other URLs \
                 (give one file:// URL, or only Redis URLs)",
            ));
        }
        file::dir_of(&urls[0]).map_err(Failure::usage)?;
        return Ok(Servers::Dir(urls[0].clone()));
    }
    let password = conn.default_password()?;
    conn.warn_about_visible_passwords();
    // Certificates are read (and the system's CAs loaded) once, not once per server.
    let tls = match rediss {
        true => Some(tls::connector(&options).map_err(Failure::usage)?),
        false => None,
    };
    let nodes = urls
        .iter()
        .map(|url| {
            Node::open_with(url, conn.connect_timeout, password.as_deref(), tls.as_ref())
                .map_err(Failure::usage)
        })
        .collect::<Result<Vec<Node>, Failure>>()?;
    Ok(Servers::Redis(nodes))
}

/// A single-threaded runtime: the child is forked from the main thread, which PDEATHSIG needs.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::unavailable(format!("cannot start the runtime: {e}")))
}

impl Outcome {
    /// Prints the one line a failure owes the user and turns the outcome into the process's
    /// exit. A command killed by signal N makes `locked-run` end itself with N.
    pub fn finish(self) -> ExitCode {
        log::report_dropped();
        match self.result {
            Ok(Exit::ChildSignal(sig)) => die_by_signal(sig, self.codes),
            Ok(exit) => ExitCode::from(exit.code(self.codes)),
            Err(failure) => {
                let status = failure.exit.code(self.codes);
                if !failure.quiet || self.verbose {
                    eprintln!("{}", log::failure_line(&failure.message, status));
                }
                ExitCode::from(status)
            }
        }
    }
}

/// Ends the process with `sig`, core dumps off (as coreutils `timeout` does), so a shell loop
/// stops on Ctrl-C and systemd sees what it would have seen without the wrapper.
fn die_by_signal(sig: i32, codes: Codes) -> ExitCode {
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on this process; nothing else runs now (the runtime is gone).
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    // Still alive: the signal's default action is not to terminate.
    ExitCode::from(Exit::ChildSignal(sig).code(codes))
}
