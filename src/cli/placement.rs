//! Where the shared options may stand: before a subcommand as well as after it, as etcdctl
//! and consul users write them (`locked-run -u URL status NAME`).

use std::ffi::OsString;

use crate::name::RESERVED;

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
