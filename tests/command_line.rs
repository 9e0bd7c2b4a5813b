//! The command line as operators type it: the shared options (`-u`, `--connect-timeout`, the
//! password and TLS options, `-v`/`-q`, `--log-format`) before or after a subcommand alike, a
//! hint that works when pasted, and `--help` with examples.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

fn held_by_one(url: &str, dir: &std::path::Path) -> Running {
    let (running, _) = start_job(url, dir, &[], "exec sleep 30");
    running
}

#[test]
fn shared_options_work_before_or_after_a_subcommand() {
    let redis = Redis::start();
    let url = redis.url();
    let dir = scratch();
    let holder = held_by_one(&url, dir.path());
    let status_lines = [
        vec!["-u", &url, "status", "job"],
        vec!["status", "-u", &url, "job"],
        vec!["status", "job", "-u", &url],
        vec![
            "--url",
            &url,
            "--connect-timeout",
            "2s",
            "status",
            "--json",
            "job",
        ],
        vec!["-q", "-u", &url, "status", "job"],
        vec!["-vv", "--log-format", "json", "-u", &url, "status", "job"],
        vec!["-u", &url, "release", "job"],
    ];
    for (i, args) in status_lines.iter().enumerate() {
        let out = run_args(args);
        let expected = if i == status_lines.len() - 1 { 2 } else { 0 };
        assert_eq!(out.code(), Some(expected), "{args:?}: {out:?}");
        let said = format!("{}{}", out.stdout, out.stderr);
        assert!(
            said.contains("job"),
            "{args:?} answered about lock job: {said}"
        );
    }
    let out = run_args(&["-u", &url, "doctor"]);
    assert!(out.stdout.contains(&format!("{url}  reachable")), "{out:?}");
    signal(holder.pid(), libc::SIGTERM);
    let _ = holder.wait();

    for args in [
        vec![
            "-u",
            &url,
            "run",
            "job",
            "--",
            "sh",
            "-c",
            "echo $LOCKED_RUN_FENCE",
        ],
        vec![
            "run",
            "-u",
            &url,
            "job",
            "--",
            "sh",
            "-c",
            "echo $LOCKED_RUN_FENCE",
        ],
        vec![
            "-u",
            &url,
            "job",
            "--",
            "sh",
            "-c",
            "echo $LOCKED_RUN_FENCE",
        ],
    ] {
        let out = run_args(&args);
        assert_eq!(out.code(), Some(0), "{args:?}: {out:?}");
        assert!(!out.stdout.trim().is_empty(), "{args:?} ran the command");
    }
    assert!(!redis.exists("lock:{job}"));
}

#[test]
fn a_runs_own_options_before_a_subcommand_are_refused_not_ignored() {
    let out = run_args(&["-n", "-u", "file:///tmp", "status", "job"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("locked-run run status"),
        "{}",
        out.stderr
    );
}

/// A hint names its command so that it works when pasted: with `-u` when the URL was not the
/// default, and never with a password.
#[test]
fn the_hint_after_a_wait_that_ran_out_works_when_pasted() {
    let locks = scratch();
    let file_url = format!("file://{}/with space", locks.path().display());
    let redis = Redis::start_with(&["--requirepass", "hunter2"]);
    let redis_url = format!("redis://:hunter2@127.0.0.1:{}", redis.port);
    for url in [file_url.as_str(), redis_url.as_str()] {
        let dir = scratch();
        let mut holder = locked_run();
        holder.args(["-u", url, "job"]).args(sh(&format!(
            "echo up > {}/up; exec sleep 30",
            path_str(dir.path())
        )));
        let holder = spawn(holder);
        wait_for_file(&dir.path().join("up"), Duration::from_secs(10), |t| {
            !t.is_empty()
        });
        let out = run_args(&["-u", url, "-w", "300ms", "job", "true"]);
        assert_eq!(out.code(), Some(75), "{out:?}");
        assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
        let hint = out
            .stderr
            .split('`')
            .nth(1)
            .unwrap_or_else(|| panic!("no command in {}", out.stderr))
            .to_owned();
        assert!(hint.starts_with("locked-run status -u "), "{hint}");
        // Pasted into a shell (with the password where it belongs: the environment).
        let mut pasted = Command::new("sh");
        pasted
            .args(["-c", &hint])
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    std::path::Path::new(BIN).parent().unwrap().display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("REDISCLI_AUTH", "hunter2");
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("LOCKED_RUN") {
                pasted.env_remove(key);
            }
        }
        let answer = run(pasted);
        assert_eq!(answer.code(), Some(0), "{hint}: {answer:?}");
        assert!(
            answer.stdout.starts_with("job: held by"),
            "{hint}: {answer:?}"
        );
        signal(holder.pid(), libc::SIGTERM);
        let _ = holder.wait();
    }
}

#[test]
fn help_has_examples_and_names_the_environment_variables_only() {
    let out = run_args(&["--help"]);
    assert_eq!(out.code(), Some(0));
    for example in [
        "locked-run -n sync-inventory",
        "-w 20m",
        "file:///",
        "status nightly",
    ] {
        assert!(
            out.stdout.contains(example),
            "{example} missing from --help"
        );
    }
    assert!(out.stdout.contains("Examples:"));
    assert!(
        out.stdout.contains("[env: LOCKED_RUN_TTL]"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("LOCKED_RUN_TTL="),
        "an empty value shown"
    );
}

/// The password file before a subcommand is the connection's, as after it: without it the
/// server refuses (69), with it `status` answers about the lock.
#[test]
fn the_password_file_works_before_a_subcommand() {
    let redis = Redis::start_with(&["--requirepass", "hunter2"]);
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let dir = scratch();
    let password = dir.path().join("pw");
    std::fs::write(&password, "hunter2\n").unwrap();
    lr().args(["-u", &url, "status", "job"]).run().expect(69);
    for args in [
        [
            "--password-file",
            path_str(&password),
            "-u",
            &url,
            "status",
            "job",
        ],
        [
            "-u",
            &url,
            "status",
            "--password-file",
            path_str(&password),
            "job",
        ],
    ] {
        let out = lr().args(args).run().expect(1);
        assert!(out.stdout.contains("job: free"), "{}", out.stdout);
    }
}

/// Started with descriptors 0, 1 and 2 closed, a run opens /dev/null on each, lowest first,
/// before it opens anything of its own: no lock file takes descriptor 2 and gets the run's
/// error lines. The command sees /dev/null there too, and the run ends 0 with the lock free.
#[test]
fn closed_standard_descriptors_are_dev_null_for_the_run_and_its_command() {
    let locks = scratch();
    let url = file_url(locks.path());
    let seen = locks.path().join("seen");
    // Which of the shell's descriptors 0 to 2 are /dev/null, checked before anything is
    // redirected (a shell redirects a builtin's output in itself).
    let script = format!(
        "r=; for f in 0 1 2; do [ /proc/$$/fd/$f -ef /dev/null ] && r=\"$r$f \"; done; \
         echo \"$r\" > {}",
        path_str(&seen)
    );
    lr_closed_stdio().url(&url).job(sh(&script)).run().expect(0);
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "0 1 2 \n");
    lr().arg("-n").url(&url).job(["true"]).run().expect(0);
    let lock = std::fs::read_to_string(locks.path().join("job.lock")).unwrap();
    assert_eq!(
        lock, "",
        "the lock file holds nothing once released: {lock:?}"
    );
}
