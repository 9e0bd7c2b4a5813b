//! The command line: clap definitions (their doc comments are the help text), value parsers,
//! and the checks that turn arguments into a validated run configuration.
//!
//! The wrapped command is taken as `Vec<OsString>` after NAME (`--` optional), so its own flags
//! never reach clap.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use nix::sys::signal::Signal;

use crate::exit::{Codes, Failure};
use crate::lease::Timings;
use crate::name::{LockName, RESERVED};
use crate::run::RunConfig;
use crate::wait::Patience;

/// The most holders `--holders` allows (each is a lease of its own, and a `file://` waiter
/// watches every slot).
pub const MAX_HOLDERS: u32 = 1000;

/// The default server when neither `--url` nor `LOCKED_RUN_URL` gives one.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The exit statuses, as `-h` shows them.
macro_rules! exit_status {
    () => {
        "Exit status: the command's own; 128+N if it was ended by signal N; 75 \
not acquired (busy with --no-wait, or --wait ran out); 76 the lease was lost and the command \
stopped; 124 --max-run ran out; 69 Redis unreachable or refusing; 2 usage error; 126/127 command \
not executable/not found."
    };
}

/// What `--help` (and so the man page) ends with, as flock(1)'s does.
macro_rules! examples {
    () => {
        "Examples:
  # cron: every 5 minutes on every host, at most one runs, the others skip silently
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
    after_help = exit_status!(),
    after_long_help = concat!(exit_status!(), "\n\n", examples!())
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
    Run(RunArgs),
    /// Show whether a lock is held, by whom, since when, its fence and time left (exit 0 held, 1 free)
    Status(StatusArgs),
    /// Release a stuck lock, whoever holds it (with --force; exit 0 released, 1 was free)
    Release(ReleaseArgs),
    /// Check the Redis setup: reachability, role, memory policy, persistence, permissions, clocks
    Doctor(DoctorArgs),
}

#[derive(Args, Debug, Clone, Default)]
pub struct ConnArgs {
    /// Redis server URL: redis://[user@]host[:port][/db], rediss:// (TLS), redis+unix:///path,
    /// redis+sentinel://host:port[,...]/MASTER, redis+cluster://host:port[,...]; three or more
    /// for Redlock; or file:///DIR for locks on this host only, with no server
    /// [env: LOCKED_RUN_URL] [default: redis://127.0.0.1:6379]. Give passwords through
    /// LOCKED_RUN_URL, --password-file or REDISCLI_AUTH, not on the command line, which `ps`
    /// shows.
    #[arg(short = 'u', long = "url", value_name = "URL", global = true)]
    pub url: Vec<String>,

    /// How long one connection attempt may take
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = parse_duration, global = true)]
    pub connect_timeout: Duration,

    /// Read the Redis password from FILE (its first line), for URLs that carry none
    #[arg(long, value_name = "FILE", global = true)]
    pub password_file: Option<std::path::PathBuf>,

    /// rediss://: trust the CA certificate(s) in this PEM file instead of the system's
    #[arg(long, value_name = "FILE", global = true)]
    pub tls_ca_cert: Option<std::path::PathBuf>,

    /// rediss://: a client certificate (PEM), for servers that ask for one
    #[arg(long, value_name = "FILE", requires = "tls_key", global = true)]
    pub tls_cert: Option<std::path::PathBuf>,

    /// rediss://: the client certificate's private key (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert", global = true)]
    pub tls_key: Option<std::path::PathBuf>,
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

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The connection options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// Lease length T: how long the lock outlives a locked-run that stops renewing it
    #[arg(long, value_name = "DUR", env = "LOCKED_RUN_TTL", hide_env_values = true, default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,

    /// Renew interval R [default: TTL/6]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub renew_every: Option<Duration>,

    /// Fail at once (status 75) when the lock is held; silent unless -v
    #[arg(short = 'n', long, conflicts_with = "wait")]
    pub no_wait: bool,

    /// Give up waiting after DUR (status 75) [default: wait forever]
    #[arg(short = 'w', long, value_name = "DUR", value_parser = parse_duration)]
    pub wait: Option<Duration>,

    /// Grace K between the kill signal and SIGKILL when the lease is lost [default: TTL/3]
    #[arg(short = 'k', long, value_name = "DUR", value_parser = parse_duration)]
    pub kill_after: Option<Duration>,

    /// First signal sent to the command when the lease is lost (TERM, SIGTERM and 15 all work)
    #[arg(short = 's', long, value_name = "SIG", default_value = "TERM", value_parser = parse_signal)]
    pub kill_signal: Signal,

    /// Exit status when the lock was not acquired
    #[arg(short = 'E', long, value_name = "N", default_value_t = crate::exit::CONFLICT)]
    pub conflict_exit_code: u8,

    /// Exit status when the lease was lost and the command stopped
    #[arg(long, value_name = "N", default_value_t = crate::exit::LOST)]
    pub lost_exit_code: u8,

    /// Redlock (several URLs): how long each server may take to answer an acquire
    /// [default: TTL/100, at least 5ms]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub node_timeout: Option<Duration>,

    /// After taking the lock, require N replicas of the server to acknowledge it (WAIT), or
    /// release it and exit 69: a failover then cannot promote a replica that never saw it
    #[arg(long, value_name = "N")]
    pub wait_replicas: Option<u32>,

    /// How long --wait-replicas waits for the acknowledgements
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = parse_duration, requires = "wait_replicas")]
    pub wait_replicas_timeout: Duration,

    /// Keep the lock at least DUR after it was taken, even if the command ends sooner
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub min_hold: Option<Duration>,

    /// Let up to N runs hold the lock at once (a semaphore); every run of NAME must use the same N
    #[arg(
        long,
        value_name = "N",
        env = "LOCKED_RUN_HOLDERS",
        hide_env_values = true,
        default_value_t = 1
    )]
    pub holders: u32,

    /// Stop the command once it has run DUR (kill signal, SIGKILL --kill-after later; status 124)
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub max_run: Option<Duration>,

    /// Waiters race at each release instead of being served in the order they arrived
    #[arg(long)]
    pub no_fair: bool,

    /// The logging options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub log: LogArgs,

    /// Lock name: at most 200 bytes, no braces, whitespace or control characters
    #[arg(value_name = "NAME", required = true)]
    pub name: Option<String>,

    /// The command to run, and its arguments
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 1..
    )]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// The connection options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// One JSON object: name, held, fence, ttl_ms, holder {host, pid, command, since}, waiters
    #[arg(long)]
    pub json: bool,

    /// The logging options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub log: LogArgs,

    /// Lock name
    #[arg(value_name = "NAME")]
    pub name: String,
}

