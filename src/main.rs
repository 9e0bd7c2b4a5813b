//! The `locked-run` binary: parse, run, turn the outcome into an exit status.

use std::process::ExitCode;

use clap::Parser;
use locked_run::internals::{Cli, one_line, shared_options_after_subcommand};

fn main() -> ExitCode {
    let args = shared_options_after_subcommand(std::env::args_os().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            locked_run::internals::write_last(&format!("locked-run: {}", one_line(&e)));
            return ExitCode::from(locked_run::internals::USAGE);
        }
        Err(e) => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    locked_run::internals::execute(cli).finish()
}
