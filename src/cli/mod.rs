//! The command line: clap definitions (their doc comments are the help text), value parsers,
//! and the checks that turn arguments into a validated run configuration.
//!
//! The wrapped command is taken as `Vec<OsString>` after NAME (`--` optional), so its own flags
//! never reach clap.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use nix::sys::signal::Signal;

use crate::lease::Timings;
use crate::name::{LockName, RESERVED};
use crate::plumbing::exit::{Codes, Failure};
use crate::plumbing::log;
use crate::session::config::{Patience, RunConfig};

pub mod app;
mod conn;
mod placement;
mod subcommands;
mod values;

pub use conn::ConnArgs;
pub use placement::shared_options_after_subcommand;
pub use subcommands::{DoctorArgs, HistoryArgs, ReleaseArgs, StatusArgs};
pub use values::parse_duration;

/// The most holders `--holders` allows (each is a lease of its own, and a `file://` waiter
/// watches every slot).
pub const MAX_HOLDERS: u32 = 1000;

/// The exit statuses, as `-h` shows them.
macro_rules! exit_status {
    () => {
        "Exit status: the command's own; 128+N if it was ended by signal N; 75 \
not acquired (busy with --no-wait, or --wait ran out); 76 the lease was lost and the command \
stopped (or never started); 124 --max-run ran out; 69 the backend unreachable or refusing; 2 usage error; 126/127 command \
not executable/not found."
    };
}

/// Where locked-run's own options end and the command's begin, as `-h` says it.
macro_rules! options_rule {
    () => {
        "Where options go: every option before the command is locked-run's own, before NAME or \
between NAME and the command (`locked-run job -n -- x` is run with -n); an unknown one there is a \
usage error (2), never the start of the command. From the command's first word on, everything is the \
command's (`locked-run job ls -l`); write `--` before a command that starts with '-'."
    };
}

/// `status`'s exit statuses and JSON fields, as its `-h` shows them.
macro_rules! history_help {
    () => {
        "Exit status: 0 when NAME has a history; 1 when it has none (never taken, or its history \
expired after 30 days untouched); 69 the backend could not be reached or refused; 2 usage error.

--json prints an array, newest first, of objects: host, pid, user, fence, mode, started_at and \
ended_at (RFC 3339, UTC), waited_ms, status (the exit status locked-run returned), ended (exit, \
signal, lost or max-run) and signal (with ended = signal).

Examples:
  locked-run history nightly-backup              the last 20 runs, one a line
  locked-run history --limit 100 --json report   every run kept, as JSON"
    };
}

macro_rules! status_help {
    () => {
        "Exit status: 0 held; 1 free; 69 the backend could not be reached or refused; 2 usage \
error.

--json prints one object: name, held (bool), fence (the last fence issued, or null), ttl_ms \
(null when free; -1 for no expiry), holder (null when free, else {host, pid, command, since}), \
holders (every holder: host, pid, command, since, fence, ttl_ms, token), limit (the N of \
--holders N while held, else null), mode (\"shared\" or \"exclusive\", null when free), waiters \
(how many wait, or null), last_run (the last run in its history, as `history --json` prints it, or \
null); with several URLs (Redlock) also quorum and servers (each with url \
and the same fields, or error)."
    };
}

/// What `--help` (and so the man page) ends with, as flock(1)'s does.
macro_rules! examples {
    () => {
        "Examples:
  # cron: every 5 minutes on every host, at most one runs, the others skip silently
  # (cron's PATH is /usr/bin:/bin: name a locked-run installed elsewhere by its full path;
  # `locked-run doctor` says whether cron finds this one)
  */5 * * * * locked-run -n sync-inventory -- /usr/local/bin/sync-inventory

  # wait up to 20 minutes for the previous deploy, then deploy (75 if it never came free)
  locked-run -w 20m deploy-production -- ./deploy.sh

  # one host, no server: the lock is a flock in a directory
  locked-run -u file:///var/lib/locked-run -n rotate-logs -- /usr/local/bin/rotate-logs

  # Redlock over three independent servers
  locked-run -u redis://a:6379 -u redis://b:6379 -u redis://c:6379 nightly -- ./nightly.sh

  # who holds it, since when, its fence and time left (exit 0 held, 1 free)
  locked-run -u redis://redis.internal:6379 status nightly"
    };
}

/// Run a command under a distributed lock held in Redis: across a fleet, at most one copy of a
/// job runs at a time.
///
/// The command gets LOCKED_RUN_FENCE, a number that grows with every acquisition of NAME: pass it
/// to the storage the job writes to, so a stale holder's writes can be refused.
#[derive(Parser, Debug)]
#[command(
    name = "locked-run",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    override_usage = "locked-run [OPTIONS] <NAME> [--] <COMMAND> [ARGS]...\n       locked-run status [OPTIONS] <NAME>\n       locked-run release [--force] [OPTIONS] <NAME>\n       locked-run doctor [OPTIONS]\n       locked-run run [OPTIONS] <NAME> [--] <COMMAND> [ARGS]...",
    after_help = concat!(exit_status!(), "\n\n", options_rule!()),
    after_long_help = concat!(exit_status!(), "\n\n", options_rule!(), "\n\n", examples!())
)]
pub struct Cli {
    #[command(subcommand)]
    pub sub: Option<Sub>,

