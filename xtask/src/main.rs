//! `cargo xtask proto`: the types of etcd's gRPC API, from its protos (see `proto.rs`).
//!
//! `cargo xtask dist [DIR]`: the man pages (`locked-run.1`, one per subcommand) and bash, zsh
//! and fish completions, generated from the clap definitions (never written by hand), and the
//! documentation as the packages install it (`DIR/doc`, see `docs.rs`), into DIR (default
//! `target/dist`), where the packaging metadata in Cargo.toml picks them up.
//!
//! Every page must have an EXIT STATUS and an EXAMPLES section: the xtask renders all pages
//! first, checks each, and writes nothing when one lacks either (the packages would otherwise
//! ship a page that leaves out what scripts branch on).

use std::path::{Path, PathBuf};

use clap::{Command, CommandFactory};
use locked_run::internals::Cli;

mod completions;
mod docs;
mod pages;
mod proto;

/// Where a page's closing text (clap's `after_long_help`) puts the examples.
const EXAMPLES: &str = "\nExamples:\n";

type Error = Box<dyn std::error::Error>;

/// The closing text of `sub`'s long help with an exit-status paragraph and an "Examples:"
/// block: the help's own where it has them, else the xtask's supplement (xtask/src/pages.rs).
fn with_sections(sub: Command, page: &str) -> Command {
    let own = sub
        .get_after_long_help()
        .map(|text| text.to_string())
        .unwrap_or_default();
    let (own_status, own_examples) = match own.split_once(EXAMPLES) {
        Some((status, examples)) => (status.trim().to_string(), examples.trim_end().to_string()),
        None => (own.trim().to_string(), String::new()),
    };
    let own_status = (!own_status.is_empty()).then_some(own_status);
    let own_examples = (!own_examples.trim().is_empty()).then_some(own_examples);
    let supplement = pages::supplement(sub.get_name());
    if let Some(s) = &supplement {
        if own_status.is_some() && !s.exit_status.is_empty() {
            eprintln!(
                "xtask: {page}: the --help text has its own exit status now; the one in \
                 xtask/src/pages.rs is unused (remove it: one source per section)"
            );
        }
        if own_examples.is_some() && !s.examples.is_empty() {
            eprintln!(
                "xtask: {page}: the --help text has its own examples now; the ones in \
                 xtask/src/pages.rs are unused (remove them: one source per section)"
            );
        }
    }
    let status = own_status.or_else(|| supplement.as_ref().map(|s| s.exit_status.to_string()));
    let examples = own_examples.or_else(|| supplement.as_ref().map(|s| s.examples.to_string()));
    let text = match (status, examples) {
        (Some(s), Some(e)) => format!("{s}\n{EXAMPLES}{e}"),
        (Some(s), None) => s,
        (None, Some(e)) => format!("{EXAMPLES}{e}"),
        (None, None) => return sub,
    };
    sub.after_long_help(text)
}

/// clap_mangen puts the long help's closing text in one filled EXTRA section; the man page
/// gives it as man pages do: an EXIT STATUS section, and EXAMPLES kept as they are written (no
/// filling, one per line, as in flock(1)). Refuses a page that lacks either.
fn sections_of_the_extra(page: &str, text: &str) -> Result<String, String> {
    let missing = |what: &str| {
        format!(
            "{page}: no {what}; every man page needs an EXIT STATUS and an EXAMPLES section. \
             Give the subcommand an after_long_help in src/cli (an exit-status paragraph, then \
             \"Examples:\"), or add it to xtask/src/pages.rs"
        )
    };
    let (before, extra) = text
        .split_once(".SH EXTRA\n")
        .ok_or_else(|| missing("EXIT STATUS and no EXAMPLES (no closing text in its --help)"))?;
    let (extra, after) = extra
        .split_once("\n.SH ")
        .map_or((extra, String::new()), |(e, a)| (e, format!("\n.SH {a}")));
    let (status, examples) = extra
        .split_once(EXAMPLES)
        .ok_or_else(|| missing("EXAMPLES (no \"Examples:\" in its closing text)"))?;
    // The section's title says it already.
    let status = status.trim();
    let status = status
        .strip_prefix("Exit status:")
        .unwrap_or(status)
        .trim_start();
    if status.is_empty() {
        return Err(missing("EXIT STATUS (nothing before \"Examples:\")"));
    }
    let examples = examples.trim_end().replace("\n\n", "\n.sp\n");
    if examples.trim().is_empty() {
        return Err(missing("EXAMPLES (nothing after \"Examples:\")"));
    }
    let see_also = see_also(page);
    Ok(format!(
        "{before}.SH \"EXIT STATUS\"\n{status}\n.SH EXAMPLES\n.nf\n{examples}\n.fi\n{see_also}{}",
        after.trim_start_matches('\n')
    ))
}