#[derive(Args, Debug, Clone)]
pub struct ReleaseArgs {
    /// The connection options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// Really delete the lock (never its fence counter); without it, only show who holds it
    #[arg(long)]
    pub force: bool,

    /// With --force, of several holders (--holders), free only the one whose LOCKED_RUN_TOKEN
    /// this is (status shows each holder's token)
    #[arg(long, value_name = "TOKEN", requires = "force")]
    pub token: Option<String>,

    /// The logging options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub log: LogArgs,

    /// Lock name
    #[arg(value_name = "NAME")]
    pub name: String,
}

#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// The connection options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// One JSON object: ok, and checks [{server, check, status, detail}]
    #[arg(long)]
    pub json: bool,

    /// The lock NAME whose keys the permission checks use
    #[arg(long, value_name = "NAME", default_value = "doctor")]
    pub name: String,

    /// The logging options (parsed as global ones, by [`Cli`]).
    #[arg(skip)]
    pub log: LogArgs,
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
        if self.node_timeout.is_some_and(|d| d.is_zero()) {
            return Err(Failure::usage("--node-timeout must be longer than 0s"));
        }
        if self.holders == 0 || self.holders > MAX_HOLDERS {
            return Err(Failure::usage(format!(
                "--holders {} is out of range: 1 (one holder, the default) to {MAX_HOLDERS}",
                self.holders
            )));
        }
        if self.max_run.is_some_and(|d| d.is_zero()) {
            return Err(Failure::usage("--max-run must be longer than 0s"));
        }
        if self.conn.connect_timeout.is_zero() {
            return Err(Failure::usage("--connect-timeout must be longer than 0s"));
        }
        let name = LockName::new(raw).map_err(Failure::usage)?;
        let status_command = self.conn.pasteable("status", &name);
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
            max_run: self.max_run,
            fair: !self.no_fair,
            status_command,
            release_timeout: self.conn.connect_timeout.min(timings.ttl),
        })
    }
}

