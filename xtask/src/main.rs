//! `cargo xtask dist [DIR]`: the man pages (`locked-run.1`, one per subcommand) and bash, zsh
//! and fish completions,
//! generated from the clap definitions (never written by hand), into DIR (default
//! `target/dist`), where the packaging metadata in Cargo.toml picks them up.

use std::path::PathBuf;

use clap::CommandFactory;
use clap_complete::Shell;
use locked_run::cli::Cli;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let task = args.next().unwrap_or_default();
    if task != "dist" {
        eprintln!("usage: cargo xtask dist [DIR]");
        std::process::exit(2);
    }
    let dir = args
        .next()
        .map_or_else(|| PathBuf::from("target/dist"), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    let cmd = Cli::command();
    // locked-run.1, and a page per subcommand (locked-run-status.1, ...).
    clap_mangen::generate_to(cmd.clone(), &dir)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd.clone(), "locked-run", &dir)?;
    }
    for entry in std::fs::read_dir(&dir)? {
        println!("{}", entry?.path().display());
    }
    Ok(())
}
