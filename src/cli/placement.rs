//! Where the shared options may stand: before a subcommand as well as after it, as etcdctl
//! and consul users write them (`locked-run -u URL status NAME`).

use std::ffi::OsString;

use crate::name::RESERVED;

/// The shared options' long names, which mean the same before or after a subcommand: those
/// that take a value, and those that do not. Their short names are `-u URL`, `-v` and `-q`
/// (clustered as `-vq`, `-vvu URL`). A unit test holds these against clap's global options.
pub(super) const SHARED_WITH_VALUE: [&str; 8] = [
    "--url",
    "--connect-timeout",
    "--password-file",
    "--sentinel-password-file",
    "--tls-ca-cert",
    "--tls-cert",
    "--tls-key",
    "--log-format",
];
pub(super) const SHARED_FLAGS: [&str; 2] = ["--verbose", "--quiet"];
/// The short shared flags, and the one short shared option that takes a value.
pub(super) const SHORT_FLAGS: [char; 2] = ['v', 'q'];
pub(super) const SHORT_WITH_VALUE: char = 'u';

/// The command line with shared options written before a subcommand moved after it
/// (`locked-run -u URL status NAME` as `locked-run status -u URL NAME`), as etcdctl and consul
/// users write them. Only a leading run of shared options moves, and only in front of a
/// subcommand's name (not `help`, which takes no options): anything else is a run, whose own
/// options stay where they are.
pub fn shared_options_after_subcommand(args: Vec<OsString>) -> Vec<OsString> {
    let mut at = 1;
    while let Some(arg) = args.get(at).and_then(|a| a.to_str()) {
        let spans = match arg.split_once('=') {
            Some((option, _)) if option.starts_with("--") => {
                SHARED_WITH_VALUE.contains(&option).then_some(1)
            }
            _ if SHARED_WITH_VALUE.contains(&arg) => Some(2),
            _ if SHARED_FLAGS.contains(&arg) => Some(1),
            _ => short_cluster(arg),
        };
        match spans {
            Some(n) => at += n,
            None => break,
        }
    }
    let names_a_subcommand = args
        .get(at)
        .and_then(|a| a.to_str())
        .is_some_and(|a| a != "help" && RESERVED.contains(&a));
    if at == 1 || !names_a_subcommand {
        return args;
    }
    let mut moved = Vec::with_capacity(args.len());
    moved.push(args[0].clone());
    moved.push(args[at].clone());
    moved.extend_from_slice(&args[1..at]);
    moved.extend_from_slice(&args[at + 1..]);
    moved
}

/// How many arguments a cluster of short shared options spans (`-v`, `-vq`, `-u URL`, `-uURL`,
/// `-vu URL`), or `None` when it is not one.
fn short_cluster(arg: &str) -> Option<usize> {
    let rest = arg
        .strip_prefix('-')
        .filter(|r| !r.is_empty() && !r.starts_with('-'))?;
    let after_flags = rest.trim_start_matches(SHORT_FLAGS);
    match after_flags.strip_prefix(SHORT_WITH_VALUE) {
        None if after_flags.is_empty() => Some(1),
        None => None,
        Some("") => Some(2),
        Some(_) => Some(1),
    }
}