impl ConnArgs {
    pub fn tls(&self) -> crate::redis::tls::TlsOptions {
        crate::redis::tls::TlsOptions {
            ca_cert: self.tls_ca_cert.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        }
    }

    /// The password for URLs that carry none: `--password-file`, else `REDISCLI_AUTH`.
    pub fn default_password(&self) -> Result<Option<String>, Failure> {
        if let Some(path) = &self.password_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::usage(format!(
                    "cannot read --password-file {}: {e}",
                    path.display()
                ))
            })?;
            let password = text.lines().next().unwrap_or("").to_owned();
            if password.is_empty() {
                return Err(Failure::usage(format!(
                    "--password-file {} is empty",
                    path.display()
                )));
            }
            return Ok(Some(password));
        }
        Ok(crate::backend::env_password())
    }

    /// Warns when a password was given on the command line, where `ps` shows it to every user.
    pub fn warn_about_visible_passwords(&self) {
        if self
            .url
            .iter()
            .any(|u| crate::redis::url::url_has_password(u))
        {
            tracing::warn!(
                "a password given with --url is visible to every user of this machine (ps); \
                 put the URL in LOCKED_RUN_URL, or the password in --password-file or REDISCLI_AUTH"
            );
        }
    }

    /// `locked-run SUB [-u URL]... NAME` as a user can paste it: with the URLs given with
    /// `--url`, each without its password (a URL from `LOCKED_RUN_URL` is in the environment
    /// already, and the default needs none), quoted for a shell.
    pub fn pasteable(&self, sub: &str, name: &LockName) -> String {
        let mut line = format!("locked-run {sub}");
        for url in &self.url {
            line.push_str(" -u ");
            line.push_str(&shell_word(&crate::redis::url::printable(url)));
        }
        line.push(' ');
        line.push_str(&shell_word(name.as_str()));
        line
    }

    /// The server URLs: `--url`, else `LOCKED_RUN_URL`, else the default.
    pub fn urls(&self) -> Vec<String> {
        if !self.url.is_empty() {
            return self.url.clone();
        }
        match std::env::var("LOCKED_RUN_URL") {
            Ok(value) if !value.trim().is_empty() => split_urls(&value),
            _ => vec![DEFAULT_URL.to_owned()],
        }
    }
}

/// `word` as one word of a shell command line: as it is when it holds nothing a shell reads
/// specially, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Splits `LOCKED_RUN_URL`: whitespace separates, and so does a comma directly followed by
/// `scheme://` (a comma elsewhere may belong to a password or a path).
pub fn split_urls(value: &str) -> Vec<String> {
    let mut urls = Vec::new();
    for word in value.split_whitespace() {
        let mut start = 0;
        for (i, _) in word.match_indices(',') {
            if starts_with_scheme(&word[i + 1..]) {
                urls.push(&word[start..i]);
                start = i + 1;
            }
        }
        urls.push(&word[start..]);
    }
    urls.into_iter()
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

fn starts_with_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// A humantime duration; a bare number is refused with a hint, never guessed.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "{t:?} has no unit: write {t}s for seconds or {t}ms for milliseconds"
        ));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("{t:?} is not a duration ({e}); write e.g. 500ms, 30s, 2m or 1h"))
}