/// The command line as the pages describe it: built, so that the subcommands know their
/// pages' names (locked-run-status), with `help` (which has no page) left out.
fn cli() -> Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The subcommands that have a page of their own.
fn subcommands(cmd: &Command) -> Vec<String> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| s.get_name().to_string())
        .collect()
}

/// Every page's name without its section: `locked-run`, then one per subcommand.
fn page_names() -> Vec<String> {
    std::iter::once("locked-run".to_string())
        .chain(
            subcommands(&cli())
                .iter()
                .map(|s| format!("locked-run-{s}")),
        )
        .collect()
}

/// The other pages, and where the full documentation is installed (docs.rs; packaging/check-deb
/// checks that every path named here is in the package).
fn see_also(page: &str) -> String {
    let others: Vec<String> = page_names()
        .iter()
        .filter(|p| format!("{p}.1") != page)
        .map(|p| format!("\\fB{}\\fR(1)", p.replace('-', "\\-")))
        .collect();
    let doc = "/usr/share/doc/locked\\-run";
    format!(
        ".SH \"SEE ALSO\"\n{}, \\fBflock\\fR(1), \\fBtimeout\\fR(1)\n.PP\nEvery option, backend and \
         recipe: {doc}/docs/guide.md.\n.br\nEach error line, what it means and what to do, keyed by \
         its first words: {doc}/docs/faq.md.\n.br\nThe lease clock, fencing and what each backend \
         guarantees: {doc}/docs/how\\-it\\-works.md.\n.br\nUpgrading a fleet, and what stays \
         compatible: {doc}/docs/upgrading.md and {doc}/CHANGELOG.md.\n",
        others.join(", ")
    )
}

/// Every man page, rendered and checked, as (file name, text); nothing is written here.
fn man_pages() -> Result<Vec<(String, String)>, Error> {
    // As clap_mangen::generate_to does (see `cli`).
    let cmd = cli();
    let subs = subcommands(&cmd);
    let mut pages = Vec::new();
    let mut refused = Vec::new();
    let mut render = |page: String, man: clap_mangen::Man| -> Result<(), Error> {
        let mut out = Vec::new();
        man.render(&mut out)?;
        match sections_of_the_extra(&page, &String::from_utf8(out)?) {
            Ok(text) => pages.push((page, breakable(&text))),
            Err(why) => refused.push(why),
        }
        Ok(())
    };
    render("locked-run.1".into(), clap_mangen::Man::new(cmd.clone()))?;
    for name in subs {
        let page = format!("locked-run-{name}.1");
        let sub = cmd.find_subcommand(&name).expect("listed above").clone();
        let sub = with_sections(sub, &page);
        render(page, clap_mangen::Man::new(sub))?;
    }
    if !refused.is_empty() {
        return Err(format!(
            "refusing to write the man pages:\n  {}",
            refused.join("\n  ")
        )
        .into());
    }
    Ok(pages)
}

