//! The generated completions, loaded into the real bash, zsh and fish, asked what they offer
//! where an operator presses TAB: after `status --`, `doctor --` and `release --` (the
//! subcommands' own options), after `--kill-signal ` (signal names, never file names), and
//! after `locked-run ` (the subcommands).
//!
//! Each shell runs under `timeout -s KILL`. A shell that is not installed is SKIPPED with a
//! line saying so, except in CI (`CI` set), where `.ci/run` installs all three and a missing
//! one fails.

use std::process::Command;

use super::{BIN, write_all};

/// A file in the shells' working directory: a completion that falls back to file names
/// offers it.
const DECOY: &str = "a-file-not-a-signal";

#[derive(Clone, Copy, Debug)]
enum Sh {
    Bash,
    Zsh,
    Fish,
}

/// The generated files, in a directory whose only other file is the decoy.
struct Generated {
    dir: tempfile::TempDir,
}

impl Generated {
    fn new() -> Generated {
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path()).unwrap();
        std::fs::write(dir.path().join(DECOY), "").unwrap();
        Generated { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.path().join(file).to_str().unwrap().to_owned()
    }

    /// What `sh` offers for `line` with the cursor at its end, one word each, or None when
    /// the shell is not installed (outside CI).
    fn offers(&self, sh: Sh, line: &str) -> Option<Vec<String>> {
        let name = format!("{sh:?}").to_lowercase();
        if !installed(&name) {
            assert!(
                std::env::var_os("CI").is_none(),
                "{name} is not installed; .ci/run installs it (CI is set here)"
            );
            eprintln!("SKIPPED: {name} is not installed, its completion is not tested");
            return None;
        }
        let out_file = self.dir.path().join("zsh-offers.out");
        let mut cmd = Command::new("timeout");
        cmd.args(["-s", "KILL", "30s", &name])
            .current_dir(self.dir.path());
        match sh {
            Sh::Bash => {
                cmd.args(["--norc", "--noprofile", "-c", BASH_OFFERS, "bash"])
                    .args([self.path("locked-run.bash"), line.to_owned()]);
            }
            Sh::Zsh => {
                let _ = std::fs::remove_file(&out_file);
                let script = self.dir.path().join("zsh_offers.zsh");
                std::fs::write(&script, include_str!("zsh_offers.zsh")).unwrap();
                cmd.arg("-f")
                    .arg(&script)
                    .arg(self.dir.path())
                    .arg(&out_file)
                    .arg(line);
            }
            Sh::Fish => {
                cmd.args([
                    "--no-config",
                    "-c",
                    "source $argv[1]; and complete -C $argv[2]",
                ])
                .args([self.path("locked-run.fish"), line.to_owned()]);
            }
        }
        let output = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{name} for {line:?}: {:?}\n{stderr}",
            output.status
        );
        let text = match sh {
            Sh::Zsh => {
                let text = std::fs::read_to_string(&out_file).unwrap_or_default();
                let done = text.strip_suffix("<done>\n");
                assert!(
                    done.is_some(),
                    "zsh never finished completing {line:?}: {text:?}"
                );
                done.unwrap().to_owned()
            }
            _ => String::from_utf8(output.stdout).unwrap(),
        };
        // fish: "word<TAB>description".
        Some(
            text.lines()
                .map(|l| l.split('\t').next().unwrap().to_owned())
                .filter(|w| !w.is_empty())
                .collect(),
        )
    }
}

/// Completes the line in $2 with the function that the file in $1 registers for locked-run,
/// as bash's programmable completion calls it (COMP_WORDS, COMP_CWORD; the command, the word
/// completed and the one before as arguments), and prints COMPREPLY.
const BASH_OFFERS: &str = r#"
set -u
source "$1"
spec=$(complete -p locked-run) || exit 3
fn=${spec#*-F }
fn=${fn%% *}
read -r -a COMP_WORDS <<< "$2"
[[ "$2" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE=$2
COMP_POINT=${#COMP_LINE}
COMPREPLY=()
"$fn" locked-run "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
if [ ${#COMPREPLY[@]} -gt 0 ]; then printf '%s\n' "${COMPREPLY[@]}"; fi
"#;

fn installed(shell: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {shell}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Every word of `want` is among `got`.
fn assert_offers(sh: Sh, line: &str, got: &[String], want: &[&str]) {
    let missing: Vec<&&str> = want
        .iter()
        .filter(|w| !got.iter().any(|g| g == *w))
        .collect();
    assert!(
        missing.is_empty(),
        "{sh:?}: `{line}<TAB>` does not offer {missing:?}; it offers {got:?}"
    );
}

fn check_shell(sh: Sh) {
    let generated = Generated::new();
    let offers = |line: &str| generated.offers(sh, line);
    let Some(top) = offers(&format!("{BIN} ")) else {
        return;
    };
    assert_offers(sh, BIN, &top, &["run", "status", "release", "doctor"]);
    for (line, want) in [
        ("status --", &["--json", "--url", "--connect-timeout"][..]),
        ("doctor --", &["--json", "--name", "--url"]),
        ("release --", &["--force", "--token", "--url"]),
        ("run --", &["--ttl", "--kill-signal", "--holders"]),
        ("--", &["--ttl", "--no-wait", "--kill-signal"]),
    ] {
        let line = format!("{BIN} {line}");
        let got = offers(&line).unwrap();
        assert_offers(sh, &line, &got, want);
    }
    for line in ["--kill-signal ", "-s ", "run --kill-signal "] {
        let line = format!("{BIN} {line}");
        let got = offers(&line).unwrap();
        assert_offers(sh, &line, &got, &["TERM", "INT", "HUP", "QUIT", "KILL"]);
        assert!(
            !got.iter().any(|g| g.contains(DECOY)),
            "{sh:?}: `{line}<TAB>` offers file names: {got:?}"
        );
    }
}

// See issue 39: `locked-run status --<TAB>` offered nothing in bash (clap_complete's bash
// generator spells a hyphenated bin name two ways: clap-rs/clap#6421), and `--kill-signal
// <TAB>` offered file names in every shell.
#[test]
fn bash_offers_subcommand_options_and_signal_names() {
    check_shell(Sh::Bash);
}

#[test]
fn zsh_offers_subcommand_options_and_signal_names() {
    check_shell(Sh::Zsh);
}

#[test]
fn fish_offers_subcommand_options_and_signal_names() {
    check_shell(Sh::Fish);
}
