//! The command line's definitions and value parsers, checked without running anything.

use super::values::parse_signal;
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
    // Parsed as clap parses (main first moves shared options after a subcommand's name, see
    // placement.rs): options before a subcommand's name make it a run's NAME, refused with a hint.
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

/// A refused duration's line never sends the operator to a second refusal: whatever value it
/// suggests for a bare number is taken by the same option, and where none would be (`--ttl 0`)
/// it names the least instead. See issue 47: `--ttl 0` said "write 0s", and `--ttl 0s` was
/// then too short.
#[test]
fn a_bare_numbers_hint_is_a_value_the_option_takes() {
    let options = [
        "--ttl",
        "--renew-every",
        "--wait",
        "--kill-after",
        "--max-run",
        "--min-hold",
        "--node-timeout",
        "--connect-timeout",
    ];
    for option in options {
        for number in ["0", "5", "50", "1.5", "0.05"] {
            let err = parse(&[option, number, "job", "true"]).unwrap_err();
            let line = one_line(&err);
            assert!(line.contains("has no unit"), "{option} {number}: {line}");
            let suggested: Vec<String> = [format!("{number}s"), format!("{number}ms")]
                .into_iter()
                .filter(|v| {
                    line.contains(&format!("write {v} ")) || line.contains(&format!(" or {v} "))
                })
                .collect();
            if suggested.is_empty() {
                assert!(
                    line.contains("this option takes"),
                    "{option} {number}: {line}"
                );
            }
            for value in suggested {
                // --renew-every and --kill-after are checked against the TTL: one that leaves
                // room for them.
                let ttl: &[&str] = match option {
                    "--ttl" => &[],
                    _ => &["--ttl", "1h"],
                };
                let cli = parse(&[ttl, &[option, &value, "job", "true"]].concat())
                    .unwrap_or_else(|e| panic!("{option} {value} (from {line}): {}", one_line(&e)));
                let Command::Run { args, .. } = cli.into_command() else {
                    panic!()
                };
                if let Err(e) = args.config(false) {
                    panic!("{option} {value} (from {line}): {}", e.message);
                }
            }
        }
    }
}

#[test]
fn a_duration_that_is_not_one_is_told_in_words() {
    for (value, words) in [
        (
            "abc",
            "\"abc\" is not a duration: write a number and a unit",
        ),
        ("5x", "has a unit \"x\" that is not one"),
        ("2m5", "has a number without a unit (5)"),
        ("", "an empty value is not a duration"),
    ] {
        let line = one_line(&parse(&["--wait", value, "job", "true"]).unwrap_err());
        assert!(line.contains(words), "{value:?}: {line}");
        assert!(!line.contains(" at 0"), "the parser's words: {line}");
    }
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

/// The names offered to shell completion for `--kill-signal` are all taken.
#[test]
fn the_signal_names_offered_are_taken() {
    use clap::builder::TypedValueParser;
    let offered: Vec<_> = values::SignalParser.possible_values().unwrap().collect();
    assert!(offered.iter().any(|v| v.get_name() == "TERM"));
    for value in offered {
        assert!(
            parse_signal(value.get_name()).is_ok(),
            "{}",
            value.get_name()
        );
    }
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

/// The hint's command carries what the connection needs besides the URL, so that it works
/// when pasted against a private CA or with a password file: the files' paths, quoted, and
/// never a password.
#[test]
fn the_pasteable_status_command_names_the_connections_files() {
    let cli = parse(&[
        "-u",
        "rediss://:secret@h:6380",
        "--tls-ca-cert",
        "/etc/ca dir/ca.pem",
        "--tls-cert",
        "c.pem",
        "--tls-key",
        "k.pem",
        "--password-file",
        "/run/pw",
        "job",
        "true",
    ])
    .unwrap();
    let Command::Run { args, .. } = cli.into_command() else {
        panic!()
    };
    assert_eq!(
        args.config(false).unwrap().status_command,
        "locked-run status -u rediss://h:6380 --password-file /run/pw --tls-ca-cert \
         '/etc/ca dir/ca.pem' --tls-cert c.pem --tls-key k.pem job"
    );
}

/// The shared options that may stand before a subcommand are exactly clap's global options,
/// so that a new one cannot be left out of the reordering unnoticed.
#[test]
fn the_shared_options_before_a_subcommand_are_claps_global_ones() {
    let mut root = <Cli as CommandFactory>::command();
    root.build();
    let globals: Vec<&clap::Arg> = root.get_arguments().filter(|a| a.is_global_set()).collect();
    let mut longs: Vec<String> = Vec::new();
    for arg in &globals {
        let takes_value = arg.get_action().takes_values();
        if let Some(long) = arg.get_long() {
            longs.push(format!("--{long}"));
            let listed = match takes_value {
                true => placement::SHARED_WITH_VALUE.contains(&format!("--{long}").as_str()),
                false => placement::SHARED_FLAGS.contains(&format!("--{long}").as_str()),
            };
            assert!(
                listed,
                "--{long} is global but not moved before a subcommand"
            );
        }
        if let Some(short) = arg.get_short() {
            match takes_value {
                true => assert_eq!(short, placement::SHORT_WITH_VALUE),
                false => assert!(placement::SHORT_FLAGS.contains(&short), "-{short}"),
            }
        }
    }
    for listed in placement::SHARED_WITH_VALUE
        .iter()
        .chain(&placement::SHARED_FLAGS)
    {
        assert!(
            longs.iter().any(|l| l == listed),
            "{listed} is not a global option"
        );
    }
}

#[test]
fn shared_options_move_after_the_subcommand_they_stand_before() {
    let moved = |args: &[&str]| -> Vec<String> {
        let args = std::iter::once("locked-run")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        shared_options_after_subcommand(args)
            .into_iter()
            .skip(1)
            .map(|a| a.into_string().unwrap())
            .collect()
    };
    assert_eq!(
        moved(&["-u", "U", "status", "job"]),
        ["status", "-u", "U", "job"]
    );
    assert_eq!(
        moved(&["-vu", "U", "release", "job"]),
        ["release", "-vu", "U", "job"]
    );
    assert_eq!(
        moved(&["-vq", "--url=U", "doctor"]),
        ["doctor", "-vq", "--url=U"]
    );
    assert_eq!(
        moved(&["-uU", "run", "job", "true"]),
        ["run", "-uU", "job", "true"]
    );
    // Not shared, not before a subcommand, or `help`: left as written.
    assert_eq!(
        moved(&["--ttl", "5s", "status", "true"]),
        ["--ttl", "5s", "status", "true"]
    );
    assert_eq!(
        moved(&["-u", "U", "job", "true"]),
        ["-u", "U", "job", "true"]
    );
    assert_eq!(moved(&["-v", "help"]), ["-v", "help"]);
    assert_eq!(moved(&["-vn", "status", "true"]), ["-vn", "status", "true"]);
}