/// Where a filled line of a page may break inside a word longer than [`LONG_WORD`]: after a
/// `,` and before a `[` (`\\:`, a break point that prints nothing). The option lists of URL
/// forms (`postgres://[user@]host[:port][,host[:port]...]/DB[...]`) are words no line of a
/// terminal 80 columns wide holds: troff warns that it "cannot adjust line", and `man` prints
/// that above the page.
fn breakable(page: &str) -> String {
    let mut out = String::with_capacity(page.len() + 256);
    let mut filled = true;
    for line in page.split_inclusive('\n') {
        match line.trim_end() {
            ".nf" => filled = false,
            ".fi" => filled = true,
            _ => {}
        }
        if !filled || line.starts_with('.') || line.starts_with('\'') {
            out.push_str(line);
            continue;
        }
        let words = line
            .split_inclusive(' ')
            .map(|word| match word.len() > LONG_WORD {
                true => break_points(word),
                false => word.to_string(),
            });
        out.extend(words);
    }
    out
}

/// A word longer than this gets break points (see [`breakable`]).
const LONG_WORD: usize = 30;

fn break_points(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 16);
    let mut previous = ' ';
    for c in word.chars() {
        if c == '[' && !matches!(previous, ' ' | '[' | '\\') {
            out.push_str("\\:");
        }
        out.push(c);
        if c == ',' {
            out.push_str("\\:");
        }
        previous = c;
    }
    out
}