    #[command(flatten)]
    pub run: RunArgs,

    /// The connection options, before or after a subcommand alike (global).
    #[command(flatten)]
    pub conn: ConnArgs,

    /// The logging options, before or after a subcommand alike (global).
    #[command(flatten)]
    pub log: LogArgs,
}

#[derive(Subcommand, Debug)]
pub enum Sub {
    /// Run a command under the lock (the default; needed when NAME is a subcommand's name)
    #[command(after_help = concat!(exit_status!(), "\n\n", options_rule!()))]
    Run(RunArgs),
    /// Show whether a lock is held, by whom, since when, its fence and time left (exit 0 held, 1 free)
    #[command(after_help = status_help!())]
    Status(StatusArgs),
    /// Release a stuck lock, whoever holds it (with --force; exit 0 released, 1 was free)
    #[command(
        after_help = "Exit status: 0 released; 1 the lock was free (nothing to release); 2 held \
and --force not given (nothing was released), a file:// lock whose holder still runs, or a \
usage error; 69 the backend could not be reached or refused."
    )]
    Release(ReleaseArgs),
    /// Check the setup the URLs name (what is checked of each backend is the registry's)
    #[command(
        about = crate::registry::doctor_help(),
        after_help = "Exit status: 0 when no check FAILs (WARN lines allowed); 1 when any check \
FAILs (an unreachable server is a FAIL); 2 usage error."
    )]
    Doctor(DoctorArgs),
    /// Show the lock's past runs, newest first: host, pid, user, fence, when, how long it
    /// waited, how it ended (exit 1 when NAME has no history)
    #[command(after_help = history_help!())]
    History(HistoryArgs),
}

#[derive(Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// More logging on stderr (-v: what happens, -vv: debug); LOCKED_RUN_LOG takes a tracing filter
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Only errors on stderr (no warnings)
    #[arg(short = 'q', long = "quiet", conflicts_with = "verbose", global = true)]
    pub quiet: bool,

    /// Log lines on stderr as text, or as one JSON object each (for log shippers: every
    /// milestone of the run, with its figures)
    #[arg(
        long,
        value_name = "FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,
}

