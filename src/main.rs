//! The `locked-run` binary: parse, run, turn the outcome into an exit status.

use std::process::ExitCode;

use clap::Parser;
use locked_run::cli::{Cli, one_line};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            eprintln!("locked-run: {}", one_line(&e));
            return ExitCode::from(locked_run::exit::USAGE);
        }
        Err(e) => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    locked_run::execute(cli).finish()
}