/// `TERM`, `SIGTERM`, `term` or `15`; only signals whose default action ends a process.
pub fn parse_signal(s: &str) -> Result<Signal, String> {
    let signal = match s.parse::<i32>() {
        Ok(n) => Signal::try_from(n).map_err(|_| format!("{n} is not a signal number"))?,
        Err(_) => {
            let upper = s.to_ascii_uppercase();
            let full = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            full.parse::<Signal>().map_err(|_| {
                format!("unknown signal {s:?}: use a name such as TERM, INT or HUP, or a number")
            })?
        }
    };
    use Signal::*;
    if matches!(
        signal,
        SIGSTOP | SIGTSTP | SIGTTIN | SIGTTOU | SIGCONT | SIGCHLD | SIGURG | SIGWINCH
    ) {
        return Err(format!(
            "{signal} does not end a process; use TERM, INT, HUP, QUIT or KILL"
        ));
    }
    Ok(signal)
}

/// The shared options, which mean the same before or after a subcommand: those that take a
/// value, and those that do not.
const SHARED_WITH_VALUE: [&str; 8] = [
    "-u",
    "--url",
    "--connect-timeout",
    "--password-file",
    "--tls-ca-cert",
    "--tls-cert",
    "--tls-key",
    "--log-format",
];
const SHARED_FLAGS: [&str; 4] = ["-v", "--verbose", "-q", "--quiet"];

/// The command line with shared options written before a subcommand moved after it
/// (`locked-run -u URL status NAME` as `locked-run status -u URL NAME`), as etcdctl and consul
/// users write them. Only a leading run of shared options moves, and only in front of a
/// subcommand's name: anything else is a run, whose own options stay where they are.
pub fn shared_options_after_subcommand(args: Vec<OsString>) -> Vec<OsString> {
    let mut at = 1;
    while let Some(arg) = args.get(at).and_then(|a| a.to_str()) {
        let (option, inline) = match arg.split_once('=') {
            Some((option, _)) if option.starts_with("--") => (option, true),
            _ => (arg, false),
        };
        if SHARED_WITH_VALUE.contains(&option) {
            at += if inline { 1 } else { 2 };
        } else if (arg.starts_with("-u") && arg.len() > 2)
            || SHARED_FLAGS.contains(&arg)
            || (arg.len() > 1 && arg.starts_with('-') && arg[1..].chars().all(|c| c == 'v'))
        {
            at += 1;
        } else {
            break;
        }
    }
    let names_a_subcommand = args
        .get(at)
        .and_then(|a| a.to_str())
        .is_some_and(|a| RESERVED.contains(&a));
    if at == 1 || at >= args.len() || !names_a_subcommand {
        return args;
    }
    let mut moved = Vec::with_capacity(args.len());
    moved.push(args[0].clone());
    moved.push(args[at].clone());
    moved.extend_from_slice(&args[1..at]);
    moved.extend_from_slice(&args[at + 1..]);
    moved
}

