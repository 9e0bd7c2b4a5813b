//! A hostile store: fake servers of the backend's kind whose every reply is endless or
//! announced as huge (for `file://`, a FIFO where the lock file should be). A run and `status`
//! end 69 promptly, with one line that says what was wrong (never that it was late), in
//! bounded memory (GNU time) under a capped address space.

use std::time::Duration;

use super::backends::Backend;
use crate::support::hostile::run_measured;

/// Each attempt's deadline: a read bounded only by time would end here.
const TIMEOUT: &str = "5s";
/// Well within it.
const PROMPTLY: Duration = Duration::from_millis(2500);
/// Some 30 MB with a 16 MiB reply buffered; an unbounded read reaches gigabytes.
const PEAK_KIB: u64 = 96 << 10;

pub fn check(backend: &dyn Backend) {
    let Some(hostile) = backend.hostile() else {
        println!("nothing to check: a backend with no server and no files of its own");
        return;
    };
    for subcommand in [None, Some("status")] {
        let mut args: Vec<&str> = subcommand.into_iter().collect();
        args.extend(hostile.urls.iter().map(String::as_str));
        args.extend(["--connect-timeout", TIMEOUT]);
        if subcommand.is_none() {
            args.extend(["-n", "job", "--", "true"]);
        } else {
            args.push("job");
        }
        let (out, peak) = run_measured(&args);
        let out = out.expect_one_line(69, hostile.says);
        assert!(!out.stderr.contains("in time"), "not late: {}", out.stderr);
        assert!(
            !out.stderr.contains("did not answer"),
            "not late: {}",
            out.stderr
        );
        assert!(out.elapsed < PROMPTLY, "{args:?} took {:?}", out.elapsed);
        if let Some(peak) = peak {
            assert!(peak < PEAK_KIB, "{args:?} peaked at {peak} KiB");
        }
        println!("{:?}, {peak:?} KiB: {}", out.elapsed, out.stderr.trim());
    }
}