/// How log lines are written, as `--log-format` names it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogArgs {
    /// What these options ask of the log.
    pub fn logging(&self) -> log::Logging {
        log::Logging {
            verbose: self.verbose,
            quiet: self.quiet,
            format: match self.log_format {
                LogFormat::Text => log::LogFormat::Text,
                LogFormat::Json => log::LogFormat::Json,
            },
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The connection options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// Lease length T: how long the lock outlives a locked-run that stops renewing it
    #[arg(long, value_name = "DUR", env = "LOCKED_RUN_TTL", hide_env_values = true, default_value = "30s", allow_hyphen_values = true, value_parser = values::parse_ttl)]
    pub ttl: Duration,

    /// Renew interval R [default: TTL/6]
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = values::parse_renew_every)]
    pub renew_every: Option<Duration>,

    /// Fail at once (status 75) when the lock is held; silent unless -v
    #[arg(short = 'n', long, conflicts_with = "wait")]
    pub no_wait: bool,

    /// Give up waiting after DUR (status 75) [default: wait forever]
    #[arg(short = 'w', long, value_name = "DUR", allow_hyphen_values = true, value_parser = parse_duration)]
    pub wait: Option<Duration>,

    /// Grace K between the kill signal and SIGKILL when the lease is lost [default: TTL/3]
    #[arg(short = 'k', long, value_name = "DUR", allow_hyphen_values = true, value_parser = parse_duration)]
    pub kill_after: Option<Duration>,

    /// First signal sent to the command when the lease is lost (TERM, SIGTERM and 15 all work)
    #[arg(short = 's', long, value_name = "SIG", default_value = "TERM", value_parser = values::SignalParser, hide_possible_values = true)]
    pub kill_signal: Signal,

    /// Exit status when the lock was not acquired
    #[arg(short = 'E', long, value_name = "N", allow_negative_numbers = true, default_value_t = crate::plumbing::exit::CONFLICT)]
    pub conflict_exit_code: u8,

    /// Exit status when the lease was lost and the command stopped
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = crate::plumbing::exit::LOST)]
    pub lost_exit_code: u8,

    /// Redlock (several URLs): how long each server may take to answer an acquire
    /// [default: TTL/100, at least 5ms]
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = values::parse_positive_duration)]
    pub node_timeout: Option<Duration>,

    /// After taking the lock, require N replicas of the server to acknowledge it (WAIT), or
    /// release it and exit 69: a failover then cannot promote a replica that never saw it
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub wait_replicas: Option<u32>,

    /// How long --wait-replicas waits for the acknowledgements
    #[arg(long, value_name = "DUR", default_value = "1s", allow_hyphen_values = true, value_parser = parse_duration, requires = "wait_replicas")]
    pub wait_replicas_timeout: Duration,

    /// Keep the lock at least DUR after it was taken, even if the command ends sooner
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = parse_duration)]
    pub min_hold: Option<Duration>,

    /// Let up to N runs hold the lock at once (a semaphore); every run of NAME must use the same N
    ///
    /// No environment variable sets it: the command gets LOCKED_RUN_HOLDERS to read, and a
    /// locked-run that the command starts must not take the outer run's N as its own.
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        default_value_t = 1
    )]
    pub holders: u32,

    /// Hold the lock in shared mode, as `flock -s`: any number of --shared runs at once, never
    /// beside a run without it (the command gets LOCKED_RUN_SHARED=1)
    ///
    /// Waiters of both modes are served in arrival order, on every backend: the --shared ones at
    /// the head of the queue together, and a --shared newcomer never passes a waiter without
    /// --shared (on file://, only `flock -s`, which knows no queue, may).
    #[arg(long)]
    pub shared: bool,

    /// Stop the command once it has run DUR (kill signal, SIGKILL --kill-after later; status 124)
    #[arg(long, value_name = "DUR", allow_hyphen_values = true, value_parser = values::parse_positive_duration)]
    pub max_run: Option<Duration>,

    /// Race the other --no-fair waiters at each release instead of taking turns in arrival order
    /// (never served before a fair waiter that came first)
    #[arg(long)]
    pub no_fair: bool,

    /// Write this run's Prometheus metrics to DIR/locked_run_NAME.prom (node_exporter's
    /// textfile collector) at its end, skips and failures included
    #[arg(long, value_name = "DIR", env = "LOCKED_RUN_METRICS_DIR")]
    pub metrics_dir: Option<std::path::PathBuf>,

    /// Ping a monitor (healthchecks.io protocol): URL/start when the command starts, URL on
    /// status 0, URL/N on status N, nothing when skipped (75)
    #[arg(long, value_name = "URL")]
    pub ping: Option<String>,

    /// The logging options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub log: LogArgs,

    /// Lock name: at most 200 bytes, no braces, whitespace or control characters
    #[arg(value_name = "NAME", required = true)]
    pub name: Option<String>,

    /// The command to run, and its arguments: everything from the command's first word on is
    /// the command's; before it, every option is locked-run's (an unknown one is an error)
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        num_args = 1..
    )]
    pub command: Vec<OsString>,
}

/// What the command line asks for.
pub enum Command {
    /// `explicit`: written as `locked-run run ...`, so NAME may be a subcommand's name.
    Run {
        args: RunArgs,
        explicit: bool,
    },
    Status(StatusArgs),
    Release(ReleaseArgs),
    Doctor(DoctorArgs),
    History(HistoryArgs),
}

