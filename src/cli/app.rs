//! What the command line asks for, carried out: a run, or an operators' subcommand; and how
//! it ends, turned into the process's exit (a command killed by signal N ends `locked-run`
//! with N).

use std::path::Path;

use crate::backend::Opening;
use crate::backend::View;
use crate::backend::{Ended, Run};
use crate::cli::{Cli, Command, ConnArgs};
use crate::name::LockName;
use crate::observe::metrics;
use crate::observe::ping::Pinger;
use crate::open::{look, open, runtime};
use crate::plumbing::exit::{Codes, Exit, Failure};
use crate::plumbing::log;
use crate::session::config::RunConfig;
use crate::subcommands::{doctor, history, release, status};
use crate::text::show;
use crate::{child, cli, session};

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
            let (force, token) = (args.force, args.token.clone());
            inspecting(
                &args.log,
                &args.conn,
                &args.name,
                "release",
                async |b, name| release::release(b, name, force, token.as_deref()).await,
            )
        }
        Command::Status(args) => {
            let json = args.json;
            inspecting(
                &args.log,
                &args.conn,
                &args.name,
                "status",
                async |b, name| status::status(b, name, json).await,
            )
        }
        Command::History(args) => {
            let (json, limit) = (args.json, usize::from(args.limit));
            inspecting(
                &args.log,
                &args.conn,
                &args.name,
                "history",
                async |b, name| history::history(b, name, limit, json).await,
            )
        }
        Command::Doctor(args) => {
            log::init(&args.log.logging());
            Outcome {
                result: doctor::doctor(&args.conn.endpoints(), &args.name, args.json),
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
    act: impl AsyncFnOnce(&dyn View, &LockName) -> Result<Exit, Failure>,
) -> Outcome {
    log::init(&log.logging());
    let endpoints = conn.endpoints();
    let result = LockName::new(name)
        .map_err(Failure::usage)
        .and_then(|name| {
            let view = look(&endpoints, &name, &Opening::to_look(&endpoints, what))?;
            runtime()?.block_on(act(view.as_ref(), &name))
        });
    Outcome {
        result,
        codes: Codes::default(),
        verbose: log.verbose > 0,
    }
}

fn run_command(args: cli::RunArgs, explicit: bool) -> Outcome {
    log::init(&args.log.logging());
    let verbose = args.log.verbose > 0;
    let codes = args.codes();
    let result = args.config(explicit).and_then(|cfg| {
        let pinger = cfg
            .ping
            .as_deref()
            .map(Pinger::new)
            .transpose()
            .map_err(Failure::usage)?;
        let (result, run, token) = run_locked(&args, &cfg, pinger.as_ref());
        observe(&cfg, codes, &result, run.as_ref(), pinger, token.as_deref());
        result
    });
    Outcome {
        result,
        codes,
        verbose,
    }
}

/// After the run and its release: the metrics file and the monitor's end ping, neither of which
/// may change the status.
fn observe(
    cfg: &RunConfig,
    codes: Codes,
    result: &Result<Exit, Failure>,
    run: Option<&Run>,
    pinger: Option<Pinger>,
    token: Option<&str>,
) {
    let exit = match result {
        Ok(exit) => *exit,
        Err(failure) => failure.exit,
    };
    if let Some(dir) = &cfg.metrics_dir {
        let outcome = match (run.map(|r| r.ended), exit) {
            (Some(Ended::Lost), _) => metrics::Outcome::Lost,
            (Some(Ended::MaxRun), _) => metrics::Outcome::MaxRun,
            (Some(_), _) => metrics::Outcome::Ran,
            (None, Exit::Conflict) => metrics::Outcome::Skipped,
            (None, Exit::Unavailable) => metrics::Outcome::Unreachable,
            (None, _) => metrics::Outcome::Failed,
        };
        metrics::write(dir, &cfg.name, outcome, run);
    }
    // A skip pings nothing: another host has the job.
    if let (Some(pinger), false) = (pinger, exit == Exit::Conflict) {
        pinger.end(exit.code(codes), token.unwrap_or("-"));
    }
}

/// Opens the lock, finds the command and runs it: how it ended, its record when it took the
/// lock, and its token once the lock was opened.
fn run_locked(
    args: &cli::RunArgs,
    cfg: &RunConfig,
    pinger: Option<&Pinger>,
) -> (Result<Exit, Failure>, Option<Run>, Option<String>) {
    let opened = (|| {
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
        // The backend refuses what it cannot give (2) before the command is looked for.
        let how = Opening {
            command: &program,
            node_timeout: args.node_timeout(t.ttl),
            wait_replicas: args
                .wait_replicas
                .filter(|&n| n > 0)
                .map(|n| (n, args.wait_replicas_timeout)),
            lenient: false,
        };
        let backend = open(&args.conn.endpoints(), &cfg.spec(), &how)?;
        // 126/127 before anything is taken or created.
        log::set_lock(cfg.name.as_str());
        let path = child::resolve(&cfg.command[0])?;
        Ok((backend, path, runtime()?))
    })();
    let (backend, path, runtime) = match opened {
        Ok(opened) => opened,
        Err(failure) => return (Err(failure), None, None),
    };
    let token = backend.token();
    let started = |token: &str| {
        if let Some(pinger) = pinger {
            pinger.start(token);
        }
    };
    let (result, run) = runtime.block_on(session::run(backend.as_ref(), cfg, &path, &started));
    let token = run.as_ref().map_or(token, |r| r.token.clone());
    (result, run, Some(token))
}

impl Outcome {
    /// Prints the one line a failure owes the user and turns the outcome into the process's
    /// exit. A command killed by signal N makes `locked-run` end itself with N.
    pub fn finish(self) -> u8 {
        log::report_dropped();
        match self.result {
            Ok(Exit::ChildSignal(sig)) => die_by_signal(sig, self.codes),
            Ok(exit) => exit.code(self.codes),
            Err(failure) => {
                let status = failure.exit.code(self.codes);
                if !failure.quiet || self.verbose {
                    log::write_last(&log::failure_line(&failure.message, status));
                }
                status
            }
        }
    }
}

/// Ends the process with `sig`, core dumps off (as coreutils `timeout` does), so a shell loop
/// stops on Ctrl-C and systemd sees what it would have seen without the wrapper.
fn die_by_signal(sig: i32, codes: Codes) -> u8 {
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
    Exit::ChildSignal(sig).code(codes)
}
