//! `cargo xtask dist [DIR]`: the man pages (`locked-run.1`, one per subcommand) and bash, zsh
//! and fish completions,
//! generated from the clap definitions (never written by hand), into DIR (default
//! `target/dist`), where the packaging metadata in Cargo.toml picks them up.

use std::path::PathBuf;

use clap::CommandFactory;
use clap_complete::Shell;
use locked_run::cli::Cli;

/// clap_mangen puts the long help's closing text in one filled EXTRA section; the man page
/// gives it as man pages do: an EXIT STATUS section, and EXAMPLES kept as they are written
/// (no filling, one per line, as in flock(1)).
fn sections_of_the_extra(page: &std::path::Path) -> std::io::Result<()> {
    let text = std::fs::read_to_string(page)?;
    let missing = |what: &str| {
        std::io::Error::other(format!(
            "{}: no {what} in the page clap_mangen rendered; the man page's EXIT STATUS and \
             EXAMPLES would be lost",
            page.display()
        ))
    };
    let (before, extra) = text
        .split_once(".SH EXTRA\n")
        .ok_or_else(|| missing("EXTRA section"))?;
    let (extra, after) = extra
        .split_once("\n.SH ")
        .map_or((extra, String::new()), |(e, a)| (e, format!("\n.SH {a}")));
    let (status, examples) = extra
        .split_once("\nExamples:\n")
        .ok_or_else(|| missing("Examples: in its EXTRA section"))?;
    let examples = examples.trim_end().replace("\n\n", "\n.sp\n");
    let page_text = format!(
        "{before}.SH \"EXIT STATUS\"\n{}\n.SH EXAMPLES\n.nf\n{examples}\n.fi{after}",
        status.trim_end()
    );
    std::fs::write(page, page_text)
}

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
    sections_of_the_extra(&dir.join("locked-run.1"))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd.clone(), "locked-run", &dir)?;
    }
    for entry in std::fs::read_dir(&dir)? {
        println!("{}", entry?.path().display());
    }
    Ok(())
}