impl Cli {
    /// What to do, with the shared options (given before or after the subcommand) in it.
    pub fn into_command(self) -> Command {
        let (conn, log) = (self.conn, self.log);
        match self.sub {
            Some(Sub::Run(args)) => Command::Run {
                args: RunArgs { conn, log, ..args },
                explicit: true,
            },
            Some(Sub::Status(args)) => Command::Status(StatusArgs { conn, log, ..args }),
            Some(Sub::Release(args)) => Command::Release(ReleaseArgs { conn, log, ..args }),
            Some(Sub::Doctor(args)) => Command::Doctor(DoctorArgs { conn, log, ..args }),
            Some(Sub::History(args)) => Command::History(HistoryArgs { conn, log, ..args }),
            None => Command::Run {
                args: RunArgs {
                    conn,
                    log,
                    ..self.run
                },
                explicit: false,
            },
        }
    }
}

impl RunArgs {
    /// Redlock's per-server timeout: `--node-timeout`, else T/100 but at least 5 ms.
    pub fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 100).max(Duration::from_millis(5)))
    }

    pub fn codes(&self) -> Codes {
        Codes {
            conflict: self.conflict_exit_code,
            lost: self.lost_exit_code,
        }
    }

    /// Validates everything that can be checked without a server.
    pub fn config(&self, explicit_run: bool) -> Result<RunConfig, Failure> {
        let raw = self.name.as_deref().unwrap_or_default();
        if !explicit_run && RESERVED.contains(&raw) {
            return Err(Failure::usage(format!(
                "{raw:?} is a subcommand's name, and the options before it are a run's: write them \
                 after it if they are its own (`locked-run {raw} [OPTIONS] NAME`; the connection \
                 and logging options may come before or after), or write `locked-run run {raw} -- \
                 COMMAND` to use it as a lock NAME"
            )));
        }
        if self.holders == 0 || self.holders > MAX_HOLDERS {
            return Err(Failure::usage(format!(
                "--holders {} is out of range: 1 (one holder, the default) to {MAX_HOLDERS}",
                self.holders
            )));
        }
        if self.shared && self.holders > 1 {
            return Err(Failure::usage(format!(
                "--shared and --holders {} do not go together: --shared admits any number of \
                 shared runs, --holders N up to N of one kind",
                self.holders
            )));
        }
        if self.shared && self.no_fair {
            return Err(Failure::usage(
                "--shared and --no-fair do not go together: shared runs wait in arrival order \
                 with every other waiter, so that readers cannot starve a writer",
            ));
        }
        let name = LockName::new(raw).map_err(Failure::usage)?;
        let status_command = self.conn.endpoints().pasteable("status", name.as_str());
        if self.command.is_empty() {
            return Err(Failure::usage("no COMMAND given after NAME"));
        }
        let timings =
            Timings::new(self.ttl, self.renew_every, self.kill_after).map_err(Failure::usage)?;
        let patience = match (self.no_wait, self.wait) {
            (true, _) => Patience::NoWait,
            (false, Some(d)) if d.is_zero() => Patience::NoWait,
            (false, Some(d)) => Patience::For(d),
            (false, None) => Patience::Forever,
        };
        Ok(RunConfig {
            name,
            command: self.command.clone(),
            timings,
            patience,
            kill_signal: self.kill_signal,
            min_hold: self.min_hold.filter(|d| !d.is_zero()),
            holders: self.holders,
            shared: self.shared,
            max_run: self.max_run,
            fair: !self.no_fair,
            status_command,
            release_timeout: self.conn.connect_timeout.min(timings.ttl),
            codes: self.codes(),
            metrics_dir: self.metrics_dir.clone(),
            ping: self.ping.clone(),
        })
    }
}

/// Turns a clap error into one line (`locked-run: ...`), as every other error.
pub fn one_line(error: &clap::Error) -> String {
    if let Some(option) = unknown_option(error) {
        // Every word before the command that looks like an option is taken as locked-run's
        // own: an unknown one is a typo, never the start of the command (`job -x -- true`
        // would otherwise run `-x`, or read `-n` as locked-run's where `-x` is the command's).
        return crate::text::message!(
            "unknown option {option}: an option before the command is locked-run's own (the \
             command's own options come after its first word; write `-- {option} ...` if the \
             command starts with it) (see locked-run --help)"
        );
    }
    let text = error.to_string();
    let mut parts = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if !line.is_empty() {
            parts.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    let mut message = parts.join(" ");
    message.push_str(" (see locked-run --help)");
    message
}

/// The option a clap error says is unknown (`-x`, `--no-such`), not a stray word.
fn unknown_option(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) if arg.starts_with('-') => Some(arg.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