/// Writes the pages, the completions and the documents into `dir`; the files written, as
/// paths relative to it.
fn dist(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let pages = man_pages()?;
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (page, text) in &pages {
        std::fs::write(dir.join(page), text)?;
        written.push(PathBuf::from(page));
    }
    written.extend(completions::write_all(dir)?);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ is in the source tree");
    docs::write(root, &dir.join("doc"))?;
    written.extend(docs::SHIPPED.iter().map(|f| Path::new("doc").join(f)));
    Ok(written)
}

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let task = args.next().unwrap_or_default();
    if task == "proto" {
        return match proto::write() {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("xtask: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if task != "dist" {
        eprintln!("usage: cargo xtask dist [DIR] | cargo xtask proto");
        return std::process::ExitCode::from(2);
    }
    let dir = args
        .next()
        .map_or_else(|| PathBuf::from("target/dist"), PathBuf::from);
    match dist(&dir) {
        Ok(written) => {
            for file in written {
                println!("{}", dir.join(file).display());
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xtask: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_has_exit_status_and_examples() {
        let pages = man_pages().expect("every page renders with both sections");
        let names: Vec<&str> = pages.iter().map(|(p, _)| p.as_str()).collect();
        for page in [
            "locked-run.1",
            "locked-run-run.1",
            "locked-run-status.1",
            "locked-run-release.1",
            "locked-run-doctor.1",
            "locked-run-history.1",
        ] {
            assert!(names.contains(&page), "{page} missing from {names:?}");
        }
        for (page, text) in &pages {
            assert!(text.contains(".SH \"EXIT STATUS\"\n"), "{page}");
            assert!(text.contains(".SH EXAMPLES\n.nf\n"), "{page}");
            assert!(!text.contains(".SH EXTRA"), "{page}");
        }
    }

    #[test]
    fn a_page_without_either_section_is_refused() {
        let bare = ".TH x 1\n.SH NAME\nx\n";
        let why = sections_of_the_extra("locked-run-x.1", bare).unwrap_err();
        assert!(why.starts_with("locked-run-x.1: no EXIT STATUS"), "{why}");
        let no_examples = ".TH x 1\n.SH EXTRA\nExit status: 0 ok.\n.SH VERSION\nv1\n";
        let why = sections_of_the_extra("locked-run-x.1", no_examples).unwrap_err();
        assert!(why.contains("no EXAMPLES"), "{why}");
        let no_status = ".TH x 1\n.SH EXTRA\n\nExamples:\n  x\n";
        let why = sections_of_the_extra("locked-run-x.1", no_status).unwrap_err();
        assert!(why.contains("no EXIT STATUS"), "{why}");
    }

    /// The sources of one package's assets, as Cargo.toml lists them under `[section]`: every
    /// quoted path that starts `target/dist/`, up to the next section.
    fn assets(manifest: &str, section: &str) -> Vec<String> {
        let start = manifest
            .find(&format!("\n[{section}]\n"))
            .unwrap_or_else(|| panic!("Cargo.toml has no [{section}]"));
        let body = &manifest[start + section.len() + 4..];
        let body = &body[..body.find("\n[").unwrap_or(body.len())];
        body.split('"')
            .filter(|s| s.starts_with("target/dist/"))
            .map(|s| s["target/dist/".len()..].to_string())
            .collect()
    }

    /// Every file `cargo xtask dist` writes (each man page above all: the README and `man
    /// locked-run` point to each) is in the Debian package and in the RPM, and neither lists
    /// one it does not write. See issue 47: locked-run-history(1) was made, never shipped.
    #[test]
    fn every_file_dist_makes_is_in_both_packages() {
        let dir = tempfile::tempdir().unwrap();
        let written: Vec<String> = dist(dir.path())
            .expect("dist writes")
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert!(
            written.iter().any(|f| f == "locked-run-history.1"),
            "{written:?}"
        );
        for page in page_names() {
            assert!(
                written.contains(&format!("{page}.1")),
                "{page}: {written:?}"
            );
        }
        let manifest =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"))
                .unwrap();
        for section in ["package.metadata.deb", "package.metadata.generate-rpm"] {
            let listed = assets(&manifest, section);
            let missing: Vec<&String> = written.iter().filter(|f| !listed.contains(f)).collect();
            assert!(
                missing.is_empty(),
                "[{section}] in Cargo.toml does not ship {missing:?} (add each as target/dist/FILE)"
            );
            let stale: Vec<&String> = listed.iter().filter(|f| !written.contains(f)).collect();
            assert!(
                stale.is_empty(),
                "[{section}] lists {stale:?}, which dist does not make"
            );
        }
    }

    /// The pages read on a terminal 80 columns wide without a troff warning above them
    /// (`cannot adjust line`: a word longer than a line). With `man` (man-db) or `groff`
    /// installed; outside CI, SKIPPED without either.
    #[test]
    fn every_page_renders_at_80_columns_without_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        dist(dir.path()).expect("dist writes");
        let mut checked = 0;
        for page in page_names() {
            let path = dir.path().join(format!("{page}.1"));
            let man = std::process::Command::new("man").arg("--version").output();
            let out = if man.is_ok() {
                std::process::Command::new("man")
                    .arg("-l")
                    .arg(&path)
                    .env("MANWIDTH", "80")
                    .output()
            } else {
                // What man-db runs for a width of 80: a line length of 78.
                std::process::Command::new("groff")
                    .args(["-man", "-Tutf8", "-rLL=78n", "-rLT=78n", "-z"])
                    .arg(&path)
                    .output()
            };
            let Ok(out) = out else {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "neither man nor groff is installed; .ci/setup installs them (CI is set here)"
                );
                eprintln!(
                    "SKIPPED: neither man nor groff is installed, the pages are not rendered"
                );
                return;
            };
            let warnings = String::from_utf8_lossy(&out.stderr);
            assert!(warnings.trim().is_empty(), "{page}.1:\n{warnings}");
            checked += 1;
        }
        assert_eq!(checked, page_names().len());
    }

    #[test]
    fn long_words_get_break_points_and_examples_stay_as_written() {
        let page = ".TP\nServer URL: postgres://[user@]host[:port][,host[:port]...]/DB short\n\
                    .nf\n  postgres://[user@]host[:port][,host[:port]...]/DB\n.fi\n";
        let text = breakable(page);
        assert!(
            text.contains("postgres://\\:[user@]host\\:[:port]\\:[,\\:host\\:[:port]...]/DB short"),
            "{text}"
        );
        assert!(text.contains("\n  postgres://[user@]host[:port][,host[:port]...]/DB\n"));
    }
}