/// Turns a clap error into one line (`locked-run: ...`), as every other error.
pub fn one_line(error: &clap::Error) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every long option of every (sub)command appears in its man page, which `cargo xtask
    /// dist` renders the same way from the same definitions.
    #[test]
    fn the_man_pages_document_every_long_option() {
        // Built, as the man pages are: the global options are then every subcommand's too.
        let mut root = <Cli as CommandFactory>::command();
        root.build();
        let mut commands = vec![root.clone()];
        commands.extend(
            root.get_subcommands()
                .filter(|c| c.get_name() != "help")
                .cloned(),
        );
        for cmd in commands {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd.clone())
                .render(&mut page)
                .unwrap();
            // roff escapes the hyphens of options: `\-\-ttl`.
            let page = String::from_utf8(page).unwrap().replace("\\-", "-");
            let longs: Vec<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
            assert!(longs.len() > 1, "{}", cmd.get_name());
            for long in longs {
                assert!(
                    page.contains(&format!("--{long}")),
                    "--{long} missing from the {} page",
                    cmd.get_name()
                );
            }
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        <Cli as CommandFactory>::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("locked-run").chain(args.iter().copied()))
    }

    #[test]
    fn command_after_name_keeps_its_own_flags() {
        let cli = parse(&["-n", "job", "ls", "-l", "--color"]).unwrap();
        let Command::Run { args, .. } = cli.into_command() else {
            panic!()
        };
        assert!(args.no_wait);
        assert_eq!(args.name.as_deref(), Some("job"));
        assert_eq!(args.command, ["ls", "-l", "--color"]);

        let cli = parse(&["job", "--", "sh", "-c", "exit 3"]).unwrap();
        let Command::Run { args, .. } = cli.into_command() else {
            panic!()
        };
        assert_eq!(args.command, ["sh", "-c", "exit 3"]);
    }

    #[test]
    fn subcommands_and_explicit_run() {
        let cli = parse(&["status", "--json", "job"]).unwrap();
        assert!(matches!(cli.into_command(), Command::Status(a) if a.json && a.name == "job"));
        let cli = parse(&["run", "status", "--", "true"]).unwrap();
        let Command::Run { args, .. } = cli.into_command() else {
            panic!()
        };
        assert_eq!(args.name.as_deref(), Some("status"));
        assert!(args.config(true).is_ok());
    }

    #[test]
    fn reserved_names_need_explicit_run() {
        // Options before a subcommand's name make it the NAME of a run.
        let cli = parse(&["-q", "release", "job", "true"]).unwrap();
        let Command::Run { args, .. } = cli.into_command() else {
            panic!()
        };
        assert!(
            args.config(false)
                .unwrap_err()
                .message
                .contains("locked-run run release")
        );
        let cli = parse(&["release", "--force", "job"]).unwrap();
        assert!(matches!(cli.into_command(), Command::Release(a) if a.force && a.name == "job"));
    }

    #[test]
    fn missing_command_is_an_error() {
        let err = parse(&["job"]).unwrap_err();
        assert!(one_line(&err).contains("<COMMAND>"), "{}", one_line(&err));
        assert!(!one_line(&err).contains('\n'));
    }

    #[test]
    fn durations_need_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("30").unwrap_err().contains("30s"));
        assert!(parse_duration("1.5").unwrap_err().contains("no unit"));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn wait_zero_means_no_wait() {
        let cli = parse(&["-w", "0s", "job", "true"]).unwrap();
        let Command::Run { args, .. } = cli.into_command() else {
            panic!()
        };
        assert_eq!(args.config(false).unwrap().patience, Patience::NoWait);
        let cli = parse(&["-w", "5s", "job", "true"]).unwrap();
        let Command::Run { args, .. } = cli.into_command() else {
            panic!()
        };
        assert_eq!(
            args.config(false).unwrap().patience,
            Patience::For(Duration::from_secs(5))
        );
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("TERM"), Ok(Signal::SIGTERM));
        assert_eq!(parse_signal("SIGTERM"), Ok(Signal::SIGTERM));
        assert_eq!(parse_signal("15"), Ok(Signal::SIGTERM));
        assert_eq!(parse_signal("int"), Ok(Signal::SIGINT));
        assert_eq!(parse_signal("KILL"), Ok(Signal::SIGKILL));
        assert!(parse_signal("STOP").is_err());
        assert!(parse_signal("NOPE").is_err());
        assert!(parse_signal("99").is_err());
    }

    #[test]
    fn url_list_splits_on_whitespace_and_scheme_commas() {
        assert_eq!(
            split_urls("redis://a:1 redis://b:2"),
            ["redis://a:1", "redis://b:2"]
        );
        assert_eq!(
            split_urls("redis://a:1,redis://b:2"),
            ["redis://a:1", "redis://b:2"]
        );
        assert_eq!(split_urls("redis://:pa,ss@a:1"), ["redis://:pa,ss@a:1"]);
        assert_eq!(split_urls("  redis://a  "), ["redis://a"]);
    }

    #[test]
    fn inconsistent_timings_are_usage_errors() {
        let cli = parse(&[
            "--ttl",
            "10s",
            "--renew-every",
            "5s",
            "--kill-after",
            "5s",
            "job",
            "true",
        ])
        .unwrap();
        let Command::Run { args, .. } = cli.into_command() else {
            panic!()
        };
        assert!(
            args.config(false)
                .unwrap_err()
                .message
                .contains("no time is left to retry")
        );
        let cli = parse(&["--ttl", "50ms", "job", "true"]).unwrap();
        let Command::Run { args, .. } = cli.into_command() else {
            panic!()
        };
        assert!(
            args.config(false)
                .unwrap_err()
                .message
                .contains("too short")
        );
    }
}
