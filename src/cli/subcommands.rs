//! The operators' subcommands' own options: `status`, `release`, `doctor` and `history` (the
//! connection and logging options are the global ones, parsed by the command line itself).

use clap::Args;

use super::{ConnArgs, LogArgs};

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// The connection options (parsed as global ones, by [`Cli`](super::Cli)).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// One JSON object: name, held, fence, ttl_ms, holder {host, pid, command, since},
    /// holders, limit, mode, waiters (and quorum, servers for Redlock)
    #[arg(long)]
    pub json: bool,

    /// The logging options (parsed as global ones, by [`Cli`](super::Cli)).
    #[arg(skip)]
    pub log: LogArgs,

    /// Lock name
    #[arg(value_name = "NAME")]
    pub name: String,
}

#[derive(Args, Debug, Clone)]
pub struct ReleaseArgs {
    /// The connection options (parsed as global ones, by [`Cli`](super::Cli)).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// Really delete the lock (never its fence counter); without it, only show who holds it
    #[arg(long)]
    pub force: bool,

    /// With --force, of several holders (--holders, --shared), free only the one whose LOCKED_RUN_TOKEN
    /// this is (status shows each holder's token)
    #[arg(long, value_name = "TOKEN", requires = "force")]
    pub token: Option<String>,

    /// The logging options (parsed as global ones, by [`Cli`](super::Cli)).
    #[arg(skip)]
    pub log: LogArgs,

    /// Lock name
    #[arg(value_name = "NAME")]
    pub name: String,
}

#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// The connection options (parsed as global ones, by [`Cli`](super::Cli)).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// One JSON object: ok, and checks [{server, check, status, detail}]
    #[arg(long)]
    pub json: bool,

    /// The lock NAME whose keys the permission checks use
    #[arg(long, value_name = "NAME", default_value = "doctor")]
    pub name: String,

    /// The logging options (parsed as global ones, by [`Cli`](super::Cli)).
    #[arg(skip)]
    pub log: LogArgs,
}

#[derive(Args, Debug, Clone)]
pub struct HistoryArgs {
    /// The connection options (parsed as global ones, by [`Cli`](super::Cli)).
    #[arg(skip)]
    pub conn: ConnArgs,

    /// How many runs to show, newest first (at most the 100 kept)
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub limit: u16,

    /// A JSON array, newest first: host, pid, user, fence, mode, started_at, ended_at,
    /// waited_ms, status, ended (and signal)
    #[arg(long)]
    pub json: bool,

    /// The logging options (parsed as global ones, by [`Cli`](super::Cli)).
    #[arg(skip)]
    pub log: LogArgs,

    /// Lock name
    #[arg(value_name = "NAME")]
    pub name: String,
}
